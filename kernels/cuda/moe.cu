/* kernels/cuda/moe.cu: MoE execution on the device (kernels/cuda/ops.h, spec 7.2): the
 * deterministic routing plan, gather/combine and their backward, and the grouped GEMM that
 * runs every expert in one launch (fp32 CUDA-core tiles for parity; tensor-core tiles on
 * mma.sync with ldmatrix fragments for speed, on bf16 operands or on fp32 ones rounded as they
 * are staged) plus the per-expert weight gradient.  The bf16 tile's wgmma form (Hopper) is
 * kernels/cuda/moe_wgmma.cu; what both share, kernels/cuda/moe_tiles.cuh. */
#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/moe_tiles.cuh"
#include "kernels/cuda/ops.h"

#define BN 64
#define BK 32

/* ======================= the routing plan ================================================
 * One pass of the stable counting sort (kernels/cuda/sort.cu), keyed by expert, in O(T k)
 * work: rows of an expert follow the (token, slot) order (it was one block per expert reading
 * all T k entries: E T k reads, 1.5e10 per build at T = 1M, E = 896).  The sort's per-segment
 * counts (E, segments) follow row_src and slot_row in the caller's buffer. */
extern "C" int64_t arl_cuda_moe_plan_ints(int64_t T, int64_t k, int64_t E) {
    return 3 * (E + 1) + 2 * T * k + arl_csort_seg_ints(T * k, E);
}

extern "C" void arl_cuda_moe_plan_build(arl_cuda_moe_plan *plan, int32_t *buf, const int32_t *sel,
                                        int64_t T, int64_t k, int64_t E) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(E >= 1 && k >= 1 && T >= 0 && T * k <= INT32_MAX);
    plan->counts = buf;
    plan->offsets = buf + (E + 1);
    plan->tiles = buf + 2 * (E + 1);
    plan->row_src = buf + 3 * (E + 1);
    plan->slot_row = plan->row_src + T * k;
    plan->T = T;
    plan->k = k;
    plan->E = E;
    arl_csort_pass p = {};
    p.src = sel;
    p.div = k;
    p.out = plan->row_src;
    p.rank = plan->slot_row;
    p.err_code = 2; /* context.cu: an expert index outside [0, E) */
    arl_csort_run(c, &p, T * k, E, plan->counts, plan->offsets, plan->tiles, BM,
                  plan->slot_row + T * k);
    ARL_CUDA_LAUNCHED(c, "moe_plan_build");
}

/* ======================= gather / combine ================================================ */

__global__ void k_gather(float *xp, uint16_t *xpb, const float *x, const int32_t *row_src,
                         int64_t R, int64_t d) {
    ARL_GRID_STRIDE(i, R * d) {
        int64_t r = i / d, j = i % d;
        float v = x[(int64_t)row_src[r] * d + j];
        if (xp)
            xp[i] = v;
        else
            xpb[i] = (uint16_t)arl_bf16_rn_bits(v);
    }
}

extern "C" void arl_cuda_moe_gather(float *xp, const float *x, const arl_cuda_moe_plan *plan,
                                    int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    int64_t R = plan->T * plan->k;
    if (R * d == 0) return;
    k_gather<<<arl_blocks(R * d, 256), 256, 0, c->stream>>>(xp, NULL, x, plan->row_src, R, d);
    ARL_CUDA_LAUNCHED(c, "moe_gather");
}

extern "C" void arl_cuda_moe_gather_bf16(uint16_t *xp, const float *x,
                                         const arl_cuda_moe_plan *plan, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    int64_t R = plan->T * plan->k;
    if (R * d == 0) return;
    k_gather<<<arl_blocks(R * d, 256), 256, 0, c->stream>>>(NULL, xp, x, plan->row_src, R, d);
    ARL_CUDA_LAUNCHED(c, "moe_gather_bf16");
}

__global__ void k_gather_bwd(float *dx, const float *dxp, const int32_t *slot_row, int64_t T,
                             int64_t k, int64_t d) {
    ARL_GRID_STRIDE(i, T * d) {
        int64_t t = i / d, j = i % d;
        float acc = 0.0f;
        for (int64_t s = 0; s < k; s++)
            acc += dxp[(int64_t)slot_row[t * k + s] * d + j];
        dx[i] += acc;
    }
}

extern "C" void arl_cuda_moe_gather_bwd(float *dx, const float *dxp, const arl_cuda_moe_plan *plan,
                                        int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (plan->T * d == 0) return;
    k_gather_bwd<<<arl_blocks(plan->T * d, 256), 256, 0, c->stream>>>(dx, dxp, plan->slot_row,
                                                                      plan->T, plan->k, d);
    ARL_CUDA_LAUNCHED(c, "moe_gather_bwd");
}

__global__ void k_combine(float *y, const float *yp, const float *p, const int32_t *slot_row,
                          int64_t T, int64_t k, int64_t d) {
    ARL_GRID_STRIDE(i, T * d) {
        int64_t t = i / d, j = i % d;
        float acc = 0.0f;
        for (int64_t s = 0; s < k; s++)
            acc += p[t * k + s] * yp[(int64_t)slot_row[t * k + s] * d + j];
        y[i] = acc;
    }
}

extern "C" void arl_cuda_moe_combine(float *y, const float *yp, const float *p,
                                     const arl_cuda_moe_plan *plan, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (plan->T * d == 0) return;
    k_combine<<<arl_blocks(plan->T * d, 256), 256, 0, c->stream>>>(y, yp, p, plan->slot_row,
                                                                   plan->T, plan->k, d);
    ARL_CUDA_LAUNCHED(c, "moe_combine");
}

