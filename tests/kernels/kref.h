/* tests/kernels/kref.h: helpers shared by the kernel tests - seeded random arrays, buffers that
 * abort on allocation failure, bit comparison, and the thread-count loop.
 *
 * References in these tests are naive float64 loops written from the formulas of the contract
 * headers (and spec/policy.md), never calls to the kernels themselves. */
#ifndef ARL_TESTS_KERNELS_KREF_H
#define ARL_TESTS_KERNELS_KREF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/threadpool.h"
#include "tests/test.h"

static inline void *kt_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static inline float *kt_floats(int64_t n) {
    return kt_alloc((size_t)n * sizeof(float));
}
static inline double *kt_doubles(int64_t n) {
    return kt_alloc((size_t)n * sizeof(double));
}

/* x[i] ~ N(mean, sd^2) rounded to fp32. */
static inline void kt_normal(arl_rng *r, float *x, int64_t n, double mean, double sd) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(mean + sd * arl_rng_normal(r));
}

/* x[i] ~ U[lo, hi) rounded to fp32. */
static inline void kt_uniform(arl_rng *r, float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * arl_rng_uniform(r));
}

static inline int kt_same_bits(const void *a, const void *b, size_t bytes) {
    return memcmp(a, b, bytes) == 0;
}

/* Set the process-wide pool to n threads; a failure here is a failure of the test. */
static inline void kt_threads(int n) {
    if (arl_k_threads_init(n) != ARL_OK) {
        fprintf(stderr, "test: arl_k_threads_init(%d): %s\n", n, arl_error_msg());
        exit(1);
    }
}

/* The thread counts every numeric test runs under: serial, the default, and an odd split. */
static const int kt_thread_counts[] = {1, 2, 3};
#define KT_N_THREAD_COUNTS 3

#endif
