/* tests/learner/test_images.c: the learner on trajectories whose context holds environment
 * images (learner/update.h "Images", learner/media.c): the tiny model (it has a vision tower)
 * rolls out the multimodal "shapes" environment into a store, and one update
 *   (a) gives every action token of every image-bearing trajectory a pi_old log-prob equal to
 *       its behaviour log-prob from the same checkpoint, and a gradient-pass log-prob (first
 *       optimizer step: the same weights) equal to it too, from cached start states and from
 *       prefixes recomputed with their images;
 *   (b) gives the vision tower and projector the gradient of the learner's loss (central
 *       finite differences of arl_learner_minibatch_loss on the largest entries);
 *   (c) changes the vision tower's weights, and two runs of the same update end bit-identical
 *       (the first with (b)'s finite differences in between, which must leave no trace);
 *   (d) masks, with the loader's error, a trajectory whose stored observations lost their
 *       images (ARL_ERR_NOT_FOUND: more placeholders than images), and trains the others; with
 *       every stored PNG damaged every trajectory is masked and the update still runs.
 * Fails before images were rebuilt: every image segment was masked (m_route = 0), so (a)'s
 * trained-segment count and (b)/(c)'s vision gradient were zero. */
#include <math.h>
#include <sqlite3.h>

#include "learner/update_internal.h"
#include "tests/learner/lhelpers.h"

static char tmp[512], ckpt[600], db[700];

/* Roll out `tasks` shapes tasks x G into a new store (run uid "lt"): short turns and a segment
 * budget below the first observation's context so that continue segments follow the image. */
static void rollout_shapes(const char *dir, int64_t tasks, int64_t G) {
    arl_rollout_config c;
    L_DIE(arl_rollout_config_defaults(&c), "defaults");
    L_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "env", "builtin:shapes", &c),
          "env");
    L_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "run-uid", "lt", &c), "uid");
    c.tasks = tasks;
    c.task_seed = 1;
    c.group_size = G;
    c.turn_tokens = 24;
    c.observation_tokens = 512;
    c.segment_tokens = 1024;
    c.context_tokens = 4096;
    c.trajectory_tokens = 4096;
    c.max_turns = 3;
    c.batch_size = 8;
    c.prefill_chunk = 1024;
    c.progress_s = 0;
    c.seed = 11;
    /* 56-pixel images: 4 x 4 patches, 4 rows per image */
    L_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, "env-options",
                          "{\"size\": 56}", &c),
          "env-options");
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    L_DIE(replay_store_open(dir, &o, &st), "store");
    arl_rollout_worker *w;
    L_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "worker open");
    L_DIE(arl_rollout_worker_run(w), "worker run");
    arl_rollout_worker_close(w);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* The learner of lhelpers.h (lr 1e-3: a step moves the weights visibly) over the final groups
 * of run "lt" in store dir: one update n per call of run(). */
typedef struct img_run {
    lh_learner h;
    arl_update_source src;
    int64_t gids[256];
} img_run;

/* device: learner.device (NULL: cpu) */
static void run_open_on(img_run *r, const char *dir, int32_t minibatches, const char *device) {
    memset(r, 0, sizeof *r);
    const int64_t ng = lh_plan(dir, 0, 64, r->gids);
    CHECK(ng > 0);
    lh_opts lo = {.device = device};
    L_DIE(lh_learner_try_open(&r->h, ckpt, NULL, minibatches, ng * 2, NULL, &lo), "learner");
    r->src.root = dir;
    r->src.group_ids = r->gids;
    r->src.n_groups = ng;
    replay_open_opts o = {0};
    L_DIE(replay_store_open(dir, &o, &r->src.store), "store");
}

static void run_open(img_run *r, const char *dir, int32_t minibatches) {
    run_open_on(r, dir, minibatches, NULL);
}

static char *run_update(img_run *r, int64_t n) {
    arl_update_result res;
    L_DIE(arl_learner_update(r->h.l, n, &r->src, 1, &res), "update");
    return res.metrics_json;
}

