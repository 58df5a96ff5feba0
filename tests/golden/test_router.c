/* tests/golden/test_router.c: policy/router.c against the golden cases router (spec 6) and
 * latent_moe (spec 7: the Stable LatentMoE composed here from the router, kernels/gemm.h,
 * kernels/activation.h SiTU-GLU and kernels/norm.h, grouped by expert as in 7.2), plus
 * finite-difference checks of the router backward and the forced-route errors.
 *
 * Tolerances: spec 16.4, max|ref| form with atol = 0; selected experts (integers) exactly.
 * Router weights and scores: rtol 1e-5 (one d = 16 dot product and a sigmoid in fp32, errors
 * ~1e-7); gradients rtol 1e-4 (one more reduction over k or d).  LatentMoE: rtol 1e-4 forward
 * and 1e-3 backward, the composite values of 16.4 (GEMMs over d, dz, f; the latent RMSNorm).
 * The golden inputs keep every top-k margin above 1e-4, so fp32 rounding cannot change a route.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "policy/router.h"
#include "tests/golden/fdcheck.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

static void cmp(golden_case *gc, const char *name, const float *a, int64_t n, double rtol) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, rtol);
}

static void cmp_sel(golden_case *gc, const char *name, const int32_t *sel, int64_t n) {
    int64_t *ref = golden_i64(gc, name, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += ref[i] != sel[i];
    CHECK_MSG(bad == 0, "%s/%s: %d routes differ", golden_name(gc), name, bad);
}

static void test_router(void) {
    golden_case *gc = golden_open("router");
    enum { T = 12, D = 16, E = 8, K = 3 };
    const float rho = 2.5f;
    float *x = golden_f32(gc, "x", T * D), *W = golden_f32(gc, "W_r", E * D);
    float *b = golden_f32(gc, "b", E);
    int32_t sel[T * K];
    float *p = golden_zeros(gc, T * K), *s = golden_zeros(gc, T * E);
    float *ws = golden_zeros(gc, arl_router_ws_floats(T, E));
    CHECK(arl_router_fwd(sel, p, s, x, W, b, NULL, T, D, E, K, rho, ws) == ARL_OK);
    cmp(gc, "s", s, T * E, 1e-5);
    cmp_sel(gc, "sel", sel, T * K);
    cmp(gc, "p", p, T * K, 1e-5);
    float *dense = golden_zeros(gc, T * E);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < K; i++)
            dense[t * E + sel[t * K + i]] = p[t * K + i];
    cmp(gc, "p_dense", dense, T * E, 1e-5);
    float *dp = golden_f32(gc, "dp", T * K);
    float *dx = golden_zeros(gc, T * D), *dW = golden_zeros(gc, E * D);
    arl_router_bwd(dx, dW, dp, x, W, s, sel, T, D, E, K, rho, ws);
    cmp(gc, "dx", dx, T * D, 1e-4);
    cmp(gc, "dW_r", dW, E * D, 1e-4);
    /* forced routes: p recomputed from the current s on the given experts, in their order */
    int32_t *forced = golden_i32(gc, "forced_sel", T * K);
    int32_t fsel[T * K];
    float *fp = golden_zeros(gc, T * K), *fdx = golden_zeros(gc, T * D);
    float *fdW = golden_zeros(gc, E * D);
    CHECK(arl_router_fwd(fsel, fp, s, x, W, b, forced, T, D, E, K, rho, ws) == ARL_OK);
    CHECK(memcmp(fsel, forced, sizeof fsel) == 0);
    cmp(gc, "forced_p", fp, T * K, 1e-5);
    arl_router_bwd(fdx, fdW, golden_f32(gc, "forced_dp", T * K), x, W, s, fsel, T, D, E, K, rho,
                   ws);
    cmp(gc, "forced_dx", fdx, T * D, 1e-4);
    cmp(gc, "forced_dW_r", fdW, E * D, 1e-4);
    /* bad forced routes are errors that name the token, not crashes */
    int32_t bad[T * K];
    memcpy(bad, forced, sizeof bad);
    bad[5 * K + 1] = E;
    CHECK(arl_router_fwd(fsel, fp, s, x, W, b, bad, T, D, E, K, rho, ws) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "token 5") != NULL);
    memcpy(bad, forced, sizeof bad);
    bad[7 * K + 2] = bad[7 * K + 0];
    CHECK(arl_router_fwd(fsel, fp, s, x, W, b, bad, T, D, E, K, rho, ws) == ARL_ERR_RANGE);
    golden_close(gc);
}

