/* The worked example of spec/objective.md section 14, end to end: advantages (14.3), masks,
 * weights and loss terms (14.4), statistics and the controller step (14.5).  Every number the
 * section states is checked.
 *
 * Tolerances.  The spec asks a float64 implementation to match to an absolute error of 1e-9.
 * The printed values are rounded to the digits shown, so a value printed with d decimals is
 * checked with |x - printed| <= 0.5e-d + 1e-9 (CHECK_STATED) when it has 7 or more significant
 * digits (a rounded value); shorter literals and values the spec gives exactly (1, 0.5,
 * 1/10, ...) are checked with 1e-9 (CHECK_EXACT). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "learner/kl_ctl.h"
#include "learner/loss.h"
#include "reward/reward.h"
#include "tests/reward/example.h"
#include "tests/reward/metrics.h"
#include "tests/test.h"

/* A printed value with 7 or more significant digits is a rounded one: allow half a unit of its
 * last digit on top of 1e-9.  Shorter literals ("2", "0.36", "1") are exact values. */
static double stated_tol(const char *lit) {
    const char *dot = strchr(lit, '.');
    int d = dot ? (int)strlen(dot + 1) : 0, sig = 0, lead = 1;
    for (const char *c = lit; *c; c++) {
        if (*c < '0' || *c > '9') continue;
        if (lead && *c == '0') continue;
        lead = 0;
        sig++;
    }
    return (sig >= 7 ? 0.5 * pow(10.0, -d) : 0.0) + 1e-9;
}
#define CHECK_STATED(x, lit) CHECK_CLOSE((x), atof(lit), stated_tol(lit), 0)
#define CHECK_EXACT(x, v) CHECK_CLOSE((x), (v), 1e-9, 0)


static ex_traj E[2];
static ex_out O[2];
static arl_reward_traj TR[2];
static arl_reward_config CFG;
static arl_reward_acc RACC;
static arl_klctl CTL;

static void run_advantages(void) {
    ex_fill(&E[0], 1);
    ex_fill(&E[1], 2);
    ex_config(&CFG);
    arl_kl_config kc;
    arl_kl_config_default(&kc);
    kc.placement = ARL_KL_PLACEMENT_BOTH;
    kc.coef0 = 0.05;
    kc.lambda2 = 0.1;
    kc.target = 0.01;
    kc.horizon = 1000;
    kc.coef_min = 1e-6;
    kc.coef_max = 1.0;
    CHECK(arl_klctl_init(&CTL, &kc) == ARL_OK);
    CHECK_EXACT(arl_klctl_beta(&CTL), 0.05);
    CHECK_EXACT(arl_klctl_lambda2(&CTL), 0.1);
    for (int i = 0; i < 2; i++) {
        CHECK(ex_scan(&E[i]) == ARL_OK);
        ex_bind(&TR[i], &E[i], &O[i]);
    }
    arl_reward_group g = {.n = 2, .trajs = TR};
    arl_reward_acc_init(&RACC);
    CHECK(arl_reward_compute(&CFG, &g, 1, arl_klctl_beta(&CTL), NULL, NULL, &RACC) == ARL_OK);
}

static void test_outcome(void) {
    CHECK_EXACT(TR[0].out.outcome_adv_raw, 1.0);
    CHECK_EXACT(TR[1].out.outcome_adv_raw, -1.0);
    CHECK_EXACT(TR[0].out.outcome_adv, 1.0); /* scope none: A~ = A */
    CHECK_EXACT(TR[1].out.outcome_adv, -1.0);
}

