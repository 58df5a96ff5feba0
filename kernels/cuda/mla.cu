/* kernels/cuda/mla.cu: MLA attention on the device (kernels/cuda/ops.h, spec 4.1-4.3): the
 * expanded causal attention forward (flash-style online softmax) and backward, and the
 * absorbed decode over the latent cache.  One kernel serves both forwards: a key is the
 * concatenation of two parts ([k_nope; k_pe] or [c; k_pe]) and a query likewise.
 * Work split (fp32 kernel): one warp per (query, head); each lane scores one key of a 32-key
 * block, then the warp accumulates the value rows with lanes over the value dims (fp32
 * throughout).  Under ARL_CUDA_MATH_BF16 the expanded forward and backward run on tensor cores
 * instead (k_attn_fwd_tc, k_attn_bwd_kv_tc and k_attn_bwd_q_tc below: bf16 operands, fp32
 * accumulation and softmax). */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

#define AW 4      /* warps per block */
#define QMAX 1024 /* query width nA + nB */
#define VMAX 512  /* value width */

typedef struct attn_args {
    const float *qa, *qb; /* query parts: (Tq, Hm, nA), (Tq, Hm, nB) */
    int64_t nA, nB;
    const float *ka, *kb, *vp; /* key parts and value rows */
    int64_t ka_tok, ka_head, kb_tok, kb_head, v_tok, v_head, nv;
    float *o, *lse;    /* (Tq, Hm, nv), (Tq, Hm) */
    const int32_t *cu; /* expanded: documents; absorbed: NULL */
    int32_t N;
    int64_t Tq, Hm, pos0;
    const int64_t *pos_dev; /* absorbed: pos0 read from device memory (graph replays), or NULL */
    int32_t absorbed;
    uint32_t *k16, *v16; /* tensor-core forward: bf16 copies of the keys (Tq, Hm, DQ) and values
                          * (Tq, Hm, DV) in pairs, zero-padded (the caller's workspace), or NULL */
    float scale;
    /* absorbed, one query (Tq 1): the keys in splits of split_keys (a multiple of 32) over
     * gridDim.y blocks (splits > 1), each writing its partial softmax (Hm, splits, nv + 2: the
     * unnormalised sum, the running max, the sum of exponentials) to part, merged by
     * k_attn_merge; or splits 1 */
    int32_t splits;
    int64_t split_keys;
    float *part;
} attn_args;

/* the first token of t's document (the first key that query t sees) */
__device__ static inline int64_t first_key(const int32_t *cu, int32_t N, int64_t t) {
    return cu ? cu[arl_doc_of(cu, N, t)] : 0;
}

/* the last token of s's document (the last query that sees key s) */
__device__ static inline int64_t last_query(const int32_t *cu, int32_t N, int64_t T, int64_t s) {
    return cu ? cu[arl_doc_of(cu, N, s) + 1] - 1 : T - 1;
}

template <int U> __global__ void k_attn_fwd(attn_args A) {
    __shared__ float qs[AW][QMAX];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t item = (int64_t)blockIdx.x * AW + w;
    if (item >= A.Tq * A.Hm) return;
    const int64_t i = item / A.Hm, h = item % A.Hm;
    const int64_t nq = A.nA + A.nB;
    float *qv = qs[w];
    for (int64_t d = lane; d < nq; d += 32)
        qv[d] = d < A.nA ? A.qa[item * A.nA + d] : A.qb[item * A.nB + d - A.nA];
    __syncwarp();
    int64_t lo, hi;
    if (A.absorbed) {
        lo = 0;
        hi = (A.pos_dev ? *A.pos_dev : A.pos0) + i;
        if (A.splits > 1) { /* split y: keys [y K, (y + 1) K) (none past hi) */
            const int64_t end = hi;
            lo = (int64_t)blockIdx.y * A.split_keys;
            hi = lo + A.split_keys - 1 < end ? lo + A.split_keys - 1 : end;
        }
    } else {
        lo = first_key(A.cu, A.N, i);
        hi = i;
    }
    float m = -INFINITY, l = 0.0f, acc[U];
    for (int u = 0; u < U; u++)
        acc[u] = 0.0f;
    for (int64_t s0 = lo; s0 <= hi; s0 += 32) {
        const int64_t s = s0 + lane;
        float sc = -INFINITY;
        if (s <= hi) {
            const float *ka = A.ka + s * A.ka_tok + h * A.ka_head;
            const float *kb = A.kb + s * A.kb_tok + h * A.kb_head;
            float dot = 0.0f;
            for (int64_t d = 0; d < A.nA; d++)
                dot += qv[d] * ka[d];
            for (int64_t d = 0; d < A.nB; d++)
                dot += qv[A.nA + d] * kb[d];
            sc = dot * A.scale;
        }
        float mb = arl_warp_max(sc);
        float mn = fmaxf(m, mb);
        float corr = expf(m - mn); /* 0 on the first block (m = -inf) */
        float p = s <= hi ? expf(sc - mn) : 0.0f;
        l = l * corr + arl_warp_sum(p);
        for (int u = 0; u < U; u++)
            acc[u] *= corr;
        const int64_t nk = hi - s0 + 1 < 32 ? hi - s0 + 1 : 32;
        for (int jj = 0; jj < nk; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const float *vr = A.vp + (s0 + jj) * A.v_tok + h * A.v_head;
            for (int u = 0; u < U; u++) {
                int64_t d = lane + 32 * u;
                if (d < A.nv) acc[u] += pj * vr[d];
            }
        }
        m = mn;
    }
    if (A.splits > 1) { /* an empty split: m = -inf, l = 0, acc = 0 */
        float *pp = A.part + (item * A.splits + blockIdx.y) * (A.nv + 2);
        for (int u = 0; u < U; u++) {
            int64_t d = lane + 32 * u;
            if (d < A.nv) pp[d] = acc[u];
        }
        if (lane == 0) pp[A.nv] = m, pp[A.nv + 1] = l;
        return;
    }
    float inv = 1.0f / l;
    for (int u = 0; u < U; u++) {
        int64_t d = lane + 32 * u;
        if (d < A.nv) A.o[item * A.nv + d] = acc[u] * inv;
    }
    if (A.lse && lane == 0) A.lse[item] = m + logf(l);
}

/* The splits' partial softmaxes of (query, head) blockIdx.x (MERGE_THREADS threads, a value
 * dim each per step of MERGE_THREADS), in split order: M the largest running max, each split's
 * terms scaled by its weight exp(m - M), computed once per split into shared memory a tile of
 * MERGE_TILE splits at a time.  A split with no keys adds exact zeros, so a launch with more
 * splits than keys gives the same bits (a captured decode step, its splits fixed by the cache's
 * size, and a direct one agree). */
#define MERGE_THREADS 128
#define MERGE_TILE 256
__global__ void __launch_bounds__(MERGE_THREADS) k_attn_merge(attn_args A) {
    __shared__ float wt[MERGE_TILE];
    __shared__ float Lsum;
    const int64_t item = blockIdx.x, w = A.nv + 2;
    const float *pp = A.part + item * A.splits * w;
    float M = -INFINITY;
    for (int32_t s = 0; s < A.splits; s++)
        M = fmaxf(M, pp[s * w + A.nv]);
    float L = 0.0f, acc[VMAX / MERGE_THREADS];
    for (int u = 0; u < VMAX / MERGE_THREADS; u++)
        acc[u] = 0.0f;
    for (int32_t s0 = 0; s0 < A.splits; s0 += MERGE_TILE) {
        const int32_t ns = A.splits - s0 < MERGE_TILE ? A.splits - s0 : MERGE_TILE;
        for (int32_t s = threadIdx.x; s < ns; s += MERGE_THREADS)
            wt[s] = expf(pp[(s0 + s) * w + A.nv] - M);
        __syncthreads();
        if (threadIdx.x == 0)
            for (int32_t s = 0; s < ns; s++)
                L += pp[(s0 + s) * w + A.nv + 1] * wt[s];
        for (int u = 0; u < VMAX / MERGE_THREADS; u++) {
            const int64_t d = threadIdx.x + MERGE_THREADS * u;
            if (d < A.nv)
                for (int32_t s = 0; s < ns; s++)
                    acc[u] += pp[(s0 + s) * w + d] * wt[s];
        }
        __syncthreads(); /* the tile's weights read before the next tile's */
    }
    if (threadIdx.x == 0) Lsum = L;
    __syncthreads();
    const float inv = 1.0f / Lsum;
    for (int u = 0; u < VMAX / MERGE_THREADS; u++) {
        const int64_t d = threadIdx.x + MERGE_THREADS * u;
        if (d < A.nv) A.o[item * A.nv + d] = acc[u] * inv;
    }
    if (A.lse && threadIdx.x == 0) A.lse[item] = M + logf(Lsum);
}

