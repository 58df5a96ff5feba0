/* tests/cuda/test_ops.c: every entry of the CUDA backend table (kernels/backend.h over device
 * memory) against the CPU backend on the same random inputs, forward and backward.  Exits 77
 * without a GPU.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu| unless stated):
 *   - fp32 elementwise ops with the same formula: rtol 2e-5, atol 2e-6 - CUDA's expf, tanhf,
 *     erff, log1pf are within 2 ulp (CUDA C Programming Guide, "Mathematical Functions")
 *     where glibc is within 1 ulp, nvcc contracts a*b+c into one FMA, and the derivative
 *     formulas compose 3-4 such functions: a few ulp of the result, far below 2e-5.
 *   - row statistics (norms, softmax sums, logsumexp, reductions) accumulate in double on
 *     both sides in a different order: the fp32 results differ by at most an ulp or two
 *     (rtol 1e-5).
 *   - fp32 GEMM (ARL_CUDA_MATH_FP32, no tensor cores): each side's error is at most
 *     K 2^-24 sum|a||b| (kernels/gemm.h), so the tolerance is 2 K 2^-24 sum|a||b| per
 *     element plus 1e-7.
 *   - bf16 GEMM (ARL_CUDA_MATH_BF16): each input is rounded to bf16 (relative error
 *     <= 2^-9), so each product is off by <= ~2^-8 relative and the sum by
 *     <= 2^-8 sum|a||b|; the tolerance is 2^-7 sum|a||b| + 1e-6 (a factor 2 of margin).
 *   - selections (argmax, top-k) must match exactly, ties and NaN included.
 */
#include "kernels/cuda/ops.h"
#include "kernels/kernels.h"
#include "tests/cuda/cuda_test.h"

static const arl_k_backend *kb;

/* Per-element GEMM tolerance: scale * sum_k |op(A)_ik op(B)_kj| + atol. */
static void gemm_check(const char *what, const float *dC, const float *ref, arl_k_trans ta,
                       arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                       int64_t lda, const float *B, int64_t ldb, int64_t ldc, double scale,
                       double atol) {
    float *h = ct_get(dC, M * ldc);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta == ARL_K_NOTRANS ? A[i * lda + k] : A[k * lda + i];
                double b = tb == ARL_K_NOTRANS ? B[k * ldb + j] : B[j * ldb + k];
                s += fabs(a * b);
            }
            double lim = fabs(alpha) * scale * s + atol;
            double d = fabs((double)h[i * ldc + j] - ref[i * ldc + j]);
            if (!(d <= lim)) {
                fprintf(stderr, "%s: C[%lld,%lld] = %.9g vs cpu %.9g (|diff| %.3g > %.3g)\n", what,
                        (long long)i, (long long)j, h[i * ldc + j], ref[i * ldc + j], d, lim);
                test_failures_++;
                free(h);
                return;
            }
        }
    free(h);
}

