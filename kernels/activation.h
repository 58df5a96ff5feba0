/* kernels/activation.h: pointwise activations and the gated linear units (SwiGLU, SiTU-GLU of
 * spec/policy.md section 8), forward and backward, fp32.
 *
 * It is: y = f(x) over n contiguous elements, dx += dy * f'(x) (the derivative is recomputed
 * from the forward INPUT x, for every activation), and the GLU products h = a(g) * b(u).  It is
 * not: fused with a GEMM or a bias.
 *
 * Definitions (sigma(x) = 1/(1+e^-x)):
 *   sigmoid    sigma(x)                          stable for large |x|
 *   silu       x sigma(x)
 *   tanh       tanh(x)
 *   softplus   ln(1 + e^x), computed max(x,0) + log1p(e^-|x|)  (no threshold; exact for all x)
 *   gelu_tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   gelu_erf   0.5 x (1 + erf(x / sqrt(2)))
 *   situ_phi   phi(x) = b1 tanh(x/b1) sigma(x)     (SiTU gate activation, spec section 8)
 *   SwiGLU     h = silu(g) * u
 *   SiTU-GLU   h = phi(g) * psi(u),  psi(u) = b2 tanh(u/b2)   (spec: SiTU(g, u); K3 b1 = 4, b2 =
 * 25)
 *
 * Gradients: backward kernels ACCUMULATE (+=) into dx / dg / du; callers zero them once.
 * Threads: elements in parallel; bit-identical for any thread count.  n == 0 is a no-op.
 * Aliasing: y may equal x in the forward kernels; gradients must not alias inputs.
 */
#ifndef ARL_KERNELS_ACTIVATION_H
#define ARL_KERNELS_ACTIVATION_H

#include <stdint.h>

/* y (n) = f(x (n)) */
void arl_k_sigmoid_fwd(float *y, const float *x, int64_t n);
void arl_k_silu_fwd(float *y, const float *x, int64_t n);
void arl_k_tanh_fwd(float *y, const float *x, int64_t n);
void arl_k_softplus_fwd(float *y, const float *x, int64_t n);
void arl_k_gelu_tanh_fwd(float *y, const float *x, int64_t n);
void arl_k_gelu_erf_fwd(float *y, const float *x, int64_t n);
void arl_k_situ_phi_fwd(float *y, const float *x, int64_t n, float beta1);

/* dx (n) += dy (n) * f'(x (n)), x the forward input */
void arl_k_sigmoid_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_silu_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_tanh_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_softplus_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_gelu_tanh_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_gelu_erf_bwd(float *dx, const float *dy, const float *x, int64_t n);
void arl_k_situ_phi_bwd(float *dx, const float *dy, const float *x, int64_t n, float beta1);

/* ---- gated linear units over T rows of f hidden units ----
 * g, u: (T, f) with row stride ld >= f (ld = f for two separate buffers; ld = 2f with u = g + f
 * for one fused (T, 2f) [gate | up] projection output).  h: (T, f) contiguous.
 * dg, du: (T, f) with the same row stride ld as g, u (so a fused (T, 2f) gradient works too). */

/* h = silu(g) * u */
void arl_k_swiglu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld);
/* dg += dh * u * silu'(g),  du += dh * silu(g) */
void arl_k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                      int64_t T, int64_t f, int64_t ld);

/* h = phi(g) * psi(u) */
void arl_k_situ_glu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld,
                        float beta1, float beta2);
/* dg += dh * phi'(g) psi(u),  du += dh * phi(g) psi'(u)   (spec section 8) */
void arl_k_situ_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                        int64_t T, int64_t f, int64_t ld, float beta1, float beta2);

#endif
