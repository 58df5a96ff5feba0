/* tests/envs_builtin/inproc_calls.c: one episode of a built-in environment through the client's
 * in-process transport (arl_env_open "builtin:NAME"): create, the teacher's steps to the end, a
 * segment score where the environment scores segments, a fork after step 1 with one step of its
 * own, the episode's score and DELETE; for inproc_failalloc.sh, which runs it with allocations
 * failing.  Usage: envs_inproc_calls NAME.
 * Prints one line per call (endpoint, step index, reward, the response's length) and exits
 *   0  every call succeeded;
 *   1  a local failure: a call's status ARL_ERR_NOMEM (the client, or the host in the same
 *      process, ran out of memory), or out of memory opening, in the teacher or the history;
 *   3  a call failed with an environment error (ARL_ERR_ENV) - which, for a built-in
 *      environment driven by its own teacher, only a failure of this process can cause;
 *   4  anything else. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/status.h"
#include "envs/builtin/teacher.h"
#include "envs/env.h"

static const char *const names[] = {"calculator", "needle", "kvstore", "shapes"};
static const char *const datas[] = {"{\"level\": 2}", "{\"doc_tokens\": 600}",
                                    "{\"failure_rate\": 0, \"goals\": 2}",
                                    "{\"size\": 28, \"question\": \"count\"}"};

/* The exit code of a failed step of the driver (status s; the session's call when there is
 * one), with its line on standard error. */
static int failed(const char *what, arl_status s, const arl_env_session *ses) {
    const arl_env_call *c = ses ? arl_env_session_call(ses) : NULL;
    if (s == ARL_ERR_ENV && c && c->status == ARL_ERR_ENV) {
        fprintf(stderr, "inproc_calls: %s: environment error %s (HTTP %d): %s %s\n", what,
                c->error.code_str, c->http_status, c->error.message, c->error.violation);
        return 3;
    }
    fprintf(stderr, "inproc_calls: %s: error: %s (%s)\n", what, arl_error_msg(),
            arl_status_str(s));
    return s == ARL_ERR_NOMEM ? 1 : 4;
}

static void say(const char *ep, const arl_env_session *s) {
    const arl_env_call *c = arl_env_session_call(s);
    printf("%s step %lld http %d reward %.6g bytes %zu\n", ep,
           (long long)arl_env_session_last_step(s), c->http_status,
           c->endpoint == ARL_ENV_EP_SCORE ? c->score.reward : c->result.reward, c->response_len);
}

int main(int argc, char **argv) {
    arl_json_watch();
    int e = 0;
    while (e < 4 && strcmp(names[e], argc > 1 ? argv[1] : "calculator")) e++;
    if (e == 4) {
        fprintf(stderr, "inproc_calls: no built-in environment '%s'\n", argv[1]);
        return 4;
    }
    arl_env_client_config cfg;
    arl_env_client_config_default(&cfg);
    arl_env_client *c = NULL;
    arl_env *env = NULL;
    arl_env_session *s = NULL, *f = NULL;
    json_t *data = NULL, *hist = NULL;
    int rc = 0;
    arl_status st = arl_env_client_open(&cfg, &c);
    char where[64];
    snprintf(where, sizeof where, "builtin:%s", names[e]);
    if (st != ARL_OK) {
        rc = failed("client open", st, NULL);
        goto out;
    }
    if ((st = arl_env_open(c, where, NULL, &env)) != ARL_OK) {
        rc = failed("open", st, NULL);
        goto out;
    }
    data = json_loads(datas[e], 0, NULL);
    hist = json_array();
    if (!data || !hist) {
        rc = failed("task", arl_errorf(ARL_ERR_NOMEM, "out of memory"), NULL);
        goto out;
    }
    arl_env_create_req req = {"inproc/1", "inproc/g", {"task", 7, data}, NULL, 0};
    if ((st = arl_env_session_create(env, &req, &s)) != ARL_OK) {
        rc = failed("create", st, s);
        goto out;
    }
    say("create", s);
    const arl_env_info *info = arl_env_get_info(env);
    if ((st = arl_env_obs_to_openai(&arl_env_session_call(s)->result.obs, hist)) != ARL_OK) {
        rc = failed("history", st, NULL);
        goto out;
    }
    for (int k = 1; k <= 60 && !arl_env_session_ended(s); k++) {
        arl_env_action a;
        memset(&a, 0, sizeof a);
        if ((st = arl_env_teacher_act(names[e], &req.task, NULL, hist, &a)) != ARL_OK) {
            rc = failed("teacher", st, NULL);
            goto out;
        }
        json_t *aj = arl_env_action_to_openai(&a);
        if (!aj || json_array_append_new(hist, aj)) {
            arl_env_action_clear(&a);
            rc = failed("history", arl_errorf(ARL_ERR_NOMEM, "out of memory"), NULL);
            goto out;
        }
        st = arl_env_session_step(s, &a, 0);
        if (st != ARL_OK) {
            arl_env_action_clear(&a);
            rc = failed("step", st, s);
            goto out;
        }
        say("step", s);
        if ((st = arl_env_obs_to_openai(&arl_env_session_call(s)->result.obs, hist)) != ARL_OK) {
            arl_env_action_clear(&a);
            rc = failed("history", st, NULL);
            goto out;
        }
        if (k == 1 && !arl_env_session_ended(s)) {
            /* the fork takes the same action again as its own step 2 */
            arl_status fs = arl_env_session_fork(s, "inproc/1#f", "inproc/f", 1, 0, &f);
            if (fs != ARL_OK) {
                arl_env_action_clear(&a);
                rc = failed("fork", fs, s);
                goto out;
            }
            if ((fs = arl_env_session_step(f, &a, 0)) != ARL_OK) {
                arl_env_action_clear(&a);
                rc = failed("fork's step", fs, f);
                goto out;
            }
            say("fork-step", f);
        }
        arl_env_action_clear(&a);
        if (info->caps.segment_score && k == 1) {
            if ((st = arl_env_session_score_segment(s, 0, 1, 1, 0)) != ARL_OK) {
                rc = failed("segment score", st, s);
                goto out;
            }
            say("score-segment", s);
        }
    }
    if ((st = arl_env_session_score_episode(s, ARL_ENV_REASON_TERMINATED, 0)) != ARL_OK) {
        rc = failed("episode score", st, s);
        goto out;
    }
    say("score-episode", s);
    if ((st = arl_env_session_delete(s, NULL)) != ARL_OK) {
        rc = failed("delete", st, s);
        goto out;
    }
    printf("delete http %d\n", arl_env_session_call(s)->http_status);
out:
    arl_env_session_free(f);
    arl_env_session_free(s);
    json_decref(hist);
    json_decref(data);
    arl_env_free(env);
    arl_env_client_close(c);
    return rc;
}
