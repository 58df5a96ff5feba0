/* tests/cuda/test_nccl.c: NCCL gradient allreduce and weight broadcast, bootstrapped over MPI
 * (kernels/cuda/nccl.h): rank 0 creates the id, MPI_Bcast hands it to every rank.  Runs as
 * one process (a 1-rank communicator) under ctest, or under `mpirun -np N` with N GPUs
 * (rank r uses device r % count).  Exits 77 without a GPU or without NCCL.  Values are small
 * integers, so sums are exact. */
#include <mpi.h>

#include "kernels/cuda/nccl.h"
#include "tests/cuda/cuda_test.h"

int main(int argc, char **argv) {
    int ndev = arl_cuda_device_count();
    if (ndev == 0 || !arl_cuda_nccl_available()) { /* before MPI_Init: nothing to clean up */
        fprintf(stderr, "skip: needs a CUDA device and NCCL\n");
        return TEST_SKIP;
    }
    MPI_Init(&argc, &argv);
    int rank = 0, nranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (ndev < nranks) {
        fprintf(stderr, "skip: needs %d CUDA device(s) and NCCL\n", nranks);
        MPI_Finalize();
        return TEST_SKIP;
    }
    arl_cuda_config c;
    arl_cuda_config_defaults(&c);
    c.device = rank % ndev;
    c.arena_bytes = (size_t)64 << 20;
    if (arl_cuda_open(&c, &ct_ctx) != ARL_OK) ct_die("open");
    arl_cuda_make_current(ct_ctx);
    uint8_t id[ARL_CUDA_NCCL_ID_BYTES];
    if (rank == 0 && arl_cuda_nccl_unique_id(id) != ARL_OK) ct_die("unique id");
    MPI_Bcast(id, ARL_CUDA_NCCL_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
    arl_cuda_nccl *comm = NULL;
    if (arl_cuda_nccl_open(ct_ctx, id, rank, nranks, &comm) != ARL_OK) ct_die("nccl open");

    const int64_t n = 1000;
    float *h = ct_host(sizeof(float) * n), *want = ct_host(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        h[i] = (float)(rank + 1) * (float)(i % 17);
        want[i] = (float)(nranks * (nranks + 1) / 2) * (float)(i % 17);
    }
    float *d = ct_dev(h, n);
    CHECK(arl_cuda_nccl_allreduce_sum(comm, d, n) == ARL_OK);
    ct_check("allreduce sum", d, want, n, 0, 0);
    for (int64_t i = 0; i < n; i++) {
        h[i] = rank == 0 ? (float)i : -1.0f;
        want[i] = (float)i;
    }
    arl_cuda_upload(ct_ctx, d, h, sizeof(float) * n);
    CHECK(arl_cuda_nccl_broadcast(comm, d, n, 0) == ARL_OK);
    ct_check("broadcast", d, want, n, 0, 0);
    CHECK(arl_cuda_nccl_broadcast(comm, d, n, nranks) == ARL_ERR_ARG);
    arl_cuda_nccl_close(comm);
    arl_cuda_close(ct_ctx);
    free(h), free(want);
    int rc = test_finish();
    MPI_Finalize();
    return rc;
}
