/* policy/vision.c: the image front end, fp32 (see policy/vision.h).  Follows spec/policy.md
 * 10.2 top to bottom: patch embedding, position grid, blocks, final norm, merge, projector. */
#include "policy/vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"

/* Queries per attention block (scores of QBLK queries against all keys of an image). */
#define QBLK 64

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

typedef struct vis_bufs {
    float *x;      /* (Np, D) residual stream */
    float *hn;     /* (Np, D) normalised */
    float *qkv;    /* (Np, 3Q) */
    float *att;    /* (Np, Q) */
    float *mlp;    /* (Np, F) */
    float *merged; /* (N, 4D) */
    float *hproj;  /* (N, 4D) */
    float *scores; /* (heads, QBLK, Np) */
} vis_bufs;

static int64_t vis_layout(vis_bufs *B, float *base, const arl_model_dims *dm, int64_t Np) {
    ws_bump w = {base, 0};
    const int64_t N = Np / 4 + 1;
    B->x = take(&w, Np * dm->vD);
    B->hn = take(&w, Np * dm->vD);
    B->qkv = take(&w, Np * 3 * dm->vQ);
    B->att = take(&w, Np * dm->vQ);
    B->mlp = take(&w, Np * dm->vF);
    B->merged = take(&w, N * 4 * dm->vD);
    B->hproj = take(&w, N * 4 * dm->vD);
    B->scores = take(&w, dm->vheads * QBLK * Np);
    return w.used;
}

int64_t arl_vision_ws_floats(const arl_model_config *cfg, int64_t max_patches) {
    vis_bufs B;
    return vis_layout(&B, NULL, &cfg->dims, max_patches);
}

/* Bilinear resize of grid (Gh, Gw, D) to (h, w, D), adding the result to x (h*w, D):
 * half-pixel centres, source coordinates below 0 clamped to 0 (align_corners = False). */
static void add_pos_emb(float *x, const float *grid, int64_t Gh, int64_t Gw, int64_t D, int64_t h,
                        int64_t w) {
    for (int64_t oy = 0; oy < h; oy++) {
        double sy = (oy + 0.5) * ((double)Gh / (double)h) - 0.5;
        if (sy < 0) sy = 0;
        int64_t y0 = (int64_t)floor(sy), y1 = y0 + 1 < Gh ? y0 + 1 : Gh - 1;
        float ly = (float)(sy - (double)y0);
        if (h == Gh) y0 = y1 = oy, ly = 0.0f; /* equal size: the grid itself */
        for (int64_t ox = 0; ox < w; ox++) {
            double sx = (ox + 0.5) * ((double)Gw / (double)w) - 0.5;
            if (sx < 0) sx = 0;
            int64_t x0 = (int64_t)floor(sx), x1 = x0 + 1 < Gw ? x0 + 1 : Gw - 1;
            float lx = (float)(sx - (double)x0);
            if (w == Gw) x0 = x1 = ox, lx = 0.0f;
            const float *a = grid + (y0 * Gw + x0) * D, *b = grid + (y0 * Gw + x1) * D;
            const float *c = grid + (y1 * Gw + x0) * D, *e = grid + (y1 * Gw + x1) * D;
            float *dst = x + (oy * w + ox) * D;
            for (int64_t i = 0; i < D; i++)
                dst[i] += (1.0f - ly) * ((1.0f - lx) * a[i] + lx * b[i]) +
                          ly * ((1.0f - lx) * c[i] + lx * e[i]);
        }
    }
}

/* RoPE2D in place on one head vector v (hd): pairs (4i, 4i+1) by col*theta_i, (4i+2, 4i+3) by
 * row*theta_i, theta_i = 10000^(-4i/hd). */
static void rope2d(float *v, int64_t hd, int64_t row, int64_t col) {
    for (int64_t i = 0; i < hd / 4; i++) {
        double theta = pow(10000.0, -4.0 * (double)i / (double)hd);
        for (int which = 0; which < 2; which++) {
            double ang = (double)(which == 0 ? col : row) * theta;
            float cs = (float)cos(ang), sn = (float)sin(ang);
            float *pr = v + 4 * i + 2 * which;
            float a = pr[0], b = pr[1];
            pr[0] = a * cs - b * sn;
            pr[1] = a * sn + b * cs;
        }
    }
}

typedef struct attn_ctx {
    vis_bufs *B;
    const int32_t *grids;
    int32_t n_img;
    int64_t Q, hd, Np;
} attn_ctx;

