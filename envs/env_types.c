/* envs/env_types.c: the data types of envs/env.h: closed value sets, the error-code table of
 * spec §8.3/§8.4, observation/action/result builders, the tool-call argument parser (§4.6),
 * the argument validator for tool schemas (§4.4) and the /info parser (§6.1).
 * No transport here (envs/aep_client.c, envs/aep_server.c) and no session state
 * (envs/env_host.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "envs/aep_json.h"
#include "envs/env.h"

/* ---- closed sets ---- */

static const char *const role_names[] = {"system", "user", "assistant", "tool"};
static const char *const context_names[] = {"append", "reset"};
static const char *const parse_names[] = {"ok",           "no_tool_call",   "invalid_json",
                                          "arguments_not_object", "missing_name",
                                          "unclosed_block", "malformed_structure"};
static const char *const finish_names[] = {"stop", "tool_calls", "length"};
static const char *const level_names[] = {"process", "segment", "outcome"};
static const char *const scope_names[] = {"segment", "episode"};
static const char *const reason_names[] = {"terminated",  "truncated",        "context_budget",
                                           "turn_budget", "action_too_large", "wall_clock"};
static const char *const status_names[] = {"active", "terminated", "truncated", "scored",
                                           "failed"};
static const char *const attr_names[] = {"client", "env", "infra", "none"};

#define NAMES_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *name_of(const char *const *names, int n, int v) {
    return v >= 0 && v < n ? names[v] : "?";
}
static int parse_of(const char *const *names, int n, const char *s) {
    if (!s) return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

#define CLOSED_SET(fn, type, names)                                                                \
    const char *arl_env_##fn##_str(type v) { return name_of(names, NAMES_N(names), (int)v); }     \
    int arl_env_##fn##_parse(const char *s) { return parse_of(names, NAMES_N(names), s); }

CLOSED_SET(role, arl_env_role, role_names)
CLOSED_SET(context, arl_env_context, context_names)
CLOSED_SET(parse_status, arl_env_parse_status, parse_names)
CLOSED_SET(finish_reason, arl_env_finish_reason, finish_names)
CLOSED_SET(level, arl_env_level, level_names)
CLOSED_SET(scope, arl_env_scope, scope_names)
CLOSED_SET(score_reason, arl_env_score_reason, reason_names)
CLOSED_SET(session_status, arl_env_session_status, status_names)
CLOSED_SET(attribution, arl_env_attribution, attr_names)

/* ---- error codes ---- */

typedef struct errcode_row {
    const char *name;
    int http;
    int retryable;
    arl_env_attribution attr;
} errcode_row;

static const errcode_row errcode_table[ARL_ENV_E_COUNT_] = {
    [ARL_ENV_E_NONE] = {"NONE", 0, 0, ARL_ENV_ATTR_NONE},
    [ARL_ENV_E_INVALID_REQUEST] = {"INVALID_REQUEST", 400, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_UNSUPPORTED_VERSION] = {"UNSUPPORTED_VERSION", 400, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_VALIDATION_ERROR] = {"VALIDATION_ERROR", 422, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_PAYLOAD_TOO_LARGE] = {"PAYLOAD_TOO_LARGE", 413, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_UNKNOWN_SESSION] = {"UNKNOWN_SESSION", 404, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_TRAJECTORY_CONFLICT] = {"TRAJECTORY_CONFLICT", 409, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_STEP_CONFLICT] = {"STEP_CONFLICT", 409, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_STEP_IN_PROGRESS] = {"STEP_IN_PROGRESS", 409, 1, ARL_ENV_ATTR_NONE},
    [ARL_ENV_E_EPISODE_ENDED] = {"EPISODE_ENDED", 409, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_SCORE_CONFLICT] = {"SCORE_CONFLICT", 409, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_SESSION_CLOSED] = {"SESSION_CLOSED", 410, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_CAPACITY_REACHED] = {"CAPACITY_REACHED", 503, 1, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_DRAINING] = {"DRAINING", 503, 1, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_DEADLINE_EXCEEDED] = {"DEADLINE_EXCEEDED", 504, 1, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_ENV_INTERNAL] = {"ENV_INTERNAL", 500, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_SANDBOX_LOST] = {"SANDBOX_LOST", 502, 0, ARL_ENV_ATTR_INFRA},
    [ARL_ENV_E_NOT_IMPLEMENTED] = {"NOT_IMPLEMENTED", 501, 0, ARL_ENV_ATTR_NONE},
    [ARL_ENV_E_TRANSPORT_ERROR] = {"TRANSPORT_ERROR", 0, 1, ARL_ENV_ATTR_INFRA},
    [ARL_ENV_E_CLIENT_TIMEOUT] = {"CLIENT_TIMEOUT", 0, 1, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_RESPONSE_TOO_LARGE] = {"RESPONSE_TOO_LARGE", 0, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_MALFORMED_RESPONSE] = {"MALFORMED_RESPONSE", 0, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_REWARD_OUT_OF_RANGE] = {"REWARD_OUT_OF_RANGE", 0, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_OBSERVATION_TOO_LONG] = {"OBSERVATION_TOO_LONG", 0, 0, ARL_ENV_ATTR_ENV},
    [ARL_ENV_E_EPISODE_WALL_CLOCK] = {"EPISODE_WALL_CLOCK", 0, 0, ARL_ENV_ATTR_INFRA},
    [ARL_ENV_E_X_UNKNOWN_ROUTE] = {"X_UNKNOWN_ROUTE", 404, 0, ARL_ENV_ATTR_CLIENT},
    [ARL_ENV_E_OTHER] = {"OTHER", 0, 0, ARL_ENV_ATTR_ENV},
};

const char *arl_env_errcode_str(arl_env_errcode c) {
    return (unsigned)c < ARL_ENV_E_COUNT_ ? errcode_table[c].name : "OTHER";
}
arl_env_errcode arl_env_errcode_parse(const char *s) {
    if (!s) return ARL_ENV_E_OTHER;
    for (int i = 1; i < ARL_ENV_E_OTHER; i++)
        if (!strcmp(errcode_table[i].name, s)) return (arl_env_errcode)i;
    return ARL_ENV_E_OTHER;
}
int arl_env_errcode_http(arl_env_errcode c) {
    return (unsigned)c < ARL_ENV_E_COUNT_ ? errcode_table[c].http : 0;
}
int arl_env_errcode_retryable(arl_env_errcode c) {
    return (unsigned)c < ARL_ENV_E_COUNT_ ? errcode_table[c].retryable : 0;
}
arl_env_attribution arl_env_errcode_attribution(arl_env_errcode c) {
    return (unsigned)c < ARL_ENV_E_COUNT_ ? errcode_table[c].attr : ARL_ENV_ATTR_ENV;
}

void arl_env_error_clear(arl_env_error *e) {
    if (!e) return;
    if (e->details) json_decref(e->details);
    memset(e, 0, sizeof *e);
    e->retry_after_ms = -1;
}

void arl_env_error_set(arl_env_error *e, arl_env_errcode code, const char *fmt, ...) {
    int http = e->http_status;
    arl_env_error_clear(e);
    e->http_status = http;
    e->code = code;
    snprintf(e->code_str, sizeof e->code_str, "%s", arl_env_errcode_str(code));
    e->retryable = arl_env_errcode_retryable(code);
    e->attribution = arl_env_errcode_attribution(code);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
    }
}

