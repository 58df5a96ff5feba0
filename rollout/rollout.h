/* rollout/rollout.h: rollout workers - multi-turn tool-calling generation with the MoE policy
 * (spec/objective.md section 3, spec/aep.md, spec/replay.md section 7).
 *
 * A worker takes tasks from the experiment's task source in groups of G samples per task (same
 * task id, seed and data, hence the same initial state), opens one environment session per
 * trajectory (built-in in-process or AEP/1 over HTTP, envs/env.h), renders prompts with the
 * chat/tool template (policy/chat.h) and decodes all running trajectories in one batch
 * (continuous batching over the slots of one decode state: sequences join and leave between
 * steps).  Every sampled token keeps its behaviour log-probability (under the distribution it
 * was drawn from: temperature and top-p) and the policy version that drew it; every token the
 * model reads keeps its MoE routes.  A turn stops at <|end_of_msg|> or at the per-turn cap; the
 * tool calls are parsed into their AEP statuses and every action, well formed or not, is sent
 * to the environment; observations are appended by chunked prefill (images through the vision
 * front end).  Segment boundaries follow spec/objective.md section 3.2 exactly; at each
 * boundary the decode state is exported into the replay store's states file and the segment
 * is committed in one transaction (spec/replay.md section 7.1), so a trajectory is durable as
 * it grows.  Budgets (per-turn tokens, trajectory tokens, context, turns, wall clock) end or
 * truncate trajectories with their cause recorded; environment faults mask the trajectory with
 * their code (spec/aep.md section 8); a worker restarted on its shard resumes its interrupted
 * trajectories from their last committed segment or masks them (spec/replay.md section 7.5).
 *
 * What this is not: the learner (it never reads log-probabilities back), advantages
 * (reward/), the store's format (replay/), the model's math (policy/).
 *
 * The experiment keys of a rollout are declared ONCE, in arl_rollout_options below; the CLI
 * (`agentrl rollout`) and the learner's experiment file use that same table.  In an
 * experiment file the keys sit either at the top level or inside an object "rollout".
 * env-config, env-options and task-data are JSON objects (written as objects in a file, or as
 * JSON text on the command line).
 *
 * Symbols: G group size, L_seg segment budget, L_turn per-turn cap, L_obs observation cap,
 * L_ctx context limit, L_traj trajectory budget, K_max turn budget (spec/objective.md 3.2).
 */
#ifndef ARL_ROLLOUT_ROLLOUT_H
#define ARL_ROLLOUT_ROLLOUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/options.h"
#include "core/status.h"
#include "replay/replay.h"

