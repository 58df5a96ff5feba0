/* policy/model_device_cuda.c: the "cuda" ops table of policy/model_device.h - thin wrappers
 * of kernels/cuda/ (ops.h, model.cu, train.cu, segment.cu, sparse.cu) on the current CUDA
 * context, plus the routed experts as a routing plan, one gather, three grouped GEMMs (all
 * experts per launch) and a combine (spec 7.2), and their training forward and backward the same
 * way (grouped GEMMs for the input gradients, grouped weight-gradient GEMMs).  Compiled in every
 * build: without CUDA the entry points are the stubs of kernels/cuda/stub/, which cannot be
 * reached because no context can be opened (arl_dev_ops_get fails first with
 * ARL_ERR_UNSUPPORTED). */
#include <string.h>

#include "core/assert.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/ops.h"
#include "policy/model_device.h"

static arl_cuda_ctx *ctx_(void) {
    arl_cuda_ctx *c = arl_cuda_current();
    ARL_ASSERT(c); /* arl_dev_ops_get made a context current */
    return c;
}

static arl_status cu_alloc(size_t bytes, const char *what, void **out, size_t *token) {
    arl_cuda_ctx *c = ctx_();
    *token = arl_cuda_mark(c);
    return arl_cuda_alloc(c, bytes, what, out);
}
static void cu_free(void *p, size_t token) {
    (void)p;
    arl_cuda_release(ctx_(), token); /* stack order: the model's block and all after it */
}
static arl_status cu_upload(void *dst, const void *src, size_t bytes) {
    return arl_cuda_upload(ctx_(), dst, src, bytes);
}
static arl_status cu_download(void *dst, const void *src, size_t bytes) {
    return arl_cuda_download(ctx_(), dst, src, bytes);
}
static arl_status g_bf16_err;
static arl_status cu_sync(void) {
    arl_status s = arl_cuda_sync(ctx_());
    if (!s && g_bf16_err) { /* the message of the failed bf16 GEMM is the thread's last */
        s = g_bf16_err;
        g_bf16_err = ARL_OK;
    }
    return s;
}
static int64_t cu_mla_ws(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm) {
    return arl_cuda_mla_attn_fwd_ws_floats(T, Hm, n, r, vm);
}
static void cu_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                            const float *k_nope, const float *k_pe, const float *v,
                            const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n,
                            int64_t r, int64_t vm, float scale, float *ws) {
    arl_cuda_mla_attn_fwd(o, lse, q_nope, q_pe, k_nope, k_pe, v, cu, N, T, Hm, n, r, vm, scale, ws);
}
static int64_t cu_absorbed_ws(int64_t S, int64_t rkv, int64_t r) {
    (void)S, (void)rkv, (void)r;
    return 0;
}
static void cu_absorbed_attn(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                             int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                             float scale, float *ws) {
    (void)ws;
    arl_cuda_mla_absorbed_attn(ohat, qhat, q_pe, cache, pos0, Tq, Hm, rkv, r, scale);
}
static int64_t cu_router_ws(int64_t T, int64_t E) {
    return T * E;
}
/* logits = x W_r^T (a table GEMM, in the context's math mode), then sigmoid, top-k and
 * weights in fp32 (spec 1.4). */
static void cu_router_fwd(int32_t *sel, float *p, float *s, const float *x, const float *W_r,
                          const float *bias, const int32_t *forced, int64_t T, int64_t d, int64_t E,
                          int64_t k, float rho, float *ws) {
    /* router logits fp32 always (spec 1.4): fp32 multiply-adds whatever the context's mode */
    arl_cuda_ctx *c = ctx_();
    arl_cuda_math saved = arl_cuda_get_math(c);
    arl_cuda_set_math(c, ARL_CUDA_MATH_FP32);
    arl_k_backend_cuda()->linear_fwd(ws, x, W_r, T, d, E);
    arl_cuda_set_math(c, saved);
    arl_cuda_router_fwd(sel, p, s, ws, bias, forced, T, E, k, rho);
}

/* n floats at base + *used (NULL when only sizing); *used advances to an aligned end. */
static float *take_f(float *base, int64_t *used, int64_t n) {
    float *p = base ? base + *used : NULL;
    *used += (n + 63) & ~(int64_t)63;
    return p;
}

