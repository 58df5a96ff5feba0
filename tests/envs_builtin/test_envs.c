/* tests/envs_builtin/test_envs.c: the built-in environments through their callbacks:
 * /info descriptions, determinism per seed, each tool including malformed input (the
 * model-attributed tool errors of spec/aep.md 4.6-4.7), process/segment/outcome rewards and
 * their declared ranges, fork independence, and teacher success rates. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/calc_eval.h"
#include "tests/envs_builtin/drive.h"
#include "tests/envs_builtin/png_decode.h"
#include "tests/test.h"

static const char *const env_names[] = {"calculator", "needle", "kvstore", "shapes"};
#define NENVS 4

/* Declared range of a component or level from the def's info_json. */
static void declared(const arl_env_def *def, const char *comp, double *lo, double *hi) {
    json_t *info = json_loads(def->info_json, 0, NULL);
    size_t i;
    json_t *c;
    *lo = NAN, *hi = NAN;
    json_array_foreach(json_object_get(info, "reward_components"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "name")), comp)) continue;
        *lo = json_number_value(json_array_get(json_object_get(c, "range"), 0));
        *hi = json_number_value(json_array_get(json_object_get(c, "range"), 1));
    }
    json_t *lv = json_object_get(json_object_get(info, "reward_levels"), comp);
    if (lv) {
        *lo = json_number_value(json_array_get(json_object_get(lv, "range"), 0));
        *hi = json_number_value(json_array_get(json_object_get(lv, "range"), 1));
    }
    json_decref(info);
}

/* Every process reward and component of the last step lies in its declared range. */
static void check_ranges(const drv *d) {
    double lo, hi;
    declared(d->b->def, "process", &lo, &hi);
    CHECK_MSG(d->last.reward >= lo - 1e-12 && d->last.reward <= hi + 1e-12,
              "%s: process reward %g outside [%g, %g]", d->b->def->name, d->last.reward, lo, hi);
    for (int32_t i = 0; i < d->last.n_components; i++) {
        declared(d->b->def, d->last.components[i].name, &lo, &hi);
        double v = d->last.components[i].value;
        CHECK_MSG(v >= lo - 1e-12 && v <= hi + 1e-12, "%s: %s = %g outside [%g, %g]",
                  d->b->def->name, d->last.components[i].name, v, lo, hi);
    }
}

/* ---- /info ---- */

static void test_info(void) {
    for (int e = 0; e < NENVS; e++) {
        const arl_builtin *b = arl_builtin_find(env_names[e]);
        CHECK(b != NULL);
        if (!b) continue;
        CHECK(arl_env_builtin_find(env_names[e]) == b->def);
        json_t *info = json_loads(b->def->info_json, 0, NULL);
        CHECK_MSG(info != NULL, "%s: info_json is not JSON", env_names[e]);
        json_object_set_new(info, "protocol", json_string("aep/1"));
        json_object_set_new(info, "protocol_revision", json_integer(0));
        json_object_set_new(info, "env",
                            json_pack("{s:s, s:s, s:s}", "name", b->def->name, "version",
                                      b->def->version, "description", b->def->description));
        char *body = json_dumps(info, JSON_COMPACT);
        arl_env_info parsed;
        memset(&parsed, 0, sizeof parsed);
        arl_status s = arl_env_info_parse(body, strlen(body), &parsed);
        CHECK_MSG(s == ARL_OK, "%s: /info invalid: %s", env_names[e], arl_error_msg());
        CHECK(parsed.caps.fork && parsed.caps.deterministic_replay);
        CHECK(parsed.level_declared[ARL_ENV_LEVEL_OUTCOME]);
        CHECK_EQ_INT(parsed.caps.multimodal, !strcmp(env_names[e], "shapes"));
        arl_env_info_clear(&parsed);
        free(body);
        json_decref(info);
        /* a configuration with members is refused: built-ins take settings per task */
        json_t *cfg = json_pack("{s:i}", "x", 1);
        void *inst = NULL;
        CHECK_EQ_INT(b->def->ops->instance_create(cfg, &inst), ARL_ERR_CONFIG);
        json_decref(cfg);
    }
    CHECK(arl_builtin_find("nope") == NULL);
}

/* ---- determinism ---- */

static void test_determinism(void) {
    static const char *const opts[NENVS] = {"{\"level\": 3}", "{\"doc_tokens\": 4000}",
                                            "{\"failure_rate\": 0.4}", "{\"size\": 56}"};
    for (int e = 0; e < NENVS; e++) {
        for (uint64_t seed = 0; seed < 6; seed++) {
            char *t1 = NULL, *t2 = NULL, *t3 = NULL;
            double o1 = drv_teacher_episode(env_names[e], seed, NULL, opts[e], &t1, NULL);
            double o2 = drv_teacher_episode(env_names[e], seed, NULL, opts[e], &t2, NULL);
            double o3 = drv_teacher_episode(env_names[e], seed + 1000, NULL, opts[e], &t3, NULL);
            CHECK(o1 == o2 && o1 == 1 && o3 == 1);
            CHECK_MSG(t1 && t2 && !strcmp(t1, t2), "%s seed %llu: transcripts differ", env_names[e],
                      (unsigned long long)seed);
            CHECK_MSG(t1 && t3 && strcmp(t1, t3), "%s seeds %llu and %llu: same transcript",
                      env_names[e], (unsigned long long)seed, (unsigned long long)seed + 1000);
            free(t1);
            free(t2);
            free(t3);
        }
        /* task.data overrides options and is part of the task */
        drv a, b;
        CHECK_EQ_INT(drv_open(&a, env_names[e], 5, NULL, NULL), ARL_OK);
        CHECK_EQ_INT(drv_open(&b, env_names[e], 5, "{}", "{}"), ARL_OK);
        char *da = drv_last_dump(&a), *db = drv_last_dump(&b);
        CHECK_STR_EQ(da, db);
        free(da);
        free(db);
        drv_close(&a);
        drv_close(&b);
    }
}

