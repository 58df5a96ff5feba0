/* tests/report/test_summary.c: the whole report of a synthetic run folder -- metrics.csv, one
 * SVG per plot group, summary.md with the evaluation numbers (values worked out in
 * test_stats.c's references: 45/100 -> [0.3561, 0.5476]; 62/100 -> [0.5221, 0.7090];
 * 62/100 - 45/100 -> +0.1700 [+0.0318, +0.2994] by Newcombe's method 10), final values, input
 * notes; a separate output folder; stale plots; custom groups; an empty run. */
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "experiments/report.h"
#include "tests/test.h"

/* The whole file at path, NUL-terminated (malloc'd); NULL if it cannot be read. */
static char *slurp(const char *path) {
    char *b = NULL;
    return arl_file_read(path, 0, &b, NULL) == ARL_OK ? b : NULL;
}

static int exists(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

#define CHECK_HAS(text, needle)                                                                    \
    CHECK_MSG((text) && strstr((text), (needle)) != NULL, "missing: %s", (needle))

/* A run of 300 steps with every default plot group represented, one malformed line and one
 * text value. */
static void make_run(const char *dir, int with_eval) {
    char p[1024];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    for (int s = 1; s <= 300; s++) {
        double t = s / 300.0;
        fprintf(f,
                "{\"step\": %d, \"reward/outcome/mean\": %.6f, \"reward/process/mean\": %.6f, "
                "\"eval/success_rate\": %.4f, \"kl/k1\": %.6g, \"kl/k3\": %.6g, \"kl/coef\": %.6g, "
                "\"kl/target\": 0.01, \"policy/entropy\": %.4f, "
                "\"moe/load_violation/rollout\": [%.3f, %.3f, %.3f], "
                "\"moe/router_agreement/overlap\": %.4f, \"env/errors\": %d, "
                "\"perf/tokens_per_s\": %.1f, \"loss/total\": %.5f, \"optim/lr\": 1e-6%s}\n",
                s, 0.2 + 0.5 * t, 0.1 * t, 0.45 + 0.17 * t, 0.001 + 0.01 * t, 0.002 + 0.009 * t,
                0.1 * (1 - 0.5 * t), 2.0 - 0.5 * t, 0.5 + 0.1 * (s % 7), 0.3, 0.2 * t,
                0.9 + 0.05 * t, s % 50 == 0, 1000 + 10.0 * (s % 13), 1.0 - 0.3 * t,
                s == 5 ? ", \"note\": \"checkpoint\"" : "");
        if (s == 100) fputs("{\"step\": 100.5, oops}\n", f);
    }
    fclose(f);
    if (with_eval) {
        arl_report_eval e;
        arl_report_eval_init(&e);
        e.before = (arl_report_eval_arm){100, 45};
        e.after = (arl_report_eval_arm){100, 62};
        e.kl_target = 0.01;
        e.kl_mean = 0.0123;
        snprintf(p, sizeof p, "%s/eval.json", dir);
        CHECK_EQ_INT(arl_report_eval_write(p, &e), ARL_OK);
    }
}

static void test_full_report(void) {
    char run[600], out[700];
    snprintf(run, sizeof run, "%s", test_tmpdir("report-run"));
    snprintf(out, sizeof out, "%s/report", run);
    make_run(run, 1);
    arl_report_result res;
    arl_metrics_stats st;
    arl_status s = arl_report_generate(run, out, "Calculator run", &res, &st);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s != ARL_OK) return;
    CHECK_EQ_INT(st.malformed, 1);
    CHECK_EQ_INT(st.malformed_line[0], 101);
    CHECK_EQ_INT(res.plots, 9);
    CHECK_EQ_INT(res.groups_empty, 0);
    CHECK_EQ_INT(res.metrics_in_none, 1); /* optim/lr */
    static const char *const files[] = {
        "metrics.csv",        "summary.md",        "metrics.jsonl",        "eval.json",
        "plots/reward.svg",   "plots/success.svg", "plots/kl.svg",         "plots/entropy.svg",
        "plots/moe_load.svg", "plots/router.svg",  "plots/env_errors.svg", "plots/throughput.svg",
        "plots/loss.svg"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        CHECK_MSG(exists(out, files[i]), "%s/%s missing", out, files[i]);
    CHECK(!exists(out, "summary.md.tmp"));

    char p[1024];
    snprintf(p, sizeof p, "%s/summary.md", out);
    char *md = slurp(p);
    CHECK_HAS(md, "# Calculator run\n");
    CHECK_HAS(md, "300 with metrics");
    CHECK_HAS(md, "steps 1 to 300");
    CHECK_HAS(md, "| before | 100 | 45 | 0.4500 | [0.3561, 0.5476] |");
    CHECK_HAS(md, "| after | 100 | 62 | 0.6200 | [0.5221, 0.7090] |");
    CHECK_HAS(md, "| after \xE2\x88\x92 before | | | +0.1700 | [+0.0318, +0.2994] |");
    CHECK_HAS(md, "**Success rate 45.0% \xE2\x86\x92 62.0% (+17.0 percentage points, 95% CI "
                  "+3.2 to +29.9; 100 episodes before, 100 after).** Improved: the 95% interval "
                  "of the difference lies above zero.");
    CHECK_HAS(md, "Per-token KL to the reference policy: 0.0123 (eval.json); target 0.01 "
                  "(eval.json): 1.23\xC3\x97 the target.");
    CHECK_HAS(md, "![Reward per level](plots/reward.svg)");
    CHECK_HAS(md, "![Throughput](plots/throughput.svg)");
    /* final values: reward rises from 0.201667 to 0.7 (best = max, at step 300) */
    CHECK_HAS(md, "| `reward/outcome/mean` | 300 | 0.201667 | 0.7 | 0.201667 | 0.7 | 0.7 (300) |");
    /* loss: lower is better */
    CHECK_HAS(md, "| `loss/total` | 300 | 0.999 | 0.7 | 0.7 | 0.999 | 0.7 (300) |");
    /* entropy has no direction: no best */
    CHECK_HAS(md, "| `policy/entropy` | 300 | 1.9983 | 1.5 | 1.5 | 1.9983 |  |");
    CHECK_HAS(md, "1 malformed line skipped (line 101)");
    CHECK_HAS(md, "line 5, key `note`");
    CHECK_HAS(md, "in no plot group");
    CHECK_HAS(md, "`optim/lr`");
    free(md);

    /* per-layer expert load: three series in the moe_load plot */
    snprintf(p, sizeof p, "%s/plots/moe_load.svg", out);
    char *svg = slurp(p);
    CHECK_HAS(svg, "moe/load_violation/rollout[0]");
    CHECK_HAS(svg, "moe/load_violation/rollout[2]");
    CHECK(svg && strstr(svg, "<polyline") && strstr(svg, "</svg>"));
    free(svg);
    /* KL and beta: kl/coef is the beta of the KL controller */
    snprintf(p, sizeof p, "%s/plots/kl.svg", out);
    svg = slurp(p);
    CHECK_HAS(svg, ">kl/coef<");
    CHECK_HAS(svg, ">kl/k1<");
    free(svg);

    /* regenerating into the run folder itself (no copies) also works */
    s = arl_report_generate(run, NULL, NULL, &res, NULL);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK(exists(run, "summary.md") && exists(run, "plots/kl.svg"));
    snprintf(p, sizeof p, "%s/summary.md", run);
    md = slurp(p);
    CHECK_HAS(md, "# agentrl run report\n");
    free(md);
}

/* Without eval.json: the section says so, and KL falls back to the final metrics. */
static void test_no_eval(void) {
    char run[600];
    snprintf(run, sizeof run, "%s", test_tmpdir("report-noeval"));
    make_run(run, 0);
    arl_report_result res;
    CHECK_EQ_INT(arl_report_generate(run, NULL, NULL, &res, NULL), ARL_OK);
    char p[1024];
    snprintf(p, sizeof p, "%s/summary.md", run);
    char *md = slurp(p);
    CHECK_HAS(md, "No held-out evaluation results (no eval.json in the run folder).");
    CHECK_HAS(md, "Per-token KL to the reference policy: 0.011 (final kl/k3 of the metrics); "
                  "target 0.01 (final kl/target): 1.10\xC3\x97 the target.");
    free(md);
}

/* Custom groups, a stale plot of a group without data, bad group names; an empty table. */
static void test_groups_and_empty(void) {
    const char *text = "{\"step\": 1, \"a/x\": 1, \"a/y\": 2, \"b\": 3}\n"
                       "{\"step\": 2, \"a/x\": 2, \"a/y\": 1, \"b\": 4}\n";
    arl_metrics *m = NULL;
    CHECK_EQ_INT(arl_metrics_read_text(text, strlen(text), "t.jsonl", &m), ARL_OK);
    if (!m) return;
    char out[600], p[1024];
    snprintf(out, sizeof out, "%s/nested/out", test_tmpdir("report-groups"));
    arl_report_group g[2] = {
        {"as", "A things", "a", "a/*", ARL_SVG_SCALE_LINEAR, ARL_REPORT_BETTER_LOWER},
        {"cs", "C things", "c", "c/**", ARL_SVG_SCALE_LINEAR, ARL_REPORT_BETTER_NONE}};
    /* a plot left from an earlier report for the group that has no data now */
    CHECK_EQ_INT(arl_report_write(m, out, &(arl_report_opts){.groups = g, .n_groups = 1}, NULL),
                 ARL_OK);
    snprintf(p, sizeof p, "%s/plots/cs.svg", out);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    arl_report_result res;
    arl_report_opts o = {.groups = g, .n_groups = 2, .title = "T"};
    CHECK_EQ_INT(arl_report_write(m, out, &o, &res), ARL_OK);
    CHECK_EQ_INT(res.plots, 1);
    CHECK_EQ_INT(res.groups_empty, 1);
    CHECK_EQ_INT(res.metrics_in_none, 1);
    CHECK(exists(out, "plots/as.svg") && !exists(out, "plots/cs.svg"));
    snprintf(p, sizeof p, "%s/summary.md", out);
    char *md = slurp(p);
    CHECK_HAS(md, "No data for: C things (`c/**`)");
    CHECK_HAS(md, "| `a/y` | 2 | 2 | 1 | 1 | 2 | 1 (2) |"); /* lower is better: min at step 2 */
    free(md);
    g[1].name = "../evil";
    CHECK_EQ_INT(arl_report_write(m, out, &o, NULL), ARL_ERR_ARG);
    arl_metrics_free(m);

    /* an empty metrics file still gives a report */
    CHECK_EQ_INT(arl_metrics_read_text("", 0, "empty", &m), ARL_OK);
    CHECK_EQ_INT(arl_report_write(m, out, NULL, &res), ARL_OK);
    CHECK_EQ_INT(res.plots, 0);
    md = slurp(p);
    CHECK_HAS(md, "No metric matches any plot group.");
    free(md);
    arl_metrics_free(m);

    /* a folder that is not a run */
    CHECK_EQ_INT(arl_report_generate(out, NULL, NULL, NULL, NULL), ARL_ERR_NOT_FOUND);
    CHECK_HAS(arl_error_msg(), "metrics.jsonl: not found");
    CHECK_EQ_INT(arl_report_generate("/nonexistent-run", NULL, NULL, NULL, NULL),
                 ARL_ERR_NOT_FOUND);
}

/* A bad eval.json stops the report with the message naming the key. */
static void test_bad_eval(void) {
    char run[600], p[1024];
    snprintf(run, sizeof run, "%s", test_tmpdir("report-badeval"));
    make_run(run, 0);
    snprintf(p, sizeof p, "%s/eval.json", run);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("{\"after\": {\"episodes\": 1, \"successes\": 2}}", f);
        fclose(f);
    }
    CHECK_EQ_INT(arl_report_generate(run, NULL, NULL, NULL, NULL), ARL_ERR_FORMAT);
    CHECK_HAS(arl_error_msg(), "successes 2 > episodes 1");
}

