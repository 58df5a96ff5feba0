/* kernels/cpu/internal.h: private helpers shared by the CPU kernel files (not a contract).
 *
 * Work sizes.  A parallel-for hands a thread at least ARL_K_GRAIN elements of work: below that
 * the wake-up of a sleeping worker (tens of microseconds) costs more than it saves.  The grain
 * changes only the speed, never the bits (kernels/threadpool.h). */
#ifndef ARL_KERNELS_CPU_INTERNAL_H
#define ARL_KERNELS_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#define ARL_K_GRAIN ((int64_t)1 << 15)

/* Items of `width` elements each per thread, so that a part holds at least `elems` elements. */
static inline int64_t arl_k_grain_items(int64_t width, int64_t elems) {
    return width >= elems ? 1 : elems / (width > 0 ? width : 1);
}

/* Rows of width d per thread for memory-bound row kernels. */
static inline int64_t arl_k_row_grain(int64_t d) {
    return arl_k_grain_items(d, ARL_K_GRAIN);
}

/* Logistic sigmoid, stable for large |x| (no overflow of exp). */
static inline float arl_k_sigmoidf(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

#endif
