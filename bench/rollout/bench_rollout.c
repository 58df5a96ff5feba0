/* bench/rollout/bench_rollout.c: the cost of the rollout machinery (rollout/worker.c) over the
 * bare model, measured in the same run on the same checkpoint.
 *
 *   decode   tokens/s of a rollout worker against a trivial in-process environment ("flood":
 *            no tools, an observation of --obs-bytes tokens per step) at batch 1, 16 and 64 -
 *            sampling with behaviour log-probabilities, per-token routes, turn parsing,
 *            actions, environment steps, rules, rendering, segment commits (with the default
 *            state-cache), all included: sampled tokens divided by the run's CPU time minus the
 *            CPU time of the observation prefill forwards - against the bare batched decode
 *            loop (arl_model_decode_step + arl_sample over the same batch, the same number of
 *            tokens, the same context lengths).  Target: overhead <= 15 %.  (The segment
 *            budget is far above a trajectory's length: every trajectory is one segment, as
 *            with the default 128K budget and short episodes.)
 *   prefill  tokens/s of observation prefill inside the worker (observations of --obs-bytes
 *            tokens, several sequences per forward) against arl_model_prefill of one sequence
 *            of the same length.
 *
 *   long context (--long-context): the model's prefill (2048 tokens) and decode (32 steps)
 *            tokens/s of one sequence at 4K, 64K, 256K and 1M tokens of context with
 *            block-sparse MLA (--mla-chunk, --mla-topk; spec/policy.md 4.5), to show that a
 *            token's cost no longer grows with the context beyond the T / n_c chunk scores.
 *            The context's latent cache rows are random rows written into the slot (their
 *            values do not change the cost; filling a million positions by prefill would take
 *            minutes).
 *
 * The same token schedule on both sides.  The bench's seeded checkpoint is made to sample byte
 * tokens only (the lm_head rows of the special tokens are zeroed and the byte rows scaled so
 * that a byte logit always leads by ~20 nats, see bytes_only): no turn ends early at
 * <|end_of_msg|> and no <|tool_call|> block draws a parse-error answer, so every turn runs to
 * the --turn-tokens cap and every observation is --obs-bytes long, exactly as in the bare loop.
 * Both sides then decode the same number of tokens at the same batch width over the same
 * context lengths; what differs is the machinery.  (With the plain random checkpoint,
 * --ragged, about a quarter of the turns stop early at random, the last trajectories of a
 * group decode alone at a thinner batch and parse-error answers lengthen the contexts; that
 * measures the workload's raggedness, not the machinery, and varies from run to run.)  The
 * worker's decode token count is checked against the bare loop's.  Batches below 16 run
 * ceil(16 / B) groups one after another (and the bare loop as many passes) so that every
 * measurement covers at least 16 trajectories' tokens.  A checkpoint given with --ckpt is used
 * as it is (its turns are as ragged as the model makes them).
 *
 * Columns: the medians of the rollout's and the bare loop's rates and the overhead of the
 * medians; the range of the per-repetition overheads (rollout and bare run one after the
 * other, so on a loaded machine each pair sees different neighbours: the spread shows how far
 * to trust the median); and the machinery share, measured inside each rollout run: the CPU time
 * of the decode side spent outside the model's decode forwards (sampling with its
 * log-probabilities, routes, turn parsing, actions, environment steps, rules, commits).  Both
 * parts of that share alternate step by step, so the machine's load inflates them alike: it is
 * the steadier measure of the machinery's own cost.
 *
 * Rates are tokens per second of process CPU time (--threads 1 by default: on a shared machine
 * wall time mostly measures the neighbours), interleaved repetitions, medians.
 *
 * --device cuda (or cpu-device): both sides on policy/model_device.h - the worker with
 * rollout.device, the bare loop over arl_model_dev_decode_step with the same host sampling -
 * and rates per second of WALL time (the GPU's work is not the process's CPU time); the
 * machinery share is then the wall time outside the model's decode forwards.  Run it on an idle
 * machine.
 *
 * Usage: bench_rollout [--ckpt DIR] [--turn-tokens N] [--turns N] [--obs-bytes N] [--reps R]
 *                      [--threads N] [--batch B] [--only rollout|bare] [--quick]
 *                      [--ragged] [--long-context] [--mla-chunk N] [--mla-topk K]
 *                      [--device cpu|cuda|cpu-device]
 *   --batch B    measure only batch B (any size >= 1) instead of 1, 16 and 64
 *   --only X     run only the rollout or only the bare side (for profiling one of them)
 *   --quick      a short run while iterating: 2 turns, observations of 256 tokens, 2
 *                repetitions (the ratios are noisier; report numbers of the full run)
 *   --ragged     keep the plain random checkpoint (turns of random length; see above)
 * Exit status: 0 done (whatever the ratios), 1 failure, 2 usage error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "bench/common/tmpdir.h"
#include "core/options.h"
#include "core/rng.h"
#include "envs/env.h"
#include "kernels/threadpool.h"
#include "policy/checkpoint.h"
#include "policy/model.h"
#include "policy/model_device.h"
#include "policy/params.h"
#include "policy/sample.h"
#include "replay/replay.h"
#include "rollout/rollout.h"

#ifndef ARL_BENCH_SOURCE_DIR
#define ARL_BENCH_SOURCE_DIR "."
#endif

/* ---- the trivial environment ---- */

