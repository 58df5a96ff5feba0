/* policy/mla_layer_backward.c: training forward and backward of one gated NoPE MLA layer, fp32
 * (see policy/mla_layer_backward.h).  The forward reads as policy/mla_layer.c; the backward
 * runs it in reverse: output (4.1), attention (4.3 expanded, or the absorbed form below),
 * up-projection, RMSNorms (3.9), projections.
 *
 * Absorbed attention (4.2) of one head h over a document's rows [c_s; k_pe,s], s = 0..m-1:
 *   Z = scale (qhat C^T + q_pe Kpe^T) (causal: query i sees s <= pos0 + i),  A = softmax(Z),
 *   ohat = A C,  o = W_UV ohat,  qhat = W_UK^T q_nope.
 * Backward: dohat = W_UV^T do; dP = dohat C^T; dZ = A (dP - rowsum(dohat * ohat));
 *   dqhat = scale dZ C; dq_pe = scale dZ Kpe; dC += A^T dohat + scale dZ^T qhat;
 *   dKpe += scale dZ^T q_pe; dW_UV += do^T ohat; dW_UK += q_nope^T dqhat; dq_nope = dqhat W_UK^T.
 * The forward runs heads in parallel; the backward runs documents, heads and query blocks in
 * a fixed order (row gradients are shared by every head), parallel inside the GEMMs.
 */
#include "policy/mla_layer_backward.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/docs.h"
#include "policy/mla.h"

#define QBLK 64 /* queries per score block of the absorbed core */
/* (query, head) pairs per call of the block-sparse cores: the pairs of a call that selected the
 * same chunk share one read (and one packing) of its rows, so the cost per pair stays flat as
 * the chunk count J grows only while about SPAIRS k_c / J pairs share each chunk (measured:
 * 8192 pairs keep a 256K context as fast per token as 64K at n_c 1024, k_c 4; 2048 pairs were
 * 1.8x slower there).  The work buffer holds ~(k_c + 1) (rkv + r) + 2 n_c + J floats per pair. */
#define SPAIRS 8192

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

static int64_t save_layout(arl_mla_layer_save *s, float *base, const arl_mla_layer_cfg *c,
                           int64_t T) {
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv, R = rkv + r;
    const int64_t rq = c->rq > 0 ? c->rq : 1;
    ws_bump w = {base, 0};
    s->cq_pre = take(&w, T * rq);
    s->rstd_q = take(&w, T);
    s->cq = take(&w, T * rq);
    s->q_nope = take(&w, T * Hm * n);
    s->q_pe = take(&w, T * Hm * r);
    s->c_pre = take(&w, T * rkv);
    s->rstd_c = take(&w, T);
    s->c = take(&w, T * rkv);
    s->lat = take(&w, T * R);
    s->k_pe = take(&w, T * r);
    s->k_nope = take(&w, T * Hm * n);
    s->v = take(&w, T * Hm * vm);
    s->qhat = take(&w, T * Hm * rkv);
    s->ohat = take(&w, T * Hm * rkv);
    s->lse = take(&w, T * Hm);
    s->o = take(&w, T * Hm * vm);
    s->gam = take(&w, T * Hm * vm);
    s->u = take(&w, T * Hm * vm);
    s->sel = (int32_t *)take(&w, c->sparse_topk > 0 ? T * Hm * c->sparse_topk : 0);
    s->absorbed = 0;
    return w.used;
}

int64_t arl_mla_layer_save_floats(const arl_mla_layer_cfg *c, int64_t T) {
    arl_mla_layer_save s;
    return save_layout(&s, NULL, c, T);
}

void arl_mla_layer_save_bind(arl_mla_layer_save *s, const arl_mla_layer_cfg *c, int64_t T,
                             float *base) {
    save_layout(s, base, c, T);
}

typedef struct mla_ws {
    float *qf;    /* (T, Hm*(n+r)) */
    float *ckv;   /* (T, R) */
    float *kv;    /* (T, Hm*(n+vm)) */
    float *attn;  /* expanded core work buffer */
    float *score; /* absorbed: forward (Hm, QBLK, max_rows); backward P and dP + D */
    float *du, *d_o, *dgam, *tmp;
    float *dq_nope, *dq_pe, *dk_nope, *dv, *dkv, *dk_pe, *dc;
    float *dqhat, *dohat, *dlat, *dc_pre, *dckv, *dqf, *dcq, *dcq_pre;
    float *sparse; /* block-sparse: arl_mla_sparse_doc_ws_floats (summaries, the cores' buffer) */
    const float **rows; /* (N) each document's latent rows (absorbed form) */
    int64_t *p0;        /* (N) rows before each document's first query */
} mla_ws;