/* One block per (token, slot): dyp row = p dy (fp32, or bf16 into dypb where dyp is NULL);
 * dp += dy . yp (block sum in double). */
__global__ void k_combine_bwd(float *dyp, uint16_t *dypb, float *dp, const float *dy,
                              const float *yp, const float *p, const int32_t *slot_row, int64_t k,
                              int64_t d) {
    __shared__ double sh[33];
    int64_t ts = blockIdx.x, t = ts / k;
    int64_t row = slot_row[ts];
    float pv = p[ts];
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float g = dy[t * d + j];
        if (dyp)
            dyp[row * d + j] = pv * g;
        else
            dypb[row * d + j] = (uint16_t)arl_bf16_rn_bits(pv * g);
        acc += (double)g * yp[row * d + j];
    }
    acc = arl_block_sum_d(acc, sh);
    if (threadIdx.x == 0) dp[ts] += (float)acc;
}

static void combine_bwd(float *dyp, uint16_t *dypb, float *dp, const float *dy, const float *yp,
                        const float *p, const arl_cuda_moe_plan *plan, int64_t d) {
    arl_cuda_ctx *c = arl_cuda_need();
    int64_t n = plan->T * plan->k;
    if (n == 0) return;
    k_combine_bwd<<<(unsigned)n, 128, 0, c->stream>>>(dyp, dypb, dp, dy, yp, p, plan->slot_row,
                                                      plan->k, d);
    ARL_CUDA_LAUNCHED(c, "moe_combine_bwd");
}
extern "C" void arl_cuda_moe_combine_bwd(float *dyp, float *dp, const float *dy, const float *yp,
                                         const float *p, const arl_cuda_moe_plan *plan, int64_t d) {
    combine_bwd(dyp, NULL, dp, dy, yp, p, plan, d);
}
extern "C" void arl_cuda_moe_combine_bwd_bf16(uint16_t *dyp, float *dp, const float *dy,
                                              const float *yp, const float *p,
                                              const arl_cuda_moe_plan *plan, int64_t d) {
    combine_bwd(NULL, dyp, dp, dy, yp, p, plan, d);
}

/* ======================= grouped GEMM ===================================================== */

/* fp32 CUDA-core tile: 64x64 outputs, 256 threads (4x4 each), K in steps of 32. */
__global__ void k_grouped_f32(float *Y, const float *X, const float *W, int32_t trans_w,
                              arl_cuda_moe_plan P, int64_t N, int64_t K, float beta) {
    __shared__ float As[BK][BM + 1];
    __shared__ float Bs[BK][BN + 1];
    int32_t e, r0, nr;
    if (!tile_of(P, blockIdx.x, &e, &r0, &nr)) return;
    int64_t n0 = (int64_t)blockIdx.y * BN;
    const float *We = W + (int64_t)e * N * K;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
            int r = i / BK, kk = i % BK;
            As[kk][r] = (r < nr && k0 + kk < K) ? X[(int64_t)(r0 + r) * K + k0 + kk] : 0.0f;
        }
        for (int i = threadIdx.x; i < BN * BK; i += blockDim.x) {
            int nn, kk;
            float v = 0.0f;
            if (trans_w) { /* W_e (N, K) */
                nn = i / BK;
                kk = i % BK;
                if (n0 + nn < N && k0 + kk < K) v = We[(n0 + nn) * K + k0 + kk];
            } else { /* W_e (K, N) */
                kk = i / BN;
                nn = i % BN;
                if (n0 + nn < N && k0 + kk < K) v = We[(k0 + kk) * N + n0 + nn];
            }
            Bs[kk][nn] = v;
        }
        __syncthreads();
        for (int kk = 0; kk < BK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][ty * 4 + i];
                b[i] = Bs[kk][tx * 4 + i];
            }
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int r = ty * 4 + i;
        if (r >= nr) continue;
        for (int j = 0; j < 4; j++) {
            int64_t nn = n0 + tx * 4 + j;
            if (nn >= N) continue;
            float *y = Y + (int64_t)(r0 + r) * N + nn;
            *y = beta != 0.0f ? acc[i][j] + beta * *y : acc[i][j];
        }
    }
}

/* the wide fp32-operand tile on tensor cores (below) */
static void grouped_f32_wide(float *Y, const float *X, const float *W, int32_t trans_w,
                             const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta,
                             arl_cuda_ctx *c);

extern "C" void arl_cuda_grouped_gemm(float *Y, const float *X, const float *W, int32_t trans_w,
                                      const arl_cuda_moe_plan *plan, int64_t N, int64_t K,
                                      float beta) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (plan->T * plan->k == 0 || N == 0) return;
    dim3 grid(max_row_tiles(plan), (unsigned)((N + BN - 1) / BN));
    if (c->math == ARL_CUDA_MATH_BF16 && N % 16 == 0 && K % 16 == 0) { /* tensor cores */
        grouped_f32_wide(Y, X, W, trans_w, plan, N, K, beta, c);
    } else {
        k_grouped_f32<<<grid, 256, 0, c->stream>>>(Y, X, W, trans_w, *plan, N, K, beta);
    }
    ARL_CUDA_LAUNCHED(c, "grouped_gemm");
}

