/* Elementwise arithmetic (kernels/elementwise.h) and reductions (kernels/reduce.h) against
 * float64 references, on sizes that do and do not cross the parallel and chunk boundaries.
 *
 * Tolerances:
 *   fill, copy, add, mul, scale, scale_rows: exact.  One fp32 operation on fp32 operands: the
 *     float64 result of a + b, a * b, alpha * x is exact, and rounding it to fp32 is the IEEE
 *     fp32 operation itself.
 *   mul_acc, axpy: |a - ref| <= 2^-23 (|y0| + |a b|) - two roundings (product, sum), or one if
 *     the compiler fuses them.
 *   sum, sumsq, row/column sums: |a - ref| <= 2^-24 |ref| + n 2^-52 sum|x| - the final rounding
 *     to fp32 plus the float64 accumulation error (any order).
 *   max: exact. */
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "tests/kernels/kref.h"

static const int64_t sizes[] = {0, 1, 17, 1001, 65537, 16384 * 3 + 5};
#define N_SIZES 6

static int exact(const float *a, const float *ref, int64_t n) {
    return kt_same_bits(a, ref, (size_t)n * sizeof *a);
}

static void test_elementwise(void) {
    arl_rng r;
    arl_rng_seed(&r, 41);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int s = 0; s < N_SIZES; s++) {
            int64_t n = sizes[s];
            float *a = kt_floats(n), *b = kt_floats(n), *y = kt_floats(n), *ref = kt_floats(n);
            float *y0 = kt_floats(n);
            kt_normal(&r, a, n, 0, 3);
            kt_normal(&r, b, n, 0, 3);
            kt_normal(&r, y0, n, 0, 3);
            const float alpha = -0.37f;

            arl_k_fill(y, 2.5f, n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = 2.5f;
            CHECK(exact(y, ref, n));
            arl_k_copy(y, a, n);
            CHECK(exact(y, a, n));
            arl_k_add(y, a, b, n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = (float)((double)a[i] + b[i]);
            CHECK(exact(y, ref, n));
            arl_k_mul(y, a, b, n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = (float)((double)a[i] * b[i]);
            CHECK(exact(y, ref, n));
            arl_k_scale(y, a, alpha, n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = (float)((double)alpha * a[i]);
            CHECK(exact(y, ref, n));

            int ok = 1;
            memcpy(y, y0, (size_t)n * sizeof *y);
            arl_k_mul_acc(y, a, b, n);
            for (int64_t i = 0; i < n; i++) {
                double p = (double)a[i] * b[i], rf = y0[i] + p;
                ok &= fabs(y[i] - rf) <= 0x1p-23 * (fabs(y0[i]) + fabs(p));
            }
            CHECK_MSG(ok, "mul_acc n %lld", (long long)n);
            ok = 1;
            memcpy(y, y0, (size_t)n * sizeof *y);
            arl_k_axpy(y, alpha, a, n);
            for (int64_t i = 0; i < n; i++) {
                double p = (double)alpha * a[i], rf = y0[i] + p;
                ok &= fabs(y[i] - rf) <= 0x1p-23 * (fabs(y0[i]) + fabs(p));
            }
            CHECK_MSG(ok, "axpy n %lld", (long long)n);

            /* in place: y == a */
            memcpy(y, a, (size_t)n * sizeof *y);
            arl_k_add(y, y, b, n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = a[i] + b[i];
            CHECK(exact(y, ref, n));
            memcpy(y, a, (size_t)n * sizeof *y);
            arl_k_copy(y, y, n);
            CHECK(exact(y, a, n));
            free(a), free(b), free(y), free(ref), free(y0);
        }
    }
}

static void test_scale_rows(void) {
    arl_rng r;
    arl_rng_seed(&r, 42);
    static const int64_t shapes[][2] = {{0, 3}, {1, 1}, {5, 0}, {9, 13}, {300, 257}};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int s = 0; s < 5; s++) {
            int64_t T = shapes[s][0], d = shapes[s][1];
            float *x = kt_floats(T * d), *sc = kt_floats(T), *y = kt_floats(T * d);
            float *ref = kt_floats(T * d);
            kt_normal(&r, x, T * d, 0, 1);
            kt_uniform(&r, sc, T, 0, 1);
            arl_k_scale_rows(y, x, sc, T, d);
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < d; j++)
                    ref[t * d + j] = sc[t] * x[t * d + j];
            CHECK(exact(y, ref, T * d));
            free(x), free(sc), free(y), free(ref);
        }
    }
}

