/* policy/vision_backward.c: backward of the image front end, fp32 (see
 * policy/vision_backward.h).  The forward below follows policy/vision.c call for call (the
 * position-grid resize and RoPE are re-stated here: they are static there); the backward runs
 * it in reverse. */
#include "policy/vision_backward.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/vision.h"

#define QBLK 64 /* queries per attention block, as policy/vision.c */

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

static void zero(float *x, int64_t n) {
    memset(x, 0, sizeof(float) * (size_t)n);
}

typedef struct vblock_save {
    float *x_in;  /* (Np, D) block input */
    float *hn0;   /* (Np, D) RMSNorm0 */
    float *r0;    /* (Np) */
    float *qkv;   /* (Np, 3Q) after RoPE */
    float *att;   /* (Np, Q) */
    float *x_mid; /* (Np, D) after the attention residual */
    float *hn1;   /* (Np, D) */
    float *r1;    /* (Np) */
    float *m_pre; /* (Np, F) fc0 output */
    float *m_act; /* (Np, F) GELU_tanh */
} vblock_save;

typedef struct vis_bufs {
    vblock_save *blk; /* (Lv), pointer table inside the buffer */
    float *x;         /* (Np, D) residual stream */
    float *x_fin;     /* (Np, D) input of the final norm */
    float *r_fin;     /* (Np) */
    float *tower;     /* (Np, D) */
    float *merged;    /* (N, 4D) */
    float *h_pre;     /* (N, 4D) proj.0 output */
    float *h_act;     /* (N, 4D) GELU(erf) */
    float *t_pre;     /* (N, d) proj.2 output */
    float *r_post;    /* (N) */
    float *tok;       /* (N, d) */
    /* backward */
    float *dt_pre, *dh_act, *dh_pre, *dmerged, *dx, *dhn, *dm, *dm_pre, *datt, *dqkv;
    float *P, *dP; /* (heads, QBLK, Np) */
} vis_bufs;

static int64_t vis_layout(vis_bufs *B, float *base, const arl_model_dims *dm, int64_t Np) {
    ws_bump w = {base, 0};
    const int64_t N = Np / 4 + 1, D = dm->vD, Q = dm->vQ, F = dm->vF, d = dm->d;
    int64_t tab = (int64_t)((sizeof(vblock_save) * (size_t)(dm->vL > 0 ? dm->vL : 1) + 3) / 4);
    B->blk = (vblock_save *)take(&w, tab);
    for (int64_t i = 0; i < dm->vL; i++) {
        vblock_save s;
        s.x_in = take(&w, Np * D);
        s.hn0 = take(&w, Np * D);
        s.r0 = take(&w, Np);
        s.qkv = take(&w, Np * 3 * Q);
        s.att = take(&w, Np * Q);
        s.x_mid = take(&w, Np * D);
        s.hn1 = take(&w, Np * D);
        s.r1 = take(&w, Np);
        s.m_pre = take(&w, Np * F);
        s.m_act = take(&w, Np * F);
        if (base) B->blk[i] = s;
    }
    B->x = take(&w, Np * D);
    B->x_fin = take(&w, Np * D);
    B->r_fin = take(&w, Np);
    B->tower = take(&w, Np * D);
    B->merged = take(&w, N * 4 * D);
    B->h_pre = take(&w, N * 4 * D);
    B->h_act = take(&w, N * 4 * D);
    B->t_pre = take(&w, N * d);
    B->r_post = take(&w, N);
    B->tok = take(&w, N * d);
    B->dt_pre = take(&w, N * d);
    B->dh_act = take(&w, N * 4 * D);
    B->dh_pre = take(&w, N * 4 * D);
    B->dmerged = take(&w, N * 4 * D);
    B->dx = take(&w, Np * D);
    B->dhn = take(&w, Np * D);
    B->dm = take(&w, Np * F);
    B->dm_pre = take(&w, Np * F);
    B->datt = take(&w, Np * Q);
    B->dqkv = take(&w, Np * 3 * Q);
    B->P = take(&w, dm->vheads * QBLK * Np);
    B->dP = take(&w, dm->vheads * QBLK * Np);
    return w.used;
}