/* A metrics.jsonl without a metric: arl_report_generate (the end of train) writes the report
 * of the evaluation alone; arl_report_generate_strict (`agentrl report`) fails naming the file
 * and writes nothing; arl_metrics_check_rows says what the file held. */
static void test_no_metrics(void) {
    char run[600], p[1024];
    snprintf(run, sizeof run, "%s", test_tmpdir("report-nometrics"));
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("oops\n[1]\n", f);
        fclose(f);
    }
    CHECK_EQ_INT(arl_report_generate_strict(run, NULL, NULL, NULL, NULL), ARL_ERR_FORMAT);
    CHECK_HAS(arl_error_msg(), "metrics.jsonl: none of its 2 lines is a metrics line");
    CHECK(!exists(run, "summary.md") && !exists(run, "metrics.csv"));
    CHECK_EQ_INT(arl_report_generate(run, NULL, NULL, NULL, NULL), ARL_OK);
    CHECK(exists(run, "summary.md"));

    arl_metrics *m = NULL;
    CHECK_EQ_INT(arl_metrics_read_text("", 0, "e.jsonl", &m), ARL_OK);
    CHECK_EQ_INT(arl_metrics_check_rows(m), ARL_ERR_FORMAT);
    CHECK_HAS(arl_error_msg(), "e.jsonl: the file is empty");
    arl_metrics_free(m);
    const char *text = "{\"a\": \"x\"}\n{\"step\": 1}\n";
    CHECK_EQ_INT(arl_metrics_read_text(text, strlen(text), "ok.jsonl", &m), ARL_OK);
    CHECK_EQ_INT(arl_metrics_check_rows(m), ARL_OK);
    arl_metrics_free(m);
}

int main(void) {
    TEST_RUN(test_full_report);
    TEST_RUN(test_no_eval);
    TEST_RUN(test_groups_and_empty);
    TEST_RUN(test_bad_eval);
    TEST_RUN(test_no_metrics);
    return test_finish();
}