typedef struct flood_state {
    int64_t obs_bytes, steps;
} flood_state;

static arl_status flood_reset(void *inst, const arl_env_reset_req *req, void **state,
                              arl_env_result *out) {
    (void)inst;
    flood_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "flood: out of memory");
    s->obs_bytes = 64;
    s->steps = 4;
    const json_t *d = req->task.data;
    if (json_integer_value(json_object_get(d, "obs_bytes")) > 0)
        s->obs_bytes = json_integer_value(json_object_get(d, "obs_bytes"));
    if (json_integer_value(json_object_get(d, "steps")) > 0)
        s->steps = json_integer_value(json_object_get(d, "steps"));
    *state = s;
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    return arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, "Write.");
}

static arl_status flood_step(void *inst, void *state, const arl_env_step_req *req,
                             arl_env_result *out) {
    (void)inst;
    flood_state *s = state;
    out->obs.context = ARL_ENV_CONTEXT_APPEND;
    const arl_env_action *a = req->action;
    for (int32_t i = 0; i < a->n_tool_calls; i++)
        ARL_TRY(arl_env_obs_add_tool(&out->obs, a->tool_calls[i].id, "no tools",
                                     ARL_ENV_TOOL_NOT_FOUND));
    ARL_TRY(arl_env_obs_answer_parse_errors(&out->obs, a));
    out->terminated = req->step_index >= s->steps;
    if (!out->terminated) {
        char *t = malloc((size_t)s->obs_bytes + 1);
        if (!t) return arl_errorf(ARL_ERR_NOMEM, "flood: out of memory");
        for (int64_t i = 0; i < s->obs_bytes; i++) t[i] = (char)('a' + (i * 7 + req->step_index) % 26);
        t[s->obs_bytes] = 0;
        arl_status st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, t);
        free(t);
        ARL_TRY(st);
    }
    return ARL_OK;
}

static arl_status flood_score(void *inst, void *state, const arl_env_score_req *req,
                              arl_env_score_result *out) {
    (void)inst;
    (void)state;
    (void)req;
    out->scorable = 1;
    out->reward = 0;
    return ARL_OK;
}

static void flood_free(void *inst, void *state) {
    (void)inst;
    free(state);
}

static const arl_env_ops flood_ops = {.thread_safety = 1, .reset = flood_reset,
                                      .step = flood_step, .score = flood_score,
                                      .free_state = flood_free};
static const arl_env_def flood_def = {
    .name = "flood", .version = "1.0.0", .description = "observations of a chosen size",
    .info_json = "{\"tools\": [], \"reward_levels\": {\"outcome\": {\"range\": [0, 1]}}, \"reward_components\": [], "
                 "\"capabilities\": {\"deterministic_replay\": true}, "
                 "\"limits\": {\"max_sessions\": 4096, \"max_observation_bytes\": 16777216}}",
    .ops = &flood_ops};

/* ---- helpers ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Process CPU seconds: on a shared, loaded machine wall time measures the neighbours; CPU time
 * of a single-threaded run measures the work. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --device: NULL (policy/model.h, CPU time) or a device of policy/model_device.h (wall time) */
