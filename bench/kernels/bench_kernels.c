/* bench/kernels/bench_kernels.c: speed of the CPU kernels against baselines measured in the
 * same run.
 *
 *   GEMM: arl_k_gemm (pool-split, OpenBLAS on one thread per block) vs raw cblas_sgemm with
 *         OpenBLAS's own threads, both on the same number of threads; and on 1 thread (the
 *         wrapper's overhead alone).  The ratio arl / raw should be ~1.0.
 *   GEMM layouts: NN, NT and TN products at the tiny and mini configs' shapes on one thread,
 *         arl_k_gemm vs cblas_sgemm.
 *   Row kernels: RMSNorm, SiTU-GLU and softmax forward in GB/s (bytes read + written once)
 *         vs a naive single-thread loop.
 *
 * Timing: the variants compared are measured in turn, ROUNDS times over (each measurement
 * repeats the call for >= MEASURE_S), and each keeps its best time: the machine is shared, and
 * interleaving exposes every variant to the same load.  Ratios are speed ratios (time of the
 * baseline over time of ours: > 1 means ours is faster).  Usage:
 *   bench_kernels [--threads N] [THREADS]      (--help; default: ARL_K_THREADS_DEFAULT)
 * Exit status: 0 done, 1 failure, 2 usage error. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/common/bench.h"
#include "core/options.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "kernels/threadpool.h"

#define now bench_now

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef void (*bench_fn)(void *ctx);

/* Seconds per call of fn, over repetitions lasting >= MEASURE_S. */
#define MEASURE_S 0.05
#define ROUNDS 4

static double time_once(bench_fn fn, void *ctx) {
    int reps = 0;
    double t0 = now(), t;
    do {
        fn(ctx);
        reps++;
        t = now() - t0;
    } while (t < MEASURE_S);
    return t / reps;
}

static void keep_min(double *best, double t) {
    if (t < *best) *best = t;
}

static float *rand_floats(arl_rng *r, int64_t n, double sd) {
    float *x = bench_xmalloc("bench_kernels", (size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(sd * arl_rng_normal(r));
    return x;
}

/* ---- GEMM: y (T, out) = x (T, in) W^T, W (out, in) ---- */

typedef struct gemm_ctx {
    int64_t T, in, out;
    const float *x, *W;
    float *y;
} gemm_ctx;

static void run_raw(void *v) {
    gemm_ctx *g = v;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->T, (int)g->out, (int)g->in, 1.0f,
                g->x, (int)g->in, g->W, (int)g->in, 0.0f, g->y, (int)g->out);
}

static void run_arl(void *v) {
    gemm_ctx *g = v;
    arl_k_linear_fwd(g->y, g->x, g->W, g->T, g->in, g->out);
}

static void bench_gemm(arl_rng *r, int threads) {
    static const int64_t shapes[][3] = {
        {512, 1024, 1024}, /* T, in, out: a prefill projection */
        {2048, 512, 2048}, /* a tall expert GEMM */
        {64, 1024, 3072},  /* a short segment into an FFN */
        {1, 2048, 4096},   /* decode: one token */
    };
    printf("\nGEMM y = x W^T (GFLOP/s; raw = cblas_sgemm with OpenBLAS threads)\n");
    printf("%6s %6s %6s | %9s %9s %7s | %9s %9s %7s\n", "T", "in", "out", "raw 1T", "arl 1T",
           "arl/raw", "raw", "arl", "arl/raw");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        gemm_ctx g = {shapes[s][0], shapes[s][1], shapes[s][2], NULL, NULL, NULL};
        float *x = rand_floats(r, g.T * g.in, 1), *W = rand_floats(r, g.out * g.in, 0.05);
        float *y = rand_floats(r, g.T * g.out, 1);
        g.x = x, g.W = W, g.y = y;
        double flop = 2.0 * (double)g.T * (double)g.in * (double)g.out;

        double raw1 = 1e30, arl1 = 1e30, rawn = 1e30, arln = 1e30;
        run_raw(&g); /* warm-up: page in the buffers */
        for (int round = 0; round < ROUNDS; round++) {
            arl_k_threads_init(1); /* also sets OpenBLAS to one thread */
            keep_min(&raw1, time_once(run_raw, &g));
            keep_min(&arl1, time_once(run_arl, &g));
            arl_k_threads_init(threads);
            keep_min(&arln, time_once(run_arl, &g));
            openblas_set_num_threads(threads); /* raw baseline: OpenBLAS's own threading */
            keep_min(&rawn, time_once(run_raw, &g));
            openblas_set_num_threads(1);
            nap_ms(150); /* OpenBLAS workers spin ~0.1 s after use: let them sleep again */
        }

        printf("%6lld %6lld %6lld | %9.1f %9.1f %7.2f | %9.1f %9.1f %7.2f\n", (long long)g.T,
               (long long)g.in, (long long)g.out, flop / raw1 / 1e9, flop / arl1 / 1e9, raw1 / arl1,
               flop / rawn / 1e9, flop / arln / 1e9, rawn / arln);
        free(x), free(W), free(y);
    }
}

