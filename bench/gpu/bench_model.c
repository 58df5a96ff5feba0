/* bench/gpu/bench_model.c: whole-model forward throughput of the policy on the GPU
 * (policy/model_device.h, "cuda" ops) against the cuBLAS bf16 GEMM rate measured in the same
 * run: the forward's model FLOP utilisation (MFU) of the mini config (configs/mini).
 *
 * FLOPs counted (forward, per batch): bench/gpu/gpu_common.h bench_gpu_forward_flops (2 x
 * active parameters x tokens plus the attention cores).  The training step's MFU is
 * bench/gpu/bench_train.c's, on the same count.
 *
 * Weights: deterministic small uniform values (bench_gpu_params_fill; scale 1/sqrt(fan-in) is
 * not needed for a timing), norms 1.  Three runs: fp32 weights with ARL_CUDA_MATH_BF16 GEMMs (bf16
 * inputs, fp32 accumulate), with ARL_CUDA_MATH_TF32, and the bf16 weight copies (bf16_weights: bf16
 * storage, fp32 accumulate).  Batch: 8 documents of 256 tokens (T = 2048;
 * --quick: the tiny config, 2 x 32).  Output: human-readable lines and "RESULT key=value".
 * Exits 77 without a GPU.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/bench.h"
#include "bench/gpu/gpu_common.h"
#include "core/options.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/ops.h"
#include "policy/config.h"
#include "policy/model_device.h"
#include "policy/params.h"

static void die(const char *what) {
    fprintf(stderr, "bench_gpu_model: %s: %s\n", what, arl_error_msg());
    exit(1);
}

typedef struct mopts {
    int quick;
} mopts;

static const arl_option OPTS[] = {
    {"quick", ARL_OPT_BOOL, offsetof(mopts, quick), "false",
     "the tiny config, 2 x 32 tokens (a smoke run)", 0, 0, NULL, 0, NULL},
};

int main(int argc, char **argv) {
    mopts op;
    const char *summary = "the mini config's whole forward on the GPU against the cuBLAS bf16 "
                          "rate of the same run: its MFU (exits 77 without a GPU)";
    int parsed = bench_options_parse("bench_gpu_model", summary, OPTS, ARL_OPTIONS_COUNT(OPTS),
                                     argc, argv, &op);
    if (parsed >= 0) return parsed;
    const int quick = op.quick;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out at once: a timeout keeps them */
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "bench_gpu_model: no CUDA device (or a build without CUDA)\n");
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
    double t0 = bench_gpu_now_s();
    arl_rng rng;
    arl_rng_seed(&rng, 9);
    bench_gpu_params_fill(&w, &rng);
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
           (double)need / 1048576.0, bench_gpu_now_s() - t0);

    double peak = bench_gpu_cublas_bf16_tflops(ctx, quick ? 2048 : 8192);
    if (peak <= 0.0) die("cuBLAS bf16 GEMM");
    printf("cuBLAS bf16 GEMM: %.1f TFLOP/s\n", peak);

    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *tgt = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(N + 1));
    float *lp = malloc(sizeof(float) * (size_t)T);
    bench_gpu_batch_fill(tok, cu, N, len, cfg.dims.V, &rng);
    arl_batch_next_token_targets(tgt, tok, cu, N, T);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N, .targets = tgt};
    arl_forward_out out = {.logprobs = lp};

    const double flops = bench_gpu_forward_flops(&cfg, N, len, o.kda_chunk);

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
            double a = bench_gpu_now_s();
            if (arl_model_dev_forward(&md, &b, &out)) die("forward");
            if (r >= 0) t[r] = bench_gpu_now_s() - a;
        }
        qsort(t, 7, sizeof(double), bench_gpu_cmp_double);
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
