/* Advantages beyond the worked example: masked members, degenerate and empty groups, sum and
 * min process forms (scalar and per component), normalisation scopes and zero variance, the
 * invariances of spec/objective.md section 15.2, anchor and Monte-Carlo baselines, the KL
 * segment scope, absent levels, missing components, batch normalisation across processes
 * through the allreduce hook, options, input errors and determinism.
 *
 * Hand-computed values use short decimals; they are compared with 1e-12 absolute (a few ulps
 * of the O(1) values involved, far below any formula error). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "reward/reward.h"
#include "tests/reward/metrics.h"
#include "tests/test.h"

#define TOL 1e-12
#define MAXK 16
#define MAXC 3

typedef struct syn {
    arl_reward_turn turns[MAXK];
    double p[MAXK * MAXC], q[MAXK * MAXC], R[MAXC], mc[MAXK];
    char anchor[MAXK][16];
    double adv_turn[MAXK], seg_rtg[MAXK], seg_base[MAXK], seg_adv_raw[MAXK], seg_adv[MAXK];
    double proc_rtg[MAXK], proc_base[MAXK], proc_adv_raw[MAXK], proc_adv[MAXK];
    double kl_rtg[MAXK], kl_base[MAXK];
    arl_reward_traj tr;
} syn;

/* Point the trajectory's inputs and outputs at this syn's own arrays (after a struct copy). */
static void syn_rebind(syn *s) {
    arl_reward_traj *t = &s->tr;
    t->turns = s->turns;
    t->process = s->p;
    t->segment = s->q;
    t->outcome = s->R;
    t->out.adv_turn = s->adv_turn;
    t->out.seg_rtg = s->seg_rtg;
    t->out.seg_base = s->seg_base;
    t->out.seg_adv_raw = s->seg_adv_raw;
    t->out.seg_adv = s->seg_adv;
    t->out.proc_rtg = s->proc_rtg;
    t->out.proc_base = s->proc_base;
    t->out.proc_adv_raw = s->proc_adv_raw;
    t->out.proc_adv = s->proc_adv;
    t->out.kl_rtg = s->kl_rtg;
    t->out.kl_base = s->kl_base;
}

/* K turns with segment ids seg[k]; scalar rewards p (K), q (S), R; kappa (K) may be NULL. */
static void syn_init(syn *s, int K, const int *seg, const double *p, const double *q, double R,
                     const double *kappa) {
    memset(s, 0, sizeof *s);
    int S = K ? seg[K - 1] + 1 : 0;
    for (int k = 0; k < K; k++) {
        s->turns[k] = (arl_reward_turn){.tok_start = 10 * k,
                                        .tok_end = 10 * k + 5,
                                        .seg = seg[k],
                                        .n_action = 5,
                                        .kappa = kappa ? kappa[k] : 0.0};
        s->p[k] = p ? p[k] : 0.0;
    }
    for (int x = 0; x < S; x++)
        s->q[x] = q ? q[x] : 0.0;
    s->R[0] = R;
    s->tr.status = ARL_REWARD_TRAJ_COMPLETE;
    s->tr.n_turns = K;
    s->tr.n_segs = S;
    syn_rebind(s);
}

/* Copies the syn trajectories into a contiguous array (the group's storage). */
static void group_of(arl_reward_group *g, arl_reward_traj *arr, syn *s, int n) {
    memset(g, 0, sizeof *g);
    for (int i = 0; i < n; i++)
        arr[i] = s[i].tr;
    g->n = n;
    g->trajs = arr;
}


static const int seg3[] = {0, 0, 1};
static const int seg4[] = {0, 1, 1, 2};
static const int seg2[] = {0, 1};

/* A reference batch: two groups of three, with a masked member in group 0. */
typedef struct batch {
    syn s[6];
    arl_reward_traj arr[6];
    arl_reward_group g[2];
} batch;

static void batch_init(batch *b) {
    const double p0[] = {0.2, -0.1, 0.4}, p1[] = {0.3, 0.1, 0.0, 0.5}, p2[] = {-0.2, 0.6};
    const double q0[] = {0.5, 0.25}, q1[] = {0.1, 0.2, 0.3}, q2[] = {0.0, 1.0};
    const double k0[] = {0.01, 0.02, 0.03}, k1[] = {0.0, 0.05, -0.01, 0.02}, k2[] = {0.1, 0.0};
    syn_init(&b->s[0], 3, seg3, p0, q0, 1.0, k0);
    syn_init(&b->s[1], 4, seg4, p1, q1, 0.0, k1);
    syn_init(&b->s[2], 2, seg2, p2, q2, 0.5, k2);
    syn_init(&b->s[3], 4, seg4, p1, q1, 0.25, k1);
    syn_init(&b->s[4], 3, seg3, p0, q0, 0.75, k0);
    syn_init(&b->s[5], 2, seg2, p2, q2, 0.0, k2);
    b->s[1].tr.status = ARL_REWARD_TRAJ_MASKED;
    group_of(&b->g[0], b->arr, b->s, 3);
    group_of(&b->g[1], b->arr + 3, b->s + 3, 3);
}

