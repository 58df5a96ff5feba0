/* kernels/cuda/moe_wgmma.cu: the grouped GEMM of bf16 operands with W (E, N, K) (the forward's
 * layout, kernels/cuda/ops.h arl_cuda_grouped_gemm_bf16 trans_w = 1) on Hopper's warpgroup
 * products (wgmma.mma_async), selected by arl_cuda_moe_tn_form (ops.h).  Built for sm_90a
 * alone (CMakeLists.txt: wgmma exists only in the architecture-specific target); on any other
 * device the kernel has no image and arl_cuda_moe_wgmma_available says 0.
 *
 * A block computes 64 rows (one plan tile of an expert) x 256 columns with two warpgroups, each
 * 64 x 128 as m64n128k16 products whose operands the tensor cores read from shared memory (no
 * fragments through registers, no ldmatrix: the mma.sync tile's 2 x 8 products per warp and 16
 * of K needed 2 A and 4 B ldmatrix.x4 each). K runs in slabs of 32 through a ring of 4 shared
 * stages filled by cp.async: while slab s is multiplied, slab s - 1's products may still run
 * (one group of products in flight) and slabs s + 1, s + 2 are being copied; a stage holds the
 * slab's 64 X rows then its 256 W_e rows as core matrices (8 rows x 16 bytes, 128 contiguous
 * bytes; internal.cuh arl_wg_desc), the four 16-byte chunks of an 8-row group side by side: LBO
 * 128, SBO 512. Each phase of 8 copying threads fills one core matrix (no bank conflict); a
 * warp's 32 copies read 8 rows x 64 contiguous bytes. Per slab: the copies' wait, the proxy
 * fence, one barrier, the copies of slab s + 2 (into the stage of slab s - 2, whose products
 * every warpgroup waited for before the barrier), two products per warpgroup, their commit, and
 * the wait for slab s - 1's. The fp32 results go from the accumulators to Y as the mma.sync
 * tile's do (moe_tiles.cuh warp_store). Rows past the expert's, columns past N and K past its
 * end are zero-filled by the copies. */
#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/moe_tiles.cuh"

#define WG_N 256    /* columns per block: two warpgroups of 128 */
#define WG_K 32     /* K per slab: two k16 products */
#define WG_STAGES 4 /* ring depth: slabs s - 1 (products may run), s, s + 1, s + 2 (copies) */
#define WG_AHEAD (WG_STAGES - 2) /* slabs copied ahead of the one multiplied */
#define WG_STAGE_BYTES ((BM + WG_N) * WG_K * 2)

/* byte offset of (row r, 16-byte chunk c of its K) in a stage: core matrix (r / 8, c) */
__device__ static inline uint32_t wg_off(int r, int c) {
    return (uint32_t)((((r >> 3) * (WG_K / 8) + c) << 7) + ((r & 7) << 4));
}

__global__ void __launch_bounds__(256, 2)
    k_grouped_bf16_wg(float *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                      arl_cuda_moe_plan P, int64_t N, int64_t K, float beta, int32_t ncol) {
#if defined(ARL_HAVE_WGMMA)
    extern __shared__ float sm[];
    unsigned char *raw = reinterpret_cast<unsigned char *>(sm);
    int32_t e, r0, nr;
    if (!tile_of(P, (int32_t)(blockIdx.x / (unsigned)ncol), &e, &r0, &nr)) return;
    const int64_t n0 = (int64_t)(blockIdx.x % (unsigned)ncol) * WG_N;
    const __nv_bfloat16 *We = W + (int64_t)e * N * K;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int64_t nslab = (K + WG_K - 1) / WG_K;
    /* slab s into stage s % WG_STAGES: 5 chunks of 16 bytes per thread; copy i takes row
     * (i % 8) + 8 (i / 32) and chunk (i / 8) % 4 (rows 0-63 X's, 64-319 W_e's) */
    auto load = [&](int64_t slab) {
        unsigned char *st = raw + (slab % WG_STAGES) * WG_STAGE_BYTES;
        const int64_t k0 = slab * WG_K;
#pragma unroll
        for (int q = 0; q < (BM + WG_N) * (WG_K / 8) / 256; q++) {
            const int i = threadIdx.x + q * 256, r = (i & 7) + ((i >> 5) << 3), c = (i >> 3) & 3;
            bool ok;
            const __nv_bfloat16 *src = tn_row_src(X, We, r0, nr, n0, N, K, r, k0 + c * 8, &ok);
            cp_async16(st + wg_off(r, c), src, ok);
        }
    };
    float acc[1][16][4] = {}; /* warp's 16 rows x the warpgroup's 128 columns */
    for (int s = 0; s < WG_AHEAD; s++) {
        if (s < nslab) load(s);
        cp_async_commit(); /* possibly empty: group s stands for slab s */
    }
    for (int64_t sl = 0; sl < nslab; sl++) {
        cp_async_wait_n<WG_AHEAD - 1>(); /* slab sl landed (this thread's copies) */
        arl_fence_proxy_async();          /* ... and is visible to the tensor cores' reads */
        /* everyone's copies of slab sl; and every warpgroup has waited for its products of
         * slab sl - 2 (the wait after slab sl - 1's), so their stage can be refilled */
        __syncthreads();
        if (sl + WG_AHEAD < nslab) load(sl + WG_AHEAD);
        cp_async_commit();
        const unsigned char *st = raw + (sl % WG_STAGES) * WG_STAGE_BYTES;
        arl_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < WG_K / 16; ks++) {
            const uint64_t da = arl_wg_desc(st + wg_off(0, 2 * ks), 128, 128 * (WG_K / 8));
            const uint64_t db =
                arl_wg_desc(st + wg_off(BM + 128 * wg, 2 * ks), 128, 128 * (WG_K / 8));
            arl_wgmma_m64n128k16(acc[0], da, db);
        }
        arl_wgmma_commit();
        arl_wgmma_wait<1>(); /* slab sl - 1's products are done; slab sl's may still run */
    }
    arl_wgmma_wait<0>();
    cp_async_wait_n<0>(); /* no copy outlives the block (the trailing groups are empty) */
    warp_store<16, 1>(Y + (int64_t)r0 * N + n0, N, nr, N - n0, beta, acc, 16 * warp, 128 * wg);
#else
    __trap(); /* no image of this kernel for a device without wgmma runs (the caller checks) */
#endif
}

extern "C" int32_t arl_cuda_moe_wgmma_available(void) {
#if defined(__CUDACC__) && !defined(ARL_WGMMA_SM90A)
    return 0; /* not built for sm_90a (nvcc before 12.0): the kernel is a trap */
#endif
    cudaFuncAttributes a;
    const int ok = cudaFuncGetAttributes(&a, k_grouped_bf16_wg) == cudaSuccess;
    (void)cudaGetLastError(); /* a missing image is an answer, not an error to keep */
    return ok;
}

void arl_cuda_grouped_bf16_wg_launch(float *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                                     const arl_cuda_moe_plan *plan, int64_t N, int64_t K,
                                     float beta, arl_cuda_ctx *c) {
    constexpr int smem = WG_STAGES * WG_STAGE_BYTES;
    const unsigned ncol = (unsigned)((N + WG_N - 1) / WG_N);
    cudaFuncSetAttribute(k_grouped_bf16_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k_grouped_bf16_wg<<<max_row_tiles(plan) * ncol, 256, smem, c->stream>>>(Y, X, W, *plan, N, K,
                                                                           beta, (int32_t)ncol);
}
