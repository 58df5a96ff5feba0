/* tests/envs_aep/test_session.c: the session API (envs/env.h part C) against the in-process
 * host of the "echo" test environment (envs/test_env.c): the full lifecycle, the host's state
 * rules through the raw vtable (replays byte for byte, conflicts, ended and closed sessions,
 * score keys, fork rules), and the tool-call argument parser. */
#include <malloc.h>
#include <string.h>

#include "envs/aep_json.h"
#include "envs/env.h"
#include "tests/test.h"

static void make_call(arl_env_action *a, const char *id, const char *name, const char *args) {
    json_t *j = json_loads(args, 0, NULL);
    CHECK(j != NULL);
    CHECK(arl_env_action_add_call(a, id, name, j) == ARL_OK);
    arl_env_action_set_parse_status(a);
    a->finish_reason = ARL_ENV_FINISH_TOOL_CALLS;
}

static void test_lifecycle(void) {
    arl_env_client *c;
    arl_env_client_config cfg;
    arl_env_client_config_default(&cfg);
    CHECK(arl_env_client_open(&cfg, &c) == ARL_OK);
    arl_env *e = NULL;
    CHECK(arl_env_open(c, "builtin:echo", NULL, &e) == ARL_OK);
    if (!e) return;
    const arl_env_info *info = arl_env_get_info(e);
    CHECK_STR_EQ(info->name, "echo");
    CHECK(info->caps.fork && info->caps.fork_past && info->caps.multimodal);

    arl_env_create_req cr = {.trajectory_id = "t/run1/g0/r0", .group_id = "t/run1/g0",
                             .task = {.id = "task-1", .seed = 7, .data = NULL}};
    arl_env_session *s = NULL;
    CHECK(arl_env_session_create(e, &cr, &s) == ARL_OK);
    const arl_env_call *call = arl_env_session_call(s);
    CHECK_EQ_INT(call->http_status, 201);
    CHECK_EQ_INT(call->result.obs.context, ARL_ENV_CONTEXT_RESET);
    CHECK_EQ_INT(call->result.obs.n_messages, 2);
    CHECK(strlen(arl_env_session_id(s)) > 0);

    /* step 1: echo + a parse error; the observation answers both, in order */
    arl_env_action a = {0};
    make_call(&a, "call_1_0", "echo", "{\"text\":\"h\\u00e9llo \\ud83d\\ude00\"}");
    CHECK(arl_env_action_add_parse_error(&a, "call_1_1", ARL_ENV_PARSE_INVALID_JSON, "bad", "{") == ARL_OK);
    arl_env_action_set_parse_status(&a);
    CHECK(arl_env_session_step(s, &a, 0) == ARL_OK);
    call = arl_env_session_call(s);
    CHECK_EQ_INT(call->result.step_index, 1);
    CHECK_EQ_INT(call->result.obs.n_messages, 2);
    CHECK_STR_EQ(call->result.obs.messages[0].content, "h\xc3\xa9llo \xf0\x9f\x98\x80");
    CHECK_STR_EQ(call->result.obs.messages[1].error_code, "TOOL_PARSE_ERROR");
    CHECK_CLOSE(call->result.reward, 0.0, 1e-12, 0); /* +0.1 - 0.1, rounded to tenths */
    arl_env_action_clear(&a);

    /* step 2: an image and an unknown tool */
    make_call(&a, "call_2_0", "image", "{\"width\":5,\"height\":3}");
    make_call(&a, "call_2_1", "nope", "{}");
    CHECK(arl_env_session_step(s, &a, 0) == ARL_OK);
    call = arl_env_session_call(s);
    CHECK_EQ_INT(call->result.obs.messages[0].n_parts, 2);
    CHECK_EQ_INT(call->result.obs.messages[0].parts[1].image.width, 5);
    CHECK_EQ_INT(call->result.obs.messages[0].parts[1].image.height, 3);
    CHECK_STR_EQ(call->result.obs.messages[1].error_code, "TOOL_NOT_FOUND");
    arl_env_action_clear(&a);

    /* segment 0 over [1, 2] */
    CHECK(arl_env_session_score_segment(s, 0, 1, 2, 0) == ARL_OK);
    call = arl_env_session_call(s);
    CHECK(call->score.scorable);
    CHECK_CLOSE(call->score.reward, 0.0, 1e-12, 0); /* both steps had a failing call */

    /* fork at step 2; the child continues independently */
    arl_env_session *child = NULL;
    CHECK(arl_env_session_fork(s, "t/run1/g0/r0#fork1", "t/run1/g0-f", 2, 0, &child) == ARL_OK);
    CHECK(child != NULL);
    if (child) CHECK_EQ_INT(arl_env_session_last_step(child), 2);

    /* step 3 on the parent: submit */
    make_call(&a, "call_3_0", "submit", "{\"answer\":\"42\"}");
    CHECK(arl_env_session_step(s, &a, 0) == ARL_OK);
    call = arl_env_session_call(s);
    CHECK(call->result.terminated);
    CHECK(arl_env_session_ended(s));
    arl_env_action_clear(&a);

    /* stepping after the end: EPISODE_ENDED */
    make_call(&a, "call_4_0", "echo", "{\"text\":\"x\"}");
    CHECK(arl_env_session_step(s, &a, 0) == ARL_ERR_ENV);
    CHECK_EQ_INT(arl_env_session_call(s)->error.code, ARL_ENV_E_EPISODE_ENDED);
    CHECK_EQ_INT(arl_env_session_call(s)->attempts, 1);
    arl_env_action_clear(&a);

    CHECK(arl_env_session_score_episode(s, ARL_ENV_REASON_TERMINATED, 0) == ARL_OK);
    CHECK_CLOSE(arl_env_session_call(s)->score.reward, 1.0, 0, 0);

    /* the child can still step at 3 with a wrong answer */
    if (child) {
        make_call(&a, "call_3_0", "submit", "{\"answer\":\"41\"}");
        CHECK(arl_env_session_step(child, &a, 0) == ARL_OK);
        CHECK(arl_env_session_score_episode(child, ARL_ENV_REASON_TERMINATED, 0) == ARL_OK);
        CHECK_CLOSE(arl_env_session_call(child)->score.reward, 0.0, 0, 0);
        arl_env_action_clear(&a);
    }

    CHECK(arl_env_session_get(s) == ARL_OK);
    call = arl_env_session_call(s);
    CHECK(call->snapshot != NULL);
    CHECK_EQ_INT(json_integer_value(json_object_get(call->snapshot, "step_index")), 3);
    CHECK_STR_EQ(json_string_value(json_object_get(call->snapshot, "status")), "terminated");

    CHECK(arl_env_session_delete(s, "completed") == ARL_OK);
    CHECK(arl_env_session_get(s) == ARL_ERR_ENV);
    CHECK_EQ_INT(arl_env_session_call(s)->error.code, ARL_ENV_E_SESSION_CLOSED);
    arl_env_session_free(s);
    if (child) {
        CHECK(arl_env_session_delete(child, "completed") == ARL_OK);
        arl_env_session_free(child);
    }

    /* async: 8 sessions created and stepped concurrently */
    arl_env_session *ss[8];
    for (int i = 0; i < 8; i++) {
        char tid[64];
        snprintf(tid, sizeof tid, "t/run1/g1/r%d", i);
        arl_env_create_req r2 = cr;
        r2.trajectory_id = tid;
        CHECK(arl_env_session_create_begin(e, &r2, &ss[i]) == ARL_OK);
    }
    int got = 0;
    arl_env_session *d;
    while (arl_env_client_pending(c) > 0) {
        CHECK(arl_env_client_wait(c, 1000, &d) == ARL_OK);
        if (d) {
            CHECK(arl_env_session_call(d)->status == ARL_OK);
            got++;
        }
    }
    CHECK_EQ_INT(got, 8);
    for (int i = 0; i < 8; i++) {
        arl_env_session_delete(ss[i], "aborted");
        arl_env_session_free(ss[i]);
    }
    arl_env_free(e);
    arl_env_client_close(c);
}

