/* bench/replay/bench_replay.c: the replay store against raw SQLite, measured in the same run.
 *
 *   bench_replay [--sustained N] [--sustained-rounds R] [--segments N] [--rounds R] [--dir DIR]
 *                [--k3] [--deflate] [--fg-checkpoint] [--check]
 *
 * Segments are realistic for the tiny model (spec/replay.md section 10): T = 8192 tokens with
 * ids, behaviour log-probs, loss mask and versions (13 B/token), routes of 7 MoE layers x k=4
 * (u8, 28 B/token), and a KDA boundary state (6 layers x S[2,64,64] + conv[3,128,3], f32,
 * 224 KiB) written to the states file before the segment (S_s then C_s).
 * Writers compared, all with WAL, wal_autocheckpoint = 1000 and the store's synchronous
 * settings (FULL worker file, NORMAL states file), the same blob bytes (codec 0, pre-encoded for
 * the raws), the same rows per segment (one row of four per-token blobs, one row per MoE layer's
 * routes, one row per state chunk) and the same transactions (one per state in a states file,
 * one per segment in a worker file):
 *   store:  replay_state_put + replay_segment_append;
 *   raw A:  prepared INSERTs into plain INTEGER PRIMARY KEY tables at the store's file settings
 *           (16 KiB / 64 KiB pages, incremental auto_vacuum on the states file);
 *   raw B:  the same at SQLite's defaults (4 KiB pages, no auto_vacuum);
 *   same-schema raw: prepared statements writing the very rows the store writes (the spec's
 *           tables and indexes: states row and chunks, segment row, routes, trajectory
 *           counters, an event) -- separates the library's own cost from the schema's.
 * Measures:
 *   1. sustained write throughput (the headline): each writer writes N segments (--sustained,
 *      default 96, 8 with --k3), then a timed PRAGMA wal_checkpoint(TRUNCATE) of both its files, so that
 *      every byte is in the database files, synced, and no writer leaves checkpoint work
 *      behind (the store: replay_writer_checkpoint, which first lets the background checkpoint
 *      pass in progress finish, inside the timing).  The writers take turns in an order that
 *      rotates per round; the ratio of a round is raw time / store time, reported as median
 *      and min..max over the rounds (--sustained-rounds, default 9).  The headline compares
 *      against the faster raw setting of the run (raw A or raw B by median time): raw sqlite3
 *      at its own best reasonable setting, not only at the store's.
 *   2. per-segment write latency (secondary): store and raws alternate segment by segment
 *      (rotating order: a commit's fsync also flushes what the previous writer left dirty);
 *      the ratio is the median over segments of raw time / store time for one S_s + C_s --
 *      how long a rollout worker waits per segment commit.  The store's background checkpoints
 *      run outside these commits and the raws' inline ones come once in ~30-70 segments, so the
 *      median leaves checkpoint work out on both sides: this is latency, not throughput.  Also
 *      printed: the median times of S_s and C_s, the WAL bytes one segment writes, and for one
 *      steady-state segment the pages its transactions wrote, by b-tree (from the WAL frames
 *      and dbstat) -- where the store writes more than raw A (the spec's indexes, section 4).
 *   3. read (headline): replay_segment_load (tokens + routes: header, shape and CRC checks,
 *      copies into the learner's arrays) against raw SELECTs of the same rows copied into the
 *      same arrays; median of per-segment paired ratios.
 * Throughput counts blob bytes.  The raws checkpoint as SQLite's wal_autocheckpoint = 1000
 * does, in the committing thread (see wal_hook); the store checkpoints in its background
 * threads (replay/checkpoint.c, the 1000-frame rule kept as a backstop), or with
 * --fg-checkpoint as the raws do.
 * --deflate opens the store with REPLAY_OPEN_DEFLATE (per-token arrays with codec 1 when that
 * saves 20 %): the store then writes fewer bytes than the raws and inflates on read; the MB/s
 * still count the uncompressed blob bytes.
 * Targets: write (sustained) >= 0.8x, read >= 0.8x (--check: exit 1 if missed). */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "bench/common/tmpdir.h"
#include "core/blob.h"
#include "core/options.h"
#include "replay/internal.h"
#include "replay/replay.h"

#define T 8192
#define LMOE_MAX 92
/* MoE layers, top-k and route id bytes: tiny (7, 4, u8) by default, K3 (92, 16, u16) with --k3 */
static int LMOE = 7, K = 4, RB = 1;
#define LKDA 6
#define H 2
#define DK 64
#define P (H * DK)

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of n values (sorts v) */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, dcmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_replay: %s: %s\n", what, arl_error_msg());
    exit(1);
}

static void sql_die(sqlite3 *db, const char *what) {
    fprintf(stderr, "bench_replay: %s: %s\n", what, sqlite3_errmsg(db));
    exit(1);
}

/* the payload of one segment */
static uint32_t tokens[T], versions[T];
static float logprobs[T];
static uint8_t mask[T], *routes, *rd_routes; /* (LMOE, T, K) of RB-byte ids */
static float kda_s[H * DK * DK], kda_conv[3 * P * 3];

/* pre-encoded blobs for the raw baseline */
typedef struct blob {
    uint8_t *p;
    size_t n;
} blob;
static blob seg_blobs[4], route_blobs[LMOE_MAX], state_blobs[2 * LKDA];

static blob enc(arl_blob_kind kind, arl_blob_dtype dt, int nd, const uint64_t *dims,
                const void *data) {
    uint64_t nb;
    arl_blob_payload_size(dt, nd, dims, &nb);
    blob b = {malloc(nb + 64), 0};
    if (!b.p || arl_blob_encode(kind, dt, nd, dims, data, b.p, nb + 64, &b.n)) die("encode");
    return b;
}

