/* kernels/cuda/internal.cuh: what the .cu files of the CUDA backend share - the context
 * struct, error recording, launch helpers, warp/block reductions.  Not a public header. */
#ifndef ARL_KERNELS_CUDA_INTERNAL_CUH
#define ARL_KERNELS_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

extern "C" {
#include "core/assert.h"
}

/* Internal part of the arena (carved off first at open). */
#define ARL_CUDA_PARTIALS (1 << 17)           /* doubles for two-pass reductions */
#define ARL_CUDA_INDEX_INTS (1 << 18)         /* int32 index tables (KDA chunk maps) */
#define ARL_CUDA_CUBLAS_WS ((size_t)32 << 20) /* cuBLAS workspace */

/* Device error word: code (arl_status) and one integer of detail (a token index, ...). */
typedef struct arl_cuda_errword {
    int32_t code;
    int32_t detail;
} arl_cuda_errword;

struct arl_cuda_ctx {
    int32_t device;
    cudaStream_t stream;
    cublasHandle_t blas;
    arl_cuda_math math;
    char *arena; /* the one cudaMalloc */
    size_t arena_bytes;
    size_t user_base;      /* first byte handed out by arl_cuda_alloc */
    size_t top;            /* bump pointer (offset) */
    double *partials;      /* (ARL_CUDA_PARTIALS) reduction partials */
    int32_t *index;        /* (ARL_CUDA_INDEX_INTS) index tables */
    arl_cuda_errword *err; /* device error word */
    void *blas_ws;
    arl_status sticky; /* first failed launch / cuBLAS call of a void entry */
    char sticky_msg[256];
    cudaEvent_t ev0, ev1;
    struct arl_cuda_prof *prof; /* per-op profile (arl_cuda_profile_begin), or NULL */
    int32_t kda_prep;           /* ARL_CUDA_KDA_PREP_* of the chunkwise KDA's kernel 1 */
    int32_t mla_fwd_rows;       /* ARL_CUDA_MLA_FWD_ROWS* of the MLA forward on tensor cores */
    int32_t moe_tn;             /* ARL_CUDA_MOE_TN_* of the bf16 grouped GEMM (trans_w = 1) */
    int32_t mla_split_keys;     /* keys a split of the absorbed attention at least (0: default) */
    int32_t spt_window;         /* chunks a sort window of the sparse backward (0: default) */
};

/* Current context of the thread; asserts one exists (programmer error otherwise). */
arl_cuda_ctx *arl_cuda_need(void);

/* A kernel variant setting of the current context (kda_prep, mla_fwd_rows, moe_tn): sets *slot to v
 * and returns what it was (the benchmark's and the parity tests' switch). */
static inline int32_t arl_cuda_swap_setting(int32_t *slot, int32_t v) {
    const int32_t was = *slot;
    *slot = v;
    return was;
}

/* Record the first failure of a void entry point (kept until arl_cuda_sync). */
void arl_cuda_record(arl_cuda_ctx *ctx, const char *op, cudaError_t e);
void arl_cuda_record_blas(arl_cuda_ctx *ctx, const char *op, cublasStatus_t s);

/* Status from a CUDA error (ARL_OK for cudaSuccess), with the op named in the message. */
arl_status arl_cuda_status(const char *op, cudaError_t e);
arl_status arl_cuda_blas_status(const char *op, cublasStatus_t s);

/* After a launch in a void entry: record a launch failure. */
#define ARL_CUDA_LAUNCHED(ctx, op) arl_cuda_record((ctx), (op), cudaGetLastError())
/* After a launch in a status entry: return a launch failure. */
#define ARL_CUDA_TRY_LAUNCH(op)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = cudaGetLastError();                                                       \
        if (e_ != cudaSuccess) return arl_cuda_status((op), e_);                                   \
    } while (0)

/* Set the device error word (first error wins). */
__device__ static inline void arl_dev_error(arl_cuda_errword *err, int32_t code, int32_t detail) {
    if (atomicCAS(&err->code, 0, code) == 0) err->detail = detail;
}

static inline unsigned arl_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535LL * 32) b = 65535LL * 32; /* grid-stride loops cover the rest */
    return (unsigned)(b < 1 ? 1 : b);
}

/* Blocks of 256 threads for a kernel that takes a warp a row over n rows (rows strided over
 * the grid's warps beyond 65535 blocks). */
