/* kernels/vmath.h: vectorised fp32 math over short arrays, run serially on the calling thread -
 * the building blocks of the CPU kernels' and the CPU policy's inner loops.
 *
 * It is: elementwise exp, sigmoid, tanh and SiLU with a stated accuracy (a few ulp, not libm's
 * correctly-rounded-or-1-ulp), and three BLAS-1 helpers with a fixed summation order.  It is
 * not: a parallel kernel (no thread pool: these run inside the parts of a parallel-for, or on
 * arrays too short to split), nor a backend op (no CUDA mirror; GPU code has its own
 * intrinsics).
 *
 * Accuracy over all fp32 inputs (tests/kernels/test_vmath.c checks it against float64 libm
 * on every 8191st fp32 bit pattern, on dense grids around every threshold and on the special
 * values):
 *   arl_k_vexp      <= 2 ulp; +inf above ~88.72, 0 below ~-103.97 (subnormal results rounded
 *                   once), exp(+-0) = 1, exp(-inf) = 0, exp(+inf) = +inf.
 *   arl_k_vsigmoid  1/(1+e^-x): <= 3 ulp (relative, also for tiny results at x << 0);
 *                   sigmoid(+inf) = 1, sigmoid(-inf) = 0.
 *   arl_k_vtanh     <= 3 ulp; exactly +-1 for |x| >= 9.1, odd (tanh(-x) = -tanh(x)), -0 kept.
 *   arl_k_vsilu     x * sigmoid(x): <= 4 ulp where sigmoid(x) is a normal number (x > -87.3);
 *                   below, |error| <= 2 |x| 2^-149 (sigmoid's subnormal rounding, as with libm);
 *                   silu(-inf) is NaN, as x * sigmoid(x) is.
 *   NaN in gives NaN out everywhere: the first NaN argument, quietened (the elementwise
 *   functions and vaxpy / vscale / vmul; never left to the hardware's choice between two NaN
 *   operands, which differs between builds and optimisation levels).
 * Determinism: each element's result depends only on its input, never on its position, the
 * array length or the alignment (array tails run the same code on a padded copy), so results
 * are bit-identical however a caller splits an array across threads, and the same on every CPU
 * (an AVX2 build is used where present; it computes the same operations, none fused).
 *
 * Aliasing: y may equal x exactly (in place); partial overlap is undefined.  n == 0 is a
 * no-op; n < 0 is a programmer error.
 */
#ifndef ARL_KERNELS_VMATH_H
#define ARL_KERNELS_VMATH_H

#include <stdint.h>

/* y (n) = f(x (n)) */
void arl_k_vexp(float *y, const float *x, int64_t n);
void arl_k_vsigmoid(float *y, const float *x, int64_t n);
void arl_k_vtanh(float *y, const float *x, int64_t n);
void arl_k_vsilu(float *y, const float *x, int64_t n);

/* sum_i a[i] b[i] over n elements: four partial sums (element i goes to sum i mod 4, in
 * ascending i), then added as (s0 + s2) + (s1 + s3).  fp32 accumulation. */
float arl_k_vdot(const float *a, const float *b, int64_t n);

/* sum_i x[i] over n elements, in the partial-sum order of arl_k_vdot. */
float arl_k_vsum(const float *x, int64_t n);

/* max_i x[i] over n >= 1 elements (NaN elements are skipped unless all are NaN). */
float arl_k_vmax(const float *x, int64_t n);

/* y (n) += alpha * x (n): one product and one sum per element, as the scalar loop. */
void arl_k_vaxpy(float *y, float alpha, const float *x, int64_t n);

/* y (n) *= alpha */
void arl_k_vscale(float *y, float alpha, int64_t n);

/* y (n) = a (n) * b (n); y may equal a or b. */
void arl_k_vmul(float *y, const float *a, const float *b, int64_t n);

#endif
