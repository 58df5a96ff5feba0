/* tests/golden/test_kda.c: policy/kda.c against the golden vectors of spec/policy.md 16.2
 * (kda_recurrent, kda_chunk_16, kda_chunk_64, kda_varlen, kda_gate_k3, kda_gate_softplus,
 * kda_layer), the recurrent form against the chunkwise form (C vs C, spec STYLE rule 15),
 * and finite-difference checks of every backward on tiny shapes.
 *
 * Tolerances (spec 16.4): KDA comparisons use the max|ref| form
 *   |a_i - ref_i| <= atol + rtol * max_j |ref_j|   with atol = 0,
 * rtol = 1e-4 for forward outputs and 1e-3 for gradients: the fp32 core runs reductions over
 * dk and dv per token and a state carried over up to 107 tokens (forward), and the backward
 * chains several such reductions (chunk form: triangular inverse, four products per chunk),
 * so relative errors of 1e-6..1e-5 are expected and 1e-4 / 1e-3 leave a margin of 10-100
 * while any missing term (errors of order max|ref|) fails.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/threadpool.h"
#include "policy/kda.h"
#include "tests/golden/fdcheck.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#ifndef RTOL_FWD
#define RTOL_FWD 1e-4 /* spec 16.4, KDA forward (see the file comment) */
#endif
#ifndef RTOL_BWD
#define RTOL_BWD 1e-3 /* spec 16.4, KDA backward */
#endif

/* max|ref| comparison of a (n) with the golden tensor NAME. */
static void cmp(golden_case *gc, const char *name, const float *a, int64_t n, double rtol) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, rtol);
}

/* ---- the core on kda_recurrent / kda_chunk_* inputs ---- */

typedef struct core_case {
    golden_case *gc;
    int64_t T, H, dk, dv;
    float scale;
    float *q, *k, *v, *g, *beta, *h0, *d_o, *dht;
} core_case;

static core_case core_load(const char *name) {
    core_case c = {.gc = golden_open(name), .T = 100, .H = 2, .dk = 32, .dv = 16};
    c.scale = 1.0f / sqrtf((float)c.dk);
    int64_t T = c.T, H = c.H, dk = c.dk, dv = c.dv;
    c.q = golden_f32(c.gc, "q", T * H * dk);
    c.k = golden_f32(c.gc, "k", T * H * dk);
    c.v = golden_f32(c.gc, "v", T * H * dv);
    c.g = golden_f32(c.gc, "g", T * H * dk);
    c.beta = golden_f32(c.gc, "beta", T * H);
    c.h0 = golden_f32(c.gc, "h0", H * dk * dv);
    c.d_o = golden_f32(c.gc, "do", T * H * dv);
    c.dht = golden_f32(c.gc, "dht", H * dk * dv);
    return c;
}

typedef struct core_out {
    float *o, *S, *cst, *dq, *dk, *dv, *dg, *dbeta, *dS0;
} core_out;

/* Forward (recurrent or chunk with chunk length C) and backward (recurrent or chunk rule). */
static core_out core_run(core_case *c, int chunk_fwd, int chunk_bwd, int64_t C) {
    int64_t T = c->T, H = c->H, dk = c->dk, dv = c->dv;
    golden_case *gc = c->gc;
    core_out r;
    int64_t nch = arl_kda_num_chunks(NULL, 1, T, C);
    r.o = golden_zeros(gc, T * H * dv);
    r.S = golden_zeros(gc, H * dk * dv);
    r.cst = golden_zeros(gc, nch * H * dk * dv);
    memcpy(r.S, c->h0, sizeof(float) * H * dk * dv);
    if (chunk_fwd) {
        float *ws = golden_zeros(gc, arl_kda_chunk_ws_floats(H, dk, dv, C));
        arl_kda_chunk_fwd(r.o, r.S, r.cst, c->q, c->k, c->v, c->g, c->beta, NULL, 1, T, H, dk, dv,
                          c->scale, C, ws);
    } else {
        arl_kda_recurrent_fwd(r.o, r.S, r.cst, c->q, c->k, c->v, c->g, c->beta, NULL, 1, T, H, dk,
                              dv, c->scale, C);
    }
    r.dq = golden_zeros(gc, T * H * dk);
    r.dk = golden_zeros(gc, T * H * dk);
    r.dv = golden_zeros(gc, T * H * dv);
    r.dg = golden_zeros(gc, T * H * dk);
    r.dbeta = golden_zeros(gc, T * H);
    r.dS0 = golden_zeros(gc, H * dk * dv);
    float *ws = golden_zeros(gc, arl_kda_bwd_ws_floats(H, dk, dv, C));
    (chunk_bwd ? arl_kda_chunk_bwd : arl_kda_recurrent_bwd)(
        r.dq, r.dk, r.dv, r.dg, r.dbeta, r.dS0, c->d_o, c->dht, c->q, c->k, c->v, c->g, c->beta,
        r.cst, NULL, 1, T, H, dk, dv, c->scale, C, ws);
    return r;
}

