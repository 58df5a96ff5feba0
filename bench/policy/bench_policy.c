/* bench/policy/bench_policy.c: speed of the CPU policy (policy/model.h) against a PyTorch
 * baseline measured in the same run, the KDA chunkwise core against the recurrent one, and
 * the decode state's bytes per sequence.
 *
 *   prefill   tokens/s of one sequence of T tokens (default 2048) from a fresh start into a
 *             decode-state slot, last-position logits (arl_model_prefill), vs the same in
 *             bench/policy/torch_model.py (PyTorch fp32 eager, same checkpoint, same threads).
 *   decode    tokens/s of one-token steps (arl_model_decode_step) for batch 1 and 16 after an
 *             untimed prefill of --decode-context tokens per sequence, vs the PyTorch model
 *             with its state cache.
 *   KDA core  arl_kda_chunk_fwd (C = 64) vs arl_kda_recurrent_fwd at T = --kda-tokens, at the
 *             tiny (H 2, dk 64) and mini (H 8, dk 128) head shapes (C vs C); their outputs
 *             must agree.
 *   state     bytes of one sequence's decode state at 1K, 64K and 1M tokens of context,
 *             read from a real arl_decode_state (KDA arena stride, MLA rows reserved) and
 *             its export size, next to the closed form of arl_model_memory_compute.
 *
 * Correctness before speed: the PyTorch process first checks itself against the golden tiny
 * model (tests/golden/data/model_tiny.safetensors) and then against the logits this program's
 * C model computes for the timed T-token sequence; any disagreement (max|ref| form, rtol 1e-4)
 * ends the run with exit status 1.  Without /usr/bin/python3 or torch the C numbers are
 * printed and the baseline is reported unavailable (exit 0).
 *
 * Timing: every measurement is repeated --reps times after a warm-up; C and PyTorch runs are
 * interleaved (PyTorch runs as a child process answering requests on a pipe), so both see the
 * same load on a shared machine; medians are reported.  The PyTorch child runs with
 * OMP_WAIT_POLICY=PASSIVE by default (--omp-wait-policy): its OpenMP threads then sleep in
 * barriers like the C pool's workers do, instead of spinning, which on a loaded machine
 * otherwise makes PyTorch 10-50x slower than it is (measured) - an unfair baseline.
 *
 * Usage: bench_policy [--ckpt DIR] [--threads N] [--prefill-tokens T] [--reps R] ... (--help)
 * Exit status: 0 done (whatever the ratios), 1 a failure or a correctness check failed,
 * 2 usage error.
 */
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "bench/common/pychild.h"
#include "bench/common/tmpdir.h"
#include "core/assert.h"
#include "core/options.h"
#include "core/rng.h"
#include "core/status.h"
#include "kernels/kernels.h"
#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/kda.h"
#include "policy/model.h"
#include "policy/params.h"
#include "policy/state.h"

#ifndef ARL_BENCH_SOURCE_DIR
#define ARL_BENCH_SOURCE_DIR "."
#endif

/* Whole-model and KDA-core comparisons in fp32 (spec 16.4): max|ref| form, atol 0,
 * rtol 1e-4 (long fp32 reductions; chunk and recurrent forms round differently). */
#define RTOL 1e-4

#define MAX_REPS 100

typedef struct bench_opts {
    char *ckpt;
    char *config;
    int64_t seed;
    int64_t threads;
    int64_t T;
    int64_t reps;
    int64_t decode_context;
    int64_t decode_steps;
    int64_t kda_T;
    char *python;
    char *script;
    int baseline;
    char *omp_wait;
    char *only;
} bench_opts;

