/* policy/kda_layer.c: one KDA mixer layer, fp32 (see policy/kda_layer.h).  Reads top to
 * bottom as spec/policy.md 3.1 -> 3.2 -> 3.3/3.5 -> 3.4. */
#include "policy/kda_layer.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/docs.h"
#include "policy/kda.h"

/* Bump allocation inside the caller's work buffer; base NULL only counts (for the size). */
typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15; /* 64-byte steps keep every buffer aligned */
    return p;
}

typedef struct kda_bufs {
    float *proj;      /* (T, P) a pre-conv projection, then f */
    float *q, *k, *v; /* (T, P) conv + SiLU outputs; q, k L2-normalised in place */
    float *fa;        /* (T, dk) */
    float *g;         /* (T, P) log-decay */
    float *beta;      /* (T, H) */
    float *o;         /* (T, P) core output */
    float *gam;       /* (T, P) output gate logits */
    float *ga;        /* (T, dk) low-rank gate intermediate */
    float *tail_in;   /* (3, N, P, W-1) gathered conv tails, per projection */
    float *S0;        /* (N, H, dk, dv) fresh states when the caller keeps none */
    float *core;      /* chunkwise core work buffer */
} kda_bufs;

static int64_t kda_layout(kda_bufs *B, float *base, const arl_kda_layer_cfg *c, int64_t T,
                          int32_t N) {
    const int64_t P = c->H * c->dk;
    ws_bump w = {base, 0};
    B->proj = take(&w, T * P);
    B->q = take(&w, T * P);
    B->k = take(&w, T * P);
    B->v = take(&w, T * c->H * c->dv);
    B->fa = take(&w, T * c->dk);
    B->g = take(&w, T * P);
    B->beta = take(&w, T * c->H);
    B->o = take(&w, T * c->H * c->dv);
    B->gam = take(&w, T * c->H * c->dv);
    B->ga = take(&w, T * c->dk);
    B->tail_in = take(&w, 3 * (int64_t)N * P * (c->W - 1));
    B->S0 = take(&w, (int64_t)N * c->H * c->dk * c->dv);
    B->core = take(&w, arl_kda_chunk_ws_floats(c->H, c->dk, c->dv, c->chunk));
    return w.used;
}

int64_t arl_kda_layer_ws_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N) {
    kda_bufs B;
    return kda_layout(&B, NULL, c, T, N);
}

/* One of the three short convolutions (j = 0 q, 1 k, 2 v): out = SiLU(conv(x W^T)), and the
 * document tails move forward (spec 3.1, 3.6). */
static void conv_branch(float *out, kda_bufs *B, const float *x, const float *Wproj,
                        const float *wconv, int j, const arl_kda_layer_cfg *c, const int32_t *cu,
                        int32_t N, int64_t T, float *tails) {
    const int64_t P = c->H * c->dk, W = c->W, tl = P * (W - 1);
    arl_k_linear_fwd(B->proj, x, Wproj, T, c->d, P);
    const float *tin = NULL;
    if (tails && tl > 0) {
        float *g = B->tail_in + (int64_t)j * N * tl;
        for (int32_t i = 0; i < N; i++)
            memcpy(g + i * tl, tails + (i * 3 + j) * tl, tl * 4);
        tin = g;
    }
    arl_kda_conv_fwd(out, NULL, B->proj, wconv, tin, cu, N, T, P, W);
    if (tails && tl > 0)
        for (int32_t i = 0; i < N; i++) {
            int64_t a = arl_doc_lo(cu, i), e = arl_doc_hi(cu, i, T);
            arl_kda_conv_tail(tails + (i * 3 + j) * tl, B->proj + a * P, e - a, tin + i * tl, P, W);
        }
}

void arl_kda_layer_fwd(float *y, const float *x, const arl_kda_params *p,
                       const arl_kda_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                       float *S, float *tails, int recurrent, float *chunk_states, float *ws) {
    ARL_ASSERT(y && x && p && c && ws && N >= 1 && T >= 0 && y != x);
    ARL_ASSERT(c->dk == c->dv); /* one P for q, k and v (spec 3.6 CONV_TAIL layout) */
    if (T == 0) return;
    kda_bufs B;
    kda_layout(&B, ws, c, T, N);
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk;

    /* 3.1: projections, causal depthwise conv + SiLU, L2Norm of q and k per head */
    conv_branch(B.q, &B, x, p->q_proj, p->q_conv, 0, c, cu, N, T, tails);
    conv_branch(B.k, &B, x, p->k_proj, p->k_conv, 1, c, cu, N, T, tails);
    conv_branch(B.v, &B, x, p->v_proj, p->v_conv, 2, c, cu, N, T, tails);
    arl_k_l2norm_fwd(B.q, NULL, B.q, T * H, dk, 1e-6f);
    arl_k_l2norm_fwd(B.k, NULL, B.k, T * H, dk, 1e-6f);
    /* beta = sigmoid(W_b x), fp32 */
    arl_k_linear_fwd(B.beta, x, p->b_proj, T, d, H);
    arl_k_sigmoid_fwd(B.beta, B.beta, T * H);

    /* 3.2: decay gate from the rank-dk f = W_fb W_fa x */
    arl_k_linear_fwd(B.fa, x, p->f_a, T, d, dk);
    arl_k_linear_fwd(B.proj, B.fa, p->f_b, T, dk, P);
    if (c->lower_bound_gate)
        arl_kda_gate_k3_fwd(B.g, B.proj, p->A_log, p->dt_bias, T, H, dk, c->g_min);
    else
        arl_kda_gate_softplus_fwd(B.g, B.proj, p->A_log, p->dt_bias, T, H, dk);

    /* 3.3 / 3.5: the delta-rule core; fresh documents start from S = 0 */
    float *St = S;
    if (!St) {
        St = B.S0;
        memset(St, 0, (size_t)N * H * dk * dv * sizeof(float));
    }
    const float scale = 1.0f / sqrtf((float)dk);
    if (recurrent)
        arl_kda_recurrent_fwd(B.o, St, chunk_states, B.q, B.k, B.v, B.g, B.beta, cu, N, T, H, dk,
                              dv, scale, c->chunk);
    else
        arl_kda_chunk_fwd(B.o, St, chunk_states, B.q, B.k, B.v, B.g, B.beta, cu, N, T, H, dk, dv,
                          scale, c->chunk, B.core);

    /* 3.4: output gate (full rank, or the low-rank Kimi Linear option), gated RMSNorm per
     * head, output projection.  The normalised output overwrites q (no longer needed). */
    if (p->g_proj) {
        arl_k_linear_fwd(B.gam, x, p->g_proj, T, d, H * dv);
    } else {
        arl_k_linear_fwd(B.ga, x, p->g_a, T, d, dk);
        arl_k_linear_fwd(B.gam, B.ga, p->g_b, T, dk, H * dv);
    }
    arl_kda_onorm_fwd(B.q, NULL, B.o, B.gam, p->o_norm, T * H, dv, c->eps);
    arl_k_linear_fwd(y, B.q, p->o_proj, T, H * dv, d);
}
