/* learner/loss.h: the policy loss of spec/objective.md section 8 on given log-probabilities --
 * decoupled PPO with asymmetric clipping against the proximal policy pi_old, truncated
 * importance weights from the behaviour policy mu, the token band mask, the per-segment
 * geometric mask, the staleness and route masks, the optional k2 KL term and the constant
 * normaliser Z -- forward and backward (d loss / d l_theta per token), with the metrics of
 * section 12 that come from it.
 *
 * Per action token t of a valid trajectory, segment s = s(t):
 *   rho_t = exp(l_theta - l_old)        u_t = exp(l_old - l_mu)       w_t = min(u_t, C)
 *   m_tok = [1/c <= u_t <= c]           gbar_s = mean_{t' in s} (l_old - l_mu)
 *   m_seg = [|gbar_s| <= delta]         m_stale = [n - min_{t in s} v_t <= eta]
 *   m_t   = m_tok m_seg m_stale m_route
 *   L = -(1/Z) sum m w min(rho A, clip(rho, 1-eps_l, 1+eps_h) A)
 *       + lambda_2 (1/Z) sum m w (l_theta - l_ref)^2 / 2
 * w and m carry no gradient.  d/dl_theta of the min term is rho A where the clipped term is not
 * strictly smaller, else 0.
 *
 * Use per update n: arl_loss_params_init; for every segment of every valid trajectory, after
 * the pi_old and reference passes, arl_loss_seg_prepare (masks + pre-gradient statistics,
 * among them KL_n for the controller); then per minibatch and segment, after the pass at theta,
 * arl_loss_seg_step (loss and gradient).  Everything is float64; the model's float log-probs
 * are widened by the caller.  No MPI here: accumulators are plain sums and maxima that ranks
 * combine (arl_loss_acc_merge, or two allreduces).
 *
 * Not here: the advantages (reward/), the controller (learner/kl_ctl.h), the model.
 */
#ifndef ARL_LEARNER_LOSS_H
#define ARL_LEARNER_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"
#include "reward/reward.h"

typedef enum arl_loss_normaliser {
    ARL_LOSS_NORM_CONSTANT = 0, /* 1/Z, Z = N_traj L_norm (section 8.4) */
    ARL_LOSS_NORM_PER_TRAJ = 1, /* 1/(N_valid |A_i|) per trajectory (per_trajectory_mean) */
} arl_loss_normaliser;

typedef struct arl_loss_opts {
    double clip_low, clip_high; /* eps_l, eps_h */
    double tis_cap;             /* C */
    double token_band;          /* c (band [1/c, c]) */
    double segment_delta;       /* delta */
    int64_t stale_eta;          /* eta */
    char *normaliser;           /* constant|per_trajectory_mean */
    double l_norm;              /* L_norm */
} arl_loss_opts;

extern const arl_option arl_loss_options[];
extern const size_t arl_loss_options_count;

typedef struct arl_loss_config {
    double eps_low, eps_high, tis_cap, band, seg_delta;
    int64_t stale_eta;
    arl_loss_normaliser normaliser;
    double l_norm;
} arl_loss_config;

/* Defaults of spec/objective.md section 13: 0.2, 0.28, 2, 4, 0.01, 16, constant, 65536. */
void arl_loss_config_default(arl_loss_config *cfg);
/* ARL_ERR_CONFIG naming the option. */
arl_status arl_loss_config_from_opts(const arl_loss_opts *o, arl_loss_config *cfg);

/* Everything one update's loss needs. */
typedef struct arl_loss_params {
    arl_loss_config cfg;
    double lambda2;      /* lambda_2 of this update (arl_klctl_lambda2) */
    double z;            /* Z = N_traj L_norm */
    int32_t minibatches; /* M: each optimizer step divides its sum by Z / M */
    int64_t update_n;    /* n, for staleness */
} arl_loss_params;

/* n_traj_per_update: the configured N_traj (groups per update x G), a constant of the run. */
arl_status arl_loss_params_init(arl_loss_params *p, const arl_loss_config *cfg,
                                int64_t n_traj_per_update, int32_t minibatches, double lambda2,
                                int64_t update_n);

/* The per-trajectory factor that replaces 1/Z in section 8.3: 1/Z (constant), or
 * 1/(n_valid * n_action_traj) (per_trajectory_mean; n_action_traj counts the action tokens of
 * all segments of the trajectory, so sibling segments share it; 0 if it is 0). */
double arl_loss_inv_norm(const arl_loss_params *p, int64_t n_valid, int64_t n_action_traj);

/* One segment of a valid trajectory, as the learner holds it.  All arrays (T) are borrowed
 * for the duration of a call; entries at context tokens (loss_mask 0) are ignored. */
