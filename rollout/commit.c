/* rollout/commit.c: what a rollout writes into the replay store - env_calls and reward rows of a
 * trajectory's calls, the segment description of the open segment (routes transposed to the
 * store's layer-major layout), and the decode state at a boundary as rollout states (S_s of
 * spec/replay.md 7.1: the KDA boundary and the segment's own MLA rows); and the way back:
 * stored boundary parts assembled into an ARLS export for arl_decode_state_import. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/json_dump.h"
#include "rollout/boundary.h"
#include "rollout/internal.h"
#include "rollout/rescore.h"


static const char *endpoint_name(arl_env_endpoint ep, int64_t segment_index) {
    switch (ep) {
    case ARL_ENV_EP_CREATE: return "create";
    case ARL_ENV_EP_STEP: return "step";
    case ARL_ENV_EP_SCORE: return segment_index >= 0 ? "score_segment" : "score_episode";
    case ARL_ENV_EP_FORK: return "fork";
    case ARL_ENV_EP_GET: return "get";
    case ARL_ENV_EP_DELETE: return "delete";
    default: return "get";
    }
}

arl_status ro_record_call(ro_traj *t, const arl_env_call *c, int in_finish, int64_t step_index,
                          int64_t segment_index, int64_t *seq) {
    ro_strs *p = &t->seg.strs;
    int64_t now = ro_now_ms();
    replay_env_call r;
    memset(&r, 0, sizeof r);
    r.call_seq = t->call_seq++;
    r.endpoint = endpoint_name(c->endpoint, segment_index);
    const char *sid = t->sess ? arl_env_session_id(t->sess) : NULL;
    r.session_id = sid && *sid ? ro_strs_cstr(p, sid) : NULL;
    r.step_index = step_index;
    r.segment_index = segment_index;
    r.http_status = c->http_status > 0 ? c->http_status : -1;
    r.error_code = c->error.code != ARL_ENV_E_NONE ? ro_strs_cstr(p, c->error.code_str) : NULL;
    r.attempts = c->attempts > 0 ? c->attempts : 1;
    if (c->error.code != ARL_ENV_E_NONE && (c->error.violation[0] || c->error.message[0])) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:I}", "code", c->error.code_str, "message",
                              c->error.message, "violation", c->error.violation, "response_bytes",
                              (json_int_t)c->response_total);
        char *txt = j ? arl_json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        r.attempt_log_json = ro_strs_take(p, txt);
        if (!r.attempt_log_json) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    r.latency_ms = c->elapsed_ms;
    r.started_at_ms = now - c->elapsed_ms;
    r.response_complete = c->response && c->response_complete ? 1 : 0;
    r.response_len = c->response ? (int64_t)c->response_total : -1;
    if (c->request) {
        r.request = (const uint8_t *)ro_strs_dup(p, c->request, c->request_len);
        r.request_nbytes = c->request_len;
    }
    if (c->response) {
        r.response = (const uint8_t *)ro_strs_dup(p, c->response, c->response_len);
        r.response_nbytes = c->response_len;
    }
    if ((c->request && !r.request) || (c->response && !r.response) ||
        (sid && *sid && !r.session_id) || (c->error.code != ARL_ENV_E_NONE && !r.error_code))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    if (seq) *seq = r.call_seq;
    if (!in_finish) return ro_seg_add_call(&t->seg, &r);
    if (t->n_fin_calls == t->cap_fin_calls) {
        size_t cap = t->cap_fin_calls ? 2 * t->cap_fin_calls : 4;
        replay_env_call *v = realloc(t->fin_calls, cap * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        t->fin_calls = v;
        t->cap_fin_calls = cap;
    }
    t->fin_calls[t->n_fin_calls++] = r;
    return ARL_OK;
}

static arl_status add_reward(ro_traj *t, int in_finish, const replay_reward *r) {
    if (!in_finish) return ro_seg_add_reward(&t->seg, r);
    if (t->n_fin_rewards >= sizeof t->fin_rewards / sizeof t->fin_rewards[0])
        return arl_errorf(ARL_ERR_INTERNAL, "rollout: too many outcome reward rows");
    t->fin_rewards[t->n_fin_rewards++] = *r;
    return ARL_OK;
}

arl_status ro_rewards_rows(ro_traj *t, const char *level, int64_t scope, double reward,
                           int scorable, const arl_env_component *c, int32_t n, int64_t call_seq,
                           int in_finish) {
    replay_reward r = {.level = level, .scope_index = scope, .component = "", .source = NULL,
                       .value = scorable ? reward : NAN, .call_seq = call_seq};
    ARL_TRY(add_reward(t, in_finish, &r));
    for (int32_t i = 0; i < n; i++) {
        replay_reward rc = r;
        rc.component = ro_strs_cstr(&t->seg.strs, c[i].name);
        if (!rc.component) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        rc.value = c[i].value;
        ARL_TRY(add_reward(t, in_finish, &rc));
    }
    if (scorable) { /* no component weights are configured: the derived value is `reward` */
        replay_reward rd = r;
        rd.component = "@derived";
        ARL_TRY(add_reward(t, in_finish, &rd));
    }
    return ARL_OK;
}