/* ---- observations ---- */

static char *xstrdup(const char *s) { return strdup(s ? s : ""); }

static void tool_call_clear(arl_env_tool_call *c) {
    free(c->id);
    free(c->name);
    if (c->arguments) json_decref(c->arguments);
    memset(c, 0, sizeof *c);
}

static void message_clear(arl_env_message *m) {
    free(m->content);
    for (int32_t i = 0; i < m->n_parts; i++) {
        free(m->parts[i].text);
        free(m->parts[i].image.png);
    }
    free(m->parts);
    for (int32_t i = 0; i < m->n_tool_calls; i++) tool_call_clear(&m->tool_calls[i]);
    free(m->tool_calls);
    free(m->reasoning);
    free(m->tool_call_id);
    free(m->error_code);
    memset(m, 0, sizeof *m);
}

void arl_env_observation_clear(arl_env_observation *o) {
    if (!o) return;
    for (int32_t i = 0; i < o->n_messages; i++) message_clear(&o->messages[i]);
    free(o->messages);
    if (o->tools) json_decref(o->tools);
    memset(o, 0, sizeof *o);
}

static arl_env_message *obs_push(arl_env_observation *o) {
    if (o->n_messages == o->cap_messages) {
        int32_t cap = o->cap_messages ? 2 * o->cap_messages : 4;
        arl_env_message *m = realloc(o->messages, (size_t)cap * sizeof *m);
        if (!m) return NULL;
        o->messages = m;
        o->cap_messages = cap;
    }
    arl_env_message *m = &o->messages[o->n_messages];
    memset(m, 0, sizeof *m);
    return m;
}

arl_status arl_env_obs_add_text(arl_env_observation *o, arl_env_role role, const char *text) {
    arl_env_message *m = obs_push(o);
    if (!m) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
    m->role = role;
    m->content = xstrdup(text);
    if (!m->content) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
    o->n_messages++;
    return ARL_OK;
}

arl_status arl_env_obs_add_tool(arl_env_observation *o, const char *call_id, const char *text,
                                const char *error_code) {
    arl_env_message *m = obs_push(o);
    if (!m) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a tool message");
    m->role = ARL_ENV_ROLE_TOOL;
    m->content = xstrdup(text);
    m->tool_call_id = xstrdup(call_id);
    if (error_code) {
        m->is_error = 1;
        m->error_code = xstrdup(error_code);
    }
    if (!m->content || !m->tool_call_id || (error_code && !m->error_code)) {
        message_clear(m);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a tool message");
    }
    o->n_messages++;
    return ARL_OK;
}

arl_status arl_env_obs_add_image(arl_env_observation *o, const uint8_t *png, size_t len) {
    if (o->n_messages == 0)
        return arl_errorf(ARL_ERR_STATE, "env: arl_env_obs_add_image: no message to attach to");
    int64_t w, h;
    if (aep_png_dims(png, len, &w, &h))
        return arl_errorf(ARL_ERR_FORMAT, "env: arl_env_obs_add_image: not a PNG file (%zu bytes)",
                          len);
    arl_env_message *m = &o->messages[o->n_messages - 1];
    int32_t need = m->n_parts + (m->content_is_parts ? 1 : 2);
    arl_env_part *p = realloc(m->parts, (size_t)need * sizeof *p);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding an image");
    m->parts = p;
    if (!m->content_is_parts) {
        m->content_is_parts = 1;
        memset(&p[0], 0, sizeof p[0]);
        p[0].type = ARL_ENV_PART_TEXT;
        p[0].text = m->content ? m->content : strdup("");
        m->content = NULL;
        m->n_parts = 1;
        if (!p[0].text) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding an image");
    }
    arl_env_part *q = &p[m->n_parts];
    memset(q, 0, sizeof *q);
    q->type = ARL_ENV_PART_IMAGE;
    q->image.png = malloc(len ? len : 1);
    if (!q->image.png) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding an image");
    memcpy(q->image.png, png, len);
    q->image.png_len = len;
    q->image.width = w;
    q->image.height = h;
    m->n_parts++;
    return ARL_OK;
}

