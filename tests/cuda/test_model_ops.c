/* tests/cuda/test_model_ops.c: the model-level CUDA ops (kernels/cuda/ops.h) against their CPU
 * references in policy/ on the same random inputs, forward and backward: short conv, KDA
 * (recurrent and chunkwise forward, recurrent-rule and chunkwise backward), MLA (expanded
 * forward/backward, absorbed decode), AttnRes, router, the QB histogram, MoE plan/gather/
 * grouped GEMM/combine, AdamW, and a decode step captured as a CUDA graph.  Exits 77 without
 * a GPU.
 *
 * Inputs are the ones callers produce: L2-normalised KDA keys and queries, K3-gate decays in
 * (-5, 0), beta in (0, 1), non-zero initial states, packed documents that cross chunk
 * boundaries (and a document shorter than the conv window), an expert with no tokens,
 * forced routes, ties in the router.
 *
 * Tolerances (stated per check):
 *   - fp32 ops with the CPU's formula and a different summation order: rtol 1e-5 .. 2e-5
 *     (a few ulp after the 2-ulp CUDA expf/tanhf and FMA contraction);
 *   - recurrences (KDA): the state is carried through up to 80 steps and the chunk form
 *     inverts (I + A_kk); both sides are fp32 with different orders, so errors grow like
 *     steps * ulp * |S|: max|diff| <= 1e-4 max|ref| + 1e-5;
 *   - attention (MLA): online vs two-pass softmax in fp32: 2e-5 max|ref| + 1e-6;
 *   - bf16 grouped GEMM: inputs rounded to bf16 (2^-9 relative each): per element
 *     2^-7 sum|x||w| + 1e-6 (2x margin over the 2^-8 bound);
 *   - selections and the MoE plan: exact.
 */
#include "core/dtype.h"
#include "kernels/cuda/ops.h"
#include "kernels/kernels.h"
#include "policy/attnres.h"
#include "policy/kda.h"
#include "policy/mla.h"
#include "policy/optimizer_internal.h"
#include "policy/qb.h"
#include "policy/router.h"
#include "tests/cuda/cuda_test.h"

static void l2rows(float *x, int64_t n, int64_t d) {
    arl_k_l2norm_fwd(x, NULL, x, n, d, 1e-6f);
}

/* ---------------------------------------------------------------- short conv */
/* One conv shape forward and backward against policy/kda.c (tails NULL: zeros before each
 * document; with_dw 0: the backward without a weight gradient). */
static void conv_case(int32_t N, const int32_t *cu, int64_t T, int64_t C, int64_t W, int with_tails,
                      int with_dw) {
    float *x = ct_rand(T * C, -2, 2), *w = ct_rand(C * W, -0.5f, 0.5f);
    float *tails = ct_rand(N * C * (W - 1) + 1, -1, 1), *dz = ct_rand(T * C, -1, 1);
    float *z = ct_host(sizeof(float) * T * C), *y = ct_host(sizeof(float) * T * C);
    float *dx = ct_rand(T * C, -1, 1), *dw = ct_rand(C * W, -1, 1);
    float *d_x = ct_dev(x, T * C), *d_w = ct_dev(w, C * W);
    float *d_t = ct_dev(tails, N * C * (W - 1) + 1);
    float *d_dz = ct_dev(dz, T * C), *d_z = ct_dev(NULL, T * C), *d_y = ct_dev(NULL, T * C);
    float *d_dx = ct_dev(dx, T * C), *d_dw = ct_dev(dw, C * W);
    int32_t *d_cu = ct_dev_i32(cu, N + 1);
    const float *tl = with_tails ? tails : NULL, *d_tl = with_tails ? d_t : NULL;
    arl_cuda_conv_fwd(d_z, d_y, d_x, d_w, d_tl, d_cu, N, T, C, W);
    arl_cuda_conv_bwd(d_dx, with_dw ? d_dw : NULL, d_dz, d_x, d_w, d_tl, d_cu, N, T, C, W);
    arl_kda_conv_fwd(z, y, x, w, tl, cu, N, T, C, W);
    arl_kda_conv_bwd(dx, with_dw ? dw : NULL, dz, x, w, tl, cu, N, T, C, W);
    /* same tap order on both sides; SiLU and its derivative: rtol 2e-5 */
    ct_check("conv_fwd y", d_y, y, T * C, 1e-6, 1e-5);
    ct_check("conv_fwd z", d_z, z, T * C, 1e-6, 2e-5);
    ct_check("conv_bwd dx (+=)", d_dx, dx, T * C, 2e-6, 2e-5);
    /* dw sums the tokens in a different order (double on the device): 1e-5 of max|ref| */
    ct_check_maxref("conv_bwd dw (+=)", d_dw, dw, C * W, 1e-6, 1e-5);
    free(x), free(w), free(tails), free(dz), free(z), free(y), free(dx), free(dw);
}

