/* policy/model_device_backward.c: the training step over the device tables (see
 * policy/model_device_backward.h).
 *
 * Reading order: the arena layout (per-layer saves, work buffers), init, the sublayer
 * forwards with saves (policy/kda_layer_backward.c, policy/mla_layer_backward.c,
 * policy/moe_backward.c, step for step), the training forward (policy/model_backward.c
 * arl_model_train_forward, fresh or from the model's decode slots), the sublayer backwards
 * (with the state gradients of policy/model_backward.c mixer_bwd), the backward
 * (arl_model_backward's bookkeeping of spec/policy.md 5.4 line by line), the state-gradient
 * slots, the loss, AdamW (policy/optimizer.c).
 * Keep each function in step with the CPU function it names: the cpu-device test compares
 * the two bit for bit.
 */
#include "policy/model_device_backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "policy/attnres.h"
#include "policy/kda_layer_backward.h"
#include "policy/mla_layer_backward.h"
#include "policy/model_device_bump.h"
#include "policy/moe_backward.h"
#include "policy/optimizer_internal.h"

/* Rows of logits computed at a time: about 4 MiB (as policy/model_backward.c). */
#define LOGIT_BLOCK_FLOATS ((int64_t)1 << 20)

static int64_t max2(int64_t a, int64_t b) {
    return a > b ? a : b;
}

/* ======================= saved activations ============================================== */

typedef struct moe_sv {
    float *s;     /* (T, E) */
    int32_t *sel; /* (T, k) */
    float *pw;    /* (T, k) */
    float *z;     /* (T, dz) */
    float *esave; /* the device's routed-expert save */
    float *u_pre; /* (T, dz) */
    float *rstd;  /* (T) */
    float *u;     /* (T, dz) */
    float *sgu;   /* (T, 2 fs) */
    float *sh;    /* (T, fs) */
} moe_sv;

typedef struct dev_rec {
    float *h, *x1, *rstd1, *p_mid, *mfx, *x2, *rstd2; /* as arl_layer_rec */
    arl_kda_layer_save kda;
    arl_mla_layer_save mla;
    arl_dense_save dense; /* gu (T, 2 fd), h (T, fd) */
    moe_sv moe;
} dev_rec;

static void kda_save_layout(arl_kda_layer_save *s, bump *w, const arl_model_dev *m, int64_t T,
                            int32_t N) {
    const arl_kda_layer_cfg *c = &m->kda;
    const int64_t H = c->H, dk = c->dk, dv = c->dv, P = H * dk, Pv = H * dv;
    for (int j = 0; j < 3; j++)
        s->pre[j] = take(w, T * P);
    s->z[0] = take(w, T * P);
    s->z[1] = take(w, T * P);
    s->qkv[0] = take(w, T * P);
    s->qkv[1] = take(w, T * P);
    s->qkv[2] = take(w, T * Pv);
    s->rn[0] = take(w, T * H);
    s->rn[1] = take(w, T * H);
    s->fa = take(w, T * dk);
    s->f = take(w, T * P);
    s->g = take(w, T * P);
    s->bl = take(w, T * H);
    s->beta = take(w, T * H);
    s->o = take(w, T * Pv);
    s->gam = take(w, T * Pv);
    s->ga = take(w, T * dk);
    s->rstd = take(w, T * H);
    s->ob = take(w, T * Pv);
    s->cst = take(w, (T / c->chunk + N + 1) * H * dk * dv);
    s->n_chunks = 0;
}

static void mla_save_layout(arl_mla_layer_save *s, bump *w, const arl_model_dev *m, int64_t T) {
    const arl_mla_layer_cfg *c = &m->mla;
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t rq = c->rq > 0 ? c->rq : 1;
    memset(s, 0, sizeof *s);
    s->cq_pre = take(w, T * rq);
    s->rstd_q = take(w, T);
    s->cq = take(w, T * rq);
    s->q_nope = take(w, T * Hm * n);
    s->q_pe = take(w, T * Hm * r);
    s->c_pre = take(w, T * rkv);
    s->rstd_c = take(w, T);
    s->c = take(w, T * rkv);
    s->k_pe = take(w, T * r);
    if (m->n_slots > 0 || c->sparse_topk > 0) { /* the absorbed form (continuing a slot, or
                                                   block-sparse) */
        s->lat = take(w, T * (rkv + r));
        s->qhat = take(w, T * Hm * rkv);
        s->ohat = take(w, T * Hm * rkv);
    }
    if (c->sparse_topk > 0) /* block-sparse: each (token, head)'s selected chunks */
        s->sel = (int32_t *)take(w, T * Hm * c->sparse_topk);
    s->k_nope = take(w, T * Hm * n);
    s->v = take(w, T * Hm * vm);
    s->lse = take(w, T * Hm);
    s->o = take(w, T * Hm * vm);
    s->gam = take(w, T * Hm * vm);
    s->u = take(w, T * Hm * vm);
}

static void moe_save_layout(moe_sv *s, bump *w, const arl_model_dev *m, int64_t T) {
    const arl_moe_cfg *c = &m->moe;
    s->s = take(w, T * c->E);
    s->sel = (int32_t *)take(w, T * c->k);
    s->pw = take(w, T * c->k);
    s->z = take(w, T * c->dz);
    s->esave = take(w, m->ops->moe_experts_save_floats(T, c->k, c->E, c->dz, c->f));
    s->u_pre = take(w, T * c->dz);
    s->rstd = take(w, T);
    s->u = take(w, T * c->dz);
    s->sgu = take(w, T * 2 * c->fs);
    s->sh = take(w, T * c->fs);
}

/* The part of a layer's record every layer has (mixes, norms, the block sum mid-layer). */
static void rec_layout_common(dev_rec *r, bump *w, const arl_model_dev *m) {
    const int64_t T = m->opts.max_tokens, d = m->dm.d;
    r->h = take(w, T * d);
    r->x1 = take(w, T * d);
    r->rstd1 = take(w, T);
    r->p_mid = take(w, T * d);
    r->mfx = take(w, T * d);
    r->x2 = take(w, T * d);
    r->rstd2 = take(w, T);
}

static void rec_layout(dev_rec *r, bump *w, const arl_model_dev *m, int64_t l) {
    const int64_t T = m->opts.max_tokens;
    rec_layout_common(r, w, m);
    if (arl_model_config_layer_kind(m->cfg, l) == ARL_LAYER_KDA)
        kda_save_layout(&r->kda, w, m, T, m->opts.max_docs);
    else
        mla_save_layout(&r->mla, w, m, T);
    if (arl_model_config_layer_is_moe(m->cfg, l)) {
        moe_save_layout(&r->moe, w, m, T);
    } else {
        r->dense.gu = take(w, 2 * T * m->dm.fd);
        r->dense.h = take(w, T * m->dm.fd);
    }
}

/* A record that serves any layer (activation checkpointing): the common part, the saves of
 * both mixers and of both FFN kinds the model has. */
static void rec_layout_any(dev_rec *r, bump *w, const arl_model_dev *m) {
    const int64_t T = m->opts.max_tokens;
    memset(r, 0, sizeof *r);
    rec_layout_common(r, w, m);
    int kda = 0, mla = 0, moe = 0, dense = 0;
    for (int64_t l = 0; l < m->dm.L; l++) {
        if (arl_model_config_layer_kind(m->cfg, l) == ARL_LAYER_KDA)
            kda = 1;
        else
            mla = 1;
        if (arl_model_config_layer_is_moe(m->cfg, l))
            moe = 1;
        else
            dense = 1;
    }
    if (kda) kda_save_layout(&r->kda, w, m, T, m->opts.max_docs);
    if (mla) mla_save_layout(&r->mla, w, m, T);
    if (moe) moe_save_layout(&r->moe, w, m, T);
    if (dense) {
        r->dense.gu = take(w, 2 * T * m->dm.fd);
        r->dense.h = take(w, T * m->dm.fd);
    }
}

/* ======================= work buffers (one ws shared by the sublayers) =================== */

typedef struct kda_ws {
    float *S0, *core, *dob, *d_o, *dgam, *dga, *dcore[3], *dg, *dbeta, *dbl, *df, *dfa, *dz, *dpre;
    /* documents continuing slots (models with slots only): gathered states (N, H, dk, dv) and
     * tails (N, 3, P, W-1), the tails of one projection per j (3, N, P, W-1), the state
     * gradients after (_T) and before (0) the segment, one projection's tail gradients */
    float *S, *tails, *tin, *dS_T, *dS0, *dtails_T, *dtails0, *dtail, *dtail_out;
} kda_ws;

static int64_t kda_ws_layout(kda_ws *B, float *base, const arl_model_dev *m, int64_t T, int32_t N) {
    const arl_kda_layer_cfg *c = &m->kda;
    const arl_dev_ops *ops = m->ops;
    const int64_t H = c->H, dk = c->dk, dv = c->dv, P = H * dk;
    bump w = {base, 0};
    B->S0 = take(&w, (int64_t)N * H * dk * dv);
    B->core = take(&w, max2(ops->kda_chunk_ws_floats(T, N, H, dk, dv, c->chunk),
                            ops->kda_chunk_bwd_ws_floats(T, N, H, dk, dv, c->chunk)));
    B->dob = take(&w, T * P);
    B->d_o = take(&w, T * P);
    B->dgam = take(&w, T * P);
    B->dga = take(&w, T * dk);
    for (int j = 0; j < 3; j++)
        B->dcore[j] = take(&w, T * P);
    B->dg = take(&w, T * P);
    B->dbeta = take(&w, T * H);
    B->dbl = take(&w, T * H);
    B->df = take(&w, T * P);
    B->dfa = take(&w, T * dk);
    B->dz = take(&w, T * P);
    B->dpre = take(&w, T * P);
    if (m->n_slots > 0) {
        const int64_t sn = H * dk * dv, tl = P * (c->W - 1);
        B->S = take(&w, (int64_t)N * sn);
        B->tails = take(&w, (int64_t)N * 3 * tl);
        B->tin = take(&w, (int64_t)N * 3 * tl);
        B->dS_T = take(&w, (int64_t)N * sn);
        B->dS0 = take(&w, (int64_t)N * sn);
        B->dtails_T = take(&w, (int64_t)N * 3 * tl);
        B->dtails0 = take(&w, (int64_t)N * 3 * tl);
        B->dtail = take(&w, (int64_t)N * tl);
        B->dtail_out = take(&w, (int64_t)N * tl);
    }
    return w.used;
}

typedef struct mla_ws {
    float *qf, *ckv, *kv, *attn, *du, *d_o, *dgam, *tmp, *dq_nope, *dq_pe, *dk_nope, *dv, *dkv,
        *dk_pe, *dc, *dc_pre, *dckv, *dqf, *dcq, *dcq_pre;
    /* the absorbed form (documents continuing slots, or block-sparse): the core's work
     * buffer, dohat and dqhat (T, Hm, rkv), the gradient of the new rows dlat and of the rows
     * after the segment dlat_T (T, R), one part of dlat_T (T, rkv) */
    float *abs, *dohat, *dqhat, *dlat, *dlat_T, *dpart;
} mla_ws;