static void gemm_case(arl_cuda_math math, arl_k_trans ta, arl_k_trans tb, float beta) {
    CT_CASE_BEGIN;
    const int64_t M = 37, N = 29, K = 53, pad = 3;
    int64_t arows = ta == ARL_K_NOTRANS ? M : K, acols = ta == ARL_K_NOTRANS ? K : M;
    int64_t brows = tb == ARL_K_NOTRANS ? K : N, bcols = tb == ARL_K_NOTRANS ? N : K;
    int64_t lda = acols + pad, ldb = bcols + pad, ldc = N + pad;
    float *A = ct_rand(arows * lda, -1, 1), *B = ct_rand(brows * ldb, -1, 1);
    float *C = ct_rand(M * ldc, -1, 1);
    if (beta == 0.0f)
        for (int64_t i = 0; i < M * ldc; i++)
            C[i] = NAN; /* beta == 0: C is not read */
    float *dA = ct_dev(A, arows * lda), *dB = ct_dev(B, brows * ldb), *dC = ct_dev(C, M * ldc);
    arl_cuda_set_math(ct_ctx, math);
    kb->gemm(ta, tb, M, N, K, 0.7f, dA, lda, dB, ldb, beta, dC, ldc);
    arl_k_gemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C, ldc);
    /* padding columns are not written by either side: copy them from the device result */
    double scale = math == ARL_CUDA_MATH_BF16 ? 1.0 / 128 : 2.0 * (double)K / 16777216.0;
    double atol = math == ARL_CUDA_MATH_BF16 ? 1e-6 : 1e-7;
    float *h = ct_get(dC, M * ldc);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++)
            C[i * ldc + j] = h[i * ldc + j];
    free(h);
    char what[64];
    snprintf(what, sizeof what, "gemm math=%d ta=%d tb=%d beta=%g", (int)math, (int)ta, (int)tb,
             beta);
    gemm_check(what, dC, C, ta, tb, M, N, K, 0.7f, A, lda, B, ldb, ldc, scale, atol);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
    free(A), free(B), free(C);
    CT_CASE_END;
}

static void test_gemm(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ARL_CUDA_MATH_FP32, (arl_k_trans)ta, (arl_k_trans)tb, 0.3f);
            gemm_case(ARL_CUDA_MATH_FP32, (arl_k_trans)ta, (arl_k_trans)tb, 0.0f);
            gemm_case(ARL_CUDA_MATH_BF16, (arl_k_trans)ta, (arl_k_trans)tb, 0.3f);
        }
    /* sizes past cuBLAS's int arguments: refused with an error, nothing launched (they were
     * truncated by casts) */
    const int64_t big = (int64_t)1 << 31;
    CHECK(arl_cuda_gemm_bf16(0, 1, big, 16, 16, 1.0f, NULL, 16, NULL, 16, 0.0f, NULL, 16) ==
          ARL_ERR_ARG);
    CHECK_MSG(strstr(arl_error_msg(), "int range") != NULL, "%s", arl_error_msg());
    CHECK(arl_cuda_gemm_bf16(0, 1, 16, 16, 16, 1.0f, NULL, big, NULL, 16, 0.0f, NULL, 16) ==
          ARL_ERR_ARG);
    arl_error_clear();
}

static void test_gemm_batched(void) {
    CT_CASE_BEGIN;
    const int64_t M = 9, N = 11, K = 20, batch = 3;
    float *A = ct_rand(batch * M * K, -1, 1), *B = ct_rand(N * K, -1, 1);
    float *C = ct_rand(batch * M * N, -1, 1);
    float *dA = ct_dev(A, batch * M * K), *dB = ct_dev(B, N * K), *dC = ct_dev(C, batch * M * N);
    /* B shared by the products (sB = 0), transposed */
    kb->gemm_batched(ARL_K_NOTRANS, ARL_K_TRANS, M, N, K, 1.0f, dA, K, M * K, dB, K, 0, 0.5f, dC, N,
                     M * N, batch);
    arl_k_gemm_batched(ARL_K_NOTRANS, ARL_K_TRANS, M, N, K, 1.0f, A, K, M * K, B, K, 0, 0.5f, C, N,
                       M * N, batch);
    /* fp32: K = 20 products of values in [-1, 1]: 2 K 2^-24 K = 5e-5 bound, 1e-5 is ample
     * for max|ref| of order 1-5 */
    ct_check_maxref("gemm_batched", dC, C, batch * M * N, 1e-6, 1e-5);
    free(A), free(B), free(C);
    CT_CASE_END;
}