static void test_conv(void) {
    CT_CASE_BEGIN;
    const int32_t cu3[4] = {0, 2, 30, 50}; /* document 0 shorter than W - 1 */
    conv_case(3, cu3, 50, 24, 4, 1, 1);
    /* several spans and tiles of the device backward: a one-token document, boundaries on a
     * tile edge (64) and one token past it, a partial block of channels (40 = 32 + 8) */
    const int32_t cu6[7] = {0, 1, 64, 65, 200, 431, 700};
    conv_case(6, cu6, 700, 40, 4, 1, 1);
    conv_case(6, cu6, 700, 33, 7, 0, 1);
    conv_case(6, cu6, 700, 40, 1, 1, 0);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- KDA */
typedef struct kda_in {
    int32_t N;
    int64_t T, H, dk, dv, C;
    int32_t cu[4];
    float *q, *k, *v, *g, *beta, *S0;
} kda_in;

/* gmax: the gate g = -gmax sigmoid(u) (5 for K3; 10 makes some 16-row sub-chunks' factors
 * exceed e^80, so the factored pair products fall back to the difference form there) */
static kda_in kda_make(int64_t dk, int64_t dv, int64_t C, float gmax) {
    kda_in a = {.N = 3, .T = 150, .H = 3, .dk = dk, .dv = dv, .C = C, .cu = {0, 70, 71, 150}};
    int64_t T = a.T, H = a.H;
    a.q = ct_rand(T * H * dk, -1, 1);
    a.k = ct_rand(T * H * dk, -1, 1);
    l2rows(a.q, T * H, dk);
    l2rows(a.k, T * H, dk);
    a.v = ct_rand(T * H * dv, -1, 1);
    a.g = ct_rand(T * H * dk, -6, 6); /* K3 gate: g = -5 sigmoid(u) in (-5, 0) */
    for (int64_t i = 0; i < T * H * dk; i++)
        a.g[i] = -gmax / (1.0f + expf(-a.g[i]));
    a.beta = ct_rand(T * H, 0.02f, 0.98f);
    a.S0 = ct_rand(a.N * H * dk * dv, -0.5f, 0.5f);
    return a;
}

static void kda_free(kda_in *a) {
    free(a->q), free(a->k), free(a->v), free(a->g), free(a->beta), free(a->S0);
}

static void kda_case(int64_t dk, int64_t dv, int64_t C, float gmax) {
    CT_CASE_BEGIN;
    kda_in a = kda_make(dk, dv, C, gmax);
    const int64_t T = a.T, H = a.H, N = a.N, nS = N * H * dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    int64_t nc = arl_kda_num_chunks(a.cu, a.N, T, C);
    float *o = ct_host(sizeof(float) * T * H * dv), *S = ct_copy_host(a.S0, nS);
    float *cs = ct_host(sizeof(float) * nc * H * dk * dv);
    float *ws = ct_host(sizeof(float) * arl_kda_chunk_ws_floats(H, dk, dv, C));
    arl_kda_chunk_fwd(o, S, cs, a.q, a.k, a.v, a.g, a.beta, a.cu, a.N, T, H, dk, dv, scale, C, ws);
    float *d_q = ct_dev(a.q, T * H * dk), *d_k = ct_dev(a.k, T * H * dk),
          *d_g = ct_dev(a.g, T * H * dk);
    float *d_v = ct_dev(a.v, T * H * dv), *d_b = ct_dev(a.beta, T * H);
    int32_t *d_cu = ct_dev_i32(a.cu, N + 1);
    float *d_o = ct_dev(NULL, T * H * dv), *d_S = ct_dev(a.S0, nS);
    float *d_cs = ct_dev(NULL, nc * H * dk * dv);
    char what[96];

    /* recurrent form on the device vs the CPU chunk form (equal to rounding, spec 3.5) */
    arl_cuda_kda_recurrent_fwd(d_o, d_S, d_cs, d_q, d_k, d_v, d_g, d_b, d_cu, a.N, T, H, dk, dv,
                               scale, C);
    snprintf(what, sizeof what, "kda_recurrent_fwd o dk=%lld dv=%lld", (long long)dk,
             (long long)dv);
    ct_check_maxref(what, d_o, o, T * H * dv, 1e-5, 1e-4);
    ct_check_maxref("kda_recurrent_fwd final S", d_S, S, nS, 1e-5, 1e-4);
    ct_check_maxref("kda_recurrent_fwd chunk_states", d_cs, cs, nc * H * dk * dv, 1e-5, 1e-4);

    /* chunk form on the device, the pair products in either form (ops.h); the backward below
     * runs the default (factored) one */
    float *d_ws = ct_dev(NULL, arl_cuda_kda_chunk_ws_floats(T, a.N, H, dk, dv, C));
    for (int form = 0; form < 2; form++) {
        const int32_t f = form ? ARL_CUDA_KDA_PREP_DIFFERENCE : ARL_CUDA_KDA_PREP_FACTORED;
        const int32_t was = arl_cuda_kda_prep_form(f);
        arl_cuda_upload(ct_ctx, d_S, a.S0, sizeof(float) * nS);
        arl_cuda_kda_chunk_fwd(d_o, d_S, d_cs, d_q, d_k, d_v, d_g, d_b, d_cu, a.N, T, H, dk, dv,
                               scale, C, d_ws);
        arl_cuda_kda_prep_form(was);
        snprintf(what, sizeof what, "kda_chunk_fwd (%s) o dk=%lld dv=%lld C=%lld gmax=%g",
                 form ? "difference" : "factored", (long long)dk, (long long)dv, (long long)C,
                 (double)gmax);
        ct_check_maxref(what, d_o, o, T * H * dv, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_fwd final S", d_S, S, nS, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_fwd chunk_states", d_cs, cs, nc * H * dk * dv, 1e-5, 1e-4);
    }

    /* backward (recurrent rule, 3.7) from the CPU's chunk states, non-zero dS_T */
    if (dk <= 128 && dv <= 128) {
        float *d_o_up = ct_rand(T * H * dv, -1, 1), *dST = ct_rand(nS, -0.5f, 0.5f);
        float *gq = ct_rand(T * H * dk, -1, 1), *gk = ct_rand(T * H * dk, -1, 1);
        float *gg = ct_rand(T * H * dk, -1, 1), *gv = ct_rand(T * H * dv, -1, 1);
        float *gb = ct_rand(T * H, -1, 1), *gS = ct_rand(nS, -1, 1);
        float *d_gq = ct_dev(gq, T * H * dk), *d_gk = ct_dev(gk, T * H * dk);
        float *d_gg = ct_dev(gg, T * H * dk), *d_gv = ct_dev(gv, T * H * dv);
        float *d_gb = ct_dev(gb, T * H), *d_gS = ct_dev(gS, nS);
        float *d_do = ct_dev(d_o_up, T * H * dv), *d_dST = ct_dev(dST, nS);
        float *d_csc = ct_dev(cs, nc * H * dk * dv);
        float *d_bws = ct_dev(NULL, arl_cuda_kda_bwd_ws_floats(a.N, H, dk, dv, C));
        float *bws = ct_host(sizeof(float) * arl_kda_bwd_ws_floats(H, dk, dv, C));
        arl_kda_recurrent_bwd(gq, gk, gv, gg, gb, gS, d_o_up, dST, a.q, a.k, a.v, a.g, a.beta, cs,
                              a.cu, a.N, T, H, dk, dv, scale, C, bws);
        arl_cuda_kda_recurrent_bwd(d_gq, d_gk, d_gv, d_gg, d_gb, d_gS, d_do, d_dST, d_q, d_k, d_v,
                                   d_g, d_b, d_csc, d_cu, a.N, T, H, dk, dv, scale, C, d_bws);
        ct_check_maxref("kda_bwd dq (+=)", d_gq, gq, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_bwd dk (+=)", d_gk, gk, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_bwd dv (+=)", d_gv, gv, T * H * dv, 1e-5, 1e-4);
        ct_check_maxref("kda_bwd dg (+=)", d_gg, gg, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_bwd dbeta (+=)", d_gb, gb, T * H, 1e-5, 1e-4);
        ct_check_maxref("kda_bwd dS0 (+=)", d_gS, gS, nS, 1e-5, 1e-4);

        /* chunkwise backward (3.8) on the device vs the CPU's chunkwise backward, from
         * fresh accumulators */
        float *cq = ct_rand(T * H * dk, -1, 1), *ck = ct_rand(T * H * dk, -1, 1);
        float *cg = ct_rand(T * H * dk, -1, 1), *cv = ct_rand(T * H * dv, -1, 1);
        float *cb = ct_rand(T * H, -1, 1), *cS = ct_rand(nS, -1, 1);
        arl_cuda_upload(ct_ctx, d_gq, cq, sizeof(float) * T * H * dk);
        arl_cuda_upload(ct_ctx, d_gk, ck, sizeof(float) * T * H * dk);
        arl_cuda_upload(ct_ctx, d_gg, cg, sizeof(float) * T * H * dk);
        arl_cuda_upload(ct_ctx, d_gv, cv, sizeof(float) * T * H * dv);
        arl_cuda_upload(ct_ctx, d_gb, cb, sizeof(float) * T * H);
        arl_cuda_upload(ct_ctx, d_gS, cS, sizeof(float) * nS);
        float *d_cws = ct_dev(NULL, arl_cuda_kda_chunk_bwd_ws_floats(T, a.N, H, dk, dv, C));
        arl_kda_chunk_bwd(cq, ck, cv, cg, cb, cS, d_o_up, dST, a.q, a.k, a.v, a.g, a.beta, cs, a.cu,
                          a.N, T, H, dk, dv, scale, C, bws);
        arl_cuda_kda_chunk_bwd(d_gq, d_gk, d_gv, d_gg, d_gb, d_gS, d_do, d_dST, d_q, d_k, d_v, d_g,
                               d_b, d_csc, d_cu, a.N, T, H, dk, dv, scale, C, d_cws);
        ct_check_maxref("kda_chunk_bwd dq (+=)", d_gq, cq, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_bwd dk (+=)", d_gk, ck, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_bwd dv (+=)", d_gv, cv, T * H * dv, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_bwd dg (+=)", d_gg, cg, T * H * dk, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_bwd dbeta (+=)", d_gb, cb, T * H, 1e-5, 1e-4);
        ct_check_maxref("kda_chunk_bwd dS0 (+=)", d_gS, cS, nS, 1e-5, 1e-4);
        free(cq), free(ck), free(cg), free(cv), free(cb), free(cS);
        free(d_o_up), free(dST), free(gq), free(gk), free(gg), free(gv), free(gb), free(gS);
        free(bws);
    }
    free(o), free(S), free(cs), free(ws);
    kda_free(&a);
    CT_CASE_END;
}

/* 1300 documents of 0 to 6 tokens (empty ones among them), chunks of 4: the device's chunk
 * table (kda.cu k_chunk_table: a block's rounds of 1024 documents, then of 1024 chunks)
 * behind the chunkwise forward, the recurrent forward's chunk states and the recurrent-rule
 * backward, against the CPU. */
static void test_kda_many_docs(void) {
    CT_CASE_BEGIN;
    const int32_t N = 1300;
    const int64_t H = 2, dk = 8, dv = 8, C = 4;
    int32_t *cu = (int32_t *)ct_host(sizeof(int32_t) * (N + 1));
    cu[0] = 0;
    for (int32_t i = 0; i < N; i++)
        cu[i + 1] = cu[i] + (int32_t)arl_rng_below(&ct_rng, 7);
    const int64_t T = cu[N], nS = (int64_t)N * H * dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    float *q = ct_rand(T * H * dk, -1, 1), *k = ct_rand(T * H * dk, -1, 1);
    l2rows(q, T * H, dk);
    l2rows(k, T * H, dk);
    float *v = ct_rand(T * H * dv, -1, 1), *g = ct_rand(T * H * dk, -5, 0);
    float *beta = ct_rand(T * H, 0.02f, 0.98f), *S0 = ct_rand(nS, -0.5f, 0.5f);
    const int64_t nc = arl_kda_num_chunks(cu, N, T, C);
    float *o = ct_host(sizeof(float) * T * H * dv), *S = ct_copy_host(S0, nS);
    float *cs = ct_host(sizeof(float) * nc * H * dk * dv);
    float *ws = ct_host(sizeof(float) * arl_kda_chunk_ws_floats(H, dk, dv, C));
    arl_kda_chunk_fwd(o, S, cs, q, k, v, g, beta, cu, N, T, H, dk, dv, scale, C, ws);
    float *d_q = ct_dev(q, T * H * dk), *d_k = ct_dev(k, T * H * dk), *d_g = ct_dev(g, T * H * dk);
    float *d_v = ct_dev(v, T * H * dv), *d_b = ct_dev(beta, T * H), *d_S = ct_dev(S0, nS);
    int32_t *d_cu = ct_dev_i32(cu, N + 1);
    float *d_o = ct_dev(NULL, T * H * dv), *d_cs = ct_dev(NULL, nc * H * dk * dv);
    float *d_ws = ct_dev(NULL, arl_cuda_kda_chunk_ws_floats(T, N, H, dk, dv, C));
    arl_cuda_kda_chunk_fwd(d_o, d_S, d_cs, d_q, d_k, d_v, d_g, d_b, d_cu, N, T, H, dk, dv, scale, C,
                           d_ws);
    CHECK_MSG(nc > 1024, "%lld chunks", (long long)nc);
    ct_check_maxref("kda_chunk_fwd, 1300 documents: o", d_o, o, T * H * dv, 1e-5, 1e-4);
    ct_check_maxref("kda_chunk_fwd, 1300 documents: final S", d_S, S, nS, 1e-5, 1e-4);
    ct_check_maxref("kda_chunk_fwd, 1300 documents: chunk states", d_cs, cs, nc * H * dk * dv, 1e-5,
                    1e-4);
    /* the recurrent forward's chunk states: each document's first chunk from the table */
    arl_cuda_upload(ct_ctx, d_S, S0, sizeof(float) * nS);
    arl_cuda_kda_recurrent_fwd(d_o, d_S, d_cs, d_q, d_k, d_v, d_g, d_b, d_cu, N, T, H, dk, dv,
                               scale, C);
    ct_check_maxref("kda_recurrent_fwd, 1300 documents: chunk states", d_cs, cs, nc * H * dk * dv,
                    1e-5, 1e-4);
    /* the recurrent-rule backward from the CPU's chunk states */
    float *dO = ct_rand(T * H * dv, -1, 1), *gq = ct_host(sizeof(float) * T * H * dk);
    float *gk = ct_host(sizeof(float) * T * H * dk), *gg = ct_host(sizeof(float) * T * H * dk);
    float *gv = ct_host(sizeof(float) * T * H * dv), *gb = ct_host(sizeof(float) * T * H);
    float *gS = ct_host(sizeof(float) * nS);
    float *bws = ct_host(sizeof(float) * arl_kda_bwd_ws_floats(H, dk, dv, C));
    float *d_gq = ct_dev(NULL, T * H * dk), *d_gk = ct_dev(NULL, T * H * dk);
    float *d_gg = ct_dev(NULL, T * H * dk), *d_gv = ct_dev(NULL, T * H * dv);
    float *d_gb = ct_dev(NULL, T * H), *d_gS = ct_dev(NULL, nS), *d_dO = ct_dev(dO, T * H * dv);
    float *d_csc = ct_dev(cs, nc * H * dk * dv);
    float *d_bws = ct_dev(NULL, arl_cuda_kda_bwd_ws_floats(N, H, dk, dv, C));
    arl_kda_recurrent_bwd(gq, gk, gv, gg, gb, gS, dO, NULL, q, k, v, g, beta, cs, cu, N, T, H, dk,
                          dv, scale, C, bws);
    arl_cuda_kda_recurrent_bwd(d_gq, d_gk, d_gv, d_gg, d_gb, d_gS, d_dO, NULL, d_q, d_k, d_v, d_g,
                               d_b, d_csc, d_cu, N, T, H, dk, dv, scale, C, d_bws);
    ct_check_maxref("kda_bwd, 1300 documents: dq", d_gq, gq, T * H * dk, 1e-5, 1e-4);
    ct_check_maxref("kda_bwd, 1300 documents: dv", d_gv, gv, T * H * dv, 1e-5, 1e-4);
    ct_check_maxref("kda_bwd, 1300 documents: dS0", d_gS, gS, nS, 1e-5, 1e-4);
    free(cu), free(q), free(k), free(v), free(g), free(beta), free(S0), free(o), free(S), free(cs);
    free(ws), free(dO), free(gq), free(gk), free(gg), free(gv), free(gb), free(gS), free(bws);
    CT_CASE_END;
}

static void test_kda(void) {
    kda_case(32, 32, 16, 5.0f);
    kda_case(64, 48, 32, 5.0f);   /* dv not a multiple of the 32-column slice */
    kda_case(128, 128, 64, 5.0f); /* the benchmark's head dims */
    kda_case(32, 32, 40, 10.0f);  /* steep gates (difference-form sub-chunks), C = 40: the last
                                     sub-chunk of 8 rows; a 1-row chunk of document 2 */
    kda_case(20, 12, 24, 5.0f);   /* widths and chunk not multiples of the tensor-core tiles
                                     (8-wide k steps, 16-row tiles): the zero padding */
}

/* ---------------------------------------------------------------- MLA */
static void test_mla(void) {
    CT_CASE_BEGIN;
    const int32_t N = 2;
    const int64_t T = 70, Hm = 3, n = 16, r = 8, vm = 24;
    int32_t cu[3] = {0, 33, 70};
    const float scale = 1.0f / sqrtf((float)(n + r));
    float *qn = ct_rand(T * Hm * n, -2, 2), *qp = ct_rand(T * Hm * r, -2, 2);
    float *kn = ct_rand(T * Hm * n, -2, 2), *kp = ct_rand(T * r, -2, 2);
    float *v = ct_rand(T * Hm * vm, -1, 1), *dO = ct_rand(T * Hm * vm, -1, 1);
    float *o = ct_host(sizeof(float) * T * Hm * vm), *lse = ct_host(sizeof(float) * T * Hm);
    float *ws = ct_host(sizeof(float) * arl_mla_attn_ws_floats(T, Hm, r));
    arl_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, cu, N, T, Hm, n, r, vm, scale, ws);
    float *d_qn = ct_dev(qn, T * Hm * n), *d_qp = ct_dev(qp, T * Hm * r);
    float *d_kn = ct_dev(kn, T * Hm * n), *d_kp = ct_dev(kp, T * r), *d_v = ct_dev(v, T * Hm * vm);
    float *d_o = ct_dev(NULL, T * Hm * vm), *d_lse = ct_dev(NULL, T * Hm);
    int32_t *d_cu = ct_dev_i32(cu, N + 1);
    arl_cuda_mla_attn_fwd(d_o, d_lse, d_qn, d_qp, d_kn, d_kp, d_v, d_cu, N, T, Hm, n, r, vm, scale,
                          NULL);
    ct_check_maxref("mla_attn_fwd o", d_o, o, T * Hm * vm, 1e-6, 2e-5);
    ct_check("mla_attn_fwd lse", d_lse, lse, T * Hm, 1e-5, 1e-5);

    float *gqn = ct_rand(T * Hm * n, -1, 1), *gqp = ct_rand(T * Hm * r, -1, 1);
    float *gkn = ct_rand(T * Hm * n, -1, 1), *gkp = ct_rand(T * r, -1, 1);
    float *gv = ct_rand(T * Hm * vm, -1, 1);
    float *d_gqn = ct_dev(gqn, T * Hm * n), *d_gqp = ct_dev(gqp, T * Hm * r);
    float *d_gkn = ct_dev(gkn, T * Hm * n), *d_gkp = ct_dev(gkp, T * r);
    float *d_gv = ct_dev(gv, T * Hm * vm), *d_dO = ct_dev(dO, T * Hm * vm);
    float *d_ws = ct_dev(NULL, arl_cuda_mla_attn_bwd_ws_floats(T, Hm, n, r, vm));
    float *d_oc = ct_dev(o, T * Hm * vm), *d_lsec = ct_dev(lse, T * Hm); /* CPU forward's */
    arl_mla_attn_bwd(gqn, gqp, gkn, gkp, gv, dO, o, lse, qn, qp, kn, kp, v, cu, N, T, Hm, n, r, vm,
                     scale, ws);
    arl_cuda_mla_attn_bwd(d_gqn, d_gqp, d_gkn, d_gkp, d_gv, d_dO, d_oc, d_lsec, d_qn, d_qp, d_kn,
                          d_kp, d_v, d_cu, N, T, Hm, n, r, vm, scale, d_ws);
    ct_check_maxref("mla_attn_bwd dq_nope (+=)", d_gqn, gqn, T * Hm * n, 1e-6, 2e-5);
    ct_check_maxref("mla_attn_bwd dq_pe (+=)", d_gqp, gqp, T * Hm * r, 1e-6, 2e-5);
    ct_check_maxref("mla_attn_bwd dk_nope (+=)", d_gkn, gkn, T * Hm * n, 1e-6, 2e-5);
    ct_check_maxref("mla_attn_bwd dk_pe (+=)", d_gkp, gkp, T * r, 1e-6, 2e-5);
    ct_check_maxref("mla_attn_bwd dv (+=)", d_gv, gv, T * Hm * vm, 1e-6, 2e-5);

    /* absorbed decode over a latent cache: 5 queries at positions 20..24 */
    const int64_t rkv = 32, S = 25, pos0 = 20, Tq = 5;
    float *cache = ct_rand(S * (rkv + r), -1, 1), *qh = ct_rand(Tq * Hm * rkv, -1, 1);
    float *qpe = ct_rand(Tq * Hm * r, -1, 1), *oh = ct_host(sizeof(float) * Tq * Hm * rkv);
    float *aws = ct_host(sizeof(float) * arl_mla_absorbed_ws_floats(S, rkv, r, 0));
    arl_mla_absorbed_attn(oh, NULL, 0, qh, qpe, cache, pos0, Tq, Hm, rkv, r, scale, 0, 0, aws);
    float *d_cache = ct_dev(cache, S * (rkv + r)), *d_qh = ct_dev(qh, Tq * Hm * rkv);
    float *d_qpe = ct_dev(qpe, Tq * Hm * r), *d_oh = ct_dev(NULL, Tq * Hm * rkv);
    arl_cuda_mla_absorbed_attn(d_oh, d_qh, d_qpe, d_cache, pos0, Tq, Hm, rkv, r, scale, NULL);
    ct_check_maxref("mla_absorbed_attn", d_oh, oh, Tq * Hm * rkv, 1e-6, 2e-5);
    free(qn), free(qp), free(kn), free(kp), free(v), free(dO), free(o), free(lse), free(ws);
    free(gqn), free(gqp), free(gkn), free(gkp), free(gv);
    free(cache), free(qh), free(qpe), free(oh), free(aws);
    CT_CASE_END;
}

/* A decode step's absorbed attention with its keys split (mla.cu k_attn_merge), 32 keys a
 * split here: against the CPU (the sums' order differs: tolerance as unsplit); the captured
 * form, its splits fixed by a cache of S rows, equal bit for bit (the surplus splits are
 * empty); and several queries, which do not split, as before. */
static void absorbed_split_case(int64_t pos0, int64_t Hm, int64_t S) {
    CT_CASE_BEGIN;
    const int64_t rkv = 48, r = 16, nsplit = (S + 31) / 32;
    const float scale = 0.125f;
    const int32_t was = arl_cuda_mla_split_keys(32);
    float *cache = ct_rand(S * (rkv + r), -2, 2), *qh = ct_rand(3 * Hm * rkv, -1, 1);
    float *qpe = ct_rand(3 * Hm * r, -1, 1), *oh = ct_host(sizeof(float) * 3 * Hm * rkv);
    float *aws = ct_host(sizeof(float) * arl_mla_absorbed_ws_floats(S, rkv, r, 0));
    float *d_cache = ct_dev(cache, S * (rkv + r)), *d_qh = ct_dev(qh, 3 * Hm * rkv);
    float *d_qpe = ct_dev(qpe, 3 * Hm * r), *d_oh = ct_dev(NULL, 3 * Hm * rkv);
    float *d_og = ct_dev(NULL, Hm * rkv);
    const int64_t wsf = arl_cuda_mla_absorbed_ws_floats(S, Hm, rkv);
    CHECK_MSG(wsf == Hm * nsplit * (rkv + 2), "split work space %lld floats", (long long)wsf);
    float *d_ws = ct_dev(NULL, wsf);
    int64_t *d_pos = (int64_t *)ct_dev_bytes(&pos0, sizeof pos0);
    char what[96];
    for (int64_t Tq = 1; Tq <= 3; Tq += 2) {
        const int64_t p0 = pos0 - (Tq - 1);
        arl_mla_absorbed_attn(oh, NULL, 0, qh, qpe, cache, p0, Tq, Hm, rkv, r, scale, 0, 0, aws);
        arl_cuda_mla_absorbed_attn(d_oh, d_qh, d_qpe, d_cache, p0, Tq, Hm, rkv, r, scale, d_ws);
        snprintf(what, sizeof what, "absorbed attention, %lld quer%s to position %lld, Hm %lld",
                 (long long)Tq, Tq == 1 ? "y" : "ies", (long long)pos0, (long long)Hm);
        ct_check_maxref(what, d_oh, oh, Tq * Hm * rkv, 1e-6, 2e-5);
    }
    /* the last call had 3 queries; the single query again, then the captured form */
    arl_cuda_mla_absorbed_attn(d_oh, d_qh, d_qpe, d_cache, pos0, 1, Hm, rkv, r, scale, d_ws);
    arl_cuda_mla_absorbed_attn_dpos(d_og, d_qh, d_qpe, d_cache, d_pos, 1, Hm, rkv, r, scale, S,
                                    d_ws);
    float *a = ct_get(d_oh, Hm * rkv), *g = ct_get(d_og, Hm * rkv);
    CHECK_MSG(!memcmp(a, g, sizeof(float) * (size_t)(Hm * rkv)),
              "position %lld: the captured form (%lld splits) differs from the direct one",
              (long long)pos0, (long long)nsplit);
    arl_cuda_mla_split_keys(was);
    free(a), free(g), free(cache), free(qh), free(qpe), free(oh), free(aws);
    CT_CASE_END;
}

static void test_mla_absorbed_split(void) {
    absorbed_split_case(299, 3, 300); /* 10 splits, the last of 12 keys */
    absorbed_split_case(32, 5, 300);  /* 2 splits, the second of one key */
    absorbed_split_case(20, 2, 300);  /* one split: unsplit (captured: 1 of 10 splits) */
    /* 282 splits: the merge's weights in two tiles of 256 (captured: the same) */
    absorbed_split_case(8999, 2, 9000);
}

/* The expanded forward on tensor cores (ARL_CUDA_MATH_BF16, mla.cu k_attn_fwd_tc) against the
 * CPU fp32 reference: bf16 operands (q, k, v and the probabilities rounded to 8 bits of
 * mantissa, 2^-9 relative each) with fp32 accumulation and softmax, so the GPU bf16 tolerance
 * of spec 16.4: max|ref| form, rtol 2e-2, for o; lse (scores of size ~3 here, bf16 error
 * ~1e-2 absolute) atol 2e-2.  Shapes: the tiny config's widths (qk 32+16 padded to 64, v 64)
 * and the mini config's (qk 64+32, v 128); documents of one token, documents crossing the
 * 64-key tile and the 128-query block, and a last partial block; 3 heads.  one_doc: the 300
 * tokens in one document, so that most key tiles are seen whole by a warp's rows (the
 * forward's unmasked branch); with widths not multiples of 4 (30+18, v 62) the key and value
 * rows are copied 4 bytes at a time instead of 16. */
static void mla_tc_case(int64_t n, int64_t r, int64_t vm, int one_doc) {
    const int32_t N = one_doc ? 1 : 5;
    const int64_t T = 300, Hm = 3;
    int32_t cu[6] = {0, 1, 2, 130, 197, 300};
    if (one_doc) cu[1] = 300;
    const float scale = 1.0f / sqrtf((float)(n + r));
    float *qn = ct_rand(T * Hm * n, -1, 1), *qp = ct_rand(T * Hm * r, -1, 1);
    float *kn = ct_rand(T * Hm * n, -1, 1), *kp = ct_rand(T * r, -1, 1);
    float *v = ct_rand(T * Hm * vm, -1, 1);
    float *o = ct_host(sizeof(float) * T * Hm * vm), *lse = ct_host(sizeof(float) * T * Hm);
    float *ws = ct_host(sizeof(float) * arl_mla_attn_ws_floats(T, Hm, r));
    arl_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, cu, N, T, Hm, n, r, vm, scale, ws);
    float *d_qn = ct_dev(qn, T * Hm * n), *d_qp = ct_dev(qp, T * Hm * r);
    float *d_kn = ct_dev(kn, T * Hm * n), *d_kp = ct_dev(kp, T * r), *d_v = ct_dev(v, T * Hm * vm);
    float *d_o = ct_dev(NULL, T * Hm * vm), *d_lse = ct_dev(NULL, T * Hm);
    int32_t *d_cu = ct_dev_i32(cu, N + 1);
    /* the workspace: the bf16 copies of the keys and values */
    float *d_ws = ct_dev(NULL, arl_cuda_mla_attn_fwd_ws_floats(T, Hm, n, r, vm));
    /* both warp tiles (ops.h arl_cuda_mla_fwd_rows): 4 warps of 32 queries (the default, a
     * softmax step every 32 keys) and 8 of 16 (every 64) */
    const int32_t rows[2] = {ARL_CUDA_MLA_FWD_ROWS32, ARL_CUDA_MLA_FWD_ROWS16};
    for (int v16 = 0; v16 < 2; v16++) {
        const int32_t was = arl_cuda_mla_fwd_rows(rows[v16]);
        arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
        arl_cuda_mla_attn_fwd(d_o, d_lse, d_qn, d_qp, d_kn, d_kp, d_v, d_cu, N, T, Hm, n, r, vm,
                              scale, d_ws);
        arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
        arl_cuda_mla_fwd_rows(was);
        ct_check_maxref(v16 ? "mla_attn_fwd (tensor cores, 16-query warps) o"
                            : "mla_attn_fwd (tensor cores, 32-query warps) o",
                        d_o, o, T * Hm * vm, 0.0, 2e-2);
        ct_check(v16 ? "mla_attn_fwd (tensor cores, 16-query warps) lse"
                     : "mla_attn_fwd (tensor cores, 32-query warps) lse",
                 d_lse, lse, T * Hm, 2e-2, 0.0);
    }
    /* without a workspace the bf16 math mode leaves the call to the fp32 kernel: fp32 bounds */
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
    arl_cuda_mla_attn_fwd(d_o, d_lse, d_qn, d_qp, d_kn, d_kp, d_v, d_cu, N, T, Hm, n, r, vm, scale,
                          NULL);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
    ct_check_maxref("mla_attn_fwd (no workspace: fp32) o", d_o, o, T * Hm * vm, 1e-6, 2e-5);
    free(qn), free(qp), free(kn), free(kp), free(v), free(o), free(lse), free(ws);
}

