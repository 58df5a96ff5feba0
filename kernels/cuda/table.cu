/* kernels/cuda/table.cu: the CUDA backend table (kernels/backend.h over device memory): GEMMs
 * through cuBLAS, norms, softmax family, activations and GLUs, elementwise, reductions, top-k.
 * Each entry mirrors the arl_k_* function of the same stem (same arguments, same contract;
 * see kernels/<concept>.h) and runs on the current context's stream (kernels/cuda/cuda.h).
 * Row statistics accumulate in double like the CPU; elementwise math is fp32. */
#include <math.h>

#include "kernels/cuda/internal.cuh"

#define NT 256 /* threads per block of the row kernels */

/* ======================= GEMM (cuBLAS, row-major via the transposed problem) ============= */

static cublasComputeType_t compute_type(arl_cuda_math m) {
    switch (m) {
    case ARL_CUDA_MATH_TF32:
        return CUBLAS_COMPUTE_32F_FAST_TF32;
    case ARL_CUDA_MATH_BF16:
        return CUBLAS_COMPUTE_32F_FAST_16BF;
    default:
        return CUBLAS_COMPUTE_32F_PEDANTIC;
    }
}

static cublasOperation_t op(arl_k_trans t) {
    return t == ARL_K_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* Row-major C (M,N) = op(A) op(B) is column-major C^T (N,M) = op(B)^T op(A)^T: cuBLAS gets
 * (B, A) in that order with the same transposition flags and leading dimensions. */
static void cu_gemm(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(arl_blas_dims_ok(M, N, K, lda, ldb, ldc));
    if (M == 0 || N == 0) return;
    cublasStatus_t s =
        cublasGemmEx(c->blas, op(tb), op(ta), (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F,
                     (int)ldb, A, CUDA_R_32F, (int)lda, &beta, C, CUDA_R_32F, (int)ldc,
                     compute_type(c->math), CUBLAS_GEMM_DEFAULT);
    arl_cuda_record_blas(c, "gemm (cublasGemmEx)", s);
}

static void cu_gemm_batched(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, int64_t sA, const float *B,
                            int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc, int64_t sC,
                            int64_t batch) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(arl_blas_dims_ok(M, N, K, lda, ldb, ldc) && batch >= 0 && batch <= INT32_MAX);
    if (M == 0 || N == 0 || batch == 0) return;
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        c->blas, op(tb), op(ta), (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, (int)ldb, sB, A,
        CUDA_R_32F, (int)lda, sA, &beta, C, CUDA_R_32F, (int)ldc, sC, (int)batch,
        compute_type(c->math), CUBLAS_GEMM_DEFAULT);
    arl_cuda_record_blas(c, "gemm_batched (cublasGemmStridedBatchedEx)", s);
}

static void cu_linear_fwd(float *y, const float *x, const float *W, int64_t T, int64_t in,
                          int64_t out) {
    cu_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}
static void cu_linear_bwd_x(float *dx, const float *dy, const float *W, int64_t T, int64_t in,
                            int64_t out) {
    cu_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, out, 1.0f, dy, out, W, in, 1.0f, dx, in);
}
static void cu_linear_bwd_w(float *dW, const float *dy, const float *x, int64_t T, int64_t in,
                            int64_t out) {
    if (T == 0) return;
    cu_gemm(ARL_K_TRANS, ARL_K_NOTRANS, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

/* ======================= norms ============================================================ */

/* The row kernels (norms, softmax family, log-probs, row sums): rows of d <= ROW_WARP_D one
 * warp each (NT / 32 rows a block, a row's sums and maxima warp shuffles, no barrier: a head of
 * 128, the hidden 1024, the vocabulary of 384), wider rows a block each (TPR = NT, block
 * reductions).  A row's threads walk its columns lane, lane + TPR, ...; a warp past the last
 * row returns (with TPR = NT the grid is the rows: no block returns early). */
#define ROW_WARP_D 1024
template <int TPR> struct row_group {
    int64_t r;    /* the row */
    int64_t lane; /* the thread's first column */
    __device__ row_group()
        : r((int64_t)blockIdx.x * (NT / TPR) + threadIdx.x / TPR), lane(threadIdx.x % TPR) {}
    __device__ double sum(double v, double *sh) const {
        return TPR == 32 ? arl_warp_sum_d(v) : arl_block_sum_d(v, sh);
    }
    __device__ float max(float v, float *shf) const {
        return TPR == 32 ? arl_warp_max(v) : arl_block_max(v, shf);
    }
};
static unsigned row_blocks(int64_t n, int64_t d) {
    return (unsigned)(d <= ROW_WARP_D ? (n + NT / 32 - 1) / (NT / 32) : n);
}
/* kern<32> or kern<NT> over n rows of d columns */
#define ROWS_KERNEL(kern, n, d, stream, ...)                                                       \
    do {                                                                                           \
        if ((d) <= ROW_WARP_D)                                                                     \
            kern<32><<<row_blocks(n, d), NT, 0, (stream)>>>(__VA_ARGS__);                          \
        else                                                                                       \
            kern<NT><<<row_blocks(n, d), NT, 0, (stream)>>>(__VA_ARGS__);                          \
    } while (0)
#define ROWS_LAUNCH(name, kern, n, d, ...)                                                         \
    do {                                                                                           \
        arl_cuda_ctx *c_ = arl_cuda_need();                                                        \
        if ((n) == 0) return;                                                                      \
        ROWS_KERNEL(kern, n, d, c_->stream, __VA_ARGS__);                                          \
        ARL_CUDA_LAUNCHED(c_, name);                                                               \
    } while (0)

template <int TPR>
__global__ void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t n,
                              int64_t d, float eps) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return; /* whole warps only (TPR = NT: the grid is n) */
    const float *xr = x + R.r * d;
    float *yr = y + R.r * d;
    double ss = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        ss += (double)xr[i] * xr[i];
    ss = R.sum(ss, sh);
    float r = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t i = R.lane; i < d; i += TPR)
        yr[i] = w[i] * (xr[i] * r);
    if (rstd && R.lane == 0) rstd[R.r] = r;
}

