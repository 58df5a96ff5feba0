/* policy/model_device.c: the policy forward over the backend tables (see
 * policy/model_device.h), and the host ops table.
 *
 * Reading order: the host ops (thin wrappers of the policy/ functions, plus the routed
 * experts of policy/moe.c line by line), the workspace layout, init, the sublayers, then
 * dev_run, which mirrors policy/model.c model_run op by op (fresh documents or documents
 * continuing decode-state slots): the KDA mixer of policy/kda_layer.c, the MLA mixer of
 * policy/mla_layer.c (expanded form for fresh documents, absorbed over the caches otherwise),
 * the FFNs of policy/moe.c.  Keep the two in step: the cpu-device test compares them bit for
 * bit.  A decode step with decode_graphs replays a CUDA graph of the whole step (dev_run
 * captures it on the first step of a slot set; the two ops that read positions then read
 * them from device memory).
 */
#include "policy/model_device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "policy/attnres.h"
#include "policy/kda.h"
#include "policy/kda_layer_backward.h"
#include "policy/mla.h"
#include "policy/mla_layer_backward.h"
#include "policy/model_device_bump.h"
#include "policy/moe_internal.h"
#include "policy/optimizer_internal.h"
#include "policy/router.h"

/* Queries of one document per absorbed-attention call (policy/mla_layer.c MLA_QBLOCK). */
#define MLA_QBLOCK 16

/* ======================= host ops ======================================================== */

static const arl_k_backend *cpu_backend(void) {
    return arl_k_backend_cpu();
}

static arl_status cpu_alloc(size_t bytes, const char *what, void **out, size_t *token) {
    *token = 0;
    *out = NULL;
    size_t n = (bytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, n ? n : 64);
    if (!*out)
        return arl_errorf(ARL_ERR_NOMEM, "model (cpu device): cannot allocate %zu bytes for %s",
                          bytes, what);
    return ARL_OK;
}
static void cpu_free(void *p, size_t token) {
    (void)token;
    free(p);
}
static arl_status cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return ARL_OK;
}
static arl_status cpu_sync(void) {
    return ARL_OK;
}
static void cpu_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                          int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ldd, src + r * lds, sizeof(float) * (size_t)cols);
}
static void cpu_embed(float *x, const float *table, const int32_t *tokens, int64_t T, int64_t d,
                      int64_t V) {
    (void)V;
    for (int64_t t = 0; t < T; t++)
        memcpy(x + t * d, table + (int64_t)tokens[t] * d, sizeof(float) * (size_t)d);
}
static int64_t cpu_kda_chunk_ws(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                int64_t C) {
    (void)T, (void)N;
    return arl_kda_chunk_ws_floats(H, dk, dv, C);
}
static int64_t cpu_mla_attn_ws(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm) {
    (void)n, (void)vm;
    return arl_mla_attn_ws_floats(T, Hm, r);
}
static int64_t cpu_absorbed_ws(int64_t S, int64_t Hm, int64_t rkv, int64_t r) {
    (void)Hm;
    return arl_mla_absorbed_ws_floats(S, rkv, r, 0);
}
static void cpu_absorbed_attn(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                              int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                              float scale, float *ws) {
    arl_mla_absorbed_attn(ohat, NULL, 0, qhat, q_pe, cache, pos0, Tq, Hm, rkv, r, scale, 0, 0, ws);
}
/* block-sparse MLA: the reference's own core (policy/mla.c), no selection mask */
static void cpu_sparse_attn(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                            const float *means, int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv,
                            int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws) {
    arl_mla_sparse_attn(ohat, NULL, 0, qhat, q_pe, cache, means, pos0, Tq, Hm, rkv, r, scale, n_c,
                        k_c, ws);
}
static void cpu_router_fwd(int32_t *sel, float *p, float *s, const float *x, const float *W_r,
                           const float *bias, const int32_t *forced, int64_t T, int64_t d,
                           int64_t E, int64_t k, float rho, float *ws) {
    arl_status st = arl_router_fwd(sel, p, s, x, W_r, bias, forced, T, d, E, k, rho, ws);
    ARL_ASSERT(st == ARL_OK); /* forced routes are checked before the forward */
}

/* The routed experts exactly as policy/moe.c runs them: count, gather by expert, one GLU per
 * expert with its own GEMMs, weighted sum in slot order. */
/* n floats at base + *used (NULL when only sizing); *used advances to an aligned end. */
static float *take_f(float *base, int64_t *used, int64_t n) {
    float *p = base ? base + *used : NULL;
    *used += (n + 15) & ~(int64_t)15;
    return p;
}

/* What the training forward of the routed experts keeps (policy/moe_backward.c's save). */
typedef struct cpu_moe_save {
    int64_t *start; /* (E + 1) */
    int64_t *row;   /* (T*k) */
    float *zg;      /* (T*k, dz) */
    float *gu;      /* (T*k, 2f) */
    float *h;       /* (T*k, f) */
    float *yg;      /* (T*k, dz) */
} cpu_moe_save;

static int64_t cpu_moe_save_layout(cpu_moe_save *S, float *base, int64_t T, int64_t k, int64_t E,
                                   int64_t dz, int64_t f) {
    int64_t used = 0, Tk = T * k;
    S->start = (int64_t *)take_f(base, &used, 2 * (E + 1));
    S->row = (int64_t *)take_f(base, &used, 2 * Tk);
    S->zg = take_f(base, &used, Tk * dz);
    S->gu = take_f(base, &used, Tk * 2 * f);
    S->h = take_f(base, &used, Tk * f);
    S->yg = take_f(base, &used, Tk * dz);
    return used;
}
static int64_t cpu_moe_save_floats(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    cpu_moe_save S;
    return cpu_moe_save_layout(&S, NULL, T, k, E, dz, f) + 2 * E; /* + the fill counters */
}

/* arl_moe_fwd_save's grouping, experts and combine (u = u_pre there). */
static void cpu_moe_experts_fwd_save(float *u, const float *z, const int32_t *sel, const float *pw,
                                     const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                                     const uint16_t *const *banks, float *save) {
    ARL_ASSERT(!banks); /* no bf16 weights on the host */
    const int64_t E = c->E, k = c->k, dz = c->dz, f = c->f;
    cpu_moe_save S;
    int64_t used = cpu_moe_save_layout(&S, save, T, k, E, dz, f);
    int64_t *fill = (int64_t *)(save + used);
    arl_moe_group(S.start, fill, S.row, S.zg, z, sel, T, k, E, dz);
    arl_moe_experts_fwd_range(S.yg, S.gu, S.h, S.zg, S.start, p, c, 0, E);
    arl_moe_combine_range(u, pw, S.yg, S.row, k, dz, 0, T);
}

/* The inference forward is the training forward with its save in the work buffer. */
static void cpu_moe_experts_fwd(float *u, const float *z, const int32_t *sel, const float *pw,
                                const arl_moe_params *p, const arl_moe_cfg *c, int64_t T,
                                const uint16_t *const *banks, float *ws) {
    cpu_moe_experts_fwd_save(u, z, sel, pw, p, c, T, banks, ws);
}

/* ---- training ops (the backward of policy/model_backward.c and the AdamW of
 * policy/optimizer.c: their shared pieces, policy/moe_internal.h, policy/optimizer_internal.h) ----
 */

static int64_t cpu_kda_chunk_bwd_ws(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                    int64_t C) {
    (void)T, (void)N;
    return arl_kda_bwd_ws_floats(H, dk, dv, C);
}
static int64_t cpu_attnres_bwd_ws(int32_t N, int64_t T) {
    return 2 * arl_attnres_bwd_ws_doubles(N, T);
}
static void cpu_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                                const float *const *src, int32_t N, int64_t T, int64_t d,
                                const float *w_norm, const float *w_proj, float eps, float *ws) {
    arl_attnres_mix_bwd_ws(dsrc, dw_norm, dw_proj, dh, src, N, T, d, w_norm, w_proj, eps,
                           (double *)ws);
}

static int64_t cpu_moe_bwd_ws(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f) {
    (void)E;
    const int64_t Tk = T * k;
    return ((Tk * dz + 15) & ~(int64_t)15) + ((Tk * f + 15) & ~(int64_t)15) +
           ((Tk * 2 * f + 15) & ~(int64_t)15) + ((Tk * dz + 15) & ~(int64_t)15);
}

/* policy/moe_backward.c's pieces (policy/moe_internal.h) over all tokens and experts on one
 * thread (the reference's parallel parts compute the same bits). */
static void cpu_moe_experts_bwd(float *dz, float *dp, const arl_moe_params *gw, const float *du,
                                const int32_t *sel, const float *pw, const arl_moe_params *p,
                                const uint16_t *const *banks, const arl_moe_cfg *c, int64_t T,
                                const float *save, float *ws) {
    (void)sel;
    ARL_ASSERT(!banks);
    const int64_t E = c->E, k = c->k, dzw = c->dz, f = c->f, Tk = T * k;
    cpu_moe_save S;
    cpu_moe_save_layout(&S, (float *)save, T, k, E, dzw, f);
    float *dyg = ws;
    float *dh = dyg + ((Tk * dzw + 15) & ~(int64_t)15);
    float *dgu = dh + ((Tk * f + 15) & ~(int64_t)15);
    float *dzg = dgu + ((Tk * 2 * f + 15) & ~(int64_t)15);
    arl_moe_slots_bwd_range(dp, dyg, du, S.yg, pw, S.row, k, dzw, 0, T);
    arl_moe_experts_bwd_range(dzg, gw, dyg, S.zg, S.gu, S.h, S.start, p, c, dh, dgu, 0, E);
    arl_moe_gather_dz_range(dz, dzg, S.row, k, dzw, 0, T);
}

static void cpu_router_bwd(float *dx, float *dW_r, const float *dp, const float *x,
                           const float *W_r, const float *s, const int32_t *sel, int64_t T,
                           int64_t d, int64_t E, int64_t k, float rho, float *ws) {
    arl_router_bwd(dx, dW_r, dp, x, W_r, s, sel, T, d, E, k, rho, ws);
}

