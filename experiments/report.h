/* experiments/report.h: the report of a run -- metrics.jsonl read into a table, metrics.csv,
 * one SVG line plot per plot group, and summary.md with the final values and the held-out
 * evaluation (success rates with 95% Wilson intervals, the difference with Newcombe's interval,
 * per-token KL against its target).  Used by `agentrl report RUN_DIR` and at the end of
 * `agentrl train`.
 *
 * Not here: computing metrics (learner/, reward/), running the evaluation episodes (the train
 * driver writes eval.json), drawing (experiments/svg_plot.h).
 *
 * Input files of a run folder:
 *   metrics.jsonl  one JSON object per line, normally one per update: metric name -> number,
 *                  e.g. {"step": 12, "reward/outcome/mean": 0.41, "kl/k1": 0.003, ...}.
 *                  Tolerated, per line: any subset of the keys; integers, reals, true/false
 *                  (1/0); null and the strings or bare words NaN, nan, inf, -inf, Infinity,
 *                  -Infinity (non-finite values, drawn as gaps); nested objects, flattened with
 *                  '/' ({"reward": {"outcome": 1}} is "reward/outcome"); arrays of numbers,
 *                  flattened as name[i] with i from 0.  Other values (text, deeper than 8
 *                  levels) are skipped and counted; a line that is not a JSON object (or is cut
 *                  short) is skipped, counted and reported with its line number.  A key repeated
 *                  within one line keeps its last value.
 *                  x of every point is the line's "step"; a line without one takes the step of
 *                  the nearest earlier line that has one (lines before the first step: that
 *                  first step); a file without any "step" uses the line's row number (1, 2, ...).
 *   eval.json      optional, written by arl_report_eval_write:
 *                  {"version": 1,
 *                   "before": {"episodes": N, "successes": K},
 *                   "after":  {"episodes": N, "successes": K},
 *                   "paired": {"both": A, "before_only": B, "after_only": C, "neither": D},
 *                   "kl_target": x, "kl_mean": y, "set": "test"}
 *                  Every key is optional ("version" must be 1 when present); unknown keys,
 *                  K > N, negative counts and non-finite KL values are errors naming the key.
 *                  "before" is the policy before training, "after" the final policy, both on
 *                  the same held-out tasks; "paired" (optional) counts those tasks by their
 *                  outcome in both arms (task j before vs task j after); kl_mean is the mean
 *                  per-token KL of the final
 *                  policy to the reference, kl_target the controller's target; set names the
 *                  held-out questions evaluated ("test" or "validation", experiments/heldout.h;
 *                  at most 15 characters).
 *
 * Output folder (arl_report_write):
 *   metrics.csv     header row of metric names, then one row per metrics line that had a
 *                   numeric value; columns: "step" first, then the names in natural order
 *                   (digit runs compare as numbers: layer[2] < layer[10]); empty cell = key
 *                   absent on that line; nan / inf / -inf as such; numbers in the shortest
 *                   form that reads back to the same double; RFC 4180 quoting.
 *   plots/NAME.svg  one per plot group with at least one matching metric (a stale file of a
 *                   group that has no data now is removed).
 *   summary.md      headline, Evaluation, Plots, Final values (points, first, final, min, max,
 *                   best by the group's direction) and Input notes (skipped lines and values).
 * Files are written to "<name>.tmp" and renamed into place.
 */
#ifndef ARL_EXPERIMENTS_REPORT_H
#define ARL_EXPERIMENTS_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "experiments/svg_plot.h"

/* ------------------------------------------------------------------------------------------ */
/* Metrics table                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_metrics arl_metrics;

#define ARL_METRICS_MAX_LISTED 16

/* What reading saw (also logged as warnings by arl_metrics_read*). */
typedef struct arl_metrics_stats {
    int64_t lines;     /* lines in the file (blank ones included) */
    int64_t objects;   /* lines that were JSON objects */
    int64_t malformed; /* lines skipped: not JSON, not an object, or the last line cut short */
    int64_t malformed_line[ARL_METRICS_MAX_LISTED]; /* line numbers (from 1) of the first ones */
    char malformed_msg[256];  /* "metrics.jsonl:3: ..." for the first one ("" if none) */
    int64_t non_numeric;      /* values skipped (text, too deep) */
    int64_t non_numeric_line; /* line of the first one (0: none) */
    char non_numeric_key[128];
    int64_t values;    /* numeric values stored, non-finite ones included */
    int64_t nonfinite; /* of which NaN, inf or null */
} arl_metrics_stats;

/* Read a metrics JSONL file into a new table (*out, freed with arl_metrics_free).  Skipped lines
 * and values are counted, logged as warnings with their line numbers and never fatal.  Fails
 * only if the file cannot be read (ARL_ERR_IO, ARL_ERR_NOT_FOUND) or memory runs out. */
