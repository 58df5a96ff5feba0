/* tests/envs_builtin/test_e2e.c: every built-in environment end to end through the AEP/1
 * session API in-process ("builtin:NAME": the host of envs/env_host.c and the client's
 * validation of every response: roles, tool-call ids, reward ranges, images), driven by the
 * history-based teacher (arl_env_teacher_act), with segment and episode scores, fork with
 * deterministic replay, and delete.  It also checks the conformance scripts shipped in
 * envs/builtin/conformance/ (spec/aep.md 15.1): their actions reach terminated exactly at the
 * last one and bad_args_action is answered TOOL_ARGS_INVALID.
 *
 * `test_envs_builtin_e2e --write-scripts DIR` regenerates the scripts from the teachers. */
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/teacher.h"
#include "tests/envs_builtin/drive.h"
#include "tests/test.h"

static const char *const env_names[] = {"calculator", "needle", "kvstore", "shapes"};
/* task.data of the e2e runs and of the conformance scripts */
static const char *const env_data[] = {"{\"level\": 3}", "{\"doc_tokens\": 4000, \"hops\": 2}",
                                       "{\"failure_rate\": 0.3}", "{\"size\": 28}"};
static const char *const script_data[] = {"{\"level\": 1}", "{\"doc_tokens\": 2000}",
                                          "{\"failure_rate\": 0, \"goals\": 2}",
                                          "{\"size\": 28, \"question\": \"count\"}"};

static arl_env_client *client_open(void) {
    arl_env_client_config cfg;
    arl_env_client_config_default(&cfg);
    arl_env_client *c = NULL;
    if (arl_env_client_open(&cfg, &c) != ARL_OK) {
        fprintf(stderr, "client open failed: %s\n", arl_error_msg());
        exit(1);
    }
    return c;
}

static const char *call_error(const arl_env_session *s) {
    const arl_env_call *c = arl_env_session_call(s);
    static char buf[1200];
    snprintf(buf, sizeof buf, "%s: %s %s (%s)", c->error.code_str, c->error.message,
             c->error.violation, arl_error_msg());
    return buf;
}

