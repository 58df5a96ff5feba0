/* learner/update.c: the options of the "learner" section, the learner's memory, and one update
 * in the order of learner/update.h (load, pi_old, reference, advantages, masks, minibatch steps,
 * controller, metrics).  The passes are learner/passes.c, the loading learner/batch.c. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "core/rng.h"
#include "learner/update_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* options                                                                                      */

#define OWN(x) (offsetof(arl_learner_opts, own) + offsetof(arl_learner_own_opts, x))
static const arl_option own_tab[] = {
    {"minibatches", ARL_OPT_INT, OWN(minibatches), "4",
     "M: optimizer steps per update (segments dealt by action tokens)", 1, 1e6, NULL, 0, "M"},
    {"max-tokens", ARL_OPT_INT, OWN(max_tokens), "4096",
     "tokens per learner forward (longer segments are fed in pieces)", 16, 1 << 24, NULL, 0, "N"},
    {"max-docs", ARL_OPT_INT, OWN(max_docs), "64",
     "segments per learner forward (and decode-state slots)", 1, 4096, NULL, 0, "N"},
    {"routing-replay", ARL_OPT_BOOL, OWN(routing_replay), "true",
     "replay the rollout's MoE routes in every learner pass (spec/objective.md 11.2)", 0, 0, NULL,
     0, NULL},
    {"ref-routing", ARL_OPT_CHOICE, OWN(ref_routing), "replay",
     "routes of the reference pass: the stored ones, or the reference router's own", 0, 0,
     "replay|natural", 0, NULL},
    {"prefix-refresh", ARL_OPT_CHOICE, OWN(prefix_refresh), "per_update",
     "start states of minibatches 2..M: from the pi_old pass, or recomputed at the current "
     "weights",
     0, 0, "per_update|per_minibatch", 0, NULL},
    {"activation-checkpointing", ARL_OPT_BOOL, OWN(act_checkpoint), "false",
     "keep only layer inputs and recompute the rest in the backward (less memory)", 0, 0, NULL, 0,
     NULL},
    {"state-cache-mb", ARL_OPT_FLOAT, OWN(state_cache_mb), "1024",
     "memory for boundary states between the pi_old pass and the gradient pass (misses are "
     "recomputed)",
     0, 1e9, NULL, 0, "MB"},
    {"prefix-drift-sample", ARL_OPT_FLOAT, OWN(drift_sample), "0.01",
     "fraction of continue segments of the last minibatch measured for state/prefix_drift", 0, 1,
     NULL, 0, "F"},
    {"records", ARL_OPT_BOOL, OWN(records), "true",
     "write the learner_records of spec/replay.md 4.13 into a learner file of each update's "
     "store: per consumed segment the pi_old and reference log-probabilities, IS weights, loss "
     "flags and advantages of its tokens and the advantage terms of its turns (`replay show "
     "--tokens`, `replay export --learner`)",
     0, 0, NULL, 0, NULL},
    {"keep-states", ARL_OPT_CHOICE, OWN(keep_states), "off",
     "state_cache.learner (spec/replay.md 9.3): keep the pi_old pass's segment-end states of "
     "no trajectory (off), of the pinned ones (pinned) or of all (all) in the learner file of "
     "each update's store; `replay rescore` of a checkpoint with these weights (and forks, with "
     "routing natural) start from them; `replay gc --learner` keeps or evicts them later",
     0, 0, "off|pinned|all", 0, NULL},
    {"state-budget-bytes", ARL_OPT_INT, OWN(state_budget_bytes), "274877906944",
     "keep-states: state_cache.budget_bytes of this learner's states file in each update's "
     "store (spec/replay.md 9.3; default 256 GiB): beyond it, the file's GC evicts complete, "
     "unpinned states, least recently used first (0: no budget). The GC (spec/replay.md 7.6) "
     "runs when the learner opens the file and after an update once state-gc-interval-s have "
     "passed; it also deletes stale unfinished states and unreferenced ones over an hour old. "
     "Not part of a run's identity (a resume may change it)",
     0, 9007199254740991.0, NULL, 0, "BYTES"},
    {"state-gc-interval-s", ARL_OPT_INT, OWN(state_gc_interval_s), "600",
     "keep-states: seconds between the GC passes over this learner's states file: at its open "
     "before an update, then after the update once this much has passed since (0: after every "
     "update); not part of a run's identity",
     0, 9007199254740991.0, NULL, 0, "S"},
    {"shared-prefix", ARL_OPT_BOOL, OWN(shared_prefix), "false",
     "compute the prompt prefix that the update's trajectories share (tool declarations, system "
     "text) once per pass and weight set, and start each trajectory from its state; no gradient "
     "flows into the prefix's state (a start state like a segment boundary's cached state, "
     "spec/objective.md 10.1), so the gradient differs from whole-trajectory training by the "
     "terms through the prefix's keys, values and recurrent state",
     0, 0, NULL, 0, NULL},
    {"shared-prefix-min", ARL_OPT_INT, OWN(shared_prefix_min), "64",
     "fewest tokens a shared prefix must have to be used", 1, 1 << 30, NULL, 0, "N"},
    {"device", ARL_OPT_CHOICE, OWN(device), "cpu",
     "where the learner's passes run: cpu (policy/model.h, the reference), cuda "
     "(policy/model_device.h on the GPU of the local MPI rank: the forwards, the training "
     "forward and backward, AdamW; the "
     "weights copied to the host after each step; image rows encoded on the CPU; block-sparse "
     "MLA too), "
     "or cpu-device (the device code over host memory, bit-identical to cpu: for tests)",
     0, 0, "cpu|cuda|cpu-device", 0, NULL},
    {"device-allreduce", ARL_OPT_CHOICE, OWN(device_allreduce), "auto",
     "device cuda: the gradient all-reduce between learner ranks: nccl (on the GPUs, its "
     "communicator bootstrapped over MPI), mpi (on the host, bit-reproducible for a fixed "
     "rank count, learner/dist.h), or auto (nccl with several learner ranks when the build has "
     "NCCL, else mpi)",
     0, 0, "auto|nccl|mpi", 0, NULL},
    {"device-math", ARL_OPT_CHOICE, OWN(device_math), "fp32",
     "device cuda: the arithmetic of the passes' GEMMs: fp32 (the CPU reference's sums in other "
     "orders), tf32 or bf16 (tensor-core inputs rounded to tf32 or bf16, fp32 accumulation; the "
     "weights, gradients, optimizer moments, norms, router, softmax statistics and recurrent "
     "states stay fp32, spec/policy.md 1.4). bf16 also keeps bf16 copies of the weights (2 bytes "
     "a parameter more), which every forward's weight GEMMs read",
     0, 0, "fp32|tf32|bf16", 0, NULL},
    {"device-slot-rows", ARL_OPT_INT, OWN(device_slot_rows), "0",
     "device cuda|cpu-device: MLA latent rows (per layer) the document slots share; 0: each of "
     "the max-docs slots keeps the whole context; fewer: a slot's rows follow its document's "
     "length (made, grown and freed as the passes go); when a forward's documents need more, "
     "other slots' states go back to the host and, if that is not enough, the forward is made "
     "with fewer documents at a time (the gradient summed in more parts: equal to fp32 "
     "rounding; state/device_call_splits counts them); one document needing more stops with "
     "an error naming the counts. Memory, not the model: a resume may change it",
     0, 1e12, NULL, 0, "ROWS"},
};
#undef OWN