/* The host's rules through the byte-level vtable (§6.3-§6.6, §7). */
static int vcall(const arl_env_vtable *vt, void *inst, const char *ep, const char *sid, const char *body,
                 char **out) {
    char *resp = NULL;
    size_t rl = 0;
    int st;
    if (!strcmp(ep, "reset")) st = vt->reset(inst, body, strlen(body), &resp, &rl);
    else if (!strcmp(ep, "step")) st = vt->step(inst, sid, body, strlen(body), &resp, &rl);
    else if (!strcmp(ep, "score")) st = vt->score(inst, sid, body, strlen(body), &resp, &rl);
    else if (!strcmp(ep, "fork")) st = vt->fork(inst, sid, body, strlen(body), &resp, &rl);
    else st = vt->get(inst, sid, &resp, &rl);
    if (out) {
        *out = strndup(resp ? resp : "", rl);
    }
    vt->free_buffer(inst, resp);
    return st;
}

static const char *err_code(const char *body) {
    static char code[64];
    json_t *v = json_loads(body, 0, NULL);
    snprintf(code, sizeof code, "%s", json_string_value(json_object_get(json_object_get(v, "error"), "code")) ?: "");
    if (v) json_decref(v);
    return code;
}

static void test_host_rules(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    CHECK(d != NULL);
    if (!d) return;
    void *inst;
    const arl_env_vtable *vt;
    arl_env_host_config hc = {.max_sessions = 3};
    CHECK(arl_env_host_open(d, NULL, &hc, &inst, &vt) == ARL_OK);
    const char *create = "{\"trajectory_id\":\"a/1\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},"
                         "\"deadline_ms\":5000}";
    char *b1, *b2, *b;
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL, create, &b1), 201);
    /* the same request with another deadline is a repeat: 200 with identical bytes */
    const char *create2 = "{\"group_id\":\"a\",\"deadline_ms\":9,\"task\":{\"data\":{\"x\":null},\"seed\":1,\"id\":\"t\"},"
                          "\"trajectory_id\":\"a/1\",\"options\":null}";
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL, create2, &b2), 200);
    CHECK_STR_EQ(b1, b2);
    free(b2);
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/1\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":2,\"data\":{}},"
                       "\"deadline_ms\":5000}", &b), 409);
    CHECK_STR_EQ(err_code(b), "TRAJECTORY_CONFLICT");
    free(b);
    /* options {} is not an absent options */
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/1\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},"
                       "\"options\":{},\"deadline_ms\":5000}", &b), 409);
    free(b);
    json_t *v = json_loads(b1, 0, NULL);
    char sid[64];
    snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(v, "session_id")));
    json_decref(v);
    free(b1);

    /* schema and syntax */
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, "{\"step_index\":1,", &b), 400);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, "{\"step_index\":1,\"step_index\":1}", &b), 400);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, "{\"action\":{\"parse_status\":\"no_tool_call\"},\"deadline_ms\":1000}", &b), 422);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "step", "nope", "{}", &b), 404);
    CHECK_STR_EQ(err_code(b), "UNKNOWN_SESSION");
    free(b);
    /* parse_status disagreeing with the lists is a 422 (§4.5) */
    CHECK_EQ_INT(vcall(vt, inst, "step", sid,
                       "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"ok\",\"tool_calls\":[]}}", &b), 422);
    free(b);

    const char *s1 = "{\"step_index\":1,\"deadline_ms\":1000,\"x\":1,\"action\":{\"parse_status\":\"ok\",\"y\":2,"
                     "\"tool_calls\":[{\"id\":\"call_1_0\",\"name\":\"echo\",\"arguments\":{\"text\":\"a\"}}]}}";
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, s1, &b1), 200);
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, s1, &b2), 200); /* retry: identical bytes */
    CHECK_STR_EQ(b1, b2);
    free(b1);
    free(b2);
    const char *s1b = "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"no_tool_call\"}}";
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, s1b, &b), 409);
    CHECK_STR_EQ(err_code(b), "STEP_CONFLICT");
    free(b);
    const char *s3 = "{\"step_index\":3,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"no_tool_call\"}}";
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, s3, &b), 409);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, "{\"step_index\":0,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"no_tool_call\"}}", &b), 409);
    free(b);

    /* score keys */
    const char *sg = "{\"scope\":\"segment\",\"segment_index\":0,\"step_range\":[1,1],\"deadline_ms\":1000}";
    CHECK_EQ_INT(vcall(vt, inst, "score", sid, sg, &b1), 200);
    CHECK_EQ_INT(vcall(vt, inst, "score", sid, sg, &b2), 200);
    CHECK_STR_EQ(b1, b2);
    free(b1);
    free(b2);
    CHECK_EQ_INT(vcall(vt, inst, "score", sid, "{\"scope\":\"segment\",\"segment_index\":0,\"step_range\":[1,2],\"deadline_ms\":1000}", &b), 409);
    CHECK_STR_EQ(err_code(b), "SCORE_CONFLICT");
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "score", sid, "{\"scope\":\"segment\",\"segment_index\":1,\"step_range\":[2,5],\"deadline_ms\":1000}", &b), 422);
    free(b);

    /* fork rules: a step not applied yet, a repeat, a conflicting reuse */
    CHECK_EQ_INT(vcall(vt, inst, "fork", sid, "{\"trajectory_id\":\"a/1#fork1\",\"group_id\":\"f\",\"at_step_index\":2,\"deadline_ms\":1000}", &b), 409);
    CHECK_STR_EQ(err_code(b), "STEP_CONFLICT");
    free(b);
    const char *fk = "{\"trajectory_id\":\"a/1#fork1\",\"group_id\":\"f\",\"at_step_index\":0,\"deadline_ms\":1000}";
    CHECK_EQ_INT(vcall(vt, inst, "fork", sid, fk, &b1), 201); /* fork_past: step 0 */
    CHECK_EQ_INT(vcall(vt, inst, "fork", sid, fk, &b2), 200);
    CHECK_STR_EQ(b1, b2);
    free(b2);
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/1#fork1\",\"group_id\":\"f\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},"
                       "\"deadline_ms\":5000}", &b), 409);
    free(b);
    /* capacity: 3 sessions max (a/1, a/1#fork1, one more) */
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/2\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},\"deadline_ms\":5000}", &b), 201);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/3\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},\"deadline_ms\":5000}", &b), 503);
    CHECK_STR_EQ(err_code(b), "CAPACITY_REACHED");
    free(b);
    /* the child replays the parent's create response at step 0?  Step 1 on the child applies anew */
    v = json_loads(b1, 0, NULL);
    char csid[64];
    snprintf(csid, sizeof csid, "%s", json_string_value(json_object_get(v, "session_id")));
    json_decref(v);
    free(b1);
    CHECK_EQ_INT(vcall(vt, inst, "step", csid, s1, &b), 200);
    free(b);
    /* task data the environment cannot use: 422 */
    vt->close(inst, csid, "completed");
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"a/4\",\"group_id\":\"a\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{\"reject\":true}},"
                       "\"deadline_ms\":5000}", &b), 422);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "get", csid, NULL, &b), 410);
    free(b);
    vt->close(inst, csid, "again"); /* idempotent */
    vt->close(inst, "never-existed", NULL);
    vt->destroy_instance(inst);
}