static void run_close(img_run *r) {
    replay_store_close(r->src.store);
    lh_learner_close(&r->h);
}

/* max |x - y| over the action tokens of segment s */
static double seg_maxdiff(const arl_upd_seg *s, const double *x, const double *y) {
    double m = 0;
    for (int64_t p = 0; p < s->T; p++)
        if (s->amask[p] && fabs(x[p] - y[p]) > m) m = fabs(x[p] - y[p]);
    return m;
}

/* 1 when two runs ended with the same bits: weights and both AdamW moments. */
static int same_end(const img_run *a, const img_run *b) {
    const size_t bytes = sizeof(float) * (size_t)a->h.params.inv.arena_floats;
    return !memcmp(a->h.params.arena, b->h.params.arena, bytes) &&
           !memcmp(a->h.opt.m_arena, b->h.opt.m_arena, bytes) &&
           !memcmp(a->h.opt.v_arena, b->h.opt.v_arena, bytes);
}

static void drop_cache(void *ctx, arl_learner *l) {
    (void)ctx;
    arl_state_cache_clear(arl_learner_cache(l));
}

/* (a) */
static void test_logprobs(void) {
    for (int recompute = 0; recompute < 2; recompute++) {
        img_run r;
        run_open(&r, db, 1);
        if (recompute) arl_learner_set_hook(r.h.l, drop_cache, NULL);
        char *mj = run_update(&r, 0);
        const arl_update_batch *b = arl_learner_batch(r.h.l);
        int64_t img_trajs = 0, img_segs = 0, prefix_segs = 0, checked = 0;
        double d_old = 0, d_theta = 0;
        for (int32_t i = 0; i < b->n_trajs; i++) {
            const arl_upd_traj *t = &b->trajs[i];
            if (!t->valid) continue;
            CHECK_MSG(!t->media_bad, "%s: %s", t->row.traj_uid, t->media_error);
            if (!t->media) continue;
            img_trajs++;
            int seen_image = 0;
            for (int32_t j = 0; j < t->n_segs; j++) {
                const arl_upd_seg *s = &b->segs[t->seg0 + j];
                img_segs += s->has_media;
                prefix_segs += seen_image && !s->fresh; /* its prefix holds an image */
                seen_image |= s->has_media;
                /* every segment of an image-bearing trajectory is trained now */
                CHECK_MSG(s->mk.m_route == 1, "%s segment %d masked", t->row.traj_uid,
                          s->seg_index);
                const double a = seg_maxdiff(s, s->lp_old, s->lp_mu);
                const double g = seg_maxdiff(s, s->lp_theta, s->lp_old);
                if (a > d_old) d_old = a;
                if (s->mk.m && g > d_theta) d_theta = g;
                checked += s->n_action;
            }
        }
        fprintf(stderr,
                "  %s: %lld image trajectories, %lld segments with images, %lld continuing "
                "after one, %lld action tokens: max |l_old - l_mu| %.3g, max |l_theta - l_old| "
                "%.3g; hit_frac %g, recompute_tokens %g\n",
                recompute ? "prefixes recomputed" : "cached states", (long long)img_trajs,
                (long long)img_segs, (long long)prefix_segs, (long long)checked, d_old, d_theta,
                lh_metric(mj, "state/hit_frac"), lh_metric(mj, "state/recompute_tokens"));
        CHECK(img_trajs == b->n_valid && img_trajs > 0);
        CHECK(img_segs > 0 && prefix_segs > 0 && checked > 0);
        /* The rollout prefilled the image rows and decoded token by token, the learner feeds
         * whole segments in packed batches: fp32 sums of other orders (spec/policy.md 16.4,
         * measured ~1e-6).  1e-3 nats is far below a wrong or missing image row (0.1 and more,
         * see test_lost_images) or a wrong state. */
        CHECK_MSG(d_old < 1e-3, "max |l_old - l_mu| = %g", d_old);
        /* the gradient pass of the only minibatch runs at the weights of the pi_old pass */
        CHECK_MSG(d_theta < 1e-3, "max |l_theta - l_old| = %g", d_theta);
        if (recompute)
            CHECK(lh_metric(mj, "state/recompute_tokens") > 0);
        else
            CHECK(lh_metric(mj, "state/hit_frac") == 1);
        CHECK_MSG(lh_metric(mj, "mask/route_frac") == 0, "mask/route_frac %g",
                  lh_metric(mj, "mask/route_frac"));
        free(mj);
        run_close(&r);
    }
}