template <int TPR>
__global__ void k_rmsnorm_bwd_x(float *dx, const float *dy, const float *x, const float *w,
                                const float *rstd, int64_t n, int64_t d) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t t = R.r;
    const float *xr = x + t * d, *dyr = dy + t * d;
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += (double)w[i] * dyr[i] * xr[i];
    s = R.sum(s, sh);
    float r = rstd[t];
    float c = (float)((double)r * r * r * s / (double)d);
    for (int64_t i = R.lane; i < d; i += TPR)
        dx[t * d + i] += r * w[i] * dyr[i] - c * xr[i];
}

/* dw[i] += sum_t dy x r (arl_colsum: deterministic, rows split over lanes). */
struct rmsnorm_dw_term {
    const float *dy, *x, *rstd;
    int64_t d;
    __device__ double operator()(int64_t t, int64_t i) const {
        return (double)dy[t * d + i] * x[t * d + i] * rstd[t];
    }
};

static void cu_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t n,
                           int64_t d, float eps) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0 && d >= 1);
    if (n == 0) return;
    ROWS_KERNEL(k_rmsnorm_fwd, n, d, c->stream, y, rstd, x, w, n, d, eps);
    ARL_CUDA_LAUNCHED(c, "rmsnorm_fwd");
}

static void cu_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int64_t n, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (n == 0) return;
    ROWS_KERNEL(k_rmsnorm_bwd_x, n, d, c->stream, dx, dy, x, w, rstd, n, d);
    if (dw) arl_colsum(c, n, d, rmsnorm_dw_term{dy, x, rstd, d}, arl_colsum_add{dw});
    ARL_CUDA_LAUNCHED(c, "rmsnorm_bwd");
}

template <int TPR>
__global__ void k_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t n, int64_t d,
                             float eps) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const float *xr = x + R.r * d;
    double ss = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        ss += (double)xr[i] * xr[i];
    ss = R.sum(ss, sh);
    float r = (float)(1.0 / sqrt(ss + (double)eps));
    for (int64_t i = R.lane; i < d; i += TPR)
        y[R.r * d + i] = xr[i] * r;
    if (rnorm && R.lane == 0) rnorm[R.r] = r;
}

template <int TPR>
__global__ void k_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm,
                             int64_t n, int64_t d) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t t = R.r;
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += (double)x[t * d + i] * dy[t * d + i];
    s = R.sum(s, sh);
    float r = rnorm[t];
    float c = (float)((double)r * r * r * s);
    for (int64_t i = R.lane; i < d; i += TPR)
        dx[t * d + i] += r * dy[t * d + i] - c * x[t * d + i];
}

