/* The store-administration operations of spec/replay.md section 13.8 where they meet sealing
 * (section 2.3), crashes and bad input: seal goes on past a file it cannot seal, a seal or a
 * migrate killed after meta.sealed = 1 is finished when run again (rollback-journal mode,
 * catalog sealed_at_ms), migrate leaves a sealed file in rollback-journal mode when only its
 * states file needed migrating, gc collects the states file of a sealed shard without writing
 * the sealed file, and pin reasons are one line of UTF-8 text. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static replay_store *st;
static fx_ids ids;
static char root[512];

/* Trajectory uid of n_seg segments with their boundary and latent states; finished if set. */
static void write_traj(replay_writer *w, const char *uid, int slot, int n_seg, int finish) {
    replay_traj_desc td = fx_traj_desc(&ids, uid, slot);
    int64_t t = -1, tok = 0;
    CHECK(replay_traj_begin(w, &td, &t) == ARL_OK);
    for (int s = 0; s < n_seg; s++) {
        fx_seg f;
        fx_seg_make(&f, 70 + (uint64_t)slot, s, 32, 2, 2, 4, tok, tok, 1 + 2 * s, 3, 0);
        CHECK(fx_state_put(w, uid, s, "mla_segment", "p1", tok, 32, &f.d.latent_state_id) ==
              ARL_OK);
        CHECK(fx_state_put(w, uid, s, "kda_boundary", "p1", 0, tok + 32, &f.d.end_state_id) ==
              ARL_OK);
        arl_status r = fx_seg_commit(w, t, &f, finish && s == n_seg - 1, 1 + 2 * n_seg, 1.0);
        CHECK_MSG(r == ARL_OK, "%s", arl_error_msg());
        tok += 32;
        fx_seg_free(&f);
    }
}

static void path_of(char *p, size_t cap, const char *rel) {
    snprintf(p, cap, "%s/%s", root, rel);
}

