/* bench/gpu/bench_gpu.c: the CUDA backend's benchmark (issue 9), one program, every ratio
 * against baselines measured in the same run on the same GPU:
 *   - denominators: cuBLAS bf16 GEMM rate (8192^3, fp32 accumulate) and device-to-device copy
 *     bandwidth (cudaMemcpy of 2 GiB, bytes read + written per second);
 *   - KDA chunk forward at B=1, T=8192, H=64, D=128, C=64 (fp32): time, and its ratio to the
 *     time of copying its minimal bytes (q, k, v, g, beta in; o out) at the measured bandwidth;
 *   - KDA forward + backward (chunkwise backward from the chunk states) vs the forward, and
 *     the recurrent-rule backward's time;
 *   - MoE grouped GEMM (bf16, all experts in one launch) vs one dense cuBLAS bf16 GEMM of the
 *     same total rows, at the mini config's expert shapes (fine: E=128, k=8, 512x512) and a
 *     coarse shape (E=8, k=2, 2048x512); and the training step's three grouped GEMMs on fp32
 *     operands under the bf16 math mode (forward, input gradient, weight gradient);
 *   - the MoE routing plan's build at the full scale's 896 experts, top-16, 65536 tokens, vs
 *     copying its minimal bytes;
 *   - MLA prefill attention (mini dims: 8 heads, q/k 64+32, v 128, T=8192, causal): TFLOP/s,
 *     forward and backward;
 *   - the dense GEMMs of the training step (fp32 operands under the bf16 math mode) against
 *     bf16 operands at the same shapes, and the rounding pass bf16 operands would cost;
 *   - the KDA short convolution (mini: 1024 channels, width 4, 16 documents of 1024 tokens with
 *     tails), forward and backward, against the time of copying their minimal bytes;
 *   - row kernels at the training step's shapes (RMSNorm of the hidden 1024, L2 norm of
 *     128-wide heads, log-probs over the 384-token vocabulary) against their minimal bytes.
 * The PyTorch baselines (eager chunked KDA, SDPA) come from bench/gpu/torch_ref.py; run.sh
 * joins the two outputs.  Output: human-readable lines and "RESULT key=value" lines.
 * `--quick` shrinks every size (a smoke run of a few seconds).  Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/ops.h"

static arl_cuda_ctx *ctx;
static const arl_k_backend *kb;
static arl_rng rng;

static void die(const char *what) {
    fprintf(stderr, "bench_gpu: %s: %s\n", what, arl_error_msg());
    exit(1);
}

static void *dalloc(size_t bytes, const char *what) {
    void *p = NULL;
    if (arl_cuda_alloc(ctx, bytes, what, &p) != ARL_OK) die("arena");
    return p;
}

/* n uniform floats in [lo, hi) on the device (generated on the host in blocks). */
static float *drand(int64_t n, float lo, float hi, const char *what) {
    float *d = dalloc(sizeof(float) * (size_t)n, what);
    const int64_t blk = 1 << 22;
    float *h = malloc(sizeof(float) * (size_t)blk);
    if (!h) die("host memory");
    for (int64_t o = 0; o < n; o += blk) {
        int64_t m = n - o < blk ? n - o : blk;
        for (int64_t i = 0; i < m; i++)
            h[i] = lo + (hi - lo) * (float)arl_rng_uniform(&rng);
        if (arl_cuda_upload(ctx, d + o, h, sizeof(float) * (size_t)m) != ARL_OK) die("upload");
    }
    free(h);
    return d;
}

static void sync_or_die(const char *what) {
    if (arl_cuda_sync(ctx) != ARL_OK) die(what);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median of `reps` timed runs after one warm-up (ms). */
#define TIME_MS(out, reps, stmt)                                                                   \
    do {                                                                                           \
        float t_[32];                                                                              \
        stmt;                                                                                      \
        sync_or_die("warm-up");                                                                    \
        for (int r_ = 0; r_ < (reps); r_++) {                                                      \
            arl_cuda_timer_start(ctx);                                                             \
            stmt;                                                                                  \
            t_[r_] = arl_cuda_timer_stop(ctx);                                                     \
            sync_or_die("timed run");                                                              \
        }                                                                                          \
        qsort(t_, (size_t)(reps), sizeof(float), cmp_float);                                       \
        (out) = t_[(reps) / 2];                                                                    \
    } while (0)

static double gemm_tflops(int64_t M, int64_t N, int64_t K, int reps) {
    size_t mark = arl_cuda_mark(ctx);
    float *a32 = drand(M * K, -1, 1, "gemm A"), *b32 = drand(N * K, -1, 1, "gemm B");
    uint16_t *a = dalloc(2 * (size_t)(M * K), "gemm A bf16"), *b = dalloc(2 * (size_t)(N * K), "B");
    float *c = dalloc(sizeof(float) * (size_t)(M * N), "gemm C");
    arl_cuda_f32_to_bf16(a, a32, M * K);
    arl_cuda_f32_to_bf16(b, b32, N * K);
    float ms;
    TIME_MS(ms, reps,
            if (arl_cuda_gemm_bf16(0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N) != ARL_OK)
                die("gemm_bf16"));
    arl_cuda_release(ctx, mark);
    return 2.0 * (double)M * N * K / (ms * 1e-3) / 1e12;
}

/* ---------------------------------------------------------------- dense GEMMs */
/* The training step's dense GEMMs take fp32 operands and let cuBLAS compute in bf16
 * (ARL_CUDA_MATH_BF16: CUBLAS_COMPUTE_32F_FAST_16BF); against bf16 operands (the same shape
 * through arl_cuda_gemm_bf16) and the rounding pass that would make them (arl_cuda_f32_to_bf16
 * of both operands): says whether keeping bf16 copies of the activations would pay.  Shape: a
 * projection of the mini config at the 16 x 1024-token batch, (T, 1024) x (1024, N)^T. */
static void bench_dense(int quick, int64_t N, const char *tag) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t M = quick ? 2048 : 16384, K = 1024;
    float *a32 = drand(M * K, -1, 1, "dense A"), *b32 = drand(N * K, -1, 1, "dense B");
    uint16_t *a = dalloc(2 * (size_t)(M * K), "dense A bf16"),
             *b = dalloc(2 * (size_t)(N * K), "B");
    float *c = dalloc(sizeof(float) * (size_t)(M * N), "dense C");
    const double fl = 2.0 * (double)M * N * K;
    float f32_ms, bf_ms, cv_ms;
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_BF16);
    TIME_MS(f32_ms, 10,
            kb->gemm(ARL_K_NOTRANS, ARL_K_TRANS, M, N, K, 1.0f, a32, K, b32, K, 0.0f, c, N));
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_FP32);
    TIME_MS(cv_ms, 10, arl_cuda_f32_to_bf16(a, a32, M * K); arl_cuda_f32_to_bf16(b, b32, N * K));
    TIME_MS(bf_ms, 10,
            if (arl_cuda_gemm_bf16(0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N) != ARL_OK)
                die("gemm_bf16"));
    printf("dense GEMM (%lld, %lld) x (%lld, %lld)^T: fp32 operands, bf16 math %.3f ms (%.1f "
           "TFLOP/s); bf16 operands %.3f ms (%.1f TFLOP/s) + %.3f ms to round both operands\n",
           (long long)M, (long long)K, (long long)N, (long long)K, f32_ms, fl / f32_ms / 1e9, bf_ms,
           fl / bf_ms / 1e9, cv_ms);
    printf("RESULT dense_%s_f32_bf16math_tflops=%.3f\nRESULT dense_%s_bf16_tflops=%.3f\n"
           "RESULT dense_%s_round_ms=%.4f\n",
           tag, fl / f32_ms / 1e9, tag, fl / bf_ms / 1e9, tag, cv_ms);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- short conv */