/* The experiment's rollout keys (one arl_option table, arl_rollout_options). */
typedef struct arl_rollout_config {
    /* environment */
    char *env;         /* "builtin:NAME", "NAME" (a built-in) or an AEP/1 base URL */
    char *env_config;  /* JSON object text: the built-in environment's instance config */
    char *env_options; /* JSON object text: AEP create `options` (NULL: absent) */
    int64_t step_deadline_ms; /* 0: the environment's default_step_timeout_ms */
    int64_t env_backoff_ms;   /* base of the retry back-off (spec/aep.md 10.3: 250) */
    /* tasks */
    char *task_file;   /* JSONL of {"id", "seed", "data"}; NULL: generated tasks */
    char *task_data;   /* JSON object text: task.data of generated tasks */
    int64_t tasks;     /* number of tasks (groups) */
    int64_t task_seed; /* seed of generated task i is task_seed + task_offset + i */
    int64_t task_offset; /* global index of this worker's first task (group uids, streams) */
    int64_t group_size; /* G */
    char *group_kind;   /* "train" or "eval" */
    char *run_uid;
    /* sampling */
    double temperature;
    double top_p;
    int64_t seed; /* sampling seed; each trajectory draws from stream hash(traj_uid), and
                     traj_uid holds the task's global index (task_offset + i) */
    /* budgets (spec/objective.md 3.2) */
    int64_t segment_tokens;    /* L_seg */
    int64_t turn_tokens;       /* L_turn */
    int64_t observation_tokens; /* L_obs */
    int64_t context_tokens;    /* L_ctx */
    int64_t trajectory_tokens; /* L_traj */
    int64_t max_turns;         /* K_max */
    double wall_clock_s;       /* episode wall clock; 0: off */
    int wall_clock_truncates;  /* 1: wall_clock ends as truncated instead of masked */
    int extension_check;
    int segment_scores;        /* request segment scores when the env declares them */
    char *unscorable_outcome;  /* "range_lo" or "mask" */
    /* engine */
    int64_t batch_size;   /* concurrent trajectories (decode-state slots) */
    int64_t prefill_chunk; /* most tokens in one forward */
    int64_t mla_sparse_topk;  /* block-sparse MLA: chunks kept (0: dense) */
    int64_t mla_sparse_chunk; /* block-sparse MLA: chunk length */
    int64_t threads;          /* CPU threads (0: the kernels' default) */
    int reserve_context;      /* allocate each slot's MLA cache for L_ctx rows at once */
    char *device;             /* "cpu" (policy/model.h), "cuda" or "cpu-device" (the device
                                 code of policy/model_device.h over host memory) */
    int device_bf16;          /* device cuda: weight GEMMs on bf16 copies of the weights */
    int device_graphs;        /* device cuda: decode steps replayed as CUDA graphs */
    int64_t device_index;     /* device cuda: GPU ordinal, -1: the local MPI rank's */
    /* states, faults, weights */
    char *state_cache;       /* "last" (spec/replay.md 9.3, the default), "all" or "off" */
    int64_t state_budget_bytes;  /* state_cache.budget_bytes of the states file (0: none) */
    int64_t state_gc_interval_s; /* seconds between GC passes of the states file (7.6) */
    int resume_interrupted;  /* resume (1) or mask (0) interrupted trajectories */
    int refill_infra_masked; /* one new attempt for a slot masked with attribution infra */
    double alert_masked_frac;   /* spec/aep.md 8.6: halt admission above this masked fraction */
    int64_t alert_client_codes; /* ... or above this count of one client-attributed code */
    char *policy_dir;        /* directory where new versions are published (LATEST); NULL */
    int64_t policy_poll_ms;
    int64_t policy_version;  /* version of the initial checkpoint */
    double progress_s;       /* seconds between progress lines (0: none) */
} arl_rollout_config;

extern const arl_option arl_rollout_options[];
extern const size_t arl_rollout_n_options;

/* Defaults of every key (arl_rollout_config_free releases the strings). */
arl_status arl_rollout_config_defaults(arl_rollout_config *c);
/* Read an experiment's JSON text: its "rollout" object if it has one (other top-level members
 * belong to other parts of the experiment and are ignored here), else the whole object.
 * Object values of env-config, env-options and task-data are taken as JSON text.  Unknown
 * keys and type mismatches are ARL_ERR_CONFIG naming the key and `where`. */
arl_status arl_rollout_config_load_json(arl_rollout_config *c, const char *text, const char *where);
/* The checks of spec/objective.md 3.2 (L_obs + L_turn <= L_seg <= L_ctx <= L_traj) and of the
 * JSON-valued keys; ARL_ERR_CONFIG names the keys. */
arl_status arl_rollout_config_validate(const arl_rollout_config *c);
void arl_rollout_config_free(arl_rollout_config *c);

/* ---- workers ---- */

typedef struct arl_rollout_worker arl_rollout_worker;

/* Counters of one worker (all trajectories it finished). */
typedef struct arl_rollout_stats {
    int64_t trajectories;     /* finished: complete + truncated + masked */
    int64_t complete, truncated, masked;
    int64_t resumed, interrupted_masked;
    int64_t resumed_from_state; /* resumed from a cached boundary state (not recomputed) */
    int64_t forked, forked_from_state; /* forks started (arl_rollout_fork); from a cached state */
    int64_t successes;        /* outcome at the top of the declared outcome range */
    int64_t tokens, action_tokens, turns, segments;
    int64_t prefill_tokens, decode_tokens;
    int64_t env_errors;       /* masked by an environment error code */
    int64_t not_admitted;     /* trajectories of groups not started after a client-fault alert
                                 (spec/aep.md 8.6) */
    int64_t truncations[4];   /* env_truncated, context_budget, turn_budget, action_too_large */
    int64_t wall_clock;
    double outcome_sum;       /* over complete + truncated */
    int64_t outcome_n;
    double process_sum;       /* derived process rewards */
    int64_t process_n;
    double segment_sum;
    int64_t segment_n;
    double decode_s, prefill_s, env_s, store_s; /* wall time per activity */
    int64_t decode_steps;     /* decode forwards (decode_tokens / decode_steps: mean batch) */
    double prefill_cpu_s;     /* process CPU time of the prefill forwards */
    double decode_cpu_s;      /* process CPU time of the decode forwards */
    int64_t versions_loaded;  /* weight updates picked up */
    int64_t state_gcs;        /* GC passes over the states file (at open, then periodic) */
    int64_t states_deleted;   /* ... their stale 'writing' and unreferenced states deleted */
    int64_t states_evicted;   /* ... their states evicted (state-cache, state-budget-bytes) */
    int64_t state_bytes_freed; /* ... n_bytes of the evicted states */
} arl_rollout_stats;