static void test_tool_args(void) {
    json_t *a;
    char msg[512];
    CHECK_EQ_INT(arl_env_tool_args_parse("{\"q\": 1}", 8, &a, msg, sizeof msg), ARL_ENV_PARSE_OK);
    if (a) json_decref(a);
    CHECK_EQ_INT(arl_env_tool_args_parse("[1]", 3, &a, msg, sizeof msg), ARL_ENV_PARSE_ARGUMENTS_NOT_OBJECT);
    CHECK(a == NULL);
    CHECK_EQ_INT(arl_env_tool_args_parse("{\"q\": 1", 7, &a, msg, sizeof msg), ARL_ENV_PARSE_INVALID_JSON);
    CHECK(strlen(msg) > 0);
    CHECK_EQ_INT(arl_env_tool_args_parse("{\"q\":1,\"q\":2}", 13, &a, msg, sizeof msg), ARL_ENV_PARSE_INVALID_JSON);
    CHECK_EQ_INT(arl_env_tool_args_parse("{\"q\":NaN}", 9, &a, msg, sizeof msg), ARL_ENV_PARSE_INVALID_JSON);
    CHECK_EQ_INT(arl_env_tool_args_parse("\xff", 1, &a, msg, sizeof msg), ARL_ENV_PARSE_INVALID_JSON);
    char deep[64];
    int n = 0;
    for (int i = 0; i < 25; i++) deep[n++] = '[';
    for (int i = 0; i < 25; i++) deep[n++] = ']';
    CHECK_EQ_INT(arl_env_tool_args_parse(deep, (size_t)n, &a, msg, sizeof msg), ARL_ENV_PARSE_MALFORMED_STRUCTURE);
    /* 24 levels are fine (an object containing 23 nested arrays) */
    n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = 'k';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int i = 0; i < 23; i++) deep[n++] = '[';
    for (int i = 0; i < 23; i++) deep[n++] = ']';
    deep[n++] = '}';
    CHECK_EQ_INT(arl_env_tool_args_parse(deep, (size_t)n, &a, msg, sizeof msg), ARL_ENV_PARSE_OK);
    if (a) json_decref(a);

    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1,"
                                "\"maximum\":5},\"s\":{\"type\":\"string\",\"enum\":[\"a\",\"b\"]}},\"required\":[\"n\"],"
                                "\"additionalProperties\":false}", 0, NULL);
    json_t *ok = json_loads("{\"n\":3,\"s\":\"a\"}", 0, NULL);
    json_t *bad1 = json_loads("{\"s\":\"a\"}", 0, NULL);
    json_t *bad2 = json_loads("{\"n\":9}", 0, NULL);
    json_t *bad3 = json_loads("{\"n\":2,\"z\":1}", 0, NULL);
    json_t *bad4 = json_loads("{\"n\":2,\"s\":\"c\"}", 0, NULL);
    CHECK(arl_env_args_validate(schema, ok, msg, sizeof msg));
    CHECK(!arl_env_args_validate(schema, bad1, msg, sizeof msg));
    /* the root is "/" (a calculator call without arguments read "calc: : missing ...") */
    CHECK_STR_EQ(msg, "/: missing required property 'n'");
    json_t *arr = json_array();
    CHECK(!arl_env_args_validate(schema, arr, msg, sizeof msg));
    CHECK_STR_EQ(msg, "/: expected object, got array");
    json_decref(arr);
    CHECK(!arl_env_args_validate(schema, bad2, msg, sizeof msg));
    CHECK(!arl_env_args_validate(schema, bad3, msg, sizeof msg));
    CHECK(!arl_env_args_validate(schema, bad4, msg, sizeof msg));
    /* a string argument holding U+0000: the environment would read the text before it */
    json_t *bad5 = json_loads("{\"n\":2,\"s\":\"a\\u0000b\"}", JSON_ALLOW_NUL, NULL);
    json_t *bad6 = json_loads("{\"n\":2,\"x\":[\"\\u0000\"]}", JSON_ALLOW_NUL, NULL);
    json_t *open = json_loads("{\"type\":\"object\"}", 0, NULL);
    CHECK(bad5 && bad6 && open);
    CHECK(!arl_env_args_validate(schema, bad5, msg, sizeof msg));
    CHECK_STR_EQ(msg, "/s: contains U+0000");
    CHECK(!arl_env_args_validate(open, bad6, msg, sizeof msg)); /* checked without a schema too */
    CHECK_STR_EQ(msg, "/x/0: contains U+0000");
    json_decref(bad5);
    json_decref(bad6);
    json_decref(open);
    json_decref(schema);
    json_decref(ok);
    json_decref(bad1);
    json_decref(bad2);
    json_decref(bad3);
    json_decref(bad4);
}