/* ---- teachers ---- */

static void teacher_rate(const char *env, const char *options, int n, uint64_t seed0) {
    int ok = 0;
    int64_t steps = 0, total = 0;
    for (int i = 0; i < n; i++) {
        double o = drv_teacher_episode(env, seed0 + (uint64_t)i, NULL, options, NULL, &steps);
        total += steps;
        if (o == 1.0)
            ok++;
        else
            fprintf(stderr, "%s %s seed %llu: outcome %g\n", env, options ? options : "",
                    (unsigned long long)(seed0 + (uint64_t)i), o);
    }
    CHECK_MSG(ok == n, "%s %s: teacher succeeded %d/%d", env, options ? options : "", ok, n);
    fprintf(stderr, "  teacher %-10s %-40s %d/%d, %.2f steps/episode\n", env,
            options ? options : "{}", ok, n, (double)total / n);
}

static void test_teachers(void) {
    for (int level = 1; level <= 5; level++) {
        char o[32];
        snprintf(o, sizeof o, "{\"level\": %d}", level);
        teacher_rate("calculator", o, 200, 1);
    }
    teacher_rate("needle", NULL, 30, 1);
    teacher_rate("needle", "{\"hops\": 2}", 30, 1);
    teacher_rate("needle", "{\"hops\": 2, \"doc_tokens\": 256, \"distractors\": 64}", 30, 1);
    teacher_rate("needle", "{\"teacher\": \"scan\", \"doc_tokens\": 20000}", 5, 1);
    teacher_rate("needle", "{\"teacher\": \"scan\", \"hops\": 2, \"max_read\": 256}", 5, 1);
    teacher_rate("kvstore", NULL, 200, 1);
    teacher_rate("kvstore", "{\"failure_rate\": 0.9, \"goals\": 4}", 100, 1);
    teacher_rate("kvstore", "{\"failure_rate\": 0, \"goals\": 1}", 50, 1);
    teacher_rate("shapes", NULL, 200, 1);
    teacher_rate("shapes", "{\"size\": 56}", 200, 1);
    static const char *const kinds[] = {"count", "count_color", "color", "shape"};
    for (int k = 0; k < 4; k++) {
        char o[64];
        snprintf(o, sizeof o, "{\"question\": \"%s\"}", kinds[k]);
        teacher_rate("shapes", o, 50, 7);
    }
}

/* ---- calculator ---- */

/* "What is A op B?" -> the expression "A op B" */
static void l1_expr(const drv *d, char *e, size_t n) {
    const char *q = d->last.obs.messages[1].content;
    snprintf(e, n, "%s", q + strlen("What is "));
    e[strlen(e) - 1] = 0;
}

