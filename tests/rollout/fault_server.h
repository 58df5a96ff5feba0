/* tests/rollout/fault_server.h: a small AEP/1 environment on loopback that misbehaves on
 * purpose (header-only test helper), a handler of tests/envs_aep/loopback_server.h.
 *
 * It is a complete toy environment - no tools, a user message per step, terminated after step
 * 3, segment and episode scores - whose every session follows the scenario named by its task id
 * (the rollout's task-file chooses one task per scenario).  Each scenario fails one endpoint in
 * one way of spec/aep.md 8.3-8.5 and 12: an error status with its envelope (optionally only the
 * first n attempts, to exercise retries), a body that is not JSON, a 5xx without an envelope, an
 * out-of-range reward, an oversized body, an observation too long for the client's token cap,
 * or a connection closed without an answer.  Sessions answer every tool call and parse error
 * of an action (spec/aep.md 4.3), so any sampled turn is a valid action. */
#ifndef ARL_TESTS_ROLLOUT_FAULT_SERVER_H
#define ARL_TESTS_ROLLOUT_FAULT_SERVER_H

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/envs_aep/loopback_server.h"

/* What a scenario does: on `ep` ("create", "step", "score_segment", "score_episode") at step
 * `step` (steps only; 0 = any), the first `times` attempts (0 = all) get `how`. */
typedef struct fsrv_scenario {
    const char *name;
    const char *ep;
    int step;
    int times;
    const char *how; /* "E:<status>:<CODE>:<retryable>:<attribution>", "malformed", "html500",
                        "reward5", "huge", "longobs", "close", "component" */
} fsrv_scenario;

static const fsrv_scenario fsrv_scenarios[] = {
    {"ok", "", 0, 0, ""},
    {"capacity_create", "create", 0, 2, "E:503:CAPACITY_REACHED:1:env"},
    {"draining_create", "create", 0, 1, "E:503:DRAINING:1:env"},
    {"in_progress_step", "step", 1, 1, "E:409:STEP_IN_PROGRESS:1:none"},
    {"deadline_once", "step", 2, 1, "E:504:DEADLINE_EXCEEDED:1:env"},
    {"deadline_twice", "step", 2, 0, "E:504:DEADLINE_EXCEEDED:1:env"},
    {"internal_step", "step", 2, 0, "E:500:ENV_INTERNAL:0:env"},
    {"sandbox_step", "step", 1, 0, "E:502:SANDBOX_LOST:0:infra"},
    {"closed_step", "step", 1, 0, "E:410:SESSION_CLOSED:0:env"},
    {"unknown_step", "step", 1, 0, "E:404:UNKNOWN_SESSION:0:env"},
    {"validation_step", "step", 1, 0, "E:422:VALIDATION_ERROR:0:client"},
    {"conflict_step", "step", 1, 0, "E:409:STEP_CONFLICT:0:client"},
    {"ended_step", "step", 2, 0, "E:409:EPISODE_ENDED:0:client"},
    {"invalid_create", "create", 0, 0, "E:400:INVALID_REQUEST:0:client"},
    {"trajconflict_create", "create", 0, 0, "E:409:TRAJECTORY_CONFLICT:0:client"},
    {"payload_step", "step", 1, 0, "E:413:PAYLOAD_TOO_LARGE:0:client"},
    {"scoreconflict_episode", "score_episode", 0, 0, "E:409:SCORE_CONFLICT:0:client"},
    {"internal_segment", "score_segment", 0, 0, "E:500:ENV_INTERNAL:0:env"},
    {"notimpl_segment", "score_segment", 0, 0, "E:501:NOT_IMPLEMENTED:0:none"},
    {"xcode_step", "step", 1, 0, "E:500:X_CUSTOM_FAILURE:0:env"},
    {"malformed_step", "step", 1, 0, "malformed"},
    {"html500_step", "step", 1, 0, "html500"},
    {"reward_step", "step", 1, 0, "reward5"},
    {"huge_step", "step", 1, 0, "huge"},
    {"longobs_step", "step", 1, 0, "longobs"},
    {"transport_step", "step", 1, 0, "close"},
    {"undeclared_step", "step", 1, 0, "component"}, /* a reward component /info does not declare */
};
#define FSRV_N_SCENARIOS (sizeof fsrv_scenarios / sizeof fsrv_scenarios[0])

#define FSRV_MAX_SESSIONS 256
typedef struct fsrv_session {
    char sid[32], traj[300];
    const fsrv_scenario *sc;
    int last_step;
    int ended;
    char *create_body;  /* the 201 body, replayed on a repeat */
    char *last_resp;    /* body of the last applied step */
    int attempts[8][8]; /* [endpoint][step] attempts seen */
} fsrv_session;

static struct {
    lsrv srv;
    pthread_mutex_t mu;
    fsrv_session s[FSRV_MAX_SESSIONS];
    int n;
    int create_attempts[FSRV_N_SCENARIOS * 4]; /* per (scenario, slot) key: approximate */
} fsrv;

