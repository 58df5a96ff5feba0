/* tests/replay/test_concurrency.c: what tests/replay/stress_concurrency.sh found when several
 * processes use one store at once, each case made deterministic with a second connection in
 * this process:
 *   - seal of a finished shard while a reader (list, show, verify) has the file open: leaving
 *     WAL mode needs the file to itself, and SQLite refuses it at once while any other
 *     connection is open; seal waits for the reader (it failed with "database is locked ...
 *     held the database lock for more than 10 s", the seal half done);
 *   - a writer that continues its shard (rollout --shard N, a learner reopening its learner
 *     file) while a maintenance command (gc, seal, recover) has that file for a moment: the
 *     writer waits for it (it failed: "another process (pid P) is writing this file"); against
 *     a live writer, and for one maintenance command against another, ARL_ERR_BUSY at once;
 *   - a second open of a shard in the process of its writer: refused, and the writer keeps its
 *     lock (closing the second attempt's descriptor let the writer's lock go, so another
 *     process could open the shard as a second writer);
 *   - a new shard (--shard 0) registered in the catalog before its file exists: its writer holds
 *     its lock from before the registration commits, so readers (stats, list, gc, seal, verify)
 *     see it being created (they warned "registered in the catalog but its file is missing");
 *   - export and show of a trajectory its writer commits to meanwhile: one snapshot per
 *     trajectory (the header said 1 segment and 2 followed);
 *   - a new shard's id (--shard 0) skips an id whose lock a writer given that id explicitly
 *     (--shard N) holds before registering it (the two collided and one failed);
 *   - two writers creating the same new store (two rollout workers started together with one
 *     --out): the catalog the other made between this one's look for catalog.sqlite and its
 *     listing of the folder was taken for a stray store file, "holds store files
 *     (catalog.sqlite) but no catalog.sqlite" (one clean CI run, sanitized build); this test's
 *     opendir lets a child process create the store at that point. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fopencookie */
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static replay_store *st;
static fx_ids ids;
static char root[512];

/* A read-only connection to the store file rel, with a read done (it holds the file open). */
static sqlite3 *reader_open(const char *rel) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "SELECT count(*) FROM sqlite_schema", NULL, NULL, NULL) == SQLITE_OK);
    return db;
}

static void *close_later(void *arg) {
    usleep(300 * 1000);
    sqlite3_close(arg);
    return NULL;
}

