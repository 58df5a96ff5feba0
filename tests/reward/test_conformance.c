/* Rules of spec/objective.md that the worked example (test_example.c) and the other reward and
 * loss tests left open, each against hand-computed float64 values:
 *   - KL_n (section 7) is never below 0, also when pi_old equals the reference up to float
 *     rounding (a k3 term of a rounding-size x is -1e-16 in float64), so the controller takes it;
 *   - a process component's form `auto` follows its environment's /info declaration: min for
 *     source model, sum for rule; a form given in the configuration wins (sections 5.4, 13);
 *   - a configured component the environment does not declare at its level is refused
 *     (spec/aep.md 4.8 rule 5: it would count as 0 in every trajectory);
 *   - an unscorable score trains on the client's substitute also where components are
 *     configured: R_i = range_lo (4.3), q = 0 (3.3), and both are counted (section 12);
 *   - outcome normalisation by group and by batch (5.6) with hand values;
 *   - the KL baseline under kl.rtg_scope segment: others' segment-scope D at the turn (5.7);
 *   - the clip classification of ppo/clip_frac_low and _high (8.3, 12) in the four quadrants;
 *   - staleness is the minimum version over the segment's action tokens only (3.5).
 * Values are short decimals: compared with 1e-12 absolute. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "learner/kl_ctl.h"
#include "learner/loss.h"
#include "reward/reward.h"
#include "tests/reward/metrics.h"
#include "tests/test.h"

#define TOL 1e-12


/* One trajectory of K <= 4 turns in segments seg[], with its own arrays. */
typedef struct tj {
    arl_reward_turn turns[4];
    double p[4 * 3], q[4 * 3], R[3];
    uint8_t unscorable[4];
    double adv_turn[4], seg_adv[4], proc_rtg[4], kl_rtg[4], kl_base[4];
    arl_reward_traj tr;
} tj;

static void tj_init(tj *x, int K, const int *seg, const double *kappa) {
    memset(x, 0, sizeof *x);
    for (int k = 0; k < K; k++)
        x->turns[k] = (arl_reward_turn){.tok_start = 10 * k,
                                        .tok_end = 10 * k + 4,
                                        .seg = seg[k],
                                        .n_action = 4,
                                        .kappa = kappa ? kappa[k] : 0.0};
    x->tr.status = ARL_REWARD_TRAJ_COMPLETE;
    x->tr.n_turns = K;
    x->tr.n_segs = K ? seg[K - 1] + 1 : 0;
    x->tr.turns = x->turns;
    x->tr.process = x->p;
    x->tr.segment = x->q;
    x->tr.outcome = x->R;
    x->tr.out.adv_turn = x->adv_turn;
    x->tr.out.seg_adv = x->seg_adv;
    x->tr.out.proc_rtg = x->proc_rtg;
    x->tr.out.kl_rtg = x->kl_rtg;
    x->tr.out.kl_base = x->kl_base;
}

static void config_from_json(const char *json, arl_reward_config *cfg) {
    arl_reward_opts o;
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count, json, "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, cfg) == ARL_OK);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
}

/* ---- section 7: KL_n >= 0 ---- */

