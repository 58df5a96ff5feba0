/* kernels/cuda/sparse.cu: block-sparse MLA inference on the device (spec/policy.md 4.5): the
 * chunk summaries of a latent cache (policy/mla.c arl_mla_chunk_means_update) and the absorbed
 * attention over the selected chunks (arl_mla_sparse_attn without its selection mask).
 * Plain fp32 kernels, correctness first: one thread per summary element, one warp per (query,
 * head); every sum runs in a fixed order (no atomics), so the results are deterministic run to
 * run.  The contracts are those of policy/model_device.h (arl_dev_ops mla_chunk_means_update,
 * mla_sparse_ws_floats, mla_sparse_attn) and kernels/cuda/ops.h.
 * The training form (policy/mla_layer_backward.h arl_mla_sparse_doc_*): the same forward kernel
 * also writes each pair's lse and selected list; the backward recomputes each pair's
 * probabilities over its selected rows (query side: dqhat, dq_pe), then sums the row gradients
 * chunk by chunk over the pairs that selected the chunk, listed per chunk in pair order (no
 * atomics).  What this is not: a tensor-core kernel; the selection runs on one lane per
 * (query, head) (O(J k_c), J the query's chunk).
 *
 * Query t (position since the sequence's start, own chunk J = t / n_c), head h, query row
 * q = [qhat; q_pe]: sigma_j = q . means_j (unscaled, fp32, in column order) for the complete
 * chunks j < J; Sel = the k_c largest (ties to the lower j, the CPU's insertion rule) U {J};
 * scores scale q . row_s over the rows s <= t of Sel, softmax with an online maximum over
 * 32-row blocks in increasing row order, ohat = sum_s P_s c_s.  With J <= k_c every chunk is
 * selected and the rows are 0..t (the dense attention).
 */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sparse_layout.h"

#define SP_QMAX 1024 /* query width rkv + r */
#define SP_VMAX 512  /* value width rkv */

/* ======================= chunk summaries ================================================= */

/* One thread per (chunk j0 + jj, column e): the rows [from, to) of the chunk added in order to
 * its running sum (0 when the chunk starts inside the range), then divided by n_c once when
 * the chunk is complete at `to` (the CPU's order of operations). */
__global__ void k_chunk_means(float *means, const float *cache, int64_t from, int64_t to, int64_t R,
                              int64_t n_c, int64_t j0, int64_t nj, const int64_t *pos_dev) {
    if (pos_dev) { /* a decode step: the one row at *pos_dev (nj = 1) */
        from = *pos_dev;
        to = from + 1;
        j0 = from / n_c;
    }
    ARL_GRID_STRIDE(idx, nj * R) {
        const int64_t j = j0 + idx / R, e = idx % R;
        const int64_t a = j * n_c, b = a + n_c;
        const int64_t s0 = from > a ? from : a, s1 = to < b ? to : b;
        float *m = means + j * R + e;
        float acc = s0 == a ? 0.0f : *m;
        for (int64_t s = s0; s < s1; s++)
            acc += cache[s * R + e];
        if (s1 == b) acc /= (float)n_c;
        *m = acc;
    }
}

extern "C" void arl_cuda_mla_chunk_means_update(float *means, const float *cache, int64_t from,
                                                int64_t to, int64_t R, int64_t n_c) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(from >= 0 && from <= to && n_c >= 1 && R >= 1);
    if (from == to) return;
    const int64_t j0 = from / n_c, j1 = (to + n_c - 1) / n_c;
    k_chunk_means<<<arl_blocks((j1 - j0) * R, 256), 256, 0, ctx->stream>>>(
        means, cache, from, to, R, n_c, j0, j1 - j0, NULL);
    ARL_CUDA_LAUNCHED(ctx, "mla_chunk_means_update");
}

extern "C" void arl_cuda_mla_chunk_means_update_dpos(float *means, const float *cache,
                                                     const int64_t *pos_dev, int64_t R,
                                                     int64_t n_c) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(n_c >= 1 && R >= 1);
    k_chunk_means<<<arl_blocks(R, 256), 256, 0, ctx->stream>>>(means, cache, 0, 0, R, n_c, 0, 1,
                                                               pos_dev);
    ARL_CUDA_LAUNCHED(ctx, "mla_chunk_means_update_dpos");
}

