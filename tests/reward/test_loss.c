/* The policy loss (learner/loss.h) beyond the worked example: a float64 finite-difference check
 * of d loss / d l_theta, the masks (staleness, routes, band, segment), the normalisers and the
 * minibatch scale, input errors, the p99 histogram and accumulator merging. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "learner/loss.h"
#include "tests/test.h"

#define T 48

typedef struct seg {
    uint8_t mask[T];
    double mu[T], old[T], th[T], ref[T], adv[T];
    uint32_t ver[T];
    int32_t turn[T];
    arl_loss_seg s;
} seg;

/* A realistic segment: a quarter context tokens (NaN log-probs), behaviour/old mismatch
 * mostly small with a few large outliers (band-masked, or truncated at C), l_theta within
 * +-0.6 of l_old so that some tokens clip on either side. */
static void seg_random(seg *g, arl_rng *r, const arl_loss_params *p, double inv_norm) {
    memset(g, 0, sizeof *g);
    for (int t = 0; t < T; t++) {
        g->ver[t] = (uint32_t)p->update_n;
        g->turn[t] = 1 + t / 12;
        if (arl_rng_below(r, 4) == 0) {
            g->mu[t] = g->old[t] = g->th[t] = g->ref[t] = g->adv[t] = NAN;
            continue;
        }
        g->mask[t] = 1;
        g->old[t] = -0.05 - 3 * arl_rng_uniform(r);
        double d = 0.05 * arl_rng_normal(r);
        if (arl_rng_below(r, 10) == 0) d = arl_rng_below(r, 2) ? 2.0 : 0.5; /* outliers */
        g->mu[t] = g->old[t] - d;
        double lo = 1 - p->cfg.eps_low, hi = 1 + p->cfg.eps_high, rho;
        do { /* stay 1e-3 away from the kinks of the clipped objective */
            g->th[t] = g->old[t] + 0.6 * (2 * arl_rng_uniform(r) - 1);
            rho = exp(g->th[t] - g->old[t]);
        } while (fabs(rho - lo) < 1e-3 || fabs(rho - hi) < 1e-3);
        g->ref[t] = g->old[t] + 0.1 * arl_rng_normal(r);
        g->adv[t] = arl_rng_normal(r);
    }
    g->s = (arl_loss_seg){.n_tok = T,
                          .loss_mask = g->mask,
                          .lp_mu = g->mu,
                          .lp_old = g->old,
                          .lp_ref = g->ref,
                          .adv = g->adv,
                          .versions = g->ver,
                          .turn = g->turn,
                          .routes_ok = 1,
                          .traj_tokens = 1000,
                          .inv_norm = inv_norm};
}

static arl_loss_params params(double lambda2, int32_t M, int norm_per_traj) {
    arl_loss_config c;
    arl_loss_config_default(&c);
    c.tis_cap = 1.5;   /* outliers d = 0.5: u = e^0.5 = 1.65 > C, truncated */
    c.band = 4.0;      /* outliers d = 2: u = e^2 = 7.4 > c, band-masked */
    c.seg_delta = 1.0; /* keep the segment: the band mask is what this test exercises */
    c.l_norm = 5;
    c.normaliser = norm_per_traj ? ARL_LOSS_NORM_PER_TRAJ : ARL_LOSS_NORM_CONSTANT;
    arl_loss_params p;
    arl_status st = arl_loss_params_init(&p, &c, 8, M, lambda2, 7);
    CHECK(st == ARL_OK);
    return p;
}

static double seg_loss(const arl_loss_params *p, seg *g, const arl_loss_seg_mask *m,
                       const double *th) {
    double l = NAN;
    CHECK(arl_loss_seg_step(p, &g->s, m, th, &l, NULL, NULL) == ARL_OK);
    return l;
}

/* d loss / d l_theta against central differences, float64.  h = 1e-6: truncation error
 * ~h^2 |L'''| ~ 1e-12 and rounding ~1e-16 |L| / h ~ 1e-10, so |fd - g| <= 1e-8 + 1e-6 |g| is
 * met by a right gradient with a wide margin and fails for any wrong factor or branch. */