static const arl_option OPTS[] = {
    {"ckpt", ARL_OPT_STRING, offsetof(bench_opts, ckpt), "",
     "checkpoint directory to time (empty: write one of --config with --seed to a temp dir)", 0, 0,
     NULL, 0, "DIR"},
    {"config", ARL_OPT_STRING, offsetof(bench_opts, config),
     ARL_BENCH_SOURCE_DIR "/configs/tiny/config.json",
     "config of the checkpoint written when --ckpt is empty", 0, 0, NULL, 0, "FILE"},
    {"seed", ARL_OPT_INT, offsetof(bench_opts, seed), "1", "seed of that checkpoint and inputs", 0,
     1e15, NULL, 0, "N"},
    {"threads", ARL_OPT_INT, offsetof(bench_opts, threads), "2",
     "threads of the C kernels' pool and of PyTorch (torch.set_num_threads)", 1, 256, NULL, 0, "N"},
    {"prefill-tokens", ARL_OPT_INT, offsetof(bench_opts, T), "2048", "prefill length T", 16,
     1 << 20, NULL, 0, "T"},
    {"reps", ARL_OPT_INT, offsetof(bench_opts, reps), "5",
     "timed repetitions of each measurement (the median is reported)", 1, MAX_REPS, NULL, 0, "N"},
    {"decode-context", ARL_OPT_INT, offsetof(bench_opts, decode_context), "256",
     "tokens prefilled per sequence before the timed decode steps", 1, 1 << 20, NULL, 0, "N"},
    {"decode-steps", ARL_OPT_INT, offsetof(bench_opts, decode_steps), "64",
     "timed decode steps per repetition", 1, 1 << 20, NULL, 0, "N"},
    {"kda-tokens", ARL_OPT_INT, offsetof(bench_opts, kda_T), "8192",
     "T of the KDA chunk-vs-recurrent comparison", 64, 1 << 22, NULL, 0, "T"},
    BENCH_BASELINE_OPTIONS(bench_opts, ARL_BENCH_SOURCE_DIR "/bench/policy/torch_model.py"),
    {"only", ARL_OPT_CHOICE, offsetof(bench_opts, only), "all",
     "run one part only (for profiling, e.g. under perf record; C only unless all)", 0, 0,
     "all|prefill|decode|kda|state", 0, NULL},
};
#define N_OPTS ARL_OPTIONS_COUNT(OPTS)

static void *xmalloc(size_t bytes) {
    return bench_xmalloc("bench_policy", bytes);
}

static int fail(const char *what) {
    return bench_fail("bench_policy", what);
}

/* max |a - ref| / max |ref| (the max|ref| form of spec 16.4 with atol = 0). */
static double max_ref_err(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)ref[i]), r = fabs((double)ref[i]);
        if (!(e <= num)) num = e; /* NaN propagates */
        if (r > den) den = r;
    }
    return num / (den > 0 ? den : 1.0);
}

/* ---- the PyTorch child process (bench/common/pychild.h) ---- */

/* Start the child and read its verification line (bench_child_start). */
static bench_child_state baseline_start(bench_child *b, const bench_opts *o, const char *ckpt,
                                        const char *tok_path, const char *logit_path,
                                        json_t **info, char *why, size_t cap) {
    char threads[32];
    snprintf(threads, sizeof threads, "%lld", (long long)o->threads);
    char *args[] = {o->python,        o->script,          "--serve",
                    "--ckpt",         (char *)ckpt,       "--threads",
                    threads,          "--check-tokens",   (char *)tok_path,
                    "--check-logits", (char *)logit_path, NULL};
    const char *env[][2] = {
        {"OMP_WAIT_POLICY", strcmp(o->omp_wait, "inherit") != 0 ? o->omp_wait : NULL},
        {"OMP_NUM_THREADS", threads},
    };
    return bench_child_start(b, args, env, 2, info, why, cap);
}

/* Seconds of one timed request ("prefill T 1", "decode B CTX STEPS"); < 0 on failure. */
static double baseline_time(bench_child *b, const char *req) {
    json_t *j = bench_child_request(b, req, "bench_policy");
    if (!j) return -1;
    json_t *s = json_object_get(j, "s");
    double v = json_is_number(s) ? json_number_value(s) : -1;
    if (!(v > 0)) { /* 0 would make an infinite rate */
        fprintf(stderr, "bench_policy: baseline: bad reply to '%s' (no positive time)\n", req);
        v = -1;
    }
    json_decref(j);
    return v;
}

/* ---- the C model's runs ---- */

typedef struct crun {
    arl_model *m;
    arl_decode_state *st;
    const int32_t *tokens; /* (B, len) per-sequence tokens, row stride len */
    int64_t len;
    float *logits; /* (B, V) */
} crun;

/* Put slot i into use, fresh. */
static void slot_fresh(arl_decode_state *st, int32_t i) {
    if (st->slots[i].active) {
        arl_decode_state_reset(st, i);
        return;
    }
    int32_t got;
    arl_status s = arl_decode_state_join(st, &got);
    ARL_ASSERT(s == ARL_OK && got == i);
}

