/* policy/model_device_backward.h: the training step of the policy on a device ("cpu" or
 * "cuda", policy/model_device.h): the forward that keeps what the backward needs, the
 * backward of the whole model, and AdamW with global-norm clipping, over the kernel table and
 * the arl_dev_ops table.
 *
 * What this is: policy/model_backward.c (arl_model_train_forward, arl_model_backward,
 * arl_model_loss_and_grad) and policy/optimizer.c (arl_adamw_step) op for op over the tables,
 * for batches of fresh documents (packed, ragged, forced routes), or of documents continuing
 * the model's decode-state slots (segment-wise training, below).  Gradients (fp32, the layout
 * of policy/params.h), the AdamW moments and the saved activations live in one device block
 * taken at init from the model's device (sized from its max_tokens / max_docs); a step
 * allocates nothing on the device.  The fp32 weights of the model are the master weights: the
 * step updates them in place and refreshes the bf16 copies (bf16_weights) after it; under the
 * bf16 math mode the training forward's weight GEMMs read the copies (the backward's the
 * masters), as the model's other forwards do.  With the "cpu" ops every call is the one the
 * CPU reference makes, in the same order, so loss, gradients, moments and updated weights are
 * bit-identical to the reference (tested).
 * Segment-wise training (policy/model_backward.h): arl_model_dev_train_forward_state starts
 * document i from the model's slot slots[i] (policy/model_device.h: KDA states and conv tails,
 * MLA latent rows; position 0 = a fresh start) and advances the slot as
 * arl_model_dev_forward_state does; the initial state is a constant input of the segment.
 * arl_model_dev_backward_state also returns the gradient of each document's state before the
 * segment from that after it, in state-gradient slots owned by the train object (one per
 * model slot, same ids; arl_model_dev_state_grads_init), moved to and from host
 * arl_decode_states (the learner's gradient states) with arl_model_dev_state_grad_upload /
 * _download.  With the "cpu" ops bit-identical to arl_model_train_forward(st, slots) /
 * arl_model_backward(dstate) (tested).  Block-sparse MLA (spec 4.5) trains as
 * policy/mla_layer_backward.c: always the absorbed form, each (token, head)'s selected chunks
 * kept for the backward (ops mla_sparse_fwd_save / mla_sparse_bwd, one document per call).
 * The training forward returns the router scores and expert loads Quantile Balancing reads;
 * the QB bias update itself (policy/optimizer.h arl_qb_update) runs on the host over them.
 * Images: the training forward takes image rows for the placeholders (b->media, encoded by the
 * caller) and arl_model_dev_backward_media returns their gradient; the vision tower itself runs
 * on the host (policy/vision.h).
 * Activation checkpointing (dopts.train_checkpoint of the model): the forward keeps each
 * layer's input only (and the MoE layers' router scores and routes) in one shared record, and
 * the backward recomputes each layer into it before its backward - the same kernels on the same
 * inputs, so the same bits as without (tested).
 * What this is not: gradient all-reduce.
 *
 * Symbols: T tokens, N documents, d width, V vocabulary, L layers, k experts per token.
 * An arl_model_dev_train is used by one thread at a time.
 */
#ifndef ARL_POLICY_MODEL_DEVICE_BACKWARD_H
#define ARL_POLICY_MODEL_DEVICE_BACKWARD_H

#include <stdint.h>

#include "core/status.h"
#include "policy/model_device.h"
#include "policy/optimizer.h"