/* The tile for bf16 operands and W (E, N, K) (trans_w = 1, the forward's layout: X rows and
 * W_e rows both K-contiguous): 64 rows (one plan tile) x 256 columns per block, 8 warps in
 * 2 x 4, each 32 x 64 as 2 x 8 mma.sync m16n8k16 products per 16 of K, every fragment read by
 * ldmatrix.x4.  K runs in slabs of 32 through a ring of 4 shared stages filled by cp.async
 * (three slabs in flight while one is multiplied; one barrier per slab).  A stage holds the
 * slab's 64 X rows then its 256 W_e rows, 64 bytes each, the four 16-byte chunks of row r
 * stored at chunk ^ ((r >> 1) & 3), so that the 8 rows an ldmatrix phase reads fall in 8
 * distinct bank groups.  Blocks are numbered column tile fastest: the column tiles of a row
 * tile run together and share its X rows in L2.  The fp32 results go from the accumulators
 * straight to Y (each quad of lanes writes one 32-byte sector): Y = XW^T + beta Y (beta = 0:
 * Y is not read).  Rows past the expert's, columns past N and K past its end are zero-filled
 * by the copies. */
#define TN_N 256    /* columns per block */
#define TN_K 32     /* K per slab */
#define TN_STAGES 4 /* ring depth */
#define TN_ROW_BYTES (TN_K * 2)
#define TN_STAGE_BYTES ((BM + TN_N) * TN_ROW_BYTES)

/* byte offset of (row r, 16-byte chunk c) in a stage (a "K-major" tile: rows of 32 k) */
__device__ static inline uint32_t kmaj_off(int r, int c) {
    return (uint32_t)(r * TN_ROW_BYTES + ((c ^ ((r >> 1) & 3)) << 4));
}

/* The GLU epilogue of the expert forward's gate and up products (arl_cuda_grouped_glu_bf16):
 * W3 the up bank beside W (the gate's); U (T*k, N) fp32 or NULL; H (T*k, N) bf16. */
struct tn_glu {
    const __nv_bfloat16 *W3;
    float *U;
    uint16_t *H;
    int32_t situ;
    float b1, b2;
};

/* The GLU epilogue's exchange: the block's gate and up sums (64 x 128 each, rows padded to
 * 136 floats so that a quad's float2 stores of eight rows spread over the banks) in the ring's
 * shared memory once the loop is done with it. */
#define GLU_LD 136
#define GLU_TILE_FLOATS (BM * GLU_LD)

/* GLU = false: Y = X W_e^T + beta Y as above.  GLU = true (arl_cuda_grouped_glu_bf16): a
 * block's 256 columns are 128 of the gate bank W (warps wc 0-1) and the same 128 of the up
 * bank gp.W3 (warps wc 2-3), the same slabs, products and fragments as the plain tile (so
 * the same gate and up sums, bit for bit); after the loop the warps put their sums in shared
 * memory (the ring is free by then) and every thread writes pairs of H = GLU(g, u) in bf16.
 * Y (the gate) and gp.U get the fp32 sums where not NULL (the training forward's save). */
template <bool GLU>
__global__ void __launch_bounds__(256, 2)
    k_grouped_bf16_tn(float *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W, arl_cuda_moe_plan P,
                      int64_t N, int64_t K, float beta, int32_t ncol, tn_glu gp) {
    constexpr int CW = GLU ? TN_N / 2 : TN_N; /* output columns per block */
    extern __shared__ float sm[];
    unsigned char *raw = reinterpret_cast<unsigned char *>(sm);
    int32_t e, r0, nr;
    if (!tile_of(P, (int32_t)(blockIdx.x / (unsigned)ncol), &e, &r0, &nr)) return;
    const int64_t n0 = (int64_t)(blockIdx.x % (unsigned)ncol) * CW;
    const __nv_bfloat16 *We = W + (int64_t)e * N * K, *W3e = GLU ? gp.W3 + (int64_t)e * N * K : We;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp >> 2, wc = warp & 3;
    const int64_t nslab = (K + TN_K - 1) / TN_K;
    /* slab s into stage s % TN_STAGES: 5 chunks of 16 bytes per thread (the first X's); GLU:
     * the stage's W rows 128.. are the up bank's rows n0.. */
    auto load = [&](int64_t slab) {
        unsigned char *st = raw + (slab % TN_STAGES) * TN_STAGE_BYTES;
        const int64_t k0 = slab * TN_K;
#pragma unroll
        for (int q = 0; q < (BM + TN_N) * (TN_ROW_BYTES / 16) / 256; q++) {
            const int i = threadIdx.x + q * 256, r = i >> 2, c = i & 3;
            const bool up = GLU && r >= BM + CW;
            bool ok;
            const __nv_bfloat16 *src =
                tn_row_src(X, up ? W3e : We, r0, nr, up ? n0 - CW : n0, N, K, r, k0 + c * 8, &ok);
            cp_async16(st + kmaj_off(r, c), src, ok);
        }
    };
    float acc[2][8][4] = {}; /* (m16 tile i, n8 tile j): the warp's 32 x 64 */
    cp_ring<TN_STAGES>(nslab, load, [&](int stage) {
        const unsigned char *st = raw + stage * TN_STAGE_BYTES;
#pragma unroll
        for (int ks = 0; ks < TN_K / 16; ks++) {
            uint32_t a[2][4], b[8][2];
#pragma unroll
            for (int i = 0; i < 2; i++) /* A: X rows, map A */
                arl_ldmatrix_x4(a[i], st + kmaj_off(wr * 32 + i * 16 + arl_ldm_row_a(lane),
                                                    ks * 2 + arl_ldm_chunk_a(lane)));
#pragma unroll
            for (int jp = 0; jp < 4; jp++) /* B: W_e rows, two n8 tiles per load, map B */
                arl_ldm_b_pair<false>(b, jp,
                                      st + kmaj_off(BM + wc * 64 + jp * 16 + arl_ldm_row_b(lane),
                                                    ks * 2 + arl_ldm_chunk_b(lane)));
            arl_mma_tiles(acc, a, b);
        }
    });
    if constexpr (!GLU) {
        warp_store<8>(Y + (int64_t)r0 * N + n0, N, nr, N - n0, beta, acc, wr * 32, wc * 64);
    } else {
        __syncthreads(); /* every warp is done with the ring's stages */
        float *xs = sm + (wc >> 1) * GLU_TILE_FLOATS; /* this warp's bank: (64, GLU_LD) */
        warp_pairs(acc, wr * 32, (wc & 1) * 64, [&](int row, int col, float v0, float v1) {
            *reinterpret_cast<float2 *>(xs + row * GLU_LD + col) = make_float2(v0, v1);
        });
        __syncthreads();
        /* every thread: pairs of columns, a warp 64 of a row (coalesced stores) */
        const int64_t o0 = (int64_t)r0 * N + n0, cols_ok = N - n0;
        for (int q = threadIdx.x; q < BM * CW / 2; q += 256) {
            const int row = q / (CW / 2), col = 2 * (q % (CW / 2));
            if (row >= nr || col >= cols_ok) continue;
            const int64_t o = o0 + (int64_t)row * N + col;
            const float2 gv = *reinterpret_cast<const float2 *>(sm + row * GLU_LD + col),
                         uv = *reinterpret_cast<const float2 *>(sm + GLU_TILE_FLOATS +
                                                                row * GLU_LD + col);
            if (Y) *reinterpret_cast<float2 *>(Y + o) = gv;
            if (gp.U) *reinterpret_cast<float2 *>(gp.U + o) = uv;
            const float a = arl_glu_value(gp.situ, gv.x, uv.x, gp.b1, gp.b2),
                        b = arl_glu_value(gp.situ, gv.y, uv.y, gp.b1, gp.b2);
            *reinterpret_cast<uint32_t *>(gp.H + o) = arl_bf16x2_rn_bits(a, b);
        }
    }
}

