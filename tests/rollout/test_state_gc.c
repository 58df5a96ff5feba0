/* tests/rollout/test_state_gc.c: a worker collects its own states file (spec/replay.md 7.6, its
 * writer's duty, and the retention of 9.3):
 *   - budget: with state-cache all and a tiny state-budget-bytes, the GC passes during the run
 *     (state-gc-interval-s 1; the first two trajectories' ends wait past it; one trajectory at a
 *     time) keep the complete states within
 *     the budget, evicted ones stay as tombstones, and a pass that evicts a state of a running
 *     trajectory has evicted every state of the finished ones first;
 *   - at open: a 'writing' state over an hour old (a dead writer's) is deleted, a younger one
 *     is not, and the budget evicts the least recently used states first;
 *   - last_used_at_ms: a resume from the cached boundary records its use; the budget (1 byte)
 *     waits for the pending resume, which still starts from the cached state. */
#include <time.h>

#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

static void states_path(const char *db, int32_t shard, char *out, size_t cap) {
    snprintf(out, cap, "%s/shards/w%d.states.sqlite", db, (int)shard);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Run sql (no result) on the SQLite file at path. */
static void sql_exec(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open(path, &db);
    if (rc == SQLITE_OK) rc = sqlite3_busy_timeout(db, 10000);
    char *err = NULL;
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    CHECK_MSG(rc == SQLITE_OK, "%s: %s: %s", path, sql, err ? err : sqlite3_errmsg(db));
    sqlite3_free(err);
    sqlite3_close(db);
}

/* The integer of the first row of sql in the file at path (-1: no row). */
static int64_t sql_int(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    int64_t v = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        v = sqlite3_column_int64(q, 0);
    else
        CHECK_MSG(0, "%s: %s: %s", path, sql, sqlite3_errmsg(db));
    sqlite3_finalize(q);
    sqlite3_close(db);
    return v;
}

/* ---- the budget during a run ---- */

#define MAXS 512

typedef struct budget_probe {
    replay_store *st;
    arl_rollout_worker *w;
    char states[800];
    int64_t budget;
    int64_t seen_gcs;
    int finals, passes, bad;
    int64_t evicted[MAXS]; /* state ids evicted as of the last look */
    int n_evicted;
} budget_probe;

static int was_evicted(const budget_probe *p, int64_t id) {
    for (int i = 0; i < p->n_evicted; i++)
        if (p->evicted[i] == id) return 1;
    return 0;
}

static int is_running(replay_store *st, const char *uid) {
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    return r.status == REPLAY_RUNNING;
}

/* After every commit (the GC, when due, ran just before): once a pass happened, the complete
 * states fit the budget; if it evicted a running trajectory's state, no finished one's is left. */
static int budget_on_commit(void *user, const char *uid, int32_t seg, int final) {
    (void)uid, (void)seg;
    budget_probe *p = user;
    const int64_t gcs = arl_rollout_worker_stats(p->w)->state_gcs;
    /* past state-gc-interval-s (1 s) after the first two trajectories end: the next commit's
     * pass sees finished trajectories' states and a running one's */
    if (final && p->finals++ < 2) usleep(1100 * 1000);
    if (gcs == p->seen_gcs) return 0;
    p->seen_gcs = gcs;
    p->passes++;
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    CHECK(sqlite3_open_v2(p->states, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(db,
                             "SELECT state_id, traj_uid, status, n_bytes FROM states ORDER BY "
                             "state_id",
                             -1, &q, NULL) == SQLITE_OK);
    int64_t total = 0, evicted_now[MAXS];
    int n_now = 0, new_running = 0, finished_left = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        const int64_t id = sqlite3_column_int64(q, 0);
        const char *u = (const char *)sqlite3_column_text(q, 1);
        const char *status = (const char *)sqlite3_column_text(q, 2);
        if (!strcmp(status, "complete")) {
            total += sqlite3_column_int64(q, 3);
            finished_left += !is_running(p->st, u);
        } else if (!strcmp(status, "evicted")) {
            CHECK(sqlite3_column_int64(q, 3) > 0); /* a tombstone keeps its row */
            if (!was_evicted(p, id) && is_running(p->st, u)) new_running++;
            if (n_now < MAXS) evicted_now[n_now++] = id;
        }
    }
    sqlite3_finalize(q);
    sqlite3_close(db);
    memcpy(p->evicted, evicted_now, (size_t)n_now * sizeof *evicted_now);
    p->n_evicted = n_now;
    if (total > p->budget) {
        fprintf(stderr, "  pass %d: %lld bytes of complete states, budget %lld\n", p->passes,
                (long long)total, (long long)p->budget);
        p->bad++;
    }
    if (new_running && finished_left) {
        fprintf(stderr, "  pass %d: %d running states evicted while %d finished ones remain\n",
                p->passes, new_running, finished_left);
        p->bad++;
    }
    return 0;
}

static void test_budget_during_run(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-budget", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 2;
    c.group_size = 2;
    c.segment_tokens = 900;
    c.batch_size = 1; /* one trajectory at a time: the passes see finished and running ones */
    h_set(&c, "state-cache", "all");
    h_set(&c, "state-gc-interval-s", "1");
    h_set(&c, "state-budget-bytes", "400000"); /* about one boundary of the tiny model */
    /* (seen_gcs 1: the pass at open, before any state was written, is not looked at) */
    budget_probe p = {.st = h_store(db), .budget = 400000, .seen_gcs = 1};
    arl_rollout_hooks hk = {.user = &p, .on_commit = budget_on_commit};
    H_DIE(arl_rollout_worker_open(&c, ckpt, p.st, 0, &hk, &p.w), "open");
    states_path(db, arl_rollout_worker_shard(p.w), p.states, sizeof p.states);
    H_DIE(arl_rollout_worker_run(p.w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(p.w);
    arl_rollout_stats_print(s, stderr);
    CHECK_EQ_INT(s->masked, 0);
    CHECK(s->segments >= 6);
    CHECK(s->state_gcs >= 2); /* at open, then at least one periodic pass */
    CHECK(p.passes >= 1);
    CHECK(s->states_evicted > 0);
    CHECK_EQ_INT(p.bad, 0);
    arl_rollout_worker_close(p.w);
    CHECK(sql_int(p.states, "SELECT count(*) FROM states WHERE status = 'evicted'") > 0);
    CHECK_EQ_INT(sql_int(p.states, "SELECT count(*) FROM state_chunks c JOIN states s ON "
                                   "s.state_id = c.state_id WHERE s.status = 'evicted'"),
                 0);
    CHECK_EQ_INT(h_verify(p.st), 0);
    replay_store_close(p.st);
    arl_rollout_config_free(&c);
}

/* ---- GC at open ---- */

static void test_gc_at_open(void) {
    char db[700], sp[800], sql[1024];
    snprintf(db, sizeof db, "%s/db-open", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 2;
    c.segment_tokens = 900;
    h_set(&c, "state-cache", "all");
    h_set(&c, "state-budget-bytes", "0");
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    const int32_t shard = arl_rollout_worker_shard(w);
    H_DIE(arl_rollout_worker_run(w), "run");
    CHECK_EQ_INT(arl_rollout_worker_stats(w)->states_evicted, 0); /* no budget */
    arl_rollout_worker_close(w);
    states_path(db, shard, sp, sizeof sp);
    const int64_t n_complete = sql_int(sp, "SELECT count(*) FROM states WHERE status = 'complete'");
    CHECK(n_complete >= 4);
    /* a dead writer's 'writing' states: one two hours old, one ten minutes old; every complete
     * state made two hours old too (referenced by segments: kept); the newest state the most
     * recently used */
    const int64_t now = now_ms();
    snprintf(sql, sizeof sql,
             "INSERT INTO states(traj_uid, seg_index, kind, producer, pass_uid, version_min, "
             "version_max, numerics, routing, model_config_sha256, ctx_start, n_tokens, n_bytes, "
             "status, created_at_ms, last_used_at_ms) SELECT traj_uid, seg_index, kind, producer, "
             "pass_uid || '#stale' || x.k, version_min, version_max, numerics, routing, "
             "model_config_sha256, ctx_start, n_tokens, 0, 'writing', %lld - x.age, 0 FROM states, "
             "(SELECT 1 AS k, 7200000 AS age UNION ALL SELECT 2, 600000) x WHERE state_id = "
             "(SELECT min(state_id) FROM states); UPDATE states SET created_at_ms = %lld - 7200000 "
             "WHERE status = 'complete'; UPDATE states SET last_used_at_ms = %lld WHERE state_id "
             "= (SELECT max(state_id) FROM states WHERE status = 'complete');",
             (long long)now, (long long)now, (long long)now);
    sql_exec(sp, sql);
    const int64_t newest =
        sql_int(sp, "SELECT max(state_id) FROM states WHERE status = 'complete'");
    const int64_t newest_bytes =
        sql_int(sp, "SELECT n_bytes FROM states WHERE state_id = (SELECT max(state_id) FROM states "
                    "WHERE status = 'complete')");
    /* the same run again: nothing left to sample; its open runs the GC, with a budget that
     * holds the newest state only */
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)newest_bytes);
    h_set(&c, "state-budget-bytes", b);
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, shard, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->state_gcs, 1);
    CHECK_EQ_INT(s->states_deleted, 1);
    CHECK_EQ_INT(s->states_evicted, n_complete - 1);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE pass_uid LIKE '%#stale1'"), 0);
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE pass_uid LIKE '%#stale2'"), 1);
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE status = 'complete'"), 1);
    snprintf(sql, sizeof sql, "SELECT status = 'complete' FROM states WHERE state_id = %lld",
             (long long)newest);
    CHECK_EQ_INT(sql_int(sp, sql), 1); /* the most recently used one stays */
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE status = 'evicted'"),
                 n_complete - 1);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* ---- last_used_at_ms on a resume ---- */

static void test_resume_touches(void) {
    char db[700], sp[800];
    snprintf(db, sizeof db, "%s/db-resume", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    c.segment_tokens = 900;
    h_set(&c, "state-cache", "all");
    const int32_t shard = 1;
    h_run_until_first_boundary(&c, ckpt, db, shard);
    states_path(db, shard, sp, sizeof sp);
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE seg_index = 0 AND status = "
                             "'complete'"),
                 2);
    sql_exec(sp, "UPDATE states SET last_used_at_ms = 1");
    /* a budget of 1 byte would evict every state at open: it waits for the pending resume */
    h_set(&c, "state-budget-bytes", "1");
    const int64_t t0 = now_ms();
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, shard, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->resumed, 1);
    CHECK_EQ_INT(s->resumed_from_state, 1);
    CHECK_EQ_INT(s->masked, 0);
    arl_rollout_worker_close(w);
    /* both parts of the boundary the resume loaded (kda_boundary and mla_segment of segment 0,
     * evicted or not since) record the use */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM states WHERE seg_index = 0 AND last_used_at_ms >= %lld",
             (long long)t0);
    CHECK_EQ_INT(sql_int(sp, sql), 2);
    CHECK_EQ_INT(sql_int(sp, "SELECT count(*) FROM states WHERE seg_index > 0 AND "
                             "last_used_at_ms = 1"),
                 0);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-state-gc"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_budget_during_run);
    TEST_RUN(test_gc_at_open);
    TEST_RUN(test_resume_touches);
    return test_finish();
}
