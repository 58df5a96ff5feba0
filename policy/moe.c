/* policy/moe.c: Stable LatentMoE and the dense FFN, fp32 (see policy/moe.h).  Follows
 * spec/policy.md 7.1 (math) and 7.2 (execution: count, gather, per-expert GEMMs, scatter). */
#include "policy/moe.h"

#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/moe_internal.h"
#include "policy/router.h"

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

void arl_glu_act_fwd(const arl_glu_act *a, float *h, const float *g, const float *u, int64_t T,
                     int64_t f, int64_t ld) {
    if (a->situ)
        arl_k_situ_glu_fwd(h, g, u, T, f, ld, a->beta1, a->beta2);
    else
        arl_k_swiglu_fwd(h, g, u, T, f, ld);
}

void arl_moe_glu_fwd(float *y, float beta, const float *x, const float *Wg, const float *Wu,
                     const float *Wd, int64_t T, int64_t in, int64_t fw, int64_t out,
                     const arl_glu_act *act, float *gu, float *h) {
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, fw, in, 1.0f, x, in, Wg, in, 0.0f, gu, 2 * fw);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, fw, in, 1.0f, x, in, Wu, in, 0.0f, gu + fw, 2 * fw);
    arl_glu_act_fwd(act, h, gu, gu + fw, T, fw, 2 * fw);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, out, fw, 1.0f, h, fw, Wd, fw, beta, y, out);
}

/* ---- dense FFN ---- */

int64_t arl_dense_ffn_ws_floats(int64_t d, int64_t fd, int64_t T) {
    (void)d;
    return 3 * T * fd + 32;
}

void arl_dense_ffn_fwd(float *y, const float *x, const arl_dense_params *p, int64_t d, int64_t fd,
                       const arl_glu_act *act, int64_t T, float *ws) {
    ARL_ASSERT(y != x);
    if (T == 0) return;
    arl_moe_glu_fwd(y, 0.0f, x, p->gate_proj, p->up_proj, p->down_proj, T, d, fd, d, act, ws,
                    ws + 2 * T * fd);
}

/* ---- LatentMoE ---- */

typedef struct moe_bufs {
    float *s;       /* (T, E) scores */
    int32_t *sel;   /* (T, k) */
    float *pw;      /* (T, k) */
    float *router;  /* router work buffer */
    float *z;       /* (T, dz) latent input W_down x */
    float *zg;      /* (T*k, dz) latent inputs grouped by expert */
    float *gu;      /* (T*k, 2f) [gate | up] of the grouped rows */
    float *h;       /* (T*k, f) */
    float *yg;      /* (T*k, dz) expert outputs, grouped */
    float *u;       /* (T, dz) weighted sum, then its RMSNorm */
    int64_t *start; /* (E + 1) first grouped row of each expert */
    int64_t *fill;  /* (E) */
    int64_t *row;   /* (T*k) grouped row of (token, slot) */
    float *sgu;     /* (T, 2 fs) shared experts */
    float *sh;      /* (T, fs) */
} moe_bufs;

static int64_t moe_layout(moe_bufs *B, float *base, const arl_moe_cfg *c, int64_t T) {
    ws_bump w = {base, 0};
    const int64_t Tk = T * c->k;
    B->s = take(&w, T * c->E);
    B->sel = (int32_t *)take(&w, Tk);
    B->pw = take(&w, Tk);
    B->router = take(&w, arl_router_ws_floats(T, c->E));
    B->z = take(&w, T * c->dz);
    B->zg = take(&w, Tk * c->dz);
    B->gu = take(&w, Tk * 2 * c->f);
    B->h = take(&w, Tk * c->f);
    B->yg = take(&w, Tk * c->dz);
    B->u = take(&w, T * c->dz);
    B->start = (int64_t *)take(&w, 2 * (c->E + 1));
    B->fill = (int64_t *)take(&w, 2 * c->E);
    B->row = (int64_t *)take(&w, 2 * Tk);
    B->sgu = take(&w, T * 2 * c->fs);
    B->sh = take(&w, T * c->fs);
    return w.used;
}

int64_t arl_moe_ws_floats(const arl_moe_cfg *c, int64_t T) {
    moe_bufs B;
    return moe_layout(&B, NULL, c, T);
}

typedef struct experts_ctx {
    const moe_bufs *B;
    const arl_moe_cfg *c;
    const arl_moe_params *p;
} experts_ctx;

/* Experts [e0, e1): each runs its GEMM pair on its own rows (experts without tokens are
 * skipped, spec 7.2).  Experts are independent, so they run in parallel; a GEMM issued here
 * computes the same bits as from the main thread (kernels/threadpool.h nesting rule). */
static void experts_run(void *vctx, int64_t e0, int64_t e1) {
    const experts_ctx *X = vctx;
    const moe_bufs *B = X->B;
    arl_moe_experts_fwd_range(B->yg, B->gu, B->h, B->zg, B->start, X->p, X->c, e0, e1);
}

