/* replay/replay.h: the replay store (spec/replay.md): a directory of SQLite files that holds
 * every trajectory the rollout workers produce -- segments of tokens with behaviour
 * log-probabilities, per-token policy versions, loss masks and MoE routes, the raw environment
 * exchanges, rewards at three levels -- and cached model states at segment boundaries.
 *
 * What it is: the writer side (one process per shard file, spec section 2), the catalog
 * (runs, environments, tasks, groups, shard registry, the consumption ledger, pins), learner
 * records and re-scores, the retention of cached states, and the reader side for the learner and
 * the inspection tools (replay/inspect.h), which reads all shards of a store as one.
 * What it is not: it knows nothing of the model's math (tokens, log-probabilities, routes and
 * states are opaque arrays here), of HTTP, or of advantages.  Resuming an interrupted
 * trajectory against its environment (spec section 7.5 steps 3-5) is rollout's job; this
 * module detects interrupted trajectories and records the outcome.
 *
 * Files under the store root (spec section 2.1):
 *   catalog.sqlite                   runs, versions, envs, tasks, groups, members, shards
 *   shards/w<id>.sqlite              one rollout worker's trajectories (worker file)
 *   shards/w<id>.states.sqlite       that worker's cached states
 *   shards/t<id>.sqlite (+ .states)  tool files (import, fork)
 *   shards/l<id>.sqlite (+ .states)  learner files (read here; written by the learner)
 * A shard file is written by exactly one process, which holds an fcntl lock on
 * "<file>.lock" while it runs (one lock covers the shard and its states file).  The catalog is
 * written with short BEGIN IMMEDIATE transactions by any process of the host (SQLite
 * serialises them; busy_timeout 10 s): in a training run that is the coordinator, in tests and
 * single-process runs it is whoever opens the store.  Trajectory ids are global:
 * traj_id = shard_id * 2^40 + sequence, so shard = traj_id >> 40.
 *
 * Conventions: every function returns an arl_status and sets the thread's error message
 * (core/status.h) naming the file and what to do.  Strings passed in are copied or used only
 * during the call unless stated.  Nullable integer arguments use -1 for SQL NULL; nullable reals
 * use NAN.  Enumerated text columns (end_cause, start_kind, parse_status, ...) are passed as the
 * spec's strings and checked by the schema's CHECK constraints (a violation is ARL_ERR_ARG
 * naming the constraint).  Not thread-safe: one replay_store / replay_writer per thread.
 */
#ifndef ARL_REPLAY_REPLAY_H
#define ARL_REPLAY_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "core/blob.h"
#include "core/status.h"

#define REPLAY_SCHEMA_VERSION 1
#define REPLAY_APPLICATION_ID 1095912497 /* 0x41524C31, "ARL1" */
#define REPLAY_UID_MAX 256               /* AEP identifiers: 1..256 bytes */
#define REPLAY_SHARD_MAX 8388607         /* shard ids 1 .. 2^23 - 1 */
#define REPLAY_TRAJ_ID_SHIFT 40

typedef struct replay_store replay_store;
typedef struct replay_writer replay_writer;
typedef struct replay_seg_iter replay_seg_iter;

typedef enum replay_file_kind {
    REPLAY_FILE_CATALOG = 0,
    REPLAY_FILE_WORKER = 1,
    REPLAY_FILE_STATES = 2,
    REPLAY_FILE_LEARNER = 3,
    REPLAY_FILE_TOOL = 4,
} replay_file_kind;

/* Trajectory statuses (spec section 8.1). */
typedef enum replay_status {
    REPLAY_RUNNING = 0,
    REPLAY_COMPLETE = 1,
    REPLAY_TRUNCATED = 2,
    REPLAY_MASKED = 3,
} replay_status;
#define REPLAY_STATUS_BIT(s) (1u << (s))
#define REPLAY_STATUS_TRAINABLE                                                                    \
    (REPLAY_STATUS_BIT(REPLAY_COMPLETE) | REPLAY_STATUS_BIT(REPLAY_TRUNCATED))

/* "running", "complete", ... ; "?" for a bad value. Static string. */
const char *replay_status_name(int status);
/* Inverse of replay_status_name; -1 if unknown. */
int replay_status_parse(const char *name);
/* "catalog", "worker", "states", "learner", "tool". Static string. */
const char *replay_file_kind_name(int kind);

/* ---- opening a store --------------------------------------------------------------------- */

enum {
    REPLAY_OPEN_CREATE = 1u << 0,   /* create the root directory and catalog if missing */
    REPLAY_OPEN_READONLY = 1u << 1, /* never write (catalog and shards opened read-only) */
    /* Writers store a segment's per-token arrays (tokens, log-probs, loss mask, versions) with
     * codec 1 (deflate, core/deflate.h) when that saves at least 20 % (spec section 5.1 rule
     * 5): runs of equal values (versions, mask, the 0.0 log-probs of context tokens) shrink a
     * lot.  Off by default: inflating costs readers more than the bytes saved gain writers
     * (bench_replay --deflate: 5 % fewer WAL bytes per segment, read path 4x slower). */
    REPLAY_OPEN_DEFLATE = 1u << 2,
    /* Writers checkpoint their WAL in the committing thread (SQLite's automatic checkpoint at
     * 1000 frames) instead of in a background thread per file (replay/checkpoint.c, the
     * default; the 1000-frame rule stays as its backstop).  For measurements and tests. */
    REPLAY_OPEN_FG_CHECKPOINT = 1u << 3,
};

typedef struct replay_open_opts {
    unsigned flags;   /* REPLAY_OPEN_* */
    const char *vfs;  /* SQLite VFS for every file (NULL: the default); tests inject faults */
    const char *host; /* owner host recorded in meta and shards (NULL: gethostname()) */
} replay_open_opts;

/* Open the store at root: a store root directory (catalog.sqlite and shards/), a directory of
 * shard files without a catalog (read-only), or one shard file (read-only).  opts may be NULL
 * (read-write, no create).  The catalog's schema is checked (and migrated when writable); shard
 * files are opened lazily when read.  *out is freed with replay_store_close. */