static void test_linear(void) {
    CT_CASE_BEGIN;
    const int64_t T = 13, in = 40, out = 24;
    float *x = ct_rand(T * in, -1, 1), *W = ct_rand(out * in, -1, 1), *dy = ct_rand(T * out, -1, 1);
    float *y = ct_host(sizeof(float) * T * out), *dx = ct_rand(T * in, -1, 1),
          *dW = ct_rand(out * in, -1, 1);
    float *d_x = ct_dev(x, T * in), *d_W = ct_dev(W, out * in), *d_dy = ct_dev(dy, T * out);
    float *d_y = ct_dev(NULL, T * out), *d_dx = ct_dev(dx, T * in), *d_dW = ct_dev(dW, out * in);
    kb->linear_fwd(d_y, d_x, d_W, T, in, out);
    kb->linear_bwd_x(d_dx, d_dy, d_W, T, in, out);
    kb->linear_bwd_w(d_dW, d_dy, d_x, T, in, out);
    arl_k_linear_fwd(y, x, W, T, in, out);
    arl_k_linear_bwd_x(dx, dy, W, T, in, out);
    arl_k_linear_bwd_w(dW, dy, x, T, in, out);
    /* fp32 GEMM bound 2 K 2^-24 K with K <= 40: < 2e-4 absolute at worst, 1e-5 rel to max */
    ct_check_maxref("linear_fwd", d_y, y, T * out, 1e-6, 1e-5);
    ct_check_maxref("linear_bwd_x (+=)", d_dx, dx, T * in, 1e-6, 1e-5);
    ct_check_maxref("linear_bwd_w (+=)", d_dW, dW, out * in, 1e-6, 1e-5);
    free(x), free(W), free(dy), free(y), free(dx), free(dW);
    CT_CASE_END;
}

static void norms_case(int64_t n, int64_t d) {
    CT_CASE_BEGIN;
    float *x = ct_rand(n * d, -2, 2), *w = ct_rand(d, 0.5f, 1.5f), *dy = ct_rand(n * d, -1, 1);
    float *y = ct_host(sizeof(float) * n * d), *r = ct_host(sizeof(float) * n);
    float *dx = ct_rand(n * d, -1, 1), *dw = ct_rand(d, -1, 1);
    float *d_x = ct_dev(x, n * d), *d_w = ct_dev(w, d), *d_dy = ct_dev(dy, n * d);
    float *d_y = ct_dev(NULL, n * d), *d_r = ct_dev(NULL, n), *d_dx = ct_dev(dx, n * d),
          *d_dw = ct_dev(dw, d);
    kb->rmsnorm_fwd(d_y, d_r, d_x, d_w, n, d, 1e-5f);
    kb->rmsnorm_bwd(d_dx, d_dw, d_dy, d_x, d_w, d_r, n, d);
    arl_k_rmsnorm_fwd(y, r, x, w, n, d, 1e-5f);
    arl_k_rmsnorm_bwd(dx, dw, dy, x, w, r, n, d);
    ct_check("rmsnorm_fwd y", d_y, y, n * d, 2e-6, 1e-5);
    ct_check("rmsnorm_fwd rstd", d_r, r, n, 0, 1e-6);
    ct_check("rmsnorm_bwd dx (+=)", d_dx, dx, n * d, 2e-6, 1e-5);
    ct_check("rmsnorm_bwd dw (+=)", d_dw, dw, d, 2e-6, 1e-5);

    memcpy(dx, x, sizeof(float) * n * d); /* fresh non-zero accumulators */
    arl_cuda_upload(ct_ctx, d_dx, dx, sizeof(float) * n * d);
    kb->l2norm_fwd(d_y, d_r, d_x, n, d, 1e-6f);
    kb->l2norm_bwd(d_dx, d_dy, d_x, d_r, n, d);
    arl_k_l2norm_fwd(y, r, x, n, d, 1e-6f);
    arl_k_l2norm_bwd(dx, dy, x, r, n, d);
    ct_check("l2norm_fwd y", d_y, y, n * d, 2e-7, 1e-5);
    ct_check("l2norm_fwd rnorm", d_r, r, n, 0, 1e-6);
    ct_check("l2norm_bwd dx (+=)", d_dx, dx, n * d, 2e-6, 1e-5);
    free(x), free(w), free(dy), free(y), free(r), free(dx), free(dw);
    CT_CASE_END;
}