static int64_t ws_layout(mla_ws *B, float *base, const arl_mla_layer_cfg *c, int64_t T, int32_t N) {
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv, R = rkv + r;
    const int64_t rq = c->rq > 0 ? c->rq : 1;
    ws_bump w = {base, 0};
    B->qf = take(&w, T * Hm * (n + r));
    B->ckv = take(&w, T * R);
    B->kv = take(&w, T * Hm * (n + vm));
    if (c->sparse_topk > 0) { /* always the absorbed form, through the sparse cores */
        const int64_t S = c->max_rows > T ? c->max_rows : T;
        B->attn = B->score = NULL;
        B->sparse = take(&w, arl_mla_sparse_doc_ws_floats(T > 0 ? T : 1, S, Hm, rkv, r,
                                                          c->sparse_chunk, c->sparse_topk));
    } else {
        B->attn = take(&w, arl_mla_attn_ws_floats(T, Hm, r));
        int64_t fwd = Hm * QBLK * c->max_rows, bwd = 2 * QBLK * c->max_rows + QBLK;
        B->score = take(&w, fwd > bwd ? fwd : bwd);
        B->sparse = NULL;
    }
    B->du = take(&w, T * Hm * vm);
    B->d_o = take(&w, T * Hm * vm);
    B->dgam = take(&w, T * Hm * vm);
    B->tmp = take(&w, T * Hm * vm);
    B->dq_nope = take(&w, T * Hm * n);
    B->dq_pe = take(&w, T * Hm * r);
    B->dk_nope = take(&w, T * Hm * n);
    B->dv = take(&w, T * Hm * vm);
    B->dkv = take(&w, T * Hm * (n + vm));
    B->dk_pe = take(&w, T * r);
    B->dc = take(&w, T * rkv);
    B->dqhat = take(&w, T * Hm * rkv);
    B->dohat = take(&w, T * Hm * rkv);
    B->dlat = take(&w, T * R);
    B->dc_pre = take(&w, T * rkv);
    B->dckv = take(&w, T * R);
    B->dqf = take(&w, T * Hm * (n + r));
    B->dcq = take(&w, T * rq);
    B->dcq_pre = take(&w, T * rq);
    B->rows = (const float **)take(&w, 2 * (int64_t)N); /* pointers: 2 floats each */
    B->p0 = (int64_t *)take(&w, 2 * (int64_t)N);
    return w.used;
}

int64_t arl_mla_layer_train_ws_floats(const arl_mla_layer_cfg *c, int64_t T, int32_t N) {
    mla_ws B;
    return ws_layout(&B, NULL, c, T, N);
}

/* Per token, split rows of width a + b (per head) into (Hm, a) and (Hm, b) parts. */
static void split_heads(float *A, float *Bp, const float *src, int64_t T, int64_t Hm, int64_t a,
                        int64_t b) {
    for (int64_t t = 0; t < T * Hm; t++) {
        memcpy(A + t * a, src + t * (a + b), sizeof(float) * a);
        memcpy(Bp + t * b, src + t * (a + b) + a, sizeof(float) * b);
    }
}

/* The inverse: dst (T, Hm, a + b) = [A; B] per head. */
static void merge_heads(float *dst, const float *A, const float *Bp, int64_t T, int64_t Hm,
                        int64_t a, int64_t b) {
    for (int64_t t = 0; t < T * Hm; t++) {
        memcpy(dst + t * (a + b), A + t * a, sizeof(float) * a);
        memcpy(dst + t * (a + b) + a, Bp + t * b, sizeof(float) * b);
    }
}

/* ---- the absorbed core ---- */

/* ---- the absorbed core, one document per call (policy/mla_layer_backward.h) ---- */

typedef struct abs_args {
    float *ohat, *lse;
    const float *qhat, *q_pe, *rows;
    int64_t p0, Tq, Hm, rkv, r;
    float scale;
    float *ws;
} abs_args;

