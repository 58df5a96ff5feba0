/* tests/envs_builtin/test_demos.c: teacher demonstrations (envs/builtin/teacher.h): the JSONL
 * writer produces complete, successful, well-formed OpenAI conversations (tools included,
 * tool-call arguments as JSON text, every tool message answering a call of the preceding
 * assistant message), deterministically per seed; arl_env_teacher_act rebuilds a session
 * from a conversation's assistant turns and continues it exactly as the teacher did. */
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/builtin.h"
#include "envs/builtin/teacher.h"
#include "tests/test.h"

static const char *const env_names[] = {"calculator", "needle", "kvstore", "shapes"};

/* Write n demos into memory. */
static char *demos(const char *env, int64_t n, uint64_t seed, const char *opts,
                   arl_env_demos_stats *st, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    arl_status s = arl_env_demos_write(env, n, seed, opts, f, st);
    fclose(f);
    CHECK_MSG(s == ARL_OK, "%s: %s", env, arl_error_msg());
    return buf;
}

/* Check one conversation line; returns the number of assistant turns. */
static int check_conversation(const char *env, const char *line) {
    json_error_t je;
    json_t *c = json_loads(line, JSON_REJECT_DUPLICATES, &je);
    CHECK_MSG(c != NULL, "%s: line is not JSON: %s", env, je.text);
    if (!c) return 0;
    json_t *msgs = json_object_get(c, "messages"), *tools = json_object_get(c, "tools");
    json_t *meta = json_object_get(c, "meta");
    CHECK(json_is_array(msgs) && json_array_size(msgs) >= 4);
    CHECK(json_is_array(tools) && json_array_size(tools) >= 2);
    CHECK_STR_EQ(json_string_value(json_object_get(meta, "env")), env);
    CHECK(json_number_value(json_object_get(meta, "outcome")) == 1.0);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(msgs, 0), "role")), "system");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "user");
    int turns = 0;
    json_t *pending = NULL; /* ids of the last assistant message's calls */
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!strcmp(role, "assistant")) {
            turns++;
            json_t *calls = json_object_get(m, "tool_calls");
            CHECK(json_is_string(json_object_get(m, "content")));
            CHECK(json_is_array(calls) && json_array_size(calls) >= 1);
            json_decref(pending);
            pending = json_array();
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call) {
                CHECK_STR_EQ(json_string_value(json_object_get(call, "type")), "function");
                json_t *fn = json_object_get(call, "function");
                const char *name = json_string_value(json_object_get(fn, "name"));
                int known = 0;
                size_t t;
                json_t *tool;
                json_array_foreach(tools, t, tool) {
                    const char *tn = json_string_value(
                        json_object_get(json_object_get(tool, "function"), "name"));
                    known |= name && tn && !strcmp(name, tn);
                }
                CHECK_MSG(known, "%s: call of undeclared tool %s", env, name ? name : "?");
                const char *args = json_string_value(json_object_get(fn, "arguments"));
                json_t *a = args ? json_loads(args, 0, NULL) : NULL;
                CHECK_MSG(json_is_object(a), "%s: arguments are not JSON object text", env);
                json_decref(a);
                json_array_append(pending, json_object_get(call, "id"));
            }
        } else if (!strcmp(role, "tool")) {
            const char *id = json_string_value(json_object_get(m, "tool_call_id"));
            int found = 0;
            size_t k;
            json_t *pid;
            json_array_foreach(pending, k, pid) found |= id && !strcmp(id, json_string_value(pid));
            CHECK_MSG(found, "%s: tool message %s answers no call of the last turn", env,
                      id ? id : "?");
        } else if (i >= 2) {
            CHECK_MSG(0, "%s: unexpected %s message in a teacher conversation", env, role);
        }
    }
    json_decref(pending);
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    CHECK_STR_EQ(json_string_value(json_object_get(last, "role")), "tool");
    json_decref(c);
    return turns;
}

static void test_write(void) {
    for (int e = 0; e < 4; e++) {
        arl_env_demos_stats st;
        size_t len = 0, len2 = 0;
        char *a = demos(env_names[e], 12, 100, NULL, &st, &len);
        char *b = demos(env_names[e], 12, 100, NULL, NULL, &len2);
        CHECK_EQ_INT(st.episodes, 12);
        CHECK_EQ_INT(st.written, 12);
        CHECK_EQ_INT(st.failed, 0);
        CHECK_EQ_INT(st.bytes, (int64_t)len);
        CHECK(len == len2 && a && b && !memcmp(a, b, len)); /* deterministic */
        int lines = 0;
        for (char *p = a, *nl; p && *p; p = nl + 1) {
            nl = strchr(p, '\n');
            CHECK(nl != NULL);
            if (!nl) break;
            *nl = 0;
            check_conversation(env_names[e], p);
            lines++;
        }
        CHECK_EQ_INT(lines, 12);
        free(a);
        free(b);
    }
    /* the calculator sample of the report, and a shapes line carries a data URL */
    size_t len;
    char *one = demos("calculator", 1, 7, "{\"level\": 1}", NULL, &len);
    fprintf(stderr, "  calculator demo: %s", one);
    free(one);
    one = demos("shapes", 1, 7, NULL, NULL, &len);
    CHECK(strstr(one, "\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgo") != NULL);
    free(one);
    one = demos("kvstore", 20, 7, "{\"failure_rate\": 0.5}", NULL, &len);
    CHECK(strstr(one, "\"error_code\":\"TOOL_TIMEOUT\"") != NULL);
    CHECK(strstr(one, "The call timed out; retrying.") != NULL);
    free(one);
}

