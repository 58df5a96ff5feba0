/* kernels/cpu/gemm_fma.c: the GEMM of kernels/gemm.h for x86-64 CPUs with AVX2 and FMA, chosen
 * at run time (kernels/cpu/gemm.c calls it when arl_k_cpu_has_fma() says so; elsewhere OpenBLAS
 * does the work).  Not a general BLAS: a register tile of 6 rows x 16 columns (AVX2) or 6 x 32
 * (AVX-512, where present); op(A) read in place, or copied when it is A^T (whose rows are
 * strided) and N is large enough to repay the copy; op(B) copied into a panel (8 x 8 blocks
 * transposed in registers for B^T) unless its rows are contiguous and M is small; a Linear map of
 * at most 16 (32) tokens swaps the roles (C^T = B A^T, the tokens are the panel and the weights are
 * read in place), one row of A uses a row kernel (row_nn), and an NT product of at most GEMM_DOT_M
 * rows dot products (dots_nt).
 *
 * Why it exists: the Debian OpenBLAS (0.3.21) picks its SSE3 "Prescott" kernels on CPUs it does
 * not know, which is most current server CPUs; the tiles here run 2-5x faster on them.  Where
 * OpenBLAS does know the CPU (an AMD EPYC, Zen), the tiles run at 0.77-1.3x its single-thread
 * rate (bench_kernels, one thread: 1.2-1.3x at the tiny config's 64 x 64 x 64, 0.97-1.09x at
 * its larger products, M 256-384 by N, K 128-384; 0.77-0.92x at the mini config's 512 x 1024 x
 * 1024 and 1024 x 1024 x 512).
 *
 * Arithmetic of one element (the contract of kernels/gemm.h, plus a fixed order): K is cut into
 * blocks of GEMM_KC; within a block the products are accumulated with fused multiply-adds in
 * ascending k, starting from 0; the first block gives C = alpha * s + beta * C (alpha * s when
 * beta == 0: C is not read), each later block C = C + alpha * s.  That holds for both tile
 * widths, the swapped form and row_nn, so they give the same bits.  NT products of at most
 * GEMM_DOT_M rows (a Linear map of one to four tokens) are dot products instead (lanes k mod 8,
 * then a fixed reduction).  Nothing depends on where the element sits in its tile or on how a
 * caller splits N across threads (or M, since the dot-product choice is made on the whole
 * product's M), so results are bit-identical for any thread count.  Accuracy: the fp32
 * dot-product bound of kernels/gemm.h.
 *
 * Under the sanitizers this file's loops run uninstrumented (ARL_K_NO_SANITIZE; what checks
 * their accesses instead: kernels/cpu/internal.h).
 */
#include "kernels/cpu/internal.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <stdatomic.h>

#define GEMM_MR 6      /* rows of a tile */
#define GEMM_NR 16     /* columns of a tile: two 8-lane registers (AVX2) */
#define GEMM_NR_MAX 32 /* ... or two 16-lane registers (AVX-512) */
#define GEMM_KC 256    /* k per block: a packed panel is GEMM_KC x 16 or 32 floats (16/32 KiB) */
#define GEMM_DOT_M 4   /* NT products of at most this many rows run as dot products */
/* op(A) = A^T is copied GEMM_MC rows at a time (GEMM_MC x GEMM_KC floats, 72 KiB) when N exceeds
 * GEMM_PACK_A_N (with at most 4 panels of op(B) the copy is reused too little to pay). */
#define GEMM_MC 72
#define GEMM_PACK_A_N 64
/* op(B) = B is copied into the panel too when M exceeds GEMM_PACK_B_M: in place, the tile reads
 * kc rows ldb apart, which for ldb a multiple of 1 KiB fall in a few sets of the L1 cache; with
 * at most 6 tiles reusing a panel (M <= 32), the copy costs more than it saves. */
#define GEMM_PACK_B_M 32

int arl_k_cpu_has_fma(void) {
    static atomic_int known = -1; /* the answer never changes: a racing first call is harmless */
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v;
}

