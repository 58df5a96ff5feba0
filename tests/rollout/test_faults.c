/* tests/rollout/test_faults.c: a rollout against an AEP/1 server that fails in every way of the
 * spec's error tables (spec/aep.md 8.3-8.5, 12; tests/rollout/fault_server.h), one task per
 * failure.  Retryable failures are retried and the trajectory completes; the others mask the
 * trajectory with the code and attribution of the table, keep the evidence (the failing call's
 * row with its code, the steps before it in a partial segment), refill infra-masked slots once,
 * and the run goes on to the end.  The store verifies.  The masks' details name the environment,
 * the step and the violation.  Client-fault alerting (spec/aep.md 8.6): test_alert. */

#include "tests/rollout/fault_server.h"
#include "tests/rollout/helpers.h"

typedef struct expect {
    const char *task;
    const char *status; /* complete / masked */
    const char *code;   /* error_code of a masked trajectory */
    const char *attr;
} expect;

static const expect expected[] = {
    {"ok", "complete", "", ""},
    {"capacity_create", "complete", "", ""},
    {"draining_create", "complete", "", ""},
    {"in_progress_step", "complete", "", ""},
    {"deadline_once", "complete", "", ""},
    {"deadline_twice", "masked", "DEADLINE_EXCEEDED", "env"},
    {"internal_step", "masked", "ENV_INTERNAL", "env"},
    {"sandbox_step", "masked", "SANDBOX_LOST", "infra"},
    {"closed_step", "masked", "SESSION_CLOSED", "env"},
    {"unknown_step", "masked", "UNKNOWN_SESSION", "env"},
    {"validation_step", "masked", "VALIDATION_ERROR", "client"},
    {"conflict_step", "masked", "STEP_CONFLICT", "client"},
    {"ended_step", "masked", "EPISODE_ENDED", "client"},
    {"invalid_create", "masked", "INVALID_REQUEST", "client"},
    {"trajconflict_create", "masked", "TRAJECTORY_CONFLICT", "client"},
    {"payload_step", "masked", "PAYLOAD_TOO_LARGE", "client"},
    {"scoreconflict_episode", "masked", "SCORE_CONFLICT", "client"},
    {"internal_segment", "masked", "ENV_INTERNAL", "env"},
    {"notimpl_segment", "complete", "", ""},
    {"xcode_step", "masked", "X_CUSTOM_FAILURE", "env"},
    {"malformed_step", "masked", "MALFORMED_RESPONSE", "env"},
    {"html500_step", "masked", "ENV_INTERNAL", "env"},
    {"reward_step", "masked", "REWARD_OUT_OF_RANGE", "env"},
    {"huge_step", "masked", "RESPONSE_TOO_LARGE", "env"},
    {"longobs_step", "masked", "OBSERVATION_TOO_LONG", "env"},
    {"transport_step", "masked", "TRANSPORT_ERROR", "infra"},
    {"undeclared_step", "complete", "", ""}, /* stored, one warning (spec/aep.md 4.8 rule 4) */
};
#define N_EXPECTED (sizeof expected / sizeof expected[0])

static char ckpt[600], tmp[512];

/* The error_detail_json of trajectory uid in the worker file at path (malloc'ed; NULL: none). */
static char *detail_of(const char *path, const char *uid) {
    return h_sql_text(path, "SELECT error_detail_json FROM trajectories WHERE traj_uid = ?1", uid);
}

