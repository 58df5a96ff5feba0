/* cli/cmd_report.c: `agentrl report RUN_DIR [--out DIR]`: (re)generate the report of a run
 * folder -- metrics.csv, plots/NAME.svg and summary.md -- from its metrics.jsonl and, when
 * present, eval.json (formats in experiments/report.h). */
#include <stddef.h>
#include <stdio.h>

#include "cli/cli.h"
#include "experiments/report.h"

typedef struct report_opts {
    char *run;
    char *out;
    char *title;
} report_opts;

static const arl_option report_tab[] = {
    {"run", ARL_OPT_STRING, offsetof(report_opts, run), NULL,
     "run folder holding metrics.jsonl (and eval.json)", 0, 0, NULL,
     ARL_OPT_REQUIRED | ARL_OPT_POSITIONAL, "RUN_DIR"},
    {"out", ARL_OPT_STRING, offsetof(report_opts, out), NULL,
     "write the report here (default: RUN_DIR); the inputs are copied beside it", 0, 0, NULL, 0,
     "DIR"},
    {"title", ARL_OPT_STRING, offsetof(report_opts, title), NULL,
     "title of summary.md (default: \"agentrl run report\")", 0, 0, NULL, 0, "TEXT"},
};
#define REPORT_N ARL_OPTIONS_COUNT(report_tab)

int cmd_report(int argc, char **argv) {
    report_opts o;
    int rc = cli_parse(report_tab, REPORT_N, argc, argv, &o,
                       "agentrl report RUN_DIR [--out DIR] [--title TEXT]",
                       "Write metrics.csv, plots/*.svg (SVG line plots per metric group) and "
                       "summary.md (final values; held-out success before/after with 95% "
                       "intervals from eval.json) from a run folder's metrics.jsonl.");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    arl_report_result res = {0};
    arl_metrics_stats st = {0};
    /* an interrupt waits until the report is written (seconds: one pass over metrics.jsonl),
     * so that it leaves no FILE.tmp beside the files of the report */
    cli_interrupt_defer();
    arl_status s = arl_report_generate_strict(o.run, o.out, o.title, &res, &st);
    cli_interrupt_resume();
    if (s != ARL_OK) {
        arl_options_free(report_tab, REPORT_N, &o);
        return cli_fail(s);
    }
    const char *out = o.out ? o.out : o.run;
    printf("report: %s/summary.md, %s/metrics.csv, %d plot%s in %s/plots (%lld lines", out, out,
           (int)res.plots, res.plots == 1 ? "" : "s", out, (long long)st.lines);
    if (st.malformed) printf(", %lld malformed skipped", (long long)st.malformed);
    if (st.non_numeric) printf(", %lld non-numeric values skipped", (long long)st.non_numeric);
    printf(")\n");
    arl_options_free(report_tab, REPORT_N, &o);
    return ARL_EXIT_OK;
}
