/* tests/golden/test_attnres.c: policy/attnres.c against the golden cases attnres_mix (spec
 * 5.1/5.3) and attnres_stack (the bookkeeping of 5.2/5.4 on L = 8, B = 3 with linear
 * sublayers, composed here from the mix, kernels/norm.h and kernels/gemm.h), plus a
 * finite-difference check of the mix backward.
 *
 * Tolerances: spec 16.4 gives AttnRes the max|ref| form; atol = 0, rtol = 1e-5 for the single
 * mix (fp32 inputs, double sums: errors ~1e-7 relative) and 1e-4 forward / 1e-3 backward for
 * the stack (17 mixes, 16 linear maps and 17 RMSNorms chained in fp32, the KDA values of 16.4
 * for long chains); a wrong source order, snapshot or missing term gives errors of order
 * max|ref|.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/threadpool.h"
#include "policy/attnres.h"
#include "tests/golden/fdcheck.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

static void cmp(golden_case *gc, const char *name, const float *a, int64_t n, double rtol) {
    char what[256];
    snprintf(what, sizeof what, "%s/%s", golden_name(gc), name);
    check_close_maxref_f32(what, a, golden_f32(gc, name, n), (size_t)n, 0.0, rtol);
}

static void test_attnres_mix(void) {
    golden_case *gc = golden_open("attnres_mix");
    enum { N = 5, T = 6, D = 32 };
    float *V = golden_f32(gc, "V", N * T * D), *wn = golden_f32(gc, "w_norm", D);
    float *wp = golden_f32(gc, "w_proj", D), *dh = golden_f32(gc, "dh", T * D);
    const float *src[N];
    float *dsrc[N];
    float *dV = golden_zeros(gc, N * T * D);
    for (int j = 0; j < N; j++) {
        src[j] = V + j * T * D;
        dsrc[j] = dV + j * T * D;
    }
    float *out = golden_zeros(gc, T * D), *a = golden_zeros(gc, N * T);
    float *dwn = golden_zeros(gc, D), *dwp = golden_zeros(gc, D);
    arl_attnres_mix_fwd(out, a, src, N, T, D, wn, wp, 1e-5f);
    arl_attnres_mix_bwd(dsrc, dwn, dwp, dh, src, N, T, D, wn, wp, 1e-5f);
    cmp(gc, "out", out, T * D, 1e-5);
    cmp(gc, "a", a, N * T, 1e-5);
    cmp(gc, "dV", dV, N * T * D, 1e-5);
    cmp(gc, "dw_norm", dwn, D, 1e-5);
    cmp(gc, "dw_proj", dwp, D, 1e-5);
    golden_close(gc);
}

/* ---- the stack of spec 5.2 / 5.4 ---- */

enum { L = 8, B = 3, ST = 4, SD = 16, MAXB = 8 };

typedef struct stack_p {
    float *A, *F, *in_norm, *post_norm, *attn_norm, *attn_proj, *ffn_norm, *ffn_proj; /* (L, ...) */
    float *out_norm, *out_proj, *final_norm;
} stack_p;

typedef struct stack_rec { /* what the backward needs per layer */
    int nA, nF;            /* sources of the pre-mixer and pre-FFN mixes (0: none) */
    const float *srcA[MAXB], *srcF[MAXB];
    float h[ST * SD], rin[ST], xin[ST * SD], m[ST * SD], rpost[ST], xf[ST * SD];
} stack_rec;

/* Buffers: blocks (snapshots) and the running p of every stage, kept for the backward. */
typedef struct stack_state {
    float blocks[MAXB][ST * SD];
    float p_mid[L][ST * SD]; /* p after the mixer of layer l */
    float p_end[L][ST * SD]; /* p after the FFN of layer l */
    float p0[ST * SD];       /* the zero p after a snapshot */
    int nblocks;
    stack_rec rec[L];
    const float *srcO[MAXB];
    int nO;
    float out[ST * SD], rfin[ST], y[ST * SD];
} stack_state;