typedef struct arl_model_dev_train {
    arl_model_dev *m;      /* borrowed: must outlive this (its weights are the masters) */
    arl_optim_config ocfg; /* shallow copy; ocfg.qb_method is the caller's (never read) */
    int64_t step;          /* optimizer steps taken */
    int32_t n_res;         /* AttnRes block entries + 1 */
    int64_t logit_rows;    /* rows of logits per block (as policy/model_backward.c) */
    void *arena;           /* the device block, owned */
    size_t arena_token;
    int64_t arena_floats;
    arl_model_params g;   /* gradient view (DEVICE pointers) over grads */
    float *grads;         /* (weight_floats) */
    float *mom_m, *mom_v; /* (weight_floats) AdamW moments */
    void *layers;         /* (L) per-layer saved activations (device pointers); owned host table */
    float *tails0;        /* (n_kda, max_docs, 3, P, W-1) the initial conv tails of a state forward
                             (models with slots only; in the arena) */
    float *S0;            /* (n_kda, max_docs, H, dk, dv) its initial KDA states (checkpointing
                             with slots only; in the arena) */
    float *pnew_scr;      /* (T, d) a recomputed layer's block sum (checkpointing only) */
    /* state gradients (arl_model_dev_state_grads_init; NULL/0 until then): a second device
     * block, valid until arl_model_dev_train_free */
    void *garena;
    size_t garena_token;
    float *g_kda;   /* (n_kda, n_slots, H*dk*dv + 3*P*(W-1)) gradients of S, then of the tails */
    float *g_lat;   /* (n_mla, n_slots, max_context, rkv + r) gradients of the latent rows */
    int64_t *g_pos; /* (n_slots) host: position of each gradient slot; owned */
    /* named device buffers inside the arena, valid until arl_model_dev_train_free
     * (T = max_tokens) */
    float *res;              /* (n_res, T, d) */
    float *layer_in;         /* (L, T, d) */
    float *fin, *xf;         /* (T, d) */
    float *rstd_f, *lse;     /* (T) */
    float *logp, *dlogp;     /* (T) */
    float *logits, *dlogits; /* (logit_rows, V) */
    float *ybuf;             /* (T, d) */
    float *d_res;            /* (n_res - 1, T, d) */
    float *dp, *dx, *dmix;   /* (T, d) */
    float *mix_ws;           /* attnres backward work buffer */
    float *ws;               /* sublayer work buffer */
    int64_t ws_floats;
    double *sumsq;   /* (n_chunks) device: per-chunk gradient sums of squares */
    int64_t *ranges; /* (n_chunks, 2) device: the chunks */
    /* host tables of the optimizer (policy/optimizer.c chunking and rules); owned */
    int64_t n_chunks;
    int64_t *chunk_tensor; /* (n_chunks) tensor of each chunk */
    double *sumsq_host;    /* (n_chunks) */
    int64_t n_runs;        /* contiguous trained ranges with one decay rule */
    int64_t *run_begin, *run_len;
    int32_t *run_decay;
    const char **tensor_name; /* (inventory n) names (pointers into name_pool); owned */
    char *name_pool;
    float *dlogp_host;     /* (T) */
    int32_t *targets_host; /* (T) */
    float *logp_host;      /* (T) */
    float *media_host;     /* (T, d) staging of image-row gradients (models with a vision
                              tower), or NULL */
    /* the last forward */
    int32_t fwd_done;
    int64_t fwd_T;
    int32_t fwd_N;
    int32_t fwd_state;  /* 1: from slots */
    int32_t fwd_forced; /* 1: with forced routes (still in the model's buffer) */
    int32_t *fwd_slots; /* (max_docs) host: its slots; owned */
    int64_t *fwd_pos0;  /* (max_docs) host: their positions before it; owned */
} arl_model_dev_train;

/* Set up training of model m (borrowed; its weights become the master weights) with the
 * optimizer settings oc (checked with arl_optim_config_check; qb_method ignored).  Takes one
 * block of the model's device for gradients, moments and activations.  Errors:
 * ARL_ERR_UNSUPPORTED when the device lacks a training op, ARL_ERR_NOMEM naming the bytes,
 * ARL_ERR_CONFIG from the optimizer settings. */
arl_status arl_model_dev_train_init(arl_model_dev_train *tr, arl_model_dev *m,
                                    const arl_optim_config *oc);
void arl_model_dev_train_free(arl_model_dev_train *tr); /* NULL is a no-op */

/* Bytes arl_model_dev_train_init takes from the device for model m (an initialised model, or
 * one from arl_model_dev_plan).  A model with decode slots adds the buffers of the state
 * forward: the initial conv tails, per-document state buffers, and the absorbed MLA core's
 * work buffer (mla_abs_train_ws_floats of max_context rows: ~2 x 16 x Hm x max_context floats
 * on "cuda", Hm x 64 x max_context on "cpu"; set max_context to the longest sequence trained). */
int64_t arl_model_dev_train_bytes(const arl_model_dev *m);

/* Gradients = 0. */
arl_status arl_model_dev_zero_grad(arl_model_dev_train *tr);

/* The training forward over fresh documents (arl_model_train_forward with st = NULL):
 * b->targets (or NULL: no log-probabilities), forced routes; out (may be NULL): host
 * logprobs, routes, router_scores (n_moe, T, E) and expert_load (n_moe, E); logits, entropy
 * and acts must be NULL (ARL_ERR_UNSUPPORTED).  Errors as arl_model_dev_forward. */
arl_status arl_model_dev_train_forward(arl_model_dev_train *tr, const arl_batch *b,
                                       const arl_forward_out *out);

/* The training forward from decode states (arl_model_train_forward with st, slots): document
 * i continues the model's slot slots[i] (HOST array of N distinct slots in [0, n_slots);
 * position 0 = a fresh start), whose state is read and advanced as
 * arl_model_dev_forward_state does.  The slots' rows must not change until the backward (the
 * next forward of the model may change them).  Errors as arl_model_dev_train_forward, plus
 * ARL_ERR_STATE for a slot out of range or repeated, ARL_ERR_RANGE past max_context,
 * ARL_ERR_UNSUPPORTED on a device without the state-training ops. */
arl_status arl_model_dev_train_forward_state(arl_model_dev_train *tr, const arl_batch *b,
                                             const int32_t *slots, const arl_forward_out *out);

