/* tests/rollout/test_envs.c: rollouts with the tiny model against every built-in environment
 * (calculator, needle, kvstore, shapes with images through the vision front end); each store
 * verifies, and every stored action token's behaviour log-probability is recomputed from the
 * cached boundary states under the same checkpoint (the re-scoring check of spec/replay.md
 * 13.6), which also proves the cached states are the states the rollout had (state-cache all:
 * the default, last, deletes a trajectory's states when it ends). */
#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

static void run_env(const char *env, const char *options, int64_t tasks, int64_t G, int64_t L_seg) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-%s", tmp, env);
    arl_rollout_config c;
    char where[64];
    snprintf(where, sizeof where, "builtin:%s", env);
    h_config(&c, where);
    c.tasks = tasks;
    c.group_size = G;
    c.segment_tokens = L_seg;
    if (options) h_set(&c, "env-options", options);
    h_set(&c, "state-cache", "all"); /* the finished trajectories re-score from their states */
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    fprintf(stderr, "%s:\n", env);
    arl_rollout_stats_print(s, stderr);
    CHECK_EQ_INT(s->trajectories, tasks * G);
    CHECK_EQ_INT(s->masked, 0);
    CHECK_EQ_INT(s->complete + s->truncated, tasks * G);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    int64_t from_state = 0;
    for (int64_t i = 0; i < tasks; i++)
        for (int64_t g = 0; g < G; g++) {
            char uid[128];
            snprintf(uid, sizeof uid, "rollout/g%06lld/r%lld", (long long)i, (long long)g);
            from_state += h_rescore_check(st, ckpt, uid);
        }
    CHECK_MSG(from_state > 0, "%s: no segment started from a cached state", env);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* Segment budgets just above each environment's initial context (tool set and prompt), so that
 * token_budget boundaries happen within six short turns. */
static void test_calculator(void) { run_env("calculator", NULL, 2, 2, 1024); }
static void test_needle(void) { run_env("needle", "{\"doc_tokens\": 512, \"max_read\": 256}", 1, 2, 1800); }
static void test_kvstore(void) { run_env("kvstore", NULL, 1, 2, 2048); }
static void test_shapes(void) { run_env("shapes", NULL, 1, 2, 1024); }

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-envs"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_calculator);
    TEST_RUN(test_needle);
    TEST_RUN(test_kvstore);
    TEST_RUN(test_shapes);
    return test_finish();
}
