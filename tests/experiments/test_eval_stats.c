/* tests/experiments/test_eval_stats.c: the paired comparison of the held-out evaluation
 * (experiments/report.h): Newcombe's interval for paired proportions, the exact McNemar test,
 * and the "paired" table of eval.json and summary.md.
 *
 * The paired interval is checked by properties that pin it down rather than by copying its own
 * formula: (1) with phi = 0 (a*d = b*c) it must equal the independent-samples interval of the
 * same marginal counts (the formula reduces to method 10 of the unpaired paper, which
 * tests/report/test_stats.c checks against published values); (2) swapping the two arms
 * negates it; (3) with positively correlated outcomes it is strictly narrower than the
 * unpaired one; (4) simulated coverage: 4000 tables of n = 200 tasks drawn from a fixed joint
 * distribution (difference +0.10) must cover the truth in 93%-97% of the draws (nominal 95%;
 * the Monte-Carlo standard error is 0.35 points, and score-type intervals sit within about a
 * point of nominal at this n, Newcombe 1998 Table III).
 * McNemar: exact binomial tail values computed by hand (2 P(X <= 2 | 11, 1/2) = 134/2048). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/rng.h"
#include "experiments/report.h"
#include "tests/test.h"

static arl_report_eval_paired table(int64_t both, int64_t before_only, int64_t after_only,
                                    int64_t neither) {
    arl_report_eval_paired p = {both + before_only + after_only + neither, both, before_only,
                                after_only, neither};
    return p;
}

static void test_phi_zero_is_unpaired(void) {
    /* a d = 10 * 15 = 150 = b c = 30 * 5 (b = after_only = 30, c = before_only = 5) */
    arl_report_eval_paired p = table(10, 5, 30, 15);
    double lo, hi, ulo, uhi;
    double d = arl_report_newcombe_paired(&p, ARL_REPORT_Z95, &lo, &hi);
    double ud = arl_report_newcombe(40, 60, 15, 60, ARL_REPORT_Z95, &ulo, &uhi);
    CHECK_CLOSE(d, 25.0 / 60.0, 0, 1e-15);
    CHECK_CLOSE(d, ud, 0, 1e-15);
    /* same formula up to the phi term, which is exactly 0 here: rounding only */
    CHECK_CLOSE(lo, ulo, 1e-15, 0);
    CHECK_CLOSE(hi, uhi, 1e-15, 0);
}

static void test_symmetry_and_width(void) {
    arl_report_eval_paired p = table(40, 6, 19, 135), q = table(40, 19, 6, 135);
    double lo, hi, qlo, qhi;
    double d = arl_report_newcombe_paired(&p, ARL_REPORT_Z95, &lo, &hi);
    double e = arl_report_newcombe_paired(&q, ARL_REPORT_Z95, &qlo, &qhi);
    CHECK_CLOSE(d, 13.0 / 200.0, 0, 1e-15);
    CHECK_CLOSE(e, -d, 0, 1e-15);
    CHECK_CLOSE(qlo, -hi, 1e-15, 0);
    CHECK_CLOSE(qhi, -lo, 1e-15, 0);
    CHECK(lo < d && d < hi);
    /* strongly correlated outcomes: the paired interval is narrower than the unpaired one */
    double ulo, uhi;
    arl_report_newcombe(59, 200, 46, 200, ARL_REPORT_Z95, &ulo, &uhi);
    CHECK(hi - lo < 0.8 * (uhi - ulo));
    /* here the paired interval excludes 0 while the unpaired one does not */
    CHECK(lo > 0 && ulo < 0);
    /* no discordant task: the difference is 0 and the interval contains it */
    arl_report_eval_paired z = table(30, 0, 0, 70);
    d = arl_report_newcombe_paired(&z, ARL_REPORT_Z95, &lo, &hi);
    CHECK(d == 0 && lo < 0 && hi > 0);
    /* no task: NaN */
    arl_report_eval_paired none = table(0, 0, 0, 0);
    d = arl_report_newcombe_paired(&none, ARL_REPORT_Z95, &lo, &hi);
    CHECK(isnan(d) && isnan(lo) && isnan(hi));
}

static void test_coverage(void) {
    /* joint distribution: both 0.25, before only 0.05, after only 0.15, neither 0.55 */
    const double cum[4] = {0.25, 0.30, 0.45, 1.0};
    const double truth = 0.15 - 0.05;
    arl_rng r;
    arl_rng_seed(&r, 12345);
    int covered = 0;
    const int reps = 4000, n = 200;
    for (int k = 0; k < reps; k++) {
        int64_t c[4] = {0, 0, 0, 0};
        for (int i = 0; i < n; i++) {
            double u = arl_rng_uniform(&r);
            int j = 0;
            while (u >= cum[j])
                j++;
            c[j]++;
        }
        arl_report_eval_paired p = table(c[0], c[1], c[2], c[3]);
        double lo, hi;
        arl_report_newcombe_paired(&p, ARL_REPORT_Z95, &lo, &hi);
        covered += lo <= truth && truth <= hi;
    }
    double cov = (double)covered / reps;
    CHECK_MSG(cov >= 0.93 && cov <= 0.97, "coverage %.4f", cov);
}

