/* policy/model_backward.c: the training forward and the backward of the whole policy, fp32 (see
 * policy/model_backward.h).
 *
 * Reading order: the arena layout; layer_fwd (one decoder layer, the forward of
 * policy/model.c model_run step for step, keeping intermediates); arl_model_train_forward;
 * head_bwd (lm_head, log-softmax, final norm and mix); arl_model_backward, which follows the
 * bookkeeping of spec/policy.md 5.4 line by line; the convenience losses.
 */
#include "policy/model_backward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/attnres.h"
#include "policy/kda.h"
#include "policy/safetensors.h"
#include "policy/vision.h"

/* Rows of logits computed at a time: about 4 MiB (as policy/model.c). */
#define LOGIT_BLOCK_FLOATS ((int64_t)1 << 20)

void arl_train_opts_default(arl_train_opts *o) {
    memset(o, 0, sizeof *o);
}

/* ---- arena layout ---- */

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

static int64_t max2(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static int64_t kda_state_floats(const arl_model_dims *dm) {
    return dm->H * dm->dk * dm->dv + 3 * dm->P * (dm->W - 1);
}

static int64_t layer_index(const arl_model_config *cfg, int64_t l, arl_layer_kind kind) {
    int64_t i = 0;
    for (int64_t j = 0; j < l; j++)
        i += arl_model_config_layer_kind(cfg, j) == kind;
    return i;
}

/* Bind one layer record at w: the layer-level buffers, then the mixer and FFN save areas of the
 * given kinds (kind < 0: the largest of both kinds, with both views bound at the same base). */
static void rec_layout(arl_layer_rec *r, ws_bump *w, const arl_model *m, int mixer_kind,
                       int ffn_moe) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = m->opts.max_tokens, d = dm->d;
    const int32_t N = m->opts.max_docs;
    arl_layer_rec tmp;
    if (!r) r = &tmp;
    r->h = take(w, T * d);
    r->x1 = take(w, T * d);
    r->rstd1 = take(w, T);
    r->p_mid = take(w, T * d);
    r->mfx = take(w, T * d);
    r->x2 = take(w, T * d);
    r->rstd2 = take(w, T);
    int64_t kn = dm->n_kda ? arl_kda_layer_save_floats(&m->kda, T, N) : 0;
    int64_t mn = dm->n_mla ? arl_mla_layer_save_floats(&m->mla, T) : 0;
    int64_t mix = mixer_kind == ARL_LAYER_KDA   ? kn
                  : mixer_kind == ARL_LAYER_MLA ? mn
                                                : max2(kn, mn);
    float *mb = take(w, mix);
    if (w->base) {
        if (mixer_kind != ARL_LAYER_MLA && kn) arl_kda_layer_save_bind(&r->kda, &m->kda, T, N, mb);
        if (mixer_kind != ARL_LAYER_KDA && mn) arl_mla_layer_save_bind(&r->mla, &m->mla, T, mb);
    }
    int64_t dn = dm->n_dense ? arl_dense_save_floats(dm->fd, T) : 0;
    int64_t en = dm->n_moe ? arl_moe_save_floats(&m->moe, T) : 0;
    int64_t ffn = ffn_moe == 0 ? dn : ffn_moe == 1 ? en : max2(dn, en);
    float *fb = take(w, ffn);
    if (w->base) {
        if (ffn_moe != 1 && dn) arl_dense_save_bind(&r->dense, dm->fd, T, fb);
        if (ffn_moe != 0 && en) arl_moe_save_bind(&r->moe, &m->moe, T, fb);
    }
}