/* Minimal bytes: forward x in, z and y out; backward x and dz in, dx read and written (+=); the
 * taps, tails and weight gradient are small. */
static void bench_conv(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 2048 : 16384, C = 1024, W = 4;
    const int32_t N = (int32_t)(T / 1024);
    int32_t cu_h[17];
    for (int32_t i = 0; i <= N; i++)
        cu_h[i] = i * 1024;
    int32_t *cu = dalloc(sizeof(int32_t) * (size_t)(N + 1), "conv cu");
    if (arl_cuda_upload(ctx, cu, cu_h, sizeof(int32_t) * (size_t)(N + 1)) != ARL_OK) die("conv cu");
    float *x = drand(T * C, -2, 2, "conv x"), *w = drand(C * W, -0.5f, 0.5f, "conv w");
    float *tails = drand(N * C * (W - 1), -1, 1, "conv tails"), *dz = drand(T * C, -1, 1, "dz");
    float *z = dalloc(sizeof(float) * (size_t)(T * C), "conv z");
    float *y = dalloc(sizeof(float) * (size_t)(T * C), "conv y");
    float *dx = dalloc(sizeof(float) * (size_t)(T * C), "conv dx");
    float *dw = dalloc(sizeof(float) * (size_t)(C * W), "conv dw");
    float fwd_ms, bwd_ms;
    TIME_MS(fwd_ms, 10, arl_cuda_conv_fwd(z, y, x, w, tails, cu, N, T, C, W));
    TIME_MS(bwd_ms, 10, arl_cuda_conv_bwd(dx, dw, dz, x, w, tails, cu, N, T, C, W));
    const double fwd_min = 3.0 * 4.0 * (double)(T * C) / copy_bw * 1e3;
    const double bwd_min = 4.0 * 4.0 * (double)(T * C) / copy_bw * 1e3;
    printf("short conv T=%lld C=%lld W=%lld: fwd %.3f ms (%.2fx its minimal-bytes copy), bwd "
           "%.3f ms (%.2fx)\n",
           (long long)T, (long long)C, (long long)W, fwd_ms, fwd_ms / fwd_min, bwd_ms,
           bwd_ms / bwd_min);
    printf("RESULT conv_fwd_ms=%.4f\nRESULT conv_fwd_over_copy=%.3f\nRESULT conv_bwd_ms=%.4f\n"
           "RESULT conv_bwd_over_copy=%.3f\n",
           fwd_ms, fwd_ms / fwd_min, bwd_ms, bwd_ms / bwd_min);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- row kernels */
/* Minimal bytes: RMSNorm x in, y out; L2 norm x in, y out; log-probs the logits in (three
 * floats a row out). */
static void bench_rows(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 2048 : 16384, d = 1024, H = 8, dh = 128, V = 384;
    float *x = drand(T * d, -2, 2, "rows x"), *w = drand(d, 0.5f, 1.5f, "rows w");
    float *y = dalloc(sizeof(float) * (size_t)(T * d), "rows y");
    float *r = dalloc(sizeof(float) * (size_t)(T * H), "rows r");
    float *z = drand(T * V, -8, 8, "rows logits");
    float *lp = dalloc(sizeof(float) * (size_t)T, "logp"),
          *lse = dalloc(sizeof(float) * (size_t)T, "lse");
    float *ent = dalloc(sizeof(float) * (size_t)T, "entropy");
    int32_t *tg = dalloc(sizeof(int32_t) * (size_t)T, "targets");
    arl_cuda_memset0(ctx, tg, sizeof(int32_t) * (size_t)T);
    float rms_ms, l2_ms, lp_ms;
    TIME_MS(rms_ms, 10, kb->rmsnorm_fwd(y, r, x, w, T, d, 1e-5f));
    TIME_MS(l2_ms, 10, kb->l2norm_fwd(y, r, x, T * H, dh, 1e-6f));
    TIME_MS(lp_ms, 10, kb->logprob_fwd(lp, lse, ent, z, tg, T, V));
    const double rms_min = 2.0 * 4.0 * (double)(T * d) / copy_bw * 1e3;
    const double l2_min = 2.0 * 4.0 * (double)(T * H * dh) / copy_bw * 1e3;
    const double lp_min = 4.0 * (double)(T * V + 4 * T) / copy_bw * 1e3;
    printf("row kernels, %lld rows: RMSNorm x 1024 %.4f ms (%.2fx its minimal-bytes copy), L2 "
           "norm of %lld heads x 128 %.4f ms (%.2fx), log-probs x 384 %.4f ms (%.2fx)\n",
           (long long)T, rms_ms, rms_ms / rms_min, (long long)H, l2_ms, l2_ms / l2_min, lp_ms,
           lp_ms / lp_min);
    printf("RESULT rows_rmsnorm_over_copy=%.3f\nRESULT rows_l2norm_over_copy=%.3f\n"
           "RESULT rows_logprob_over_copy=%.3f\n",
           rms_ms / rms_min, l2_ms / l2_min, lp_ms / lp_min);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- KDA */
static void bench_kda(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 1024 : 8192, H = quick ? 8 : 64, D = 128, C = 64;
    const int32_t N = 1;
    const int64_t n = T * H * D;
    float *q = drand(n, -1, 1, "kda q"), *k = drand(n, -1, 1, "kda k");
    float *v = drand(n, -1, 1, "kda v"), *g = drand(n, -6, 6, "kda g");
    float *beta = drand(T * H, -3, 3, "kda beta");
    kb->l2norm_fwd(q, NULL, q, T * H, D, 1e-6f);
    kb->l2norm_fwd(k, NULL, k, T * H, D, 1e-6f);
    kb->sigmoid_fwd(g, g, n); /* K3 gate: g = -5 sigmoid(u) */
    kb->scale(g, g, -5.0f, n);
    kb->sigmoid_fwd(beta, beta, T * H);
    float *o = dalloc(sizeof(float) * (size_t)n, "kda o");
    float *S = dalloc(sizeof(float) * (size_t)(H * D * D), "kda S");
    int64_t nc = (T + C - 1) / C;
    float *cs = dalloc(sizeof(float) * (size_t)(nc * H * D * D), "kda chunk states");
    float *ws =
        dalloc(sizeof(float) * (size_t)arl_cuda_kda_chunk_ws_floats(T, N, H, D, D, C), "kda ws");
    const float scale = 1.0f / sqrtf((float)D);
    float fwd_ms;
    TIME_MS(fwd_ms, 5, arl_cuda_memset0(ctx, S, sizeof(float) * (size_t)(H * D * D));
            arl_cuda_kda_chunk_fwd(o, S, cs, q, k, v, g, beta, NULL, N, T, H, D, D, scale, C, ws));
    double bytes = 4.0 * (4.0 * (double)n + (double)(T * H) + (double)n); /* q k v g beta | o */
    double min_ms = bytes / copy_bw * 1e3;
    printf("KDA chunk fwd  B=1 T=%lld H=%lld D=%lld C=%lld: %.3f ms; minimal bytes %.2f GB -> "
           "copy time %.3f ms; ratio %.2fx (target <= 12x)\n",
           (long long)T, (long long)H, (long long)D, (long long)C, fwd_ms, bytes / 1e9, min_ms,
           fwd_ms / min_ms);
    printf("RESULT kda_fwd_ms=%.4f\nRESULT kda_min_copy_ms=%.4f\nRESULT kda_fwd_over_copy=%.3f\n",
           fwd_ms, min_ms, fwd_ms / min_ms);
    /* where the forward's time goes: kernel 1 (every chunk's factors, in parallel) and the rest
     * (kernel 2, the chunks of each head in order); kernel 1 with its pair products in the
     * factored form (the default) and in the difference form (ops.h arl_cuda_kda_prep_form) */
    float prep_ms, prep_diff_ms;
    TIME_MS(prep_ms, 5,
            arl_cuda_kda_chunk_prep(ws, q, k, v, g, beta, NULL, N, T, H, D, D, scale, C));
    const int32_t form = arl_cuda_kda_prep_form(ARL_CUDA_KDA_PREP_DIFFERENCE);
    TIME_MS(prep_diff_ms, 5,
            arl_cuda_kda_chunk_prep(ws, q, k, v, g, beta, NULL, N, T, H, D, D, scale, C));
    arl_cuda_kda_prep_form(form);
    printf("  of which chunk factors (kernel 1) %.3f ms (pair products in the difference form: "
           "%.3f ms), state pass (kernel 2) %.3f ms\n",
           prep_ms, prep_diff_ms, fwd_ms - prep_ms);
    printf("RESULT kda_prep_ms=%.4f\nRESULT kda_prep_difference_ms=%.4f\n"
           "RESULT kda_state_pass_ms=%.4f\n",
           prep_ms, prep_diff_ms, fwd_ms - prep_ms);

    float *d_o = drand(n, -1, 1, "kda do");
    float *dq = dalloc(sizeof(float) * (size_t)n, "dq"),
          *dk = dalloc(sizeof(float) * (size_t)n, "dk");
    float *dv = dalloc(sizeof(float) * (size_t)n, "dv"),
          *dg = dalloc(sizeof(float) * (size_t)n, "dg");
    float *db = dalloc(sizeof(float) * (size_t)(T * H), "dbeta");
    float *bws =
        dalloc(sizeof(float) * (size_t)arl_cuda_kda_bwd_ws_floats(N, H, D, D, C), "bwd ws");
    float bwd_ms, rbwd_ms;
    float *cws = dalloc(sizeof(float) * (size_t)arl_cuda_kda_chunk_bwd_ws_floats(T, N, H, D, D, C),
                        "chunk bwd ws");
    TIME_MS(bwd_ms, 3,
            arl_cuda_kda_chunk_bwd(dq, dk, dv, dg, db, NULL, d_o, NULL, q, k, v, g, beta, cs, NULL,
                                   N, T, H, D, D, scale, C, cws));
    TIME_MS(rbwd_ms, 2,
            arl_cuda_kda_recurrent_bwd(dq, dk, dv, dg, db, NULL, d_o, NULL, q, k, v, g, beta, cs,
                                       NULL, N, T, H, D, D, scale, C, bws));
    printf("KDA fwd+bwd (chunkwise bwd): %.3f ms (bwd %.3f ms); (fwd+bwd)/fwd = %.2fx "
           "(target <= 5x); recurrent-rule bwd %.3f ms\n",
           fwd_ms + bwd_ms, bwd_ms, (fwd_ms + bwd_ms) / fwd_ms, rbwd_ms);
    printf("RESULT kda_bwd_ms=%.4f\nRESULT kda_fwdbwd_over_fwd=%.3f\nRESULT kda_rec_bwd_ms=%.4f\n",
           bwd_ms, (fwd_ms + bwd_ms) / fwd_ms, rbwd_ms);
    /* the chunkwise backward recomputes kernel 1 (prep_ms); the rest is its reverse state pass
     * and the intra-chunk gradients (k_kda_cbwd_state, k_kda_cbwd) */
    printf("  of which recomputed chunk factors %.3f ms, reverse state pass and intra-chunk "
           "gradients %.3f ms\n",
           prep_ms, bwd_ms - prep_ms);
    printf("RESULT kda_bwd_after_prep_ms=%.4f\n", bwd_ms - prep_ms);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- MoE grouped GEMM */
/* The routing plan's build (ops.h arl_cuda_moe_plan_build) at the full scale's experts (896,
 * top-16) against copying its minimal bytes (the selections read once, row_src and slot_row
 * written once: 12 bytes an entry): its cost grows with T k, not E T k. */
static void bench_plan(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 4096 : 65536, k = 16, E = 896, R = T * k;
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)R);
    if (!sel) die("host memory");
    for (int64_t i = 0; i < R; i++) /* uniform experts (repeats within a token do not matter) */
        sel[i] = (int32_t)arl_rng_below(&rng, (uint64_t)E);
    int32_t *d_sel = dalloc(sizeof(int32_t) * (size_t)R, "sel");
    if (arl_cuda_upload(ctx, d_sel, sel, sizeof(int32_t) * (size_t)R) != ARL_OK) die("upload");
    free(sel);
    int32_t *buf = dalloc(sizeof(int32_t) * (size_t)arl_cuda_moe_plan_ints(T, k, E), "plan");
    arl_cuda_moe_plan plan;
    float ms;
    TIME_MS(ms, 10, arl_cuda_moe_plan_build(&plan, buf, d_sel, T, k, E));
    const double min_ms = 12.0 * (double)R / copy_bw * 1e3;
    printf("MoE routing plan (T=%lld k=%lld E=%lld): %.3f ms, %.1fx its minimal bytes' copy\n",
           (long long)T, (long long)k, (long long)E, ms, ms / min_ms);
    printf("RESULT moe_plan_ms=%.4f\nRESULT moe_plan_vs_copy=%.2f\n", ms, ms / min_ms);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- embedding backward */
/* The embedding table's gradient (ops.h arl_cuda_embed_bwd) at the full scale's width and
 * vocabulary, a twentieth of the tokens one id, against copying its minimal bytes (dx read
 * once, each touched table row read and written once, the ids read). */
static void bench_embed_bwd(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 8192 : 131072, d = 7168, V = 163840;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    unsigned char *seen = calloc((size_t)V, 1);
    if (!tok || !seen) die("host memory");
    int64_t rows = 0;
    for (int64_t t = 0; t < T; t++) {
        tok[t] = arl_rng_below(&rng, 20) == 0 ? 11 : (int32_t)arl_rng_below(&rng, (uint64_t)V);
        rows += !seen[tok[t]];
        seen[tok[t]] = 1;
    }
    int32_t *d_tok = dalloc(sizeof(int32_t) * (size_t)T, "tokens");
    if (arl_cuda_upload(ctx, d_tok, tok, sizeof(int32_t) * (size_t)T) != ARL_OK) die("upload");
    free(tok), free(seen);
    float *dx = drand(T * d, -1, 1, "dx"), *tab = drand(V * d, -1, 1, "table");
    int32_t *ws = dalloc(sizeof(int32_t) * (size_t)arl_cuda_embed_bwd_ws_ints(T, V), "ws");
    float ms;
    TIME_MS(ms, 5, arl_cuda_embed_bwd(tab, dx, d_tok, T, d, V, ws));
    const double min_ms = (4.0 * (double)(T * d + 2 * rows * d + T)) / copy_bw * 1e3;
    printf("embedding backward T=%lld d=%lld V=%lld (%lld ids): %.3f ms, %.2fx its minimal "
           "bytes' copy\n",
           (long long)T, (long long)d, (long long)V, (long long)rows, ms, ms / min_ms);
    printf("RESULT embed_bwd_ms=%.4f\nRESULT embed_bwd_over_copy=%.3f\n", ms, ms / min_ms);
    arl_cuda_release(ctx, mark);
}

static void bench_moe(const char *tag, int64_t T, int64_t E, int64_t k, int64_t Nout, int64_t K) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t R = T * k;
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)R);
    if (!sel) die("host memory");
    for (int64_t t = 0; t < T; t++) /* uniform random distinct experts */
        for (int64_t i = 0; i < k; i++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)arl_rng_below(&rng, (uint64_t)E);
                dup = 0;
                for (int64_t j = 0; j < i; j++)
                    dup |= sel[t * k + j] == e;
            } while (dup);
            sel[t * k + i] = e;
        }
    int32_t *d_sel = dalloc(sizeof(int32_t) * (size_t)R, "sel");
    if (arl_cuda_upload(ctx, d_sel, sel, sizeof(int32_t) * (size_t)R) != ARL_OK) die("upload");
    free(sel);
    int32_t *buf = dalloc(sizeof(int32_t) * (size_t)arl_cuda_moe_plan_ints(T, k, E), "plan");
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, buf, d_sel, T, k, E);
    float *x32 = drand(R * K, -1, 1, "X"), *w32 = drand(E * Nout * K, -1, 1, "W");
    uint16_t *x = dalloc(2 * (size_t)(R * K), "X bf16"),
             *w = dalloc(2 * (size_t)(E * Nout * K), "W bf16");
    arl_cuda_f32_to_bf16(x, x32, R * K);
    arl_cuda_f32_to_bf16(w, w32, E * Nout * K);
    float *y = dalloc(sizeof(float) * (size_t)(R * Nout), "Y");
    float g_ms, d_ms;
    TIME_MS(g_ms, 10, arl_cuda_grouped_gemm_bf16(y, x, w, 1, &plan, Nout, K, 0.0f));
    TIME_MS(d_ms, 10,
            if (arl_cuda_gemm_bf16(0, 1, R, Nout, K, 1.0f, x, K, w, K, 0.0f, y, Nout) != ARL_OK)
                die("gemm_bf16"));
    double fl = 2.0 * (double)R * Nout * K;
    double g_tf = fl / (g_ms * 1e-3) / 1e12, d_tf = fl / (d_ms * 1e-3) / 1e12;
    printf("MoE grouped GEMM %s (T=%lld E=%lld k=%lld, %lldx%lld per expert): grouped %.1f "
           "TFLOP/s, dense cuBLAS %.1f TFLOP/s, ratio %.3f\n",
           tag, (long long)T, (long long)E, (long long)k, (long long)Nout, (long long)K, g_tf, d_tf,
           g_tf / d_tf);
    printf("RESULT moe_%s_grouped_tflops=%.3f\nRESULT moe_%s_dense_tflops=%.3f\n"
           "RESULT moe_%s_ratio=%.4f\n",
           tag, g_tf, tag, d_tf, tag, g_tf / d_tf);
    /* the same tiles on Hopper's warpgroup products (ops.h arl_cuda_moe_tn_form), where the
     * device has them */
    if (arl_cuda_moe_wgmma_available()) {
        const int32_t was = arl_cuda_moe_tn_form(ARL_CUDA_MOE_TN_WGMMA);
        float wg_ms;
        TIME_MS(wg_ms, 10, arl_cuda_grouped_gemm_bf16(y, x, w, 1, &plan, Nout, K, 0.0f));
        arl_cuda_moe_tn_form(was);
        const double wg_tf = fl / (wg_ms * 1e-3) / 1e12;
        printf("  wgmma form: %.1f TFLOP/s, ratio %.3f\n", wg_tf, wg_tf / d_tf);
        printf("RESULT moe_%s_wgmma_tflops=%.3f\nRESULT moe_%s_wgmma_ratio=%.4f\n", tag, wg_tf, tag,
               wg_tf / d_tf);
    }
    /* the expert forward's gate and up products and their GLU on bf16 operands (Nout = f): one
     * launch (ops.h arl_cuda_grouped_glu_bf16; without G and U as an inference forward runs
     * it, with them as the training forward keeps them) against the two grouped GEMMs and the
     * GLU pass it replaces (SiTU-GLU; the up bank is a copy of the gate's: the same work) */
    uint16_t *w3 = dalloc(2 * (size_t)(E * Nout * K), "W3 bf16"),
             *hb = dalloc(2 * (size_t)(R * Nout), "H");
    float *u = dalloc(sizeof(float) * (size_t)(R * Nout), "U");
    arl_cuda_f32_to_bf16(w3, w32, E * Nout * K);
    float sep_ms, fi_ms, ft_ms;
    TIME_MS(sep_ms, 10, {
        arl_cuda_grouped_gemm_bf16(y, x, w, 1, &plan, Nout, K, 0.0f);
        arl_cuda_grouped_gemm_bf16(u, x, w3, 1, &plan, Nout, K, 0.0f);
        arl_cuda_glu_fwd_bf16(hb, y, u, R, Nout, Nout, 1, 4.0f, 25.0f);
    });
    TIME_MS(fi_ms, 10,
            arl_cuda_grouped_glu_bf16(NULL, NULL, hb, x, w, w3, &plan, Nout, K, 1, 4.0f, 25.0f));
    TIME_MS(ft_ms, 10,
            arl_cuda_grouped_glu_bf16(y, u, hb, x, w, w3, &plan, Nout, K, 1, 4.0f, 25.0f));
    printf("  gate, up and SiTU-GLU: two grouped GEMMs and the GLU pass %.3f ms, one launch %.3f "
           "ms (%.2fx), keeping g and u %.3f ms (%.2fx)\n",
           sep_ms, fi_ms, sep_ms / fi_ms, ft_ms, sep_ms / ft_ms);
    printf("RESULT moe_%s_glu_fused_speedup=%.4f\nRESULT moe_%s_glu_fused_keep_speedup=%.4f\n", tag,
           sep_ms / fi_ms, tag, sep_ms / ft_ms);
    /* and the backward's: the GLU output's gradient dH = dY W2_e (W2 read as (E, K, f)) and the
     * GLU backward, one launch (arl_cuda_grouped_glu_bwd_bf16) against the two */
    uint16_t *dgb = dalloc(2 * (size_t)(R * Nout), "dG"),
             *dub = dalloc(2 * (size_t)(R * Nout), "dU");
    float *dh = dalloc(sizeof(float) * (size_t)(R * Nout), "dH");
    float bsep_ms, bf_ms;
    TIME_MS(bsep_ms, 10, {
        arl_cuda_grouped_gemm_bf16(dh, x, w, 0, &plan, Nout, K, 0.0f);
        arl_cuda_glu_bwd_bf16(dgb, dub, dh, y, u, R, Nout, Nout, 1, 4.0f, 25.0f);
    });
    TIME_MS(bf_ms, 10,
            arl_cuda_grouped_glu_bwd_bf16(dgb, dub, x, w, y, u, &plan, Nout, K, 1, 4.0f, 25.0f));
    printf("  GLU output's gradient and the GLU backward: separate %.3f ms, one launch %.3f ms "
           "(%.2fx)\n",
           bsep_ms, bf_ms, bsep_ms / bf_ms);
    printf("RESULT moe_%s_glu_bwd_fused_speedup=%.4f\n", tag, bsep_ms / bf_ms);
    /* the training step's grouped GEMMs (fp32 activations and master weights, rounded to bf16
     * as staged under the bf16 math mode): forward (W (N, K)), input gradient (W read as
     * (K, N)) and weight gradient, each against the same dense bf16 rate */
    float f_ms, x_ms, w_ms;
    float *dx = dalloc(sizeof(float) * (size_t)(R * K), "dX");
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_BF16);
    TIME_MS(f_ms, 10, arl_cuda_grouped_gemm(y, x32, w32, 1, &plan, Nout, K, 0.0f));
    TIME_MS(x_ms, 10, arl_cuda_grouped_gemm(dx, y, w32, 0, &plan, K, Nout, 0.0f));
    TIME_MS(w_ms, 10, arl_cuda_grouped_gemm_wgrad(w32, y, x32, &plan, Nout, K));
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_FP32);
    const double f_tf = fl / (f_ms * 1e-3) / 1e12, x_tf = fl / (x_ms * 1e-3) / 1e12,
                 w_tf = fl / (w_ms * 1e-3) / 1e12;
    printf("  training (fp32 operands, bf16 math): forward %.1f, input gradient %.1f, weight "
           "gradient %.1f TFLOP/s (ratios %.3f %.3f %.3f)\n",
           f_tf, x_tf, w_tf, f_tf / d_tf, x_tf / d_tf, w_tf / d_tf);
    printf("RESULT moe_%s_train_fwd_ratio=%.4f\nRESULT moe_%s_train_dx_ratio=%.4f\n"
           "RESULT moe_%s_train_wgrad_ratio=%.4f\n",
           tag, f_tf / d_tf, tag, x_tf / d_tf, tag, w_tf / d_tf);
    /* the same two gradients on bf16 operands (a model keeping bf16 weight copies: the
     * activations rounded once where they are made; the forward is the bf16 tile above) */
    uint16_t *yb = dalloc(2 * (size_t)(R * Nout), "dY bf16");
    arl_cuda_f32_to_bf16(yb, y, R * Nout);
    float xb_ms, wb_ms;
    TIME_MS(xb_ms, 10, arl_cuda_grouped_gemm_bf16(dx, yb, w, 0, &plan, K, Nout, 0.0f));
    TIME_MS(wb_ms, 10, arl_cuda_grouped_gemm_wgrad_bf16(w32, yb, x, &plan, Nout, K));
    const double xb_tf = fl / (xb_ms * 1e-3) / 1e12, wb_tf = fl / (wb_ms * 1e-3) / 1e12;
    printf("  training on bf16 operands: input gradient %.1f, weight gradient %.1f TFLOP/s "
           "(ratios %.3f %.3f)\n",
           xb_tf, wb_tf, xb_tf / d_tf, wb_tf / d_tf);
    printf("RESULT moe_%s_train_dx_bf16_ratio=%.4f\nRESULT moe_%s_train_wgrad_bf16_ratio=%.4f\n",
           tag, xb_tf / d_tf, tag, wb_tf / d_tf);
    arl_cuda_release(ctx, mark);
}

