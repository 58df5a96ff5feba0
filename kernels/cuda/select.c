/* kernels/cuda/select.c: backend selection by name (kernels/backend.h arl_k_backend_get),
 * in every build: with CUDA it returns the device table, without it a clear error
 * (kernels/cuda/stub/cuda_stub.c supplies the CUDA entry points then). */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"

arl_status arl_k_backend_get(const char *name, const arl_k_backend **out) {
    *out = NULL;
    if (!name || strcmp(name, "cpu") == 0) {
        *out = arl_k_backend_cpu();
        return ARL_OK;
    }
    if (strcmp(name, "cuda") != 0)
        return arl_errorf(ARL_ERR_ARG, "device '%s': expected 'cpu' or 'cuda'", name);
    if (!arl_k_backend_cuda())
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "device 'cuda': this build has no CUDA backend (nvcc was not found when "
                          "it was configured, or AGENTRL_CUDA=OFF); use --device cpu or rebuild "
                          "with the CUDA toolkit");
    if (arl_cuda_device_count() == 0)
        return arl_errorf(ARL_ERR_DEVICE,
                          "device 'cuda': no CUDA device is visible (cudaGetDeviceCount found "
                          "none); use --device cpu or check the driver and CUDA_VISIBLE_DEVICES");
    arl_cuda_ctx *ctx = arl_cuda_current();
    if (!ctx) ARL_TRY(arl_cuda_default(&ctx));
    *out = arl_k_backend_cuda();
    return ARL_OK;
}

int32_t arl_cuda_local_device(void) {
    const int32_t n = arl_cuda_device_count();
    if (n <= 0) return -1;
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const long r = lr && *lr ? strtol(lr, NULL, 10) : 0;
    return (int32_t)((r < 0 ? 0 : r) % n);
}