static void cu_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t n, int64_t d, float eps) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0 && d >= 1);
    if (n == 0) return;
    ROWS_KERNEL(k_l2norm_fwd, n, d, c->stream, y, rnorm, x, n, d, eps);
    ARL_CUDA_LAUNCHED(c, "l2norm_fwd");
}

static void cu_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm, int64_t n,
                          int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (n == 0) return;
    ROWS_KERNEL(k_l2norm_bwd, n, d, c->stream, dx, dy, x, rnorm, n, d);
    ARL_CUDA_LAUNCHED(c, "l2norm_bwd");
}

/* ======================= softmax family =================================================== */

template <int TPR> __global__ void k_softmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    __shared__ double sh[33];
    __shared__ float shf[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const float *xr = x + R.r * d;
    float *yr = y + R.r * d;
    float m = -INFINITY;
    for (int64_t i = R.lane; i < d; i += TPR)
        m = fmaxf(m, xr[i]);
    m = R.max(m, shf);
    if (m == -INFINITY) {
        for (int64_t i = R.lane; i < d; i += TPR)
            yr[i] = 0.0f;
        return;
    }
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += expf(xr[i] - m);
    s = R.sum(s, sh);
    double inv = 1.0 / s;
    for (int64_t i = R.lane; i < d; i += TPR)
        yr[i] = (float)(expf(xr[i] - m) * inv);
}

template <int TPR>
__global__ void k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t o = R.r * d;
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += (double)y[o + i] * dy[o + i];
    s = R.sum(s, sh);
    for (int64_t i = R.lane; i < d; i += TPR)
        dx[o + i] += (float)(y[o + i] * (dy[o + i] - s));
}

template <int TPR>
__global__ void k_logsoftmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    __shared__ double sh[33];
    __shared__ float shf[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t o = R.r * d;
    float m = -INFINITY;
    for (int64_t i = R.lane; i < d; i += TPR)
        m = fmaxf(m, x[o + i]);
    m = R.max(m, shf);
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += expf(x[o + i] - m);
    s = R.sum(s, sh);
    double lse = (double)m + log(s);
    for (int64_t i = R.lane; i < d; i += TPR)
        y[o + i] = (float)((double)x[o + i] - lse);
}

template <int TPR>
__global__ void k_logsoftmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t o = R.r * d;
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += dy[o + i];
    s = R.sum(s, sh);
    for (int64_t i = R.lane; i < d; i += TPR)
        dx[o + i] += (float)(dy[o + i] - expf(y[o + i]) * s);
}

template <int TPR>
__global__ void k_logprob_fwd(float *logp, float *lse, float *entropy, const float *z,
                              const int32_t *targets, int64_t n, int64_t V) {
    __shared__ double sh[33];
    __shared__ float shf[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t t = R.r, o = t * V;
    float m = -INFINITY;
    for (int64_t j = R.lane; j < V; j += TPR)
        m = fmaxf(m, z[o + j]);
    m = R.max(m, shf);
    double s = 0.0, sz = 0.0;
    for (int64_t j = R.lane; j < V; j += TPR) {
        float zm = z[o + j] - m;
        double e = expf(zm);
        s += e;
        sz += e * zm;
    }
    s = R.sum(s, sh);
    sz = R.sum(sz, sh);
    if (R.lane == 0) {
        double l = (double)m + log(s);
        int32_t y = targets[t];
        logp[t] = (y < 0 || y >= V) ? 0.0f : (float)((double)z[o + y] - l);
        if (lse) lse[t] = (float)l;
        if (entropy) entropy[t] = (float)(log(s) - sz / s);
    }
}

template <int TPR>
__global__ void k_logprob_bwd(float *dz, const float *dlogp, const float *z, const float *lse,
                              const int32_t *targets, int64_t n, int64_t V) {
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t t = R.r, o = t * V;
    int32_t y = targets[t];
    if (y < 0 || y >= V) return;
    float g = dlogp[t], l = lse[t];
    for (int64_t j = R.lane; j < V; j += TPR)
        dz[o + j] += g * ((j == y ? 1.0f : 0.0f) - expf(z[o + j] - l));
}

static void cu_softmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    ROWS_LAUNCH("softmax_fwd", k_softmax_fwd, n, d, y, x, n, d);
}
static void cu_softmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    ROWS_LAUNCH("softmax_bwd", k_softmax_bwd, n, d, dx, dy, y, n, d);
}
static void cu_logsoftmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    ROWS_LAUNCH("logsoftmax_fwd", k_logsoftmax_fwd, n, d, y, x, n, d);
}
static void cu_logsoftmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    ROWS_LAUNCH("logsoftmax_bwd", k_logsoftmax_bwd, n, d, dx, dy, y, n, d);
}
static void cu_logprob_fwd(float *logp, float *lse, float *entropy, const float *logits,
                           const int32_t *targets, int64_t n, int64_t V) {
    ROWS_LAUNCH("logprob_fwd", k_logprob_fwd, n, V, logp, lse, entropy, logits, targets, n, V);
}
static void cu_logprob_bwd(float *dlogits, const float *dlogp, const float *logits,
                           const float *lse, const int32_t *targets, int64_t n, int64_t V) {
    ROWS_LAUNCH("logprob_bwd", k_logprob_bwd, n, V, dlogits, dlogp, logits, lse, targets, n, V);
}

