/* policy/mla.c: MLA attention core on the CPU, fp32 (see policy/mla.h).
 *
 * The expanded form works on blocks of QB query rows of one head and one document: the score
 * block (QB x keys) comes from two GEMMs (nope and pe parts), is masked and normalised in
 * place, and multiplies V.  The backward recomputes the probabilities from lse.  The shared
 * k_pe gradient is summed per head in the work buffer and added over heads in head order, so
 * the result does not depend on the thread count.
 *
 * The block-sparse core works on blocks of queries inside one chunk: sigma for every (query,
 * head) pair as one product with the chunk summaries, each pair's top-k_c, then the own chunk's
 * rows as one product for all pairs (causal prefix per pair) and each selected chunk as one
 * product for the pairs that chose it, scores and weighted sum back to back (online softmax:
 * a pair's running maximum, sum and output are rescaled when a chunk raises the maximum).
 * Its backward (training) takes the forward's selection and lse and walks the same blocks: the
 * own chunk for all pairs in one set of products, then each selected chunk once for the pairs
 * that chose it, recomputing the probabilities from lse; row and query gradients are summed in
 * a fixed order (chunks in order, pairs in order inside a chunk).
 */
#include "policy/mla.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/gemm.h"
#include "kernels/threadpool.h"
#include "kernels/vmath.h"
#include "policy/docs.h"

#define QB 64 /* query rows per score block */

int64_t arl_mla_attn_ws_floats(int64_t T, int64_t Hm, int64_t r) {
    return Hm * (2 * QB * T + QB + T * r);
}

typedef struct attn_args {
    float *o, *lse, *ws;
    float *dq_nope, *dq_pe, *dk_nope, *dv;
    const float *q_nope, *q_pe, *k_nope, *k_pe, *v, *d_o, *o_in, *lse_in;
    const int32_t *cu;
    int32_t N;
    int64_t T, Hm, n, r, vm, ws_head;
    float scale;
} attn_args;

/* Score block S (nq, m) = scale (Qn Kn^T + Qp Kp^T) for queries [t0, t0+nq) and keys [a, a+m). */
static void score_block(const attn_args *A, int64_t h, int64_t a, int64_t t0, int64_t nq, int64_t m,
                        float *S) {
    int64_t Hm = A->Hm, n = A->n, r = A->r;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, n, A->scale, A->q_nope + (t0 * Hm + h) * n,
               Hm * n, A->k_nope + (a * Hm + h) * n, Hm * n, 0.0f, S, m);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, r, A->scale, A->q_pe + (t0 * Hm + h) * r, Hm * r,
               A->k_pe + a * r, r, 1.0f, S, m);
}

static void attn_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const attn_args *A = vctx;
    int64_t Hm = A->Hm, vm = A->vm;
    for (int64_t h = h0; h < h1; h++) {
        float *S = A->ws + h * A->ws_head;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = A->cu ? A->cu[di] : 0, b = A->cu ? A->cu[di + 1] : A->T;
            for (int64_t t0 = a; t0 < b; t0 += QB) {
                int64_t nq = b - t0 < QB ? b - t0 : QB, m = t0 + nq - a;
                score_block(A, h, a, t0, nq, m, S);
                for (int64_t i = 0; i < nq; i++) {
                    float *row = S + i * m;
                    int64_t lim = t0 + i - a; /* keys 0..lim of the document */
                    float mx = arl_k_vmax(row, lim + 1);
                    for (int64_t j = 0; j <= lim; j++)
                        row[j] -= mx;
                    arl_k_vexp(row, row, lim + 1);
                    float sum = arl_k_vsum(row, lim + 1);
                    arl_k_vscale(row, 1.0f / sum, lim + 1);
                    for (int64_t j = lim + 1; j < m; j++)
                        row[j] = 0.0f;
                    if (A->lse) A->lse[(t0 + i) * Hm + h] = mx + logf(sum);
                }
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, vm, m, 1.0f, S, m,
                           A->v + (a * Hm + h) * vm, Hm * vm, 0.0f, A->o + (t0 * Hm + h) * vm,
                           Hm * vm);
            }
        }
    }
}