/* One text value of sql over the store file rel (read-only), into buf. */
static void query_text(const char *rel, const char *sql, char *buf, size_t cap) {
    sqlite3 *db = reader_open(rel);
    sqlite3_stmt *q = NULL;
    buf[0] = 0;
    CHECK(sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK);
    if (q && sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
        snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* A reader holds shard 1 open when the seal starts and closes it 0.3 s later: the seal waits
 * for it and seals the file (rollback-journal mode, catalog sealed_at_ms). */
static void test_seal_waits_for_reader(void) {
    sqlite3 *r = reader_open("shards/w1.sqlite");
    pthread_t th;
    CHECK(pthread_create(&th, NULL, close_later, r) == 0);
    replay_admin_stats k = {-1, -1, -1};
    arl_status s = replay_seal(st, 1, NULL, &k);
    pthread_join(th, NULL);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)k.files, 1);
    CHECK_EQ_INT((int)k.skipped, 0);
    char v[32];
    query_text("shards/w1.sqlite", "SELECT journal_mode FROM pragma_journal_mode", v, sizeof v);
    CHECK_STR_EQ(v, "delete");
    query_text("catalog.sqlite", "SELECT sealed_at_ms IS NOT NULL FROM shards WHERE shard_id = 1",
               v, sizeof v);
    CHECK_STR_EQ(v, "1");
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A child process that opens shard 2 of the store (as a maintenance command when brief is set),
 * says so on the returned pipe, holds it for hold_ms and exits.  Its pid in *pid. */
static int hold_shard(int brief, int hold_ms, pid_t *pid) {
    int p[2];
    if (pipe(p)) return -1;
    *pid = fork();
    if (*pid == 0) {
        close(p[0]);
        replay_store *cs = NULL;
        replay_writer *w = NULL;
        replay_open_opts oo = {.flags = 0};
        char ok = replay_store_open(root, &oo, &cs) == ARL_OK &&
                  rwriter_open(cs, REPLAY_FILE_WORKER, 2, NULL, brief, &w) == ARL_OK;
        if (write(p[1], &ok, 1) != 1) _exit(1);
        usleep((useconds_t)hold_ms * 1000);
        replay_writer_close(w);
        replay_store_close(cs);
        _exit(ok ? 0 : 1);
    }
    close(p[1]);
    char ok = 0;
    if (*pid < 0 || read(p[0], &ok, 1) != 1 || !ok) {
        close(p[0]);
        return -1;
    }
    return p[0];
}

static void reap(pid_t pid, int fd) {
    int ws = 0;
    CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(fd);
}

/* gc, seal or recover holds shard 2 for 0.3 s when its writer reopens it: the writer waits and
 * gets it (it was ARL_ERR_BUSY, "another process is writing this file"); a second maintenance
 * command skips it at once. */
static void test_writer_waits_for_maintenance(void) {
    pid_t pid;
    int fd = hold_shard(1, 300, &pid);
    CHECK(fd >= 0);
    if (fd < 0) return;
    replay_writer *w = NULL;
    double t0 = now_s();
    CHECK(rwriter_open(st, REPLAY_FILE_WORKER, 2, NULL, 1, &w) == ARL_ERR_BUSY);
    CHECK(strstr(arl_error_msg(), "another replay command") != NULL);
    CHECK(now_s() - t0 < 0.2);
    arl_status s = replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    replay_writer_close(w);
    reap(pid, fd);
}

/* A live writer holds shard 2: another writer and a maintenance command get ARL_ERR_BUSY at
 * once, naming it a writer. */
static void test_writer_busy_at_once(void) {
    pid_t pid;
    int fd = hold_shard(0, 1500, &pid);
    CHECK(fd >= 0);
    if (fd < 0) return;
    replay_writer *w = NULL;
    double t0 = now_s();
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w) == ARL_ERR_BUSY);
    CHECK(strstr(arl_error_msg(), "is writing this file") != NULL);
    CHECK(rwriter_open(st, REPLAY_FILE_WORKER, 2, NULL, 1, &w) == ARL_ERR_BUSY);
    CHECK(strstr(arl_error_msg(), "is writing this file") != NULL);
    CHECK(now_s() - t0 < 1.0);
    reap(pid, fd);
}

/* 0 when a child process can take shard 2 over as a maintenance command (its lock is free). */
static int child_takes_shard2(void) {
    pid_t pid;
    int fd = hold_shard(1, 0, &pid);
    if (fd < 0) {
        if (pid > 0) waitpid(pid, NULL, 0);
        return 1;
    }
    reap(pid, fd);
    return 0;
}

/* A second open of shard 2 in its writer's process: ARL_ERR_BUSY, and the lock stays held. */
static void test_second_open_keeps_lock(void) {
    replay_writer *w = NULL, *w2 = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w) == ARL_OK);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w2) == ARL_ERR_BUSY);
    CHECK(strstr(arl_error_msg(), "in this process") != NULL);
    CHECK(rwriter_open(st, REPLAY_FILE_WORKER, 2, NULL, 1, &w2) == ARL_ERR_BUSY);
    CHECK(child_takes_shard2() != 0); /* still held */
    replay_writer_close(w);
    CHECK(child_takes_shard2() == 0);
}

static char new_shard[600];
static int new_shard_missing = -1; /* what a reader process saw when the registration committed */

static int on_catalog_commit(void *arg) {
    (void)arg;
    if (new_shard_missing >= 0) return 0;
    pid_t pid = fork();
    if (pid == 0) _exit(rstore_file_missing(new_shard) ? 1 : 0);
    int ws = 0;
    new_shard_missing =
        pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) ? WEXITSTATUS(ws) : 2;
    return 0;
}

/* A writer of a new shard (shard 0: id 3) registers it in the catalog holding its lock: a
 * reader in another process that finds the row before the file sees the file being created;
 * once its writer is gone, a registered shard without its file is missing. */
static void test_new_shard_not_missing(void) {
    snprintf(new_shard, sizeof new_shard, "%s/shards/w3.sqlite", root);
    sqlite3_commit_hook(st->cat.db, on_catalog_commit, NULL);
    replay_writer *w = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    sqlite3_commit_hook(st->cat.db, NULL, NULL);
    CHECK(w && replay_writer_shard_id(w) == 3);
    CHECK_EQ_INT(new_shard_missing, 0);
    replay_writer_close(w);
    /* a registered shard whose writer died before creating its file */
    CHECK(sqlite3_exec(st->cat.db,
                       "INSERT INTO shards(shard_id, kind, file_name, host, created_at_ms) "
                       "VALUES (4, 'worker', 'shards/w4.sqlite', 'h', 0)",
                       NULL, NULL, NULL) == SQLITE_OK);
    int n_missing = -1;
    CHECK(rstore_report_missing(st, 0, NULL, &n_missing) == ARL_OK);
    CHECK_EQ_INT(n_missing, 1);
}

