/* bench/gpu/bench_train.c: one training step of the policy on the GPU
 * (policy/model_device_backward.h: forward with saves, backward, AdamW on the device) against
 * the cuBLAS bf16 GEMM rate measured in the same run: the step's model FLOP utilisation (MFU)
 * of the mini config (configs/mini); target >= 25% (issue 9).
 *
 * FLOPs counted (model FLOPs of a step, the usual MFU convention): 3 x the forward's (forward
 * + backward at twice the forward), the forward as bench/gpu/bench_model.c counts it
 * (bench/gpu/gpu_common.h bench_gpu_forward_flops: 2 x active parameters, lm_head included and
 * the embedding gather excluded, x tokens, plus the attention cores).  Recomputation (the logits
 * again in the backward) and the optimizer are not counted, though their time is.
 *
 * Weights: deterministic small uniform values (bench_gpu_params_fill), norms 1.  Runs:
 * ARL_CUDA_MATH_BF16 (bf16 GEMM inputs, fp32 accumulation, fp32 master weights and moments) and
 * ARL_CUDA_MATH_TF32.  Batch: 8 documents of 256 tokens (T = 2048; --quick: the tiny config, 2 x
 * 32; --docs N --len L: another batch, its RESULT keys suffixed _T<tokens>; --bf16: that mode
 * alone; --bf16-weights: the bf16 mode alone on a model keeping bf16 weight copies, as a learner
 * under learner.device-math bf16 does (arl_model_dev_opts bf16_weights: AdamW refreshes them in
 * its pass and the forward's weight GEMMs read them, the experts' activations rounded once where
 * made), keys train_step_bf16w...).  AdamW's time
 * does not depend on the batch, so at 2048 tokens it alone caps the mini step's MFU near 30%:
 * run.sh also measures 16 x 1024 tokens, a learner batch where 25% is reachable.  Prints the median
 * of 5 steps after 2 warm-up steps, and the forward (with saves) and the optimizer step
 * alone.  Output: human-readable lines and "RESULT key=value".  Exits 77 without a GPU.
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
#include "policy/model_device_backward.h"
#include "policy/params.h"

static void die(const char *what) {
    fprintf(stderr, "bench_gpu_train: %s: %s\n", what, arl_error_msg());
    exit(1);
}

/* Median of n timings of fn (after warm-up calls), seconds; spread in lo, hi. */
typedef arl_status (*timed_fn)(void *);
static double time_median(timed_fn fn, void *arg, int warm, int n, double *lo, double *hi) {
    double t[16];
    for (int r = -warm; r < n; r++) {
        double a = bench_gpu_now_s();
        if (fn(arg)) die("timed call");
        if (r >= 0) t[r] = bench_gpu_now_s() - a;
    }
    qsort(t, (size_t)n, sizeof(double), bench_gpu_cmp_double);
    *lo = t[0];
    *hi = t[n - 1];
    return t[n / 2];
}

typedef struct step_arg {
    arl_model_dev_train *tr;
    const arl_batch *b;
} step_arg;

static arl_status run_step(void *v) {
    step_arg *s = v;
    double loss;
    return arl_model_dev_train_step(s->tr, s->b, &loss, NULL);
}
static arl_status run_fwd(void *v) {
    step_arg *s = v;
    return arl_model_dev_train_forward(s->tr, s->b, NULL);
}
static arl_status run_opt(void *v) {
    step_arg *s = v;
    return arl_model_dev_optim_step(s->tr, NULL);
}

typedef struct topts {
    int quick, bf16, bf16_weights;
    int64_t docs, len;
} topts;

static const arl_option OPTS[] = {
    {"quick", ARL_OPT_BOOL, offsetof(topts, quick), "false",
     "the tiny config, 2 x 32 tokens (a smoke run)", 0, 0, NULL, 0, NULL},
    {"bf16", ARL_OPT_BOOL, offsetof(topts, bf16), "false", "the bf16 math mode alone", 0, 0, NULL,
     0, NULL},
    {"bf16-weights", ARL_OPT_BOOL, offsetof(topts, bf16_weights), "false",
     "the bf16 mode alone on a model keeping bf16 weight copies", 0, 0, NULL, 0, NULL},
    {"docs", ARL_OPT_INT, offsetof(topts, docs), "0",
     "documents of the batch (0: 8, --quick 2; another batch suffixes the RESULT keys _T<tokens>)",
     0, 4096, NULL, 0, "N"},
    {"len", ARL_OPT_INT, offsetof(topts, len), "0", "tokens per document (0: 256, --quick 32)", 0,
     1 << 20, NULL, 0, "L"},
};