void arl_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                      const float *k_nope, const float *k_pe, const float *v, const int32_t *cu,
                      int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm,
                      float scale, float *ws) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(ws);
    attn_args A = {.o = o,
                   .lse = lse,
                   .ws = ws,
                   .q_nope = q_nope,
                   .q_pe = q_pe,
                   .k_nope = k_nope,
                   .k_pe = k_pe,
                   .v = v,
                   .cu = cu,
                   .N = N,
                   .T = T,
                   .Hm = Hm,
                   .n = n,
                   .r = r,
                   .vm = vm,
                   .ws_head = 2 * QB * T + QB + T * r,
                   .scale = scale};
    arl_k_parallel_for(Hm, 1, attn_fwd_heads, &A);
}

static void attn_bwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const attn_args *A = vctx;
    int64_t Hm = A->Hm, n = A->n, r = A->r, vm = A->vm, T = A->T;
    for (int64_t h = h0; h < h1; h++) {
        float *P = A->ws + h * A->ws_head, *dP = P + QB * T, *D = dP + QB * T;
        float *dkpe = D + QB; /* (T, r): this head's share of dk_pe */
        memset(dkpe, 0, sizeof(float) * T * r);
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = A->cu ? A->cu[di] : 0, b = A->cu ? A->cu[di + 1] : T;
            for (int64_t t0 = a; t0 < b; t0 += QB) {
                int64_t nq = b - t0 < QB ? b - t0 : QB, m = t0 + nq - a;
                score_block(A, h, a, t0, nq, m, P);
                for (int64_t i = 0; i < nq; i++) {
                    int64_t t = t0 + i, lim = t - a;
                    float l = A->lse_in[t * Hm + h];
                    for (int64_t j = 0; j < m; j++)
                        P[i * m + j] = j <= lim ? expf(P[i * m + j] - l) : 0.0f;
                    float acc = 0.0f; /* rowsum(dA * A) = dO . O */
                    for (int64_t j = 0; j < vm; j++)
                        acc += A->d_o[(t * Hm + h) * vm + j] * A->o_in[(t * Hm + h) * vm + j];
                    D[i] = acc;
                }
                const float *dOb = A->d_o + (t0 * Hm + h) * vm;
                /* dV += A^T dO;  dA = dO V^T;  dZ = A (dA - D) */
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, m, vm, nq, 1.0f, P, m, dOb, Hm * vm, 1.0f,
                           A->dv + (a * Hm + h) * vm, Hm * vm);
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, nq, m, vm, 1.0f, dOb, Hm * vm,
                           A->v + (a * Hm + h) * vm, Hm * vm, 0.0f, dP, m);
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t j = 0; j < m; j++)
                        dP[i * m + j] = P[i * m + j] * (dP[i * m + j] - D[i]);
                /* dQ = scale dZ K;  dK = scale dZ^T Q  (nope and pe parts) */
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, n, m, A->scale, dP, m,
                           A->k_nope + (a * Hm + h) * n, Hm * n, 1.0f,
                           A->dq_nope + (t0 * Hm + h) * n, Hm * n);
                arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, nq, r, m, A->scale, dP, m, A->k_pe + a * r,
                           r, 1.0f, A->dq_pe + (t0 * Hm + h) * r, Hm * r);
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, m, n, nq, A->scale, dP, m,
                           A->q_nope + (t0 * Hm + h) * n, Hm * n, 1.0f,
                           A->dk_nope + (a * Hm + h) * n, Hm * n);
                arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, m, r, nq, A->scale, dP, m,
                           A->q_pe + (t0 * Hm + h) * r, Hm * r, 1.0f, dkpe + a * r, r);
            }
        }
    }
}

void arl_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                      const float *d_o, const float *o, const float *lse, const float *q_nope,
                      const float *q_pe, const float *k_nope, const float *k_pe, const float *v,
                      const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r,
                      int64_t vm, float scale, float *ws) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(ws);
    attn_args A = {.ws = ws,
                   .dq_nope = dq_nope,
                   .dq_pe = dq_pe,
                   .dk_nope = dk_nope,
                   .dv = dv,
                   .q_nope = q_nope,
                   .q_pe = q_pe,
                   .k_nope = k_nope,
                   .k_pe = k_pe,
                   .v = v,
                   .d_o = d_o,
                   .o_in = o,
                   .lse_in = lse,
                   .cu = cu,
                   .N = N,
                   .T = T,
                   .Hm = Hm,
                   .n = n,
                   .r = r,
                   .vm = vm,
                   .ws_head = 2 * QB * T + QB + T * r,
                   .scale = scale};
    arl_k_parallel_for(Hm, 1, attn_bwd_heads, &A);
    /* the shared k_pe gets the sum over heads of its per-head gradients (spec 4.3) */
    for (int64_t h = 0; h < Hm; h++) {
        const float *src = ws + h * A.ws_head + 2 * QB * T + QB;
        for (int64_t i = 0; i < T * r; i++)
            dk_pe[i] += src[i];
    }
}

