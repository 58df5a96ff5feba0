/* bench/gpu/bench_model.c: whole-model forward throughput of the policy on the GPU
 * (policy/model_device.h, "cuda" ops) against the cuBLAS bf16 GEMM rate measured in the same
 * run: the forward's model FLOP utilisation (MFU) of the mini config (configs/mini).
 *
 * FLOPs counted (forward, per batch): 2 x active parameters (lm_head included, input
 * embedding excluded: a gather) x tokens, plus the attention cores: MLA 2 x (n + r + vm) x Hm
 * per causal (query, key) pair, KDA chunkwise per head 6 T dk^2 + 3 T C dk + T C^2 (spec 3.5).
 * A training step is forward + backward (~3x the forward's FLOPs); it is not on the device yet,
 * so this prints the forward's MFU and says so.
 *
 * Weights: deterministic small uniform values (scale 1/sqrt(fan-in) is not needed for a
 * timing), norms 1.  Three runs: fp32 weights with ARL_CUDA_MATH_BF16 GEMMs (bf16 inputs,
 * fp32 accumulate), with ARL_CUDA_MATH_TF32, and the bf16 weight copies (bf16_weights: bf16
 * storage, fp32 accumulate).  Batch: 8 documents of 256 tokens (T = 2048;
 * --quick: the tiny config, 2 x 32).  Output: human-readable lines and "RESULT key=value".
 * Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/ops.h"
#include "policy/config.h"
#include "policy/model_device.h"
#include "policy/params.h"

static void die(const char *what) {
    fprintf(stderr, "bench_model: %s: %s\n", what, arl_error_msg());
    exit(1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* cuBLAS bf16 GEMM rate (M = N = K = n), median of 10 (TFLOP/s). */
