/* replay/internal.h: what the files of replay/ share and nobody else uses: the SQLite file
 * handle (rdb) with error mapping, the schema (schema.c), the store and writer structs.
 * Not a public API: include replay/replay.h or replay/inspect.h outside replay/. */
#ifndef ARL_REPLAY_INTERNAL_H
#define ARL_REPLAY_INTERNAL_H

#include <sqlite3.h>
#include <stdio.h>

#include "replay/replay.h"

/* ---- one SQLite file ---------------------------------------------------------------------- */

typedef struct rdb {
    sqlite3 *db; /* NULL when not open */
    char *path;  /* filesystem path (owned) */
    char *name;  /* display name, relative to the store root (owned) */
    int kind;    /* replay_file_kind */
    int readonly;
    int schema_version;     /* user_version read at open */
    int min_reader_version; /* meta.min_reader_version read at open */
    int empty;        /* read-only open of a file without a schema (a writer died creating it) */
    int allow_sealed; /* opened with RDB_ALLOW_SEALED: migrate() may migrate a sealed file */
} rdb;

/* RDB_ALLOW_SEALED: open a sealed file (meta.sealed = 1, spec section 2.3) for writing; without
 * it a writer's open of a sealed file is ARL_ERR_STATE, before anything is written to it. */
enum { RDB_READONLY = 1u << 0, RDB_CREATE = 1u << 1, RDB_ALLOW_SEALED = 1u << 2 };

/* Open path with the connection settings of spec section 3 (writers) or SQLITE_OPEN_READONLY
 * (readers), then create (RDB_CREATE, empty file) or check and migrate the schema of kind.
 * meta_init (may be NULL) holds extra meta rows for a new file as "key\0value\0...\0\0". */
arl_status rdb_open(rdb *d, const char *path, const char *name, int kind, unsigned flags,
                    const char *vfs, const char *meta_init);
void rdb_close(rdb *d);

/* Map a SQLite result code to a status with a message naming the file, what failed, SQLite's
 * message and what to do.  Rolls back an open transaction of a writer. */
arl_status rdb_fail(rdb *d, int rc, const char *what);
arl_status rdb_exec(rdb *d, const char *sql);
arl_status rdb_prepare(rdb *d, const char *sql, sqlite3_stmt **st);
arl_status rdb_begin(rdb *d); /* BEGIN IMMEDIATE */
arl_status rdb_commit(rdb *d);
void rdb_rollback(rdb *d); /* no-op outside a transaction */
/* End the transaction of rdb_begin: commit if s is ARL_OK (the commit's status), else roll back
 * and return s. */
arl_status rdb_end(rdb *d, arl_status s);
/* A read transaction of a reader: everything read between rdb_read_begin and rdb_read_end is of
 * one snapshot (the first read's), whatever the writer commits meanwhile.  Keep it to one
 * trajectory: a long one stops the writer's WAL checkpoints from completing (section 3). */
void rdb_read_begin(rdb *d);
void rdb_read_end(rdb *d);
/* Leave WAL mode (a sealed file, spec section 2.3): a TRUNCATE checkpoint, then journal_mode
 * DELETE.  SQLite refuses that switch at once (SQLITE_BUSY, without calling the busy handler)
 * while any other connection has the file open, a reader's too; readers keep their
 * connections short (section 3), so it is tried again for up to the busy timeout (10 s), then
 * ARL_ERR_BUSY saying so. */
arl_status rdb_leave_wal(rdb *d);
/* One integer from a query without parameters; *found = 0 if no row (found may be NULL). */
arl_status rdb_query_int(rdb *d, const char *sql, int64_t *v, int *found);
/* meta value of key into buf (""), *found as above. */
arl_status rdb_meta_get(rdb *d, const char *key, char *buf, size_t cap, int *found);
arl_status rdb_meta_set(rdb *d, const char *key, const char *value);

