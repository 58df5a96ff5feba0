/* The thread pool: every item runs exactly once in the documented static partition, nested and
 * concurrent runs fall back to serial, bad sizes are errors, and idle workers do not spin. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "kernels/threadpool.h"
#include "tests/kernels/kref.h"

typedef struct count_ctx {
    atomic_int *hits;   /* (n) times each item ran */
    atomic_int calls;   /* number of fn calls (parts) */
    int64_t begins[16]; /* begin of each part, by call order (only small n) */
} count_ctx;

static void count_range(void *vctx, int64_t b, int64_t e) {
    count_ctx *c = vctx;
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->calls, 1);
}

static void test_covers_each_item_once(void) {
    static const int threads[] = {1, 2, 3, 5};
    static const int64_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 100003};
    static const int64_t grains[] = {1, 3, 1000, 1 << 20};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        arl_k_pool *p = NULL;
        CHECK(arl_k_pool_create(&p, threads[ti]) == ARL_OK);
        CHECK_EQ_INT(arl_k_pool_threads(p), threads[ti]);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            for (size_t gi = 0; gi < sizeof grains / sizeof *grains; gi++) {
                int64_t n = ns[ni], grain = grains[gi];
                count_ctx c = {.hits = kt_alloc((size_t)(n + 1) * sizeof(atomic_int))};
                for (int64_t i = 0; i < n; i++)
                    atomic_init(&c.hits[i], 0);
                atomic_init(&c.calls, 0);
                arl_k_pool_run(p, n, grain, count_range, &c);
                int ok = 1;
                for (int64_t i = 0; i < n; i++)
                    ok &= atomic_load(&c.hits[i]) == 1;
                CHECK_MSG(ok, "threads %d n %lld grain %lld", threads[ti], (long long)n,
                          (long long)grain);
                /* parts = min(threads, ceil(n / grain)), each part non-empty */
                int64_t want = n == 0 ? 0 : (n + grain - 1) / grain;
                int64_t parts = want < threads[ti] ? want : threads[ti];
                CHECK_EQ_INT(atomic_load(&c.calls), parts);
                free(c.hits);
            }
        }
        arl_k_pool_free(p);
    }
    arl_k_pool_free(NULL); /* no-op */
}

/* Part i is exactly [n*i/parts, n*(i+1)/parts): record each part's range by part index. */
typedef struct part_ctx {
    int64_t n, parts;
    atomic_int bad;
} part_ctx;

static void part_range(void *vctx, int64_t b, int64_t e) {
    part_ctx *c = vctx;
    int found = 0;
    for (int64_t i = 0; i < c->parts; i++)
        if (b == c->n * i / c->parts && e == c->n * (i + 1) / c->parts) found = 1;
    if (!found) atomic_fetch_add(&c->bad, 1);
}

static void test_static_partition(void) {
    arl_k_pool *p = NULL;
    CHECK(arl_k_pool_create(&p, 3) == ARL_OK);
    for (int64_t n = 3; n < 200; n += 7) {
        part_ctx c = {.n = n, .parts = 3};
        atomic_init(&c.bad, 0);
        for (int rep = 0; rep < 5; rep++)
            arl_k_pool_run(p, n, 1, part_range, &c);
        CHECK_EQ_INT(atomic_load(&c.bad), 0);
    }
    arl_k_pool_free(p);
}

/* arl_k_pool_run_items: every item is its own part ([i, i+1)), run exactly once. */
typedef struct item_ctx {
    atomic_int hits[64];
    atomic_int bad;
} item_ctx;

static void item_range(void *vctx, int64_t b, int64_t e) {
    item_ctx *c = vctx;
    if (e != b + 1 || b < 0 || e > 64) {
        atomic_fetch_add(&c->bad, 1);
        return;
    }
    atomic_fetch_add(&c->hits[b], 1);
}

static void test_items(void) {
    arl_k_pool *p = NULL;
    CHECK(arl_k_pool_create(&p, 3) == ARL_OK);
    for (int64_t n = 2; n <= 64; n += 9)
        for (int rep = 0; rep < 20; rep++) {
            item_ctx c;
            for (int i = 0; i < 64; i++)
                atomic_init(&c.hits[i], 0);
            atomic_init(&c.bad, 0);
            arl_k_pool_run_items(p, n, item_range, &c);
            int ok = atomic_load(&c.bad) == 0;
            for (int64_t i = 0; i < 64; i++)
                ok &= atomic_load(&c.hits[i]) == (i < n);
            CHECK_MSG(ok, "run_items n = %lld: an item ran twice, never, or as a wider part",
                      (long long)n);
        }
    arl_k_pool_free(p);
}

/* A run from inside a part executes serially on that thread and still covers everything. */
typedef struct nested_ctx {
    arl_k_pool *p;
    atomic_int inner_items;
} nested_ctx;

