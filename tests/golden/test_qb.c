/* tests/golden/test_qb.c: policy/qb.c against the golden cases qb_exact, qb_hist and qb_band
 * (spec 9.2, 9.3, 9.5), with the loads before and after the step.
 *
 * Tolerances: spec 16.4 gives QB biases the max|ref| form and integer loads exact matches.
 * Biases and cutoffs come from fp32 sums s + b and differences alpha - s (one or two roundings
 * of values below 2 in magnitude, ~2e-7) and a linear interpolation: atol = 1e-6 absolute
 * (biases are centred, so max|ref| can be small; 1e-6 is ~5 roundings) with rtol = 1e-5.
 * Histogram biases also depend on which bin an r falls into: the golden data keeps every r at
 * least 1e-5 from the edges of the bins that matter (manifest: quantile_bin_edge_margin), so
 * the counts match exactly and the same bounds apply.  Loads after a step use this
 * implementation's new bias; the golden data keeps every top-k margin above 1e-5 (>> the bias
 * error), so they must match exactly.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/topk.h"
#include "policy/qb.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

enum { M = 512, E = 16, K = 4 };
#define ATOL 1e-6
#define RTOL 1e-5

static void cmp(golden_case *gc, const char *name, const float *a, int64_t n) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, ATOL, RTOL);
}

/* Loads of top-k(s + b) routing (ties to the lower index, as the router). */
static void loads_of(int64_t *loads, const float *s, const float *b, float *buf, int32_t *idx) {
    for (int i = 0; i < M * E; i++)
        buf[i] = s[i] + b[i % E];
    arl_k_topk_rows(idx, NULL, buf, M, E, K);
    arl_qb_count_loads(loads, idx, M, K, E);
}

static void cmp_loads(golden_case *gc, const char *name, const int64_t *loads) {
    int64_t *ref = golden_i64(gc, name, E);
    for (int j = 0; j < E; j++)
        CHECK_MSG(loads[j] == ref[j], "%s/%s[%d]: %lld vs %lld", golden_name(gc), name, j,
                  (long long)loads[j], (long long)ref[j]);
}

static float buf[M * E];
static int32_t idx[M * K];

static void test_qb_exact(void) {
    golden_case *gc = golden_open("qb_exact");
    float *s = golden_f32(gc, "s", M * E), *b_old = golden_f32(gc, "b_old", E);
    float *ws = golden_zeros(gc, arl_qb_ws_floats(M, E));
    float *alpha = golden_zeros(gc, M), bhat[E], b_new[E];
    int64_t loads[E];
    arl_qb_cutoffs(alpha, s, b_old, M, E, K, ws);
    cmp(gc, "alpha", alpha, M);
    CHECK(arl_qb_exact(b_new, bhat, s, b_old, M, E, K, ws) == ARL_OK);
    cmp(gc, "bhat", bhat, E);
    cmp(gc, "b_new", b_new, E);
    loads_of(loads, s, b_old, buf, idx);
    cmp_loads(gc, "loads_before", loads);
    loads_of(loads, s, b_new, buf, idx);
    cmp_loads(gc, "loads_after", loads);
    /* errors: no tokens, bad k */
    CHECK(arl_qb_exact(b_new, NULL, s, b_old, 0, E, K, ws) == ARL_ERR_ARG);
    CHECK(arl_qb_exact(b_new, NULL, s, b_old, M, E, E, ws) == ARL_ERR_ARG);
    golden_close(gc);
}

static void test_qb_hist(void) {
    golden_case *gc = golden_open("qb_hist");
    float *s = golden_f32(gc, "s", M * E), *b_old = golden_f32(gc, "b_old", E);
    float *ws = golden_zeros(gc, arl_qb_ws_floats(M, E));
    int64_t Nbs[2] = {64, 1024};
    for (int i = 0; i < 2; i++) {
        int64_t Nb = Nbs[i];
        char name[64];
        float lo, w, bhat[E], b_new[E];
        arl_qb_hist_range(&lo, &w, b_old, E, Nb);
        int64_t *cnt = calloc((size_t)(E * Nb), sizeof(int64_t));
        CHECK(cnt != NULL);
        /* two "ranks" of 200 and 312 tokens: counts add up as after an all-reduce */
        arl_qb_hist_count(cnt, s, b_old, 200, E, K, lo, w, Nb, ws);
        arl_qb_hist_count(cnt, s + 200 * E, b_old, M - 200, E, K, lo, w, Nb, ws);
        snprintf(name, sizeof name, "nb%lld_cnt", (long long)Nb);
        int64_t *ref = golden_i64(gc, name, E * Nb);
        int bad = 0;
        for (int64_t j = 0; j < E * Nb; j++)
            bad += cnt[j] != ref[j];
        CHECK_MSG(bad == 0, "%s: %d bin counts differ", name, bad);
        CHECK(arl_qb_hist_solve(b_new, bhat, cnt, M, E, K, lo, w, Nb) == ARL_OK);
        snprintf(name, sizeof name, "nb%lld_bhat", (long long)Nb);
        cmp(gc, name, bhat, E);
        snprintf(name, sizeof name, "nb%lld_b_new", (long long)Nb);
        cmp(gc, name, b_new, E);
        int64_t loads[E];
        loads_of(loads, s, b_new, buf, idx);
        snprintf(name, sizeof name, "nb%lld_loads_after", (long long)Nb);
        cmp_loads(gc, name, loads);
        free(cnt);
    }
    golden_close(gc);
}