static void core_compare(core_case *c, const core_out *r) {
    int64_t T = c->T, H = c->H, dk = c->dk, dv = c->dv;
    cmp(c->gc, "o", r->o, T * H * dv, RTOL_FWD);
    cmp(c->gc, "ht", r->S, H * dk * dv, RTOL_FWD);
    cmp(c->gc, "dq", r->dq, T * H * dk, RTOL_BWD);
    cmp(c->gc, "dk", r->dk, T * H * dk, RTOL_BWD);
    cmp(c->gc, "dv", r->dv, T * H * dv, RTOL_BWD);
    cmp(c->gc, "dg", r->dg, T * H * dk, RTOL_BWD);
    cmp(c->gc, "dbeta", r->dbeta, T * H, RTOL_BWD);
    cmp(c->gc, "dh0", r->dS0, H * dk * dv, RTOL_BWD);
}

static void test_kda_recurrent(void) {
    core_case c = core_load("kda_recurrent");
    core_out r = core_run(&c, 0, 0, 16);
    core_compare(&c, &r);
    golden_close(c.gc);
}

static void test_kda_chunk(int64_t C) {
    core_case c = core_load(C == 16 ? "kda_chunk_16" : "kda_chunk_64");
    core_out r = core_run(&c, 1, 1, C);
    core_compare(&c, &r);
    cmp(c.gc, "chunk_states", r.cst, arl_kda_num_chunks(NULL, 1, c.T, C) * c.H * c.dk * c.dv,
        RTOL_FWD);
    /* C vs C: the recurrent form and rule on the same inputs.  Same tolerances as against the
     * float64 reference: both sides are fp32 computations of the same quantities. */
    core_out q = core_run(&c, 0, 0, C);
    int64_t T = c.T, H = c.H, dk = c.dk, dv = c.dv;
    check_close_maxref_f32("chunk vs recurrent o", r.o, q.o, (size_t)(T * H * dv), 0, RTOL_FWD);
    check_close_maxref_f32("chunk vs recurrent S", r.S, q.S, (size_t)(H * dk * dv), 0, RTOL_FWD);
    check_close_maxref_f32("chunk vs recurrent chunk states", r.cst, q.cst,
                           (size_t)(arl_kda_num_chunks(NULL, 1, T, C) * H * dk * dv), 0, RTOL_FWD);
    check_close_maxref_f32("chunk vs recurrent dq", r.dq, q.dq, (size_t)(T * H * dk), 0, RTOL_BWD);
    check_close_maxref_f32("chunk vs recurrent dk", r.dk, q.dk, (size_t)(T * H * dk), 0, RTOL_BWD);
    check_close_maxref_f32("chunk vs recurrent dv", r.dv, q.dv, (size_t)(T * H * dv), 0, RTOL_BWD);
    check_close_maxref_f32("chunk vs recurrent dg", r.dg, q.dg, (size_t)(T * H * dk), 0, RTOL_BWD);
    check_close_maxref_f32("chunk vs recurrent dbeta", r.dbeta, q.dbeta, (size_t)(T * H), 0,
                           RTOL_BWD);
    check_close_maxref_f32("chunk vs recurrent dS0", r.dS0, q.dS0, (size_t)(H * dk * dv), 0,
                           RTOL_BWD);
    golden_close(c.gc);
}

static void test_kda_chunk_16(void) {
    test_kda_chunk(16);
}

static void test_kda_chunk_64(void) {
    test_kda_chunk(64);
}

/* Odd chunk lengths (1, 5, 100 > T) give the same result as the recurrence. */
static void test_kda_chunk_lengths(void) {
    core_case c = core_load("kda_recurrent");
    int64_t T = c.T, H = c.H, dk = c.dk, dv = c.dv;
    core_out ref = core_run(&c, 0, 0, 16);
    int64_t Cs[] = {1, 5, 128};
    for (int i = 0; i < 3; i++) {
        core_out r = core_run(&c, 1, 1, Cs[i]);
        char w[64];
        snprintf(w, sizeof w, "C=%lld o", (long long)Cs[i]);
        check_close_maxref_f32(w, r.o, ref.o, (size_t)(T * H * dv), 0, RTOL_FWD);
        snprintf(w, sizeof w, "C=%lld dg", (long long)Cs[i]);
        check_close_maxref_f32(w, r.dg, ref.dg, (size_t)(T * H * dk), 0, RTOL_BWD);
        snprintf(w, sizeof w, "C=%lld dS0", (long long)Cs[i]);
        check_close_maxref_f32(w, r.dS0, ref.dS0, (size_t)(H * dk * dv), 0, RTOL_BWD);
    }
    golden_close(c.gc);
}

/* STYLE rule 21: bit-identical results for any thread count (heads run in parallel, each
 * with its own work buffer; the per-chunk GEMMs are below the kernels' split size). */
static void test_kda_threads(void) {
    core_case c = core_load("kda_chunk_16");
    int64_t T = c.T, H = c.H, dk = c.dk, dv = c.dv;
    core_out r[2][2];
    int threads[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        CHECK(arl_k_threads_init(threads[i]) == ARL_OK);
        r[i][0] = core_run(&c, 1, 1, 16);
        r[i][1] = core_run(&c, 0, 0, 16);
    }
    CHECK(arl_k_threads_init(ARL_K_THREADS_DEFAULT) == ARL_OK);
    for (int f = 0; f < 2; f++) {
        CHECK(memcmp(r[0][f].o, r[1][f].o, sizeof(float) * T * H * dv) == 0);
        CHECK(memcmp(r[0][f].S, r[1][f].S, sizeof(float) * H * dk * dv) == 0);
        CHECK(memcmp(r[0][f].dq, r[1][f].dq, sizeof(float) * T * H * dk) == 0);
        CHECK(memcmp(r[0][f].dg, r[1][f].dg, sizeof(float) * T * H * dk) == 0);
        CHECK(memcmp(r[0][f].dS0, r[1][f].dS0, sizeof(float) * H * dk * dv) == 0);
    }
    golden_close(c.gc);
}

