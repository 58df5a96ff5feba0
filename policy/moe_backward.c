/* policy/moe_backward.c: training forward and backward of the dense FFN and Stable LatentMoE,
 * fp32 (see policy/moe_backward.h).  The forwards follow policy/moe.c call for call; the
 * backwards follow spec/policy.md 7.3 and 6.2. */
#include "policy/moe_backward.h"

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

/* x = 0, in parallel (arl_k_fill: the same bits as a memset; serial inside a pool part). */
static void zero(float *x, int64_t n) {
    arl_k_fill(x, 0.0f, n);
}

static void glu_act_bwd(const arl_glu_act *a, float *dg, float *du, const float *dh, const float *g,
                        const float *u, int64_t T, int64_t f, int64_t ld) {
    if (a->situ)
        arl_k_situ_glu_bwd(dg, du, dh, g, u, T, f, ld, a->beta1, a->beta2);
    else
        arl_k_swiglu_bwd(dg, du, dh, g, u, T, f, ld);
}

void arl_moe_glu_bwd(float *dx, float dx_beta, float *dWg, float *dWu, float *dWd, const float *dy,
                     const float *x, const float *Wg, const float *Wu, const float *Wd, int64_t T,
                     int64_t in, int64_t fw, int64_t out, const arl_glu_act *act, const float *gu,
                     const float *h, float *dh, float *dgu) {
    if (T == 0) return;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, fw, out, 1.0f, dy, out, Wd, fw, 0.0f, dh, fw);
    arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, out, fw, T, 1.0f, dy, out, h, fw, 1.0f, dWd, fw);
    zero(dgu, T * 2 * fw);
    glu_act_bwd(act, dgu, dgu + fw, dh, gu, gu + fw, T, fw, 2 * fw);
    arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, fw, in, T, 1.0f, dgu, 2 * fw, x, in, 1.0f, dWg, in);
    arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, fw, in, T, 1.0f, dgu + fw, 2 * fw, x, in, 1.0f, dWu, in);
    if (dx) {
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, fw, 1.0f, dgu, 2 * fw, Wg, in, dx_beta, dx,
                   in);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, fw, 1.0f, dgu + fw, 2 * fw, Wu, in, 1.0f,
                   dx, in);
    }
}

/* ---- dense FFN ---- */

int64_t arl_dense_save_floats(int64_t fd, int64_t T) {
    return ((2 * T * fd + 15) & ~(int64_t)15) + ((T * fd + 15) & ~(int64_t)15);
}

void arl_dense_save_bind(arl_dense_save *s, int64_t fd, int64_t T, float *base) {
    s->gu = base;
    s->h = base + ((2 * T * fd + 15) & ~(int64_t)15);
}

int64_t arl_dense_train_ws_floats(int64_t d, int64_t fd, int64_t T) {
    (void)d;
    return ((T * fd + 15) & ~(int64_t)15) + 2 * T * fd;
}

void arl_dense_ffn_fwd_save(float *y, const float *x, const arl_dense_params *p, int64_t d,
                            int64_t fd, const arl_glu_act *act, int64_t T, arl_dense_save *sv) {
    ARL_ASSERT(y != x);
    if (T == 0) return;
    arl_moe_glu_fwd(y, 0.0f, x, p->gate_proj, p->up_proj, p->down_proj, T, d, fd, d, act, sv->gu,
                    sv->h);
}

void arl_dense_ffn_bwd(float *dx, const arl_dense_params *gp, const float *dy, const float *x,
                       const arl_dense_params *p, int64_t d, int64_t fd, const arl_glu_act *act,
                       int64_t T, const arl_dense_save *sv, float *ws) {
    float *dh = ws, *dgu = ws + ((T * fd + 15) & ~(int64_t)15);
    arl_moe_glu_bwd(dx, 1.0f, gp->gate_proj, gp->up_proj, gp->down_proj, dy, x, p->gate_proj,
                    p->up_proj, p->down_proj, T, d, fd, d, act, sv->gu, sv->h, dh, dgu);
}

/* ---- LatentMoE ---- */

