/* policy/optimizer_internal.h: the pieces of the AdamW step that policy/optimizer.c and the
 * cpu instance of the device tables (policy/model_device.c, policy/model_device_backward.c)
 * share, so that each computation exists once and both compute the same bits.  Internal to
 * policy/: not public API.
 *
 * What this is: one chunk's sum of squares for the gradient norm, the per-step scalars (clip
 * coefficient, learning rate, bias corrections) and the element update of a run of floats.
 * What this is not: the chunk table, the order of the norm's chunk sums, the QB hook
 * (policy/optimizer.c).  All pointers are borrowed for the call.
 */
#ifndef ARL_POLICY_OPTIMIZER_INTERNAL_H
#define ARL_POLICY_OPTIMIZER_INTERNAL_H

#include <stdint.h>

#include "kernels/cuda/ops.h" /* arl_cuda_adamw_hp: the scalars the element update takes */
#include "policy/optimizer.h"

/* sum_i g[i]^2 over g (n), left to right in double (one chunk of the norm). */
double arl_optim_sumsq(const float *g, int64_t n);

/* The scalars of step `step` (0-based) for the global gradient norm `norm` (finite): *hp for
 * arl_optim_update, *coef the clip coefficient and *lr the learning rate (both in double, for
 * the report). */
void arl_optim_step_scalars(arl_cuda_adamw_hp *hp, double *coef, double *lr,
                            const arl_optim_config *c, int64_t step, double norm);

/* The element update of n floats: p (n) parameters, m, v (n) moments, g (n) gradients;
 * decay != 0: the tensor takes weight decay. */
void arl_optim_update(float *p, float *m, float *v, const float *g, int64_t n, int32_t decay,
                      const arl_cuda_adamw_hp *hp);

#endif
