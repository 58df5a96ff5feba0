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
 * - Start states (spec/replay.md 13.6, 9.1), on the same trajectory (rollout states of version
 *   0, checkpoint_uri A): with the default version (AUTO) its segments start from its rollout
 *   states under A (version 0 found by path) and never under B (no version matches; the old
 *   default, version 0, took A's states for B); a version whose recorded weights_sha256 is B's is
 *   found by the hash under B and refused when asserted under A.
 * - --save-states: a pass under B writes every segment's end state as producer 'tool' (and
 *   scores exactly as a pass that does not); a second pass under B starts every continuing
 *   segment from them and gives bit-identical log-probabilities; a pass with natural routing
 *   does not use them; gc keeps them and verify does not call them orphans once rescores rows
 *   reference them.
 */
#include <math.h>

#include "core/sha256.h"
#include "policy/checkpoint.h"
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
    h_set(&c, "state-cache", "all"); /* rollout states for test_start_states */
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

static float *rescore_v(replay_store *st, const char *ckpt, const char *uid, int64_t version,
                        int natural, replay_writer *save, arl_rollout_rescore_stats *rs,
                        size_t *n) {
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = version,
                                  .natural_routing = natural, .save_states = save};
    float *lp = NULL;
    H_DIE(arl_rollout_rescore(st, uid, &o, rs, &lp, NULL, n), "rescore");
    fprintf(stderr,
            "  rescore under %s, version %lld%s%s: %lld segments, %lld from states (%lld tool), "
            "%lld saved; resolved version %lld (how %d), max |diff| %.3g\n",
            ckpt == ckpt_a ? "A" : "B", (long long)version, natural ? ", natural" : "",
            save ? ", saving" : "", (long long)rs->segments, (long long)rs->from_state,
            (long long)rs->from_tool_state, (long long)rs->states_saved, (long long)rs->version,
            rs->version_how, rs->max_abs);
    return lp;
}