/* ---- GEMM in the learner's three layouts, one thread ---- */

typedef struct layout_ctx {
    int64_t M, N, K;
    int ta, tb;
    const float *A, *B;
    float *C;
} layout_ctx;

static void layout_raw(void *v) {
    layout_ctx *g = v;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (int)g->M, (int)g->N, (int)g->K, 1.0f, g->A, (int)(g->ta ? g->M : g->K), g->B,
                (int)(g->tb ? g->K : g->N), 0.0f, g->C, (int)g->N);
}

static void layout_arl(void *v) {
    layout_ctx *g = v;
    arl_k_gemm(g->ta ? ARL_K_TRANS : ARL_K_NOTRANS, g->tb ? ARL_K_TRANS : ARL_K_NOTRANS, g->M, g->N,
               g->K, 1.0f, g->A, g->ta ? g->M : g->K, g->B, g->tb ? g->K : g->N, 0.0f, g->C, g->N);
}

/* C (M, N) = op(A) op(B): a Linear map forward (NT: x W^T), its input gradient (NN: dy W) and
 * its weight gradient (TN: dy^T x), at the tiny config's widths (d = 128, a 64-token KDA chunk)
 * and the mini config's (d = 1024); one thread each side, so the tiles face OpenBLAS's own
 * kernel for this CPU. */
static void bench_gemm_layouts(arl_rng *r) {
    static const struct {
        int64_t M, N, K;
        int ta, tb;
    } shapes[] = {
        {64, 64, 64, 0, 0},      {64, 64, 64, 0, 1},      {64, 64, 64, 1, 0},
        {256, 384, 128, 0, 1},   {256, 128, 384, 0, 0},   {384, 128, 256, 1, 0},
        {512, 1024, 1024, 0, 1}, {512, 1024, 1024, 0, 0}, {1024, 1024, 512, 1, 0},
    };
    printf("\nGEMM C = op(A) op(B), 1 thread (GFLOP/s; raw = cblas_sgemm)\n");
    printf("%6s %6s %6s %2s | %9s %9s %7s\n", "M", "N", "K", "op", "raw", "arl", "arl/raw");
    arl_k_threads_init(1);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        layout_ctx g = {shapes[s].M,  shapes[s].N, shapes[s].K, shapes[s].ta,
                        shapes[s].tb, NULL,        NULL,        NULL};
        float *A = rand_floats(r, g.M * g.K, 1), *B = rand_floats(r, g.K * g.N, 0.05);
        float *C = rand_floats(r, g.M * g.N, 1);
        g.A = A, g.B = B, g.C = C;
        double flop = 2.0 * (double)g.M * (double)g.N * (double)g.K, raw = 1e30, arl = 1e30;
        layout_raw(&g); /* warm-up */
        for (int round = 0; round < ROUNDS; round++) {
            keep_min(&raw, time_once(layout_raw, &g));
            keep_min(&arl, time_once(layout_arl, &g));
        }
        printf("%6lld %6lld %6lld %c%c | %9.1f %9.1f %7.2f\n", (long long)g.M, (long long)g.N,
               (long long)g.K, g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', flop / raw / 1e9,
               flop / arl / 1e9, raw / arl);
        free(A), free(B), free(C);
    }
}

/* ---- row kernels vs naive single-thread loops ---- */

typedef struct row_ctx {
    int64_t T, d;
    const float *x, *u, *w;
    float *y;
} row_ctx;

static void naive_rmsnorm(void *v) {
    row_ctx *c = v;
    for (int64_t t = 0; t < c->T; t++) {
        const float *x = c->x + t * c->d;
        float ss = 0;
        for (int64_t i = 0; i < c->d; i++)
            ss += x[i] * x[i];
        float r = 1.0f / sqrtf(ss / (float)c->d + 1e-5f);
        for (int64_t i = 0; i < c->d; i++)
            c->y[t * c->d + i] = c->w[i] * x[i] * r;
    }
}
static void arl_rmsnorm(void *v) {
    row_ctx *c = v;
    arl_k_rmsnorm_fwd(c->y, NULL, c->x, c->w, c->T, c->d, 1e-5f);
}

