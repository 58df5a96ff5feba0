/* kernels/cuda/train.cu: the small backward and optimizer ops the device training step
 * (policy/model_device_backward.c) needs besides the table and the other files here: the KDA
 * decay-gate backwards, the gated output RMSNorm backward, the embedding backward and the
 * per-chunk gradient sums of squares of the AdamW norm.  Each mirrors its CPU function (named
 * in kernels/cuda/ops.h), fp32 with double sums where the CPU sums in double (spec/policy.md
 * 1.4), and every sum runs in a fixed order: the results are deterministic run to run (no
 * floating-point atomics).  The embedding rows' sums walk the tokens in ascending order like
 * the CPU; the gate parameters' sums (dt_bias, A_log) and the norm weight's sums over rows
 * (arl_colsum) split the rows among spans and lanes and add the parts in lane, then span,
 * order. */
#include <math.h>

#include "kernels/cuda/internal.cuh"
#include "kernels/cuda/ops.h"

/* ======================= KDA decay gates (policy/kda.c arl_kda_gate_*_bwd) =============== */

#define GATE_LANES 32 /* row lanes per block (x 32 channels) */
#define GATE_MAX_DK 256

/* Block (h, y): head h, the y-th of the grid's spans of tokens; 32 channels x GATE_LANES token
 * lanes: for each group of 32 channels, lane l walks the span's tokens l, l + GATE_LANES, ...
 * (df += per element; ddt_bias and the channel's dA summed in double), the lanes' sums are
 * added in lane order.  One span (part NULL): the block adds them into ddt_bias and, thread 0
 * in channel order, dA into dA_log[h].  Several: each span's channel sums go to part
 * (span, H dk, 2) and k_gate_bwd_spans adds them in span order, then the channels in channel
 * order: deterministic run to run.  softplus: 0 the K3 gate g = g_min sigmoid(a u), 1 the
 * softplus gate g = -a softplus(u); u = f + dt_bias.  Was one block a head (H blocks in all,
 * every token walked by one block). */
