/* envs/builtin/common.c: helpers shared by the built-in environments: the parsed tool set of
 * an instance, the turn dispatcher that answers every call and parse error of an action with
 * the model-attributed tool messages of spec/aep.md 4.6-4.7, number formatting and parsing,
 * option readers, anchors, teacher action builders.  No environment logic lives here. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "envs/builtin/builtin.h"

/* ---- instances ---- */

arl_status arl_bi_instance_open(const char *info_json, const json_t *config, void **inst) {
    *inst = NULL;
    if (config && !json_is_object(config))
        return arl_errorf(ARL_ERR_CONFIG, "built-in environment configuration: expected an "
                                          "object");
    if (config && json_object_size(config) > 0) {
        const char *k = json_object_iter_key(json_object_iter((json_t *)config));
        return arl_errorf(ARL_ERR_CONFIG,
                          "built-in environment configuration: unknown member '%s' (built-in "
                          "environments take their settings from task.data and options)",
                          k);
    }
    json_error_t jerr;
    json_t *info = arl_json_loads(info_json, 0, &jerr);
    if (!info)
        return arl_json_error_nomem(&jerr)
                   ? arl_errorf(ARL_ERR_NOMEM, "built-in environment: out of memory")
                   : arl_errorf(ARL_ERR_INTERNAL, "built-in info_json: line %d: %s", jerr.line,
                                jerr.text);
    json_t *tools = json_object_get(info, "tools");
    if (!json_is_array(tools)) {
        json_decref(info);
        return arl_errorf(ARL_ERR_INTERNAL, "built-in info_json: no tools array");
    }
    arl_bi_instance *in = calloc(1, sizeof *in);
    if (!in) {
        json_decref(info);
        return arl_errorf(ARL_ERR_NOMEM, "built-in environment: out of memory");
    }
    in->tools = json_incref(tools);
    json_decref(info);
    *inst = in;
    return ARL_OK;
}

void arl_bi_instance_close(void *inst) {
    arl_bi_instance *in = inst;
    if (!in) return;
    json_decref(in->tools);
    free(in);
}

/* ---- the turn dispatcher ---- */

static arl_status nomem(void) {
    return arl_errorf(ARL_ERR_NOMEM, "built-in environment: out of memory");
}

