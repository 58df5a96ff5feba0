/* tests/report/test_metrics.c: reading metrics JSONL (missing keys, malformed lines with their
 * line numbers in the warning, non-numeric values, NaN spellings, nesting, steps carried to
 * lines without one) and metrics.csv against a hand-written expected file. */
#include <fcntl.h>
#include <unistd.h>

#include "core/file.h"
#include "experiments/report.h"
#include "tests/test.h"

/* The whole file at path, NUL-terminated (malloc'd); NULL if it cannot be read. */
static char *slurp(const char *path) {
    char *b = NULL;
    return arl_file_read(path, 0, &b, NULL) == ARL_OK ? b : NULL;
}

/* Points of a named column; returns n (0 if absent). */
static int64_t series(const arl_metrics *m, const char *name, const double **x, const double **y) {
    int32_t k = arl_metrics_find(m, name);
    if (k < 0) return 0;
    return arl_metrics_series(m, k, x, y);
}

/* The fixture: lines 3 (cut JSON) and 7 (an array) are malformed; line 2 has a text value. */
static void test_fixture_csv(void) {
    const char *tmp = test_tmpdir("report-metrics");
    char errpath[600], csvpath[600];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    snprintf(csvpath, sizeof csvpath, "%s/metrics.csv", tmp);

    /* capture the warnings written to stderr while reading */
    fflush(stderr);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    arl_metrics *m = NULL;
    arl_status s = arl_metrics_read(test_src_path("tests/report/data/metrics_fixture.jsonl"), &m);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_EQ_INT(s, ARL_OK);
    if (!m) return;

    char *err = slurp(errpath);
    CHECK(err != NULL);
    if (err) {
        CHECK_MSG(strstr(err, "metrics_fixture.jsonl:3:") != NULL, "stderr: %s", err);
        CHECK_MSG(strstr(err, "metrics_fixture.jsonl:7:") != NULL, "stderr: %s", err);
        CHECK_MSG(strstr(err, "line 2, key \"note\"") != NULL, "stderr: %s", err);
    }
    free(err);

    const arl_metrics_stats *st = arl_metrics_get_stats(m);
    CHECK_EQ_INT(st->lines, 10);
    CHECK_EQ_INT(st->objects, 7);
    CHECK_EQ_INT(st->malformed, 2);
    CHECK_EQ_INT(st->malformed_line[0], 3);
    CHECK_EQ_INT(st->malformed_line[1], 7);
    CHECK(strstr(st->malformed_msg, ":3:") != NULL);
    CHECK_EQ_INT(st->non_numeric, 1);
    CHECK_EQ_INT(st->non_numeric_line, 2);
    CHECK_STR_EQ(st->non_numeric_key, "note");
    CHECK_EQ_INT(st->nonfinite, 4); /* NaN, null, "inf", -Infinity */
    CHECK_EQ_INT(arl_metrics_rows(m), 7);
    CHECK_EQ_INT(arl_metrics_count(m), 17);
    CHECK_STR_EQ(arl_metrics_name(m, 0), "step");
    /* natural order: layer_2 before layer_10 */
    CHECK(arl_metrics_find(m, "moe/load_max/layer_2") <
          arl_metrics_find(m, "moe/load_max/layer_10"));

    /* a line without a step takes the step of the line before */
    const double *x, *y;
    CHECK_EQ_INT(series(m, "eval_loss", &x, &y), 1);
    CHECK(x[0] == 6 && y[0] == 1.5);
    /* nested object flattened with '/', array with [i], true as 1 */
    CHECK_EQ_INT(series(m, "kl/k3", &x, &y), 1);
    CHECK(x[0] == 5 && y[0] == 0.0005);
    CHECK_EQ_INT(series(m, "moe/load_violation/rollout[1]", &x, &y), 1);
    CHECK(y[0] == 0.2);
    CHECK_EQ_INT(series(m, "grad/clipped", &x, &y), 1);
    CHECK(y[0] == 1);
    /* kl/k1: missing on line 5's neighbour rows is fine; values in file order with inf, -inf */
    CHECK_EQ_INT(series(m, "kl/k1", &x, &y), 5);
    CHECK(x[0] == 1 && x[1] == 2 && x[2] == 4 && x[3] == 6 && x[4] == 7);
    CHECK(isinf(y[3]) && y[3] > 0 && isinf(y[4]) && y[4] < 0);
    CHECK_EQ_INT(series(m, "reward/outcome/mean", &x, &y), 5); /* lines 1, 2, 5, 8, 10 */
    CHECK(y[0] == 0.25 && y[1] == 0.5 && isnan(y[2]) && isnan(y[3]) && y[4] == 1e-20);

    CHECK_EQ_INT(arl_metrics_write_csv(m, csvpath), ARL_OK);
    char *got = slurp(csvpath);
    char *want = slurp(test_src_path("tests/report/data/metrics_fixture.csv"));
    CHECK(got && want);
    if (got && want)
        CHECK_MSG(!strcmp(got, want), "metrics.csv differs:\n%s\nexpected:\n%s", got, want);
    free(got);
    free(want);
    arl_metrics_free(m);
}

