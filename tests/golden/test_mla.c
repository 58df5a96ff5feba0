/* tests/golden/test_mla.c: policy/mla.c against the golden cases mla_prefill and
 * mla_decode_absorbed (spec/policy.md 4.1-4.5, 16.2), the naive form against the absorbed form
 * (C vs C), block-sparse selection covering every chunk against dense, a whole gated MLA layer
 * composed from the kernels (prefill, token-by-token decode, backward) and a finite-difference
 * check of the attention backward.
 *
 * Tolerances: spec 16.4 gives MLA the max|ref| form; atol = 0, rtol = 1e-4 for forward values
 * and 1e-3 for gradients, the KDA values: fp32 dot products of n + r = 12..48 terms, a softmax
 * over at most 22 keys and the projections of the layer give relative errors ~1e-6, the
 * backward chains several products (~1e-5); a wrong mask, scale or head offset gives errors of
 * order max|ref|.  Selections (integer) must match exactly.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "policy/mla.h"
#include "tests/golden/fdcheck.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#define RTOL_FWD 1e-4 /* see the file comment */
#define RTOL_BWD 1e-3

enum { D = 32, HM = 2, NN = 8, RR = 4, VM = 12, RQ = 24, RKV = 16, TT = 35, ND = 2 };

static void cmp(golden_case *gc, const char *name, const float *a, int64_t n, double rtol) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, rtol);
}

typedef struct mla_w {
    float *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b, *g_proj, *o_proj;
} mla_w;

static mla_w load_w(golden_case *gc) {
    mla_w w = {
        .q_a = golden_f32(gc, "q_a_proj", RQ * D),
        .q_a_norm = golden_f32(gc, "q_a_layernorm", RQ),
        .q_b = golden_f32(gc, "q_b_proj", HM * (NN + RR) * RQ),
        .kv_a = golden_f32(gc, "kv_a_proj_with_mqa", (RKV + RR) * D),
        .kv_a_norm = golden_f32(gc, "kv_a_layernorm", RKV),
        .kv_b = golden_f32(gc, "kv_b_proj", HM * (NN + VM) * RKV),
        .g_proj = golden_f32(gc, "g_proj", HM * VM * D),
        .o_proj = golden_f32(gc, "o_proj", D * HM * VM),
    };
    return w;
}

/* Columns [c0, c0+w) of rows of width ld -> dst (rows, w), or back (add != 0: dst +=). */
static void split_cols(float *dst, const float *src, int64_t rows, int64_t ld, int64_t c0,
                       int64_t w) {
    for (int64_t t = 0; t < rows; t++)
        memcpy(dst + t * w, src + t * ld + c0, sizeof(float) * w);
}

static void merge_cols(float *dst, const float *src, int64_t rows, int64_t ld, int64_t c0,
                       int64_t w) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < w; i++)
            dst[t * ld + c0 + i] += src[t * w + i];
}

/* Per-head split of (T, Hm*(a+b)) rows into (T, Hm, a) and (T, Hm, b), and the reverse (+=). */
static void split_heads(float *A, float *B, const float *src, int64_t T, int64_t a, int64_t b) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < HM; h++) {
            memcpy(A + (t * HM + h) * a, src + (t * HM + h) * (a + b), sizeof(float) * a);
            memcpy(B + (t * HM + h) * b, src + (t * HM + h) * (a + b) + a, sizeof(float) * b);
        }
}

static void merge_heads(float *dst, const float *A, const float *B, int64_t T, int64_t a,
                        int64_t b) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < HM; h++) {
            for (int64_t i = 0; i < a; i++)
                dst[(t * HM + h) * (a + b) + i] += A[(t * HM + h) * a + i];
            for (int64_t i = 0; i < b; i++)
                dst[(t * HM + h) * (a + b) + a + i] += B[(t * HM + h) * b + i];
        }
}

typedef struct mla_act {
    float *cq_pre, *rq, *cq, *qn, *qp, *ct, *rc, *c, *kpe, *kn, *v, *o, *lse, *gl, *gated, *y;
} mla_act;