/* ---- the wide tiles of three shapes on mma.sync: the training step's expert GEMMs ----
 * A block computes a 64 x 128 tile of C = A B: 8 warps in 2 x 4, each 32 x 32 as 2 x 4
 * m16n8k16 products per 16 of k, fragments read by ldmatrix; k in slabs of 32.  Three shapes
 * (MODE):
 *   FM_T   Y (rows of a plan tile) = X W_e^T + beta Y, W_e (N, K): A = X rows and B = W_e rows,
 *          both k-contiguous ("K-major" tiles, ldmatrix);
 *   FM_N   Y = X W_e + beta Y, W_e (K, N): B's rows are k, n-contiguous ("MN-major" tiles,
 *          ldmatrix.trans);
 *   FM_WG  dW_e (N, K) += dY^T X over the expert's rows in order (k = the row, fp32
 *          accumulation, no atomics): A = dY^T and B = X, both MN-major.
 * Two operand types, the same tiles and products (so the same sums, bit for bit, on the same
 * bf16 values): fp32 operands (the bf16 math mode on fp32 tensors; k_grouped_f32_mma) are read
 * into registers (float4) while the slab before is multiplied, then rounded to bf16 (nearest
 * even) into the other of two shared buffers (one barrier per slab); bf16 operands
 * (k_grouped_b16_mma) are copied by cp.async through a ring of 4 stages (three slabs in flight
 * while one is multiplied; one barrier per slab).  A tile is "lines": K-major ones lines of
 * 32 k (64 bytes, kmaj_off), MN-major ones 32 lines of k (128 or 256 bytes), the 16-byte chunk c
 * of line r stored at c ^ (r & 7) (mnmaj_off): either way the 8 lines an ldmatrix phase reads
 * fall in 8 distinct bank groups.  Zeros past the expert's rows, N and K.  Needs N and K
 * multiples of 16 and 16-byte aligned operands (the launch checks). */
enum { FM_T = 0, FM_N = 1, FM_WG = 2 };
#define FM_M 64                      /* tile rows */
#define FM_NT 128                    /* tile columns */
#define FM_A_BYTES (FM_M * TN_K * 2) /* a slab of A (either layout) */
#define FM_B_BYTES (FM_NT * TN_K * 2)
#define FM_STAGES 4 /* the bf16 operands' ring: 4 x 12 KB */

/* byte offset of (row r, 16-byte chunk c) in an MN-major tile of rb-byte rows */
__device__ static inline uint32_t mnmaj_off(int r, int c, int rb) {
    return (uint32_t)(r * rb + ((c ^ (r & 7)) << 4));
}

/* A slab's tiles as lines of len elements: A's are X rows (FM_T, FM_N: 64 lines of 32 k) or dY
 * rows k (FM_WG: 32 lines of 64); B's W_e rows n (FM_T: 128 lines of 32 k) or rows k of W_e
 * (K, N) or X (FM_N, FM_WG: 32 lines of 128).  The byte offset of (line, element col) in its
 * tile: K-major when a line is the slab's 32 k. */
template <int MODE> __device__ constexpr int fm_len_a() {
    return MODE == FM_WG ? FM_M : TN_K;
}
template <int MODE> __device__ constexpr int fm_len_b() {
    return MODE == FM_T ? TN_K : FM_NT;
}
template <int LEN> __device__ static inline uint32_t fm_off(int line, int col) {
    return (LEN == TN_K ? kmaj_off(line, col >> 3) : mnmaj_off(line, col >> 3, LEN * 2)) +
           (uint32_t)((col & 7) * 2);
}

/* A block's tile: its output corner and where its operands start.  FM_T, FM_N: blocks
 * numbered row tile major, column tile (of ncol) minor; k over [0, K).  FM_WG: grid (K / 128,
 * N / 64, E) rounded up; k over the expert's rows [ka, kb). */
