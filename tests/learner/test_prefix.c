/* tests/learner/test_prefix.c: the learner option shared-prefix (learner/update.h "Shared prompt
 * prefix") on trajectories the tiny model rolled out against the calculator environment (two
 * groups of 4 whose members share the ~550-token prompt, with continue segments, plus a group
 * of one member in a second store, which has no one to share with and is fed whole):
 *   (a) pi_old and reference log-probabilities, entropies, the router agreement and the loss
 *       with sharing equal those of whole-segment forwards (sharing off) up to fp32 rounding;
 *       the prefix is found where expected (every member of the two groups uses it, the
 *       single member does not), and cached start states still serve every continue segment;
 *   (b) the gradient with sharing is the gradient of the loss with the prefix's state held
 *       fixed (imported, no gradient into it, as at a segment boundary): finite differences of
 *       arl_learner_minibatch_loss, which starts from the prefix state of the running step,
 *       match the backward on the largest gradient entries;
 *   (c) two runs with sharing end bit-identical (the first with (b)'s finite differences in
 *       between, which must leave no trace).
 * Fails without the option's code: (a)'s user counts are 0 and no tokens are saved. */
#include <math.h>

#include "learner/update_internal.h"
#include "tests/learner/lhelpers.h"

static char tmp[512], ckpt[600], ref_ckpt[600], db1[700], db2[700];
static int64_t gids1[16], gids2[16], ng1, ng2;

/* log-probs after the score passes of one run, per action token in batch order */
typedef struct px_rec {
    double *lp_old, *lp_ref, *ent;
    int64_t n;
    double loss0; /* minibatch 0's loss at the weights of its step (grad hook) */
    int n_fd;
    double fd_worst; /* max |fd - g| / (|g| + 1e-8 / 1e-2) */
    int do_fd;
} px_rec;

static void rec_hook(void *ctx, arl_learner *l) {
    px_rec *r = ctx;
    const arl_update_batch *b = arl_learner_batch(l);
    int64_t n = 0;
    for (int32_t i = 0; i < b->n_segs; i++)
        if (b->segs[i].tokens) n += b->segs[i].T;
    r->lp_old = calloc((size_t)n + 1, sizeof(double));
    r->lp_ref = calloc((size_t)n + 1, sizeof(double));
    r->ent = calloc((size_t)n + 1, sizeof(double));
    for (int32_t i = 0; i < b->n_segs; i++) {
        const arl_upd_seg *s = &b->segs[i];
        if (!s->tokens) continue;
        for (int64_t t = 0; t < s->T; t++)
            if (s->amask[t]) {
                r->lp_old[r->n] = s->lp_old[t];
                r->lp_ref[r->n] = s->lp_ref[t];
                r->ent[r->n] = s->entropy[t];
                r->n++;
            }
    }
}

static void grad_hook(void *ctx, arl_learner *l, int32_t mb, const arl_model_params *g) {
    px_rec *r = ctx;
    if (mb != 0) return;
    L_DIE(arl_learner_minibatch_loss(l, 0, &r->loss0), "loss");
    if (!r->do_fd) return;
    /* the 3 largest gradient entries of the whole parameter arena */
    arl_model_params *p = l->in.params;
    const int64_t nf = p->inv.arena_floats;
    int64_t top[3] = {-1, -1, -1};
    for (int64_t i = 0; i < nf; i++) {
        const double a = fabs((double)g->arena[i]);
        for (int k = 0; k < 3; k++)
            if (top[k] < 0 || a > fabs((double)g->arena[top[k]])) {
                for (int j = 2; j > k; j--)
                    top[j] = top[j - 1];
                top[k] = i;
                break;
            }
    }
    for (int k = 0; k < 3; k++) {
        const int64_t i = top[k];
        const float x0 = p->arena[i];
        const double gi = (double)g->arena[i];
        /* a step that moves the loss well above its fp32 rounding but keeps the curvature
         * term small: 1e-3 of the entry's size, at least 1e-3 */
        const float h = fmaxf(1e-3f * fabsf(x0), 1e-3f);
        double lp, lm, l0;
        p->arena[i] = x0 + h;
        const double hp = (double)p->arena[i] - x0;
        L_DIE(arl_learner_minibatch_loss(l, 0, &lp), "loss +h");
        p->arena[i] = x0 - h;
        const double hm = x0 - (double)p->arena[i];
        L_DIE(arl_learner_minibatch_loss(l, 0, &lm), "loss -h");
        p->arena[i] = x0;
        L_DIE(arl_learner_minibatch_loss(l, 0, &l0), "loss"); /* restores lp_theta */
        const double fd = (lp - lm) / (hp + hm);
        const double rel = fabs(fd - gi) / (fabs(gi) + 1e-6);
        fprintf(stderr, "  d loss / d arena[%lld]: backward %.6g, finite difference %.6g\n",
                (long long)i, gi, fd);
        if (rel > r->fd_worst) r->fd_worst = rel;
        r->n_fd++;
    }
}