static void test_segment(void) {
    /* (i, s): G, b, A exact; A~ printed */
    CHECK_EXACT(O[0].seg_rtg[0], 1.5);
    CHECK_EXACT(O[0].seg_base[0], 0.5);
    CHECK_EXACT(O[0].seg_adv_raw[0], 1.0);
    CHECK_STATED(O[0].seg_adv[0], "1.264911064");
    CHECK_EXACT(O[0].seg_rtg[1], 1.0);
    CHECK_EXACT(O[0].seg_base[1], 0.5);
    CHECK_EXACT(O[0].seg_adv_raw[1], 0.5);
    CHECK_STATED(O[0].seg_adv[1], "0.632455532");
    CHECK_EXACT(O[1].seg_rtg[0], 0.5);
    CHECK_EXACT(O[1].seg_base[0], 1.5);
    CHECK_EXACT(O[1].seg_adv_raw[0], -1.0);
    CHECK_STATED(O[1].seg_adv[0], "-1.264911064");
    CHECK_EXACT(O[1].seg_rtg[1], 0.5);
    CHECK_EXACT(O[1].seg_base[1], 1.0);
    CHECK_EXACT(O[1].seg_adv_raw[1], -0.5);
    CHECK_STATED(O[1].seg_adv[1], "-0.632455532");
    metrics m = {0};
    arl_reward_acc_emit(&RACC, &CFG, metrics_collect, &m);
    CHECK_STATED(metrics_get(&m, "adv/segment/sigma"), "0.790569415");
    CHECK_EXACT(metrics_get(&m, "adv/segment/sigma"), sqrt(0.625));
}

static void test_process(void) {
    CHECK_EXACT(O[0].proc_rtg[0], 0.65);
    CHECK_EXACT(O[0].proc_base[0], 0.17);
    CHECK_EXACT(O[0].proc_adv_raw[0], 0.48);
    CHECK_STATED(O[0].proc_adv[0], "1.459512766");
    CHECK_EXACT(O[0].proc_rtg[1], 0.5);
    CHECK_EXACT(O[0].proc_base[1], 0.3);
    CHECK_EXACT(O[0].proc_adv_raw[1], 0.2);
    CHECK_STATED(O[0].proc_adv[1], "0.608130319");
    CHECK_EXACT(O[1].proc_rtg[0], 0.17);
    CHECK_EXACT(O[1].proc_base[0], 0.65);
    CHECK_EXACT(O[1].proc_adv_raw[0], -0.48);
    CHECK_STATED(O[1].proc_adv[0], "-1.459512766");
    CHECK_EXACT(O[1].proc_rtg[1], 0.3);
    CHECK_EXACT(O[1].proc_base[1], 0.5);
    CHECK_EXACT(O[1].proc_adv_raw[1], -0.2);
    CHECK_STATED(O[1].proc_adv[1], "-0.608130319");
    CHECK_EXACT(O[1].proc_rtg[2], 0.0);
    CHECK_EXACT(O[1].proc_base[2], 0.0);
    CHECK_EXACT(O[1].proc_adv_raw[2], 0.0);
    CHECK_EXACT(O[1].proc_adv[2], 0.0);
    metrics m = {0};
    arl_reward_acc_emit(&RACC, &CFG, metrics_collect, &m);
    CHECK_STATED(metrics_get(&m, "adv/process/sigma"), "0.328876877");
    CHECK_EXACT(metrics_get(&m, "adv/process/sigma"), sqrt(0.10816));
    /* (2, 3): no other trajectory reached turn 3 -> counted (1 of 5 process entries) */
    CHECK_EXACT(metrics_get(&m, "adv/process_no_baseline_frac"), 1.0 / 5);
    CHECK_EXACT(metrics_get(&m, "adv/segment_no_baseline_frac"), 0.0);
}

static void test_kl_term(void) {
    /* kappa, D, b^D, D - b^D per (i, k) */
    const double kappa[2][3] = {{0.01, 0.10, 0}, {0.05, -0.05, 0.05}};
    const double D[2][3] = {{0.11, 0.10, 0}, {0.05, 0.00, 0.05}};
    const double bD[2][3] = {{0.05, 0.00, 0}, {0.11, 0.10, 0}};
    const double dm[2][3] = {{0.06, 0.10, 0}, {-0.06, -0.10, 0.05}};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < E[i].K; k++) {
            CHECK_EXACT(E[i].turns[k].kappa, kappa[i][k]);
            CHECK_EXACT(O[i].kl_rtg[k], D[i][k]);
            CHECK_EXACT(O[i].kl_base[k], bD[i][k]);
            CHECK_EXACT(O[i].kl_rtg[k] - O[i].kl_base[k], dm[i][k]);
        }
    CHECK_EQ_INT(E[0].turns[0].n_action, 2); /* the end-of-turn token (mask 0) is not counted */
    CHECK_EQ_INT(E[1].turns[2].n_action, 3);
}