typedef struct cu_moe_bufs {
    int32_t *plan;    /* arl_cuda_moe_plan_ints(T, k, E) */
    float *zg;        /* (T*k, dz) */
    float *g, *u, *h; /* (T*k, f) each */
    float *yg;        /* (T*k, dz) */
    uint16_t *xb;     /* (T*k, max(dz, f)) bf16 operands (bf16 weights) */
} cu_moe_bufs;

static int64_t cu_moe_layout(cu_moe_bufs *B, float *base, int64_t T, int64_t k, int64_t E,
                             int64_t dz, int64_t f) {
    int64_t used = 0, Tk = T * k;
    B->plan = (int32_t *)take_f(base, &used, arl_cuda_moe_plan_ints(T, k, E));
    B->zg = take_f(base, &used, Tk * dz);
    B->g = take_f(base, &used, Tk * f);
    B->u = take_f(base, &used, Tk * f);
    B->h = take_f(base, &used, Tk * f);
    B->yg = take_f(base, &used, Tk * dz);
    B->xb = (uint16_t *)take_f(base, &used, (Tk * (dz > f ? dz : f) + 1) / 2);
    return used;
}

static int64_t cu_moe_ws(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    cu_moe_bufs B;
    return cu_moe_layout(&B, NULL, T, k, E, dz, f);
}

static void cu_moe_experts_fwd(float *u, const float *z, const int32_t *sel, const float *pw,
                               const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                               const uint16_t *const *banks, float *ws) {
    const int64_t E = c->E, k = c->k, dz = c->dz, f = c->f, Tk = T * k;
    const arl_k_backend *kb = arl_k_backend_cuda();
    cu_moe_bufs B;
    cu_moe_layout(&B, ws, T, k, E, dz, f);
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, B.plan, sel, T, k, E);
    if (banks) { /* bf16 operands on tensor cores (dz, f multiples of 16), fp32 outputs */
        arl_cuda_moe_gather_bf16(B.xb, z, &plan, dz);
        arl_cuda_grouped_gemm_bf16(B.g, B.xb, banks[0], 1, &plan, f, dz, 0.0f);
        arl_cuda_grouped_gemm_bf16(B.u, B.xb, banks[1], 1, &plan, f, dz, 0.0f);
    } else {
        arl_cuda_moe_gather(B.zg, z, &plan, dz);
        arl_cuda_grouped_gemm(B.g, B.zg, p->w1, 1, &plan, f, dz, 0.0f);
        arl_cuda_grouped_gemm(B.u, B.zg, p->w3, 1, &plan, f, dz, 0.0f);
    }
    if (c->act.situ)
        kb->situ_glu_fwd(B.h, B.g, B.u, Tk, f, f, c->act.beta1, c->act.beta2);
    else
        kb->swiglu_fwd(B.h, B.g, B.u, Tk, f, f);
    if (banks) {
        arl_cuda_f32_to_bf16(B.xb, B.h, Tk * f);
        arl_cuda_grouped_gemm_bf16(B.yg, B.xb, banks[2], 1, &plan, dz, f, 0.0f);
    } else {
        arl_cuda_grouped_gemm(B.yg, B.h, p->w2, 1, &plan, dz, f, 0.0f);
    }
    arl_cuda_moe_combine(u, B.yg, pw, &plan, dz);
}

/* y (T, out; ldy) = bf16(x) W^T + beta y through cuBLAS (bf16 x bf16, fp32 accumulate).  A
 * failed call is recorded by arl_cuda_gemm_bf16's status: kept here and returned by the next
 * cu_sync (the table entries' sticky-error rule). */
static void cu_linear_bf16(float *y, int64_t ldy, float beta, const float *x, const uint16_t *W,
                           int64_t T, int64_t in, int64_t out, uint16_t *xb) {
    arl_cuda_f32_to_bf16(xb, x, T * in);
    arl_status s = arl_cuda_gemm_bf16(0, 1, T, out, in, 1.0f, xb, in, W, in, beta, y, ldy);
    if (s && !g_bf16_err) g_bf16_err = s;
}

