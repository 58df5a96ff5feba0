/* reward/reward.h: rewards at three levels (process, segment, outcome), their returns-to-go,
 * leave-one-out baselines, decoupled normalisation, the k1 KL penalty at turn granularity and
 * the per-token advantage of spec/objective.md sections 4-5 (and the metrics of section 12
 * that come from them).
 *
 * What this is: pure math on plain arrays, in float64, deterministic (fixed summation order:
 * group, trajectory, index).  What this is not: storage (the learner fills the structs below
 * from the replay store), the model, the loss (learner/loss.h), the KL controller
 * (learner/kl_ctl.h: it supplies beta), the client-side substitutions of spec/objective.md
 * sections 3.3 and 4.3 (q = 0 for an unscorable segment, range_lo for an unscorable outcome:
 * the scalar values given here are already the ones trained on; with components configured,
 * arl_reward_traj's unscorable flags make them so).
 *
 * Notation (spec/objective.md section 2): a group holds G trajectories i of one task; V are
 * the valid ones (status complete or truncated); O_i = V \ {i}.  Trajectory i has turns
 * k = 1..K (stored 0-based here: turns[k-1]) and segments s = 0..S-1; s(k) is the segment of
 * turn k.  Levels: O outcome, S segment, P process.
 *
 * Usage:
 *   arl_reward_config cfg; arl_reward_config_from_opts(&opts, &cfg);   (or _default)
 *   for each trajectory: fill turns (tok ranges, seg), rewards; zero n_action and kappa, then
 *     arl_reward_turns_scan() over each segment's token window (counts action tokens, sums the
 *     per-turn k1 increment kappa from the pi_old and reference log-probs);
 *   arl_reward_compute(&cfg, groups, n_groups, beta, allreduce, ctx, &acc);
 *   for each segment window: arl_reward_token_adv() -> the per-token advantages for the loss.
 */
#ifndef ARL_REWARD_REWARD_H
#define ARL_REWARD_REWARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"

/* ------------------------------------------------------------------------------------------ */
/* Enumerations                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum arl_reward_level {
    ARL_REWARD_LEVEL_OUTCOME = 0, /* R_i, from score(episode) */
    ARL_REWARD_LEVEL_SEGMENT = 1, /* q_{i,s}, from score(segment) */
    ARL_REWARD_LEVEL_PROCESS = 2, /* p_{i,k}, from the step response of step k */
    ARL_REWARD_NLEVELS = 3
} arl_reward_level;

/* "outcome", "segment", "process". */
const char *arl_reward_level_name(arl_reward_level l);

typedef enum arl_reward_traj_status {
    ARL_REWARD_TRAJ_COMPLETE = 0,  /* valid */
    ARL_REWARD_TRAJ_TRUNCATED = 1, /* valid */
    ARL_REWARD_TRAJ_MASKED = 2,    /* not in V: no loss, baseline, normalisation or KL term */
} arl_reward_traj_status;

typedef enum arl_reward_form {
    ARL_REWARD_FORM_AUTO = 0, /* component form from its declared source: rule -> sum, model ->
                                 min (arl_reward_group.process_model, or
                                 arl_reward_config_set_source); unresolved -> sum */
    ARL_REWARD_FORM_SUM = 1,  /* G_k = sum_{k'>=k} gamma_P^{k'-k} p_{k'} */
    ARL_REWARD_FORM_MIN = 2,  /* G_k = min_{k'>=k} p_{k'} */
} arl_reward_form;

typedef enum arl_reward_norm {
    ARL_REWARD_NORM_NONE = 0,  /* A~ = A */
    ARL_REWARD_NORM_BATCH = 1, /* sigma over all entries of the update (every rank) */
    ARL_REWARD_NORM_GROUP = 2, /* sigma over the entries of the trajectory's group */
} arl_reward_norm;

typedef enum arl_reward_process_baseline {
    ARL_REWARD_PB_TURN_INDEX = 0, /* leave-one-out by turn index (section 5.4 rule 2) */
    ARL_REWARD_PB_ANCHOR = 1,     /* anchor groups first, turn index otherwise (rule 1) */
} arl_reward_process_baseline;

typedef enum arl_reward_segment_baseline {
    ARL_REWARD_SB_LOO = 0, /* leave-one-out by segment index */
    ARL_REWARD_SB_MC = 1,  /* Monte-Carlo forks where given (arl_reward_traj.seg_mc_baseline) */
} arl_reward_segment_baseline;