int64_t arl_vision_train_ws_floats(const arl_model_config *cfg, int64_t max_patches) {
    vis_bufs B;
    return vis_layout(&B, NULL, &cfg->dims, max_patches);
}

/* The bilinear resize of policy/vision.c (half-pixel centres, clamped at 0): for output cell
 * (oy, ox) the four grid cells and weights.  fwd: x += resize(grid); bwd: dgrid += adjoint. */
static void pos_emb(float *x, float *dgrid, const float *grid, const float *dx, int64_t Gh,
                    int64_t Gw, int64_t D, int64_t h, int64_t w) {
    for (int64_t oy = 0; oy < h; oy++) {
        double sy = (oy + 0.5) * ((double)Gh / (double)h) - 0.5;
        if (sy < 0) sy = 0;
        int64_t y0 = (int64_t)floor(sy), y1 = y0 + 1 < Gh ? y0 + 1 : Gh - 1;
        float ly = (float)(sy - (double)y0);
        if (h == Gh) y0 = y1 = oy, ly = 0.0f;
        for (int64_t ox = 0; ox < w; ox++) {
            double sx = (ox + 0.5) * ((double)Gw / (double)w) - 0.5;
            if (sx < 0) sx = 0;
            int64_t x0 = (int64_t)floor(sx), x1 = x0 + 1 < Gw ? x0 + 1 : Gw - 1;
            float lx = (float)(sx - (double)x0);
            if (w == Gw) x0 = x1 = ox, lx = 0.0f;
            const int64_t ia = (y0 * Gw + x0) * D, ib = (y0 * Gw + x1) * D;
            const int64_t ic = (y1 * Gw + x0) * D, ie = (y1 * Gw + x1) * D;
            const int64_t o = (oy * w + ox) * D;
            if (x) {
                for (int64_t i = 0; i < D; i++)
                    x[o + i] += (1.0f - ly) * ((1.0f - lx) * grid[ia + i] + lx * grid[ib + i]) +
                                ly * ((1.0f - lx) * grid[ic + i] + lx * grid[ie + i]);
            } else {
                for (int64_t i = 0; i < D; i++) {
                    float g = dx[o + i];
                    dgrid[ia + i] += (1.0f - ly) * (1.0f - lx) * g;
                    dgrid[ib + i] += (1.0f - ly) * lx * g;
                    dgrid[ic + i] += ly * (1.0f - lx) * g;
                    dgrid[ie + i] += ly * lx * g;
                }
            }
        }
    }
}

/* RoPE2D of policy/vision.c on one head vector v (hd); inverse = 1 rotates by the negative
 * angles (the transpose: the backward of the rotation). */
static void rope2d(float *v, int64_t hd, int64_t row, int64_t col, int inverse) {
    for (int64_t i = 0; i < hd / 4; i++) {
        double theta = pow(10000.0, -4.0 * (double)i / (double)hd);
        for (int which = 0; which < 2; which++) {
            double ang = (double)(which == 0 ? col : row) * theta;
            float cs = (float)cos(ang), sn = (float)sin(ang);
            if (inverse) sn = -sn;
            float *pr = v + 4 * i + 2 * which;
            float a = pr[0], b = pr[1];
            pr[0] = a * cs - b * sn;
            pr[1] = a * sn + b * cs;
        }
    }
}

/* RoPE on q and k of every patch (inverse: on their gradients). */
static void rope_all(float *qkv, const int32_t *grids, int32_t n_img, int64_t Q, int64_t nh,
                     int inverse) {
    const int64_t hd = Q / nh;
    int64_t a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        for (int64_t t = 0; t < gh * gw; t++)
            for (int64_t h = 0; h < nh; h++) {
                float *row = qkv + (a + t) * 3 * Q + h * hd;
                rope2d(row, hd, t / gw, t % gw, inverse);
                rope2d(row + Q, hd, t / gw, t % gw, inverse);
            }
        a += gh * gw;
    }
}

