/* RMSNorm and L2Norm (kernels/norm.h) against float64 references written from spec/policy.md
 * section 1.3; backward against central finite differences of the float64 forward.
 *
 * Tolerances (elementwise, |a - ref| <= atol + rtol |ref|):
 *   forward  atol 1e-6, rtol 1e-5 - spec 16.4 for single elementwise ops: the kernel rounds the
 *            statistic (double accumulation) to fp32 once and the output once.
 *   backward atol 2e-6, rtol 2e-5 - a gradient is a difference of two O(1) terms (r w dy and the
 *            statistic term), each rounded to fp32 once, plus the fp32-stored rstd; the float64
 *            finite difference (h = 1e-4 x row scale) is accurate to ~1e-8 relative.
 * Inputs: N(0, s^2) rows with s in {1e-3, 1, 30} so that eps matters in some rows and not in
 * others; weights U(0.5, 1.5); upstream gradients N(0, 1). */
#include "kernels/norm.h"
#include "tests/kernels/kref.h"

/* Finite-difference step relative to the scale of the row an element belongs to (weights:
 * scale 1): truncation error ~ (h/scale)^2 = 1e-8 relative, round-off ~ 1e-16 |L| / h. */
#define FD_REL 1e-4

/* ---- float64 references ---- */

static void ref_rmsnorm(double *y, const double *x, const double *w, int64_t n, int64_t d,
                        double eps) {
    for (int64_t t = 0; t < n; t++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += x[t * d + i] * x[t * d + i];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int64_t i = 0; i < d; i++)
            y[t * d + i] = w[i] * x[t * d + i] * r;
    }
}

static void ref_l2norm(double *y, const double *x, const double *w_unused, int64_t n, int64_t d,
                       double eps) {
    (void)w_unused;
    for (int64_t t = 0; t < n; t++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += x[t * d + i] * x[t * d + i];
        double r = 1.0 / sqrt(ss + eps);
        for (int64_t i = 0; i < d; i++)
            y[t * d + i] = x[t * d + i] * r;
    }
}

static double row_scale(int64_t t);

typedef void (*ref_fwd)(double *y, const double *x, const double *w, int64_t n, int64_t d,
                        double eps);

/* L = sum R * f(x, w) in float64. */
static double ref_loss(ref_fwd f, const double *x, const double *w, const float *R, int64_t n,
                       int64_t d, double eps, double *ybuf) {
    f(ybuf, x, w, n, d, eps);
    double L = 0;
    for (int64_t i = 0; i < n * d; i++)
        L += R[i] * ybuf[i];
    return L;
}

/* Central differences of ref_loss w.r.t. every element of v (x or w); v is restored.
 * width: elements per row of v (d for x; the whole of w is one row of scale 1). */
static void fd_grad(double *g, double *v, int64_t nv, int64_t width, int is_x, ref_fwd f, double *x,
                    double *w, const float *R, int64_t n, int64_t d, double eps, double *ybuf) {
    for (int64_t i = 0; i < nv; i++) {
        double h = FD_REL * (is_x ? row_scale(i / width) : 1.0);
        double v0 = v[i];
        v[i] = v0 + h;
        double lp = ref_loss(f, x, w, R, n, d, eps, ybuf);
        v[i] = v0 - h;
        double lm = ref_loss(f, x, w, R, n, d, eps, ybuf);
        v[i] = v0;
        g[i] = (lp - lm) / (2 * h);
    }
}

static void to_double(double *o, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        o[i] = a[i];
}
static void to_float(float *o, const double *a, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        o[i] = (float)a[i];
}

/* Row t of an input gets scale row_scale(t). */
static double row_scale(int64_t t) {
    static const double scales[] = {1.0, 1e-3, 30.0};
    return scales[t % 3];
}
static void fill_rows(arl_rng *r, float *x, int64_t n, int64_t d) {
    for (int64_t t = 0; t < n; t++)
        kt_normal(r, x + t * d, d, 0, row_scale(t));
}