/* |got - ref| <= 2^-24 |ref| + n 2^-52 sum|x| */
static int sum_close(float got, double ref, int64_t n, double sabs) {
    return fabs(got - ref) <= 0x1p-24 * fabs(ref) + (double)n * 0x1p-52 * sabs;
}

static void test_full_reductions(void) {
    arl_rng r;
    arl_rng_seed(&r, 43);
    static const int64_t ns[] = {0, 1, 2, 17, 16384, 16385, 16384 * 64 + 7, (1 << 21) + 3};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int k = 0; k < 8; k++) {
            int64_t n = ns[k];
            float *x = kt_floats(n);
            kt_normal(&r, x, n, 0.25, 2); /* non-zero mean: the sum grows like n */
            double s = 0, sa = 0, ss = 0, m = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                s += x[i];
                sa += fabs(x[i]);
                ss += (double)x[i] * x[i];
                m = x[i] > m ? x[i] : m;
            }
            float got;
            arl_k_sum(&got, x, n);
            CHECK_MSG(sum_close(got, s, n, sa), "sum n %lld: %.9g vs %.9g", (long long)n, got, s);
            arl_k_sumsq(&got, x, n);
            CHECK_MSG(sum_close(got, ss, n, ss), "sumsq n %lld", (long long)n);
            arl_k_max(&got, x, n);
            CHECK_MSG(got == (float)m, "max n %lld: %g vs %g", (long long)n, got, m);
            if (n > 2) { /* NaN anywhere -> NaN */
                float keep = x[n - 2];
                x[n - 2] = NAN;
                arl_k_max(&got, x, n);
                CHECK(isnan(got));
                x[n - 2] = keep;
            }
            free(x);
        }
    }
    float one = 7.0f, got = 1.0f;
    arl_k_sum(&got, &one, 0);
    CHECK(got == 0.0f);
    arl_k_max(&got, &one, 0);
    CHECK(got == -INFINITY);
    float neg[3] = {-5, -INFINITY, -3};
    arl_k_max(&got, neg, 3);
    CHECK(got == -3.0f);
}

static void test_row_col_sums(void) {
    arl_rng r;
    arl_rng_seed(&r, 44);
    static const int64_t shapes[][2] = {{0, 4}, {3, 0}, {1, 1}, {7, 5}, {33, 513}, {1000, 300}};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int s = 0; s < 6; s++) {
            int64_t T = shapes[s][0], d = shapes[s][1];
            float *x = kt_floats(T * d), *b = kt_floats(T * d);
            float *rows = kt_floats(T), *dots = kt_floats(T), *cols = kt_floats(d);
            kt_normal(&r, x, T * d, 0.5, 1);
            kt_normal(&r, b, T * d, 0, 1);
            for (int64_t j = 0; j < d; j++)
                cols[j] = NAN; /* must be overwritten */
            arl_k_sum_rows(rows, x, T, d);
            arl_k_dot_rows(dots, x, b, T, d);
            arl_k_sum_cols(cols, x, T, d);
            int ok = 1;
            for (int64_t t = 0; t < T; t++) {
                double sr = 0, sra = 0, sd = 0, sda = 0;
                for (int64_t j = 0; j < d; j++) {
                    sr += x[t * d + j];
                    sra += fabs(x[t * d + j]);
                    sd += (double)x[t * d + j] * b[t * d + j];
                    sda += fabs((double)x[t * d + j] * b[t * d + j]);
                }
                ok &= sum_close(rows[t], sr, d, sra) && sum_close(dots[t], sd, d, sda);
            }
            for (int64_t j = 0; j < d; j++) {
                double sc = 0, sca = 0;
                for (int64_t t = 0; t < T; t++) {
                    sc += x[t * d + j];
                    sca += fabs(x[t * d + j]);
                }
                ok &= sum_close(cols[j], sc, T, sca);
            }
            CHECK_MSG(ok, "row/col sums T %lld d %lld", (long long)T, (long long)d);
            free(x), free(b), free(rows), free(dots), free(cols);
        }
    }
}

int main(void) {
    TEST_RUN(test_elementwise);
    TEST_RUN(test_scale_rows);
    TEST_RUN(test_full_reductions);
    TEST_RUN(test_row_col_sums);
    arl_k_threads_free();
    return test_finish();
}