typedef enum arl_reward_kl_scope {
    ARL_REWARD_KL_TRAJECTORY = 0, /* D_{i,k} = sum_{k'>=k} kappa_{i,k'} (default, unbiased) */
    ARL_REWARD_KL_SEGMENT = 1,    /* D_{i,k} = sum_{k'>=k, s(k')=s(k)} kappa_{i,k'} (biased) */
} arl_reward_kl_scope;

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                               */
/* ------------------------------------------------------------------------------------------ */

#define ARL_REWARD_MAX_COMPONENTS 32 /* configured components per level */
#define ARL_REWARD_NAME_BYTES 64     /* component names, as in spec/aep.md section 3 */

typedef struct arl_reward_component {
    char name[ARL_REWARD_NAME_BYTES + 1];
    double weight;        /* w_c of spec/aep.md section 4.8 rule 5 */
    arl_reward_form form; /* process level only; ignored elsewhere */
} arl_reward_component;

typedef struct arl_reward_config {
    double w[ARL_REWARD_NLEVELS]; /* w_O, w_S, w_P (indexed by arl_reward_level); 0: absent */
    double gamma_segment;         /* gamma_S in [0, 1] */
    double gamma_process;         /* gamma_P in [0, 1] (sum form) */
    arl_reward_form process_form; /* form of the scalar process reward (no components) */
    arl_reward_process_baseline process_baseline;
    arl_reward_segment_baseline segment_baseline;
    int32_t mc_forks; /* M: continuations forked at each inner segment boundary of a trained
                         trajectory when segment_baseline is mc (the train driver forks them) */
    arl_reward_norm norm[ARL_REWARD_NLEVELS]; /* scope per level */
    double sigma_min;                         /* sigma floor of section 5.6 */
    arl_reward_kl_scope kl_scope;             /* kl.rtg_scope */
    /* Components per level.  With n_comp[L] == 0 the level reward is the scalar `reward`;
     * otherwise it is sum_c w_c value_c (spec/aep.md section 4.8 rule 5). */
    int32_t n_comp[ARL_REWARD_NLEVELS];
    arl_reward_component comp[ARL_REWARD_NLEVELS][ARL_REWARD_MAX_COMPONENTS];
} arl_reward_config;

/* The defaults of spec/objective.md section 13 (no components). */
void arl_reward_config_default(arl_reward_config *cfg);

/* Number of value columns a trajectory supplies for level l: max(1, n_comp[l]). */
int32_t arl_reward_config_ncols(const arl_reward_config *cfg, arl_reward_level l);

/* Resolve FORM_AUTO process components from the environment's declaration
 * (/info reward_components[].source): source_model 1 -> min, 0 -> sum.  Components not named
 * here stay AUTO and are treated as sum (rule is the declared default). */
void arl_reward_config_set_source(arl_reward_config *cfg, const char *name, int source_model);

/* The experiment's option table for the objective's reward side (one source of truth for
 * parsing, --help and the printed configuration).  Component lists take "name=weight" or, for
 * process components, "name=weight:sum|min|auto", e.g.
 *   "process-components": ["tool_ok=1", "prm=0.5:min"];
 * an entry "none" drops the entries before it (a --set entry adds to the file's list, so
 * "--set learner.process-components=none" returns the level to its scalar reward). */
typedef struct arl_reward_opts {
    double w_outcome, w_segment, w_process;
    double gamma_segment, gamma_process;
    char *process_form;                               /* sum|min */
    char *process_baseline;                           /* turn_index|anchor */
    char *segment_baseline;                           /* loo|mc */
    int64_t mc_forks;                                 /* segment_baseline mc: M */
    char *norm_outcome, *norm_segment, *norm_process; /* none|batch|group */
    double sigma_min;
    char *kl_rtg_scope; /* trajectory|segment */
    arl_strlist outcome_components, segment_components, process_components;
} arl_reward_opts;

extern const arl_option arl_reward_options[];
extern const size_t arl_reward_options_count;

/* Resolve parsed options into a config.  ARL_ERR_CONFIG naming the option for a malformed
 * component entry, a duplicate name or too many components. */
arl_status arl_reward_config_from_opts(const arl_reward_opts *o, arl_reward_config *cfg);

/* ------------------------------------------------------------------------------------------ */
/* Input: groups of trajectories                                                               */
/* ------------------------------------------------------------------------------------------ */

/* One turn (AEP step k = index + 1).  Token positions are offsets in the trajectory's token
 * stream (spec/replay.md turns.act_tok_start/end); the action tokens of the turn are the
 * tokens of [tok_start, tok_end) whose loss mask is 1. */
