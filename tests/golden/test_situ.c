/* tests/golden/test_situ.c: the SiTU-GLU kernel (kernels/activation.h arl_k_situ_*) against the
 * golden case situ (spec/policy.md section 8, 16.2): values, phi and both partial derivatives
 * on 2057 pairs (g, u), 9 special points, 1024 uniform in [-60, 60], 1024 N(0, 4^2).
 *
 * Tolerance: spec 16.4, elementwise |a - ref| <= atol + rtol |ref| with atol = 1e-6,
 * rtol = 1e-5 (single elementwise operation on the fp32 CPU).  A kernel that forms
 * 1 - tanh^2(g/b1) by subtraction loses up to ~4 digits for g in about [10, 30], where
 * tanh(g/4) is within 1e-3 of 1 (e.g. g = 19: relative error 2.6e-4 in dSiTU/dg); this test
 * is meant to catch that.
 */
#include <math.h>

#include "kernels/activation.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#define ATOL 1e-6 /* spec 16.4, single elementwise operations */
#define RTOL 1e-5

static void cmp_el(golden_case *gc, const char *name, const float *a, int64_t n) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_f32(what, a, golden_f32(gc, name, n), (size_t)n, ATOL, RTOL);
}

static void test_situ(void) {
    golden_case *gc = golden_open("situ");
    const int64_t N = golden_numel(gc, "g", NULL, NULL);
    float *g = golden_f32(gc, "g", N), *u = golden_f32(gc, "u", N);
    float *y = golden_zeros(gc, N), *phi = golden_zeros(gc, N);
    float *dg = golden_zeros(gc, N), *du = golden_zeros(gc, N), *ones = golden_zeros(gc, N);
    for (int64_t i = 0; i < N; i++)
        ones[i] = 1.0f;
    arl_k_situ_glu_fwd(y, g, u, N, 1, 1, 4.0f, 25.0f);
    arl_k_situ_glu_bwd(dg, du, ones, g, u, N, 1, 1, 4.0f, 25.0f);
    arl_k_situ_phi_fwd(phi, g, N, 4.0f);
    cmp_el(gc, "y", y, N);
    cmp_el(gc, "phi", phi, N);
    cmp_el(gc, "dy_dg", dg, N);
    cmp_el(gc, "dy_du", du, N);
    for (int64_t i = 0; i < N; i++)
        CHECK(fabsf(y[i]) < 100.0f); /* |SiTU| < b1 b2 */
    golden_close(gc);
}

int main(void) {
    TEST_RUN(test_situ);
    return test_finish();
}
