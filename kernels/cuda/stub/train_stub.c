/* kernels/cuda/stub/train_stub.c: the training glue ops of kernels/cuda/train.cu in a build
 * without CUDA.  They cannot be reached (no context can exist), so a call is a programmer
 * error (ARL_ASSERT), as for the other device ops (kernels/cuda/stub/model_stub.c). */
#include <stdint.h>

#include "core/assert.h"
#include "kernels/cuda/ops.h"

#define NO_CTX ARL_ASSERT(!"CUDA op called in a build without CUDA (no context can exist)")

void arl_cuda_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                              const float *f, const float *A_log, const float *dt_bias, int64_t T,
                              int64_t H, int64_t dk, float g_min) {
    (void)df, (void)dA_log, (void)ddt_bias, (void)dg, (void)f, (void)A_log, (void)dt_bias;
    (void)T, (void)H, (void)dk, (void)g_min;
    NO_CTX;
}
void arl_cuda_kda_gate_softplus_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                                    const float *f, const float *A_log, const float *dt_bias,
                                    int64_t T, int64_t H, int64_t dk) {
    (void)df, (void)dA_log, (void)ddt_bias, (void)dg, (void)f, (void)A_log, (void)dt_bias;
    (void)T, (void)H, (void)dk;
    NO_CTX;
}
void arl_cuda_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                            const float *gam, const float *w, const float *rstd, int64_t n,
                            int64_t dv) {
    (void)d_o, (void)dgam, (void)dw, (void)dob, (void)o, (void)gam, (void)w, (void)rstd, (void)n;
    (void)dv;
    NO_CTX;
}
int64_t arl_cuda_embed_bwd_ws_ints(int64_t T, int64_t V) {
    (void)T, (void)V;
    return 0;
}
void arl_cuda_embed_bwd(float *dtable, const float *dx, const int32_t *tokens, int64_t T, int64_t d,
                        int64_t V, int32_t *ws) {
    (void)dtable, (void)dx, (void)tokens, (void)T, (void)d, (void)V, (void)ws;
    NO_CTX;
}
void arl_cuda_grad_sumsq(double *out, const float *g, const int64_t *ranges, int64_t n) {
    (void)out, (void)g, (void)ranges, (void)n;
    NO_CTX;
}