/* ---- Stable LatentMoE composed from the router and the kernels ---- */

enum { MT = 12, MD = 32, ME = 8, MK = 2, MF = 16, MZ = 16, MFS = 32 };

typedef struct moe_w {
    float *gate, *bias, *down, *znorm, *up, *w1, *w3, *w2, *sh_gate, *sh_up, *sh_down;
} moe_w;

typedef struct moe_act {
    int32_t sel[MT * MK];
    float p[MT * MK], s[MT * ME], z[MT * MZ], u[MT * MZ], rz[MT], un[MT * MZ], y[MT * MD];
    float shg[MT * MFS], shu[MT * MFS], shh[MT * MFS];
    float eg[MT * MK * MF], eu[MT * MK * MF], eh[MT * MK * MF], eo[MT * MK * MZ]; /* per route */
} moe_act;

static void glu_fwd(float *y, float *g, float *u, float *h, const float *x, const float *Wg,
                    const float *Wu, const float *Wd, int64_t T, int64_t in, int64_t f,
                    int64_t out) {
    arl_k_linear_fwd(g, x, Wg, T, in, f);
    arl_k_linear_fwd(u, x, Wu, T, in, f);
    arl_k_situ_glu_fwd(h, g, u, T, f, f, 4.0f, 25.0f);
    arl_k_linear_fwd(y, h, Wd, T, f, out);
}

/* Forward of spec 7.1 (use_norm = 1) or without the latent norm; routes one token at a time
 * per expert (grouping by expert changes no value). */
static void moe_fwd(moe_act *a, const moe_w *w, const float *x, float rho, int use_norm,
                    float *ws) {
    CHECK(arl_router_fwd(a->sel, a->p, a->s, x, w->gate, w->bias, NULL, MT, MD, ME, MK, rho, ws) ==
          ARL_OK);
    arl_k_linear_fwd(a->z, x, w->down, MT, MD, MZ);
    memset(a->u, 0, sizeof a->u);
    for (int t = 0; t < MT; t++)
        for (int i = 0; i < MK; i++) {
            int e = a->sel[t * MK + i], ri = t * MK + i;
            glu_fwd(a->eo + ri * MZ, a->eg + ri * MF, a->eu + ri * MF, a->eh + ri * MF,
                    a->z + t * MZ, w->w1 + e * MF * MZ, w->w3 + e * MF * MZ, w->w2 + e * MZ * MF, 1,
                    MZ, MF, MZ);
            for (int c = 0; c < MZ; c++)
                a->u[t * MZ + c] += a->p[ri] * a->eo[ri * MZ + c];
        }
    if (use_norm)
        arl_k_rmsnorm_fwd(a->un, a->rz, a->u, w->znorm, MT, MZ, 1e-5f);
    else
        memcpy(a->un, a->u, sizeof a->u);
    arl_k_linear_fwd(a->y, a->un, w->up, MT, MZ, MD);
    float ysh[MT * MD];
    glu_fwd(ysh, a->shg, a->shu, a->shh, x, w->sh_gate, w->sh_up, w->sh_down, MT, MD, MFS, MD);
    for (int i = 0; i < MT * MD; i++)
        a->y[i] += ysh[i];
}

static void glu_bwd(float *dx, float *dWg, float *dWu, float *dWd, const float *dy, const float *x,
                    const float *g, const float *u, const float *h, const float *Wg,
                    const float *Wu, const float *Wd, int64_t T, int64_t in, int64_t f,
                    int64_t out) {
    float *dh = calloc((size_t)(T * f), sizeof(float)),
          *dg = calloc((size_t)(T * f), sizeof(float));
    float *du = calloc((size_t)(T * f), sizeof(float));
    arl_k_linear_bwd_w(dWd, dy, h, T, f, out);
    arl_k_linear_bwd_x(dh, dy, Wd, T, f, out);
    arl_k_situ_glu_bwd(dg, du, dh, g, u, T, f, f, 4.0f, 25.0f);
    arl_k_linear_bwd_w(dWg, dg, x, T, in, f);
    arl_k_linear_bwd_w(dWu, du, x, T, in, f);
    arl_k_linear_bwd_x(dx, dg, Wg, T, in, f);
    arl_k_linear_bwd_x(dx, du, Wu, T, in, f);
    free(dh);
    free(dg);
    free(du);
}

