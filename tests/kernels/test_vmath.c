/* Vectorised math (kernels/vmath.h) against float64 libm over the whole fp32 range, the special
 * values and the saturation regions; the two builds of the elementwise functions (4 lanes and,
 * where the CPU has AVX2, 8 lanes) against each other bit for bit; array tails, in-place calls;
 * the summation order of the reductions.
 *
 * Error measure: ulp(ref) = the spacing of fp32 numbers at |ref| (2^-149 in the subnormal range),
 * err = |y - ref| / ulp(ref) with ref the float64 libm value.  Bounds (kernels/vmath.h):
 *   exp 2 ulp, sigmoid 3 ulp, tanh 3 ulp, silu 4 ulp where sigmoid(x) is a normal number
 *   (x > -87.3); below that silu = x * sigmoid(x) carries sigmoid's absolute subnormal error:
 *   |y - ref| <= 2 |x| 2^-149 (the same holds for the libm formula x * (e / (1 + e))).
 * Measured (this file's sweep): exp 0.93, sigmoid 2.2, tanh 1.5, silu 3.1 ulp.
 * Inputs: every 8191st fp32 bit pattern (524288 values, both signs, subnormals, inf, NaN),
 * dense grids on [-1, 1] and around each threshold (0.625 for tanh, 88.72 / -87.3 / -103.97
 * for exp) in steps of a few ulp. */
#include <float.h>
#include <math.h>

#include "kernels/cpu/internal.h"
#include "kernels/vmath.h"
#include "tests/kernels/kref.h"

/* the two builds of kernels/cpu/vmath_map.h (x86-64 only for the AVX2 one) */
void arl_k_vexp_base(float *y, const float *x, int64_t n);
void arl_k_vsigmoid_base(float *y, const float *x, int64_t n);
void arl_k_vtanh_base(float *y, const float *x, int64_t n);
void arl_k_vsilu_base(float *y, const float *x, int64_t n);
void arl_k_vsitu_glu_base(float *h, const float *g, const float *u, int64_t n, float b1, float b2);
void arl_k_vsitu_glu_bwd_base(float *dg, float *du, const float *dh, const float *g, const float *u,
                              int64_t n, float b1, float b2);
void arl_k_vswiglu_bwd_base(float *dg, float *du, const float *dh, const float *g, const float *u,
                            int64_t n);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_BUILD 1
void arl_k_vexp_avx2(float *y, const float *x, int64_t n);
void arl_k_vsigmoid_avx2(float *y, const float *x, int64_t n);
void arl_k_vtanh_avx2(float *y, const float *x, int64_t n);
void arl_k_vsilu_avx2(float *y, const float *x, int64_t n);
void arl_k_vsitu_glu_avx2(float *h, const float *g, const float *u, int64_t n, float b1, float b2);
void arl_k_vsitu_glu_bwd_avx2(float *dg, float *du, const float *dh, const float *g, const float *u,
                              int64_t n, float b1, float b2);
void arl_k_vswiglu_bwd_avx2(float *dg, float *du, const float *dh, const float *g, const float *u,
                            int64_t n);
#endif

static double r_exp(double x) {
    return exp(x);
}
static double r_sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}
static double r_tanh(double x) {
    return tanh(x);
}
static double r_silu(double x) {
    return x / (1.0 + exp(-x));
}

typedef struct vm_case {
    const char *name;
    void (*f)(float *, const float *, int64_t);
    double (*ref)(double);
    double max_ulp;
} vm_case;

static const vm_case cases[] = {
    {"exp", arl_k_vexp, r_exp, 2.0},
    {"sigmoid", arl_k_vsigmoid, r_sigmoid, 3.0},
    {"tanh", arl_k_vtanh, r_tanh, 3.0},
    {"silu", arl_k_vsilu, r_silu, 4.0},
};
#define N_CASES (sizeof cases / sizeof *cases)

static double ulp_at(double r) {
    double a = fabs(r);
    if (a < FLT_MIN) return ldexp(1.0, -149);
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    return ldexp(1.0, e - 24);
}