static void test_norms(void) {
    norms_case(17, 300);
    norms_case(300, 40); /* many rows, few columns: dw's column sum runs in 4 row spans */
    norms_case(5, 1500); /* rows wider than 1024: a block a row (narrower: a warp a row) */
}

/* d <= 1024: a warp a row on the device; wider: a block a row */
static void softmax_case(int64_t d) {
    CT_CASE_BEGIN;
    const int64_t n = 9;
    float *x = ct_rand(n * d, -6, 6), *dy = ct_rand(n * d, -1, 1);
    for (int64_t i = 0; i < d; i++)
        x[2 * d + i] = -INFINITY; /* a fully masked row */
    for (int64_t i = 0; i < d; i += 3)
        x[4 * d + i] = -INFINITY; /* partly masked */
    float *y = ct_host(sizeof(float) * n * d), *dx = ct_rand(n * d, -1, 1);
    float *d_x = ct_dev(x, n * d), *d_dy = ct_dev(dy, n * d), *d_y = ct_dev(NULL, n * d);
    float *d_dx = ct_dev(dx, n * d);
    kb->softmax_fwd(d_y, d_x, n, d);
    kb->softmax_bwd(d_dx, d_dy, d_y, n, d);
    arl_k_softmax_fwd(y, x, n, d);
    arl_k_softmax_bwd(dx, dy, y, n, d);
    ct_check("softmax_fwd", d_y, y, n * d, 1e-9, 1e-5);
    ct_check("softmax_bwd (+=)", d_dx, dx, n * d, 1e-7, 1e-5);

    for (int64_t i = 0; i < d; i++) /* log-softmax: finite rows (-inf outputs would not compare) */
        x[2 * d + i] = (float)i * 1e-3f;
    for (int64_t i = 0; i < d; i += 3)
        x[4 * d + i] = -60.0f; /* strongly suppressed instead of masked */
    arl_cuda_upload(ct_ctx, d_x, x, sizeof(float) * n * d);
    kb->logsoftmax_fwd(d_y, d_x, n, d);
    kb->logsoftmax_bwd(d_dx, d_dy, d_y, n, d);
    arl_k_logsoftmax_fwd(y, x, n, d);
    arl_k_logsoftmax_bwd(dx, dy, y, n, d);
    ct_check("logsoftmax_fwd", d_y, y, n * d, 1e-5, 1e-5);
    ct_check("logsoftmax_bwd (+=)", d_dx, dx, n * d, 1e-6, 1e-5);
    free(x), free(dy), free(y), free(dx);
    CT_CASE_END;
}

static void test_softmax(void) {
    softmax_case(1000);
    softmax_case(1500);
}

/* V = 5000: a block a row on the device; 384 (the byte-level vocabulary): a warp a row */
static void logprob_case(int64_t V) {
    CT_CASE_BEGIN;
    const int64_t n = 7;
    float *z = ct_rand(n * V, -10, 10), *dl = ct_rand(n, -1, 1), *dz = ct_rand(n * V, -1, 1);
    int32_t tg[7] = {0, (int32_t)V - 1, -1, 17, (int32_t)V / 2, -1, 3};
    float lp[7], lse[7], ent[7];
    float *d_z = ct_dev(z, n * V), *d_dl = ct_dev(dl, n), *d_dz = ct_dev(dz, n * V);
    int32_t *d_tg = ct_dev_i32(tg, n);
    float *d_lp = ct_dev(NULL, n), *d_lse = ct_dev(NULL, n), *d_ent = ct_dev(NULL, n);
    kb->logprob_fwd(d_lp, d_lse, d_ent, d_z, d_tg, n, V);
    kb->logprob_bwd(d_dz, d_dl, d_z, d_lse, d_tg, n, V);
    arl_k_logprob_fwd(lp, lse, ent, z, tg, n, V);
    arl_k_logprob_bwd(dz, dl, z, lse, tg, n, V);
    /* logp ~ -10: absolute 1e-5 is a few ulp of lse (~ 10) */
    ct_check("logprob_fwd logp", d_lp, lp, n, 1e-5, 1e-5);
    ct_check("logprob_fwd lse", d_lse, lse, n, 1e-5, 1e-6);
    ct_check("logprob_fwd entropy", d_ent, ent, n, 1e-5, 1e-5);
    ct_check("logprob_bwd (+=)", d_dz, dz, n * V, 1e-6, 1e-5);
    free(z), free(dl), free(dz);
    CT_CASE_END;
}