typedef struct attn_ctx {
    const vis_bufs *B;
    const float *qkv;
    float *att;
    const float *datt;
    float *dqkv;
    const int32_t *grids;
    int32_t n_img;
    int64_t Q, hd, Np;
} attn_ctx;

static void attn_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const attn_ctx *A = vctx;
    arl_vision_attn_heads(A->att, A->B->P, A->qkv, A->grids, A->n_img, A->Q, A->hd, A->Np, h0, h1);
}

/* Backward of one head's attention: dq, dk, dv into its columns of dqkv (zeroed by the
 * caller); each head owns its columns, so heads run in parallel. */
static void attn_bwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const attn_ctx *A = vctx;
    const int64_t Q = A->Q, hd = A->hd, ld = 3 * Q;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = h0; h < h1; h++) {
        float *P = A->B->P + h * QBLK * A->Np, *dP = A->B->dP + h * QBLK * A->Np;
        int64_t a = 0;
        for (int32_t im = 0; im < A->n_img; im++) {
            int64_t n = (int64_t)A->grids[2 * im] * A->grids[2 * im + 1];
            const float *q = A->qkv + a * ld + h * hd, *k = q + Q, *v = q + 2 * Q;
            float *dq = A->dqkv + a * ld + h * hd, *dk = dq + Q, *dv = dq + 2 * Q;
            for (int64_t q0 = 0; q0 < n; q0 += QBLK) {
                int64_t nb = n - q0 < QBLK ? n - q0 : QBLK;
                const float *dO = A->datt + (a + q0) * Q + h * hd;
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nb, n, hd, scale, q + q0 * ld, ld, k, ld,
                           0.0f, P, n);
                arl_k_softmax_fwd(P, P, nb, n);
                /* dV += P^T dO;  dP = dO V^T;  dS = softmax backward;  dQ, dK */
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, n, hd, nb, 1.0f, P, n, dO, Q, 1.0f, dv, ld);
                float *dS = dP; /* dS overwrites dP row by row */
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nb, n, hd, 1.0f, dO, Q, v, ld, 0.0f, dP, n);
                for (int64_t i = 0; i < nb; i++) {
                    double s = 0.0;
                    for (int64_t j = 0; j < n; j++)
                        s += (double)P[i * n + j] * dP[i * n + j];
                    for (int64_t j = 0; j < n; j++)
                        dS[i * n + j] = (float)(P[i * n + j] * (dP[i * n + j] - s));
                }
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nb, hd, n, scale, dS, n, k, ld, 1.0f,
                           dq + q0 * ld, ld);
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, n, hd, nb, scale, dS, n, q + q0 * ld, ld,
                           1.0f, dk, ld);
            }
            a += n;
        }
    }
}