static void test_calculator(void) {
    drv d;
    CHECK_EQ_INT(drv_open(&d, "calculator", 42, NULL, NULL), ARL_OK);
    CHECK_EQ_INT(d.last.obs.context, ARL_ENV_CONTEXT_RESET);
    CHECK_EQ_INT(d.last.obs.n_messages, 2);
    CHECK_EQ_INT(d.last.obs.messages[0].role, ARL_ENV_ROLE_SYSTEM);
    CHECK(!strncmp(d.last.obs.messages[1].content, "What is ", 8));
    CHECK(strlen(d.last.obs.messages[1].content) <= 16); /* level 1 is short */
    char e[64], act[512];
    l1_expr(&d, e, sizeof e);
    double want;
    char msg[128];
    CHECK_EQ_INT(arl_calc_eval(e, strlen(e), &want, msg, sizeof msg), ARL_CALC_OK);

    /* malformed calls: unknown tool, missing argument, extra argument, wrong type, a parse
     * error (answered after the parsed calls), all in one turn */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": ["
                                   "{\"id\": \"c0\", \"name\": \"calculate\", \"arguments\": {}},"
                                   "{\"id\": \"c1\", \"name\": \"calc\", \"arguments\": {}},"
                                   "{\"id\": \"c2\", \"name\": \"calc\", \"arguments\": "
                                   "{\"expression\": \"1+1\", \"x\": 1}},"
                                   "{\"id\": \"c3\", \"name\": \"calc\", \"arguments\": "
                                   "{\"expression\": 5}}],"
                                   "\"parse_errors\": [{\"id\": \"c4\", \"status\": "
                                   "\"invalid_json\"}]}"),
                 ARL_OK);
    CHECK_EQ_INT(d.last.obs.context, ARL_ENV_CONTEXT_APPEND);
    CHECK_EQ_INT(d.last.obs.n_messages, 5);
    const char *ids[] = {"c0", "c1", "c2", "c3", "c4"};
    const char *codes[] = {"TOOL_NOT_FOUND", "TOOL_ARGS_INVALID", "TOOL_ARGS_INVALID",
                           "TOOL_ARGS_INVALID", "TOOL_PARSE_ERROR"};
    for (int i = 0; i < 5 && i < d.last.obs.n_messages; i++) {
        CHECK_EQ_INT(d.last.obs.messages[i].role, ARL_ENV_ROLE_TOOL);
        CHECK_STR_EQ(d.last.obs.messages[i].tool_call_id, ids[i]);
        CHECK_STR_EQ(drv_code(&d, i), codes[i]);
    }
    CHECK(strstr(drv_text(&d, 0), "Available tools: calc, answer") != NULL);
    /* the whole text: no doubled colon ("calc: : missing ...") for a problem at the root */
    CHECK_STR_EQ(drv_text(&d, 1),
                 "Invalid arguments for calc: /: missing required property 'expression'.");
    CHECK_STR_EQ(drv_text(&d, 2), "Invalid arguments for calc: /x: property not allowed.");
    CHECK_STR_EQ(drv_text(&d, 3),
                 "Invalid arguments for calc: /expression: expected string, got integer.");
    CHECK_CLOSE(drv_component(&d, "format"), -0.5, 1e-12, 0);
    CHECK_CLOSE(d.last.reward, -0.5, 1e-12, 0);
    CHECK(!d.last.terminated && !d.last.truncated);
    check_ranges(&d);

    /* plain text turn: a user nudge and a penalty */
    CHECK_EQ_INT(drv_step_json(&d, "{\"content\": \"12\"}"), ARL_OK);
    CHECK_EQ_INT(d.last.obs.n_messages, 1);
    CHECK_EQ_INT(d.last.obs.messages[0].role, ARL_ENV_ROLE_USER);
    CHECK_CLOSE(d.last.reward, -0.1, 1e-12, 0);
    /* cut off turn */
    CHECK_EQ_INT(drv_step_json(&d, "{\"content\": \"I will\", \"finish_reason\": \"length\"}"),
                 ARL_OK);
    CHECK(strstr(drv_text(&d, 0), "cut off") != NULL);

    /* calc errors are runtime errors with clear messages */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": ["
                                   "{\"id\": \"a\", \"name\": \"calc\", \"arguments\": "
                                   "{\"expression\": \"1/0\"}},"
                                   "{\"id\": \"b\", \"name\": \"calc\", \"arguments\": "
                                   "{\"expression\": \"2 +* 3\"}}]}"),
                 ARL_OK);
    CHECK_STR_EQ(drv_code(&d, 0), "TOOL_RUNTIME_ERROR");
    CHECK(strstr(drv_text(&d, 0), "division by zero") != NULL);
    CHECK_STR_EQ(drv_code(&d, 1), "TOOL_RUNTIME_ERROR");
    CHECK(strstr(drv_text(&d, 1), "syntax error at character 4") != NULL);
    CHECK_CLOSE(d.last.reward, -0.2, 1e-12, 0);

    /* a good calc, then a non-numeric answer (not terminal), then the right answer */
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"c\", \"name\": \"calc\", "
             "\"arguments\": {\"expression\": \"%s\"}}]}",
             e);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    char wt[32];
    arl_bi_format_number(want, wt, sizeof wt);
    CHECK_STR_EQ(drv_text(&d, 0), wt);
    CHECK_STR_EQ(drv_code(&d, 0), "");
    CHECK_CLOSE(d.last.reward, 0, 1e-12, 0);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"x\", \"name\": \"answer\", "
                                   "\"arguments\": {\"value\": \"twelve\"}}]}"),
                 ARL_OK);
    CHECK_STR_EQ(drv_code(&d, 0), "TOOL_ARGS_INVALID");
    CHECK(!d.last.terminated);
    /* the answer as a JSON number is accepted; a second call in the turn is not run */
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"y\", \"name\": \"answer\", "
             "\"arguments\": {\"value\": %s}}, {\"id\": \"z\", \"name\": "
             "\"calc\", \"arguments\": {\"expression\": \"1\"}}]}",
             wt);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    CHECK(d.last.terminated && !d.last.truncated);
    CHECK_STR_EQ(drv_text(&d, 0), "Answer recorded.");
    CHECK_STR_EQ(drv_code(&d, 1), "TOOL_CALL_LIMIT");
    /* the answer used the calc result only if the result is not a number of the problem */
    check_ranges(&d);
    CHECK_CLOSE(drv_outcome(&d), 1, 0, 0);
    drv_close(&d);

    /* a wrong answer scores 0; a session that never answers scores 0 */
    CHECK_EQ_INT(drv_open(&d, "calculator", 42, NULL, NULL), ARL_OK);
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"y\", \"name\": \"answer\", "
             "\"arguments\": {\"value\": \"%g\"}}]}",
             want + 1);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    CHECK(d.last.terminated);
    CHECK_CLOSE(drv_outcome(&d), 0, 0, 0);
    drv_close(&d);
    CHECK_EQ_INT(drv_open(&d, "calculator", 42, NULL, "{\"max_steps\": 2}"), ARL_OK);
    CHECK_EQ_INT(drv_step_json(&d, "{\"content\": \"hm\"}"), ARL_OK);
    CHECK_CLOSE(drv_outcome(&d), 0, 0, 0);
    drv_close(&d);

    /* too many calls in one turn */
    CHECK_EQ_INT(drv_open(&d, "calculator", 1, NULL, NULL), ARL_OK);
    CHECK_EQ_INT(
        drv_step_json(
            &d, "{\"tool_calls\": ["
                "{\"id\": \"1\", \"name\": \"calc\", \"arguments\": {\"expression\": \"1+1\"}},"
                "{\"id\": \"2\", \"name\": \"calc\", \"arguments\": {\"expression\": \"1+2\"}},"
                "{\"id\": \"3\", \"name\": \"calc\", \"arguments\": {\"expression\": \"1+3\"}},"
                "{\"id\": \"4\", \"name\": \"calc\", \"arguments\": {\"expression\": \"1+4\"}},"
                "{\"id\": \"5\", \"name\": \"calc\", \"arguments\": {\"expression\": \"1+5\"}}]}"),
        ARL_OK);
    CHECK_EQ_INT(d.last.obs.n_messages, 5);
    CHECK_STR_EQ(drv_code(&d, 3), "");
    CHECK_STR_EQ(drv_code(&d, 4), "TOOL_CALL_LIMIT");
    drv_close(&d);

    /* bad options and task data are ARL_ERR_ARG (the host answers 422) */
    CHECK_EQ_INT(drv_open(&d, "calculator", 1, NULL, "{\"level\": 9}"), ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "options.level") != NULL);
    drv_close(&d);
    CHECK_EQ_INT(drv_open(&d, "calculator", 1, "{\"level\": \"2\"}", NULL), ARL_ERR_ARG);
    drv_close(&d);
    CHECK_EQ_INT(drv_open(&d, "calculator", 1, NULL, "{\"lvl\": 2}"), ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "unknown member 'lvl'") != NULL);
    drv_close(&d);
}

