/* policy/kda.h: Kimi Delta Attention on the CPU (fp32), spec/policy.md section 3.
 *
 * What this is: the stages of a KDA mixer after its projections, as pure functions on raw
 * pointers - the short causal convolution with SiLU (and its decode step over conv tails),
 * the decay gates (K3 lower-bound gate and Kimi-Linear softplus gate), the gated output
 * RMSNorm, and the delta-rule core in its two forms: the token-by-token recurrence (3.3) and
 * the chunkwise WY/UT form (3.5), each with its backward (3.7, 3.8, 3.9).  Packed batches are
 * described by cu_seqlens: the state and the conv history reset at every document start.
 * What this is not: the projections (x W^T: kernels/gemm.h), L2Norm of q and k
 * (kernels/norm.h arl_k_l2norm_*, eps 1e-6), beta = sigmoid(W_b x) (kernels/activation.h),
 * parameter structs or configs (policy/params.h), or decode-state bookkeeping.
 *
 * Symbols: T tokens of the packed batch, N documents, H heads, dk key and dv value head dims,
 * P = H*dk channels, W conv taps, C chunk length, s = dk^-1/2 the query scale.
 * Layouts (row-major, token-major, head-major channels as spec 1.2):
 *   q, k, g  (T, H, dk)      v, o (T, H, dv)      beta (T, H)
 *   S        (N, H, dk, dv)  one state per document, row index = key channel (spec 3.6)
 *   cu       (N + 1) int32   cu[0] = 0 < cu[1] < ... < cu[N] = T; NULL means N = 1, [0, T)
 *   chunk_states (n_chunks, H, dk, dv): the incoming state of every chunk, where the chunks
 *            are [cu[i] + j*C, min(cu[i] + (j+1)*C, cu[i+1])) in document order (chunks never
 *            straddle documents; arl_kda_num_chunks counts them).
 * Conventions: forward functions overwrite their outputs; backward functions ACCUMULATE (+=)
 * into every gradient they produce, like the kernels (callers zero them once).  Work buffers
 * `ws` are supplied by the caller, sized by the *_ws_floats functions, and need no
 * initialisation; nothing here allocates.  Every pointer is borrowed for the duration of the
 * call only (nothing is retained); outputs must not alias inputs unless stated.  Everything is fp32; heads run in parallel on the
 * kernels' thread pool and results are bit-identical for any thread count.
 */
#ifndef ARL_POLICY_KDA_H
#define ARL_POLICY_KDA_H

#include <stdint.h>

/* ---- short causal convolution + SiLU (spec 3.1, 3.9) ----
 * Depthwise, per channel c: y_t[c] = sum_{j<W} w[c, j] x_{t-W+1+j}[c] (tap W-1 = current
 * token), z = SiLU(y).  Inputs before a document's start are 0, or the document's tail:
 * tails (N, C, W-1) holds the W-1 inputs before each document, oldest first (tails may be
 * NULL: all zero).  Here C is the channel count (P for q and k, H*dv for v). */

/* z (T, C) = SiLU(conv(x)); y (T, C) receives the pre-activation unless NULL.
 * x (T, C), w (C, W) (the checkpoint's (C, 1, W)), tails (N, C, W-1) or NULL. */
void arl_kda_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                      const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);

/* dx (T, C) += d/dx and dw (C, W) += d/dw of sum(dz * z); dz (T, C).  The tails are constant
 * inputs (no gradient).  dw may be NULL. */
void arl_kda_conv_bwd(float *dx, float *dw, const float *dz, const float *x, const float *w,
                      const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                      int64_t W);

/* The conv tail after a document: the last W-1 inputs (C, W-1), oldest first, of
 * [tail_in; x] where x (n, C) are the document's inputs and tail_in (C, W-1) the inputs
 * before it (NULL = zeros).  tail_out may equal tail_in. */
void arl_kda_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in, int64_t C,
                       int64_t W);

/* One decode step: z (C) = SiLU(conv) of the new input x (C) over tail (C, W-1), which is
 * then shifted to hold the latest W-1 inputs. */
void arl_kda_conv_step(float *z, float *tail, const float *x, const float *w, int64_t C, int64_t W);

/* ---- decay gates (spec 3.2, 3.9) ----
 * f (T, P) = W_fb W_fa x, A_log (H), dt_bias (P); u = f + dt_bias, a_h = exp(A_log[h]).
 * K3:       g = g_min * sigmoid(a_h u)      (g_min in [-5, 0))
 * softplus: g = -a_h * softplus(u)
 * g (T, P) is the log-decay (T, H, dk).  Backward: df (T, P) +=, dA_log (H) +=,
 * ddt_bias (P) += (each may be NULL). */
