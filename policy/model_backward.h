/* policy/model_backward.h: training the policy on the CPU, fp32 - the forward that keeps what
 * a backward needs, and the backward of the whole model (spec/policy.md 2-8, backward sections
 * 3.7-3.9, 4.3, 5.3, 5.4, 6.2, 7.3, 8), over a packed batch of documents that start fresh or
 * continue a decode state (segment-wise training).
 *
 * What this is: the composition of the layer backwards (policy/kda_layer_backward.h,
 * policy/mla_layer_backward.h, policy/moe_backward.h) with the AttnRes bookkeeping of 5.4, the
 * norms, the embedding and the lm_head with its log-softmax.  The loss is a caller-given
 * weighting of per-token target log-probabilities: loss = sum_t dlogp[t] * log pi(target_t),
 * so d loss / d logp is the input - SFT's mean NLL (dlogp = -1/count) and an RL objective's
 * per-token coefficients both plug in.
 *
 * Memory: one activation arena, sized from the model's settings (max_tokens, max_docs, the MLA
 * rows of max_context) and the training options, bound once; a step allocates nothing.  With
 * `checkpoint` set only each layer's input is kept (plus the AttnRes block entries, routes and
 * the initial decode state of each KDA layer) and the backward recomputes every layer's
 * internals from its input with the same code, so the gradients are bit-identical to those
 * without checkpointing.  The absorbed MLA attention's score buffers grow with the model's
 * max_context (rows one sequence may attend over): set it to the longest sequence trained
 * from a decode state, not to max_position_embeddings, on large models.  With block-sparse
 * MLA (the model's mla_sparse_topk > 0, spec 4.5) every document runs the absorbed form over
 * its selected chunks only (policy/mla_layer_backward.h), the same setting as the model's
 * forward: no O(max_context) score buffers, cost per query O((k_c + 1) n_c).
 *
 * Segment-wise training (spec 3.6, 4.2, 11): a document may continue the sequence of a decode
 * state slot.  Its initial state - KDA S and conv tails, the MLA latent rows of earlier
 * tokens - is a constant input of the segment: the gradient stops at the boundary, while
 * parameters that act on the state inside the segment (the conv weights on the tail inputs,
 * W_kvb on earlier latent rows, the KDA decays on S) receive their gradient from it.  The
 * forward advances the state like arl_model_forward_state, so consecutive segments of a long
 * sequence train in memory proportional to the segment length (plus the MLA rows, which grow).
 * On request the backward also returns the gradient of the initial state given the gradient of
 * the final one (a second decode state used as gradient storage), which makes exact
 * backpropagation across segments possible (backward in reverse segment order).
 *
 * What this is not: the optimizer (policy/optimizer.h), the vision tower's backward
 * (policy/vision_backward.h: it takes the image-token gradient this backward returns).
 *
 * Symbols: T tokens of a batch, N documents, d width, V vocabulary, L layers, n_moe MoE layers,
 * k experts per token.  Threads and determinism as policy/model.h: for a fixed thread count
 * gradients are bit-identical run to run.  An arl_model_train is used by one thread at a time.
 */
#ifndef ARL_POLICY_MODEL_BACKWARD_H
#define ARL_POLICY_MODEL_BACKWARD_H

#include <stdint.h>

#include "core/status.h"
#include "policy/kda_layer_backward.h"
#include "policy/mla_layer_backward.h"
#include "policy/model.h"
#include "policy/moe_backward.h"
#include "policy/state.h"

typedef struct arl_train_opts {
    int32_t checkpoint;        /* 1: recompute each layer's internals in the backward (0) */
    int32_t max_state_docs;    /* most documents of a batch that continue a decode state
                                  (their initial KDA states are kept); 0 = max_docs (0) */
    int32_t kda_recurrent_bwd; /* 1: the recurrent KDA rule 3.7 (a reference); 0: 3.8 (0) */
    int32_t mla_absorbed;      /* 1: absorbed MLA attention also for fresh documents (0) */
} arl_train_opts;