#define TAB_MAX 96
static arl_option tab[TAB_MAX];
static size_t tab_n;
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_add(const arl_option *src, size_t n, size_t base) {
    ARL_ASSERT(tab_n + n <= TAB_MAX);
    for (size_t i = 0; i < n; i++) {
        tab[tab_n] = src[i];
        tab[tab_n].offset += base;
        tab_n++;
    }
}

static void tab_build(void) {
    tab_add(own_tab, ARL_OPTIONS_COUNT(own_tab), 0);
    tab_add(arl_reward_options, arl_reward_options_count, offsetof(arl_learner_opts, reward));
    tab_add(arl_loss_options, arl_loss_options_count, offsetof(arl_learner_opts, loss));
    tab_add(arl_kl_options, arl_kl_options_count, offsetof(arl_learner_opts, kl));
    tab_add(arl_dist_options, arl_dist_options_count, offsetof(arl_learner_opts, dist));
    size_t no;
    const arl_option *opt = arl_optim_options(&no);
    size_t at = tab_n;
    tab_add(opt, no, offsetof(arl_learner_opts, optim));
    /* RL defaults of spec/objective.md section 13 (the optimizer table's own defaults are
     * those of pre-training/SFT) and a constant learning rate */
    for (size_t i = at; i < tab_n; i++) {
        if (!strcmp(tab[i].name, "lr")) tab[i].def = "1e-6";
        if (!strcmp(tab[i].name, "min-lr-ratio")) tab[i].def = "1.0";
    }
}

const arl_option *arl_learner_options(size_t *n) {
    pthread_once(&tab_once, tab_build);
    *n = tab_n;
    return tab;
}

arl_status arl_learner_opts_defaults(arl_learner_opts *o) {
    size_t n;
    const arl_option *t = arl_learner_options(&n);
    memset(o, 0, sizeof *o);
    return arl_options_defaults(t, n, o);
}

void arl_learner_opts_free(arl_learner_opts *o) {
    if (!o) return;
    size_t n;
    const arl_option *t = arl_learner_options(&n);
    arl_options_free(t, n, o);
}

/* ------------------------------------------------------------------------------------------ */
/* memory                                                                                       */

static void counters_zero(arl_learner *l) {
    lr_counters *c = &l->cnt;
    c->starts = c->hits = c->recompute_tokens = c->piece_splits = 0;
    c->dev_splits = c->dev_evictions = 0;
    c->drift_sum = 0;
    c->drift_n = 0;
    c->agree_tokens = c->exact_tokens = 0;
    if (l->n_moe > 0) {
        memset(c->agree_layer, 0, sizeof(double) * (size_t)l->n_moe);
        memset(c->exact_layer, 0, sizeof(double) * (size_t)l->n_moe);
        memset(c->load_tokens, 0, sizeof(double) * (size_t)l->n_moe);
        memset(c->load_rollout, 0, sizeof(double) * (size_t)(l->n_moe * l->E));
        memset(c->load_trainer, 0, sizeof(double) * (size_t)(l->n_moe * l->E));
    }
}

/* Minibatch order: order[start[m] .. start[m+1]) of minibatch m. */
typedef struct lr_mb {
    int32_t *order; /* (n_segs) */
    int32_t *start; /* (M + 1) */
} lr_mb;

struct lr_extra {
    lr_mb mb;
    arl_router_scores rs_all; /* QB rows of every learner rank */
    int64_t rs_all_cap;
    uint8_t *qb_buf;
    size_t qb_cap;
};

/* The extra state lives in a side table keyed by the learner (keeps update_internal.h small). */
typedef struct lr_box {
    arl_learner l;
    struct lr_extra x;
} lr_box;

static struct lr_extra *extra_of(arl_learner *l) {
    return &((lr_box *)l)->x;
}

void arl_learner_free(arl_learner *l) {
    if (!l) return;
    struct lr_extra *x = extra_of(l);
    free(x->mb.order);
    free(x->mb.start);
    arl_router_scores_free(&x->rs_all);
    free(x->qb_buf);
    arl_update_batch_free(&l->b);
    arl_state_cache_free(&l->cache);
    lr_dev_close(l);
    if (l->have_tr) arl_model_train_free(&l->tr);
    if (l->have_m) arl_model_free(&l->m);
    if (l->have_mref) arl_model_free(&l->mref);
    arl_model_params_free(&l->grads);
    arl_decode_state_free(&l->st);
    arl_router_scores_free(&l->rs);
    free(l->tok);
    free(l->tgt);
    free(l->cu);
    free(l->slots);
    free(l->forced);
    free(l->routes_out);
    free(l->lp);
    free(l->ent);
    free(l->rscores);
    free(l->agree_ws);
    free(l->dlogp);
    free(l->dtmp);
    free(l->gtmp);
    free(l->seg_slot);
    free(l->traj_slot);
    free(l->pieces);
    for (int32_t g = 0; g < l->px_cap; g++)
        free(l->px[g].buf);
    free(l->px);
    if (l->have_pst) arl_decode_state_free(&l->pst);
    free(l->media);
    free(l->dmedia);
    free(l->media_traj);
    free(l->media_row);
    free(l->vws);
    free(l->cnt.agree_layer);
    free(l->cnt.exact_layer);
    free(l->cnt.load_rollout);
    free(l->cnt.load_trainer);
    free(l->cnt.load_tokens);
    free(l);
}