/* ---------------------------------------------------------------------------------------
 * absorbed form
 * --------------------------------------------------------------------------------------- */

void arl_mla_absorb_q(float *qhat, const float *q_nope, const float *kv_b, int64_t T, int64_t Hm,
                      int64_t n, int64_t vm, int64_t rkv) {
    for (int64_t h = 0; h < Hm; h++) /* (T, n) x W_UK^h (n, rkv) */
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, rkv, n, 1.0f, q_nope + h * n, Hm * n,
                   kv_b + h * (n + vm) * rkv, rkv, 0.0f, qhat + h * rkv, Hm * rkv);
}

void arl_mla_expand_o(float *o, const float *ohat, const float *kv_b, int64_t T, int64_t Hm,
                      int64_t n, int64_t vm, int64_t rkv) {
    for (int64_t h = 0; h < Hm; h++) /* (T, rkv) x W_UV^h^T (rkv, vm) */
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, vm, rkv, 1.0f, ohat + h * rkv, Hm * rkv,
                   kv_b + (h * (n + vm) + n) * rkv, rkv, 0.0f, o + h * vm, Hm * vm);
}

/* One query of one head over the rows 0..pos, dense: the scores as one one-row GEMM with the
 * query row [qhat; q_pe] (w), softmax, then the weighted sum of c as a GEMM.  sc (pos + 1). */
static void dense_row(float *oh, float *lse, const float *qrow, const float *cache, int64_t pos,
                      int64_t rkv, int64_t r, float scale, float *sc) {
    const int64_t w = rkv + r, nr = pos + 1;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, 1, nr, w, scale, qrow, w, cache, w, 0.0f, sc, nr);
    float mx = arl_k_vmax(sc, nr);
    for (int64_t s = 0; s < nr; s++)
        sc[s] -= mx;
    arl_k_vexp(sc, sc, nr);
    float sum = arl_k_vsum(sc, nr), inv = 1.0f / sum;
    if (lse) *lse = mx + logf(sum);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 1, rkv, nr, inv, sc, nr, cache, w, 0.0f, oh, rkv);
}

int64_t arl_mla_absorbed_ws_floats(int64_t S, int64_t rkv, int64_t r, int64_t n_c) {
    const int64_t w = rkv + r, dense = S + w;
    if (n_c <= 0) return dense;
    const int64_t nch = S / n_c + 1; /* summaries, then one (query, head) pair of the sparse core */
    int64_t sparse = nch * w + arl_mla_sparse_ws_floats(1, 1, S, rkv, r, n_c, nch);
    return sparse > dense ? sparse : dense;
}

void arl_mla_absorbed_attn(float *ohat, uint8_t *sel, int64_t sel_stride, const float *qhat,
                           const float *q_pe, const float *cache, int64_t pos0, int64_t Tq,
                           int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                           int64_t k_c, float *ws) {
    ARL_ASSERT(pos0 >= 0 && Tq >= 0 && ws && k_c >= 0 && (k_c == 0 || n_c >= 1));
    const int64_t w = rkv + r, S = pos0 + Tq;
    if (k_c == 0) {
        float *sc = ws, *qrow = ws + S; /* scores (S), one query [qhat; q_pe] (w) */
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t h = 0; h < Hm; h++) {
                memcpy(qrow, qhat + (i * Hm + h) * rkv, sizeof(float) * (size_t)rkv);
                memcpy(qrow + rkv, q_pe + (i * Hm + h) * r, sizeof(float) * (size_t)r);
                dense_row(ohat + (i * Hm + h) * rkv, NULL, qrow, cache, pos0 + i, rkv, r, scale,
                          sc);
                if (sel) memset(sel + (i * Hm + h) * sel_stride, 0, (size_t)sel_stride);
            }
        return;
    }
    /* the summaries of every chunk from the cache, then each (query, head) pair on its own */
    const int64_t nch = S / n_c + 1;
    arl_mla_chunk_means_update(ws, cache, 0, S, w, n_c);
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t h = 0; h < Hm; h++) {
            int64_t p = i * Hm + h;
            arl_mla_sparse_attn(ohat + p * rkv, sel ? sel + p * sel_stride : NULL, sel_stride,
                                qhat + p * rkv, q_pe + p * r, cache, ws, pos0 + i, 1, 1, rkv, r,
                                scale, n_c, k_c, ws + nch * w);
        }
}

