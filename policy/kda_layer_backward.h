/* policy/kda_layer_backward.h: training forward and backward of one KDA mixer layer on the CPU,
 * fp32 (spec/policy.md 3.1-3.4 forward, 3.7-3.9 backward).
 *
 * What this is: a forward that computes exactly what arl_kda_layer_fwd (policy/kda_layer.h)
 * computes - the same kernels in the same order, so the same bits - and keeps every
 * intermediate the backward needs in a caller-bound save area; and the backward of the whole
 * layer: output projection, gated output RMSNorm, output gate (full or low rank), the delta-rule
 * core (chunkwise rule of 3.8, or the recurrent rule of 3.7 as a second reference), beta, the
 * decay gate, L2Norm, the three short convolutions with SiLU and the q/k/v projections.
 * Documents may resume from a given state (spec 3.6): the initial state S0 and conv tails are
 * constant inputs of the segment; their gradients (dS0, dtails0) are computed on request, and a
 * gradient of the final state (dS_T, dtails_T) may be fed in (exact backpropagation across
 * segments).
 * What this is not: the residual stream or input norm (policy/model_backward.c), the stages
 * themselves (policy/kda.h), parameter storage (policy/params.h).
 *
 * Symbols: T tokens, N documents, d width, H heads, dk = dv head dims, P = H*dk, W conv taps,
 * C chunk length.  Layouts as policy/kda.h: S (N, H, dk, dv), tails (N, 3, P, W-1) (q, k, v
 * pre-conv inputs before each document, oldest first).
 * Conventions: the backward ACCUMULATES (+=) into dx, every parameter gradient and the state
 * gradients, like the kernels; work buffers come from the caller; nothing allocates.  Every
 * pointer is borrowed for the duration of the call.
 */
#ifndef ARL_POLICY_KDA_LAYER_BACKWARD_H
#define ARL_POLICY_KDA_LAYER_BACKWARD_H

#include <stdint.h>

#include "policy/kda_layer.h"
#include "policy/params.h"

/* What the forward keeps for the backward (pointers into the caller's save area). */
typedef struct arl_kda_layer_save {
    float *pre[3]; /* (T, P) pre-conv projections of q, k, v */
    float *z[2];   /* (T, P) conv + SiLU outputs of q and k, before L2Norm */
    float *qkv[3]; /* (T, P) q and k after L2Norm; v = the conv + SiLU output */
    float *rn[2];  /* (T, H) (sum z^2 + 1e-6)^-1/2 of q and k per head */
    float *fa;     /* (T, dk) W_fa x */
    float *f;      /* (T, P) W_fb W_fa x */
    float *g;      /* (T, P) log-decay */
    float *bl;     /* (T, H) beta logits */
    float *beta;   /* (T, H) */
    float *o;      /* (T, H*dv) core output */
    float *gam;    /* (T, H*dv) output gate logits */
    float *ga;     /* (T, dk) low-rank gate intermediate (unused with the full-rank gate) */
    float *rstd;   /* (T, H) output norm statistics */
    float *ob;     /* (T, H*dv) gated normalised output (input of o_proj) */
    float *cst;    /* (n_chunks, H, dk, dv) incoming state of every chunk */
    int64_t n_chunks;
} arl_kda_layer_save;

/* Floats of a save area for at most T tokens in at most N documents. */
int64_t arl_kda_layer_save_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N);
/* Point the fields of s into base (arl_kda_layer_save_floats(c, T, N) floats). */
void arl_kda_layer_save_bind(arl_kda_layer_save *s, const arl_kda_layer_cfg *c, int64_t T,
                             int32_t N, float *base);

/* Floats of work buffer for arl_kda_layer_fwd_save and arl_kda_layer_bwd. */
int64_t arl_kda_layer_train_ws_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N);

/* y (T, d) = the KDA mixer of x (T, d), as arl_kda_layer_fwd (chunkwise core): cu, S and tails
 * as there (S, tails NULL: fresh documents; else updated to the final state).  sv receives
 * the intermediates (bound for at least T tokens and N documents).  ws: train ws floats. */
void arl_kda_layer_fwd_save(float *y, const float *x, const arl_kda_params *p,
                            const arl_kda_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                            float *S, float *tails, arl_kda_layer_save *sv, float *ws);

/* The conv-tail gradients of the backward (also the "cpu" ops of the device training step,
 * policy/model_device.h): the gradient of the incoming tails (N, C, W-1; NULL = zeros) from dz
 * (T, C) of the conv + SiLU over x (T, C), w (C, W): dtail (N, C, W-1) +=; and the gradient of
 * each document's final tail dtail_out (N, C, W-1) routed to its inputs: dpre (T, C) +=, for
 * documents shorter than W-1 partly to dtail_in (N, C, W-1) += (or dropped when NULL). */
void arl_kda_conv_tail_bwd(float *dtail, const float *dz, const float *x, const float *w,
                           const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                           int64_t W);
void arl_kda_conv_tail_out_bwd(float *dpre, float *dtail_in, const float *dtail_out,
                               const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);

/* Backward of the layer for upstream dy (T, d), with sv from arl_kda_layer_fwd_save over the
 * same x, cu, N, T.  dx (T, d) +=; every parameter gradient in gp (a view over a gradient
 * arena; NULL fields are not used) +=.
 * tails0 (N, 3, P, W-1): the conv tails the forward started from (NULL: fresh documents).
 * dS_T (N, H, dk, dv), dtails_T (N, 3, P, W-1): gradients of the final state (NULL: 0).
 * dS0, dtails0 (same shapes): += the gradients of the initial state (NULL: not wanted; the
 *   initial state is then a constant input, spec 3.6).
 * recurrent: 0 the chunkwise rule (3.8), 1 the recurrent rule (3.7); same result to rounding.
 * ws: arl_kda_layer_train_ws_floats floats. */
void arl_kda_layer_bwd(float *dx, const arl_kda_params *gp, const float *dy, const float *x,
                       const arl_kda_params *p, const arl_kda_layer_cfg *c, const int32_t *cu,
                       int32_t N, int64_t T, const arl_kda_layer_save *sv, const float *tails0,
                       const float *dS_T, float *dS0, const float *dtails_T, float *dtails0,
                       int recurrent, float *ws);

#endif