static const char *g_device;
static const char *g_dev_name; /* the arl_dev_ops_get name: "cuda" or "cpu" */

static double clock_s(void) {
    return g_device ? now_s() : cpu_s();
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define DIE(s)                                                                                     \
    do {                                                                                           \
        if ((s) != ARL_OK) {                                                                       \
            fprintf(stderr, "bench_rollout: %s\n", arl_error_msg());                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct rollout_run {
    double decode_rate, prefill_rate;
    double rest_share; /* CPU outside the model's decode forwards / the decode side's CPU */
    int64_t tokens;
} rollout_run;

/* The machinery: B trajectories (one group) of `turns` turns of at most turn_tokens tokens. */
static rollout_run run_rollout(const char *ckpt, const char *dir, int B, int groups,
                               int64_t turn_tokens, int64_t turns, int64_t obs_bytes, int rep) {
    char db[600], data[128];
    snprintf(db, sizeof db, "%s/db-b%d-r%d", dir, B, rep);
    snprintf(data, sizeof data, "{\"obs_bytes\": %lld, \"steps\": %lld}", (long long)obs_bytes,
             (long long)turns);
    arl_rollout_config c;
    DIE(arl_rollout_config_defaults(&c));
    DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "env", "builtin:flood", &c));
    DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "task-data", data, &c));
    c.tasks = groups;
    c.group_size = B;
    c.batch_size = B;
    c.turn_tokens = turn_tokens;
    c.observation_tokens = obs_bytes + 4096; /* parse-error answers add up to ~1K per block */
    c.segment_tokens = 4 * (turn_tokens + obs_bytes + 4096);
    c.max_turns = turns + 1;
    c.prefill_chunk = 2048;
    c.progress_s = 0;
    c.seed = (int64_t)rep;
    if (g_device) DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "device", g_device, &c));
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    DIE(replay_store_open(db, &o, &st));
    arl_rollout_worker *w;
    DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w));
    double t0 = now_s(), c0 = cpu_s();
    DIE(arl_rollout_worker_run(w));
    double wall = now_s() - t0, cpu = cpu_s() - c0;
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    rollout_run r = {.tokens = s->decode_tokens};
    fprintf(stderr,
            "  [batch %d: wall %.2f s = decode %.2f + prefill %.2f + store %.2f + rest %.2f; mean "
            "decode batch %.1f; %lld tokens sampled]\n",
            B, wall, s->decode_s, s->prefill_s, s->store_s,
            wall - s->decode_s - s->prefill_s - s->store_s,
            s->decode_steps ? (double)s->decode_tokens / (double)s->decode_steps : 0.0,
            (long long)s->decode_tokens);
    r.decode_rate = (double)s->decode_tokens / (cpu - s->prefill_cpu_s);
    r.rest_share = (cpu - s->prefill_cpu_s - s->decode_cpu_s) / (cpu - s->prefill_cpu_s);
    if (g_device) { /* wall time: the forwards run on the device */
        r.decode_rate = (double)s->decode_tokens / (wall - s->prefill_s);
        r.rest_share = (wall - s->prefill_s - s->decode_s) / (wall - s->prefill_s);
    }
    fprintf(stderr, "  [batch %d: CPU %.2f s = prefill forwards %.2f + decode forwards %.2f + the "
                    "rest %.2f (%.1f %% of the decode side)]\n",
            B, cpu, s->prefill_cpu_s, s->decode_cpu_s, cpu - s->prefill_cpu_s - s->decode_cpu_s,
            100.0 * (cpu - s->prefill_cpu_s - s->decode_cpu_s) / (cpu - s->prefill_cpu_s));
    r.prefill_rate = (double)s->prefill_tokens / (g_device ? s->prefill_s : s->prefill_cpu_s);
    arl_rollout_worker_close(w);
    replay_store_close(st);
    arl_rollout_config_free(&c);
    return r;
}

/* The bare loop: B sequences with the rollout's token schedule - a prompt, then `turns` turns
 * of turn_tokens decode steps with sampling (timed), an observation of obs tokens prefilled
 * between turns (not timed) - so that both see the same context lengths; `groups` passes. */