static void test_qb_band(void) {
    golden_case *gc = golden_open("qb_band");
    float *s = golden_f32(gc, "s", M * E), *b_old = golden_f32(gc, "b_old", E);
    float *ws = golden_zeros(gc, arl_qb_ws_floats(M, E));
    float bhat[E], b_new[E];
    int64_t loads[E];
    loads_of(loads, s, b_old, buf, idx);
    cmp_loads(gc, "loads_before", loads);
    CHECK(arl_qb_band(b_new, bhat, loads, s, b_old, M, E, K, 0.2f, 0.3f, ws) == ARL_OK);
    cmp(gc, "bhat", bhat, E);
    cmp(gc, "b_new", b_new, E);
    int64_t after[E];
    loads_of(after, s, b_new, buf, idx);
    cmp_loads(gc, "loads_after", after);
    /* lam_lo = lam_hi = 0 is exactly spec 9.2 */
    float b_exact[E], b_band0[E];
    CHECK(arl_qb_exact(b_exact, NULL, s, b_old, M, E, K, ws) == ARL_OK);
    CHECK(arl_qb_band(b_band0, NULL, loads, s, b_old, M, E, K, 0.0f, 0.0f, ws) == ARL_OK);
    for (int j = 0; j < E; j++)
        CHECK(b_exact[j] == b_band0[j]);
    CHECK(arl_qb_band(b_new, NULL, loads, s, b_old, M, E, K, -0.1f, 0.0f, ws) == ARL_ERR_ARG);
    golden_close(gc);
}

/* The quantiles of spec 9.2 step 3 by sorting each column, as the spec states them. */
static int cmp_asc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float sorted_quantile(const float *alpha, const float *s, int64_t m, int j, double level,
                             float *col) {
    for (int64_t i = 0; i < m; i++)
        col[i] = alpha[i] - s[i * E + j];
    qsort(col, (size_t)m, sizeof(float), cmp_asc);
    double pi = (double)(m - 1) * level;
    int64_t phi = (int64_t)floor(pi);
    if (phi + 1 >= m) return col[m - 1];
    double lam = pi - (double)phi;
    return (float)((double)col[phi] + lam * ((double)col[phi + 1] - (double)col[phi]));
}

/* qb.c finds the two order statistics by selection; the biases must be those of the sort, bit
 * for bit, for every column and token count, with ties (scores on a coarse grid), for the exact
 * update and for the band's clamped levels. */
static void test_qb_select_is_sort(void) {
    static const int64_t ms[] = {1, 2, 3, 5, 17, 64, 511};
    static float s[511 * E], alpha[511], col[511], ws[511 * E + 2 * 511 + E];
    uint64_t x = 12345;
    for (size_t c = 0; c < sizeof ms / sizeof *ms; c++)
        for (int grid = 0; grid < 2; grid++) {
            const int64_t m = ms[c];
            float b_old[E], bhat[E], b_new[E];
            for (int64_t i = 0; i < m * E; i++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                float u = (float)(x >> 40) / (float)(1 << 24) * 4.0f - 2.0f;
                s[i] = grid ? (float)(int)(u * 4.0f) / 4.0f : u; /* grid: many ties */
            }
            for (int j = 0; j < E; j++)
                b_old[j] = grid ? 0.0f : 0.01f * (float)(j % 5) - 0.02f;
            arl_qb_cutoffs(alpha, s, b_old, m, E, K, ws);
            CHECK(arl_qb_exact(b_new, bhat, s, b_old, m, E, K, ws) == ARL_OK);
            for (int j = 0; j < E; j++) {
                float ref = sorted_quantile(alpha, s, m, j, (double)K / (double)E, col);
                CHECK_MSG(memcmp(&ref, &bhat[j], sizeof ref) == 0,
                          "m %lld grid %d column %d: exact %.9g, sorted %.9g", (long long)m, grid,
                          j, (double)bhat[j], (double)ref);
            }
            int64_t loads[E]; /* loads spread over [0, 2 m k / E]: both sides of the band */
            for (int j = 0; j < E; j++)
                loads[j] = (int64_t)j * 2 * m * K / E / (E - 1);
            CHECK(arl_qb_band(b_new, bhat, loads, s, b_old, m, E, K, 0.2f, 0.3f, ws) == ARL_OK);
            const double q = (double)m * K / E, qmin = (1.0 - 0.2f) * q, qmax = (1.0 + 0.3f) * q;
            for (int j = 0; j < E; j++) {
                double load = (double)loads[j];
                float ref = b_old[j];
                if (load < qmin || load > qmax) {
                    double qj = load < qmin ? qmin : qmax;
                    ref = sorted_quantile(alpha, s, m, j, qj / (double)m, col);
                }
                CHECK_MSG(memcmp(&ref, &bhat[j], sizeof ref) == 0,
                          "m %lld grid %d column %d: band %.9g, sorted %.9g", (long long)m, grid, j,
                          (double)bhat[j], (double)ref);
            }
        }
}

int main(void) {
    TEST_RUN(test_qb_exact);
    TEST_RUN(test_qb_hist);
    TEST_RUN(test_qb_band);
    TEST_RUN(test_qb_select_is_sort);
    return test_finish();
}