/* ---------------------------------------------------------------------------------------
 * block-sparse selection over kept summaries
 * --------------------------------------------------------------------------------------- */

void arl_mla_chunk_means_update(float *means, const float *cache, int64_t from, int64_t to,
                                int64_t R, int64_t n_c) {
    ARL_ASSERT(from >= 0 && from <= to && n_c >= 1);
    for (int64_t s = from; s < to; s++) {
        float *m = means + (s / n_c) * R;
        const float *row = cache + s * R;
        if (s % n_c == 0)
            for (int64_t e = 0; e < R; e++)
                m[e] = 0.0f;
        for (int64_t e = 0; e < R; e++)
            m[e] += row[e];
        if ((s + 1) % n_c == 0)
            for (int64_t e = 0; e < R; e++)
                m[e] /= (float)n_c;
    }
}

/* K = chunks a query selects besides its own. */
static int64_t sparse_k(int64_t S, int64_t n_c, int64_t k_c) {
    int64_t J = S / n_c + 1;
    return k_c < J ? k_c : J;
}

int64_t arl_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv, int64_t r,
                                 int64_t n_c, int64_t k_c) {
    ARL_ASSERT(n_c >= 1 && k_c >= 1);
    const int64_t K = sparse_k(S, n_c, k_c), np = Tq_max * Hm, J = S / n_c + 1;
    /* per pair: query row, own-chunk scores, K gathered query rows, one output row, max and
     * sum, K selected ids and K entries, sigma per chunk; one chunk's scores for up to np
     * pairs (at least K + 1 chunks with the own scores: the dense case's score row); the
     * chunks' entry offsets */
    const int64_t sc_rows = np > K + 1 ? np : K + 1;
    return np * ((rkv + r) * (K + 1) + n_c + rkv + 2 + 2 * K + J) + sc_rows * n_c + J + 2 + 16;
}

/* best (K): the K chunks j < J with the largest sigma_j (ties toward the lower j), returned in
 * increasing j.  Equal to picking the maximum K times with ties to the lowest index. */
static void select_topk(int32_t *best, const float *sig, int64_t J, int64_t K) {
    int64_t nb = 0;
    for (int64_t j = 0; j < J; j++) {
        int64_t at;
        if (nb < K)
            at = nb++;
        else if (sig[j] > sig[best[K - 1]])
            at = K - 1;
        else
            continue;
        while (at > 0 && sig[j] > sig[best[at - 1]]) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = (int32_t)j;
    }
    for (int64_t a = 1; a < K; a++) { /* increasing chunk index */
        int32_t v = best[a];
        int64_t b = a;
        while (b > 0 && best[b - 1] > v) {
            best[b] = best[b - 1];
            b--;
        }
        best[b] = v;
    }
}

/* Work buffer of one block of np (query, head) pairs with K selected chunks each. */
typedef struct sparse_ws {
    float *qw;     /* (np, w) query rows [qhat; q_pe] */
    float *own;    /* (np, n_c) scores of the own chunk's rows */
    float *sc;     /* (np, n_c) scores of one selected chunk for the entries that chose it */
    float *qg;     /* (np K, w) the query row of every entry */
    float *og;     /* (np, rkv) one chunk's weighted sums */
    float *mx;     /* (np) softmax maximum */
    float *sum;    /* (np) softmax sum */
    float *sig;    /* (np, J) sigma of the complete chunks */
    int32_t *list; /* (np, K) selected chunks of each pair, increasing */
    int32_t *ent;  /* (np K) pair of each entry; entries are grouped by chunk, chunks in order */
    int32_t *off;  /* (J + 1) first entry of each chunk */
} sparse_ws;

