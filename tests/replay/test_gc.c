/* Retention of cached states (spec/replay.md sections 7.6, 9.3 and 13.8 gc): garbage is
 * deleted, 'last' keeps only the newest committed boundary of running trajectories and evicts
 * the states of final ones, the byte budget evicts the least recently used (running ones last),
 * pinned trajectories keep everything, evicted states are cache misses (never errors), and the
 * store-level gc skips files whose writer is alive. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static replay_store *st;
static fx_ids ids;
static int64_t ta, tb, tc;
static char root[512];

/* A small state of kind for segment seg (2 KDA layers over the tokens of segments 0..seg, or
 * one latent chunk of segment seg's n rows). */
static int64_t put_state(replay_writer *w, const char *uid, int seg, const char *kind, int64_t n) {
    int kda = !strcmp(kind, "kda_boundary");
    int64_t id = -1;
    arl_status r =
        fx_state_put(w, uid, seg, kind, "p1", kda ? 0 : seg * n, kda ? (seg + 1) * n : n, &id);
    CHECK_MSG(r == ARL_OK, "%s", arl_error_msg());
    return id;
}

/* A trajectory of n_seg segments of 32 tokens, each with its boundary and latent states;
 * finished (C_end) when finish is set. */
static int64_t write_traj(replay_writer *w, const fx_ids *ix, const char *uid, int slot, int n_seg,
                          int finish) {
    replay_traj_desc td = fx_traj_desc(ix, uid, slot);
    int64_t t = -1;
    CHECK(replay_traj_begin(w, &td, &t) == ARL_OK);
    int64_t tok = 0;
    for (int s = 0; s < n_seg; s++) {
        fx_seg f;
        fx_seg_make(&f, 40 + (uint64_t)slot, s, 32, 2, 2, 4, tok, tok, 1 + 2 * s, 3, 0);
        f.d.latent_state_id = put_state(w, uid, s, "mla_segment", 32);
        f.d.end_state_id = put_state(w, uid, s, "kda_boundary", 32);
        arl_status r = fx_seg_commit(w, t, &f, finish && s == n_seg - 1, 1 + 2 * n_seg, 1.0);
        CHECK_MSG(r == ARL_OK, "%s", arl_error_msg());
        tok += 32;
        fx_seg_free(&f);
    }
    return t;
}

/* 1 if the full boundary at the end of segment s loads, 0 on a cache miss. */
static int boundary_ok(int64_t t, int s) {
    replay_state_data *parts = NULL;
    size_t np = 0;
    arl_status r = replay_boundary_load(st, t, s, &parts, &np);
    replay_boundary_free(parts, np);
    CHECK_MSG(r == ARL_OK || r == ARL_ERR_NOT_FOUND, "%s", arl_error_msg());
    return r == ARL_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_retention(void) {
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_OK);
    if (!w) return;
    put_state(w, "g/a", 9, "kda_boundary", 32); /* a crash between S_s and C_s: an orphan */
    sleep_ms(5);
    replay_retention bad = {.rollout = "sometimes"};
    CHECK(replay_states_retain(w, &bad, NULL) == ARL_ERR_ARG);
    replay_retention r = {.rollout = "last", .min_age_ms = 0};
    replay_gc_stats g;
    CHECK_MSG(replay_states_retain(w, &r, &g) == ARL_OK, "%s", arl_error_msg());
    /* orphan deleted; a: kda of segments 0, 1 evicted; b: its four states; c pinned: none */
    CHECK_EQ_INT((int)g.deleted, 1);
    CHECK_EQ_INT((int)g.evicted, 6);
    CHECK(g.bytes_freed > 0);
    CHECK(boundary_ok(ta, 2));  /* the newest boundary of the running trajectory */
    CHECK(!boundary_ok(ta, 1)); /* older ones are cache misses */
    CHECK(!boundary_ok(tb, 1));
    CHECK(boundary_ok(tc, 1)); /* pinned */
    /* idempotent */
    CHECK(replay_states_retain(w, &r, &g) == ARL_OK && g.evicted == 0 && g.deleted == 0);
    /* 'all' keeps; a budget of one byte evicts every unpinned state, the pinned stay */
    r.rollout = "all";
    CHECK(replay_states_retain(w, &r, &g) == ARL_OK && g.evicted == 0);
    r.budget_bytes = 1;
    CHECK(replay_states_retain(w, &r, &g) == ARL_OK);
    CHECK_EQ_INT((int)g.evicted, 4); /* a's boundary 2 and its three latent blocks */
    CHECK(!boundary_ok(ta, 2));
    CHECK(boundary_ok(tc, 1));
    replay_writer_close(w);
    /* evicted states referenced by segments are the retention rules at work: counted in the
     * summary line, neither errors nor warnings (a warning each flooded the report of every
     * store with finished multi-segment trajectories) */
    int64_t errors = -1, warnings = -1;
    char *report = NULL;
    size_t report_len = 0;
    FILE *mem = open_memstream(&report, &report_len);
    replay_verify_opts vo = {0};
    CHECK(replay_verify(st, &vo, mem, &errors, &warnings) == ARL_OK);
    fclose(mem);
    CHECK_EQ_INT((int)errors, 0);
    CHECK_EQ_INT((int)warnings, 0);
    CHECK_MSG(report && strstr(report, "0 errors, 0 warnings; ") &&
                  strstr(report, " cached states that segments refer to were evicted by the "
                                 "retention rules (cache misses"),
              "%s", report ? report : "");
    free(report);
}