static void inner_range(void *vctx, int64_t b, int64_t e) {
    nested_ctx *c = vctx;
    atomic_fetch_add(&c->inner_items, (int)(e - b));
}

static void outer_range(void *vctx, int64_t b, int64_t e) {
    nested_ctx *c = vctx;
    for (int64_t i = b; i < e; i++)
        arl_k_pool_run(c->p, 100, 1, inner_range, c);
}

static void test_nested_runs_serially(void) {
    nested_ctx c;
    CHECK(arl_k_pool_create(&c.p, 2) == ARL_OK);
    atomic_init(&c.inner_items, 0);
    arl_k_pool_run(c.p, 10, 1, outer_range, &c);
    CHECK_EQ_INT(atomic_load(&c.inner_items), 10 * 100);
    arl_k_pool_free(c.p);
}

/* Two application threads using one pool at once: both complete with correct coverage. */
typedef struct conc_ctx {
    arl_k_pool *p;
    atomic_int items;
} conc_ctx;

static void conc_range(void *vctx, int64_t b, int64_t e) {
    conc_ctx *c = vctx;
    atomic_fetch_add(&c->items, (int)(e - b));
}

static void *conc_thread(void *varg) {
    conc_ctx *c = varg;
    for (int rep = 0; rep < 200; rep++)
        arl_k_pool_run(c->p, 1000, 10, conc_range, c);
    return NULL;
}

static void test_concurrent_callers(void) {
    conc_ctx c;
    CHECK(arl_k_pool_create(&c.p, 2) == ARL_OK);
    atomic_init(&c.items, 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, conc_thread, &c);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(atomic_load(&c.items), 2 * 200 * 1000);
    arl_k_pool_free(c.p);
}

static void test_bad_sizes(void) {
    arl_k_pool *p = (arl_k_pool *)1;
    CHECK(arl_k_pool_create(&p, 0) == ARL_ERR_ARG);
    CHECK(p == NULL);
    CHECK(strstr(arl_error_msg(), "thread count 0") != NULL);
    CHECK(arl_k_pool_create(&p, -3) == ARL_ERR_ARG);
    CHECK(arl_k_threads_init(0) == ARL_ERR_ARG);
    /* the previous process-wide pool survives a failed init */
    kt_threads(2);
    CHECK(arl_k_threads_init(100000) == ARL_ERR_ARG);
    CHECK_EQ_INT(arl_k_threads(), 2);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double idle_cpu_seconds(long ms) {
    double c0 = cpu_seconds();
    struct timespec nap = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&nap, NULL);
    return cpu_seconds() - c0;
}

/* Idle workers sleep: after a run, 300 ms of idle wall time costs (almost) no CPU time.
 * A spinning worker would burn ~0.3 s; we allow 0.05 s for wake-ups and timer noise.
 * OpenBLAS's own threads spin for ~0.1 s after the library loads (they are never used
 * afterwards: kernels set OpenBLAS to one thread), so first wait until the process is quiet. */
static void test_idle_workers_sleep(void) {
    for (int i = 0; i < 20 && idle_cpu_seconds(100) > 0.005; i++) {
    }
    arl_k_pool *p = NULL;
    CHECK(arl_k_pool_create(&p, 3) == ARL_OK);
    conc_ctx c = {.p = p};
    atomic_init(&c.items, 0);
    arl_k_pool_run(p, 1000, 1, conc_range, &c);
    double used = idle_cpu_seconds(300);
    CHECK_MSG(used < 0.05, "idle pool used %.3f s of CPU in 0.3 s", used);
    arl_k_pool_free(p);
}

/* The process-wide pool: default size, re-init, free and lazy re-creation. */
static void test_global_pool(void) {
    arl_k_threads_free();
    CHECK_EQ_INT(arl_k_threads(), ARL_K_THREADS_DEFAULT); /* lazily created */
    kt_threads(3);
    CHECK_EQ_INT(arl_k_threads(), 3);
    count_ctx c = {.hits = kt_alloc(50 * sizeof(atomic_int))};
    for (int i = 0; i < 50; i++)
        atomic_init(&c.hits[i], 0);
    atomic_init(&c.calls, 0);
    arl_k_parallel_for(50, 1, count_range, &c);
    int ok = 1;
    for (int i = 0; i < 50; i++)
        ok &= atomic_load(&c.hits[i]) == 1;
    CHECK(ok);
    CHECK_EQ_INT(atomic_load(&c.calls), 3);
    free(c.hits);
    arl_k_threads_free();
    arl_k_threads_free(); /* twice is fine */
}

int main(void) {
    TEST_RUN(test_covers_each_item_once);
    TEST_RUN(test_static_partition);
    TEST_RUN(test_nested_runs_serially);
    TEST_RUN(test_concurrent_callers);
    TEST_RUN(test_items);
    TEST_RUN(test_bad_sizes);
    TEST_RUN(test_idle_workers_sleep);
    TEST_RUN(test_global_pool);
    return test_finish();
}
