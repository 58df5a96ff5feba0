/* learner/update.h: one KL-constrained policy update (spec/objective.md section 8.5) from
 * trajectory groups in replay stores - the learner of agentrl.
 *
 * Update n, in order:
 *   1. load     the groups' members (latest attempt per slot, spec/replay.md 4.4); for every
 *               valid member (complete, truncated) its segments (tokens, behaviour log-probs,
 *               loss mask, versions, routes), turns (action token ranges, derived process
 *               rewards, anchors) and segment/outcome rewards.  Masked members contribute
 *               nothing but their place in the group (section 4.4).  With several learner
 *               ranks, group g (in update order) belongs to learner g mod L; every rank reads
 *               the segment metadata of all groups (to cut identical minibatches) and the
 *               tokens of its own.
 *   2. pi_old   a forward pass at the current weights (version n), without gradient, segment
 *               by segment from each trajectory's start (segments of several trajectories
 *               batched in waves), replaying the stored MoE routes (section 11.2): l_old,
 *               the entropy of pi_old, the router agreement and expert load metrics (11.4),
 *               and the boundary state after every segment that a later segment continues
 *               from, kept in the state cache tagged with version n (section 10.3).
 *   3. ref      the same pass with the frozen reference weights (a second model that shares
 *               nothing mutable with the policy): l_ref.  Routes replayed unless ref-routing
 *               is natural.
 *   4. rewards  kappa per turn, advantages of every group (reward/reward.h; batch-scope
 *               statistics summed over learner ranks), token advantages; the masks of
 *               section 8.2 and the pre-gradient statistics (learner/loss.h), KL_n.
 *   5. steps    the segments of valid trajectories are shuffled with a stream seeded by
 *               (seed, n) and dealt into M minibatches of roughly equal action-token counts
 *               (greedy: next segment to the lightest minibatch, ties to the lowest index).
 *               Per minibatch: every segment's start state comes from the state cache when the
 *               cached state is valid for this pass (producer learner, version n, numerics and
 *               routing tag equal; with prefix-refresh per_minibatch also computed at the
 *               current optimizer step); otherwise the prefix since the last fresh start is
 *               recomputed without gradient at the current weights (counted in
 *               state/recompute_tokens).  Forward with routes replayed, loss and d loss/d logp
 *               (learner/loss.h), backward down to (not into) the start state
 *               (policy/model_backward.h), gradient all-reduce over learner ranks
 *               (learner/dist.h, deterministic), AdamW step with clipping, Quantile Balancing
 *               of the router biases from the step's router scores (policy/optimizer.h).
 *   6. KL       the controller step (learner/kl_ctl.h) with KL_n and the valid trajectory
 *               count.
 *   7. metrics  one JSON object with every metric of spec/objective.md section 12.
 * Publishing version n + 1, the checkpoint and the ledger commit are the caller's
 * (experiments/train.c): this module changes the parameters, optimizer and controller it is
 * given, nothing on disk; the caller writes the learner_records of spec/replay.md 4.13 with
 * arl_learner_records_write (learner/records.c).  With keep-states, the pi_old pass also writes
 * its segment-end states into the learner file each source names (learner/states.c); the
 * boundary states the gradient pass starts from live in memory for the update.
 *
 * Segments and tokens.  Token t of a segment is predicted at position t - 1 of the same
 * segment; the first token of a segment is never an action token (a segment starts with
 * context: the chat template's opening, or the rendered observation of the previous turn), so
 * every action token's log-probability comes from its own segment.  A segment longer than
 * max-tokens is fed in pieces of max-tokens tokens that continue the same decode-state slot;
 * in the gradient pass the gradient stops at a piece boundary as it does at a segment boundary
 * (counted in state/piece_splits; choose max-tokens >= the rollout's segment-tokens to avoid
 * it).  Tokens whose stored routes are absent (the last sampled token of a trajectory, which
 * was never fed back to the engine) are only targets: a trailing run of them is not fed.  A
 * segment with routes missing, invalid, or absent at a fed token is masked from the loss
 * (m_route = 0, section 11.3) and its passes use natural routing.
 *
 * Images (spec/policy.md 10, spec/replay.md 4.10).  The <|media_pad|> placeholders of a
 * trajectory's context (images the environment sent) take image rows rebuilt from the store:
 * the observations' images are loaded and patchified once per update (rollout/media.h
 * ro_media_load_input, which hands each placeholder its row by the same cursor rule the rollout,
 * re-scoring and resume use) and encoded by the vision tower under the weights of each pass -
 * the current weights for pi_old, the reference weights for the reference pass, and the weights
 * of the optimizer step for the gradient pass and the prefixes it recomputes (learner/media.c).
 * In the gradient pass the gradient of the rows (arl_model_backward's d_media) goes through the
 * vision tower's backward, so the vision tower and projector are trained like every other
 * tensor.  A placeholder the policy sampled is an ordinary token (its embedding row, which
 * receives its gradient).  A trajectory whose stored observations cannot explain its
 * placeholders (images missing or unreadable, or a model without a vision tower) is trained on
 * none of its segments (m_route = 0 for each, its placeholders fed as plain tokens) and the
 * reason is logged and kept in its media_error.
 *
 * Shared prompt prefix (option shared-prefix).  Trajectories of agentic tasks start with the
 * same long context (the chat template's opening, the tool declarations and the system text);
 * the learner would feed it again for every trajectory in the pi_old pass, the reference pass
 * and every gradient step.  With the option on, after loading, the update's shared prefix is
 * found: among the first segments of local valid trajectories that start fresh at context
 * position 0 and carry no images, the longest run of positions [0, P) on which the tokens (and,
 * with routing replay, the stored routes) equal those of the first such segment, chosen to save
 * the most tokens (P times the other users), with at least shared-prefix-min tokens and no
 * action token among tokens 1..P (each of those must keep its own log-probability and
 * gradient).  Each pass then prefills the prefix once - pi_old under the current weights,
 * reference under the reference weights, each gradient step under that step's weights -
 * exports its decode state, imports it into every user's slot and feeds each user from
 * position P on.  Log-probabilities and entropies equal those of whole-segment forwards up to
 * fp32 rounding (the prefix is the same computation, chunked differently).  In the gradient
 * pass no gradient flows into the prefix's state: it is a start state like a segment
 * boundary's cached state (spec/objective.md 10.1, segment-wise training), so the weights get
 * the gradient of the action tokens through their own positions only, not through the keys,
 * values and recurrent state the prefix contributes.  arl_learner_minibatch_loss uses the
 * prefix state of the running gradient step (like the cached start states), so finite
 * differences of it check exactly that gradient.  Trajectories whose first segment differs
 * within the shortest useful prefix, continues or forks, or has images, are fed whole.
 *
 * Determinism: for a fixed thread count and learner count an update is bit-reproducible.
 * With L learners the gradient of a minibatch is the rank-ordered sum of the ranks' partial
 * gradients (each divided by the same constant Z / M), so parameters agree with one process
 * on the same groups to float rounding of those partial sums.
 *
 * Symbols: n update index (= policy version of the weights going in), M minibatches, L learner
 * ranks, B groups, G group size, T tokens of a segment, k experts per token, E experts.
 */
