/* tests/rollout/test_budgets.c: every budget ends or truncates a trajectory with its cause in
 * the store (spec/objective.md 3.2, 4.3; spec/aep.md 9 rule 4, 11.5): the turn budget, the
 * context and trajectory token budgets, the environment's own step limit, the episode wall
 * clock (masked by default, truncated when configured so), and the per-turn token cap
 * (finish_reason length).  Every store verifies. */
#include <jansson.h>

#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];
static int run_no;

/* Run one configuration on calculator; returns the store (caller closes). */
static replay_store *run(arl_rollout_config *c, int64_t want_trajs) {
    char db[700];
    snprintf(db, sizeof db, "%s/db%d", tmp, run_no++);
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    CHECK_EQ_INT(arl_rollout_worker_stats(w)->trajectories, want_trajs);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    return st;
}

static void expect_traj(replay_store *st, const char *uid, const char *status,
                        const char *end_cause, const char *code) {
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    CHECK_MSG(!strcmp(replay_status_name(r.status), status), "%s: status %s, want %s", uid,
              replay_status_name(r.status), status);
    CHECK_MSG(!strcmp(r.end_cause, end_cause), "%s: end_cause %s, want %s", uid, r.end_cause,
              end_cause);
    CHECK_MSG(!strcmp(r.error_code, code), "%s: error_code '%s', want '%s'", uid, r.error_code, code);
    CHECK_MSG(r.n_segments >= 1 && r.n_turns >= 1, "%s: %d segments, %d turns", uid, r.n_segments,
              r.n_turns);
}

static void test_turn_budget_and_length(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.max_turns = 2;
    replay_store *st = run(&c, 2);
    expect_traj(st, "rollout/g000000/r0", "truncated", "turn_budget", "");
    expect_traj(st, "rollout/g000000/r1", "truncated", "turn_budget", "");
    replay_traj_row r;
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "get");
    CHECK_EQ_INT(r.n_turns, 2);
    /* the random tiny policy rarely samples <|end_of_msg|> within 24 tokens: turns end at the
     * cap with finish_reason length (an appended, unsampled <|end_of_msg|> follows them) */
    char path[700];
    snprintf(path, sizeof path, "%s/export.jsonl", tmp);
    FILE *f = fopen(path, "w+");
    replay_filter flt;
    replay_filter_init(&flt);
    replay_export_opts eo = {0};
    int64_t n = 0;
    H_DIE(replay_export(st, &flt, &eo, f, &n), "export");
    rewind(f);
    int lengths = 0;
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(j, "messages"), i, m) {
            const char *fr = json_string_value(json_object_get(m, "finish_reason"));
            lengths += fr && !strcmp(fr, "length");
        }
        json_decref(j);
    }
    fclose(f);
    CHECK(lengths > 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static void test_context_budget(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    c.context_tokens = 1100; /* the initial context is ~700 tokens: two or three turns fit */
    c.trajectory_tokens = 1100;
    replay_store *st = run(&c, 1);
    expect_traj(st, "rollout/g000000/r0", "truncated", "context_budget", "");
    replay_traj_row r;
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "get");
    CHECK(r.n_tokens + c.turn_tokens <= 1100);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* The context budget counts the sampled action tokens too (a bug fixed: the worker's context
 * and stream counters grew only by observations, so a long trajectory of many turns ran past
 * the model's max_context, which the worker sets to context-tokens, and the whole run failed
 * with "the sequence ... would reach N positions").  Many turns of full-length actions (24
 * tokens each) against a budget: the trajectory ends with context_budget, its stored tokens
 * plus one more turn fit, and the worker's token count equals the store's. */
static void test_context_budget_counts_actions(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 2;
    c.max_turns = 1000;
    c.segment_tokens = 1024;
    c.context_tokens = 3000;
    c.trajectory_tokens = 3000;
    c.temperature = 4.0; /* a random policy rarely stops before turn-tokens or answers */
    replay_store *st = run(&c, 2);
    int64_t stored = 0;
    for (int i = 0; i < 2; i++) {
        char uid[64];
        snprintf(uid, sizeof uid, "rollout/g000000/r%d", i);
        replay_traj_row r;
        H_DIE(replay_traj_get(st, uid, &r), uid);
        CHECK_MSG(r.n_tokens + c.turn_tokens <= 3000, "%s: %lld tokens", uid, (long long)r.n_tokens);
        CHECK_MSG(r.n_turns >= 8, "%s: %d turns (the test needs many)", uid, r.n_turns);
        if (!strcmp(r.end_cause, "context_budget")) stored++;
    }
    CHECK_MSG(stored >= 1, "no trajectory reached the context budget");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static void test_env_truncated(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    h_set(&c, "env-options", "{\"max_steps\": 2}");
    replay_store *st = run(&c, 1);
    expect_traj(st, "rollout/g000000/r0", "truncated", "env_truncated", "");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static void test_wall_clock(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    c.wall_clock_s = 0.001;
    replay_store *st = run(&c, 1);
    expect_traj(st, "rollout/g000000/r0", "masked", "wall_clock", "EPISODE_WALL_CLOCK");
    replay_store_close(st);
    c.wall_clock_truncates = 1;
    st = run(&c, 1);
    expect_traj(st, "rollout/g000000/r0", "truncated", "wall_clock", "");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-budgets"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_turn_budget_and_length);
    TEST_RUN(test_context_budget);
    TEST_RUN(test_context_budget_counts_actions);
    TEST_RUN(test_env_truncated);
    TEST_RUN(test_wall_clock);
    return test_finish();
}