struct fm_tile {
    int32_t r0, nr, ka, kb; /* FM_T, FM_N: the plan tile's rows */
    int64_t m0, n0;         /* the tile's first output row (FM_WG: n of dW_e) and column */
    int64_t boff;           /* B's expert offset (FM_T, FM_N: e N K elements; FM_WG: 0) */
    float *out;             /* the output corner, leading dimension ld */
    int64_t ld, rows_ok, cols_ok;
};
template <int MODE>
__device__ static inline bool fm_tile_of(fm_tile *t, float *Y, const arl_cuda_moe_plan &P,
                                         int64_t N, int64_t K, int32_t ncol) {
    int32_t e;
    t->r0 = 0, t->nr = 0, t->ka = 0, t->m0 = 0;
    if (MODE == FM_WG) {
        e = (int32_t)blockIdx.z;
        t->ka = P.offsets[e];
        t->kb = P.offsets[e + 1];
        if (t->ka == t->kb) return false;
        t->m0 = (int64_t)blockIdx.y * FM_M;
        t->n0 = (int64_t)blockIdx.x * FM_NT;
        t->boff = 0;
        t->out = Y + (int64_t)e * N * K + t->m0 * K + t->n0;
        t->ld = K, t->rows_ok = N - t->m0, t->cols_ok = K - t->n0;
    } else {
        if (!tile_of(P, (int32_t)(blockIdx.x / (unsigned)ncol), &e, &t->r0, &t->nr)) return false;
        t->n0 = (int64_t)(blockIdx.x % (unsigned)ncol) * FM_NT;
        t->kb = (int32_t)K;
        t->boff = (int64_t)e * N * K;
        t->out = Y ? Y + (int64_t)t->r0 * N + t->n0 : Y; /* NULL: the GLU backward's (gb.dg) */
        t->ld = N, t->rows_ok = t->nr, t->cols_ok = N - t->n0;
    }
    return true;
}

/* The address of element (line, col) of the slab at k0 in A, and of B (Be: the expert's);
 * *ok = 0 past the expert's rows, N or K (the address then stays valid: the operand's first). */
template <int MODE, class TE>
__device__ static inline const TE *fm_src_a(const TE *A, const fm_tile &t, int64_t N, int64_t K,
                                            int32_t k0, int line, int col, bool *ok) {
    if (MODE == FM_WG) { /* dY row k0 + line, column m0 + col */
        *ok = k0 + line < t.kb && t.m0 + col < N;
        return *ok ? A + (int64_t)(k0 + line) * N + t.m0 + col : A;
    }
    *ok = line < t.nr && k0 + col < t.kb; /* X row r0 + line, column k0 + col */
    return *ok ? A + (int64_t)(t.r0 + line) * K + k0 + col : A;
}
template <int MODE, class TE>
__device__ static inline const TE *fm_src_b(const TE *Be, const fm_tile &t, int64_t N, int64_t K,
                                            int32_t k0, int line, int col, bool *ok) {
    if (MODE == FM_T) { /* W_e row n0 + line, column k0 + col */
        *ok = t.n0 + line < N && k0 + col < t.kb;
        return *ok ? Be + (t.n0 + line) * K + k0 + col : Be;
    }
    const int64_t w = MODE == FM_N ? N : K; /* row k0 + line of W_e (K, N) or X (R, K) */
    *ok = k0 + line < t.kb && t.n0 + col < w;
    return *ok ? Be + (int64_t)(k0 + line) * w + t.n0 + col : Be;
}

/* One slab's products: the warp's 32 x 32 corner (wr, wc) += A B over the slab's 32 k, from the
 * tiles at (A) and bt (B). */
template <int MODE>
__device__ static inline void fm_products(float (&acc)[2][4][4], const unsigned char *at,
                                          const unsigned char *bt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp >> 2, wc = warp & 3;
#pragma unroll
    for (int ks = 0; ks < TN_K / 16; ks++) {
        uint32_t a[2][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (MODE == FM_WG) /* k rows: .trans, map B */
                arl_ldmatrix_x4_trans(
                    a[i], at + mnmaj_off(ks * 16 + arl_ldm_row_b(lane),
                                         (wr * 32 + i * 16) / 8 + arl_ldm_chunk_b(lane), FM_M * 2));
            else /* m rows: map A */
                arl_ldmatrix_x4(a[i], at + kmaj_off(wr * 32 + i * 16 + arl_ldm_row_a(lane),
                                                    ks * 2 + arl_ldm_chunk_a(lane)));
        }
#pragma unroll
        for (int jp = 0; jp < 2; jp++) { /* n8 tiles 2 jp, 2 jp + 1 */
            if (MODE == FM_T)            /* n rows: map B */
                arl_ldm_b_pair<false>(b, jp,
                                      bt + kmaj_off(wc * 32 + jp * 16 + arl_ldm_row_b(lane),
                                                    ks * 2 + arl_ldm_chunk_b(lane)));
            else /* k rows: .trans, map A */
                arl_ldm_b_pair<true>(b, jp,
                                     bt + mnmaj_off(ks * 16 + arl_ldm_row_a(lane),
                                                    (wc * 32 + jp * 16) / 8 + arl_ldm_chunk_a(lane),
                                                    FM_NT * 2));
        }
        arl_mma_tiles(acc, a, b);
    }
}

/* four fp32 values rounded to bf16 (nearest even), 8 bytes at tile + off */
__device__ static inline void put4(unsigned char *tile, uint32_t off, float4 v) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&lo);
    u.y = *reinterpret_cast<uint32_t *>(&hi);
    *reinterpret_cast<uint2 *>(tile + off) = u;
}