static void test_store_gc(void) {
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_OK);
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    replay_retention r = {.rollout = "off", .min_age_ms = 0};
    replay_gc_stats t;
    CHECK(replay_gc(st, &r, m, &t) == ARL_OK); /* the writer is alive: skipped */
    fclose(m);
    CHECK(buf && strstr(buf, "writer alive") && t.evicted == 0);
    free(buf);
    replay_writer_close(w);
    CHECK(replay_pin(st, "g/c", "keep") == ARL_OK); /* already pinned: reason replaced */
    CHECK(replay_gc(st, &r, NULL, &t) == ARL_OK);
    CHECK_EQ_INT((int)t.evicted, 0); /* 'off' evicts only unpinned states: none left */
    CHECK(replay_unpin(st, "g/c") == ARL_OK);
    CHECK(replay_gc(st, &r, NULL, &t) == ARL_OK);
    CHECK_EQ_INT((int)t.evicted, 4);
    CHECK(!boundary_ok(tc, 1));
}

/* A store of its own (the other tests count the shards of the main one) at <tmp>/name/store
 * (into dir, cap bytes) with a catalog of one group of 3 (*ix) and a writer of kind (*w, NULL
 * after a failed check).  Returns the store (NULL after a failed check). */
static replay_store *side_store(const char *name, char *dir, size_t cap, fx_ids *ix,
                                replay_file_kind kind, replay_writer **w) {
    snprintf(dir, cap, "%s/store", test_tmpdir(name));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *s = NULL;
    *w = NULL;
    CHECK_MSG(replay_store_open(dir, &oo, &s) == ARL_OK && fx_catalog(s, 1, 3, ix) == ARL_OK &&
                  replay_writer_open(s, kind, 0, "run1", w) == ARL_OK,
              "%s", arl_error_msg());
    return s;
}

/* The pin race of gc (section 13.8): `replay pin` in another process commits after retention
 * has read the pins and before it evicts (the hook runs there and pins through a connection of
 * its own): the trajectory keeps its states, because the eviction reads the pins again under
 * the catalog's write lock.  Unpinned, the same gc evicts them. */
typedef struct pin_hook {
    const char *root, *uid;
    int calls;
    arl_status s;
} pin_hook;

static void pin_in_between(void *arg) {
    pin_hook *h = arg;
    h->calls++;
    replay_open_opts oo = {.flags = 0};
    replay_store *other = NULL;
    h->s = replay_store_open(h->root, &oo, &other);
    if (h->s == ARL_OK) h->s = replay_pin(other, h->uid, "pinned while gc runs");
    replay_store_close(other);
}

