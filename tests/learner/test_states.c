/* tests/learner/test_states.c: the learner's states in the store (learner/states.c,
 * spec/replay.md 9.1 producer 'learner', 9.3 state_cache.learner).
 *   all      keep-states all: every segment whose end the pi_old pass reached is in the learner
 *            file, both parts, version n, the pass_uid of the weights, the learner's numerics and
 *            routing; `replay rescore` of the checkpoint starts every continue segment from
 *            them, and scores what a rescore that recomputes everything scores
 *   pinned   keep-states pinned: the pinned trajectory's states only
 *   off      the default: nothing, even with a learner file given
 *   fork     with routing natural, a fork at a boundary whose rollout states are gone starts
 *            from the learner's states instead of a prefill */
#include <math.h>

#include "core/sha256.h"
#include "rollout/boundary.h"
#include "rollout/rescore.h"
#include "tests/learner/lhelpers.h"

static char ckpt[600], db[600];

/* The pass_uid the learner gives its states under the weights of p, routes replayed (natural
 * 0) or the router's own, dense MLA. */
static void pass_of(const arl_model_params *p, int natural, char *out, size_t cap) {
    char hex[ARL_SHA256_HEX_CHARS];
    arl_model_params_sha256_hex(p, hex);
    ro_pass_uid("learner", hex, natural, 0, 0, out, cap);
}

/* 1 when the learner state (uid, seg, kind) of pass is in the store; checks its row. */
static int have_state(replay_store *st, const char *uid, int32_t seg, const char *kind,
                      const char *pass, int64_t version) {
    const int natural = strstr(pass, ":natural:") != NULL;
    replay_state_data d;
    memset(&d, 0, sizeof d);
    arl_status s = replay_state_find(st, uid, seg, kind, "learner", pass, &d);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        replay_state_data_free(&d);
        return 0;
    }
    L_DIE(s, "state find");
    CHECK_EQ_INT(d.version_min, version);
    CHECK_EQ_INT(d.version_max, version);
    CHECK_STR_EQ(d.producer, "learner");
    CHECK_STR_EQ(d.routing, natural ? "natural" : "replay");
    CHECK_STR_EQ(d.numerics, ARL_LEARNER_NUMERICS);
    CHECK(d.n_chunks > 0);
    replay_state_data_free(&d);
    return 1;
}

/* The trajectories "lt/g<i>/r<j>" of the store whose group is one of gids: (max) rows. */
static size_t members_of(replay_store *st, const int64_t *gids, int64_t ng, replay_traj_row *out,
                         size_t max) {
    size_t n = 0;
    for (int g = 0; g < 64; g++)
        for (int r = 0; r < 2; r++) {
            char uid[64];
            snprintf(uid, sizeof uid, "lt/g%06d/r%d", g, r);
            replay_traj_row row;
            arl_status s = replay_traj_get(st, uid, &row);
            if (s == ARL_ERR_NOT_FOUND) {
                arl_error_clear();
                continue;
            }
            L_DIE(s, "traj");
            for (int64_t k = 0; k < ng; k++)
                if (row.group_id == gids[k] && n < max) out[n++] = row;
        }
    return n;
}

/* Update n over the next two final groups (*gids, their members into rows/nrows) with
 * keep-states `keep`, its states into a learner file of the store when with_writer; the
 * update is committed after.  *pass: the pass_uid its states get.  pin_first: pin the first
 * member before the update.  Returns the states written. */
static int64_t update_keeping(int64_t n, int keep, int natural, int with_writer, int pin_first,
                              replay_traj_row *rows, size_t *nrows, char *pass, size_t cap) {
    int64_t gids[16];
    const int64_t ng = lh_plan(db, n, 2, gids);
    CHECK_EQ_INT(ng, 2);
    lh_learner h;
    memset(&h, 0, sizeof h);
    lh_opts o = {.keep_states = keep};
    o.natural_routing = natural;
    L_DIE(lh_learner_try_open(&h, ckpt, NULL, 1, 4, NULL, &o), "learner");
    pass_of(&h.params, natural, pass, cap); /* the weights before the update's step */
    arl_update_source src = {.root = db, .group_ids = gids, .n_groups = ng};
    replay_open_opts oo = {0};
    L_DIE(replay_store_open(db, &oo, &src.store), "store");
    *nrows = members_of(src.store, gids, ng, rows, 16);
    CHECK(*nrows == 4);
    if (pin_first) L_DIE(replay_pin(src.store, rows[0].traj_uid, "test"), "pin");
    replay_writer *w = NULL;
    if (with_writer) {
        L_DIE(replay_writer_open(src.store, REPLAY_FILE_LEARNER, 0, NULL, &w), "learner file");
        src.states_out = w;
    }
    arl_update_result res;
    L_DIE(arl_learner_update(h.l, n, &src, 1, &res), "update");
    free(res.metrics_json);
    replay_writer_close(w);
    int64_t run_id;
    L_DIE(replay_run_find(src.store, "lt", &run_id), "run");
    L_DIE(replay_update_commit(src.store, run_id, n, -1, NULL), "commit");
    replay_store_close(src.store);
    lh_learner_close(&h);
    return res.states_saved;
}