void arl_kda_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                         int64_t T, int64_t H, int64_t dk, float g_min);
void arl_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg, const float *f,
                         const float *A_log, const float *dt_bias, int64_t T, int64_t H, int64_t dk,
                         float g_min);
void arl_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                               int64_t T, int64_t H, int64_t dk);
void arl_kda_gate_softplus_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                               const float *f, const float *A_log, const float *dt_bias, int64_t T,
                               int64_t H, int64_t dk);

/* ---- gated output RMSNorm (spec 3.4, 3.9) ----
 * Per row (a token's head): ob = w * o * rstd * sigmoid(gam), rstd = (mean(o^2) + eps)^-1/2.
 * o, gam, ob (n, dv) with n = T*H rows; w (dv) shared by heads; rstd (n) kept for the
 * backward (may be NULL in the forward).  Backward: do (n, dv) +=, dgam (n, dv) +=,
 * dw (dv) += (dw may be NULL); rstd from the forward. */
void arl_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam, const float *w,
                       int64_t n, int64_t dv, float eps);
void arl_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                       const float *gam, const float *w, const float *rstd, int64_t n, int64_t dv);

/* ---- delta-rule core (spec 3.3, 3.5, 3.7, 3.8) ---- */

/* Number of chunks of length C in the packed batch (see chunk_states above). */
int64_t arl_kda_num_chunks(const int32_t *cu, int32_t N, int64_t T, int64_t C);

/* Recurrent form (3.3), one token at a time.  S (N, H, dk, dv): on entry the initial state of
 * every document (zeros for a fresh start), on return the final states.  o (T, H, dv).
 * chunk_states (n_chunks, H, dk, dv) receives the incoming state of every chunk of length C
 * unless NULL (C is only used then).  Decode of one token is T = 1, N = 1. */
void arl_kda_recurrent_fwd(float *o, float *S, float *chunk_states, const float *q, const float *k,
                           const float *v, const float *g, const float *beta, const int32_t *cu,
                           int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                           int64_t C);

/* Chunkwise form (3.5) with chunk length C (1 <= C <= 256): same contract as
 * arl_kda_recurrent_fwd.  G is the in-chunk inclusive cumsum of g; T = (I + A_kk)^-1 by forward
 * substitution.  A_kk and A_qk (the pair decays exp(G_r - G_i), i <= r) are computed in the
 * factored sub-chunk form ("Factored form" of 3.5): the rows come in sub-chunks R = [r0, r1) of
 * 16 tokens with boundary b = r0, and exp(G_r - G_i) = exp(G_r - G_b) exp(G_b - G_i) turns each
 * row block into one GEMM, (K_R . exp(G_R - G_b)) (K_{<r1} . exp(G_b - G_{<r1}))^T (Q_R for
 * A_qk).  For i < b both factors are <= 1 (the difference form split at b); inside the
 * sub-chunk the factors stay within e^{+-80}, which the K3 gate guarantees (g >= -5, at most 15
 * steps from b) and which is checked for every input: a sub-chunk whose factors would leave that
 * range (strong decays of the unbounded softplus gate) falls back to the per-pair difference
 * form exp(G_r - G_i) <= 1, so the form is valid for both gates.  The other decays, exp(G_r) and
 * exp(G_n - G_r), are at most 1.  The chunkwise backward computes its pair terms in the same
 * sub-chunks (GEMMs with the same factors and the same fallback).
 * ws: arl_kda_chunk_ws_floats(H, dk, dv, C) floats. */
int64_t arl_kda_chunk_ws_floats(int64_t H, int64_t dk, int64_t dv, int64_t C);
void arl_kda_chunk_fwd(float *o, float *S, float *chunk_states, const float *q, const float *k,
                       const float *v, const float *g, const float *beta, const int32_t *cu,
                       int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                       int64_t C, float *ws);

/* Backward of the core, by the recurrent rule (3.7) or the chunkwise rule (3.8); both need
 * the chunk_states of a forward with the same C.  Given d_o (T, H, dv) and dS_T (N, H, dk,
 * dv) (gradient of the final states; NULL = 0), accumulate dq, dk, dg (T, H, dk), dv
 * (T, H, dv), dbeta (T, H) and dS0 (N, H, dk, dv) (gradient of the initial states; NULL =
 * not wanted).  ws: arl_kda_bwd_ws_floats(H, dk, dv, C) floats (enough for both rules). */
int64_t arl_kda_bwd_ws_floats(int64_t H, int64_t dk, int64_t dv, int64_t C);
void arl_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                           const float *d_o, const float *dS_T, const float *q, const float *k,
                           const float *v, const float *g, const float *beta,
                           const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                           int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws);
void arl_kda_chunk_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                       const float *d_o, const float *dS_T, const float *q, const float *k,
                       const float *v, const float *g, const float *beta, const float *chunk_states,
                       const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv,
                       float scale, int64_t C, float *ws);

#endif
