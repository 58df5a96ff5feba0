/* tests/cuda/test_train_ops.c: the training ops of the "cuda" device table
 * (policy/model_device.h, policy/model_device_cuda.c) against the "cpu" table on the same
 * random inputs: the new kernels of kernels/cuda/train.cu (KDA gate backwards, gated output
 * norm backward, embedding backward, the AdamW norm's chunk sums) and the new wrappers (the
 * routed experts' training forward and backward as grouped GEMMs, the router backward).  Exits
 * 77 without a GPU; under tests/cuda/emu (EMU_TESTS=test_train_ops) every kernel runs on the
 * CPU.
 *
 * Inputs as callers produce them: gradients accumulated into non-zero buffers (the ops add),
 * head dims above one block of threads (dk, dv > 128), repeated tokens, an expert without
 * tokens, distinct routes per token.
 *
 * Tolerances (stated per check):
 *   - elementwise fp32 formulas (df, d_o, dgam): the CUDA expf/log1pf differ from glibc by up
 *     to 2 ulp and nvcc contracts to FMA: rtol 1e-5, atol 1e-6;
 *   - sums over tokens or rows (ddt_bias, dA_log in double; dw, MoE weight gradients in fp32
 *     with another order): 1e-5 max|ref| (double) and 1e-4 max|ref| (fp32 sums of <= 64 terms);
 *   - the embedding backward adds the same floats in the same order: exact;
 *   - the chunk sums of squares: double sums in another order: rtol 1e-12;
 *   - the routed experts with bf16 weight copies under the bf16 math mode against the same
 *     device ops without them: bit for bit (the same bf16 operands, the same tiles).
 */
#include "kernels/cuda/ops.h"
#include "kernels/kernels.h"
#include "policy/kda.h"
#include "policy/model_device.h"
#include "tests/cuda/cuda_test.h"

/* ---------------------------------------------------------------- KDA gate backwards */
static void gate_case(int64_t T, int64_t H, int64_t dk, int softplus) {
    CT_CASE_BEGIN;
    const int64_t P = H * dk;
    const float g_min = -5.0f;
    float *f = ct_rand(T * P, -2, 2), *A_log = ct_rand(H, -1, 1), *dt = ct_rand(P, -0.5f, 0.5f);
    float *dg = ct_rand(T * P, -1, 1);
    float *df = ct_rand(T * P, -0.1f, 0.1f), *dA = ct_rand(H, -0.1f, 0.1f),
          *ddt = ct_rand(P, -0.1f, 0.1f);
    float *d_f = ct_dev(f, T * P), *d_A = ct_dev(A_log, H), *d_dt = ct_dev(dt, P),
          *d_dg = ct_dev(dg, T * P), *d_df = ct_dev(df, T * P), *d_dA = ct_dev(dA, H),
          *d_ddt = ct_dev(ddt, P);
    if (softplus) {
        arl_cuda_kda_gate_softplus_bwd(d_df, d_dA, d_ddt, d_dg, d_f, d_A, d_dt, T, H, dk);
        arl_kda_gate_softplus_bwd(df, dA, ddt, dg, f, A_log, dt, T, H, dk);
    } else {
        arl_cuda_kda_gate_k3_bwd(d_df, d_dA, d_ddt, d_dg, d_f, d_A, d_dt, T, H, dk, g_min);
        arl_kda_gate_k3_bwd(df, dA, ddt, dg, f, A_log, dt, T, H, dk, g_min);
    }
    const char *nm = softplus ? "softplus" : "k3";
    char w[64];
    snprintf(w, sizeof w, "gate %s df (dk %lld)", nm, (long long)dk);
    ct_check(w, d_df, df, T * P, 1e-6, 1e-5);
    snprintf(w, sizeof w, "gate %s ddt_bias (dk %lld)", nm, (long long)dk);
    ct_check_maxref(w, d_ddt, ddt, P, 0.0, 1e-5);
    snprintf(w, sizeof w, "gate %s dA_log (dk %lld)", nm, (long long)dk);
    ct_check_maxref(w, d_dA, dA, H, 0.0, 1e-5);
    free(f), free(A_log), free(dt), free(dg), free(df), free(dA), free(ddt);
    CT_CASE_END;
}

