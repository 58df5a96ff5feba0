/* tests/golden/test_stages.c: the elementwise stages against the golden cases l2norm,
 * rmsnorm_gated and short_conv (spec/policy.md 1.3, 3.1, 3.4, 3.9, 16.2).  L2Norm and plain
 * RMSNorm are the kernels' (kernels/norm.h); the gated output norm and the short convolution
 * are policy/kda.h's.  SiTU is in test_situ.c.
 *
 * Tolerances: spec 16.4 sets the elementwise form |a - ref| <= atol + rtol |ref| with
 * atol = 1e-6, rtol = 1e-5 for these single operations on the fp32 CPU (one fp32 rounding per
 * operand plus a reduction over one row).  Weight gradients (dw of the norms and of the conv)
 * are sums over all rows, where cancellation makes a relative bound per element meaningless;
 * they use the max|ref| form with rtol 1e-5 (same size of error, measured against the largest
 * entry).
 */
#include <math.h>
#include <string.h>

#include "kernels/norm.h"
#include "policy/kda.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#define ATOL 1e-6 /* spec 16.4, single elementwise operations */
#define RTOL 1e-5

static void cmp_el(golden_case *gc, const char *name, const float *a, int64_t n) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_f32(what, a, golden_f32(gc, name, n), (size_t)n, ATOL, RTOL);
}

static void cmp_sum(golden_case *gc, const char *name, const float *a, int64_t n) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, RTOL);
}

static void test_l2norm(void) {
    golden_case *gc = golden_open("l2norm");
    const int64_t N = 24, D = 32;
    float *x = golden_f32(gc, "x", N * D), *dy = golden_f32(gc, "dy", N * D);
    float *y = golden_zeros(gc, N * D), *rn = golden_zeros(gc, N), *dx = golden_zeros(gc, N * D);
    arl_k_l2norm_fwd(y, rn, x, N, D, 1e-6f);
    arl_k_l2norm_bwd(dx, dy, x, rn, N, D);
    cmp_el(gc, "y", y, N * D);
    cmp_el(gc, "dx", dx, N * D);
    golden_close(gc);
}

static void test_rmsnorm_gated(void) {
    golden_case *gc = golden_open("rmsnorm_gated");
    const int64_t T = 10, H = 2, dv = 32, n = T * H;
    float *x = golden_f32(gc, "x", n * dv), *gam = golden_f32(gc, "gam", n * dv);
    float *w = golden_f32(gc, "w", dv), *dy = golden_f32(gc, "dy", n * dv);
    float *y = golden_zeros(gc, n * dv), *rstd = golden_zeros(gc, n);
    float *dx = golden_zeros(gc, n * dv), *dgam = golden_zeros(gc, n * dv),
          *dw = golden_zeros(gc, dv);
    arl_kda_onorm_fwd(y, rstd, x, gam, w, n, dv, 1e-5f);
    arl_kda_onorm_bwd(dx, dgam, dw, dy, x, gam, w, rstd, n, dv);
    cmp_el(gc, "y", y, n * dv);
    cmp_el(gc, "dx", dx, n * dv);
    cmp_el(gc, "dgam", dgam, n * dv);
    cmp_sum(gc, "dw", dw, dv);
    /* the plain RMSNorm of every other norm of the model (kernels/norm.h) */
    float *y2 = golden_zeros(gc, n * dv), *r2 = golden_zeros(gc, n);
    float *dx2 = golden_zeros(gc, n * dv), *dw2 = golden_zeros(gc, dv);
    arl_k_rmsnorm_fwd(y2, r2, x, w, n, dv, 1e-5f);
    arl_k_rmsnorm_bwd(dx2, dw2, dy, x, w, r2, n, dv);
    cmp_el(gc, "rms_y", y2, n * dv);
    cmp_el(gc, "rms_dx", dx2, n * dv);
    cmp_sum(gc, "rms_dw", dw2, dv);
    golden_close(gc);
}

static void test_short_conv(void) {
    golden_case *gc = golden_open("short_conv");
    const int64_t T = 20, C = 8, W = 4;
    float *x = golden_f32(gc, "x", T * C), *w = golden_f32(gc, "w", C * W);
    float *tail = golden_f32(gc, "tail", C * (W - 1)), *dz = golden_f32(gc, "dz", T * C);
    int32_t *cu = golden_i32(gc, "packed_cu_seqlens", 3);
    /* single: one sequence resumed from a conv tail */
    float *z = golden_zeros(gc, T * C), *dx = golden_zeros(gc, T * C),
          *dw = golden_zeros(gc, C * W);
    arl_kda_conv_fwd(z, NULL, x, w, tail, NULL, 1, T, C, W);
    arl_kda_conv_bwd(dx, dw, dz, x, w, tail, NULL, 1, T, C, W);
    cmp_el(gc, "single_z", z, T * C);
    cmp_el(gc, "single_dx", dx, T * C);
    cmp_sum(gc, "single_dw", dw, C * W);
    /* packed: two documents from zero history */
    float *zp = golden_zeros(gc, T * C), *dxp = golden_zeros(gc, T * C),
          *dwp = golden_zeros(gc, C * W);
    arl_kda_conv_fwd(zp, NULL, x, w, NULL, cu, 2, T, C, W);
    arl_kda_conv_bwd(dxp, dwp, dz, x, w, NULL, cu, 2, T, C, W);
    cmp_el(gc, "packed_z", zp, T * C);
    cmp_el(gc, "packed_dx", dxp, T * C);
    cmp_sum(gc, "packed_dw", dwp, C * W);
    /* the tail after the sequence, and decode steps equal to the prefill rows */
    float *tl = golden_zeros(gc, C * (W - 1));
    arl_kda_conv_tail(tl, x, T, tail, C, W);
    cmp_el(gc, "tail_out", tl, C * (W - 1));
    float *state = golden_zeros(gc, C * (W - 1)), *zs = golden_zeros(gc, T * C);
    memcpy(state, tail, sizeof(float) * C * (W - 1));
    for (int64_t t = 0; t < T; t++)
        arl_kda_conv_step(zs + t * C, state, x + t * C, w, C, W);
    cmp_el(gc, "single_z", zs, T * C);
    cmp_el(gc, "tail_out", state, C * (W - 1));
    /* a tail of a document shorter than W-1 keeps part of the previous tail */
    float *t2 = golden_zeros(gc, C * (W - 1));
    arl_kda_conv_tail(t2, x, 1, tail, C, W);
    for (int64_t c = 0; c < C; c++) {
        CHECK(t2[c * (W - 1) + 0] == tail[c * (W - 1) + 1]);
        CHECK(t2[c * (W - 1) + 1] == tail[c * (W - 1) + 2]);
        CHECK(t2[c * (W - 1) + 2] == x[c]);
    }
    golden_close(gc);
}

int main(void) {
    TEST_RUN(test_l2norm);
    TEST_RUN(test_rmsnorm_gated);
    TEST_RUN(test_short_conv);
    return test_finish();
}
