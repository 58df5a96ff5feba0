/* replay/inspect.h: the inspection operations of spec/replay.md section 13 over a store (all
 * shards read as one): list, show, export/import (JSON Lines, section 14), stats, verify and
 * recover.  The CLI (cli/cmd_replay.c) only parses options and calls these.  Output goes to
 * the FILE given; errors are returned as arl_status with the thread's message.
 * Not here: rescore and fork with generation (they need the policy model; the store-level parts
 * are replay_traj_segments, replay_boundary_load and replay_fork_begin in replay/replay.h). */
#ifndef ARL_REPLAY_INSPECT_H
#define ARL_REPLAY_INSPECT_H

#include <stdint.h>
#include <stdio.h>

#include "replay/replay.h"

/* A trajectory selection (section 13.1).  Zero-initialise with replay_filter_init. */
typedef struct replay_filter {
    const char *run;    /* run_uid */
    const char *status; /* running | complete | truncated | masked */
    const char *env;    /* environment name */
    const char *group;  /* group_uid */
    const char *task;   /* task_uid */
    const char *error_code;
    const char *end_cause;
    int64_t min_tokens, max_tokens, min_turns; /* -1: no bound */
    double min_reward;                         /* derived outcome >= x; NAN: no bound */
    int64_t version_lo, version_hi;            /* all versions within [lo, hi]; -1: no bound */
    int64_t since_ms, until_ms;                /* finished (or last updated) within; -1: no bound */
    int parse_failures;       /* 1: only trajectories with a failed tool-call parse */
    const char *tool;         /* only trajectories that called this tool */
    const char *tool_error;   /* ... whose result had this error code */
    const char *const *where; /* LEVEL.NAME OP NUMBER expressions, ANDed */
    size_t n_where;
    const char *forks_of; /* parent traj_uid */
    int64_t limit;        /* <= 0: no limit */
    int64_t offset;       /* list only: skip the first offset trajectories of the order (paging;
                             <= 0: none) */
    int pinned;           /* 1: only trajectories pinned in the catalog */
    const char *sort;     /* list order: NULL or "time" (finished, newest first), "reward"
                             (outcome, highest first, none last), "tokens", "turns" (most
                             first), "uid" (ascending) */
} replay_filter;

void replay_filter_init(replay_filter *f);

/* One line per trajectory, newest first (or JSON lines with json = 1). */
arl_status replay_list(replay_store *st, const replay_filter *f, int json, FILE *out);

typedef struct replay_show_opts {
    int tokens; /* per-token table: position, token, mask, version, logprob, the learner columns
                   of the newest update that consumed the segment (old, ref, w, flags,
                   advantage), routes */
    int raw;    /* exact request and response bytes of every call */
    int32_t turn_lo, turn_hi; /* --turns a:b: token rows of steps a..b only (0, 0: all) */
    const char *rescore;      /* --rescore LABEL: add the re-scored log-prob and its difference */
    int group;                /* --group: the group's members side by side */
    /* --tokens: writes the text of token id as the table shows it (NUL-terminated, at most cap
     * bytes) into buf; NULL: no text column (replay/ does not know the tokenizer) */
    void (*token_text)(uint32_t id, char *buf, size_t cap);
} replay_show_opts;
/* Render one trajectory (traj_uid or traj_id) as a person reads it (section 13.2). */
arl_status replay_show(replay_store *st, const char *traj, const replay_show_opts *o, FILE *out);
/* Parse "A:B" (1-based steps A..B; either side may be empty; A <= B) into *lo, *hi (0: open).
 * ARL_ERR_ARG with a message naming s otherwise. */
arl_status replay_show_turns_parse(const char *s, int32_t *lo, int32_t *hi);

/* Counts, token totals, reward components per level, error codes, length distributions,
 * boundary causes, tool parse/error rates, env latencies, versions, storage (section 13.4). */
arl_status replay_stats(replay_store *st, const replay_filter *f, int json, FILE *out);

typedef struct replay_export_opts {
    int tokens;  /* per-segment base64 payloads of ids, logprobs, loss_mask, versions */
    int learner; /* learner records */
    int raw;     /* env_calls with base64 request and response bodies */
    int full;    /* all of the above plus "rows" (every row, for import) */
} replay_export_opts;
/* One agentrl.trajectory/1 JSON line per selected trajectory, shard by shard in traj_id order.
 * *n_out (may be NULL) receives the count.  A line that could not be built whole (out of memory)
 * is an error, never written short (jansson's failed allocations are counted per thread by
 * core/json_dump.h's watch). */
arl_status replay_export(replay_store *st, const replay_filter *f, const replay_export_opts *o,
                         FILE *out, int64_t *n_out);

/* Read --full lines from in (named in_name in messages) into a new tool file of the store,
 * creating missing catalog rows (a group that training consumed comes with its update, recorded
 * as committed: the ledger's invariant holds in the copy).  A line without "rows" is an error
 * naming the line; nothing of a failing line is stored (one transaction per line).  A line whose
 * trajectory the store holds already is skipped when the stored one exports as the same line
 * (so an import that stopped can be run again), else an error.  *n_out receives the lines
 * imported, *n_skipped (may be NULL) those skipped. */
