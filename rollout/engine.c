/* rollout/engine.c: the rollout worker's inference engine (see engine.h). */
#include "rollout/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "kernels/cuda/cuda.h"
#include "kernels/gemm.h"
#include "policy/checkpoint.h"

/* The CUDA context the engines of this thread opened (NULL: none), and how many engines use it.
 * It lives until the process exits (as arl_dev_ops_get's own) unless a later engine needs a
 * larger arena while no engine is open: then it is replaced (an experiment's context stages
 * grow max_context from one update's worker to the next). */
static _Thread_local arl_cuda_ctx *g_ctx;
static _Thread_local int32_t g_ctx_users;

arl_status ro_template_from_config(const arl_model_config *cfg, arl_chat_template *t) {
    arl_chat_template_default(t);
    t->tok.vocab_size = (int32_t)cfg->dims.V;
    t->tok.special[ARL_SPECIAL_BOS] = (int32_t)cfg->text.bos_token_id;
    t->tok.special[ARL_SPECIAL_EOS] = (int32_t)cfg->text.eos_token_id;
    t->tok.special[ARL_SPECIAL_PAD] = (int32_t)cfg->text.pad_token_id;
    if (cfg->media_placeholder_token_id != ARL_CONFIG_ABSENT)
        t->tok.special[ARL_SPECIAL_MEDIA_PAD] = (int32_t)cfg->media_placeholder_token_id;
    t->patch_size = cfg->has_vision ? (int32_t)cfg->dims.vp : 0;
    arl_status s = arl_tokenizer_spec_validate(&t->tok);
    if (s)
        return arl_error_prefix(s, "the checkpoint's vocabulary does not fit the byte-level "
                                   "chat template");
    return ARL_OK;
}

void ro_engine_close(ro_engine *e) {
    if (!e) return;
    free(e->logits);
    free(e->routes);
    free(e->tok);
    free(e->cu);
    free(e->slots);
    free(e->media);
    arl_sampler_free(&e->smp);
    free(e->dev_rows);
    arl_decode_state_free(&e->st);
    arl_model_free(&e->m);
    arl_model_dev_free(&e->md);
    g_ctx_users -= e->ctx_user;
    arl_model_params_free(&e->params[0]);
    arl_model_params_free(&e->params[1]);
    arl_model_config_free(&e->cfg);
    memset(e, 0, sizeof *e);
}

/* The CUDA context of this process's GPU (o->device_index) with room for `need` bytes of
 * model, made current, unless the thread has a context of its own already.  Without a GPU
 * nothing is opened: arl_dev_ops_get then says why. */
static arl_status open_gpu(const ro_engine_opts *o, size_t need) {
    const size_t bytes = need + ((size_t)64 << 20); /* + the context's own part */
    const int32_t n = arl_cuda_device_count();
    arl_cuda_ctx *cur = arl_cuda_current();
    if (cur && cur == g_ctx && g_ctx_users == 0 && arl_cuda_arena_free(cur) < need) {
        arl_cuda_make_current(NULL); /* ours, unused, too small: replace it */
        arl_cuda_close(cur);
        g_ctx = cur = NULL;
    }
    if (cur || n <= 0) return ARL_OK;
    const int32_t idx = o->device_index < 0 ? arl_cuda_local_device() : o->device_index;
    if (idx >= n)
        return arl_errorf(ARL_ERR_ARG, "rollout: device-index %d, this machine has %d GPU(s)", idx,
                          n);
    arl_cuda_config c;
    arl_cuda_config_defaults(&c);
    c.device = idx;
    c.arena_bytes = bytes;
    arl_cuda_ctx *ctx = NULL;
    arl_status s = arl_cuda_open(&c, &ctx);
    if (s) return arl_error_prefix(s, "rollout: device cuda (GPU %d)", idx);
    arl_cuda_make_current(ctx);
    g_ctx = ctx;
    return ARL_OK;
}