static void test_kl_hat_not_negative(void) {
    /* a near-certain token whose pi_old and reference log-probs are one float ulp apart:
     * l_old = nextafterf(l_ref, -1), x = l_old - l_ref ~ -1.1e-16; exp(-x) rounds to 1, so the
     * float64 k3 is x < 0 although the true k3 is x^2 / 2 > 0 */
    const float ref32 = -1e-9f, old32 = nextafterf(ref32, -1.0f);
    enum { N = 8 };
    uint8_t mask[N];
    double mu[N], old[N], ref[N], adv[N];
    for (int t = 0; t < N; t++) {
        mask[t] = 1;
        old[t] = mu[t] = (double)old32; /* u = 1: w = 1, m = 1 */
        ref[t] = (double)ref32;
        adv[t] = 0;
    }
    arl_loss_config lc;
    arl_loss_config_default(&lc);
    arl_loss_params p;
    CHECK(arl_loss_params_init(&p, &lc, 8, 1, 0, 3) == ARL_OK);
    arl_loss_seg s = {.n_tok = N,
                      .loss_mask = mask,
                      .lp_mu = mu,
                      .lp_old = old,
                      .lp_ref = ref,
                      .adv = adv,
                      .routes_ok = 1,
                      .traj_tokens = N,
                      .inv_norm = arl_loss_inv_norm(&p, 1, N)};
    arl_loss_seg_mask m;
    arl_loss_acc acc;
    arl_loss_acc_init(&acc);
    CHECK(arl_loss_seg_prepare(&p, &s, &m, &acc) == ARL_OK);
    /* the premise: the float64 sum of the k3 terms is below 0 */
    CHECK_MSG(acc.sum[ARL_LACC_MW_K3] < 0, "sum m w k3 = %g", acc.sum[ARL_LACC_MW_K3]);
    CHECK(acc.sum[ARL_LACC_MW_REF] == N);
    const double kl = arl_loss_acc_kl_hat(&acc);
    CHECK_MSG(kl == 0.0, "KL_n = %g", kl);
    metrics mm = {0};
    arl_loss_acc_emit(&acc, metrics_collect, &mm);
    for (int i = 0; i < mm.n; i++)
        if (!strcmp(mm.name[i], "kl/k3")) CHECK(mm.v[i] == 0.0);
    /* the controller takes it: KL 0 is error -1, clipped to -0.2 */
    arl_kl_config kc;
    arl_kl_config_default(&kc);
    arl_klctl c;
    CHECK(arl_klctl_init(&c, &kc) == ARL_OK);
    arl_klctl_step st;
    CHECK(arl_klctl_update(&c, kl, 1000, &st) == ARL_OK);
    CHECK(st.adapted == 1);
    CHECK_CLOSE(st.coef_next, 1e-3 * 0.8, 0, 1e-15);
    /* a real divergence is untouched: the estimate is the plain ratio */
    for (int t = 0; t < N; t++)
        ref[t] = old[t] - 0.1 * (t + 1);
    arl_loss_acc_init(&acc);
    CHECK(arl_loss_seg_prepare(&p, &s, &m, &acc) == ARL_OK);
    CHECK(arl_loss_acc_kl_hat(&acc) == acc.sum[ARL_LACC_MW_K3] / acc.sum[ARL_LACC_MW_REF]);
    double want = 0;
    for (int t = 0; t < N; t++) {
        double x = 0.1 * (t + 1);
        want += exp(-x) - 1 + x;
    }
    CHECK_CLOSE(arl_loss_acc_kl_hat(&acc), want / N, 1e-15, 0);
}

/* ---- spec/aep.md 4.8 rule 5: configured components must be declared ---- */

/* A configured component that the environment does not declare at its level would count as 0
 * in every trajectory (the level trains on nothing): the configuration is refused, naming the
 * key, the component and what the environment declares there; components it declares at the
 * right level pass, and an /info without reward_components is not checked. */