static int64_t cpu_embed_bwd_ws_floats(int64_t T, int64_t V) {
    (void)T, (void)V;
    return 0;
}

static void cpu_embed_bwd(float *dtable, const float *dx, const int32_t *tokens, int64_t T,
                          int64_t d, int64_t V, float *ws) {
    (void)V, (void)ws;
    for (int64_t t = 0; t < T; t++) {
        const float *g = dx + t * d;
        float *dst = dtable + (int64_t)tokens[t] * d;
        for (int64_t i = 0; i < d; i++)
            dst[i] += g[i];
    }
}

/* policy/optimizer.c's norm chunks and element update (policy/optimizer_internal.h). */
static void cpu_grad_sumsq(double *out, const float *g, const int64_t *ranges, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        out[c] = arl_optim_sumsq(g + ranges[2 * c], ranges[2 * c + 1] - ranges[2 * c]);
}

/* AdamW's element update (policy/optimizer.c); "cpu" keeps no bf16 weight copy to refresh */
static void cpu_adamw_update(float *p, uint16_t *pb, float *m, float *v, const float *g, int64_t n,
                             int32_t apply_decay, const arl_cuda_adamw_hp *hp) {
    ARL_ASSERT(pb == NULL);
    arl_optim_update(p, m, v, g, n, apply_decay, hp);
}

/* segment-wise training: the absorbed core's work buffer (policy/mla_layer_backward.h) */
static int64_t cpu_abs_train_ws(int64_t S, int64_t Hm, int64_t rkv, int64_t r) {
    (void)rkv, (void)r;
    return arl_mla_absorbed_train_ws_floats(S, Hm);
}

static const arl_dev_ops cpu_ops = {
    .name = "cpu",
    .backend = cpu_backend,
    .mem_alloc = cpu_alloc,
    .mem_free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .copy_rows = cpu_copy_rows,
    .embed = cpu_embed,
    .kda_conv_fwd = arl_kda_conv_fwd,
    .kda_gate_k3_fwd = arl_kda_gate_k3_fwd,
    .kda_gate_softplus_fwd = arl_kda_gate_softplus_fwd,
    .kda_conv_tail = arl_kda_conv_tail,
    .kda_onorm_fwd = arl_kda_onorm_fwd,
    .kda_chunk_ws_floats = cpu_kda_chunk_ws,
    .kda_chunk_fwd = arl_kda_chunk_fwd,
    .kda_recurrent_fwd = arl_kda_recurrent_fwd,
    .mla_attn_ws_floats = cpu_mla_attn_ws,
    .mla_attn_fwd = arl_mla_attn_fwd,
    .mla_absorbed_ws_floats = cpu_absorbed_ws,
    .mla_absorbed_attn = cpu_absorbed_attn,
    .attnres_mix_fwd = arl_attnres_mix_fwd,
    .router_ws_floats = arl_router_ws_floats,
    .router_fwd = cpu_router_fwd,
    .moe_experts_ws_floats = cpu_moe_save_floats,
    .moe_experts_fwd = cpu_moe_experts_fwd,
    .kda_conv_bwd = arl_kda_conv_bwd,
    .kda_gate_k3_bwd = arl_kda_gate_k3_bwd,
    .kda_gate_softplus_bwd = arl_kda_gate_softplus_bwd,
    .kda_onorm_bwd = arl_kda_onorm_bwd,
    .kda_chunk_bwd_ws_floats = cpu_kda_chunk_bwd_ws,
    .kda_chunk_bwd = arl_kda_chunk_bwd,
    .mla_attn_bwd_ws_floats = cpu_mla_attn_ws,
    .mla_attn_bwd = arl_mla_attn_bwd,
    .attnres_bwd_ws_floats = cpu_attnres_bwd_ws,
    .attnres_mix_bwd = cpu_attnres_mix_bwd,
    .router_bwd = cpu_router_bwd,
    .moe_experts_save_floats = cpu_moe_save_floats,
    .moe_experts_fwd_save = cpu_moe_experts_fwd_save,
    .moe_experts_bwd_ws_floats = cpu_moe_bwd_ws,
    .moe_experts_bwd = cpu_moe_experts_bwd,
    .embed_bwd_ws_floats = cpu_embed_bwd_ws_floats,
    .embed_bwd = cpu_embed_bwd,
    .grad_sumsq = cpu_grad_sumsq,
    .adamw_update = cpu_adamw_update,
    .kda_conv_tail_bwd = arl_kda_conv_tail_bwd,
    .kda_conv_tail_out_bwd = arl_kda_conv_tail_out_bwd,
    .mla_abs_train_ws_floats = cpu_abs_train_ws,
    .mla_abs_fwd_save = arl_mla_absorbed_fwd_save,
    .mla_abs_bwd = arl_mla_absorbed_bwd,
    .mla_chunk_means_update = arl_mla_chunk_means_update,
    .mla_sparse_ws_floats = arl_mla_sparse_ws_floats,
    .mla_sparse_attn = cpu_sparse_attn,
    .mla_sparse_train_ws_floats = arl_mla_sparse_doc_ws_floats,
    .mla_sparse_fwd_save = arl_mla_sparse_doc_fwd_save,
    .mla_sparse_bwd = arl_mla_sparse_doc_bwd,
};

const arl_dev_ops *arl_dev_ops_cpu(void) {
    return &cpu_ops;
}

arl_status arl_dev_ops_get(const char *device, size_t cuda_arena_bytes, const arl_dev_ops **out) {
    const arl_k_backend *kb = NULL;
    *out = NULL;
    if (device && strcmp(device, "cuda") == 0 && cuda_arena_bytes > 0 && !arl_cuda_current() &&
        arl_k_backend_cuda() && arl_cuda_device_count() > 0) {
        arl_cuda_config c;
        arl_cuda_ctx *ctx = NULL;
        arl_cuda_config_defaults(&c);
        c.arena_bytes = cuda_arena_bytes;
        ARL_TRY(arl_cuda_open(&c, &ctx)); /* kept for the life of the process */
        arl_cuda_make_current(ctx);
    }
    ARL_TRY(arl_k_backend_get(device, &kb));
    *out = strcmp(kb->name, "cpu") == 0 ? arl_dev_ops_cpu() : arl_dev_ops_cuda();
    return ARL_OK;
}

/* ======================= workspace layout ================================================ */


typedef struct kda_bufs {
    float *proj, *q, *k, *v, *fa, *g, *beta, *o, *gam, *ga, *S0, *core;
} kda_bufs;

static int64_t kda_layout(kda_bufs *B, float *base, const arl_model_dev *m, int64_t T, int32_t N) {
    const arl_kda_layer_cfg *c = &m->kda;
    const int64_t P = c->H * c->dk, Hv = c->H * c->dv;
    bump w = {base, 0};
    B->proj = take(&w, T * P);
    B->q = take(&w, T * P);
    B->k = take(&w, T * P);
    B->v = take(&w, T * Hv);
    B->fa = take(&w, T * c->dk);
    B->g = take(&w, T * P);
    B->beta = take(&w, T * c->H);
    B->o = take(&w, T * Hv);
    B->gam = take(&w, T * Hv);
    B->ga = take(&w, T * c->dk);
    B->S0 = take(&w, (int64_t)N * c->H * c->dk * c->dv);
    B->core = take(&w, m->ops->kda_chunk_ws_floats(T, N, c->H, c->dk, c->dv, c->chunk));
    return w.used;
}

typedef struct mla_bufs {
    float *cq, *qf, *ckv, *c, *q_nope, *q_pe, *kv, *k_nope, *v, *k_pe, *attn, *o, *gate;
} mla_bufs;

static int64_t mla_layout(mla_bufs *B, float *base, const arl_model_dev *m, int64_t T) {
    const arl_mla_layer_cfg *c = &m->mla;
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    bump w = {base, 0};
    B->cq = take(&w, T * (c->rq > 0 ? c->rq : 1));
    B->qf = take(&w, T * Hm * (n + r));
    B->ckv = take(&w, T * (rkv + r));
    B->c = take(&w, T * rkv);
    B->q_nope = take(&w, T * Hm * n);
    B->q_pe = take(&w, T * Hm * r);
    B->kv = take(&w, T * Hm * (n + vm));
    B->k_nope = take(&w, T * Hm * n);
    B->v = take(&w, T * Hm * vm);
    B->k_pe = take(&w, T * r);
    B->attn = take(&w, m->ops->mla_attn_ws_floats(T, Hm, n, r, vm));
    B->o = take(&w, T * Hm * vm);
    B->gate = take(&w, T * Hm * vm);
    return w.used;
}

typedef struct ffn_bufs {
    float *s, *pw, *router, *z, *experts, *u, *gu, *h;
} ffn_bufs;

static int64_t ffn_layout(ffn_bufs *B, float *base, const arl_model_dev *m, int64_t T) {
    const arl_moe_cfg *c = &m->moe;
    const int64_t fw = c->fs > m->dm.fd ? c->fs : m->dm.fd; /* shared experts or dense FFN */
    bump w = {base, 0};
    B->s = take(&w, T * c->E);
    B->pw = take(&w, T * c->k);
    B->router = take(&w, m->ops->router_ws_floats(T, c->E));
    B->z = take(&w, T * c->dz);
    B->experts = take(&w, m->ops->moe_experts_ws_floats(T, c->k, c->E, c->dz, c->f));
    B->u = take(&w, T * c->dz);
    B->gu = take(&w, T * 2 * fw);
    B->h = take(&w, T * fw);
    return w.used;
}

static int64_t max2(int64_t a, int64_t b) {
    return a > b ? a : b;
}