/* Backward of loss = sum_t dlogp[t] log pi(b->targets[t]) (dlogp: HOST (T)) for the last
 * forward over the same batch (fresh or from states): gradients +=.  Errors: ARL_ERR_STATE
 * without a forward, ARL_ERR_ARG for another batch shape or missing targets. */
arl_status arl_model_dev_backward(arl_model_dev_train *tr, const arl_batch *b, const float *dlogp);

/* arl_model_dev_backward of a batch with image rows (b->media, placed by the forward in place of
 * the <|media_pad|> placeholders, spec 10.1): their gradient is added to dmedia (n_media, d,
 * HOST; NULL drops it), and the placeholders' embedding row gets none (as
 * arl_model_backward's d_media, policy/model_backward.h). */
arl_status arl_model_dev_backward_media(arl_model_dev_train *tr, const arl_batch *b,
                                        const float *dlogp, float *dmedia);

/* arl_model_dev_backward after arl_model_dev_train_forward_state, with the state gradients
 * (arl_model_backward with dstate): on entry the state-gradient slot of each document's slot
 * must be at position pos_i + len_i and hold the gradient of its state after the segment
 * (zeros: arl_model_dev_state_grad_prepare); on return it is at pos_i and holds the gradient
 * of the state before it (KDA S and tails; MLA rows [0, pos_i) +=).  Errors as
 * arl_model_dev_backward, plus ARL_ERR_ARG after a fresh forward, ARL_ERR_STATE without
 * state-gradient slots or for a slot at another position. */
arl_status arl_model_dev_backward_state(arl_model_dev_train *tr, const arl_batch *b,
                                        const float *dlogp);

/* Take the state-gradient slots (one per slot of the model, all zero at position 0): one more
 * device block of n_kda * n_slots * (H*dk*dv + 3*P*(W-1)) + n_mla * n_slots * max_context *
 * (rkv + r) floats, released by arl_model_dev_train_free (call it right after
 * arl_model_dev_train_init: "cuda" blocks are released in stack order).  A second call does
 * nothing.  Errors: ARL_ERR_STATE for a model without slots, ARL_ERR_NOMEM naming the bytes. */
arl_status arl_model_dev_state_grads_init(arl_model_dev_train *tr);
/* Gradient slot `slot` = 0 at `position` (arl_state_grad_prepare).  ARL_ERR_RANGE for a slot
 * or position out of range, ARL_ERR_STATE without state-gradient slots. */
arl_status arl_model_dev_state_grad_prepare(arl_model_dev_train *tr, int32_t slot,
                                            int64_t position);
/* Position of a gradient slot (-1 for none). */
int64_t arl_model_dev_state_grad_pos(const arl_model_dev_train *tr, int32_t slot);
/* Host gradient state g slot hslot (active; policy/state.h layout) -> gradient slot `slot`:
 * S and tail gradients, rows [0, pos), the position; and back (rows reserved in g as needed).
 * ARL_ERR_SHAPE for a state of another config, ARL_ERR_RANGE past max_context. */
arl_status arl_model_dev_state_grad_upload(arl_model_dev_train *tr, int32_t slot,
                                           const arl_decode_state *g, int32_t hslot);
arl_status arl_model_dev_state_grad_download(arl_model_dev_train *tr, int32_t slot,
                                             arl_decode_state *g, int32_t hslot);

/* arl_model_loss_and_grad on the device: *loss = mean next-token NLL over the target
 * positions (targets: b->targets or the next token inside each document), gradients +=. */
arl_status arl_model_dev_loss_and_grad(arl_model_dev_train *tr, const arl_batch *b, double *loss);

/* arl_adamw_step on the device: global norm (policy/optimizer.c chunk order), clipping, decay,
 * moments, update of the master weights, bf16 copies refreshed.  A non-finite norm is
 * ARL_ERR_RANGE naming the first tensor with a non-finite chunk; nothing changes then. */
arl_status arl_model_dev_optim_step(arl_model_dev_train *tr, arl_optim_report *rep);

/* One whole step: zero the gradients, loss_and_grad, optim_step. */
arl_status arl_model_dev_train_step(arl_model_dev_train *tr, const arl_batch *b, double *loss,
                                    arl_optim_report *rep);

/* Copies to host arenas of weight_floats floats: the gradients, the master weights, the
 * moments (m, v; either may be NULL). */
arl_status arl_model_dev_grads_download(const arl_model_dev_train *tr, float *host);
arl_status arl_model_dev_params_download(const arl_model_dev_train *tr, float *host);
arl_status arl_model_dev_moments_download(const arl_model_dev_train *tr, float *m, float *v);
/* The other way, with the optimizer's step count (a host optimizer's state, policy/optimizer.h
 * arl_adamw: a resumed run's moments continue on the device). */
arl_status arl_model_dev_moments_upload(arl_model_dev_train *tr, const float *m, const float *v,
                                        int64_t step);

#endif