void arl_train_opts_default(arl_train_opts *o);

/* One layer's kept intermediates (pointers into the arena). */
typedef struct arl_layer_rec {
    float *h;     /* (T, d) the pre-mixer AttnRes mix */
    float *x1;    /* (T, d) RMSNorm_in of it */
    float *rstd1; /* (T) */
    float *p_mid; /* (T, d) p after the mixer */
    float *mfx;   /* (T, d) the pre-FFN mix */
    float *x2;    /* (T, d) RMSNorm_post of it */
    float *rstd2; /* (T) */
    arl_kda_layer_save kda;
    arl_mla_layer_save mla;
    arl_dense_save dense;
    arl_moe_save moe;
} arl_layer_rec;

typedef struct arl_model_train {
    arl_model *m; /* borrowed: must outlive this; its cfg, params and settings are used,
                     its workspace is not */
    arl_train_opts opts;
    int32_t n_res;   /* AttnRes block entries + 1 (1 without AttnRes) */
    int32_t n_state; /* max_state_docs resolved */
    float *arena;    /* owned iff owns_arena */
    int32_t owns_arena;
    int64_t arena_floats;
    /* named buffers (T = max_tokens, N = max_docs) */
    float *res;          /* (n_res, T, d) AttnRes block entries, then p */
    float *layer_in;     /* (L, T, d) p at the start of every layer */
    int32_t *routes;     /* (n_moe, T, k) routes used by the forward */
    float *state0;       /* per KDA layer (n_state, H*dk*dv + 3*P*(W-1)): initial states */
    arl_layer_rec *recs; /* (L) keep mode, (1) with checkpointing; owned */
    float *fin;          /* (T, d) the final mix */
    float *xf;           /* (T, d) RMSNorm_final of it */
    float *rstd_f;       /* (T) */
    float *lse;          /* (T) log-sum-exp of every logits row */
    int32_t *targets;    /* (T) next-token targets of the convenience functions */
    float *logp;         /* (T) target log-probabilities when the caller keeps none */
    float *dlogp;        /* (T) d loss / d logp of the convenience functions */
    float *logits;       /* (rows, V) a row block of logits */
    float *dlogits;      /* (rows, V) */
    int64_t logit_rows;
    float *ybuf;             /* (T, d) a sublayer output */
    float *p_scr, *pnew_scr; /* (T, d) recomputation copies of p */
    float *S_scr;            /* (n_state, H, dk, dv) states of one KDA layer */
    float *tails_scr;        /* (n_state, 3, P, W-1) */
    float *ws;               /* sublayer work buffer */
    int64_t ws_floats;
    float *d_res;              /* (n_res - 1, T, d) gradients of the block entries */
    float *dp, *dx, *dmix;     /* (T, d) */
    double *mix_ws;            /* (T, 2 n_res) work buffer of the AttnRes mix backward */
    float *dS_T, *dS0;         /* (n_state, H, dk, dv) state gradients of one KDA layer */
    float *dtails_T, *dtails0; /* (n_state, 3, P, W-1) */
    float *dlat_T;             /* (T, R) */
    /* what the last forward saw */
    int32_t fwd_done;
    int64_t fwd_T;
    int32_t fwd_N;
    arl_decode_state *fwd_st; /* borrowed from the forward call, or NULL */
    int32_t *slots;           /* (N) the forward's slots; owned */
    int64_t *pos0;            /* (N) positions the documents started at; owned */
    float **caches;           /* (N) MLA rows of one layer; owned pointer table */
    float **dprefix;          /* (N) */
} arl_model_train;

/* Floats of the activation arena for a model (its settings) and the options (NULL: default). */
int64_t arl_model_train_arena_floats(const arl_model *m, const arl_train_opts *o);

/* Set up training over model m (borrowed).  arena: arl_model_train_arena_floats floats the
 * caller owns and keeps while tr lives, or NULL to allocate (freed by arl_model_train_free).
 * Errors: ARL_ERR_ARG for bad options, ARL_ERR_NOMEM naming the size. */