static inline unsigned arl_warp_row_blocks(int64_t n) {
    int64_t b = (n + 7) / 8;
    return (unsigned)(b > 65535 ? 65535 : b < 1 ? 1 : b);
}

#define ARL_GRID_STRIDE(i, n)                                                                      \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

/* Deterministic column sums (the weight gradients of row-wise ops): for each column col <
 * ncol, out(col, sum over rows r < nrow of f(r, col)) with f returning a double.  Blocks of 32
 * columns and ARL_COLSUM_LANES row lanes; the rows are cut into S consecutive spans
 * (colsum_splits: from the shape alone) so that narrow sums (a norm's d columns) still fill the
 * GPU.  In a span each lane walks rows lane, lane + LANES, ... in order and the lanes' sums are
 * added in lane order; with S > 1 each span's sums go to ctx->partials and a second kernel adds
 * the S of a column in span order.  The same result every run and on every device (no
 * atomics).  F and G are functor types with `__device__ double operator()(int64_t r, int64_t col)
 * const` and `__device__ void operator()(int64_t col, double sum) const`. */
#define ARL_COLSUM_LANES 16
#define ARL_COLSUM_BLOCKS 264 /* blocks a sum aims at: two an SM of a 132-SM H100 / H200 */
template <class F, class G>
__global__ void __launch_bounds__(32 * ARL_COLSUM_LANES)
    k_colsum(int64_t nrow, int64_t ncol, int64_t span, F f, G out, double *part) {
    __shared__ double sh[ARL_COLSUM_LANES][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t col = (int64_t)blockIdx.x * 32 + tx, r0 = (int64_t)blockIdx.y * span;
    const int64_t r1 = nrow - r0 < span ? nrow : r0 + span;
    double acc = 0.0;
    if (col < ncol)
#pragma unroll 4 /* the loads of four rows in flight at once; the sum's order is unchanged */
        for (int64_t r = r0 + ty; r < r1; r += ARL_COLSUM_LANES)
            acc += f(r, col);
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col < ncol) {
        double sum = 0.0;
        for (int l = 0; l < ARL_COLSUM_LANES; l++)
            sum += sh[l][tx];
        if (part)
            part[blockIdx.y * ncol + col] = sum;
        else
            out(col, sum);
    }
}
template <class G>
__global__ void k_colsum_spans(int64_t ncol, int64_t nspan, const double *part, G out) {
    ARL_GRID_STRIDE(col, ncol) {
        double sum = 0.0;
        for (int64_t y = 0; y < nspan; y++)
            sum += part[y * ncol + col];
        out(col, sum);
    }
}
/* The spans of a column sum: enough blocks for ARL_COLSUM_BLOCKS, at least 4 rows a lane in
 * each, the partial sums within ARL_CUDA_PARTIALS. */
static inline int64_t colsum_splits(int64_t nrow, int64_t ncol) {
    const int64_t nb = (ncol + 31) / 32;
    int64_t S = (ARL_COLSUM_BLOCKS + nb - 1) / nb;
    if (S > nrow / (4 * ARL_COLSUM_LANES)) S = nrow / (4 * ARL_COLSUM_LANES);
    if (S > ARL_CUDA_PARTIALS / ncol) S = ARL_CUDA_PARTIALS / ncol;
    return S < 1 ? 1 : S;
}
template <class F, class G>
static inline void arl_colsum(arl_cuda_ctx *c, int64_t nrow, int64_t ncol, F f, G out) {
    if (ncol <= 0) return;
    const int64_t S = colsum_splits(nrow, ncol), span = S > 1 ? (nrow + S - 1) / S : nrow;
    const dim3 grid((unsigned)((ncol + 31) / 32), (unsigned)S);
    k_colsum<F, G><<<grid, 32 * ARL_COLSUM_LANES, 0, c->stream>>>(nrow, ncol, span, f, out,
                                                                  S > 1 ? c->partials : NULL);
    if (S > 1)
        k_colsum_spans<G><<<arl_blocks(ncol, 256), 256, 0, c->stream>>>(ncol, S, c->partials, out);
}
/* out functor: dst[col] += (float)sum */
struct arl_colsum_add {
    float *dst;
    __device__ void operator()(int64_t col, double sum) const {
        dst[col] += (float)sum;
    }
};

