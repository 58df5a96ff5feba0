/* envs/aep_parse.c: the client's response parser and validator (spec §8.5, §12.1, §12.3, §4).
 *
 * One function, aep_response_parse, classifies any response of any endpoint into success (with
 * the parsed result) or one AEP error code: the server's envelope code, or MALFORMED_RESPONSE,
 * RESPONSE_TOO_LARGE, REWARD_OUT_OF_RANGE with the first violation as "JSON pointer: reason".
 * It is used on HTTP responses (envs/aep_client.c), on in-process responses (the same bytes,
 * §14.4), by the host on its own output before sending it (envs/env_host.c), and by the
 * conformance checker.  It must never crash on any input (tests/fuzz/fuzz_aep_response.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "envs/aep_json.h"

int aep_tools_validate(const json_t *tools, const char *where, char *err, size_t cap);

typedef struct pctx {
    const aep_expect *x;
    const arl_env_limits *lim;
    arl_env_limits deflim;
    arl_env_client_config defcc;
    const arl_env_client_config *cc;
    const char *body;
    size_t len;
    arl_env_error *err;
} pctx;

static int violate(pctx *c, arl_env_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int violate(pctx *c, arl_env_errcode code, const char *fmt, ...) {
    arl_env_error_set(c->err, code, NULL);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err->violation, sizeof c->err->violation, fmt, ap);
    va_end(ap);
    snprintf(c->err->message, sizeof c->err->message, "%s", c->err->violation);
    return -1;
}

/* A failed allocation of the parser's own: a violation (the response cannot be held), and a
 * note of this thread's out of memory (core/json_dump.h), by which the client tells it from
 * the environment's fault. */
static int nomem(pctx *c, const char *ptr) {
    arl_nomem_note();
    return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s: out of memory", ptr);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static char *dupstr(const json_t *v) {
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* Optional string member: absent/null -> *out NULL; wrong type -> violation. */
static int opt_str(pctx *c, const json_t *o, const char *k, char **out, const char *ptr) {
    const json_t *v = json_object_get(o, k);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/%s: expected a string", ptr, k);
    *out = dupstr(v);
    return *out ? 0 : nomem(c, ptr);
}

static int opt_bool(pctx *c, const json_t *o, const char *k, int *out, const char *ptr) {
    const json_t *v = json_object_get(o, k);
    *out = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/%s: expected a boolean", ptr, k);
    *out = json_is_true(v);
    return 0;
}

static int check_image(pctx *c, const json_t *img, arl_env_image *out, const char *ptr) {
    const arl_env_info *info = c->x->info;
    if (!info || !info->caps.multimodal)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s: image without capabilities.multimodal", ptr);
    if (!json_is_object(img)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image: expected an object", ptr);
    const json_t *fmt = json_object_get(img, "format"), *data = json_object_get(img, "data");
    int64_t w, h;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "png"))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/format: expected \"png\"", ptr);
    if (!aep_json_get_index(img, "width", &w) || w < 1)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/width: expected an integer >= 1", ptr);
    if (!aep_json_get_index(img, "height", &h) || h < 1)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/height: expected an integer >= 1", ptr);
    if (!json_is_string(data)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/data: expected a string", ptr);
    int64_t maxb = min64(c->lim->max_image_bytes, c->cc->max_image_bytes);
    int64_t maxp = min64(c->lim->max_image_pixels, c->cc->max_image_pixels);
    size_t dl = json_string_length(data);
    if ((int64_t)(dl / 4 * 3) > maxb + 2)
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "%s/image/data: image over %lld bytes", ptr, (long long)maxb);
    uint8_t *png;
    size_t pl;
    int rc = aep_b64_decode_canonical(json_string_value(data), dl, &png, &pl);
    if (rc == -2) return nomem(c, ptr);
    if (rc) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/data: not canonical base64 (§4.2)", ptr);
    if ((int64_t)pl > maxb) {
        free(png);
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "%s/image/data: %zu bytes > %lld", ptr, pl, (long long)maxb);
    }
    int64_t pw, ph;
    if (aep_png_dims(png, pl, &pw, &ph)) {
        free(png);
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/data: not a PNG file (signature or IHDR)", ptr);
    }
    if (pw != w || ph != h) {
        free(png);
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/image/width: %lldx%lld != IHDR %lldx%lld", ptr,
                       (long long)w, (long long)h, (long long)pw, (long long)ph);
    }
    if (w * h > maxp) {
        free(png);
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "%s/image: %lld pixels > %lld", ptr, (long long)(w * h), (long long)maxp);
    }
    out->png = png;
    out->png_len = pl;
    out->width = w;
    out->height = h;
    return 0;
}