/* Process reward "result_used" and the segment score "progress" on a two-step problem. */
static void test_calculator_rewards(void) {
    drv d;
    CHECK_EQ_INT(drv_open(&d, "calculator", 3, NULL, "{\"level\": 3}"), ARL_OK);
    /* follow the teacher: calc e1, calc e2 (uses e1's result), answer (uses e2's) */
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);
    CHECK_CLOSE(drv_component(&d, "result_used"), 0, 0, 0);
    CHECK_CLOSE(drv_segment(&d, 1, 1), 0.5, 1e-12, 0);
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);
    CHECK_CLOSE(drv_component(&d, "result_used"), 0.1, 1e-12, 0);
    CHECK_CLOSE(drv_segment(&d, 2, 2), 0.5, 1e-12, 0);
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);
    CHECK_CLOSE(drv_component(&d, "result_used"), 0.1, 1e-12, 0);
    CHECK(d.last.terminated);
    check_ranges(&d);
    CHECK_CLOSE(drv_segment(&d, 1, 3), 1, 1e-12, 0);
    CHECK_CLOSE(drv_segment(&d, 3, 3), 0, 1e-12, 0);
    CHECK_CLOSE(drv_outcome(&d), 1, 0, 0);
    drv_close(&d);
    /* a result is credited once, however often it is used (seed 3's first result is not a
     * number of the problem: the test above credits it) */
    CHECK_EQ_INT(drv_open(&d, "calculator", 3, NULL, "{\"level\": 3}"), ARL_OK);
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);
    char r1[32], act[256];
    snprintf(r1, sizeof r1, "%s", drv_text(&d, 0));
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"calc\", "
             "\"arguments\": {\"expression\": \"%s + %s\"}}]}",
             r1, r1);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    CHECK_CLOSE(drv_component(&d, "result_used"), 0.1, 1e-12, 0);
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"calc\", "
             "\"arguments\": {\"expression\": \"%s * 1\"}}]}",
             r1);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    CHECK_CLOSE(drv_component(&d, "result_used"), 0, 0, 0);
    drv_close(&d);
    /* anchors: equal for equal states, different after progress */
    drv a, b;
    CHECK_EQ_INT(drv_open(&a, "calculator", 8, NULL, "{\"level\": 2}"), ARL_OK);
    CHECK_EQ_INT(drv_open(&b, "calculator", 8, NULL, "{\"level\": 2}"), ARL_OK);
    const char *a0 = json_string_value(json_object_get(a.last.info, "anchor"));
    CHECK(a0 && !strncmp(a0, "calculator:", 11));
    char keep[96];
    snprintf(keep, sizeof keep, "%s", a0 ? a0 : "");
    CHECK_EQ_INT(drv_step_json(&a, "{\"content\": \"x\"}"), ARL_OK);
    CHECK_STR_EQ(json_string_value(json_object_get(a.last.info, "anchor")), keep);
    CHECK_EQ_INT(drv_teacher_step(&b), ARL_OK);
    CHECK(strcmp(json_string_value(json_object_get(b.last.info, "anchor")), keep));
    drv_close(&a);
    drv_close(&b);
}

/* Every generated problem has an exact answer equal to its plan's last value, and the
 * levels' questions stay short where they must. */
static void test_calculator_levels(void) {
    for (int level = 1; level <= 5; level++) {
        size_t maxq = 0;
        for (uint64_t seed = 0; seed < 300; seed++) {
            drv d;
            char o[32];
            snprintf(o, sizeof o, "{\"level\": %d}", level);
            CHECK_EQ_INT(drv_open(&d, "calculator", seed, NULL, o), ARL_OK);
            size_t ql = strlen(d.last.obs.messages[1].content);
            if (ql > maxq) maxq = ql;
            json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
            double v;
            CHECK(arl_bi_parse_number(json_string_value(json_object_get(dbg, "expected")), &v));
            CHECK_MSG(v == floor(v * 4) / 4 && v >= 0, "level %d seed %llu: answer %g", level,
                      (unsigned long long)seed, v);
            json_decref(dbg);
            drv_close(&d);
        }
        if (level == 1) CHECK(maxq <= 16);
        fprintf(stderr, "  calculator level %d: longest question %zu bytes\n", level, maxq);
    }
}