static void test_json_helpers(void) {
    /* canonical base64: padding bits must be zero; no whitespace */
    uint8_t *d;
    size_t n;
    CHECK_EQ_INT(aep_b64_decode_canonical("QQ==", 4, &d, &n), 0);
    CHECK_EQ_INT(n, 1);
    free(d);
    CHECK_EQ_INT(aep_b64_decode_canonical("QR==", 4, &d, &n), -1);
    CHECK_EQ_INT(aep_b64_decode_canonical("QQ=", 3, &d, &n), -1);
    CHECK_EQ_INT(aep_b64_decode_canonical("Q Q=", 4, &d, &n), -1);
    CHECK_EQ_INT(aep_b64_decode_canonical("QUJD", 4, &d, &n), 0);
    CHECK(n == 3 && !memcmp(d, "ABC", 3));
    free(d);
    size_t el;
    char *enc = aep_b64_encode((const uint8_t *)"AB", 2, &el);
    CHECK_STR_EQ(enc, "QUI=");
    free(enc);
    /* SHA-256 of "abc" (FIPS 180-2 example) */
    char hex[65];
    aep_sha256_hex("abc", 3, hex);
    CHECK_STR_EQ(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    aep_sha256_hex("", 0, hex);
    CHECK_STR_EQ(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* identity: member order, null == absent at every depth, {} != absent, 1 == 1.0 */
    json_t *a = json_loads("{\"a\":1,\"b\":{\"c\":null,\"d\":[1,2]}}", 0, NULL);
    json_t *b = json_loads("{\"b\":{\"d\":[1,2.0]},\"a\":1,\"e\":null}", 0, NULL);
    json_t *c = json_loads("{\"a\":1,\"b\":{\"d\":[1,2]},\"e\":{}}", 0, NULL);
    CHECK(aep_json_ident_equal(a, b));
    CHECK(!aep_json_ident_equal(a, c));
    json_decref(a);
    json_decref(b);
    json_decref(c);
    /* member spans */
    const char *body = "{\"x\": [1, {\"a\": \"}\"}], \"observation\" : {\"k\": \"v\"} }";
    size_t off, len;
    CHECK(aep_json_member_span(body, strlen(body), "observation", &off, &len));
    CHECK_EQ_INT(len, strlen("{\"k\": \"v\"}"));
    CHECK(!aep_json_member_span(body, strlen(body), "info", &off, &len));
    CHECK(aep_utf8_valid("h\xc3\xa9", 3));
    CHECK(!aep_utf8_valid("\xed\xa0\x80", 3)); /* a surrogate */
    CHECK(!aep_utf8_valid("\xc3", 1));
}


/* ---- the response validator on crafted bodies (§12.3, §4.2, §4.8) ---- */

static arl_env_errcode classify(const arl_env_info *info, arl_env_endpoint ep, int status, const char *body) {
    static const char *const calls[] = {"call_1_0"};
    aep_expect x = {.endpoint = ep, .info = info, .step_index = 1, .call_ids = calls, .n_call_ids = 1,
                    .scope = ARL_ENV_SCOPE_EPISODE};
    arl_env_error e;
    memset(&e, 0, sizeof e);
    arl_env_result r;
    arl_env_score_result sr;
    memset(&r, 0, sizeof r);
    memset(&sr, 0, sizeof sr);
    aep_response_parse(&x, status, "application/json", body, strlen(body), &e, &r, &sr, NULL, NULL, NULL);
    arl_env_errcode c = e.code;
    arl_env_error_clear(&e);
    arl_env_result_clear(&r);
    arl_env_score_result_clear(&sr);
    return c;
}

#define STEP_PRE "{\"step_index\":1,\"reward\":0,\"terminated\":false,\"truncated\":false,\"observation\":"
#define TOOL_OK "{\"role\":\"tool\",\"tool_call_id\":\"call_1_0\",\"content\":\"ok\"}"
/* a 1x1 greyscale PNG, canonical base64 */
#define PNG1 "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="

static void test_validator(void) {
    arl_env_info mm, plain;
    const char *i1 = "{\"protocol\":\"aep/1\",\"protocol_revision\":0,\"env\":{\"name\":\"v\",\"version\":\"1.0.0\"},\"tools\":[],"
                     "\"reward_levels\":{\"process\":{\"range\":[-1,1]},\"outcome\":{\"range\":[0,1]}},"
                     "\"reward_components\":[{\"name\":\"p\",\"level\":\"process\",\"range\":[0,0.5]},"
                     "{\"name\":\"o\",\"level\":\"outcome\",\"range\":[0,1]}],"
                     "\"capabilities\":{\"multimodal\":true},\"limits\":{}}";
    const char *i2 = "{\"protocol\":\"aep/1\",\"protocol_revision\":0,\"env\":{\"name\":\"v\",\"version\":\"1.0.0\"},\"tools\":[],"
                     "\"reward_levels\":{\"outcome\":{\"range\":[0,1]}},\"reward_components\":[],\"capabilities\":{},"
                     "\"limits\":{}}";
    CHECK(arl_env_info_parse(i1, strlen(i1), &mm) == ARL_OK);
    CHECK(arl_env_info_parse(i2, strlen(i2), &plain) == ARL_OK);
    const char *good = STEP_PRE "{\"context\":\"append\",\"messages\":[" TOOL_OK "]}}";
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, good), ARL_ENV_E_NONE);
    const char *img = STEP_PRE "{\"context\":\"append\",\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"call_1_0\","
                               "\"content\":[{\"type\":\"image\",\"image\":{\"format\":\"png\",\"width\":1,\"height\":1,"
                               "\"data\":\"" PNG1 "\"}}]}]}}";
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, img), ARL_ENV_E_NONE);
    CHECK_EQ_INT(classify(&plain, ARL_ENV_EP_STEP, 200, img), ARL_ENV_E_MALFORMED_RESPONSE); /* no multimodal */
    const char *img_dims = STEP_PRE "{\"context\":\"append\",\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"call_1_0\","
                                    "\"content\":[{\"type\":\"image\",\"image\":{\"format\":\"png\",\"width\":2,\"height\":1,"
                                    "\"data\":\"" PNG1 "\"}}]}]}}";
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, img_dims), ARL_ENV_E_MALFORMED_RESPONSE); /* IHDR mismatch */
    const char *img_b64 = STEP_PRE "{\"context\":\"append\",\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"call_1_0\","
                                   "\"content\":[{\"type\":\"image\",\"image\":{\"format\":\"png\",\"width\":1,\"height\":1,"
                                   "\"data\":\"iVBORw0KGgo AAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg==\"}}]}]}}";
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, img_b64), ARL_ENV_E_MALFORMED_RESPONSE); /* whitespace */
    const char *user_img_in_assistant = "{\"session_id\":\"s\",\"trajectory_id\":\"t\",\"step_index\":0,\"observation\":"
                                        "{\"context\":\"reset\",\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":"
                                        "\"image\",\"image\":{\"format\":\"png\",\"width\":1,\"height\":1,\"data\":\"" PNG1
                                        "\"}}]}]}}";
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_CREATE, 201, user_img_in_assistant), ARL_ENV_E_MALFORMED_RESPONSE);
    CHECK_EQ_INT(classify(&plain, ARL_ENV_EP_STEP, 200,
                          STEP_PRE "{\"context\":\"reset\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* reset without context_reset */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200,
                          STEP_PRE "{\"context\":\"append\",\"tools\":[],\"messages\":[" TOOL_OK "]}}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* tools in append */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, STEP_PRE "{\"context\":\"append\",\"messages\":[]}}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* empty, not terminal (and the call unanswered) */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200,
                          STEP_PRE "{\"context\":\"append\",\"messages\":[" TOOL_OK "," TOOL_OK "]}}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* duplicate tool_call_id */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200,
                          "{\"step_index\":1,\"reward\":0,\"reward_components\":{\"o\":1},\"terminated\":false,"
                          "\"truncated\":false,\"observation\":{\"context\":\"append\",\"messages\":[" TOOL_OK "]}}"),
                 ARL_ENV_E_REWARD_OUT_OF_RANGE); /* an outcome component in a step */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200,
                          "{\"step_index\":1,\"reward\":0,\"reward_components\":{\"p\":0.75},\"terminated\":false,"
                          "\"truncated\":false,\"observation\":{\"context\":\"append\",\"messages\":[" TOOL_OK "]}}"),
                 ARL_ENV_E_REWARD_OUT_OF_RANGE); /* component outside its own range */
    CHECK_EQ_INT(classify(&plain, ARL_ENV_EP_STEP, 200,
                          "{\"step_index\":1,\"reward\":0.5,\"terminated\":false,\"truncated\":false,\"observation\":"
                          "{\"context\":\"append\",\"messages\":[" TOOL_OK "]}}"),
                 ARL_ENV_E_REWARD_OUT_OF_RANGE); /* non-zero reward at an undeclared level */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200,
                          "{\"step_index\":1,\"terminated\":false,\"truncated\":false,\"observation\":"
                          "{\"context\":\"append\",\"messages\":[" TOOL_OK "]}}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* reward missing */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_SCORE, 200, "{\"scope\":\"episode\",\"scorable\":true}"),
                 ARL_ENV_E_MALFORMED_RESPONSE); /* scorable without reward */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_SCORE, 200, "{\"scope\":\"episode\",\"scorable\":false,\"reward\":null}"),
                 ARL_ENV_E_NONE);
    /* info over 64 KiB, measured as sent (whitespace counts) */
    size_t n = 70000;
    char *big = malloc(n + 400);
    int k = snprintf(big, 400, STEP_PRE "{\"context\":\"append\",\"messages\":[" TOOL_OK "]},\"info\":{\"a\":\"");
    memset(big + k, 'x', n);
    strcpy(big + k + n, "\"}}");
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, big), ARL_ENV_E_RESPONSE_TOO_LARGE);
    free(big);
    /* 4097 messages */
    size_t cap = 4200 * 40 + 200;
    char *many = malloc(cap);
    size_t m = (size_t)snprintf(many, cap, STEP_PRE "{\"context\":\"append\",\"messages\":[" TOOL_OK);
    for (int i = 0; i < 4096; i++) m += (size_t)snprintf(many + m, cap - m, ",{\"role\":\"user\",\"content\":\"\"}");
    snprintf(many + m, cap - m, "]}}");
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 200, many), ARL_ENV_E_RESPONSE_TOO_LARGE);
    free(many);
    /* envelopes: known code, unknown code (acts on what is sent), invalid envelope */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 409,
                          "{\"error\":{\"code\":\"EPISODE_ENDED\",\"message\":\"\",\"retryable\":false,\"attribution\":\"client\"}}"),
                 ARL_ENV_E_EPISODE_ENDED);
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 503,
                          "{\"error\":{\"code\":\"CAPACITY_REACHED\",\"message\":\"\",\"retryable\":true,\"attribution\":\"env\"}}"),
                 ARL_ENV_E_ENV_INTERNAL); /* retryable 503 without retry_after_ms: no valid envelope */
    CHECK_EQ_INT(classify(&mm, ARL_ENV_EP_STEP, 422, "{\"error\":\"bad\"}"), ARL_ENV_E_MALFORMED_RESPONSE);
    arl_env_info_clear(&mm);
    arl_env_info_clear(&plain);
}