static void test_logprob(void) {
    logprob_case(5000);
    logprob_case(384);
}

typedef void (*fwd_fn)(float *, const float *, int64_t);
typedef void (*bwd_fn)(float *, const float *, const float *, int64_t);

static void act_case(const char *name, fwd_fn gf, fwd_fn cf, bwd_fn gb, bwd_fn cb) {
    CT_CASE_BEGIN;
    const int64_t n = 2000;
    float *x = ct_rand(n, -8, 8), *dy = ct_rand(n, -1, 1), *y = ct_host(sizeof(float) * n);
    float *dx = ct_rand(n, -1, 1);
    x[0] = 0.0f, x[1] = 40.0f, x[2] = -40.0f; /* saturation */
    float *d_x = ct_dev(x, n), *d_dy = ct_dev(dy, n), *d_y = ct_dev(NULL, n), *d_dx = ct_dev(dx, n);
    gf(d_y, d_x, n);
    gb(d_dx, d_dy, d_x, n);
    cf(y, x, n);
    cb(dx, dy, x, n);
    char w[64];
    snprintf(w, sizeof w, "%s_fwd", name);
    ct_check(w, d_y, y, n, 2e-6, 2e-5);
    snprintf(w, sizeof w, "%s_bwd (+=)", name);
    ct_check(w, d_dx, dx, n, 2e-6, 2e-5);
    free(x), free(dy), free(y), free(dx);
    CT_CASE_END;
}

static void test_activations(void) {
    act_case("sigmoid", kb->sigmoid_fwd, arl_k_sigmoid_fwd, kb->sigmoid_bwd, arl_k_sigmoid_bwd);
    act_case("silu", kb->silu_fwd, arl_k_silu_fwd, kb->silu_bwd, arl_k_silu_bwd);
    act_case("tanh", kb->tanh_fwd, arl_k_tanh_fwd, kb->tanh_bwd, arl_k_tanh_bwd);
    act_case("softplus", kb->softplus_fwd, arl_k_softplus_fwd, kb->softplus_bwd,
             arl_k_softplus_bwd);
    act_case("gelu_tanh", kb->gelu_tanh_fwd, arl_k_gelu_tanh_fwd, kb->gelu_tanh_bwd,
             arl_k_gelu_tanh_bwd);
    act_case("gelu_erf", kb->gelu_erf_fwd, arl_k_gelu_erf_fwd, kb->gelu_erf_bwd,
             arl_k_gelu_erf_bwd);
    /* SiTU phi with the K3 cap beta1 = 4 */
    CT_CASE_BEGIN;
    const int64_t n = 2000;
    float *x = ct_rand(n, -30, 30), *dy = ct_rand(n, -1, 1), *y = ct_host(sizeof(float) * n);
    float *dx = ct_rand(n, -1, 1);
    float *d_x = ct_dev(x, n), *d_dy = ct_dev(dy, n), *d_y = ct_dev(NULL, n), *d_dx = ct_dev(dx, n);
    kb->situ_phi_fwd(d_y, d_x, n, 4.0f);
    kb->situ_phi_bwd(d_dx, d_dy, d_x, n, 4.0f);
    arl_k_situ_phi_fwd(y, x, n, 4.0f);
    arl_k_situ_phi_bwd(dx, dy, x, n, 4.0f);
    ct_check("situ_phi_fwd", d_y, y, n, 2e-6, 2e-5);
    ct_check("situ_phi_bwd (+=)", d_dx, dx, n, 2e-6, 2e-5);
    free(x), free(dy), free(y), free(dx);
    CT_CASE_END;
}