/* ---- the expanded forward on tensor cores (ARL_CUDA_MATH_BF16) ----
 * Flash-attention style: a block takes 128 queries of one head (4 warps of 32 by default, or 8
 * of 16: ops.h arl_cuda_mla_fwd_rows) and walks the key tiles of TC_TK keys its queries can
 * see (documents and causality); S = Q K^T and O += P V run as mma.sync m16n8k16 with bf16
 * operands and fp32 accumulators; the online softmax (max, exp, row sums) stays in fp32
 * registers (spec 1.4).  The block's queries are rounded to bf16 into shared memory once; K
 * and V come as bf16 copies made once per call (k_bf16_copy, in the caller's workspace), each
 * tile copied asynchronously (cp.async) into one of two shared buffers while the products of
 * the tile before run; rows padded by 16 bytes, so that the Q A fragments and K B fragments
 * (ldmatrix of query and key rows) and the V ones (ldmatrix.trans of row-major value tiles) are
 * free of bank conflicts; the S accumulators are repacked as the A fragments of P V without
 * leaving registers.  Rows padded to DQ (qk width) and DV (value width) are zero. Fragment
 * layout: internal.cuh arl_mma_bf16 (g = lane / 4, t = lane % 4 below). */
#define TC_TK 64

__device__ static inline uint32_t tc_bf16_bits(float f) { /* round to nearest even */
    uint32_t u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ static inline uint32_t tc_pack(float lo, float hi) {
    return tc_bf16_bits(lo) | (tc_bf16_bits(hi) << 16);
}

/* the A fragment (16 x 16, rows g and g + 8) made of the accumulators x[2 kc], x[2 kc + 1]
 * (two n8 tiles of C layout) rounded to bf16: scores or their gradients as a product's A */
template <int N>
__device__ static inline void tc_pack_a(uint32_t (&pa)[4], const float (&x)[N][4], int kc) {
    pa[0] = tc_pack(x[2 * kc][0], x[2 * kc][1]);
    pa[1] = tc_pack(x[2 * kc][2], x[2 * kc][3]);
    pa[2] = tc_pack(x[2 * kc + 1][0], x[2 * kc + 1][1]);
    pa[3] = tc_pack(x[2 * kc + 1][2], x[2 * kc + 1][3]);
}

/* c[i][2 p], c[i][2 p + 1] += a[i] B_p for i < MT, p < NT / 2: the B fragments of n8 tiles
 * 2 p and 2 p + 1 by one ldmatrix.x4 (TRANS: .trans) of the lane's row at brow + p step
 * (32-bit words), each used by the MT row tiles of a */
template <bool TRANS, int MT, int NT>
__device__ static inline void tc_mma_rows(float (&c)[MT][NT][4], const uint32_t (&a)[MT][4],
                                          const uint32_t *brow, int step) {
#pragma unroll
    for (int p = 0; p < NT / 2; p++) {
        uint32_t b[2][2];
        arl_ldm_b_pair<TRANS>(b, 0, brow + p * step);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            arl_mma_bf16(c[i][2 * p], a[i], b[0][0], b[0][1]);
            arl_mma_bf16(c[i][2 * p + 1], a[i], b[1][0], b[1][1]);
        }
    }
}

/* the same for one row tile: c[2 p], c[2 p + 1] += a B_p */
template <bool TRANS, int NT>
__device__ static inline void tc_mma_pairs(float (&c)[NT][4], const uint32_t (&a)[4],
                                           const uint32_t *brow, int step) {
    tc_mma_rows<TRANS, 1, NT>(reinterpret_cast<float(&)[1][NT][4]>(c),
                              reinterpret_cast<const uint32_t(&)[1][4]>(a), brow, step);
}

/* A token-major tensor of two parts [a | b] per head (widths na, nb): element (tok, col) of
 * head h is a[tok a_tok + h a_head + col] for col < na, else b[tok b_tok + h b_head + col - na]
 * (keys [k_nope | k_pe]: k_pe shared by the heads, b_head 0; one part: nb 0). */
typedef struct tok_src {
    const float *a, *b;
    int64_t a_tok, a_head, na, b_tok, b_head, nb;
} tok_src;

/* The bf16 copy the tensor-core kernels read: dst (T, Hm, w / 2) bf16 pairs, rounded to
 * nearest even as the products take them, zero past na + nb; one thread per pair. */
__global__ void k_bf16_copy(uint32_t *dst, tok_src S, int64_t T, int64_t Hm, int w) {
    const int64_t pairs = w / 2, nq = S.na + S.nb;
    ARL_GRID_STRIDE(i, T * Hm * pairs) {
        const int64_t th = i / pairs, p = i % pairs, s = th / Hm, h = th % Hm;
        float x[2];
        for (int e = 0; e < 2; e++) {
            const int64_t col = 2 * p + e;
            x[e] = col < S.na ? S.a[s * S.a_tok + h * S.a_head + col]
                   : col < nq ? S.b[s * S.b_tok + h * S.b_head + col - S.na]
                              : 0.0f;
        }
        dst[i] = tc_pack(x[0], x[1]);
    }
}
static void bf16_copy(uint32_t *dst, const tok_src &S, int64_t T, int64_t Hm, int w,
                      arl_cuda_ctx *c) {
    k_bf16_copy<<<arl_blocks(T * Hm * w / 2, 256), 256, 0, c->stream>>>(dst, S, T, Hm, w);
}

/* Rows tok0 .. tok0 + R - 1 of head h of a bf16 copy (T, Hm, W / 2 pairs) into a shared tile
 * of row stride W / 2 + 4 pairs (16 bytes of padding: the 8 rows of an ldmatrix phase in
 * distinct banks), 16 bytes per cp.async, rows from `end` on zero.  The caller commits. */
template <int R, int W>
__device__ static inline void tile_copy16(uint32_t *dst, const uint32_t *src, int64_t tok0,
                                          int64_t end, int64_t Hm, int64_t h) {
    for (int idx = threadIdx.x; idx < R * (W / 8); idx += blockDim.x) {
        const int j = idx / (W / 8), c = idx % (W / 8);
        const bool ok = tok0 + j < end;
        cp_async16(dst + j * (W / 2 + 4) + c * 4,
                   src + ((ok ? tok0 + j : 0) * Hm + h) * (W / 2) + c * 4, ok);
    }
}

/* element (row, col) of the concatenated query [qa | qb] of head h, 0 outside */
__device__ static inline float tc_q(const attn_args &A, int64_t row, int64_t col, int64_t h) {
    if (row >= A.Tq || col >= A.nA + A.nB) return 0.0f;
    const int64_t item = row * A.Hm + h;
    return col < A.nA ? A.qa[item * A.nA + col] : A.qb[item * A.nB + col - A.nA];
}

/* DQ, DV: the padded query / value widths; WARPS warps of MT row tiles (16 queries) each.
 * MT 2 (the default, 4 warps): every K and V fragment a warp takes from shared memory serves
 * 32 queries, half the shared-memory reads per product of MT 1 (FlashAttention-2's warp tile),
 * at the price of registers: the query fragments are read again for each key tile instead of
 * held.  MT 1 (8 warps): the previous form, the query fragments held in registers.  The
 * block's queries are staged in shared memory as bf16 either way. */