static void test_latent_moe(void) {
    golden_case *gc = golden_open("latent_moe");
    moe_w w = {.gate = golden_f32(gc, "gate", ME * MD),
               .bias = golden_f32(gc, "bias", ME),
               .down = golden_f32(gc, "down", MZ * MD),
               .znorm = golden_f32(gc, "znorm", MZ),
               .up = golden_f32(gc, "up", MD * MZ),
               .w1 = golden_f32(gc, "w1", ME * MF * MZ),
               .w3 = golden_f32(gc, "w3", ME * MF * MZ),
               .w2 = golden_f32(gc, "w2", ME * MZ * MF),
               .sh_gate = golden_f32(gc, "sh_gate", MFS * MD),
               .sh_up = golden_f32(gc, "sh_up", MFS * MD),
               .sh_down = golden_f32(gc, "sh_down", MD * MFS)};
    float *x = golden_f32(gc, "x", MT * MD), *dy = golden_f32(gc, "dy", MT * MD);
    float *ws = golden_zeros(gc, arl_router_ws_floats(MT, ME));
    for (int variant = 0; variant < 2; variant++) {
        const char *tag = variant ? "nonorm_" : "";
        float rho = variant ? 2.5f : 1.0f;
        int use_norm = !variant;
        static moe_act a;
        moe_fwd(&a, &w, x, rho, use_norm, ws);
        char k[64];
#define NAME(s) (snprintf(k, sizeof k, "%s%s", tag, s), k)
        cmp(gc, NAME("y"), a.y, MT * MD, 1e-4);
        if (!variant) {
            cmp_sel(gc, "sel", a.sel, MT * MK);
            cmp(gc, "p", a.p, MT * MK, 1e-5);
            cmp(gc, "z", a.z, MT * MZ, 1e-4);
            cmp(gc, "u", a.u, MT * MZ, 1e-4);
            int64_t *loads = golden_i64(gc, "loads", ME);
            CHECK_EQ_INT(loads[5], 0); /* the expert without tokens */
        }
        /* backward, spec 7.3 */
        float *dx = golden_zeros(gc, MT * MD), *dup = golden_zeros(gc, MD * MZ);
        float *dun = golden_zeros(gc, MT * MZ), *du = golden_zeros(gc, MT * MZ);
        float *dzn = golden_zeros(gc, MZ), *dz = golden_zeros(gc, MT * MZ);
        float *dW1 = golden_zeros(gc, ME * MF * MZ), *dW3 = golden_zeros(gc, ME * MF * MZ);
        float *dW2 = golden_zeros(gc, ME * MZ * MF), *ddown = golden_zeros(gc, MZ * MD);
        float *dgate = golden_zeros(gc, ME * MD), *dp = golden_zeros(gc, MT * MK);
        float *dshg = golden_zeros(gc, MFS * MD), *dshu = golden_zeros(gc, MFS * MD);
        float *dshd = golden_zeros(gc, MD * MFS);
        glu_bwd(dx, dshg, dshu, dshd, dy, x, a.shg, a.shu, a.shh, w.sh_gate, w.sh_up, w.sh_down, MT,
                MD, MFS, MD);
        arl_k_linear_bwd_w(dup, dy, a.un, MT, MZ, MD);
        arl_k_linear_bwd_x(dun, dy, w.up, MT, MZ, MD);
        if (use_norm)
            arl_k_rmsnorm_bwd(du, dzn, dun, a.u, w.znorm, a.rz, MT, MZ);
        else
            memcpy(du, dun, sizeof(float) * MT * MZ);
        for (int t = 0; t < MT; t++)
            for (int i = 0; i < MK; i++) {
                int e = a.sel[t * MK + i], ri = t * MK + i;
                float acc = 0.0f, dE[MZ];
                for (int c = 0; c < MZ; c++) {
                    acc += a.eo[ri * MZ + c] * du[t * MZ + c]; /* dp_i = E_i(z) . du */
                    dE[c] = a.p[ri] * du[t * MZ + c];          /* dE_i = p_i du */
                }
                dp[ri] = acc;
                glu_bwd(dz + t * MZ, dW1 + e * MF * MZ, dW3 + e * MF * MZ, dW2 + e * MZ * MF, dE,
                        a.z + t * MZ, a.eg + ri * MF, a.eu + ri * MF, a.eh + ri * MF,
                        w.w1 + e * MF * MZ, w.w3 + e * MF * MZ, w.w2 + e * MZ * MF, 1, MZ, MF, MZ);
            }
        arl_k_linear_bwd_w(ddown, dz, x, MT, MD, MZ);
        arl_k_linear_bwd_x(dx, dz, w.down, MT, MD, MZ);
        arl_router_bwd(dx, dgate, dp, x, w.gate, a.s, a.sel, MT, MD, ME, MK, rho, ws);
        cmp(gc, NAME("dx"), dx, MT * MD, 1e-3);
        cmp(gc, NAME("dgate"), dgate, ME * MD, 1e-3);
        cmp(gc, NAME("ddown"), ddown, MZ * MD, 1e-3);
        cmp(gc, NAME("dup"), dup, MD * MZ, 1e-3);
        cmp(gc, NAME("dw1"), dW1, ME * MF * MZ, 1e-3);
        cmp(gc, NAME("dw3"), dW3, ME * MF * MZ, 1e-3);
        cmp(gc, NAME("dw2"), dW2, ME * MZ * MF, 1e-3);
        cmp(gc, NAME("dsh_gate"), dshg, MFS * MD, 1e-3);
        cmp(gc, NAME("dsh_up"), dshu, MFS * MD, 1e-3);
        cmp(gc, NAME("dsh_down"), dshd, MD * MFS, 1e-3);
        if (use_norm) cmp(gc, "dznorm", dzn, MZ, 1e-3);
        /* the expert without tokens gets exactly zero gradient */
        for (int i = 0; i < MF * MZ; i++)
            CHECK(dW1[5 * MF * MZ + i] == 0.0f);
#undef NAME
    }
    golden_close(gc);
}