/* A gradient the kernels add (+=) to init: the device's sum less init against the reference's
 * sum less init, in the max|ref| form; prints the measured |diff| / max|ref|. */
static void tc_check_added(const char *what, const float *d, const float *ref, const float *init,
                           int64_t n, double rtol) {
    float *h = ct_get(d, n), *r = ct_copy_host(ref, n);
    double m = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        h[i] -= init[i], r[i] -= init[i];
        m = fmax(m, fabs((double)r[i]));
        worst = fmax(worst, fabs((double)h[i] - (double)r[i]));
    }
    printf("  %s: max|diff| / max|ref| = %.3g (max|ref| %.3g)\n", what, m > 0 ? worst / m : worst,
           m);
    check_close_maxref_f32(what, h, r, (size_t)n, 0.0, rtol);
    free(h), free(r);
}

/* The expanded backward on tensor cores (mla.cu k_attn_bwd_kv_tc, k_attn_bwd_q_tc) against the
 * CPU fp32 backward on the CPU forward's o and lse, same shapes and documents as the forward
 * case.  bf16 operands: S and dP = dO V^T are recomputed from bf16 q, k, v, dO (the scores'
 * error, ~2^-8 of |s| ~ 3 here, moves P by ~1%), and P and dS = P (dP - D) are rounded to bf16
 * (2^-9 relative) before the products that sum them; accumulation stays fp32.  Tolerance: the
 * forward's, rtol 2e-2 of max|ref| for every gradient (the CPU emulator, which rounds as the
 * GPU does and differs only in summation order, measured 1.9e-3 .. 6.2e-3 in three runs). */