static void test_fd_gradient(void) {
    arl_rng r;
    arl_rng_seed(&r, 77);
    int n_clipped = 0, n_unclipped = 0, n_masked = 0, n_checked = 0;
    for (int variant = 0; variant < 4; variant++) {
        double lambda2 = variant & 1 ? 0.3 : 0.0;
        int32_t M = variant & 2 ? 4 : 1;
        arl_loss_params p = params(lambda2, M, variant == 3);
        seg g;
        seg_random(&g, &r, &p, 0);
        int64_t na = 0;
        for (int t = 0; t < T; t++)
            na += g.mask[t];
        g.s.inv_norm = arl_loss_inv_norm(&p, 8, na);
        CHECK(g.s.inv_norm > 0);
        arl_loss_seg_mask m;
        CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK);
        CHECK(m.m == 1);
        double grad[T], l0;
        CHECK(arl_loss_seg_step(&p, &g.s, &m, g.th, &l0, grad, NULL) == ARL_OK);
        const double h = 1e-6;
        for (int t = 0; t < T; t++) {
            if (!g.mask[t]) {
                CHECK(grad[t] == 0.0);
                continue;
            }
            double th[T];
            memcpy(th, g.th, sizeof th);
            th[t] = g.th[t] + h;
            double lp = seg_loss(&p, &g, &m, th);
            th[t] = g.th[t] - h;
            double lm = seg_loss(&p, &g, &m, th);
            double fd = (lp - lm) / (2 * h);
            CHECK_MSG(fabs(fd - grad[t]) <= 1e-8 + 1e-6 * fabs(grad[t]),
                      "variant %d token %d: fd %.12g analytic %.12g", variant, t, fd, grad[t]);
            n_checked++;
            arl_loss_token k;
            arl_loss_token_eval(&p, g.mu[t], g.old[t], g.th[t], g.ref[t], g.adv[t], 1, &k);
            if (!k.m) {
                n_masked++;
                CHECK(grad[t] == 0.0);
            } else if (k.clipped) {
                n_clipped++;
            } else {
                n_unclipped++;
            }
        }
    }
    /* every branch was exercised */
    CHECK(n_clipped >= 5 && n_unclipped >= 20 && n_masked >= 1);
    fprintf(stderr, "  fd: %d tokens (%d clipped, %d unclipped, %d band-masked)\n", n_checked,
            n_clipped, n_unclipped, n_masked);
}

static void test_minibatch_scale_and_normalisers(void) {
    arl_rng r;
    arl_rng_seed(&r, 5);
    arl_loss_params p1 = params(0.2, 1, 0), p4 = params(0.2, 4, 0);
    CHECK(p1.z == 40); /* N_traj 8 * L_norm 5 */
    CHECK(arl_loss_inv_norm(&p1, 3, 100) == 1.0 / 40);
    arl_loss_params pt = params(0.2, 1, 1);
    CHECK(arl_loss_inv_norm(&pt, 3, 100) == 1.0 / 300);
    CHECK(arl_loss_inv_norm(&pt, 3, 0) == 0.0);
    seg g;
    seg_random(&g, &r, &p1, 1.0 / 40);
    arl_loss_seg_mask m;
    CHECK(arl_loss_seg_prepare(&p1, &g.s, &m, NULL) == ARL_OK);
    arl_loss_acc a1, a4;
    arl_loss_acc_init(&a1);
    arl_loss_acc_init(&a4);
    double l1, l4, g1[T], g4[T];
    CHECK(arl_loss_seg_step(&p1, &g.s, &m, g.th, &l1, g1, &a1) == ARL_OK);
    CHECK(arl_loss_seg_step(&p4, &g.s, &m, g.th, &l4, g4, &a4) == ARL_OK);
    /* an optimizer step divides by Z / M: 4x the objective and gradient; the logged section
     * 8.3 value is the same */
    CHECK_CLOSE(l4, 4 * l1, 1e-15, 1e-14);
    for (int t = 0; t < T; t++)
        CHECK_CLOSE(g4[t], 4 * g1[t], 1e-15, 1e-14);
    CHECK(a1.sum[ARL_LACC_PG] == a4.sum[ARL_LACC_PG] && a1.sum[ARL_LACC_K2] == a4.sum[ARL_LACC_K2]);
    CHECK_CLOSE(-a1.sum[ARL_LACC_PG] + a1.sum[ARL_LACC_K2], l1, 1e-15, 1e-14);
    /* rho = 1 everywhere (theta = old), no clipping: L = -(1/Z) sum m w A + lambda2 ... */
    double sum = 0, k2 = 0;
    for (int t = 0; t < T; t++) {
        if (!g.mask[t]) continue;
        arl_loss_token k;
        arl_loss_token_eval(&p1, g.mu[t], g.old[t], g.old[t], g.ref[t], g.adv[t], 1, &k);
        CHECK(!k.clipped && k.rho == 1.0);
        sum += k.m * k.w * g.adv[t];
        k2 += k.m * k.w * 0.5 * (g.old[t] - g.ref[t]) * (g.old[t] - g.ref[t]);
    }
    double l;
    CHECK(arl_loss_seg_step(&p1, &g.s, &m, g.old, &l, NULL, NULL) == ARL_OK);
    CHECK_CLOSE(l, (-sum + 0.2 * k2) / 40, 1e-15, 1e-12);
}