static int64_t mla_ws_layout(mla_ws *B, float *base, const arl_model_dev *m, int64_t T) {
    const arl_mla_layer_cfg *c = &m->mla;
    const int64_t Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv, R = rkv + r;
    const int64_t rq = c->rq > 0 ? c->rq : 1;
    bump w = {base, 0};
    B->qf = take(&w, T * Hm * (n + r));
    B->ckv = take(&w, T * R);
    B->kv = take(&w, T * Hm * (n + vm));
    B->attn = take(&w, max2(m->ops->mla_attn_ws_floats(T, Hm, n, r, vm),
                            m->ops->mla_attn_bwd_ws_floats(T, Hm, n, r, vm)));
    B->du = take(&w, T * Hm * vm);
    B->d_o = take(&w, T * Hm * vm);
    B->dgam = take(&w, T * Hm * vm);
    B->tmp = take(&w, T * Hm * vm);
    B->dq_nope = take(&w, T * Hm * n);
    B->dq_pe = take(&w, T * Hm * r);
    B->dk_nope = take(&w, T * Hm * n);
    B->dv = take(&w, T * Hm * vm);
    B->dkv = take(&w, T * Hm * (n + vm));
    B->dk_pe = take(&w, T * r);
    B->dc = take(&w, T * rkv);
    B->dc_pre = take(&w, T * rkv);
    B->dckv = take(&w, T * R);
    B->dqf = take(&w, T * Hm * (n + r));
    B->dcq = take(&w, T * rq);
    B->dcq_pre = take(&w, T * rq);
    const int sparse = c->sparse_topk > 0;
    if ((m->n_slots > 0 && m->ops->mla_abs_train_ws_floats) || sparse) {
        const int64_t S = max2(m->n_slots > 0 ? m->max_context : 0, T);
        B->abs =
            take(&w, sparse ? m->ops->mla_sparse_train_ws_floats(T > 0 ? T : 1, S, Hm, rkv, r,
                                                                 c->sparse_chunk, c->sparse_topk)
                            : m->ops->mla_abs_train_ws_floats(m->max_context, Hm, rkv, r));
        B->dohat = take(&w, T * Hm * rkv);
        B->dqhat = take(&w, T * Hm * rkv);
        B->dlat = take(&w, T * R);
        B->dlat_T = take(&w, T * R);
        B->dpart = take(&w, T * rkv);
    }
    return w.used;
}

typedef struct ffn_ws {
    float *router, *experts, *dun, *du, *dp, *dz, *dh, *dgu;
} ffn_ws;

static int64_t ffn_ws_layout(ffn_ws *B, float *base, const arl_model_dev *m, int64_t T) {
    const arl_moe_cfg *c = &m->moe;
    const int64_t fw = max2(c->fs, m->dm.fd); /* shared experts or the dense FFN */
    bump w = {base, 0};
    B->router = take(&w, m->ops->router_ws_floats(T, c->E));
    B->experts = take(&w, m->ops->moe_experts_bwd_ws_floats(T, c->k, c->E, c->dz, c->f));
    B->dun = take(&w, T * c->dz);
    B->du = take(&w, T * c->dz);
    B->dp = take(&w, T * c->k);
    B->dz = take(&w, T * c->dz);
    B->dh = take(&w, T * fw);
    B->dgu = take(&w, T * 2 * fw);
    return w.used;
}

/* ======================= layout, init ==================================================== */

static int64_t train_layout(arl_model_dev_train *tr, const arl_model_dev *m, float *base,
                            int64_t n_chunks) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = m->opts.max_tokens, d = dm->d, L = dm->L, V = dm->V;
    const int32_t N = m->opts.max_docs;
    const int32_t n_res = m->n_blocks + 1;
    int64_t rows = LOGIT_BLOCK_FLOATS / V;
    rows = rows < 1 ? 1 : rows > T ? T : rows;
    tr->n_res = n_res;
    tr->logit_rows = rows;
    bump w = {base, 0};
    tr->grads = take(&w, m->weight_floats);
    tr->mom_m = take(&w, m->weight_floats);
    tr->mom_v = take(&w, m->weight_floats);
    tr->res = take(&w, n_res * T * d);
    tr->layer_in = take(&w, L * T * d);
    tr->tails0 = NULL;
    if (m->n_slots > 0 && dm->n_kda > 0)
        tr->tails0 = take(&w, dm->n_kda * (int64_t)N * 3 * dm->P * (dm->W - 1));
    dev_rec *recs = tr->layers;
    tr->S0 = tr->pnew_scr = NULL;
    if (m->dopts.train_checkpoint) {
        /* one layer's activations shared by every layer (recomputed in the backward), except
         * each MoE layer's router scores and routes (the forward's outputs); the initial KDA
         * states of a state forward and the layer's running block sum for the recomputation */
        dev_rec u;
        rec_layout_any(&u, &w, m);
        for (int64_t l = 0; l < L; l++) {
            dev_rec r = u;
            if (arl_model_config_layer_is_moe(m->cfg, l)) {
                r.moe.s = take(&w, T * dm->E);
                r.moe.sel = (int32_t *)take(&w, T * dm->k);
            }
            if (base) recs[l] = r;
        }
        tr->pnew_scr = take(&w, T * d);
        if (m->n_slots > 0 && dm->n_kda > 0)
            tr->S0 = take(&w, dm->n_kda * (int64_t)N * dm->H * dm->dk * dm->dv);
    } else {
        for (int64_t l = 0; l < L; l++) {
            dev_rec tmp;
            rec_layout(base ? &recs[l] : &tmp, &w, m, l);
        }
    }
    tr->fin = take(&w, T * d);
    tr->xf = take(&w, T * d);
    tr->rstd_f = take(&w, T);
    tr->lse = take(&w, T);
    tr->logp = take(&w, T);
    tr->dlogp = take(&w, T);
    tr->logits = take(&w, rows * V);
    tr->dlogits = take(&w, rows * V);
    tr->ybuf = take(&w, T * d);
    tr->d_res = take(&w, (n_res - 1) * T * d);
    tr->dp = take(&w, T * d);
    tr->dx = take(&w, T * d);
    tr->dmix = take(&w, T * d);
    tr->mix_ws = take(&w, m->ops->attnres_bwd_ws_floats(n_res, T));
    kda_ws kb;
    mla_ws mb;
    ffn_ws fb;
    int64_t ws = 16;
    if (dm->n_kda) ws = max2(ws, kda_ws_layout(&kb, NULL, m, T, N));
    if (dm->n_mla) ws = max2(ws, mla_ws_layout(&mb, NULL, m, T));
    ws = max2(ws, ffn_ws_layout(&fb, NULL, m, T));
    ws = max2(ws, m->ops->embed_bwd_ws_floats(T, V)); /* after the layers */
    tr->ws = take(&w, ws);
    tr->ws_floats = ws;
    tr->sumsq = (double *)take(&w, 2 * (n_chunks > 0 ? n_chunks : 1));
    tr->ranges = (int64_t *)take(&w, 4 * (n_chunks > 0 ? n_chunks : 1));
    return w.used;
}

/* The optimizer's chunk table (policy/optimizer.c arl_adamw_init) and the contiguous runs of
 * trained tensors with one decay rule; host arrays. */
static arl_status optim_tables(arl_model_dev_train *tr, const arl_param_inventory *inv,
                               int64_t *ranges_host) {
    int64_t nch = 0, nrun = 0;
    for (int64_t i = 0; i < inv->n; i++)
        if (arl_optim_tensor_rule(&inv->t[i]) & ARL_OPTIM_TRAIN) {
            nch += (inv->t[i].numel + ARL_OPTIM_CHUNK - 1) / ARL_OPTIM_CHUNK;
            nrun++;
        }
    if (!ranges_host) {
        tr->n_chunks = nch;
        tr->chunk_tensor = malloc(sizeof(int64_t) * (size_t)(nch ? nch : 1));
        tr->sumsq_host = malloc(sizeof(double) * (size_t)(nch ? nch : 1));
        tr->run_begin = malloc(sizeof(int64_t) * (size_t)(nrun ? nrun : 1));
        tr->run_len = malloc(sizeof(int64_t) * (size_t)(nrun ? nrun : 1));
        tr->run_decay = malloc(sizeof(int32_t) * (size_t)(nrun ? nrun : 1));
        size_t pool = 1;
        for (int64_t i = 0; i < inv->n; i++)
            pool += strlen(inv->t[i].name) + 1;
        tr->name_pool = malloc(pool);
        tr->tensor_name = malloc(sizeof(char *) * (size_t)(inv->n ? inv->n : 1));
        if (!tr->chunk_tensor || !tr->sumsq_host || !tr->run_begin || !tr->run_len ||
            !tr->run_decay || !tr->name_pool || !tr->tensor_name)
            return arl_errorf(ARL_ERR_NOMEM, "training (device): optimizer tables");
        char *q = tr->name_pool;
        for (int64_t i = 0; i < inv->n; i++) {
            size_t len = strlen(inv->t[i].name) + 1;
            memcpy(q, inv->t[i].name, len);
            tr->tensor_name[i] = q;
            q += len;
        }
        return ARL_OK;
    }
    int64_t c = 0;
    tr->n_runs = 0;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        unsigned rule = arl_optim_tensor_rule(t);
        if (!(rule & ARL_OPTIM_TRAIN)) continue;
        for (int64_t b = 0; b < t->numel; b += ARL_OPTIM_CHUNK) {
            tr->chunk_tensor[c] = i;
            ranges_host[2 * c] = t->offset + b;
            ranges_host[2 * c + 1] =
                t->offset + (b + ARL_OPTIM_CHUNK < t->numel ? b + ARL_OPTIM_CHUNK : t->numel);
            c++;
        }
        int32_t decay = (rule & ARL_OPTIM_DECAY) != 0;
        int64_t r = tr->n_runs;
        if (r > 0 && tr->run_decay[r - 1] == decay &&
            tr->run_begin[r - 1] + tr->run_len[r - 1] == t->offset) {
            tr->run_len[r - 1] += t->numel; /* adjacent with the same rule: one launch */
        } else {
            tr->run_begin[r] = t->offset;
            tr->run_len[r] = t->numel;
            tr->run_decay[r] = decay;
            tr->n_runs++;
        }
    }
    ARL_ASSERT(c == tr->n_chunks);
    return ARL_OK;
}

int64_t arl_model_dev_train_bytes(const arl_model_dev *m) {
    arl_model_dev_train tr;
    memset(&tr, 0, sizeof tr);
    arl_param_inventory inv;
    if (arl_param_inventory_build(m->cfg, &inv)) return -1;
    int64_t nch = 0;
    for (int64_t i = 0; i < inv.n; i++)
        if (arl_optim_tensor_rule(&inv.t[i]) & ARL_OPTIM_TRAIN)
            nch += (inv.t[i].numel + ARL_OPTIM_CHUNK - 1) / ARL_OPTIM_CHUNK;
    arl_param_inventory_free(&inv);
    return train_layout(&tr, m, NULL, nch) * (int64_t)sizeof(float);
}

static int has_training_ops(const arl_dev_ops *o) {
    return o->kda_conv_bwd && o->kda_gate_k3_bwd && o->kda_gate_softplus_bwd && o->kda_onorm_bwd &&
           o->kda_chunk_bwd_ws_floats && o->kda_chunk_bwd && o->mla_attn_bwd_ws_floats &&
           o->mla_attn_bwd && o->attnres_bwd_ws_floats && o->attnres_mix_bwd && o->router_bwd &&
           o->moe_experts_save_floats && o->moe_experts_fwd_save && o->moe_experts_bwd_ws_floats &&
           o->moe_experts_bwd && o->embed_bwd_ws_floats && o->embed_bwd && o->grad_sumsq &&
           o->adamw_update;
}

