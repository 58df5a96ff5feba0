/* Softmax, log-softmax and target log-probabilities (kernels/softmax.h) against float64
 * references; backward against central finite differences of the float64 forward.
 *
 * Tolerances (elementwise, |a - ref| <= atol + rtol |ref|):
 *   forward  atol 1e-6, rtol 1e-5 (spec 16.4, single ops): exp in fp32 of an exact or
 *            once-rounded difference x - max, sums in double, one final rounding.
 *   backward atol 2e-6, rtol 2e-5: two O(|dy|) terms rounded once each; for the log-prob
 *            backward the fp32-stored lse adds |lse| * 2^-24 relative error to every p_j,
 *            below 1e-5 for the |logits| < 50 used here (LM logits are within +-30).
 * Finite differences: h = 1e-4 on logits of scale ~3 (truncation ~1e-8).
 * Inputs: N(0, 3^2) plus a per-row offset (0, +50, -40) to exercise the max subtraction; an
 * offset of 1e4 checks that nothing overflows. */
#include "kernels/softmax.h"
#include "tests/kernels/kref.h"

#define FD_H 1e-4

static const double offsets[] = {0.0, 50.0, -40.0};

static void fill_logits(arl_rng *r, float *x, int64_t n, int64_t d) {
    for (int64_t t = 0; t < n; t++)
        kt_normal(r, x + t * d, d, offsets[t % 3], 3.0);
}

/* ---- float64 references (row max subtracted; all sums in double) ---- */

static double ref_lse(const double *x, int64_t d) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < d; i++)
        m = x[i] > m ? x[i] : m;
    for (int64_t i = 0; i < d; i++)
        s += exp(x[i] - m);
    return m + log(s);
}

/* kind 0: softmax, 1: log-softmax */
static void ref_rows(int kind, double *y, const double *x, int64_t n, int64_t d) {
    for (int64_t t = 0; t < n; t++) {
        double lse = ref_lse(x + t * d, d);
        for (int64_t i = 0; i < d; i++) {
            double ls = x[t * d + i] - lse;
            y[t * d + i] = kind ? ls : exp(ls);
        }
    }
}

static double ref_rows_loss(int kind, const double *x, const float *R, int64_t n, int64_t d,
                            double *ybuf) {
    ref_rows(kind, ybuf, x, n, d);
    double L = 0;
    for (int64_t i = 0; i < n * d; i++)
        L += R[i] * ybuf[i];
    return L;
}

static const int64_t shapes[][2] = {{0, 5}, {1, 1}, {3, 17}, {7, 33}, {2, 1000}, {4, 2}};
#define N_SHAPES 6

static void test_softmax_and_logsoftmax(void) {
    arl_rng r;
    arl_rng_seed(&r, 21);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int kind = 0; kind < 2; kind++) {
            const char *name = kind ? "logsoftmax" : "softmax";
            for (int s = 0; s < N_SHAPES; s++) {
                int64_t n = shapes[s][0], d = shapes[s][1], nd = n * d;
                float *x = kt_floats(nd), *y = kt_floats(nd), *dy = kt_floats(nd);
                float *dx = kt_floats(nd), *dx0 = kt_floats(nd), *fref = kt_floats(nd);
                double *xd = kt_doubles(nd), *yd = kt_doubles(nd);
                fill_logits(&r, x, n, d);
                kt_normal(&r, dy, nd, 0, 1);
                kt_normal(&r, dx0, nd, 0, 1);
                for (int64_t i = 0; i < nd; i++)
                    xd[i] = x[i];

                if (kind)
                    arl_k_logsoftmax_fwd(y, x, n, d);
                else
                    arl_k_softmax_fwd(y, x, n, d);
                ref_rows(kind, yd, xd, n, d);
                for (int64_t i = 0; i < nd; i++)
                    fref[i] = (float)yd[i];
                check_close_f32(name, y, fref, (size_t)nd, 1e-6, 1e-5);

                memcpy(dx, dx0, (size_t)nd * sizeof *dx);
                if (kind)
                    arl_k_logsoftmax_bwd(dx, dy, y, n, d);
                else
                    arl_k_softmax_bwd(dx, dy, y, n, d);
                for (int64_t i = 0; i < nd; i++) {
                    double x0 = xd[i];
                    xd[i] = x0 + FD_H;
                    double lp = ref_rows_loss(kind, xd, dy, n, d, yd);
                    xd[i] = x0 - FD_H;
                    double lm = ref_rows_loss(kind, xd, dy, n, d, yd);
                    xd[i] = x0;
                    fref[i] = (float)(dx0[i] + (lp - lm) / (2 * FD_H));
                }
                check_close_f32(kind ? "logsoftmax_bwd" : "softmax_bwd", dx, fref, (size_t)nd, 2e-6,
                                2e-5);

                /* in place: y == x gives the same bits */
                float *xi = kt_floats(nd);
                memcpy(xi, x, (size_t)nd * sizeof *xi);
                if (kind)
                    arl_k_logsoftmax_fwd(xi, xi, n, d);
                else
                    arl_k_softmax_fwd(xi, xi, n, d);
                CHECK(kt_same_bits(xi, y, (size_t)nd * sizeof *y));
                free(xi);
                free(x), free(y), free(dy), free(dx), free(dx0), free(fref), free(xd), free(yd);
            }
        }
    }
}