static int g_narrow; /* tests: 16-column tiles even where AVX-512 is present */

void arl_k_gemm_fma_narrow(int on) {
    g_narrow = on;
}

static int use_wide_tiles(void) {
    static atomic_int known = -1;
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        v = __builtin_cpu_supports("avx512f") != 0;
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v && !g_narrow;
}

/* C^T = alpha s + beta C^T for the mr x nr corner of a tile's sums s (row stride ns): tile element
 * (i, j) goes to C[j * ldc + i], so each row j of C receives mr consecutive values. */
ARL_K_NO_SANITIZE static void tile_store_t(const float *s, int64_t ns, float alpha, float beta,
                                           int first, float *C, int64_t ldc, int64_t mr,
                                           int64_t nr) {
    for (int64_t j = 0; j < nr; j++) {
        float *c = C + j * ldc;
        if (!first)
            for (int64_t i = 0; i < mr; i++)
                c[i] = c[i] + alpha * s[i * ns + j];
        else if (beta == 0.0f)
            for (int64_t i = 0; i < mr; i++)
                c[i] = alpha * s[i * ns + j];
        else
            for (int64_t i = 0; i < mr; i++)
                c[i] = alpha * s[i * ns + j] + beta * c[i];
    }
}

/* tile with 32 columns (two 16-lane registers): the same arithmetic per element. */
ARL_K_NO_SANITIZE __attribute__((target("avx512f"))) static void
tile512(int64_t kc, const float *const a[GEMM_MR], int64_t as, const float *b, int64_t bs,
        float alpha, float beta, int first, float *C, int64_t ldc, int64_t mr, int64_t nr,
        int trans_c) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * bs), b1 = _mm512_loadu_ps(b + k * bs + 16);
        const int64_t o = k * as;
        __m512 x = _mm512_set1_ps(a0[o]);
        c00 = _mm512_fmadd_ps(x, b0, c00), c01 = _mm512_fmadd_ps(x, b1, c01);
        x = _mm512_set1_ps(a1[o]);
        c10 = _mm512_fmadd_ps(x, b0, c10), c11 = _mm512_fmadd_ps(x, b1, c11);
        x = _mm512_set1_ps(a2[o]);
        c20 = _mm512_fmadd_ps(x, b0, c20), c21 = _mm512_fmadd_ps(x, b1, c21);
        x = _mm512_set1_ps(a3[o]);
        c30 = _mm512_fmadd_ps(x, b0, c30), c31 = _mm512_fmadd_ps(x, b1, c31);
        x = _mm512_set1_ps(a4[o]);
        c40 = _mm512_fmadd_ps(x, b0, c40), c41 = _mm512_fmadd_ps(x, b1, c41);
        x = _mm512_set1_ps(a5[o]);
        c50 = _mm512_fmadd_ps(x, b0, c50), c51 = _mm512_fmadd_ps(x, b1, c51);
    }
    if (trans_c) {
        float s[GEMM_MR][GEMM_NR_MAX];
        _mm512_storeu_ps(s[0], c00), _mm512_storeu_ps(s[0] + 16, c01);
        _mm512_storeu_ps(s[1], c10), _mm512_storeu_ps(s[1] + 16, c11);
        _mm512_storeu_ps(s[2], c20), _mm512_storeu_ps(s[2] + 16, c21);
        _mm512_storeu_ps(s[3], c30), _mm512_storeu_ps(s[3] + 16, c31);
        _mm512_storeu_ps(s[4], c40), _mm512_storeu_ps(s[4] + 16, c41);
        _mm512_storeu_ps(s[5], c50), _mm512_storeu_ps(s[5] + 16, c51);
        tile_store_t(&s[0][0], GEMM_NR_MAX, alpha, beta, first, C, ldc, mr, nr);
        return;
    }
    /* the rows of C in place, with the arithmetic of tile_store_t (no fused operation) */
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    const __m512 acc[GEMM_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                    {c30, c31}, {c40, c41}, {c50, c51}};
    for (int64_t i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        for (int h = 0; h < 2; h++) {
            const __mmask16 m = h ? m1 : m0;
            __m512 v = _mm512_mul_ps(va, acc[i][h]);
            if (!first)
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c + 16 * h), v);
            else if (beta != 0.0f)
                v = _mm512_add_ps(v, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, c + 16 * h)));
            _mm512_mask_storeu_ps(c + 16 * h, m, v);
        }
    }
}

