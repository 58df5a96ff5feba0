/* learner/ledger.h: the learner's reads of the replay catalog - group counts, the groups and
 * members of a run, a group's environment - and the reads of worker shards that replay/replay.h does not offer (turns,
 * rewards, tool calls, environment calls of a trajectory: the inputs of the advantages and the
 * data metrics of spec/objective.md section 12).
 *
 * What this is: plain SQL over the store's files through the learner's own SQLite connections
 * (the catalog read-write with the connection settings of spec/replay.md section 3; worker
 * shards read-only, one short read transaction per query, section 11).  The table and column
 * names are those of spec/replay.md section 4.  These reads belong in replay/ once it offers
 * them; the learner is their only user today.
 * What this is not: segment and state blobs (replay_segment_load, replay_state_load), writing
 * trajectories, the advantages.
 *
 * The consumption ledger itself (spec/replay.md section 7.7: plan update n, commit it with
 * its policy version) is replay/replay.h's replay_update_plan / _commit / _pending / _groups;
 * the train driver (experiments/train.c) calls those directly.
 */
#ifndef ARL_LEARNER_LEDGER_H
#define ARL_LEARNER_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct arl_ledger arl_ledger;

/* Open the catalog of the store at root (root/catalog.sqlite must exist).  *out is freed with
 * arl_ledger_close.  ARL_ERR_NOT_FOUND without a catalog, ARL_ERR_DB on SQLite errors. */
arl_status arl_ledger_open(const char *root, arl_ledger **out);
void arl_ledger_close(arl_ledger *l); /* NULL: no-op */

/* Run id of run_uid; ARL_ERR_NOT_FOUND when the store has no such run. */
arl_status arl_ledger_run_id(arl_ledger *l, const char *run_uid, int64_t *run_id);

/* Counts of the run's groups of `kind` ("train", "eval") by status. */
typedef struct arl_ledger_counts {
    int64_t open, final, consumed, abandoned;
} arl_ledger_counts;
arl_status arl_ledger_group_counts(arl_ledger *l, int64_t run_id, const char *kind,
                                   arl_ledger_counts *c);

/* Every group of the run and kind in admission order: group_ids (cap), *n. */
arl_status arl_ledger_groups(arl_ledger *l, int64_t run_id, const char *kind, int64_t *group_ids,
                             int64_t cap, int64_t *n);

/* arl_ledger_groups into a new array sized to fit: *group_ids malloc'ed (caller frees; NULL
 * when *n is 0). */
arl_status arl_ledger_groups_alloc(arl_ledger *l, int64_t run_id, const char *kind,
                                   int64_t **group_ids, int64_t *n);

/* One member of a group: the latest attempt of a slot (spec/replay.md section 4.4). */
typedef struct arl_ledger_member {
    int32_t slot, attempt;
    int32_t shard_id;
    int64_t traj_id;
    char status[12]; /* running, complete, truncated, masked (the catalog's mirror) */
} arl_ledger_member;

/* The members of group_id ordered by slot: m (cap), *n.  ARL_ERR_RANGE if more than cap. */
arl_status arl_ledger_members(arl_ledger *l, int64_t group_id, arl_ledger_member *m, int32_t cap,
                              int32_t *n);

/* Size G, environment name and /info body of a group (name, info: caller's buffers; info_json
 * is malloc'ed, caller frees). */
arl_status arl_ledger_group_env(arl_ledger *l, int64_t group_id, int32_t *size, char *env_name,
                                size_t cap, char **info_json);

/* ---- worker-shard reads (read-only, one query each) ---- */

typedef struct arl_shard_reader arl_shard_reader;

/* Reader over the worker and tool shard files of the store at root (paths from the catalog's
 * shards table; files are opened on first use). */
arl_status arl_shard_reader_open(const char *root, arl_shard_reader **out);
void arl_shard_reader_close(arl_shard_reader *r); /* NULL: no-op */

/* One turns row (step_index >= 0; step 0 is the session creation). */
typedef struct arl_turn_row {
    int32_t step_index;
    int32_t seg_index;
    int64_t act_tok_start, act_tok_end; /* -1 for step 0 */
    double reward;                      /* derived process reward; NaN: NULL */
    char anchor[128];                   /* "" when NULL */
    int has_anchor;
    char parse_status[24]; /* "" when NULL */
} arl_turn_row;

/* The turns of traj_id ordered by step_index: *rows malloc'ed (caller frees), *n. */
arl_status arl_shard_turns(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                           arl_turn_row **rows, int32_t *n);

/* One rewards row of source 'env' (the values the environment sent, and the derived value). */
typedef struct arl_reward_row {
    char level[12];     /* process, segment, outcome */
    int64_t scope;      /* step index, segment index or 0 */
    char component[72]; /* "" scalar, "@derived", or a component name */
    double value;       /* NaN: NULL (unscorable) */
} arl_reward_row;

arl_status arl_shard_rewards(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                             arl_reward_row **rows, int32_t *n);

/* Data metrics of a set of trajectories of one shard, accumulated (add, never reset):
 * counts of turns per parse status, tool calls per result error code, environment call
 * latencies per endpoint (values appended), retries (attempts - 1). */
typedef struct arl_shard_stats {
    int64_t turns;
    int64_t parse_n[8]; /* by parse status, arl_shard_parse_names order */
    int64_t tool_calls;
    char tool_err_name[16][40]; /* distinct result error codes seen (first 16) */
    int64_t tool_err_n[16];
    int32_t n_tool_err;
    int64_t retries;
    double *lat[7]; /* latencies per endpoint (ms), malloc'ed, arl_shard_endpoint_names */
    int64_t n_lat[7], cap_lat[7];
} arl_shard_stats;

extern const char *const arl_shard_parse_names[8];
extern const char *const arl_shard_endpoint_names[7];

void arl_shard_stats_free(arl_shard_stats *s);
arl_status arl_shard_stats_add(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                               arl_shard_stats *s);

#endif