arl_status replay_store_open(const char *root, const replay_open_opts *opts, replay_store **out);
void replay_store_close(replay_store *st); /* NULL: no-op */

/* Rescan the shard files (pick up shards created by other processes since open). */
arl_status replay_store_refresh(replay_store *st);

/* The root as given to replay_store_open; valid until replay_store_close. */
const char *replay_store_root(const replay_store *st);
/* The store's store_uid (spec section 4.1: random, one per store root, in every file); "" for
 * bare shard files.  Valid until replay_store_close. */
const char *replay_store_uid(const replay_store *st);
/* 1 if the store has a catalog (0 for bare shard files). */
int replay_store_has_catalog(const replay_store *st);

/* ---- catalog (spec sections 4.2-4.5) ----------------------------------------------------- */

typedef struct replay_run_desc {
    const char *run_uid;              /* required */
    const char *config_json;          /* NULL: "{}" */
    const char *model_config_json;    /* NULL: "{}" */
    const char *tokenizer_sha256;     /* NULL: "" */
    const char *chat_template_sha256; /* NULL: "" */
    const char *code_version;         /* NULL: AGENTRL_VERSION */
    const char *notes;                /* NULL: NULL */
} replay_run_desc;

/* Insert the run if its run_uid is new (status 'active'), else return the existing id. */
arl_status replay_run_ensure(replay_store *st, const replay_run_desc *d, int64_t *run_id);
/* Id of run_uid; ARL_ERR_NOT_FOUND if absent. */
arl_status replay_run_find(replay_store *st, const char *run_uid, int64_t *run_id);
/* status: "active", "finished" or "aborted". */
arl_status replay_run_set_status(replay_store *st, int64_t run_id, const char *status);

typedef struct replay_version_desc {
    int64_t run_id;
    int64_t version;            /* 0 = initial weights */
    int64_t update_n;           /* -1: NULL (version 0) */
    const char *checkpoint_uri; /* may be NULL */
    const char *weights_sha256; /* may be NULL */
    double kl_coef;             /* NAN: NULL */
    const char *metrics_json;   /* may be NULL */
} replay_version_desc;
/* Insert a policy_versions row (ARL_ERR_STATE if (run, version) exists with other content). */
arl_status replay_version_add(replay_store *st, const replay_version_desc *d);
/* The policy version of run_id that a checkpoint is: the row whose weights_sha256 equals
 * weights_sha256 (hex; *how = 1), else the first row without a recorded hash whose
 * checkpoint_uri names the same directory as ckpt_dir after realpath (*how = 2).  A row whose
 * recorded hash differs never matches by path.  ARL_ERR_NOT_FOUND (*version = -1) when no row
 * matches or the store has no catalog.  how may be NULL. */
arl_status replay_version_find(replay_store *st, int64_t run_id, const char *weights_sha256,
                               const char *ckpt_dir, int64_t *version, int *how);
/* A policy_versions row as read back: checkpoint_uri and weights_sha256 are "" when NULL. */
typedef struct replay_version_row {
    int64_t version;
    char checkpoint_uri[4096];
    char weights_sha256[65];
} replay_version_row;
/* Row (run_id, version) of policy_versions into *out, or the run's newest (highest) version
 * when version < 0.  ARL_ERR_NOT_FOUND when there is no such row or the store has no
 * catalog. */
arl_status replay_version_get(replay_store *st, int64_t run_id, int64_t version,
                              replay_version_row *out);

/* A member of a fork group as the catalog records it. */
typedef struct replay_fork_member {
    int64_t traj_id;
    int32_t shard_id;
    replay_status status;
} replay_fork_member;
/* The members of every fork group (kind 'fork') of trajectory parent_traj_uid at
 * parent_seg_index, the forks that continue from the end of that segment (spec section 13.7),
 * in traj_id order: *out malloc'ed (NULL when *n is 0; caller frees).  A store without a
 * catalog has none. */
arl_status replay_forks_at(replay_store *st, const char *parent_traj_uid, int32_t parent_seg_index,
                           replay_fork_member **out, size_t *n);

typedef struct replay_env_desc {
    const char *name;      /* required */
    const char *version;   /* required */
    const char *info_json; /* the /info body (NULL: "{}"); info_sha256 is computed from it */
    const char *transport; /* "http" or "c_abi" (NULL: "c_abi") */
    const char *base_url;  /* may be NULL */
} replay_env_desc;
arl_status replay_env_ensure(replay_store *st, const replay_env_desc *d, int64_t *env_id);

typedef struct replay_task_desc {
    const char *task_uid; /* AEP task.id, required */
    const char *env_name; /* required */
    int64_t seed;
    const char *data_json; /* NULL: "{}"; data_sha256 is computed from these bytes */
    const char *dataset;   /* may be NULL */
    const char *split;     /* may be NULL */
} replay_task_desc;
arl_status replay_task_ensure(replay_store *st, const replay_task_desc *d, int64_t *task_id);

typedef struct replay_group_desc {
    const char *group_uid; /* AEP group_id, required */
    int64_t run_id, task_id, env_id;
    const char *kind; /* "train", "eval" or "fork" (NULL: "train") */
    int32_t size;     /* G */
    int64_t admitted_version;
    const char *parent_traj_uid; /* kind 'fork' only */
    int32_t parent_seg_index;    /* kind 'fork' only; -1 otherwise */
} replay_group_desc;
/* Insert the group if its group_uid is new (status 'open'), else return the existing id when it
 * is the same group: the same run, task, kind and size (a group's members are samples of one
 * task, fixed when it is first written); ARL_ERR_STATE, naming both, when it is another. */
arl_status replay_group_ensure(replay_store *st, const replay_group_desc *d, int64_t *group_id);

