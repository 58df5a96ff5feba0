/* reward/advantage.c: returns-to-go, leave-one-out baselines, decoupled normalisation, the k1
 * KL reward term and the per-turn advantage (spec/objective.md sections 4-5).
 *
 * Everything is float64 and summed in a fixed order (group, trajectory, index; others j in
 * ascending order), so one process gives bit-identical results for identical inputs.  Not
 * here: configuration (reward/config.c), token-level mapping and the KL scan
 * (reward/tokens.c), metrics emission (reward/stats.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reward/reward.h"

enum {
    LO = ARL_REWARD_LEVEL_OUTCOME,
    LS = ARL_REWARD_LEVEL_SEGMENT,
    LP = ARL_REWARD_LEVEL_PROCESS
};

/* Working values of one trajectory (pointers into one block). */
typedef struct tw {
    int valid;
    double R, ao_raw, ao;                   /* R_i, A^O_i, A~^O_i */
    double *s_rtg, *s_base, *s_raw, *s_adv; /* (S) */
    uint8_t *s_nobase;                      /* (S) */
    double *p_rtg, *p_base, *p_raw, *p_adv; /* (K) */
    uint8_t *p_nobase, *p_anchor;           /* (K) */
    double *d, *d_base;                     /* (K) */
} tw;

typedef struct anchor_entry {
    const char *a;
    int32_t j, k;
} anchor_entry;

static int anchor_cmp(const void *x, const void *y) {
    const anchor_entry *p = x, *q = y;
    int c = strcmp(p->a, q->a);
    if (c) return c;
    if (p->j != q->j) return p->j < q->j ? -1 : 1;
    return (p->k > q->k) - (p->k < q->k);
}

void arl_reward_rtg(const double *x, int32_t n, arl_reward_form form, double gamma, double *out) {
    if (n <= 0) return;
    if (form == ARL_REWARD_FORM_MIN) {
        double m = x[n - 1];
        out[n - 1] = m;
        for (int32_t k = n - 2; k >= 0; k--) {
            if (x[k] < m) m = x[k];
            out[k] = m;
        }
    } else {
        double g = x[n - 1];
        out[n - 1] = g;
        for (int32_t k = n - 2; k >= 0; k--) {
            g = x[k] + gamma * g;
            out[k] = g;
        }
    }
}

static int level_on(const arl_reward_config *cfg, const arl_reward_group *g, int l) {
    return cfg->w[l] != 0 && !g->level_absent[l];
}

/* Derived level reward of one row (spec/aep.md 4.8 rule 5); counts missing components. */
static double derive(const arl_reward_config *cfg, int l, const double *row, double *missing) {
    if (cfg->n_comp[l] == 0) return row[0];
    double v = 0;
    for (int32_t c = 0; c < cfg->n_comp[l]; c++) {
        if (isnan(row[c])) {
            *missing += 1;
            continue;
        }
        v += cfg->comp[l][c].weight * row[c];
    }
    return v;
}

double arl_reward_segment_return(const arl_reward_config *cfg, const double *segment, int32_t S) {
    const int32_t nc = arl_reward_config_ncols(cfg, ARL_REWARD_LEVEL_SEGMENT);
    double miss = 0, g = 0;
    for (int32_t s = S - 1; s >= 0; s--) {
        const double q = derive(cfg, ARL_REWARD_LEVEL_SEGMENT, segment + (size_t)s * nc, &miss);
        if (!isfinite(q)) return NAN;
        g = s == S - 1 ? q : q + cfg->gamma_segment * g;
    }
    return S > 0 ? g : NAN;
}

static void add_components(arl_reward_acc *acc, const arl_reward_config *cfg, int l,
                           const double *row) {
    if (!acc) return;
    for (int32_t c = 0; c < cfg->n_comp[l]; c++) {
        if (isnan(row[c])) continue;
        acc->sum[ARL_RACC_COMP_N + l * ARL_REWARD_MAX_COMPONENTS + c] += 1;
        acc->sum[ARL_RACC_COMP_SUM + l * ARL_REWARD_MAX_COMPONENTS + c] += row[c];
    }
}