/* Layout of the whole arena; base NULL only sizes it.  Returns floats. */
static int64_t dev_layout(arl_model_dev *m, float *base) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = m->opts.max_tokens, d = dm->d;
    const int32_t N = m->opts.max_docs;
    bump w = {base, 0};
    m->weights = take(&w, m->weight_floats);
    if (m->dopts.bf16_weights) {
        const int64_t wid[] = {dm->d,           dm->P,  dm->H * dm->dv, dm->dk, dm->rq, dm->rkv,
                               dm->Hm * dm->vm, dm->fd, dm->fs,         dm->dz, dm->f};
        int64_t mx = 1;
        for (size_t i = 0; i < sizeof wid / sizeof wid[0]; i++)
            mx = wid[i] > mx ? wid[i] : mx;
        m->xb16_in = mx;
        m->wb16 = (uint16_t *)take(&w, (m->weight_floats + 1) / 2);
        m->xb16 = (uint16_t *)take(&w, (T * mx + 1) / 2); /* the widest GEMM input in bf16 */
        m->xin16 = (uint16_t *)take(&w, (T * d + 1) / 2);
    }
    m->res = take(&w, (m->n_blocks + 1) * T * d);
    m->hbuf = take(&w, T * d);
    m->xbuf = take(&w, T * d);
    m->ybuf = take(&w, T * d);
    m->logits = take(&w, T * dm->V);
    m->logprobs = take(&w, T);
    m->entropy = take(&w, T);
    m->tokens = (int32_t *)take(&w, T);
    m->targets = (int32_t *)take(&w, T);
    m->cu = (int32_t *)take(&w, (int64_t)N + 1);
    int64_t nr = (dm->n_moe > 0 ? dm->n_moe : 1) * T * (dm->k > 0 ? dm->k : 1);
    m->routes = (int32_t *)take(&w, nr);
    m->forced = (int32_t *)take(&w, nr);
    const int sparse = m->mla.sparse_topk > 0 && dm->n_mla > 0;
    const int64_t R = dm->rkv + dm->r;
    if (m->n_slots > 0) {
        const int64_t sn = dm->H * dm->dk * dm->dv;
        const int64_t tn = 3 * dm->P * (dm->W - 1);
        m->st_kda = take(&w, dm->n_kda * m->n_slots * (sn + tn));
        m->st_lat = take(&w, dm->n_mla * m->lat_rows * R);
        m->kda_S = take(&w, (int64_t)N * sn);
        m->kda_tails = take(&w, (int64_t)N * tn);
        m->kda_tin = take(&w, (int64_t)N * dm->P * (dm->W - 1));
        m->mla_ws =
            take(&w, m->ops->mla_absorbed_ws_floats(m->max_context, dm->Hm, dm->rkv, dm->r));
        m->pos_dev = (int64_t *)take(&w, 2 * (int64_t)N);
    }
    if (m->n_slots > 0 || sparse) {
        m->lat = take(&w, T * R);
        m->qhat = take(&w, T * dm->Hm * dm->rkv);
        m->ohat = take(&w, T * dm->Hm * dm->rkv);
    }
    if (sparse) { /* spec 4.5: chunk summaries of the slots and of a forward's fresh documents */
        const int64_t n_c = m->mla.sparse_chunk;
        m->means_rows = (m->max_context + n_c - 1) / n_c;
        m->st_means = m->n_slots > 0 ? take(&w, dm->n_mla * m->n_slots * m->means_rows * R) : NULL;
        m->fmeans = take(&w, (T / n_c + N + 1) * R); /* a document of len has len / n_c + 1 */
        m->sparse_ws = take(&w, m->ops->mla_sparse_ws_floats(MLA_QBLOCK, dm->Hm, m->mla.max_rows,
                                                             dm->rkv, dm->r, n_c,
                                                             m->mla.sparse_topk));
    }
    kda_bufs kb;
    mla_bufs mb;
    ffn_bufs fb;
    int64_t s = 16;
    if (dm->n_kda) s = max2(s, kda_layout(&kb, NULL, m, T, N));
    if (dm->n_mla) s = max2(s, mla_layout(&mb, NULL, m, T));
    s = max2(s, ffn_layout(&fb, NULL, m, T));
    m->scratch_floats = s;
    m->scratch = take(&w, s);
    return w.used;
}

/* ======================= init ============================================================ */

static arl_status dev_settings(arl_model_dev *m, const arl_dev_ops *ops,
                               const arl_model_config *cfg, const arl_model_opts *opts,
                               const arl_model_dev_opts *dopts) {
    arl_model_dev_opts dz = {0};
    if (!dopts) dopts = &dz;
    const int32_t n_slots = dopts->n_slots;
    if (dopts->bf16_weights && !ops->linear_bf16)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "model (%s device): bf16 weights exist only on "
                          "the cuda device",
                          ops->name);
    if (dopts->decode_graphs && !ops->graph_begin)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "model (%s device): CUDA graphs exist only on "
                          "the cuda device",
                          ops->name);
    m->dopts = *dopts;
    const arl_model_dims *dm = &cfg->dims;
    arl_model_opts o;
    if (opts)
        o = *opts;
    else
        arl_model_opts_default(&o);
    if (o.max_tokens < 1 || o.max_docs < 1)
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): max_tokens (%lld) and max_docs (%d) "
                          "must be >= 1",
                          ops->name, (long long)o.max_tokens, o.max_docs);
    int64_t cmax = strcmp(ops->name, "cuda") == 0 ? 64 : 256;
    if (o.kda_chunk < 1 || o.kda_chunk > cmax)
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): kda_chunk must be in [1, %lld], got "
                          "%lld",
                          ops->name, (long long)cmax, (long long)o.kda_chunk);
    if (o.mla_sparse_topk < 0 || (o.mla_sparse_topk > 0 && o.mla_sparse_chunk < 1))
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): mla_sparse_topk must be >= 0 and "
                          "mla_sparse_chunk >= 1, got %lld and %lld",
                          ops->name, (long long)o.mla_sparse_topk, (long long)o.mla_sparse_chunk);
    if (o.mla_sparse_topk > 0 &&
        (!ops->mla_chunk_means_update || !ops->mla_sparse_ws_floats || !ops->mla_sparse_attn))
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "model (%s device): this device has no block-sparse MLA ops "
                          "(mla_sparse_topk = %lld); use 0 or policy/model.h",
                          ops->name, (long long)o.mla_sparse_topk);
    if (o.max_docs > o.max_tokens) o.max_docs = (int32_t)o.max_tokens;
    if (o.max_context <= 0) o.max_context = cfg->text.max_position_embeddings;
    if (o.max_tokens > ARL_MAX_CONTEXT_ROWS || o.max_context > ARL_MAX_CONTEXT_ROWS)
        return arl_errorf(ARL_ERR_RANGE,
                          "model (%s device): max_tokens (%lld) and max_context (%lld%s%s) must "
                          "be at most %lld (2^40), the largest this build supports",
                          ops->name, (long long)o.max_tokens, (long long)o.max_context,
                          o.max_context_key ? ", from " : "",
                          o.max_context_key ? o.max_context_key : "",
                          (long long)ARL_MAX_CONTEXT_ROWS);
    if (n_slots < 0)
        return arl_errorf(ARL_ERR_ARG, "model (%s device): n_slots must be >= 0, got %d", ops->name,
                          n_slots);
    if (dopts->slot_rows < 0 || (dopts->slot_rows > 0 && dopts->decode_graphs))
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): slot_rows must be >= 0 (got %lld), and shared slot "
                          "rows cannot be used with decode_graphs (a captured step keeps the "
                          "rows' addresses)",
                          ops->name, (long long)dopts->slot_rows);
    m->n_slots = n_slots;
    m->max_context = o.max_context;
    m->lat_rows = dopts->slot_rows > 0 ? dopts->slot_rows : (int64_t)n_slots * o.max_context;
    if (dm->dk != dm->dv)
        return arl_errorf(ARL_ERR_CONFIG, "model (%s device): KDA needs head_dim dk = dv",
                          ops->name);
    /* a device's chunkwise KDA may bound the chunks of one call (the cuda context's chunk
     * table: ops.h arl_cuda_kda_chunk_ws_floats); its sizes say -1 past the bound */
    if (dm->n_kda > 0 && (ops->kda_chunk_ws_floats(o.max_tokens, o.max_docs, dm->H, dm->dk, dm->dv,
                                                   o.kda_chunk) < 0 ||
                          (ops->kda_chunk_bwd_ws_floats &&
                           ops->kda_chunk_bwd_ws_floats(o.max_tokens, o.max_docs, dm->H, dm->dk,
                                                        dm->dv, o.kda_chunk) < 0)))
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): %lld tokens in up to %d documents make more KDA "
                          "chunks of %lld tokens than the device's chunkwise KDA takes in one "
                          "call; lower max_tokens or max_docs, or raise kda_chunk",
                          ops->name, (long long)o.max_tokens, o.max_docs, (long long)o.kda_chunk);
    m->ops = ops;
    m->cfg = cfg;
    m->dm = *dm;
    m->opts = o;
    /* the CPU model's settings (block-sparse MLA included) */
    arl_model_layer_cfgs_make(cfg, &o, &m->eps, &m->act, &m->kda, &m->mla, &m->moe);
    m->n_blocks = dm->B > 0 ? (int32_t)((dm->L + dm->B - 1) / dm->B) : 0;
    arl_param_inventory inv;
    ARL_TRY(arl_param_inventory_build(cfg, &inv));
    m->weight_floats = inv.arena_floats;
    arl_param_inventory_free(&inv);
    return ARL_OK;
}

arl_status arl_model_dev_plan(arl_model_dev *m, const arl_dev_ops *ops, const arl_model_config *cfg,
                              const arl_model_opts *opts, const arl_model_dev_opts *dopts) {
    memset(m, 0, sizeof *m);
    m->ops = ops;
    return dev_settings(m, ops, cfg, opts, dopts);
}

int64_t arl_model_dev_bytes(const arl_model_config *cfg, const arl_model_opts *opts,
                            const arl_dev_ops *ops, const arl_model_dev_opts *dopts) {
    arl_model_dev m;
    memset(&m, 0, sizeof m);
    m.ops = ops;
    if (dev_settings(&m, ops, cfg, opts, dopts)) return -1;
    return dev_layout(&m, NULL) * (int64_t)sizeof(float);
}

