/* kernels/cuda/misc.cu: short causal conv, AttnRes mix, router, AdamW and the bf16 cuBLAS GEMM
 * of the CUDA backend (kernels/cuda/ops.h).  Each mirrors its CPU function (named there). */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

/* ======================= short conv ====================================================== */

/* Input of tap position src (relative to the document start a; < 0 reads the tail). */
__device__ static inline float conv_in(const float *x, const float *tail, int64_t a, int64_t src,
                                       int64_t c, int64_t C, int64_t W) {
    if (src >= 0) return x[(a + src) * C + c];
    if (tail) return tail[c * (W - 1) + (W - 1 + src)];
    return 0.0f;
}

__device__ static inline float conv_pre(const float *x, const float *w, const float *tail,
                                        int64_t a, int64_t pos, int64_t c, int64_t C, int64_t W) {
    float acc = 0.0f;
    for (int64_t j = 0; j < W; j++)
        acc += w[c * W + j] * conv_in(x, tail, a, pos - (W - 1) + j, c, C, W);
    return acc;
}

__global__ void k_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                           const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    ARL_GRID_STRIDE(i, T * C) {
        int64_t t = i / C, c = i % C;
        int32_t di = arl_doc_of(cu, N, t);
        int64_t a = cu ? cu[di] : 0;
        const float *tail = tails ? tails + (int64_t)di * C * (W - 1) : NULL;
        float acc = conv_pre(x, w, tail, a, t - a, c, C, W);
        if (y) y[i] = acc;
        z[i] = acc * arl_sigmoidf(acc);
    }
}

/* The backward of the conv: dy_t = dz_t SiLU'(y_t) once per output token, then
 *   dx[tau, c] += sum_j w[c, j] dy_{tau + W-1-j}[c]   over outputs in tau's document,
 *   dw[c, j]   += sum_t dy_t[c] x_{t-W+1+j}[c]          (the tails before a document's start).
 * A block takes 32 channels and a span of tokens, walked in tiles of CONV_BWD_TILE: the dy of a
 * tile and of the W - 1 tokens after it (those its dx read) go to shared memory, each thread's
 * channel taking tokens ty, ty + CONV_BWD_LANES, ...; the thread's dw sums (one a tap, in
 * double) run over the tile's own tokens from the same loads that gave y.  A span's dw sums
 * are added in lane order, and the spans' in span order by k_colsum_spans: the same result
 * every run.  Was: the pre-activation recomputed for every tap of dx and every (tap, tap) pair
 * of dw, with a document search per term. */
#define CONV_BWD_TILE 64
#define CONV_BWD_LANES 8
#define CONV_MAX_W 16
#define CONV_BWD_BLOCKS 528 /* blocks aimed at: four an SM of a 132-SM H100 / H200 */