static arl_status cu_graph_begin(void) {
    return arl_cuda_graph_begin(ctx_());
}
static arl_status cu_graph_end(void **g) {
    arl_cuda_graph *cg = NULL;
    arl_status s = arl_cuda_graph_end(ctx_(), &cg);
    *g = cg;
    return s;
}
static arl_status cu_graph_launch(void *g) {
    return arl_cuda_graph_launch(ctx_(), (const arl_cuda_graph *)g);
}
static void cu_graph_free(void *g) {
    arl_cuda_graph_free((arl_cuda_graph *)g);
}

/* ---- training ops ---- */

static void cu_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                            const float *d_o, const float *o, const float *lse, const float *q_nope,
                            const float *q_pe, const float *k_nope, const float *k_pe,
                            const float *v, const int32_t *cu, int32_t N, int64_t T, int64_t Hm,
                            int64_t n, int64_t r, int64_t vm, float scale, float *ws) {
    arl_cuda_mla_attn_bwd(dq_nope, dq_pe, dk_nope, dk_pe, dv, d_o, o, lse, q_nope, q_pe, k_nope,
                          k_pe, v, cu, N, T, Hm, n, r, vm, scale, ws);
}
static int64_t cu_attnres_bwd_ws(int32_t N, int64_t T) {
    return 2 * (int64_t)N * T;
}
/* dl = ws (T, E): the logit gradient, then dW_r += dl^T x and dx += dl W_r as table GEMMs in
 * fp32 (the router stays fp32, spec 1.4). */
static void cu_router_bwd(float *dx, float *dW_r, const float *dp, const float *x, const float *W_r,
                          const float *s, const int32_t *sel, int64_t T, int64_t d, int64_t E,
                          int64_t k, float rho, float *ws) {
    arl_cuda_ctx *c = ctx_();
    const arl_k_backend *kb = arl_k_backend_cuda();
    arl_cuda_router_bwd(ws, dp, s, sel, T, E, k, rho);
    arl_cuda_math saved = arl_cuda_get_math(c);
    arl_cuda_set_math(c, ARL_CUDA_MATH_FP32);
    if (dW_r) kb->linear_bwd_w(dW_r, ws, x, T, d, E);
    if (dx) kb->linear_bwd_x(dx, ws, W_r, T, d, E);
    arl_cuda_set_math(c, saved);
}

/* The training save of the routed experts: the plan, the gathered inputs, both GLU inputs,
 * its output and the expert outputs (rows in the plan's sorted order). */
typedef struct cu_moe_save {
    int32_t *plan;    /* arl_cuda_moe_plan_ints(T, k, E) */
    float *zg;        /* (T*k, dz) */
    float *g, *u, *h; /* (T*k, f) */
    float *yg;        /* (T*k, dz) */
} cu_moe_save;

static int64_t cu_moe_save_layout(cu_moe_save *S, float *base, int64_t T, int64_t k, int64_t E,
                                  int64_t dz, int64_t f) {
    int64_t used = 0, Tk = T * k;
    S->plan = (int32_t *)take_f(base, &used, arl_cuda_moe_plan_ints(T, k, E));
    S->zg = take_f(base, &used, Tk * dz);
    S->g = take_f(base, &used, Tk * f);
    S->u = take_f(base, &used, Tk * f);
    S->h = take_f(base, &used, Tk * f);
    S->yg = take_f(base, &used, Tk * dz);
    return used;
}
static int64_t cu_moe_save_floats(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    cu_moe_save S;
    return cu_moe_save_layout(&S, NULL, T, k, E, dz, f);
}

static void cu_moe_experts_fwd_save(float *u, const float *z, const int32_t *sel, const float *pw,
                                    const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                                    float *save) {
    const int64_t E = c->E, k = c->k, dz = c->dz, f = c->f, Tk = T * k;
    const arl_k_backend *kb = arl_k_backend_cuda();
    cu_moe_save S;
    cu_moe_save_layout(&S, save, T, k, E, dz, f);
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, S.plan, sel, T, k, E);
    arl_cuda_moe_gather(S.zg, z, &plan, dz);
    arl_cuda_grouped_gemm(S.g, S.zg, p->w1, 1, &plan, f, dz, 0.0f);
    arl_cuda_grouped_gemm(S.u, S.zg, p->w3, 1, &plan, f, dz, 0.0f);
    if (c->act.situ)
        kb->situ_glu_fwd(S.h, S.g, S.u, Tk, f, f, c->act.beta1, c->act.beta2);
    else
        kb->swiglu_fwd(S.h, S.g, S.u, Tk, f, f);
    arl_cuda_grouped_gemm(S.yg, S.h, p->w2, 1, &plan, dz, f, 0.0f);
    arl_cuda_moe_combine(u, S.yg, pw, &plan, dz);
}