static void test_token_advantages(void) {
    CHECK_STATED(O[0].adv_turn[0], "2.359211915");
    CHECK_STATED(O[0].adv_turn[1], "1.615292926");
    CHECK_STATED(O[1].adv_turn[0], "-2.359211915");
    CHECK_STATED(O[1].adv_turn[1], "-1.615292926");
    CHECK_STATED(O[1].adv_turn[2], "-1.318727766");
    /* the formula of section 14.3 with the printed intermediate values */
    CHECK_CLOSE(O[0].adv_turn[0], 1 + 0.5 * 1.264911064 + 0.5 * 1.459512766 - 0.05 * 0.06, 2e-9, 0);
    CHECK_CLOSE(O[1].adv_turn[2], -1 - 0.5 * 0.632455532 + 0 - 0.05 * 0.05, 2e-9, 0);
    /* per token: the turn's value at action tokens, 0 at context and end-of-turn tokens */
    for (int i = 0; i < 2; i++) {
        double adv[11];
        for (int s = 0; s < 2; s++) {
            int o = E[i].seg_start[s];
            CHECK(arl_reward_token_adv(&TR[i], o, E[i].seg_len[s], E[i].mask + o, adv + o) ==
                  ARL_OK);
        }
        for (int t = 0; t < E[i].n_tok; t++) {
            double want = E[i].mask[t] ? O[i].adv_turn[E[i].turn_of[t] - 1] : 0.0;
            CHECK_MSG(adv[t] == want, "traj %d token %d: %g vs %g", i + 1, t, adv[t], want);
        }
    }
    metrics m = {0};
    arl_reward_acc_emit(&RACC, &CFG, metrics_collect, &m);
    /* token statistics over the 10 action tokens */
    double sum = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < E[i].K; k++)
            sum += (double)E[i].turns[k].n_action * O[i].adv_turn[k];
    CHECK_EXACT(metrics_get(&m, "adv/token/mean"), sum / 10);
    CHECK_STATED(metrics_get(&m, "adv/token/max"), "2.359211915");
    CHECK_STATED(metrics_get(&m, "adv/token/min"), "-2.359211915");
    CHECK_EXACT(metrics_get(&m, "rollout/trajectories/complete"), 2);
}

