/* policy/qb.h: Quantile Balancing of the router bias on the CPU (fp32), spec/policy.md
 * section 9: the exact online rule (9.2), the histogram estimator (9.3) split into its
 * rank-local and global parts, and the banded targets extension (9.5).
 *
 * What this is: functions from one optimizer step's router scores s (m, E) (fp32, the
 * non-padding tokens of the step, every micro-batch pooled) and the bias b_old (E) that routed
 * them, to the bias for the NEXT step.  What this is not: the all-reduce of the histogram
 * counts (the caller sums cnt and m over ranks between arl_qb_hist_count and _solve), the
 * router (policy/router.h), or the offline solver of 9.4.
 *
 * Symbols: m tokens, E experts, k experts per token (0 < k < E).
 *   alpha_i = the (k+1)-th largest of s_i,: + b_old   (token i's cutoff)
 *   r_ij    = alpha_i - s_ij                         (the bias expert j needs to win token i)
 * Every b_new is centred (b_hat - mean(b_hat)), which changes no routing.  Statistics are fp32;
 * quantile positions and means use double.  Work buffers come from the caller; every pointer
 * is borrowed for the duration of the call only.
 */
#ifndef ARL_POLICY_QB_H
#define ARL_POLICY_QB_H

#include <stdint.h>

#include "core/status.h"

/* Floats of work buffer enough for every function below. */
int64_t arl_qb_ws_floats(int64_t m, int64_t E);

/* alpha (m): each token's cutoff.  ws: arl_qb_ws_floats. */
void arl_qb_cutoffs(float *alpha, const float *s, const float *b_old, int64_t m, int64_t E,
                    int64_t k, float *ws);

/* Spec 9.2: bhat_j = linear quantile of r_:,j at level k/E (torch.quantile's rule:
 * position (m-1) k/E), b_new = bhat - mean(bhat).  bhat (E) may be NULL.
 * ARL_ERR_ARG for m == 0 (a step without tokens: keep b_old) or k outside (0, E). */
arl_status arl_qb_exact(float *b_new, float *bhat, const float *s, const float *b_old, int64_t m,
                        int64_t E, int64_t k, float *ws);

/* Spec 9.3, histogram estimator with Nb bins over (lo, lo + Nb w):
 * lo = min b_old - 1, w = (max b_old + 1 - lo) / Nb (the same on every rank). */
void arl_qb_hist_range(float *lo, float *w, const float *b_old, int64_t E, int64_t Nb);

/* cnt (E, Nb) += the bin counts of this rank's r_ij, bin = clamp(floor((r - lo) / w), 0,
 * Nb - 1).  ws: arl_qb_ws_floats(m, E). */
void arl_qb_hist_count(int64_t *cnt, const float *s, const float *b_old, int64_t m, int64_t E,
                       int64_t k, float lo, float w, int64_t Nb, float *ws);

/* From the all-reduced counts and token count m: q = m k / E; per expert the first bin t*
 * whose cumulative count reaches q, lambda = clamp((q - C_{t*-1}) / max(cnt, 1), 0, 1),
 * bhat = lo + (t* + lambda) w; b_new = bhat - mean(bhat).  bhat may be NULL.
 * ARL_ERR_ARG for m == 0, k outside (0, E) or Nb < 1. */
arl_status arl_qb_hist_solve(float *b_new, float *bhat, const int64_t *cnt, int64_t m, int64_t E,
                             int64_t k, float lo, float w, int64_t Nb);

/* Spec 9.5 with band [q_min, q_max] = [(1 - lam_lo) q, (1 + lam_hi) q], q = m k / E, and
 * loads (E) the realised loads of the step (routing with b_old): an expert inside the band
 * keeps b_old; one outside gets the quantile of r_:,j at level clamp(load, q_min, q_max) / m.
 * lam_lo = lam_hi = 0 is spec 9.2.  bhat may be NULL.  Errors as arl_qb_exact, and
 * ARL_ERR_ARG for a negative lambda. */
arl_status arl_qb_band(float *b_new, float *bhat, const int64_t *loads, const float *s,
                       const float *b_old, int64_t m, int64_t E, int64_t k, float lam_lo,
                       float lam_hi, float *ws);

/* loads (E) = number of tokens routed to each expert by sel (m, k) (overwritten). */
void arl_qb_count_loads(int64_t *loads, const int32_t *sel, int64_t m, int64_t k, int64_t E);

#endif
