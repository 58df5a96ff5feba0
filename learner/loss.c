/* learner/loss.c: decoupled PPO with truncated importance sampling, the token band, segment
 * geometric, staleness and route masks, the k2 term and the constant normaliser
 * (spec/objective.md section 8), forward and backward on given log-probabilities, and the
 * metrics of section 12 that come from them.  Not here: the model, MPI, the controller. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "learner/loss.h"

#define OFF(f) offsetof(arl_loss_opts, f)
const arl_option arl_loss_options[] = {
    {"clip-low", ARL_OPT_FLOAT, OFF(clip_low), "0.2", "PPO clip range below 1 (eps_l)", 0, 1, NULL,
     0, "EPS"},
    {"clip-high", ARL_OPT_FLOAT, OFF(clip_high), "0.28", "PPO clip range above 1 (eps_h)", 0, 1e6,
     NULL, 0, "EPS"},
    {"tis-cap", ARL_OPT_FLOAT, OFF(tis_cap), "2.0",
     "cap C of the truncated importance weight min(pi_old/mu, C)", 1e-9, 1e6, NULL, 0, "C"},
    {"token-band", ARL_OPT_FLOAT, OFF(token_band), "4.0",
     "token band mask: keep tokens with pi_old/mu in [1/c, c]", 1, 1e300, NULL, 0, "C"},
    {"segment-delta", ARL_OPT_FLOAT, OFF(segment_delta), "0.01",
     "segment geometric mask: keep segments with |mean log(pi_old/mu)| <= delta", 0, 1e300, NULL, 0,
     "DELTA"},
    {"stale-eta", ARL_OPT_INT, OFF(stale_eta), "16",
     "staleness mask: drop segments more than this many versions old", 0, 1e15, NULL, 0, "N"},
    {"normaliser", ARL_OPT_CHOICE, OFF(normaliser), "constant",
     "loss normaliser: constant Z = N_traj * L_norm, or a mean per trajectory", 0, 0,
     "constant|per_trajectory_mean", 0, NULL},
    {"l-norm", ARL_OPT_FLOAT, OFF(l_norm), "65536",
     "L_norm: tokens per trajectory in the constant normaliser", 1e-9, 1e15, NULL, 0, "N"},
};
#undef OFF
const size_t arl_loss_options_count = sizeof arl_loss_options / sizeof arl_loss_options[0];

void arl_loss_config_default(arl_loss_config *cfg) {
    cfg->eps_low = 0.2;
    cfg->eps_high = 0.28;
    cfg->tis_cap = 2.0;
    cfg->band = 4.0;
    cfg->seg_delta = 0.01;
    cfg->stale_eta = 16;
    cfg->normaliser = ARL_LOSS_NORM_CONSTANT;
    cfg->l_norm = 65536;
}

static arl_status check_config(const arl_loss_config *c) {
    if (!(c->eps_low >= 0 && c->eps_low < 1))
        return arl_errorf(ARL_ERR_CONFIG, "option 'clip-low': %g, expected a value in [0, 1)",
                          c->eps_low);
    if (!(c->eps_high >= 0) || !isfinite(c->eps_high))
        return arl_errorf(ARL_ERR_CONFIG, "option 'clip-high': %g, expected a finite value >= 0",
                          c->eps_high);
    if (!(c->tis_cap > 0) || !isfinite(c->tis_cap))
        return arl_errorf(ARL_ERR_CONFIG, "option 'tis-cap': %g, expected a finite value > 0",
                          c->tis_cap);
    if (!(c->band >= 1))
        return arl_errorf(ARL_ERR_CONFIG, "option 'token-band': %g, expected a value >= 1",
                          c->band);
    if (!(c->seg_delta >= 0))
        return arl_errorf(ARL_ERR_CONFIG, "option 'segment-delta': %g, expected a value >= 0",
                          c->seg_delta);
    if (c->stale_eta < 0)
        return arl_errorf(ARL_ERR_CONFIG, "option 'stale-eta': %lld, expected >= 0",
                          (long long)c->stale_eta);
    if (!(c->l_norm > 0) || !isfinite(c->l_norm))
        return arl_errorf(ARL_ERR_CONFIG, "option 'l-norm': %g, expected a finite value > 0",
                          c->l_norm);
    return ARL_OK;
}

arl_status arl_loss_config_from_opts(const arl_loss_opts *o, arl_loss_config *cfg) {
    arl_loss_config_default(cfg);
    cfg->eps_low = o->clip_low;
    cfg->eps_high = o->clip_high;
    cfg->tis_cap = o->tis_cap;
    cfg->band = o->token_band;
    cfg->seg_delta = o->segment_delta;
    cfg->stale_eta = o->stale_eta;
    cfg->l_norm = o->l_norm;
    if (o->normaliser && !strcmp(o->normaliser, "constant"))
        cfg->normaliser = ARL_LOSS_NORM_CONSTANT;
    else if (o->normaliser && !strcmp(o->normaliser, "per_trajectory_mean"))
        cfg->normaliser = ARL_LOSS_NORM_PER_TRAJ;
    else
        return arl_errorf(ARL_ERR_CONFIG, "option 'normaliser': unknown value '%s'",
                          o->normaliser ? o->normaliser : "(null)");
    return check_config(cfg);
}

arl_status arl_loss_params_init(arl_loss_params *p, const arl_loss_config *cfg,
                                int64_t n_traj_per_update, int32_t minibatches, double lambda2,
                                int64_t update_n) {
    ARL_TRY(check_config(cfg));
    if (n_traj_per_update <= 0 || minibatches <= 0)
        return arl_errorf(ARL_ERR_CONFIG,
                          "loss: %lld trajectories per update and %d minibatches "
                          "(both must be > 0)",
                          (long long)n_traj_per_update, minibatches);
    if (!(lambda2 >= 0) || !isfinite(lambda2))
        return arl_errorf(ARL_ERR_ARG, "loss: lambda_2 is %g (expected a finite value >= 0)",
                          lambda2);
    if (update_n < 0) return arl_errorf(ARL_ERR_ARG, "loss: update %lld", (long long)update_n);
    p->cfg = *cfg;
    p->lambda2 = lambda2;
    p->z = (double)n_traj_per_update * cfg->l_norm;
    p->minibatches = minibatches;
    p->update_n = update_n;
    return ARL_OK;
}

double arl_loss_inv_norm(const arl_loss_params *p, int64_t n_valid, int64_t n_action_traj) {
    if (p->cfg.normaliser == ARL_LOSS_NORM_CONSTANT) return 1.0 / p->z;
    if (n_valid <= 0 || n_action_traj <= 0) return 0.0;
    return 1.0 / ((double)n_valid * (double)n_action_traj);
}

void arl_loss_token_eval(const arl_loss_params *p, double lp_mu, double lp_old, double lp_theta,
                         double lp_ref, double adv, int seg_m, arl_loss_token *o) {
    const arl_loss_config *c = &p->cfg;
    memset(o, 0, sizeof *o);
    o->u = exp(lp_old - lp_mu);
    o->w = o->u < c->tis_cap ? o->u : c->tis_cap;
    o->rho = exp(lp_theta - lp_old);
    o->m_tok = o->u >= 1.0 / c->band && o->u <= c->band;
    o->m = o->m_tok && seg_m;
    o->truncated = o->u > c->tis_cap;
    if (!o->m) return;
    double lo = 1.0 - c->eps_low, hi = 1.0 + c->eps_high;
    double rc = o->rho < lo ? lo : o->rho > hi ? hi : o->rho;
    double t1 = o->rho * adv, t2 = rc * adv;
    o->clipped = t2 < t1;
    o->clip_low = o->clipped && o->rho < lo;
    o->clip_high = o->clipped && o->rho > hi;
    o->pg = o->w * (o->clipped ? t2 : t1);
    o->dpg = o->clipped ? 0.0 : o->w * t1;
    if (!isnan(lp_ref)) {
        double x = lp_theta - lp_ref;
        o->k2 = o->w * 0.5 * x * x;
        o->dk2 = o->w * x;
    }
}

/* ---- accumulators ---- */

