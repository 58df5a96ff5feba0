/* kernels/cpu/threadpool.c: the fixed thread pool and static-partition parallel-for of
 * kernels/threadpool.h (pthreads; workers sleep on a condition variable between runs; the
 * parts of a run are claimed by whichever thread is free, see struct arl_k_pool). */
#include "kernels/threadpool.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/log.h"

typedef struct worker_arg {
    arl_k_pool *pool;
    int index; /* 1 .. n_threads-1; the caller is thread 0 */
} worker_arg;

/* The job of one run, as a thread copies it under the mutex. */
typedef struct run_job {
    arl_k_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
    uint32_t gen; /* low 32 bits of the run's generation */
} run_job;

struct arl_k_pool {
    int n_threads;
    pthread_t *threads;   /* (n_threads - 1) workers */
    worker_arg *args;     /* (n_threads - 1) */
    atomic_flag busy;     /* set while a run is dispatched; a second run goes serial */
    pthread_mutex_t mu;   /* guards everything below except the atomics */
    pthread_cond_t start; /* workers wait here for a new generation */
    pthread_cond_t done;  /* the caller waits here for done_parts == parts */
    uint64_t generation;  /* incremented once per run */
    int stop;
    run_job job; /* the current run */
    /* Parts are claimed, not assigned: claim = (gen << 32) | next unclaimed part.  A thread
     * claims part `next` of run `gen` with a compare-and-swap, so every part runs exactly once,
     * on whichever thread gets there first, and a worker that wakes after its run is over (or
     * holds an older run's job) claims nothing. */
    _Atomic uint64_t claim;
    atomic_int done_parts; /* parts of the current run finished */
};

/* Claim and run parts of job j until none is left; returns the number run. */
static int run_parts(arl_k_pool *p, const run_job *j) {
    int ran = 0;
    uint64_t c = atomic_load(&p->claim);
    for (;;) {
        if ((uint32_t)(c >> 32) != j->gen || (int64_t)(uint32_t)c >= j->parts) break;
        if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1)) continue; /* c reloaded */
        int part = (int)(uint32_t)c;
        int64_t b = j->n * part / j->parts, e = j->n * (part + 1) / j->parts;
        if (b < e) j->fn(j->ctx, b, e);
        ran++;
        c = atomic_load(&p->claim);
    }
    return ran;
}

/* Count `ran` finished parts of job j; the thread that finishes the last one wakes the caller. */
static void parts_done(arl_k_pool *p, const run_job *j, int ran) {
    if (ran > 0 && atomic_fetch_add(&p->done_parts, ran) + ran == j->parts) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *worker_main(void *varg) {
    worker_arg *a = varg;
    arl_k_pool *p = a->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->stop)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        run_job j = p->job;
        pthread_mutex_unlock(&p->mu);
        parts_done(p, &j, run_parts(p, &j));
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

arl_status arl_k_pool_create(arl_k_pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return arl_errorf(ARL_ERR_ARG, "kernels: thread count %d out of range [1, 1024]",
                          n_threads);
    arl_k_pool *p = calloc(1, sizeof *p);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "kernels: out of memory creating a thread pool");
    p->n_threads = 1;
    atomic_flag_clear(&p->busy);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->claim, 0);
    atomic_init(&p->done_parts, 0);
    int nw = n_threads - 1;
    if (nw > 0) {
        p->threads = calloc((size_t)nw, sizeof *p->threads);
        p->args = calloc((size_t)nw, sizeof *p->args);
        if (!p->threads || !p->args) {
            arl_k_pool_free(p);
            return arl_errorf(ARL_ERR_NOMEM, "kernels: out of memory creating a thread pool");
        }
    }
    for (int i = 0; i < nw; i++) {
        p->args[i] = (worker_arg){p, i + 1};
        int rc = pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]);
        if (rc != 0) {
            arl_k_pool_free(p); /* joins the workers started so far */
            return arl_errorf(ARL_ERR_INTERNAL,
                              "kernels: could not start worker thread %d of %d (%s); "
                              "try fewer threads",
                              i + 1, n_threads, strerror(rc));
        }
        p->n_threads = i + 2;
    }
    *out = p;
    return ARL_OK;
}

void arl_k_pool_free(arl_k_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->args);
    free(p);
}

int arl_k_pool_threads(const arl_k_pool *p) {
    return p ? p->n_threads : 1;
}

