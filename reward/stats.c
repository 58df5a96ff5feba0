/* reward/stats.c: the mergeable metric accumulators of the reward side and their emission
 * under the names of spec/objective.md section 12.  Not here: computing the values
 * (reward/advantage.c). */
#include <math.h>
#include <stdio.h>

#include "reward/reward.h"

void arl_reward_acc_init(arl_reward_acc *a) {
    for (int i = 0; i < ARL_RACC_NSUM; i++)
        a->sum[i] = 0;
    for (int i = 0; i < ARL_RACC_NMAX; i++)
        a->max[i] = -INFINITY;
}

void arl_reward_acc_merge(arl_reward_acc *dst, const arl_reward_acc *src) {
    for (int i = 0; i < ARL_RACC_NSUM; i++)
        dst->sum[i] += src->sum[i];
    for (int i = 0; i < ARL_RACC_NMAX; i++)
        if (src->max[i] > dst->max[i]) dst->max[i] = src->max[i];
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : 0.0;
}

/* Population standard deviation from n, sum and sum of squares (clamped at 0). */
static double std_of(double n, double s, double sq) {
    if (!(n > 0)) return 0.0;
    double m = s / n, v = sq / n - m * m;
    return v > 0 ? sqrt(v) : 0.0;
}

static double finite_or0(double x) {
    return isfinite(x) ? x : 0.0;
}

void arl_reward_acc_emit(const arl_reward_acc *a, const arl_reward_config *cfg,
                         arl_reward_metric_fn fn, void *ctx) {
    const double *s = a->sum;
    char name[256];
    fn(ctx, "rollout/trajectories/complete", s[ARL_RACC_TRAJ_COMPLETE]);
    fn(ctx, "rollout/trajectories/truncated", s[ARL_RACC_TRAJ_TRUNCATED]);
    fn(ctx, "rollout/trajectories/masked", s[ARL_RACC_TRAJ_MASKED]);
    double nvalid = s[ARL_RACC_TRAJ_COMPLETE] + s[ARL_RACC_TRAJ_TRUNCATED];
    for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
        const char *ln = arl_reward_level_name((arl_reward_level)l);
        double n = s[ARL_RACC_REW_N + l];
        snprintf(name, sizeof name, "reward/%s/mean", ln);
        fn(ctx, name, ratio(s[ARL_RACC_REW_SUM + l], n));
        snprintf(name, sizeof name, "reward/%s/std", ln);
        fn(ctx, name, std_of(n, s[ARL_RACC_REW_SUM + l], s[ARL_RACC_REW_SQ + l]));
        for (int32_t c = 0; c < cfg->n_comp[l]; c++) {
            snprintf(name, sizeof name, "reward/%s/%s/mean", ln, cfg->comp[l][c].name);
            fn(ctx, name,
               ratio(s[ARL_RACC_COMP_SUM + l * ARL_REWARD_MAX_COMPONENTS + c],
                     s[ARL_RACC_COMP_N + l * ARL_REWARD_MAX_COMPONENTS + c]));
        }
        if (cfg->n_comp[l] > 0) {
            snprintf(name, sizeof name, "reward/%s/missing_components", ln);
            fn(ctx, name, s[ARL_RACC_MISSING + l]);
        }
    }
    fn(ctx, "reward/segment_unscorable_frac",
       ratio(s[ARL_RACC_SEGMENT_UNSCORABLE], s[ARL_RACC_REW_N + ARL_REWARD_LEVEL_SEGMENT]));
    fn(ctx, "reward/outcome_unscorable_frac", ratio(s[ARL_RACC_OUTCOME_UNSCORABLE], nvalid));
    fn(ctx, "groups/degenerate_frac", ratio(s[ARL_RACC_GROUPS_DEGENERATE], s[ARL_RACC_GROUPS]));
    fn(ctx, "groups/outcome_zero_variance_frac",
       ratio(s[ARL_RACC_GROUPS_OUTCOME_ZV], s[ARL_RACC_GROUPS]));
    fn(ctx, "groups/empty_frac", ratio(s[ARL_RACC_GROUPS_EMPTY], s[ARL_RACC_GROUPS]));
    for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
        const char *ln = arl_reward_level_name((arl_reward_level)l);
        double n = s[ARL_RACC_REW_N + l];
        snprintf(name, sizeof name, "adv/%s/mean", ln);
        fn(ctx, name, ratio(s[ARL_RACC_ADV_SUM + l], n));
        snprintf(name, sizeof name, "adv/%s/std", ln);
        fn(ctx, name, std_of(n, s[ARL_RACC_ADV_SUM + l], s[ARL_RACC_ADV_SQ + l]));
        snprintf(name, sizeof name, "adv/%s/sigma", ln);
        double sigma = cfg->norm[l] == ARL_REWARD_NORM_GROUP
                           ? ratio(s[ARL_RACC_SIGMA_SUM + l], s[ARL_RACC_SIGMA_N + l])
                           : finite_or0(a->max[ARL_RACC_SIGMA_BATCH + l]);
        fn(ctx, name, sigma);
    }
    fn(ctx, "adv/kl_term/mean", ratio(s[ARL_RACC_KL_SUM], s[ARL_RACC_KL_N]));
    fn(ctx, "adv/kl_term/std", std_of(s[ARL_RACC_KL_N], s[ARL_RACC_KL_SUM], s[ARL_RACC_KL_SQ]));
    fn(ctx, "adv/token/mean", ratio(s[ARL_RACC_TOK_SUM], s[ARL_RACC_TOK_N]));
    fn(ctx, "adv/token/std", std_of(s[ARL_RACC_TOK_N], s[ARL_RACC_TOK_SUM], s[ARL_RACC_TOK_SQ]));
    fn(ctx, "adv/token/min", -finite_or0(a->max[ARL_RACC_TOK_NEGMIN]) + 0.0);
    fn(ctx, "adv/token/max", finite_or0(a->max[ARL_RACC_TOK_MAX]));
    fn(ctx, "adv/segment_no_baseline_frac",
       ratio(s[ARL_RACC_NO_BASELINE_SEG], s[ARL_RACC_REW_N + ARL_REWARD_LEVEL_SEGMENT]));
    fn(ctx, "adv/process_no_baseline_frac",
       ratio(s[ARL_RACC_NO_BASELINE_PROC], s[ARL_RACC_REW_N + ARL_REWARD_LEVEL_PROCESS]));
    fn(ctx, "adv/anchor_hit_frac",
       ratio(s[ARL_RACC_ANCHOR_HITS], s[ARL_RACC_REW_N + ARL_REWARD_LEVEL_PROCESS]));
    fn(ctx, "adv/segment_mc_baseline_frac",
       ratio(s[ARL_RACC_MC_BASELINE], s[ARL_RACC_REW_N + ARL_REWARD_LEVEL_SEGMENT]));
    fn(ctx, "kl/rtg_scope", cfg->kl_scope == ARL_REWARD_KL_SEGMENT ? 1.0 : 0.0);
}