static void mla_tc_bwd_case(int64_t n, int64_t r, int64_t vm) {
    CT_CASE_BEGIN;
    const int32_t N = 5;
    const int64_t T = 300, Hm = 3;
    int32_t cu[6] = {0, 1, 2, 130, 197, 300};
    const float scale = 1.0f / sqrtf((float)(n + r));
    float *qn = ct_rand(T * Hm * n, -1, 1), *qp = ct_rand(T * Hm * r, -1, 1);
    float *kn = ct_rand(T * Hm * n, -1, 1), *kp = ct_rand(T * r, -1, 1);
    float *v = ct_rand(T * Hm * vm, -1, 1), *dO = ct_rand(T * Hm * vm, -1, 1);
    float *o = ct_host(sizeof(float) * T * Hm * vm), *lse = ct_host(sizeof(float) * T * Hm);
    float *ws = ct_host(sizeof(float) * arl_mla_attn_ws_floats(T, Hm, r));
    arl_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, cu, N, T, Hm, n, r, vm, scale, ws);
    float *gqn = ct_rand(T * Hm * n, -1, 1), *gqp = ct_rand(T * Hm * r, -1, 1);
    float *gkn = ct_rand(T * Hm * n, -1, 1), *gkp = ct_rand(T * r, -1, 1);
    float *gv = ct_rand(T * Hm * vm, -1, 1);
    float *i_qn = ct_copy_host(gqn, T * Hm * n), *i_qp = ct_copy_host(gqp, T * Hm * r);
    float *i_kn = ct_copy_host(gkn, T * Hm * n), *i_kp = ct_copy_host(gkp, T * r);
    float *i_v = ct_copy_host(gv, T * Hm * vm);
    float *d_qn = ct_dev(qn, T * Hm * n), *d_qp = ct_dev(qp, T * Hm * r);
    float *d_kn = ct_dev(kn, T * Hm * n), *d_kp = ct_dev(kp, T * r), *d_v = ct_dev(v, T * Hm * vm);
    float *d_gqn = ct_dev(gqn, T * Hm * n), *d_gqp = ct_dev(gqp, T * Hm * r);
    float *d_gkn = ct_dev(gkn, T * Hm * n), *d_gkp = ct_dev(gkp, T * r);
    float *d_gv = ct_dev(gv, T * Hm * vm), *d_dO = ct_dev(dO, T * Hm * vm);
    float *d_o = ct_dev(o, T * Hm * vm), *d_lse = ct_dev(lse, T * Hm);
    float *d_ws = ct_dev(NULL, arl_cuda_mla_attn_bwd_ws_floats(T, Hm, n, r, vm));
    int32_t *d_cu = ct_dev_i32(cu, N + 1);
    arl_mla_attn_bwd(gqn, gqp, gkn, gkp, gv, dO, o, lse, qn, qp, kn, kp, v, cu, N, T, Hm, n, r, vm,
                     scale, ws);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
    arl_cuda_mla_attn_bwd(d_gqn, d_gqp, d_gkn, d_gkp, d_gv, d_dO, d_o, d_lse, d_qn, d_qp, d_kn,
                          d_kp, d_v, d_cu, N, T, Hm, n, r, vm, scale, d_ws);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
    printf("mla_attn_bwd on tensor cores, n %lld r %lld v %lld:\n", (long long)n, (long long)r,
           (long long)vm);
    tc_check_added("mla_attn_bwd (tensor cores) dq_nope", d_gqn, gqn, i_qn, T * Hm * n, 2e-2);
    tc_check_added("mla_attn_bwd (tensor cores) dq_pe", d_gqp, gqp, i_qp, T * Hm * r, 2e-2);
    tc_check_added("mla_attn_bwd (tensor cores) dk_nope", d_gkn, gkn, i_kn, T * Hm * n, 2e-2);
    tc_check_added("mla_attn_bwd (tensor cores) dk_pe", d_gkp, gkp, i_kp, T * r, 2e-2);
    tc_check_added("mla_attn_bwd (tensor cores) dv", d_gv, gv, i_v, T * Hm * vm, 2e-2);
    free(qn), free(qp), free(kn), free(kp), free(v), free(dO), free(o), free(lse), free(ws);
    free(gqn), free(gqp), free(gkn), free(gkp), free(gv);
    free(i_qn), free(i_qp), free(i_kn), free(i_kp), free(i_v);
    CT_CASE_END;
}

static void test_mla_tc(void) {
    CT_CASE_BEGIN;
    mla_tc_case(32, 16, 64, 0);
    mla_tc_case(64, 32, 128, 0);
    mla_tc_case(64, 32, 128, 1);
    mla_tc_case(30, 18, 62, 1);
    CT_CASE_END;
    mla_tc_bwd_case(32, 16, 64);  /* tiny: qk 64, v 64 */
    mla_tc_bwd_case(64, 32, 128); /* mini: qk 96, v 128 */
    mla_tc_bwd_case(128, 64, 96); /* full scale's qk 192 (32-query tiles), v 96 padded to 128 */
    mla_tc_bwd_case(30, 18, 62);  /* widths not multiples of 4: tiles read a float at a time */
}

/* ---------------------------------------------------------------- AttnRes */
/* NS sources of T tokens of width d, source 2 without a gradient wanted. */
#define ATTNRES_TEST_MAX 11
static void attnres_case(int NS, int64_t T, int64_t d) {
    float *src[ATTNRES_TEST_MAX], *dsrc[ATTNRES_TEST_MAX], *d_src[ATTNRES_TEST_MAX];
    float *d_dsrc[ATTNRES_TEST_MAX], *dsrc_cpu[ATTNRES_TEST_MAX];
    for (int j = 0; j < NS; j++) {
        src[j] = ct_rand(T * d, -3, 3);
        dsrc[j] = ct_rand(T * d, -1, 1);
        d_src[j] = ct_dev(src[j], T * d);
        d_dsrc[j] = j == 2 ? NULL : ct_dev(dsrc[j], T * d); /* one gradient not wanted */
        dsrc_cpu[j] = j == 2 ? NULL : dsrc[j];
    }
    float *wn = ct_rand(d, 0.5f, 1.5f), *wp = ct_rand(d, -0.3f, 0.3f), *dh = ct_rand(T * d, -1, 1);
    float *out = ct_host(sizeof(float) * T * d), *a = ct_host(sizeof(float) * NS * T);
    float *dwn = ct_rand(d, -1, 1), *dwp = ct_rand(d, -1, 1);
    float *d_wn = ct_dev(wn, d), *d_wp = ct_dev(wp, d), *d_dh = ct_dev(dh, T * d);
    float *d_out = ct_dev(NULL, T * d), *d_a = ct_dev(NULL, NS * T);
    float *d_dwn = ct_dev(dwn, d), *d_dwp = ct_dev(dwp, d), *d_ws = ct_dev(NULL, 2 * NS * T);
    arl_cuda_attnres_mix_fwd(d_out, d_a, (const float *const *)d_src, NS, T, d, d_wn, d_wp, 1e-5f);
    arl_cuda_attnres_mix_bwd(d_dsrc, d_dwn, d_dwp, d_dh, (const float *const *)d_src, NS, T, d,
                             d_wn, d_wp, 1e-5f, d_ws);
    arl_attnres_mix_fwd(out, a, (const float *const *)src, NS, T, d, wn, wp, 1e-5f);
    arl_attnres_mix_bwd(dsrc_cpu, dwn, dwp, dh, (const float *const *)src, NS, T, d, wn, wp, 1e-5f);
    /* both in double internally: 1e-5 relative */
    ct_check("attnres_mix_fwd out", d_out, out, T * d, 1e-6, 1e-5);
    ct_check("attnres_mix_fwd a", d_a, a, NS * T, 1e-7, 1e-5);
    for (int j = 0; j < NS; j++)
        if (j != 2) ct_check("attnres_mix_bwd dsrc (+=)", d_dsrc[j], dsrc[j], T * d, 1e-6, 1e-5);
    ct_check_maxref("attnres_mix_bwd dw_norm (+=)", d_dwn, dwn, d, 1e-6, 1e-5);
    ct_check_maxref("attnres_mix_bwd dw_proj (+=)", d_dwp, dwp, d, 1e-6, 1e-5);
    for (int j = 0; j < NS; j++)
        free(src[j]), free(dsrc[j]);
    free(wn), free(wp), free(dh), free(out), free(a), free(dwn), free(dwp);
}

