/* policy/kda_layer_backward.c: training forward and backward of one KDA mixer layer, fp32 (see
 * policy/kda_layer_backward.h).  The forward reads as policy/kda_layer.c (3.1 -> 3.2 -> 3.5 ->
 * 3.4) with the intermediates kept; the backward runs the same stages in reverse
 * (3.4 -> 3.8/3.7 -> 3.9 -> 3.1). */
#include "policy/kda_layer_backward.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/docs.h"
#include "policy/kda.h"

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15; /* 64-byte steps keep every buffer aligned */
    return p;
}

static int64_t max_chunks(const arl_kda_layer_cfg *c, int64_t T, int32_t N) {
    return T / c->chunk + N + 1; /* sum over documents of ceil(len / C) */
}

static int64_t save_layout(arl_kda_layer_save *s, float *base, const arl_kda_layer_cfg *c,
                           int64_t T, int32_t N) {
    const int64_t H = c->H, dk = c->dk, dv = c->dv, P = H * dk, Pv = H * dv;
    ws_bump w = {base, 0};
    for (int j = 0; j < 3; j++)
        s->pre[j] = take(&w, T * P);
    s->z[0] = take(&w, T * P);
    s->z[1] = take(&w, T * P);
    s->qkv[0] = take(&w, T * P);
    s->qkv[1] = take(&w, T * P);
    s->qkv[2] = take(&w, T * Pv);
    s->rn[0] = take(&w, T * H);
    s->rn[1] = take(&w, T * H);
    s->fa = take(&w, T * dk);
    s->f = take(&w, T * P);
    s->g = take(&w, T * P);
    s->bl = take(&w, T * H);
    s->beta = take(&w, T * H);
    s->o = take(&w, T * Pv);
    s->gam = take(&w, T * Pv);
    s->ga = take(&w, T * dk);
    s->rstd = take(&w, T * H);
    s->ob = take(&w, T * Pv);
    s->cst = take(&w, max_chunks(c, T, N) * H * dk * dv);
    s->n_chunks = 0;
    return w.used;
}

int64_t arl_kda_layer_save_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N) {
    arl_kda_layer_save s;
    return save_layout(&s, NULL, c, T, N);
}

void arl_kda_layer_save_bind(arl_kda_layer_save *s, const arl_kda_layer_cfg *c, int64_t T,
                             int32_t N, float *base) {
    save_layout(s, base, c, T, N);
}

/* Work buffers of the forward and the backward (they share the caller's ws). */
typedef struct kda_ws {
    float *tail_in; /* (3, N, P, W-1) tails gathered per projection */
    float *S0;      /* (N, H, dk, dv) zero states for fresh documents */
    float *core;    /* chunkwise core forward / backward work buffer */
    float *dob, *d_o, *dgam, *dga;
    float *dcore[3]; /* (T, P) dq, dk, dv of the core */
    float *dg, *dbeta, *dbl, *df, *dfa, *dz, *dpre;
    float *dtail;     /* (N, P, W-1) initial-tail gradient of one projection */
    float *dtail_out; /* (N, P, W-1) final-tail gradient of one projection, gathered */
} kda_ws;

static int64_t ws_layout(kda_ws *B, float *base, const arl_kda_layer_cfg *c, int64_t T, int32_t N) {
    const int64_t H = c->H, dk = c->dk, dv = c->dv, P = H * dk, W = c->W;
    ws_bump w = {base, 0};
    B->tail_in = take(&w, 3 * (int64_t)N * P * (W - 1));
    B->S0 = take(&w, (int64_t)N * H * dk * dv);
    int64_t cf = arl_kda_chunk_ws_floats(H, dk, dv, c->chunk);
    int64_t cb = arl_kda_bwd_ws_floats(H, dk, dv, c->chunk);
    B->core = take(&w, cf > cb ? cf : cb);
    B->dob = take(&w, T * P);
    B->d_o = take(&w, T * P);
    B->dgam = take(&w, T * P);
    B->dga = take(&w, T * dk);
    for (int j = 0; j < 3; j++)
        B->dcore[j] = take(&w, T * P);
    B->dg = take(&w, T * P);
    B->dbeta = take(&w, T * H);
    B->dbl = take(&w, T * H);
    B->df = take(&w, T * P);
    B->dfa = take(&w, T * dk);
    B->dz = take(&w, T * P);
    B->dpre = take(&w, T * P);
    B->dtail = take(&w, (int64_t)N * P * (W - 1));
    B->dtail_out = take(&w, (int64_t)N * P * (W - 1));
    return w.used;
}

int64_t arl_kda_layer_train_ws_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N) {
    kda_ws B;
    return ws_layout(&B, NULL, c, T, N);
}

