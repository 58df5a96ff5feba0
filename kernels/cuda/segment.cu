/* kernels/cuda/segment.cu: the ops of segment-wise training on the device (documents that
 * continue a decode state; policy/model_device_backward.c): the gradients of the KDA conv
 * tails (policy/kda_layer_backward.c conv_tail_bwd / conv_tail_out_bwd) and the dense absorbed
 * MLA core with what its backward needs (policy/mla_layer_backward.c abs_fwd_heads / abs_bwd),
 * one document per call.  Plain fp32 kernels, correctness first: every output element is
 * written by one thread, and every sum runs in a fixed order (no floating-point atomics), so
 * the results are deterministic run to run.  The contracts are those of policy/model_device.h
 * (arl_dev_ops kda_conv_tail_bwd, kda_conv_tail_out_bwd, mla_abs_*).
 *
 * Absorbed core, one head h and query t (position p0 + t) over rows j <= p0 + t of
 * [c_j; kpe_j]: z_j = scale (qhat . c_j + q_pe . kpe_j), A = softmax(z), ohat = sum_j A_j c_j,
 * lse = log sum_j exp(z_j).  Backward: D = dohat . ohat; dZ_j = A_j (dohat . c_j - D);
 * dqhat += scale sum_j dZ_j c_j; dq_pe += scale sum_j dZ_j kpe_j; row j: dc_j += sum_{t,h}
 * A_j dohat + scale dZ_j qhat, dkpe_j += sum_{t,h} scale dZ_j q_pe.  Queries run in blocks of
 * ABS_QB (the score buffers: ws); the row gradients of a block are summed per (row, column)
 * over heads, then queries, in order.
 */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

#define ABS_QB 16       /* queries of one document per launch */
#define ABS_THREADS 128 /* threads per (query, head) block */

/* ======================= conv tails ====================================================== */

/* Pre-activation of output pos (relative to the document start a) of channel c, as
 * policy/kda.c arl_kda_conv_fwd (tail NULL: zeros). */
__device__ static inline float tail_conv_pre(const float *x, const float *w, const float *tail,
                                             int64_t a, int64_t pos, int64_t c, int64_t C,
                                             int64_t W) {
    float acc = 0.0f;
    for (int64_t j = 0; j < W; j++) {
        int64_t src = pos - (W - 1) + j;
        float in = src >= 0 ? x[(a + src) * C + c] : (tail ? tail[c * (W - 1) + (W - 1 + src)] : 0.0f);
        acc += w[c * W + j] * in;
    }
    return acc;
}

/* One thread per (document, channel): the first W-1 outputs of the document read its tail. */
__global__ void k_conv_tail_bwd(float *dtail, const float *dz, const float *x, const float *w,
                                const float *tails, const int32_t *cu, int32_t N, int64_t T,
                                int64_t C, int64_t W) {
    ARL_GRID_STRIDE(idx, (int64_t)N * C) {
        const int64_t di = idx / C, c = idx % C;
        const int64_t a = cu ? cu[di] : 0, len = (cu ? cu[di + 1] : T) - a;
        const float *tail = tails ? tails + di * C * (W - 1) : NULL;
        float *dt = dtail + di * C * (W - 1);
        for (int64_t pos = 0; pos < W - 1 && pos < len; pos++) {
            const float y = tail_conv_pre(x, w, tail, a, pos, c, C, W);
            const float s = arl_sigmoidf(y);
            const float dy = dz[(a + pos) * C + c] * s * (1.0f + y * (1.0f - s));
            for (int64_t j = 0; j < W; j++) {
                int64_t src = pos - (W - 1) + j;
                if (src < 0) dt[c * (W - 1) + (W - 1 + src)] += w[c * W + j] * dy;
            }
        }
    }
}

/* One thread per (document, channel): element i of the final tail is element len + i of
 * [tail_in; x_doc]. */
__global__ void k_conv_tail_out_bwd(float *dpre, float *dtail_in, const float *dtail_out,
                                    const int32_t *cu, int32_t N, int64_t T, int64_t C,
                                    int64_t W) {
    ARL_GRID_STRIDE(idx, (int64_t)N * C) {
        const int64_t di = idx / C, c = idx % C;
        const int64_t a = cu ? cu[di] : 0, len = (cu ? cu[di + 1] : T) - a;
        const float *g = dtail_out + di * C * (W - 1);
        for (int64_t i = 0; i < W - 1; i++) {
            const int64_t m = len + i;
            const float v = g[c * (W - 1) + i];
            if (m >= W - 1)
                dpre[(a + m - (W - 1)) * C + c] += v;
            else if (dtail_in)
                dtail_in[di * C * (W - 1) + c * (W - 1) + m] += v;
        }
    }
}