static const int64_t shapes[][2] = {{0, 5}, {1, 1}, {3, 17}, {5, 33}, {2, 130}, {4, 1}};
#define N_SHAPES 6

static void test_rmsnorm(void) {
    arl_rng r;
    arl_rng_seed(&r, 11);
    const float eps = 1e-5f;
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int s = 0; s < N_SHAPES; s++) {
            int64_t n = shapes[s][0], d = shapes[s][1], nd = n * d;
            float *x = kt_floats(nd), *w = kt_floats(d), *y = kt_floats(nd), *rstd = kt_floats(n);
            float *dy = kt_floats(nd), *dx = kt_floats(nd), *dw = kt_floats(d);
            float *dx0 = kt_floats(nd), *dw0 = kt_floats(d), *fref = kt_floats(nd + d);
            double *xd = kt_doubles(nd), *wd = kt_doubles(d), *yd = kt_doubles(nd);
            double *gx = kt_doubles(nd), *gw = kt_doubles(d);
            fill_rows(&r, x, n, d);
            kt_uniform(&r, w, d, 0.5, 1.5);
            kt_normal(&r, dy, nd, 0, 1);
            kt_normal(&r, dx0, nd, 0, 1); /* gradients accumulate onto existing values */
            kt_normal(&r, dw0, d, 0, 1);
            to_double(xd, x, nd);
            to_double(wd, w, d);

            arl_k_rmsnorm_fwd(y, rstd, x, w, n, d, eps);
            ref_rmsnorm(yd, xd, wd, n, d, eps);
            to_float(fref, yd, nd);
            check_close_f32("rmsnorm_fwd", y, fref, (size_t)nd, 1e-6, 1e-5);
            /* rstd without a backward: NULL is accepted and y is unchanged */
            float *y2 = kt_floats(nd);
            arl_k_rmsnorm_fwd(y2, NULL, x, w, n, d, eps);
            CHECK(kt_same_bits(y, y2, (size_t)nd * sizeof *y));
            free(y2);

            memcpy(dx, dx0, (size_t)nd * sizeof *dx);
            memcpy(dw, dw0, (size_t)d * sizeof *dw);
            arl_k_rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, d);
            fd_grad(gx, xd, nd, d, 1, ref_rmsnorm, xd, wd, dy, n, d, eps, yd);
            fd_grad(gw, wd, d, d, 0, ref_rmsnorm, xd, wd, dy, n, d, eps, yd);
            for (int64_t i = 0; i < nd; i++)
                fref[i] = (float)(dx0[i] + gx[i]);
            check_close_f32("rmsnorm_bwd dx", dx, fref, (size_t)nd, 2e-6, 2e-5);
            for (int64_t i = 0; i < d; i++)
                fref[i] = (float)(dw0[i] + gw[i]);
            check_close_f32("rmsnorm_bwd dw", dw, fref, (size_t)d, 2e-6, 2e-5);
            /* dw == NULL: dx identical to the run with dw */
            float *dx2 = kt_floats(nd);
            memcpy(dx2, dx0, (size_t)nd * sizeof *dx2);
            arl_k_rmsnorm_bwd(dx2, NULL, dy, x, w, rstd, n, d);
            CHECK(kt_same_bits(dx, dx2, (size_t)nd * sizeof *dx));
            free(dx2);

            free(x), free(w), free(y), free(rstd), free(dy), free(dx), free(dw), free(dx0);
            free(dw0), free(fref), free(xd), free(wd), free(yd), free(gx), free(gw);
        }
    }
}