static void test_pin_race(void) {
    char r4[512];
    fx_ids i4;
    replay_writer *w;
    replay_store *s4 = side_store("gc-pin-race", r4, sizeof r4, &i4, REPLAY_FILE_WORKER, &w);
    if (!w) goto out;
    int64_t t = write_traj(w, &i4, "g/b", 1, 2, 1); /* final: 'last' evicts its four states */
    replay_writer_close(w);
    pin_hook h = {.root = r4, .uid = "g/b", .s = ARL_OK};
    rgc_test_hook_set(pin_in_between, &h);
    replay_retention r = {.rollout = "last", .min_age_ms = 0};
    replay_gc_stats g;
    CHECK_MSG(replay_gc(s4, &r, NULL, &g) == ARL_OK, "%s", arl_error_msg());
    rgc_test_hook_set(NULL, NULL);
    CHECK_EQ_INT(h.calls, 1);
    CHECK_MSG(h.s == ARL_OK, "pin: %s", arl_error_msg());
    CHECK_EQ_INT((int)g.evicted, 0);
    replay_state_data *parts = NULL;
    size_t np = 0;
    CHECK_MSG(replay_boundary_load(s4, t, 1, &parts, &np) == ARL_OK, "%s", arl_error_msg());
    replay_boundary_free(parts, np);
    CHECK(replay_unpin(s4, "g/b") == ARL_OK);
    CHECK_MSG(replay_gc(s4, &r, NULL, &g) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)g.evicted, 4);
    CHECK(replay_boundary_load(s4, t, 1, &parts, &np) == ARL_ERR_NOT_FOUND);
out:
    replay_store_close(s4);
    FX_CLEANUP(r4);
}

/* 1 if the plan of sql (on db) names index idx */
static int plan_uses(sqlite3 *db, const char *sql, const char *idx) {
    char q[512];
    snprintf(q, sizeof q, "EXPLAIN QUERY PLAN %s", sql);
    sqlite3_stmt *s;
    int found = 0;
    if (sqlite3_prepare_v2(db, q, -1, &s, NULL) != SQLITE_OK) return -1;
    while (sqlite3_step(s) == SQLITE_ROW)
        if (strstr((const char *)sqlite3_column_text(s, 3), idx)) found = 1;
    sqlite3_finalize(s);
    return found;
}

