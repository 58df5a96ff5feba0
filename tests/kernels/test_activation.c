/* Activations and GLUs (kernels/activation.h) against float64 definitions (spec/policy.md
 * sections 1.1 and 8); derivatives against central finite differences of those definitions.
 *
 * Tolerances (elementwise, |a - ref| <= atol + rtol |ref|):
 *   forward  atol 1e-6, rtol 1e-5 (spec 16.4 for single elementwise ops, incl. `situ`): a few
 *            fp32 roundings (libm expf/tanhf/erff are within 1-2 ulp).
 *   backward atol 2e-6, rtol 2e-5: derivatives such as 1 - tanh^2 or the two terms of phi'
 *            cancel, leaving an absolute error of a few ulp of O(1) terms.
 *   GLU backward atol 2e-5, rtol 2e-5: the same derivative times psi(u) (|psi| < 25) or u.
 * Finite differences: h = 1e-6 max(1, |x|) in float64 (truncation and round-off ~1e-10).
 * Inputs: a grid over [-60, 60] (the `situ` golden range of spec 16.2) and N(0, 3^2) draws. */
#include "kernels/activation.h"
#include "tests/kernels/kref.h"

#define B1 4.0  /* K3 activation_situ_beta */
#define B2 25.0 /* K3 activation_situ_linear_beta */

/* ---- float64 definitions ---- */

static double d_sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}
static double d_silu(double x) {
    return x * d_sigmoid(x);
}
static double d_tanh(double x) {
    return tanh(x);
}
static double d_softplus(double x) {
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}
static double d_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double d_gelu_erf(double x) {
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}
static double d_phi(double x) {
    return B1 * tanh(x / B1) * d_sigmoid(x);
}
static double d_psi(double x) {
    return B2 * tanh(x / B2);
}

static double fd(double (*f)(double), double x) {
    double h = 1e-6 * (fabs(x) > 1 ? fabs(x) : 1);
    return (f(x + h) - f(x - h)) / (2 * h);
}

typedef struct act_case {
    const char *name;
    void (*fwd)(float *, const float *, int64_t);
    void (*bwd)(float *, const float *, const float *, int64_t);
    double (*ref)(double);
} act_case;

static void situ_fwd(float *y, const float *x, int64_t n) {
    arl_k_situ_phi_fwd(y, x, n, B1);
}
static void situ_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    arl_k_situ_phi_bwd(dx, dy, x, n, B1);
}

static const act_case cases[] = {
    {"sigmoid", arl_k_sigmoid_fwd, arl_k_sigmoid_bwd, d_sigmoid},
    {"silu", arl_k_silu_fwd, arl_k_silu_bwd, d_silu},
    {"tanh", arl_k_tanh_fwd, arl_k_tanh_bwd, d_tanh},
    {"softplus", arl_k_softplus_fwd, arl_k_softplus_bwd, d_softplus},
    {"gelu_tanh", arl_k_gelu_tanh_fwd, arl_k_gelu_tanh_bwd, d_gelu_tanh},
    {"gelu_erf", arl_k_gelu_erf_fwd, arl_k_gelu_erf_bwd, d_gelu_erf},
    {"situ_phi", situ_fwd, situ_bwd, d_phi},
};
#define N_CASES (sizeof cases / sizeof *cases)

/* Inputs: the grid -60..60 in steps of 0.37 first, then N(0, 9) draws; n elements. */
static void fill_inputs(arl_rng *r, float *x, int64_t n) {
    int64_t i = 0;
    for (double v = -60.0; v <= 60.0 && i < n; v += 0.37)
        x[i++] = (float)v;
    kt_normal(r, x + i, n - i, 0, 3.0);
}