/* ---- finite differences of the router backward (routes fixed by large margins) ---- */

enum { FT = 3, FD = 4, FE = 5, FK = 2 };
typedef struct fd_router {
    float x[FT * FD], W[FE * FD], b[FE], up[FT * FK];
    int32_t sel[FT * FK];
} fd_router;

static double fd_router_loss(void *vctx) {
    fd_router *f = vctx;
    int32_t sel[FT * FK];
    float p[FT * FK], s[FT * FE], ws[FT * FE];
    /* forced = the routes of the unperturbed input: the loss is smooth in x and W */
    CHECK(arl_router_fwd(sel, p, s, f->x, f->W, f->b, f->sel, FT, FD, FE, FK, 1.7f, ws) == ARL_OK);
    double L = 0.0;
    for (int i = 0; i < FT * FK; i++)
        L += (double)p[i] * f->up[i];
    return L;
}

static void test_router_fd(void) {
    arl_rng r;
    arl_rng_seed(&r, 41);
    fd_router f;
    for (int i = 0; i < FT * FD; i++)
        f.x[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    for (int i = 0; i < FE * FD; i++)
        f.W[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    for (int i = 0; i < FE; i++)
        f.b[i] = 0.0f;
    for (int i = 0; i < FT * FK; i++)
        f.up[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    float p[FT * FK], s[FT * FE], ws[FT * FE];
    CHECK(arl_router_fwd(f.sel, p, s, f.x, f.W, f.b, NULL, FT, FD, FE, FK, 1.7f, ws) == ARL_OK);
    float dx[FT * FD] = {0}, dW[FE * FD] = {0};
    arl_router_bwd(dx, dW, f.up, f.x, f.W, s, f.sel, FT, FD, FE, FK, 1.7f, ws);
    fd_check("fd router dx", f.x, dx, FT * FD, fd_router_loss, &f, 1e-2f);
    fd_check("fd router dW_r", f.W, dW, FE * FD, fd_router_loss, &f, 1e-2f);
}

/* Ties in s + b go to the lower expert index. */
static void test_router_ties(void) {
    enum { E = 6, K = 3 };
    float x[1] = {1.0f}, W[E] = {0.5f, 0.7f, 0.5f, 0.7f, 0.2f, 0.7f}, b[E] = {0};
    int32_t sel[K];
    float p[K], s[E], ws[E];
    CHECK(arl_router_fwd(sel, p, s, x, W, b, NULL, 1, 1, E, K, 1.0f, ws) == ARL_OK);
    CHECK_EQ_INT(sel[0], 1);
    CHECK_EQ_INT(sel[1], 3);
    CHECK_EQ_INT(sel[2], 5);
    CHECK_CLOSE(p[0] + p[1] + p[2], 1.0, 1e-6, 0); /* rho = 1, renormalised */
}

int main(void) {
    TEST_RUN(test_router);
    TEST_RUN(test_latent_moe);
    TEST_RUN(test_router_fd);
    TEST_RUN(test_router_ties);
    return test_finish();
}
