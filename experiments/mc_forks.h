/* experiments/mc_forks.h: the continuations behind Monte-Carlo segment baselines
 * (spec/objective.md 5.3, learner.segment-baseline mc), forked by the train driver after each
 * update's rollout. */
#ifndef AGENTRL_EXPERIMENTS_MC_FORKS_H
#define AGENTRL_EXPERIMENTS_MC_FORKS_H

#include <stdint.h>

#include "core/status.h"
#include "rollout/rollout.h"

/* For every finished (complete or truncated) trajectory of the train groups of run_uid in the
 * store at root, and every segment s >= 1 of it that starts at a token_budget boundary, make
 * `count` forks exist at the start of s (spec/replay.md 13.7), all in one
 * arl_rollout_fork_many with the policy at ckpt_dir, which must be policy version `version` of
 * the run: groups of kind 'fork', which no update consumes.  A boundary with forks already
 * gets only those missing.  When a fork of the store is still running (a killed run left it),
 * nothing is forked and *interrupted is 1: continuing would not give the forks an uninterrupted
 * run makes (a replacement samples another stream), so the caller rolls out again or masks
 * them (replay_recover).  cfg: the rollout configuration of the store's run (the environment
 * must support forking, spec/aep.md 6.6).  The rollout's per-fork lines are held back (log
 * level warn while forking); the call logs one line: the forks started, at how many
 * boundaries, in how long. */
arl_status arl_mc_forks_make(const arl_rollout_config *cfg, const char *root, const char *run_uid,
                             const char *ckpt_dir, int64_t version, int32_t count,
                             int *interrupted);

/* The cached rollout states of the store at root evicted as state-cache 'last' would have
 * (spec/replay.md 9.3: none of finished trajectories; replay_gc on every file without a live
 * writer).  The train driver keeps every boundary state of an update's rollout while it forks
 * (state-cache 'all'), so that the forks start from them instead of prefilling their prefixes,
 * and calls this when the forks are made. */
arl_status arl_mc_states_release(const char *root);

#endif