arl_status arl_model_train_init(arl_model_train *tr, arl_model *m, const arl_train_opts *o,
                                float *arena);
void arl_model_train_free(arl_model_train *tr); /* NULL is a no-op */

/* Forward that keeps the activations for one backward.  st, slots: NULL for fresh documents;
 * else document i continues slot slots[i] of st (active, distinct; position 0 = a fresh
 * start), whose state is read and then advanced as arl_model_forward_state does.  b->targets
 * (or NULL: no log-probabilities) and forced routes as arl_model_forward.  out (may be NULL):
 * logits, logprobs, entropy, routes, expert_load, router_scores as arl_model_forward;
 * out->acts must be NULL.  Errors as arl_model_forward / arl_model_forward_state, plus
 * ARL_ERR_RANGE when more than max_state_docs documents continue a state. */
arl_status arl_model_train_forward(arl_model_train *tr, const arl_batch *b, arl_decode_state *st,
                                   const int32_t *slots, const arl_forward_out *out);

/* Backward of loss = sum_t dlogp[t] * log pi(b->targets[t]) for the last forward, over the same
 * batch b (same tokens, boundaries, targets, media).  dlogp (T); positions without a target
 * contribute nothing.  grads: an arl_model_params view over a gradient arena; every trained
 * tensor's gradient is ADDED (+=) (gate_bias never; zero the arena once per step).
 * The decode state given to the forward (if any) must not have changed in between (its rows
 * may have grown).
 * dstate: NULL, or a decode state of the same config used as gradient storage: on entry slot
 *   slots[i] holds, at position pos_i + len_i, the gradient of document i's state after the
 *   segment (zeros: none; arl_state_grad_prepare); on return it holds, at position pos_i, the
 *   gradient of the state before it.  Only after a forward from a state.
 * d_media: NULL, or (n_media, d) += the gradient of the image token rows b->media.
 * Errors: ARL_ERR_STATE without a matching forward; ARL_ERR_ARG for a batch that differs from
 * the forward's, a missing b->targets, or dstate without a state forward. */
arl_status arl_model_backward(arl_model_train *tr, const arl_batch *b, const float *dlogp,
                              const arl_model_params *grads, arl_decode_state *dstate,
                              float *d_media);

/* Forward and backward of scale * (sum over target positions of -log pi(target)): grads +=
 * its gradient, *nll_sum = the sum (double).  Targets: b->targets, or (NULL) the next token
 * inside each document (arl_batch_next_token_targets).  st, slots, out as
 * arl_model_train_forward (out->logprobs etc. may be requested). */
arl_status arl_model_nll_grad(arl_model_train *tr, const arl_batch *b, arl_decode_state *st,
                              const int32_t *slots, double scale, const arl_model_params *grads,
                              double *nll_sum, const arl_forward_out *out);

/* Mean next-token NLL of a batch of fresh documents and its gradient (grads +=): *loss =
 * mean over target positions of -log pi(target) (targets as arl_model_nll_grad). */
arl_status arl_model_loss_and_grad(arl_model_train *tr, const arl_batch *b,
                                   const arl_model_params *grads, double *loss);

/* Write the gradient arena behind grads (an arl_model_params view) as one safetensors file at
 * path: every tensor of the inventory under its checkpoint key, F32, in checkpoint shape (A_log
 * zero-padded to ceil(H/128)*128, spec 14.3), tensors without a gradient as their zeros.
 * what (may be NULL) is stored as the metadata "content".  The file is replaced atomically.
 * Errors: ARL_ERR_IO naming the path, ARL_ERR_NOMEM. */
arl_status arl_model_grads_save(const char *path, const arl_model_params *grads, const char *what);

/* Make slot `slot` of a gradient state g active at `position` with every gradient zero
 * (before the backward of a sequence's last segment).  Errors as arl_decode_state_reserve. */
arl_status arl_state_grad_prepare(arl_decode_state *g, int32_t slot, int64_t position);

#endif