/* A catalog group (task_groups) as read back, with the number of its group_members rows. */
typedef struct replay_group_row {
    int64_t group_id, run_id, task_id;
    char group_uid[REPLAY_UID_MAX + 1];
    /* its task (tasks row task_id): uid, environment name, seed, SHA-256 of data_json */
    char task_uid[REPLAY_UID_MAX + 1], task_env[128], task_data_sha256[65];
    int64_t task_seed;
    char kind[8];    /* "train", "eval" or "fork" */
    char status[12]; /* "open", "final", "consumed" or "abandoned" */
    int32_t size;
    char parent_traj_uid[REPLAY_UID_MAX + 1]; /* kind 'fork'; "" otherwise */
    int32_t parent_seg_index;                 /* kind 'fork'; -1 otherwise */
    int64_t n_members;                        /* group_members rows (every slot and attempt) */
} replay_group_row;
/* The group group_uid into *out.  ARL_ERR_NOT_FOUND when the catalog has no such group (or the
 * store has no catalog). */
arl_status replay_group_get(replay_store *st, const char *group_uid, replay_group_row *out);

/* Rebuild group_members' status mirror from the shards and mark groups whose latest attempts
 * are all final as 'final' (what the coordinator does at start, spec section 4.4). */
arl_status replay_catalog_reconcile(replay_store *st);

/* ---- writing a shard (spec section 7) ---------------------------------------------------- */

/* Open (or create) a shard file of kind WORKER, TOOL or LEARNER for writing, with its states
 * file (a LEARNER file holds learner_records: replay_learner_record_put).
 * shard_id 0 registers a new shard in the catalog; a positive id reopens that shard (created if
 * it is registered but missing).  Takes the shard's lock: ARL_ERR_BUSY if another process
 * writes it; a maintenance command (gc, seal, migrate, recover, verify --repair) that has the
 * file for a moment is waited for, up to 10 s.  If the file's previous writer was another
 * process, its running trajectories are interrupted (spec section 7.5): list them with
 * replay_writer_interrupted and resolve each with replay_writer_recover, replay_traj_resume or
 * replay_traj_mask before beginning new ones.
 * run_uid (may be NULL) is recorded in meta for a new file.  Free with replay_writer_close.
 * Unless the store was opened with REPLAY_OPEN_FG_CHECKPOINT, the writer checkpoints each file's
 * WAL in a background thread with its own connection (replay/checkpoint.c); the writer itself
 * is used from one thread at a time, as before. */
arl_status replay_writer_open(replay_store *st, replay_file_kind kind, int32_t shard_id,
                              const char *run_uid, replay_writer **out);
/* Copy everything committed to the writer's worker and states files from their WALs into the
 * database files, sync them and empty the WALs (PRAGMA wal_checkpoint(TRUNCATE) on each, after
 * the background checkpoint in progress, if any, has finished).  For a consistent end point:
 * before a backup or an idle period, and at the end of a timed benchmark run.  ARL_ERR_BUSY
 * when a reader keeps an old snapshot open past the busy timeout (nothing is lost: the WAL
 * keeps every frame). */
arl_status replay_writer_checkpoint(replay_writer *w);
/* Stop the checkpoint threads, close the files and release the lock (running trajectories stay
 * running).  NULL: no-op. */
void replay_writer_close(replay_writer *w);
int32_t replay_writer_shard_id(const replay_writer *w);
/* The ids of the shards of one kind registered in the catalog, ascending: the first cap into
 * ids, *n receives how many there are. */
arl_status replay_shards_of_kind(replay_store *st, replay_file_kind kind, int32_t *ids, size_t cap,
                                 size_t *n);
/* Path of the shard file relative to the store root ("shards/w3.sqlite"). */
const char *replay_writer_file(const replay_writer *w);

/* Trajectories found running when this writer took the file over from a dead writer.
 * *ids points into the writer (valid until the next recover/close); *n may be 0. */
void replay_writer_interrupted(const replay_writer *w, const int64_t **ids, size_t *n);

/* Store-level recovery of the interrupted trajectories (spec section 7.5 step 1 and
 * section 13.8 recover): masks those with no committed segment (INTERRUPTED, infra,
 * end_cause 'interrupted'); with mask_all, masks the others too; otherwise writes one
 * 'interrupted' event for each of the others, which stay running for a resume.  Counts go to
 * *n_masked and *n_resumable (either may be NULL). */
arl_status replay_writer_recover(replay_writer *w, int mask_all, int64_t *n_masked,
                                 int64_t *n_resumable);

/* Seal the shard (spec section 2.3): checkpoint, journal_mode DELETE, meta.sealed = 1,
 * catalog sealed_at_ms.  The writer is closed afterwards either way. */
arl_status replay_writer_seal(replay_writer *w);

typedef struct replay_traj_desc {
    const char *traj_uid; /* AEP trajectory_id, required, <= 256 bytes */
    int64_t run_id, group_id, task_id, env_id;
    int32_t slot, attempt;
    int64_t policy_version;      /* version loaded when the trajectory starts (created event) */
    const char *session_id;      /* may be NULL */
    const char *parent_traj_uid; /* forks only (replay_fork_begin sets it) */
    int32_t fork_seg_index;      /* forks only; -1 otherwise */
} replay_traj_desc;

/* T0: claim the trajectory's group member in the catalog's group_members, then insert it as
 * 'running' with a 'created' event.  *traj_id receives its global id.  ARL_ERR_BUSY, with nothing
 * written, when the same trajectory (traj_uid) of another shard holds that member (group, slot,
 * attempt): a second writer of the same run uid samples it. */
arl_status replay_traj_begin(replay_writer *w, const replay_traj_desc *d, int64_t *traj_id);