static void test_gate_bwd(void) {
    gate_case(37, 3, 20, 0);
    gate_case(37, 3, 20, 1);
    gate_case(9, 2, 160, 0); /* dk above one block of 128 threads */
    gate_case(9, 2, 160, 1);
    /* 700 tokens: the device splits them into 5 spans (a second pass adds the spans' sums) */
    gate_case(700, 3, 40, 0);
    gate_case(700, 3, 40, 1);
}

/* ---------------------------------------------------------------- gated output norm bwd */
static void onorm_case(int64_t n, int64_t dv) {
    CT_CASE_BEGIN;
    float *o = ct_rand(n * dv, -2, 2), *gam = ct_rand(n * dv, -3, 3), *w = ct_rand(dv, 0.5f, 1.5f);
    float *dob = ct_rand(n * dv, -1, 1);
    float *ob = ct_host(sizeof(float) * (size_t)(n * dv)),
          *rstd = ct_host(sizeof(float) * (size_t)n);
    arl_kda_onorm_fwd(ob, rstd, o, gam, w, n, dv, 1e-5f);
    { /* the forward on the device first */
        float *D_ob = ct_dev(NULL, n * dv), *D_r = ct_dev(NULL, n), *D_x = ct_dev(o, n * dv);
        float *D_g = ct_dev(gam, n * dv), *D_wt = ct_dev(w, dv);
        arl_cuda_kda_onorm_fwd(D_ob, D_r, D_x, D_g, D_wt, n, dv, 1e-5f);
        char s[64];
        snprintf(s, sizeof s, "onorm fwd (dv %lld)", (long long)dv);
        ct_check(s, D_ob, ob, n * dv, 1e-6, 1e-5);
        snprintf(s, sizeof s, "onorm fwd rstd (dv %lld)", (long long)dv);
        ct_check(s, D_r, rstd, n, 0.0, 1e-6);
    }
    float *d_o = ct_rand(n * dv, -0.1f, 0.1f), *dgam = ct_rand(n * dv, -0.1f, 0.1f),
          *dw = ct_rand(dv, -0.1f, 0.1f);
    float *D_o = ct_dev(o, n * dv), *D_gam = ct_dev(gam, n * dv), *D_w = ct_dev(w, dv),
          *D_dob = ct_dev(dob, n * dv), *D_rstd = ct_dev(rstd, n), *D_d_o = ct_dev(d_o, n * dv),
          *D_dgam = ct_dev(dgam, n * dv), *D_dw = ct_dev(dw, dv);
    arl_cuda_kda_onorm_bwd(D_d_o, D_dgam, D_dw, D_dob, D_o, D_gam, D_w, D_rstd, n, dv);
    arl_kda_onorm_bwd(d_o, dgam, dw, dob, o, gam, w, rstd, n, dv);
    char s[64];
    snprintf(s, sizeof s, "onorm d_o (dv %lld)", (long long)dv);
    ct_check(s, D_d_o, d_o, n * dv, 1e-6, 1e-5);
    snprintf(s, sizeof s, "onorm dgam (dv %lld)", (long long)dv);
    ct_check(s, D_dgam, dgam, n * dv, 1e-6, 1e-5);
    snprintf(s, sizeof s, "onorm dw (dv %lld)", (long long)dv);
    ct_check_maxref(s, D_dw, dw, dv, 0.0, 1e-4);
    free(o), free(gam), free(w), free(dob), free(ob), free(rstd), free(d_o), free(dgam), free(dw);
    CT_CASE_END;
}

static void test_onorm_bwd(void) {
    onorm_case(50, 64);
    onorm_case(12, 200); /* dv above one warp's 32 columns: several a lane */
}

/* ---------------------------------------------------------------- embedding backward */
/* T tokens below V, a share `hot` (per mille) of them token V / 2 (one long run of the sort);
 * bad >= 0: position bad holds id bad_id (outside [0, V)), which the kernel must skip and
 * report, adding the rest as the CPU does. */