/* ---- kda_varlen: conv + L2Norm + core over two packed documents ---- */

static void test_kda_varlen(void) {
    golden_case *gc = golden_open("kda_varlen");
    const int64_t H = 2, dk = 16, dv = 16, W = 4, T = 107, P = H * dk;
    const int32_t N = 2;
    int32_t *cu = golden_i32(gc, "cu_seqlens", N + 1);
    float scale = 1.0f / sqrtf((float)dk);
    const char *src[3] = {"qt", "kt", "vt"}, *wn[3] = {"wq", "wk", "wv"};
    float *x[3], *w[3], *z[3], *qkv[3];
    float *rn[2];
    for (int i = 0; i < 3; i++) {
        x[i] = golden_f32(gc, src[i], T * P);
        w[i] = golden_f32(gc, wn[i], P * W);
        z[i] = golden_zeros(gc, T * P);
        arl_kda_conv_fwd(z[i], NULL, x[i], w[i], NULL, cu, N, T, P, W);
        qkv[i] = z[i];
        if (i < 2) { /* L2Norm of q and k per head, eps 1e-6 inside the root */
            qkv[i] = golden_zeros(gc, T * P);
            rn[i] = golden_zeros(gc, T * H);
            arl_k_l2norm_fwd(qkv[i], rn[i], z[i], T * H, dk, 1e-6f);
        }
    }
    cmp(gc, "q", qkv[0], T * P, RTOL_FWD);
    cmp(gc, "k", qkv[1], T * P, RTOL_FWD);
    cmp(gc, "v", qkv[2], T * P, RTOL_FWD);
    float *g = golden_f32(gc, "g", T * P), *beta = golden_f32(gc, "beta", T * H);
    float *d_o = golden_f32(gc, "do", T * H * dv), *dht = golden_f32(gc, "dht", N * H * dk * dv);
    int64_t Cs[2] = {16, 64};
    for (int ci = 0; ci < 2; ci++) {
        int64_t C = Cs[ci], nch = arl_kda_num_chunks(cu, N, T, C);
        float *o = golden_zeros(gc, T * H * dv), *S = golden_zeros(gc, N * H * dk * dv);
        float *o2 = golden_zeros(gc, T * H * dv), *S2 = golden_zeros(gc, N * H * dk * dv);
        float *cst = golden_zeros(gc, nch * H * dk * dv);
        float *ws = golden_zeros(gc, arl_kda_chunk_ws_floats(H, dk, dv, C));
        arl_kda_chunk_fwd(o, S, cst, qkv[0], qkv[1], qkv[2], g, beta, cu, N, T, H, dk, dv, scale, C,
                          ws);
        arl_kda_recurrent_fwd(o2, S2, NULL, qkv[0], qkv[1], qkv[2], g, beta, cu, N, T, H, dk, dv,
                              scale, C);
        cmp(gc, "o", o, T * H * dv, RTOL_FWD);
        cmp(gc, "ht", S, N * H * dk * dv, RTOL_FWD);
        cmp(gc, "o", o2, T * H * dv, RTOL_FWD);
        cmp(gc, "ht", S2, N * H * dk * dv, RTOL_FWD);
        /* backward through the core (chunk rule for C = 16, recurrent rule for C = 64),
         * L2Norm and the convolutions */
        float *dcore[3] = {golden_zeros(gc, T * P), golden_zeros(gc, T * P),
                           golden_zeros(gc, T * P)};
        float *dg = golden_zeros(gc, T * P), *db = golden_zeros(gc, T * H);
        float *bws = golden_zeros(gc, arl_kda_bwd_ws_floats(H, dk, dv, C));
        (C == 16 ? arl_kda_chunk_bwd : arl_kda_recurrent_bwd)(
            dcore[0], dcore[1], dcore[2], dg, db, NULL, d_o, dht, qkv[0], qkv[1], qkv[2], g, beta,
            cst, cu, N, T, H, dk, dv, scale, C, bws);
        const char *dxn[3] = {"dqt", "dkt", "dvt"}, *dwn[3] = {"dwq", "dwk", "dwv"};
        for (int i = 0; i < 3; i++) {
            float *dz = dcore[i];
            if (i < 2) {
                dz = golden_zeros(gc, T * P);
                arl_k_l2norm_bwd(dz, dcore[i], z[i], rn[i], T * H, dk);
            }
            float *dx = golden_zeros(gc, T * P), *dw = golden_zeros(gc, P * W);
            arl_kda_conv_bwd(dx, dw, dz, x[i], w[i], NULL, cu, N, T, P, W);
            cmp(gc, dxn[i], dx, T * P, RTOL_BWD);
            cmp(gc, dwn[i], dw, P * W, RTOL_BWD);
        }
        cmp(gc, "dg", dg, T * P, RTOL_BWD);
        cmp(gc, "dbeta", db, T * H, RTOL_BWD);
    }
    golden_close(gc);
}