/* Bind helpers (index from 1): NULL for NULL text, -1 ints, NAN reals. */
int rdb_bind_text(sqlite3_stmt *s, int i, const char *v);
int rdb_bind_int_or_null(sqlite3_stmt *s, int i, int64_t v);
int rdb_bind_real_or_null(sqlite3_stmt *s, int i, double v);
/* Copy a text column into buf (cap bytes, truncated, "" for NULL). */
void rdb_col_text(sqlite3_stmt *s, int i, char *buf, size_t cap);
int64_t rdb_col_int_or(sqlite3_stmt *s, int i, int64_t if_null);

/* ---- schema (schema.c) -------------------------------------------------------------------- */

/* The DDL (tables then indexes) of a file kind, as one script. Static string. */
const char *rschema_ddl(int kind);
/* Page sizes of new files (spec section 3): catalog, worker, learner and tool files 16 KiB,
 * states files 64 KiB.  bench/replay measured that a states file at 16 KiB writes less WAL per
 * tiny-model state (every S_s transaction rewrites five small b-tree pages besides its chunks,
 * 320 KiB at 64 KiB pages, more than a tiny boundary state of 224 KiB); the spec's 64 KiB suits
 * large states (K3: 6 MiB chunks) and is kept.  Overridable at compile time for experiments. */
#ifndef RDB_PAGE_SIZE /* compile-time overrides for experiments (bench/replay) */
#define RDB_PAGE_SIZE 16384
#endif
#ifndef RDB_PAGE_SIZE_STATES
#define RDB_PAGE_SIZE_STATES 65536
#endif

/* Apply the page_size/auto_vacuum/journal_mode/synchronous/... settings of spec section 3. */
arl_status rschema_configure(rdb *d, int is_new);
/* Create the schema of a new file (one transaction, with meta). */
arl_status rschema_create(rdb *d, const char *meta_init);
/* Check application_id, versions, file_kind; migrate forward when writable (section 12). */
arl_status rschema_check(rdb *d);
/* The schema version this build writes (REPLAY_SCHEMA_VERSION unless a test overrides it). */
int rschema_version(void);
/* Test hook: pretend this build writes version `version`, migrating from version-1 with sql
 * (NULL: restore the defaults). */
void rschema_test_override(int version, const char *migration_sql, int raises_min_reader);

/* ---- the store ---------------------------------------------------------------------------- */

typedef struct rshard {
    int32_t shard_id;
    int kind;              /* WORKER, LEARNER, TOOL */
    char *file;            /* relative name "shards/w3.sqlite" */
    char *path;            /* full path */
    rdb db;                /* read-only connection, opened lazily */
    rdb states;            /* its states file, opened lazily (may not exist) */
    sqlite3_stmt *stmt[6]; /* cached read statements on db (reader.c) */
} rshard;

/* Plan log for the EXPLAIN QUERY PLAN checks of tests (replay/inspect.h). */
typedef struct rplan_log {
    int enabled;
    char *text; /* "query\n  plan line\n..." accumulated (owned) */
    size_t len, cap;
} rplan_log;

struct replay_store {
    char *root; /* as given */
    char *dir;  /* store root directory ("" for a single shard file) */
    char *vfs;  /* owned or NULL */
    char host[256];
    unsigned flags;
    int single_file;
    rdb cat; /* catalog; cat.db NULL if the store has none */
    char store_uid[40];
    rshard *shards; /* (n_shards), sorted by shard_id */
    size_t n_shards;
    rplan_log plan;
};

/* Shard by id (NULL if unknown); refreshes the list once if missing. */
rshard *rstore_shard(replay_store *st, int32_t shard_id);
/* The (id, kind) of every shard the store knows now, in shard_id order: a copy (*out, n_shards
 * entries; the caller frees it) for loops that open writers, which refresh st->shards. */
typedef struct rshard_ref {
    int32_t id;
    int kind; /* replay_file_kind */
} rshard_ref;
arl_status rstore_shards_copy(const replay_store *st, rshard_ref **out, size_t *n);
/* Close the store's read connections to shard shard_id (reopened lazily when next read):
 * sealing switches the file out of WAL, which needs no other connection open. */