static void test_attnres(void) {
    CT_CASE_BEGIN;
    attnres_case(5, 6, 96);
    /* the device sums 8 sources a pass: two passes, the second partial; a row wider than the
     * block's 256 threads and not a multiple of it */
    attnres_case(ATTNRES_TEST_MAX, 5, 300);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- router */
static void test_router(void) {
    CT_CASE_BEGIN;
    const int64_t T = 20, d = 32, E = 16, k = 4;
    const float rho = 2.5f;
    float *x = ct_rand(T * d, -1, 1), *W = ct_rand(E * d, -1, 1), *b = ct_rand(E, -0.1f, 0.1f);
    for (int64_t i = 0; i < d; i++)
        x[i] = 0.0f; /* token 0: all logits 0 -> all scores tie: lowest experts win */
    for (int64_t e = 0; e < E; e++)
        b[e] = 0.0f;
    float *l = ct_host(sizeof(float) * T * E), *s = ct_host(sizeof(float) * T * E);
    float *p = ct_host(sizeof(float) * T * k);
    int32_t *sel = ct_host(sizeof(int32_t) * T * k);
    float *ws = ct_host(sizeof(float) * arl_router_ws_floats(T, E));
    arl_k_linear_fwd(l, x, W, T, d, E);
    if (arl_router_fwd(sel, p, s, x, W, b, NULL, T, d, E, k, rho, ws) != ARL_OK) ct_die("router");
    float *d_l = ct_dev(l, T * E), *d_b = ct_dev(b, E), *d_s = ct_dev(NULL, T * E);
    float *d_p = ct_dev(NULL, T * k);
    int32_t *d_sel = ct_dev_i32(NULL, T * k);
    arl_cuda_router_fwd(d_sel, d_p, d_s, d_l, d_b, NULL, T, E, k, rho);
    int32_t *hs = ct_get_i32(d_sel, T * k);
    for (int64_t i = 0; i < T * k; i++)
        CHECK_MSG(hs[i] == sel[i], "router sel [%lld]: gpu %d cpu %d", (long long)i, hs[i], sel[i]);
    free(hs);
    ct_check("router s", d_s, s, T * E, 1e-7, 2e-6);
    ct_check("router p", d_p, p, T * k, 1e-7, 1e-5);

    /* backward: dl on the device, then the two table GEMMs; vs arl_router_bwd */
    const arl_k_backend *kb = arl_cuda_backend();
    float *dp = ct_rand(T * k, -1, 1), *dx = ct_rand(T * d, -1, 1), *dW = ct_rand(E * d, -1, 1);
    float *d_dp = ct_dev(dp, T * k), *d_dx = ct_dev(dx, T * d), *d_dW = ct_dev(dW, E * d);
    float *d_x = ct_dev(x, T * d), *d_W = ct_dev(W, E * d), *d_dl = ct_dev(NULL, T * E);
    int32_t *d_selc = ct_dev_i32(sel, T * k);
    float *d_sc = ct_dev(s, T * E);
    arl_cuda_router_bwd(d_dl, d_dp, d_sc, d_selc, T, E, k, rho);
    kb->linear_bwd_w(d_dW, d_dl, d_x, T, d, E);
    kb->linear_bwd_x(d_dx, d_dl, d_W, T, d, E);
    arl_router_bwd(dx, dW, dp, x, W, s, sel, T, d, E, k, rho, ws);
    ct_check_maxref("router_bwd dx (+=)", d_dx, dx, T * d, 1e-6, 1e-5);
    ct_check_maxref("router_bwd dW (+=)", d_dW, dW, E * d, 1e-6, 1e-5);

    /* forced routes: copied; a bad one is reported by arl_cuda_sync as ARL_ERR_RANGE */
    int32_t *forced = ct_host(sizeof(int32_t) * T * k);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < k; i++)
            forced[t * k + i] = (int32_t)((t + 3 * i) % E);
    int32_t *d_f = ct_dev_i32(forced, T * k);
    arl_cuda_router_fwd(d_sel, d_p, d_s, d_l, d_b, d_f, T, E, k, rho);
    hs = ct_get_i32(d_sel, T * k);
    CHECK(memcmp(hs, forced, sizeof(int32_t) * T * k) == 0);
    free(hs);
    forced[7 * k + 1] = (int32_t)E;
    arl_cuda_upload(ct_ctx, d_f, forced, sizeof(int32_t) * T * k);
    arl_cuda_router_fwd(d_sel, d_p, d_s, d_l, d_b, d_f, T, E, k, rho);
    arl_status st = arl_cuda_sync(ct_ctx);
    CHECK_MSG(st == ARL_ERR_RANGE && strstr(arl_error_msg(), "token 7"),
              "bad forced route: status %d, message '%s'", (int)st, arl_error_msg());
    CHECK(arl_cuda_sync(ct_ctx) == ARL_OK); /* the error was reported once and cleared */
    free(x), free(W), free(b), free(l), free(s), free(p), free(sel), free(ws);
    free(dp), free(dx), free(dW), free(forced);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- QB histogram */
static void test_qb(void) {
    CT_CASE_BEGIN;
    const int64_t m = 300, E = 16, k = 4, Nb = 64;
    float *s = ct_rand(m * E, 0, 1), *b = ct_rand(E, -0.2f, 0.2f), lo, w;
    for (int64_t j = 0; j < E; j++)
        s[5 * E + j] = 0.5f; /* a token with all scores tied */
    int64_t *cnt = ct_host(sizeof(int64_t) * E * Nb);
    float *ws = ct_host(sizeof(float) * arl_qb_ws_floats(m, E));
    arl_qb_hist_range(&lo, &w, b, E, Nb);
    arl_qb_hist_count(cnt, s, b, m, E, k, lo, w, Nb, ws);
    float *d_s = ct_dev(s, m * E), *d_b = ct_dev(b, E);
    int64_t *d_cnt = ct_dev_bytes(NULL, sizeof(int64_t) * E * Nb);
    arl_cuda_qb_hist_count(d_cnt, d_s, d_b, m, E, k, lo, w, Nb);
    int64_t *h = ct_host(sizeof(int64_t) * E * Nb);
    if (arl_cuda_sync(ct_ctx) != ARL_OK ||
        arl_cuda_download(ct_ctx, h, d_cnt, sizeof(int64_t) * E * Nb) != ARL_OK)
        ct_die("qb download");
    /* the same float operations (sum, subtraction, IEEE division, floor): exact counts */
    CHECK(memcmp(h, cnt, sizeof(int64_t) * E * Nb) == 0);
    free(s), free(b), free(cnt), free(ws), free(h);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- MoE */
/* The plan alone (kernels/cuda/moe.cu: segments of consecutive entries, one warp each),
 * against the host's: counts, offsets, row tiles and each expert's rows in (token, slot) order,
 * exact. Cases: segments of 256 with a partial last one (9000 entries, k distinct experts a token,
 * one expert never chosen); the full-scale 896 experts over 25 segments and a step of 32
 * entries cut by the end, experts drawn with repeats (the plan does not need them distinct);
 * one entry; no tokens (every count 0); segments longer than the minimum: (2^17 + 123) tokens
 * x 5 (1864 segments of 352 entries, the last of 199); 2500 experts (the offsets, row tiles of
 * 64 included, scanned in rounds of 1024 keys), and, on a GPU (not under
 * tests/cuda/emu, which sets ARL_CUDA_EMU: half a minute there), 2^20 tokens x 5. */
static void moe_plan_case(int64_t T, int64_t k, int64_t E, int distinct) {
    CT_CASE_BEGIN;
    const int64_t R = T * k;
    int32_t *sel = ct_host(sizeof(int32_t) * (R ? R : 1));
    for (int64_t t = 0; t < T; t++) /* distinct: k distinct experts a token, E - 1 never */
        for (int64_t i = 0; i < k; i++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)arl_rng_below(&ct_rng, (uint64_t)(distinct ? E - 1 : E));
                dup = 0;
                for (int64_t j = 0; distinct && j < i; j++)
                    dup |= sel[t * k + j] == e;
            } while (dup);
            sel[t * k + i] = e;
        }
    int32_t *d_sel = ct_dev_i32(sel, R ? R : 1);
    int32_t *d_buf = ct_dev_i32(NULL, arl_cuda_moe_plan_ints(T, k, E));
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, d_buf, d_sel, T, k, E);
    int32_t *cnt = ct_get_i32(plan.counts, E), *off = ct_get_i32(plan.offsets, E + 1);
    int32_t *tiles = ct_get_i32(plan.tiles, E + 1);
    int32_t *src = R ? ct_get_i32(plan.row_src, R) : NULL;
    int32_t *slot = R ? ct_get_i32(plan.slot_row, R) : NULL;
    int32_t *want = ct_host(sizeof(int32_t) * E), *cursor = ct_host(sizeof(int32_t) * E), o = 0;
    int32_t nt = 0; /* row tiles of 64 before the expert */
    memset(want, 0, sizeof(int32_t) * E);
    for (int64_t i = 0; i < R; i++)
        want[sel[i]]++;
    int bad = 0;
    for (int64_t e = 0; e < E && bad < 5; e++) {
        if (cnt[e] != want[e] || off[e] != o || tiles[e] != nt) {
            CHECK_MSG(0, "expert %lld: count %d (want %d), offset %d (want %d), tiles %d (want %d)",
                      (long long)e, cnt[e], want[e], off[e], o, tiles[e], nt);
            bad++;
        }
        cursor[e] = o;
        o += want[e];
        nt += (want[e] + 63) / 64;
    }
    CHECK_EQ_INT(off[E], (int32_t)R);
    CHECK_EQ_INT(tiles[E], nt);
    if (distinct) CHECK_EQ_INT(cnt[E - 1], 0);
    for (int64_t i = 0; i < R && bad < 5; i++) {
        int32_t row = cursor[sel[i]]++;
        if (slot[i] != row || src[row] != (int32_t)(i / k)) {
            CHECK_MSG(0, "entry %lld: row %d (want %d), source %d (want %lld)", (long long)i,
                      slot[i], row, src[row], (long long)(i / k));
            bad++;
        }
    }
    free(sel), free(cnt), free(off), free(tiles), free(src), free(slot), free(want), free(cursor);
    CT_CASE_END;
}

static void test_moe_plan(void) {
    moe_plan_case(3000, 3, 37, 1);
    moe_plan_case(457, 14, 896, 0); /* 6398 entries: 24 segments of 256 and one of 254 */
    moe_plan_case(1, 1, 5, 0);
    moe_plan_case(0, 4, 9, 0);
    moe_plan_case(700, 4, 2500, 1); /* the offset scan's three rounds of 1024 experts */
    moe_plan_case(((int64_t)1 << 17) + 123, 5, 128, 0);
    if (!getenv("ARL_CUDA_EMU")) moe_plan_case((int64_t)1 << 20, 5, 128, 0);
}