arl_status arl_learner_create(arl_learner **out, const arl_learner_init *in) {
    *out = NULL;
    lr_box *box = calloc(1, sizeof *box);
    if (!box) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    arl_learner *l = &box->l;
    l->in = *in;
    l->lc = *in->lc;
    l->cfg = in->cfg;
    l->dm = in->cfg->dims;
    l->n_moe = l->dm.n_moe;
    l->k = l->dm.k;
    l->E = l->dm.E;
    l->V = l->dm.V;
    l->Tm = l->lc.max_tokens;
    l->N = l->lc.max_docs;
    l->update_n = -1;
    *out = l;
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = l->Tm;
    mo.max_docs = l->N;
    mo.max_context = l->lc.max_context;
    mo.max_context_key = l->lc.max_context_key;
    if (l->lc.mla_sparse_topk > 0) { /* the run's block-sparse setting: every learner pass
                                      * (pi_old, reference, gradient) runs it */
        mo.mla_sparse_topk = l->lc.mla_sparse_topk;
        mo.mla_sparse_chunk = l->lc.mla_sparse_chunk;
    }
    ARL_TRY(arl_model_init(&l->m, in->cfg, in->params, &mo));
    l->have_m = 1;
    ARL_TRY(arl_model_init(&l->mref, in->cfg, in->ref_params, &mo));
    l->have_mref = 1;
    ARL_TRY(lr_dev_open(l));
    if (!l->ops) { /* on a device its training step replaces this one */
        arl_train_opts to;
        arl_train_opts_default(&to);
        to.checkpoint = l->lc.act_checkpoint;
        ARL_TRY(arl_model_train_init(&l->tr, &l->m, &to, NULL));
        l->have_tr = 1;
    }
    ARL_TRY(arl_model_params_alloc(&l->grads, in->cfg));
    ARL_TRY(arl_decode_state_init(&l->st, in->cfg, l->N, l->m.opts.max_context));
    const int64_t nm = l->n_moe > 0 ? l->n_moe : 1;
    l->tok = malloc(sizeof(int32_t) * (size_t)l->Tm);
    l->tgt = malloc(sizeof(int32_t) * (size_t)l->Tm);
    l->cu = malloc(sizeof(int32_t) * (size_t)(l->N + 1));
    l->slots = malloc(sizeof(int32_t) * (size_t)l->N);
    l->forced = malloc(sizeof(int32_t) * (size_t)(nm * l->Tm * l->k));
    l->routes_out = malloc(sizeof(int32_t) * (size_t)(nm * l->Tm * l->k));
    l->lp = malloc(sizeof(float) * (size_t)l->Tm);
    l->ent = malloc(sizeof(float) * (size_t)l->Tm);
    l->rscores = malloc(sizeof(float) * (size_t)(nm * l->Tm * l->E));
    l->agree_ws = malloc(sizeof(float) * (size_t)(l->E > 0 ? l->E : 1));
    l->dlogp = malloc(sizeof(float) * (size_t)l->Tm);
    l->dtmp = malloc(sizeof(double) * (size_t)l->Tm);
    l->gtmp = malloc(sizeof(double) * (size_t)l->Tm);
    l->cnt.agree_layer = calloc((size_t)nm, sizeof(double));
    l->cnt.exact_layer = calloc((size_t)nm, sizeof(double));
    l->cnt.load_tokens = calloc((size_t)nm, sizeof(double));
    l->cnt.load_rollout = calloc((size_t)(nm * l->E), sizeof(double));
    l->cnt.load_trainer = calloc((size_t)(nm * l->E), sizeof(double));
    if (!l->tok || !l->tgt || !l->cu || !l->slots || !l->forced || !l->routes_out || !l->lp ||
        !l->ent || !l->rscores || !l->agree_ws || !l->dlogp || !l->dtmp || !l->gtmp ||
        !l->cnt.agree_layer || !l->cnt.exact_layer || !l->cnt.load_tokens || !l->cnt.load_rollout ||
        !l->cnt.load_trainer)
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (forward buffers for %lld tokens)",
                          (long long)l->Tm);
    if (in->cfg->has_vision) { /* image rows of one forward: at most one per token */
        l->media_max = l->Tm;
        l->media = malloc(sizeof(float) * (size_t)(l->Tm * l->dm.d));
        l->dmedia = malloc(sizeof(float) * (size_t)(l->Tm * l->dm.d));
        l->media_traj = malloc(sizeof(int32_t) * (size_t)l->Tm);
        l->media_row = malloc(sizeof(int64_t) * (size_t)l->Tm);
        if (!l->media || !l->dmedia || !l->media_traj || !l->media_row)
            return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (image rows for %lld tokens)",
                              (long long)l->Tm);
    }
    l->qb_on = in->opt->cfg.qb_method && strcmp(in->opt->cfg.qb_method, "off") != 0;
    l->cache.max_bytes = l->lc.state_cache_bytes;
    return ARL_OK;
}

void arl_learner_set_hook(arl_learner *l, arl_learner_hook_fn fn, void *ctx) {
    l->hook = fn;
    l->hook_ctx = ctx;
}

void arl_learner_set_grad_hook(arl_learner *l, arl_learner_grad_hook_fn fn, void *ctx) {
    l->grad_hook = fn;
    l->grad_hook_ctx = ctx;
}

arl_status arl_learner_minibatch_loss(arl_learner *l, int32_t mb, double *loss) {
    *loss = NAN;
    if (!l->have_lpar || mb < 0 || mb >= l->lc.minibatches)
        return arl_errorf(ARL_ERR_STATE, "learner: no update running with minibatch %d", (int)mb);
    lr_media_invalidate(l); /* the caller may have changed the weights */
    lr_dev_weights_stale(l);
    lr_dev_enter(l);
    arl_status st = lr_loss_pass(l, &l->lpar, mb, loss);
    lr_dev_exit(l);
    lr_media_invalidate(l);
    lr_dev_weights_stale(l); /* the caller restores them */
    return st;
}

arl_state_cache *arl_learner_cache(arl_learner *l) {
    return &l->cache;
}
const arl_update_batch *arl_learner_batch(const arl_learner *l) {
    return &l->b;
}

/* ------------------------------------------------------------------------------------------ */
/* collectives                                                                                  */

static int32_t n_learners(const arl_learner *l) {
    return l->in.dist && l->in.dist->learners ? arl_dist_comm_size(l->in.dist->learners) : 1;
}

arl_status lr_allreduce_f64(arl_learner *l, double *v, int64_t n, arl_dist_op op) {
    if (n_learners(l) <= 1 || n == 0) return ARL_OK;
    return arl_dist_allreduce_f64(l->in.dist->learners, v, n, op);
}

static arl_status reward_allreduce(double *vals, int32_t n, void *ctx) {
    return lr_allreduce_f64((arl_learner *)ctx, vals, n, ARL_DIST_SUM);
}

static arl_status loss_acc_allreduce(arl_learner *l, arl_loss_acc *a) {
    ARL_TRY(lr_allreduce_f64(l, a->sum, ARL_LACC_NSUM, ARL_DIST_SUM));
    return lr_allreduce_f64(l, a->max, ARL_LACC_NMAX, ARL_DIST_MAX);
}

