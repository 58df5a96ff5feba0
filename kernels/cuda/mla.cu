/* kernels/cuda/mla.cu: MLA attention on the device (kernels/cuda/ops.h, spec 4.1-4.3): the
 * expanded causal attention forward (flash-style online softmax) and backward, and the
 * absorbed decode over the latent cache.  One kernel serves both forwards: a key is the
 * concatenation of two parts ([k_nope; k_pe] or [c; k_pe]) and a query likewise.
 * Work split: one warp per (query, head); each lane scores one key of a 32-key block, then
 * the warp accumulates the value rows with lanes over the value dims (fp32 throughout). */
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
    float scale;
} attn_args;

__device__ static inline int64_t first_key(const int32_t *cu, int32_t N, int64_t t) {
    if (!cu) return 0;
    int32_t lo = 0, hi = N - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return cu[lo];
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
    float inv = 1.0f / l;
    for (int u = 0; u < U; u++) {
        int64_t d = lane + 32 * u;
        if (d < A.nv) A.o[item * A.nv + d] = acc[u] * inv;
    }
    if (A.lse && lane == 0) A.lse[item] = m + logf(l);
}

static void attn_launch(const attn_args *A, const char *name) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(A->nA + A->nB <= QMAX && A->nv <= VMAX && A->nv >= 1);
    int64_t items = A->Tq * A->Hm;
    if (items == 0) return;
    unsigned blocks = (unsigned)((items + AW - 1) / AW);
    if (A->nv <= 64)
        k_attn_fwd<2><<<blocks, 32 * AW, 0, c->stream>>>(*A);
    else if (A->nv <= 128)
        k_attn_fwd<4><<<blocks, 32 * AW, 0, c->stream>>>(*A);
    else if (A->nv <= 256)
        k_attn_fwd<8><<<blocks, 32 * AW, 0, c->stream>>>(*A);
    else
        k_attn_fwd<16><<<blocks, 32 * AW, 0, c->stream>>>(*A);
    ARL_CUDA_LAUNCHED(c, name);
}

extern "C" void arl_cuda_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                                      const float *k_nope, const float *k_pe, const float *v,
                                      const int32_t *cu, int32_t N, int64_t T, int64_t Hm,
                                      int64_t n, int64_t r, int64_t vm, float scale) {
    attn_args A = {};
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
                                           int64_t rkv, int64_t r, float scale) {
    attn_args A = absorbed_args(ohat, qhat, q_pe, cache, Tq, Hm, rkv, r, scale);
    A.pos0 = pos0;
    attn_launch(&A, "mla_absorbed_attn");
}

/* The same with pos0 read from device memory when the kernel runs, so that a captured CUDA
 * graph replays correctly while the position advances. */
extern "C" void arl_cuda_mla_absorbed_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                                const float *cache, const int64_t *pos_dev,
                                                int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                                                float scale) {
    attn_args A = absorbed_args(ohat, qhat, q_pe, cache, Tq, Hm, rkv, r, scale);
    A.pos_dev = pos_dev;
    attn_launch(&A, "mla_absorbed_attn_dpos");
}

/* ======================= backward (expanded form, spec 4.3) ============================== */

#define BQ 256 /* n + r and vm limit of the backward kernels */

extern "C" int64_t arl_cuda_mla_attn_bwd_ws_floats(int64_t T, int64_t Hm, int64_t r) {
    return T * Hm * r + T * Hm;
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
    int64_t hi = B.T - 1; /* last token of s's document */
    if (B.cu) {
        int32_t lo = 0, up = B.N - 1;
        while (lo < up) {
            int32_t mid = (lo + up + 1) / 2;
            if (B.cu[mid] <= s)
                lo = mid;
            else
                up = mid - 1;
        }
        hi = B.cu[lo + 1] - 1;
    }
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
    float *per_head = ws, *D = ws + T * Hm * r;
    unsigned blocks = (unsigned)((items + AW - 1) / AW);
    k_attn_delta<<<blocks, 32 * AW, 0, c->stream>>>(D, d_o, o, items, vm);
    bwd_args B = {q_nope,   q_pe, k_nope, k_pe, v, d_o, lse, D, dq_nope, dq_pe, dk_nope,
                  per_head, dv,   cu,     N,    T, Hm,  n,   r, vm,      scale};
    k_attn_bwd_q<<<blocks, 32 * AW, 0, c->stream>>>(B);
    k_attn_bwd_kv<<<blocks, 32 * AW, 0, c->stream>>>(B);
    k_sum_heads<<<arl_blocks(T * r, 256), 256, 0, c->stream>>>(dk_pe, per_head, T, Hm, r);
    ARL_CUDA_LAUNCHED(c, "mla_attn_bwd");
}