typedef struct arl_reward_turn {
    int64_t tok_start, tok_end; /* [start, end) in the trajectory token stream */
    int32_t seg;                /* s(k), 0-based; non-decreasing by at most 1 per turn */
    const char *anchor;         /* a_{i,k}: info.anchor of the response to step k-1; NULL:
                                   absent.  Borrowed; read during arl_reward_compute only */
    /* Filled by arl_reward_turns_scan (zero both first) or by the caller: */
    int64_t n_action; /* action tokens of the turn */
    double kappa;     /* kappa_{i,k} = sum over them of (l_old - l_ref) */
} arl_reward_turn;

/* Per-trajectory outputs, written by arl_reward_compute.  Every array pointer is optional
 * (NULL: not wanted), owned by the caller and sized as noted.  A masked trajectory gets zeros
 * everywhere. */
typedef struct arl_reward_traj_out {
    double *adv_turn;     /* (K) A_{i,k}: the advantage of every action token of turn k */
    double *seg_rtg;      /* (S) G^S_{i,s} */
    double *seg_base;     /* (S) b^S_{i,s} */
    double *seg_adv_raw;  /* (S) A^S_{i,s} */
    double *seg_adv;      /* (S) A~^S_{i,s} (normalised) */
    double *proc_rtg;     /* (K) G^P_{i,k} */
    double *proc_base;    /* (K) b^P_{i,k} */
    double *proc_adv_raw; /* (K) A^P_{i,k} */
    double *proc_adv;     /* (K) A~^P_{i,k} */
    double *kl_rtg;       /* (K) D_{i,k} */
    double *kl_base;      /* (K) b^D_{i,k} */
    /* scalars, always written: */
    double outcome;         /* derived R_i (0 when masked or the level is absent) */
    double outcome_adv_raw; /* A^O_i */
    double outcome_adv;     /* A~^O_i */
} arl_reward_traj_out;

typedef struct arl_reward_traj {
    arl_reward_traj_status status;
    int32_t n_turns;              /* K >= 0 */
    int32_t n_segs;               /* S >= 0; every segment holds >= 1 turn, so S = 0 iff K = 0 */
    const arl_reward_turn *turns; /* (K) borrowed */
    /* Rewards, row-major with ncols = arl_reward_config_ncols(cfg, level) columns: the
     * configured components in config order (NaN: missing in the response -> counts as 0 and
     * is counted), or the scalar `reward` when the level has no components.  May be NULL for
     * an absent level or a masked trajectory. */
    const double *process;             /* (K, ncols_P) p^c_{i,k} */
    const double *segment;             /* (S, ncols_S) q^c_{i,s} */
    const double *outcome;             /* (ncols_O) R^c_i */
    const uint8_t *segment_unscorable; /* (S) 1: the score said scorable:false: q = 0, whatever
                                          the segment columns hold (spec 3.3); NULL: none */
    int outcome_unscorable;            /* 1: the score said scorable:false: R_i = outcome_lo,
                                          whatever the outcome columns hold (spec 4.3) */
    double outcome_lo;                 /* with outcome_unscorable: the client's substitute, the
                                          lower end of the declared outcome range */
    const double *seg_mc_baseline;     /* (S) segment_baseline mc: mean G^S_{.,s} over forks of
                                          this trajectory at the start of s; NaN (or NULL array):
                                          no forks, the leave-one-out baseline applies */
    arl_reward_traj_out out;           /* outputs */
} arl_reward_traj;

typedef struct arl_reward_group {
    int32_t n;                                /* G: members, masked ones included */
    arl_reward_traj *trajs;                   /* (G) borrowed; outputs are written into them */
    uint8_t level_absent[ARL_REWARD_NLEVELS]; /* 1: the environment does not produce the level
                                                 (undeclared in /info); 0-initialised: present */
    /* Per configured process component c: 1 when the group's environment declares it with
     * source "model", which makes its form `auto` the min form (spec/objective.md 13,
     * arl_reward_sources_from_info); 0-initialised: source rule, form auto is sum.  A form
     * given in the configuration (sum, min, or set by arl_reward_config_set_source) wins. */
    uint8_t process_model[ARL_REWARD_MAX_COMPONENTS];
} arl_reward_group;

/* Check the configured components against an environment's /info JSON text
 * (reward_components[]: name, level): every component of every level must be one the
 * environment declares at that level.  One it does not declare never appears in a response, so
 * it would count as 0 (a missing component, spec/aep.md 4.8 rule 5) in every trajectory and the
 * level would train on nothing: a mistake in the run configuration (a typo, another
 * environment's name).  ENV names the environment in the message (NULL: "the environment").
 * Text that is not JSON, or has no reward_components array, is not checked (ARL_OK).
 * ARL_ERR_CONFIG naming the key (learner.<level>-components), the component and what the
 * environment declares at that level; ARL_ERR_NOMEM when the text could not be parsed for want
 * of memory. */
