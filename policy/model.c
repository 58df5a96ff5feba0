/* policy/model.c: the whole policy forward on the CPU, fp32 (see policy/model.h).
 *
 * Reading order: arl_model_init (settings, workspace layout), then model_run, which follows
 * spec/policy.md 2.1 and the AttnRes bookkeeping of 5.2 line by line; the mixers and FFNs are
 * one call each into policy/kda_layer.c, policy/mla_layer.c and policy/moe.c.
 */
#include "policy/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/kernels.h"
#include "policy/attnres.h"
#include "policy/docs.h"
#include "policy/kda.h"
#include "policy/vision.h"

/* Rows of logits computed at a time when the caller keeps no (T, V) logits: about 4 MiB. */
#define LOGIT_BLOCK_FLOATS ((int64_t)1 << 20)

void arl_model_opts_default(arl_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 2048;
    o->max_docs = 64;
    o->max_context = 0;
    o->kda_chunk = 64;
    o->mla_sparse_chunk = 4096;
    o->mla_sparse_topk = 0;
}

/* ---- workspace layout ---- */

typedef struct ws_bump {
    float *base;
    int64_t used;
} ws_bump;

static float *take(ws_bump *b, int64_t n) {
    float *p = b->base ? b->base + b->used : NULL;
    b->used += (n + 15) & ~(int64_t)15;
    return p;
}

static int64_t max3(int64_t a, int64_t b, int64_t c) {
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* Fill the component settings of m from cfg and opts (no allocation). */
static arl_status model_settings(arl_model *m, const arl_model_config *cfg,
                                 const arl_model_opts *opts) {
    const arl_model_dims *dm = &cfg->dims;
    arl_model_opts o;
    if (opts)
        o = *opts;
    else
        arl_model_opts_default(&o);
    if (o.max_context <= 0) o.max_context = cfg->text.max_position_embeddings;
    if (o.max_tokens < 1 || o.max_docs < 1 || o.max_context < 1)
        return arl_errorf(ARL_ERR_ARG,
                          "model: max_tokens (%lld), max_docs (%d) and max_context "
                          "(%lld) must be >= 1",
                          (long long)o.max_tokens, o.max_docs, (long long)o.max_context);
    if (o.max_tokens > ARL_MAX_CONTEXT_ROWS || o.max_context > ARL_MAX_CONTEXT_ROWS)
        return arl_errorf(
            ARL_ERR_RANGE,
            "model: max_tokens (%lld) and max_context (%lld%s%s) must be at most "
            "%lld (2^40), the largest this build supports",
            (long long)o.max_tokens, (long long)o.max_context, o.max_context_key ? ", from " : "",
            o.max_context_key ? o.max_context_key : "", (long long)ARL_MAX_CONTEXT_ROWS);
    if (o.kda_chunk < 1 || o.kda_chunk > 256)
        return arl_errorf(ARL_ERR_ARG, "model: kda_chunk must be in [1, 256], got %lld",
                          (long long)o.kda_chunk);
    if (o.mla_sparse_topk < 0 || (o.mla_sparse_topk > 0 && o.mla_sparse_chunk < 1))
        return arl_errorf(ARL_ERR_ARG,
                          "model: mla_sparse_topk must be >= 0 and "
                          "mla_sparse_chunk >= 1, got %lld and %lld",
                          (long long)o.mla_sparse_topk, (long long)o.mla_sparse_chunk);
    if (o.max_docs > o.max_tokens) o.max_docs = (int32_t)o.max_tokens;
    m->cfg = cfg;
    m->dm = *dm;
    m->opts = o;
    arl_model_layer_cfgs_make(cfg, &o, &m->eps, &m->act, &m->kda, &m->mla, &m->moe);
    m->lanes = arl_k_threads();
    m->n_blocks = dm->B > 0 ? (int32_t)((dm->L + dm->B - 1) / dm->B) : 0;
    if (m->n_blocks + 1 > ARL_ATTNRES_MAX_SOURCES)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "model: attn_res_block_size %lld gives %d AttnRes "
                          "sources for %lld layers; this build mixes at most %d",
                          (long long)dm->B, m->n_blocks + 1, (long long)dm->L,
                          ARL_ATTNRES_MAX_SOURCES);
    m->logit_rows = LOGIT_BLOCK_FLOATS / dm->V;
    if (m->logit_rows < 1) m->logit_rows = 1;
    if (m->logit_rows > o.max_tokens) m->logit_rows = o.max_tokens;
    return ARL_OK;
}