/* ---- needle ---- */

static void test_needle(void) {
    drv d;
    CHECK_EQ_INT(drv_open(&d, "needle", 11, NULL, "{\"doc_tokens\": 2000}"), ARL_OK);
    /* read before open */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                                   "\"arguments\": {\"offset\": 0, \"length\": 10}}]}"),
                 ARL_OK);
    CHECK_STR_EQ(drv_code(&d, 0), "TOOL_RUNTIME_ERROR");
    CHECK(strstr(drv_text(&d, 0), "open()") != NULL);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"o\", \"name\": \"open\", "
                                   "\"arguments\": {}}]}"),
                 ARL_OK);
    /* 2000 tokens -> 125 lines of 64 bytes */
    CHECK(strstr(drv_text(&d, 0), "8000 bytes in 125 lines") != NULL);
    CHECK(strstr(drv_text(&d, 0), "offset 7936") != NULL);
    /* the whole document line by line: fixed width, printable, no digits outside facts */
    int facts = 0;
    for (int k = 0; k < 125; k++) {
        char act[256];
        snprintf(act, sizeof act,
                 "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                 "\"arguments\": {\"offset\": %d, \"length\": 64}}]}",
                 64 * k);
        CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
        const char *t = drv_text(&d, 0);
        CHECK_EQ_INT(strlen(t), 64);
        CHECK(t[63] == '\n');
        int digits = 0, ok = 1;
        for (int i = 0; i < 63; i++) {
            if (t[i] >= '0' && t[i] <= '9') digits = 1;
            if (t[i] < 0x20 || t[i] > 0x7e) ok = 0;
        }
        CHECK(ok);
        if (digits) {
            facts++;
            CHECK(!strncmp(t, "The code of vault ", 18));
        }
        if (k == 124) CHECK(!strncmp(t, "QUESTION: What is the code of vault ", 36));
        check_ranges(&d);
    }
    CHECK_EQ_INT(facts, 9); /* the target and 8 distractors */
    /* a read across lines equals the concatenation of the two halves */
    CHECK_EQ_INT(drv_step_json(&d,
                               "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                               "\"arguments\": {\"offset\": 100, \"length\": 200}}, "
                               "{\"id\": \"s\", \"name\": \"read\", \"arguments\": "
                               "{\"offset\": 100, \"length\": 77}}, {\"id\": \"t\", \"name\": "
                               "\"read\", \"arguments\": {\"offset\": 177, \"length\": 123}}]}"),
                 ARL_OK);
    char cat[256];
    snprintf(cat, sizeof cat, "%s%s", drv_text(&d, 1), drv_text(&d, 2));
    CHECK_STR_EQ(drv_text(&d, 0), cat);
    /* end of document, past the end, over max_read */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                                   "\"arguments\": {\"offset\": 7990, \"length\": 100}}, "
                                   "{\"id\": \"s\", \"name\": \"read\", \"arguments\": "
                                   "{\"offset\": 8000, \"length\": 1}}]}"),
                 ARL_OK);
    CHECK_EQ_INT(strlen(drv_text(&d, 0)), 10);
    CHECK(!d.last.obs.messages[0].output_truncated);
    CHECK_STR_EQ(drv_code(&d, 1), "TOOL_RUNTIME_ERROR");
    drv_close(&d);
    CHECK_EQ_INT(drv_open(&d, "needle", 11, NULL, "{\"doc_tokens\": 2000, \"max_read\": 256}"),
                 ARL_OK);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"o\", \"name\": \"open\", "
                                   "\"arguments\": {}}, {\"id\": \"r\", \"name\": \"read\", "
                                   "\"arguments\": {\"offset\": 0, \"length\": 1000}}]}"),
                 ARL_OK);
    CHECK_EQ_INT(strlen(drv_text(&d, 1)), 256);
    CHECK(d.last.obs.messages[1].output_truncated);
    CHECK_EQ_INT(d.last.obs.messages[1].original_bytes, 1000);
    /* search: no match, bad pattern, too long, the key */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"search\", "
                                   "\"arguments\": {\"pattern\": \"NOWHERE\"}}, "
                                   "{\"id\": \"b\", \"name\": \"search\", \"arguments\": "
                                   "{\"pattern\": \"a\\nb\"}}, {\"id\": \"c\", \"name\": "
                                   "\"search\", \"arguments\": {\"pattern\": \"\"}}]}"),
                 ARL_OK);
    CHECK(strstr(drv_text(&d, 0), "No line contains") != NULL);
    CHECK_STR_EQ(drv_code(&d, 1), "TOOL_RUNTIME_ERROR");
    CHECK_STR_EQ(drv_code(&d, 2), "TOOL_ARGS_INVALID");
    /* the teacher from here: read the question, search, answer; rewards for milestones */
    json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
    const char *key = json_string_value(json_object_get(dbg, "key"));
    int code = (int)json_integer_value(json_object_get(dbg, "code"));
    int64_t tline = json_integer_value(json_object_get(dbg, "target_line"));
    CHECK(tline >= 1 && tline <= 1 + 123 / 10); /* far back: the first 10% */
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK); /* read the last line */
    CHECK_CLOSE(drv_component(&d, "found"), 0.1, 1e-12, 0);
    char act[256];
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"s\", \"name\": \"search\", "
             "\"arguments\": {\"pattern\": \"%s\"}}]}",
             key);
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    char want[96];
    snprintf(want, sizeof want, "The code of vault %s is %d.", key, code);
    CHECK(strstr(drv_text(&d, 0), want) != NULL);
    CHECK_CLOSE(drv_component(&d, "found"), 0.2, 1e-12, 0);
    CHECK_CLOSE(drv_segment(&d, 1, d.steps), 1, 1e-12, 0);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"d\", \"name\": \"search\", "
                                   "\"arguments\": {\"pattern\": \"vault\"}}]}"),
                 ARL_OK);
    CHECK(strstr(drv_text(&d, 0), "10 matching lines, the first 5:") != NULL);
    CHECK_CLOSE(drv_component(&d, "found"), 0, 0, 0); /* nothing new */
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);       /* answer */
    CHECK(d.last.terminated);
    CHECK_CLOSE(drv_outcome(&d), 1, 0, 0);
    json_decref(dbg);
    drv_close(&d);
    /* a wrong answer */
    CHECK_EQ_INT(drv_open(&d, "needle", 11, NULL, NULL), ARL_OK);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"answer\", "
                                   "\"arguments\": {\"value\": \"12345\"}}]}"),
                 ARL_OK);
    CHECK(d.last.terminated);
    CHECK_CLOSE(drv_outcome(&d), 0, 0, 0);
    drv_close(&d);
    /* options */
    CHECK_EQ_INT(drv_open(&d, "needle", 1, NULL, "{\"doc_tokens\": 10}"), ARL_ERR_ARG);
    drv_close(&d);
    CHECK_EQ_INT(drv_open(&d, "needle", 1, NULL, "{\"teacher\": \"magic\"}"), ARL_ERR_ARG);
    drv_close(&d);
}

