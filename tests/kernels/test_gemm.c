/* GEMM and Linear maps against a naive float64 triple loop, for every transpose combination,
 * alpha/beta, padded leading dimensions, awkward sizes, the split (multi-thread) path, the
 * batched form, and run-to-run determinism.
 *
 * Both implementations (the AVX2/FMA kernel and OpenBLAS) run where the CPU has both.
 *
 * The operands of the checked cases sit against inaccessible pages, each holding exactly its
 * extent (no padding after its last row): a read or write past the end (or, every other case,
 * before the start) of an operand faults, in every build.  The sanitizers leave the FMA kernel
 * uninstrumented (kernels/cpu/internal.h), so this is what checks its own accesses.
 *
 * Tolerance (elementwise, per element of C): the standard fp32 dot-product bound
 *     |c - ref| <= (K + 2) * 2^-24 * (|alpha| sum_k |a_ik||b_kj| + |beta||c0_ij|) + 1e-30
 * i.e. one rounding per multiply-add along K plus the alpha/beta scaling.  It holds for any
 * summation order, so it does not depend on how OpenBLAS blocks K. */
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/internal.h"
#include "kernels/gemm.h"
#include "tests/kernels/kref.h"

#define U32 (1.0 / 16777216.0) /* 2^-24, unit roundoff of fp32 */

static float get(const float *X, int64_t ld, arl_k_trans t, int64_t i, int64_t j) {
    return t == ARL_K_NOTRANS ? X[i * ld + j] : X[j * ld + i];
}

/* Check C against alpha op(A) op(B) + beta C0 computed in double, with the bound above. */
static int check_gemm(const char *what, arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N,
                      int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float beta, const float *C0, const float *C, int64_t ldc) {
    int ok = 1;
    for (int64_t i = 0; i < M && ok; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sabs = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)get(A, lda, ta, i, k) * get(B, ldb, tb, k, j);
                s += p;
                sabs += fabs(p);
            }
            double c0 = beta == 0.0f ? 0.0 : (double)C0[i * ldc + j];
            double ref = alpha * s + beta * c0;
            double bound = (K + 2) * U32 * (fabs(alpha) * sabs + fabs(beta) * fabs(c0)) + 1e-30;
            double got = C[i * ldc + j];
            if (!(fabs(got - ref) <= bound)) {
                fprintf(stderr,
                        "%s: M %lld N %lld K %lld C[%lld,%lld] = %.9g ref %.9g bound %.3g\n", what,
                        (long long)M, (long long)N, (long long)K, (long long)i, (long long)j, got,
                        ref, bound);
                ok = 0;
                break;
            }
        }
    }
    if (!ok) test_failures_++;
    return ok;
}

/* Padding of each leading dimension beyond the row length, so ld != cols is exercised. */
#define PAD 3

/* Where n floats (n >= 1) sit in a mapping of their pages between two inaccessible ones: the
 * mapping's bytes, and the floats' offset in it (ending where the page after them begins when
 * at_end, else starting where the page before them ends). */
static size_t guarded_layout(int64_t n, int at_end, size_t *map_bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = sizeof(float) * (size_t)n;
    const size_t span = (bytes + page - 1) / page * page;
    *map_bytes = span + 2 * page;
    return page + (at_end ? span - bytes : 0);
}

static float *guarded_floats(int64_t n, int at_end) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t map_bytes;
    const size_t off = guarded_layout(n, at_end, &map_bytes);
    char *base = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) ||
        mprotect(base + map_bytes - page, page, PROT_NONE)) {
        fprintf(stderr, "test: guarded buffer of %lld floats: mmap/mprotect failed\n",
                (long long)n);
        exit(1);
    }
    return (float *)(base + off);
}

static void guarded_free(float *p, int64_t n, int at_end) {
    size_t map_bytes;
    const size_t off = guarded_layout(n, at_end, &map_bytes);
    munmap((char *)p - off, map_bytes);
}