typedef struct cu_moe_bws {
    float *dyg, *dh, *dg, *du, *dzg;
} cu_moe_bws;

static int64_t cu_moe_bws_layout(cu_moe_bws *B, float *base, int64_t T, int64_t k, int64_t dz,
                                 int64_t f) {
    int64_t used = 0, Tk = T * k;
    B->dyg = take_f(base, &used, Tk * dz);
    B->dh = take_f(base, &used, Tk * f);
    B->dg = take_f(base, &used, Tk * f);
    B->du = take_f(base, &used, Tk * f);
    B->dzg = take_f(base, &used, Tk * dz);
    return used;
}
static int64_t cu_moe_bwd_ws(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    (void)E;
    cu_moe_bws B;
    return cu_moe_bws_layout(&B, NULL, T, k, dz, f);
}

/* policy/moe_backward.c's expert backward as grouped GEMMs: dyg = p du per row (dp = du . yg),
 * dh = dyg W2_e, dW2_e += dyg^T h, the GLU backward, dW1_e, dW3_e += d(g|u)^T zg, dzg =
 * dg W1_e + du W3_e, dz = the sum of a token's dzg rows in slot order. */
static void cu_moe_experts_bwd(float *dz, float *dp, const arl_moe_params *gw, const float *du,
                               const int32_t *sel, const float *pw, const arl_moe_params *p,
                               const arl_moe_cfg *c, int64_t T, const float *save, float *ws) {
    const int64_t E = c->E, k = c->k, dzw = c->dz, f = c->f, Tk = T * k;
    const arl_k_backend *kb = arl_k_backend_cuda();
    cu_moe_save S;
    cu_moe_save_layout(&S, (float *)save, T, k, E, dzw, f);
    cu_moe_bws B;
    cu_moe_bws_layout(&B, ws, T, k, dzw, f);
    arl_cuda_moe_plan plan; /* rebuilt from the same routes: the same plan */
    arl_cuda_moe_plan_build(&plan, S.plan, sel, T, k, E);
    kb->fill(dp, 0.0f, Tk);
    arl_cuda_moe_combine_bwd(B.dyg, dp, du, S.yg, pw, &plan, dzw);
    arl_cuda_grouped_gemm(B.dh, B.dyg, p->w2, 0, &plan, f, dzw, 0.0f);
    arl_cuda_grouped_gemm_wgrad(gw->w2, B.dyg, S.h, &plan, dzw, f);
    kb->fill(B.dg, 0.0f, Tk * f);
    kb->fill(B.du, 0.0f, Tk * f);
    if (c->act.situ)
        kb->situ_glu_bwd(B.dg, B.du, B.dh, S.g, S.u, Tk, f, f, c->act.beta1, c->act.beta2);
    else
        kb->swiglu_bwd(B.dg, B.du, B.dh, S.g, S.u, Tk, f, f);
    arl_cuda_grouped_gemm_wgrad(gw->w1, B.dg, S.zg, &plan, f, dzw);
    arl_cuda_grouped_gemm_wgrad(gw->w3, B.du, S.zg, &plan, f, dzw);
    arl_cuda_grouped_gemm(B.dzg, B.dg, p->w1, 0, &plan, dzw, f, 0.0f);
    arl_cuda_grouped_gemm(B.dzg, B.du, p->w3, 0, &plan, dzw, f, 1.0f);
    kb->fill(dz, 0.0f, T * dzw);
    arl_cuda_moe_gather_bwd(dz, B.dzg, &plan, dzw);
}

