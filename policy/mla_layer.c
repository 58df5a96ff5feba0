/* policy/mla_layer.c: one gated NoPE MLA mixer layer, fp32 (see policy/mla_layer.h).  Reads as
 * spec/policy.md 4.1 (projections) -> 4.1 or 4.2 (attention) -> 4.1 (gate, output). */
#include "policy/mla_layer.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/docs.h"
#include "policy/mla.h"

/* Queries of one document handed to the absorbed core at a time (a unit of parallel work). */
#define MLA_QBLOCK 16

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

typedef struct mla_bufs {
    float *cq;      /* (T, rq) */
    float *qf;      /* (T, Hm, n + r) */
    float *ckv;     /* (T, R) W_kva x */
    float *c;       /* (T, rkv) normalised latent */
    float *lat;     /* (T, R) new latent rows when the caller wants none */
    float *q_nope;  /* (T, Hm, n) */
    float *q_pe;    /* (T, Hm, r) */
    float *kv;      /* (T, Hm, n + vm)   expanded form */
    float *k_nope;  /* (T, Hm, n) */
    float *v;       /* (T, Hm, vm) */
    float *k_pe;    /* (T, r) */
    float *attn;    /* expanded core work buffer */
    float *qhat;    /* (T, Hm, rkv)      absorbed form */
    float *ohat;    /* (T, Hm, rkv) */
    int64_t *items; /* (n_items, 3) work items: document, first query, query count */
    float *fmeans;  /* block-sparse over fresh documents: chunk summaries of each document */
    int64_t *moff;  /* (N + 1) offset of document i's summaries in fmeans */
    float *lane;    /* (lanes, absorbed ws) */
    int64_t lane_floats;
    float *o;    /* (T, Hm, vm) */
    float *gate; /* (T, Hm * vm) */
} mla_bufs;

static int64_t max_items(int64_t T, int32_t N) {
    return T / MLA_QBLOCK + N + 1;
}

static int64_t mla_layout(mla_bufs *B, float *base, const arl_mla_layer_cfg *c, int64_t T,
                          int32_t N, int32_t lanes) {
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv, R = rkv + r;
    ws_bump w = {base, 0};
    B->cq = take(&w, T * (c->rq > 0 ? c->rq : 1));
    B->qf = take(&w, T * Hm * (n + r));
    B->ckv = take(&w, T * R);
    B->c = take(&w, T * rkv);
    B->lat = take(&w, T * R);
    B->q_nope = take(&w, T * Hm * n);
    B->q_pe = take(&w, T * Hm * r);
    B->kv = take(&w, T * Hm * (n + vm));
    B->k_nope = take(&w, T * Hm * n);
    B->v = take(&w, T * Hm * vm);
    B->k_pe = take(&w, T * r);
    B->attn = take(&w, arl_mla_attn_ws_floats(T, Hm, r));
    B->qhat = take(&w, T * Hm * rkv);
    B->ohat = take(&w, T * Hm * rkv);
    B->items = (int64_t *)take(&w, 2 * 3 * max_items(T, N));
    int64_t lane = arl_mla_absorbed_ws_floats(c->max_rows, rkv, r, c->sparse_chunk);
    if (c->sparse_topk > 0) {
        /* a document of len tokens has at most len / n_c + 1 chunks */
        B->fmeans = take(&w, (T / c->sparse_chunk + N + 1) * R);
        B->moff = (int64_t *)take(&w, 2 * ((int64_t)N + 1));
        int64_t sp = arl_mla_sparse_ws_floats(MLA_QBLOCK, Hm, c->max_rows, rkv, r, c->sparse_chunk,
                                              c->sparse_topk);
        if (sp > lane) lane = sp;
    } else {
        B->fmeans = NULL;
        B->moff = NULL;
    }
    B->lane_floats = (lane + 15) & ~(int64_t)15;
    B->lane = take(&w, (int64_t)lanes * B->lane_floats);
    B->o = take(&w, T * Hm * vm);
    B->gate = take(&w, T * Hm * vm);
    return w.used;
}

int64_t arl_mla_layer_ws_floats(const arl_mla_layer_cfg *c, int64_t T, int32_t N, int32_t lanes) {
    mla_bufs B;
    return mla_layout(&B, NULL, c, T, N, lanes);
}

/* Per token, split rows of width a + b (per head) into (Hm, a) and (Hm, b) parts. */
static void split_heads(float *A, float *Bp, const float *src, int64_t T, int64_t Hm, int64_t a,
                        int64_t b) {
    for (int64_t t = 0; t < T * Hm; t++) {
        memcpy(A + t * a, src + t * (a + b), sizeof(float) * a);
        memcpy(Bp + t * b, src + t * (a + b) + a, sizeof(float) * b);
    }
}