static void test_masked_changes_nothing(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    batch a, b;
    batch_init(&a);
    batch_init(&b);
    /* change everything about the masked member of b: rewards, KL, even its shape */
    b.arr[1].n_turns = 2;
    b.arr[1].n_segs = 2;
    b.s[1].p[0] = 100, b.s[1].q[0] = -50, b.s[1].R[0] = 7, b.s[1].turns[0].kappa = 9;
    CHECK(arl_reward_compute(&cfg, a.g, 2, 0.1, NULL, NULL, NULL) == ARL_OK);
    CHECK(arl_reward_compute(&cfg, b.g, 2, 0.1, NULL, NULL, NULL) == ARL_OK);
    for (int i = 0; i < 6; i++) {
        if (i == 1) continue;
        CHECK(!memcmp(a.s[i].adv_turn, b.s[i].adv_turn, sizeof a.s[i].adv_turn));
        CHECK(!memcmp(a.s[i].seg_adv, b.s[i].seg_adv, sizeof a.s[i].seg_adv));
        CHECK(!memcmp(a.s[i].proc_adv, b.s[i].proc_adv, sizeof a.s[i].proc_adv));
        CHECK(a.arr[i].out.outcome_adv == b.arr[i].out.outcome_adv);
    }
    /* the masked member gets zero advantages */
    for (int k = 0; k < 4; k++)
        CHECK(a.s[1].adv_turn[k] == 0.0);
    CHECK(a.arr[1].out.outcome_adv == 0.0);
    /* and is left out of the leave-one-out sets: member 0's outcome baseline is R_2 = 0.5 */
    CHECK_CLOSE(a.arr[0].out.outcome_adv_raw, 1.0 - 0.5, TOL, 0);
}

static void test_sum_vs_min_forms(void) {
    /* arl_reward_rtg on p = (0.5, -0.2, 0.8, 0.1), gamma 0.5 */
    const double p[] = {0.5, -0.2, 0.8, 0.1};
    double g[4];
    arl_reward_rtg(p, 4, ARL_REWARD_FORM_SUM, 0.5, g);
    /* G4 = 0.1; G3 = 0.8 + 0.05 = 0.85; G2 = -0.2 + 0.425 = 0.225; G1 = 0.5 + 0.1125 */
    CHECK_CLOSE(g[3], 0.1, TOL, 0);
    CHECK_CLOSE(g[2], 0.85, TOL, 0);
    CHECK_CLOSE(g[1], 0.225, TOL, 0);
    CHECK_CLOSE(g[0], 0.6125, TOL, 0);
    arl_reward_rtg(p, 4, ARL_REWARD_FORM_MIN, 0.5, g);
    CHECK(g[0] == -0.2 && g[1] == -0.2 && g[2] == 0.1 && g[3] == 0.1);

    /* through the advantages: one trajectory (baseline 0), process level only, no scaling */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_OUTCOME] = cfg.w[ARL_REWARD_LEVEL_SEGMENT] = 0;
    cfg.w[ARL_REWARD_LEVEL_PROCESS] = 1;
    cfg.norm[ARL_REWARD_LEVEL_PROCESS] = ARL_REWARD_NORM_NONE;
    cfg.gamma_process = 0.5;
    const int seg[] = {0, 0, 0, 0};
    syn s;
    arl_reward_traj arr[1];
    arl_reward_group grp;
    for (int form = 0; form < 2; form++) {
        cfg.process_form = form ? ARL_REWARD_FORM_MIN : ARL_REWARD_FORM_SUM;
        syn_init(&s, 4, seg, p, NULL, 0, NULL);
        group_of(&grp, arr, &s, 1);
        CHECK(arl_reward_compute(&cfg, &grp, 1, 0, NULL, NULL, NULL) == ARL_OK);
        const double want_sum[] = {0.6125, 0.225, 0.85, 0.1}, want_min[] = {-0.2, -0.2, 0.1, 0.1};
        for (int k = 0; k < 4; k++) {
            double w = form ? want_min[k] : want_sum[k];
            CHECK_CLOSE(s.proc_rtg[k], w, TOL, 0);
            CHECK_CLOSE(s.adv_turn[k], w, TOL, 0); /* A = w_P A^P, baseline 0 */
        }
    }

    /* two components, "acc" sum form and "prm" min form (auto from its source "model"):
     * G^P = 1.0 * G^{sum}(acc) + 0.5 * G^{min}(prm), formed per component, then weighted */
    arl_reward_opts o;
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    const char *json = "{\"w-outcome\": 0, \"w-segment\": 0, \"w-process\": 1, "
                       "\"norm-process\": \"none\", \"gamma-process\": 0.5, "
                       "\"process_components\": [\"acc=1.0:sum\", \"prm=0.5\"]}";
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count, json, "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_OK);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    CHECK_EQ_INT(cfg.n_comp[ARL_REWARD_LEVEL_PROCESS], 2);
    CHECK(cfg.comp[ARL_REWARD_LEVEL_PROCESS][1].form == ARL_REWARD_FORM_AUTO);
    arl_reward_config_set_source(&cfg, "prm", 1);
    CHECK(cfg.comp[ARL_REWARD_LEVEL_PROCESS][1].form == ARL_REWARD_FORM_MIN);
    syn_init(&s, 4, seg, NULL, NULL, 0, NULL);
    const double acc[] = {1, 0, 0, 1}, prm[] = {0.9, 0.2, 0.7, 0.8};
    for (int k = 0; k < 4; k++)
        s.p[2 * k] = acc[k], s.p[2 * k + 1] = prm[k];
    group_of(&grp, arr, &s, 1);
    CHECK(arl_reward_compute(&cfg, &grp, 1, 0, NULL, NULL, NULL) == ARL_OK);
    /* acc sum form (gamma 0.5): (1.125, 0.25, 0.5, 1); prm min form: (0.2, 0.2, 0.7, 0.8) */
    const double want[] = {1.125 + 0.1, 0.25 + 0.1, 0.5 + 0.35, 1 + 0.4};
    for (int k = 0; k < 4; k++)
        CHECK_CLOSE(s.proc_rtg[k], want[k], TOL, 0);
    /* one form over the weighted per-step sum would give 1.7625 (sum) or 0.1 (min) at k = 1 */
    CHECK(fabs(s.proc_rtg[0] - 1.7625) > 0.1 && fabs(s.proc_rtg[0] - 0.1) > 0.1);
}

