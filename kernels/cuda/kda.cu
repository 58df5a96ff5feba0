/* kernels/cuda/kda.cu: the KDA delta-rule core on the device (kernels/cuda/ops.h, spec 3.3,
 * 3.5, 3.7): recurrent forward (decode), chunkwise forward, recurrent-rule backward.
 * Layouts are those of policy/kda.h; the state stays fp32 everywhere (spec 1.4). */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

/* ---- chunk table in ctx->index: [0] n_chunks, [1 .. N+1] first chunk of each document
 * (doc_first[N] = n_chunks), then (start, len) per chunk ---- */
#define CT_DOC(ix) ((ix) + 1)
#define CT_CHUNKS(ix, N) ((ix) + 2 + (N))

/* One block (CT_THREADS): each document's chunks counted a thread a document and scanned
 * (doc_first) a round of CT_THREADS documents at a time, then a thread a chunk, its document
 * found by binary search (was one thread walking every document and chunk: O(T / C + N)
 * dependent steps in every chunkwise call). */
#define CT_THREADS 1024
__global__ void __launch_bounds__(CT_THREADS)
    k_chunk_table(int32_t *ix, const int32_t *cu, int32_t N, int64_t T, int64_t C, int32_t cap,
                  arl_cuda_errword *err) {
    __shared__ int64_t sh[33];
    int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    int64_t nc = 0; /* chunks of the rounds before (the same in every thread) */
    for (int64_t base = 0; base < N; base += CT_THREADS) {
        const int64_t di = base + threadIdx.x;
        int64_t n = 0, round = 0;
        if (di < N) {
            const int64_t a = cu ? cu[di] : 0, b = cu ? cu[di + 1] : T;
            n = b > a ? (b - a + C - 1) / C : 0;
        }
        const int64_t before = arl_block_scan_excl(n, &round, sh);
        if (di < N) doc[di] = (int32_t)(nc + before);
        nc += round;
    }
    if (nc > cap) {
        if (threadIdx.x == 0) {
            arl_dev_error(err, 3, (int32_t)(nc < INT32_MAX ? nc : INT32_MAX));
            ix[0] = 0;
        }
        return;
    }
    if (threadIdx.x == 0) doc[N] = (int32_t)nc, ix[0] = (int32_t)nc;
    __syncthreads(); /* doc_first written (global memory, this block) */
    for (int64_t x = threadIdx.x; x < nc; x += CT_THREADS) {
        int32_t lo = 0, hi = N - 1; /* the largest d with doc[d] <= x: a non-empty document */
        while (lo < hi) {
            const int32_t mid = lo + (hi - lo + 1) / 2;
            if (doc[mid] <= x)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int64_t a = cu ? cu[lo] : 0, b = cu ? cu[lo + 1] : T, s = a + (x - doc[lo]) * C;
        ch[2 * x] = (int32_t)s;
        ch[2 * x + 1] = (int32_t)(b - s < C ? b - s : C);
    }
}

static int32_t chunk_cap(int32_t N) {
    return (ARL_CUDA_INDEX_INTS - 2 - N) / 2;
}

static int64_t max_chunks(int64_t T, int32_t N, int64_t C) {
    return (T + C - 1) / C + N;
}

/* ======================= recurrent forward =============================================== */

#define RW 8 /* warps (state columns) per block */

/* One warp per (state column j, head h, document): lane l holds S[c][j] for c = l + 32u. */
template <int U>
__global__ void k_kda_recurrent(float *o, float *S, float *chunk_states, const float *q,
                                const float *k, const float *v, const float *g, const float *beta,
                                const int32_t *cu, const int32_t *first, int32_t N, int64_t T,
                                int64_t H, int64_t dk, int64_t dv, float scale, int64_t C) {
    int lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * RW + (threadIdx.x >> 5);
    int64_t h = blockIdx.y;
    int32_t di = blockIdx.z;
    if (j >= dv) return;
    int64_t a = cu ? cu[di] : 0, b = cu ? cu[di + 1] : T;
    int64_t ci = first ? first[di] : 0; /* first chunk of this document */
    if (chunk_states && !first)         /* (no chunk table: the chunks of the documents before) */
        for (int32_t e = 0; e < di; e++) {
            int64_t len = cu ? cu[e + 1] - cu[e] : T;
            ci += (len + C - 1) / C;
        }
    float *Sd = S + ((int64_t)di * H + h) * dk * dv;
    float s[U];
    for (int u = 0; u < U; u++) {
        int64_t c = lane + 32 * u;
        s[u] = c < dk ? Sd[c * dv + j] : 0.0f;
    }
    for (int64_t t = a; t < b; t++) {
        if (chunk_states && (t - a) % C == 0) {
            float *cs = chunk_states + ((ci + (t - a) / C) * H + h) * dk * dv;
            for (int u = 0; u < U; u++) {
                int64_t c = lane + 32 * u;
                if (c < dk) cs[c * dv + j] = s[u];
            }
        }
        const int64_t base = (t * H + h) * dk;
        float kk[U], r = 0.0f;
        for (int u = 0; u < U; u++) {
            int64_t c = lane + 32 * u;
            float al = c < dk ? expf(g[base + c]) : 0.0f;
            kk[u] = c < dk ? k[base + c] : 0.0f;
            s[u] *= al;
            r += s[u] * kk[u];
        }
        r = arl_warp_sum(r);
        float delta = beta[t * H + h] * (v[(t * H + h) * dv + j] - r);
        float out = 0.0f;
        for (int u = 0; u < U; u++) {
            int64_t c = lane + 32 * u;
            s[u] += kk[u] * delta;
            out += s[u] * (c < dk ? scale * q[base + c] : 0.0f);
        }
        out = arl_warp_sum(out);
        if (lane == 0) o[(t * H + h) * dv + j] = out;
    }
    for (int u = 0; u < U; u++) {
        int64_t c = lane + 32 * u;
        if (c < dk) Sd[c * dv + j] = s[u];
    }
}

extern "C" void arl_cuda_kda_recurrent_fwd(float *o, float *S, float *chunk_states, const float *q,
                                           const float *k, const float *v, const float *g,
                                           const float *beta, const int32_t *cu, int32_t N,
                                           int64_t T, int64_t H, int64_t dk, int64_t dv,
                                           float scale, int64_t C) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(N >= 1 && H >= 1 && dk >= 1 && dk <= 256 && dv >= 1);
    ARL_ASSERT(!chunk_states || C >= 1);
    if (C < 1) C = 1;
    /* each document's first chunk from the chunk table (else every warp counts the chunks of
     * the documents before its own: N^2 / 2 steps a column) */
    const int32_t *first = NULL;
    if (chunk_states && max_chunks(T, N, C) <= chunk_cap(N)) {
        k_chunk_table<<<1, CT_THREADS, 0, c->stream>>>(c->index, cu, N, T, C, chunk_cap(N), c->err);
        first = CT_DOC(c->index);
    }
    dim3 grid((unsigned)((dv + RW - 1) / RW), (unsigned)H, (unsigned)N);
    if (dk <= 32)
        k_kda_recurrent<1><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, first, N, T, H, dk, dv, scale, C);
    else if (dk <= 64)
        k_kda_recurrent<2><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, first, N, T, H, dk, dv, scale, C);
    else if (dk <= 128)
        k_kda_recurrent<4><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, first, N, T, H, dk, dv, scale, C);
    else
        k_kda_recurrent<8><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, first, N, T, H, dk, dv, scale, C);
    ARL_CUDA_LAUNCHED(c, "kda_recurrent_fwd");
}

/* ======================= chunkwise forward =============================================== */

/* Per (chunk, head) scratch in ws, floats: W (C, dk), U (C, dv), Qg (C, dk), Kb (C, dk),
 * Aqk (C, C), gn (dk), and for the backward Tm (C, C) (T - I, strictly lower) and Akk (C, C)
 * (A_kk with its beta factor, strictly lower). */
#define SCRATCH(dk, dv, C) (3 * (C) * (dk) + (C) * (dv) + 3 * (C) * (C) + (dk))
static int64_t chunk_scratch(int64_t dk, int64_t dv, int64_t C) {
    return SCRATCH(dk, dv, C);
}

/* 1 if the chunks of T tokens in N documents fit the index table (ops.h) */
static bool chunks_fit(int64_t T, int32_t N, int64_t C) {
    return N >= 1 && T >= 0 && C >= 1 && max_chunks(T, N, C) <= chunk_cap(N);
}

extern "C" int64_t arl_cuda_kda_chunk_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk,
                                                int64_t dv, int64_t C) {
    if (!chunks_fit(T, N, C)) return -1;
    return max_chunks(T, N, C) * H * chunk_scratch(dk, dv, C);
}

struct chunk_ptrs {
    float *W, *U, *Qg, *Kb, *Aqk, *gn, *Tm, *Akk;
};

__device__ static inline chunk_ptrs scratch_of(float *ws, int64_t ci, int64_t h, int64_t H,
                                               int64_t dk, int64_t dv, int64_t C) {
    float *b = ws + (ci * H + h) * SCRATCH(dk, dv, C);
    chunk_ptrs p;
    p.W = b;
    p.U = p.W + C * dk;
    p.Qg = p.U + C * dv;
    p.Kb = p.Qg + C * dk;
    p.Aqk = p.Kb + C * dk;
    p.gn = p.Aqk + C * C;
    p.Tm = p.gn + dk;
    p.Akk = p.Tm + C * C;
    return p;
}

/* ---- products on tensor cores, 3xTF32 (kernel 1, both state passes, k_kda_cbwd) ----
 * The products run as mma.sync m16n8k8 with tf32 operands and fp32 accumulators.  Each fp32
 * operand x is split as x = hi + lo, hi = x truncated to tf32 (10 explicit mantissa bits), lo =
 * x - hi (exact in fp32) truncated the same way, and a b is taken as hi_a hi_b + hi_a lo_b +
 * lo_a hi_b: what is left out (lo_a lo_b and lo's truncation) is below 3 2^-20 of |a b|, so the
 * products stay fp32-class (spec 1.4 keeps the KDA state and its gradients in fp32) at three
 * tensor-core products per fp32 one; a split is three integer and float instructions.
 * Fragment layout (PTX ISA, mma.m16n8k8 .tf32, g = lane / 4, t = lane % 4): A {a0..a3} hold
 * (row g, col t), (row g + 8, col t), (row g, col t + 4), (row g + 8, col t + 4); B {b0, b1}
 * hold (k t, col g), (k t + 4, col g); C {c0..c3} hold (row g, cols 2t, 2t + 1) and (row g + 8,
 * cols 2t, 2t + 1). */