/* ---- kvstore ---- */

static int count_code(const drv *d, const char *code) {
    int n = 0;
    for (int32_t i = 0; i < d->last.obs.n_messages; i++)
        n += d->last.obs.messages[i].is_error && !strcmp(d->last.obs.messages[i].error_code, code);
    return n;
}

static void test_kvstore(void) {
    drv d;
    CHECK_EQ_INT(drv_open(&d, "kvstore", 5, NULL, "{\"failure_rate\": 0}"), ARL_OK);
    CHECK(strstr(d.last.obs.messages[1].content, "Bring the key-value store") != NULL);
    CHECK_EQ_INT(
        drv_step_json(&d,
                      "{\"tool_calls\": ["
                      "{\"id\": \"1\", \"name\": \"list\", \"arguments\": {}},"
                      "{\"id\": \"2\", \"name\": \"get\", \"arguments\": {\"key\": \"nope\"}},"
                      "{\"id\": \"3\", \"name\": \"put\", \"arguments\": {\"key\": \"zz\", "
                      "\"value\": \"v\"}},"
                      "{\"id\": \"4\", \"name\": \"get\", \"arguments\": {\"key\": \"zz\"}},"
                      "{\"id\": \"5\", \"name\": \"delete\", \"arguments\": {\"key\": \"zz\"}},"
                      "{\"id\": \"6\", \"name\": \"delete\", \"arguments\": {\"key\": \"zz\"}},"
                      "{\"id\": \"7\", \"name\": \"list\", \"arguments\": {\"prefix\": \"tmp:\"}},"
                      "{\"id\": \"8\", \"name\": \"put\", \"arguments\": {\"key\": \"zz\"}}]}"),
        ARL_OK);
    CHECK(strstr(drv_text(&d, 0), " keys: ") != NULL);
    CHECK_STR_EQ(drv_code(&d, 1), "TOOL_RUNTIME_ERROR");
    CHECK_STR_EQ(drv_text(&d, 2), "OK");
    CHECK_STR_EQ(drv_text(&d, 3), "v");
    CHECK_STR_EQ(drv_text(&d, 4), "Deleted zz.");
    CHECK_STR_EQ(drv_text(&d, 5), "Key zz did not exist.");
    CHECK(!strncmp(drv_text(&d, 6), "2 keys: tmp:", 12) ||
          !strncmp(drv_text(&d, 6), "3 keys: tmp:", 12));
    CHECK_STR_EQ(drv_code(&d, 7), "TOOL_ARGS_INVALID");
    CHECK_CLOSE(drv_component(&d, "format"), -0.2, 1e-12, 0);
    check_ranges(&d);
    drv_close(&d);

    /* transient failures: never more than two in a row, no effect, recovery rewarded */
    CHECK_EQ_INT(drv_open(&d, "kvstore", 9, NULL, "{\"failure_rate\": 0.9}"), ARL_OK);
    int fails = 0, run = 0, maxrun = 0;
    for (int i = 0; i < 30; i++) {
        CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"put\", "
                                       "\"arguments\": {\"key\": \"k\", \"value\": \"v\"}}]}"),
                     ARL_OK);
        if (count_code(&d, "TOOL_TIMEOUT")) {
            fails++, run++;
            if (run > maxrun) maxrun = run;
            CHECK(strstr(drv_text(&d, 0), "transient") != NULL);
            CHECK_CLOSE(d.last.reward, 0, 1e-12, 0); /* not penalised */
        } else {
            if (run > 0)
                CHECK_CLOSE(drv_component(&d, "recovered"), 0.1, 1e-12, 0);
            else
                CHECK_CLOSE(drv_component(&d, "recovered"), 0, 0, 0);
            run = 0;
        }
        check_ranges(&d);
    }
    CHECK(fails >= 15 && maxrun == 2);
    drv_close(&d);
    /* a failed put has no effect: after each transient failure of put(ki), get(ki) (retried
     * while it fails transiently) finds no key */
    CHECK_EQ_INT(drv_open(&d, "kvstore", 9, NULL, "{\"failure_rate\": 0.6}"), ARL_OK);
    int checked = 0;
    for (int i = 0; i < 20; i++) {
        char act[256];
        snprintf(act, sizeof act,
                 "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"put\", "
                 "\"arguments\": {\"key\": \"k%d\", \"value\": \"v\"}}]}",
                 i);
        CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
        int failed = count_code(&d, "TOOL_TIMEOUT");
        snprintf(act, sizeof act,
                 "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"get\", "
                 "\"arguments\": {\"key\": \"k%d\"}}]}",
                 i);
        do
            CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
        while (count_code(&d, "TOOL_TIMEOUT"));
        CHECK_STR_EQ(drv_code(&d, 0), failed ? "TOOL_RUNTIME_ERROR" : "");
        checked += failed;
    }
    CHECK(checked >= 5);
    drv_close(&d);

    /* the teacher reaches the goal; a collateral change then fails the outcome */
    CHECK_EQ_INT(drv_open(&d, "kvstore", 12, NULL, "{\"failure_rate\": 0}"), ARL_OK);
    double seg_total = 0;
    int64_t start = 1;
    while (!d.ended) {
        arl_env_action a;
        memset(&a, 0, sizeof a);
        CHECK_EQ_INT(d.b->teacher(d.inst, d.state, d.steps + 1, &a), ARL_OK);
        if (!strcmp(a.tool_calls[0].name, "finish")) {
            arl_env_action_clear(&a);
            break;
        }
        CHECK_EQ_INT(drv_step(&d, &a), ARL_OK);
        arl_env_action_clear(&a);
        check_ranges(&d);
        seg_total += drv_segment(&d, start, d.steps);
        start = d.steps + 1;
    }
    CHECK_CLOSE(seg_total, 1, 1e-12, 0); /* segment progress sums to the fraction met */
    CHECK_CLOSE(drv_outcome(&d), 1, 0, 0);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"put\", "
                                   "\"arguments\": {\"key\": \"extra\", \"value\": \"1\"}}, "
                                   "{\"id\": \"2\", \"name\": \"finish\", \"arguments\": {}}]}"),
                 ARL_OK);
    CHECK(d.last.terminated);
    CHECK_CLOSE(drv_outcome(&d), 0, 0, 0);
    drv_close(&d);
    /* undoing a goal gives negative progress */
    CHECK_EQ_INT(drv_open(&d, "kvstore", 12, NULL, "{\"failure_rate\": 0, \"goals\": 1}"), ARL_OK);
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK);
    json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
    CHECK(json_integer_value(json_object_get(dbg, "goals_met")) <= 1);
    json_decref(dbg);
    drv_close(&d);
}