static void test_degenerate_and_empty_groups(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.norm[ARL_REWARD_LEVEL_SEGMENT] = cfg.norm[ARL_REWARD_LEVEL_PROCESS] = ARL_REWARD_NORM_NONE;
    const double p[] = {0.2, 0.4, 0.1}, q[] = {1.0, 0.5}, kap[] = {0.1, 0.2, 0.3};
    /* G = 1 */
    syn s1;
    arl_reward_traj a1[1];
    arl_reward_group g1;
    syn_init(&s1, 3, seg3, p, q, 1.0, kap);
    group_of(&g1, a1, &s1, 1);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g1, 1, 0.5, NULL, NULL, &acc) == ARL_OK);
    CHECK(a1[0].out.outcome_adv == 0.0); /* |O_i| = 0 */
    for (int x = 0; x < 2; x++)
        CHECK(s1.seg_base[x] == 0.0);
    for (int k = 0; k < 3; k++)
        CHECK(s1.proc_base[k] == 0.0 && s1.kl_base[k] == 0.0);
    /* A_k = 0.5 G^S_{s(k)} + 0.5 G^P_k - 0.5 D_k with baselines 0 */
    double GS[] = {1.5, 0.5}, GP[3], D[] = {0.6, 0.5, 0.3};
    arl_reward_rtg(p, 3, ARL_REWARD_FORM_SUM, 0.95, GP);
    for (int k = 0; k < 3; k++)
        CHECK_CLOSE(s1.adv_turn[k], 0.5 * GS[seg3[k]] + 0.5 * GP[k] - 0.5 * D[k], TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "groups/degenerate_frac"), 1.0, 0, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "adv/segment_no_baseline_frac"), 1.0, 0, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "adv/process_no_baseline_frac"), 1.0, 0, 0);

    /* an all-masked group next to a normal one: zeros, counted, no effect on the other */
    batch b, ref;
    batch_init(&b);
    batch_init(&ref);
    arl_reward_config dc;
    arl_reward_config_default(&dc);
    CHECK(arl_reward_compute(&dc, ref.g + 1, 1, 0.1, NULL, NULL, NULL) == ARL_OK);
    for (int i = 0; i < 3; i++)
        b.arr[i].status = ARL_REWARD_TRAJ_MASKED;
    for (int i = 0; i < 3; i++)
        b.s[i].adv_turn[0] = 99; /* must be overwritten with 0 */
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&dc, b.g, 2, 0.1, NULL, NULL, &acc) == ARL_OK);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < b.arr[i].n_turns; k++)
            CHECK(b.s[i].adv_turn[k] == 0.0);
        CHECK(b.arr[i].out.outcome_adv == 0.0);
    }
    for (int i = 3; i < 6; i++)
        CHECK(!memcmp(b.s[i].adv_turn, ref.s[i].adv_turn, sizeof b.s[i].adv_turn));
    CHECK_CLOSE(metric(&acc, &dc, "groups/empty_frac"), 0.5, 0, 0);
    CHECK_CLOSE(metric(&acc, &dc, "groups/degenerate_frac"), 0.0, 0, 0);
    CHECK_CLOSE(metric(&acc, &dc, "rollout/trajectories/masked"), 3, 0, 0);
    /* no groups at all is fine */
    CHECK(arl_reward_compute(&dc, NULL, 0, 0.1, NULL, NULL, NULL) == ARL_OK);
    /* a group whose only valid member is alone after masking: |V| = 1 */
    batch_init(&b);
    b.arr[2].status = ARL_REWARD_TRAJ_MASKED;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&dc, b.g, 1, 0.1, NULL, NULL, &acc) == ARL_OK);
    CHECK(b.arr[0].out.outcome_adv == 0.0);
    CHECK_CLOSE(metric(&acc, &dc, "groups/degenerate_frac"), 1.0, 0, 0);
}