/* MW: the widest W the instance takes (its register arrays; the config's W = 4 has its own) */
template <int MW>
__global__ void __launch_bounds__(32 * CONV_BWD_LANES)
    k_conv_bwd(float *dx, float *dw, double *part, const float *dz, const float *x, const float *w,
               const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W,
               int64_t span) {
    __shared__ float sdy[CONV_BWD_TILE + MW - 1][32]; /* (tile + W - 1, 32 channels) */
    __shared__ double sh[CONV_BWD_LANES][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx, r0 = (int64_t)blockIdx.y * span;
    const int64_t r1 = T - r0 < span ? T : r0 + span;
    const bool on = c < C;
    float wr[MW];
    double acc[MW];
#pragma unroll
    for (int j = 0; j < MW; j++) {
        wr[j] = on && j < W ? w[c * W + j] : 0.0f;
        acc[j] = 0.0;
    }
    for (int64_t t0 = r0; t0 < r1; t0 += CONV_BWD_TILE) {
        const int64_t own = r1 - t0 < CONV_BWD_TILE ? r1 - t0 : CONV_BWD_TILE;
        const int64_t ext = T - t0 < own + W - 1 ? T - t0 : own + W - 1;
        for (int64_t i = ty; on && i < ext; i += CONV_BWD_LANES) {
            const int64_t t = t0 + i;
            const int32_t di = arl_doc_of(cu, N, t);
            const int64_t a = cu ? cu[di] : 0;
            const float *tail = tails ? tails + (int64_t)di * C * (W - 1) : NULL;
            float in[MW], y = 0.0f; /* y in ascending taps, as conv_pre */
#pragma unroll
            for (int j = 0; j < MW; j++)
                if (j < W) {
                    in[j] = conv_in(x, tail, a, t - a - (W - 1) + j, c, C, W);
                    y += wr[j] * in[j];
                }
            const float s = arl_sigmoidf(y);
            const float dy = dz[t * C + c] * s * (1.0f + y * (1.0f - s));
            sdy[i][tx] = dy;
            if (dw && i < own)
#pragma unroll
                for (int j = 0; j < MW; j++)
                    if (j < W) acc[j] += (double)(dy * in[j]);
        }
        __syncthreads();
        for (int64_t i = ty; on && i < own; i += CONV_BWD_LANES) {
            const int64_t tau = t0 + i;
            const int32_t di = arl_doc_of(cu, N, tau);
            const int64_t b = cu ? cu[di + 1] : T;
            float sum = 0.0f;
#pragma unroll
            for (int j = MW - 1; j >= 0; j--)
                if (j < W && tau + (W - 1 - j) < b) sum += wr[j] * sdy[i + (W - 1 - j)][tx];
            dx[tau * C + c] += sum;
        }
        __syncthreads();
    }
    if (!dw) return;
#pragma unroll
    for (int j = 0; j < MW; j++)
        if (j < W) { /* W is the block's: the barriers are reached by all or none */
            sh[ty][tx] = acc[j];
            __syncthreads();
            if (ty == 0 && on) {
                double sum = 0.0;
                for (int l = 0; l < CONV_BWD_LANES; l++)
                    sum += sh[l][tx];
                if (part)
                    part[blockIdx.y * C * W + c * W + j] = sum;
                else
                    dw[c * W + j] += (float)sum;
            }
            __syncthreads();
        }
}

/* Token spans of the conv backward: blocks for CONV_BWD_BLOCKS, at least a tile of tokens a
 * span, the dw partials within ARL_CUDA_PARTIALS. */
static int64_t conv_bwd_spans(int64_t T, int64_t C, int64_t W) {
    const int64_t nb = (C + 31) / 32;
    int64_t S = (CONV_BWD_BLOCKS + nb - 1) / nb;
    if (S > T / CONV_BWD_TILE) S = T / CONV_BWD_TILE;
    if (S > ARL_CUDA_PARTIALS / (C * W)) S = ARL_CUDA_PARTIALS / (C * W);
    return S < 1 ? 1 : S;
}

extern "C" void arl_cuda_conv_fwd(float *z, float *y, const float *x, const float *w,
                                  const float *tails, const int32_t *cu, int32_t N, int64_t T,
                                  int64_t C, int64_t W) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(W >= 1 && W <= 16 && C >= 1 && N >= 1);
    if (T == 0) return;
    k_conv_fwd<<<arl_blocks(T * C, 256), 256, 0, c->stream>>>(z, y, x, w, tails, cu, N, T, C, W);
    ARL_CUDA_LAUNCHED(c, "conv_fwd");
}

extern "C" void arl_cuda_conv_bwd(float *dx, float *dw, const float *dz, const float *x,
                                  const float *w, const float *tails, const int32_t *cu, int32_t N,
                                  int64_t T, int64_t C, int64_t W) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(W >= 1 && W <= CONV_MAX_W && C >= 1 && N >= 1);
    if (T == 0) return;
    const int64_t S = conv_bwd_spans(T, C, W), span = (T + S - 1) / S;
    const dim3 grid((unsigned)((C + 31) / 32), (unsigned)S);
    void (*kern)(float *, float *, double *, const float *, const float *, const float *,
                 const float *, const int32_t *, int32_t, int64_t, int64_t, int64_t, int64_t) =
        W <= 4 ? k_conv_bwd<4> : k_conv_bwd<CONV_MAX_W>;
    kern<<<grid, 32 * CONV_BWD_LANES, 0, c->stream>>>(dx, dw, dw && S > 1 ? c->partials : NULL, dz,
                                                      x, w, tails, cu, N, T, C, W, span);
    if (dw && S > 1)
        k_colsum_spans<arl_colsum_add><<<arl_blocks(C * W, 256), 256, 0, c->stream>>>(
            C * W, S, c->partials, arl_colsum_add{dw});
    ARL_CUDA_LAUNCHED(c, "conv_bwd");
}