/* The vision tower's and projector's tensors of a params view, (pointer, length). */
static int vision_tensors(const arl_model_params *p, const arl_model_config *cfg, float **v,
                          int64_t *n, const char **names) {
    const arl_model_dims *dm = &cfg->dims;
    const int64_t D = dm->vD, Q = dm->vQ, pp = dm->vp, d = dm->d;
    int k = 0;
    names[k] = "patch_embed", v[k] = p->vision.patch_embed, n[k++] = D * 3 * pp * pp;
    names[k] = "blocks.0.wqkv", v[k] = p->vision.blocks[0].wqkv, n[k++] = 3 * Q * D;
    names[k] = "final_norm", v[k] = p->vision.final_norm, n[k++] = D;
    names[k] = "proj2", v[k] = p->vision.proj2, n[k++] = d * 4 * D;
    return k;
}

typedef struct fd_ctx {
    int done, n_checked;
    double vision_abs; /* sum |g| over the vision tensors */
} fd_ctx;

/* (b) on minibatch 0, before its optimizer step */
static void fd_hook(void *ctx, arl_learner *l, int32_t mb, const arl_model_params *grads) {
    fd_ctx *c = ctx;
    if (mb != 0 || c->done) return;
    c->done = 1;
    float *gv[8], *pv[8];
    int64_t nv[8];
    const char *names[8];
    const int nt = vision_tensors(grads, l->cfg, gv, nv, names);
    vision_tensors(l->in.params, l->cfg, pv, nv, names);
    for (int k = 0; k < nt; k++) {
        int64_t best = 0;
        for (int64_t i = 0; i < nv[k]; i++) {
            c->vision_abs += fabs(gv[k][i]);
            if (fabs(gv[k][i]) > fabs(gv[k][best])) best = i;
        }
        const double g = gv[k][best];
        const float x0 = pv[k][best];
        /* h: large enough that the loss change (2 h g) stands far above the fp32 rounding
         * of the loss (~1e-7 relative), small enough that the second-order error (h^2 g'')
         * stays below the tolerance */
        const double h = 1e-2 * (fabs(x0) > 1 ? fabs(x0) : 1);
        double lp = 0, lm = 0;
        pv[k][best] = (float)(x0 + h);
        const double hp = (double)pv[k][best] - x0;
        L_DIE(arl_learner_minibatch_loss(l, 0, &lp), "loss +h");
        pv[k][best] = (float)(x0 - h);
        const double hm = x0 - (double)pv[k][best];
        L_DIE(arl_learner_minibatch_loss(l, 0, &lm), "loss -h");
        pv[k][best] = x0;
        const double fd = (lp - lm) / (hp + hm);
        /* restore the segments' lp_theta of the unperturbed weights (nothing else changed) */
        double l0;
        L_DIE(arl_learner_minibatch_loss(l, 0, &l0), "loss");
        fprintf(stderr, "  d loss / d %s[%lld]: backward %.6g, finite difference %.6g\n", names[k],
                (long long)best, g, fd);
        /* fp32 forwards: the loss difference carries the fp32 rounding of every term and the
         * curvature term (measured: agreement to 3e-4 relative); 1% of the gradient, plus a
         * floor of 1e-8 for tiny entries, still tells a right gradient from a wrong one (a
         * missing, misplaced or unscaled row term is off by 100% or more) */
        CHECK_MSG(fabs(fd - g) <= 1e-2 * fabs(g) + 1e-8, "%s: backward %g, fd %g", names[k], g, fd);
        c->n_checked++;
    }
}