arl_status arl_reward_config_check_info(const arl_reward_config *cfg, const char *env,
                                        const char *info_json);

/* The process_model flags of arl_reward_group from an environment's /info JSON text
 * (reward_components[]: name, level, source): flags[c] = 1 for each configured process
 * component c that /info declares at level "process" with source "model", else 0.  Text that
 * is not JSON, or has no reward_components, gives all 0 (source rule is the default).
 * ARL_OK; ARL_ERR_CONFIG when a configured component of any level is not declared
 * (arl_reward_config_check_info, the environment named by /info's env.name; flags all 0); or
 * ARL_ERR_NOMEM when the text could not be parsed for want of memory (flags all 0: not an
 * answer; the caller stops, it does not train the group under the source rule). */
arl_status arl_reward_sources_from_info(const arl_reward_config *cfg, const char *info_json,
                                        uint8_t flags[ARL_REWARD_MAX_COMPONENTS]);

/* ------------------------------------------------------------------------------------------ */
/* Metrics                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Receives one metric (name as in spec/objective.md section 12). */
typedef void (*arl_reward_metric_fn)(void *ctx, const char *name, double value);

/* Sum of vals[0..n-1] element-wise over all processes that compute one update, in place
 * (MPI_Allreduce with MPI_SUM).  NULL: one process. */
typedef arl_status (*arl_reward_allreduce_fn)(double *vals, int32_t n, void *ctx);

/* Mergeable accumulators of the reward and advantage metrics: every field of sum[] adds, every
 * field of max[] takes the maximum, so ranks combine them with two allreduces (SUM, MAX) or
 * arl_reward_acc_merge.  Component means are per configured component. */
enum {
    ARL_RACC_GROUPS,            /* groups */
    ARL_RACC_GROUPS_EMPTY,      /* |V| = 0 */
    ARL_RACC_GROUPS_DEGENERATE, /* |V| = 1 */
    ARL_RACC_GROUPS_OUTCOME_ZV, /* |V| >= 2 and all outcomes equal */
    ARL_RACC_TRAJ_COMPLETE,
    ARL_RACC_TRAJ_TRUNCATED,
    ARL_RACC_TRAJ_MASKED,
    ARL_RACC_OUTCOME_UNSCORABLE, /* valid trajectories with outcome_unscorable */
    ARL_RACC_SEGMENT_UNSCORABLE, /* segments (valid, level present) with segment_unscorable */
    /* per level L (3 consecutive entries each, indexed by arl_reward_level): */
    ARL_RACC_REW_N = ARL_RACC_SEGMENT_UNSCORABLE + 1, /* entries of the level */
    ARL_RACC_REW_SUM = ARL_RACC_REW_N + 3,            /* derived level reward sum */
    ARL_RACC_REW_SQ = ARL_RACC_REW_SUM + 3,           /* and sum of squares */
    ARL_RACC_ADV_SUM = ARL_RACC_REW_SQ + 3,           /* raw A^L */
    ARL_RACC_ADV_SQ = ARL_RACC_ADV_SUM + 3,
    ARL_RACC_SIGMA_SUM = ARL_RACC_ADV_SQ + 3, /* group scope: sigma per group */
    ARL_RACC_SIGMA_N = ARL_RACC_SIGMA_SUM + 3,
    ARL_RACC_MISSING = ARL_RACC_SIGMA_N + 3,         /* component values missing (NaN) */
    ARL_RACC_NO_BASELINE_SEG = ARL_RACC_MISSING + 3, /* segment entries without baseline */
    ARL_RACC_NO_BASELINE_PROC,                       /* process entries without baseline */
    ARL_RACC_ANCHOR_HITS, /* process entries whose baseline came from anchor groups */
    ARL_RACC_MC_BASELINE, /* segment entries whose baseline came from forks */
    ARL_RACC_KL_N,
    ARL_RACC_KL_SUM,
    ARL_RACC_KL_SQ, /* beta (D - b^D) per valid turn */
    ARL_RACC_TOK_N,
    ARL_RACC_TOK_SUM,
    ARL_RACC_TOK_SQ, /* A_{i,t} over action tokens (from
                        turns[].n_action) */
    /* per level, per component: count of present values and their sum */
    ARL_RACC_COMP_N = ARL_RACC_TOK_SQ + 1,
    ARL_RACC_COMP_SUM = ARL_RACC_COMP_N + ARL_REWARD_NLEVELS * ARL_REWARD_MAX_COMPONENTS,
    ARL_RACC_NSUM = ARL_RACC_COMP_SUM + ARL_REWARD_NLEVELS * ARL_REWARD_MAX_COMPONENTS
};
enum {
    ARL_RACC_TOK_MAX,     /* max A_{i,t} */
    ARL_RACC_TOK_NEGMIN,  /* -min A_{i,t} */
    ARL_RACC_SIGMA_BATCH, /* per level: batch-scope sigma (equal on every rank) */
    ARL_RACC_NMAX = ARL_RACC_SIGMA_BATCH + 3
};