arl_status ro_engine_open(ro_engine *e, const char *ckpt_dir, int64_t version,
                          const ro_engine_opts *o) {
    memset(e, 0, sizeof *e);
    e->o = *o;
    arl_status s = arl_model_config_read(ckpt_dir, &e->cfg);
    if (s) return arl_error_prefix(s, "rollout: checkpoint %s", ckpt_dir);
    ARL_TRY(arl_model_config_hash_hex(&e->cfg, e->cfg_hash));
    const arl_model_dims *dm = &e->cfg.dims;
    e->V = dm->V;
    e->d = dm->d;
    e->n_moe = dm->n_moe;
    e->k = dm->n_moe ? dm->k : 0;
    e->E = dm->E;
    e->route_bytes = dm->E <= 255 ? 1 : 2;
    e->version = version;
    ARL_TRY(ro_template_from_config(&e->cfg, &e->tpl));
    ARL_TRY(arl_model_params_alloc(&e->params[0], &e->cfg));
    s = arl_checkpoint_load(ckpt_dir, &e->cfg, &e->params[0]);
    if (s) return arl_error_prefix(s, "rollout: loading %s", ckpt_dir);
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = o->max_tokens;
    mo.max_docs = o->n_slots;
    mo.max_context = o->max_context;
    mo.max_context_key = o->max_context_key;
    mo.mla_sparse_topk = o->sparse_topk;
    mo.mla_sparse_chunk = o->sparse_chunk;
    if (o->device) { /* block-sparse MLA (mo.mla_sparse_topk > 0) included */
        if (o->bf16_weights && strcmp(o->device, "cuda"))
            return arl_errorf(ARL_ERR_ARG, "rollout: bf16 weights exist only on device cuda");
        if (o->decode_graphs && strcmp(o->device, "cuda"))
            return arl_errorf(ARL_ERR_ARG, "rollout: CUDA graphs exist only on device cuda");
        arl_model_dev_opts dopts = {.n_slots = o->n_slots, .bf16_weights = o->bf16_weights,
                                    .decode_graphs = o->decode_graphs};
        /* the model's block plus the context's own part (cuBLAS workspace, tables) */
        const int64_t need = strcmp(o->device, "cuda")
                                 ? 0
                                 : arl_model_dev_bytes(&e->cfg, &mo, arl_dev_ops_cuda(), &dopts);
        if (!strcmp(o->device, "cuda")) ARL_TRY(open_gpu(o, (size_t)need));
        s = arl_dev_ops_get(o->device, (size_t)need + ((size_t)64 << 20), &e->ops);
        if (s) return arl_error_prefix(s, "rollout: device %s", o->device);
        s = arl_model_dev_init(&e->md, e->ops, &e->cfg, &e->params[0], &mo, &dopts);
        if (s) return arl_error_prefix(s, "rollout: the model on device %s", o->device);
        e->ctx_user = arl_cuda_current() && arl_cuda_current() == g_ctx;
        g_ctx_users += e->ctx_user;
        e->dev_rows = malloc(sizeof(int64_t) * (size_t)o->n_slots);
        if (!e->dev_rows) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (engine rows)");
        snprintf(e->numerics, sizeof e->numerics, "%s",
                 strcmp(o->device, "cuda") ? "cpu-f32" : o->bf16_weights ? "cuda-bf16w" : "cuda-f32");
    } else {
        ARL_TRY(arl_model_init(&e->m, &e->cfg, &e->params[0], &mo));
        snprintf(e->numerics, sizeof e->numerics, "%s", "cpu-f32");
    }
    ARL_TRY(arl_decode_state_init(&e->st, &e->cfg, o->n_slots, o->max_context));
    ARL_TRY(arl_sampler_init(&e->smp, e->V));
    const size_t T = (size_t)o->max_tokens, N = (size_t)o->n_slots;
    e->logits = malloc(sizeof(float) * N * (size_t)e->V);
    e->routes = malloc(sizeof(int32_t) * (size_t)(e->n_moe ? e->n_moe : 1) * T *
                       (size_t)(e->k ? e->k : 1));
    e->tok = malloc(sizeof(int32_t) * T);
    e->cu = malloc(sizeof(int32_t) * (N + 1));
    e->slots = malloc(sizeof(int32_t) * N);
    e->media = malloc(sizeof(float) * T * (size_t)e->d);
    if (!e->logits || !e->routes || !e->tok || !e->cu || !e->slots || !e->media)
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (engine buffers)");
    return ARL_OK;
}