template <int DQ, int DV, int WARPS, int MT>
__global__ void __launch_bounds__(32 * WARPS) k_attn_fwd_tc(attn_args A) {
    constexpr int TQ = 16 * MT * WARPS;                 /* the block's queries */
    constexpr int KT = MT == 1 ? TC_TK : TC_TK / 2;     /* keys a softmax step */
    constexpr int KW = (DQ + 8) / 2, VW = (DV + 8) / 2; /* row lengths in bf16 pairs */
    constexpr bool QREG = MT == 1;                      /* the query fragments held in registers */
    extern __shared__ float sm[];
    /* the block's queries (TQ, DQ + 8) bf16, then two buffers of a key tile (TC_TK, DQ + 8)
     * and a value tile (TC_TK, DV + 8) */
    uint32_t *const qs = reinterpret_cast<uint32_t *>(sm);
    uint32_t *const tiles = qs + TQ * KW;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t nqb = (A.Tq + TQ - 1) / TQ;
    const int64_t q0 = (nqb - 1 - (int64_t)blockIdx.x) * TQ; /* longest rows first */
    const int64_t h = blockIdx.y;
    const int64_t wr0 = q0 + 16 * MT * w; /* the warp's first row */
    /* this thread's rows wr0 + 16 i / 2 + g + 8 (i % 2) see keys lo[i] .. hi[i] (positions
     * in 32 bits, the launch checks Tq: registers are what bounds this kernel) */
    int32_t lo[2 * MT], hi[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        const int64_t r = wr0 + 16 * (i / 2) + g + 8 * (i % 2);
        lo[i] = (int32_t)(r < A.Tq ? first_key(A.cu, A.N, r) : A.Tq);
        hi[i] = (int32_t)(r < A.Tq ? r : -1);
    }
    const int64_t blk_hi = q0 + TQ - 1 < A.Tq - 1 ? q0 + TQ - 1 : A.Tq - 1;
    const int64_t blk_lo = first_key(A.cu, A.N, q0) / TC_TK * TC_TK;
    const int64_t w_last = wr0 + 16 * MT - 1; /* the warp's last row */
    const int64_t w_hi = w_last < A.Tq - 1 ? w_last : A.Tq - 1;
    const int64_t w_lo = wr0 < A.Tq ? first_key(A.cu, A.N, wr0) : A.Tq;
    /* a tile wholly at or after this first key and before the warp's first row is seen by all
     * its rows (the first key never decreases with the row): no per-score mask there */
    const int64_t w_lo_all = w_last < A.Tq ? first_key(A.cu, A.N, w_last) : A.Tq;
    const float sl2 = A.scale * 1.4426950408889634f; /* scores in log2 units */

    /* the bf16 key and value rows of the tile from s0 into buffer buf, asynchronously: zeros
     * past the block's last key (the copies' padded widths are zero already) */
    const auto issue = [&](int64_t s0, int buf) {
        uint32_t *ks = tiles + buf * TC_TK * (KW + VW);
        tile_copy16<TC_TK, DQ>(ks, A.k16, s0, blk_hi + 1, A.Hm, h);
        tile_copy16<TC_TK, DV>(ks + TC_TK * KW, A.v16, s0, blk_hi + 1, A.Hm, h);
        cp_async_commit();
    };
    issue(blk_lo, 0);
    /* the queries rounded to bf16 under the first tile's copy; zero past Tq and nA + nB */
    for (int idx = threadIdx.x; idx < TQ * (DQ / 2); idx += blockDim.x) {
        const int j = idx / (DQ / 2), c = 2 * (idx % (DQ / 2));
        qs[j * KW + c / 2] = tc_pack(tc_q(A, q0 + j, c, h), tc_q(A, q0 + j, c + 1, h));
    }
    __syncthreads();
    /* the lane's ldmatrix row of the warp's row tile 0; tile i is 16 i KW words on */
    const uint32_t *qrow =
        qs + (16 * MT * w + arl_ldm_row_a(lane)) * KW + arl_ldm_chunk_a(lane) * 4;
    uint32_t qf[QREG ? DQ / 16 : 1][4];
    if (QREG)
#pragma unroll
        for (int kc = 0; kc < DQ / 16; kc++)
            arl_ldmatrix_x4(qf[kc], qrow + kc * 8);
    float o[MT][DV / 8][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < DV / 8; j++)
            o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;
    float m[2 * MT], l[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; i++)
        m[i] = -INFINITY, l[i] = 0.0f;

    for (int64_t s0 = blk_lo, it = 0; s0 <= blk_hi; s0 += TC_TK, it++) {
        cp_async_wait0();
        __syncthreads(); /* the tile landed; the other buffer's products (tile it - 1) are done */
        if (s0 + TC_TK <= blk_hi) issue(s0 + TC_TK, (int)((it + 1) & 1)); /* under these products */
            /* the tile's keys KT at a time: S, its softmax and P V for KT keys before the next */
#pragma unroll
        for (int sub = 0; sub < TC_TK / KT; sub++) {
            const int64_t s1 = s0 + sub * KT;
            if (s1 > w_hi || s1 + KT - 1 < w_lo) continue; /* no row of this warp sees these keys */
            const uint32_t *ks = tiles + (it & 1) * TC_TK * (KW + VW) + sub * KT * KW,
                           *vs = tiles + (it & 1) * TC_TK * (KW + VW) + TC_TK * KW + sub * KT * VW;
            float sc[MT][KT / 8][4] = {}; /* S = Q K^T: key rows, two n8 tiles per ldmatrix */
            const uint32_t *krow = ks + arl_ldm_row_b(lane) * KW + arl_ldm_chunk_b(lane) * 4;
#pragma unroll
            for (int kc = 0; kc < DQ / 16; kc++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (QREG)
                        a[i][0] = qf[kc][0], a[i][1] = qf[kc][1], a[i][2] = qf[kc][2],
                        a[i][3] = qf[kc][3];
                    else
                        arl_ldmatrix_x4(a[i], qrow + i * 16 * KW + kc * 8);
                tc_mma_rows<false>(sc, a, krow + kc * 8, 16 * KW);
            }
            float mx[2 * MT];
#pragma unroll
            for (int i = 0; i < 2 * MT; i++)
                mx[i] = m[i];
            /* scores in log2 units, masked (-inf) where a row does not see the key unless the
             * whole tile is visible to the warp (full: one copy of the loop without the tests) */
            const auto scale_mask = [&](bool full) {
#pragma unroll
                for (int i = 0; i < 2 * MT; i++)
#pragma unroll
                    for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const int32_t s = (int32_t)s1 + nt * 8 + 2 * t + j;
                            float &x = sc[i / 2][nt][2 * (i % 2) + j];
                            x = full || (s >= lo[i] && s <= hi[i]) ? x * sl2 : -INFINITY;
                            mx[i] = fmaxf(mx[i], x);
                        }
            };
            if (s1 >= w_lo_all && s1 + KT - 1 <= wr0)
                scale_mask(true);
            else
                scale_mask(false);
#pragma unroll
            for (int i = 0; i < 2 * MT; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                const float b = mx[i] == -INFINITY ? 0.0f : mx[i];
                const float c = exp2f(m[i] - b); /* 0 while m = -inf */
                m[i] = mx[i];
                float ps = 0.0f;
#pragma unroll
                for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float &x = sc[i / 2][nt][2 * (i % 2) + j];
                        x = exp2f(x - b);
                        ps += x;
                    }
                l[i] = l[i] * c + ps;
#pragma unroll
                for (int j = 0; j < DV / 8; j++) {
                    o[i / 2][j][2 * (i % 2)] *= c;
                    o[i / 2][j][2 * (i % 2) + 1] *= c;
                }
            }
            /* O += P V: value rows are the sum's keys, two n8 tiles per ldmatrix.trans, each
             * serving the MT row tiles */
            const uint32_t *vrow = vs + arl_ldm_row_a(lane) * VW + arl_ldm_chunk_a(lane) * 4;
#pragma unroll
            for (int kc = 0; kc < KT / 16; kc++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int i = 0; i < MT; i++)
                    tc_pack_a(pa[i], sc[i], kc);
                tc_mma_rows<true>(o, pa, vrow + kc * 16 * VW, 8);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int64_t r = wr0 + 16 * (i / 2) + g + 8 * (i % 2);
        if (r >= A.Tq) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
        for (int j = 0; j < DV / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t d = j * 8 + 2 * t + e;
                if (d < A.nv) A.o[(r * A.Hm + h) * A.nv + d] = o[i / 2][j][2 * (i % 2) + e] * inv;
            }
        if (A.lse && t == 0) /* natural-log units: (m + log2 l) ln 2 */
            A.lse[r * A.Hm + h] = (m[i] + log2f(l[i])) * 0.6931471805599453f;
    }
}