void arl_vision_attn_heads(float *att, float *scores, const float *qkv, const int32_t *grids,
                           int32_t n_img, int64_t Q, int64_t hd, int64_t Np, int64_t h0,
                           int64_t h1) {
    const int64_t ld = 3 * Q;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = h0; h < h1; h++) {
        float *sc = scores + h * QBLK * Np;
        int64_t a = 0;
        for (int32_t im = 0; im < n_img; im++) {
            int64_t n = (int64_t)grids[2 * im] * grids[2 * im + 1];
            const float *q = qkv + a * ld + h * hd, *k = q + Q, *v = q + 2 * Q;
            for (int64_t q0 = 0; q0 < n; q0 += QBLK) {
                int64_t nb = n - q0 < QBLK ? n - q0 : QBLK;
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nb, n, hd, scale, q + q0 * ld, ld, k, ld,
                           0.0f, sc, n);
                arl_k_softmax_fwd(sc, sc, nb, n);
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nb, hd, n, 1.0f, sc, n, v, ld, 0.0f,
                           att + (a + q0) * Q + h * hd, Q);
            }
            a += n;
        }
    }
}

static void attn_heads(void *vctx, int64_t h0, int64_t h1) {
    const attn_ctx *A = vctx;
    arl_vision_attn_heads(A->B->att, A->B->scores, A->B->qkv, A->grids, A->n_img, A->Q, A->hd,
                          A->Np, h0, h1);
}

arl_status arl_vision_grids_count(const int32_t *grids, int32_t n_img, int64_t *Np) {
    if (n_img < 1) return arl_errorf(ARL_ERR_ARG, "vision: no image");
    int64_t n = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int32_t gh = grids[2 * i], gw = grids[2 * i + 1];
        if (gh < 2 || gw < 2 || gh % 2 || gw % 2)
            return arl_errorf(ARL_ERR_ARG,
                              "vision: image %d has a %d x %d patch grid; both sides "
                              "must be even and >= 2 (2x2 merge)",
                              i, gh, gw);
        n += (int64_t)gh * gw;
    }
    *Np = n;
    return ARL_OK;
}

arl_status arl_vision_fwd(float *tokens, const arl_model_params *w, const arl_model_config *cfg,
                          const float *patches, const int32_t *grids, int32_t n_img, float *ws,
                          int64_t ws_floats, const arl_vision_trace *trace) {
    if (!cfg->has_vision || !w->has_vision)
        return arl_errorf(ARL_ERR_UNSUPPORTED, "image input: the model has no vision tower (its "
                                               "config.json has no vision_config)");
    const arl_model_dims *dm = &cfg->dims;
    const arl_vision_params *vp = &w->vision;
    const int64_t D = dm->vD, Q = dm->vQ, F = dm->vF, p = dm->vp, nh = dm->vheads, d = dm->d;
    int64_t Np = 0;
    arl_status st = arl_vision_grids_count(grids, n_img, &Np);
    if (st) return st;
    vis_bufs B;
    if (vis_layout(&B, NULL, dm, Np) > ws_floats)
        return arl_errorf(ARL_ERR_RANGE,
                          "vision: %lld patches do not fit the work buffer (%lld "
                          "floats); lower the image size or max patches",
                          (long long)Np, (long long)ws_floats);
    vis_layout(&B, ws, dm, Np);

    /* patch embedding (Conv2d with kernel = stride = p, no bias) + position grid */
    arl_k_linear_fwd(B.x, patches, vp->patch_embed, Np, 3 * p * p, D);
    int64_t a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        add_pos_emb(B.x + a * D, vp->pos_emb, dm->vGh, dm->vGw, D, gh, gw);
        a += gh * gw;
    }
    if (trace && trace->patch_tokens) memcpy(trace->patch_tokens, B.x, sizeof(float) * Np * D);

    /* encoder blocks */
    const int64_t hd = Q / nh;
    for (int64_t bi = 0; bi < dm->vL; bi++) {
        const arl_vit_block_params *bp = &vp->blocks[bi];
        arl_k_rmsnorm_fwd(B.hn, NULL, B.x, bp->norm0, Np, D, 1e-6f);
        arl_k_linear_fwd(B.qkv, B.hn, bp->wqkv, Np, D, 3 * Q);
        a = 0;
        for (int32_t i = 0; i < n_img; i++) {
            int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
            for (int64_t t = 0; t < gh * gw; t++)
                for (int64_t h = 0; h < nh; h++) {
                    float *row = B.qkv + (a + t) * 3 * Q + h * hd;
                    rope2d(row, hd, t / gw, t % gw);     /* q */
                    rope2d(row + Q, hd, t / gw, t % gw); /* k */
                }
            a += gh * gw;
        }
        attn_ctx A = {&B, grids, n_img, Q, hd, Np};
        arl_k_parallel_for(nh, 1, attn_heads, &A);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, Np, D, Q, 1.0f, B.att, Q, bp->wo, Q, 1.0f, B.x, D);
        arl_k_rmsnorm_fwd(B.hn, NULL, B.x, bp->norm1, Np, D, 1e-6f);
        arl_k_linear_fwd(B.mlp, B.hn, bp->fc0, Np, D, F);
        arl_k_gelu_tanh_fwd(B.mlp, B.mlp, Np * F);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, Np, D, F, 1.0f, B.mlp, F, bp->fc1, F, 1.0f, B.x, D);
    }
    arl_k_rmsnorm_fwd(B.x, NULL, B.x, vp->final_norm, Np, D, 1e-6f);
    if (trace && trace->tower) memcpy(trace->tower, B.x, sizeof(float) * Np * D);

    /* 2x2 merge, row-major over the merged grid of each image */
    int64_t N = 0;
    a = 0;
    for (int32_t i = 0; i < n_img; i++) {
        int64_t gh = grids[2 * i], gw = grids[2 * i + 1];
        for (int64_t y = 0; y < gh / 2; y++)
            for (int64_t x = 0; x < gw / 2; x++, N++) {
                const int64_t src[4] = {(2 * y) * gw + 2 * x, (2 * y) * gw + 2 * x + 1,
                                        (2 * y + 1) * gw + 2 * x, (2 * y + 1) * gw + 2 * x + 1};
                for (int j = 0; j < 4; j++)
                    memcpy(B.merged + (N * 4 + j) * D, B.x + (a + src[j]) * D, sizeof(float) * D);
            }
        a += gh * gw;
    }
    if (trace && trace->merged) memcpy(trace->merged, B.merged, sizeof(float) * N * 4 * D);

    /* projector: Linear -> GELU(erf) -> Linear -> RMSNorm */
    arl_k_linear_fwd(B.hproj, B.merged, vp->proj0, N, 4 * D, 4 * D);
    arl_k_gelu_erf_fwd(B.hproj, B.hproj, N * 4 * D);
    arl_k_linear_fwd(tokens, B.hproj, vp->proj2, N, 4 * D, d);
    arl_k_rmsnorm_fwd(tokens, NULL, tokens, vp->post_norm, N, d,
                      (float)cfg->vision.projector_ln_eps);
    return ARL_OK;
}