/* ---- shapes ---- */

static void test_shapes(void) {
    for (int size = 28; size <= 56; size += 28) {
        drv d;
        char o[64];
        snprintf(o, sizeof o, "{\"size\": %d, \"question\": \"count\"}", size);
        CHECK_EQ_INT(drv_open(&d, "shapes", 4, NULL, o), ARL_OK);
        const arl_env_message *u = &d.last.obs.messages[1];
        CHECK(u->role == ARL_ENV_ROLE_USER && u->content_is_parts && u->n_parts == 2);
        CHECK_STR_EQ(u->parts[0].text, "How many shapes are in the image?");
        CHECK_EQ_INT(u->parts[1].type, ARL_ENV_PART_IMAGE);
        CHECK_EQ_INT(u->parts[1].image.width, size);
        int w = 0, h = 0;
        uint8_t *rgb = NULL;
        CHECK(png_decode(u->parts[1].image.png, u->parts[1].image.png_len, &w, &h, &rgb));
        CHECK(w == size && h == size);
        int colored = 0;
        for (int i = 0; rgb && i < w * h; i++)
            colored += rgb[3 * i] || rgb[3 * i + 1] || rgb[3 * i + 2];
        CHECK(colored > 20);
        free(rgb);
        /* zoom: a tool message with text and a 2x quadrant image of the same size */
        CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"z\", \"name\": \"zoom\", "
                                       "\"arguments\": {\"quadrant\": \"top_left\"}}, "
                                       "{\"id\": \"y\", \"name\": \"zoom\", \"arguments\": "
                                       "{\"quadrant\": \"middle\"}}]}"),
                     ARL_OK);
        const arl_env_message *t = &d.last.obs.messages[0];
        CHECK(t->role == ARL_ENV_ROLE_TOOL && t->content_is_parts && t->n_parts == 2);
        CHECK_EQ_INT(t->parts[1].image.width, size);
        CHECK_STR_EQ(drv_code(&d, 1), "TOOL_ARGS_INVALID");
        /* answers in words, with articles and punctuation */
        json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
        int n = atoi(json_string_value(json_object_get(dbg, "expected")));
        static const char *const words[] = {"zero", "one", "two", "three", "four", "five", "six"};
        char act[256];
        snprintf(act, sizeof act,
                 "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"answer\", "
                 "\"arguments\": {\"value\": \" %s. \"}}]}",
                 words[n]);
        CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
        CHECK(d.last.terminated);
        CHECK_CLOSE(drv_outcome(&d), 1, 0, 0);
        CHECK_CLOSE(drv_segment(&d, 1, 1), -99, 0, 0); /* not scorable: no segment level */
        json_decref(dbg);
        drv_close(&d);
    }
    /* colour and shape answers */
    for (uint64_t seed = 0; seed < 20; seed++) {
        drv d;
        CHECK_EQ_INT(drv_open(&d, "shapes", seed, NULL, "{\"question\": \"shape\"}"), ARL_OK);
        json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
        const char *exp = json_string_value(json_object_get(dbg, "expected"));
        char act[256];
        if (exp[0] >= 'a' && exp[0] <= 'z') {
            snprintf(act, sizeof act,
                     "{\"tool_calls\": [{\"id\": \"a\", \"name\": \"answer\", "
                     "\"arguments\": {\"value\": \"The %cs\"}}]}",
                     exp[0] - 32);
            /* "The Cs" is wrong on purpose: only the first letter, plural */
            CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
            CHECK_CLOSE(drv_outcome(&d), 0, 0, 0);
        }
        json_decref(dbg);
        drv_close(&d);
    }
    drv d;
    CHECK_EQ_INT(drv_open(&d, "shapes", 1, NULL, "{\"size\": 30}"), ARL_ERR_ARG);
    drv_close(&d);
}