arl_status ro_seg_desc(arl_rollout_worker *w, ro_traj *t, const char *end_cause, int64_t end_id,
                       int64_t lat_id, replay_segment_desc *d) {
    ro_seg *s = &t->seg;
    const ro_engine *e = &w->eng;
    memset(d, 0, sizeof *d);
    d->seg_index = s->seg_index;
    d->start_kind = s->start_kind;
    d->end_cause = end_cause;
    d->first_step = s->first_step;
    d->last_step = s->last_step;
    d->tok_start = s->tok_start;
    d->ctx_start = s->ctx_start;
    d->n_tokens = s->n;
    d->tokens = s->tokens;
    d->logprobs = s->logprobs;
    d->loss_mask = s->mask;
    d->versions = s->versions;
    d->end_state_id = end_id;
    d->latent_state_id = lat_id;
    d->session_id = t->sess && *arl_env_session_id(t->sess) ? arl_env_session_id(t->sess) : NULL;
    d->turns = s->turns;
    d->n_turns = s->n_turns;
    d->env_calls = s->calls;
    d->n_env_calls = s->n_calls;
    d->tool_calls = s->tools;
    d->n_tool_calls = s->n_tools;
    d->rewards = s->rewards;
    d->n_rewards = s->n_rewards;
    if (s->rk && s->n) {
        size_t need = (size_t)s->n * (size_t)s->rk * (size_t)s->route_bytes;
        if (need > w->route_scratch_cap) {
            uint8_t *p = realloc(w->route_scratch, need);
            if (!p) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (routes)");
            w->route_scratch = p;
            w->route_scratch_cap = need;
        }
        const int64_t L = e->n_moe, k = e->k, T = s->n, b = s->route_bytes;
        for (int64_t l = 0; l < L; l++)
            for (int64_t i = 0; i < T; i++)
                memcpy(w->route_scratch + (size_t)((l * T + i) * k * b),
                       s->routes + (size_t)((i * s->rk + l * k) * b), (size_t)(k * b));
        d->n_moe_layers = (int32_t)L;
        d->route_k = (int32_t)k;
        d->route_dtype = b == 1 ? ARL_BLOB_U8 : ARL_BLOB_U16;
        d->routes = w->route_scratch;
        static char layout[96];
        snprintf(layout, sizeof layout, "moe_layers=%lld;k=%lld;experts=%lld;dtype=%s",
                 (long long)L, (long long)k, (long long)e->E, b == 1 ? "u8" : "u16");
        d->routes_layout = layout;
    }
    return ARL_OK;
}

arl_status ro_states_put(arl_rollout_worker *w, ro_traj *t, int64_t *end_id, int64_t *lat_id) {
    const ro_seg *s = &t->seg;
    uint32_t vmin = UINT32_MAX, vmax = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (s->versions[i] < vmin) vmin = s->versions[i];
        if (s->versions[i] > vmax) vmax = s->versions[i];
    }
    replay_state_desc id = {.traj_uid = t->uid, .seg_index = s->seg_index, .producer = "rollout",
                            .pass_uid = t->pass_uid, .version_min = t->ctx_vmin,
                            .version_max = t->ctx_vmax, .routing = "natural"};
    arl_status st = ro_engine_slot_sync(&w->eng, t->slot, s->ctx_start);
    if (st == ARL_OK)
        st = ro_boundary_put(w->w, &w->eng, t->slot, &id, s->ctx_start, s->n, vmin, vmax, end_id,
                             lat_id);
    return st ? arl_error_prefix(st, "rollout") : ARL_OK;
}

/* ---- boundary parts -> ARLS export (policy/state.h) ---- */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static size_t blob_size(const replay_state_chunk_data *c) {
    return ARL_BLOB_HEADER_SIZE + (size_t)c->h.payload_nbytes;
}