static arl_metrics *read_text(const char *t) {
    arl_metrics *m = NULL;
    arl_status s = arl_metrics_read_text(t, strlen(t), "mem.jsonl", &m);
    CHECK_EQ_INT(s, ARL_OK);
    return m;
}

/* The last line of a run killed mid-write is reported as cut short. */
static void test_cut_short(void) {
    arl_metrics *m =
        read_text("{\"step\": 1, \"a\": 1}\n{\"step\": 2, \"a\": 2}\n{\"step\": 3, \"a");
    if (!m) return;
    const arl_metrics_stats *st = arl_metrics_get_stats(m);
    CHECK_EQ_INT(st->malformed, 1);
    CHECK_EQ_INT(st->malformed_line[0], 3);
    CHECK_MSG(strstr(st->malformed_msg, "mem.jsonl:3: last line cut short") != NULL, "%s",
              st->malformed_msg);
    CHECK_EQ_INT(arl_metrics_rows(m), 2);
    arl_metrics_free(m);
    /* a complete last line without a newline is fine */
    m = read_text("{\"step\": 1, \"a\": 1}\n{\"step\": 2, \"a\": 2}");
    if (!m) return;
    CHECK_EQ_INT(arl_metrics_get_stats(m)->malformed, 0);
    CHECK_EQ_INT(arl_metrics_rows(m), 2);
    arl_metrics_free(m);
}

/* Without any "step", x is the row number; before the first step, the first step. */
static void test_x_rules(void) {
    const double *x, *y;
    arl_metrics *m = read_text("{\"a\": 5}\n\n{\"a\": 6}\r\n  {\"a\": 7}  \n");
    if (!m) return;
    CHECK_EQ_INT(series(m, "a", &x, &y), 3);
    CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3);
    CHECK(y[0] == 5 && y[1] == 6 && y[2] == 7);
    arl_metrics_free(m);
    m = read_text("{\"a\": 5}\n{\"step\": 10, \"a\": 6}\n{\"a\": 7}\n{\"step\": 12}\n");
    if (!m) return;
    CHECK_EQ_INT(series(m, "a", &x, &y), 3);
    CHECK(x[0] == 10 && x[1] == 10 && x[2] == 10);
    arl_metrics_free(m);
}

/* Repeated keys within a line: the last value wins (also across nesting). Python's bare
 * NaN/Infinity and sign forms; a line of only text values makes no row. */
