/* kernels/elementwise.h: fp32 elementwise arithmetic and copies over contiguous arrays.
 *
 * It is: the few pointwise operations the policy's forward and backward glue needs, one
 * rounding per result.  It is not: broadcasting beyond "one scale per row", strided views, or
 * reductions (kernels/reduce.h).
 *
 * Threads: elements (rows) in parallel; bit-identical for any thread count.  n == 0 is a no-op.
 * Aliasing: the output may equal any input exactly (in-place); partial overlap is undefined.
 */
#ifndef ARL_KERNELS_ELEMENTWISE_H
#define ARL_KERNELS_ELEMENTWISE_H

#include <stdint.h>

/* y (n) = v */
void arl_k_fill(float *y, float v, int64_t n);
/* y (n) = x (n) */
void arl_k_copy(float *y, const float *x, int64_t n);
/* y (n) = a + b */
void arl_k_add(float *y, const float *a, const float *b, int64_t n);
/* y (n) = a * b */
void arl_k_mul(float *y, const float *a, const float *b, int64_t n);
/* y (n) += a * b   (backward of a product: da += dy * b) */
void arl_k_mul_acc(float *y, const float *a, const float *b, int64_t n);
/* y (n) = alpha * x */
void arl_k_scale(float *y, const float *x, float alpha, int64_t n);
/* y (n) += alpha * x */
void arl_k_axpy(float *y, float alpha, const float *x, int64_t n);
/* y (T, d) = s[t] * x (T, d) per row t, s (T)   (e.g. router weight times expert output).
 * Backward: dx += s dy (arl_k_scale_rows into a temporary, or per row arl_k_axpy) and
 * ds[t] += sum_j dy[t,j] x[t,j] (arl_k_dot_rows). */
void arl_k_scale_rows(float *y, const float *x, const float *s, int64_t T, int64_t d);

#endif