/* ======================= sparse absorbed attention ======================================= */

/* best (K): the K chunks j < J with the largest sig_j (ties toward the lower j), in increasing
 * j: policy/mla.c select_topk's rule (one lane). */
__device__ static void sp_select(int32_t *best, const float *sig, int64_t J, int64_t K) {
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
    for (int64_t a = 1; a < K; a++) {
        int32_t v = best[a];
        int64_t b = a;
        while (b > 0 && best[b - 1] > v) {
            best[b] = best[b - 1];
            b--;
        }
        best[b] = v;
    }
}

/* The rows lo..hi (inclusive) of the cache into the warp's online softmax (m, l, acc): each
 * lane scores one row of a 32-row block, then the block's weighted c rows are added with the
 * lanes over the value columns (as kernels/cuda/mla.cu k_attn_fwd). */
template <int U>
__device__ static void sp_rows(float &m, float &l, float (&acc)[U], const float *qv,
                               const float *cache, int64_t lo, int64_t hi, int64_t rkv, int64_t r,
                               float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t w = rkv + r;
    for (int64_t s0 = lo; s0 <= hi; s0 += 32) {
        const int64_t s = s0 + lane;
        float sc = -INFINITY;
        if (s <= hi) {
            const float *row = cache + s * w;
            float dot = 0.0f;
            for (int64_t d = 0; d < rkv; d++)
                dot += qv[d] * row[d];
            for (int64_t d = 0; d < r; d++)
                dot += qv[rkv + d] * row[rkv + d];
            sc = dot * scale;
        }
        const float mb = arl_warp_max(sc);
        const float mn = fmaxf(m, mb);
        const float corr = expf(m - mn); /* 0 on the first block (m = -inf) */
        const float p = s <= hi ? expf(sc - mn) : 0.0f;
        l = l * corr + arl_warp_sum(p);
        for (int u = 0; u < U; u++)
            acc[u] *= corr;
        const int64_t nk = hi - s0 + 1 < 32 ? hi - s0 + 1 : 32;
        for (int jj = 0; jj < nk; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const float *vr = cache + (s0 + jj) * w;
            for (int u = 0; u < U; u++) {
                const int64_t d = lane + 32 * u;
                if (d < rkv) acc[u] += pj * vr[d];
            }
        }
        m = mn;
    }
}

/* One block (one warp) per (query i, head h) = item.  sig (Tq Hm, ldj) and list (Tq Hm, k_c):
 * the work buffer. */
template <int U>
__global__ void __launch_bounds__(32)
    k_sparse_attn(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                  const float *means, int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                  float scale, int64_t n_c, int64_t k_c, float *sig_ws, int32_t *list_ws,
                  int64_t ldj, float *lse_out, int32_t *list_out, const int64_t *pos_dev) {
    __shared__ float qv[SP_QMAX];
    const int lane = threadIdx.x & 31;
    const int64_t item = blockIdx.x;
    if (item >= Tq * Hm) return;
    if (pos_dev) pos0 = *pos_dev; /* a decode step (CUDA graphs): the position when it runs */
    const int64_t i = item / Hm, w = rkv + r, t = pos0 + i, J = t / n_c;
    for (int64_t d = lane; d < w; d += 32)
        qv[d] = d < rkv ? qhat[item * rkv + d] : q_pe[item * r + d - rkv];
    __syncwarp();
    float m = -INFINITY, l = 0.0f, acc[U];
    for (int u = 0; u < U; u++)
        acc[u] = 0.0f;
    if (J <= k_c) { /* every chunk up to the own one: the dense rows */
        sp_rows<U>(m, l, acc, qv, cache, 0, t, rkv, r, scale);
        if (list_out) /* training: the earlier chunks 0 .. J-1, then none */
            for (int64_t k = lane; k < k_c; k += 32)
                list_out[item * k_c + k] = k < J ? (int32_t)k : -1;
    } else {
        float *sig = sig_ws + item * ldj;
        int32_t *best = (list_out ? list_out : list_ws) + item * k_c;
        for (int64_t j = lane; j < J; j += 32) {
            const float *mn = means + j * w;
            float dot = 0.0f;
            for (int64_t d = 0; d < w; d++)
                dot += qv[d] * mn[d];
            sig[j] = dot;
        }
        __syncwarp();
        if (lane == 0) sp_select(best, sig, J, k_c);
        __syncwarp();
        for (int64_t k = 0; k < k_c; k++) { /* the selected earlier chunks, increasing */
            const int64_t a = (int64_t)best[k] * n_c;
            sp_rows<U>(m, l, acc, qv, cache, a, a + n_c - 1, rkv, r, scale);
        }
        sp_rows<U>(m, l, acc, qv, cache, J * n_c, t, rkv, r, scale); /* the own chunk */
    }
    const float inv = 1.0f / l;
    for (int u = 0; u < U; u++) {
        const int64_t d = lane + 32 * u;
        if (d < rkv) ohat[item * rkv + d] = acc[u] * inv;
    }
    if (lse_out && lane == 0) lse_out[item] = m + logf(l);
}