static void test_values(void) {
    const double *x, *y;
    arl_metrics *m = read_text("{\"step\": 1, \"a\": {\"b\": 1}, \"a/b\": 2}\n"
                               "{\"step\": 2, \"a/b\": Infinity, \"c\": -NaN, \"d\": \"-inf\"}\n"
                               "{\"step\": 3, \"s\": \"text\"}\n"
                               "{\"note\": \"only text\"}\n"
                               "{\"step\": 4, \"u\": \"NaNa\", \"big\": 9007199254740993, "
                               "\"huge\": 100000000000000000000000000000}\n");
    if (!m) return;
    CHECK_EQ_INT(series(m, "a/b", &x, &y), 2);
    CHECK(y[0] == 2 && isinf(y[1]) && y[1] > 0);
    CHECK_EQ_INT(series(m, "c", &x, &y), 1);
    CHECK(isnan(y[0]));
    CHECK_EQ_INT(series(m, "d", &x, &y), 1);
    CHECK(isinf(y[0]) && y[0] < 0);
    const arl_metrics_stats *st = arl_metrics_get_stats(m);
    CHECK_EQ_INT(st->non_numeric, 3); /* "text", "only text", "NaNa" */
    CHECK_EQ_INT(st->malformed, 0);
    CHECK_EQ_INT(arl_metrics_rows(m), 4); /* the text-only line makes no row */
    CHECK_EQ_INT(series(m, "big", &x, &y), 1);
    CHECK(y[0] == 9007199254740992.0);          /* nearest double of 2^53 + 1 */
    CHECK_EQ_INT(series(m, "huge", &x, &y), 1); /* beyond int64: read as a double */
    CHECK(y[0] == 1e29);
    arl_metrics_free(m);
}

/* Deep nesting is skipped and counted, not a crash; an empty input gives an empty table. */
static void test_edges(void) {
    char deep[256] = "{\"step\": 1, \"v\": ";
    for (int i = 0; i < 12; i++)
        strcat(deep, "{\"k\": ");
    strcat(deep, "1");
    for (int i = 0; i < 12; i++)
        strcat(deep, "}");
    strcat(deep, "}\n");
    arl_metrics *m = read_text(deep);
    if (!m) return;
    CHECK_EQ_INT(arl_metrics_get_stats(m)->non_numeric, 1);
    CHECK_EQ_INT(arl_metrics_count(m), 1); /* step only */
    arl_metrics_free(m);
    m = read_text("");
    if (!m) return;
    CHECK_EQ_INT(arl_metrics_count(m), 0);
    CHECK_EQ_INT(arl_metrics_rows(m), 0);
    const char *tmp = test_tmpdir("report-empty");
    char p[600];
    snprintf(p, sizeof p, "%s/m.csv", tmp);
    CHECK_EQ_INT(arl_metrics_write_csv(m, p), ARL_OK);
    arl_metrics_free(m);
    arl_metrics_free(NULL);
    m = NULL;
    CHECK_EQ_INT(arl_metrics_read("/nonexistent/metrics.jsonl", &m), ARL_ERR_NOT_FOUND);
    CHECK(m == NULL);
}

/* Globs: '*' stops at '/', '**' crosses it, '[' is literal. */
static void test_glob(void) {
    CHECK(arl_report_glob_match("reward/*/mean", "reward/outcome/mean"));
    CHECK(!arl_report_glob_match("reward/*/mean", "reward/outcome/x/mean"));
    CHECK(arl_report_glob_match("moe/load_max/*", "moe/load_max/layer_3"));
    CHECK(!arl_report_glob_match("moe/load_max/*", "moe/load_max/a/b"));
    CHECK(arl_report_glob_match("moe/**", "moe/load_max/a/b"));
    CHECK(arl_report_glob_match("**success**", "eval/success_rate"));
    CHECK(arl_report_glob_match("**tokens_per_s", "perf/tokens_per_s"));
    CHECK(arl_report_glob_match("moe/load_violation/rollout[*]", "moe/load_violation/rollout[12]"));
    CHECK(!arl_report_glob_match("moe/load_violation/rollout[*]", "moe/load_violation/rollout"));
    CHECK(arl_report_glob_match("kl/k?", "kl/k3"));
    CHECK(!arl_report_glob_match("kl/k?", "kl/k"));
    CHECK(arl_report_glob_match("beta", "beta"));
    CHECK(!arl_report_glob_match("beta", "betas"));
    CHECK(arl_report_glob_match("*", "x") && !arl_report_glob_match("*", "a/b"));
}

int main(void) {
    TEST_RUN(test_fixture_csv);
    TEST_RUN(test_cut_short);
    TEST_RUN(test_x_rules);
    TEST_RUN(test_values);
    TEST_RUN(test_edges);
    TEST_RUN(test_glob);
    return test_finish();
}