arl_status replay_import(replay_store *st, FILE *in, const char *in_name, int64_t *n_out,
                         int64_t *n_skipped);

typedef struct replay_verify_opts {
    int full;   /* PRAGMA integrity_check instead of quick_check */
    int repair; /* then, through each file's writer (lock free; the store opened read-write):
                   mask the unmasked trajectories with errors STORE_CORRUPT and delete orphan
                   states (section 13.5); the counts of the checks are those found before */
} replay_verify_opts;
/* Check every file (section 13.5); print findings ("error: ..." / "warning: ...") and a
 * summary.  Returns ARL_OK when the checks ran (whatever they found); counts go to *n_errors
 * and *n_warnings.  With repair, also the repairs' lines; a failed repair is its status. */
arl_status replay_verify(replay_store *st, const replay_verify_opts *o, FILE *out,
                         int64_t *n_errors, int64_t *n_warnings);

/* Detect trajectories left running by dead writers (their lock is free) in every worker and
 * tool file, and resolve them (replay_writer_recover): print one line per trajectory.
 * *n_found receives the number of interrupted trajectories. */
arl_status replay_recover(replay_store *st, int mask, FILE *out, int64_t *n_found);

/* `gc` (section 13.8): replay_states_retain on every worker and tool file whose writer is gone
 * (its lock is free; files with a live writer are skipped and reported).  One line per file
 * to out (may be NULL); *total (may be NULL) receives the sums and the counts of files
 * collected, skipped and missing.  A file that fails is reported and the others are still
 * collected; the first error is returned, as for a shard registered in the catalog whose file
 * is missing while the catalog has trajectories in it (without any: reported only).  st must
 * be a store root with a writable catalog (ARL_ERR_STATE naming what it is instead; seal and
 * migrate too). */
arl_status replay_gc(replay_store *st, const replay_retention *r, FILE *out,
                     replay_gc_stats *total);

/* What seal and migrate did, the counts replay_gc_stats gives for gc. */
typedef struct replay_admin_stats {
    int64_t files;   /* files sealed (or migrated) */
    int64_t skipped; /* files skipped while in use: a live writer, or another process that has
                        a sealed file open while it is left in WAL mode (seal or migrate again) */
    int64_t missing; /* shards registered in the catalog whose file is missing */
} replay_admin_stats;

/* `seal` (sections 2.3 and 13.8): seal every worker, tool and learner file (or only shard
 * only_shard when > 0) whose writer is gone and that has no running trajectory; files with a
 * live writer are skipped and reported, already sealed ones reported.  One line per file to
 * out (may be NULL); *stats (may be NULL) receives the counts.  Sealed files are immutable:
 * writers refuse them (ARL_ERR_STATE). */
arl_status replay_seal(replay_store *st, int32_t only_shard, FILE *out, replay_admin_stats *stats);

/* `migrate` (sections 12 and 13.8): migrate every shard file (and states file) whose schema is
 * older than this build's: sealed files under their lock, keeping them sealed; the others by
 * opening their writer (files with a live writer are skipped: it migrates them itself).  The
 * catalog was migrated when st was opened read-write.  One line per file to out (may be NULL);
 * *stats (may be NULL) receives the counts.  A file that fails is reported and the others are
 * still migrated; the first error is returned (missing files: as replay_gc). */
arl_status replay_migrate(replay_store *st, FILE *out, replay_admin_stats *stats);

/* The backup size limit of spec section 12 rule 3: a file migrated (by any writer's open, or
 * replay_migrate) is first copied to '<file>.pre-v<new>' when it is at most this many bytes;
 * a larger one is migrated without a backup, with a warning.  0: no backups; < 0: every file.
 * One setting per process (the CLI's `replay migrate --backup-limit-bytes`), to be set before
 * the store is opened (its catalog migrates at open). */
#define REPLAY_BACKUP_LIMIT_DEFAULT ((int64_t)1 << 30)
void replay_backup_limit_set(int64_t bytes);

/* One warning line to err per shard registered in the catalog whose file is missing or cannot
 * be read, or is empty (no schema) while the catalog's group_members refer to trajectories in
 * it: what list and stats print before reading, since they skip such files. */
void replay_shards_warn_unreadable(replay_store *st, FILE *err);

/* Plan log (tests): when enabled (or env ARL_REPLAY_PLAN_LOG=1 at open), every query of the
 * inspection operations is recorded with its EXPLAIN QUERY PLAN lines ("QUERY <sql>" then
 * "  PLAN <detail>").  The text is owned by the store, valid until the next call or close. */
void replay_plan_log_enable(replay_store *st, int on);
const char *replay_plan_log(replay_store *st);
void replay_plan_log_clear(replay_store *st);

#endif