void rstore_shard_release(replay_store *st, int32_t shard_id);
/* 1 if shard shard_id's file is sealed (meta.sealed = 1), 0 if not or unreadable. */
int rstore_shard_sealed(replay_store *st, int32_t shard_id);
/* Open the shard's read connection (or states file) if needed. */
arl_status rstore_shard_db(replay_store *st, rshard *sh, rdb **out);
arl_status rstore_shard_states(replay_store *st, rshard *sh, rdb **out);
/* Prepare a read query on a shard or the catalog, logging its plan when plan checks are on. */
arl_status rstore_prepare(replay_store *st, rdb *d, const char *sql, sqlite3_stmt **out);

/* Path helpers: "<dir>/shards/<c><id>.sqlite" etc. Caller frees. */
char *rstore_shard_rel(int kind, int32_t shard_id);
char *rstore_join(const char *dir, const char *rel);
const char *rstore_kind_letter(int kind);
/* replay_file_kind of a meta.file_kind name; -1 if unknown. */
int rfile_kind_parse(const char *name);
int64_t rnow_ms(void);

/* Catalog lookups for display and export, copied into buf: a row the catalog lacks (or a store
 * without a catalog) gives a stand-in with the id, "run#3", "env#2" (its version ""); a failed
 * query (out of memory, I/O) is an error (set), never a stand-in. */
arl_status rcat_run_uid(replay_store *st, int64_t run_id, char *buf, size_t cap);
arl_status rcat_group_uid(replay_store *st, int64_t group_id, char *buf, size_t cap);
arl_status rcat_env_name(replay_store *st, int64_t env_id, char *name, size_t ncap, char *version,
                         size_t vcap);
arl_status rcat_task_uid(replay_store *st, int64_t task_id, char *buf, size_t cap);
/* Update the member mirror of one trajectory (best effort; warns on failure). */
void rcat_member_mirror(replay_store *st, int64_t group_id, int32_t slot, int32_t attempt,
                        const char *traj_uid, int32_t shard_id, int64_t traj_id,
                        const char *status);

/* Claim member (group_id, slot, attempt) for trajectory traj_uid (traj_id) of shard shard_id in
 * the catalog's group_members, status 'running': a new member, or one of the same shard (its
 * writer restarted).  ARL_ERR_BUSY when the same trajectory (traj_uid) of another shard holds it
 * (a second writer of the same run uid samples it); ARL_OK without a writable catalog. */
arl_status rcat_member_claim(replay_store *st, int64_t group_id, int32_t slot, int32_t attempt,
                             const char *traj_uid, int32_t shard_id, int64_t traj_id);

/* Ownership lock on "<file>.lock" (spec section 2.2): fcntl write lock, also refused when this
 * process already holds it.  ARL_ERR_BUSY when held elsewhere: at once when brief is set (a
 * maintenance command, which holds the file for a moment and skips a busy one) or a writer
 * holds it; a writer (brief 0) first waits up to 10 s for a brief holder to let it go. */
arl_status rlock_acquire(const char *path, const char *name, int brief, int *fd, uint64_t *dev,
                         uint64_t *ino);
void rlock_release(int fd, uint64_t dev, uint64_t ino);
/* The pid of the process that holds the ownership lock of the shard file at path (its lock
 * "<path>.lock"): > 0; 0 when none holds it, this process does, or it cannot be told. */
long rlock_holder(const char *path);
/* 1 if the shard file at path is missing and no writer holds its lock: a writer registers a
 * new shard in the catalog under its lock, before it creates the file (a reader between the
 * two sees the file being created, not lost). */
int rstore_file_missing(const char *path);
/* One line to out (may be NULL) for shard file `file` (at path) that a maintenance command
 * skipped because its lock was busy: "<file>: skipped (writer alive, pid P): <then>", then
 * saying what happens to the file instead (e.g. "it collects its own states"). */
void rlock_print_skipped(FILE *out, const char *file, const char *path, const char *then);