/* Carve the arena (base NULL: only count).  Returns its size in floats. */
static int64_t model_layout(arl_model *m, float *base) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = m->opts.max_tokens, d = dm->d;
    const int32_t N = m->opts.max_docs;
    ws_bump w = {base, 0};
    m->res = take(&w, (m->n_blocks + 1) * T * d);
    m->hbuf = take(&w, T * d);
    m->xbuf = take(&w, T * d);
    m->ybuf = take(&w, T * d);
    m->kda_S = take(&w, dm->n_kda > 0 ? (int64_t)N * dm->H * dm->dk * dm->dv : 0);
    m->kda_tails = take(&w, dm->n_kda > 0 ? (int64_t)N * 3 * dm->P * (dm->W - 1) : 0);
    m->routes = (int32_t *)take(&w, T * (dm->n_moe > 0 ? dm->k : 0));
    m->cu1 = (int32_t *)take(&w, N + 1);
    m->no_targets = (int32_t *)take(&w, T);
    int64_t mixer = max3(dm->n_kda ? arl_kda_layer_ws_floats(&m->kda, T, N) : 0,
                         dm->n_mla ? arl_mla_layer_ws_floats(&m->mla, T, N, m->lanes) : 0, 0);
    int64_t ffn = max3(dm->n_dense ? arl_dense_ffn_ws_floats(d, dm->fd, T) : 0,
                       dm->n_moe ? arl_moe_ws_floats(&m->moe, T) : 0, 0);
    m->scratch_floats = mixer > ffn ? mixer : ffn;
    m->scratch = take(&w, m->scratch_floats);
    m->logits = take(&w, m->logit_rows * dm->V);
    return w.used;
}

int64_t arl_model_workspace_bytes(const arl_model_config *cfg, const arl_model_opts *opts) {
    arl_model m;
    memset(&m, 0, sizeof m);
    if (model_settings(&m, cfg, opts)) return -1;
    return model_layout(&m, NULL) * (int64_t)sizeof(float);
}

void arl_model_layer_cfgs_make(const arl_model_config *cfg, const arl_model_opts *o, float *eps,
                               arl_glu_act *act, arl_kda_layer_cfg *kda, arl_mla_layer_cfg *mla,
                               arl_moe_cfg *moe) {
    const arl_model_dims *dm = &cfg->dims;
    *eps = (float)cfg->text.rms_norm_eps;
    act->situ = strcmp(cfg->text.hidden_act, "silu") != 0;
    act->beta1 = (float)cfg->text.activation_situ_beta;
    act->beta2 = (float)cfg->text.activation_situ_linear_beta;
    *kda = (arl_kda_layer_cfg){.d = dm->d,
                               .H = dm->H,
                               .dk = dm->dk,
                               .dv = dm->dv,
                               .W = dm->W,
                               .lower_bound_gate = arl_model_config_has_gate_lower_bound(cfg),
                               .g_min = (float)cfg->text.linear_attn_config.gate_lower_bound,
                               .eps = *eps,
                               .chunk = o->kda_chunk};
    *mla = (arl_mla_layer_cfg){.d = dm->d,
                               .Hm = dm->Hm,
                               .rq = dm->rq,
                               .rkv = dm->rkv,
                               .n = dm->n,
                               .r = dm->r,
                               .vm = dm->vm,
                               .sparse_chunk = o->mla_sparse_chunk,
                               .sparse_topk = o->mla_sparse_topk,
                               .max_rows =
                                   o->max_context > o->max_tokens ? o->max_context : o->max_tokens};
    *moe = (arl_moe_cfg){.d = dm->d,
                         .E = dm->E,
                         .k = dm->k,
                         .f = dm->f,
                         .dz = dm->dz,
                         .fs = dm->ns > 0 ? dm->fs : 0,
                         .rho = (float)cfg->text.routed_scaling_factor,
                         .eps = *eps,
                         .act = *act};
}