static const arl_dev_ops cuda_ops = {
    .name = "cuda",
    .backend = arl_k_backend_cuda,
    .mem_alloc = cu_alloc,
    .mem_free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .sync = cu_sync,
    .copy_rows = arl_cuda_copy_rows,
    .embed = arl_cuda_embed,
    .kda_conv_fwd = arl_cuda_conv_fwd,
    .kda_gate_k3_fwd = arl_cuda_kda_gate_k3_fwd,
    .kda_gate_softplus_fwd = arl_cuda_kda_gate_softplus_fwd,
    .kda_conv_tail = arl_cuda_kda_conv_tail,
    .kda_onorm_fwd = arl_cuda_kda_onorm_fwd,
    .kda_chunk_ws_floats = arl_cuda_kda_chunk_ws_floats,
    .kda_chunk_fwd = arl_cuda_kda_chunk_fwd,
    .kda_recurrent_fwd = arl_cuda_kda_recurrent_fwd,
    .mla_attn_ws_floats = cu_mla_ws,
    .mla_attn_fwd = cu_mla_attn_fwd,
    .mla_absorbed_ws_floats = cu_absorbed_ws,
    .mla_absorbed_attn = cu_absorbed_attn,
    .attnres_mix_fwd = arl_cuda_attnres_mix_fwd,
    .router_ws_floats = cu_router_ws,
    .router_fwd = cu_router_fwd,
    .moe_experts_ws_floats = cu_moe_ws,
    .moe_experts_fwd = cu_moe_experts_fwd,
    .linear_bf16 = cu_linear_bf16,
    .f32_to_bf16 = arl_cuda_f32_to_bf16,
    .cache_append_dpos = arl_cuda_cache_append_dpos,
    .mla_chunk_means_update_dpos = arl_cuda_mla_chunk_means_update_dpos,
    .mla_sparse_attn_dpos = arl_cuda_mla_sparse_attn_dpos,
    .mla_absorbed_attn_dpos = arl_cuda_mla_absorbed_attn_dpos,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
    .kda_conv_bwd = arl_cuda_conv_bwd,
    .kda_gate_k3_bwd = arl_cuda_kda_gate_k3_bwd,
    .kda_gate_softplus_bwd = arl_cuda_kda_gate_softplus_bwd,
    .kda_onorm_bwd = arl_cuda_kda_onorm_bwd,
    .kda_chunk_bwd_ws_floats = arl_cuda_kda_chunk_bwd_ws_floats,
    .kda_chunk_bwd = arl_cuda_kda_chunk_bwd,
    .mla_attn_bwd_ws_floats = arl_cuda_mla_attn_bwd_ws_floats,
    .mla_attn_bwd = cu_mla_attn_bwd,
    .attnres_bwd_ws_floats = cu_attnres_bwd_ws,
    .attnres_mix_bwd = arl_cuda_attnres_mix_bwd,
    .router_bwd = cu_router_bwd,
    .moe_experts_save_floats = cu_moe_save_floats,
    .moe_experts_fwd_save = cu_moe_experts_fwd_save,
    .moe_experts_bwd_ws_floats = cu_moe_bwd_ws,
    .moe_experts_bwd = cu_moe_experts_bwd,
    .embed_bwd = arl_cuda_embed_bwd,
    .grad_sumsq = arl_cuda_grad_sumsq,
    .adamw_update = arl_cuda_adamw_step,
    .kda_conv_tail_bwd = arl_cuda_kda_conv_tail_bwd,
    .kda_conv_tail_out_bwd = arl_cuda_kda_conv_tail_out_bwd,
    .mla_abs_train_ws_floats = arl_cuda_mla_abs_train_ws_floats,
    .mla_abs_fwd_save = arl_cuda_mla_abs_fwd_save,
    .mla_abs_bwd = arl_cuda_mla_abs_bwd,
    .mla_chunk_means_update = arl_cuda_mla_chunk_means_update,
    .mla_sparse_ws_floats = arl_cuda_mla_sparse_ws_floats,
    .mla_sparse_attn = arl_cuda_mla_sparse_attn,
    .mla_sparse_train_ws_floats = arl_cuda_mla_sparse_train_ws_floats,
    .mla_sparse_fwd_save = arl_cuda_mla_sparse_fwd_save,
    .mla_sparse_bwd = arl_cuda_mla_sparse_bwd,
};

const arl_dev_ops *arl_dev_ops_cuda(void) {
    return &cuda_ops;
}