/* ---------------------------------------------------------------- MLA prefill */
/* A decode step's absorbed attention over a long latent cache (the full scale's widths: 96
 * heads, rkv 512, r 64): keys split over blocks (ops.h ARL_CUDA_MLA_SPLIT_KEYS) against one
 * block walking them all a (query, head) group, and against copying the cache once (a step
 * must read it). */
static void bench_mla_decode(int quick, double copy_bw) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t S = quick ? 32768 : 262144, Hm = 96, rkv = 512, r = 64;
    float *cache = drand(S * (rkv + r), -1, 1, "cache");
    float *qh = drand(Hm * rkv, -1, 1, "qhat"), *qpe = drand(Hm * r, -1, 1, "q_pe");
    float *oh = dalloc(sizeof(float) * (size_t)(Hm * rkv), "ohat");
    float *ws = dalloc(sizeof(float) * (size_t)arl_cuda_mla_absorbed_ws_floats(S, Hm, rkv), "ws");
    const float scale = 0.0417f;
    float split_ms, whole_ms;
    TIME_MS(split_ms, 5,
            arl_cuda_mla_absorbed_attn(oh, qh, qpe, cache, S - 1, 1, Hm, rkv, r, scale, ws));
    TIME_MS(whole_ms, 3,
            arl_cuda_mla_absorbed_attn(oh, qh, qpe, cache, S - 1, 1, Hm, rkv, r, scale, NULL));
    const double min_ms = 4.0 * (double)(S * (rkv + r)) / copy_bw * 1e3; /* its bytes, read once */
    printf("MLA decode step, absorbed, %lld cached rows, 96 heads: keys split %.3f ms, unsplit "
           "%.3f ms (%.1fx); %.1fx reading the cache once\n",
           (long long)S, split_ms, whole_ms, whole_ms / split_ms, split_ms / min_ms);
    printf("RESULT mla_decode_split_ms=%.4f\nRESULT mla_decode_split_speedup=%.3f\n"
           "RESULT mla_decode_over_read=%.3f\n",
           split_ms, whole_ms / split_ms, split_ms / min_ms);
    arl_cuda_release(ctx, mark);
}