arl_status arl_model_init(arl_model *m, const arl_model_config *cfg, const arl_model_params *w,
                          const arl_model_opts *opts) {
    memset(m, 0, sizeof *m);
    ARL_TRY(model_settings(m, cfg, opts));
    m->w = w;
    int64_t n = model_layout(m, NULL);
    size_t bytes = sizeof(float) * (size_t)n;
    /* beyond the available memory the allocation would succeed (overcommit) and the first
     * long forward would end in an out-of-memory kill: refused here instead */
    if (arl_params_memory_check((uint64_t)bytes, "the model workspace") ||
        posix_memalign((void **)&m->arena, 64, bytes ? bytes : 64)) {
        m->arena = NULL;
        /* attention over the context is sized by the longer of the two (the MLA's max_rows) */
        char key[200] = ""; /* the setting it comes from, when the caller named it */
        if (m->opts.max_context_key)
            snprintf(key, sizeof key, "; max_context is %s (%lld)", m->opts.max_context_key,
                     (long long)m->opts.max_context);
        if (m->opts.max_context > m->opts.max_tokens)
            return arl_errorf(ARL_ERR_NOMEM,
                              "model: out of memory allocating the %.1f MiB workspace "
                              "(max_context %lld, the longest context attended over, and "
                              "max_tokens %lld; lower them)%s",
                              (double)bytes / 1048576.0, (long long)m->opts.max_context,
                              (long long)m->opts.max_tokens, key);
        return arl_errorf(ARL_ERR_NOMEM,
                          "model: out of memory allocating the %.1f MiB workspace "
                          "(max_tokens %lld; lower it)",
                          (double)bytes / 1048576.0, (long long)m->opts.max_tokens);
    }
    m->arena_floats = n;
    model_layout(m, m->arena);
    const int64_t L = m->dm.L;
    m->moe_index = malloc(sizeof(int32_t) * (size_t)L);
    m->caches = calloc((size_t)m->opts.max_docs, sizeof(float *));
    m->pos = calloc((size_t)m->opts.max_docs, sizeof(int64_t));
    m->means = calloc((size_t)m->opts.max_docs, sizeof(float *));
    m->means_rows = calloc((size_t)m->opts.max_docs, sizeof(int64_t *));
    if (!m->moe_index || !m->caches || !m->pos || !m->means || !m->means_rows) {
        arl_model_free(m);
        return arl_errorf(ARL_ERR_NOMEM, "model: out of memory");
    }
    for (int64_t t = 0; t < m->opts.max_tokens; t++)
        m->no_targets[t] = -1;
    int32_t nm = 0;
    for (int64_t l = 0; l < L; l++)
        m->moe_index[l] = arl_model_config_layer_is_moe(cfg, l) ? nm++ : -1;
    return ARL_OK;
}

void arl_model_free(arl_model *m) {
    if (!m) return;
    free(m->arena);
    free(m->moe_index);
    free(m->caches);
    free(m->pos);
    free(m->means);
    free(m->means_rows);
    memset(m, 0, sizeof *m);
}

/* ---- saved activations ---- */

static int64_t acts_layout(arl_model_acts *a, const arl_model *m, const arl_batch *b, float *base) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = b->T, d = dm->d;
    ws_bump w = {base, 0};
    a->layer_in = take(&w, dm->L * T * d);
    a->blocks = take(&w, m->n_blocks * T * d);
    a->final_in = take(&w, T * d);
    a->routes = (int32_t *)take(&w, dm->n_moe * T * dm->k);
    a->n_chunks = arl_kda_num_chunks(b->cu, b->cu ? b->N : 1, T, m->opts.kda_chunk);
    a->kda_chunks = take(&w, dm->n_kda * a->n_chunks * dm->H * dm->dk * dm->dv);
    return w.used;
}

int64_t arl_model_acts_floats(const arl_model *m, const arl_batch *b) {
    arl_model_acts a;
    return acts_layout(&a, m, b, NULL);
}

void arl_model_acts_bind(arl_model_acts *a, const arl_model *m, const arl_batch *b, float *arena) {
    acts_layout(a, m, b, arena);
}

/* ---- input checks (everything a caller or stored data can get wrong) ---- */