static void test_activations(void) {
    arl_rng r;
    arl_rng_seed(&r, 31);
    static const int64_t ns[] = {0, 1, 17, 1001, 100003};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (size_t c = 0; c < N_CASES; c++) {
            for (int k = 0; k < 5; k++) {
                int64_t n = ns[k];
                float *x = kt_floats(n), *y = kt_floats(n), *dy = kt_floats(n), *dx = kt_floats(n);
                float *dx0 = kt_floats(n), *fref = kt_floats(n);
                fill_inputs(&r, x, n);
                kt_normal(&r, dy, n, 0, 1);
                kt_normal(&r, dx0, n, 0, 1);
                cases[c].fwd(y, x, n);
                for (int64_t i = 0; i < n; i++)
                    fref[i] = (float)cases[c].ref(x[i]);
                check_close_f32(cases[c].name, y, fref, (size_t)n, 1e-6, 1e-5);
                int finite = 1;
                for (int64_t i = 0; i < n; i++)
                    finite &= isfinite(y[i]);
                CHECK_MSG(finite, "%s: non-finite output", cases[c].name);

                memcpy(dx, dx0, (size_t)n * sizeof *dx);
                cases[c].bwd(dx, dy, x, n);
                for (int64_t i = 0; i < n; i++)
                    fref[i] = (float)(dx0[i] + dy[i] * fd(cases[c].ref, x[i]));
                check_close_f32(cases[c].name, dx, fref, (size_t)n, 2e-6, 2e-5);

                /* in place forward gives the same bits */
                memcpy(dx, x, (size_t)n * sizeof *dx);
                cases[c].fwd(dx, dx, n);
                CHECK(kt_same_bits(dx, y, (size_t)n * sizeof *y));
                free(x), free(y), free(dy), free(dx), free(dx0), free(fref);
            }
        }
    }
}

/* spec 8: |SiTU| < b1 b2 = 100; phi has its minimum ~ -0.2698 at g ~ -1.219 (phi' = 0 there);
 * phi(60) = b1 and phi(-60) ~ 0. */
static void test_situ_shape(void) {
    kt_threads(1);
    float g[3] = {-1.219f, 60.0f, -60.0f}, y[3];
    arl_k_situ_phi_fwd(y, g, 3, (float)B1);
    CHECK_CLOSE(y[0], -0.2698, 1e-4, 0);
    CHECK_CLOSE(y[1], B1, 1e-6, 0);
    CHECK(fabsf(y[2]) < 1e-20f);
    float d[3] = {0, 0, 0}, ones[3] = {1, 1, 1};
    arl_k_situ_phi_bwd(d, ones, g, 3, (float)B1);
    CHECK_CLOSE(d[0], 0.0, 1e-4, 0); /* the minimum */
    float h, gg = 60.0f, uu = 1e4f;
    arl_k_situ_glu_fwd(&h, &gg, &uu, 1, 1, 1, (float)B1, (float)B2);
    CHECK(h <= 100.0f && h > 99.9f);
}

/* Tails: where the value is tiny, it is still accurate relative to itself (a stable formula,
 * not 1 - (1 - tiny)): sigmoid, softplus and silu at x = -10 .. -80, and softplus at large x.
 * Tolerance: rtol 1e-5, atol 0 (a few fp32 roundings of expf/log1pf). */
static void test_tails(void) {
    kt_threads(1);
    float x[6] = {-10, -20, -30, -50, -80, 30}, y[6];
    for (int k = 0; k < 3; k++) {
        double (*ref)(double) = k == 0 ? d_sigmoid : k == 1 ? d_softplus : d_silu;
        if (k == 0) arl_k_sigmoid_fwd(y, x, 6);
        if (k == 1) arl_k_softplus_fwd(y, x, 6);
        if (k == 2) arl_k_silu_fwd(y, x, 6);
        for (int i = 0; i < 6; i++) {
            double rf = ref(x[i]);
            if (fabs(rf) < 1e-37) continue; /* below the fp32 normal range */
            CHECK_MSG(fabs(y[i] - rf) <= 1e-5 * fabs(rf), "kind %d x %g: %g vs %g", k, x[i], y[i],
                      rf);
        }
    }
}

