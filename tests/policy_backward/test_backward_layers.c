/* tests/policy_backward/test_backward_layers.c: the layer training forwards and backwards of
 * policy/kda_layer_backward.h, policy/mla_layer_backward.h and policy/moe_backward.h against the
 * golden layer cases of spec/policy.md 16.2: kda_layer (both core rules), mla_prefill (expanded
 * form, and the absorbed form on the same fresh documents), latent_moe (with the latent norm,
 * and without it at rho 2.5; an expert with no tokens).
 *
 * Tolerances (spec 16.4): forward outputs max|ref| rtol 1e-4, gradients max|ref| rtol 1e-3,
 * atol 0 - the values the golden tests of the components use for the same cases (fp32
 * reductions over at most 40 tokens give ~1e-6 relative; a wrong term is O(1)).
 */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "policy/kda.h"
#include "policy/kda_layer_backward.h"
#include "policy/mla_layer_backward.h"
#include "policy/moe_backward.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#define RTOL_FWD 1e-4
#define RTOL_BWD 1e-3

static void cmp(golden_case *gc, const char *name, const float *a, int64_t n, double rtol) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, rtol);
}

/* ---- KDA layer ---- */

enum { LD = 32, LH = 2, LDK = 16, LW = 4, LT = 40, LP = LH * LDK, LC = 16 };

static void test_kda_layer(int recurrent) {
    golden_case *gc = golden_open("kda_layer");
    const int64_t T = LT, d = LD, H = LH, dk = LDK, P = LP, W = LW;
    arl_kda_params p = {.q_proj = golden_f32(gc, "q_proj", P * d),
                        .k_proj = golden_f32(gc, "k_proj", P * d),
                        .v_proj = golden_f32(gc, "v_proj", P * d),
                        .q_conv = golden_f32(gc, "q_conv", P * W),
                        .k_conv = golden_f32(gc, "k_conv", P * W),
                        .v_conv = golden_f32(gc, "v_conv", P * W),
                        .f_a = golden_f32(gc, "f_a", dk * d),
                        .f_b = golden_f32(gc, "f_b", P * dk),
                        .dt_bias = golden_f32(gc, "dt_bias", P),
                        .A_log = golden_f32(gc, "A_log", H),
                        .b_proj = golden_f32(gc, "b_proj", H * d),
                        .g_proj = golden_f32(gc, "g_proj", P * d),
                        .o_norm = golden_f32(gc, "o_norm", dk),
                        .o_proj = golden_f32(gc, "o_proj", d * P)};
    arl_kda_params g = {.q_proj = golden_zeros(gc, P * d),
                        .k_proj = golden_zeros(gc, P * d),
                        .v_proj = golden_zeros(gc, P * d),
                        .q_conv = golden_zeros(gc, P * W),
                        .k_conv = golden_zeros(gc, P * W),
                        .v_conv = golden_zeros(gc, P * W),
                        .f_a = golden_zeros(gc, dk * d),
                        .f_b = golden_zeros(gc, P * dk),
                        .dt_bias = golden_zeros(gc, P),
                        .A_log = golden_zeros(gc, H),
                        .b_proj = golden_zeros(gc, H * d),
                        .g_proj = golden_zeros(gc, P * d),
                        .o_norm = golden_zeros(gc, dk),
                        .o_proj = golden_zeros(gc, d * P)};
    arl_kda_layer_cfg c = {.d = d,
                           .H = H,
                           .dk = dk,
                           .dv = dk,
                           .W = W,
                           .lower_bound_gate = 1,
                           .g_min = -5.0f,
                           .eps = 1e-5f,
                           .chunk = LC};
    float *x = golden_f32(gc, "x", T * d), *dy = golden_f32(gc, "dy", T * d);
    arl_kda_layer_save sv;
    arl_kda_layer_save_bind(&sv, &c, T, 1, golden_zeros(gc, arl_kda_layer_save_floats(&c, T, 1)));
    float *ws = golden_zeros(gc, arl_kda_layer_train_ws_floats(&c, T, 1));
    float *y = golden_zeros(gc, T * d), *dx = golden_zeros(gc, T * d);
    arl_kda_layer_fwd_save(y, x, &p, &c, NULL, 1, T, NULL, NULL, &sv, ws);
    cmp(gc, "y", y, T * d, RTOL_FWD);
    /* the same bits as the inference layer */
    float *y2 = golden_zeros(gc, T * d);
    arl_kda_layer_fwd(y2, x, &p, &c, NULL, 1, T, NULL, NULL, 0, NULL,
                      golden_zeros(gc, arl_kda_layer_ws_floats(&c, T, 1)));
    CHECK(memcmp(y, y2, sizeof(float) * (size_t)(T * d)) == 0);
    arl_kda_layer_bwd(dx, &g, dy, x, &p, &c, NULL, 1, T, &sv, NULL, NULL, NULL, NULL, NULL,
                      recurrent, ws);
    cmp(gc, "dx", dx, T * d, RTOL_BWD);
    cmp(gc, "dq_proj", g.q_proj, P * d, RTOL_BWD);
    cmp(gc, "dk_proj", g.k_proj, P * d, RTOL_BWD);
    cmp(gc, "dv_proj", g.v_proj, P * d, RTOL_BWD);
    cmp(gc, "dq_conv", g.q_conv, P * W, RTOL_BWD);
    cmp(gc, "dk_conv", g.k_conv, P * W, RTOL_BWD);
    cmp(gc, "dv_conv", g.v_conv, P * W, RTOL_BWD);
    cmp(gc, "do_proj", g.o_proj, d * P, RTOL_BWD);
    cmp(gc, "do_norm", g.o_norm, dk, RTOL_BWD);
    cmp(gc, "dg_proj", g.g_proj, P * d, RTOL_BWD);
    cmp(gc, "db_proj", g.b_proj, H * d, RTOL_BWD);
    cmp(gc, "dA_log", g.A_log, H, RTOL_BWD);
    cmp(gc, "ddt_bias", g.dt_bias, P, RTOL_BWD);
    cmp(gc, "df_a", g.f_a, dk * d, RTOL_BWD);
    cmp(gc, "df_b", g.f_b, P * dk, RTOL_BWD);
    golden_close(gc);
}