arl_status arl_rollout_state_assemble(const arl_model_config *cfg, const char *cfg_hash,
                                const char *numerics, const replay_state_data *parts, size_t n_parts, uint8_t **out,
                                size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (n_parts < 1) return arl_errorf(ARL_ERR_NOT_FOUND, "rollout: no boundary state");
    for (size_t i = 0; i < n_parts; i++) {
        if (strcmp(parts[i].model_config_sha256, cfg_hash))
            return arl_errorf(ARL_ERR_NOT_FOUND,
                              "state %lld was computed by another model config (%s, not %s): "
                              "cache miss",
                              (long long)parts[i].state_id, parts[i].model_config_sha256, cfg_hash);
        if (strcmp(parts[i].numerics, numerics))
            return arl_errorf(ARL_ERR_NOT_FOUND, "state %lld has numerics %s, this engine %s: "
                                                 "cache miss",
                              (long long)parts[i].state_id, parts[i].numerics, numerics);
    }
    const int64_t pos = parts[0].ctx_start + parts[0].n_tokens;
    int64_t want_ctx = 0;
    for (size_t i = 1; i < n_parts; i++) {
        if (parts[i].ctx_start != want_ctx)
            return arl_errorf(ARL_ERR_NOT_FOUND, "boundary parts are not contiguous: cache miss");
        want_ctx += parts[i].n_tokens;
    }
    if (n_parts > 1 && want_ctx != pos)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "boundary at position %lld but its MLA parts cover %lld rows: cache miss",
                          (long long)pos, (long long)want_ctx);
    /* size */
    size_t total = 64;
    uint32_t n_blobs = 0;
    for (size_t i = 0; i < n_parts; i++)
        for (size_t j = 0; j < parts[i].n_chunks; j++) {
            total += blob_size(&parts[i].chunks[j]);
            n_blobs++;
        }
    uint8_t *b = malloc(total);
    if (!b) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (%zu-byte state)", total);
    memset(b, 0, 64);
    size_t at = 64;
    uint32_t written = 0;
    arl_status s = ARL_OK;
    for (int64_t l = 0; l < cfg->dims.L && s == ARL_OK; l++) {
        int kda = arl_model_config_layer_kind(cfg, l) == ARL_LAYER_KDA;
        for (size_t i = kda ? 0 : 1; i < (kda ? 1 : n_parts) && s == ARL_OK; i++) {
            const replay_state_data *p = &parts[i];
            const char *want[2] = {kda ? "S" : "latent", kda ? "conv" : NULL};
            for (int w = 0; w < 2 && want[w]; w++)
                for (size_t j = 0; j < p->n_chunks; j++) { /* chunks are ordered by row_start */
                    const replay_state_chunk_data *c = &p->chunks[j];
                    if (c->layer != l || strcmp(c->tensor, want[w])) continue;
                    size_t len;
                    s = arl_blob_encode((arl_blob_kind)c->h.kind, (arl_blob_dtype)c->h.dtype,
                                        c->h.ndim, c->h.dims, c->data, b + at, total - at, &len);
                    if (s) break;
                    at += len;
                    written++;
                }
        }
    }
    if (s == ARL_OK && written != n_blobs)
        s = arl_errorf(ARL_ERR_NOT_FOUND, "boundary state has %u chunks that fit no layer: cache miss",
                       n_blobs - written);
    if (s) {
        free(b);
        return s;
    }
    memcpy(b, ARL_STATE_MAGIC, 4);
    put_u16(b + 4, ARL_STATE_FORMAT_VERSION);
    put_u16(b + 6, ARL_STATE_HEADER_SIZE);
    for (int i = 0; i < 32; i++) { /* config hash, raw */
        unsigned v;
        sscanf(cfg_hash + 2 * i, "%2x", &v);
        b[8 + i] = (uint8_t)v;
    }
    put_u64(b + 40, (uint64_t)pos);
    put_u32(b + 48, written);
    b[52] = ARL_BLOB_F32;
    for (size_t i = 1; i < n_parts; i++)
        for (size_t j = 0; j < parts[i].n_chunks; j++)
            if (parts[i].chunks[j].h.dtype == ARL_BLOB_BF16) b[52] = ARL_BLOB_BF16;
    put_u32(b + 60, arl_crc32(b, 60));
    *out = b;
    *out_len = at;
    return ARL_OK;
}