/* Worst error of case c over x (n): ulp, or for silu's subnormal-sigmoid region the ratio to its
 * absolute bound (1 = at the bound).  Special results must be exact: NaN for NaN (and where the
 * reference is NaN), +-inf and 0 where the float64 reference rounds to them. */
typedef struct vm_stat {
    double worst;
    float at;
    int64_t bad_special;
} vm_stat;

static void measure(const vm_case *c, const float *x, const float *y, int64_t n, vm_stat *st) {
    for (int64_t i = 0; i < n; i++) {
        double xd = x[i], r = c->ref(xd);
        if (isnan(xd) || isnan(r)) {
            st->bad_special += !isnan(y[i]);
            continue;
        }
        float rf = (float)r; /* the correctly rounded fp32 value (double rounding aside) */
        if (isinf(rf)) {
            st->bad_special += y[i] != rf;
            continue;
        }
        double e;
        if (c->ref == r_silu && r_sigmoid(xd) < FLT_MIN)
            e = fabs(y[i] - r) / (2.0 * fabs(xd) * ldexp(1.0, -149)) * c->max_ulp;
        else
            e = fabs(y[i] - r) / ulp_at(r);
        if (!(e <= st->worst)) {
            st->worst = e;
            st->at = x[i];
        }
    }
}

#define BATCH 4093 /* odd: every call also runs a tail */

static void sweep(const vm_case *c, vm_stat *st) {
    float *x = kt_floats(BATCH), *y = kt_floats(BATCH);
    int64_t n = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 8191) {
        uint32_t u = (uint32_t)b;
        memcpy(&x[n++], &u, 4);
        if (n == BATCH) {
            c->f(y, x, n);
            measure(c, x, y, n, st);
            n = 0;
        }
    }
    /* dense grids: [-1, 1] and a few hundred ulp around each threshold */
    static const float centers[] = {0.0f,     0.625f, -0.625f, 88.72283f, -87.33655f,
                                    -103.97f, 9.1f,   -9.1f,   20.0f,     -20.0f};
    for (size_t k = 0; k < sizeof centers / sizeof *centers; k++) {
        float v = centers[k];
        for (int i = 0; i < 600; i++)
            v = nextafterf(v, -INFINITY);
        for (int i = 0; i < 1200; i++) {
            x[n++] = v;
            v = nextafterf(v, INFINITY);
            if (n == BATCH) {
                c->f(y, x, n);
                measure(c, x, y, n, st);
                n = 0;
            }
        }
    }
    for (int i = 0; i <= 20000; i++) {
        x[n++] = -1.0f + (float)i / 10000.0f;
        if (n == BATCH) {
            c->f(y, x, n);
            measure(c, x, y, n, st);
            n = 0;
        }
    }
    if (n) {
        c->f(y, x, n);
        measure(c, x, y, n, st);
    }
    free(x), free(y);
}

static void test_accuracy(void) {
    for (size_t c = 0; c < N_CASES; c++) {
        vm_stat st = {0, 0, 0};
        sweep(&cases[c], &st);
        fprintf(stderr, "  %-8s max error %.3f ulp at x = %.9g (bound %.0f)\n", cases[c].name,
                st.worst, st.at, cases[c].max_ulp);
        CHECK_MSG(st.worst <= cases[c].max_ulp, "%s: %.3f ulp at x = %.9g", cases[c].name, st.worst,
                  st.at);
        CHECK_MSG(st.bad_special == 0, "%s: %lld wrong special values", cases[c].name,
                  (long long)st.bad_special);
    }
}