/* The client-fault alert window of spec/aep.md 8.6: the last ARL_ROLLOUT_ALERT_WINDOW finished
 * trajectories of one environment (a ring), and whether an alert stopped the admission of new
 * groups.  A worker keeps its own unless its hooks give one that outlives it: a caller that runs
 * one worker after another against one environment (experiments/train.c: one per update) keeps
 * the window across them, so that the masked fraction is measured over the last 200 finished
 * trajectories of the run rather than of one small update.  Zero it before first use; a worker
 * of another environment (name@version) starts it afresh. */
enum { ARL_ROLLOUT_ALERT_WINDOW = 200 };
typedef struct arl_rollout_alert_window {
    char env[160]; /* "name@version" of the environment the entries are of ("" when empty) */
    uint8_t masked[ARL_ROLLOUT_ALERT_WINDOW], client[ARL_ROLLOUT_ALERT_WINDOW];
    char code[ARL_ROLLOUT_ALERT_WINDOW][32];
    int32_t n, at;
    int halted; /* no new group is admitted (the alert in alert) */
    char alert[512];
} arl_rollout_alert_window;

/* Optional callbacks (tests, the learner).  Every pointer may be NULL. */
typedef struct arl_rollout_hooks {
    void *user;
    /* The alert window to use and update (borrowed; NULL: the worker's own, empty at open). */
    arl_rollout_alert_window *window;
    /* After every committed segment (C_s, C_end or C_mask); return non-zero to stop the
     * worker at once, leaving running trajectories as they are (as a crash would). */
    int (*on_commit)(void *user, const char *traj_uid, int32_t seg_index, int final);
    /* Polled between the worker's steps (an environment reply, a prefill chunk, a decode step)
     * and, in arl_rollout_worker_open, once before the first write to the store: non-zero stops
     * the worker as on_commit's stop does (an interrupt; the CLI's cli_interrupted). */
    int (*stop)(void *user);
} arl_rollout_hooks;

/* Open a worker: load the checkpoint `ckpt_dir` (its config.json and weights) as policy
 * version cfg->policy_version, open the environment, and open shard `shard_id` of the store
 * (0: a new shard) for writing.  cfg is copied.  st is borrowed and must outlive the worker.
 * If the shard held trajectories of a dead writer they are resumed or masked by
 * arl_rollout_worker_run before new work starts. */
arl_status arl_rollout_worker_open(const arl_rollout_config *cfg, const char *ckpt_dir,
                                   replay_store *st, int32_t shard_id,
                                   const arl_rollout_hooks *hooks, arl_rollout_worker **out);
/* Run tasks [0, cfg->tasks): groups already final in the store are skipped (a restarted worker
 * continues where it stopped), interrupted trajectories of this shard are resumed or masked
 * first.  Returns when every trajectory is final, or ARL_ERR_CANCELLED when a hook stopped it.
 * arl_rollout_worker_open returns ARL_ERR_CANCELLED too when hooks->stop asked before it wrote
 * anything to the store (*out is then to be closed, the store is as it was).
 * Environment faults never fail the run (they mask trajectories); store or model errors do. */
arl_status arl_rollout_worker_run(arl_rollout_worker *w);
/* Ask for a weight update: the checkpoint at ckpt_dir becomes policy version `version`; it is
 * loaded at once and swapped in at the next point where no trajectory is inside a turn. */
arl_status arl_rollout_worker_publish(arl_rollout_worker *w, int64_t version, const char *ckpt_dir);
const arl_rollout_stats *arl_rollout_worker_stats(const arl_rollout_worker *w);
int32_t arl_rollout_worker_shard(const arl_rollout_worker *w);
/* Close the worker (running trajectories stay running in the store).  NULL is a no-op. */
void arl_rollout_worker_close(arl_rollout_worker *w);

