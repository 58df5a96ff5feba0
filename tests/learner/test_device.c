/* tests/learner/test_device.c: the learner on a device (learner.device, learner/device.c).
 *
 *   - cpu-device (the device code over host memory) reproduces the CPU learner bit for bit:
 *     two updates over calculator trajectories with continue segments (cached start states,
 *     drift recomputation), a reference of other weights, routing replay, Quantile Balancing,
 *     two minibatches: every updated weight, the optimizer moments, every metric but the
 *     timings, each segment's pi_old / reference / theta log-probs, and the minibatch loss a
 *     test's grad hook asks for (weights perturbed and restored); with the shared prompt prefix
 *     with prefix-refresh per_minibatch (start states recomputed at the current weights); with
 *     activation checkpointing on the device (layers recomputed in the backward) against the
 *     default CPU run (checkpointing changes no bit on the CPU:
 *     tests/policy_backward/test_backward_unit.c), and without the hook on both sides, which
 *     lets the device run AdamW (moments on the device for the update).  (Not against the
 *     hooked CPU run: the hook's perturbed minibatch loss leaves its log-probs in the batch.)
 *     With block-sparse MLA (k_c 1 of chunks of 16 tokens: the trajectories' queries select
 *     among several earlier chunks) the same, the training step over the selected chunks.
 *     With the device's slots sharing fewer latent rows than max-docs x the context
 *     (learner.device-slot-rows): at 3072 rows slots are evicted to make room (the same bits);
 *     at 1536, fewer than some forwards' documents need together, those calls are made again
 *     with fewer documents: the gradient is the same fp32 terms summed in more parts, so the
 *     weights agree to 1e-3 of the largest step and the log-probs to 1e-4 (measured 2.2e-7
 *     of a 0.0177 step, 1.4e-6), with the splits and evictions counted in the metrics.
 *     The settings that act within an update (prefix-refresh per_minibatch, checkpointing,
 *     block-sparse MLA, slot rows, bf16) are compared over one update, the others over two.
 *   - refusals: an unknown device name, device-allreduce nccl off cuda, device-math bf16 off
 *     cuda, an unknown device-math, cuda on a machine without a GPU (a clear error from
 *     arl_learner_create).
 *   - `test_learner_device cuda` (gpu; exit 77 without one): the same updates on the GPU
 *     against the CPU: fp32 sums in other orders (cuBLAS and the device kernels, spec/policy.md
 *     16.4) give gradients equal to ~1e-6 relative; AdamW divides each entry by its own
 *     magnitude, so an entry whose gradient is near the rounding level (|g| ~ eps = 1e-8) may
 *     step differently by up to lr |g| / (|g| + eps) per step: the weights within 5% of the
 *     largest step of the four, the log-probs of the passes within 1e-3 nats, the loss,
 *     KL, entropy and gradient norm within 1e-3 relative; with the gradient all-reduce over a
 *     one-rank NCCL communicator (learner.device-allreduce nccl) the same bits as without, AdamW
 *     on the host (with the hook) and on the device (without).  Block-sparse: a (query, head)
 *     whose two best chunk scores agree to ~1e-7 relative may select the other chunk on the GPU
 *     (the scores are fp32 sums in another order; the selection carries no gradient, spec 4.5),
 *     which moves that token's log-prob by more than rounding: there at most 0.5% of the
 *     log-probs beyond 1e-3 (a flip is expected in well under one run in ten here).  With
 *     learner.device-math bf16 (GEMM inputs rounded to 8 bits, spec/policy.md 1.4): the loss,
 *     KL and entropy within 3e-2 relative and the log-probs within 0.1 nats of the CPU's (a
 *     wrong index or missing term moves them by order 1; the bounds are not yet measured on a
 *     GPU), the weights only bounded by AdamW's steps.
 */
#include <jansson.h>
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/nccl.h"
#include "tests/learner/lhelpers.h"