static void run_case(arl_rng *r, arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K,
                     float alpha, float beta) {
    static int n_cases;
    const int at_end = n_cases++ % 2 == 0; /* guard pages after the operands, else before */
    int64_t arows = ta == ARL_K_NOTRANS ? M : K, acols = ta == ARL_K_NOTRANS ? K : M;
    int64_t brows = tb == ARL_K_NOTRANS ? K : N, bcols = tb == ARL_K_NOTRANS ? N : K;
    int64_t lda = acols + PAD, ldb = bcols + PAD, ldc = N + PAD;
    /* each operand's extent: its rows at their stride, the last without padding */
    const int64_t na = (arows - 1) * lda + acols, nb = (brows - 1) * ldb + bcols,
                  nc = (M - 1) * ldc + N;
    float *A = guarded_floats(na, at_end), *B = guarded_floats(nb, at_end);
    float *C = guarded_floats(nc, at_end), *C0 = kt_floats(nc);
    kt_normal(r, A, na, 0, 1);
    kt_normal(r, B, nb, 0, 1);
    kt_normal(r, C0, nc, 0, 1);
    if (beta == 0.0f)
        for (int64_t i = 0; i < nc; i++)
            C0[i] = NAN; /* beta == 0: C must not be read */
    memcpy(C, C0, (size_t)nc * sizeof *C);
    arl_k_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    char what[96];
    snprintf(what, sizeof what, "gemm ta %d tb %d alpha %g beta %g threads %d", ta, tb, alpha, beta,
             arl_k_threads());
    check_gemm(what, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
    /* padding columns of C (between its rows) are untouched */
    int pad_ok = 1;
    for (int64_t i = 0; i + 1 < M; i++)
        for (int64_t j = N; j < ldc; j++)
            pad_ok &= kt_same_bits(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float));
    CHECK_MSG(pad_ok, "%s: wrote into the padding of C", what);
    guarded_free(A, na, at_end), guarded_free(B, nb, at_end), guarded_free(C, nc, at_end);
    free(C0);
}

/* Sizes that reach every path: M <= 4 (dot products), 5..16 (the AVX2/FMA kernel's few-token
 * NT form), > 16 (its tiles; 6-row and 16-column edges), K past one 256-deep block (257), and
 * both implementations where the CPU has AVX2 + FMA (the tile kernel, then OpenBLAS forced). */
static void test_gemm_small_awkward(void) {
    arl_rng r;
    arl_rng_seed(&r, 1);
    static const int64_t ms[] = {1, 3, 5, 16, 17, 33};
    static const int64_t sizes[] = {1, 3, 17, 33, 257};
    for (int path = 0; path < 3; path++) { /* FMA kernel (widest tile), OpenBLAS, 16-col tile */
        if (path && !arl_k_cpu_has_fma()) break; /* OpenBLAS was the only path */
        arl_k_gemm_force_blas(path == 1);
        arl_k_gemm_fma_narrow(path == 2);
        for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
            kt_threads(kt_thread_counts[tc]);
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int mi = 0; mi < 6; mi++)
                        for (int ni = 0; ni < 4; ni++)
                            for (int ki = 0; ki < 5; ki++)
                                run_case(&r, (arl_k_trans)ta, (arl_k_trans)tb, ms[mi], sizes[ni],
                                         sizes[ki], ki % 2 ? 1.0f : -0.5f, ni % 2 ? 0.0f : 0.75f);
        }
    }
    arl_k_gemm_force_blas(0);
    arl_k_gemm_fma_narrow(0);
}

/* The AVX2/FMA kernel computes an element the same way wherever its row and column fall, and
 * whether it reads op(A) and op(B) in place or copied, so a product split across threads (along
 * M or N, which changes the blocks' sizes and with them what is copied) gives the bits of the
 * serial one, and its 16- and 32-column tiles (AVX2, AVX-512) give the same bits. */