/* Exact values the callers rely on. */
static void test_special_values(void) {
    const float inf = INFINITY;
    float x[8] = {0.0f, -0.0f, inf, -inf, 89.0f, -105.0f, 10.0f, -10.0f}, y[8];
    arl_k_vexp(y, x, 8);
    CHECK(y[0] == 1.0f && y[1] == 1.0f && y[2] == inf && y[3] == 0.0f && y[4] == inf &&
          y[5] == 0.0f);
    arl_k_vsigmoid(y, x, 8);
    CHECK(y[0] == 0.5f && y[1] == 0.5f && y[2] == 1.0f && y[3] == 0.0f);
    arl_k_vtanh(y, x, 8);
    CHECK(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && signbit(y[1])); /* odd: -0 kept */
    CHECK(y[2] == 1.0f && y[3] == -1.0f && y[6] == 1.0f && y[7] == -1.0f);
    arl_k_vsilu(y, x, 8);
    CHECK(y[0] == 0.0f && y[2] == inf);
    float nan[5] = {NAN, -NAN, NAN, NAN, NAN}, yn[5];
    arl_k_vexp(yn, nan, 5);
    CHECK(isnan(yn[0]) && isnan(yn[1]) && isnan(yn[4]));
    arl_k_vtanh(yn, nan, 5);
    CHECK(isnan(yn[0]) && isnan(yn[1]));
    arl_k_vsigmoid(yn, nan, 5);
    CHECK(isnan(yn[0]) && isnan(yn[1]));
    /* tanh(-x) = -tanh(x) bit for bit */
    float a[64], b[64], ya[64], yb[64];
    for (int i = 0; i < 64; i++)
        a[i] = 0.05f * (float)i * (float)i, b[i] = -a[i];
    arl_k_vtanh(ya, a, 64);
    arl_k_vtanh(yb, b, 64);
    int odd = 1;
    for (int i = 0; i < 64; i++)
        odd &= yb[i] == -ya[i];
    CHECK(odd);
}

/* An element's value does not depend on its position: every length 0..40 and every offset give
 * the bits of the one-element call; in-place calls give the same bits. */
static void test_positions(void) {
    arl_rng r;
    arl_rng_seed(&r, 41);
    float x[48], y[48], one[1], z[48];
    kt_normal(&r, x, 48, 0, 4.0);
    for (size_t c = 0; c < N_CASES; c++) {
        int ok = 1;
        for (int off = 0; off < 8; off++)
            for (int n = 0; n <= 40; n++) {
                cases[c].f(y, x + off, n);
                for (int i = 0; i < n; i++) {
                    cases[c].f(one, x + off + i, 1);
                    ok &= kt_same_bits(one, y + i, sizeof(float));
                }
                memcpy(z, x + off, sizeof(float) * (size_t)n);
                cases[c].f(z, z, n);
                ok &= kt_same_bits(z, y, sizeof(float) * (size_t)n);
            }
        CHECK_MSG(ok, "%s: result depends on the position or on aliasing", cases[c].name);
    }
}

/* The 4-lane and the AVX2 build compute the same bits (kernels/cpu/vec.h), so the dispatch by
 * CPU never changes a result; NaN results included (vmath_map.h vm_nan1: at -O0 the two builds
 * once returned different NaNs of a product of two NaNs), so this holds at every -O level. */