/* The tensor-core forward's widths for a query width nq and value width nv (padded to the
 * kernels' instances), or 0 when they do not fit (qk <= 192, values <= 128, even widths). */
static int tc_dq(int64_t nA, int64_t nB) {
    const int64_t nq = nA + nB;
    if (nq > 192 || (nA & 1) || (nB & 1)) return 0;
    return nq <= 64 ? 64 : nq <= 96 ? 96 : nq <= 128 ? 128 : 192;
}
static int tc_dv(int64_t nv) {
    if (nv > 128 || (nv & 1)) return 0;
    return nv <= 64 ? 64 : 128;
}

/* one launch of the tensor-core forward k_attn_fwd_tc<dq, dv, warps, mt>: warps x mt x 16
 * queries per block, the block's bf16 queries and two buffers of bf16 key and value tiles in
 * dynamic shared memory */
static void tc_launch(void (*kern)(attn_args), int dq, int dv, int warps, int mt,
                      const attn_args *A, arl_cuda_ctx *c) {
    const int tq = 16 * mt * warps;
    const int bytes = 2 * tq * (dq + 8) + 2 * 2 * TC_TK * (dq + 8 + dv + 8);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    kern<<<dim3((unsigned)((A->Tq + tq - 1) / tq), (unsigned)A->Hm), (unsigned)(32 * warps),
           (size_t)bytes, c->stream>>>(*A);
}

/* The tensor-core forward when the context computes in bf16, the widths fit and the caller
 * gave the workspace for the bf16 copies; returns 0 to leave the call to the fp32 kernel. */
static int attn_launch_tc(const attn_args *A, arl_cuda_ctx *c, const char *name) {
    const int dq = tc_dq(A->nA, A->nB), dv = tc_dv(A->nv);
    if (c->math != ARL_CUDA_MATH_BF16 || A->absorbed || !dq || !dv || !A->k16 ||
        A->Tq > INT32_MAX - 2 * TC_TK)
        return 0;
    bf16_copy(A->k16, {A->ka, A->kb, A->ka_tok, A->ka_head, A->nA, A->kb_tok, A->kb_head, A->nB},
              A->Tq, A->Hm, dq, c);
    bf16_copy(A->v16, {A->vp, A->vp, A->v_tok, A->v_head, A->nv, 0, 0, 0}, A->Tq, A->Hm, dv, c);
    /* 128 queries per block: 4 warps of 32 (the default) or 8 of 16 (the H200 ran the mini
     * shape at 25.9 TFLOP/s with 8 warps of 16 and 14.8 with 4 warps of 16 in session 6,
     * before the asynchronous stage; 32-query warps have not been timed yet) */
    const int rows32 = c->mla_fwd_rows == ARL_CUDA_MLA_FWD_ROWS32;
#define TC_LAUNCH(Q, V)                                                                            \
    if (dq == Q && dv == V) {                                                                      \
        if (rows32)                                                                                \
            tc_launch(k_attn_fwd_tc<Q, V, 4, 2>, Q, V, 4, 2, A, c);                                \
        else                                                                                       \
            tc_launch(k_attn_fwd_tc<Q, V, 8, 1>, Q, V, 8, 1, A, c);                                \
    }
    TC_LAUNCH(64, 64);
    TC_LAUNCH(64, 128);
    TC_LAUNCH(96, 64);
    TC_LAUNCH(96, 128);
    TC_LAUNCH(128, 64);
    TC_LAUNCH(128, 128);
    TC_LAUNCH(192, 64);
    TC_LAUNCH(192, 128);
#undef TC_LAUNCH
    ARL_CUDA_LAUNCHED(c, name);
    return 1;
}

extern "C" int32_t arl_cuda_mla_fwd_rows(int32_t rows) {
    ARL_ASSERT(rows == ARL_CUDA_MLA_FWD_ROWS32 || rows == ARL_CUDA_MLA_FWD_ROWS16);
    return arl_cuda_swap_setting(&arl_cuda_need()->mla_fwd_rows, rows);
}

extern "C" int32_t arl_cuda_mla_split_keys(int32_t keys) {
    ARL_ASSERT(keys >= 0 && keys % 32 == 0);
    return arl_cuda_swap_setting(&arl_cuda_need()->mla_split_keys, keys);
}

/* keys a split (the context's setting; no context yet: the default) */
static int64_t split_keys(const arl_cuda_ctx *c) {
    return c && c->mla_split_keys > 0 ? c->mla_split_keys : ARL_CUDA_MLA_SPLIT_KEYS;
}

/* splits of K keys over max_keys keys (gridDim.y) */
static int64_t split_count(int64_t max_keys, int64_t K) {
    const int64_t s = (max_keys + K - 1) / K;
    return s > 65535 ? 65535 : s;
}

extern "C" int64_t arl_cuda_mla_absorbed_ws_floats(int64_t max_rows, int64_t Hm, int64_t rkv) {
    const int64_t s = split_count(max_rows, split_keys(arl_cuda_current()));
    return s > 1 ? Hm * s * (rkv + 2) : 0;
}

/* One query's splits over at most max_keys keys (ws NULL or Tq > 1: 1). */
static void attn_split(attn_args *A, int64_t max_keys, float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    A->split_keys = split_keys(c);
    A->splits = ws && A->Tq == 1 ? (int32_t)split_count(max_keys, A->split_keys) : 1;
    ARL_ASSERT(A->split_keys % 32 == 0 && (A->splits == 1 || max_keys <= 65535 * A->split_keys));
    A->part = ws;
}

static void attn_launch(const attn_args *A, const char *name) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(A->nA + A->nB <= QMAX && A->nv <= VMAX && A->nv >= 1);
    int64_t items = A->Tq * A->Hm;
    if (items == 0) return;
    if (attn_launch_tc(A, c, name)) return;
    const dim3 grid((unsigned)((items + AW - 1) / AW), (unsigned)(A->splits > 1 ? A->splits : 1));
    if (A->nv <= 64)
        k_attn_fwd<2><<<grid, 32 * AW, 0, c->stream>>>(*A);
    else if (A->nv <= 128)
        k_attn_fwd<4><<<grid, 32 * AW, 0, c->stream>>>(*A);
    else if (A->nv <= 256)
        k_attn_fwd<8><<<grid, 32 * AW, 0, c->stream>>>(*A);
    else
        k_attn_fwd<16><<<grid, 32 * AW, 0, c->stream>>>(*A);
    if (A->splits > 1) k_attn_merge<<<(unsigned)items, MERGE_THREADS, 0, c->stream>>>(*A);
    ARL_CUDA_LAUNCHED(c, name);
}

extern "C" int64_t arl_cuda_mla_attn_fwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r,
                                                   int64_t vm) {
    const int dq = tc_dq(n, r), dv = tc_dv(vm);
    return dq && dv ? T * Hm * (dq + dv) / 2 : 0;
}