static void test_outcome_all_equal(void) {
    /* 0.1 three times: a computed mean of the others may round away from 0.1; the rule says
     * exactly 0 */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    syn s[4];
    arl_reward_traj arr[4];
    arl_reward_group g;
    for (int i = 0; i < 4; i++)
        syn_init(&s[i], 2, seg2, NULL, NULL, 0.1, NULL);
    group_of(&g, arr, s, 4);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    for (int i = 0; i < 4; i++)
        CHECK(arr[i].out.outcome_adv == 0.0);
    CHECK_CLOSE(metric(&acc, &cfg, "groups/outcome_zero_variance_frac"), 1.0, 0, 0);
}

static void test_zero_variance_normalisation(void) {
    /* every segment advantage 0 (equal segment rewards) and tiny process advantages
     * (sigma below sigma_min): no division, no NaN */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    syn s[2];
    arl_reward_traj arr[2];
    arl_reward_group g;
    const double q[] = {0.3, 0.3}, pa[] = {1e-8, 0}, pb[] = {-1e-8, 0};
    syn_init(&s[0], 2, seg2, pa, q, 1, NULL);
    syn_init(&s[1], 2, seg2, pb, q, 0, NULL);
    cfg.gamma_process = 1;
    group_of(&g, arr, s, 2);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    for (int i = 0; i < 2; i++)
        for (int x = 0; x < 2; x++)
            CHECK(s[i].seg_adv[x] == 0.0 && s[i].seg_adv_raw[x] == 0.0);
    CHECK(s[0].proc_adv[0] == s[0].proc_adv_raw[0]); /* sigma 1e-8 < 1e-6: A~ = A */
    CHECK_CLOSE(s[0].proc_adv[0], 2e-8, 1e-20, 0);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            CHECK(isfinite(s[i].adv_turn[k]));
    CHECK(metric(&acc, &cfg, "adv/segment/sigma") == 0.0);
    /* with sigma_min 0 a zero sigma still never divides */
    cfg.sigma_min = 0;
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_OK);
    CHECK(s[0].seg_adv[0] == 0.0 && isfinite(s[0].adv_turn[0]));
}

static void test_group_scope(void) {
    /* segment advantages (1, -1) in group A and (2, -2) in group B: group scope divides each
     * group by its own sigma (1 and 2), batch scope by the pooled sigma sqrt(2.5) */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_PROCESS] = 0;
    const int seg1[] = {0};
    syn s[4];
    arl_reward_traj arr[4];
    arl_reward_group g[2];
    const double qa[] = {1.5}, qb[] = {0.5}, qc[] = {3}, qd[] = {1};
    syn_init(&s[0], 1, seg1, NULL, qa, 0, NULL);
    syn_init(&s[1], 1, seg1, NULL, qb, 0, NULL);
    syn_init(&s[2], 1, seg1, NULL, qc, 0, NULL);
    syn_init(&s[3], 1, seg1, NULL, qd, 0, NULL);
    group_of(&g[0], arr, s, 2);
    group_of(&g[1], arr + 2, s + 2, 2);
    cfg.norm[ARL_REWARD_LEVEL_SEGMENT] = ARL_REWARD_NORM_GROUP;
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, &acc) == ARL_OK);
    CHECK_CLOSE(s[0].seg_adv[0], 1.0, TOL, 0);
    CHECK_CLOSE(s[3].seg_adv[0], -1.0, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "adv/segment/sigma"), 1.5, TOL, 0); /* mean of 1 and 2 */
    cfg.norm[ARL_REWARD_LEVEL_SEGMENT] = ARL_REWARD_NORM_BATCH;
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, NULL) == ARL_OK);
    CHECK_CLOSE(s[0].seg_adv[0], 1.0 / sqrt(2.5), TOL, 0);
    CHECK_CLOSE(s[2].seg_adv[0], 2.0 / sqrt(2.5), TOL, 0);
    CHECK_CLOSE(s[0].adv_turn[0], 0.5 / sqrt(2.5), TOL, 0);
}

static void run_batch(batch *b, const arl_reward_config *cfg, double beta) {
    CHECK(arl_reward_compute(cfg, b->g, 2, beta, NULL, NULL, NULL) == ARL_OK);
}

static void test_invariances(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    batch a, p;
    batch_init(&a);
    batch_init(&p);
    run_batch(&a, &cfg, 0.2);
    /* permute group 1 members (3, 4, 5) -> (5, 3, 4) and group 0 (0, 1, 2) -> (2, 0, 1) */
    const int perm[6] = {2, 0, 1, 5, 3, 4};
    syn tmp[6];
    memcpy(tmp, p.s, sizeof tmp);
    for (int i = 0; i < 6; i++) {
        p.s[i] = tmp[perm[i]];
        syn_rebind(&p.s[i]);
    }
    group_of(&p.g[0], p.arr, p.s, 3);
    group_of(&p.g[1], p.arr + 3, p.s + 3, 3);
    run_batch(&p, &cfg, 0.2);
    for (int i = 0; i < 6; i++) {
        const syn *x = &p.s[i], *y = &a.s[perm[i]];
        for (int k = 0; k < x->tr.n_turns; k++)
            CHECK_CLOSE(x->adv_turn[k], y->adv_turn[k], TOL, 0);
        CHECK_CLOSE(p.arr[i].out.outcome_adv, a.arr[perm[i]].out.outcome_adv, TOL, 0);
    }
    /* scaling every process reward by a > 0 leaves A~^P unchanged under batch scope */
    batch sc;
    batch_init(&sc);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < MAXK; k++)
            sc.s[i].p[k] *= 3.7;
    run_batch(&sc, &cfg, 0.2);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < a.arr[i].n_turns; k++) {
            CHECK_CLOSE(sc.s[i].proc_adv[k], a.s[i].proc_adv[k], TOL, 0);
            CHECK_CLOSE(sc.s[i].adv_turn[k], a.s[i].adv_turn[k], TOL, 0);
        }
}