static void stack_forward(stack_state *S, const stack_p *P, const float *h0) {
    const float eps = 1e-5f;
    memset(S->p0, 0, sizeof S->p0);
    S->nblocks = 0;
    const float *p = h0;
    for (int l = 0; l < L; l++) {
        stack_rec *r = &S->rec[l];
        if (S->nblocks == 0) {
            r->nA = 0;
            memcpy(r->h, p, sizeof r->h);
        } else {
            for (int j = 0; j < S->nblocks; j++)
                r->srcA[j] = S->blocks[j];
            r->srcA[S->nblocks] = p;
            r->nA = S->nblocks + 1;
            arl_attnres_mix_fwd(r->h, NULL, r->srcA, r->nA, ST, SD, P->attn_norm + l * SD,
                                P->attn_proj + l * SD, eps);
        }
        if (l % B == 0) { /* snapshot the pre-mixer p, restart */
            memcpy(S->blocks[S->nblocks++], p, sizeof(float) * ST * SD);
            p = S->p0;
        }
        arl_k_rmsnorm_fwd(r->xin, r->rin, r->h, P->in_norm + l * SD, ST, SD, eps);
        arl_k_linear_fwd(S->p_mid[l], r->xin, P->A + l * SD * SD, ST, SD, SD);
        for (int i = 0; i < ST * SD; i++)
            S->p_mid[l][i] += p[i];
        p = S->p_mid[l];
        for (int j = 0; j < S->nblocks; j++)
            r->srcF[j] = S->blocks[j];
        r->srcF[S->nblocks] = p;
        r->nF = S->nblocks + 1;
        arl_attnres_mix_fwd(r->m, NULL, r->srcF, r->nF, ST, SD, P->ffn_norm + l * SD,
                            P->ffn_proj + l * SD, eps);
        arl_k_rmsnorm_fwd(r->xf, r->rpost, r->m, P->post_norm + l * SD, ST, SD, eps);
        arl_k_linear_fwd(S->p_end[l], r->xf, P->F + l * SD * SD, ST, SD, SD);
        for (int i = 0; i < ST * SD; i++)
            S->p_end[l][i] += p[i];
        p = S->p_end[l];
    }
    for (int j = 0; j < S->nblocks; j++)
        S->srcO[j] = S->blocks[j];
    S->srcO[S->nblocks] = p;
    S->nO = S->nblocks + 1;
    arl_attnres_mix_fwd(S->out, NULL, S->srcO, S->nO, ST, SD, P->out_norm, P->out_proj, eps);
    arl_k_rmsnorm_fwd(S->y, S->rfin, S->out, P->final_norm, ST, SD, eps);
}

/* Spec 5.4: gradients of every parameter (G, same layout as P) and of h0. */
static void stack_backward(stack_state *S, const stack_p *P, const stack_p *G, float *dh0,
                           const float *dy) {
    const float eps = 1e-5f;
    static float d_blocks[MAXB][ST * SD];
    float dp[ST * SD], dout[ST * SD] = {0}, tmp[ST * SD], dh[ST * SD];
    float *dsrc[MAXB];
    memset(d_blocks, 0, sizeof d_blocks);
    memset(dp, 0, sizeof dp);
    int nb = S->nblocks;
    arl_k_rmsnorm_bwd(dout, G->final_norm, dy, S->out, P->final_norm, S->rfin, ST, SD);
    for (int j = 0; j < nb; j++)
        dsrc[j] = d_blocks[j];
    dsrc[nb] = dp;
    arl_attnres_mix_bwd(dsrc, G->out_norm, G->out_proj, dout, S->srcO, S->nO, ST, SD, P->out_norm,
                        P->out_proj, eps);
    for (int l = L - 1; l >= 0; l--) {
        stack_rec *r = &S->rec[l];
        /* FFN: dFFN_out = dp */
        memset(tmp, 0, sizeof tmp);
        arl_k_linear_bwd_w(G->F + l * SD * SD, dp, r->xf, ST, SD, SD);
        arl_k_linear_bwd_x(tmp, dp, P->F + l * SD * SD, ST, SD, SD);
        float dm[ST * SD] = {0};
        arl_k_rmsnorm_bwd(dm, G->post_norm + l * SD, tmp, r->m, P->post_norm + l * SD, r->rpost, ST,
                          SD);
        for (int j = 0; j < nb; j++)
            dsrc[j] = d_blocks[j];
        dsrc[nb] = dp;
        arl_attnres_mix_bwd(dsrc, G->ffn_norm + l * SD, G->ffn_proj + l * SD, dm, r->srcF, r->nF,
                            ST, SD, P->ffn_norm + l * SD, P->ffn_proj + l * SD, eps);
        /* mixer: dMixer_out = dp */
        memset(tmp, 0, sizeof tmp);
        memset(dh, 0, sizeof dh);
        arl_k_linear_bwd_w(G->A + l * SD * SD, dp, r->xin, ST, SD, SD);
        arl_k_linear_bwd_x(tmp, dp, P->A + l * SD * SD, ST, SD, SD);
        arl_k_rmsnorm_bwd(dh, G->in_norm + l * SD, tmp, r->h, P->in_norm + l * SD, r->rin, ST, SD);
        if (l % B == 0) { /* p was reset: the old p is the snapshot */
            nb--;
            memcpy(dp, d_blocks[nb], sizeof dp);
            memset(d_blocks[nb], 0, sizeof dp);
        }
        if (r->nA == 0) {
            for (int i = 0; i < ST * SD; i++)
                dp[i] += dh[i];
        } else {
            for (int j = 0; j < nb; j++)
                dsrc[j] = d_blocks[j];
            dsrc[nb] = dp;
            arl_attnres_mix_bwd(dsrc, G->attn_norm + l * SD, G->attn_proj + l * SD, dh, r->srcA,
                                r->nA, ST, SD, P->attn_norm + l * SD, P->attn_proj + l * SD, eps);
        }
    }
    CHECK_EQ_INT(nb, 0);
    memcpy(dh0, dp, sizeof dp);
}