static void test_start_states(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db", tmp); /* test_agreement's store: rollout under A */
    replay_store *st = h_store(db);
    const char *uid = "rollout/g000000/r0";
    replay_traj_row tr;
    H_DIE(replay_traj_get(st, uid, &tr), "traj");
    CHECK_MSG(tr.n_segments >= 3, "%d segments: the test needs continuing segments",
              (int)tr.n_segments);
    const int64_t cont = tr.n_segments - 1; /* segments that start from a boundary */
    arl_rollout_rescore_stats rs;
    size_t n = 0;
    const int64_t AUTO = ARL_ROLLOUT_RESCORE_VERSION_AUTO;

    /* the default under A: version 0 by the weights hash the worker recorded, its rollout
     * states used */
    free(rescore_v(st, ckpt_a, uid, AUTO, 0, NULL, &rs, &n));
    CHECK_EQ_INT(rs.version, 0);
    CHECK_EQ_INT(rs.version_how, ARL_ROLLOUT_RESCORE_VERSION_WEIGHTS);
    CHECK_EQ_INT(rs.from_state, cont);
    CHECK_MSG(rs.max_abs < 1e-3, "max |diff| %g", rs.max_abs); /* fp32 rounding: helpers.h */
    /* the default under B: no version of the run is B, so no rollout state of A starts a
     * segment (an asserted version 0 would take them: the old default) */
    float *lp_b = rescore_v(st, ckpt_b, uid, AUTO, 0, NULL, &rs, &n);
    CHECK_EQ_INT(rs.version, -1);
    CHECK_EQ_INT(rs.version_how, ARL_ROLLOUT_RESCORE_VERSION_NONE);
    CHECK_EQ_INT(rs.from_state, 0);
    CHECK_EQ_INT(rs.recomputed, cont);

    /* a version recorded with B's weights: refused when asserted under A; found by the hash
     * under B (by the pass below, which also saves its states) */
    char hb[ARL_SHA256_HEX_CHARS];
    h_weights_sha(ckpt_b, hb);
    replay_version_desc vd = {.run_id = tr.run_id, .version = 1, .update_n = 0,
                              .checkpoint_uri = "/nonexistent/v1", .weights_sha256 = hb,
                              .kl_coef = NAN};
    H_DIE(replay_version_add(st, &vd), "version 1");
    /* a row without a recorded hash (a store written before workers recorded it) matches by its
     * checkpoint directory after realpath; a row with another hash never matches by path */
    char via[760];
    snprintf(via, sizeof via, "%s/../%s", ckpt_b, strrchr(ckpt_b, '/') + 1);
    replay_version_desc vd2 = {.run_id = tr.run_id, .version = 2, .update_n = 1,
                               .checkpoint_uri = ckpt_b, .kl_coef = NAN};
    H_DIE(replay_version_add(st, &vd2), "version 2");
    int64_t fv = -9;
    int how = -1;
    const char *unknown = "0000000000000000000000000000000000000000000000000000000000000000";
    H_DIE(replay_version_find(st, tr.run_id, unknown, via, &fv, &how), "find by path");
    CHECK_EQ_INT(fv, 2);
    CHECK_EQ_INT(how, 2);
    CHECK(replay_version_find(st, tr.run_id, unknown, ckpt_a, &fv, &how) == ARL_ERR_NOT_FOUND);
    arl_error_clear();
    CHECK_EQ_INT(fv, -1);
    free(rescore_v(st, ckpt_a, uid, 1, 0, NULL, &rs, &n));
    CHECK_EQ_INT(rs.version_how, ARL_ROLLOUT_RESCORE_VERSION_REFUSED);
    CHECK_EQ_INT(rs.version, -1);
    CHECK_EQ_INT(rs.from_state, 0);
    /* a version the run never recorded: unknown, no states of it (it was reported as given) */
    free(rescore_v(st, ckpt_a, uid, 99, 0, NULL, &rs, &n));
    CHECK_EQ_INT(rs.version_how, ARL_ROLLOUT_RESCORE_VERSION_UNKNOWN);
    CHECK_EQ_INT(rs.version, -1);
    CHECK_EQ_INT(rs.from_state, 0);

    /* --save-states under B, then a second pass that starts from them */
    replay_writer *tw;
    H_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw), "tool writer");
    float *lp1 = rescore_v(st, ckpt_b, uid, AUTO, 0, tw, &rs, &n);
    CHECK_EQ_INT(rs.version, 1);
    CHECK_EQ_INT(rs.version_how, ARL_ROLLOUT_RESCORE_VERSION_WEIGHTS);
    CHECK_EQ_INT(rs.states_saved, tr.n_segments);
    CHECK_EQ_INT(rs.from_state, 0);
    /* the saving pass computed everything itself: the same numbers as the plain pass */
    CHECK(lp_b && lp1 && !memcmp(lp_b, lp1, sizeof(float) * n));
    /* its rescores rows (as the CLI writes them) reference the states: gc keeps them */
    replay_seg_ref *refs = NULL;
    size_t nr = 0;
    H_DIE(replay_traj_segments(st, tr.traj_id, &refs, &nr), "segments");
    for (size_t i = 0; i < nr; i++) {
        replay_rescore_desc rd = {.label = "b", .traj_uid = uid, .seg_index = refs[i].seg_index,
                                  .version = -1, .routing = "replay", .stats_json = "{}",
                                  .n_tokens = refs[i].n_tokens,
                                  .logprobs = lp1 + refs[i].tok_start};
        H_DIE(replay_rescore_put(tw, &rd), "rescores row");
    }
    free(refs);
    int64_t deleted = -1;
    H_DIE(replay_states_gc(tw, 0, &deleted), "gc");
    CHECK_EQ_INT(deleted, 0);
    replay_writer_close(tw);
    size_t n2 = 0;
    float *lp2 = rescore_v(st, ckpt_b, uid, AUTO, 0, NULL, &rs, &n2);
    CHECK_EQ_INT(rs.from_tool_state, cont);
    CHECK_EQ_INT(rs.from_state, cont);
    CHECK_EQ_INT((int64_t)n2, (int64_t)n);
    CHECK_MSG(lp1 && lp2 && !memcmp(lp1, lp2, sizeof(float) * n),
              "log-probabilities from the saved states differ");
    free(lp2);
    /* another routing is another pass: not these states */
    free(rescore_v(st, ckpt_b, uid, AUTO, 1, NULL, &rs, &n2));
    CHECK_EQ_INT(rs.from_tool_state, 0);
    CHECK_EQ_INT(rs.from_state, 0);
    /* no errors, and no orphan warning for the referenced tool states */
    char vout[8192] = "";
    FILE *vf = fmemopen(vout, sizeof vout - 1, "w");
    int64_t ne = -1, nw = -1;
    H_DIE(replay_verify(st, NULL, vf, &ne, &nw), "verify");
    fclose(vf);
    CHECK_EQ_INT(ne, 0);
    CHECK_MSG(!strstr(vout, "orphan"), "verify: %s", vout);
    free(lp1);
    free(lp_b);
    replay_store_close(st);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-rescore"));
    snprintf(ckpt_a, sizeof ckpt_a, "%s/ckpt-a", tmp);
    snprintf(ckpt_b, sizeof ckpt_b, "%s/ckpt-b", tmp);
    h_make_ckpt(ckpt_a, NULL, 3);
    h_make_ckpt(ckpt_b, NULL, 4);
    TEST_RUN(test_overlap_unit);
    TEST_RUN(test_agreement);
    TEST_RUN(test_start_states);
    return test_finish();
}