/* fp32 operands: FM_T, FM_N: Y (R, N), A = X (R, K), B = W (E, N, K) or (E, K, N).  FM_WG: Y =
 * dW (E, N, K), A = dY (R, N), B = X (R, K); beta 1 (+=). */
template <int MODE>
__global__ void __launch_bounds__(256, 2)
    k_grouped_f32_mma(float *Y, const float *A, const float *B, arl_cuda_moe_plan P, int64_t N,
                      int64_t K, float beta, int32_t ncol) {
    __shared__ __align__(16) unsigned char sbuf[2][FM_A_BYTES + FM_B_BYTES];
    constexpr int LA = fm_len_a<MODE>(), LB = fm_len_b<MODE>();
    fm_tile t;
    if (!fm_tile_of<MODE>(&t, Y, P, N, K, ncol)) return;
    const float *Be = B + t.boff;
    /* a slab: 2 float4 of A and 4 of B per thread; float4 i of a tile is line i / (len / 4),
     * elements from (i % (len / 4)) 4 */
    float4 ra[FM_A_BYTES / 8 / 256], rb[FM_B_BYTES / 8 / 256];
    auto fetch = [&](int32_t k0) {
#pragma unroll
        for (int q = 0; q < FM_A_BYTES / 8 / 256; q++) {
            const int i = threadIdx.x + q * 256;
            bool ok;
            const float *p = fm_src_a<MODE>(A, t, N, K, k0, i / (LA / 4), i % (LA / 4) * 4, &ok);
            ra[q] = ok ? *reinterpret_cast<const float4 *>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int q = 0; q < FM_B_BYTES / 8 / 256; q++) {
            const int i = threadIdx.x + q * 256;
            bool ok;
            const float *p = fm_src_b<MODE>(Be, t, N, K, k0, i / (LB / 4), i % (LB / 4) * 4, &ok);
            rb[q] = ok ? *reinterpret_cast<const float4 *>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    auto stash = [&](int buf) {
        unsigned char *at = sbuf[buf], *bt = sbuf[buf] + FM_A_BYTES;
#pragma unroll
        for (int q = 0; q < FM_A_BYTES / 8 / 256; q++) {
            const int i = threadIdx.x + q * 256;
            put4(at, fm_off<LA>(i / (LA / 4), i % (LA / 4) * 4), ra[q]);
        }
#pragma unroll
        for (int q = 0; q < FM_B_BYTES / 8 / 256; q++) {
            const int i = threadIdx.x + q * 256;
            put4(bt, fm_off<LB>(i / (LB / 4), i % (LB / 4) * 4), rb[q]);
        }
    };
    float acc[2][4][4] = {}; /* (m16 tile i, n8 tile j): the warp's 32 x 32 */
    const int32_t nslab = (t.kb - t.ka + TN_K - 1) / TN_K;
    fetch(t.ka);
    stash(0);
    __syncthreads();
    for (int32_t s = 0; s < nslab; s++) {
        const int buf = s & 1;
        const bool more = s + 1 < nslab;
        if (more) fetch(t.ka + (s + 1) * TN_K); /* in flight during the products */
        fm_products<MODE>(acc, sbuf[buf], sbuf[buf] + FM_A_BYTES);
        /* the other buffer was last read in slab s - 1, before the barrier that ended it */
        if (more) stash(buf ^ 1);
        __syncthreads();
    }
    const int warp = threadIdx.x >> 5;
    warp_store<4>(t.out, t.ld, t.rows_ok, t.cols_ok, beta, acc, (warp >> 2) * 32, (warp & 3) * 32);
}

/* A tile's CHUNKS 16-byte chunks by cp.async (CHUNKS / 256 a thread): chunk i is line
 * i / (LEN / 8), elements from (i % (LEN / 8)) 8, read from src(line, col, &ok). */
template <int LEN, int CHUNKS, class SRC>
__device__ static inline void fm_copy(unsigned char *tile, SRC &&src) {
#pragma unroll
    for (int q = 0; q < CHUNKS / 256; q++) {
        const int i = threadIdx.x + q * 256, line = i / (LEN / 8), col = i % (LEN / 8) * 8;
        bool ok;
        const void *p = src(line, col, &ok);
        cp_async16(tile + fm_off<LEN>(line, col), p, ok);
    }
}

/* The GLU backward in the epilogue of the GLU output's gradient (arl_cuda_grouped_glu_bwd_bf16,
 * FM_N): g, u (R, N) the GLU's inputs, dg, du (R, N) their gradients in bf16; dg NULL: none. */
struct fm_glub {
    const float *g, *u;
    uint16_t *dg, *du;
    int32_t situ;
    float b1, b2;
};

/* dg, du at the warp's output positions (warp_pairs') from dh = its accumulators: table.cu's
 * GLU backward of each pair (the gradients added to zero, rounded to nearest even) */
__device__ static inline void glub_store(const fm_glub &gb, const fm_tile &t, int64_t N,
                                         const float (&acc)[2][4][4], int row0, int col0) {
    warp_pairs(acc, row0, col0, [&](int row, int col, float h0, float h1) {
        if (row < t.rows_ok && col < t.cols_ok) {
            const int64_t o = (int64_t)(t.r0 + row) * N + t.n0 + col;
            const float2 gv = *reinterpret_cast<const float2 *>(gb.g + o),
                         uv = *reinterpret_cast<const float2 *>(gb.u + o);
            float a0, b0, a1, b1;
            arl_glu_grads(gb.situ, h0, gv.x, uv.x, gb.b1, gb.b2, 0.0f, 0.0f, &a0, &b0);
            arl_glu_grads(gb.situ, h1, gv.y, uv.y, gb.b1, gb.b2, 0.0f, 0.0f, &a1, &b1);
            *reinterpret_cast<uint32_t *>(gb.dg + o) = arl_bf16x2_rn_bits(a0, a1);
            *reinterpret_cast<uint32_t *>(gb.du + o) = arl_bf16x2_rn_bits(b0, b1);
        }
    });
}

/* bf16 operands, the same shapes (a slab: 1 chunk of A and 2 of B a thread); FM_N with gb.dg:
 * the GLU backward of the products instead of Y (glub_store). */
template <int MODE>
__global__ void __launch_bounds__(256, 2)
    k_grouped_b16_mma(float *Y, const __nv_bfloat16 *A, const __nv_bfloat16 *B, arl_cuda_moe_plan P,
                      int64_t N, int64_t K, float beta, int32_t ncol, fm_glub gb) {
    __shared__ __align__(16) unsigned char sbuf[FM_STAGES][FM_A_BYTES + FM_B_BYTES];
    constexpr int LA = fm_len_a<MODE>(), LB = fm_len_b<MODE>();
    fm_tile t;
    if (!fm_tile_of<MODE>(&t, Y, P, N, K, ncol)) return;
    const __nv_bfloat16 *Be = B + t.boff;
    const int32_t nslab = (t.kb - t.ka + TN_K - 1) / TN_K;
    /* slab s into stage s % FM_STAGES */
    auto load = [&](int64_t s) {
        unsigned char *at = sbuf[s % FM_STAGES];
        const int32_t k0 = t.ka + (int32_t)s * TN_K;
        fm_copy<LA, FM_A_BYTES / 16>(at, [&](int line, int col, bool *ok) {
            return fm_src_a<MODE>(A, t, N, K, k0, line, col, ok);
        });
        fm_copy<LB, FM_B_BYTES / 16>(at + FM_A_BYTES, [&](int line, int col, bool *ok) {
            return fm_src_b<MODE>(Be, t, N, K, k0, line, col, ok);
        });
    };
    float acc[2][4][4] = {};
    cp_ring<FM_STAGES>(nslab, load, [&](int stage) {
        fm_products<MODE>(acc, sbuf[stage], sbuf[stage] + FM_A_BYTES);
    });
    const int warp = threadIdx.x >> 5;
    if (MODE == FM_N && gb.dg)
        glub_store(gb, t, N, acc, (warp >> 2) * 32, (warp & 3) * 32);
    else
        warp_store<4>(t.out, t.ld, t.rows_ok, t.cols_ok, beta, acc, (warp >> 2) * 32,
                      (warp & 3) * 32);
}

/* Launch MODE's tile for fp32 (TE float) or bf16 operands; FM_WG: Y += (beta 1). */
template <int MODE, class TE>
static void fm_launch(float *Y, const TE *A, const TE *B, const arl_cuda_moe_plan *plan, int64_t N,
                      int64_t K, float beta, arl_cuda_ctx *c, const fm_glub &gb = fm_glub{}) {
    ARL_ASSERT(N % 16 == 0 && K % 16 == 0);
    ARL_ASSERT(((uintptr_t)A | (uintptr_t)B) % 16 == 0 && (uintptr_t)Y % 8 == 0);
    ARL_ASSERT(Y || (MODE == FM_N && gb.dg)); /* only the GLU backward writes no Y */
    unsigned ncol = 1;
    dim3 grid;
    if (MODE == FM_WG) {
        grid = dim3((unsigned)((K + FM_NT - 1) / FM_NT), (unsigned)((N + FM_M - 1) / FM_M),
                    (unsigned)plan->E);
        beta = 1.0f;
    } else {
        ncol = (unsigned)((N + FM_NT - 1) / FM_NT);
        grid = dim3(max_row_tiles(plan) * ncol);
    }
    if constexpr (sizeof(TE) == 4)
        k_grouped_f32_mma<MODE>
            <<<grid, 256, 0, c->stream>>>(Y, A, B, *plan, N, K, beta, (int32_t)ncol);
    else
        k_grouped_b16_mma<MODE>
            <<<grid, 256, 0, c->stream>>>(Y, A, B, *plan, N, K, beta, (int32_t)ncol, gb);
}

static void grouped_f32_wide(float *Y, const float *X, const float *W, int32_t trans_w,
                             const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta,
                             arl_cuda_ctx *c) {
    if (trans_w)
        fm_launch<FM_T>(Y, X, W, plan, N, K, beta, c);
    else
        fm_launch<FM_N>(Y, X, W, plan, N, K, beta, c);
}

template <bool GLU>
static void tn_launch(float *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                      const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta,
                      const tn_glu &gp, arl_cuda_ctx *c) {
    constexpr int smem = TN_STAGES * TN_STAGE_BYTES, cw = GLU ? TN_N / 2 : TN_N;
    static_assert(!GLU || smem >= 2 * GLU_TILE_FLOATS * 4, "the GLU exchange fits in the ring");
    const unsigned ncol = (unsigned)((N + cw - 1) / cw);
    cudaFuncSetAttribute(k_grouped_bf16_tn<GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k_grouped_bf16_tn<GLU><<<max_row_tiles(plan) * ncol, 256, smem, c->stream>>>(
        Y, X, W, *plan, N, K, beta, (int32_t)ncol, gp);
}

extern "C" void arl_cuda_grouped_glu_bf16(float *G, float *U, uint16_t *H, const uint16_t *X,
                                          const uint16_t *W1, const uint16_t *W3,
                                          const arl_cuda_moe_plan *plan, int64_t f, int64_t K,
                                          int32_t situ, float b1, float b2) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(f % 16 == 0 && K % 16 == 0);
    if (plan->T * plan->k == 0 || f == 0) return;
    const tn_glu gp = {(const __nv_bfloat16 *)W3, U, H, situ, b1, b2};
    tn_launch<true>(G, (const __nv_bfloat16 *)X, (const __nv_bfloat16 *)W1, plan, f, K, 0.0f, gp,
                    c);
    ARL_CUDA_LAUNCHED(c, "grouped_glu_bf16");
}

extern "C" void arl_cuda_grouped_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const uint16_t *dY,
                                              const uint16_t *W2, const float *g, const float *u,
                                              const arl_cuda_moe_plan *plan, int64_t f, int64_t K,
                                              int32_t situ, float b1, float b2) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (plan->T * plan->k == 0 || f == 0) return;
    ARL_ASSERT(((uintptr_t)g | (uintptr_t)u) % 8 == 0 && ((uintptr_t)dg | (uintptr_t)du) % 4 == 0);
    const fm_glub gb = {g, u, dg, du, situ, b1, b2};
    fm_launch<FM_N>((float *)NULL, (const __nv_bfloat16 *)dY, (const __nv_bfloat16 *)W2, plan, f, K,
                    0.0f, c, gb);
    ARL_CUDA_LAUNCHED(c, "grouped_glu_bwd_bf16");
}