extern "C" void arl_cuda_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                                      const float *k_nope, const float *k_pe, const float *v,
                                      const int32_t *cu, int32_t N, int64_t T, int64_t Hm,
                                      int64_t n, int64_t r, int64_t vm, float scale, float *ws) {
    attn_args A = {};
    if (ws && arl_cuda_mla_attn_fwd_ws_floats(T, Hm, n, r, vm)) {
        A.k16 = reinterpret_cast<uint32_t *>(ws);
        A.v16 = A.k16 + T * Hm * tc_dq(n, r) / 2;
    }
    A.qa = q_nope;
    A.qb = q_pe;
    A.nA = n;
    A.nB = r;
    A.ka = k_nope;
    A.ka_tok = Hm * n;
    A.ka_head = n;
    A.kb = k_pe;
    A.kb_tok = r;
    A.kb_head = 0;
    A.vp = v;
    A.v_tok = Hm * vm;
    A.v_head = vm;
    A.nv = vm;
    A.o = o;
    A.lse = lse;
    A.cu = cu;
    A.N = N;
    A.Tq = T;
    A.Hm = Hm;
    A.scale = scale;
    attn_launch(&A, "mla_attn_fwd");
}

/* The launch arguments of the absorbed attention of Tq queries over one cache (rows
 * [c; k_pe] of rkv + r floats): queries [qhat; q_pe], values the c part. */
static attn_args absorbed_args(float *ohat, const float *qhat, const float *q_pe,
                               const float *cache, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                               float scale) {
    attn_args A = {};
    A.qa = qhat;
    A.qb = q_pe;
    A.nA = rkv;
    A.nB = r;
    A.ka = cache;
    A.ka_tok = rkv + r;
    A.kb = cache + rkv;
    A.kb_tok = rkv + r;
    A.vp = cache;
    A.v_tok = rkv + r;
    A.nv = rkv;
    A.o = ohat;
    A.Tq = Tq;
    A.Hm = Hm;
    A.absorbed = 1;
    A.N = 1;
    A.scale = scale;
    return A;
}

extern "C" void arl_cuda_mla_absorbed_attn(float *ohat, const float *qhat, const float *q_pe,
                                           const float *cache, int64_t pos0, int64_t Tq, int64_t Hm,
                                           int64_t rkv, int64_t r, float scale, float *ws) {
    attn_args A = absorbed_args(ohat, qhat, q_pe, cache, Tq, Hm, rkv, r, scale);
    A.pos0 = pos0;
    attn_split(&A, pos0 + Tq, ws);
    attn_launch(&A, "mla_absorbed_attn");
}

/* The same with pos0 read from device memory when the kernel runs, so that a captured CUDA
 * graph replays correctly while the position advances. */
extern "C" void arl_cuda_mla_absorbed_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                                const float *cache, const int64_t *pos_dev,
                                                int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                                                float scale, int64_t max_rows, float *ws) {
    attn_args A = absorbed_args(ohat, qhat, q_pe, cache, Tq, Hm, rkv, r, scale);
    A.pos_dev = pos_dev;
    attn_split(&A, max_rows, ws);
    attn_launch(&A, "mla_absorbed_attn_dpos");
}

/* ======================= backward (expanded form, spec 4.3) ============================== */

#define BQ 256 /* n + r and vm limit of the backward kernels */

/* The bf16 copies of q, k, v and dO the tensor-core backward reads (when the widths fit),
 * then dk_pe per head (T, Hm, r) and D (T, Hm). */
extern "C" int64_t arl_cuda_mla_attn_bwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r,
                                                   int64_t vm) {
    const int dq = tc_dq(n, r), dv = tc_dv(vm);
    return (dq && dv ? T * Hm * (dq + dv) : 0) + T * Hm * r + T * Hm;
}

/* D[t, h] = dO . O */
__global__ void k_attn_delta(float *D, const float *d_o, const float *o, int64_t items,
                             int64_t vm) {
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * AW + (threadIdx.x >> 5);
    if (item >= items) return;
    float acc = 0.0f;
    for (int64_t d = lane; d < vm; d += 32)
        acc += d_o[item * vm + d] * o[item * vm + d];
    acc = arl_warp_sum(acc);
    if (lane == 0) D[item] = acc;
}

typedef struct bwd_args {
    const float *q_nope, *q_pe, *k_nope, *k_pe, *v, *d_o, *lse, *D;
    float *dq_nope, *dq_pe, *dk_nope, *dk_pe_h, *dv;
    uint32_t *q16, *k16, *v16, *g16; /* tensor cores: bf16 copies (T, Hm, DQ or DV) of q, k,
                                      * v, dO in the workspace */
    const int32_t *cu;
    int32_t N;
    int64_t T, Hm, n, r, vm;
    float scale;
} bwd_args;

/* score(t, s) and dp(t, s) = dO_t . v_s for one head. */
__device__ static inline void pair_terms(const bwd_args &B, int64_t t, int64_t s, int64_t h,
                                         float *p, float *dz) {
    const float *qn = B.q_nope + (t * B.Hm + h) * B.n, *qp = B.q_pe + (t * B.Hm + h) * B.r;
    const float *kn = B.k_nope + (s * B.Hm + h) * B.n, *kp = B.k_pe + s * B.r;
    float dot = 0.0f;
    for (int64_t d = 0; d < B.n; d++)
        dot += qn[d] * kn[d];
    for (int64_t d = 0; d < B.r; d++)
        dot += qp[d] * kp[d];
    float pv = expf(dot * B.scale - B.lse[t * B.Hm + h]);
    const float *g = B.d_o + (t * B.Hm + h) * B.vm, *vr = B.v + (s * B.Hm + h) * B.vm;
    float dp = 0.0f;
    for (int64_t d = 0; d < B.vm; d++)
        dp += g[d] * vr[d];
    *p = pv;
    *dz = pv * (dp - B.D[t * B.Hm + h]);
}

/* dq (one warp per (t, h)): dq = scale sum_s dz(t, s) k_s. */
__global__ void k_attn_bwd_q(bwd_args B) {
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * AW + (threadIdx.x >> 5);
    if (item >= B.T * B.Hm) return;
    const int64_t t = item / B.Hm, h = item % B.Hm, nq = B.n + B.r;
    const int64_t lo = first_key(B.cu, B.N, t);
    float acc[BQ / 32];
    for (int u = 0; u < BQ / 32; u++)
        acc[u] = 0.0f;
    for (int64_t s0 = lo; s0 <= t; s0 += 32) {
        const int64_t s = s0 + lane;
        float p = 0.0f, dz = 0.0f;
        if (s <= t) pair_terms(B, t, s, h, &p, &dz);
        const int64_t nk = t - s0 + 1 < 32 ? t - s0 + 1 : 32;
        for (int jj = 0; jj < nk; jj++) {
            float z = __shfl_sync(0xffffffffu, dz, jj);
            const int64_t sj = s0 + jj;
            for (int u = 0; u < BQ / 32; u++) {
                int64_t d = lane + 32 * u;
                if (d < B.n)
                    acc[u] += z * B.k_nope[(sj * B.Hm + h) * B.n + d];
                else if (d < nq)
                    acc[u] += z * B.k_pe[sj * B.r + d - B.n];
            }
        }
    }
    for (int u = 0; u < BQ / 32; u++) {
        int64_t d = lane + 32 * u;
        if (d < B.n)
            B.dq_nope[item * B.n + d] += B.scale * acc[u];
        else if (d < nq)
            B.dq_pe[item * B.r + d - B.n] += B.scale * acc[u];
    }
}

/* dk, dv (one warp per (s, h)): dv_s = sum_t p dO_t; dk_s = scale sum_t dz q_t, t >= s in the
 * document.  The k_pe part goes to dk_pe_h (T, Hm, r), summed over heads afterwards. */