/* Section 14.4 and 14.5. */
static void test_loss_and_controller(void) {
    arl_loss_config lc;
    arl_loss_config_default(&lc);
    lc.eps_low = 0.2, lc.eps_high = 0.28, lc.tis_cap = 2, lc.band = 5, lc.seg_delta = 0.1;
    lc.stale_eta = 4;
    lc.l_norm = 8; /* Z = N_traj L_norm = 2 * 8 = 16 */
    arl_loss_params P;
    CHECK(arl_loss_params_init(&P, &lc, 2, 1, arl_klctl_lambda2(&CTL), 11) == ARL_OK);
    CHECK_EXACT(P.z, 16);
    /* per-segment mean log-ratios and masks */
    const double gbar[2][2] = {{0.005, 0.025}, {0.25, 0.0125}};
    const int mseg[2][2] = {{1, 1}, {0, 1}};
    /* the table of section 14.4, in token order: m_tok, m_seg, w, rho, clipped (0 no, 1 high,
     * -1 low, 9 masked), pg term, k2 term (printed strings) */
    static const struct {
        int mtok, mseg;
        const char *w, *rho;
        int clip;
        const char *pg, *k2;
    } row[10] = {
        {1, 1, "1.02020134", "1.105170918", 0, "2.660004007", "0.014741909"},
        {1, 1, "0.990049834", "0.740818221", 0, "1.730356798", "0.064155229"},
        {1, 1, "2", "1.491824698", 1, "4.13514989", "0.36"},
        {1, 1, "0.427414932", "1", 0, "0.690400316", "0.002137075"},
        {1, 0, "1.349858808", "1.051271096", 9, "0", "0"},
        {1, 0, "1.221402758", "0.951229425", 9, "0", "0"},
        {1, 1, "1.051271096", "0.740818221", -1, "-1.358488612", "0.064390355"},
        {0, 1, "2", "1", 9, "0", "0"},
        {1, 1, "0.40656966", "1.105170918", 0, "-0.592542581", "0.008131393"},
        {1, 1, "0.40656966", "1", 0, "-0.536154699", "0.004573909"},
    };
    const double old_mu[10] = {0.02, -0.01, 0.90, -0.85, 0.30, 0.20, 0.05, 1.80, -0.90, -0.90};
    arl_loss_acc pre, stp;
    arl_loss_acc_init(&pre);
    arl_loss_acc_init(&stp);
    double L = 0;
    int r = 0;
    for (int i = 0; i < 2; i++) {
        for (int s = 0; s < 2; s++) {
            int o = E[i].seg_start[s], n = E[i].seg_len[s];
            double adv[11];
            CHECK(arl_reward_token_adv(&TR[i], o, n, E[i].mask + o, adv) == ARL_OK);
            arl_loss_seg sg = {.n_tok = n,
                               .loss_mask = E[i].mask + o,
                               .lp_mu = E[i].mu + o,
                               .lp_old = E[i].old + o,
                               .lp_ref = E[i].ref + o,
                               .adv = adv,
                               .versions = E[i].ver + o,
                               .turn = E[i].turn_of + o,
                               .routes_ok = 1,
                               .traj_tokens = E[i].n_tok,
                               .inv_norm = arl_loss_inv_norm(&P, 2, 0)};
            arl_loss_seg_mask m;
            CHECK(arl_loss_seg_prepare(&P, &sg, &m, &pre) == ARL_OK);
            CHECK_EXACT(m.gbar, gbar[i][s]);
            CHECK_EQ_INT(m.m_seg, mseg[i][s]);
            CHECK_EQ_INT(m.m_stale, 1);
            CHECK_EQ_INT(m.staleness, 1);
            for (int t = 0; t < n; t++) {
                if (!sg.loss_mask[t]) continue;
                arl_loss_token k;
                arl_loss_token_eval(&P, sg.lp_mu[t], sg.lp_old[t], E[i].th[o + t], sg.lp_ref[t],
                                    adv[t], m.m, &k);
                CHECK_EXACT(sg.lp_old[t] - sg.lp_mu[t], old_mu[r]);
                CHECK_EQ_INT(k.m_tok, row[r].mtok);
                CHECK_EQ_INT(m.m_seg, row[r].mseg);
                CHECK_STATED(k.w, row[r].w);
                CHECK_STATED(k.rho, row[r].rho);
                int clip = !k.m ? 9 : k.clip_high ? 1 : k.clip_low ? -1 : 0;
                CHECK_MSG(clip == row[r].clip, "token row %d: clipped %d, expected %d", r + 1, clip,
                          row[r].clip);
                CHECK_EQ_INT(k.clipped, row[r].clip == 1 || row[r].clip == -1);
                CHECK_STATED(k.pg, row[r].pg);
                CHECK_STATED(k.k2, row[r].k2);
                r++;
            }
            double l;
            CHECK(arl_loss_seg_step(&P, &sg, &m, E[i].th + o, &l, NULL, &stp) == ARL_OK);
            L += l;
        }
    }
    CHECK_EQ_INT(r, 10);
    /* token (2, 3, 0): u = e^1.8 > c = 5 */
    CHECK_STATED(exp(1.8), "6.049647464");

    metrics m = {0};
    arl_loss_acc_emit(&stp, metrics_collect, &m);
    CHECK_STATED(-metrics_get(&m, "loss/pg") * 16, "6.728725118");
    CHECK_STATED(metrics_get(&m, "loss/pg"), "-0.42054532");
    CHECK_STATED(metrics_get(&m, "loss/k2") * 16 / 0.1, "0.51812987");
    CHECK_STATED(metrics_get(&m, "loss/k2"), "0.003238312");
    CHECK_STATED(metrics_get(&m, "loss/total"), "-0.417307008");
    CHECK_STATED(L, "-0.417307008"); /* M = 1: the step objective is L */
    CHECK_EXACT(metrics_get(&m, "ppo/clip_frac"), 2.0 / 7);
    CHECK_EXACT(metrics_get(&m, "ppo/clip_frac_high"), 1.0 / 7);
    CHECK_EXACT(metrics_get(&m, "ppo/clip_frac_low"), 1.0 / 7);

    metrics q = {0};
    arl_loss_acc_emit(&pre, metrics_collect, &q);
    CHECK_STATED(pre.sum[ARL_LACC_MW_K3], "0.051588637");
    CHECK_STATED(pre.sum[ARL_LACC_MW_REF], "6.302076522");
    double kl = arl_loss_acc_kl_hat(&pre);
    CHECK_STATED(kl, "0.008185974");
    CHECK_STATED(metrics_get(&q, "kl/k3"), "0.008185974");
    CHECK_STATED(metrics_get(&q, "kl/k1"), "0.066382639");
    CHECK_EXACT(metrics_get(&q, "mask/token_band_frac"), 1.0 / 10);
    CHECK_EXACT(metrics_get(&q, "mask/segment_geo_frac"), 1.0 / 4);
    CHECK_EXACT(metrics_get(&q, "mask/total_frac"), 3.0 / 10);
    CHECK_EXACT(metrics_get(&q, "is/truncated_frac"), 1.0 / 7);
    CHECK_EXACT(metrics_get(&q, "mask/stale_frac"), 0.0);
    CHECK_EXACT(metrics_get(&q, "mask/route_frac"), 0.0);
    CHECK_EXACT(metrics_get(&q, "is/weight_max"), 2.0);
    CHECK_STATED(metrics_get(&q, "is/weight_mean"), "0.900296646"); /* 6.302076522 / 7 */

    /* controller: N_n = valid trajectories = 2 */
    metrics rm = {0};
    arl_reward_acc_emit(&RACC, &CFG, metrics_collect, &rm);
    int64_t n_valid = (int64_t)(metrics_get(&rm, "rollout/trajectories/complete") +
                                metrics_get(&rm, "rollout/trajectories/truncated"));
    CHECK_EQ_INT(n_valid, 2);
    arl_klctl_step st;
    CHECK(arl_klctl_update(&CTL, kl, n_valid, &st) == ARL_OK);
    CHECK_STATED(st.e, "-0.181402557");
    CHECK_EXACT(st.g, 0.002);
    CHECK_STATED(st.coef_next, "0.04998186");
    CHECK_STATED(arl_klctl_beta(&CTL), "0.04998186");
    CHECK_EXACT(arl_klctl_lambda2(&CTL), 0.1); /* fixed under placement both */
    metrics km = {0};
    arl_klctl_emit(&CTL, &st, metrics_collect, &km);
    CHECK_EXACT(metrics_get(&km, "kl/coef"), 0.05);
    CHECK_EXACT(metrics_get(&km, "kl/target"), 0.01);
    CHECK_STATED(metrics_get(&km, "kl/error"), "-0.181402557");
}