/* Masked positions (-inf) get probability 0; a fully masked row gives zeros and no gradient;
 * huge offsets do not overflow. */
static void test_softmax_masks_and_range(void) {
    kt_threads(2);
    const float NI = -INFINITY;
    float x[12] = {1,    NI,       2,        NI,   /* partly masked */ NI,
                   NI,   NI,       NI, /* fully masked */
                   1e4f, 1e4f + 1, 1e4f - 1, -1e4f};
    float y[12], dy[12], dx[12];
    arl_k_softmax_fwd(y, x, 3, 4);
    double e1 = exp(-1.0);
    CHECK_CLOSE(y[0], e1 / (1 + e1), 1e-7, 1e-6);
    CHECK(y[1] == 0 && y[3] == 0);
    CHECK_CLOSE(y[2], 1 / (1 + e1), 1e-7, 1e-6);
    for (int i = 4; i < 8; i++)
        CHECK(y[i] == 0);
    double z = 1 + exp(1.0) + exp(-1.0);
    CHECK_CLOSE(y[9], exp(1.0) / z, 1e-7, 1e-6);
    CHECK(y[11] == 0);
    for (int i = 0; i < 12; i++)
        dy[i] = (float)(i + 1), dx[i] = 0;
    arl_k_softmax_bwd(dx, dy, y, 3, 4);
    int finite = 1;
    for (int i = 0; i < 12; i++)
        finite &= isfinite(dx[i]);
    CHECK(finite);
    for (int i = 4; i < 8; i++)
        CHECK(dx[i] == 0);
    CHECK(dx[1] == 0 && dx[3] == 0);
    /* log-softmax of the large row: finite, exact differences */
    float ls[4];
    arl_k_logsoftmax_fwd(ls, x + 8, 1, 4);
    CHECK_CLOSE(ls[1], 1.0 - log(z), 1e-6, 1e-6);
    CHECK(isfinite(ls[3]) && ls[3] < -1e4f);
}

/* ---- log-probabilities of targets ---- */

static double ref_logprob_loss(const double *z, const int32_t *tg, const float *R, int64_t n,
                               int64_t V) {
    double L = 0;
    for (int64_t t = 0; t < n; t++)
        if (tg[t] >= 0) L += R[t] * (z[t * V + tg[t]] - ref_lse(z + t * V, V));
    return L;
}