static void test_moe(void) {
    CT_CASE_BEGIN;
    const int64_t T = 40, k = 4, E = 8, K = 48, N = 32, R = T * k;
    int32_t *sel = ct_host(sizeof(int32_t) * R);
    for (int64_t t = 0; t < T; t++) /* distinct experts per token, expert 5 never chosen */
        for (int64_t i = 0; i < k; i++) {
            int32_t e = (int32_t)((t * 3 + i * 2) % 7);
            sel[t * k + i] = e >= 5 ? e + 1 : e;
        }
    float *x = ct_rand(T * K, -1, 1), *W = ct_rand(E * N * K, -1, 1), *p = ct_rand(R, 0, 1);
    int32_t *d_sel = ct_dev_i32(sel, R);
    int32_t *d_buf = ct_dev_i32(NULL, arl_cuda_moe_plan_ints(T, k, E));
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, d_buf, d_sel, T, k, E);
    /* the plan: counts, offsets, and rows in (token, slot) order within each expert */
    int32_t *cnt = ct_get_i32(plan.counts, E), *off = ct_get_i32(plan.offsets, E + 1);
    int32_t *src = ct_get_i32(plan.row_src, R), *slot = ct_get_i32(plan.slot_row, R);
    int32_t want[8] = {0}, o = 0, cursor[8];
    for (int64_t i = 0; i < R; i++)
        want[sel[i]]++;
    for (int64_t e = 0; e < E; e++) {
        CHECK_EQ_INT(cnt[e], want[e]);
        CHECK_EQ_INT(off[e], o);
        cursor[e] = o;
        o += want[e];
    }
    CHECK_EQ_INT(cnt[5], 0);
    for (int64_t i = 0; i < R; i++) {
        int32_t row = cursor[sel[i]]++;
        CHECK_EQ_INT(slot[i], row);
        CHECK_EQ_INT(src[row], (int32_t)(i / k));
    }
    free(cnt), free(off), free(src), free(slot);

    /* reference: yp[row of (t, i)] = x_t W_e^T, y_t = sum_i p yp (double) */
    float *yp = ct_host(sizeof(float) * R * N), *y = ct_host(sizeof(float) * T * N);
    double *bound = ct_host(sizeof(double) * R * N);
    float *xp = ct_host(sizeof(float) * R * K);
    for (int64_t i = 0; i < R; i++) {
        int64_t t = i / k, e = sel[i];
        for (int64_t c = 0; c < K; c++)
            xp[i * K + c] = x[t * K + c];
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, b = 0;
            for (int64_t c = 0; c < K; c++) {
                acc += (double)x[t * K + c] * W[(e * N + j) * K + c];
                b += fabs((double)x[t * K + c] * W[(e * N + j) * K + c]);
            }
            yp[i * N + j] = (float)acc; /* stored by (token, slot) here */
            bound[i * N + j] = b;
        }
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t i = 0; i < k; i++)
                acc += (double)p[t * k + i] * yp[(t * k + i) * N + j];
            y[t * N + j] = (float)acc;
        }
    int32_t *slot_h = ct_get_i32(plan.slot_row, R);
    float *yp_sorted = ct_host(sizeof(float) * R * N);
    double *bound_sorted = ct_host(sizeof(double) * R * N);
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < N; j++) {
            yp_sorted[(int64_t)slot_h[i] * N + j] = yp[i * N + j];
            bound_sorted[(int64_t)slot_h[i] * N + j] = bound[i * N + j];
        }

    float *d_x = ct_dev(x, T * K), *d_W = ct_dev(W, E * N * K), *d_p = ct_dev(p, R);
    float *d_xp = ct_dev(NULL, R * K), *d_yp = ct_dev(NULL, R * N), *d_y = ct_dev(NULL, T * N);
    arl_cuda_moe_gather(d_xp, d_x, &plan, K);
    arl_cuda_grouped_gemm(d_yp, d_xp, d_W, 1, &plan, N, K, 0.0f);
    arl_cuda_moe_combine(d_y, d_yp, d_p, &plan, N);
    /* fp32 products of K = 48 terms in [-1, 1] vs a double reference: 1e-5 of max|ref| */
    ct_check_maxref("grouped_gemm fp32 (W^T)", d_yp, yp_sorted, R * N, 1e-6, 1e-5);
    ct_check_maxref("moe_combine", d_y, y, T * N, 1e-6, 1e-5);

    /* W stored (E, K, N): trans_w = 0 gives the same products */
    float *Wt = ct_host(sizeof(float) * E * N * K);
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t c = 0; c < K; c++)
                Wt[(e * K + c) * N + j] = W[(e * N + j) * K + c];
    float *d_Wt = ct_dev(Wt, E * N * K);
    arl_cuda_grouped_gemm(d_yp, d_xp, d_Wt, 0, &plan, N, K, 0.0f);
    ct_check_maxref("grouped_gemm fp32 (W)", d_yp, yp_sorted, R * N, 1e-6, 1e-5);

    /* bf16 tensor-core path, both layouts: per-element bound 2^-7 sum|x||w| */
    uint16_t *d_xpb = ct_dev_bytes(NULL, 2 * R * K), *d_Wb = ct_dev_bytes(NULL, 2 * E * N * K);
    uint16_t *d_Wtb = ct_dev_bytes(NULL, 2 * E * N * K);
    arl_cuda_moe_gather_bf16(d_xpb, d_x, &plan, K);
    arl_cuda_f32_to_bf16(d_Wb, d_W, E * N * K);
    arl_cuda_f32_to_bf16(d_Wtb, d_Wt, E * N * K);
    for (int tw = 0; tw < 2; tw++) {
        arl_cuda_grouped_gemm_bf16(d_yp, d_xpb, tw ? d_Wb : d_Wtb, tw, &plan, N, K, 0.0f);
        float *h = ct_get(d_yp, R * N);
        for (int64_t i = 0; i < R * N; i++) {
            double lim = bound_sorted[i] / 128.0 + 1e-6;
            if (!(fabs((double)h[i] - yp_sorted[i]) <= lim)) {
                fprintf(stderr, "grouped_gemm_bf16 trans_w=%d [%lld]: %g vs %g (> %g)\n", tw,
                        (long long)i, h[i], yp_sorted[i], lim);
                test_failures_++;
                break;
            }
        }
        free(h);
    }
    /* the bf16 math mode on fp32 operands (rounded to bf16 as staged): the same bound */
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
    for (int tw = 0; tw < 2; tw++) {
        arl_cuda_grouped_gemm(d_yp, d_xp, tw ? d_W : d_Wt, tw, &plan, N, K, 0.0f);
        float *h = ct_get(d_yp, R * N);
        for (int64_t i = 0; i < R * N; i++) {
            double lim = bound_sorted[i] / 128.0 + 1e-6;
            if (!(fabs((double)h[i] - yp_sorted[i]) <= lim)) {
                fprintf(stderr, "grouped_gemm (bf16 math) trans_w=%d [%lld]: %g vs %g (> %g)\n",
                        tw, (long long)i, h[i], yp_sorted[i], lim);
                test_failures_++;
                break;
            }
        }
        free(h);
    }
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);

    /* backward pieces: combine_bwd, grouped input gradient (trans_w = 0 on W (E, N, K) read as
     * (K', N') = (N, K)), weight gradient, gather_bwd */
    float *dy = ct_rand(T * N, -1, 1), *dp_init = ct_rand(R, -1, 1);
    float *dx_init = ct_rand(T * K, -1, 1), *dW_init = ct_rand(E * N * K, -1, 1);
    float *dp = ct_copy_host(dp_init, R), *dx = ct_copy_host(dx_init, T * K);
    float *dW = ct_copy_host(dW_init, E * N * K);
    float *dyp = ct_host(sizeof(float) * R * N), *dxp = ct_host(sizeof(float) * R * K);
    for (int64_t i = 0; i < R; i++) { /* reference in (token, slot) order, double sums */
        int64_t t = i / k, e = sel[i];
        double dpi = 0;
        for (int64_t j = 0; j < N; j++) {
            dyp[i * N + j] = p[i] * dy[t * N + j];
            dpi += (double)dy[t * N + j] * yp[i * N + j];
        }
        dp[i] = (float)(dp[i] + dpi);
        for (int64_t c = 0; c < K; c++) {
            double acc = 0;
            for (int64_t j = 0; j < N; j++)
                acc += (double)dyp[i * N + j] * W[(e * N + j) * K + c];
            dxp[i * K + c] = (float)acc;
        }
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t c = 0; c < K; c++) {
                double acc = dW[(e * N + j) * K + c];
                for (int64_t i = 0; i < R; i++)
                    if (sel[i] == e) acc += (double)dyp[i * N + j] * x[(i / k) * K + c];
                dW[(e * N + j) * K + c] = (float)acc;
            }
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < K; c++) {
            double acc = dx[t * K + c];
            for (int64_t i = 0; i < k; i++)
                acc += dxp[(t * k + i) * K + c];
            dx[t * K + c] = (float)acc;
        }
    float *d_dy = ct_dev(dy, T * N), *d_dyp = ct_dev(NULL, R * N), *d_dxp = ct_dev(NULL, R * K);
    float *d_dp = ct_dev(dp_init, R), *d_dx = ct_dev(dx_init, T * K);
    float *d_dW = ct_dev(dW_init, E * N * K);
    arl_cuda_moe_gather(d_xp, d_x, &plan, K);
    arl_cuda_grouped_gemm(d_yp, d_xp, d_W, 1, &plan, N, K, 0.0f);
    arl_cuda_moe_combine_bwd(d_dyp, d_dp, d_dy, d_yp, d_p, &plan, N);
    arl_cuda_grouped_gemm(d_dxp, d_dyp, d_W, 0, &plan, K, N, 0.0f);
    arl_cuda_grouped_gemm_wgrad(d_dW, d_dyp, d_xp, &plan, N, K);
    arl_cuda_moe_gather_bwd(d_dx, d_dxp, &plan, K);
    ct_check_maxref("moe_combine_bwd dp (+=)", d_dp, dp, R, 1e-6, 1e-5);
    ct_check_maxref("moe_gather_bwd dx (+=) via grouped dX", d_dx, dx, T * K, 1e-6, 1e-5);
    ct_check_maxref("grouped_gemm_wgrad dW (+=)", d_dW, dW, E * N * K, 1e-6, 1e-5);
    /* the tensor-core weight gradient of the bf16 math mode: each product's operands rounded
     * to bf16 (2^-8 relative per product), ~23 rows of |dy p x| <= 1 per element: within
     * 1e-2 of max|ref| (~3 here) even with every rounding error of one sign */
    float *d_dW16 = ct_dev(dW_init, E * N * K);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
    arl_cuda_grouped_gemm_wgrad(d_dW16, d_dyp, d_xp, &plan, N, K);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
    ct_check_maxref("grouped_gemm_wgrad (bf16 math) dW (+=)", d_dW16, dW, E * N * K, 0.0, 1e-2);
    free(dp_init), free(dx_init), free(dW_init);
    free(sel), free(x), free(W), free(p), free(yp), free(y), free(bound), free(xp), free(slot_h);
    free(yp_sorted), free(bound_sorted), free(Wt), free(dy), free(dp), free(dx), free(dW);
    free(dyp), free(dxp);
    CT_CASE_END;
}