static int tool_call_copy(arl_env_tool_call *dst, const arl_env_tool_call *src) {
    memset(dst, 0, sizeof *dst);
    dst->id = xstrdup(src->id);
    dst->name = xstrdup(src->name);
    dst->arguments = src->arguments ? json_incref((json_t *)src->arguments) : json_object();
    if (!dst->id || !dst->name || !dst->arguments) {
        tool_call_clear(dst);
        return -1;
    }
    return 0;
}

arl_status arl_env_obs_add_assistant(arl_env_observation *o, const char *text,
                                     const arl_env_tool_call *calls, int32_t n_calls) {
    arl_env_message *m = obs_push(o);
    if (!m) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
    m->role = ARL_ENV_ROLE_ASSISTANT;
    m->content = xstrdup(text);
    if (!m->content) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
    if (n_calls > 0) {
        m->tool_calls = calloc((size_t)n_calls, sizeof *m->tool_calls);
        if (!m->tool_calls) {
            message_clear(m);
            return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
        }
        for (int32_t i = 0; i < n_calls; i++) {
            if (tool_call_copy(&m->tool_calls[i], &calls[i])) {
                m->n_tool_calls = i;
                message_clear(m);
                return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a message");
            }
        }
        m->n_tool_calls = n_calls;
    }
    o->n_messages++;
    return ARL_OK;
}

arl_status arl_env_obs_answer_parse_errors(arl_env_observation *o, const arl_env_action *a) {
    for (int32_t i = 0; i < a->n_parse_errors; i++) {
        const arl_env_parse_error *pe = &a->parse_errors[i];
        char text[700];
        snprintf(text, sizeof text, "Could not parse the tool call: %s%s%s",
                 arl_env_parse_status_str(pe->status), pe->message && *pe->message ? ": " : "",
                 pe->message ? pe->message : "");
        ARL_TRY(arl_env_obs_add_tool(o, pe->id, text, ARL_ENV_TOOL_PARSE_ERROR));
    }
    return ARL_OK;
}

void arl_env_obs_mark_truncated(arl_env_observation *o, int64_t original_bytes) {
    if (!o || o->n_messages == 0) return;
    o->messages[o->n_messages - 1].output_truncated = 1;
    o->messages[o->n_messages - 1].original_bytes = original_bytes;
}

/* ---- actions ---- */

void arl_env_action_clear(arl_env_action *a) {
    if (!a) return;
    free(a->content);
    free(a->reasoning);
    for (int32_t i = 0; i < a->n_tool_calls; i++) tool_call_clear(&a->tool_calls[i]);
    free(a->tool_calls);
    for (int32_t i = 0; i < a->n_parse_errors; i++) {
        free(a->parse_errors[i].id);
        free(a->parse_errors[i].message);
        free(a->parse_errors[i].raw);
    }
    free(a->parse_errors);
    memset(a, 0, sizeof *a);
}

arl_status arl_env_action_add_call(arl_env_action *a, const char *id, const char *name,
                                   json_t *arguments) {
    arl_env_tool_call *c = realloc(a->tool_calls, (size_t)(a->n_tool_calls + 1) * sizeof *c);
    if (!c) {
        if (arguments) json_decref(arguments);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a tool call");
    }
    a->tool_calls = c;
    c = &c[a->n_tool_calls];
    memset(c, 0, sizeof *c);
    c->id = xstrdup(id);
    c->name = xstrdup(name);
    c->arguments = arguments ? arguments : json_object();
    if (!c->id || !c->name || !c->arguments) {
        tool_call_clear(c);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a tool call");
    }
    a->n_tool_calls++;
    return ARL_OK;
}

arl_status arl_env_action_add_parse_error(arl_env_action *a, const char *id,
                                          arl_env_parse_status status, const char *message,
                                          const char *raw) {
    arl_env_parse_error *p =
        realloc(a->parse_errors, (size_t)(a->n_parse_errors + 1) * sizeof *p);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a parse error");
    a->parse_errors = p;
    p = &p[a->n_parse_errors];
    memset(p, 0, sizeof *p);
    p->id = xstrdup(id);
    p->status = status;
    p->message = xstrdup(message);
    p->raw = xstrdup(raw);
    if (!p->id || !p->message || !p->raw) {
        free(p->id);
        free(p->message);
        free(p->raw);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory adding a parse error");
    }
    a->n_parse_errors++;
    return ARL_OK;
}

void arl_env_action_set_parse_status(arl_env_action *a) {
    if (a->n_parse_errors > 0)
        a->parse_status = a->parse_errors[0].status;
    else if (a->n_tool_calls > 0)
        a->parse_status = ARL_ENV_PARSE_OK;
    else
        a->parse_status = ARL_ENV_PARSE_NO_TOOL_CALL;
}

