/* policy/attnres.c: the AttnRes mix of spec 5.1/5.3 (see policy/attnres.h).  Tokens run in
 * parallel on the kernels' pool; the backward's dw, a sum over tokens, runs as a second pass
 * over columns (each column summed in token order), so no result depends on the thread count. */
#include "policy/attnres.h"

#include <math.h>

#include "core/assert.h"
#include "kernels/threadpool.h"

/* rho_j, z_j and the softmax a_j of one token t. */
static void token_weights(double *rho, double *z, double *a, const float *const *src, int32_t N,
                          int64_t t, int64_t d, const float *w_norm, const float *w_proj,
                          float eps) {
    double zmax = -INFINITY;
    for (int32_t j = 0; j < N; j++) {
        const float *V = src[j] + t * d;
        /* four partial sums (element i in sum i mod 4), added as (s0 + s2) + (s1 + s3): four
         * independent chains instead of one long chain of dependent double additions */
        double s4[4] = {0, 0, 0, 0}, d4[4] = {0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 4 <= d; i += 4)
            for (int l = 0; l < 4; l++) {
                s4[l] += (double)V[i + l] * V[i + l];
                d4[l] += (double)w_norm[i + l] * w_proj[i + l] * V[i + l];
            }
        for (; i < d; i++) {
            s4[i & 3] += (double)V[i] * V[i];
            d4[i & 3] += (double)w_norm[i] * w_proj[i] * V[i];
        }
        double ss = (s4[0] + s4[2]) + (s4[1] + s4[3]), dot = (d4[0] + d4[2]) + (d4[1] + d4[3]);
        rho[j] = 1.0 / sqrt(ss / (double)d + (double)eps);
        z[j] = rho[j] * dot;
        zmax = z[j] > zmax ? z[j] : zmax;
    }
    double sum = 0.0;
    for (int32_t j = 0; j < N; j++) {
        a[j] = exp(z[j] - zmax);
        sum += a[j];
    }
    for (int32_t j = 0; j < N; j++)
        a[j] /= sum;
}

typedef struct mix_args {
    float *out, *a;
    float *const *dsrc;
    float *dw_norm, *dw_proj;
    double *ws; /* (T, 2N): dz_j, rho_j of every token (backward with ws) */
    const float *dh;
    const float *const *src;
    int32_t N;
    int64_t T, d;
    const float *w_norm, *w_proj;
    float eps;
} mix_args;

/* Columns per block of the per-token loops (double rows on the stack). */
#define MIX_BLK 256

static void mix_dw_cols(const mix_args *A, int64_t t, int64_t i0, int64_t nb, const double *dz,
                        const double *rho);

static void mix_fwd_tokens(void *vctx, int64_t t0, int64_t t1) {
    const mix_args *A = vctx;
    const int32_t N = A->N;
    const int64_t d = A->d, T = A->T;
    double rho[ARL_ATTNRES_MAX_SOURCES], z[ARL_ATTNRES_MAX_SOURCES], aw[ARL_ATTNRES_MAX_SOURCES];
    double acc[MIX_BLK];
    for (int64_t t = t0; t < t1; t++) {
        token_weights(rho, z, aw, A->src, N, t, d, A->w_norm, A->w_proj, A->eps);
        for (int64_t i0 = 0; i0 < d; i0 += MIX_BLK) { /* each element sums j = 0 .. N-1 */
            const int64_t nb = d - i0 < MIX_BLK ? d - i0 : MIX_BLK;
            for (int64_t k = 0; k < nb; k++)
                acc[k] = 0.0;
            for (int32_t j = 0; j < N; j++) {
                const float *V = A->src[j] + t * d + i0;
                for (int64_t k = 0; k < nb; k++)
                    acc[k] += aw[j] * V[k];
            }
            for (int64_t k = 0; k < nb; k++)
                A->out[t * d + i0 + k] = (float)acc[k];
        }
        if (A->a)
            for (int32_t j = 0; j < N; j++)
                A->a[j * T + t] = (float)aw[j];
    }
}

/* Work of one token (multiply-adds), for the thread grain. */
static int64_t token_work(int32_t N, int64_t d) {
    return 4 * (int64_t)N * d;
}

void arl_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                         int64_t d, const float *w_norm, const float *w_proj, float eps) {
    ARL_ASSERT(N >= 1 && N <= ARL_ATTNRES_MAX_SOURCES);
    mix_args A = {.out = out, .a = a, .src = src, .N = N, .T = T, .d = d, .w_norm = w_norm,
                  .w_proj = w_proj, .eps = eps};
    arl_k_parallel_for(T, arl_k_work_grain(token_work(N, d)), mix_fwd_tokens, &A);
}

/* The backward of tokens [t0, t1): dsrc, and with ws the tokens' dz_j and rho_j for the dw pass;
 * without ws also dw, token by token (the same arithmetic as mix_bwd_dw). */