/* Document of token t: the largest i with cu[i] <= t (binary search); cu NULL: document 0. */
__device__ static inline int32_t arl_doc_of(const int32_t *cu, int32_t N, int64_t t) {
    if (!cu) return 0;
    int32_t lo = 0, hi = N - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* 1 if a GEMM's sizes and leading dimensions all fit cuBLAS's int arguments (a product at
 * the full-scale shapes has M = T up to 2^20: fine; the check keeps a larger one from being
 * truncated silently) */
static inline bool arl_blas_dims_ok(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                    int64_t ldc) {
    return M >= 0 && N >= 0 && K >= 0 && M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX &&
           lda >= 0 && ldb >= 0 && ldc >= 0 && lda <= INT32_MAX && ldb <= INT32_MAX &&
           ldc <= INT32_MAX;
}

__device__ static inline double arl_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* The bits of x rounded to bf16, nearest even (NaN stays NaN): every fp32 -> bf16 copy of
 * weights and activations (arl_cuda_f32_to_bf16, the MoE gathers, AdamW's refresh of the bf16
 * weights) rounds through this one function, so their copies agree bit for bit. */
__device__ static inline uint32_t arl_bf16_rn_bits(float x) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t *>(&b);
}
/* x and y rounded so (arl_bf16_rn_bits), packed as a pair of bf16 in memory order: x at the
 * lower address (one 32-bit store of two adjacent elements) */
__device__ static inline uint32_t arl_bf16x2_rn_bits(float x, float y) {
    return arl_bf16_rn_bits(x) | (arl_bf16_rn_bits(y) << 16);
}

__device__ static inline float arl_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static inline float arl_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Asynchronous copies global -> shared (sm_80+ cp.async): 16 bytes (both 16-aligned) or 4
 * bytes; ok = 0 fills the destination with zeros and reads nothing (gmem must still be a valid
 * address).  A thread's copies since the last commit form a group; wait_group N returns when at
 * most the N newest groups are in flight (then a barrier makes them visible to the block).
 * The CPU emulator (tests/cuda/emu) copies at once, or with EMU_CP_ASYNC=defer at the wait
 * that retires the copy's group (uncommitted copies wait for a later group, as in PTX). */
__device__ static inline void cp_async16(void *smem, const void *gmem, bool ok) {
#if defined(__CUDACC__)
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem),
                 "r"(ok ? 16 : 0));
#else
    emu_cp_async(smem, gmem, 16, ok);
#endif
}
__device__ static inline void cp_async4(float *smem, const float *gmem, bool ok) {
#if defined(__CUDACC__)
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(gmem),
                 "r"(ok ? 4 : 0));
#else
    emu_cp_async(smem, gmem, 4, ok);
#endif
}
__device__ static inline void cp_async_commit(void) {
#if defined(__CUDACC__)
    asm volatile("cp.async.commit_group;\n" ::);
#else
    emu_cp_commit();
#endif
}

/* all but the N newest groups landed (N a constant: the ring of a multistage pipeline) */
template <int N> __device__ static inline void cp_async_wait_n(void) {
#if defined(__CUDACC__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#else
    emu_cp_wait(N);
#endif
}
__device__ static inline void cp_async_wait1(void) { /* all but the newest group landed */
    cp_async_wait_n<1>();
}
__device__ static inline void cp_async_wait0(void) { /* every group landed */
    cp_async_wait_n<0>();
}

/* ---- bf16 tensor-core products (sm_80+ mma.sync m16n8k16, fp32 accumulators) ----
 * Fragment layout (PTX ISA, g = lane / 4, t = lane % 4): A regs {a0..a3} hold (row g, cols
 * 2t..2t+1), (row g+8, same), (row g, cols 2t+8..), (row g+8, cols 2t+8..); B regs {b0, b1}
 * hold (k 2t..2t+1, col g), (k 2t+8.., col g); C {c0..c3} hold (row g, cols 2t, 2t+1) and
 * (row g+8, cols 2t, 2t+1).  The CPU emulator gathers the same product from the lanes' fragments,
 * exchanged in one step (tests/cuda/emu/emu_cuda.h emu_warp_post). */
#if defined(__CUDACC__)
__device__ static inline void arl_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8 x 8 bf16 matrices from shared memory (ldmatrix.x4): lanes 8i..8i+7 give the 16-byte
 * rows of matrix i (row = lane % 8); r[i] receives matrix i's (row lane / 4, cols 2 (lane % 4)
 * and + 1), an A or B fragment register as above. */