static void test_faults(void) {
    CHECK_EQ_INT(N_EXPECTED, FSRV_N_SCENARIOS);
    char tasks[700], db[700], url[64];
    snprintf(tasks, sizeof tasks, "%s/tasks.jsonl", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    FILE *f = fopen(tasks, "w");
    for (size_t i = 0; i < N_EXPECTED; i++)
        fprintf(f, "{\"id\": \"%s\", \"seed\": %zu, \"data\": {}}\n", expected[i].task, i);
    fclose(f);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", fsrv.srv.port);
    arl_rollout_config c;
    h_config(&c, url);
    h_set(&c, "task-file", tasks);
    c.tasks = 0;
    c.group_size = 1;
    c.turn_tokens = 16;
    c.observation_tokens = 256;
    c.segment_tokens = 400;
    c.max_turns = 5;
    c.batch_size = 8;
    c.env_backoff_ms = 5;
    c.alert_masked_frac = 1; /* every scenario runs: no client-fault alert (test_alert) */
    c.alert_client_codes = 200;
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    /* the run's log, to count the warnings */
    char logp[800];
    snprintf(logp, sizeof logp, "%s/faults.log", tmp);
    const int saved = test_stderr_to(logp);
    const arl_status rs = arl_rollout_worker_run(w);
    static char logbuf[1 << 20];
    /* the undeclared component: stored, and one warning for the three steps that send it */
    const int warnings =
        test_stderr_restore(saved, logp, logbuf, sizeof logbuf, "reward component 'mystery'");
    H_DIE(rs, "run");
    CHECK_EQ_INT(warnings, 1);
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    arl_rollout_stats_print(s, stderr);
    /* every task once, plus one refill for each of the two infra-masked slots */
    CHECK_EQ_INT(s->trajectories, N_EXPECTED + 2);
    arl_rollout_worker_close(w);
    for (size_t i = 0; i < N_EXPECTED; i++) {
        const expect *x = &expected[i];
        for (int attempt = 0; attempt < 2; attempt++) {
            char uid[128];
            snprintf(uid, sizeof uid, attempt ? "rollout/g%06zu/r0.a1" : "rollout/g%06zu/r0", i);
            replay_traj_row r;
            arl_status q = replay_traj_get(st, uid, &r);
            int want = attempt == 0 || !strcmp(x->attr, "infra");
            CHECK_MSG((q == ARL_OK) == want, "%s: %s", uid, want ? "missing" : "unexpected refill");
            if (q != ARL_OK) continue;
            CHECK_MSG(!strcmp(replay_status_name(r.status), x->status), "%s (%s): status %s, want %s",
                      uid, x->task, replay_status_name(r.status), x->status);
            CHECK_MSG(!strcmp(r.error_code, x->code), "%s (%s): code '%s', want '%s'", uid, x->task,
                      r.error_code, x->code);
            CHECK_MSG(!strcmp(r.error_attribution, x->attr), "%s (%s): attribution '%s', want '%s'",
                      uid, x->task, r.error_attribution, x->attr);
            /* failures after creation keep the steps before them in a partial segment */
            if (!strcmp(x->status, "masked") && strstr(x->task, "_create") == NULL)
                CHECK_MSG(r.n_segments >= 1, "%s (%s): masked without its partial segment", uid,
                          x->task);
        }
    }
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    /* the mask's detail (spec/aep.md 12.2 item 3): the environment, the step, the violation;
     * a trajectory_id the server has seen before says what to change */
    char shard[800];
    snprintf(shard, sizeof shard, "%s/shards/w1.sqlite", db);
    char *d = detail_of(shard, "rollout/g000020/r0"); /* malformed_step */
    CHECK_MSG(d && strstr(d, "\"endpoint\":\"step\",\"http_status\":200") &&
                  strstr(d, "\"env\":\"") && strstr(d, "\"step_index\":") &&
                  strstr(d, "\"violation\":\""),
              "malformed_step detail: %s", d ? d : "(none)");
    free(d);
    d = detail_of(shard, "rollout/g000014/r0"); /* trajconflict_create */
    CHECK_MSG(d && strstr(d, "\"hint\":") && strstr(d, "run uid"), "trajconflict detail: %s",
              d ? d : "(none)");
    free(d);
    arl_rollout_config_free(&c);
}

static char run_msg[1024]; /* the error message of the last run_scenario */

/* A run of `n` tasks (group size 1, two at a time) into a new store db-<name>, task i of
 * scenario scen[i % n_scen]; the alert window `win` (NULL: the worker's own); the run's status
 * (its message in run_msg), its stats into *out. */
static arl_status run_tasks(const char *const *scen, int n_scen, int n, const char *name,
                            const char *kind, arl_rollout_alert_window *win,
                            arl_rollout_stats *out) {
    char tasks[700], db[700], url[64];
    snprintf(tasks, sizeof tasks, "%s/tasks-%s.jsonl", tmp, name);
    snprintf(db, sizeof db, "%s/db-%s", tmp, name);
    FILE *f = fopen(tasks, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"id\": \"%s\", \"seed\": %d, \"data\": {}}\n", scen[i % n_scen], i);
    fclose(f);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", fsrv.srv.port);
    arl_rollout_config c;
    h_config(&c, url);
    h_set(&c, "task-file", tasks);
    h_set(&c, "run-uid", name); /* trajectory ids of their own: the server keeps every one */
    h_set(&c, "group-kind", kind);
    c.tasks = 0;
    c.group_size = 1;
    c.turn_tokens = 16;
    c.observation_tokens = 256;
    c.segment_tokens = 400;
    c.max_turns = 5;
    c.batch_size = 2;
    c.env_backoff_ms = 5;
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    arl_rollout_hooks hk = {.window = win};
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, &hk, &w), "open");
    const arl_status s = arl_rollout_worker_run(w);
    snprintf(run_msg, sizeof run_msg, "%s", s ? arl_error_msg() : "");
    arl_error_clear();
    *out = *arl_rollout_worker_stats(w);
    arl_rollout_stats_print(out, stderr);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
    return s;
}

