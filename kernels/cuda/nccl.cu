/* kernels/cuda/nccl.cu: NCCL communicator, allreduce and broadcast (kernels/cuda/nccl.h).
 * Compiled with NCCL when the build found it (ARL_HAVE_NCCL), else as stubs that report
 * ARL_ERR_UNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/nccl.h"

#ifdef ARL_HAVE_NCCL
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == ARL_CUDA_NCCL_ID_BYTES, "ncclUniqueId size changed");

struct arl_cuda_nccl {
    ncclComm_t comm;
    arl_cuda_ctx *ctx;
    int32_t rank, nranks;
};

static arl_status nccl_status(const char *op, ncclResult_t r) {
    if (r == ncclSuccess) return ARL_OK;
    return arl_errorf(ARL_ERR_DEVICE, "nccl: %s: %s", op, ncclGetErrorString(r));
}

extern "C" int32_t arl_cuda_nccl_available(void) {
    return 1;
}

extern "C" arl_status arl_cuda_nccl_unique_id(uint8_t id[ARL_CUDA_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    ARL_TRY(nccl_status("ncclGetUniqueId", ncclGetUniqueId(&u)));
    memcpy(id, &u, sizeof u);
    return ARL_OK;
}

extern "C" arl_status arl_cuda_nccl_open(arl_cuda_ctx *ctx,
                                         const uint8_t id[ARL_CUDA_NCCL_ID_BYTES], int32_t rank,
                                         int32_t nranks, arl_cuda_nccl **out) {
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return arl_errorf(ARL_ERR_ARG, "nccl: rank %d of %d is not valid", (int)rank, (int)nranks);
    arl_cuda_nccl *c = (arl_cuda_nccl *)calloc(1, sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "nccl: out of host memory");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    arl_status s = arl_cuda_status("cudaSetDevice", cudaSetDevice(ctx->device));
    if (s == ARL_OK)
        s = nccl_status("ncclCommInitRank", ncclCommInitRank(&c->comm, nranks, u, rank));
    if (s != ARL_OK) {
        free(c);
        return arl_error_prefix(s, "nccl: joining as rank %d of %d on device %d", (int)rank,
                                (int)nranks, (int)ctx->device);
    }
    c->ctx = ctx;
    c->rank = rank;
    c->nranks = nranks;
    *out = c;
    return ARL_OK;
}

extern "C" void arl_cuda_nccl_close(arl_cuda_nccl *c) {
    if (!c) return;
    ncclCommDestroy(c->comm);
    free(c);
}

extern "C" arl_status arl_cuda_nccl_allreduce_sum(arl_cuda_nccl *c, float *buf, int64_t n) {
    if (n == 0) return ARL_OK;
    return nccl_status("ncclAllReduce", ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum,
                                                      c->comm, c->ctx->stream));
}

extern "C" arl_status arl_cuda_nccl_broadcast(arl_cuda_nccl *c, float *buf, int64_t n,
                                              int32_t root) {
    if (n == 0) return ARL_OK;
    if (root < 0 || root >= c->nranks)
        return arl_errorf(ARL_ERR_ARG, "nccl: broadcast root %d outside [0, %d)", (int)root,
                          (int)c->nranks);
    return nccl_status("ncclBroadcast", ncclBroadcast(buf, buf, (size_t)n, ncclFloat32, root,
                                                      c->comm, c->ctx->stream));
}

#else /* no NCCL in this build */

static arl_status no_nccl(void) {
    return arl_errorf(ARL_ERR_UNSUPPORTED,
                      "nccl: this build has no NCCL (nccl.h or libnccl was not found when it was "
                      "configured); multi-GPU training needs it");
}
extern "C" int32_t arl_cuda_nccl_available(void) {
    return 0;
}
extern "C" arl_status arl_cuda_nccl_unique_id(uint8_t id[ARL_CUDA_NCCL_ID_BYTES]) {
    return no_nccl();
}
extern "C" arl_status arl_cuda_nccl_open(arl_cuda_ctx *ctx,
                                         const uint8_t id[ARL_CUDA_NCCL_ID_BYTES], int32_t rank,
                                         int32_t nranks, arl_cuda_nccl **out) {
    *out = NULL;
    return no_nccl();
}
extern "C" void arl_cuda_nccl_close(arl_cuda_nccl *c) {}
extern "C" arl_status arl_cuda_nccl_allreduce_sum(arl_cuda_nccl *c, float *buf, int64_t n) {
    return no_nccl();
}
extern "C" arl_status arl_cuda_nccl_broadcast(arl_cuda_nccl *c, float *buf, int64_t n,
                                              int32_t root) {
    return no_nccl();
}
#endif