static void make_payload(void) {
    routes = malloc((size_t)LMOE * T * K * RB);
    rd_routes = malloc((size_t)LMOE * T * K * RB);
    if (!routes || !rd_routes) die("out of memory");
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < T; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int act = (i / 512) % 2;
        tokens[i] = (uint32_t)(x % 160000);
        mask[i] = (uint8_t)act;
        logprobs[i] = act ? -(float)(x % 1000) / 300.0f : 0.0f;
        versions[i] = 7;
        for (int l = 0; l < LMOE; l++)
            for (int j = 0; j < K; j++)
                for (int b = 0; b < RB; b++)
                    routes[(((size_t)l * T + (size_t)i) * K + (size_t)j) * RB + b] =
                        (uint8_t)(b ? 0 : (x >> (l % 40 + j % 8)) % 16);
    }
    for (int i = 0; i < H * DK * DK; i++)
        kda_s[i] = (float)sin(i * 0.01);
    for (int i = 0; i < 3 * P * 3; i++)
        kda_conv[i] = (float)cos(i * 0.02);
    uint64_t d1[1] = {T}, d2[2] = {T, K}, ds[3] = {H, DK, DK}, dc[3] = {3, P, 3};
    seg_blobs[0] = enc(ARL_BLOB_TOKENS, ARL_BLOB_U32, 1, d1, tokens);
    seg_blobs[1] = enc(ARL_BLOB_LOGPROBS, ARL_BLOB_F32, 1, d1, logprobs);
    seg_blobs[2] = enc(ARL_BLOB_LOSS_MASK, ARL_BLOB_U8, 1, d1, mask);
    seg_blobs[3] = enc(ARL_BLOB_VERSIONS, ARL_BLOB_U32, 1, d1, versions);
    for (int l = 0; l < LMOE; l++)
        route_blobs[l] = enc(ARL_BLOB_ROUTES, RB == 2 ? ARL_BLOB_U16 : ARL_BLOB_U8, 2, d2,
                             routes + (size_t)l * T * K * RB);
    for (int l = 0; l < LKDA; l++) {
        state_blobs[2 * l] = enc(ARL_BLOB_KDA_STATE, ARL_BLOB_F32, 3, ds, kda_s);
        state_blobs[2 * l + 1] = enc(ARL_BLOB_CONV_TAIL, ARL_BLOB_F32, 3, dc, kda_conv);
    }
}

static size_t seg_bytes(int with_state) {
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        n += seg_blobs[i].n;
    for (int l = 0; l < LMOE; l++)
        n += route_blobs[l].n;
    if (with_state)
        for (int i = 0; i < 2 * LKDA; i++)
            n += state_blobs[i].n;
    return n;
}

/* ---- the store ---- */

static replay_store *st;
static replay_writer *w;
static int64_t ids[4]; /* run, env, task, group */

static int use_deflate;   /* --deflate: the store writes per-token arrays with codec 1 */
static int fg_checkpoint; /* --fg-checkpoint: the store checkpoints in the writer's thread */

static void store_setup(const char *root) {
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE | (use_deflate ? REPLAY_OPEN_DEFLATE : 0) |
                                   (fg_checkpoint ? REPLAY_OPEN_FG_CHECKPOINT : 0)};
    if (replay_store_open(root, &o, &st)) die("store open");
    replay_run_desc rd = {.run_uid = "bench"};
    replay_env_desc ed = {.name = "bench", .version = "1"};
    replay_task_desc td = {.task_uid = "t", .env_name = "bench"};
    if (replay_run_ensure(st, &rd, &ids[0]) || replay_env_ensure(st, &ed, &ids[1]) ||
        replay_task_ensure(st, &td, &ids[2]))
        die("catalog");
    replay_group_desc gd = {.group_uid = "bench/g",
                            .run_id = ids[0],
                            .task_id = ids[2],
                            .env_id = ids[1],
                            .size = 1,
                            .parent_seg_index = -1};
    if (replay_group_ensure(st, &gd, &ids[3])) die("group");
    if (replay_writer_open(st, REPLAY_FILE_WORKER, 0, "bench", &w)) die("writer");
}

static int64_t store_begin(int round) {
    char uid[32];
    snprintf(uid, sizeof uid, "bench/%d", round);
    replay_traj_desc td = {.traj_uid = uid,
                           .run_id = ids[0],
                           .group_id = ids[3],
                           .task_id = ids[2],
                           .env_id = ids[1],
                           .fork_seg_index = -1};
    int64_t t;
    if (replay_traj_begin(w, &td, &t)) die("begin");
    return t;
}

static int store_frames[2]; /* WAL frames after the store's last commits: worker, states */
static int fr_store[2];     /* frames the last segment added: worker, states */
static int frames_added(int now_, int before);

/* The store's WAL frame counts: with its background checkpointers (the default) from their WAL
 * hooks' counters, else (--fg-checkpoint) from the bench's own hook, installed in main. */
static void store_frames_sync(void) {
    if (!w->ckpt_w) return;
    rckpt_stats a, b;
    rckpt_get_stats(w->ckpt_w, &a);
    rckpt_get_stats(w->ckpt_s, &b);
    store_frames[0] = a.last_frames;
    store_frames[1] = b.last_frames;
}

/* S_s then C_s for segment s of trajectory t (uid bench/<round>); *t_states: S_s's time. */
static void store_write_one(int round, int64_t t, int s, double *t_states) {
    char uid[32];
    snprintf(uid, sizeof uid, "bench/%d", round);
    replay_state_chunk ch[2 * LKDA];
    for (int l = 0; l < LKDA; l++) {
        ch[2 * l] = (replay_state_chunk){.layer = 4 * l,
                                         .tensor = "S",
                                         .kind = ARL_BLOB_KDA_STATE,
                                         .dtype = ARL_BLOB_F32,
                                         .ndim = 3,
                                         .dims = {H, DK, DK},
                                         .data = kda_s};
        ch[2 * l + 1] = (replay_state_chunk){.layer = 4 * l,
                                             .tensor = "conv",
                                             .kind = ARL_BLOB_CONV_TAIL,
                                             .dtype = ARL_BLOB_F32,
                                             .ndim = 3,
                                             .dims = {3, P, 3},
                                             .data = kda_conv};
    }
    replay_state_desc sd = {.traj_uid = uid,
                            .seg_index = s,
                            .kind = "kda_boundary",
                            .pass_uid = "p",
                            .version_min = 7,
                            .version_max = 7,
                            .numerics = "cpu-f32",
                            .model_config_sha256 = "0",
                            .n_tokens = (int64_t)(s + 1) * T};
    replay_segment_desc d = {.seg_index = s,
                             .start_kind = s ? "continue" : "fresh",
                             .end_cause = "token_budget",
                             .first_step = 1 + s,
                             .last_step = 1 + s,
                             .tok_start = (int64_t)s * T,
                             .ctx_start = (int64_t)s * T,
                             .n_tokens = T,
                             .tokens = tokens,
                             .logprobs = logprobs,
                             .loss_mask = mask,
                             .versions = versions,
                             .n_moe_layers = LMOE,
                             .route_k = K,
                             .route_dtype = RB == 2 ? ARL_BLOB_U16 : ARL_BLOB_U8,
                             .routes = routes,
                             .routes_layout = "moe_layers=7;k=4;experts=16;dtype=u8",
                             .latent_state_id = -1};
    int f0 = store_frames[0], f1 = store_frames[1];
    double t0 = now();
    if (replay_state_put(w, &sd, ch, 2 * LKDA, &d.end_state_id)) die("state put");
    *t_states = now() - t0;
    if (replay_segment_append(w, t, &d)) die("append");
    store_frames_sync();
    fr_store[0] = frames_added(store_frames[0], f0);
    fr_store[1] = frames_added(store_frames[1], f1);
}