static void test_segment_masks(void) {
    arl_rng r;
    arl_rng_seed(&r, 9);
    arl_loss_params p = params(0.1, 1, 0);
    p.cfg.stale_eta = 4;
    seg g;
    seg_random(&g, &r, &p, 1.0 / 40);
    arl_loss_seg_mask m;
    arl_loss_acc acc;
    double l, grad[T];
    /* stale: one action token sampled at version n - 5 */
    int first = 0;
    while (!g.mask[first])
        first++;
    g.ver[first] = (uint32_t)(p.update_n - 5);
    g.s.traj_tokens = 200000; /* bucket < 512K */
    arl_loss_acc_init(&acc);
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, &acc) == ARL_OK);
    CHECK(m.staleness == 5 && !m.m_stale && !m.m);
    CHECK(arl_loss_seg_step(&p, &g.s, &m, g.th, &l, grad, NULL) == ARL_OK);
    CHECK(l == 0.0);
    for (int t = 0; t < T; t++)
        CHECK(grad[t] == 0.0);
    CHECK(acc.sum[ARL_LACC_BUCKET_STALE + 2] == 1 && acc.sum[ARL_LACC_BUCKET_SEGS + 2] == 1);
    CHECK(acc.sum[ARL_LACC_TOTAL_MASKED] == acc.sum[ARL_LACC_ACTION]);
    CHECK(acc.sum[ARL_LACC_MW_REF] == 0);      /* masked tokens carry no KL statistic */
    g.ver[first] = (uint32_t)(p.update_n - 4); /* sigma = eta: kept */
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK && m.m_stale);
    /* a version newer than n is an error */
    g.ver[first] = (uint32_t)(p.update_n + 1);
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_ERR_ARG);
    g.ver[first] = (uint32_t)p.update_n;
    /* routes */
    g.s.routes_ok = 0;
    arl_loss_acc_init(&acc);
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, &acc) == ARL_OK && !m.m && m.m_route == 0);
    CHECK(acc.sum[ARL_LACC_SEG_ROUTE] == 1);
    g.s.routes_ok = 1;
    /* segment geometric mask: shift every behaviour log-prob so that gbar = +0.02 > delta */
    p.cfg.seg_delta = 0.01;
    for (int t = 0; t < T; t++)
        if (g.mask[t]) g.mu[t] = g.old[t] - 0.02;
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK);
    CHECK_CLOSE(m.gbar, 0.02, 1e-15, 0);
    CHECK(!m.m_seg && !m.m);
    for (int t = 0; t < T; t++)
        if (g.mask[t]) g.mu[t] = g.old[t] - 0.01 * (t % 2 ? 1 : -1) * 0.5;
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK && m.m_seg);
    /* band mask: u = e^{1.5} > 4 is removed, e^{1.3} < 4 kept; u = e^{-1.5} < 1/4 removed */
    arl_loss_token k;
    arl_loss_token_eval(&p, -2.5, -1.0, -1.0, -1.0, 1.0, 1, &k);
    CHECK(!k.m_tok && !k.m && k.pg == 0 && k.dpg == 0 && k.truncated && k.w == 1.5);
    arl_loss_token_eval(&p, -2.3, -1.0, -1.0, -1.0, 1.0, 1, &k);
    CHECK(k.m_tok && k.m && k.w == 1.5 && k.truncated);
    arl_loss_token_eval(&p, -1.0, -2.5, -2.5, -1.0, 1.0, 1, &k);
    CHECK(!k.m_tok);
    /* the segment mask switches a token off */
    arl_loss_token_eval(&p, -1.0, -1.0, -1.0, -1.0, 1.0, 0, &k);
    CHECK(k.m_tok && !k.m && k.pg == 0);
}

