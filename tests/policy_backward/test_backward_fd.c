/* tests/policy_backward/test_backward_fd.c: finite-difference checks (STYLE rule 17) of the parts
 * of the layer backwards that the golden cases do not cover: documents resuming from a state.
 *   - KDA layer over two documents (3 and 4 tokens, chunk length 2) that both start from a
 *     non-zero state S0 and non-zero conv tails: gradients of x, the conv weights (their taps
 *     also read the tails), q_proj, A_log, and of the initial state (dS0, dtails0), with a loss
 *     that also reads the final state and tails (dS_T, dtails_T fed in), including a document
 *     shorter than the conv tail (its final tail holds part of the initial one).
 *   - MLA layer in the absorbed form over two documents, one after 5 earlier latent rows (a
 *     cache), one fresh: gradients of x, W_kvb (which also acts on the earlier rows), q_a,
 *     kv_a_norm, of the earlier rows (dprefix), with a loss that also reads the new rows
 *     (dlat_T fed in).
 * The components are fp32, so the differences are taken in fp32 inputs with the loss in double
 * (tests/golden/fdcheck.h): max|ref| form with rtol 2e-2 and atol 1e-4 - loose enough for fp32
 * rounding (~1e-6 |L| / h) and the O(h^2) truncation, tight enough to catch a wrong sign, a
 * missing term or a transposed index (errors of order 1).  Step h = 1e-2 for MLA; 2e-3 for KDA,
 * whose q and k pass an L2Norm over 3-channel heads: small head vectors make it strongly curved
 * and the O(h^2) term of h = 1e-2 reached 15% (measured), while 2e-3 passes with margin.
 */
#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "policy/kda_layer_backward.h"
#include "policy/mla_layer_backward.h"
#include "tests/golden/fdcheck.h"
#include "tests/test.h"

static void fill(arl_rng *r, float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * arl_rng_uniform(r));
}

/* ---- KDA layer with an initial state ---- */

enum { KD = 6, KH = 2, KDK = 3, KP = KH * KDK, KW = 4, KT = 5, KN = 2 };
static const int32_t KCU[KN + 1] = {0, 2, 5}; /* document 0 (2 tokens) is shorter than W-1 */

typedef struct kda_fd {
    arl_kda_layer_cfg c;
    arl_kda_params p;
    float w[KP * KD * 3 + KP * KW * 3 + KDK * KD + KP * KDK + KP + KH + KH * KD + KP * KD + KDK +
            KD * KP];
    float x[KT * KD], S0[KN * KH * KDK * KDK], tails0[KN * 3 * KP * (KW - 1)];
    float wy[KT * KD], wS[KN * KH * KDK * KDK], wT[KN * 3 * KP * (KW - 1)];
    _Alignas(64) float ws[20000];
    _Alignas(64) float save[20000];
} kda_fd;

static double kda_loss(void *vctx) {
    kda_fd *f = vctx;
    float y[KT * KD], S[KN * KH * KDK * KDK], tails[KN * 3 * KP * (KW - 1)];
    memcpy(S, f->S0, sizeof S);
    memcpy(tails, f->tails0, sizeof tails);
    arl_kda_layer_save sv;
    arl_kda_layer_save_bind(&sv, &f->c, KT, KN, f->save);
    arl_kda_layer_fwd_save(y, f->x, &f->p, &f->c, KCU, KN, KT, S, tails, &sv, f->ws);
    double L = 0;
    for (int i = 0; i < KT * KD; i++)
        L += (double)y[i] * f->wy[i];
    for (int i = 0; i < KN * KH * KDK * KDK; i++)
        L += (double)S[i] * f->wS[i];
    for (int i = 0; i < KN * 3 * KP * (KW - 1); i++)
        L += (double)tails[i] * f->wT[i];
    return L;
}