static void sparse_layout(sparse_ws *b, float *ws, int64_t np, int64_t K, int64_t J, int64_t w,
                          int64_t rkv, int64_t n_c) {
    b->qw = ws;
    b->own = b->qw + np * w;
    b->sc = b->own + np * n_c;
    b->qg = b->sc + (np > K + 1 ? np : K + 1) * n_c;
    b->og = b->qg + np * K * w;
    b->mx = b->og + np * rkv;
    b->sum = b->mx + np;
    b->sig = b->sum + np;
    b->list = (int32_t *)(b->sig + np * J);
    b->ent = b->list + np * K;
    b->off = b->ent + np * K;
}

void arl_mla_sparse_attn(float *ohat, uint8_t *sel, int64_t sel_stride, const float *qhat,
                         const float *q_pe, const float *cache, const float *means, int64_t pos0,
                         int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                         int64_t k_c, float *ws) {
    arl_mla_sparse_attn_save(ohat, sel, sel_stride, NULL, NULL, qhat, q_pe, cache, means, pos0, Tq,
                             Hm, rkv, r, scale, n_c, k_c, ws);
}

void arl_mla_sparse_attn_save(float *ohat, uint8_t *sel, int64_t sel_stride, float *lse,
                              int32_t *list, const float *qhat, const float *q_pe,
                              const float *cache, const float *means, int64_t pos0, int64_t Tq,
                              int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                              int64_t k_c, float *ws) {
    ARL_ASSERT(pos0 >= 0 && Tq >= 0 && ws && means && k_c >= 1 && n_c >= 1);
    const int64_t w = rkv + r, S = pos0 + Tq, K = sparse_k(S, n_c, k_c), Jmax = S / n_c + 1;
    sparse_ws b;
    sparse_layout(&b, ws, Tq * Hm, K, Jmax, w, rkv, n_c);
    for (int64_t i0 = 0; i0 < Tq;) {
        /* a block of queries in one chunk J: they share the rows J n_c .. of their own chunk */
        const int64_t J = (pos0 + i0) / n_c;
        int64_t i1 = (J + 1) * n_c - pos0;
        if (i1 > Tq) i1 = Tq;
        const int64_t np = (i1 - i0) * Hm, a = J * n_c, own = pos0 + i1 - a;
        float *oh = ohat + i0 * Hm * rkv;
        for (int64_t p = 0; p < np; p++) {
            memcpy(b.qw + p * w, qhat + (i0 * Hm + p) * rkv, sizeof(float) * (size_t)rkv);
            memcpy(b.qw + p * w + rkv, q_pe + (i0 * Hm + p) * r, sizeof(float) * (size_t)r);
        }
        if (J <= k_c) { /* every chunk up to the own one is selected: dense, bit for bit */
            for (int64_t p = 0; p < np; p++) { /* (K + 1) n_c >= pos + 1 floats at b.own */
                dense_row(oh + p * rkv, lse ? lse + i0 * Hm + p : NULL, b.qw + p * w, cache,
                          pos0 + i0 + p / Hm, rkv, r, scale, b.own);
                if (list) { /* chunks 0 .. J-1 (J <= k_c), then none */
                    int32_t *lrow = list + (i0 * Hm + p) * k_c;
                    for (int64_t k = 0; k < k_c; k++)
                        lrow[k] = k < J ? (int32_t)k : -1;
                }
                if (sel) {
                    uint8_t *srow = sel + (i0 * Hm + p) * sel_stride;
                    memset(srow, 0, (size_t)sel_stride);
                    memset(srow, 1, (size_t)(J + 1));
                }
            }
            i0 = i1;
            continue;
        }
        /* selection: sigma_j = [qhat; q_pe] . mean_j over the complete chunks j < J, for
         * all pairs in one product */
        memset(b.off, 0, sizeof(int32_t) * (size_t)(J + 1));
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, np, J, w, 1.0f, b.qw, w, means, w, 0.0f, b.sig, J);
        for (int64_t p = 0; p < np; p++) {
            int32_t *best = b.list + p * K;
            select_topk(best, b.sig + p * J, J, K);
            for (int64_t k = 0; k < K; k++)
                b.off[best[k] + 1]++;
            if (list) { /* K = k_c here (J > k_c) */
                int32_t *lrow = list + (i0 * Hm + p) * k_c;
                for (int64_t k = 0; k < k_c; k++)
                    lrow[k] = k < K ? best[k] : -1;
            }
            if (sel) {
                uint8_t *srow = sel + (i0 * Hm + p) * sel_stride;
                memset(srow, 0, (size_t)sel_stride);
                for (int64_t k = 0; k < K; k++)
                    srow[best[k]] = 1;
                srow[J] = 1;
            }
        }
        /* entries grouped by chunk (pairs in order inside a chunk): one product per chunk for
         * all the pairs that selected it, so its rows are read once per block */
        for (int64_t j = 0; j < J; j++)
            b.off[j + 1] += b.off[j];
        for (int64_t p = 0; p < np; p++)
            for (int64_t k = 0; k < K; k++) {
                int32_t e = b.off[b.list[p * K + k]]++;
                b.ent[e] = (int32_t)p;
                memcpy(b.qg + e * w, b.qw + p * w, sizeof(float) * (size_t)w);
            }
        for (int64_t j = J; j > 0; j--) /* off[j] is again the first entry of chunk j */
            b.off[j] = b.off[j - 1];
        b.off[0] = 0;

        /* the own chunk's rows a .. pos0+i1-1, for all pairs in one product (each pair uses
         * its causal prefix): the softmax starts from them */
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, np, own, w, scale, b.qw, w, cache + a * w, w, 0.0f,
                   b.own, n_c);
        for (int64_t p = 0; p < np; p++) {
            float *row = b.own + p * n_c;
            const int64_t nr = pos0 + i0 + p / Hm - a + 1;
            b.mx[p] = arl_k_vmax(row, nr);
            for (int64_t s = 0; s < nr; s++)
                row[s] -= b.mx[p];
            arl_k_vexp(row, row, nr);
            b.sum[p] = arl_k_vsum(row, nr);
            for (int64_t s = nr; s < own; s++)
                row[s] = 0.0f;
        }
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, np, rkv, own, 1.0f, b.own, n_c, cache + a * w, w,
                   0.0f, oh, rkv);
        /* then each selected chunk, once for all the entries that chose it, scores and
         * weighted sum back to back while its rows are in cache; the running maximum, sum and
         * output of a pair are rescaled when a chunk raises its maximum (online softmax) */
        for (int64_t j = 0; j < J; j++) {
            const int64_t e0 = b.off[j], m = b.off[j + 1] - e0;
            if (m == 0) continue;
            const float *rows = cache + j * n_c * w;
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, m, n_c, w, scale, b.qg + e0 * w, w, rows, w,
                       0.0f, b.sc, n_c);
            for (int64_t e = 0; e < m; e++) {
                const int64_t p = b.ent[e0 + e];
                float *row = b.sc + e * n_c, cm = arl_k_vmax(row, n_c);
                if (cm > b.mx[p]) {
                    const float f = expf(b.mx[p] - cm);
                    arl_k_vscale(oh + p * rkv, f, rkv);
                    b.sum[p] *= f;
                    b.mx[p] = cm;
                }
                for (int64_t s = 0; s < n_c; s++)
                    row[s] -= b.mx[p];
                arl_k_vexp(row, row, n_c);
                b.sum[p] += arl_k_vsum(row, n_c);
            }
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, m, rkv, n_c, 1.0f, b.sc, n_c, rows, w, 0.0f,
                       b.og, rkv);
            for (int64_t e = 0; e < m; e++)
                arl_k_vaxpy(oh + b.ent[e0 + e] * rkv, 1.0f, b.og + e * rkv, rkv);
        }
        for (int64_t p = 0; p < np; p++) {
            arl_k_vscale(oh + p * rkv, 1.0f / b.sum[p], rkv);
            if (lse) lse[i0 * Hm + p] = b.mx[p] + logf(b.sum[p]);
        }
        i0 = i1;
    }
}

