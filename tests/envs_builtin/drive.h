/* tests/envs_builtin/drive.h: a small in-process driver for the built-in environments'
 * callbacks (reset, step, score, fork) used by the tests of tests/envs_builtin/, plus action
 * builders from compact JSON text.  It applies the host's max_steps truncation itself. */
#ifndef ARL_TESTS_ENVS_BUILTIN_DRIVE_H
#define ARL_TESTS_ENVS_BUILTIN_DRIVE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/builtin.h"
#include "envs/env.h"
#include "tests/test.h"

typedef struct drv {
    const arl_builtin *b;
    void *inst;
    void *state;
    int64_t steps, max_steps;
    int ended, terminated;
    arl_env_result last; /* result of the last reset/step */
} drv;

/* Open env `name` for (seed, data JSON or NULL, options JSON or NULL).  Returns the status of
 * reset. */
static inline arl_status drv_open(drv *d, const char *name, uint64_t seed, const char *data,
                                  const char *options) {
    memset(d, 0, sizeof *d);
    d->b = arl_builtin_find(name);
    if (!d->b) return ARL_ERR_NOT_FOUND;
    json_t *cfg = json_object();
    arl_status s = d->b->def->ops->instance_create(cfg, &d->inst);
    json_decref(cfg);
    if (s != ARL_OK) return s;
    json_t *dj = data ? json_loads(data, 0, NULL) : json_object();
    json_t *oj = options ? json_loads(options, 0, NULL) : NULL;
    json_t *info = json_loads(d->b->def->info_json, 0, NULL);
    d->max_steps =
        json_integer_value(json_object_get(json_object_get(info, "limits"), "max_steps"));
    json_decref(info);
    json_t *ms = oj ? json_object_get(oj, "max_steps") : NULL;
    if (ms) d->max_steps = json_integer_value(ms);
    arl_env_task task = {"t", seed, dj};
    arl_env_reset_req req = {"traj", "grp", task, oj, d->max_steps, 60000};
    s = d->b->def->ops->reset(d->inst, &req, &d->state, &d->last);
    json_decref(dj);
    json_decref(oj);
    return s;
}

static inline void drv_close(drv *d) {
    if (d->state) d->b->def->ops->free_state(d->inst, d->state);
    if (d->inst) d->b->def->ops->instance_destroy(d->inst);
    arl_env_result_clear(&d->last);
    memset(d, 0, sizeof *d);
}

/* Fork d into c (same instance; c does not own the instance). */
static inline arl_status drv_fork(drv *d, drv *c) {
    *c = *d;
    memset(&c->last, 0, sizeof c->last);
    return d->b->def->ops->fork(d->inst, d->state, &c->state);
}

static inline void drv_close_fork(drv *c) {
    if (c->state) c->b->def->ops->free_state(c->inst, c->state);
    arl_env_result_clear(&c->last);
    memset(c, 0, sizeof *c);
}

/* Build an action from wire JSON text: {"content", "tool_calls": [{"id", "name",
 * "arguments"}], "parse_errors": [{"id", "status"}], "finish_reason"}. */
static inline void drv_action(arl_env_action *a, const char *text) {
    memset(a, 0, sizeof *a);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) {
        fprintf(stderr, "drv_action: bad JSON: %s: %s\n", text, je.text);
        exit(2);
    }
    const char *content = json_string_value(json_object_get(j, "content"));
    a->content = strdup(content ? content : "");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "tool_calls"), i, c) {
        arl_env_action_add_call(a, json_string_value(json_object_get(c, "id")),
                                json_string_value(json_object_get(c, "name")),
                                json_incref(json_object_get(c, "arguments")));
    }
    json_array_foreach(json_object_get(j, "parse_errors"), i, c) {
        arl_env_action_add_parse_error(a, json_string_value(json_object_get(c, "id")),
                                       (arl_env_parse_status)arl_env_parse_status_parse(
                                           json_string_value(json_object_get(c, "status"))),
                                       "test", "raw");
    }
    arl_env_action_set_parse_status(a);
    const char *fr = json_string_value(json_object_get(j, "finish_reason"));
    a->finish_reason = fr                ? (arl_env_finish_reason)arl_env_finish_reason_parse(fr)
                       : a->n_tool_calls ? ARL_ENV_FINISH_TOOL_CALLS
                                         : ARL_ENV_FINISH_STOP;
    json_decref(j);
}

/* Apply an action; the result is in d->last. */
static inline arl_status drv_step(drv *d, const arl_env_action *a) {
    arl_env_result_clear(&d->last);
    arl_env_step_req req = {d->steps + 1, a, d->max_steps, 60000};
    arl_status s = d->b->def->ops->step(d->inst, d->state, &req, &d->last);
    if (s == ARL_OK) {
        d->steps++;
        d->terminated = d->last.terminated;
        d->ended = d->last.terminated || d->last.truncated || d->steps >= d->max_steps;
    }
    return s;
}

static inline arl_status drv_step_json(drv *d, const char *text) {
    arl_env_action a;
    drv_action(&a, text);
    arl_status s = drv_step(d, &a);
    arl_env_action_clear(&a);
    return s;
}

/* One teacher step. */
static inline arl_status drv_teacher_step(drv *d) {
    arl_env_action a;
    memset(&a, 0, sizeof a);
    arl_status s = d->b->teacher(d->inst, d->state, d->steps + 1, &a);
    if (s == ARL_OK) s = drv_step(d, &a);
    arl_env_action_clear(&a);
    return s;
}