static int parse_tool_call(pctx *c, const json_t *tc, arl_env_tool_call *out, const char *ptr) {
    const json_t *id = json_object_get(tc, "id"), *nm = json_object_get(tc, "name"),
                 *ar = json_object_get(tc, "arguments");
    if (!json_is_object(tc) || !json_is_string(id) || !json_is_string(nm) || !json_is_object(ar))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s: expected {id, name, arguments: object}", ptr);
    out->id = dupstr(id);
    out->name = dupstr(nm);
    out->arguments = json_incref((json_t *)ar);
    return out->id && out->name ? 0 : nomem(c, ptr);
}

static int parse_message(pctx *c, const json_t *m, arl_env_message *out, arl_env_context ctx,
                         int index, int *n_images, const char *ptr) {
    if (!json_is_object(m)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s: expected an object", ptr);
    const json_t *role = json_object_get(m, "role");
    int r = json_is_string(role) ? arl_env_role_parse(json_string_value(role)) : -1;
    if (r < 0) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/role: expected system, user, assistant or tool", ptr);
    out->role = (arl_env_role)r;
    if (ctx == ARL_ENV_CONTEXT_APPEND && r != ARL_ENV_ROLE_TOOL && r != ARL_ENV_ROLE_USER)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/role: '%s' not allowed in an append observation", ptr,
                       json_string_value(role));
    if (ctx == ARL_ENV_CONTEXT_RESET && r == ARL_ENV_ROLE_SYSTEM && index != 0)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/role: system allowed only as the first message", ptr);
    const json_t *content = json_object_get(m, "content");
    char p2[160];
    if (json_is_string(content)) {
        out->content = dupstr(content);
        if (!out->content) return nomem(c, ptr);
    } else if (json_is_array(content)) {
        out->content_is_parts = 1;
        size_t np = json_array_size(content);
        if (np) {
            out->parts = calloc(np, sizeof *out->parts);
            if (!out->parts) return nomem(c, ptr);
        }
        size_t i;
        const json_t *p;
        json_array_foreach(content, i, p) {
            snprintf(p2, sizeof p2, "%s/content/%zu", ptr, i);
            const json_t *ty = json_object_get(p, "type");
            const char *t = json_is_string(ty) ? json_string_value(ty) : "";
            arl_env_part *op = &out->parts[i];
            out->n_parts = (int32_t)(i + 1);
            if (!strcmp(t, "text")) {
                const json_t *tx = json_object_get(p, "text");
                if (!json_is_string(tx)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/text: expected a string", p2);
                op->type = ARL_ENV_PART_TEXT;
                op->text = dupstr(tx);
                if (!op->text) return nomem(c, ptr);
            } else if (!strcmp(t, "image")) {
                op->type = ARL_ENV_PART_IMAGE;
                if (r != ARL_ENV_ROLE_USER && r != ARL_ENV_ROLE_TOOL)
                    return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s: images only in user and tool messages", p2);
                if (++*n_images > ARL_AEP_MAX_IMAGES)
                    return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "%s: more than %d images in one observation", p2,
                                   ARL_AEP_MAX_IMAGES);
                if (check_image(c, json_object_get(p, "image"), &op->image, p2)) return -1;
            } else {
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/type: expected \"text\" or \"image\"", p2);
            }
        }
    } else {
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/content: expected a string or an array of parts", ptr);
    }
    const json_t *tcs = json_object_get(m, "tool_calls");
    if (tcs && !json_is_null(tcs)) {
        if (r != ARL_ENV_ROLE_ASSISTANT || ctx != ARL_ENV_CONTEXT_RESET)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/tool_calls: only in assistant messages of a reset observation", ptr);
        if (!json_is_array(tcs)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/tool_calls: expected an array", ptr);
        size_t n = json_array_size(tcs);
        if (n) {
            out->tool_calls = calloc(n, sizeof *out->tool_calls);
            if (!out->tool_calls) return nomem(c, ptr);
        }
        for (size_t i = 0; i < n; i++) {
            out->n_tool_calls = (int32_t)(i + 1);
            snprintf(p2, sizeof p2, "%s/tool_calls/%zu", ptr, i);
            if (parse_tool_call(c, json_array_get(tcs, i), &out->tool_calls[i], p2)) return -1;
        }
    }
    if (opt_str(c, m, "reasoning", &out->reasoning, ptr)) return -1;
    if (out->reasoning && (r != ARL_ENV_ROLE_ASSISTANT || ctx != ARL_ENV_CONTEXT_RESET))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/reasoning: only in assistant messages of a reset observation", ptr);
    if (r == ARL_ENV_ROLE_TOOL) {
        const json_t *tid = json_object_get(m, "tool_call_id");
        if (!json_is_string(tid)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/tool_call_id: missing", ptr);
        out->tool_call_id = dupstr(tid);
        if (!out->tool_call_id) return nomem(c, ptr);
        if (opt_bool(c, m, "is_error", &out->is_error, ptr)) return -1;
        if (opt_str(c, m, "error_code", &out->error_code, ptr)) return -1;
        if (out->is_error && !out->error_code)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/error_code: required when is_error is true", ptr);
        if (opt_bool(c, m, "output_truncated", &out->output_truncated, ptr)) return -1;
        if (out->output_truncated && !aep_json_get_index(m, "original_bytes", &out->original_bytes))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s/original_bytes: required integer when output_truncated", ptr);
    }
    return 0;
}

/* Validates and parses the observation member; terminal: the step ends the episode. */
static int parse_observation(pctx *c, const json_t *root, arl_env_observation *out, int terminal) {
    const aep_expect *x = c->x;
    const json_t *o = json_object_get(root, "observation");
    if (!json_is_object(o)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation: required object missing");
    size_t off, olen;
    int64_t maxo = min64(c->lim->max_observation_bytes, c->cc->max_observation_bytes);
    if (aep_json_member_span(c->body, c->len, "observation", &off, &olen) && (int64_t)olen > maxo)
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/observation: %zu bytes > %lld", olen, (long long)maxo);
    const json_t *cx = json_object_get(o, "context");
    int ctx = json_is_string(cx) ? arl_env_context_parse(json_string_value(cx)) : -1;
    if (ctx < 0) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/context: expected append or reset");
    out->context = (arl_env_context)ctx;
    if (x->endpoint == ARL_ENV_EP_CREATE && ctx != ARL_ENV_CONTEXT_RESET)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/context: the initial observation must be reset");
    if (x->endpoint == ARL_ENV_EP_STEP && ctx == ARL_ENV_CONTEXT_RESET &&
        !(x->info && x->info->caps.context_reset))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/context: reset without capabilities.context_reset");
    const json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (ctx != ARL_ENV_CONTEXT_RESET)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/tools: tools in an append observation");
        char e[256];
        if (json_is_array(tools) && json_array_size(tools) > ARL_AEP_MAX_TOOLS)
            return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/observation/tools: more than %d tools", ARL_AEP_MAX_TOOLS);
        if (aep_tools_validate(tools, "/observation/tools", e, sizeof e))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "%s", e);
        size_t toff, tlen;
        if (aep_json_member_span(c->body + off, olen, "tools", &toff, &tlen) && tlen > ARL_AEP_MAX_TOOLS_BYTES)
            return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/observation/tools: %zu bytes > 256 KiB", tlen);
        out->tools = json_incref((json_t *)tools);
    }
    const json_t *msgs = json_object_get(o, "messages");
    if (!json_is_array(msgs)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/messages: expected an array");
    size_t n = json_array_size(msgs);
    if ((int64_t)n > c->cc->max_messages)
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/observation/messages: %zu messages > %lld", n,
                       (long long)c->cc->max_messages);
    if (n) {
        out->messages = calloc(n, sizeof *out->messages);
        if (!out->messages) return nomem(c, "/observation/messages");
        out->cap_messages = (int32_t)n;
    }
    int n_images = 0;
    char ptr[96];
    for (size_t i = 0; i < n; i++) {
        snprintf(ptr, sizeof ptr, "/observation/messages/%zu", i);
        out->n_messages = (int32_t)(i + 1);
        if (parse_message(c, json_array_get(msgs, i), &out->messages[i], (arl_env_context)ctx, (int)i,
                          &n_images, ptr))
            return -1;
    }
    if (ctx == ARL_ENV_CONTEXT_APPEND) {
        if (n == 0 && !terminal)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/observation/messages: empty append observation on a non-terminal step");
        size_t i = 0;
        for (int32_t k = 0; k < x->n_call_ids; k++, i++) {
            if (i >= n || out->messages[i].role != ARL_ENV_ROLE_TOOL ||
                strcmp(out->messages[i].tool_call_id, x->call_ids[k]))
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE,
                               "/observation/messages/%zu: expected the tool message answering '%s' (§4.3 order)", i,
                               x->call_ids[k]);
        }
        int32_t j = 0;
        for (; i < n && out->messages[i].role == ARL_ENV_ROLE_TOOL; i++) {
            int32_t p = j;
            while (p < x->n_perr_ids && strcmp(x->perr_ids[p], out->messages[i].tool_call_id)) p++;
            if (p >= x->n_perr_ids)
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE,
                               "/observation/messages/%zu/tool_call_id: '%s' is unknown, duplicate or out of order", i,
                               out->messages[i].tool_call_id);
            j = p + 1;
        }
        for (; i < n; i++)
            if (out->messages[i].role != ARL_ENV_ROLE_USER)
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE,
                               "/observation/messages/%zu: tool message after user messages or unknown tool_call_id", i);
    } else {
        /* every tool message answers a call of an earlier assistant message, once */
        for (size_t i = 0; i < n; i++) {
            const arl_env_message *m = &out->messages[i];
            if (m->role != ARL_ENV_ROLE_TOOL) continue;
            int found = 0;
            for (size_t a = 0; a < i && !found; a++)
                for (int32_t t = 0; t < out->messages[a].n_tool_calls; t++)
                    if (!strcmp(out->messages[a].tool_calls[t].id, m->tool_call_id)) found = 1;
            for (size_t b = 0; b < i && found; b++)
                if (out->messages[b].role == ARL_ENV_ROLE_TOOL && !strcmp(out->messages[b].tool_call_id, m->tool_call_id))
                    found = 0;
            if (!found)
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE,
                               "/observation/messages/%zu/tool_call_id: '%s' answers no earlier call of this observation", i,
                               m->tool_call_id);
        }
    }
    return 0;
}

