/* tests/report/test_stats.c: Wilson score intervals and Newcombe's interval for a difference of
 * proportions against published values, and eval.json reading/writing.
 *
 * References (95%, z = 1.959964):
 *   Wilson: R. G. Newcombe, "Two-sided confidence intervals for the single proportion:
 *   comparison of seven methods", Stat. Med. 17 (1998) 857-872, Table I, method 3 (score
 *   without continuity correction): 81/263 -> [0.2553, 0.3662], 15/148 -> [0.0624, 0.1605],
 *   0/20 -> [0, 0.1611], 1/29 -> [0.0061, 0.1718].  And 45/100 -> [0.3561, 0.5476] (by hand:
 *   centre (0.45 + z^2/200) / (1 + z^2/100) = 0.451850, half-width 0.095704).
 *   Newcombe: R. G. Newcombe, "Interval estimation for the difference between independent
 *   proportions: comparison of eleven methods", Stat. Med. 17 (1998) 873-890, Table II,
 *   method 10 (hybrid score without continuity correction):
 *     56/70 - 48/80 -> [0.0524, 0.3339]     9/10 - 3/10 -> [0.1705, 0.8090]
 *     6/7 - 2/7     -> [0.0582, 0.8062]     5/56 - 0/29 -> [-0.0381, 0.1926]
 *     0/10 - 0/20   -> [-0.1611, 0.2775]    10/10 - 0/20 -> [0.6791, 1.0000]
 * Tolerance: the published values have 4 decimals, so |ours - published| <= 5e-5 + 1e-9
 * (half a unit in the last place, plus rounding of our double computation). */
#include "experiments/report.h"
#include "tests/test.h"

#define TOL 5.0001e-5

static void test_wilson(void) {
    static const struct {
        int64_t k, n;
        double lo, hi;
    } ref[] = {{81, 263, 0.2553, 0.3662},
               {15, 148, 0.0624, 0.1605},
               {0, 20, 0.0, 0.1611},
               {1, 29, 0.0061, 0.1718},
               {45, 100, 0.3561, 0.5476}};
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
        double lo, hi;
        double p = arl_report_wilson(ref[i].k, ref[i].n, ARL_REPORT_Z95, &lo, &hi);
        CHECK_CLOSE(p, (double)ref[i].k / (double)ref[i].n, 0, 1e-15);
        CHECK_CLOSE(lo, ref[i].lo, TOL, 0);
        CHECK_CLOSE(hi, ref[i].hi, TOL, 0);
    }
    /* the hand computation of 45/100 to 6 decimals */
    double lo, hi;
    arl_report_wilson(45, 100, ARL_REPORT_Z95, &lo, &hi);
    CHECK_CLOSE(lo, 0.356145, 5e-7, 0);
    CHECK_CLOSE(hi, 0.547554, 5e-7, 0);
    /* bounds stay in [0, 1]; n = 0 has no interval */
    arl_report_wilson(29, 29, ARL_REPORT_Z95, &lo, &hi);
    CHECK(hi == 1 && lo > 0.88 && lo < 0.89);
    double p = arl_report_wilson(0, 0, ARL_REPORT_Z95, &lo, &hi);
    CHECK(isnan(p) && isnan(lo) && isnan(hi));
}

static void test_newcombe(void) {
    static const struct {
        int64_t k1, n1, k0, n0;
        double lo, hi;
    } ref[] = {{56, 70, 48, 80, 0.0524, 0.3339}, {9, 10, 3, 10, 0.1705, 0.8090},
               {6, 7, 2, 7, 0.0582, 0.8062},     {5, 56, 0, 29, -0.0381, 0.1926},
               {0, 10, 0, 20, -0.1611, 0.2775},  {10, 10, 0, 20, 0.6791, 1.0000}};
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
        double lo, hi;
        double d = arl_report_newcombe(ref[i].k1, ref[i].n1, ref[i].k0, ref[i].n0, ARL_REPORT_Z95,
                                       &lo, &hi);
        CHECK_CLOSE(d, (double)ref[i].k1 / ref[i].n1 - (double)ref[i].k0 / ref[i].n0, 1e-15, 0);
        CHECK_CLOSE(lo, ref[i].lo, TOL, 0);
        CHECK_CLOSE(hi, ref[i].hi, TOL, 0);
    }
    /* swapping the arms mirrors the interval */
    double lo1, hi1, lo2, hi2;
    arl_report_newcombe(56, 70, 48, 80, ARL_REPORT_Z95, &lo1, &hi1);
    arl_report_newcombe(48, 80, 56, 70, ARL_REPORT_Z95, &lo2, &hi2);
    CHECK_CLOSE(lo2, -hi1, 1e-15, 0);
    CHECK_CLOSE(hi2, -lo1, 1e-15, 0);
    double d = arl_report_newcombe(1, 0, 1, 2, ARL_REPORT_Z95, &lo1, &hi1);
    CHECK(isnan(d) && isnan(lo1) && isnan(hi1));
}