/* x rounded up to a multiple of m (the tensor-core tiles' padded extents) */
__host__ __device__ static inline int64_t up_to(int64_t x, int64_t m) {
    return (x + m - 1) / m * m;
}

__device__ static inline void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

/* c += a b for one m16n8k8 tile from the split operands (ah + al, bh + bl), lo_a lo_b left out */
#if defined(__CUDACC__)
__device__ static inline void tf32_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ static inline void tf32_mma3(float c[4], const uint32_t ah[4], const uint32_t al[4],
                                        const uint32_t bh[2], const uint32_t bl[2]) {
    tf32_mma(c, al, bh[0], bh[1]);
    tf32_mma(c, ah, bl[0], bl[1]);
    tf32_mma(c, ah, bh[0], bh[1]);
}
#else /* the CPU emulator (tests/cuda/emu): the warp's fragments exchanged in one step             \
       * (emu_warp_post), the same sums in fp32 */
static inline void tf32_mma3(float c[4], const uint32_t ah[4], const uint32_t al[4],
                             const uint32_t bh[2], const uint32_t bl[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint64_t me[12]; /* ah, al, bh, bl */
    for (int i = 0; i < 4; i++)
        me[i] = ah[i], me[4 + i] = al[i];
    for (int i = 0; i < 2; i++)
        me[8 + i] = bh[i], me[10 + i] = bl[i];
    const uint64_t(*fr)[EMU_POST_MAX] = emu_warp_post(me, 12);
    for (int e = 0; e < 4; e++) { /* c[e]: row g + 8 (e / 2), col 2t + e % 2 */
        const int hh = e >> 1, col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (int kk = 0; kk < 8; kk++) {
            const uint64_t *a = fr[4 * g + (kk & 3)], *b = fr[4 * col + (kk & 3)];
            const int ai = hh + 2 * (kk >> 2), bi = kk >> 2;
            sum += __uint_as_float((uint32_t)a[ai]) * __uint_as_float((uint32_t)b[8 + bi]) +
                   __uint_as_float((uint32_t)a[ai]) * __uint_as_float((uint32_t)b[10 + bi]) +
                   __uint_as_float((uint32_t)a[4 + ai]) * __uint_as_float((uint32_t)b[8 + bi]);
        }
        c[e] += sum;
    }
    emu_warp_release();
}
#endif

/* c[j] += the (16, 8) tiles j < nj (warp-uniform, nj <= NJ) of A B over k < K (a multiple of
 * 8), 3xTF32, for the calling warp: a(r, k) is A's element (r < 16), b(k, col) B's (col < 8 nj),
 * both relative to the tile's origin.  Each k step's A fragment is split once for all nj tiles. */
template <int NJ, class FA, class FB>
__device__ static inline void warp_mma(float (&c)[NJ][4], int nj, FA a, FB b, int64_t K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int64_t k0 = 0; k0 < K; k0 += 8) {
        uint32_t ah[4], al[4];
        tf32_split(a(g, k0 + t), ah[0], al[0]);
        tf32_split(a(g + 8, k0 + t), ah[1], al[1]);
        tf32_split(a(g, k0 + t + 4), ah[2], al[2]);
        tf32_split(a(g + 8, k0 + t + 4), ah[3], al[3]);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            if (j >= nj) break;
            uint32_t bh[2], bl[2];
            tf32_split(b(k0 + t, 8 * j + g), bh[0], bl[0]);
            tf32_split(b(k0 + t + 4, 8 * j + g), bh[1], bl[1]);
            tf32_mma3(c[j], ah, al, bh, bl);
        }
    }
}

/* f(j, e, r, col) for element e of each of the calling lane's C fragments j < NJ: row r < 16 and
 * column col < 8 NJ of the warp's tile. */
template <int NJ, class F> __device__ static inline void frag_each(F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            f(j, e, g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1));
}

#define KDA_SUB 16            /* rows of a sub-chunk of the factored pair products */
#define KDA_FACTOR_SPAN 80.0f /* largest exponent of a factor (policy/kda.c: e^80 is normal) */

/* A_kk (as -beta_r A_kk, strictly lower, into A) and A_qk (lower with the diagonal, into Aqk)
 * for rows [r0, r1) of a chunk of n rows: one exp per (pair, channel), the difference form. */
__device__ static inline void pairs_difference(float *A, float *Aqk, const float *Ks,
                                               const float *Qs, const float *Gs, const float *bs,
                                               int64_t r0, int64_t r1, int64_t n, int64_t dk,
                                               int64_t C, int64_t LD, int64_t LA, int tid, int nt) {
    for (int64_t i = r0 * C + tid; i < r1 * C; i += nt) {
        int64_t r = i / C, s = i % C;
        float akk = 0.0f, aqk = 0.0f;
        if (r < n && s <= r) {
            for (int64_t c = 0; c < dk; c++) {
                float e = expf(Gs[r * LD + c] - Gs[s * LD + c]);
                float ke = Ks[s * LD + c] * e;
                akk += Ks[r * LD + c] * ke;
                aqk += Qs[r * LD + c] * ke;
            }
        }
        A[r * LA + s] = (s < r && r < n) ? -bs[r] * akk : 0.0f;
        Aqk[r * C + s] = (r < n && s <= r) ? aqk : 0.0f;
    }
}

/* The same in the factored form of the CPU reference (policy/kda.c chunk_pairs, spec 3.5):
 * per sub-chunk R = [r0, r0 + KDA_SUB) with boundary b = r0, for r in R and i < r + 1,
 *   exp(G_r - G_i) = exp(G_r - G_b) exp(G_b - G_i),
 * so A[r, i] = sum_c (K_r e^{G_r - G_b})_c (K_i e^{G_b - G_i})_c (Q_r for A_qk): one exp per
 * (row, channel) of each sub-chunk instead of one per (pair, channel), and the pair sums two
 * (16, C) matrix products (3xTF32 on tensor cores) instead of five loads and an exp each.  A
 * sub-chunk one of whose exponents exceeds KDA_FACTOR_SPAN takes the difference form (as the
 * CPU does).  Shared: XR (C, LD) the right factors K_i e^{G_b - G_i}, LK and LQ (KDA_SUB, LD)
 * the left ones.  Whether a sub-chunk takes the difference form is one __syncthreads_or of the
 * threads' own findings (no shared flag written by several threads at once). */
__device__ static inline void pairs_factored(float *A, float *Aqk, const float *Ks, const float *Qs,
                                             const float *Gs, const float *bs, float *XR, float *LK,
                                             float *LQ, int64_t n, int64_t dk, int64_t C,
                                             int64_t LD, int64_t LA, int tid, int nt) {
    for (int64_t r0 = 0; r0 < C; r0 += KDA_SUB) {
        const int64_t r1 = r0 + KDA_SUB < C ? r0 + KDA_SUB : C, re = r1 < n ? r1 : n;
        if (r0 >= n) { /* rows past the chunk's end: zeros */
            pairs_difference(A, Aqk, Ks, Qs, Gs, bs, r0, r1, n, dk, C, LD, LA, tid, nt);
            continue;
        }
        int wide = 0; /* this thread saw an exponent past KDA_FACTOR_SPAN */
        for (int64_t i = tid; i < re * dk; i += nt) { /* rows 0 .. re of the chunk */
            const int64_t r = i / dk, c = i % dk;
            const float e = Gs[r0 * LD + c] - Gs[r * LD + c];
            if (e > KDA_FACTOR_SPAN) wide = 1;
            XR[r * LD + c] = Ks[r * LD + c] * expf(e);
        }
        for (int64_t i = tid; i < (re - r0) * dk; i += nt) { /* the sub-chunk's own rows */
            const int64_t r = r0 + i / dk, c = i % dk;
            const float e = Gs[r * LD + c] - Gs[r0 * LD + c];
            if (e > KDA_FACTOR_SPAN) wide = 1;
            const float x = expf(e);
            LK[(r - r0) * LD + c] = Ks[r * LD + c] * x;
            LQ[(r - r0) * LD + c] = Qs[r * LD + c] * x;
        }
        if (__syncthreads_or(wide)) { /* the factors are in place either way */
            pairs_difference(A, Aqk, Ks, Qs, Gs, bs, r0, r1, n, dk, C, LD, LA, tid, nt);
        } else { /* LK XR^T and LQ XR^T on tensor cores: warp w takes the product w / 4 and
                  * the columns 16 (w % 4) .. + 16 (read past dk as zero; rows past re and columns
                  * past C land in outputs left unwritten or masked) */
            const int w = tid >> 5;
            const int64_t cb = 16 * (w & 3);
            if (cb < C) { /* warp-uniform */
                const float *L = (w >> 2) ? LQ : LK;
                float acc[2][4] = {};
                warp_mma<2>(
                    acc, C - cb > 8 ? 2 : 1,
                    [&](int64_t r, int64_t k) { return k < dk ? L[r * LD + k] : 0.0f; },
                    [&](int64_t k, int64_t col) { return k < dk ? XR[(cb + col) * LD + k] : 0.0f; },
                    up_to(dk, 8));
                frag_each<2>([&](int j, int e, int ro, int co) {
                    const int64_t r = r0 + ro, s = cb + co;
                    if (r >= r1 || s >= C) return;
                    if (w >> 2)
                        Aqk[r * C + s] = (r < n && s <= r) ? acc[j][e] : 0.0f;
                    else
                        A[r * LA + s] = (s < r && r < n) ? -bs[r] * acc[j][e] : 0.0f;
                });
            }
        }
        __syncthreads(); /* XR, LK and LQ are the next sub-chunk's */
    }
}

/* Spec 3.5 (3): A holds L = -beta A_kk (strictly lower, rows n.. zero) on entry and X = T - I
 * on return, T = (I - L)^-1, i.e. X = L + L X.  By blocks of KDA_SUB rows: the diagonal blocks
 * X_bb by forward substitution, all blocks at once (KDA_SUB steps, not n); then the blocks
 * below them one block diagonal at a time,
 *   R_ij = sum_{k=j}^{i-1} L_ik T_kj  (T_jj = I + X_jj, T_kj = X_kj below the diagonal),
 *   X_ij = T_ii R_ij = R_ij + X_ii R_ij,
 * each element of a diagonal's blocks by its own thread.  The X_ij go to Xo (C, LA) until the
 * end (the L_ik they read stay in A); Rb holds the R of one block diagonal (at most
 * C / KDA_SUB - 1 blocks of KDA_SUB^2).  Exact in exact arithmetic; the sums' order differs
 * from the row-by-row substitution. */