/* ---- without parallel_tool_calls the host answers later calls with TOOL_CALL_LIMIT ---- */

static arl_status one_reset(void *inst, const arl_env_reset_req *req, void **state, arl_env_result *out) {
    (void)inst;
    (void)req;
    *state = NULL;
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    return arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, "go");
}
static arl_status one_step(void *inst, void *state, const arl_env_step_req *req, arl_env_result *out) {
    (void)inst;
    (void)state;
    out->obs.context = ARL_ENV_CONTEXT_APPEND;
    CHECK_EQ_INT(req->action->n_tool_calls <= 1, 1);
    for (int32_t i = 0; i < req->action->n_tool_calls; i++)
        ARL_TRY(arl_env_obs_add_tool(&out->obs, req->action->tool_calls[i].id, "done", NULL));
    ARL_TRY(arl_env_obs_answer_parse_errors(&out->obs, req->action));
    if (out->obs.n_messages == 0) ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, "?"));
    return ARL_OK;
}
static arl_status one_score(void *inst, void *state, const arl_env_score_req *req, arl_env_score_result *out) {
    (void)inst;
    (void)state;
    (void)req;
    out->scorable = 0;
    return ARL_OK;
}
static void one_free(void *inst, void *state) {
    (void)inst;
    (void)state;
}
static const arl_env_ops one_ops = {.thread_safety = 0, .reset = one_reset, .step = one_step, .score = one_score,
                                    .free_state = one_free};
static const arl_env_def one_def = {
    .name = "one-call",
    .version = "1.0.0",
    .description = "one tool call per turn",
    .info_json = "{\"tools\":[],\"reward_levels\":{\"outcome\":{\"range\":[0,1]}},\"reward_components\":[],"
                 "\"capabilities\":{\"parallel_tool_calls\":false},\"limits\":{\"max_steps\":2}}",
    .ops = &one_ops,
};

static void test_call_limit_and_max_steps(void) {
    CHECK(arl_env_builtin_register(&one_def) == ARL_OK);
    arl_env_client *c;
    CHECK(arl_env_client_open(NULL, &c) == ARL_OK);
    arl_env *e = NULL;
    CHECK(arl_env_open(c, "builtin:one-call", NULL, &e) == ARL_OK);
    if (!e) return;
    arl_env_create_req cr = {.trajectory_id = "o/1", .group_id = "o", .task = {.id = "t", .seed = 0}};
    arl_env_session *s = NULL;
    CHECK(arl_env_session_create(e, &cr, &s) == ARL_OK);
    arl_env_action a = {0};
    make_call(&a, "call_1_0", "x", "{}");
    make_call(&a, "call_1_1", "y", "{}");
    make_call(&a, "call_1_2", "z", "{}");
    CHECK(arl_env_session_step(s, &a, 0) == ARL_OK);
    const arl_env_call *cl = arl_env_session_call(s);
    CHECK_EQ_INT(cl->result.obs.n_messages, 3);
    if (cl->result.obs.n_messages == 3) {
        CHECK(!cl->result.obs.messages[0].is_error);
        CHECK_STR_EQ(cl->result.obs.messages[1].error_code, "TOOL_CALL_LIMIT");
        CHECK_STR_EQ(cl->result.obs.messages[2].tool_call_id, "call_1_2");
    }
    CHECK(!cl->result.truncated);
    arl_env_action_clear(&a);
    arl_env_action_set_parse_status(&a); /* a plain-text turn */
    /* limits.max_steps 2: step 2 is truncated by the host */
    CHECK(arl_env_session_step(s, &a, 0) == ARL_OK);
    CHECK(arl_env_session_call(s)->result.truncated);
    CHECK(arl_env_session_ended(s));
    arl_env_session_free(s);
    arl_env_free(e);
    arl_env_client_close(c);
}

/* Bytes the allocator has handed out (glibc); 0 where unknown, which passes the bounds below. */
static long long heap_bytes(void) {
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    return (long long)(mi.uordblks + mi.hblkhd);
#else
    return 0;
#endif
}

static char *sid_of(const char *body) {
    json_t *v = json_loads(body, 0, NULL);
    char *s = strdup(json_string_value(json_object_get(v, "session_id")) ?: "");
    if (v) json_decref(v);
    return s;
}

/* Closed sessions: repeats of a deleted creation still get 410 (identical identity, compared
 * through a digest) or 409 (another identity), and of a deleted fork 410 or 409; a deleted
 * session keeps neither its task data nor its responses; max_closed_sessions forgets the
 * oldest (404 then); and the session tables do not grow while sessions come and go. */
