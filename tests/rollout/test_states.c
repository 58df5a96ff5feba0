/* tests/rollout/test_states.c: what a rollout keeps of its model states, and what the store alone
 * rebuilds.
 *
 *   - state-cache last (spec/replay.md 9.3): after every committed boundary of a running
 *     trajectory only its newest kda_boundary state and the mla_segment states since its last
 *     fresh start can be loaded; once the trajectory is final none can; re-scoring still
 *     reproduces the behaviour log-probabilities (from recomputed prefixes);
 *   - images (shapes): with no cached state at all (state-cache off) every image placeholder's
 *     rows are rebuilt from the PNGs in the store (rollout/media.h), so re-scoring compares every
 *     segment (none skipped) and reproduces the log-probabilities; a worker stopped
 *     mid-trajectory (as a crash would leave it) is resumed on restart by recomputing the
 *     prefix, images included, instead of being masked RESUME_IMPOSSIBLE, and the finished
 *     trajectory re-scores to its log-probabilities.
 *
 * Tolerance: |l - l_mu| < 1e-3 nats, as tests/rollout/helpers.h explains (fp32 rounding of
 * different chunkings is ~1e-6; a wrong image row, state or route gives 0.1 and more). */
#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

/* ---- state-cache last ---- */

typedef struct last_probe {
    replay_store *st;
    int checks, bad;
} last_probe;

/* 1 if state_id can be loaded (complete, not evicted). */
static int loadable(replay_store *st, int32_t shard, int64_t id) {
    if (id < 0) return 0;
    replay_state_data d;
    memset(&d, 0, sizeof d);
    arl_status s = replay_state_load(st, shard, id, &d);
    replay_state_data_free(&d);
    arl_error_clear();
    return s == ARL_OK;
}

static int last_on_commit(void *user, const char *uid, int32_t seg, int final) {
    last_probe *p = user;
    replay_traj_row r;
    if (replay_traj_get(p->st, uid, &r)) return 1;
    replay_seg_ref *refs;
    size_t n;
    if (replay_traj_segments(p->st, r.traj_id, &refs, &n)) return 1;
    const int32_t shard = (int32_t)(r.traj_id >> REPLAY_TRAJ_ID_SHIFT);
    size_t fresh = 0; /* the last fresh start among the committed segments */
    for (size_t i = 0; i < n; i++)
        if (!strcmp(refs[i].start_kind, "fresh")) fresh = i;
    for (size_t i = 0; i < n; i++) {
        int want_kda = !final && i + 1 == n && (int32_t)i == seg;
        int want_lat = !final && i >= fresh;
        int kda = loadable(p->st, shard, refs[i].end_state_id);
        int lat = loadable(p->st, shard, refs[i].latent_state_id);
        if (refs[i].end_state_id >= 0 && kda != want_kda) p->bad++;
        if (refs[i].latent_state_id >= 0 && lat != want_lat) p->bad++;
        p->checks += (refs[i].end_state_id >= 0) + (refs[i].latent_state_id >= 0);
    }
    free(refs);
    return 0;
}

static void test_state_cache_last(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-last", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 2;
    c.segment_tokens = 900;
    h_set(&c, "state-cache", "last");
    last_probe p = {.st = h_store(db)};
    arl_rollout_hooks hk = {.user = &p, .on_commit = last_on_commit};
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, p.st, 0, &hk, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->masked, 0);
    CHECK(s->segments >= 4); /* boundaries happened: states were written and evicted */
    arl_rollout_worker_close(w);
    CHECK(p.checks >= 4);
    CHECK_EQ_INT(p.bad, 0);
    CHECK_EQ_INT(h_verify(p.st), 0);
    /* nothing cached survives the end; re-scoring recomputes every prefix */
    CHECK_EQ_INT(h_rescore_check(p.st, ckpt, "rollout/g000000/r0"), 0);
    CHECK_EQ_INT(h_rescore_check(p.st, ckpt, "rollout/g000000/r1"), 0);
    replay_store_close(p.st);
    arl_rollout_config_free(&c);
}

/* ---- images rebuilt from the store ---- */

/* Re-score uid with no cached state at all; every segment must be compared. */
static void rescore_from_store(replay_store *st, const char *uid) {
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = -1};
    arl_rollout_rescore_stats rs;
    H_DIE(arl_rollout_rescore(st, uid, &o, &rs, NULL, NULL, NULL), "rescore");
    fprintf(stderr,
            "  rescore %s from the store alone: %lld segments, %lld skipped, %lld image "
            "placeholders rebuilt, %lld action tokens, max |diff| %.3g\n",
            uid, (long long)rs.segments, (long long)rs.skipped, (long long)rs.images,
            (long long)rs.action_tokens, rs.max_abs);
    CHECK(rs.images > 0);
    CHECK_EQ_INT(rs.skipped, 0);
    CHECK(rs.action_tokens > 0);
    CHECK_MSG(rs.max_abs < 1e-3, "%s: max |l - l_mu| = %g", uid, rs.max_abs);
}

static void test_images_rescore(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-shapes", tmp);
    arl_rollout_config c;
    h_config(&c, "builtin:shapes");
    c.tasks = 1;
    c.group_size = 2;
    h_set(&c, "state-cache", "off");
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    CHECK_EQ_INT(arl_rollout_worker_stats(w)->masked, 0);
    CHECK(arl_rollout_worker_stats(w)->segments >= 3);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    rescore_from_store(st, "rollout/g000000/r0");
    rescore_from_store(st, "rollout/g000000/r1");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static void test_images_resume(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-shapes-resume", tmp);
    arl_rollout_config c;
    h_config(&c, "builtin:shapes");
    c.tasks = 1;
    c.group_size = 1;
    h_set(&c, "state-cache", "off"); /* no cached state: the resume must recompute the prefix */
    h_run_until_first_boundary(&c, ckpt, db, 1);
    replay_store *st = h_store(db);
    const int32_t shard = 1;
    arl_rollout_worker *w;
    replay_traj_row r;
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "traj");
    CHECK(r.status == REPLAY_RUNNING);
    /* restart on the same shard */
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, shard, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    arl_rollout_stats_print(s, stderr);
    CHECK_EQ_INT(s->resumed, 1);
    CHECK_EQ_INT(s->masked, 0);
    arl_rollout_worker_close(w);
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "traj");
    CHECK(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED);
    CHECK_EQ_INT(h_verify(st), 0);
    rescore_from_store(st, "rollout/g000000/r0");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-states"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_state_cache_last);
    TEST_RUN(test_images_rescore);
    TEST_RUN(test_images_resume);
    return test_finish();
}