/* The layer of spec 4.1 on x (T, D) over documents cu, from the kernels and the core. */
static mla_act layer_fwd(golden_case *gc, const mla_w *w, const float *x, const int32_t *cu,
                         int32_t N, int64_t T) {
    mla_act a;
    float *qf = golden_zeros(gc, T * HM * (NN + RR)), *ckv = golden_zeros(gc, T * (RKV + RR));
    float *kv = golden_zeros(gc, T * HM * (NN + VM));
    a.cq_pre = golden_zeros(gc, T * RQ);
    a.rq = golden_zeros(gc, T);
    a.cq = golden_zeros(gc, T * RQ);
    arl_k_linear_fwd(a.cq_pre, x, w->q_a, T, D, RQ);
    arl_k_rmsnorm_fwd(a.cq, a.rq, a.cq_pre, w->q_a_norm, T, RQ, 1e-6f);
    arl_k_linear_fwd(qf, a.cq, w->q_b, T, RQ, HM * (NN + RR));
    a.qn = golden_zeros(gc, T * HM * NN);
    a.qp = golden_zeros(gc, T * HM * RR);
    split_heads(a.qn, a.qp, qf, T, NN, RR);
    arl_k_linear_fwd(ckv, x, w->kv_a, T, D, RKV + RR);
    a.ct = golden_zeros(gc, T * RKV);
    a.kpe = golden_zeros(gc, T * RR);
    split_cols(a.ct, ckv, T, RKV + RR, 0, RKV);
    split_cols(a.kpe, ckv, T, RKV + RR, RKV, RR);
    a.rc = golden_zeros(gc, T);
    a.c = golden_zeros(gc, T * RKV);
    arl_k_rmsnorm_fwd(a.c, a.rc, a.ct, w->kv_a_norm, T, RKV, 1e-6f);
    arl_k_linear_fwd(kv, a.c, w->kv_b, T, RKV, HM * (NN + VM));
    a.kn = golden_zeros(gc, T * HM * NN);
    a.v = golden_zeros(gc, T * HM * VM);
    split_heads(a.kn, a.v, kv, T, NN, VM);
    a.o = golden_zeros(gc, T * HM * VM);
    a.lse = golden_zeros(gc, T * HM);
    float *ws = golden_zeros(gc, arl_mla_attn_ws_floats(T, HM, RR));
    arl_mla_attn_fwd(a.o, a.lse, a.qn, a.qp, a.kn, a.kpe, a.v, cu, N, T, HM, NN, RR, VM,
                     1.0f / sqrtf((float)(NN + RR)), ws);
    a.gl = golden_zeros(gc, T * HM * VM);
    a.gated = golden_zeros(gc, T * HM * VM);
    arl_k_linear_fwd(a.gl, x, w->g_proj, T, D, HM * VM);
    arl_k_sigmoid_fwd(a.gated, a.gl, T * HM * VM);
    for (int64_t i = 0; i < T * HM * VM; i++)
        a.gated[i] *= a.o[i];
    a.y = golden_zeros(gc, T * D);
    arl_k_linear_fwd(a.y, a.gated, w->o_proj, T, HM * VM, D);
    return a;
}

