/* kernels/softmax.h: row softmax, log-softmax and the log-probability of given targets
 * (cross-entropy), forward and backward, fp32 storage, numerically stable.
 *
 * It is: n contiguous rows of width d (attention scores, AttnRes mix logits, vocabulary logits
 * (n = T tokens, d = V)).  Every kernel subtracts the row maximum before exp and accumulates its
 * sums in double (spec/policy.md section 15).  It is not: a masked or scaled softmax - callers
 * write -INFINITY into masked positions (and scale with arl_k_scale) first.
 *
 * Gradients: backward kernels ACCUMULATE (+=) into dx / dlogits; callers zero them once.
 * Threads: rows in parallel; bit-identical for any thread count.  n == 0 is a no-op; d >= 1.
 * Aliasing: y may equal x in the forward kernels; gradients must not alias inputs.
 */
#ifndef ARL_KERNELS_SOFTMAX_H
#define ARL_KERNELS_SOFTMAX_H

#include <stdint.h>

/* y (n, d) = softmax of each row of x (n, d).  A row whose entries are all -INFINITY (fully
 * masked) gives y = 0 for that row (and no gradient in the backward). */
void arl_k_softmax_fwd(float *y, const float *x, int64_t n, int64_t d);

/* dx (n, d) += y * (dy - sum_i y_i dy_i), y from the forward. */
void arl_k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d);

/* y (n, d) = x - logsumexp(x) per row.  Every row must hold a finite value. */
void arl_k_logsoftmax_fwd(float *y, const float *x, int64_t n, int64_t d);

/* dx (n, d) += dy - exp(y) * sum_i dy_i, y from the forward. */
void arl_k_logsoftmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d);

/* Log-probability of a target per row, without writing the (n, V) log-softmax:
 *   logp[t] = logits[t, target[t]] - lse[t],   lse[t] = logsumexp_j logits[t, j].
 * Cross-entropy is -logp.  logits (n, V); targets (n) in [0, V), or < 0 for "no target"
 * (padding, context tokens): then logp[t] = 0 and the backward adds nothing to that row.
 * lse (n) is kept for the backward (may be NULL if none follows).  entropy (n), may be NULL:
 * the entropy -sum_j p_j log p_j of the row's distribution (for every row, target or not). */
void arl_k_logprob_fwd(float *logp, float *lse, float *entropy, const float *logits,
                       const int32_t *targets, int64_t n, int64_t V);

/* dlogits[t, j] += dlogp[t] * (1[j == target[t]] - exp(logits[t, j] - lse[t])) for rows with a
 * target; lse from the forward.  dlogp (n) is dL/dlogp (for a mean cross-entropy: -1/count). */
void arl_k_logprob_bwd(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                       const int32_t *targets, int64_t n, int64_t V);

#endif