static void test_l2norm(void) {
    arl_rng r;
    arl_rng_seed(&r, 12);
    const float eps = 1e-6f; /* spec 1.3: KDA q/k L2Norm */
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int s = 0; s < N_SHAPES; s++) {
            int64_t n = shapes[s][0], d = shapes[s][1], nd = n * d;
            float *x = kt_floats(nd), *y = kt_floats(nd), *rn = kt_floats(n), *dy = kt_floats(nd);
            float *dx = kt_floats(nd), *dx0 = kt_floats(nd), *fref = kt_floats(nd);
            double *xd = kt_doubles(nd), *yd = kt_doubles(nd), *gx = kt_doubles(nd);
            fill_rows(&r, x, n, d);
            kt_normal(&r, dy, nd, 0, 1);
            kt_normal(&r, dx0, nd, 0, 1);
            to_double(xd, x, nd);

            arl_k_l2norm_fwd(y, rn, x, n, d, eps);
            ref_l2norm(yd, xd, NULL, n, d, eps);
            to_float(fref, yd, nd);
            check_close_f32("l2norm_fwd", y, fref, (size_t)nd, 1e-6, 1e-5);

            memcpy(dx, dx0, (size_t)nd * sizeof *dx);
            arl_k_l2norm_bwd(dx, dy, x, rn, n, d);
            fd_grad(gx, xd, nd, d, 1, ref_l2norm, xd, NULL, dy, n, d, eps, yd);
            /* rows with scale 1e-3 (|x| ~ 1e-3 sqrt(d)) have gradients ~1/|x| ~ 1e2-1e3: the
             * relative term of the tolerance covers them */
            for (int64_t i = 0; i < nd; i++)
                fref[i] = (float)(dx0[i] + gx[i]);
            check_close_f32("l2norm_bwd dx", dx, fref, (size_t)nd, 2e-6, 2e-5);

            free(x), free(y), free(rn), free(dy), free(dx), free(dx0), free(fref), free(xd);
            free(yd), free(gx);
        }
    }
}

/* eps sits inside the root: a zero row gives y = 0 (not NaN), and a row with sum x^2 << eps is
 * scaled by ~eps^-1/2 (torch's normalize would scale by 1/max(|x|, eps) instead). */
static void test_l2norm_eps_inside_root(void) {
    kt_threads(2);
    float x[6] = {0, 0, 0, 1e-5f, 0, 0}, y[6], rn[2];
    arl_k_l2norm_fwd(y, rn, x, 2, 3, 1e-6f);
    CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0);
    CHECK_CLOSE(rn[0], 1000.0, 0, 1e-6);
    /* 1e-5 / sqrt(1e-10 + 1e-6) = 0.0099995 (normalize would give 1.0) */
    CHECK_CLOSE(y[3], 1e-5 / sqrt(1e-10 + 1e-6), 0, 1e-6);
    float z[2] = {0, 0}, w[2] = {1, 1}, yz[2], rz[1];
    arl_k_rmsnorm_fwd(yz, rz, z, w, 1, 2, 1e-5f);
    CHECK(yz[0] == 0 && yz[1] == 0);
    CHECK_CLOSE(rz[0], 1.0 / sqrt(1e-5), 0, 1e-6);
}

/* Larger shapes on the threaded path, against the float64 analytic backward (the formula was
 * checked by finite differences above). */
