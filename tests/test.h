/* tests/test.h: the small test harness of agentrl's C tests.
 *
 * A test program runs its cases with TEST_RUN(fn) (ARL_TEST_CASES=a,b runs only the cases whose
 * names contain a or b); each failed CHECK prints the file,
 * line and values and marks the program failed; main returns test_finish(), which prints
 * "N passed, N failed" and returns 0 only if nothing failed.  Tests that need hardware that
 * is absent return TEST_SKIP (77), which ctest reports as skipped.
 *
 * Tolerances: CHECK_CLOSE(a, ref, atol, rtol) is the elementwise form
 * |a - ref| <= atol + rtol*|ref|; check_close_maxref() is the max|ref| form of
 * spec/policy.md section 16.4.  Every use states the reason for its numbers in a comment.
 */
#ifndef ARL_TESTS_TEST_H
#define ARL_TESTS_TEST_H

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_SKIP 77

static int test_failures_ = 0;
static int test_cases_passed_ = 0;
static int test_cases_failed_ = 0;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
            test_failures_++;                                                                      \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);              \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            test_failures_++;                                                                      \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", __FILE__,       \
                    __LINE__, #a, a_, #b, b_);                                                     \
            test_failures_++;                                                                      \
        }                                                                                          \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_)) {                                                        \
            fprintf(stderr, "%s:%d: CHECK_STR_EQ failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__,  \
                    a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                       \
            test_failures_++;                                                                      \
        }                                                                                          \
    } while (0)

/* Elementwise tolerance for one scalar. */
#define CHECK_CLOSE(a, ref, atol, rtol)                                                            \
    do {                                                                                           \
        double a_ = (double)(a), r_ = (double)(ref);                                               \
        if (!(fabs(a_ - r_) <= (atol) + (rtol)*fabs(r_))) {                                        \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g, %s = %.9g (atol %g rtol %g)\n", \
                    __FILE__, __LINE__, #a, a_, #ref, r_, (double)(atol), (double)(rtol));        \
            test_failures_++;                                                                      \
        }                                                                                          \
    } while (0)

/* Elementwise form over arrays; returns 1 if all close, else reports the worst element. */
static inline int check_close_f32(const char *what, const float *a, const float *ref, size_t n,
                                  double atol, double rtol) {
    size_t worst = 0;
    double worst_excess = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        double lim = atol + rtol * fabs((double)ref[i]);
        if (!(d <= lim)) {
            ok = 0;
            if (!(d - lim <= worst_excess)) {
                worst_excess = d - lim;
                worst = i;
            }
        }
    }
    if (!ok) {
        fprintf(stderr, "%s: elementwise mismatch at [%zu]: %.9g vs ref %.9g (atol %g rtol %g)\n",
                what, worst, (double)a[worst], (double)ref[worst], atol, rtol);
        test_failures_++;
    }
    return ok;
}

/* max|ref| form: |a_i - ref_i| <= atol + rtol * max_j |ref_j|. */
static inline int check_close_maxref_f32(const char *what, const float *a, const float *ref,
                                         size_t n, double atol, double rtol) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)ref[i]) > m) m = fabs((double)ref[i]);
    double lim = atol + rtol * m;
    size_t worst = 0;
    double wd = -1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (!(d <= wd)) {
            wd = d;
            worst = i;
        }
    }
    if (n && !(wd <= lim)) {
        fprintf(stderr,
                "%s: max|ref| mismatch at [%zu]: %.9g vs ref %.9g, |diff| %.3g > %.3g "
                "(atol %g rtol %g max|ref| %.3g)\n",
                what, worst, (double)a[worst], (double)ref[worst], wd, lim, atol, rtol, m);
        test_failures_++;
        return 0;
    }
    return 1;
}

/* ARL_TEST_CASES=a,b (optional): run only the cases whose names contain a or b (a slow
 * program, e.g. under the CUDA emulator, run for one case). */
static inline int test_case_wanted_(const char *name) {
    const char *w = getenv("ARL_TEST_CASES");
    if (!w || !*w) return 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", w);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strstr(name, t)) return 1;
    return 0;
}