/* ======================= activations (formulas of kernels/cpu/activation.c) ============== */

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_C 0.044715f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

enum { A_SIGMOID, A_SILU, A_TANH, A_SOFTPLUS, A_GELU_TANH, A_GELU_ERF, A_SITU_PHI };

__device__ static inline float act_f(int k, float x, float b) {
    switch (k) {
    case A_SIGMOID:
        return arl_sigmoidf(x);
    case A_SILU:
        return arl_silu(x);
    case A_TANH:
        return tanhf(x);
    case A_SOFTPLUS:
        return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    case A_GELU_TANH: {
        float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
        return 0.5f * x * (1.0f + t);
    }
    case A_GELU_ERF:
        return 0.5f * x * (1.0f + erff(x * INV_SQRT_2));
    default:
        return arl_situ_phi(x, b);
    }
}

__device__ static inline float act_g(int k, float x, float b) {
    switch (k) {
    case A_SIGMOID:
        return arl_sigmoidf(x) * arl_sigmoidf(-x);
    case A_SILU:
        return arl_silu_grad(x);
    case A_TANH:
        return arl_d_sech2(x);
    case A_SOFTPLUS:
        return arl_sigmoidf(x);
    case A_GELU_TANH: {
        float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
        return 0.5f * (1.0f + t) +
               0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
    }
    case A_GELU_ERF:
        return 0.5f * (1.0f + erff(x * INV_SQRT_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
    default:
        return arl_situ_phi_grad(x, b);
    }
}

__global__ void k_act_fwd(int k, float *y, const float *x, int64_t n, float b) {
    ARL_GRID_STRIDE(i, n) y[i] = act_f(k, x[i], b);
}
__global__ void k_act_bwd(int k, float *dx, const float *dy, const float *x, int64_t n, float b) {
    ARL_GRID_STRIDE(i, n) dx[i] += dy[i] * act_g(k, x[i], b);
}

static void act_fwd(int k, const char *name, float *y, const float *x, int64_t n, float b) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0);
    if (n == 0) return;
    k_act_fwd<<<arl_blocks(n, NT), NT, 0, c->stream>>>(k, y, x, n, b);
    ARL_CUDA_LAUNCHED(c, name);
}
static void act_bwd(int k, const char *name, float *dx, const float *dy, const float *x, int64_t n,
                    float b) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0);
    if (n == 0) return;
    k_act_bwd<<<arl_blocks(n, NT), NT, 0, c->stream>>>(k, dx, dy, x, n, b);
    ARL_CUDA_LAUNCHED(c, name);
}

#define ACT_PAIR(stem, K)                                                                          \
    static void cu_##stem##_fwd(float *y, const float *x, int64_t n) {                             \
        act_fwd(K, #stem "_fwd", y, x, n, 1.0f);                                                   \
    }                                                                                              \
    static void cu_##stem##_bwd(float *dx, const float *dy, const float *x, int64_t n) {           \
        act_bwd(K, #stem "_bwd", dx, dy, x, n, 1.0f);                                              \
    }
ACT_PAIR(sigmoid, A_SIGMOID)
ACT_PAIR(silu, A_SILU)
ACT_PAIR(tanh, A_TANH)
ACT_PAIR(softplus, A_SOFTPLUS)
ACT_PAIR(gelu_tanh, A_GELU_TANH)
ACT_PAIR(gelu_erf, A_GELU_ERF)