static void test_undeclared_component(void) {
    const char *info = "{\"env\": {\"name\": \"kvstore\"}, \"reward_components\": ["
                       "{\"name\": \"step_progress\", \"level\": \"process\", \"range\": [-1, 1]},"
                       "{\"name\": \"format\", \"level\": \"process\", \"range\": [-1, 0]},"
                       "{\"name\": \"progress\", \"level\": \"segment\", \"range\": [-1, 1]},"
                       "{\"name\": \"goal_met\", \"level\": \"outcome\", \"range\": [0, 1]}]}";
    arl_reward_config ok, bad;
    uint8_t flags[ARL_REWARD_MAX_COMPONENTS];
    config_from_json("{\"process-components\": [\"step_progress=1:min\", \"format=1\"], "
                     "\"segment-components\": [\"progress=1\"], "
                     "\"outcome-components\": [\"goal_met=1\"]}",
                     &ok);
    CHECK(arl_reward_config_check_info(&ok, "kvstore", info) == ARL_OK);
    CHECK(arl_reward_sources_from_info(&ok, info, flags) == ARL_OK);
    /* another environment's outcome component */
    config_from_json("{\"outcome-components\": [\"answer_correct=1\"]}", &bad);
    CHECK(arl_reward_config_check_info(&bad, "kvstore", info) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "key 'learner.outcome-components'") != NULL);
    CHECK(strstr(arl_error_msg(), "kvstore declares no outcome component 'answer_correct'") !=
          NULL);
    CHECK(strstr(arl_error_msg(), "(its outcome components: goal_met): a component it does "
                                  "not declare would count as 0") != NULL);
    /* the learner's per-group call refuses it too, naming the environment from /info */
    memset(flags, 7, sizeof flags);
    CHECK(arl_reward_sources_from_info(&bad, info, flags) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "kvstore declares no outcome component") != NULL);
    CHECK(flags[0] == 0);
    /* a component declared at another level, and a typo among declared ones */
    config_from_json("{\"segment-components\": [\"format=1\"]}", &bad);
    CHECK(arl_reward_config_check_info(&bad, NULL, info) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(),
                 "key 'learner.segment-components': the environment declares "
                 "no segment component 'format' (it is declared at the process level; "
                 "its segment components: progress)") != NULL);
    config_from_json("{\"process-components\": [\"format=1\", \"step_progres=1\"]}", &bad);
    CHECK(arl_reward_config_check_info(&bad, "kvstore", info) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(),
                 "'step_progres' (its process components: step_progress, format)") != NULL);
    /* nothing declared to check against */
    CHECK(arl_reward_config_check_info(&bad, "x", "{\"reward_levels\": {}}") == ARL_OK);
    CHECK(arl_reward_config_check_info(&bad, "x", "not json") == ARL_OK);
    CHECK(arl_reward_config_check_info(&bad, "x", NULL) == ARL_OK);
}

/* ---- sections 5.4 and 13: form auto from the declared source ---- */

static void test_process_form_from_info(void) {
    arl_reward_config cfg;
    config_from_json("{\"w-outcome\": 0, \"w-segment\": 0, \"w-process\": 1, "
                     "\"norm-process\": \"none\", \"gamma-process\": 0.5, "
                     "\"process-components\": [\"acc=1\", \"prm=0.5\", \"fix=2:sum\"]}",
                     &cfg);
    const char *info =
        "{\"reward_levels\": {\"process\": {\"range\": [0, 1]}, \"outcome\": {\"range\": [0, 1]}},"
        " \"reward_components\": ["
        "{\"name\": \"acc\", \"level\": \"process\", \"range\": [0, 1]},"
        "{\"name\": \"prm\", \"level\": \"process\", \"range\": [0, 1], \"source\": \"model\"},"
        "{\"name\": \"fix\", \"level\": \"process\", \"range\": [0, 1], \"source\": \"model\"},"
        "{\"name\": \"acc\", \"level\": \"outcome\", \"range\": [0, 1], \"source\": \"model\"}]}";
    uint8_t flags[ARL_REWARD_MAX_COMPONENTS];
    CHECK(arl_reward_sources_from_info(&cfg, info, flags) == ARL_OK);
    CHECK(flags[0] == 0 && flags[1] == 1 && flags[2] == 1);
    for (int c = 3; c < ARL_REWARD_MAX_COMPONENTS; c++)
        CHECK(flags[c] == 0);
    uint8_t none[ARL_REWARD_MAX_COMPONENTS];
    CHECK(arl_reward_sources_from_info(&cfg, "not json", none) == ARL_OK);
    for (int c = 0; c < ARL_REWARD_MAX_COMPONENTS; c++)
        CHECK(none[c] == 0);

    /* the same trajectory in a group of that environment and in one of an environment that
     * declares every component as rule (no flags); one member each (baseline 0) */
    const int seg[] = {0, 0, 0};
    const double acc[] = {1, 0, 1}, prm[] = {0.9, 0.2, 0.7}, fix[] = {0.1, 0.1, 0.1};
    tj x[2];
    arl_reward_group g[2];
    memset(g, 0, sizeof g);
    for (int i = 0; i < 2; i++) {
        tj_init(&x[i], 3, seg, NULL);
        for (int k = 0; k < 3; k++)
            x[i].p[3 * k] = acc[k], x[i].p[3 * k + 1] = prm[k], x[i].p[3 * k + 2] = fix[k];
        g[i].n = 1;
        g[i].trajs = &x[i].tr;
    }
    memcpy(g[0].process_model, flags, sizeof flags);
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, NULL) == ARL_OK);
    /* acc sum (gamma 0.5): 1.25, 0.5, 1; prm min: 0.2, 0.2, 0.7 (sum: 1.175, 0.55, 0.7);
     * fix sum whatever its source (the form is configured): 0.175, 0.15, 0.1 */
    const double model[] = {1.25 + 0.5 * 0.2 + 2 * 0.175, 0.5 + 0.5 * 0.2 + 2 * 0.15,
                            1 + 0.5 * 0.7 + 2 * 0.1};
    const double rule[] = {1.25 + 0.5 * 1.175 + 2 * 0.175, 0.5 + 0.5 * 0.55 + 2 * 0.15,
                           1 + 0.5 * 0.7 + 2 * 0.1};
    for (int k = 0; k < 3; k++) {
        CHECK_CLOSE(x[0].proc_rtg[k], model[k], TOL, 0);
        CHECK_CLOSE(x[0].adv_turn[k], model[k], TOL, 0);
        CHECK_CLOSE(x[1].proc_rtg[k], rule[k], TOL, 0);
    }
}