static void test_determinism(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.process_baseline = ARL_REWARD_PB_ANCHOR;
    cfg.norm[ARL_REWARD_LEVEL_OUTCOME] = ARL_REWARD_NORM_GROUP;
    /* random groups, computed twice from scratch: bit-identical */
    double out[2][64 * MAXK];
    for (int rep = 0; rep < 2; rep++) {
        arl_rng r;
        arl_rng_seed(&r, 1234);
        static syn s[64];
        static arl_reward_traj arr[64];
        arl_reward_group g[8];
        for (int i = 0; i < 64; i++) {
            int K = 1 + (int)arl_rng_below(&r, MAXK);
            int seg[MAXK];
            double p[MAXK], q[MAXK], kap[MAXK];
            int S = 0;
            for (int k = 0; k < K; k++) {
                if (k > 0 && arl_rng_below(&r, 3) == 0) S++;
                seg[k] = S;
                p[k] = arl_rng_normal(&r);
                kap[k] = 0.1 * arl_rng_normal(&r);
            }
            for (int x = 0; x <= S; x++)
                q[x] = arl_rng_uniform(&r);
            syn_init(&s[i], K, seg, p, q, (double)arl_rng_below(&r, 2), kap);
            for (int k = 0; k < K; k++) {
                snprintf(s[i].anchor[k], sizeof s[i].anchor[k], "st%u",
                         (unsigned)arl_rng_below(&r, 6));
                s[i].turns[k].anchor = s[i].anchor[k];
            }
            if (arl_rng_below(&r, 8) == 0) s[i].tr.status = ARL_REWARD_TRAJ_MASKED;
        }
        for (int gi = 0; gi < 8; gi++)
            group_of(&g[gi], arr + 8 * gi, s + 8 * gi, 8);
        CHECK(arl_reward_compute(&cfg, g, 8, 0.05, NULL, NULL, NULL) == ARL_OK);
        for (int i = 0; i < 64; i++)
            memcpy(out[rep] + i * MAXK, s[i].adv_turn, sizeof s[i].adv_turn);
    }
    CHECK(!memcmp(out[0], out[1], sizeof out[0]));
}

static void test_anchor_baseline(void) {
    /* process rewards only, gamma 1.  Anchors before each turn:
     *   traj 0: A, B, C      G^P = (3, 2, 1)  (p = 1, 1, 1)
     *   traj 1: A, B         G^P = (0.5, 0.25)  (p = 0.25, 0.25)
     *   traj 2: B, B, -      G^P = (6, 4, 2)  (p = 2, 2, 2; turn 3 has no anchor)
     * traj 0 turn 1 (A): Q = {(1,1)} -> 0.5.  turn 2 (B): Q = {(1,2), (2,1), (2,2)} ->
     * (0.25 + 6 + 4) / 3.  turn 3 (C): no other -> turn index: others with K >= 3: traj 2 -> 2.
     * traj 2 turn 1 (B): Q = {(0,2), (1,2)} -> (2 + 0.25) / 2 (own pairs excluded);
     * turn 3: no anchor -> turn index: traj 0 -> 1. */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_OUTCOME] = cfg.w[ARL_REWARD_LEVEL_SEGMENT] = 0;
    cfg.norm[ARL_REWARD_LEVEL_PROCESS] = ARL_REWARD_NORM_NONE;
    cfg.gamma_process = 1;
    cfg.process_baseline = ARL_REWARD_PB_ANCHOR;
    const int s0[] = {0, 0, 0};
    const double p0[] = {1, 1, 1}, p1[] = {0.25, 0.25}, p2[] = {2, 2, 2};
    syn s[3];
    arl_reward_traj arr[3];
    arl_reward_group g;
    syn_init(&s[0], 3, s0, p0, NULL, 0, NULL);
    syn_init(&s[1], 2, s0, p1, NULL, 0, NULL);
    syn_init(&s[2], 3, s0, p2, NULL, 0, NULL);
    s[0].turns[0].anchor = "A", s[0].turns[1].anchor = "B", s[0].turns[2].anchor = "C";
    s[1].turns[0].anchor = "A", s[1].turns[1].anchor = "B";
    s[2].turns[0].anchor = "B", s[2].turns[1].anchor = "B";
    group_of(&g, arr, s, 3);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    CHECK_CLOSE(s[0].proc_base[0], 0.5, TOL, 0);
    CHECK_CLOSE(s[0].proc_base[1], (0.25 + 6 + 4) / 3, TOL, 0);
    CHECK_CLOSE(s[0].proc_base[2], 2, TOL, 0);
    CHECK_CLOSE(s[2].proc_base[0], (2 + 0.25) / 2, TOL, 0);
    CHECK_CLOSE(s[2].proc_base[1], (2 + 0.25) / 2, TOL, 0);
    CHECK_CLOSE(s[2].proc_base[2], 1, TOL, 0);
    CHECK_CLOSE(s[1].proc_base[0], 3, TOL, 0);                 /* A: traj 0 turn 1 */
    CHECK_CLOSE(s[1].proc_base[1], (2 + 6 + 4) / 3.0, TOL, 0); /* B: (0,2), (2,1), (2,2) */
    /* 8 turns, 6 anchor hits (traj 0 turn 3 and traj 2 turn 3 fall back) */
    CHECK_CLOSE(metric(&acc, &cfg, "adv/anchor_hit_frac"), 6.0 / 8, TOL, 0);
    /* a masked member's anchors do not count */
    arr[1].status = ARL_REWARD_TRAJ_MASKED;
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_OK);
    CHECK_CLOSE(s[0].proc_base[0], 6, TOL, 0); /* A: none left -> turn index: traj 2 */
}

