/* policy/attnres.c: the AttnRes mix of spec 5.1/5.3 (see policy/attnres.h). */
#include "policy/attnres.h"

#include <math.h>

#include "core/assert.h"

/* rho_j, z_j and the softmax a_j of one token t. */
static void token_weights(double *rho, double *z, double *a, const float *const *src, int32_t N,
                          int64_t t, int64_t d, const float *w_norm, const float *w_proj,
                          float eps) {
    double zmax = -INFINITY;
    for (int32_t j = 0; j < N; j++) {
        const float *V = src[j] + t * d;
        double ss = 0.0, dot = 0.0;
        for (int64_t i = 0; i < d; i++) {
            ss += (double)V[i] * V[i];
            dot += (double)w_norm[i] * w_proj[i] * V[i];
        }
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

void arl_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                         int64_t d, const float *w_norm, const float *w_proj, float eps) {
    ARL_ASSERT(N >= 1 && N <= ARL_ATTNRES_MAX_SOURCES);
    double rho[ARL_ATTNRES_MAX_SOURCES], z[ARL_ATTNRES_MAX_SOURCES], aw[ARL_ATTNRES_MAX_SOURCES];
    for (int64_t t = 0; t < T; t++) {
        token_weights(rho, z, aw, src, N, t, d, w_norm, w_proj, eps);
        for (int64_t i = 0; i < d; i++) {
            double acc = 0.0;
            for (int32_t j = 0; j < N; j++)
                acc += aw[j] * src[j][t * d + i];
            out[t * d + i] = (float)acc;
        }
        if (a)
            for (int32_t j = 0; j < N; j++)
                a[j * T + t] = (float)aw[j];
    }
}

void arl_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                         const float *const *src, int32_t N, int64_t T, int64_t d,
                         const float *w_norm, const float *w_proj, float eps) {
    ARL_ASSERT(N >= 1 && N <= ARL_ATTNRES_MAX_SOURCES);
    double rho[ARL_ATTNRES_MAX_SOURCES], z[ARL_ATTNRES_MAX_SOURCES], aw[ARL_ATTNRES_MAX_SOURCES];
    double dz[ARL_ATTNRES_MAX_SOURCES];
    for (int64_t t = 0; t < T; t++) {
        const float *g = dh + t * d;
        token_weights(rho, z, aw, src, N, t, d, w_norm, w_proj, eps);
        /* da_j = dh . V_j;  dz_j = a_j (da_j - sum_i a_i da_i) */
        double mean_da = 0.0;
        for (int32_t j = 0; j < N; j++) {
            const float *V = src[j] + t * d;
            double da = 0.0;
            for (int64_t i = 0; i < d; i++)
                da += (double)g[i] * V[i];
            dz[j] = da;
            mean_da += aw[j] * da;
        }
        for (int32_t j = 0; j < N; j++)
            dz[j] = aw[j] * (dz[j] - mean_da);
        /* dV_j = a_j dh + dz_j rho_j (w - z_j kappa_j / d);  dw = sum_j dz_j kappa_j */
        for (int64_t i = 0; i < d; i++) {
            double w = (double)w_norm[i] * w_proj[i], dw = 0.0;
            for (int32_t j = 0; j < N; j++) {
                double kappa = rho[j] * src[j][t * d + i];
                if (dsrc[j])
                    dsrc[j][t * d + i] +=
                        (float)(aw[j] * g[i] + dz[j] * rho[j] * (w - z[j] * kappa / (double)d));
                dw += dz[j] * kappa;
            }
            if (dw_norm) dw_norm[i] += (float)(dw * w_proj[i]);
            if (dw_proj) dw_proj[i] += (float)(dw * w_norm[i]);
        }
    }
}