#ifndef ARL_LEARNER_UPDATE_H
#define ARL_LEARNER_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"
#include "learner/dist.h"
#include "learner/kl_ctl.h"
#include "learner/loss.h"
#include "policy/config.h"
#include "policy/model.h"
#include "policy/model_backward.h"
#include "policy/optimizer.h"
#include "policy/params.h"
#include "policy/state.h"
#include "replay/replay.h"
#include "reward/reward.h"

/* ------------------------------------------------------------------------------------------ */
/* Options: the experiment's "learner" section                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The learner's own keys. */
typedef struct arl_learner_own_opts {
    int64_t minibatches;   /* M */
    int64_t max_tokens;    /* tokens per learner forward */
    int64_t max_docs;      /* segments per forward (and decode-state slots) */
    int routing_replay;    /* replay the stored routes (section 11.2) */
    char *ref_routing;     /* replay|natural */
    char *prefix_refresh;  /* per_update|per_minibatch */
    int act_checkpoint;    /* recompute layer internals in the backward */
    double state_cache_mb; /* memory for cached boundary states */
    double drift_sample;   /* fraction of continue segments sampled for state/prefix_drift */
    int shared_prefix;     /* compute the update's shared prompt prefix once per pass */
    int64_t shared_prefix_min; /* fewest shared tokens worth it */
    char *device;              /* cpu|cuda|cpu-device */
    char *device_allreduce;    /* auto|nccl|mpi */
    char *device_math;         /* fp32|tf32|bf16 */
    int64_t device_slot_rows;  /* latent rows the device's slots share (0: each its own) */
    int records;               /* write learner_records (arl_learner_records_write) */
    char *keep_states;         /* off|pinned|all: state_cache.learner (learner/states.c) */
    int64_t state_budget_bytes;  /* state_cache.budget_bytes of its states file (0: none) */
    int64_t state_gc_interval_s; /* seconds between GC passes of that file (0: every update) */
} arl_learner_own_opts;