arl_status arl_model_dev_init(arl_model_dev *m, const arl_dev_ops *ops, const arl_model_config *cfg,
                              const arl_model_params *host_w, const arl_model_opts *opts,
                              const arl_model_dev_opts *dopts) {
    memset(m, 0, sizeof *m);
    ARL_TRY(dev_settings(m, ops, cfg, opts, dopts));
    m->kb = ops->backend();
    ARL_ASSERT(m->kb);
    m->arena_floats = dev_layout(m, NULL);
    arl_status s = ops->mem_alloc((size_t)m->arena_floats * sizeof(float), "the model arena",
                                  &m->arena, &m->arena_token);
    if (s) {
        arl_error_prefix(s, "model (%s device, %lld bytes)", ops->name,
                         (long long)(m->arena_floats * 4));
        m->arena = NULL;
        arl_model_dev_free(m);
        return s;
    }
    dev_layout(m, (float *)m->arena);
    /* a parameter view whose pointers are the device weights */
    s = arl_model_params_view(&m->w, cfg, m->weights);
    if (!s) {
        m->moe_index = malloc(sizeof(int32_t) * (size_t)(m->dm.L > 0 ? m->dm.L : 1));
        m->no_targets = malloc(sizeof(int32_t) * (size_t)m->opts.max_tokens);
        m->st_pos = calloc((size_t)(m->n_slots > 0 ? m->n_slots : 1), sizeof(int64_t));
        m->slot_row0 = calloc((size_t)(m->n_slots > 0 ? m->n_slots : 1), sizeof(int64_t));
        m->slot_cap = calloc((size_t)(m->n_slots > 0 ? m->n_slots : 1), sizeof(int64_t));
        m->slot_order = calloc((size_t)(m->n_slots > 0 ? m->n_slots : 1), sizeof(int32_t));
        m->caches = calloc((size_t)m->opts.max_docs, sizeof(float *));
        m->cu_host1 = malloc(sizeof(int32_t) * (size_t)(m->opts.max_docs + 1));
        m->pos_host = malloc(sizeof(int64_t) * (size_t)m->opts.max_docs);
        m->graph_slots = malloc(sizeof(int32_t) * (size_t)m->opts.max_docs);
        m->routes_host =
            malloc(sizeof(int32_t) * (size_t)(m->opts.max_tokens * (m->dm.k > 0 ? m->dm.k : 1)));
        if (!m->moe_index || !m->no_targets || !m->st_pos || !m->slot_row0 || !m->slot_cap ||
            !m->slot_order || !m->caches || !m->cu_host1 || !m->pos_host || !m->graph_slots ||
            !m->routes_host)
            s = arl_errorf(ARL_ERR_NOMEM, "model (%s device): host index arrays", ops->name);
    }
    if (!s) {
        int32_t j = 0;
        for (int64_t l = 0; l < m->dm.L; l++)
            m->moe_index[l] = m->w.layers[l].is_moe ? j++ : -1;
        for (int64_t t = 0; t < m->opts.max_tokens; t++)
            m->no_targets[t] = -1;
        for (int32_t i = 0; i < m->n_slots && m->dopts.slot_rows == 0; i++) { /* fixed ranges */
            m->slot_row0[i] = i * m->max_context;
            m->slot_cap[i] = m->max_context;
        }
        s = arl_model_dev_set_params(m, host_w);
        for (int32_t i = 0; i < m->n_slots && !s; i++)
            s = arl_model_dev_slot_reset(m, i);
        if (!s) s = ops->sync();
    }
    if (s) arl_model_dev_free(m);
    return s;
}

void arl_model_dev_free(arl_model_dev *m) {
    if (!m) return;
    if (m->graph) m->ops->graph_free(m->graph);
    if (m->arena) m->ops->mem_free(m->arena, m->arena_token);
    arl_model_params_free(&m->w);
    free(m->moe_index);
    free(m->no_targets);
    free(m->st_pos);
    free(m->slot_row0);
    free(m->slot_cap);
    free(m->slot_order);
    free((void *)m->caches);
    free(m->cu_host1);
    free(m->pos_host);
    free(m->graph_slots);
    free(m->routes_host);
    memset(m, 0, sizeof *m);
}

arl_status arl_model_dev_set_params(arl_model_dev *m, const arl_model_params *host_w) {
    if (!host_w || !host_w->arena || host_w->inv.arena_floats != m->weight_floats)
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): the host parameters do not belong "
                          "to this model's config",
                          m->ops->name);
    arl_status s =
        m->ops->upload(m->weights, host_w->arena, sizeof(float) * (size_t)m->weight_floats);
    if (s) return arl_error_prefix(s, "model (%s device): uploading the weights", m->ops->name);
    if (m->wb16) { /* the bf16 copies (round to nearest even), then the fp32 masters stay */
        m->ops->f32_to_bf16(m->wb16, m->weights, m->weight_floats);
        s = m->ops->sync();
    }
    return s;
}

/* ======================= batch check ===================================================== */

arl_status arl_model_dev_batch_check(const arl_model_dev *m, const arl_batch *b, const char *what) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = b->T;
    const int32_t N = b->cu ? b->N : 1;
    if (T < 1 || T > m->opts.max_tokens)
        return arl_errorf(ARL_ERR_RANGE,
                          "%s (%s device): batch of %lld tokens, the model "
                          "takes 1..%lld (max_tokens)",
                          what, m->ops->name, (long long)T, (long long)m->opts.max_tokens);
    if (N < 1 || N > m->opts.max_docs)
        return arl_errorf(ARL_ERR_RANGE,
                          "%s (%s device): batch of %d documents, the model "
                          "takes 1..%d (max_docs)",
                          what, m->ops->name, N, m->opts.max_docs);
    if (b->cu) {
        if (b->cu[0] != 0 || b->cu[N] != T)
            return arl_errorf(ARL_ERR_ARG,
                              "%s (%s device): cu must start at 0 and end at "
                              "T = %lld",
                              what, m->ops->name, (long long)T);
        for (int32_t i = 0; i < N; i++)
            if (b->cu[i + 1] <= b->cu[i])
                return arl_errorf(ARL_ERR_ARG,
                                  "%s (%s device): document %d is empty or "
                                  "cu decreases",
                                  what, m->ops->name, i);
    }
    if (b->media) { /* as arl_vision_place: one row per <|media_pad|> placeholder */
        const int64_t media_id = m->cfg->media_placeholder_token_id;
        int64_t ph = 0;
        for (int64_t t = 0; t < T; t++)
            ph += b->tokens[t] == media_id;
        if (ph != b->n_media)
            return arl_errorf(ARL_ERR_ARG,
                              "%s (%s device): the batch has %lld <|media_pad|> placeholders but "
                              "%lld image token rows",
                              what, m->ops->name, (long long)ph, (long long)b->n_media);
    }
    for (int64_t t = 0; t < T; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= dm->V)
            return arl_errorf(ARL_ERR_RANGE,
                              "%s (%s device): token %d at position %lld is "
                              "outside the vocabulary [0, %lld)",
                              what, m->ops->name, b->tokens[t], (long long)t, (long long)dm->V);
        if (b->targets && b->targets[t] >= dm->V)
            return arl_errorf(ARL_ERR_RANGE,
                              "%s (%s device): target %d at position %lld is "
                              "outside the vocabulary [0, %lld)",
                              what, m->ops->name, b->targets[t], (long long)t, (long long)dm->V);
    }
    if (b->forced_routes)
        for (int64_t j = 0; j < dm->n_moe; j++)
            for (int64_t t = 0; t < T; t++) {
                const int32_t *r = b->forced_routes + (j * T + t) * dm->k;
                for (int64_t a = 0; a < dm->k; a++) {
                    if (r[a] < 0 || r[a] >= dm->E)
                        return arl_errorf(ARL_ERR_RANGE,
                                          "%s (%s device): forced route %d "
                                          "of token %lld (MoE layer %lld) is outside [0, %lld)",
                                          what, m->ops->name, r[a], (long long)t, (long long)j,
                                          (long long)dm->E);
                    for (int64_t c = 0; c < a; c++)
                        if (r[c] == r[a])
                            return arl_errorf(ARL_ERR_RANGE,
                                              "%s (%s device): forced routes "
                                              "of token %lld (MoE layer %lld) repeat expert %d",
                                              what, m->ops->name, (long long)t, (long long)j, r[a]);
                }
            }
    return ARL_OK;
}

/* ======================= sublayers ======================================================= */

/* ---- weight GEMMs: fp32 weights through the table, or their bf16 copies (bf16_weights) ---- */

static const uint16_t *bf16_of(const arl_model_dev *m, const float *W) {
    ARL_ASSERT(W >= m->weights && W < m->weights + m->weight_floats);
    return m->wb16 + (W - m->weights);
}

const uint16_t *const *arl_model_dev_expert_banks(const arl_model_dev *m, const arl_moe_params *p,
                                                  const uint16_t *out[3]) {
    if (!m->wb16) return NULL;
    out[0] = bf16_of(m, p->w1);
    out[1] = bf16_of(m, p->w3);
    out[2] = bf16_of(m, p->w2);
    return out;
}

/* arl_model_dev_lin's rule: the copies in the inference forwards whenever the model keeps them,
 * in the training forward under the bf16 math mode alone */
static int use_copies(const arl_model_dev *m, int train) {
    return m->wb16 && (!train || (m->ops->math_bf16 && m->ops->math_bf16()));
}

const uint16_t *arl_model_dev_round(const arl_model_dev *m, int train, const float *x, int64_t T) {
    if (!use_copies(m, train)) return NULL;
    ARL_ASSERT(T <= m->opts.max_tokens);
    m->ops->f32_to_bf16(m->xin16, x, T * m->dm.d);
    return m->xin16;
}

/* the bf16 input of a GEMM on the copies: xr, or x rounded into xb16 */
static const uint16_t *gemm_input(const arl_model_dev *m, const float *x, const uint16_t *xr,
                                  int64_t T, int64_t in) {
    if (xr) return xr;
    ARL_ASSERT(T <= m->opts.max_tokens && in <= m->xb16_in);
    m->ops->f32_to_bf16(m->xb16, x, T * in);
    return m->xb16;
}

