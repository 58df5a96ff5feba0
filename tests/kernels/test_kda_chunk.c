/* tests/kernels/test_kda_chunk.c: the chunkwise KDA core (policy/kda.c arl_kda_chunk_fwd, spec
 * 3.5) on the two computations of its A_kk / A_qk blocks, against a float64 token-by-token
 * recurrence (spec 3.3) written here:
 *   - gates in the K3 range (g in (-5, 0)): every 16-token sub-chunk uses the factored form
 *     (dense products with G relative to the sub-chunk's first token);
 *   - strong decays (g down to -30, as the unbounded softplus gate can give): the factors of a
 *     sub-chunk would leave e^{+-80}, so those sub-chunks fall back to the difference form;
 *   - a mix (strong decay on some channels only), several documents, a ragged last chunk,
 *     chunk lengths 64, 16 and 7, a non-zero initial state.
 * Also the recurrent core (row-wise step) against the same reference, both cores bit for bit
 * across 1, 2 and 3 threads, and the chunkwise backward against the recurrent backward on the
 * same three gate regimes (check_backward), and the stages that run over channels or rows
 * (conv, K3 gate backward, output norm) bit for bit across thread counts.
 *
 * Tolerance (spec 16.4, KDA forward): max|ref| form, atol 0, rtol 1e-4 on o and on the final
 * states: fp32 reductions over dk and dv per token and a state carried over the document give
 * ~1e-6 relative; a wrong decay factor or a missing pair gives errors of order max|ref|.
 * This lives with the kernel tests because it checks the GEMM form of the core; the golden
 * vectors of tests/golden/test_kda.c cover the K3 gate range only. */
#include <math.h>

#include "kernels/threadpool.h"
#include "policy/kda.h"
#include "tests/kernels/kref.h"

#define H 2
#define DK 32
#define DV 24
#define T 150
#define N 2
#define RTOL 1e-4

static const int32_t CU[N + 1] = {0, 97, T};

/* float64 spec 3.3 for every document, from S0 (N, H, dk, dv); o (T, H, dv), S (N, H, dk, dv). */
static void reference(double *o, double *S, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, const float *S0, float scale) {
    for (int64_t i = 0; i < N * H * DK * DV; i++)
        S[i] = S0[i];
    for (int d = 0; d < N; d++)
        for (int h = 0; h < H; h++) {
            double *St = S + ((int64_t)d * H + h) * DK * DV;
            for (int t = CU[d]; t < CU[d + 1]; t++) {
                const float *qt = q + (t * H + h) * DK, *kt = k + (t * H + h) * DK;
                const float *vt = v + (t * H + h) * DV, *gt = g + (t * H + h) * DK;
                double bt = beta[t * H + h];
                for (int c = 0; c < DK; c++)
                    for (int j = 0; j < DV; j++)
                        St[c * DV + j] *= exp((double)gt[c]);
                for (int j = 0; j < DV; j++) {
                    double r = 0;
                    for (int c = 0; c < DK; c++)
                        r += St[c * DV + j] * kt[c];
                    double delta = bt * (vt[j] - r);
                    for (int c = 0; c < DK; c++)
                        St[c * DV + j] += kt[c] * delta;
                }
                for (int j = 0; j < DV; j++) {
                    double acc = 0;
                    for (int c = 0; c < DK; c++)
                        acc += St[c * DV + j] * qt[c];
                    o[(t * H + h) * DV + j] = scale * acc;
                }
            }
        }
}

static void unit_rows(arl_rng *r, float *x, int64_t rows, int64_t d) {
    kt_normal(r, x, rows * d, 0, 1);
    for (int64_t i = 0; i < rows; i++) {
        double s = 0;
        for (int64_t c = 0; c < d; c++)
            s += (double)x[i * d + c] * x[i * d + c];
        for (int64_t c = 0; c < d; c++)
            x[i * d + c] = (float)(x[i * d + c] / sqrt(s));
    }
}