/* ======================= AttnRes mix ===================================================== */

typedef struct srcs {
    const float *p[ARL_CUDA_ATTNRES_MAX];
} srcs;
typedef struct dsrcs {
    float *p[ARL_CUDA_ATTNRES_MAX];
} dsrcs;

/* Per token (one block): rho_j, z_j, a_j into shared arrays (double, as the CPU), and with
 * g (the token's output gradient, the backward) da_j = g . V_j.  The sources' sums run
 * MIX_GROUP sources at a time in one pass over the row with one block reduction
 * (arl_block_sum_dn): the same sums as one reduction a source and value, in the same order,
 * with three barriers a group instead of three a source and value.  sh: 33 x 3 MIX_GROUP
 * doubles. */
#define MIX_GROUP 8
template <bool BWD>
__device__ static void mix_weights(double *rho, double *z, double *a, double *da, const srcs *S,
                                   int32_t N, int64_t t, int64_t d, const float *wn,
                                   const float *wp, const float *g, float eps, double *sh) {
    constexpr int NV = BWD ? 3 : 2; /* |V|^2, (w_norm w_proj) . V, g . V */
    for (int32_t j0 = 0; j0 < N; j0 += MIX_GROUP) {
        const int ng = N - j0 < MIX_GROUP ? (int)(N - j0) : MIX_GROUP;
        double v[MIX_GROUP * NV];
#pragma unroll
        for (int u = 0; u < MIX_GROUP * NV; u++)
            v[u] = 0.0;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
            const double w = (double)wn[i] * wp[i], gi = BWD ? (double)g[t * d + i] : 0.0;
#pragma unroll
            for (int jj = 0; jj < MIX_GROUP; jj++)
                if (jj < ng) {
                    const float x = S->p[j0 + jj][t * d + i];
                    v[jj * NV] += (double)x * x;
                    v[jj * NV + 1] += w * x;
                    if (BWD) v[jj * NV + 2] += gi * x;
                }
        }
        arl_block_sum_dn<MIX_GROUP * NV>(v, ng * NV, sh);
        if (threadIdx.x == 0)
#pragma unroll
            for (int jj = 0; jj < MIX_GROUP; jj++)
                if (jj < ng) {
                    rho[j0 + jj] = 1.0 / sqrt(v[jj * NV] / (double)d + (double)eps);
                    z[j0 + jj] = rho[j0 + jj] * v[jj * NV + 1];
                    if (BWD) da[j0 + jj] = v[jj * NV + 2];
                }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double zmax = -INFINITY, sum = 0.0;
        for (int32_t j = 0; j < N; j++)
            zmax = z[j] > zmax ? z[j] : zmax;
        for (int32_t j = 0; j < N; j++) {
            a[j] = exp(z[j] - zmax);
            sum += a[j];
        }
        for (int32_t j = 0; j < N; j++)
            a[j] /= sum;
    }
    __syncthreads();
}

__global__ void k_mix_fwd(float *out, float *aw, srcs S, int32_t N, int64_t T, int64_t d,
                          const float *wn, const float *wp, float eps) {
    __shared__ double sh[33 * 2 * MIX_GROUP];
    __shared__ double rho[ARL_CUDA_ATTNRES_MAX], z[ARL_CUDA_ATTNRES_MAX], a[ARL_CUDA_ATTNRES_MAX];
    int64_t t = blockIdx.x;
    mix_weights<false>(rho, z, a, NULL, &S, N, t, d, wn, wp, NULL, eps, sh);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        double acc = 0.0;
        for (int32_t j = 0; j < N; j++)
            acc += a[j] * S.p[j][t * d + i];
        out[t * d + i] = (float)acc;
    }
    if (aw && threadIdx.x < N) aw[(int64_t)threadIdx.x * T + t] = (float)a[threadIdx.x];
}