static void test_mla_prefill(void) {
    golden_case *gc = golden_open("mla_prefill");
    int32_t *cu = golden_i32(gc, "cu_seqlens", ND + 1);
    mla_w w = load_w(gc);
    float *x = golden_f32(gc, "x", TT * D), *dy = golden_f32(gc, "dy", TT * D);
    const float scale = 1.0f / sqrtf((float)(NN + RR));

    /* the core alone on the reference intermediates */
    float *qn = golden_f32(gc, "q_nope", TT * HM * NN), *qp = golden_f32(gc, "q_pe", TT * HM * RR);
    float *kn = golden_f32(gc, "k_nope", TT * HM * NN), *kp = golden_f32(gc, "k_pe", TT * RR);
    float *v = golden_f32(gc, "v", TT * HM * VM), *dO = golden_f32(gc, "do_core", TT * HM * VM);
    float *o = golden_zeros(gc, TT * HM * VM), *lse = golden_zeros(gc, TT * HM);
    float *ws = golden_zeros(gc, arl_mla_attn_ws_floats(TT, HM, RR));
    arl_mla_attn_fwd(o, lse, qn, qp, kn, kp, v, cu, ND, TT, HM, NN, RR, VM, scale, ws);
    cmp(gc, "o", o, TT * HM * VM, RTOL_FWD);
    float *dqn = golden_zeros(gc, TT * HM * NN), *dqp = golden_zeros(gc, TT * HM * RR);
    float *dkn = golden_zeros(gc, TT * HM * NN), *dkp = golden_zeros(gc, TT * RR);
    float *dv = golden_zeros(gc, TT * HM * VM);
    arl_mla_attn_bwd(dqn, dqp, dkn, dkp, dv, dO, o, lse, qn, qp, kn, kp, v, cu, ND, TT, HM, NN, RR,
                     VM, scale, ws);
    cmp(gc, "dq_nope", dqn, TT * HM * NN, RTOL_BWD);
    cmp(gc, "dq_pe", dqp, TT * HM * RR, RTOL_BWD);
    cmp(gc, "dk_nope", dkn, TT * HM * NN, RTOL_BWD);
    cmp(gc, "dk_pe", dkp, TT * RR, RTOL_BWD);
    cmp(gc, "dv", dv, TT * HM * VM, RTOL_BWD);

    /* the whole layer, forward */
    mla_act a = layer_fwd(gc, &w, x, cu, ND, TT);
    cmp(gc, "q_nope", a.qn, TT * HM * NN, RTOL_FWD);
    cmp(gc, "c", a.c, TT * RKV, RTOL_FWD);
    cmp(gc, "k_pe", a.kpe, TT * RR, RTOL_FWD);
    cmp(gc, "v", a.v, TT * HM * VM, RTOL_FWD);
    cmp(gc, "o", a.o, TT * HM * VM, RTOL_FWD);
    cmp(gc, "y", a.y, TT * D, RTOL_FWD);

    /* the whole layer, backward (spec 4.3 output gate, core, RMSNorms of 3.9, Linears) */
    const int64_t T = TT;
    float *dx = golden_zeros(gc, T * D), *dgated = golden_zeros(gc, T * HM * VM);
    float *G_o = golden_zeros(gc, D * HM * VM), *G_g = golden_zeros(gc, HM * VM * D);
    arl_k_linear_bwd_w(G_o, dy, a.gated, T, HM * VM, D);
    arl_k_linear_bwd_x(dgated, dy, w.o_proj, T, HM * VM, D);
    float *du = golden_zeros(gc, T * HM * VM), *tmp = golden_zeros(gc, T * HM * VM);
    float *dgl = golden_zeros(gc, T * HM * VM), *sg = golden_zeros(gc, T * HM * VM);
    arl_k_sigmoid_fwd(sg, a.gl, T * HM * VM);
    for (int64_t i = 0; i < T * HM * VM; i++) {
        du[i] = dgated[i] * sg[i];
        tmp[i] = dgated[i] * a.o[i];
    }
    arl_k_sigmoid_bwd(dgl, tmp, a.gl, T * HM * VM);
    arl_k_linear_bwd_w(G_g, dgl, x, T, D, HM * VM);
    arl_k_linear_bwd_x(dx, dgl, w.g_proj, T, D, HM * VM);
    float *Lqn = golden_zeros(gc, T * HM * NN), *Lqp = golden_zeros(gc, T * HM * RR);
    float *Lkn = golden_zeros(gc, T * HM * NN), *Lkp = golden_zeros(gc, T * RR);
    float *Lv = golden_zeros(gc, T * HM * VM);
    arl_mla_attn_bwd(Lqn, Lqp, Lkn, Lkp, Lv, du, a.o, a.lse, a.qn, a.qp, a.kn, a.kpe, a.v, cu, ND,
                     T, HM, NN, RR, VM, scale, ws);
    float *dkv = golden_zeros(gc, T * HM * (NN + VM)), *dc = golden_zeros(gc, T * RKV);
    float *G_kvb = golden_zeros(gc, HM * (NN + VM) * RKV);
    merge_heads(dkv, Lkn, Lv, T, NN, VM);
    arl_k_linear_bwd_w(G_kvb, dkv, a.c, T, RKV, HM * (NN + VM));
    arl_k_linear_bwd_x(dc, dkv, w.kv_b, T, RKV, HM * (NN + VM));
    float *dct = golden_zeros(gc, T * RKV), *G_kvan = golden_zeros(gc, RKV);
    arl_k_rmsnorm_bwd(dct, G_kvan, dc, a.ct, w.kv_a_norm, a.rc, T, RKV);
    float *dckv = golden_zeros(gc, T * (RKV + RR)), *G_kva = golden_zeros(gc, (RKV + RR) * D);
    merge_cols(dckv, dct, T, RKV + RR, 0, RKV);
    merge_cols(dckv, Lkp, T, RKV + RR, RKV, RR);
    arl_k_linear_bwd_w(G_kva, dckv, x, T, D, RKV + RR);
    arl_k_linear_bwd_x(dx, dckv, w.kv_a, T, D, RKV + RR);
    float *dqf = golden_zeros(gc, T * HM * (NN + RR)), *dcq = golden_zeros(gc, T * RQ);
    float *G_qb = golden_zeros(gc, HM * (NN + RR) * RQ);
    merge_heads(dqf, Lqn, Lqp, T, NN, RR);
    arl_k_linear_bwd_w(G_qb, dqf, a.cq, T, RQ, HM * (NN + RR));
    arl_k_linear_bwd_x(dcq, dqf, w.q_b, T, RQ, HM * (NN + RR));
    float *dcqp = golden_zeros(gc, T * RQ), *G_qan = golden_zeros(gc, RQ);
    float *G_qa = golden_zeros(gc, RQ * D);
    arl_k_rmsnorm_bwd(dcqp, G_qan, dcq, a.cq_pre, w.q_a_norm, a.rq, T, RQ);
    arl_k_linear_bwd_w(G_qa, dcqp, x, T, D, RQ);
    arl_k_linear_bwd_x(dx, dcqp, w.q_a, T, D, RQ);
    cmp(gc, "dx", dx, T * D, RTOL_BWD);
    cmp(gc, "do_proj", G_o, D * HM * VM, RTOL_BWD);
    cmp(gc, "dg_proj", G_g, HM * VM * D, RTOL_BWD);
    cmp(gc, "dkv_b_proj", G_kvb, HM * (NN + VM) * RKV, RTOL_BWD);
    cmp(gc, "dkv_a_layernorm", G_kvan, RKV, RTOL_BWD);
    cmp(gc, "dkv_a_proj_with_mqa", G_kva, (RKV + RR) * D, RTOL_BWD);
    cmp(gc, "dq_b_proj", G_qb, HM * (NN + RR) * RQ, RTOL_BWD);
    cmp(gc, "dq_a_layernorm", G_qan, RQ, RTOL_BWD);
    cmp(gc, "dq_a_proj", G_qa, RQ * D, RTOL_BWD);
    golden_close(gc);
}