/* 1 when a and b (n floats) are the same bits; else says where they first differ */
static int same_floats(const char *what, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            fprintf(stderr, "%s [%lld]: %.9g vs %.9g\n", what, (long long)i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* Checks the wide tiles' rows h (R, N; plan order) against x_t W_e^T (double) plus y0 (beta =
 * 1; NULL: beta = 0) per element within 2^-7 sum|x w| (bf16 operands); 1 when all pass. */
static int moe_wide_ok(const char *what, const float *h, const float *y0, const float *x,
                       const float *W, const int32_t *sel, const int32_t *slot, int64_t R,
                       int64_t k, int64_t N, int64_t K) {
    for (int64_t i = 0; i < R; i++) {
        const int64_t t = i / k, e = sel[i], row = slot[i];
        for (int64_t j = 0; j < N; j++) {
            double acc = y0 ? y0[row * N + j] : 0.0, b = 0;
            for (int64_t c = 0; c < K; c++) {
                acc += (double)x[t * K + c] * W[(e * N + j) * K + c];
                b += fabs((double)x[t * K + c] * W[(e * N + j) * K + c]);
            }
            if (!(fabs((double)h[row * N + j] - acc) <= b / 128.0 + 1e-6)) {
                fprintf(stderr, "%s [%lld, %lld]: %g vs %g\n", what, (long long)row, (long long)j,
                        h[row * N + j], acc);
                return 0;
            }
        }
    }
    return 1;
}

/* 1 when the n bf16 a and b are the same bits; else says where they first differ */
static int same_u16(const char *what, const uint16_t *a, const uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "%s [%lld]: %04x vs %04x\n", what, (long long)i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* The experts' GLU fused into their grouped GEMMs against the separate launches, bit for bit:
 * - forward (arl_cuda_grouped_glu_bf16: the mma.sync tile's columns split between the gate and
 *   up banks, the GLU in its epilogue) against the plain bf16 tile on each bank and the GLU pass
 *   (arl_cuda_glu_fwd_bf16): G, U and H, SwiGLU keeping G and U (the training forward) and
 *   SiTU-GLU without them (the inference forward);
 * - backward (arl_cuda_grouped_glu_bwd_bf16: the GLU backward in the epilogue of dH = dY W2_e)
 *   against the plain trans_w = 0 tile and arl_cuda_glu_bwd_bf16: dG, dU, both GLUs.
 * Outputs start as NaNs so that an element left unwritten shows.  X (R, K), W1 (E, N, K) and
 * W2 (E, K, N) bf16 on the device (dY = X); sums of order 5, so SiTU's caps 4 and 25 bite. */
static void moe_glu_check(const arl_cuda_moe_plan *plan, const uint16_t *d_x, const uint16_t *d_w1,
                          const uint16_t *d_w2, int64_t E, int64_t R, int64_t N, int64_t K) {
    float *w3 = ct_rand(E * N * K, -1, 1), *d_w3f = ct_dev(w3, E * N * K);
    uint16_t *d_w3 = ct_dev_bytes(NULL, 2 * E * N * K), *d_h = ct_dev_bytes(NULL, 2 * R * N);
    uint16_t *nan16 = (uint16_t *)ct_host(sizeof(uint16_t) * (size_t)(R * N));
    for (int64_t i = 0; i < R * N; i++)
        nan16[i] = 0x7fc1;
    uint16_t *d_hf = ct_dev_bytes(nan16, 2 * R * N);
    float *d_g = ct_dev(NULL, R * N), *d_u = ct_dev(NULL, R * N);
    float *d_gf = ct_dev(NULL, R * N), *d_uf = ct_dev(NULL, R * N);
    arl_cuda_f32_to_bf16(d_w3, d_w3f, E * N * K);
    const int32_t was = arl_cuda_moe_tn_form(ARL_CUDA_MOE_TN_MMA);
    arl_cuda_grouped_gemm_bf16(d_g, d_x, d_w1, 1, plan, N, K, 0.0f);
    arl_cuda_grouped_gemm_bf16(d_u, d_x, d_w3, 1, plan, N, K, 0.0f);
    arl_cuda_moe_tn_form(was);
    float *g = ct_get(d_g, R * N), *u = ct_get(d_u, R * N);
    for (int situ = 0; situ < 2; situ++) {
        const float b1 = 4.0f, b2 = 25.0f;
        const int keep = !situ;
        arl_cuda_glu_fwd_bf16(d_h, d_g, d_u, R, N, N, situ, b1, b2);
        if (arl_cuda_upload(ct_ctx, d_hf, nan16, sizeof(uint16_t) * (size_t)(R * N))) CHECK(0);
        arl_cuda_grouped_glu_bf16(keep ? d_gf : NULL, keep ? d_uf : NULL, d_hf, d_x, d_w1, d_w3,
                                  plan, N, K, situ, b1, b2);
        uint16_t *h = ct_get_u16(d_h, R * N), *hf = ct_get_u16(d_hf, R * N);
        CHECK(same_u16(situ ? "grouped_glu_bf16 H vs the GLU pass (situ)"
                            : "grouped_glu_bf16 H vs the GLU pass (swiglu)",
                       hf, h, R * N));
        if (keep) {
            float *gf = ct_get(d_gf, R * N), *uf = ct_get(d_uf, R * N);
            CHECK(same_floats("grouped_glu_bf16 G vs the gate's grouped_gemm_bf16", gf, g, R * N));
            CHECK(same_floats("grouped_glu_bf16 U vs the up's grouped_gemm_bf16", uf, u, R * N));
            free(gf), free(uf);
        }
        free(h), free(hf);
    }
    float *d_dh = ct_dev(NULL, R * N);
    uint16_t *d_dg = ct_dev_bytes(NULL, 2 * R * N), *d_du = ct_dev_bytes(NULL, 2 * R * N);
    uint16_t *d_dgf = ct_dev_bytes(NULL, 2 * R * N), *d_duf = ct_dev_bytes(NULL, 2 * R * N);
    arl_cuda_grouped_gemm_bf16(d_dh, d_x, d_w2, 0, plan, N, K, 0.0f);
    for (int situ = 0; situ < 2; situ++) {
        const float b1 = 4.0f, b2 = 25.0f;
        arl_cuda_glu_bwd_bf16(d_dg, d_du, d_dh, d_g, d_u, R, N, N, situ, b1, b2);
        if (arl_cuda_upload(ct_ctx, d_dgf, nan16, sizeof(uint16_t) * (size_t)(R * N)) ||
            arl_cuda_upload(ct_ctx, d_duf, nan16, sizeof(uint16_t) * (size_t)(R * N)))
            CHECK(0);
        arl_cuda_grouped_glu_bwd_bf16(d_dgf, d_duf, d_x, d_w2, d_g, d_u, plan, N, K, situ, b1, b2);
        uint16_t *dg = ct_get_u16(d_dg, R * N), *dgf = ct_get_u16(d_dgf, R * N);
        uint16_t *du = ct_get_u16(d_du, R * N), *duf = ct_get_u16(d_duf, R * N);
        CHECK(same_u16(situ ? "grouped_glu_bwd_bf16 dG (situ)" : "grouped_glu_bwd_bf16 dG (swiglu)",
                       dgf, dg, R * N));
        CHECK(same_u16(situ ? "grouped_glu_bwd_bf16 dU (situ)" : "grouped_glu_bwd_bf16 dU (swiglu)",
                       duf, du, R * N));
        free(dg), free(dgf), free(du), free(duf);
    }
    free(w3), free(nan16), free(g), free(u);
}

/* The wide tiles (kernels/cuda/moe.cu k_grouped_bf16_tn on bf16 operands, 64 x 256 per block,
 * and its wgmma form kernels/cuda/moe_wgmma.cu where the device has it;
 * k_grouped_f32_mma on fp32 operands under the bf16 math mode, 64 x 128): N = 272 leaves a
 * last column block of 16 (of both), K = 208 six and a half K slabs of 32 (the bf16 tile's ring
 * of 4 stages wraps; the last slab half zeros), 200 rows spread over experts with 1 to 70 rows
 * (a partial 64-row tile and an expert with one row); bound per element 2^-7 sum|x w| as for
 * the other bf16 paths.  The bf16 tile and the fp32 tile in both weight layouts (W (E, N, K)
 * and (E, K, N)), each with beta 0 and 1 (added to what Y held), the weight gradient, and
 * the gate and up products with their GLU in one launch (moe_glu_check). */
static void test_moe_wide(void) {
    CT_CASE_BEGIN;
    const int64_t T = 100, k = 2, E = 6, K = 208, N = 272, R = T * k;
    int32_t *sel = ct_host(sizeof(int32_t) * R);
    for (int64_t t = 0; t < T; t++) {
        sel[t * k] = t == 7 ? 5 : (int32_t)(t % 3); /* expert 5: one row */
        sel[t * k + 1] = t < 70 ? 3 : 4;            /* 70 rows of expert 3, 30 of expert 4 */
    }
    float *x = ct_rand(T * K, -1, 1), *W = ct_rand(E * N * K, -1, 1);
    float *Wt = ct_host(sizeof(float) * E * N * K), *y0 = ct_rand(R * N, -1, 1);
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t c = 0; c < K; c++)
                Wt[(e * K + c) * N + j] = W[(e * N + j) * K + c];
    int32_t *d_sel = ct_dev_i32(sel, R);
    int32_t *d_buf = ct_dev_i32(NULL, arl_cuda_moe_plan_ints(T, k, E));
    arl_cuda_moe_plan plan;
    arl_cuda_moe_plan_build(&plan, d_buf, d_sel, T, k, E);
    float *d_x = ct_dev(x, T * K), *d_W = ct_dev(W, E * N * K), *d_yp = ct_dev(NULL, R * N);
    float *d_Wt = ct_dev(Wt, E * N * K), *d_xp = ct_dev(NULL, R * K);
    uint16_t *d_xpb = ct_dev_bytes(NULL, 2 * R * K), *d_Wb = ct_dev_bytes(NULL, 2 * E * N * K);
    int32_t *slot = ct_get_i32(plan.slot_row, R);
    arl_cuda_moe_gather_bf16(d_xpb, d_x, &plan, K);
    arl_cuda_f32_to_bf16(d_Wb, d_W, E * N * K);
    float *h;
    /* both kernels of the bf16 tile where the device has both (ops.h arl_cuda_moe_tn_form):
     * mma.sync, and wgmma (an sm_90 GPU; the emulator) */
    const int forms = arl_cuda_moe_wgmma_available() ? 2 : 1;
    for (int f = 0; f < forms; f++) {
        const int32_t was = arl_cuda_moe_tn_form(f ? ARL_CUDA_MOE_TN_WGMMA : ARL_CUDA_MOE_TN_MMA);
        for (int beta = 0; beta < 2; beta++) { /* beta 1: added to what Y held */
            char what[64];
            snprintf(what, sizeof what, "grouped_gemm_bf16 wide (%s) beta=%d",
                     f ? "wgmma" : "mma.sync", beta);
            if (arl_cuda_upload(ct_ctx, d_yp, y0, sizeof(float) * (size_t)(R * N))) CHECK(0);
            arl_cuda_grouped_gemm_bf16(d_yp, d_xpb, d_Wb, 1, &plan, N, K, (float)beta);
            h = ct_get(d_yp, R * N);
            CHECK(moe_wide_ok(what, h, beta ? y0 : NULL, x, W, sel, slot, R, k, N, K));
            free(h);
        }
        arl_cuda_moe_tn_form(was);
    }
    arl_cuda_moe_gather(d_xp, d_x, &plan, K);
    uint16_t *d_Wtb = ct_dev_bytes(NULL, 2 * E * N * K);
    arl_cuda_f32_to_bf16(d_Wtb, d_Wt, E * N * K);
    moe_glu_check(&plan, d_xpb, d_Wb, d_Wtb, E, R, N, K);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_BF16);
    for (int tw = 0; tw < 2; tw++)
        for (int beta = 0; beta < 2; beta++) {
            char what[64];
            snprintf(what, sizeof what, "grouped_gemm fp32 wide trans_w=%d beta=%d", tw, beta);
            if (arl_cuda_upload(ct_ctx, d_yp, y0, sizeof(float) * (size_t)(R * N))) CHECK(0);
            arl_cuda_grouped_gemm(d_yp, d_xp, tw ? d_W : d_Wt, tw, &plan, N, K, (float)beta);
            h = ct_get(d_yp, R * N);
            CHECK(moe_wide_ok(what, h, beta ? y0 : NULL, x, W, sel, slot, R, k, N, K));
            if (!tw) { /* the bf16-operand tile (k_grouped_b16_mma FM_N) on the same values */
                if (arl_cuda_upload(ct_ctx, d_yp, y0, sizeof(float) * (size_t)(R * N))) CHECK(0);
                arl_cuda_grouped_gemm_bf16(d_yp, d_xpb, d_Wtb, 0, &plan, N, K, (float)beta);
                float *hb = ct_get(d_yp, R * N);
                CHECK(same_floats("grouped_gemm_bf16 trans_w=0 vs bf16 math", hb, h, R * N));
                free(hb);
            }
            free(h);
        }
    /* the weight gradient (k_grouped_f32_mma FM_WG, 64 x 128 of dW_e per block): dW_e
     * (N, K) += dY[R_e]^T X[R_e] on y0 as dY, with the same per-element bound; and its
     * bf16-operand tile (k_grouped_b16_mma FM_WG) on the same values, bit for bit */
    float *dW0 = ct_rand(E * N * K, -1, 1), *d_dW = ct_dev(dW0, E * N * K);
    float *d_dy = ct_dev(y0, R * N), *d_dWb = ct_dev(dW0, E * N * K);
    uint16_t *d_dyb = ct_dev_bytes(NULL, 2 * R * N);
    arl_cuda_f32_to_bf16(d_dyb, d_dy, R * N);
    arl_cuda_grouped_gemm_wgrad(d_dW, d_dy, d_xp, &plan, N, K);
    arl_cuda_set_math(ct_ctx, ARL_CUDA_MATH_FP32);
    arl_cuda_grouped_gemm_wgrad_bf16(d_dWb, d_dyb, d_xpb, &plan, N, K);
    h = ct_get(d_dW, E * N * K);
    float *hb = ct_get(d_dWb, E * N * K);
    CHECK(same_floats("grouped_gemm_wgrad_bf16 vs bf16 math", hb, h, E * N * K));
    free(hb);
    int bad = 0;
    for (int64_t e = 0; e < E && !bad; e++)
        for (int64_t j = 0; j < N && !bad; j++)
            for (int64_t c = 0; c < K && !bad; c++) {
                double acc = dW0[(e * N + j) * K + c], b = 0;
                for (int64_t i = 0; i < R; i++)
                    if (sel[i] == e) {
                        const double v = (double)y0[(int64_t)slot[i] * N + j] * x[(i / k) * K + c];
                        acc += v, b += fabs(v);
                    }
                const double got = h[(e * N + j) * K + c];
                if (!(fabs(got - acc) <= b / 128.0 + 1e-5)) {
                    fprintf(stderr, "grouped_gemm_wgrad wide [%lld, %lld, %lld]: %g vs %g\n",
                            (long long)e, (long long)j, (long long)c, got, acc);
                    bad = 1;
                }
            }
    CHECK(!bad);
    free(h), free(dW0);
    free(sel), free(x), free(W), free(Wt), free(y0), free(slot);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- AdamW */
/* {begin, length, decay, bf16 copy} of test_adamw's ranges, and which holds float i (n: none) */
static const int64_t ADAMW_RG[][4] = {{0, 2, 1, 1},       {3, 1, 0, 1},    {4, 1022, 1, 1},
                                      {1026, 1029, 0, 0}, {2055, 6, 1, 1}, {2061, 2935, 0, 1},
                                      {4996, 1, 1, 1}};
enum { ADAMW_NR = (int)(sizeof ADAMW_RG / sizeof ADAMW_RG[0]) };
static int adamw_range_of(int64_t i) {
    int r = 0;
    while (r < ADAMW_NR && !(i >= ADAMW_RG[r][0] && i < ADAMW_RG[r][0] + ADAMW_RG[r][1]))
        r++;
    return r;
}

/* Ranges as the training step makes them (runs of tensors with one decay rule, at any float
 * offset): each starts at a different offset mod 4, so the kernel's 16-byte groups begin
 * after 0-3 single elements and end before 0-3; one range is shorter than a group, one is the
 * moments at an offset p is not at (the one-element-a-thread form).  With the bf16 copy the
 * copy must be the new p rounded, bit for bit, and the floats outside the ranges untouched. */
static void test_adamw(void) {
    CT_CASE_BEGIN;
    const int64_t n = 5000;
    float *p = ct_rand(n, -1, 1), *m = ct_rand(n, -0.1f, 0.1f), *v = ct_rand(n, 0, 0.01f);
    float *g = ct_rand(n, -1, 1);
    float *d_p = ct_dev(p, n), *d_m = ct_dev(m, n), *d_v = ct_dev(v, n), *d_g = ct_dev(g, n);
    uint16_t *pb0 = (uint16_t *)ct_host(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        pb0[i] = 0x7fc1; /* a NaN no rounding gives: a float the step did not write shows */
    uint16_t *d_pb = (uint16_t *)ct_dev_bytes(pb0, sizeof(uint16_t) * (size_t)n);
    /* the constants policy/optimizer.c computes for step t = 3, lr 1e-3, wd 0.1, clip 0.5 */
    double lr = 1e-3, b1 = 0.9, b2 = 0.95, t = 3;
    arl_cuda_adamw_hp hp = {.coef = 0.5f,
                            .decay = (float)(1.0 - lr * 0.1),
                            .beta1 = (float)b1,
                            .beta2 = (float)b2,
                            .omb1 = (float)(1.0 - b1),
                            .omb2 = (float)(1.0 - b2),
                            .step_size = (float)(lr / (1.0 - pow(b1, t))),
                            .inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(b2, t))),
                            .eps = 1e-8f};
    /* ADAMW_RG: [4997, 5000) and [2, 3) are left out */
    const int64_t(*rg)[4] = ADAMW_RG;
    const int nr = ADAMW_NR;
    for (int r = 0; r < nr; r++) {
        const int64_t a = rg[r][0], len = rg[r][1];
        arl_cuda_adamw_step(d_p + a, rg[r][3] ? d_pb + a : NULL, d_m + a, d_v + a, d_g + a, len,
                            (int32_t)rg[r][2], &hp);
    }
    /* the moments one float off p's alignment: every range in the scalar form */
    float *mo = ct_copy_host(m, n);
    float *d_mo = ct_dev(NULL, n + 1) + 1; /* 4 bytes past the arena's 256-byte alignment */
    if (arl_cuda_upload(ct_ctx, d_mo, mo, sizeof(float) * (size_t)n) != ARL_OK) ct_die("upload");
    float *po = ct_copy_host(p, n), *vo = ct_copy_host(v, n);
    float *d_po = ct_dev(po, n), *d_vo = ct_dev(vo, n);
    arl_cuda_adamw_step(d_po + 4, NULL, d_mo + 4, d_vo + 4, d_g + 4, n - 4, 1, &hp);
    for (int r = 0; r < nr; r++) { /* the CPU step (policy/optimizer.c) on the same ranges */
        const int64_t a = rg[r][0];
        arl_optim_update(p + a, m + a, v + a, g + a, rg[r][1], (int32_t)rg[r][2], &hp);
    }
    arl_optim_update(po + 4, mo + 4, vo + 4, g + 4, n - 4, 1, &hp);
    /* the same float operations; nvcc's FMA contraction changes the last bit of m, v and
     * the update (step_size ~ 1e-3 of |p|): rtol 1e-6.  m = beta1 m + (1 - beta1) g sums two
     * terms of opposite signs up to 0.1 in size: a contracted FMA skips one rounding of a term,
     * up to 0.1 * 2^-24 = 6e-9 absolute, which cancellation leaves in a small m (seen on the
     * H200: 1.6e-9 at m = -1.15e-4), so m gets atol 2e-8 (two such roundings, with margin) */
    ct_check("adamw p", d_p, p, n, 1e-9, 1e-6);
    ct_check("adamw m", d_m, m, n, 2e-8, 1e-6);
    ct_check("adamw v", d_v, v, n, 1e-12, 1e-6);
    ct_check("adamw p (scalar form)", d_po, po, n, 1e-9, 1e-6);
    ct_check("adamw m (scalar form)", d_mo, mo, n, 2e-8, 1e-6);
    ct_check("adamw v (scalar form)", d_vo, vo, n, 1e-12, 1e-6);
    /* the bf16 copy: the device's own new p rounded, exactly; untouched outside the copies */
    float *ph = ct_get(d_p, n);
    uint16_t *pb = ct_get_u16(d_pb, n);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        const int r = adamw_range_of(i);
        const uint16_t want = r < nr && rg[r][3] ? arl_f32_to_bf16(ph[i]) : pb0[i];
        if (pb[i] != want && bad++ == 0) first = i;
    }
    CHECK_MSG(bad == 0, "adamw bf16 copy: %lld of %lld differ (first at %lld)", (long long)bad,
              (long long)n, (long long)first);
    free(p), free(m), free(v), free(g), free(pb0), free(mo), free(po), free(vo), free(ph), free(pb);
    CT_CASE_END;
}