/* S (nq, m) = scale (qhat C^T + q_pe Kpe^T) for head h, queries [t0, t0 + nq), rows [0, m). */
static void abs_scores(const abs_args *A, int64_t h, int64_t t0, int64_t nq, int64_t m, float *S) {
    const int64_t Hm = A->Hm, rkv = A->rkv, r = A->r, R = rkv + r;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, rkv, A->scale, A->qhat + (t0 * Hm + h) * rkv,
               Hm * rkv, A->rows, R, 0.0f, S, m);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, r, A->scale, A->q_pe + (t0 * Hm + h) * r, Hm * r,
               A->rows + rkv, R, 1.0f, S, m);
}

static void abs_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const abs_args *A = vctx;
    const int64_t Hm = A->Hm, rkv = A->rkv, R = rkv + A->r, p0 = A->p0, M = p0 + A->Tq;
    for (int64_t h = h0; h < h1; h++) {
        float *S = A->ws + h * QBLK * M;
        for (int64_t q0 = 0; q0 < A->Tq; q0 += QBLK) {
            int64_t nq = A->Tq - q0 < QBLK ? A->Tq - q0 : QBLK, m = p0 + q0 + nq;
            int64_t t0 = q0;
            abs_scores(A, h, t0, nq, m, S);
            for (int64_t i = 0; i < nq; i++) {
                float *row = S + i * m;
                int64_t lim = p0 + q0 + i; /* rows 0..lim */
                float mx = row[0];
                for (int64_t j = 1; j <= lim; j++)
                    mx = row[j] > mx ? row[j] : mx;
                float sum = 0.0f;
                for (int64_t j = 0; j <= lim; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                float inv = 1.0f / sum;
                for (int64_t j = 0; j <= lim; j++)
                    row[j] *= inv;
                for (int64_t j = lim + 1; j < m; j++)
                    row[j] = 0.0f;
                A->lse[(t0 + i) * Hm + h] = mx + logf(sum);
            }
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, rkv, m, 1.0f, S, m, A->rows, R, 0.0f,
                       A->ohat + (t0 * Hm + h) * rkv, Hm * rkv);
        }
    }
}

int64_t arl_mla_absorbed_train_ws_floats(int64_t S, int64_t Hm) {
    int64_t fwd = Hm * QBLK * S, bwd = 2 * QBLK * S + QBLK;
    return fwd > bwd ? fwd : bwd;
}

void arl_mla_absorbed_fwd_save(float *ohat, float *lse, const float *qhat, const float *q_pe,
                               const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                               int64_t r, float scale, float *ws) {
    if (Tq == 0) return;
    abs_args A = {ohat, lse, qhat, q_pe, rows, p0, Tq, Hm, rkv, r, scale, ws};
    arl_k_parallel_for(Hm, 1, abs_fwd_heads, &A);
}

/* Rows [i0, i1) of a query block of the absorbed backward, each on its own (any split, the same
 * bits).  Pass 0: P = exp(S - lse) on the causal rows (0 beyond), D = dohat . ohat (rowsum of
 * dA * A); pass 1, after dP = dohat C^T: dP = P (dP - D). */
typedef struct abs_bwd_rows_args {
    float *P, *dP, *D;
    const float *dOb, *Ob, *lse; /* the block's first query: lse[i * Hm] is query i's */
    int64_t lim0, m, Hm, rkv;    /* lim0: the last row query 0 sees */
    int pass;
} abs_bwd_rows_args;

/* Work of one exp in multiply-adds (kernels/threadpool.h's unit): tens of cycles, against a
 * GEMM's 16 multiply-adds a cycle. */
#define ABS_EXP_WORK 64

static void abs_bwd_rows(void *vctx, int64_t i0, int64_t i1) {
    const abs_bwd_rows_args *X = vctx;
    const int64_t m = X->m, ld = X->Hm * X->rkv;
    for (int64_t i = i0; i < i1; i++) {
        float *P = X->P + i * m, *dP = X->dP + i * m;
        if (X->pass == 1) {
            for (int64_t j = 0; j < m; j++)
                dP[j] = P[j] * (dP[j] - X->D[i]);
            continue;
        }
        const int64_t lim = X->lim0 + i;
        const float l = X->lse[i * X->Hm];
        for (int64_t j = 0; j < m; j++)
            P[j] = j <= lim ? expf(P[j] - l) : 0.0f;
        float acc = 0.0f;
        for (int64_t j = 0; j < X->rkv; j++)
            acc += X->dOb[i * ld + j] * X->Ob[i * ld + j];
        X->D[i] = acc;
    }
}