static void to_f32(float *y, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)x[i];
}

/* The chunkwise backward (spec 3.8: its pair terms as GEMMs over 16-token sub-chunks, or pair by
 * pair where the factors would leave the fp32 range) against the recurrent backward (3.7), the
 * second reference, for chunk lengths 64, 16 and 7, with a non-zero dS_T and dS0 wanted; bit for
 * bit across thread counts.  Tolerance: max|ref| form per gradient, atol 0, rtol 1e-3: both
 * rules are fp32 with sums over dk, dv and a document's tokens (~1e-5 relative measured); a
 * missing or misplaced pair term, decay or sub-chunk boundary errs by O(max|ref|). */
static void check_backward(int kind, const float *q, const float *k, const float *v,
                           const float *g, const float *beta, const float *S0, float scale) {
    arl_rng r;
    arl_rng_seed(&r, 200 + (uint64_t)kind);
    const int64_t nq = T * H * DK, nv = T * H * DV, ns = N * H * DK * DV;
    float *d_o = kt_floats(nv), *dST = kt_floats(ns), *S = kt_floats(ns), *o = kt_floats(nv);
    kt_normal(&r, d_o, nv, 0, 1);
    kt_normal(&r, dST, ns, 0, 0.3);
    /* gradients: [rule][dq, dk, dv, dg, dbeta, dS0] */
    const int64_t sizes[6] = {nq, nq, nv, nq, T * H, ns};
    static const char *names[6] = {"dq", "dk", "dv", "dg", "dbeta", "dS0"};
    float *gr[3][6];
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++)
            gr[a][j] = kt_floats(sizes[j]);
    static const int64_t chunks[] = {64, 16, 7};
    for (int ci = 0; ci < 3; ci++) {
        const int64_t C = chunks[ci];
        float *cst = kt_floats(arl_kda_num_chunks(CU, N, T, C) * H * DK * DV);
        float *ws = kt_floats(arl_kda_chunk_ws_floats(H, DK, DV, C));
        float *bws = kt_floats(arl_kda_bwd_ws_floats(H, DK, DV, C));
        memcpy(S, S0, sizeof(float) * ns);
        arl_kda_chunk_fwd(o, S, cst, q, k, v, g, beta, CU, N, T, H, DK, DV, scale, C, ws);
        /* a = 0: recurrent rule; a = 1, 2: chunk rule on the first and on later thread counts */
        for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
            kt_threads(kt_thread_counts[tc]);
            for (int a = tc == 0 ? 0 : 2; a < 3 && (tc == 0 ? a < 2 : 1); a++) {
                float **d = gr[a];
                for (int j = 0; j < 6; j++)
                    memset(d[j], 0, sizeof(float) * (size_t)sizes[j]);
                (a == 0 ? arl_kda_recurrent_bwd : arl_kda_chunk_bwd)(
                    d[0], d[1], d[2], d[3], d[4], d[5], d_o, dST, q, k, v, g, beta, cst, CU, N, T,
                    H, DK, DV, scale, C, bws);
            }
            if (tc == 0) {
                for (int j = 0; j < 6; j++) {
                    char what[96];
                    snprintf(what, sizeof what, "gates %d chunk %lld %s: chunk vs recurrent rule",
                             kind, (long long)C, names[j]);
                    check_close_maxref_f32(what, gr[1][j], gr[0][j], (size_t)sizes[j], 0.0, 1e-3);
                }
            } else {
                int same = 1;
                for (int j = 0; j < 6; j++)
                    same &= kt_same_bits(gr[1][j], gr[2][j], sizeof(float) * (size_t)sizes[j]);
                CHECK_MSG(same, "gates %d chunk %lld backward: %d threads differ from 1", kind,
                          (long long)C, kt_thread_counts[tc]);
            }
        }
        free(cst), free(ws), free(bws);
    }
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++)
            free(gr[a][j]);
    free(d_o), free(dST), free(S), free(o);
}