void arl_loss_acc_init(arl_loss_acc *a) {
    for (int i = 0; i < ARL_LACC_NSUM; i++)
        a->sum[i] = 0;
    for (int i = 0; i < ARL_LACC_NMAX; i++)
        a->max[i] = -INFINITY;
}

void arl_loss_acc_merge(arl_loss_acc *dst, const arl_loss_acc *src) {
    for (int i = 0; i < ARL_LACC_NSUM; i++)
        dst->sum[i] += src->sum[i];
    for (int i = 0; i < ARL_LACC_NMAX; i++)
        if (src->max[i] > dst->max[i]) dst->max[i] = src->max[i];
}

static void amax(arl_loss_acc *a, int i, double v) {
    if (v > a->max[i]) a->max[i] = v;
}

/* k3 = exp(-x) - 1 + x is >= 0, but in float64 a token whose x is a rounding difference
 * (|x| ~ 1e-16, l_old and l_ref of a near-certain token one float ulp apart) gives a k3 of
 * -1e-16; summed over an update whose pi_old equals the reference up to such noise, the
 * estimate went below 0 and the controller refused it (arl_klctl_update: ARL_ERR_ARG), which
 * stopped the run.  The estimate is therefore clamped at 0 (its exact value); an update with
 * any real divergence is unchanged to the bit. */