void arl_model_dev_lin(const arl_model_dev *m, int train, float *y, const float *x,
                       const uint16_t *xr, const float *W, int64_t T, int64_t in, int64_t out) {
    if (use_copies(m, train))
        m->ops->linear_bf16(y, out, 0.0f, gemm_input(m, x, xr, T, in), bf16_of(m, W), T, in, out);
    else
        m->kb->linear_fwd(y, x, W, T, in, out);
}

void arl_model_dev_gemm_w(const arl_model_dev *m, int train, float *y, int64_t ldy, float beta,
                          const float *x, const uint16_t *xr, const float *W, int64_t T, int64_t in,
                          int64_t out) {
    if (use_copies(m, train))
        m->ops->linear_bf16(y, ldy, beta, gemm_input(m, x, xr, T, in), bf16_of(m, W), T, in, out);
    else
        m->kb->gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, out, in, 1.0f, x, in, W, in, beta, y, ldy);
}

/* the inference forwards' (policy/moe.c glu_fwd's gemm for gemm_w); xr: arl_model_dev_lin */
static void lin(const arl_model_dev *m, float *y, const float *x, const uint16_t *xr,
                const float *W, int64_t T, int64_t in, int64_t out) {
    arl_model_dev_lin(m, 0, y, x, xr, W, T, in, out);
}
static void gemm_w(const arl_model_dev *m, float *y, int64_t ldy, float beta, const float *x,
                   const uint16_t *xr, const float *W, int64_t T, int64_t in, int64_t out) {
    arl_model_dev_gemm_w(m, 0, y, ldy, beta, x, xr, W, T, in, out);
}

/* The documents of a call: device cu, host cu, and for decode-state documents their slots. */
typedef struct run_docs {
    const int32_t *cu;      /* (N + 1) device */
    const int32_t *cu_host; /* (N + 1) host */
    int32_t N;
    const int32_t *slots; /* (N) host, or NULL: fresh documents */
    int dpos;             /* 1: positions come from m->pos_dev (a graph capture; every
                             document continues its slot at a position > 0) */
} run_docs;

/* policy/kda_layer.c arl_kda_layer_fwd: S (N, H, dk, dv) and tails (N, 3, P, W-1) gathered
 * states (updated in place), or NULL for fresh documents. */
static void kda_fwd(arl_model_dev *m, const arl_kda_params *p, const run_docs *D, int64_t T,
                    int recurrent, float *S, float *tails) {
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_kda_layer_cfg *c = &m->kda;
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk, W = c->W;
    const int64_t tl = P * (W - 1);
    const int32_t N = D->N;
    const int32_t *cu = D->cu;
    const float *x = m->xbuf;
    const uint16_t *xr = arl_model_dev_round(m, 0, x, T); /* x's GEMMs on the copies */
    kda_bufs B;
    kda_layout(&B, m->scratch, m, T, N);

    /* 3.1: projection, causal conv + SiLU over the tails, tails moved forward */
    const float *Wp[3] = {p->q_proj, p->k_proj, p->v_proj};
    const float *Wc[3] = {p->q_conv, p->k_conv, p->v_conv};
    float *outs[3] = {B.q, B.k, B.v};
    for (int j = 0; j < 3; j++) {
        lin(m, B.proj, x, xr, Wp[j], T, d, P);
        const float *tin = NULL;
        if (tails && tl > 0) {
            for (int32_t i = 0; i < N; i++)
                kb->copy(m->kda_tin + i * tl, tails + (i * 3 + j) * tl, tl);
            tin = m->kda_tin;
        }
        ops->kda_conv_fwd(outs[j], NULL, B.proj, Wc[j], tin, cu, N, T, P, W);
        if (tails && tl > 0)
            for (int32_t i = 0; i < N; i++) {
                int64_t a = D->cu_host[i], e = D->cu_host[i + 1];
                ops->kda_conv_tail(tails + (i * 3 + j) * tl, B.proj + a * P, e - a, tin + i * tl, P,
                                   W);
            }
    }
    kb->l2norm_fwd(B.q, NULL, B.q, T * H, dk, 1e-6f);
    kb->l2norm_fwd(B.k, NULL, B.k, T * H, dk, 1e-6f);
    lin(m, B.beta, x, xr, p->b_proj, T, d, H);
    kb->sigmoid_fwd(B.beta, B.beta, T * H);

    /* 3.2 */
    lin(m, B.fa, x, xr, p->f_a, T, d, dk);
    lin(m, B.proj, B.fa, NULL, p->f_b, T, dk, P);
    if (c->lower_bound_gate)
        ops->kda_gate_k3_fwd(B.g, B.proj, p->A_log, p->dt_bias, T, H, dk, c->g_min);
    else
        ops->kda_gate_softplus_fwd(B.g, B.proj, p->A_log, p->dt_bias, T, H, dk);

    /* 3.3 / 3.5 from the documents' states (S = 0 when fresh) */
    float *St = S;
    if (!St) {
        St = B.S0;
        kb->fill(St, 0.0f, (int64_t)N * H * dk * dv);
    }
    const float scale = 1.0f / sqrtf((float)dk);
    if (recurrent)
        ops->kda_recurrent_fwd(B.o, St, NULL, B.q, B.k, B.v, B.g, B.beta, cu, N, T, H, dk, dv,
                               scale, c->chunk);
    else
        ops->kda_chunk_fwd(B.o, St, NULL, B.q, B.k, B.v, B.g, B.beta, cu, N, T, H, dk, dv, scale,
                           c->chunk, B.core);

    /* 3.4 */
    if (p->g_proj) {
        lin(m, B.gam, x, xr, p->g_proj, T, d, H * dv);
    } else {
        lin(m, B.ga, x, xr, p->g_a, T, d, dk);
        lin(m, B.gam, B.ga, NULL, p->g_b, T, dk, H * dv);
    }
    ops->kda_onorm_fwd(B.q, NULL, B.o, B.gam, p->o_norm, T * H, dv, c->eps);
    lin(m, m->ybuf, B.q, NULL, p->o_proj, T, H * dv, d);
}

/* The kept chunk summaries of MLA layer l_mla of a slot (block-sparse MLA). */
static float *slot_means(const arl_model_dev *m, int64_t l_mla, int32_t slot) {
    const int64_t R = m->dm.rkv + m->dm.r;
    return m->st_means + (l_mla * m->n_slots + slot) * m->means_rows * R;
}

/* policy/mla_layer.c arl_mla_layer_fwd_means: dense, the expanded form for fresh documents
 * (and for decode-state documents that all start at position 0), else the absorbed form over
 * the caches; block-sparse (spec 4.5), always the absorbed form with the chunk selection, over
 * the slots' kept summaries (brought up to the new rows first) or, for fresh documents, over
 * summaries of their rows made here.  l_mla: index among MLA layers (slot caches, summaries). */