static const char *FSRV_INFO =
    "{\"protocol\":\"aep/1\",\"protocol_revision\":0,\"env\":{\"name\":\"faulty\",\"version\":"
    "\"0.1.0\"},\"tools\":[],\"reward_levels\":{\"process\":{\"range\":[-1,1]},\"segment\":"
    "{\"range\":[0,1]},\"outcome\":{\"range\":[0,1]}},\"reward_components\":[],\"capabilities\":"
    "{\"segment_score\":true},\"limits\":{\"max_sessions\":256}}";

static const char *FSRV_JS = "application/json; charset=utf-8";

static int fsrv_json(int fd, int status, const char *body) {
    return lsrv_send(fd, status, FSRV_JS, NULL, body, strlen(body));
}

/* Apply the scenario's failure if it applies to this attempt: 1 = answered (or closed). */
static int fsrv_fault(int fd, fsrv_session *s, const fsrv_scenario *sc, const char *ep, int step,
                      int attempt, int *close_conn) {
    if (!sc || strcmp(sc->ep, ep) || (sc->step && sc->step != step)) return 0;
    if (sc->times && attempt > sc->times) return 0;
    (void)s;
    const char *h = sc->how;
    if (!strncmp(h, "E:", 2)) {
        int status = 0, retry = 0;
        char code[64] = "", attr[16] = "";
        sscanf(h, "E:%d:%63[^:]:%d:%15s", &status, code, &retry, attr);
        char b[512];
        snprintf(b, sizeof b,
                 "{\"error\":{\"code\":\"%s\",\"message\":\"injected\",\"retryable\":%s,%s"
                 "\"attribution\":\"%s\",\"details\":{}}}",
                 code, retry ? "true" : "false", retry ? "\"retry_after_ms\":5," : "", attr);
        fsrv_json(fd, status, b);
        return 1;
    }
    if (!strcmp(h, "malformed")) {
        fsrv_json(fd, 200, "{\"step_index\": 1, \"observation\": ");
        return 1;
    }
    if (!strcmp(h, "html500")) {
        lsrv_send(fd, 500, "text/html", NULL, "<h1>oops</h1>", 13);
        return 1;
    }
    if (!strcmp(h, "close")) {
        *close_conn = 1;
        return 1;
    }
    return 0; /* reward5, huge, longobs, component: shape the success body */
}

static char *fsrv_step_body(const fsrv_session *s, int k, json_t *action) {
    const char *how = s->sc && s->sc->step == k && !strcmp(s->sc->ep, "step") ? s->sc->how : "";
    json_t *msgs = json_array();
    json_t *calls = json_object_get(action, "tool_calls"), *perr = json_object_get(action, "parse_errors");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
        json_array_append_new(msgs, json_pack("{s:s,s:O,s:s,s:b,s:s}", "role", "tool", "tool_call_id",
                                              json_object_get(c, "id"), "content", "no such tool",
                                              "is_error", 1, "error_code", "TOOL_NOT_FOUND"));
    json_array_foreach(perr, i, c)
        json_array_append_new(msgs, json_pack("{s:s,s:O,s:s,s:b,s:s}", "role", "tool", "tool_call_id",
                                              json_object_get(c, "id"), "content", "parse error",
                                              "is_error", 1, "error_code", "TOOL_PARSE_ERROR"));
    int term = k >= 3;
    if (!strcmp(how, "longobs")) {
        char *big = malloc(3001);
        memset(big, 'x', 3000);
        big[3000] = 0;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", big));
        free(big);
    } else if (!term) {
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "go on"));
    }
    json_t *comps = !strcmp(how, "component") ? json_pack("{s:f}", "mystery", 0.5) : json_object();
    json_t *o = json_pack("{s:i,s:{s:s,s:o},s:f,s:o,s:b,s:b,s:{}}", "step_index", k, "observation",
                          "context", "append", "messages", msgs, "reward",
                          !strcmp(how, "reward5") ? 5.0 : 0.25, "reward_components", comps,
                          "terminated", term, "truncated", 0, "info");
    char *b = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!strcmp(how, "huge")) { /* 17 MiB: over the client's 16 MiB response cap */
        size_t n = strlen(b), big = ((size_t)17 << 20);
        char *h = malloc(big + 1);
        memset(h, ' ', big);
        memcpy(h, b, n);
        h[big] = 0;
        free(b);
        b = h;
    }
    return b;
}

