/* kernels/cuda/nccl.h: NCCL collectives between GPU ranks - gradient allreduce and weight
 * broadcast - for learner/ (spec: DESIGN.md section 5).
 *
 * It is: a communicator over the calling process's current CUDA context (its device and
 * stream), fp32 sum-allreduce and broadcast of device buffers.  It is not: MPI.  kernels/
 * knows nothing of MPI, so the bootstrap is split: rank 0 calls arl_cuda_nccl_unique_id, the
 * caller (learner/dist.c) broadcasts the ARL_CUDA_NCCL_ID_BYTES bytes over MPI, e.g.
 *     uint8_t id[ARL_CUDA_NCCL_ID_BYTES];
 *     if (rank == 0) ARL_TRY(arl_cuda_nccl_unique_id(id));
 *     MPI_Bcast(id, ARL_CUDA_NCCL_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
 *     ARL_TRY(arl_cuda_nccl_open(ctx, id, rank, nranks, &comm));
 * and every rank calls arl_cuda_nccl_open with the same id (a collective call).
 * In a build without NCCL (or without CUDA) every function returns ARL_ERR_UNSUPPORTED.
 * Ownership: *comm belongs to the caller until arl_cuda_nccl_close (NULL-safe).  Collectives
 * are enqueued on the context's stream (arl_cuda_sync waits for them).
 */
#ifndef ARL_KERNELS_CUDA_NCCL_H
#define ARL_KERNELS_CUDA_NCCL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h"
#include "kernels/cuda/cuda.h"

#define ARL_CUDA_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct arl_cuda_nccl arl_cuda_nccl;

/* 1 when this build has NCCL, else 0. */
int32_t arl_cuda_nccl_available(void);

/* A fresh unique id (rank 0 only), to be broadcast to every rank. */
arl_status arl_cuda_nccl_unique_id(uint8_t id[ARL_CUDA_NCCL_ID_BYTES]);

/* Joins the communicator of `nranks` ranks identified by id, as `rank`, on ctx's device. */
arl_status arl_cuda_nccl_open(arl_cuda_ctx *ctx, const uint8_t id[ARL_CUDA_NCCL_ID_BYTES],
                              int32_t rank, int32_t nranks, arl_cuda_nccl **comm);
void arl_cuda_nccl_close(arl_cuda_nccl *comm);

/* buf (n) fp32 on the device = sum over ranks of buf (in place): the gradient allreduce.
 * Divide by nranks afterwards for a mean (arl_cuda_backend()->scale). */
arl_status arl_cuda_nccl_allreduce_sum(arl_cuda_nccl *comm, float *buf, int64_t n);

/* buf (n) fp32 on the device of every rank = buf of rank root: the weight broadcast. */
arl_status arl_cuda_nccl_broadcast(arl_cuda_nccl *comm, float *buf, int64_t n, int32_t root);

#ifdef __cplusplus
}
#endif

#endif