static void test_errors(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_EQ_INT(arl_env_demos_write("nope", 1, 0, NULL, f, NULL), ARL_ERR_NOT_FOUND);
    CHECK_EQ_INT(arl_env_demos_write("calculator", 1, 0, "[1]", f, NULL), ARL_ERR_ARG);
    CHECK_EQ_INT(arl_env_demos_write("calculator", 1, 0, "{\"level\": 7}", f, NULL), ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "options.level") != NULL);
    CHECK_EQ_INT(arl_env_demos_write("calculator", 1, 0, "{\"max_steps\": 1000}", f, NULL),
                 ARL_ERR_ARG);
    fclose(f);
    CHECK_EQ_INT(len, 0);
    free(buf);
    /* a turn limit the teacher cannot meet: episodes fail and are not written */
    arl_env_demos_stats st;
    buf = NULL;
    f = open_memstream(&buf, &len);
    CHECK_EQ_INT(
        arl_env_demos_write("calculator", 3, 0, "{\"level\": 3, \"max_steps\": 1}", f, &st),
        ARL_OK);
    fclose(f);
    CHECK(st.episodes == 3 && st.failed == 3 && st.written == 0 && len == 0);
    free(buf);
}

/* Cut a teacher conversation after k assistant turns, ask the teacher, compare with turn k+1. */
static void test_teacher_act(void) {
    for (int e = 0; e < 4; e++) {
        for (uint64_t seed = 0; seed < 5; seed++) {
            json_t *empty = json_object();
            json_t *opts = e == 2 ? json_pack("{s:f}", "failure_rate", 0.5) : NULL;
            arl_env_task task = {"t", seed, empty};
            json_t *conv = NULL;
            double outcome = 0;
            CHECK_EQ_INT(arl_env_demo_episode(env_names[e], &task, opts, &conv, &outcome), ARL_OK);
            CHECK(outcome == 1.0);
            json_t *msgs = json_object_get(conv, "messages");
            json_t *hist = json_array();
            size_t i;
            json_t *m;
            json_array_foreach(msgs, i, m) {
                if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant")) {
                    arl_env_action a;
                    memset(&a, 0, sizeof a);
                    CHECK_EQ_INT(arl_env_teacher_act(env_names[e], &task, opts, hist, &a), ARL_OK);
                    json_t *got = arl_env_action_to_openai(&a);
                    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
                    char *w = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
                    CHECK_MSG(g && w && !strcmp(g, w), "%s seed %llu turn: %s != %s", env_names[e],
                              (unsigned long long)seed, g, w);
                    free(g);
                    free(w);
                    json_decref(got);
                    arl_env_action_clear(&a);
                }
                json_array_append(hist, m);
            }
            /* after the whole conversation the episode has ended */
            arl_env_action a;
            memset(&a, 0, sizeof a);
            CHECK_EQ_INT(arl_env_teacher_act(env_names[e], &task, opts, hist, &a), ARL_ERR_STATE);
            arl_env_action_clear(&a);
            json_decref(hist);
            json_decref(conv);
            json_decref(opts);
            json_decref(empty);
        }
    }
    /* a history with a malformed call is replayed as a parse error, then the teacher acts */
    json_t *empty = json_object();
    arl_env_task task = {"t", 1, empty};
    json_t *hist = json_loads("[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
                              "[{\"id\": \"call_1_0\", \"type\": \"function\", \"function\": "
                              "{\"name\": \"calc\", \"arguments\": \"{\\\"expression\\\": \"}}]}]",
                              0, NULL);
    CHECK(hist != NULL);
    arl_env_action a;
    memset(&a, 0, sizeof a);
    CHECK_EQ_INT(arl_env_teacher_act("calculator", &task, NULL, hist, &a), ARL_OK);
    CHECK(a.n_tool_calls == 1 && !strcmp(a.tool_calls[0].name, "calc"));
    CHECK(a.n_tool_calls == 1 && !strncmp(a.tool_calls[0].id, "call_2_", 7));
    arl_env_action_clear(&a);
    json_decref(hist);
    json_decref(empty);
}

int main(void) {
    TEST_RUN(test_write);
    TEST_RUN(test_errors);
    TEST_RUN(test_teacher_act);
    return test_finish();
}