void arl_moe_experts_fwd_range(float *yg, float *gu, float *h, const float *zg,
                               const int64_t *start, const arl_moe_params *p, const arl_moe_cfg *c,
                               int64_t e0, int64_t e1) {
    const int64_t f = c->f, dz = c->dz;
    for (int64_t e = e0; e < e1; e++) {
        int64_t r0 = start[e], ne = start[e + 1] - r0;
        if (ne == 0) continue;
        arl_moe_glu_fwd(yg + r0 * dz, 0.0f, zg + r0 * dz, p->w1 + e * f * dz, p->w3 + e * f * dz,
                        p->w2 + e * dz * f, ne, dz, f, dz, &c->act, gu + r0 * 2 * f, h + r0 * f);
    }
}

typedef struct combine_ctx {
    const moe_bufs *B;
    int64_t k, dz;
} combine_ctx;

/* u[t] = sum_j p[t, j] E_{sel[t, j]}(z_t), accumulated in slot order j = 0..k-1 (fp32). */
static void combine_rows(void *vctx, int64_t t0, int64_t t1) {
    const combine_ctx *X = vctx;
    const moe_bufs *B = X->B;
    arl_moe_combine_range(B->u, B->pw, B->yg, B->row, X->k, X->dz, t0, t1);
}

void arl_moe_combine_range(float *u, const float *pw, const float *yg, const int64_t *row,
                           int64_t k, int64_t dz, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
        float *ut = u + t * dz;
        for (int64_t i = 0; i < dz; i++)
            ut[i] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float pj = pw[t * k + j];
            const float *yr = yg + row[t * k + j] * dz;
            for (int64_t i = 0; i < dz; i++)
                ut[i] += pj * yr[i];
        }
    }
}

void arl_moe_group(int64_t *start, int64_t *fill, int64_t *row, float *zg, const float *z,
                   const int32_t *sel, int64_t T, int64_t k, int64_t E, int64_t dz) {
    for (int64_t e = 0; e <= E; e++)
        start[e] = 0;
    for (int64_t i = 0; i < T * k; i++)
        start[sel[i] + 1]++;
    for (int64_t e = 0; e < E; e++) {
        start[e + 1] += start[e];
        fill[e] = start[e];
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t r = fill[sel[t * k + j]]++;
            row[t * k + j] = r;
            memcpy(zg + r * dz, z + t * dz, sizeof(float) * (size_t)dz);
        }
}

arl_status arl_moe_fwd(float *y, const arl_moe_out *out, const float *x, const arl_moe_params *p,
                       const arl_moe_cfg *c, const int32_t *forced, int64_t T, float *ws) {
    ARL_ASSERT(y && x && p && c && ws && y != x);
    if (T == 0) {
        if (out && out->load) memset(out->load, 0, sizeof(int64_t) * (size_t)c->E);
        return ARL_OK;
    }
    moe_bufs B;
    moe_layout(&B, ws, c, T);
    const int64_t d = c->d, E = c->E, k = c->k, dz = c->dz;

    /* 6.1 routing on the full-width x */
    ARL_TRY(arl_router_fwd(B.sel, B.pw, B.s, x, p->gate, p->gate_bias, forced, T, d, E, k, c->rho,
                           B.router));

    /* 7.2 count tokens per expert, then gather the latent rows z = W_down x by expert */
    arl_k_linear_fwd(B.z, x, p->down_proj, T, d, dz);
    arl_moe_group(B.start, B.fill, B.row, B.zg, B.z, B.sel, T, k, E, dz);

    /* routed experts E_i(z) = W2_i act(W1_i z, W3_i z) in the latent space */
    experts_ctx X = {&B, c, p};
    arl_k_parallel_for(E, arl_k_work_grain(T * k * 3 * c->f * dz / E), experts_run, &X);

    /* weighted sum, latent RMSNorm ("Stable"), up-projection */
    combine_ctx Y = {&B, k, dz};
    arl_k_parallel_for(T, 16, combine_rows, &Y);
    if (p->latent_norm) arl_k_rmsnorm_fwd(B.u, NULL, B.u, p->latent_norm, T, dz, c->eps);
    arl_k_linear_fwd(y, B.u, p->up_proj, T, dz, d);

    /* fused shared experts on the full-width x, added to y */
    if (c->fs > 0 && p->shared_gate_proj)
        arl_moe_glu_fwd(y, 1.0f, x, p->shared_gate_proj, p->shared_up_proj, p->shared_down_proj, T,
                        d, c->fs, d, &c->act, B.sgu, B.sh);

    if (out) {
        if (out->routes) memcpy(out->routes, B.sel, sizeof(int32_t) * (size_t)(T * k));
        if (out->weights) memcpy(out->weights, B.pw, sizeof(float) * (size_t)(T * k));
        if (out->scores) memcpy(out->scores, B.s, sizeof(float) * (size_t)(T * E));
        if (out->load)
            for (int64_t e = 0; e < E; e++)
                out->load[e] = B.start[e + 1] - B.start[e];
    }
    return ARL_OK;
}