static void test_rmsnorm_large(void) {
    arl_rng r;
    arl_rng_seed(&r, 13);
    const int64_t n = 67, d = 1031, nd = n * d;
    float *x = kt_floats(nd), *w = kt_floats(d), *y = kt_floats(nd), *rstd = kt_floats(n);
    float *dy = kt_floats(nd), *dx = kt_floats(nd), *dw = kt_floats(d);
    float *fref = kt_floats(nd), *dwref = kt_floats(d);
    fill_rows(&r, x, n, d);
    kt_uniform(&r, w, d, 0.5, 1.5);
    kt_normal(&r, dy, nd, 0, 1);
    double *dwd = kt_doubles(d);
    for (int64_t t = 0; t < n; t++) {
        double ss = 0, s = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[t * d + i] * x[t * d + i];
        double rr = 1.0 / sqrt(ss / d + 1e-5);
        for (int64_t i = 0; i < d; i++)
            s += (double)w[i] * dy[t * d + i] * x[t * d + i];
        for (int64_t i = 0; i < d; i++) {
            fref[t * d + i] =
                (float)(rr * w[i] * dy[t * d + i] - rr * rr * rr * s / d * x[t * d + i]);
            dwd[i] += (double)dy[t * d + i] * x[t * d + i] * rr;
        }
    }
    to_float(dwref, dwd, d);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        memset(dx, 0, (size_t)nd * sizeof *dx);
        memset(dw, 0, (size_t)d * sizeof *dw);
        arl_k_rmsnorm_fwd(y, rstd, x, w, n, d, 1e-5f);
        arl_k_rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, d);
        check_close_f32("rmsnorm_bwd dx (large)", dx, fref, (size_t)nd, 2e-6, 2e-5);
        /* dw sums 67 products of O(1..30) values: the reference is ~1e2, relative form */
        check_close_f32("rmsnorm_bwd dw (large)", dw, dwref, (size_t)d, 1e-5, 2e-5);
    }
    free(x), free(w), free(y), free(rstd), free(dy), free(dx), free(dw), free(fref), free(dwref);
    free(dwd);
}

/* Narrow rows (d <= 512): dw is summed in eight fixed row chunks in parallel (kernels/norm.h).
 * The shapes: the tiny model's (2048 x 128, every chunk its own part), a row count not divisible
 * by eight, and fewer rows than chunks (empty chunks).  dw must be bit-identical for every thread
 * count and match the float64 sum (the chunked order moves only double rounding). */
static void test_rmsnorm_dw_chunks(void) {
    static const int64_t shapes[][2] = {{2048, 128}, {1001, 512}, {5, 96}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t n = shapes[si][0], d = shapes[si][1], nd = n * d;
        arl_rng r;
        arl_rng_seed(&r, 31 + si);
        float *x = kt_floats(nd), *w = kt_floats(d), *y = kt_floats(nd), *rstd = kt_floats(n);
        float *dy = kt_floats(nd), *dx = kt_floats(nd), *dw = kt_floats(d);
        float *dw0 = kt_floats(d), *dwref = kt_floats(d);
        double *dwd = kt_doubles(d);
        fill_rows(&r, x, n, d);
        kt_uniform(&r, w, d, 0.5, 1.5);
        kt_normal(&r, dy, nd, 0, 1);
        kt_threads(1);
        arl_k_rmsnorm_fwd(y, rstd, x, w, n, d, 1e-5f);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < d; i++)
                dwd[i] += (double)dy[t * d + i] * x[t * d + i] * rstd[t];
        to_float(dwref, dwd, d);
        for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
            kt_threads(kt_thread_counts[tc]);
            memset(dx, 0, (size_t)nd * sizeof *dx);
            memset(dw, 0, (size_t)d * sizeof *dw);
            arl_k_rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, d);
            /* up to 2048 products of O(1..30) values, summed in double: fp32 output rounding */
            check_close_f32("rmsnorm_bwd dw (chunked)", dw, dwref, (size_t)d, 1e-5, 2e-5);
            if (tc == 0)
                memcpy(dw0, dw, (size_t)d * sizeof *dw);
            else
                CHECK_MSG(memcmp(dw0, dw, (size_t)d * sizeof *dw) == 0,
                          "rmsnorm_bwd dw (chunked) differs between thread counts");
        }
        free(x), free(w), free(y), free(rstd), free(dy), free(dx), free(dw), free(dw0);
        free(dwref), free(dwd);
    }
}

int main(void) {
    TEST_RUN(test_rmsnorm);
    TEST_RUN(test_l2norm);
    TEST_RUN(test_l2norm_eps_inside_root);
    TEST_RUN(test_rmsnorm_large);
    TEST_RUN(test_rmsnorm_dw_chunks);
    arl_k_threads_free();
    return test_finish();
}
