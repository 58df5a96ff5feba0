/* learner/kl_ctl.c: the adaptive KL controller (spec/objective.md section 7) and its options.
 * Not here: the KL estimates (learner/loss.c). */
#include <math.h>
#include <string.h>

#include "learner/kl_ctl.h"

#define OFF(f) offsetof(arl_kl_opts, f)
const arl_option arl_kl_options[] = {
    {"kl-placement", ARL_OPT_CHOICE, OFF(placement), "reward",
     "where the KL to the reference acts: k1 in the reward, k2 in the loss, both, or none", 0, 0,
     "reward|loss|both|none", 0, NULL},
    {"kl-coef", ARL_OPT_FLOAT, OFF(coef), "1e-3",
     "initial KL coefficient beta_0 (placements reward and both)", 0, 1e6, NULL, 0, "C"},
    {"kl-lambda2", ARL_OPT_FLOAT, OFF(lambda2), "0",
     "k2 loss coefficient lambda_2 (fixed for both; initial value for loss)", 0, 1e6, NULL, 0, "C"},
    {"kl-target", ARL_OPT_FLOAT, OFF(target), "5e-3", "KL target per token (nats)", 1e-12, 1e6,
     NULL, 0, "NATS"},
    {"kl-horizon", ARL_OPT_FLOAT, OFF(horizon), "1000", "controller horizon H in trajectories",
     1e-9, 1e15, NULL, 0, "H"},
    {"kl-coef-min", ARL_OPT_FLOAT, OFF(coef_min), "1e-6", "lower bound of the KL coefficient",
     1e-300, 1e6, NULL, 0, "C"},
    {"kl-coef-max", ARL_OPT_FLOAT, OFF(coef_max), "1.0", "upper bound of the KL coefficient",
     1e-300, 1e6, NULL, 0, "C"},
};
#undef OFF
const size_t arl_kl_options_count = sizeof arl_kl_options / sizeof arl_kl_options[0];

void arl_kl_config_default(arl_kl_config *cfg) {
    cfg->placement = ARL_KL_PLACEMENT_REWARD;
    cfg->coef0 = 1e-3;
    cfg->lambda2 = 0;
    cfg->target = 5e-3;
    cfg->horizon = 1000;
    cfg->coef_min = 1e-6;
    cfg->coef_max = 1.0;
}

arl_status arl_kl_config_from_opts(const arl_kl_opts *o, arl_kl_config *cfg) {
    static const char *const pl[] = {"reward", "loss", "both", "none"};
    int p = -1;
    for (int i = 0; i < 4; i++)
        if (o->placement && !strcmp(o->placement, pl[i])) p = i;
    if (p < 0)
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-placement': unknown value '%s'",
                          o->placement ? o->placement : "(null)");
    cfg->placement = (arl_kl_placement)p;
    cfg->coef0 = o->coef;
    cfg->lambda2 = o->lambda2;
    cfg->target = o->target;
    cfg->horizon = o->horizon;
    cfg->coef_min = o->coef_min;
    cfg->coef_max = o->coef_max;
    if (!(cfg->coef0 >= 0) || !isfinite(cfg->coef0))
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-coef': expected a finite value >= 0");
    if (!(cfg->lambda2 >= 0) || !isfinite(cfg->lambda2))
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-lambda2': expected a finite value >= 0");
    if (!(cfg->target > 0) || !isfinite(cfg->target))
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-target': expected a finite value > 0");
    if (!(cfg->horizon > 0) || !isfinite(cfg->horizon))
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-horizon': expected a finite value > 0");
    if (!(cfg->coef_min > 0 && cfg->coef_min <= cfg->coef_max) || !isfinite(cfg->coef_max))
        return arl_errorf(ARL_ERR_CONFIG,
                          "options 'kl-coef-min' (%g) and 'kl-coef-max' (%g): "
                          "expected 0 < min <= max",
                          cfg->coef_min, cfg->coef_max);
    if (cfg->placement == ARL_KL_PLACEMENT_LOSS && cfg->lambda2 == 0)
        return arl_errorf(ARL_ERR_CONFIG, "option 'kl-lambda2': placement 'loss' adapts lambda_2 "
                                          "from this initial value, which must be > 0 (e.g. 1e-3)");
    return ARL_OK;
}