/* ---------------------------------------------------------------------------------------
 * backward of the block-sparse core (training)
 * --------------------------------------------------------------------------------------- */

int64_t arl_mla_sparse_bwd_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv,
                                     int64_t r, int64_t n_c, int64_t k_c) {
    ARL_ASSERT(n_c >= 1 && k_c >= 1);
    const int64_t np = Tq_max * Hm, w = rkv + r, J = S / n_c + 1;
    /* qw, dqw, qg, dqg (np, w); dog (np, rkv); P, dP (np, n_c); D, lse of the entries (np);
     * D of the pairs (np); entries (np k_c) and chunk offsets (J + 1) as int32 */
    return np * (4 * w + rkv + 2 * n_c + 3 + k_c) + J + 1 + 16 * 12;
}

/* dst rows [s0, s0 + ns) of the sequence: rows below `split` go to dpre (skipped when NULL),
 * the others to dnew (row split first).  dst += P^T dO (the c part) + scale dZ^T Q, with P,
 * dZ (m, ld) for the m entries, dO (m, rkv) at ldo, Q (m, w) at ldq. */
static void rows_grad(float *dpre, float *dnew, int64_t split, int64_t s0, int64_t ns,
                      const float *P, const float *dZ, int64_t ld, const float *dO, int64_t ldo,
                      const float *Q, int64_t ldq, int64_t m, int64_t rkv, int64_t w,
                      float scale) {
    for (int part = 0; part < 2; part++) {
        int64_t a = part == 0 ? s0 : (split > s0 ? split : s0);
        int64_t b = part == 0 ? (split < s0 + ns ? split : s0 + ns) : s0 + ns;
        if (b <= a) continue;
        float *dst = part == 0 ? (dpre ? dpre + a * w : NULL) : dnew + (a - split) * w;
        if (!dst) continue;
        arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, b - a, rkv, m, 1.0f, P + (a - s0), ld, dO, ldo,
                   1.0f, dst, w);
        arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, b - a, w, m, scale, dZ + (a - s0), ld, Q, ldq, 1.0f,
                   dst, w);
    }
}