extern "C" int64_t arl_cuda_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S,
                                                 int64_t rkv, int64_t r, int64_t n_c,
                                                 int64_t k_c) {
    (void)rkv, (void)r;
    ARL_ASSERT(n_c >= 1 && k_c >= 1);
    return Tq_max * Hm * (S / n_c + 1 + k_c); /* sigma per chunk, then the selected list */
}

/* The kernel over the items of Tq queries at pos0.. (sig, list: this call's work buffer). */
static void sparse_launch(cudaStream_t st, float *ohat, float *lse, int32_t *list_out,
                          const float *qhat, const float *q_pe, const float *cache,
                          const float *means, int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv,
                          int64_t r, float scale, int64_t n_c, int64_t k_c, float *sig,
                          int32_t *list, int64_t ldj, const int64_t *pos_dev = NULL) {
    const unsigned nb = (unsigned)(Tq * Hm);
    if (rkv <= 64)
        k_sparse_attn<2><<<nb, 32, 0, st>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r,
                                            scale, n_c, k_c, sig, list, ldj, lse, list_out,
                                            pos_dev);
    else if (rkv <= 128)
        k_sparse_attn<4><<<nb, 32, 0, st>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r,
                                            scale, n_c, k_c, sig, list, ldj, lse, list_out,
                                            pos_dev);
    else if (rkv <= 256)
        k_sparse_attn<8><<<nb, 32, 0, st>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r,
                                            scale, n_c, k_c, sig, list, ldj, lse, list_out,
                                            pos_dev);
    else
        k_sparse_attn<16><<<nb, 32, 0, st>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r,
                                             scale, n_c, k_c, sig, list, ldj, lse, list_out,
                                             pos_dev);
}

extern "C" void arl_cuda_mla_sparse_attn(float *ohat, const float *qhat, const float *q_pe,
                                         const float *cache, const float *means, int64_t pos0,
                                         int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                                         float scale, int64_t n_c, int64_t k_c, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(pos0 >= 0 && Tq >= 0 && n_c >= 1 && k_c >= 1 && rkv >= 1 && rkv <= SP_VMAX &&
               rkv + r <= SP_QMAX);
    const int64_t items = Tq * Hm;
    if (items == 0) return;
    /* the layout of this call's (Tq, pos0 + Tq) inside the (Tq_max, S) work buffer */
    const int64_t ldj = (pos0 + Tq) / n_c + 1;
    sparse_launch(ctx->stream, ohat, NULL, NULL, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r,
                  scale, n_c, k_c, ws, (int32_t *)(ws + items * ldj), ldj);
    ARL_CUDA_LAUNCHED(ctx, "mla_sparse_attn");
}

extern "C" void arl_cuda_mla_sparse_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                              const float *cache, const float *means,
                                              const int64_t *pos_dev, int64_t Hm, int64_t rkv,
                                              int64_t r, float scale, int64_t n_c, int64_t k_c,
                                              int64_t S, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(S >= 1 && n_c >= 1 && k_c >= 1 && rkv >= 1 && rkv <= SP_VMAX && rkv + r <= SP_QMAX);
    /* the layout for one query over at most S rows (the position is not known here) */
    const int64_t ldj = S / n_c + 1;
    sparse_launch(ctx->stream, ohat, NULL, NULL, qhat, q_pe, cache, means, 0, 1, Hm, rkv, r, scale,
                  n_c, k_c, ws, (int32_t *)(ws + Hm * ldj), ldj, pos_dev);
    ARL_CUDA_LAUNCHED(ctx, "mla_sparse_attn_dpos");
}

