/* kernels/gemm.h: matrix products of the CPU backend (an AVX2/FMA kernel or OpenBLAS sgemm) and
 * the Linear map convention of spec/policy.md section 1.2.
 *
 * It is: row-major fp32 C = alpha * op(A) op(B) + beta * C, a strided-batched form, and the three
 * products of a Linear layer (forward, input gradient, weight gradient).  It is not: a tensor
 * library (no broadcasting, no dtype other than fp32), and it does not allocate.
 *
 * Layout: every matrix is row-major with a leading dimension ld (elements between the starts of
 * consecutive rows, ld >= the row length stored, and ld >= 1).
 *   op(A) is (M, K): A is stored (M, lda) when ta == ARL_K_NOTRANS, (K, lda) when ARL_K_TRANS.
 *   op(B) is (K, N): B is stored (K, ldb) when tb == ARL_K_NOTRANS, (N, ldb) when ARL_K_TRANS.
 *   C is (M, N) stored (M, ldc).
 * beta == 0 means C is not read (NaN or garbage in C is overwritten), as in BLAS.  K == 0 gives
 * C = beta * C.  C must not overlap A or B.
 *
 * Implementation: on x86-64 CPUs with AVX2 and FMA every product runs on the register-tile
 * kernel of kernels/cpu/gemm_fma.c (chosen at run time; the Debian OpenBLAS falls back to slow
 * generic kernels on CPUs it does not know); elsewhere OpenBLAS sgemm computes it, except that a
 * product with M <= ARL_K_GEMM_SMALL_M, op(A) = A and op(B) = B^T (the Linear map of a few
 * tokens: decode steps, small expert groups) is computed as dot products of row i of A and row j
 * of B with the fixed summation order of kernels/vmath.h arl_k_vdot, times alpha (plus beta * C):
 * OpenBLAS would pack all of B for every call.
 *
 * Threads and determinism (kernels/threadpool.h): a product with M*N*K >= ARL_K_GEMM_SPLIT_MNK
 * is cut along its larger output dimension into one block per pool thread (block edges on
 * multiples of 16), each computed on one thread; with the AVX2/FMA kernel into up to four
 * blocks per thread of at least 64 rows or columns, claimed by whichever thread is free
 * (kernels/threadpool.h arl_k_parallel_for_items); smaller products are one call.  Results are
 * bit-identical run to run for a fixed thread count (the cut depends only on the shape and the
 * thread count); with the AVX2/FMA kernel also across thread counts.  With OpenBLAS they may
 * differ across thread counts in the last bits: its optimised kernels (Haswell, SkylakeX) round
 * the edge tiles of a block differently from interior tiles, so moving a block edge moves
 * rounding (measured: up to half of the shapes tested differ).  CPUs that take different paths
 * (fused or separate multiply-adds) give results that differ in the last bits.
 *
 * Accuracy: fp32 with fp32 accumulation; |C - C_exact| <= ~K * 2^-24 * sum|a||b|.
 */
#ifndef ARL_KERNELS_GEMM_H
#define ARL_KERNELS_GEMM_H

#include <stdint.h>

typedef enum arl_k_trans {
    ARL_K_NOTRANS = 0,
    ARL_K_TRANS = 1,
} arl_k_trans;

/* Products with at least this many multiply-adds are split across the pool threads. */
#define ARL_K_GEMM_SPLIT_MNK ((int64_t)1 << 20)

/* NT products with at most this many rows M are computed as dot products (see above). */
#define ARL_K_GEMM_SMALL_M 4

/* C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C.  M, N, K >= 0, each <= INT32_MAX. */
void arl_k_gemm(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc);

/* batch independent products: for b in [0, batch),
 *   C + b*sC = alpha * op(A + b*sA) op(B + b*sB) + beta * (C + b*sC)
 * with the layout of arl_k_gemm for each.  Strides are in elements; sA or sB may be 0 (one
 * operand shared by all products); the C blocks must not overlap.  With batch >= the pool's
 * thread count each product is one OpenBLAS call and products run in parallel; otherwise each
 * product is an arl_k_gemm. */
void arl_k_gemm_batched(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K,
                        float alpha, const float *A, int64_t lda, int64_t sA, const float *B,
                        int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc, int64_t sC,
                        int64_t batch);

/* ---- Linear maps, spec section 1.2: W is (out, in), a token is a row, y = x W^T ----
 * T tokens (rows), `in` input features, `out` output features; all contiguous (ld = width).
 * Forward overwrites y; the backward products ACCUMULATE (+=) into dx and dW, like every
 * backward kernel. */

/* y (T, out) = x (T, in) W^T, W (out, in). */
void arl_k_linear_fwd(float *y, const float *x, const float *W, int64_t T, int64_t in, int64_t out);

/* dx (T, in) += dy (T, out) W, W (out, in). */
void arl_k_linear_bwd_x(float *dx, const float *dy, const float *W, int64_t T, int64_t in,
                        int64_t out);

/* dW (out, in) += dy^T x, dy (T, out), x (T, in).  T == 0 leaves dW unchanged. */
void arl_k_linear_bwd_w(float *dW, const float *dy, const float *x, int64_t T, int64_t in,
                        int64_t out);

#endif
