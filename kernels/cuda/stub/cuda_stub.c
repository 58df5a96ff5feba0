/* kernels/cuda/stub/cuda_stub.c: the CUDA backend's entry points in a build without CUDA
 * (nvcc not found, or AGENTRL_CUDA=OFF).  Opening a context or a communicator returns
 * ARL_ERR_UNSUPPORTED with a message; the device ops cannot be reached without a context,
 * so calling one is a programmer error (ARL_ASSERT).  Compiled only in such builds (see the
 * CUDA block of the root CMakeLists.txt). */
#include <stddef.h>
#include <stdint.h>

#include "core/assert.h"
#include "core/status.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/nccl.h"
#include "kernels/cuda/ops.h"

static arl_status no_cuda(void) {
    return arl_errorf(ARL_ERR_UNSUPPORTED,
                      "cuda: this build has no CUDA backend (nvcc was not found when it was "
                      "configured, or AGENTRL_CUDA=OFF); use --device cpu or rebuild with the "
                      "CUDA toolkit");
}

#define NO_CTX ARL_ASSERT(!"CUDA op called in a build without CUDA (no context can exist)")

/* ---- cuda.h ---- */
void arl_cuda_config_defaults(arl_cuda_config *c) {
    c->device = 0;
    c->arena_bytes = ARL_CUDA_DEFAULT_ARENA;
    c->math = ARL_CUDA_MATH_FP32;
}
int32_t arl_cuda_device_count(void) {
    return 0;
}
arl_status arl_cuda_open(const arl_cuda_config *c, arl_cuda_ctx **out) {
    (void)c;
    *out = NULL;
    return no_cuda();
}
void arl_cuda_close(arl_cuda_ctx *ctx) {
    (void)ctx;
}
arl_cuda_ctx *arl_cuda_current(void) {
    return NULL;
}
void arl_cuda_make_current(arl_cuda_ctx *ctx) {
    (void)ctx;
}
arl_status arl_cuda_default(arl_cuda_ctx **out) {
    *out = NULL;
    return no_cuda();
}
void arl_cuda_set_math(arl_cuda_ctx *ctx, arl_cuda_math m) {
    (void)ctx;
    (void)m;
    NO_CTX;
}
arl_cuda_math arl_cuda_get_math(const arl_cuda_ctx *ctx) {
    (void)ctx;
    NO_CTX;
    return ARL_CUDA_MATH_FP32;
}
void *arl_cuda_stream(arl_cuda_ctx *ctx) {
    (void)ctx;
    NO_CTX;
    return NULL;
}
arl_status arl_cuda_alloc(arl_cuda_ctx *ctx, size_t b, const char *w, void **out) {
    (void)ctx;
    (void)b;
    (void)w;
    *out = NULL;
    return no_cuda();
}
size_t arl_cuda_mark(const arl_cuda_ctx *ctx) {
    (void)ctx;
    return 0;
}
void arl_cuda_release(arl_cuda_ctx *ctx, size_t m) {
    (void)ctx;
    (void)m;
}
size_t arl_cuda_arena_free(const arl_cuda_ctx *ctx) {
    (void)ctx;
    return 0;
}
arl_status arl_cuda_upload(arl_cuda_ctx *c, void *d, const void *s, size_t n) {
    (void)c;
    (void)d;
    (void)s;
    (void)n;
    return no_cuda();
}
arl_status arl_cuda_download(arl_cuda_ctx *c, void *d, const void *s, size_t n) {
    (void)c;
    (void)d;
    (void)s;
    (void)n;
    return no_cuda();
}
arl_status arl_cuda_copy_d2d(arl_cuda_ctx *c, void *d, const void *s, size_t n) {
    (void)c;
    (void)d;
    (void)s;
    (void)n;
    return no_cuda();
}
arl_status arl_cuda_memset0(arl_cuda_ctx *c, void *d, size_t n) {
    (void)c;
    (void)d;
    (void)n;
    return no_cuda();
}
arl_status arl_cuda_sync(arl_cuda_ctx *c) {
    (void)c;
    return no_cuda();
}
void arl_cuda_f32_to_bf16(uint16_t *y, const float *x, int64_t n) {
    (void)y;
    (void)x;
    (void)n;
    NO_CTX;
}
void arl_cuda_bf16_to_f32(float *y, const uint16_t *x, int64_t n) {
    (void)y;
    (void)x;
    (void)n;
    NO_CTX;
}
void arl_cuda_timer_start(arl_cuda_ctx *c) {
    (void)c;
    NO_CTX;
}
float arl_cuda_timer_stop(arl_cuda_ctx *c) {
    (void)c;
    NO_CTX;
    return -1.0f;
}
arl_status arl_cuda_profile_begin(arl_cuda_ctx *ctx) {
    (void)ctx;
    return no_cuda();
}
arl_status arl_cuda_profile_end(arl_cuda_ctx *ctx, FILE *out) {
    (void)ctx;
    (void)out;
    return no_cuda();
}
arl_status arl_cuda_graph_begin(arl_cuda_ctx *ctx) {
    (void)ctx;
    return no_cuda();
}
arl_status arl_cuda_graph_end(arl_cuda_ctx *ctx, arl_cuda_graph **g) {
    (void)ctx;
    *g = NULL;
    return no_cuda();
}
arl_status arl_cuda_graph_launch(arl_cuda_ctx *ctx, const arl_cuda_graph *g) {
    (void)ctx;
    (void)g;
    return no_cuda();
}
void arl_cuda_graph_free(arl_cuda_graph *g) {
    (void)g;
}
const arl_k_backend *arl_cuda_backend(void) {
    return NULL;
}
const arl_k_backend *arl_k_backend_cuda(void) {
    return NULL;
}