/* x = 0, in parallel (arl_k_fill: the same bits as a memset, spread over the pool). */
static void zero(float *x, int64_t n) {
    arl_k_fill(x, 0.0f, n);
}

/* dx (T, in) = dy (T, out) W, W (out, in): arl_k_linear_bwd_x into a zeroed dx, without the
 * zeroing (beta 0 overwrites dx without reading it). */
static void linear_bwd_x_set(float *dx, const float *dy, const float *W, int64_t T, int64_t in,
                             int64_t out) {
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
}

/* Gather the tails of projection j (0 q, 1 k, 2 v) of every document: dst (N, P, W-1). */
static void gather_tails(float *dst, const float *tails, int j, int32_t N, int64_t tl) {
    for (int32_t i = 0; i < N; i++)
        memcpy(dst + i * tl, tails + (i * 3 + j) * tl, sizeof(float) * (size_t)tl);
}

/* ---- forward ---- */

void arl_kda_layer_fwd_save(float *y, const float *x, const arl_kda_params *p,
                            const arl_kda_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                            float *S, float *tails, arl_kda_layer_save *sv, float *ws) {
    ARL_ASSERT(y && x && p && c && sv && ws && N >= 1 && T >= 0 && y != x);
    ARL_ASSERT(c->dk == c->dv);
    sv->n_chunks = arl_kda_num_chunks(cu, N, T, c->chunk);
    if (T == 0) return;
    kda_ws B;
    ws_layout(&B, ws, c, T, N);
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk, W = c->W;
    const int64_t tl = P * (W - 1);

    /* 3.1: projections, causal depthwise conv + SiLU (tails move forward), L2Norm */
    const float *proj[3] = {p->q_proj, p->k_proj, p->v_proj};
    const float *conv[3] = {p->q_conv, p->k_conv, p->v_conv};
    float *zout[3] = {sv->z[0], sv->z[1], sv->qkv[2]};
    for (int j = 0; j < 3; j++) {
        arl_k_linear_fwd(sv->pre[j], x, proj[j], T, d, P);
        const float *tin = NULL;
        if (tails && tl > 0) {
            float *g = B.tail_in + (int64_t)j * N * tl;
            gather_tails(g, tails, j, N, tl);
            tin = g;
        }
        arl_kda_conv_fwd(zout[j], NULL, sv->pre[j], conv[j], tin, cu, N, T, P, W);
        if (tails && tl > 0)
            for (int32_t i = 0; i < N; i++) {
                int64_t a = arl_doc_lo(cu, i), e = arl_doc_hi(cu, i, T);
                arl_kda_conv_tail(tails + (i * 3 + j) * tl, sv->pre[j] + a * P, e - a, tin + i * tl,
                                  P, W);
            }
    }
    arl_k_l2norm_fwd(sv->qkv[0], sv->rn[0], sv->z[0], T * H, dk, 1e-6f);
    arl_k_l2norm_fwd(sv->qkv[1], sv->rn[1], sv->z[1], T * H, dk, 1e-6f);
    arl_k_linear_fwd(sv->bl, x, p->b_proj, T, d, H);
    arl_k_sigmoid_fwd(sv->beta, sv->bl, T * H);

    /* 3.2: decay gate */
    arl_k_linear_fwd(sv->fa, x, p->f_a, T, d, dk);
    arl_k_linear_fwd(sv->f, sv->fa, p->f_b, T, dk, P);
    if (c->lower_bound_gate)
        arl_kda_gate_k3_fwd(sv->g, sv->f, p->A_log, p->dt_bias, T, H, dk, c->g_min);
    else
        arl_kda_gate_softplus_fwd(sv->g, sv->f, p->A_log, p->dt_bias, T, H, dk);

    /* 3.5: chunkwise core, keeping every chunk's incoming state */
    float *St = S;
    if (!St) {
        St = B.S0;
        zero(St, (int64_t)N * H * dk * dv);
    }
    const float scale = 1.0f / sqrtf((float)dk);
    arl_kda_chunk_fwd(sv->o, St, sv->cst, sv->qkv[0], sv->qkv[1], sv->qkv[2], sv->g, sv->beta, cu,
                      N, T, H, dk, dv, scale, c->chunk, B.core);

    /* 3.4: output gate, gated RMSNorm per head, output projection */
    if (p->g_proj) {
        arl_k_linear_fwd(sv->gam, x, p->g_proj, T, d, H * dv);
    } else {
        arl_k_linear_fwd(sv->ga, x, p->g_a, T, d, dk);
        arl_k_linear_fwd(sv->gam, sv->ga, p->g_b, T, dk, H * dv);
    }
    arl_kda_onorm_fwd(sv->ob, sv->rstd, sv->o, sv->gam, p->o_norm, T * H, dv, c->eps);
    arl_k_linear_fwd(y, sv->ob, p->o_proj, T, H * dv, d);
}