/* ======================= block-sparse MLA training ======================================= */

#define SPT_THREADS 128 /* backward query side: threads per (query, head) */

/* The work buffer (kernels/cuda/sparse_layout.h) as pointers. */
typedef struct spt_ws {
    float *means, *sig, *P, *dZ;
    int32_t *cnt, *off, *used, *nused, *key, *ent, *seg;
} spt_ws;

static void spt_bind(spt_ws *b, float *ws, int64_t Tq_max, int64_t S, int64_t Hm, int64_t R,
                     int64_t n_c, int64_t k_c) {
    arl_spt_layout L;
    arl_spt_layout_make(&L, Tq_max, S, Hm, R, n_c, k_c);
    b->means = ws + L.means;
    b->sig = ws + L.sig;
    b->P = ws + L.P;
    b->dZ = ws + L.dZ;
    b->cnt = (int32_t *)(ws + L.cnt);
    b->off = (int32_t *)(ws + L.off);
    b->used = (int32_t *)(ws + L.used);
    b->nused = (int32_t *)(ws + L.nused);
    b->key = (int32_t *)(ws + L.key);
    b->ent = (int32_t *)(ws + L.ent);
    b->seg = (int32_t *)(ws + L.seg);
}

extern "C" int64_t arl_cuda_mla_sparse_train_ws_floats(int64_t Tq_max, int64_t S, int64_t Hm,
                                                       int64_t rkv, int64_t r, int64_t n_c,
                                                       int64_t k_c) {
    ARL_ASSERT(Tq_max >= 1 && S >= 1 && Hm >= 1 && n_c >= 1 && k_c >= 1);
    arl_spt_layout L;
    arl_spt_layout_make(&L, Tq_max, S, Hm, rkv + r, n_c, k_c);
    return L.floats;
}

extern "C" void arl_cuda_mla_sparse_fwd_save(float *ohat, float *lse, int32_t *list,
                                             const float *qhat, const float *q_pe,
                                             const float *rows, int64_t p0, int64_t Tq, int64_t Hm,
                                             int64_t rkv, int64_t r, float scale, int64_t n_c,
                                             int64_t k_c, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(p0 >= 0 && Tq >= 0 && n_c >= 1 && k_c >= 1 && rkv >= 1 && rkv <= SP_VMAX &&
               rkv + r <= SP_QMAX);
    if (Tq == 0) return;
    const int64_t R = rkv + r, M = p0 + Tq, fq = arl_spt_fwd_queries(Hm);
    spt_ws b;
    spt_bind(&b, ws, Tq, M, Hm, R, n_c, k_c);
    const int64_t J = M / n_c + 1;
    arl_cuda_mla_chunk_means_update(b.means, rows, 0, M, R, n_c);
    for (int64_t q0 = 0; q0 < Tq; q0 += fq) {
        const int64_t nq = Tq - q0 < fq ? Tq - q0 : fq;
        sparse_launch(ctx->stream, ohat + q0 * Hm * rkv, lse + q0 * Hm, list + q0 * Hm * k_c,
                      qhat + q0 * Hm * rkv, q_pe + q0 * Hm * r, rows, b.means, p0 + q0, nq, Hm, rkv,
                      r, scale, n_c, k_c, b.sig, NULL, J);
    }
    ARL_CUDA_LAUNCHED(ctx, "mla_sparse_fwd_save");
}

/* Chunk of entry slot k (0 .. k_c) of the pair with list row lrow and own chunk J: the listed
 * chunk (-1: none), or J for the last slot. */
__device__ static inline int64_t spt_chunk(const int32_t *lrow, int64_t k, int64_t k_c, int64_t J) {
    return k < k_c ? (int64_t)lrow[k] : J;
}

/* Query side: one block per pair p = i Hm + h of the block's queries (query q0 + i): its
 * entries e = k n_c + o (row chunk(k) n_c + o when it exists and is <= t) get P_e and
 * dZ_e = P_e (dohat . c_e - D) in the block's buffers (0 for the others), then dqhat, dq_pe
 * += scale sum_e dZ_e row_e (entries in order). */
