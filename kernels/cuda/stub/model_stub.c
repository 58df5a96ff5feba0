/* kernels/cuda/stub/model_stub.c: the whole-model glue ops of kernels/cuda/model.cu in a build
 * without CUDA.  They cannot be reached (no context can exist), so a call is a programmer
 * error (ARL_ASSERT), as for the other device ops (kernels/cuda/stub/cuda_stub.c). */
#include <stdint.h>

#include "core/assert.h"
#include "kernels/cuda/ops.h"

#define NO_CTX ARL_ASSERT(!"CUDA op called in a build without CUDA (no context can exist)")

void arl_cuda_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                        int64_t cols) {
    (void)dst, (void)ldd, (void)src, (void)lds, (void)rows, (void)cols;
    NO_CTX;
}
void arl_cuda_embed(float *x, const float *table, const int32_t *tokens, int64_t T, int64_t d,
                    int64_t V) {
    (void)x, (void)table, (void)tokens, (void)T, (void)d, (void)V;
    NO_CTX;
}
void arl_cuda_kda_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                              int64_t T, int64_t H, int64_t dk, float g_min) {
    (void)g, (void)f, (void)A_log, (void)dt_bias, (void)T, (void)H, (void)dk, (void)g_min;
    NO_CTX;
}
void arl_cuda_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log,
                                    const float *dt_bias, int64_t T, int64_t H, int64_t dk) {
    (void)g, (void)f, (void)A_log, (void)dt_bias, (void)T, (void)H, (void)dk;
    NO_CTX;
}
void arl_cuda_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam,
                            const float *w, int64_t n, int64_t dv, float eps) {
    (void)ob, (void)rstd, (void)o, (void)gam, (void)w, (void)n, (void)dv, (void)eps;
    NO_CTX;
}
void arl_cuda_kda_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in,
                            int64_t C, int64_t W) {
    (void)tail_out, (void)x, (void)n, (void)tail_in, (void)C, (void)W;
    NO_CTX;
}
void arl_cuda_cache_append_dpos(float *cache, const int64_t *pos_dev, const float *rows, int64_t n,
                                int64_t R) {
    (void)cache, (void)pos_dev, (void)rows, (void)n, (void)R;
    NO_CTX;
}
void arl_cuda_mla_absorbed_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                     const float *cache, const int64_t *pos_dev, int64_t Tq,
                                     int64_t Hm, int64_t rkv, int64_t r, float scale,
                                     int64_t max_rows, float *ws) {
    (void)ohat, (void)qhat, (void)q_pe, (void)cache, (void)pos_dev, (void)Tq, (void)Hm, (void)rkv;
    (void)r, (void)scale, (void)max_rows, (void)ws;
    NO_CTX;
}
