/* kernels/cuda/stub/sparse_stub.c: the block-sparse MLA ops of kernels/cuda/sparse.cu in a
 * build without CUDA.  They cannot be reached (no context can exist), so a call is a programmer
 * error (ARL_ASSERT), as for the other device ops (kernels/cuda/stub/segment_stub.c); the
 * work-buffer sizes are plain arithmetic and answer as the CUDA build does (the training one
 * from kernels/cuda/sparse_layout.h). */
#include <stdint.h>

#include "core/assert.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sparse_layout.h"

#define NO_CTX ARL_ASSERT(!"CUDA op called in a build without CUDA (no context can exist)")

void arl_cuda_mla_chunk_means_update(float *means, const float *cache, int64_t from, int64_t to,
                                     int64_t R, int64_t n_c) {
    (void)means, (void)cache, (void)from, (void)to, (void)R, (void)n_c;
    NO_CTX;
}
int64_t arl_cuda_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv,
                                      int64_t r, int64_t n_c, int64_t k_c) {
    (void)rkv, (void)r;
    ARL_ASSERT(n_c >= 1 && k_c >= 1);
    return Tq_max * Hm * (S / n_c + 1 + k_c); /* kernels/cuda/sparse.cu */
}
void arl_cuda_mla_sparse_attn(float *ohat, const float *qhat, const float *q_pe,
                              const float *cache, const float *means, int64_t pos0, int64_t Tq,
                              int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                              int64_t k_c, float *ws) {
    (void)ohat, (void)qhat, (void)q_pe, (void)cache, (void)means, (void)pos0, (void)Tq, (void)Hm;
    (void)rkv, (void)r, (void)scale, (void)n_c, (void)k_c, (void)ws;
    NO_CTX;
}
int64_t arl_cuda_mla_sparse_train_ws_floats(int64_t Tq_max, int64_t S, int64_t Hm, int64_t rkv,
                                            int64_t r, int64_t n_c, int64_t k_c) {
    ARL_ASSERT(Tq_max >= 1 && S >= 1 && Hm >= 1 && n_c >= 1 && k_c >= 1);
    arl_spt_layout L;
    arl_spt_layout_make(&L, Tq_max, S, Hm, rkv + r, n_c, k_c);
    return L.floats;
}
void arl_cuda_mla_sparse_fwd_save(float *ohat, float *lse, int32_t *list, const float *qhat,
                                  const float *q_pe, const float *rows, int64_t p0, int64_t Tq,
                                  int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                  int64_t k_c, float *ws) {
    (void)ohat, (void)lse, (void)list, (void)qhat, (void)q_pe, (void)rows, (void)p0, (void)Tq;
    (void)Hm, (void)rkv, (void)r, (void)scale, (void)n_c, (void)k_c, (void)ws;
    NO_CTX;
}
void arl_cuda_mla_sparse_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                             const float *dohat, const float *ohat, const float *lse,
                             const int32_t *list, const float *qhat, const float *q_pe,
                             const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                             int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws) {
    (void)dqhat, (void)dq_pe, (void)dnew, (void)dprefix, (void)dohat, (void)ohat, (void)lse;
    (void)list, (void)qhat, (void)q_pe, (void)rows, (void)p0, (void)Tq, (void)Hm, (void)rkv;
    (void)r, (void)scale, (void)n_c, (void)k_c, (void)ws;
    NO_CTX;
}
int32_t arl_cuda_mla_sparse_bwd_window(int32_t chunks) {
    (void)chunks;
    return 0;
}
void arl_cuda_mla_chunk_means_update_dpos(float *means, const float *cache, const int64_t *pos_dev,
                                          int64_t R, int64_t n_c) {
    (void)means, (void)cache, (void)pos_dev, (void)R, (void)n_c;
    NO_CTX;
}
void arl_cuda_mla_sparse_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                   const float *cache, const float *means, const int64_t *pos_dev,
                                   int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                   int64_t k_c, int64_t S, float *ws) {
    (void)ohat, (void)qhat, (void)q_pe, (void)cache, (void)means, (void)pos_dev, (void)Hm;
    (void)rkv, (void)r, (void)scale, (void)n_c, (void)k_c, (void)S, (void)ws;
    NO_CTX;
}