static void test_closed_sessions(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    void *inst;
    const arl_env_vtable *vt;
    arl_env_host_config hc = {.max_closed_sessions = 8};
    CHECK(arl_env_host_open(d, NULL, &hc, &inst, &vt) == ARL_OK);
    char *b, *b1;
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"c/"
                       "1\",\"group_id\":\"c\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":"
                       "{\"q\":2.0,\"l\":[1,{\"a\":1,\"b\":null}]}},\"options\":{\"max_steps\":5},"
                       "\"deadline_ms\":5000}",
                       &b1),
                 201);
    char *sid1 = sid_of(b1);
    free(b1);
    CHECK_EQ_INT(vcall(vt, inst, "fork", sid1,
                       "{\"trajectory_id\":\"c/"
                       "1#fork1\",\"group_id\":\"f\",\"at_step_index\":0,\"deadline_ms\":1000}",
                       &b1),
                 201);
    char *fsid = sid_of(b1);
    free(b1);
    vt->close(inst, fsid, "completed");
    vt->close(inst, sid1, "completed");
    /* the same identity, written otherwise (§10.1): 410 */
    CHECK_EQ_INT(
        vcall(vt, inst, "reset", NULL,
              "{\"deadline_ms\":1,\"options\":{\"max_steps\":5,\"x\":null},\"trajectory_id\":\"c/"
              "1\",\"group_id\":"
              "\"c\",\"task\":{\"seed\":1,\"data\":{\"l\":[1.0,{\"a\":1}],\"q\":2},\"id\":\"t\"}}",
              &b),
        410);
    CHECK_STR_EQ(err_code(b), "SESSION_CLOSED");
    free(b);
    /* another identity: 409, whether the change is in task data, seed or options */
    const char *other[] = {
        "{\"trajectory_id\":\"c/"
        "1\",\"group_id\":\"c\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{\"q\":2.5,"
        "\"l\":[1,{\"a\":1}]}},\"options\":{\"max_steps\":5},\"deadline_ms\":5000}",
        "{\"trajectory_id\":\"c/"
        "1\",\"group_id\":\"c\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{\"q\":2,"
        "\"l\":[1,{\"a\":1},null]}},\"options\":{\"max_steps\":5},\"deadline_ms\":5000}",
        "{\"trajectory_id\":\"c/"
        "1\",\"group_id\":\"c\",\"task\":{\"id\":\"t\",\"seed\":2,\"data\":{\"q\":2,"
        "\"l\":[1,{\"a\":1}]}},\"options\":{\"max_steps\":5},\"deadline_ms\":5000}",
        "{\"trajectory_id\":\"c/"
        "1\",\"group_id\":\"c\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{\"q\":2,"
        "\"l\":[1,{\"a\":1}]}},\"deadline_ms\":5000}",
    };
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(vcall(vt, inst, "reset", NULL, other[i], &b), 409);
        CHECK_STR_EQ(err_code(b), "TRAJECTORY_CONFLICT");
        free(b);
    }
    /* a deleted fork: its repeat 410, a creation under its id 409 */
    CHECK_EQ_INT(vcall(vt, inst, "fork", sid1,
                       "{\"trajectory_id\":\"c/"
                       "1#fork1\",\"group_id\":\"f\",\"at_step_index\":0,\"deadline_ms\":1000}",
                       &b),
                 410);
    free(b);
    CHECK_EQ_INT(
        vcall(vt, inst, "reset", NULL,
              "{\"trajectory_id\":\"c/"
              "1#fork1\",\"group_id\":\"f\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},"
              "\"deadline_ms\":5000}",
              &b),
        409);
    free(b);

    /* task data is not kept once deleted (by a host that remembers 65536 closed sessions): 200
     * sessions with 64 KiB of data each stay far below the 12.5 MiB their data alone would take
     * (the bound leaves room for allocator slack) */
    void *inst2;
    const arl_env_vtable *vt2;
    CHECK(arl_env_host_open(d, NULL, NULL, &inst2, &vt2) == ARL_OK);
    size_t big = 64 << 10;
    char *body = malloc(big + 256);
    char *pad = malloc(big + 1);
    memset(pad, 'x', big);
    pad[big] = 0;
    long long h0 = heap_bytes();
    for (int i = 0; i < 200; i++) {
        snprintf(
            body, big + 256,
            "{\"trajectory_id\":\"big/%d\",\"group_id\":\"g\",\"task\":{\"id\":\"t\",\"seed\":1,"
            "\"data\":{\"p\":\"%s\"}},\"deadline_ms\":5000}",
            i, pad);
        CHECK_EQ_INT(vcall(vt2, inst2, "reset", NULL, body, &b), 201);
        char *sid = sid_of(b);
        free(b);
        vt2->close(inst2, sid, "completed");
        free(sid);
    }
    long long grown = heap_bytes() - h0;
    CHECK_MSG(grown < (2 << 20),
              "200 deleted sessions with 64 KiB of task data grew the heap by %lld bytes", grown);
    free(pad);
    free(body);
    vt2->destroy_instance(inst2);

    /* churn: the tables do not grow with the number of sessions ever created (their deleted
     * slots were counted as load and doubled the tables on every rehash: about 2 MiB here) */
    char last[64] = "";
    long long h1 = 0;
    for (int i = 0; i < 30000; i++) {
        char cr[200];
        snprintf(cr, sizeof cr,
                 "{\"trajectory_id\":\"n/%d\",\"group_id\":\"g\",\"task\":{\"id\":\"t\",\"seed\":1,"
                 "\"data\":{}},\"deadline_ms\":5000}",
                 i);
        char *resp = NULL;
        size_t rl = 0;
        int st = vt->reset(inst, cr, strlen(cr), &resp, &rl);
        if (st != 201) {
            CHECK_EQ_INT(st, 201);
            vt->free_buffer(inst, resp);
            break;
        }
        json_t *v = json_loadb(resp, rl, 0, NULL);
        snprintf(last, sizeof last, "%s", json_string_value(json_object_get(v, "session_id")));
        json_decref(v);
        vt->free_buffer(inst, resp);
        vt->close(inst, last, "completed");
        if (i == 2000) h1 = heap_bytes();
    }
    grown = heap_bytes() - h1;
    CHECK_MSG(grown < (256 << 10), "28000 created and deleted sessions grew the heap by %lld bytes",
              grown);
    /* only the last 8 closed sessions are remembered: the first is forgotten (404) */
    CHECK_EQ_INT(vcall(vt, inst, "get", sid1, NULL, &b), 404);
    free(b);
    CHECK_EQ_INT(vcall(vt, inst, "get", last, NULL, &b), 410); /* recent: still remembered */
    CHECK_STR_EQ(err_code(b), "SESSION_CLOSED");
    free(b);
    free(sid1);
    free(fsid);
    vt->destroy_instance(inst);
}

/* Any number of tool calls is a model fault answered 200 (§4.6, §9 rule 1): the host checked
 * its own response against the first 512 ids only and answered 500 ENV_INTERNAL beyond. */