arl_status ro_engine_load_next(ro_engine *e, const char *ckpt_dir, int64_t version) {
    arl_model_config c;
    arl_status s = arl_model_config_read(ckpt_dir, &c);
    if (s) return arl_error_prefix(s, "rollout: new policy version %lld", (long long)version);
    char h[65];
    s = arl_model_config_hash_hex(&c, h);
    arl_model_config_free(&c);
    if (s) return arl_error_prefix(s, "rollout: new policy version %lld", (long long)version);
    if (strcmp(h, e->cfg_hash))
        return arl_errorf(ARL_ERR_CONFIG,
                          "rollout: policy version %lld at %s has config hash %s, the running "
                          "model %s (a new version must keep the architecture)",
                          (long long)version, ckpt_dir, h, e->cfg_hash);
    arl_model_params *p = &e->params[1 - e->cur];
    if (!p->arena) ARL_TRY(arl_model_params_alloc(p, &e->cfg));
    e->have_next = 0;
    e->wsha[1 - e->cur][0] = 0;
    s = arl_checkpoint_load(ckpt_dir, &e->cfg, p);
    if (s) return arl_error_prefix(s, "rollout: loading policy version %lld", (long long)version);
    e->have_next = 1;
    e->next_version = version;
    return ARL_OK;
}

arl_status ro_engine_swap(ro_engine *e) {
    if (!e->have_next) return ARL_OK;
    if (e->ops) { /* the device keeps its own copy: upload the next version's weights */
        arl_status s = arl_model_dev_set_params(&e->md, &e->params[1 - e->cur]);
        if (s)
            return arl_error_prefix(s, "rollout: policy version %lld to device %s",
                                    (long long)e->next_version, e->ops->name);
    }
    e->cur = 1 - e->cur;
    e->m.w = &e->params[e->cur]; /* the model borrows its parameters; same config */
    e->version = e->next_version;
    e->have_next = 0;
    return ARL_OK;
}

const arl_model_params *ro_engine_params(const ro_engine *e) {
    return &e->params[e->cur];
}

arl_status ro_engine_forward(ro_engine *e, int32_t N, const int32_t *slots, const int32_t *cu,
                             const int32_t *tokens, int64_t T, const float *media,
                             int64_t n_media, const int *want, float *logits) {
    arl_batch b = {.tokens = tokens, .T = T, .cu = cu, .N = N, .media = media, .n_media = n_media};
    arl_forward_out out = {.routes = e->n_moe ? e->routes : NULL};
    if (e->ops) {
        for (int32_t i = 0; i < N; i++) /* the device model keeps the slots' positions */
            if (slots[i] < 0 || slots[i] >= e->st.n_slots || !e->st.slots[slots[i]].active)
                return arl_errorf(ARL_ERR_STATE, "rollout: forward over inactive slot %d",
                                  slots[i]);
        ARL_TRY(arl_model_dev_forward_state(&e->md, slots, &b, &out));
        if (!want || !logits) return ARL_OK;
        int32_t n = 0;
        for (int32_t i = 0; i < N; i++)
            if (want[i]) e->dev_rows[n++] = cu[i + 1] - 1;
        if (n == 0) return ARL_OK;
        ARL_TRY(arl_model_dev_rows_logits(&e->md, n, e->dev_rows, e->logits));
        /* rows j <= i: spread from the top (logits may be e->logits) */
        for (int32_t i = N - 1, j = n - 1; i >= 0; i--)
            if (want[i]) {
                if (logits + (int64_t)i * e->V != e->logits + (int64_t)j * e->V)
                    memmove(logits + (int64_t)i * e->V, e->logits + (int64_t)j * e->V,
                            sizeof(float) * (size_t)e->V);
                j--;
            }
        return ARL_OK;
    }
    ARL_TRY(arl_model_forward_state(&e->m, &e->st, slots, &b, &out));
    if (want && logits)
        for (int32_t i = 0; i < N; i++) /* m.xbuf holds the final-norm rows (T, d) */
            if (want[i])
                arl_k_linear_fwd(logits + (int64_t)i * e->V, e->m.xbuf + (int64_t)(cu[i + 1] - 1) * e->d,
                                 e->m.w->lm_head, 1, e->d, e->V);
    return ARL_OK;
}