typedef struct arl_loss_seg {
    int64_t n_tok;            /* T */
    const uint8_t *loss_mask; /* (T) 1: action token */
    const double *lp_mu;      /* (T) l_mu (behaviour, stored with the segment) */
    const double *lp_old;     /* (T) l_old (pi_old pass) */
    const double *lp_ref;     /* (T) l_ref (reference pass); NULL: none (lambda2 must be 0 and
                                 the KL statistics skip this segment) */
    const double *adv;        /* (T) A_{i,t} (arl_reward_token_adv) */
    const uint32_t *versions; /* (T) policy-version tags; NULL: not stale */
    const double *entropy;    /* (T) entropy of pi_old; NULL: not given */
    const int32_t *turn;      /* (T) 1-based turn index k(t) for mismatch/abs_logratio/turn[k];
                                 NULL: not given */
    int routes_ok;            /* m^route: 1 when routes are present and valid, or routing
                                 replay is off */
    int64_t traj_tokens;      /* tokens of the whole trajectory (stale-mask length buckets) */
    double inv_norm;          /* arl_loss_inv_norm for this trajectory */
} arl_loss_seg;

/* The segment-level masks, computed once per update before any gradient step. */
typedef struct arl_loss_seg_mask {
    int64_t n_action;  /* action tokens of the segment */
    double gbar;       /* mean l_old - l_mu over them (0 when none) */
    int64_t staleness; /* sigma_{i,s}(n) = n - min v (0 without versions or action tokens) */
    uint8_t m_seg, m_stale, m_route;
    uint8_t m; /* m_seg m_stale m_route */
} arl_loss_seg_mask;

/* Every quantity of one action token (section 8.2-8.3, and the table of section 14.4). */
typedef struct arl_loss_token {
    double u, w, rho; /* behaviour ratio, truncated weight, ratio to pi_old */
    int m_tok;        /* band mask */
    int m;            /* m_tok times the segment's mask */
    int truncated;    /* u > C */
    int clipped;      /* m and the clipped term strictly smaller than the unclipped one */
    int clip_low;     /* clipped with rho < 1 - eps_l (A < 0) */
    int clip_high;    /* clipped with rho > 1 + eps_h (A > 0) */
    double pg;        /* m w min(rho A, clip(rho) A) */
    double dpg;       /* d pg / d l_theta */
    double k2;        /* m w (l_theta - l_ref)^2 / 2 */
    double dk2;       /* d k2 / d l_theta */
} arl_loss_token;

/* seg_m: the segment's mask (arl_loss_seg_mask.m).  lp_ref NaN: k2 = dk2 = 0. */
void arl_loss_token_eval(const arl_loss_params *p, double lp_mu, double lp_old, double lp_theta,
                         double lp_ref, double adv, int seg_m, arl_loss_token *out);

/* ---- metric accumulators (sums add, maxima take the max across segments and ranks) ---- */

#define ARL_LOSS_TURN_BINS 16   /* mismatch/abs_logratio/turn[1..16] */
#define ARL_LOSS_HIST_DECADE 30 /* p99 histogram bins per decade of |l_old - l_mu| */
#define ARL_LOSS_HIST_LO (-6)   /* first bin starts at 1e-6; below: one underflow bin */
#define ARL_LOSS_HIST_HI 3      /* last regular bin ends at 1e3; above: one overflow bin */
#define ARL_LOSS_HIST_BINS (ARL_LOSS_HIST_DECADE * (ARL_LOSS_HIST_HI - ARL_LOSS_HIST_LO) + 2)