/* One model turn or the session creation (step 0); a turns row (spec section 4.8). */
typedef struct replay_turn {
    int32_t step_index;                 /* 0 = session creation */
    int64_t act_tok_start, act_tok_end; /* [start, end) stream offsets; -1: NULL (step 0) */
    int32_t obs_seg_index;              /* -1: NULL (observation not in the stream) */
    int64_t obs_tok_start, obs_tok_end; /* -1: NULL */
    int64_t policy_version;             /* -1: NULL */
    const char *finish_reason;          /* NULL, "stop", "tool_calls", "length" */
    const char *parse_status;           /* NULL or an AEP parse status */
    int32_t n_tool_calls;
    const char *context;       /* NULL, "append", "reset" */
    double reward;             /* derived process reward; NAN: NULL */
    int terminated, truncated; /* 0/1 */
    const char *anchor;        /* may be NULL */
    int64_t call_seq;          /* env_calls row of the create/step call */
    int64_t started_at_ms, finished_at_ms;
    const char *action_json; /* the AEP action as sent; NULL for step 0 */
} replay_turn;

/* One environment call (spec section 4.8 env_calls).  The store computes response_sha256 of a
 * complete body and elides its images (section 4.10) before storing it. */
typedef struct replay_env_call {
    int64_t call_seq;       /* 0, 1, 2, ... in issue order */
    const char *endpoint;   /* create, step, score_segment, score_episode, fork, delete, get */
    const char *session_id; /* may be NULL */
    int64_t step_index;     /* -1: NULL */
    int64_t segment_index;  /* -1: NULL */
    int32_t http_status;    /* -1: NULL (no response) */
    const char *error_code; /* may be NULL */
    int32_t attempts;       /* >= 1 */
    const char *attempt_log_json; /* may be NULL */
    int64_t started_at_ms, latency_ms;
    int response_complete;  /* 1: response is the whole body */
    int64_t response_len;   /* total bytes received; -1: response_nbytes, or NULL if no body */
    const uint8_t *request; /* exact bytes sent (NULL: NULL) */
    size_t request_nbytes;
    const uint8_t *response; /* exact bytes received (the first 64 KiB if incomplete; NULL: none) */
    size_t response_nbytes;
} replay_env_call;

typedef struct replay_tool_call {
    int32_t step_index, call_index;
    const char *call_id; /* "call_<step>_<n>" */
    const char *name;    /* NULL for missing_name */
    const char *parse_status;
    int32_t result_is_error; /* -1: NULL (unanswered) */
    const char *result_error_code;
    int64_t result_bytes;       /* -1: NULL */
    int32_t result_truncated;   /* -1: NULL */
    const char *arguments_json; /* parsed arguments (status ok only) */
} replay_tool_call;

typedef struct replay_reward {
    const char *level;     /* "process", "segment", "outcome" */
    int64_t scope_index;   /* step_index | seg_index | 0 */
    const char *component; /* "" = scalar reward as sent; "@derived" = value trained on */
    const char *source;    /* NULL: "env"; "client"; "rescore:<label>" */
    double value;          /* NAN: NULL (unscorable) */
    int64_t call_seq;      /* -1: NULL */
} replay_reward;

/* A closed segment and everything committed with it (transaction C_s, spec section 7.1).
 * All arrays are borrowed for the duration of the call. */
typedef struct replay_segment_desc {
    int32_t seg_index;      /* 0-based; consecutive (forks start at fork_seg_index + 1) */
    const char *start_kind; /* "fresh", "continue", "fork" */
    const char *end_cause;  /* "token_budget", "env_reset", "template_break", "end", "partial" */
    int32_t first_step, last_step;
    int64_t tok_start;          /* offset in the trajectory's token stream */
    int64_t ctx_start;          /* model position of the first token (0 if fresh) */
    int64_t n_tokens;           /* T > 0 */
    const uint32_t *tokens;     /* (T) token ids */
    const float *logprobs;      /* (T) behaviour log-prob; exactly 0.0 for context tokens */
    const uint8_t *loss_mask;   /* (T) 1 = action token */
    const uint32_t *versions;   /* (T) policy-version tags */
    int32_t n_moe_layers;       /* L_moe; 0: no routes */
    int32_t route_k;            /* k */
    arl_blob_dtype route_dtype; /* ARL_BLOB_U8 (E <= 255) or ARL_BLOB_U16 */
    const void *routes;         /* (L_moe, T, k) expert ids of route_dtype, layer-major */
    const char *routes_layout;  /* e.g. "moe_layers=7;k=4;experts=16;dtype=u8"; NULL if none */
    int64_t end_state_id;       /* states row from replay_state_put; -1: none */
    int64_t latent_state_id;    /* -1: none */
    const char *session_id;     /* new AEP session id, or NULL to keep */
    const replay_turn *turns;
    size_t n_turns;
    const replay_env_call *env_calls;
    size_t n_env_calls;
    const replay_tool_call *tool_calls;
    size_t n_tool_calls;
    const replay_reward *rewards;
    size_t n_rewards; /* process rows of its steps, segment rows */
} replay_segment_desc;

/* C_s: append segment s of a running trajectory in one transaction (segments row with its
 * four blobs, routes one row per MoE layer, turns, env_calls with images elided, tool_calls,
 * rewards, counters, a segment_committed event).  Checks the chain (seg_index, tok_start,
 * ctx_start, first_step against the previous segment) and array lengths.  When it returns
 * ARL_OK the segment is durable (synchronous=FULL); on failure nothing of it is stored. */
arl_status replay_segment_append(replay_writer *w, int64_t traj_id, const replay_segment_desc *s);

typedef struct replay_finish {
    replay_status status;          /* COMPLETE, TRUNCATED or MASKED */
    const char *end_cause;         /* trajectories.end_cause (required) */
    const char *error_code;        /* MASKED only (required there) */
    const char *error_attribution; /* MASKED: client, env, infra, none */
    const char *error_detail_json; /* may be NULL */
    double outcome_reward;         /* derived R_i copied for filtering; NAN: NULL */
    const replay_env_call *env_calls;
    size_t n_env_calls; /* episode score / failing call */
    const replay_reward *rewards;
    size_t n_rewards; /* outcome rows */
} replay_finish;

/* C_end / C_mask: commit the last segment (may be NULL: none, e.g. a fault at creation) and
 * the final status in one transaction, then mirror the status into the catalog.  COMPLETE and
 * TRUNCATED need the last segment's end_cause 'end' and an outcome '@derived' reward. */
