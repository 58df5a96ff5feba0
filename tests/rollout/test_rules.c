/* tests/rollout/test_rules.c: the boundary rules of spec/objective.md 3.2 (rollout/segment.c
 * ro_step_rules), one case per rule and the precedence between them, and the option table's
 * budget checks. */
#include "rollout/internal.h"
#include "tests/test.h"

static const ro_limits L = {.L_seg = 1000, .L_turn = 100, .L_obs = 300, .L_ctx = 5000,
                            .L_traj = 8000, .K_max = 10};

static ro_step_outcome rules(ro_step_facts f) {
    ro_step_outcome o;
    ro_step_rules(&L, &f, &o);
    return o;
}

static void test_rules(void) {
    ro_step_facts base = {.k = 3, .e_len = 50, .obs_tokens = 30, .n_seg = 400, .n_ctx = 2000,
                          .n_total = 3000};
    ro_step_facts f = base;
    ro_step_outcome o = rules(f); /* 7: room left */
    CHECK_EQ_INT(o.kind, RO_APPEND);
    /* 1: episode end wins over everything, terminated over truncated */
    f = base;
    f.terminated = f.truncated = 1;
    f.k = 10;
    f.reset = 1;
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "terminated"));
    f.terminated = 0;
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "env_truncated"));
    /* 2: turn budget */
    f = base;
    f.k = 10;
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "turn_budget"));
    /* wall clock after the turn budget */
    f = base;
    f.wall_expired = 1;
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "wall_clock"));
    /* 3: observation size, append against L_obs, reset against L_seg - L_turn */
    f = base;
    f.obs_tokens = 301;
    o = rules(f);
    CHECK(o.kind == RO_MASK && !strcmp(o.mask_code, "OBSERVATION_TOO_LONG"));
    f.obs_tokens = 300;
    CHECK_EQ_INT(rules(f).kind, RO_APPEND);
    f = base;
    f.reset = 1;
    f.obs_tokens = 5000; /* not the measure of a reset */
    f.e_len = 901;
    CHECK_EQ_INT(rules(f).kind, RO_MASK);
    f.e_len = 900;
    o = rules(f);
    CHECK(o.kind == RO_BOUNDARY && !strcmp(o.boundary_cause, "env_reset") && o.next_fresh);
    /* 5: template break (fresh) */
    f = base;
    f.template_break = 1;
    o = rules(f);
    CHECK(o.kind == RO_BOUNDARY && !strcmp(o.boundary_cause, "template_break") && o.next_fresh);
    /* 6: token budget: n_seg + |e| + L_turn > L_seg */
    f = base;
    f.n_seg = 851; /* 851 + 50 + 100 = 1001 */
    o = rules(f);
    CHECK(o.kind == RO_BOUNDARY && !strcmp(o.boundary_cause, "token_budget") && !o.next_fresh);
    f.n_seg = 850;
    CHECK_EQ_INT(rules(f).kind, RO_APPEND);
    /* 8: context budget discards a boundary of 4-6 */
    f = base;
    f.n_seg = 900;
    f.n_ctx = 4851; /* + 50 + 100 > 5000 */
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "context_budget") && !o.boundary_cause);
    f.n_ctx = 4850;
    CHECK_EQ_INT(rules(f).kind, RO_BOUNDARY);
    f = base;
    f.n_total = 7851; /* trajectory budget */
    o = rules(f);
    CHECK(o.kind == RO_END && !strcmp(o.end_cause, "context_budget"));
    /* a reset restarts the context count: a long context does not end the episode */
    f = base;
    f.reset = 1;
    f.n_ctx = 4990;
    f.e_len = 200;
    CHECK_EQ_INT(rules(f).kind, RO_BOUNDARY);
}

static void test_config_checks(void) {
    arl_rollout_config c;
    CHECK(arl_rollout_config_defaults(&c) == ARL_OK);
    free(c.env);
    c.env = strdup("builtin:calculator");
    CHECK(arl_rollout_config_validate(&c) == ARL_OK);
    c.observation_tokens = c.segment_tokens; /* L_obs + L_turn > L_seg */
    CHECK(arl_rollout_config_validate(&c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "observation-tokens") != NULL);
    c.observation_tokens = 512;
    c.tasks = 0; /* 0 tasks: every line of a task file, and there is none */
    CHECK(arl_rollout_config_validate(&c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "'tasks' must be >= 1") != NULL);
    c.task_file = strdup("tasks.jsonl");
    CHECK(arl_rollout_config_validate(&c) == ARL_OK);
    arl_rollout_config_free(&c);
    /* an experiment file: the "rollout" section, objects for the JSON keys, unknown keys */
    CHECK(arl_rollout_config_defaults(&c) == ARL_OK);
    const char *x = "{\"learner\": {\"lr\": 1}, \"rollout\": {\"env\": \"calculator\", "
                    "\"env_options\": {\"max_steps\": 3}, \"task-data\": {\"level\": 2}, "
                    "\"group_size\": 4}}";
    CHECK(arl_rollout_config_load_json(&c, x, "x.json") == ARL_OK);
    CHECK_STR_EQ(c.env, "calculator");
    CHECK_STR_EQ(c.env_options, "{\"max_steps\":3}");
    CHECK_STR_EQ(c.task_data, "{\"level\":2}");
    CHECK_EQ_INT(c.group_size, 4);
    CHECK(arl_rollout_config_validate(&c) == ARL_OK);
    CHECK(arl_rollout_config_load_json(&c, "{\"rollout\": {\"bogus\": 1}}", "y.json") ==
          ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "bogus") != NULL && strstr(arl_error_msg(), "y.json") != NULL);
    CHECK(arl_rollout_config_load_json(&c, "{\"env_options\": [1]}", "z.json") == ARL_ERR_CONFIG);
    arl_rollout_config_free(&c);
}

int main(void) {
    TEST_RUN(test_rules);
    TEST_RUN(test_config_checks);
    return test_finish();
}