/* The whole "learner" section: the learner's keys, the objective's reward keys
 * (reward/reward.h), the loss keys (learner/loss.h), the KL keys (learner/kl_ctl.h), the
 * distribution keys (learner/dist.h) and the RL optimizer's keys (policy/optimizer.h) in one
 * flat table (their names are distinct). */
typedef struct arl_learner_opts {
    arl_learner_own_opts own;
    arl_reward_opts reward;
    arl_loss_opts loss;
    arl_kl_opts kl;
    arl_dist_opts dist;
    arl_optim_config optim;
} arl_learner_opts;

/* The composed table (static storage) and its length. */
const arl_option *arl_learner_options(size_t *n);
/* Defaults of every key; free with arl_learner_opts_free. */
arl_status arl_learner_opts_defaults(arl_learner_opts *o);
void arl_learner_opts_free(arl_learner_opts *o); /* NULL-safe */

/* Resolved settings of the learner's own keys. */
typedef struct arl_learner_config {
    int32_t minibatches;
    int64_t max_tokens;
    int32_t max_docs;
    int routing_replay;
    int ref_routing_replay;
    int prefix_per_minibatch;
    int act_checkpoint;
    int64_t state_cache_bytes;
    double drift_sample;
    int shared_prefix;         /* see "Shared prompt prefix" above */
    int64_t shared_prefix_min; /* fewest tokens a shared prefix must have (>= 1) */
    uint64_t seed;             /* run seed (minibatch shuffles) */
    int64_t n_traj_per_update; /* N_traj = B * G: the constant normaliser's trajectory count */
    int64_t segment_tokens;    /* L_seg of the rollout (segment/oversize_frac) */
    int64_t max_context;       /* most positions since a fresh start (the rollout's L_ctx);
                                  0: the model's max_position_embeddings */
    const char *max_context_key; /* the setting it comes from (arl_model_opts); NULL: none */
    int64_t mla_sparse_topk;   /* block-sparse MLA k_c of the run (spec/policy.md 4.5; the
                                  rollout's setting: "a run uses one setting for its rollout and
                                  learner passes"); 0: dense */
    int64_t mla_sparse_chunk;  /* its chunk length n_c (>= 1 when mla_sparse_topk > 0) */
    char device[16];           /* where the learner's passes run: "cpu" (or empty: the CPU
                                  reference), "cuda", "cpu-device" (learner/device.c) */
    char device_allreduce[8];  /* the gradient all-reduce of learners on device cuda: "nccl"
                                  (on the GPUs, a communicator bootstrapped over MPI), "mpi"
                                  (learner/dist.h on the host), "auto" or empty (nccl when
                                  there are several learner ranks and the build has NCCL) */
    char device_math[8];       /* the GEMMs' arithmetic on device cuda: "fp32" (or empty),
                                  "tf32", "bf16" (kernels/cuda/cuda.h arl_cuda_math; bf16 also
                                  keeps bf16 weight copies, policy/model_device.h) */
    int64_t device_slot_rows;  /* > 0: the device model's slots share that many latent rows
                                  per MLA layer (policy/model_device.h slot_rows), each slot's
                                  range following its document's length (a forward whose
                                  documents need more is made with fewer at a time,
                                  learner/device.c); 0: max_docs slots of max_context rows
                                  each */
    int keep_states;           /* ARL_LEARNER_KEEP_*: which trajectories' pi_old states go into
                                  the sources' states_out (state_cache.learner,
                                  learner/states.c) */
} arl_learner_config;

enum { ARL_LEARNER_KEEP_OFF = 0, ARL_LEARNER_KEEP_PINNED = 1, ARL_LEARNER_KEEP_ALL = 2 };