arl_status replay_traj_finish(replay_writer *w, int64_t traj_id, const replay_segment_desc *last,
                              const replay_finish *f);

/* Mask a trajectory outside C_mask: an interrupted one (running -> masked), or a final one by
 * an operator or verify --repair (complete/truncated -> masked, spec section 8.2).  end_cause
 * is used for a running trajectory (NULL: "error"). */
arl_status replay_traj_mask(replay_writer *w, int64_t traj_id, const char *error_code,
                            const char *attribution, const char *end_cause,
                            const char *detail_json);

/* Record a successful resume (spec section 7.5 step 6): session_id, resume_count + 1 and a
 * 'resumed' event (detail_json may be NULL) in one transaction. */
arl_status replay_traj_resume(replay_writer *w, int64_t traj_id, const char *session_id,
                              const char *detail_json);

/* Append an event to trajectory_events (kind free-form, e.g. "pinned"). */
arl_status replay_traj_event(replay_writer *w, int64_t traj_id, const char *kind,
                             const char *detail_json);

/* ---- cached states (spec sections 4.12, 7.3, 9) ------------------------------------------ */

typedef struct replay_state_desc {
    const char *traj_uid; /* required */
    int32_t seg_index;
    const char *kind;     /* "kda_boundary" or "mla_segment" */
    const char *producer; /* "rollout", "learner", "tool" (NULL: rollout for worker files,
                             learner for learner files, tool for tool files) */
    const char *pass_uid; /* one consistent forward pass */
    int64_t version_min, version_max;
    const char *numerics;            /* kernel and precision tag, e.g. "cpu-f32" */
    const char *routing;             /* "replay" or "natural" (NULL: "replay") */
    const char *model_config_sha256; /* 64 hex */
    int64_t ctx_start, n_tokens;
} replay_state_desc;

/* One chunk: either an encoded blob (blob != NULL; checked, stored as is) or a raw tensor the
 * store encodes (blob == NULL: kind, dtype, ndim, dims, data). */
typedef struct replay_state_chunk {
    int32_t layer;      /* model layer, 0-based */
    const char *tensor; /* "S" (KDA_STATE), "conv" (CONV_TAIL), "latent" (MLA_LATENT) */
    int64_t row_start;  /* latent chunks: first token row; else 0 */
    const void *blob;   /* encoded blob (spec section 5), or NULL */
    size_t blob_nbytes;
    arl_blob_kind kind;   /* raw form: */
    arl_blob_dtype dtype; /*   f32 (S, conv), bf16 or f32 (latent) */
    int ndim;
    uint64_t dims[ARL_BLOB_MAX_DIMS];
    const void *data; /*   the tensor, row-major, little-endian */
} replay_state_chunk;

/* S_s: write one state with its chunks to this writer's states file in one transaction
 * (synchronous=NORMAL: a power loss may lose it, which is a cache miss).  Commit it BEFORE the
 * segment that refers to it (spec section 7.3); *state_id goes into end_state_id or
 * latent_state_id of replay_segment_desc.  Idempotent: if this (traj_uid, seg_index, kind,
 * producer, pass_uid) is already stored complete (a retry after C_s failed), its id is returned
 * and nothing is written. */
arl_status replay_state_put(replay_writer *w, const replay_state_desc *d,
                            const replay_state_chunk *chunks, size_t n_chunks, int64_t *state_id);

/* Garbage collection of this writer's states file (spec section 7.6): 'writing' states and
 * unreferenced 'complete' states older than min_age_ms; then incremental_vacuum.  *n_deleted
 * may be NULL.  Worker and tool writers: referenced by a segment's end_state_id or
 * latent_state_id; learner writers: by a learner record of the same trajectory and segment, or
 * by the consumption of the trajectory's group (catalog; learner.records false writes no
 * records, and state_cache.learner decides what consumed trajectories keep). */
arl_status replay_states_gc(replay_writer *w, int64_t min_age_ms, int64_t *n_deleted);

/* Retention of cached states (spec section 9.3; replay/gc.c). */
typedef struct replay_retention {
    const char *rollout;  /* state_cache.rollout: "last" (NULL), "all" or "off" */
    const char *learner;  /* state_cache.learner: "off" (NULL), "pinned" or "all" */
    int64_t budget_bytes; /* state_cache.budget_bytes; <= 0: no budget */
    int64_t min_age_ms;   /* garbage older than this is deleted (section 7.6); < 0: 1 hour */
} replay_retention;

typedef struct replay_gc_stats {
    int64_t deleted;     /* 'writing' and unreferenced states deleted (rows and chunks) */
    int64_t evicted;     /* states evicted by retention or the budget (tombstones kept) */
    int64_t bytes_freed; /* n_bytes of the evicted states */
    /* replay_gc only (0 from replay_states_retain): */
    int64_t files;   /* files whose states were collected */
    int64_t skipped; /* files skipped: their writer is alive (it collects its own states) */
    int64_t missing; /* shards registered in the catalog whose file is missing */
} replay_gc_stats;

/* GC and retention of this writer's states file (spec sections 7.6 and 9.3): deletes garbage
 * (replay_states_gc), then evicts rollout states by r->rollout ('last': per running trajectory
 * only the newest committed boundary, its kda_boundary and the mla_segment states since the
 * last fresh or fork start; final trajectories none; 'off': none; 'all': all), then, while the
 * complete states exceed r->budget_bytes, the least recently used (running trajectories last).
 * A learner writer's file holds learner states: r->learner 'off' and 'pinned' evict those of
 * trajectories whose group is consumed, 'all' keeps them.  Pinned trajectories keep every
 * state.  r may be NULL (last, off, no budget, 1 hour); out may be NULL. */
arl_status replay_states_retain(replay_writer *w, const replay_retention *r, replay_gc_stats *out);