/* Section 15.2: masking trajectory 2 gives trajectory 1 baseline 0 at every level and
 * A^O = 0. */
static void test_masking_member_2(void) {
    ex_traj e[2];
    ex_out o[2];
    arl_reward_traj tr[2];
    ex_fill(&e[0], 1);
    ex_fill(&e[1], 2);
    for (int i = 0; i < 2; i++) {
        CHECK(ex_scan(&e[i]) == ARL_OK);
        ex_bind(&tr[i], &e[i], &o[i]);
    }
    tr[1].status = ARL_REWARD_TRAJ_MASKED;
    arl_reward_group g = {.n = 2, .trajs = tr};
    CHECK(arl_reward_compute(&CFG, &g, 1, 0.05, NULL, NULL, NULL) == ARL_OK);
    CHECK_EXACT(tr[0].out.outcome_adv, 0.0);
    for (int s = 0; s < 2; s++)
        CHECK(o[0].seg_base[s] == 0.0);
    for (int k = 0; k < 2; k++)
        CHECK(o[0].proc_base[k] == 0.0 && o[0].kl_base[k] == 0.0);
    for (int k = 0; k < 3; k++)
        CHECK(o[1].adv_turn[k] == 0.0);
}

int main(void) {
    run_advantages();
    TEST_RUN(test_outcome);
    TEST_RUN(test_segment);
    TEST_RUN(test_process);
    TEST_RUN(test_kl_term);
    TEST_RUN(test_token_advantages);
    TEST_RUN(test_loss_and_controller);
    TEST_RUN(test_masking_member_2);
    return test_finish();
}
