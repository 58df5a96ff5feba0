/* kernels/norm.h: row normalisations of spec/policy.md section 1.3, forward and backward.
 *
 *   RMSNorm_{w,eps}(x) = w * x * (mean_i x_i^2 + eps)^(-1/2)
 *   L2Norm_eps(x)      =     x * (sum_i  x_i^2 + eps)^(-1/2)     (eps inside the root; spec: 1e-6)
 *
 * It is: the row-wise normalisation of n contiguous rows of width d (a sequence (T, d), or heads
 * viewed as rows: (T, H*D) head-major is (T*H, D)).  It is not: LayerNorm (no mean, no bias),
 * torch.nn.functional.normalize (that divides by max(|x|, eps)), or a fused gate.
 *
 * Precision: row statistics are accumulated in double and stored as fp32 (rstd); outputs fp32.
 * Gradients: backward kernels ACCUMULATE (+=) into dx and dw; callers zero them once.
 * Threads: rows in parallel (dw: column blocks in parallel, rows summed in order; for d <= 512
 * eight fixed row chunks summed in order, then the chunks in order), so results
 * are bit-identical for any thread count.  n == 0 is a no-op; d >= 1.
 * Aliasing: y may equal x in the forward kernels; gradients must not alias inputs.
 */
#ifndef ARL_KERNELS_NORM_H
#define ARL_KERNELS_NORM_H

#include <stdint.h>

/* y (n, d) = RMSNorm(x (n, d)) with weight w (d); rstd (n) = (mean x^2 + eps)^(-1/2) per row,
 * kept for the backward; rstd may be NULL when no backward follows. */
void arl_k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                       float eps);

/* With r = rstd[t] from the forward and s_t = sum_i w_i dy_ti x_ti:
 *   dx (n, d) += r w dy - (r^3 s_t / d) x          dw (d) += sum_t dy_t * x_t * r_t
 * dw may be NULL (no weight gradient wanted). */
void arl_k_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                       const float *rstd, int64_t n, int64_t d);

/* y (n, d) = L2Norm(x (n, d)); rnorm (n) = (sum x^2 + eps)^(-1/2), may be NULL. */
void arl_k_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t n, int64_t d, float eps);

/* dx (n, d) += r dy - r^3 (sum_i x_i dy_i) x, r = rnorm[t] from the forward. */
void arl_k_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm, int64_t n,
                      int64_t d);

#endif