/* The lsrv handler: answers one request; nonzero closes the connection without an answer. */
static int fsrv_handle(int fd, const lsrv_request *rq) {
    const char *method = rq->method, *path = rq->path;
    if (strncmp(path, "/aep/v1/", 8)) {
        fsrv_json(fd, 404, "{}");
        return 0;
    }
    const char *rest = path + 8;
    if (!strcmp(rest, "info")) {
        fsrv_json(fd, 200, FSRV_INFO);
        return 0;
    }
    if (!strcmp(method, "DELETE")) {
        lsrv_send(fd, 204, NULL, NULL, NULL, 0);
        return 0;
    }
    int close_conn = 0;
    json_t *req = rq->len ? json_loadb(rq->body, rq->len, 0, NULL) : NULL;
    pthread_mutex_lock(&fsrv.mu);
    if (!strcmp(rest, "sessions") && !strcmp(method, "POST")) {
        const char *traj = json_string_value(json_object_get(req, "trajectory_id"));
        const char *task = json_string_value(json_object_get(json_object_get(req, "task"), "id"));
        fsrv_session *s = NULL;
        for (int i = 0; i < fsrv.n; i++)
            if (traj && !strcmp(fsrv.s[i].traj, traj)) s = &fsrv.s[i];
        const fsrv_scenario *sc = NULL;
        for (size_t i = 0; task && i < FSRV_N_SCENARIOS; i++)
            if (!strcmp(fsrv_scenarios[i].name, task)) sc = &fsrv_scenarios[i];
        if (!s && fsrv.n < FSRV_MAX_SESSIONS) {
            s = &fsrv.s[fsrv.n];
            memset(s, 0, sizeof *s);
            snprintf(s->sid, sizeof s->sid, "s%d", fsrv.n);
            snprintf(s->traj, sizeof s->traj, "%s", traj ? traj : "");
            s->sc = sc;
            fsrv.n++;
        }
        int att = ++s->attempts[0][0];
        if (fsrv_fault(fd, s, sc, "create", 0, att, &close_conn)) goto out;
        if (!s->create_body) {
            char b[600];
            snprintf(b, sizeof b,
                     "{\"session_id\":\"%s\",\"trajectory_id\":\"%s\",\"step_index\":0,"
                     "\"observation\":{\"context\":\"reset\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"Say something.\"}],\"tools\":null},\"info\":{}}",
                     s->sid, s->traj);
            s->create_body = strdup(b);
            fsrv_json(fd, 201, b);
        } else {
            fsrv_json(fd, 200, s->create_body);
        }
        goto out;
    }
    /* sessions/{sid}[/step|/score] */
    char sid[32] = "", tail[16] = "";
    sscanf(rest, "sessions/%31[^/]/%15s", sid, tail);
    fsrv_session *s = NULL;
    for (int i = 0; i < fsrv.n; i++)
        if (!strcmp(fsrv.s[i].sid, sid)) s = &fsrv.s[i];
    if (!s) {
        fsrv_json(fd, 404, "{\"error\":{\"code\":\"UNKNOWN_SESSION\",\"message\":\"no\","
                           "\"retryable\":false,\"attribution\":\"env\"}}");
        goto out;
    }
    if (!strcmp(method, "GET")) {
        char b[400];
        snprintf(b, sizeof b, "{\"session_id\":\"%s\",\"trajectory_id\":\"%s\",\"group_id\":\"g\","
                              "\"step_index\":%d,\"status\":\"%s\"}",
                 s->sid, s->traj, s->last_step, s->ended ? "terminated" : "active");
        fsrv_json(fd, 200, b);
        goto out;
    }
    if (!strcmp(tail, "step")) {
        int k = (int)json_integer_value(json_object_get(req, "step_index"));
        if (k == s->last_step && s->last_resp) { /* a retry of an applied step */
            fsrv_json(fd, 200, s->last_resp);
            goto out;
        }
        int att = ++s->attempts[1][k < 8 ? k : 7];
        if (fsrv_fault(fd, s, s->sc, "step", k, att, &close_conn)) goto out;
        char *b = fsrv_step_body(s, k, json_object_get(req, "action"));
        s->last_step = k;
        s->ended = k >= 3;
        free(s->last_resp);
        s->last_resp = b;
        fsrv_json(fd, 200, b);
        goto out;
    }
    if (!strcmp(tail, "score")) {
        const char *scope = json_string_value(json_object_get(req, "scope"));
        int seg = scope && !strcmp(scope, "segment");
        int att = ++s->attempts[seg ? 2 : 3][0];
        if (fsrv_fault(fd, s, s->sc, seg ? "score_segment" : "score_episode", 0, att, &close_conn))
            goto out;
        char b[200];
        if (seg)
            snprintf(b, sizeof b, "{\"scope\":\"segment\",\"segment_index\":%d,\"scorable\":true,"
                                  "\"reward\":0.5,\"reward_components\":{}}",
                     (int)json_integer_value(json_object_get(req, "segment_index")));
        else
            snprintf(b, sizeof b, "{\"scope\":\"episode\",\"scorable\":true,\"reward\":1,"
                                  "\"reward_components\":{}}");
        s->ended = s->ended || !seg;
        fsrv_json(fd, 200, b);
        goto out;
    }
    fsrv_json(fd, 404, "{}");
out:
    pthread_mutex_unlock(&fsrv.mu);
    json_decref(req);
    return close_conn;
}

static int fsrv_start(void) {
    pthread_mutex_init(&fsrv.mu, NULL);
    return lsrv_start(&fsrv.srv, fsrv_handle);
}

static void fsrv_stop(void) {
    lsrv_stop(&fsrv.srv);
    for (int i = 0; i < fsrv.n; i++) {
        free(fsrv.s[i].create_body);
        free(fsrv.s[i].last_resp);
    }
}

#endif