/* Fork (spec/replay.md 13.7): `count` new trajectories that keep the first n_prefix >= 1
 * segments of trajectory `parent` (traj_uid or traj_id) as their prefix (not copied: read
 * through the parent) and continue from the end of segment n_prefix - 1, which must be a
 * token_budget boundary (else ARL_ERR_RANGE, before anything is written, naming the
 * boundaries there are): the model from its cached rollout state (else the prefix is
 * prefilled again), the environment by deterministic replay of the parent's steps into a new
 * session; then generation and scoring follow the ordinary rollout path under ckpt_dir with
 * cfg's keys (the environment must be the parent's).  Written into a new tool file of the store,
 * in a catalog group of kind 'fork' (o->group_uid, or "<parent>/fork<S>" when NULL; when forks
 * of this point exist already, "<parent>/fork<S>.<i0>"); a group the catalog has already must
 * be an empty fork group of this very point and size (one a stopped fork command created), else
 * ARL_ERR_ARG before anything is written (a training group's members would be replaced).
 * uids (count) receive the new
 * trajectories' ids "<parent>/f<S>.<i>", i from i0, the first free (earlier forks at the same
 * point keep theirs); stats (may be NULL) the counters.
 * The forks' run and policy version: when ckpt_dir's weights are a policy version v of the
 * parent's run (its recorded weights_sha256, else its checkpoint path: replay_version_find),
 * the forks belong to that run at version v; otherwise to a run of their own,
 * "<parent's run>/fork-<first 12 hex digits of the weights' SHA-256>", at version 0 (its
 * policy_versions row names ckpt_dir).  The model state at the fork point is the parent's
 * cached rollout state only when it was computed entirely at version v of the same run
 * (spec/replay.md 13.7 step 1: the state at the chosen version), or, with
 * o->use_rollout_state, whatever versions computed it; otherwise the prefix is prefilled at
 * the forks' weights.  o may be NULL (the defaults). */
typedef struct arl_rollout_fork_opts {
    const char *group_uid; /* NULL: "<parent>/fork<S>" */
    int64_t version;       /* >= 0: ckpt_dir must be this policy version of the parent's run
                            * (else ARL_ERR_STATE before anything is written); -1: any */
    int use_rollout_state; /* start from the parent's cached rollout state whatever its versions */
} arl_rollout_fork_opts;
arl_status arl_rollout_fork(const arl_rollout_config *cfg, const char *ckpt_dir, replay_store *st,
                            const char *parent, int32_t n_prefix, int32_t count,
                            const arl_rollout_fork_opts *o, char (*uids)[REPLAY_UID_MAX + 1],
                            arl_rollout_stats *stats);

/* Several fork points at once (arl_rollout_fork for each): one worker, with one model load and
 * one new tool file, continues all their forks together, batch-size at a time.  Every point is
 * checked first (as arl_rollout_fork checks its one; a point given twice, parents of different
 * runs, or o->group_uid with more than one point are ARL_ERR_ARG), so a refusal writes nothing.
 * uids receive the sum of the counts, point after point. */
typedef struct arl_rollout_fork_point {
    const char *parent; /* traj_uid or traj_id */
    int32_t n_prefix;   /* the fork keeps segments 0..n_prefix - 1 */
    int32_t count;      /* forks at this point, >= 1 */
} arl_rollout_fork_point;
arl_status arl_rollout_fork_many(const arl_rollout_config *cfg, const char *ckpt_dir,
                                 replay_store *st, const arl_rollout_fork_point *pts, int32_t n_pts,
                                 const arl_rollout_fork_opts *o, char (*uids)[REPLAY_UID_MAX + 1],
                                 arl_rollout_stats *stats);

/* Print the closing summary of a run (success rate, reward per level, mean length, ends) under
 * the title "rollout summary", or under title (arl_rollout_stats_print_titled: "rollout summary
 * (interrupted: ...)" for a run that was stopped). */
void arl_rollout_stats_print(const arl_rollout_stats *s, FILE *f);
void arl_rollout_stats_print_titled(const arl_rollout_stats *s, const char *title, FILE *f);

#endif