__device__ static inline void arl_ldmatrix_x4(uint32_t r[4], const void *row) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa));
}
/* The same with each matrix transposed (ldmatrix.x4.trans): r[i] receives matrix i's (rows
 * 2 (lane % 4) and + 1, col lane / 4): a fragment of an operand stored the other way round. */
__device__ static inline void arl_ldmatrix_x4_trans(uint32_t r[4], const void *row) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa));
}
#else
static inline float arl_bf16_lo(uint32_t x) {
    return __uint_as_float(x << 16);
}
static inline float arl_bf16_hi(uint32_t x) {
    return __uint_as_float(x & 0xffff0000u);
}
static inline void arl_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint64_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const uint64_t(*all)[EMU_POST_MAX] = emu_warp_post(mine, 6); /* every lane's fragments */
    for (int tt = 0; tt < 4; tt++) {
        const uint64_t *ar = all[4 * g + tt];
        const uint32_t a0 = (uint32_t)ar[0], a1 = (uint32_t)ar[1], a2 = (uint32_t)ar[2],
                       a3 = (uint32_t)ar[3];
        for (int j = 0; j < 2; j++) {
            const uint64_t *br = all[4 * (2 * t + j) + tt];
            const uint32_t x0 = (uint32_t)br[4], x1 = (uint32_t)br[5];
            c[j] += arl_bf16_lo(a0) * arl_bf16_lo(x0) + arl_bf16_hi(a0) * arl_bf16_hi(x0) +
                    arl_bf16_lo(a2) * arl_bf16_lo(x1) + arl_bf16_hi(a2) * arl_bf16_hi(x1);
            c[2 + j] += arl_bf16_lo(a1) * arl_bf16_lo(x0) + arl_bf16_hi(a1) * arl_bf16_hi(x0) +
                        arl_bf16_lo(a3) * arl_bf16_lo(x1) + arl_bf16_hi(a3) * arl_bf16_hi(x1);
        }
    }
    emu_warp_release();
}
/* the lanes' row addresses, exchanged once (emu_warp_post) */
static inline void arl_ldmatrix_x4(uint32_t r[4], const void *row) {
    const int lane = threadIdx.x & 31;
    const uint64_t mine = (uint64_t)(uintptr_t)row;
    const uint64_t(*all)[EMU_POST_MAX] = emu_warp_post(&mine, 1);
    for (int i = 0; i < 4; i++) {
        const unsigned char *src = (const unsigned char *)(uintptr_t)all[8 * i + lane / 4][0];
        memcpy(&r[i], src + 4 * (lane % 4), 4);
    }
    emu_warp_release();
}
static inline void arl_ldmatrix_x4_trans(uint32_t r[4], const void *row) {
    const int lane = threadIdx.x & 31;
    const uint64_t mine = (uint64_t)(uintptr_t)row;
    const uint64_t(*all)[EMU_POST_MAX] = emu_warp_post(&mine, 1);
    for (int i = 0; i < 4; i++) {
        const unsigned char *p0 = (const unsigned char *)(uintptr_t)all[8 * i + 2 * (lane % 4)][0];
        const unsigned char *p1 =
            (const unsigned char *)(uintptr_t)all[8 * i + 2 * (lane % 4) + 1][0];
        uint16_t lo, hi;
        memcpy(&lo, p0 + 2 * (lane / 4), 2);
        memcpy(&hi, p1 + 2 * (lane / 4), 2);
        r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    emu_warp_release();
}
#endif

/* Which 16-byte row of a 16 x 16 bf16 block a lane hands to ldmatrix.x4: the block's row
 * (0-15) and the row's chunk (0: columns 0-7, 1: columns 8-15).  Two maps serve every operand:
 *   map A (row lane % 16, chunk lane / 16): plain, the A fragment of a row-major (m, k)
 *     block; .trans, the B fragments of two n8 tiles of a (k, n) block (k rows);
 *   map B (row lane % 8 + 8 (lane / 16), chunk lane / 8 % 2): plain, the B fragments of two
 *     n8 tiles of an (n, k) block (n rows); .trans, the A fragment of a (k, m) block.
 * The two n8 tiles' fragments come as {r[0], r[1]} and {r[2], r[3]}. */
__device__ static inline int arl_ldm_row_a(int lane) {
    return lane & 15;
}
__device__ static inline int arl_ldm_chunk_a(int lane) {
    return lane >> 4;
}
__device__ static inline int arl_ldm_row_b(int lane) {
    return (lane & 7) + ((lane >> 4) << 3);
}
__device__ static inline int arl_ldm_chunk_b(int lane) {
    return (lane >> 3) & 1;
}

/* acc[i][j] += a[i] b[j]: a warp's I x J tiles of m16n8k16 products on fragments in registers
 * (b[j] = {b0, b1} of n8 tile j) */
template <int I, int J>
__device__ static inline void arl_mma_tiles(float (&acc)[I][J][4], const uint32_t (&a)[I][4],
                                            const uint32_t (&b)[J][2]) {
#pragma unroll
    for (int i = 0; i < I; i++)
#pragma unroll
        for (int j = 0; j < J; j++)
            arl_mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
}

/* n8 tiles 2 jp and 2 jp + 1 of b from one ldmatrix.x4 (TRANS: .trans) of the lane's row */
template <bool TRANS, int J>
__device__ static inline void arl_ldm_b_pair(uint32_t (&b)[J][2], int jp, const void *row) {
    uint32_t t[4];
    if (TRANS)
        arl_ldmatrix_x4_trans(t, row);
    else
        arl_ldmatrix_x4(t, row);
    b[2 * jp][0] = t[0];
    b[2 * jp][1] = t[1];
    b[2 * jp + 1][0] = t[2];
    b[2 * jp + 1][1] = t[3];
}

/* ---- Hopper warpgroup products (wgmma.mma_async, sm_90a only; kernels/cuda/moe_wgmma.cu) ----
 * A warpgroup (4 consecutive warps, 128 threads) computes D (64 x N) += A (64 x 16) B^T with A
 * and B (N x 16) read from shared memory by the tensor cores, through matrix descriptors.  Both
 * operands here are "K-major" (rows of k) and unswizzled: stored as core matrices of 8 rows x
 * 16 bytes (8 bf16 of k), each core matrix 128 contiguous bytes (row i of it at 16 i).  The
 * descriptor holds the start address, LBO (bytes from one core matrix to the next along k)
 * and SBO (bytes from one 8-row group to the next), each >> 4 (PTX ISA, "matrix descriptor").
 * D's fragment (fp32): thread t of the warpgroup, warp w = t / 32, g = lane / 4, q = lane % 4,
 * holds d[j][0..1] = D(16 w + g, 8 j + 2 q + 0..1) and d[j][2..3] = D(16 w + g + 8, same): the
 * m16n8 C layout of arl_mma_bf16 for warp w's 16 rows, n8 tile j.  wgmma reads its operands
 * asynchronously: arl_wgmma_fence before the first product of a batch (the accumulators were
 * written by other instructions), commit, then wait before the accumulators are read or the
 * operands' shared memory is written again; shared memory written by the threads (cp.async
 * included: the generic proxy) is made visible to the tensor cores' reads (the async proxy) by
 * arl_fence_proxy_async in each writer, then a barrier.  The CPU emulator computes each
 * thread's fragment from the shared bytes the descriptors name (no swizzle), at the product
 * or, with EMU_WGMMA=defer, at the wait that retires it (tests/cuda/emu/emu_cuda.h). */
__device__ static inline uint32_t arl_smem_addr(const void *p) {
#if defined(__CUDACC__)
    return (uint32_t)__cvta_generic_to_shared(p);
#else
    return (uint32_t)((const unsigned char *)p - (const unsigned char *)emu_sm());
#endif
}
__device__ static inline uint64_t arl_wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((arl_smem_addr(smem) >> 4) & 0x3fffu) |
           ((uint64_t)((lbo >> 4) & 0x3fffu) << 16) | ((uint64_t)((sbo >> 4) & 0x3fffu) << 32);
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ARL_HAVE_WGMMA 1
__device__ static inline void arl_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ static inline void arl_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ static inline void arl_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ static inline void arl_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* d (64 x 128 over the warpgroup) += A B^T, A and B K-major bf16 in shared memory */
__device__ static inline void arl_wgmma_m64n128k16(float (&d)[16][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),
          "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),
          "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),
          "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),
          "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db), "r"(1));
}
#elif !defined(__CUDACC__)
#define ARL_HAVE_WGMMA 1
static inline void arl_wgmma_fence(void) {}
static inline void arl_wgmma_commit(void) {
    emu_wgmma_commit();
}
template <int N> static inline void arl_wgmma_wait(void) {
    emu_wgmma_wait(N);
}
static inline void arl_fence_proxy_async(void) {}
/* one bf16 of a K-major unswizzled operand: row r, column k */
static inline float arl_wg_at(const unsigned char *sm, uint64_t desc, int r, int k) {
    const uint32_t start = (uint32_t)(desc & 0x3fffu) << 4;
    const uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fffu) << 4;
    const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fffu) << 4;
    uint16_t v;
    memcpy(&v, sm + start + (r >> 3) * sbo + (k >> 3) * lbo + (r & 7) * 16 + (k & 7) * 2, 2);
    return __uint_as_float((uint32_t)v << 16);
}
static inline void arl_wgmma_m64n128k16(float (&d)[16][4], uint64_t da, uint64_t db) {
    if ((da | db) >> 46) abort(); /* base offset or swizzle: not emulated */
    const unsigned char *sm = (const unsigned char *)emu_sm();
    const int tw = threadIdx.x & 127, w = tw >> 5, g = (tw & 31) >> 2, q = tw & 3;
    emu_wgmma_issue([&d, da, db, sm, w, g, q] {
        for (int j = 0; j < 16; j++)
            for (int e = 0; e < 4; e++) {
                const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
                float s = 0.0f;
                for (int k = 0; k < 16; k++)
                    s += arl_wg_at(sm, da, row, k) * arl_wg_at(sm, db, col, k);
                d[j][e] += s;
            }
    });
}
#endif

