/* kernels/backend.h: a backend is a table of function pointers, one per kernel contract.
 *
 * Callers (policy/, learner/) hold a `const arl_k_backend *` and call `kb->rmsnorm_fwd(...)`;
 * they never test for CUDA.  Every entry has exactly the signature, the shapes and the semantics
 * of the kernel of the same name declared in kernels/<concept>.h (the contract is there, not
 * here); the compiler checks that each backend's table matches.
 *
 * Backends:
 *   arl_k_backend_cpu()  fp32 reference on host memory, always present; the entries are the
 *                        arl_k_* functions themselves and return when the result is written.
 *   (CUDA, later)        same table over device memory; the CUDA functions mirror each arl_k_*
 *                        with the same name stem and argument order plus a stream, and the
 *                        table's entries run on the backend's current stream.
 * Tables are static: the pointer returned is valid for the life of the process.
 */
#ifndef ARL_KERNELS_BACKEND_H
#define ARL_KERNELS_BACKEND_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/gemm.h"

typedef struct arl_k_backend {
    const char *name; /* "cpu", ... */

    /* kernels/gemm.h */
    void (*gemm)(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc);
    void (*gemm_batched)(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t lda, int64_t sA, const float *B,
                         int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc, int64_t sC,
                         int64_t batch);
    void (*linear_fwd)(float *y, const float *x, const float *W, int64_t T, int64_t in,
                       int64_t out);
    void (*linear_bwd_x)(float *dx, const float *dy, const float *W, int64_t T, int64_t in,
                         int64_t out);
    void (*linear_bwd_w)(float *dW, const float *dy, const float *x, int64_t T, int64_t in,
                         int64_t out);

    /* kernels/norm.h */
    void (*rmsnorm_fwd)(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                        float eps);
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int64_t n, int64_t d);
    void (*l2norm_fwd)(float *y, float *rnorm, const float *x, int64_t n, int64_t d, float eps);
    void (*l2norm_bwd)(float *dx, const float *dy, const float *x, const float *rnorm, int64_t n,
                       int64_t d);

    /* kernels/softmax.h */
    void (*softmax_fwd)(float *y, const float *x, int64_t n, int64_t d);
    void (*softmax_bwd)(float *dx, const float *dy, const float *y, int64_t n, int64_t d);
    void (*logsoftmax_fwd)(float *y, const float *x, int64_t n, int64_t d);
    void (*logsoftmax_bwd)(float *dx, const float *dy, const float *y, int64_t n, int64_t d);
    void (*logprob_fwd)(float *logp, float *lse, float *entropy, const float *logits,
                        const int32_t *targets, int64_t n, int64_t V);
    void (*logprob_bwd)(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                        const int32_t *targets, int64_t n, int64_t V);

    /* kernels/activation.h */
    void (*sigmoid_fwd)(float *y, const float *x, int64_t n);
    void (*silu_fwd)(float *y, const float *x, int64_t n);
    void (*tanh_fwd)(float *y, const float *x, int64_t n);
    void (*softplus_fwd)(float *y, const float *x, int64_t n);
    void (*gelu_tanh_fwd)(float *y, const float *x, int64_t n);
    void (*gelu_erf_fwd)(float *y, const float *x, int64_t n);
    void (*situ_phi_fwd)(float *y, const float *x, int64_t n, float beta1);
    void (*sigmoid_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*silu_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*tanh_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*softplus_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*gelu_tanh_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*gelu_erf_bwd)(float *dx, const float *dy, const float *x, int64_t n);
    void (*situ_phi_bwd)(float *dx, const float *dy, const float *x, int64_t n, float beta1);
    void (*swiglu_fwd)(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld);
    void (*swiglu_bwd)(float *dg, float *du, const float *dh, const float *g, const float *u,
                       int64_t T, int64_t f, int64_t ld);
    void (*situ_glu_fwd)(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld,
                         float beta1, float beta2);
    void (*situ_glu_bwd)(float *dg, float *du, const float *dh, const float *g, const float *u,
                         int64_t T, int64_t f, int64_t ld, float beta1, float beta2);

    /* kernels/elementwise.h */
    void (*fill)(float *y, float v, int64_t n);
    void (*copy)(float *y, const float *x, int64_t n);
    void (*add)(float *y, const float *a, const float *b, int64_t n);
    void (*mul)(float *y, const float *a, const float *b, int64_t n);
    void (*mul_acc)(float *y, const float *a, const float *b, int64_t n);
    void (*scale)(float *y, const float *x, float alpha, int64_t n);
    void (*axpy)(float *y, float alpha, const float *x, int64_t n);
    void (*scale_rows)(float *y, const float *x, const float *s, int64_t T, int64_t d);

    /* kernels/reduce.h */
    void (*sum)(float *out, const float *x, int64_t n);
    void (*sumsq)(float *out, const float *x, int64_t n);
    void (*max)(float *out, const float *x, int64_t n);
    void (*sum_rows)(float *out, const float *x, int64_t T, int64_t d);
    void (*sum_cols)(float *out, const float *x, int64_t T, int64_t d);
    void (*dot_rows)(float *out, const float *a, const float *b, int64_t T, int64_t d);

    /* kernels/topk.h */
    void (*argmax_rows)(int32_t *idx, const float *x, int64_t n, int64_t d);
    void (*topk_rows)(int32_t *idx, float *val, const float *x, int64_t n, int64_t d, int64_t k);
} arl_k_backend;

/* The CPU reference backend (static table; never NULL). */
const arl_k_backend *arl_k_backend_cpu(void);

/* The backend named "cpu" or "cuda" (the value of a --device option), in *out.  "cuda" opens
 * the process default CUDA context (kernels/cuda/cuda.h) when the thread has none; it fails
 * with ARL_ERR_UNSUPPORTED in a build without CUDA and ARL_ERR_DEVICE when no device is
 * visible, and ARL_ERR_ARG names an unknown backend.  Defined in kernels/cuda/select.c
 * (library arl_cuda, present in every build). */
arl_status arl_k_backend_get(const char *name, const arl_k_backend **out);

/* The CUDA backend table (kernels/cuda/cuda.h); NULL in a build without CUDA. */
const arl_k_backend *arl_k_backend_cuda(void);

#endif