double arl_loss_acc_kl_hat(const arl_loss_acc *a) {
    if (!(a->sum[ARL_LACC_MW_REF] > 0)) return NAN;
    const double kl = a->sum[ARL_LACC_MW_K3] / a->sum[ARL_LACC_MW_REF];
    return kl > 0 ? kl : 0.0;
}

double arl_loss_acc_kl_k1(const arl_loss_acc *a) {
    return a->sum[ARL_LACC_MW_REF] > 0 ? a->sum[ARL_LACC_MW_K1] / a->sum[ARL_LACC_MW_REF] : NAN;
}

static int hist_bin(double x) {
    if (!(x >= 1e-6)) return 0;
    double b = floor((log10(x) - ARL_LOSS_HIST_LO) * ARL_LOSS_HIST_DECADE);
    if (!(b < ARL_LOSS_HIST_BINS - 2)) return ARL_LOSS_HIST_BINS - 1;
    return 1 + (int)b;
}

/* Upper edge of bin b (INFINITY for the overflow bin). */
static double hist_edge(int b) {
    if (b == 0) return 1e-6;
    if (b >= ARL_LOSS_HIST_BINS - 1) return INFINITY;
    return pow(10.0, ARL_LOSS_HIST_LO + (double)b / ARL_LOSS_HIST_DECADE);
}

double arl_loss_acc_abs_logratio_p99(const arl_loss_acc *a) {
    double n = a->sum[ARL_LACC_ACTION], cum = 0;
    if (!(n > 0)) return 0.0;
    double mx = a->max[ARL_LACC_MAX_ABS_LR];
    for (int b = 0; b < ARL_LOSS_HIST_BINS; b++) {
        cum += a->sum[ARL_LACC_HIST + b];
        if (cum >= 0.99 * n) {
            double e = hist_edge(b);
            return e < mx ? e : mx;
        }
    }
    return mx;
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : 0.0;
}
static double fin0(double x) {
    return isfinite(x) ? x : 0.0;
}