static double run_bare(const arl_model_config *cfg, const arl_model_params *p, int B, int groups,
                       int64_t turn_tokens, int64_t turns, int64_t obs) {
    arl_model m;
    arl_model_dev md;
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = 2048;
    mo.max_docs = B;
    mo.max_context = 64 + turns * (turn_tokens + obs) + 16;
    arl_decode_state st;
    DIE(arl_decode_state_init(&st, cfg, B, mo.max_context));
    if (g_device) {
        const arl_dev_ops *ops;
        arl_model_dev_opts dopts = {.n_slots = B};
        int64_t need = arl_model_dev_bytes(cfg, &mo, arl_dev_ops_cuda(), &dopts);
        DIE(arl_dev_ops_get(g_dev_name, (size_t)need + ((size_t)64 << 20), &ops));
        DIE(arl_model_dev_init(&md, ops, cfg, p, &mo, &dopts));
    } else {
        DIE(arl_model_init(&m, cfg, p, &mo));
    }
    arl_sampler smp;
    DIE(arl_sampler_init(&smp, cfg->dims.V));
    const int64_t V = cfg->dims.V;
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)B), *tok = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *ot = malloc(sizeof(int32_t) * (size_t)(obs + 32));
    float *logits = malloc(sizeof(float) * (size_t)B * (size_t)V);
    for (int64_t i = 0; i < obs + 32; i++) ot[i] = 'a' + (int32_t)(i % 26);
    arl_rng rng[64];
    arl_sample_params sp = {.temperature = 1.0, .top_p = 1.0};
    double timed = 0;
    for (int g = 0; g < groups; g++) {
        for (int b = 0; b < B; b++) {
            if (g > 0) arl_decode_state_leave(&st, slots[b]);
            DIE(arl_decode_state_join(&st, &slots[b]));
            if (g_device) {
                DIE(arl_model_dev_slot_reset(&md, slots[b]));
                DIE(arl_model_dev_prefill(&md, slots[b], ot, 24, NULL, 0, NULL,
                                          logits + (int64_t)b * V));
            } else {
                DIE(arl_model_prefill(&m, &st, slots[b], ot, 24, NULL, 0, NULL,
                                      logits + (int64_t)b * V));
            }
            arl_rng_seed_stream(&rng[b % 64], 1, (uint64_t)(g * B + b));
        }
        for (int64_t turn = 0; turn < turns; turn++) {
            double t0 = clock_s();
            for (int64_t k = 0; k < turn_tokens; k++) {
                for (int b = 0; b < B; b++) {
                    float lp;
                    tok[b] = arl_sample(&smp, logits + (int64_t)b * V, &sp, &rng[b % 64], &lp,
                                        NULL);
                }
                if (g_device)
                    DIE(arl_model_dev_decode_step(&md, slots, B, tok, logits, NULL));
                else
                    DIE(arl_model_decode_step(&m, &st, slots, B, tok, logits, NULL));
            }
            timed += clock_s() - t0;
            if (turn + 1 < turns)
                for (int b = 0; b < B; b++) {
                    if (g_device)
                        DIE(arl_model_dev_prefill(&md, slots[b], ot, obs + 32, NULL, 0, NULL,
                                                  logits + (int64_t)b * V));
                    else
                        DIE(arl_model_prefill(&m, &st, slots[b], ot, obs + 32, NULL, 0, NULL,
                                              logits + (int64_t)b * V));
                }
        }
    }
    double rate = (double)(groups * turns * turn_tokens * B) / timed;
    free(slots);
    free(tok);
    free(ot);
    free(logits);
    arl_sampler_free(&smp);
    arl_decode_state_free(&st);
    if (g_device)
        arl_model_dev_free(&md);
    else
        arl_model_free(&m);
    return rate;
}

/* One sequence: `ctx` tokens of context (not timed), then n tokens prefilled (timed) - an
 * observation arriving after earlier turns, as in the rollout. */