/* ---- backward ---- */

/* Gradient of the conv tail (the W-1 inputs before each document) from dz (T, C): the first
 * W-1 outputs of a document read the tail.  dtail (N, C, W-1) +=.  The pre-activation is
 * recomputed as in arl_kda_conv_fwd. */
void arl_kda_conv_tail_bwd(float *dtail, const float *dz, const float *x, const float *w,
                           const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                           int64_t W) {
    for (int32_t di = 0; di < N; di++) {
        int64_t a = arl_doc_lo(cu, di), len = arl_doc_hi(cu, di, T) - a;
        const float *tail = tails ? tails + (int64_t)di * C * (W - 1) : NULL;
        float *dt = dtail + (int64_t)di * C * (W - 1);
        for (int64_t pos = 0; pos < W - 1 && pos < len; pos++)
            for (int64_t c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < W; j++) {
                    int64_t src = pos - (W - 1) + j;
                    float in = src >= 0 ? x[(a + src) * C + c]
                                        : (tail ? tail[c * (W - 1) + (W - 1 + src)] : 0.0f);
                    acc += w[c * W + j] * in;
                }
                float s = acc >= 0.0f ? 1.0f / (1.0f + expf(-acc)) : expf(acc) / (1.0f + expf(acc));
                float dy = dz[(a + pos) * C + c] * s * (1.0f + acc * (1.0f - s));
                for (int64_t j = 0; j < W; j++) {
                    int64_t src = pos - (W - 1) + j;
                    if (src < 0) dt[c * (W - 1) + (W - 1 + src)] += w[c * W + j] * dy;
                }
            }
    }
}

/* The final tail of a document is the last W-1 elements of [tail_in; x_doc]: route its
 * gradient dtail_out (N, C, W-1) to the inputs (dpre (T, C) +=) or, for documents shorter
 * than W-1, partly to the incoming tail (dtail_in (N, C, W-1) +=, or dropped when NULL). */
void arl_kda_conv_tail_out_bwd(float *dpre, float *dtail_in, const float *dtail_out,
                               const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    for (int32_t di = 0; di < N; di++) {
        int64_t a = arl_doc_lo(cu, di), len = arl_doc_hi(cu, di, T) - a;
        const float *g = dtail_out + (int64_t)di * C * (W - 1);
        for (int64_t i = 0; i < W - 1; i++) {
            int64_t m = len + i; /* index into [tail_in; x_doc] */
            for (int64_t c = 0; c < C; c++) {
                float v = g[c * (W - 1) + i];
                if (m >= W - 1)
                    dpre[(a + m - (W - 1)) * C + c] += v;
                else if (dtail_in)
                    dtail_in[(int64_t)di * C * (W - 1) + c * (W - 1) + m] += v;
            }
        }
    }
}

