/* envs/test_env.c: "echo", a tiny deterministic environment compiled into envs/ for tests,
 * benchmarks and as the reference user of every capability of AEP/1 (fork, fork_past,
 * segment scores, deterministic replay, parallel calls, images, context resets).
 *
 * Tools: echo(text) returns text; image(width, height) returns a grey PNG; sleep(ms) waits (or,
 * when ms does not fit in the step's deadline, answers DEADLINE_EXCEEDED without effect);
 * reset_context() answers with a reset observation; submit(answer) ends the episode.
 * Rewards: process component tool_ok (+0.1 per successful call, -0.1 per failed call, clamped
 * to [-1, 1]); segment component progress (fraction of the segment's steps whose calls all
 * succeeded); outcome component correct (1 when the submitted answer equals task.data.answer,
 * default "42").  task.data.reject = true makes creation fail with VALIDATION_ERROR.
 * Not a built-in for training; envs/builtin/ holds those. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/json_dump.h"
#include "envs/env.h"

typedef struct echo_state {
    char expected[128];
    int submitted;
    char answer[128];
    int64_t steps;   /* last applied step */
    uint8_t *ok;     /* (cap) per step: 1 when every call of the step succeeded */
    size_t cap;
} echo_state;

/* ---- a minimal PNG writer (stored deflate blocks) ---- */

static uint32_t crc_table[256];
static int crc_ready;
static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
    crc_ready = 1;
}
static uint32_t crc32_buf(uint32_t c, const uint8_t *p, size_t n) {
    c ^= 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}
static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Grey gradient image of w x h (w, h <= 64); returns malloc'd PNG bytes. */
static uint8_t *echo_png(int w, int h, size_t *len) {
    if (!crc_ready) crc_init();
    size_t raw = (size_t)h * (size_t)(w + 1);
    size_t idat = 2 + 5 + raw + 4; /* zlib header, one stored block, adler32 (raw < 65536) */
    size_t n = 8 + (12 + 13) + (12 + idat) + 12;
    uint8_t *p = malloc(n);
    if (!p) return NULL;
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    memcpy(p, sig, 8);
    uint8_t *q = p + 8;
    put32(q, 13);
    memcpy(q + 4, "IHDR", 4);
    put32(q + 8, (uint32_t)w);
    put32(q + 12, (uint32_t)h);
    q[16] = 8; /* bit depth */
    q[17] = 0; /* greyscale */
    q[18] = q[19] = q[20] = 0;
    put32(q + 21, crc32_buf(0, q + 4, 17));
    q += 25;
    put32(q, (uint32_t)idat);
    memcpy(q + 4, "IDAT", 4);
    uint8_t *z = q + 8;
    z[0] = 0x78;
    z[1] = 0x01;
    z[2] = 1; /* final, stored */
    z[3] = (uint8_t)(raw & 0xff);
    z[4] = (uint8_t)(raw >> 8);
    z[5] = (uint8_t)(~raw & 0xff);
    z[6] = (uint8_t)((~raw >> 8) & 0xff);
    uint8_t *d = z + 7;
    uint32_t a = 1, b = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x <= w; x++) {
            uint8_t v = x == 0 ? 0 : (uint8_t)((x * 255) / (w > 1 ? w : 1) ^ (y * 7));
            *d++ = v;
            a = (a + v) % 65521;
            b = (b + a) % 65521;
        }
    put32(d, b << 16 | a);
    put32(q + 8 + idat, crc32_buf(0, q + 4, 4 + idat));
    q += 12 + idat;
    put32(q, 0);
    memcpy(q + 4, "IEND", 4);
    put32(q + 8, crc32_buf(0, q + 4, 4));
    *len = n;
    return p;
}

/* ---- callbacks ---- */

static arl_status echo_reset(void *inst, const arl_env_reset_req *req, void **state, arl_env_result *out) {
    (void)inst;
    const json_t *rej = json_object_get(req->task.data, "reject");
    if (json_is_true(rej)) return arl_errorf(ARL_ERR_ARG, "/task/data/reject: this task cannot be used");
    const json_t *ans = json_object_get(req->task.data, "answer");
    if (ans && !json_is_null(ans) && (!json_is_string(ans) || json_string_length(ans) >= 128))
        return arl_errorf(ARL_ERR_ARG, "/task/data/answer: expected a string shorter than 128 bytes");
    echo_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
    snprintf(s->expected, sizeof s->expected, "%s", json_is_string(ans) ? json_string_value(ans) : "42");
    *state = s;
    char user[400];
    snprintf(user, sizeof user, "Task %.200s (seed %llu): call echo with any text, then submit the answer.",
             req->task.id, (unsigned long long)req->task.seed);
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM, "You are a test agent. Use the tools."));
    ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, user));
    out->info = json_pack("{s:s}", "anchor", "echo:initial");
    return ARL_OK;
}