/* Entries of an index: its leaf cells, counted through dbstat. */
static int64_t index_entries(sqlite3 *db, const char *idx) {
    sqlite3_stmt *s;
    int64_t n = -1;
    if (sqlite3_prepare_v2(db,
                           "SELECT sum(ncell) FROM dbstat WHERE name = ?1 AND pagetype = 'leaf'",
                           -1, &s, NULL) != SQLITE_OK)
        return -2;
    sqlite3_bind_text(s, 1, idx, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

/* states_by_lru and states_by_version are exactly the definitions of section 4.14: every state,
 * whoever produced it, is in both, and the eviction and learner-state queries use them. */
static void test_state_indexes(void) {
    char r2[512];
    fx_ids i2;
    replay_writer *w, *tw = NULL;
    replay_store *s2 = side_store("gc-indexes", r2, sizeof r2, &i2, REPLAY_FILE_WORKER, &w);
    if (s2) CHECK(replay_writer_open(s2, REPLAY_FILE_TOOL, 0, NULL, &tw) == ARL_OK);
    if (!w || !tw) goto out;
    put_state(w, "g/a", 0, "kda_boundary", 32);  /* producer 'rollout' */
    put_state(tw, "g/a", 0, "kda_boundary", 32); /* producer 'tool' */
    put_state(tw, "g/a", 1, "kda_boundary", 32);
    const char *idx[2] = {"states_by_lru", "states_by_version"};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT((int)index_entries(w->s.db, idx[i]), 1);
        CHECK_EQ_INT((int)index_entries(tw->s.db, idx[i]), 2);
    }
    CHECK_EQ_INT(plan_uses(tw->s.db,
                           "SELECT state_id FROM states WHERE status = 'complete' ORDER BY "
                           "last_used_at_ms",
                           "states_by_lru"),
                 1);
    CHECK_EQ_INT(plan_uses(tw->s.db,
                           "SELECT state_id FROM states WHERE producer = 'learner' AND "
                           "version_min = 3",
                           "states_by_version"),
                 1);
out:
    replay_writer_close(tw);
    replay_writer_close(w);
    replay_store_close(s2);
    FX_CLEANUP(r2);
}

/* Learner-produced states (sections 7.6 and 9.3): in a learner file a state is referenced by a
 * learner record of its trajectory and segment (an unreferenced one is garbage), and
 * state_cache.learner decides whether consumed trajectories keep theirs (pins always do). */
static void test_learner_states(void) {
    char r3[512];
    fx_ids i3;
    replay_writer *lw;
    replay_store *s3 = side_store("gc-learner", r3, sizeof r3, &i3, REPLAY_FILE_LEARNER, &lw);
    if (!lw) goto out;
    int64_t a0 = put_state(lw, "g/a", 0, "kda_boundary", 32); /* a learner record refers to it */
    int64_t b0 = put_state(lw, "g/b", 0, "kda_boundary", 32); /* no record: garbage */
    int64_t c0 = put_state(lw, "g/c", 0, "kda_boundary", 32); /* recorded, pinned */
    CHECK(a0 > 0 && b0 > 0 && c0 > 0);
    float f[32] = {0};
    uint8_t flags[32] = {0};
    const char *rec_uids[2] = {"g/a", "g/c"};
    for (int i = 0; i < 2; i++) {
        replay_learner_record rec = {.run_id = i3.run_id,
                                     .update_n = 0,
                                     .traj_uid = rec_uids[i],
                                     .seg_index = 0,
                                     .levels_json = "{}",
                                     .n_tokens = 32,
                                     .old_logprobs = f,
                                     .ref_logprobs = f,
                                     .is_weights = f,
                                     .token_flags = flags,
                                     .advantages = f};
        CHECK_MSG(replay_learner_record_put(lw, &rec) == ARL_OK, "%s", arl_error_msg());
    }
    /* a pin (replay_pin wants the trajectory in a worker shard, which this store lacks) */
    CHECK(sqlite3_exec(s3->cat.db,
                       "INSERT INTO pins(traj_uid, reason, created_at_ms) VALUES ('g/c', 'keep', 0)",
                       NULL, NULL, NULL) == SQLITE_OK);
    /* the producer of a learner writer's states */
    sqlite3_stmt *q;
    CHECK(sqlite3_prepare_v2(lw->s.db, "SELECT count(*) FROM states WHERE producer = 'learner'", -1,
                             &q, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int(q, 0) == 3);
    sqlite3_finalize(q);
    sleep_ms(5);
    replay_retention r = {.learner = "sometimes", .min_age_ms = 0};
    CHECK(replay_states_retain(lw, &r, NULL) == ARL_ERR_ARG);
    /* not consumed yet: only the garbage goes */
    replay_gc_stats g;
    r.learner = "off";
    CHECK_MSG(replay_states_retain(lw, &r, &g) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)g.deleted, 1);
    CHECK_EQ_INT((int)g.evicted, 0);
    /* the group of g/a and g/c is consumed: 'all' keeps, 'off' evicts g/a's (g/c is pinned) */
    const char *uids[2] = {"g/a", "g/c"};
    for (int i = 0; i < 2; i++) {
        char sql[400];
        snprintf(sql, sizeof sql,
                 "INSERT INTO group_members(group_id, slot, attempt, traj_uid, shard_id, traj_id, "
                 "status) VALUES (%lld, %d, 0, '%s', 1, %d, 'complete')",
                 (long long)i3.group_id, i, uids[i], i + 1);
        CHECK_MSG(sqlite3_exec(s3->cat.db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s",
                  sqlite3_errmsg(s3->cat.db));
    }
    char sql[200];
    snprintf(sql, sizeof sql,
             "UPDATE task_groups SET status = 'consumed', consumed_update = 0 WHERE group_id = "
             "%lld",
             (long long)i3.group_id);
    CHECK(sqlite3_exec(s3->cat.db, sql, NULL, NULL, NULL) == SQLITE_OK);
    r.learner = "all";
    CHECK(replay_states_retain(lw, &r, &g) == ARL_OK && g.evicted == 0 && g.deleted == 0);
    r.learner = "pinned";
    CHECK(replay_states_retain(lw, &r, &g) == ARL_OK);
    CHECK_EQ_INT((int)g.evicted, 1);
    replay_state_data d;
    memset(&d, 0, sizeof d);
    CHECK(replay_state_load(s3, lw->shard_id, a0, &d) == ARL_ERR_NOT_FOUND); /* a cache miss */
    CHECK(replay_state_load(s3, lw->shard_id, c0, &d) == ARL_OK && d.n_chunks == 4);
    replay_state_data_free(&d);
out:
    replay_writer_close(lw);
    replay_store_close(s3);
    FX_CLEANUP(r3);
}

/* seal (sections 2.3, 13.8): refused while a trajectory runs; then the file is immutable
 * (writers refuse it, gc leaves it as it is), in rollback-journal mode, and still read as before.
 */
static void test_seal(void) {
    replay_admin_stats k = {-1, -1, -1};
    CHECK(replay_seal(st, 0, NULL, &k) == ARL_ERR_STATE); /* g/a is still running */
    CHECK(strstr(arl_error_msg(), "still running") != NULL);
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_OK);
    if (!w) return;
    CHECK(replay_traj_mask(w, ta, "OPERATOR_MASKED", "none", NULL, NULL) == ARL_OK);
    /* its writer is alive: skipped */
    CHECK(replay_seal(st, 0, NULL, &k) == ARL_OK && k.files == 0);
    replay_writer_close(w);
    CHECK(replay_seal(st, 7, NULL, &k) == ARL_ERR_NOT_FOUND);
    CHECK_MSG(replay_seal(st, 0, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "sealed") != NULL);
    CHECK(replay_seal(st, 0, NULL, &k) == ARL_OK && k.files == 0); /* already sealed */
    replay_gc_stats t;
    replay_retention r = {.rollout = "off", .min_age_ms = 0};
    CHECK(replay_gc(st, &r, NULL, &t) == ARL_OK && t.evicted == 0);
    replay_traj_row row;
    CHECK(replay_traj_get(st, "g/b", &row) == ARL_OK && row.status == REPLAY_COMPLETE);
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    CHECK(replay_segment_load(st, tb, 1, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES, &d) == ARL_OK);
    replay_seg_data_free(&d);
    char p[600];
    snprintf(p, sizeof p, "%s/shards/w1.sqlite", root);
    sqlite3 *db;
    sqlite3_stmt *q;
    sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL);
    CHECK(sqlite3_prepare_v2(db,
                             "SELECT (SELECT journal_mode FROM pragma_journal_mode), (SELECT value "
                             "FROM meta WHERE key = 'sealed')",
                             -1, &q, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 0), "delete");
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "1");
    sqlite3_finalize(q);
    sqlite3_close(db);
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