/* tile with 16 columns in one 16-lane register per row (AVX-512): the same arithmetic per
 * element; used where the tile's columns are the few tokens of a Linear map (swapped form). */
ARL_K_NO_SANITIZE __attribute__((target("avx512f"))) static void
tile512n(int64_t kc, const float *const a[GEMM_MR], int64_t as, const float *b, int64_t bs,
         float alpha, float beta, int first, float *C, int64_t ldc, int64_t mr, int64_t nr,
         int trans_c) {
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * bs);
        const int64_t o = k * as;
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(a0[o]), b0, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(a1[o]), b0, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(a2[o]), b0, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(a3[o]), b0, c3);
        c4 = _mm512_fmadd_ps(_mm512_set1_ps(a4[o]), b0, c4);
        c5 = _mm512_fmadd_ps(_mm512_set1_ps(a5[o]), b0, c5);
    }
    if (trans_c && first && beta == 0.0f && ldc <= INT32_MAX / GEMM_NR) {
        /* C[j * ldc + i] = alpha s[i][j]: lane j of row i scattered down column i of C */
        int32_t off[GEMM_NR];
        for (int j = 0; j < GEMM_NR; j++)
            off[j] = (int32_t)(j * ldc);
        const __m512i idx = _mm512_loadu_si512(off);
        const __mmask16 m = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
        const __m512 va = _mm512_set1_ps(alpha);
        const __m512 acc[GEMM_MR] = {c0, c1, c2, c3, c4, c5};
        for (int64_t i = 0; i < mr; i++)
            _mm512_mask_i32scatter_ps(C + i, m, idx, _mm512_mul_ps(va, acc[i]), 4);
        return;
    }
    float s[GEMM_MR][GEMM_NR];
    _mm512_storeu_ps(s[0], c0), _mm512_storeu_ps(s[1], c1), _mm512_storeu_ps(s[2], c2);
    _mm512_storeu_ps(s[3], c3), _mm512_storeu_ps(s[4], c4), _mm512_storeu_ps(s[5], c5);
    if (trans_c) {
        tile_store_t(&s[0][0], GEMM_NR, alpha, beta, first, C, ldc, mr, nr);
        return;
    }
    for (int64_t i = 0; i < mr; i++) { /* scalar, the arithmetic of tile_store_t */
        float *c = C + i * ldc;
        for (int64_t j = 0; j < nr; j++)
            c[j] = !first         ? c[j] + alpha * s[i][j]
                   : beta == 0.0f ? alpha * s[i][j]
                                  : alpha * s[i][j] + beta * c[j];
    }
}

/* 8 values of C at c: alpha acc, plus C (add_c) or beta C (beta != 0; C is not read
 * otherwise), with the arithmetic of tile_store_t (no fused operation).  Masked by m unless full
 * (the plain load and store: a masked store is much slower on AMD CPUs). */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"), always_inline)) static inline void
store8(float *c, __m256 acc, __m256 va, __m256 vb, int add_c, float beta, __m256i m, int full) {
    __m256 v = _mm256_mul_ps(va, acc);
    if (add_c || beta != 0.0f) {
        const __m256 old = full ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, m);
        v = add_c ? _mm256_add_ps(old, v) : _mm256_add_ps(v, _mm256_mul_ps(vb, old));
    }
    if (full)
        _mm256_storeu_ps(c, v);
    else
        _mm256_maskstore_ps(c, m, v);
}

/* One tile: rows a[0..5] of op(A) (element k at a[i][k * as]), kc values of op(B) rows at
 * b + k * bs (16 floats each), written to the mr x nr corner of C (row stride ldc), or with
 * trans_c to the nr x mr corner of C^T (tile element (i, j) at C[j * ldc + i]). */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"))) static void