/* The maintenance commands (gc, seal, migrate: `what`) need a store root with a writable
 * catalog: ARL_ERR_STATE saying which of a shard file, a folder of shard files or a read-only
 * catalog st is instead. */
arl_status rstore_need_root(replay_store *st, const char *what);

/* Shards registered in the catalog whose file is missing (only shard only_shard when > 0): one
 * line each to out (may be NULL), "<file>: failed: ..." when the catalog's group_members refer
 * to trajectories in it (lost: ARL_ERR_CORRUPT is returned for the first, naming it), else
 * "<file>: skipped: ..." (a writer that died while creating it; ARL_OK).  *n_missing receives
 * their count.  What gc, seal and migrate report, since they only see the files present
 * (verify.c, beside verify's own finding). */
arl_status rstore_report_missing(replay_store *st, int32_t only_shard, FILE *out, int *n_missing);

/* Test hook (gc.c): fn(arg) is called by replay_states_retain after it has read the pins and
 * chosen the states to evict, before it evicts them: where another process's `replay pin` can
 * commit (a test pins there).  NULL: none. */
void rgc_test_hook_set(void (*fn)(void *arg), void *arg);

/* ---- reading (reader.c) ---- */

/* The trajectories columns rtraj_fill reads, in order (unqualified: one table in FROM). */
#define RTRAJ_COLS                                                                                 \
    "traj_id, traj_uid, run_id, group_id, slot, attempt, task_id, env_id, session_id, status, "    \
    "end_cause, error_code, error_attribution, parent_traj_uid, fork_seg_index, resume_count, "    \
    "n_segments, n_turns, n_tokens, n_action_tokens, min_version, max_version, outcome_reward, "   \
    "created_at_ms, updated_at_ms, finished_at_ms"
void rtraj_fill(sqlite3_stmt *q, int32_t shard_id, replay_traj_row *r);

/* Compact JSON with shortest round-trip reals (jsonout.c); j is a json_t *. */
struct json_t;
void rjson_dump(struct json_t *j, FILE *f);
/* The same as a string (caller frees); NULL on OOM. */
char *rjson_dumps(struct json_t *j);

/* ---- background checkpoints (checkpoint.c) ------------------------------------------------ */

/* The spec's wal_autocheckpoint (section 3): a commit that leaves this many WAL frames or more
 * checkpoints in the foreground, as SQLite's automatic checkpoint would. */
#define RCKPT_BACKSTOP_FRAMES 1000
/* A commit that leaves this many frames or more wakes the background checkpointer. */
#ifndef RCKPT_WAKE_FRAMES
#define RCKPT_WAKE_FRAMES 500
#endif

typedef struct rckpt rckpt;
typedef struct rckpt_stats {
    int last_frames;       /* WAL frames after the writer's last commit */
    int max_frames;        /* most frames any commit left */
    int64_t n_background;  /* background checkpoints that succeeded */
    int64_t frames_copied; /* sum over them of the WAL frames backfilled when each ended */
    int64_t n_failed;      /* background checkpoints that failed (retried at the next wake) */
    int last_rc;           /* SQLite extended code of the last failure */
    int64_t n_foreground;  /* commits that reached the backstop and checkpointed themselves */
} rckpt_stats;

/* Start the background checkpointer of d (a writer's open file, in WAL mode): its own
 * connection to d->path through vfs (NULL: default), a thread, and a WAL hook on d->db
 * (replacing SQLite's automatic checkpoint by the same 1000-frame rule plus the wake).
 * *out is owned by the caller until rckpt_stop; d must stay open until then.  *out = NULL (and
 * SQLite's automatic checkpoint stays) when SQLite was built without thread support. */
arl_status rckpt_start(rdb *d, const char *vfs, rckpt **out);
/* Stop and join the thread (a checkpoint in progress completes first), close its connection and
 * give d->db SQLite's automatic checkpoint at 1000 frames back.  NULL is a no-op. */