static int64_t train_layout(arl_model_train *tr, const arl_model *m, const arl_train_opts *o,
                            float *base) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = m->opts.max_tokens, d = dm->d, L = dm->L, V = dm->V;
    const int32_t N = m->opts.max_docs;
    const int32_t n_res = m->n_blocks + 1;
    const int32_t n_state = o->max_state_docs > 0 && o->max_state_docs < N ? o->max_state_docs : N;
    int64_t rows = LOGIT_BLOCK_FLOATS / V;
    rows = rows < 1 ? 1 : rows > T ? T : rows;
    ws_bump w = {base, 0};
    tr->n_res = n_res;
    tr->n_state = n_state;
    tr->logit_rows = rows;
    tr->res = take(&w, n_res * T * d);
    tr->layer_in = take(&w, L * T * d);
    tr->routes = (int32_t *)take(&w, dm->n_moe * T * dm->k);
    tr->state0 = take(&w, dm->n_kda * n_state * kda_state_floats(dm));
    if (o->checkpoint) {
        rec_layout(base ? &tr->recs[0] : NULL, &w, m, -1, -1);
    } else {
        for (int64_t l = 0; l < L; l++)
            rec_layout(base ? &tr->recs[l] : NULL, &w, m,
                       (int)arl_model_config_layer_kind(m->cfg, l),
                       arl_model_config_layer_is_moe(m->cfg, l));
    }
    tr->fin = take(&w, T * d);
    tr->xf = take(&w, T * d);
    tr->rstd_f = take(&w, T);
    tr->lse = take(&w, T);
    tr->targets = (int32_t *)take(&w, T);
    tr->logp = take(&w, T);
    tr->dlogp = take(&w, T);
    tr->logits = take(&w, rows * V);
    tr->dlogits = take(&w, rows * V);
    tr->ybuf = take(&w, T * d);
    tr->p_scr = take(&w, T * d);
    tr->pnew_scr = take(&w, T * d);
    /* state buffers are only used by documents continuing a state: n_state of them */
    const int64_t sn = dm->n_kda ? (int64_t)n_state * dm->H * dm->dk * dm->dv : 0;
    const int64_t tn = dm->n_kda ? (int64_t)n_state * 3 * dm->P * (dm->W - 1) : 0;
    tr->S_scr = take(&w, sn);
    tr->tails_scr = take(&w, tn);
    int64_t ws = 0;
    if (dm->n_kda) ws = max2(ws, arl_kda_layer_train_ws_floats(&m->kda, T, N));
    if (dm->n_mla) ws = max2(ws, arl_mla_layer_train_ws_floats(&m->mla, T, N));
    if (dm->n_dense) ws = max2(ws, arl_dense_train_ws_floats(d, dm->fd, T));
    if (dm->n_moe) ws = max2(ws, arl_moe_train_ws_floats(&m->moe, T));
    tr->ws = take(&w, ws);
    tr->ws_floats = ws;
    tr->d_res = take(&w, (n_res - 1) * T * d);
    tr->dp = take(&w, T * d);
    tr->dx = take(&w, T * d);
    tr->dmix = take(&w, T * d);
    tr->mix_ws = (double *)take(&w, 2 * arl_attnres_bwd_ws_doubles(n_res, T));
    tr->dS_T = take(&w, sn);
    tr->dS0 = take(&w, sn);
    tr->dtails_T = take(&w, tn);
    tr->dtails0 = take(&w, tn);
    tr->dlat_T = take(&w, dm->n_mla ? T * (dm->rkv + dm->r) : 0);
    return w.used;
}

int64_t arl_model_train_arena_floats(const arl_model *m, const arl_train_opts *o) {
    arl_train_opts def;
    if (!o) {
        arl_train_opts_default(&def);
        o = &def;
    }
    arl_model_train tr;
    memset(&tr, 0, sizeof tr);
    return train_layout(&tr, m, o, NULL);
}

arl_status arl_model_train_init(arl_model_train *tr, arl_model *m, const arl_train_opts *o,
                                float *arena) {
    memset(tr, 0, sizeof *tr);
    if (o)
        tr->opts = *o;
    else
        arl_train_opts_default(&tr->opts);
    if (tr->opts.max_state_docs < 0)
        return arl_errorf(ARL_ERR_ARG, "training: max_state_docs must be >= 0, got %d",
                          tr->opts.max_state_docs);
    tr->m = m;
    const int32_t N = m->opts.max_docs;
    const int64_t L = m->dm.L;
    tr->recs = calloc((size_t)(tr->opts.checkpoint ? 1 : L), sizeof(arl_layer_rec));
    tr->slots = calloc((size_t)N, sizeof(int32_t));
    tr->pos0 = calloc((size_t)N, sizeof(int64_t));
    tr->caches = calloc((size_t)N, sizeof(float *));
    tr->dprefix = calloc((size_t)N, sizeof(float *));
    if (!tr->recs || !tr->slots || !tr->pos0 || !tr->caches || !tr->dprefix) {
        arl_model_train_free(tr);
        return arl_errorf(ARL_ERR_NOMEM, "training: out of memory");
    }
    int64_t n = train_layout(tr, m, &tr->opts, NULL);
    if (!arena) {
        size_t bytes = sizeof(float) * (size_t)n;
        if (arl_params_memory_check((uint64_t)bytes, "the training activation arena") ||
            posix_memalign((void **)&arena, 64, bytes ? bytes : 64)) {
            arl_model_train_free(tr);
            return arl_errorf(ARL_ERR_NOMEM,
                              "training: out of memory allocating the %.1f MiB activation "
                              "arena (max_tokens %lld%s; lower max_tokens or enable "
                              "checkpointing)",
                              (double)bytes / 1048576.0, (long long)m->opts.max_tokens,
                              tr->opts.checkpoint ? ", checkpointing on" : "");
        }
        tr->owns_arena = 1;
    }
    tr->arena = arena;
    tr->arena_floats = n;
    train_layout(tr, m, &tr->opts, arena);
    return ARL_OK;
}

void arl_model_train_free(arl_model_train *tr) {
    if (!tr) return;
    if (tr->owns_arena) free(tr->arena);
    free(tr->recs);
    free(tr->slots);
    free(tr->pos0);
    free(tr->caches);
    free(tr->dprefix);
    memset(tr, 0, sizeof *tr);
}

/* ---- one decoder layer, forward (spec 5.2 for layer l) ---- */

typedef struct layer_io {
    const int32_t *cu;
    int32_t N;
    int64_t T;
    float *S, *tails;     /* KDA initial state (N, ...) or NULL (fresh) */
    float *const *caches; /* MLA rows or NULL */
    const int64_t *pos;
    const int32_t *forced; /* (T, k) forced routes or NULL */
    arl_moe_out mo;        /* routes, scores, load wanted */
} layer_io;