static void test_mla_decode_absorbed(void) {
    golden_case *gc = golden_open("mla_decode_absorbed");
    int32_t *cu = golden_i32(gc, "cu_seqlens", ND + 1);
    mla_w w = load_w(gc);
    const float scale = 1.0f / sqrtf((float)(NN + RR));
    float *qn = golden_f32(gc, "q_nope", TT * HM * NN), *qp = golden_f32(gc, "q_pe", TT * HM * RR);
    float *c = golden_f32(gc, "c", TT * RKV), *kp = golden_f32(gc, "k_pe", TT * RR);
    float *qhat = golden_zeros(gc, TT * HM * RKV);
    arl_mla_absorb_q(qhat, qn, w.kv_b, TT, HM, NN, VM, RKV);
    cmp(gc, "qhat", qhat, TT * HM * RKV, RTOL_FWD);
    /* latent cache rows [c; k_pe] of the batch (each document uses its own rows) */
    float *cache = golden_zeros(gc, TT * (RKV + RR));
    for (int64_t t = 0; t < TT; t++) {
        memcpy(cache + t * (RKV + RR), c + t * RKV, sizeof(float) * RKV);
        memcpy(cache + t * (RKV + RR) + RKV, kp + t * RR, sizeof(float) * RR);
    }
    float *ohat = golden_zeros(gc, TT * HM * RKV), *ohat_sp = golden_zeros(gc, TT * HM * RKV);
    float *ohat_all = golden_zeros(gc, TT * HM * RKV);
    const int64_t NC = 4, KC = 2, SELW = 6;
    uint8_t *sel = calloc((size_t)(TT * HM * SELW), 1);
    float *ws = golden_zeros(gc, arl_mla_absorbed_ws_floats(TT, RKV, RR, NC));
    for (int32_t di = 0; di < ND; di++) {
        int64_t a = cu[di], n = cu[di + 1] - cu[di];
        const float *qh = qhat + a * HM * RKV, *qpp = qp + a * HM * RR,
                    *ca = cache + a * (RKV + RR);
        arl_mla_absorbed_attn(ohat + a * HM * RKV, NULL, 0, qh, qpp, ca, 0, n, HM, RKV, RR, scale,
                              0, 0, ws);
        arl_mla_absorbed_attn(ohat_sp + a * HM * RKV, sel + a * HM * SELW, SELW, qh, qpp, ca, 0, n,
                              HM, RKV, RR, scale, NC, KC, ws);
        arl_mla_absorbed_attn(ohat_all + a * HM * RKV, NULL, 0, qh, qpp, ca, 0, n, HM, RKV, RR,
                              scale, NC, 1000, ws);
    }
    cmp(gc, "ohat", ohat, TT * HM * RKV, RTOL_FWD);
    float *o = golden_zeros(gc, TT * HM * VM), *o_sp = golden_zeros(gc, TT * HM * VM);
    arl_mla_expand_o(o, ohat, w.kv_b, TT, HM, NN, VM, RKV);
    arl_mla_expand_o(o_sp, ohat_sp, w.kv_b, TT, HM, NN, VM, RKV);
    cmp(gc, "o", o, TT * HM * VM, RTOL_FWD);
    cmp(gc, "o_sparse", o_sp, TT * HM * VM, RTOL_FWD);
    /* selections are integers: exact */
    int64_t *sel_ref = golden_i64(gc, "sel", TT * HM * SELW);
    int mism = 0;
    for (int64_t i = 0; i < TT * HM * SELW; i++)
        mism += sel_ref[i] != sel[i];
    CHECK_EQ_INT(mism, 0);
    /* k_c covering every chunk equals dense (C vs C: same fp32 sums, rtol 1e-6) */
    check_close_maxref_f32("block-sparse all chunks vs dense", ohat_all, ohat,
                           (size_t)(TT * HM * RKV), 0, 1e-6);
    /* naive (expanded) vs absorbed in C, on the same reference intermediates */
    float *kn = golden_zeros(gc, TT * HM * NN), *v = golden_zeros(gc, TT * HM * VM);
    float *kv = golden_zeros(gc, TT * HM * (NN + VM)), *o_naive = golden_zeros(gc, TT * HM * VM);
    arl_k_linear_fwd(kv, c, w.kv_b, TT, RKV, HM * (NN + VM));
    split_heads(kn, v, kv, TT, NN, VM);
    float *aws = golden_zeros(gc, arl_mla_attn_ws_floats(TT, HM, RR));
    arl_mla_attn_fwd(o_naive, NULL, qn, qp, kn, kp, v, cu, ND, TT, HM, NN, RR, VM, scale, aws);
    check_close_maxref_f32("naive vs absorbed o", o, o_naive, (size_t)(TT * HM * VM), 0, RTOL_FWD);

    /* token-by-token decode of the whole layer, one latent cache per document */
    float *x = golden_f32(gc, "x", TT * D), *ydec = golden_zeros(gc, TT * D);
    float *lcache = golden_zeros(gc, TT * (RKV + RR));
    float cq_pre[RQ], cq[RQ], qf[HM * (NN + RR)], qn1[HM * NN], qp1[HM * RR], ckv[RKV + RR];
    float qh1[HM * RKV], oh1[HM * RKV], o1[HM * VM], gl[HM * VM], gated[HM * VM];
    for (int32_t di = 0; di < ND; di++) {
        for (int64_t t = cu[di]; t < cu[di + 1]; t++) {
            int64_t pos = t - cu[di];
            const float *xt = x + t * D;
            arl_k_linear_fwd(cq_pre, xt, w.q_a, 1, D, RQ);
            arl_k_rmsnorm_fwd(cq, NULL, cq_pre, w.q_a_norm, 1, RQ, 1e-6f);
            arl_k_linear_fwd(qf, cq, w.q_b, 1, RQ, HM * (NN + RR));
            split_heads(qn1, qp1, qf, 1, NN, RR);
            arl_k_linear_fwd(ckv, xt, w.kv_a, 1, D, RKV + RR);
            float *row = lcache + pos * (RKV + RR); /* append [c; k_pe] */
            arl_k_rmsnorm_fwd(row, NULL, ckv, w.kv_a_norm, 1, RKV, 1e-6f);
            memcpy(row + RKV, ckv + RKV, sizeof(float) * RR);
            arl_mla_absorb_q(qh1, qn1, w.kv_b, 1, HM, NN, VM, RKV);
            arl_mla_absorbed_attn(oh1, NULL, 0, qh1, qp1, lcache, pos, 1, HM, RKV, RR, scale, 0, 0,
                                  ws);
            arl_mla_expand_o(o1, oh1, w.kv_b, 1, HM, NN, VM, RKV);
            arl_k_linear_fwd(gl, xt, w.g_proj, 1, D, HM * VM);
            arl_k_sigmoid_fwd(gated, gl, HM * VM);
            for (int i = 0; i < HM * VM; i++)
                gated[i] *= o1[i];
            arl_k_linear_fwd(ydec + t * D, gated, w.o_proj, 1, HM * VM, D);
        }
    }
    cmp(gc, "y_decode", ydec, TT * D, RTOL_FWD);
    free(sel);
    golden_close(gc);
}

