/* What gc, seal and migrate (spec/replay.md section 13.8) report about the files they do not
 * handle: a file whose writer is alive is skipped with the writer's pid and what happens to the
 * file instead (gc counts it; the lock's own message said "use another shard"), a shard
 * registered in the catalog whose file was deleted is reported (an error when the catalog has
 * trajectories in it; all three skipped it silently), migrate goes on past a file it cannot
 * migrate (it stopped at the first), and a shard file given instead of a store root is named
 * as such (was "needs a store root with a writable catalog"). */
#include <signal.h>
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

/* A finished trajectory uid of two segments in shard `shard` (a new writer, closed after). */
static void write_shard(int32_t shard, const char *uid, int slot) {
    replay_writer *w = NULL;
    CHECK_MSG(replay_writer_open(st, REPLAY_FILE_WORKER, shard, "run1", &w) == ARL_OK, "%s",
              arl_error_msg());
    if (!w) return;
    replay_traj_desc td = fx_traj_desc(&ids, uid, slot);
    int64_t t = -1, tok = 0;
    CHECK(replay_traj_begin(w, &td, &t) == ARL_OK);
    for (int s = 0; s < 2; s++) {
        fx_seg f;
        fx_seg_make(&f, 90 + (uint64_t)slot, s, 32, 2, 2, 4, tok, tok, 1 + 2 * s, 3, 0);
        CHECK(fx_state_put(w, uid, s, "kda_boundary", "p1", 0, tok + 32, &f.d.end_state_id) ==
              ARL_OK);
        CHECK(fx_seg_commit(w, t, &f, s == 1, 5, 1.0) == ARL_OK);
        tok += 32;
        fx_seg_free(&f);
    }
    replay_writer_close(w);
}

/* Run op on st with its report in a malloc'ed string (*text; the caller frees). */
#define REPORT(text, call)                                                                         \
    do {                                                                                           \
        size_t n_ = 0;                                                                             \
        FILE *m_ = open_memstream(&(text), &n_);                                                   \
        FILE *out = m_;                                                                            \
        (void)out;                                                                                 \
        call;                                                                                      \
        fclose(m_);                                                                                \
    } while (0)

static void reopen(void) {
    replay_store_close(st);
    replay_open_opts oo = {.flags = 0};
    st = NULL;
    CHECK_MSG(replay_store_open(root, &oo, &st) == ARL_OK, "%s", arl_error_msg());
}

/* A child process that holds the writer of worker shard `shard` of the store at dir (a live
 * writer) until holder_end. */
typedef struct holder {
    pid_t pid;
    int up[2], down[2];
} holder;

static void holder_start(holder *h, const char *dir, int32_t shard) {
    CHECK(pipe(h->up) == 0 && pipe(h->down) == 0);
    h->pid = fork();
    if (h->pid == 0) {
        replay_store *cs = NULL;
        replay_writer *w = NULL;
        replay_open_opts oo = {.flags = 0};
        char c = replay_store_open(dir, &oo, &cs) == ARL_OK &&
                         replay_writer_open(cs, REPLAY_FILE_WORKER, shard, "run1", &w) == ARL_OK
                     ? 'y'
                     : 'n';
        if (write(h->up[1], &c, 1) != 1) _exit(2);
        if (read(h->down[0], &c, 1) != 1) _exit(3);
        replay_writer_close(w);
        replay_store_close(cs);
        _exit(0);
    }
    char c = 0;
    CHECK(h->pid > 0 && read(h->up[0], &c, 1) == 1 && c == 'y');
}

static void holder_end(holder *h) {
    char c = 'q';
    CHECK(write(h->down[1], &c, 1) == 1);
    int ws = 0;
    CHECK(waitpid(h->pid, &ws, 0) == h->pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    for (int i = 0; i < 2; i++) {
        close(h->up[i]);
        close(h->down[i]);
    }
}

/* A child holds shard 1's writer: gc skips it, names the pid and counts it in its summary; seal
 * skips it with its own words (the lock's message said "use another shard") and counts it. */
static void test_writer_alive(void) {
    holder h;
    holder_start(&h, root, 1);
    const pid_t pid = h.pid;
    char want[200];
    snprintf(want, sizeof want, "shards/w1.sqlite: skipped (writer alive, pid %ld): ", (long)pid);
    replay_retention r = {.rollout = "last", .min_age_ms = 0};
    replay_gc_stats t;
    memset(&t, 0xFF, sizeof t);
    char *text = NULL;
    arl_status s;
    REPORT(text, s = replay_gc(st, &r, out, &t));
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)t.skipped, 1);
    CHECK_EQ_INT((int)t.files, 2);
    CHECK_EQ_INT((int)t.missing, 0);
    CHECK_MSG(text && strstr(text, want) && strstr(text, "it collects its own states") &&
                  !strstr(text, "another shard"),
              "%s", text ? text : "");
    free(text);
    replay_admin_stats k = {-1, -1, -1};
    text = NULL;
    REPORT(text, s = replay_seal(st, 1, out, &k));
    CHECK_MSG(s == ARL_OK && k.files == 0, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.skipped, 1); /* counted, as gc counts it (seal did not) */
    CHECK_EQ_INT((int)k.missing, 0);
    CHECK_MSG(text && strstr(text, want) && strstr(text, "seal it once its writer has finished") &&
                  !strstr(text, "another shard"),
              "%s", text ? text : "");
    free(text);
    holder_end(&h);
}