static void cu_situ_phi_fwd(float *y, const float *x, int64_t n, float beta1) {
    act_fwd(A_SITU_PHI, "situ_phi_fwd", y, x, n, beta1);
}
static void cu_situ_phi_bwd(float *dx, const float *dy, const float *x, int64_t n, float beta1) {
    act_bwd(A_SITU_PHI, "situ_phi_bwd", dx, dy, x, n, beta1);
}

/* GLUs: situ != 0 gives SiTU-GLU with caps b1, b2; otherwise SwiGLU.  Outputs fp32 (h; dg, du
 * +=) or, where those are NULL, bf16 (hb; dgb, dub =: the gradients added to zero, rounded to
 * nearest even - the fp32 outputs on zeroed buffers, rounded). */
__global__ void k_glu_fwd(int situ, float *h, uint16_t *hb, const float *g, const float *u,
                          int64_t T, int64_t f, int64_t ld, float b1, float b2) {
    ARL_GRID_STRIDE(i, T * f) {
        int64_t t = i / f, j = i % f;
        const float v = arl_glu_value(situ, g[t * ld + j], u[t * ld + j], b1, b2);
        if (h)
            h[i] = v;
        else
            hb[i] = (uint16_t)arl_bf16_rn_bits(v);
    }
}

__global__ void k_glu_bwd(int situ, float *dg, float *du, uint16_t *dgb, uint16_t *dub,
                          const float *dh, const float *g, const float *u, int64_t T, int64_t f,
                          int64_t ld, float b1, float b2) {
    ARL_GRID_STRIDE(i, T * f) {
        int64_t t = i / f, j = i % f, o = t * ld + j;
        float a, b;
        if (dgb) {
            arl_glu_grads(situ, dh[i], g[o], u[o], b1, b2, 0.0f, 0.0f, &a, &b);
            dgb[o] = (uint16_t)arl_bf16_rn_bits(a);
            dub[o] = (uint16_t)arl_bf16_rn_bits(b);
        } else {
            arl_glu_grads(situ, dh[i], g[o], u[o], b1, b2, dg[o], du[o], &a, &b);
            dg[o] = a;
            du[o] = b;
        }
    }
}

static void glu_fwd(int situ, float *h, uint16_t *hb, const float *g, const float *u, int64_t T,
                    int64_t f, int64_t ld, float b1, float b2) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(T >= 0 && f >= 0 && ld >= f);
    if (T * f == 0) return;
    k_glu_fwd<<<arl_blocks(T * f, NT), NT, 0, c->stream>>>(situ, h, hb, g, u, T, f, ld, b1, b2);
    ARL_CUDA_LAUNCHED(c, "glu_fwd");
}
static void glu_bwd(int situ, float *dg, float *du, uint16_t *dgb, uint16_t *dub, const float *dh,
                    const float *g, const float *u, int64_t T, int64_t f, int64_t ld, float b1,
                    float b2) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(T >= 0 && f >= 0 && ld >= f);
    if (T * f == 0) return;
    k_glu_bwd<<<arl_blocks(T * f, NT), NT, 0, c->stream>>>(situ, dg, du, dgb, dub, dh, g, u, T, f,
                                                           ld, b1, b2);
    ARL_CUDA_LAUNCHED(c, "glu_bwd");
}
extern "C" void arl_cuda_glu_fwd_bf16(uint16_t *h, const float *g, const float *u, int64_t T,
                                      int64_t f, int64_t ld, int32_t situ, float b1, float b2) {
    glu_fwd(situ, NULL, h, g, u, T, f, ld, b1, b2);
}
extern "C" void arl_cuda_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                                      const float *u, int64_t T, int64_t f, int64_t ld,
                                      int32_t situ, float b1, float b2) {
    glu_bwd(situ, NULL, NULL, dg, du, dh, g, u, T, f, ld, b1, b2);
}
static void cu_swiglu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f,
                          int64_t ld) {
    glu_fwd(0, h, NULL, g, u, T, f, ld, 1.0f, 1.0f);
}
static void cu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                          int64_t T, int64_t f, int64_t ld) {
    glu_bwd(0, dg, du, NULL, NULL, dh, g, u, T, f, ld, 1.0f, 1.0f);
}
static void cu_situ_glu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f,
                            int64_t ld, float b1, float b2) {
    glu_fwd(1, h, NULL, g, u, T, f, ld, b1, b2);
}
static void cu_situ_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                            int64_t T, int64_t f, int64_t ld, float b1, float b2) {
    glu_bwd(1, dg, du, NULL, NULL, dh, g, u, T, f, ld, b1, b2);
}