/* migrate (sections 12, 13.8): a build with schema version 2 migrates the catalog at open;
 * writers refuse the sealed shard, `migrate` migrates it (and its states file) under its lock,
 * with a backup, and it stays sealed in rollback-journal mode. */
static void test_migrate(void) {
    replay_store_close(st);
    st = NULL;
    rschema_test_override(2, "CREATE TABLE extra_v2 (a INTEGER);", 0);
    replay_open_opts oo = {.flags = 0};
    CHECK_MSG(replay_store_open(root, &oo, &st) == ARL_OK, "%s", arl_error_msg());
    if (!st) goto out;
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_ERR_STATE);
    replay_admin_stats k = {-1, -1, -1};
    CHECK_MSG(replay_migrate(st, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    CHECK(replay_migrate(st, NULL, &k) == ARL_OK && k.files == 0); /* up to date */
    const char *files[2] = {"shards/w1.sqlite", "shards/w1.states.sqlite"};
    for (int i = 0; i < 2; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", root, files[i]);
        sqlite3 *db;
        sqlite3_stmt *q;
        sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL);
        CHECK(sqlite3_prepare_v2(db,
                                 "SELECT (SELECT user_version FROM pragma_user_version), (SELECT "
                                 "value FROM meta WHERE key = 'schema_version'), (SELECT count(*) "
                                 "FROM sqlite_schema WHERE name = 'extra_v2'), (SELECT "
                                 "journal_mode FROM pragma_journal_mode)",
                                 -1, &q, NULL) == SQLITE_OK);
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK_EQ_INT(sqlite3_column_int(q, 0), 2);
        CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "2");
        CHECK_EQ_INT(sqlite3_column_int(q, 2), 1);
        if (i == 0) CHECK_STR_EQ((const char *)sqlite3_column_text(q, 3), "delete");
        sqlite3_finalize(q);
        sqlite3_close(db);
        char bak[700];
        snprintf(bak, sizeof bak, "%s.pre-v2", p);
        CHECK_MSG(access(bak, F_OK) == 0, "no backup %s", bak);
    }
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_ERR_STATE); /* sealed */
    replay_traj_row row;
    CHECK(replay_traj_get(st, "g/b", &row) == ARL_OK);