void arl_loss_acc_emit(const arl_loss_acc *a, arl_reward_metric_fn fn, void *ctx) {
    const double *s = a->sum;
    double k1 = arl_loss_acc_kl_k1(a), k3 = arl_loss_acc_kl_hat(a);
    fn(ctx, "kl/k1", fin0(k1));
    fn(ctx, "kl/k3", fin0(k3));
    fn(ctx, "loss/pg", -s[ARL_LACC_PG] + 0.0);
    fn(ctx, "loss/k2", s[ARL_LACC_K2]);
    fn(ctx, "loss/total", -s[ARL_LACC_PG] + s[ARL_LACC_K2]);
    fn(ctx, "mismatch/abs_logratio/mean", ratio(s[ARL_LACC_ABS_LR], s[ARL_LACC_ACTION]));
    fn(ctx, "mismatch/abs_logratio/p99", arl_loss_acc_abs_logratio_p99(a));
    char name[96];
    for (int k = 0; k < ARL_LOSS_TURN_BINS; k++) {
        snprintf(name, sizeof name, "mismatch/abs_logratio/turn[%d]", k + 1);
        fn(ctx, name, ratio(s[ARL_LACC_TURN_SUM + k], s[ARL_LACC_TURN_N + k]));
    }
    fn(ctx, "mismatch/segment_geo/mean_abs", ratio(s[ARL_LACC_SEG_ABS_GBAR], s[ARL_LACC_SEGS]));
    fn(ctx, "mismatch/k3_mu_old", /* >= 0 like kl/k3 (arl_loss_acc_kl_hat) */
       fmax(0.0, ratio(s[ARL_LACC_K3_MU_OLD], s[ARL_LACC_ACTION])));
    fn(ctx, "is/weight_mean", ratio(s[ARL_LACC_W_SUM], s[ARL_LACC_UNMASKED]));
    fn(ctx, "is/weight_max", fin0(a->max[ARL_LACC_MAX_W]));
    fn(ctx, "is/truncated_frac", ratio(s[ARL_LACC_TRUNCATED], s[ARL_LACC_UNMASKED]));
    fn(ctx, "mask/token_band_frac", ratio(s[ARL_LACC_BAND_MASKED], s[ARL_LACC_ACTION]));
    fn(ctx, "mask/segment_geo_frac", ratio(s[ARL_LACC_SEG_GEO], s[ARL_LACC_SEGS]));
    fn(ctx, "mask/stale_frac", ratio(s[ARL_LACC_SEG_STALE], s[ARL_LACC_SEGS]));
    static const char *const buckets[4] = {"lt32k", "lt128k", "lt512k", "ge512k"};
    for (int b = 0; b < 4; b++) {
        snprintf(name, sizeof name, "mask/stale_frac/%s", buckets[b]);
        fn(ctx, name, ratio(s[ARL_LACC_BUCKET_STALE + b], s[ARL_LACC_BUCKET_SEGS + b]));
    }
    fn(ctx, "mask/route_frac", ratio(s[ARL_LACC_SEG_ROUTE], s[ARL_LACC_SEGS]));
    fn(ctx, "mask/total_frac", ratio(s[ARL_LACC_TOTAL_MASKED], s[ARL_LACC_ACTION]));
    fn(ctx, "staleness/mean", ratio(s[ARL_LACC_STALENESS], s[ARL_LACC_SEGS]));
    fn(ctx, "staleness/max", fin0(a->max[ARL_LACC_MAX_STALENESS]));
    if (s[ARL_LACC_ENT_N] > 0) fn(ctx, "policy/entropy", s[ARL_LACC_ENT_SUM] / s[ARL_LACC_ENT_N]);
    fn(ctx, "ppo/clip_frac", ratio(s[ARL_LACC_CLIP], s[ARL_LACC_STEP_TOKENS]));
    fn(ctx, "ppo/clip_frac_low", ratio(s[ARL_LACC_CLIP_LOW], s[ARL_LACC_STEP_TOKENS]));
    fn(ctx, "ppo/clip_frac_high", ratio(s[ARL_LACC_CLIP_HIGH], s[ARL_LACC_STEP_TOKENS]));
    fn(ctx, "ppo/ratio_mean", ratio(s[ARL_LACC_RATIO_SUM], s[ARL_LACC_STEP_TOKENS]));
    fn(ctx, "ppo/ratio_max", fin0(a->max[ARL_LACC_MAX_RATIO]));
}

/* ---- the two passes ---- */

static int length_bucket(int64_t n) {
    return n < 32768 ? 0 : n < 131072 ? 1 : n < 524288 ? 2 : 3;
}

static arl_status bad_token(const char *what, int64_t t, double v) {
    return arl_errorf(ARL_ERR_ARG,
                      "loss: action token %lld of the segment: %s is %g (expected a "
                      "finite number)",
                      (long long)t, what, v);
}