__device__ static inline void invert_unit_lower(float *A, float *Xo, float *Rb, int64_t n,
                                                int64_t LA, int tid, int nt) {
    const int64_t B = KDA_SUB, nb = (n + B - 1) / B;
    for (int64_t i = 1; i < B; i++) { /* local row i of every diagonal block */
        const int64_t b = tid / B, j = tid % B, r = b * B + i, c = b * B + j;
        const bool act = b < nb && r < n && j < i;
        float val = 0.0f;
        if (act) {
            val = A[r * LA + c];
            for (int64_t m = j + 1; m < i; m++)
                val += A[r * LA + b * B + m] * A[(b * B + m) * LA + c];
        }
        __syncthreads();
        if (act) A[r * LA + c] = val;
        __syncthreads();
    }
    for (int64_t d = 1; d < nb; d++) { /* blocks (i, i - d) */
        const int64_t cnt = (nb - d) * B * B;
        for (int64_t e = tid; e < cnt; e += nt) {
            const int64_t i = d + e / (B * B), j = i - d, rr = e % (B * B) / B, cc = e % B;
            const int64_t r = i * B + rr, c = j * B + cc;
            float val = 0.0f;
            if (r < n) {
                val = A[r * LA + c]; /* k = j: L_ij (I + X_jj) */
                for (int64_t m = cc + 1; m < B; m++)
                    val += A[r * LA + j * B + m] * A[(j * B + m) * LA + c];
                for (int64_t m = (j + 1) * B; m < i * B; m++) /* k = j+1 .. i-1 */
                    val += A[r * LA + m] * Xo[m * LA + c];
            }
            Rb[e] = val;
        }
        __syncthreads();
        for (int64_t e = tid; e < cnt; e += nt) {
            const int64_t i = d + e / (B * B), j = i - d, rr = e % (B * B) / B, cc = e % B;
            const int64_t r = i * B + rr, c = j * B + cc;
            if (r >= n) continue;
            const float *Rp = Rb + (e / (B * B)) * B * B;
            float val = Rp[rr * B + cc];
            for (int64_t m = 0; m < rr; m++)
                val += A[r * LA + i * B + m] * Rp[m * B + cc];
            Xo[r * LA + c] = val;
        }
        __syncthreads();
    }
    for (int64_t e = tid; e < n * n; e += nt) { /* the blocks below the diagonal into A */
        const int64_t r = e / n, c = e % n;
        if (c < r / B * B) A[r * LA + c] = Xo[r * LA + c];
    }
    __syncthreads();
}

/* Shared floats of invert_unit_lower's Xo and Rb. */
static int64_t invert_smem_floats(int64_t C) {
    const int64_t nb = (C + KDA_SUB - 1) / KDA_SUB;
    return C * (C + 1) + (nb - 1) * KDA_SUB * KDA_SUB;
}

/* ---- staged products (kernel 1's W and U, k_kda_cbwd) ---- */
#define SP_ROWS 64        /* nA <= SP_ROWS (4 warps of 16 rows) */
#define SP_COLS 128       /* nB <= SP_COLS (2 warps of 64 columns) */
#define TJ 32             /* reduction slice of a staged product */
#define TJP (TJ + 4)      /* row stride of the (rows, TJ) slices: fragment reads hit 32 banks */
#define TNP (SP_COLS + 8) /* row stride of the (TJ, nB) slice: the same */

/* One term of a staged product: A has nA rows lda apart, K wide (at: A^T is given, K rows lda
 * apart, nA wide); B has nB rows ldb apart, K wide ("A B^T", B_T) or K rows ldb apart, nB wide
 * ("A B"). */
struct prod_term {
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb, K;
    bool at;
};

/* A staged product's accumulators: per warp a 16 x 64 tile of the (64, 128) output, as 8
 * m16n8 C fragments (tile_each maps them to rows and columns). */
typedef float prod_acc[8][4];

/* Shared floats of a staged product's slices: As (SP_ROWS, TJP) and Bs (SP_COLS, TJP) or
 * (TJ, TNP). */
static int64_t staged_smem_floats(void) {
    const int64_t bt = SP_COLS * TJP, bn = TJ * TNP;
    return SP_ROWS * TJP + (bt > bn ? bt : bn);
}

/* acc = the sum over the two terms (t2.K = 0: none) of A B^T or A B, for nA <= SP_ROWS rows and
 * nB <= SP_COLS columns, 256 threads: warp w owns rows 16 (w % 4) .. + 16 and columns
 * 64 (w / 4) .. + 64.  Slices of TJ along K pass through shared memory from coalesced global
 * reads, zero past nA, nB and K (the fragments read whole 8-wide k steps); each warp's A
 * fragment of a k step is split once and meets its 8 column tiles.  Rows and columns past nA, nB
 * hold zeros.  Starts and ends with a barrier: global writes before the call are visible to the
 * loads, and the caller may reuse the slices' memory at once. */
template <bool B_T>
__device__ static void staged_product(prod_acc &acc, prod_term t1, prod_term t2, int64_t nA,
                                      int64_t nB, float *As, float *Bs, int tid, int nt) {
    const int w = tid >> 5;
    const int64_t rb = 16 * (w & 3), cb = 64 * (w >> 2);
    const bool busy = rb < nA && cb < nB; /* warp-uniform */
    const int64_t NA = SP_ROWS, NB = SP_COLS;
    frag_each<8>([&](int j, int e, int, int) { acc[j][e] = 0.0f; });
    for (int p = 0; p < 2; p++) {
        const prod_term t = p == 0 ? t1 : t2;
        for (int64_t j0 = 0; j0 < t.K; j0 += TJ) {
            const int64_t nj = t.K - j0 < TJ ? t.K - j0 : TJ;
            __syncthreads(); /* the previous slice is consumed; earlier global writes visible */
            for (int64_t i = tid; i < NA * TJ; i += nt) { /* coalesced in either layout */
                const int64_t r = t.at ? i % NA : i / TJ, jj = t.at ? i / NA : i % TJ;
                const bool ok = r < nA && jj < nj;
                As[r * TJP + jj] =
                    ok ? (t.at ? t.A[(j0 + jj) * t.lda + r] : t.A[r * t.lda + j0 + jj]) : 0.0f;
            }
            if (B_T)
                for (int64_t i = tid; i < NB * TJ; i += nt) {
                    const int64_t s = i / TJ, jj = i % TJ;
                    Bs[s * TJP + jj] = s < nB && jj < nj ? t.B[s * t.ldb + j0 + jj] : 0.0f;
                }
            else
                for (int64_t i = tid; i < TJ * NB; i += nt) {
                    const int64_t jj = i / NB, s = i % NB;
                    Bs[jj * TNP + s] = jj < nj && s < nB ? t.B[(j0 + jj) * t.ldb + s] : 0.0f;
                }
            __syncthreads();
            if (!busy) continue;
            const float *a0 = As + rb * TJP, *b0 = B_T ? Bs + cb * TJP : Bs + cb;
            const int ntile = nB - cb >= 64 ? 8 : (int)((nB - cb + 7) / 8);
            warp_mma<8>(
                acc, ntile, [&](int64_t r, int64_t k) { return a0[r * TJP + k]; },
                [&](int64_t k, int64_t col) { return B_T ? b0[col * TJP + k] : b0[k * TNP + col]; },
                up_to(nj, 8));
        }
    }
    __syncthreads();
}

/* f(r, s, x) for each element (r, s) = x of the staged product's output this thread holds,
 * r < nA, s < nB. */
template <class F>
__device__ static inline void tile_each(const prod_acc &acc, int tid, int64_t nA, int64_t nB, F f) {
    const int w = tid >> 5;
    const int64_t rb = 16 * (w & 3), cb = 64 * (w >> 2);
    frag_each<8>([&](int j, int e, int r, int col) {
        if (rb + r < nA && cb + col < nB) f(rb + r, cb + col, acc[j][e]);
    });
}

/* Shared floats of kernel 1: Ks, Qs, Gs (C, LD), A (C, C + 1), beta (C), then a region that
 * holds the factored pair products' XR (C, LD), LK and LQ (KDA_SUB, LD), after
 * them invert_unit_lower's Xo and Rb, and last the staged products' slices. */
static size_t prep_smem_floats(int64_t dk, int64_t dv, int64_t C, int factored) {
    const int64_t LD = (dk > dv ? dk : dv) + 1;
    int64_t work = invert_smem_floats(C);
    if (staged_smem_floats() > work) work = staged_smem_floats();
    if (factored && C * LD + 2 * KDA_SUB * LD > work) work = C * LD + 2 * KDA_SUB * LD;
    return (size_t)(3 * C * LD + C * (C + 1) + C + work);
}

/* Kernel 1: one block per (chunk, head).  Shared: Ks, Qs, Gs (C, LD) with LD = max(dk, dv) + 1
 * (padding against bank conflicts), A (C, C + 1), beta (C), and with FACTORED the factored
 * form's buffers (pairs_factored). */