/* Carves work buffers (16-float aligned) from ws. */
typedef struct ws_cut {
    float *at;
} ws_cut;

static float *cut(ws_cut *c, int64_t n) {
    float *p = c->at;
    c->at += (n + 15) & ~(int64_t)15;
    return p;
}

/* Scores S (m, ns) at ld in P become P = exp(S - lse) on the first nr[e] entries of row e (0
 * beyond); dP = dO C^T (rows: ns rows w wide), then dZ = P (dP - D) in place of dP. */
static void probs_dz(float *P, float *dP, int64_t ld, const float *lse, const float *D,
                     int64_t nr0, int64_t Hm, int64_t nr_full, const float *dO, int64_t ldo,
                     const float *rows, int64_t m, int64_t ns, int64_t rkv, int64_t w) {
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, m, ns, rkv, 1.0f, dO, ldo, rows, w, 0.0f, dP, ld);
    for (int64_t e = 0; e < m; e++) {
        float *pr = P + e * ld, *dr = dP + e * ld;
        const int64_t nr = Hm > 0 ? nr0 + e / Hm : nr_full; /* causal in the own chunk */
        const float l = lse[e], Dv = D[e];
        for (int64_t s = 0; s < ns; s++) {
            float pv = s < nr ? expf(pr[s] - l) : 0.0f;
            pr[s] = pv;
            dr[s] = pv * (dr[s] - Dv);
        }
    }
}