__global__ void __launch_bounds__(SPT_THREADS)
    k_spt_bwd_q(float *dqhat, float *dq_pe, float *Pb, float *dZb, const float *dohat,
                const float *ohat, const float *lse, const int32_t *list, const float *qhat,
                const float *q_pe, const float *rows, int64_t p0, int64_t q0, int64_t Hm,
                int64_t rkv, int64_t r, float scale, int64_t n_c, int64_t k_c) {
    __shared__ double shd[33];
    const int64_t p = blockIdx.x, g = q0 * Hm + p, t = p0 + q0 + p / Hm, J = t / n_c;
    const int64_t R = rkv + r, E = (k_c + 1) * n_c;
    const float *qh = qhat + g * rkv, *qp = q_pe + g * r, *dO = dohat + g * rkv;
    const int32_t *lrow = list + g * k_c;
    float *P = Pb + p * E, *dZ = dZb + p * E;
    double dd = 0.0;
    for (int64_t c = threadIdx.x; c < rkv; c += blockDim.x)
        dd += (double)dO[c] * ohat[g * rkv + c];
    const float D = (float)arl_block_sum_d(dd, shd);
    const float l = lse[g];
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        const int64_t j = spt_chunk(lrow, e / n_c, k_c, J), s = j * n_c + e % n_c;
        float pv = 0.0f, dz = 0.0f;
        if (j >= 0 && s <= t) {
            const float *row = rows + s * R;
            float dp = 0.0f;
            for (int64_t c = 0; c < rkv; c++)
                dp += dO[c] * row[c];
            pv = expf(scale * arl_latent_dot(qh, qp, row, rkv, r) - l);
            dz = pv * (dp - D);
        }
        P[e] = pv;
        dZ[e] = dz;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < R; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            const int64_t j = spt_chunk(lrow, e / n_c, k_c, J), s = j * n_c + e % n_c;
            if (j >= 0 && s <= t) acc += dZ[e] * rows[s * R + c];
        }
        if (c < rkv)
            dqhat[g * rkv + c] += scale * acc;
        else
            dq_pe[g * r + (c - rkv)] += scale * acc;
    }
}

/* Entry i = p (k_c + 1) + k of the block's np pairs (slot k of pair p): key[i] = its chunk
 * less j0 when that is in [j0, j0 + W), -1 otherwise (no chunk, or another window's). */
__global__ void k_spt_keys(int32_t *key, const int32_t *list, int64_t p0, int64_t q0, int64_t np,
                           int64_t Hm, int64_t n_c, int64_t k_c, int64_t j0, int64_t W) {
    ARL_GRID_STRIDE(i, np * (k_c + 1)) {
        const int64_t p = i / (k_c + 1), k = i % (k_c + 1), g = q0 * Hm + p;
        const int64_t j = spt_chunk(list + g * k_c, k, k_c, (p0 + q0 + p / Hm) / n_c);
        key[i] = j >= j0 && j < j0 + W ? (int32_t)(j - j0) : -1;
    }
}

/* Row side: one thread per (row of a chunk with entries, column c), the chunks of the window
 * from j0 (used: the window's chunks with entries, less j0): the sum over the chunk's entries
 * in order (pairs in order, then slots) of P dohat + scale dZ [qhat; q_pe], added to dnew
 * (rows >= p0) or dprefix (rows < p0; skipped when NULL).  Rows past the block's last query
 * are not touched. */