arl_status arl_model_batch_check(const arl_model *m, const arl_batch *b, const char *who) {
    const arl_model_dims *dm = &m->dm;
    const int64_t T = b->T;
    const int32_t N = b->cu ? b->N : 1;
    if (!b->tokens || T < 1)
        return arl_errorf(ARL_ERR_ARG, "%s: a batch needs at least one token", who);
    if (T > m->opts.max_tokens)
        return arl_errorf(ARL_ERR_RANGE,
                          "%s: batch of %lld tokens, the model was set up for "
                          "at most %lld per forward (max_tokens)",
                          who, (long long)T, (long long)m->opts.max_tokens);
    if (N < 1 || N > m->opts.max_docs)
        return arl_errorf(ARL_ERR_RANGE,
                          "%s: batch of %d documents, the model takes 1..%d "
                          "(max_docs)",
                          who, N, m->opts.max_docs);
    if (b->cu) {
        if (b->cu[0] != 0 || b->cu[N] != T)
            return arl_errorf(ARL_ERR_ARG,
                              "%s: cu_seqlens must run from 0 to T = %lld, got "
                              "%d .. %d",
                              who, (long long)T, b->cu[0], b->cu[N]);
        for (int32_t i = 0; i < N; i++)
            if (b->cu[i + 1] <= b->cu[i])
                return arl_errorf(ARL_ERR_ARG,
                                  "%s: document %d is empty or cu_seqlens "
                                  "decreases (%d -> %d)",
                                  who, i, b->cu[i], b->cu[i + 1]);
    }
    int64_t placeholders = 0;
    const int64_t media_id = m->cfg->media_placeholder_token_id;
    for (int64_t t = 0; t < T; t++) {
        int32_t id = b->tokens[t];
        if (id < 0 || id >= dm->V)
            return arl_errorf(ARL_ERR_RANGE,
                              "%s: token id %d at position %lld is outside the "
                              "vocabulary [0, %lld)",
                              who, id, (long long)t, (long long)dm->V);
        if (b->targets && b->targets[t] >= dm->V)
            return arl_errorf(ARL_ERR_RANGE,
                              "%s: target id %d at position %lld is outside "
                              "the vocabulary [0, %lld)",
                              who, b->targets[t], (long long)t, (long long)dm->V);
        placeholders += id == media_id;
    }
    if (b->media && placeholders != b->n_media)
        return arl_errorf(ARL_ERR_ARG,
                          "%s: the batch has %lld <|media_pad|> placeholders but "
                          "%lld image token rows were given",
                          who, (long long)placeholders, (long long)b->n_media);
    if (b->forced_routes) {
        const int64_t k = dm->k;
        for (int64_t j = 0; j < dm->n_moe; j++)
            for (int64_t t = 0; t < T; t++) {
                const int32_t *r = b->forced_routes + (j * T + t) * k;
                for (int64_t a = 0; a < k; a++) {
                    if (r[a] < 0 || r[a] >= dm->E)
                        return arl_errorf(ARL_ERR_RANGE,
                                          "%s: forced route %d of token %lld "
                                          "(MoE layer %lld) is outside [0, %lld)",
                                          who, r[a], (long long)t, (long long)j, (long long)dm->E);
                    for (int64_t c = 0; c < a; c++)
                        if (r[c] == r[a])
                            return arl_errorf(ARL_ERR_RANGE,
                                              "%s: forced routes of token %lld "
                                              "(MoE layer %lld) repeat expert %d",
                                              who, (long long)t, (long long)j, r[a]);
                }
            }
    }
    return ARL_OK;
}

/* ---- the forward ---- */

static void add_rows(float *p, const float *y, int64_t n) {
    arl_k_add(p, p, y, n);
}

/* Mixer of layer l on xbuf -> ybuf.  st/slots: decode-state documents, or NULL (fresh). */
static void run_mixer(arl_model *m, int64_t l, const int32_t *cu, int32_t N, int64_t T,
                      int one_token_docs, arl_decode_state *st, const int32_t *slots,
                      float *chunk_states) {
    const arl_layer_params *lp = &m->w->layers[l];
    const arl_model_dims *dm = &m->dm;
    if (lp->kind == ARL_LAYER_KDA) {
        float *S = NULL, *tails = NULL;
        const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1);
        if (st) { /* gather the documents' states; scattered back below */
            S = m->kda_S;
            tails = m->kda_tails;
            for (int32_t i = 0; i < N; i++) {
                memcpy(S + i * sn, arl_decode_state_kda_S(st, slots[i], l), sizeof(float) * sn);
                memcpy(tails + i * tn, arl_decode_state_kda_conv(st, slots[i], l),
                       sizeof(float) * tn);
            }
        }
        arl_kda_layer_fwd(m->ybuf, m->xbuf, &lp->kda, &m->kda, cu, N, T, S, tails, one_token_docs,
                          chunk_states, m->scratch);
        if (st)
            for (int32_t i = 0; i < N; i++) {
                memcpy(arl_decode_state_kda_S(st, slots[i], l), S + i * sn, sizeof(float) * sn);
                memcpy(arl_decode_state_kda_conv(st, slots[i], l), tails + i * tn,
                       sizeof(float) * tn);
            }
    } else {
        int keep = st && st->means_chunk > 0 && m->mla.sparse_topk > 0;
        if (st)
            for (int32_t i = 0; i < N; i++) {
                m->caches[i] = arl_decode_state_latent(st, slots[i], l);
                m->pos[i] = st->slots[slots[i]].pos;
                if (keep) m->means[i] = arl_decode_state_means(st, slots[i], l, &m->means_rows[i]);
            }
        arl_mla_layer_fwd_means(m->ybuf, NULL, m->xbuf, &lp->mla, &m->mla, cu, N, T,
                                st ? m->caches : NULL, st ? m->pos : NULL, keep ? m->means : NULL,
                                keep ? m->means_rows : NULL, m->lanes, m->scratch);
    }
}

