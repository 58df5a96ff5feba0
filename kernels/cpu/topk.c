/* kernels/cpu/topk.c: argmax and top-k of kernels/topk.h.  Top-k keeps the k best seen so far in
 * a binary heap with the worst at the root (in the caller's idx row), then heap-sorts it. */
#include "kernels/topk.h"

#include <math.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"

/* The total order of kernels/topk.h: does element i rank above element j? */
static inline int ranks_above(const float *x, int32_t i, int32_t j) {
    float a = x[i], b = x[j];
    int an = isnan(a), bn = isnan(b);
    if (an || bn) return an && bn ? i < j : bn;
    if (a != b) return a > b;
    return i < j;
}

/* Restore the heap below pos: every parent ranks at or below its children (worst at root). */
static void sift_down(const float *x, int32_t *h, int64_t size, int64_t pos) {
    for (;;) {
        int64_t c = 2 * pos + 1;
        if (c >= size) return;
        if (c + 1 < size && ranks_above(x, h[c], h[c + 1])) c++; /* the worse child */
        if (!ranks_above(x, h[pos], h[c])) return;
        int32_t tmp = h[pos];
        h[pos] = h[c];
        h[c] = tmp;
        pos = c;
    }
}

static void topk_row(int32_t *h, const float *x, int64_t d, int64_t k) {
    for (int64_t i = 0; i < k; i++)
        h[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(x, h, k, i);
    for (int64_t j = k; j < d; j++) {
        if (ranks_above(x, (int32_t)j, h[0])) {
            h[0] = (int32_t)j;
            sift_down(x, h, k, 0);
        }
    }
    /* heap-sort: move the worst to the back until the row is best first */
    for (int64_t size = k; size > 1; size--) {
        int32_t tmp = h[0];
        h[0] = h[size - 1];
        h[size - 1] = tmp;
        sift_down(x, h, size - 1, 0);
    }
}

typedef struct sel_args {
    int32_t *idx;
    float *val;
    const float *x;
    int64_t d, k;
} sel_args;

static void topk_rows_range(void *vctx, int64_t begin, int64_t end) {
    const sel_args *a = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * a->d;
        int32_t *idx = a->idx + t * a->k;
        topk_row(idx, x, a->d, a->k);
        if (a->val)
            for (int64_t i = 0; i < a->k; i++)
                a->val[t * a->k + i] = x[idx[i]];
    }
}

void arl_k_topk_rows(int32_t *idx, float *val, const float *x, int64_t n, int64_t d, int64_t k) {
    ARL_ASSERT(n >= 0 && k >= 0 && k <= d && d <= INT32_MAX);
    if (k == 0) return;
    sel_args a = {idx, val, x, d, k};
    arl_k_parallel_for(n, arl_k_row_grain(d), topk_rows_range, &a);
}

static void argmax_rows_range(void *vctx, int64_t begin, int64_t end) {
    const sel_args *a = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * a->d;
        int32_t best = 0;
        for (int64_t j = 1; j < a->d; j++)
            if (ranks_above(x, (int32_t)j, best)) best = (int32_t)j;
        a->idx[t] = best;
    }
}

void arl_k_argmax_rows(int32_t *idx, const float *x, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1 && d <= INT32_MAX);
    sel_args a = {idx, NULL, x, d, 1};
    arl_k_parallel_for(n, arl_k_row_grain(d), argmax_rows_range, &a);
}