void arl_kda_layer_bwd(float *dx, const arl_kda_params *gp, const float *dy, const float *x,
                       const arl_kda_params *p, const arl_kda_layer_cfg *c, const int32_t *cu,
                       int32_t N, int64_t T, const arl_kda_layer_save *sv, const float *tails0,
                       const float *dS_T, float *dS0, const float *dtails_T, float *dtails0,
                       int recurrent, float *ws) {
    ARL_ASSERT(dx && gp && dy && x && p && c && sv && ws && N >= 1 && T >= 0);
    if (T == 0) return;
    kda_ws B;
    ws_layout(&B, ws, c, T, N);
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk, Pv = H * dv, W = c->W;
    const int64_t tl = P * (W - 1);
    const float scale = 1.0f / sqrtf((float)dk);

    /* 3.4 backward: y = W_o ob;  ob = w_on * RMSNorm(o) * sigmoid(gam) */
    arl_k_linear_bwd_w(gp->o_proj, dy, sv->ob, T, Pv, d);
    linear_bwd_x_set(B.dob, dy, p->o_proj, T, Pv, d);
    zero(B.d_o, T * Pv);
    zero(B.dgam, T * Pv);
    arl_kda_onorm_bwd(B.d_o, B.dgam, gp->o_norm, B.dob, sv->o, sv->gam, p->o_norm, sv->rstd, T * H,
                      dv);
    if (p->g_proj) {
        arl_k_linear_bwd_w(gp->g_proj, B.dgam, x, T, d, Pv);
        arl_k_linear_bwd_x(dx, B.dgam, p->g_proj, T, d, Pv);
    } else {
        arl_k_linear_bwd_w(gp->g_b, B.dgam, sv->ga, T, dk, Pv);
        linear_bwd_x_set(B.dga, B.dgam, p->g_b, T, dk, Pv);
        arl_k_linear_bwd_w(gp->g_a, B.dga, x, T, d, dk);
        arl_k_linear_bwd_x(dx, B.dga, p->g_a, T, d, dk);
    }

    /* 3.8 (or 3.7): the core */
    for (int j = 0; j < 3; j++)
        zero(B.dcore[j], T * P);
    zero(B.dg, T * P);
    zero(B.dbeta, T * H);
    if (recurrent)
        arl_kda_recurrent_bwd(B.dcore[0], B.dcore[1], B.dcore[2], B.dg, B.dbeta, dS0, B.d_o, dS_T,
                              sv->qkv[0], sv->qkv[1], sv->qkv[2], sv->g, sv->beta, sv->cst, cu, N,
                              T, H, dk, dv, scale, c->chunk, B.core);
    else
        arl_kda_chunk_bwd(B.dcore[0], B.dcore[1], B.dcore[2], B.dg, B.dbeta, dS0, B.d_o, dS_T,
                          sv->qkv[0], sv->qkv[1], sv->qkv[2], sv->g, sv->beta, sv->cst, cu, N, T, H,
                          dk, dv, scale, c->chunk, B.core);

    /* 3.9 beta = sigmoid(W_b x) */
    zero(B.dbl, T * H);
    arl_k_sigmoid_bwd(B.dbl, B.dbeta, sv->bl, T * H);
    arl_k_linear_bwd_w(gp->b_proj, B.dbl, x, T, d, H);
    arl_k_linear_bwd_x(dx, B.dbl, p->b_proj, T, d, H);

    /* 3.9 gate, then f = W_fb W_fa x */
    zero(B.df, T * P);
    if (c->lower_bound_gate)
        arl_kda_gate_k3_bwd(B.df, gp->A_log, gp->dt_bias, B.dg, sv->f, p->A_log, p->dt_bias, T, H,
                            dk, c->g_min);
    else
        arl_kda_gate_softplus_bwd(B.df, gp->A_log, gp->dt_bias, B.dg, sv->f, p->A_log, p->dt_bias,
                                  T, H, dk);
    arl_k_linear_bwd_w(gp->f_b, B.df, sv->fa, T, dk, P);
    linear_bwd_x_set(B.dfa, B.df, p->f_b, T, dk, P);
    arl_k_linear_bwd_w(gp->f_a, B.dfa, x, T, d, dk);
    arl_k_linear_bwd_x(dx, B.dfa, p->f_a, T, d, dk);

    /* 3.9 L2Norm of q, k; conv + SiLU; the projections.  The tails are constant inputs; their
     * gradients (and the routing of a final-tail gradient) only on request. */
    const float *proj[3] = {p->q_proj, p->k_proj, p->v_proj};
    const float *conv[3] = {p->q_conv, p->k_conv, p->v_conv};
    float *gproj[3] = {gp->q_proj, gp->k_proj, gp->v_proj};
    float *gconv[3] = {gp->q_conv, gp->k_conv, gp->v_conv};
    for (int j = 0; j < 3; j++) {
        const float *dzj = B.dcore[j];
        if (j < 2) {
            zero(B.dz, T * P);
            arl_k_l2norm_bwd(B.dz, B.dcore[j], sv->z[j], sv->rn[j], T * H, dk);
            dzj = B.dz;
        }
        const float *tin = NULL;
        if (tails0 && tl > 0) {
            float *g = B.tail_in + (int64_t)j * N * tl;
            gather_tails(g, tails0, j, N, tl);
            tin = g;
        }
        zero(B.dpre, T * P);
        arl_kda_conv_bwd(B.dpre, gconv[j], dzj, sv->pre[j], conv[j], tin, cu, N, T, P, W);
        if (tl > 0 && (dtails0 || dtails_T)) {
            zero(B.dtail, (int64_t)N * tl);
            if (dtails0)
                arl_kda_conv_tail_bwd(B.dtail, dzj, sv->pre[j], conv[j], tin, cu, N, T, P, W);
            if (dtails_T) {
                gather_tails(B.dtail_out, dtails_T, j, N, tl);
                arl_kda_conv_tail_out_bwd(B.dpre, dtails0 ? B.dtail : NULL, B.dtail_out, cu, N, T,
                                          P, W);
            }
            if (dtails0)
                for (int32_t i = 0; i < N; i++)
                    arl_k_add(dtails0 + (i * 3 + j) * tl, dtails0 + (i * 3 + j) * tl,
                              B.dtail + i * tl, tl);
        }
        arl_k_linear_bwd_w(gproj[j], B.dpre, x, T, d, P);
        arl_k_linear_bwd_x(dx, B.dpre, proj[j], T, d, P);
    }
}