static double clampd(double x, double lo, double hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

arl_status arl_klctl_init(arl_klctl *c, const arl_kl_config *cfg) {
    if (!(cfg->target > 0) || !(cfg->horizon > 0) || !(cfg->coef_min > 0) ||
        !(cfg->coef_min <= cfg->coef_max))
        return arl_errorf(ARL_ERR_CONFIG,
                          "KL controller: target %g, horizon %g, bounds [%g, %g] "
                          "(expected positive values and min <= max)",
                          cfg->target, cfg->horizon, cfg->coef_min, cfg->coef_max);
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->coef = cfg->placement == ARL_KL_PLACEMENT_LOSS ? cfg->lambda2 : cfg->coef0;
    if (cfg->placement != ARL_KL_PLACEMENT_NONE)
        c->coef = clampd(c->coef, cfg->coef_min, cfg->coef_max);
    return ARL_OK;
}

double arl_klctl_beta(const arl_klctl *c) {
    return c->cfg.placement == ARL_KL_PLACEMENT_REWARD || c->cfg.placement == ARL_KL_PLACEMENT_BOTH
               ? c->coef
               : 0.0;
}

double arl_klctl_lambda2(const arl_klctl *c) {
    switch (c->cfg.placement) {
    case ARL_KL_PLACEMENT_LOSS:
        return c->coef;
    case ARL_KL_PLACEMENT_BOTH:
        return c->cfg.lambda2;
    default:
        return 0.0;
    }
}

arl_status arl_klctl_update(arl_klctl *c, double kl_hat, int64_t n_valid, arl_klctl_step *step) {
    if (n_valid < 0)
        return arl_errorf(ARL_ERR_ARG, "KL controller: %lld valid trajectories",
                          (long long)n_valid);
    if (!isnan(kl_hat) && !(isfinite(kl_hat) && kl_hat >= 0))
        return arl_errorf(ARL_ERR_ARG,
                          "KL controller: KL estimate %g (expected a finite value "
                          ">= 0, or NaN for none)",
                          kl_hat);
    arl_klctl_step s = {0};
    s.kl = kl_hat;
    s.coef_used = c->coef;
    s.error = isnan(kl_hat) ? 0.0 : kl_hat / c->cfg.target - 1.0;
    s.e = clampd(s.error, -0.2, 0.2);
    s.g = (double)n_valid / c->cfg.horizon;
    if (s.g > 1) s.g = 1;
    s.coef_next = c->coef;
    if (c->cfg.placement != ARL_KL_PLACEMENT_NONE && !isnan(kl_hat) && n_valid > 0) {
        s.coef_next = clampd(c->coef * (1.0 + s.e * s.g), c->cfg.coef_min, c->cfg.coef_max);
        s.adapted = 1;
    }
    c->coef = s.coef_next;
    c->updates++;
    if (step) *step = s;
    return ARL_OK;
}

void arl_klctl_emit(const arl_klctl *c, const arl_klctl_step *step, arl_reward_metric_fn fn,
                    void *ctx) {
    fn(ctx, "kl/coef", step ? step->coef_used : c->coef);
    fn(ctx, "kl/target", c->cfg.target);
    fn(ctx, "kl/error", step ? step->error : 0.0);
}

void arl_klctl_state_get(const arl_klctl *c, arl_klctl_state *s) {
    s->coef = c->coef;
    s->updates = c->updates;
}

arl_status arl_klctl_state_set(arl_klctl *c, const arl_klctl_state *s) {
    int bounded = c->cfg.placement != ARL_KL_PLACEMENT_NONE;
    if (!isfinite(s->coef) || s->coef < 0 || s->updates < 0 ||
        (bounded && (s->coef < c->cfg.coef_min || s->coef > c->cfg.coef_max)))
        return arl_errorf(ARL_ERR_CORRUPT,
                          "KL controller state: coefficient %.17g after %lld "
                          "updates is outside [%g, %g] (the train state does not belong to this "
                          "configuration or is damaged)",
                          s->coef, (long long)s->updates, c->cfg.coef_min, c->cfg.coef_max);
    c->coef = s->coef;
    c->updates = s->updates;
    return ARL_OK;
}