static arl_status run_scenario(const char *scenario, int n, const char *name, const char *kind,
                               arl_rollout_stats *out) {
    return run_tasks(&scenario, 1, n, name, kind, NULL, out);
}

/* The alert window kept across workers (experiments/train.c: one worker per update): two runs
 * of 12 trajectories, every other one masked by the environment (ENV_INTERNAL).  Alone, each
 * finishes below the 20 finished the masked fraction needs; sharing one window, the second
 * crosses alert-masked-frac (0.2) at 20 finished and stops admitting groups.  A window of
 * another environment is started afresh. */
static void test_alert_window(void) {
    static const char *const half[2] = {"ok", "internal_step"};
    arl_rollout_stats s;
    arl_status st = run_tasks(half, 2, 12, "win-alone", "train", NULL, &s);
    CHECK_MSG(st == ARL_OK, "%s", run_msg);
    CHECK_EQ_INT(s.masked, 6);
    arl_rollout_alert_window win;
    memset(&win, 0, sizeof win);
    st = run_tasks(half, 2, 12, "win-1", "train", &win, &s);
    CHECK_MSG(st == ARL_OK, "%s", run_msg);
    CHECK_EQ_INT(win.n, 12);
    CHECK(!win.halted);
    st = run_tasks(half, 2, 12, "win-2", "train", &win, &s);
    CHECK_EQ_INT(st, ARL_ERR_ENV);
    CHECK_MSG(strstr(run_msg, "stopped admitting groups") && strstr(run_msg, "alert-masked-frac") &&
                  strstr(run_msg, "ENV_INTERNAL"),
              "%s", run_msg);
    CHECK(s.not_admitted >= 1 && s.trajectories + s.not_admitted == 12);
    CHECK(win.halted && win.n >= 20);
    /* a halted window stops the next worker before it admits anything */
    st = run_tasks(half, 2, 4, "win-3", "train", &win, &s);
    CHECK_EQ_INT(st, ARL_ERR_ENV);
    CHECK_EQ_INT(s.trajectories, 0);
    /* another environment's window: started afresh */
    snprintf(win.env, sizeof win.env, "other@1");
    st = run_tasks(half, 2, 4, "win-4", "train", &win, &s);
    CHECK_MSG(st == ARL_OK, "%s", run_msg);
    CHECK_EQ_INT(win.n, 4);
}

/* Client-fault alerting (spec/aep.md 8.6): one client-attributed code masking more than
 * alert-client-codes (10) of the finished trajectories stops the admission of new groups (the
 * admitted ones finish) and the run ends in an error naming the code; a run whose every
 * trajectory an environment error masked ends in an error too, unless it is an evaluation. */
static void test_alert(void) {
    arl_rollout_stats s;
    arl_status st = run_scenario("validation_step", 16, "alert", "train", &s);
    CHECK_EQ_INT(st, ARL_ERR_ENV);
    CHECK_MSG(strstr(run_msg, "VALIDATION_ERROR") && strstr(run_msg, "alert-client-codes"), "%s",
              run_msg);
    CHECK_EQ_INT(s.trajectories + s.not_admitted, 16);
    CHECK(s.trajectories >= 11 && s.trajectories <= 12 && s.not_admitted >= 4);
    st = run_scenario("internal_step", 3, "all-masked", "train", &s);
    CHECK_EQ_INT(st, ARL_ERR_ENV);
    CHECK_MSG(strstr(run_msg, "every finished trajectory (3) was masked") &&
                  strstr(run_msg, "ENV_INTERNAL"),
              "%s", run_msg);
    CHECK_EQ_INT(s.trajectories, 3);
    /* an evaluation measures it: the same run of kind eval succeeds */
    st = run_scenario("internal_step", 3, "all-masked-eval", "eval", &s);
    CHECK_MSG(st == ARL_OK, "%s", run_msg);
    CHECK_EQ_INT(s.masked, 3);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-faults"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    if (fsrv_start()) {
        fprintf(stderr, "cannot start the fault server\n");
        return 1;
    }
    TEST_RUN(test_faults);
    TEST_RUN(test_alert);
    TEST_RUN(test_alert_window);
    fsrv_stop();
    return test_finish();
}