/* Episode score (reward, or -1 when not scorable). */
static inline double drv_outcome(drv *d) {
    arl_env_score_req req;
    memset(&req, 0, sizeof req);
    req.scope = ARL_ENV_SCOPE_EPISODE;
    req.reason = d->terminated ? ARL_ENV_REASON_TERMINATED : ARL_ENV_REASON_TRUNCATED;
    req.last_step = d->steps;
    arl_env_score_result r;
    memset(&r, 0, sizeof r);
    arl_status s = d->b->def->ops->score(d->inst, d->state, &req, &r);
    double v = s == ARL_OK && r.scorable ? r.reward : -1;
    arl_env_score_result_clear(&r);
    return v;
}

static inline double drv_segment(drv *d, int64_t first, int64_t last) {
    arl_env_score_req req;
    memset(&req, 0, sizeof req);
    req.scope = ARL_ENV_SCOPE_SEGMENT;
    req.first = first;
    req.last = last;
    req.last_step = d->steps;
    arl_env_score_result r;
    memset(&r, 0, sizeof r);
    arl_status s = d->b->def->ops->score(d->inst, d->state, &req, &r);
    double v = s == ARL_OK && r.scorable ? r.reward : -99;
    arl_env_score_result_clear(&r);
    return v;
}

/* Text of message i of the last observation ("" for parts; NULL past the end). */
static inline const char *drv_text(const drv *d, int i) {
    if (i >= d->last.obs.n_messages) return NULL;
    const arl_env_message *m = &d->last.obs.messages[i];
    if (m->content_is_parts)
        return m->n_parts && m->parts[0].type == ARL_ENV_PART_TEXT ? m->parts[0].text : "";
    return m->content ? m->content : "";
}

static inline const char *drv_code(const drv *d, int i) {
    if (i >= d->last.obs.n_messages) return NULL;
    const arl_env_message *m = &d->last.obs.messages[i];
    return m->is_error ? m->error_code : "";
}

static inline double drv_component(const drv *d, const char *name) {
    for (int32_t i = 0; i < d->last.n_components; i++)
        if (!strcmp(d->last.components[i].name, name)) return d->last.components[i].value;
    return -99;
}

/* A serialisation of the last observation, reward and flags (for determinism checks);
 * caller frees. */
static inline char *drv_last_dump(const drv *d) {
    json_t *o = json_array();
    for (int32_t i = 0; i < d->last.obs.n_messages; i++) {
        const arl_env_message *m = &d->last.obs.messages[i];
        json_t *parts = json_array();
        for (int32_t k = 0; k < m->n_parts; k++) {
            const arl_env_part *p = &m->parts[k];
            if (p->type == ARL_ENV_PART_TEXT) {
                json_array_append_new(parts, json_string(p->text));
            } else {
                char h[32];
                snprintf(h, sizeof h, "png:%zu:%016llx", p->image.png_len,
                         (unsigned long long)arl_bi_hash(p->image.png, p->image.png_len, 0));
                json_array_append_new(parts, json_string(h));
            }
        }
        json_array_append_new(o, json_pack("{s:i, s:s?, s:o, s:s?, s:b, s:s?}", "role", m->role,
                                           "content", m->content, "parts", parts, "id",
                                           m->tool_call_id, "err", m->is_error, "code",
                                           m->error_code));
    }
    json_t *comps = json_object();
    for (int32_t i = 0; i < d->last.n_components; i++)
        json_object_set_new(comps, d->last.components[i].name,
                            json_real(d->last.components[i].value));
    json_t *all = json_pack("{s:o, s:f, s:o, s:b, s:b, s:O?}", "msgs", o, "reward", d->last.reward,
                            "comps", comps, "term", d->last.terminated, "trunc", d->last.truncated,
                            "info", d->last.info);
    char *s = json_dumps(all, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(all);
    return s;
}

/* Run the teacher to the end; returns the outcome (or -1) and optionally a transcript of every
 * observation (concatenated dumps; caller frees). */
static inline double drv_teacher_episode(const char *name, uint64_t seed, const char *data,
                                         const char *options, char **transcript, int64_t *steps) {
    drv d;
    if (drv_open(&d, name, seed, data, options) != ARL_OK) {
        fprintf(stderr, "%s seed %llu: reset failed: %s\n", name, (unsigned long long)seed,
                arl_error_msg());
        drv_close(&d);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *t = transcript ? malloc(cap) : NULL;
    if (t) t[0] = 0;
    for (;;) {
        char *s = drv_last_dump(&d);
        size_t n = strlen(s);
        if (t) {
            while (len + n + 2 > cap)
                t = realloc(t, cap *= 2);
            memcpy(t + len, s, n + 1);
            len += n;
            t[len++] = '\n';
            t[len] = 0;
        }
        free(s);
        if (d.ended) break;
        if (drv_teacher_step(&d) != ARL_OK) {
            fprintf(stderr, "%s seed %llu: teacher step failed: %s\n", name,
                    (unsigned long long)seed, arl_error_msg());
            break;
        }
    }
    double out = drv_outcome(&d);
    if (steps) *steps = d.steps;
    drv_close(&d);
    if (transcript) *transcript = t;
    return out;
}

#endif
