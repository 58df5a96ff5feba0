/* kernels/cpu/gemm.c: GEMM and Linear maps of kernels/gemm.h over OpenBLAS cblas_sgemm, split
 * across the pool threads along the larger output dimension. */
#include "kernels/gemm.h"

#include <cblas.h>
#include <limits.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/cpu/vec.h"
#include "kernels/threadpool.h"

#if ARL_K_ASAN
#include <sanitizer/asan_interface.h>
#endif

/* Least rows or columns of a block when the FMA kernel's products are cut into more blocks than
 * threads (two of its 32-column tiles, ten of its 6-row tiles). */
#define GEMM_BLOCK_MIN 64

typedef struct gemm_args {
    arl_k_trans ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc;
    int split_m; /* 1: blocks of rows of C; 0: blocks of columns */
    int64_t dim; /* M or N, the dimension that is split */
    int64_t parts;
} gemm_args;

static int g_force_blas;

#if ARL_K_ASAN
/* rows x cols floats at row stride ld from p, the gaps between rows included (they lie inside
 * the caller's buffer, between its first and last element): a poisoned byte there is read
 * through an instrumented access, so AddressSanitizer reports it (with the caller's stack) as
 * the uninstrumented kernel's own access would have been (kernels/cpu/internal.h). */
static void extent_check(const float *p, int64_t rows, int64_t cols, int64_t ld) {
    const size_t bytes = sizeof(float) * (size_t)((rows - 1) * ld + cols);
    const char *bad = __asan_region_is_poisoned((void *)(uintptr_t)p, bytes);
    if (bad) (void)*(const volatile char *)bad;
}
#endif

void arl_k_gemm_force_blas(int on) {
    g_force_blas = on;
}

/* One product on the calling thread (M, N, K >= 1): the AVX2/FMA tile where the CPU has it
 * (kernels/cpu/gemm_fma.c), else OpenBLAS.  The choice depends on the CPU only, never on the
 * shape, so every product of a process takes the same path. */