/* QB rows of every learner rank, in rank order, into x->rs_all (one process: l->rs itself). */
static arl_status qb_gather(arl_learner *l, arl_router_scores **out) {
    const int32_t R = n_learners(l);
    if (R <= 1) {
        *out = &l->rs;
        return ARL_OK;
    }
    struct lr_extra *x = extra_of(l);
    const int64_t Ly = l->dm.L, E = l->E, k = l->k;
    /* serialise: per layer m (int64), then m*E floats, m*k int32 */
    size_t need = (size_t)Ly * sizeof(int64_t);
    for (int64_t y = 0; y < Ly; y++)
        need += (size_t)l->rs.m[y] * (size_t)(E * sizeof(float) + k * sizeof(int32_t));
    if (need > x->qb_cap) {
        uint8_t *nb = realloc(x->qb_buf, need);
        if (!nb) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (QB rows)");
        x->qb_buf = nb;
        x->qb_cap = need;
    }
    size_t o = 0;
    for (int64_t y = 0; y < Ly; y++) {
        memcpy(x->qb_buf + o, &l->rs.m[y], sizeof(int64_t));
        o += sizeof(int64_t);
        const size_t ns = (size_t)(l->rs.m[y] * E) * sizeof(float);
        const size_t nk = (size_t)(l->rs.m[y] * k) * sizeof(int32_t);
        memcpy(x->qb_buf + o, l->rs.s + y * l->rs.cap * E, ns);
        o += ns;
        memcpy(x->qb_buf + o, l->rs.sel + y * l->rs.cap * k, nk);
        o += nk;
    }
    uint8_t **msgs = calloc((size_t)R, sizeof *msgs);
    int64_t *lens = calloc((size_t)R, sizeof *lens);
    if (!msgs || !lens) {
        free(msgs);
        free(lens);
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    }
    const int32_t me = arl_dist_comm_rank(l->in.dist->learners);
    arl_status st = ARL_OK;
    for (int32_t r = 0; st == ARL_OK && r < R; r++) {
        void *buf = r == me ? (void *)x->qb_buf : NULL;
        int64_t n = r == me ? (int64_t)o : 0;
        st = arl_dist_bcast_msg(l->in.dist->learners, &buf, &n, r);
        msgs[r] = buf;
        lens[r] = n;
    }
    /* rows per layer over all ranks: the capacity of the combined table */
    int64_t cap = 0;
    int64_t tot[4096];
    ARL_ASSERT(Ly <= 4096);
    memset(tot, 0, sizeof(int64_t) * (size_t)Ly);
    for (int32_t r = 0; st == ARL_OK && r < R; r++) {
        size_t p = 0;
        for (int64_t y = 0; y < Ly; y++) {
            int64_t m;
            memcpy(&m, msgs[r] + p, sizeof m);
            tot[y] += m;
            p += sizeof m + (size_t)m * (size_t)(E * sizeof(float) + k * sizeof(int32_t));
        }
    }
    for (int64_t y = 0; y < Ly; y++)
        if (tot[y] > cap) cap = tot[y];
    if (st == ARL_OK && cap > x->rs_all_cap) {
        arl_router_scores_free(&x->rs_all);
        st = arl_router_scores_init(&x->rs_all, l->cfg, cap, l->in.opt->cfg.qb_num_bins);
        x->rs_all_cap = st == ARL_OK ? cap : 0;
    }
    if (st == ARL_OK) arl_router_scores_reset(&x->rs_all);
    for (int32_t r = 0; st == ARL_OK && r < R; r++) {
        size_t p = 0;
        for (int64_t y = 0; st == ARL_OK && y < Ly; y++) {
            int64_t m;
            memcpy(&m, msgs[r] + p, sizeof m);
            p += sizeof m;
            if (m > 0) {
                float *sc;
                int32_t *sel;
                st = arl_router_scores_append(&x->rs_all, y, m, &sc, &sel);
                if (st) break;
                memcpy(sc, msgs[r] + p, (size_t)(m * E) * sizeof(float));
                p += (size_t)(m * E) * sizeof(float);
                memcpy(sel, msgs[r] + p, (size_t)(m * k) * sizeof(int32_t));
                p += (size_t)(m * k) * sizeof(int32_t);
            }
        }
    }
    for (int32_t r = 0; r < R; r++)
        if (r != me) free(msgs[r]);
    free(msgs);
    free(lens);
    *out = &x->rs_all;
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* minibatches                                                                                  */

arl_status lr_minibatch_order(arl_learner *l, int32_t mb, const int32_t **order, int32_t *n) {
    struct lr_extra *x = extra_of(l);
    *order = x->mb.order + x->mb.start[mb];
    *n = x->mb.start[mb + 1] - x->mb.start[mb];
    return ARL_OK;
}

/* Deal the segments of valid trajectories into M minibatches (update.h step 5). */
static arl_status deal_minibatches(arl_learner *l, int64_t n) {
    struct lr_extra *x = extra_of(l);
    arl_update_batch *b = &l->b;
    const int32_t M = l->lc.minibatches;
    free(x->mb.order);
    free(x->mb.start);
    x->mb.order = malloc(sizeof(int32_t) * (size_t)(b->n_segs ? b->n_segs : 1));
    x->mb.start = calloc((size_t)M + 1, sizeof(int32_t));
    int32_t *list = malloc(sizeof(int32_t) * (size_t)(b->n_segs ? b->n_segs : 1));
    int64_t *load = calloc((size_t)M, sizeof(int64_t));
    int32_t *cnt = calloc((size_t)M + 1, sizeof(int32_t));
    if (!x->mb.order || !x->mb.start || !list || !load || !cnt) {
        free(list);
        free(load);
        free(cnt);
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    }
    int32_t nl = 0;
    for (int32_t i = 0; i < b->n_segs; i++)
        if (b->trajs[b->segs[i].traj].valid) list[nl++] = i;
    arl_rng r;
    arl_rng_seed_stream(&r, l->lc.seed, (uint64_t)n);
    for (int32_t i = nl - 1; i > 0; i--) {
        int32_t j = (int32_t)arl_rng_below(&r, (uint64_t)i + 1);
        int32_t t = list[i];
        list[i] = list[j];
        list[j] = t;
    }
    for (int32_t i = 0; i < nl; i++) {
        int32_t best = 0;
        for (int32_t m = 1; m < M; m++)
            if (load[m] < load[best]) best = m;
        b->segs[list[i]].minibatch = best;
        load[best] += b->segs[list[i]].n_action;
        cnt[best + 1]++;
    }
    for (int32_t m = 0; m < M; m++)
        cnt[m + 1] += cnt[m];
    memcpy(x->mb.start, cnt, sizeof(int32_t) * (size_t)(M + 1));
    for (int32_t i = 0; i < nl; i++) {
        const int32_t m = b->segs[list[i]].minibatch;
        x->mb.order[cnt[m]++] = list[i];
    }
    free(list);
    free(load);
    free(cnt);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* metrics                                                                                      */

typedef struct mctx {
    json_t *o;
    int bad; /* a metric left out (out of memory): the metrics are an error, not a short line */
} mctx;

static void mset(void *ctx, const char *name, double v) {
    mctx *mc = ctx;
    if (json_object_set_new(mc->o, name, isfinite(v) ? json_real(v) : json_null())) mc->bad = 1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted x (n > 0). */
static double pct(const double *x, int64_t n, double p) {
    int64_t i = (int64_t)ceil(p * (double)n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return x[i];
}

static void dist3(mctx *mc, const char *base, double *v, int64_t n) {
    char name[128];
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    snprintf(name, sizeof name, "%s/p50", base);
    mset(mc, name, n ? pct(v, n, 0.5) : 0);
    snprintf(name, sizeof name, "%s/p95", base);
    mset(mc, name, n ? pct(v, n, 0.95) : 0);
    snprintf(name, sizeof name, "%s/max", base);
    mset(mc, name, n ? v[n - 1] : 0);
}

/* Counted names (end causes, error codes, boundary causes). */
typedef struct namecount {
    char name[64];
    double n;
} namecount;

static void nc_add(namecount *v, int *n, int cap, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(v[i].name, name)) {
            v[i].n += 1;
            return;
        }
    if (*n < cap) {
        snprintf(v[*n].name, sizeof v[*n].name, "%s", name);
        v[(*n)++].n = 1;
    }
}

static void data_metrics(arl_learner *l, mctx *mc, const arl_shard_stats *ss) {
    const arl_update_batch *b = &l->b;
    namecount ends[16], codes[32], bcause[8];
    int ne = 0, nc = 0, nb = 0;
    double *tok = malloc(sizeof(double) * (size_t)(b->n_trajs + 1));
    double *act = malloc(sizeof(double) * (size_t)(b->n_trajs + 1));
    double *turns = malloc(sizeof(double) * (size_t)(b->n_trajs + 1));
    double *segs = malloc(sizeof(double) * (size_t)(b->n_trajs + 1));
    if (!tok || !act || !turns || !segs) {
        free(tok);
        free(act);
        free(turns);
        free(segs);
        return;
    }
    int64_t nv = 0, members = 0, env_masked = 0;
    for (int32_t i = 0; i < b->n_trajs; i++) {
        const arl_upd_traj *t = &b->trajs[i];
        members++;
        nc_add(ends, &ne, 16, t->row.end_cause[0] ? t->row.end_cause : "none");
        if (t->row.status == REPLAY_MASKED) {
            nc_add(codes, &nc, 32, t->row.error_code[0] ? t->row.error_code : "unknown");
            env_masked += !strcmp(t->row.error_attribution, "env");
        }
        if (!t->valid) continue;
        tok[nv] = (double)t->row.n_tokens;
        act[nv] = (double)t->row.n_action_tokens;
        turns[nv] = (double)t->row.n_turns;
        segs[nv] = (double)t->row.n_segments;
        nv++;
    }
    char name[160];
    for (int i = 0; i < ne; i++) {
        snprintf(name, sizeof name, "rollout/end_cause/%s", ends[i].name);
        mset(mc, name, members ? ends[i].n / (double)members : 0);
    }
    for (int i = 0; i < nc; i++) {
        snprintf(name, sizeof name, "rollout/masked/%s", codes[i].name);
        mset(mc, name, codes[i].n);
    }
    dist3(mc, "rollout/tokens", tok, nv);
    dist3(mc, "rollout/action_tokens", act, nv);
    dist3(mc, "rollout/turns", turns, nv);
    dist3(mc, "rollout/segments", segs, nv);
    int64_t nseg = 0, oversize = 0;
    for (int32_t i = 0; i < b->n_segs; i++) {
        if (!b->trajs[b->segs[i].traj].valid) continue;
        nseg++;
        oversize += l->lc.segment_tokens > 0 && b->segs[i].T > l->lc.segment_tokens;
        nc_add(bcause, &nb, 8, b->segs[i].end_cause);
    }
    for (int i = 0; i < nb; i++) {
        snprintf(name, sizeof name, "segment/boundary_cause/%s", bcause[i].name);
        mset(mc, name, bcause[i].n);
    }
    mset(mc, "segment/oversize_frac", nseg ? (double)oversize / (double)nseg : 0);
    if (ss) {
        for (int i = 0; i < 8; i++) {
            if (!ss->parse_n[i]) continue;
            snprintf(name, sizeof name, "rollout/parse_status/%s", arl_shard_parse_names[i]);
            mset(mc, name, ss->turns ? (double)ss->parse_n[i] / (double)ss->turns : 0);
        }
        for (int32_t i = 0; i < ss->n_tool_err; i++) {
            snprintf(name, sizeof name, "rollout/tool_error/%s", ss->tool_err_name[i]);
            mset(mc, name, ss->tool_calls ? (double)ss->tool_err_n[i] / (double)ss->tool_calls : 0);
        }
        const char *env = b->n_groups ? b->groups[0].env_name : "env";
        for (int i = 0; i < 7; i++) {
            if (!ss->n_lat[i]) continue;
            qsort(ss->lat[i], (size_t)ss->n_lat[i], sizeof(double), cmp_d);
            snprintf(name, sizeof name, "env/%s/latency_ms/%s/p50", env,
                     arl_shard_endpoint_names[i]);
            mset(mc, name, pct(ss->lat[i], ss->n_lat[i], 0.5));
            snprintf(name, sizeof name, "env/%s/latency_ms/%s/p99", env,
                     arl_shard_endpoint_names[i]);
            mset(mc, name, pct(ss->lat[i], ss->n_lat[i], 0.99));
        }
        snprintf(name, sizeof name, "env/%s/retries", env);
        mset(mc, name, members ? (double)ss->retries / (double)members : 0);
        snprintf(name, sizeof name, "env/%s/masked_frac", env);
        mset(mc, name, members ? (double)env_masked / (double)members : 0);
    }
    free(tok);
    free(act);
    free(turns);
    free(segs);
}

static arl_status moe_metrics(arl_learner *l, mctx *mc) {
    if (l->n_moe == 0 || !l->lc.routing_replay) return ARL_OK;
    lr_counters *c = &l->cnt;
    const int64_t nm = l->n_moe, E = l->E;
    double head[2] = {c->agree_tokens, c->exact_tokens};
    ARL_TRY(lr_allreduce_f64(l, head, 2, ARL_DIST_SUM));
    ARL_TRY(lr_allreduce_f64(l, c->agree_layer, nm, ARL_DIST_SUM));
    ARL_TRY(lr_allreduce_f64(l, c->exact_layer, nm, ARL_DIST_SUM));
    ARL_TRY(lr_allreduce_f64(l, c->load_tokens, nm, ARL_DIST_SUM));
    ARL_TRY(lr_allreduce_f64(l, c->load_rollout, nm * E, ARL_DIST_SUM));
    ARL_TRY(lr_allreduce_f64(l, c->load_trainer, nm * E, ARL_DIST_SUM));
    const double T = head[0];
    double ov = 0, ex = 0;
    char name[96];
    for (int64_t j = 0; j < nm; j++) {
        ov += c->agree_layer[j];
        ex += c->exact_layer[j];
        snprintf(name, sizeof name, "moe/router_agreement/layer[%lld]", (long long)j);
        mset(mc, name, T > 0 ? c->agree_layer[j] / T : 0);
    }
    mset(mc, "moe/router_agreement/overlap", T > 0 ? ov / (T * (double)nm) : 0);
    mset(mc, "moe/router_agreement/exact_layer", T > 0 ? ex / (T * (double)nm) : 0);
    mset(mc, "moe/router_agreement/exact_token", T > 0 ? head[1] / T : 0);
    double vmax[2] = {0, 0};
    for (int w = 0; w < 2; w++) {
        const double *ld = w ? c->load_trainer : c->load_rollout;
        for (int64_t j = 0; j < nm; j++) {
            double mx = 0;
            for (int64_t e = 0; e < E; e++)
                if (ld[j * E + e] > mx) mx = ld[j * E + e];
            const double fair = c->load_tokens[j] * (double)l->k / (double)E;
            const double v = fair > 0 ? mx / fair - 1.0 : 0;
            snprintf(name, sizeof name, "moe/load_violation/%s[%lld]", w ? "trainer" : "rollout",
                     (long long)j);
            mset(mc, name, v);
            if (v > vmax[w]) vmax[w] = v;
        }
    }
    mset(mc, "moe/load_violation/rollout/max", vmax[0]);
    mset(mc, "moe/load_violation/trainer/max", vmax[1]);
    return ARL_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------------------------------ */
/* the update                                                                                   */

static arl_status update_run(arl_learner *l, int64_t n, const arl_update_source *src,
                             int32_t n_src, arl_update_result *res);

arl_status arl_learner_update(arl_learner *l, int64_t n, const arl_update_source *src,
                              int32_t n_src, arl_update_result *res) {
    lr_dev_weights_stale(l); /* the caller may have loaded other weights since the last update */
    lr_dev_enter(l);
    arl_status st = update_run(l, n, src, n_src, res);
    lr_dev_exit(l);
    return st;
}

static arl_status update_run(arl_learner *l, int64_t n, const arl_update_source *src,
                             int32_t n_src, arl_update_result *res) {
    memset(res, 0, sizeof *res);
    const double t0 = now_s();
    l->update_n = n;
    arl_state_cache_clear(&l->cache);
    counters_zero(l);
    const int32_t me =
        l->in.dist && l->in.dist->learners ? arl_dist_comm_rank(l->in.dist->learners) : 0;

    /* 1. load */
    arl_shard_stats ss;
    memset(&ss, 0, sizeof ss);
    l->px_n = 0;
    arl_status st = lr_batch_load(l, src, n_src, me == 0 ? &ss : NULL);
    arl_update_batch *b = &l->b;
    if (st == ARL_OK) {
        free(l->seg_slot);
        free(l->traj_slot);
        l->seg_slot = malloc(sizeof(int32_t) * (size_t)(b->n_segs + 1));
        l->traj_slot = malloc(sizeof(int32_t) * (size_t)(b->n_trajs + 1));
        if (!l->seg_slot || !l->traj_slot)
            st = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
        else {
            for (int32_t i = 0; i < b->n_segs; i++)
                l->seg_slot[i] = -1;
            for (int32_t i = 0; i < b->n_trajs; i++)
                l->traj_slot[i] = -1;
        }
    }
    if (st == ARL_OK) st = lr_media_prepare(l);
    if (st == ARL_OK) st = lr_prefix_find(l);
    l->have_lpar = 0;
    const double t_load = now_s();

    /* 2-3. pi_old and reference passes */
    if (st == ARL_OK) st = lr_states_plan(l, src, n_src);
    if (st == ARL_OK) st = lr_score_pass(l, LR_PASS_OLD);
    l->states_src = NULL;
    l->states_nsrc = 0;
    const double t_old = now_s();
    if (st == ARL_OK) st = lr_score_pass(l, LR_PASS_REF);
    const double t_ref = now_s();
    if (st == ARL_OK && l->hook) l->hook(l->hook_ctx, l);

    /* 4. advantages */
    arl_reward_acc racc;
    arl_reward_acc_init(&racc);
    arl_reward_traj *rt = NULL;
    arl_reward_group *rg = NULL;
    int32_t n_rg = 0;
    if (st == ARL_OK) {
        rt = calloc((size_t)(b->n_trajs + 1), sizeof *rt);
        rg = calloc((size_t)(b->n_groups + 1), sizeof *rg);
        if (!rt || !rg) st = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    }
    for (int32_t i = 0; st == ARL_OK && i < b->n_trajs; i++) {
        arl_upd_traj *t = &b->trajs[i];
        arl_reward_traj *r = &rt[i];
        if (!t->valid || !t->local) {
            r->status = ARL_REWARD_TRAJ_MASKED;
            continue;
        }
        r->status =
            t->row.status == REPLAY_COMPLETE ? ARL_REWARD_TRAJ_COMPLETE : ARL_REWARD_TRAJ_TRUNCATED;
        for (int32_t k = 0; k < t->n_turns; k++) {
            t->turns[k].n_action = 0;
            t->turns[k].kappa = 0;
        }
        for (int32_t j = 0; st == ARL_OK && j < t->n_segs; j++) {
            const arl_upd_seg *s = &b->segs[t->seg0 + j];
            st = arl_reward_turns_scan(t->turns, t->n_turns, s->tok_start, s->T, s->amask,
                                       s->lp_old, s->lp_ref);
        }
        r->n_turns = t->n_turns;
        r->n_segs = t->n_segs;
        r->turns = t->turns;
        r->process = t->proc;
        r->segment = t->segr;
        r->outcome = t->outc;
        r->segment_unscorable = t->seg_unscorable;
        r->seg_mc_baseline = t->seg_mc;
        r->outcome_unscorable = t->outc_unscorable;
        r->outcome_lo = t->outc_subst;
        if ((!isfinite(t->outc[0]) && l->in.reward->n_comp[ARL_REWARD_LEVEL_OUTCOME] == 0) ||
            (t->outc_unscorable && !isfinite(t->outc_subst))) {
            /* no outcome stored for a valid trajectory: counts as unscorable, R = range_lo */
            t->outc[0] = b->groups[t->group].outcome_lo;
            r->outcome_unscorable = 1;
            r->outcome_lo = t->outc[0];
        }
        r->out.adv_turn = t->adv_turn;
        r->out.seg_adv = t->lv_seg;
        r->out.proc_adv = t->lv_proc;
        r->out.kl_rtg = t->lv_kl;
        r->out.kl_base = t->lv_klb;
    }
    for (int32_t g = 0; st == ARL_OK && g < b->n_groups; g++) {
        const arl_upd_group *G = &b->groups[g];
        if (!G->local) continue;
        arl_reward_group *x = &rg[n_rg++];
        x->n = G->n_trajs;
        x->trajs = rt + G->traj0;
        memcpy(x->level_absent, G->level_absent, sizeof x->level_absent);
        memcpy(x->process_model, G->process_model, sizeof x->process_model);
    }
    const double beta = arl_klctl_beta(l->in.kl);
    b->beta = beta;
    if (st == ARL_OK)
        st = arl_reward_compute(l->in.reward, rg, n_rg, beta,
                                n_learners(l) > 1 ? reward_allreduce : NULL, l, &racc);
    if (st == ARL_OK) {
        st = lr_allreduce_f64(l, racc.sum, ARL_RACC_NSUM, ARL_DIST_SUM);
        if (st == ARL_OK) st = lr_allreduce_f64(l, racc.max, ARL_RACC_NMAX, ARL_DIST_MAX);
    }
    for (int32_t i = 0; st == ARL_OK && i < b->n_trajs; i++)
        b->trajs[i].lv_outcome = rt[i].out.outcome_adv;
    for (int32_t i = 0; st == ARL_OK && i < b->n_segs; i++) {
        arl_upd_seg *s = &b->segs[i];
        const arl_upd_traj *t = &b->trajs[s->traj];
        if (!t->valid || !t->local) continue;
        st = arl_reward_token_adv(&rt[s->traj], s->tok_start, s->T, s->amask, s->adv);
    }

    /* masks and pre-gradient statistics */
    arl_loss_params lpar;
    arl_loss_acc acc_prep, acc_step, acc_last;
    arl_loss_acc_init(&acc_prep);
    arl_loss_acc_init(&acc_step);
    arl_loss_acc_init(&acc_last);
    if (st == ARL_OK)
        st = arl_loss_params_init(&lpar, l->in.loss, l->lc.n_traj_per_update, l->lc.minibatches,
                                  arl_klctl_lambda2(l->in.kl), n);
    if (st == ARL_OK) {
        l->lpar = lpar;
        l->have_lpar = 1;
    }
    for (int32_t i = 0; st == ARL_OK && i < b->n_trajs; i++)
        if (b->trajs[i].valid)
            b->trajs[i].inv_norm = arl_loss_inv_norm(&lpar, b->n_valid, b->trajs[i].n_action);
    for (int32_t i = 0; st == ARL_OK && i < b->n_segs; i++) {
        arl_upd_seg *s = &b->segs[i];
        const arl_upd_traj *t = &b->trajs[s->traj];
        if (!t->valid || !t->local) continue;
        arl_loss_seg v = {.n_tok = s->T,
                          .loss_mask = s->amask,
                          .lp_mu = s->lp_mu,
                          .lp_old = s->lp_old,
                          .lp_ref = s->lp_ref,
                          .adv = s->adv,
                          .versions = s->versions,
                          .entropy = s->entropy,
                          .turn = s->turn,
                          .routes_ok = s->routes_ok,
                          .traj_tokens = t->n_tokens,
                          .inv_norm = t->inv_norm};
        st = arl_loss_seg_prepare(&lpar, &v, &s->mk, &acc_prep);
        if (st)
            st = arl_error_prefix(st, "learner: trajectory %s segment %d", t->row.traj_uid,
                                  (int)s->seg_index);
    }
    if (st == ARL_OK) st = loss_acc_allreduce(l, &acc_prep);
    const double kl_hat = st == ARL_OK ? arl_loss_acc_kl_hat(&acc_prep) : NAN;

    /* 5. minibatches */
    if (st == ARL_OK) st = deal_minibatches(l, n);
    double gn_sum = 0, gn_max = 0, gc_sum = 0, gc_max = 0, lr_used = 0;
    const int32_t M = l->lc.minibatches;
    double t_grad = 0;
    if (st == ARL_OK && l->qb_on && l->n_moe > 0) {
        /* rows per step: the most tokens a minibatch feeds on this rank */
        struct lr_extra *x = extra_of(l);
        int64_t need = 1;
        for (int32_t m = 0; m < M; m++) {
            int64_t sum = 0;
            for (int32_t q = x->mb.start[m]; q < x->mb.start[m + 1]; q++)
                if (b->segs[x->mb.order[q]].local) sum += b->segs[x->mb.order[q]].n_fed;
            if (sum > need) need = sum;
        }
        if (need > l->rs_cap) {
            arl_router_scores_free(&l->rs);
            st = arl_router_scores_init(&l->rs, l->cfg, need, l->in.opt->cfg.qb_num_bins);
            l->rs_cap = st == ARL_OK ? need : 0;
        }
    }
    if (st == ARL_OK) st = lr_optim_begin(l);
    for (int32_t m = 0; st == ARL_OK && m < M; m++) {
        const double tg0 = now_s();
        memset(l->grads.arena, 0, sizeof(float) * (size_t)l->grads.inv.arena_floats);
        if (l->qb_on && l->n_moe > 0) arl_router_scores_reset(&l->rs);
        arl_loss_acc am;
        arl_loss_acc_init(&am);
        st = lr_grad_pass(l, &lpar, m, m == M - 1 && M > 1, &am);
        if (st == ARL_OK && l->grad_hook) l->grad_hook(l->grad_hook_ctx, l, m, &l->grads);
        arl_optim_report rep;
        memset(&rep, 0, sizeof rep);
        if (st == ARL_OK) st = lr_optim_step(l, &rep);
        if (st == ARL_OK && l->qb_on && l->n_moe > 0) {
            arl_router_scores *rs = NULL;
            st = qb_gather(l, &rs);
            if (st == ARL_OK) st = arl_qb_update(&l->in.opt->cfg, l->in.params, rs);
        }
        if (st == ARL_OK) {
            gn_sum += rep.grad_norm;
            if (rep.grad_norm > gn_max) gn_max = rep.grad_norm;
            const double clipped = rep.clip_coef < 1.0;
            gc_sum += clipped;
            if (clipped > gc_max) gc_max = clipped;
            lr_used = rep.lr;
            st = loss_acc_allreduce(l, &am);
        }
        if (st == ARL_OK) {
            arl_loss_acc_merge(&acc_step, &am);
            if (m == M - 1) acc_last = am;
        }
        t_grad += now_s() - tg0;
    }

    { /* the optimizer state back on the host (a failed update is reloaded anyway) */
        arl_status se = lr_optim_end(l);
        if (st == ARL_OK) st = se;
    }

    /* 6. controller */
    arl_klctl_step ks;
    memset(&ks, 0, sizeof ks);
    const double coef_used =
        arl_klctl_beta(l->in.kl) > 0 ? arl_klctl_beta(l->in.kl) : arl_klctl_lambda2(l->in.kl);
    (void)coef_used;
    arl_klctl kl_before = *l->in.kl;
    if (st == ARL_OK) st = arl_klctl_update(l->in.kl, kl_hat, b->n_valid, &ks);

    /* 7. metrics */
    double cnt[10] = {(double)l->cnt.starts,
                      (double)l->cnt.hits,
                      (double)l->cnt.recompute_tokens,
                      (double)l->cnt.piece_splits,
                      l->cnt.drift_sum,
                      (double)l->cnt.drift_n,
                      0,
                      0,
                      (double)l->cnt.dev_splits,
                      (double)l->cnt.dev_evictions};
    for (int32_t g = 0; g < l->px_n; g++)
        if (l->px[g].seg >= 0) {
            cnt[6] += l->px[g].users;
            cnt[7] += (double)l->px[g].len * (l->px[g].users - 1);
        }
    if (st == ARL_OK) st = lr_allreduce_f64(l, cnt, 10, ARL_DIST_SUM);
    mctx mc = {json_object(), 0};
    if (!mc.o && st == ARL_OK) st = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    if (st == ARL_OK) {
        mset(&mc, "update", (double)n);
        mset(&mc, "groups", (double)b->n_groups);
        data_metrics(l, &mc, me == 0 ? &ss : NULL);
        arl_reward_acc_emit(&racc, l->in.reward, mset, &mc);
        arl_loss_acc merged = acc_prep;
        arl_loss_acc_merge(&merged, &acc_step);
        arl_loss_acc_emit(&merged, mset, &mc);
        /* ppo/ratio_* of the last minibatch (spec/objective.md section 12) */
        const double ntok = acc_last.sum[ARL_LACC_STEP_TOKENS];
        mset(&mc, "ppo/ratio_mean", ntok > 0 ? acc_last.sum[ARL_LACC_RATIO_SUM] / ntok : 0);
        mset(&mc, "ppo/ratio_max", ntok > 0 ? acc_last.max[ARL_LACC_MAX_RATIO] : 0);
        arl_klctl_emit(&kl_before, &ks, mset, &mc);
        mset(&mc, "kl/coef_next", ks.coef_next);
        mset(&mc, "grad/norm/mean", gn_sum / M);
        mset(&mc, "grad/norm/max", gn_max);
        mset(&mc, "grad/clipped/mean", gc_sum / M);
        mset(&mc, "grad/clipped/max", gc_max);
        mset(&mc, "optim/lr", lr_used);
        mset(&mc, "state/recompute_tokens", cnt[2]);
        mset(&mc, "state/hit_frac", cnt[0] > 0 ? cnt[1] / cnt[0] : 0);
        mset(&mc, "state/prefix_drift", cnt[5] > 0 ? cnt[4] / cnt[5] : 0);
        mset(&mc, "state/piece_splits", cnt[3]);
        /* shared device slot rows (learner.device-slot-rows): forwards made again with fewer
         * documents, device slots evicted to make room */
        mset(&mc, "state/device_call_splits", cnt[8]);
        mset(&mc, "state/device_evictions", cnt[9]);
        mset(&mc, "state/cache_dropped", (double)l->cache.dropped);
        /* shared prompt prefixes: trajectories starting from one, and the tokens each pass
         * did not feed again thanks to them */
        mset(&mc, "state/shared_prefix_trajs", cnt[6]);
        mset(&mc, "state/shared_prefix_saved_tokens", cnt[7]);
        st = moe_metrics(l, &mc);
    }
    const double t_end = now_s();
    if (st == ARL_OK) {
        double tt[4] = {t_end - t0, t_old - t_load, t_ref - t_old, t_grad};
        st = lr_allreduce_f64(l, tt, 4, ARL_DIST_MAX);
        mset(&mc, "time/update_s", tt[0]);
        mset(&mc, "time/load_s", t_load - t0);
        mset(&mc, "time/pi_old_pass_s", tt[1]);
        mset(&mc, "time/ref_pass_s", tt[2]);
        mset(&mc, "time/grad_s", tt[3]);
        mset(&mc, "throughput/action_tokens_per_s", tt[0] > 0 ? (double)b->n_action / tt[0] : 0);
    }
    if (st == ARL_OK) {
        res->n_groups = b->n_groups;
        res->n_valid = b->n_valid;
        for (int32_t i = 0; i < b->n_trajs; i++)
            res->n_masked += b->trajs[i].row.status == REPLAY_MASKED;
        res->action_tokens = b->n_action;
        for (int32_t i = 0; i < b->n_trajs; i++)
            if (b->trajs[i].valid) res->tokens += b->trajs[i].n_tokens;
        res->kl_hat = kl_hat;
        res->kl_coef_next = ks.coef_next;
        json_t *lt = json_object_get(mc.o, "loss/total");
        res->loss = json_is_number(lt) ? json_number_value(lt) : NAN;
        res->seconds = t_end - t0;
        res->states_saved = l->states_saved;
        res->metrics_json = mc.bad ? NULL
                                   : arl_json_dumps(mc.o, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                                              JSON_REAL_PRECISION(12));
        if (!res->metrics_json) st = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    }
    json_decref(mc.o);
    arl_shard_stats_free(&ss);
    free(rt);
    free(rg);
    l->have_lpar = 0; /* arl_learner_minibatch_loss: only while the update runs */
    return st;
}