static void test_glu(void) {
    CT_CASE_BEGIN;
    const int64_t T = 11, f = 70, ld = 2 * f; /* fused [gate | up] rows */
    float *gu = ct_rand(T * ld, -30, 30), *dh = ct_rand(T * f, -1, 1);
    float *h = ct_host(sizeof(float) * T * f), *dgu = ct_rand(T * ld, -1, 1);
    float *d_gu = ct_dev(gu, T * ld), *d_dh = ct_dev(dh, T * f), *d_h = ct_dev(NULL, T * f);
    float *d_dgu = ct_dev(dgu, T * ld);
    kb->situ_glu_fwd(d_h, d_gu, d_gu + f, T, f, ld, 4.0f, 25.0f);
    kb->situ_glu_bwd(d_dgu, d_dgu + f, d_dh, d_gu, d_gu + f, T, f, ld, 4.0f, 25.0f);
    arl_k_situ_glu_fwd(h, gu, gu + f, T, f, ld, 4.0f, 25.0f);
    arl_k_situ_glu_bwd(dgu, dgu + f, dh, gu, gu + f, T, f, ld, 4.0f, 25.0f);
    /* |SiTU| < 100: absolute 2e-5 is a few ulp at that magnitude */
    ct_check("situ_glu_fwd", d_h, h, T * f, 2e-5, 2e-5);
    ct_check("situ_glu_bwd (+=)", d_dgu, dgu, T * ld, 2e-5, 2e-5);
    kb->swiglu_fwd(d_h, d_gu, d_gu + f, T, f, ld);
    kb->swiglu_bwd(d_dgu, d_dgu + f, d_dh, d_gu, d_gu + f, T, f, ld);
    arl_k_swiglu_fwd(h, gu, gu + f, T, f, ld);
    arl_k_swiglu_bwd(dgu, dgu + f, dh, gu, gu + f, T, f, ld);
    ct_check("swiglu_fwd", d_h, h, T * f, 2e-5, 2e-5);
    ct_check("swiglu_bwd (+=)", d_dgu, dgu, T * ld, 2e-5, 2e-5);
    free(gu), free(dh), free(h), free(dgu);
    CT_CASE_END;
}

static void test_elementwise(void) {
    CT_CASE_BEGIN;
    const int64_t n = 1234, T = 34, d = 36; /* T * d == n - 10: scale_rows uses the front */
    float *a = ct_rand(n, -2, 2), *b = ct_rand(n, -2, 2), *s = ct_rand(T, -2, 2);
    float *y = ct_rand(n, -2, 2);
    float *da = ct_dev(a, n), *db = ct_dev(b, n), *dsr = ct_dev(s, T), *dy = ct_dev(y, n);
    /* one rounding per result on both sides, except that nvcc contracts y + a*b into an FMA
     * (mul_acc, axpy): rtol 1e-6 covers the one extra rounding */
    kb->mul_acc(dy, da, db, n), arl_k_mul_acc(y, a, b, n);
    ct_check("mul_acc", dy, y, n, 1e-6, 1e-6);
    kb->axpy(dy, -0.3f, da, n), arl_k_axpy(y, -0.3f, a, n);
    ct_check("axpy", dy, y, n, 1e-6, 1e-6);
    kb->add(dy, da, db, n), arl_k_add(y, a, b, n);
    ct_check("add", dy, y, n, 0, 0);
    kb->mul(dy, da, db, n), arl_k_mul(y, a, b, n);
    ct_check("mul", dy, y, n, 0, 0);
    kb->scale(dy, da, 1.7f, n), arl_k_scale(y, a, 1.7f, n);
    ct_check("scale", dy, y, n, 0, 0);
    kb->scale_rows(dy, da, dsr, T, d), arl_k_scale_rows(y, a, s, T, d);
    ct_check("scale_rows", dy, y, n, 0, 0);
    kb->copy(dy, db, n), arl_k_copy(y, b, n);
    ct_check("copy", dy, y, n, 0, 0);
    kb->fill(dy, 2.5f, n), arl_k_fill(y, 2.5f, n);
    ct_check("fill", dy, y, n, 0, 0);
    free(a), free(b), free(s), free(y);
    CT_CASE_END;
}