static void sgemm_call(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc, int64_t m_full) {
#if ARL_K_ASAN /* op(A) (M, K), op(B) (K, N), C (M, N), as stored */
    extent_check(A, ta == ARL_K_NOTRANS ? M : K, ta == ARL_K_NOTRANS ? K : M, lda);
    extent_check(B, tb == ARL_K_NOTRANS ? K : N, tb == ARL_K_NOTRANS ? N : K, ldb);
    extent_check(C, M, N, ldc);
#endif
    if (!g_force_blas && arl_k_cpu_has_fma()) {
        arl_k_gemm_fma(ta == ARL_K_TRANS, tb == ARL_K_TRANS, M, N, K, alpha, A, lda, B, ldb, beta,
                       C, ldc, m_full);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta == ARL_K_TRANS ? CblasTrans : CblasNoTrans,
                tb == ARL_K_TRANS ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A,
                (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Edge i of the split (0 <= i <= parts), on a multiple of 16 except the last. */
static int64_t block_edge(const gemm_args *g, int64_t i) {
    if (i >= g->parts) return g->dim;
    return (g->dim * i / g->parts) & ~(int64_t)15;
}

static void gemm_blocks(void *vctx, int64_t begin, int64_t end) {
    const gemm_args *g = vctx;
    for (int64_t i = begin; i < end; i++) {
        int64_t b = block_edge(g, i), e = block_edge(g, i + 1);
        if (b >= e) continue;
        if (g->split_m) {
            /* rows b..e of op(A) and of C */
            const float *A = g->ta == ARL_K_NOTRANS ? g->A + b * g->lda : g->A + b;
            sgemm_call(g->ta, g->tb, e - b, g->N, g->K, g->alpha, A, g->lda, g->B, g->ldb, g->beta,
                       g->C + b * g->ldc, g->ldc, g->M);
        } else {
            /* columns b..e of op(B) and of C */
            const float *B = g->tb == ARL_K_NOTRANS ? g->B + b : g->B + b * g->ldb;
            sgemm_call(g->ta, g->tb, g->M, e - b, g->K, g->alpha, g->A, g->lda, B, g->ldb, g->beta,
                       g->C + b, g->ldc, g->M);
        }
    }
}

static void check_args(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                       int64_t ldb, int64_t ldc) {
    ARL_ASSERT(M >= 0 && N >= 0 && K >= 0);
    ARL_ASSERT(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
    ARL_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    int64_t acols = ta == ARL_K_NOTRANS ? K : M;
    int64_t bcols = tb == ARL_K_NOTRANS ? N : K;
    ARL_ASSERT(lda >= 1 && lda >= acols);
    ARL_ASSERT(ldb >= 1 && ldb >= bcols);
    ARL_ASSERT(ldc >= 1 && ldc >= N);
}

/* C = beta * C for K == 0 (BLAS semantics: beta == 0 writes zeros without reading C). */
static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++)
            C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

/* C[i, j] = alpha * (A_i . B_j) (+ beta * C[i, j]) for rows A_i of A (M, lda) and rows B_j of
 * B (N, ldb), both of length K: the few-row NT product (a Linear map of a few tokens), as dot
 * products.  OpenBLAS packs all of B for every call, which for M <= ARL_K_GEMM_SMALL_M costs
 * more than the product.  Each dot product keeps four partial sums (element k in sum k mod 4,
 * ascending k) added as (s0 + s2) + (s1 + s3), the order of kernels/vmath.h arl_k_vdot; two
 * rows of A and four of B are blocked together, which does not change any sum. */
static void gemm_small_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                          const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t K4 = K & ~(int64_t)(VEC_N - 1);
    for (int64_t i0 = 0; i0 < M; i0 += 2) {
        const int64_t mi = M - i0 < 2 ? M - i0 : 2;
        const float *a0 = A + i0 * lda, *a1 = A + (i0 + mi - 1) * lda;
        for (int64_t j0 = 0; j0 < N; j0 += 4) {
            const int64_t nj = N - j0 < 4 ? N - j0 : 4;
            const float *b[4];
            for (int64_t j = 0; j < 4; j++)
                b[j] = B + (j0 + (j < nj ? j : nj - 1)) * ldb;
            vec_f s00 = vec_set1(0.0f), s01 = s00, s02 = s00, s03 = s00;
            vec_f s10 = s00, s11 = s00, s12 = s00, s13 = s00;
            for (int64_t k = 0; k < K4; k += VEC_N) {
                vec_f x0 = vec_load(a0 + k), x1 = vec_load(a1 + k);
                vec_f y0 = vec_load(b[0] + k), y1 = vec_load(b[1] + k);
                vec_f y2 = vec_load(b[2] + k), y3 = vec_load(b[3] + k);
                s00 += x0 * y0, s01 += x0 * y1, s02 += x0 * y2, s03 += x0 * y3;
                s10 += x1 * y0, s11 += x1 * y1, s12 += x1 * y2, s13 += x1 * y3;
            }
            if (K4 < K) {
                const int64_t rem = K - K4;
                vec_f x0 = vec_load_part(a0 + K4, rem), x1 = vec_load_part(a1 + K4, rem);
                vec_f y0 = vec_load_part(b[0] + K4, rem), y1 = vec_load_part(b[1] + K4, rem);
                vec_f y2 = vec_load_part(b[2] + K4, rem), y3 = vec_load_part(b[3] + K4, rem);
                s00 += x0 * y0, s01 += x0 * y1, s02 += x0 * y2, s03 += x0 * y3;
                s10 += x1 * y0, s11 += x1 * y1, s12 += x1 * y2, s13 += x1 * y3;
            }
            float d[2][4] = {{vec_hsum(s00), vec_hsum(s01), vec_hsum(s02), vec_hsum(s03)},
                             {vec_hsum(s10), vec_hsum(s11), vec_hsum(s12), vec_hsum(s13)}};
            for (int64_t i = 0; i < mi; i++)
                for (int64_t j = 0; j < nj; j++) {
                    float *c = C + (i0 + i) * ldc + j0 + j;
                    *c = beta == 0.0f ? alpha * d[i][j] : alpha * d[i][j] + beta * *c;
                }
        }
    }
}

void arl_k_gemm(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc) {
    check_args(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    if (M <= ARL_K_GEMM_SMALL_M && ta == ARL_K_NOTRANS && tb == ARL_K_TRANS &&
        (g_force_blas || !arl_k_cpu_has_fma())) {
        gemm_small_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int threads = arl_k_threads();
    if (threads <= 1 || (double)M * (double)N * (double)K < (double)ARL_K_GEMM_SPLIT_MNK) {
        sgemm_call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, M);
        return;
    }
    gemm_args g = {ta, tb, M,   N,   K,   alpha,  beta,           A,
                   B,  C,  lda, ldb, ldc, M >= N, M >= N ? M : N, threads};
    if (!g_force_blas && arl_k_cpu_has_fma()) {
        /* up to 4 blocks per thread of at least GEMM_BLOCK_MIN rows or columns, claimed by
         * whichever thread is free (the FMA kernel's results do not depend on the cut) */
        int64_t most = g.dim / GEMM_BLOCK_MIN, want = 4 * (int64_t)threads;
        g.parts = most < threads ? threads : most < want ? most : want;
        arl_k_parallel_for_items(g.parts, gemm_blocks, &g);
        return;
    }
    arl_k_parallel_for(threads, 1, gemm_blocks, &g);
}

typedef struct batched_args {
    arl_k_trans ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc, sA, sB, sC;
} batched_args;

static void gemm_batch_items(void *vctx, int64_t begin, int64_t end) {
    const batched_args *g = vctx;
    for (int64_t b = begin; b < end; b++)
        sgemm_call(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A + b * g->sA, g->lda,
                   g->B + b * g->sB, g->ldb, g->beta, g->C + b * g->sC, g->ldc, g->M);
}

void arl_k_gemm_batched(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K,
                        float alpha, const float *A, int64_t lda, int64_t sA, const float *B,
                        int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc, int64_t sC,
                        int64_t batch) {
    check_args(ta, tb, M, N, K, lda, ldb, ldc);
    ARL_ASSERT(batch >= 0 && sA >= 0 && sB >= 0 && sC >= 0);
    if (batch == 0 || M == 0 || N == 0) return;
    if (K == 0 || batch < arl_k_threads()) {
        for (int64_t b = 0; b < batch; b++)
            arl_k_gemm(ta, tb, M, N, K, alpha, A + b * sA, lda, B + b * sB, ldb, beta, C + b * sC,
                       ldc);
        return;
    }
    batched_args g = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, sA, sB, sC};
    arl_k_parallel_for(batch, 1, gemm_batch_items, &g);
}

void arl_k_linear_fwd(float *y, const float *x, const float *W, int64_t T, int64_t in,
                      int64_t out) {
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, out, in, 1.0f, x, in > 0 ? in : 1, W, in > 0 ? in : 1,
               0.0f, y, out > 0 ? out : 1);
}

void arl_k_linear_bwd_x(float *dx, const float *dy, const float *W, int64_t T, int64_t in,
                        int64_t out) {
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, out, 1.0f, dy, out > 0 ? out : 1, W,
               in > 0 ? in : 1, 1.0f, dx, in > 0 ? in : 1);
}

void arl_k_linear_bwd_w(float *dW, const float *dy, const float *x, int64_t T, int64_t in,
                        int64_t out) {
    arl_k_gemm(ARL_K_TRANS, ARL_K_NOTRANS, out, in, T, 1.0f, dy, out > 0 ? out : 1, x,
               in > 0 ? in : 1, 1.0f, dW, in > 0 ? in : 1);
}