arl_status arl_env_action_check(const arl_env_action *a) {
    if ((unsigned)a->parse_status > ARL_ENV_PARSE_MALFORMED_STRUCTURE)
        return arl_errorf(ARL_ERR_FORMAT, "/parse_status: not a parse status");
    if ((unsigned)a->finish_reason > ARL_ENV_FINISH_LENGTH)
        return arl_errorf(ARL_ERR_FORMAT, "/finish_reason: not a finish reason");
    for (int32_t i = 0; i < a->n_parse_errors; i++) {
        arl_env_parse_status s = a->parse_errors[i].status;
        if (s == ARL_ENV_PARSE_OK || s == ARL_ENV_PARSE_NO_TOOL_CALL ||
            (unsigned)s > ARL_ENV_PARSE_MALFORMED_STRUCTURE)
            return arl_errorf(ARL_ERR_FORMAT,
                              "/parse_errors/%d/status: '%s' is not a block status", (int)i,
                              arl_env_parse_status_str(s));
    }
    arl_env_parse_status want = a->n_parse_errors > 0 ? a->parse_errors[0].status
                                : a->n_tool_calls > 0 ? ARL_ENV_PARSE_OK
                                                      : ARL_ENV_PARSE_NO_TOOL_CALL;
    if (a->parse_status != want)
        return arl_errorf(ARL_ERR_FORMAT,
                          "/parse_status: '%s' disagrees with tool_calls and parse_errors "
                          "(expected '%s', §4.6)",
                          arl_env_parse_status_str(a->parse_status),
                          arl_env_parse_status_str(want));
    int32_t n = a->n_tool_calls + a->n_parse_errors;
    for (int32_t i = 0; i < n; i++) {
        const char *id = i < a->n_tool_calls ? a->tool_calls[i].id
                                             : a->parse_errors[i - a->n_tool_calls].id;
        if (!id) return arl_errorf(ARL_ERR_FORMAT, "tool-call id missing");
        for (int32_t j = i + 1; j < n; j++) {
            const char *id2 = j < a->n_tool_calls ? a->tool_calls[j].id
                                                  : a->parse_errors[j - a->n_tool_calls].id;
            if (id2 && !strcmp(id, id2))
                return arl_errorf(ARL_ERR_FORMAT, "tool-call id '%s' used twice (§4.5)", id);
        }
    }
    for (int32_t i = 0; i < a->n_tool_calls; i++)
        if (!a->tool_calls[i].name || !json_is_object(a->tool_calls[i].arguments))
            return arl_errorf(ARL_ERR_FORMAT, "/tool_calls/%d: name and object arguments required",
                              (int)i);
    return ARL_OK;
}

char *arl_env_action_to_json(const arl_env_action *a) {
    json_t *v = aep_action_to_json_value(a);
    if (!v) return NULL;
    char *s = aep_json_dumps(v, NULL);
    json_decref(v);
    return s;
}

/* ---- tool-call argument parser (§4.6) ---- */

arl_env_parse_status arl_env_tool_args_parse(const char *text, size_t len, json_t **args,
                                             char *msg, size_t msg_cap) {
    *args = NULL;
    char err[512];
    if (!text) len = 0;
    if (aep_json_depth(text ? text : "", len, ARL_AEP_TOOL_ARGS_MAX_DEPTH) >
        ARL_AEP_TOOL_ARGS_MAX_DEPTH) {
        if (msg_cap) snprintf(msg, msg_cap, "arguments nest deeper than %d levels",
                              ARL_AEP_TOOL_ARGS_MAX_DEPTH);
        return ARL_ENV_PARSE_MALFORMED_STRUCTURE;
    }
    json_t *v = aep_json_loads(text ? text : "", len, ARL_AEP_TOOL_ARGS_MAX_DEPTH, err, sizeof err);
    if (!v) {
        if (msg_cap) snprintf(msg, msg_cap, "%s", err);
        return ARL_ENV_PARSE_INVALID_JSON;
    }
    if (!json_is_object(v)) {
        if (msg_cap)
            snprintf(msg, msg_cap, "arguments are valid JSON but not an object");
        json_decref(v);
        return ARL_ENV_PARSE_ARGUMENTS_NOT_OBJECT;
    }
    if (msg_cap) msg[0] = 0;
    *args = v;
    return ARL_ENV_PARSE_OK;
}