/* gates: 0 = K3 range, 1 = strong decay everywhere, 2 = strong decay on every 5th channel */
static void run_gates(int kind) {
    arl_rng r;
    arl_rng_seed(&r, 100 + (uint64_t)kind);
    const int64_t nq = T * H * DK, nv = T * H * DV, ns = N * H * DK * DV;
    float *q = kt_floats(nq), *k = kt_floats(nq), *v = kt_floats(nv), *g = kt_floats(nq);
    float *beta = kt_floats(T * H), *S0 = kt_floats(ns);
    unit_rows(&r, q, T * H, DK);
    unit_rows(&r, k, T * H, DK);
    kt_normal(&r, v, nv, 0, 1);
    kt_uniform(&r, beta, T * H, 0.05, 0.95);
    kt_normal(&r, S0, ns, 0, 0.3);
    for (int64_t i = 0; i < nq; i++) {
        int strong = kind == 1 || (kind == 2 && i % 5 == 0);
        g[i] = (float)(strong ? -2.0 - 28.0 * arl_rng_uniform(&r) : -5.0 * arl_rng_uniform(&r));
    }
    const float scale = 1.0f / sqrtf((float)DK);
    double *o_ref = kt_doubles(nv), *S_ref = kt_doubles(ns);
    reference(o_ref, S_ref, q, k, v, g, beta, S0, scale);
    float *o_r = kt_floats(nv), *S_r = kt_floats(ns);
    to_f32(o_r, o_ref, nv);
    to_f32(S_r, S_ref, ns);

    static const int64_t chunks[] = {64, 16, 7};
    float *o = kt_floats(nv), *S = kt_floats(ns), *o1 = kt_floats(nv), *S1 = kt_floats(ns);
    for (int ci = 0; ci < 3; ci++) {
        const int64_t C = chunks[ci];
        float *ws = kt_floats(arl_kda_chunk_ws_floats(H, DK, DV, C));
        for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
            kt_threads(kt_thread_counts[tc]);
            memcpy(S, S0, sizeof(float) * ns);
            arl_kda_chunk_fwd(o, S, NULL, q, k, v, g, beta, CU, N, T, H, DK, DV, scale, C, ws);
            char what[96];
            snprintf(what, sizeof what, "gates %d chunk %lld o", kind, (long long)C);
            check_close_maxref_f32(what, o, o_r, (size_t)nv, 0.0, RTOL);
            snprintf(what, sizeof what, "gates %d chunk %lld S", kind, (long long)C);
            check_close_maxref_f32(what, S, S_r, (size_t)ns, 0.0, RTOL);
            if (tc == 0) {
                memcpy(o1, o, sizeof(float) * nv);
                memcpy(S1, S, sizeof(float) * ns);
            } else {
                CHECK_MSG(kt_same_bits(o, o1, sizeof(float) * nv) &&
                              kt_same_bits(S, S1, sizeof(float) * ns),
                          "gates %d chunk %lld: %d threads differ from 1", kind, (long long)C,
                          kt_thread_counts[tc]);
            }
        }
        free(ws);
    }
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        memcpy(S, S0, sizeof(float) * ns);
        arl_kda_recurrent_fwd(o, S, NULL, q, k, v, g, beta, CU, N, T, H, DK, DV, scale, 0);
        check_close_maxref_f32("recurrent o", o, o_r, (size_t)nv, 0.0, RTOL);
        check_close_maxref_f32("recurrent S", S, S_r, (size_t)ns, 0.0, RTOL);
        if (tc == 0) {
            memcpy(o1, o, sizeof(float) * nv);
            memcpy(S1, S, sizeof(float) * ns);
        } else {
            CHECK(kt_same_bits(o, o1, sizeof(float) * nv) &&
                  kt_same_bits(S, S1, sizeof(float) * ns));
        }
    }
    check_backward(kind, q, k, v, g, beta, S0, scale);
    free(q), free(k), free(v), free(g), free(beta), free(S0), free(o_ref), free(S_ref);
    free(o_r), free(S_r), free(o), free(S), free(o1), free(S1);
}