/* ---- sections 3.3 and 4.3 with components configured ---- */

static void test_unscorable_with_components(void) {
    arl_reward_config cfg;
    config_from_json("{\"w-outcome\": 1, \"w-segment\": 0.5, \"w-process\": 0, "
                     "\"norm-segment\": \"none\", \"outcome-components\": [\"a=2\", \"b=1\"], "
                     "\"segment-components\": [\"s=1\"]}",
                     &cfg);
    const int seg[] = {0};
    tj x[3];
    arl_reward_traj arr[3];
    for (int i = 0; i < 3; i++)
        tj_init(&x[i], 1, seg, NULL);
    x[0].R[0] = 0.5, x[0].R[1] = 0.25, x[0].q[0] = 0.4; /* R = 1.25 */
    /* member 1: the episode score said scorable:false (no components: NaN) and the client
     * stored range_lo = -1; its segment score too, though it carried a component value */
    x[1].R[0] = NAN, x[1].R[1] = NAN, x[1].q[0] = 0.8;
    x[1].tr.outcome_unscorable = 1;
    x[1].tr.outcome_lo = -1;
    x[1].unscorable[0] = 1;
    x[1].tr.segment_unscorable = x[1].unscorable;
    x[2].R[0] = 0, x[2].R[1] = 0.5, x[2].q[0] = 0.2; /* R = 0.5 */
    for (int i = 0; i < 3; i++)
        arr[i] = x[i].tr;
    arl_reward_group g = {.n = 3, .trajs = arr};
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    /* R = (1.25, -1, 0.5): A^O = (1.25 + 0.25, -1 - 0.875, 0.5 - 0.125);
     * q = (0.4, 0, 0.2): A^S = (0.3, -0.3, 0) */
    CHECK_CLOSE(arr[1].out.outcome, -1, TOL, 0);
    CHECK_CLOSE(arr[0].out.outcome_adv, 1.5, TOL, 0);
    CHECK_CLOSE(arr[1].out.outcome_adv, -1.875, TOL, 0);
    CHECK_CLOSE(arr[2].out.outcome_adv, 0.375, TOL, 0);
    CHECK_CLOSE(x[0].seg_adv[0], 0.3, TOL, 0);
    CHECK_CLOSE(x[1].seg_adv[0], -0.3, TOL, 0);
    CHECK_CLOSE(x[2].seg_adv[0], 0.0, TOL, 0);
    CHECK_CLOSE(x[0].adv_turn[0], 1.5 + 0.5 * 0.3, TOL, 0);
    CHECK_CLOSE(x[1].adv_turn[0], -1.875 - 0.5 * 0.3, TOL, 0);
    CHECK_CLOSE(x[2].adv_turn[0], 0.375, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome_unscorable_frac"), 1.0 / 3, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/segment_unscorable_frac"), 1.0 / 3, TOL, 0);
    /* an unscorable score's absent components are not "missing" */
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/missing_components"), 0, 0, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/mean"), (1.25 - 1 + 0.5) / 3, TOL, 0);
    /* a substitute that is not a number is an error naming the member */
    arr[1].outcome_lo = NAN;
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "trajectory 1: unscorable outcome") != NULL);
}