static void test_gemm_fma_thread_invariant(void) {
    if (!arl_k_cpu_has_fma()) return;
    arl_rng r;
    arl_rng_seed(&r, 6);
    static const int64_t shapes[][3] = {
        {131, 67, 129}, {45, 211, 300}, {9, 700, 200}, {20, 300, 64}, {160, 96, 72}};
    for (int s = 0; s < 5; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                const int64_t lda = ta ? M : K, ldb = tb ? K : N;
                float *A = kt_floats(M * K), *B = kt_floats(N * K), *C1 = kt_floats(M * N),
                      *C2 = kt_floats(M * N);
                kt_normal(&r, A, M * K, 0, 1);
                kt_normal(&r, B, N * K, 0, 1);
                kt_threads(1);
                arl_k_gemm((arl_k_trans)ta, (arl_k_trans)tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f,
                           C1, N);
                for (int t = 2; t <= 4; t++) {
                    kt_threads(t < 4 ? t : 2);
                    arl_k_gemm_fma_narrow(t == 4);
                    arl_k_gemm((arl_k_trans)ta, (arl_k_trans)tb, M, N, K, 1.0f, A, lda, B, ldb,
                               0.0f, C2, N);
                    arl_k_gemm_fma_narrow(0);
                    CHECK_MSG(kt_same_bits(C1, C2, (size_t)(M * N) * sizeof *C1),
                              "M %lld N %lld K %lld ta %d tb %d: %s differs from 1 thread",
                              (long long)M, (long long)N, (long long)K, ta, tb,
                              t < 4 ? "a split across threads" : "the 16-column tile");
                }
                free(A), free(B), free(C1), free(C2);
            }
}

/* Shapes above ARL_K_GEMM_SPLIT_MNK: the split path, cut along M (tall) and along N (wide),
 * with block edges that do not fall on multiples of 16. */
static void test_gemm_split(void) {
    arl_rng r;
    arl_rng_seed(&r, 2);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                run_case(&r, (arl_k_trans)ta, (arl_k_trans)tb, 131, 67, 129, 1.0f, 0.0f);
                run_case(&r, (arl_k_trans)ta, (arl_k_trans)tb, 45, 211, 113, 0.5f, 1.0f);
            }
    }
}

static void test_gemm_degenerate(void) {
    kt_threads(2);
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {7}, B[1] = {8};
    /* K == 0: C = beta C */
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 2, 3, 0, 1.0f, A, 1, B, 3, 2.0f, C, 3);
    CHECK(C[0] == 2 && C[5] == 12);
    /* K == 0, beta == 0: zeros even over NaN */
    C[1] = NAN;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3);
    int zero = 1;
    for (int i = 0; i < 6; i++)
        zero &= C[i] == 0.0f;
    CHECK(zero);
    /* M == 0 or N == 0: nothing is touched */
    C[0] = 9;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 0, 3, 1, 1.0f, A, 1, B, 3, 0.0f, C, 3);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, 2, 0, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
    CHECK(C[0] == 9);
}

static void test_gemm_batched(void) {
    arl_rng r;
    arl_rng_seed(&r, 3);
    const int64_t M = 7, N = 5, K = 9, batch = 5;
    const int64_t sA = M * K + 2, sB = K * N + 1, sC = M * N + 4;
    float *A = kt_floats(batch * sA), *B = kt_floats(batch * sB);
    float *C0 = kt_floats(batch * sC), *C = kt_floats(batch * sC);
    kt_normal(&r, A, batch * sA, 0, 1);
    kt_normal(&r, B, batch * sB, 0, 1);
    kt_normal(&r, C0, batch * sC, 0, 1);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int shared_b = 0; shared_b < 2; shared_b++) {
            int64_t sb = shared_b ? 0 : sB; /* sB == 0: one B for every product */
            memcpy(C, C0, (size_t)(batch * sC) * sizeof *C);
            arl_k_gemm_batched(ARL_K_NOTRANS, ARL_K_TRANS, M, N, K, 1.5f, A, K, sA, B, K, sb, 0.5f,
                               C, N, sC, batch);
            for (int64_t b = 0; b < batch; b++)
                check_gemm("gemm_batched", ARL_K_NOTRANS, ARL_K_TRANS, M, N, K, 1.5f, A + b * sA, K,
                           B + b * sb, K, 0.5f, C0 + b * sC, C + b * sC, N);
            /* gaps between the C blocks are untouched */
            int gaps_ok = 1;
            for (int64_t b = 0; b < batch; b++)
                gaps_ok &= kt_same_bits(C + b * sC + M * N, C0 + b * sC + M * N, 4 * sizeof(float));
            CHECK(gaps_ok);
        }
        arl_k_gemm_batched(ARL_K_NOTRANS, ARL_K_NOTRANS, M, N, K, 1, A, K, sA, B, N, sB, 0, C, N,
                           sC, 0); /* batch 0: no-op */
        /* batch 1 and 2 (fewer products than threads: one arl_k_gemm per product) */
        for (int64_t nb = 1; nb <= 2; nb++) {
            memcpy(C, C0, (size_t)(batch * sC) * sizeof *C);
            arl_k_gemm_batched(ARL_K_TRANS, ARL_K_NOTRANS, M, N, K, -1.0f, A, M, sA, B, N, sB, 1.0f,
                               C, N, sC, nb);
            for (int64_t b = 0; b < nb; b++)
                check_gemm("gemm_batched small", ARL_K_TRANS, ARL_K_NOTRANS, M, N, K, -1.0f,
                           A + b * sA, M, B + b * sB, N, 1.0f, C0 + b * sC, C + b * sC, N);
            CHECK(kt_same_bits(C + nb * sC, C0 + nb * sC, (size_t)((batch - nb) * sC) * 4));
        }
    }
    free(A), free(B), free(C0), free(C);
}

