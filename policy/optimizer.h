/* policy/optimizer.h: AdamW over the parameter arena -- decoupled weight decay, bias
 * correction, fp32 master weights and moments, global-norm gradient clipping, the warmup +
 * cosine learning-rate schedule, and the once-per-step Quantile Balancing update of the
 * router biases (spec/policy.md section 9, math in policy/qb.h).
 *
 * What this is: the optimizer state (two moment arenas with the layout of
 * arl_model_params, bound with arl_model_params_view) and the update of one step.  What this
 * is not: gradients (the model's backward fills a gradient arena of the same layout), the
 * data-parallel all-reduce of gradients (learner/), saving the moments (policy/train_state.h).
 *
 * Update of step s (0-based; t = s + 1), per trained tensor, elementwise in fp32:
 *   lr_s  = arl_optim_lr(cfg, s)                          (warmup + cosine, below)
 *   c     = min(1, clip_norm / (||g|| + 1e-6))             (1 when clip_norm = 0 or ||g|| <= clip)
 *   g'    = c g
 *   p    -= lr_s * weight_decay * p                         (decoupled decay; decaying tensors
 * only) m     = beta1 m + (1 - beta1) g' v     = beta2 v + (1 - beta2) g'^2 p    -= (lr_s / (1 -
 * beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps) This is PyTorch's torch.optim.AdamW (decay
 * applied before the moment update, decay scaled by lr) with clip_grad_norm_'s coefficient.  ||g||
 * is the 2-norm over every trained tensor (no_grad tensors excluded), summed in a fixed order: each
 * tensor is cut into chunks of ARL_OPTIM_CHUNK floats, each chunk's squares are summed left to
 * right in double, and the chunk sums are added in inventory order -- bit-identical for any thread
 * count.
 *
 * Which tensors are trained and decayed (a rule on the inventory, arl_optim_tensor_rule):
 *   - no_grad tensors (the QB router bias e_score_correction_bias) are not trained at all:
 *     no moments, no decay, never written by the step;
 *   - weight decay applies to "matrices": Linear weights, embeddings and lm_head, expert banks,
 *     the router gate, vision patch embedding, position grid and projector -- every tensor with
 *     at least two dimensions of size > 1, EXCEPT the KDA short-convolution filters (P, 1, W);
 *   - no decay for vectors: RMSNorm weights, AttnRes w_norm and w_proj ((1, d) is a vector),
 *     A_log, dt_bias, and the conv filters.  The conv filters, A_log and dt_bias are the
 *     per-channel dynamics parameters of KDA (the fp32 class of section 1.4); pulling them to
 *     zero changes the recurrence (decay rate, step size, local mixing) rather than limiting a
 *     linear map's scale, so they are treated like biases.
 *
 * Schedule (step s, 0-based, W = warmup_steps, S = total_steps, r = min_lr_ratio):
 *   s < W:   lr (s + 1) / W
 *   else:    lr (r + (1 - r) (1 + cos(pi q)) / 2),  q = min(1, (s - W) / max(1, S - W))
 * so the first step already trains (lr/W), the peak is reached at s = W - 1 or W, and from
 * s = S on the rate stays at r lr.
 *
 * Determinism: a step is a pure function of (parameters, moments, gradients, step, config):
 * bit-identical across runs and thread counts (element updates are independent; the norm's
 * order is fixed above).
 */
#ifndef ARL_POLICY_OPTIMIZER_H
#define ARL_POLICY_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"
#include "policy/config.h"
#include "policy/params.h"

#define ARL_OPTIM_CHUNK 16384 /* floats per work item of the step and the norm */

/* Optimizer settings; every field is an option of arl_optim_options(). */
typedef struct arl_optim_config {
    double lr;            /* peak learning rate */
    double beta1, beta2;  /* moment decay rates */
    double eps;           /* denominator epsilon */
    double weight_decay;  /* decoupled decay coefficient (multiplied by lr) */
    double clip_norm;     /* global gradient-norm cap; 0 = no clipping */
    int64_t warmup_steps; /* linear warmup length W */
    int64_t total_steps;  /* schedule length S; 0 = the run's number of steps (the driver
                             replaces 0 before use; arl_optim_lr treats 0 as "no decay") */
    double min_lr_ratio;  /* final lr = min_lr_ratio * lr */
    char *qb_method;      /* router bias: "exact" (spec 9.2) | "histogram" (9.3) | "off" */
    int64_t qb_num_bins;  /* N_b of the histogram estimator */
    double qb_band_low;   /* spec 9.5 lambda_lo; with qb_band_high 0/0 = plain QB */
    double qb_band_high;  /* spec 9.5 lambda_hi */
} arl_optim_config;

/* The option table of arl_optim_config (keys "lr", "beta1", "beta2", "eps", "weight-decay",
 * "clip-norm", "warmup-steps", "total-steps", "min-lr-ratio", "qb-method", "qb-num-bins",
 * "qb-band-low", "qb-band-high"; offsets relative to the struct).  Static storage. *n set to
 * its length.  A driver embeds the struct in its own config and includes these entries with
 * their offsets shifted (as experiments/sft.c does). */
const arl_option *arl_optim_options(size_t *n);

/* Defaults of the table (strings owned by c; free with arl_optim_config_free).  ARL_ERR_NOMEM
 * when a string default cannot be copied (c is left cleared, safe to free). */
arl_status arl_optim_config_defaults(arl_optim_config *c);
void arl_optim_config_free(arl_optim_config *c); /* NULL-safe */

/* Cross-field checks: beta in [0, 1), eps > 0, warmup_steps <= total_steps when total_steps
 * > 0, a QB band only with qb_method "exact".  ARL_ERR_CONFIG naming the key. */
