/* policy/router.c: router forward and backward of spec 6 (see policy/router.h). */
#include "policy/router.h"

#include <string.h>

#include "core/assert.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/topk.h"

int64_t arl_router_ws_floats(int64_t T, int64_t E) {
    return T * E;
}

arl_status arl_router_fwd(int32_t *sel, float *p, float *s, const float *x, const float *W_r,
                          const float *bias, const int32_t *forced, int64_t T, int64_t d, int64_t E,
                          int64_t k, float rho, float *ws) {
    ARL_ASSERT(k >= 1 && k <= E && ws);
    arl_k_linear_fwd(s, x, W_r, T, d, E); /* logits, then scores in place */
    arl_k_sigmoid_fwd(s, s, T * E);
    if (forced) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < k; i++) {
                int32_t e = forced[t * k + i];
                if (e < 0 || e >= E)
                    return arl_errorf(ARL_ERR_RANGE,
                                      "router: forced route %lld of token %lld is "
                                      "expert %d, outside [0, %lld)",
                                      (long long)i, (long long)t, e, (long long)E);
                for (int64_t j = 0; j < i; j++)
                    if (forced[t * k + j] == e)
                        return arl_errorf(ARL_ERR_RANGE,
                                          "router: forced routes of token %lld "
                                          "repeat expert %d",
                                          (long long)t, e);
            }
        memcpy(sel, forced, sizeof(int32_t) * (size_t)(T * k));
    } else {
        for (int64_t i = 0; i < T * E; i++)
            ws[i] = s[i] + bias[i % E]; /* selection only */
        arl_k_topk_rows(sel, NULL, ws, T, E, k);
    }
    for (int64_t t = 0; t < T; t++) {
        float Z = 0.0f;
        for (int64_t i = 0; i < k; i++)
            Z += s[t * E + sel[t * k + i]];
        for (int64_t i = 0; i < k; i++)
            p[t * k + i] = rho * s[t * E + sel[t * k + i]] / (Z + 1e-20f);
    }
    return ARL_OK;
}

void arl_router_bwd(float *dx, float *dW_r, const float *dp, const float *x, const float *W_r,
                    const float *s, const int32_t *sel, int64_t T, int64_t d, int64_t E, int64_t k,
                    float rho, float *ws) {
    ARL_ASSERT(ws);
    float *dl = ws; /* (T, E) gradient of the logits */
    memset(dl, 0, sizeof(float) * (size_t)(T * E));
    for (int64_t t = 0; t < T; t++) {
        const int32_t *st = sel + t * k;
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
    if (dW_r) arl_k_linear_bwd_w(dW_r, dl, x, T, d, E);
    if (dx) arl_k_linear_bwd_x(dx, dl, W_r, T, d, E);
}

int64_t arl_router_overlap(const float *scores, const float *bias, int64_t E, int64_t k,
                           const int32_t *stored, float *ws, int32_t *nat) {
    for (int64_t e = 0; e < E; e++)
        ws[e] = scores[e] + (bias ? bias[e] : 0.0f);
    arl_k_topk_rows(nat, NULL, ws, 1, E, k);
    int64_t inter = 0;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++)
            inter += nat[i] == stored[j];
    return inter;
}