extern "C" void arl_cuda_kda_conv_tail_bwd(float *dtail, const float *dz, const float *x,
                                           const float *w, const float *tails, const int32_t *cu,
                                           int32_t N, int64_t T, int64_t C, int64_t W) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0 || N <= 0 || W <= 1) return;
    k_conv_tail_bwd<<<arl_blocks((int64_t)N * C, 256), 256, 0, ctx->stream>>>(
        dtail, dz, x, w, tails, cu, N, T, C, W);
    ARL_CUDA_LAUNCHED(ctx, "kda_conv_tail_bwd");
}

extern "C" void arl_cuda_kda_conv_tail_out_bwd(float *dpre, float *dtail_in,
                                               const float *dtail_out, const int32_t *cu,
                                               int32_t N, int64_t T, int64_t C, int64_t W) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (N <= 0 || W <= 1) return;
    k_conv_tail_out_bwd<<<arl_blocks((int64_t)N * C, 256), 256, 0, ctx->stream>>>(
        dpre, dtail_in, dtail_out, cu, N, T, C, W);
    ARL_CUDA_LAUNCHED(ctx, "kda_conv_tail_out_bwd");
}

/* ======================= absorbed MLA core =============================================== */

/* One block per (query i of the block, head h): scores into sc (ld rows of ws), softmax, lse,
 * ohat. */
__global__ void __launch_bounds__(ABS_THREADS)
    k_abs_fwd(float *ohat, float *lse, const float *qhat, const float *q_pe, const float *rows,
              int64_t p0, int64_t q0, int64_t Hm, int64_t rkv, int64_t r, float scale, float *ws,
              int64_t ld) {
    __shared__ float shf[33];
    __shared__ double shd[33];
    const int64_t bid = blockIdx.x, i = bid / Hm, h = bid % Hm, t = q0 + i, m = p0 + t + 1;
    const int64_t R = rkv + r;
    const float *qh = qhat + (t * Hm + h) * rkv, *qp = q_pe + (t * Hm + h) * r;
    float *sc = ws + bid * ld;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
        float z = scale * arl_latent_dot(qh, qp, rows + j * R, rkv, r);
        sc[j] = z;
        mx = fmaxf(mx, z);
    }
    mx = arl_block_max(mx, shf);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = arl_block_sum_d(sum, shd); /* synchronises: sc complete */
    const float inv = (float)(1.0 / sum);
    for (int64_t c = threadIdx.x; c < rkv; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < m; j++)
            acc += sc[j] * rows[j * R + c];
        ohat[(t * Hm + h) * rkv + c] = acc * inv;
    }
    if (threadIdx.x == 0) lse[t * Hm + h] = mx + (float)log(sum);
}

/* Backward, query side: one block per (query i, head h): P_j and dZ_j into ws (ld rows each,
 * the P block then the dZ block), dqhat and dq_pe +=. */
__global__ void __launch_bounds__(ABS_THREADS)
    k_abs_bwd_q(float *dqhat, float *dq_pe, const float *dohat, const float *ohat,
                const float *lse, const float *qhat, const float *q_pe, const float *rows,
                int64_t p0, int64_t q0, int64_t nq, int64_t Hm, int64_t rkv, int64_t r,
                float scale, float *ws, int64_t ld) {
    __shared__ double shd[33];
    const int64_t bid = blockIdx.x, i = bid / Hm, h = bid % Hm, t = q0 + i, m = p0 + t + 1;
    const int64_t R = rkv + r;
    const float *qh = qhat + (t * Hm + h) * rkv, *qp = q_pe + (t * Hm + h) * r;
    const float *dO = dohat + (t * Hm + h) * rkv, *Ob = ohat + (t * Hm + h) * rkv;
    float *P = ws + bid * ld, *dZ = ws + (nq * Hm + bid) * ld;
    double dd = 0.0;
    for (int64_t c = threadIdx.x; c < rkv; c += blockDim.x)
        dd += (double)dO[c] * Ob[c];
    const float D = (float)arl_block_sum_d(dd, shd);
    const float l = lse[t * Hm + h];
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
        const float *row = rows + j * R;
        const float p = expf(scale * arl_latent_dot(qh, qp, row, rkv, r) - l);
        float dp = 0.0f;
        for (int64_t c = 0; c < rkv; c++)
            dp += dO[c] * row[c];
        P[j] = p;
        dZ[j] = p * (dp - D);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < R; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < m; j++)
            acc += dZ[j] * rows[j * R + c];
        if (c < rkv)
            dqhat[(t * Hm + h) * rkv + c] += scale * acc;
        else
            dq_pe[(t * Hm + h) * r + (c - rkv)] += scale * acc;
    }
}