static void test_kda_layer_chunk(void) {
    test_kda_layer(0);
}

static void test_kda_layer_recurrent(void) {
    test_kda_layer(1);
}

/* ---- MLA layer ---- */

enum { D = 32, HM = 2, NN = 8, RR = 4, VM = 12, RQ = 24, RKV = 16, TT = 35, ND = 2 };

static void test_mla_layer(int absorbed) {
    golden_case *gc = golden_open("mla_prefill");
    int32_t *cu = golden_i32(gc, "cu_seqlens", ND + 1);
    arl_mla_params p = {.q_a = golden_f32(gc, "q_a_proj", RQ * D),
                        .q_a_norm = golden_f32(gc, "q_a_layernorm", RQ),
                        .q_b = golden_f32(gc, "q_b_proj", HM * (NN + RR) * RQ),
                        .kv_a = golden_f32(gc, "kv_a_proj_with_mqa", (RKV + RR) * D),
                        .kv_a_norm = golden_f32(gc, "kv_a_layernorm", RKV),
                        .kv_b = golden_f32(gc, "kv_b_proj", HM * (NN + VM) * RKV),
                        .g_proj = golden_f32(gc, "g_proj", HM * VM * D),
                        .o_proj = golden_f32(gc, "o_proj", D * HM * VM)};
    arl_mla_params g = {.q_a = golden_zeros(gc, RQ * D),
                        .q_a_norm = golden_zeros(gc, RQ),
                        .q_b = golden_zeros(gc, HM * (NN + RR) * RQ),
                        .kv_a = golden_zeros(gc, (RKV + RR) * D),
                        .kv_a_norm = golden_zeros(gc, RKV),
                        .kv_b = golden_zeros(gc, HM * (NN + VM) * RKV),
                        .g_proj = golden_zeros(gc, HM * VM * D),
                        .o_proj = golden_zeros(gc, D * HM * VM)};
    arl_mla_layer_cfg c = {.d = D,
                           .Hm = HM,
                           .rq = RQ,
                           .rkv = RKV,
                           .n = NN,
                           .r = RR,
                           .vm = VM,
                           .sparse_chunk = 64,
                           .sparse_topk = 0,
                           .max_rows = 64};
    const int64_t T = TT;
    float *x = golden_f32(gc, "x", T * D), *dy = golden_f32(gc, "dy", T * D);
    arl_mla_layer_save sv;
    arl_mla_layer_save_bind(&sv, &c, T, golden_zeros(gc, arl_mla_layer_save_floats(&c, T)));
    float *ws = golden_zeros(gc, arl_mla_layer_train_ws_floats(&c, T, ND));
    float *y = golden_zeros(gc, T * D), *dx = golden_zeros(gc, T * D);
    arl_mla_layer_fwd_save(y, x, &p, &c, cu, ND, T, NULL, NULL, absorbed, &sv, ws);
    CHECK_EQ_INT(sv.absorbed, absorbed);
    cmp(gc, "y", y, T * D, RTOL_FWD);
    if (!absorbed) { /* the same bits as the inference layer */
        float *y2 = golden_zeros(gc, T * D);
        arl_mla_layer_fwd(y2, NULL, x, &p, &c, cu, ND, T, NULL, NULL, 1,
                          golden_zeros(gc, arl_mla_layer_ws_floats(&c, T, ND, 1)));
        CHECK(memcmp(y, y2, sizeof(float) * (size_t)(T * D)) == 0);
    }
    arl_mla_layer_bwd(dx, &g, dy, x, &p, &c, cu, ND, T, NULL, NULL, &sv, NULL, NULL, ws);
    cmp(gc, "dx", dx, T * D, RTOL_BWD);
    cmp(gc, "do_proj", g.o_proj, D * HM * VM, RTOL_BWD);
    cmp(gc, "dg_proj", g.g_proj, HM * VM * D, RTOL_BWD);
    cmp(gc, "dkv_b_proj", g.kv_b, HM * (NN + VM) * RKV, RTOL_BWD);
    cmp(gc, "dkv_a_layernorm", g.kv_a_norm, RKV, RTOL_BWD);
    cmp(gc, "dkv_a_proj_with_mqa", g.kv_a, (RKV + RR) * D, RTOL_BWD);
    cmp(gc, "dq_b_proj", g.q_b, HM * (NN + RR) * RQ, RTOL_BWD);
    cmp(gc, "dq_a_layernorm", g.q_a_norm, RQ, RTOL_BWD);
    cmp(gc, "dq_a_proj", g.q_a, RQ * D, RTOL_BWD);
    golden_close(gc);
}