template <bool FACTORED>
__global__ void k_kda_chunk_prep(float *ws, const int32_t *ix, const float *q, const float *k,
                                 const float *v, const float *g, const float *beta, int32_t N,
                                 int64_t H, int64_t dk, int64_t dv, float scale, int64_t C) {
    extern __shared__ float sm[];
    int64_t ci = blockIdx.x, h = blockIdx.y;
    if (ci >= ix[0]) return;
    const int32_t *ch = CT_CHUNKS(ix, N);
    int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
    const int64_t LD = (dk > dv ? dk : dv) + 1, LA = C + 1;
    float *Ks = sm, *Qs = Ks + C * LD, *Gs = Qs + C * LD, *A = Gs + C * LD, *bs = A + C * LA;
    chunk_ptrs P = scratch_of(ws, ci, h, H, dk, dv, C);
    const int tid = threadIdx.x, nt = blockDim.x;

    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t r = i / dk, c = i % dk, gi = ((t0 + r) * H + h) * dk + c;
        Ks[r * LD + c] = k[gi];
        Qs[r * LD + c] = scale * q[gi];
        Gs[r * LD + c] = g[gi];
    }
    for (int64_t r = tid; r < n; r += nt)
        bs[r] = beta[(t0 + r) * H + h];
    __syncthreads();
    for (int64_t c = tid; c < dk; c += nt) /* (1) G = inclusive cumsum over rows */
        for (int64_t r = 1; r < n; r++)
            Gs[r * LD + c] += Gs[(r - 1) * LD + c];
    __syncthreads();
    /* (2), (6): A = -A_kk (strictly lower), Aqk (lower with diagonal) */
    if (FACTORED) {
        float *XR = bs + C, *LK = XR + C * LD, *LQ = LK + KDA_SUB * LD;
        pairs_factored(A, P.Aqk, Ks, Qs, Gs, bs, XR, LK, LQ, n, dk, C, LD, LA, tid, nt);
    } else {
        pairs_difference(A, P.Aqk, Ks, Qs, Gs, bs, 0, C, n, dk, C, LD, LA, tid, nt);
    }
    __syncthreads(); /* A's rows are read by other threads than wrote them (sub-chunks) */
    /* Qg = Gamma Q (scaled), Kb = exp(G_n - G) K, gn = exp(G_n) */
    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t r = i / dk, c = i % dk;
        float G = Gs[r * LD + c], Gn = Gs[(n - 1) * LD + c];
        P.Qg[r * dk + c] = Qs[r * LD + c] * expf(G);
        P.Kb[r * dk + c] = Ks[r * LD + c] * expf(Gn - G);
    }
    for (int64_t c = tid; c < dk; c += nt)
        P.gn[c] = expf(Gs[(n - 1) * LD + c]);
    for (int64_t i = tid; i < C * C; i += nt) /* A_kk for the backward (A holds -A_kk) */
        P.Akk[i] = -A[(i / C) * LA + i % C];
    __syncthreads();
    /* (3) T - I into A (the region after beta is free: the pair products are done) */
    invert_unit_lower(A, bs + C, bs + C + C * LA, n, LA, tid, nt);
    for (int64_t i = tid; i < C * C; i += nt) /* T - I for the backward */
        P.Tm[i] = A[(i / C) * LA + i % C];
    /* Ks <- beta Gamma K (X_w); Qs <- beta V (X_u) */
    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t r = i / dk, c = i % dk;
        Ks[r * LD + c] *= bs[r] * expf(Gs[r * LD + c]);
    }
    for (int64_t i = tid; i < n * dv; i += nt) {
        int64_t r = i / dv, c = i % dv;
        Qs[r * LD + c] = bs[r] * v[((t0 + r) * H + h) * dv + c];
    }
    __syncthreads();
    /* (4) W = T X_w = X_w + (T - I) X_w, U = T X_u likewise: staged products (A holds T - I,
     * zero on and above the diagonal and past row n; the region after beta is free again) */
    float *As = bs + C, *Bs = As + SP_ROWS * TJP;
    prod_acc acc;
    {
        const prod_term t = {A, LA, Ks, LD, n}, none = {};
        staged_product<false>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, tid, n, dk,
                  [&](int64_t r, int64_t c, float x) { P.W[r * dk + c] = Ks[r * LD + c] + x; });
    }
    {
        const prod_term t = {A, LA, Qs, LD, n}, none = {};
        staged_product<false>(acc, t, none, n, dv, As, Bs, tid, nt);
        tile_each(acc, tid, n, dv,
                  [&](int64_t r, int64_t c, float x) { P.U[r * dv + c] = Qs[r * LD + c] + x; });
    }
}

#define TV 32 /* state columns per block of the state passes */

/* The (rows, TV) tiles of the state passes (S, Vt; dS, dO, dV) are stored TV floats a row with
 * the columns XOR-swizzled by the row: element (k, j) at k TV + (j ^ 8 (k % 4)), so that a B
 * fragment's 32 reads (rows k0 + t, columns 8 jj + g) hit 32 banks without padding. */
__device__ static inline int64_t swz(int64_t k, int64_t j) {
    return k * TV + (j ^ ((k & 3) << 3));
}

/* The state update's operands for the calling warp's rows c0 .. c0 + 16 of a (dk, TV) state X
 * (swizzled, rows past dk zero): acc = diag(gn) X, then acc += buf^T B over k < K (buf (K, ld)
 * row-major, read transposed), and X = acc. */
__device__ static inline void decay_rows(float (&acc)[4][4], const float *gn, const float *X,
                                         int64_t c0, int64_t dk) {
    frag_each<4>([&](int j, int e, int r, int col) {
        acc[j][e] = c0 + r < dk ? gn[c0 + r] * X[swz(c0 + r, col)] : 0.0f;
    });
}
__device__ static inline void update_rows(float (&acc)[4][4], const float *buf, int64_t ld,
                                          const float *B, int64_t c0, int64_t dk, int64_t K) {
    warp_mma<4>(
        acc, 4, [&](int64_t r, int64_t k) { return c0 + r < dk ? buf[k * ld + c0 + r] : 0.0f; },
        [&](int64_t k, int64_t col) { return B[swz(k, col)]; }, K);
}
__device__ static inline void store_rows(const float (&acc)[4][4], float *X, int64_t c0,
                                         int64_t dk) {
    frag_each<4>([&](int j, int e, int r, int col) {
        if (c0 + r < dk) X[swz(c0 + r, col)] = acc[j][e];
    });
}

/* acc = A1 X + A2 Y for the calling warp's (16, 16) tile at columns cb of a (rows, TV) output:
 * A1 (16, K1) and A2 (16, K2) row-major, rows ld1 and ld2 apart; X (K1, TV) and Y (K2, TV)
 * swizzled (K2 = 0: no second term). */
__device__ static inline void tile_two(float (&acc)[2][4], const float *a1, int64_t ld1,
                                       const float *X, int64_t K1, const float *a2, int64_t ld2,
                                       const float *Y, int64_t K2, int64_t cb) {
    frag_each<2>([&](int j, int e, int, int) { acc[j][e] = 0.0f; });
    warp_mma<2>(
        acc, 2, [&](int64_t r, int64_t k) { return a1[r * ld1 + k]; },
        [&](int64_t k, int64_t col) { return X[swz(k, cb + col)]; }, K1);
    warp_mma<2>(
        acc, 2, [&](int64_t r, int64_t k) { return a2[r * ld2 + k]; },
        [&](int64_t k, int64_t col) { return Y[swz(k, cb + col)]; }, K2);
}

/* Rows 0 .. n of src (cols wide, rows lds apart) into dst by asynchronous copies of the calling
 * thread's share, element (r, c) to dst[r * ld + c] (T: dst[c * ld + r]); rows n .. n8 and
 * columns cols .. cols8 (n and cols rounded up to 8) are zero, so that products may run over
 * whole k steps.  The caller commits, waits and synchronises. */
template <bool T>
__device__ static inline void stage_rows(float *dst, int64_t ld, const float *src, int64_t lds,
                                         int64_t n, int64_t cols, int tid, int nt) {
    const int64_t n8 = up_to(n, 8), c8 = up_to(cols, 8);
    for (int64_t i = tid; i < n8 * c8; i += nt) {
        const int64_t r = i / c8, c = i % c8;
        const bool ok = r < n && c < cols;
        cp_async4(dst + (T ? c * ld + r : r * ld + c), ok ? src + r * lds + c : src, ok);
    }
}

/* Shared floats of one of the state passes' operand buffers: (C16, dk + 4), C16 = C rounded up
 * to 16 (the products' row tiles read whole tiles; rows past the chunk's are never used). */
__host__ __device__ static inline int64_t state_buf_floats(int64_t dk, int64_t C) {
    return up_to(C, 16) * (dk + 4);
}

/* Shared floats of a state pass: the state (dk8, TV), two operand buffers, `tiles` (C16, TV)
 * tiles and A_qk (C16, C16 + 4), in that order (the kernels carve them so). */
static size_t state_smem_bytes(int64_t dk, int64_t C, int64_t tiles) {
    const int64_t C16 = up_to(C, 16);
    return sizeof(float) * (size_t)(up_to(dk, 8) * TV + 2 * state_buf_floats(dk, C) +
                                    tiles * C16 * TV + C16 * (C16 + 4));
}

/* Kernel 2: one block per (TV-column slice, head, document), 256 threads, chunks in order, the
 * products on tensor cores (3xTF32, warp_mma).  Vt and O, (n, TV): warp w takes rows 16 (w % 4)
 * .. + 16 and columns 16 (w / 4) .. + 16; the state update (dk, TV): rows (key channels) 16 w ..
 * + 16, all columns.  The chunk's operands W, Qg (with Aqk) and Kb pass through two buffers by
 * asynchronous copies, each copied while the one before it is multiplied (the next chunk's W
 * during the state update), rows past the chunk's n zero.  Shared: S (dk8, TV) and Vt (C16, TV)
 * swizzled (swz), the buffers (state_buf_floats), Aqk (C16, C16 + 4): 107 KB at dk = 128, C =
 * 64, two blocks an SM.  The buffers' and Aqk's strides (dk + 4, C16 + 4) make the A fragments'
 * reads hit 32 banks; Kb is read as Kb^T from its row-major buffer (two lanes a bank). */