typedef struct absorbed_ctx {
    const mla_bufs *B;
    const arl_mla_layer_cfg *c;
    const int32_t *cu;
    float *const *caches;
    const int64_t *pos;
    float *const *means; /* (N) the caches' chunk summaries, or NULL */
    const float *lat;    /* fresh documents: their rows in the packed (T, R) latent */
    int64_t n_items;
    int32_t lanes;
    float scale;
} absorbed_ctx;

/* One lane: a contiguous range of work items, with the lane's own score buffer. */
static void absorbed_lane(void *vctx, int64_t l0, int64_t l1) {
    const absorbed_ctx *A = vctx;
    const mla_bufs *B = A->B;
    const arl_mla_layer_cfg *c = A->c;
    const int64_t Hm = c->Hm, rkv = c->rkv, r = c->r, R = rkv + r;
    for (int64_t lane = l0; lane < l1; lane++) {
        float *ws = B->lane + lane * B->lane_floats;
        int64_t i0 = A->n_items * lane / A->lanes, i1 = A->n_items * (lane + 1) / A->lanes;
        for (int64_t it = i0; it < i1; it++) {
            int64_t doc = B->items[3 * it], q0 = B->items[3 * it + 1], nq = B->items[3 * it + 2];
            int64_t a = A->cu ? A->cu[doc] : 0;
            const float *cache = A->caches ? A->caches[doc] : A->lat + a * R;
            int64_t p0 = A->caches ? A->pos[doc] : 0;
            int64_t t = a + q0;       /* packed index of the first query */
            if (c->sparse_topk > 0) { /* summaries kept: unselected chunks are skipped */
                const float *mn =
                    A->caches ? (A->means ? A->means[doc] : NULL) : B->fmeans + B->moff[doc];
                if (mn) {
                    arl_mla_sparse_attn(B->ohat + t * Hm * rkv, NULL, 0, B->qhat + t * Hm * rkv,
                                        B->q_pe + t * Hm * r, cache, mn, p0 + q0, nq, Hm, rkv, r,
                                        A->scale, c->sparse_chunk, c->sparse_topk, ws);
                    continue;
                }
            }
            /* dense, or sparse with the summaries recomputed from the cache (O(rows)) */
            arl_mla_absorbed_attn(B->ohat + t * Hm * rkv, NULL, 0, B->qhat + t * Hm * rkv,
                                  B->q_pe + t * Hm * r, cache, p0 + q0, nq, Hm, rkv, r, A->scale,
                                  c->sparse_chunk, c->sparse_topk, ws);
        }
    }
}

void arl_mla_layer_fwd(float *y, float *latent, const float *x, const arl_mla_params *p,
                       const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                       float *const *caches, const int64_t *pos, int32_t lanes, float *ws) {
    arl_mla_layer_fwd_means(y, latent, x, p, c, cu, N, T, caches, pos, NULL, NULL, lanes, ws);
}

