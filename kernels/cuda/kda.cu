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

__global__ void k_chunk_table(int32_t *ix, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                              int32_t cap, arl_cuda_errword *err) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int32_t nc = 0;
    int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    for (int32_t di = 0; di < N; di++) {
        int64_t a = cu ? cu[di] : 0, b = cu ? cu[di + 1] : T;
        doc[di] = nc;
        for (int64_t s = a; s < b; s += C) {
            if (nc >= cap) {
                arl_dev_error(err, 3, nc);
                ix[0] = 0;
                return;
            }
            ch[2 * nc] = (int32_t)s;
            ch[2 * nc + 1] = (int32_t)(b - s < C ? b - s : C);
            nc++;
        }
    }
    doc[N] = nc;
    ix[0] = nc;
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
                                const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk,
                                int64_t dv, float scale, int64_t C) {
    int lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * RW + (threadIdx.x >> 5);
    int64_t h = blockIdx.y;
    int32_t di = blockIdx.z;
    if (j >= dv) return;
    int64_t a = cu ? cu[di] : 0, b = cu ? cu[di + 1] : T;
    int64_t ci = 0; /* first chunk of this document */
    if (chunk_states)
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
    dim3 grid((unsigned)((dv + RW - 1) / RW), (unsigned)H, (unsigned)N);
    if (dk <= 32)
        k_kda_recurrent<1><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, N, T, H, dk, dv, scale, C);
    else if (dk <= 64)
        k_kda_recurrent<2><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, N, T, H, dk, dv, scale, C);
    else if (dk <= 128)
        k_kda_recurrent<4><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, N, T, H, dk, dv, scale, C);
    else
        k_kda_recurrent<8><<<grid, 32 * RW, 0, c->stream>>>(o, S, chunk_states, q, k, v, g, beta,
                                                            cu, N, T, H, dk, dv, scale, C);
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