arl_status arl_metrics_read(const char *path, arl_metrics **out);

/* The same from text in memory; `where` names it in messages (e.g. the file name). */
arl_status arl_metrics_read_text(const char *text, size_t len, const char *where,
                                 arl_metrics **out);

void arl_metrics_free(arl_metrics *m); /* NULL: no-op */

/* Valid until arl_metrics_free. */
const arl_metrics_stats *arl_metrics_get_stats(const arl_metrics *m);

/* Number of metrics (columns) and of rows (lines with at least one numeric value). */
int32_t arl_metrics_count(const arl_metrics *m);
int64_t arl_metrics_rows(const arl_metrics *m);

/* ARL_OK when m has a row, else ARL_ERR_FORMAT with a message that names the file (the `where`
 * of arl_metrics_read_text) and says what it held instead: nothing, only blank lines, only
 * malformed lines (how many, and the first one's problem), or objects without a number. */
arl_status arl_metrics_check_rows(const arl_metrics *m);

/* Name of column k, 0 <= k < count, in the stable order ("step" first, then natural order).
 * Valid until arl_metrics_free. */
const char *arl_metrics_name(const arl_metrics *m, int32_t k);

/* Column index of a name in the same order, or -1. */
int32_t arl_metrics_find(const arl_metrics *m, const char *name);

/* The points of column k: *x = steps, *y = values (n of each; NaN/inf kept), in file order.
 * Returns n.  The arrays are valid until arl_metrics_free. */
int64_t arl_metrics_series(const arl_metrics *m, int32_t k, const double **x, const double **y);

/* metrics.csv (format above). */
arl_status arl_metrics_fwrite_csv(const arl_metrics *m, FILE *f);
arl_status arl_metrics_write_csv(const arl_metrics *m, const char *path);

/* ------------------------------------------------------------------------------------------ */
/* Plot groups                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Which way is better, for the "best" column of summary.md. */
typedef enum arl_report_better {
    ARL_REPORT_BETTER_NONE = 0,
    ARL_REPORT_BETTER_HIGHER = 1,
    ARL_REPORT_BETTER_LOWER = 2,
} arl_report_better;

/* One plot: the metrics whose names match any of the patterns, in natural order.
 * Patterns are globs on metric names: '*' matches any run of characters except '/', '**' any
 * run including '/', '?' one character except '/'; every other character is literal ('['
 * included, so "moe/load_violation/rollout[*]" matches the per-layer entries). */
typedef struct arl_report_group {
    const char *name;  /* file stem: plots/<name>.svg; letters, digits, '_', '-' */
    const char *title; /* plot title and summary caption */
    const char *ylabel;
    const char *patterns; /* whitespace-separated globs */
    arl_svg_scale yscale;
    arl_report_better better;
} arl_report_group;

/* The default table (static storage): reward, success, kl, entropy, moe_load, router,
 * env_errors, throughput, loss -- with the names of spec/objective.md section 12 and the common
 * short forms ("beta", "entropy", "perf/tokens_per_s", "env/errors", ...).  *n = its length. */
const arl_report_group *arl_report_default_groups(int32_t *n);

