/* policy/kda_layer.h: one Kimi Delta Attention mixer layer on the CPU, fp32
 * (spec/policy.md sections 3.1-3.4 and 3.6): the projections, short convolutions, L2Norm, decay
 * gate, beta, the delta-rule core, the gated output RMSNorm and the output projection, over a
 * packed batch of documents that either start fresh or resume from a given state.
 *
 * What this is: the composition of the stages of policy/kda.h with the GEMMs and norms of
 * kernels/.  What this is not: the stages themselves (policy/kda.h), the residual stream and
 * input norm (policy/model.c), or the bookkeeping of per-sequence decode state
 * (policy/state.h): the caller gathers the states of the batch's documents into the
 * (N, ...) arrays below and scatters them back.
 *
 * Symbols: T tokens of the packed batch, N documents, d width, H heads, dk = dv head dims,
 * P = H*dk, W conv taps, C chunk length of the chunkwise core.
 */
#ifndef ARL_POLICY_KDA_LAYER_H
#define ARL_POLICY_KDA_LAYER_H

#include <stdint.h>

#include "policy/params.h"

/* Sizes and settings of a KDA layer (from the model config). */
typedef struct arl_kda_layer_cfg {
    int64_t d, H, dk, dv, W;
    int32_t lower_bound_gate; /* 1: K3 gate g = g_min sigmoid(a u); 0: softplus gate */
    float g_min;              /* gate_lower_bound (used when lower_bound_gate) */
    float eps;                /* rms_norm_eps of the output norm */
    int64_t chunk;            /* C, chunk length of the chunkwise core (1..256) */
} arl_kda_layer_cfg;

/* Floats of work buffer arl_kda_layer_fwd needs for T tokens and N documents. */
int64_t arl_kda_layer_ws_floats(const arl_kda_layer_cfg *c, int64_t T, int32_t N);

/* y (T, d) = KDA mixer of x (T, d) (x = RMSNorm_in(h), already normalised).
 * cu (N + 1): document boundaries (cu[0] = 0, cu[N] = T, non-decreasing); NULL = one document.
 * S (N, H, dk, dv): the state of every document on entry (zeros for a fresh start), its final
 *   state on return; NULL = every document starts fresh and the final states are not kept.
 * tails (N, 3, P, W-1): the q, k, v conv tails (pre-conv inputs, oldest first) of every
 *   document on entry, the tails after it on return; NULL = zeros, not kept.
 * recurrent: 1 runs the token-by-token core (decode: one token per document), 0 the chunkwise
 *   core of chunk length c->chunk (prefill); both compute spec 3.3 to rounding.
 * chunk_states (n_chunks, H, dk, dv) (arl_kda_num_chunks(cu, N, T, c->chunk)): receives the
 *   incoming state of every chunk for a backward, unless NULL.
 * ws: arl_kda_layer_ws_floats(c, T, N) floats.  y must not alias x. */
void arl_kda_layer_fwd(float *y, const float *x, const arl_kda_params *p,
                       const arl_kda_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                       float *S, float *tails, int recurrent, float *chunk_states, float *ws);

#endif
