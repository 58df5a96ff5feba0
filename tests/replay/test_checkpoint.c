/* Background WAL checkpoints of writers (replay/checkpoint.c): the thread checkpoints once the
 * WAL passes RCKPT_WAKE_FRAMES and keeps it below the spec's 1000 frames; close and seal stop
 * it (no thread or connection left, the WAL removed by the last close); a failing background
 * checkpoint (fsync error) loses nothing and the writer goes on; a writer killed with SIGKILL
 * while its checkpointer runs leaves a store that verifies, with every reported segment and
 * state intact.  The states here are large (12 chunks of 64 KiB, 14 WAL frames of 64 KiB per
 * S_s) so that the states file's WAL reaches the wake threshold within ~40 states.
 * replay_writer_checkpoint (a TRUNCATE checkpoint of both files after any background pass)
 * leaves empty WALs and database files that hold every committed segment; a reader holding
 * an old snapshot makes background passes wait, never fail. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"
#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/faultvfs.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

#define NCH 12
#define CH_FLOATS (16 * 1024) /* 64 KiB of f32 per chunk */

static float chunk_data[NCH][CH_FLOATS];
static fx_ids ids;

static void fill_chunks(uint64_t seed) {
    for (int c = 0; c < NCH; c++)
        for (int i = 0; i < CH_FLOATS; i++)
            chunk_data[c][i] =
                (float)(fx_hash(seed * 131 + (uint64_t)c * 7919 + (uint64_t)i) % 1000);
}

/* S_s then C_s for segment s of trajectory t (uid); the state's chunks from seed. */
static arl_status put_segment(replay_writer *w, int64_t t, const char *uid, uint64_t seed, int s,
                              int64_t *state_id) {
    fill_chunks(seed + (uint64_t)s);
    replay_state_chunk ch[NCH];
    for (int c = 0; c < NCH; c++)
        ch[c] = (replay_state_chunk){.layer = c,
                                     .tensor = "S",
                                     .kind = ARL_BLOB_KDA_STATE,
                                     .dtype = ARL_BLOB_F32,
                                     .ndim = 3,
                                     .dims = {1, 128, 128},
                                     .data = chunk_data[c]};
    replay_state_desc sd = {.traj_uid = uid,
                            .seg_index = s,
                            .kind = "kda_boundary",
                            .pass_uid = "p",
                            .version_min = 1,
                            .version_max = 1,
                            .numerics = "cpu-f32",
                            .model_config_sha256 = "00",
                            .n_tokens = (s + 1) * 32};
    fx_seg f;
    fx_seg_make(&f, seed, s, 32, 1, 2, 2, s * 32, s * 32, 1 + s, 1, 0);
    arl_status r = replay_state_put(w, &sd, ch, NCH, &f.d.end_state_id);
    if (r == ARL_OK) r = replay_segment_append(w, t, &f.d);
    if (state_id) *state_id = f.d.end_state_id;
    fx_seg_free(&f);
    return r;
}

static arl_status begin(replay_writer *w, const char *uid, int64_t *t) {
    replay_traj_desc td = {.traj_uid = uid,
                           .run_id = ids.run_id,
                           .group_id = ids.group_id,
                           .task_id = ids.task_id,
                           .env_id = ids.env_id,
                           .fork_seg_index = -1};
    return replay_traj_begin(w, &td, t);
}

/* The state of segment s of uid holds seed's chunks. */
static int state_intact(replay_store *st, int32_t shard, int64_t state_id, uint64_t seed, int s) {
    replay_state_data sd = {0};
    arl_status r = replay_state_load(st, shard, state_id, &sd);
    int ok = r == ARL_OK && sd.n_chunks == NCH;
    fill_chunks(seed + (uint64_t)s);
    for (size_t c = 0; ok && c < sd.n_chunks; c++)
        ok = !memcmp(sd.chunks[c].data, chunk_data[sd.chunks[c].layer], sizeof chunk_data[0]);
    replay_state_data_free(&sd);
    return ok;
}