void arl_mla_absorbed_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                          const float *dohat, const float *ohat, const float *lse,
                          const float *qhat, const float *q_pe, const float *rows, int64_t p0,
                          int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, float *ws) {
    const abs_args A = {NULL, NULL, qhat, q_pe, rows, p0, Tq, Hm, rkv, r, scale, ws};
    const int64_t R = rkv + r, M = p0 + Tq;
    float *P = ws, *dP = P + QBLK * M, *D = dP + QBLK * M;
    for (int64_t h = 0; h < Hm; h++)
        for (int64_t q0 = 0; q0 < Tq; q0 += QBLK) {
            int64_t nq = Tq - q0 < QBLK ? Tq - q0 : QBLK, m = p0 + q0 + nq;
            int64_t t0 = q0;
            const float *dOb = dohat + (t0 * Hm + h) * rkv, *Ob = ohat + (t0 * Hm + h) * rkv;
            const float *Qb = qhat + (t0 * Hm + h) * rkv, *Qp = q_pe + (t0 * Hm + h) * r;
            abs_scores(&A, h, t0, nq, m, P);
            abs_bwd_rows_args R2 = {P, dP, D, dOb, Ob, lse + t0 * Hm + h, p0 + q0, m, Hm, rkv, 0};
            const int64_t grain = arl_k_work_grain(m * ABS_EXP_WORK + rkv);
            arl_k_parallel_for(nq, grain, abs_bwd_rows, &R2);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, rkv, 1.0f, dOb, Hm * rkv, rows, R, 0.0f,
                       dP, m);
            R2.pass = 1;
            arl_k_parallel_for(nq, grain, abs_bwd_rows, &R2);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, rkv, m, scale, dP, m, rows, R, 1.0f,
                       dqhat + (t0 * Hm + h) * rkv, Hm * rkv);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, r, m, scale, dP, m, rows + rkv, R, 1.0f,
                       dq_pe + (t0 * Hm + h) * r, Hm * r);
            for (int part = 0; part < 2; part++) { /* own rows -> dnew, earlier -> dprefix */
                int64_t s0 = part == 0 ? p0 : 0, s1 = part == 0 ? m : p0;
                float *dst = part == 0 ? dnew : dprefix;
                if (s1 <= s0 || !dst) continue;
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, s1 - s0, rkv, nq, 1.0f, P + s0, m, dOb,
                           Hm * rkv, 1.0f, dst, R);
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, s1 - s0, rkv, nq, scale, dP + s0, m, Qb,
                           Hm * rkv, 1.0f, dst, R);
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, s1 - s0, r, nq, scale, dP + s0, m, Qp,
                           Hm * r, 1.0f, dst + rkv, R);
            }
        }
}

/* ---- the block-sparse absorbed core (4.5): policy/mla.h's sparse cores per document ----
 * Forward: the chunk summaries of the document's rows (all of them, prefix included, in row
 * order: the same fp32 sums as the kept summaries of the decode path), then blocks of
 * SPAIRS / Hm queries through arl_mla_sparse_attn_save, which keeps each pair's lse and
 * selected chunks (sv->sel).  Backward: the same blocks through arl_mla_sparse_attn_bwd with
 * that selection.  Documents and blocks run in order, parallel inside the GEMMs, so results do
 * not depend on the thread count (AVX2/FMA GEMM; kernels/gemm.h). */

static int64_t sparse_block(int64_t Hm) {
    return SPAIRS / Hm > 0 ? SPAIRS / Hm : 1;
}

int64_t arl_mla_sparse_doc_ws_floats(int64_t Tq_max, int64_t S, int64_t Hm, int64_t rkv, int64_t r,
                                     int64_t n_c, int64_t k_c) {
    ARL_ASSERT(Tq_max >= 1 && S >= 1 && n_c >= 1 && k_c >= 1);
    const int64_t sq = sparse_block(Hm) < Tq_max ? sparse_block(Hm) : Tq_max;
    const int64_t f = arl_mla_sparse_ws_floats(sq, Hm, S, rkv, r, n_c, k_c);
    const int64_t g = arl_mla_sparse_bwd_ws_floats(sq, Hm, S, rkv, r, n_c, k_c);
    const int64_t means = ((S / n_c + 1) * (rkv + r) + 15) & ~(int64_t)15;
    return means + (f > g ? f : g);
}