arl_status arl_model_dev_train_init(arl_model_dev_train *tr, arl_model_dev *m,
                                    const arl_optim_config *oc) {
    memset(tr, 0, sizeof *tr);
    const arl_dev_ops *ops = m->ops;
    if (!has_training_ops(ops))
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "training (%s device): this device has no training ops; train on "
                          "policy/model_backward.h",
                          ops->name);
    if (m->mla.sparse_topk > 0 && m->dm.n_mla > 0 &&
        (!ops->mla_sparse_train_ws_floats || !ops->mla_sparse_fwd_save || !ops->mla_sparse_bwd))
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "training (%s device): this device has no block-sparse MLA training "
                          "ops (mla_sparse_topk = %lld); train on policy/model_backward.h or "
                          "with mla_sparse_topk 0",
                          ops->name, (long long)m->mla.sparse_topk);
    ARL_TRY(arl_optim_config_check(oc));
    tr->m = m;
    tr->ocfg = *oc;
    arl_param_inventory inv;
    ARL_TRY(arl_param_inventory_build(m->cfg, &inv));
    arl_status s = optim_tables(tr, &inv, NULL);
    int64_t *ranges_host = NULL;
    if (!s) {
        tr->layers = calloc((size_t)(m->dm.L > 0 ? m->dm.L : 1), sizeof(dev_rec));
        ranges_host = malloc(sizeof(int64_t) * 2 * (size_t)(tr->n_chunks ? tr->n_chunks : 1));
        const size_t T = (size_t)m->opts.max_tokens;
        tr->dlogp_host = malloc(sizeof(float) * T);
        tr->targets_host = malloc(sizeof(int32_t) * T);
        tr->logp_host = malloc(sizeof(float) * T);
        if (m->cfg->has_vision) tr->media_host = malloc(sizeof(float) * T * (size_t)m->dm.d);
        const size_t Nd = (size_t)m->opts.max_docs;
        tr->fwd_slots = malloc(sizeof(int32_t) * Nd);
        tr->fwd_pos0 = malloc(sizeof(int64_t) * Nd);
        if (!tr->layers || !ranges_host || !tr->dlogp_host || !tr->targets_host || !tr->logp_host ||
            !tr->fwd_slots || !tr->fwd_pos0 || (m->cfg->has_vision && !tr->media_host))
            s = arl_errorf(ARL_ERR_NOMEM, "training (%s device): host tables", ops->name);
    }
    if (!s) s = optim_tables(tr, &inv, ranges_host);
    if (!s) {
        tr->arena_floats = train_layout(tr, m, NULL, tr->n_chunks);
        s = ops->mem_alloc((size_t)tr->arena_floats * sizeof(float), "the training arena",
                           &tr->arena, &tr->arena_token);
        if (s) {
            arl_error_prefix(s, "training (%s device, %lld bytes)", ops->name,
                             (long long)(tr->arena_floats * 4));
            tr->arena = NULL;
        }
    }
    if (!s) {
        train_layout(tr, m, (float *)tr->arena, tr->n_chunks);
        s = arl_model_params_view(&tr->g, m->cfg, tr->grads);
    }
    if (!s) s = ops->upload(tr->ranges, ranges_host, sizeof(int64_t) * 2 * (size_t)tr->n_chunks);
    if (!s) {
        const arl_k_backend *kb = m->kb;
        kb->fill(tr->grads, 0.0f, m->weight_floats);
        kb->fill(tr->mom_m, 0.0f, m->weight_floats);
        kb->fill(tr->mom_v, 0.0f, m->weight_floats);
        s = ops->sync();
    }
    free(ranges_host);
    arl_param_inventory_free(&inv);
    if (s) arl_model_dev_train_free(tr);
    return s;
}

void arl_model_dev_train_free(arl_model_dev_train *tr) {
    if (!tr) return;
    if (tr->garena) {
        if (tr->m->lat_twin == tr->g_lat) tr->m->lat_twin = NULL;
        tr->m->ops->mem_free(tr->garena, tr->garena_token); /* taken last */
    }
    if (tr->arena) tr->m->ops->mem_free(tr->arena, tr->arena_token);
    free(tr->g_pos);
    free(tr->fwd_slots);
    free(tr->fwd_pos0);
    arl_model_params_free(&tr->g);
    free(tr->layers);
    free(tr->chunk_tensor);
    free(tr->sumsq_host);
    free(tr->run_begin);
    free(tr->run_len);
    free(tr->run_decay);
    free((void *)tr->tensor_name);
    free(tr->name_pool);
    free(tr->dlogp_host);
    free(tr->targets_host);
    free(tr->logp_host);
    free(tr->media_host);
    memset(tr, 0, sizeof *tr);
}

arl_status arl_model_dev_zero_grad(arl_model_dev_train *tr) {
    tr->m->kb->fill(tr->grads, 0.0f, tr->m->weight_floats);
    return ARL_OK;
}

/* ======================= sublayer forwards (with saves) ================================== */

/* The documents of a forward: host boundaries, and for a state forward each one's slot and
 * position before the segment (slots NULL: fresh documents). */
typedef struct seg_docs {
    const int32_t *cu_host; /* (N + 1) host */
    const int32_t *slots;   /* (N) host or NULL */
    const int64_t *pos0;    /* (N) host or NULL */
    int recompute;          /* 1: a checkpointed layer recomputed in the backward: the KDA
                               states start from tr->S0 / tr->tails0, the slots are not
                               advanced (their MLA rows are rewritten with the same values) */
} seg_docs;

/* Layer kind index (among KDA or MLA layers) of layer l. */
static int64_t kind_index(const arl_model_dev *m, int64_t l) {
    int64_t i = 0;
    const arl_layer_kind kind = arl_model_config_layer_kind(m->cfg, l);
    for (int64_t j = 0; j < l; j++)
        i += arl_model_config_layer_kind(m->cfg, j) == kind;
    return i;
}

/* Slot `slot` of KDA layer ki of the model's states (S then tails) or of the state gradients. */
static float *kda_slot(float *base, const arl_model_dev *m, int64_t ki, int32_t slot) {
    const int64_t sn = m->dm.H * m->dm.dk * m->dm.dv, tn = 3 * m->dm.P * (m->dm.W - 1);
    return base + (ki * m->n_slots + slot) * (sn + tn);
}

/* Rows of slot `slot` of MLA layer mi of the caches or their gradients (one layout). */
static float *lat_slot(float *base, const arl_model_dev *m, int64_t mi, int32_t slot) {
    return arl_model_dev_slot_rows(m, base, mi, slot);
}

/* dst (N, P, W-1) = projection j's part of each document's tails (N, 3, P, W-1) (tl =
 * P*(W-1)): the gather_tails of policy/kda_layer_backward.c. */
static void gather_proj(const arl_k_backend *kb, float *dst, const float *tails, int j, int32_t N,
                        int64_t tl) {
    for (int32_t i = 0; i < N; i++)
        kb->copy(dst + i * tl, tails + (i * 3 + j) * tl, tl);
}

/* The training forward's weight GEMMs (and the backward's recomputed logits): on the bf16
 * copies under the bf16 math mode (arl_model_dev_lin), so that the forward rounds as the
 * model's inference forwards do; the backward's GEMMs read the fp32 masters. */
static void lin(const arl_model_dev *m, float *y, const float *x, const uint16_t *xr,
                const float *W, int64_t T, int64_t in, int64_t out) {
    arl_model_dev_lin(m, 1, y, x, xr, W, T, in, out);
}

/* policy/kda_layer_backward.c arl_kda_layer_fwd_save; for a state forward (D->slots) the
 * documents' states of KDA layer ki are gathered, their initial tails kept for the backward
 * (tr->tails0), and the advanced states scattered back (policy/model_backward.c). */
static void kda_fwd_save(arl_model_dev_train *tr, float *y, const float *x, const arl_kda_params *p,
                         const int32_t *cu, int32_t N, int64_t T, arl_kda_layer_save *sv,
                         const seg_docs *D, int64_t ki) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_kda_layer_cfg *c = &m->kda;
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk, W = c->W;
    const int64_t sn = H * dk * dv, tl = P * (W - 1), tn = 3 * tl;
    kda_ws B;
    kda_ws_layout(&B, tr->ws, m, T, N);
    const uint16_t *xr = arl_model_dev_round(m, 1, x, T); /* x's GEMMs on the copies */
    float *S = NULL, *tails = NULL;
    if (D->slots) {
        S = B.S;
        tails = B.tails;
        float *t0 = tr->tails0 + ki * (int64_t)m->opts.max_docs * tn;
        float *s0 = tr->S0 ? tr->S0 + ki * (int64_t)m->opts.max_docs * sn : NULL;
        for (int32_t i = 0; i < N; i++) {
            if (D->recompute) { /* the states the forward started from */
                kb->copy(S + i * sn, s0 + i * sn, sn);
                kb->copy(tails + i * tn, t0 + i * tn, tn);
                continue;
            }
            const float *src = kda_slot(m->st_kda, m, ki, D->slots[i]);
            kb->copy(S + i * sn, src, sn);
            kb->copy(tails + i * tn, src + sn, tn);
            kb->copy(t0 + i * tn, src + sn, tn);
            if (s0) kb->copy(s0 + i * sn, src, sn);
        }
    }

    const float *proj[3] = {p->q_proj, p->k_proj, p->v_proj};
    const float *conv[3] = {p->q_conv, p->k_conv, p->v_conv};
    float *zout[3] = {sv->z[0], sv->z[1], sv->qkv[2]};
    for (int j = 0; j < 3; j++) {
        lin(m, sv->pre[j], x, xr, proj[j], T, d, P);
        const float *tin = NULL;
        if (tails && tl > 0) {
            gather_proj(kb, B.tin + (int64_t)j * N * tl, tails, j, N, tl);
            tin = B.tin + (int64_t)j * N * tl;
        }
        ops->kda_conv_fwd(zout[j], NULL, sv->pre[j], conv[j], tin, cu, N, T, P, W);
        if (tails && tl > 0)
            for (int32_t i = 0; i < N; i++) {
                int64_t a = D->cu_host[i], e = D->cu_host[i + 1];
                ops->kda_conv_tail(tails + (i * 3 + j) * tl, sv->pre[j] + a * P, e - a,
                                   tin + i * tl, P, W);
            }
    }
    kb->l2norm_fwd(sv->qkv[0], sv->rn[0], sv->z[0], T * H, dk, 1e-6f);
    kb->l2norm_fwd(sv->qkv[1], sv->rn[1], sv->z[1], T * H, dk, 1e-6f);
    lin(m, sv->bl, x, xr, p->b_proj, T, d, H);
    kb->sigmoid_fwd(sv->beta, sv->bl, T * H);

    lin(m, sv->fa, x, xr, p->f_a, T, d, dk);
    lin(m, sv->f, sv->fa, NULL, p->f_b, T, dk, P);
    if (c->lower_bound_gate)
        ops->kda_gate_k3_fwd(sv->g, sv->f, p->A_log, p->dt_bias, T, H, dk, c->g_min);
    else
        ops->kda_gate_softplus_fwd(sv->g, sv->f, p->A_log, p->dt_bias, T, H, dk);

    float *St = S;
    if (!St) {
        St = B.S0;
        kb->fill(St, 0.0f, (int64_t)N * H * dk * dv);
    }
    const float scale = 1.0f / sqrtf((float)dk);
    ops->kda_chunk_fwd(sv->o, St, sv->cst, sv->qkv[0], sv->qkv[1], sv->qkv[2], sv->g, sv->beta, cu,
                       N, T, H, dk, dv, scale, c->chunk, B.core);

    if (p->g_proj) {
        lin(m, sv->gam, x, xr, p->g_proj, T, d, H * dv);
    } else {
        lin(m, sv->ga, x, xr, p->g_a, T, d, dk);
        lin(m, sv->gam, sv->ga, NULL, p->g_b, T, dk, H * dv);
    }
    ops->kda_onorm_fwd(sv->ob, sv->rstd, sv->o, sv->gam, p->o_norm, T * H, dv, c->eps);
    lin(m, y, sv->ob, NULL, p->o_proj, T, H * dv, d);
    if (D->slots && !D->recompute)
        for (int32_t i = 0; i < N; i++) {
            float *dst = kda_slot(m->st_kda, m, ki, D->slots[i]);
            kb->copy(dst, S + i * sn, sn);
            kb->copy(dst + sn, tails + i * tn, tn);
        }
}

/* policy/mla_layer_backward.c arl_mla_layer_fwd_save: the expanded form for fresh documents
 * (and for a state forward whose documents all start at position 0), else the absorbed form
 * over the slots' rows of MLA layer mi, after the new rows are appended; block-sparse
 * (spec 4.5): always the absorbed form, over the slots' rows or each fresh document's own. */