__global__ void __launch_bounds__(256)
    k_kda_chunk_state(float *o, float *S, float *chunk_states, const float *ws, const int32_t *ix,
                      int32_t N, int64_t H, int64_t dk, int64_t dv, int64_t C) {
    extern __shared__ float sm[];
    const int64_t j0 = (int64_t)blockIdx.x * TV, h = blockIdx.y;
    const int32_t di = blockIdx.z;
    const int64_t C16 = up_to(C, 16), dk8 = up_to(dk, 8);
    const int64_t LB = dk + 4, LT = C16 + 4, BUF = state_buf_floats(dk, C);
    float *Ss = sm, *bufs = Ss + dk8 * TV, *Vt = bufs + 2 * BUF, *As = Vt + C16 * TV;
    const int tid = threadIdx.x, nt = blockDim.x, w = tid >> 5;
    const int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    float *Sd = S + ((int64_t)di * H + h) * dk * dv;
    const int64_t nj = dv - j0 < TV ? dv - j0 : TV;
    const int64_t rb = 16 * (w & 3), cb = 16 * (w >> 2); /* Vt and O tiles */

    for (int64_t i = tid; i < dk8 * TV; i += nt) {
        const int64_t c = i / TV, jj = i % TV;
        Ss[swz(c, jj)] = c < dk && jj < nj ? Sd[c * dv + j0 + jj] : 0.0f;
    }
    int m = 0; /* the operand in use is in bufs + (m & 1) * BUF */
    if (doc[di] < doc[di + 1]) {
        const chunk_ptrs P0 = scratch_of((float *)ws, doc[di], h, H, dk, dv, C);
        stage_rows<false>(bufs, LB, P0.W, dk, ch[2 * doc[di] + 1], dk, tid, nt);
    }
    cp_async_commit();
    __syncthreads();
    for (int32_t ci = doc[di]; ci < doc[di + 1]; ci++) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1], n8 = up_to(n, 8);
        const bool busy = rb < n; /* warp-uniform */
        chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        if (chunk_states) {
            float *cs = chunk_states + ((int64_t)ci * H + h) * dk * dv;
            for (int64_t i = tid; i < dk * nj; i += nt) {
                const int64_t c = i / nj, jj = i % nj;
                cs[c * dv + j0 + jj] = Ss[swz(c, jj)];
            }
        }
        /* (5) Vt = U - W S; Qg and Aqk on their way */
        stage_rows<false>(bufs + ((m + 1) & 1) * BUF, LB, P.Qg, dk, n, dk, tid, nt);
        stage_rows<false>(As, LT, P.Aqk, C, n, n, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (busy) {
            float acc[2][4];
            tile_two(acc, bufs + (m & 1) * BUF + rb * LB, LB, Ss, dk8, As, LT, Vt, 0, cb);
            frag_each<2>([&](int jt, int e, int ro, int co) {
                const int64_t r = rb + ro, jj = cb + co;
                Vt[swz(r, jj)] = r < n && jj < nj ? P.U[r * dv + j0 + jj] - acc[jt][e] : 0.0f;
            });
        }
        __syncthreads();
        m++;
        /* (7) O = Qg S + Aqk Vt; Kb on its way */
        stage_rows<false>(bufs + ((m + 1) & 1) * BUF, LB, P.Kb, dk, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (busy) {
            float acc[2][4];
            tile_two(acc, bufs + (m & 1) * BUF + rb * LB, LB, Ss, dk8, As + rb * LT, LT, Vt, n8,
                     cb);
            frag_each<2>([&](int jt, int e, int ro, int co) {
                const int64_t r = rb + ro, jj = cb + co;
                if (r < n && jj < nj) o[((t0 + r) * H + h) * dv + j0 + jj] = acc[jt][e];
            });
        }
        __syncthreads();
        m++;
        /* (8) S = diag(gn) S + Kb^T Vt; the next chunk's W on its way */
        if (ci + 1 < doc[di + 1]) {
            const chunk_ptrs Pn = scratch_of((float *)ws, ci + 1, h, H, dk, dv, C);
            stage_rows<false>(bufs + ((m + 1) & 1) * BUF, LB, Pn.W, dk, ch[2 * (ci + 1) + 1], dk,
                              tid, nt);
        }
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (16 * w < dk) { /* warp-uniform */
            float acc[4][4];
            decay_rows(acc, P.gn, Ss, 16 * w, dk);
            update_rows(acc, bufs + (m & 1) * BUF, LB, Vt, 16 * w, dk, n8);
            store_rows(acc, Ss, 16 * w, dk);
        }
        __syncthreads();
        m++;
    }
    for (int64_t i = tid; i < dk * nj; i += nt) {
        const int64_t c = i / nj, jj = i % nj;
        Sd[c * dv + j0 + jj] = Ss[swz(c, jj)];
    }
}

/* The chunkwise entry points' limits checked (ops.h); the chunks the index table must hold. */
static int64_t chunk_args(int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t C) {
    ARL_ASSERT(N >= 1 && H >= 1 && dk >= 1 && dv >= 1);
    ARL_ASSERT(dk <= ARL_CUDA_KDA_MAX_DK && dv <= ARL_CUDA_KDA_MAX_DV && C >= 1 &&
               C <= ARL_CUDA_KDA_MAX_C);
    ARL_ASSERT(chunks_fit(T, N, C));
    return max_chunks(T, N, C);
}

/* The chunk table of the packed documents and kernel 1 (the per-chunk prep, all chunks in
 * parallel) into ws: the common first stage of the chunkwise forward and backward. */
static void chunk_prep_launch(arl_cuda_ctx *c, float *ws, const float *q, const float *k,
                              const float *v, const float *g, const float *beta, const int32_t *cu,
                              int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                              int64_t C, int64_t nc) {
    k_chunk_table<<<1, CT_THREADS, 0, c->stream>>>(c->index, cu, N, T, C, chunk_cap(N), c->err);
    const int factored = c->kda_prep != ARL_CUDA_KDA_PREP_DIFFERENCE;
    const size_t sm1 = sizeof(float) * prep_smem_floats(dk, dv, C, factored);
    const dim3 grid((unsigned)nc, (unsigned)H);
    auto prep = factored ? k_kda_chunk_prep<true> : k_kda_chunk_prep<false>;
    cudaFuncSetAttribute(prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm1);
    prep<<<grid, 256, sm1, c->stream>>>(ws, c->index, q, k, v, g, beta, N, H, dk, dv, scale, C);
}

extern "C" int32_t arl_cuda_kda_prep_form(int32_t form) {
    ARL_ASSERT(form == ARL_CUDA_KDA_PREP_FACTORED || form == ARL_CUDA_KDA_PREP_DIFFERENCE);
    return arl_cuda_swap_setting(&arl_cuda_need()->kda_prep, form);
}

extern "C" void arl_cuda_kda_chunk_prep(float *ws, const float *q, const float *k, const float *v,
                                        const float *g, const float *beta, const int32_t *cu,
                                        int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv,
                                        float scale, int64_t C) {
    arl_cuda_ctx *c = arl_cuda_need();
    const int64_t nc = chunk_args(N, T, H, dk, dv, C);
    if (T == 0) return;
    chunk_prep_launch(c, ws, q, k, v, g, beta, cu, N, T, H, dk, dv, scale, C, nc);
    ARL_CUDA_LAUNCHED(c, "kda_chunk_prep");
}

extern "C" void arl_cuda_kda_chunk_fwd(float *o, float *S, float *chunk_states, const float *q,
                                       const float *k, const float *v, const float *g,
                                       const float *beta, const int32_t *cu, int32_t N, int64_t T,
                                       int64_t H, int64_t dk, int64_t dv, float scale, int64_t C,
                                       float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    static_assert(ARL_CUDA_KDA_MAX_C <= 64 && ARL_CUDA_KDA_MAX_DK <= 128, "state pass tiles");
    const int64_t nc = chunk_args(N, T, H, dk, dv, C);
    if (T == 0) return;
    chunk_prep_launch(c, ws, q, k, v, g, beta, cu, N, T, H, dk, dv, scale, C, nc);
    const size_t sm2 = state_smem_bytes(dk, C, 1); /* Vt */
    cudaFuncSetAttribute(k_kda_chunk_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2);
    dim3 g2((unsigned)((dv + TV - 1) / TV), (unsigned)H, (unsigned)N);
    k_kda_chunk_state<<<g2, 256, sm2, c->stream>>>(o, S, chunk_states, ws, c->index, N, H, dk, dv,
                                                   C);
    ARL_CUDA_LAUNCHED(c, "kda_chunk_fwd");
}

/* ======================= recurrent-rule backward (spec 3.7) ============================== */

extern "C" int64_t arl_cuda_kda_bwd_ws_floats(int32_t N, int64_t H, int64_t dk, int64_t dv,
                                              int64_t C) {
    return (int64_t)N * H * C * dk * dv;
}

/* One block per (head, document), 256 threads.  Shared: dS and Sp (dk, dv + 1), vectors. */
__global__ void k_kda_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                          const float *d_o, const float *dS_T, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          const float *chunk_states, const int32_t *ix, int32_t N, int64_t H,
                          int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    extern __shared__ float sm[];
    const int64_t h = blockIdx.x;
    const int32_t di = blockIdx.y;
    const int64_t L = dv + 1;
    float *dS = sm, *Sp = dS + dk * L;
    float *kv = Sp + dk * L, *qv = kv + dk, *al = qv + dk; /* (dk) each */
    float *vv = al + dk, *dov = vv + dv, *rv = dov + dv, *dlt = rv + dv, *ddl = dlt + dv,
          *drv = ddl + dv; /* (dv) each */
    __shared__ double shd[33];
    const int tid = threadIdx.x, nt = blockDim.x;
    const int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    float *st = ws + ((int64_t)di * H + h) * C * dk * dv; /* per-token states of a chunk */
    const int64_t sd = ((int64_t)di * H + h) * dk * dv;

    for (int64_t i = tid; i < dk * dv; i += nt)
        dS[(i / dv) * L + i % dv] = dS_T ? dS_T[sd + i] : 0.0f;
    __syncthreads();
    for (int32_t ci = doc[di + 1] - 1; ci >= doc[di]; ci--) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
        /* recompute S_{t-1} for every token of the chunk into st */
        const float *cs = chunk_states + ((int64_t)ci * H + h) * dk * dv;
        for (int64_t i = tid; i < dk * dv; i += nt)
            Sp[(i / dv) * L + i % dv] = cs[i];
        __syncthreads();
        for (int64_t r = 0; r < n - 1; r++) {
            const int64_t t = t0 + r, b = (t * H + h) * dk;
            for (int64_t i = tid; i < dk * dv; i += nt)
                st[r * dk * dv + i] = Sp[(i / dv) * L + i % dv];
            for (int64_t c = tid; c < dk; c += nt) {
                kv[c] = k[b + c];
                al[c] = expf(g[b + c]);
            }
            __syncthreads();
            for (int64_t j = tid; j < dv; j += nt) {
                float acc = 0.0f;
                for (int64_t c = 0; c < dk; c++)
                    acc += al[c] * Sp[c * L + j] * kv[c];
                dlt[j] = beta[t * H + h] * (v[(t * H + h) * dv + j] - acc);
            }
            __syncthreads();
            for (int64_t i = tid; i < dk * dv; i += nt) {
                int64_t c = i / dv, j = i % dv;
                Sp[c * L + j] = al[c] * Sp[c * L + j] + kv[c] * dlt[j];
            }
            __syncthreads();
        }
        for (int64_t i = tid; i < dk * dv; i += nt)
            st[(n - 1) * dk * dv + i] = Sp[(i / dv) * L + i % dv];
        __syncthreads();
        /* tokens in reverse */
        for (int64_t r = n - 1; r >= 0; r--) {
            const int64_t t = t0 + r, b = (t * H + h) * dk, bv = (t * H + h) * dv;
            const float bt = beta[t * H + h];
            for (int64_t i = tid; i < dk * dv; i += nt)
                Sp[(i / dv) * L + i % dv] = st[r * dk * dv + i];
            for (int64_t c = tid; c < dk; c += nt) {
                kv[c] = k[b + c];
                qv[c] = scale * q[b + c];
                al[c] = expf(g[b + c]);
            }
            for (int64_t j = tid; j < dv; j += nt) {
                vv[j] = v[bv + j];
                dov[j] = d_o[bv + j];
            }
            __syncthreads();
            /* r = S~^T k, delta = beta (v - r) */
            for (int64_t j = tid; j < dv; j += nt) {
                float acc = 0.0f;
                for (int64_t c = 0; c < dk; c++)
                    acc += al[c] * Sp[c * L + j] * kv[c];
                rv[j] = acc;
                dlt[j] = bt * (vv[j] - acc);
            }
            /* dS += (s q) do^T */
            for (int64_t i = tid; i < dk * dv; i += nt) {
                int64_t c = i / dv, j = i % dv;
                dS[c * L + j] += qv[c] * dov[j];
            }
            __syncthreads();
            /* dq = s S_t do (threads < dk);  ddelta = dS^T k (threads >= 128) */
            if (tid < dk) {
                int64_t c = tid;
                float acc = 0.0f, acck = 0.0f;
                for (int64_t j = 0; j < dv; j++) {
                    float Stc = al[c] * Sp[c * L + j] + kv[c] * dlt[j];
                    acc += Stc * dov[j];
                    acck += dS[c * L + j] * dlt[j];
                }
                dq[b + c] += scale * acc;
                qv[c] = acck; /* reuse: dk part 1 = dS delta */
            } else if (tid >= 128 && tid - 128 < dv) {
                int64_t j = tid - 128;
                float acc = 0.0f;
                for (int64_t c = 0; c < dk; c++)
                    acc += dS[c * L + j] * kv[c];
                ddl[j] = acc;
            }
            __syncthreads();
            double db = 0.0;
            for (int64_t j = tid; j < dv; j += nt) {
                db += (double)ddl[j] * (vv[j] - rv[j]);
                dv_[bv + j] += bt * ddl[j];
                drv[j] = -bt * ddl[j];
            }
            db = arl_block_sum_d(db, shd); /* synchronises */
            if (tid == 0) dbeta[t * H + h] += (float)db;
            /* dS~ = dS + k dr^T */
            for (int64_t i = tid; i < dk * dv; i += nt) {
                int64_t c = i / dv, j = i % dv;
                dS[c * L + j] += kv[c] * drv[j];
            }
            __syncthreads();
            /* dk += S~ dr;  dg = alpha rowsum(dS~ . S_{t-1}) */
            if (tid < dk) {
                int64_t c = tid;
                float a1 = 0.0f, a2 = 0.0f;
                for (int64_t j = 0; j < dv; j++) {
                    a1 += Sp[c * L + j] * drv[j];
                    a2 += dS[c * L + j] * Sp[c * L + j];
                }
                dk_[b + c] += qv[c] + al[c] * a1;
                dg[b + c] += al[c] * a2;
            }
            __syncthreads();
            /* dS = diag(alpha) dS~ */
            for (int64_t i = tid; i < dk * dv; i += nt) {
                int64_t c = i / dv, j = i % dv;
                dS[c * L + j] *= al[c];
            }
            __syncthreads();
        }
    }
    if (dS0)
        for (int64_t i = tid; i < dk * dv; i += nt)
            dS0[sd + i] += dS[(i / dv) * L + i % dv];
}