void arl_mla_sparse_doc_fwd_save(float *ohat, float *lse, int32_t *list, const float *qhat,
                                 const float *q_pe, const float *rows, int64_t p0, int64_t Tq,
                                 int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                 int64_t k_c, float *ws) {
    if (Tq == 0) return;
    const int64_t R = rkv + r, sq = sparse_block(Hm);
    float *means = ws, *core = ws + (((p0 + Tq) / n_c + 1) * R + 15) / 16 * 16;
    arl_mla_chunk_means_update(means, rows, 0, p0 + Tq, R, n_c);
    for (int64_t q0 = 0; q0 < Tq; q0 += sq) {
        const int64_t nq = Tq - q0 < sq ? Tq - q0 : sq;
        arl_mla_sparse_attn_save(ohat + q0 * Hm * rkv, NULL, 0, lse + q0 * Hm, list + q0 * Hm * k_c,
                                 qhat + q0 * Hm * rkv, q_pe + q0 * Hm * r, rows, means, p0 + q0, nq,
                                 Hm, rkv, r, scale, n_c, k_c, core);
    }
}

void arl_mla_sparse_doc_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                            const float *dohat, const float *ohat, const float *lse,
                            const int32_t *list, const float *qhat, const float *q_pe,
                            const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                            int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws) {
    const int64_t sq = sparse_block(Hm);
    float *dpre = dprefix && p0 > 0 ? dprefix : NULL;
    float *core = ws + (((p0 + Tq) / n_c + 1) * (rkv + r) + 15) / 16 * 16;
    for (int64_t q0 = 0; q0 < Tq; q0 += sq) {
        const int64_t nq = Tq - q0 < sq ? Tq - q0 : sq;
        arl_mla_sparse_attn_bwd(dqhat + q0 * Hm * rkv, dq_pe + q0 * Hm * r, dpre, dnew, p0,
                                dohat + q0 * Hm * rkv, ohat + q0 * Hm * rkv, lse + q0 * Hm,
                                list + q0 * Hm * k_c, qhat + q0 * Hm * rkv, q_pe + q0 * Hm * r,
                                rows, p0 + q0, nq, Hm, rkv, r, scale, n_c, k_c, core);
    }
}

static void sparse_fwd(mla_ws *B, arl_mla_layer_save *sv, const arl_mla_layer_cfg *c,
                       const int32_t *cu, int32_t N, int64_t T, float scale) {
    const int64_t Hm = c->Hm, rkv = c->rkv, r = c->r, k_c = c->sparse_topk;
    for (int32_t di = 0; di < N; di++) {
        const int64_t a = arl_doc_lo(cu, di), len = arl_doc_hi(cu, di, T) - a;
        arl_mla_sparse_doc_fwd_save(sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                    sv->sel + a * Hm * k_c, sv->qhat + a * Hm * rkv,
                                    sv->q_pe + a * Hm * r, B->rows[di], B->p0[di], len, Hm, rkv, r,
                                    scale, c->sparse_chunk, k_c, B->sparse);
    }
}

static void sparse_bwd(mla_ws *B, const arl_mla_layer_save *sv, const arl_mla_layer_cfg *c,
                       const int32_t *cu, int32_t N, int64_t T, float scale,
                       float *const *dprefix) {
    const int64_t Hm = c->Hm, rkv = c->rkv, r = c->r, R = rkv + r, k_c = c->sparse_topk;
    for (int32_t di = 0; di < N; di++) {
        const int64_t a = arl_doc_lo(cu, di), len = arl_doc_hi(cu, di, T) - a;
        arl_mla_sparse_doc_bwd(B->dqhat + a * Hm * rkv, B->dq_pe + a * Hm * r, B->dlat + a * R,
                               dprefix ? dprefix[di] : NULL, B->dohat + a * Hm * rkv,
                               sv->ohat + a * Hm * rkv, sv->lse + a * Hm, sv->sel + a * Hm * k_c,
                               sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r, B->rows[di],
                               B->p0[di], len, Hm, rkv, r, scale, c->sparse_chunk, k_c, B->sparse);
    }
}

/* The rows each document attends over, and its position: caches (after the append) or the
 * new rows of fresh documents. */