static void test_many_calls(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    void *inst;
    const arl_env_vtable *vt;
    CHECK(arl_env_host_open(d, NULL, NULL, &inst, &vt) == ARL_OK);
    char *b;
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL,
                       "{\"trajectory_id\":\"m/"
                       "1\",\"group_id\":\"m\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},"
                       "\"deadline_ms\":5000}",
                       &b),
                 201);
    char *sid = sid_of(b);
    free(b);
    enum { NCALLS = 600, NERRS = 520 };
    size_t cap = (NCALLS + NERRS) * 128 + 256, n = 0;
    char *body = malloc(cap);
    n += (size_t)snprintf(body + n, cap - n,
                          "{\"step_index\":1,\"deadline_ms\":5000,\"action\":{\"parse_status\":"
                          "\"invalid_json\",\"tool_calls\":[");
    for (int i = 0; i < NCALLS; i++)
        n += (size_t)snprintf(
            body + n, cap - n,
            "%s{\"id\":\"call_1_%d\",\"name\":\"echo\",\"arguments\":{\"text\":\"x\"}}",
            i ? "," : "", i);
    n += (size_t)snprintf(body + n, cap - n, "],\"parse_errors\":[");
    for (int i = 0; i < NERRS; i++)
        n += (size_t)snprintf(body + n, cap - n,
                              "%s{\"id\":\"call_1_%d\",\"status\":\"invalid_json\"}", i ? "," : "",
                              NCALLS + i);
    snprintf(body + n, cap - n, "]}}");
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, body, &b), 200);
    json_t *v = json_loads(b, 0, NULL);
    CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(v, "observation"), "messages")),
                 NCALLS + NERRS);
    if (v) json_decref(v);
    free(b);
    free(body);
    free(sid);
    vt->destroy_instance(inst);
}

/* A step body with n calls of `name` with arguments args_json (every call the same). */
static char *many_calls_body(int n, const char *name, const char *args_json) {
    size_t cap = (size_t)n * (strlen(args_json) + strlen(name) + 64) + 256, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(
        b + len, cap - len,
        "{\"step_index\":1,\"deadline_ms\":5000,\"action\":{\"parse_status\":\"ok\","
        "\"tool_calls\":[");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(b + len, cap - len,
                                "%s{\"id\":\"call_1_%d\",\"name\":\"%s\",\"arguments\":%s}",
                                i ? "," : "", i, name, args_json);
    snprintf(b + len, cap - len, "]}}");
    return b;
}

/* Serialised size of the observation member of a step response. */
static size_t obs_bytes(const char *body) {
    size_t off = 0, len = 0;
    CHECK(aep_json_member_span(body, strlen(body), "observation", &off, &len));
    return len;
}

/* Create a session of an open host (trajectory traj, task seed 1); returns its id. */
static char *open_session(const arl_env_vtable *vt, void *inst, const char *traj) {
    char req[256], *b = NULL;
    snprintf(req, sizeof req,
             "{\"trajectory_id\":\"%s\",\"group_id\":\"g\",\"task\":{\"id\":\"t\",\"seed\":1,"
             "\"data\":{}},"
             "\"deadline_ms\":5000}",
             traj);
    CHECK_EQ_INT(vcall(vt, inst, "reset", NULL, req, &b), 201);
    char *sid = sid_of(b);
    free(b);
    return sid;
}

/* The observation budget (spec/aep.md 9 rule 1, 12.1): many calls or long outputs are a model
 * fault, answered 200 with an observation within limits.max_observation_bytes, byte-identical
 * for the same action; only an action whose shortest answer cannot fit gets an error, and then
 * X_OBSERVATION_TOO_LARGE (env, not retryable), never ENV_INTERNAL.  (Before: 500
 * ENV_INTERNAL "produced an invalid response (RESPONSE_TOO_LARGE)".) */
static void test_observation_budget(void) {
    /* calculator (64 KiB observations): 500 calls; past its 4 calls per turn they are answered
     * TOOL_CALL_LIMIT; the last of those lose their text */
    const arl_env_def *d = arl_env_builtin_find("calculator");
    CHECK(d != NULL);
    if (!d) return;
    void *inst;
    const arl_env_vtable *vt;
    CHECK(arl_env_host_open(d, NULL, NULL, &inst, &vt) == ARL_OK);
    char *body = many_calls_body(500, "calc", "{\"expression\":\"1+1\"}");
    char *sid = open_session(vt, inst, "b/1"), *sid2 = open_session(vt, inst, "b/2"), *r1 = NULL,
         *r2 = NULL;
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, body, &r1), 200);
    CHECK(obs_bytes(r1) <= 65536);
    json_t *v = json_loads(r1, 0, NULL);
    json_t *msgs = json_object_get(json_object_get(v, "observation"), "messages");
    CHECK_EQ_INT(json_array_size(msgs), 500);
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        char id[32];
        snprintf(id, sizeof id, "call_1_%zu", i);
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(msgs, i), "tool_call_id")),
                     id);
    }
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), "2");
    json_t *m4 = json_array_get(msgs, 4), *last = json_array_get(msgs, 499);
    CHECK_STR_EQ(json_string_value(json_object_get(m4, "content")),
                 "Not run: at most 4 tool calls per turn.");
    CHECK_STR_EQ(json_string_value(json_object_get(last, "content")), "");
    CHECK_STR_EQ(json_string_value(json_object_get(last, "error_code")), "TOOL_CALL_LIMIT");
    CHECK_CLOSE(json_real_value(json_object_get(json_object_get(v, "reward_components"), "format")),
                -0.5, 0, 0);
    if (v) json_decref(v);
    /* deterministic: another session, the same action, the same bytes; a repeat too */
    CHECK_EQ_INT(vcall(vt, inst, "step", sid2, body, &r2), 200);
    CHECK_STR_EQ(r1, r2);
    free(r2);
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, body, &r2), 200);
    CHECK_STR_EQ(r1, r2);
    free(r2);
    free(r1);
    free(body);
    free(sid);
    free(sid2);
    /* 1000 calls: not even one empty message per call fits */
    body = many_calls_body(1000, "calc", "{\"expression\":\"1+1\"}");
    sid = open_session(vt, inst, "b/3");
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, body, &r1), 500);
    CHECK_STR_EQ(err_code(r1), "X_OBSERVATION_TOO_LARGE");
    CHECK(strstr(r1, "1000 tool calls") && strstr(r1, "65536"));
    v = json_loads(r1, 0, NULL);
    json_t *e = json_object_get(v, "error");
    CHECK(json_is_false(json_object_get(e, "retryable")));
    CHECK_STR_EQ(json_string_value(json_object_get(e, "attribution")), "env");
    if (v) json_decref(v);
    free(r1);
    free(body);
    free(sid);
    vt->destroy_instance(inst);

    /* echo (1 MiB observations): 24 outputs of 60000 bytes are cut to a common size, at a
     * character boundary, with the marker and output_truncated / original_bytes */
    d = arl_env_builtin_find("echo");
    CHECK(arl_env_host_open(d, NULL, NULL, &inst, &vt) == ARL_OK);
    enum { NTEXT = 60000 };
    char *args = malloc(NTEXT * 2 + 64);
    size_t al = (size_t)sprintf(args, "{\"text\":\"");
    for (int i = 0; i < NTEXT / 6; i++) { /* 6 bytes: "ab\u00e9\"" = a b é(2) " */
        memcpy(args + al, "ab\xc3\xa9\\\"", 6);
        al += 6;
    }
    sprintf(args + al, "\"}");
    /* the first call echoes a short text, the others the long one */
    body = many_calls_body(24, "echo", args);
    char *p = strstr(body, args);
    CHECK(p != NULL);
    memmove(p + 12, p + strlen(args), strlen(p + strlen(args)) + 1);
    memcpy(p, "{\"text\":\"x\"}", 12);
    sid = open_session(vt, inst, "e/1");
    sid2 = open_session(vt, inst, "e/2");
    CHECK_EQ_INT(vcall(vt, inst, "step", sid, body, &r1), 200);
    CHECK(obs_bytes(r1) <= 1048576);
    CHECK(obs_bytes(r1) > 1048576 - 24 * 8); /* cut no more than needed */
    CHECK_EQ_INT(vcall(vt, inst, "step", sid2, body, &r2), 200);
    CHECK_STR_EQ(r1, r2);
    free(r2);
    v = json_loads(r1, 0, NULL);
    CHECK(v != NULL);
    msgs = json_object_get(json_object_get(v, "observation"), "messages");
    CHECK_EQ_INT(json_array_size(msgs), 24);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), "x");
    CHECK(!json_object_get(json_array_get(msgs, 0), "output_truncated"));
    size_t kept = 0;
    for (size_t i = 1; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *c = json_string_value(json_object_get(m, "content"));
        size_t n = c ? strlen(c) : 0;
        CHECK(n > 14 && !strcmp(c + n - 14, "...[truncated]"));
        CHECK(n > 1000 && n < NTEXT / 6 * 5);
        if (i == 1) kept = n;
        CHECK_EQ_INT(n, kept); /* one common cap */
        CHECK(json_is_true(json_object_get(m, "output_truncated")));
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "original_bytes")), NTEXT / 6 * 5);
    }
    if (v) json_decref(v);
    free(r1);
    free(body);
    free(args);
    free(sid);
    free(sid2);
    vt->destroy_instance(inst);
}