typedef struct px_run {
    lh_learner h;
    replay_store *st1, *st2;
    arl_update_result res;
    px_rec rec;
} px_run;

static void run_update(px_run *r, int shared, int do_fd) {
    memset(r, 0, sizeof *r);
    lh_learner_open_px(&r->h, ckpt, ref_ckpt, 2, 9, NULL, shared);
    r->rec.do_fd = do_fd;
    arl_learner_set_hook(r->h.l, rec_hook, &r->rec);
    arl_learner_set_grad_hook(r->h.l, grad_hook, &r->rec);
    replay_open_opts o = {0};
    L_DIE(replay_store_open(db1, &o, &r->st1), "store 1");
    L_DIE(replay_store_open(db2, &o, &r->st2), "store 2");
    arl_update_source src[2] = {
        {.store = r->st1, .root = db1, .group_ids = gids1, .n_groups = ng1},
        {.store = r->st2, .root = db2, .group_ids = gids2, .n_groups = ng2}};
    L_DIE(arl_learner_update(r->h.l, 0, src, 2, &r->res), "update");
}

static void run_close(px_run *r) {
    free(r->res.metrics_json);
    free(r->rec.lp_old);
    free(r->rec.lp_ref);
    free(r->rec.ent);
    lh_learner_close(&r->h);
    replay_store_close(r->st1);
    replay_store_close(r->st2);
}

static double max_diff(const double *a, const double *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(a[i] - b[i]) > w) w = fabs(a[i] - b[i]);
    return w;
}