static void doc_rows(const float **rows, int64_t *p0, const arl_mla_layer_save *sv,
                     const int32_t *cu, int32_t N, int64_t R, float *const *caches,
                     const int64_t *pos) {
    for (int32_t i = 0; i < N; i++) {
        rows[i] = caches ? caches[i] : sv->lat + arl_doc_lo(cu, i) * R;
        p0[i] = caches ? pos[i] : 0;
    }
}

/* ---- forward ---- */

void arl_mla_layer_fwd_save(float *y, const float *x, const arl_mla_params *p,
                            const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                            float *const *caches, const int64_t *pos, int absorbed,
                            arl_mla_layer_save *sv, float *ws) {
    ARL_ASSERT(y && x && p && c && sv && ws && N >= 1 && T >= 0 && y != x);
    ARL_ASSERT(c->sparse_topk == 0 || c->sparse_chunk >= 1);
    if (T == 0) return;
    mla_ws B;
    ws_layout(&B, ws, c, T, N);
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r;
    const float scale = 1.0f / sqrtf((float)(n + r));

    /* 4.1 queries */
    if (p->q_a) {
        arl_k_linear_fwd(sv->cq_pre, x, p->q_a, T, d, c->rq);
        arl_k_rmsnorm_fwd(sv->cq, sv->rstd_q, sv->cq_pre, p->q_a_norm, T, c->rq, 1e-6f);
        arl_k_linear_fwd(B.qf, sv->cq, p->q_b, T, c->rq, Hm * (n + r));
    } else {
        arl_k_linear_fwd(B.qf, x, p->q_proj, T, d, Hm * (n + r));
    }
    split_heads(sv->q_nope, sv->q_pe, B.qf, T, Hm, n, r);

    /* latent rows [c; k_pe] */
    arl_k_linear_fwd(B.ckv, x, p->kv_a, T, d, R);
    for (int64_t t = 0; t < T; t++) {
        memcpy(sv->c_pre + t * rkv, B.ckv + t * R, sizeof(float) * rkv);
        memcpy(sv->k_pe + t * r, B.ckv + t * R + rkv, sizeof(float) * r);
    }
    arl_k_rmsnorm_fwd(sv->c, sv->rstd_c, sv->c_pre, p->kv_a_norm, T, rkv, 1e-6f);
    for (int64_t t = 0; t < T; t++) {
        memcpy(sv->lat + t * R, sv->c + t * rkv, sizeof(float) * rkv);
        memcpy(sv->lat + t * R + rkv, sv->k_pe + t * r, sizeof(float) * r);
    }

    int fresh = 1;
    if (caches)
        for (int32_t i = 0; i < N; i++) {
            int64_t a = arl_doc_lo(cu, i), e = arl_doc_hi(cu, i, T);
            ARL_ASSERT(pos[i] + (e - a) <= c->max_rows);
            memcpy(caches[i] + pos[i] * R, sv->lat + a * R, sizeof(float) * (size_t)((e - a) * R));
            fresh &= pos[i] == 0;
        }
    sv->absorbed = absorbed || !fresh || c->sparse_topk > 0;

    if (!sv->absorbed) {
        arl_k_linear_fwd(B.kv, sv->c, p->kv_b, T, rkv, Hm * (n + vm));
        split_heads(sv->k_nope, sv->v, B.kv, T, Hm, n, vm);
        arl_mla_attn_fwd(sv->o, sv->lse, sv->q_nope, sv->q_pe, sv->k_nope, sv->k_pe, sv->v, cu, N,
                         T, Hm, n, r, vm, scale, B.attn);
    } else {
        /* 4.2: qhat = W_UK^T q_nope, attention over the rows, o = W_UV ohat */
        arl_mla_absorb_q(sv->qhat, sv->q_nope, p->kv_b, T, Hm, n, vm, rkv);
        doc_rows(B.rows, B.p0, sv, cu, N, R, caches, pos);
        if (c->sparse_topk > 0) {
            sparse_fwd(&B, sv, c, cu, N, T, scale);
        } else {
            for (int32_t di = 0; di < N; di++) {
                const int64_t a = arl_doc_lo(cu, di);
                arl_mla_absorbed_fwd_save(sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                          sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r,
                                          B.rows[di], B.p0[di], arl_doc_hi(cu, di, T) - a, Hm, rkv,
                                          r, scale, B.score);
            }
        }
        arl_mla_expand_o(sv->o, sv->ohat, p->kv_b, T, Hm, n, vm, rkv);
    }

    /* 4.1 output gate and projection */
    const float *u = sv->o;
    if (p->g_proj) {
        arl_k_linear_fwd(sv->gam, x, p->g_proj, T, d, Hm * vm);
        arl_k_sigmoid_fwd(sv->u, sv->gam, T * Hm * vm);
        arl_k_mul(sv->u, sv->u, sv->o, T * Hm * vm);
        u = sv->u;
    }
    arl_k_linear_fwd(y, u, p->o_proj, T, Hm * vm, d);
}