__global__ void __launch_bounds__(32 * GATE_LANES)
    k_gate_bwd(float *df, float *dA_log, float *ddt_bias, double *part, const float *dg,
               const float *f, const float *A_log, const float *dt_bias, int64_t T, int64_t H,
               int64_t dk, int64_t span, float g_min, int softplus) {
    __shared__ double sh_dA[GATE_MAX_DK];
    __shared__ double p_db[GATE_LANES][33], p_dA[GATE_LANES][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t P = H * dk, h = blockIdx.x, r0 = (int64_t)blockIdx.y * span;
    const int64_t r1 = T - r0 < span ? T : r0 + span;
    const float a = expf(A_log[h]);
    for (int64_t g0 = 0; g0 < dk; g0 += 32) {
        const int64_t i = g0 + tx, c = h * dk + i;
        double db = 0.0, dA = 0.0;
        if (i < dk) {
            const float bias = dt_bias[c];
            for (int64_t t = r0 + ty; t < r1; t += GATE_LANES) {
                const float d = dg[t * P + c];
                float du;
                if (softplus) {
                    const float u = f[t * P + c] + bias;
                    const float sp = u > 20.0f ? u : log1pf(expf(u));
                    du = -a * arl_sigmoidf(u) * d;
                    dA += (double)(-a * sp) * d;
                } else {
                    const float z = a * (f[t * P + c] + bias);
                    const float sg = arl_sigmoidf(z);
                    const float dz = d * g_min * sg * (1.0f - sg);
                    du = a * dz;
                    dA += (double)dz * z;
                }
                if (df) df[t * P + c] += du;
                db += du;
            }
        }
        p_db[ty][tx] = db;
        p_dA[ty][tx] = dA;
        __syncthreads();
        if (ty == 0 && i < dk) {
            double sb = 0.0, sa = 0.0;
            for (int l = 0; l < GATE_LANES; l++)
                sb += p_db[l][tx], sa += p_dA[l][tx];
            if (part) {
                part[((int64_t)blockIdx.y * P + c) * 2] = sb;
                part[((int64_t)blockIdx.y * P + c) * 2 + 1] = sa;
            } else {
                if (ddt_bias) ddt_bias[c] += (float)sb;
                sh_dA[i] = sa;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && dA_log && !part) {
        double s = 0.0;
        for (int64_t i = 0; i < dk; i++)
            s += sh_dA[i];
        dA_log[h] += (float)s;
    }
}

/* One block a head, a thread a channel: the spans' sums in span order, then dA in channel
 * order (thread 0). */
__global__ void k_gate_bwd_spans(float *dA_log, float *ddt_bias, const double *part, int64_t H,
                                 int64_t dk, int64_t S) {
    __shared__ double sh_dA[GATE_MAX_DK];
    const int64_t P = H * dk, h = blockIdx.x;
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
        const int64_t c = h * dk + i;
        double sb = 0.0, sa = 0.0;
        for (int64_t y = 0; y < S; y++)
            sb += part[(y * P + c) * 2], sa += part[(y * P + c) * 2 + 1];
        if (ddt_bias) ddt_bias[c] += (float)sb;
        sh_dA[i] = sa;
    }
    __syncthreads();
    if (threadIdx.x == 0 && dA_log) {
        double s = 0.0;
        for (int64_t i = 0; i < dk; i++)
            s += sh_dA[i];
        dA_log[h] += (float)s;
    }
}

/* Token spans of the gate backward: blocks for ARL_COLSUM_BLOCKS, at least 4 tokens a lane,
 * the partials within ARL_CUDA_PARTIALS. */
static int64_t gate_spans(int64_t T, int64_t H, int64_t dk) {
    int64_t S = (ARL_COLSUM_BLOCKS + H - 1) / H;
    if (S > T / (4 * GATE_LANES)) S = T / (4 * GATE_LANES);
    if (S > ARL_CUDA_PARTIALS / (2 * H * dk)) S = ARL_CUDA_PARTIALS / (2 * H * dk);
    return S < 1 ? 1 : S;
}

static void gate_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg, const float *f,
                     const float *A_log, const float *dt_bias, int64_t T, int64_t H, int64_t dk,
                     float g_min, int softplus, const char *op) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0 || H <= 0) return;
    ARL_ASSERT(dk >= 1 && dk <= GATE_MAX_DK);
    const int64_t S = gate_spans(T, H, dk), span = (T + S - 1) / S;
    k_gate_bwd<<<dim3((unsigned)H, (unsigned)S), 32 * GATE_LANES, 0, ctx->stream>>>(
        df, dA_log, ddt_bias, S > 1 ? ctx->partials : NULL, dg, f, A_log, dt_bias, T, H, dk, span,
        g_min, softplus);
    if (S > 1)
        k_gate_bwd_spans<<<(unsigned)H, 128, 0, ctx->stream>>>(dA_log, ddt_bias, ctx->partials, H,
                                                               dk, S);
    ARL_CUDA_LAUNCHED(ctx, op);
}

extern "C" void arl_cuda_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                                         const float *f, const float *A_log, const float *dt_bias,
                                         int64_t T, int64_t H, int64_t dk, float g_min) {
    gate_bwd(df, dA_log, ddt_bias, dg, f, A_log, dt_bias, T, H, dk, g_min, 0, "kda_gate_k3_bwd");
}

extern "C" void arl_cuda_kda_gate_softplus_bwd(float *df, float *dA_log, float *ddt_bias,
                                               const float *dg, const float *f, const float *A_log,
                                               const float *dt_bias, int64_t T, int64_t H,
                                               int64_t dk) {
    gate_bwd(df, dA_log, ddt_bias, dg, f, A_log, dt_bias, T, H, dk, 0.0f, 1,
             "kda_gate_softplus_bwd");
}

/* ======================= gated output RMSNorm (policy/kda.c arl_kda_onorm_bwd) =========== */

/* d_o and dgam: a warp a row, the rows strided over the grid's warps (was a 128-thread block
 * a row); m = mean(dxh * xh) in double (warp sum). */
__global__ void k_onorm_bwd_rows(float *d_o, float *dgam, const float *dob, const float *o,
                                 const float *gam, const float *w, const float *rstd, int64_t n,
                                 int64_t dv) {
    const int lane = threadIdx.x & 31;
    const int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t row = w0; row < n; row += nw) {
        const float *x = o + row * dv, *dy = dob + row * dv, *gm = gam + row * dv;
        const float r = rstd[row];
        double m = 0.0;
        for (int64_t i = lane; i < dv; i += 32)
            m += (double)dy[i] * w[i] * arl_sigmoidf(gm[i]) * (x[i] * r);
        m = arl_warp_sum_d(m) / (double)dv;
        for (int64_t i = lane; i < dv; i += 32) {
            const float sg = arl_sigmoidf(gm[i]);
            const float xh = x[i] * r, dxh = dy[i] * w[i] * sg;
            d_o[row * dv + i] += r * (dxh - xh * (float)m);
            dgam[row * dv + i] += dy[i] * w[i] * xh * sg * (1.0f - sg);
        }
    }
}