extern "C" void arl_cuda_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg,
                                           float *dbeta, float *dS0, const float *d_o,
                                           const float *dS_T, const float *q, const float *k,
                                           const float *v, const float *g, const float *beta,
                                           const float *chunk_states, const int32_t *cu, int32_t N,
                                           int64_t T, int64_t H, int64_t dk, int64_t dv,
                                           float scale, int64_t C, float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(N >= 1 && H >= 1 && dk >= 1 && dk <= 128 && dv >= 1 && dv <= 128 && C >= 1);
    ARL_ASSERT(chunks_fit(T, N, C));
    if (T == 0) return;
    k_chunk_table<<<1, CT_THREADS, 0, c->stream>>>(c->index, cu, N, T, C, chunk_cap(N), c->err);
    size_t sm = sizeof(float) * (size_t)(2 * dk * (dv + 1) + 3 * dk + 6 * dv);
    cudaFuncSetAttribute(k_kda_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    k_kda_bwd<<<dim3((unsigned)H, (unsigned)N), 256, sm, c->stream>>>(
        dq, dk_, dv_, dg, dbeta, dS0, d_o, dS_T, q, k, v, g, beta, chunk_states, c->index, N, H, dk,
        dv, scale, C, ws);
    ARL_CUDA_LAUNCHED(c, "kda_recurrent_bwd");
}

/* ======================= chunkwise backward (spec 3.8) =================================== */

/* ws layout: the forward's per-chunk scratch (recomputed by k_kda_chunk_prep), then dSp
 * (n_chunks, H, dk, dv) the gradient of each chunk's outgoing state, dVt (T, H, dv) the
 * gradient of the pseudo-values, and per (chunk, head) C (4 dk + 2 dv) floats for k_kda_cbwd. */
static int64_t cbwd_scratch(int64_t dk, int64_t dv, int64_t C) {
    return C * (4 * dk + 2 * dv);
}

extern "C" int64_t arl_cuda_kda_chunk_bwd_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk,
                                                    int64_t dv, int64_t C) {
    if (!chunks_fit(T, N, C)) return -1;
    int64_t nc = max_chunks(T, N, C);
    return nc * H * chunk_scratch(dk, dv, C) + nc * H * dk * dv + T * H * dv +
           nc * H * cbwd_scratch(dk, dv, C);
}

/* Reverse state pass, one block per (TV-column slice, head, document), chunks in reverse:
 *   dSp[ci] = dS (the gradient of the chunk's outgoing state)
 *   dVt = Aqk^T dO + Kb dS
 *   dS <- diag(gn) dS + Qg^T dO - W^T dVt          (becomes the previous chunk's dS)
 * Every column of dS is independent, as in the forward.  The products on tensor cores as in
 * k_kda_chunk_state: dVt (n, TV) by warp w's rows 16 (w % 4) and columns 16 (w / 4), the update
 * (dk, TV) by rows 16 w; Kb, then Qg and W (read transposed) through two buffers, Aqk staged
 * transposed.  Shared: dS (dk8, TV), dO and dV (C16, TV) swizzled (swz), the buffers, Aqk^T (C16,
 * C16 + 4).  dV holds -dVt, so that the update's last product subtracts. */
__global__ void __launch_bounds__(256)
    k_kda_cbwd_state(float *dSp_all, float *dVt_all, float *dS0, const float *dS_T,
                     const float *d_o, const float *ws, const int32_t *ix, int32_t N, int64_t H,
                     int64_t dk, int64_t dv, int64_t C) {
    extern __shared__ float sm[];
    const int64_t j0 = (int64_t)blockIdx.x * TV, h = blockIdx.y;
    const int32_t di = blockIdx.z;
    const int64_t C16 = up_to(C, 16), dk8 = up_to(dk, 8);
    const int64_t LB = dk + 4, LT = C16 + 4, BUF = state_buf_floats(dk, C);
    float *dS = sm, *bufs = dS + dk8 * TV, *dO = bufs + 2 * BUF, *dV = dO + C16 * TV;
    float *As = dV + C16 * TV;
    const int tid = threadIdx.x, nt = blockDim.x, w = tid >> 5;
    const int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    const int64_t sd = ((int64_t)di * H + h) * dk * dv;
    const int64_t nj = dv - j0 < TV ? dv - j0 : TV;
    const int64_t rb = 16 * (w & 3), cb = 16 * (w >> 2), c0 = 16 * w;

    for (int64_t i = tid; i < dk8 * TV; i += nt) {
        const int64_t c = i / TV, jj = i % TV;
        dS[swz(c, jj)] = (dS_T && c < dk && jj < nj) ? dS_T[sd + c * dv + j0 + jj] : 0.0f;
    }
    /* a chunk's first operands (Kb, Aqk^T and its dO slice), then Qg, then W, through two
     * buffers: each copied asynchronously while the one before it is multiplied */
    const auto stage_first = [&](int32_t ci, float *kb_buf) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1], n8 = up_to(n, 8);
        const chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        stage_rows<false>(kb_buf, LB, P.Kb, dk, n, dk, tid, nt);
        stage_rows<true>(As, LT, P.Aqk, C, n, n, tid, nt);
        for (int64_t i = tid; i < n8 * TV; i += nt) {
            const int64_t r = i / TV, jj = i % TV;
            const bool ok = r < n && jj < nj;
            cp_async4(dO + swz(r, jj), ok ? d_o + ((t0 + r) * H + h) * dv + j0 + jj : d_o, ok);
        }
    };
    int m = 0; /* the operand in use is in bufs + (m & 1) * BUF */
    if (doc[di + 1] > doc[di]) stage_first(doc[di + 1] - 1, bufs);
    cp_async_commit();
    __syncthreads();
    for (int32_t ci = doc[di + 1] - 1; ci >= doc[di]; ci--) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1], n8 = up_to(n, 8);
        chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        float *dSp = dSp_all + ((int64_t)ci * H + h) * dk * dv;
        for (int64_t i = tid; i < dk * nj; i += nt) {
            const int64_t c = i / nj, jj = i % nj;
            dSp[c * dv + j0 + jj] = dS[swz(c, jj)];
        }
        stage_rows<false>(bufs + ((m + 1) & 1) * BUF, LB, P.Qg, dk, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (rb < n) { /* dVt = Aqk^T dO + Kb dS (warp-uniform) */
            float acc[2][4];
            tile_two(acc, bufs + (m & 1) * BUF + rb * LB, LB, dS, dk8, As + rb * LT, LT, dO, n8,
                     cb);
            frag_each<2>([&](int jt, int e, int ro, int co) {
                const int64_t r = rb + ro, jj = cb + co;
                const bool ok = r < n && jj < nj;
                dV[swz(r, jj)] = ok ? -acc[jt][e] : 0.0f;
                if (ok) dVt_all[((t0 + r) * H + h) * dv + j0 + jj] = acc[jt][e];
            });
        }
        __syncthreads();
        m++;
        stage_rows<false>(bufs + ((m + 1) & 1) * BUF, LB, P.W, dk, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        float acc[4][4]; /* dS <- diag(gn) dS + Qg^T dO - W^T dVt, rows c0 .. c0 + 16 */
        if (c0 < dk) {   /* warp-uniform */
            decay_rows(acc, P.gn, dS, c0, dk);
            update_rows(acc, bufs + (m & 1) * BUF, LB, dO, c0, dk, n8);
        }
        __syncthreads();
        m++;
        if (ci > doc[di]) stage_first(ci - 1, bufs + ((m + 1) & 1) * BUF);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (c0 < dk) {
            update_rows(acc, bufs + (m & 1) * BUF, LB, dV, c0, dk, n8);
            store_rows(acc, dS, c0, dk);
        }
        __syncthreads();
        m++;
    }
    if (dS0)
        for (int64_t i = tid; i < dk * nj; i += nt) {
            const int64_t c = i / nj, jj = i % nj;
            dS0[sd + c * dv + j0 + jj] += dS[swz(c, jj)];
        }
}