/* The plain CPU run (two minibatches, no hook) of test_train and test_train_device: made by the
 * first that needs it (it stays where it is made: the learner holds pointers into it). */
static img_run g_plain;
static int g_plain_open;

static img_run *plain_run(void) {
    if (!g_plain_open) {
        run_open(&g_plain, db, 2);
        g_plain_open = 1;
        free(run_update(&g_plain, 0));
    }
    return &g_plain;
}

/* (b) and (c): two runs of the same update (two minibatches: the second step encodes the
 * images under the weights of the first), the first with the finite-difference hook, which
 * must leave no trace: both end bit-identical */
static void test_train(void) {
    img_run r[1]; /* the run with the hook (the plain one: plain_run()) */
    fd_ctx c = {0};
    run_open(&r[0], db, 2);
    arl_learner_set_grad_hook(r[0].h.l, fd_hook, &c);
    free(run_update(&r[0], 0));
    CHECK(c.done && c.n_checked == 4);
    CHECK(c.vision_abs > 0);
    CHECK(same_end(&r[0], plain_run()));
    const arl_model_params *p = &r[0].h.params;
    /* the vision tensors moved, and their first moments hold the gradients they received */
    arl_model_params w0;
    L_DIE(arl_model_params_alloc(&w0, &r[0].h.cfg), "params");
    L_DIE(arl_checkpoint_load(ckpt, &r[0].h.cfg, &w0), "load");
    float *a[8], *b0[8], *m[8];
    int64_t n[8];
    const char *names[8];
    const int nt = vision_tensors(p, &r[0].h.cfg, a, n, names);
    vision_tensors(&w0, &r[0].h.cfg, b0, n, names);
    vision_tensors(&r[0].h.opt.m, &r[0].h.cfg, m, n, names);
    for (int k = 0; k < nt; k++) {
        double dw = 0, mm = 0;
        for (int64_t i = 0; i < n[k]; i++) {
            if (fabs((double)a[k][i] - b0[k][i]) > dw) dw = fabs((double)a[k][i] - b0[k][i]);
            if (fabs(m[k][i]) > mm) mm = fabs(m[k][i]);
        }
        fprintf(stderr, "  %s: max |change| %.3g, max |adam m| %.3g\n", names[k], dw, mm);
        CHECK_MSG(dw > 0 && mm > 0, "%s not trained", names[k]);
    }
    arl_model_params_free(&w0);
    run_close(&r[0]);
}

/* the learner on a device (learner.device cpu-device: the device code over host memory) trains
 * the same update to the same bits: image rows encoded on the host, placed by the device
 * forward, their gradient back from the device backward into the vision tower's */
static void test_train_device(void) {
    img_run d;
    run_open_on(&d, db, 2, "cpu-device");
    free(run_update(&d, 0));
    CHECK(same_end(plain_run(), &d));
    run_close(&d);
}

/* (d) the create call of one trajectory (its first observation, which holds the image) marked
 * as failed in the worker file: the store no longer explains that trajectory's placeholders */
static const char *lost_uid = "lt/g000000/r0";

static void lose_images(void) {
    replay_store *st;
    replay_open_opts o = {0};
    L_DIE(replay_store_open(db, &o, &st), "store");
    replay_traj_row row;
    L_DIE(replay_traj_get(st, lost_uid, &row), "traj");
    replay_store_close(st);
    char path[800];
    snprintf(path, sizeof path, "%s/shards/w1.sqlite", db);
    sqlite3 *h;
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    char sql[200];
    snprintf(sql, sizeof sql,
             "UPDATE env_calls SET error_code = 'TEST_LOST' WHERE traj_id = %lld AND "
             "endpoint = 'create'",
             (long long)row.traj_id);
    CHECK(sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK);
    CHECK_EQ_INT(sqlite3_changes(h), 1);
    sqlite3_close(h);
}