/* Rewards of one level: rows (turns, segments or 1) x nc columns. */
static arl_status check_values(const double *v, int64_t rows, int32_t nc, int allow_nan, int32_t gi,
                               int32_t ti, const char *what) {
    static const char *const nan_note = " or NaN for a missing component";
    for (int64_t x = 0; x < rows * nc; x++) {
        if (isfinite(v[x]) || (allow_nan && isnan(v[x]))) continue;
        return arl_errorf(ARL_ERR_ARG,
                          "reward: group %d trajectory %d: %s reward %lld, column %lld is %g "
                          "(expected a finite number%s)",
                          gi, ti, what, (long long)(x / nc), (long long)(x % nc), v[x],
                          allow_nan ? nan_note : "");
    }
    return ARL_OK;
}

static arl_status validate_traj(const arl_reward_config *cfg, const arl_reward_group *g, int32_t gi,
                                int32_t ti) {
    const arl_reward_traj *t = &g->trajs[ti];
    if (t->status != ARL_REWARD_TRAJ_COMPLETE && t->status != ARL_REWARD_TRAJ_TRUNCATED &&
        t->status != ARL_REWARD_TRAJ_MASKED)
        return arl_errorf(ARL_ERR_ARG, "reward: group %d trajectory %d: unknown status %d", gi, ti,
                          (int)t->status);
    if (t->n_turns < 0 || t->n_segs < 0)
        return arl_errorf(ARL_ERR_ARG,
                          "reward: group %d trajectory %d: negative turn or "
                          "segment count (%d, %d)",
                          gi, ti, t->n_turns, t->n_segs);
    if (t->status == ARL_REWARD_TRAJ_MASKED) return ARL_OK;
    int32_t K = t->n_turns, S = t->n_segs;
    if ((K == 0) != (S == 0))
        return arl_errorf(ARL_ERR_ARG,
                          "reward: group %d trajectory %d: %d turns in %d segments "
                          "(every segment holds at least one turn)",
                          gi, ti, K, S);
    if (K > 0 && !t->turns)
        return arl_errorf(ARL_ERR_ARG, "reward: group %d trajectory %d: turns array missing", gi,
                          ti);
    for (int32_t k = 0; k < K; k++) {
        const arl_reward_turn *u = &t->turns[k];
        int32_t prev = k ? t->turns[k - 1].seg : 0;
        int ok = k == 0 ? u->seg == 0 : (u->seg == prev || u->seg == prev + 1);
        if (!ok)
            return arl_errorf(ARL_ERR_ARG,
                              "reward: group %d trajectory %d: turn %d lies in "
                              "segment %d after segment %d (segments are consecutive, from 0)",
                              gi, ti, k + 1, u->seg, prev);
        if (u->tok_start < 0 || u->tok_end < u->tok_start ||
            (k && u->tok_start < t->turns[k - 1].tok_end))
            return arl_errorf(ARL_ERR_ARG,
                              "reward: group %d trajectory %d: turn %d has token "
                              "range [%lld, %lld) (ranges must be ordered and disjoint)",
                              gi, ti, k + 1, (long long)u->tok_start, (long long)u->tok_end);
        if (!isfinite(u->kappa) || u->n_action < 0)
            return arl_errorf(ARL_ERR_ARG,
                              "reward: group %d trajectory %d: turn %d has kappa "
                              "%g and %lld action tokens",
                              gi, ti, k + 1, u->kappa, (long long)u->n_action);
    }
    if (K > 0 && t->turns[K - 1].seg != S - 1)
        return arl_errorf(ARL_ERR_ARG,
                          "reward: group %d trajectory %d: the last turn lies in "
                          "segment %d of %d",
                          gi, ti, t->turns[K - 1].seg, S);
    if (t->outcome_unscorable && !isfinite(t->outcome_lo))
        return arl_errorf(ARL_ERR_ARG,
                          "reward: group %d trajectory %d: unscorable outcome with substitute "
                          "%g (expected the finite lower end of the outcome range)",
                          gi, ti, t->outcome_lo);
    static const char *const what[3] = {"outcome", "segment", "process"};
    for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
        if (!level_on(cfg, g, l)) continue;
        const double *v = l == LO ? t->outcome : l == LS ? t->segment : t->process;
        int64_t rows = l == LO ? 1 : l == LS ? S : K;
        if (rows == 0) continue;
        if (!v)
            return arl_errorf(ARL_ERR_ARG, "reward: group %d trajectory %d: %s rewards missing", gi,
                              ti, what[l]);
        int32_t nc = arl_reward_config_ncols(cfg, (arl_reward_level)l);
        ARL_TRY(check_values(v, rows, nc, cfg->n_comp[l] > 0, gi, ti, what[l]));
    }
    return ARL_OK;
}