/* FFN of layer l on xbuf -> ybuf. */
static void run_ffn(arl_model *m, int64_t l, const arl_batch *b, const arl_forward_out *out,
                    int64_t T) {
    const arl_layer_params *lp = &m->w->layers[l];
    if (!lp->is_moe) {
        arl_dense_ffn_fwd(m->ybuf, m->xbuf, &lp->dense, m->dm.d, m->dm.fd, &m->act, T, m->scratch);
        return;
    }
    const int64_t mi = m->moe_index[l], k = m->dm.k, E = m->dm.E;
    int32_t *routes = m->routes;
    if (out && out->routes) routes = out->routes + mi * T * k;
    if (out && out->acts) routes = out->acts->routes + mi * T * k;
    arl_moe_out mo = {
        .routes = routes,
        .weights = NULL,
        .scores = out && out->router_scores ? out->router_scores + mi * T * E : NULL,
        .load = out && out->expert_load ? out->expert_load + mi * E : NULL,
    };
    const int32_t *forced = b->forced_routes ? b->forced_routes + mi * T * k : NULL;
    arl_status s = arl_moe_fwd(m->ybuf, &mo, m->xbuf, &lp->moe, &m->moe, forced, T, m->scratch);
    ARL_ASSERT(s == ARL_OK); /* forced routes were checked before the forward */
    if (out && out->acts && out->routes)
        memcpy(out->routes + mi * T * k, routes, sizeof(int32_t) * (size_t)(T * k));
}

/* Final norm (already in xbuf), lm_head, log-probabilities. */
static void run_head(arl_model *m, const arl_batch *b, const arl_forward_out *out, int64_t T) {
    const int64_t d = m->dm.d, V = m->dm.V;
    if (!out || (!out->logits && !out->logprobs && !out->entropy)) return;
    const arl_model_params *w = m->w;
    if (out->logits) {
        arl_k_linear_fwd(out->logits, m->xbuf, w->lm_head, T, d, V);
        if (out->logprobs || out->entropy)
            arl_k_logprob_fwd(out->logprobs ? out->logprobs : m->ybuf, NULL, out->entropy,
                              out->logits, b->targets ? b->targets : m->no_targets, T, V);
        return;
    }
    /* row blocks through the workspace: the (T, V) logits are never held */
    for (int64_t t0 = 0; t0 < T; t0 += m->logit_rows) {
        int64_t n = T - t0 < m->logit_rows ? T - t0 : m->logit_rows;
        arl_k_linear_fwd(m->logits, m->xbuf + t0 * d, w->lm_head, n, d, V);
        arl_k_logprob_fwd(out->logprobs ? out->logprobs + t0 : m->ybuf, NULL,
                          out->entropy ? out->entropy + t0 : NULL, m->logits,
                          b->targets ? b->targets + t0 : m->no_targets + t0, n, V);
    }
}