/* A child holds the writer of the only shard of a store of its own, older than this build
 * (a build of schema version 2): migrate skips it, names the pid and counts it (it did not
 * count skipped files); once the writer is gone it migrates it. */
static void test_migrate_skips_live_writer(void) {
    char r2[512];
    snprintf(r2, sizeof r2, "%s/store", test_tmpdir("admin_report_migrate"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *s2 = NULL;
    replay_writer *w = NULL;
    fx_ids i2;
    CHECK_MSG(replay_store_open(r2, &oo, &s2) == ARL_OK && fx_catalog(s2, 1, 3, &i2) == ARL_OK &&
                  replay_writer_open(s2, REPLAY_FILE_WORKER, 1, "run1", &w) == ARL_OK,
              "%s", arl_error_msg());
    replay_writer_close(w);
    replay_store_close(s2);
    s2 = NULL;
    holder h;
    holder_start(&h, r2, 1); /* this build, schema version 1 */
    rschema_test_override(2, "CREATE TABLE IF NOT EXISTS extra_v2 (a INTEGER);", 0);
    oo.flags = 0;
    CHECK_MSG(replay_store_open(r2, &oo, &s2) == ARL_OK, "%s", arl_error_msg());
    replay_admin_stats k = {-1, -1, -1};
    char *text = NULL;
    arl_status s = ARL_OK;
    char want[200];
    snprintf(want, sizeof want, "shards/w1.sqlite: skipped (writer alive, pid %ld): ", (long)h.pid);
    if (s2) REPORT(text, s = replay_migrate(s2, out, &k));
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_MSG(text && strstr(text, want), "%s", text ? text : "");
    CHECK_EQ_INT((int)k.files, 0);
    CHECK_EQ_INT((int)k.skipped, 1);
    CHECK_EQ_INT((int)k.missing, 0);
    free(text);
    holder_end(&h);
    if (s2) CHECK_MSG(replay_migrate(s2, NULL, &k) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    CHECK_EQ_INT((int)k.skipped, 0);
    replay_store_close(s2);
    rschema_test_override(0, NULL, 0);
    FX_CLEANUP(r2);
}

/* remove shards/w<id>.sqlite and its side files */
static void remove_shard(int id) {
    static const char *const ext[] = {".sqlite",           ".sqlite-wal",    ".sqlite-shm",
                                      ".sqlite.lock",      ".states.sqlite", ".states.sqlite-wal",
                                      ".states.sqlite-shm"};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/shards/w%d%s", root, id, ext[i]);
        unlink(p);
    }
}

/* Shard 3 (a trajectory of the catalog's group in it) and shard 4 (registered, nothing in it)
 * deleted: gc, seal and migrate report both, fail (exit 1) for the lost one after handling the
 * others; with only shard 4 gone they report it and succeed. */
static void test_missing_file(void) {
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 4, "run1", &w) == ARL_OK);
    replay_writer_close(w);
    remove_shard(4);
    reopen();
    if (!st) return;
    replay_retention r = {.rollout = "last", .min_age_ms = 0};
    replay_gc_stats t;
    char *text = NULL;
    arl_status s;
    REPORT(text, s = replay_gc(st, &r, out, &t));
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)t.missing, 1);
    CHECK_MSG(text && strstr(text, "shards/w4.sqlite: skipped: registered in the catalog but its "
                                   "file is missing; nothing refers to it"),
              "%s", text ? text : "");
    free(text);
    remove_shard(3);
    reopen();
    if (!st) return;
    text = NULL;
    REPORT(text, s = replay_gc(st, &r, out, &t));
    CHECK_EQ_INT(s, ARL_ERR_CORRUPT);
    CHECK(strstr(arl_error_msg(), "shards/w3.sqlite: registered in the catalog but its file is "
                                  "missing, with the 1 trajectories the catalog has in it (e.g. "
                                  "a/3): restore it from a backup") != NULL);
    CHECK_MSG(text &&
                  strstr(text, "shards/w3.sqlite: failed: registered in the catalog but its "
                               "file is missing: the 1 trajectories") &&
                  strstr(text, "shards/w2.sqlite: "),
              "%s", text ? text : ""); /* the others still collected */
    free(text);
    replay_admin_stats k = {-1, -1, -1};
    text = NULL;
    REPORT(text, s = replay_seal(st, 0, out, &k));
    CHECK_EQ_INT(s, ARL_ERR_CORRUPT);
    CHECK_MSG(text && strstr(text, "shards/w3.sqlite: failed: registered") &&
                  strstr(text, "shards/w4.sqlite: skipped: registered") &&
                  strstr(text, "shards/w2.sqlite: sealed"),
              "%s", text ? text : "");
    free(text);
    CHECK_EQ_INT((int)k.missing, 2);
    CHECK(replay_seal(st, 3, NULL, &k) == ARL_ERR_CORRUPT); /* was "no shard 3 in the store" */
    text = NULL;
    REPORT(text, s = replay_migrate(st, out, &k));
    CHECK_EQ_INT(s, ARL_ERR_CORRUPT);
    CHECK_MSG(text && strstr(text, "shards/w3.sqlite: failed: registered") &&
                  strstr(text, "shards/w2.sqlite: schema version"),
              "%s", text ? text : "");
    CHECK_EQ_INT((int)k.missing, 2);
    free(text);
}