static int verify_clean(replay_store *st) {
    int64_t ne = -1, nw = -1;
    FILE *devnull = fopen("/dev/null", "w");
    arl_status r = replay_verify(st, NULL, devnull, &ne, &nw);
    fclose(devnull);
    return r == ARL_OK && ne == 0;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Poll the counters until pred holds or 20 s pass (a loaded machine schedules the thread late). */
static void wait_stats(rckpt *c, int64_t min_background, int64_t min_failed, rckpt_stats *out) {
    double t0 = mono();
    do {
        rckpt_get_stats(c, out);
        if (out->n_background >= min_background && out->n_failed >= min_failed) return;
        usleep(2000);
    } while (mono() - t0 < 20);
}

static void test_background(void) {
    const char *dir = test_tmpdir("ckpt");
    char root[512], wal[600];
    snprintf(root, sizeof root, "%s/store", dir);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    CHECK(replay_store_open(root, &o, &st) == ARL_OK);
    CHECK(fx_catalog(st, 1, 1, &ids) == ARL_OK);
    replay_writer *w;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    CHECK(w->ckpt_w && w->ckpt_s);
    int64_t t, sid[80];
    CHECK(begin(w, "b/0", &t) == ARL_OK);
    /* 80 states of 14 frames: past the wake threshold (500) twice, below the backstop (1000)
     * only if the thread keeps up */
    for (int s = 0; s < 80; s++)
        CHECK(put_segment(w, t, "b/0", 1000, s, &sid[s]) == ARL_OK);
    rckpt_stats a;
    wait_stats(w->ckpt_s, 1, 0, &a);
    CHECK_MSG(a.n_background >= 1 && a.frames_copied >= RCKPT_WAKE_FRAMES,
              "states file: %lld background checkpoints, %lld frames copied",
              (long long)a.n_background, (long long)a.frames_copied);
    CHECK_EQ_INT(a.n_failed, 0);
    /* The WAL stays bounded: by the thread, or, where a loaded machine runs it late, by the
     * foreground backstop at 1000 frames, which the commit that reaches it may pass by its own
     * frames (14 for a state here, up to ~25 when b-tree pages split; 64 is a bound with room) */
    CHECK_MSG(a.max_frames < RCKPT_BACKSTOP_FRAMES + 64, "max %d frames", a.max_frames);
    CHECK(a.max_frames < RCKPT_BACKSTOP_FRAMES || a.n_foreground >= 1);
    int32_t shard = w->shard_id;
    snprintf(wal, sizeof wal, "%s/%s-wal", root, w->states_file);
    replay_writer_close(w); /* joins the threads (ASan/LSan: nothing left) */
    replay_store_close(st);
    /* the writer's connection was the last: it checkpointed and removed the WAL, so no
     * checkpointer connection outlived the close */
    struct stat sb;
    CHECK_MSG(stat(wal, &sb) != 0, "%s still exists after the last close", wal);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    for (int s = 0; s < 80; s += 3)
        CHECK_MSG(state_intact(st, shard, sid[s], 1000, s), "after reopen: segment %d", s);
    CHECK(verify_clean(st));
    replay_store_close(st);

    /* --fg-checkpoint: no threads, SQLite's automatic checkpoint */
    o.flags = REPLAY_OPEN_FG_CHECKPOINT;
    CHECK(replay_store_open(root, &o, &st) == ARL_OK);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    CHECK(!w->ckpt_w && !w->ckpt_s);
    CHECK(begin(w, "b/1", &t) == ARL_OK);
    CHECK(put_segment(w, t, "b/1", 2000, 0, &sid[0]) == ARL_OK);
    replay_writer_close(w);
    replay_store_close(st);

    /* seal stops the checkpointers before leaving WAL mode */
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, shard, "run1", &w) == ARL_OK);
    CHECK(begin(w, "b/2", &t) == ARL_OK);
    for (int s = 0; s < 40; s++)
        CHECK(put_segment(w, t, "b/2", 3000, s, NULL) == ARL_OK);
    arl_status sr = replay_writer_seal(w);
    CHECK_MSG(sr == ARL_OK, "seal: %s", arl_error_msg());
    CHECK(verify_clean(st));
    replay_store_close(st);
    fx_rmtree(dir);
}

static int64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) ? -1 : (int64_t)sb.st_size;
}

/* Segments in a copy of the worker file taken without its WAL (what the database file alone
 * holds); -1 if it cannot be read. */