static uint32_t rd_tok[T], rd_ver[T];
static float rd_lp[T];
static uint8_t rd_mask[T];

static void store_read_one(int64_t t, int s, replay_seg_data *d) {
    if (replay_segment_load(st, t, s, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES, d)) die("load");
    if (d->n_moe_layers != LMOE) die("routes");
}

/* ---- raw sqlite ---- */

/* One raw baseline: plain tables keyed by INTEGER PRIMARY KEY, the same blob bytes, the same
 * transactions (one per state in a states file, one per segment in a worker file), WAL and the
 * store's synchronous settings (FULL worker, NORMAL states).  Two of them run: at the store's
 * file settings (page sizes, incremental auto_vacuum for the states file), and at SQLite's
 * defaults (no page_size or auto_vacuum pragma: 4 KiB pages). */
typedef struct raw_base {
    const char *name;
    sqlite3 *w, *s, *r; /* worker, states, reader of the worker file */
    sqlite3_stmt *ins_seg, *ins_route, *ins_state, *sel_seg, *sel_route;
    int frames[2]; /* WAL frames after the last commit (wal hook): worker, states */
} raw_base;
static raw_base raw_store, raw_dflt;

/* Records the WAL's frame count after each commit.  Installing a WAL hook replaces SQLite's
 * automatic checkpoint (sqlite3_wal_autocheckpoint is itself a WAL hook), so this hook does what
 * that one does, for the store and the raws alike: a passive checkpoint once the WAL holds 1000
 * frames or more (wal_autocheckpoint = 1000, spec section 3).  Checkpoint work, which grows with
 * the pages a commit writes, is therefore part of every writer's time. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int n) {
    *(int *)arg = n;
    if (n >= 1000) sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
}

/* page 0: SQLite's default page size */
static sqlite3 *raw_open(const char *path, int page, const char *sync) {
    sqlite3 *db;
    char sql[256], ps[48] = "";
    if (sqlite3_open(path, &db)) sql_die(db, path);
    if (page) snprintf(ps, sizeof ps, "PRAGMA page_size = %d; ", page);
    snprintf(sql, sizeof sql,
             "%sPRAGMA journal_mode = WAL; PRAGMA synchronous = %s; "
             "PRAGMA wal_autocheckpoint = 1000; PRAGMA journal_size_limit = 67108864;",
             ps, sync);
    if (sqlite3_exec(db, sql, NULL, NULL, NULL)) sql_die(db, "pragmas");
    return db;
}

static void raw_setup(raw_base *b, const char *dir, const char *tag, int store_settings) {
    char p[600];
    snprintf(p, sizeof p, "%s/raw_%s_worker.sqlite", dir, tag);
    b->w = raw_open(p, store_settings ? RDB_PAGE_SIZE : 0, "FULL");
    if (sqlite3_exec(
            b->w,
            "CREATE TABLE seg (k INTEGER PRIMARY KEY, tokens BLOB, logprobs BLOB, loss_mask BLOB, "
            "versions BLOB); CREATE TABLE route (k INTEGER PRIMARY KEY, data BLOB);",
            NULL, NULL, NULL))
        sql_die(b->w, "create");
    snprintf(p, sizeof p, "%s/raw_%s_states.sqlite", dir, tag);
    b->s = raw_open(p, store_settings ? RDB_PAGE_SIZE_STATES : 0, "NORMAL");
    /* the store's states files also have incremental auto_vacuum (spec section 3) */
    if (store_settings &&
        sqlite3_exec(b->s, "PRAGMA auto_vacuum = INCREMENTAL; VACUUM;", NULL, NULL, NULL))
        sql_die(b->s, "auto_vacuum");
    if (sqlite3_exec(b->s, "CREATE TABLE chunk (k INTEGER PRIMARY KEY, data BLOB);", NULL, NULL,
                     NULL))
        sql_die(b->s, "create");
    sqlite3_wal_hook(b->w, wal_hook, &b->frames[0]);
    sqlite3_wal_hook(b->s, wal_hook, &b->frames[1]);
    sqlite3_prepare_v2(b->w, "INSERT INTO seg VALUES (?1, ?2, ?3, ?4, ?5)", -1, &b->ins_seg, NULL);
    sqlite3_prepare_v2(b->w, "INSERT INTO route VALUES (?1, ?2)", -1, &b->ins_route, NULL);
    sqlite3_prepare_v2(b->s, "INSERT INTO chunk VALUES (?1, ?2)", -1, &b->ins_state, NULL);
    snprintf(p, sizeof p, "%s/raw_%s_worker.sqlite", dir, tag);
    if (sqlite3_open_v2(p, &b->r, SQLITE_OPEN_READONLY, NULL)) sql_die(b->r, "open reader");
    sqlite3_prepare_v2(b->r, "SELECT tokens, logprobs, loss_mask, versions FROM seg WHERE k = ?1",
                       -1, &b->sel_seg, NULL);
    sqlite3_prepare_v2(b->r, "SELECT data FROM route WHERE k >= ?1 AND k < ?2 ORDER BY k", -1,
                       &b->sel_route, NULL);
}

static void raw_free(raw_base *b) {
    sqlite3_stmt *q[] = {b->ins_seg, b->ins_route, b->ins_state, b->sel_seg, b->sel_route};
    for (size_t i = 0; i < sizeof q / sizeof *q; i++)
        sqlite3_finalize(q[i]);
    sqlite3_close(b->w);
    sqlite3_close(b->s);
    sqlite3_close(b->r);
}

/* ---- raw sqlite, the store's schema: the same rows the store writes, by hand ---- */

static sqlite3 *qw, *qs;
static sqlite3_stmt *q_state, *q_chunk, *q_state_done, *q_seg, *q_route, *q_traj, *q_event;