static int64_t save_layout(arl_moe_save *s, float *base, const arl_moe_cfg *c, int64_t T) {
    ws_bump w = {base, 0};
    const int64_t Tk = T * c->k;
    s->s = take(&w, T * c->E);
    s->sel = (int32_t *)take(&w, Tk);
    s->pw = take(&w, Tk);
    s->z = take(&w, T * c->dz);
    s->start = (int64_t *)take(&w, 2 * (c->E + 1));
    s->row = (int64_t *)take(&w, 2 * Tk);
    s->zg = take(&w, Tk * c->dz);
    s->gu = take(&w, Tk * 2 * c->f);
    s->h = take(&w, Tk * c->f);
    s->yg = take(&w, Tk * c->dz);
    s->u_pre = take(&w, T * c->dz);
    s->rstd = take(&w, T);
    s->u = take(&w, T * c->dz);
    s->sgu = take(&w, T * 2 * c->fs);
    s->sh = take(&w, T * c->fs);
    return w.used;
}

int64_t arl_moe_save_floats(const arl_moe_cfg *c, int64_t T) {
    arl_moe_save s;
    return save_layout(&s, NULL, c, T);
}

void arl_moe_save_bind(arl_moe_save *s, const arl_moe_cfg *c, int64_t T, float *base) {
    save_layout(s, base, c, T);
}

typedef struct moe_ws {
    float *router; /* (T, E) router work buffer */
    int64_t *fill; /* (E) */
    float *dun, *du, *dsh, *dsgu, *dp, *dyg, *dh, *dgu, *dzg, *dz;
} moe_ws;

static int64_t ws_layout(moe_ws *B, float *base, const arl_moe_cfg *c, int64_t T) {
    ws_bump w = {base, 0};
    const int64_t Tk = T * c->k;
    B->router = take(&w, arl_router_ws_floats(T, c->E));
    B->fill = (int64_t *)take(&w, 2 * c->E);
    B->dun = take(&w, T * c->dz);
    B->du = take(&w, T * c->dz);
    B->dsh = take(&w, T * c->fs);
    B->dsgu = take(&w, T * 2 * c->fs);
    B->dp = take(&w, Tk);
    B->dyg = take(&w, Tk * c->dz);
    B->dh = take(&w, Tk * c->f);
    B->dgu = take(&w, Tk * 2 * c->f);
    B->dzg = take(&w, Tk * c->dz);
    B->dz = take(&w, T * c->dz);
    return w.used;
}

int64_t arl_moe_train_ws_floats(const arl_moe_cfg *c, int64_t T) {
    moe_ws B;
    return ws_layout(&B, NULL, c, T);
}

typedef struct experts_ctx {
    const arl_moe_save *sv;
    const moe_ws *B;
    const arl_moe_cfg *c;
    const arl_moe_params *p;
    const arl_moe_params *gp;
} experts_ctx;

/* Experts [e0, e1) on their own rows (experts without tokens are skipped, spec 7.2).  A GEMM
 * issued inside a pool part runs on that thread and computes the same bits as from the main
 * thread (kernels/threadpool.h), so the result does not depend on the thread count. */
static void experts_fwd(void *vctx, int64_t e0, int64_t e1) {
    const experts_ctx *X = vctx;
    const arl_moe_save *S = X->sv;
    arl_moe_experts_fwd_range(S->yg, S->gu, S->h, S->zg, S->start, X->p, X->c, e0, e1);
}

/* Backward of experts [e0, e1): their weight gradients from their own rows only; dzg rows. */
static void experts_bwd(void *vctx, int64_t e0, int64_t e1) {
    const experts_ctx *X = vctx;
    const arl_moe_save *S = X->sv;
    const moe_ws *B = X->B;
    arl_moe_experts_bwd_range(B->dzg, X->gp, B->dyg, S->zg, S->gu, S->h, S->start, X->p, X->c,
                              B->dh, B->dgu, e0, e1);
}

void arl_moe_experts_bwd_range(float *dzg, const arl_moe_params *gw, const float *dyg,
                               const float *zg, const float *gu, const float *h,
                               const int64_t *start, const arl_moe_params *p, const arl_moe_cfg *c,
                               float *dh, float *dgu, int64_t e0, int64_t e1) {
    const int64_t f = c->f, dz = c->dz;
    for (int64_t e = e0; e < e1; e++) {
        int64_t r0 = start[e], ne = start[e + 1] - r0;
        if (ne == 0) continue;
        /* dzg rows overwritten (dx_beta 0) */
        arl_moe_glu_bwd(dzg + r0 * dz, 0.0f, gw->w1 + e * f * dz, gw->w3 + e * f * dz,
                        gw->w2 + e * dz * f, dyg + r0 * dz, zg + r0 * dz, p->w1 + e * f * dz,
                        p->w3 + e * f * dz, p->w2 + e * dz * f, ne, dz, f, dz, &c->act,
                        gu + r0 * 2 * f, h + r0 * f, dh + r0 * f, dgu + r0 * 2 * f);
    }
}