__global__ void k_attn_bwd_kv(bwd_args B) {
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * AW + (threadIdx.x >> 5);
    if (item >= B.T * B.Hm) return;
    const int64_t s = item / B.Hm, h = item % B.Hm, nq = B.n + B.r;
    const int64_t hi = last_query(B.cu, B.N, B.T, s);
    float ak[BQ / 32], av[BQ / 32];
    for (int u = 0; u < BQ / 32; u++)
        ak[u] = av[u] = 0.0f;
    for (int64_t t0 = s; t0 <= hi; t0 += 32) {
        const int64_t t = t0 + lane;
        float p = 0.0f, dz = 0.0f;
        if (t <= hi) pair_terms(B, t, s, h, &p, &dz);
        const int64_t nt = hi - t0 + 1 < 32 ? hi - t0 + 1 : 32;
        for (int jj = 0; jj < nt; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj), z = __shfl_sync(0xffffffffu, dz, jj);
            const int64_t tj = t0 + jj;
            for (int u = 0; u < BQ / 32; u++) {
                int64_t d = lane + 32 * u;
                if (d < B.vm) av[u] += pj * B.d_o[(tj * B.Hm + h) * B.vm + d];
                if (d < B.n)
                    ak[u] += z * B.q_nope[(tj * B.Hm + h) * B.n + d];
                else if (d < nq)
                    ak[u] += z * B.q_pe[(tj * B.Hm + h) * B.r + d - B.n];
            }
        }
    }
    for (int u = 0; u < BQ / 32; u++) {
        int64_t d = lane + 32 * u;
        if (d < B.vm) B.dv[item * B.vm + d] += av[u];
        if (d < B.n)
            B.dk_nope[item * B.n + d] += B.scale * ak[u];
        else if (d < nq)
            B.dk_pe_h[item * B.r + d - B.n] = B.scale * ak[u];
    }
}

__global__ void k_sum_heads(float *dk_pe, const float *per_head, int64_t T, int64_t Hm, int64_t r) {
    ARL_GRID_STRIDE(i, T * r) {
        int64_t t = i / r, d = i % r;
        float acc = 0.0f;
        for (int64_t h = 0; h < Hm; h++)
            acc += per_head[(t * Hm + h) * r + d];
        dk_pe[i] += acc;
    }
}

/* ---- the expanded backward on tensor cores (ARL_CUDA_MATH_BF16) ----
 * FlashAttention-2's backward, split in two kernels so that no gradient is summed by atomics
 * (the same bits on every run): k_attn_bwd_kv_tc owns 64 keys of one head (16 per warp) and
 * walks the query tiles that see them, accumulating dV = P^T dO and dK = dS^T Q in
 * registers; k_attn_bwd_q_tc owns 64 queries (16 per warp) and walks their key tiles,
 * accumulating dQ = dS K.  Both recompute S = Q K^T and dP = dO V^T on tensor cores (bf16
 * operands, fp32 accumulators), then P = exp(S scale - lse) from the forward's lse and
 * dS = P (dP - D) in fp32 (spec 1.4: softmax statistics in fp32); P and dS are rounded to bf16
 * as the A operands of the products that follow, repacked from the accumulators in registers
 * as in the forward.  The operands come as bf16 copies of q, k, v and dO made once per call
 * (k_bf16_copy, into the workspace), so a tile is copied straight into shared memory
 * (tile_copy16): the block's own rows once, the walked tiles through two buffers, the next
 * tile's copy in flight under this one's products.  Every tile is row-major (tokens the rows);
 * where a product sums over a tile's tokens (P^T dO, dS^T Q, dS K) its B fragments come by
 * ldmatrix.trans, elsewhere by ldmatrix.  The masks are the forward's: key s is seen by
 * queries s .. the end of its document. */
#define BW_ROWS 64 /* keys (kv kernel) or queries (q kernel) per block: 4 warps of 16 */

template <int N> __device__ static inline void bw_zero(float (&c)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
        c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
}

/* this thread's rows r0, r1 (r1 = r0 + 8; those from T on skipped) of (16 rows, DQ)
 * accumulators of head h, times scale, into the parts [nope | pe] (n, r wide): nope gets +=,
 * pe += or, with pe_set, = */
template <int DQ>
__device__ static inline void bw_store_qk(const float (&acc)[DQ / 8][4], int64_t r0, int64_t h,
                                          const bwd_args &B, float *nope, float *pe, bool pe_set) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < DQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int64_t d = j * 8 + 2 * t + e;
            if (d >= B.n + B.r) continue;
            for (int half = 0; half < 2; half++) {
                const int64_t row = r0 + 8 * half;
                const float x = B.scale * acc[j][2 * half + e];
                if (row >= B.T) continue;
                if (d < B.n)
                    nope[(row * B.Hm + h) * B.n + d] += x;
                else if (pe_set)
                    pe[(row * B.Hm + h) * B.r + d - B.n] = x;
                else
                    pe[(row * B.Hm + h) * B.r + d - B.n] += x;
            }
        }
}

/* c[nt] += A B^T, K = 16 KC: A the warp's 16 rows at a, B the 8 NT rows at b (row-major
 * tiles, row strides sa and sb words); A fragments by ldmatrix (map A), two n8 tiles of B per
 * ldmatrix (map B) */
template <int KC, int NT>
__device__ static inline void bw_mma_rows(float (&c)[NT][4], const uint32_t *a, int sa,
                                          const uint32_t *b, int sb) {
    const int lane = threadIdx.x & 31;
    const uint32_t *arow = a + arl_ldm_row_a(lane) * sa + arl_ldm_chunk_a(lane) * 4;
    const uint32_t *brow = b + arl_ldm_row_b(lane) * sb + arl_ldm_chunk_b(lane) * 4;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t af[4];
        arl_ldmatrix_x4(af, arow + kc * 8);
        tc_mma_pairs<false>(c, af, brow + kc * 8, 16 * sb);
    }
}

/* the score and dP products of a warp's 16 rows, from zero: x = A1 B1^T over the qk width
 * (row-major tiles a1, b1 of DQ), y = A2 B2^T over the value width (a2, b2 of DV) */
template <int DQ, int DV, int NT>
__device__ static inline void bw_products(float (&x)[NT][4], float (&y)[NT][4], const uint32_t *a1,
                                          const uint32_t *b1, const uint32_t *a2,
                                          const uint32_t *b2) {
    bw_zero(x);
    bw_zero(y);
    bw_mma_rows<DQ / 16, NT>(x, a1, DQ / 2 + 4, b1, DQ / 2 + 4);
    bw_mma_rows<DV / 16, NT>(y, a2, DV / 2 + 4, b2, DV / 2 + 4);
}

/* c[j] += X B: X (16 x 16 KC, accumulators x[2 KC][4] rounded to bf16 A fragments), B the
 * 16 KC rows at b (row-major, stride sb words: its rows are the sum's index, so two n8 tiles
 * per ldmatrix.trans, map A) */
template <int KC, int NJ>
__device__ static inline void bw_mma_acc(float (&c)[NJ][4], const float (&x)[2 * KC][4],
                                         const uint32_t *b, int sb) {
    const int lane = threadIdx.x & 31;
    const uint32_t *brow = b + arl_ldm_row_a(lane) * sb + arl_ldm_chunk_a(lane) * 4;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t pa[4];
        tc_pack_a(pa, x, kc);
        tc_mma_pairs<true>(c, pa, brow + kc * 16 * sb, 8);
    }
}

/* The dynamic shared memory of a backward kernel, in 32-bit words: the block's own 64 rows at
 * the qk and value widths (bf16 pairs, row strides SQ, SV: tile_copy16's), then two buffers of
 * the walked tile: its NW rows of both widths and, with KV (the kv kernel), two floats per
 * walked row (lse, D).  The kernels carve it and the launch sizes it from here. */
template <int DQ, int DV, int NW, bool KV> struct bw_smem {
    static constexpr int SQ = DQ / 2 + 4, SV = DV / 2 + 4;
    static constexpr int own_q = 0, own_v = own_q + BW_ROWS * SQ, walk = own_v + BW_ROWS * SV;
    static constexpr int walk_v = NW * SQ, stats = walk_v + NW * SV; /* within a buffer */
    static constexpr int buf = stats + (KV ? 2 * NW : 0), words = walk + 2 * buf;
};

/* dK, dV of 64 keys of head blockIdx.y; the query tiles of QT from the first key to the end
 * of the last key's document.  dk_nope and dv get +=, dk_pe_h (T, Hm, r) the head's share. */