/* ---- finite differences of the attention backward on a tiny packed batch ---- */

enum { FT = 5, FHM = 2, FN = 3, FR = 2, FVM = 2 };
typedef struct fd_attn {
    float qn[FT * FHM * FN], qp[FT * FHM * FR], kn[FT * FHM * FN], kp[FT * FR], v[FT * FHM * FVM];
    float up[FT * FHM * FVM];
    int32_t cu[3];
} fd_attn;

static double fd_attn_loss(void *vctx) {
    fd_attn *f = vctx;
    float o[FT * FHM * FVM], ws[4096];
    ARL_ASSERT(arl_mla_attn_ws_floats(FT, FHM, FR) <= 4096);
    arl_mla_attn_fwd(o, NULL, f->qn, f->qp, f->kn, f->kp, f->v, f->cu, 2, FT, FHM, FN, FR, FVM,
                     0.6f, ws);
    double L = 0.0;
    for (int i = 0; i < FT * FHM * FVM; i++)
        L += (double)o[i] * f->up[i];
    return L;
}

static void fill(arl_rng *r, float *x, int n) {
    for (int i = 0; i < n; i++)
        x[i] = (float)(2.0 * arl_rng_uniform(r) - 1.0);
}

static void test_mla_attn_fd(void) {
    arl_rng r;
    arl_rng_seed(&r, 21);
    fd_attn f;
    fill(&r, f.qn, FT * FHM * FN);
    fill(&r, f.qp, FT * FHM * FR);
    fill(&r, f.kn, FT * FHM * FN);
    fill(&r, f.kp, FT * FR);
    fill(&r, f.v, FT * FHM * FVM);
    fill(&r, f.up, FT * FHM * FVM);
    f.cu[0] = 0;
    f.cu[1] = 2;
    f.cu[2] = FT;
    float o[FT * FHM * FVM], lse[FT * FHM], ws[4096];
    arl_mla_attn_fwd(o, lse, f.qn, f.qp, f.kn, f.kp, f.v, f.cu, 2, FT, FHM, FN, FR, FVM, 0.6f, ws);
    float dqn[FT * FHM * FN] = {0}, dqp[FT * FHM * FR] = {0}, dkn[FT * FHM * FN] = {0};
    float dkp[FT * FR] = {0}, dv[FT * FHM * FVM] = {0};
    arl_mla_attn_bwd(dqn, dqp, dkn, dkp, dv, f.up, o, lse, f.qn, f.qp, f.kn, f.kp, f.v, f.cu, 2, FT,
                     FHM, FN, FR, FVM, 0.6f, ws);
    fd_check("fd mla dq_nope", f.qn, dqn, FT * FHM * FN, fd_attn_loss, &f, 1e-2f);
    fd_check("fd mla dq_pe", f.qp, dqp, FT * FHM * FR, fd_attn_loss, &f, 1e-2f);
    fd_check("fd mla dk_nope", f.kn, dkn, FT * FHM * FN, fd_attn_loss, &f, 1e-2f);
    fd_check("fd mla dk_pe", f.kp, dkp, FT * FR, fd_attn_loss, &f, 1e-2f);
    fd_check("fd mla dv", f.v, dv, FT * FHM * FVM, fd_attn_loss, &f, 1e-2f);
}

int main(void) {
    TEST_RUN(test_mla_prefill);
    TEST_RUN(test_mla_decode_absorbed);
    TEST_RUN(test_mla_attn_fd);
    return test_finish();
}