arl_status arl_vision_bwd(const arl_model_params *grads, float *tokens, const float *d_tokens,
                          const arl_model_params *w, const arl_model_config *cfg,
                          const float *patches, const int32_t *grids, int32_t n_img, float *ws,
                          int64_t ws_floats) {
    if (!cfg->has_vision || !w->has_vision || !grads->has_vision)
        return arl_errorf(ARL_ERR_UNSUPPORTED, "image input: the model has no vision tower (its "
                                               "config.json has no vision_config)");
    const arl_model_dims *dm = &cfg->dims;
    const arl_vision_params *vp = &w->vision, *gv = &grads->vision;
    const int64_t D = dm->vD, Q = dm->vQ, F = dm->vF, p = dm->vp, nh = dm->vheads, d = dm->d;
    const int64_t pp = 3 * p * p, hd = Q / nh;
    const float eps_post = (float)cfg->vision.projector_ln_eps;
    int64_t Np = 0;
    arl_status st = arl_vision_grids_count(grids, n_img, &Np);
    if (st) return st;
    vis_bufs B;
    if (vis_layout(&B, NULL, dm, Np) > ws_floats)
        return arl_errorf(ARL_ERR_RANGE,
                          "vision: %lld patches do not fit the work buffer (%lld floats); lower "
                          "the image size or max patches",
                          (long long)Np, (long long)ws_floats);
    vis_layout(&B, ws, dm, Np);
    const int64_t N = Np / 4;

    /* ---- forward, keeping intermediates (policy/vision.c) ---- */
    arl_k_linear_fwd(B.x, patches, vp->patch_embed, Np, pp, D);
    int64_t a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        pos_emb(B.x + a * D, NULL, vp->pos_emb, NULL, dm->vGh, dm->vGw, D, gh, gw);
        a += gh * gw;
    }
    for (int64_t bi = 0; bi < dm->vL; bi++) {
        const arl_vit_block_params *bp = &vp->blocks[bi];
        vblock_save *s = &B.blk[bi];
        memcpy(s->x_in, B.x, sizeof(float) * (size_t)(Np * D));
        arl_k_rmsnorm_fwd(s->hn0, s->r0, B.x, bp->norm0, Np, D, 1e-6f);
        arl_k_linear_fwd(s->qkv, s->hn0, bp->wqkv, Np, D, 3 * Q);
        rope_all(s->qkv, grids, n_img, Q, nh, 0);
        attn_ctx A = {&B, s->qkv, s->att, NULL, NULL, grids, n_img, Q, hd, Np};
        arl_k_parallel_for(nh, 1, attn_fwd_heads, &A);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, Np, D, Q, 1.0f, s->att, Q, bp->wo, Q, 1.0f, B.x, D);
        memcpy(s->x_mid, B.x, sizeof(float) * (size_t)(Np * D));
        arl_k_rmsnorm_fwd(s->hn1, s->r1, B.x, bp->norm1, Np, D, 1e-6f);
        arl_k_linear_fwd(s->m_pre, s->hn1, bp->fc0, Np, D, F);
        arl_k_gelu_tanh_fwd(s->m_act, s->m_pre, Np * F);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, Np, D, F, 1.0f, s->m_act, F, bp->fc1, F, 1.0f, B.x,
                   D);
    }
    memcpy(B.x_fin, B.x, sizeof(float) * (size_t)(Np * D));
    arl_k_rmsnorm_fwd(B.tower, B.r_fin, B.x_fin, vp->final_norm, Np, D, 1e-6f);
    int64_t n = 0;
    a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        for (int64_t y = 0; y < gh / 2; y++)
            for (int64_t x = 0; x < gw / 2; x++, n++) {
                const int64_t src[4] = {(2 * y) * gw + 2 * x, (2 * y) * gw + 2 * x + 1,
                                        (2 * y + 1) * gw + 2 * x, (2 * y + 1) * gw + 2 * x + 1};
                for (int j = 0; j < 4; j++)
                    memcpy(B.merged + (n * 4 + j) * D, B.tower + (a + src[j]) * D,
                           sizeof(float) * D);
            }
        a += gh * gw;
    }
    arl_k_linear_fwd(B.h_pre, B.merged, vp->proj0, N, 4 * D, 4 * D);
    arl_k_gelu_erf_fwd(B.h_act, B.h_pre, N * 4 * D);
    arl_k_linear_fwd(B.t_pre, B.h_act, vp->proj2, N, 4 * D, d);
    arl_k_rmsnorm_fwd(B.tok, B.r_post, B.t_pre, vp->post_norm, N, d, eps_post);
    if (tokens) memcpy(tokens, B.tok, sizeof(float) * (size_t)(N * d));

    /* ---- backward ---- */
    zero(B.dt_pre, N * d);
    arl_k_rmsnorm_bwd(B.dt_pre, gv->post_norm, d_tokens, B.t_pre, vp->post_norm, B.r_post, N, d);
    arl_k_linear_bwd_w(gv->proj2, B.dt_pre, B.h_act, N, 4 * D, d);
    zero(B.dh_act, N * 4 * D);
    arl_k_linear_bwd_x(B.dh_act, B.dt_pre, vp->proj2, N, 4 * D, d);
    zero(B.dh_pre, N * 4 * D);
    arl_k_gelu_erf_bwd(B.dh_pre, B.dh_act, B.h_pre, N * 4 * D);
    arl_k_linear_bwd_w(gv->proj0, B.dh_pre, B.merged, N, 4 * D, 4 * D);
    zero(B.dmerged, N * 4 * D);
    arl_k_linear_bwd_x(B.dmerged, B.dh_pre, vp->proj0, N, 4 * D, 4 * D);
    /* merge: a permutation of the tower rows */
    float *dtower = B.dhn;
    n = 0;
    a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        for (int64_t y = 0; y < gh / 2; y++)
            for (int64_t x = 0; x < gw / 2; x++, n++) {
                const int64_t src[4] = {(2 * y) * gw + 2 * x, (2 * y) * gw + 2 * x + 1,
                                        (2 * y + 1) * gw + 2 * x, (2 * y + 1) * gw + 2 * x + 1};
                for (int j = 0; j < 4; j++)
                    memcpy(dtower + (a + src[j]) * D, B.dmerged + (n * 4 + j) * D,
                           sizeof(float) * D);
            }
        a += gh * gw;
    }
    zero(B.dx, Np * D); /* dx: the gradient of the residual stream */
    arl_k_rmsnorm_bwd(B.dx, gv->final_norm, dtower, B.x_fin, vp->final_norm, B.r_fin, Np, D);
    for (int64_t bi = dm->vL - 1; bi >= 0; bi--) {
        const arl_vit_block_params *bp = &vp->blocks[bi];
        const arl_vit_block_params *gb = &gv->blocks[bi];
        const vblock_save *s = &B.blk[bi];
        /* x += fc1 GELU_tanh(fc0 RMSNorm1(x_mid)) */
        arl_k_linear_bwd_w(gb->fc1, B.dx, s->m_act, Np, F, D);
        zero(B.dm, Np * F);
        arl_k_linear_bwd_x(B.dm, B.dx, bp->fc1, Np, F, D);
        zero(B.dm_pre, Np * F);
        arl_k_gelu_tanh_bwd(B.dm_pre, B.dm, s->m_pre, Np * F);
        arl_k_linear_bwd_w(gb->fc0, B.dm_pre, s->hn1, Np, D, F);
        zero(B.dhn, Np * D);
        arl_k_linear_bwd_x(B.dhn, B.dm_pre, bp->fc0, Np, D, F);
        arl_k_rmsnorm_bwd(B.dx, gb->norm1, B.dhn, s->x_mid, bp->norm1, s->r1, Np, D);
        /* x_mid = x_in + Wo att(RoPE(Wqkv RMSNorm0(x_in))) */
        arl_k_linear_bwd_w(gb->wo, B.dx, s->att, Np, Q, D);
        zero(B.datt, Np * Q);
        arl_k_linear_bwd_x(B.datt, B.dx, bp->wo, Np, Q, D);
        zero(B.dqkv, Np * 3 * Q);
        attn_ctx A = {&B, s->qkv, NULL, B.datt, B.dqkv, grids, n_img, Q, hd, Np};
        arl_k_parallel_for(nh, 1, attn_bwd_heads, &A);
        rope_all(B.dqkv, grids, n_img, Q, nh, 1);
        arl_k_linear_bwd_w(gb->wqkv, B.dqkv, s->hn0, Np, D, 3 * Q);
        zero(B.dhn, Np * D);
        arl_k_linear_bwd_x(B.dhn, B.dqkv, bp->wqkv, Np, D, 3 * Q);
        arl_k_rmsnorm_bwd(B.dx, gb->norm0, B.dhn, s->x_in, bp->norm0, s->r0, Np, D);
    }
    /* position grid (adjoint of the resize) and patch embedding */
    a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        pos_emb(NULL, gv->pos_emb, NULL, B.dx + a * D, dm->vGh, dm->vGw, D, gh, gw);
        a += gh * gw;
    }
    arl_k_linear_bwd_w(gv->patch_embed, B.dx, patches, Np, pp, D);
    return ARL_OK;
}
