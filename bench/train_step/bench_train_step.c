/* bench/train_step/bench_train_step.c: speed and memory of one CPU training step of the policy
 * (forward + backward + AdamW, fp32) against PyTorch eager autograd on the same model, weights,
 * batch, hyper-parameters and thread count, measured in the same run.
 *
 *   step      arl_model_train_forward + arl_model_backward of the mean next-token NLL over a
 *             packed batch of fresh documents (what arl_model_loss_and_grad computes) +
 *             arl_adamw_step (global-norm clipping, decoupled decay, constant rate), vs
 *             bench/train_step/torch_train.py (bench/policy/torch_model.py's model with leaf
 *             parameters; F.cross_entropy, loss.backward(), clip_grad_norm_, torch.optim.AdamW).
 *             Tokens/s of the median step, target C >= 2x PyTorch.
 *   memory    peak RSS of each process over the timed steps (VmHWM, reset with
 *             /proc/self/clear_refs after verification and warm-up), next to its RSS before the
 *             model existed (the runtime's floor: a C binary vs Python + torch).
 *
 * The batch: --docs documents of --doc-tokens byte tokens each, cut from one text of words
 * drawn by a seeded arl_rng; the weights: arl_params_init(--seed) of --config, saved as the
 * checkpoint both processes use.
 *
 * Correctness before speed (the child verifies, this program stops with exit status 1 on any
 * disagreement): the first-step loss (rtol 1e-4), the gradient of every text tensor (max|ref|
 * form, rtol 1e-3; arl_model_grads_save's file) and the parameters after two AdamW steps applied
 * to the C gradients of the C run's first two steps (rtol 1e-5; checkpoints of the C parameters
 * after each; see torch_train.py).  Without /usr/bin/python3 or torch the C numbers are printed
 * and the baseline is reported unavailable (exit 0).
 *
 * Timing: --rounds rounds of --steps steps per side after one warm-up step each; C and PyTorch
 * alternate (PyTorch runs as a child answering requests on a pipe, the side that starts a round
 * alternates), so both see the same load on a shared machine; medians of the per-step wall
 * times (tokens/s) and of the per-step process CPU times (all threads) are reported, with the
 * split of a step into forward, backward and optimizer on both sides.  The child runs with
 * OMP_WAIT_POLICY=PASSIVE (see bench/policy/bench_policy.c) and, when OPENBLAS_CORETYPE is unset
 * and OpenBLAS detects a pre-AVX core on an AVX2/AVX-512 CPU (OpenBLAS 0.3.21 on this machine
 * reports "Prescott"), the matching core type, so that the baseline's GEMMs are not crippled.
 *
 * Usage: bench_train_step [--threads N] [--docs N] [--doc-tokens T] [--rounds R] ... (--help)
 * Exit status: 0 done (whatever the ratios), 1 a failure or a failed check, 2 usage error.
 */
#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "bench/common/pychild.h"
#include "bench/common/tmpdir.h"
#include "core/assert.h"
#include "core/options.h"
#include "core/rng.h"
#include "core/status.h"
#include "kernels/threadpool.h"
#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/model.h"
#include "policy/model_backward.h"
#include "policy/optimizer.h"
#include "policy/params.h"

#ifndef ARL_BENCH_SOURCE_DIR
#define ARL_BENCH_SOURCE_DIR "."
#endif

#define MAX_TIMES BENCH_MEDIAN_MAX /* rounds * steps (1024) */
#define TARGET 2.0     /* C tokens/s over PyTorch tokens/s */

typedef struct bench_opts {
    char *config;
    int64_t seed;
    int64_t threads;
    int64_t docs;
    int64_t doc_tokens;
    int64_t rounds;
    int64_t steps;
    char *python;
    char *script;
    int baseline;
    char *omp_wait;
    char *coretype;
    arl_optim_config optim;
} bench_opts;