static void test_prefix(void) {
    /* Under the sanitizers (CI's ASan+UBSan pass) one update with sharing and the checks of
     * (a): the shared-prefix code runs under ASan/UBSan in a few minutes; the comparisons with
     * whole-trajectory updates, the finite differences and the repeat run (three updates, 38
     * minutes under ASan on this machine) run in the Release pass. */
#ifdef ARL_SANITIZE
    const int sanitized = 1;
#else
    const int sanitized = 0;
#endif
    px_run off, on, on2;
    if (!sanitized) run_update(&off, 0, 0);
    run_update(&on, 1, !sanitized);
    if (!sanitized) run_update(&on2, 1, 0);
    const char *mn = on.res.metrics_json;
    const arl_update_batch *b = arl_learner_batch(on.h.l);
    /* (a) where the prefix is: all 8 members of the two groups, not the lone member */
    int32_t users = 0, lone = 0, cont = 0;
    int64_t P = 0;
    for (int32_t i = 0; i < b->n_trajs; i++) {
        const arl_upd_traj *t = &b->trajs[i];
        if (!t->valid) continue;
        const arl_upd_seg *s = &b->segs[t->seg0];
        if (b->groups[t->group].n_trajs == 1) lone += s->shared_start == 0;
        if (s->shared_start > 0) {
            users++;
            P = s->shared_start;
        }
        for (int32_t j = 1; j < t->n_segs; j++)
            cont += !b->segs[t->seg0 + j].fresh;
    }
    fprintf(stderr,
            "  %d trajectories start from a shared prefix of %lld tokens; saved %g tokens per "
            "pass; %d continue segments\n",
            users, (long long)P, lh_metric(mn, "state/shared_prefix_saved_tokens"), cont);
    CHECK_EQ_INT(users, 8);
    CHECK_EQ_INT(lone, 1);
    CHECK(P >= 64);
    CHECK(cont > 0);
    CHECK(lh_metric(mn, "state/shared_prefix_trajs") == 8);
    CHECK(lh_metric(mn, "state/shared_prefix_saved_tokens") > 0);
    CHECK(lh_metric(mn, "state/hit_frac") == 1);
    CHECK(on.rec.n > 0 && isfinite(on.rec.loss0));
    if (sanitized) {
        fprintf(stderr, "  (sanitizer build: (a) only; the comparisons run in the Release pass)\n");
        run_close(&on);
        return;
    }
    const char *mo = off.res.metrics_json;
    CHECK(lh_metric(mo, "state/shared_prefix_trajs") == 0);
    /* log-probs of pi_old and the reference and pi_old's entropy: the same computation in
     * another chunking and batch composition (fp32, spec/policy.md 16.4; measured below
     * ~1e-6): 1e-4 nats, while a wrong state, position or route is off by 0.1-10 nats */
    CHECK_EQ_INT(on.rec.n, off.rec.n);
    CHECK(on.rec.n > 0);
    const double d_old = max_diff(on.rec.lp_old, off.rec.lp_old, on.rec.n);
    const double d_ref = max_diff(on.rec.lp_ref, off.rec.lp_ref, on.rec.n);
    const double d_ent = max_diff(on.rec.ent, off.rec.ent, on.rec.n);
    fprintf(stderr,
            "  %lld action tokens: |shared - whole| max %.3g (pi_old), %.3g (reference), %.3g "
            "(entropy)\n",
            (long long)on.rec.n, d_old, d_ref, d_ent);
    CHECK(d_old < 1e-4);
    CHECK(d_ref < 1e-4);
    CHECK(d_ent < 1e-4);
    /* the same statistics; the router agreement counted once per user on the prefix */
    CHECK_CLOSE(lh_metric(mn, "kl/k3"), lh_metric(mo, "kl/k3"), 1e-7, 1e-3);
    CHECK_CLOSE(lh_metric(mn, "moe/router_agreement/overlap"),
                lh_metric(mo, "moe/router_agreement/overlap"), 1e-4, 0);
    CHECK(lh_metric(mn, "mismatch/abs_logratio/mean") < 1e-3);
    /* the loss of minibatch 0 (the forward from the imported prefix state) */
    fprintf(stderr, "  minibatch 0 loss: shared %.9g, whole %.9g\n", on.rec.loss0,
            off.rec.loss0);
    CHECK_CLOSE(on.rec.loss0, off.rec.loss0, 1e-9, 1e-4);
    /* (b) finite differences of the loss with the prefix state held: fp32 forwards, the loss
     * difference carries their rounding and the curvature term; 1% of the gradient (measured
     * agreement well below) tells the stop-gradient gradient from a wrong one */
    fprintf(stderr, "  finite differences: %d entries, worst relative difference %.3g\n",
            on.rec.n_fd, on.rec.fd_worst);
    CHECK_EQ_INT(on.rec.n_fd, 3);
    CHECK(on.rec.fd_worst < 1e-2);
    /* (c) bit-identical runs (the finite differences of the first left no trace) */
    const arl_model_params *p = &on.h.params, *q = &on2.h.params;
    CHECK(!memcmp(p->arena, q->arena, sizeof(float) * (size_t)p->inv.arena_floats));
    CHECK(!memcmp(on.h.opt.m_arena, on2.h.opt.m_arena,
                  sizeof(float) * (size_t)p->inv.arena_floats));
    CHECK(!memcmp(on.h.opt.v_arena, on2.h.opt.v_arena,
                  sizeof(float) * (size_t)p->inv.arena_floats));
    /* and the weights moved */
    double dmax = 0;
    for (int64_t i = 0; i < p->inv.arena_floats; i++) {
        double d = fabs((double)p->arena[i] - (double)off.h.ref.arena[i]);
        if (d > dmax) dmax = d;
    }
    CHECK(dmax > 0);
    fprintf(stderr, "  time: pi_old %.2f s / %.2f s, ref %.2f s / %.2f s, grad %.2f s / %.2f s "
            "(shared / whole)\n",
            lh_metric(mn, "time/pi_old_pass_s"), lh_metric(mo, "time/pi_old_pass_s"),
            lh_metric(mn, "time/ref_pass_s"), lh_metric(mo, "time/ref_pass_s"),
            lh_metric(mn, "time/grad_s"), lh_metric(mo, "time/grad_s"));
    run_close(&off);
    run_close(&on);
    run_close(&on2);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-prefix"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(ref_ckpt, sizeof ref_ckpt, "%s/ref", tmp);
    snprintf(db1, sizeof db1, "%s/db1", tmp);
    snprintf(db2, sizeof db2, "%s/db2", tmp);
    lh_make_ckpt(ckpt, 3);
    lh_make_ckpt(ref_ckpt, 4);
    lh_rollout(db1, ckpt, 2, 4, 0);
    lh_rollout(db2, ckpt, 1, 1, 7);
    ng1 = lh_plan(db1, 0, 2, gids1);
    ng2 = lh_plan(db2, 0, 1, gids2);
    CHECK_EQ_INT(ng1, 2);
    CHECK_EQ_INT(ng2, 1);
    TEST_RUN(test_prefix);
    return test_finish();
}
