/* The learner collects its states file as its writer (spec/replay.md 7.6, 9.3; learner/states.c
 * arl_learner_states_open, arl_learner_states_gc):
 *   open     the GC at open deletes a stale 'writing' state and an unreferenced complete one
 *            over an hour old, and keeps the states of a consumed trajectory that no learner
 *            record references (learner.records false: keep-states kept them on purpose);
 *   budget   beyond state-budget-bytes the least recently used states are evicted, tombstones
 *            left, the file within the budget after the pass; 0 is no budget;
 *   learner  keep-states off evicts (never deletes) the consumed trajectory's states.
 * The train driver's calls are tested by test_train_states_gc.sh. */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "learner/update.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

/* One row count of the states file of w's shard, by a query of its own connection. */
static int64_t count(replay_writer *w, const char *sql) {
    sqlite3_stmt *q = NULL;
    int64_t n = -1;
    if (sqlite3_prepare_v2(w->s.db, sql, -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return n;
}

static void exec(sqlite3 *db, const char *sql) {
    CHECK_MSG(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", sql,
              sqlite3_errmsg(db));
}

static void test_learner_states_gc(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/store", test_tmpdir("learner-states-gc"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st = NULL;
    replay_writer *w = NULL;
    fx_ids ix;
    CHECK_MSG(replay_store_open(root, &oo, &st) == ARL_OK && fx_catalog(st, 1, 3, &ix) == ARL_OK &&
                  replay_writer_open(st, REPLAY_FILE_LEARNER, 0, "run1", &w) == ARL_OK,
              "%s", arl_error_msg());
    if (!w) goto out;
    const int32_t shard = replay_writer_shard_id(w);
    /* g/a: its group consumed, no learner record; g/b: its update never committed; g/c: a
     * state a killed pass left 'writing' */
    int64_t a0 = -1, a1 = -1, b0 = -1, c0 = -1;
    CHECK(fx_state_put(w, "g/a", 0, "kda_boundary", "p1", 0, 32, &a0) == ARL_OK);
    CHECK(fx_state_put(w, "g/a", 0, "mla_segment", "p1", 0, 32, &a1) == ARL_OK);
    CHECK(fx_state_put(w, "g/b", 0, "kda_boundary", "p1", 0, 32, &b0) == ARL_OK);
    CHECK(fx_state_put(w, "g/c", 0, "kda_boundary", "p1", 0, 32, &c0) == ARL_OK);
    /* two hours old, g/c back to 'writing' */
    exec(w->s.db, "UPDATE states SET created_at_ms = created_at_ms - 7200000, last_used_at_ms = "
                  "last_used_at_ms - 7200000");
    char sql[400];
    snprintf(sql, sizeof sql, "UPDATE states SET status = 'writing' WHERE state_id = %lld",
             (long long)c0);
    exec(w->s.db, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO group_members(group_id, slot, attempt, traj_uid, shard_id, traj_id, "
             "status) VALUES (%lld, 0, 0, 'g/a', 1, 1, 'complete')",
             (long long)ix.group_id);
    exec(st->cat.db, sql);
    snprintf(sql, sizeof sql,
             "UPDATE task_groups SET status = 'consumed', consumed_update = 0 WHERE group_id = "
             "%lld",
             (long long)ix.group_id);
    exec(st->cat.db, sql);
    replay_writer_close(w);
    w = NULL;
    /* the GC at open (keep-states all, no budget): the stale 'writing' state and g/b's
     * unreferenced one deleted, the consumed g/a's kept */
    CHECK_MSG(arl_learner_states_open(st, shard, ARL_LEARNER_KEEP_ALL, 0, &w) == ARL_OK, "%s",
              arl_error_msg());
    if (!w) goto out;
    CHECK_EQ_INT((int)count(w, "SELECT count(*) FROM states WHERE status = 'writing'"), 0);
    CHECK_EQ_INT((int)count(w, "SELECT count(*) FROM states"), 2);
    CHECK_EQ_INT((int)count(w, "SELECT count(*) FROM states WHERE traj_uid = 'g/a' AND status "
                               "= 'complete'"),
                 2);
    /* the budget: g/a's kda_boundary used last, its mla_segment goes (a tombstone) */
    const int64_t ka = count(w, "SELECT n_bytes FROM states WHERE kind = 'kda_boundary'");
    const int64_t la = count(w, "SELECT n_bytes FROM states WHERE kind = 'mla_segment'");
    CHECK(ka > 0 && la > 0);
    CHECK(replay_states_touch(w, &a0, 1) == ARL_OK);
    replay_gc_stats g;
    CHECK(arl_learner_states_gc(w, ARL_LEARNER_KEEP_ALL, 0, &g) == ARL_OK && g.evicted == 0);
    CHECK_MSG(arl_learner_states_gc(w, ARL_LEARNER_KEEP_ALL, ka, &g) == ARL_OK, "%s",
              arl_error_msg());
    CHECK_EQ_INT((int)g.evicted, 1);
    CHECK_EQ_INT((int)g.bytes_freed, (int)la);
    CHECK_EQ_INT((int)count(w, "SELECT coalesce(sum(n_bytes), 0) FROM states WHERE status = "
                               "'complete'"),
                 (int)ka);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM states WHERE state_id = %lld AND status = "
             "'evicted'",
             (long long)a1);
    CHECK_EQ_INT((int)count(w, sql), 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM state_chunks WHERE state_id = %lld",
             (long long)a1);
    CHECK_EQ_INT((int)count(w, sql), 0);
    /* keep-states off: the consumed trajectory's state evicted, not deleted */
    CHECK(arl_learner_states_gc(w, ARL_LEARNER_KEEP_OFF, 0, &g) == ARL_OK);
    CHECK_EQ_INT((int)g.evicted, 1);
    CHECK_EQ_INT((int)g.deleted, 0);
    CHECK_EQ_INT((int)count(w, "SELECT count(*) FROM states WHERE status = 'evicted'"), 2);
    (void)b0;
out:
    replay_writer_close(w);
    replay_store_close(st);
}

int main(void) {
    TEST_RUN(test_learner_states_gc);
    return test_finish();
}