static void schema_setup(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/schema_worker.sqlite", dir);
    qw = raw_open(p, RDB_PAGE_SIZE, "FULL");
    snprintf(p, sizeof p, "%s/schema_states.sqlite", dir);
    qs = raw_open(p, RDB_PAGE_SIZE_STATES, "NORMAL");
    if (sqlite3_exec(qs, "PRAGMA auto_vacuum = INCREMENTAL; VACUUM;", NULL, NULL, NULL) ||
        sqlite3_exec(qw, rschema_ddl(REPLAY_FILE_WORKER), NULL, NULL, NULL) ||
        sqlite3_exec(qs, rschema_ddl(REPLAY_FILE_STATES), NULL, NULL, NULL) ||
        sqlite3_exec(qw,
                     "PRAGMA foreign_keys = ON; INSERT INTO trajectories(traj_id, traj_uid, "
                     "run_id, group_id, "
                     "slot, task_id, env_id, status, created_at_ms, updated_at_ms) VALUES (1, 'b', "
                     "1, 1, 0, 1, "
                     "1, 'running', 0, 0)",
                     NULL, NULL, NULL))
        sql_die(qw, "schema");
    sqlite3_exec(qs, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    sqlite3_prepare_v2(
        qs,
        "INSERT INTO states(traj_uid, seg_index, kind, producer, pass_uid, version_min, "
        "version_max, numerics, routing, model_config_sha256, ctx_start, n_tokens, n_bytes, "
        "status, created_at_ms, last_used_at_ms) VALUES ('b', ?1, 'kda_boundary', 'rollout', "
        "'p', 7, 7, 'cpu-f32', 'replay', '0', 0, ?2, 0, 'writing', 0, 0)",
        -1, &q_state, NULL);
    sqlite3_prepare_v2(qs,
                       "INSERT INTO state_chunks(state_id, layer, tensor, row_start, data) VALUES "
                       "(?1, ?2, ?3, 0, ?4)",
                       -1, &q_chunk, NULL);
    sqlite3_prepare_v2(qs,
                       "UPDATE states SET status = 'complete', n_bytes = ?2 WHERE state_id = ?1",
                       -1, &q_state_done, NULL);
    sqlite3_prepare_v2(
        qw,
        "INSERT INTO segments(traj_id, seg_index, start_kind, end_cause, first_step, last_step, "
        "tok_start, n_tokens, n_action_tokens, ctx_start, min_version, max_version, "
        "routes_layout, end_state_id, latent_state_id, committed_at_ms, tokens, logprobs, "
        "loss_mask, versions) VALUES (1, ?1, 'continue', 'token_budget', ?1, ?1, ?2, 8192, "
        "4096, ?2, 7, 7, 'moe_layers=7;k=4;experts=16;dtype=u8', ?3, NULL, 0, ?4, ?5, ?6, ?7)",
        -1, &q_seg, NULL);
    sqlite3_prepare_v2(
        qw,
        "INSERT INTO segment_routes(traj_id, seg_index, moe_layer, data) VALUES (1, ?1, ?2, ?3)",
        -1, &q_route, NULL);
    sqlite3_prepare_v2(
        qw,
        "UPDATE trajectories SET n_segments = n_segments + 1, n_turns = n_turns + 1, "
        "n_tokens = n_tokens + 8192, n_action_tokens = n_action_tokens + 4096, "
        "min_version = 7, max_version = 7, updated_at_ms = ?1 WHERE traj_id = 1",
        -1, &q_traj, NULL);
    sqlite3_prepare_v2(
        qw,
        "INSERT INTO trajectory_events(traj_id, seq, at_ms, kind, detail_json) SELECT 1, "
        "coalesce(max(seq), -1) + 1, 0, 'segment_committed', '{}' FROM trajectory_events WHERE "
        "traj_id = 1",
        -1, &q_event, NULL);
    if (!q_state || !q_chunk || !q_state_done || !q_seg || !q_route || !q_traj || !q_event)
        sql_die(qw, "prepare");
}

static void step_done(sqlite3 *db, sqlite3_stmt *s);

static void schema_write_one(int round, int s) {
    int seg = round * 100000 + s;
    sqlite3_exec(qs, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    sqlite3_bind_int(q_state, 1, seg);
    sqlite3_bind_int64(q_state, 2, (int64_t)(s + 1) * T);
    step_done(qs, q_state);
    int64_t sid = sqlite3_last_insert_rowid(qs), total = 0;
    for (int i = 0; i < 2 * LKDA; i++) {
        sqlite3_bind_int64(q_chunk, 1, sid);
        sqlite3_bind_int(q_chunk, 2, 4 * (i / 2));
        sqlite3_bind_text(q_chunk, 3, i % 2 ? "conv" : "S", -1, SQLITE_STATIC);
        sqlite3_bind_blob(q_chunk, 4, state_blobs[i].p, (int)state_blobs[i].n, SQLITE_STATIC);
        step_done(qs, q_chunk);
        total += (int64_t)state_blobs[i].n;
    }
    sqlite3_bind_int64(q_state_done, 1, sid);
    sqlite3_bind_int64(q_state_done, 2, total);
    step_done(qs, q_state_done);
    if (sqlite3_exec(qs, "COMMIT", NULL, NULL, NULL)) sql_die(qs, "commit");
    sqlite3_exec(qw, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    sqlite3_bind_int(q_seg, 1, seg);
    sqlite3_bind_int64(q_seg, 2, (int64_t)seg * T);
    sqlite3_bind_int64(q_seg, 3, sid);
    for (int i = 0; i < 4; i++)
        sqlite3_bind_blob(q_seg, 4 + i, seg_blobs[i].p, (int)seg_blobs[i].n, SQLITE_STATIC);
    step_done(qw, q_seg);
    for (int l = 0; l < LMOE; l++) {
        sqlite3_bind_int(q_route, 1, seg);
        sqlite3_bind_int(q_route, 2, l);
        sqlite3_bind_blob(q_route, 3, route_blobs[l].p, (int)route_blobs[l].n, SQLITE_STATIC);
        step_done(qw, q_route);
    }
    sqlite3_bind_int64(q_traj, 1, seg);
    step_done(qw, q_traj);
    step_done(qw, q_event);
    if (sqlite3_exec(qw, "COMMIT", NULL, NULL, NULL)) sql_die(qw, "commit");
}

static void step_done(sqlite3 *db, sqlite3_stmt *s) {
    if (sqlite3_step(s) != SQLITE_DONE) sql_die(db, "insert");
    sqlite3_reset(s);
}

/* frames a commit added to a WAL (the hook reports the total; a restarted WAL starts over) */
static int frames_added(int now_, int before) {
    return now_ >= before ? now_ - before : now_;
}

static int fr_raw[2]; /* frames the last raw (store settings) segment added: worker, states */

/* ---- where the WAL bytes go: the pages a transaction wrote, by b-tree ---- */

typedef struct page_owner {
    int64_t pgno;
    char name[64];
} page_owner;

/* Count the frames [first, last] (1-based) of db's WAL by the b-tree owning each page
 * (dbstat; pages dbstat does not list are pointer-map or freelist pages) and print one line. */
static void wal_attribute(sqlite3 *db, const char *label, int f_before, int f_after) {
    const char *path = sqlite3_db_filename(db, "main");
    char wal[700];
    snprintf(wal, sizeof wal, "%s-wal", path);
    int first = f_after >= f_before ? f_before + 1 : 1;
    sqlite3_stmt *q;
    int ps = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        ps = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    page_owner *own = NULL;
    size_t n_own = 0, cap = 0;
    if (sqlite3_prepare_v2(db, "SELECT pageno, name FROM dbstat", -1, &q, NULL) != SQLITE_OK)
        sql_die(db, "dbstat");
    while (sqlite3_step(q) == SQLITE_ROW) {
        if (n_own == cap) {
            cap = cap ? 2 * cap : 1024;
            own = realloc(own, cap * sizeof *own);
            if (!own) die("out of memory");
        }
        own[n_own].pgno = sqlite3_column_int64(q, 0);
        snprintf(own[n_own].name, sizeof own[n_own].name, "%s",
                 (const char *)sqlite3_column_text(q, 1));
        n_own++;
    }
    sqlite3_finalize(q);
    FILE *f = fopen(wal, "rb");
    if (!f || !ps) die("open wal");
    struct {
        char name[64];
        int n;
    } agg[32];
    int n_agg = 0, total = 0;
    for (int k = first; k <= f_after; k++) {
        uint8_t h[4];
        if (fseek(f, 32 + (long)(k - 1) * (24 + ps), SEEK_SET) || fread(h, 1, 4, f) != 4) break;
        int64_t pg = ((int64_t)h[0] << 24) | (h[1] << 16) | (h[2] << 8) | h[3];
        const char *name = "(pointer map / freelist)";
        for (size_t i = 0; i < n_own; i++)
            if (own[i].pgno == pg) {
                name = own[i].name;
                break;
            }
        int a = 0;
        while (a < n_agg && strcmp(agg[a].name, name))
            a++;
        if (a == n_agg && n_agg < 32) {
            snprintf(agg[n_agg].name, sizeof agg[n_agg].name, "%s", name);
            agg[n_agg++].n = 0;
        }
        if (a < n_agg) agg[a].n++;
        total++;
    }
    fclose(f);
    free(own);
    printf("  %-14s %3d pages = %5d KiB:", label, total, total * (ps / 1024));
    for (int a = 0; a < n_agg; a++)
        printf(" %s %d;", agg[a].name, agg[a].n);
    printf("\n");
}

static void raw_write_one(raw_base *b, int round, int s, double *t_states) {
    int64_t key = (int64_t)round * 100000 + s;
    int f0 = b->frames[0], f1 = b->frames[1];
    double t0 = now();
    sqlite3_exec(b->s, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    for (int i = 0; i < 2 * LKDA; i++) {
        sqlite3_bind_int64(b->ins_state, 1, key * 64 + i);
        sqlite3_bind_blob(b->ins_state, 2, state_blobs[i].p, (int)state_blobs[i].n, SQLITE_STATIC);
        step_done(b->s, b->ins_state);
    }
    if (sqlite3_exec(b->s, "COMMIT", NULL, NULL, NULL)) sql_die(b->s, "commit");
    if (t_states) *t_states = now() - t0;
    sqlite3_exec(b->w, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    sqlite3_bind_int64(b->ins_seg, 1, key);
    for (int i = 0; i < 4; i++)
        sqlite3_bind_blob(b->ins_seg, 2 + i, seg_blobs[i].p, (int)seg_blobs[i].n, SQLITE_STATIC);
    step_done(b->w, b->ins_seg);
    for (int l = 0; l < LMOE; l++) {
        sqlite3_bind_int64(b->ins_route, 1, key * 128 + l);
        sqlite3_bind_blob(b->ins_route, 2, route_blobs[l].p, (int)route_blobs[l].n, SQLITE_STATIC);
        step_done(b->w, b->ins_route);
    }
    if (sqlite3_exec(b->w, "COMMIT", NULL, NULL, NULL)) sql_die(b->w, "commit");
    if (b == &raw_store) {
        fr_raw[0] = frames_added(b->frames[0], f0);
        fr_raw[1] = frames_added(b->frames[1], f1);
    }
}

static void raw_read_one(raw_base *b, int round, int s) {
    void *dst[4] = {rd_tok, rd_lp, rd_mask, rd_ver};
    int64_t key = (int64_t)round * 100000 + s;
    sqlite3_bind_int64(b->sel_seg, 1, key);
    if (sqlite3_step(b->sel_seg) != SQLITE_ROW) sql_die(b->r, "select");
    for (int i = 0; i < 4; i++) {
        const uint8_t *p = sqlite3_column_blob(b->sel_seg, i);
        memcpy(dst[i], p + 64, (size_t)sqlite3_column_bytes(b->sel_seg, i) - 64);
    }
    sqlite3_reset(b->sel_seg);
    sqlite3_bind_int64(b->sel_route, 1, key * 128);
    sqlite3_bind_int64(b->sel_route, 2, key * 128 + 128);
    int l = 0;
    while (sqlite3_step(b->sel_route) == SQLITE_ROW) {
        const uint8_t *p = sqlite3_column_blob(b->sel_route, 0);
        size_t nb = (size_t)sqlite3_column_bytes(b->sel_route, 0) - 64;
        memcpy(rd_routes + (size_t)l++ * nb, p + 64, nb);
    }
    sqlite3_reset(b->sel_route);
    if (l != LMOE) sql_die(b->r, "routes");
}

/* ---- sustained throughput: n segments, then a timed final checkpoint, per side ---- */

/* PRAGMA wal_checkpoint(TRUNCATE) of one raw file: everything in its database file, synced
 * (synchronous FULL and NORMAL both sync the database file in a checkpoint), the WAL emptied. */
static void raw_truncate(sqlite3 *db) {
    int n_log = 0, n_done = 0;
    int rc = sqlite3_wal_checkpoint_v2(db, "main", SQLITE_CHECKPOINT_TRUNCATE, &n_log, &n_done);
    if (rc != SQLITE_OK) sql_die(db, "wal_checkpoint(TRUNCATE)");
}

static void store_truncate(void) {
    if (replay_writer_checkpoint(w)) die("replay_writer_checkpoint");
}

/* One side's timed run: n segments (S_s + C_s each) of a new trajectory or key range `round`,
 * then the final checkpoint of both of its files.  which: 0 store, 1 raw A, 2 raw B,
 * 3 same-schema raw.  *t_ckpt: the final checkpoint's share. */
static double sustained_run(int which, int round, int n, double *t_ckpt) {
    int64_t t = which == 0 ? store_begin(round) : 0; /* T0, untimed: the raws have none */
    double dummy, t0 = now();
    for (int s = 0; s < n; s++) {
        if (which == 0)
            store_write_one(round, t, s, &dummy);
        else if (which == 3)
            schema_write_one(round, s);
        else
            raw_write_one(which == 1 ? &raw_store : &raw_dflt, round, s, NULL);
    }
    double t1 = now();
    if (which == 0) {
        store_truncate();
    } else if (which == 3) {
        raw_truncate(qw);
        raw_truncate(qs);
    } else {
        raw_base *b = which == 1 ? &raw_store : &raw_dflt;
        raw_truncate(b->w);
        raw_truncate(b->s);
    }
    double t2 = now();
    *t_ckpt = t2 - t1;
    return t2 - t0;
}

/* min and max of n values */
static void min_max(const double *v, int n, double *lo, double *hi) {
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) {
        if (v[i] < *lo) *lo = v[i];
        if (v[i] > *hi) *hi = v[i];
    }
}

typedef struct ropts {
    int64_t segments, rounds, sustained, sustained_rounds;
    char *dir;
    int k3, deflate, fg_checkpoint, check;
} ropts;

static const arl_option OPTS[] = {
    {"sustained", ARL_OPT_INT, offsetof(ropts, sustained), "0",
     "segments per side and round of the sustained-write headline (0: 96, 8 with --k3)", 0, 100000,
     NULL, 0, "N"},
    {"sustained-rounds", ARL_OPT_INT, offsetof(ropts, sustained_rounds), "9",
     "rounds of the sustained-write phase (the headline is their median)", 1, 1000, NULL, 0, "R"},
    {"segments", ARL_OPT_INT, offsetof(ropts, segments), "16",
     "segments per round of the paired per-segment write and read phase", 1, 100000, NULL, 0, "N"},
    {"rounds", ARL_OPT_INT, offsetof(ropts, rounds), "8", "rounds of the paired phase", 1, 999,
     NULL, 0, "R"},
    {"dir", ARL_OPT_STRING, offsetof(ropts, dir), "",
     "existing directory for the databases, kept afterwards (empty: a temporary directory in "
     "$TMPDIR or /tmp, removed at exit)",
     0, 0, NULL, 0, "DIR"},
    {"k3", ARL_OPT_BOOL, offsetof(ropts, k3), "false",
     "K3-sized routes (92 MoE layers, top-16, u16 ids; ~24 MiB segments) instead of the tiny "
     "model's (7, top-4, u8)",
     0, 0, NULL, 0, NULL},
    {"deflate", ARL_OPT_BOOL, offsetof(ropts, deflate), "false",
     "open the store with REPLAY_OPEN_DEFLATE (it writes fewer bytes than the raws: not the "
     "headline comparison)",
     0, 0, NULL, 0, NULL},
    {"fg-checkpoint", ARL_OPT_BOOL, offsetof(ropts, fg_checkpoint), "false",
     "the store checkpoints in the writer's thread, as the raws do (default: its background "
     "threads)",
     0, 0, NULL, 0, NULL},
    {"check", ARL_OPT_BOOL, offsetof(ropts, check), "false",
     "exit 1 when a headline ratio misses its target (>= 0.8)", 0, 0, NULL, 0, NULL},
};

int main(int argc, char **argv) {
    ropts o;
    const char *summary = "replay store segment writes and reads vs raw sqlite3 writing and "
                          "reading the same bytes, in the same run (ratios: raw time / store "
                          "time, > 1: the store is faster)";
    int parsed =
        bench_options_parse("bench_replay", summary, OPTS, ARL_OPTIONS_COUNT(OPTS), argc, argv, &o);
    if (parsed >= 0) return parsed;
    const int n = (int)o.segments, rounds = (int)o.rounds, sus_rounds = (int)o.sustained_rounds,
              check = o.check;
    use_deflate = o.deflate;
    fg_checkpoint = o.fg_checkpoint;
    if (o.k3) {
        LMOE = 92;
        K = 16;
        RB = 2;
    }
    const int n_sus = o.sustained ? (int)o.sustained : LMOE == 92 ? 8 : 96; /* K3: ~24 MiB each */
    const char *dir = o.dir;
    if (!dir[0] && !(dir = bench_tmpdir_create("bench_replay", 4))) return 1;
    arl_options_print_resolved(stdout, "bench_replay", OPTS, ARL_OPTIONS_COUNT(OPTS), &o);
    char root[600];
    snprintf(root, sizeof root, "%s/store", dir);
    make_payload();
    store_setup(root);
    if (!w->ckpt_w) { /* --fg-checkpoint: SQLite's automatic checkpoint, as the raws have it */
        sqlite3_wal_hook(w->w.db, wal_hook, &store_frames[0]);
        sqlite3_wal_hook(w->s.db, wal_hook, &store_frames[1]);
    }
    raw_setup(&raw_store, dir, "store", 1);
    raw_setup(&raw_dflt, dir, "default", 0);
    schema_setup(dir);
    double mb_w = (double)seg_bytes(1) * n / 1e6, mb_r = (double)seg_bytes(0) * n / 1e6;
    int dflt_page = 0;
    sqlite3_stmt *pq_;
    if (sqlite3_prepare_v2(raw_dflt.w, "PRAGMA page_size", -1, &pq_, NULL) == SQLITE_OK) {
        if (sqlite3_step(pq_) == SQLITE_ROW) dflt_page = sqlite3_column_int(pq_, 0);
        sqlite3_finalize(pq_);
    }
    printf("bench_replay: %d segments of %d tokens per round, %d rounds; %.0f KiB written per "
           "segment (%.0f KiB tokens+routes, %.0f KiB KDA state)\n"
           "  store: worker file page %d, states file page %d (spec section 3: 16384 / 65536);\n"
           "  raw A: the store's settings (same page sizes, auto_vacuum, WAL, synchronous FULL "
           "worker / NORMAL states);\n"
           "  raw B: SQLite defaults (page %d, no auto_vacuum) with WAL and the same synchronous\n"
           "%s",
           n, T, rounds, seg_bytes(1) / 1024.0, seg_bytes(0) / 1024.0,
           (seg_bytes(1) - seg_bytes(0)) / 1024.0, RDB_PAGE_SIZE, RDB_PAGE_SIZE_STATES, dflt_page,
           use_deflate
               ? "  --deflate: the STORE writes per-token arrays with codec 1 (fewer bytes than "
                 "the raws, inflated on read): not the headline comparison\n"
               : "");
    /* Sustained write throughput (the headline): each side writes n_sus segments, then makes
     * them durable in its database files with a timed final checkpoint (TRUNCATE, both files;
     * the store's background pass in progress finishes first, inside the timing), so no side
     * leaves checkpoint work behind.  Sides take turns in a rotating order, several rounds; the
     * ratio of a round is raw time / store time for the same bytes. */
    double sus_t[4][1000], sus_ck[4][1000], sus_ra[1000], sus_rb[1000], sus_rq[1000];
    const double mb_sus = (double)seg_bytes(1) * n_sus / 1e6;
    store_truncate(); /* every side starts with an empty WAL */
    raw_truncate(raw_store.w);
    raw_truncate(raw_store.s);
    raw_truncate(raw_dflt.w);
    raw_truncate(raw_dflt.s);
    raw_truncate(qw);
    raw_truncate(qs);
    printf("sustained write: %d segments (%.1f MB) per side and round, each side ending with a "
           "timed wal_checkpoint(TRUNCATE) of its worker and states files; %d rounds, sides in "
           "rotating order\n",
           n_sus, mb_sus, sus_rounds);
    for (int r = 0; r < sus_rounds; r++) {
        for (int k = 0; k < 4; k++) {
            int which = (k + r) % 4;
            sus_t[which][r] = sustained_run(which, 1000 + r, n_sus, &sus_ck[which][r]);
        }
        sus_ra[r] = sus_t[1][r] / sus_t[0][r];
        sus_rb[r] = sus_t[2][r] / sus_t[0][r];
        sus_rq[r] = sus_t[3][r] / sus_t[0][r];
        printf("  round %d: store %.1f raw A %.1f raw B %.1f same-schema %.1f MB/s (final "
               "checkpoint %.0f / %.0f / %.0f / %.0f ms); store/raw A %.2f, store/raw B %.2f\n",
               r, mb_sus / sus_t[0][r], mb_sus / sus_t[1][r], mb_sus / sus_t[2][r],
               mb_sus / sus_t[3][r], sus_ck[0][r] * 1e3, sus_ck[1][r] * 1e3, sus_ck[2][r] * 1e3,
               sus_ck[3][r] * 1e3, sus_ra[r], sus_rb[r]);
    }
    rckpt_stats sus_cw, sus_cs; /* the store's checkpoint counters after the sustained phase */
    rckpt_get_stats(w->ckpt_w, &sus_cw);
    rckpt_get_stats(w->ckpt_s, &sus_cs);
    double best_sw = 1e30, best_aw = 1e30, best_bw = 1e30, best_qw = 1e30, best_sr = 1e30,
           best_ar = 1e30, best_br = 1e30;
    /* per-segment paired ratios raw/store: the median is robust to the machine's other load */
    size_t np_cap = (size_t)n * (size_t)rounds;
    double *pa = malloc(sizeof(double) * np_cap), *pb = malloc(sizeof(double) * np_cap),
           *pq = malloc(sizeof(double) * np_cap), *pra = malloc(sizeof(double) * np_cap),
           *prb = malloc(sizeof(double) * np_cap), *ps_st = malloc(sizeof(double) * np_cap),
           *pa_st = malloc(sizeof(double) * np_cap), *fs = malloc(sizeof(double) * np_cap),
           *ps_c = malloc(sizeof(double) * np_cap), *pa_c = malloc(sizeof(double) * np_cap),
           *fa = malloc(sizeof(double) * np_cap);
    if (!pa || !pb || !pq || !pra || !prb || !ps_st || !pa_st || !fs || !fa || !ps_c || !pa_c)
        die("out of memory");
    int np = 0;
    replay_seg_data d = {0};
    /* Store and raws alternate segment by segment, so that they see the same machine load (the
     * machine is shared); each round sums its per-segment times, the best round is reported.
     * Round ids: the sustained phase used 1000 + r, this one 2000 + r (2000 + rounds for the
     * page attribution), so that the raws' INTEGER PRIMARY KEYs only grow and every insert
     * appends to their b-trees, as the store's rowids do (a key below the largest one would
     * split pages in the middle of a raw b-tree and make the raws write more). */
    for (int r = 0; r < rounds; r++) {
        double sw = 0, aw = 0, bw = 0, qw_t = 0, sr = 0, ar = 0, br = 0;
        int64_t t = store_begin(2000 + r);
        for (int s = 0; s < n; s++) {
            /* the four writers take turns going first: a writer's commit (fsync) also flushes
             * what the writer before it left dirty, so a fixed order would bias the ratios */
            double tss = 0, tas = 0, dt[4] = {0, 0, 0, 0};
            for (int k = 0; k < 4; k++) {
                int which = (k + s + r) % 4;
                double t0 = now();
                if (which == 0)
                    store_write_one(2000 + r, t, s, &tss);
                else if (which == 1)
                    raw_write_one(&raw_store, 2000 + r, s, &tas);
                else if (which == 2)
                    raw_write_one(&raw_dflt, 2000 + r, s, NULL);
                else
                    schema_write_one(2000 + r, s);
                dt[which] = now() - t0;
            }
            sw += dt[0];
            aw += dt[1];
            bw += dt[2];
            qw_t += dt[3];
            pa[np + s] = dt[1] / dt[0];
            pb[np + s] = dt[2] / dt[0];
            pq[np + s] = dt[3] / dt[0];
            ps_st[np + s] = tss * 1e3;
            pa_st[np + s] = tas * 1e3;
            ps_c[np + s] = (dt[0] - tss) * 1e3;
            pa_c[np + s] = (dt[1] - tas) * 1e3;
            /* WAL bytes of the segment (state + segment transactions) */
            fs[np + s] =
                (fr_store[0] * (double)RDB_PAGE_SIZE + fr_store[1] * (double)RDB_PAGE_SIZE_STATES) /
                1024.0;
            fa[np + s] =
                (fr_raw[0] * (double)RDB_PAGE_SIZE + fr_raw[1] * (double)RDB_PAGE_SIZE_STATES) /
                1024.0;
        }
        for (int s = 0; s < n; s++) {
            double dt[3] = {0, 0, 0};
            for (int k = 0; k < 3; k++) { /* rotating order here too */
                int which = (k + s + r) % 3;
                double t0 = now();
                if (which == 0)
                    store_read_one(t, s, &d);
                else
                    raw_read_one(which == 1 ? &raw_store : &raw_dflt, 2000 + r, s);
                dt[which] = now() - t0;
            }
            sr += dt[0];
            ar += dt[1];
            br += dt[2];
            pra[np + s] = dt[1] / dt[0];
            prb[np + s] = dt[2] / dt[0];
        }
        np += n;
        if (sw < best_sw) best_sw = sw;
        if (aw < best_aw) best_aw = aw;
        if (bw < best_bw) best_bw = bw;
        if (qw_t < best_qw) best_qw = qw_t;
        if (sr < best_sr) best_sr = sr;
        if (ar < best_ar) best_ar = ar;
        if (br < best_br) best_br = br;
        printf("  round %d: write store %.1f raw A %.1f raw B %.1f same-schema %.1f MB/s; read "
               "store %.0f raw A %.0f raw B %.0f MB/s\n",
               r, mb_w / sw, mb_w / aw, mb_w / bw, mb_w / qw_t, mb_r / sr, mb_r / ar, mb_r / br);
    }
    /* the store read back exactly what it wrote */
    if (memcmp(d.tokens, tokens, sizeof tokens) ||
        memcmp(d.routes, routes, (size_t)LMOE * T * K * RB)) {
        fprintf(stderr, "bench_replay: read-back mismatch\n");
        return 1;
    }
    /* One more trajectory of two segments, outside the timing: the pages its second segment's
     * transactions wrote, by b-tree (segment 1 is a steady-state 'continue' segment). */
    {
        printf("pages written by one segment (S_s + C_s), by b-tree:\n");
        int64_t t = store_begin(2000 + rounds);
        double dummy;
        store_write_one(2000 + rounds, t, 0, &dummy);
        raw_write_one(&raw_store, 2000 + rounds, 0, NULL);
        int b0 = store_frames[0], b1 = store_frames[1];
        store_write_one(2000 + rounds, t, 1, &dummy);
        wal_attribute(w->s.db, "store states", b1, store_frames[1]);
        wal_attribute(w->w.db, "store worker", b0, store_frames[0]);
        b0 = raw_store.frames[0];
        b1 = raw_store.frames[1];
        raw_write_one(&raw_store, 2000 + rounds, 1, NULL);
        wal_attribute(raw_store.s, "raw A states", b1, raw_store.frames[1]);
        wal_attribute(raw_store.w, "raw A worker", b0, raw_store.frames[0]);
    }
    double wa = median(pa, np), wb = median(pb, np), wq = median(pq, np);
    double ra = median(pra, np), rb = median(prb, np);
    printf("where the time goes (medians per segment): store S_s %.2f ms, C_s %.2f ms; raw A "
           "states %.2f ms, segment %.2f ms; WAL written: store %.0f KiB, raw A %.0f KiB\n",
           median(ps_st, np), median(ps_c, np), median(pa_st, np), median(pa_c, np), median(fs, np),
           median(fa, np));
    printf("per-segment write (secondary): store %.1f MB/s; raw A %.1f, raw B %.1f, same-schema "
           "raw %.1f MB/s (best rounds of the paired phase)\n",
           mb_w / best_sw, mb_w / best_aw, mb_w / best_bw, mb_w / best_qw);
    printf("per-segment write latency ratio (secondary; median over segments of raw/store time "
           "of one S_s + C_s, i.e. how long a rollout worker waits per segment; the store's "
           "background checkpoints and the raws' rare inline ones fall outside it): vs raw A "
           "%.2f; vs raw B %.2f; vs same-schema raw %.2f\n",
           wa, wb, wq);
    if (w->ckpt_w) {
        printf("store checkpoints in the sustained phase: worker %lld background (%lld failed), "
               "%lld foreground, max %d WAL frames; states %lld background (%lld failed), %lld "
               "foreground, max %d frames; plus one final TRUNCATE per round\n",
               (long long)sus_cw.n_background, (long long)sus_cw.n_failed,
               (long long)sus_cw.n_foreground, sus_cw.max_frames, (long long)sus_cs.n_background,
               (long long)sus_cs.n_failed, (long long)sus_cs.n_foreground, sus_cs.max_frames);
    } else {
        printf("store checkpoints: in the writer's thread (--fg-checkpoint)\n");
    }
    printf("read:  store %.0f MB/s; raw A %.0f, raw B %.0f MB/s (best rounds)\n", mb_r / best_sr,
           mb_r / best_ar, mb_r / best_br);
    /* the headlines */
    double mt[4], mck[4], lo_a, hi_a, lo_b, hi_b, lo_q, hi_q, tmp[1000];
    for (int i = 0; i < 4; i++) {
        memcpy(tmp, sus_t[i], sizeof(double) * (size_t)sus_rounds);
        mt[i] = median(tmp, sus_rounds);
        memcpy(tmp, sus_ck[i], sizeof(double) * (size_t)sus_rounds);
        mck[i] = median(tmp, sus_rounds);
    }
    min_max(sus_ra, sus_rounds, &lo_a, &hi_a);
    min_max(sus_rb, sus_rounds, &lo_b, &hi_b);
    min_max(sus_rq, sus_rounds, &lo_q, &hi_q);
    double sa = median(sus_ra, sus_rounds), sb = median(sus_rb, sus_rounds),
           sq = median(sus_rq, sus_rounds);
    printf("sustained write, median of %d rounds: store %.1f MB/s, raw A %.1f, raw B %.1f, "
           "same-schema raw %.1f MB/s (final checkpoints %.0f / %.0f / %.0f / %.0f ms)\n",
           sus_rounds, mb_sus / mt[0], mb_sus / mt[1], mb_sus / mt[2], mb_sus / mt[3],
           mck[0] * 1e3, mck[1] * 1e3, mck[2] * 1e3, mck[3] * 1e3);
    /* the headline baseline is the raw setting that wrote faster in this run (median time):
     * raw sqlite3 at its own best of the two reasonable settings, not only at the store's */
    const int fa_ = mt[1] <= mt[2];
    const double sh = fa_ ? sa : sb, lo_h = fa_ ? lo_a : lo_b, hi_h = fa_ ? hi_a : hi_b;
    printf("write ratio (sustained, median over rounds of raw/store time, min..max): vs raw A "
           "%.2f (%.2f..%.2f); vs raw B %.2f (%.2f..%.2f); vs same-schema raw %.2f (%.2f..%.2f)\n",
           sa, lo_a, hi_a, sb, lo_b, hi_b, sq, lo_q, hi_q);
    printf("WRITE ratio (headline: sustained, vs the faster raw of this run, raw %s): %.2f "
           "(%.2f..%.2f over %d rounds), target >= 0.80: %s\n",
           fa_ ? "A" : "B", sh, lo_h, hi_h, sus_rounds, sh >= 0.8 ? "ok" : "MISSED");
    printf("READ ratio (headline: median paired raw/store): vs raw A %.2f, target >= 0.80: %s; "
           "vs raw B %.2f\n",
           ra, ra >= 0.8 ? "ok" : "MISSED", rb);
    free(pa);
    free(pb);
    free(pq);
    free(pra);
    free(prb);
    free(ps_st);
    free(pa_st);
    free(fs);
    free(fa);
    free(ps_c);
    free(pa_c);
    replay_seg_data_free(&d);
    free(routes);
    free(rd_routes);
    replay_writer_close(w);
    replay_store_close(st);
    raw_free(&raw_store);
    raw_free(&raw_dflt);
    sqlite3_stmt *qq[] = {q_state, q_chunk, q_state_done, q_seg, q_route, q_traj, q_event};
    for (size_t i = 0; i < sizeof qq / sizeof *qq; i++)
        sqlite3_finalize(qq[i]);
    sqlite3_close(qw);
    sqlite3_close(qs);
    const int missed = check && (sh < 0.8 || ra < 0.8);
    arl_options_free(OPTS, ARL_OPTIONS_COUNT(OPTS), &o);
    return missed ? 1 : 0;
}