extern "C" void arl_cuda_grouped_gemm_bf16(float *Y, const uint16_t *X, const uint16_t *W,
                                           int32_t trans_w, const arl_cuda_moe_plan *plan,
                                           int64_t N, int64_t K, float beta) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(N % 16 == 0 && K % 16 == 0);
    if (plan->T * plan->k == 0 || N == 0) return;
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)X, *wb = (const __nv_bfloat16 *)W;
    if (trans_w && c->moe_tn == ARL_CUDA_MOE_TN_WGMMA) {
        arl_cuda_grouped_bf16_wg_launch(Y, xb, wb, plan, N, K, beta, c);
    } else if (trans_w) {
        tn_launch<false>(Y, xb, wb, plan, N, K, beta, tn_glu{}, c);
    } else {
        fm_launch<FM_N>(Y, xb, wb, plan, N, K, beta, c);
    }
    ARL_CUDA_LAUNCHED(c, "grouped_gemm_bf16");
}

extern "C" int32_t arl_cuda_moe_tn_form(int32_t form) {
    ARL_ASSERT(form == ARL_CUDA_MOE_TN_MMA ||
               (form == ARL_CUDA_MOE_TN_WGMMA && arl_cuda_moe_wgmma_available()));
    return arl_cuda_swap_setting(&arl_cuda_need()->moe_tn, form);
}