/* ---- argument validation against a tool schema ---- */

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static int type_matches(const char *t, const json_t *v) {
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return 1; /* unknown type keyword: not checked */
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

static int validate_at(const json_t *schema, const json_t *v, char *path, size_t plen,
                       char *msg, size_t cap, int depth) {
    if (!json_is_object(schema) || depth > 64) return 1;
    const json_t *anyof = json_object_get(schema, "anyOf");
    if (json_is_array(anyof) && json_array_size(anyof) > 0) {
        size_t i;
        const json_t *alt;
        int ok = 0;
        json_array_foreach(anyof, i, alt) {
            if (validate_at(alt, v, path, plen, NULL, 0, depth + 1)) {
                ok = 1;
                break;
            }
        }
        if (!ok) {
            if (cap)
                snprintf(msg, cap, "%s: matches no alternative of anyOf", path[0] ? path : "/");
            return 0;
        }
    }
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type) && !type_matches(json_string_value(type), v)) {
        if (cap)
            snprintf(msg, cap, "%s: expected %s, got %s", path[0] ? path : "/",
                     json_string_value(type), json_type_name(v));
        return 0;
    }
    if (json_is_array(type)) {
        size_t i;
        const json_t *t;
        int ok = 0;
        json_array_foreach(type, i, t) if (json_is_string(t) && type_matches(json_string_value(t), v)) ok = 1;
        if (!ok) {
            if (cap)
                snprintf(msg, cap, "%s: type %s not allowed", path[0] ? path : "/",
                         json_type_name(v));
            return 0;
        }
    }
    const json_t *en = json_object_get(schema, "enum");
    if (json_is_array(en)) {
        size_t i;
        const json_t *e;
        int ok = 0;
        json_array_foreach(en, i, e) if (json_equal((json_t *)e, (json_t *)v)) ok = 1;
        if (!ok) {
            if (cap) snprintf(msg, cap, "%s: value not in enum", path[0] ? path : "/");
            return 0;
        }
    }
    if (json_is_number(v)) {
        double x = json_number_value(v);
        const json_t *mn = json_object_get(schema, "minimum"), *mx = json_object_get(schema, "maximum");
        if (json_is_number(mn) && x < json_number_value(mn)) {
            if (cap)
                snprintf(msg, cap, "%s: %g < minimum %g", path[0] ? path : "/", x,
                         json_number_value(mn));
            return 0;
        }
        if (json_is_number(mx) && x > json_number_value(mx)) {
            if (cap)
                snprintf(msg, cap, "%s: %g > maximum %g", path[0] ? path : "/", x,
                         json_number_value(mx));
            return 0;
        }
    }
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        const json_t *mn = json_object_get(schema, "minLength"), *mx = json_object_get(schema, "maxLength");
        if (json_is_integer(mn) && (json_int_t)n < json_integer_value(mn)) {
            if (cap)
                snprintf(msg, cap, "%s: shorter than minLength %lld", path[0] ? path : "/",
                         (long long)json_integer_value(mn));
            return 0;
        }
        if (json_is_integer(mx) && (json_int_t)n > json_integer_value(mx)) {
            if (cap)
                snprintf(msg, cap, "%s: longer than maxLength %lld", path[0] ? path : "/",
                         (long long)json_integer_value(mx));
            return 0;
        }
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(schema, "properties");
        const json_t *req = json_object_get(schema, "required");
        if (json_is_array(req)) {
            size_t i;
            const json_t *r;
            json_array_foreach(req, i, r) {
                if (json_is_string(r) && !json_object_get(v, json_string_value(r))) {
                    if (cap)
                        snprintf(msg, cap, "%s: missing required property '%s'",
                                 path[0] ? path : "/", json_string_value(r));
                    return 0;
                }
            }
        }
        const json_t *addl = json_object_get(schema, "additionalProperties");
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv) {
            const json_t *ps = json_is_object(props) ? json_object_get(props, k) : NULL;
            size_t n = strlen(path);
            snprintf(path + n, plen > n ? plen - n : 0, "/%s", k);
            int ok = 1;
            if (ps)
                ok = validate_at(ps, pv, path, plen, msg, cap, depth + 1);
            else if (json_is_false(addl)) {
                if (cap) snprintf(msg, cap, "%s: property not allowed", path);
                ok = 0;
            } else if (json_is_object(addl))
                ok = validate_at(addl, pv, path, plen, msg, cap, depth + 1);
            path[n] = 0;
            if (!ok) return 0;
        }
    }
    if (json_is_array(v)) {
        const json_t *items = json_object_get(schema, "items");
        if (json_is_object(items)) {
            size_t i;
            const json_t *e;
            json_array_foreach(v, i, e) {
                size_t n = strlen(path);
                snprintf(path + n, plen > n ? plen - n : 0, "/%zu", i);
                int ok = validate_at(items, e, path, plen, msg, cap, depth + 1);
                path[n] = 0;
                if (!ok) return 0;
            }
        }
    }
    return 1;
}

/* 1 if no string in v (at any depth, schema or not) holds U+0000: environments read arguments
 * as C strings, and "1+1\u0000junk" must not run as "1+1".  Else 0, the path in msg. */
static int no_nul_at(const json_t *v, char *path, size_t plen, char *msg, size_t cap, int depth) {
    if (json_is_string(v) && strlen(json_string_value(v)) != json_string_length(v)) {
        if (cap) snprintf(msg, cap, "%s: contains U+0000", path[0] ? path : "/");
        return 0;
    }
    if (depth > 64 || (!json_is_object(v) && !json_is_array(v))) return 1;
    const size_t n = strlen(path);
    int ok = 1;
    if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            snprintf(path + n, plen > n ? plen - n : 0, "/%s", k);
            if (!(ok = no_nul_at(e, path, plen, msg, cap, depth + 1))) break;
        }
    } else {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            snprintf(path + n, plen > n ? plen - n : 0, "/%zu", i);
            if (!(ok = no_nul_at(e, path, plen, msg, cap, depth + 1))) break;
        }
    }
    path[n] = 0;
    return ok;
}

int arl_env_args_validate(const json_t *schema, const json_t *args, char *msg, size_t msg_cap) {
    char path[512] = "";
    if (msg_cap) msg[0] = 0;
    if (!args) {
        if (msg_cap) snprintf(msg, msg_cap, "/: arguments missing");
        return 0;
    }
    if (!no_nul_at(args, path, sizeof path, msg, msg_cap, 0)) return 0;
    return validate_at(schema, args, path, sizeof path, msg, msg_cap, 0);
}

