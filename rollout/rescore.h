/* rollout/rescore.h: the model-side replay operation of spec/replay.md 13.6 - re-scoring
 * stored segments under a checkpoint (each segment from its cached boundary state, or from a
 * recomputed prefix) - plus the assembly of stored boundary parts into a decode-state export.
 * What this is not: the store (replay/) or the rollout loop (rollout/worker.c); forking a
 * trajectory at a segment boundary (13.7) is arl_rollout_fork / arl_rollout_fork_many in
 * rollout/rollout.h; re-scoring the rewards by replaying a trajectory against its environment
 * (13.6 --rewards) is rollout/rescore_rewards.h.
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
 * Parts of another model config or numerics (the engine's tag, ro_engine.numerics), or not
 * contiguous, are ARL_ERR_NOT_FOUND (a cache miss).  *out is malloc'ed (caller frees),
 * *out_len its size. */
arl_status arl_rollout_state_assemble(const arl_model_config *cfg, const char *cfg_hash,
                                      const char *numerics, const replay_state_data *parts,
                                      size_t n_parts,
                                      uint8_t **out, size_t *out_len);

#endif

/* ---- re-scoring (spec/replay.md 13.6) ---- */

/* opts.version: derive the checkpoint's policy version from the trajectory's run (see below) */
#define ARL_ROLLOUT_RESCORE_VERSION_AUTO (-2)

/* How the version whose rollout states may start segments was chosen (stats.version_how). */
enum {
    ARL_ROLLOUT_RESCORE_VERSION_NONE = 0,    /* none: -1 given, or no version matched */
    ARL_ROLLOUT_RESCORE_VERSION_GIVEN = 1,   /* opts.version >= 0, as the caller asserted (a
                                                version the run records, or any without a
                                                catalog to check it) */
    ARL_ROLLOUT_RESCORE_VERSION_WEIGHTS = 2, /* the run's version with these weights' sha256 */
    ARL_ROLLOUT_RESCORE_VERSION_PATH = 3,    /* the run's version recorded at this checkpoint
                                                directory (no weights hash recorded) */
    ARL_ROLLOUT_RESCORE_VERSION_REFUSED = 4, /* given, but the catalog records other weights for
                                                it: its rollout states are not used */
    ARL_ROLLOUT_RESCORE_VERSION_UNKNOWN = 5, /* given, but the trajectory's run records no such
                                                version in the catalog: no states are used */
};

typedef struct arl_rollout_rescore_opts {
    const char *ckpt_dir; /* checkpoint to score under (config.json + weights) */
    int64_t version;      /* its policy version, whose rollout states (computed entirely at it)
                             may start segments: >= 0 as given (refused when the run's
                             policy_versions row records another weights_sha256; unknown, no
                             states used, when the catalog has no such row for the run);
                             ARL_ROLLOUT_RESCORE_VERSION_AUTO: the run's version whose
                             weights_sha256 is the checkpoint's (SHA-256 of the parameters as
                             loaded, fp32), else whose checkpoint_uri is this directory, else none
                             (the safe default: states of other weights never start a segment);
                             -1: never use cached states (rollout or tool) */
    replay_writer *save_states; /* non-NULL: write each segment's end state (kda_boundary and
                                   mla_segment, producer 'tool', spec 13.6 step 3) into this
                                   writer's states file; the pass then computes every state
                                   itself (no cached start), so the saved boundaries are one
                                   pass.  Borrowed for the call. */
    int natural_routing;  /* 0: replay the stored routes (default); 1: the router's own choice */
    int64_t max_tokens;   /* tokens per forward (0: 2048) */
    int64_t sparse_topk;  /* block-sparse MLA as the rollout ran it (0: dense) */
    int64_t sparse_chunk; /* its chunk length (0: 4096) */
    const char *device;   /* NULL or "cpu": policy/model.h; "cuda" (GPU) or "cpu-device" (the
                             device code over host memory) as rollout.device: policy/model_device.h
                             (dense or block-sparse MLA); its states carry the engine's numerics
                             tag */
} arl_rollout_rescore_opts;