static void mla_fwd(arl_model_dev *m, const arl_mla_params *p, const run_docs *D, int64_t T,
                    int64_t l_mla) {
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_mla_layer_cfg *c = &m->mla;
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r;
    const int32_t N = D->N;
    const float scale = 1.0f / sqrtf((float)(n + r));
    const float *x = m->xbuf;
    const uint16_t *xr = arl_model_dev_round(m, 0, x, T);
    mla_bufs B;
    mla_layout(&B, m->scratch, m, T);

    if (p->q_a) {
        lin(m, B.cq, x, xr, p->q_a, T, d, c->rq);
        kb->rmsnorm_fwd(B.cq, NULL, B.cq, p->q_a_norm, T, c->rq, 1e-6f);
        lin(m, B.qf, B.cq, NULL, p->q_b, T, c->rq, Hm * (n + r));
    } else {
        lin(m, B.qf, x, xr, p->q_proj, T, d, Hm * (n + r));
    }
    ops->copy_rows(B.q_nope, n, B.qf, n + r, T * Hm, n);
    ops->copy_rows(B.q_pe, r, B.qf + n, n + r, T * Hm, r);

    lin(m, B.ckv, x, xr, p->kv_a, T, d, R);
    ops->copy_rows(B.c, rkv, B.ckv, R, T, rkv);
    ops->copy_rows(B.k_pe, r, B.ckv + rkv, R, T, r);
    kb->rmsnorm_fwd(B.c, NULL, B.c, p->kv_a_norm, T, rkv, 1e-6f);

    const int sparse = c->sparse_topk > 0;
    const int64_t n_c = c->sparse_chunk;
    int fresh = 1;
    if (D->slots || sparse) { /* the new latent rows [c; k_pe] */
        ops->copy_rows(m->lat, R, B.c, rkv, T, rkv);
        ops->copy_rows(m->lat + rkv, R, B.k_pe, r, T, r);
    }
    if (D->slots) {
        /* appended to every document's cache */
        for (int32_t i = 0; i < N; i++) {
            int64_t a = D->cu_host[i], len = D->cu_host[i + 1] - a, pos = m->st_pos[D->slots[i]];
            float *cache = arl_model_dev_slot_rows(m, m->st_lat, l_mla, D->slots[i]);
            if (D->dpos)
                ops->cache_append_dpos(cache, m->pos_dev + i, m->lat + a * R, len, R);
            else
                kb->copy(cache + pos * R, m->lat + a * R, len * R);
            m->caches[i] = cache;
            fresh &= pos == 0;
        }
        if (D->dpos) fresh = 0;
        if (sparse && D->dpos) { /* a captured step: the row at each slot's device position */
            for (int32_t i = 0; i < N; i++)
                ops->mla_chunk_means_update_dpos(slot_means(m, l_mla, D->slots[i]), m->caches[i],
                                                 m->pos_dev + i, R, n_c);
        } else if (sparse) { /* the kept summaries brought up to the new rows (from = pos) */
            for (int32_t i = 0; i < N; i++) {
                int64_t len = D->cu_host[i + 1] - D->cu_host[i], pos = m->st_pos[D->slots[i]];
                ops->mla_chunk_means_update(slot_means(m, l_mla, D->slots[i]), m->caches[i], pos,
                                            pos + len, R, n_c);
            }
        }
    } else if (sparse) { /* fresh documents: the summaries of their rows, once per call */
        int64_t off = 0;
        for (int32_t i = 0; i < N; i++) {
            int64_t a = D->cu_host[i], len = D->cu_host[i + 1] - a;
            ops->mla_chunk_means_update(m->fmeans + off, m->lat + a * R, 0, len, R, n_c);
            off += (len / n_c + 1) * R;
        }
    }

    if (fresh && !sparse) {
        lin(m, B.kv, B.c, NULL, p->kv_b, T, rkv, Hm * (n + vm));
        ops->copy_rows(B.k_nope, n, B.kv, n + vm, T * Hm, n);
        ops->copy_rows(B.v, vm, B.kv + n, n + vm, T * Hm, vm);
        ops->mla_attn_fwd(B.o, NULL, B.q_nope, B.q_pe, B.k_nope, B.k_pe, B.v, D->cu, N, T, Hm, n, r,
                          vm, scale, B.attn);
    } else {
        /* 4.2: q_hat = W_UK^T q_nope per head (policy/mla.c arl_mla_absorb_q) */
        for (int64_t h = 0; h < Hm; h++)
            kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, rkv, n, 1.0f, B.q_nope + h * n, Hm * n,
                     p->kv_b + h * (n + vm) * rkv, rkv, 0.0f, m->qhat + h * rkv, Hm * rkv);
        int64_t off = 0; /* fresh block-sparse documents: offset of their summaries */
        for (int32_t i = 0; i < N; i++) {
            int64_t a = D->cu_host[i], len = D->cu_host[i + 1] - a;
            int64_t pos = D->slots ? m->st_pos[D->slots[i]] : 0;
            if (sparse) {
                const float *cache = D->slots ? m->caches[i] : m->lat + a * R;
                const float *mn = D->slots ? slot_means(m, l_mla, D->slots[i]) : m->fmeans + off;
                off += (len / n_c + 1) * R;
                if (D->dpos) { /* one token per document (a captured decode step) */
                    ARL_ASSERT(len == 1);
                    ops->mla_sparse_attn_dpos(m->ohat + a * Hm * rkv, m->qhat + a * Hm * rkv,
                                              B.q_pe + a * Hm * r, cache, mn, m->pos_dev + i, Hm,
                                              rkv, r, scale, n_c, c->sparse_topk, c->max_rows,
                                              m->sparse_ws);
                    continue;
                }
                for (int64_t q0 = 0; q0 < len; q0 += MLA_QBLOCK) {
                    int64_t nq = len - q0 < MLA_QBLOCK ? len - q0 : MLA_QBLOCK, t = a + q0;
                    ops->mla_sparse_attn(m->ohat + t * Hm * rkv, m->qhat + t * Hm * rkv,
                                         B.q_pe + t * Hm * r, cache, mn, pos + q0, nq, Hm, rkv, r,
                                         scale, n_c, c->sparse_topk, m->sparse_ws);
                }
                continue;
            }
            if (D->dpos) { /* one token per document (decode step) */
                ARL_ASSERT(len == 1);
                ops->mla_absorbed_attn_dpos(m->ohat + a * Hm * rkv, m->qhat + a * Hm * rkv,
                                            B.q_pe + a * Hm * r, m->caches[i], m->pos_dev + i, 1,
                                            Hm, rkv, r, scale, m->max_context, m->mla_ws);
                continue;
            }
            for (int64_t q0 = 0; q0 < len; q0 += MLA_QBLOCK) {
                int64_t nq = len - q0 < MLA_QBLOCK ? len - q0 : MLA_QBLOCK, t = a + q0;
                ops->mla_absorbed_attn(m->ohat + t * Hm * rkv, m->qhat + t * Hm * rkv,
                                       B.q_pe + t * Hm * r, m->caches[i], pos + q0, nq, Hm, rkv, r,
                                       scale, m->mla_ws);
            }
        }
        /* o = W_UV o_hat per head (policy/mla.c arl_mla_expand_o) */
        for (int64_t h = 0; h < Hm; h++)
            kb->gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, vm, rkv, 1.0f, m->ohat + h * rkv, Hm * rkv,
                     p->kv_b + (h * (n + vm) + n) * rkv, rkv, 0.0f, B.o + h * vm, Hm * vm);
    }

    const float *u = B.o;
    if (p->g_proj) {
        lin(m, B.gate, x, xr, p->g_proj, T, d, Hm * vm);
        kb->sigmoid_fwd(B.gate, B.gate, T * Hm * vm);
        kb->mul(B.gate, B.gate, B.o, T * Hm * vm);
        u = B.gate;
    }
    lin(m, m->ybuf, u, NULL, p->o_proj, T, Hm * vm, d);
}

/* policy/moe.c glu_fwd: y (T, out) = W_d act(W_g x, W_u x), beta 0 overwrites, 1 adds (xr:
 * arl_model_dev_lin). */
static void glu_fwd(arl_model_dev *m, float *y, float beta, const float *x, const uint16_t *xr,
                    const float *Wg, const float *Wu, const float *Wd, int64_t T, int64_t in,
                    int64_t fw, int64_t out, float *gu, float *h) {
    const arl_k_backend *kb = m->kb;
    gemm_w(m, gu, 2 * fw, 0.0f, x, xr, Wg, T, in, fw);
    gemm_w(m, gu + fw, 2 * fw, 0.0f, x, xr, Wu, T, in, fw);
    if (m->act.situ)
        kb->situ_glu_fwd(h, gu, gu + fw, T, fw, 2 * fw, m->act.beta1, m->act.beta2);
    else
        kb->swiglu_fwd(h, gu, gu + fw, T, fw, 2 * fw);
    gemm_w(m, y, out, beta, h, NULL, Wd, T, fw, out);
}

/* policy/moe.c arl_moe_fwd / arl_dense_ffn_fwd on xbuf -> ybuf. */
/* scores_host: NULL, or (T, E) HOST rows that receive the layer's sigmoid router scores
 * (spec 7.1; Quantile Balancing and router agreement read them): one download per MoE layer,
 * which waits for the queued work (a forward that asks for scores is not a graph capture). */
static arl_status ffn_fwd(arl_model_dev *m, const arl_layer_params *lp, int64_t l, int32_t *routes,
                          const int32_t *forced, int64_t T, float *scores_host) {
    const arl_k_backend *kb = m->kb;
    const arl_moe_cfg *c = &m->moe;
    const float *x = m->xbuf;
    const uint16_t *xr = arl_model_dev_round(m, 0, x, T);
    ffn_bufs B;
    ffn_layout(&B, m->scratch, m, T);
    if (!lp->is_moe) {
        glu_fwd(m, m->ybuf, 0.0f, x, xr, lp->dense.gate_proj, lp->dense.up_proj,
                lp->dense.down_proj, T, c->d, m->dm.fd, c->d, B.gu, B.h);
        return ARL_OK;
    }
    (void)l;
    const arl_moe_params *p = &lp->moe;
    m->ops->router_fwd(routes, B.pw, B.s, x, p->gate, p->gate_bias, forced, T, c->d, c->E, c->k,
                       c->rho, B.router);
    if (scores_host)
        ARL_TRY(m->ops->download(scores_host, B.s, sizeof(float) * (size_t)(T * c->E)));
    lin(m, B.z, x, xr, p->down_proj, T, c->d, c->dz);
    const uint16_t *banks[3];
    m->ops->moe_experts_fwd(B.u, B.z, routes, B.pw, p, c, T,
                            arl_model_dev_expert_banks(m, p, banks), B.experts);
    if (p->latent_norm) kb->rmsnorm_fwd(B.u, NULL, B.u, p->latent_norm, T, c->dz, c->eps);
    lin(m, m->ybuf, B.u, NULL, p->up_proj, T, c->dz, c->d);
    if (c->fs > 0 && p->shared_gate_proj)
        glu_fwd(m, m->ybuf, 1.0f, x, xr, p->shared_gate_proj, p->shared_up_proj,
                p->shared_down_proj, T, c->d, c->fs, c->d, B.gu, B.h);
    return ARL_OK;
}

/* ======================= the forward (policy/model.c model_run) ========================== */

/* Image rows in and their gradient out (model_device.h). */
arl_status arl_model_dev_media_rows(arl_model_dev *m, float *p, const arl_batch *b, float *dmedia,
                                    float *stage) {
    const int64_t media_id = m->cfg->media_placeholder_token_id, T = b->T, d = m->dm.d;
    int64_t mi = 0;
    for (int64_t t = 0; t < T;) {
        if (b->tokens[t] != media_id) {
            t++;
            continue;
        }
        int64_t e = t;
        while (e < T && b->tokens[e] == media_id)
            e++;
        const size_t bytes = sizeof(float) * (size_t)((e - t) * d);
        if (!stage) {
            ARL_TRY(m->ops->upload(p + t * d, b->media + mi * d, bytes));
        } else {
            if (dmedia) { /* += as the reference (policy/model_backward.c) */
                ARL_TRY(m->ops->download(stage, p + t * d, bytes));
                float *dst = dmedia + mi * d;
                for (int64_t i = 0; i < (e - t) * d; i++)
                    dst[i] += stage[i];
            }
            m->kb->fill(p + t * d, 0.0f, (e - t) * d);
        }
        mi += e - t;
        t = e;
    }
    return ARL_OK;
}