static double run_bare_prefill(const arl_model_config *cfg, const arl_model_params *p, int64_t ctx,
                               int64_t n) {
    arl_model m;
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = 2048;
    mo.max_docs = 1;
    mo.max_context = ctx + n + 16;
    arl_decode_state st;
    DIE(arl_decode_state_init(&st, cfg, 1, mo.max_context));
    int32_t slot, *t = malloc(sizeof(int32_t) * (size_t)(n > ctx ? n : ctx));
    float *last = malloc(sizeof(float) * (size_t)cfg->dims.V);
    for (int64_t i = 0; i < (n > ctx ? n : ctx); i++) t[i] = 'a' + (int32_t)(i % 26);
    DIE(arl_decode_state_join(&st, &slot));
    double rate;
    if (g_device) {
        arl_model_dev md;
        const arl_dev_ops *ops;
        arl_model_dev_opts dopts = {.n_slots = 1};
        int64_t need = arl_model_dev_bytes(cfg, &mo, arl_dev_ops_cuda(), &dopts);
        DIE(arl_dev_ops_get(g_dev_name, (size_t)need + ((size_t)64 << 20), &ops));
        DIE(arl_model_dev_init(&md, ops, cfg, p, &mo, &dopts));
        if (ctx > 0) DIE(arl_model_dev_prefill(&md, 0, t, ctx, NULL, 0, NULL, last));
        double t0 = clock_s();
        DIE(arl_model_dev_prefill(&md, 0, t, n, NULL, 0, NULL, last));
        rate = (double)n / (clock_s() - t0);
        arl_model_dev_free(&md);
    } else {
        DIE(arl_model_init(&m, cfg, p, &mo));
        if (ctx > 0) DIE(arl_model_prefill(&m, &st, slot, t, ctx, NULL, 0, NULL, last));
        double t0 = cpu_s();
        DIE(arl_model_prefill(&m, &st, slot, t, n, NULL, 0, NULL, last));
        rate = (double)n / (cpu_s() - t0);
        arl_model_free(&m);
    }
    free(t);
    free(last);
    arl_decode_state_free(&st);
    return rate;
}

/* Prefill and decode tokens/s of one sequence after `ctx` positions whose latent rows are
 * random (see the header), block-sparse MLA with chunks of n_c and top k_c. */