static void embed_case(int64_t T, int64_t d, int64_t V, int hot, int64_t bad, int32_t bad_id) {
    CT_CASE_BEGIN;
    int32_t *tok = (int32_t *)ct_host(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) /* many repeats */
        tok[t] = arl_rng_below(&ct_rng, 1000) < (uint64_t)hot
                     ? (int32_t)(V / 2)
                     : (int32_t)arl_rng_below(&ct_rng, (uint64_t)V);
    float *dx = ct_rand(T * d, -1, 1), *tab = ct_rand(V * d, -1, 1);
    float *D_dx = ct_dev(dx, T * d), *D_tab = ct_dev(tab, V * d);
    int32_t *D_ws = ct_dev_i32(NULL, arl_cuda_embed_bwd_ws_ints(T, V));
    if (bad >= 0) {
        /* the CPU adds everything but the bad row */
        int32_t *good = (int32_t *)ct_host(sizeof(int32_t) * (size_t)(T - 1));
        float *gdx = (float *)ct_host(sizeof(float) * (size_t)((T - 1) * d));
        for (int64_t t = 0, u = 0; t < T; t++)
            if (t != bad) {
                good[u] = tok[t];
                memcpy(gdx + u * d, dx + t * d, sizeof(float) * (size_t)d);
                u++;
            }
        arl_dev_ops_cpu()->embed_bwd(tab, gdx, good, T - 1, d, V, NULL);
        free(good), free(gdx);
        tok[bad] = bad_id;
    } else {
        arl_dev_ops_cpu()->embed_bwd(tab, dx, tok, T, d, V, NULL);
    }
    int32_t *D_tok = ct_dev_i32(tok, T);
    arl_cuda_embed_bwd(D_tab, D_dx, D_tok, T, d, V, D_ws);
    char what[96];
    snprintf(what, sizeof what, "embed_bwd T %lld V %lld (same adds, same order: exact)",
             (long long)T, (long long)V);
    if (bad >= 0) {
        char pos[32];
        snprintf(pos, sizeof pos, "position %lld", (long long)bad);
        arl_status st = arl_cuda_sync(ct_ctx);
        CHECK_MSG(st == ARL_ERR_RANGE && strstr(arl_error_msg(), pos),
                  "embed_bwd id %d at %lld: status %d, message '%s'", (int)bad_id, (long long)bad,
                  (int)st, arl_error_msg());
    }
    ct_check(what, D_tab, tab, V * d, 0.0, 0.0);
    free(tok), free(dx), free(tab);
    CT_CASE_END;
}

static void test_embed_bwd(void) {
    embed_case(40, 33, 10, 0, -1, 0);
    /* runs across the blocks' spans of 64 sorted entries, two column blocks */
    embed_case(5000, 130, 300, 0, -1, 0);
    embed_case(3000, 20, 512, 0, -1, 0); /* the largest vocabulary of one 9-bit pass */
    embed_case(3000, 20, 513, 0, -1, 0); /* two passes, the top one of 2 keys */
    embed_case(20000, 40, 5000, 0, -1, 0);
    /* three passes; more entries than a segment of the sort (256) */
    embed_case(2500, 9, ((int64_t)1 << 18) + 5, 0, -1, 0);
    /* one token 70% of the rows: a run of about 14000 sorted entries from one block */
    embed_case(20000, 40, 600, 700, -1, 0);
    /* bad ids: one the sort's top digit takes (600 < 1024) and the runs skip; one it leaves out
     * (one pass); and a negative one (two passes) */
    embed_case(3000, 20, 600, 0, 1234, 600);
    embed_case(3000, 20, 300, 0, 17, 300);
    embed_case(3000, 20, 600, 100, 2999, -1);
}