/* A use of states of this writer's own states file (spec section 9.3: a reader that uses a
 * state updates last_used_at_ms, the order in which the budget evicts): last_used_at_ms of each
 * complete state in state_ids becomes now, in one transaction.  Only the file's writer calls it
 * (a tool never writes files it does not own, section 13): the ids must be of this writer's
 * states file (replay_state_data.shard_id == replay_writer_shard_id); others, and evicted or
 * missing ones, are left alone.  For loads, not per token: one UPDATE per state. */
arl_status replay_states_touch(replay_writer *w, const int64_t *state_ids, size_t n);

/* ---- reading (the learner's protocol, spec section 11) ---------------------------------- */

/* A trajectory row (trajectories table) with its shard. */
typedef struct replay_traj_row {
    int64_t traj_id;
    int32_t shard_id;
    char traj_uid[REPLAY_UID_MAX + 1];
    int64_t run_id, group_id, task_id, env_id;
    int32_t slot, attempt;
    char session_id[REPLAY_UID_MAX + 1];
    replay_status status;
    char end_cause[24];
    char error_code[64];
    char error_attribution[8];
    char parent_traj_uid[REPLAY_UID_MAX + 1]; /* "" if none */
    int32_t fork_seg_index;                   /* -1 if none */
    int32_t resume_count, n_segments, n_turns;
    int64_t n_tokens, n_action_tokens;
    int64_t min_version, max_version;                     /* -1 if no segment */
    double outcome_reward;                                /* NAN if NULL */
    int64_t created_at_ms, updated_at_ms, finished_at_ms; /* finished: -1 if NULL */
} replay_traj_row;

/* Find a trajectory by traj_uid or decimal traj_id in any shard. ARL_ERR_NOT_FOUND if none. */
arl_status replay_traj_get(replay_store *st, const char *selector, replay_traj_row *out);
arl_status replay_traj_get_id(replay_store *st, int64_t traj_id, replay_traj_row *out);

/* A segment's metadata. */
typedef struct replay_seg_ref {
    int64_t traj_id;
    int32_t seg_index;
    int32_t shard_id;
    char traj_uid[REPLAY_UID_MAX + 1];
    replay_status traj_status;
    int64_t run_id, group_id;
    int32_t slot;
    char start_kind[12];
    char end_cause[16];
    int32_t first_step, last_step;
    int64_t tok_start, ctx_start, n_tokens, n_action_tokens;
    int64_t min_version, max_version;
    int64_t end_state_id, latent_state_id; /* -1 if NULL */
    int64_t committed_at_ms;
} replay_seg_ref;

typedef struct replay_seg_filter {
    int64_t run_id;       /* <= 0: any run */
    int64_t group_id;     /* <= 0: any group */
    unsigned status_mask; /* REPLAY_STATUS_BIT()s of the trajectory; 0: REPLAY_STATUS_TRAINABLE */
    int64_t version_lo;   /* segments with min_version >= version_lo (-1: unbounded) */
    int64_t version_hi;   /* ... and min_version <= version_hi (-1: unbounded) */
} replay_seg_filter;

/* Iterate the committed segments that match, shard by shard, in (traj_id, seg_index) order.
 * Reads in batches with short read transactions; never returns 'running' trajectories unless
 * the mask asks for them. */
arl_status replay_seg_iter_open(replay_store *st, const replay_seg_filter *f,
                                replay_seg_iter **out);
/* Next segment into *ref; *done = 1 (and ARL_OK) when there is none left. */
arl_status replay_seg_iter_next(replay_seg_iter *it, replay_seg_ref *ref, int *done);
void replay_seg_iter_close(replay_seg_iter *it); /* NULL: no-op */

/* A segment's metadata and (as asked) its per-token arrays and routes, checked against their
 * headers and CRCs.  Buffers are owned by the struct and reused across loads (grown as
 * needed): zero-initialise once, free with replay_seg_data_free. */
typedef struct replay_seg_data {
    replay_seg_ref ref;
    uint32_t *tokens;     /* (T) */
    float *logprobs;      /* (T) */
    uint8_t *loss_mask;   /* (T) */
    uint32_t *versions;   /* (T) */
    int32_t n_moe_layers; /* L_moe (0 if none or not loaded) */
    int32_t route_k;      /* k */
    uint8_t route_dtype;  /* ARL_BLOB_U8 / ARL_BLOB_U16 */
    void *routes;         /* (L_moe, T, k) of route_dtype */
    char routes_layout[160];
    size_t cap_tok_, cap_routes_; /* private */
} replay_seg_data;

enum { REPLAY_LOAD_TOKENS = 1u << 0, REPLAY_LOAD_ROUTES = 1u << 1 };

/* Load segment (traj_id, seg_index).  A blob that fails its checks is ARL_ERR_CORRUPT naming
 * the file, trajectory, segment and column (mask the trajectory STORE_CORRUPT). */
arl_status replay_segment_load(replay_store *st, int64_t traj_id, int32_t seg_index, unsigned what,
                               replay_seg_data *out);
void replay_seg_data_free(replay_seg_data *d); /* frees the arrays, not the struct */

/* The segments a trajectory's token stream consists of, in order, resolved through fork
 * parents (a fork's prefix is its parent's segments 0..fork_seg_index).  *refs is allocated
 * (caller frees with free()); *n receives the count. */
arl_status replay_traj_segments(replay_store *st, int64_t traj_id, replay_seg_ref **refs,
                                size_t *n);

/* A stored state and its chunks. Zero-initialise; free with replay_state_data_free. */
typedef struct replay_state_chunk_data {
    int32_t layer;
    char tensor[8];
    int64_t row_start;
    arl_blob_header h; /* dtype, shape; codec 0 and payload_nbytes of the tensor in memory */
    const void *data;  /* payload (CRC checked), inside the struct's buffer */
} replay_state_chunk_data;