static void mla_fwd_save(arl_model_dev_train *tr, float *y, const float *x, const arl_mla_params *p,
                         const int32_t *cu, int32_t N, int64_t T, arl_mla_layer_save *sv,
                         const seg_docs *D, int64_t mi) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_mla_layer_cfg *c = &m->mla;
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r;
    const float scale = 1.0f / sqrtf((float)(n + r));
    mla_ws B;
    mla_ws_layout(&B, tr->ws, m, T);
    const uint16_t *xr = arl_model_dev_round(m, 1, x, T);

    if (p->q_a) {
        lin(m, sv->cq_pre, x, xr, p->q_a, T, d, c->rq);
        kb->rmsnorm_fwd(sv->cq, sv->rstd_q, sv->cq_pre, p->q_a_norm, T, c->rq, 1e-6f);
        lin(m, B.qf, sv->cq, NULL, p->q_b, T, c->rq, Hm * (n + r));
    } else {
        lin(m, B.qf, x, xr, p->q_proj, T, d, Hm * (n + r));
    }
    ops->copy_rows(sv->q_nope, n, B.qf, n + r, T * Hm, n);
    ops->copy_rows(sv->q_pe, r, B.qf + n, n + r, T * Hm, r);
    lin(m, B.ckv, x, xr, p->kv_a, T, d, R);
    ops->copy_rows(sv->c_pre, rkv, B.ckv, R, T, rkv);
    ops->copy_rows(sv->k_pe, r, B.ckv + rkv, R, T, r);
    kb->rmsnorm_fwd(sv->c, sv->rstd_c, sv->c_pre, p->kv_a_norm, T, rkv, 1e-6f);
    const int sparse = c->sparse_topk > 0;
    sv->absorbed = sparse;
    if (D->slots || sparse) { /* the new rows [c; k_pe] */
        ops->copy_rows(sv->lat, R, sv->c, rkv, T, rkv);
        ops->copy_rows(sv->lat + rkv, R, sv->k_pe, r, T, r);
    }
    if (D->slots) { /* appended to every document's slot */
        int fresh = 1;
        for (int32_t i = 0; i < N; i++) {
            int64_t a = D->cu_host[i], len = D->cu_host[i + 1] - a;
            kb->copy(lat_slot(m->st_lat, m, mi, D->slots[i]) + D->pos0[i] * R, sv->lat + a * R,
                     len * R);
            fresh &= D->pos0[i] == 0;
        }
        sv->absorbed = sparse || !fresh;
    }

    if (!sv->absorbed) {
        lin(m, B.kv, sv->c, NULL, p->kv_b, T, rkv, Hm * (n + vm));
        ops->copy_rows(sv->k_nope, n, B.kv, n + vm, T * Hm, n);
        ops->copy_rows(sv->v, vm, B.kv + n, n + vm, T * Hm, vm);
        ops->mla_attn_fwd(sv->o, sv->lse, sv->q_nope, sv->q_pe, sv->k_nope, sv->k_pe, sv->v, cu, N,
                          T, Hm, n, r, vm, scale, B.attn);
    } else {
        /* 4.2: qhat = W_UK^T q_nope (policy/mla.c arl_mla_absorb_q), the core per document
         * over its slot's rows, o = W_UV ohat (arl_mla_expand_o) */
        for (int64_t h = 0; h < Hm; h++)
            kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, rkv, n, 1.0f, sv->q_nope + h * n, Hm * n,
                     p->kv_b + h * (n + vm) * rkv, rkv, 0.0f, sv->qhat + h * rkv, Hm * rkv);
        for (int32_t i = 0; i < N; i++) {
            int64_t a = D->cu_host[i], len = D->cu_host[i + 1] - a;
            const float *rows =
                D->slots ? lat_slot(m->st_lat, m, mi, D->slots[i]) : sv->lat + a * R;
            const int64_t p0 = D->slots ? D->pos0[i] : 0;
            if (sparse)
                ops->mla_sparse_fwd_save(sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                         sv->sel + a * Hm * c->sparse_topk, sv->qhat + a * Hm * rkv,
                                         sv->q_pe + a * Hm * r, rows, p0, len, Hm, rkv, r, scale,
                                         c->sparse_chunk, c->sparse_topk, B.abs);
            else
                ops->mla_abs_fwd_save(sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                      sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r, rows, p0, len,
                                      Hm, rkv, r, scale, B.abs);
        }
        for (int64_t h = 0; h < Hm; h++)
            kb->gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, vm, rkv, 1.0f, sv->ohat + h * rkv, Hm * rkv,
                     p->kv_b + (h * (n + vm) + n) * rkv, rkv, 0.0f, sv->o + h * vm, Hm * vm);
    }

    const float *u = sv->o;
    if (p->g_proj) {
        lin(m, sv->gam, x, xr, p->g_proj, T, d, Hm * vm);
        kb->sigmoid_fwd(sv->u, sv->gam, T * Hm * vm);
        kb->mul(sv->u, sv->u, sv->o, T * Hm * vm);
        u = sv->u;
    }
    lin(m, y, u, NULL, p->o_proj, T, Hm * vm, d);
}

/* policy/moe_backward.c glu_fwd (xr: arl_model_dev_lin). */
static void glu_fwd(const arl_model_dev *m, float *y, float beta, const float *x,
                    const uint16_t *xr, const float *Wg, const float *Wu, const float *Wd,
                    int64_t T, int64_t in, int64_t fw, int64_t out, float *gu, float *h) {
    const arl_k_backend *kb = m->kb;
    arl_model_dev_gemm_w(m, 1, gu, 2 * fw, 0.0f, x, xr, Wg, T, in, fw);
    arl_model_dev_gemm_w(m, 1, gu + fw, 2 * fw, 0.0f, x, xr, Wu, T, in, fw);
    if (m->act.situ)
        kb->situ_glu_fwd(h, gu, gu + fw, T, fw, 2 * fw, m->act.beta1, m->act.beta2);
    else
        kb->swiglu_fwd(h, gu, gu + fw, T, fw, 2 * fw);
    arl_model_dev_gemm_w(m, 1, y, out, beta, h, NULL, Wd, T, fw, out);
}

/* policy/moe_backward.c arl_moe_fwd_save (routes kept in sv->sel; forced checked before). */
static void moe_fwd_save(arl_model_dev_train *tr, float *y, const float *x, const arl_moe_params *p,
                         const int32_t *forced, int64_t T, moe_sv *sv) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_moe_cfg *c = &m->moe;
    const int64_t d = c->d, E = c->E, k = c->k, dz = c->dz;
    ffn_ws B;
    ffn_ws_layout(&B, tr->ws, m, T);
    const uint16_t *xr = arl_model_dev_round(m, 1, x, T);
    ops->router_fwd(sv->sel, sv->pw, sv->s, x, p->gate, p->gate_bias, forced, T, d, E, k, c->rho,
                    B.router);
    lin(m, sv->z, x, xr, p->down_proj, T, d, dz);
    const uint16_t *banks[3];
    ops->moe_experts_fwd_save(sv->u_pre, sv->z, sv->sel, sv->pw, p, c, T,
                              arl_model_dev_expert_banks(m, p, banks), sv->esave);
    if (p->latent_norm)
        kb->rmsnorm_fwd(sv->u, sv->rstd, sv->u_pre, p->latent_norm, T, dz, c->eps);
    else
        kb->copy(sv->u, sv->u_pre, T * dz);
    lin(m, y, sv->u, NULL, p->up_proj, T, dz, d);
    if (c->fs > 0 && p->shared_gate_proj)
        glu_fwd(m, y, 1.0f, x, xr, p->shared_gate_proj, p->shared_up_proj, p->shared_down_proj, T,
                d, c->fs, d, sv->sgu, sv->sh);
}

/* ======================= the training forward ============================================ */

static int32_t entries_before(const arl_model_dev *m, int64_t l) {
    const int64_t B = m->dm.B;
    return B > 0 ? (int32_t)((l + B - 1) / B) : 0;
}

static int block_start(const arl_model_dev *m, int64_t l) {
    return m->dm.B > 0 && l % m->dm.B == 0;
}

/* policy/model_backward.c layer_fwd. */
static void layer_fwd(arl_model_dev_train *tr, int64_t l, const float *p_in, float *pnew,
                      dev_rec *rec, int32_t N, int64_t T, const int32_t *forced,
                      const seg_docs *D) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_model_dims *dm = &m->dm;
    const arl_layer_params *lp = &m->w.layers[l];
    const int64_t d = dm->d, Tmax = m->opts.max_tokens, Td = T * d;
    const int32_t nbl = entries_before(m, l), nb_after = nbl + block_start(m, l);
    const float *src[ARL_ATTNRES_MAX_SOURCES];

    const float *h = p_in;
    if (dm->B > 0 && nbl > 0) {
        for (int32_t j = 0; j < nbl; j++)
            src[j] = tr->res + j * Tmax * d;
        src[nbl] = p_in;
        ops->attnres_mix_fwd(rec->h, NULL, src, nbl + 1, T, d, lp->attn_res_norm, lp->attn_res_proj,
                             m->eps);
        h = rec->h;
    }
    kb->rmsnorm_fwd(rec->x1, rec->rstd1, h, lp->input_norm, T, d, m->eps);
    if (lp->kind == ARL_LAYER_KDA)
        kda_fwd_save(tr, tr->ybuf, rec->x1, &lp->kda, m->cu, N, T, &rec->kda, D, kind_index(m, l));
    else
        mla_fwd_save(tr, tr->ybuf, rec->x1, &lp->mla, m->cu, N, T, &rec->mla, D, kind_index(m, l));
    kb->add(pnew, pnew, tr->ybuf, Td);
    kb->copy(rec->p_mid, pnew, Td);

    const float *mx = pnew;
    if (dm->B > 0) {
        for (int32_t j = 0; j < nb_after; j++)
            src[j] = tr->res + j * Tmax * d;
        src[nb_after] = pnew;
        ops->attnres_mix_fwd(rec->mfx, NULL, src, nb_after + 1, T, d, lp->mlp_res_norm,
                             lp->mlp_res_proj, m->eps);
        mx = rec->mfx;
    }
    kb->rmsnorm_fwd(rec->x2, rec->rstd2, mx, lp->post_norm, T, d, m->eps);
    if (lp->is_moe)
        moe_fwd_save(tr, tr->ybuf, rec->x2, &lp->moe, forced, T, &rec->moe);
    else
        glu_fwd(m, tr->ybuf, 0.0f, rec->x2, arl_model_dev_round(m, 1, rec->x2, T),
                lp->dense.gate_proj, lp->dense.up_proj, lp->dense.down_proj, T, d, dm->fd, d,
                rec->dense.gu, rec->dense.h);
    kb->add(pnew, pnew, tr->ybuf, Td);
}

/* Recompute layer l of the last forward into its record (activation checkpointing; as
 * policy/model_backward.c layer_recompute): from the layer's saved input, its block sum
 * restarted (a block's first layer) or continued from that input, the KDA states the forward
 * started from. */
static void layer_recompute(arl_model_dev_train *tr, int64_t l, const int32_t *cu_host) {
    arl_model_dev *m = tr->m;
    const arl_k_backend *kb = m->kb;
    const int64_t T = tr->fwd_T, d = m->dm.d, Td = T * d, k = m->dm.k;
    const float *p_in = tr->layer_in + l * m->opts.max_tokens * d;
    if (block_start(m, l))
        kb->fill(tr->pnew_scr, 0.0f, Td);
    else
        kb->copy(tr->pnew_scr, p_in, Td);
    const int64_t mi = m->moe_index[l];
    const int32_t *forced = mi >= 0 && tr->fwd_forced ? m->forced + mi * T * k : NULL;
    seg_docs D = {cu_host, tr->fwd_state ? tr->fwd_slots : NULL,
                  tr->fwd_state ? tr->fwd_pos0 : NULL, 1};
    dev_rec *recs = tr->layers;
    layer_fwd(tr, l, p_in, tr->pnew_scr, &recs[l], tr->fwd_N, T, forced, &D);
}

/* The checks of a state forward (policy/model_backward.c arl_model_train_forward and
 * policy/model_device.c dev_run): slots in range and distinct, the ops present, the rows
 * within max_context. */
