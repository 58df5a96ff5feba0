/* kernels/cpu/softmax.c: softmax, log-softmax and target log-probabilities of kernels/softmax.h.
 * Row maximum subtracted before exp; exp in fp32, sums in double; rows in parallel. */
#include "kernels/softmax.h"

#include <math.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"

typedef struct sm_args {
    float *y, *dx, *lse, *entropy;
    const float *x, *dy;
    const int32_t *targets;
    int64_t n, d;
} sm_args;

static float row_max(const float *x, int64_t d) {
    float m = x[0];
    for (int64_t i = 1; i < d; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* log sum_i exp(x_i) of one row, computed as m + log sum exp(x_i - m). */
static double row_logsumexp(const float *x, int64_t d) {
    float m = row_max(x, d);
    double s = 0.0;
    for (int64_t i = 0; i < d; i++)
        s += expf(x[i] - m);
    return (double)m + log(s);
}

/* ---- softmax ---- */

static void softmax_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d;
        float *y = a->y + t * d;
        float m = row_max(x, d);
        if (m == -INFINITY) { /* fully masked row */
            for (int64_t i = 0; i < d; i++)
                y[i] = 0.0f;
            continue;
        }
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) {
            y[i] = expf(x[i] - m);
            s += y[i];
        }
        double inv = 1.0 / s;
        for (int64_t i = 0; i < d; i++)
            y[i] = (float)(y[i] * inv);
    }
}

void arl_k_softmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    sm_args a = {.y = y, .x = x, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), softmax_fwd_rows, &a);
}

static void softmax_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *y = a->x + t * d, *dy = a->dy + t * d;
        float *dx = a->dx + t * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++)
            s += (double)y[i] * dy[i];
        for (int64_t i = 0; i < d; i++)
            dx[i] += (float)(y[i] * (dy[i] - s));
    }
}

void arl_k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    sm_args a = {.dx = dx, .x = y, .dy = dy, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), softmax_bwd_rows, &a);
}

/* ---- log-softmax ---- */

static void logsoftmax_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d;
        float *y = a->y + t * d;
        double lse = row_logsumexp(x, d);
        for (int64_t i = 0; i < d; i++)
            y[i] = (float)((double)x[i] - lse);
    }
}

void arl_k_logsoftmax_fwd(float *y, const float *x, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    sm_args a = {.y = y, .x = x, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), logsoftmax_fwd_rows, &a);
}

static void logsoftmax_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *y = a->x + t * d, *dy = a->dy + t * d;
        float *dx = a->dx + t * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++)
            s += dy[i];
        for (int64_t i = 0; i < d; i++)
            dx[i] += (float)(dy[i] - expf(y[i]) * s);
    }
}

void arl_k_logsoftmax_bwd(float *dx, const float *dy, const float *y, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    sm_args a = {.dx = dx, .x = y, .dy = dy, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), logsoftmax_bwd_rows, &a);
}

/* ---- log-probability of targets ---- */

static void logprob_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t V = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *z = a->x + t * V;
        float m = row_max(z, V);
        double s = 0.0, sz = 0.0; /* sum e_j and sum e_j (z_j - m), e_j = exp(z_j - m) */
        for (int64_t j = 0; j < V; j++) {
            float zm = z[j] - m;
            double e = expf(zm);
            s += e;
            sz += e * zm;
        }
        double lse = (double)m + log(s);
        int32_t y = a->targets[t];
        ARL_ASSERT(y < V);
        a->y[t] = y < 0 ? 0.0f : (float)((double)z[y] - lse);
        if (a->lse) a->lse[t] = (float)lse;
        /* H = -sum p log p = log s - sum e (z - m) / s */
        if (a->entropy) a->entropy[t] = (float)(log(s) - sz / s);
    }
}

void arl_k_logprob_fwd(float *logp, float *lse, float *entropy, const float *logits,
                       const int32_t *targets, int64_t n, int64_t V) {
    ARL_ASSERT(n >= 0 && V >= 1);
    sm_args a = {
        .y = logp, .lse = lse, .entropy = entropy, .x = logits, .targets = targets, .n = n, .d = V};
    arl_k_parallel_for(n, arl_k_row_grain(V), logprob_fwd_rows, &a);
}

static void logprob_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const sm_args *a = vctx;
    int64_t V = a->d;
    for (int64_t t = begin; t < end; t++) {
        int32_t y = a->targets[t];
        if (y < 0) continue;
        ARL_ASSERT(y < V);
        const float *z = a->x + t * V;
        float *dz = a->dx + t * V;
        double g = a->dy[t];
        float lse = a->lse[t];
        for (int64_t j = 0; j < V; j++) {
            double p = expf(z[j] - lse);
            dz[j] += (float)(j == y ? g * (1.0 - p) : -g * p);
        }
    }
}

void arl_k_logprob_bwd(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                       const int32_t *targets, int64_t n, int64_t V) {
    ARL_ASSERT(n >= 0 && V >= 1);
    sm_args a = {.dx = dlogits,
                 .dy = dlogp,
                 .x = logits,
                 .lse = (float *)lse,
                 .targets = targets,
                 .n = n,
                 .d = V};
    arl_k_parallel_for(n, arl_k_row_grain(V), logprob_bwd_rows, &a);
}
