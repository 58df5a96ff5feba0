/* tests/reward/example.h: the worked example of spec/objective.md section 14 as the inputs the
 * learner really builds -- token streams with context tokens (whose log-probs are NaN, so any
 * use of them would show), turn ranges that include a loss-mask-0 token, two segments per
 * trajectory -- shared by the reward tests. */
#ifndef ARL_TESTS_REWARD_EXAMPLE_H
#define ARL_TESTS_REWARD_EXAMPLE_H

#include <math.h>
#include <string.h>

#include "reward/reward.h"

/* Token streams.  Trajectory 1 (10 tokens):
 *   segment 0 = [0, 6):  0-2 context, 3-4 action (turn 1), 5 end-of-turn (mask 0, in turn 1's
 *                        range [3, 6))
 *   segment 1 = [6, 10): 6-7 observation, 8-9 action (turn 2, range [8, 10))
 * Trajectory 2 (11 tokens):
 *   segment 0 = [0, 4):  0-1 context, 2-3 action (turn 1, [2, 4))
 *   segment 1 = [4, 11): 4 observation, 5 action (turn 2, [5, 6)), 6-7 observation,
 *                        8-10 action (turn 3, [8, 11))
 * Log-probs in the order of the table of section 14.2 (mu, old, theta, ref). */
#define EX_NAN NAN
typedef struct ex_traj {
    int n_tok;
    uint8_t mask[11];
    int32_t turn_of[11]; /* 1-based turn, 0 for context */
    int32_t seg_of[11];
    double mu[11], old[11], th[11], ref[11];
    uint32_t ver[11];
    int seg_start[2], seg_len[2];
    arl_reward_turn turns[3];
    int K, S;
    double p[3], q[2], R;
} ex_traj;

static void ex_fill(ex_traj *e, int which) {
    memset(e, 0, sizeof *e);
    static const double t1[4][4] = {{-1.20, -1.18, -1.08, -1.25},
                                    {-0.50, -0.51, -0.81, -0.45},
                                    {-2.00, -1.10, -0.70, -1.30},
                                    {-0.30, -1.15, -1.15, -1.05}};
    static const double t2[6][4] = {{-0.90, -0.60, -0.55, -0.70}, {-1.40, -1.20, -1.25, -1.15},
                                    {-0.40, -0.35, -0.65, -0.30}, {-3.00, -1.20, -1.20, -1.00},
                                    {-0.20, -1.10, -1.00, -1.20}, {-0.50, -1.40, -1.40, -1.55}};
    int act1[] = {3, 4, 8, 9}, turn1[] = {1, 1, 2, 2};
    int act2[] = {2, 3, 5, 8, 9, 10}, turn2[] = {1, 1, 2, 3, 3, 3};
    const double(*tab)[4] = which == 1 ? t1 : t2;
    int *act = which == 1 ? act1 : act2, *turn = which == 1 ? turn1 : turn2;
    int na = which == 1 ? 4 : 6;
    e->n_tok = which == 1 ? 10 : 11;
    for (int t = 0; t < e->n_tok; t++) {
        e->mu[t] = e->old[t] = e->th[t] = e->ref[t] = EX_NAN;
        e->ver[t] = 10;
    }
    for (int a = 0; a < na; a++) {
        int t = act[a];
        e->mask[t] = 1;
        e->turn_of[t] = turn[a];
        e->mu[t] = tab[a][0];
        e->old[t] = tab[a][1];
        e->th[t] = tab[a][2];
        e->ref[t] = tab[a][3];
    }
    if (which == 1) {
        e->K = 2;
        e->S = 2;
        e->seg_start[0] = 0, e->seg_len[0] = 6, e->seg_start[1] = 6, e->seg_len[1] = 4;
        e->turns[0] = (arl_reward_turn){.tok_start = 3, .tok_end = 6, .seg = 0};
        e->turns[1] = (arl_reward_turn){.tok_start = 8, .tok_end = 10, .seg = 1};
        e->p[0] = 0.2, e->p[1] = 0.5;
        e->q[0] = 0.5, e->q[1] = 1.0;
        e->R = 1.0;
    } else {
        e->K = 3;
        e->S = 2;
        e->seg_start[0] = 0, e->seg_len[0] = 4, e->seg_start[1] = 4, e->seg_len[1] = 7;
        e->turns[0] = (arl_reward_turn){.tok_start = 2, .tok_end = 4, .seg = 0};
        e->turns[1] = (arl_reward_turn){.tok_start = 5, .tok_end = 6, .seg = 1};
        e->turns[2] = (arl_reward_turn){.tok_start = 8, .tok_end = 11, .seg = 1};
        e->p[0] = -0.1, e->p[1] = 0.3, e->p[2] = 0.0;
        e->q[0] = 0.0, e->q[1] = 0.5;
        e->R = 0.0;
    }
    for (int t = 0; t < e->n_tok; t++)
        e->seg_of[t] = t >= e->seg_start[1];
}