static int64_t segments_in_db_file(const char *path, const char *dir) {
    char copy[600], cmd[1400];
    snprintf(copy, sizeof copy, "%s/copy.sqlite", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
    if (system(cmd)) return -1;
    sqlite3 *db;
    sqlite3_stmt *q = NULL;
    int64_t n = -1;
    if (sqlite3_open_v2(copy, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT count(*) FROM segments", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    unlink(copy);
    return n;
}

/* replay_writer_checkpoint: after it, both WALs are empty and the database files alone hold
 * every committed segment; it waits for a background pass in progress (the states file's WAL
 * passes the wake threshold just before it is called), and the writer and its checkpointers go
 * on afterwards; the same without background threads. */
static void test_truncate(void) {
    const char *dir = test_tmpdir("ckpt-trunc");
    char root[512], wal_w[600], wal_s[600], db_w[600];
    snprintf(root, sizeof root, "%s/store", dir);
    for (int fg = 0; fg < 2; fg++) {
        replay_open_opts o = {.flags = REPLAY_OPEN_CREATE | (fg ? REPLAY_OPEN_FG_CHECKPOINT : 0)};
        replay_store *st;
        CHECK(replay_store_open(root, &o, &st) == ARL_OK);
        if (!fg) CHECK(fx_catalog(st, 1, 1, &ids) == ARL_OK);
        replay_writer *w;
        CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
        CHECK(fg ? !w->ckpt_s : w->ckpt_s != NULL);
        snprintf(wal_w, sizeof wal_w, "%s/%s-wal", root, w->file);
        snprintf(wal_s, sizeof wal_s, "%s/%s-wal", root, w->states_file);
        snprintf(db_w, sizeof db_w, "%s/%s", root, w->file);
        char uid[16];
        snprintf(uid, sizeof uid, "tr/%d", fg);
        int64_t t, before = fg ? segments_in_db_file(db_w, dir) : 0;
        CHECK(before >= 0);
        CHECK(begin(w, uid, &t) == ARL_OK);
        /* 37 states of 14 frames: the last commit passes 500 frames and wakes the thread */
        for (int s = 0; s < 37; s++)
            CHECK(put_segment(w, t, uid, 4000 + 100 * (uint64_t)fg, s, NULL) == ARL_OK);
        CHECK(file_size(wal_s) > 0);
        arl_status r = replay_writer_checkpoint(w);
        CHECK_MSG(r == ARL_OK, "checkpoint: %s", arl_error_msg());
        CHECK_MSG(file_size(wal_w) == 0 && file_size(wal_s) == 0, "WAL sizes %lld, %lld",
                  (long long)file_size(wal_w), (long long)file_size(wal_s));
        CHECK_EQ_INT(segments_in_db_file(db_w, dir), before + 37);
        rckpt_stats a;
        rckpt_get_stats(w->ckpt_s, &a);
        CHECK_EQ_INT(a.n_failed, 0);
        /* the writer goes on after it */
        for (int s = 37; s < 40; s++)
            CHECK(put_segment(w, t, uid, 4000 + 100 * (uint64_t)fg, s, NULL) == ARL_OK);
        CHECK(file_size(wal_w) > 0);
        replay_writer_close(w);
        CHECK(verify_clean(st));
        replay_store_close(st);
    }
    fx_rmtree(dir);
}

/* A reader that keeps an old snapshot of the states file open: the background passes (whose
 * RESTART step then answers SQLITE_BUSY) are not failures and copy what they may; once the
 * reader is gone, the next wake completes the checkpoint and the WAL restarts. */
static void test_reader(void) {
    const char *dir = test_tmpdir("ckpt-reader");
    char root[512], path[600];
    snprintf(root, sizeof root, "%s/store", dir);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    CHECK(replay_store_open(root, &o, &st) == ARL_OK);
    CHECK(fx_catalog(st, 1, 1, &ids) == ARL_OK);
    replay_writer *w;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    CHECK(w->ckpt_s != NULL);
    int64_t t;
    CHECK(begin(w, "rd/0", &t) == ARL_OK);
    CHECK(put_segment(w, t, "rd/0", 5000, 0, NULL) == ARL_OK);
    snprintf(path, sizeof path, "%s/%s", root, w->states_file);
    sqlite3 *rd;
    sqlite3_stmt *q = NULL;
    CHECK(sqlite3_open_v2(path, &rd, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(rd, "BEGIN", NULL, NULL, NULL) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(rd, "SELECT count(*) FROM states", -1, &q, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW); /* the snapshot is held until COMMIT */
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 1);
    sqlite3_finalize(q);
    /* 36 more states of 14 frames: past the wake threshold, below the backstop */
    for (int s = 1; s < 37; s++)
        CHECK(put_segment(w, t, "rd/0", 5000, s, NULL) == ARL_OK);
    rckpt_stats a;
    wait_stats(w->ckpt_s, 1, 0, &a);
    CHECK_MSG(a.n_background >= 1 && a.n_failed == 0, "%lld background, %lld failed (rc %d)",
              (long long)a.n_background, (long long)a.n_failed, a.last_rc);
    CHECK(a.last_frames >= RCKPT_WAKE_FRAMES); /* not restarted under the reader */
    CHECK(sqlite3_exec(rd, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(rd);
    /* With the reader gone, a later commit wakes the thread (one made while a pass still
     * retries is left to that pass) and the WAL restarts: a commit then leaves few frames.
     * The writer pauses 50 ms after each commit, as a rollout worker between segments does;
     * 20 commits leave a loaded machine time to schedule the thread. */
    int s = 37;
    for (; s < 57; s++) {
        CHECK(put_segment(w, t, "rd/0", 5000, s, NULL) == ARL_OK);
        rckpt_get_stats(w->ckpt_s, &a);
        if (a.last_frames < 100) break;
        usleep(50000);
    }
    CHECK_MSG(a.last_frames < 100 && a.n_failed == 0,
              "%d frames after %d commits without the reader, %lld failed", a.last_frames,
              s - 36, (long long)a.n_failed);
    replay_writer_close(w);
    CHECK(verify_clean(st));
    replay_store_close(st);
    fx_rmtree(dir);
}

/* A background checkpoint whose fsync fails: recorded, nothing lost, the writer goes on, and the
 * next wake after the fault clears checkpoints. */
static void test_failure(void) {
    const char *dir = test_tmpdir("ckptfail");
    char root[512];
    snprintf(root, sizeof root, "%s/store", dir);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE, .vfs = "arlfault"};
    replay_store *st;
    CHECK(replay_store_open(root, &o, &st) == ARL_OK);
    CHECK(fx_catalog(st, 1, 1, &ids) == ARL_OK);
    replay_writer *w;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK);
    int64_t t, sid[16];
    CHECK(begin(w, "f/0", &t) == ARL_OK);
    /* ten states (140 frames, below the wake threshold), then a checkpoint whose syncs fail:
     * armed only while the writer is idle, so the fault hits the checkpointer alone */
    for (int s = 0; s < 10; s++)
        CHECK(put_segment(w, t, "f/0", 5000, s, &sid[s]) == ARL_OK);
    rckpt_stats a;
    rckpt_get_stats(w->ckpt_s, &a);
    CHECK_EQ_INT(a.n_background + a.n_failed, 0);
    faultvfs_arm(0, FAULT_SYNC);
    rckpt_wake(w->ckpt_s);
    wait_stats(w->ckpt_s, 0, 1, &a);
    faultvfs_disarm();
    CHECK_MSG(a.n_failed == 1 && a.n_background == 0, "failed %lld, done %lld",
              (long long)a.n_failed, (long long)a.n_background);
    CHECK_EQ_INT(a.last_rc & 0xFF, SQLITE_IOERR);
    /* the writer goes on; the next checkpoint (disk fine again) copies everything */
    for (int s = 10; s < 13; s++)
        CHECK(put_segment(w, t, "f/0", 5000, s, &sid[s]) == ARL_OK);
    rckpt_wake(w->ckpt_s);
    wait_stats(w->ckpt_s, 1, 0, &a);
    CHECK_MSG(a.n_background == 1 && a.frames_copied >= 13 * 14,
              "after the fault cleared: %lld checkpoints, %lld frames", (long long)a.n_background,
              (long long)a.frames_copied);
    for (int s = 0; s < 13; s++)
        CHECK_MSG(state_intact(st, w->shard_id, sid[s], 5000, s), "state %d", s);
    replay_writer_close(w);
    CHECK(verify_clean(st));
    replay_store_close(st);
    fx_rmtree(dir);
}

/* The child: trajectories of 4 large segments until killed; reports "A uid seed s state_id". */
static void writer_main(const char *root, int fd) {
    replay_store *st;
    replay_writer *w;
    if (replay_store_open(root, NULL, &st)) _exit(3);
    if (replay_writer_open(st, REPLAY_FILE_WORKER, 1, "run1", &w)) _exit(4);
    replay_writer_recover(w, 1, NULL, NULL);
    if (write(fd, "R\n", 2) != 2) _exit(9);
    for (int k = 0;; k++) {
        char uid[48], line[160];
        snprintf(uid, sizeof uid, "k%d/%d", (int)getpid(), k);
        int64_t t, sid;
        if (begin(w, uid, &t)) _exit(5);
        for (int s = 0; s < 4; s++) {
            uint64_t seed = (uint64_t)getpid() * 100 + (uint64_t)k * 10;
            if (put_segment(w, t, uid, seed, s, &sid)) _exit(6);
            int n = snprintf(line, sizeof line, "A %s %llu %d %lld\n", uid,
                             (unsigned long long)seed, s, (long long)sid);
            if (write(fd, line, (size_t)n) != n) _exit(9);
        }
    }
}

static void test_crash(void) {
    const char *dir = test_tmpdir("ckptcrash");
    char root[512];
    snprintf(root, sizeof root, "%s/store", dir);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    CHECK(replay_store_open(root, &o, &st) == ARL_OK);
    CHECK(fx_catalog(st, 1, 1, &ids) == ARL_OK);
    replay_store_close(st);
    const char *e = getenv("ARL_CKPT_CRASH_ITERS");
    int iters = e ? atoi(e) : 12, n_checked = 0;
    arl_rng rng;
    arl_rng_seed(&rng, 4242);
    static char buf[1 << 20];
    for (int it = 0; it < iters; it++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            writer_main(root, fds[1]);
            _exit(0);
        }
        close(fds[1]);
        /* wait until ready, then let it write 20..400 ms: tens of states, through checkpoints */
        size_t n = 0;
        ssize_t r;
        while (!memchr(buf, 'R', n) && (r = read(fds[0], buf + n, 64)) > 0)
            n += (size_t)r;
        uint64_t us = 20000 + arl_rng_below(&rng, 380000);
        struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int stat = 0;
        waitpid(pid, &stat, 0);
        CHECK(WIFSIGNALED(stat));
        while ((r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0)
            n += (size_t)r;
        buf[n] = 0;
        close(fds[0]);
        CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
        CHECK_MSG(verify_clean(st), "iteration %d: verify found errors", it);
        /* every reported segment is there, with its state */
        for (char *p = strtok(buf, "\n"); p; p = strtok(NULL, "\n")) {
            char uid[48];
            unsigned long long seed;
            int s;
            long long sid;
            if (sscanf(p, "A %47s %llu %d %lld", uid, &seed, &s, &sid) != 4) continue;
            replay_traj_row row;
            CHECK_MSG(replay_traj_get(st, uid, &row) == ARL_OK && row.n_segments > s,
                      "iteration %d: %s segment %d reported but missing", it, uid, s);
            CHECK_MSG(state_intact(st, row.shard_id, sid, seed, s),
                      "iteration %d: %s state of segment %d", it, uid, s);
            n_checked++;
        }
        replay_store_close(st);
    }
    fprintf(stderr, "checkpoint crash: %d kills, %d reported segments checked\n", iters, n_checked);
    CHECK(n_checked > 0);
    fx_rmtree(dir);
}

int main(void) {
    if (faultvfs_register() != SQLITE_OK) {
        fprintf(stderr, "cannot register the fault VFS\n");
        return 1;
    }
    TEST_RUN(test_background);
    TEST_RUN(test_truncate);
    TEST_RUN(test_reader);
    TEST_RUN(test_failure);
    TEST_RUN(test_crash);
    return test_finish();
}
