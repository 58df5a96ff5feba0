/* policy/mla.c: MLA attention core on the CPU, fp32 (see policy/mla.h).
 *
 * The expanded form works on blocks of QB query rows of one head and one document: the score
 * block (QB x keys) comes from two GEMMs (nope and pe parts), is masked and normalised in
 * place, and multiplies V.  The backward recomputes the probabilities from lse.  The shared
 * k_pe gradient is summed per head in the work buffer and added over heads in head order, so
 * the result does not depend on the thread count.
 */
#include "policy/mla.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/gemm.h"
#include "kernels/threadpool.h"
#include "kernels/vmath.h"

#define QB 64 /* query rows per score block */

static void check_docs(const int32_t *cu, int32_t N, int64_t T) {
    ARL_ASSERT(N >= 1 && T >= 0);
    if (!cu) {
        ARL_ASSERT(N == 1);
        return;
    }
    ARL_ASSERT(cu[0] == 0 && cu[N] == T);
    for (int32_t i = 0; i < N; i++)
        ARL_ASSERT(cu[i] <= cu[i + 1]);
}

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
    check_docs(cu, N, T);
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
    check_docs(cu, N, T);
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

int64_t arl_mla_absorbed_ws_floats(int64_t S, int64_t rkv, int64_t r, int64_t n_c) {
    int64_t nch = n_c > 0 ? S / n_c + 1 : 0;
    return S + rkv + r + nch * (rkv + r + 2);
}

void arl_mla_absorbed_attn(float *ohat, uint8_t *sel, int64_t sel_stride, const float *qhat,
                           const float *q_pe, const float *cache, int64_t pos0, int64_t Tq,
                           int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                           int64_t k_c, float *ws) {
    ARL_ASSERT(pos0 >= 0 && Tq >= 0 && ws && k_c >= 0 && (k_c == 0 || n_c >= 1));
    const int64_t w = rkv + r, S = pos0 + Tq;
    float *sc = ws, *qrow = ws + S; /* scores (S), one query [qhat; q_pe] (w) */
    float *summ = qrow + w, *sig = NULL, *mark = NULL;
    int64_t n_complete = 0;
    if (k_c > 0) {
        /* summaries of the complete chunks any query may select: j < floor((S-1)/n_c) */
        n_complete = S > 0 ? (S - 1) / n_c : 0;
        sig = summ + (S / n_c + 1) * w;
        mark = sig + S / n_c + 1;
        for (int64_t j = 0; j < n_complete; j++) {
            float *m = summ + j * w;
            for (int64_t e = 0; e < w; e++)
                m[e] = 0.0f;
            for (int64_t s = j * n_c; s < (j + 1) * n_c; s++)
                for (int64_t e = 0; e < w; e++)
                    m[e] += cache[s * w + e];
            for (int64_t e = 0; e < w; e++)
                m[e] /= (float)n_c;
        }
    }
    for (int64_t i = 0; i < Tq; i++) {
        int64_t pos = pos0 + i;
        for (int64_t h = 0; h < Hm; h++) {
            const float *qh = qhat + (i * Hm + h) * rkv, *qp = q_pe + (i * Hm + h) * r;
            int64_t Jt = k_c > 0 ? pos / n_c : 0;
            if (k_c > 0) {
                /* sigma_j = [qhat; q_pe] . mean_j, pick the k_c largest (ties: lower j) */
                for (int64_t j = 0; j < Jt; j++) {
                    const float *m = summ + j * w;
                    float acc = 0.0f;
                    for (int64_t e = 0; e < rkv; e++)
                        acc += qh[e] * m[e];
                    for (int64_t e = 0; e < r; e++)
                        acc += qp[e] * m[rkv + e];
                    sig[j] = acc;
                    mark[j] = 0.0f;
                }
                mark[Jt] = 1.0f;
                for (int64_t pick = 0; pick < k_c && pick < Jt; pick++) {
                    int64_t best = -1;
                    for (int64_t j = 0; j < Jt; j++)
                        if (mark[j] == 0.0f && (best < 0 || sig[j] > sig[best])) best = j;
                    mark[best] = 1.0f;
                }
            }
            if (sel) {
                uint8_t *srow = sel + (i * Hm + h) * sel_stride;
                memset(srow, 0, (size_t)sel_stride);
                if (k_c > 0)
                    for (int64_t j = 0; j <= Jt; j++)
                        srow[j] = mark[j] != 0.0f;
            }
            /* scores of all rows 0..pos as one one-row GEMM with the query [qhat; q_pe], the
             * rows of unselected chunks masked, softmax, then the weighted sum of c as a GEMM */
            const int64_t nr = pos + 1;
            memcpy(qrow, qh, sizeof(float) * (size_t)rkv);
            memcpy(qrow + rkv, qp, sizeof(float) * (size_t)r);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, 1, nr, w, scale, qrow, w, cache, w, 0.0f, sc,
                       nr);
            if (k_c > 0)
                for (int64_t s = 0; s < nr; s++)
                    if (mark[s / n_c] == 0.0f) sc[s] = -INFINITY;
            float mx = arl_k_vmax(sc, nr);
            for (int64_t s = 0; s < nr; s++)
                sc[s] -= mx; /* masked rows stay -inf and give exp = 0 */
            arl_k_vexp(sc, sc, nr);
            float inv = 1.0f / arl_k_vsum(sc, nr);
            arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 1, rkv, nr, inv, sc, nr, cache, w, 0.0f,
                       ohat + (i * Hm + h) * rkv, rkv);
        }
    }
}