/* Section 14.1's reward configuration. */
static void ex_config(arl_reward_config *cfg) {
    arl_reward_config_default(cfg);
    cfg->w[ARL_REWARD_LEVEL_OUTCOME] = 1.0;
    cfg->w[ARL_REWARD_LEVEL_SEGMENT] = 0.5;
    cfg->w[ARL_REWARD_LEVEL_PROCESS] = 0.5;
    cfg->gamma_segment = 1.0;
    cfg->gamma_process = 0.9;
    cfg->process_form = ARL_REWARD_FORM_SUM;
    cfg->norm[ARL_REWARD_LEVEL_OUTCOME] = ARL_REWARD_NORM_NONE;
    cfg->norm[ARL_REWARD_LEVEL_SEGMENT] = ARL_REWARD_NORM_BATCH;
    cfg->norm[ARL_REWARD_LEVEL_PROCESS] = ARL_REWARD_NORM_BATCH;
    cfg->sigma_min = 1e-6;
    cfg->kl_scope = ARL_REWARD_KL_TRAJECTORY;
}

/* Per-trajectory output buffers. */
typedef struct ex_out {
    double adv_turn[3], seg_rtg[2], seg_base[2], seg_adv_raw[2], seg_adv[2];
    double proc_rtg[3], proc_base[3], proc_adv_raw[3], proc_adv[3], kl_rtg[3], kl_base[3];
} ex_out;

static void ex_bind(arl_reward_traj *tr, ex_traj *e, ex_out *o) {
    memset(tr, 0, sizeof *tr);
    memset(o, 0, sizeof *o);
    tr->status = ARL_REWARD_TRAJ_COMPLETE;
    tr->n_turns = e->K;
    tr->n_segs = e->S;
    tr->turns = e->turns;
    tr->process = e->p;
    tr->segment = e->q;
    tr->outcome = &e->R;
    tr->out.adv_turn = o->adv_turn;
    tr->out.seg_rtg = o->seg_rtg;
    tr->out.seg_base = o->seg_base;
    tr->out.seg_adv_raw = o->seg_adv_raw;
    tr->out.seg_adv = o->seg_adv;
    tr->out.proc_rtg = o->proc_rtg;
    tr->out.proc_base = o->proc_base;
    tr->out.proc_adv_raw = o->proc_adv_raw;
    tr->out.proc_adv = o->proc_adv;
    tr->out.kl_rtg = o->kl_rtg;
    tr->out.kl_base = o->kl_base;
}

/* kappa and n_action from the pi_old and reference log-probs, one segment window at a time
 * (as the learner sees them). */
static arl_status ex_scan(ex_traj *e) {
    for (int k = 0; k < e->K; k++)
        e->turns[k].n_action = 0, e->turns[k].kappa = 0;
    for (int s = 0; s < e->S; s++) {
        int o = e->seg_start[s];
        arl_status st = arl_reward_turns_scan(e->turns, e->K, o, e->seg_len[s], e->mask + o,
                                              e->old + o, e->ref + o);
        if (st) return st;
    }
    return ARL_OK;
}

#endif