static void test_mc_segment_baseline(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.segment_baseline = ARL_REWARD_SB_MC;
    cfg.norm[ARL_REWARD_LEVEL_SEGMENT] = ARL_REWARD_NORM_NONE;
    syn s[2];
    arl_reward_traj arr[2];
    arl_reward_group g;
    const double qa[] = {0.5, 1.0}, qb[] = {0.0, 0.5};
    syn_init(&s[0], 2, seg2, NULL, qa, 0, NULL);
    syn_init(&s[1], 2, seg2, NULL, qb, 0, NULL);
    s[0].mc[0] = NAN;  /* segment 0: no forks -> leave-one-out */
    s[0].mc[1] = 0.75; /* segment 1: mean return of the forks */
    s[0].tr.seg_mc_baseline = s[0].mc;
    group_of(&g, arr, s, 2);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    CHECK_CLOSE(s[0].seg_base[0], 0.5, TOL, 0);
    CHECK_CLOSE(s[0].seg_base[1], 0.75, TOL, 0);
    CHECK_CLOSE(s[0].seg_adv_raw[1], 0.25, TOL, 0);
    CHECK_CLOSE(s[1].seg_base[1], 1.0, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "adv/segment_mc_baseline_frac"), 0.25, TOL, 0);
}

static void test_kl_segment_scope(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    cfg.w[ARL_REWARD_LEVEL_OUTCOME] = cfg.w[ARL_REWARD_LEVEL_SEGMENT] =
        cfg.w[ARL_REWARD_LEVEL_PROCESS] = 0;
    const double kap[] = {0.1, 0.2, 0.4, 0.8};
    syn s;
    arl_reward_traj arr[1];
    arl_reward_group g;
    syn_init(&s, 4, seg4, NULL, NULL, 0, kap); /* segments 0 | 1 1 | 2 */
    group_of(&g, arr, &s, 1);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0.5, NULL, NULL, NULL) == ARL_OK);
    const double dtraj[] = {1.5, 1.4, 1.2, 0.8};
    for (int k = 0; k < 4; k++) {
        CHECK_CLOSE(s.kl_rtg[k], dtraj[k], TOL, 0);
        CHECK_CLOSE(s.adv_turn[k], -0.5 * dtraj[k], TOL, 0);
    }
    cfg.kl_scope = ARL_REWARD_KL_SEGMENT;
    CHECK(arl_reward_compute(&cfg, &g, 1, 0.5, NULL, NULL, NULL) == ARL_OK);
    const double dseg[] = {0.1, 0.6, 0.4, 0.8};
    for (int k = 0; k < 4; k++)
        CHECK_CLOSE(s.kl_rtg[k], dseg[k], TOL, 0);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0.5, NULL, NULL, &acc) == ARL_OK);
    CHECK(metric(&acc, &cfg, "kl/rtg_scope") == 1.0);
}