/* Linear maps: y = x W^T, dx += dy W, dW += dy^T x, with T = 0 and T = 1 included. */
static void test_linear(void) {
    arl_rng r;
    arl_rng_seed(&r, 4);
    static const int64_t Ts[] = {0, 1, 5, 130};
    const int64_t in = 19, out = 11;
    float *W = kt_floats(out * in), *dW0 = kt_floats(out * in), *dW = kt_floats(out * in);
    kt_normal(&r, W, out * in, 0, 0.3);
    kt_normal(&r, dW0, out * in, 0, 1);
    for (int ti = 0; ti < 4; ti++) {
        int64_t T = Ts[ti];
        float *x = kt_floats(T * in), *y = kt_floats(T * out), *dy = kt_floats(T * out);
        float *dx0 = kt_floats(T * in), *dx = kt_floats(T * in);
        kt_normal(&r, x, T * in, 0, 1);
        kt_normal(&r, dy, T * out, 0, 1);
        kt_normal(&r, dx0, T * in, 0, 1);
        arl_k_linear_fwd(y, x, W, T, in, out);
        check_gemm("linear_fwd", ARL_K_NOTRANS, ARL_K_TRANS, T, out, in, 1, x, in, W, in, 0, NULL,
                   y, out);
        memcpy(dx, dx0, (size_t)(T * in) * sizeof *dx);
        arl_k_linear_bwd_x(dx, dy, W, T, in, out);
        check_gemm("linear_bwd_x", ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, out, 1, dy, out, W, in, 1,
                   dx0, dx, in);
        memcpy(dW, dW0, (size_t)(out * in) * sizeof *dW);
        arl_k_linear_bwd_w(dW, dy, x, T, in, out);
        check_gemm("linear_bwd_w", ARL_K_TRANS, ARL_K_NOTRANS, out, in, T, 1, dy, out, x, in, 1,
                   dW0, dW, in);
        if (T == 0) CHECK(kt_same_bits(dW, dW0, (size_t)(out * in) * sizeof *dW));
        free(x), free(y), free(dy), free(dx0), free(dx);
    }
    free(W), free(dW0), free(dW);
}

/* Same inputs, same thread count: identical bits, on the split path too. */
static void test_gemm_run_to_run(void) {
    arl_rng r;
    arl_rng_seed(&r, 5);
    const int64_t M = 150, N = 97, K = 300;
    float *A = kt_floats(M * K), *B = kt_floats(N * K), *C1 = kt_floats(M * N),
          *C2 = kt_floats(M * N);
    kt_normal(&r, A, M * K, 0, 1);
    kt_normal(&r, B, N * K, 0, 1);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        arl_k_linear_fwd(C1, A, B, M, K, N);
        for (int rep = 0; rep < 3; rep++) {
            arl_k_linear_fwd(C2, A, B, M, K, N);
            CHECK(kt_same_bits(C1, C2, (size_t)(M * N) * sizeof *C1));
        }
    }
    free(A), free(B), free(C1), free(C2);
}

int main(void) {
    TEST_RUN(test_gemm_small_awkward);
    TEST_RUN(test_gemm_fma_thread_invariant);
    TEST_RUN(test_gemm_split);
    TEST_RUN(test_gemm_degenerate);
    TEST_RUN(test_gemm_batched);
    TEST_RUN(test_linear);
    TEST_RUN(test_gemm_run_to_run);
    arl_k_threads_free();
    return test_finish();
}