__global__ void k_spt_bwd_rows(float *dnew, float *dprefix, const float *Pb, const float *dZb,
                               const int32_t *ent, const int32_t *off, const int32_t *used,
                               const int32_t *nused, const float *dohat, const float *qhat,
                               const float *q_pe, int64_t p0, int64_t q0, int64_t nq, int64_t Hm,
                               int64_t rkv, int64_t r, float scale, int64_t n_c, int64_t k_c,
                               int64_t j0) {
    const int64_t R = rkv + r, E = (k_c + 1) * n_c, last = p0 + q0 + nq - 1;
    const int64_t total = (int64_t)*nused * n_c * R;
    ARL_GRID_STRIDE(idx, total) {
        const int64_t u = used[idx / (n_c * R)], o = (idx / R) % n_c, c = idx % R;
        const int64_t s = (j0 + u) * n_c + o;
        if (s > last || (s < p0 && !dprefix)) continue;
        float acc = 0.0f;
        for (int32_t x = off[u]; x < off[u + 1]; x++) {
            const int64_t pe = ent[x], p = pe / (k_c + 1), k = pe % (k_c + 1);
            const int64_t g = q0 * Hm + p, e = p * E + k * n_c + o;
            const float pv = Pb[e], dz = dZb[e];
            if (c < rkv)
                acc += pv * dohat[g * rkv + c] + scale * dz * qhat[g * rkv + c];
            else
                acc += scale * dz * q_pe[g * r + (c - rkv)];
        }
        if (s < p0)
            dprefix[s * R + c] += acc;
        else
            dnew[(s - p0) * R + c] += acc;
    }
}

extern "C" void arl_cuda_mla_sparse_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                                        const float *dohat, const float *ohat, const float *lse,
                                        const int32_t *list, const float *qhat, const float *q_pe,
                                        const float *rows, int64_t p0, int64_t Tq, int64_t Hm,
                                        int64_t rkv, int64_t r, float scale, int64_t n_c,
                                        int64_t k_c, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    ARL_ASSERT(p0 >= 0 && Tq >= 0 && n_c >= 1 && k_c >= 1 && rkv >= 1);
    if (Tq == 0) return;
    const int64_t R = rkv + r, M = p0 + Tq, bq = arl_spt_bwd_queries(Hm, n_c, k_c);
    const int64_t W = ctx->spt_window > 0 ? ctx->spt_window : ARL_SPT_WINDOW;
    float *dpre = p0 > 0 ? dprefix : NULL;
    spt_ws b;
    spt_bind(&b, ws, Tq, M, Hm, R, n_c, k_c);
    for (int64_t q0 = 0; q0 < Tq; q0 += bq) {
        const int64_t nq = Tq - q0 < bq ? Tq - q0 : bq, np = nq * Hm;
        const int64_t Jb = (p0 + q0 + nq - 1) / n_c + 1;
        k_spt_bwd_q<<<(unsigned)np, SPT_THREADS, 0, ctx->stream>>>(
            dqhat, dq_pe, b.P, b.dZ, dohat, ohat, lse, list, qhat, q_pe, rows, p0, q0, Hm, rkv, r,
            scale, n_c, k_c);
        /* the block's entries by chunk, a window of W chunks at a time */
        const int64_t n = np * (k_c + 1);
        for (int64_t j0 = 0; j0 < Jb; j0 += W) {
            const int64_t Ew = Jb - j0 < W ? Jb - j0 : W;
            k_spt_keys<<<arl_blocks(n, 256), 256, 0, ctx->stream>>>(b.key, list, p0, q0, np, Hm,
                                                                    n_c, k_c, j0, Ew);
            arl_csort_pass sp = {};
            sp.src = b.key;
            sp.div = 1;
            sp.out = b.ent;
            sp.used = b.used;
            sp.nused = b.nused;
            sp.err_code = 0; /* the entries of no chunk or of other windows: left out */
            ARL_ASSERT(arl_csort_seg_ints(n, Ew) <= arl_spt_seg_ints(n, Ew));
            arl_csort_run(ctx, &sp, n, Ew, b.cnt, b.off, NULL, 1, b.seg);
            k_spt_bwd_rows<<<arl_blocks(Ew * n_c * R, 256), 256, 0, ctx->stream>>>(
                dnew, dpre, b.P, b.dZ, b.ent, b.off, b.used, b.nused, dohat, qhat, q_pe, p0, q0, nq,
                Hm, rkv, r, scale, n_c, k_c, j0);
        }
    }
    ARL_CUDA_LAUNCHED(ctx, "mla_sparse_bwd");
}

extern "C" int32_t arl_cuda_mla_sparse_bwd_window(int32_t chunks) {
    ARL_ASSERT(chunks >= 0 && chunks <= ARL_SPT_WINDOW);
    return arl_cuda_swap_setting(&arl_cuda_need()->spt_window, chunks);
}