static void run_env(arl_env_client *c, int e, uint64_t seed) {
    const char *name = env_names[e];
    char where[64];
    snprintf(where, sizeof where, "builtin:%s", name);
    arl_env *env = NULL;
    CHECK_EQ_INT(arl_env_open(c, where, NULL, &env), ARL_OK);
    if (!env) return;
    const arl_env_info *info = arl_env_get_info(env);
    CHECK_STR_EQ(info->name, name);
    json_t *data = json_loads(env_data[e], 0, NULL);
    char tid[96];
    snprintf(tid, sizeof tid, "e2e/%s/%llu", name, (unsigned long long)seed);
    arl_env_create_req req = {tid, "e2e/group", {"task", seed, data}, NULL, 0};
    arl_env_session *s = NULL, *f = NULL;
    CHECK_EQ_INT(arl_env_session_create(env, &req, &s), ARL_OK);
    if (!s) goto out;
    const arl_env_call *call = arl_env_session_call(s);
    CHECK_MSG(call->status == ARL_OK, "%s create: %s", name, call_error(s));
    json_t *hist = json_array(), *bodies = json_array(); /* parent's step response bodies */
    CHECK_EQ_INT(arl_env_obs_to_openai(&call->result.obs, hist), ARL_OK);
    int64_t seg = 0;
    int terminated = 0;
    for (int k = 1; k <= 200 && !terminated; k++) {
        arl_env_action a;
        memset(&a, 0, sizeof a);
        arl_status st = arl_env_teacher_act(name, &req.task, NULL, hist, &a);
        CHECK_MSG(st == ARL_OK, "%s step %d: teacher: %s", name, k, arl_error_msg());
        if (st != ARL_OK) break;
        json_array_append_new(hist, arl_env_action_to_openai(&a));
        st = arl_env_session_step(s, &a, 0);
        CHECK_MSG(st == ARL_OK, "%s step %d: %s", name, k, call_error(s));
        arl_env_action_clear(&a);
        if (st != ARL_OK) break;
        call = arl_env_session_call(s);
        CHECK_EQ_INT(call->result.step_index, k);
        json_array_append_new(bodies, json_stringn(call->response, call->response_len));
        CHECK_EQ_INT(arl_env_obs_to_openai(&call->result.obs, hist), ARL_OK);
        terminated = call->result.terminated;
        CHECK(!call->result.truncated);
        /* a segment per step */
        st = arl_env_session_score_segment(s, seg, k, k, 0);
        if (info->caps.segment_score) {
            CHECK_MSG(st == ARL_OK, "%s segment %lld: %s", name, (long long)seg, call_error(s));
            seg++;
        } else {
            CHECK(st == ARL_ERR_ENV &&
                  arl_env_session_call(s)->error.code == ARL_ENV_E_NOT_IMPLEMENTED);
        }
        if (k == 1) {
            /* fork after step 1 (409 EPISODE_ENDED when step 1 ended the episode) */
            char ctid[128];
            snprintf(ctid, sizeof ctid, "%s#fork1", tid);
            st = arl_env_session_fork(s, ctid, "e2e/fork", 1, 0, &f);
            if (terminated) {
                CHECK(st == ARL_ERR_ENV &&
                      arl_env_session_call(s)->error.code == ARL_ENV_E_EPISODE_ENDED);
                arl_env_session_free(f);
                f = NULL;
            } else {
                CHECK_MSG(st == ARL_OK, "%s fork: %s", name, call_error(s));
            }
        }
    }
    CHECK_MSG(terminated, "%s seed %llu: no terminated step", name, (unsigned long long)seed);
    CHECK_EQ_INT(arl_env_session_score_episode(s, ARL_ENV_REASON_TERMINATED, 0), ARL_OK);
    call = arl_env_session_call(s);
    CHECK(call->score.scorable && call->score.reward == 1.0);
    /* the fork child replays the parent's steps 2.. byte for byte */
    if (f) {
        size_t i;
        json_t *m;
        int k = 0;
        json_t *sofar = json_array();
        json_array_foreach(hist, i, m) {
            if (strcmp(json_string_value(json_object_get(m, "role")), "assistant")) {
                json_array_append(sofar, m);
                continue;
            }
            if (++k >= 2) {
                arl_env_action a;
                memset(&a, 0, sizeof a);
                CHECK_EQ_INT(arl_env_teacher_act(name, &req.task, NULL, sofar, &a), ARL_OK);
                CHECK_MSG(arl_env_session_step(f, &a, 0) == ARL_OK, "%s fork step %d: %s", name, k,
                          call_error(f));
                const arl_env_call *fc = arl_env_session_call(f);
                json_t *pb = json_array_get(bodies, (size_t)k - 1);
                CHECK_MSG(pb && fc->response_len == json_string_length(pb) &&
                              !memcmp(fc->response, json_string_value(pb), fc->response_len),
                          "%s fork step %d: the child's response differs from the parent's", name,
                          k);
                arl_env_action_clear(&a);
            }
            json_array_append(sofar, m);
        }
        CHECK_EQ_INT(arl_env_session_last_step(f), arl_env_session_last_step(s));
        CHECK(arl_env_session_ended(f));
        CHECK_EQ_INT(arl_env_session_score_episode(f, ARL_ENV_REASON_TERMINATED, 0), ARL_OK);
        CHECK(arl_env_session_call(f)->score.reward == 1.0);
        json_decref(sofar);
        arl_env_session_delete(f, NULL);
        arl_env_session_free(f);
    }
    json_decref(hist);
    json_decref(bodies);
    CHECK_EQ_INT(arl_env_session_delete(s, NULL), ARL_OK);
out:
    arl_env_session_free(s);
    json_decref(data);
    arl_env_free(env);
}

static void test_sessions(void) {
    arl_env_client *c = client_open();
    for (int e = 0; e < 4; e++)
        for (uint64_t seed = 0; seed < 3; seed++)
            run_env(c, e, seed);
    arl_env_client_close(c);
}

