/* tests/cuda/cuda_test.h: helpers of the CUDA parity tests - skip without a GPU (exit 77),
 * a context with an arena, seeded host arrays, device copies, and comparison of a device
 * result with the CPU reference.
 *
 * Every parity test runs the CPU reference (kernels/cpu, policy/) and the CUDA op on the SAME
 * random inputs and compares elementwise with a stated tolerance. */
#ifndef ARL_TESTS_CUDA_CUDA_TEST_H
#define ARL_TESTS_CUDA_CUDA_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "tests/test.h"

static arl_cuda_ctx *ct_ctx = NULL;
static arl_rng ct_rng;

/* Exit 77 (skipped) when no CUDA device is visible, or the build has no CUDA. */
static inline void ct_init(size_t arena_bytes) {
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "skip: no CUDA device (or a build without CUDA)\n");
        exit(TEST_SKIP);
    }
    arl_cuda_config c;
    arl_cuda_config_defaults(&c);
    c.arena_bytes = arena_bytes;
    if (arl_cuda_open(&c, &ct_ctx) != ARL_OK) {
        fprintf(stderr, "test: %s\n", arl_error_msg());
        exit(1);
    }
    arl_cuda_make_current(ct_ctx);
    arl_rng_seed(&ct_rng, 20261130);
}

static inline void ct_die(const char *what) {
    fprintf(stderr, "test: %s: %s\n", what, arl_error_msg());
    exit(1);
}

static inline void *ct_host(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of host memory\n");
        exit(1);
    }
    return p;
}

/* Host array of n uniform values in [lo, hi). */
static inline float *ct_rand(int64_t n, float lo, float hi) {
    float *x = (float *)ct_host(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)arl_rng_uniform(&ct_rng);
    return x;
}

static inline float *ct_copy_host(const float *x, int64_t n) {
    float *y = (float *)ct_host(sizeof(float) * (size_t)n);
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

/* Device copy of host bytes (or zeroed device bytes when src is NULL), from the arena. */
static inline void *ct_dev_bytes(const void *src, size_t bytes) {
    void *d = NULL;
    if (arl_cuda_alloc(ct_ctx, bytes, "test buffer", &d) != ARL_OK) ct_die("arena");
    if (src) {
        if (arl_cuda_upload(ct_ctx, d, src, bytes) != ARL_OK) ct_die("upload");
    } else if (arl_cuda_memset0(ct_ctx, d, bytes) != ARL_OK) {
        ct_die("memset");
    }
    return d;
}
static inline float *ct_dev(const float *src, int64_t n) {
    return (float *)ct_dev_bytes(src, sizeof(float) * (size_t)n);
}
static inline int32_t *ct_dev_i32(const int32_t *src, int64_t n) {
    return (int32_t *)ct_dev_bytes(src, sizeof(int32_t) * (size_t)n);
}

/* Waits for the device, checks for errors, and returns a host copy of d (n floats). */
static inline float *ct_get(const float *d, int64_t n) {
    if (arl_cuda_sync(ct_ctx) != ARL_OK) ct_die("sync");
    float *h = (float *)ct_host(sizeof(float) * (size_t)n);
    if (arl_cuda_download(ct_ctx, h, d, sizeof(float) * (size_t)n) != ARL_OK) ct_die("download");
    return h;
}
static inline int32_t *ct_get_i32(const int32_t *d, int64_t n) {
    if (arl_cuda_sync(ct_ctx) != ARL_OK) ct_die("sync");
    int32_t *h = (int32_t *)ct_host(sizeof(int32_t) * (size_t)n);
    if (arl_cuda_download(ct_ctx, h, d, sizeof(int32_t) * (size_t)n) != ARL_OK) ct_die("download");
    return h;
}

static inline uint16_t *ct_get_u16(const uint16_t *d, int64_t n) {
    if (arl_cuda_sync(ct_ctx) != ARL_OK) ct_die("sync");
    uint16_t *h = (uint16_t *)ct_host(sizeof(uint16_t) * (size_t)n);
    if (arl_cuda_download(ct_ctx, h, d, sizeof(uint16_t) * (size_t)n) != ARL_OK) ct_die("download");
    return h;
}

/* Compare device d (n) with host ref elementwise; frees the host copy. */
static inline int ct_check(const char *what, const float *d, const float *ref, int64_t n,
                           double atol, double rtol) {
    float *h = ct_get(d, n);
    int ok = check_close_f32(what, h, ref, (size_t)n, atol, rtol);
    free(h);
    return ok;
}
static inline int ct_check_maxref(const char *what, const float *d, const float *ref, int64_t n,
                                  double atol, double rtol) {
    float *h = ct_get(d, n);
    int ok = check_close_maxref_f32(what, h, ref, (size_t)n, atol, rtol);
    free(h);
    return ok;
}

/* Releases the arena back to mark after a test case (host arrays are freed by the case). */
#define CT_CASE_BEGIN size_t ct_mark_ = arl_cuda_mark(ct_ctx)
#define CT_CASE_END arl_cuda_release(ct_ctx, ct_mark_)

#endif