/* ======================= elementwise ====================================================== */

enum { E_FILL, E_COPY, E_ADD, E_MUL, E_MUL_ACC, E_SCALE, E_AXPY };

__global__ void k_elem(int k, float *y, const float *a, const float *b, float s, int64_t n) {
    ARL_GRID_STRIDE(i, n) {
        switch (k) {
        case E_FILL:
            y[i] = s;
            break;
        case E_COPY:
            y[i] = a[i];
            break;
        case E_ADD:
            y[i] = a[i] + b[i];
            break;
        case E_MUL:
            y[i] = a[i] * b[i];
            break;
        case E_MUL_ACC:
            y[i] += a[i] * b[i];
            break;
        case E_SCALE:
            y[i] = s * a[i];
            break;
        default:
            y[i] += s * a[i];
            break;
        }
    }
}

static void elem(int k, const char *name, float *y, const float *a, const float *b, float s,
                 int64_t n) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0);
    if (n == 0) return;
    k_elem<<<arl_blocks(n, NT), NT, 0, c->stream>>>(k, y, a, b, s, n);
    ARL_CUDA_LAUNCHED(c, name);
}

static void cu_fill(float *y, float v, int64_t n) {
    elem(E_FILL, "fill", y, NULL, NULL, v, n);
}
static void cu_copy(float *y, const float *x, int64_t n) {
    elem(E_COPY, "copy", y, x, NULL, 0.0f, n);
}
static void cu_add(float *y, const float *a, const float *b, int64_t n) {
    elem(E_ADD, "add", y, a, b, 0.0f, n);
}
static void cu_mul(float *y, const float *a, const float *b, int64_t n) {
    elem(E_MUL, "mul", y, a, b, 0.0f, n);
}
static void cu_mul_acc(float *y, const float *a, const float *b, int64_t n) {
    elem(E_MUL_ACC, "mul_acc", y, a, b, 0.0f, n);
}
static void cu_scale(float *y, const float *x, float alpha, int64_t n) {
    elem(E_SCALE, "scale", y, x, NULL, alpha, n);
}
static void cu_axpy(float *y, float alpha, const float *x, int64_t n) {
    elem(E_AXPY, "axpy", y, x, NULL, alpha, n);
}

__global__ void k_scale_rows(float *y, const float *x, const float *s, int64_t T, int64_t d) {
    ARL_GRID_STRIDE(i, T * d) y[i] = s[i / d] * x[i];
}
static void cu_scale_rows(float *y, const float *x, const float *s, int64_t T, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (T * d == 0) return;
    k_scale_rows<<<arl_blocks(T * d, NT), NT, 0, c->stream>>>(y, x, s, T, d);
    ARL_CUDA_LAUNCHED(c, "scale_rows");
}

/* ======================= reductions ======================================================= */

/* Two passes with a fixed grid: block b sums its grid-stride elements (fixed order for a
 * given n), then one block adds the partials in order: deterministic run to run. */
#define RED_BLOCKS 256
enum { R_SUM, R_SUMSQ, R_MAX };

__global__ void k_reduce_partial(int k, double *part, const float *x, int64_t n) {
    __shared__ double sh[33];
    __shared__ float shf[33];
    if (k == R_MAX) {
        float m = -INFINITY;
        int nan = 0;
        ARL_GRID_STRIDE(i, n) {
            float v = x[i];
            if (v != v) nan = 1;
            m = fmaxf(m, v);
        }
        nan = __syncthreads_or(nan);
        m = arl_block_max(m, shf);
        if (threadIdx.x == 0) part[blockIdx.x] = nan ? (double)NAN : (double)m;
    } else {
        double s = 0.0;
        ARL_GRID_STRIDE(i, n) s += k == R_SUM ? (double)x[i] : (double)x[i] * x[i];
        s = arl_block_sum_d(s, sh);
        if (threadIdx.x == 0) part[blockIdx.x] = s;
    }
}