static void test_k3_gates(void) {
    run_gates(0);
}

static void test_strong_decay(void) {
    run_gates(1);
}

static void test_mixed_decay(void) {
    run_gates(2);
}

/* The stages that run over channels or rows on the pool (short conv forward and backward, K3 gate
 * backward, output norm forward and backward) give the same bits on 1, 2 and 3 threads: each
 * sum over tokens runs in ascending order whatever the split.  Shapes large enough to split
 * (T = 1500 tokens in three documents, 96 channels, the conv with tails). */
static void test_stages_threads(void) {
    enum { ST = 1500, SC = 96, SW = 4, SH = 2, SDK = SC / SH, SN = 3 };
    static const int32_t scu[SN + 1] = {0, 700, 1201, ST};
    arl_rng r;
    arl_rng_seed(&r, 300);
    float *x = kt_floats(ST * SC), *w = kt_floats(SC * SW), *tails = kt_floats(SN * SC * (SW - 1));
    float *dz = kt_floats(ST * SC), *gam = kt_floats(ST * SC), *ow = kt_floats(SDK);
    float *Al = kt_floats(SH), *dtb = kt_floats(SC);
    kt_normal(&r, x, ST * SC, 0, 1);
    kt_normal(&r, w, SC * SW, 0, 0.5);
    kt_normal(&r, tails, SN * SC * (SW - 1), 0, 1);
    kt_normal(&r, dz, ST * SC, 0, 1);
    kt_normal(&r, gam, ST * SC, 0, 2);
    kt_normal(&r, ow, SDK, 1, 0.1);
    kt_normal(&r, Al, SH, 0, 0.5);
    kt_normal(&r, dtb, SC, 0, 0.5);
    /* outputs: z, y, dx, dw, df, dA, ddt, ob, rstd, d_o, dgam, dwo */
    enum { NO = 12 };
    const int64_t sz[NO] = {ST * SC, ST * SC, ST * SC, SC * SW, ST * SC, SH, SC,
                            ST * SC, ST * SH, ST * SC, ST * SC, SDK};
    float *out[2][NO];
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < NO; j++)
            out[k][j] = kt_floats(sz[j]);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        float **o = out[tc == 0 ? 0 : 1];
        for (int j = 0; j < NO; j++)
            memset(o[j], 0, sizeof(float) * (size_t)sz[j]);
        arl_kda_conv_fwd(o[0], o[1], x, w, tails, scu, SN, ST, SC, SW);
        arl_kda_conv_bwd(o[2], o[3], dz, x, w, tails, scu, SN, ST, SC, SW);
        arl_kda_gate_k3_bwd(o[4], o[5], o[6], dz, x, Al, dtb, ST, SH, SDK, -5.0f);
        arl_kda_onorm_fwd(o[7], o[8], x, gam, ow, ST * SH, SDK, 1e-6f);
        arl_kda_onorm_bwd(o[9], o[10], o[11], dz, x, gam, ow, o[8], ST * SH, SDK);
        if (tc == 0) continue;
        int same = 1;
        for (int j = 0; j < NO; j++)
            same &= kt_same_bits(out[0][j], out[1][j], sizeof(float) * (size_t)sz[j]);
        CHECK_MSG(same, "KDA stages: %d threads differ from 1", kt_thread_counts[tc]);
    }
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < NO; j++)
            free(out[k][j]);
    free(x), free(w), free(tails), free(dz), free(gam), free(ow), free(Al), free(dtb);
}

int main(void) {
    TEST_RUN(test_k3_gates);
    TEST_RUN(test_strong_decay);
    TEST_RUN(test_mixed_decay);
    TEST_RUN(test_stages_threads);
    arl_k_threads_free();
    return test_finish();
}