/* Entries before layer l: snapshots at l' = 0, B, 2B, ... < l. */
static int32_t entries_before(const arl_model *m, int64_t l) {
    const int64_t B = m->dm.B;
    return B > 0 ? (int32_t)((l + B - 1) / B) : 0;
}

static int block_start(const arl_model *m, int64_t l) {
    return m->dm.B > 0 && l % m->dm.B == 0;
}

/* Layer l from p_in (T, d) into pnew (T, d), which holds p_in already (inside a block) or
 * zeros (at a block start): pnew += Mixer(RMSNorm_in(h)); pnew += FFN(RMSNorm_post(m)).
 * The block entries before the layer are tr->res[0..]; at a block start, entry nbl is p_in
 * (its value; the forward has it in res[nbl], a recomputation reads the final entries). */
static arl_status layer_fwd(arl_model_train *tr, int64_t l, const float *p_in, float *pnew,
                            arl_layer_rec *rec, const layer_io *io) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const arl_layer_params *lp = &m->w->layers[l];
    const int64_t T = io->T, d = dm->d, Tmax = m->opts.max_tokens, Td = T * d;
    const int32_t nbl = entries_before(m, l), nb_after = nbl + block_start(m, l);
    const float *src[ARL_ATTNRES_MAX_SOURCES];

    const float *h = p_in;
    if (dm->B > 0 && nbl > 0) {
        for (int32_t j = 0; j < nbl; j++)
            src[j] = tr->res + j * Tmax * d;
        src[nbl] = p_in;
        arl_attnres_mix_fwd(rec->h, NULL, src, nbl + 1, T, d, lp->attn_res_norm, lp->attn_res_proj,
                            m->eps);
        h = rec->h;
    }
    arl_k_rmsnorm_fwd(rec->x1, rec->rstd1, h, lp->input_norm, T, d, m->eps);
    if (lp->kind == ARL_LAYER_KDA)
        arl_kda_layer_fwd_save(tr->ybuf, rec->x1, &lp->kda, &m->kda, io->cu, io->N, T, io->S,
                               io->tails, &rec->kda, tr->ws);
    else
        arl_mla_layer_fwd_save(tr->ybuf, rec->x1, &lp->mla, &m->mla, io->cu, io->N, T, io->caches,
                               io->pos, tr->opts.mla_absorbed, &rec->mla, tr->ws);
    arl_k_add(pnew, pnew, tr->ybuf, Td);
    arl_k_copy(rec->p_mid, pnew, Td);

    const float *mx = pnew;
    if (dm->B > 0) {
        for (int32_t j = 0; j < nb_after; j++)
            src[j] = tr->res + j * Tmax * d;
        src[nb_after] = pnew;
        arl_attnres_mix_fwd(rec->mfx, NULL, src, nb_after + 1, T, d, lp->mlp_res_norm,
                            lp->mlp_res_proj, m->eps);
        mx = rec->mfx;
    }
    arl_k_rmsnorm_fwd(rec->x2, rec->rstd2, mx, lp->post_norm, T, d, m->eps);
    if (lp->is_moe)
        ARL_TRY(arl_moe_fwd_save(tr->ybuf, &io->mo, rec->x2, &lp->moe, &m->moe, io->forced, T,
                                 &rec->moe, tr->ws));
    else
        arl_dense_ffn_fwd_save(tr->ybuf, rec->x2, &lp->dense, d, dm->fd, &m->act, T, &rec->dense);
    arl_k_add(pnew, pnew, tr->ybuf, Td);
    return ARL_OK;
}

static float *state0_of(const arl_model_train *tr, int64_t ki) {
    return tr->state0 + ki * tr->n_state * kda_state_floats(&tr->m->dm);
}

/* The rows each document of the last forward attends over in MLA layer l. */
static void bind_caches(arl_model_train *tr, int64_t l) {
    for (int32_t i = 0; i < tr->fwd_N; i++)
        tr->caches[i] = arl_decode_state_latent(tr->fwd_st, tr->slots[i], l);
}

/* Recompute layer l of the last forward into recs[0] (checkpointing). */
static void layer_recompute(arl_model_train *tr, const arl_batch *b, const int32_t *cu, int64_t l) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const int64_t T = b->T, d = dm->d, Td = T * d;
    const int32_t N = tr->fwd_N;
    const float *p_in = tr->layer_in + l * m->opts.max_tokens * d;
    if (block_start(m, l))
        memset(tr->pnew_scr, 0, sizeof(float) * (size_t)Td);
    else
        memcpy(tr->pnew_scr, p_in, sizeof(float) * (size_t)Td);
    layer_io io = {.cu = cu, .N = N, .T = T};
    arl_layer_kind kind = arl_model_config_layer_kind(m->cfg, l);
    if (tr->fwd_st && kind == ARL_LAYER_KDA) {
        const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
        const float *s0 = state0_of(tr, layer_index(m->cfg, l, ARL_LAYER_KDA));
        for (int32_t i = 0; i < N; i++) {
            memcpy(tr->S_scr + i * sn, s0 + i * (sn + tn), sizeof(float) * (size_t)sn);
            memcpy(tr->tails_scr + i * tn, s0 + i * (sn + tn) + sn, sizeof(float) * (size_t)tn);
        }
        io.S = tr->S_scr;
        io.tails = tr->tails_scr;
    }
    if (tr->fwd_st && kind == ARL_LAYER_MLA) {
        bind_caches(tr, l);
        io.caches = tr->caches;
        io.pos = tr->pos0;
    }
    if (m->moe_index[l] >= 0) io.forced = tr->routes + m->moe_index[l] * T * dm->k;
    arl_status s = layer_fwd(tr, l, p_in, tr->pnew_scr, &tr->recs[0], &io);
    ARL_ASSERT(s == ARL_OK); /* the forced routes are the forward's own */
}