const json_t *arl_env_tools_find(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    if (!json_is_array(tools) || !name) return NULL;
    json_array_foreach(tools, i, t) {
        const json_t *f = json_object_get(t, "function");
        const json_t *n = json_object_get(f, "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) {
            const json_t *p = json_object_get(f, "parameters");
            return p ? p : f;
        }
    }
    return NULL;
}

/* ---- results ---- */

void arl_env_result_clear(arl_env_result *r) {
    if (!r) return;
    arl_env_observation_clear(&r->obs);
    if (r->info) json_decref(r->info);
    memset(r, 0, sizeof *r);
}

void arl_env_score_result_clear(arl_env_score_result *r) {
    if (!r) return;
    if (r->info) json_decref(r->info);
    memset(r, 0, sizeof *r);
}

static arl_status component_put(arl_env_component *c, int32_t *n, const char *name, double value) {
    if (!name || !aep_valid_component_name(name))
        return arl_errorf(ARL_ERR_ARG, "env: reward component name '%s' is not ^[a-z][a-z0-9_]{0,63}$",
                          name ? name : "(null)");
    if (!isfinite(value))
        return arl_errorf(ARL_ERR_ARG, "env: reward component '%s' is not finite", name);
    for (int32_t i = 0; i < *n; i++)
        if (!strcmp(c[i].name, name)) {
            c[i].value = value;
            return ARL_OK;
        }
    if (*n >= ARL_AEP_MAX_COMPONENTS)
        return arl_errorf(ARL_ERR_RANGE, "env: more than %d reward components", ARL_AEP_MAX_COMPONENTS);
    snprintf(c[*n].name, sizeof c[*n].name, "%s", name);
    c[*n].value = value;
    (*n)++;
    return ARL_OK;
}

arl_status arl_env_result_component(arl_env_result *r, const char *name, double value) {
    return component_put(r->components, &r->n_components, name, value);
}
arl_status arl_env_score_component(arl_env_score_result *r, const char *name, double value) {
    return component_put(r->components, &r->n_components, name, value);
}

/* ---- client configuration defaults (§11, §12.1) ---- */

void arl_env_client_config_default(arl_env_client_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->connect_timeout_ms = 5000;
    cfg->slack_ms = 5000;
    cfg->get_timeout_ms = 10000;
    cfg->max_response_bytes = 16 << 20;
    cfg->max_observation_bytes = 8 << 20;
    cfg->max_messages = 4096;
    cfg->max_image_bytes = 8 << 20;
    cfg->max_image_pixels = 4096 * 4096;
    cfg->queue_budget_ms = 600000;
    cfg->backoff_base_ms = 250;
    cfg->backoff_max_ms = 30000;
    cfg->create_deadline_ms = 120000;
    cfg->score_deadline_ms = 300000;
    cfg->fork_deadline_ms = 120000;
    cfg->retry_say_ms = 10000;
    cfg->seed = 0x5eed;
}

/* ---- /info ---- */

void arl_env_limits_default(arl_env_limits *l) {
    l->max_sessions = 64;
    l->max_steps = 1000;
    l->default_step_timeout_ms = 60000;
    l->max_deadline_ms = 3600000;
    l->session_idle_timeout_ms = 900000;
    l->max_request_bytes = 4194304;
    l->max_observation_bytes = 1048576;
    l->max_image_bytes = 4194304;
    l->max_image_pixels = 16777216;
}

void arl_env_info_clear(arl_env_info *info) {
    if (!info) return;
    free(info->description);
    if (info->tools) json_decref(info->tools);
    free(info->components);
    memset(info, 0, sizeof *info);
}

static int get_range(const json_t *r, double *lo, double *hi) {
    if (!json_is_array(r) || json_array_size(r) != 2) return 0;
    const json_t *a = json_array_get(r, 0), *b = json_array_get(r, 1);
    if (!json_is_number(a) || !json_is_number(b)) return 0;
    *lo = json_number_value(a);
    *hi = json_number_value(b);
    return isfinite(*lo) && isfinite(*hi) && *lo <= *hi;
}

/* Validate a tool set (§4.4): returns 0 or -1 with err. */
int aep_tools_validate(const json_t *tools, const char *where, char *err, size_t cap);
int aep_tools_validate(const json_t *tools, const char *where, char *err, size_t cap) {
    if (!json_is_array(tools)) {
        snprintf(err, cap, "%s: expected an array of tools", where);
        return -1;
    }
    if (json_array_size(tools) > ARL_AEP_MAX_TOOLS) {
        snprintf(err, cap, "%s: %zu tools > %d", where, json_array_size(tools), ARL_AEP_MAX_TOOLS);
        return -1;
    }
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *ty = json_object_get(t, "type");
        const json_t *f = json_object_get(t, "function");
        const json_t *n = json_object_get(f, "name");
        const json_t *d = json_object_get(f, "description");
        const json_t *p = json_object_get(f, "parameters");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(f)) {
            snprintf(err, cap, "%s/%zu: expected {\"type\": \"function\", \"function\": {...}}", where, i);
            return -1;
        }
        if (!json_is_string(n) || !aep_valid_tool_name(json_string_value(n))) {
            snprintf(err, cap, "%s/%zu/function/name: not ^[A-Za-z0-9_-]{1,64}$", where, i);
            return -1;
        }
        if (d && !json_is_null(d) && (!json_is_string(d) || json_string_length(d) > 4096)) {
            snprintf(err, cap, "%s/%zu/function/description: expected a string <= 4 KiB", where, i);
            return -1;
        }
        const json_t *pt = json_object_get(p, "type");
        if (!json_is_object(p) || !json_is_string(pt) || strcmp(json_string_value(pt), "object")) {
            snprintf(err, cap, "%s/%zu/function/parameters: expected a schema with \"type\": \"object\"",
                     where, i);
            return -1;
        }
        for (size_t j = 0; j < i; j++) {
            const json_t *n2 = json_object_get(json_object_get(json_array_get(tools, j), "function"), "name");
            if (json_is_string(n2) && !strcmp(json_string_value(n2), json_string_value(n))) {
                snprintf(err, cap, "%s/%zu/function/name: '%s' declared twice", where, i,
                         json_string_value(n));
                return -1;
            }
        }
    }
    return 0;
}