static void test_reduce(void) {
    CT_CASE_BEGIN;
    const int64_t n = 300001, T = 41, d = 77;
    float *x = ct_rand(n, -1, 1), *a = ct_rand(T * d, -1, 1), *b = ct_rand(T * d, -1, 1);
    float *dx = ct_dev(x, n), *d_a = ct_dev(a, T * d), *d_b = ct_dev(b, T * d);
    float *out = ct_dev(NULL, d + T);
    float r[1], rows[41], cols[77];
    /* both sides sum in double and round once: equal up to the last bit of fp32 */
    kb->sum(out, dx, n), arl_k_sum(r, x, n);
    ct_check("sum", out, r, 1, 1e-6, 1e-6);
    kb->sumsq(out, dx, n), arl_k_sumsq(r, x, n);
    ct_check("sumsq", out, r, 1, 0, 1e-6);
    kb->max(out, dx, n), arl_k_max(r, x, n);
    ct_check("max", out, r, 1, 0, 0);
    kb->max(out, dx, 0), arl_k_max(r, x, 0); /* -inf for n == 0 */
    float *h = ct_get(out, 1);
    CHECK(h[0] == -INFINITY && r[0] == -INFINITY);
    free(h);
    x[1000] = NAN;
    arl_cuda_upload(ct_ctx, dx, x, sizeof(float) * n);
    kb->max(out, dx, n);
    h = ct_get(out, 1);
    CHECK_MSG(isnan(h[0]), "max with a NaN must be NaN, got %g", h[0]);
    free(h);
    kb->sum_rows(out, d_a, T, d), arl_k_sum_rows(rows, a, T, d);
    ct_check("sum_rows", out, rows, T, 1e-7, 1e-6);
    kb->sum_cols(out, d_a, T, d), arl_k_sum_cols(cols, a, T, d);
    ct_check("sum_cols", out, cols, d, 1e-7, 1e-6);
    kb->dot_rows(out, d_a, d_b, T, d), arl_k_dot_rows(rows, a, b, T, d);
    ct_check("dot_rows", out, rows, T, 1e-7, 1e-6);
    /* the same values as one row of T d > 1024 columns: a block a row on the device (a warp
     * a row above) */
    kb->sum_rows(out, d_a, 1, T * d), arl_k_sum_rows(rows, a, 1, T * d);
    ct_check("sum_rows (one wide row)", out, rows, 1, 1e-7, 1e-6);
    kb->dot_rows(out, d_a, d_b, 1, T * d), arl_k_dot_rows(rows, a, b, 1, T * d);
    ct_check("dot_rows (one wide row)", out, rows, 1, 1e-7, 1e-6);
    free(x), free(a), free(b);
    CT_CASE_END;
}