typedef struct arl_reward_acc {
    double sum[ARL_RACC_NSUM];
    double max[ARL_RACC_NMAX]; /* -INFINITY when nothing was seen */
} arl_reward_acc;

void arl_reward_acc_init(arl_reward_acc *a);
void arl_reward_acc_merge(arl_reward_acc *dst, const arl_reward_acc *src);

/* Emit the metrics: rollout/trajectories/{complete,truncated,masked}, reward/<level>/mean|std,
 * reward/<level>/<component>/mean, reward/<level>/missing_components,
 * reward/{segment,outcome}_unscorable_frac, groups/{degenerate,outcome_zero_variance,empty}_frac,
 * adv/<level>/mean|std|sigma, adv/kl_term/mean|std, adv/token/mean|std|min|max,
 * adv/{segment,process}_no_baseline_frac, adv/anchor_hit_frac, adv/segment_mc_baseline_frac,
 * kl/rtg_scope.  A statistic over an empty set is emitted as 0. */
void arl_reward_acc_emit(const arl_reward_acc *a, const arl_reward_config *cfg,
                         arl_reward_metric_fn fn, void *ctx);

/* ------------------------------------------------------------------------------------------ */
/* Computation                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Return-to-go of one sequence x (n), in place-safe (out may equal x):
 * sum form out[k] = x[k] + gamma * out[k+1]; min form out[k] = min(x[k], out[k+1]). */
void arl_reward_rtg(const double *x, int32_t n, arl_reward_form form, double gamma, double *out);

/* G^S of a continuation at its first segment (spec/objective.md 5.3, segment_baseline mc): the
 * gamma_S-discounted sum of its segment rewards q over its S >= 1 segments, rows (S,
 * ncols_S) as in arl_reward_traj.segment (a NaN component counts as 0).  NaN when a scalar
 * reward is not finite: such a continuation gives no baseline. */
double arl_reward_segment_return(const arl_reward_config *cfg, const double *segment, int32_t S);

/* Add the tokens of one window of the trajectory stream, positions [tok_off, tok_off + n),
 * to turns[].n_action (tokens with loss_mask 1 inside a turn's range) and, when lp_old and
 * lp_ref are given, to turns[].kappa (sum of lp_old - lp_ref over those tokens, in token
 * order).  Windows may come in any order; each position must be scanned once.
 * loss_mask, lp_old, lp_ref: (n), borrowed.  ARL_ERR_ARG for a non-finite log-prob at an
 * action token (names the position). */
arl_status arl_reward_turns_scan(arl_reward_turn *turns, int32_t n_turns, int64_t tok_off,
                                 int64_t n, const uint8_t *loss_mask, const double *lp_old,
                                 const double *lp_ref);

/* Advantages of every trajectory of every group (sections 5.2-5.8, 5.9) with KL coefficient
 * beta (the controller's c_n for placements reward/both, 0 otherwise).  Writes each
 * trajectory's `out`.  Batch-scope normalisation uses the entries of all groups given here
 * and, when allreduce is set, of every other process: then every process must call this the
 * same number of times, with the same cfg (it calls allreduce exactly twice, also with no
 * groups).  acc (may be NULL) is added to, not reset.  Errors (ARL_ERR_ARG, ARL_ERR_NOMEM, or
 * the allreduce's status) name the group, trajectory and index; no output is meaningful then. */
arl_status arl_reward_compute(const arl_reward_config *cfg, arl_reward_group *groups,
                              int32_t n_groups, double beta, arl_reward_allreduce_fn allreduce,
                              void *allreduce_ctx, arl_reward_acc *acc);

/* Per-token advantages A_{i,t} for stream positions [tok_off, tok_off + n) of a trajectory
 * whose out.adv_turn was computed: the turn's advantage at action tokens (loss_mask 1 inside a
 * turn's range), 0 at every other token, all 0 for a masked trajectory.  loss_mask: (n);
 * adv: (n) out.  ARL_ERR_ARG if out.adv_turn is NULL for a valid trajectory with turns. */
arl_status arl_reward_token_adv(const arl_reward_traj *tr, int64_t tok_off, int64_t n,
                                const uint8_t *loss_mask, double *adv);

#endif