tile(int64_t kc, const float *const a[GEMM_MR], int64_t as, const float *b, int64_t bs, float alpha,
     float beta, int first, float *C, int64_t ldc, int64_t mr, int64_t nr, int trans_c) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * bs), b1 = _mm256_loadu_ps(b + k * bs + 8);
        const int64_t o = k * as;
        __m256 x = _mm256_broadcast_ss(a0 + o);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + o);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + o);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + o);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4 + o);
        c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5 + o);
        c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    if (trans_c) {
        float s[GEMM_MR][GEMM_NR];
        _mm256_storeu_ps(s[0], c00), _mm256_storeu_ps(s[0] + 8, c01);
        _mm256_storeu_ps(s[1], c10), _mm256_storeu_ps(s[1] + 8, c11);
        _mm256_storeu_ps(s[2], c20), _mm256_storeu_ps(s[2] + 8, c21);
        _mm256_storeu_ps(s[3], c30), _mm256_storeu_ps(s[3] + 8, c31);
        _mm256_storeu_ps(s[4], c40), _mm256_storeu_ps(s[4] + 8, c41);
        _mm256_storeu_ps(s[5], c50), _mm256_storeu_ps(s[5] + 8, c51);
        tile_store_t(&s[0][0], GEMM_NR, alpha, beta, first, C, ldc, mr, nr);
        return;
    }
    /* the rows of C in place (store8) */
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    int32_t mk[GEMM_NR];
    for (int j = 0; j < GEMM_NR; j++)
        mk[j] = j < nr ? -1 : 0;
    const __m256i m0 = _mm256_loadu_si256((const __m256i *)mk);
    const __m256i m1 = _mm256_loadu_si256((const __m256i *)(mk + 8));
    const __m256 acc[GEMM_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                    {c30, c31}, {c40, c41}, {c50, c51}};
    if (nr == GEMM_NR) /* the same loop twice, so that store8 is inlined with full constant */
        for (int64_t i = 0; i < mr; i++)
            for (int h = 0; h < 2; h++)
                store8(C + i * ldc + 8 * h, acc[i][h], va, vb, !first, beta, m0, 1);
    else
        for (int64_t i = 0; i < mr; i++)
            for (int h = 0; h < 2; h++)
                store8(C + i * ldc + 8 * h, acc[i][h], va, vb, !first, beta, h ? m1 : m0, 0);
}

/* Sum of the 8 lanes: (lanes 0-3 + lanes 4-7), then (s0 + s2) + (s1 + s3). */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    float t[4];
    _mm_storeu_ps(t, q);
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* dots_nt for one row of A: eight rows of B at a time, the same arithmetic per element. */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"))) static void
dots_1nt(int64_t N, int64_t K, float alpha, const float *a, const float *B, int64_t ldb, float beta,
         float *C, __m256i tail) {
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t j0 = 0; j0 < N; j0 += 8) {
        const int64_t nj = N - j0 < 8 ? N - j0 : 8;
        const float *b[8];
        for (int64_t j = 0; j < 8; j++)
            b[j] = B + (j0 + (j < nj ? j : 0)) * ldb;
        __m256 s[8];
        for (int j = 0; j < 8; j++)
            s[j] = _mm256_setzero_ps();
        for (int64_t k = 0; k < K8; k += 8) {
            const __m256 x = _mm256_loadu_ps(a + k);
            for (int j = 0; j < 8; j++)
                s[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(b[j] + k), s[j]);
        }
        if (K8 < K) {
            const __m256 x = _mm256_maskload_ps(a + K8, tail);
            for (int j = 0; j < 8; j++)
                s[j] = _mm256_fmadd_ps(x, _mm256_maskload_ps(b[j] + K8, tail), s[j]);
        }
        for (int64_t j = 0; j < nj; j++) {
            float d = hsum8(s[j]);
            C[j0 + j] = beta == 0.0f ? alpha * d : alpha * d + beta * C[j0 + j];
        }
    }
}

