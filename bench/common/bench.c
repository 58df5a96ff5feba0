/* bench/common/bench.c: what every CPU benchmark program does the same way (bench.h). */
#include "bench/common/bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"

int bench_options_parse(const char *who, const char *summary, const arl_option *tab, size_t n,
                        int argc, char **argv, void *o) {
    int help = 0;
    if (arl_options_defaults(tab, n, o) != ARL_OK) {
        fprintf(stderr, "%s: %s\n", who, arl_error_msg());
        return 2;
    }
    if (arl_options_parse_argv(tab, n, argc - 1, argv + 1, o, &help) != ARL_OK) {
        fprintf(stderr, "%s: %s\n", who, arl_error_msg());
        return 2;
    }
    if (help) {
        char usage[256];
        int at = snprintf(usage, sizeof usage, "%s [options]", who);
        for (size_t i = 0; i < n && at > 0 && (size_t)at < sizeof usage; i++)
            if (tab[i].flags & ARL_OPT_POSITIONAL)
                at += snprintf(usage + at, sizeof usage - (size_t)at, " [%s]",
                               tab[i].metavar ? tab[i].metavar : tab[i].name);
        arl_options_print_help(stdout, usage, summary, tab, n);
        arl_options_free(tab, n, o);
        return 0;
    }
    if (getenv("ARL_BENCH_CHECK_OPTIONS")) { /* a wrapper checks the options before its work */
        arl_options_free(tab, n, o);
        return 0;
    }
    return -1;
}

int bench_option_given(int argc, char **argv, const char *name) {
    const size_t n = strlen(name);
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) &&
            (argv[i][2 + n] == 0 || argv[i][2 + n] == '='))
            return 1;
    return 0;
}

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const double *v, int n) {
    double s[BENCH_MEDIAN_MAX];
    ARL_ASSERT(n >= 1 && n <= BENCH_MEDIAN_MAX);
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

void *bench_xmalloc(const char *who, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", who, bytes);
        exit(1);
    }
    return p;
}

int bench_fail(const char *who, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", who, what, arl_error_msg());
    return 1;
}

arl_status bench_file_write(const char *path, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return arl_errorf(ARL_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(data, 1, bytes, f);
    if (fclose(f) != 0 || w != bytes)
        return arl_errorf(ARL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return ARL_OK;
}

double bench_json_num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

void bench_baseline_print(json_t *info, const char *kind, const char *omp_wait, const char *why) {
    if (info) {
        json_t *tv = json_object_get(info, "torch_version");
        printf("  baseline: PyTorch %s, %d threads, %s, OMP_WAIT_POLICY %s\n",
               json_string_value(tv) ? json_string_value(tv) : "?",
               (int)bench_json_num(info, "threads"), kind, omp_wait);
    } else {
        printf("\nPyTorch baseline unavailable (%s): C numbers only\n", why);
    }
    fflush(stdout);
}