/* ---- gates ---- */

static void test_kda_gate(int k3) {
    golden_case *gc = golden_open(k3 ? "kda_gate_k3" : "kda_gate_softplus");
    const int64_t T = 24, H = 2, dk = 16, P = H * dk;
    float *f = golden_f32(gc, "f", T * P), *A = golden_f32(gc, "A_log", H);
    float *dt = golden_f32(gc, "dt_bias", P), *dg = golden_f32(gc, "dg", T * P);
    float *g = golden_zeros(gc, T * P), *df = golden_zeros(gc, T * P);
    float *dA = golden_zeros(gc, H), *ddt = golden_zeros(gc, P);
    if (k3) {
        arl_kda_gate_k3_fwd(g, f, A, dt, T, H, dk, -5.0f);
        arl_kda_gate_k3_bwd(df, dA, ddt, dg, f, A, dt, T, H, dk, -5.0f);
    } else {
        arl_kda_gate_softplus_fwd(g, f, A, dt, T, H, dk);
        arl_kda_gate_softplus_bwd(df, dA, ddt, dg, f, A, dt, T, H, dk);
    }
    cmp(gc, "g", g, T * P, RTOL_FWD);
    cmp(gc, "df", df, T * P, RTOL_BWD);
    cmp(gc, "dA_log", dA, H, RTOL_BWD);
    cmp(gc, "ddt_bias", ddt, P, RTOL_BWD);
    golden_close(gc);
}

static void test_kda_gate_k3(void) {
    test_kda_gate(1);
}

static void test_kda_gate_softplus(void) {
    test_kda_gate(0);
}

/* ---- kda_layer: the stages composed into a full layer, prefill, decode and backward ---- */

typedef struct layer_w {
    float *q_proj, *k_proj, *v_proj, *conv[3], *f_a, *f_b, *dt_bias, *A_log, *b_proj, *g_proj,
        *o_norm, *o_proj;
} layer_w;

typedef struct layer_act {
    float *pre[3], *z[3], *qkv[3], *rn[2], *fa, *f, *g, *bl, *beta, *o, *gam, *rstd, *ob, *y, *cst,
        *S;
} layer_act;

enum { LD = 32, LH = 2, LDK = 16, LW = 4, LT = 40, LP = LH * LDK, LC = 16 };

static void layer_forward(golden_case *gc, const layer_w *w, const float *x, layer_act *a) {
    const int64_t T = LT, d = LD, H = LH, dk = LDK, P = LP, W = LW;
    const float *proj[3] = {w->q_proj, w->k_proj, w->v_proj};
    for (int i = 0; i < 3; i++) {
        a->pre[i] = golden_zeros(gc, T * P);
        a->z[i] = golden_zeros(gc, T * P);
        arl_k_linear_fwd(a->pre[i], x, proj[i], T, d, P);
        arl_kda_conv_fwd(a->z[i], NULL, a->pre[i], w->conv[i], NULL, NULL, 1, T, P, W);
        a->qkv[i] = a->z[i];
        if (i < 2) {
            a->qkv[i] = golden_zeros(gc, T * P);
            a->rn[i] = golden_zeros(gc, T * H);
            arl_k_l2norm_fwd(a->qkv[i], a->rn[i], a->z[i], T * H, dk, 1e-6f);
        }
    }
    a->fa = golden_zeros(gc, T * dk);
    a->f = golden_zeros(gc, T * P);
    a->g = golden_zeros(gc, T * P);
    arl_k_linear_fwd(a->fa, x, w->f_a, T, d, dk);
    arl_k_linear_fwd(a->f, a->fa, w->f_b, T, dk, P);
    arl_kda_gate_k3_fwd(a->g, a->f, w->A_log, w->dt_bias, T, H, dk, -5.0f);
    a->bl = golden_zeros(gc, T * H);
    a->beta = golden_zeros(gc, T * H);
    arl_k_linear_fwd(a->bl, x, w->b_proj, T, d, H);
    arl_k_sigmoid_fwd(a->beta, a->bl, T * H);
    a->o = golden_zeros(gc, T * P);
    a->S = golden_zeros(gc, H * dk * dk);
    a->cst = golden_zeros(gc, arl_kda_num_chunks(NULL, 1, T, LC) * H * dk * dk);
    float *ws = golden_zeros(gc, arl_kda_chunk_ws_floats(H, dk, dk, LC));
    arl_kda_chunk_fwd(a->o, a->S, a->cst, a->qkv[0], a->qkv[1], a->qkv[2], a->g, a->beta, NULL, 1,
                      T, H, dk, dk, 1.0f / sqrtf((float)dk), LC, ws);
    a->gam = golden_zeros(gc, T * P);
    a->rstd = golden_zeros(gc, T * H);
    a->ob = golden_zeros(gc, T * P);
    arl_k_linear_fwd(a->gam, x, w->g_proj, T, d, P);
    arl_kda_onorm_fwd(a->ob, a->rstd, a->o, a->gam, w->o_norm, T * H, dk, 1e-5f);
    a->y = golden_zeros(gc, T * d);
    arl_k_linear_fwd(a->y, a->ob, w->o_proj, T, P, d);
}