__global__ void k_reduce_final(int k, float *out, const double *part, int np) {
    __shared__ double sh[33];
    if (k == R_MAX) {
        if (threadIdx.x == 0) {
            double m = -INFINITY;
            int nan = 0;
            for (int i = 0; i < np; i++) {
                if (part[i] != part[i]) nan = 1;
                m = part[i] > m ? part[i] : m;
            }
            *out = nan ? NAN : (float)m;
        }
        return;
    }
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        s += part[i];
    s = arl_block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = (float)s;
}

static void reduce(int k, const char *name, float *out, const float *x, int64_t n) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n >= 0);
    int nb = n == 0 ? 1 : (int)(arl_blocks(n, NT) < RED_BLOCKS ? arl_blocks(n, NT) : RED_BLOCKS);
    k_reduce_partial<<<nb, NT, 0, c->stream>>>(k, c->partials, x, n);
    k_reduce_final<<<1, NT, 0, c->stream>>>(k, out, c->partials, nb);
    ARL_CUDA_LAUNCHED(c, name);
}

static void cu_sum(float *out, const float *x, int64_t n) {
    reduce(R_SUM, "sum", out, x, n);
}
static void cu_sumsq(float *out, const float *x, int64_t n) {
    reduce(R_SUMSQ, "sumsq", out, x, n);
}
static void cu_max(float *out, const float *x, int64_t n) {
    reduce(R_MAX, "max", out, x, n);
}

template <int TPR>
__global__ void k_row_dot(float *out, const float *a, const float *b, int64_t n, int64_t d) {
    __shared__ double sh[33];
    const row_group<TPR> R;
    if (R.r >= n) return;
    const int64_t o = R.r * d;
    double s = 0.0;
    for (int64_t i = R.lane; i < d; i += TPR)
        s += b ? (double)a[o + i] * b[o + i] : (double)a[o + i];
    s = R.sum(s, sh);
    if (R.lane == 0) out[R.r] = (float)s;
}

__global__ void k_sum_cols(float *out, const float *x, int64_t T, int64_t d) {
    ARL_GRID_STRIDE(j, d) {
        double s = 0.0;
        for (int64_t t = 0; t < T; t++)
            s += x[t * d + j];
        out[j] = (float)s;
    }
}

static void cu_sum_rows(float *out, const float *x, int64_t T, int64_t d) {
    ROWS_LAUNCH("sum_rows", k_row_dot, T, d, out, x, (const float *)NULL, T, d);
}
static void cu_dot_rows(float *out, const float *a, const float *b, int64_t T, int64_t d) {
    ROWS_LAUNCH("dot_rows", k_row_dot, T, d, out, a, b, T, d);
}
static void cu_sum_cols(float *out, const float *x, int64_t T, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (d == 0) return;
    k_sum_cols<<<arl_blocks(d, 128), 128, 0, c->stream>>>(out, x, T, d);
    ARL_CUDA_LAUNCHED(c, "sum_cols");
}

/* ======================= selection ======================================================== */

/* i ranks above j (kernels/topk.h): larger value, NaN below every number, ties to lower index. */
__device__ static inline bool ranks_above(float xi, int64_t i, float xj, int64_t j) {
    bool ni = xi != xi, nj = xj != xj;
    if (ni || nj) return ni == nj ? i < j : nj;
    if (xi != xj) return xi > xj;
    return i < j;
}

/* (v, i) = the better of itself and lane ^ o's candidate; i < 0: no candidate */
__device__ static inline void argmax_take_xor(float &v, int64_t &i, int o) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && (i < 0 || ranks_above(ov, oi, v, i))) v = ov, i = oi;
}
__device__ static inline void argmax_warp(float &v, int64_t &i) {
    for (int o = 16; o > 0; o >>= 1)
        argmax_take_xor(v, i, o);
}

/* Rows of d <= ROW_WARP_D a warp each, wider ones a block (row_group); ranks_above is a total
 * order, so the winner does not depend on the order of the comparisons. */