/* Shared floats of k_kda_cbwd: Ks, Qs, Gs (C, dk + 1); dA, dT (C, C + 1); beta, dbeta (C); dGn
 * (dk); one float of padding; then one region used in turn by the staged products' slices, by Tm,
 * Akk and Pm (C, C + 1) each, and by the pair terms' factors Rf (C, dk + 1) and Lf (KDA_SUB, dk +
 * 1). */
static size_t cbwd_smem_floats(int64_t dk, int64_t C) {
    const int64_t LD = dk + 1, LA = C + 1;
    int64_t reg = staged_smem_floats();
    if (3 * C * LA > reg) reg = 3 * C * LA;
    if ((C + KDA_SUB) * LD > reg) reg = (C + KDA_SUB) * LD;
    return (size_t)(3 * C * LD + 2 * C * LA + 2 * C + dk + 1 + reg);
}

/* Per (chunk, head): everything of spec 3.8 that stays inside the chunk, from the stored
 * incoming state S, the outgoing-state gradient dSp, dVt and dO.  The products with a dv or dk
 * long reduction (Vt, dAqk, M, dW, dKbar, dT) and the UT transform's T^T dW, T^T dU are staged
 * products (tensor cores, 3xTF32); the pair terms of A_qk and A_kk are in the factored form
 * of the CPU reference (policy/kda.c chunk_pairs_bwd): per sub-chunk of KDA_SUB rows, one exp
 * per (row, channel) instead of one per (pair, channel) and the pair sums as products on tensor
 * cores, or the difference form in scalar code where a factor would leave e^KDA_FACTOR_SPAN.
 * Gradients of q, k, v are added to the outputs directly (this block owns the chunk's rows); dG
 * is kept in the scratch until its reverse cumulative sum.
 * (256, 1): one block per SM (the shared memory leaves room for no second), so each thread may
 * hold 255 registers and the products' accumulators and fragments stay in them (sm_90: 194, no
 * spills). */