static void test_kda_layer(void) {
    golden_case *gc = golden_open("kda_layer");
    const int64_t T = LT, d = LD, H = LH, dk = LDK, P = LP, W = LW;
    layer_w w;
    w.q_proj = golden_f32(gc, "q_proj", P * d);
    w.k_proj = golden_f32(gc, "k_proj", P * d);
    w.v_proj = golden_f32(gc, "v_proj", P * d);
    w.conv[0] = golden_f32(gc, "q_conv", P * W);
    w.conv[1] = golden_f32(gc, "k_conv", P * W);
    w.conv[2] = golden_f32(gc, "v_conv", P * W);
    w.f_a = golden_f32(gc, "f_a", dk * d);
    w.f_b = golden_f32(gc, "f_b", P * dk);
    w.dt_bias = golden_f32(gc, "dt_bias", P);
    w.A_log = golden_f32(gc, "A_log", H);
    w.b_proj = golden_f32(gc, "b_proj", H * d);
    w.g_proj = golden_f32(gc, "g_proj", P * d);
    w.o_norm = golden_f32(gc, "o_norm", dk);
    w.o_proj = golden_f32(gc, "o_proj", d * P);
    float *x = golden_f32(gc, "x", T * d), *dy = golden_f32(gc, "dy", T * d);
    layer_act a;
    layer_forward(gc, &w, x, &a);
    cmp(gc, "qt", a.pre[0], T * P, RTOL_FWD);
    cmp(gc, "q", a.qkv[0], T * P, RTOL_FWD);
    cmp(gc, "k", a.qkv[1], T * P, RTOL_FWD);
    cmp(gc, "v", a.qkv[2], T * P, RTOL_FWD);
    cmp(gc, "g", a.g, T * P, RTOL_FWD);
    cmp(gc, "beta", a.beta, T * H, RTOL_FWD);
    cmp(gc, "o", a.o, T * P, RTOL_FWD);
    cmp(gc, "ob", a.ob, T * P, RTOL_FWD);
    cmp(gc, "y", a.y, T * d, RTOL_FWD);
    cmp(gc, "ht", a.S, H * dk * dk, RTOL_FWD);

    /* decode: resume from the prefix state and decode the remaining tokens one at a time
     * (conv step over the tails, one recurrence step); must equal the prefill rows */
    const int64_t T1 = 17;
    float *S = golden_f32(gc, "state_prefix_S", H * dk * dk);
    float *tails[3] = {golden_f32(gc, "state_prefix_tail_q", P * (W - 1)),
                       golden_f32(gc, "state_prefix_tail_k", P * (W - 1)),
                       golden_f32(gc, "state_prefix_tail_v", P * (W - 1))};
    const float *proj[3] = {w.q_proj, w.k_proj, w.v_proj};
    float *ydec = golden_zeros(gc, (T - T1) * d);
    float pre[LP], zz[3][LP], qk[LP], fa[LDK], f[LP], g[LP], bl[LH], be[LH], o[LP], gam[LP];
    float ob[LP], rstd[LH];
    for (int64_t t = T1; t < T; t++) {
        const float *xt = x + t * d;
        for (int i = 0; i < 3; i++) {
            arl_k_linear_fwd(pre, xt, proj[i], 1, d, P);
            arl_kda_conv_step(zz[i], tails[i], pre, w.conv[i], P, W);
        }
        arl_k_l2norm_fwd(qk, NULL, zz[0], H, dk, 1e-6f);
        memcpy(zz[0], qk, sizeof qk);
        arl_k_l2norm_fwd(qk, NULL, zz[1], H, dk, 1e-6f);
        memcpy(zz[1], qk, sizeof qk);
        arl_k_linear_fwd(fa, xt, w.f_a, 1, d, dk);
        arl_k_linear_fwd(f, fa, w.f_b, 1, dk, P);
        arl_kda_gate_k3_fwd(g, f, w.A_log, w.dt_bias, 1, H, dk, -5.0f);
        arl_k_linear_fwd(bl, xt, w.b_proj, 1, d, H);
        arl_k_sigmoid_fwd(be, bl, H);
        arl_kda_recurrent_fwd(o, S, NULL, zz[0], zz[1], zz[2], g, be, NULL, 1, 1, H, dk, dk,
                              1.0f / sqrtf((float)dk), 0);
        arl_k_linear_fwd(gam, xt, w.g_proj, 1, d, P);
        arl_kda_onorm_fwd(ob, rstd, o, gam, w.o_norm, H, dk, 1e-5f);
        arl_k_linear_fwd(ydec + (t - T1) * d, ob, w.o_proj, 1, P, d);
    }
    float *yref = golden_f32(gc, "y", T * d);
    check_close_maxref_f32("kda_layer decode vs prefill reference", ydec, yref + T1 * d,
                           (size_t)((T - T1) * d), 0, RTOL_FWD);
    cmp(gc, "ht", S, H * dk * dk, RTOL_FWD);
    cmp(gc, "tail_q", tails[0], P * (W - 1), RTOL_FWD);
    cmp(gc, "tail_v", tails[2], P * (W - 1), RTOL_FWD);
    /* the tail after the whole prefill, from arl_kda_conv_tail */
    float *tl = golden_zeros(gc, P * (W - 1));
    arl_kda_conv_tail(tl, a.pre[1], T, NULL, P, W);
    cmp(gc, "tail_k", tl, P * (W - 1), RTOL_FWD);

    /* backward through the layer: o_proj, gated norm, g_proj, core (chunk rule), beta, gate,
     * f_b/f_a, L2Norm, convs, q/k/v projections; every Linear through kernels/gemm.h */
    float *dx = golden_zeros(gc, T * d);
    float *dob = golden_zeros(gc, T * P), *d_o = golden_zeros(gc, T * P);
    float *dgam = golden_zeros(gc, T * P);
    float *G_o_proj = golden_zeros(gc, d * P), *G_o_norm = golden_zeros(gc, dk);
    float *G_g_proj = golden_zeros(gc, P * d);
    arl_k_linear_bwd_w(G_o_proj, dy, a.ob, T, P, d);
    arl_k_linear_bwd_x(dob, dy, w.o_proj, T, P, d);
    arl_kda_onorm_bwd(d_o, dgam, G_o_norm, dob, a.o, a.gam, w.o_norm, a.rstd, T * H, dk);
    arl_k_linear_bwd_w(G_g_proj, dgam, x, T, d, P);
    arl_k_linear_bwd_x(dx, dgam, w.g_proj, T, d, P);
    float *dcore[3] = {golden_zeros(gc, T * P), golden_zeros(gc, T * P), golden_zeros(gc, T * P)};
    float *dg = golden_zeros(gc, T * P), *dbeta = golden_zeros(gc, T * H);
    float *bws = golden_zeros(gc, arl_kda_bwd_ws_floats(H, dk, dk, LC));
    arl_kda_chunk_bwd(dcore[0], dcore[1], dcore[2], dg, dbeta, NULL, d_o, NULL, a.qkv[0], a.qkv[1],
                      a.qkv[2], a.g, a.beta, a.cst, NULL, 1, T, H, dk, dk, 1.0f / sqrtf((float)dk),
                      LC, bws);
    float *dbl = golden_zeros(gc, T * H), *G_b = golden_zeros(gc, H * d);
    arl_k_sigmoid_bwd(dbl, dbeta, a.bl, T * H);
    arl_k_linear_bwd_w(G_b, dbl, x, T, d, H);
    arl_k_linear_bwd_x(dx, dbl, w.b_proj, T, d, H);
    float *df = golden_zeros(gc, T * P), *G_A = golden_zeros(gc, H), *G_dt = golden_zeros(gc, P);
    arl_kda_gate_k3_bwd(df, G_A, G_dt, dg, a.f, w.A_log, w.dt_bias, T, H, dk, -5.0f);
    float *dfa = golden_zeros(gc, T * dk), *G_fb = golden_zeros(gc, P * dk);
    float *G_fa = golden_zeros(gc, dk * d);
    arl_k_linear_bwd_w(G_fb, df, a.fa, T, dk, P);
    arl_k_linear_bwd_x(dfa, df, w.f_b, T, dk, P);
    arl_k_linear_bwd_w(G_fa, dfa, x, T, d, dk);
    arl_k_linear_bwd_x(dx, dfa, w.f_a, T, d, dk);
    const char *gpn[3] = {"dq_proj", "dk_proj", "dv_proj"};
    const char *gcn[3] = {"dq_conv", "dk_conv", "dv_conv"};
    for (int i = 0; i < 3; i++) {
        float *dz = dcore[i];
        if (i < 2) {
            dz = golden_zeros(gc, T * P);
            arl_k_l2norm_bwd(dz, dcore[i], a.z[i], a.rn[i], T * H, dk);
        }
        float *dpre = golden_zeros(gc, T * P), *dconv = golden_zeros(gc, P * W);
        float *dproj = golden_zeros(gc, P * d);
        arl_kda_conv_bwd(dpre, dconv, dz, a.pre[i], w.conv[i], NULL, NULL, 1, T, P, W);
        arl_k_linear_bwd_w(dproj, dpre, x, T, d, P);
        arl_k_linear_bwd_x(dx, dpre, proj[i], T, d, P);
        cmp(gc, gcn[i], dconv, P * W, RTOL_BWD);
        cmp(gc, gpn[i], dproj, P * d, RTOL_BWD);
    }
    cmp(gc, "dx", dx, T * d, RTOL_BWD);
    cmp(gc, "do_proj", G_o_proj, d * P, RTOL_BWD);
    cmp(gc, "do_norm", G_o_norm, dk, RTOL_BWD);
    cmp(gc, "dg_proj", G_g_proj, P * d, RTOL_BWD);
    cmp(gc, "db_proj", G_b, H * d, RTOL_BWD);
    cmp(gc, "dA_log", G_A, H, RTOL_BWD);
    cmp(gc, "ddt_bias", G_dt, P, RTOL_BWD);
    cmp(gc, "df_a", G_fa, dk * d, RTOL_BWD);
    cmp(gc, "df_b", G_fb, P * dk, RTOL_BWD);
    golden_close(gc);
}

