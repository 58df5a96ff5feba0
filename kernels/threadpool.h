/* kernels/threadpool.h: the CPU backend's threads - a small fixed pool with a static-partition
 * parallel-for, and the one process-wide pool every CPU kernel uses.
 *
 * It is: n threads created once (the calling thread plus n-1 workers), a parallel-for that cuts
 * [0, n_items) into contiguous parts fixed by (n_items, grain, n_threads) only, and workers that
 * sleep on a condition variable when idle (no spinning).  Free threads claim the parts (so the
 * thread that runs a part depends on timing; the parts themselves never do).  It is not a task
 * scheduler: no futures, no splitting of parts by load - that would make the partition depend
 * on timing.
 *
 * Determinism contract.  Every CPU kernel is written so that the value it computes for one item
 * (a row, a column block, a fixed-size chunk) does not depend on which part the item falls in.
 * Hence all non-GEMM kernels give bit-identical results for any thread count, 1 included.
 * GEMMs are bit-identical run to run for a fixed thread count (see kernels/gemm.h).
 *
 * Threading policy (OpenBLAS vs this pool).  This pool is the only source of parallelism:
 * arl_k_threads_init() sets OpenBLAS to 1 thread, and arl_k_gemm splits large GEMMs into one
 * OpenBLAS call per pool thread.  So at most n_threads threads compute at any time, whatever mix
 * of GEMMs and row ops runs, and idle OpenBLAS threads never spin against our workers.  Nothing
 * else in agentrl may call openblas_set_num_threads() (bench_kernels does, for its baseline).
 *
 * Nesting and concurrency.  A parallel-for issued while the pool is busy - from inside a part
 * (nested), or from a second application thread - runs serially on the calling thread.  That is
 * always correct (same bits, by the contract above), only slower.
 */
#ifndef ARL_KERNELS_THREADPOOL_H
#define ARL_KERNELS_THREADPOOL_H

#include <stdint.h>

#include "core/status.h"

/* Work on items [begin, end) of a parallel-for. ctx is the caller's argument block. */
typedef void (*arl_k_range_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct arl_k_pool arl_k_pool;

/* Create a pool of n_threads >= 1 threads in total (the caller counts as one; n_threads - 1
 * workers are started).  *out is owned by the caller, freed with arl_k_pool_free.
 * Errors: ARL_ERR_ARG (n_threads < 1 or > 1024), ARL_ERR_NOMEM, ARL_ERR_INTERNAL (thread
 * creation failed). */
arl_status arl_k_pool_create(arl_k_pool **out, int n_threads);

/* Stop and join the workers and free the pool. NULL is a no-op. Not while a run is active. */
void arl_k_pool_free(arl_k_pool *p);

int arl_k_pool_threads(const arl_k_pool *p);

/* Run fn over [0, n) and return when every part is done.  The range is cut into
 * parts = min(n_threads, ceil(n / grain)) contiguous pieces, part i = [n*i/parts, n*(i+1)/parts);
 * each part runs exactly once, on whichever thread claims it first: the caller claims too
 * (usually part 0, as it starts before the workers wake), so a worker that is slow to wake on a
 * loaded machine leaves its part to the caller instead of stalling the run.  Which thread runs
 * a part never changes a result (the contract above).  grain >= 1 is the least number of items
 * worth a thread.  n <= 0 does nothing.  Allocates nothing.  p == NULL runs fn(ctx, 0, n) on the
 * caller. */
void arl_k_pool_run(arl_k_pool *p, int64_t n, int64_t grain, arl_k_range_fn fn, void *ctx);

/* Run fn over [0, n) with every item its own part ([i, i+1), n <= INT32_MAX), claimed one at a
 * time by whichever thread is free: a dynamic balance of a few coarse items (GEMM blocks) when
 * a thread is late or slow.  Which thread runs an item never changes a result.  A pool of one
 * thread, p == NULL, or a busy pool runs fn(ctx, 0, n) on the caller. */
void arl_k_pool_run_items(arl_k_pool *p, int64_t n, arl_k_range_fn fn, void *ctx);

/* ---- the CPU backend's process-wide pool ---- */

/* Default thread count of the process-wide pool (when arl_k_threads_init is never called). */
#define ARL_K_THREADS_DEFAULT 2

/* (Re)create the process-wide pool with n_threads threads and set OpenBLAS to one thread.
 * Call from main at start-up (and from tests), never while kernels run on other threads.
 * Without a call, the first kernel creates the pool with ARL_K_THREADS_DEFAULT threads (and
 * falls back to serial execution, with a warning, if threads cannot be created).
 * Errors: as arl_k_pool_create; on error the previous pool stays in place. */
arl_status arl_k_threads_init(int n_threads);

/* Threads of the process-wide pool (creating the default pool if there is none yet). */
int arl_k_threads(void);

/* Free the process-wide pool (at exit; optional). The next kernel call makes a default pool. */
void arl_k_threads_free(void);

/* arl_k_pool_run on the process-wide pool: the parallel-for every CPU kernel uses. */
void arl_k_parallel_for(int64_t n, int64_t grain, arl_k_range_fn fn, void *ctx);

/* arl_k_pool_run_items on the process-wide pool. */
void arl_k_parallel_for_items(int64_t n, arl_k_range_fn fn, void *ctx);

/* Least work (multiply-adds, or comparable operations) worth handing to a thread: below it the
 * wake-up of a sleeping worker costs more than it saves, and on a loaded machine much more
 * (a worker may wait for a time slice).  Small decode steps therefore run serially. */
#define ARL_K_WORK_GRAIN ((int64_t)1 << 19)

/* Grain (items per part) for items of `work` multiply-adds each, from ARL_K_WORK_GRAIN. */
static inline int64_t arl_k_work_grain(int64_t work) {
    if (work < 1) work = 1;
    return work >= ARL_K_WORK_GRAIN ? 1 : (ARL_K_WORK_GRAIN + work - 1) / work;
}

#endif