static void test_errors(void) {
    arl_rng r;
    arl_rng_seed(&r, 3);
    arl_loss_params p = params(0.0, 1, 0);
    seg g;
    seg_random(&g, &r, &p, 1.0 / 40);
    arl_loss_seg_mask m;
    /* NaN at context tokens (as built) is fine; at an action token it is an error */
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK);
    int a = 0;
    while (!g.mask[a])
        a++;
    double keep = g.old[a];
    g.old[a] = NAN;
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "l_old") != NULL);
    g.old[a] = keep;
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, NULL) == ARL_OK);
    double th[T];
    memcpy(th, g.th, sizeof th);
    th[a] = INFINITY;
    double l;
    CHECK(arl_loss_seg_step(&p, &g.s, &m, th, &l, NULL, NULL) == ARL_ERR_ARG);
    /* no reference: fine with lambda2 = 0 (KL statistics skip it), an error otherwise */
    g.s.lp_ref = NULL;
    arl_loss_acc acc;
    arl_loss_acc_init(&acc);
    CHECK(arl_loss_seg_prepare(&p, &g.s, &m, &acc) == ARL_OK);
    CHECK(isnan(arl_loss_acc_kl_hat(&acc)));
    arl_loss_params p2 = params(0.5, 1, 0);
    CHECK(arl_loss_seg_prepare(&p2, &g.s, &m, NULL) == ARL_ERR_ARG);
    /* configuration */
    arl_loss_opts o;
    arl_options_defaults(arl_loss_options, arl_loss_options_count, &o);
    arl_loss_config c, d;
    CHECK(arl_loss_config_from_opts(&o, &c) == ARL_OK);
    arl_loss_config_default(&d);
    /* field by field: memcmp would compare the padding after normaliser (unset bytes of two
     * stack objects; it failed in a ThreadSanitizer build) */
    CHECK(c.eps_low == d.eps_low && c.eps_high == d.eps_high && c.tis_cap == d.tis_cap &&
          c.band == d.band && c.seg_delta == d.seg_delta && c.stale_eta == d.stale_eta &&
          c.normaliser == d.normaliser && c.l_norm == d.l_norm);
    arl_options_free(arl_loss_options, arl_loss_options_count, &o);
    arl_options_defaults(arl_loss_options, arl_loss_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_loss_options, arl_loss_options_count,
                                      "{\"normaliser\": \"per_trajectory_mean\", "
                                      "\"clip_high\": 0.3}",
                                      "t", &o) == ARL_OK);
    CHECK(arl_loss_config_from_opts(&o, &c) == ARL_OK);
    CHECK(c.normaliser == ARL_LOSS_NORM_PER_TRAJ && c.eps_high == 0.3);
    arl_options_free(arl_loss_options, arl_loss_options_count, &o);
    CHECK(arl_loss_params_init(&p, &d, 0, 1, 0, 0) == ARL_ERR_CONFIG);
}

static void check_finite(void *ctx, const char *name, double v) {
    if (!isfinite(v)) {
        fprintf(stderr, "metric %s = %g\n", name, v);
        (*(int *)ctx)++;
    }
}

