/* kernels/cuda/model.cu: the small glue ops the whole-model forward on the device needs
 * besides the table (kernels/backend.h) and the model-level ops of kernels/cuda/ops.h:
 * strided row copies (head splits), the embedding gather, the KDA decay gates and the gated
 * output RMSNorm.  Each mirrors its CPU function (named in kernels/cuda/ops.h), fp32
 * throughout (spec/policy.md 1.4: the KDA gate and the norm statistics are fp32 always). */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

/* ======================= copies ========================================================== */

__global__ void k_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                            int64_t cols) {
    ARL_GRID_STRIDE(i, rows * cols) {
        int64_t r = i / cols, c = i % cols;
        dst[r * ldd + c] = src[r * lds + c];
    }
}

extern "C" void arl_cuda_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds,
                                   int64_t rows, int64_t cols) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (rows <= 0 || cols <= 0) return;
    k_copy_rows<<<arl_blocks(rows * cols, 256), 256, 0, ctx->stream>>>(dst, ldd, src, lds, rows,
                                                                       cols);
    ARL_CUDA_LAUNCHED(ctx, "copy_rows");
}

/* An id outside [0, V) sets the device error word (ARL_ERR_RANGE, detail = the token) and
 * writes zeros; callers check ids on the host first, so this is a guard, not a path. */
__global__ void k_embed(float *x, const float *table, const int32_t *tokens, int64_t T, int64_t d,
                        int64_t V, arl_cuda_errword *err) {
    ARL_GRID_STRIDE(i, T * d) {
        int64_t t = i / d, c = i % d;
        int32_t id = tokens[t];
        if (id < 0 || id >= V) {
            if (c == 0) arl_dev_error(err, ARL_ERR_RANGE, (int32_t)t);
            x[i] = 0.0f;
        } else {
            x[i] = table[(int64_t)id * d + c];
        }
    }
}

extern "C" void arl_cuda_embed(float *x, const float *table, const int32_t *tokens, int64_t T,
                               int64_t d, int64_t V) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0) return;
    k_embed<<<arl_blocks(T * d, 256), 256, 0, ctx->stream>>>(x, table, tokens, T, d, V, ctx->err);
    ARL_CUDA_LAUNCHED(ctx, "embed");
}

/* ======================= KDA decay gates (policy/kda.c arl_kda_gate_*_fwd) =============== */

__global__ void k_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                              int64_t T, int64_t H, int64_t dk, float g_min) {
    const int64_t P = H * dk;
    ARL_GRID_STRIDE(i, T * P) {
        int64_t c = i % P, h = c / dk;
        float a = expf(A_log[h]);
        g[i] = g_min * arl_sigmoidf(a * (f[i] + dt_bias[c]));
    }
}

__device__ static inline float softplus_(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

__global__ void k_gate_softplus_fwd(float *g, const float *f, const float *A_log,
                                    const float *dt_bias, int64_t T, int64_t H, int64_t dk) {
    const int64_t P = H * dk;
    ARL_GRID_STRIDE(i, T * P) {
        int64_t c = i % P, h = c / dk;
        float a = expf(A_log[h]);
        g[i] = -a * softplus_(f[i] + dt_bias[c]);
    }
}

extern "C" void arl_cuda_kda_gate_k3_fwd(float *g, const float *f, const float *A_log,
                                         const float *dt_bias, int64_t T, int64_t H, int64_t dk,
                                         float g_min) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0) return;
    k_gate_k3_fwd<<<arl_blocks(T * H * dk, 256), 256, 0, ctx->stream>>>(g, f, A_log, dt_bias, T, H,
                                                                        dk, g_min);
    ARL_CUDA_LAUNCHED(ctx, "kda_gate_k3_fwd");
}

extern "C" void arl_cuda_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log,
                                               const float *dt_bias, int64_t T, int64_t H,
                                               int64_t dk) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0) return;
    k_gate_softplus_fwd<<<arl_blocks(T * H * dk, 256), 256, 0, ctx->stream>>>(g, f, A_log, dt_bias,
                                                                              T, H, dk);
    ARL_CUDA_LAUNCHED(ctx, "kda_gate_softplus_fwd");
}

/* ======================= gated output RMSNorm (policy/kda.c arl_kda_onorm_fwd) =========== */

/* A warp a row, the rows strided over the grid's warps; the sum of squares in double with a
 * fixed order like the CPU (a tree here, a running sum there: equal to rounding of the last
 * fp32 digit).  Was a 128-thread block a row (three barriers a row). */
__global__ void k_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam,
                            const float *w, int64_t n, int64_t dv, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t row = w0; row < n; row += nw) {
        const float *x = o + row * dv;
        double ss = 0.0;
        for (int64_t i = lane; i < dv; i += 32)
            ss += (double)x[i] * x[i];
        ss = arl_warp_sum_d(ss);
        float r = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
        if (rstd && lane == 0) rstd[row] = r;
        for (int64_t i = lane; i < dv; i += 32)
            ob[row * dv + i] = w[i] * (x[i] * r) * arl_sigmoidf(gam[row * dv + i]);
    }
}

extern "C" void arl_cuda_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam,
                                       const float *w, int64_t n, int64_t dv, float eps) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (n <= 0) return;
    k_onorm_fwd<<<arl_warp_row_blocks(n), 256, 0, ctx->stream>>>(ob, rstd, o, gam, w, n, dv, eps);
    ARL_CUDA_LAUNCHED(ctx, "kda_onorm_fwd");
}

/* ======================= conv tail (policy/kda.c arl_kda_conv_tail) ====================== */

/* out[c, i] = element n + i of [tail_in[c, :]; x[:, c]] (length W-1+n); tail_out must not
 * alias tail_in (unlike the CPU function, every element is written concurrently). */
__global__ void k_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in,
                            int64_t C, int64_t W) {
    ARL_GRID_STRIDE(idx, C * (W - 1)) {
        int64_t c = idx / (W - 1), i = idx % (W - 1), m = n + i;
        float v;
        if (m >= W - 1)
            v = x[(m - (W - 1)) * C + c];
        else
            v = tail_in ? tail_in[c * (W - 1) + m] : 0.0f;
        tail_out[idx] = v;
    }
}

extern "C" void arl_cuda_kda_conv_tail(float *tail_out, const float *x, int64_t n,
                                       const float *tail_in, int64_t C, int64_t W) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (W <= 1 || C <= 0) return;
    ARL_ASSERT(tail_out != tail_in);
    k_conv_tail<<<arl_blocks(C * (W - 1), 256), 256, 0, ctx->stream>>>(tail_out, x, n, tail_in, C,
                                                                       W);
    ARL_CUDA_LAUNCHED(ctx, "kda_conv_tail");
}

/* ======================= latent cache append at a device position ======================== */

__global__ void k_cache_append_dpos(float *cache, const int64_t *pos_dev, const float *rows,
                                    int64_t n, int64_t R) {
    const int64_t pos = *pos_dev;
    ARL_GRID_STRIDE(i, n * R) {
        cache[pos * R + i] = rows[i];
    }
}

extern "C" void arl_cuda_cache_append_dpos(float *cache, const int64_t *pos_dev, const float *rows,
                                           int64_t n, int64_t R) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (n <= 0) return;
    k_cache_append_dpos<<<arl_blocks(n * R, 256), 256, 0, ctx->stream>>>(cache, pos_dev, rows, n,
                                                                         R);
    ARL_CUDA_LAUNCHED(ctx, "cache_append_dpos");
}