static arl_status state_check(const arl_model_dev_train *tr, const arl_batch *b,
                              const int32_t *slots) {
    const arl_model_dev *m = tr->m;
    const char *dn = m->ops->name;
    const arl_dev_ops *o = m->ops;
    if (!o->kda_conv_tail_bwd || !o->kda_conv_tail_out_bwd || !o->mla_abs_train_ws_floats ||
        !o->mla_abs_fwd_save || !o->mla_abs_bwd)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "training (%s device): this device cannot train documents continuing "
                          "a decode state (no conv-tail backward or absorbed MLA training ops); "
                          "train them on policy/model_backward.h",
                          dn);
    const int32_t N = b->cu ? b->N : 1;
    for (int32_t i = 0; i < N; i++) {
        if (slots[i] < 0 || slots[i] >= m->n_slots)
            return arl_errorf(ARL_ERR_STATE,
                              "training (%s device): document %d names slot %d, the model has "
                              "%d",
                              dn, i, slots[i], m->n_slots);
        for (int32_t j = 0; j < i; j++)
            if (slots[j] == slots[i])
                return arl_errorf(ARL_ERR_STATE,
                                  "training (%s device): slot %d appears twice in one forward", dn,
                                  slots[i]);
        int64_t end = m->st_pos[slots[i]] + (b->cu ? b->cu[i + 1] - b->cu[i] : b->T);
        if (m->dm.n_mla > 0 && end > m->max_context)
            return arl_errorf(ARL_ERR_RANGE,
                              "training (%s device): the sequence of slot %d would reach %lld "
                              "positions, the model was set up for %lld (max_context)",
                              dn, slots[i], (long long)end, (long long)m->max_context);
    }
    for (int32_t i = 0; i < N; i++) /* their latent rows (shared slot rows: made, grown) */
        ARL_TRY(arl_model_dev_slot_fit(
            tr->m, slots[i], m->st_pos[slots[i]] + (b->cu ? b->cu[i + 1] - b->cu[i] : b->T)));
    return ARL_OK;
}

static arl_status train_forward(arl_model_dev_train *tr, const arl_batch *b, const int32_t *slots,
                                const arl_forward_out *out) {
    arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = &m->w;
    tr->fwd_done = 0;
    if (out && (out->logits || out->entropy || out->acts))
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "training (%s device): the training forward returns log-probs, "
                          "routes, router scores and expert loads only",
                          ops->name);
    ARL_TRY(arl_model_dev_batch_check(tr->m, b, "training"));
    if (slots) ARL_TRY(state_check(tr, b, slots));
    const int64_t T = b->T, d = dm->d, Tmax = m->opts.max_tokens, Td = T * d, L = dm->L;
    const int64_t k = dm->k, V = dm->V;
    const int32_t N = b->cu ? b->N : 1;
    int32_t cu_one[2] = {0, (int32_t)T};
    const int32_t *cu_host = b->cu ? b->cu : cu_one;
    tr->fwd_state = slots != NULL;
    for (int32_t i = 0; slots && i < N; i++) {
        tr->fwd_slots[i] = slots[i];
        tr->fwd_pos0[i] = m->st_pos[slots[i]];
    }
    seg_docs D = {cu_host, slots ? tr->fwd_slots : NULL, slots ? tr->fwd_pos0 : NULL, 0};
    const int32_t *targets = b->targets ? b->targets : m->no_targets;
    ARL_TRY(ops->upload(m->tokens, b->tokens, sizeof(int32_t) * (size_t)T));
    ARL_TRY(ops->upload(m->cu, cu_host, sizeof(int32_t) * (size_t)(N + 1)));
    ARL_TRY(ops->upload(m->targets, targets, sizeof(int32_t) * (size_t)T));
    if (b->forced_routes && dm->n_moe > 0)
        ARL_TRY(ops->upload(m->forced, b->forced_routes,
                            sizeof(int32_t) * (size_t)(dm->n_moe * T * k)));
    tr->fwd_N = N;
    tr->fwd_T = T;
    tr->fwd_forced = b->forced_routes != NULL;

    /* 2.1 embedding; image rows replace the placeholders (10.1) */
    float *p = tr->res;
    ops->embed(p, w->embed_tokens, m->tokens, T, d, V);
    if (b->media) ARL_TRY(arl_model_dev_media_rows(m, p, b, NULL, NULL));
    dev_rec *recs = tr->layers;
    int32_t nb = 0;
    for (int64_t l = 0; l < L; l++) {
        kb->copy(tr->layer_in + l * Tmax * d, p, Td);
        float *pnew = p;
        if (block_start(m, l)) {
            pnew = tr->res + (nb + 1) * Tmax * d;
            kb->fill(pnew, 0.0f, Td);
        }
        const int64_t mi = m->moe_index[l];
        const int32_t *forced = mi >= 0 && b->forced_routes ? m->forced + mi * T * k : NULL;
        layer_fwd(tr, l, p, pnew, &recs[l], N, T, forced, &D);
        if (block_start(m, l)) {
            nb++;
            p = pnew;
        }
    }

    const float *fin = p;
    if (dm->B > 0) {
        const float *src[ARL_ATTNRES_MAX_SOURCES];
        for (int32_t j = 0; j <= nb; j++)
            src[j] = tr->res + j * Tmax * d;
        ops->attnres_mix_fwd(tr->fin, NULL, src, nb + 1, T, d, w->out_res_norm, w->out_res_proj,
                             m->eps);
        fin = tr->fin;
    }
    kb->rmsnorm_fwd(tr->xf, tr->rstd_f, fin, w->norm, T, d, m->eps);
    for (int64_t t0 = 0; t0 < T; t0 += tr->logit_rows) {
        int64_t n = T - t0 < tr->logit_rows ? T - t0 : tr->logit_rows;
        lin(m, tr->logits, tr->xf + t0 * d, NULL, w->lm_head, n, d, V);
        kb->logprob_fwd(tr->logp + t0, tr->lse + t0, NULL, tr->logits, m->targets + t0, n, V);
    }
    ARL_TRY(ops->sync());
    if (out && out->logprobs)
        ARL_TRY(ops->download(out->logprobs, tr->logp, sizeof(float) * (size_t)T));
    if (out && out->routes)
        for (int64_t l = 0; l < L; l++)
            if (m->moe_index[l] >= 0)
                ARL_TRY(ops->download(out->routes + m->moe_index[l] * T * k, recs[l].moe.sel,
                                      sizeof(int32_t) * (size_t)(T * k)));
    /* the router scores kept for the backward (spec 7.1; Quantile Balancing reads them) and
     * the expert loads of the routes, (n_moe, E): (token, slot) pairs per expert */
    if (out && out->router_scores)
        for (int64_t l = 0; l < L; l++)
            if (m->moe_index[l] >= 0)
                ARL_TRY(ops->download(out->router_scores + m->moe_index[l] * T * dm->E,
                                      recs[l].moe.s, sizeof(float) * (size_t)(T * dm->E)));
    if (out && out->expert_load)
        for (int64_t l = 0; l < L; l++) {
            const int64_t j = m->moe_index[l];
            if (j < 0) continue;
            const int32_t *r = out->routes ? out->routes + j * T * k : m->routes_host;
            if (!out->routes)
                ARL_TRY(ops->download(m->routes_host, recs[l].moe.sel,
                                      sizeof(int32_t) * (size_t)(T * k)));
            int64_t *ld = out->expert_load + j * dm->E;
            memset(ld, 0, sizeof(int64_t) * (size_t)dm->E);
            for (int64_t i = 0; i < T * k; i++)
                ld[r[i]]++;
        }
    for (int32_t i = 0; slots && i < N; i++)
        m->st_pos[slots[i]] += cu_host[i + 1] - cu_host[i];
    tr->fwd_done = 1;
    return ARL_OK;
}

arl_status arl_model_dev_train_forward(arl_model_dev_train *tr, const arl_batch *b,
                                       const arl_forward_out *out) {
    return train_forward(tr, b, NULL, out);
}

arl_status arl_model_dev_train_forward_state(arl_model_dev_train *tr, const arl_batch *b,
                                             const int32_t *slots, const arl_forward_out *out) {
    tr->fwd_done = 0;
    if (!slots)
        return arl_errorf(ARL_ERR_ARG, "training (%s device): a state forward needs slots",
                          tr->m->ops->name);
    return train_forward(tr, b, slots, out);
}

/* ======================= sublayer backwards ============================================== */

/* policy/kda_layer_backward.c arl_kda_layer_bwd (chunkwise rule) as policy/model_backward.c
 * mixer_bwd calls it: after a state forward the initial tails of KDA layer ki (tr->tails0);
 * with the state gradients (dstate) the gradients after the segment are read from the
 * documents' gradient slots and those before it written there. */
static void kda_bwd(arl_model_dev_train *tr, float *dx, const arl_kda_params *gp, const float *dy,
                    const float *x, const arl_kda_params *p, const int32_t *cu, int32_t N,
                    int64_t T, const arl_kda_layer_save *sv, int64_t ki, int dstate) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_kda_layer_cfg *c = &m->kda;
    kda_ws B;
    kda_ws_layout(&B, tr->ws, m, T, N);
    const int64_t d = c->d, H = c->H, dk = c->dk, dv = c->dv, P = H * dk, Pv = H * dv, W = c->W;
    const int64_t sn = H * dk * dv, tl = P * (W - 1), tn = 3 * tl;
    const float scale = 1.0f / sqrtf((float)dk);
    const float *tails0 = tr->fwd_state ? tr->tails0 + ki * (int64_t)m->opts.max_docs * tn : NULL;
    float *dS0 = NULL, *dtails0 = NULL;
    const float *dS_T = NULL, *dtails_T = NULL;
    if (dstate) {
        for (int32_t i = 0; i < N; i++) {
            const float *g = kda_slot(tr->g_kda, m, ki, tr->fwd_slots[i]);
            kb->copy(B.dS_T + i * sn, g, sn);
            kb->copy(B.dtails_T + i * tn, g + sn, tn);
        }
        kb->fill(B.dS0, 0.0f, N * sn);
        kb->fill(B.dtails0, 0.0f, N * tn);
        dS_T = B.dS_T;
        dtails_T = B.dtails_T;
        dS0 = B.dS0;
        dtails0 = B.dtails0;
    }

    kb->linear_bwd_w(gp->o_proj, dy, sv->ob, T, Pv, d);
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, Pv, d, 1.0f, dy, d, p->o_proj, Pv, 0.0f, B.dob, Pv);
    kb->fill(B.d_o, 0.0f, T * Pv);
    kb->fill(B.dgam, 0.0f, T * Pv);
    ops->kda_onorm_bwd(B.d_o, B.dgam, gp->o_norm, B.dob, sv->o, sv->gam, p->o_norm, sv->rstd, T * H,
                       dv);
    if (p->g_proj) {
        kb->linear_bwd_w(gp->g_proj, B.dgam, x, T, d, Pv);
        kb->linear_bwd_x(dx, B.dgam, p->g_proj, T, d, Pv);
    } else {
        kb->linear_bwd_w(gp->g_b, B.dgam, sv->ga, T, dk, Pv);
        kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, dk, Pv, 1.0f, B.dgam, Pv, p->g_b, dk, 0.0f, B.dga,
                 dk);
        kb->linear_bwd_w(gp->g_a, B.dga, x, T, d, dk);
        kb->linear_bwd_x(dx, B.dga, p->g_a, T, d, dk);
    }

    for (int j = 0; j < 3; j++)
        kb->fill(B.dcore[j], 0.0f, T * P);
    kb->fill(B.dg, 0.0f, T * P);
    kb->fill(B.dbeta, 0.0f, T * H);
    ops->kda_chunk_bwd(B.dcore[0], B.dcore[1], B.dcore[2], B.dg, B.dbeta, dS0, B.d_o, dS_T,
                       sv->qkv[0], sv->qkv[1], sv->qkv[2], sv->g, sv->beta, sv->cst, cu, N, T, H,
                       dk, dv, scale, c->chunk, B.core);

    kb->fill(B.dbl, 0.0f, T * H);
    kb->sigmoid_bwd(B.dbl, B.dbeta, sv->bl, T * H);
    kb->linear_bwd_w(gp->b_proj, B.dbl, x, T, d, H);
    kb->linear_bwd_x(dx, B.dbl, p->b_proj, T, d, H);

    kb->fill(B.df, 0.0f, T * P);
    if (c->lower_bound_gate)
        ops->kda_gate_k3_bwd(B.df, gp->A_log, gp->dt_bias, B.dg, sv->f, p->A_log, p->dt_bias, T, H,
                             dk, c->g_min);
    else
        ops->kda_gate_softplus_bwd(B.df, gp->A_log, gp->dt_bias, B.dg, sv->f, p->A_log, p->dt_bias,
                                   T, H, dk);
    kb->linear_bwd_w(gp->f_b, B.df, sv->fa, T, dk, P);
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, dk, P, 1.0f, B.df, P, p->f_b, dk, 0.0f, B.dfa, dk);
    kb->linear_bwd_w(gp->f_a, B.dfa, x, T, d, dk);
    kb->linear_bwd_x(dx, B.dfa, p->f_a, T, d, dk);

    const float *proj[3] = {p->q_proj, p->k_proj, p->v_proj};
    const float *conv[3] = {p->q_conv, p->k_conv, p->v_conv};
    float *gproj[3] = {gp->q_proj, gp->k_proj, gp->v_proj};
    float *gconv[3] = {gp->q_conv, gp->k_conv, gp->v_conv};
    for (int j = 0; j < 3; j++) {
        const float *dzj = B.dcore[j];
        if (j < 2) {
            kb->fill(B.dz, 0.0f, T * P);
            kb->l2norm_bwd(B.dz, B.dcore[j], sv->z[j], sv->rn[j], T * H, dk);
            dzj = B.dz;
        }
        const float *tin = NULL;
        if (tails0 && tl > 0) {
            gather_proj(kb, B.tin + (int64_t)j * N * tl, tails0, j, N, tl);
            tin = B.tin + (int64_t)j * N * tl;
        }
        kb->fill(B.dpre, 0.0f, T * P);
        ops->kda_conv_bwd(B.dpre, gconv[j], dzj, sv->pre[j], conv[j], tin, cu, N, T, P, W);
        if (tl > 0 && dstate) {
            kb->fill(B.dtail, 0.0f, (int64_t)N * tl);
            ops->kda_conv_tail_bwd(B.dtail, dzj, sv->pre[j], conv[j], tin, cu, N, T, P, W);
            gather_proj(kb, B.dtail_out, dtails_T, j, N, tl);
            ops->kda_conv_tail_out_bwd(B.dpre, B.dtail, B.dtail_out, cu, N, T, P, W);
            for (int32_t i = 0; i < N; i++)
                kb->add(dtails0 + (i * 3 + j) * tl, dtails0 + (i * 3 + j) * tl, B.dtail + i * tl,
                        tl);
        }
        kb->linear_bwd_w(gproj[j], B.dpre, x, T, d, P);
        kb->linear_bwd_x(dx, B.dpre, proj[j], T, d, P);
    }
    if (dstate)
        for (int32_t i = 0; i < N; i++) {
            float *g = kda_slot(tr->g_kda, m, ki, tr->fwd_slots[i]);
            kb->copy(g, dS0 + i * sn, sn);
            kb->copy(g + sn, dtails0 + i * tn, tn);
        }
}