static void test_builds_agree(void) {
#ifdef HAVE_AVX2_BUILD
    if (!arl_k_cpu_has_avx2()) {
        fprintf(stderr, "  (no AVX2 on this CPU: the 8-lane build is not compared)\n");
        return;
    }
    enum { N = 4099 };
    float *x = kt_floats(N), *u = kt_floats(N), *y1 = kt_floats(N), *y2 = kt_floats(N);
    float *z1 = kt_floats(N), *z2 = kt_floats(N), *dh = kt_floats(N);
    int64_t bad = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += (uint64_t)N * 997) {
        for (int i = 0; i < N; i++) {
            uint32_t v = (uint32_t)(b + (uint64_t)i * 997), w = v * 2654435761u;
            memcpy(&x[i], &v, 4);
            memcpy(&u[i], &w, 4);
            memcpy(&dh[N - 1 - i], &v, 4);
        }
        arl_k_vexp_base(y1, x, N), arl_k_vexp_avx2(y2, x, N);
        bad += !kt_same_bits(y1, y2, sizeof(float) * N);
        arl_k_vsigmoid_base(y1, x, N), arl_k_vsigmoid_avx2(y2, x, N);
        bad += !kt_same_bits(y1, y2, sizeof(float) * N);
        arl_k_vtanh_base(y1, x, N), arl_k_vtanh_avx2(y2, x, N);
        bad += !kt_same_bits(y1, y2, sizeof(float) * N);
        arl_k_vsilu_base(y1, x, N), arl_k_vsilu_avx2(y2, x, N);
        bad += !kt_same_bits(y1, y2, sizeof(float) * N);
        arl_k_vsitu_glu_base(y1, x, u, N, 4.0f, 25.0f),
            arl_k_vsitu_glu_avx2(y2, x, u, N, 4.0f, 25.0f);
        bad += !kt_same_bits(y1, y2, sizeof(float) * N);
        /* the GLU backward rows: dh = the bits of x reversed, dg and du start from u and x */
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < N; i++)
                y1[i] = y2[i] = u[i], z1[i] = z2[i] = x[i];
            if (k == 0) {
                arl_k_vsitu_glu_bwd_base(y1, z1, dh, x, u, N, 4.0f, 25.0f);
                arl_k_vsitu_glu_bwd_avx2(y2, z2, dh, x, u, N, 4.0f, 25.0f);
            } else {
                arl_k_vswiglu_bwd_base(y1, z1, dh, x, u, N);
                arl_k_vswiglu_bwd_avx2(y2, z2, dh, x, u, N);
            }
            bad += !kt_same_bits(y1, y2, sizeof(float) * N) ||
                   !kt_same_bits(z1, z2, sizeof(float) * N);
        }
    }
    CHECK_MSG(bad == 0, "%lld blocks differ between the 4-lane and the AVX2 build", (long long)bad);
    free(x), free(u), free(y1), free(y2), free(z1), free(z2), free(dh);
#else
    fprintf(stderr, "  (no AVX2 build on this architecture)\n");
#endif
}

/* vdot / vsum: four partial sums (element i in sum i mod 4) added as (s0 + s2) + (s1 + s3), bit
 * for bit; vmax: the maximum, NaN skipped; vaxpy / vscale: one rounding per operation. */
static void test_blas1(void) {
    arl_rng r;
    arl_rng_seed(&r, 42);
    float a[101], b[101], y[101], y0[101];
    kt_normal(&r, a, 101, 0, 1);
    kt_normal(&r, b, 101, 0, 1);
    int ok = 1;
    for (int n = 0; n <= 101; n++) {
        float s[4] = {0, 0, 0, 0}, t[4] = {0, 0, 0, 0};
        for (int i = 0; i < n; i++) {
            s[i % 4] += a[i] * b[i];
            t[i % 4] += a[i];
        }
        float dot = (s[0] + s[2]) + (s[1] + s[3]), sum = (t[0] + t[2]) + (t[1] + t[3]);
        float gd = arl_k_vdot(a, b, n), gs = arl_k_vsum(a, n);
        ok &= kt_same_bits(&gd, &dot, 4) && kt_same_bits(&gs, &sum, 4);
        if (n >= 1) {
            float m = a[0];
            for (int i = 1; i < n; i++)
                m = a[i] > m ? a[i] : m;
            ok &= arl_k_vmax(a, n) == m;
        }
        memcpy(y, b, sizeof y);
        memcpy(y0, b, sizeof y);
        arl_k_vaxpy(y, 0.37f, a, n);
        for (int i = 0; i < n; i++)
            y0[i] += 0.37f * a[i];
        ok &= kt_same_bits(y, y0, sizeof y);
        arl_k_vscale(y, -1.5f, n);
        for (int i = 0; i < n; i++)
            y0[i] *= -1.5f;
        ok &= kt_same_bits(y, y0, sizeof y);
    }
    CHECK_MSG(ok, "a BLAS-1 helper differs from its stated order");
    float withnan[9] = {1, NAN, 3, -2, NAN, 7, 0, 5, NAN};
    CHECK(arl_k_vmax(withnan, 9) == 7.0f);
    CHECK(arl_k_vmax(withnan + 1, 1) != arl_k_vmax(withnan + 1, 1)); /* all NaN: NaN */
}

int main(void) {
    TEST_RUN(test_accuracy);
    TEST_RUN(test_special_values);
    TEST_RUN(test_positions);
    TEST_RUN(test_builds_agree);
    TEST_RUN(test_blas1);
    return test_finish();
}