arl_status ro_engine_decode(ro_engine *e, int32_t n, const int32_t *slots, const int32_t *tokens) {
    if (e->ops) {
        for (int32_t i = 0; i < n; i++)
            if (slots[i] < 0 || slots[i] >= e->st.n_slots || !e->st.slots[slots[i]].active)
                return arl_errorf(ARL_ERR_STATE, "rollout: decode step over inactive slot %d",
                                  slots[i]);
        return arl_model_dev_decode_step(&e->md, slots, n, tokens, e->logits,
                                         e->n_moe ? e->routes : NULL);
    }
    return arl_model_decode_step(&e->m, &e->st, slots, n, tokens, e->logits,
                                 e->n_moe ? e->routes : NULL);
}

arl_status ro_engine_score(ro_engine *e, const int32_t *slots, const arl_batch *b,
                           const arl_forward_out *out) {
    const int32_t N = b->cu ? b->N : 1;
    for (int32_t i = 0; i < N; i++)
        if (slots[i] < 0 || slots[i] >= e->st.n_slots || !e->st.slots[slots[i]].active)
            return arl_errorf(ARL_ERR_STATE, "rollout: forward over inactive slot %d", slots[i]);
    if (e->ops) {
        ARL_TRY(arl_model_dev_forward_state(&e->md, slots, b, out));
        return ARL_OK;
    }
    return arl_model_forward_state(&e->m, &e->st, slots, b, out);
}

int64_t ro_engine_slot_pos(const ro_engine *e, int32_t slot) {
    return e->ops ? arl_model_dev_slot_pos(&e->md, slot) : arl_decode_state_position(&e->st, slot);
}

arl_status ro_engine_slot_join(ro_engine *e, int32_t *slot) {
    ARL_TRY(arl_decode_state_join(&e->st, slot));
    if (e->ops) {
        arl_status s = arl_model_dev_slot_reset(&e->md, *slot);
        if (s) {
            arl_decode_state_leave(&e->st, *slot);
            return s;
        }
    }
    return ARL_OK;
}

arl_status ro_engine_slot_reset(ro_engine *e, int32_t slot) {
    arl_decode_state_reset(&e->st, slot);
    return e->ops ? arl_model_dev_slot_reset(&e->md, slot) : ARL_OK;
}

arl_status ro_engine_slot_import(ro_engine *e, int32_t slot, const void *buf, size_t len) {
    ARL_TRY(arl_decode_state_import(&e->st, slot, buf, len));
    if (!e->ops) return ARL_OK;
    arl_status s = arl_model_dev_slot_upload(&e->md, slot, &e->st, slot);
    if (s) { /* neither side keeps a half-imported state */
        arl_decode_state_reset(&e->st, slot);
        arl_model_dev_slot_reset(&e->md, slot);
    }
    return s;
}

arl_status ro_engine_slot_sync(ro_engine *e, int32_t slot, int64_t row0) {
    if (!e->ops) return ARL_OK;
    return arl_model_dev_slot_download(&e->md, slot, &e->st, slot, row0);
}

void ro_engine_weights_sha256(ro_engine *e, int which, char hex[65]) {
    if (!e->wsha[which][0]) arl_model_params_sha256_hex(&e->params[which], e->wsha[which]);
    memcpy(hex, e->wsha[which], 65);
}