/* ---- the forward ---- */

arl_status arl_model_train_forward(arl_model_train *tr, const arl_batch *b, arl_decode_state *st,
                                   const int32_t *slots, const arl_forward_out *out) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = m->w;
    tr->fwd_done = 0;
    ARL_TRY(arl_model_batch_check(m, b, "training"));
    if (out && out->acts)
        return arl_errorf(ARL_ERR_ARG, "training: out->acts belongs to arl_model_forward; the "
                                       "training forward keeps its own activations");
    const int64_t T = b->T, d = dm->d, Tmax = m->opts.max_tokens, Td = T * d, L = dm->L;
    const int32_t N = b->cu ? b->N : 1;
    int32_t cu_one[2] = {0, (int32_t)T};
    const int32_t *cu = b->cu ? b->cu : cu_one;
    if ((st == NULL) != (slots == NULL))
        return arl_errorf(ARL_ERR_ARG, "training: give both a decode state and slots, or neither");
    if (st) {
        if (memcmp(&st->dm, dm, sizeof *dm))
            return arl_errorf(ARL_ERR_CONFIG,
                              "training: the decode state was made for another model config");
        if (N > tr->n_state)
            return arl_errorf(ARL_ERR_RANGE,
                              "training: %d documents continue a decode state, the trainer was "
                              "set up for at most %d (max_state_docs)",
                              N, tr->n_state);
        for (int32_t i = 0; i < N; i++) {
            if (slots[i] < 0 || slots[i] >= st->n_slots || !st->slots[slots[i]].active)
                return arl_errorf(ARL_ERR_STATE,
                                  "training: document %d names slot %d, which holds no sequence", i,
                                  slots[i]);
            for (int32_t j = 0; j < i; j++)
                if (slots[j] == slots[i])
                    return arl_errorf(ARL_ERR_STATE,
                                      "training: slot %d appears twice in one "
                                      "forward",
                                      slots[i]);
        }
        for (int32_t i = 0; i < N; i++) {
            int64_t end = st->slots[slots[i]].pos + cu[i + 1] - cu[i];
            if (dm->n_mla > 0 && end > m->mla.max_rows)
                return arl_errorf(ARL_ERR_RANGE,
                                  "training: the sequence of slot %d would reach %lld positions, "
                                  "the model was set up for %lld (max_context)",
                                  slots[i], (long long)end, (long long)m->mla.max_rows);
            ARL_TRY(arl_decode_state_reserve(st, slots[i], end));
        }
    }
    for (int32_t i = 0; i < N; i++) {
        tr->slots[i] = st ? slots[i] : -1;
        tr->pos0[i] = st ? st->slots[slots[i]].pos : 0;
    }
    tr->fwd_st = st;
    tr->fwd_N = N;
    tr->fwd_T = T;

    /* 2.1 embedding; image rows replace the placeholders (10.1) */
    float *p = tr->res;
    ARL_TRY(arl_vision_place(p, w->embed_tokens, dm->V, d, b->tokens, T,
                             m->cfg->media_placeholder_token_id, b->media, b->n_media));

    int32_t nb = 0; /* block entries so far: res slots 0..nb-1; p is slot nb */
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
    for (int64_t l = 0; l < L; l++) {
        const arl_layer_params *lp = &w->layers[l];
        arl_k_copy(tr->layer_in + l * Tmax * d, p, Td);
        float *pnew = p;
        if (block_start(m, l)) {
            pnew = tr->res + (nb + 1) * Tmax * d;
            arl_k_fill(pnew, 0.0f, Td);
        }
        layer_io io = {.cu = cu, .N = N, .T = T};
        int64_t ki = -1;
        if (st && lp->kind == ARL_LAYER_KDA) { /* gather the states; keep the initial ones */
            ki = layer_index(m->cfg, l, ARL_LAYER_KDA);
            float *s0 = state0_of(tr, ki);
            for (int32_t i = 0; i < N; i++) {
                const float *S = arl_decode_state_kda_S(st, slots[i], l);
                const float *tl = arl_decode_state_kda_conv(st, slots[i], l);
                memcpy(tr->S_scr + i * sn, S, sizeof(float) * (size_t)sn);
                memcpy(tr->tails_scr + i * tn, tl, sizeof(float) * (size_t)tn);
                memcpy(s0 + i * (sn + tn), S, sizeof(float) * (size_t)sn);
                memcpy(s0 + i * (sn + tn) + sn, tl, sizeof(float) * (size_t)tn);
            }
            io.S = tr->S_scr;
            io.tails = tr->tails_scr;
        }
        if (st && lp->kind == ARL_LAYER_MLA) {
            bind_caches(tr, l);
            io.caches = tr->caches;
            io.pos = tr->pos0;
        }
        const int64_t mi = m->moe_index[l];
        if (mi >= 0) {
            const int64_t k = dm->k, E = dm->E;
            io.forced = b->forced_routes ? b->forced_routes + mi * T * k : NULL;
            io.mo.routes = tr->routes + mi * T * k;
            io.mo.scores = out && out->router_scores ? out->router_scores + mi * T * E : NULL;
            io.mo.load = out && out->expert_load ? out->expert_load + mi * E : NULL;
        }
        arl_status s =
            layer_fwd(tr, l, p, pnew, tr->opts.checkpoint ? &tr->recs[0] : &tr->recs[l], &io);
        ARL_ASSERT(s == ARL_OK); /* forced routes were checked with the batch */
        if (ki >= 0)
            for (int32_t i = 0; i < N; i++) {
                memcpy(arl_decode_state_kda_S(st, slots[i], l), tr->S_scr + i * sn,
                       sizeof(float) * (size_t)sn);
                memcpy(arl_decode_state_kda_conv(st, slots[i], l), tr->tails_scr + i * tn,
                       sizeof(float) * (size_t)tn);
            }
        if (block_start(m, l)) {
            nb++;
            p = pnew;
        }
    }
    if (out && out->routes)
        memcpy(out->routes, tr->routes, sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k));

    /* final mix, norm, lm_head, log-probabilities */
    const float *fin = p;
    if (dm->B > 0) {
        const float *src[ARL_ATTNRES_MAX_SOURCES];
        for (int32_t j = 0; j <= nb; j++)
            src[j] = tr->res + j * Tmax * d;
        arl_attnres_mix_fwd(tr->fin, NULL, src, nb + 1, T, d, w->out_res_norm, w->out_res_proj,
                            m->eps);
        fin = tr->fin;
    }
    arl_k_rmsnorm_fwd(tr->xf, tr->rstd_f, fin, w->norm, T, d, m->eps);
    const int64_t V = dm->V;
    const int32_t *targets = b->targets ? b->targets : m->no_targets;
    float *lp_out = out && out->logprobs ? out->logprobs : tr->logp;
    float *ent = out ? out->entropy : NULL;
    if (out && out->logits) {
        arl_k_linear_fwd(out->logits, tr->xf, w->lm_head, T, d, V);
        arl_k_logprob_fwd(lp_out, tr->lse, ent, out->logits, targets, T, V);
    } else {
        for (int64_t t0 = 0; t0 < T; t0 += tr->logit_rows) {
            int64_t n = T - t0 < tr->logit_rows ? T - t0 : tr->logit_rows;
            arl_k_linear_fwd(tr->logits, tr->xf + t0 * d, w->lm_head, n, d, V);
            arl_k_logprob_fwd(lp_out + t0, tr->lse + t0, ent ? ent + t0 : NULL, tr->logits,
                              targets + t0, n, V);
        }
    }
    if (st)
        for (int32_t i = 0; i < N; i++)
            st->slots[slots[i]].pos += cu[i + 1] - cu[i];
    tr->fwd_done = 1;
    return ARL_OK;
}