/* ---- section 5.6: the outcome by group and by batch ---- */

static void test_outcome_normalisation(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_SEGMENT] = cfg.w[ARL_REWARD_LEVEL_PROCESS] = 0;
    const int seg[] = {0};
    const double R[5] = {1, 0, 0, 1, 0};
    tj x[5];
    arl_reward_traj arr[5];
    for (int i = 0; i < 5; i++) {
        tj_init(&x[i], 1, seg, NULL);
        x[i].R[0] = R[i];
        arr[i] = x[i].tr;
    }
    arl_reward_group g[2] = {{.n = 3, .trajs = arr}, {.n = 2, .trajs = arr + 3}};
    /* raw A^O: (1, -0.5, -0.5) and (1, -1) */
    const double raw[5] = {1, -0.5, -0.5, 1, -1};
    cfg.norm[ARL_REWARD_LEVEL_OUTCOME] = ARL_REWARD_NORM_GROUP;
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, &acc) == ARL_OK);
    /* group 0: sigma = sqrt((1 + 0.25 + 0.25) / 3) = sqrt(0.5); group 1: sigma = 1 */
    const double sg[5] = {sqrt(0.5), sqrt(0.5), sqrt(0.5), 1, 1};
    for (int i = 0; i < 5; i++) {
        CHECK_CLOSE(arr[i].out.outcome_adv_raw, raw[i], TOL, 0);
        CHECK_CLOSE(arr[i].out.outcome_adv, raw[i] / sg[i], TOL, 0);
        CHECK_CLOSE(x[i].adv_turn[0], raw[i] / sg[i], TOL, 0);
    }
    CHECK_CLOSE(metric(&acc, &cfg, "adv/outcome/sigma"), (sqrt(0.5) + 1) / 2, TOL, 0);
    /* batch: mean 0, sum of squares 3.5 over 5 entries */
    cfg.norm[ARL_REWARD_LEVEL_OUTCOME] = ARL_REWARD_NORM_BATCH;
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, NULL) == ARL_OK);
    for (int i = 0; i < 5; i++)
        CHECK_CLOSE(arr[i].out.outcome_adv, raw[i] / sqrt(0.7), TOL, 0);
}

/* ---- section 5.7: the KL baseline under kl.rtg_scope segment ---- */

static void test_kl_baseline_segment_scope(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_OUTCOME] = cfg.w[ARL_REWARD_LEVEL_SEGMENT] =
        cfg.w[ARL_REWARD_LEVEL_PROCESS] = 0;
    cfg.kl_scope = ARL_REWARD_KL_SEGMENT;
    const int sa[] = {0, 1, 1}, sb[] = {0, 0};
    const double ka[] = {0.1, 0.2, 0.4}, kb[] = {0.3, 0.5};
    tj x[2];
    tj_init(&x[0], 3, sa, ka);
    tj_init(&x[1], 2, sb, kb);
    arl_reward_traj arr[2] = {x[0].tr, x[1].tr};
    arl_reward_group g = {.n = 2, .trajs = arr};
    CHECK(arl_reward_compute(&cfg, &g, 1, 0.5, NULL, NULL, NULL) == ARL_OK);
    /* D (segment scope): a = (0.1, 0.6, 0.4), b = (0.8, 0.5); b^D from the other member's D
     * at the same turn: a = (0.8, 0.5, 0 (b has no turn 3)), b = (0.1, 0.6) */
    const double Da[] = {0.1, 0.6, 0.4}, Db[] = {0.8, 0.5};
    const double Ba[] = {0.8, 0.5, 0.0}, Bb[] = {0.1, 0.6};
    for (int k = 0; k < 3; k++) {
        CHECK_CLOSE(x[0].kl_rtg[k], Da[k], TOL, 0);
        CHECK_CLOSE(x[0].kl_base[k], Ba[k], TOL, 0);
        CHECK_CLOSE(x[0].adv_turn[k], -0.5 * (Da[k] - Ba[k]), TOL, 0);
    }
    for (int k = 0; k < 2; k++) {
        CHECK_CLOSE(x[1].kl_rtg[k], Db[k], TOL, 0);
        CHECK_CLOSE(x[1].kl_base[k], Bb[k], TOL, 0);
        CHECK_CLOSE(x[1].adv_turn[k], -0.5 * (Db[k] - Bb[k]), TOL, 0);
    }
}