static arl_status add_error(arl_env_observation *o, const char *id, const char *code,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static arl_status add_error(arl_env_observation *o, const char *id, const char *code,
                            const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return arl_env_obs_add_tool(o, id, buf, code) == ARL_OK ? ARL_OK : nomem();
}

/* A call of the lenient tool whose only problem is a numeric "value". */
static int lenient_ok(const arl_bi_dispatch *d, const arl_env_tool_call *c) {
    if (!d->lenient_tool || strcmp(c->name, d->lenient_tool)) return 0;
    if (!json_is_object(c->arguments) || json_object_size(c->arguments) != 1) return 0;
    json_t *v = json_object_get(c->arguments, "value");
    return v && json_is_number(v);
}

arl_status arl_bi_dispatch_turn(const arl_bi_dispatch *d, const arl_bi_instance *inst, void *state,
                                const arl_env_action *a, arl_env_observation *obs,
                                arl_bi_turn_stats *st, int *ended) {
    memset(st, 0, sizeof *st);
    *ended = 0;
    obs->context = ARL_ENV_CONTEXT_APPEND;
    st->cut_off = a->finish_reason == ARL_ENV_FINISH_LENGTH;
    int stop = 0;
    for (int32_t i = 0; i < a->n_tool_calls; i++) {
        const arl_env_tool_call *c = &a->tool_calls[i];
        const char *id = c->id ? c->id : "";
        const char *name = c->name ? c->name : "";
        st->n_calls++;
        const json_t *schema = arl_env_tools_find(inst->tools, name);
        char why[512];
        arl_status s = ARL_OK;
        if (stop) {
            st->n_malformed++;
            s = add_error(obs, id, ARL_ENV_TOOL_CALL_LIMIT,
                          "Not run: an earlier call of this turn ended the episode.");
        } else if (i >= d->max_calls_per_turn) {
            st->n_malformed++;
            s = add_error(obs, id, ARL_ENV_TOOL_CALL_LIMIT,
                          "Not run: at most %d tool calls per turn.", d->max_calls_per_turn);
        } else if (!schema) {
            char list[512];
            int off = 0;
            for (size_t k = 0; k < json_array_size(inst->tools) && off < (int)sizeof list; k++) {
                json_t *fn = json_object_get(json_array_get(inst->tools, k), "function");
                off += snprintf(list + off, sizeof list - (size_t)off, "%s%s", k ? ", " : "",
                                json_string_value(json_object_get(fn, "name")));
            }
            st->n_malformed++;
            s = add_error(obs, id, ARL_ENV_TOOL_NOT_FOUND,
                          "Unknown tool '%.64s'. Available tools: %s.", name, list);
        } else if (!json_is_object(c->arguments) ||
                   (!arl_env_args_validate(schema, c->arguments, why, sizeof why) &&
                    !lenient_ok(d, c))) {
            if (!json_is_object(c->arguments)) snprintf(why, sizeof why, "not a JSON object");
            st->n_malformed++;
            s = add_error(obs, id, ARL_ENV_TOOL_ARGS_INVALID, "Invalid arguments for %s: %s.", name,
                          why);
        } else {
            arl_bi_call_kind kind = ARL_BI_CALL_OK;
            int cstop = 0;
            int32_t before = obs->n_messages;
            s = d->run_call(state, c, obs, &kind, &cstop);
            if (s != ARL_OK) return s;
            if (obs->n_messages != before + 1)
                return arl_errorf(ARL_ERR_INTERNAL,
                                  "built-in tool %s answered with %d "
                                  "messages instead of 1",
                                  name, (int)(obs->n_messages - before));
            switch (kind) {
            case ARL_BI_CALL_OK:
                st->n_ok++;
                break;
            case ARL_BI_CALL_RUNTIME:
                st->n_runtime++;
                break;
            case ARL_BI_CALL_TRANSIENT:
                st->n_transient++;
                break;
            case ARL_BI_CALL_MALFORMED:
                st->n_malformed++;
                break;
            }
            if (cstop) stop = 1;
        }
        if (s != ARL_OK) return s;
    }
    if (a->n_parse_errors > 0) {
        st->n_malformed += a->n_parse_errors;
        if (arl_env_obs_answer_parse_errors(obs, a) != ARL_OK) return nomem();
    }
    if (a->n_tool_calls == 0 && a->n_parse_errors == 0) {
        st->no_tool_call = 1;
        const char *text = st->cut_off ? "Your reply was cut off before it ended. Keep replies "
                                         "short and act through a tool call."
                                       : d->nudge_no_call;
        if (arl_env_obs_add_text(obs, ARL_ENV_ROLE_USER, text) != ARL_OK) return nomem();
    }
    *ended = stop;
    return ARL_OK;
}

/* ---- numbers ---- */

void arl_bi_format_number(double x, char *buf, size_t size) {
    if (x == 0) x = 0; /* no "-0" */
    if (fabs(x) < 1e15 && x == floor(x)) {
        snprintf(buf, size, "%.0f", x);
        return;
    }
    snprintf(buf, size, "%.12g", x);
}

int arl_bi_parse_number(const char *s, double *out) {
    char clean[64];
    size_t n = 0;
    if (!s) return 0;
    while (isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    int digits = 0, dot = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == ',' || (c == '$' && n <= 1)) continue; /* thousands separators, "$3", "-$3" */
        if ((c == '-' || c == '+') && n == 0) {
            clean[n++] = c;
        } else if (c >= '0' && c <= '9') {
            clean[n++] = c;
            digits++;
        } else if (c == '.' && !dot) {
            clean[n++] = c;
            dot = 1;
        } else {
            return 0;
        }
        if (n >= sizeof clean - 1) return 0;
    }
    if (!digits) return 0;
    clean[n] = 0;
    char *end;
    double v = strtod(clean, &end);
    if (*end || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

int arl_bi_numbers_equal(double a, double expected) {
    double tol = 1e-6 * (fabs(expected) > 1 ? fabs(expected) : 1);
    return fabs(a - expected) <= tol;
}

uint64_t arl_bi_hash(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    if (!h) h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- option readers ---- */

arl_status arl_bi_get_int(const json_t *obj, const char *key, const char *where, int64_t def,
                          int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return ARL_OK;
    }
    if (!json_is_integer(v))
        return arl_errorf(ARL_ERR_ARG, "%s.%s: expected an integer in [%lld, %lld]", where, key,
                          (long long)lo, (long long)hi);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return arl_errorf(ARL_ERR_ARG, "%s.%s: expected an integer in [%lld, %lld], got %lld",
                          where, key, (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return ARL_OK;
}

arl_status arl_bi_get_double(const json_t *obj, const char *key, const char *where, double def,
                             double lo, double hi, double *out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return ARL_OK;
    }
    if (!json_is_number(v))
        return arl_errorf(ARL_ERR_ARG, "%s.%s: expected a number in [%g, %g]", where, key, lo, hi);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return arl_errorf(ARL_ERR_ARG, "%s.%s: expected a number in [%g, %g], got %g", where, key,
                          lo, hi, x);
    *out = x;
    return ARL_OK;
}

arl_status arl_bi_get_string(const json_t *obj, const char *key, const char *where, const char *def,
                             const char *const *choices, const char **out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) {
        *out = def;
        return ARL_OK;
    }
    if (!json_is_string(v)) return arl_errorf(ARL_ERR_ARG, "%s.%s: expected a string", where, key);
    const char *s = json_string_value(v);
    if (choices) {
        int ok = 0;
        for (int i = 0; choices[i]; i++)
            if (!strcmp(s, choices[i])) ok = 1;
        if (!ok) {
            char list[256];
            int off = 0;
            for (int i = 0; choices[i] && off < (int)sizeof list; i++)
                off += snprintf(list + off, sizeof list - (size_t)off, "%s%s", i ? "|" : "",
                                choices[i]);
            return arl_errorf(ARL_ERR_ARG, "%s.%s: expected one of %s, got \"%.64s\"", where, key,
                              list, s);
        }
    }
    *out = s;
    return ARL_OK;
}

arl_status arl_bi_check_keys(const json_t *obj, const char *where, const char *const *keys) {
    if (!obj || json_is_null(obj)) return ARL_OK;
    if (!json_is_object(obj)) return arl_errorf(ARL_ERR_ARG, "%s: expected an object", where);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        int ok = 0;
        for (int i = 0; keys[i]; i++)
            if (!strcmp(k, keys[i])) ok = 1;
        if (!ok) {
            char list[512];
            int off = 0;
            for (int i = 0; keys[i] && off < (int)sizeof list; i++)
                off +=
                    snprintf(list + off, sizeof list - (size_t)off, "%s%s", i ? ", " : "", keys[i]);
            return arl_errorf(ARL_ERR_ARG, "%s: unknown member '%.64s' (known: %s)", where, k,
                              off ? list : "none");
        }
    }
    return ARL_OK;
}

const char *arl_bi_arg_text(const json_t *args, const char *key, char *buf, size_t size) {
    json_t *v = json_object_get(args, key);
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_number(v)) {
        arl_bi_format_number(json_number_value(v), buf, size);
        return buf;
    }
    return NULL;
}

arl_status arl_bi_set_anchor(json_t **info, const char *env, uint64_t h) {
    char a[96];
    snprintf(a, sizeof a, "%s:%016" PRIx64, env, h);
    json_t *o = json_pack("{s:s}", "anchor", a);
    if (!o) return nomem();
    json_decref(*info);
    *info = o;
    return ARL_OK;
}

/* ---- teacher actions ---- */

arl_status arl_bi_teacher_call(arl_env_action *a, int64_t step, const char *name, json_t *args) {
    char id[64];
    snprintf(id, sizeof id, "call_%lld_%d", (long long)step, (int)a->n_tool_calls);
    if (!args) return nomem();
    return arl_env_action_add_call(a, id, name, args) == ARL_OK ? ARL_OK : nomem();
}

arl_status arl_bi_teacher_finish(arl_env_action *a, const char *content) {
    free(a->content);
    a->content = strdup(content ? content : "");
    if (!a->content) return nomem();
    arl_env_action_set_parse_status(a);
    a->finish_reason = a->n_tool_calls ? ARL_ENV_FINISH_TOOL_CALLS : ARL_ENV_FINISH_STOP;
    return ARL_OK;
}