static stack_p stack_load(golden_case *gc, const char *prefix) {
    char k[64];
#define LD(field, name, n)                                                                         \
    (snprintf(k, sizeof k, "%s%s", prefix, name), field = golden_f32(gc, k, n))
    stack_p P;
    LD(P.A, "A", L * SD * SD);
    LD(P.F, "F", L * SD * SD);
    LD(P.in_norm, "in_norm", L * SD);
    LD(P.post_norm, "post_norm", L * SD);
    LD(P.attn_norm, "attn_norm", L * SD);
    LD(P.attn_proj, "attn_proj", L * SD);
    LD(P.ffn_norm, "ffn_norm", L * SD);
    LD(P.ffn_proj, "ffn_proj", L * SD);
    LD(P.out_norm, "out_norm", SD);
    LD(P.out_proj, "out_proj", SD);
    LD(P.final_norm, "final_norm", SD);
#undef LD
    return P;
}

static void test_attnres_stack(void) {
    golden_case *gc = golden_open("attnres_stack");
    stack_p P = stack_load(gc, "");
    float *h0 = golden_f32(gc, "h0", ST * SD), *dy = golden_f32(gc, "dy", ST * SD);
    static stack_state S;
    stack_forward(&S, &P, h0);
    cmp(gc, "y", S.y, ST * SD, 1e-4);
    stack_p G = {.A = golden_zeros(gc, L * SD * SD),
                 .F = golden_zeros(gc, L * SD * SD),
                 .in_norm = golden_zeros(gc, L * SD),
                 .post_norm = golden_zeros(gc, L * SD),
                 .attn_norm = golden_zeros(gc, L * SD),
                 .attn_proj = golden_zeros(gc, L * SD),
                 .ffn_norm = golden_zeros(gc, L * SD),
                 .ffn_proj = golden_zeros(gc, L * SD),
                 .out_norm = golden_zeros(gc, SD),
                 .out_proj = golden_zeros(gc, SD),
                 .final_norm = golden_zeros(gc, SD)};
    float *dh0 = golden_zeros(gc, ST * SD);
    stack_backward(&S, &P, &G, dh0, dy);
    cmp(gc, "dh0", dh0, ST * SD, 1e-3);
    cmp(gc, "dA", G.A, L * SD * SD, 1e-3);
    cmp(gc, "dF", G.F, L * SD * SD, 1e-3);
    cmp(gc, "din_norm", G.in_norm, L * SD, 1e-3);
    cmp(gc, "dpost_norm", G.post_norm, L * SD, 1e-3);
    cmp(gc, "dattn_norm", G.attn_norm, L * SD, 1e-3);
    cmp(gc, "dattn_proj", G.attn_proj, L * SD, 1e-3);
    cmp(gc, "dffn_norm", G.ffn_norm, L * SD, 1e-3);
    cmp(gc, "dffn_proj", G.ffn_proj, L * SD, 1e-3);
    cmp(gc, "dout_norm", G.out_norm, SD, 1e-3);
    cmp(gc, "dout_proj", G.out_proj, SD, 1e-3);
    cmp(gc, "dfinal_norm", G.final_norm, SD, 1e-3);
    golden_close(gc);
}

/* ---- finite differences of the mix ---- */

enum { FN = 3, FT = 2, FD = 4 };
typedef struct fd_mix {
    float V[FN * FT * FD], wn[FD], wp[FD], up[FT * FD];
} fd_mix;

static double fd_mix_loss(void *vctx) {
    fd_mix *f = vctx;
    const float *src[FN] = {f->V, f->V + FT * FD, f->V + 2 * FT * FD};
    float out[FT * FD];
    arl_attnres_mix_fwd(out, NULL, src, FN, FT, FD, f->wn, f->wp, 1e-5f);
    double L_ = 0.0;
    for (int i = 0; i < FT * FD; i++)
        L_ += (double)out[i] * f->up[i];
    return L_;
}