/* Per token: dsrc, and (dz_j, rho_j, z_j) kept in ws for the weight gradient. */
__global__ void k_mix_bwd(dsrcs D, float *ws, const float *dh, srcs S, int32_t N, int64_t T,
                          int64_t d, const float *wn, const float *wp, float eps) {
    __shared__ double sh[33 * 3 * MIX_GROUP];
    __shared__ double rho[ARL_CUDA_ATTNRES_MAX], z[ARL_CUDA_ATTNRES_MAX], a[ARL_CUDA_ATTNRES_MAX];
    __shared__ double dz[ARL_CUDA_ATTNRES_MAX];
    int64_t t = blockIdx.x;
    const float *g = dh + t * d;
    mix_weights<true>(rho, z, a, dz, &S, N, t, d, wn, wp, dh, eps, sh); /* dz = g . V_j */
    if (threadIdx.x == 0) {
        double mean = 0.0;
        for (int32_t j = 0; j < N; j++)
            mean += a[j] * dz[j];
        for (int32_t j = 0; j < N; j++) {
            dz[j] = a[j] * (dz[j] - mean);
            ws[(int64_t)j * T + t] = (float)(dz[j] * rho[j]); /* dz_j rho_j: kappa = rho V */
        }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        double w = (double)wn[i] * wp[i];
        for (int32_t j = 0; j < N; j++) {
            if (!D.p[j]) continue;
            double kappa = rho[j] * S.p[j][t * d + i];
            D.p[j][t * d + i] +=
                (float)(a[j] * g[i] + dz[j] * rho[j] * (w - z[j] * kappa / (double)d));
        }
    }
}

/* dw[i] = sum_t sum_j (dz_j rho_j)[t] V_j[t, i] (arl_colsum: tokens split over lanes, sources
 * in order); then dw_norm += dw w_proj, dw_proj += dw w_norm. */
struct mix_dw_term {
    const float *ws;
    srcs S;
    int32_t N;
    int64_t T, d;
    __device__ double operator()(int64_t t, int64_t i) const {
        double acc = 0.0;
        for (int32_t j = 0; j < N; j++)
            acc += (double)ws[(int64_t)j * T + t] * S.p[j][t * d + i];
        return acc;
    }
};
struct mix_dw_out {
    float *dwn, *dwp;
    const float *wn, *wp;
    __device__ void operator()(int64_t i, double dw) const {
        if (dwn) dwn[i] += (float)(dw * wp[i]);
        if (dwp) dwp[i] += (float)(dw * wn[i]);
    }
};

extern "C" void arl_cuda_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N,
                                         int64_t T, int64_t d, const float *w_norm,
                                         const float *w_proj, float eps) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(N >= 1 && N <= ARL_CUDA_ATTNRES_MAX);
    if (T == 0) return;
    srcs S;
    for (int32_t j = 0; j < N; j++)
        S.p[j] = src[j];
    k_mix_fwd<<<(unsigned)T, 256, 0, c->stream>>>(out, a, S, N, T, d, w_norm, w_proj, eps);
    ARL_CUDA_LAUNCHED(c, "attnres_mix_fwd");
}

extern "C" void arl_cuda_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj,
                                         const float *dh, const float *const *src, int32_t N,
                                         int64_t T, int64_t d, const float *w_norm,
                                         const float *w_proj, float eps, float *ws) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(N >= 1 && N <= ARL_CUDA_ATTNRES_MAX);
    if (T == 0) return;
    srcs S;
    dsrcs D;
    for (int32_t j = 0; j < N; j++) {
        S.p[j] = src[j];
        D.p[j] = dsrc[j];
    }
    k_mix_bwd<<<(unsigned)T, 256, 0, c->stream>>>(D, ws, dh, S, N, T, d, w_norm, w_proj, eps);
    if (dw_norm || dw_proj)
        arl_colsum(c, T, d, mix_dw_term{ws, S, N, T, d},
                   mix_dw_out{dw_norm, dw_proj, w_norm, w_proj});
    ARL_CUDA_LAUNCHED(c, "attnres_mix_bwd");
}