/* slots: NULL for fresh documents, else (N) host slot of each document (checked). */
static arl_status dev_run(arl_model_dev *m, const arl_batch *b, const int32_t *slots,
                          const arl_forward_out *out, int graph_ok) {
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    m->last_T = 0; /* until this forward completes, xbuf holds no rows */
    if (out && out->acts)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "model (%s device): saved activations are not returned by this path "
                          "(the training step keeps its own: policy/model_device_backward.h)",
                          ops->name);
    if (graph_ok && out && (out->router_scores || out->expert_load))
        return arl_errorf(ARL_ERR_ARG,
                          "model (%s device): a decode step replayed as a graph returns no "
                          "router scores or expert loads",
                          ops->name);
    ARL_TRY(arl_model_dev_batch_check(m, b, "model"));
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = &m->w;
    const int64_t T = b->T, d = dm->d, Td = T * d, L = dm->L, B = dm->B, V = dm->V, k = dm->k;
    const int32_t N = b->cu ? b->N : 1;
    int32_t cu_one[2] = {0, (int32_t)T};
    const int32_t *cu_host = b->cu ? b->cu : cu_one;
    const int recurrent = T == N; /* one token per document: the recurrent KDA core */
    const int want_lp = out && (out->logprobs || out->entropy);
    const int64_t R = dm->rkv + dm->r, sn = dm->H * dm->dk * dm->dv;
    const int64_t tn = 3 * dm->P * (dm->W - 1);

    if (slots) {
        for (int32_t i = 0; i < N; i++) {
            if (slots[i] < 0 || slots[i] >= m->n_slots)
                return arl_errorf(ARL_ERR_STATE,
                                  "model (%s device): document %d names slot %d, "
                                  "the model has %d",
                                  ops->name, i, slots[i], m->n_slots);
            for (int32_t j = 0; j < i; j++)
                if (slots[j] == slots[i])
                    return arl_errorf(ARL_ERR_STATE,
                                      "model (%s device): slot %d appears twice "
                                      "in one forward",
                                      ops->name, slots[i]);
            int64_t end = m->st_pos[slots[i]] + cu_host[i + 1] - cu_host[i];
            if (dm->n_mla > 0 && end > m->max_context)
                return arl_errorf(ARL_ERR_RANGE,
                                  "model (%s device): the sequence of slot %d "
                                  "would reach %lld positions, the model was set up for %lld "
                                  "(max_context)",
                                  ops->name, slots[i], (long long)end, (long long)m->max_context);
        }
        for (int32_t i = 0; i < N; i++) /* their latent rows (shared slot rows: made, grown) */
            ARL_TRY(arl_model_dev_slot_fit(m, slots[i],
                                           m->st_pos[slots[i]] + cu_host[i + 1] - cu_host[i]));
    }

    ARL_TRY(ops->upload(m->tokens, b->tokens, sizeof(int32_t) * (size_t)T));
    ARL_TRY(ops->upload(m->cu, cu_host, sizeof(int32_t) * (size_t)(N + 1)));
    if (want_lp)
        ARL_TRY(ops->upload(m->targets, b->targets ? b->targets : m->no_targets,
                            sizeof(int32_t) * (size_t)T));
    if (b->forced_routes && dm->n_moe > 0)
        ARL_TRY(ops->upload(m->forced, b->forced_routes,
                            sizeof(int32_t) * (size_t)(dm->n_moe * T * k)));
    run_docs D = {.cu = m->cu, .cu_host = cu_host, .N = N, .slots = slots, .dpos = 0};
    int use_graph = 0;
    if (graph_ok) { /* a decode step: replay (or capture) the whole step */
        for (int32_t i = 0; i < N; i++)
            m->pos_host[i] = m->st_pos[slots[i]];
        ARL_TRY(ops->upload(m->pos_dev, m->pos_host, sizeof(int64_t) * (size_t)N));
        use_graph = 1;
        D.dpos = 1;
        int same = m->graph && m->graph_n == N;
        for (int32_t i = 0; same && i < N; i++)
            same = m->graph_slots[i] == slots[i];
        if (same) {
            ARL_TRY(ops->graph_launch(m->graph));
            m->graph_replays++;
            goto finish;
        }
        ops->graph_free(m->graph);
        m->graph = NULL;
        ARL_TRY(ops->graph_begin());
    }

    /* 2.1 embedding; image token rows replace the placeholders (10.1), one upload per run of
     * consecutive placeholders (an image's rows are contiguous in the sequence) */
    float *p = m->res;
    ops->embed(p, w->embed_tokens, m->tokens, T, d, V);
    if (b->media) ARL_TRY(arl_model_dev_media_rows(m, p, b, NULL, NULL));

    const float *src[ARL_ATTNRES_MAX_SOURCES];
    int32_t nb = 0;
    int64_t l_kda = 0, l_mla = 0;
    for (int64_t l = 0; l < L; l++) {
        const arl_layer_params *lp = &w->layers[l];
        const float *h = p;
        if (B > 0) {
            if (nb > 0) {
                for (int32_t j = 0; j <= nb; j++)
                    src[j] = m->res + j * Td;
                ops->attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, lp->attn_res_norm,
                                     lp->attn_res_proj, m->eps);
                h = m->hbuf;
            }
            if (l % B == 0) {
                nb++;
                p = m->res + nb * Td;
                kb->fill(p, 0.0f, Td);
            }
        }
        kb->rmsnorm_fwd(m->xbuf, NULL, h, lp->input_norm, T, d, m->eps);
        if (lp->kind == ARL_LAYER_KDA) {
            float *S = NULL, *tails = NULL;
            float *st = slots ? m->st_kda + l_kda * m->n_slots * (sn + tn) : NULL;
            if (slots) { /* gather the documents' states; scattered back below */
                S = m->kda_S;
                tails = m->kda_tails;
                for (int32_t i = 0; i < N; i++) {
                    kb->copy(S + i * sn, st + slots[i] * (sn + tn), sn);
                    kb->copy(tails + i * tn, st + slots[i] * (sn + tn) + sn, tn);
                }
            }
            kda_fwd(m, &lp->kda, &D, T, recurrent, S, tails);
            if (slots)
                for (int32_t i = 0; i < N; i++) {
                    kb->copy(st + slots[i] * (sn + tn), S + i * sn, sn);
                    kb->copy(st + slots[i] * (sn + tn) + sn, tails + i * tn, tn);
                }
            l_kda++;
        } else {
            mla_fwd(m, &lp->mla, &D, T, l_mla++);
        }
        kb->add(p, p, m->ybuf, Td);

        const float *mx = p;
        if (B > 0) {
            for (int32_t j = 0; j <= nb; j++)
                src[j] = m->res + j * Td;
            ops->attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, lp->mlp_res_norm,
                                 lp->mlp_res_proj, m->eps);
            mx = m->hbuf;
        }
        kb->rmsnorm_fwd(m->xbuf, NULL, mx, lp->post_norm, T, d, m->eps);
        int64_t mi = m->moe_index[l];
        ARL_TRY(ffn_fwd(m, lp, l, mi >= 0 ? m->routes + mi * T * k : NULL,
                        b->forced_routes && mi >= 0 ? m->forced + mi * T * k : NULL, T,
                        out && out->router_scores && mi >= 0
                            ? out->router_scores + mi * T * dm->E
                            : NULL));
        kb->add(p, p, m->ybuf, Td);
    }
    (void)R;

    const float *fin = p;
    if (B > 0) {
        for (int32_t j = 0; j <= nb; j++)
            src[j] = m->res + j * Td;
        ops->attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, w->out_res_norm, w->out_res_proj,
                             m->eps);
        fin = m->hbuf;
    }
    kb->rmsnorm_fwd(m->xbuf, NULL, fin, w->norm, T, d, m->eps);
    if (use_graph || (out && (out->logits || want_lp))) {
        lin(m, m->logits, m->xbuf, NULL, w->lm_head, T, d, V);
        if (want_lp) kb->logprob_fwd(m->logprobs, NULL, m->entropy, m->logits, m->targets, T, V);
    }
    if (use_graph) { /* captured, not run: instantiate, remember for these slots, run */
        void *g = NULL;
        ARL_TRY(ops->graph_end(&g));
        m->graph = g;
        m->graph_n = N;
        memcpy(m->graph_slots, slots, sizeof(int32_t) * (size_t)N);
        ARL_TRY(ops->graph_launch(m->graph));
    }
finish:
    ARL_TRY(ops->sync());
    if (slots)
        for (int32_t i = 0; i < N; i++)
            m->st_pos[slots[i]] += cu_host[i + 1] - cu_host[i];
    m->last_T = T; /* xbuf holds this forward's final-norm rows */
    if (!out) return ARL_OK;
    if (out->logits)
        ARL_TRY(ops->download(out->logits, m->logits, sizeof(float) * (size_t)(T * V)));
    if (out->logprobs)
        ARL_TRY(ops->download(out->logprobs, m->logprobs, sizeof(float) * (size_t)T));
    if (out->entropy) ARL_TRY(ops->download(out->entropy, m->entropy, sizeof(float) * (size_t)T));
    if (out->routes && dm->n_moe > 0)
        ARL_TRY(
            ops->download(out->routes, m->routes, sizeof(int32_t) * (size_t)(dm->n_moe * T * k)));
    if (out->expert_load) /* (n_moe, E): (token, slot) pairs routed to each expert */
        for (int64_t j = 0; j < dm->n_moe; j++) {
            const int32_t *r = out->routes ? out->routes + j * T * k : m->routes_host;
            if (!out->routes)
                ARL_TRY(ops->download(m->routes_host, m->routes + j * T * k,
                                      sizeof(int32_t) * (size_t)(T * k)));
            int64_t *ld = out->expert_load + j * dm->E;
            memset(ld, 0, sizeof(int64_t) * (size_t)dm->E);
            for (int64_t i = 0; i < T * k; i++)
                ld[r[i]]++;
        }
    return ARL_OK;
}

arl_status arl_model_dev_forward(arl_model_dev *m, const arl_batch *b, const arl_forward_out *out) {
    return dev_run(m, b, NULL, out, 0);
}

arl_status arl_model_dev_forward_state(arl_model_dev *m, const int32_t *slots, const arl_batch *b,
                                       const arl_forward_out *out) {
    ARL_ASSERT(slots);
    return dev_run(m, b, slots, out, 0);
}

/* ======================= decode-state slots ============================================== */

arl_status arl_model_dev_slot_reset(arl_model_dev *m, int32_t slot) {
    if (slot < 0 || slot >= m->n_slots)
        return arl_errorf(ARL_ERR_RANGE, "model (%s device): slot %d outside [0, %d)", m->ops->name,
                          slot, m->n_slots);
    const arl_model_dims *dm = &m->dm;
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    for (int64_t j = 0; j < dm->n_kda; j++)
        m->kb->fill(m->st_kda + (j * m->n_slots + slot) * (sn + tn), 0.0f, sn + tn);
    for (int64_t j = 0; m->st_means && j < dm->n_mla; j++) /* no summaries (none are read) */
        m->kb->fill(slot_means(m, j, slot), 0.0f, m->means_rows * (dm->rkv + dm->r));
    m->st_pos[slot] = 0;
    if (m->dopts.slot_rows > 0) m->slot_cap[slot] = 0; /* shared rows: the range is free */
    return ARL_OK;
}