typedef struct replay_state_data {
    int64_t state_id;
    int32_t shard_id; /* the shard whose states file holds it */
    char traj_uid[REPLAY_UID_MAX + 1];
    int32_t seg_index;
    char kind[16], producer[12], routing[12], status[12];
    char pass_uid[REPLAY_UID_MAX + 1];
    char numerics[64];
    char model_config_sha256[65];
    int64_t version_min, version_max, ctx_start, n_tokens, n_bytes;
    size_t n_chunks;
    replay_state_chunk_data *chunks; /* (n_chunks) ordered by layer, tensor, row_start */
    uint8_t *buf_;                   /* private */
    size_t cap_buf_, cap_chunks_;    /* private */
} replay_state_data;

/* Load state_id from the states file of shard_id.  A state that is missing, 'writing' or
 * 'evicted' is ARL_ERR_NOT_FOUND (a cache miss: recompute from the tokens); a bad chunk is
 * ARL_ERR_CORRUPT. */
arl_status replay_state_load(replay_store *st, int32_t shard_id, int64_t state_id,
                             replay_state_data *out);
void replay_state_data_free(replay_state_data *d);

/* Find the complete state (traj_uid, seg_index, kind, producer, pass_uid) in the states file of
 * any shard (the spec's unique key; tool and learner states are found this way, rollout states
 * through their segments) and load it into *out.  ARL_ERR_NOT_FOUND: no such complete state (a
 * cache miss). */
arl_status replay_state_find(replay_store *st, const char *traj_uid, int32_t seg_index,
                             const char *kind, const char *producer, const char *pass_uid,
                             replay_state_data *out);

/* The full model state at the end of segment s of a trajectory (spec section 4.12): the
 * kda_boundary state of s plus the mla_segment states of every segment from the last fresh
 * start to s, all of one pass_uid, resolved through fork parents.  Uses the states referenced
 * by the segments (rollout states).  *parts is allocated (n_parts entries: the boundary
 * first, then the MLA parts in segment order); free with replay_boundary_free.
 * ARL_ERR_NOT_FOUND for any cache miss (recompute by prefill, spec section 9.2). */
arl_status replay_boundary_load(replay_store *st, int64_t traj_id, int32_t seg_index,
                                replay_state_data **parts, size_t *n_parts);
void replay_boundary_free(replay_state_data *parts, size_t n_parts);

/* ---- forks at the store level (spec section 13.7 step 3) ---------------------------------- */

/* Begin a fork of parent_traj_uid keeping its first n_prefix (S >= 1) segments: a trajectory
 * in this writer's file with parent_traj_uid and fork_seg_index = S - 1 whose first own segment
 * has seg_index S, start_kind 'fork', tok_start/ctx_start at the end of the parent's segment
 * S - 1 and first_step = its last_step + 1 (returned in *next, may be NULL).  The prefix is not
 * copied: readers resolve it through the parent (replay_traj_segments, replay_boundary_load).
 * d->parent_traj_uid and d->fork_seg_index are ignored (set from the arguments). */
arl_status replay_fork_begin(replay_writer *w, const char *parent_traj_uid, int32_t n_prefix,
                             const replay_traj_desc *d, int64_t *traj_id, replay_seg_ref *next);

/* ---- consumption ledger (spec section 7.7; replay/ledger.c) ----------------------------- */

/* Plan update update_n of run_id in one catalog transaction: the oldest 'final' groups of the
 * run of this kind (NULL: "train"; ordered by admitted_at_ms, then group_id: deterministic), at
 * most max_groups, recorded as updates(status 'planned') and update_groups.  If update_n is already
 * planned (a restart before its commit), its recorded groups are returned and nothing is written;
 * an aborted update_n is planned afresh.  ARL_ERR_STATE if update_n is committed or another update
 * of the run is still planned.  *group_ids (ascending group_id; caller frees with free()) and *n
 * receive the groups; *n may be 0 (nothing final). */
arl_status replay_update_plan(replay_store *st, int64_t run_id, int64_t update_n, const char *kind,
                              int32_t max_groups, int64_t **group_ids, size_t *n);

/* Commit planned update update_n in one transaction: updates.status 'committed' (with
 * n_action_tokens, -1: NULL), every group of the update 'consumed' with consumed_update =
 * update_n (guarded: if any of them is not 'final' and unconsumed, nothing is committed and
 * ARL_ERR_STATE names the counts), and the policy_versions row of version update_n + 1
 * (next may be NULL; its run_id, version and update_n fields are ignored).  Committing a
 * committed update changes nothing and returns ARL_OK (a resumed run re-doing it). */
arl_status replay_update_commit(replay_store *st, int64_t run_id, int64_t update_n,
                                int64_t n_action_tokens, const replay_version_desc *next);

/* Abort planned update update_n ('aborted'; its groups stay final and are planned again). */
arl_status replay_update_abort(replay_store *st, int64_t run_id, int64_t update_n);

/* The planned, uncommitted update of run_id after a restart (-1 if none). */
arl_status replay_update_pending(replay_store *st, int64_t run_id, int64_t *update_n);

/* The groups of update update_n (any status), ascending; *group_ids: caller frees. */
arl_status replay_update_groups(replay_store *st, int64_t run_id, int64_t update_n,
                                int64_t **group_ids, size_t *n);

/* ---- pins and run configuration (catalog; replay/pins.c) -------------------------------- */

/* Pin a trajectory (traj_uid or traj_id; it must exist in a shard): a catalog pins row, whose
 * reason is replaced if already pinned.  Pinned trajectories keep their states under every
 * retention rule (spec sections 9.3, 13.8). reason: NULL means ""; else one line of UTF-8 text
 * without control characters, at most REPLAY_PIN_REASON_MAX bytes (ARL_ERR_ARG otherwise). */
#define REPLAY_PIN_REASON_MAX 1000
arl_status replay_pin(replay_store *st, const char *traj, const char *reason);
/* Remove the pin; ARL_ERR_NOT_FOUND if the trajectory is not pinned. */
arl_status replay_unpin(replay_store *st, const char *traj);
/* *pinned = 1 if traj_uid is pinned; reason (may be NULL, cap bytes) receives its reason. */
arl_status replay_pin_get(replay_store *st, const char *traj_uid, int *pinned, char *reason,
                          size_t cap);