static char tmp[512], ckpt[600], ref_ckpt[600], db[600];
static int64_t gids[2][8];
static int64_t n_gids[2];
static int cuda;
/* updates per run: two where the second update is what is tested (start states cached at the
 * first update's weights and recomputed for drift; the device's AdamW moments kept between
 * updates), one for the cases whose setting acts within an update (an update is 4 s of the
 * suite's time on a 2-core machine).  AddressSanitizer runs an update about 4x slower, so there
 * one update (the refusals and the device AdamW case only: the facade, the passes and the device
 * optimizer under the sanitizers; every case runs in the Release pass). */
#if defined(__SANITIZE_ADDRESS__)
#define N_UPD 1
static const int sanitized = 1;
#else
#define N_UPD 2
static const int sanitized = 0;
#endif
static int g_hook = 1; /* the runs set the loss hook (which keeps AdamW on the host) */
/* learner.device-slot-rows of test_device_shared_rows: 3072 rows for the six slots instead of
 * 6 x 8192; every forward's documents (up to ~1040 rows each) fit, but not with every other
 * slot's rows: slots are evicted (their states synced to the host and uploaded again), which
 * changes no bit */
#define SHARED_ROWS 3072
/* learner.device-slot-rows of test_device_tight_rows: fewer than the documents of one forward
 * need together, enough for the longest alone */
#define TIGHT_ROWS 1536
static int g_loose; /* compare: tolerances instead of bits on cpu-device (calls split) */

/* What a grad hook saw: the loss of minibatch mb at the weights with one entry moved (what a
 * finite-difference test does), the weights put back after. */
typedef struct hook_rec {
    arl_model_params *w;
    double loss[4];
    int n;
} hook_rec;

static void loss_hook(void *ctx, arl_learner *l, int32_t mb, const arl_model_params *g) {
    (void)g;
    hook_rec *r = ctx;
    if (r->n >= 4) return;
    float *x = &r->w->arena[r->w->inv.arena_floats / 3];
    const float keep = *x;
    *x += 1e-2f;
    double loss = NAN;
    L_DIE(arl_learner_minibatch_loss(l, mb, &loss), "minibatch loss");
    *x = keep;
    r->loss[r->n++] = loss;
}

typedef struct run {
    lh_learner h;
    hook_rec hook;
    char *metrics[2];
    int n_upd; /* updates run */
} run;

/* n_upd updates (the second over the next groups, at the weights of the first) on device dev. */
static void run_updates(run *r, const char *dev, const lh_opts *base, int n_upd) {
    memset(r, 0, sizeof *r);
    r->n_upd = n_upd;
    lh_opts o = *base;
    o.device = dev;
    L_DIE(lh_learner_try_open(&r->h, ckpt, ref_ckpt, 2, 6, NULL, &o), "learner");
    r->hook.w = &r->h.params;
    if (g_hook) arl_learner_set_grad_hook(r->h.l, loss_hook, &r->hook);
    for (int n = 0; n < r->n_upd; n++) {
        arl_update_source src = {.root = db, .group_ids = gids[n], .n_groups = n_gids[n]};
        replay_open_opts oo = {0};
        L_DIE(replay_store_open(db, &oo, &src.store), "store");
        arl_update_result res;
        L_DIE(arl_learner_update(r->h.l, n, &src, 1, &res), "update");
        r->metrics[n] = res.metrics_json;
        replay_store_close(src.store);
    }
}

static void run_free(run *r) {
    lh_learner_close(&r->h);
    free(r->metrics[0]);
    free(r->metrics[1]);
}

/* Timings, and the device slots' bookkeeping (evictions move states, not numbers). */
static int timing_key(const char *k) {
    return !strncmp(k, "time/", 5) || !strncmp(k, "throughput/", 11) || strstr(k, "_per_s") ||
           !strncmp(k, "state/device_", 13);
}

