/* envs/builtin/teacher.c: the table of built-ins with teachers, the in-process episode
 * driver that runs a teacher through an environment's callbacks (reset, step, score), the
 * OpenAI-format conversion of observations and actions, and the JSONL demonstration writer
 * (teacher.h).  The AEP state machine is not involved: episodes run directly on the
 * environment's ops, with the host's truncation rule (max_steps) applied here. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "envs/builtin/builtin.h"
#include "envs/builtin/teacher.h"

static const arl_builtin arl_builtins_with_teachers[] = {
    {&arl_env_calculator, arl_env_calculator_teacher},
    {&arl_env_needle, arl_env_needle_teacher},
    {&arl_env_kvstore, arl_env_kvstore_teacher},
    {&arl_env_shapes, arl_env_shapes_teacher},
};
#define NBUILTINS (sizeof arl_builtins_with_teachers / sizeof arl_builtins_with_teachers[0])

const arl_builtin *arl_builtin_find(const char *name) {
    for (size_t i = 0; name && i < NBUILTINS; i++)
        if (!strcmp(arl_builtins_with_teachers[i].def->name, name))
            return &arl_builtins_with_teachers[i];
    return NULL;
}

const arl_builtin *arl_builtin_at(size_t i) {
    return i < NBUILTINS ? &arl_builtins_with_teachers[i] : NULL;
}

static arl_status nomem(void) {
    return arl_errorf(ARL_ERR_NOMEM, "teacher: out of memory");
}

/* "who: no built-in environment 'name' with a teacher (the table's names)". */
static arl_status no_teacher(const char *who, const char *env_name) {
    char names[256] = "";
    size_t k = 0;
    for (size_t i = 0; i < NBUILTINS && k < sizeof names; i++) {
        const int m = snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "",
                               arl_builtins_with_teachers[i].def->name);
        k += m > 0 ? (size_t)m : 0;
    }
    return arl_errorf(ARL_ERR_NOT_FOUND, "%s: no built-in environment '%s' with a teacher (%s)",
                      who, env_name ? env_name : "", names);
}

/* ---- OpenAI conversion ---- */

static char *base64(const uint8_t *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(4 * ((n + 2) / 3) + 1), *q = out;
    if (!out) return NULL;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *q++ = tab[v >> 18], *q++ = tab[(v >> 12) & 63], *q++ = tab[(v >> 6) & 63];
        *q++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *q++ = tab[v >> 18], *q++ = tab[(v >> 12) & 63];
        *q++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *q++ = '=';
    }
    *q = 0;
    return out;
}

static const char *role_name(arl_env_role r) {
    switch (r) {
    case ARL_ENV_ROLE_SYSTEM:
        return "system";
    case ARL_ENV_ROLE_USER:
        return "user";
    case ARL_ENV_ROLE_ASSISTANT:
        return "assistant";
    default:
        return "tool";
    }
}