/* ------------------------------------------------------------------------------------------ */
/* The state cache (spec/objective.md section 10.3)                                             */
/* ------------------------------------------------------------------------------------------ */

#define ARL_LEARNER_NUMERICS "cpu-f32"

/* One cached boundary state: the ARLS export (policy/state.h) of the decode state after a
 * segment, with the tags of the validity rule. */
typedef struct arl_state_entry {
    int32_t shard_id;
    int64_t traj_id;
    int32_t seg_index;    /* the state after this segment */
    int64_t version;      /* policy version of the weights that computed it */
    int64_t opt_step;     /* optimizer steps taken when it was computed */
    int producer_learner; /* 1: computed by the learner */
    int routing_replay;   /* 1: routes replayed */
    char numerics[32];    /* kernel and precision tag */
    uint8_t *buf;         /* (len) owned */
    size_t len;
} arl_state_entry;

typedef struct arl_state_cache {
    arl_state_entry *v; /* (n) owned */
    int32_t n, cap;
    int64_t bytes, max_bytes;
    int64_t dropped; /* states not kept because of max_bytes */
} arl_state_cache;

void arl_state_cache_clear(arl_state_cache *c); /* frees the entries, keeps the table */
void arl_state_cache_free(arl_state_cache *c);  /* NULL-safe */
/* Entry of (shard, traj, seg) or NULL. */
arl_state_entry *arl_state_cache_find(arl_state_cache *c, int32_t shard_id, int64_t traj_id,
                                      int32_t seg_index);
/* Add or replace; buf is taken over (freed by the cache, also on error). */
arl_status arl_state_cache_put(arl_state_cache *c, const arl_state_entry *e);
/* 1 if e may start a gradient computation of update n (section 10.3) on a learner whose
 * kernels and precision are tagged `numerics` (ARL_LEARNER_NUMERICS on device cpu and
 * cpu-device, "cuda-f32" on cuda); opt_step >= 0 also requires that many optimizer steps
 * (prefix-refresh per_minibatch), -1 does not. */
int arl_state_entry_valid(const arl_state_entry *e, const char *numerics, int64_t version,
                          int routing_replay, int64_t opt_step);

/* ------------------------------------------------------------------------------------------ */
/* The data of one update                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A source of groups: one replay store (borrowed) and the groups of the update in it. */
typedef struct arl_update_source {
    replay_store *store;      /* borrowed */
    const char *root;         /* its root directory (for the ledger and shard reads) */
    const int64_t *group_ids; /* (n_groups) borrowed */
    int64_t n_groups;
    replay_writer *states_out; /* borrowed, or NULL: the learner file (REPLAY_FILE_LEARNER) of
                                  this store that the pi_old pass writes its states into when
                                  keep-states is on (learner/states.c) */
} arl_update_source;

typedef struct arl_upd_seg {
    int32_t traj; /* index into the batch's trajectories */
    int32_t seg_index;
    int fresh; /* start kind fresh (else continue/fork: from the previous state) */
    char end_cause[16];
    int64_t tok_start, ctx_start, T, n_action;
    int local; /* this rank holds its tokens */
    int32_t minibatch;
    int has_next; /* a later segment of the trajectory continues from its end state */
    /* per token (T), allocated for local segments only */
    int32_t *tokens;
    uint8_t *amask; /* loss mask: 1 = action token */
    uint32_t *versions;
    double *lp_mu, *lp_old, *lp_ref, *adv, *entropy, *lp_theta;
    int32_t *turn;      /* 1-based turn index at action tokens, 0 elsewhere */
    int32_t *routes;    /* (n_moe, T, k) stored routes, or NULL */
    int routes_ok;      /* routes present and valid for every fed token */
    int64_t n_fed;      /* tokens fed to the model (T minus trailing route-less tokens) */
    int32_t first_step; /* the first step whose turn the segment holds (the image cursor of a
                           fresh start, rollout/media.h ro_media_fresh) */
    int has_media;      /* placeholders in its context (images the environment sent) */
    int64_t n_media;    /* <|media_pad|> tokens of the segment, sampled ones included */
    int64_t *media_idx; /* (n_media) row of the trajectory's image rows for each, in order,
                           -1 for a sampled one; NULL when the trajectory's images are not
                           rebuilt (all fed as plain tokens); owned */
    int64_t shared_start; /* > 0: positions [0, shared_start) are the update's shared prefix,
                             whose state each pass computes once and imports (first segments
                             only, see "Shared prompt prefix"); 0: fed from position 0 */
    arl_loss_seg_mask mk;
} arl_upd_seg;