static void test_kda_state_fd(void) {
    static kda_fd f;
    f.c = (arl_kda_layer_cfg){.d = KD,
                              .H = KH,
                              .dk = KDK,
                              .dv = KDK,
                              .W = KW,
                              .lower_bound_gate = 1,
                              .g_min = -5.0f,
                              .eps = 1e-5f,
                              .chunk = 2};
    ARL_ASSERT(arl_kda_layer_save_floats(&f.c, KT, KN) <= 20000);
    ARL_ASSERT(arl_kda_layer_train_ws_floats(&f.c, KT, KN) <= 20000);
    arl_rng r;
    arl_rng_seed(&r, 5);
    fill(&r, f.w, sizeof f.w / sizeof f.w[0], -0.6, 0.6);
    float *q = f.w;
    f.p.q_proj = q, q += KP * KD;
    f.p.k_proj = q, q += KP * KD;
    f.p.v_proj = q, q += KP * KD;
    f.p.q_conv = q, q += KP * KW;
    f.p.k_conv = q, q += KP * KW;
    f.p.v_conv = q, q += KP * KW;
    f.p.f_a = q, q += KDK * KD;
    f.p.f_b = q, q += KP * KDK;
    f.p.dt_bias = q, q += KP;
    f.p.A_log = q, q += KH;
    f.p.b_proj = q, q += KH * KD;
    f.p.g_proj = q, q += KP * KD;
    f.p.o_norm = q, q += KDK;
    f.p.o_proj = q;
    for (int i = 0; i < KDK; i++)
        f.p.o_norm[i] += 1.0f;
    fill(&r, f.x, KT * KD, -1, 1);
    fill(&r, f.S0, KN * KH * KDK * KDK, -0.5, 0.5);
    fill(&r, f.tails0, KN * 3 * KP * (KW - 1), -1, 1);
    fill(&r, f.wy, KT * KD, -1, 1);
    fill(&r, f.wS, KN * KH * KDK * KDK, -1, 1);
    fill(&r, f.wT, KN * 3 * KP * (KW - 1), -1, 1);

    /* analytic: forward from copies, backward with dy = wy, dS_T = wS, dtails_T = wT */
    static float gw[sizeof f.w / sizeof f.w[0]];
    memset(gw, 0, sizeof gw);
    arl_kda_params g;
    ptrdiff_t off = gw - f.w;
    g = f.p;
    g.q_proj += off, g.k_proj += off, g.v_proj += off, g.q_conv += off, g.k_conv += off;
    g.v_conv += off, g.f_a += off, g.f_b += off, g.dt_bias += off, g.A_log += off;
    g.b_proj += off, g.g_proj += off, g.o_norm += off, g.o_proj += off;
    float y[KT * KD], S[KN * KH * KDK * KDK], tails[KN * 3 * KP * (KW - 1)];
    memcpy(S, f.S0, sizeof S);
    memcpy(tails, f.tails0, sizeof tails);
    static _Alignas(64) float save[20000];
    static _Alignas(64) float ws[20000];
    arl_kda_layer_save sv;
    arl_kda_layer_save_bind(&sv, &f.c, KT, KN, save);
    arl_kda_layer_fwd_save(y, f.x, &f.p, &f.c, KCU, KN, KT, S, tails, &sv, ws);
    float dx[KT * KD] = {0}, dS0[KN * KH * KDK * KDK] = {0}, dt0[KN * 3 * KP * (KW - 1)] = {0};
    for (int rec = 0; rec < 2; rec++) {
        memset(gw, 0, sizeof gw);
        memset(dx, 0, sizeof dx);
        memset(dS0, 0, sizeof dS0);
        memset(dt0, 0, sizeof dt0);
        arl_kda_layer_bwd(dx, &g, f.wy, f.x, &f.p, &f.c, KCU, KN, KT, &sv, f.tails0, f.wS, dS0,
                          f.wT, dt0, rec, ws);
        const char *tag = rec ? "recurrent" : "chunk";
        char w[128];
#define FD(name, arr, grad, n)                                                                     \
    (snprintf(w, sizeof w, "kda %s %s", tag, name), fd_check(w, arr, grad, n, kda_loss, &f, 2e-3f))
        FD("dx", f.x, dx, KT * KD);
        FD("dS0", f.S0, dS0, KN * KH * KDK * KDK);
        FD("dtails0", f.tails0, dt0, KN * 3 * KP * (KW - 1));
        FD("dq_conv", f.p.q_conv, g.q_conv, KP * KW);
        FD("dv_conv", f.p.v_conv, g.v_conv, KP * KW);
        FD("dk_proj", f.p.k_proj, g.k_proj, KP * KD);
        FD("dA_log", f.p.A_log, g.A_log, KH);
        FD("ddt_bias", f.p.dt_bias, g.dt_bias, KP);
#undef FD
    }
}

/* ---- MLA layer, absorbed form over earlier rows ---- */

enum { MD = 6, MH = 2, MRQ = 4, MRKV = 3, MN = 2, MR = 2, MVM = 3, MR_ = MRKV + MR, MPRE = 5 };
enum { MT = 7, MNDOC = 2 };
static const int32_t MCU[MNDOC + 1] = {0, 4, 7};

typedef struct mla_fd {
    arl_mla_layer_cfg c;
    arl_mla_params p;
    float w[MRQ * MD + MRQ + MH * (MN + MR) * MRQ + MR_ * MD + MRKV + MH * (MN + MVM) * MRKV +
            MH * MVM * MD + MD * MH * MVM];
    float x[MT * MD], prefix[MPRE * MR_];
    float cache0[32 * MR_], cache1[32 * MR_];
    float wy[MT * MD], wl[MT * MR_];
    _Alignas(64) float ws[200000];
    _Alignas(64) float save[20000];
} mla_fd;

