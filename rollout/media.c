/* rollout/media.c: image token rows of a stored trajectory rebuilt from the store (see
 * rollout/media.h). */
#include "rollout/media.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "envs/aep_json.h"
#include "policy/image.h"
#include "policy/vision.h"
#include "rollout/store_read.h"

void ro_media_free(ro_media *m) {
    if (!m) return;
    free(m->rows);
    free(m->step_row);
    free(m->step_reset);
    memset(m, 0, sizeof *m);
}

typedef struct img_list {
    arl_image *v;
    int32_t n, cap;
} img_list;

static void img_list_clear(img_list *l) {
    for (int32_t i = 0; i < l->n; i++)
        arl_image_free(&l->v[i]);
    l->n = 0;
}

/* The images of one stored response body (its observation's image parts, in order) and
 * whether the observation is a `reset`. */
static arl_status parse_obs(const char *body, size_t len, int64_t call_seq, img_list *out,
                            int *reset) {
    json_error_t je;
    json_t *root = arl_json_loadb(body, len, 0, &je);
    if (!root && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory reading the stored response of "
                          "call %lld", (long long)call_seq);
    const json_t *obs = root ? json_object_get(root, "observation") : NULL;
    if (!obs) {
        json_decref(root);
        return arl_errorf(ARL_ERR_CORRUPT,
                          "rollout: stored response of call %lld has no "
                          "observation",
                          (long long)call_seq);
    }
    const char *ctx = json_string_value(json_object_get(obs, "context"));
    *reset = ctx && !strcmp(ctx, "reset");
    arl_status s = ARL_OK;
    size_t i, j;
    json_t *msg, *part;
    json_array_foreach(json_object_get(obs, "messages"), i, msg) {
        json_t *content = json_object_get(msg, "content");
        if (!json_is_array(content)) continue;
        json_array_foreach(content, j, part) {
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "image")) continue;
            json_t *data = json_object_get(json_object_get(part, "image"), "data");
            uint8_t *png = NULL;
            size_t plen = 0;
            if (!json_is_string(data) ||
                aep_b64_decode_canonical(json_string_value(data), json_string_length(data), &png,
                                         &plen)) {
                s = arl_errorf(ARL_ERR_CORRUPT,
                               "rollout: stored response of call %lld: image "
                               "part %zu of message %zu has no PNG data",
                               (long long)call_seq, j, i);
                break;
            }
            if (out->n == out->cap) {
                int32_t c = out->cap ? 2 * out->cap : 4;
                arl_image *v = realloc(out->v, (size_t)c * sizeof *v);
                if (!v) {
                    free(png);
                    s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                    break;
                }
                out->v = v;
                out->cap = c;
            }
            s = arl_image_decode(png, plen, ARL_IMAGE_MAX_PIXELS_DEFAULT, "stored image",
                                 &out->v[out->n]);
            free(png);
            if (s) break;
            out->n++;
        }
        if (s) break;
    }
    json_decref(root);
    return s;
}

/* The stored calls of every trajectory whose segments make up traj_id's stream: its own and,
 * for a fork, its parent's (and theirs, for a fork of a fork: spec/replay.md 13.7, the prefix
 * is read through the parent).  Step k's call lives with the trajectory whose segment holds
 * step k's turn (step 0, the create call, with the first segment's); a step no committed
 * segment holds yet is the trajectory's own. */
typedef struct call_src {
    int64_t traj_id;
    ro_calls calls;
} call_src;

typedef struct call_chain {
    call_src src[8];
    int n;
    replay_seg_ref *refs;
    size_t n_refs;
    int64_t own;
} call_chain;

static void chain_free(call_chain *ch) {
    for (int i = 0; i < ch->n; i++)
        ro_calls_free(&ch->src[i].calls);
    free(ch->refs);
    memset(ch, 0, sizeof *ch);
}