/* One text value of sql over the file rel of the store (read-only), into buf. */
static void query_text(const char *rel, const char *sql, char *buf, size_t cap) {
    char p[600];
    path_of(p, sizeof p, rel);
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    buf[0] = 0;
    CHECK(sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK_MSG(sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    if (q && sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
        snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* Run sql on the file rel of the store with a plain SQLite connection; with die set, in a
 * child process that exits without closing it (a kill: what it committed may stay in -wal). */
static void raw_exec(const char *rel, const char *sql, int die) {
    char p[600];
    path_of(p, sizeof p, rel);
    pid_t pid = die ? fork() : 0;
    if (pid == 0) {
        sqlite3 *db = NULL;
        int rc = sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if (die) _exit(rc == SQLITE_OK ? 0 : 1);
        CHECK_MSG(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
        sqlite3_close(db);
        return;
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

static int64_t file_size(const char *rel) {
    char p[600];
    path_of(p, sizeof p, rel);
    struct stat sb;
    return stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

static char *slurp(const char *rel, size_t *n) {
    char p[600];
    path_of(p, sizeof p, rel);
    FILE *f = fopen(p, "rb");
    char *b = NULL;
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc(len > 0 ? (size_t)len : 1);
    if (b) *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* Shard 1 holds a running trajectory (its writer gone), shard 2 a finished one: seal all
 * seals shard 2 and reports shard 1 (it stopped at shard 1 and left shard 2 unsealed). */
static void test_seal_goes_on(void) {
    replay_admin_stats k = {-1, -1, -1};
    CHECK(replay_seal(st, 0, NULL, &k) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "still running") != NULL);
    CHECK_EQ_INT((int)k.files, 1);
    char v[32];
    query_text("shards/w2.sqlite", "SELECT value FROM meta WHERE key = 'sealed'", v, sizeof v);
    CHECK_STR_EQ(v, "1");
    query_text("shards/w1.sqlite", "SELECT value FROM meta WHERE key = 'sealed'", v, sizeof v);
    CHECK_STR_EQ(v, "0");
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

/* gc of a sealed shard: its states file is collected by the retention rules, the sealed file
 * is not written (byte for byte the same, still sealed in rollback-journal mode). */
static void test_gc_sealed_states(void) {
    size_t n0 = 0, n1 = 0;
    char *before = slurp("shards/w2.sqlite", &n0);
    char v[32];
    query_text("shards/w2.states.sqlite", "SELECT count(*) FROM states WHERE status = 'complete'",
               v, sizeof v);
    CHECK_STR_EQ(v, "4"); /* two segments, each a boundary and a latent block */
    replay_retention r = {.rollout = "last", .min_age_ms = 0};
    replay_gc_stats t;
    CHECK_MSG(replay_gc(st, &r, NULL, &t) == ARL_OK, "%s", arl_error_msg());
    query_text("shards/w2.states.sqlite", "SELECT count(*) FROM states WHERE status = 'complete'",
               v, sizeof v);
    CHECK_STR_EQ(v, "0"); /* 'last': a final trajectory keeps no rollout states */
    char *after = slurp("shards/w2.sqlite", &n1);
    CHECK(before && after && n0 == n1 && !memcmp(before, after, n0));
    free(before);
    free(after);
    query_text("shards/w2.sqlite", "SELECT journal_mode FROM pragma_journal_mode", v, sizeof v);
    CHECK_STR_EQ(v, "delete");
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w) == ARL_ERR_STATE); /* sealed */
    replay_writer_close(w);
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

/* A seal killed after meta.sealed = 1 committed (the commit only in -wal, the catalog not
 * told): seal run again finishes it (it said "already sealed" and left both). */
static void test_seal_interrupted(void) {
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_OK);
    if (!w) return;
    replay_traj_row row;
    CHECK(replay_traj_get(st, "a/1", &row) == ARL_OK);
    CHECK(replay_traj_mask(w, row.traj_id, "OPERATOR_MASKED", "none", NULL, NULL) == ARL_OK);
    replay_writer_close(w);
    replay_store_refresh(st);
    rstore_shard_release(st, 1);
    raw_exec("shards/w1.sqlite", "UPDATE meta SET value = '1' WHERE key = 'sealed'", 1);
    CHECK(file_size("shards/w1.sqlite-wal") > 0);
    replay_admin_stats k = {-1, -1, -1};
    CHECK_MSG(replay_seal(st, 1, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    char v[32];
    query_text("shards/w1.sqlite", "SELECT journal_mode FROM pragma_journal_mode", v, sizeof v);
    CHECK_STR_EQ(v, "delete");
    CHECK(file_size("shards/w1.sqlite-wal") <= 0);
    query_text("catalog.sqlite", "SELECT sealed_at_ms IS NOT NULL FROM shards WHERE shard_id = 1",
               v, sizeof v);
    CHECK_STR_EQ(v, "1");
    CHECK(replay_seal(st, 0, NULL, &k) == ARL_OK && k.files == 0); /* now done */
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

/* migrate when only a sealed shard's states file is older: the sealed file stays in
 * rollback-journal mode (the open under RDB_ALLOW_SEALED had left it in WAL); and a sealed
 * file left in WAL by a killed migrate is put back by migrate run again. */
static void test_migrate_sealed_journal(void) {
    replay_store_close(st);
    st = NULL;
    rschema_test_override(2, "CREATE TABLE IF NOT EXISTS extra_v2 (a INTEGER);", 0);
    replay_open_opts oo = {.flags = 0};
    CHECK_MSG(replay_store_open(root, &oo, &st) == ARL_OK, "%s", arl_error_msg());
    if (!st) goto out;
    replay_admin_stats k = {-1, -1, -1};
    CHECK_MSG(replay_migrate(st, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    char v[32];
    /* the states file back to version 1 */
    raw_exec("shards/w2.states.sqlite",
             "PRAGMA user_version = 1; UPDATE meta SET value = '1' WHERE key = 'schema_version'",
             0);
    replay_store_close(st);
    CHECK(replay_store_open(root, &oo, &st) == ARL_OK);
    if (!st) goto out;
    CHECK_MSG(replay_migrate(st, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    query_text("shards/w2.states.sqlite", "SELECT user_version FROM pragma_user_version", v,
               sizeof v);
    CHECK_STR_EQ(v, "2");
    query_text("shards/w2.sqlite", "SELECT journal_mode FROM pragma_journal_mode", v, sizeof v);
    CHECK_STR_EQ(v, "delete");
    /* killed between the migration's commit and leaving WAL */
    replay_store_close(st);
    raw_exec("shards/w2.sqlite", "PRAGMA journal_mode = WAL", 0);
    CHECK(replay_store_open(root, &oo, &st) == ARL_OK);
    if (!st) goto out;
    CHECK_MSG(replay_migrate(st, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 0); /* nothing migrated, only finished */
    query_text("shards/w2.sqlite", "SELECT journal_mode FROM pragma_journal_mode", v, sizeof v);
    CHECK_STR_EQ(v, "delete");
    query_text("shards/w2.sqlite", "SELECT value FROM meta WHERE key = 'sealed'", v, sizeof v);
    CHECK_STR_EQ(v, "1");
out:
    rschema_test_override(0, NULL, 0);
}

/* Pin reasons: one line of UTF-8 text of at most REPLAY_PIN_REASON_MAX bytes (show prints it
 * on a terminal; list --json dropped an invalid one and cut a long one to 1023 bytes). */
static void test_pin_reason(void) {
    CHECK(replay_pin(st, "a/2", "bad \xff\xfe utf-8") == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "UTF-8") != NULL);
    CHECK(replay_pin(st, "a/2", "two\nlines") == ARL_ERR_ARG);
    CHECK(replay_pin(st, "a/2", "esc \x1b[31m") == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "control character") != NULL);
    char *big = malloc(REPLAY_PIN_REASON_MAX + 2);
    if (big) {
        memset(big, 'x', REPLAY_PIN_REASON_MAX + 1);
        big[REPLAY_PIN_REASON_MAX + 1] = 0;
        CHECK(replay_pin(st, "a/2", big) == ARL_ERR_ARG);
        big[REPLAY_PIN_REASON_MAX] = 0;
        CHECK(replay_pin(st, "a/2", big) == ARL_OK);
        free(big);
    }
    int pinned = 0;
    char reason[64];
    CHECK(replay_pin(st, "a/2", "caf\xc3\xa9 \xe2\x9c\x93\ttab") == ARL_ERR_ARG); /* a tab */
    CHECK(replay_pin(st, "a/2", "caf\xc3\xa9 \xe2\x9c\x93") == ARL_OK);
    CHECK(replay_pin_get(st, "a/2", &pinned, reason, sizeof reason) == ARL_OK && pinned);
    CHECK_STR_EQ(reason, "caf\xc3\xa9 \xe2\x9c\x93");
}

int main(void) {
    snprintf(root, sizeof root, "%s/store", test_tmpdir("admin"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_writer *w1 = NULL, *w2 = NULL;
    if (replay_store_open(root, &oo, &st) != ARL_OK || fx_catalog(st, 1, 2, &ids) != ARL_OK ||
        replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w1) != ARL_OK ||
        replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w2) != ARL_OK) {
        fprintf(stderr, "setup: %s\n", arl_error_msg());
        return 1;
    }
    write_traj(w1, "a/1", 0, 2, 0); /* running when its writer goes */
    write_traj(w2, "a/2", 1, 2, 1);
    replay_writer_close(w1);
    replay_writer_close(w2);
    TEST_RUN(test_seal_goes_on);
    TEST_RUN(test_gc_sealed_states);
    TEST_RUN(test_seal_interrupted);
    TEST_RUN(test_pin_reason);
    TEST_RUN(test_migrate_sealed_journal);
    replay_store_close(st);
    FX_CLEANUP(root);
    return test_finish();
}