/* ---- ops.h ---- */
void arl_cuda_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                       const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    NO_CTX;
}
void arl_cuda_conv_bwd(float *dx, float *dw, const float *dz, const float *x, const float *w,
                       const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                       int64_t W) {
    NO_CTX;
}
void arl_cuda_kda_recurrent_fwd(float *o, float *S, float *cs, const float *q, const float *k,
                                const float *v, const float *g, const float *beta,
                                const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk,
                                int64_t dv, float scale, int64_t C) {
    NO_CTX;
}
int64_t arl_cuda_kda_chunk_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                     int64_t C) {
    return 0;
}
void arl_cuda_kda_chunk_fwd(float *o, float *S, float *cs, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, const int32_t *cu,
                            int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                            int64_t C, float *ws) {
    NO_CTX;
}
int32_t arl_cuda_kda_prep_form(int32_t form) {
    return ARL_CUDA_KDA_PREP_FACTORED;
}
int32_t arl_cuda_moe_tn_form(int32_t form) {
    return ARL_CUDA_MOE_TN_MMA;
}
int32_t arl_cuda_moe_wgmma_available(void) {
    return 0;
}
int32_t arl_cuda_mla_fwd_rows(int32_t rows) {
    return ARL_CUDA_MLA_FWD_ROWS32;
}
void arl_cuda_kda_chunk_prep(float *ws, const float *q, const float *k, const float *v,
                             const float *g, const float *beta, const int32_t *cu, int32_t N,
                             int64_t T, int64_t H, int64_t dk, int64_t dv, float scale, int64_t C) {
    NO_CTX;
}
int64_t arl_cuda_kda_bwd_ws_floats(int32_t N, int64_t H, int64_t dk, int64_t dv, int64_t C) {
    return 0;
}
void arl_cuda_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta,
                                float *dS0, const float *d_o, const float *dS_T, const float *q,
                                const float *k, const float *v, const float *g, const float *beta,
                                const float *cs, const int32_t *cu, int32_t N, int64_t T, int64_t H,
                                int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    NO_CTX;
}
int64_t arl_cuda_kda_chunk_bwd_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                         int64_t C) {
    return 0;
}
void arl_cuda_kda_chunk_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                            const float *d_o, const float *dS_T, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, const float *cs,
                            const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk,
                            int64_t dv, float scale, int64_t C, float *ws) {
    NO_CTX;
}
void arl_cuda_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                           const float *k_nope, const float *k_pe, const float *v,
                           const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n,
                           int64_t r, int64_t vm, float scale, float *ws) {
    NO_CTX;
}
int64_t arl_cuda_mla_attn_fwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm) {
    return 0;
}
int64_t arl_cuda_mla_attn_bwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm) {
    return 0;
}
void arl_cuda_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                           const float *d_o, const float *o, const float *lse, const float *q_nope,
                           const float *q_pe, const float *k_nope, const float *k_pe,
                           const float *v, const int32_t *cu, int32_t N, int64_t T, int64_t Hm,
                           int64_t n, int64_t r, int64_t vm, float scale, float *ws) {
    NO_CTX;
}
void arl_cuda_mla_absorbed_attn(float *ohat, const float *qhat, const float *q_pe,
                                const float *cache, int64_t pos0, int64_t Tq, int64_t Hm,
                                int64_t rkv, int64_t r, float scale, float *ws) {
    NO_CTX;
}
int64_t arl_cuda_mla_absorbed_ws_floats(int64_t max_rows, int64_t Hm, int64_t rkv) {
    (void)max_rows, (void)Hm, (void)rkv;
    return 0;
}
int32_t arl_cuda_mla_split_keys(int32_t keys) {
    (void)keys;
    return 0;
}
void arl_cuda_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                              int64_t d, const float *w_norm, const float *w_proj, float eps) {
    NO_CTX;
}
void arl_cuda_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                              const float *const *src, int32_t N, int64_t T, int64_t d,
                              const float *w_norm, const float *w_proj, float eps, float *ws) {
    NO_CTX;
}
void arl_cuda_router_fwd(int32_t *sel, float *p, float *s, const float *logits, const float *bias,
                         const int32_t *forced, int64_t T, int64_t E, int64_t k, float rho) {
    NO_CTX;
}
void arl_cuda_router_bwd(float *dl, const float *dp, const float *s, const int32_t *sel, int64_t T,
                         int64_t E, int64_t k, float rho) {
    NO_CTX;
}
void arl_cuda_qb_hist_count(int64_t *cnt, const float *s, const float *b_old, int64_t m, int64_t E,
                            int64_t k, float lo, float w, int64_t Nb) {
    NO_CTX;
}
int64_t arl_cuda_moe_plan_ints(int64_t T, int64_t k, int64_t E) {
    return 3 * (E + 1) + 2 * T * k;
}
void arl_cuda_moe_plan_build(arl_cuda_moe_plan *plan, int32_t *buf, const int32_t *sel, int64_t T,
                             int64_t k, int64_t E) {
    NO_CTX;
}
void arl_cuda_moe_gather(float *xp, const float *x, const arl_cuda_moe_plan *plan, int64_t d) {
    NO_CTX;
}
void arl_cuda_moe_gather_bf16(uint16_t *xp, const float *x, const arl_cuda_moe_plan *plan,
                              int64_t d) {
    NO_CTX;
}
void arl_cuda_moe_gather_bwd(float *dx, const float *dxp, const arl_cuda_moe_plan *plan,
                             int64_t d) {
    NO_CTX;
}
void arl_cuda_moe_combine(float *y, const float *yp, const float *p, const arl_cuda_moe_plan *plan,
                          int64_t d) {
    NO_CTX;
}
void arl_cuda_moe_combine_bwd(float *dyp, float *dp, const float *dy, const float *yp,
                              const float *p, const arl_cuda_moe_plan *plan, int64_t d) {
    NO_CTX;
}
void arl_cuda_moe_combine_bwd_bf16(uint16_t *dyp, float *dp, const float *dy, const float *yp,
                                   const float *p, const arl_cuda_moe_plan *plan, int64_t d) {
    NO_CTX;
}
void arl_cuda_glu_fwd_bf16(uint16_t *h, const float *g, const float *u, int64_t T, int64_t f,
                           int64_t ld, int32_t situ, float b1, float b2) {
    NO_CTX;
}
void arl_cuda_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                           const float *u, int64_t T, int64_t f, int64_t ld, int32_t situ, float b1,
                           float b2) {
    NO_CTX;
}
void arl_cuda_grouped_gemm(float *Y, const float *X, const float *W, int32_t trans_w,
                           const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta) {
    NO_CTX;
}
void arl_cuda_grouped_glu_bf16(float *G, float *U, uint16_t *H, const uint16_t *X,
                               const uint16_t *W1, const uint16_t *W3,
                               const arl_cuda_moe_plan *plan, int64_t f, int64_t K, int32_t situ,
                               float b1, float b2) {
    NO_CTX;
}
void arl_cuda_grouped_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const uint16_t *dY,
                                   const uint16_t *W2, const float *g, const float *u,
                                   const arl_cuda_moe_plan *plan, int64_t f, int64_t K,
                                   int32_t situ, float b1, float b2) {
    NO_CTX;
}
void arl_cuda_grouped_gemm_bf16(float *Y, const uint16_t *X, const uint16_t *W, int32_t trans_w,
                                const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta) {
    NO_CTX;
}
void arl_cuda_grouped_gemm_wgrad(float *dW, const float *dY, const float *X,
                                 const arl_cuda_moe_plan *plan, int64_t N, int64_t K) {
    NO_CTX;
}
void arl_cuda_grouped_gemm_wgrad_bf16(float *dW, const uint16_t *dY, const uint16_t *X,
                                      const arl_cuda_moe_plan *plan, int64_t N, int64_t K) {
    NO_CTX;
}
arl_status arl_cuda_gemm_bf16(int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, float alpha,
                              const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                              float beta, float *C, int64_t ldc) {
    return no_cuda();
}
void arl_cuda_adamw_step(float *p, uint16_t *pb, float *m, float *v, const float *g, int64_t n,
                         int32_t apply_decay, const arl_cuda_adamw_hp *hp) {
    NO_CTX;
}

/* ---- nccl.h ---- */
int32_t arl_cuda_nccl_available(void) {
    return 0;
}
arl_status arl_cuda_nccl_unique_id(uint8_t id[ARL_CUDA_NCCL_ID_BYTES]) {
    (void)id;
    return no_cuda();
}
arl_status arl_cuda_nccl_open(arl_cuda_ctx *ctx, const uint8_t id[ARL_CUDA_NCCL_ID_BYTES],
                              int32_t rank, int32_t nranks, arl_cuda_nccl **comm) {
    *comm = NULL;
    return no_cuda();
}
void arl_cuda_nccl_close(arl_cuda_nccl *comm) {
    (void)comm;
}
arl_status arl_cuda_nccl_allreduce_sum(arl_cuda_nccl *comm, float *buf, int64_t n) {
    return no_cuda();
}
arl_status arl_cuda_nccl_broadcast(arl_cuda_nccl *comm, float *buf, int64_t n, int32_t root) {
    return no_cuda();
}
