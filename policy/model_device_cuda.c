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
static int64_t cu_absorbed_ws(int64_t S, int64_t Hm, int64_t rkv, int64_t r) {
    (void)r;
    return arl_cuda_mla_absorbed_ws_floats(S, Hm, rkv);
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

/* y (T, out; ldy) = xb W^T + beta y through cuBLAS (bf16 x bf16, fp32 accumulate).  A failed
 * call is recorded by arl_cuda_gemm_bf16's status: kept here and returned by the next cu_sync
 * (the table entries' sticky-error rule). */
static void cu_linear_bf16(float *y, int64_t ldy, float beta, const uint16_t *xb, const uint16_t *W,
                           int64_t T, int64_t in, int64_t out) {
    arl_status s = arl_cuda_gemm_bf16(0, 1, T, out, in, 1.0f, xb, in, W, in, beta, y, ldy);
    if (s && !g_bf16_err) g_bf16_err = s;
}

static int cu_math_bf16(void) {
    return arl_cuda_get_math(ctx_()) == ARL_CUDA_MATH_BF16;
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

/* Whether the experts' GEMMs run on bf16 operands (the weights' bf16 copies, the activations
 * rounded once where they are made): with copies, and widths the tensor-core tiles take (else
 * the fp32 weights, as without copies); in training (train) under the bf16 math mode alone,
 * whose GEMMs round their operands to bf16 anyway - the same operands, and the bf16 tiles give
 * the same sums, bit for bit. */
static int cu_moe_b16(const uint16_t *const *banks, const arl_moe_cfg *c, int train) {
    return banks && c->dz % 16 == 0 && c->f % 16 == 0 && (!train || cu_math_bf16());
}

/* What the routed experts' forward keeps (the training save; the inference forward's work
 * buffer): the plan, the gathered inputs, both GLU inputs, its output and the expert outputs
 * (rows in the plan's sorted order).  With bf16 operands (b16) the gathered inputs and the GLU
 * output are kept in bf16 only. */
typedef struct cu_moe_save {
    int32_t *plan; /* arl_cuda_moe_plan_ints(T, k, E) */
    float *zg;     /* (T*k, dz), or NULL (b16) */
    uint16_t *zgb; /* (T*k, dz) bf16 (b16), or NULL */
    float *g, *u;  /* (T*k, f) */
    float *h;      /* (T*k, f), or NULL (b16) */
    uint16_t *hb;  /* (T*k, f) bf16 (b16), or NULL */
    float *yg;     /* (T*k, dz) */
} cu_moe_save;

/* n bf16 at base + *used (NULL when only sizing) */
static uint16_t *take_h(float *base, int64_t *used, int64_t n) {
    return (uint16_t *)take_f(base, used, (n + 1) / 2);
}

static int64_t cu_moe_save_layout(cu_moe_save *S, float *base, int64_t T, int64_t k, int64_t E,
                                  int64_t dz, int64_t f, int b16) {
    int64_t used = 0, Tk = T * k;
    S->plan = (int32_t *)take_f(base, &used, arl_cuda_moe_plan_ints(T, k, E));
    S->zg = b16 ? NULL : take_f(base, &used, Tk * dz);
    S->zgb = b16 ? take_h(base, &used, Tk * dz) : NULL;
    S->g = take_f(base, &used, Tk * f);
    S->u = take_f(base, &used, Tk * f);
    S->h = b16 ? NULL : take_f(base, &used, Tk * f);
    S->hb = b16 ? take_h(base, &used, Tk * f) : NULL;
    S->yg = take_f(base, &used, Tk * dz);
    return used; /* the fp32 layout is the larger */
}
static int64_t cu_moe_save_floats(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    cu_moe_save S;
    return cu_moe_save_layout(&S, NULL, T, k, E, dz, f, 0);
}

/* policy/moe.c's experts as a plan, a gather, grouped GEMMs and a combine, on bf16 operands
 * when b16 (cu_moe_b16), keeping save (cu_moe_save_floats); keep 0 (an inference forward,
 * save its work buffer): with bf16 operands the GLU's inputs g and u are not written (the
 * gate and up products apply the GLU in their epilogue either way). */
static void cu_moe_fwd(float *u, const float *z, const int32_t *sel, const float *pw,
                       const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                       const uint16_t *const *banks, int b16, int keep, float *save) {
    const int64_t E = c->E, k = c->k, dz = c->dz, f = c->f, Tk = T * k;
    const arl_k_backend *kb = arl_k_backend_cuda();
    cu_moe_save S;
    cu_moe_save_layout(&S, save, T, k, E, dz, f, b16);
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, S.plan, sel, T, k, E);
    if (b16) {
        arl_cuda_moe_gather_bf16(S.zgb, z, &plan, dz);
        arl_cuda_grouped_glu_bf16(keep ? S.g : NULL, keep ? S.u : NULL, S.hb, S.zgb, banks[0],
                                  banks[1], &plan, f, dz, c->act.situ, c->act.beta1, c->act.beta2);
        arl_cuda_grouped_gemm_bf16(S.yg, S.hb, banks[2], 1, &plan, dz, f, 0.0f);
    } else {
        arl_cuda_moe_gather(S.zg, z, &plan, dz);
        arl_cuda_grouped_gemm(S.g, S.zg, p->w1, 1, &plan, f, dz, 0.0f);
        arl_cuda_grouped_gemm(S.u, S.zg, p->w3, 1, &plan, f, dz, 0.0f);
        if (c->act.situ)
            kb->situ_glu_fwd(S.h, S.g, S.u, Tk, f, f, c->act.beta1, c->act.beta2);
        else
            kb->swiglu_fwd(S.h, S.g, S.u, Tk, f, f);
        arl_cuda_grouped_gemm(S.yg, S.h, p->w2, 1, &plan, dz, f, 0.0f);
    }
    arl_cuda_moe_combine(u, S.yg, pw, &plan, dz);
}
static void cu_moe_experts_fwd_save(float *u, const float *z, const int32_t *sel, const float *pw,
                                    const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                                    const uint16_t *const *banks, float *save) {
    cu_moe_fwd(u, z, sel, pw, p, c, T, banks, cu_moe_b16(banks, c, 1), 1, save);
}
/* the inference forward: the training forward with its save in the work buffer, on the copies
 * whatever the math mode */
static void cu_moe_experts_fwd(float *u, const float *z, const int32_t *sel, const float *pw,
                               const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                               const uint16_t *const *banks, float *ws) {
    cu_moe_fwd(u, z, sel, pw, p, c, T, banks, cu_moe_b16(banks, c, 0), 0, ws);
}

/* The backward's buffers: the expert rows' output gradient, the GLU output's, its inputs' and
 * the expert inputs' (b16: the GEMMs' operands among them in bf16). */
typedef struct cu_moe_bws {
    float *dyg, *dg, *du;       /* (T*k, dz), (T*k, f) x 2; NULL (b16) */
    uint16_t *dygb, *dgb, *dub; /* the same in bf16 (b16), or NULL */
    float *dh;                  /* (T*k, f); NULL (b16: the GLU backward takes it in registers) */
    float *dzg;                 /* (T*k, dz) */
} cu_moe_bws;

static int64_t cu_moe_bws_layout(cu_moe_bws *B, float *base, int64_t T, int64_t k, int64_t dz,
                                 int64_t f, int b16) {
    int64_t used = 0, Tk = T * k;
    B->dyg = b16 ? NULL : take_f(base, &used, Tk * dz);
    B->dg = b16 ? NULL : take_f(base, &used, Tk * f);
    B->du = b16 ? NULL : take_f(base, &used, Tk * f);
    B->dygb = b16 ? take_h(base, &used, Tk * dz) : NULL;
    B->dgb = b16 ? take_h(base, &used, Tk * f) : NULL;
    B->dub = b16 ? take_h(base, &used, Tk * f) : NULL;
    B->dh = b16 ? NULL : take_f(base, &used, Tk * f);
    B->dzg = take_f(base, &used, Tk * dz);
    return used; /* the fp32 layout is the larger */
}
static int64_t cu_moe_bwd_ws(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    (void)E;
    cu_moe_bws B;
    return cu_moe_bws_layout(&B, NULL, T, k, dz, f, 0);
}

/* policy/moe_backward.c's expert backward as grouped GEMMs: dyg = p du per row (dp = du . yg),
 * dh = dyg W2_e, dW2_e += dyg^T h, the GLU backward (b16: in dh's epilogue), dW1_e, dW3_e +=
 * d(g|u)^T zg, dzg = dg W1_e + du W3_e, dz = the sum of a token's dzg rows in slot order. */
static void cu_moe_experts_bwd(float *dz, float *dp, const arl_moe_params *gw, const float *du,
                               const int32_t *sel, const float *pw, const arl_moe_params *p,
                               const uint16_t *const *banks, const arl_moe_cfg *c, int64_t T,
                               const float *save, float *ws) {
    const int64_t E = c->E, k = c->k, dzw = c->dz, f = c->f, Tk = T * k;
    const arl_k_backend *kb = arl_k_backend_cuda();
    const int b16 = cu_moe_b16(banks, c, 1);
    cu_moe_save S;
    cu_moe_save_layout(&S, (float *)save, T, k, E, dzw, f, b16);
    cu_moe_bws B;
    cu_moe_bws_layout(&B, ws, T, k, dzw, f, b16);
    arl_cuda_moe_plan plan; /* rebuilt from the same routes: the same plan */
    arl_cuda_moe_plan_build(&plan, S.plan, sel, T, k, E);
    kb->fill(dp, 0.0f, Tk);
    if (b16) {
        arl_cuda_moe_combine_bwd_bf16(B.dygb, dp, du, S.yg, pw, &plan, dzw);
        arl_cuda_grouped_gemm_wgrad_bf16(gw->w2, B.dygb, S.hb, &plan, dzw, f);
        arl_cuda_grouped_glu_bwd_bf16(B.dgb, B.dub, B.dygb, banks[2], S.g, S.u, &plan, f, dzw,
                                      c->act.situ, c->act.beta1, c->act.beta2);
        arl_cuda_grouped_gemm_wgrad_bf16(gw->w1, B.dgb, S.zgb, &plan, f, dzw);
        arl_cuda_grouped_gemm_wgrad_bf16(gw->w3, B.dub, S.zgb, &plan, f, dzw);
        arl_cuda_grouped_gemm_bf16(B.dzg, B.dgb, banks[0], 0, &plan, dzw, f, 0.0f);
        arl_cuda_grouped_gemm_bf16(B.dzg, B.dub, banks[1], 0, &plan, dzw, f, 1.0f);
    } else {
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
    }
    kb->fill(dz, 0.0f, T * dzw);
    arl_cuda_moe_gather_bwd(dz, B.dzg, &plan, dzw);
}

/* the sort's ints in the float work space (the same width) */
static void cu_embed_bwd(float *dtable, const float *dx, const int32_t *tokens, int64_t T,
                         int64_t d, int64_t V, float *ws) {
    arl_cuda_embed_bwd(dtable, dx, tokens, T, d, V, (int32_t *)ws);
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
    .mla_absorbed_attn = arl_cuda_mla_absorbed_attn,
    .attnres_mix_fwd = arl_cuda_attnres_mix_fwd,
    .router_ws_floats = cu_router_ws,
    .router_fwd = cu_router_fwd,
    .moe_experts_ws_floats = cu_moe_save_floats,
    .moe_experts_fwd = cu_moe_experts_fwd,
    .linear_bf16 = cu_linear_bf16,
    .f32_to_bf16 = arl_cuda_f32_to_bf16,
    .math_bf16 = cu_math_bf16,
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
    .embed_bwd_ws_floats = arl_cuda_embed_bwd_ws_ints,
    .embed_bwd = cu_embed_bwd,
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