typedef struct combine_ctx {
    const arl_moe_save *sv;
    int64_t k, dz;
} combine_ctx;

/* u_pre as policy/moe.c's combine (arl_moe_combine_range). */
static void combine_rows(void *vctx, int64_t t0, int64_t t1) {
    const combine_ctx *X = vctx;
    const arl_moe_save *S = X->sv;
    arl_moe_combine_range(S->u_pre, S->pw, S->yg, S->row, X->k, X->dz, t0, t1);
}

/* Rows per part for a memory-bound row loop of `width` elements a row: ~32K elements a part
 * (kernels/cpu's grain for row kernels).  Rows are independent, so any split gives the same bits.
 */
static int64_t row_grain(int64_t width) {
    const int64_t elems = (int64_t)1 << 15;
    return width >= elems ? 1 : elems / (width > 0 ? width : 1);
}

typedef struct slots_ctx {
    const arl_moe_save *sv;
    const moe_ws *B;
    const float *du; /* (T, dz) */
    int64_t k, dz;
} slots_ctx;

/* Rows [t0, t1) of dp (T, k) = E_j(z_t) . du_t and dyg rows p_tj du_t (each token its own). */
static void slots_bwd_rows(void *vctx, int64_t t0, int64_t t1) {
    const slots_ctx *X = vctx;
    const arl_moe_save *S = X->sv;
    arl_moe_slots_bwd_range(X->B->dp, X->B->dyg, X->du, S->yg, S->pw, S->row, X->k, X->dz, t0, t1);
}

void arl_moe_slots_bwd_range(float *dp, float *dyg, const float *du, const float *yg,
                             const float *pw, const int64_t *row, int64_t k, int64_t dz, int64_t t0,
                             int64_t t1) {
    for (int64_t t = t0; t < t1; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t r = row[t * k + j];
            const float *yr = yg + r * dz, *dut = du + t * dz;
            double acc = 0.0;
            for (int64_t i = 0; i < dz; i++)
                acc += (double)yr[i] * dut[i];
            dp[t * k + j] = (float)acc;
            const float pj = pw[t * k + j];
            float *dr = dyg + r * dz;
            for (int64_t i = 0; i < dz; i++)
                dr[i] = pj * dut[i];
        }
}

/* Rows [t0, t1) of dz (T, dz) = the sum of the token's dzg rows, slots in order from 0. */
static void gather_dz_rows(void *vctx, int64_t t0, int64_t t1) {
    const slots_ctx *X = vctx;
    arl_moe_gather_dz_range(X->B->dz, X->B->dzg, X->sv->row, X->k, X->dz, t0, t1);
}

void arl_moe_gather_dz_range(float *dz, const float *dzg, const int64_t *row, int64_t k,
                             int64_t dzw, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
        float *dzt = dz + t * dzw;
        for (int64_t i = 0; i < dzw; i++)
            dzt[i] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float *src = dzg + row[t * k + j] * dzw;
            for (int64_t i = 0; i < dzw; i++)
                dzt[i] += src[i];
        }
    }
}

