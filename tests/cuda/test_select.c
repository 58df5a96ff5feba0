/* tests/cuda/test_select.c: backend selection by name (kernels/backend.h arl_k_backend_get) in
 * every build: "cpu" always works, an unknown name is ARL_ERR_ARG, "cuda" is ARL_ERR_UNSUPPORTED
 * in a build without CUDA, ARL_ERR_DEVICE without a visible device, and the device table
 * otherwise; the CUDA entry points of a CUDA-less build report ARL_ERR_UNSUPPORTED. */
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/nccl.h"
#include "tests/test.h"

static void test_cpu(void) {
    const arl_k_backend *kb = NULL;
    CHECK(arl_k_backend_get("cpu", &kb) == ARL_OK);
    CHECK(kb == arl_k_backend_cpu() && strcmp(kb->name, "cpu") == 0);
    CHECK(arl_k_backend_get(NULL, &kb) == ARL_OK && kb == arl_k_backend_cpu());
}

static void test_unknown(void) {
    const arl_k_backend *kb = arl_k_backend_cpu();
    CHECK(arl_k_backend_get("tpu", &kb) == ARL_ERR_ARG);
    CHECK(kb == NULL);
    CHECK_MSG(strstr(arl_error_msg(), "'tpu'") && strstr(arl_error_msg(), "'cuda'"), "message: %s",
              arl_error_msg());
}

static void test_cuda(void) {
    const arl_k_backend *kb = NULL;
    arl_status s = arl_k_backend_get("cuda", &kb);
    if (!arl_k_backend_cuda()) { /* built without nvcc */
        CHECK_EQ_INT(s, ARL_ERR_UNSUPPORTED);
        CHECK(kb == NULL && strstr(arl_error_msg(), "--device cpu"));
        CHECK_EQ_INT(arl_cuda_device_count(), 0);
        arl_cuda_config c;
        arl_cuda_config_defaults(&c);
        arl_cuda_ctx *ctx = (arl_cuda_ctx *)&c;
        CHECK_EQ_INT(arl_cuda_open(&c, &ctx), ARL_ERR_UNSUPPORTED);
        CHECK(ctx == NULL);
        arl_cuda_close(NULL);
    } else if (arl_cuda_device_count() == 0) { /* CUDA build, no device here */
        CHECK_EQ_INT(s, ARL_ERR_DEVICE);
        CHECK(kb == NULL && strstr(arl_error_msg(), "no CUDA device"));
    } else {
        CHECK_EQ_INT(s, ARL_OK);
        CHECK(kb == arl_k_backend_cuda() && strcmp(kb->name, "cuda") == 0);
        CHECK(arl_cuda_current() != NULL);
    }
    if (!arl_cuda_nccl_available()) {
        uint8_t id[ARL_CUDA_NCCL_ID_BYTES];
        CHECK_EQ_INT(arl_cuda_nccl_unique_id(id), ARL_ERR_UNSUPPORTED);
    }
}

int main(void) {
    TEST_RUN(test_cpu);
    TEST_RUN(test_unknown);
    TEST_RUN(test_cuda);
    return test_finish();
}
