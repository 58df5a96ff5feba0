/* kernels/cpu/reduce.c: deterministic reductions of kernels/reduce.h (double accumulators,
 * fixed chunking that depends on n only). */
#include "kernels/reduce.h"

#include <math.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"

/* Columns summed together by one task in arl_k_sum_cols (stack accumulators). */
#define COL_BLOCK 256

typedef enum red_kind { RED_SUM, RED_SUMSQ, RED_MAX } red_kind;

typedef struct red_args {
    red_kind kind;
    const float *x;
    int64_t n, chunk;
    double part[ARL_K_REDUCE_CHUNKS]; /* one result per chunk */
} red_args;

static void red_chunks(void *vctx, int64_t begin, int64_t end) {
    red_args *a = vctx;
    for (int64_t c = begin; c < end; c++) {
        int64_t s = c * a->chunk, e = s + a->chunk < a->n ? s + a->chunk : a->n;
        const float *x = a->x;
        double acc = 0.0;
        switch (a->kind) {
        case RED_SUM:
            for (int64_t i = s; i < e; i++)
                acc += x[i];
            break;
        case RED_SUMSQ:
            for (int64_t i = s; i < e; i++)
                acc += (double)x[i] * x[i];
            break;
        case RED_MAX: {
            float m = -INFINITY;
            int nan = 0;
            for (int64_t i = s; i < e; i++) {
                if (isnan(x[i]))
                    nan = 1;
                else if (x[i] > m)
                    m = x[i];
            }
            acc = nan ? NAN : m;
            break;
        }
        }
        a->part[c] = acc;
    }
}

static float reduce_all(red_kind kind, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    if (n == 0) return kind == RED_MAX ? -INFINITY : 0.0f;
    red_args a = {.kind = kind, .x = x, .n = n};
    a.chunk = (n + ARL_K_REDUCE_CHUNKS - 1) / ARL_K_REDUCE_CHUNKS;
    if (a.chunk < ARL_K_REDUCE_MIN_CHUNK) a.chunk = ARL_K_REDUCE_MIN_CHUNK;
    int64_t chunks = (n + a.chunk - 1) / a.chunk;
    arl_k_parallel_for(chunks, arl_k_grain_items(a.chunk, ARL_K_GRAIN), red_chunks, &a);
    double r = a.part[0];
    for (int64_t c = 1; c < chunks; c++) {
        if (kind == RED_MAX)
            r = (isnan(r) || isnan(a.part[c])) ? NAN : fmax(r, a.part[c]);
        else
            r += a.part[c];
    }
    return (float)r;
}

void arl_k_sum(float *out, const float *x, int64_t n) {
    *out = reduce_all(RED_SUM, x, n);
}
void arl_k_sumsq(float *out, const float *x, int64_t n) {
    *out = reduce_all(RED_SUMSQ, x, n);
}
void arl_k_max(float *out, const float *x, int64_t n) {
    *out = reduce_all(RED_MAX, x, n);
}

typedef struct rows_args {
    float *out;
    const float *a, *b; /* b == NULL: plain row sums */
    int64_t T, d;
} rows_args;

static void rows_range(void *vctx, int64_t begin, int64_t end) {
    const rows_args *k = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *a = k->a + t * k->d;
        double acc = 0.0;
        if (k->b) {
            const float *b = k->b + t * k->d;
            for (int64_t j = 0; j < k->d; j++)
                acc += (double)a[j] * b[j];
        } else {
            for (int64_t j = 0; j < k->d; j++)
                acc += a[j];
        }
        k->out[t] = (float)acc;
    }
}

void arl_k_sum_rows(float *out, const float *x, int64_t T, int64_t d) {
    ARL_ASSERT(T >= 0 && d >= 0);
    rows_args k = {out, x, NULL, T, d};
    arl_k_parallel_for(T, arl_k_row_grain(d), rows_range, &k);
}

void arl_k_dot_rows(float *out, const float *a, const float *b, int64_t T, int64_t d) {
    ARL_ASSERT(T >= 0 && d >= 0);
    rows_args k = {out, a, b, T, d};
    arl_k_parallel_for(T, arl_k_row_grain(d), rows_range, &k);
}

static void cols_blocks(void *vctx, int64_t begin, int64_t end) {
    const rows_args *k = vctx;
    double acc[COL_BLOCK];
    for (int64_t blk = begin; blk < end; blk++) {
        int64_t j0 = blk * COL_BLOCK, j1 = j0 + COL_BLOCK < k->d ? j0 + COL_BLOCK : k->d;
        for (int64_t j = j0; j < j1; j++)
            acc[j - j0] = 0.0;
        for (int64_t t = 0; t < k->T; t++) {
            const float *x = k->a + t * k->d;
            for (int64_t j = j0; j < j1; j++)
                acc[j - j0] += x[j];
        }
        for (int64_t j = j0; j < j1; j++)
            k->out[j] = (float)acc[j - j0];
    }
}

void arl_k_sum_cols(float *out, const float *x, int64_t T, int64_t d) {
    ARL_ASSERT(T >= 0 && d >= 0);
    rows_args k = {out, x, NULL, T, d};
    int64_t blocks = (d + COL_BLOCK - 1) / COL_BLOCK;
    arl_k_parallel_for(blocks, arl_k_grain_items(T * COL_BLOCK, ARL_K_GRAIN), cols_blocks, &k);
}