static void test_absent_levels_and_missing_components(void) {
    /* group 0 declares no segment level: its segment advantages are 0 and its entries stay out
     * of the batch sigma, which then comes from group 1 alone */
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    const int seg1[] = {0};
    syn s[4];
    arl_reward_traj arr[4];
    arl_reward_group g[2];
    const double qa[] = {100}, qb[] = {-100}, qc[] = {1}, qd[] = {0};
    syn_init(&s[0], 1, seg1, NULL, qa, 0, NULL);
    syn_init(&s[1], 1, seg1, NULL, qb, 0, NULL);
    syn_init(&s[2], 1, seg1, NULL, qc, 0, NULL);
    syn_init(&s[3], 1, seg1, NULL, qd, 0, NULL);
    s[0].tr.segment = s[1].tr.segment = NULL; /* allowed for an absent level */
    group_of(&g[0], arr, s, 2);
    group_of(&g[1], arr + 2, s + 2, 2);
    g[0].level_absent[ARL_REWARD_LEVEL_SEGMENT] = 1;
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, NULL) == ARL_OK);
    CHECK(s[0].seg_adv[0] == 0.0 && s[0].adv_turn[0] == 0.0);
    CHECK_CLOSE(s[2].seg_adv[0], 1.0, TOL, 0); /* A = +-1, sigma = 1 */
    CHECK_CLOSE(s[2].adv_turn[0], 0.5, TOL, 0);
    /* weight 0 in the run configuration: absent too */
    cfg.w[ARL_REWARD_LEVEL_SEGMENT] = 0;
    g[0].level_absent[ARL_REWARD_LEVEL_SEGMENT] = 0;
    s[0].tr.segment = s[0].q;
    arr[0].segment = s[0].q, arr[1].segment = s[1].q;
    CHECK(arl_reward_compute(&cfg, g, 2, 0, NULL, NULL, NULL) == ARL_OK);
    CHECK(s[2].adv_turn[0] == 0.0 && s[2].seg_adv[0] == 0.0);

    /* components: outcome = 2 a + 1 b, b missing (NaN) in one response counts as 0 */
    arl_reward_opts o;
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    const char *json = "{\"outcome-components\": [\"a=2\", \"b=1\"], \"w-segment\": 0, "
                       "\"w-process\": 0}";
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count, json, "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_OK);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    syn_init(&s[0], 1, seg1, NULL, NULL, 0, NULL);
    syn_init(&s[1], 1, seg1, NULL, NULL, 0, NULL);
    s[0].R[0] = 0.5, s[0].R[1] = NAN;   /* R = 1 */
    s[1].R[0] = 0.25, s[1].R[1] = 0.25; /* R = 0.75 */
    group_of(&g[0], arr, s, 2);
    arl_reward_acc acc;
    arl_reward_acc_init(&acc);
    CHECK(arl_reward_compute(&cfg, g, 1, 0, NULL, NULL, &acc) == ARL_OK);
    CHECK_CLOSE(arr[0].out.outcome, 1.0, TOL, 0);
    CHECK_CLOSE(arr[0].out.outcome_adv, 0.25, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/missing_components"), 1, 0, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/b/mean"), 0.25, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/a/mean"), 0.375, TOL, 0);
    CHECK_CLOSE(metric(&acc, &cfg, "reward/outcome/mean"), 0.875, TOL, 0);
}

/* Two "processes" (threads) with a summing allreduce must give the same advantages as one
 * process over both groups. */
typedef struct fake_world {
    pthread_barrier_t bar;
    double buf[2][16];
    int n;
} fake_world;
typedef struct rank_ctx {
    fake_world *w;
    int rank;
    batch *b;
    int gi;
    arl_status st;
} rank_ctx;
static arl_status fake_allreduce(double *v, int32_t n, void *ctx) {
    rank_ctx *r = ctx;
    memcpy(r->w->buf[r->rank], v, (size_t)n * sizeof *v);
    pthread_barrier_wait(&r->w->bar);
    for (int32_t i = 0; i < n; i++)
        v[i] = r->w->buf[0][i] + r->w->buf[1][i];
    pthread_barrier_wait(&r->w->bar);
    return ARL_OK;
}
static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    r->st = arl_reward_compute(&cfg, r->b->g + r->gi, 1, 0.1, fake_allreduce, r, NULL);
    return NULL;
}

static void test_allreduce_batch(void) {
    batch one, two;
    batch_init(&one);
    batch_init(&two);
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    run_batch(&one, &cfg, 0.1);
    fake_world w;
    pthread_barrier_init(&w.bar, NULL, 2);
    rank_ctx r[2] = {{&w, 0, &two, 0, ARL_OK}, {&w, 1, &two, 1, ARL_OK}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, rank_main, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&w.bar);
    CHECK(r[0].st == ARL_OK && r[1].st == ARL_OK);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < one.arr[i].n_turns; k++)
            CHECK_CLOSE(two.s[i].adv_turn[k], one.s[i].adv_turn[k], TOL, 0);
}