static void test_mcnemar(void) {
    CHECK_CLOSE(arl_report_mcnemar_exact(2, 9), 134.0 / 2048.0, 0, 1e-12);
    CHECK_CLOSE(arl_report_mcnemar_exact(9, 2), 134.0 / 2048.0, 0, 1e-12);
    CHECK_CLOSE(arl_report_mcnemar_exact(0, 5), 2.0 / 32.0, 0, 1e-12);
    CHECK(arl_report_mcnemar_exact(4, 4) == 1.0);
    CHECK(arl_report_mcnemar_exact(0, 0) == 1.0);
    /* large counts stay finite and tiny: 0 vs 3000 */
    double p = arl_report_mcnemar_exact(0, 3000);
    CHECK(p >= 0 && p < 1e-300);
    /* 100 vs 140: two-sided tail of Binomial(240, 1/2) at 100, about 0.0117 */
    p = arl_report_mcnemar_exact(100, 140);
    CHECK(p > 0.010 && p < 0.013);
}

static void test_eval_json_and_summary(void) {
    const char *dir = test_tmpdir("eval-stats");
    char path[1024];
    snprintf(path, sizeof path, "%s/eval.json", dir);
    arl_report_eval e, r;
    arl_report_eval_init(&e);
    CHECK(e.paired.tasks < 0);
    e.before = (arl_report_eval_arm){200, 46};
    e.after = (arl_report_eval_arm){200, 59};
    e.paired = table(40, 6, 19, 135);
    snprintf(e.set, sizeof e.set, "validation");
    CHECK_EQ_INT(arl_report_eval_write(path, &e), ARL_OK);
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_OK);
    CHECK_STR_EQ(r.set, "validation");
    CHECK_EQ_INT(r.paired.tasks, 200);
    CHECK_EQ_INT(r.paired.both, 40);
    CHECK_EQ_INT(r.paired.before_only, 6);
    CHECK_EQ_INT(r.paired.after_only, 19);
    CHECK_EQ_INT(r.paired.neither, 135);
    /* counts that do not add up are refused on write; bad members on read */
    arl_report_eval bad = e;
    bad.paired.tasks = 199;
    CHECK_EQ_INT(arl_report_eval_write(path, &bad), ARL_ERR_ARG);
    FILE *f = fopen(path, "w");
    fputs("{\"version\": 1, \"paired\": {\"both\": 1, \"before_only\": -1, \"after_only\": 0, "
          "\"neither\": 0}}\n",
          f);
    fclose(f);
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_ERR_FORMAT);
    f = fopen(path, "w");
    fputs("{\"version\": 1, \"paired\": {\"both\": 1, \"before_only\": 1, \"after_only\": 0, "
          "\"neither\": 0, \"extra\": 2}}\n",
          f);
    fclose(f);
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_ERR_FORMAT);
    /* a set name must be a non-empty string that fits */
    const char *bad_sets[3] = {"{\"version\": 1, \"set\": 3}\n", "{\"version\": 1, \"set\": \"\"}\n",
                               "{\"version\": 1, \"set\": \"a-name-of-16-char\"}\n"};
    for (int i = 0; i < 3; i++) {
        f = fopen(path, "w");
        fputs(bad_sets[i], f);
        fclose(f);
        CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_ERR_FORMAT);
    }
    /* summary.md: both intervals, the 2x2 table, the verdict from the paired interval */
    char mpath[1024];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", dir);
    f = fopen(mpath, "w");
    fputs("{\"step\": 0, \"kl/k3\": 0.01, \"kl/target\": 0.01}\n", f);
    /* 8 updates: the last quarter is steps 6 and 7 (ratios 0.5 and 1.5), the highest ratio is
     * step 3's 2.5 */
    const double k3[7] = {0.004, 0.012, 0.025, 0.009, 0.011, 0.005, 0.015};
    for (int i = 0; i < 7; i++)
        fprintf(f, "{\"step\": %d, \"kl/k3\": %g, \"kl/target\": 0.01}\n", i + 1, k3[i]);
    fclose(f);
    arl_metrics *m = NULL;
    CHECK_EQ_INT(arl_metrics_read(mpath, &m), ARL_OK);
    arl_report_opts o = {.title = "paired", .eval = &e};
    arl_report_result res;
    CHECK_EQ_INT(arl_report_write(m, dir, &o, &res), ARL_OK);
    arl_metrics_free(m);
    char spath[1024];
    snprintf(spath, sizeof spath, "%s/summary.md", dir);
    f = fopen(spath, "rb");
    static char md[1 << 16];
    size_t n = f ? fread(md, 1, sizeof md - 1, f) : 0;
    if (f) fclose(f);
    md[n] = 0;
    CHECK(strstr(md, "(unpaired) | | | +0.0650 |") != NULL);
    CHECK(strstr(md, "(paired, 200 tasks) | | | +0.0650 |") != NULL);
    CHECK(strstr(md, "| before: success | 40 | 6 |") != NULL);
    CHECK(strstr(md, "| before: failure | 19 | 135 |") != NULL);
    CHECK(strstr(md, "McNemar test p = ") != NULL);
    CHECK(strstr(md, "Improved: the 95% interval of the difference lies above zero.") != NULL);
    CHECK_MSG(strstr(md, "Per update (kl/k3 / kl/target): 0.50\xC3\x97 to 1.50\xC3\x97 over the "
                         "last 2; highest 2.50\xC3\x97 (step 3) over the 8 updates.") != NULL,
              "%s", strstr(md, "Per-token KL") ? strstr(md, "Per-token KL") : "no KL line");
    CHECK(strstr(md, "Evaluation set: **validation**") != NULL);
}

int main(void) {
    TEST_RUN(test_phi_zero_is_unpaired);
    TEST_RUN(test_symmetry_and_width);
    TEST_RUN(test_coverage);
    TEST_RUN(test_mcnemar);
    TEST_RUN(test_eval_json_and_summary);
    return test_finish();
}