static int grow_ok(echo_state *s, int64_t k) {
    if ((size_t)k < s->cap) return 0;
    size_t cap = s->cap ? s->cap : 16;
    while (cap <= (size_t)k) cap *= 2;
    uint8_t *p = realloc(s->ok, cap);
    if (!p) return -1;
    memset(p + s->cap, 0, cap - s->cap);
    s->ok = p;
    s->cap = cap;
    return 0;
}

static arl_status echo_step(void *inst, void *state, const arl_env_step_req *req, arl_env_result *out) {
    (void)inst;
    echo_state *s = state;
    const arl_env_action *a = req->action;
    /* validation pass first: a sleep that cannot fit answers DEADLINE_EXCEEDED with no effect */
    for (int32_t i = 0; i < a->n_tool_calls; i++) {
        const arl_env_tool_call *c = &a->tool_calls[i];
        const json_t *ms = json_object_get(c->arguments, "ms");
        if (!strcmp(c->name, "sleep") && json_is_integer(ms) && json_integer_value(ms) >= 0 &&
            json_integer_value(ms) + 200 > req->deadline_ms)
            return arl_errorf(ARL_ERR_TIMEOUT, "sleep(%lld) does not fit in deadline_ms %lld",
                              (long long)json_integer_value(ms), (long long)req->deadline_ms);
    }
    if (grow_ok(s, req->step_index)) return arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
    static const char *const tools_json =
        "[{\"type\":\"function\",\"function\":{\"name\":\"echo\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"text\":{\"type\":\"string\"}},\"required\":[\"text\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"image\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"width\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":64},"
        "\"height\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":64}},\"required\":[\"width\",\"height\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"sleep\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"ms\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":60000}},\"required\":[\"ms\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"reset_context\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"submit\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"answer\":{\"type\":\"string\"}},\"required\":[\"answer\"]}}}]";
    json_t *tools = arl_json_loads(tools_json, 0, NULL);
    if (!tools) return arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
    double pr = 0;
    int all_ok = a->n_parse_errors == 0 && a->n_tool_calls > 0;
    int want_reset = 0, terminated = 0;
    arl_status st = ARL_OK;
    out->obs.context = ARL_ENV_CONTEXT_APPEND;
    for (int32_t i = 0; i < a->n_tool_calls && st == ARL_OK; i++) {
        const arl_env_tool_call *c = &a->tool_calls[i];
        const json_t *schema = arl_env_tools_find(tools, c->name);
        char msg[600];
        if (!schema) {
            snprintf(msg, sizeof msg, "Unknown tool '%.100s'.", c->name);
            st = arl_env_obs_add_tool(&out->obs, c->id, msg, ARL_ENV_TOOL_NOT_FOUND);
            pr -= 0.1;
            all_ok = 0;
            continue;
        }
        char why[300];
        if (!arl_env_args_validate(schema, c->arguments, why, sizeof why)) {
            snprintf(msg, sizeof msg, "Invalid arguments for %s: %s", c->name, why);
            st = arl_env_obs_add_tool(&out->obs, c->id, msg, ARL_ENV_TOOL_ARGS_INVALID);
            pr -= 0.1;
            all_ok = 0;
            continue;
        }
        pr += 0.1;
        if (!strcmp(c->name, "echo")) {
            st = arl_env_obs_add_tool(&out->obs, c->id, json_string_value(json_object_get(c->arguments, "text")), NULL);
        } else if (!strcmp(c->name, "image")) {
            int w = (int)json_integer_value(json_object_get(c->arguments, "width"));
            int h = (int)json_integer_value(json_object_get(c->arguments, "height"));
            size_t len = 0;
            uint8_t *png = echo_png(w, h, &len);
            snprintf(msg, sizeof msg, "image %dx%d", w, h);
            st = png ? arl_env_obs_add_tool(&out->obs, c->id, msg, NULL) : arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
            if (st == ARL_OK) st = arl_env_obs_add_image(&out->obs, png, len);
            free(png);
        } else if (!strcmp(c->name, "sleep")) {
            int64_t ms = json_integer_value(json_object_get(c->arguments, "ms"));
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts)) {
            }
            snprintf(msg, sizeof msg, "slept %lld ms", (long long)ms);
            st = arl_env_obs_add_tool(&out->obs, c->id, msg, NULL);
        } else if (!strcmp(c->name, "reset_context")) {
            want_reset = 1;
            st = arl_env_obs_add_tool(&out->obs, c->id, "context will be reset", NULL);
        } else { /* submit */
            snprintf(s->answer, sizeof s->answer, "%s", json_string_value(json_object_get(c->arguments, "answer")));
            s->submitted = 1;
            terminated = 1;
            st = arl_env_obs_add_tool(&out->obs, c->id, "Answer recorded.", NULL);
        }
    }
    json_decref(tools);
    if (st == ARL_OK) st = arl_env_obs_answer_parse_errors(&out->obs, a);
    pr -= 0.1 * a->n_parse_errors;
    if (st == ARL_OK && a->n_tool_calls == 0 && a->n_parse_errors == 0 && !terminated)
        st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, "Please call a tool.");
    if (st != ARL_OK) return st;
    if (want_reset && !terminated) {
        /* a reset observation replaces the context (the calls just made need no answer) */
        arl_env_observation_clear(&out->obs);
        out->obs.context = ARL_ENV_CONTEXT_RESET;
        char user[200];
        snprintf(user, sizeof user, "The context was reset at step %lld. Submit the answer.",
                 (long long)req->step_index);
        ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM, "You are a test agent. Use the tools."));
        ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, user));
    }
    if (pr > 1) pr = 1;
    if (pr < -1) pr = -1;
    pr = round(pr * 10) / 10; /* exact tenths: deterministic text */
    out->reward = pr;
    ARL_TRY(arl_env_result_component(out, "tool_ok", pr));
    out->terminated = terminated;
    s->ok[req->step_index] = (uint8_t)all_ok;
    s->steps = req->step_index;
    char anchor[64];
    snprintf(anchor, sizeof anchor, "echo:step=%lld", (long long)req->step_index);
    out->info = json_pack("{s:s}", "anchor", anchor);
    return ARL_OK;
}