/* The unscaled score of absorbed MLA (spec 4.2) of query row [qh; qp] with the latent row
 * [c; k_pe] (width rkv + r): qh . c + qp . k_pe, each part in column order. */
__device__ static inline float arl_latent_dot(const float *qh, const float *qp, const float *row,
                                              int64_t rkv, int64_t r) {
    float s = 0.0f;
    for (int64_t c = 0; c < rkv; c++)
        s += qh[c] * row[c];
    float e = 0.0f;
    for (int64_t c = 0; c < r; c++)
        e += qp[c] * row[rkv + c];
    return s + e;
}

/* Block-wide sum in double with a fixed order (warp trees, then warp 0); every thread gets
 * the total.  sh: 33 doubles of shared memory.  blockDim.x a multiple of 32, <= 1024. */
__device__ static inline double arl_block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = arl_warp_sum_d(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        double t = lane < nw ? sh[lane] : 0.0;
        t = arl_warp_sum_d(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

/* arl_block_sum_d of n <= K values at once (v[0 .. n) replaced by their block sums, each summed
 * in the same order as arl_block_sum_d would: the same bits), with three barriers in all
 * instead of three a value.  sh: 33 K doubles. */
template <int K> __device__ static inline void arl_block_sum_dn(double *v, int n, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (k < n) v[k] = arl_warp_sum_d(v[k]);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k < n) sh[k * 33 + w] = v[k];
    __syncthreads();
    if (w == 0)
        for (int k = 0; k < n; k++) {
            double t = lane < nw ? sh[k * 33 + lane] : 0.0;
            t = arl_warp_sum_d(t);
            if (lane == 0) sh[k * 33 + 32] = t;
        }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++)
        if (k < n) v[k] = sh[k * 33 + 32];
}