/* argmax_rows of x (n, d) on the device (d_x) against the CPU's, exactly */
static void check_argmax(const float *d_x, const float *x, int64_t n, int64_t d) {
    int32_t *d_idx = ct_dev_i32(NULL, n), *am = malloc(sizeof(int32_t) * (size_t)n);
    kb->argmax_rows(d_idx, d_x, n, d);
    arl_k_argmax_rows(am, x, n, d);
    int32_t *h = ct_get_i32(d_idx, n);
    for (int64_t t = 0; t < n; t++)
        CHECK_MSG(h[t] == am[t], "argmax %lld x %lld, row %lld: gpu %d cpu %d", (long long)n,
                  (long long)d, (long long)t, h[t], am[t]);
    free(h), free(am);
}

/* argmax rows a warp each (11 rows: a second, partial block of 8) and a block each (3000
 * columns), with ties between the lanes' and the warps' winners: the lowest index wins */
static void test_argmax(void) {
    CT_CASE_BEGIN;
    const int64_t shapes[2][2] = {{11, 300}, {3, 3000}};
    for (int c = 0; c < 2; c++) {
        const int64_t n = shapes[c][0], d = shapes[c][1];
        float *x = ct_rand(n * d, -1, 1);
        for (int64_t i = 0; i < d; i++) /* the maximum at 2 + 37 k: every lane / warp ties */
            x[1 * d + i] = i % 37 == 2 ? 5.0f : (float)(i % 5);
        x[2 * d + d - 1] = INFINITY; /* the last column */
        if (n > 4) {
            for (int64_t i = 0; i < d; i++)
                x[3 * d + i] = NAN;
            x[4 * d + d / 2] = NAN; /* NaN ranks below every number */
        }
        float *d_x = ct_dev(x, n * d);
        check_argmax(d_x, x, n, d);
        free(x);
    }
    CT_CASE_END;
}

static void test_select(void) {
    CT_CASE_BEGIN;
    const int64_t n = 6, d = 300, k = 16;
    float *x = ct_rand(n * d, -1, 1);
    for (int64_t i = 0; i < d; i++)
        x[1 * d + i] = (float)(i % 7); /* many ties: lower index wins */
    x[2 * d + 5] = NAN, x[2 * d + 7] = INFINITY, x[2 * d + 9] = -INFINITY;
    for (int64_t i = 0; i < d; i++)
        x[3 * d + i] = NAN; /* all NaN: lowest indices */
    x[4 * d + 3] = -0.0f, x[4 * d + 1] = 0.0f;
    float *d_x = ct_dev(x, n * d);
    int32_t *d_idx = ct_dev_i32(NULL, n * k);
    float *d_val = ct_dev(NULL, n * k);
    int32_t idx[6 * 16];
    float val[6 * 16];
    check_argmax(d_x, x, n, d);
    int32_t *h;
    kb->topk_rows(d_idx, d_val, d_x, n, d, k);
    arl_k_topk_rows(idx, val, x, n, d, k);
    h = ct_get_i32(d_idx, n * k);
    float *hv = ct_get(d_val, n * k);
    for (int64_t i = 0; i < n * k; i++) {
        CHECK_MSG(h[i] == idx[i], "topk [%lld]: gpu %d cpu %d", (long long)i, h[i], idx[i]);
        CHECK(memcmp(&hv[i], &val[i], sizeof(float)) == 0 || (isnan(hv[i]) && isnan(val[i])));
    }
    free(h), free(hv), free(x);
    CT_CASE_END;
}

int main(void) {
    ct_init((size_t)256 << 20);
    kb = arl_cuda_backend();
    CHECK(kb != NULL && strcmp(kb->name, "cuda") == 0);
    TEST_RUN(test_gemm);
    TEST_RUN(test_gemm_batched);
    TEST_RUN(test_linear);
    TEST_RUN(test_norms);
    TEST_RUN(test_softmax);
    TEST_RUN(test_logprob);
    TEST_RUN(test_activations);
    TEST_RUN(test_glu);
    TEST_RUN(test_elementwise);
    TEST_RUN(test_reduce);
    TEST_RUN(test_select);
    TEST_RUN(test_argmax);
    arl_cuda_close(ct_ctx);
    return test_finish();
}