/* Population moments over a set of entries: accumulated in a fixed order. */
typedef struct moments {
    double n, sum, ssd;
} moments;

static double sigma_of(const moments *m) {
    return m->n > 0 ? sqrt(m->ssd / m->n) : 0.0;
}

static double apply_sigma(double a, double sigma, double sigma_min) {
    return sigma >= sigma_min && sigma > 0 ? a / sigma : a;
}

/* Visit every entry of level l of group g (valid trajectories, level on). */
#define FOR_ENTRIES(cfg, g, w, l, body)                                                            \
    do {                                                                                           \
        if (level_on(cfg, g, l))                                                                   \
            for (int32_t ti_ = 0; ti_ < (g)->n; ti_++) {                                           \
                tw *tw_ = &(w)[ti_];                                                               \
                const arl_reward_traj *tr_ = &(g)->trajs[ti_];                                     \
                if (!tw_->valid) continue;                                                         \
                if ((l) == LO) {                                                                   \
                    double *x_ = &tw_->ao_raw;                                                     \
                    double *y_ = &tw_->ao;                                                         \
                    body;                                                                          \
                } else if ((l) == LS) {                                                            \
                    for (int32_t s_ = 0; s_ < tr_->n_segs; s_++) {                                 \
                        double *x_ = &tw_->s_raw[s_];                                              \
                        double *y_ = &tw_->s_adv[s_];                                              \
                        body;                                                                      \
                    }                                                                              \
                } else {                                                                           \
                    for (int32_t k_ = 0; k_ < tr_->n_turns; k_++) {                                \
                        double *x_ = &tw_->p_raw[k_];                                              \
                        double *y_ = &tw_->p_adv[k_];                                              \
                        body;                                                                      \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
    } while (0)

/* Returns-to-go, baselines and raw advantages of one group. */
static arl_status group_raw(const arl_reward_config *cfg, arl_reward_group *g, tw *w,
                            double *scratch, anchor_entry *ent, double *jsum, double *jcnt,
                            arl_reward_acc *acc) {
    int32_t G = g->n, nv = 0;
    for (int32_t i = 0; i < G; i++)
        nv += w[i].valid;
    if (acc) {
        acc->sum[ARL_RACC_GROUPS] += 1;
        if (nv == 0) acc->sum[ARL_RACC_GROUPS_EMPTY] += 1;
        if (nv == 1) acc->sum[ARL_RACC_GROUPS_DEGENERATE] += 1;
    }
    if (nv == 0) return ARL_OK;

    /* Returns-to-go of every valid member. */
    for (int32_t i = 0; i < G; i++) {
        if (!w[i].valid) continue;
        const arl_reward_traj *t = &g->trajs[i];
        int32_t K = t->n_turns, S = t->n_segs;
        double miss = 0;
        if (level_on(cfg, g, LO)) {
            /* scorable:false: the client's range_lo, whatever the columns hold (4.3) */
            w[i].R = t->outcome_unscorable ? t->outcome_lo : derive(cfg, LO, t->outcome, &miss);
            add_components(acc, cfg, LO, t->outcome);
            if (acc) {
                acc->sum[ARL_RACC_REW_N + LO] += 1;
                acc->sum[ARL_RACC_REW_SUM + LO] += w[i].R;
                acc->sum[ARL_RACC_REW_SQ + LO] += w[i].R * w[i].R;
                acc->sum[ARL_RACC_MISSING + LO] += miss;
                acc->sum[ARL_RACC_OUTCOME_UNSCORABLE] += t->outcome_unscorable ? 1 : 0;
            }
        }
        if (level_on(cfg, g, LS) && S > 0) {
            int32_t nc = arl_reward_config_ncols(cfg, ARL_REWARD_LEVEL_SEGMENT);
            miss = 0;
            for (int32_t s = 0; s < S; s++) {
                const double *row = t->segment + (size_t)s * nc;
                /* scorable:false: q = 0, whatever the columns hold (3.3) */
                double q = t->segment_unscorable && t->segment_unscorable[s]
                               ? 0.0
                               : derive(cfg, LS, row, &miss);
                scratch[s] = q;
                add_components(acc, cfg, LS, row);
                if (acc) {
                    acc->sum[ARL_RACC_REW_N + LS] += 1;
                    acc->sum[ARL_RACC_REW_SUM + LS] += q;
                    acc->sum[ARL_RACC_REW_SQ + LS] += q * q;
                    if (t->segment_unscorable && t->segment_unscorable[s])
                        acc->sum[ARL_RACC_SEGMENT_UNSCORABLE] += 1;
                }
            }
            if (acc) acc->sum[ARL_RACC_MISSING + LS] += miss;
            arl_reward_rtg(scratch, S, ARL_REWARD_FORM_SUM, cfg->gamma_segment, w[i].s_rtg);
        }
        if (level_on(cfg, g, LP) && K > 0) {
            int32_t nc = arl_reward_config_ncols(cfg, ARL_REWARD_LEVEL_PROCESS);
            miss = 0;
            for (int32_t k = 0; k < K; k++) {
                const double *row = t->process + (size_t)k * nc;
                double p = derive(cfg, LP, row, &miss);
                add_components(acc, cfg, LP, row);
                if (acc) {
                    acc->sum[ARL_RACC_REW_N + LP] += 1;
                    acc->sum[ARL_RACC_REW_SUM + LP] += p;
                    acc->sum[ARL_RACC_REW_SQ + LP] += p * p;
                }
            }
            if (acc) acc->sum[ARL_RACC_MISSING + LP] += miss;
            if (cfg->n_comp[LP] == 0) {
                for (int32_t k = 0; k < K; k++)
                    scratch[k] = t->process[(size_t)k];
                arl_reward_rtg(scratch, K, cfg->process_form, cfg->gamma_process, w[i].p_rtg);
            } else {
                /* per component with its own form, then weighted (section 4.1) */
                for (int32_t k = 0; k < K; k++)
                    w[i].p_rtg[k] = 0;
                for (int32_t c = 0; c < nc; c++) {
                    const arl_reward_component *cc = &cfg->comp[LP][c];
                    for (int32_t k = 0; k < K; k++) {
                        double v = t->process[(size_t)k * nc + c];
                        scratch[k] = isnan(v) ? 0.0 : v;
                    }
                    /* form auto: min for a component its environment declares with source
                     * model, sum for source rule (spec/objective.md 13) */
                    arl_reward_form f = cc->form;
                    if (f == ARL_REWARD_FORM_AUTO)
                        f = g->process_model[c] ? ARL_REWARD_FORM_MIN : ARL_REWARD_FORM_SUM;
                    arl_reward_rtg(scratch, K, f, cfg->gamma_process, scratch);
                    for (int32_t k = 0; k < K; k++)
                        w[i].p_rtg[k] += cc->weight * scratch[k];
                }
            }
        }
        /* KL return-to-go */
        if (K > 0) {
            double dsum = 0;
            for (int32_t k = K - 1; k >= 0; k--) {
                int restart = k == K - 1 || (cfg->kl_scope == ARL_REWARD_KL_SEGMENT &&
                                             t->turns[k + 1].seg != t->turns[k].seg);
                dsum = restart ? t->turns[k].kappa : t->turns[k].kappa + dsum;
                w[i].d[k] = dsum;
            }
        }
    }

    /* Outcome: A^O_i = R_i - mean_{j in O_i} R_j (section 5.2). */
    if (level_on(cfg, g, LO)) {
        int all_equal = 1, first = 1;
        double r0 = 0;
        for (int32_t i = 0; i < G; i++) {
            if (!w[i].valid) continue;
            if (first)
                r0 = w[i].R;
            else if (w[i].R != r0)
                all_equal = 0;
            first = 0;
        }
        if (nv >= 2 && all_equal && acc) acc->sum[ARL_RACC_GROUPS_OUTCOME_ZV] += 1;
        for (int32_t i = 0; i < G; i++) {
            if (!w[i].valid) continue;
            if (nv < 2 || all_equal) {
                w[i].ao_raw = 0; /* degenerate group or no variance: exactly 0 (section 5.9) */
                continue;
            }
            double s = 0;
            for (int32_t j = 0; j < G; j++)
                if (j != i && w[j].valid) s += w[j].R;
            w[i].ao_raw = w[i].R - s / (double)(nv - 1);
        }
    }

    /* Segment: b^S over others that reached segment s, or Monte-Carlo forks (section 5.3). */
    if (level_on(cfg, g, LS)) {
        for (int32_t i = 0; i < G; i++) {
            if (!w[i].valid) continue;
            const arl_reward_traj *t = &g->trajs[i];
            for (int32_t s = 0; s < t->n_segs; s++) {
                double b = 0;
                int have = 0;
                if (cfg->segment_baseline == ARL_REWARD_SB_MC && t->seg_mc_baseline &&
                    isfinite(t->seg_mc_baseline[s])) {
                    b = t->seg_mc_baseline[s];
                    have = 1;
                    if (acc) acc->sum[ARL_RACC_MC_BASELINE] += 1;
                } else {
                    double sum = 0;
                    int32_t n = 0;
                    for (int32_t j = 0; j < G; j++) {
                        if (j == i || !w[j].valid || g->trajs[j].n_segs <= s) continue;
                        sum += w[j].s_rtg[s];
                        n++;
                    }
                    if (n > 0) {
                        b = sum / n;
                        have = 1;
                    }
                }
                w[i].s_base[s] = b;
                w[i].s_nobase[s] = !have;
                w[i].s_raw[s] = w[i].s_rtg[s] - b;
                if (!have && acc) acc->sum[ARL_RACC_NO_BASELINE_SEG] += 1;
            }
        }
    }

    /* Process: anchor groups (rule 1), then turn index (rule 2) (section 5.4). */
    if (level_on(cfg, g, LP)) {
        if (cfg->process_baseline == ARL_REWARD_PB_ANCHOR) {
            int64_t ne = 0;
            for (int32_t j = 0; j < G; j++) {
                if (!w[j].valid) continue;
                const arl_reward_traj *t = &g->trajs[j];
                for (int32_t k = 0; k < t->n_turns; k++)
                    if (t->turns[k].anchor) ent[ne++] = (anchor_entry){t->turns[k].anchor, j, k};
            }
            qsort(ent, (size_t)ne, sizeof *ent, anchor_cmp);
            for (int64_t r0 = 0; r0 < ne;) {
                int64_t r1 = r0 + 1;
                while (r1 < ne && !strcmp(ent[r1].a, ent[r0].a))
                    r1++;
                for (int32_t j = 0; j < G; j++)
                    jsum[j] = jcnt[j] = 0;
                for (int64_t e = r0; e < r1; e++) {
                    jsum[ent[e].j] += w[ent[e].j].p_rtg[ent[e].k];
                    jcnt[ent[e].j] += 1;
                }
                for (int64_t e = r0; e < r1; e++) {
                    int32_t i = ent[e].j;
                    double s = 0, n = 0;
                    for (int32_t j = 0; j < G; j++) {
                        if (j == i) continue;
                        s += jsum[j];
                        n += jcnt[j];
                    }
                    if (n > 0) {
                        w[i].p_base[ent[e].k] = s / n;
                        w[i].p_anchor[ent[e].k] = 1;
                    }
                }
                r0 = r1;
            }
        }
        for (int32_t i = 0; i < G; i++) {
            if (!w[i].valid) continue;
            const arl_reward_traj *t = &g->trajs[i];
            for (int32_t k = 0; k < t->n_turns; k++) {
                if (w[i].p_anchor[k]) {
                    if (acc) acc->sum[ARL_RACC_ANCHOR_HITS] += 1;
                } else {
                    double sum = 0;
                    int32_t n = 0;
                    for (int32_t j = 0; j < G; j++) {
                        if (j == i || !w[j].valid || g->trajs[j].n_turns <= k) continue;
                        sum += w[j].p_rtg[k];
                        n++;
                    }
                    w[i].p_base[k] = n > 0 ? sum / n : 0.0;
                    w[i].p_nobase[k] = n == 0;
                    if (n == 0 && acc) acc->sum[ARL_RACC_NO_BASELINE_PROC] += 1;
                }
                w[i].p_raw[k] = w[i].p_rtg[k] - w[i].p_base[k];
            }
        }
    }

    /* KL baseline b^D over others with K_j >= k (section 5.7). */
    for (int32_t i = 0; i < G; i++) {
        if (!w[i].valid) continue;
        const arl_reward_traj *t = &g->trajs[i];
        for (int32_t k = 0; k < t->n_turns; k++) {
            double sum = 0;
            int32_t n = 0;
            for (int32_t j = 0; j < G; j++) {
                if (j == i || !w[j].valid || g->trajs[j].n_turns <= k) continue;
                sum += w[j].d[k];
                n++;
            }
            w[i].d_base[k] = n > 0 ? sum / n : 0.0;
        }
    }
    return ARL_OK;
}

static void copy_out(double *dst, const double *src, int32_t n) {
    if (dst && n > 0) memcpy(dst, src, (size_t)n * sizeof *dst);
}

static void zero_out(arl_reward_traj *t) {
    arl_reward_traj_out *o = &t->out;
    int32_t K = t->n_turns > 0 ? t->n_turns : 0, S = t->n_segs > 0 ? t->n_segs : 0;
    double *k_arrays[] = {o->adv_turn, o->proc_rtg, o->proc_base, o->proc_adv_raw,
                          o->proc_adv, o->kl_rtg,   o->kl_base};
    double *s_arrays[] = {o->seg_rtg, o->seg_base, o->seg_adv_raw, o->seg_adv};
    for (size_t a = 0; a < sizeof k_arrays / sizeof k_arrays[0]; a++)
        if (k_arrays[a] && K) memset(k_arrays[a], 0, (size_t)K * sizeof(double));
    for (size_t a = 0; a < sizeof s_arrays / sizeof s_arrays[0]; a++)
        if (s_arrays[a] && S) memset(s_arrays[a], 0, (size_t)S * sizeof(double));
    o->outcome = o->outcome_adv_raw = o->outcome_adv = 0;
}

arl_status arl_reward_compute(const arl_reward_config *cfg, arl_reward_group *groups,
                              int32_t n_groups, double beta, arl_reward_allreduce_fn allreduce,
                              void *allreduce_ctx, arl_reward_acc *acc) {
    if (n_groups < 0 || (n_groups > 0 && !groups))
        return arl_errorf(ARL_ERR_ARG, "reward: %d groups given with no array", n_groups);
    if (!isfinite(beta)) return arl_errorf(ARL_ERR_ARG, "reward: KL coefficient beta is %g", beta);
    /* Validate and size. */
    int64_t n_traj = 0, n_dbl = 0, n_u8 = 0, max_len = 1, max_ent = 1, max_g = 1;
    for (int32_t gi = 0; gi < n_groups; gi++) {
        arl_reward_group *g = &groups[gi];
        if (g->n < 0 || (g->n > 0 && !g->trajs))
            return arl_errorf(ARL_ERR_ARG, "reward: group %d: %d members with no array", gi, g->n);
        int64_t ent = 0;
        for (int32_t ti = 0; ti < g->n; ti++) {
            ARL_TRY(validate_traj(cfg, g, gi, ti));
            const arl_reward_traj *t = &g->trajs[ti];
            if (t->status == ARL_REWARD_TRAJ_MASKED) continue;
            n_dbl += 4 * (int64_t)t->n_segs + 6 * (int64_t)t->n_turns;
            n_u8 += (int64_t)t->n_segs + 2 * (int64_t)t->n_turns;
            if (t->n_turns > max_len) max_len = t->n_turns;
            if (t->n_segs > max_len) max_len = t->n_segs;
            ent += t->n_turns;
        }
        if (ent > max_ent) max_ent = ent;
        if (g->n > max_g) max_g = g->n;
        n_traj += g->n;
    }
    tw *w = calloc((size_t)(n_traj ? n_traj : 1), sizeof *w);
    double *blk = calloc((size_t)(n_dbl + max_len + 2 * max_g), sizeof *blk);
    uint8_t *flags = calloc((size_t)(n_u8 ? n_u8 : 1), 1);
    anchor_entry *ent = cfg->process_baseline == ARL_REWARD_PB_ANCHOR
                            ? malloc((size_t)max_ent * sizeof *ent)
                            : NULL;
    arl_status st = ARL_OK;
    if (!w || !blk || !flags || (cfg->process_baseline == ARL_REWARD_PB_ANCHOR && !ent)) {
        st = arl_errorf(ARL_ERR_NOMEM,
                        "reward: out of memory for the advantages of %lld "
                        "trajectories",
                        (long long)n_traj);
        goto done;
    }
    double *scratch = blk + n_dbl, *jsum = scratch + max_len, *jcnt = jsum + max_g;
    {
        double *p = blk;
        uint8_t *f = flags;
        int64_t wi = 0;
        for (int32_t gi = 0; gi < n_groups; gi++)
            for (int32_t ti = 0; ti < groups[gi].n; ti++, wi++) {
                const arl_reward_traj *t = &groups[gi].trajs[ti];
                if (acc)
                    acc->sum[t->status == ARL_REWARD_TRAJ_COMPLETE    ? ARL_RACC_TRAJ_COMPLETE
                             : t->status == ARL_REWARD_TRAJ_TRUNCATED ? ARL_RACC_TRAJ_TRUNCATED
                                                                      : ARL_RACC_TRAJ_MASKED] += 1;
                if (t->status == ARL_REWARD_TRAJ_MASKED) continue;
                tw *x = &w[wi];
                int32_t S = t->n_segs, K = t->n_turns;
                x->valid = 1;
                x->s_rtg = p;
                p += S;
                x->s_base = p;
                p += S;
                x->s_raw = p;
                p += S;
                x->s_adv = p;
                p += S;
                x->p_rtg = p;
                p += K;
                x->p_base = p;
                p += K;
                x->p_raw = p;
                p += K;
                x->p_adv = p;
                p += K;
                x->d = p;
                p += K;
                x->d_base = p;
                p += K;
                x->s_nobase = f;
                f += S;
                x->p_nobase = f;
                f += K;
                x->p_anchor = f;
                f += K;
            }
    }

    /* Raw advantages per group. */
    {
        int64_t off = 0;
        for (int32_t gi = 0; gi < n_groups; gi++) {
            st = group_raw(cfg, &groups[gi], w + off, scratch, ent, jsum, jcnt, acc);
            if (st) goto done;
            off += groups[gi].n;
        }
    }

    /* Batch moments of every level (for batch scope and the sigma metric), two passes. */
    moments bm[ARL_REWARD_NLEVELS] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    {
        double red[2 * ARL_REWARD_NLEVELS];
        for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
            int64_t off = 0;
            for (int32_t gi = 0; gi < n_groups; gi++) {
                tw *gw = w + off;
                FOR_ENTRIES(cfg, &groups[gi], gw, l, {
                    bm[l].n += 1;
                    bm[l].sum += *x_;
                    (void)y_;
                });
                off += groups[gi].n;
            }
            red[2 * l] = bm[l].n;
            red[2 * l + 1] = bm[l].sum;
        }
        if (allreduce) {
            st = allreduce(red, 2 * ARL_REWARD_NLEVELS, allreduce_ctx);
            if (st) {
                arl_error_prefix(st, "reward: batch normalisation (pass 1)");
                goto done;
            }
        }
        double ssd[ARL_REWARD_NLEVELS];
        for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
            bm[l].n = red[2 * l];
            bm[l].sum = red[2 * l + 1];
            double mean = bm[l].n > 0 ? bm[l].sum / bm[l].n : 0.0;
            ssd[l] = 0;
            int64_t off = 0;
            for (int32_t gi = 0; gi < n_groups; gi++) {
                tw *gw = w + off;
                FOR_ENTRIES(cfg, &groups[gi], gw, l, {
                    ssd[l] += (*x_ - mean) * (*x_ - mean);
                    (void)y_;
                });
                off += groups[gi].n;
            }
        }
        if (allreduce) {
            st = allreduce(ssd, ARL_REWARD_NLEVELS, allreduce_ctx);
            if (st) {
                arl_error_prefix(st, "reward: batch normalisation (pass 2)");
                goto done;
            }
        }
        for (int l = 0; l < ARL_REWARD_NLEVELS; l++)
            bm[l].ssd = ssd[l];
    }

    /* Normalise (section 5.6) and compose the per-turn advantage (section 5.8). */
    {
        int64_t off = 0;
        for (int32_t gi = 0; gi < n_groups; gi++) {
            arl_reward_group *g = &groups[gi];
            tw *gw = w + off;
            for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
                double sigma = sigma_of(&bm[l]);
                if (cfg->norm[l] == ARL_REWARD_NORM_GROUP) {
                    moments gm = {0, 0, 0};
                    FOR_ENTRIES(cfg, g, gw, l, {
                        gm.n += 1;
                        gm.sum += *x_;
                        (void)y_;
                    });
                    double mean = gm.n > 0 ? gm.sum / gm.n : 0.0;
                    FOR_ENTRIES(cfg, g, gw, l, {
                        gm.ssd += (*x_ - mean) * (*x_ - mean);
                        (void)y_;
                    });
                    sigma = sigma_of(&gm);
                    if (acc && gm.n > 0) {
                        acc->sum[ARL_RACC_SIGMA_SUM + l] += sigma;
                        acc->sum[ARL_RACC_SIGMA_N + l] += 1;
                    }
                }
                int scale = cfg->norm[l] != ARL_REWARD_NORM_NONE;
                double smin = cfg->sigma_min;
                FOR_ENTRIES(cfg, g, gw, l, {
                    *y_ = scale ? apply_sigma(*x_, sigma, smin) : *x_;
                    if (acc) {
                        acc->sum[ARL_RACC_ADV_SUM + l] += *x_;
                        acc->sum[ARL_RACC_ADV_SQ + l] += *x_ * *x_;
                    }
                });
            }
            int on[ARL_REWARD_NLEVELS];
            for (int l = 0; l < ARL_REWARD_NLEVELS; l++)
                on[l] = level_on(cfg, g, l);
            for (int32_t ti = 0; ti < g->n; ti++) {
                arl_reward_traj *t = &g->trajs[ti];
                tw *x = &gw[ti];
                if (!x->valid) {
                    zero_out(t);
                    continue;
                }
                arl_reward_traj_out *o = &t->out;
                int32_t K = t->n_turns, S = t->n_segs;
                double ao = on[LO] ? cfg->w[LO] * x->ao : 0.0;
                for (int32_t k = 0; k < K; k++) {
                    int32_t s = t->turns[k].seg;
                    double a = ao;
                    if (on[LS]) a += cfg->w[LS] * x->s_adv[s];
                    if (on[LP]) a += cfg->w[LP] * x->p_adv[k];
                    double klt = beta * (x->d[k] - x->d_base[k]);
                    a -= klt;
                    if (o->adv_turn) o->adv_turn[k] = a;
                    if (acc) {
                        double n = (double)t->turns[k].n_action;
                        acc->sum[ARL_RACC_KL_N] += 1;
                        acc->sum[ARL_RACC_KL_SUM] += klt;
                        acc->sum[ARL_RACC_KL_SQ] += klt * klt;
                        if (n > 0) {
                            acc->sum[ARL_RACC_TOK_N] += n;
                            acc->sum[ARL_RACC_TOK_SUM] += n * a;
                            acc->sum[ARL_RACC_TOK_SQ] += n * a * a;
                            if (a > acc->max[ARL_RACC_TOK_MAX]) acc->max[ARL_RACC_TOK_MAX] = a;
                            if (-a > acc->max[ARL_RACC_TOK_NEGMIN])
                                acc->max[ARL_RACC_TOK_NEGMIN] = -a;
                        }
                    }
                }
                o->outcome = on[LO] ? x->R : 0.0;
                o->outcome_adv_raw = on[LO] ? x->ao_raw : 0.0;
                o->outcome_adv = on[LO] ? x->ao : 0.0;
                copy_out(o->seg_rtg, x->s_rtg, S);
                copy_out(o->seg_base, x->s_base, S);
                copy_out(o->seg_adv_raw, x->s_raw, S);
                copy_out(o->seg_adv, x->s_adv, S);
                copy_out(o->proc_rtg, x->p_rtg, K);
                copy_out(o->proc_base, x->p_base, K);
                copy_out(o->proc_adv_raw, x->p_raw, K);
                copy_out(o->proc_adv, x->p_adv, K);
                copy_out(o->kl_rtg, x->d, K);
                copy_out(o->kl_base, x->d_base, K);
            }
            off += g->n;
        }
    }
    if (acc) {
        for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
            double s = sigma_of(&bm[l]);
            if (s > acc->max[ARL_RACC_SIGMA_BATCH + l]) acc->max[ARL_RACC_SIGMA_BATCH + l] = s;
        }
    }

done:
    free(w);
    free(blk);
    free(flags);
    free(ent);
    return st;
}