static void pool_dispatch(arl_k_pool *p, int64_t n, int parts, arl_k_range_fn fn, void *ctx);

void arl_k_pool_run(arl_k_pool *p, int64_t n, int64_t grain, arl_k_range_fn fn, void *ctx) {
    ARL_ASSERT(fn != NULL);
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t want = (n + grain - 1) / grain;
    int parts = p ? (want < p->n_threads ? (int)want : p->n_threads) : 1;
    pool_dispatch(p, n, parts, fn, ctx);
}

void arl_k_pool_run_items(arl_k_pool *p, int64_t n, arl_k_range_fn fn, void *ctx) {
    ARL_ASSERT(fn != NULL && n <= INT32_MAX);
    if (n <= 0) return;
    pool_dispatch(p, n, p && p->n_threads > 1 ? (int)n : 1, fn, ctx);
}

/* Run fn over [0, n) cut into `parts` parts (see arl_k_pool_run). */
static void pool_dispatch(arl_k_pool *p, int64_t n, int parts, arl_k_range_fn fn, void *ctx) {
    /* serial: one part, no pool, or the pool is already running (nested or concurrent call) */
    if (parts <= 1 || atomic_flag_test_and_set(&p->busy)) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->generation++;
    run_job j = {fn, ctx, n, parts, (uint32_t)p->generation};
    p->job = j;
    atomic_store(&p->done_parts, 0);
    atomic_store(&p->claim, (uint64_t)j.gen << 32);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    /* the caller claims too (part 0 first, as it starts before the workers wake): a worker that
     * is slow to wake, e.g. on a loaded machine, leaves its part to whoever is free */
    int ran = run_parts(p, &j);
    if (ran > 0) atomic_fetch_add(&p->done_parts, ran);
    if (atomic_load(&p->done_parts) < parts) { /* a worker is still in its part */
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->done_parts) < parts)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_flag_clear(&p->busy);
}

/* ---- OpenBLAS set-up ---- */

/* One OpenBLAS thread: this pool provides all parallelism (kernels/threadpool.h). */
static void openblas_setup(void) {
    openblas_set_num_threads(1);
}

/* ---- the process-wide pool ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(arl_k_pool *) g_pool = NULL;
static atomic_int g_serial = 0; /* default pool could not be created: run serially */

static arl_k_pool *global_pool(void) {
    arl_k_pool *p = atomic_load_explicit(&g_pool, memory_order_acquire);
    if (p || atomic_load(&g_serial)) return p;
    pthread_mutex_lock(&g_mu);
    p = atomic_load(&g_pool);
    if (!p && !atomic_load(&g_serial)) {
        openblas_setup();
        if (arl_k_pool_create(&p, ARL_K_THREADS_DEFAULT) != ARL_OK) {
            arl_log_warn("kernels: %s; running CPU kernels on one thread", arl_error_msg());
            atomic_store(&g_serial, 1);
            p = NULL;
        }
        atomic_store_explicit(&g_pool, p, memory_order_release);
    }
    pthread_mutex_unlock(&g_mu);
    return p;
}

arl_status arl_k_threads_init(int n_threads) {
    arl_k_pool *fresh = NULL;
    ARL_TRY(arl_k_pool_create(&fresh, n_threads));
    pthread_mutex_lock(&g_mu);
    openblas_setup();
    arl_k_pool *old = atomic_exchange(&g_pool, fresh);
    atomic_store(&g_serial, 0);
    pthread_mutex_unlock(&g_mu);
    arl_k_pool_free(old);
    return ARL_OK;
}

int arl_k_threads(void) {
    return arl_k_pool_threads(global_pool());
}

void arl_k_threads_free(void) {
    pthread_mutex_lock(&g_mu);
    arl_k_pool *old = atomic_exchange(&g_pool, NULL);
    atomic_store(&g_serial, 0);
    pthread_mutex_unlock(&g_mu);
    arl_k_pool_free(old);
}

void arl_k_parallel_for(int64_t n, int64_t grain, arl_k_range_fn fn, void *ctx) {
    if (n <= 0) return;
    arl_k_pool_run(global_pool(), n, grain, fn, ctx);
}

void arl_k_parallel_for_items(int64_t n, arl_k_range_fn fn, void *ctx) {
    if (n <= 0) return;
    arl_k_pool_run_items(global_pool(), n, fn, ctx);
}