/* The segment-end states of trajectory row with both learner parts of pass at version n: every
 * segment but the last has them (the pass reaches each boundary; the last segment's end only
 * when its last token was fed, as in a truncated trajectory); their count, or -1 when the first
 * has none.  *n_segs: the trajectory's segments. */
static int64_t states_of(replay_store *st, const replay_traj_row *row, const char *pass, int64_t n,
                         size_t *n_segs) {
    replay_seg_ref *refs = NULL;
    size_t ns = 0;
    L_DIE(replay_traj_segments(st, row->traj_id, &refs, &ns), "segments");
    *n_segs = ns;
    if (ns == 0 || !have_state(st, row->traj_uid, refs[0].seg_index, "kda_boundary", pass, n)) {
        free(refs);
        return -1;
    }
    int64_t k = 0;
    for (size_t j = 0; j < ns; j++) {
        const int kda = have_state(st, row->traj_uid, refs[j].seg_index, "kda_boundary", pass, n);
        const int mla = have_state(st, row->traj_uid, refs[j].seg_index, "mla_segment", pass, n);
        CHECK_MSG(kda == mla, "%s seg %d: %d %d", row->traj_uid, (int)refs[j].seg_index, kda, mla);
        CHECK_MSG(kda || j + 1 == ns, "%s seg %d: none", row->traj_uid, (int)refs[j].seg_index);
        k += kda;
    }
    free(refs);
    return k;
}

static void test_all(void) {
    char pass[96];
    replay_traj_row rows[16];
    size_t nr = 0;
    const int64_t saved =
        update_keeping(0, ARL_LEARNER_KEEP_ALL, 0, 1, 0, rows, &nr, pass, sizeof pass);
    fprintf(stderr, "  update 0 (keep-states all): %lld states, pass %s\n", (long long)saved,
            pass);
    CHECK(saved > 0);
    replay_store *st;
    replay_open_opts oo = {0};
    L_DIE(replay_store_open(db, &oo, &st), "store");
    /* every segment but the last of each consumed trajectory (whose last sampled token was
     * never fed) has both parts */
    int64_t found = 0;
    int multi = -1;
    for (size_t i = 0; i < nr; i++) {
        size_t ns = 0;
        const int64_t k = states_of(st, &rows[i], pass, 0, &ns);
        CHECK_MSG(k > 0, "%s: no learner states", rows[i].traj_uid);
        if (k > 0) found += k;
        if (ns >= 2 && multi < 0) multi = (int)i;
    }
    CHECK_MSG(found == saved, "%lld boundaries found, %lld written", (long long)found,
              (long long)saved);
    CHECK_MSG(multi >= 0, "no consumed trajectory with 2 segments");
    /* rescore of the checkpoint: its continue segments start from the learner's states */
    if (multi >= 0) {
        const char *uid = rows[multi].traj_uid;
        arl_rollout_rescore_opts ro = {.ckpt_dir = ckpt,
                                       .version = ARL_ROLLOUT_RESCORE_VERSION_AUTO};
        arl_rollout_rescore_stats a, b;
        float *la = NULL, *lb = NULL;
        size_t na = 0, nb = 0;
        L_DIE(arl_rollout_rescore(st, uid, &ro, &a, &la, NULL, &na), "rescore");
        ro.version = -1; /* everything recomputed */
        L_DIE(arl_rollout_rescore(st, uid, &ro, &b, &lb, NULL, &nb), "rescore -1");
        double dmax = 0;
        CHECK_EQ_INT((int64_t)na, (int64_t)nb);
        for (size_t t = 0; t < na && t < nb; t++)
            dmax = fmax(dmax, fabs((double)la[t] - (double)lb[t]));
        fprintf(stderr,
                "  rescore %s: %lld segments, %lld from learner states, %lld from tool states; "
                "max |difference| to a full recompute %.3g\n",
                uid, (long long)a.segments, (long long)a.from_learner_state,
                (long long)a.from_tool_state, dmax);
        CHECK_EQ_INT(a.from_learner_state, a.segments - 1);
        CHECK_EQ_INT(a.from_state, a.from_learner_state);
        CHECK_EQ_INT(a.from_tool_state, 0);
        CHECK_EQ_INT(b.from_learner_state, 0);
        /* the learner's chunked training forward and the engine's prefill are both fp32 over
         * the same tokens and routes and differ in summation order only (spec/policy.md
         * 16.4); a state of another segment, version or routing moves log-probs by 0.1-10 */
        CHECK_MSG(dmax < 2e-3, "%g", dmax);
        free(la);
        free(lb);
    }
    replay_store_close(st);
}