typedef struct arl_upd_traj {
    int32_t group, member;
    int32_t shard_id;
    int64_t traj_id;
    replay_traj_row row;
    int valid; /* complete or truncated, and loadable */
    int keep_states; /* its pi_old states go into the store (learner/states.c) */
    int local;
    int32_t seg0, n_segs; /* its segments in the batch */
    int64_t n_tokens, n_action;
    /* reward inputs and outputs (local valid trajectories) */
    arl_reward_turn *turns; /* (K) */
    int32_t n_turns;
    double *proc, *segr, *outc; /* (K, ncP), (S, ncS), (ncO) */
    uint8_t *seg_unscorable;    /* (S) the segment's score said scorable:false */
    int outc_unscorable;        /* the episode's score said scorable:false */
    double outc_subst;          /* then the outcome the client stored (range_lo) */
    double *seg_mc;    /* (S) segment_baseline mc: mean G^S over the forks at each segment's start;
                          NaN where none (NULL when the baseline is loo) */
    int32_t *seg_mc_n; /* (S) the forks each seg_mc averages */
    double *adv_turn;           /* (K) */
    /* the advantage terms of spec/objective.md 5.6-5.8 that the learner_records' levels_json
     * shows (learner/records.c): A~^S (S); A~^P, D and b^D (K); A~^O */
    double *lv_seg, *lv_proc, *lv_kl, *lv_klb;
    double lv_outcome;
    char **anchors;             /* (K) owned strings or NULL */
    double inv_norm;
    struct lr_media *media; /* its observation images (learner/media.c), NULL without context
                               placeholders; owned */
    int media_bad;          /* placeholders the stored images cannot explain: not trained */
    char media_error[200];  /* why, when media_bad */
} arl_upd_traj;

typedef struct arl_upd_group {
    int64_t group_id;
    int32_t source;
    int32_t size;
    int local;
    int32_t traj0, n_trajs; /* members in the batch */
    uint8_t level_absent[ARL_REWARD_NLEVELS];
    uint8_t process_model[ARL_REWARD_MAX_COMPONENTS]; /* arl_reward_group.process_model */
    double outcome_hi; /* top of the declared outcome range (successes) */
    double outcome_lo; /* its bottom (range_lo, spec/objective.md 4.3) */
    char env_name[64];
} arl_upd_group;

typedef struct arl_update_batch {
    arl_upd_group *groups;
    int32_t n_groups;
    arl_upd_traj *trajs;
    int32_t n_trajs;
    arl_upd_seg *segs;
    int32_t n_segs;
    int64_t n_valid;  /* valid trajectories of the update (all ranks) */
    int64_t n_action; /* action tokens of valid trajectories (all ranks) */
    double beta;      /* the KL reward's coefficient in this update (spec/objective.md 5.7) */
} arl_update_batch;

void arl_update_batch_free(arl_update_batch *b); /* NULL-safe; zeroes */

/* ------------------------------------------------------------------------------------------ */
/* The learner                                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_learner arl_learner;

/* Everything the learner works on; all pointers are borrowed and must outlive the learner. */
typedef struct arl_learner_init {
    const arl_model_config *cfg;
    arl_model_params *params;           /* the policy (theta), updated in place */
    const arl_model_params *ref_params; /* the frozen reference, never written */
    arl_adamw *opt;                     /* the optimizer (its config and moments) */
    arl_klctl *kl;                      /* the KL controller */
    const arl_reward_config *reward;
    const arl_loss_config *loss;
    const arl_learner_config *lc;
    arl_dist *dist; /* NULL: one process */
} arl_learner_init;

/* Allocate the models (policy and reference workspaces), the training arena, the gradient
 * arena, the decode state and the router-score buffers.  ARL_ERR_NOMEM names the size. */
arl_status arl_learner_create(arl_learner **out, const arl_learner_init *in);
void arl_learner_free(arl_learner *l); /* NULL-safe */

/* Test hook: called after the pi_old and reference passes, before the advantages (e.g. to
 * replace cached states).  NULL: none. */