void rckpt_stop(rckpt *c);
/* A TRUNCATE checkpoint of d (the file c checkpoints; c may be NULL) on the writer's own
 * connection, after the background pass in progress, if any, has finished; no background pass
 * runs during it.  Returns SQLite's code (SQLITE_BUSY: a reader holds an old snapshot, after
 * d's busy timeout); *n_log, *n_done as sqlite3_wal_checkpoint_v2 reports them. */
int rckpt_truncate(rckpt *c, rdb *d, int *n_log, int *n_done);
/* Wake the thread for a checkpoint now, whatever the WAL holds (returns at once).  NULL: no-op. */
void rckpt_wake(rckpt *c);
/* A snapshot of the counters (zeros for NULL). */
void rckpt_get_stats(rckpt *c, rckpt_stats *out);

/* ---- the writer --------------------------------------------------------------------------- */

struct replay_writer {
    replay_store *st;
    int kind;
    int32_t shard_id;
    char *file; /* relative name */
    char *states_file;
    rdb w; /* the shard */
    rdb s; /* its states file */
    int lock_fd;
    char *lock_path;
    uint64_t lock_dev, lock_ino;
    int64_t *interrupted;
    size_t n_interrupted;
    sqlite3_stmt *stmt[24]; /* prepared statements of the hot path (writer.c) */
    sqlite3_stmt *sstmt[4]; /* ... on the states file */
    rckpt *ckpt_w, *ckpt_s; /* background checkpointers of w and s (NULL: SQLite's automatic
                               checkpoint, REPLAY_OPEN_FG_CHECKPOINT) */
    uint8_t *scratch;       /* blob encoding buffer */
    size_t scratch_cap;
    int rescore_tx; /* inside replay_rescore_tx_begin .. _end: the puts do not commit */
};

/* For a put of records.c or rewards.c: ARL_OK inside a live re-score transaction (w->rescore_tx
 * set), ARL_ERR_STATE naming the file when an earlier failure rolled it back. */
arl_status rrescore_tx_live(replay_writer *w);

/* Grow w->scratch (the writer's blob encoding buffer) to at least n bytes (doubling, from
 * 64 KiB); ARL_ERR_NOMEM leaves the old buffer in place. */
arl_status replay_writer_scratch_reserve(replay_writer *w, size_t n);

/* replay_writer_open for a maintenance command (brief set: gc, seal, migrate, recover, verify
 * --repair), which takes a file over for a moment and skips a busy one: ARL_ERR_BUSY at once
 * when the lock is held, and a writer that wants the file waits for it (rlock_acquire). */
arl_status rwriter_open(replay_store *st, replay_file_kind kind, int32_t shard_id,
                        const char *run_uid, int brief, replay_writer **out);

/* Set the writer's interrupted list to every running trajectory of its file (recover: a file
 * whose lock was free has no writer generating anything). */
arl_status rwriter_scan_running(replay_writer *w);

/* Image elision (elide.c).  Finds the base64 PNG "data" strings of body, replaces each with
 * "sha256:<hex>" in *out (malloc'd, *out_len), and returns the images found (malloc'd arrays,
 * PNG bytes decoded).  Returns ARL_ERR_NOMEM only; bodies without images come back unchanged. */
typedef struct relided_image {
    size_t body_offset; /* offset of the placeholder in the stored body */
    uint8_t sha256[32];
    uint8_t *png; /* owned */
    size_t png_nbytes;
    int32_t width, height;
} relided_image;
arl_status relide_images(const uint8_t *body, size_t n, uint8_t **out, size_t *out_len,
                         relided_image **imgs, size_t *n_imgs);
void relided_free(relided_image *imgs, size_t n);
/* Reconstruct: replace placeholders at the given offsets (increasing) with base64 of pngs. */
typedef struct rimage_ref {
    size_t body_offset;
    const uint8_t *png;
    size_t png_nbytes;
} rimage_ref;
arl_status rimages_restore(const uint8_t *stored, size_t n, const rimage_ref *refs, size_t n_refs,
                           uint8_t **out, size_t *out_len);

#endif