/* ---------------------------------------------------------------- AdamW chunk sums */
static void test_grad_sumsq(void) {
    CT_CASE_BEGIN;
    const int64_t n = 20000;
    int64_t ranges[8] = {0, 1000, 1000, 1003, 1100, 17484, 17484, 20000};
    float *g = ct_rand(n, -3, 3);
    float *D_g = ct_dev(g, n);
    int64_t *D_r = (int64_t *)ct_dev_bytes(ranges, sizeof ranges);
    double *D_out = (double *)ct_dev_bytes(NULL, 4 * sizeof(double));
    arl_cuda_grad_sumsq(D_out, D_g, D_r, 4);
    double ref[4], got[4];
    arl_dev_ops_cpu()->grad_sumsq(ref, g, ranges, 4);
    if (arl_cuda_sync(ct_ctx) != ARL_OK) ct_die("sync");
    if (arl_cuda_download(ct_ctx, got, D_out, sizeof got) != ARL_OK) ct_die("download");
    for (int i = 0; i < 4; i++)
        CHECK_MSG(fabs(got[i] - ref[i]) <= 1e-12 * ref[i], "grad_sumsq chunk %d: %.17g vs %.17g", i,
                  got[i], ref[i]);
    free(g);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- routed experts, router */
static void test_moe_train(void) {
    CT_CASE_BEGIN;
    const arl_dev_ops *cu = arl_dev_ops_cuda(), *cp = arl_dev_ops_cpu();
    const int64_t T = 13, k = 2, E = 5, dz = 16, f = 8, d = 24, Tk = T * k;
    arl_moe_cfg c = {.d = d,
                     .E = E,
                     .k = k,
                     .f = f,
                     .dz = dz,
                     .fs = 0,
                     .rho = 1.0f,
                     .eps = 1e-5f,
                     .act = {.situ = 1, .beta1 = 4.0f, .beta2 = 25.0f}};
    int32_t sel[26];
    for (int64_t t = 0; t < T; t++) { /* experts 0..3 only: expert 4 gets no token */
        sel[t * k] = (int32_t)(t % 4);
        sel[t * k + 1] = (int32_t)((t + 1 + t / 4) % 4);
        if (sel[t * k + 1] == sel[t * k]) sel[t * k + 1] = (sel[t * k] + 1) % 4;
    }
    float *z = ct_rand(T * dz, -1, 1), *pw = ct_rand(Tk, 0.1f, 0.9f), *du = ct_rand(T * dz, -1, 1);
    float *w1 = ct_rand(E * f * dz, -0.3f, 0.3f), *w3 = ct_rand(E * f * dz, -0.3f, 0.3f),
          *w2 = ct_rand(E * dz * f, -0.3f, 0.3f);
    float *g1 = ct_rand(E * f * dz, -0.1f, 0.1f), *g3 = ct_rand(E * f * dz, -0.1f, 0.1f),
          *g2 = ct_rand(E * dz * f, -0.1f, 0.1f);
    arl_moe_params p = {.w1 = w1, .w3 = w3, .w2 = w2}, gp = {.w1 = g1, .w3 = g3, .w2 = g2};
    arl_moe_params Dp = {
        .w1 = ct_dev(w1, E * f * dz), .w3 = ct_dev(w3, E * f * dz), .w2 = ct_dev(w2, E * dz * f)};
    arl_moe_params Dg = {
        .w1 = ct_dev(g1, E * f * dz), .w3 = ct_dev(g3, E * f * dz), .w2 = ct_dev(g2, E * dz * f)};
    float *D_z = ct_dev(z, T * dz), *D_pw = ct_dev(pw, Tk), *D_du = ct_dev(du, T * dz);
    int32_t *D_sel = ct_dev_i32(sel, Tk);
    int64_t ns_cpu = cp->moe_experts_save_floats(T, k, E, dz, f);
    int64_t ns_cu = cu->moe_experts_save_floats(T, k, E, dz, f);
    int64_t nw_cpu = cp->moe_experts_bwd_ws_floats(T, k, E, dz, f);
    int64_t nw_cu = cu->moe_experts_bwd_ws_floats(T, k, E, dz, f);
    float *save = ct_host(sizeof(float) * (size_t)ns_cpu),
          *ws = ct_host(sizeof(float) * (size_t)nw_cpu);
    float *D_save = ct_dev(NULL, ns_cu), *D_ws = ct_dev(NULL, nw_cu);
    float *u = ct_host(sizeof(float) * (size_t)(T * dz)), *D_u = ct_dev(NULL, T * dz);
    cp->moe_experts_fwd_save(u, z, sel, pw, &p, &c, T, NULL, save);
    cu->moe_experts_fwd_save(D_u, D_z, D_sel, D_pw, &Dp, &c, T, NULL, D_save);
    ct_check_maxref("moe fwd_save u", D_u, u, T * dz, 0.0, 1e-5);
    float *dzo = ct_host(sizeof(float) * (size_t)(T * dz)),
          *dp = ct_host(sizeof(float) * (size_t)Tk);
    float *D_dzo = ct_dev(NULL, T * dz), *D_dp = ct_dev(NULL, Tk);
    cp->moe_experts_bwd(dzo, dp, &gp, du, sel, pw, &p, NULL, &c, T, save, ws);
    cu->moe_experts_bwd(D_dzo, D_dp, &Dg, D_du, D_sel, D_pw, &Dp, NULL, &c, T, D_save, D_ws);
    ct_check_maxref("moe bwd dz", D_dzo, dzo, T * dz, 0.0, 1e-4);
    ct_check_maxref("moe bwd dp", D_dp, dp, Tk, 0.0, 1e-4);
    ct_check_maxref("moe bwd dw1", Dg.w1, g1, E * f * dz, 0.0, 1e-4);
    ct_check_maxref("moe bwd dw3", Dg.w3, g3, E * f * dz, 0.0, 1e-4);
    ct_check_maxref("moe bwd dw2", Dg.w2, g2, E * dz * f, 0.0, 1e-4);

    /* router backward: dx, dW_r += through the selected scores */
    float *x = ct_rand(T * d, -1, 1), *Wr = ct_rand(E * d, -0.3f, 0.3f),
          *s = ct_rand(T * E, 0.05f, 0.95f);
    float *dx = ct_rand(T * d, -0.1f, 0.1f), *dWr = ct_rand(E * d, -0.1f, 0.1f);
    float *rws = ct_host(sizeof(float) * (size_t)cp->router_ws_floats(T, E));
    float *D_x = ct_dev(x, T * d), *D_Wr = ct_dev(Wr, E * d), *D_s = ct_dev(s, T * E),
          *D_dx = ct_dev(dx, T * d), *D_dWr = ct_dev(dWr, E * d),
          *D_rws = ct_dev(NULL, cu->router_ws_floats(T, E));
    cp->router_bwd(dx, dWr, dp, x, Wr, s, sel, T, d, E, k, 1.0f, rws);
    cu->router_bwd(D_dx, D_dWr, ct_dev(dp, Tk), D_x, D_Wr, D_s, D_sel, T, d, E, k, 1.0f, D_rws);
    ct_check_maxref("router bwd dx", D_dx, dx, T * d, 0.0, 1e-5);
    ct_check_maxref("router bwd dW_r", D_dWr, dWr, E * d, 0.0, 1e-5);
    free(z), free(pw), free(du), free(w1), free(w3), free(w2), free(g1), free(g3), free(g2);
    free(save), free(ws), free(u), free(dzo), free(dp), free(x), free(Wr), free(s), free(dx);
    free(dWr), free(rws);
    CT_CASE_END;
}

/* The training experts with bf16 weight copies (banks) under the bf16 math mode: the GEMMs'
 * operands kept in bf16 (policy/model_device_cuda.c cu_moe_b16) give the same outputs and
 * weight gradients, bit for bit, as the fp32 tensors rounded inside the GEMMs (banks NULL).
 * f > dz (the bf16 save is the larger layout), an expert without tokens, one with more than a
 * row tile; SwiGLU and SiTU.  The inference forward runs on the copies whatever the math mode
 * (the training forward's bits).  Widths the bf16 tiles cannot take (f = 8) leave the copies
 * unused, in training and in the inference forward (which aborted on them). */
static void test_moe_train_banks(void) {
    CT_CASE_BEGIN;
    const arl_dev_ops *cu = arl_dev_ops_cuda();
    const int64_t T = 70, k = 2, E = 5, Tk = T * k;
    int32_t sel[140];
    for (int64_t t = 0; t < T; t++) { /* expert 0 on every token (> 64 rows), 4 never */
        sel[t * k] = 0;
        sel[t * k + 1] = (int32_t)(1 + t % 3);
    }
    int32_t *D_sel = ct_dev_i32(sel, Tk);
    float *D_pw = ct_dev(NULL, Tk), *pw = ct_rand(Tk, 0.1f, 0.9f);
    if (arl_cuda_upload(ct_ctx, D_pw, pw, sizeof(float) * (size_t)Tk)) ct_die("upload");
    const int64_t shapes[2][2] = {{32, 48}, {16, 8}}; /* dz, f */
    for (int sh = 0; sh < 2; sh++) {
        const int64_t dz = shapes[sh][0], f = shapes[sh][1], nb = E * f * dz; /* a bank */
        float *z = ct_rand(T * dz, -1, 1), *du = ct_rand(T * dz, -1, 1);
        float *w = ct_rand(3 * nb, -0.3f, 0.3f), *g0 = ct_rand(3 * nb, -0.1f, 0.1f);
        float *D_z = ct_dev(z, T * dz), *D_du = ct_dev(du, T * dz), *D_w = ct_dev(w, 3 * nb);
        uint16_t *D_wb = ct_dev_bytes(NULL, sizeof(uint16_t) * (size_t)(3 * nb));
        arl_cuda_f32_to_bf16(D_wb, D_w, 3 * nb);
        const uint16_t *banks[3] = {D_wb, D_wb + nb, D_wb + 2 * nb};
        arl_moe_params Dp = {.w1 = D_w, .w3 = D_w + nb, .w2 = D_w + 2 * nb};
        float *D_save = ct_dev(NULL, cu->moe_experts_save_floats(T, k, E, dz, f));
        float *D_ws = ct_dev(NULL, cu->moe_experts_bwd_ws_floats(T, k, E, dz, f));
        const int64_t no = 3 * T * dz + Tk; /* u (training) | u (inference) | dz | dp */
        for (int situ = 0; situ < 2; situ++) {
            arl_moe_cfg c = {.d = dz,
                             .E = E,
                             .k = k,
                             .f = f,
                             .dz = dz,
                             .rho = 1.0f,
                             .eps = 1e-5f,
                             .act = {.situ = situ, .beta1 = 4.0f, .beta2 = 25.0f}};
            float *D_out[2], *D_g[2]; /* without, with the copies */
            for (int b = 0; b < 2; b++) {
                float *o = D_out[b] = ct_dev(NULL, no);
                D_g[b] = ct_dev(g0, 3 * nb);
                arl_moe_params Dg = {.w1 = D_g[b], .w3 = D_g[b] + nb, .w2 = D_g[b] + 2 * nb};
                const uint16_t *const *bk = b ? banks : NULL;
                arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
                cu->moe_experts_fwd_save(o, D_z, D_sel, D_pw, &Dp, &c, T, bk, D_save);
                cu->moe_experts_bwd(o + 2 * T * dz, o + 3 * T * dz, &Dg, D_du, D_sel, D_pw, &Dp, bk,
                                    &c, T, D_save, D_ws);
                arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
                /* the inference forward under fp32 math: on the copies where the tiles take
                 * the widths (then the training forward's bits: the same bf16 path), else the
                 * fp32 experts as without copies */
                cu->moe_experts_fwd(o + T * dz, D_z, D_sel, D_pw, &Dp, &c, T, bk, D_save);
            }
            float *o0 = ct_get(D_out[0], no), *o1 = ct_get(D_out[1], no);
            if (!sh) { /* set the inference outputs aside: with copies the bf16 path's */
                CHECK_MSG(!memcmp(o1 + T * dz, o1, sizeof(float) * (size_t)(T * dz)),
                          "situ %d: the inference forward on the copies is not the training "
                          "forward's",
                          situ);
                CHECK(memcmp(o0 + T * dz, o1 + T * dz, sizeof(float) * (size_t)(T * dz)) != 0);
                memcpy(o0 + T * dz, o1 + T * dz, sizeof(float) * (size_t)(T * dz));
            }
            float *g_0 = ct_get(D_g[0], 3 * nb), *g_1 = ct_get(D_g[1], 3 * nb);
            CHECK_MSG(!memcmp(o0, o1, sizeof(float) * (size_t)no),
                      "dz %lld f %lld situ %d: u, dz, dp differ with bf16 copies", (long long)dz,
                      (long long)f, situ);
            CHECK_MSG(!memcmp(g_0, g_1, sizeof(float) * (size_t)(3 * nb)),
                      "dz %lld f %lld situ %d: dW1, dW3, dW2 differ with bf16 copies",
                      (long long)dz, (long long)f, situ);
            int64_t moved = 0; /* the backward did add gradients (every expert with tokens) */
            for (int64_t i = 0; i < 3 * nb; i++)
                moved += g_1[i] != g0[i];
            CHECK_MSG(moved >= 3 * nb * 3 / 5, "situ %d: %lld of %lld gradients changed", situ,
                      (long long)moved, (long long)(3 * nb));
            free(o0), free(o1), free(g_0), free(g_1);
        }
        free(z), free(du), free(w), free(g0);
    }
    free(pw);
    CT_CASE_END;
}

int main(void) {
    ct_init((size_t)64 << 20);
    TEST_RUN(test_gate_bwd);
    TEST_RUN(test_onorm_bwd);
    TEST_RUN(test_embed_bwd);
    TEST_RUN(test_grad_sumsq);
    TEST_RUN(test_moe_train);
    TEST_RUN(test_moe_train_banks);
    arl_cuda_close(ct_ctx);
    return test_finish();
}