arl_status arl_moe_fwd_save(float *y, const arl_moe_out *out, const float *x,
                            const arl_moe_params *p, const arl_moe_cfg *c, const int32_t *forced,
                            int64_t T, arl_moe_save *sv, float *ws) {
    ARL_ASSERT(y && x && p && c && sv && ws && y != x);
    if (T == 0) {
        if (out && out->load) memset(out->load, 0, sizeof(int64_t) * (size_t)c->E);
        return ARL_OK;
    }
    moe_ws B;
    ws_layout(&B, ws, c, T);
    const int64_t d = c->d, E = c->E, k = c->k, dz = c->dz;

    ARL_TRY(arl_router_fwd(sv->sel, sv->pw, sv->s, x, p->gate, p->gate_bias, forced, T, d, E, k,
                           c->rho, B.router));
    arl_k_linear_fwd(sv->z, x, p->down_proj, T, d, dz);
    arl_moe_group(sv->start, B.fill, sv->row, sv->zg, sv->z, sv->sel, T, k, E, dz);

    experts_ctx X = {sv, &B, c, p, NULL};
    arl_k_parallel_for(E, 1, experts_fwd, &X);

    combine_ctx Y = {sv, k, dz};
    arl_k_parallel_for(T, 16, combine_rows, &Y);
    if (p->latent_norm)
        arl_k_rmsnorm_fwd(sv->u, sv->rstd, sv->u_pre, p->latent_norm, T, dz, c->eps);
    else
        memcpy(sv->u, sv->u_pre, sizeof(float) * (size_t)(T * dz));
    arl_k_linear_fwd(y, sv->u, p->up_proj, T, dz, d);

    if (c->fs > 0 && p->shared_gate_proj)
        arl_moe_glu_fwd(y, 1.0f, x, p->shared_gate_proj, p->shared_up_proj, p->shared_down_proj, T,
                        d, c->fs, d, &c->act, sv->sgu, sv->sh);

    if (out) {
        if (out->routes) memcpy(out->routes, sv->sel, sizeof(int32_t) * (size_t)(T * k));
        if (out->weights) memcpy(out->weights, sv->pw, sizeof(float) * (size_t)(T * k));
        if (out->scores) memcpy(out->scores, sv->s, sizeof(float) * (size_t)(T * E));
        if (out->load)
            for (int64_t e = 0; e < E; e++)
                out->load[e] = sv->start[e + 1] - sv->start[e];
    }
    return ARL_OK;
}

void arl_moe_bwd(float *dx, const arl_moe_params *gp, const float *dy, const float *x,
                 const arl_moe_params *p, const arl_moe_cfg *c, int64_t T, const arl_moe_save *sv,
                 float *ws) {
    ARL_ASSERT(dx && gp && dy && x && p && c && sv && ws);
    if (T == 0) return;
    moe_ws B;
    ws_layout(&B, ws, c, T);
    const int64_t d = c->d, E = c->E, k = c->k, dz = c->dz;

    /* y = W_up RMSNorm_{w_z}(u) + shared(x) */
    arl_k_linear_bwd_w(gp->up_proj, dy, sv->u, T, dz, d);
    /* dun = dy W_up, overwritten (beta 0: as arl_k_linear_bwd_x into zeros, without the memset) */
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, dz, d, 1.0f, dy, d, p->up_proj, dz, 0.0f, B.dun,
               dz);
    const float *du = B.dun;
    if (p->latent_norm) {
        zero(B.du, T * dz);
        arl_k_rmsnorm_bwd(B.du, gp->latent_norm, B.dun, sv->u_pre, p->latent_norm, sv->rstd, T, dz);
        du = B.du;
    }
    if (c->fs > 0 && p->shared_gate_proj)
        arl_moe_glu_bwd(dx, 1.0f, gp->shared_gate_proj, gp->shared_up_proj, gp->shared_down_proj,
                        dy, x, p->shared_gate_proj, p->shared_up_proj, p->shared_down_proj, T, d,
                        c->fs, d, &c->act, sv->sgu, sv->sh, B.dsh, B.dsgu);

    /* u = sum_i p_i E_i(z): dp_i = E_i(z) . du (for the router), dE_i = p_i du; tokens in
     * parallel (each token writes its own dp entries and its own dyg rows) */
    slots_ctx Z = {sv, &B, du, k, dz};
    arl_k_parallel_for(T, row_grain(2 * k * dz), slots_bwd_rows, &Z);

    /* experts, each on its own rows; then z's gradient summed over a token's slots in order */
    experts_ctx X = {sv, &B, c, p, gp};
    arl_k_parallel_for(E, 1, experts_bwd, &X);
    arl_k_parallel_for(T, row_grain(k * dz), gather_dz_rows, &Z);
    arl_k_linear_bwd_w(gp->down_proj, B.dz, x, T, d, dz);
    arl_k_linear_bwd_x(dx, B.dz, p->down_proj, T, d, dz);

    /* 6.2 router: through the selected scores only; the bias gets no gradient */
    arl_router_bwd(dx, gp->gate, B.dp, x, p->gate, sv->s, sv->sel, T, d, E, k, c->rho, B.router);
}