/* policy/mla_layer_backward.c arl_mla_layer_bwd as policy/model_backward.c mixer_bwd calls it:
 * the expanded form, or the absorbed one (dense or block-sparse) over the slots' rows of MLA
 * layer mi or the fresh documents' own; with
 * the state gradients (dstate) the gradient of the new rows after the segment is read from the
 * documents' gradient slots and that of the prefix rows added there. */
static void mla_bwd(arl_model_dev_train *tr, float *dx, const arl_mla_params *gp, const float *dy,
                    const float *x, const arl_mla_params *p, const int32_t *cu, int32_t N,
                    int64_t T, const arl_mla_layer_save *sv, const int32_t *cu_host, int64_t mi,
                    int dstate) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_mla_layer_cfg *c = &m->mla;
    mla_ws B;
    mla_ws_layout(&B, tr->ws, m, T);
    const int64_t d = c->d, Hm = c->Hm, n = c->n, r = c->r, vm = c->vm, rkv = c->rkv;
    const int64_t R = rkv + r, Pv = Hm * vm;
    const float scale = 1.0f / sqrtf((float)(n + r));

    const float *u = p->g_proj ? sv->u : sv->o;
    kb->linear_bwd_w(gp->o_proj, dy, u, T, Pv, d);
    kb->fill(B.du, 0.0f, T * Pv);
    kb->linear_bwd_x(B.du, dy, p->o_proj, T, Pv, d);
    const float *d_o = B.du;
    if (p->g_proj) {
        kb->sigmoid_fwd(B.tmp, sv->gam, T * Pv);
        kb->mul(B.d_o, B.du, B.tmp, T * Pv);
        kb->mul(B.tmp, B.du, sv->o, T * Pv);
        kb->fill(B.dgam, 0.0f, T * Pv);
        kb->sigmoid_bwd(B.dgam, B.tmp, sv->gam, T * Pv);
        kb->linear_bwd_w(gp->g_proj, B.dgam, x, T, d, Pv);
        kb->linear_bwd_x(dx, B.dgam, p->g_proj, T, d, Pv);
        d_o = B.d_o;
    }

    kb->fill(B.dq_nope, 0.0f, T * Hm * n);
    kb->fill(B.dq_pe, 0.0f, T * Hm * r);
    kb->fill(B.dc, 0.0f, T * rkv);
    kb->fill(B.dk_pe, 0.0f, T * r);
    if (!sv->absorbed) {
        kb->fill(B.dk_nope, 0.0f, T * Hm * n);
        kb->fill(B.dv, 0.0f, T * Pv);
        ops->mla_attn_bwd(B.dq_nope, B.dq_pe, B.dk_nope, B.dk_pe, B.dv, d_o, sv->o, sv->lse,
                          sv->q_nope, sv->q_pe, sv->k_nope, sv->k_pe, sv->v, cu, N, T, Hm, n, r, vm,
                          scale, B.attn);
        ops->copy_rows(B.dkv, n + vm, B.dk_nope, n, T * Hm, n);
        ops->copy_rows(B.dkv + n, n + vm, B.dv, vm, T * Hm, vm);
        kb->linear_bwd_w(gp->kv_b, B.dkv, sv->c, T, rkv, Hm * (n + vm));
        kb->linear_bwd_x(B.dc, B.dkv, p->kv_b, T, rkv, Hm * (n + vm));
    } else {
        /* o = W_UV^h ohat per head: dohat = do W_UV^h, dW_UV^h += do^T ohat */
        kb->fill(B.dohat, 0.0f, T * Hm * rkv);
        for (int64_t h = 0; h < Hm; h++) {
            const float *Wuv = p->kv_b + (h * (n + vm) + n) * rkv;
            kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, rkv, vm, 1.0f, d_o + h * vm, Pv, Wuv, rkv,
                     0.0f, B.dohat + h * rkv, Hm * rkv);
            kb->gemm(ARL_K_TRANS, ARL_K_NOTRANS, vm, rkv, T, 1.0f, d_o + h * vm, Pv,
                     sv->ohat + h * rkv, Hm * rkv, 1.0f, gp->kv_b + (h * (n + vm) + n) * rkv, rkv);
        }
        kb->fill(B.dqhat, 0.0f, T * Hm * rkv);
        kb->fill(B.dlat, 0.0f, T * R);
        for (int32_t i = 0; i < N; i++) {
            int64_t a = cu_host[i], len = cu_host[i + 1] - a;
            float *dpre = dstate ? lat_slot(tr->g_lat, m, mi, tr->fwd_slots[i]) : NULL;
            const int st = tr->fwd_state;
            const float *rows = st ? lat_slot(m->st_lat, m, mi, tr->fwd_slots[i]) : sv->lat + a * R;
            const int64_t p0 = st ? tr->fwd_pos0[i] : 0;
            if (c->sparse_topk > 0)
                ops->mla_sparse_bwd(B.dqhat + a * Hm * rkv, B.dq_pe + a * Hm * r, B.dlat + a * R,
                                    dpre, B.dohat + a * Hm * rkv, sv->ohat + a * Hm * rkv,
                                    sv->lse + a * Hm, sv->sel + a * Hm * c->sparse_topk,
                                    sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r, rows, p0, len,
                                    Hm, rkv, r, scale, c->sparse_chunk, c->sparse_topk, B.abs);
            else
                ops->mla_abs_bwd(B.dqhat + a * Hm * rkv, B.dq_pe + a * Hm * r, B.dlat + a * R, dpre,
                                 B.dohat + a * Hm * rkv, sv->ohat + a * Hm * rkv, sv->lse + a * Hm,
                                 sv->qhat + a * Hm * rkv, sv->q_pe + a * Hm * r, rows, p0, len, Hm,
                                 rkv, r, scale, B.abs);
        }
        ops->copy_rows(B.dc, rkv, B.dlat, R, T, rkv);
        ops->copy_rows(B.dk_pe, r, B.dlat + rkv, R, T, r);
        /* qhat = W_UK^h^T q_nope: dq_nope = dqhat W_UK^h^T, dW_UK^h += q_nope^T dqhat */
        for (int64_t h = 0; h < Hm; h++) {
            const float *Wuk = p->kv_b + h * (n + vm) * rkv;
            kb->gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, n, rkv, 1.0f, B.dqhat + h * rkv, Hm * rkv, Wuk,
                     rkv, 1.0f, B.dq_nope + h * n, Hm * n);
            kb->gemm(ARL_K_TRANS, ARL_K_NOTRANS, n, rkv, T, 1.0f, sv->q_nope + h * n, Hm * n,
                     B.dqhat + h * rkv, Hm * rkv, 1.0f, gp->kv_b + h * (n + vm) * rkv, rkv);
        }
    }
    if (dstate) { /* the gradient of the new rows after the segment */
        for (int32_t i = 0; i < N; i++) {
            int64_t a = cu_host[i], len = cu_host[i + 1] - a;
            kb->copy(B.dlat_T + a * R,
                     lat_slot(tr->g_lat, m, mi, tr->fwd_slots[i]) + tr->fwd_pos0[i] * R, len * R);
        }
        ops->copy_rows(B.dpart, rkv, B.dlat_T, R, T, rkv);
        kb->add(B.dc, B.dc, B.dpart, T * rkv);
        ops->copy_rows(B.dpart, r, B.dlat_T + rkv, R, T, r);
        kb->add(B.dk_pe, B.dk_pe, B.dpart, T * r);
    }

    kb->fill(B.dc_pre, 0.0f, T * rkv);
    kb->rmsnorm_bwd(B.dc_pre, gp->kv_a_norm, B.dc, sv->c_pre, p->kv_a_norm, sv->rstd_c, T, rkv);
    ops->copy_rows(B.dckv, R, B.dc_pre, rkv, T, rkv);
    ops->copy_rows(B.dckv + rkv, R, B.dk_pe, r, T, r);
    kb->linear_bwd_w(gp->kv_a, B.dckv, x, T, d, R);
    kb->linear_bwd_x(dx, B.dckv, p->kv_a, T, d, R);

    ops->copy_rows(B.dqf, n + r, B.dq_nope, n, T * Hm, n);
    ops->copy_rows(B.dqf + n, n + r, B.dq_pe, r, T * Hm, r);
    if (p->q_a) {
        kb->linear_bwd_w(gp->q_b, B.dqf, sv->cq, T, c->rq, Hm * (n + r));
        kb->fill(B.dcq, 0.0f, T * c->rq);
        kb->linear_bwd_x(B.dcq, B.dqf, p->q_b, T, c->rq, Hm * (n + r));
        kb->fill(B.dcq_pre, 0.0f, T * c->rq);
        kb->rmsnorm_bwd(B.dcq_pre, gp->q_a_norm, B.dcq, sv->cq_pre, p->q_a_norm, sv->rstd_q, T,
                        c->rq);
        kb->linear_bwd_w(gp->q_a, B.dcq_pre, x, T, d, c->rq);
        kb->linear_bwd_x(dx, B.dcq_pre, p->q_a, T, d, c->rq);
    } else {
        kb->linear_bwd_w(gp->q_proj, B.dqf, x, T, d, Hm * (n + r));
        kb->linear_bwd_x(dx, B.dqf, p->q_proj, T, d, Hm * (n + r));
    }
}