arl_status arl_optim_config_check(const arl_optim_config *c);

/* Learning rate of step s (0-based), schedule above. */
double arl_optim_lr(const arl_optim_config *c, int64_t step);

/* ---- per-tensor rule ---- */

enum {
    ARL_OPTIM_TRAIN = 1u << 0, /* trained by gradient (has moments) */
    ARL_OPTIM_DECAY = 1u << 1, /* weight decay applies */
};
/* ARL_OPTIM_* flags of one inventory tensor (rule in the file comment). */
unsigned arl_optim_tensor_rule(const arl_param_tensor *t);

/* ---- state ---- */

/* One work item: floats [begin, end) of the arena, inside tensor `tensor`. */
typedef struct arl_optim_chunk {
    int64_t tensor;
    int64_t begin, end;
} arl_optim_chunk;

typedef struct arl_adamw {
    arl_optim_config cfg;   /* deep copy, owned */
    arl_model_params m;     /* exp_avg: a view over m_arena (same layout as the parameters) */
    arl_model_params v;     /* exp_avg_sq: a view over v_arena */
    float *m_arena;         /* (inv.arena_floats), owned; zero at init */
    float *v_arena;         /* (inv.arena_floats), owned; zero at init */
    uint8_t *rule;          /* (inv.n) ARL_OPTIM_* flags per tensor, owned */
    arl_optim_chunk *chunk; /* (n_chunks) trained tensors' chunks in inventory order, owned */
    int64_t n_chunks;
    double *chunk_sumsq; /* (n_chunks) scratch of the norm, owned */
    int64_t step;        /* steps taken (the next step is `step`, 0-based) */
} arl_adamw;

/* Step report. */
typedef struct arl_optim_report {
    double grad_norm; /* global norm before clipping */
    double clip_coef; /* factor applied to the gradient (1 = not clipped) */
    double lr;        /* learning rate used */
    int64_t step;     /* the step just taken (0-based) */
} arl_optim_report;

/* Allocate zero moments for cfg's layout and copy c (checked with arl_optim_config_check;
 * total_steps 0 is kept as is).  model_cfg is borrowed and must outlive opt (the views
 * point at it).  ARL_ERR_NOMEM names the size. */
arl_status arl_adamw_init(arl_adamw *opt, const arl_model_config *model_cfg,
                          const arl_optim_config *c);
void arl_adamw_free(arl_adamw *opt); /* NULL-safe; zeroes opt */

/* Global 2-norm of the trained tensors of a gradient arena (fixed order above). */
double arl_adamw_grad_norm(arl_adamw *opt, const float *grad_arena);

/* One step: clip, decay, moments, update of every trained tensor of params (an arena of the
 * optimizer's layout) from grad_arena (read only; not scaled in place), then step++.
 * A non-finite gradient norm is ARL_ERR_RANGE naming the first tensor with a non-finite
 * gradient; nothing is changed (parameters, moments, step).  rep may be NULL. */
arl_status arl_adamw_step(arl_adamw *opt, arl_model_params *params, const float *grad_arena,
                          arl_optim_report *rep);

/* ---- Quantile Balancing of the router biases ---- */

/* Router scores of one optimizer step, pooled over its micro-batches, per decoder layer.
 * The model's training step appends the rows of its non-padding tokens (scores s, and the
 * selected experts sel for the banded variant); the trainer calls arl_qb_update once per step
 * after arl_adamw_step and then arl_router_scores_reset. */
typedef struct arl_router_scores {
    int64_t L, E, k; /* layers, experts, experts per token (from the config) */
    int64_t cap;     /* rows per layer */
    float *s;        /* (L, cap, E) sigmoid scores; layer l at s + l*cap*E; owned */
    int32_t *sel;    /* (L, cap, k) selected experts, aligned with s rows; owned */
    int64_t *m;      /* (L) rows filled this step (always 0 for dense layers) */
    uint8_t *is_moe; /* (L) 1 for MoE layers */
    float *ws;       /* (arl_qb_ws_floats(cap, E)) work buffer, owned */
    int64_t *counts; /* (max(E * qb_num_bins, E)) histogram / load scratch, owned */
    int64_t n_bins;  /* bins the counts buffer holds */
    float *bnew;     /* (E) the new bias before it is copied into the parameters, owned */
} arl_router_scores;

/* Buffers for up to cap tokens per step per layer, histogram scratch for n_bins bins. */
arl_status arl_router_scores_init(arl_router_scores *rs, const arl_model_config *cfg, int64_t cap,
                                  int64_t n_bins);
void arl_router_scores_free(arl_router_scores *rs);  /* NULL-safe */
void arl_router_scores_reset(arl_router_scores *rs); /* m[l] = 0 for every layer */
/* Room for T more rows in layer l: returns the row pointers (s: (T, E), sel: (T, k)) and
 * advances m[l], or ARL_ERR_FULL when cap would be exceeded. */
arl_status arl_router_scores_append(arl_router_scores *rs, int64_t l, int64_t T, float **s,
                                    int32_t **sel);

/* The QB hook: for every MoE layer with m[l] > 0, write the new e_score_correction_bias
 * into params (spec 9.2 with qb_method "exact", with the 9.5 band when set; 9.3 with
 * "histogram"); layers without tokens keep their bias.  qb_method "off" does nothing.
 * The bias is the one that routed this step's tokens (b_old), so call it exactly once per
 * step, after the step's forward passes. */
arl_status arl_qb_update(const arl_optim_config *c, arl_model_params *params,
                         arl_router_scores *rs);

#endif