/* C[i, j] = alpha (A_i . B_j) (+ beta C[i, j]) for at most a few rows of A, all rows of B
 * (the NT product of a Linear map of one to four tokens) as dot products: lane l of a dot
 * product accumulates k = l mod 8 in ascending k with fused multiply-adds, then hsum8.  Two
 * rows of A and four of B share their loads; no copy of B. */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"))) static void
dots_nt(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
        int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t K8 = K & ~(int64_t)7, rem = K - K8;
    int32_t mk[8];
    for (int i = 0; i < 8; i++)
        mk[i] = i < rem ? -1 : 0;
    const __m256i tail = _mm256_loadu_si256((const __m256i *)mk);
    if (M == 1) {
        dots_1nt(N, K, alpha, A, B, ldb, beta, C, tail);
        return;
    }
    for (int64_t i0 = 0; i0 < M; i0 += 2) {
        const int64_t mi = M - i0 < 2 ? M - i0 : 2;
        const float *a0 = A + i0 * lda, *a1 = A + (i0 + mi - 1) * lda;
        for (int64_t j0 = 0; j0 < N; j0 += 4) {
            const int64_t nj = N - j0 < 4 ? N - j0 : 4;
            const float *b0 = B + j0 * ldb, *b1 = B + (j0 + (nj > 1 ? 1 : 0)) * ldb;
            const float *b2 = B + (j0 + (nj > 2 ? 2 : 0)) * ldb;
            const float *b3 = B + (j0 + (nj > 3 ? 3 : 0)) * ldb;
            __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00;
            __m256 s10 = s00, s11 = s00, s12 = s00, s13 = s00;
            for (int64_t k = 0; k <= K8; k += 8) {
                __m256 x0, x1, y0, y1, y2, y3;
                if (k < K8) {
                    x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
                    y0 = _mm256_loadu_ps(b0 + k), y1 = _mm256_loadu_ps(b1 + k);
                    y2 = _mm256_loadu_ps(b2 + k), y3 = _mm256_loadu_ps(b3 + k);
                } else if (rem) {
                    x0 = _mm256_maskload_ps(a0 + k, tail), x1 = _mm256_maskload_ps(a1 + k, tail);
                    y0 = _mm256_maskload_ps(b0 + k, tail), y1 = _mm256_maskload_ps(b1 + k, tail);
                    y2 = _mm256_maskload_ps(b2 + k, tail), y3 = _mm256_maskload_ps(b3 + k, tail);
                } else {
                    break;
                }
                s00 = _mm256_fmadd_ps(x0, y0, s00), s01 = _mm256_fmadd_ps(x0, y1, s01);
                s02 = _mm256_fmadd_ps(x0, y2, s02), s03 = _mm256_fmadd_ps(x0, y3, s03);
                s10 = _mm256_fmadd_ps(x1, y0, s10), s11 = _mm256_fmadd_ps(x1, y1, s11);
                s12 = _mm256_fmadd_ps(x1, y2, s12), s13 = _mm256_fmadd_ps(x1, y3, s13);
            }
            const float d[2][4] = {{hsum8(s00), hsum8(s01), hsum8(s02), hsum8(s03)},
                                   {hsum8(s10), hsum8(s11), hsum8(s12), hsum8(s13)}};
            for (int64_t i = 0; i < mi; i++)
                for (int64_t j = 0; j < nj; j++) {
                    float *c = C + (i0 + i) * ldc + j0 + j;
                    *c = beta == 0.0f ? alpha * d[i][j] : alpha * d[i][j] + beta * *c;
                }
        }
    }
}

/* acc[h] += a[k * as] b[k * ldb + 8h ..] for k < kc (fused multiply-adds in ascending k), 32
 * columns of b, masked by m unless full; inlined, so each call site has its own loop. */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"), always_inline)) static inline void
