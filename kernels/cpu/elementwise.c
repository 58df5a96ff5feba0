/* kernels/cpu/elementwise.c: fp32 elementwise arithmetic of kernels/elementwise.h. */
#include "kernels/elementwise.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"

typedef enum ew_kind {
    EW_FILL,
    EW_COPY,
    EW_ADD,
    EW_MUL,
    EW_MUL_ACC,
    EW_SCALE,
    EW_AXPY,
} ew_kind;

typedef struct ew_args {
    ew_kind kind;
    float *y;
    const float *a, *b;
    float alpha;
} ew_args;

static void ew_range(void *vctx, int64_t s, int64_t e) {
    const ew_args *k = vctx;
    float *y = k->y;
    const float *a = k->a, *b = k->b;
    float alpha = k->alpha;
    switch (k->kind) {
    case EW_FILL:
        if (alpha == 0.0f && !signbit(alpha)) { /* +0.0f is all zero bits: libc's memset */
            memset(y + s, 0, (size_t)(e - s) * sizeof *y);
            break;
        }
        for (int64_t i = s; i < e; i++)
            y[i] = alpha;
        break;
    case EW_COPY:
        if (y != a) memcpy(y + s, a + s, (size_t)(e - s) * sizeof *y);
        break;
    case EW_ADD:
        for (int64_t i = s; i < e; i++)
            y[i] = a[i] + b[i];
        break;
    case EW_MUL:
        for (int64_t i = s; i < e; i++)
            y[i] = a[i] * b[i];
        break;
    case EW_MUL_ACC:
        for (int64_t i = s; i < e; i++)
            y[i] += a[i] * b[i];
        break;
    case EW_SCALE:
        for (int64_t i = s; i < e; i++)
            y[i] = alpha * a[i];
        break;
    case EW_AXPY:
        for (int64_t i = s; i < e; i++)
            y[i] += alpha * a[i];
        break;
    }
}

static void ew(ew_kind kind, float *y, const float *a, const float *b, float alpha, int64_t n) {
    ARL_ASSERT(n >= 0);
    ew_args k = {kind, y, a, b, alpha};
    arl_k_parallel_for(n, ARL_K_GRAIN, ew_range, &k);
}

void arl_k_fill(float *y, float v, int64_t n) {
    ew(EW_FILL, y, NULL, NULL, v, n);
}
void arl_k_copy(float *y, const float *x, int64_t n) {
    ew(EW_COPY, y, x, NULL, 0, n);
}
void arl_k_add(float *y, const float *a, const float *b, int64_t n) {
    ew(EW_ADD, y, a, b, 0, n);
}
void arl_k_mul(float *y, const float *a, const float *b, int64_t n) {
    ew(EW_MUL, y, a, b, 0, n);
}
void arl_k_mul_acc(float *y, const float *a, const float *b, int64_t n) {
    ew(EW_MUL_ACC, y, a, b, 0, n);
}
void arl_k_scale(float *y, const float *x, float alpha, int64_t n) {
    ew(EW_SCALE, y, x, NULL, alpha, n);
}
void arl_k_axpy(float *y, float alpha, const float *x, int64_t n) {
    ew(EW_AXPY, y, x, NULL, alpha, n);
}

typedef struct rows_args {
    float *y;
    const float *x, *s;
    int64_t d;
} rows_args;

static void scale_rows_range(void *vctx, int64_t begin, int64_t end) {
    const rows_args *k = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *x = k->x + t * k->d;
        float *y = k->y + t * k->d;
        float s = k->s[t];
        for (int64_t j = 0; j < k->d; j++)
            y[j] = s * x[j];
    }
}

void arl_k_scale_rows(float *y, const float *x, const float *s, int64_t T, int64_t d) {
    ARL_ASSERT(T >= 0 && d >= 0);
    if (d == 0) return;
    rows_args k = {y, x, s, d};
    arl_k_parallel_for(T, arl_k_row_grain(d), scale_rows_range, &k);
}
