/* bench/train/bench_train.c: where the time of an RL step goes, and the learner's cost over the
 * bare model, measured in the same run on the same checkpoint and segments.
 *
 *   step     one synchronous step of `agentrl train`: a rollout of B calculator tasks x G
 *            samples with the tiny model into a replay store, then one learner update over
 *            them (learner/update.h); the share of the step in rollout and in learning.
 *   learner  tokens/s of the update (load, pi_old pass, reference pass, advantages and masks,
 *            forward + backward with the loss, AdamW, QB, controller, metrics) against the bare
 *            model on the same segments through the same entry points: two forwards
 *            (arl_model_forward_state from fresh slots with the stored routes forced, as the
 *            pi_old and reference passes) plus one training step (arl_model_train_forward +
 *            arl_model_backward + arl_adamw_step) over the same packed documents.  Target:
 *            overhead <= 15 %.  Also the gradient phase alone against the bare training step.
 *
 * Rates use process CPU time (--threads 1 by default: on a shared machine wall time mostly
 * measures the neighbours); the learner repeats are interleaved with the bare ones; medians.
 * --device cuda|cpu-device: the learner on that device (learner.device, learner/device.c)
 * against the bare device model through the same entry points (arl_model_dev_forward_state
 * twice, arl_model_dev_train_forward_state + arl_model_dev_backward, the gradients copied to the
 * host for AdamW as the learner does), in wall time (a GPU's time is not the process's CPU
 * time); the rollout stays on the CPU.
 *
 * Ratios are bare time over learner time (1.0: no overhead; the overhead is their inverse
 * minus 1).  The run's checkpoint and replay store live in a temporary directory ($TMPDIR or
 * /tmp), removed at exit and on SIGINT/SIGTERM.
 *
 * Usage: bench_train [--tasks B] [--group G] [--reps R] [--threads N] [--device D] (--help)
 * Exit status: 0 done (whatever the ratios), 1 failure, 2 usage error. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "bench/common/tmpdir.h"
#include "core/options.h"
#include "kernels/backend.h"
#include "kernels/threadpool.h"
#include "learner/kl_ctl.h"
#include "learner/ledger.h"
#include "learner/update.h"
#include "policy/checkpoint.h"
#include "policy/model.h"
#include "policy/model_backward.h"
#include "policy/model_device_backward.h"
#include "replay/replay.h"
#include "rollout/rollout.h"

#define DIE(s, what)                                                                               \
    do {                                                                                           \
        arl_status s_ = (s);                                                                       \
        if (s_) {                                                                                  \
            fprintf(stderr, "bench_train: %s: %s\n", what, arl_error_msg());                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int g_wall; /* time in wall seconds (a device run), else process CPU seconds */

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(g_wall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double metric(const char *json, const char *name) {
    json_t *j = json_loads(json, 0, NULL);
    json_t *v = json_object_get(j, name);
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    json_decref(j);
    return x;
}

/* A learner over the checkpoint with the objective's defaults, M = 1. */
typedef struct lrn {
    arl_model_config cfg;
    arl_model_params params, ref;
    arl_adamw opt;
    arl_optim_config oc;
    arl_klctl kl;
    arl_reward_config rc;
    arl_loss_config lossc;
    arl_learner_config lc;
    arl_learner *l;
} lrn;

static void lrn_open(lrn *h, const char *ckpt, int64_t n_traj, int shared_prefix,
                     const char *device) {
    memset(h, 0, sizeof *h);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", ckpt);
    DIE(arl_model_config_read(p, &h->cfg), "config");
    DIE(arl_model_params_alloc(&h->params, &h->cfg), "params");
    DIE(arl_model_params_alloc(&h->ref, &h->cfg), "ref");
    DIE(arl_checkpoint_load(ckpt, &h->cfg, &h->params), "load");
    DIE(arl_checkpoint_load(ckpt, &h->cfg, &h->ref), "load");
    arl_optim_config_defaults(&h->oc);
    h->oc.lr = 1e-6;
    DIE(arl_adamw_init(&h->opt, &h->cfg, &h->oc), "adamw");
    arl_kl_config kc;
    arl_kl_config_default(&kc);
    DIE(arl_klctl_init(&h->kl, &kc), "kl");
    arl_reward_config_default(&h->rc);
    arl_loss_config_default(&h->lossc);
    h->lc = (arl_learner_config){.minibatches = 1,
                                 .max_tokens = 4096,
                                 .max_docs = 64,
                                 .routing_replay = 1,
                                 .ref_routing_replay = 1,
                                 .state_cache_bytes = 1 << 30,
                                 .drift_sample = 0.01,
                                 .seed = 1,
                                 .n_traj_per_update = n_traj,
                                 .segment_tokens = 4096,
                                 .shared_prefix = shared_prefix,
                                 .shared_prefix_min = 64};
    snprintf(h->lc.device, sizeof h->lc.device, "%s", device);
    arl_learner_init in = {.cfg = &h->cfg,
                           .params = &h->params,
                           .ref_params = &h->ref,
                           .opt = &h->opt,
                           .kl = &h->kl,
                           .reward = &h->rc,
                           .loss = &h->lossc,
                           .lc = &h->lc,
                           .dist = NULL};
    DIE(arl_learner_create(&h->l, &in), "learner");
}

static void lrn_close(lrn *h) {
    arl_learner_free(h->l);
    arl_adamw_free(&h->opt);
    arl_optim_config_free(&h->oc);
    arl_model_params_free(&h->params);
    arl_model_params_free(&h->ref);
    arl_model_config_free(&h->cfg);
}

/* The bare model over the segments of the last update: 2 forwards + 1 training step; on a
 * device (ops set) the device model with 64 slots and its training step. */
typedef struct bare {
    arl_model m;
    arl_decode_state st;
    int32_t slots[64];
    arl_model_train tr;
    arl_model_params grads;
    const arl_dev_ops *ops;
    arl_model_dev md;
    arl_model_dev_train mdt;
    int32_t *tok, *tgt, *cu, *forced;
    float *lp, *dlogp;
} bare;

/* One pack of documents through the bare model: a forward from fresh slots (pass 0, 1) or the
 * training forward and backward (pass 2). */
static void bare_pack(bare *x, const arl_batch *bt, int32_t nd, int pass) {
    arl_forward_out fo = {.logprobs = x->lp};
    for (int64_t p = 0; p < bt->T; p++)
        x->dlogp[p] = -1e-4f;
    if (x->ops) {
        for (int32_t q = 0; q < nd; q++) {
            x->slots[q] = q;
            DIE(arl_model_dev_slot_reset(&x->md, q), "slot reset");
        }
        if (pass < 2) {
            DIE(arl_model_dev_forward_state(&x->md, x->slots, bt, &fo), "bare device forward");
        } else {
            DIE(arl_model_dev_train_forward_state(&x->mdt, bt, x->slots, &fo),
                "bare device train forward");
            DIE(arl_model_dev_backward(&x->mdt, bt, x->dlogp), "bare device backward");
        }
        return;
    }
    /* the learner's entry points: documents continue (fresh) decode-state slots, so that the
     * state after each segment is there for the segment that follows it */
    for (int32_t q = 0; q < nd; q++)
        DIE(arl_decode_state_join(&x->st, &x->slots[q]), "join");
    if (pass < 2) {
        DIE(arl_model_forward_state(&x->m, &x->st, x->slots, bt, &fo), "bare forward");
    } else {
        DIE(arl_model_train_forward(&x->tr, bt, &x->st, x->slots, &fo), "bare train forward");
        DIE(arl_model_backward(&x->tr, bt, x->dlogp, &x->grads, NULL, NULL), "bare backward");
    }
    for (int32_t q = 0; q < nd; q++)
        arl_decode_state_leave(&x->st, x->slots[q]);
}

static void bare_run(bare *x, lrn *h, const arl_update_batch *b, double *t_fwd2, double *t_train) {
    const int64_t Tm = 4096, nm = h->cfg.dims.n_moe, k = h->cfg.dims.k;
    double tf = 0, tt = 0;
    for (int pass = 0; pass < 3; pass++) {
        const double c0 = cpu_s();
        if (pass == 2) memset(x->grads.arena, 0, sizeof(float) * (size_t)x->grads.inv.arena_floats);
        if (x->ops && pass == 0) DIE(arl_model_dev_set_params(&x->md, &h->params), "weights");
        if (x->ops && pass == 2) DIE(arl_model_dev_zero_grad(&x->mdt), "zero grad");
        int32_t i = 0;
        if (pass == 0) {
            int32_t nr = 0;
            for (int32_t q = 0; q < b->n_segs; q++) nr += b->segs[q].routes == NULL;
            if (nr) fprintf(stderr, "bench_train: %d of %d segments without routes\n", nr, b->n_segs);
        }
        while (i < b->n_segs) {
            /* pack whole segments as the learner does: at most Tm tokens, 64 documents */
            int64_t T = 0;
            int32_t nd = 0, j = i;
            while (j < b->n_segs && nd < 64 && T + b->segs[j].n_fed <= Tm) {
                T += b->segs[j].n_fed;
                nd++;
                j++;
            }
            if (nd == 0) break;
            int64_t off = 0;
            x->cu[0] = 0;
            for (int32_t q = i; q < j; q++) {
                const arl_upd_seg *s = &b->segs[q];
                for (int64_t p = 0; p < s->n_fed; p++) {
                    x->tok[off + p] = s->tokens[p];
                    x->tgt[off + p] = p + 1 < s->T ? s->tokens[p + 1] : -1;
                }
                off += s->n_fed;
                x->cu[q - i + 1] = (int32_t)off;
            }
            off = 0;
            for (int32_t q = i; q < j; q++) {
                const arl_upd_seg *s = &b->segs[q];
                for (int64_t l = 0; l < nm && s->routes; l++)
                    memcpy(x->forced + (l * T + off) * k, s->routes + l * s->T * k,
                           sizeof(int32_t) * (size_t)(s->n_fed * k));
                off += s->n_fed;
            }
            int all_routes = 1;
            for (int32_t q = i; q < j; q++) all_routes &= b->segs[q].routes != NULL;
            arl_batch bt = {.tokens = x->tok,
                            .T = T,
                            .cu = x->cu,
                            .N = nd,
                            .targets = x->tgt,
                            .forced_routes = all_routes ? x->forced : NULL};
            bare_pack(x, &bt, nd, pass);
            i = j;
        }
        if (pass == 2) {
            if (x->ops) DIE(arl_model_dev_grads_download(&x->mdt, x->grads.arena), "grads");
            arl_optim_report rep;
            DIE(arl_adamw_step(&h->opt, &h->params, x->grads.arena, &rep), "bare adamw");
        }
        const double dt = cpu_s() - c0;
        if (pass < 2)
            tf += dt;
        else
            tt += dt;
    }
    *t_fwd2 = tf;
    *t_train = tt;
}

typedef struct topts {
    int64_t tasks, group, reps, threads;
    char *device;
    char *config;
} topts;

static const arl_option OPTS[] = {
    {"tasks", ARL_OPT_INT, offsetof(topts, tasks), "4", "calculator tasks of the rollout (B)", 1,
     64, NULL, 0, "B"},
    {"group", ARL_OPT_INT, offsetof(topts, group), "4", "samples per task (G)", 1, 16, NULL, 0,
     "G"},
    {"reps", ARL_OPT_INT, offsetof(topts, reps), "3",
     "learner updates timed, each against the bare model (medians)", 1, 64, NULL, 0, "R"},
    {"threads", ARL_OPT_INT, offsetof(topts, threads), "1",
     "threads of the kernels' pool and the rollout", 1, 256, NULL, 0, "N"},
    {"device", ARL_OPT_CHOICE, offsetof(topts, device), "cpu",
     "where the learner and the bare model run (cuda: a GPU; cpu-device: the device code path "
     "on the CPU); times are then wall times",
     0, 0, "cpu|cuda|cpu-device", 0, NULL},
    {"config", ARL_OPT_STRING, offsetof(topts, config), "",
     "model config of the seeded checkpoint (empty: configs/tiny/config.json of the source tree, "
     "the working directory or $ARL_SOURCE_DIR)",
     0, 0, NULL, 0, "FILE"},
};

/* The tiny config: --config, else the source tree's, the working directory's or
 * $ARL_SOURCE_DIR's configs/tiny/config.json. */
static arl_status read_config(const char *given, arl_model_config *cfg) {
    if (given[0]) return arl_model_config_read(given, cfg);
    const char *cands[] = {ARL_BENCH_SOURCE_DIR "/configs/tiny/config.json",
                           "configs/tiny/config.json", "../configs/tiny/config.json",
                           "../../configs/tiny/config.json"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
        if (access(cands[i], R_OK) == 0) return arl_model_config_read(cands[i], cfg);
    if (getenv("ARL_SOURCE_DIR")) {
        char p[700];
        snprintf(p, sizeof p, "%s/configs/tiny/config.json", getenv("ARL_SOURCE_DIR"));
        return arl_model_config_read(p, cfg);
    }
    return arl_errorf(ARL_ERR_NOT_FOUND,
                      "configs/tiny/config.json not found (run from the repository root, set "
                      "ARL_SOURCE_DIR or give --config)");
}

int main(int argc, char **argv) {
    topts o;
    const char *summary = "the rollout/learning split of one synchronous RL step, and the "
                          "learner's tokens/s against the bare model on the same segments, in "
                          "the same run (ratio: bare time / learner time, < 1: the learner's "
                          "overhead)";
    int parsed =
        bench_options_parse("bench_train", summary, OPTS, ARL_OPTIONS_COUNT(OPTS), argc, argv, &o);
    if (parsed >= 0) return parsed;
    const int64_t B = o.tasks, G = o.group, reps = o.reps, threads = o.threads;
    const char *device = o.device;
    g_wall = strcmp(device, "cpu") != 0;
    if (!strcmp(device, "cuda")) { /* before the CPU rollout: exit 77 (skipped) without a GPU */
        const arl_k_backend *be;
        arl_status s = arl_k_backend_get("cuda", &be);
        if (s) {
            fprintf(stderr, "bench_train: %s\n", arl_error_msg());
            return s == ARL_ERR_DEVICE ? 77 : 1;
        }
    }
    DIE(arl_k_threads_init((int)threads), "threads");
    const char *tmp = bench_tmpdir_create("bench_train", 4);
    if (!tmp) return 1;
    char ckpt[600], db[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    {
        arl_model_config cfg;
        DIE(read_config(o.config, &cfg), "model config");
        arl_model_params p;
        DIE(arl_model_params_alloc(&p, &cfg), "params");
        DIE(arl_params_init(&p, &cfg, 3, 1), "init");
        DIE(arl_checkpoint_save(ckpt, &cfg, &p, 0), "save");
        arl_model_params_free(&p);
        arl_model_config_free(&cfg);
    }
    /* ---- the step: rollout then update ---- */
    arl_rollout_config c;
    DIE(arl_rollout_config_defaults(&c), "defaults");
    DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "env", "builtin:calculator",
                        &c),
        "env");
    DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "task-data", "{\"level\": 1}",
                        &c),
        "data");
    DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "run-uid", "bench", &c), "uid");
    c.tasks = B;
    c.group_size = G;
    c.turn_tokens = 48;
    c.observation_tokens = 512;
    c.segment_tokens = 4096;
    c.context_tokens = 4096;
    c.trajectory_tokens = 4096;
    c.max_turns = 3;
    c.batch_size = 16;
    c.prefill_chunk = 2048;
    c.progress_s = 0;
    c.threads = threads;
    replay_open_opts ro = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    DIE(replay_store_open(db, &ro, &st), "store");
    arl_rollout_worker *w;
    double c0 = cpu_s();
    DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "worker");
    DIE(arl_rollout_worker_run(w), "rollout");
    const double t_roll = cpu_s() - c0;
    arl_rollout_worker_close(w);
    arl_rollout_config_free(&c);
    int64_t gids[256], ng = 0;
    {
        arl_ledger *led;
        int64_t run_id;
        DIE(arl_ledger_open(db, &led), "ledger");
        DIE(arl_ledger_run_id(led, "bench", &run_id), "run");
        DIE(arl_ledger_groups(led, run_id, "train", gids, 256, &ng), "groups");
        arl_ledger_close(led);
    }
    arl_update_source src = {.store = st, .root = db, .group_ids = gids, .n_groups = ng};
    lrn h, hs;
    lrn_open(&h, ckpt, B * G, 0, device);
    lrn_open(&hs, ckpt, B * G, 1, device); /* the same with the shared prompt prefix */
    bare x;
    memset(&x, 0, sizeof x);
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = 4096;
    mo.max_docs = 64;
    DIE(arl_model_init(&x.m, &h.cfg, &h.params, &mo), "model");
    DIE(arl_model_train_init(&x.tr, &x.m, NULL, NULL), "train");
    DIE(arl_decode_state_init(&x.st, &h.cfg, 64, x.m.opts.max_context), "state");
    DIE(arl_model_params_alloc(&x.grads, &h.cfg), "grads");
    if (g_wall) {
        const int cuda = !strcmp(device, "cuda");
        arl_model_dev_opts dopts = {.n_slots = 64};
        size_t bytes = 0;
        if (cuda) {
            arl_model_dev plan;
            DIE(arl_model_dev_plan(&plan, arl_dev_ops_cuda(), &h.cfg, &x.m.opts, &dopts), "plan");
            bytes = (size_t)(arl_model_dev_bytes(&h.cfg, &x.m.opts, arl_dev_ops_cuda(), &dopts) +
                             arl_model_dev_train_bytes(&plan)) +
                    ((size_t)64 << 20);
        }
        DIE(arl_dev_ops_get(cuda ? "cuda" : "cpu", bytes, &x.ops), "device");
        DIE(arl_model_dev_init(&x.md, x.ops, &h.cfg, &h.params, &x.m.opts, &dopts), "device model");
        DIE(arl_model_dev_train_init(&x.mdt, &x.md, &h.oc), "device training");
    }
    const int64_t nm = h.cfg.dims.n_moe ? h.cfg.dims.n_moe : 1;
    x.tok = malloc(4 * 4096);
    x.tgt = malloc(4 * 4096);
    x.cu = malloc(4 * 65);
    x.forced = malloc(sizeof(int32_t) * (size_t)(nm * 4096 * h.cfg.dims.k));
    x.lp = malloc(4 * 4096);
    x.dlogp = malloc(4 * 4096);
    double tu[64], tg[64], tb[64], tbt[64], ts[64], saved = 0;
    int64_t tokens = 0;
    double t_learn_first = 0;
    for (int64_t r = 0; r < reps; r++) {
        arl_update_result res;
        c0 = cpu_s();
        DIE(arl_learner_update(h.l, r, &src, 1, &res), "update");
        tu[r] = cpu_s() - c0;
        if (r == 0) t_learn_first = tu[r];
        /* the gradient phase's share of the update's wall time, applied to its CPU time */
        const double grad_s = metric(res.metrics_json, "time/grad_s"),
                     update_s = metric(res.metrics_json, "time/update_s");
        if (!(update_s > 0 && grad_s >= 0)) {
            fprintf(stderr, "bench_train: the update's metrics lack time/grad_s or "
                            "time/update_s: no gradient-phase share\n");
            return 1;
        }
        tg[r] = tu[r] * grad_s / update_s;
        tokens = res.tokens;
        if (getenv("ARL_BENCH_VERBOSE"))
            fprintf(stderr, "  update %lld: wall load %.2f, pi_old %.2f, ref %.2f, grad %.2f, total %.2f s\n",
                    (long long)r, metric(res.metrics_json, "time/load_s"),
                    metric(res.metrics_json, "time/pi_old_pass_s"),
                    metric(res.metrics_json, "time/ref_pass_s"), metric(res.metrics_json, "time/grad_s"),
                    metric(res.metrics_json, "time/update_s"));
        free(res.metrics_json);
        c0 = cpu_s();
        DIE(arl_learner_update(hs.l, r, &src, 1, &res), "update (shared prefix)");
        ts[r] = cpu_s() - c0;
        saved = metric(res.metrics_json, "state/shared_prefix_saved_tokens");
        free(res.metrics_json);
        double f2, tt;
        bare_run(&x, &h, arl_learner_batch(h.l), &f2, &tt);
        tb[r] = f2 + tt;
        tbt[r] = tt;
    }
    const double ms = median(ts, (int)reps);
    const double mu = median(tu, (int)reps), mg = median(tg, (int)reps), mb = median(tb, (int)reps),
                 mbt = median(tbt, (int)reps);
    printf(
        "bench_train: tiny model, calculator level 1, %lld tasks x %lld samples, %lld tokens per "
        "update, %lld thread(s), learner on %s, %s time, median of %lld\n",
        (long long)B, (long long)G, (long long)tokens, (long long)threads, device,
        g_wall ? "wall" : "CPU", (long long)reps);
    printf(
        "  step: rollout %.2f s, learning %.2f s: rollout %.0f %%, learning %.0f %% of the step\n",
        t_roll, t_learn_first, 100 * t_roll / (t_roll + t_learn_first),
        100 * t_learn_first / (t_roll + t_learn_first));
    printf("  learner update:   %8.0f tokens/s; bare 2 forwards + train step %8.0f tokens/s: "
           "bare/learner time %.3f (overhead %+.1f %%, target <= 15 %%)\n",
           tokens / mu, tokens / mb, mb / mu, 100 * (mu / mb - 1));
    printf("  gradient phase:   %8.0f tokens/s; bare train step            %8.0f tokens/s: "
           "bare/learner time %.3f (overhead %+.1f %%)\n",
           tokens / mg, tokens / mbt, mbt / mg, 100 * (mg / mbt - 1));
    printf("  shared prefix:    %8.0f tokens/s (learner option shared-prefix, %.0f tokens per "
           "pass not fed again): %.2fx the update without it\n",
           tokens / ms, saved, mu / ms);
    free(x.tok);
    free(x.tgt);
    free(x.cu);
    free(x.forced);
    free(x.lp);
    free(x.dlogp);
    arl_model_params_free(&x.grads);
    if (x.ops) {
        arl_model_dev_train_free(&x.mdt);
        arl_model_dev_free(&x.md);
    }
    arl_decode_state_free(&x.st);
    arl_model_train_free(&x.tr);
    arl_model_free(&x.m);
    lrn_close(&h);
    lrn_close(&hs);
    replay_store_close(st);
    arl_options_free(OPTS, ARL_OPTIONS_COUNT(OPTS), &o);
    return 0;
}