/* Model faults through the whole stack are 200 observations with tool error codes. */
static void test_model_faults(void) {
    arl_env_client *c = client_open();
    for (int e = 0; e < 4; e++) {
        char where[64];
        snprintf(where, sizeof where, "builtin:%s", env_names[e]);
        arl_env *env = NULL;
        CHECK_EQ_INT(arl_env_open(c, where, NULL, &env), ARL_OK);
        json_t *data = json_object();
        arl_env_create_req req = {"faults", "g", {"task", 1, data}, NULL, 0};
        arl_env_session *s = NULL;
        CHECK_EQ_INT(arl_env_session_create(env, &req, &s), ARL_OK);
        arl_env_action a;
        drv_action(&a, "{\"tool_calls\": [{\"id\": \"call_1_0\", \"name\": \"no_such_tool\", "
                       "\"arguments\": {}}], \"parse_errors\": [{\"id\": \"call_1_1\", "
                       "\"status\": \"invalid_json\"}]}");
        CHECK_EQ_INT(arl_env_session_step(s, &a, 0), ARL_OK);
        const arl_env_call *call = arl_env_session_call(s);
        CHECK_EQ_INT(call->result.obs.n_messages, 2);
        if (call->result.obs.n_messages == 2) {
            CHECK_STR_EQ(call->result.obs.messages[0].error_code, "TOOL_NOT_FOUND");
            CHECK_STR_EQ(call->result.obs.messages[1].error_code, "TOOL_PARSE_ERROR");
        }
        CHECK(call->result.reward < 0);
        arl_env_action_clear(&a);
        drv_action(&a, "{\"content\": \"just text\"}");
        CHECK_EQ_INT(arl_env_session_step(s, &a, 0), ARL_OK);
        CHECK_EQ_INT(arl_env_session_call(s)->result.obs.messages[0].role, ARL_ENV_ROLE_USER);
        arl_env_action_clear(&a);
        /* task data the environment cannot use: 422 */
        json_t *bad = json_pack("{s:i}", "unknown_member", 1);
        arl_env_create_req breq = {"faults-bad", "g", {"task", 1, bad}, NULL, 0};
        arl_env_session *b = NULL;
        CHECK_EQ_INT(arl_env_session_create(env, &breq, &b), ARL_ERR_ENV);
        if (b) {
            CHECK_EQ_INT(arl_env_session_call(b)->error.code, ARL_ENV_E_VALIDATION_ERROR);
            arl_env_session_free(b);
        }
        json_decref(bad);
        arl_env_session_delete(s, NULL);
        arl_env_session_free(s);
        json_decref(data);
        arl_env_free(env);
    }
    arl_env_client_close(c);
}

/* ---- conformance scripts ---- */

static json_t *make_script(int e) {
    json_t *data = json_loads(script_data[e], 0, NULL);
    arl_env_task task = {"conformance", 7, data};
    json_t *conv = NULL;
    double outcome = 0;
    if (arl_env_demo_episode(env_names[e], &task, NULL, &conv, &outcome) != ARL_OK ||
        outcome != 1.0) {
        fprintf(stderr, "%s: teacher episode failed: %s\n", env_names[e], arl_error_msg());
        exit(1);
    }
    json_t *actions = json_array(), *hist = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(conv, "messages"), i, m) {
        if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant")) {
            arl_env_action a;
            memset(&a, 0, sizeof a);
            if (arl_env_teacher_act(env_names[e], &task, NULL, hist, &a) != ARL_OK) exit(1);
            char *wire = arl_env_action_to_json(&a);
            json_array_append_new(actions, json_loads(wire, 0, NULL));
            free(wire);
            arl_env_action_clear(&a);
        }
        json_array_append(hist, m);
    }
    /* bad_args_action: the first action's tool called without its first required argument
     * (open() has none and read's arguments are optional: then read at offset -1, below the
     * schema's minimum 0) */
    json_t *bad = json_deep_copy(json_array_get(actions, 0));
    json_t *call = json_array_get(json_object_get(bad, "tool_calls"), 0);
    const char *tool = json_string_value(json_object_get(call, "name"));
    if (!strcmp(tool, "open")) {
        json_object_set_new(call, "name", json_string("read"));
        json_object_set_new(call, "arguments", json_pack("{s:i}", "offset", -1));
    } else {
        json_t *args = json_object_get(call, "arguments");
        json_object_clear(args);
    }
    json_t *script = json_pack("{s:{s:s, s:i, s:o}, s:o, s:o}", "task", "id", "conformance", "seed",
                               7, "data", data, "actions", actions, "bad_args_action", bad);
    json_decref(hist);
    json_decref(conv);
    return script;
}