typedef void (*arl_learner_hook_fn)(void *ctx, arl_learner *l);
void arl_learner_set_hook(arl_learner *l, arl_learner_hook_fn fn, void *ctx);

/* Test hook: called after minibatch mb's gradient pass, with its gradient in grads (before the
 * all-reduce and the optimizer step).  NULL: none. */
typedef void (*arl_learner_grad_hook_fn)(void *ctx, arl_learner *l, int32_t mb,
                                         const arl_model_params *grads);
void arl_learner_set_grad_hook(arl_learner *l, arl_learner_grad_hook_fn fn, void *ctx);

/* For finite differences in tests, from a grad hook: the loss of minibatch mb (the sum of its
 * segments' terms, learner/loss.h arl_loss_seg_step) at the parameters as they are now (the
 * caller may have changed them), forward only.  Changes no gradient, optimizer or router-score
 * state; the segments' lp_theta are overwritten. */
arl_status arl_learner_minibatch_loss(arl_learner *l, int32_t mb, double *loss);

/* The state cache and the batch of the last (or running) update; valid until the next update
 * or arl_learner_free. */
arl_state_cache *arl_learner_cache(arl_learner *l);
const arl_update_batch *arl_learner_batch(const arl_learner *l);

/* After arl_learner_update(l, n, src, n_src) succeeded: the learner_records of spec/replay.md
 * 4.13, one per segment of this rank's valid trajectories, each into the learner file
 * shards[si] of its source's store (replay_writer_open REPLAY_FILE_LEARNER with that id: 0
 * registers a new one; the caller gives each learner rank its own, and the same one again
 * when an update is re-run, whose rows then replace the interrupted attempt's).  Per token:
 * l_old, l_ref, the advantage, and for action tokens the truncated IS weight w and the flags
 * of the loss at the segment's last gradient pass; per segment: staleness, mean log-ratio,
 * mask reason and levels_json (A~^O, A~^S, and per turn A~^P, D, b^D, A; beta).  *n_records
 * receives the rows written.  The store's errors (nothing is changed in the learner). */
arl_status arl_learner_records_write(const arl_learner *l, int64_t n, const arl_update_source *src,
                                     int32_t n_src, const int32_t *shards, int64_t *n_records);

/* The GC of a learner's states file by its writer (spec/replay.md 7.6), between updates (it
 * reads every state row of the file: never in an update's passes): replay_states_retain with
 * state_cache.learner = keep (ARL_LEARNER_KEEP_*: off, pinned, all; 9.3), budget_bytes
 * (state_cache.budget_bytes; <= 0: none) and garbage over an hour old.  A line in the log when
 * states were evicted; *out (may be NULL) receives the counts.  The store's errors, naming the
 * file; nothing is changed in w but its states file. */
arl_status arl_learner_states_gc(replay_writer *w, int keep, int64_t budget_bytes,
                                 replay_gc_stats *out);

/* The writer of learner file shard_id of st (replay_writer_open REPLAY_FILE_LEARNER; 0
 * registers a new one) with the GC at its open (arl_learner_states_gc): what keep-states
 * passes the update as arl_update_source.states_out.  *out is the caller's (close with
 * replay_writer_close); NULL on error, nothing left open. */
arl_status arl_learner_states_open(replay_store *st, int32_t shard_id, int keep,
                                   int64_t budget_bytes, replay_writer **out);

/* What one update did, besides its metrics. */
typedef struct arl_update_result {
    int64_t n_groups, n_valid, n_masked;
    int64_t action_tokens; /* action tokens of valid trajectories */
    int64_t tokens;        /* tokens of valid trajectories */
    double kl_hat;         /* KL_n (NaN: none) */
    double kl_coef_next;   /* c_{n+1} */
    double loss;           /* loss/total */
    double seconds;
    int64_t states_saved; /* segment-end states written (keep-states, learner/states.c) */
    char *metrics_json; /* compact JSON object of every metric; malloc'ed, caller frees */
} arl_update_result;

/* Update n over the groups of the sources (in source order, then group order).  Every learner
 * rank calls it with the same sources.  On error nothing about the parameters is guaranteed
 * (the caller reloads its checkpoint). */
arl_status arl_learner_update(arl_learner *l, int64_t n, const arl_update_source *src,
                              int32_t n_src, arl_update_result *res);

#endif