/* ======================= router ========================================================== */

__device__ static inline bool above(float xi, int64_t i, float xj, int64_t j) {
    bool ni = xi != xi, nj = xj != xj;
    if (ni || nj) return ni == nj ? i < j : nj;
    if (xi != xj) return xi > xj;
    return i < j;
}

#define ROUTER_KMAX 64
__global__ void k_router_fwd(int32_t *sel, float *p, float *s, const float *l, const float *bias,
                             const int32_t *forced, int64_t T, int64_t E, int64_t k, float rho,
                             arl_cuda_errword *err) {
    ARL_GRID_STRIDE(t, T) {
        for (int64_t e = 0; e < E; e++)
            s[t * E + e] = arl_sigmoidf(l[t * E + e]);
        int32_t *st = sel + t * k;
        if (forced) {
            bool bad = false;
            for (int64_t i = 0; i < k; i++) {
                int32_t e = forced[t * k + i];
                if (e < 0 || e >= E) bad = true;
                for (int64_t j = 0; j < i; j++)
                    if (forced[t * k + j] == e) bad = true;
                st[i] = e;
            }
            if (bad) {
                arl_dev_error(err, 1, (int32_t)t);
                for (int64_t i = 0; i < k; i++) {
                    st[i] = 0;
                    p[t * k + i] = 0.0f;
                }
                continue;
            }
        } else {
            float bv[ROUTER_KMAX];
            int64_t m = 0;
            for (int64_t e = 0; e < E; e++) {
                float v = s[t * E + e] + bias[e];
                if (m == k && !above(v, e, bv[m - 1], st[m - 1])) continue;
                int64_t q = m < k ? m++ : m - 1;
                while (q > 0 && above(v, e, bv[q - 1], st[q - 1])) {
                    bv[q] = bv[q - 1];
                    st[q] = st[q - 1];
                    q--;
                }
                bv[q] = v;
                st[q] = (int32_t)e;
            }
        }
        float Z = 0.0f;
        for (int64_t i = 0; i < k; i++)
            Z += s[t * E + st[i]];
        for (int64_t i = 0; i < k; i++)
            p[t * k + i] = rho * s[t * E + st[i]] / (Z + 1e-20f);
    }
}

__global__ void k_router_bwd(float *dl, const float *dp, const float *s, const int32_t *sel,
                             int64_t T, int64_t E, int64_t k, float rho) {
    ARL_GRID_STRIDE(t, T) {
        const int32_t *st = sel + t * k;
        for (int64_t e = 0; e < E; e++)
            dl[t * E + e] = 0.0f;
        float Z = 0.0f, pdp = 0.0f;
        for (int64_t i = 0; i < k; i++)
            Z += s[t * E + st[i]];
        for (int64_t i = 0; i < k; i++)
            pdp += rho * s[t * E + st[i]] / (Z + 1e-20f) * dp[t * k + i];
        for (int64_t i = 0; i < k; i++) {
            float si = s[t * E + st[i]];
            float ds = (rho * dp[t * k + i] - pdp) / Z;
            dl[t * E + st[i]] = ds * si * (1.0f - si);
        }
    }
}

extern "C" void arl_cuda_router_fwd(int32_t *sel, float *p, float *s, const float *logits,
                                    const float *bias, const int32_t *forced, int64_t T, int64_t E,
                                    int64_t k, float rho) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(k >= 1 && k <= E && k <= ROUTER_KMAX);
    if (T == 0) return;
    k_router_fwd<<<arl_blocks(T, 64), 64, 0, c->stream>>>(sel, p, s, logits, bias, forced, T, E, k,
                                                          rho, c->err);
    ARL_CUDA_LAUNCHED(c, "router_fwd");
}