/* ---- fork ---- */

static void test_fork(void) {
    static const char *const opts[NENVS] = {"{\"level\": 5}", "{\"hops\": 2}",
                                            "{\"failure_rate\": 0.3}", "{\"size\": 56}"};
    for (int e = 0; e < NENVS; e++) {
        for (uint64_t seed = 0; seed < 4; seed++) {
            /* reference: the teacher's whole episode */
            char *ref = NULL;
            drv_teacher_episode(env_names[e], seed, NULL, opts[e], &ref, NULL);
            /* parent: one teacher step, fork, then the child runs to the end first */
            drv p, c;
            CHECK_EQ_INT(drv_open(&p, env_names[e], seed, NULL, opts[e]), ARL_OK);
            char *pt = drv_last_dump(&p);
            size_t cap = strlen(ref) + 1024;
            char *ptrans = calloc(1, cap), *ctrans = calloc(1, cap);
            snprintf(ptrans, cap, "%s\n", pt);
            free(pt);
            CHECK_EQ_INT(drv_teacher_step(&p), ARL_OK);
            pt = drv_last_dump(&p);
            strncat(ptrans, pt, cap - strlen(ptrans) - 2);
            strcat(ptrans, "\n");
            free(pt);
            snprintf(ctrans, cap, "%s", ptrans);
            CHECK_EQ_INT(drv_fork(&p, &c), ARL_OK);
            while (!c.ended) {
                if (drv_teacher_step(&c) != ARL_OK) break;
                char *s = drv_last_dump(&c);
                strncat(ctrans, s, cap - strlen(ctrans) - 2);
                strcat(ctrans, "\n");
                free(s);
            }
            double co = drv_outcome(&c);
            while (!p.ended) {
                if (drv_teacher_step(&p) != ARL_OK) break;
                char *s = drv_last_dump(&p);
                strncat(ptrans, s, cap - strlen(ptrans) - 2);
                strcat(ptrans, "\n");
                free(s);
            }
            CHECK_MSG(!strcmp(ptrans, ref), "%s seed %llu: parent differs from a fresh run",
                      env_names[e], (unsigned long long)seed);
            CHECK_MSG(!strcmp(ctrans, ref), "%s seed %llu: child differs from a fresh run",
                      env_names[e], (unsigned long long)seed);
            CHECK_CLOSE(co, 1, 0, 0);
            CHECK_CLOSE(drv_outcome(&p), 1, 0, 0);
            free(ptrans);
            free(ctrans);
            free(ref);
            drv_close_fork(&c);
            drv_close(&p);
        }
    }
    /* a child's change is invisible to the parent */
    drv p, c;
    CHECK_EQ_INT(drv_open(&p, "kvstore", 3, NULL, "{\"failure_rate\": 0}"), ARL_OK);
    CHECK_EQ_INT(drv_fork(&p, &c), ARL_OK);
    CHECK_EQ_INT(drv_step_json(&c, "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"put\", "
                                   "\"arguments\": {\"key\": \"only_child\", \"value\": \"1\"}}]}"),
                 ARL_OK);
    CHECK_EQ_INT(drv_step_json(&p, "{\"tool_calls\": [{\"id\": \"1\", \"name\": \"get\", "
                                   "\"arguments\": {\"key\": \"only_child\"}}]}"),
                 ARL_OK);
    CHECK_STR_EQ(drv_code(&p, 0), "TOOL_RUNTIME_ERROR");
    drv_close_fork(&c);
    drv_close(&p);
}

int main(void) {
    TEST_RUN(test_info);
    TEST_RUN(test_determinism);
    TEST_RUN(test_teachers);
    TEST_RUN(test_calculator);
    TEST_RUN(test_calculator_rewards);
    TEST_RUN(test_calculator_levels);
    TEST_RUN(test_needle);
    TEST_RUN(test_kvstore);
    TEST_RUN(test_shapes);
    TEST_RUN(test_fork);
    return test_finish();
}