static void test_lost_images(void) {
    lose_images();
    img_run r;
    run_open(&r, db, 1);
    char *mj = run_update(&r, 0); /* not an error: the trajectory is masked */
    const arl_update_batch *b = arl_learner_batch(r.h.l);
    int found = 0;
    int64_t trained = 0;
    for (int32_t i = 0; i < b->n_trajs; i++) {
        const arl_upd_traj *t = &b->trajs[i];
        if (!t->valid) continue;
        const int lost = !strcmp(t->row.traj_uid, lost_uid);
        CHECK_EQ_INT(t->media_bad, lost);
        if (lost) {
            found = 1;
            fprintf(stderr, "  %s: %s\n", t->row.traj_uid, t->media_error);
            CHECK(strstr(t->media_error, "image placeholders") != NULL);
            double d = 0;
            for (int32_t j = 0; j < t->n_segs; j++) {
                const arl_upd_seg *s = &b->segs[t->seg0 + j];
                CHECK_EQ_INT(s->mk.m, 0);
                CHECK(s->media_idx == NULL);
                const double x = seg_maxdiff(s, s->lp_old, s->lp_mu);
                if (x > d) d = x;
            }
            /* placeholders fed as plain tokens: the comparison of (a) would see it */
            fprintf(stderr, "  without its image row: max |l_old - l_mu| %.3g\n", d);
            CHECK(d > 1e-2);
        } else {
            for (int32_t j = 0; j < t->n_segs; j++)
                trained += b->segs[t->seg0 + j].mk.m;
        }
    }
    CHECK(found);
    CHECK(trained > 0);
    CHECK(isfinite(lh_metric(mj, "loss/total")));
    free(mj);
    run_close(&r);
}

/* (d) every stored PNG damaged (a valid signature, then nothing): the loader's error masks
 * every image-bearing trajectory, and the update still runs */
static void test_damaged_images(void) {
    char path[800];
    snprintf(path, sizeof path, "%s/shards/w1.sqlite", db);
    sqlite3 *h;
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, "UPDATE images SET png = x'89504E470D0A1A0A'", NULL, NULL, NULL) ==
          SQLITE_OK);
    CHECK(sqlite3_changes(h) > 0);
    sqlite3_close(h);
    img_run r;
    run_open(&r, db, 1);
    char *mj = run_update(&r, 0);
    const arl_update_batch *b = arl_learner_batch(r.h.l);
    int64_t masked = 0;
    for (int32_t i = 0; i < b->n_trajs; i++) {
        const arl_upd_traj *t = &b->trajs[i];
        if (!t->valid) continue;
        CHECK(t->media_bad);
        masked += t->media_bad;
        for (int32_t j = 0; j < t->n_segs; j++)
            CHECK_EQ_INT(b->segs[t->seg0 + j].mk.m, 0);
    }
    fprintf(stderr, "  %lld trajectories masked, e.g. %s\n", (long long)masked,
            b->n_trajs ? b->trajs[0].media_error : "");
    CHECK(masked == b->n_valid && masked > 0);
    CHECK(lh_metric(mj, "mask/route_frac") == 1);
    free(mj);
    run_close(&r);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-images"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    lh_make_ckpt(ckpt, 3);
    rollout_shapes(db, 2, 2);
    /* AddressSanitizer runs an update about 4x slower: there one update, which loads,
     * masks, encodes and trains (the vision backward included) through the same code */
#if defined(__SANITIZE_ADDRESS__)
    const int sanitized = 1;
    fprintf(stderr, "  (sanitizer build: (d) only; (a)-(c) run in the Release pass)\n");
#else
    const int sanitized = 0;
#endif
    if (!sanitized) {
        TEST_RUN(test_logprobs);
        TEST_RUN(test_train);
        TEST_RUN(test_train_device);
        if (g_plain_open) run_close(&g_plain);
    }
    TEST_RUN(test_lost_images); /* these two change the store */
    if (!sanitized) TEST_RUN(test_damaged_images);
    return test_finish();
}
