/* learner/kl_ctl.h: the adaptive KL controller of spec/objective.md section 7 (a proportional
 * controller with a per-token target) and the KL placement of section 6.2.
 *
 * After update n the coefficient c of the active placement (beta for `reward` and `both`,
 * lambda_2 for `loss`) becomes
 *     e_n     = clip(KL_n / KL_target - 1, -0.2, +0.2)
 *     g_n     = min(N_n / H, 1)                      N_n valid trajectories, H horizon
 *     c_{n+1} = clip(c_n (1 + e_n g_n), c_min, c_max)
 * where KL_n is the k3 estimate of the pi_old pass (learner/loss.h, arl_loss_acc).  The state
 * (c_n and the update count) is two plain numbers, saved in the train state's "extra" object
 * and restored exactly (write reals with 17 significant digits).
 *
 * Not here: estimating KL (learner/loss.c), the KL term of the advantage (reward/), MPI.
 */
#ifndef ARL_LEARNER_KL_CTL_H
#define ARL_LEARNER_KL_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"
#include "reward/reward.h"

typedef enum arl_kl_placement {
    ARL_KL_PLACEMENT_REWARD = 0, /* k1 at turn granularity in the advantage, coefficient beta */
    ARL_KL_PLACEMENT_LOSS = 1,   /* k2 term in the loss, coefficient lambda_2; beta = 0 */
    ARL_KL_PLACEMENT_BOTH = 2,   /* both; the controller adapts beta, lambda_2 stays fixed */
    ARL_KL_PLACEMENT_NONE = 3,   /* neither; KL is still monitored */
} arl_kl_placement;

/* Options (the experiment's table). */
typedef struct arl_kl_opts {
    char *placement; /* reward|loss|both|none */
    double coef;     /* beta_0: initial coefficient for reward/both */
    double lambda2;  /* lambda_2: fixed for both; initial (adapted) for loss */
    double target;   /* KL_target, nats per token */
    double horizon;  /* H, in trajectories */
    double coef_min, coef_max;
} arl_kl_opts;

extern const arl_option arl_kl_options[];
extern const size_t arl_kl_options_count;

typedef struct arl_kl_config {
    arl_kl_placement placement;
    double coef0;              /* beta_0 */
    double lambda2;            /* lambda_2 */
    double target;             /* > 0 */
    double horizon;            /* > 0 */
    double coef_min, coef_max; /* 0 < min <= max */
} arl_kl_config;

/* Defaults of spec/objective.md section 13: reward, 1e-3, 0, 5e-3, 1000, [1e-6, 1]. */
void arl_kl_config_default(arl_kl_config *cfg);
/* ARL_ERR_CONFIG naming the option (e.g. placement loss with lambda2 = 0, min > max). */
arl_status arl_kl_config_from_opts(const arl_kl_opts *o, arl_kl_config *cfg);

typedef struct arl_klctl {
    arl_kl_config cfg;
    double coef;     /* c_n: the active coefficient for the coming update */
    int64_t updates; /* updates completed (n) */
} arl_klctl;

/* What one controller step saw and did (for the metrics kl/coef, kl/target, kl/error). */
typedef struct arl_klctl_step {
    double kl;        /* KL_n as given (NaN: no unmasked token) */
    double error;     /* KL_n / KL_target - 1 (unclipped; 0 when kl is NaN) */
    double e;         /* clipped error e_n */
    double g;         /* gain g_n */
    double coef_used; /* c_n */
    double coef_next; /* c_{n+1} */
    int adapted;      /* 0: placement none, or no estimate / no valid trajectory */
} arl_klctl_step;

/* c_0 = coef0 (reward, both, none) or lambda2 (loss), clipped into [coef_min, coef_max]
 * unless the placement is none. */
arl_status arl_klctl_init(arl_klctl *c, const arl_kl_config *cfg);

/* beta for the advantage (reward/both: c_n; loss/none: 0). */
double arl_klctl_beta(const arl_klctl *c);
/* lambda_2 for the loss (loss: c_n; both: the fixed lambda2; reward/none: 0). */
double arl_klctl_lambda2(const arl_klctl *c);

/* One step after update n.  kl_hat: KL_n (NaN when no unmasked token: c is kept);
 * n_valid: N_n >= 0.  step (may be NULL) receives the details.  ARL_ERR_ARG for a negative
 * n_valid or an infinite or negative kl_hat. */
arl_status arl_klctl_update(arl_klctl *c, double kl_hat, int64_t n_valid, arl_klctl_step *step);

/* Emit kl/coef (c_n), kl/target, kl/error. */
void arl_klctl_emit(const arl_klctl *c, const arl_klctl_step *step, arl_reward_metric_fn fn,
                    void *ctx);

/* The resumable state: plain numbers. */
typedef struct arl_klctl_state {
    double coef;     /* c_n */
    int64_t updates; /* n */
} arl_klctl_state;

void arl_klctl_state_get(const arl_klctl *c, arl_klctl_state *s);
/* ARL_ERR_CORRUPT if coef is not finite, negative, outside [coef_min, coef_max] (placements
 * other than none) or updates < 0; the controller is unchanged then. */
arl_status arl_klctl_state_set(arl_klctl *c, const arl_klctl_state *s);

#endif