/* ---- the backward ---- */

/* lm_head, log-softmax, final norm and final mix: dp and d_res (zeroed by the caller) +=. */
static void head_bwd(arl_model_train *tr, const arl_batch *b, const float *dlogp,
                     const arl_model_params *g) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = m->w;
    const int64_t T = b->T, d = dm->d, V = dm->V, Tmax = m->opts.max_tokens;
    float *dxf = tr->dx;
    arl_k_fill(dxf, 0.0f, T * d);
    for (int64_t t0 = 0; t0 < T; t0 += tr->logit_rows) {
        int64_t n = T - t0 < tr->logit_rows ? T - t0 : tr->logit_rows;
        int any = 0;
        for (int64_t t = t0; t < t0 + n; t++)
            any |= b->targets[t] >= 0 && dlogp[t] != 0.0f;
        if (!any) continue;
        arl_k_linear_fwd(tr->logits, tr->xf + t0 * d, w->lm_head, n, d, V);
        arl_k_fill(tr->dlogits, 0.0f, n * V);
        arl_k_logprob_bwd(tr->dlogits, dlogp + t0, tr->logits, tr->lse + t0, b->targets + t0, n, V);
        arl_k_linear_bwd_w(g->lm_head, tr->dlogits, tr->xf + t0 * d, n, d, V);
        arl_k_linear_bwd_x(dxf + t0 * d, tr->dlogits, w->lm_head, n, d, V);
    }
    const int32_t nb = m->n_blocks;
    const float *fin = dm->B > 0 ? tr->fin : tr->res + nb * Tmax * d;
    float *dfin = tr->dmix;
    arl_k_fill(dfin, 0.0f, T * d);
    arl_k_rmsnorm_bwd(dfin, g->norm, dxf, fin, w->norm, tr->rstd_f, T, d);
    if (dm->B > 0) {
        const float *src[ARL_ATTNRES_MAX_SOURCES];
        float *dsrc[ARL_ATTNRES_MAX_SOURCES];
        for (int32_t j = 0; j < nb; j++) {
            src[j] = tr->res + j * Tmax * d;
            dsrc[j] = tr->d_res + j * Tmax * d;
        }
        src[nb] = tr->res + nb * Tmax * d;
        dsrc[nb] = tr->dp;
        arl_attnres_mix_bwd_ws(dsrc, g->out_res_norm, g->out_res_proj, dfin, src, nb + 1, T, d,
                               w->out_res_norm, w->out_res_proj, m->eps, tr->mix_ws);
    } else {
        arl_k_add(tr->dp, tr->dp, dfin, T * d);
    }
}