/* ---------------------------------------------------------------- CUDA graph of a decode step */
static void test_graph(void) {
    CT_CASE_BEGIN;
    const int64_t H = 4, dk = 64, dv = 64, d = 256;
    const float scale = 0.125f;
    const arl_k_backend *kb = arl_cuda_backend();
    float *x = ct_rand(d, -1, 1), *w = ct_rand(d, 0.5f, 1.5f), *S0 = ct_rand(H * dk * dv, -1, 1);
    float *d_x = ct_dev(x, d), *d_w = ct_dev(w, d), *d_y = ct_dev(NULL, d);
    float *d_q = ct_dev(NULL, H * dk), *d_k = ct_dev(NULL, H * dk), *d_v = ct_dev(NULL, H * dv);
    float *d_g = ct_dev(NULL, H * dk), *d_b = ct_dev(NULL, H);
    float *d_o1 = ct_dev(NULL, H * dv), *d_o2 = ct_dev(NULL, H * dv);
    float *d_S1 = ct_dev(S0, H * dk * dv), *d_S2 = ct_dev(S0, H * dk * dv);
    /* the step: y = RMSNorm(x); one KDA token on state S (q, k, v, g, beta updated in place) */
    arl_cuda_graph *g = NULL;
    CHECK(arl_cuda_graph_begin(ct_ctx) == ARL_OK);
    kb->rmsnorm_fwd(d_y, NULL, d_x, d_w, 1, d, 1e-5f);
    arl_cuda_kda_recurrent_fwd(d_o1, d_S1, NULL, d_q, d_k, d_v, d_g, d_b, NULL, 1, 1, H, dk, dv,
                               scale, 1);
    CHECK_MSG(arl_cuda_graph_end(ct_ctx, &g) == ARL_OK, "%s", arl_error_msg());
    for (int step = 0; step < 3; step++) {
        float *q = ct_rand(H * dk, -1, 1), *k = ct_rand(H * dk, -1, 1), *v = ct_rand(H * dv, -1, 1);
        float *gg = ct_rand(H * dk, -5, 0), *b = ct_rand(H, 0, 1);
        l2rows(q, H, dk), l2rows(k, H, dk);
        arl_cuda_upload(ct_ctx, d_q, q, sizeof(float) * H * dk);
        arl_cuda_upload(ct_ctx, d_k, k, sizeof(float) * H * dk);
        arl_cuda_upload(ct_ctx, d_v, v, sizeof(float) * H * dv);
        arl_cuda_upload(ct_ctx, d_g, gg, sizeof(float) * H * dk);
        arl_cuda_upload(ct_ctx, d_b, b, sizeof(float) * H);
        if (g) CHECK(arl_cuda_graph_launch(ct_ctx, g) == ARL_OK);
        arl_cuda_kda_recurrent_fwd(d_o2, d_S2, NULL, d_q, d_k, d_v, d_g, d_b, NULL, 1, 1, H, dk, dv,
                                   scale, 1);
        /* the same kernels on the same inputs: bit-identical */
        float *o2 = ct_get(d_o2, H * dv);
        ct_check("graph replay o", d_o1, o2, H * dv, 0, 0);
        free(o2), free(q), free(k), free(v), free(gg), free(b);
    }
    float *S2 = ct_get(d_S2, H * dk * dv);
    ct_check("graph replay S", d_S1, S2, H * dk * dv, 0, 0);
    float *y = ct_host(sizeof(float) * d);
    arl_k_rmsnorm_fwd(y, NULL, x, w, 1, d, 1e-5f);
    ct_check("graph replay rmsnorm", d_y, y, d, 2e-6, 1e-5);
    arl_cuda_graph_free(g);
    free(x), free(w), free(S0), free(S2), free(y);
    CT_CASE_END;
}

int main(void) {
    ct_init((size_t)512 << 20);
    TEST_RUN(test_conv);
    TEST_RUN(test_kda);
    TEST_RUN(test_kda_many_docs);
    TEST_RUN(test_mla);
    TEST_RUN(test_mla_absorbed_split);
    TEST_RUN(test_attnres);
    TEST_RUN(test_router);
    TEST_RUN(test_qb);
    TEST_RUN(test_moe_plan);
    TEST_RUN(test_moe);
    TEST_RUN(test_moe_wide);
    TEST_RUN(test_adamw);
    TEST_RUN(test_mla_tc);
    TEST_RUN(test_graph);
    arl_cuda_close(ct_ctx);
    return test_finish();
}