/* Wall-clock seconds (monotonic), for the time each case took. */
static inline double test_now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs fn unless ARL_TEST_CASES leaves it out; prints "ok   fn (S s)" or "FAIL fn (S s)". */
#define TEST_RUN(fn)                                                                               \
    do {                                                                                           \
        if (!test_case_wanted_(#fn)) break;                                                        \
        int before_ = test_failures_;                                                              \
        double t0_ = test_now_();                                                                  \
        fn();                                                                                      \
        double dt_ = test_now_() - t0_;                                                            \
        if (test_failures_ == before_) {                                                           \
            test_cases_passed_++;                                                                  \
            fprintf(stderr, "ok   %s (%.2f s)\n", #fn, dt_);                                       \
        } else {                                                                                   \
            test_cases_failed_++;                                                                  \
            fprintf(stderr, "FAIL %s (%.2f s)\n", #fn, dt_);                                       \
        }                                                                                          \
    } while (0)

/* The directories test_tmpdir made in this process (removed by test_finish when nothing failed,
 * kept for inspection otherwise or with ARL_TEST_KEEP=1). */
static char test_tmpdirs_[16][512];
static int test_n_tmpdirs_ = 0;
static pid_t test_tmpdir_pid_ = 0;

static inline int test_rm_entry_(const char *path, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    remove(path);
    return 0;
}

static inline int test_finish(void) {
    fprintf(stderr, "%d passed, %d failed\n", test_cases_passed_, test_cases_failed_);
    const char *keep = getenv("ARL_TEST_KEEP");
    /* only the process that made them (a forked child that returns here must not remove its
     * parent's files), and only after a clean run */
    if (!test_failures_ && !(keep && *keep == '1') && getpid() == test_tmpdir_pid_)
        for (int i = 0; i < test_n_tmpdirs_; i++)
            nftw(test_tmpdirs_[i], test_rm_entry_, 16, FTW_DEPTH | FTW_PHYS);
    return test_failures_ ? 1 : 0;
}

/* Path of a file in the source tree ($ARL_SOURCE_DIR, else the working directory). */
static inline const char *test_src_path(const char *rel) {
    static char buf[8][1024];
    static int k = 0;
    const char *root = getenv("ARL_SOURCE_DIR");
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", root && *root ? root : ".", rel);
    return b;
}

/* A fresh temporary directory for a test: removed with everything in it by test_finish when
 * the program passed (ARL_TEST_KEEP=1 keeps it), left under /tmp for inspection when it failed. */
static inline const char *test_tmpdir(const char *tag) {
    static char buf[512];
    snprintf(buf, sizeof buf, "/tmp/arl-test-%s-XXXXXX", tag);
    extern char *mkdtemp(char *);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    if (test_n_tmpdirs_ < 16) {
        snprintf(test_tmpdirs_[test_n_tmpdirs_++], sizeof test_tmpdirs_[0], "%s", buf);
        test_tmpdir_pid_ = getpid();
    }
    return buf;
}

/* Runs the shell command cmd with its standard error sent to the file err_path; its standard
 * output (at most cap - 1 bytes) into out, NUL-terminated.  Returns the exit status, or -1 if
 * it could not run or did not exit. */
static inline int test_run_cmd(const char *cmd, const char *err_path, char *out, size_t cap) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>%s", cmd, err_path);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = 0, r;
    while (n + 1 < cap && (r = fread(out + n, 1, cap - 1 - n, p)) > 0)
        n += r;
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whether the first 8 KiB of the file at path hold needle (0 when it cannot be read). */
static inline int test_file_has(const char *path, const char *needle) {
    char buf[8192];
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strstr(buf, needle) != NULL;
}

/* Send this process's stderr (fd 2) to the file at path until test_stderr_restore(saved);
 * returns the saved descriptor (-1 when the file cannot be opened: nothing is redirected). */
static inline int test_stderr_to(const char *path) {
    fflush(stderr);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const int saved = dup(2);
    dup2(fileno(f), 2);
    fclose(f);
    return saved;
}

/* Undo test_stderr_to; the file's first cap - 1 bytes into buf (also echoed to stderr), and the
 * number of times needle occurs in them. */
static inline int test_stderr_restore(int saved, const char *path, char *buf, size_t cap,
                                      const char *needle) {
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    FILE *f = fopen(path, "r");
    const size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    fputs(buf, stderr);
    int k = 0;
    for (const char *p = buf; needle && (p = strstr(p, needle)) != NULL; p++)
        k++;
    return k;
}

#endif