static arl_status chain_calls(replay_store *st, call_chain *ch, int64_t traj_id,
                              const ro_calls **out) {
    for (int i = 0; i < ch->n; i++)
        if (ch->src[i].traj_id == traj_id) {
            *out = &ch->src[i].calls;
            return ARL_OK;
        }
    if (ch->n == (int)(sizeof ch->src / sizeof ch->src[0]))
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "rollout: trajectory %lld: forks nested deeper "
                          "than %d levels",
                          (long long)ch->own, ch->n);
    call_src *c = &ch->src[ch->n];
    c->traj_id = traj_id;
    ARL_TRY(ro_calls_load(st, traj_id, &c->calls));
    ch->n++;
    *out = &c->calls;
    return ARL_OK;
}

/* The owner of step k's call. */
static int64_t chain_owner(const call_chain *ch, int64_t k) {
    if (ch->n_refs == 0) return ch->own;
    if (k == 0) return ch->refs[0].traj_id;
    for (size_t i = 0; i < ch->n_refs; i++)
        if (ch->refs[i].first_step <= k && k <= ch->refs[i].last_step) return ch->refs[i].traj_id;
    return ch->own;
}

void ro_media_input_free(ro_media_input *in) {
    if (!in) return;
    for (int32_t i = 0; i < in->n_obs; i++) {
        free(in->obs[i].patches);
        free(in->obs[i].grids);
    }
    free(in->obs);
    memset(in, 0, sizeof *in);
}

/* One observation's images patchified (the grids the chat template counted placeholders
 * with) into a new entry of in. */
static arl_status obs_add(ro_media_input *in, const arl_model_config *cfg, int64_t max_patches,
                          const img_list *imgs, int64_t row0) {
    ro_media_obs *v = realloc(in->obs, (size_t)(in->n_obs + 1) * sizeof *v);
    if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (image inputs)");
    in->obs = v;
    ro_media_obs *o = &in->obs[in->n_obs];
    memset(o, 0, sizeof *o);
    const int32_t p = (int32_t)cfg->dims.vp;
    o->grids = malloc(sizeof(int32_t) * 2 * (size_t)imgs->n);
    if (!o->grids) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (image inputs)");
    in->n_obs++; /* owned from here: freed with in */
    o->n_img = imgs->n;
    o->row0 = row0;
    for (int32_t i = 0; i < imgs->n; i++) {
        ARL_TRY(arl_image_grid(imgs->v[i].width, imgs->v[i].height, p, max_patches,
                               &o->grids[2 * i], &o->grids[2 * i + 1]));
        o->Np += (int64_t)o->grids[2 * i] * o->grids[2 * i + 1];
    }
    o->patches = malloc(sizeof(float) * (size_t)(o->Np * 3 * p * p));
    if (!o->patches)
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory for %lld image patches",
                          (long long)o->Np);
    int64_t at = 0;
    for (int32_t i = 0; i < imgs->n; i++) {
        arl_image_patchify(&imgs->v[i], p, o->grids[2 * i], o->grids[2 * i + 1],
                           o->patches + at * 3 * p * p);
        at += (int64_t)o->grids[2 * i] * o->grids[2 * i + 1];
    }
    if (o->Np > in->max_Np) in->max_Np = o->Np;
    return ARL_OK;
}

arl_status ro_media_load_input(replay_store *st, int64_t traj_id, const arl_model_config *cfg,
                               int64_t max_patches, ro_media_input *in, ro_media *m) {
    memset(m, 0, sizeof *m);
    memset(in, 0, sizeof *in);
    m->d = cfg->dims.d;
    m->media_id = (int32_t)cfg->media_placeholder_token_id;
    if (!cfg->has_vision) return ARL_OK;
    call_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.own = traj_id;
    const ro_calls *own;
    arl_status s = replay_traj_segments(st, traj_id, &ch.refs, &ch.n_refs);
    if (s == ARL_OK) s = chain_calls(st, &ch, traj_id, &own);
    int64_t ns = s == ARL_OK ? own->n_turn_call : 0;
    for (size_t i = 0; i < ch.n_refs; i++)
        if (ch.refs[i].last_step + 1 > ns) ns = ch.refs[i].last_step + 1;
    m->n_steps = ns;
    m->step_row = calloc((size_t)(ns ? ns : 1), sizeof *m->step_row);
    m->step_reset = calloc((size_t)(ns ? ns : 1), 1);
    if (s == ARL_OK && (!m->step_row || !m->step_reset))
        s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    img_list imgs = {0};
    for (int64_t k = 0; s == ARL_OK && k < ns; k++) {
        m->step_row[k] = m->n_rows;
        m->step_reset[k] = k == 0;
        const ro_calls *calls;
        s = chain_calls(st, &ch, chain_owner(&ch, k), &calls);
        if (s) break;
        const ro_call *c = ro_calls_step(calls, k);
        if (!c || !c->response || !c->complete || c->has_error) continue;
        int reset = 0;
        img_list_clear(&imgs);
        s = parse_obs(c->response, c->response_len, c->call_seq, &imgs, &reset);
        if (s) break;
        m->step_reset[k] |= (uint8_t)reset;
        if (!imgs.n) continue;
        s = obs_add(in, cfg, max_patches, &imgs, m->n_rows);
        if (s) break;
        m->n_rows += in->obs[in->n_obs - 1].Np / 4;
    }
    img_list_clear(&imgs);
    free(imgs.v);
    chain_free(&ch);
    if (s) {
        ro_media_input_free(in);
        ro_media_free(m);
    }
    return s;
}