template <int DQ, int DV, int QT>
__global__ void __launch_bounds__(128) k_attn_bwd_kv_tc(bwd_args B) {
    typedef bw_smem<DQ, DV, QT, true> L;
    constexpr int SQ = L::SQ, SV = L::SV;
    extern __shared__ float sm[];
    uint32_t *const u = (uint32_t *)sm;
    const uint32_t *ks = u + L::own_q; /* (64 keys, DQ) */
    const uint32_t *vs = u + L::own_v; /* (64 keys, DV) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * BW_ROWS, h = blockIdx.y, T = B.T;
    const int64_t s0 = k0 + 16 * w + (lane >> 2), s1 = s0 + 8; /* this thread's keys */
    const int64_t e0 = s0 < T ? last_query(B.cu, B.N, T, s0) : -1;
    const int64_t e1 = s1 < T ? last_query(B.cu, B.N, T, s1) : -1;
    const int64_t kl = k0 + BW_ROWS - 1 < T - 1 ? k0 + BW_ROWS - 1 : T - 1;
    const int64_t q_hi = last_query(B.cu, B.N, T, kl);
    const int64_t wk = k0 + 16 * w, wkl = wk + 15 < T - 1 ? wk + 15 : T - 1;
    const int64_t w_hi = wk < T ? last_query(B.cu, B.N, T, wkl) : -1;
    /* a query tile after the warp's last key and at most this last query (the first key's; it
     * never decreases with the key) is seen by all 16 keys: no per-pair mask there */
    const int64_t w_e_all = wk + 15 < T ? last_query(B.cu, B.N, T, wk) : -1;
    const float sl2 = B.scale * 1.4426950408889634f;

    /* the query tile from q0 into buffer buf: q (QT, DQ), dO (QT, DV), then lse and D (QT
     * each); zeros past q_hi */
    const auto issue = [&](int64_t q0, int buf) {
        uint32_t *qs = u + L::walk + buf * L::buf;
        tile_copy16<QT, DQ>(qs, B.q16, q0, q_hi + 1, B.Hm, h);
        tile_copy16<QT, DV>(qs + L::walk_v, B.g16, q0, q_hi + 1, B.Hm, h);
        float *st = (float *)(qs + L::stats);
        for (int j = threadIdx.x; j < QT; j += blockDim.x) {
            const bool in = q0 + j <= q_hi;
            const int64_t at = (in ? q0 + j : 0) * B.Hm + h;
            cp_async4(st + j, B.lse + at, in);
            cp_async4(st + QT + j, B.D + at, in);
        }
        cp_async_commit();
    };
    tile_copy16<BW_ROWS, DQ>(u + L::own_q, B.k16, k0, T, B.Hm, h); /* with the first tile */
    tile_copy16<BW_ROWS, DV>(u + L::own_v, B.v16, k0, T, B.Hm, h);
    issue(k0, 0);
    float dk[DQ / 8][4], dv[DV / 8][4];
    bw_zero(dk);
    bw_zero(dv);
    for (int64_t q0 = k0, it = 0; q0 <= q_hi; q0 += QT, it++) {
        cp_async_wait0();
        __syncthreads(); /* tile it landed; the other buffer's products (tile it - 1) are done */
        if (q0 + QT <= q_hi) issue(q0 + QT, (int)((it + 1) & 1)); /* under these products */
        if (q0 > w_hi || q0 + QT - 1 < wk) continue; /* no key of this warp is seen */
        const uint32_t *qs = u + L::walk + (it & 1) * L::buf, *gs = qs + L::walk_v;
        const float *lse = (const float *)(qs + L::stats), *dd = lse + QT;
        float st[QT / 8][4], dp[QT / 8][4]; /* S^T, dP^T: (16 keys, QT queries) */
        bw_products<DQ, DV>(st, dp, ks + 16 * w * SQ, qs, vs + 16 * w * SV, gs);
        const auto probs =
            [&](bool full) { /* P and dS; full: every pair seen, no tests */
#pragma unroll
                             for (int nt = 0; nt < QT / 8; nt++)
#pragma unroll
                                 for (int j = 0; j < 2; j++) {
                                     const int col = nt * 8 + 2 * t + j;
                                     const int64_t tq = q0 + col;
                                     const float l2 = lse[col] * 1.4426950408889634f;
                                     const float p0 = full || (tq >= s0 && tq <= e0)
                                                          ? exp2f(st[nt][j] * sl2 - l2)
                                                          : 0.0f;
                                     const float p1 = full || (tq >= s1 && tq <= e1)
                                                          ? exp2f(st[nt][2 + j] * sl2 - l2)
                                                          : 0.0f;
                                     st[nt][j] = p0, st[nt][2 + j] = p1;
                                     dp[nt][j] = p0 * (dp[nt][j] - dd[col]);
                                     dp[nt][2 + j] = p1 * (dp[nt][2 + j] - dd[col]);
                                 }
            };
        if (q0 >= wk + 15 && q0 + QT - 1 <= w_e_all)
            probs(true);
        else
            probs(false);
        bw_mma_acc<QT / 16, DV / 8>(dv, st, gs, SV); /* dV += P^T dO */
        bw_mma_acc<QT / 16, DQ / 8>(dk, dp, qs, SQ); /* dK += dS^T Q */
    }
#pragma unroll
    for (int j = 0; j < DV / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int64_t d = j * 8 + 2 * t + e;
            if (d >= B.vm) continue;
            if (s0 < T) B.dv[(s0 * B.Hm + h) * B.vm + d] += dv[j][e];
            if (s1 < T) B.dv[(s1 * B.Hm + h) * B.vm + d] += dv[j][2 + e];
        }
    bw_store_qk<DQ>(dk, s0, h, B, B.dk_nope, B.dk_pe_h, true);
}

/* dQ of 64 queries of head blockIdx.y (longest rows first): key tiles of KT from the first
 * query's document start to the last query; dq_nope and dq_pe get +=. */