/* 1 if name matches the glob pattern (rules above), else 0. */
int arl_report_glob_match(const char *pattern, const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Evaluation and confidence intervals                                                         */
/* ------------------------------------------------------------------------------------------ */

#define ARL_REPORT_Z95 1.959963984540054 /* standard normal quantile at 0.975 */

typedef struct arl_report_eval_arm {
    int64_t episodes;  /* held-out episodes evaluated; < 0: absent */
    int64_t successes; /* 0 <= successes <= episodes */
} arl_report_eval_arm;

/* The two arms on the same held-out tasks, task by task (a 2x2 table of outcomes).  With
 * greedy evaluation both arms see the same tasks, so the paired difference is the right
 * comparison and its interval is narrower than the unpaired one when outcomes correlate. */
typedef struct arl_report_eval_paired {
    int64_t tasks;       /* tasks with a valid episode in both arms; < 0: absent */
    int64_t both;        /* succeeded before and after */
    int64_t before_only; /* succeeded before, failed after */
    int64_t after_only;  /* failed before, succeeded after */
    int64_t neither;     /* failed in both; the four sum to tasks */
} arl_report_eval_paired;

typedef struct arl_report_eval {
    arl_report_eval_arm before;    /* the initial policy */
    arl_report_eval_arm after;     /* the trained policy */
    arl_report_eval_paired paired; /* paired.tasks < 0: not recorded */
    double kl_target;              /* per-token KL target; NaN: absent */
    double kl_mean;                /* measured mean per-token KL to the reference; NaN: absent */
    char set[16];                  /* held-out set evaluated ("test", "validation"); "": absent */
} arl_report_eval;

/* Everything absent. */
void arl_report_eval_init(arl_report_eval *e);

/* eval.json (format above); errors name the file and the key (ARL_ERR_FORMAT, ARL_ERR_IO,
 * ARL_ERR_NOT_FOUND). */
arl_status arl_report_eval_read(const char *path, arl_report_eval *e);
arl_status arl_report_eval_write(const char *path, const arl_report_eval *e);

/* Wilson score interval of a proportion k/n: returns k/n and sets [*lo, *hi] (clamped to
 * [0, 1]).  n <= 0: NaN for all three. */
double arl_report_wilson(int64_t k, int64_t n, double z, double *lo, double *hi);

/* Newcombe's hybrid score interval (his method 10, 1998) for the difference of two independent
 * proportions d = k1/n1 - k0/n0, built from the two Wilson intervals:
 *   lo = d - sqrt((p1 - l1)^2 + (u0 - p0)^2),  hi = d + sqrt((u1 - p1)^2 + (p0 - l0)^2).
 * Returns d.  n1 <= 0 or n0 <= 0: NaN for all three. */
double arl_report_newcombe(int64_t k1, int64_t n1, int64_t k0, int64_t n0, double z, double *lo,
                           double *hi);

/* Newcombe's interval for the difference of two PAIRED proportions (his method 10, 1998:
 * "Improved confidence intervals for the difference between binomial proportions based on
 * paired data"), d = (after_only - before_only) / tasks = p_after - p_before, from the Wilson
 * intervals [l1, u1] of p_after and [l0, u0] of p_before and the phi coefficient of the 2x2
 * table, phi = (both neither - after_only before_only) / sqrt(product of the four margins)
 * (0 when a margin is 0):
 *   lo = d - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u0 - p0) + (u0 - p0)^2)
 *   hi = d + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p0 - l0) + (p0 - l0)^2)
 * Returns d.  p->tasks <= 0: NaN for all three. */
double arl_report_newcombe_paired(const arl_report_eval_paired *p, double z, double *lo,
                                  double *hi);

/* Exact two-sided McNemar test: P(the discordant pairs split at least as unevenly as
 * before_only : after_only when each is equally likely) = min(1, 2 P(X <= min(b, c))),
 * X ~ Binomial(b + c, 1/2).  1 when there is no discordant pair. */
double arl_report_mcnemar_exact(int64_t before_only, int64_t after_only);

/* ------------------------------------------------------------------------------------------ */
/* The report                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_report_opts {
    const char *title;              /* borrowed; NULL: "agentrl run report" */
    const char *source;             /* metrics file named in the summary; NULL: metrics.jsonl */
    const arl_report_group *groups; /* borrowed; NULL: the default table */
    int32_t n_groups;
    const arl_report_eval *eval; /* borrowed; NULL: no evaluation data */
    int32_t width, height;       /* SVG size in px; 0: 960 x 540 */
} arl_report_opts;

typedef struct arl_report_result {
    int32_t plots;           /* SVG files written */
    int32_t groups_empty;    /* groups with no matching metric (no file) */
    int32_t metrics_in_none; /* metrics (other than step) that no group plots */
} arl_report_result;

/* Write metrics.csv, plots/ and summary.md into out_dir (created if missing).  opts and res
 * may be NULL.  Each file is written as FILE.tmp and renamed; a write that fails names the file
 * and the system's reason (arl_file_write_failed: ARL_ERR_FULL on a full disk). */
arl_status arl_report_write(const arl_metrics *m, const char *out_dir, const arl_report_opts *opts,
                            arl_report_result *res);

/* The whole report of a run folder: reads run_dir/metrics.jsonl and run_dir/eval.json (when
 * present), and writes the report into out_dir (NULL: run_dir).  When out_dir is another
 * folder, metrics.jsonl and eval.json are copied into it so that it stands alone.  title may
 * be NULL.  *stats (may be NULL) receives what reading the metrics saw. */
arl_status arl_report_generate(const char *run_dir, const char *out_dir, const char *title,
                               arl_report_result *res, arl_metrics_stats *stats);

/* The same, except that metrics.jsonl without a single numeric metric (arl_metrics_check_rows:
 * empty, or no line valid) is that error and nothing is written or copied: `agentrl report`.
 * (arl_report_generate, at the end of `agentrl train`, writes a report of the evaluation alone.) */
arl_status arl_report_generate_strict(const char *run_dir, const char *out_dir, const char *title,
                                      arl_report_result *res, arl_metrics_stats *stats);

#endif
