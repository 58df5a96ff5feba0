/* kernels/cuda/moe_tiles.cuh: what the grouped GEMM kernels (kernels/cuda/moe.cu on mma.sync,
 * kernels/cuda/moe_wgmma.cu on wgmma) share: the plan's row tiles of BM rows (an expert's
 * sorted rows cut into tiles, arl_cuda_moe_plan tiles) and the store of fp32 accumulators in
 * the m16n8 C layout. */
#ifndef ARL_KERNELS_CUDA_MOE_TILES_CUH
#define ARL_KERNELS_CUDA_MOE_TILES_CUH

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

#define BM 64 /* grouped GEMM row tile (also the plan's tile unit) */

/* Row tile -> (expert, first row, rows): binary search of the tile prefix sums. */
__device__ static inline bool tile_of(const arl_cuda_moe_plan P, int32_t tile, int32_t *e,
                                      int32_t *r0, int32_t *nr) {
    if (tile >= P.tiles[P.E]) return false;
    int32_t lo = 0, hi = (int32_t)P.E - 1;
    while (lo < hi) { /* largest e with tiles[e] <= tile (and a non-empty expert) */
        int32_t mid = (lo + hi + 1) / 2;
        if (P.tiles[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    /* the largest such e has tiles[e + 1] > tile, so it is never an empty expert */
    *e = lo;
    int32_t j = tile - P.tiles[lo];
    *r0 = P.offsets[lo] + j * BM;
    int32_t end = P.offsets[lo + 1];
    *nr = end - *r0 < BM ? end - *r0 : BM;
    return true;
}

/* Blocks enough for every row tile of the plan whatever the routing: ceil(T k / BM) + E. */
static inline unsigned max_row_tiles(const arl_cuda_moe_plan *P) {
    return (unsigned)((P->T * P->k + BM - 1) / BM + P->E);
}

/* The 8 bf16 at column k of row r of a W (E, N, K) tile's stage (trans_w = 1): rows 0..BM-1
 * are the plan tile's X rows r0 + r (nr of them), rows BM.. are W_e's rows n0 + r - BM; *ok = 0
 * past the expert's rows, N or K (the copy then zero-fills; the address stays valid). */
__device__ static inline const __nv_bfloat16 *tn_row_src(const __nv_bfloat16 *X,
                                                         const __nv_bfloat16 *We, int32_t r0,
                                                         int32_t nr, int64_t n0, int64_t N,
                                                         int64_t K, int r, int64_t k, bool *ok) {
    if (r < BM) {
        *ok = r < nr && k < K;
        return X + (int64_t)(r0 + (*ok ? r : 0)) * K + (*ok ? k : 0);
    }
    const int64_t n = n0 + (r - BM);
    *ok = n < N && k < K;
    return We + (*ok ? n * K + k : 0);
}

/* The multistage cp.async ring of a tile kernel: slab s (of nslab) is copied by load(s) into
 * stage s % S, S - 1 slabs ahead of the one multiplied; compute(stage) runs once the slab has
 * landed and the block's barrier has made everyone's copies visible (that barrier also ends
 * every warp's reads of the stage the next copies refill).  Returns with no copy in flight. */
template <int S, class LOAD, class COMPUTE>
__device__ static inline void cp_ring(int64_t nslab, LOAD &&load, COMPUTE &&compute) {
    for (int s = 0; s < S - 1; s++) {
        if (s < nslab) load(s);
        cp_async_commit(); /* possibly empty: group s stands for slab s */
    }
    for (int64_t sl = 0; sl < nslab; sl++) {
        cp_async_wait_n<S - 2>(); /* slab sl landed (this thread's copies) */
        __syncthreads();          /* everyone's; and stage (sl - 1) % S is read by no one */
        if (sl + S - 1 < nslab) load(sl + S - 1);
        cp_async_commit();
        compute((int)(sl % S));
    }
    cp_async_wait_n<0>(); /* the trailing groups are empty */
}

/* Every pair of adjacent columns a lane holds among a warp's (16 MI) x (8 NJ) fp32
 * accumulators (m16 tile i, n8 tile j; internal.cuh arl_mma_bf16's C layout, which wgmma's is
 * too), placed at (row0, col0) of the output tile: f(row, col, v0, v1) with the values of
 * (row, col) and (row, col + 1), col even.  The one walk of the fragment layout: every epilogue
 * (warp_store, the GLU tiles' of moe.cu) goes through it. */
template <int NJ, int MI, class F>
__device__ static inline void warp_pairs(const float (&acc)[MI][NJ][4], int row0, int col0, F &&f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NJ; j++)
                f(row0 + i * 16 + g + 8 * h, col0 + j * 8 + 2 * t, acc[i][j][2 * h],
                  acc[i][j][2 * h + 1]);
}

/* A warp's accumulators (warp_pairs') at (row0, col0) of the output tile out (leading
 * dimension ld), the rows below rows_ok and columns below cols_ok (even): out = acc + beta out
 * (beta 0: out is not read).  Each quad of lanes writes one 32-byte sector per row. */
template <int NJ, int MI = 2>
__device__ static inline void warp_store(float *out, int64_t ld, int64_t rows_ok, int64_t cols_ok,
                                         float beta, const float (&acc)[MI][NJ][4], int row0,
                                         int col0) {
    warp_pairs(acc, row0, col0, [&](int row, int col, float v0, float v1) {
        if (row < rows_ok && col < cols_ok) {
            float *y = out + (int64_t)row * ld + col;
            float2 v = make_float2(v0, v1);
            if (beta != 0.0f) {
                const float2 o = *reinterpret_cast<const float2 *>(y);
                v.x += beta * o.x;
                v.y += beta * o.y;
            }
            *reinterpret_cast<float2 *>(y) = v;
        }
    });
}

/* kernels/cuda/moe_wgmma.cu: the grouped GEMM of arl_cuda_grouped_gemm_bf16 (trans_w = 1) on
 * wgmma, launched on c's stream (the caller checked arl_cuda_moe_wgmma_available). */
void arl_cuda_grouped_bf16_wg_launch(float *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                                     const arl_cuda_moe_plan *plan, int64_t N, int64_t K,
                                     float beta, arl_cuda_ctx *c);

#endif
