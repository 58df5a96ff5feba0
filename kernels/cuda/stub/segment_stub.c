/* kernels/cuda/stub/segment_stub.c: the segment-wise training ops of kernels/cuda/segment.cu in
 * a build without CUDA.  They cannot be reached (no context can exist), so a call is a
 * programmer error (ARL_ASSERT), as for the other device ops (kernels/cuda/stub/train_stub.c);
 * the work-buffer size is plain arithmetic and answers as the CUDA build does. */
#include <stdint.h>

#include "core/assert.h"
#include "kernels/cuda/ops.h"

#define NO_CTX ARL_ASSERT(!"CUDA op called in a build without CUDA (no context can exist)")

void arl_cuda_kda_conv_tail_bwd(float *dtail, const float *dz, const float *x, const float *w,
                                const float *tails, const int32_t *cu, int32_t N, int64_t T,
                                int64_t C, int64_t W) {
    (void)dtail, (void)dz, (void)x, (void)w, (void)tails, (void)cu, (void)N, (void)T, (void)C;
    (void)W;
    NO_CTX;
}
void arl_cuda_kda_conv_tail_out_bwd(float *dpre, float *dtail_in, const float *dtail_out,
                                    const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    (void)dpre, (void)dtail_in, (void)dtail_out, (void)cu, (void)N, (void)T, (void)C, (void)W;
    NO_CTX;
}
int64_t arl_cuda_mla_abs_train_ws_floats(int64_t S, int64_t Hm, int64_t rkv, int64_t r) {
    (void)rkv, (void)r;
    return 2 * 16 * Hm * S; /* kernels/cuda/segment.cu: 2 ABS_QB Hm S */
}
void arl_cuda_mla_abs_fwd_save(float *ohat, float *lse, const float *qhat, const float *q_pe,
                               const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                               int64_t r, float scale, float *ws) {
    (void)ohat, (void)lse, (void)qhat, (void)q_pe, (void)rows, (void)p0, (void)Tq, (void)Hm;
    (void)rkv, (void)r, (void)scale, (void)ws;
    NO_CTX;
}
void arl_cuda_mla_abs_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                          const float *dohat, const float *ohat, const float *lse,
                          const float *qhat, const float *q_pe, const float *rows, int64_t p0,
                          int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, float *ws) {
    (void)dqhat, (void)dq_pe, (void)dnew, (void)dprefix, (void)dohat, (void)ohat, (void)lse;
    (void)qhat, (void)q_pe, (void)rows, (void)p0, (void)Tq, (void)Hm, (void)rkv, (void)r;
    (void)scale, (void)ws;
    NO_CTX;
}