static arl_status echo_score(void *inst, void *state, const arl_env_score_req *req, arl_env_score_result *out) {
    (void)inst;
    echo_state *s = state;
    if (req->scope == ARL_ENV_SCOPE_SEGMENT) {
        int64_t n = req->last - req->first + 1, good = 0;
        for (int64_t k = req->first; k <= req->last; k++)
            if ((size_t)k < s->cap && s->ok[k]) good++;
        out->scorable = 1;
        out->reward = (double)good / (double)n;
        return arl_env_score_component(out, "progress", out->reward);
    }
    out->scorable = 1;
    out->reward = s->submitted && !strcmp(s->answer, s->expected) ? 1.0 : 0.0;
    out->info = json_pack("{s:s}", "expected", s->expected);
    return arl_env_score_component(out, "correct", out->reward);
}

static arl_status echo_fork(void *inst, const void *state, void **child) {
    (void)inst;
    const echo_state *s = state;
    echo_state *c = malloc(sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
    *c = *s;
    c->ok = NULL;
    if (s->cap) {
        c->ok = malloc(s->cap);
        if (!c->ok) {
            free(c);
            return arl_errorf(ARL_ERR_NOMEM, "echo: out of memory");
        }
        memcpy(c->ok, s->ok, s->cap);
    }
    *child = c;
    return ARL_OK;
}

static void echo_free(void *inst, void *state) {
    (void)inst;
    echo_state *s = state;
    if (!s) return;
    free(s->ok);
    free(s);
}

static json_t *echo_debug(void *inst, const void *state) {
    (void)inst;
    const echo_state *s = state;
    return json_pack("{s:I,s:b}", "steps", (json_int_t)s->steps, "submitted", s->submitted);
}

static const arl_env_ops echo_ops = {
    .thread_safety = 1,
    .reset = echo_reset,
    .step = echo_step,
    .score = echo_score,
    .fork = echo_fork,
    .free_state = echo_free,
    .debug_state = echo_debug,
};

const arl_env_def arl_env_echo = {
    .name = "echo",
    .version = "1.0.0",
    .description = "Test environment: echo text, images, sleeps, context resets, submit an answer.",
    .info_json =
        "{\"tools\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"echo\",\"description\":\"Return the given text.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},"
        "\"required\":[\"text\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"image\",\"description\":\"Return a grey test image.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"width\":{\"type\":\"integer\",\"minimum\":1,"
        "\"maximum\":64},\"height\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":64}},"
        "\"required\":[\"width\",\"height\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"sleep\",\"description\":\"Wait ms milliseconds.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"ms\":{\"type\":\"integer\",\"minimum\":0,"
        "\"maximum\":60000}},\"required\":[\"ms\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"reset_context\",\"description\":\"Start a fresh "
        "context.\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"submit\",\"description\":\"Submit the final answer.\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"}},"
        "\"required\":[\"answer\"]}}}],"
        "\"reward_levels\":{\"process\":{\"range\":[-1,1]},\"segment\":{\"range\":[0,1]},"
        "\"outcome\":{\"range\":[0,1]}},"
        "\"reward_components\":[{\"name\":\"tool_ok\",\"level\":\"process\",\"range\":[-1,1]},"
        "{\"name\":\"progress\",\"level\":\"segment\",\"range\":[0,1]},"
        "{\"name\":\"correct\",\"level\":\"outcome\",\"range\":[0,1]}],"
        "\"capabilities\":{\"fork\":true,\"fork_past\":true,\"segment_score\":true,"
        "\"deterministic_replay\":true,\"parallel_tool_calls\":true,\"multimodal\":true,"
        "\"context_reset\":true},"
        "\"limits\":{\"max_sessions\":64,\"max_steps\":100000}}",
    .ops = &echo_ops,
};

const arl_env_def *const arl_env_core_defs[] = {&arl_env_echo, NULL};
