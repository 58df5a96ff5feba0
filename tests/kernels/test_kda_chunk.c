/* tests/kernels/test_kda_chunk.c: the chunkwise KDA core (policy/kda.c arl_kda_chunk_fwd, spec
 * 3.5) on the two computations of its A_kk / A_qk blocks, against a float64 token-by-token
 * recurrence (spec 3.3) written here:
 *   - gates in the K3 range (g in (-5, 0)): every 16-token sub-chunk uses the factored form
 *     (dense products with G relative to the sub-chunk's first token);
 *   - strong decays (g down to -30, as the unbounded softplus gate can give): the factors of a
 *     sub-chunk would leave e^{+-80}, so those sub-chunks fall back to the difference form;
 *   - a mix (strong decay on some channels only), several documents, a ragged last chunk,
 *     chunk lengths 64, 16 and 7, a non-zero initial state.
 * Also the recurrent core (row-wise step) against the same reference, and both cores bit for
 * bit across 1, 2 and 3 threads.
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

int main(void) {
    TEST_RUN(test_k3_gates);
    TEST_RUN(test_strong_decay);
    TEST_RUN(test_mixed_decay);
    arl_k_threads_free();
    return test_finish();
}