template <int TPR>
__global__ void k_argmax_rows(int32_t *idx, const float *x, int64_t n, int64_t d) {
    __shared__ float sv[NT / 32];
    __shared__ int64_t si[NT / 32];
    const row_group<TPR> g;
    if (g.r >= n) return;
    const float *xr = x + g.r * d;
    float bv = NAN;
    int64_t bi = -1;
    for (int64_t i = g.lane; i < d; i += TPR)
        if (bi < 0 || ranks_above(xr[i], i, bv, bi)) {
            bv = xr[i];
            bi = i;
        }
    argmax_warp(bv, bi);
    if (TPR > 32) { /* the warps' winners through shared memory to warp 0 */
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        if (lane == 0) sv[w] = bv, si[w] = bi;
        __syncthreads();
        if (w != 0) return;
        bv = lane < NT / 32 ? sv[lane] : NAN;
        bi = lane < NT / 32 ? si[lane] : -1;
        argmax_warp(bv, bi);
    }
    if (g.lane == 0) idx[g.r] = (int32_t)bi;
}

static void cu_argmax_rows(int32_t *idx, const float *x, int64_t n, int64_t d) {
    ROWS_LAUNCH("argmax_rows", k_argmax_rows, n, d, idx, x, n, d);
}

/* One thread per row: insertion into the sorted k best (k <= 64 kept in local memory). */
#define TOPK_MAX 64
__global__ void k_topk_rows(int32_t *idx, float *val, const float *x, int64_t n, int64_t d,
                            int64_t k) {
    ARL_GRID_STRIDE(t, n) {
        float bv[TOPK_MAX];
        int64_t bi[TOPK_MAX];
        int m = 0;
        const float *xr = x + t * d;
        for (int64_t i = 0; i < d; i++) {
            float v = xr[i];
            if (m == k && !ranks_above(v, i, bv[m - 1], bi[m - 1])) continue;
            int p = m < k ? m++ : m - 1;
            while (p > 0 && ranks_above(v, i, bv[p - 1], bi[p - 1])) {
                bv[p] = bv[p - 1];
                bi[p] = bi[p - 1];
                p--;
            }
            bv[p] = v;
            bi[p] = i;
        }
        for (int j = 0; j < m; j++) {
            idx[t * k + j] = (int32_t)bi[j];
            if (val) val[t * k + j] = bv[j];
        }
    }
}

static void cu_topk_rows(int32_t *idx, float *val, const float *x, int64_t n, int64_t d,
                         int64_t k) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(k >= 0 && k <= d && k <= TOPK_MAX);
    if (n == 0 || k == 0) return;
    k_topk_rows<<<arl_blocks(n, 64), 64, 0, c->stream>>>(idx, val, x, n, d, k);
    ARL_CUDA_LAUNCHED(c, "topk_rows");
}

/* ======================= the table ======================================================== */

static const arl_k_backend cuda_backend = {
    "cuda",
    cu_gemm,
    cu_gemm_batched,
    cu_linear_fwd,
    cu_linear_bwd_x,
    cu_linear_bwd_w,
    cu_rmsnorm_fwd,
    cu_rmsnorm_bwd,
    cu_l2norm_fwd,
    cu_l2norm_bwd,
    cu_softmax_fwd,
    cu_softmax_bwd,
    cu_logsoftmax_fwd,
    cu_logsoftmax_bwd,
    cu_logprob_fwd,
    cu_logprob_bwd,
    cu_sigmoid_fwd,
    cu_silu_fwd,
    cu_tanh_fwd,
    cu_softplus_fwd,
    cu_gelu_tanh_fwd,
    cu_gelu_erf_fwd,
    cu_situ_phi_fwd,
    cu_sigmoid_bwd,
    cu_silu_bwd,
    cu_tanh_bwd,
    cu_softplus_bwd,
    cu_gelu_tanh_bwd,
    cu_gelu_erf_bwd,
    cu_situ_phi_bwd,
    cu_swiglu_fwd,
    cu_swiglu_bwd,
    cu_situ_glu_fwd,
    cu_situ_glu_bwd,
    cu_fill,
    cu_copy,
    cu_add,
    cu_mul,
    cu_mul_acc,
    cu_scale,
    cu_axpy,
    cu_scale_rows,
    cu_sum,
    cu_sumsq,
    cu_max,
    cu_sum_rows,
    cu_sum_cols,
    cu_dot_rows,
    cu_argmax_rows,
    cu_topk_rows,
};

extern "C" const arl_k_backend *arl_cuda_backend(void) {
    return &cuda_backend;
}

extern "C" const arl_k_backend *arl_k_backend_cuda(void) {
    return &cuda_backend;
}
