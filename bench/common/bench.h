/* bench/common/bench.h: what every CPU benchmark program of bench/ does the same way - its
 * command line (parsing, --help, the PyTorch baseline's options), its clock and medians, the
 * allocation and file writes that end the run on failure, and the baseline's line in the
 * verification block.  Shared by the CPU benchmarks.  Messages start with the
 * program's name, `who`. */
#ifndef ARL_BENCH_BENCH_H
#define ARL_BENCH_BENCH_H

#include <jansson.h>
#include <stddef.h>

#include "core/options.h"
#include "core/status.h"

/* The options of the PyTorch baseline, entries of an arl_option table over the struct T with
 * the fields char *python, char *script, int baseline, char *omp_wait; script is the default of
 * --script (the baseline's Python file).  (clang-format would put one field a line.) */
/* clang-format off */
#define BENCH_BASELINE_OPTIONS(T, script_default)                                                  \
    {"python", ARL_OPT_STRING, offsetof(T, python), "/usr/bin/python3",                            \
     "interpreter with torch for the baseline", 0, 0, NULL, 0, "FILE"},                            \
    {"script", ARL_OPT_STRING, offsetof(T, script), script_default, "the PyTorch baseline", 0, 0,  \
     NULL, 0, "FILE"},                                                                             \
    {"baseline", ARL_OPT_BOOL, offsetof(T, baseline), "true",                                      \
     "run the PyTorch baseline (--no-baseline: C numbers only)", 0, 0, NULL, 0, NULL},             \
    {"omp-wait-policy", ARL_OPT_CHOICE, offsetof(T, omp_wait), "PASSIVE",                          \
     "OMP_WAIT_POLICY of the PyTorch process (inherit: leave the environment as it is)", 0, 0,     \
     "PASSIVE|ACTIVE|inherit", 0, NULL}
/* clang-format on */

/* The text of a macro's value, for an option's default: BENCH_STR(ARL_K_THREADS_DEFAULT). */
#define BENCH_STR_(x) #x
#define BENCH_STR(x) BENCH_STR_(x)

/* Set o to the defaults of tab, then parse argv[1..argc-1] into it.  Returns -1 when the
 * program goes on; otherwise its exit status: 0 after printing --help ("who [options]
 * [POSITIONAL]" and summary; o freed), 0 when ARL_BENCH_CHECK_OPTIONS is set in the environment
 * and the options are valid (o freed: a wrapper script checks them before its own work), 2 on
 * a usage error (the message on stderr, naming the option). */
int bench_options_parse(const char *who, const char *summary, const arl_option *tab, size_t n,
                        int argc, char **argv, void *o);

/* Whether argv[1..argc-1] gives the option name ("--name V" or "--name=V", before any "--"):
 * for options whose default another option changes (bench_rollout's --quick). */
int bench_option_given(int argc, char **argv, const char *name);

/* Seconds of CLOCK_MONOTONIC. */
double bench_now(void);

#define BENCH_MEDIAN_MAX 1024

/* The median of v[0..n-1], 1 <= n <= BENCH_MEDIAN_MAX (asserted); v is left as it is. */
double bench_median(const double *v, int n);

/* malloc that ends the process (status 1, "who: out of memory" on stderr) when it fails; 0
 * bytes allocate 1.  Caller frees with free. */
void *bench_xmalloc(const char *who, size_t bytes);

/* Print "who: what: <the last error>" (arl_error_msg) on stderr; returns 1, the exit status. */
int bench_fail(const char *who, const char *what);

/* Write bytes of data to path (created or truncated). */
arl_status bench_file_write(const char *path, const void *data, size_t bytes);

/* o[key] as a double, NaN when it is not a number. */
double bench_json_num(json_t *o, const char *key);

/* The last lines of the verification block, flushed: with info (the baseline's verification
 * line, bench_child_start) "  baseline: PyTorch V, N threads, <kind>, OMP_WAIT_POLICY
 * <omp_wait>"; with info NULL, that the baseline is unavailable and why. */
void bench_baseline_print(json_t *info, const char *kind, const char *omp_wait, const char *why);

#endif
