/* policy/attnres.h: the Block Attention Residuals mix on the CPU (fp32), spec/policy.md
 * section 5.1 (forward) and 5.3 (backward).
 *
 * What this is: the per-token softmax mixture over depth of N source vectors with a learned
 * pseudo-query w = w_norm * w_proj:
 *   kappa_j = V_j (mean(V_j^2) + eps)^-1/2,  z_j = w . kappa_j,  a = softmax_j(z),
 *   Mix = sum_j a_j V_j          (keys RMS-normalised, values raw)
 * and its exact backward.  What this is not: the block bookkeeping of 5.2/5.4 (which sources
 * exist at which layer: the caller keeps `blocks` and `p`), or any other residual form.
 *
 * Symbols: T tokens, d width, N sources (1 <= N <= ARL_ATTNRES_MAX_SOURCES).
 * Sources are given as an array of N pointers, each to a (T, d) row-major block, so the
 * block entries and the running partial sum may live in different buffers.  Sums over d use
 * double accumulators; everything stored is fp32.  Nothing allocates; every pointer is
 * borrowed for the duration of the call only.  Tokens run in parallel on the kernels' pool
 * (kernels/threadpool.h); results never depend on the thread count.
 */
#ifndef ARL_POLICY_ATTNRES_H
#define ARL_POLICY_ATTNRES_H

#include <stdint.h>

#define ARL_ATTNRES_MAX_SOURCES 64

/* out (T, d) = Mix(src; w_norm * w_proj); a (N, T) receives the weights unless NULL.
 * src: N pointers to (T, d); w_norm (d) = *_res_norm.weight, w_proj (d) = *_res_proj.weight
 * ([1, d] read as [d]); eps = rms_norm_eps.  out must not alias a source. */
void arl_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                         int64_t d, const float *w_norm, const float *w_proj, float eps);

/* Backward of the mix for upstream dh (T, d): dsrc[j] (T, d) += dV_j (an entry may be NULL:
 * not wanted), dw_norm (d) +=, dw_proj (d) += (either may be NULL). */
void arl_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                         const float *const *src, int32_t N, int64_t T, int64_t d,
                         const float *w_norm, const float *w_proj, float eps);

/* The same with a work buffer ws (arl_attnres_bwd_ws_doubles(N, T) doubles, no initialisation):
 * tokens run in parallel, then dw over columns; the same bits as arl_attnres_mix_bwd (which runs
 * on the calling thread only).  ws NULL is arl_attnres_mix_bwd. */
int64_t arl_attnres_bwd_ws_doubles(int32_t N, int64_t T);
void arl_attnres_mix_bwd_ws(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                            const float *const *src, int32_t N, int64_t T, int64_t d,
                            const float *w_norm, const float *w_proj, float eps, double *ws);

#endif