/* A runs row (spec section 4.2).  The JSON texts are malloc'ed: free with replay_run_info_free. */
typedef struct replay_run_info {
    int64_t run_id;
    char run_uid[REPLAY_UID_MAX + 1];
    char status[12];
    int64_t created_at_ms;
    char *config_json;       /* the run's resolved configuration (owned) */
    char *model_config_json; /* (owned) */
    char config_sha256[65], model_config_sha256[65], tokenizer_sha256[65];
    char chat_template_sha256[65];
    char code_version[64];
    char *notes; /* NULL if none (owned) */
} replay_run_info;
/* The run run_uid (or its decimal run_id); ARL_ERR_NOT_FOUND if absent. */
arl_status replay_run_get(replay_store *st, const char *run, replay_run_info *out);
void replay_run_info_free(replay_run_info *r); /* frees the strings; NULL: no-op */

/* ---- learner records and re-scores (spec section 4.13; replay/records.c) ---------------- */

/* One learner_records row: what update n computed for a consumed segment (n_tokens T). */
typedef struct replay_learner_record {
    int64_t run_id, update_n;
    const char *traj_uid; /* required */
    int32_t seg_index;
    int64_t version;   /* pi_old version (= update_n) */
    int64_t staleness; /* sigma_{i,s}(n) */
    double seg_mean_logratio;
    const char *mask_reason;    /* NULL (trained), "geo", "stale" or "routes" */
    const char *levels_json;    /* required, e.g. {"AO":1.0,...} */
    const char *metrics_json;   /* may be NULL */
    int64_t n_tokens;           /* T > 0 */
    const float *old_logprobs;  /* (T) */
    const float *ref_logprobs;  /* (T) */
    const float *is_weights;    /* (T) */
    const uint8_t *token_flags; /* (T) bits of spec section 4.13 */
    const float *advantages;    /* (T) */
} replay_learner_record;

/* Write (or replace: a re-run update replaces the interrupted attempt's row, same primary key)
 * one learner record in the writer's file, which must be a LEARNER or TOOL file (open it with
 * replay_writer_open(st, REPLAY_FILE_LEARNER, ...)).  One transaction; arrays borrowed. */
arl_status replay_learner_record_put(replay_writer *w, const replay_learner_record *r);

/* One rescores row (spec section 4.13): a segment re-scored under a checkpoint. */
typedef struct replay_rescore_desc {
    const char *label;    /* required: the re-score job's name */
    const char *traj_uid; /* required */
    int32_t seg_index;
    const char *run_uid;        /* may be NULL */
    int64_t version;            /* -1: NULL (then checkpoint_uri names the weights) */
    const char *checkpoint_uri; /* may be NULL */
    const char *routing;        /* "replay" or "natural" (NULL: "replay") */
    const char *stats_json;     /* required: mean/p99/max |l - l_mu|, ... */
    int64_t n_tokens;           /* T > 0 */
    const float *logprobs;      /* (T) re-scored log-probabilities */
} replay_rescore_desc;

/* Write (or replace, same label, traj_uid, seg_index and routing) one rescores row in the
 * writer's file, which must be a TOOL file.  One transaction (or a part of the writer's
 * re-score transaction, replay_rescore_tx_begin); arrays borrowed. */
arl_status replay_rescore_put(replay_writer *w, const replay_rescore_desc *r);

/* One transaction for the rows of one re-scored trajectory (spec section 13.6): the
 * replay_rescore_put and replay_rescore_rewards_put calls between replay_rescore_tx_begin and
 * replay_rescore_tx_end write into it instead of each committing their own, so that a crash
 * (SIGKILL) leaves all of them or none.  replay_rescore_tx_end commits when s is ARL_OK
 * (returning the commit's status) and otherwise rolls back and returns s; a put that failed
 * has rolled the transaction back already, and the puts after it fail.  TOOL writers; no
 * nesting; foreign keys are off meanwhile (the rewards rows name trajectories of other
 * files). */
arl_status replay_rescore_tx_begin(replay_writer *w);
arl_status replay_rescore_tx_end(replay_writer *w, arl_status s);

/* ---- rewards rows by trajectory (spec section 4.9; replay/rewards.c) ---------------------- */

/* One rewards row as read back. */
typedef struct replay_reward_row {
    char level[12];        /* "process", "segment", "outcome" */
    int64_t scope_index;   /* step_index | seg_index | 0 */
    char component[72];    /* "" = scalar reward as sent; "@derived"; a component name */
    char source[300];      /* "env", "client", "rescore:<label>" */
    double value;          /* NAN: NULL (unscorable) */
    int64_t call_seq;      /* -1: NULL */
} replay_reward_row;

/* The rewards rows of trajectory traj_id, ordered by (level, scope_index, component, source).
 * source NULL: every row in the trajectory's own file (what its rollout wrote); else the rows
 * with that source ('rescore:<label>') in the store's tool files.  *rows is malloc'ed (free
 * with replay_reward_rows_free; NULL when *n is 0). */
arl_status replay_rewards_load(replay_store *st, int64_t traj_id, const char *source,
                               replay_reward_row **rows, size_t *n);
void replay_reward_rows_free(replay_reward_row *rows); /* NULL: no-op */

/* Replace the re-scored rewards rows of trajectory traj_id (a trajectory of any file of the
 * store) with source `source` ('rescore:<label>', spec section 13.6 --rewards) in the writer's
 * file, which must be a TOOL file: the old rows of that source are deleted and rows[0..n)
 * inserted (their .source must be NULL or equal to source) in one transaction (or a part of
 * the writer's re-score transaction, replay_rescore_tx_begin).  The rows keep
 * the global traj_id; the trajectory's row stays in its own file.  Arrays borrowed. */
arl_status replay_rescore_rewards_put(replay_writer *w, int64_t traj_id, const char *source,
                                      const replay_reward *rows, size_t n);

#endif