/* migrate goes on past a file it cannot read (it stopped there, leaving later files old) and
 * returns that file's error; a shard file given instead of the store root is named as such. */
static void test_migrate_goes_on_and_file(void) {
    char p[700];
    snprintf(p, sizeof p, "%s/shards/w1.sqlite", root); /* unsealed: migrated through its writer */
    replay_store_close(st);
    st = NULL;
    FILE *f = fopen(p, "wb"); /* shard 1 damaged: not a database */
    if (f) {
        fputs("not a database at all, not at all, not at all, not at all, not at all....", f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/shards/w1.sqlite-wal", root);
    unlink(p);
    snprintf(p, sizeof p, "%s/shards/w1.sqlite-shm", root);
    unlink(p);
    rschema_test_override(2, "CREATE TABLE IF NOT EXISTS extra_v2 (a INTEGER);", 0);
    reopen();
    if (!st) goto out;
    char *text = NULL;
    replay_admin_stats k = {-1, -1, -1};
    arl_status s;
    REPORT(text, s = replay_migrate(st, out, &k));
    CHECK(s != ARL_OK);
    CHECK_MSG(text && strstr(text, "shards/w1.sqlite: failed: ") &&
                  strstr(text, "shards/w2.sqlite: migrated from schema version 1 to 2"),
              "%s", text ? text : "");
    CHECK_EQ_INT((int)k.files, 1);
    free(text);
    /* a shard file instead of the store root */
    snprintf(p, sizeof p, "%s/shards/w2.sqlite", root);
    replay_store *fs = NULL;
    replay_open_opts oo = {.flags = 0};
    CHECK_MSG(replay_store_open(p, &oo, &fs) == ARL_OK, "%s", arl_error_msg());
    if (fs) {
        replay_gc_stats t;
        CHECK(replay_gc(fs, NULL, NULL, &t) == ARL_ERR_STATE);
        CHECK(strstr(arl_error_msg(), "w2.sqlite is a shard file, not a store root: gc works on "
                                      "a store root") != NULL);
        CHECK(replay_seal(fs, 0, NULL, &k) == ARL_ERR_STATE);
        CHECK(strstr(arl_error_msg(), "is a shard file, not a store root: seal") != NULL);
        CHECK(replay_migrate(fs, NULL, &k) == ARL_ERR_STATE);
        CHECK(strstr(arl_error_msg(), "is a shard file, not a store root: migrate") != NULL);
        CHECK(strstr(arl_error_msg(), "migrated the catalog") == NULL);
        replay_store_close(fs);
    }
out:
    rschema_test_override(0, NULL, 0);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(root, sizeof root, "%s/store", test_tmpdir("admin_report"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    if (replay_store_open(root, &oo, &st) != ARL_OK || fx_catalog(st, 1, 3, &ids) != ARL_OK) {
        fprintf(stderr, "setup: %s\n", arl_error_msg());
        return 1;
    }
    write_shard(1, "a/1", 0);
    write_shard(2, "a/2", 1);
    write_shard(3, "a/3", 2);
    TEST_RUN(test_writer_alive);
    TEST_RUN(test_migrate_skips_live_writer);
    TEST_RUN(test_missing_file);
    TEST_RUN(test_migrate_goes_on_and_file);
    replay_store_close(st);
    FX_CLEANUP(root);
    return test_finish();
}