arl_status ro_media_load(replay_store *st, int64_t traj_id, const ro_engine *e, ro_media *m) {
    ro_media_input in;
    ARL_TRY(ro_media_load_input(st, traj_id, &e->cfg, e->tpl.image_max_patches, &in, m));
    m->pad_row = ro_engine_params(e)->embed_tokens + (int64_t)m->media_id * e->d;
    arl_status s = ARL_OK;
    float *ws = NULL;
    const int64_t wsn = in.n_obs ? arl_vision_ws_floats(&e->cfg, in.max_Np) : 0;
    if (m->n_rows > 0) {
        m->rows = malloc(sizeof(float) * (size_t)(m->n_rows * m->d));
        ws = malloc(sizeof(float) * (size_t)wsn);
        if (!m->rows || !ws) s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (image rows)");
    }
    /* one observation at a time, as the rollout encoded them */
    for (int32_t i = 0; s == ARL_OK && i < in.n_obs; i++) {
        const ro_media_obs *o = &in.obs[i];
        s = arl_vision_fwd(m->rows + o->row0 * m->d, ro_engine_params(e), &e->cfg, o->patches, o->grids,
                           o->n_img, ws, wsn, NULL);
    }
    free(ws);
    ro_media_input_free(&in);
    if (s) ro_media_free(m);
    return s;
}

void ro_media_fresh(ro_media *m, int64_t k) {
    if (m->n_steps == 0) {
        m->cursor = 0;
        return;
    }
    if (k >= m->n_steps) k = m->n_steps - 1;
    while (k > 0 && !m->step_reset[k])
        k--;
    m->cursor = k >= 0 ? m->step_row[k] : 0;
}

/* Rows the placeholders of n stream tokens need; ARL_ERR_NOT_FOUND past the stored ones. */
static arl_status take_check(const ro_media *m, const uint32_t *tokens, const uint8_t *mask,
                             int64_t n) {
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++)
        if ((int32_t)tokens[i] == m->media_id) need += !mask[i];
    if (m->cursor + need > m->n_rows)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "rollout: the stream holds %lld more image placeholders than the "
                          "stored observations' images give (%lld rows, %lld used)",
                          (long long)need, (long long)m->n_rows, (long long)m->cursor);
    return ARL_OK;
}

arl_status ro_media_take(ro_media *m, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                         float *out, int64_t *count) {
    ARL_TRY(take_check(m, tokens, mask, n));
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((int32_t)tokens[i] != m->media_id) continue;
        const float *src = mask[i] ? m->pad_row : m->rows + (m->cursor++) * m->d;
        memcpy(out + (c++) * m->d, src, sizeof(float) * (size_t)m->d);
    }
    *count = c;
    return ARL_OK;
}

arl_status ro_media_take_index(ro_media *m, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                               int64_t *idx, int64_t *count) {
    ARL_TRY(take_check(m, tokens, mask, n));
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        if ((int32_t)tokens[i] == m->media_id) idx[c++] = mask[i] ? -1 : m->cursor++;
    *count = c;
    return ARL_OK;
}