/* Block-wide exclusive prefix sum: each thread gets the sum of the values of the threads
 * before it, and *total the block's sum (the same in every thread).  sh: 33 int64 of shared
 * memory.  blockDim.x a multiple of 32, <= 1024; every thread of the block calls it. */
__device__ static inline int64_t arl_block_scan_excl(int64_t v, int64_t *total, int64_t *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int64_t incl = v; /* the warp's inclusive sums */
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
    }
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 31) sh[w] = incl;
    __syncthreads();
    if (w == 0) { /* the warps' sums, scanned */
        int64_t t = lane < nw ? sh[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int64_t u = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += u;
        }
        if (lane < nw) sh[lane] = t;
        if (lane == nw - 1) sh[32] = t;
    }
    __syncthreads();
    *total = sh[32];
    return (w > 0 ? sh[w - 1] : 0) + incl - v;
}

/* Block-wide max (float); NaN-propagating when nan_prop. sh: 33 floats. */
__device__ static inline float arl_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = arl_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? sh[lane] : -INFINITY;
        t = arl_warp_max(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

__device__ static inline float arl_sigmoidf(float x) {
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

/* The activations the experts' GLUs use (kernels/cpu/activation.c's formulas) and their
 * derivatives: sech^2 x = 1 - tanh^2 x (exact form for large |x|), SiLU x sigmoid(x), SiTU's
 * phi(x) = b tanh(x / b) sigmoid(x).  One definition for every kernel that applies them (the
 * activation ops, the GLU pass, the grouped GEMMs' GLU epilogues), so that they agree bit for
 * bit. */
__device__ static inline float arl_d_sech2(float x) {
    float e = expf(-2.0f * fabsf(x));
    float q = 1.0f + e;
    return 4.0f * e / (q * q);
}
__device__ static inline float arl_silu(float x) {
    return x * arl_sigmoidf(x);
}
__device__ static inline float arl_silu_grad(float x) {
    return arl_sigmoidf(x) * (1.0f + x * arl_sigmoidf(-x));
}
__device__ static inline float arl_situ_phi(float x, float b) {
    return b * tanhf(x / b) * arl_sigmoidf(x);
}
__device__ static inline float arl_situ_phi_grad(float x, float b) {
    float t = tanhf(x / b), s = arl_sigmoidf(x);
    return arl_d_sech2(x / b) * s + b * t * s * arl_sigmoidf(-x);
}

/* The experts' GLU of gate g and up u: SiTU-GLU phi(g) psi(u) with psi(u) = b2 tanh(u / b2)
 * and phi's cap b1 (situ), or SwiGLU silu(g) u. */
__device__ static inline float arl_glu_value(int situ, float g, float u, float b1, float b2) {
    return situ ? arl_situ_phi(g, b1) * (b2 * tanhf(u / b2)) : arl_silu(g) * u;
}
/* a0 + the GLU's gradient in g, b0 + that in u, for the output gradient d */
__device__ static inline void arl_glu_grads(int situ, float d, float g, float u, float b1, float b2,
                                            float a0, float b0, float *a, float *b) {
    if (situ) {
        float psi = b2 * tanhf(u / b2);
        *a = a0 + d * arl_situ_phi_grad(g, b1) * psi;
        *b = b0 + d * arl_situ_phi(g, b1) * arl_d_sech2(u / b2);
    } else {
        *a = a0 + d * u * arl_silu_grad(g);
        *b = b0 + d * arl_silu(g);
    }
}

/* ---- stable counting sort (kernels/cuda/sort.cu) ----
 * One pass sorts entries i < n by a key in [0, E) (E small: a counter each in shared memory),
 * keeping the entries of a key in entry order.  Entry i's source value is src[idx[i]] (idx
 * NULL: src[i]); its key is (uint32) value >> shift, then & mask when mask is non-zero; an
 * entry whose key is not below E is reported to the error word (err_code, detail: its source
 * index, idx[i] or i; err_code 0: not reported) and left out.  Entry i placed at row r: out[r] =
 * idx ? idx[i] : i / div, and when not NULL rank[i] = r and out_value[r] = the source value.  The
 * MoE routing plan (moe.cu) is one pass keyed by expert; the embedding backward's sort of
 * positions by token (train.cu) is passes of 9-bit digits, a radix sort; the block-sparse MLA
 * backward (sparse.cu) sorts a query block's (pair, slot) entries by chunk. */
typedef struct arl_csort_pass {
    const int32_t *src;
    const int32_t *idx;
    uint32_t shift, mask;
    int64_t div;
    int32_t *out, *rank, *out_value;
    int32_t *used, *nused; /* (E), (1), or NULL: the keys with entries in order, their number */
    int32_t err_code;      /* 0: an entry whose key is not below E is left out unreported */
} arl_csort_pass;
/* The segment table's ints for n entries and E keys. */
int64_t arl_csort_seg_ints(int64_t n, int64_t E);
/* Sorts by p: counts (E) gets each key's entries, offsets (E + 1) their exclusive prefix sums
 * (offsets[E]: the entries placed), tiles (E + 1; or NULL) the prefix sums of ceil(count /
 * tile_rows); seg: arl_csort_seg_ints(n, E) ints of work space.  All device memory. */
void arl_csort_run(arl_cuda_ctx *c, const arl_csort_pass *p, int64_t n, int64_t E, int32_t *counts,
                   int32_t *offsets, int32_t *tiles, int32_t tile_rows, int32_t *seg);

#endif