/* ---- finite differences on tiny shapes (STYLE rule 17) ---- */

enum { FT = 7, FH = 2, FDK = 3, FDV = 2, FN = 2 };
typedef struct fd_core {
    float q[FT * FH * FDK], k[FT * FH * FDK], v[FT * FH * FDV], g[FT * FH * FDK], beta[FT * FH];
    float S0[FN * FH * FDK * FDV], wo[FT * FH * FDV], wS[FN * FH * FDK * FDV];
    int32_t cu[FN + 1];
    int chunk;
} fd_core;

static double fd_core_loss(void *vctx) {
    fd_core *c = vctx;
    float o[FT * FH * FDV], S[FN * FH * FDK * FDV], ws[4096];
    memcpy(S, c->S0, sizeof S);
    if (c->chunk) {
        ARL_ASSERT(arl_kda_chunk_ws_floats(FH, FDK, FDV, 3) <= 4096);
        arl_kda_chunk_fwd(o, S, NULL, c->q, c->k, c->v, c->g, c->beta, c->cu, FN, FT, FH, FDK, FDV,
                          0.7f, 3, ws);
    } else {
        arl_kda_recurrent_fwd(o, S, NULL, c->q, c->k, c->v, c->g, c->beta, c->cu, FN, FT, FH, FDK,
                              FDV, 0.7f, 0);
    }
    double L = 0.0;
    for (int i = 0; i < FT * FH * FDV; i++)
        L += (double)o[i] * c->wo[i];
    for (int i = 0; i < FN * FH * FDK * FDV; i++)
        L += (double)S[i] * c->wS[i];
    return L;
}