arl_status arl_loss_seg_prepare(const arl_loss_params *p, const arl_loss_seg *s,
                                arl_loss_seg_mask *m, arl_loss_acc *acc) {
    int64_t T = s->n_tok;
    if (T < 0 || (T > 0 && (!s->loss_mask || !s->lp_mu || !s->lp_old || !s->adv)))
        return arl_errorf(ARL_ERR_ARG,
                          "loss: segment of %lld tokens without its loss mask, "
                          "log-probabilities or advantages",
                          (long long)T);
    if (!s->lp_ref && p->lambda2 != 0)
        return arl_errorf(ARL_ERR_ARG, "loss: lambda_2 = %g needs reference log-probabilities",
                          p->lambda2);
    if (!isfinite(s->inv_norm) || s->inv_norm < 0)
        return arl_errorf(ARL_ERR_ARG, "loss: segment normaliser factor %g", s->inv_norm);
    memset(m, 0, sizeof *m);
    /* Pass 1: validity, gbar, staleness. */
    double gsum = 0;
    int64_t na = 0;
    uint32_t vmin = UINT32_MAX;
    for (int64_t t = 0; t < T; t++) {
        if (!s->loss_mask[t]) continue;
        if (!isfinite(s->lp_mu[t])) return bad_token("l_mu", t, s->lp_mu[t]);
        if (!isfinite(s->lp_old[t])) return bad_token("l_old", t, s->lp_old[t]);
        if (s->lp_ref && !isfinite(s->lp_ref[t])) return bad_token("l_ref", t, s->lp_ref[t]);
        if (!isfinite(s->adv[t])) return bad_token("the advantage", t, s->adv[t]);
        if (s->versions) {
            if ((int64_t)s->versions[t] > p->update_n)
                return arl_errorf(ARL_ERR_ARG,
                                  "loss: action token %lld has policy version %u, "
                                  "newer than update %lld",
                                  (long long)t, s->versions[t], (long long)p->update_n);
            if (s->versions[t] < vmin) vmin = s->versions[t];
        }
        gsum += s->lp_old[t] - s->lp_mu[t];
        na++;
    }
    m->n_action = na;
    m->gbar = na > 0 ? gsum / (double)na : 0.0;
    m->staleness = na > 0 && s->versions ? p->update_n - (int64_t)vmin : 0;
    m->m_seg = fabs(m->gbar) <= p->cfg.seg_delta;
    m->m_stale = m->staleness <= p->cfg.stale_eta;
    m->m_route = s->routes_ok ? 1 : 0;
    m->m = m->m_seg && m->m_stale && m->m_route;
    if (!acc) return ARL_OK;

    /* Pass 2: statistics of the pi_old pass. */
    int bucket = length_bucket(s->traj_tokens);
    acc->sum[ARL_LACC_SEGS] += 1;
    acc->sum[ARL_LACC_SEG_GEO] += !m->m_seg;
    acc->sum[ARL_LACC_SEG_STALE] += !m->m_stale;
    acc->sum[ARL_LACC_SEG_ROUTE] += !m->m_route;
    acc->sum[ARL_LACC_SEG_ABS_GBAR] += fabs(m->gbar);
    acc->sum[ARL_LACC_STALENESS] += (double)m->staleness;
    acc->sum[ARL_LACC_BUCKET_SEGS + bucket] += 1;
    acc->sum[ARL_LACC_BUCKET_STALE + bucket] += !m->m_stale;
    amax(acc, ARL_LACC_MAX_STALENESS, (double)m->staleness);
    for (int64_t t = 0; t < T; t++) {
        if (!s->loss_mask[t]) continue;
        arl_loss_token k;
        double ref = s->lp_ref ? s->lp_ref[t] : NAN;
        arl_loss_token_eval(p, s->lp_mu[t], s->lp_old[t], s->lp_old[t], ref, s->adv[t], m->m, &k);
        double x = s->lp_old[t] - s->lp_mu[t], ax = fabs(x);
        acc->sum[ARL_LACC_ACTION] += 1;
        acc->sum[ARL_LACC_BAND_MASKED] += !k.m_tok;
        acc->sum[ARL_LACC_TOTAL_MASKED] += !k.m;
        acc->sum[ARL_LACC_ABS_LR] += ax;
        acc->sum[ARL_LACC_K3_MU_OLD] += exp(-x) - 1.0 + x;
        acc->sum[ARL_LACC_HIST + hist_bin(ax)] += 1;
        amax(acc, ARL_LACC_MAX_ABS_LR, ax);
        if (s->turn && s->turn[t] >= 1 && s->turn[t] <= ARL_LOSS_TURN_BINS) {
            acc->sum[ARL_LACC_TURN_N + s->turn[t] - 1] += 1;
            acc->sum[ARL_LACC_TURN_SUM + s->turn[t] - 1] += ax;
        }
        if (s->entropy && isfinite(s->entropy[t])) {
            acc->sum[ARL_LACC_ENT_N] += 1;
            acc->sum[ARL_LACC_ENT_SUM] += s->entropy[t];
        }
        if (!k.m) continue;
        acc->sum[ARL_LACC_UNMASKED] += 1;
        acc->sum[ARL_LACC_W_SUM] += k.w;
        acc->sum[ARL_LACC_TRUNCATED] += k.truncated;
        amax(acc, ARL_LACC_MAX_W, k.w);
        if (s->lp_ref) {
            double d = s->lp_old[t] - s->lp_ref[t];
            acc->sum[ARL_LACC_MW_REF] += k.w;
            acc->sum[ARL_LACC_MW_K1] += k.w * d;
            acc->sum[ARL_LACC_MW_K3] += k.w * (exp(-d) - 1.0 + d);
        }
    }
    return ARL_OK;
}