static void mix_bwd_tokens(void *vctx, int64_t t0, int64_t t1) {
    const mix_args *A = vctx;
    const int32_t N = A->N;
    const int64_t d = A->d;
    const float *const *src = A->src;
    double rho[ARL_ATTNRES_MAX_SOURCES], z[ARL_ATTNRES_MAX_SOURCES], aw[ARL_ATTNRES_MAX_SOURCES];
    double dz[ARL_ATTNRES_MAX_SOURCES];
    for (int64_t t = t0; t < t1; t++) {
        const float *g = A->dh + t * d;
        token_weights(rho, z, aw, src, N, t, d, A->w_norm, A->w_proj, A->eps);
        /* da_j = dh . V_j;  dz_j = a_j (da_j - sum_i a_i da_i) */
        double mean_da = 0.0;
        for (int32_t j = 0; j < N; j++) {
            const float *V = src[j] + t * d;
            double a4[4] = {0, 0, 0, 0}; /* partial sums as in token_weights */
            int64_t i = 0;
            for (; i + 4 <= d; i += 4)
                for (int l = 0; l < 4; l++)
                    a4[l] += (double)g[i + l] * V[i + l];
            for (; i < d; i++)
                a4[i & 3] += (double)g[i] * V[i];
            double da = (a4[0] + a4[2]) + (a4[1] + a4[3]);
            dz[j] = da;
            mean_da += aw[j] * da;
        }
        for (int32_t j = 0; j < N; j++)
            dz[j] = aw[j] * (dz[j] - mean_da);
        if (A->ws)
            for (int32_t j = 0; j < N; j++) {
                A->ws[t * 2 * N + j] = dz[j];
                A->ws[t * 2 * N + N + j] = rho[j];
            }
        /* dV_j = a_j dh + dz_j rho_j (w - z_j kappa_j / d) with kappa_j = rho_j V_j, as
         * a_j dh + (dz_j rho_j) (w - (z_j rho_j / d) V_j);  dw = sum_j dz_j kappa_j */
        for (int64_t i0 = 0; i0 < d; i0 += MIX_BLK) {
            const int64_t nb = d - i0 < MIX_BLK ? d - i0 : MIX_BLK;
            double wv[MIX_BLK];
            for (int64_t k = 0; k < nb; k++)
                wv[k] = (double)A->w_norm[i0 + k] * A->w_proj[i0 + k];
            for (int32_t j = 0; j < N; j++) {
                if (!A->dsrc[j]) continue;
                const double ca = aw[j], cb = dz[j] * rho[j], cz = z[j] * rho[j] / (double)d;
                const float *V = src[j] + t * d + i0, *gi = g + i0;
                float *D = A->dsrc[j] + t * d + i0;
                for (int64_t k = 0; k < nb; k++)
                    D[k] += (float)(ca * gi[k] + cb * (wv[k] - cz * V[k]));
            }
            if (!A->ws) mix_dw_cols(A, t, i0, nb, dz, rho);
        }
    }
}

/* dw_norm, dw_proj of columns [i0, i0 + nb) (nb <= MIX_BLK) += token t's part, from its dz_j and
 * rho_j: per column dw = sum_j dz_j (rho_j V_j), j ascending. */
static void mix_dw_cols(const mix_args *A, int64_t t, int64_t i0, int64_t nb, const double *dz,
                        const double *rho) {
    const int64_t d = A->d;
    double acc[MIX_BLK];
    for (int64_t k = 0; k < nb; k++)
        acc[k] = 0.0;
    for (int32_t j = 0; j < A->N; j++) {
        const float *V = A->src[j] + t * d + i0;
        for (int64_t k = 0; k < nb; k++)
            acc[k] += dz[j] * (rho[j] * V[k]);
    }
    for (int64_t k = 0; k < nb; k++) {
        if (A->dw_norm) A->dw_norm[i0 + k] += (float)(acc[k] * A->w_proj[i0 + k]);
        if (A->dw_proj) A->dw_proj[i0 + k] += (float)(acc[k] * A->w_norm[i0 + k]);
    }
}

/* dw of columns [c0, c1) from ws, each column summed over the tokens in ascending order. */
static void mix_bwd_dw(void *vctx, int64_t c0, int64_t c1) {
    const mix_args *A = vctx;
    const int32_t N = A->N;
    for (int64_t t = 0; t < A->T; t++) {
        const double *dz = A->ws + t * 2 * N, *rho = dz + N;
        for (int64_t i0 = c0; i0 < c1; i0 += MIX_BLK)
            mix_dw_cols(A, t, i0, c1 - i0 < MIX_BLK ? c1 - i0 : MIX_BLK, dz, rho);
    }
}

int64_t arl_attnres_bwd_ws_doubles(int32_t N, int64_t T) {
    return 2 * (int64_t)N * T;
}

void arl_attnres_mix_bwd_ws(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                            const float *const *src, int32_t N, int64_t T, int64_t d,
                            const float *w_norm, const float *w_proj, float eps, double *ws) {
    ARL_ASSERT(N >= 1 && N <= ARL_ATTNRES_MAX_SOURCES);
    mix_args A = {.dsrc = dsrc, .dw_norm = dw_norm, .dw_proj = dw_proj, .ws = ws, .dh = dh,
                  .src = src, .N = N, .T = T, .d = d, .w_norm = w_norm, .w_proj = w_proj,
                  .eps = eps};
    if (!ws) {
        mix_bwd_tokens(&A, 0, T);
        return;
    }
    arl_k_parallel_for(T, arl_k_work_grain(2 * token_work(N, d)), mix_bwd_tokens, &A);
    if (dw_norm || dw_proj)
        arl_k_parallel_for(d, arl_k_work_grain(2 * (int64_t)N * T), mix_bwd_dw, &A);
}

void arl_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                         const float *const *src, int32_t N, int64_t T, int64_t d,
                         const float *w_norm, const float *w_proj, float eps) {
    arl_attnres_mix_bwd_ws(dsrc, dw_norm, dw_proj, dh, src, N, T, d, w_norm, w_proj, eps, NULL);
}