/* dw[i] += sum over the rows of dob * xh * sigmoid(gam) (arl_colsum: rows split over lanes,
 * added in lane order; deterministic). */
struct onorm_dw_term {
    const float *dob, *o, *gam, *rstd;
    int64_t dv;
    __device__ double operator()(int64_t t, int64_t i) const {
        return (double)(dob[t * dv + i] * (o[t * dv + i] * rstd[t]) * arl_sigmoidf(gam[t * dv + i]));
    }
};

extern "C" void arl_cuda_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob,
                                       const float *o, const float *gam, const float *w,
                                       const float *rstd, int64_t n, int64_t dv) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (n <= 0) return;
    k_onorm_bwd_rows<<<arl_warp_row_blocks(n), 256, 0, ctx->stream>>>(d_o, dgam, dob, o, gam, w,
                                                                      rstd, n, dv);
    ARL_CUDA_LAUNCHED(ctx, "kda_onorm_bwd");
    if (!dw) return;
    arl_colsum(ctx, n, dv, onorm_dw_term{dob, o, gam, rstd, dv}, arl_colsum_add{dw});
    ARL_CUDA_LAUNCHED(ctx, "kda_onorm_bwd (dw)");
}

/* ======================= embedding backward (policy/model_backward.c) ==================== */

/* The rows of dx added into their tokens' rows in token order, the CPU's order (repeated
 * tokens accumulate deterministically, without atomics), in O(T d) work.  The positions are
 * sorted by token, stably (passes of the counting sort over 9-bit digits of the id, lowest
 * first: a radix sort, kernels/cuda/sort.cu), the last pass writing each sorted entry's token
 * too.  Then block (x, y) takes EMBED_BWD_SPAN sorted entries and 128 columns, and sums each
 * run of one token that starts among its entries to the run's end (past its own entries when
 * the run goes on): a (token, column) sum is one thread's, in position order.  Was every block
 * scanning all T ids for the tokens of its bucket (at T = 1M, d = 7168: 504 blocks of 1M ids). */
#define EMBED_BWD_DIGIT 9
#define EMBED_BWD_SPAN 64

/* The sort's passes over ids below V (one digit each, at least one). */
static int embed_bwd_passes(int64_t V) {
    int bits = 1;
    while (bits < 62 && ((V - 1) >> bits) > 0)
        bits++;
    return (bits + EMBED_BWD_DIGIT - 1) / EMBED_BWD_DIGIT;
}

/* Keys of pass `pass` of P. */
static int64_t embed_bwd_keys(int64_t V, int pass, int P) {
    return pass < P - 1 ? (int64_t)1 << EMBED_BWD_DIGIT : ((V - 1) >> (EMBED_BWD_DIGIT * pass)) + 1;
}

/* The first index after j of a run of v in the sorted ids sk (sk[j] == v), n entries:
 * galloping, then halving. */