/* The mixer backward of layer l for dy = tr->dp into tr->dx (zeroed here), with the state
 * gradients of the documents' slots when dstate is given. */
static void mixer_bwd(arl_model_train *tr, const arl_batch *b, const int32_t *cu, int64_t l,
                      const arl_layer_rec *rec, const arl_model_params *g,
                      arl_decode_state *dstate) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const arl_layer_params *lp = &m->w->layers[l];
    const arl_layer_params *gl = &g->layers[l];
    const int64_t T = b->T, d = dm->d;
    const int32_t N = tr->fwd_N;
    arl_k_fill(tr->dx, 0.0f, T * d);
    if (lp->kind == ARL_LAYER_KDA) {
        const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
        const float *tails0 = NULL;
        if (tr->fwd_st) { /* the initial tails of every document, from the store */
            const float *s0 = state0_of(tr, layer_index(m->cfg, l, ARL_LAYER_KDA));
            for (int32_t i = 0; i < N; i++)
                memcpy(tr->tails_scr + i * tn, s0 + i * (sn + tn) + sn, sizeof(float) * (size_t)tn);
            tails0 = tr->tails_scr;
        }
        float *dS0 = NULL, *dtails0 = NULL;
        const float *dS_T = NULL, *dtails_T = NULL;
        if (dstate) {
            for (int32_t i = 0; i < N; i++) {
                memcpy(tr->dS_T + i * sn, arl_decode_state_kda_S(dstate, tr->slots[i], l),
                       sizeof(float) * (size_t)sn);
                memcpy(tr->dtails_T + i * tn, arl_decode_state_kda_conv(dstate, tr->slots[i], l),
                       sizeof(float) * (size_t)tn);
            }
            arl_k_fill(tr->dS0, 0.0f, N * sn);
            arl_k_fill(tr->dtails0, 0.0f, N * tn);
            dS_T = tr->dS_T;
            dtails_T = tr->dtails_T;
            dS0 = tr->dS0;
            dtails0 = tr->dtails0;
        }
        arl_kda_layer_bwd(tr->dx, &gl->kda, tr->dp, rec->x1, &lp->kda, &m->kda, cu, N, T, &rec->kda,
                          tails0, dS_T, dS0, dtails_T, dtails0, tr->opts.kda_recurrent_bwd, tr->ws);
        if (dstate)
            for (int32_t i = 0; i < N; i++) {
                memcpy(arl_decode_state_kda_S(dstate, tr->slots[i], l), tr->dS0 + i * sn,
                       sizeof(float) * (size_t)sn);
                memcpy(arl_decode_state_kda_conv(dstate, tr->slots[i], l), tr->dtails0 + i * tn,
                       sizeof(float) * (size_t)tn);
            }
    } else {
        float *const *caches = NULL;
        if (tr->fwd_st) {
            bind_caches(tr, l);
            caches = tr->caches;
        }
        const float *dlat_T = NULL;
        float *const *dprefix = NULL;
        if (dstate) {
            const int64_t R = dm->rkv + dm->r;
            for (int32_t i = 0; i < N; i++) {
                float *rows = arl_decode_state_latent(dstate, tr->slots[i], l);
                memcpy(tr->dlat_T + (int64_t)cu[i] * R, rows + tr->pos0[i] * R,
                       sizeof(float) * (size_t)((cu[i + 1] - cu[i]) * R));
                tr->dprefix[i] = rows;
            }
            dlat_T = tr->dlat_T;
            dprefix = tr->dprefix;
        }
        arl_mla_layer_bwd(tr->dx, &gl->mla, tr->dp, rec->x1, &lp->mla, &m->mla, cu, N, T, caches,
                          tr->pos0, &rec->mla, dlat_T, dprefix, tr->ws);
    }
}