static void check_script(arl_env_client *c, int e) {
    char rel[128];
    snprintf(rel, sizeof rel, "envs/builtin/conformance/%s.json", env_names[e]);
    json_error_t je;
    json_t *script = json_load_file(test_src_path(rel), JSON_REJECT_DUPLICATES, &je);
    CHECK_MSG(script != NULL, "%s: %s", rel, je.text);
    if (!script) return;
    char where[64];
    snprintf(where, sizeof where, "builtin:%s", env_names[e]);
    arl_env *env = NULL;
    CHECK_EQ_INT(arl_env_open(c, where, NULL, &env), ARL_OK);
    json_t *task = json_object_get(script, "task");
    arl_env_create_req req = {"script",
                              "g",
                              {json_string_value(json_object_get(task, "id")),
                               (uint64_t)json_integer_value(json_object_get(task, "seed")),
                               json_object_get(task, "data")},
                              NULL,
                              0};
    arl_env_session *s = NULL;
    CHECK_EQ_INT(arl_env_session_create(env, &req, &s), ARL_OK);
    json_t *actions = json_object_get(script, "actions");
    size_t n = json_array_size(actions), i;
    json_t *act;
    CHECK(n >= 1);
    json_array_foreach(actions, i, act) {
        char *text = json_dumps(act, JSON_COMPACT);
        arl_env_action a;
        drv_action(&a, text);
        free(text);
        CHECK_MSG(arl_env_session_step(s, &a, 0) == ARL_OK, "%s action %zu: %s", rel, i,
                  call_error(s));
        arl_env_action_clear(&a);
        const arl_env_call *call = arl_env_session_call(s);
        CHECK_MSG(call->result.terminated == (i + 1 == n), "%s: action %zu terminated=%d", rel, i,
                  call->result.terminated);
        for (int32_t k = 0; k < call->result.obs.n_messages; k++)
            CHECK_MSG(!call->result.obs.messages[k].is_error, "%s action %zu: tool error %s", rel,
                      i, call->result.obs.messages[k].error_code);
    }
    CHECK_EQ_INT(arl_env_session_score_episode(s, ARL_ENV_REASON_TERMINATED, 0), ARL_OK);
    CHECK(arl_env_session_call(s)->score.reward == 1.0);
    arl_env_session_delete(s, NULL);
    arl_env_session_free(s);
    /* bad_args_action on a fresh session */
    req.trajectory_id = "script-bad";
    CHECK_EQ_INT(arl_env_session_create(env, &req, &s), ARL_OK);
    char *text = json_dumps(json_object_get(script, "bad_args_action"), JSON_COMPACT);
    arl_env_action a;
    drv_action(&a, text);
    free(text);
    CHECK_EQ_INT(arl_env_session_step(s, &a, 0), ARL_OK);
    arl_env_action_clear(&a);
    const arl_env_call *call = arl_env_session_call(s);
    CHECK(call->result.obs.n_messages >= 1 &&
          !strcmp(call->result.obs.messages[0].error_code ? call->result.obs.messages[0].error_code
                                                          : "",
                  "TOOL_ARGS_INVALID"));
    arl_env_session_delete(s, NULL);
    arl_env_session_free(s);
    /* the committed script is the one the teachers produce today */
    json_t *fresh = make_script(e);
    CHECK_MSG(json_equal(fresh, script), "%s is stale: regenerate with --write-scripts", rel);
    json_decref(fresh);
    arl_env_free(env);
    json_decref(script);
}

static void test_scripts(void) {
    arl_env_client *c = client_open();
    for (int e = 0; e < 4; e++)
        check_script(c, e);
    arl_env_client_close(c);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-scripts")) {
        for (int e = 0; e < 4; e++) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s.json", argv[2], env_names[e]);
            json_t *s = make_script(e);
            if (json_dump_file(s, path, JSON_INDENT(1)) != 0) {
                fprintf(stderr, "cannot write %s\n", path);
                return 1;
            }
            json_decref(s);
            fprintf(stderr, "wrote %s\n", path);
        }
        return 0;
    }
    TEST_RUN(test_sessions);
    TEST_RUN(test_model_faults);
    TEST_RUN(test_scripts);
    return test_finish();
}