void arl_mla_layer_fwd_means(float *y, float *latent, const float *x, const arl_mla_params *p,
                             const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                             float *const *caches, const int64_t *pos, float *const *means,
                             int64_t *const *means_rows, int32_t lanes, float *ws) {
    ARL_ASSERT(y && x && p && c && ws && N >= 1 && T >= 0 && lanes >= 1 && y != x);
    ARL_ASSERT(!means || (caches && means_rows));
    if (T == 0) return;
    mla_bufs B;
    mla_layout(&B, ws, c, T, N, lanes);
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r;
    const float scale = 1.0f / sqrtf((float)(n + r));
    float *lat = latent ? latent : B.lat;

    /* 4.1 queries: c_q = RMSNorm(W_qa x) (eps 1e-6), [q_nope; q_pe] = W_qb c_q per head */
    if (p->q_a) {
        arl_k_linear_fwd(B.cq, x, p->q_a, T, d, c->rq);
        arl_k_rmsnorm_fwd(B.cq, NULL, B.cq, p->q_a_norm, T, c->rq, 1e-6f);
        arl_k_linear_fwd(B.qf, B.cq, p->q_b, T, c->rq, Hm * (n + r));
    } else {
        arl_k_linear_fwd(B.qf, x, p->q_proj, T, d, Hm * (n + r));
    }
    split_heads(B.q_nope, B.q_pe, B.qf, T, Hm, n, r);

    /* 4.1/4.2 latent rows [c; k_pe]: c = RMSNorm(first rkv of W_kva x) (eps 1e-6), k_pe the
     * last r, shared by the heads and never rotated (NoPE) */
    arl_k_linear_fwd(B.ckv, x, p->kv_a, T, d, R);
    for (int64_t t = 0; t < T; t++) {
        memcpy(B.c + t * rkv, B.ckv + t * R, sizeof(float) * rkv);
        memcpy(B.k_pe + t * r, B.ckv + t * R + rkv, sizeof(float) * r);
    }
    arl_k_rmsnorm_fwd(B.c, NULL, B.c, p->kv_a_norm, T, rkv, 1e-6f);
    for (int64_t t = 0; t < T; t++) {
        memcpy(lat + t * R, B.c + t * rkv, sizeof(float) * rkv);
        memcpy(lat + t * R + rkv, B.k_pe + t * r, sizeof(float) * r);
    }

    int fresh = 1;
    if (caches)
        for (int32_t i = 0; i < N; i++)
            fresh &= pos[i] == 0;
    if (caches) /* append the new rows to every sequence's cache */
        for (int32_t i = 0; i < N; i++) {
            int64_t a = arl_doc_lo(cu, i), e = arl_doc_hi(cu, i, T);
            ARL_ASSERT(pos[i] + (e - a) <= c->max_rows);
            memcpy(caches[i] + pos[i] * R, lat + a * R, sizeof(float) * (size_t)((e - a) * R));
        }
    if (c->sparse_topk > 0 && means) /* bring the kept summaries up to the new rows */
        for (int32_t i = 0; i < N; i++) {
            int64_t end = pos[i] + (cu ? cu[i + 1] - cu[i] : T), from = *means_rows[i];
            if (from > pos[i]) from = 0; /* the sequence restarted below them: redo */
            arl_mla_chunk_means_update(means[i], caches[i], from, end, R, c->sparse_chunk);
            *means_rows[i] = end;
        }
    if (c->sparse_topk > 0 && !caches) { /* fresh documents: their summaries, once per call */
        B.moff[0] = 0;
        for (int32_t i = 0; i < N; i++) {
            int64_t a = cu ? cu[i] : 0, len = cu ? cu[i + 1] - cu[i] : T;
            B.moff[i + 1] = B.moff[i] + (len / c->sparse_chunk + 1) * R;
            arl_mla_chunk_means_update(B.fmeans + B.moff[i], lat + a * R, 0, len, R,
                                       c->sparse_chunk);
        }
    }

    if (fresh && c->sparse_topk == 0) {
        /* 4.1 expanded form: [k_nope; v] = W_kvb c per head, causal softmax per document */
        arl_k_linear_fwd(B.kv, B.c, p->kv_b, T, rkv, Hm * (n + vm));
        split_heads(B.k_nope, B.v, B.kv, T, Hm, n, vm);
        arl_mla_attn_fwd(B.o, NULL, B.q_nope, B.q_pe, B.k_nope, B.k_pe, B.v, cu, N, T, Hm, n, r, vm,
                         scale, B.attn);
    } else {
        /* 4.2 absorbed form over the cache: q_hat = W_UK^T q_nope, o = W_UV o_hat */
        arl_mla_absorb_q(B.qhat, B.q_nope, p->kv_b, T, Hm, n, vm, rkv);
        int64_t n_items = 0;
        for (int32_t i = 0; i < N; i++) {
            int64_t len = (cu ? cu[i + 1] - cu[i] : T);
            for (int64_t q0 = 0; q0 < len; q0 += MLA_QBLOCK) {
                B.items[3 * n_items] = i;
                B.items[3 * n_items + 1] = q0;
                B.items[3 * n_items + 2] = len - q0 < MLA_QBLOCK ? len - q0 : MLA_QBLOCK;
                n_items++;
            }
        }
        ARL_ASSERT(n_items <= max_items(T, N));
        /* lanes worth waking: the work is ~ query rows x cache rows x (2 rkv + r) per head */
        int64_t work = 0;
        for (int32_t i = 0; i < N; i++) {
            int64_t len = cu ? cu[i + 1] - cu[i] : T, rows = (caches ? pos[i] : 0) + len;
            if (c->sparse_topk > 0 && (caches ? means != NULL : 1)) {
                int64_t sp = (c->sparse_topk + 1) * c->sparse_chunk;
                rows = (rows < sp ? rows : sp) + rows / c->sparse_chunk;
            }
            work += len * rows * Hm * (2 * rkv + r);
        }
        int64_t want = (work + ARL_K_WORK_GRAIN - 1) / ARL_K_WORK_GRAIN;
        if (want > n_items) want = n_items;
        int32_t use = (int64_t)lanes < want ? lanes : (int32_t)(want > 0 ? want : 1);
        absorbed_ctx A = {&B, c, cu, caches, pos, means, lat, n_items, use, scale};
        arl_k_parallel_for(use, 1, absorbed_lane, &A);
        arl_mla_expand_o(B.o, B.ohat, p->kv_b, T, Hm, n, vm, rkv);
    }

    /* 4.1 output: y = W_o (sigmoid(W_g x) * o), the gate per head and channel */
    float *u = B.o;
    if (p->g_proj) {
        arl_k_linear_fwd(B.gate, x, p->g_proj, T, d, Hm * vm);
        arl_k_sigmoid_fwd(B.gate, B.gate, T * Hm * vm);
        arl_k_mul(B.gate, B.gate, B.o, T * Hm * vm);
        u = B.gate;
    }
    arl_k_linear_fwd(y, u, p->o_proj, T, Hm * vm, d);
}
