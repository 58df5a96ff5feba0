/* Determinism (kernels/threadpool.h): every non-GEMM kernel gives bit-identical results for 1,
 * 2, 3 and 4 threads and run to run; GEMMs give bit-identical results run to run for a fixed
 * thread count.  Shapes are large enough that every kernel really splits its work (more than
 * ARL_K_GRAIN elements per thread), with sizes that are not multiples of the thread count. */
#include "kernels/kernels.h"
#include "tests/kernels/kref.h"

#define T 131
#define D 1031 /* T * D = 135061 elements: several parts of 2^15 */
#define TD ((int64_t)T * D)

typedef struct inputs {
    float x[TD], g[TD], u[TD], dy[TD], w[D];
    int32_t tg[T];
} inputs;

/* Outputs of one pass over all non-GEMM kernels, compared as raw bytes. */
typedef struct outputs {
    float rms[TD], rstd[T], drms[TD], dw[D];
    float l2[TD], rn[T], dl2[TD];
    float sm[TD], dsm[TD], lsm[TD], dlsm[TD];
    float lp[T], lse[T], ent[T], dz[TD];
    float act[TD], dact[TD], phi[TD], dphi[TD];
    float glu[TD], dg[TD], du[TD];
    float ew[TD];
    float sum, sumsq, max, rows[T], cols[D], dots[T];
    int32_t top[T * 16];
    float topv[T * 16];
    int32_t am[T];
} outputs;

static void run_all(const inputs *in, outputs *o) {
    memset(o, 0, sizeof *o);
    arl_k_rmsnorm_fwd(o->rms, o->rstd, in->x, in->w, T, D, 1e-5f);
    arl_k_rmsnorm_bwd(o->drms, o->dw, in->dy, in->x, in->w, o->rstd, T, D);
    arl_k_l2norm_fwd(o->l2, o->rn, in->x, T, D, 1e-6f);
    arl_k_l2norm_bwd(o->dl2, in->dy, in->x, o->rn, T, D);
    arl_k_softmax_fwd(o->sm, in->x, T, D);
    arl_k_softmax_bwd(o->dsm, in->dy, o->sm, T, D);
    arl_k_logsoftmax_fwd(o->lsm, in->x, T, D);
    arl_k_logsoftmax_bwd(o->dlsm, in->dy, o->lsm, T, D);
    arl_k_logprob_fwd(o->lp, o->lse, o->ent, in->x, in->tg, T, D);
    arl_k_logprob_bwd(o->dz, in->dy, in->x, o->lse, in->tg, T, D);
    arl_k_gelu_erf_fwd(o->act, in->x, TD);
    arl_k_silu_bwd(o->dact, in->dy, in->x, TD);
    arl_k_situ_phi_fwd(o->phi, in->x, TD, 4.0f);
    arl_k_situ_phi_bwd(o->dphi, in->dy, in->x, TD, 4.0f);
    arl_k_situ_glu_fwd(o->glu, in->g, in->u, T, D, D, 4.0f, 25.0f);
    arl_k_situ_glu_bwd(o->dg, o->du, in->dy, in->g, in->u, T, D, D, 4.0f, 25.0f);
    arl_k_add(o->ew, in->x, in->g, TD);
    arl_k_axpy(o->ew, 0.5f, in->u, TD);
    arl_k_sum(&o->sum, in->x, TD);
    arl_k_sumsq(&o->sumsq, in->x, TD);
    arl_k_max(&o->max, in->x, TD);
    arl_k_sum_rows(o->rows, in->x, T, D);
    arl_k_sum_cols(o->cols, in->x, T, D);
    arl_k_dot_rows(o->dots, in->x, in->dy, T, D);
    arl_k_topk_rows(o->top, o->topv, in->x, T, D, 16);
    arl_k_argmax_rows(o->am, in->x, T, D);
}

static void test_non_gemm_any_thread_count(void) {
    inputs *in = kt_alloc(sizeof *in);
    outputs *ref = kt_alloc(sizeof *ref), *o = kt_alloc(sizeof *o);
    arl_rng r;
    arl_rng_seed(&r, 61);
    kt_normal(&r, in->x, TD, 0, 2);
    kt_normal(&r, in->g, TD, 0, 2);
    kt_normal(&r, in->u, TD, 0, 2);
    kt_normal(&r, in->dy, TD, 0, 1);
    kt_uniform(&r, in->w, D, 0.5, 1.5);
    for (int t = 0; t < T; t++)
        in->tg[t] = (int32_t)arl_rng_below(&r, D);
    kt_threads(1);
    run_all(in, ref);
    static const int counts[] = {1, 2, 3, 4};
    for (int c = 0; c < 4; c++) {
        kt_threads(counts[c]);
        for (int rep = 0; rep < 2; rep++) {
            run_all(in, o);
            CHECK_MSG(kt_same_bits(o, ref, sizeof *o), "threads %d rep %d differ from 1 thread",
                      counts[c], rep);
        }
    }
    free(in), free(ref), free(o);
}

/* GEMM: the same thread count gives the same bits, for each of 1..4 threads, on a shape that
 * takes the split path (and its batched form). */
static void test_gemm_fixed_thread_count(void) {
    const int64_t M = 203, N = 157, K = 301;
    float *A = kt_floats(M * K), *B = kt_floats(N * K), *C1 = kt_floats(3 * M * N);
    float *C2 = kt_floats(3 * M * N);
    arl_rng r;
    arl_rng_seed(&r, 62);
    kt_normal(&r, A, M * K, 0, 1);
    kt_normal(&r, B, N * K, 0, 1);
    for (int threads = 1; threads <= 4; threads++) {
        kt_threads(threads);
        arl_k_linear_fwd(C1, A, B, M, K, N);
        arl_k_gemm_batched(ARL_K_NOTRANS, ARL_K_TRANS, M / 3, N, K, 1.0f, A, K, (M / 3) * K, B, K,
                           0, 0.0f, C1 + M * N, N, (M / 3) * N, 3);
        for (int rep = 0; rep < 3; rep++) {
            arl_k_linear_fwd(C2, A, B, M, K, N);
            arl_k_gemm_batched(ARL_K_NOTRANS, ARL_K_TRANS, M / 3, N, K, 1.0f, A, K, (M / 3) * K, B,
                               K, 0, 0.0f, C2 + M * N, N, (M / 3) * N, 3);
            CHECK_MSG(kt_same_bits(C1, C2, (size_t)(2 * M * N) * sizeof *C1),
                      "gemm threads %d rep %d", threads, rep);
        }
    }
    free(A), free(B), free(C1), free(C2);
}

/* The backend table is the CPU kernels themselves. */
static void test_backend_table(void) {
    const arl_k_backend *kb = arl_k_backend_cpu();
    CHECK(kb != NULL && strcmp(kb->name, "cpu") == 0);
    CHECK(kb->gemm == arl_k_gemm && kb->rmsnorm_bwd == arl_k_rmsnorm_bwd);
    CHECK(kb->situ_glu_fwd == arl_k_situ_glu_fwd && kb->topk_rows == arl_k_topk_rows);
    /* every entry is set */
    const char *p = (const char *)kb + sizeof kb->name;
    int all = 1;
    for (size_t off = 0; off + sizeof(void (*)(void)) <= sizeof *kb - sizeof kb->name;
         off += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, p + off, sizeof fn);
        all &= fn != NULL;
    }
    CHECK(all);
}

int main(void) {
    TEST_RUN(test_non_gemm_any_thread_count);
    TEST_RUN(test_gemm_fixed_thread_count);
    TEST_RUN(test_backend_table);
    arl_k_threads_free();
    return test_finish();
}