static json_t *calls_to_openai(const arl_env_tool_call *calls, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++) {
        char *args = arl_json_dumps(calls[i].arguments, JSON_COMPACT);
        json_t *c =
            args ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", calls[i].id, "type", "function",
                             "function", "name", calls[i].name, "arguments", args)
                 : NULL;
        free(args);
        if (!c || json_array_append_new(a, c)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

arl_status arl_env_obs_to_openai(const arl_env_observation *obs, json_t *msgs) {
    for (int32_t i = 0; i < obs->n_messages; i++) {
        const arl_env_message *m = &obs->messages[i];
        json_t *o = json_object();
        if (!o || json_array_append_new(msgs, o)) return nomem();
        int bad = 0; /* a key left out (out of memory) */
        bad |= json_object_set_new(o, "role", json_string(role_name(m->role)));
        if (m->content_is_parts) {
            json_t *parts = json_array();
            for (int32_t k = 0; k < m->n_parts; k++) {
                const arl_env_part *p = &m->parts[k];
                json_t *po;
                if (p->type == ARL_ENV_PART_TEXT) {
                    po = json_pack("{s:s, s:s}", "type", "text", "text", p->text ? p->text : "");
                } else {
                    char *b = base64(p->image.png, p->image.png_len);
                    char *url = b ? malloc(strlen(b) + 32) : NULL;
                    if (url) sprintf(url, "data:image/png;base64,%s", b);
                    po = url ? json_pack("{s:s, s:{s:s, s:I, s:I}}", "type", "image_url",
                                         "image_url", "url", url, "width",
                                         (json_int_t)p->image.width, "height",
                                         (json_int_t)p->image.height)
                             : NULL;
                    free(b);
                    free(url);
                }
                if (!po || json_array_append_new(parts, po)) {
                    json_decref(parts);
                    return nomem();
                }
            }
            bad |= json_object_set_new(o, "content", parts);
        } else {
            bad |= json_object_set_new(o, "content", json_string(m->content ? m->content : ""));
        }
        if (m->role == ARL_ENV_ROLE_ASSISTANT && m->n_tool_calls > 0)
            bad |= json_object_set_new(o, "tool_calls",
                                       calls_to_openai(m->tool_calls, m->n_tool_calls));
        if (m->role == ARL_ENV_ROLE_TOOL) {
            bad |= json_object_set_new(o, "tool_call_id",
                                       json_string(m->tool_call_id ? m->tool_call_id : ""));
            if (m->is_error) {
                bad |= json_object_set_new(o, "is_error", json_true());
                bad |= json_object_set_new(o, "error_code",
                                           json_string(m->error_code ? m->error_code : ""));
            }
        }
        if (bad) return nomem();
    }
    return ARL_OK;
}

json_t *arl_env_action_to_openai(const arl_env_action *a) {
    json_t *m =
        json_pack("{s:s, s:s}", "role", "assistant", "content", a->content ? a->content : "");
    if (m && a->n_tool_calls > 0) {
        json_t *calls = calls_to_openai(a->tool_calls, a->n_tool_calls);
        if (!calls || json_object_set_new(m, "tool_calls", calls)) {
            json_decref(m);
            return NULL;
        }
    }
    return m;
}

/* ---- in-process episodes ---- */

typedef struct episode {
    const arl_builtin *b;
    void *inst;
    void *state;
    int64_t max_steps;
    int64_t steps;
    int ended; /* terminated or truncated */
    int terminated;
    json_t *messages; /* OpenAI messages so far (may be NULL: not recorded) */
} episode;

static void episode_close(episode *e) {
    if (e->state) e->b->def->ops->free_state(e->inst, e->state);
    if (e->b && e->b->def->ops->instance_destroy) e->b->def->ops->instance_destroy(e->inst);
    json_decref(e->messages);
    memset(e, 0, sizeof *e);
}

static arl_status limits_max_steps(const arl_env_def *def, int64_t *out) {
    json_t *info = arl_json_loads(def->info_json, 0, NULL);
    if (!info) return nomem(); /* a built-in's info_json is valid: only out of memory */
    json_t *v = json_object_get(json_object_get(info, "limits"), "max_steps");
    *out = json_is_integer(v) ? json_integer_value(v) : 1000;
    json_decref(info);
    return ARL_OK;
}

static arl_status episode_open(episode *e, const char *env_name, const arl_env_task *task,
                               const json_t *options, int record) {
    memset(e, 0, sizeof *e);
    e->b = arl_builtin_find(env_name);
    if (!e->b) return no_teacher("teacher", env_name);
    const arl_env_ops *ops = e->b->def->ops;
    int64_t limit = 0;
    ARL_TRY(limits_max_steps(e->b->def, &limit));
    e->max_steps = limit;
    if (options && !json_is_object(options))
        return arl_errorf(ARL_ERR_ARG, "options: expected a JSON object");
    json_t *ms = options ? json_object_get(options, "max_steps") : NULL;
    if (ms && !json_is_null(ms)) {
        if (!json_is_integer(ms) || json_integer_value(ms) < 1 || json_integer_value(ms) > limit)
            return arl_errorf(ARL_ERR_ARG, "options.max_steps: expected an integer in [1, %lld]",
                              (long long)limit);
        e->max_steps = json_integer_value(ms);
    }
    json_t *cfg = json_object();
    arl_status s = ops->instance_create ? ops->instance_create(cfg, &e->inst) : ARL_OK;
    json_decref(cfg);
    if (s != ARL_OK) {
        e->b = NULL;
        return s;
    }
    json_t *empty = json_object();
    arl_env_task t = *task;
    if (!t.data) t.data = empty;
    arl_env_reset_req req = {"teacher", "teacher", t, options, e->max_steps, 60000};
    arl_env_result res;
    memset(&res, 0, sizeof res);
    s = ops->reset(e->inst, &req, &e->state, &res);
    json_decref(empty);
    if (s == ARL_OK && record) {
        e->messages = json_array();
        s = e->messages ? arl_env_obs_to_openai(&res.obs, e->messages) : nomem();
    }
    arl_env_result_clear(&res);
    if (s != ARL_OK) episode_close(e);
    return s;
}

/* Apply action a as the next step; records the assistant message and the observation. */
static arl_status episode_step(episode *e, const arl_env_action *a) {
    if (e->ended) return arl_errorf(ARL_ERR_STATE, "teacher: the episode has ended");
    if (e->messages) {
        json_t *m = arl_env_action_to_openai(a);
        if (!m || json_array_append_new(e->messages, m)) return nomem();
    }
    arl_env_step_req req = {e->steps + 1, a, e->max_steps, 60000};
    arl_env_result res;
    memset(&res, 0, sizeof res);
    arl_status s = e->b->def->ops->step(e->inst, e->state, &req, &res);
    if (s == ARL_OK) {
        e->steps++;
        e->terminated = res.terminated;
        e->ended = res.terminated || res.truncated || e->steps >= e->max_steps;
        if (e->messages) {
            if (res.obs.context == ARL_ENV_CONTEXT_RESET) json_array_clear(e->messages);
            s = arl_env_obs_to_openai(&res.obs, e->messages);
        }
    }
    arl_env_result_clear(&res);
    return s;
}

static arl_status episode_outcome(episode *e, double *outcome) {
    arl_env_score_req req;
    memset(&req, 0, sizeof req);
    req.scope = ARL_ENV_SCOPE_EPISODE;
    req.reason = e->terminated ? ARL_ENV_REASON_TERMINATED : ARL_ENV_REASON_TRUNCATED;
    req.last_step = e->steps;
    req.status = e->terminated ? ARL_ENV_STATUS_TERMINATED : ARL_ENV_STATUS_TRUNCATED;
    req.deadline_ms = 60000;
    arl_env_score_result r;
    memset(&r, 0, sizeof r);
    arl_status s = e->b->def->ops->score(e->inst, e->state, &req, &r);
    *outcome = s == ARL_OK && r.scorable ? r.reward : 0;
    arl_env_score_result_clear(&r);
    return s;
}

arl_status arl_env_demo_episode(const char *env_name, const arl_env_task *task,
                                const json_t *options, json_t **conversation, double *outcome) {
    *conversation = NULL;
    *outcome = 0;
    episode e;
    ARL_TRY(episode_open(&e, env_name, task, options, 1));
    arl_status s = ARL_OK;
    while (s == ARL_OK && !e.ended) {
        arl_env_action a;
        memset(&a, 0, sizeof a);
        s = e.b->teacher(e.inst, e.state, e.steps + 1, &a);
        if (s == ARL_OK) s = episode_step(&e, &a);
        arl_env_action_clear(&a);
    }
    if (s == ARL_OK) s = episode_outcome(&e, outcome);
    if (s == ARL_OK) {
        json_t *tools = arl_json_loads(e.b->def->info_json, 0, NULL);
        json_t *data = task->data ? json_incref((json_t *)task->data) : json_object();
        json_t *opts = options ? json_incref((json_t *)options) : json_object();
        json_t *meta =
            json_pack("{s:s, s:{s:s, s:I, s:o}, s:o, s:I, s:f}", "env", e.b->def->name, "task",
                      "id", task->id ? task->id : "", "seed", (json_int_t)task->seed, "data", data,
                      "options", opts, "steps", (json_int_t)e.steps, "outcome", *outcome);
        *conversation = json_pack("{s:O, s:O, s:o}", "messages", e.messages, "tools",
                                  json_object_get(tools, "tools"), "meta", meta);
        json_decref(tools);
        if (!*conversation) s = nomem();
    }
    episode_close(&e);
    return s;
}

arl_status arl_env_demos_write(const char *env_name, int64_t n_episodes, uint64_t seed,
                               const char *options_json, FILE *out, arl_env_demos_stats *stats) {
    arl_env_demos_stats st;
    memset(&st, 0, sizeof st);
    if (!arl_builtin_find(env_name)) return no_teacher("env demos", env_name);
    json_t *options = NULL;
    if (options_json && *options_json) {
        json_error_t je;
        options = arl_json_loads(options_json, JSON_REJECT_DUPLICATES, &je);
        if (!options && arl_json_error_nomem(&je))
            return arl_errorf(ARL_ERR_NOMEM, "env demos: options: out of memory");
        if (!options || !json_is_object(options)) {
            json_decref(options);
            return arl_errorf(ARL_ERR_ARG, "env demos: options: expected a JSON object (%s)",
                              options ? "not an object" : je.text);
        }
    }
    json_t *empty = json_object();
    arl_status s = ARL_OK;
    for (int64_t i = 0; i < n_episodes && s == ARL_OK; i++) {
        char id[96];
        snprintf(id, sizeof id, "%s-%llu", env_name, (unsigned long long)(seed + (uint64_t)i));
        arl_env_task task = {id, (seed + (uint64_t)i) & (uint64_t)ARL_AEP_MAX_SAFE_INT, empty};
        json_t *conv = NULL;
        double outcome = 0;
        s = arl_env_demo_episode(env_name, &task, options, &conv, &outcome);
        if (s != ARL_OK) break;
        st.episodes++;
        st.steps += json_integer_value(json_object_get(json_object_get(conv, "meta"), "steps"));
        if (outcome >= 1.0) {
            char *line = arl_json_dumps(conv, JSON_COMPACT);
            if (!line) {
                s = nomem();
            } else {
                size_t n = strlen(line);
                /* the system's reason (the caller names the file): stdio's failed write set
                 * errno, ENOSPC or EDQUOT on a full disk */
                errno = 0;
                if (fwrite(line, 1, n, out) != n || fputc('\n', out) == EOF) {
                    const int e = errno ? errno : EIO;
                    s = arl_errorf(e == ENOSPC || e == EDQUOT ? ARL_ERR_FULL : ARL_ERR_IO,
                                   "env demos: write failed after %lld conversations: %s",
                                   (long long)st.written, strerror(e));
                }
                st.bytes += (int64_t)n + 1;
                st.written++;
                free(line);
            }
        } else {
            st.failed++;
        }
        json_decref(conv);
    }
    json_decref(empty);
    json_decref(options);
    if (stats) *stats = st;
    return s;
}

/* ---- the teacher for a conversation held elsewhere ---- */

/* Build the action of one assistant message (OpenAI or AEP form). */
static arl_status action_from_message(const json_t *m, arl_env_action *a) {
    const json_t *content = json_object_get(m, "content");
    a->content = strdup(json_is_string(content) ? json_string_value(content) : "");
    if (!a->content) return nomem();
    json_t *calls = json_object_get(m, "tool_calls");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *name = json_string_value(json_object_get(fn ? fn : c, "name"));
        json_t *args = json_object_get(fn ? fn : c, "arguments");
        char gen[32];
        if (!id) {
            snprintf(gen, sizeof gen, "call_x_%zu", i);
            id = gen;
        }
        if (json_is_string(args)) {
            char msg[512];
            json_t *parsed = NULL;
            const unsigned long n0 = arl_nomem_count();
            arl_env_parse_status ps = arl_env_tool_args_parse(
                json_string_value(args), json_string_length(args), &parsed, msg, sizeof msg);
            if (ps != ARL_ENV_PARSE_OK && arl_nomem_count() != n0)
                return arl_errorf(ARL_ERR_NOMEM, "teacher: out of memory parsing arguments");
            if (ps == ARL_ENV_PARSE_OK && name) {
                ARL_TRY(arl_env_action_add_call(a, id, name, parsed));
            } else {
                json_decref(parsed);
                ARL_TRY(arl_env_action_add_parse_error(
                    a, id, name ? ps : ARL_ENV_PARSE_MISSING_NAME, msg, json_string_value(args)));
            }
        } else if (json_is_object(args) && name) {
            ARL_TRY(arl_env_action_add_call(a, id, name, json_incref(args)));
        } else {
            ARL_TRY(arl_env_action_add_parse_error(
                a, id, name ? ARL_ENV_PARSE_ARGUMENTS_NOT_OBJECT : ARL_ENV_PARSE_MISSING_NAME,
                "arguments are not an object", ""));
        }
    }
    arl_env_action_set_parse_status(a);
    a->finish_reason = a->n_tool_calls ? ARL_ENV_FINISH_TOOL_CALLS : ARL_ENV_FINISH_STOP;
    return ARL_OK;
}

arl_status arl_env_teacher_act(const char *env_name, const arl_env_task *task,
                               const json_t *options, const json_t *history, arl_env_action *out) {
    if (history && !json_is_array(history))
        return arl_errorf(ARL_ERR_ARG, "teacher: history: expected an array of messages");
    episode e;
    ARL_TRY(episode_open(&e, env_name, task, options, 0));
    arl_status s = ARL_OK;
    size_t i;
    json_t *m;
    json_array_foreach(history, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant")) continue;
        arl_env_action a;
        memset(&a, 0, sizeof a);
        s = action_from_message(m, &a);
        if (s == ARL_OK) s = episode_step(&e, &a);
        arl_env_action_clear(&a);
        if (s != ARL_OK) {
            arl_error_prefix(s, "teacher: history message %zu", i);
            break;
        }
    }
    if (s == ARL_OK && e.ended) s = arl_errorf(ARL_ERR_STATE, "teacher: the episode has ended");
    if (s == ARL_OK) s = e.b->teacher(e.inst, e.state, e.steps + 1, out);
    episode_close(&e);
    return s;
}