static const arl_option OWN_OPTS[] = {
    {"config", ARL_OPT_STRING, offsetof(bench_opts, config),
     ARL_BENCH_SOURCE_DIR "/configs/tiny/config.json", "model config (weights from --seed)", 0, 0,
     NULL, 0, "FILE"},
    {"seed", ARL_OPT_INT, offsetof(bench_opts, seed), "1", "seed of the weights and the text", 0,
     1e15, NULL, 0, "N"},
    {"threads", ARL_OPT_INT, offsetof(bench_opts, threads), "2",
     "threads of the C kernels' pool and of PyTorch (torch.set_num_threads)", 1, 256, NULL, 0, "N"},
    {"docs", ARL_OPT_INT, offsetof(bench_opts, docs), "4", "documents in the packed batch", 1, 64,
     NULL, 0, "N"},
    {"doc-tokens", ARL_OPT_INT, offsetof(bench_opts, doc_tokens), "512", "tokens per document", 2,
     65536, NULL, 0, "T"},
    {"rounds", ARL_OPT_INT, offsetof(bench_opts, rounds), "4",
     "alternating rounds (C, PyTorch) of timed steps", 1, 64, NULL, 0, "N"},
    {"steps", ARL_OPT_INT, offsetof(bench_opts, steps), "2", "timed steps per side and round", 1,
     16, NULL, 0, "N"},
    BENCH_BASELINE_OPTIONS(bench_opts, ARL_BENCH_SOURCE_DIR "/bench/train_step/torch_train.py"),
    {"openblas-coretype", ARL_OPT_STRING, offsetof(bench_opts, coretype), "auto",
     "OPENBLAS_CORETYPE of the PyTorch process (auto: the environment's, else fix a pre-AVX "
     "misdetection; inherit: the environment's)",
     0, 0, NULL, 0, "NAME"},
};
#define N_OWN ARL_OPTIONS_COUNT(OWN_OPTS)
#define MAX_OPTS 64

static arl_option g_opts[MAX_OPTS];
static size_t g_nopts;

/* Own options + the optimizer's (arl_optim_options), offsets shifted into bench_opts.optim. */
static void opts_build(void) {
    size_t n_opt;
    const arl_option *opt = arl_optim_options(&n_opt);
    ARL_ASSERT(N_OWN + n_opt <= MAX_OPTS);
    memcpy(g_opts, OWN_OPTS, sizeof OWN_OPTS);
    for (size_t i = 0; i < n_opt; i++) {
        g_opts[N_OWN + i] = opt[i];
        g_opts[N_OWN + i].offset += offsetof(bench_opts, optim);
    }
    g_nopts = N_OWN + n_opt;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    return bench_fail("bench_train_step", what);
}

static int broke(void) {
    fprintf(stderr, "bench_train_step: the PyTorch baseline stopped answering\n");
    return 1;
}

static void *xmalloc(size_t bytes) {
    return bench_xmalloc("bench_train_step", bytes);
}

/* ---- memory of this process ---- */

/* VmRSS / VmHWM in KiB from /proc/self/status; -1 where unavailable. */
static long proc_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* VmHWM := VmRSS (Linux clear_refs 5); 0 if not possible. */
static int peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* ---- the batch: byte tokens of a seeded text ---- */

static const char *const WORDS[] = {
    "the",    "model",  "reads",  "a",       "token",  "and",    "writes", "next",   "state",
    "of",     "every",  "layer",  "expert",  "router", "learns", "from",   "its",    "own",
    "errors", "while",  "agents", "call",    "tools",  "in",     "loops",  "reward", "is",
    "sparse", "but",    "signal", "returns", "after",  "long",   "tasks",  "on",     "CPU",
    "with",   "memory", "small",  "weights", "move",   "slowly", "toward", "better", "answers",
};
#define N_WORDS ((int)(sizeof WORDS / sizeof WORDS[0]))