static void fill(arl_rng *r, float *x, int n, double lo, double hi) {
    for (int i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * arl_rng_uniform(r));
}

/* Core backward (both rules, both forms) by finite differences: two documents of 3 and 4
 * tokens, chunk length 3 (a chunk boundary inside the second document), non-zero S0. */
static void test_kda_core_fd(void) {
    arl_rng r;
    arl_rng_seed(&r, 11);
    fd_core c;
    fill(&r, c.q, FT * FH * FDK, -1, 1);
    fill(&r, c.k, FT * FH * FDK, -0.6, 0.6);
    fill(&r, c.v, FT * FH * FDV, -1, 1);
    fill(&r, c.g, FT * FH * FDK, -3, -0.05);
    fill(&r, c.beta, FT * FH, 0.1, 0.9);
    fill(&r, c.S0, FN * FH * FDK * FDV, -0.5, 0.5);
    fill(&r, c.wo, FT * FH * FDV, -1, 1);
    fill(&r, c.wS, FN * FH * FDK * FDV, -1, 1);
    c.cu[0] = 0;
    c.cu[1] = 3;
    c.cu[2] = FT;
    for (int rule = 0; rule < 2; rule++) {
        c.chunk = rule;
        float S[FN * FH * FDK * FDV], o[FT * FH * FDV], cst[8 * FH * FDK * FDV], ws[8192];
        memcpy(S, c.S0, sizeof S);
        ARL_ASSERT(arl_kda_num_chunks(c.cu, FN, FT, 3) <= 8);
        ARL_ASSERT(arl_kda_bwd_ws_floats(FH, FDK, FDV, 3) <= 8192);
        arl_kda_recurrent_fwd(o, S, cst, c.q, c.k, c.v, c.g, c.beta, c.cu, FN, FT, FH, FDK, FDV,
                              0.7f, 3);
        float dq[FT * FH * FDK] = {0}, dk[FT * FH * FDK] = {0}, dv[FT * FH * FDV] = {0};
        float dg[FT * FH * FDK] = {0}, db[FT * FH] = {0}, dS0[FN * FH * FDK * FDV] = {0};
        (rule ? arl_kda_chunk_bwd : arl_kda_recurrent_bwd)(dq, dk, dv, dg, db, dS0, c.wo, c.wS, c.q,
                                                           c.k, c.v, c.g, c.beta, cst, c.cu, FN, FT,
                                                           FH, FDK, FDV, 0.7f, 3, ws);
        const char *tag = rule ? "fd chunk" : "fd recurrent";
        char w[64];
        snprintf(w, sizeof w, "%s dq", tag);
        fd_check(w, c.q, dq, FT * FH * FDK, fd_core_loss, &c, 1e-2f);
        snprintf(w, sizeof w, "%s dk", tag);
        fd_check(w, c.k, dk, FT * FH * FDK, fd_core_loss, &c, 1e-2f);
        snprintf(w, sizeof w, "%s dv", tag);
        fd_check(w, c.v, dv, FT * FH * FDV, fd_core_loss, &c, 1e-2f);
        snprintf(w, sizeof w, "%s dg", tag);
        fd_check(w, c.g, dg, FT * FH * FDK, fd_core_loss, &c, 1e-2f);
        snprintf(w, sizeof w, "%s dbeta", tag);
        fd_check(w, c.beta, db, FT * FH, fd_core_loss, &c, 1e-2f);
        snprintf(w, sizeof w, "%s dS0", tag);
        fd_check(w, c.S0, dS0, FN * FH * FDK * FDV, fd_core_loss, &c, 1e-2f);
    }
}

/* Elementwise stages by finite differences: conv (with a tail and two documents), both gates,
 * the gated output norm. */
enum { ET = 5, EC = 3, EW = 3, EH = 2, EDK = 2 };
typedef struct fd_elem {
    float x[ET * EC], w[EC * EW], tail[2 * EC * (EW - 1)], up[ET * EC];
    float f[ET * EH * EDK], A[EH], dt[EH * EDK], gam[ET * EH * EDK], on[EDK];
    int32_t cu[3];
    int which; /* 0 conv, 1 gate k3, 2 gate softplus, 3 onorm */
} fd_elem;