/* Backward, row side: one thread per (row j, column c) of the rows the block's queries see:
 * the sum over heads, then queries (fixed order), added to dnew (own rows) or dprefix. */
__global__ void k_abs_bwd_rows(float *dnew, float *dprefix, const float *dohat, const float *qhat,
                               const float *q_pe, int64_t p0, int64_t q0, int64_t nq, int64_t Hm,
                               int64_t rkv, int64_t r, float scale, const float *ws, int64_t ld) {
    const int64_t R = rkv + r, M = p0 + q0 + nq;
    ARL_GRID_STRIDE(idx, M * R) {
        const int64_t j = idx / R, c = idx % R;
        if (j < p0 && !dprefix) continue;
        float acc = 0.0f;
        for (int64_t h = 0; h < Hm; h++)
            for (int64_t i = 0; i < nq; i++) {
                const int64_t t = q0 + i, bid = i * Hm + h;
                if (j > p0 + t) continue;
                const float p = ws[bid * ld + j], dz = ws[(nq * Hm + bid) * ld + j];
                if (c < rkv)
                    acc += p * dohat[(t * Hm + h) * rkv + c] +
                           scale * dz * qhat[(t * Hm + h) * rkv + c];
                else
                    acc += scale * dz * q_pe[(t * Hm + h) * r + (c - rkv)];
            }
        if (j < p0)
            dprefix[j * R + c] += acc;
        else
            dnew[(j - p0) * R + c] += acc;
    }
}

extern "C" int64_t arl_cuda_mla_abs_train_ws_floats(int64_t S, int64_t Hm, int64_t rkv,
                                                    int64_t r) {
    (void)rkv, (void)r;
    return 2 * ABS_QB * Hm * S;
}

extern "C" void arl_cuda_mla_abs_fwd_save(float *ohat, float *lse, const float *qhat,
                                          const float *q_pe, const float *rows, int64_t p0,
                                          int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                                          float scale, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    const int64_t ld = p0 + Tq;
    for (int64_t q0 = 0; q0 < Tq; q0 += ABS_QB) {
        const int64_t nq = Tq - q0 < ABS_QB ? Tq - q0 : ABS_QB;
        k_abs_fwd<<<(unsigned)(nq * Hm), ABS_THREADS, 0, ctx->stream>>>(
            ohat, lse, qhat, q_pe, rows, p0, q0, Hm, rkv, r, scale, ws, ld);
    }
    ARL_CUDA_LAUNCHED(ctx, "mla_abs_fwd_save");
}

extern "C" void arl_cuda_mla_abs_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                                     const float *dohat, const float *ohat, const float *lse,
                                     const float *qhat, const float *q_pe, const float *rows,
                                     int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                                     float scale, float *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    const int64_t ld = p0 + Tq, R = rkv + r;
    for (int64_t q0 = 0; q0 < Tq; q0 += ABS_QB) {
        const int64_t nq = Tq - q0 < ABS_QB ? Tq - q0 : ABS_QB;
        k_abs_bwd_q<<<(unsigned)(nq * Hm), ABS_THREADS, 0, ctx->stream>>>(
            dqhat, dq_pe, dohat, ohat, lse, qhat, q_pe, rows, p0, q0, nq, Hm, rkv, r, scale, ws,
            ld);
        k_abs_bwd_rows<<<arl_blocks((p0 + q0 + nq) * R, 256), 256, 0, ctx->stream>>>(
            dnew, dprefix, dohat, qhat, q_pe, p0, q0, nq, Hm, rkv, r, scale, ws, ld);
    }
    ARL_CUDA_LAUNCHED(ctx, "mla_abs_bwd");
}