enum {
    /* prepare (pi_old pass) */
    ARL_LACC_ACTION,       /* action tokens */
    ARL_LACC_UNMASKED,     /* action tokens with m = 1 */
    ARL_LACC_BAND_MASKED,  /* action tokens with m_tok = 0 */
    ARL_LACC_TOTAL_MASKED, /* action tokens with m = 0 */
    ARL_LACC_W_SUM,        /* sum w over unmasked tokens */
    ARL_LACC_TRUNCATED,    /* unmasked tokens with u > C */
    ARL_LACC_MW_REF,       /* sum m w over tokens with a reference log-prob */
    ARL_LACC_MW_K1,        /* sum m w (l_old - l_ref) */
    ARL_LACC_MW_K3,        /* sum m w k3(l_old, l_ref) */
    ARL_LACC_ABS_LR,       /* sum |l_old - l_mu| over action tokens */
    ARL_LACC_K3_MU_OLD,    /* sum exp(l_mu - l_old) - 1 - (l_mu - l_old) */
    ARL_LACC_ENT_N,
    ARL_LACC_ENT_SUM,
    ARL_LACC_SEGS,         /* segments */
    ARL_LACC_SEG_GEO,      /* segments with m_seg = 0 */
    ARL_LACC_SEG_STALE,    /* segments with m_stale = 0 */
    ARL_LACC_SEG_ROUTE,    /* segments with m_route = 0 */
    ARL_LACC_SEG_ABS_GBAR, /* sum |gbar| */
    ARL_LACC_STALENESS,    /* sum of staleness over segments */
    ARL_LACC_BUCKET_SEGS,  /* 4 length buckets: < 32K, < 128K, < 512K, >= 512K tokens */
    ARL_LACC_BUCKET_STALE = ARL_LACC_BUCKET_SEGS + 4,
    ARL_LACC_TURN_N = ARL_LACC_BUCKET_STALE + 4,
    ARL_LACC_TURN_SUM = ARL_LACC_TURN_N + ARL_LOSS_TURN_BINS,
    ARL_LACC_HIST = ARL_LACC_TURN_SUM + ARL_LOSS_TURN_BINS,
    /* step (pass at theta) */
    ARL_LACC_STEP_TOKENS = ARL_LACC_HIST + ARL_LOSS_HIST_BINS, /* unmasked tokens */
    ARL_LACC_PG,                                               /* sum inv_norm m w min(...) */
    ARL_LACC_K2, /* sum inv_norm lambda_2 m w (l_theta - l_ref)^2 / 2 */
    ARL_LACC_CLIP,
    ARL_LACC_CLIP_LOW,
    ARL_LACC_CLIP_HIGH,
    ARL_LACC_RATIO_SUM, /* sum rho over unmasked tokens */
    ARL_LACC_NSUM
};
enum {
    ARL_LACC_MAX_ABS_LR, /* max |l_old - l_mu| */
    ARL_LACC_MAX_W,      /* max w over unmasked tokens */
    ARL_LACC_MAX_STALENESS,
    ARL_LACC_MAX_RATIO, /* max rho over unmasked tokens */
    ARL_LACC_NMAX
};

typedef struct arl_loss_acc {
    double sum[ARL_LACC_NSUM];
    double max[ARL_LACC_NMAX]; /* -INFINITY when nothing was seen */
} arl_loss_acc;

void arl_loss_acc_init(arl_loss_acc *a);
void arl_loss_acc_merge(arl_loss_acc *dst, const arl_loss_acc *src);
/* KL_n of section 7 (k3 of pi_old against the reference, weighted by m w), at least 0 (a
 * float64 sum of k3 terms of rounding-size x can fall below 0); NaN when no unmasked token had
 * a reference log-prob. */
double arl_loss_acc_kl_hat(const arl_loss_acc *a);
/* kl/k1. NaN likewise. */
double arl_loss_acc_kl_k1(const arl_loss_acc *a);
/* p99 of |l_old - l_mu| over action tokens from the histogram: the upper edge of the bin that
 * reaches 99 % (at most 10^(1/30), 8 %, above the exact value), capped at the exact max. */
double arl_loss_acc_abs_logratio_p99(const arl_loss_acc *a);

/* Emit kl/k1, kl/k3, loss/k2, loss/pg, loss/total, mismatch/abs_logratio/{mean,p99,turn[k]},
 * mismatch/segment_geo/mean_abs, mismatch/k3_mu_old, is/{weight_mean,weight_max,
 * truncated_frac}, mask/{token_band_frac,segment_geo_frac,stale_frac,stale_frac/<bucket>,
 * route_frac,total_frac}, staleness/{mean,max}, policy/entropy (when given),
 * ppo/{clip_frac,clip_frac_low,clip_frac_high,ratio_mean,ratio_max}.  loss/{pg,k2,total} are
 * the section 8.3 values of all steps accumulated (sum over minibatches of the minibatch sums
 * divided by Z);
 * ppo/ratio_* are over the steps accumulated in `a` (the spec logs the last minibatch: pass
 * that minibatch's accumulator).  A statistic over an empty set is emitted as 0. */
void arl_loss_acc_emit(const arl_loss_acc *a, arl_reward_metric_fn fn, void *ctx);

/* ---- the two passes ---- */

/* Masks of one segment and its pre-gradient statistics (acc may be NULL).  ARL_ERR_ARG for a
 * non-finite log-prob or advantage at an action token, a version tag above n, or lp_ref NULL
 * with lambda2 != 0 (each naming the token). */
arl_status arl_loss_seg_prepare(const arl_loss_params *p, const arl_loss_seg *s,
                                arl_loss_seg_mask *m, arl_loss_acc *acc);

/* Forward and backward of one segment at theta.  lp_theta: (T).  *loss receives this
 * segment's term of the optimizer step's objective, M * inv_norm * (-sum pg + lambda2 sum k2)
 * (the minibatch loss is the sum over its segments); grad (T, may be NULL) receives
 * d loss / d lp_theta (0 at context and masked tokens).  acc (may be NULL) receives the
 * step statistics.  ARL_ERR_ARG for a non-finite lp_theta at an action token. */
arl_status arl_loss_seg_step(const arl_loss_params *p, const arl_loss_seg *s,
                             const arl_loss_seg_mask *m, const double *lp_theta, double *loss,
                             double *grad, arl_loss_acc *acc);

#endif