extern "C" void arl_cuda_router_bwd(float *dl, const float *dp, const float *s, const int32_t *sel,
                                    int64_t T, int64_t E, int64_t k, float rho) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (T == 0) return;
    k_router_bwd<<<arl_blocks(T, 64), 64, 0, c->stream>>>(dl, dp, s, sel, T, E, k, rho);
    ARL_CUDA_LAUNCHED(c, "router_bwd");
}

/* ======================= QB histogram ==================================================== */

__global__ void k_qb_hist(unsigned long long *cnt, const float *s, const float *b, int64_t m,
                          int64_t E, int64_t k, float lo, float w, int64_t Nb) {
    ARL_GRID_STRIDE(i, m) {
        float top[ROUTER_KMAX]; /* the k+1 largest of s_i + b, descending */
        int64_t n = 0;
        for (int64_t j = 0; j < E; j++) {
            float v = s[i * E + j] + b[j];
            if (n == k + 1 && !(v > top[n - 1])) continue;
            int64_t q = n < k + 1 ? n++ : n - 1;
            while (q > 0 && v > top[q - 1]) {
                top[q] = top[q - 1];
                q--;
            }
            top[q] = v;
        }
        const float alpha = top[k];
        for (int64_t j = 0; j < E; j++) {
            float r = alpha - s[i * E + j];
            float f = floorf((r - lo) / w);
            int64_t bin =
                !(f > 0.0f) ? 0 : (f > (float)(Nb - 1) ? Nb - 1 : (int64_t)f); /* NaN: 0 */
            atomicAdd(&cnt[j * Nb + bin], 1ULL);
        }
    }
}

extern "C" void arl_cuda_qb_hist_count(int64_t *cnt, const float *s, const float *b_old, int64_t m,
                                       int64_t E, int64_t k, float lo, float w, int64_t Nb) {
    arl_cuda_ctx *c = arl_cuda_need();
    ARL_ASSERT(k >= 1 && k < E && k + 1 <= ROUTER_KMAX && Nb >= 1);
    if (m == 0) return;
    k_qb_hist<<<arl_blocks(m, 128), 128, 0, c->stream>>>((unsigned long long *)cnt, s, b_old, m, E,
                                                         k, lo, w, Nb);
    ARL_CUDA_LAUNCHED(c, "qb_hist_count");
}

/* ======================= AdamW =========================================================== */

/* One element of policy/optimizer.c arl_optim_update, the same float operations in order. */
__device__ static inline void adamw_one(float &p, float &m, float &v, float g, int32_t decay,
                                        const arl_cuda_adamw_hp &hp) {
    const float gi = g * hp.coef;
    float pi = p;
    if (decay) pi *= hp.decay;
    m = hp.beta1 * m + hp.omb1 * gi;
    v = hp.beta2 * v + hp.omb2 * (gi * gi);
    const float denom = sqrtf(v) * hp.inv_sqrt_bc2 + hp.eps;
    p = pi - hp.step_size * (m / denom);
}

/* element i, one at a time (and its bf16 copy with B16) */
template <bool B16>
__device__ static inline void adamw_at(float *p, uint16_t *pb, float *m, float *v, const float *g,
                                       int64_t i, int32_t decay, const arl_cuda_adamw_hp &hp) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, mi, vi, g[i], decay, hp);
    p[i] = pi, m[i] = mi, v[i] = vi;
    if (B16) pb[i] = arl_bf16_rn_bits(pi);
}

/* p, m, v (n) updated from g (n); with B16, pb (n) = p rounded to bf16.  VEC: the elements
 * [head, head + 4 n4) four at a time (16-byte accesses; pb 8-byte), the at most 3 + 3 others
 * (before head, after the groups) by the grid's first threads; else one element a thread.
 * A memory-bound pass (7 fp32 streams, 28 bytes an element; 30 with pb): one pass over the
 * moments and the masters instead of two (the bf16 copy no longer re-reads p). */