/* Prefill of T tokens into slot 0 from a fresh start, last logits: seconds, < 0 on error. */
static double c_prefill(crun *r, int64_t T) {
    double t0 = bench_now();
    slot_fresh(r->st, 0);
    if (arl_model_prefill(r->m, r->st, 0, r->tokens, T, NULL, 0, NULL, r->logits) != ARL_OK)
        return -1;
    return bench_now() - t0;
}

/* B sequences: untimed prefill of ctx tokens each, then `steps` timed decode steps. */
static double c_decode(crun *r, int32_t B, int64_t ctx, int64_t steps) {
    int32_t slots[64];
    int32_t tok[64];
    ARL_ASSERT(B <= 64);
    for (int32_t i = 0; i < B; i++) {
        slots[i] = i;
        slot_fresh(r->st, i);
        if (arl_model_prefill(r->m, r->st, i, r->tokens + i * r->len, ctx, NULL, 0, NULL, NULL) !=
            ARL_OK)
            return -1;
    }
    double t0 = bench_now();
    for (int64_t s = 0; s < steps; s++) {
        for (int32_t i = 0; i < B; i++)
            tok[i] = r->tokens[i * r->len + ctx + s];
        if (arl_model_decode_step(r->m, r->st, slots, B, tok, r->logits, NULL) != ARL_OK) return -1;
    }
    return bench_now() - t0;
}

/* ---- KDA core: chunkwise vs recurrent ---- */

typedef struct kda_result {
    int64_t H, dk, T;
    double chunk_s, rec_s, err;
} kda_result;

static void kda_bench(kda_result *res, int64_t H, int64_t dk, int64_t T, int64_t C, int reps,
                      uint64_t seed) {
    const int64_t n = T * H * dk;
    float *q = xmalloc(sizeof(float) * (size_t)n), *k = xmalloc(sizeof(float) * (size_t)n);
    float *v = xmalloc(sizeof(float) * (size_t)n), *g = xmalloc(sizeof(float) * (size_t)n);
    float *beta = xmalloc(sizeof(float) * (size_t)(T * H));
    float *o1 = xmalloc(sizeof(float) * (size_t)n), *o2 = xmalloc(sizeof(float) * (size_t)n);
    float *S1 = xmalloc(sizeof(float) * (size_t)(H * dk * dk));
    float *S2 = xmalloc(sizeof(float) * (size_t)(H * dk * dk));
    float *ws = xmalloc(sizeof(float) * (size_t)arl_kda_chunk_ws_floats(H, dk, dk, C));
    arl_rng r;
    arl_rng_seed(&r, seed);
    /* realistic ranges (spec 16.3): unit-norm q, k; decays of a K3 gate (g in (-5, 0),
     * mostly near 0 as at initialisation); beta across (0, 1) */
    for (int64_t i = 0; i < n; i++) {
        q[i] = (float)arl_rng_normal(&r);
        k[i] = (float)arl_rng_normal(&r);
        v[i] = (float)arl_rng_normal(&r);
        g[i] = (float)(-5.0 / (1.0 + exp(-(arl_rng_normal(&r) * 2.0 - 3.0))));
    }
    for (int64_t i = 0; i < T * H; i++)
        beta[i] = (float)arl_rng_uniform(&r);
    arl_k_l2norm_fwd(q, NULL, q, T * H, dk, 1e-6f);
    arl_k_l2norm_fwd(k, NULL, k, T * H, dk, 1e-6f);
    const float scale = 1.0f / sqrtf((float)dk);
    double tc[MAX_REPS], tr[MAX_REPS];
    for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up */
        memset(S1, 0, sizeof(float) * (size_t)(H * dk * dk));
        double t0 = bench_now();
        arl_kda_chunk_fwd(o1, S1, NULL, q, k, v, g, beta, NULL, 1, T, H, dk, dk, scale, C, ws);
        double t1 = bench_now();
        memset(S2, 0, sizeof(float) * (size_t)(H * dk * dk));
        double t2 = bench_now();
        arl_kda_recurrent_fwd(o2, S2, NULL, q, k, v, g, beta, NULL, 1, T, H, dk, dk, scale, C);
        double t3 = bench_now();
        if (rep >= 0) {
            tc[rep] = t1 - t0;
            tr[rep] = t3 - t2;
        }
    }
    double e1 = max_ref_err(o1, o2, n), e2 = max_ref_err(S1, S2, H * dk * dk);
    res->H = H;
    res->dk = dk;
    res->T = T;
    res->chunk_s = bench_median(tc, reps);
    res->rec_s = bench_median(tr, reps);
    res->err = e1 > e2 ? e1 : e2;
    float *bufs[] = {q, k, v, g, beta, o1, o2, S1, S2, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* ---- checkpoint ---- */

static arl_status write_checkpoint(const char *config, uint64_t seed, const char *dir) {
    arl_model_config cfg;
    ARL_TRY(arl_model_config_read(config, &cfg));
    arl_model_params p;
    arl_status s = arl_model_params_alloc(&p, &cfg);
    if (s == ARL_OK) s = arl_params_init(&p, &cfg, seed, 0);
    if (s == ARL_OK) s = arl_checkpoint_save(dir, &cfg, &p, 0);
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
    return s;
}

static const char *fmt_bytes(char *buf, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, cap, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0)
        snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else
        snprintf(buf, cap, "%.0f B", b);
    return buf;
}