/* Every numeric metric of a and b but the timings: equal. */
static void metrics_match(const char *a, const char *b, const char *what) {
    json_t *ja = json_loads(a, 0, NULL), *jb = json_loads(b, 0, NULL);
    CHECK(ja && jb);
    const char *k;
    json_t *va;
    int n = 0, bad = 0;
    json_object_foreach(ja, k, va) {
        if (!json_is_number(va) || timing_key(k)) continue;
        json_t *vb = json_object_get(jb, k);
        const double x = json_number_value(va),
                     y = json_is_number(vb) ? json_number_value(vb) : NAN;
        const int same = x == y || (isnan(x) && isnan(y));
        if (!same && bad++ < 5) fprintf(stderr, "  %s: metric %s: %.17g vs %.17g\n", what, k, x, y);
        n++;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d metrics differ", what, bad, n);
    CHECK(n > 40);
    json_decref(ja);
    json_decref(jb);
}

/* The largest |a - b| over the arenas, and the largest |a - a0| (the step's size). */
static void arena_diff(const float *a, const float *b, const float *a0, int64_t n, double *d,
                       double *step) {
    *d = 0;
    *step = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - (double)b[i]);
        if (x > *d || isnan(x)) *d = isnan(x) ? INFINITY : x;
        if (a0) {
            const double s = fabs((double)a[i] - (double)a0[i]);
            if (s > *step) *step = s;
        }
    }
}

/* Log-probs of every loaded segment (pi_old, reference, theta): max |a - b|; *n_far, *n_all:
 * how many of them differ by more than 1e-3, of how many. */
static double logprob_diff(const arl_learner *la, const arl_learner *lb, int64_t *n_far,
                           int64_t *n_all) {
    const arl_update_batch *ba = arl_learner_batch(la), *bb = arl_learner_batch(lb);
    CHECK_EQ_INT(ba->n_segs, bb->n_segs);
    double d = 0;
    *n_far = *n_all = 0;
    for (int32_t i = 0; i < ba->n_segs && i < bb->n_segs; i++) {
        const arl_upd_seg *x = &ba->segs[i], *y = &bb->segs[i];
        if (!x->local || !x->lp_old) continue;
        CHECK_EQ_INT(x->T, y->T);
        for (int64_t t = 0; t < x->T; t++) {
            const double v[3] = {fabs(x->lp_old[t] - y->lp_old[t]),
                                 fabs(x->lp_ref[t] - y->lp_ref[t]),
                                 fabs(x->lp_theta[t] - y->lp_theta[t])};
            for (int j = 0; j < 3; j++) {
                if (!(v[j] <= d)) d = isnan(v[j]) ? INFINITY : v[j];
                *n_far += !(v[j] <= 1e-3);
                ++*n_all;
            }
        }
    }
    return d;
}

/* The CPU side of the comparisons whose CPU learner is the default one with the grad hook: made
 * once, shared by those cases (it stays at this address: the learner holds its hook record).
 * learner.device-slot-rows is read by the device only; activation checkpointing changes no bit
 * of the CPU learner's results (file comment). */
static run g_cpu_plain[N_UPD]; /* [updates - 1] */
static int g_cpu_plain_made[N_UPD];

/* The CPU side of a comparison with settings o: the shared run when o's CPU learner gives the
 * default one's bits, else own (made here; the caller frees it).  Every setting of lh_opts but
 * slot_rows and act_checkpoint changes the CPU learner's numbers: one added there must be added
 * here. */
static run *cpu_side(const lh_opts *o, int n_upd, run *own) {
    const int plain = g_hook && !o->shared_prefix && !o->device && !o->allreduce && !o->math &&
                      !o->prefix_per_minibatch && !o->sparse_topk && !o->sparse_chunk;
    if (!plain) {
        run_updates(own, "cpu", o, n_upd);
        return own;
    }
    const int k = n_upd - 1;
    if (!g_cpu_plain_made[k]) {
        const lh_opts dflt = {0};
        run_updates(&g_cpu_plain[k], "cpu", &dflt, n_upd);
        g_cpu_plain_made[k] = 1;
    }
    return &g_cpu_plain[k];
}

/* The CPU learner and the device (cpu-device, or cuda) with settings o over n_upd updates (at
 * most N_UPD): the same bits, or within the tolerances of the file comment. */