__device__ static inline int64_t embed_run_end(const int32_t *sk, int64_t j, int64_t n, int32_t v) {
    int64_t lo = j, hi = n, step = 1;
    for (;;) { /* sk[lo] == v */
        const int64_t t = lo + step;
        if (t >= n) break;
        if (sk[t] != v) {
            hi = t;
            break;
        }
        lo = t;
        step *= 2;
    }
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (sk[mid] == v)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

/* pos (n) the positions sorted by token, sk (n) their tokens; *placed the entries the sort
 * placed (a bad id is left out by it; one below V's top digit yet not below V is skipped here,
 * both reported). */
__global__ void k_embed_bwd_runs(float *dtable, const float *dx, const int32_t *pos,
                                 const int32_t *sk, const int32_t *placed, int64_t d, int64_t V,
                                 arl_cuda_errword *err) {
    const int64_t n = *placed;
    const int64_t j0 = (int64_t)blockIdx.x * EMBED_BWD_SPAN;
    const int64_t i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (j0 >= n || i >= d) return;
    const int64_t j1 = j0 + EMBED_BWD_SPAN < n ? j0 + EMBED_BWD_SPAN : n;
    int64_t j = j0;
    if (j0 > 0 && sk[j0 - 1] == sk[j0]) j = embed_run_end(sk, j0, n, sk[j0]); /* an earlier run */
    while (j < j1) {
        const int32_t v = sk[j];
        const int64_t e = embed_run_end(sk, j, n, v);
        if (v < 0 || v >= V) {
            if (i == 0) arl_dev_error(err, 4, pos[j]);
            j = e;
            continue;
        }
        float *dst = dtable + (int64_t)v * d + i;
        float acc = *dst;
        for (; j + 4 <= e; j += 4) { /* four rows' loads in flight; the adds in order */
            const float a = dx[(int64_t)pos[j] * d + i], b = dx[(int64_t)pos[j + 1] * d + i];
            const float c = dx[(int64_t)pos[j + 2] * d + i], f = dx[(int64_t)pos[j + 3] * d + i];
            acc = acc + a;
            acc = acc + b;
            acc = acc + c;
            acc = acc + f;
        }
        for (; j < e; j++)
            acc = acc + dx[(int64_t)pos[j] * d + i];
        *dst = acc;
    }
}

extern "C" int64_t arl_cuda_embed_bwd_ws_ints(int64_t T, int64_t V) {
    const int64_t R = (int64_t)1 << EMBED_BWD_DIGIT;
    (void)V;
    return 3 * T + 2 * (R + 1) + arl_csort_seg_ints(T, R);
}

extern "C" void arl_cuda_embed_bwd(float *dtable, const float *dx, const int32_t *tokens, int64_t T,
                                   int64_t d, int64_t V, int32_t *ws) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (T <= 0 || d <= 0) return;
    ARL_ASSERT(V >= 1 && V <= INT32_MAX && T <= INT32_MAX && d / 128 < 65535);
    const int64_t R = (int64_t)1 << EMBED_BWD_DIGIT;
    int32_t *perm[2] = {ws, ws + T}, *sk = ws + 2 * T;
    int32_t *counts = sk + T, *offsets = counts + (R + 1), *seg = offsets + (R + 1);
    const int P = embed_bwd_passes(V);
    for (int pass = 0; pass < P; pass++) {
        arl_csort_pass p = {};
        p.src = tokens;
        p.idx = pass > 0 ? perm[(pass - 1) & 1] : NULL;
        p.shift = (uint32_t)(EMBED_BWD_DIGIT * pass);
        p.mask = pass < P - 1 ? (uint32_t)(R - 1) : 0u;
        p.div = 1;
        p.out = perm[pass & 1];
        p.out_value = pass == P - 1 ? sk : NULL;
        p.err_code = 4; /* context.cu: a token id outside [0, V) */
        arl_csort_run(ctx, &p, T, embed_bwd_keys(V, pass, P), counts, offsets, NULL, 1, seg);
    }
    const dim3 grid((unsigned)((T + EMBED_BWD_SPAN - 1) / EMBED_BWD_SPAN),
                    (unsigned)((d + 127) / 128));
    k_embed_bwd_runs<<<grid, 128, 0, ctx->stream>>>(
        dtable, dx, perm[(P - 1) & 1], sk, offsets + embed_bwd_keys(V, P - 1, P), d, V, ctx->err);
    ARL_CUDA_LAUNCHED(ctx, "embed_bwd");
}

/* ======================= AdamW norm (policy/optimizer.c norm_range) ====================== */

/* One block per chunk: double squares, strided, then a fixed-order block sum. */
__global__ void k_grad_sumsq(double *out, const float *g, const int64_t *ranges, int64_t n) {
    __shared__ double sh[33];
    for (int64_t c = blockIdx.x; c < n; c += gridDim.x) {
        const int64_t a = ranges[2 * c], b = ranges[2 * c + 1];
        double acc = 0.0;
        for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x)
            acc += (double)g[i] * (double)g[i];
        acc = arl_block_sum_d(acc, sh);
        if (threadIdx.x == 0) out[c] = acc;
    }
}

extern "C" void arl_cuda_grad_sumsq(double *out, const float *g, const int64_t *ranges, int64_t n) {
    arl_cuda_ctx *ctx = arl_cuda_need();
    if (n <= 0) return;
    unsigned blocks = (unsigned)(n < 65535 ? n : 65535);
    k_grad_sumsq<<<blocks, 256, 0, ctx->stream>>>(out, g, ranges, n);
    ARL_CUDA_LAUNCHED(ctx, "grad_sumsq");
}
