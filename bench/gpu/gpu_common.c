/* bench/gpu/gpu_common.c: see gpu_common.h. */
#include "bench/gpu/gpu_common.h"

#include <stdlib.h>
#include <time.h>

#include "kernels/cuda/ops.h"

double bench_gpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int bench_gpu_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_gpu_cublas_bf16_tflops(arl_cuda_ctx *ctx, int64_t n) {
    const size_t nn = (size_t)(n * n);
    size_t mark = arl_cuda_mark(ctx);
    void *a, *b, *c;
    double t[10], rate = -1.0;
    if (arl_cuda_alloc(ctx, 2 * nn, "A", &a) || arl_cuda_alloc(ctx, 2 * nn, "B", &b) ||
        arl_cuda_alloc(ctx, 4 * nn, "C", &c))
        goto done;
    arl_cuda_memset0(ctx, a, 2 * nn);
    arl_cuda_memset0(ctx, b, 2 * nn);
    for (int r = -1; r < 10; r++) {
        arl_cuda_timer_start(ctx);
        if (arl_cuda_gemm_bf16(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n)) goto done;
        float ms = arl_cuda_timer_stop(ctx);
        if (r >= 0) t[r] = ms;
    }
    qsort(t, 10, sizeof(double), bench_gpu_cmp_double);
    rate = 2.0 * (double)n * (double)n * (double)n / (t[5] * 1e-3) / 1e12;
done:
    arl_cuda_release(ctx, mark);
    return rate;
}

void bench_gpu_params_fill(arl_model_params *w, arl_rng *rng) {
    for (int64_t i = 0; i < w->inv.n; i++) {
        const arl_param_tensor *t = &w->inv.t[i];
        float *p = arl_model_params_tensor(w, i);
        if (t->init == ARL_INIT_ONES) {
            for (int64_t j = 0; j < t->numel; j++)
                p[j] = 1.0f;
        } else if (t->init != ARL_INIT_ZEROS) {
            uint64_t s = arl_rng_next(rng) | 1;
            for (int64_t j = 0; j < t->numel; j++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                p[j] = ((float)(s >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.04f;
            }
        }
    }
}

void bench_gpu_batch_fill(int32_t *tok, int32_t *cu, int32_t N, int64_t len, int64_t V,
                          arl_rng *rng) {
    for (int64_t t = 0; t < (int64_t)N * len; t++)
        tok[t] = (int32_t)arl_rng_below(rng, (uint64_t)V);
    for (int32_t i = 0; i <= N; i++)
        cu[i] = (int32_t)(i * len);
}

double bench_gpu_forward_flops(const arl_model_config *cfg, int32_t N, int64_t len, int64_t C) {
    arl_param_counts pc;
    arl_param_counts_compute(cfg, &pc);
    const arl_model_dims *dm = &cfg->dims;
    const double T = (double)N * (double)len, c = (double)C;
    double f = 2.0 * (double)pc.active_params * T;
    f += (double)dm->n_mla * 2.0 * (double)(dm->n + dm->r + dm->vm) * (double)dm->Hm * (double)N *
         (double)len * (double)(len + 1) / 2.0;
    f += (double)dm->n_kda * (double)dm->H *
         (6.0 * T * (double)dm->dk * (double)dm->dk + 3.0 * T * c * (double)dm->dk + T * c * c);
    return f;
}
