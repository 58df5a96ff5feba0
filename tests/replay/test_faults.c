/* Faults of the outside world (spec/replay.md R5, STYLE.md rule 20): a full disk and failing
 * fsyncs injected through a SQLite VFS after N writes, at every point of writer open, T0, S_s,
 * C_s and C_end; then a corrupted page.  Each failure is a clear error naming the file and what
 * to do; afterwards the same writer goes on (the disk has space again), the store opens without
 * the fault layer, verify finds no error, and everything committed before is intact. */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "replay/inspect.h"
#include "tests/replay/faultvfs.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

#define MAXT 256

typedef struct tr {
    char uid[32];
    uint64_t seed;
    int committed; /* segments whose call returned ARL_OK */
    int finished;
} tr;

static tr trs[MAXT];
static int ntr;
static fx_ids ids;

/* One step of a trajectory (state + segment, or finish); returns the status. */
static arl_status step(replay_writer *w, int64_t t, tr *x, int s) {
    fx_seg f;
    fx_seg_make(&f, x->seed, s, 80, 2, 2, 4, 80 * s, 80 * s, 1 + 2 * s, 3, s == 0);
    float S[2 * 4 * 4] = {0};
    replay_state_chunk c = {.layer = 0,
                            .tensor = "S",
                            .kind = ARL_BLOB_KDA_STATE,
                            .dtype = ARL_BLOB_F32,
                            .ndim = 3,
                            .dims = {2, 4, 4},
                            .data = S};
    replay_state_desc sd = {.traj_uid = x->uid,
                            .seg_index = s,
                            .kind = "kda_boundary",
                            .pass_uid = "p",
                            .version_min = 3,
                            .version_max = 3,
                            .numerics = "cpu-f32",
                            .model_config_sha256 = "00",
                            .n_tokens = 80 * (s + 1)};
    arl_status r = ARL_OK;
    if (s < 2) r = replay_state_put(w, &sd, &c, 1, &f.d.end_state_id);
    if (r == ARL_OK) {
        if (s == 2) {
            fx_finish fin;
            f.d.end_cause = "end";
            fx_finish_make(&fin, 7, 1.0);
            r = replay_traj_finish(w, t, &f.d, &fin.f);
        } else {
            r = replay_segment_append(w, t, &f.d);
        }
    }
    fx_seg_free(&f);
    return r;
}

static int good_message(arl_status s) {
    const char *m = arl_error_msg();
    int names_file = strstr(m, "shards/") || strstr(m, "catalog.sqlite");
    if (s == ARL_ERR_FULL) return names_file && strstr(m, "full") && strstr(m, "free space");
    return names_file && strstr(m, "I/O");
}

static void run_faults(const char *root, int kind) {
    /* checkpoints in the writer's thread: the fault countdown then counts this thread's calls
     * only, so every run injects at the same call (test_checkpoint.c injects faults into the
     * background checkpointer) */
    replay_open_opts oo = {.flags = REPLAY_OPEN_FG_CHECKPOINT, .vfs = "arlfault"};
    replay_store *st;
    CHECK(replay_store_open(root, &oo, &st) == ARL_OK);
    /* opening a new shard on a full disk: an error, no broken file left behind */
    replay_writer *w = NULL;
    int opened_after = -1;
    for (long n = 0; n < 400 && !w; n += 7) {
        faultvfs_arm(n, kind);
        arl_status s = replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w);
        faultvfs_disarm();
        if (s == ARL_OK) {
            opened_after = (int)n;
            break;
        }
        CHECK_MSG(s == (kind == FAULT_FULL ? ARL_ERR_FULL : ARL_ERR_IO) && good_message(s),
                  "writer open, fault after %ld writes: %s: %s", n, arl_status_str(s),
                  arl_error_msg());
    }
    CHECK(w != NULL && opened_after > 0);
    if (!w) {
        replay_store_close(st);
        return;
    }
    int failures = 0;
    for (long n = 0; n < 120 && ntr < MAXT; n += 3) {
        tr *x = &trs[ntr];
        snprintf(x->uid, sizeof x->uid, "f%d/%ld", kind, n);
        x->seed = (uint64_t)(kind * 1000 + n);
        replay_traj_desc td = {.traj_uid = x->uid,
                               .run_id = ids.run_id,
                               .group_id = ids.group_id,
                               .task_id = ids.task_id,
                               .env_id = ids.env_id,
                               .fork_seg_index = -1};
        int64_t t;
        /* a trajectory makes ~100 writes but only ~10 syncs: both sweeps cover all its calls */
        faultvfs_arm(kind == FAULT_SYNC ? (n / 3) % 12 : n, kind);
        arl_status s = replay_traj_begin(w, &td, &t);
        int s_done = 0;
        for (int sg = 0; s == ARL_OK && sg < 3; sg++) {
            s = step(w, t, x, sg);
            if (s == ARL_OK) s_done = sg + 1;
        }
        faultvfs_disarm();
        if (s != ARL_OK) {
            failures++;
            CHECK_MSG(s == (kind == FAULT_FULL ? ARL_ERR_FULL : ARL_ERR_IO) && good_message(s),
                      "fault after %ld: %s: %s", n, arl_status_str(s), arl_error_msg());
            /* space again: the same writer finishes the trajectory where it failed */
            replay_traj_row r;
            if (replay_traj_get(st, x->uid, &r) != ARL_OK) {
                s = replay_traj_begin(w, &td, &t); /* T0 itself failed */
                CHECK_MSG(s == ARL_OK, "retry T0: %s", arl_error_msg());
            } else {
                t = r.traj_id;
                CHECK_EQ_INT(r.n_segments, s_done); /* nothing of the failed step is stored */
                s = ARL_OK;
            }
            for (int sg = s_done; s == ARL_OK && sg < 3; sg++) {
                s = step(w, t, x, sg);
                CHECK_MSG(s == ARL_OK, "retry %s segment %d: %s", x->uid, sg, arl_error_msg());
            }
        }
        x->committed = 3;
        x->finished = 1;
        ntr++;
    }
    CHECK(failures > 10); /* the faults did hit */
    replay_writer_close(w);
    replay_store_close(st);
}