int main(int argc, char **argv) {
    topts op;
    const char *summary = "one training step of the mini config on the GPU against the cuBLAS "
                          "bf16 rate of the same run: the step's MFU (exits 77 without a GPU)";
    int parsed = bench_options_parse("bench_gpu_train", summary, OPTS, ARL_OPTIONS_COUNT(OPTS),
                                     argc, argv, &op);
    if (parsed >= 0) return parsed;
    const int quick = op.quick, bf16w = op.bf16_weights, bf16_only = op.bf16 || op.bf16_weights;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out at once: a timeout keeps them */
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "bench_gpu_train: no CUDA device (or a build without CUDA)\n");
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
    /* --docs N --len L: another token batch (default 8 x 256; --quick 2 x 32) */
    const int32_t N = op.docs ? (int32_t)op.docs : quick ? 2 : 8;
    const int64_t len = op.len ? op.len : quick ? 32 : 256;
    char sfx[32] = ""; /* RESULT key suffix of a batch other than the default */
    const int64_t T = N * len;
    if (T != (quick ? 64 : 2048)) snprintf(sfx, sizeof sfx, "_T%lld", (long long)T);
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = T;
    o.max_docs = N;
    arl_model_dev_opts dopts = {.bf16_weights = bf16w};
    arl_model_dev plan;
    if (arl_model_dev_plan(&plan, arl_dev_ops_cuda(), &cfg, &o, &dopts)) die("plan");
    int64_t need = arl_model_dev_bytes(&cfg, &o, arl_dev_ops_cuda(), &dopts) +
                   arl_model_dev_train_bytes(&plan);
    const arl_dev_ops *ops = NULL;
    if (arl_dev_ops_get("cuda", (size_t)need + ((size_t)1 << 30), &ops)) die("cuda device");
    arl_cuda_ctx *ctx = arl_cuda_current();
    arl_model_dev md;
    arl_model_dev_train tr;
    arl_optim_config oc;
    arl_optim_config_defaults(&oc);
    oc.lr = 1e-5; /* small steps keep the timed weights in range */
    if (arl_model_dev_init(&md, ops, &cfg, &w, &o, &dopts)) die("device model");
    if (arl_model_dev_train_init(&tr, &md, &oc)) die("device training");
    printf("config %s: %.1f MiB on the device (model + training), weights in %.1f s\n", path,
           (double)need / 1048576.0, bench_gpu_now_s() - t0);

    double peak = bench_gpu_cublas_bf16_tflops(ctx, quick ? 2048 : 8192);
    if (peak <= 0.0) die("cuBLAS bf16 GEMM");
    printf("cuBLAS bf16 GEMM: %.1f TFLOP/s\n", peak);

    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(N + 1));
    bench_gpu_batch_fill(tok, cu, N, len, cfg.dims.V, &rng);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N};

    const double flops = 3.0 * bench_gpu_forward_flops(&cfg, N, len, o.kda_chunk);

    const char *names[2] = {bf16w ? "bf16w" : "bf16", "tf32"};
    const arl_cuda_math modes[2] = {ARL_CUDA_MATH_BF16, ARL_CUDA_MATH_TF32};
    step_arg sa = {&tr, &b};
    for (int mi = 0; mi < (bf16_only ? 1 : 2); mi++) {
        arl_cuda_set_math(ctx, modes[mi]);
        double lo, hi, flo, fhi, olo, ohi;
        double ts = time_median(run_step, &sa, 2, 5, &lo, &hi);
        double tf = time_median(run_fwd, &sa, 1, 5, &flo, &fhi);
        double to = time_median(run_opt, &sa, 1, 5, &olo, &ohi);
        double rate = flops / ts / 1e12;
        printf("training step (%s GEMMs%s), T = %lld in %d documents: %.2f ms (spread %.2f..%.2f), "
               "%.2f TFLOP/s, MFU %.1f%% of cuBLAS bf16 (forward with saves %.2f ms, AdamW "
               "%.2f ms, backward ~%.2f ms)\n",
               names[mi], bf16w ? ", bf16 weight copies" : "", (long long)T, N, ts * 1e3, lo * 1e3,
               hi * 1e3, rate, 100.0 * rate / peak, tf * 1e3, to * 1e3, (ts - tf - to) * 1e3);
        printf("RESULT train_step_%s%s_ms=%.3f\nRESULT train_step_%s%s_mfu=%.4f\n", names[mi], sfx,
               ts * 1e3, names[mi], sfx, rate / peak);
        /* AdamW reads and writes every parameter whatever the batch: the MFU this step could
         * reach were the forward and backward free (the token batch that a target needs) */
        printf("RESULT train_step_%s%s_mfu_bound_adamw=%.4f\n", names[mi], sfx,
               flops / to / 1e12 / peak);
        if (mi == 0) { /* where one bf16 step's GPU time goes, per op of the device table */
            if (arl_cuda_profile_begin(ctx) || run_step(&sa) || arl_cuda_profile_end(ctx, stdout))
                die("profiled step");
        }
    }
    printf("RESULT train_cublas_bf16_tflops=%.2f\n", peak);
    printf("RESULT train_step%s_gflop=%.1f\n", sfx, flops / 1e9);
    arl_model_dev_train_free(&tr);
    arl_model_dev_free(&md);
    arl_model_params_free(&w);
    arl_model_config_free(&cfg);
    arl_optim_config_free(&oc);
    free(tok);
    free(cu);
    return 0;
}