static void test_mla_layer_expanded(void) {
    test_mla_layer(0);
}

static void test_mla_layer_absorbed(void) {
    test_mla_layer(1);
}

/* ---- LatentMoE ---- */

enum { MT = 12, MD = 32, ME = 8, MK = 2, MF = 16, MZ = 16, MFS = 32 };

static void test_latent_moe(void) {
    golden_case *gc = golden_open("latent_moe");
    arl_moe_params p = {.gate = golden_f32(gc, "gate", ME * MD),
                        .gate_bias = golden_f32(gc, "bias", ME),
                        .down_proj = golden_f32(gc, "down", MZ * MD),
                        .latent_norm = golden_f32(gc, "znorm", MZ),
                        .up_proj = golden_f32(gc, "up", MD * MZ),
                        .shared_gate_proj = golden_f32(gc, "sh_gate", MFS * MD),
                        .shared_up_proj = golden_f32(gc, "sh_up", MFS * MD),
                        .shared_down_proj = golden_f32(gc, "sh_down", MD * MFS),
                        .w1 = golden_f32(gc, "w1", ME * MF * MZ),
                        .w3 = golden_f32(gc, "w3", ME * MF * MZ),
                        .w2 = golden_f32(gc, "w2", ME * MZ * MF)};
    float *x = golden_f32(gc, "x", MT * MD), *dy = golden_f32(gc, "dy", MT * MD);
    for (int variant = 0; variant < 2; variant++) {
        const char *tag = variant ? "nonorm_" : "";
        arl_moe_cfg c = {.d = MD,
                         .E = ME,
                         .k = MK,
                         .f = MF,
                         .dz = MZ,
                         .fs = MFS,
                         .rho = variant ? 2.5f : 1.0f,
                         .eps = 1e-5f,
                         .act = {.situ = 1, .beta1 = 4.0f, .beta2 = 25.0f}};
        arl_moe_params pv = p;
        if (variant) pv.latent_norm = NULL;
        arl_moe_params g = {.gate = golden_zeros(gc, ME * MD),
                            .gate_bias = golden_zeros(gc, ME),
                            .down_proj = golden_zeros(gc, MZ * MD),
                            .latent_norm = golden_zeros(gc, MZ),
                            .up_proj = golden_zeros(gc, MD * MZ),
                            .shared_gate_proj = golden_zeros(gc, MFS * MD),
                            .shared_up_proj = golden_zeros(gc, MFS * MD),
                            .shared_down_proj = golden_zeros(gc, MD * MFS),
                            .w1 = golden_zeros(gc, ME * MF * MZ),
                            .w3 = golden_zeros(gc, ME * MF * MZ),
                            .w2 = golden_zeros(gc, ME * MZ * MF)};
        arl_moe_save sv;
        arl_moe_save_bind(&sv, &c, MT, golden_zeros(gc, arl_moe_save_floats(&c, MT)));
        float *ws = golden_zeros(gc, arl_moe_train_ws_floats(&c, MT));
        float *y = golden_zeros(gc, MT * MD), *y2 = golden_zeros(gc, MT * MD);
        float *dx = golden_zeros(gc, MT * MD);
        CHECK(arl_moe_fwd_save(y, NULL, x, &pv, &c, NULL, MT, &sv, ws) == ARL_OK);
        CHECK(arl_moe_fwd(y2, NULL, x, &pv, &c, NULL, MT,
                          golden_zeros(gc, arl_moe_ws_floats(&c, MT))) == ARL_OK);
        CHECK(memcmp(y, y2, sizeof(float) * MT * MD) == 0);
        arl_moe_bwd(dx, &g, dy, x, &pv, &c, MT, &sv, ws);
        char k[64];
#define NAME(s) (snprintf(k, sizeof k, "%s%s", tag, s), k)
        cmp(gc, NAME("y"), y, MT * MD, RTOL_FWD);
        cmp(gc, NAME("dx"), dx, MT * MD, RTOL_BWD);
        cmp(gc, NAME("dgate"), g.gate, ME * MD, RTOL_BWD);
        cmp(gc, NAME("ddown"), g.down_proj, MZ * MD, RTOL_BWD);
        cmp(gc, NAME("dup"), g.up_proj, MD * MZ, RTOL_BWD);
        cmp(gc, NAME("dw1"), g.w1, ME * MF * MZ, RTOL_BWD);
        cmp(gc, NAME("dw3"), g.w3, ME * MF * MZ, RTOL_BWD);
        cmp(gc, NAME("dw2"), g.w2, ME * MZ * MF, RTOL_BWD);
        cmp(gc, NAME("dsh_gate"), g.shared_gate_proj, MFS * MD, RTOL_BWD);
        cmp(gc, NAME("dsh_up"), g.shared_up_proj, MFS * MD, RTOL_BWD);
        cmp(gc, NAME("dsh_down"), g.shared_down_proj, MD * MFS, RTOL_BWD);
        if (!variant) cmp(gc, "dznorm", g.latent_norm, MZ, RTOL_BWD);
#undef NAME
        /* expert 5 has no tokens: exactly zero gradient; the bias never gets one */
        for (int i = 0; i < MF * MZ; i++)
            CHECK(g.w1[5 * MF * MZ + i] == 0.0f && g.w3[5 * MF * MZ + i] == 0.0f &&
                  g.w2[5 * MZ * MF + i] == 0.0f);
        for (int i = 0; i < ME; i++)
            CHECK(g.gate_bias[i] == 0.0f);
    }
    golden_close(gc);
}

int main(void) {
    arl_k_threads_init(2);
    TEST_RUN(test_kda_layer_chunk);
    TEST_RUN(test_kda_layer_recurrent);
    TEST_RUN(test_mla_layer_expanded);
    TEST_RUN(test_mla_layer_absorbed);
    TEST_RUN(test_latent_moe);
    return test_finish();
}
