/* policy/moe_internal.h: the pieces of the routed experts that policy/moe.c (inference
 * forward), policy/moe_backward.c (training forward and backward) and the cpu instance of the
 * device tables (policy/model_device.c) share, so that each computation exists once and all
 * three compute the same bits.  Internal to policy/: not public API.
 *
 * What this is: the GLU FFN forward and backward on a block of rows, the grouping of token
 * slots by expert (count, prefix sum, gather), the routed experts over a range of experts,
 * the weighted combine over a range of tokens, and the backward of the combine and of the
 * grouping.  Ranges are [lo, hi) so a caller may run them as arl_k_parallel_for parts; every
 * row / expert writes only its own outputs, so any split gives the same bits.
 * What this is not: the router, the latent norm, the projections (policy/moe.c and
 * policy/moe_backward.c).
 *
 * Symbols: T tokens, E experts, k experts per token, f expert width, dz latent width.
 * All pointers are borrowed for the call.
 */
#ifndef ARL_POLICY_MOE_INTERNAL_H
#define ARL_POLICY_MOE_INTERNAL_H

#include <stdint.h>

#include "policy/moe.h"
#include "policy/params.h"

/* y (T, out) = W_d act(W_g x, W_u x) for x (T, in); Wg, Wu (fw, in), Wd (out, fw); keeps
 * gu (T, 2 fw) [W_g x | W_u x] and h (T, fw).  beta 0 overwrites y, 1 adds to it. */
void arl_moe_glu_fwd(float *y, float beta, const float *x, const float *Wg, const float *Wu,
                     const float *Wd, int64_t T, int64_t in, int64_t fw, int64_t out,
                     const arl_glu_act *act, float *gu, float *h);

/* Backward of arl_moe_glu_fwd for dy (T, out): dWd, dWg, dWu +=; dx (T, in) = dx_beta dx +
 * the input gradient (dx_beta 1 accumulates, 0 overwrites without reading; dx may be NULL);
 * dh (T, fw) and dgu (T, 2 fw) are scratch.  T == 0 does nothing. */
void arl_moe_glu_bwd(float *dx, float dx_beta, float *dWg, float *dWu, float *dWd, const float *dy,
                     const float *x, const float *Wg, const float *Wu, const float *Wd, int64_t T,
                     int64_t in, int64_t fw, int64_t out, const arl_glu_act *act, const float *gu,
                     const float *h, float *dh, float *dgu);

/* Groups the T*k slots by expert (spec 7.2): start (E + 1) first grouped row of each expert,
 * row (T*k) grouped row of slot (t, j), zg (T*k, dz) rows of z (T, dz) in grouped order;
 * fill (E) is scratch.  sel (T, k) must hold experts in [0, E). */
void arl_moe_group(int64_t *start, int64_t *fill, int64_t *row, float *zg, const float *z,
                   const int32_t *sel, int64_t T, int64_t k, int64_t E, int64_t dz);

/* Experts [e0, e1) on their grouped rows (experts without rows are skipped): yg (T*k, dz),
 * gu (T*k, 2f), h (T*k, f) rows of each expert from zg (T*k, dz) with p->w1, w3, w2. */
void arl_moe_experts_fwd_range(float *yg, float *gu, float *h, const float *zg,
                               const int64_t *start, const arl_moe_params *p, const arl_moe_cfg *c,
                               int64_t e0, int64_t e1);

/* Tokens [t0, t1) of u (T, dz) = sum_j pw[t, j] yg[row[t, j]], slots in order j = 0..k-1. */
void arl_moe_combine_range(float *u, const float *pw, const float *yg, const int64_t *row,
                           int64_t k, int64_t dz, int64_t t0, int64_t t1);

/* Tokens [t0, t1) of the combine's backward for du (T, dz): dp (T, k) = yg[row] . du_t
 * (double accumulation) and dyg rows (T*k, dz) = pw[t, j] du_t. */
void arl_moe_slots_bwd_range(float *dp, float *dyg, const float *du, const float *yg,
                             const float *pw, const int64_t *row, int64_t k, int64_t dz, int64_t t0,
                             int64_t t1);

/* Experts [e0, e1) of the routed experts' backward: gw->w1, w3, w2 += from their own rows;
 * dzg rows (T*k, dz) overwritten; dh (T*k, f) and dgu (T*k, 2f) scratch rows. */
void arl_moe_experts_bwd_range(float *dzg, const arl_moe_params *gw, const float *dyg,
                               const float *zg, const float *gu, const float *h,
                               const int64_t *start, const arl_moe_params *p, const arl_moe_cfg *c,
                               float *dh, float *dgu, int64_t e0, int64_t e1);

/* Tokens [t0, t1) of dz (T, dz) = the sum of the token's dzg rows, slots in order from 0. */
void arl_moe_gather_dz_range(float *dz, const float *dzg, const int64_t *row, int64_t k,
                             int64_t dzw, int64_t t0, int64_t t1);

#endif