/* policy/moe_backward.c glu_bwd. */
static void glu_bwd(const arl_model_dev *m, float *dx, float dx_beta, float *dWg, float *dWu,
                    float *dWd, const float *dy, const float *x, const float *Wg, const float *Wu,
                    const float *Wd, int64_t T, int64_t in, int64_t fw, int64_t out,
                    const float *gu, const float *h, float *dh, float *dgu) {
    const arl_k_backend *kb = m->kb;
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, fw, out, 1.0f, dy, out, Wd, fw, 0.0f, dh, fw);
    kb->gemm(ARL_K_TRANS, ARL_K_NOTRANS, out, fw, T, 1.0f, dy, out, h, fw, 1.0f, dWd, fw);
    kb->fill(dgu, 0.0f, T * 2 * fw);
    if (m->act.situ)
        kb->situ_glu_bwd(dgu, dgu + fw, dh, gu, gu + fw, T, fw, 2 * fw, m->act.beta1, m->act.beta2);
    else
        kb->swiglu_bwd(dgu, dgu + fw, dh, gu, gu + fw, T, fw, 2 * fw);
    kb->gemm(ARL_K_TRANS, ARL_K_NOTRANS, fw, in, T, 1.0f, dgu, 2 * fw, x, in, 1.0f, dWg, in);
    kb->gemm(ARL_K_TRANS, ARL_K_NOTRANS, fw, in, T, 1.0f, dgu + fw, 2 * fw, x, in, 1.0f, dWu, in);
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, fw, 1.0f, dgu, 2 * fw, Wg, in, dx_beta, dx, in);
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, in, fw, 1.0f, dgu + fw, 2 * fw, Wu, in, 1.0f, dx, in);
}

/* policy/moe_backward.c arl_moe_bwd. */
static void moe_bwd(arl_model_dev_train *tr, float *dx, const arl_moe_params *gp, const float *dy,
                    const float *x, const arl_moe_params *p, int64_t T, const moe_sv *sv) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_moe_cfg *c = &m->moe;
    const int64_t d = c->d, E = c->E, k = c->k, dz = c->dz;
    ffn_ws B;
    ffn_ws_layout(&B, tr->ws, m, T);

    kb->linear_bwd_w(gp->up_proj, dy, sv->u, T, dz, d);
    kb->gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, T, dz, d, 1.0f, dy, d, p->up_proj, dz, 0.0f, B.dun, dz);
    const float *du = B.dun;
    if (p->latent_norm) {
        kb->fill(B.du, 0.0f, T * dz);
        kb->rmsnorm_bwd(B.du, gp->latent_norm, B.dun, sv->u_pre, p->latent_norm, sv->rstd, T, dz);
        du = B.du;
    }
    if (c->fs > 0 && p->shared_gate_proj)
        glu_bwd(m, dx, 1.0f, gp->shared_gate_proj, gp->shared_up_proj, gp->shared_down_proj, dy, x,
                p->shared_gate_proj, p->shared_up_proj, p->shared_down_proj, T, d, c->fs, d,
                sv->sgu, sv->sh, B.dh, B.dgu);
    const uint16_t *banks[3];
    ops->moe_experts_bwd(B.dz, B.dp, gp, du, sv->sel, sv->pw, p,
                         arl_model_dev_expert_banks(m, p, banks), c, T, sv->esave, B.experts);
    kb->linear_bwd_w(gp->down_proj, B.dz, x, T, d, dz);
    kb->linear_bwd_x(dx, B.dz, p->down_proj, T, d, dz);
    ops->router_bwd(dx, gp->gate, B.dp, x, p->gate, sv->s, sv->sel, T, d, E, k, c->rho, B.router);
}

/* ======================= the backward ==================================================== */

/* policy/model_backward.c head_bwd: lm_head, log-softmax, final norm and mix. */
static void head_bwd(arl_model_dev_train *tr, const arl_batch *b, const float *dlogp_host) {
    const arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = &m->w;
    const arl_model_params *g = &tr->g;
    const int64_t T = b->T, d = dm->d, V = dm->V, Tmax = m->opts.max_tokens;
    float *dxf = tr->dx;
    kb->fill(dxf, 0.0f, T * d);
    for (int64_t t0 = 0; t0 < T; t0 += tr->logit_rows) {
        int64_t n = T - t0 < tr->logit_rows ? T - t0 : tr->logit_rows;
        int any = 0;
        for (int64_t t = t0; t < t0 + n; t++)
            any |= b->targets[t] >= 0 && dlogp_host[t] != 0.0f;
        if (!any) continue;
        lin(m, tr->logits, tr->xf + t0 * d, NULL, w->lm_head, n, d, V);
        kb->fill(tr->dlogits, 0.0f, n * V);
        kb->logprob_bwd(tr->dlogits, tr->dlogp + t0, tr->logits, tr->lse + t0, m->targets + t0, n,
                        V);
        kb->linear_bwd_w(g->lm_head, tr->dlogits, tr->xf + t0 * d, n, d, V);
        kb->linear_bwd_x(dxf + t0 * d, tr->dlogits, w->lm_head, n, d, V);
    }
    const int32_t nb = m->n_blocks;
    const float *fin = dm->B > 0 ? tr->fin : tr->res + nb * Tmax * d;
    float *dfin = tr->dmix;
    kb->fill(dfin, 0.0f, T * d);
    kb->rmsnorm_bwd(dfin, g->norm, dxf, fin, w->norm, tr->rstd_f, T, d);
    if (dm->B > 0) {
        const float *src[ARL_ATTNRES_MAX_SOURCES];
        float *dsrc[ARL_ATTNRES_MAX_SOURCES];
        for (int32_t j = 0; j < nb; j++) {
            src[j] = tr->res + j * Tmax * d;
            dsrc[j] = tr->d_res + j * Tmax * d;
        }
        src[nb] = tr->res + nb * Tmax * d;
        dsrc[nb] = tr->dp;
        ops->attnres_mix_bwd(dsrc, g->out_res_norm, g->out_res_proj, dfin, src, nb + 1, T, d,
                             w->out_res_norm, w->out_res_proj, m->eps, tr->mix_ws);
    } else {
        kb->add(tr->dp, tr->dp, dfin, T * d);
    }
}

static arl_status backward(arl_model_dev_train *tr, const arl_batch *b, const float *dlogp,
                           int dstate, float *dmedia) {
    arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_k_backend *kb = m->kb;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = &m->w;
    const arl_model_params *grads = &tr->g;
    if (!tr->fwd_done)
        return arl_errorf(ARL_ERR_STATE,
                          "training (%s device): backward without a forward (or the forward "
                          "failed)",
                          ops->name);
    const int32_t N = b->cu ? b->N : 1;
    if (b->T != tr->fwd_T || N != tr->fwd_N)
        return arl_errorf(ARL_ERR_ARG,
                          "training (%s device): backward over %lld tokens in %d documents, the "
                          "forward had %lld in %d",
                          ops->name, (long long)b->T, N, (long long)tr->fwd_T, tr->fwd_N);
    if (!b->targets || !dlogp)
        return arl_errorf(ARL_ERR_ARG, "training (%s device): the backward needs targets and dlogp",
                          ops->name);
    int32_t cu_one[2] = {0, (int32_t)b->T};
    const int32_t *cu_host = b->cu ? b->cu : cu_one;
    if (dstate) {
        if (!tr->fwd_state)
            return arl_errorf(ARL_ERR_ARG,
                              "training (%s device): a state gradient needs a forward from "
                              "decode states (arl_model_dev_train_forward_state)",
                              ops->name);
        if (!tr->g_pos)
            return arl_errorf(ARL_ERR_STATE,
                              "training (%s device): no state-gradient slots; call "
                              "arl_model_dev_state_grads_init first",
                              ops->name);
        for (int32_t i = 0; i < N; i++) {
            int32_t s = tr->fwd_slots[i];
            int64_t want = tr->fwd_pos0[i] + cu_host[i + 1] - cu_host[i];
            if (tr->g_pos[s] != want)
                return arl_errorf(ARL_ERR_STATE,
                                  "training (%s device): state-gradient slot %d is at position "
                                  "%lld, the end of the segment is %lld; prepare it with "
                                  "arl_model_dev_state_grad_prepare (or upload it)",
                                  ops->name, s, (long long)tr->g_pos[s], (long long)want);
        }
    }
    const int64_t T = b->T, d = dm->d, Td = T * d, Tmax = m->opts.max_tokens, L = dm->L;
    ARL_TRY(ops->upload(tr->dlogp, dlogp, sizeof(float) * (size_t)T));
    ARL_TRY(ops->upload(m->targets, b->targets, sizeof(int32_t) * (size_t)T));
    const int32_t *cu = m->cu; /* uploaded by the forward */
    dev_rec *recs = tr->layers;

    kb->fill(tr->dp, 0.0f, Td);
    for (int32_t j = 0; j + 1 < tr->n_res; j++)
        kb->fill(tr->d_res + j * Tmax * d, 0.0f, Td);
    head_bwd(tr, b, dlogp);

    const float *src[ARL_ATTNRES_MAX_SOURCES];
    float *dsrc[ARL_ATTNRES_MAX_SOURCES];
    for (int64_t l = L - 1; l >= 0; l--) {
        const arl_layer_params *lp = &w->layers[l];
        const arl_layer_params *gl = &grads->layers[l];
        if (m->dopts.train_checkpoint) layer_recompute(tr, l, cu_host);
        const dev_rec *rec = &recs[l];
        const int32_t nbl = entries_before(m, l), nb_after = nbl + block_start(m, l);
        const float *p_in = tr->layer_in + l * Tmax * d;

        /* FFN */
        kb->fill(tr->dx, 0.0f, Td);
        if (lp->is_moe) {
            moe_bwd(tr, tr->dx, &gl->moe, tr->dp, rec->x2, &lp->moe, T, &rec->moe);
        } else {
            ffn_ws B;
            ffn_ws_layout(&B, tr->ws, m, T);
            glu_bwd(m, tr->dx, 1.0f, gl->dense.gate_proj, gl->dense.up_proj, gl->dense.down_proj,
                    tr->dp, rec->x2, lp->dense.gate_proj, lp->dense.up_proj, lp->dense.down_proj, T,
                    d, dm->fd, d, rec->dense.gu, rec->dense.h, B.dh, B.dgu);
        }
        kb->fill(tr->dmix, 0.0f, Td);
        kb->rmsnorm_bwd(tr->dmix, gl->post_norm, tr->dx, dm->B > 0 ? rec->mfx : rec->p_mid,
                        lp->post_norm, rec->rstd2, T, d);
        if (dm->B > 0) {
            for (int32_t j = 0; j < nb_after; j++) {
                src[j] = tr->res + j * Tmax * d;
                dsrc[j] = tr->d_res + j * Tmax * d;
            }
            src[nb_after] = rec->p_mid;
            dsrc[nb_after] = tr->dp;
            ops->attnres_mix_bwd(dsrc, gl->mlp_res_norm, gl->mlp_res_proj, tr->dmix, src,
                                 nb_after + 1, T, d, lp->mlp_res_norm, lp->mlp_res_proj, m->eps,
                                 tr->mix_ws);
        } else {
            kb->add(tr->dp, tr->dp, tr->dmix, Td);
        }

        /* mixer */
        kb->fill(tr->dx, 0.0f, Td);
        if (lp->kind == ARL_LAYER_KDA)
            kda_bwd(tr, tr->dx, &gl->kda, tr->dp, rec->x1, &lp->kda, cu, N, T, &rec->kda,
                    kind_index(m, l), dstate);
        else
            mla_bwd(tr, tr->dx, &gl->mla, tr->dp, rec->x1, &lp->mla, cu, N, T, &rec->mla, cu_host,
                    kind_index(m, l), dstate);
        kb->fill(tr->dmix, 0.0f, Td);
        const float *h = dm->B > 0 && nbl > 0 ? rec->h : p_in;
        kb->rmsnorm_bwd(tr->dmix, gl->input_norm, tr->dx, h, lp->input_norm, rec->rstd1, T, d);

        /* 5.4: at a block start p was reset, so the old p is the snapshot entry */
        if (block_start(m, l)) kb->copy(tr->dp, tr->d_res + nbl * Tmax * d, Td);
        if (dm->B == 0 || nbl == 0) {
            kb->add(tr->dp, tr->dp, tr->dmix, Td);
        } else {
            for (int32_t j = 0; j < nbl; j++) {
                src[j] = tr->res + j * Tmax * d;
                dsrc[j] = tr->d_res + j * Tmax * d;
            }
            src[nbl] = p_in;
            dsrc[nbl] = tr->dp;
            ops->attnres_mix_bwd(dsrc, gl->attn_res_norm, gl->attn_res_proj, tr->dmix, src, nbl + 1,
                                 T, d, lp->attn_res_norm, lp->attn_res_proj, m->eps, tr->mix_ws);
        }
    }
    /* dp is now the gradient of the embedded rows: the image rows' go to dmedia (and are
     * zeroed, so that the placeholders' embedding row gets nothing), the rest to the table */
    if (b->media) ARL_TRY(arl_model_dev_media_rows(m, tr->dp, b, dmedia, tr->media_host));
    ops->embed_bwd(grads->embed_tokens, tr->dp, m->tokens, T, d, dm->V, tr->ws);
    ARL_TRY(ops->sync());
    if (dstate)
        for (int32_t i = 0; i < N; i++)
            tr->g_pos[tr->fwd_slots[i]] = tr->fwd_pos0[i];
    return ARL_OK;
}