/* ---- a writer that commits while a reader prints: a stream whose first write commits the next
 * segment of running trajectory b/0 (shard 5) ---- */

static replay_writer *wb;
static int64_t tb = -1;
static int b_segs; /* committed segments of b/0 */
static int commit_armed;
static const char *commit_on; /* commit once what was written holds this (NULL: at once) */
static char *printed;
static size_t printed_len;

static void commit_b_segment(void) {
    fx_seg f;
    const int64_t tok = 32 * (int64_t)b_segs;
    fx_seg_make(&f, 9, b_segs, 32, 2, 2, 4, tok, tok, 1 + 2 * b_segs, 3, b_segs == 0);
    CHECK_MSG(fx_seg_commit(wb, tb, &f, 0, 0, 0.0) == ARL_OK, "%s", arl_error_msg());
    fx_seg_free(&f);
    b_segs++;
}

static ssize_t printed_write(void *c, const char *buf, size_t n) {
    (void)c;
    char *p = realloc(printed, printed_len + n + 1);
    if (!p) return -1;
    memcpy(p + printed_len, buf, n);
    printed = p;
    printed_len += n;
    printed[printed_len] = 0;
    if (commit_armed && (!commit_on || strstr(printed, commit_on))) {
        commit_armed = 0;
        commit_b_segment();
    }
    return (ssize_t)n;
}

static FILE *printing_stream(const char *on) {
    commit_on = on;
    free(printed);
    printed = NULL;
    printed_len = 0;
    commit_armed = 1;
    FILE *f = fopencookie(NULL, "w", (cookie_io_functions_t){.write = printed_write});
    if (f) setvbuf(f, NULL, _IONBF, 0);
    return f;
}

/* export: the writer commits a segment of b/0 while b/0's shard is being exported (at the line
 * of b/a, before it); b/0's line agrees with itself (counts.segments = the segments listed). */
static void test_export_snapshot(void) {
    FILE *f = printing_stream("\"traj_uid\":\"b/a\"");
    CHECK(f != NULL);
    if (!f) return;
    CHECK_MSG(replay_export(st, NULL, NULL, f, NULL) == ARL_OK, "%s", arl_error_msg());
    fclose(f);
    CHECK(commit_armed == 0);
    const char *line =
        printed ? strstr(printed, "{\"format\":\"agentrl.trajectory/1\",\"traj_uid\":\"b/0\"")
                : NULL;
    CHECK(line != NULL);
    if (!line) return;
    json_t *j = json_loadb(line, strcspn(line, "\n"), 0, NULL);
    CHECK(j != NULL);
    const json_int_t n =
        json_integer_value(json_object_get(json_object_get(j, "counts"), "segments"));
    CHECK_EQ_INT((int)n, (int)json_array_size(json_object_get(j, "segments")));
    CHECK_EQ_INT((int)n, b_segs);
    json_decref(j);
}

/* show of b/0: the writer commits its next segment once the header is printed; the segments
 * shown are those the header counts. */
static void test_show_snapshot(void) {
    FILE *f = printing_stream(NULL);
    CHECK(f != NULL);
    if (!f) return;
    CHECK_MSG(replay_show(st, "b/0", NULL, f) == ARL_OK, "%s", arl_error_msg());
    fclose(f);
    CHECK(commit_armed == 0);
    int header = -1, listed = 0;
    const char *h = printed ? strstr(printed, "  segments ") : NULL;
    if (h) header = atoi(h + strlen("  segments "));
    for (const char *p = printed; p && (p = strstr(p, "\n== segment ")); p++)
        listed++;
    CHECK_EQ_INT(header, b_segs - 1);
    CHECK_EQ_INT(listed, header);
}

/* A writer of explicit shard 6 holds its lock and has not registered it yet (a child process):
 * a new shard (shard 0, the registered ones end at 5) gets id 7 instead of failing on 6. */