/* GLUs with separate (ld = f) and fused (ld = 2f, u = g + f) layouts. */
static void test_glu(void) {
    arl_rng r;
    arl_rng_seed(&r, 32);
    static const int64_t Ts[] = {0, 1, 3, 40};
    static const int64_t fs[] = {1, 7, 130};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int situ = 0; situ < 2; situ++)
            for (int fused = 0; fused < 2; fused++)
                for (int ti = 0; ti < 4; ti++)
                    for (int fi = 0; fi < 3; fi++) {
                        int64_t T = Ts[ti], f = fs[fi], ld = fused ? 2 * f : f;
                        int64_t ng = fused ? T * ld : T * f; /* elements per g/u buffer */
                        float *gbuf = kt_floats(fused ? ng : 2 * ng);
                        float *g = gbuf, *u = fused ? gbuf + f : gbuf + ng;
                        float *dbuf = kt_floats(fused ? ng : 2 * ng),
                              *dbuf0 = kt_floats(fused ? ng : 2 * ng);
                        float *dg = dbuf, *du = fused ? dbuf + f : dbuf + ng;
                        float *h = kt_floats(T * f), *dh = kt_floats(T * f);
                        float *href = kt_floats(T * f);
                        int64_t nbuf = fused ? ng : 2 * ng;
                        float *dref = kt_floats(nbuf);
                        kt_normal(&r, gbuf, nbuf, 0, 2.0);
                        if (nbuf > 2) gbuf[0] = 45.0f, gbuf[nbuf - 1] = -70.0f; /* past the caps */
                        kt_normal(&r, dh, T * f, 0, 1);
                        kt_normal(&r, dbuf0, nbuf, 0, 1);
                        memcpy(dbuf, dbuf0, (size_t)nbuf * sizeof *dbuf);
                        memcpy(dref, dbuf0, (size_t)nbuf * sizeof *dref);
                        if (situ) {
                            arl_k_situ_glu_fwd(h, g, u, T, f, ld, (float)B1, (float)B2);
                            arl_k_situ_glu_bwd(dg, du, dh, g, u, T, f, ld, (float)B1, (float)B2);
                        } else {
                            arl_k_swiglu_fwd(h, g, u, T, f, ld);
                            arl_k_swiglu_bwd(dg, du, dh, g, u, T, f, ld);
                        }
                        for (int64_t t = 0; t < T; t++)
                            for (int64_t i = 0; i < f; i++) {
                                double gv = g[t * ld + i], uv = u[t * ld + i];
                                double a = situ ? d_phi(gv) : d_silu(gv);
                                double da = situ ? fd(d_phi, gv) : fd(d_silu, gv);
                                double b = situ ? d_psi(uv) : uv;
                                double db = situ ? fd(d_psi, uv) : 1.0;
                                href[t * f + i] = (float)(a * b);
                                int64_t gi = (g - gbuf) + t * ld + i, ui = (u - gbuf) + t * ld + i;
                                dref[gi] = (float)(dbuf0[gi] + dh[t * f + i] * da * b);
                                dref[ui] = (float)(dbuf0[ui] + dh[t * f + i] * a * db);
                            }
                        const char *nm = situ ? "situ_glu" : "swiglu";
                        check_close_f32(nm, h, href, (size_t)(T * f), 1e-6, 1e-5);
                        check_close_f32(nm, dbuf, dref, (size_t)nbuf, 2e-5, 2e-5);
                        free(gbuf), free(dbuf), free(dbuf0), free(h), free(dh), free(href);
                        free(dref);
                    }
    }
}

int main(void) {
    TEST_RUN(test_activations);
    TEST_RUN(test_tails);
    TEST_RUN(test_situ_shape);
    TEST_RUN(test_glu);
    arl_k_threads_free();
    return test_finish();
}