typedef struct arl_rollout_rescore_stats {
    int64_t segments;       /* segments scored */
    int64_t from_state;     /* segments started from a cached boundary state */
    int64_t from_tool_state; /* of from_state: from tool states of this checkpoint (a pass
                                that saved them: same weights, routing and MLA sparsity) */
    int64_t from_learner_state; /* of from_state: from the states a learner's pi_old pass wrote
                                   under these weights (learner option keep-states; the same
                                   routing and MLA sparsity), where no tool state was found */
    int64_t version;        /* the version whose rollout states could start segments (-1: none) */
    int version_how;        /* ARL_ROLLOUT_RESCORE_VERSION_* */
    int64_t states_saved;   /* boundaries written with save_states */
    char pass_uid[96];      /* pass_uid of this checkpoint's tool states ("" with version -1) */
    int64_t recomputed;     /* segments started from the recomputed prefix */
    int64_t fresh;          /* segments of start_kind 'fresh' (no prefix to start from) */
    int64_t skipped;        /* segments not compared: image placeholders the stored
                               observations do not explain, or a prefix that went through one */
    int64_t images;         /* image placeholders given rows rebuilt from the stored PNGs */
    int64_t action_tokens;  /* action tokens compared */
    double mean_abs, p99_abs, max_abs; /* |l - l_mu| over those tokens */
    int64_t worst_token;    /* stream position of the largest difference (-1: none) */
    /* router agreement with the stored routes (spec/objective.md 11.4) over the tokens of the
     * compared segments whose routes are stored for every MoE layer: with --routing replay the
     * natural top-k at each layer's input with upstream layers replayed (conditional), with
     * natural routing the top-k of the free-running forward */
    int64_t route_tokens;   /* tokens compared (0: no routes stored, or a dense model) */
    int64_t routes_other_layout; /* segments whose stored routes are of another MoE layout
                                    (layer count or top-k) than the checkpoint's: with natural
                                    routing their agreement is not measured (with replay
                                    routing such a segment is an ARL_ERR_CONFIG error) */
    double agree_overlap;   /* mean over tokens and layers of |N ∩ R| / k */
    double agree_exact_layer; /* fraction of (token, layer) with N = R */
    double agree_exact_token; /* fraction of tokens with N = R in every layer */
    double entropy_mean;    /* mean entropy (nats) of the distributions that predicted the
                               compared action tokens */
} arl_rollout_rescore_stats;

/* Per-token detail of a re-score: arrays over the trajectory's token stream (n entries, as *n
 * of arl_rollout_rescore), malloc'ed by arl_rollout_rescore_ex and owned by the caller after. */
typedef struct arl_rollout_rescore_detail {
    float *entropy;   /* (n) entropy of the distribution that predicted token t (0 where none) */
    uint8_t *overlap; /* (n_moe, n) |N ∩ R| of token t in MoE layer l; 0xFF where not compared
                         (no stored route, a skipped segment, a dense model) */
    int64_t n_moe, k; /* set by the call: MoE layers and experts per token of the checkpoint */
} arl_rollout_rescore_detail;

/* Re-score one trajectory (traj_uid or traj_id; forks through their parents): every segment in
 * order, each starting from a cached boundary state of the previous one -- the tool states a
 * save_states pass under the same checkpoint wrote, else the learner states (producer 'learner')
 * of an update whose pi_old pass ran with these weights, else the segment's rollout state when it
 * is present, complete and of the version opts->version resolves to -- else from the state this
 * pass computed (the prefix is recomputed from the last fresh start).  *logprobs (may be NULL)
 * receives the re-scored log-probability of every token of the stream (0 for tokens not predicted:
 * segment starts), a malloc'ed array of *n entries; *mu (may be NULL) the stored behaviour
 * log-probabilities.  A checkpoint of another model than the trajectory's is ARL_ERR_CONFIG,
 * naming the trajectory and segment: a token outside its vocabulary, and with replay routing
 * stored routes of another MoE layout (layer count, top-k) or naming an expert it lacks. */
arl_status arl_rollout_rescore(replay_store *st, const char *traj,
                               const arl_rollout_rescore_opts *opts,
                               arl_rollout_rescore_stats *out, float **logprobs, float **mu,
                               size_t *n);
/* As arl_rollout_rescore, plus per-token detail: det->entropy and det->overlap are malloc'ed by
 * the call when det is non-NULL (the caller frees both; NULL after an error). */
arl_status arl_rollout_rescore_ex(replay_store *st, const char *traj,
                                  const arl_rollout_rescore_opts *opts,
                                  arl_rollout_rescore_stats *out, float **logprobs, float **mu,
                                  size_t *n, arl_rollout_rescore_detail *det);
