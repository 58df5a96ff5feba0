/* tests/core/failalloc_preload.c: an LD_PRELOAD shim that makes chosen allocations fail, for
 * out-of-memory tests of the commands (tests/core/failalloc.sh).  It counts the calls of malloc,
 * calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign, valloc, strdup and
 * strndup made from the moment main is called (the program's and every library's: jansson,
 * SQLite, curl, OpenBLAS; what the loader and the libraries' constructors allocate before main
 * is not counted, so the count does not depend on them), and:
 *   ARL_TEST_FAIL_ALLOC=N        the Nth counted call (1-based) fails: NULL, errno ENOMEM
 *                                (0 or unset: none fails, the calls are only counted);
 *   ARL_TEST_FAIL_ALLOC_COUNT=K  K consecutive calls fail from the Nth on (default 1; -1: every
 *                                call from the Nth on);
 *   ARL_TEST_FAIL_ALLOC_REPORT=F appends "fail N" to the file F when the Nth call fails (written
 *                                then: a crash after it still leaves it) and "calls C" at exit
 *                                (C counted calls; not written when the process dies of a
 *                                signal or calls _exit);
 *   ARL_TEST_FAIL_ALLOC_TRACE=1  writes the stack of each failed call to standard error
 *                                (backtrace_symbols_fd: which allocation it was).
 * The shim takes LD_PRELOAD and these variables out of the environment as it starts, so that
 * a program the process runs (an environment's server) runs without it.  With threads the
 * order of the calls (and so which call is the Nth) can change from run to run.  Not for the
 * library: a test fixture only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the allocations dlsym makes while the real functions are looked up come from here */
static _Alignas(64) char boot_buf[16384];
static size_t boot_used;
static int resolving;

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);

static int armed;             /* set when main is called */
static long fail_at;          /* N; 0: never */
static long fail_count = 1;   /* K; -1: for ever */
static long calls;            /* counted calls so far (atomic) */
static char report_path[512]; /* "" when not asked */
static int trace;
static __thread int in_shim; /* this thread is inside the shim's own work: not counted */

static void shim_resolve(void) {
    if (real_malloc || resolving) return;
    resolving = 1;
    *(void **)&real_calloc = dlsym(RTLD_NEXT, "calloc");
    *(void **)&real_realloc = dlsym(RTLD_NEXT, "realloc");
    *(void **)&real_free = dlsym(RTLD_NEXT, "free");
    *(void **)&real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    *(void **)&real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    *(void **)&real_memalign = dlsym(RTLD_NEXT, "memalign");
    *(void **)&real_valloc = dlsym(RTLD_NEXT, "valloc");
    *(void **)&real_malloc = dlsym(RTLD_NEXT, "malloc");
    resolving = 0;
}

static void *boot_alloc(size_t n) {
    size_t at = (boot_used + 15) & ~(size_t)15;
    if (n > sizeof boot_buf - at) return NULL;
    boot_used = at + n;
    memset(boot_buf + at, 0, n);
    return boot_buf + at;
}

static int is_boot(const void *p) {
    return (const char *)p >= boot_buf && (const char *)p < boot_buf + sizeof boot_buf;
}

static void report(const char *what, long n) {
    if (!report_path[0]) return;
    int fd = open(report_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[64];
    int len = snprintf(line, sizeof line, "%s %ld\n", what, n);
    if (len > 0) (void)!write(fd, line, (size_t)len);
    close(fd);
}

/* 1 when this call is to fail */
static int shim_fails(void) {
    if (!armed || in_shim) return 0;
    long n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (fail_at <= 0 || n < fail_at || (fail_count >= 0 && n >= fail_at + fail_count)) return 0;
    in_shim = 1;
    report("fail", n);
    if (trace) {
        void *frames[48];
        char head[64];
        int len = snprintf(head, sizeof head, "failalloc: call %ld fails:\n", n);
        if (len > 0) (void)!write(2, head, (size_t)len);
        backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
    }
    in_shim = 0;
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t n) {
    if (!real_malloc) {
        shim_resolve();
        if (!real_malloc) return boot_alloc(n);
    }
    return shim_fails() ? NULL : real_malloc(n);
}

void *calloc(size_t n, size_t size) {
    if (!real_calloc) {
        shim_resolve();
        if (!real_calloc) return size && n > SIZE_MAX / size ? NULL : boot_alloc(n * size);
    }
    return shim_fails() ? NULL : real_calloc(n, size);
}

void *realloc(void *p, size_t n) {
    if (!real_realloc) shim_resolve();
    if (is_boot(p)) { /* a bootstrap block grows into a real one */
        void *q = malloc(n);
        if (q)
            memcpy(q, p,
                   (size_t)(boot_buf + sizeof boot_buf - (char *)p) < n
                       ? (size_t)(boot_buf + sizeof boot_buf - (char *)p)
                       : n);
        return q;
    }
    return shim_fails() ? NULL : real_realloc(p, n);
}

void *reallocarray(void *p, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n * size);
}

void free(void *p) {
    if (!p || is_boot(p)) return;
    if (!real_free) shim_resolve();
    if (real_free) real_free(p);
}

int posix_memalign(void **out, size_t align, size_t n) {
    if (!real_posix_memalign) shim_resolve();
    return shim_fails() ? ENOMEM : real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    if (!real_aligned_alloc) shim_resolve();
    return shim_fails() ? NULL : real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n) {
    if (!real_memalign) shim_resolve();
    return shim_fails() ? NULL : real_memalign(align, n);
}

void *valloc(size_t n) {
    if (!real_valloc) shim_resolve();
    return shim_fails() ? NULL : real_valloc(n);
}

char *strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *strndup(const char *s, size_t max) {
    size_t n = strnlen(s, max);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* main is called through this wrapper, which arms the counter */
static int (*real_main)(int, char **, char **);

static int shim_main(int argc, char **argv, char **envp) {
    __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST);
    return real_main(argc, argv, envp);
}

int __libc_start_main(int (*main)(int, char **, char **), int argc, char **argv, void (*init)(void),
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
    int (*real)(int (*)(int, char **, char **), int, char **, void (*)(void), void (*)(void),
                void (*)(void), void *);
    *(void **)&real = dlsym(RTLD_NEXT, "__libc_start_main");
    real_main = main;
    return real(shim_main, argc, argv, init, fini, rtld_fini, stack_end);
}

__attribute__((constructor)) static void shim_start(void) {
    shim_resolve();
    const char *v = getenv("ARL_TEST_FAIL_ALLOC");
    fail_at = v ? atol(v) : 0;
    v = getenv("ARL_TEST_FAIL_ALLOC_COUNT");
    if (v && *v) fail_count = atol(v);
    v = getenv("ARL_TEST_FAIL_ALLOC_REPORT");
    if (v && strlen(v) < sizeof report_path) strcpy(report_path, v);
    v = getenv("ARL_TEST_FAIL_ALLOC_TRACE");
    trace = v && *v && strcmp(v, "0");
    unsetenv("LD_PRELOAD");
    unsetenv("ARL_TEST_FAIL_ALLOC");
    unsetenv("ARL_TEST_FAIL_ALLOC_COUNT");
    unsetenv("ARL_TEST_FAIL_ALLOC_REPORT");
    unsetenv("ARL_TEST_FAIL_ALLOC_TRACE");
}

__attribute__((destructor)) static void shim_end(void) {
    in_shim = 1;
    report("calls", __atomic_load_n(&calls, __ATOMIC_RELAXED));
}
