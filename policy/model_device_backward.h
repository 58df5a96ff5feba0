/* policy/model_device_backward.h: the training step of the policy on a device ("cpu" or
 * "cuda", policy/model_device.h): the forward that keeps what the backward needs, the
 * backward of the whole model, and AdamW with global-norm clipping, over the kernel table and
 * the arl_dev_ops table.
 *
 * What this is: policy/model_backward.c (arl_model_train_forward, arl_model_backward,
 * arl_model_loss_and_grad) and policy/optimizer.c (arl_adamw_step) op for op over the tables,
 * for batches of fresh documents (packed, ragged, forced routes).  Gradients (fp32, the layout
 * of policy/params.h), the AdamW moments and the saved activations live in one device block
 * taken at init from the model's device (sized from its max_tokens / max_docs); a step
 * allocates nothing on the device.  The fp32 weights of the model are the master weights: the
 * step updates them in place and refreshes the bf16 copies (bf16_weights) after it.  With the
 * "cpu" ops every call is the one the CPU reference makes, in the same order, so loss,
 * gradients, moments and updated weights are bit-identical to the reference (tested).
 * What this is not: documents continuing a decode state (segment-wise training),
 * checkpointing (recomputation), images, the QB router-bias update (policy/optimizer.h
 * arl_qb_update: scores are not returned by the device forward yet), gradient all-reduce.
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
    /* the last forward */
    int32_t fwd_done;
    int64_t fwd_T;
    int32_t fwd_N;
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
 * one from arl_model_dev_plan). */
int64_t arl_model_dev_train_bytes(const arl_model_dev *m);

/* Gradients = 0. */
arl_status arl_model_dev_zero_grad(arl_model_dev_train *tr);

/* The training forward over fresh documents (arl_model_train_forward with st = NULL):
 * b->targets (or NULL: no log-probabilities), forced routes; out (may be NULL): host
 * logprobs and routes only (others must be NULL).  Errors as arl_model_dev_forward. */
arl_status arl_model_dev_train_forward(arl_model_dev_train *tr, const arl_batch *b,
                                       const arl_forward_out *out);

/* Backward of loss = sum_t dlogp[t] log pi(b->targets[t]) (dlogp: HOST (T)) for the last
 * forward over the same batch: gradients +=.  Errors: ARL_ERR_STATE without a forward,
 * ARL_ERR_ARG for another batch shape or missing targets. */
arl_status arl_model_dev_backward(arl_model_dev_train *tr, const arl_batch *b, const float *dlogp);

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

#endif