static double fd_elem_loss(void *vctx) {
    fd_elem *e = vctx;
    float out[ET * EH * EDK > ET * EC ? ET * EH * EDK : ET * EC];
    int n = 0;
    if (e->which == 0) {
        arl_kda_conv_fwd(out, NULL, e->x, e->w, e->tail, e->cu, 2, ET, EC, EW);
        n = ET * EC;
    } else if (e->which == 1) {
        arl_kda_gate_k3_fwd(out, e->f, e->A, e->dt, ET, EH, EDK, -5.0f);
        n = ET * EH * EDK;
    } else if (e->which == 2) {
        arl_kda_gate_softplus_fwd(out, e->f, e->A, e->dt, ET, EH, EDK);
        n = ET * EH * EDK;
    } else {
        arl_kda_onorm_fwd(out, NULL, e->f, e->gam, e->on, ET * EH, EDK, 1e-5f);
        n = ET * EH * EDK;
    }
    double L = 0.0;
    for (int i = 0; i < n; i++)
        L += (double)out[i] * e->up[i % (ET * EC)];
    return L;
}

static void test_kda_stages_fd(void) {
    arl_rng r;
    arl_rng_seed(&r, 12);
    fd_elem e;
    fill(&r, e.x, ET * EC, -2, 2);
    fill(&r, e.w, EC * EW, -0.6, 0.6);
    fill(&r, e.tail, 2 * EC * (EW - 1), -1, 1);
    fill(&r, e.up, ET * EC, -1, 1);
    fill(&r, e.f, ET * EH * EDK, -2, 2);
    fill(&r, e.A, EH, -0.5, 0.5);
    fill(&r, e.dt, EH * EDK, -1, 1);
    fill(&r, e.gam, ET * EH * EDK, -2, 2);
    fill(&r, e.on, EDK, 0.5, 1.5);
    e.cu[0] = 0;
    e.cu[1] = 2;
    e.cu[2] = ET;
    /* upstream gradient for the gate/onorm outputs: the first ET*EC entries of up, cycled */
    float up2[ET * EH * EDK];
    for (int i = 0; i < ET * EH * EDK; i++)
        up2[i] = e.up[i % (ET * EC)];
    {
        e.which = 0;
        float dx[ET * EC] = {0}, dw[EC * EW] = {0};
        arl_kda_conv_bwd(dx, dw, e.up, e.x, e.w, e.tail, e.cu, 2, ET, EC, EW);
        fd_check("fd conv dx", e.x, dx, ET * EC, fd_elem_loss, &e, 1e-2f);
        fd_check("fd conv dw", e.w, dw, EC * EW, fd_elem_loss, &e, 1e-2f);
    }
    for (int which = 1; which <= 2; which++) {
        e.which = which;
        float df[ET * EH * EDK] = {0}, dA[EH] = {0}, ddt[EH * EDK] = {0};
        if (which == 1)
            arl_kda_gate_k3_bwd(df, dA, ddt, up2, e.f, e.A, e.dt, ET, EH, EDK, -5.0f);
        else
            arl_kda_gate_softplus_bwd(df, dA, ddt, up2, e.f, e.A, e.dt, ET, EH, EDK);
        fd_check(which == 1 ? "fd gate k3 df" : "fd gate softplus df", e.f, df, ET * EH * EDK,
                 fd_elem_loss, &e, 1e-2f);
        fd_check(which == 1 ? "fd gate k3 dA_log" : "fd gate softplus dA_log", e.A, dA, EH,
                 fd_elem_loss, &e, 1e-2f);
        fd_check(which == 1 ? "fd gate k3 ddt_bias" : "fd gate softplus ddt_bias", e.dt, ddt,
                 EH * EDK, fd_elem_loss, &e, 1e-2f);
    }
    {
        e.which = 3;
        float rstd[ET * EH], ob[ET * EH * EDK];
        float d_o[ET * EH * EDK] = {0}, dgam[ET * EH * EDK] = {0}, dw[EDK] = {0};
        arl_kda_onorm_fwd(ob, rstd, e.f, e.gam, e.on, ET * EH, EDK, 1e-5f);
        arl_kda_onorm_bwd(d_o, dgam, dw, up2, e.f, e.gam, e.on, rstd, ET * EH, EDK);
        fd_check("fd onorm do", e.f, d_o, ET * EH * EDK, fd_elem_loss, &e, 1e-2f);
        fd_check("fd onorm dgam", e.gam, dgam, ET * EH * EDK, fd_elem_loss, &e, 1e-2f);
        fd_check("fd onorm dw", e.on, dw, EDK, fd_elem_loss, &e, 1e-2f);
    }
}

int main(void) {
    TEST_RUN(test_kda_recurrent);
    TEST_RUN(test_kda_chunk_16);
    TEST_RUN(test_kda_chunk_64);
    TEST_RUN(test_kda_chunk_lengths);
    TEST_RUN(test_kda_threads);
    TEST_RUN(test_kda_varlen);
    TEST_RUN(test_kda_gate_k3);
    TEST_RUN(test_kda_gate_softplus);
    TEST_RUN(test_kda_layer);
    TEST_RUN(test_kda_core_fd);
    TEST_RUN(test_kda_stages_fd);
    return test_finish();
}