row_accumulate(__m256 acc[4], const float *a, int64_t as, const float *b, int64_t ldb, int64_t kc,
               const __m256i m[4], int full) {
    for (int64_t k = 0; k < kc; k++) {
        const __m256 x = _mm256_broadcast_ss(a + k * as);
        for (int h = 0; h < 4; h++)
            acc[h] = _mm256_fmadd_ps(x,
                                     full ? _mm256_loadu_ps(b + k * ldb + 8 * h)
                                          : _mm256_maskload_ps(b + k * ldb + 8 * h, m[h]),
                                     acc[h]);
    }
}

/* C (1, N) for one row a of op(A) (element k at a[k * as]) and op(B) = B (K, ldb): per column the
 * arithmetic of the tiles (fused multiply-adds in ascending k from 0 within a GEMM_KC block, then
 * alpha and beta), 32 columns at a time; a row instead of a 6-row tile with 5 rows unused. */
ARL_K_NO_SANITIZE __attribute__((target("avx2,fma"))) static void
row_nn(int64_t N, int64_t K, float alpha, const float *a, int64_t as, const float *B, int64_t ldb,
       float beta, float *C) {
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int64_t j0 = 0; j0 < N; j0 += 32) {
        const int64_t nj = N - j0 < 32 ? N - j0 : 32;
        int32_t mk[32];
        for (int j = 0; j < 32; j++)
            mk[j] = j < nj ? -1 : 0;
        __m256i m[4];
        for (int h = 0; h < 4; h++)
            m[h] = _mm256_loadu_si256((const __m256i *)(mk + 8 * h));
        for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
            const int64_t kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            if (nj == 32) /* whole blocks: plain loads (masked ones are slower on AMD) */
                row_accumulate(acc, a + k0 * as, as, B + k0 * ldb + j0, ldb, kc, m, 1);
            else
                row_accumulate(acc, a + k0 * as, as, B + k0 * ldb + j0, ldb, kc, m, 0);
            for (int h = 0; h < 4; h++)
                store8(C + j0 + 8 * h, acc[h], va, vb, k0 > 0, beta, m[h], nj == 32);
        }
    }
}

/* dst[c * ds + r] = src[r * ss + c] for r, c < 8: an 8 x 8 block transposed in registers. */
ARL_K_NO_SANITIZE __attribute__((target("avx2"))) static inline void
transpose8(const float *src, int64_t ss, float *dst, int64_t ds) {
    const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ss);
    const __m256 r2 = _mm256_loadu_ps(src + 2 * ss), r3 = _mm256_loadu_ps(src + 3 * ss);
    const __m256 r4 = _mm256_loadu_ps(src + 4 * ss), r5 = _mm256_loadu_ps(src + 5 * ss);
    const __m256 r6 = _mm256_loadu_ps(src + 6 * ss), r7 = _mm256_loadu_ps(src + 7 * ss);
    /* pairs of rows interleaved, then quads: u_c holds column c (low half) and c + 4 (high) */
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ds, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* dst[k * ds + j] = src[j * ss + k] for j < rows, k < kc: rows of src laid down as columns of dst
 * (8 x 8 blocks transposed in registers, the edges one value at a time). */
ARL_K_NO_SANITIZE __attribute__((target("avx2"))) static void
pack_transposed(float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows, int64_t kc) {
    const int64_t r8 = rows & ~(int64_t)7, k8 = kc & ~(int64_t)7;
    for (int64_t j = 0; j < r8; j += 8) {
        for (int64_t k = 0; k < k8; k += 8)
            transpose8(src + j * ss + k, ss, dst + k * ds + j, ds);
        for (int64_t jj = j; jj < j + 8; jj++)
            for (int64_t k = k8; k < kc; k++)
                dst[k * ds + jj] = src[jj * ss + k];
    }
    for (int64_t j = r8; j < rows; j++)
        for (int64_t k = 0; k < kc; k++)
            dst[k * ds + j] = src[j * ss + k];
}

/* dst[k * w + j] = src[k * ss + j] for j < w (a multiple of 8), k < kc. */
ARL_K_NO_SANITIZE __attribute__((target("avx2"))) static void
copy_rows(float *dst, int64_t w, const float *src, int64_t ss, int64_t kc) {
    for (int64_t k = 0; k < kc; k++)
        for (int64_t j = 0; j < w; j += 8)
            _mm256_storeu_ps(dst + k * w + j, _mm256_loadu_ps(src + k * ss + j));
}