/* Strings with U+0000 ("\u0000", which jansson keeps): identifiers and closed-set values are
 * refused with 422 like any other bad value (a task id "t\u0000x" was accepted as "t"); a
 * tool name with one is an unknown tool (a model fault, 200), not the tool before the NUL. */
static void test_nul_strings(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    void *inst;
    const arl_env_vtable *vt;
    CHECK(arl_env_host_open(d, NULL, NULL, &inst, &vt) == ARL_OK);
    char *b;
    static const char *const bad_creates[] = {
        "{\"trajectory_id\":\"n/"
        "1\",\"group_id\":\"n\",\"task\":{\"id\":\"t\\u0000x\",\"seed\":1,\"data\":{}},\"deadline_"
        "ms\":5000}",
        "{\"trajectory_id\":\"n/"
        "1\",\"group_id\":\"n\",\"task\":{\"id\":\"\\u0000\",\"seed\":1,\"data\":{}},\"deadline_"
        "ms\":5000}",
        "{\"trajectory_id\":\"n/"
        "1\\u0000\",\"group_id\":\"n\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},\"deadline_"
        "ms\":5000}",
        "{\"trajectory_id\":\"n/"
        "1\",\"group_id\":\"n\\u0000x\",\"task\":{\"id\":\"t\",\"seed\":1,\"data\":{}},\"deadline_"
        "ms\":5000}",
    };
    for (size_t i = 0; i < sizeof bad_creates / sizeof *bad_creates; i++) {
        CHECK_EQ_INT(vcall(vt, inst, "reset", NULL, bad_creates[i], &b), 422);
        CHECK_STR_EQ(err_code(b), "VALIDATION_ERROR");
        if (i < 2) CHECK(strstr(b, "/task/id") != NULL);
        free(b);
    }
    char *sid = open_session(vt, inst, "n/2");
    static const char *const bad_steps[] = {
        "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"ok\",\"tool_calls\":"
        "[{\"id\":\"call_1_0\\u0000x\",\"name\":\"echo\",\"arguments\":{}}]}}",
        "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"invalid_json\","
        "\"parse_errors\":[{\"id\":\"c\\u0000\",\"status\":\"invalid_json\"}]}}",
        "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"no_tool_"
        "call\\u0000\"}}",
        "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"no_tool_call\","
        "\"finish_reason\":\"stop\\u0000x\"}}",
        "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"invalid_json\","
        "\"parse_errors\":[{\"id\":\"c\",\"status\":\"invalid_json\\u0000\"}]}}",
    };
    for (size_t i = 0; i < sizeof bad_steps / sizeof *bad_steps; i++) {
        CHECK_EQ_INT(vcall(vt, inst, "step", sid, bad_steps[i], &b), 422);
        CHECK_STR_EQ(err_code(b), "VALIDATION_ERROR");
        free(b);
    }
    CHECK_EQ_INT(vcall(vt, inst, "step", sid,
                       "{\"step_index\":1,\"deadline_ms\":1000,\"action\":{\"parse_status\":\"ok\","
                       "\"content\":\"a\\u0000b\","
                       "\"tool_calls\":[{\"id\":\"call_1_0\",\"name\":\"echo\\u0000x\","
                       "\"arguments\":{\"text\":\"hi\"}}]}}",
                       &b),
                 200);
    json_t *v = json_loads(b, 0, NULL);
    json_t *m = json_array_get(json_object_get(json_object_get(v, "observation"), "messages"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(m, "error_code")), "TOOL_NOT_FOUND");
    CHECK(strstr(json_string_value(json_object_get(m, "content")) ?: "", "echo\xef\xbf\xbdx") !=
          NULL);
    if (v) json_decref(v);
    free(b);
    CHECK_EQ_INT(
        vcall(vt, inst, "score", sid,
              "{\"scope\":\"episode\\u0000\",\"reason\":\"terminated\",\"deadline_ms\":1000}", &b),
        422);
    free(b);
    CHECK_EQ_INT(
        vcall(vt, inst, "score", sid,
              "{\"scope\":\"episode\",\"reason\":\"terminated\\u0000x\",\"deadline_ms\":1000}", &b),
        422);
    free(b);
    CHECK_EQ_INT(
        vcall(vt, inst, "fork", sid,
              "{\"trajectory_id\":\"n/"
              "2#fork1\\u0000\",\"group_id\":\"f\",\"at_step_index\":1,\"deadline_ms\":1000}",
              &b),
        422);
    free(b);
    free(sid);
    vt->destroy_instance(inst);
}

/* A configuration that is not a JSON object is refused also by an environment that takes no
 * configuration (`env serve echo --config '{bad'` was silently accepted). */
static void test_config_checked(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    CHECK_EQ_INT(arl_env_host_open(d, "{\"x\":", NULL, &inst, &vt), ARL_ERR_CONFIG);
    CHECK(inst == NULL);
    CHECK_EQ_INT(arl_env_host_open(d, "[1]", NULL, &inst, &vt), ARL_ERR_CONFIG);
    CHECK_EQ_INT(arl_env_host_open(d, "{\"x\":1}", NULL, &inst, &vt), ARL_OK);
    if (inst) vt->destroy_instance(inst);
}

int main(void) {
    TEST_RUN(test_lifecycle);
    TEST_RUN(test_host_rules);
    TEST_RUN(test_tool_args);
    TEST_RUN(test_json_helpers);
    TEST_RUN(test_validator);
    TEST_RUN(test_call_limit_and_max_steps);
    TEST_RUN(test_closed_sessions);
    TEST_RUN(test_many_calls);
    TEST_RUN(test_observation_budget);
    TEST_RUN(test_nul_strings);
    TEST_RUN(test_config_checked);
    return test_finish();
}