static int parse_info_member(pctx *c, const json_t *root, json_t **out, const char *key) {
    const json_t *info = json_object_get(root, key);
    if (!info || json_is_null(info)) return 0;
    if (!json_is_object(info)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/%s: expected an object", key);
    size_t off, l;
    if (aep_json_member_span(c->body, c->len, key, &off, &l) && l > ARL_AEP_MAX_INFO_BYTES)
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/%s: %zu bytes > 64 KiB", key, l);
    if (out) *out = json_incref((json_t *)info);
    return 0;
}

/* reward + reward_components of one level. */
static int parse_rewards(pctx *c, const json_t *root, arl_env_level level, int required, double *reward,
                         arl_env_component *comp, int32_t *ncomp) {
    const arl_env_info *info = c->x->info;
    const json_t *rw = json_object_get(root, "reward");
    if (!rw || json_is_null(rw)) {
        if (required) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward: required number missing");
    } else {
        if (!json_is_number(rw)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward: expected a number");
        double v = json_number_value(rw);
        if (!isfinite(v)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward: not finite");
        *reward = v;
        if (info) {
            if (!info->level_declared[level]) {
                if (v != 0)
                    return violate(c, ARL_ENV_E_REWARD_OUT_OF_RANGE, "/reward: %g at the undeclared %s level", v,
                                   arl_env_level_str(level));
            } else if (v < info->level_lo[level] || v > info->level_hi[level]) {
                return violate(c, ARL_ENV_E_REWARD_OUT_OF_RANGE, "/reward: %g outside the %s range [%g, %g]", v,
                               arl_env_level_str(level), info->level_lo[level], info->level_hi[level]);
            }
        }
    }
    const json_t *rc = json_object_get(root, "reward_components");
    if (!rc || json_is_null(rc)) return 0;
    if (!json_is_object(rc)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward_components: expected an object");
    if (json_object_size(rc) > ARL_AEP_MAX_COMPONENTS)
        return violate(c, ARL_ENV_E_RESPONSE_TOO_LARGE, "/reward_components: more than %d components", ARL_AEP_MAX_COMPONENTS);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)rc, k, v) {
        if (!aep_valid_component_name(k))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward_components/%.64s: not a component name", k);
        if (!json_is_number(v)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward_components/%s: expected a number", k);
        double x = json_number_value(v);
        if (!isfinite(x)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward_components/%s: not finite", k);
        for (int32_t i = 0; info && i < info->n_components; i++) {
            const arl_env_component_decl *d = &info->components[i];
            if (strcmp(d->name, k)) continue;
            if (d->level != level)
                return violate(c, ARL_ENV_E_REWARD_OUT_OF_RANGE, "/reward_components/%s: a %s component in a %s response", k,
                               arl_env_level_str(d->level), arl_env_level_str(level));
            if (x < d->lo || x > d->hi)
                return violate(c, ARL_ENV_E_REWARD_OUT_OF_RANGE, "/reward_components/%s: %g outside [%g, %g]", k, x, d->lo,
                               d->hi);
        }
        snprintf(comp[*ncomp].name, sizeof comp[*ncomp].name, "%s", k);
        comp[*ncomp].value = x;
        (*ncomp)++;
    }
    return 0;
}

static int parse_session_ids(pctx *c, const json_t *root, arl_env_result *r) {
    const json_t *sid = json_object_get(root, "session_id");
    if (!json_is_string(sid) || !aep_valid_session_id(json_string_value(sid)))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/session_id: expected 1-128 characters of [A-Za-z0-9._~-]");
    snprintf(r->session_id, sizeof r->session_id, "%s", json_string_value(sid));
    const json_t *tid = json_object_get(root, "trajectory_id");
    if (!json_is_string(tid) || !aep_valid_traj_id(json_string_value(tid)))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/trajectory_id: expected a trajectory id (§3)");
    if (c->x->trajectory_id && strcmp(c->x->trajectory_id, json_string_value(tid)))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/trajectory_id: '%.100s' is not the requested '%.100s'",
                       json_string_value(tid), c->x->trajectory_id);
    snprintf(r->trajectory_id, sizeof r->trajectory_id, "%s", json_string_value(tid));
    return 0;
}

static int parse_step_index(pctx *c, const json_t *root, int64_t want, int64_t *out) {
    int64_t k;
    if (!aep_json_get_index(root, "step_index", &k))
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/step_index: expected an integer in [0, 2^53-1]");
    if (want >= 0 && k != want)
        return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/step_index: %lld, expected %lld", (long long)k, (long long)want);
    *out = k;
    return 0;
}

static int parse_success(pctx *c, const json_t *root, arl_env_result *r, arl_env_score_result *sr,
                         json_t **snapshot, int64_t *ha, int64_t *hm) {
    const aep_expect *x = c->x;
    if (!json_is_object(root)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/: expected a JSON object");
    switch (x->endpoint) {
    case ARL_ENV_EP_INFO:
        break;
    case ARL_ENV_EP_HEALTH: {
        const json_t *st = json_object_get(root, "status");
        int64_t a, m;
        if (!json_is_string(st) || (strcmp(json_string_value(st), "ok") && strcmp(json_string_value(st), "degraded")))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/status: expected \"ok\" or \"degraded\"");
        if (!aep_json_get_index(root, "active_sessions", &a))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/active_sessions: expected an integer");
        if (!aep_json_get_index(root, "max_sessions", &m))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/max_sessions: expected an integer");
        if (ha) *ha = a;
        if (hm) *hm = m;
        break;
    }
    case ARL_ENV_EP_CREATE:
        if (!r) break;
        if (parse_session_ids(c, root, r) || parse_step_index(c, root, 0, &r->step_index) ||
            parse_observation(c, root, &r->obs, 0) || parse_info_member(c, root, &r->info, "info"))
            return -1;
        break;
    case ARL_ENV_EP_FORK:
        if (!r) break;
        if (parse_session_ids(c, root, r) || parse_step_index(c, root, x->step_index, &r->step_index) ||
            parse_info_member(c, root, &r->info, "info"))
            return -1;
        break;
    case ARL_ENV_EP_STEP: {
        if (!r) break;
        const json_t *te = json_object_get(root, "terminated"), *tr = json_object_get(root, "truncated");
        if (!json_is_boolean(te)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/terminated: required boolean missing");
        if (!json_is_boolean(tr)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/truncated: required boolean missing");
        r->terminated = json_is_true(te);
        r->truncated = json_is_true(tr);
        if (parse_step_index(c, root, x->step_index, &r->step_index) ||
            parse_observation(c, root, &r->obs, r->terminated || r->truncated) ||
            parse_rewards(c, root, ARL_ENV_LEVEL_PROCESS, 1, &r->reward, r->components, &r->n_components) ||
            parse_info_member(c, root, &r->info, "info"))
            return -1;
        break;
    }
    case ARL_ENV_EP_SCORE: {
        if (!sr) break;
        const json_t *sc = json_object_get(root, "scope");
        int s = json_is_string(sc) ? arl_env_scope_parse(json_string_value(sc)) : -1;
        if (s < 0) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/scope: expected segment or episode");
        if (s != (int)x->scope)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/scope: '%s', requested '%s'", json_string_value(sc),
                           arl_env_scope_str(x->scope));
        sr->scope = (arl_env_scope)s;
        if (s == ARL_ENV_SCOPE_SEGMENT) {
            if (!aep_json_get_index(root, "segment_index", &sr->segment_index) || sr->segment_index != x->segment_index)
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/segment_index: expected %lld", (long long)x->segment_index);
        }
        const json_t *ok = json_object_get(root, "scorable");
        if (!json_is_boolean(ok)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/scorable: required boolean missing");
        sr->scorable = json_is_true(ok);
        arl_env_level lv = s == ARL_ENV_SCOPE_SEGMENT ? ARL_ENV_LEVEL_SEGMENT : ARL_ENV_LEVEL_OUTCOME;
        if (sr->scorable) {
            if (parse_rewards(c, root, lv, 1, &sr->reward, sr->components, &sr->n_components)) return -1;
        } else {
            const json_t *rw = json_object_get(root, "reward");
            if (rw && !json_is_null(rw) && !json_is_number(rw))
                return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/reward: expected null when not scorable");
        }
        if (parse_info_member(c, root, &sr->info, "info")) return -1;
        break;
    }
    case ARL_ENV_EP_GET: {
        const json_t *sid = json_object_get(root, "session_id"), *st = json_object_get(root, "status");
        int64_t k;
        if (!json_is_string(sid)) return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/session_id: expected a string");
        if (!aep_json_get_index(root, "step_index", &k))
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/step_index: expected an integer");
        if (!json_is_string(st) || arl_env_session_status_parse(json_string_value(st)) < 0)
            return violate(c, ARL_ENV_E_MALFORMED_RESPONSE, "/status: expected active, terminated, truncated, scored or failed");
        if (parse_info_member(c, root, NULL, "state")) return -1;
        break;
    }
    case ARL_ENV_EP_DELETE:
        break;
    }
    if (snapshot) *snapshot = json_incref((json_t *)root);
    return 0;
}

static int is_error_status(int s) {
    return s == 400 || s == 404 || s == 409 || s == 410 || s == 413 || s == 422 || s == 500 || s == 501 ||
           s == 502 || s == 503 || s == 504;
}

int aep_envelope_check(const json_t *root, int status, char *why, size_t cap) {
    const json_t *env = json_object_get(root, "error");
    const json_t *code = json_object_get(env, "code"), *msg = json_object_get(env, "message");
    const json_t *rt = json_object_get(env, "retryable"), *attr = json_object_get(env, "attribution");
    const json_t *ra = json_object_get(env, "retry_after_ms"), *det = json_object_get(env, "details");
    if (!json_is_object(env)) {
        snprintf(why, cap, "/error: expected an object");
        return -1;
    }
    if (!json_is_string(code)) {
        snprintf(why, cap, "/error/code: expected a string");
        return -1;
    }
    if (!json_is_string(msg)) {
        snprintf(why, cap, "/error/message: expected a string");
        return -1;
    }
    if (!json_is_boolean(rt)) {
        snprintf(why, cap, "/error/retryable: expected a boolean");
        return -1;
    }
    if (!json_is_string(attr) || arl_env_attribution_parse(json_string_value(attr)) < 0) {
        snprintf(why, cap, "/error/attribution: expected one of client, env, infra, none");
        return -1;
    }
    if (ra && !json_is_null(ra) && (!json_is_integer(ra) || json_integer_value(ra) < 0)) {
        snprintf(why, cap, "/error/retry_after_ms: expected an integer >= 0");
        return -1;
    }
    if (json_is_true(rt) && (status == 503 || status == 409) && !json_is_integer(ra)) {
        snprintf(
            why, cap,
            "/error/retry_after_ms: required when retryable is true and the status is %d (§8.1)",
            status);
        return -1;
    }
    if (det && !json_is_null(det) && !json_is_object(det)) {
        snprintf(why, cap, "/error/details: expected an object");
        return -1;
    }
    return 0;
}

/* Parse the §8.1 envelope; returns 0 with err filled, -1 if invalid with the first violation in
 * why (a JSON pointer and a reason, §12.2 item 2). */
static int parse_envelope(pctx *c, int status, const char *ctype, char *why, size_t cap) {
    arl_env_error *e = c->err;
    char jwhy[256];
    if (!aep_ctype_is_json(ctype)) {
        snprintf(why, cap, "Content-Type '%.100s' is not application/json",
                 ctype ? ctype : "(none)");
        return -1;
    }
    json_t *root = aep_json_loads(c->body, c->len, ARL_AEP_MAX_DEPTH, jwhy, sizeof jwhy);
    if (!root) {
        snprintf(why, cap, "%s", jwhy);
        return -1;
    }
    int rc = -1;
    if (aep_envelope_check(root, status, why, cap)) goto done;
    const json_t *env = json_object_get(root, "error");
    const json_t *code = json_object_get(env, "code"), *msg = json_object_get(env, "message");
    const json_t *rt = json_object_get(env, "retryable"),
                 *attr = json_object_get(env, "attribution");
    const json_t *ra = json_object_get(env, "retry_after_ms"),
                 *det = json_object_get(env, "details");
    arl_env_errcode ec = arl_env_errcode_parse(json_string_value(code));
    int http = e->http_status;
    arl_env_error_clear(e);
    e->http_status = http;
    e->code = ec;
    snprintf(e->code_str, sizeof e->code_str, "%s", json_string_value(code));
    snprintf(e->message, sizeof e->message, "%s", json_string_value(msg));
    if (ec == ARL_ENV_E_OTHER) { /* §8.5: act on what was sent */
        e->retryable = json_is_true(rt);
        e->attribution = (arl_env_attribution)arl_env_attribution_parse(json_string_value(attr));
    } else {
        e->retryable = arl_env_errcode_retryable(ec);
        e->attribution = arl_env_errcode_attribution(ec);
    }
    if (json_is_integer(ra)) e->retry_after_ms = json_integer_value(ra);
    if (json_is_object(det)) e->details = json_incref((json_t *)det);
    rc = 0;
done:
    json_decref(root);
    return rc;
}

void aep_response_parse(const aep_expect *x, int status, const char *ctype, const char *body, size_t len,
                        arl_env_error *err, arl_env_result *r, arl_env_score_result *sr, json_t **snapshot,
                        int64_t *ha, int64_t *hm) {
    pctx c;
    memset(&c, 0, sizeof c);
    c.x = x;
    arl_env_limits_default(&c.deflim);
    c.lim = x->info ? &x->info->limits : &c.deflim;
    arl_env_client_config_default(&c.defcc);
    c.cc = x->cc ? x->cc : &c.defcc;
    c.body = body ? body : "";
    c.len = body ? len : 0;
    c.err = err;
    arl_env_error_clear(err);
    err->http_status = status;
    if (snapshot) *snapshot = NULL;
    int success;
    switch (x->endpoint) {
    case ARL_ENV_EP_CREATE:
    case ARL_ENV_EP_FORK: success = status == 201 || status == 200; break;
    case ARL_ENV_EP_DELETE: success = status == 204; break;
    default: success = status == 200;
    }
    if (status >= 300 && status < 400) {
        violate(&c, ARL_ENV_E_MALFORMED_RESPONSE, "/: HTTP %d: redirects are not followed", status);
        return;
    }
    if (success) {
        if (x->endpoint == ARL_ENV_EP_DELETE) return;
        if (!aep_ctype_is_json(ctype)) {
            violate(&c, ARL_ENV_E_MALFORMED_RESPONSE, "/: Content-Type '%.100s' is not application/json",
                    ctype ? ctype : "(none)");
            return;
        }
        char why[256];
        json_t *root = aep_json_loads(c.body, c.len, ARL_AEP_MAX_DEPTH, why, sizeof why);
        if (!root) {
            violate(&c, ARL_ENV_E_MALFORMED_RESPONSE, "/: %s", why);
            return;
        }
        if (parse_success(&c, root, r, sr, snapshot, ha, hm)) {
            if (r) arl_env_result_clear(r);
            if (sr) arl_env_score_result_clear(sr);
            if (snapshot && *snapshot) {
                json_decref(*snapshot);
                *snapshot = NULL;
            }
        }
        json_decref(root);
        return;
    }
    if (is_error_status(status)) {
        char why[300];
        why[0] = 0;
        if (parse_envelope(&c, status, ctype, why, sizeof why) == 0) return;
        if (status >= 500) {
            violate(&c, ARL_ENV_E_ENV_INTERNAL, "/: HTTP %d without a valid error envelope (%s)",
                    status, why);
            err->retryable = status == 502 || status == 503 || status == 504;
        } else {
            violate(&c, ARL_ENV_E_MALFORMED_RESPONSE,
                    "/: HTTP %d without a valid error envelope (%s)", status, why);
        }
        return;
    }
    violate(&c, ARL_ENV_E_MALFORMED_RESPONSE, "/: HTTP status %d is not a status of this endpoint", status);
}