arl_status arl_vision_encode_images(const arl_model_params *w, const arl_model_config *cfg,
                                    const arl_image *imgs, int32_t n_img, int64_t max_patches,
                                    float **tokens, int64_t *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (!cfg->has_vision)
        return arl_errorf(ARL_ERR_UNSUPPORTED, "image input: the model has no vision tower (its "
                                               "config.json has no vision_config)");
    const int64_t p = cfg->dims.vp, d = cfg->dims.d;
    int32_t *grids = malloc(sizeof(int32_t) * 2 * (size_t)(n_img > 0 ? n_img : 1));
    if (!grids) return arl_errorf(ARL_ERR_NOMEM, "vision: out of memory");
    int64_t Np = 0;
    arl_status s = ARL_OK;
    for (int32_t i = 0; i < n_img && !s; i++) {
        s = arl_image_grid(imgs[i].width, imgs[i].height, (int32_t)p, max_patches, &grids[2 * i],
                           &grids[2 * i + 1]);
        Np += (int64_t)grids[2 * i] * grids[2 * i + 1];
    }
    float *patches = NULL, *ws = NULL, *out = NULL;
    int64_t wsn = 0;
    if (!s) {
        wsn = arl_vision_ws_floats(cfg, Np);
        patches = malloc(sizeof(float) * (size_t)(Np * 3 * p * p));
        ws = malloc(sizeof(float) * (size_t)wsn);
        out = malloc(sizeof(float) * (size_t)(Np / 4 * d));
        if (!patches || !ws || !out)
            s = arl_errorf(ARL_ERR_NOMEM, "vision: out of memory for %lld patches", (long long)Np);
    }
    int64_t at = 0;
    for (int32_t i = 0; i < n_img && !s; i++) {
        arl_image_patchify(&imgs[i], (int32_t)p, grids[2 * i], grids[2 * i + 1],
                           patches + at * 3 * p * p);
        at += (int64_t)grids[2 * i] * grids[2 * i + 1];
    }
    if (!s) s = arl_vision_fwd(out, w, cfg, patches, grids, n_img, ws, wsn, NULL);
    free(grids);
    free(patches);
    free(ws);
    if (s) {
        free(out);
        return s;
    }
    *tokens = out;
    *n_tokens = Np / 4;
    return ARL_OK;
}

arl_status arl_vision_place(float *seq, const float *embed, int64_t V, int64_t d,
                            const int32_t *tokens, int64_t T, int64_t placeholder_id,
                            const float *media, int64_t n_media) {
    int64_t ph = 0;
    for (int64_t t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return arl_errorf(ARL_ERR_RANGE,
                              "token id %d at position %lld is outside the "
                              "vocabulary [0, %lld)",
                              tokens[t], (long long)t, (long long)V);
        ph += media && tokens[t] == placeholder_id;
    }
    if (media && ph != n_media)
        return arl_errorf(ARL_ERR_ARG, "%lld <|media_pad|> placeholders but %lld image token rows",
                          (long long)ph, (long long)n_media);
    int64_t mi = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *src = embed + (int64_t)tokens[t] * d;
        if (media && tokens[t] == placeholder_id) src = media + (mi++) * d;
        memcpy(seq + t * d, src, sizeof(float) * (size_t)d);
    }
    return ARL_OK;
}