/* Block-sparse MLA training (ops.h arl_cuda_mla_sparse_fwd_save / _bwd): the last 2048
 * queries of a 65536-row document, 16 heads, rkv 512, r 64, chunks of 64 (1024 of them), top
 * 16.  The backward's time against the forward's (no target: for the next GPU session, with
 * the entries' sort of sort.cu in it). */
static void bench_mla_sparse(int quick) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t S = quick ? 8192 : 65536, Tq = quick ? 512 : 2048, p0 = S - Tq;
    const int64_t Hm = 16, rkv = 512, r = 64, R = rkv + r, n_c = 64, k_c = 16;
    const float scale = 0.0417f;
    float *rows = drand(S * R, -1, 1, "rows");
    float *qh = drand(Tq * Hm * rkv, -1, 1, "qhat"), *qp = drand(Tq * Hm * r, -1, 1, "q_pe");
    float *dO = drand(Tq * Hm * rkv, -1, 1, "dohat");
    float *oh = dalloc(sizeof(float) * (size_t)(Tq * Hm * rkv), "ohat");
    float *lse = dalloc(sizeof(float) * (size_t)(Tq * Hm), "lse");
    int32_t *list = dalloc(sizeof(int32_t) * (size_t)(Tq * Hm * k_c), "list");
    float *dqh = drand(Tq * Hm * rkv, 0, 0, "dqhat"), *dqp = drand(Tq * Hm * r, 0, 0, "dq_pe");
    float *dnew = drand(Tq * R, 0, 0, "dnew"), *dpre = drand(p0 * R, 0, 0, "dprefix");
    float *ws = dalloc(sizeof(float) *
                           (size_t)arl_cuda_mla_sparse_train_ws_floats(Tq, S, Hm, rkv, r, n_c, k_c),
                       "ws");
    float fms, bms;
    TIME_MS(fms, 5,
            arl_cuda_mla_sparse_fwd_save(oh, lse, list, qh, qp, rows, p0, Tq, Hm, rkv, r, scale,
                                         n_c, k_c, ws));
    TIME_MS(bms, 5,
            arl_cuda_mla_sparse_bwd(dqh, dqp, dnew, dpre, dO, oh, lse, list, qh, qp, rows, p0, Tq,
                                    Hm, rkv, r, scale, n_c, k_c, ws));
    printf("block-sparse MLA training, %lld queries after %lld rows, %lld heads, chunks of %lld, "
           "top %lld: forward %.3f ms, backward %.3f ms (%.2fx)\n",
           (long long)Tq, (long long)p0, (long long)Hm, (long long)n_c, (long long)k_c, fms, bms,
           bms / fms);
    printf("RESULT mla_sparse_fwd_ms=%.4f\nRESULT mla_sparse_bwd_ms=%.4f\n"
           "RESULT mla_sparse_bwd_over_fwd=%.3f\n",
           fms, bms, bms / fms);
    arl_cuda_release(ctx, mark);
}