/* panel[k][j] (row stride w) = op(B)[k0 + k][j0 + j] for k < kc, j < nr; 0 for nr <= j < w. */
ARL_K_NO_SANITIZE static void pack_panel(float *panel, int64_t w, const float *B, int64_t ldb,
                                         int trans_b, int64_t k0, int64_t kc, int64_t j0,
                                         int64_t nr) {
    if (nr < w)
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = nr; j < w; j++)
                panel[k * w + j] = 0.0f;
    if (trans_b) /* row j0 + j of B holds column j of the panel */
        pack_transposed(panel, w, B + j0 * ldb + k0, ldb, nr, kc);
    else if (nr == w)
        copy_rows(panel, w, B + k0 * ldb + j0, ldb, kc);
    else
        for (int64_t k = 0; k < kc; k++)
            memcpy(panel + k * w, B + (k0 + k) * ldb + j0, sizeof(float) * (size_t)nr);
}

/* Rows i1 .. i1+mc of op(A) = A^T (A (K, lda)), columns k0 .. k0+kc, as the tiles read them:
 * tile t (rows i1 + 6t ..) holds kc groups of GEMM_MR values, apack[(t * kc + k) * GEMM_MR + i] =
 * A[k0 + k][i1 + 6t + i], rows past mc zero.  In place the tile would read 6 values per k from
 * a new row of A, lda apart; copied, its reads are one stream. */
ARL_K_NO_SANITIZE static void pack_a_t(float *apack, const float *A, int64_t lda, int64_t i1,
                                       int64_t mc, int64_t k0, int64_t kc) {
    for (int64_t t = 0; t * GEMM_MR < mc; t++) {
        const int64_t i0 = i1 + t * GEMM_MR;
        const int64_t mr = mc - t * GEMM_MR < GEMM_MR ? mc - t * GEMM_MR : GEMM_MR;
        float *dst = apack + t * kc * GEMM_MR;
        const float *src = A + k0 * lda + i0;
        if (mr == GEMM_MR) { /* a constant trip count, which the compiler unrolls */
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = 0; i < GEMM_MR; i++)
                    dst[k * GEMM_MR + i] = src[k * lda + i];
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = 0; i < GEMM_MR; i++)
                    dst[k * GEMM_MR + i] = i < mr ? src[k * lda + i] : 0.0f;
        }
    }
}

/* The tiles: 16 columns in two 8-lane registers (AVX2), 32 in two 16-lane registers, or 16 in one
 * 16-lane register (AVX-512); the same bits from each. */
enum { TILE_AVX2, TILE_512, TILE_512N };
ARL_K_NO_SANITIZE static void run_tile(int kind, int64_t kc, const float *const a[GEMM_MR],
                                       int64_t as, const float *b, int64_t bs, float alpha,
                                       float beta, int first, float *C, int64_t ldc, int64_t mr,
                                       int64_t nr, int trans_c) {
    if (kind == TILE_512)
        tile512(kc, a, as, b, bs, alpha, beta, first, C, ldc, mr, nr, trans_c);
    else if (kind == TILE_512N)
        tile512n(kc, a, as, b, bs, alpha, beta, first, C, ldc, mr, nr, trans_c);
    else
        tile(kc, a, as, b, bs, alpha, beta, first, C, ldc, mr, nr, trans_c);
}

/* Uninstrumented under the sanitizers like the kernels it calls (kernels/cpu/internal.h): its
 * caller has checked the operands' extents. */