arl_status arl_loss_seg_step(const arl_loss_params *p, const arl_loss_seg *s,
                             const arl_loss_seg_mask *m, const double *lp_theta, double *loss,
                             double *grad, arl_loss_acc *acc) {
    int64_t T = s->n_tok;
    if (T < 0 || (T > 0 && (!s->loss_mask || !s->lp_mu || !s->lp_old || !s->adv || !lp_theta)))
        return arl_errorf(ARL_ERR_ARG,
                          "loss: segment of %lld tokens without its loss mask, "
                          "log-probabilities or advantages",
                          (long long)T);
    if (!s->lp_ref && p->lambda2 != 0)
        return arl_errorf(ARL_ERR_ARG, "loss: lambda_2 = %g needs reference log-probabilities",
                          p->lambda2);
    double scale = (double)p->minibatches * s->inv_norm;
    double spg = 0, sk2 = 0;
    int64_t n_un = 0, n_clip = 0, n_lo = 0, n_hi = 0;
    double rsum = 0, rmax = -INFINITY;
    for (int64_t t = 0; t < T; t++) {
        if (grad) grad[t] = 0.0;
        if (!s->loss_mask[t]) continue;
        if (!isfinite(lp_theta[t])) return bad_token("l_theta", t, lp_theta[t]);
        if (!m->m) continue;
        arl_loss_token k;
        double ref = s->lp_ref ? s->lp_ref[t] : NAN;
        arl_loss_token_eval(p, s->lp_mu[t], s->lp_old[t], lp_theta[t], ref, s->adv[t], m->m, &k);
        if (!k.m) continue;
        spg += k.pg;
        sk2 += k.k2;
        if (grad) grad[t] = scale * (-k.dpg + p->lambda2 * k.dk2);
        n_un++;
        n_clip += k.clipped;
        n_lo += k.clip_low;
        n_hi += k.clip_high;
        rsum += k.rho;
        if (k.rho > rmax) rmax = k.rho;
    }
    if (loss) *loss = scale * (-spg + p->lambda2 * sk2);
    if (acc) {
        acc->sum[ARL_LACC_STEP_TOKENS] += (double)n_un;
        acc->sum[ARL_LACC_PG] += s->inv_norm * spg;
        acc->sum[ARL_LACC_K2] += s->inv_norm * p->lambda2 * sk2;
        acc->sum[ARL_LACC_CLIP] += (double)n_clip;
        acc->sum[ARL_LACC_CLIP_LOW] += (double)n_lo;
        acc->sum[ARL_LACC_CLIP_HIGH] += (double)n_hi;
        acc->sum[ARL_LACC_RATIO_SUM] += rsum;
        amax(acc, ARL_LACC_MAX_RATIO, rmax);
    }
    return ARL_OK;
}