static void check_store(const char *root) {
    replay_store *st;
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    int64_t errors = -1;
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    CHECK(replay_verify(st, NULL, f, &errors, NULL) == ARL_OK);
    fclose(f);
    CHECK_MSG(errors == 0, "verify: %s", out);
    free(out);
    replay_seg_data d = {0};
    for (int i = 0; i < ntr; i++) {
        replay_traj_row r;
        CHECK(replay_traj_get(st, trs[i].uid, &r) == ARL_OK);
        CHECK_MSG(r.status == REPLAY_COMPLETE, "%s: status %s, %d segments", trs[i].uid,
                  replay_status_name(r.status), (int)r.n_segments);
        CHECK_EQ_INT(r.n_segments, 3);
        for (int s = 0; s < 3; s++) {
            CHECK(replay_segment_load(st, r.traj_id, s, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES,
                                      &d) == ARL_OK);
            fx_seg g;
            fx_seg_make(&g, trs[i].seed, s, 80, 2, 2, 4, 80 * s, 80 * s, 1 + 2 * s, 3, s == 0);
            CHECK(!memcmp(d.tokens, g.tokens, 320) && !memcmp(d.logprobs, g.logprobs, 320) &&
                  !memcmp(d.routes, g.routes, 2 * 80 * 4));
            fx_seg_free(&g);
        }
    }
    replay_seg_data_free(&d);
    replay_store_close(st);
}

static char root[512];

static void test_full_disk(void) {
    run_faults(root, FAULT_FULL);
    check_store(root);
}

static void test_failing_fsync(void) {
    run_faults(root, FAULT_SYNC);
    check_store(root);
}

/* Damaged pages in one shard: verify reports them (naming the file), the other shard reads. */
static void test_corrupt_page(void) {
    replay_store *st;
    replay_writer *w;
    replay_traj_row victim, other;
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    CHECK(replay_traj_get(st, trs[0].uid, &victim) == ARL_OK);
    CHECK(replay_traj_get(st, trs[ntr - 1].uid, &other) == ARL_OK);
    CHECK(victim.shard_id != other.shard_id);
    /* fold the WAL into the file (a writer's checkpoint), then damage whole pages of it */
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, victim.shard_id, NULL, &w) == ARL_OK);
    replay_writer_close(w);
    replay_store_close(st);
    char path[600];
    snprintf(path, sizeof path, "%s/shards/w%d.sqlite", root, (int)victim.shard_id);
    sqlite3 *db;
    sqlite3_open(path, &db);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    sqlite3_close(db);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    static char junk[16384];
    memset(junk, 0x5A, sizeof junk);
    for (long off = 16384 * 2; off + 16384 <= size; off += 16384 * 4) {
        fseek(f, off, SEEK_SET);
        fwrite(junk, 1, sizeof junk, f);
    }
    fclose(f);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    int64_t errors = 0;
    char *out = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&out, &n);
    CHECK(replay_verify(st, NULL, m, &errors, NULL) == ARL_OK); /* the checks run to the end */
    fclose(m);
    char want[64];
    snprintf(want, sizeof want, "error: shards/w%d.sqlite", (int)victim.shard_id);
    CHECK_MSG(errors > 0 && strstr(out, want), "%s", out);
    /* the other shard is untouched and reads */
    replay_seg_data d = {0};
    CHECK(replay_segment_load(st, other.traj_id, 2, REPLAY_LOAD_TOKENS, &d) == ARL_OK);
    replay_seg_data_free(&d);
    free(out);
    replay_store_close(st);
}

int main(void) {
    arl_log_set_level(ARL_LOG_ERROR); /* the catalog mirror warns on every injected fault */
    if (faultvfs_register() != SQLITE_OK) {
        fprintf(stderr, "cannot register the fault VFS\n");
        return 1;
    }
    snprintf(root, sizeof root, "%s/store", test_tmpdir("faults"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    if (replay_store_open(root, &oo, &st) || fx_catalog(st, 1, 8, &ids)) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    replay_store_close(st);
    TEST_RUN(test_full_disk);
    TEST_RUN(test_failing_fsync);
    TEST_RUN(test_corrupt_page);
    FX_CLEANUP(root);
    return test_finish();
}