static double mla_loss(void *vctx) {
    mla_fd *f = vctx;
    memcpy(f->cache0, f->prefix, sizeof f->prefix);
    float *caches[2] = {f->cache0, f->cache1};
    int64_t pos[2] = {MPRE, 0};
    float y[MT * MD];
    arl_mla_layer_save sv;
    arl_mla_layer_save_bind(&sv, &f->c, MT, f->save);
    arl_mla_layer_fwd_save(y, f->x, &f->p, &f->c, MCU, MNDOC, MT, caches, pos, 0, &sv, f->ws);
    double L = 0;
    for (int i = 0; i < MT * MD; i++)
        L += (double)y[i] * f->wy[i];
    for (int i = 0; i < MT * MR_; i++)
        L += (double)sv.lat[i] * f->wl[i];
    return L;
}

static void test_mla_prefix_fd(void) {
    static mla_fd f;
    f.c = (arl_mla_layer_cfg){.d = MD,
                              .Hm = MH,
                              .rq = MRQ,
                              .rkv = MRKV,
                              .n = MN,
                              .r = MR,
                              .vm = MVM,
                              .sparse_chunk = 16,
                              .sparse_topk = 0,
                              .max_rows = 32};
    ARL_ASSERT(arl_mla_layer_train_ws_floats(&f.c, MT, MNDOC) <= 200000);
    ARL_ASSERT(arl_mla_layer_save_floats(&f.c, MT) <= 20000);
    arl_rng r;
    arl_rng_seed(&r, 9);
    fill(&r, f.w, sizeof f.w / sizeof f.w[0], -0.8, 0.8);
    float *q = f.w;
    f.p.q_a = q, q += MRQ * MD;
    f.p.q_a_norm = q, q += MRQ;
    f.p.q_b = q, q += MH * (MN + MR) * MRQ;
    f.p.kv_a = q, q += MR_ * MD;
    f.p.kv_a_norm = q, q += MRKV;
    f.p.kv_b = q, q += MH * (MN + MVM) * MRKV;
    f.p.g_proj = q, q += MH * MVM * MD;
    f.p.o_proj = q;
    for (int i = 0; i < MRQ; i++)
        f.p.q_a_norm[i] += 1.0f;
    for (int i = 0; i < MRKV; i++)
        f.p.kv_a_norm[i] += 1.0f;
    fill(&r, f.x, MT * MD, -1, 1);
    fill(&r, f.prefix, MPRE * MR_, -1.5, 1.5);
    fill(&r, f.wy, MT * MD, -1, 1);
    fill(&r, f.wl, MT * MR_, -1, 1);

    static float gw[sizeof f.w / sizeof f.w[0]];
    ptrdiff_t off = gw - f.w;
    arl_mla_params g = f.p;
    g.q_a += off, g.q_a_norm += off, g.q_b += off, g.kv_a += off, g.kv_a_norm += off;
    g.kv_b += off, g.g_proj += off, g.o_proj += off;
    memcpy(f.cache0, f.prefix, sizeof f.prefix);
    float *caches[2] = {f.cache0, f.cache1};
    int64_t pos[2] = {MPRE, 0};
    float y[MT * MD], dx[MT * MD] = {0}, dpre[MPRE * MR_] = {0}, dummy[1] = {0};
    static _Alignas(64) float save[20000];
    static _Alignas(64) float ws[200000];
    arl_mla_layer_save sv;
    arl_mla_layer_save_bind(&sv, &f.c, MT, save);
    arl_mla_layer_fwd_save(y, f.x, &f.p, &f.c, MCU, MNDOC, MT, caches, pos, 0, &sv, ws);
    CHECK_EQ_INT(sv.absorbed, 1);
    float *dprefix[2] = {dpre, dummy};
    arl_mla_layer_bwd(dx, &g, f.wy, f.x, &f.p, &f.c, MCU, MNDOC, MT, caches, pos, &sv, f.wl,
                      dprefix, ws);
    CHECK(dummy[0] == 0.0f); /* the fresh document has no earlier rows */
    fd_check("mla absorbed dx", f.x, dx, MT * MD, mla_loss, &f, 1e-2f);
    fd_check("mla absorbed dprefix", f.prefix, dpre, MPRE * MR_, mla_loss, &f, 1e-2f);
    fd_check("mla absorbed dkv_b", f.p.kv_b, g.kv_b, MH * (MN + MVM) * MRKV, mla_loss, &f, 1e-2f);
    fd_check("mla absorbed dq_a", f.p.q_a, g.q_a, MRQ * MD, mla_loss, &f, 1e-2f);
    fd_check("mla absorbed dkv_a_norm", f.p.kv_a_norm, g.kv_a_norm, MRKV, mla_loss, &f, 1e-2f);
    fd_check("mla absorbed dg_proj", f.p.g_proj, g.g_proj, MH * MVM * MD, mla_loss, &f, 1e-2f);
}

int main(void) {
    arl_k_threads_init(2);
    TEST_RUN(test_kda_state_fd);
    TEST_RUN(test_mla_prefix_fd);
    return test_finish();
}