/* T bytes of text: words, spaces, now and then punctuation and a newline. */
static void make_text(int32_t *tok, int64_t T, uint64_t seed) {
    arl_rng r;
    arl_rng_seed(&r, seed ^ 0x7465787474657874ull);
    int64_t t = 0;
    while (t < T) {
        const char *w = WORDS[arl_rng_below(&r, N_WORDS)];
        for (const char *c = w; *c && t < T; c++)
            tok[t++] = (unsigned char)*c;
        uint64_t p = arl_rng_below(&r, 16);
        const char *sep = p == 0 ? ".\n" : p == 1 ? ", " : " ";
        for (const char *c = sep; *c && t < T; c++)
            tok[t++] = (unsigned char)*c;
    }
}

/* ---- the PyTorch child process (protocol: torch_train.py serve(); bench/common/pychild.h) ---- */

static json_t *baseline_request(bench_child *b, const char *req) {
    return bench_child_request(b, req, "bench_train_step");
}

/* The OPENBLAS_CORETYPE for the child ("" = leave the environment alone). */
static const char *child_coretype(const bench_opts *o) {
    if (!strcmp(o->coretype, "inherit")) return "";
    if (strcmp(o->coretype, "auto") != 0) return o->coretype;
    if (getenv("OPENBLAS_CORETYPE")) return "";
    const char *core = openblas_get_corename();
    int old = core && (!strcasecmp(core, "Prescott") || !strcasecmp(core, "Core2") ||
                       !strcasecmp(core, "Nehalem") || !strcasecmp(core, "Katmai"));
    if (!old) return "";
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
    if (__builtin_cpu_supports("avx2")) return "Haswell";
    return "";
}

typedef struct child_args {
    const char *ckpt, *tokens, *check;
    double loss;
    int verify;
} child_args;

static bench_child_state baseline_start(bench_child *b, const bench_opts *o,
                                        const child_args *ca, const char *coretype,
                                        json_t **info, char *why, size_t cap) {
    char threads[32], docs[32], loss[64], lr[64], b1[64], b2[64], eps[64], wd[64], clip[64];
    snprintf(threads, sizeof threads, "%lld", (long long)o->threads);
    snprintf(docs, sizeof docs, "%lld", (long long)o->docs);
    snprintf(loss, sizeof loss, "%.17g", ca->loss);
    snprintf(lr, sizeof lr, "%.17g", o->optim.lr);
    snprintf(b1, sizeof b1, "%.17g", o->optim.beta1);
    snprintf(b2, sizeof b2, "%.17g", o->optim.beta2);
    snprintf(eps, sizeof eps, "%.17g", o->optim.eps);
    snprintf(wd, sizeof wd, "%.17g", o->optim.weight_decay);
    snprintf(clip, sizeof clip, "%.17g", o->optim.clip_norm);
    const char *kv[][2] = {
        {"--ckpt", ca->ckpt},   {"--tokens", ca->tokens},
        {"--docs", docs},       {"--threads", threads},
        {"--lr", lr},           {"--beta1", b1},
        {"--beta2", b2},        {"--eps", eps},
        {"--weight-decay", wd}, {"--clip-norm", clip},
        {"--check-loss", loss}, {"--check-dir", ca->check},
    };
    const int n_kv = (int)(sizeof kv / sizeof kv[0]) - (ca->verify ? 0 : 2); /* checks last */
    char *args[3 + 2 * (sizeof kv / sizeof kv[0]) + 1];
    int na = 0;
    args[na++] = o->python;
    args[na++] = o->script;
    args[na++] = "--serve";
    for (int i = 0; i < n_kv; i++) {
        args[na++] = (char *)kv[i][0];
        args[na++] = (char *)kv[i][1];
    }
    args[na] = NULL;
    const char *env[][2] = {
        {"OMP_WAIT_POLICY", strcmp(o->omp_wait, "inherit") != 0 ? o->omp_wait : NULL},
        {"OMP_NUM_THREADS", threads},
        {"OPENBLAS_NUM_THREADS", threads},
        {"OPENBLAS_CORETYPE", coretype[0] ? coretype : NULL},
    };
    return bench_child_start(b, args, env, 4, info, why, cap);
}

/* ---- the C step ---- */

typedef struct cstep {
    arl_model_train *tr;
    arl_model_params *params, *grads;
    arl_adamw *opt;
    const arl_batch *b; /* with next-token targets */
    const float *dlogp; /* (T) -1/count at target positions */
    float *logp;        /* (T) */
    int64_t count;      /* target positions */
    size_t grad_bytes;
} cstep;

