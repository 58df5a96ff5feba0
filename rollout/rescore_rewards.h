/* rollout/rescore_rewards.h: `agentrl replay rescore --rewards` (spec/replay.md 13.6, last item):
 * the stored actions of a trajectory replayed into a new session of an environment with
 * capabilities.deterministic_replay, the scores requested again where the rollout requested them
 * (process rewards from the steps, segment scores at the stored segment boundaries, the episode
 * score at the end), written as rewards rows with source 'rescore:<label>' into a tool file, and
 * compared with the stored rows (reward drift after an environment change).
 *
 * Replay rules (the same as a resume by replay, spec/replay.md 7.5 step 4):
 *  - the create request is the stored one (task, options, group) under the trajectory id
 *    <traj_uid>#rescore<ms>; the initial observation must equal the stored one;
 *  - step k sends the stored request's `action` exactly; each response is compared with the
 *    stored bytes.  A response whose `observation`, `terminated` or `truncated` differs means the
 *    stored actions no longer apply: the replay stops with ARL_ERR_ENV ("diverged at step k"),
 *    nothing is written for the trajectory.  Any other difference (reward, reward_components,
 *    info) is what is being audited: counted in `mismatched`, the first one described, the replay
 *    goes on;
 *  - a masked or running trajectory is replayed up to its last step with a stored complete
 *    response, with the segment and episode scores that were stored (partial = 1, note says so).
 * Not here: the model-side re-score (rollout/rescore.h), the store (replay/). Forks are refused
 * (their prefix steps are their parent's: re-score the parent). */
#ifndef ARL_ROLLOUT_RESCORE_REWARDS_H
#define ARL_ROLLOUT_RESCORE_REWARDS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "replay/replay.h"

typedef struct arl_rollout_rescore_rewards_opts {
    const char *env;          /* NULL: the environment of the trajectory's run (its config key
                                 "env"); else builtin:NAME, NAME or an AEP/1 base URL */
    const char *env_config;   /* built-in configuration JSON; NULL: the run's "env-config" */
    const char *label;        /* required: the rows' source is 'rescore:<label>' */
    int64_t step_deadline_ms; /* 0: the environment's default */
} arl_rollout_rescore_rewards_opts;

/* Drift of one reward level between the stored rows (source env or client) and the re-scored
 * rows, matched by (scope_index, component). */
typedef struct arl_rollout_reward_drift {
    int64_t compared;  /* keys present on both sides */
    int64_t differing; /* of them: values not equal (a NULL against a number counts) */
    int64_t missing;   /* stored keys the replay did not produce */
    int64_t extra;     /* re-scored keys with no stored row */
    double max_abs;    /* max |re-scored - stored| over compared keys with two numbers */
    double stored_sum, rescored_sum; /* over compared keys with two numbers (n_values) */
    int64_t n_values;
} arl_rollout_reward_drift;

/* One compared key (a row of the drift report). */
typedef struct arl_rollout_reward_pair {
    int level; /* ARL_ENV_LEVEL_* order: 0 process, 1 segment, 2 outcome */
    int64_t scope_index;
    char component[72];      /* "", "@derived" or a component name */
    double stored, rescored; /* NAN: NULL, or absent (see present) */
    int present;             /* bit 0: stored row exists, bit 1: re-scored row exists */
} arl_rollout_reward_pair;

typedef struct arl_rollout_rescore_rewards_stats {
    char env_name[72], env_version[72]; /* of the environment replayed against */
    char env_where[512];                /* how it was opened ("builtin:calculator", a URL) */
    int64_t steps;                      /* steps replayed */
    int64_t segment_scores;             /* segment scores requested */
    int64_t episode_scores;             /* 0 or 1 */
    int partial;                        /* masked or running: replayed what was stored (see note) */
    char note[256];                     /* "" or why the replay is partial */
    int64_t mismatched;                 /* responses whose bytes differ from the stored ones */
    char first_mismatch[256];           /* "step 2: reward, reward_components" */
    int64_t rows_written;               /* rows written into the tool file (0 without one) */
    arl_rollout_reward_drift level[3];  /* process, segment, outcome */
    arl_rollout_reward_pair *pairs;     /* (n_pairs) every key of either side, ordered by level,
                                           scope, component; malloc'ed, the caller frees */
    size_t n_pairs;
} arl_rollout_rescore_rewards_stats;

/* Replay trajectory traj (traj_uid or traj_id) against its environment (or opts->env) and
 * re-score its rewards.  tool: NULL to compare only; else the TOOL writer that receives the rows
 * in one transaction (replay_rescore_rewards_put) -- when *tool is NULL, one is opened on st
 * (replay_writer_open, a new tool file) only once the rows are ready, so that a failed replay
 * creates no file; the caller closes it.  Errors (nothing written):
 * ARL_ERR_UNSUPPORTED (a fork; an environment without deterministic_replay),
 * ARL_ERR_ENV (environment unreachable, an error answer mid-replay, a divergence),
 * ARL_ERR_CORRUPT (a stored request that cannot be read), ARL_ERR_CONFIG (no environment known
 * for the run), and the store's errors.  out->pairs is NULL after an error. */
arl_status arl_rollout_rescore_rewards(replay_store *st, const char *traj,
                                       const arl_rollout_rescore_rewards_opts *opts,
                                       replay_writer **tool,
                                       arl_rollout_rescore_rewards_stats *out);

/* Write the re-scored rows of r (a successful arl_rollout_rescore_rewards of traj with tool
 * NULL: the pairs present on the re-scored side) with source 'rescore:<label>' into *tool, in
 * one transaction (replay_rescore_rewards_put), opening a new tool file on st when *tool is
 * NULL; r->rows_written is set.  For a caller that saves them together with other rows of the
 * same trajectory (the CLI: with its model re-score, one step an interrupt does not cut), so that
 * a trajectory is either saved whole or not at all. */
arl_status arl_rollout_rescore_rewards_save(replay_store *st, const char *traj, const char *label,
                                            replay_writer **tool,
                                            arl_rollout_rescore_rewards_stats *r);

#endif