static void bench_mla(int quick) {
    size_t mark = arl_cuda_mark(ctx);
    const int64_t T = quick ? 1024 : 8192, Hm = 8, n = 64, r = 32, vm = 128;
    float *qn = drand(T * Hm * n, -1, 1, "q_nope"), *qp = drand(T * Hm * r, -1, 1, "q_pe");
    float *kn = drand(T * Hm * n, -1, 1, "k_nope"), *kp = drand(T * r, -1, 1, "k_pe");
    float *v = drand(T * Hm * vm, -1, 1, "v");
    float *o = dalloc(sizeof(float) * (size_t)(T * Hm * vm), "o");
    float *lse = dalloc(sizeof(float) * (size_t)(T * Hm), "lse");
    /* the forward's workspace (the tensor-core path's bf16 key and value copies) */
    float *fws =
        dalloc(sizeof(float) * (size_t)arl_cuda_mla_attn_fwd_ws_floats(T, Hm, n, r, vm), "mla ws");
    float ms, ms32;
    /* causal: T(T+1)/2 pairs, 2 (n + r) + 2 vm flops each */
    double fl = (double)Hm * T * (T + 1) / 2.0 * (2.0 * (n + r) + 2.0 * vm);
    /* the fp32 kernel (the parity default), then the tensor-core kernel (bf16 operands, fp32
     * accumulation and softmax), which the context's bf16 math mode selects */
    TIME_MS(ms32, 1,
            arl_cuda_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, NULL, 1, T, Hm, n, r, vm,
                                  1.0f / sqrtf((float)(n + r)), fws));
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_BF16);
    TIME_MS(ms, 5,
            arl_cuda_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, NULL, 1, T, Hm, n, r, vm,
                                  1.0f / sqrtf((float)(n + r)), fws));
    /* the other warp tile (ops.h arl_cuda_mla_fwd_rows): 8 warps of 16 queries */
    float ms16;
    const int32_t rows = arl_cuda_mla_fwd_rows(ARL_CUDA_MLA_FWD_ROWS16);
    TIME_MS(ms16, 5,
            arl_cuda_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, NULL, 1, T, Hm, n, r, vm,
                                  1.0f / sqrtf((float)(n + r)), fws));
    arl_cuda_mla_fwd_rows(rows);
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_FP32);
    double tf = fl / (ms * 1e-3) / 1e12, tf32 = fl / (ms32 * 1e-3) / 1e12;
    double tf16 = fl / (ms16 * 1e-3) / 1e12;
    printf("MLA prefill attention T=%lld Hm=%lld qk=%lld v=%lld causal: %.3f ms, %.2f TFLOP/s "
           "(bf16 tensor cores, 32-query warps; 16-query warps %.3f ms, %.2f TFLOP/s); fp32 "
           "kernel %.3f ms, %.2f TFLOP/s\n",
           (long long)T, (long long)Hm, (long long)(n + r), (long long)vm, ms, tf, ms16, tf16, ms32,
           tf32);
    printf("RESULT mla_ms=%.4f\nRESULT mla_tflops=%.4f\nRESULT mla_rows16_tflops=%.4f\n"
           "RESULT mla_fp32_tflops=%.4f\n",
           ms, tf, tf16, tf32);

    /* the backward from the forward's o and lse: the fp32 kernels, then the tensor-core ones
     * (bf16 math); flops counted as FlashAttention's: S and dP recomputed, dV, dK, dQ - per pair
     * 6 (n + r) + 4 vm, whatever the kernels recompute on top (they compute S and dP twice) */
    float *dO = drand(T * Hm * vm, -1, 1, "dO");
    float *dqn = dalloc(sizeof(float) * (size_t)(T * Hm * n), "dq_nope");
    float *dqp = dalloc(sizeof(float) * (size_t)(T * Hm * r), "dq_pe");
    float *dkn = dalloc(sizeof(float) * (size_t)(T * Hm * n), "dk_nope");
    float *dkp = dalloc(sizeof(float) * (size_t)(T * r), "dk_pe");
    float *dv = dalloc(sizeof(float) * (size_t)(T * Hm * vm), "dv");
    float *bws =
        dalloc(sizeof(float) * (size_t)arl_cuda_mla_attn_bwd_ws_floats(T, Hm, n, r, vm), "ws");
    double flb = (double)Hm * T * (T + 1) / 2.0 * (6.0 * (n + r) + 4.0 * vm);
    float bms, bms32;
    TIME_MS(bms32, 1,
            arl_cuda_mla_attn_bwd(dqn, dqp, dkn, dkp, dv, dO, o, lse, qn, qp, kn, kp, v, NULL, 1, T,
                                  Hm, n, r, vm, 1.0f / sqrtf((float)(n + r)), bws));
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_BF16);
    TIME_MS(bms, 5,
            arl_cuda_mla_attn_bwd(dqn, dqp, dkn, dkp, dv, dO, o, lse, qn, qp, kn, kp, v, NULL, 1, T,
                                  Hm, n, r, vm, 1.0f / sqrtf((float)(n + r)), bws));
    arl_cuda_set_math(ctx, ARL_CUDA_MATH_FP32);
    double btf = flb / (bms * 1e-3) / 1e12, btf32 = flb / (bms32 * 1e-3) / 1e12;
    printf("MLA attention backward, same shape: %.3f ms, %.2f TFLOP/s (bf16 tensor cores); fp32 "
           "kernels %.3f ms, %.2f TFLOP/s\n",
           bms, btf, bms32, btf32);
    printf("RESULT mla_bwd_ms=%.4f\nRESULT mla_bwd_tflops=%.4f\nRESULT mla_bwd_fp32_tflops=%.4f\n",
           bms, btf, btf32);
    arl_cuda_release(ctx, mark);
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++) { /* (no core/options.c: run.sh's nvcc fallback lacks it) */
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_gpu [--quick]\n\nthe CUDA kernels against cuBLAS and device "
                   "copy bandwidth measured in the same run (RESULT key=value lines; "
                   "bench/gpu/run.sh adds the PyTorch baselines); exits 77 without a GPU\n\n"
                   "options:\n  --quick   small sizes (a smoke run of a few seconds)\n  --help  "
                   "  print this help and exit\n");
            return 0;
        } else {
            fprintf(stderr, "bench_gpu: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* each RESULT line out at once: a crash keeps them */
    if (arl_cuda_device_count() == 0) {
        fprintf(stderr, "bench_gpu: no CUDA device (or a build without CUDA)\n");
        return 77;
    }
    arl_cuda_config c;
    arl_cuda_config_defaults(&c);
    c.arena_bytes = quick ? (size_t)4 << 30 : (size_t)24 << 30;
    if (arl_cuda_open(&c, &ctx) != ARL_OK) die("open");
    arl_cuda_make_current(ctx);
    kb = arl_cuda_backend();
    arl_rng_seed(&rng, 9);

    /* denominators */
    int64_t G = quick ? 2048 : 8192;
    double gemm = gemm_tflops(G, G, G, quick ? 3 : 10);
    printf("cuBLAS bf16 GEMM %lld^3 (fp32 accumulate): %.1f TFLOP/s\n", (long long)G, gemm);
    printf("RESULT cublas_bf16_tflops=%.3f\n", gemm);
    size_t cb = quick ? (size_t)256 << 20 : (size_t)2 << 30;
    size_t cmark = arl_cuda_mark(ctx);
    void *src = dalloc(cb, "copy src"), *dst = dalloc(cb, "copy dst");
    arl_cuda_memset0(ctx, src, cb);
    float cms;
    TIME_MS(cms, 10, if (arl_cuda_copy_d2d(ctx, dst, src, cb) != ARL_OK) die("copy"));
    double bw = 2.0 * (double)cb / (cms * 1e-3); /* bytes read + written per second */
    printf("device-to-device copy %.2f GiB: %.3f ms, %.0f GB/s (read + write)\n",
           (double)cb / (1 << 30), cms, bw / 1e9);
    printf("RESULT copy_gbps=%.2f\n", bw / 1e9);
    arl_cuda_release(ctx, cmark);

    bench_dense(quick, 1024, "n1024");
    bench_dense(quick, 4096, "n4096");
    bench_kda(quick, bw);
    if (quick) {
        bench_moe("fine", 1024, 128, 8, 512, 512);
        bench_moe("coarse", 1024, 8, 2, 2048, 512);
    } else {
        bench_moe("fine", 8192, 128, 8, 512, 512);  /* mini: E=128, k=8, f = dz = 512 */
        bench_moe("coarse", 8192, 8, 2, 2048, 512); /* few large experts, same latent width */
    }
    bench_plan(quick, bw);
    bench_embed_bwd(quick, bw);
    bench_mla(quick);
    bench_mla_decode(quick, bw);
    bench_mla_sparse(quick);
    bench_conv(quick, bw);
    bench_rows(quick, bw);
    printf("RESULT mfu_train_step=not_measured\n");
    arl_cuda_close(ctx);
    return 0;
}