ARL_K_NO_SANITIZE void arl_k_gemm_fma(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                      float alpha, const float *A, int64_t lda, const float *B,
                                      int64_t ldb, float beta, float *C, int64_t ldc,
                                      int64_t m_full) {
    float panel[GEMM_KC * GEMM_NR_MAX];
    float apack[GEMM_MC * GEMM_KC]; /* op(A) = A^T: GEMM_MC rows, copied */
    if (!trans_a && trans_b && m_full <= GEMM_DOT_M) {
        dots_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (m_full == 1 && !trans_b) {
        row_nn(N, K, alpha, A, trans_a ? lda : 1, B, ldb, beta, C);
        return;
    }
    const int wide = use_wide_tiles();
    const int64_t nrt = wide ? GEMM_NR_MAX : GEMM_NR; /* columns of a tile */
    if (!trans_a && trans_b && M <= nrt) {
        /* a Linear map of at most 16 (32) tokens: C^T = B A^T with A as the (only) panel, so
         * the weights B are read in place instead of copied.  Each element sees the same
         * products in the same order as below (a fused multiply-add is exact in its product).
         * Up to 16 tokens a 16-column tile wastes fewer lanes. */
        const int sw = !wide ? TILE_AVX2 : M > GEMM_NR ? TILE_512 : TILE_512N;
        const int64_t w = sw == TILE_512 ? GEMM_NR_MAX : GEMM_NR;
        for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
            const int64_t kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            pack_panel(panel, w, A, lda, 1, k0, kc, 0, M);
            for (int64_t j0 = 0; j0 < N; j0 += GEMM_MR) {
                const int64_t nj = N - j0 < GEMM_MR ? N - j0 : GEMM_MR;
                const float *a[GEMM_MR];
                for (int64_t j = 0; j < GEMM_MR; j++)
                    a[j] = B + (j0 + (j < nj ? j : nj - 1)) * ldb + k0;
                run_tile(sw, kc, a, 1, panel, w, alpha, beta, k0 == 0, C + j0, ldc, nj, M, 1);
            }
        }
        return;
    }
    /* op(A)[i][k] = A[i * ai + k * as], or op(A) = A^T copied GEMM_MC rows at a time (apack);
     * each 16 (32) columns of op(B) copied into the panel, or used in place where its rows are
     * contiguous and M is small */
    const int64_t ai = trans_a ? 1 : lda, as = trans_a ? lda : 1;
    const int pack_a = trans_a && N > GEMM_PACK_A_N;
    const int64_t mstep = pack_a ? GEMM_MC : M;
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_KC) {
        const int64_t kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
        for (int64_t i1 = 0; i1 < M; i1 += mstep) {
            const int64_t mc = M - i1 < mstep ? M - i1 : mstep;
            if (pack_a) pack_a_t(apack, A, lda, i1, mc, k0, kc);
            for (int64_t j0 = 0; j0 < N; j0 += nrt) {
                const int64_t nr = N - j0 < nrt ? N - j0 : nrt;
                const float *b;
                int64_t bs;
                if (!trans_b && nr == nrt && M <= GEMM_PACK_B_M) {
                    b = B + k0 * ldb + j0;
                    bs = ldb;
                } else {
                    pack_panel(panel, nrt, B, ldb, trans_b, k0, kc, j0, nr);
                    b = panel;
                    bs = nrt;
                }
                for (int64_t i0 = i1; i0 < i1 + mc; i0 += GEMM_MR) {
                    const int64_t mr = i1 + mc - i0 < GEMM_MR ? i1 + mc - i0 : GEMM_MR;
                    const float *a[GEMM_MR];
                    for (int64_t i = 0; i < GEMM_MR; i++) /* rows past M repeat the last one */
                        a[i] = pack_a ? apack + (i0 - i1) * kc + i
                                      : A + (i0 + (i < mr ? i : mr - 1)) * ai + k0 * as;
                    run_tile(wide ? TILE_512 : TILE_AVX2, kc, a, pack_a ? GEMM_MR : as, b, bs,
                             alpha, beta, k0 == 0, C + i0 * ldc + j0, ldc, mr, nr, 0);
                }
            }
        }
    }
}

#else

int arl_k_cpu_has_fma(void) {
    return 0;
}

void arl_k_gemm_fma_narrow(int on) {
    (void)on;
}

void arl_k_gemm_fma(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc, int64_t m_full) {
    (void)m_full, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A,
        (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
}

#endif