__global__ void __launch_bounds__(256, 1)
    k_kda_cbwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, const float *q,
               const float *k, const float *v, const float *g, const float *beta,
               const float *chunk_states, const float *dSp_all, const float *dVt_all,
               const float *d_o, const float *ws, float *ws3, const int32_t *ix, int32_t N,
               int64_t H, int64_t dk, int64_t dv, float scale, int64_t C) {
    extern __shared__ float sm[];
    const int64_t ci = blockIdx.x, h = blockIdx.y;
    if (ci >= ix[0]) return;
    const int32_t *ch = CT_CHUNKS(ix, N);
    const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
    const int64_t LD = dk + 1, LA = C + 1, HV = H * dv;
    float *Ks = sm, *Qs = Ks + C * LD, *Gs = Qs + C * LD, *dA = Gs + C * LD, *dT = dA + C * LA;
    float *bs = dT + C * LA, *dbs = bs + C, *dGn = dbs + C;
    float *Rg = dGn + dk + 1; /* the region (after a float of padding) */
    float *As = Rg, *Bs = As + SP_ROWS * TJP;
    float *Tm = Rg, *Ak = Tm + C * LA, *Pm = Ak + C * LA;
    float *Rf = Rg, *Lf = Rf + C * LD;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
    const chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
    const float *S = chunk_states + (ci * H + h) * dk * dv;  /* (dk, dv) */
    const float *dSp = dSp_all + (ci * H + h) * dk * dv;     /* (dk, dv) */
    const float *dOc = d_o + (t0 * H + h) * dv;              /* (n, dv), rows HV apart */
    const float *dUc = dVt_all + (t0 * H + h) * dv;          /* (n, dv), rows HV apart */
    const float *vc = v + (t0 * H + h) * dv;                 /* (n, dv), rows HV apart */
    float *Vts = ws3 + (ci * H + h) * C * (4 * dk + 2 * dv); /* (C, dv) */
    float *dW = Vts + C * dv, *dGs = dW + C * dk, *E1 = dGs + C * dk, *dXw = E1 + C * dk;
    float *dXu = dXw + C * dk; /* (C, dv) */
    prod_acc acc;
#define ROW(x, r) (((t0 + (r)) * H + h) * (x))
    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t r = i / dk, c = i % dk;
        Ks[r * LD + c] = k[ROW(dk, r) + c];
        Qs[r * LD + c] = scale * q[ROW(dk, r) + c];
        Gs[r * LD + c] = g[ROW(dk, r) + c];
    }
    for (int64_t r = tid; r < n; r += nt) {
        bs[r] = beta[(t0 + r) * H + h];
        dbs[r] = 0.0f;
    }
    __syncthreads();
    for (int64_t c = tid; c < dk; c += nt)
        for (int64_t r = 1; r < n; r++)
            Gs[r * LD + c] += Gs[(r - 1) * LD + c];
    { /* Vt = U - W S */
        const prod_term t = {P.W, dk, S, dv, dk}, none = {};
        staged_product<false>(acc, t, none, n, dv, As, Bs, tid, nt);
        tile_each(acc, tid, n, dv,
                  [&](int64_t r, int64_t s, float x) { Vts[r * dv + s] = P.U[r * dv + s] - x; });
    }
    { /* dAqk = Tril(dO Vt^T) */
        const prod_term t = {dOc, HV, Vts, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, n, As, Bs, tid, nt);
        tile_each(acc, tid, n, n,
                  [&](int64_t r, int64_t s, float x) { dA[r * LA + s] = s <= r ? x : 0.0f; });
    }
    { /* M = dO S^T: dQ = Gamma M, dG = Gamma Q M */
        const prod_term t = {dOc, HV, S, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, tid, n, dk, [&](int64_t r, int64_t s, float x) {
            const float gam = expf(Gs[r * LD + s]);
            dq[ROW(dk, r) + s] += scale * gam * x;
            dGs[r * dk + s] = gam * Qs[r * LD + s] * x;
        });
    }
    { /* dW = -dVt S^T */
        const prod_term t = {dUc, HV, S, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, tid, n, dk, [&](int64_t r, int64_t s, float x) { dW[r * dk + s] = -x; });
    }
    { /* dKbar = Vt dSp^T: dK = exp(G_n - G) dKbar, dG -= Kbar dKbar */
        const prod_term t = {Vts, dv, dSp, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, tid, n, dk, [&](int64_t r, int64_t s, float x) {
            const float eb = expf(Gs[(n - 1) * LD + s] - Gs[r * LD + s]);
            const float kb = eb * Ks[r * LD + s];
            dk_[ROW(dk, r) + s] += eb * x;
            dGs[r * dk + s] -= kb * x;
            E1[r * dk + s] = kb * x;
        });
    }
    __syncthreads();
    /* dGn = colsum(Kbar . dKbar) + exp(Gn) rowsum(dSp . S), one warp per channel */
    for (int64_t c = tid >> 5; c < dk; c += nt >> 5) {
        float a1 = 0.0f, a2 = 0.0f;
        for (int64_t r = lane; r < n; r += 32)
            a1 += E1[r * dk + c];
        for (int64_t j = lane; j < dv; j += 32)
            a2 += dSp[c * dv + j] * S[c * dv + j];
        a1 = arl_warp_sum(a1);
        a2 = arl_warp_sum(a2);
        if (lane == 0) dGn[c] = a1 + expf(Gs[(n - 1) * LD + c]) * a2;
    }
    __syncthreads();
    for (int64_t i = tid; i < n * dk; i += nt) { /* Gamma K into E1 (X_w = beta Gamma K) */
        const int64_t r = i / dk, c = i % dk;
        E1[r * dk + c] = expf(Gs[r * LD + c]) * Ks[r * LD + c];
    }
    { /* dT (strictly lower) = dW X_w^T + dU X_u^T = (dW (Gamma K)^T + dVt V^T) diag(beta) */
        const prod_term t1 = {dW, dk, E1, dk, dk}, t2 = {dUc, HV, vc, HV, dv};
        staged_product<true>(acc, t1, t2, n, n, As, Bs, tid, nt);
        tile_each(acc, tid, n, n, [&](int64_t r, int64_t s, float x) {
            dT[r * LA + s] = s < r ? x * bs[s] : 0.0f;
        });
    }
    { /* dXw = T^T dW = dW + (T - I)^T dW (P.Tm: T - I, strictly lower, rows n.. zero) */
        const prod_term t = {P.Tm, C, dW, dk, n, true}, none = {};
        staged_product<false>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, tid, n, dk,
                  [&](int64_t x, int64_t c, float y) { dXw[x * dk + c] = dW[x * dk + c] + y; });
    }
    { /* dXu = T^T dU likewise */
        const prod_term t = {P.Tm, C, dUc, HV, n, true}, none = {};
        staged_product<false>(acc, t, none, n, dv, As, Bs, tid, nt);
        tile_each(acc, tid, n, dv,
                  [&](int64_t x, int64_t j, float y) { dXu[x * dv + j] = dUc[x * HV + j] + y; });
    }
    for (int64_t i = tid; i < C * C; i += nt) { /* the region's slices are consumed */
        Tm[(i / C) * LA + i % C] = P.Tm[i];
        Ak[(i / C) * LA + i % C] = P.Akk[i];
    }
    __syncthreads();
    /* Pm = dT T^T:  Pm[r, b] = sum_j dT[r, j] T[b, j] (T[b, b] = 1, j <= b) */
    for (int64_t i = tid; i < C * C; i += nt) {
        int64_t r = i / C, b = i % C;
        float a = 0.0f;
        if (r < n && b < n) {
            int64_t jmax = b < r - 1 ? b : r - 1; /* dT[r, j] is zero for j >= r */
            for (int64_t j = 0; j <= jmax; j++)
                a += dT[r * LA + j] * (j == b ? 1.0f : Tm[b * LA + j]);
        }
        Pm[r * LA + b] = a;
    }
    __syncthreads();
    /* dAkk[a, b] = -sum_i T[i, a] Pm[i, b] for a > b; into dT (read only by Pm) */
    for (int64_t i = tid; i < n * n; i += nt) {
        int64_t a = i / n, b = i % n;
        if (b < a) {
            float s = 0.0f;
            for (int64_t r = a; r < n; r++)
                s -= (r == a ? 1.0f : Tm[r * LA + a]) * Pm[r * LA + b];
            dT[a * LA + b] = s;
        }
    }
    __syncthreads();
    /* from X_w and X_u, and dbeta, one warp per row; then D = diag(beta) dAkk in place */
    for (int64_t x = tid >> 5; x < n; x += nt >> 5) {
        const float be = bs[x];
        float db = 0.0f;
        for (int64_t c = lane; c < dk; c += 32) {
            const float gk = expf(Gs[x * LD + c]) * dXw[x * dk + c];
            dk_[ROW(dk, x) + c] += be * gk;
            dGs[x * dk + c] += be * gk * Ks[x * LD + c];
            db += gk * Ks[x * LD + c];
        }
        for (int64_t j = lane; j < dv; j += 32) {
            dv_[ROW(dv, x) + j] += be * dXu[x * dv + j];
            db += vc[x * HV + j] * dXu[x * dv + j];
        }
        for (int64_t s2 = lane; s2 < x; s2 += 32) { /* A_kk / beta_x = the raw decayed k.k sum */
            db += dT[x * LA + s2] * Ak[x * LA + s2] / be;
            dT[x * LA + s2] *= be;
        }
        db = arl_warp_sum(db);
        if (lane == 0) dbs[x] = db;
    }
    /* the pair terms, per sub-chunk Q = [q0, q1) with boundary b = q0: for r in Q and i <= r,
     * exp(G_r - G_i) = Lf_r Rf_i with Lf = exp(G_Q - G_b), Rf = exp(G_b - G_{<q1}) */
    for (int64_t q0 = 0; q0 < n; q0 += KDA_SUB) {
        const int64_t q1 = n - q0 < KDA_SUB ? n : q0 + KDA_SUB, m = q1 - q0;
        __syncthreads(); /* the previous sub-chunk's factors and gradients are done */
        int wide = 0;    /* this thread saw an exponent past KDA_FACTOR_SPAN */
        for (int64_t i = tid; i < q1 * dk; i += nt) {
            const int64_t x = i / dk, c = i % dk;
            const float e = Gs[q0 * LD + c] - Gs[x * LD + c];
            if (e > KDA_FACTOR_SPAN) wide = 1;
            Rf[x * LD + c] = expf(e);
        }
        for (int64_t i = tid; i < m * dk; i += nt) {
            const int64_t x = q0 + i / dk, c = i % dk;
            const float e = Gs[x * LD + c] - Gs[q0 * LD + c];
            if (e > KDA_FACTOR_SPAN) wide = 1;
            Lf[(x - q0) * LD + c] = expf(e);
        }
        const bool fac = !__syncthreads_or(wide); /* block-uniform; the factors in place */
        const int w = tid >> 5;
        /* rows x of Q: tq (A_qk, x the query row), ti (A_kk, x the row) */
        if (fac) { /* tq = Lf (dA_Q KR), ti = Lf (dT_Q KR), KR = K Rf over the rows < q1, on
                    * tensor cores: warp w takes the columns 16 w .. + 16 */
            const int64_t cb = 16 * w, K8 = up_to(q1, 8);
            if (cb < dk) { /* warp-uniform */
                const int ntile = dk - cb > 8 ? 2 : 1;
                const auto kr = [&](int64_t s2, int64_t col) {
                    const int64_t c = cb + col;
                    return s2 < q1 && c < dk ? Ks[s2 * LD + c] * Rf[s2 * LD + c] : 0.0f;
                };
                float aq[2][4] = {}, ai[2][4] = {};
                /* acc = D_Q KR */
                const auto rows = [&](float(&acc)[2][4], const float *D) {
                    warp_mma<2>(
                        acc, ntile,
                        [&](int64_t r, int64_t s2) {
                            return q0 + r < q1 && s2 < q1 ? D[(q0 + r) * LA + s2] : 0.0f;
                        },
                        kr, K8);
                };
                rows(aq, dA);
                rows(ai, dT);
                frag_each<2>([&](int j, int e, int ro, int co) {
                    const int64_t x = q0 + ro, c = cb + co;
                    if (x >= q1 || c >= dk) return;
                    const float l = Lf[ro * LD + c], tq = l * aq[j][e], ti = l * ai[j][e];
                    dq[ROW(dk, x) + c] += scale * tq;
                    dk_[ROW(dk, x) + c] += ti;
                    dGs[x * dk + c] += Qs[x * LD + c] * tq + Ks[x * LD + c] * ti;
                });
            }
        } else { /* the difference form: one exp per pair and channel */
            for (int64_t i = tid; i < m * dk; i += nt) {
                const int64_t x = q0 + i / dk, c = i % dk;
                const float Gx = Gs[x * LD + c];
                float tq = 0.0f, ti = 0.0f;
                for (int64_t s2 = 0; s2 < x; s2++) {
                    const float kr = Ks[s2 * LD + c] * expf(Gx - Gs[s2 * LD + c]);
                    tq += dA[x * LA + s2] * kr;
                    ti += dT[x * LA + s2] * kr;
                }
                tq += dA[x * LA + x] * Ks[x * LD + c];
                dq[ROW(dk, x) + c] += scale * tq;
                dk_[ROW(dk, x) + c] += ti;
                dGs[x * dk + c] += Qs[x * LD + c] * tq + Ks[x * LD + c] * ti;
            }
        }
        __syncthreads();
        /* columns x < q1 against Q's rows r >= x: tk (A_qk, x the key row), tj (A_kk, x the
         * column) */
        if (fac) { /* Rf (dA_Q^T (Q Lf) + dT_Q^T (K Lf)) on tensor cores (dA_Q is zero above
                    * the diagonal, dT_Q on it): warp w takes the rows 16 (w % 4) .. + 16 and
                    * the columns 64 (w / 4) .. + 64 */
            const int64_t rb = 16 * (w & 3), cb = 64 * (w >> 2), m8 = up_to(m, 8);
            if (rb < q1 && cb < dk) { /* warp-uniform */
                const int ntile = dk - cb >= 64 ? 8 : (int)((dk - cb + 7) / 8);
                float acc[8][4] = {};
                /* acc += D_Q^T (X Lf) */
                const auto term = [&](const float *D, const float *X) {
                    warp_mma<8>(
                        acc, ntile,
                        [&](int64_t r, int64_t k) {
                            return rb + r < q1 && k < m ? D[(q0 + k) * LA + rb + r] : 0.0f;
                        },
                        [&](int64_t k, int64_t col) {
                            const int64_t c = cb + col;
                            return k < m && c < dk ? X[(q0 + k) * LD + c] * Lf[k * LD + c] : 0.0f;
                        },
                        m8);
                };
                term(dA, Qs);
                term(dT, Ks);
                frag_each<8>([&](int j, int e, int ro, int co) {
                    const int64_t x = rb + ro, c = cb + co;
                    if (x >= q1 || c >= dk) return;
                    const float y = Rf[x * LD + c] * acc[j][e];
                    dk_[ROW(dk, x) + c] += y;
                    dGs[x * dk + c] -= Ks[x * LD + c] * y;
                });
            }
        } else {
            for (int64_t i = tid; i < q1 * dk; i += nt) {
                const int64_t x = i / dk, c = i % dk;
                const float Gx = Gs[x * LD + c];
                float tk = x >= q0 ? dA[x * LA + x] * Qs[x * LD + c] : 0.0f, tj = 0.0f;
                for (int64_t r = x + 1 > q0 ? x + 1 : q0; r < q1; r++) {
                    const float f = expf(Gs[r * LD + c] - Gx);
                    tk += dA[r * LA + x] * Qs[r * LD + c] * f;
                    tj += dT[r * LA + x] * Ks[r * LD + c] * f;
                }
                dk_[ROW(dk, x) + c] += tk + tj;
                dGs[x * dk + c] -= Ks[x * LD + c] * (tk + tj);
            }
        }
    }
    __syncthreads();
    /* dG[n-1] += dGn; dg = reverse cumulative sum over the chunk's rows */
    for (int64_t c = tid; c < dk; c += nt) {
        float a = dGn[c];
        for (int64_t r = n - 1; r >= 0; r--) {
            a += dGs[r * dk + c];
            dg[ROW(dk, r) + c] += a;
        }
    }
    for (int64_t x = tid; x < n; x += nt)
        dbeta[(t0 + x) * H + h] += dbs[x];
#undef ROW
}

extern "C" void arl_cuda_kda_chunk_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta,
                                       float *dS0, const float *d_o, const float *dS_T,
                                       const float *q, const float *k, const float *v,
                                       const float *g, const float *beta, const float *chunk_states,
                                       const int32_t *cu, int32_t N, int64_t T, int64_t H,
                                       int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    const int64_t nc = chunk_args(N, T, H, dk, dv, C);
    if (T == 0) return;
    float *ws_fwd = ws, *dSp = ws_fwd + nc * H * chunk_scratch(dk, dv, C);
    float *dVt = dSp + nc * H * dk * dv, *ws3 = dVt + T * H * dv;
    chunk_prep_launch(c, ws_fwd, q, k, v, g, beta, cu, N, T, H, dk, dv, scale, C, nc);
    const size_t sm2 = state_smem_bytes(dk, C, 2); /* dO, dV */
    cudaFuncSetAttribute(k_kda_cbwd_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2);
    dim3 g2((unsigned)((dv + TV - 1) / TV), (unsigned)H, (unsigned)N);
    k_kda_cbwd_state<<<g2, 256, sm2, c->stream>>>(dSp, dVt, dS0, dS_T, d_o, ws_fwd, c->index, N, H,
                                                  dk, dv, C);
    static_assert(ARL_CUDA_KDA_MAX_C <= SP_ROWS && ARL_CUDA_KDA_MAX_DK <= SP_COLS &&
                      ARL_CUDA_KDA_MAX_DV <= SP_COLS,
                  "staged products");
    size_t sm3 = sizeof(float) * cbwd_smem_floats(dk, C);
    cudaFuncSetAttribute(k_kda_cbwd, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm3);
    k_kda_cbwd<<<dim3((unsigned)nc, (unsigned)H), 256, sm3, c->stream>>>(
        dq, dk_, dv_, dg, dbeta, q, k, v, g, beta, chunk_states, dSp, dVt, d_o, ws_fwd, ws3,
        c->index, N, H, dk, dv, scale, C);
    ARL_CUDA_LAUNCHED(c, "kda_chunk_bwd");
}