static arl_status model_run(arl_model *m, const arl_batch *b, arl_decode_state *st,
                            const int32_t *slots, const arl_forward_out *out) {
    ARL_TRY(arl_model_batch_check(m, b, "model"));
    const arl_model_dims *dm = &m->dm;
    const arl_model_params *w = m->w;
    const int64_t T = b->T, d = dm->d, Td = T * d, L = dm->L, B = dm->B;
    const int32_t N = b->cu ? b->N : 1;
    const int32_t *cu = b->cu;
    int32_t cu_one[2] = {0, (int32_t)T};
    if (!cu) cu = cu_one;
    int one_token_docs = T == N; /* decode step: the recurrent KDA core */

    if (st) {
        for (int32_t i = 0; i < N; i++) {
            if (slots[i] < 0 || slots[i] >= st->n_slots || !st->slots[slots[i]].active)
                return arl_errorf(ARL_ERR_STATE,
                                  "model: document %d names slot %d, which holds "
                                  "no sequence",
                                  i, slots[i]);
            for (int32_t j = 0; j < i; j++)
                if (slots[j] == slots[i])
                    return arl_errorf(ARL_ERR_STATE,
                                      "model: slot %d appears twice in one "
                                      "forward",
                                      slots[i]);
        }
        if (memcmp(&st->dm, dm, sizeof *dm))
            return arl_errorf(ARL_ERR_CONFIG, "model: the decode state was made for another "
                                              "model config");
        /* block-sparse MLA reads chunk summaries kept beside the caches (spec 4.5) */
        if (m->mla.sparse_topk > 0 && dm->n_mla > 0)
            ARL_TRY(arl_decode_state_keep_means(st, m->mla.sparse_chunk));
        for (int32_t i = 0; i < N; i++) {
            int64_t end = st->slots[slots[i]].pos + cu[i + 1] - cu[i];
            if (dm->n_mla > 0 && end > m->mla.max_rows)
                return arl_errorf(ARL_ERR_RANGE,
                                  "model: the sequence of slot %d would reach "
                                  "%lld positions, the model was set up for %lld (max_context)",
                                  slots[i], (long long)end, (long long)m->mla.max_rows);
            ARL_TRY(arl_decode_state_reserve(st, slots[i], end));
        }
    }
    if (out && out->acts && st)
        return arl_errorf(ARL_ERR_ARG, "model: saved activations are for fresh documents only");

    /* 2.1 embedding; image token rows replace the placeholders (10.1) */
    float *p = m->res;
    ARL_TRY(arl_vision_place(p, w->embed_tokens, dm->V, d, b->tokens, T,
                             m->cfg->media_placeholder_token_id, b->media, b->n_media));

    arl_model_acts *acts = out ? out->acts : NULL;
    float *chunk_states = acts ? acts->kda_chunks : NULL;
    const float *src[ARL_ATTNRES_MAX_SOURCES];
    int32_t nb = 0; /* AttnRes block entries so far; they are res slots 0..nb-1, p is slot nb */

    for (int64_t l = 0; l < L; l++) {
        const arl_layer_params *lp = &w->layers[l];
        if (acts) memcpy(acts->layer_in + l * Td, p, sizeof(float) * (size_t)Td);
        const float *h = p;
        if (B > 0) {
            /* 5.2: h = Mix(blocks ++ [p]) (p itself at l = 0); at a block start snapshot the
             * pre-mixer p as a block entry and restart p from 0 */
            if (nb > 0) {
                for (int32_t j = 0; j <= nb; j++)
                    src[j] = m->res + j * Td;
                arl_attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, lp->attn_res_norm,
                                    lp->attn_res_proj, m->eps);
                h = m->hbuf;
            }
            if (l % B == 0) {
                nb++;
                p = m->res + nb * Td;
                memset(p, 0, sizeof(float) * (size_t)Td);
            }
        }
        arl_k_rmsnorm_fwd(m->xbuf, NULL, h, lp->input_norm, T, d, m->eps);
        run_mixer(m, l, cu, N, T, one_token_docs, st, slots, chunk_states);
        if (chunk_states && lp->kind == ARL_LAYER_KDA)
            chunk_states += acts->n_chunks * dm->H * dm->dk * dm->dv;
        add_rows(p, m->ybuf, Td);

        const float *mx = p;
        if (B > 0) {
            for (int32_t j = 0; j <= nb; j++)
                src[j] = m->res + j * Td;
            arl_attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, lp->mlp_res_norm,
                                lp->mlp_res_proj, m->eps);
            mx = m->hbuf;
        }
        arl_k_rmsnorm_fwd(m->xbuf, NULL, mx, lp->post_norm, T, d, m->eps);
        run_ffn(m, l, b, out, T);
        add_rows(p, m->ybuf, Td);
    }

    if (acts) {
        memcpy(acts->final_in, p, sizeof(float) * (size_t)Td);
        if (m->n_blocks) memcpy(acts->blocks, m->res, sizeof(float) * (size_t)(nb * Td));
    }
    const float *fin = p;
    if (B > 0) {
        for (int32_t j = 0; j <= nb; j++)
            src[j] = m->res + j * Td;
        arl_attnres_mix_fwd(m->hbuf, NULL, src, nb + 1, T, d, w->out_res_norm, w->out_res_proj,
                            m->eps);
        fin = m->hbuf;
    }
    arl_k_rmsnorm_fwd(m->xbuf, NULL, fin, w->norm, T, d, m->eps);
    run_head(m, b, out, T);

    if (st)
        for (int32_t i = 0; i < N; i++)
            st->slots[slots[i]].pos += cu[i + 1] - cu[i];
    return ARL_OK;
}