/* ---- backward ---- */

void arl_mla_layer_bwd(float *dx, const arl_mla_params *gp, const float *dy, const float *x,
                       const arl_mla_params *p, const arl_mla_layer_cfg *c, const int32_t *cu,
                       int32_t N, int64_t T, float *const *caches, const int64_t *pos,
                       const arl_mla_layer_save *sv, const float *dlat_T, float *const *dprefix,
                       float *ws) {
    ARL_ASSERT(dx && gp && dy && x && p && c && sv && ws && N >= 1);
    if (T == 0) return;
    mla_ws B;
    ws_layout(&B, ws, c, T, N);
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r, Pv = Hm * vm;
    const float scale = 1.0f / sqrtf((float)(n + r));

    /* output: y = W_o u, u = sigmoid(gam) * o (4.3 output gate) */
    const float *u = p->g_proj ? sv->u : sv->o;
    arl_k_linear_bwd_w(gp->o_proj, dy, u, T, Pv, d);
    zero(B.du, T * Pv);
    arl_k_linear_bwd_x(B.du, dy, p->o_proj, T, Pv, d);
    const float *d_o = B.du;
    if (p->g_proj) {
        arl_k_sigmoid_fwd(B.tmp, sv->gam, T * Pv);
        arl_k_mul(B.d_o, B.du, B.tmp, T * Pv); /* do = du * sigmoid(gam) */
        arl_k_mul(B.tmp, B.du, sv->o, T * Pv); /* d(sigmoid) = du * o */
        zero(B.dgam, T * Pv);
        arl_k_sigmoid_bwd(B.dgam, B.tmp, sv->gam, T * Pv);
        arl_k_linear_bwd_w(gp->g_proj, B.dgam, x, T, d, Pv);
        arl_k_linear_bwd_x(dx, B.dgam, p->g_proj, T, d, Pv);
        d_o = B.d_o;
    }

    /* attention -> dq_nope, dq_pe, and the gradient of the new rows [c; k_pe] (dc, dk_pe) */
    zero(B.dq_nope, T * Hm * n);
    zero(B.dq_pe, T * Hm * r);
    zero(B.dc, T * rkv);
    zero(B.dk_pe, T * r);
    if (!sv->absorbed) {
        zero(B.dk_nope, T * Hm * n);
        zero(B.dv, T * Pv);
        arl_mla_attn_bwd(B.dq_nope, B.dq_pe, B.dk_nope, B.dk_pe, B.dv, d_o, sv->o, sv->lse,
                         sv->q_nope, sv->q_pe, sv->k_nope, sv->k_pe, sv->v, cu, N, T, Hm, n, r, vm,
                         scale, B.attn);
        /* [k_nope; v] = W_kvb c per head */
        merge_heads(B.dkv, B.dk_nope, B.dv, T, Hm, n, vm);
        arl_k_linear_bwd_w(gp->kv_b, B.dkv, sv->c, T, rkv, Hm * (n + vm));
        arl_k_linear_bwd_x(B.dc, B.dkv, p->kv_b, T, rkv, Hm * (n + vm));
    } else {
        /* o = W_UV^h ohat per head: dohat = do W_UV^h, dW_UV^h += do^T ohat */
        zero(B.dohat, T * Hm * rkv);
        for (int64_t h = 0; h < Hm; h++) {
            const float *Wuv = p->kv_b + (h * (n + vm) + n) * rkv;
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, rkv, vm, 1.0f, d_o + h * vm, Pv, Wuv, rkv,
                       0.0f, B.dohat + h * rkv, Hm * rkv);
            arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, vm, rkv, T, 1.0f, d_o + h * vm, Pv,
                       sv->ohat + h * rkv, Hm * rkv, 1.0f, gp->kv_b + (h * (n + vm) + n) * rkv,
                       rkv);
        }
        doc_rows(B.rows, B.p0, sv, cu, N, R, caches, pos);
        zero(B.dqhat, T * Hm * rkv);
        zero(B.dlat, T * R);
        if (c->sparse_topk > 0) {
            sparse_bwd(&B, sv, c, cu, N, T, scale, caches ? dprefix : NULL);
        } else {
            for (int32_t di = 0; di < N; di++) {
                const int64_t a = arl_doc_lo(cu, di);
                arl_mla_absorbed_bwd(B.dqhat + a * Hm * rkv, B.dq_pe + a * Hm * r, B.dlat + a * R,
                                     caches && dprefix ? dprefix[di] : NULL, B.dohat + a * Hm * rkv,
                                     sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                     sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r, B.rows[di],
                                     B.p0[di], arl_doc_hi(cu, di, T) - a, Hm, rkv, r, scale,
                                     B.score);
            }
        }
        for (int64_t t = 0; t < T; t++) {
            memcpy(B.dc + t * rkv, B.dlat + t * R, sizeof(float) * rkv);
            memcpy(B.dk_pe + t * r, B.dlat + t * R + rkv, sizeof(float) * r);
        }
        /* qhat = W_UK^h^T q_nope: dq_nope = dqhat W_UK^h^T, dW_UK^h += q_nope^T dqhat */
        for (int64_t h = 0; h < Hm; h++) {
            const float *Wuk = p->kv_b + h * (n + vm) * rkv;
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, n, rkv, 1.0f, B.dqhat + h * rkv, Hm * rkv,
                       Wuk, rkv, 1.0f, B.dq_nope + h * n, Hm * n);
            arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, n, rkv, T, 1.0f, sv->q_nope + h * n, Hm * n,
                       B.dqhat + h * rkv, Hm * rkv, 1.0f, gp->kv_b + h * (n + vm) * rkv, rkv);
        }
    }
    if (dlat_T)
        for (int64_t t = 0; t < T; t++) {
            arl_k_add(B.dc + t * rkv, B.dc + t * rkv, dlat_T + t * R, rkv);
            arl_k_add(B.dk_pe + t * r, B.dk_pe + t * r, dlat_T + t * R + rkv, r);
        }

    /* c = RMSNorm(c_pre) (eps 1e-6); [c_pre; k_pe] = W_kva x */
    zero(B.dc_pre, T * rkv);
    arl_k_rmsnorm_bwd(B.dc_pre, gp->kv_a_norm, B.dc, sv->c_pre, p->kv_a_norm, sv->rstd_c, T, rkv);
    for (int64_t t = 0; t < T; t++) {
        memcpy(B.dckv + t * R, B.dc_pre + t * rkv, sizeof(float) * rkv);
        memcpy(B.dckv + t * R + rkv, B.dk_pe + t * r, sizeof(float) * r);
    }
    arl_k_linear_bwd_w(gp->kv_a, B.dckv, x, T, d, R);
    arl_k_linear_bwd_x(dx, B.dckv, p->kv_a, T, d, R);

    /* queries */
    merge_heads(B.dqf, B.dq_nope, B.dq_pe, T, Hm, n, r);
    if (p->q_a) {
        arl_k_linear_bwd_w(gp->q_b, B.dqf, sv->cq, T, c->rq, Hm * (n + r));
        zero(B.dcq, T * c->rq);
        arl_k_linear_bwd_x(B.dcq, B.dqf, p->q_b, T, c->rq, Hm * (n + r));
        zero(B.dcq_pre, T * c->rq);
        arl_k_rmsnorm_bwd(B.dcq_pre, gp->q_a_norm, B.dcq, sv->cq_pre, p->q_a_norm, sv->rstd_q, T,
                          c->rq);
        arl_k_linear_bwd_w(gp->q_a, B.dcq_pre, x, T, d, c->rq);
        arl_k_linear_bwd_x(dx, B.dcq_pre, p->q_a, T, d, c->rq);
    } else {
        arl_k_linear_bwd_w(gp->q_proj, B.dqf, x, T, d, Hm * (n + r));
        arl_k_linear_bwd_x(dx, B.dqf, p->q_proj, T, d, Hm * (n + r));
    }
}