/* ---- sections 8.3 and 12: the clip classification ---- */

static void test_clip_quadrants(void) {
    arl_loss_config lc;
    arl_loss_config_default(&lc); /* eps_l 0.2, eps_h 0.28 */
    arl_loss_params p;
    CHECK(arl_loss_params_init(&p, &lc, 1, 1, 0, 0) == ARL_OK);
    static const struct {
        double rho, adv, pg, dpg;
        int clipped, low, high;
    } q[] = {
        {1.5, 1, 1.28, 0, 1, 0, 1},     /* rho > 1 + eps_h, A > 0: clipped high */
        {0.5, -1, -0.8, 0, 1, 1, 0},    /* rho < 1 - eps_l, A < 0: clipped low */
        {1.5, -1, -1.5, -1.5, 0, 0, 0}, /* rho high, A < 0: the unclipped term is smaller */
        {0.5, 1, 0.5, 0.5, 0, 0, 0},    /* rho low, A > 0: likewise */
        {1.1, 1, 1.1, 1.1, 0, 0, 0},    /* inside the range */
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        arl_loss_token k;
        arl_loss_token_eval(&p, -1.0, -1.0, -1.0 + log(q[i].rho), -1.0, q[i].adv, 1, &k);
        CHECK(k.w == 1.0 && k.m == 1);
        CHECK_CLOSE(k.pg, q[i].pg, TOL, 0);
        CHECK_CLOSE(k.dpg, q[i].dpg, TOL, 0);
        CHECK_MSG(k.clipped == q[i].clipped && k.clip_low == q[i].low && k.clip_high == q[i].high,
                  "row %zu: clipped %d low %d high %d", i, k.clipped, k.clip_low, k.clip_high);
    }
}

/* ---- section 3.5: staleness over action tokens ---- */

static void test_staleness_action_tokens(void) {
    arl_loss_config lc;
    arl_loss_config_default(&lc);
    lc.stale_eta = 4;
    arl_loss_params p;
    CHECK(arl_loss_params_init(&p, &lc, 1, 1, 0, 20) == ARL_OK);
    /* a context token prefilled at version 10 (an old observation), action tokens sampled at
     * 20 and 18: sigma = 20 - 18 = 2 <= 4, not stale */
    const uint8_t mask[3] = {0, 1, 1};
    const double lp[3] = {NAN, -1, -1}, adv[3] = {0, 1, 1};
    uint32_t ver[3] = {10, 20, 18};
    arl_loss_seg s = {.n_tok = 3,
                      .loss_mask = mask,
                      .lp_mu = lp,
                      .lp_old = lp,
                      .lp_ref = lp,
                      .adv = adv,
                      .versions = ver,
                      .routes_ok = 1,
                      .traj_tokens = 3,
                      .inv_norm = 1};
    arl_loss_seg_mask m;
    CHECK(arl_loss_seg_prepare(&p, &s, &m, NULL) == ARL_OK);
    CHECK_EQ_INT(m.staleness, 2);
    CHECK(m.m_stale == 1 && m.m == 1);
    ver[2] = 15; /* an action token 5 versions old: stale */
    CHECK(arl_loss_seg_prepare(&p, &s, &m, NULL) == ARL_OK);
    CHECK_EQ_INT(m.staleness, 5);
    CHECK(m.m_stale == 0 && m.m == 0);
}

int main(void) {
    TEST_RUN(test_kl_hat_not_negative);
    TEST_RUN(test_process_form_from_info);
    TEST_RUN(test_undeclared_component);
    TEST_RUN(test_unscorable_with_components);
    TEST_RUN(test_outcome_normalisation);
    TEST_RUN(test_kl_baseline_segment_scope);
    TEST_RUN(test_clip_quadrants);
    TEST_RUN(test_staleness_action_tokens);
    return test_finish();
}