extern "C" int64_t arl_cuda_kda_chunk_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk,
                                                int64_t dv, int64_t C) {
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
 * (row, channel) of each sub-chunk instead of one per (pair, channel), and per product
 * channel three shared loads and two multiply-adds instead of five loads and an exp.  A
 * sub-chunk one of whose exponents exceeds KDA_FACTOR_SPAN takes the difference form (as the
 * CPU does).  Shared: XR (C, LD) the right factors K_i e^{G_b - G_i}, LK and LQ (KDA_SUB, LD)
 * the left ones, flag. */
__device__ static inline void pairs_factored(float *A, float *Aqk, const float *Ks, const float *Qs,
                                             const float *Gs, const float *bs, float *XR, float *LK,
                                             float *LQ, int *flag, int64_t n, int64_t dk, int64_t C,
                                             int64_t LD, int64_t LA, int tid, int nt) {
    for (int64_t r0 = 0; r0 < C; r0 += KDA_SUB) {
        const int64_t r1 = r0 + KDA_SUB < C ? r0 + KDA_SUB : C, re = r1 < n ? r1 : n;
        if (r0 >= n) { /* rows past the chunk's end: zeros */
            pairs_difference(A, Aqk, Ks, Qs, Gs, bs, r0, r1, n, dk, C, LD, LA, tid, nt);
            continue;
        }
        if (tid == 0) *flag = 0;
        __syncthreads();
        for (int64_t i = tid; i < re * dk; i += nt) { /* rows 0 .. re of the chunk */
            const int64_t r = i / dk, c = i % dk;
            const float e = Gs[r0 * LD + c] - Gs[r * LD + c];
            if (e > KDA_FACTOR_SPAN) *flag = 1;
            XR[r * LD + c] = Ks[r * LD + c] * expf(e);
        }
        for (int64_t i = tid; i < (re - r0) * dk; i += nt) { /* the sub-chunk's own rows */
            const int64_t r = r0 + i / dk, c = i % dk;
            const float e = Gs[r * LD + c] - Gs[r0 * LD + c];
            if (e > KDA_FACTOR_SPAN) *flag = 1;
            const float x = expf(e);
            LK[(r - r0) * LD + c] = Ks[r * LD + c] * x;
            LQ[(r - r0) * LD + c] = Qs[r * LD + c] * x;
        }
        __syncthreads();
        if (*flag) {
            pairs_difference(A, Aqk, Ks, Qs, Gs, bs, r0, r1, n, dk, C, LD, LA, tid, nt);
        } else {
            for (int64_t i = r0 * C + tid; i < r1 * C; i += nt) {
                const int64_t r = i / C, s = i % C;
                float akk = 0.0f, aqk = 0.0f;
                if (r < n && s <= r) {
                    const float *lk = LK + (r - r0) * LD, *lq = LQ + (r - r0) * LD;
                    const float *xr = XR + s * LD;
                    for (int64_t c = 0; c < dk; c++) {
                        const float x = xr[c];
                        akk += lk[c] * x;
                        aqk += lq[c] * x;
                    }
                }
                A[r * LA + s] = (s < r && r < n) ? -bs[r] * akk : 0.0f;
                Aqk[r * C + s] = (r < n && s <= r) ? aqk : 0.0f;
            }
        }
        __syncthreads(); /* XR, LK, LQ and the flag are the next sub-chunk's */
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

/* Shared floats of kernel 1: Ks, Qs, Gs (C, LD), A (C, C + 1), beta (C), then a region that
 * holds the factored pair products' XR (C, LD), LK and LQ (KDA_SUB, LD) and flag, and after
 * them invert_unit_lower's Xo and Rb. */
static size_t prep_smem_floats(int64_t dk, int64_t dv, int64_t C, int factored) {
    const int64_t LD = (dk > dv ? dk : dv) + 1;
    int64_t work = invert_smem_floats(C);
    if (factored && C * LD + 2 * KDA_SUB * LD + 1 > work) work = C * LD + 2 * KDA_SUB * LD + 1;
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
        pairs_factored(A, P.Aqk, Ks, Qs, Gs, bs, XR, LK, LQ, (int *)(LQ + KDA_SUB * LD), n, dk, C,
                       LD, LA, tid, nt);
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
    /* (4) W = T X_w, U = T X_u (T unit lower triangular) */
    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t r = i / dk, c = i % dk;
        float acc = Ks[r * LD + c];
        for (int64_t s = 0; s < r; s++)
            acc += A[r * LA + s] * Ks[s * LD + c];
        P.W[r * dk + c] = acc;
    }
    for (int64_t i = tid; i < n * dv; i += nt) {
        int64_t r = i / dv, c = i % dv;
        float acc = Qs[r * LD + c];
        for (int64_t s = 0; s < r; s++)
            acc += A[r * LA + s] * Qs[s * LD + c];
        P.U[r * dv + c] = acc;
    }
}

#define TV 32 /* state columns per block of the state pass */

/* Kernel 2: one block per (32-column slice, head, document), 256 threads, chunks in order.
 * Lane l of warp w owns state column j0 + l; for the (n, 32) products warp w owns the rows
 * w*8 .. w*8+7 (C <= 64) and for the state update the key channels w + 8u (dk <= 128), so
 * each shared-memory operand is read once per 8 or 16 multiply-adds (register tiling).  The
 * chunk's operands W, Qg (with Aqk) and Kb pass through two buffers by asynchronous copies, each
 * copied while the one before it is multiplied (the next chunk's W during the state update), so
 * that the chunks' walk does not wait on global memory between its products. */
#define RPW 8  /* rows per warp */
#define CPW 16 /* key channels per warp */
/* Rows 0 .. n of src (cols wide, dense) into dst (rows ld apart) by asynchronous copies of the
 * calling thread's share; the caller commits, waits and synchronises. */
__device__ static inline void stage_rows(float *dst, int64_t ld, const float *src, int64_t n,
                                         int64_t cols, int tid, int nt) {
    for (int64_t i = tid; i < n * cols; i += nt)
        cp_async4(dst + (i / cols) * ld + i % cols, src + i, true);
}

/* acc[i] = sum_c buf[r0 + i, c] S[c, lane] for the warp's rows i < nr (register tiling: each
 * shared-memory state value is read once per RPW multiply-adds); buf (C, ldb), S (dk, lds). */
__device__ static inline void rows_times_state(float *acc, const float *buf, int64_t ldb,
                                               const float *Ss, int64_t lds, int64_t r0, int nr,
                                               int64_t dk, int lane) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
        acc[i] = 0.0f;
    for (int64_t c = 0; c < dk; c++) {
        const float sv = Ss[c * lds + lane];
#pragma unroll
        for (int i = 0; i < RPW; i++)
            if (i < nr) acc[i] += buf[(r0 + i) * ldb + c] * sv;
    }
}

/* acc[u] = gn[c] Sx[c, lane] + sum_{r < n} buf[r, c] x[r, lane] for the warp's key channels
 * c = w + 8u (the state update of both state passes: Sx (dk, lds), buf (C, ldb), x (C, lds)). */
__device__ static inline void decay_plus_rows(float *acc, const float *gn, const float *Sx,
                                              int64_t lds, const float *buf, int64_t ldb,
                                              const float *x, int64_t n, int64_t dk, int w,
                                              int lane) {
#pragma unroll
    for (int u = 0; u < CPW; u++) {
        const int64_t c = w + 8 * u;
        acc[u] = c < dk ? gn[c] * Sx[c * lds + lane] : 0.0f;
    }
    for (int64_t r = 0; r < n; r++) {
        const float xv = x[r * lds + lane];
#pragma unroll
        for (int u = 0; u < CPW; u++) {
            const int64_t c = w + 8 * u;
            if (c < dk) acc[u] += buf[r * ldb + c] * xv;
        }
    }
}

__global__ void __launch_bounds__(256)
    k_kda_chunk_state(float *o, float *S, float *chunk_states, const float *ws, const int32_t *ix,
                      int32_t N, int64_t H, int64_t dk, int64_t dv, int64_t C) {
    extern __shared__ float sm[];
    const int64_t j0 = (int64_t)blockIdx.x * TV, h = blockIdx.y;
    const int32_t di = blockIdx.z;
    const int64_t LS = TV + 1, LB = dk + 1, LA = C + 1;
    float *Ss = sm, *bufs = Ss + dk * LS, *Vt = bufs + 2 * C * LB, *As = Vt + C * LS;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, w = tid >> 5;
    const int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    float *Sd = S + ((int64_t)di * H + h) * dk * dv;
    const int64_t nj = dv - j0 < TV ? dv - j0 : TV;
    const bool colok = lane < nj;

    for (int64_t i = tid; i < dk * TV; i += nt) {
        int64_t c = i / TV, jj = i % TV;
        Ss[c * LS + jj] = jj < nj ? Sd[c * dv + j0 + jj] : 0.0f;
    }
    __syncthreads();
    /* The operands go through two buffers in turn (W, Qg, Kb of a chunk, then the next chunk's
     * W, ...): each is copied asynchronously while the one before it is multiplied. */
    int m = 0; /* the operand in use is in bufs + (m & 1) * C * LB */
    if (doc[di] < doc[di + 1]) {
        const chunk_ptrs P0 = scratch_of((float *)ws, doc[di], h, H, dk, dv, C);
        stage_rows(bufs, LB, P0.W, ch[2 * doc[di] + 1], dk, tid, nt);
    }
    cp_async_commit();
    for (int32_t ci = doc[di]; ci < doc[di + 1]; ci++) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
        const int64_t r0 = (int64_t)w * RPW;
        const int nr = n - r0 <= 0 ? 0 : (n - r0 < RPW ? (int)(n - r0) : RPW); /* warp-uniform */
        chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        if (chunk_states) {
            float *cs = chunk_states + ((int64_t)ci * H + h) * dk * dv;
            for (int64_t i = tid; i < dk * nj; i += nt) {
                int64_t c = i / nj, jj = i % nj;
                cs[c * dv + j0 + jj] = Ss[c * LS + jj];
            }
        }
        /* (5) Vt = U - W S; Qg and Aqk on their way */
        stage_rows(bufs + ((m + 1) & 1) * C * LB, LB, P.Qg, n, dk, tid, nt);
        stage_rows(As, LA, P.Aqk, n, C, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        {
            float acc[RPW];
            rows_times_state(acc, bufs + (m & 1) * C * LB, LB, Ss, LS, r0, nr, dk, lane);
#pragma unroll
            for (int i = 0; i < RPW; i++)
                if (i < nr)
                    Vt[(r0 + i) * LS + lane] =
                        colok ? P.U[(r0 + i) * dv + j0 + lane] - acc[i] : 0.0f;
        }
        __syncthreads();
        m++;
        /* (7) O = Qg S + Aqk Vt; Kb on its way */
        stage_rows(bufs + ((m + 1) & 1) * C * LB, LB, P.Kb, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        {
            const float *buf = bufs + (m & 1) * C * LB;
            float acc[RPW];
            rows_times_state(acc, buf, LB, Ss, LS, r0, nr, dk, lane);
            for (int64_t s2 = 0; nr > 0 && s2 < r0 + nr; s2++) { /* Aqk: zero above diagonal */
                const float vt = Vt[s2 * LS + lane];
#pragma unroll
                for (int i = 0; i < RPW; i++)
                    if (i < nr) acc[i] += As[(r0 + i) * LA + s2] * vt;
            }
#pragma unroll
            for (int i = 0; i < RPW; i++)
                if (i < nr && colok) o[((t0 + r0 + i) * H + h) * dv + j0 + lane] = acc[i];
        }
        __syncthreads();
        m++;
        /* (8) S = diag(gn) S + Kb^T Vt; the next chunk's W on its way */
        if (ci + 1 < doc[di + 1]) {
            const chunk_ptrs Pn = scratch_of((float *)ws, ci + 1, h, H, dk, dv, C);
            stage_rows(bufs + ((m + 1) & 1) * C * LB, LB, Pn.W, ch[2 * (ci + 1) + 1], dk, tid, nt);
        }
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        {
            const float *buf = bufs + (m & 1) * C * LB;
            float acc[CPW];
            decay_plus_rows(acc, P.gn, Ss, LS, buf, LB, Vt, n, dk, w, lane);
#pragma unroll
            for (int u = 0; u < CPW; u++) {
                const int64_t c = w + 8 * u;
                if (c < dk) Ss[c * LS + lane] = acc[u];
            }
        }
        __syncthreads();
        m++;
    }
    for (int64_t i = tid; i < dk * nj; i += nt) {
        int64_t c = i / nj, jj = i % nj;
        Sd[c * dv + j0 + jj] = Ss[c * LS + jj];
    }
}

/* The chunkwise entry points' limits checked (ops.h); the chunks the index table must hold. */
static int64_t chunk_args(int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t C) {
    ARL_ASSERT(N >= 1 && H >= 1 && dk >= 1 && dv >= 1);
    ARL_ASSERT(dk <= ARL_CUDA_KDA_MAX_DK && dv <= ARL_CUDA_KDA_MAX_DV && C >= 1 &&
               C <= ARL_CUDA_KDA_MAX_C);
    const int64_t nc = max_chunks(T, N, C);
    ARL_ASSERT(nc <= chunk_cap(N));
    return nc;
}

/* The chunk table of the packed documents and kernel 1 (the per-chunk prep, all chunks in
 * parallel) into ws: the common first stage of the chunkwise forward and backward. */
static void chunk_prep_launch(arl_cuda_ctx *c, float *ws, const float *q, const float *k,
                              const float *v, const float *g, const float *beta, const int32_t *cu,
                              int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                              int64_t C, int64_t nc) {
    k_chunk_table<<<1, 32, 0, c->stream>>>(c->index, cu, N, T, C, chunk_cap(N), c->err);
    const int factored = c->kda_prep != ARL_CUDA_KDA_PREP_DIFFERENCE;
    const size_t sm1 = sizeof(float) * prep_smem_floats(dk, dv, C, factored);
    const dim3 grid((unsigned)nc, (unsigned)H);
    auto prep = factored ? k_kda_chunk_prep<true> : k_kda_chunk_prep<false>;
    cudaFuncSetAttribute(prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm1);
    prep<<<grid, 256, sm1, c->stream>>>(ws, c->index, q, k, v, g, beta, N, H, dk, dv, scale, C);
}

extern "C" int32_t arl_cuda_kda_prep_form(int32_t form) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(form == ARL_CUDA_KDA_PREP_FACTORED || form == ARL_CUDA_KDA_PREP_DIFFERENCE);
    const int32_t was = c->kda_prep;
    c->kda_prep = form;
    return was;
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
    static_assert(ARL_CUDA_KDA_MAX_C <= 8 * RPW && ARL_CUDA_KDA_MAX_DK <= 8 * CPW, "tiling");
    const int64_t nc = chunk_args(N, T, H, dk, dv, C);
    if (T == 0) return;
    chunk_prep_launch(c, ws, q, k, v, g, beta, cu, N, T, H, dk, dv, scale, C, nc);
    size_t sm2 =
        sizeof(float) * (size_t)(dk * (TV + 1) + 2 * C * (dk + 1) + C * (TV + 1) + C * (C + 1));
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
    ARL_ASSERT(max_chunks(T, N, C) <= chunk_cap(N));
    if (T == 0) return;
    k_chunk_table<<<1, 32, 0, c->stream>>>(c->index, cu, N, T, C, chunk_cap(N), c->err);
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
    int64_t nc = max_chunks(T, N, C);
    return nc * H * chunk_scratch(dk, dv, C) + nc * H * dk * dv + T * H * dv +
           nc * H * cbwd_scratch(dk, dv, C);
}

/* Reverse state pass, one block per (32-column slice, head, document), chunks in reverse:
 *   dSp[ci] = dS (the gradient of the chunk's outgoing state)
 *   dVt = Aqk^T dO + Kb dS
 *   dS <- diag(gn) dS + Qg^T dO - W^T dVt          (becomes the previous chunk's dS)
 * Every column of dS is independent, as in the forward. */
__global__ void __launch_bounds__(256)
    k_kda_cbwd_state(float *dSp_all, float *dVt_all, float *dS0, const float *dS_T,
                     const float *d_o, const float *ws, const int32_t *ix, int32_t N, int64_t H,
                     int64_t dk, int64_t dv, int64_t C) {
    extern __shared__ float sm[];
    const int64_t j0 = (int64_t)blockIdx.x * TV, h = blockIdx.y;
    const int32_t di = blockIdx.z;
    const int64_t LS = TV + 1, LB = dk + 1, LA = C + 1;
    float *dS = sm, *bufs = dS + dk * LS, *dO = bufs + 2 * C * LB, *dV = dO + C * LS;
    float *As = dV + C * LS;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, w = tid >> 5;
    const int32_t *doc = CT_DOC(ix), *ch = CT_CHUNKS(ix, N);
    const int64_t sd = ((int64_t)di * H + h) * dk * dv;
    const int64_t nj = dv - j0 < TV ? dv - j0 : TV;
    const bool colok = lane < nj;

    for (int64_t i = tid; i < dk * TV; i += nt) {
        int64_t c = i / TV, jj = i % TV;
        dS[c * LS + jj] = (dS_T && jj < nj) ? dS_T[sd + c * dv + j0 + jj] : 0.0f;
    }
    __syncthreads();
    /* a chunk's first operands (Kb, Aqk and its dO slice), then Qg, then W, through two
     * buffers: each copied asynchronously while the one before it is multiplied */
    const auto stage_first = [&](int32_t ci, float *kb_buf) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
        const chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        stage_rows(kb_buf, LB, P.Kb, n, dk, tid, nt);
        stage_rows(As, LA, P.Aqk, n, C, tid, nt);
        for (int64_t i = tid; i < n * TV; i += nt) {
            const int64_t r = i / TV, jj = i % TV;
            const bool ok = jj < nj;
            cp_async4(dO + r * LS + jj, ok ? d_o + ((t0 + r) * H + h) * dv + j0 + jj : d_o, ok);
        }
    };
    int m = 0; /* the operand in use is in bufs + (m & 1) * C * LB */
    if (doc[di + 1] > doc[di]) stage_first(doc[di + 1] - 1, bufs);
    cp_async_commit();
    for (int32_t ci = doc[di + 1] - 1; ci >= doc[di]; ci--) {
        const int64_t t0 = ch[2 * ci], n = ch[2 * ci + 1];
        const int64_t r0 = (int64_t)w * RPW;
        const int nr = n - r0 <= 0 ? 0 : (n - r0 < RPW ? (int)(n - r0) : RPW);
        chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
        float *dSp = dSp_all + ((int64_t)ci * H + h) * dk * dv;
        for (int64_t i = tid; i < dk * nj; i += nt) {
            int64_t c = i / nj, jj = i % nj;
            dSp[c * dv + j0 + jj] = dS[c * LS + jj];
        }
        stage_rows(bufs + ((m + 1) & 1) * C * LB, LB, P.Qg, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        { /* dVt = Aqk^T dO + Kb dS */
            const float *buf = bufs + (m & 1) * C * LB;
            float acc[RPW];
#pragma unroll
            for (int i = 0; i < RPW; i++)
                acc[i] = 0.0f;
            for (int64_t c = 0; c < dk; c++) {
                const float sv = dS[c * LS + lane];
#pragma unroll
                for (int i = 0; i < RPW; i++)
                    if (i < nr) acc[i] += buf[(r0 + i) * LB + c] * sv;
            }
            for (int64_t s2 = r0; s2 < n; s2++) { /* Aqk[s2][r] is zero for s2 < r */
                const float g2 = dO[s2 * LS + lane];
#pragma unroll
                for (int i = 0; i < RPW; i++)
                    if (i < nr) acc[i] += As[s2 * LA + r0 + i] * g2;
            }
#pragma unroll
            for (int i = 0; i < RPW; i++)
                if (i < nr) {
                    dV[(r0 + i) * LS + lane] = colok ? acc[i] : 0.0f;
                    if (colok) dVt_all[((t0 + r0 + i) * H + h) * dv + j0 + lane] = acc[i];
                }
        }
        __syncthreads();
        m++;
        stage_rows(bufs + ((m + 1) & 1) * C * LB, LB, P.W, n, dk, tid, nt);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        float acc[CPW]; /* dS <- diag(gn) dS + Qg^T dO - W^T dVt */
        {
            const float *buf = bufs + (m & 1) * C * LB;
            decay_plus_rows(acc, P.gn, dS, LS, buf, LB, dO, n, dk, w, lane);
        }
        __syncthreads();
        m++;
        if (ci > doc[di]) stage_first(ci - 1, bufs + ((m + 1) & 1) * C * LB);
        cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        {
            const float *buf = bufs + (m & 1) * C * LB;
            for (int64_t r = 0; r < n; r++) {
                const float g2 = dV[r * LS + lane];
#pragma unroll
                for (int u = 0; u < CPW; u++) {
                    const int64_t c = w + 8 * u;
                    if (c < dk) acc[u] -= buf[r * LB + c] * g2;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < CPW; u++) {
            const int64_t c = w + 8 * u;
            if (c < dk) dS[c * LS + lane] = acc[u];
        }
        __syncthreads();
        m++;
    }
    if (dS0)
        for (int64_t i = tid; i < dk * nj; i += nt) {
            int64_t c = i / nj, jj = i % nj;
            dS0[sd + c * dv + j0 + jj] += dS[c * LS + jj];
        }
}

/* ---- staged products (k_kda_cbwd) ---- */
#define TJ 32   /* reduction slice of a staged product */
#define TCOLS 4 /* output columns per lane of a staged product: nB <= 32 TCOLS */

/* One term of a staged product: A has nA rows lda apart, K wide; B has nB rows ldb apart, K wide
 * ("A B^T", B_T) or K rows ldb apart, nB wide ("A B"). */
struct prod_term {
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb, K;
};

/* Shared floats of a staged product's slices: As (8 RPW, TJ + 1) and Bs (32 TCOLS, TJ + 1) or
 * (TJ, 32 TCOLS + 1). */
static int64_t staged_smem_floats(void) {
    const int64_t bt = 32 * TCOLS * (TJ + 1), bn = TJ * (32 * TCOLS + 1);
    return 8 * RPW * (TJ + 1) + (bt > bn ? bt : bn);
}

/* acc[i][u] = the sum over the two terms (t2.K = 0: none) of (A B^T or A B)[r0 + i, lane + 32 u]
 * with r0 = RPW * warp, for nA <= 8 RPW rows and nB <= 32 TCOLS columns, 256 threads.  Slices of TJ
 * along K pass through shared memory from coalesced global reads (As, Bs: conflict-free in both
 * layouts), and each shared value read feeds RPW or TCOLS multiply-adds from registers.  Rows and
 * columns past nA, nB hold garbage.  Starts and ends with a barrier: global writes before the call
 * are visible to the loads, and the caller may reuse the slices' memory at once. */
template <bool B_T>
__device__ static void staged_product(float (&acc)[RPW][TCOLS], prod_term t1, prod_term t2,
                                      int64_t nA, int64_t nB, float *As, float *Bs, int tid,
                                      int nt) {
    const int lane = tid & 31;
    const int64_t r0 = (int64_t)(tid >> 5) * RPW, LS = TJ + 1, LN = 32 * TCOLS + 1;
    const int nr = nA - r0 <= 0 ? 0 : (nA - r0 < RPW ? (int)(nA - r0) : RPW); /* warp-uniform */
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
        for (int u = 0; u < TCOLS; u++)
            acc[i][u] = 0.0f;
    for (int p = 0; p < 2; p++) {
        const prod_term t = p == 0 ? t1 : t2;
        for (int64_t j0 = 0; j0 < t.K; j0 += TJ) {
            const int64_t nj = t.K - j0 < TJ ? t.K - j0 : TJ;
            __syncthreads(); /* the previous slice is consumed; earlier global writes visible */
            for (int64_t i = tid; i < nA * TJ; i += nt) {
                const int64_t r = i / TJ, jj = i % TJ;
                As[r * LS + jj] = jj < nj ? t.A[r * t.lda + j0 + jj] : 0.0f;
            }
            if (B_T)
                for (int64_t i = tid; i < nB * TJ; i += nt) {
                    const int64_t s = i / TJ, jj = i % TJ;
                    Bs[s * LS + jj] = jj < nj ? t.B[s * t.ldb + j0 + jj] : 0.0f;
                }
            else
                for (int64_t i = tid; i < nj * nB; i += nt) {
                    const int64_t jj = i / nB, s = i % nB;
                    Bs[jj * LN + s] = t.B[(j0 + jj) * t.ldb + s];
                }
            __syncthreads();
            for (int64_t jj = 0; jj < nj; jj++) {
                float b[TCOLS];
#pragma unroll
                for (int u = 0; u < TCOLS; u++) {
                    const int64_t s = lane + 32 * u;
                    b[u] = s < nB ? (B_T ? Bs[s * LS + jj] : Bs[jj * LN + s]) : 0.0f;
                }
#pragma unroll
                for (int i = 0; i < RPW; i++)
                    if (i < nr) {
                        const float a = As[(r0 + i) * LS + jj];
#pragma unroll
                        for (int u = 0; u < TCOLS; u++)
                            acc[i][u] += a * b[u];
                    }
            }
        }
    }
    __syncthreads();
}

/* f(r, s, x) for each element (r, s) = x of the staged product's tile this thread holds, r < nA,
 * s < nB (r0 = RPW * warp). */
template <class F>
__device__ static inline void tile_each(const float (&acc)[RPW][TCOLS], int64_t r0, int lane,
                                        int64_t nA, int64_t nB, F f) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
        for (int u = 0; u < TCOLS; u++) {
            const int64_t r = r0 + i, s = lane + 32 * u;
            if (r < nA && s < nB) f(r, s, acc[i][u]);
        }
}

/* Shared floats of k_kda_cbwd: Ks, Qs, Gs (C, dk + 1); dA, dT (C, C + 1); beta, dbeta (C); dGn
 * (dk); a flag; then one region used in turn by the staged products' slices, by Tm, Akk and Pm
 * (C, C + 1) each, and by the pair terms' factors Rf (C, dk + 1) and Lf (KDA_SUB, dk + 1). */
static size_t cbwd_smem_floats(int64_t dk, int64_t C) {
    const int64_t LD = dk + 1, LA = C + 1;
    int64_t reg = staged_smem_floats();
    if (3 * C * LA > reg) reg = 3 * C * LA;
    if ((C + KDA_SUB) * LD > reg) reg = (C + KDA_SUB) * LD;
    return (size_t)(3 * C * LD + 2 * C * LA + 2 * C + dk + 1 + reg);
}

/* Per (chunk, head): everything of spec 3.8 that stays inside the chunk, from the stored
 * incoming state S, the outgoing-state gradient dSp, dVt and dO.  The products with a dv or dk
 * long reduction (Vt, dAqk, M, dW, dKbar, dT) are staged products; the pair terms of A_qk and
 * A_kk are in the factored form of the CPU reference (policy/kda.c chunk_pairs_bwd): per
 * sub-chunk of KDA_SUB rows, one exp per (row, channel) instead of one per (pair, channel), and
 * the difference form where a factor would leave e^KDA_FACTOR_SPAN.  Gradients of q, k, v are
 * added to the outputs directly (this block owns the chunk's rows); dG is kept in the scratch
 * until its reverse cumulative sum.
 * (256, 1): one block per SM (the shared memory leaves room for no second), so each thread may
 * hold 255 registers and the staged products' accumulators stay in them (sm_90: 200, no
 * spills; under the default cap of 128 they spilled). */
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
    int *flag = (int *)(dGn + dk);
    float *Rg = dGn + dk + 1; /* the region */
    float *As = Rg, *Bs = As + 8 * RPW * (TJ + 1);
    float *Tm = Rg, *Ak = Tm + C * LA, *Pm = Ak + C * LA;
    float *Rf = Rg, *Lf = Rf + C * LD;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
    const int64_t r0 = (int64_t)(tid >> 5) * RPW;
    const chunk_ptrs P = scratch_of((float *)ws, ci, h, H, dk, dv, C);
    const float *S = chunk_states + (ci * H + h) * dk * dv;  /* (dk, dv) */
    const float *dSp = dSp_all + (ci * H + h) * dk * dv;     /* (dk, dv) */
    const float *dOc = d_o + (t0 * H + h) * dv;              /* (n, dv), rows HV apart */
    const float *dUc = dVt_all + (t0 * H + h) * dv;          /* (n, dv), rows HV apart */
    const float *vc = v + (t0 * H + h) * dv;                 /* (n, dv), rows HV apart */
    float *Vts = ws3 + (ci * H + h) * C * (4 * dk + 2 * dv); /* (C, dv) */
    float *dW = Vts + C * dv, *dGs = dW + C * dk, *E1 = dGs + C * dk, *dXw = E1 + C * dk;
    float *dXu = dXw + C * dk; /* (C, dv) */
    float acc[RPW][TCOLS];
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
        tile_each(acc, r0, lane, n, dv,
                  [&](int64_t r, int64_t s, float x) { Vts[r * dv + s] = P.U[r * dv + s] - x; });
    }
    { /* dAqk = Tril(dO Vt^T) */
        const prod_term t = {dOc, HV, Vts, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, n, As, Bs, tid, nt);
        tile_each(acc, r0, lane, n, n,
                  [&](int64_t r, int64_t s, float x) { dA[r * LA + s] = s <= r ? x : 0.0f; });
    }
    { /* M = dO S^T: dQ = Gamma M, dG = Gamma Q M */
        const prod_term t = {dOc, HV, S, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, r0, lane, n, dk, [&](int64_t r, int64_t s, float x) {
            const float gam = expf(Gs[r * LD + s]);
            dq[ROW(dk, r) + s] += scale * gam * x;
            dGs[r * dk + s] = gam * Qs[r * LD + s] * x;
        });
    }
    { /* dW = -dVt S^T */
        const prod_term t = {dUc, HV, S, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, r0, lane, n, dk,
                  [&](int64_t r, int64_t s, float x) { dW[r * dk + s] = -x; });
    }
    { /* dKbar = Vt dSp^T: dK = exp(G_n - G) dKbar, dG -= Kbar dKbar */
        const prod_term t = {Vts, dv, dSp, dv, dv}, none = {};
        staged_product<true>(acc, t, none, n, dk, As, Bs, tid, nt);
        tile_each(acc, r0, lane, n, dk, [&](int64_t r, int64_t s, float x) {
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
        tile_each(acc, r0, lane, n, n, [&](int64_t r, int64_t s, float x) {
            dT[r * LA + s] = s < r ? x * bs[s] : 0.0f;
        });
    }
    for (int64_t i = tid; i < C * C; i += nt) { /* the region's slices are consumed */
        Tm[(i / C) * LA + i % C] = P.Tm[i];
        Ak[(i / C) * LA + i % C] = P.Akk[i];
    }
    __syncthreads();
    /* dXw = T^T dW, dXu = T^T dU (T unit lower triangular) */
    for (int64_t i = tid; i < n * dk; i += nt) {
        int64_t x = i / dk, c = i % dk;
        float a = dW[x * dk + c];
        for (int64_t r = x + 1; r < n; r++)
            a += Tm[r * LA + x] * dW[r * dk + c];
        dXw[x * dk + c] = a;
    }
    for (int64_t i = tid; i < n * dv; i += nt) {
        int64_t x = i / dv, j = i % dv;
        float a = dUc[x * HV + j];
        for (int64_t r = x + 1; r < n; r++)
            a += Tm[r * LA + x] * dUc[r * HV + j];
        dXu[x * dv + j] = a;
    }
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
        if (tid == 0) *flag = 0;
        __syncthreads();
        for (int64_t i = tid; i < q1 * dk; i += nt) {
            const int64_t x = i / dk, c = i % dk;
            const float e = Gs[q0 * LD + c] - Gs[x * LD + c];
            if (e > KDA_FACTOR_SPAN) *flag = 1;
            Rf[x * LD + c] = expf(e);
        }
        for (int64_t i = tid; i < m * dk; i += nt) {
            const int64_t x = q0 + i / dk, c = i % dk;
            const float e = Gs[x * LD + c] - Gs[q0 * LD + c];
            if (e > KDA_FACTOR_SPAN) *flag = 1;
            Lf[(x - q0) * LD + c] = expf(e);
        }
        __syncthreads();
        const bool fac = *flag == 0;
        /* rows x of Q: tq (A_qk, x the query row), ti (A_kk, x the row) */
        for (int64_t i = tid; i < m * dk; i += nt) {
            const int64_t x = q0 + i / dk, c = i % dk;
            const float Gx = Gs[x * LD + c];
            float tq = 0.0f, ti = 0.0f;
            for (int64_t s2 = 0; s2 < x; s2++) {
                const float kr =
                    Ks[s2 * LD + c] * (fac ? Rf[s2 * LD + c] : expf(Gx - Gs[s2 * LD + c]));
                tq += dA[x * LA + s2] * kr;
                ti += dT[x * LA + s2] * kr;
            }
            if (fac) {
                const float l = Lf[(x - q0) * LD + c];
                tq = l * (tq + dA[x * LA + x] * Ks[x * LD + c] * Rf[x * LD + c]);
                ti *= l;
            } else {
                tq += dA[x * LA + x] * Ks[x * LD + c];
            }
            dq[ROW(dk, x) + c] += scale * tq;
            dk_[ROW(dk, x) + c] += ti;
            dGs[x * dk + c] += Qs[x * LD + c] * tq + Ks[x * LD + c] * ti;
        }
        __syncthreads();
        /* columns x < q1 against Q's rows r >= x: tk (A_qk, x the key row), tj (A_kk, x the
         * column) */
        for (int64_t i = tid; i < q1 * dk; i += nt) {
            const int64_t x = i / dk, c = i % dk;
            const float Gx = Gs[x * LD + c];
            float tk = 0.0f, tj = 0.0f;
            if (x >= q0) {
                const float f = fac ? Lf[(x - q0) * LD + c] : 1.0f;
                tk = dA[x * LA + x] * Qs[x * LD + c] * f;
            }
            for (int64_t r = x + 1 > q0 ? x + 1 : q0; r < q1; r++) {
                const float f = fac ? Lf[(r - q0) * LD + c] : expf(Gs[r * LD + c] - Gx);
                tk += dA[r * LA + x] * Qs[r * LD + c] * f;
                tj += dT[r * LA + x] * Ks[r * LD + c] * f;
            }
            const float y = fac ? Rf[x * LD + c] * (tk + tj) : tk + tj;
            dk_[ROW(dk, x) + c] += y;
            dGs[x * dk + c] -= Ks[x * LD + c] * y;
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
    size_t sm2 =
        sizeof(float) * (size_t)(dk * (TV + 1) + 2 * C * (dk + 1) + 2 * C * (TV + 1) + C * (C + 1));
    cudaFuncSetAttribute(k_kda_cbwd_state, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm2);
    dim3 g2((unsigned)((dv + TV - 1) / TV), (unsigned)H, (unsigned)N);
    k_kda_cbwd_state<<<g2, 256, sm2, c->stream>>>(dSp, dVt, dS0, dS_T, d_o, ws_fwd, c->index, N, H,
                                                  dk, dv, C);
    static_assert(ARL_CUDA_KDA_MAX_C <= 8 * RPW && ARL_CUDA_KDA_MAX_DK <= 32 * TCOLS &&
                      ARL_CUDA_KDA_MAX_DV <= 32 * TCOLS,
                  "staged products");
    size_t sm3 = sizeof(float) * cbwd_smem_floats(dk, C);
    cudaFuncSetAttribute(k_kda_cbwd, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm3);
    k_kda_cbwd<<<dim3((unsigned)nc, (unsigned)H), 256, sm3, c->stream>>>(
        dq, dk_, dv_, dg, dbeta, q, k, v, g, beta, chunk_states, dSp, dVt, d_o, ws_fwd, ws3,
        c->index, N, H, dk, dv, scale, C);
    ARL_CUDA_LAUNCHED(c, "kda_chunk_bwd");
}