arl_status arl_model_dev_backward(arl_model_dev_train *tr, const arl_batch *b, const float *dlogp) {
    return backward(tr, b, dlogp, 0, NULL);
}

arl_status arl_model_dev_backward_media(arl_model_dev_train *tr, const arl_batch *b,
                                        const float *dlogp, float *dmedia) {
    return backward(tr, b, dlogp, 0, dmedia);
}

arl_status arl_model_dev_backward_state(arl_model_dev_train *tr, const arl_batch *b,
                                        const float *dlogp) {
    return backward(tr, b, dlogp, 1, NULL);
}

/* ======================= state gradients ================================================= */

arl_status arl_model_dev_state_grads_init(arl_model_dev_train *tr) {
    arl_model_dev *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    if (tr->g_pos) return ARL_OK;
    if (m->n_slots <= 0)
        return arl_errorf(ARL_ERR_STATE,
                          "training (%s device): the model has no decode slots (dopts.n_slots)",
                          m->ops->name);
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    const int64_t R = dm->rkv + dm->r;
    bump w = {NULL, 0};
    take(&w, dm->n_kda * m->n_slots * (sn + tn));
    take(&w, dm->n_mla * m->lat_rows * R);
    tr->g_pos = calloc((size_t)m->n_slots, sizeof(int64_t));
    if (!tr->g_pos)
        return arl_errorf(ARL_ERR_NOMEM, "training (%s device): state-gradient table",
                          m->ops->name);
    arl_status s = m->ops->mem_alloc((size_t)w.used * sizeof(float), "the state gradients",
                                     &tr->garena, &tr->garena_token);
    if (s) {
        arl_error_prefix(s, "training (%s device, %lld bytes of state gradients)", m->ops->name,
                         (long long)(w.used * 4));
        free(tr->g_pos);
        tr->g_pos = NULL;
        tr->garena = NULL;
        return s;
    }
    w = (bump){(float *)tr->garena, 0};
    tr->g_kda = take(&w, dm->n_kda * m->n_slots * (sn + tn));
    tr->g_lat = take(&w, dm->n_mla * m->lat_rows * R);
    m->lat_twin = tr->g_lat; /* moved with the slots' rows (shared slot rows) */
    m->kb->fill((float *)tr->garena, 0.0f, w.used);
    return m->ops->sync();
}

static arl_status gslot_check(const arl_model_dev_train *tr, int32_t slot, const char *what) {
    if (!tr->g_pos)
        return arl_errorf(ARL_ERR_STATE,
                          "%s (%s device): no state-gradient slots; call "
                          "arl_model_dev_state_grads_init first",
                          what, tr->m->ops->name);
    if (slot < 0 || slot >= tr->m->n_slots)
        return arl_errorf(ARL_ERR_RANGE, "%s (%s device): slot %d outside [0, %d)", what,
                          tr->m->ops->name, slot, tr->m->n_slots);
    return ARL_OK;
}

arl_status arl_model_dev_state_grad_prepare(arl_model_dev_train *tr, int32_t slot,
                                            int64_t position) {
    ARL_TRY(gslot_check(tr, slot, "state-gradient prepare"));
    arl_model_dev *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    if (position < 0 || (dm->n_mla > 0 && position > m->max_context))
        return arl_errorf(ARL_ERR_RANGE,
                          "state-gradient prepare (%s device): position %lld outside [0, %lld] "
                          "(max_context)",
                          m->ops->name, (long long)position, (long long)m->max_context);
    ARL_TRY(arl_model_dev_slot_fit(m, slot, position));
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    for (int64_t j = 0; j < dm->n_kda; j++)
        m->kb->fill(kda_slot(tr->g_kda, m, j, slot), 0.0f, sn + tn);
    for (int64_t j = 0; j < dm->n_mla && position > 0; j++)
        m->kb->fill(lat_slot(tr->g_lat, m, j, slot), 0.0f, position * (dm->rkv + dm->r));
    tr->g_pos[slot] = position;
    return m->ops->sync();
}

int64_t arl_model_dev_state_grad_pos(const arl_model_dev_train *tr, int32_t slot) {
    return tr->g_pos && slot >= 0 && slot < tr->m->n_slots ? tr->g_pos[slot] : -1;
}

/* The gradient slots have the layout of the model's slots (policy/model_device.h st_kda,
 * st_lat, st_pos; the same row ranges), so the model's slot transfers serve them: the model's
 * slot pointers are pointed at the gradient storage for the call, and the caches at lat_twin
 * (an upload may move the ranges: both arrays move) (one thread uses a model at a time). */
static arl_status grad_xfer(arl_model_dev_train *tr, int32_t slot, arl_decode_state *g,
                            const arl_decode_state *gc, int32_t hslot, const char *what) {
    ARL_TRY(gslot_check(tr, slot, what));
    arl_model_dev *m = tr->m;
    float *kda = m->st_kda, *lat = m->st_lat, *twin = m->lat_twin;
    int64_t *pos = m->st_pos;
    m->st_kda = tr->g_kda;
    m->st_lat = tr->g_lat;
    m->st_pos = tr->g_pos;
    m->lat_twin = lat;
    arl_status s = g ? arl_model_dev_slot_download(m, slot, g, hslot, 0)
                     : arl_model_dev_slot_upload(m, slot, gc, hslot);
    m->st_kda = kda;
    m->st_lat = lat;
    m->st_pos = pos;
    m->lat_twin = twin;
    if (s) arl_error_prefix(s, "%s", what);
    return s;
}

arl_status arl_model_dev_state_grad_upload(arl_model_dev_train *tr, int32_t slot,
                                           const arl_decode_state *g, int32_t hslot) {
    return grad_xfer(tr, slot, NULL, g, hslot, "state-gradient upload");
}

arl_status arl_model_dev_state_grad_download(arl_model_dev_train *tr, int32_t slot,
                                             arl_decode_state *g, int32_t hslot) {
    return grad_xfer(tr, slot, g, NULL, hslot, "state-gradient download");
}

/* ======================= losses ========================================================== */

arl_status arl_model_dev_loss_and_grad(arl_model_dev_train *tr, const arl_batch *b, double *loss) {
    *loss = 0.0;
    ARL_TRY(arl_model_dev_batch_check(tr->m, b, "training"));
    const int64_t T = b->T;
    const int32_t *targets = b->targets;
    if (!targets) {
        arl_batch_next_token_targets(tr->targets_host, b->tokens, b->cu, b->cu ? b->N : 1, T);
        targets = tr->targets_host;
    }
    int64_t count = 0;
    for (int64_t t = 0; t < T; t++)
        count += targets[t] >= 0;
    const double scale = count ? 1.0 / (double)count : 0.0;
    arl_batch bt = *b;
    bt.targets = targets;
    arl_forward_out o = {.logprobs = tr->logp_host};
    ARL_TRY(arl_model_dev_train_forward(tr, &bt, &o));
    double sum = 0.0;
    for (int64_t t = 0; t < T; t++) {
        int on = targets[t] >= 0;
        if (on) sum -= (double)tr->logp_host[t];
        tr->dlogp_host[t] = on ? (float)(-scale) : 0.0f;
    }
    ARL_TRY(arl_model_dev_backward(tr, &bt, tr->dlogp_host));
    *loss = count ? sum / (double)count : 0.0;
    return ARL_OK;
}

/* ======================= AdamW (policy/optimizer.c arl_adamw_step) ======================= */

arl_status arl_model_dev_optim_step(arl_model_dev_train *tr, arl_optim_report *rep) {
    arl_model_dev *m = tr->m;
    const arl_dev_ops *ops = m->ops;
    const arl_optim_config *c = &tr->ocfg;
    ops->grad_sumsq(tr->sumsq, tr->grads, tr->ranges, tr->n_chunks);
    ARL_TRY(ops->sync());
    ARL_TRY(ops->download(tr->sumsq_host, tr->sumsq, sizeof(double) * (size_t)tr->n_chunks));
    double total = 0;
    for (int64_t k = 0; k < tr->n_chunks; k++)
        total += tr->sumsq_host[k];
    double norm = sqrt(total);
    if (!isfinite(norm)) {
        const char *name = "?";
        for (int64_t k = 0; k < tr->n_chunks; k++)
            if (!isfinite(tr->sumsq_host[k])) {
                name = tr->tensor_name[tr->chunk_tensor[k]];
                break;
            }
        return arl_errorf(ARL_ERR_RANGE,
                          "optimizer step %lld (%s device): the gradient norm is not finite (%g); "
                          "first tensor with a non-finite gradient: %s; the step was skipped and "
                          "no parameter changed",
                          (long long)tr->step, ops->name, norm, name);
    }
    double coef, lr;
    arl_cuda_adamw_hp hp;
    arl_optim_step_scalars(&hp, &coef, &lr, c, tr->step, norm);
    for (int64_t r = 0; r < tr->n_runs; r++) {
        int64_t a = tr->run_begin[r];
        /* the bf16 copies of the updated weights in the same pass; the weights outside the
         * runs (not trained) keep theirs, made when the weights were uploaded */
        ops->adamw_update(m->weights + a, m->wb16 ? m->wb16 + a : NULL, tr->mom_m + a,
                          tr->mom_v + a, tr->grads + a, tr->run_len[r], tr->run_decay[r], &hp);
    }
    ARL_TRY(ops->sync());
    if (rep) {
        rep->grad_norm = norm;
        rep->clip_coef = coef;
        rep->lr = lr;
        rep->step = tr->step;
    }
    tr->step++;
    return ARL_OK;
}

arl_status arl_model_dev_train_step(arl_model_dev_train *tr, const arl_batch *b, double *loss,
                                    arl_optim_report *rep) {
    ARL_TRY(arl_model_dev_zero_grad(tr));
    ARL_TRY(arl_model_dev_loss_and_grad(tr, b, loss));
    return arl_model_dev_optim_step(tr, rep);
}

/* ======================= downloads ======================================================= */

arl_status arl_model_dev_grads_download(const arl_model_dev_train *tr, float *host) {
    ARL_TRY(tr->m->ops->sync());
    return tr->m->ops->download(host, tr->grads, sizeof(float) * (size_t)tr->m->weight_floats);
}

arl_status arl_model_dev_params_download(const arl_model_dev_train *tr, float *host) {
    ARL_TRY(tr->m->ops->sync());
    return tr->m->ops->download(host, tr->m->weights, sizeof(float) * (size_t)tr->m->weight_floats);
}

arl_status arl_model_dev_moments_download(const arl_model_dev_train *tr, float *mh, float *vh) {
    const size_t bytes = sizeof(float) * (size_t)tr->m->weight_floats;
    ARL_TRY(tr->m->ops->sync());
    if (mh) ARL_TRY(tr->m->ops->download(mh, tr->mom_m, bytes));
    if (vh) ARL_TRY(tr->m->ops->download(vh, tr->mom_v, bytes));
    return ARL_OK;
}

arl_status arl_model_dev_moments_upload(arl_model_dev_train *tr, const float *mh, const float *vh,
                                        int64_t step) {
    const size_t bytes = sizeof(float) * (size_t)tr->m->weight_floats;
    ARL_TRY(tr->m->ops->upload(tr->mom_m, mh, bytes));
    ARL_TRY(tr->m->ops->upload(tr->mom_v, vh, bytes));
    tr->step = step;
    return ARL_OK;
}