static void print_ratio_row(const char *name, double c_tps, double t_tps, double target) {
    if (t_tps > 0) {
        double ratio = c_tps / t_tps;
        printf("  %-26s %12.0f %12.0f %8.2fx   >= %.0fx %s\n", name, c_tps, t_tps, ratio, target,
               ratio >= target ? "met" : "NOT MET");
    } else {
        printf("  %-26s %12.0f %12s %9s   >= %.0fx\n", name, c_tps, "n/a", "n/a", target);
    }
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    bench_opts o;
    const char *summary = "CPU policy speed vs a PyTorch baseline in the same run; KDA chunk vs "
                          "recurrent; decode state bytes";
    int done = bench_options_parse("bench_policy", summary, OPTS, N_OPTS, argc, argv, &o);
    if (done >= 0) return done;
    if (arl_k_threads_init((int)o.threads) != ARL_OK) return fail("threads");
    arl_options_print_resolved(stdout, "bench_policy", OPTS, N_OPTS, &o);
    fflush(stdout);
    const int reps = (int)o.reps;
    int rc = 0;
    const int all = !strcmp(o.only, "all");
    const int do_pre = all || !strcmp(o.only, "prefill"), do_dec = all || !strcmp(o.only, "decode");
    const int do_kda = all || !strcmp(o.only, "kda"), do_state = all || !strcmp(o.only, "state");

    /* ---- checkpoint: the one both implementations load ---- */
    const char *tmp = bench_tmpdir_create("bench_policy", 1);
    if (!tmp) return 1;
    char ckpt[1200], tok_path[1200], logit_path[1200];
    if (o.ckpt[0]) {
        snprintf(ckpt, sizeof ckpt, "%s", o.ckpt);
    } else {
        snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
        if (write_checkpoint(o.config, (uint64_t)o.seed, ckpt) != ARL_OK)
            return fail("writing the benchmark checkpoint");
    }
    snprintf(tok_path, sizeof tok_path, "%s/tokens.i32", tmp);
    snprintf(logit_path, sizeof logit_path, "%s/logits.f32", tmp);

    arl_model_config cfg;
    if (arl_model_config_read(ckpt, &cfg) != ARL_OK) return fail("config");
    arl_model_params w;
    if (arl_model_params_alloc(&w, &cfg) != ARL_OK) return fail("params");
    if (arl_checkpoint_load(ckpt, &cfg, &w) != ARL_OK) return fail("checkpoint");
    const arl_model_dims *dm = &cfg.dims;
    const int64_t T = o.T, ctx = o.decode_context, steps = o.decode_steps, V = dm->V;
    const int32_t batches[2] = {1, 16};
    int64_t max_ctx = T > ctx + steps ? T : ctx + steps;
    if (max_ctx < 1024) max_ctx = 1024; /* the 1K state measurement */

    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = T;
    mo.max_docs = 16;
    mo.max_context = max_ctx;
    arl_model m;
    if (arl_model_init(&m, &cfg, &w, &mo) != ARL_OK) return fail("model");
    arl_decode_state st;
    if (arl_decode_state_init(&st, &cfg, 16, max_ctx) != ARL_OK) return fail("decode state");

    /* inputs: one T-token prefill sequence; 16 decode sequences of ctx + steps tokens */
    arl_rng rng;
    arl_rng_seed(&rng, (uint64_t)o.seed);
    int64_t dlen = ctx + steps;
    int32_t *ptok = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *dtok = xmalloc(sizeof(int32_t) * (size_t)(16 * dlen));
    for (int64_t i = 0; i < T; i++)
        ptok[i] = (int32_t)arl_rng_below(&rng, (uint64_t)V);
    for (int64_t i = 0; i < 16 * dlen; i++)
        dtok[i] = (int32_t)arl_rng_below(&rng, (uint64_t)V);
    float *logits = xmalloc(sizeof(float) * (size_t)(T * V));

    printf("\nmodel: %s (d %lld, L %lld = %lld KDA + %lld MLA, E %lld top-%lld, V %lld), "
           "threads %lld\n",
           ckpt, (long long)dm->d, (long long)dm->L, (long long)dm->n_kda, (long long)dm->n_mla,
           (long long)dm->E, (long long)dm->k, (long long)V, (long long)o.threads);
    /* both processes use this OpenBLAS (PyTorch links the same libopenblas): its core type
     * decides most GEMM speed; OPENBLAS_CORETYPE overrides a wrong detection */
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("OpenBLAS core: %s (OPENBLAS_CORETYPE %s)\n", openblas_get_corename(),
           ct ? ct : "unset");

    /* ---- the C model's logits on the timed sequence, for the baseline's cross-check ---- */
    if (o.baseline && all) {
        arl_batch b = {.tokens = ptok, .T = T, .cu = NULL, .N = 1};
        arl_forward_out out = {.logits = logits};
        if (arl_model_forward(&m, &b, &out) != ARL_OK) return fail("C forward");
        if (bench_file_write(tok_path, ptok, sizeof(int32_t) * (size_t)T) != ARL_OK ||
            bench_file_write(logit_path, logits, sizeof(float) * (size_t)(T * V)) != ARL_OK)
            return fail("writing the cross-check files");
    }

    /* ---- the baseline: start and verify ---- */
    bench_child bl;
    memset(&bl, 0, sizeof bl);
    json_t *info = NULL;
    char why[1024] = "disabled by --no-baseline or --only";
    bench_child_state bs = BENCH_CHILD_UNAVAILABLE;
    if (o.baseline && all) {
        fprintf(stderr, "bench_policy: starting the PyTorch baseline (verifies itself first)\n");
        bs = baseline_start(&bl, &o, ckpt, tok_path, logit_path, &info, why, sizeof why);
    }
    if (bs == BENCH_CHILD_FAILED) {
        printf("\nBASELINE CHECK FAILED: %s\n", why);
        fprintf(stderr,
                "bench_policy: the PyTorch baseline and the C model disagree (or the "
                "baseline broke): %s\n",
                why);
        return 1;
    }
    if (bs == BENCH_CHILD_OK) {
        json_t *gold = json_object_get(info, "golden");
        printf("\nverification (max|a-ref|/max|ref|, limit %g):\n", RTOL);
        if (gold)
            printf("  PyTorch vs golden model_tiny (float64): prefill %.2e, decode %.2e, KDA "
                   "chunk vs recurrent %.2e\n",
                   bench_json_num(gold, "prefill_rel_err"), bench_json_num(gold, "decode_rel_err"),
                   bench_json_num(gold, "kda_chunk_vs_recurrent_rel_err"));
        printf("  PyTorch decode vs its prefill (this checkpoint): %.2e\n",
               bench_json_num(info, "decode_vs_prefill_rel_err"));
        printf("  PyTorch vs C logits, T = %lld (this checkpoint): %.2e\n", (long long)T,
               bench_json_num(info, "c_logits_rel_err"));
    }
    bench_baseline_print(bs == BENCH_CHILD_OK ? info : NULL, "fp32 eager", o.omp_wait, why);

    /* ---- prefill and decode, C and PyTorch interleaved ---- */
    crun cr = {.m = &m, .st = &st, .tokens = ptok, .len = T, .logits = logits};
    double c_pre[MAX_REPS], t_pre[MAX_REPS];
    double c_dec[2][MAX_REPS], t_dec[2][MAX_REPS];
    int have_t = bs == BENCH_CHILD_OK;
    char req[128];
    fprintf(stderr, "bench_policy: prefill T = %lld ...\n", (long long)T);
    if (do_pre && c_prefill(&cr, T) < 0) return fail("C prefill");
    snprintf(req, sizeof req, "prefill %lld 1", (long long)T);
    for (int rep = 0; rep < reps && do_pre; rep++) {
        c_pre[rep] = c_prefill(&cr, T);
        if (c_pre[rep] < 0) return fail("C prefill");
        if (have_t && (t_pre[rep] = baseline_time(&bl, req)) < 0) {
            fprintf(stderr, "bench_policy: the baseline failed during prefill timing\n");
            return 1;
        }
    }
    cr.tokens = dtok;
    cr.len = dlen;
    for (int bi = 0; bi < 2 && do_dec; bi++) {
        int32_t B = batches[bi];
        fprintf(stderr, "bench_policy: decode batch %d ...\n", B);
        if (c_decode(&cr, B, ctx, steps) < 0) return fail("C decode");
        snprintf(req, sizeof req, "decode %d %lld %lld", B, (long long)ctx, (long long)steps);
        for (int rep = 0; rep < reps; rep++) {
            c_dec[bi][rep] = c_decode(&cr, B, ctx, steps);
            if (c_dec[bi][rep] < 0) return fail("C decode");
            if (have_t && (t_dec[bi][rep] = baseline_time(&bl, req)) < 0) {
                fprintf(stderr, "bench_policy: the baseline failed during decode timing\n");
                return 1;
            }
        }
    }
    bench_child_stop(&bl);
    json_decref(info);

    double cp = do_pre ? T / bench_median(c_pre, reps) : 0;
    double tp = have_t ? T / bench_median(t_pre, reps) : 0;
    if (do_pre || do_dec)
        printf("\nthroughput (tokens/s, median of %d; decode after %lld prefilled tokens, %lld "
               "steps):\n",
               reps, (long long)ctx, (long long)steps);
    if (do_pre || do_dec)
        printf("  %-26s %12s %12s %9s   target\n", "", "agentrl C", "PyTorch", "C/PyTorch");
    char name[64];
    snprintf(name, sizeof name, "prefill T = %lld", (long long)T);
    if (do_pre) print_ratio_row(name, cp, tp, 2.0);
    for (int bi = 0; bi < 2 && do_dec; bi++) {
        double tok = (double)batches[bi] * (double)steps;
        double cd = tok / bench_median(c_dec[bi], reps),
               td = have_t ? tok / bench_median(t_dec[bi], reps) : 0;
        snprintf(name, sizeof name, "decode batch %d", batches[bi]);
        print_ratio_row(name, cd, td, 3.0);
    }
    fflush(stdout);

    /* ---- KDA core: chunkwise vs recurrent (C vs C) ---- */
    if (do_kda) {
        fprintf(stderr, "bench_policy: KDA core T = %lld ...\n", (long long)o.kda_T);
        printf(
            "\nKDA core prefill, T = %lld, one sequence, chunk C = 64 (tokens/s, median of %d):\n",
            (long long)o.kda_T, reps > 3 ? 3 : reps);
        printf("  %-16s %12s %12s %9s   %s\n", "heads x dk", "chunkwise", "recurrent", "chunk/rec",
               "max rel diff");
        const int64_t kshapes[2][2] = {{dm->H, dm->dk}, {8, 128}};
        for (int s = 0; s < 2; s++) {
            kda_result kr;
            kda_bench(&kr, kshapes[s][0], kshapes[s][1], o.kda_T, 64, reps > 3 ? 3 : reps,
                      (uint64_t)o.seed + 17);
            snprintf(name, sizeof name, "%lld x %lld%s", (long long)kr.H, (long long)kr.dk,
                     s == 0 ? " (model)" : " (mini)");
            printf("  %-16s %12.0f %12.0f %8.2fx   %.2e%s\n", name, kr.T / kr.chunk_s,
                   kr.T / kr.rec_s, kr.rec_s / kr.chunk_s, kr.err,
                   kr.err <= RTOL ? "" : "  FAILED");
            if (!(kr.err <= RTOL)) {
                fprintf(stderr, "bench_policy: KDA chunk and recurrent outputs differ: %.3e > %g\n",
                        kr.err, RTOL);
                rc = 1;
            }
        }
    }
    fflush(stdout);

    /* ---- decode state bytes per sequence ---- */
    if (do_state) {
        const int64_t ctxs[3] = {1024, 65536, ARL_LONG_CONTEXT_TOKENS};
        arl_decode_state sb;
        if (arl_decode_state_init(&sb, &cfg, 2, ARL_LONG_CONTEXT_TOKENS) != ARL_OK)
            return fail("decode state");
        arl_model_memory mem;
        arl_model_memory_compute(&cfg, &mem);
        /* the KDA part: the arena stride between two slots (S and conv tails of every layer) */
        const double kda = (double)((char *)sb.slots[1].kda_S - (char *)sb.slots[0].kda_S);
        const double R = (double)(dm->rkv + dm->r);
        int32_t slot;
        if (arl_decode_state_join(&sb, &slot) != ARL_OK) return fail("decode state");
        /* a real sequence of 1024 tokens (prefill), then room reserved for longer ones */
        int32_t *tk = xmalloc(sizeof(int32_t) * 1024);
        for (int i = 0; i < 1024; i++)
            tk[i] = (int32_t)arl_rng_below(&rng, (uint64_t)V);
        if (arl_model_prefill(&m, &sb, slot, tk, 1024, NULL, 0, NULL, NULL) != ARL_OK)
            return fail("state prefill");
        free(tk);
        printf("\ndecode state per sequence (fp32; KDA = S + conv tails of %lld layers, MLA = "
               "latent rows of %lld layers):\n",
               (long long)dm->n_kda, (long long)dm->n_mla);
        printf("  %-9s %12s %12s %12s %12s %12s\n", "context", "KDA", "MLA", "total", "export",
               "closed form");
        int kda_const = 1;
        for (int i = 0; i < 3; i++) {
            int64_t N = ctxs[i];
            if (arl_decode_state_reserve(&sb, slot, N) != ARL_OK) return fail("state reserve");
            /* the export size depends only on the position; at 64K and 1M the rows are
             * reserved, not computed, so the position is set for the size query alone */
            int64_t real_pos = sb.slots[slot].pos;
            ARL_ASSERT(i > 0 || real_pos == N);
            sb.slots[slot].pos = N;
            double exp_b = (double)arl_decode_state_export_size(&sb, slot);
            sb.slots[slot].pos = real_pos;
            double kda_now = (double)((char *)sb.slots[1].kda_S - (char *)sb.slots[0].kda_S);
            if (kda_now != kda) kda_const = 0;
            double mla = (double)dm->n_mla * R * 4.0 * (double)N; /* rows in use */
            double closed = (double)(mem.kda_state_bytes + mem.kda_conv_bytes) +
                            (double)mem.mla_bytes_per_token_fp32 * (double)N;
            char b1[32], b2[32], b3[32], b4[32], b5[32], cn[16];
            snprintf(cn, sizeof cn, "%lldK", (long long)(N / 1024));
            printf("  %-9s %12s %12s %12s %12s %12s\n", cn, fmt_bytes(b1, 32, kda_now),
                   fmt_bytes(b2, 32, mla), fmt_bytes(b3, 32, kda_now + mla),
                   fmt_bytes(b4, 32, exp_b), fmt_bytes(b5, 32, closed));
            if (fabs(kda_now + mla - closed) > 0.5) kda_const = 0;
        }
        printf("  KDA part constant in the context and equal to the closed form: %s\n",
               kda_const ? "yes" : "NO");
        printf("  (allocated: %lld latent rows per MLA layer after reserving 1M, blocks of %d)\n",
               (long long)sb.slots[slot].cap, ARL_STATE_ROWS_BLOCK);
        if (!kda_const) rc = 1;
        arl_decode_state_free(&sb);
    }

    free(ptok);
    free(dtok);
    free(logits);
    arl_decode_state_free(&st);
    arl_model_free(&m);
    arl_model_params_free(&w);
    arl_model_config_free(&cfg);
    arl_options_free(OPTS, N_OPTS, &o);
    return rc;
}