out:
    rschema_test_override(0, NULL, 0);
}

/* the backup size limit (section 12 rule 3: "unless the file exceeds the configured backup size
 * limit"): limit 0 migrates a fresh store's catalog and shard without a '.pre-v2' copy (the limit
 * was a fixed 1 GiB); the default copies them */
static void test_migrate_backup_limit(void) {
    for (int limited = 1; limited >= 0; limited--) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/bak%d", test_tmpdir("gc"), limited);
        replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
        replay_store *s = NULL;
        replay_writer *w = NULL;
        fx_ids ix;
        CHECK_MSG(replay_store_open(dir, &oo, &s) == ARL_OK && fx_catalog(s, 1, 3, &ix) == ARL_OK &&
                      replay_writer_open(s, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK,
                  "%s", arl_error_msg());
        if (!w) {
            replay_store_close(s);
            return;
        }
        write_traj(w, &ix, "g/k", 0, 1, 1);
        replay_writer_close(w);
        replay_store_close(s);
        s = NULL;
        replay_backup_limit_set(limited ? 0 : REPLAY_BACKUP_LIMIT_DEFAULT);
        rschema_test_override(2, "CREATE TABLE extra_v2 (a INTEGER);", 0);
        replay_open_opts o2 = {.flags = 0};
        CHECK_MSG(replay_store_open(dir, &o2, &s) == ARL_OK, "%s", arl_error_msg());
        replay_admin_stats k = {-1, -1, -1};
        if (s) CHECK_MSG(replay_migrate(s, NULL, &k) == ARL_OK, "%s", arl_error_msg());
        CHECK_EQ_INT((int)k.files, 1);
        replay_store_close(s);
        rschema_test_override(0, NULL, 0);
        replay_backup_limit_set(REPLAY_BACKUP_LIMIT_DEFAULT);
        const char *files[2] = {"catalog.sqlite", "shards/w1.sqlite"};
        for (int i = 0; i < 2; i++) {
            char bak[700];
            snprintf(bak, sizeof bak, "%s/%s.pre-v2", dir, files[i]);
            CHECK_MSG((access(bak, F_OK) == 0) == !limited, "%s: backup %s with limit %s", files[i],
                      limited ? "made" : "missing", limited ? "0" : "1 GiB");
        }
        FX_CLEANUP(dir);
    }
}

int main(void) {
    snprintf(root, sizeof root, "%s/store", test_tmpdir("gc"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_writer *w = NULL;
    if (replay_store_open(root, &oo, &st) != ARL_OK || fx_catalog(st, 1, 3, &ids) != ARL_OK ||
        replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) != ARL_OK) {
        fprintf(stderr, "setup: %s\n", arl_error_msg());
        return 1;
    }
    ta = write_traj(w, &ids, "g/a", 0, 3, 0);
    tb = write_traj(w, &ids, "g/b", 1, 2, 1);
    tc = write_traj(w, &ids, "g/c", 2, 2, 1);
    replay_writer_close(w);
    if (replay_pin(st, "g/c", "debugging") != ARL_OK) {
        fprintf(stderr, "pin: %s\n", arl_error_msg());
        return 1;
    }
    TEST_RUN(test_state_indexes);
    TEST_RUN(test_learner_states);
    TEST_RUN(test_pin_race);
    TEST_RUN(test_retention);
    TEST_RUN(test_store_gc);
    TEST_RUN(test_seal);
    TEST_RUN(test_migrate);
    TEST_RUN(test_migrate_backup_limit);
    replay_store_close(st);
    FX_CLEANUP(root);
    return test_finish();
}
