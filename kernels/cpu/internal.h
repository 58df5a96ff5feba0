/* kernels/cpu/internal.h: private helpers shared by the CPU kernel files (not a contract).
 *
 * Work sizes.  A parallel-for hands a thread at least ARL_K_GRAIN elements of work: below that
 * the wake-up of a sleeping worker (tens of microseconds) costs more than it saves.  The grain
 * changes only the speed, never the bits (kernels/threadpool.h). */
#ifndef ARL_KERNELS_CPU_INTERNAL_H
#define ARL_KERNELS_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#define ARL_K_GRAIN ((int64_t)1 << 15)

/* Items of `width` elements each per thread, so that a part holds at least `elems` elements. */
static inline int64_t arl_k_grain_items(int64_t width, int64_t elems) {
    return width >= elems ? 1 : elems / (width > 0 ? width : 1);
}

/* Rows of width d per thread for memory-bound row kernels. */
static inline int64_t arl_k_row_grain(int64_t d) {
    return arl_k_grain_items(d, ARL_K_GRAIN);
}

/* Logistic sigmoid, stable for large |x| (no overflow of exp). */
static inline float arl_k_sigmoidf(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* ---- vector math (kernels/cpu/vmath.c) ---- */

/* 1 when this CPU has AVX2 (kernels/cpu/vmath_avx2.c), 0 otherwise or on other architectures. */
int arl_k_cpu_has_avx2(void);

/* Rows of the GLU and SiTU forwards, serial, with the accuracy of kernels/vmath.h:
 * h (n) = phi(g) psi(u) (SiTU, spec section 8), h = silu(g) u, y = phi(x). */
void arl_k_vsitu_glu(float *h, const float *g, const float *u, int64_t n, float beta1, float beta2);
void arl_k_vswiglu(float *h, const float *g, const float *u, int64_t n);
void arl_k_vsitu_phi(float *y, const float *x, int64_t n, float beta1);
/* Backward rows of the two GLUs, serial, accumulating (kernels/activation.h): SiTU-GLU
 * dg (n) += dh phi'(g) psi(u), du (n) += dh phi(g) psi'(u); SwiGLU dg += dh silu'(g) u,
 * du += dh silu(g).  The accuracy of kernels/vmath.h (a few ulp per factor), the same bits in
 * the 4-lane and the AVX2 build; a NaN input gives that NaN (g, u, dg, dh in that order). */
void arl_k_vsitu_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                         int64_t n, float beta1, float beta2);
void arl_k_vswiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                       int64_t n);

/* ---- GEMM on x86-64 with AVX2 + FMA (kernels/cpu/gemm_fma.c) ---- */

/* ARL_K_ASAN: 1 in a build with AddressSanitizer (gcc's and clang's spellings). */
#if defined(__SANITIZE_ADDRESS__)
#define ARL_K_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARL_K_ASAN 1
#endif
#endif
#ifndef ARL_K_ASAN
#define ARL_K_ASAN 0
#endif

/* The GEMM's inner loops (tiles, dot products, panel copies) are left uninstrumented by the
 * sanitizers: they were about half of the sanitized test pass, each of their loads checked at
 * twice to three times the cost of the arithmetic.  What stands in for the checks: every
 * product's operands are checked as whole extents at the kernel's entry (arl_k_gemm's
 * sgemm_call, kernels/cpu/gemm.c), which covers the callers' shapes and strides, and
 * tests/kernels/test_gemm.c runs every path of the kernels on operands that end (or start) at an
 * inaccessible page, which catches a kernel reading or writing past an operand in any build. */
#if defined(__GNUC__) || defined(__clang__)
#define ARL_K_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))
#else
#define ARL_K_NO_SANITIZE
#endif

/* 1 when this CPU has AVX2 and FMA (checked once), 0 otherwise or on other architectures. */
int arl_k_cpu_has_fma(void);

/* C (M, N) = alpha op(A) op(B) + beta C with the layout of arl_k_gemm, M, N, K >= 1, on the
 * calling thread; only when arl_k_cpu_has_fma().  m_full: the M of the whole product when this
 * is a block of rows of a larger one (the arithmetic of an element is chosen by it, so a split
 * never changes a result), else M. */
void arl_k_gemm_fma(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc, int64_t m_full);

/* Tests only (process-wide; set while no GEMM runs): 1 makes arl_k_gemm use OpenBLAS even where
 * the FMA kernel could run; 1 makes the FMA kernel use its 16-column (AVX2) tiles even where
 * AVX-512 has 32-column ones. */
void arl_k_gemm_force_blas(int on);
void arl_k_gemm_fma_narrow(int on);

#endif