template <bool B16, bool VEC>
__global__ void k_adamw(float *p, uint16_t *pb, float *m, float *v, const float *g, int64_t n,
                        int64_t head, int32_t decay, arl_cuda_adamw_hp hp) {
    if (!VEC) {
        ARL_GRID_STRIDE(i, n) {
            adamw_at<B16>(p, pb, m, v, g, i, decay, hp);
        }
        return;
    }
    const int64_t n4 = (n - head) / 4, rest = head + 4 * n4;
    ARL_GRID_STRIDE(j, n4) {
        const int64_t i = head + 4 * j;
        float4 P = *reinterpret_cast<const float4 *>(p + i);
        float4 M = *reinterpret_cast<const float4 *>(m + i);
        float4 V = *reinterpret_cast<const float4 *>(v + i);
        const float4 G = *reinterpret_cast<const float4 *>(g + i);
        adamw_one(P.x, M.x, V.x, G.x, decay, hp);
        adamw_one(P.y, M.y, V.y, G.y, decay, hp);
        adamw_one(P.z, M.z, V.z, G.z, decay, hp);
        adamw_one(P.w, M.w, V.w, G.w, decay, hp);
        *reinterpret_cast<float4 *>(p + i) = P;
        *reinterpret_cast<float4 *>(m + i) = M;
        *reinterpret_cast<float4 *>(v + i) = V;
        if (B16) {
            uint2 b;
            b.x = arl_bf16x2_rn_bits(P.x, P.y);
            b.y = arl_bf16x2_rn_bits(P.z, P.w);
            *reinterpret_cast<uint2 *>(pb + i) = b;
        }
    }
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = t < head ? t : rest + (t - head); /* a head element, then the tail's */
    if (i < (t < head ? head : n)) adamw_at<B16>(p, pb, m, v, g, i, decay, hp);
}

static bool aligned_to(const void *x, uintptr_t a) {
    return ((uintptr_t)x & (a - 1)) == 0;
}

extern "C" void arl_cuda_adamw_step(float *p, uint16_t *pb, float *m, float *v, const float *g,
                                    int64_t n, int32_t apply_decay, const arl_cuda_adamw_hp *hp) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (n <= 0) return;
    /* the elements before p's first 16-byte boundary; the other streams must line up there */
    int64_t head = (int64_t)((16 - ((uintptr_t)p & 15)) & 15) / 4;
    if (head > n) head = n;
    const bool vec = aligned_to(p, 4) && aligned_to(m + head, 16) && aligned_to(v + head, 16) &&
                     aligned_to(g + head, 16) && (!pb || aligned_to(pb + head, 8)) && n - head >= 4;
    if (vec) {
        const int64_t n4 = (n - head) / 4; /* a block at least: the 6 odd elements too */
        auto k = pb ? k_adamw<true, true> : k_adamw<false, true>;
        k<<<arl_blocks(n4, 256), 256, 0, c->stream>>>(p, pb, m, v, g, n, head, apply_decay, *hp);
    } else {
        auto k = pb ? k_adamw<true, false> : k_adamw<false, false>;
        k<<<arl_blocks(n, 256), 256, 0, c->stream>>>(p, pb, m, v, g, n, 0, apply_decay, *hp);
    }
    ARL_CUDA_LAUNCHED(c, "adamw_step");
}

/* ======================= bf16 GEMM (cuBLAS) ============================================== */

extern "C" arl_status arl_cuda_gemm_bf16(int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K,
                                         float alpha, const uint16_t *A, int64_t lda,
                                         const uint16_t *B, int64_t ldb, float beta, float *C,
                                         int64_t ldc) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (!arl_blas_dims_ok(M, N, K, lda, ldb, ldc))
        return arl_errorf(ARL_ERR_ARG,
                          "cuda gemm_bf16: sizes %lld x %lld x %lld (leading dimensions %lld, "
                          "%lld, %lld) out of cuBLAS's int range",
                          (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                          (long long)ldc);
    if (M == 0 || N == 0) return ARL_OK;
    cublasStatus_t s = cublasGemmEx(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                    B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda, &beta, C,
                                    CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return arl_cuda_blas_status("gemm_bf16 (cublasGemmEx)", s);
}