static void naive_situ_glu(void *v) {
    row_ctx *c = v;
    for (int64_t i = 0; i < c->T * c->d; i++) {
        float g = c->x[i], u = c->u[i];
        float phi = 4.0f * tanhf(g / 4.0f) / (1.0f + expf(-g));
        c->y[i] = phi * 25.0f * tanhf(u / 25.0f);
    }
}
static void arl_situ_glu(void *v) {
    row_ctx *c = v;
    arl_k_situ_glu_fwd(c->y, c->x, c->u, c->T, c->d, c->d, 4.0f, 25.0f);
}

static void naive_softmax(void *v) {
    row_ctx *c = v;
    for (int64_t t = 0; t < c->T; t++) {
        const float *x = c->x + t * c->d;
        float *y = c->y + t * c->d, m = x[0], s = 0;
        for (int64_t i = 1; i < c->d; i++)
            m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < c->d; i++)
            s += (y[i] = expf(x[i] - m));
        for (int64_t i = 0; i < c->d; i++)
            y[i] /= s;
    }
}
static void arl_softmax(void *v) {
    row_ctx *c = v;
    arl_k_softmax_fwd(c->y, c->x, c->T, c->d);
}

static void bench_rows(arl_rng *r, int threads) {
    const int64_t T = 1024, d = 2048;
    row_ctx c = {T, d, NULL, NULL, NULL, NULL};
    float *x = rand_floats(r, T * d, 2), *u = rand_floats(r, T * d, 2), *w = rand_floats(r, d, 1);
    float *y = rand_floats(r, T * d, 1);
    c.x = x, c.u = u, c.w = w, c.y = y;
    struct {
        const char *name;
        bench_fn naive, arl;
        double bytes; /* read + written once */
    } ops[] = {
        {"rmsnorm_fwd", naive_rmsnorm, arl_rmsnorm, 2.0 * T * d * 4},
        {"situ_glu_fwd", naive_situ_glu, arl_situ_glu, 3.0 * T * d * 4},
        {"softmax_fwd", naive_softmax, arl_softmax, 2.0 * T * d * 4},
    };
    printf("\nRow kernels, T %lld x d %lld (GB/s of bytes read + written once)\n", (long long)T,
           (long long)d);
    printf("%-14s | %9s %9s %9s | %12s\n", "kernel", "naive 1T", "arl 1T", "arl", "arl / naive");
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        double tn = 1e30, t1 = 1e30, tt = 1e30;
        ops[k].naive(&c); /* warm-up */
        for (int round = 0; round < ROUNDS; round++) {
            arl_k_threads_init(1);
            keep_min(&tn, time_once(ops[k].naive, &c));
            keep_min(&t1, time_once(ops[k].arl, &c));
            arl_k_threads_init(threads);
            keep_min(&tt, time_once(ops[k].arl, &c));
        }
        printf("%-14s | %9.2f %9.2f %9.2f | %12.2f\n", ops[k].name, ops[k].bytes / tn / 1e9,
               ops[k].bytes / t1 / 1e9, ops[k].bytes / tt / 1e9, tn / tt);
    }
    free(x), free(u), free(w), free(y);
}

typedef struct kopts {
    int64_t threads;
    int64_t threads_pos; /* the older positional form; 0: --threads */
} kopts;

static const arl_option OPTS[] = {
    {"threads", ARL_OPT_INT, offsetof(kopts, threads), BENCH_STR(ARL_K_THREADS_DEFAULT),
     "threads of the kernels' pool and of raw OpenBLAS in the multi-thread columns", 1, 256, NULL,
     0, "N"},
    {"threads-arg", ARL_OPT_INT, offsetof(kopts, threads_pos), "0",
     "the same as --threads N (the older form; 0: --threads)", 0, 256, NULL, ARL_OPT_POSITIONAL,
     "THREADS"},
};

int main(int argc, char **argv) {
    kopts o;
    const char *summary = "CPU kernels vs baselines in the same run: GEMM wrapper vs raw "
                          "cblas_sgemm, row kernels vs naive loops (ratios: speed of arl over "
                          "the baseline's, > 1 is faster)";
    int done = bench_options_parse("bench_kernels", summary, OPTS, ARL_OPTIONS_COUNT(OPTS), argc,
                                   argv, &o);
    if (done >= 0) return done;
    const int threads = (int)(o.threads_pos ? o.threads_pos : o.threads);
    if (arl_k_threads_init(threads) != ARL_OK) return bench_fail("bench_kernels", "threads");
    printf("bench_kernels: %d threads; %s; OpenBLAS core %s\n", threads, openblas_get_config(),
           openblas_get_corename());
    arl_rng r;
    arl_rng_seed(&r, 1);
    double t0 = now();
    bench_gemm(&r, threads);
    bench_gemm_layouts(&r);
    bench_rows(&r, threads);
    printf("\ntotal %.1f s\n", now() - t0);
    arl_k_threads_free();
    return 0;
}
