/* tests/cuda/cuda_open.h: the "cuda" ops for a device test (header-only test helper): 0 with
 * *ops set (a context of arena_bytes made current, policy/model_device.h arl_dev_ops_get),
 * TEST_SKIP (77) without a CUDA device or in a build without CUDA, 1 when the context cannot be
 * opened (the message printed). */
#ifndef ARL_TESTS_CUDA_CUDA_OPEN_H
#define ARL_TESTS_CUDA_CUDA_OPEN_H

#include <stdio.h>

#include "kernels/cuda/cuda.h"
#include "policy/model_device.h"
#include "tests/test.h"

static inline int test_cuda_open(size_t arena_bytes, const arl_dev_ops **ops) {
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "skip: no CUDA device (or a build without CUDA)\n");
        return TEST_SKIP;
    }
    if (arl_dev_ops_get("cuda", arena_bytes, ops) != ARL_OK) {
        fprintf(stderr, "cuda: %s\n", arl_error_msg());
        return 1;
    }
    return 0;
}

#endif
