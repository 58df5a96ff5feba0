/* tests/learner/lhelpers.h: what the learner tests share (header-only) - a seeded tiny
 * checkpoint, a rollout of the calculator environment into a new store with short turns and
 * segments (so that continue segments happen), and a learner over it with the objective's
 * defaults. */
#ifndef ARL_TESTS_LEARNER_LHELPERS_H
#define ARL_TESTS_LEARNER_LHELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "learner/kl_ctl.h"
#include "learner/ledger.h"
#include "learner/loss.h"
#include "learner/update.h"
#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/optimizer.h"
#include "policy/params.h"
#include "replay/replay.h"
#include "reward/reward.h"
#include "rollout/rollout.h"
#include "tests/test.h"

#define L_DIE(s, what)                                                                             \
    do {                                                                                           \
        arl_status s_ = (s);                                                                       \
        if (s_ != ARL_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, what, arl_error_msg());         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline void lh_make_ckpt(const char *dir, uint64_t seed) {
    arl_model_config cfg;
    L_DIE(arl_model_config_read(test_src_path("configs/tiny/config.json"), &cfg), "config");
    arl_model_params p;
    L_DIE(arl_model_params_alloc(&p, &cfg), "params");
    L_DIE(arl_params_init(&p, &cfg, seed, 1), "init");
    L_DIE(arl_checkpoint_save(dir, &cfg, &p, 0), "save");
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
}

/* The rollout configuration of `tasks` calculator tasks x G (run uid "lt").  Short turns and a
 * segment budget just above the initial context: every trajectory has continue segments.
 * Block-sparse MLA with k_c = sparse_topk chunks of sparse_chunk (0: dense). */
static inline void lh_rollout_cfg(arl_rollout_config *cfg, int64_t tasks, int64_t G,
                                  int64_t task_seed, int64_t sparse_topk, int64_t sparse_chunk) {
    arl_rollout_config c;
    L_DIE(arl_rollout_config_defaults(&c), "defaults");
    L_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "env", "builtin:calculator",
                          &c),
          "env");
    L_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "run-uid", "lt", &c), "uid");
    c.tasks = tasks;
    c.task_seed = task_seed;
    c.group_size = G;
    c.turn_tokens = 16;
    c.observation_tokens = 256;
    c.segment_tokens = 600;
    c.context_tokens = 4096;
    c.trajectory_tokens = 4096;
    c.max_turns = 3;
    c.batch_size = 8;
    c.prefill_chunk = 1024;
    c.progress_s = 0;
    c.seed = 11;
    c.mla_sparse_topk = sparse_topk;
    if (sparse_chunk > 0) c.mla_sparse_chunk = sparse_chunk;
    *cfg = c;
}

/* Roll out `tasks` calculator tasks x G into a new store at db with lh_rollout_cfg's
 * configuration. */
static inline void lh_rollout_mla(const char *db, const char *ckpt, int64_t tasks, int64_t G,
                                  int64_t task_seed, int64_t sparse_topk, int64_t sparse_chunk) {
    arl_rollout_config c;
    lh_rollout_cfg(&c, tasks, G, task_seed, sparse_topk, sparse_chunk);
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    L_DIE(replay_store_open(db, &o, &st), "store");
    arl_rollout_worker *w;
    L_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "worker open");
    L_DIE(arl_rollout_worker_run(w), "worker run");
    arl_rollout_worker_close(w);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static inline void lh_rollout(const char *db, const char *ckpt, int64_t tasks, int64_t G,
                              int64_t task_seed) {
    lh_rollout_mla(db, ckpt, tasks, G, task_seed, 0, 0);
}

/* A learner over a tiny checkpoint with the objective's defaults except M and a large lr (so
 * that one step moves the weights visibly). */
typedef struct lh_learner {
    arl_model_config cfg;
    arl_model_params params, ref;
    arl_adamw opt;
    arl_optim_config oc;
    arl_klctl kl;
    arl_reward_config rc;
    arl_loss_config lossc;
    arl_learner_config lc;
    arl_learner *l;
} lh_learner;

/* Learner settings beyond the defaults of lh_learner_open (zero: the default). */
typedef struct lh_opts {
    int shared_prefix;        /* learner option shared-prefix, with shared-prefix-min 64 */
    const char *device;       /* learner.device (NULL: cpu) */
    const char *allreduce;    /* learner.device-allreduce (NULL: auto) */
    const char *math;         /* learner.device-math (NULL: fp32) */
    int64_t slot_rows;        /* learner.device-slot-rows (0: each slot the whole context) */
    int prefix_per_minibatch; /* prefix-refresh per_minibatch */
    int act_checkpoint;       /* activation-checkpointing */
    int64_t sparse_topk;      /* block-sparse MLA k_c */
    int64_t sparse_chunk;     /* its chunk length (0: 64) */
    int keep_states;          /* keep-states: ARL_LEARNER_KEEP_* (0: off) */
    int natural_routing;      /* routing-replay false (0: the stored routes) */
} lh_opts;

/* lh_learner_open with the settings of o; the status of arl_learner_create (h is to be closed
 * either way). */