static double cublas_bf16_tflops(arl_cuda_ctx *ctx, int64_t n) {
    size_t mark = arl_cuda_mark(ctx);
    void *a, *b, *c;
    if (arl_cuda_alloc(ctx, 2 * (size_t)(n * n), "A", &a) ||
        arl_cuda_alloc(ctx, 2 * (size_t)(n * n), "B", &b) ||
        arl_cuda_alloc(ctx, 4 * (size_t)(n * n), "C", &c))
        die("arena");
    arl_cuda_memset0(ctx, a, 2 * (size_t)(n * n)); /* timing does not depend on values */
    arl_cuda_memset0(ctx, b, 2 * (size_t)(n * n));
    double t[10];
    for (int r = -1; r < 10; r++) {
        arl_cuda_timer_start(ctx);
        if (arl_cuda_gemm_bf16(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n)) die("gemm_bf16");
        float ms = arl_cuda_timer_stop(ctx);
        if (r >= 0) t[r] = ms;
    }
    qsort(t, 10, sizeof(double), cmp_double);
    arl_cuda_release(ctx, mark);
    return 2.0 * (double)n * n * n / (t[5] * 1e-3) / 1e12;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out at once: a timeout keeps them */
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "bench_model: no CUDA device (or a build without CUDA)\n");
        return 77;
    }
    const char *root = getenv("ARL_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/%s/config.json", root ? root : ".",
             quick ? "tiny" : "mini");
    arl_model_config cfg;
    arl_model_params w;
    if (arl_model_config_read(path, &cfg)) die(path);
    if (arl_model_params_alloc(&w, &cfg)) die("host parameters");
    double t0 = now_s();
    arl_rng rng;
    arl_rng_seed(&rng, 9);
    for (int64_t i = 0; i < w.inv.n; i++) {
        const arl_param_tensor *t = &w.inv.t[i];
        float *p = arl_model_params_tensor(&w, i);
        if (t->init == ARL_INIT_ONES) {
            for (int64_t j = 0; j < t->numel; j++)
                p[j] = 1.0f;
        } else if (t->init != ARL_INIT_ZEROS) {
            uint64_t s = arl_rng_next(&rng) | 1; /* xorshift per tensor: fast fill */
            for (int64_t j = 0; j < t->numel; j++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                p[j] = ((float)(s >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.04f;
            }
        }
    }
    const int32_t N = quick ? 2 : 8;
    const int64_t len = quick ? 32 : 256, T = N * len;
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = T;
    o.max_docs = N;
    arl_model_dev_opts dopts = {.n_slots = 0, .bf16_weights = 1, .decode_graphs = 0};
    int64_t need = arl_model_dev_bytes(&cfg, &o, arl_dev_ops_cuda(), &dopts);
    const arl_dev_ops *ops = NULL;
    if (need < 0 || arl_dev_ops_get("cuda", (size_t)need + ((size_t)1 << 30), &ops))
        die("cuda device");
    arl_cuda_ctx *ctx = arl_cuda_current();
    arl_model_dev md;
    if (arl_model_dev_init(&md, ops, &cfg, &w, &o, &dopts)) die("device model");
    printf("config %s: %.1f MiB on the device, weights filled and uploaded in %.1f s\n", path,
           (double)need / 1048576.0, now_s() - t0);

    double peak = cublas_bf16_tflops(ctx, quick ? 2048 : 8192);
    printf("cuBLAS bf16 GEMM: %.1f TFLOP/s\n", peak);

    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *tgt = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(N + 1));
    float *lp = malloc(sizeof(float) * (size_t)T);
    for (int64_t t = 0; t < T; t++)
        tok[t] = (int32_t)arl_rng_below(&rng, (uint64_t)cfg.dims.V);
    for (int32_t i = 0; i <= N; i++)
        cu[i] = (int32_t)(i * len);
    arl_batch_next_token_targets(tgt, tok, cu, N, T);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N, .targets = tgt};
    arl_forward_out out = {.logprobs = lp};

    arl_param_counts pc;
    arl_param_counts_compute(&cfg, &pc);
    const arl_model_dims *dm = &cfg.dims;
    const double C = (double)o.kda_chunk;
    double flops = 2.0 * (double)pc.active_params * (double)T;
    flops += (double)dm->n_mla * 2.0 * (double)(dm->n + dm->r + dm->vm) * (double)dm->Hm *
             (double)N * (double)len * (double)(len + 1) / 2.0;
    flops += (double)dm->n_kda * (double)dm->H *
             (6.0 * T * dm->dk * dm->dk + 3.0 * T * C * dm->dk + T * C * C);

    /* fp32 weights with bf16 / tf32 GEMM inputs, then the bf16 weight copies (the model keeps
     * both; hiding wb16 selects the fp32 path for the first two runs) */
    const char *names[3] = {"bf16", "tf32", "bf16w"};
    const arl_cuda_math modes[3] = {ARL_CUDA_MATH_BF16, ARL_CUDA_MATH_TF32, ARL_CUDA_MATH_FP32};
    uint16_t *wb16 = md.wb16;
    for (int mi = 0; mi < 3; mi++) {
        arl_cuda_set_math(ctx, modes[mi]);
        md.wb16 = mi == 2 ? wb16 : NULL;
        double t[7];
        for (int r = -2; r < 7; r++) {
            double a = now_s();
            if (arl_model_dev_forward(&md, &b, &out)) die("forward");
            if (r >= 0) t[r] = now_s() - a;
        }
        qsort(t, 7, sizeof(double), cmp_double);
        double tf = flops / t[3] / 1e12;
        printf("forward (%s GEMMs), T = %lld in %d documents: %.2f ms (spread %.2f..%.2f), "
               "%.2f TFLOP/s, %.1f%% of cuBLAS bf16\n",
               names[mi], (long long)T, N, t[3] * 1e3, t[0] * 1e3, t[6] * 1e3, tf,
               100.0 * tf / peak);
        printf("RESULT model_fwd_%s_ms=%.3f\nRESULT model_fwd_%s_mfu=%.4f\n", names[mi], t[3] * 1e3,
               names[mi], tf / peak);
    }
    printf("RESULT model_cublas_bf16_tflops=%.2f\n", peak);
    printf("RESULT model_fwd_gflop=%.1f\n", flops / 1e9);
    arl_model_dev_free(&md);
    arl_model_params_free(&w);
    arl_model_config_free(&cfg);
    free(tok);
    free(tgt);
    free(cu);
    free(lp);
    return 0;
}