static void write_text(const char *path, const char *t) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(t, f);
    fclose(f);
}

static void test_eval_json(void) {
    const char *tmp = test_tmpdir("report-eval");
    char path[600];
    snprintf(path, sizeof path, "%s/eval.json", tmp);
    arl_report_eval e, r;
    arl_report_eval_init(&e);
    e.before = (arl_report_eval_arm){100, 45};
    e.after = (arl_report_eval_arm){100, 62};
    e.kl_target = 0.01;
    e.kl_mean = 0.0123456789012345;
    CHECK_EQ_INT(arl_report_eval_write(path, &e), ARL_OK);
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_OK);
    CHECK_EQ_INT(r.before.episodes, 100);
    CHECK_EQ_INT(r.before.successes, 45);
    CHECK_EQ_INT(r.after.episodes, 100);
    CHECK_EQ_INT(r.after.successes, 62);
    CHECK(r.kl_target == 0.01 && r.kl_mean == e.kl_mean); /* exact round trip */

    /* everything optional; absent arms are episodes < 0 */
    write_text(path, "{\"after\": {\"episodes\": 10, \"successes\": 3}}");
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_OK);
    CHECK(r.before.episodes < 0 && r.after.episodes == 10 && isnan(r.kl_mean));
    arl_report_eval_init(&e);
    e.after = (arl_report_eval_arm){10, 3};
    CHECK_EQ_INT(arl_report_eval_write(path, &e), ARL_OK);
    CHECK_EQ_INT(arl_report_eval_read(path, &r), ARL_OK);
    CHECK(r.before.episodes < 0 && r.after.successes == 3 && isnan(r.kl_target));

    /* errors name the key */
    static const struct {
        const char *text, *needle;
        arl_status s;
    } bad[] = {
        {"{\"after\": {\"episodes\": 10, \"successes\": 11}}", "successes 11 > episodes 10",
         ARL_ERR_FORMAT},
        {"{\"before\": {\"episodes\": -1, \"successes\": 0}}", "'before.episodes'", ARL_ERR_FORMAT},
        {"{\"before\": {\"episodes\": 5}}", "needs both", ARL_ERR_FORMAT},
        {"{\"befor\": {}}", "'befor': unknown key", ARL_ERR_FORMAT},
        {"{\"after\": {\"episodes\": 5, \"successes\": 1, \"x\": 1}}", "'after.x'", ARL_ERR_FORMAT},
        {"{\"kl_mean\": \"high\"}", "'kl_mean'", ARL_ERR_FORMAT},
        {"{\"version\": 2}", "'version'", ARL_ERR_VERSION},
        {"[1]", "expected a JSON object", ARL_ERR_FORMAT},
        {"{\"before\": ", "not valid JSON", ARL_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        CHECK_EQ_INT(arl_report_eval_read(path, &r), bad[i].s);
        CHECK_MSG(strstr(arl_error_msg(), bad[i].needle) != NULL, "case %zu: %s", i,
                  arl_error_msg());
        CHECK(r.before.episodes < 0 && r.after.episodes < 0); /* nothing half-read */
    }
    CHECK_EQ_INT(arl_report_eval_read("/nonexistent/eval.json", &r), ARL_ERR_NOT_FOUND);
    arl_report_eval_init(&e);
    e.before = (arl_report_eval_arm){3, 4};
    CHECK_EQ_INT(arl_report_eval_write(path, &e), ARL_ERR_ARG);
}

int main(void) {
    TEST_RUN(test_wilson);
    TEST_RUN(test_newcombe);
    TEST_RUN(test_eval_json);
    return test_finish();
}