template <int DQ, int DV, int KT>
__global__ void __launch_bounds__(128) k_attn_bwd_q_tc(bwd_args B) {
    typedef bw_smem<DQ, DV, KT, false> L;
    constexpr int SQ = L::SQ, SV = L::SV;
    extern __shared__ float sm[];
    uint32_t *const u = (uint32_t *)sm;
    const uint32_t *qs = u + L::own_q; /* (64 queries, DQ) */
    const uint32_t *gs = u + L::own_v; /* dO (64 queries, DV) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t = lane & 3;
    const int64_t T = B.T, nqb = (T + BW_ROWS - 1) / BW_ROWS;
    const int64_t q0 = (nqb - 1 - (int64_t)blockIdx.x) * BW_ROWS, h = blockIdx.y;
    const int64_t r0 = q0 + 16 * w + (lane >> 2), r1 = r0 + 8; /* this thread's queries */
    const int64_t lo0 = r0 < T ? first_key(B.cu, B.N, r0) : T;
    const int64_t lo1 = r1 < T ? first_key(B.cu, B.N, r1) : T;
    const int64_t hi0 = r0 < T ? r0 : -1, hi1 = r1 < T ? r1 : -1;
    const float l20 = r0 < T ? B.lse[r0 * B.Hm + h] * 1.4426950408889634f : 0.0f;
    const float l21 = r1 < T ? B.lse[r1 * B.Hm + h] * 1.4426950408889634f : 0.0f;
    const float D0 = r0 < T ? B.D[r0 * B.Hm + h] : 0.0f, D1 = r1 < T ? B.D[r1 * B.Hm + h] : 0.0f;
    const int64_t blk_lo = first_key(B.cu, B.N, q0);
    const int64_t blk_hi = q0 + BW_ROWS - 1 < T - 1 ? q0 + BW_ROWS - 1 : T - 1;
    const int64_t wr = q0 + 16 * w, w_hi = wr + 15 < T - 1 ? wr + 15 : T - 1;
    const int64_t w_lo = wr < T ? first_key(B.cu, B.N, wr) : T;
    /* key tiles that all 16 rows see whole, as in the forward: no per-pair mask there */
    const int64_t w_lo_all = wr + 15 < T ? first_key(B.cu, B.N, wr + 15) : T;
    const float sl2 = B.scale * 1.4426950408889634f;

    /* the key tile from k0 into buffer buf: k (KT, DQ), v (KT, DV); zeros past blk_hi */
    const auto issue = [&](int64_t k0, int buf) {
        uint32_t *ks = u + L::walk + buf * L::buf;
        tile_copy16<KT, DQ>(ks, B.k16, k0, blk_hi + 1, B.Hm, h);
        tile_copy16<KT, DV>(ks + L::walk_v, B.v16, k0, blk_hi + 1, B.Hm, h);
        cp_async_commit();
    };
    tile_copy16<BW_ROWS, DQ>(u + L::own_q, B.q16, q0, T, B.Hm, h); /* with the first tile */
    tile_copy16<BW_ROWS, DV>(u + L::own_v, B.g16, q0, T, B.Hm, h);
    issue(blk_lo, 0);
    float dq[DQ / 8][4];
    bw_zero(dq);
    for (int64_t k0 = blk_lo, it = 0; k0 <= blk_hi; k0 += KT, it++) {
        cp_async_wait0();
        __syncthreads(); /* tile it landed; the other buffer's products (tile it - 1) are done */
        if (k0 + KT <= blk_hi) issue(k0 + KT, (int)((it + 1) & 1)); /* under these products */
        if (k0 > w_hi || k0 + KT - 1 < w_lo) continue; /* no query of this warp sees the tile */
        const uint32_t *ks = u + L::walk + (it & 1) * L::buf, *vs = ks + L::walk_v;
        float sc[KT / 8][4], dp[KT / 8][4]; /* S, dP: (16 queries, KT keys) */
        bw_products<DQ, DV>(sc, dp, qs + 16 * w * SQ, ks, gs + 16 * w * SV, vs);
        const auto dscores =
            [&](bool full) { /* dS; full: every pair seen, no tests */
#pragma unroll
                             for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                                 for (int j = 0; j < 2; j++) {
                                     const int64_t s = k0 + nt * 8 + 2 * t + j;
                                     const float p0 = full || (s >= lo0 && s <= hi0)
                                                          ? exp2f(sc[nt][j] * sl2 - l20)
                                                          : 0.0f;
                                     const float p1 = full || (s >= lo1 && s <= hi1)
                                                          ? exp2f(sc[nt][2 + j] * sl2 - l21)
                                                          : 0.0f;
                                     dp[nt][j] = p0 * (dp[nt][j] - D0);
                                     dp[nt][2 + j] = p1 * (dp[nt][2 + j] - D1);
                                 }
            };
        if (k0 >= w_lo_all && k0 + KT - 1 <= wr)
            dscores(true);
        else
            dscores(false);
        bw_mma_acc<KT / 16, DQ / 8>(dq, dp, ks, SQ); /* dQ += dS K */
    }
    bw_store_qk<DQ>(dq, r0, h, B, B.dq_nope, B.dq_pe, false);
}

/* both kernels at one (DQ, DV): the query tile of the kv kernel 32 rows at DQ = 192 (its
 * accumulators, 4 (DQ + DV) / 8 registers, leave room for no more), else 64 */
template <int DQ, int DV> static void bw_launch(const bwd_args &B, arl_cuda_ctx *c) {
    constexpr int QT = DQ > 128 ? 32 : 64, KT = 64;
    const int kv_bytes = (int)sizeof(uint32_t) * bw_smem<DQ, DV, QT, true>::words;
    const int q_bytes = (int)sizeof(uint32_t) * bw_smem<DQ, DV, KT, false>::words;
    const unsigned blocks = (unsigned)((B.T + BW_ROWS - 1) / BW_ROWS);
    cudaFuncSetAttribute(k_attn_bwd_kv_tc<DQ, DV, QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kv_bytes);
    cudaFuncSetAttribute(k_attn_bwd_q_tc<DQ, DV, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         q_bytes);
    k_attn_bwd_kv_tc<DQ, DV, QT>
        <<<dim3(blocks, (unsigned)B.Hm), 128, (size_t)kv_bytes, c->stream>>>(B);
    k_attn_bwd_q_tc<DQ, DV, KT>
        <<<dim3(blocks, (unsigned)B.Hm), 128, (size_t)q_bytes, c->stream>>>(B);
}

/* The tensor-core backward when the context computes in bf16 and the widths fit (those of the
 * tensor-core forward; the workspace then holds the bf16 copies): the copies of q, k, v and
 * dO, then both kernels.  Returns 0 to leave the call to the fp32 kernels. */
static int attn_bwd_launch_tc(bwd_args &B, arl_cuda_ctx *c) {
    const int dq = tc_dq(B.n, B.r), dv = tc_dv(B.vm);
    if (c->math != ARL_CUDA_MATH_BF16 || !dq || !dv) return 0;
    const int64_t T = B.T, Hm = B.Hm;
    bf16_copy(B.q16, {B.q_nope, B.q_pe, Hm * B.n, B.n, B.n, Hm * B.r, B.r, B.r}, T, Hm, dq, c);
    bf16_copy(B.k16, {B.k_nope, B.k_pe, Hm * B.n, B.n, B.n, B.r, 0, B.r}, T, Hm, dq, c);
    bf16_copy(B.v16, {B.v, B.v, Hm * B.vm, B.vm, B.vm, 0, 0, 0}, T, Hm, dv, c);
    bf16_copy(B.g16, {B.d_o, B.d_o, Hm * B.vm, B.vm, B.vm, 0, 0, 0}, T, Hm, dv, c);
#define BW_LAUNCH(Qw, Vw)                                                                          \
    if (dq == Qw && dv == Vw) bw_launch<Qw, Vw>(B, c);
    BW_LAUNCH(64, 64);
    BW_LAUNCH(64, 128);
    BW_LAUNCH(96, 64);
    BW_LAUNCH(96, 128);
    BW_LAUNCH(128, 64);
    BW_LAUNCH(128, 128);
    BW_LAUNCH(192, 64);
    BW_LAUNCH(192, 128);
#undef BW_LAUNCH
    return 1;
}

extern "C" void arl_cuda_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe,
                                      float *dv, const float *d_o, const float *o, const float *lse,
                                      const float *q_nope, const float *q_pe, const float *k_nope,
                                      const float *k_pe, const float *v, const int32_t *cu,
                                      int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r,
                                      int64_t vm, float scale, float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(n + r <= BQ && vm <= BQ);
    int64_t items = T * Hm;
    if (items == 0) return;
    /* the workspace (arl_cuda_mla_attn_bwd_ws_floats): [q16 | k16 | v16 | g16] when the
     * widths fit the tensor-core kernels, then dk_pe per head and D */
    const int dq = tc_dq(n, r), dvw = tc_dv(vm);
    const int64_t copies = dq && dvw ? T * Hm * (dq + dvw) : 0;
    float *per_head = ws + copies, *D = per_head + T * Hm * r;
    unsigned blocks = (unsigned)((items + AW - 1) / AW);
    k_attn_delta<<<blocks, 32 * AW, 0, c->stream>>>(D, d_o, o, items, vm);
    bwd_args B = {q_nope, q_pe,    k_nope,   k_pe, v,       d_o,     lse,     D,       dq_nope,
                  dq_pe,  dk_nope, per_head, dv,   nullptr, nullptr, nullptr, nullptr, cu,
                  N,      T,       Hm,       n,    r,       vm,      scale};
    if (copies) {
        B.q16 = reinterpret_cast<uint32_t *>(ws);
        B.k16 = B.q16 + T * Hm * dq / 2;
        B.v16 = B.k16 + T * Hm * dq / 2;
        B.g16 = B.v16 + T * Hm * dvw / 2;
    }
    if (!attn_bwd_launch_tc(B, c)) {
        k_attn_bwd_q<<<blocks, 32 * AW, 0, c->stream>>>(B);
        k_attn_bwd_kv<<<blocks, 32 * AW, 0, c->stream>>>(B);
    }
    k_sum_heads<<<arl_blocks(T * r, 256), 256, 0, c->stream>>>(dk_pe, per_head, T, Hm, r);
    ARL_CUDA_LAUNCHED(c, "mla_attn_bwd");
}