static void test_logprob(void) {
    arl_rng r;
    arl_rng_seed(&r, 22);
    static const int64_t cases[][2] = {{0, 7}, {1, 1}, {5, 3}, {6, 37}, {3, 1031}};
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        for (int c = 0; c < 5; c++) {
            int64_t n = cases[c][0], V = cases[c][1], nV = n * V;
            float *z = kt_floats(nV), *logp = kt_floats(n), *lse = kt_floats(n);
            float *ent = kt_floats(n), *dlogp = kt_floats(n), *dz = kt_floats(nV);
            float *dz0 = kt_floats(nV), *fref = kt_floats(nV);
            int32_t *tg = kt_alloc((size_t)n * sizeof *tg);
            double *zd = kt_doubles(nV);
            fill_logits(&r, z, n, V);
            kt_normal(&r, dlogp, n, 0, 1);
            kt_normal(&r, dz0, nV, 0, 1);
            for (int64_t t = 0; t < n; t++) /* every 4th row has no target */
                tg[t] = t % 4 == 3 ? -1 : (int32_t)arl_rng_below(&r, (uint64_t)V);
            for (int64_t i = 0; i < nV; i++)
                zd[i] = z[i];

            arl_k_logprob_fwd(logp, lse, ent, z, tg, n, V);
            int ok = 1;
            for (int64_t t = 0; t < n; t++) {
                double l = ref_lse(zd + t * V, V), h = 0;
                for (int64_t j = 0; j < V; j++) {
                    double p = exp(zd[t * V + j] - l);
                    h -= p > 0 ? p * (zd[t * V + j] - l) : 0;
                }
                double lp = tg[t] < 0 ? 0.0 : zd[t * V + tg[t]] - l;
                ok &= fabs(logp[t] - lp) <= 1e-6 + 1e-5 * fabs(lp);
                ok &= fabs(lse[t] - l) <= 1e-6 + 1e-5 * fabs(l);
                ok &= fabs(ent[t] - h) <= 1e-6 + 1e-5 * fabs(h);
                if (tg[t] < 0) ok &= logp[t] == 0.0f;
            }
            CHECK_MSG(ok, "logprob_fwd n %lld V %lld", (long long)n, (long long)V);
            /* optional outputs may be NULL: same logp */
            float *logp2 = kt_floats(n);
            arl_k_logprob_fwd(logp2, NULL, NULL, z, tg, n, V);
            CHECK(kt_same_bits(logp, logp2, (size_t)n * sizeof *logp));
            free(logp2);

            memcpy(dz, dz0, (size_t)nV * sizeof *dz);
            arl_k_logprob_bwd(dz, dlogp, z, lse, tg, n, V);
            for (int64_t i = 0; i < nV; i++) {
                double z0 = zd[i];
                zd[i] = z0 + FD_H;
                double lp = ref_logprob_loss(zd, tg, dlogp, n, V);
                zd[i] = z0 - FD_H;
                double lm = ref_logprob_loss(zd, tg, dlogp, n, V);
                zd[i] = z0;
                fref[i] = (float)(dz0[i] + (lp - lm) / (2 * FD_H));
            }
            check_close_f32("logprob_bwd", dz, fref, (size_t)nV, 2e-6, 2e-5);
            /* rows without a target are untouched, bit for bit */
            int untouched = 1;
            for (int64_t t = 0; t < n; t++)
                if (tg[t] < 0) untouched &= kt_same_bits(dz + t * V, dz0 + t * V, (size_t)V * 4);
            CHECK(untouched);
            free(z), free(logp), free(lse), free(ent), free(dlogp), free(dz), free(dz0);
            free(fref), free(tg), free(zd);
        }
    }
}

/* V = 1: logp = 0, entropy = 0; uniform row: entropy = log V; peaked row: entropy ~ 0. */
static void test_logprob_edges(void) {
    kt_threads(2);
    float z1[1] = {123.0f}, lp, lse, h;
    int32_t t0 = 0;
    arl_k_logprob_fwd(&lp, &lse, &h, z1, &t0, 1, 1);
    CHECK(lp == 0.0f && h == 0.0f && lse == 123.0f);
    float zu[64];
    for (int i = 0; i < 64; i++)
        zu[i] = 2.5f;
    int32_t t5 = 5;
    arl_k_logprob_fwd(&lp, &lse, &h, zu, &t5, 1, 64);
    CHECK_CLOSE(h, log(64.0), 1e-6, 1e-6);
    CHECK_CLOSE(lp, -log(64.0), 1e-6, 1e-6);
    zu[7] = 1e4f;
    arl_k_logprob_fwd(&lp, &lse, &h, zu, &t5, 1, 64);
    CHECK(isfinite(lp) && lp < -9000.0f);
    CHECK(h >= 0.0f && h < 1e-6f);
}

int main(void) {
    TEST_RUN(test_softmax_and_logsoftmax);
    TEST_RUN(test_softmax_masks_and_range);
    TEST_RUN(test_logprob);
    TEST_RUN(test_logprob_edges);
    arl_k_threads_free();
    return test_finish();
}