static void run_long(const arl_model_config *cfg, const arl_model_params *p, int64_t ctx,
                     int64_t n_c, int64_t k_c, double *prefill, double *decode) {
    const int64_t n = 2048, steps = 32;
    arl_model m;
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = 2048;
    mo.max_docs = 1;
    mo.max_context = ctx + n + steps + 16;
    mo.mla_sparse_chunk = n_c;
    mo.mla_sparse_topk = k_c;
    DIE(arl_model_init(&m, cfg, p, &mo));
    arl_decode_state st;
    DIE(arl_decode_state_init(&st, cfg, 1, mo.max_context));
    int32_t slot;
    DIE(arl_decode_state_join(&st, &slot));
    DIE(arl_decode_state_reserve(&st, slot, ctx + n + steps));
    arl_rng g;
    arl_rng_seed(&g, 7);
    const int64_t R = cfg->dims.rkv + cfg->dims.r;
    for (int64_t l = 0; l < cfg->dims.L; l++) {
        if (st.mla_index[l] < 0) continue;
        float *c = arl_decode_state_latent(&st, slot, l);
        for (int64_t i = 0; i < ctx * R; i++)
            c[i] = (float)arl_rng_normal(&g);
    }
    st.slots[slot].pos = ctx; /* the slot now holds ctx positions (KDA state zero) */
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    float *last = malloc(sizeof(float) * (size_t)cfg->dims.V);
    for (int64_t i = 0; i < n; i++) t[i] = 'a' + (int32_t)(i % 26);
    /* one token first: the chunk summaries of the random rows are built once, untimed */
    DIE(arl_model_prefill(&m, &st, slot, t, 1, NULL, 0, NULL, last));
    double t0 = cpu_s();
    DIE(arl_model_prefill(&m, &st, slot, t, n, NULL, 0, NULL, last));
    *prefill = (double)n / (cpu_s() - t0);
    t0 = cpu_s();
    for (int64_t i = 0; i < steps; i++)
        DIE(arl_model_decode_step(&m, &st, &slot, 1, t + i, last, NULL));
    *decode = (double)steps / (cpu_s() - t0);
    free(t);
    free(last);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

/* Make the checkpoint sample byte tokens only (see the header): the lm_head rows of ids >= 256
 * (the template's special tokens) become zero, so their logits are 0, and the byte rows are
 * scaled so that the byte logits have a standard deviation of 8 (measured over 64 decode steps
 * of a sequence): the largest of 256 such logits is ~20 nats above 0, so a special token
 * comes with probability ~128 e^-20 ~ 3e-7 per token.  The model's cost does not depend on
 * the weights' values. */
static void bytes_only(const arl_model_config *cfg, arl_model_params *p) {
    const int64_t V = cfg->dims.V, d = cfg->dims.d, n = 64;
    arl_model m;
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_docs = 1;
    mo.max_context = n + 16;
    DIE(arl_model_init(&m, cfg, p, &mo));
    arl_decode_state st;
    DIE(arl_decode_state_init(&st, cfg, 1, mo.max_context));
    int32_t slot, tok = 'a';
    DIE(arl_decode_state_join(&st, &slot));
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!logits) DIE(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        DIE(arl_model_decode_step(&m, &st, &slot, 1, &tok, logits, NULL));
        for (int64_t v = 0; v < 256; v++) {
            s1 += logits[v];
            s2 += (double)logits[v] * logits[v];
        }
        tok = (int32_t)('a' + (i * 7) % 26);
    }
    double mean = s1 / (double)(n * 256), sd = sqrt(s2 / (double)(n * 256) - mean * mean);
    float scale = (float)(8.0 / (sd > 1e-12 ? sd : 1e-12));
    for (int64_t v = 0; v < V; v++)
        for (int64_t j = 0; j < d; j++)
            p->lm_head[v * d + j] = v < 256 ? p->lm_head[v * d + j] * scale : 0.0f;
    free(logits);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

typedef struct ropts {
    char *ckpt;
    int64_t turn_tokens, turns, obs_bytes, reps, threads, batch, mla_chunk, mla_topk;
    char *only, *device;
    int quick, ragged, long_context;
} ropts;

static const arl_option OPTS[] = {
    {"ckpt", ARL_OPT_STRING, offsetof(ropts, ckpt), "",
     "checkpoint to time, used as it is (empty: a seeded tiny checkpoint that samples byte "
     "tokens only, in a temporary directory)",
     0, 0, NULL, 0, "DIR"},
    {"turn-tokens", ARL_OPT_INT, offsetof(ropts, turn_tokens), "128", "tokens per turn (the cap)",
     1, 8192, NULL, 0, "N"},
    {"turns", ARL_OPT_INT, offsetof(ropts, turns), "3", "turns per trajectory (--quick: 2)", 1, 64,
     NULL, 0, "N"},
    {"obs-bytes", ARL_OPT_INT, offsetof(ropts, obs_bytes), "1024",
     "tokens of each observation (--quick: 256)", 1, 65536, NULL, 0, "N"},
    {"reps", ARL_OPT_INT, offsetof(ropts, reps), "3",
     "interleaved repetitions of each measurement (medians; --quick: 2)", 1, 50, NULL, 0, "R"},
    {"threads", ARL_OPT_INT, offsetof(ropts, threads), "1", "threads of the kernels' pool", 1, 256,
     NULL, 0, "N"},
    {"batch", ARL_OPT_INT, offsetof(ropts, batch), "0",
     "measure only this batch size (0: batches 1, 16 and 64)", 0, 4096, NULL, 0, "B"},
    {"only", ARL_OPT_CHOICE, offsetof(ropts, only), "both",
     "run only the rollout or only the bare side (profiling; no ratios)", 0, 0, "both|rollout|bare",
     0, NULL},
    {"quick", ARL_OPT_BOOL, offsetof(ropts, quick), "false",
     "a short run while iterating: --turns 2 --obs-bytes 256 --reps 2 unless given (noisier "
     "ratios: report the full run's)",
     0, 0, NULL, 0, NULL},
    {"ragged", ARL_OPT_BOOL, offsetof(ropts, ragged), "false",
     "keep the plain random checkpoint (turns of random length: measures the workload's "
     "raggedness, not the machinery)",
     0, 0, NULL, 0, NULL},
    {"long-context", ARL_OPT_BOOL, offsetof(ropts, long_context), "false",
     "also time prefill and decode of one sequence at 4K..1M tokens of context with "
     "block-sparse MLA (CPU only)",
     0, 0, NULL, 0, NULL},
    {"mla-chunk", ARL_OPT_INT, offsetof(ropts, mla_chunk), "1024",
     "block-sparse MLA chunk size of --long-context", 1, 1 << 20, NULL, 0, "N"},
    {"mla-topk", ARL_OPT_INT, offsetof(ropts, mla_topk), "4",
     "block-sparse MLA chunks read per query of --long-context", 1, 4096, NULL, 0, "K"},
    {"device", ARL_OPT_CHOICE, offsetof(ropts, device), "cpu",
     "where both sides decode (cuda: a GPU; cpu-device: the device code path on the CPU); rates "
     "are then per wall second",
     0, 0, "cpu|cuda|cpu-device", 0, NULL},
};

int main(int argc, char **argv) {
    ropts o;
    const char *summary = "decode tokens/s of the rollout worker vs the bare batched decode loop "
                          "of the same model at batch 1, 16 and 64, in the same run (overhead: "
                          "bare rate / rollout rate - 1)";
    int parsed = bench_options_parse("bench_rollout", summary, OPTS, ARL_OPTIONS_COUNT(OPTS), argc,
                                     argv, &o);
    if (parsed >= 0) return parsed;
    if (o.quick) {
        if (!bench_option_given(argc, argv, "turns")) o.turns = 2;
        if (!bench_option_given(argc, argv, "obs-bytes")) o.obs_bytes = 256;
        if (!bench_option_given(argc, argv, "reps")) o.reps = 2;
    }
    const char *ckpt = o.ckpt[0] ? o.ckpt : NULL;
    const int long_context = o.long_context, ragged = o.ragged;
    const int64_t mla_chunk = o.mla_chunk, mla_topk = o.mla_topk;
    const int64_t turn_tokens = o.turn_tokens, turns = o.turns, obs_bytes = o.obs_bytes;
    const int reps = (int)o.reps, threads = (int)o.threads, one_batch = (int)o.batch;
    const char *only = strcmp(o.only, "both") ? o.only : NULL;
    if (strcmp(o.device, "cpu")) {
        g_device = o.device;
        g_dev_name = strcmp(o.device, "cuda") ? "cpu" : "cuda";
    }
    if (g_device && long_context) {
        fprintf(stderr, "bench_rollout: --long-context runs block-sparse MLA: CPU only\n");
        return 2;
    }
    DIE(arl_k_threads_init(threads));
    const char *dir = bench_tmpdir_create("bench_rollout", 4);
    if (!dir) return 1;
    DIE(arl_env_builtin_register(&flood_def));
    arl_model_config cfg;
    arl_model_params p;
    char ck[600];
    if (!ckpt) { /* a seeded tiny checkpoint */
        snprintf(ck, sizeof ck, "%s/ckpt", dir);
        /* the source tree's tiny config wherever the program runs from; else the shipped
         * configs' search (working directory, beside the program, AGENTRL_CONFIG_DIR) */
        const char *src_cfg = ARL_BENCH_SOURCE_DIR "/configs/tiny/config.json";
        DIE(arl_model_config_load(access(src_cfg, R_OK) == 0 ? src_cfg : "tiny", &cfg));
        DIE(arl_model_params_alloc(&p, &cfg));
        DIE(arl_params_init(&p, &cfg, 1, 1));
        if (!ragged) bytes_only(&cfg, &p);
        DIE(arl_checkpoint_save(ck, &cfg, &p, 0));
        ckpt = ck;
    } else {
        DIE(arl_model_config_read(ckpt, &cfg));
        DIE(arl_model_params_alloc(&p, &cfg));
        DIE(arl_checkpoint_load(ckpt, &cfg, &p));
    }
    printf("bench_rollout: %s, turns of %lld tokens, %lld turns, observations of %lld tokens, "
           "median of %d, %d thread(s), tokens per %s second; %s\n\n",
           ckpt, (long long)turn_tokens, (long long)turns, (long long)obs_bytes, reps, threads,
           g_device ? "WALL (device)" : "CPU",
           ragged ? "random checkpoint (ragged turns)"
                  : "byte-only checkpoint (every turn runs to the cap on both sides)");
    printf("decode tokens/s          rollout       bare    overhead  target    spread of the "
           "overhead   machinery share\n");
    int batches[3] = {1, 16, 64}, n_batches = 3;
    if (one_batch) {
        batches[0] = one_batch;
        n_batches = 1;
    }
    const int do_rollout = !only || !strcmp(only, "rollout"), do_bare = !only || !strcmp(only, "bare");
    double pf[3 * 50];
    int npf = 0;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi], groups = B < 16 ? (16 + B - 1) / B : 1;
        double r[50] = {0}, b[50] = {0}, ov[50] = {0}, sh[50] = {0};
        for (int rep = 0; rep < reps; rep++) { /* interleaved: both see the same load */
            if (do_rollout) {
                rollout_run rr =
                    run_rollout(ckpt, dir, B, groups, turn_tokens, turns, obs_bytes, rep);
                if (!ragged && rr.tokens != (int64_t)groups * B * turns * turn_tokens)
                    fprintf(stderr, "bench_rollout: warning: the worker sampled %lld tokens, the "
                                    "bare loop %lld (a turn stopped early: not the same "
                                    "schedule)\n",
                            (long long)rr.tokens, (long long)groups * B * turns * turn_tokens);
                r[rep] = rr.decode_rate;
                sh[rep] = rr.rest_share;
                pf[npf++] = rr.prefill_rate;
            }
            if (do_bare) b[rep] = run_bare(&cfg, &p, B, groups, turn_tokens, turns, obs_bytes);
            if (do_rollout && do_bare) ov[rep] = b[rep] / r[rep] - 1.0;
            if (do_rollout && do_bare)
                fprintf(stderr, "  [batch %d rep %d: rollout %.0f, bare %.0f tok/s, overhead %.1f %%]\n",
                        B, rep, r[rep], b[rep], 100.0 * (b[rep] / r[rep] - 1.0));
        }
        double mr = median(r, reps), mb = median(b, reps);
        if (!(do_rollout && do_bare && mr > 0 && mb > 0)) { /* --only: one side, no ratio */
            char rs[16] = "n/a", bs[16] = "n/a";
            if (do_rollout) snprintf(rs, sizeof rs, "%.0f", mr);
            if (do_bare) snprintf(bs, sizeof bs, "%.0f", mb);
            printf("  batch %-3d          %10s %10s %10s     (one side only: no overhead)\n", B, rs,
                   bs, "n/a");
            fflush(stdout);
            continue;
        }
        double over = mb / mr - 1.0;
        double msh = median(sh, reps);
        qsort(ov, (size_t)reps, sizeof *ov, cmp_d);
        printf("  batch %-3d          %10.0f %10.0f %10.1f %%   <= 15 %% %-6s [%5.1f, %5.1f] %%"
               "     %5.1f %%\n",
               B, mr, mb, 100.0 * over, over <= 0.15 ? "" : "(over)", 100.0 * ov[0],
               100.0 * ov[reps - 1], 100.0 * msh);
        fflush(stdout);
    }

    double bp[50];
    if (only) goto long_ctx; /* profiling one side: no prefill comparison */
    /* the rollout's observations arrive after the prompt and earlier turns: on average about
     * (turns - 1) / 2 observations and turns of context */
    int64_t ctx = 24 + (turns - 1) * (turn_tokens + obs_bytes + 32) / 2;
    for (int rep = 0; rep < reps; rep++) bp[rep] = run_bare_prefill(&cfg, &p, ctx, obs_bytes);
    printf("\nprefill tokens/s of observations (%lld tokens each, bare after %lld tokens of "
           "context)\n",
           (long long)obs_bytes, (long long)ctx);
    printf("  rollout (batched observations)  %10.0f\n", npf ? median(pf, npf) : 0.0);
    printf("  bare %-26s %10.0f\n", g_device ? "arl_model_dev_prefill" : "arl_model_prefill",
           median(bp, reps));
long_ctx:
    if (long_context) {
        printf("\nlong context, block-sparse MLA (chunks of %lld, top %lld): tokens/s of one "
               "sequence\n  context      prefill     decode\n",
               (long long)mla_chunk, (long long)mla_topk);
        const int64_t ctxs[4] = {4096, 65536, 262144, 1048576};
        for (int i = 0; i < 4; i++) {
            double pr, de;
            run_long(&cfg, &p, ctxs[i], mla_chunk, mla_topk, &pr, &de);
            printf("  %8lld %10.0f %10.0f\n", (long long)ctxs[i], pr, de);
        }
    }
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
    arl_options_free(OPTS, ARL_OPTIONS_COUNT(OPTS), &o);
    return 0;
}
