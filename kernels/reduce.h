/* kernels/reduce.h: sums and maxima with a fixed, documented order (deterministic).
 *
 * It is: whole-array reductions (sum, sum of squares, max) and per-row / per-column sums of a
 * (T, d) row-major matrix.  Results are written through out pointers (the CUDA mirror writes
 * device memory), and overwrite them.  It is not: top-k or argmax (kernels/topk.h).
 *
 * Order of summation (the same for any thread count, so results are bit-identical):
 *   whole arrays: the array is cut into at most ARL_K_REDUCE_CHUNKS chunks of
 *     max(ARL_K_REDUCE_MIN_CHUNK, ceil(n / ARL_K_REDUCE_CHUNKS)) elements; each chunk is summed
 *     from left to right in double, the chunk sums are added left to right in double, and the
 *     total is rounded to fp32 once.
 *   rows: left to right in double.  columns: top to bottom in double.
 * Accuracy: a double accumulator makes the fp32 result the correctly rounded sum for all but
 * extreme cancellations (error <= n * 2^-53 * sum|x| before the final rounding).
 */
#ifndef ARL_KERNELS_REDUCE_H
#define ARL_KERNELS_REDUCE_H

#include <stdint.h>

#define ARL_K_REDUCE_CHUNKS 64
#define ARL_K_REDUCE_MIN_CHUNK 16384

/* *out = sum_i x[i] over x (n); 0 for n == 0. */
void arl_k_sum(float *out, const float *x, int64_t n);
/* *out = sum_i x[i]^2 over x (n); 0 for n == 0. */
void arl_k_sumsq(float *out, const float *x, int64_t n);
/* *out = max_i x[i] over x (n); -INFINITY for n == 0; NaN if any element is NaN. */
void arl_k_max(float *out, const float *x, int64_t n);

/* out (T) = sum_j x[t, j] over x (T, d). */
void arl_k_sum_rows(float *out, const float *x, int64_t T, int64_t d);
/* out (d) = sum_t x[t, j] over x (T, d)  (e.g. a gradient summed over tokens); T == 0 gives 0. */
void arl_k_sum_cols(float *out, const float *x, int64_t T, int64_t d);
/* out (T) = sum_j a[t, j] b[t, j] over a, b (T, d)  (backward of arl_k_scale_rows). */
void arl_k_dot_rows(float *out, const float *a, const float *b, int64_t T, int64_t d);

#endif