static void compare(const lh_opts *o, int n_upd, const char *what) {
    if (n_upd > N_UPD) n_upd = N_UPD;
    run own, b;
    run *a = cpu_side(o, n_upd, &own);
    run_updates(&b, cuda ? "cuda" : "cpu-device", o, n_upd);
    const int64_t nf = a->h.params.inv.arena_floats;
    double dw, step, dm, dv, ds;
    arl_model_params w0;
    L_DIE(arl_model_params_alloc(&w0, &a->h.cfg), "params");
    L_DIE(arl_checkpoint_load(ckpt, &a->h.cfg, &w0), "load");
    arena_diff(a->h.params.arena, b.h.params.arena, w0.arena, nf, &dw, &step);
    arena_diff(a->h.opt.m.arena, b.h.opt.m.arena, NULL, nf, &dm, &ds);
    arena_diff(a->h.opt.v.arena, b.h.opt.v.arena, NULL, nf, &dv, &ds);
    int64_t n_far, n_all;
    const double dl = logprob_diff(a->h.l, b.h.l, &n_far, &n_all);
    if (dw > 0) /* name the first tensor whose weights differ */
        for (int64_t i = 0; i < a->h.params.inv.n; i++) {
            const arl_param_tensor *t = &a->h.params.inv.t[i];
            if (memcmp(a->h.params.arena + t->offset, b.h.params.arena + t->offset,
                       sizeof(float) * (size_t)t->numel)) {
                fprintf(stderr, "  first differing weights: %s\n", t->name);
                break;
            }
        }
    fprintf(stderr,
            "  %s: weights moved up to %.3g; |cpu - %s|: weights %.3g, moments %.3g / %.3g, "
            "log-probs %.3g (%lld of %lld beyond 1e-3)\n",
            what, step, cuda ? "cuda" : "cpu-device", dw, dm, dv, dl, (long long)n_far,
            (long long)n_all);
    CHECK(step > 0);
    CHECK(a->n_upd == n_upd && b.n_upd == n_upd);
    CHECK_EQ_INT(a->hook.n, g_hook ? 2 * n_upd : 0); /* two minibatches per update */
    CHECK_EQ_INT(b.hook.n, g_hook ? 2 * n_upd : 0);
    CHECK(a->h.opt.step == 2 * n_upd && b.h.opt.step == 2 * n_upd);
    if (o->slot_rows > 0) { /* the splits and evictions, on the device only */
        const double sp = lh_metric(b.metrics[0], "state/device_call_splits"),
                     ev = lh_metric(b.metrics[0], "state/device_evictions");
        fprintf(stderr, "  update 0: %g calls split, %g device slots evicted\n", sp, ev);
        CHECK(ev > 0 && (g_loose ? sp > 0 : sp == 0));
    }
    if (!cuda && !g_loose) {
        CHECK(dw == 0 && dm == 0 && dv == 0 && dl == 0);
        for (int i = 0; i < a->hook.n; i++)
            CHECK_MSG(a->hook.loss[i] == b.hook.loss[i], "minibatch loss %d: %.17g vs %.17g", i,
                      a->hook.loss[i], b.hook.loss[i]);
        metrics_match(a->metrics[0], b.metrics[0], "update 0");
        if (n_upd > 1) metrics_match(a->metrics[1], b.metrics[1], "update 1");
    } else if (!cuda) { /* cpu-device, calls split: the same fp32 terms summed in more parts */
        CHECK(dw <= 1e-3 * step && dl <= 1e-4);
    } else if (o->math && strcmp(o->math, "fp32")) {
        /* bf16 GEMM inputs (learner.device-math bf16; file comment): the forwards' numbers to
         * bf16 rounding, the weights only bounded (AdamW moves an entry by about lr a step
         * whatever its gradient's size, so entries whose gradients are near zero go either way) */
        CHECK(dw <= 2.0 * step && dl <= 0.1);
        static const char *keys[] = {"loss/total", "kl/k3", "policy/entropy"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            const double x = lh_metric(a->metrics[0], keys[i]),
                         y = lh_metric(b.metrics[0], keys[i]);
            CHECK_MSG(fabs(x - y) <= 3e-2 * (1 + fabs(x)), "%s: cpu %.9g, cuda bf16 %.9g", keys[i],
                      x, y);
        }
    } else {
        /* fp32 sums in other orders (tolerances in the file comment) */
        CHECK(dw <= 0.05 * step);
        if (o->sparse_topk > 0) /* a chunk-score near-tie may select another chunk (comment) */
            CHECK(n_far * 200 <= n_all);
        else
            CHECK(dl <= 1e-3);
        /* continuous metrics of the first update (counts such as clip fractions may move by a
         * token) */
        static const char *keys[] = {"loss/total", "kl/k3", "policy/entropy", "grad/norm/mean"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            const double x = lh_metric(a->metrics[0], keys[i]),
                         y = lh_metric(b.metrics[0], keys[i]);
            CHECK_MSG(fabs(x - y) <= 1e-3 * (1 + fabs(x)), "%s: cpu %.9g, cuda %.9g", keys[i], x,
                      y);
        }
    }
    arl_model_params_free(&w0);
    if (a == &own) run_free(&own);
    run_free(&b);
}