static void test_stats(void) {
    /* 1000 action tokens with |l_old - l_mu| = 0.001 k, k = 1..1000: exact p99 = 0.99 */
    static uint8_t mask[1000];
    static double mu[1000], old[1000], adv[1000], ent[1000];
    static int32_t turn[1000];
    for (int t = 0; t < 1000; t++) {
        mask[t] = 1;
        old[t] = -1;
        mu[t] = -1 - 0.001 * (t + 1) * (t % 2 ? 1 : -1);
        adv[t] = 0;
        ent[t] = 2.0;
        turn[t] = 1 + t / 50; /* turns 1..20: 16 reported */
    }
    arl_loss_params p = params(0, 1, 0);
    p.cfg.seg_delta = 10;
    arl_loss_seg s = {.n_tok = 1000,
                      .loss_mask = mask,
                      .lp_mu = mu,
                      .lp_old = old,
                      .adv = adv,
                      .entropy = ent,
                      .turn = turn,
                      .routes_ok = 1,
                      .traj_tokens = 1000,
                      .inv_norm = 1.0 / 40};
    arl_loss_seg_mask m;
    arl_loss_acc a, b, whole;
    arl_loss_acc_init(&whole);
    CHECK(arl_loss_seg_prepare(&p, &s, &m, &whole) == ARL_OK);
    double p99 = arl_loss_acc_abs_logratio_p99(&whole);
    /* histogram bins are 10^(1/30) wide: the estimate is the upper edge of the bin holding the
     * exact value */
    CHECK_MSG(p99 >= 0.99 && p99 <= 0.99 * pow(10, 1.0 / 30) && p99 <= 1.0, "p99 %g", p99);
    CHECK_CLOSE(whole.sum[ARL_LACC_TURN_SUM + 0] / whole.sum[ARL_LACC_TURN_N + 0], 0.0255, 1e-12,
                0);
    CHECK(whole.sum[ARL_LACC_ENT_N] == 1000 && whole.sum[ARL_LACC_ENT_SUM] == 2000);
    /* the same tokens split in two segments and merged: same statistics */
    arl_loss_acc_init(&a);
    arl_loss_acc_init(&b);
    arl_loss_seg s1 = s, s2 = s;
    s1.n_tok = 400;
    s2.n_tok = 600;
    s2.loss_mask += 400, s2.lp_mu += 400, s2.lp_old += 400, s2.adv += 400, s2.entropy += 400;
    s2.turn += 400;
    CHECK(arl_loss_seg_prepare(&p, &s1, &m, &a) == ARL_OK);
    CHECK(arl_loss_seg_prepare(&p, &s2, &m, &b) == ARL_OK);
    arl_loss_acc_merge(&a, &b);
    CHECK(a.sum[ARL_LACC_ACTION] == 1000 &&
          a.max[ARL_LACC_MAX_ABS_LR] == whole.max[ARL_LACC_MAX_ABS_LR]);
    CHECK(arl_loss_acc_abs_logratio_p99(&a) == p99);
    CHECK_CLOSE(a.sum[ARL_LACC_ABS_LR], whole.sum[ARL_LACC_ABS_LR], 0, 1e-13);
    for (int i = ARL_LACC_HIST; i < ARL_LACC_HIST + ARL_LOSS_HIST_BINS; i++)
        CHECK(a.sum[i] == whole.sum[i]);
    /* empty accumulator: every metric is 0, none NaN */
    arl_loss_acc e;
    arl_loss_acc_init(&e);
    CHECK(arl_loss_acc_abs_logratio_p99(&e) == 0.0);
    int bad = 0;
    arl_loss_acc_emit(&e, check_finite, &bad);
    CHECK_EQ_INT(bad, 0);
}

int main(void) {
    TEST_RUN(test_fd_gradient);
    TEST_RUN(test_minibatch_scale_and_normalisers);
    TEST_RUN(test_segment_masks);
    TEST_RUN(test_errors);
    TEST_RUN(test_stats);
    return test_finish();
}