arl_status arl_model_forward(arl_model *m, const arl_batch *b, const arl_forward_out *out) {
    return model_run(m, b, NULL, NULL, out);
}

arl_status arl_model_forward_state(arl_model *m, arl_decode_state *st, const int32_t *slots,
                                   const arl_batch *b, const arl_forward_out *out) {
    ARL_ASSERT(st && slots);
    return model_run(m, b, st, slots, out);
}

arl_status arl_model_prefill(arl_model *m, arl_decode_state *st, int32_t slot,
                             const int32_t *tokens, int64_t n, const float *media, int64_t n_media,
                             float *logits, float *last_logits) {
    if (n < 1) return arl_errorf(ARL_ERR_ARG, "model: prefill of an empty sequence");
    const int64_t V = m->dm.V, media_id = m->cfg->media_placeholder_token_id;
    int64_t used_media = 0;
    for (int64_t t0 = 0; t0 < n; t0 += m->opts.max_tokens) {
        int64_t c = n - t0 < m->opts.max_tokens ? n - t0 : m->opts.max_tokens;
        int64_t ph = 0;
        for (int64_t t = t0; t < t0 + c; t++)
            ph += tokens[t] == media_id;
        if (media && used_media + ph > n_media)
            return arl_errorf(ARL_ERR_ARG,
                              "model: prefill has more <|media_pad|> placeholders "
                              "than the %lld image token rows given",
                              (long long)n_media);
        arl_batch b = {.tokens = tokens + t0,
                       .T = c,
                       .cu = NULL,
                       .N = 1,
                       .media = media ? media + used_media * m->dm.d : NULL,
                       .n_media = ph};
        arl_forward_out o = {.logits = logits ? logits + t0 * V : NULL};
        ARL_TRY(arl_model_forward_state(m, st, &slot, &b, &o));
        if (!logits && last_logits && t0 + c == n) /* xbuf holds the final-norm rows */
            arl_k_linear_fwd(last_logits, m->xbuf + (c - 1) * m->dm.d, m->w->lm_head, 1, m->dm.d,
                             V);
        used_media += ph;
    }
    if (media && used_media != n_media)
        return arl_errorf(ARL_ERR_ARG,
                          "model: prefill has %lld <|media_pad|> placeholders but "
                          "%lld image token rows were given",
                          (long long)used_media, (long long)n_media);
    if (logits && last_logits) memcpy(last_logits, logits + (n - 1) * V, sizeof(float) * V);
    return ARL_OK;
}

arl_status arl_model_decode_step(arl_model *m, arl_decode_state *st, const int32_t *slots,
                                 int32_t n, const int32_t *tokens, float *logits, int32_t *routes) {
    if (n < 1 || n > m->opts.max_docs)
        return arl_errorf(ARL_ERR_RANGE,
                          "model: decode step over %d sequences, the model takes "
                          "1..%d (max_docs)",
                          n, m->opts.max_docs);
    for (int32_t i = 0; i <= n; i++)
        m->cu1[i] = i;
    arl_batch b = {.tokens = tokens, .T = n, .cu = m->cu1, .N = n};
    arl_forward_out o = {.logits = logits, .routes = routes};
    return arl_model_forward_state(m, st, slots, &b, &o);
}

void arl_batch_next_token_targets(int32_t *targets, const int32_t *tokens, const int32_t *cu,
                                  int32_t N, int64_t T) {
    if (!cu) N = 1;
    for (int32_t i = 0; i < N; i++) {
        int64_t a = arl_doc_lo(cu, i), e = arl_doc_hi(cu, i, T);
        for (int64_t t = a; t < e; t++)
            targets[t] = t + 1 < e ? tokens[t + 1] : -1;
    }
}
