/* kernels/cuda/sparse.cu: block-sparse MLA inference on the device (spec/policy.md 4.5): the
 * chunk summaries of a latent cache (policy/mla.c arl_mla_chunk_means_update) and the absorbed
 * attention over the selected chunks (arl_mla_sparse_attn without its selection mask).
 * Plain fp32 kernels, correctness first: one thread per summary element, one warp per (query,
 * head); every sum runs in a fixed order (no atomics), so the results are deterministic run to
 * run.  The contracts are those of policy/model_device.h (arl_dev_ops mla_chunk_means_update,
 * mla_sparse_ws_floats, mla_sparse_attn) and kernels/cuda/ops.h.
 * What this is not: the training form (its lse and selected lists, the backward) or a tensor-core
 * kernel; the selection runs on one lane per (query, head) (O(J k_c), J the query's chunk).
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

#define SP_QMAX 1024 /* query width rkv + r */
#define SP_VMAX 512  /* value width rkv */

/* ======================= chunk summaries ================================================= */

/* One thread per (chunk j0 + jj, column e): the rows [from, to) of the chunk added in order to
 * its running sum (0 when the chunk starts inside the range), then divided by n_c once when
 * the chunk is complete at `to` (the CPU's order of operations). */
__global__ void k_chunk_means(float *means, const float *cache, int64_t from, int64_t to,
                              int64_t R, int64_t n_c, int64_t j0, int64_t nj) {
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
    k_chunk_means<<<arl_blocks((j1 - j0) * R, 256), 256, 0, ctx->stream>>>(means, cache, from, to,
                                                                           R, n_c, j0, j1 - j0);
    ARL_CUDA_LAUNCHED(ctx, "mla_chunk_means_update");
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
                  int64_t ldj) {
    __shared__ float qv[SP_QMAX];
    const int lane = threadIdx.x & 31;
    const int64_t item = blockIdx.x;
    if (item >= Tq * Hm) return;
    const int64_t i = item / Hm, w = rkv + r, t = pos0 + i, J = t / n_c;
    for (int64_t d = lane; d < w; d += 32)
        qv[d] = d < rkv ? qhat[item * rkv + d] : q_pe[item * r + d - rkv];
    __syncwarp();
    float m = -INFINITY, l = 0.0f, acc[U];
    for (int u = 0; u < U; u++)
        acc[u] = 0.0f;
    if (J <= k_c) { /* every chunk up to the own one: the dense rows */
        sp_rows<U>(m, l, acc, qv, cache, 0, t, rkv, r, scale);
    } else {
        float *sig = sig_ws + item * ldj;
        int32_t *best = list_ws + item * k_c;
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
}

extern "C" int64_t arl_cuda_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S,
                                                 int64_t rkv, int64_t r, int64_t n_c,
                                                 int64_t k_c) {
    (void)rkv, (void)r;
    ARL_ASSERT(n_c >= 1 && k_c >= 1);
    return Tq_max * Hm * (S / n_c + 1 + k_c); /* sigma per chunk, then the selected list */
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
    float *sig = ws;
    int32_t *list = (int32_t *)(ws + items * ldj);
    const unsigned nb = (unsigned)items;
    if (rkv <= 64)
        k_sparse_attn<2><<<nb, 32, 0, ctx->stream>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm,
                                                      rkv, r, scale, n_c, k_c, sig, list, ldj);
    else if (rkv <= 128)
        k_sparse_attn<4><<<nb, 32, 0, ctx->stream>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm,
                                                      rkv, r, scale, n_c, k_c, sig, list, ldj);
    else if (rkv <= 256)
        k_sparse_attn<8><<<nb, 32, 0, ctx->stream>>>(ohat, qhat, q_pe, cache, means, pos0, Tq, Hm,
                                                      rkv, r, scale, n_c, k_c, sig, list, ldj);
    else
        k_sparse_attn<16><<<nb, 32, 0, ctx->stream>>>(ohat, qhat, q_pe, cache, means, pos0, Tq,
                                                       Hm, rkv, r, scale, n_c, k_c, sig, list,
                                                       ldj);
    ARL_CUDA_LAUNCHED(ctx, "mla_sparse_attn");
}