static void test_pinned_and_off(void) {
    char pass[96];
    replay_traj_row rows[16];
    size_t nr = 0;
    const int64_t saved =
        update_keeping(1, ARL_LEARNER_KEEP_PINNED, 0, 1, 1, rows, &nr, pass, sizeof pass);
    fprintf(stderr, "  update 1 (keep-states pinned, %s pinned): %lld states\n", rows[0].traj_uid,
            (long long)saved);
    replay_store *st;
    replay_open_opts oo = {0};
    L_DIE(replay_store_open(db, &oo, &st), "store");
    size_t ns = 0;
    const int64_t k = states_of(st, &rows[0], pass, 1, &ns);
    CHECK_MSG(k > 0 && k == saved, "%lld of the pinned trajectory, %lld written", (long long)k,
              (long long)saved);
    for (size_t i = 1; i < nr; i++)
        CHECK_MSG(states_of(st, &rows[i], pass, 1, &ns) == -1, "%s", rows[i].traj_uid);
    replay_store_close(st);
    /* off (the default), a learner file given all the same: nothing */
    const int64_t none =
        update_keeping(2, ARL_LEARNER_KEEP_OFF, 0, 1, 0, rows, &nr, pass, sizeof pass);
    CHECK_EQ_INT(none, 0);
    L_DIE(replay_store_open(db, &oo, &st), "store");
    for (size_t i = 0; i < nr; i++)
        CHECK_MSG(states_of(st, &rows[i], pass, 2, &ns) == -1, "%s", rows[i].traj_uid);
    replay_store_close(st);
}

/* A fork at a boundary of a trajectory whose rollout states are gone (final, state_cache
 * 'last'): prefilled before the update; after an update with natural routing and keep-states
 * all under the same weights, started from the learner's states (rollout/resume.c). */
static void test_fork_natural(void) {
    int64_t gids[16];
    const int64_t ng = lh_plan(db, 3, 2, gids);
    CHECK_EQ_INT(ng, 2);
    replay_store *st;
    replay_open_opts oo = {0};
    L_DIE(replay_store_open(db, &oo, &st), "store");
    replay_traj_row rows[16];
    const size_t nr = members_of(st, gids, ng, rows, 16);
    int parent = -1;
    for (size_t i = 0; i < nr && parent < 0; i++) {
        replay_seg_ref *refs = NULL;
        size_t ns = 0;
        L_DIE(replay_traj_segments(st, rows[i].traj_id, &refs, &ns), "segments");
        if (ns >= 2 && !strcmp(refs[0].end_cause, "token_budget")) parent = (int)i;
        free(refs);
    }
    CHECK_MSG(parent >= 0, "no member with a boundary to fork at");
    int64_t run_id;
    L_DIE(replay_run_find(st, "lt", &run_id), "run");
    L_DIE(replay_update_abort(st, run_id, 3), "abort"); /* planned again by update_keeping */
    arl_rollout_config c;
    lh_rollout_cfg(&c, 8, 2, 0, 0, 0);
    char uids[1][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    if (parent >= 0) {
        L_DIE(arl_rollout_fork(&c, ckpt, st, rows[parent].traj_uid, 1, 1, NULL, uids, &fs),
              "fork before");
        CHECK_EQ_INT(fs.forked, 1);
        CHECK_EQ_INT(fs.forked_from_state, 0); /* prefilled */
    }
    replay_store_close(st);
    char pass[96];
    size_t n2 = 0;
    const int64_t saved =
        update_keeping(3, ARL_LEARNER_KEEP_ALL, 1, 1, 0, rows, &n2, pass, sizeof pass);
    fprintf(stderr, "  update 3 (keep-states all, routing natural): %lld states, pass %s\n",
            (long long)saved, pass);
    CHECK(saved > 0);
    L_DIE(replay_store_open(db, &oo, &st), "store");
    if (parent >= 0) {
        size_t ns = 0;
        CHECK(states_of(st, &rows[parent], pass, 3, &ns) > 0);
        L_DIE(arl_rollout_fork(&c, ckpt, st, rows[parent].traj_uid, 1, 1, NULL, uids, &fs),
              "fork after");
        CHECK_EQ_INT(fs.forked, 1);
        CHECK_EQ_INT(fs.forked_from_state, 1);
    }
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    const char *tmp = test_tmpdir("lstates");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    lh_make_ckpt(ckpt, 3);
    lh_rollout(db, ckpt, 8, 2, 0);
    TEST_RUN(test_all);
    TEST_RUN(test_pinned_and_off);
    TEST_RUN(test_fork_natural);
    return test_finish();
}