static void test_device_matches_cpu(void) {
    lh_opts o = {0};
    compare(&o, 2, "cached states");
}

static void test_device_shared_prefix(void) {
    lh_opts o = {.shared_prefix = 1};
    compare(&o, 2, "shared prefix");
}

/* without a grad hook the device runs AdamW itself (moments kept there for the update) */
static void test_device_adamw(void) {
    lh_opts o = {0};
    g_hook = 0;
    compare(&o, 2, "AdamW on the device");
    g_hook = 1;
}

static void test_device_checkpointing(void) {
    lh_opts o = {.act_checkpoint = 1};
    compare(&o, 1, "activation checkpointing");
}

static void test_device_sparse(void) {
    lh_opts o = {.sparse_topk = 1, .sparse_chunk = 16};
    compare(&o, 1, "block-sparse MLA");
}

/* the device's slots sharing fewer latent rows than max-docs x the context
 * (learner.device-slot-rows): ranges made, grown, moved and freed as the passes go */
static void test_device_shared_rows(void) {
    lh_opts o = {.slot_rows = SHARED_ROWS};
    compare(&o, 1, "shared slot rows");
}

/* fewer shared rows than one forward's documents need: other slots evicted (their states
 * synced to the host, uploaded again when their documents go on), calls made again with fewer
 * documents (the gradient summed in more parts: the CPU's to fp32 rounding, the tolerances of
 * the cuda comparison) */
static void test_device_tight_rows(void) {
    lh_opts o = {.slot_rows = TIGHT_ROWS};
    g_loose = 1;
    compare(&o, 1, "tight shared slot rows");
    g_loose = 0;
}

static void test_device_per_minibatch(void) {
    lh_opts o = {.prefix_per_minibatch = 1};
    compare(&o, 1, "prefix-refresh per_minibatch");
}

/* cuda, learner.device-math bf16: every pass's GEMMs on bf16 inputs, the forwards' weight GEMMs
 * on the bf16 weight copies */
static void test_device_bf16(void) {
    lh_opts o = {.math = "bf16"};
    compare(&o, 1, "bf16 GEMM inputs");
}

/* cuda: the gradient all-reduce over a one-rank NCCL communicator (learner.device-allreduce
 * nccl: the host's gradient through the device and back) trains to the same bits as without */
static void test_device_nccl_one_rank(void) {
    if (!arl_cuda_nccl_available()) {
        fprintf(stderr, "  (this build has no NCCL)\n");
        return;
    }
    lh_opts o = {0}, on = {.allreduce = "nccl"};
    for (g_hook = 1; g_hook >= 0; g_hook--) { /* AdamW on the host, then on the device */
        run a, b;
        run_updates(&a, "cuda", &o, N_UPD);
        run_updates(&b, "cuda", &on, N_UPD);
        const size_t bytes = sizeof(float) * (size_t)a.h.params.inv.arena_floats;
        CHECK(!memcmp(a.h.params.arena, b.h.params.arena, bytes));
        CHECK(!memcmp(a.h.opt.m.arena, b.h.opt.m.arena, bytes));
        run_free(&a);
        run_free(&b);
    }
    g_hook = 1;
}