static arl_status info_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static arl_status info_fail(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return arl_errorf(ARL_ERR_PROTOCOL, "/info: %s", buf);
}

static int semver_ok(const char *s) {
    /* MAJOR.MINOR.PATCH with optional -pre / +build: digits, dots; permissive after the core */
    int parts = 0;
    const char *p = s;
    while (parts < 3) {
        if (*p < '0' || *p > '9') return 0;
        while (*p >= '0' && *p <= '9') p++;
        parts++;
        if (parts < 3) {
            if (*p != '.') return 0;
            p++;
        }
    }
    return *p == 0 || *p == '-' || *p == '+';
}

static arl_status info_parse(const char *body, size_t len, arl_env_info *out) {
    char err[512];
    memset(out, 0, sizeof *out);
    json_t *v = aep_json_loads(body, len, ARL_AEP_MAX_DEPTH, err, sizeof err);
    if (!v) return info_fail("%s", err);
    arl_status st = ARL_OK;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        st = info_fail(__VA_ARGS__);                                                               \
        goto done;                                                                                 \
    } while (0)
    if (!json_is_object(v)) FAIL("not a JSON object");
    const json_t *proto = json_object_get(v, "protocol");
    if (!json_is_string(proto) || strcmp(json_string_value(proto), ARL_AEP_PROTOCOL))
        FAIL("/protocol: expected \"aep/1\"");
    if (!aep_json_get_index(v, "protocol_revision", &out->protocol_revision))
        FAIL("/protocol_revision: expected a non-negative integer");
    const json_t *env = json_object_get(v, "env");
    const json_t *nm = json_object_get(env, "name"), *ver = json_object_get(env, "version");
    if (!json_is_string(nm) || !aep_valid_env_name(json_string_value(nm)))
        FAIL("/env/name: expected ^[a-z0-9][a-z0-9_.-]{0,63}$");
    if (!json_is_string(ver) || json_string_length(ver) > 64 || !semver_ok(json_string_value(ver)))
        FAIL("/env/version: expected a semantic version such as \"1.0.0\"");
    snprintf(out->name, sizeof out->name, "%s", json_string_value(nm));
    snprintf(out->version, sizeof out->version, "%s", json_string_value(ver));
    const json_t *desc = json_object_get(env, "description");
    out->description = strdup(json_is_string(desc) ? json_string_value(desc) : "");
    if (!out->description) {
        st = arl_errorf(ARL_ERR_NOMEM, "/info: out of memory");
        goto done;
    }
    const json_t *tools = json_object_get(v, "tools");
    if (aep_tools_validate(tools, "/tools", err, sizeof err)) FAIL("%s", err);
    {
        char *ts = aep_json_dumps(tools, NULL);
        size_t tl = ts ? strlen(ts) : 0;
        free(ts);
        if (tl > ARL_AEP_MAX_TOOLS_BYTES) FAIL("/tools: %zu bytes > 256 KiB", tl);
    }
    out->tools = json_incref((json_t *)tools);
    const json_t *levels = json_object_get(v, "reward_levels");
    if (!json_is_object(levels)) FAIL("/reward_levels: expected an object");
    {
        const char *k;
        json_t *lv;
        json_object_foreach((json_t *)levels, k, lv) {
            int l = arl_env_level_parse(k);
            if (l < 0) continue; /* unknown members are ignored (§2.3 rule 5) */
            double lo, hi;
            if (!get_range(json_object_get(lv, "range"), &lo, &hi))
                FAIL("/reward_levels/%s/range: expected [lo, hi] with lo <= hi", k);
            out->level_declared[l] = 1;
            out->level_lo[l] = lo;
            out->level_hi[l] = hi;
        }
    }
    if (!out->level_declared[ARL_ENV_LEVEL_OUTCOME])
        FAIL("/reward_levels/outcome: the outcome level must be declared (§4.8 rule 1)");
    const json_t *comps = json_object_get(v, "reward_components");
    if (!json_is_array(comps)) FAIL("/reward_components: expected an array");
    if (json_array_size(comps) > 0) {
        out->components = calloc(json_array_size(comps), sizeof *out->components);
        if (!out->components) {
            st = arl_errorf(ARL_ERR_NOMEM, "/info: out of memory");
            goto done;
        }
    }
    {
        size_t i;
        const json_t *c;
        json_array_foreach(comps, i, c) {
            arl_env_component_decl *d = &out->components[i];
            const json_t *cn = json_object_get(c, "name");
            if (!json_is_string(cn) || !aep_valid_component_name(json_string_value(cn)))
                FAIL("/reward_components/%zu/name: expected ^[a-z][a-z0-9_]{0,63}$", i);
            for (size_t j = 0; j < i; j++)
                if (!strcmp(out->components[j].name, json_string_value(cn)))
                    FAIL("/reward_components/%zu/name: '%s' declared twice", i, json_string_value(cn));
            snprintf(d->name, sizeof d->name, "%s", json_string_value(cn));
            int l = arl_env_level_parse(json_string_value(json_object_get(c, "level")));
            if (l < 0) FAIL("/reward_components/%zu/level: expected process, segment or outcome", i);
            if (!out->level_declared[l])
                FAIL("/reward_components/%zu/level: level '%s' is not declared in reward_levels", i,
                     level_names[l]);
            d->level = (arl_env_level)l;
            if (!get_range(json_object_get(c, "range"), &d->lo, &d->hi))
                FAIL("/reward_components/%zu/range: expected [lo, hi] with lo <= hi", i);
            const json_t *w = json_object_get(c, "default_weight");
            d->default_weight = json_is_number(w) ? json_number_value(w) : 1.0;
            if (w && !json_is_null(w) && !json_is_number(w))
                FAIL("/reward_components/%zu/default_weight: expected a number", i);
            const json_t *src = json_object_get(c, "source");
            if (src && !json_is_null(src)) {
                if (!json_is_string(src) || (strcmp(json_string_value(src), "rule") &&
                                             strcmp(json_string_value(src), "model")))
                    FAIL("/reward_components/%zu/source: expected \"rule\" or \"model\"", i);
                d->source_model = !strcmp(json_string_value(src), "model");
            }
            out->n_components = (int32_t)(i + 1);
        }
    }
    const json_t *caps = json_object_get(v, "capabilities");
    if (!json_is_object(caps)) FAIL("/capabilities: expected an object");
    {
        static const char *const cn[] = {"fork", "fork_past", "segment_score", "deterministic_replay",
                                         "parallel_tool_calls", "multimodal", "context_reset"};
        int *cv[] = {&out->caps.fork, &out->caps.fork_past, &out->caps.segment_score,
                     &out->caps.deterministic_replay, &out->caps.parallel_tool_calls,
                     &out->caps.multimodal, &out->caps.context_reset};
        for (int i = 0; i < 7; i++) {
            const json_t *b = json_object_get(caps, cn[i]);
            if (b && !json_is_null(b) && !json_is_boolean(b))
                FAIL("/capabilities/%s: expected a boolean", cn[i]);
            *cv[i] = json_is_true(b);
        }
        if (out->caps.fork_past) out->caps.fork = 1;
        if (out->caps.segment_score && !out->level_declared[ARL_ENV_LEVEL_SEGMENT])
            FAIL("/capabilities/segment_score: true, but the segment level is not declared");
    }
    const json_t *lim = json_object_get(v, "limits");
    if (!json_is_object(lim)) FAIL("/limits: expected an object");
    arl_env_limits_default(&out->limits);
    {
        static const char *const ln[] = {"max_sessions", "max_steps", "default_step_timeout_ms",
                                         "max_deadline_ms", "session_idle_timeout_ms",
                                         "max_request_bytes", "max_observation_bytes",
                                         "max_image_bytes", "max_image_pixels"};
        int64_t *lv[] = {&out->limits.max_sessions, &out->limits.max_steps,
                         &out->limits.default_step_timeout_ms, &out->limits.max_deadline_ms,
                         &out->limits.session_idle_timeout_ms, &out->limits.max_request_bytes,
                         &out->limits.max_observation_bytes, &out->limits.max_image_bytes,
                         &out->limits.max_image_pixels};
        for (int i = 0; i < 9; i++) {
            const json_t *x = json_object_get(lim, ln[i]);
            if (!x || json_is_null(x)) continue;
            int64_t val;
            if (!aep_json_get_index(lim, ln[i], &val) || val < 1)
                FAIL("/limits/%s: expected a positive integer", ln[i]);
            *lv[i] = val;
        }
        if (out->limits.session_idle_timeout_ms < 600000)
            FAIL("/limits/session_idle_timeout_ms: %lld < 600000",
                 (long long)out->limits.session_idle_timeout_ms);
        if (out->limits.max_request_bytes < 1048576)
            FAIL("/limits/max_request_bytes: %lld < 1048576",
                 (long long)out->limits.max_request_bytes);
    }
#undef FAIL
done:
    json_decref(v);
    if (st != ARL_OK) arl_env_info_clear(out);
    return st;
}

/* An /info that could not be read for a failed allocation of this thread (the parser's, or
 * jansson's inside it) is out of memory, not an invalid /info (a protocol or configuration
 * error that names the environment at fault). */
arl_status arl_env_info_parse(const char *body, size_t len, arl_env_info *out) {
    const unsigned long n0 = arl_nomem_count();
    arl_status st = info_parse(body, len, out);
    if (st != ARL_OK && st != ARL_ERR_NOMEM && arl_nomem_count() != n0) {
        char was[300];
        snprintf(was, sizeof was, "%s", arl_error_msg());
        st = arl_errorf(ARL_ERR_NOMEM, "out of memory reading /info (%s)", was);
    }
    return st;
}
