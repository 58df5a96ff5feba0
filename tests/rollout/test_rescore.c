/* tests/rollout/test_rescore.c: router agreement and entropy of re-scoring (spec/replay.md 13.6
 * step 2, spec/objective.md 11.4; rollout/rescore.h arl_rollout_rescore_ex,
 * policy/router.h arl_router_overlap).
 *
 * - arl_router_overlap on hand-made scores: bias shifts the selection, ties go to the lower
 *   expert, the stored set's order does not matter.
 * - A trajectory rolled out under checkpoint A re-scores under A with agreement exactly 1 (the
 *   natural top-k at every layer equals the stored routes: same weights, same inputs) in both
 *   routing modes, and every token's per-layer overlap in the detail is k; the entropy is
 *   positive and finite.
 * - Under checkpoint B (other weights, same config) the agreement is below 1: the test fails if
 *   agreement were computed from the forced routes instead of the router's own choice.
 */
#include <math.h>

#include "policy/router.h"
#include "tests/rollout/helpers.h"

static char ckpt_a[600], ckpt_b[600], tmp[512];

static void test_overlap_unit(void) {
    const float s[6] = {0.1f, 0.9f, 0.5f, 0.5f, 0.2f, 0.8f};
    float ws[6];
    int32_t nat[3];
    const int32_t r1[3] = {5, 2, 1}; /* any order */
    CHECK_EQ_INT(arl_router_overlap(s, NULL, 6, 3, r1, ws, nat), 3);
    CHECK_EQ_INT(nat[0], 1);
    CHECK_EQ_INT(nat[1], 5);
    CHECK_EQ_INT(nat[2], 2); /* 0.5 tie between experts 2 and 3: the lower wins */
    const int32_t r2[3] = {1, 5, 3};
    CHECK_EQ_INT(arl_router_overlap(s, NULL, 6, 3, r2, ws, nat), 2);
    const float b[6] = {1.0f, 0, 0, 0, 0, 0}; /* the bias selects expert 0 first */
    CHECK_EQ_INT(arl_router_overlap(s, b, 6, 3, r1, ws, nat), 2);
    CHECK_EQ_INT(nat[0], 0);
    const int32_t r3[3] = {0, 3, 4};
    CHECK_EQ_INT(arl_router_overlap(s, NULL, 6, 3, r3, ws, nat), 0);
}

static void rescore(replay_store *st, const char *ckpt, const char *uid, int natural,
                    arl_rollout_rescore_stats *rs, arl_rollout_rescore_detail *det, size_t *n) {
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = -1, .natural_routing = natural};
    float *lp = NULL;
    H_DIE(arl_rollout_rescore_ex(st, uid, &o, rs, &lp, NULL, n, det), "rescore");
    free(lp);
    fprintf(stderr,
            "  rescore %s under %s (%s routing): %lld segments, %lld action tokens, max |diff| "
            "%.3g, entropy mean %.4g, agreement over %lld tokens: overlap %.4f exact layer %.4f "
            "exact token %.4f\n",
            uid, ckpt == ckpt_a ? "A" : "B", natural ? "natural" : "replay",
            (long long)rs->segments, (long long)rs->action_tokens, rs->max_abs, rs->entropy_mean,
            (long long)rs->route_tokens, rs->agree_overlap, rs->agree_exact_layer,
            rs->agree_exact_token);
}

static void test_agreement(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    c.segment_tokens = 900;
    h_set(&c, "state-cache", "off");
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt_a, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    arl_rollout_worker_close(w);
    const char *uid = "rollout/g000000/r0";
    replay_traj_row tr;
    H_DIE(replay_traj_get(st, uid, &tr), "traj");

    for (int natural = 0; natural < 2; natural++) {
        arl_rollout_rescore_stats rs;
        arl_rollout_rescore_detail det;
        size_t n = 0;
        rescore(st, ckpt_a, uid, natural, &rs, &det, &n);
        CHECK(rs.action_tokens > 0);
        CHECK_MSG(rs.max_abs < 1e-3, "max |l - l_mu| = %g", rs.max_abs);
        /* every stored token has routes: all are compared */
        CHECK_EQ_INT(rs.route_tokens, (int64_t)n);
        /* same weights and (up to fp32 rounding far below any score gap) the same inputs:
         * exactly the same selections */
        CHECK_CLOSE(rs.agree_overlap, 1.0, 0, 0);
        CHECK_CLOSE(rs.agree_exact_layer, 1.0, 0, 0);
        CHECK_CLOSE(rs.agree_exact_token, 1.0, 0, 0);
        /* the entropy of a softmax over V is in (0, log V] */
        CHECK_MSG(isfinite(rs.entropy_mean) && rs.entropy_mean > 0 && rs.entropy_mean < 20,
                  "entropy mean %g", rs.entropy_mean);
        CHECK(det.n_moe > 0 && det.k > 0 && det.entropy && det.overlap);
        int64_t bad = 0;
        for (size_t i = 0; det.overlap && i < (size_t)det.n_moe * n; i++)
            bad += det.overlap[i] != det.k;
        CHECK_EQ_INT(bad, 0);
        free(det.entropy);
        free(det.overlap);
    }

    /* other weights: the router's own choice departs from the stored routes */
    for (int natural = 0; natural < 2; natural++) {
        arl_rollout_rescore_stats rs;
        size_t n = 0;
        arl_rollout_rescore_detail det;
        rescore(st, ckpt_b, uid, natural, &rs, &det, &n);
        CHECK_EQ_INT(rs.route_tokens, (int64_t)n);
        CHECK_MSG(rs.agree_overlap < 0.9, "agreement %g under other weights", rs.agree_overlap);
        CHECK(rs.agree_exact_token <= rs.agree_exact_layer && rs.agree_exact_layer <= 1.0);
        CHECK(rs.agree_overlap > 0); /* sigmoid top-k of a random router: some overlap by chance */
        CHECK(isfinite(rs.entropy_mean) && rs.entropy_mean > 0);
        if (!natural) CHECK(rs.max_abs > 1e-3); /* sanity: B really is another policy */
        free(det.entropy);
        free(det.overlap);
    }
    /* the plain entry point reports the same agreement */
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt_a, .version = -1};
    arl_rollout_rescore_stats rs;
    H_DIE(arl_rollout_rescore(st, uid, &o, &rs, NULL, NULL, NULL), "rescore");
    CHECK_CLOSE(rs.agree_overlap, 1.0, 0, 0);
    CHECK(rs.route_tokens > 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-rescore"));
    snprintf(ckpt_a, sizeof ckpt_a, "%s/ckpt-a", tmp);
    snprintf(ckpt_b, sizeof ckpt_b, "%s/ckpt-b", tmp);
    h_make_ckpt(ckpt_a, NULL, 3);
    h_make_ckpt(ckpt_b, NULL, 4);
    TEST_RUN(test_overlap_unit);
    TEST_RUN(test_agreement);
    return test_finish();
}