static void refused(const lh_opts *o, const char *needle) {
    lh_learner h;
    arl_status s = lh_learner_try_open(&h, ckpt, NULL, 2, 6, NULL, o);
    CHECK(s == ARL_ERR_UNSUPPORTED || s == ARL_ERR_ARG || s == ARL_ERR_DEVICE);
    CHECK_MSG(strstr(arl_error_msg(), needle) != NULL, "message: %s", arl_error_msg());
    arl_error_clear();
    lh_learner_close(&h);
}

static void test_device_refusals(void) {
    lh_opts bad = {.device = "tpu"};
    refused(&bad, "device 'tpu'");
    lh_opts nc = {.device = "cpu-device", .allreduce = "nccl"};
    refused(&nc, "device-allreduce nccl needs learner.device cuda");
    lh_opts nm = {.device = "cpu-device", .math = "bf16"};
    refused(&nm, "device-math bf16 needs learner.device cuda");
    lh_opts um = {.device = "cuda", .math = "fp16"};
    refused(&um, "device-math 'fp16'");
    if (arl_cuda_device_count() == 0) { /* sized (block-sparse buffers too), then no GPU found */
        lh_opts nd = {.device = "cuda", .sparse_topk = 2};
        refused(&nd, "no CUDA device");
    }
    /* the option table takes only the three names */
    arl_learner_opts lo;
    L_DIE(arl_learner_opts_defaults(&lo), "defaults");
    size_t n;
    const arl_option *tab = arl_learner_options(&n);
    CHECK(arl_options_set(tab, n, "device", "tpu", &lo) != ARL_OK);
    arl_error_clear();
    CHECK(arl_options_set(tab, n, "device", "cpu-device", &lo) == ARL_OK);
    CHECK_STR_EQ(lo.own.device, "cpu-device");
    CHECK_STR_EQ(lo.own.device_allreduce, "auto");
    CHECK(arl_options_set(tab, n, "device-allreduce", "gloo", &lo) != ARL_OK);
    arl_error_clear();
    CHECK_STR_EQ(lo.own.device_math, "fp32");
    CHECK(arl_options_set(tab, n, "device-math", "bf16", &lo) == ARL_OK);
    CHECK_STR_EQ(lo.own.device_math, "bf16");
    CHECK(arl_options_set(tab, n, "device-math", "fp16", &lo) != ARL_OK);
    arl_error_clear();
    arl_learner_opts_free(&lo);
}

int main(int argc, char **argv) {
    cuda = argc > 1 && !strcmp(argv[1], "cuda");
    if (cuda && arl_cuda_device_count() <= 0) {
        fprintf(stderr, "test_learner_device cuda: no CUDA device (skipped)\n");
        return TEST_SKIP;
    }
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-device"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(ref_ckpt, sizeof ref_ckpt, "%s/ref", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    lh_make_ckpt(ckpt, 3);
    lh_make_ckpt(ref_ckpt, 4);
    lh_rollout(db, ckpt, 4, 3, 0);
    /* four groups: two per update (the learner reads the groups it is given; the ledger is
     * the train driver's) */
    int64_t all[8];
    CHECK_EQ_INT(lh_plan(db, 0, 4, all), 4);
    for (int i = 0; i < 4; i++)
        gids[i / 2][i % 2] = all[i];
    n_gids[0] = n_gids[1] = 2;
    if (!cuda) TEST_RUN(test_device_refusals);
    if (!sanitized) {
        TEST_RUN(test_device_matches_cpu);
        TEST_RUN(test_device_shared_prefix);
        TEST_RUN(test_device_per_minibatch);
        TEST_RUN(test_device_checkpointing);
        TEST_RUN(test_device_sparse);
        TEST_RUN(test_device_shared_rows);
        TEST_RUN(test_device_tight_rows);
    }
    TEST_RUN(test_device_adamw);
    if (cuda) TEST_RUN(test_device_nccl_one_rank);
    if (cuda) TEST_RUN(test_device_bf16);
    for (int k = 0; k < N_UPD; k++)
        if (g_cpu_plain_made[k]) run_free(&g_cpu_plain[k]);
    return test_finish();
}