static void test_attnres_mix_fd(void) {
    arl_rng r;
    arl_rng_seed(&r, 31);
    fd_mix f;
    for (int i = 0; i < FN * FT * FD; i++)
        f.V[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    for (int i = 0; i < FD; i++) {
        f.wn[i] = (float)(0.5 + arl_rng_uniform(&r));
        f.wp[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    }
    for (int i = 0; i < FT * FD; i++)
        f.up[i] = (float)(2 * arl_rng_uniform(&r) - 1);
    const float *src[FN] = {f.V, f.V + FT * FD, f.V + 2 * FT * FD};
    float dV[FN * FT * FD] = {0}, dwn[FD] = {0}, dwp[FD] = {0};
    float *dsrc[FN] = {dV, dV + FT * FD, dV + 2 * FT * FD};
    arl_attnres_mix_bwd(dsrc, dwn, dwp, f.up, src, FN, FT, FD, f.wn, f.wp, 1e-5f);
    fd_check("fd mix dV", f.V, dV, FN * FT * FD, fd_mix_loss, &f, 1e-2f);
    fd_check("fd mix dw_norm", f.wn, dwn, FD, fd_mix_loss, &f, 1e-2f);
    fd_check("fd mix dw_proj", f.wp, dwp, FD, fd_mix_loss, &f, 1e-2f);
}

/* The parallel backward (arl_attnres_mix_bwd_ws: tokens in parallel, then dw by columns) gives
 * the same bits as the serial arl_attnres_mix_bwd, on 1, 2 and 3 threads, and the forward the
 * same bits on every thread count; enough tokens (T = 3000) that the runs really split. */
static void test_attnres_mix_threads(void) {
    enum { PN = 4, PT = 3000, PD = 64 };
    arl_rng r;
    arl_rng_seed(&r, 77);
    float *V = malloc(sizeof(float) * PN * PT * PD), *dh = malloc(sizeof(float) * PT * PD);
    float wn[PD], wp[PD];
    for (int64_t i = 0; i < PN * PT * PD; i++)
        V[i] = (float)arl_rng_normal(&r);
    for (int64_t i = 0; i < PT * PD; i++)
        dh[i] = (float)arl_rng_normal(&r);
    for (int i = 0; i < PD; i++)
        wn[i] = 1.0f + 0.1f * (float)arl_rng_normal(&r), wp[i] = 0.3f * (float)arl_rng_normal(&r);
    const float *src[PN];
    for (int j = 0; j < PN; j++)
        src[j] = V + j * PT * PD;
    double *ws = malloc(sizeof(double) * (size_t)arl_attnres_bwd_ws_doubles(PN, PT));
    /* [0]: serial reference; [1]: _ws on the current thread count */
    float *out[2], *dV[2], *dwn[2], *dwp[2];
    for (int k = 0; k < 2; k++) {
        out[k] = malloc(sizeof(float) * PT * PD), dV[k] = malloc(sizeof(float) * PN * PT * PD);
        dwn[k] = malloc(sizeof(float) * PD), dwp[k] = malloc(sizeof(float) * PD);
    }
    static const int threads[3] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++) {
        CHECK(arl_k_threads_init(threads[ti]) == ARL_OK);
        for (int k = ti == 0 ? 0 : 1; k < 2; k++) {
            float *dsrc[PN];
            memset(dV[k], 0, sizeof(float) * PN * PT * PD);
            memset(dwn[k], 0, sizeof(float) * PD), memset(dwp[k], 0, sizeof(float) * PD);
            for (int j = 0; j < PN; j++)
                dsrc[j] = dV[k] + j * PT * PD;
            arl_attnres_mix_fwd(out[k], NULL, src, PN, PT, PD, wn, wp, 1e-5f);
            if (k == 0)
                arl_attnres_mix_bwd(dsrc, dwn[k], dwp[k], dh, src, PN, PT, PD, wn, wp, 1e-5f);
            else
                arl_attnres_mix_bwd_ws(dsrc, dwn[k], dwp[k], dh, src, PN, PT, PD, wn, wp, 1e-5f,
                                       ws);
        }
        CHECK_MSG(memcmp(out[0], out[1], sizeof(float) * PT * PD) == 0 &&
                      memcmp(dV[0], dV[1], sizeof(float) * PN * PT * PD) == 0 &&
                      memcmp(dwn[0], dwn[1], sizeof(float) * PD) == 0 &&
                      memcmp(dwp[0], dwp[1], sizeof(float) * PD) == 0,
                  "attnres mix on %d threads differs from the serial backward", threads[ti]);
    }
    arl_k_threads_free();
    for (int k = 0; k < 2; k++)
        free(out[k]), free(dV[k]), free(dwn[k]), free(dwp[k]);
    free(V), free(dh), free(ws);
}

int main(void) {
    TEST_RUN(test_attnres_mix);
    TEST_RUN(test_attnres_stack);
    TEST_RUN(test_attnres_mix_fd);
    TEST_RUN(test_attnres_mix_threads);
    return test_finish();
}
