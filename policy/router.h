/* policy/router.h: the sigmoid top-k MoE router on the CPU (fp32), spec/policy.md section 6.
 *
 * What this is: forward (6.1) - logits l = W_r x, scores s = sigmoid(l), selection of the k
 * experts with the largest s + b (b = e_score_correction_bias, used for selection only; ties
 * toward the lower expert index), weights p_i = rho s_i / (sum_{j in Sel} s_j + 1e-20) - with
 * optional forced routes (RL: the behaviour policy's stored routes; p is recomputed from the
 * current s on them), and the backward (6.2) into x and W_r.
 * What this is not: the expert computation (LatentMoE, section 7), the update of b (Quantile
 * Balancing: policy/qb.h), grouped top-k (K3 uses one group).
 *
 * Symbols: T tokens, d width, E experts, k experts per token, rho routed_scaling_factor.
 * Layouts: x (T, d), W_r (E, d) = gate.weight, b (E), s (T, E), sel (T, k) int32 and
 * p (T, k) aligned with sel: without forced routes sel lists each token's experts best first
 * (descending s + b); with forced routes sel is a copy of them in their order.
 * Every pointer is borrowed for the duration of the call only; ws is the caller's work buffer.
 */
#ifndef ARL_POLICY_ROUTER_H
#define ARL_POLICY_ROUTER_H

#include <stdint.h>

#include "core/status.h"

/* Floats of work buffer for arl_router_fwd and arl_router_bwd. */
int64_t arl_router_ws_floats(int64_t T, int64_t E);

/* sel (T, k), p (T, k) and s (T, E) (kept for the backward) from x.  forced (T, k) or NULL.
 * 0 < k <= E.  Returns ARL_ERR_RANGE, naming the token, when a forced route is outside
 * [0, E) or repeats an expert within a token (outputs then undefined); else ARL_OK. */
arl_status arl_router_fwd(int32_t *sel, float *p, float *s, const float *x, const float *W_r,
                          const float *bias, const int32_t *forced, int64_t T, int64_t d, int64_t E,
                          int64_t k, float rho, float *ws);

/* Backward for dp (T, k) (the gradient of p, aligned with sel): with Z = sum_{j in Sel} s_j,
 *   ds_i = (rho dp_i - sum_j p_j dp_j) / Z  (i in Sel),  dl = ds s (1 - s),
 *   dW_r (E, d) += dl^T x,  dx (T, d) += dl W_r   (either may be NULL).
 * s, sel from the forward. */
void arl_router_bwd(float *dx, float *dW_r, const float *dp, const float *x, const float *W_r,
                    const float *s, const int32_t *sel, int64_t T, int64_t d, int64_t E, int64_t k,
                    float rho, float *ws);

/* Router agreement of one token in one MoE layer (spec/objective.md 11.4): |N ∩ R|, where N is
 * the natural top-k of scores + bias (the order of arl_router_fwd: descending, ties toward the
 * lower expert) and R the stored route set.  scores (E) sigmoid router scores, bias (E) the
 * selection bias or NULL, stored (k) the stored experts (any order, distinct), 1 <= k <= E.
 * ws (E) and nat (k) are the caller's scratch; nat receives N, best first.  Used by the
 * re-scorer (rollout/rescore.c) and the learner's pi_old pass (learner/passes.c). */
int64_t arl_router_overlap(const float *scores, const float *bias, int64_t E, int64_t k,
                           const int32_t *stored, float *ws, int32_t *nat);

#endif