static void test_errors(void) {
    arl_reward_config cfg;
    arl_reward_config_default(&cfg);
    syn s;
    arl_reward_traj arr[1];
    arl_reward_group g;
    const int bad[] = {0, 2, 2};
    syn_init(&s, 3, bad, NULL, NULL, 0, NULL);
    group_of(&g, arr, &s, 1);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "turn 2 lies in segment 2") != NULL);
    syn_init(&s, 3, seg3, NULL, NULL, 0, NULL);
    s.p[1] = NAN; /* scalar reward: NaN is not "missing" */
    group_of(&g, arr, &s, 1);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "process reward 1, column 0") != NULL);
    syn_init(&s, 3, seg3, NULL, NULL, 0, NULL);
    s.turns[2].tok_start = 2; /* overlaps turn 1 */
    group_of(&g, arr, &s, 1);
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_ERR_ARG);
    syn_init(&s, 3, seg3, NULL, NULL, 0, NULL);
    group_of(&g, arr, &s, 1);
    arr[0].process = NULL;
    CHECK(arl_reward_compute(&cfg, &g, 1, 0, NULL, NULL, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "process rewards missing") != NULL);
    CHECK(arl_reward_compute(&cfg, &g, 1, NAN, NULL, NULL, NULL) == ARL_ERR_ARG);
    /* options */
    arl_reward_opts o;
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count,
                                      "{\"segment_components\": [\"x=1:min\"]}", "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "segment-components") != NULL);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count,
                                      "{\"process_components\": [\"x=1\", \"x=2\"]}", "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "given twice") != NULL);
    CHECK(strstr(arl_error_msg(), "an entry 'none' first drops the entries before it") != NULL);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    /* "none" drops the entries before it (the file's list, which --set entries extend): the
     * scalar reward again, or a new list */
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count,
                                      "{\"process_components\": [\"x=1\", \"y=2\", \"none\", "
                                      "\"x=3:min\"], \"outcome_components\": [\"ok=1\", "
                                      "\"none\"]}",
                                      "t", &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_OK);
    CHECK_EQ_INT(cfg.n_comp[ARL_REWARD_LEVEL_PROCESS], 1);
    CHECK(!strcmp(cfg.comp[ARL_REWARD_LEVEL_PROCESS][0].name, "x"));
    CHECK(cfg.comp[ARL_REWARD_LEVEL_PROCESS][0].weight == 3);
    CHECK(cfg.comp[ARL_REWARD_LEVEL_PROCESS][0].form == ARL_REWARD_FORM_MIN);
    CHECK_EQ_INT(cfg.n_comp[ARL_REWARD_LEVEL_OUTCOME], 0);
    CHECK_EQ_INT(arl_reward_config_ncols(&cfg, ARL_REWARD_LEVEL_OUTCOME), 1);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    /* the defaults of the table equal the section 13 defaults */
    arl_reward_config d1, d2;
    arl_options_defaults(arl_reward_options, arl_reward_options_count, &o);
    CHECK(arl_reward_config_from_opts(&o, &d1) == ARL_OK);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    arl_reward_config_default(&d2);
    CHECK(!memcmp(&d1, &d2, sizeof d1));
}

static void test_token_mapping(void) {
    /* turns [2, 5) and [7, 9); loss mask 0 at 4 (inside turn 1) and at 0-1, 5-6 (context);
     * windows split inside a turn */
    arl_reward_turn turns[2] = {{.tok_start = 2, .tok_end = 5, .seg = 0},
                                {.tok_start = 7, .tok_end = 9, .seg = 1}};
    const uint8_t mask[10] = {0, 0, 1, 1, 0, 0, 0, 1, 1, 1};
    const double old[10] = {NAN, NAN, -1, -2, NAN, NAN, NAN, -0.5, -0.25, -3};
    const double ref[10] = {NAN, NAN, -1.5, -1, NAN, NAN, NAN, -1, -0.5, -3};
    CHECK(arl_reward_turns_scan(turns, 2, 0, 3, mask, old, ref) == ARL_OK);
    CHECK(arl_reward_turns_scan(turns, 2, 3, 7, mask + 3, old + 3, ref + 3) == ARL_OK);
    CHECK_EQ_INT(turns[0].n_action, 2);
    CHECK_EQ_INT(turns[1].n_action, 2); /* token 9 (mask 1) lies outside every turn */
    CHECK_CLOSE(turns[0].kappa, 0.5 - 1, 0, 0);
    CHECK_CLOSE(turns[1].kappa, 0.5 + 0.25, 0, 0);
    double advt[2] = {1.5, -2};
    arl_reward_traj tr = {
        .status = ARL_REWARD_TRAJ_TRUNCATED, .n_turns = 2, .n_segs = 2, .turns = turns};
    tr.out.adv_turn = advt;
    double adv[10];
    CHECK(arl_reward_token_adv(&tr, 0, 4, mask, adv) == ARL_OK);
    CHECK(arl_reward_token_adv(&tr, 4, 6, mask + 4, adv + 4) == ARL_OK);
    const double want[10] = {0, 0, 1.5, 1.5, 0, 0, 0, -2, -2, 0};
    for (int t = 0; t < 10; t++)
        CHECK_MSG(adv[t] == want[t], "token %d: %g", t, adv[t]);
    tr.status = ARL_REWARD_TRAJ_MASKED;
    CHECK(arl_reward_token_adv(&tr, 0, 10, mask, adv) == ARL_OK);
    for (int t = 0; t < 10; t++)
        CHECK(adv[t] == 0.0);
    /* a non-finite log-prob at an action token is an error naming it */
    const double bad[3] = {NAN, NAN, INFINITY};
    CHECK(arl_reward_turns_scan(turns, 2, 0, 3, mask, bad, ref) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "token 2") != NULL);
}

int main(void) {
    TEST_RUN(test_masked_changes_nothing);
    TEST_RUN(test_sum_vs_min_forms);
    TEST_RUN(test_degenerate_and_empty_groups);
    TEST_RUN(test_outcome_all_equal);
    TEST_RUN(test_zero_variance_normalisation);
    TEST_RUN(test_group_scope);
    TEST_RUN(test_invariances);
    TEST_RUN(test_determinism);
    TEST_RUN(test_anchor_baseline);
    TEST_RUN(test_mc_segment_baseline);
    TEST_RUN(test_kl_segment_scope);
    TEST_RUN(test_absent_levels_and_missing_components);
    TEST_RUN(test_allreduce_batch);
    TEST_RUN(test_errors);
    TEST_RUN(test_token_mapping);
    return test_finish();
}