static inline arl_status lh_learner_try_open(lh_learner *h, const char *ckpt, const char *ref_ckpt,
                                             int32_t minibatches, int64_t n_traj, arl_dist *dist,
                                             const lh_opts *o) {
    memset(h, 0, sizeof *h);
    char cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", ckpt);
    L_DIE(arl_model_config_read(cfgp, &h->cfg), "config");
    L_DIE(arl_model_params_alloc(&h->params, &h->cfg), "params");
    L_DIE(arl_model_params_alloc(&h->ref, &h->cfg), "ref");
    L_DIE(arl_checkpoint_load(ckpt, &h->cfg, &h->params), "load");
    L_DIE(arl_checkpoint_load(ref_ckpt ? ref_ckpt : ckpt, &h->cfg, &h->ref), "load ref");
    arl_optim_config_defaults(&h->oc);
    h->oc.lr = 1e-3;
    h->oc.min_lr_ratio = 1.0;
    L_DIE(arl_adamw_init(&h->opt, &h->cfg, &h->oc), "adamw");
    arl_kl_config kc;
    arl_kl_config_default(&kc);
    L_DIE(arl_klctl_init(&h->kl, &kc), "kl");
    arl_reward_config_default(&h->rc);
    arl_loss_config_default(&h->lossc);
    h->lc.minibatches = minibatches;
    h->lc.max_tokens = 1024;
    h->lc.max_docs = 16;
    h->lc.routing_replay = !o->natural_routing;
    h->lc.ref_routing_replay = !o->natural_routing;
    h->lc.state_cache_bytes = 1 << 30;
    h->lc.drift_sample = 1.0;
    h->lc.seed = 5;
    h->lc.n_traj_per_update = n_traj;
    h->lc.segment_tokens = 600;
    h->lc.shared_prefix = o->shared_prefix;
    h->lc.shared_prefix_min = 64;
    snprintf(h->lc.device, sizeof h->lc.device, "%s", o->device ? o->device : "cpu");
    snprintf(h->lc.device_allreduce, sizeof h->lc.device_allreduce, "%s",
             o->allreduce ? o->allreduce : "auto");
    snprintf(h->lc.device_math, sizeof h->lc.device_math, "%s", o->math ? o->math : "fp32");
    h->lc.device_slot_rows = o->slot_rows;
    h->lc.prefix_per_minibatch = o->prefix_per_minibatch;
    h->lc.act_checkpoint = o->act_checkpoint;
    h->lc.mla_sparse_topk = o->sparse_topk;
    h->lc.mla_sparse_chunk = o->sparse_topk <= 0 ? 0 : o->sparse_chunk > 0 ? o->sparse_chunk : 64;
    h->lc.keep_states = o->keep_states;
    arl_learner_init in = {.cfg = &h->cfg,
                           .params = &h->params,
                           .ref_params = &h->ref,
                           .opt = &h->opt,
                           .kl = &h->kl,
                           .reward = &h->rc,
                           .loss = &h->lossc,
                           .lc = &h->lc,
                           .dist = dist};
    return arl_learner_create(&h->l, &in);
}

/* ref_ckpt: the reference's weights (NULL: the policy's own).  shared_prefix: the learner
 * option shared-prefix (learner/update.h), with shared-prefix-min 64. */
static inline void lh_learner_open_px(lh_learner *h, const char *ckpt, const char *ref_ckpt,
                                      int32_t minibatches, int64_t n_traj, arl_dist *dist,
                                      int shared_prefix) {
    lh_opts o = {.shared_prefix = shared_prefix};
    L_DIE(lh_learner_try_open(h, ckpt, ref_ckpt, minibatches, n_traj, dist, &o), "learner");
}

static inline void lh_learner_open(lh_learner *h, const char *ckpt, const char *ref_ckpt,
                                   int32_t minibatches, int64_t n_traj, arl_dist *dist) {
    lh_learner_open_px(h, ckpt, ref_ckpt, minibatches, n_traj, dist, 0);
}

static inline void lh_learner_close(lh_learner *h) {
    arl_learner_free(h->l);
    arl_adamw_free(&h->opt);
    arl_optim_config_free(&h->oc);
    arl_model_params_free(&h->params);
    arl_model_params_free(&h->ref);
    arl_model_config_free(&h->cfg);
}

/* Plan update n over the final groups of run "lt" (at most max_groups), through the replay
 * store's consumption ledger (replay/replay.h replay_update_plan). */
static inline int64_t lh_plan(const char *db, int64_t n, int64_t max_groups, int64_t *ids) {
    replay_store *st;
    replay_open_opts oo = {0};
    L_DIE(replay_store_open(db, &oo, &st), "store");
    int64_t run_id;
    L_DIE(replay_run_find(st, "lt", &run_id), "run id");
    int64_t *g = NULL;
    size_t ng = 0;
    L_DIE(replay_update_plan(st, run_id, n, "train", (int32_t)max_groups, &g, &ng), "plan");
    for (size_t i = 0; i < ng && i < 256; i++)
        ids[i] = g[i];
    free(g);
    replay_store_close(st);
    return (int64_t)ng;
}

/* A metric of a metrics JSON object (NaN when absent). */
#include <jansson.h>
static inline double lh_metric(const char *json, const char *name) {
    json_t *j = json_loads(json, 0, NULL);
    json_t *v = j ? json_object_get(j, name) : NULL;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    json_decref(j);
    return x;
}

#endif