arl_status arl_model_backward(arl_model_train *tr, const arl_batch *b, const float *dlogp,
                              const arl_model_params *grads, arl_decode_state *dstate,
                              float *d_media) {
    arl_model *m = tr->m;
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = m->w;
    if (!tr->fwd_done)
        return arl_errorf(ARL_ERR_STATE, "training: backward without a forward (or the forward "
                                         "failed)");
    const int32_t N = b->cu ? b->N : 1;
    if (b->T != tr->fwd_T || N != tr->fwd_N)
        return arl_errorf(ARL_ERR_ARG,
                          "training: backward over %lld tokens in %d documents, the forward "
                          "had %lld in %d",
                          (long long)b->T, N, (long long)tr->fwd_T, tr->fwd_N);
    if (!b->targets || !dlogp)
        return arl_errorf(ARL_ERR_ARG, "training: the backward needs targets and dlogp");
    if (dstate) {
        if (!tr->fwd_st)
            return arl_errorf(ARL_ERR_ARG, "training: a state gradient needs a forward from a "
                                           "decode state");
        if (memcmp(&dstate->dm, dm, sizeof *dm))
            return arl_errorf(ARL_ERR_CONFIG, "training: the gradient state was made for another "
                                              "model config");
        for (int32_t i = 0; i < N; i++) {
            int32_t s = tr->slots[i];
            int64_t want = tr->pos0[i] + (b->cu ? b->cu[i + 1] - b->cu[i] : b->T);
            if (s >= dstate->n_slots || !dstate->slots[s].active || dstate->slots[s].pos != want)
                return arl_errorf(ARL_ERR_STATE,
                                  "training: gradient state slot %d must be active at position "
                                  "%lld (the end of the segment); prepare it with "
                                  "arl_state_grad_prepare",
                                  s, (long long)want);
        }
    }
    const int64_t T = b->T, d = dm->d, Td = T * d, Tmax = m->opts.max_tokens, L = dm->L;
    int32_t cu_one[2] = {0, (int32_t)T};
    const int32_t *cu = b->cu ? b->cu : cu_one;

    arl_k_fill(tr->dp, 0.0f, Td);
    for (int32_t j = 0; j + 1 < tr->n_res; j++)
        arl_k_fill(tr->d_res + j * Tmax * d, 0.0f, Td);
    head_bwd(tr, b, dlogp, grads);

    const float *src[ARL_ATTNRES_MAX_SOURCES];
    float *dsrc[ARL_ATTNRES_MAX_SOURCES];
    for (int64_t l = L - 1; l >= 0; l--) {
        const arl_layer_params *lp = &w->layers[l];
        const arl_layer_params *gl = &grads->layers[l];
        arl_layer_rec *rec = &tr->recs[tr->opts.checkpoint ? 0 : l];
        if (tr->opts.checkpoint) layer_recompute(tr, b, cu, l);
        const int32_t nbl = entries_before(m, l), nb_after = nbl + block_start(m, l);
        const float *p_in = tr->layer_in + l * Tmax * d;

        /* FFN: dFFN_out = dp -> FFN backward -> RMSNorm_post -> pre-FFN mix */
        arl_k_fill(tr->dx, 0.0f, Td);
        if (lp->is_moe)
            arl_moe_bwd(tr->dx, &gl->moe, tr->dp, rec->x2, &lp->moe, &m->moe, T, &rec->moe, tr->ws);
        else
            arl_dense_ffn_bwd(tr->dx, &gl->dense, tr->dp, rec->x2, &lp->dense, d, dm->fd, &m->act,
                              T, &rec->dense, tr->ws);
        arl_k_fill(tr->dmix, 0.0f, Td);
        arl_k_rmsnorm_bwd(tr->dmix, gl->post_norm, tr->dx, dm->B > 0 ? rec->mfx : rec->p_mid,
                          lp->post_norm, rec->rstd2, T, d);
        if (dm->B > 0) {
            for (int32_t j = 0; j < nb_after; j++) {
                src[j] = tr->res + j * Tmax * d;
                dsrc[j] = tr->d_res + j * Tmax * d;
            }
            src[nb_after] = rec->p_mid;
            dsrc[nb_after] = tr->dp;
            arl_attnres_mix_bwd_ws(dsrc, gl->mlp_res_norm, gl->mlp_res_proj, tr->dmix, src,
                                   nb_after + 1, T, d, lp->mlp_res_norm, lp->mlp_res_proj, m->eps,
                                   tr->mix_ws);
        } else {
            arl_k_add(tr->dp, tr->dp, tr->dmix, Td);
        }

        /* mixer: dMixer_out = dp -> mixer backward -> RMSNorm_in -> d(h) */
        mixer_bwd(tr, b, cu, l, rec, grads, dstate);
        arl_k_fill(tr->dmix, 0.0f, Td);
        const float *h = dm->B > 0 && nbl > 0 ? rec->h : p_in;
        arl_k_rmsnorm_bwd(tr->dmix, gl->input_norm, tr->dx, h, lp->input_norm, rec->rstd1, T, d);

        /* 5.4: at a block start p was reset, so the old p is the snapshot entry */
        if (block_start(m, l))
            memcpy(tr->dp, tr->d_res + nbl * Tmax * d, sizeof(float) * (size_t)Td);
        if (dm->B == 0 || nbl == 0) {
            arl_k_add(tr->dp, tr->dp, tr->dmix, Td);
        } else {
            for (int32_t j = 0; j < nbl; j++) {
                src[j] = tr->res + j * Tmax * d;
                dsrc[j] = tr->d_res + j * Tmax * d;
            }
            src[nbl] = p_in;
            dsrc[nbl] = tr->dp;
            arl_attnres_mix_bwd_ws(dsrc, gl->attn_res_norm, gl->attn_res_proj, tr->dmix, src,
                                   nbl + 1, T, d, lp->attn_res_norm, lp->attn_res_proj, m->eps,
                                   tr->mix_ws);
        }
    }

    /* dp is now the gradient of the embedded rows: the embedding table, or the image rows */
    const int64_t media_id = m->cfg->media_placeholder_token_id;
    int64_t mi = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *g = tr->dp + t * d;
        float *dst;
        if (b->media && b->tokens[t] == media_id) {
            dst = d_media ? d_media + (mi++) * d : NULL;
        } else {
            dst = grads->embed_tokens + (int64_t)b->tokens[t] * d;
        }
        if (dst)
            for (int64_t i = 0; i < d; i++)
                dst[i] += g[i];
    }
    if (dstate)
        for (int32_t i = 0; i < N; i++)
            dstate->slots[tr->slots[i]].pos = tr->pos0[i];
    return ARL_OK;
}

