/* kernels/topk.h: per-row selection - argmax and top-k with deterministic tie-breaking.
 *
 * It is: selection over n contiguous rows of width d (router scores (T, E), logits (T, V)).
 * The order used everywhere: element i ranks above element j iff x_i > x_j, or x_i == x_j and
 * i < j (ties go to the lower index, spec/policy.md section 15).  NaN ranks below every number
 * (-INFINITY included) and NaNs among themselves by index, so a NaN is never chosen over a
 * number and the result is still defined.  -0.0 and +0.0 are equal (tie -> lower index).
 * It is not: sampling, grouped top-k (K3 uses one group), or a sort of the whole row.
 *
 * Threads: rows in parallel; bit-identical for any thread count.  n == 0 is a no-op.
 */
#ifndef ARL_KERNELS_TOPK_H
#define ARL_KERNELS_TOPK_H

#include <stdint.h>

/* idx (n) = index of the largest element of each row of x (n, d), d >= 1; lowest index on ties. */
void arl_k_argmax_rows(int32_t *idx, const float *x, int64_t n, int64_t d);

/* The k best elements of each row of x (n, d), 0 <= k <= d, d <= INT32_MAX, best first:
 * idx (n, k) their column indices, val (n, k) their values (val may be NULL).
 * Cost O(d log k) per row, no allocation. */
void arl_k_topk_rows(int32_t *idx, float *val, const float *x, int64_t n, int64_t d, int64_t k);

#endif