typedef struct step_time {
    double wall, cpu, fwd, bwd, opt; /* seconds */
    double loss;
} step_time;

static arl_status c_step(cstep *c, step_time *st) {
    double t0 = bench_now(), c0 = cpu_now();
    memset(c->grads->arena, 0, c->grad_bytes);
    arl_forward_out out = {.logprobs = c->logp};
    ARL_TRY(arl_model_train_forward(c->tr, c->b, NULL, NULL, &out));
    double t1 = bench_now();
    ARL_TRY(arl_model_backward(c->tr, c->b, c->dlogp, c->grads, NULL, NULL));
    double t2 = bench_now();
    ARL_TRY(arl_adamw_step(c->opt, c->params, c->grads->arena, NULL));
    double t3 = bench_now(), c3 = cpu_now();
    double sum = 0;
    for (int64_t t = 0; t < c->b->T; t++)
        if (c->b->targets[t] >= 0) sum -= (double)c->logp[t];
    st->loss = sum / (double)c->count;
    st->wall = t3 - t0;
    st->cpu = c3 - c0;
    st->fwd = t1 - t0;
    st->bwd = t2 - t1;
    st->opt = t3 - t2;
    return ARL_OK;
}

/* ---- output ---- */

static const char *fmt_mib(char *buf, size_t cap, long kb) {
    if (kb < 0)
        snprintf(buf, cap, "n/a");
    else
        snprintf(buf, cap, "%.1f MiB", (double)kb / 1024.0);
    return buf;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    const long rss_floor = proc_kb("VmRSS");
    opts_build();
    bench_opts o;
    const char *summary = "CPU training step (forward + backward + AdamW) vs PyTorch eager "
                          "autograd in the same run: tokens/s and peak memory";
    int done = bench_options_parse("bench_train_step", summary, g_opts, g_nopts, argc, argv, &o);
    if (done >= 0) return done;
    if (arl_optim_config_check(&o.optim) != ARL_OK) {
        fprintf(stderr, "bench_train_step: %s\n", arl_error_msg());
        return 2;
    }
    if (o.optim.warmup_steps != 0 || o.optim.total_steps != 0) {
        fprintf(stderr, "bench_train_step: --warmup-steps and --total-steps must be 0 (the "
                        "baseline implements a constant learning rate)\n");
        return 2;
    }
    if (o.rounds * o.steps > MAX_TIMES) {
        fprintf(stderr, "bench_train_step: --rounds x --steps must be <= %d\n", MAX_TIMES);
        return 2;
    }
    if (arl_k_threads_init((int)o.threads) != ARL_OK) return fail("threads");
    arl_options_print_resolved(stdout, "bench_train_step", g_opts, g_nopts, &o);
    fflush(stdout);

    const char *tmp = bench_tmpdir_create("bench_train_step", 2);
    if (!tmp) return 1;
    char ckpt[128], tok_path[128], check[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(tok_path, sizeof tok_path, "%s/tokens.i32", tmp);
    snprintf(check, sizeof check, "%s/check", tmp);
    if (mkdir(check, 0700) != 0) {
        fprintf(stderr, "bench_train_step: mkdir %s: %s\n", check, strerror(errno));
        return 1;
    }

    /* ---- weights, batch, model, optimizer ---- */
    arl_model_config cfg;
    if (arl_model_config_read(o.config, &cfg) != ARL_OK) return fail("config");
    const arl_model_dims *dm = &cfg.dims;
    arl_model_params params, grads;
    if (arl_model_params_alloc(&params, &cfg) != ARL_OK) return fail("params");
    if (arl_params_init(&params, &cfg, (uint64_t)o.seed, (int)o.threads) != ARL_OK)
        return fail("init");
    if (arl_checkpoint_save(ckpt, &cfg, &params, 0) != ARL_OK) return fail("checkpoint");
    if (arl_model_params_alloc(&grads, &cfg) != ARL_OK) return fail("gradients");

    const int64_t N = o.docs, Td = o.doc_tokens, T = N * Td;
    int32_t *tokens = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *targets = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    float *dlogp = xmalloc(sizeof(float) * (size_t)T);
    float *logp = xmalloc(sizeof(float) * (size_t)T);
    make_text(tokens, T, (uint64_t)o.seed);
    for (int64_t i = 0; i <= N; i++)
        cu[i] = (int32_t)(i * Td);
    arl_batch_next_token_targets(targets, tokens, cu, (int32_t)N, T);
    int64_t count = 0;
    for (int64_t t = 0; t < T; t++)
        count += targets[t] >= 0;
    for (int64_t t = 0; t < T; t++)
        dlogp[t] = targets[t] >= 0 ? (float)(-1.0 / (double)count) : 0.0f;
    if (bench_file_write(tok_path, tokens, sizeof(int32_t) * (size_t)T) != ARL_OK)
        return fail("writing the batch");
    arl_batch b = {.tokens = tokens, .T = T, .cu = cu, .N = (int32_t)N, .targets = targets};

    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = T;
    mo.max_docs = (int32_t)N;
    arl_model m;
    if (arl_model_init(&m, &cfg, &params, &mo) != ARL_OK) return fail("model");
    arl_model_train tr;
    if (arl_model_train_init(&tr, &m, NULL, NULL) != ARL_OK) return fail("training state");
    arl_adamw opt;
    if (arl_adamw_init(&opt, &cfg, &o.optim) != ARL_OK) return fail("optimizer");
    const size_t arena_bytes = sizeof(float) * (size_t)params.inv.arena_floats;
    cstep cs = {.tr = &tr,
                .params = &params,
                .grads = &grads,
                .opt = &opt,
                .b = &b,
                .dlogp = dlogp,
                .logp = logp,
                .count = count,
                .grad_bytes = arena_bytes};

    printf("\nmodel: %s (d %lld, L %lld = %lld KDA + %lld MLA, E %lld top-%lld, V %lld), %lld "
           "parameters, seed %lld\n",
           o.config, (long long)dm->d, (long long)dm->L, (long long)dm->n_kda, (long long)dm->n_mla,
           (long long)dm->E, (long long)dm->k, (long long)dm->V, (long long)params.inv.total_numel,
           (long long)o.seed);
    printf("batch: %lld documents x %lld byte tokens of a seeded text = %lld tokens (%lld "
           "targets)\n",
           (long long)N, (long long)Td, (long long)T, (long long)count);
    printf("AdamW: lr %g (constant), betas (%g, %g), eps %g, weight decay %g (matrices), clip "
           "norm %g; threads %lld\n",
           o.optim.lr, o.optim.beta1, o.optim.beta2, o.optim.eps, o.optim.weight_decay,
           o.optim.clip_norm, (long long)o.threads);
    const char *coretype = child_coretype(&o);
    const char *ct_env = getenv("OPENBLAS_CORETYPE");
    printf("OpenBLAS core: this process %s (OPENBLAS_CORETYPE %s); PyTorch process "
           "OPENBLAS_CORETYPE %s\n",
           openblas_get_corename(), ct_env ? ct_env : "unset",
           coretype[0] ? coretype : (ct_env ? ct_env : "unset"));
    fflush(stdout);

    /* ---- the C side of the verification: first-step loss, gradients and two AdamW steps ---- */
    double loss0 = 0;
    memset(grads.arena, 0, arena_bytes);
    if (arl_model_loss_and_grad(&tr, &b, &grads, &loss0) != ARL_OK) return fail("C loss");
    int verify = o.baseline;
    if (verify) {
        /* two steps: gradients, then the parameters after AdamW on them (check/ of the child);
         * afterwards the parameters and the optimizer start over */
        float *p0 = xmalloc(arena_bytes);
        memcpy(p0, params.arena, arena_bytes);
        for (int s = 1; s <= 2; s++) {
            char path[192];
            double l;
            if (s == 2) {
                memset(grads.arena, 0, arena_bytes);
                if (arl_model_loss_and_grad(&tr, &b, &grads, &l) != ARL_OK) return fail("C loss");
            }
            snprintf(path, sizeof path, "%s/grads%d.safetensors", check, s);
            if (arl_model_grads_save(path, &grads, "bench_train_step gradients") != ARL_OK)
                return fail("saving the C gradients");
            if (arl_adamw_step(&opt, &params, grads.arena, NULL) != ARL_OK) return fail("C AdamW");
            snprintf(path, sizeof path, "%s/step%d", check, s);
            if (arl_checkpoint_save(path, &cfg, &params, 0) != ARL_OK)
                return fail("saving the stepped parameters");
        }
        memcpy(params.arena, p0, arena_bytes);
        free(p0);
        arl_adamw_free(&opt);
        if (arl_adamw_init(&opt, &cfg, &o.optim) != ARL_OK) return fail("optimizer");
    }

    /* ---- the baseline: start and verify ---- */
    bench_child bl;
    memset(&bl, 0, sizeof bl);
    json_t *info = NULL;
    char why[1024] = "disabled by --no-baseline";
    bench_child_state bs = BENCH_CHILD_UNAVAILABLE;
    if (o.baseline) {
        fprintf(stderr, "bench_train_step: starting the PyTorch baseline (verifies itself "
                        "against the C step first)\n");
        child_args ca = {ckpt, tok_path, check, loss0, verify};
        bs = baseline_start(&bl, &o, &ca, coretype, &info, why, sizeof why);
    }
    if (bs == BENCH_CHILD_FAILED) {
        printf("\nBASELINE CHECK FAILED: %s\n", why);
        fprintf(stderr,
                "bench_train_step: the PyTorch baseline and the C step disagree (or the "
                "baseline broke): %s\n",
                why);
        return 1;
    }
    const int have_t = bs == BENCH_CHILD_OK;
    if (have_t) {
        printf(
            "\nverification (PyTorch vs C on the first step; max|a-ref|/max|ref| per tensor):\n");
        printf("  loss: C %.8f, PyTorch %.8f, rel err %.2e (limit 1e-4)\n", loss0,
               bench_json_num(info, "loss"), bench_json_num(info, "loss_rel_err"));
        json_t *wk = json_object_get(info, "grad_worst_key");
        printf("  gradients of %d tensors: worst %.2e (%s) (limit 1e-3)\n",
               (int)bench_json_num(info, "grad_tensors"),
               bench_json_num(info, "grad_worst_rel_err"),
               json_string_value(wk) ? json_string_value(wk) : "?");
        json_t *named = json_object_get(info, "grad_named_rel_err");
        const char *key;
        json_t *val;
        json_object_foreach(named, key, val) {
            const char *k = strncmp(key, "language_model.model.", 21) ? key : key + 21;
            printf("    %-52s %.2e\n", k, json_number_value(val));
        }
        json_t *sk = json_object_get(info, "adamw_worst_key");
        printf("  two AdamW steps on the C gradients vs the C steps: worst %.2e (%s) (limit "
               "1e-5)\n",
               bench_json_num(info, "adamw_worst_rel_err"),
               json_string_value(sk) ? json_string_value(sk) : "?");
    }
    bench_baseline_print(have_t ? info : NULL, "fp32 eager autograd", o.omp_wait, why);

    /* ---- warm-up (one step each), then the peaks are reset ---- */
    step_time w0;
    if (c_step(&cs, &w0) != ARL_OK) return fail("C step");
    if (w0.loss != loss0) { /* same parameters and batch: the timed path equals the checked one */
        fprintf(stderr,
                "bench_train_step: the timed step's loss %.17g differs from "
                "arl_model_loss_and_grad's %.17g\n",
                w0.loss, loss0);
        return 1;
    }
    json_t *j;
    if (have_t) {
        if (!(j = baseline_request(&bl, "steps 1"))) return broke();
        json_decref(j);
    }
    int c_reset = peak_reset(), t_reset = 0;
    if (have_t) {
        if (!(j = baseline_request(&bl, "reset_peak"))) return broke();
        t_reset = json_is_true(json_object_get(j, "ok"));
        json_decref(j);
    }

    /* ---- timed rounds, C and PyTorch alternating ---- */
    const int R = (int)o.rounds, S = (int)o.steps;
    static double cw[MAX_TIMES], cc[MAX_TIMES], cf[MAX_TIMES], cb[MAX_TIMES], co[MAX_TIMES];
    static double tw[MAX_TIMES], tc[MAX_TIMES], tf[MAX_TIMES], tb[MAX_TIMES], to_[MAX_TIMES];
    int nc = 0, nt = 0;
    double c_loss = w0.loss, t_loss = NAN;
    char req[64];
    snprintf(req, sizeof req, "steps %d", S);
    fprintf(stderr, "bench_train_step: %d rounds of %d steps per side ...\n", R, S);
    for (int r = 0; r < R; r++) {
        for (int side = 0; side < 2; side++) {
            int is_c = (side == 0) == (r % 2 == 0);
            if (is_c) {
                for (int s = 0; s < S; s++) {
                    step_time st;
                    if (c_step(&cs, &st) != ARL_OK) return fail("C step");
                    cw[nc] = st.wall;
                    cc[nc] = st.cpu;
                    cf[nc] = st.fwd;
                    cb[nc] = st.bwd;
                    co[nc] = st.opt;
                    c_loss = st.loss;
                    nc++;
                }
            } else if (have_t) {
                if (!(j = baseline_request(&bl, req))) {
                    fprintf(stderr, "bench_train_step: the baseline failed during timing\n");
                    return 1;
                }
                json_t *aw = json_object_get(j, "wall"), *ac = json_object_get(j, "cpu");
                json_t *ap = json_object_get(j, "phases");
                for (int s = 0; s < S && nt < MAX_TIMES; s++) {
                    json_t *ph = json_array_get(ap, (size_t)s);
                    tw[nt] = json_number_value(json_array_get(aw, (size_t)s));
                    tc[nt] = json_number_value(json_array_get(ac, (size_t)s));
                    tf[nt] = json_number_value(json_array_get(ph, 0));
                    tb[nt] = json_number_value(json_array_get(ph, 1));
                    to_[nt] = json_number_value(json_array_get(ph, 2));
                    if (!(tw[nt] > 0 && tc[nt] >= 0 && tf[nt] >= 0 && tb[nt] >= 0 &&
                          to_[nt] >= 0)) { /* missing or not a time: no ratio over it */
                        fprintf(stderr,
                                "bench_train_step: baseline: bad reply to '%s' (step %d "
                                "without a positive wall time and phase times)\n",
                                req, s);
                        return 1;
                    }
                    nt++;
                }
                t_loss = bench_json_num(j, "loss");
                json_decref(j);
            }
        }
    }
    long c_hwm = proc_kb("VmHWM");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long t_hwm = -1, t_floor = -1, t_maxrss = -1;
    if (have_t) {
        if (!(j = baseline_request(&bl, "mem"))) return broke();
        t_hwm = (long)bench_json_num(j, "hwm_kb");
        t_maxrss = (long)bench_json_num(j, "maxrss_kb");
        json_decref(j);
        t_floor = (long)bench_json_num(info, "rss_floor_kb");
    }
    bench_child_stop(&bl);

    /* ---- report ---- */
    const double c_step_s = bench_median(cw, nc), t_step_s = have_t ? bench_median(tw, nt) : NAN;
    const double c_tps = (double)T / c_step_s, t_tps = (double)T / t_step_s;
    const double c_cpu = bench_median(cc, nc), t_cpu = have_t ? bench_median(tc, nt) : NAN;
    printf("\ntraining step, %lld tokens (median of %d steps per side, %d alternating rounds):\n",
           (long long)T, nc, R);
    printf("  %-34s %12s %12s %9s\n", "", "agentrl C", "PyTorch", "C/PyTorch");
    if (have_t) {
        double ratio = c_tps / t_tps;
        printf("  %-34s %12.0f %12.0f %8.2fx   target >= %.0fx: %s\n", "tokens/s (wall)", c_tps,
               t_tps, ratio, TARGET, ratio >= TARGET ? "met" : "NOT MET");
        printf("  %-34s %12.3f %12.3f\n", "step wall time, s", c_step_s, t_step_s);
        printf("  %-34s %12.3f %12.3f %8.2fx\n", "step CPU time (all threads), s", c_cpu, t_cpu,
               t_cpu / c_cpu);
        printf("  %-34s %12.0f %12.0f %8.2fx\n", "tokens per CPU-second", T / c_cpu, T / t_cpu,
               t_cpu / c_cpu);
    } else {
        printf("  %-34s %12.0f %12s\n", "tokens/s (wall)", c_tps, "n/a");
        printf("  %-34s %12.3f %12s\n", "step wall time, s", c_step_s, "n/a");
        printf("  %-34s %12.3f %12s\n", "step CPU time (all threads), s", c_cpu, "n/a");
    }
    if (have_t)
        printf("  (tokens/s is the measure; CPU time also counts threads that busy-wait, which "
               "grows with the machine's load)\n");
    printf("  step split, median s: forward / backward / optimizer\n");
    printf("    %-32s %.3f / %.3f / %.3f\n", "agentrl C", bench_median(cf, nc),
           bench_median(cb, nc), bench_median(co, nc));
    if (have_t)
        printf("    %-32s %.3f / %.3f / %.3f\n", "PyTorch", bench_median(tf, nt),
               bench_median(tb, nt), bench_median(to_, nt));
    char b1[32], b2[32], b3[32];
    printf("\npeak memory (resident set):\n");
    printf("  %-34s %12s %12s\n", "", "agentrl C", "PyTorch");
    printf("  %-34s %12s %12s%s\n", "peak RSS over the timed steps", fmt_mib(b1, 32, c_hwm),
           fmt_mib(b2, 32, t_hwm),
           (c_reset && (!have_t || t_reset)) ? "" : "  (peak reset unavailable: lifetime peak)");
    printf("  %-34s %12s %12s\n", "RSS before the model (floor)", fmt_mib(b1, 32, rss_floor),
           fmt_mib(b3, 32, t_floor));
    printf("  %-34s %12s %12s", "peak - floor", fmt_mib(b1, 32, c_hwm - rss_floor),
           fmt_mib(b2, 32, have_t ? t_hwm - t_floor : -1));
    if (have_t && c_hwm > rss_floor)
        printf(" %8.2fx", (double)(t_hwm - t_floor) / (double)(c_hwm - rss_floor));
    printf("\n  %-34s %12s %12s\n", "lifetime peak RSS (ru_maxrss)", fmt_mib(b1, 32, ru.ru_maxrss),
           fmt_mib(b2, 32, t_maxrss));
    printf("  C allocations: parameters + gradients + 2 AdamW moments %s, model workspace %s, "
           "training activation arena %s\n",
           fmt_mib(b1, 32, (long)(4 * arena_bytes / 1024)),
           fmt_mib(b2, 32, (long)(arl_model_workspace_bytes(&cfg, &mo) / 1024)),
           fmt_mib(b3, 32, (long)(arl_model_train_arena_floats(&m, NULL) * 4 / 1024)));
    if (have_t)
        printf("\nloss after %d steps from the same start (training sanity): C %.6f, PyTorch "
               "%.6f\n",
               1 + nc, c_loss, t_loss);
    else
        printf("\nloss after %d steps (training sanity): C %.6f, PyTorch n/a\n", 1 + nc, c_loss);

    json_decref(info);
    arl_adamw_free(&opt);
    arl_model_train_free(&tr);
    arl_model_free(&m);
    arl_model_params_free(&grads);
    arl_model_params_free(&params);
    arl_model_config_free(&cfg);
    free(tokens);
    free(targets);
    free(cu);
    free(dlogp);
    free(logp);
    arl_options_free(g_opts, g_nopts, &o);
    return 0;
}