static void test_auto_id_skips_held(void) {
    char lock[600];
    snprintf(lock, sizeof lock, "%s/shards/w6.sqlite.lock", root);
    int p[2];
    CHECK(pipe(p) == 0);
    const pid_t pid = fork();
    if (pid == 0) {
        int fd = -1;
        uint64_t dev, ino;
        char ok = rlock_acquire(lock, "shards/w6.sqlite", 0, &fd, &dev, &ino) == ARL_OK;
        if (write(p[1], &ok, 1) != 1) _exit(1);
        usleep(500 * 1000);
        _exit(ok ? 0 : 1);
    }
    close(p[1]);
    char ok = 0;
    CHECK(pid > 0 && read(p[0], &ok, 1) == 1 && ok);
    replay_writer *w = NULL;
    const arl_status s = replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK(w && replay_writer_shard_id(w) == 7);
    replay_writer_close(w);
    reap(pid, p[0]);
}

/* ---- a second writer creating the same new store: opendir of race_root (the library's check
 * of a path to create a store at lists it) first has a child process create the store there,
 * as a writer started at the same moment does ---- */

static char race_root[600];
static int race_created = -1; /* the child's exit status: 0 when it created the store */

DIR *opendir(const char *name) {
    static DIR *(*real)(const char *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "opendir");
    if (*race_root && !strcmp(name, race_root)) {
        *race_root = 0; /* once; and not in the child */
        const pid_t pid = fork();
        if (pid == 0) {
            replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
            replay_store *cs = NULL;
            const arl_status s = replay_store_open(name, &o, &cs);
            if (s != ARL_OK) fprintf(stderr, "the other writer: %s\n", arl_error_msg());
            replay_store_close(cs);
            _exit(s == ARL_OK ? 0 : 3);
        }
        int ws = 0;
        race_created =
            pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) ? WEXITSTATUS(ws) : 2;
    }
    return real ? real(name) : NULL;
}

/* The other writer creates the store (catalog.sqlite, shards/) in the empty folder this one is
 * about to create it in: this one opens that store. */
static void test_create_race(void) {
    char p[600];
    snprintf(p, sizeof p, "%s/new-store", test_tmpdir("create-race"));
    CHECK(mkdir(p, 0755) == 0); /* an empty folder is a path to create a store at */
    snprintf(race_root, sizeof race_root, "%s", p);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *s2 = NULL;
    CHECK_MSG(replay_store_open(p, &o, &s2) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(race_created, 0);
    CHECK(*race_root == 0); /* the race was run */
    replay_writer *w = NULL;
    CHECK(s2 && replay_writer_open(s2, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    replay_writer_close(w);
    replay_store_close(s2);
    *race_root = 0;
}

int main(void) {
    snprintf(root, sizeof root, "%s/store", test_tmpdir("concurrency"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_writer *w1 = NULL, *w2 = NULL;
    int64_t t = -1;
    if (replay_store_open(root, &oo, &st) != ARL_OK || fx_catalog(st, 1, 2, &ids) != ARL_OK ||
        replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w1) != ARL_OK ||
        fx_write_traj(w1, &ids, "a/0", 1, 0, 2, 32, 2, 2, 1.0, &t) != ARL_OK ||
        replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w2) != ARL_OK ||
        fx_write_traj(w2, &ids, "a/1", 2, 1, 1, 32, 2, 2, 1.0, &t) != ARL_OK) {
        fprintf(stderr, "setup: %s\n", arl_error_msg());
        return 1;
    }
    replay_writer_close(w1);
    replay_writer_close(w2);
    TEST_RUN(test_seal_waits_for_reader);
    TEST_RUN(test_writer_waits_for_maintenance);
    TEST_RUN(test_writer_busy_at_once);
    TEST_RUN(test_second_open_keeps_lock);
    TEST_RUN(test_new_shard_not_missing);
    replay_traj_desc td = fx_traj_desc(&ids, "b/0", 0);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 5, "run1", &wb) == ARL_OK);
    CHECK(wb && fx_write_traj(wb, &ids, "b/a", 3, 1, 1, 32, 2, 2, 1.0, &tb) == ARL_OK);
    CHECK(wb && replay_traj_begin(wb, &td, &tb) == ARL_OK);
    if (wb) commit_b_segment();
    TEST_RUN(test_export_snapshot);
    TEST_RUN(test_show_snapshot);
    replay_writer_close(wb);
    free(printed);
    TEST_RUN(test_auto_id_skips_held);
    TEST_RUN(test_create_race);
    replay_store_close(st);
    return test_finish();
}
