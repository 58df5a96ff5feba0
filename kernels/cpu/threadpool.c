/* kernels/cpu/threadpool.c: the fixed thread pool and static-partition parallel-for of
 * kernels/threadpool.h (pthreads; workers sleep on a condition variable between runs). */
#include "kernels/threadpool.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/log.h"

typedef struct worker_arg {
    arl_k_pool *pool;
    int index; /* 1 .. n_threads-1; the caller is part 0 */
} worker_arg;

struct arl_k_pool {
    int n_threads;
    pthread_t *threads;   /* (n_threads - 1) workers */
    worker_arg *args;     /* (n_threads - 1) */
    atomic_flag busy;     /* set while a run is dispatched; a second run goes serial */
    pthread_mutex_t mu;   /* guards everything below */
    pthread_cond_t start; /* workers wait here for a new generation */
    pthread_cond_t done;  /* the caller waits here for pending == 0 */
    uint64_t generation;  /* incremented once per run */
    int pending;          /* workers that have not finished the current run */
    int stop;
    /* the current run */
    arl_k_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
};

static void run_part(arl_k_pool *p, int part) {
    if (part >= p->parts) return;
    int64_t b = p->n * part / p->parts;
    int64_t e = p->n * (part + 1) / p->parts;
    if (b < e) p->fn(p->ctx, b, e);
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
        pthread_mutex_unlock(&p->mu);
        run_part(p, a->index); /* job fields are stable until pending reaches 0 */
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
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

void arl_k_pool_run(arl_k_pool *p, int64_t n, int64_t grain, arl_k_range_fn fn, void *ctx) {
    ARL_ASSERT(fn != NULL);
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t want = (n + grain - 1) / grain;
    int parts = p ? (want < p->n_threads ? (int)want : p->n_threads) : 1;
    /* serial: one part, no pool, or the pool is already running (nested or concurrent call) */
    if (parts <= 1 || atomic_flag_test_and_set(&p->busy)) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = parts;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    run_part(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