/* ---- losses ---- */

arl_status arl_model_nll_grad(arl_model_train *tr, const arl_batch *b, arl_decode_state *st,
                              const int32_t *slots, double scale, const arl_model_params *grads,
                              double *nll_sum, const arl_forward_out *out) {
    arl_model *m = tr->m;
    *nll_sum = 0.0;
    ARL_TRY(arl_model_batch_check(m, b,
                                  "training")); /* before the targets are written for b->T tokens */
    arl_batch bt = *b;
    if (!bt.targets) {
        arl_batch_next_token_targets(tr->targets, b->tokens, b->cu, b->cu ? b->N : 1, b->T);
        bt.targets = tr->targets;
    }
    arl_forward_out o;
    if (out)
        o = *out;
    else
        memset(&o, 0, sizeof o);
    if (!o.logprobs) o.logprobs = tr->logp;
    ARL_TRY(arl_model_train_forward(tr, &bt, st, slots, &o));
    double sum = 0.0;
    for (int64_t t = 0; t < b->T; t++) {
        int on = bt.targets[t] >= 0;
        if (on) sum -= (double)o.logprobs[t];
        tr->dlogp[t] = on ? (float)(-scale) : 0.0f;
    }
    *nll_sum = sum;
    return arl_model_backward(tr, &bt, tr->dlogp, grads, NULL, NULL);
}

arl_status arl_model_loss_and_grad(arl_model_train *tr, const arl_batch *b,
                                   const arl_model_params *grads, double *loss) {
    arl_model *m = tr->m;
    *loss = 0.0;
    ARL_TRY(arl_model_batch_check(m, b, "training"));
    const int32_t *targets = b->targets;
    if (!targets) {
        arl_batch_next_token_targets(tr->targets, b->tokens, b->cu, b->cu ? b->N : 1, b->T);
        targets = tr->targets;
    }
    int64_t count = 0;
    for (int64_t t = 0; t < b->T; t++)
        count += targets[t] >= 0;
    arl_batch bt = *b;
    bt.targets = targets;
    double sum = 0.0;
    ARL_TRY(arl_model_nll_grad(tr, &bt, NULL, NULL, count ? 1.0 / (double)count : 0.0, grads, &sum,
                               NULL));
    *loss = count ? sum / (double)count : 0.0;
    return ARL_OK;
}

arl_status arl_state_grad_prepare(arl_decode_state *g, int32_t slot, int64_t position) {
    ARL_ASSERT(slot >= 0 && slot < g->n_slots && position >= 0);
    arl_decode_slot *s = &g->slots[slot];
    s->active = 1;
    arl_decode_state_reset(g, slot); /* zero S and tails, position 0 */
    ARL_TRY(arl_decode_state_reserve(g, slot, position));
    const int64_t R = g->dm.rkv + g->dm.r;
    for (int64_t j = 0; j < g->dm.n_mla; j++)
        if (s->latent[j]) memset(s->latent[j], 0, sizeof(float) * (size_t)(position * R));
    s->pos = position;
    return ARL_OK;
}

arl_status arl_model_grads_save(const char *path, const arl_model_params *grads, const char *what) {
    const arl_param_inventory *inv = &grads->inv;
    int64_t pad = 0; /* floats of the padded A_log copies */
    for (int64_t i = 0; i < inv->n; i++)
        if (inv->t[i].is_a_log) pad += inv->t[i].stored_numel;
    float *padded = calloc((size_t)(pad > 0 ? pad : 1), sizeof(float));
    if (!padded) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    arl_st_writer *w = NULL;
    arl_status s = arl_st_writer_open(path, &w);
    if (!s) s = arl_st_writer_set_metadata(w, "format", "pt");
    if (!s && what) s = arl_st_writer_set_metadata(w, "content", what);
    float *next = padded;
    for (int64_t i = 0; i < inv->n && !s; i++) {
        const arl_param_tensor *t = &inv->t[i];
        const float *src = arl_model_params_tensor(grads, i);
        if (t->is_a_log) {
            memcpy(next, src, sizeof(float) * (size_t)t->numel);
            s = arl_st_writer_add_f32(w, t->name, ARL_DTYPE_F32, 1, &t->stored_numel, next);
            next += t->stored_numel;
        } else {
            s = arl_st_writer_add_f32(w, t->name, ARL_DTYPE_F32, t->rank, t->shape, src);
        }
    }
    if (s) {
        arl_st_writer_abort(w);
    } else {
        s = arl_st_writer_close(w);
    }
    free(padded);
    return s;
}