void arl_mla_sparse_attn_bwd(float *dqhat, float *dq_pe, float *dpre, float *dnew, int64_t split,
                             const float *dohat, const float *ohat, const float *lse,
                             const int32_t *list, const float *qhat, const float *q_pe,
                             const float *cache, int64_t pos0, int64_t Tq, int64_t Hm,
                             int64_t rkv, int64_t r, float scale, int64_t n_c, int64_t k_c,
                             float *ws) {
    ARL_ASSERT(pos0 >= 0 && Tq >= 0 && ws && list && k_c >= 1 && n_c >= 1);
    ARL_ASSERT(split >= 0 && split <= pos0 && dnew);
    const int64_t w = rkv + r, S = pos0 + Tq, Jmax = S / n_c + 1, np_max = Tq * Hm;
    ws_cut c = {ws};
    float *qw = cut(&c, np_max * w), *dqw = cut(&c, np_max * w), *qg = cut(&c, np_max * w);
    float *dqg = cut(&c, np_max * w), *dog = cut(&c, np_max * rkv);
    float *P = cut(&c, np_max * n_c), *dP = cut(&c, np_max * n_c);
    float *Dg = cut(&c, np_max), *lg = cut(&c, np_max), *Dp = cut(&c, np_max);
    int32_t *ent = (int32_t *)cut(&c, np_max * k_c), *off = (int32_t *)cut(&c, Jmax + 1);
    for (int64_t i0 = 0; i0 < Tq;) {
        /* a block of queries in one chunk J, as in the forward */
        const int64_t J = (pos0 + i0) / n_c;
        int64_t i1 = (J + 1) * n_c - pos0;
        if (i1 > Tq) i1 = Tq;
        const int64_t np = (i1 - i0) * Hm, a = J * n_c, own = pos0 + i1 - a;
        const float *dOb = dohat + i0 * Hm * rkv, *Ob = ohat + i0 * Hm * rkv;
        const float *lb = lse + i0 * Hm;
        const int32_t *lst = list + i0 * Hm * k_c;
        for (int64_t p = 0; p < np; p++) {
            memcpy(qw + p * w, qhat + (i0 * Hm + p) * rkv, sizeof(float) * (size_t)rkv);
            memcpy(qw + p * w + rkv, q_pe + (i0 * Hm + p) * r, sizeof(float) * (size_t)r);
            Dp[p] = arl_k_vdot(dOb + p * rkv, Ob + p * rkv, rkv); /* rowsum(dA * A) */
        }
        memset(dqw, 0, sizeof(float) * (size_t)(np * w));

        /* own chunk: rows a .. a + own - 1, pair p sees the first pos - a + 1 of them */
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, np, own, w, scale, qw, w, cache + a * w, w, 0.0f,
                   P, n_c);
        probs_dz(P, dP, n_c, lb, Dp, pos0 + i0 - a + 1, Hm, 0, dOb, rkv, cache + a * w, np, own,
                 rkv, w);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, np, w, own, scale, dP, n_c, cache + a * w, w,
                   1.0f, dqw, w);
        rows_grad(dpre, dnew, split, a, own, P, dP, n_c, dOb, rkv, qw, w, np, rkv, w, scale);

        /* the selected earlier chunks: entries grouped by chunk (pairs in order inside a
         * chunk), one set of products per chunk for all the pairs that chose it */
        memset(off, 0, sizeof(int32_t) * (size_t)(J + 1));
        for (int64_t p = 0; p < np; p++)
            for (int64_t k = 0; k < k_c; k++) {
                int32_t j = lst[p * k_c + k];
                if (j < 0) break;
                ARL_ASSERT(j < J);
                off[j + 1]++;
            }
        for (int64_t j = 0; j < J; j++)
            off[j + 1] += off[j];
        for (int64_t p = 0; p < np; p++)
            for (int64_t k = 0; k < k_c; k++) {
                int32_t j = lst[p * k_c + k];
                if (j < 0) break;
                ent[off[j]++] = (int32_t)p;
            }
        for (int64_t j = J; j > 0; j--)
            off[j] = off[j - 1];
        off[0] = 0;
        for (int64_t j = 0; j < J; j++) {
            const int64_t e0 = off[j], m = off[j + 1] - e0;
            if (m == 0) continue;
            const float *rows = cache + j * n_c * w;
            for (int64_t e = 0; e < m; e++) {
                const int64_t p = ent[e0 + e];
                memcpy(qg + e * w, qw + p * w, sizeof(float) * (size_t)w);
                memcpy(dog + e * rkv, dOb + p * rkv, sizeof(float) * (size_t)rkv);
                Dg[e] = Dp[p];
                lg[e] = lb[p];
            }
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, m, n_c, w, scale, qg, w, rows, w, 0.0f, P, n_c);
            probs_dz(P, dP, n_c, lg, Dg, 0, 0, n_c, dog, rkv, rows, m, n_c, rkv, w);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, m, w, n_c, scale, dP, n_c, rows, w, 0.0f, dqg,
                       w);
            for (int64_t e = 0; e < m; e++)
                arl_k_vaxpy(dqw + ent[e0 + e] * w, 1.0f, dqg + e * w, w);
            rows_grad(dpre, dnew, split, j * n_c, n_c, P, dP, n_c, dog, rkv, qg, w, m, rkv, w,
                      scale);
        }
        for (int64_t p = 0; p < np; p++) {
            arl_k_vaxpy(dqhat + (i0 * Hm + p) * rkv, 1.0f, dqw + p * w, rkv);
            arl_k_vaxpy(dq_pe + (i0 * Hm + p) * r, 1.0f, dqw + p * w + rkv, r);
        }
        i0 = i1;
    }
}