int64_t arl_model_dev_slot_pos(const arl_model_dev *m, int32_t slot) {
    ARL_ASSERT(slot >= 0 && slot < m->n_slots);
    return m->st_pos[slot];
}

arl_status arl_model_dev_prefill(arl_model_dev *m, int32_t slot, const int32_t *tokens, int64_t n,
                                 const float *media, int64_t n_media, float *logits,
                                 float *last_logits) {
    if (n < 1)
        return arl_errorf(ARL_ERR_ARG, "model (%s device): prefill of an empty sequence",
                          m->ops->name);
    const int64_t V = m->dm.V, d = m->dm.d, media_id = m->cfg->media_placeholder_token_id;
    if (media) { /* before anything runs: the slot is untouched on a mismatch */
        int64_t ph = 0;
        for (int64_t t = 0; t < n; t++)
            ph += tokens[t] == media_id;
        if (ph != n_media)
            return arl_errorf(ARL_ERR_ARG,
                              "model (%s device): prefill has %lld <|media_pad|> placeholders "
                              "but %lld image token rows were given",
                              m->ops->name, (long long)ph, (long long)n_media);
    }
    int64_t used_media = 0;
    for (int64_t t0 = 0; t0 < n; t0 += m->opts.max_tokens) {
        int64_t c = n - t0 < m->opts.max_tokens ? n - t0 : m->opts.max_tokens;
        int64_t ph = 0;
        for (int64_t t = t0; media && t < t0 + c; t++)
            ph += tokens[t] == media_id;
        arl_batch b = {.tokens = tokens + t0,
                       .T = c,
                       .cu = NULL,
                       .N = 1,
                       .media = media ? media + used_media * d : NULL,
                       .n_media = ph};
        arl_forward_out o = {.logits = logits ? logits + t0 * V : NULL};
        ARL_TRY(dev_run(m, &b, &slot, &o, 0));
        used_media += ph;
        if (!logits && last_logits && t0 + c == n) { /* xbuf holds the final-norm rows */
            lin(m, m->logits, m->xbuf + (c - 1) * d, NULL, m->w.lm_head, 1, d, V);
            ARL_TRY(m->ops->sync());
            ARL_TRY(m->ops->download(last_logits, m->logits, sizeof(float) * (size_t)V));
        }
    }
    if (logits && last_logits) memcpy(last_logits, logits + (n - 1) * V, sizeof(float) * V);
    return ARL_OK;
}

arl_status arl_model_dev_decode_step(arl_model_dev *m, const int32_t *slots, int32_t n,
                                     const int32_t *tokens, float *logits, int32_t *routes) {
    if (n < 1 || n > m->opts.max_docs)
        return arl_errorf(ARL_ERR_RANGE,
                          "model (%s device): decode step over %d sequences, the "
                          "model takes 1..%d (max_docs)",
                          m->ops->name, n, m->opts.max_docs);
    int32_t *cu = m->cu_host1;
    for (int32_t i = 0; i <= n; i++)
        cu[i] = i;
    arl_batch b = {.tokens = tokens, .T = n, .cu = cu, .N = n};
    arl_forward_out o = {.logits = logits, .routes = routes};
    /* a graph replays only when every slot continues (position > 0): the fresh form of MLA
     * would be another sequence of ops; block-sparse steps are captured when the device has
     * the position-independent forms of the summaries' update and the selection */
    int graph_ok =
        m->dopts.decode_graphs &&
        (!m->st_means || (m->ops->mla_chunk_means_update_dpos && m->ops->mla_sparse_attn_dpos));
    for (int32_t i = 0; i < n && graph_ok; i++)
        graph_ok = slots[i] >= 0 && slots[i] < m->n_slots && m->st_pos[slots[i]] > 0;
    return dev_run(m, &b, slots, &o, graph_ok);
}

/* ======================= rows of the last forward, slot states <-> policy/state.h ========= */

arl_status arl_model_dev_rows_logits(arl_model_dev *m, int32_t n, const int64_t *rows,
                                     float *logits) {
    const int64_t V = m->dm.V, d = m->dm.d, T_last = m->last_T;
    if (n < 1 || n > m->opts.max_tokens)
        return arl_errorf(ARL_ERR_RANGE, "model (%s device): %d logit rows, at most %lld",
                          m->ops->name, n, (long long)m->opts.max_tokens);
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= T_last)
            return arl_errorf(ARL_ERR_RANGE,
                              "model (%s device): logit row %lld outside the last forward's "
                              "%lld rows",
                              m->ops->name, (long long)rows[i], (long long)T_last);
    /* xbuf (T_last, d) holds the final-norm rows; one product per row, as the reference's
     * rollout engine computes them (bit-identical on "cpu"; n is a handful of documents) */
    for (int32_t i = 0; i < n; i++)
        lin(m, m->logits + (int64_t)i * V, m->xbuf + rows[i] * d, NULL, m->w.lm_head, 1, d, V);
    ARL_TRY(m->ops->sync());
    return m->ops->download(logits, m->logits, sizeof(float) * (size_t)((int64_t)n * V));
}

/* The checks of both directions: slot and host slot in range, the host slot active, and the
 * host state of this model's shapes. */
static arl_status slot_xfer_check(const arl_model_dev *m, int32_t slot, const arl_decode_state *st,
                                  int32_t hslot, const char *what) {
    const arl_model_dims *a = &m->dm, *b = &st->dm;
    if (slot < 0 || slot >= m->n_slots)
        return arl_errorf(ARL_ERR_RANGE, "%s (%s device): slot %d outside [0, %d)", what,
                          m->ops->name, slot, m->n_slots);
    if (hslot < 0 || hslot >= st->n_slots || !st->slots[hslot].active)
        return arl_errorf(ARL_ERR_STATE, "%s (%s device): host slot %d is not an active slot",
                          what, m->ops->name, hslot);
    if (a->n_kda != b->n_kda || a->n_mla != b->n_mla || a->H != b->H || a->dk != b->dk ||
        a->dv != b->dv || a->P != b->P || a->W != b->W || a->rkv != b->rkv || a->r != b->r)
        return arl_errorf(ARL_ERR_SHAPE,
                          "%s (%s device): the host decode state was made for another model "
                          "config",
                          what, m->ops->name);
    return ARL_OK;
}

arl_status arl_model_dev_slot_download(arl_model_dev *m, int32_t slot, arl_decode_state *st,
                                       int32_t hslot, int64_t row0) {
    ARL_TRY(slot_xfer_check(m, slot, st, hslot, "slot download"));
    const arl_model_dims *dm = &m->dm;
    const int64_t pos = m->st_pos[slot], R = dm->rkv + dm->r;
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    if (row0 < 0 || row0 > pos)
        return arl_errorf(ARL_ERR_RANGE,
                          "slot download (%s device): first row %lld outside [0, %lld] (the "
                          "slot's position)",
                          m->ops->name, (long long)row0, (long long)pos);
    if (dm->n_mla > 0 && pos > 0) ARL_TRY(arl_decode_state_reserve(st, hslot, pos));
    arl_decode_slot *h = &st->slots[hslot];
    ARL_TRY(m->ops->sync());
    for (int64_t j = 0; j < dm->n_kda; j++) {
        const float *src = m->st_kda + (j * m->n_slots + slot) * (sn + tn);
        ARL_TRY(m->ops->download(h->kda_S + j * sn, src, sizeof(float) * (size_t)sn));
        ARL_TRY(m->ops->download(h->kda_conv + j * tn, src + sn, sizeof(float) * (size_t)tn));
    }
    for (int64_t j = 0; j < dm->n_mla && pos > row0; j++)
        ARL_TRY(m->ops->download(h->latent[j] + row0 * R,
                                 arl_model_dev_slot_rows(m, m->st_lat, j, slot) + row0 * R,
                                 sizeof(float) * (size_t)((pos - row0) * R)));
    h->pos = pos;
    if (h->means_rows) /* chunk summaries (block-sparse MLA) no longer cover these rows */
        for (int64_t j = 0; j < dm->n_mla; j++)
            h->means_rows[j] = 0;
    return ARL_OK;
}

arl_status arl_model_dev_slot_upload(arl_model_dev *m, int32_t slot, const arl_decode_state *st,
                                     int32_t hslot) {
    ARL_TRY(slot_xfer_check(m, slot, st, hslot, "slot upload"));
    const arl_model_dims *dm = &m->dm;
    const arl_decode_slot *h = &st->slots[hslot];
    const int64_t pos = h->pos, R = dm->rkv + dm->r;
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    if (dm->n_mla > 0 && pos > m->max_context)
        return arl_errorf(ARL_ERR_RANGE,
                          "slot upload (%s device): the host slot holds %lld positions, the "
                          "model was set up for %lld (max_context)",
                          m->ops->name, (long long)pos, (long long)m->max_context);
    ARL_TRY(arl_model_dev_slot_fit(m, slot, pos));
    for (int64_t j = 0; j < dm->n_kda; j++) {
        float *dst = m->st_kda + (j * m->n_slots + slot) * (sn + tn);
        ARL_TRY(m->ops->upload(dst, h->kda_S + j * sn, sizeof(float) * (size_t)sn));
        ARL_TRY(m->ops->upload(dst + sn, h->kda_conv + j * tn, sizeof(float) * (size_t)tn));
    }
    for (int64_t j = 0; j < dm->n_mla && pos > 0; j++) {
        float *cache = arl_model_dev_slot_rows(m, m->st_lat, j, slot);
        ARL_TRY(m->ops->upload(cache, h->latent[j], sizeof(float) * (size_t)(pos * R)));
        if (m->st_means) /* block-sparse: the summaries of the uploaded rows (spec 4.5) */
            m->ops->mla_chunk_means_update(slot_means(m, j, slot), cache, 0, pos, R,
                                           m->mla.sparse_chunk);
    }
    m->st_pos[slot] = pos;
    return ARL_OK;
}
