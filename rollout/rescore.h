/* rollout/rescore.h: the model-side replay operations of spec/replay.md 13.6 and 13.7 -
 * re-scoring stored segments under a checkpoint (each segment from its cached boundary state,
 * or from a recomputed prefix), and forking a trajectory at a segment boundary so that a
 * rollout continues it - plus the assembly of stored boundary parts into a decode-state export.
 * What this is not: the store (replay/) or the rollout loop (rollout/worker.c).
 */
#ifndef ARL_ROLLOUT_RESCORE_H
#define ARL_ROLLOUT_RESCORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "policy/config.h"
#include "replay/replay.h"
#include "rollout/rollout.h"

/* The ARLS export (policy/state.h) of a full boundary from replay_boundary_load parts: the
 * kda_boundary part first, then the mla_segment parts from the last fresh start in order.
 * Parts of another model config or numerics, or not contiguous, are ARL_ERR_NOT_FOUND (a
 * cache miss).  *out is malloc'ed (caller frees), *out_len its size. */
arl_status arl_rollout_state_assemble(const arl_model_config *cfg, const char *cfg_hash,
                                      const replay_state_data *parts, size_t n_parts,
                                      uint8_t **out, size_t *out_len);

#endif

/* ---- re-scoring (spec/replay.md 13.6) ---- */

typedef struct arl_rollout_rescore_opts {
    const char *ckpt_dir; /* checkpoint to score under (config.json + weights) */
    int64_t version;      /* its policy version: cached states computed entirely at this version
                             start their segment; -1: never use cached states */
    int natural_routing;  /* 0: replay the stored routes (default); 1: the router's own choice */
    int64_t max_tokens;   /* tokens per forward (0: 2048) */
    int64_t sparse_topk;  /* block-sparse MLA as the rollout ran it (0: dense) */
    int64_t sparse_chunk; /* its chunk length (0: 4096) */
} arl_rollout_rescore_opts;

typedef struct arl_rollout_rescore_stats {
    int64_t segments;       /* segments scored */
    int64_t from_state;     /* segments started from a cached boundary state */
    int64_t recomputed;     /* segments started from the recomputed prefix */
    int64_t skipped;        /* segments not compared: image placeholders the stored
                               observations do not explain, or a prefix that went through one */
    int64_t images;         /* image placeholders given rows rebuilt from the stored PNGs */
    int64_t action_tokens;  /* action tokens compared */
    double mean_abs, p99_abs, max_abs; /* |l - l_mu| over those tokens */
    int64_t worst_token;    /* stream position of the largest difference (-1: none) */
} arl_rollout_rescore_stats;

/* Re-score one trajectory (traj_uid or traj_id; forks through their parents): every segment in
 * order, each starting from the cached boundary state of the previous one when it is present,
 * complete and of opts->version, else from the state this pass computed (the prefix is
 * recomputed from the last fresh start).  *logprobs (may be NULL) receives the re-scored
 * log-probability of every token of the stream (0 for tokens not predicted: segment starts), a
 * malloc'ed array of *n entries; *mu (may be NULL) the stored behaviour log-probabilities. */
arl_status arl_rollout_rescore(replay_store *st, const char *traj,
                               const arl_rollout_rescore_opts *opts,
                               arl_rollout_rescore_stats *out, float **logprobs, float **mu,
                               size_t *n);