/* dW_e (N, K) += dY[R_e]^T X[R_e]: block per (expert, 64x64 tile of dW), rows in order. */
__global__ void k_grouped_wgrad(float *dW, const float *dY, const float *X, arl_cuda_moe_plan P,
                                int64_t N, int64_t K) {
    __shared__ float Ys[BK][BN + 1];
    __shared__ float Xs[BK][BN + 1];
    int32_t e = blockIdx.z;
    int32_t a = P.offsets[e], b = P.offsets[e + 1];
    if (a == b) return;
    int64_t n0 = (int64_t)blockIdx.y * BN, c0 = (int64_t)blockIdx.x * BN;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int32_t r0 = a; r0 < b; r0 += BK) {
        for (int i = threadIdx.x; i < BK * BN; i += blockDim.x) {
            int rr = i / BN, j = i % BN;
            bool in = r0 + rr < b;
            Ys[rr][j] = (in && n0 + j < N) ? dY[(int64_t)(r0 + rr) * N + n0 + j] : 0.0f;
            Xs[rr][j] = (in && c0 + j < K) ? X[(int64_t)(r0 + rr) * K + c0 + j] : 0.0f;
        }
        __syncthreads();
        for (int rr = 0; rr < BK; rr++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] += Ys[rr][ty * 4 + i] * Xs[rr][tx * 4 + j];
        __syncthreads();
    }
    float *dWe = dW + (int64_t)e * N * K;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int64_t nn = n0 + ty * 4 + i, cc = c0 + tx * 4 + j;
            if (nn < N && cc < K) dWe[nn * K + cc] += acc[i][j];
        }
}

extern "C" void arl_cuda_grouped_gemm_wgrad(float *dW, const float *dY, const float *X,
                                            const arl_cuda_moe_plan *plan, int64_t N, int64_t K) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (N == 0 || K == 0) return;
    dim3 grid((unsigned)((K + BN - 1) / BN), (unsigned)((N + BN - 1) / BN), (unsigned)plan->E);
    if (c->math == ARL_CUDA_MATH_BF16 && N % 16 == 0 && K % 16 == 0) {
        fm_launch<FM_WG>(dW, dY, X, plan, N, K, 1.0f, c);
    } else {
        k_grouped_wgrad<<<grid, 256, 0, c->stream>>>(dW, dY, X, *plan, N, K);
    }
    ARL_CUDA_LAUNCHED(c, "grouped_gemm_wgrad");
}

extern "C" void arl_cuda_grouped_gemm_wgrad_bf16(float *dW, const uint16_t *dY, const uint16_t *X,
                                                 const arl_cuda_moe_plan *plan, int64_t N,
                                                 int64_t K) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (N == 0 || K == 0) return;
    fm_launch<FM_WG>(dW, (const __nv_bfloat16 *)dY, (const __nv_bfloat16 *)X, plan, N, K, 1.0f, c);
    ARL_CUDA_LAUNCHED(c, "grouped_gemm_wgrad_bf16");
}
