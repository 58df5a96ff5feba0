/* tests/rollout/test_fork.c: forking a stored trajectory at a segment boundary
 * (spec/replay.md 13.7, rollout/rollout.h arl_rollout_fork): the forks keep the parent's first
 * segment as their prefix (read through the parent), continue from its cached boundary state with
 * the environment replayed to the fork point, and finish on the ordinary rollout path.  The store
 * verifies; re-scoring gives the parent and its forks the same log-probabilities on the shared
 * prefix; and every fork token re-scores to its stored behaviour log-probability both from the
 * cached boundary state and from a prefix recomputed from scratch, so the state the fork started
 * from is the state the parent had.  Forking the same point again adds new trajectories
 * (their uids after the first ones', a group of their own); a fork point that ends the parent is
 * refused before anything is written.
 *
 * Images (shapes, test_fork_images): the prefix of a fork holds image placeholders whose PNGs
 * are in the parent's file, not the fork's.  With no cached state at all (state-cache off) the
 * fork must recompute its prefix, images included, from the parent's stored observations
 * (rollout/media.c) to continue, and re-scoring the fork from the store alone compares every
 * segment, the prefix's included (none skipped), within the tolerance of helpers.h. */
#include <dirent.h>
#include <sqlite3.h>

#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

/* Entries of folder dir (-1 if it cannot be read). */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The parent: one calculator trajectory of at least two segments under ckpt in a new store at
 * db (configuration c, the store *st, its row *pr). */
static const char *parent_run_cached(const char *db, arl_rollout_config *c, replay_store **st,
                                     replay_traj_row *pr, const char *state_cache) {
    h_config(c, "calculator");
    c->tasks = 1;
    c->group_size = 1;
    c->segment_tokens = 900;
    c->max_turns = 6;
    h_set(c, "state-cache", state_cache);
    /* one rollout per state-cache setting, copied for the tests after the first (the same bits:
     * a rollout is deterministic) */
    static char made[2][700];
    const int k = !strcmp(state_cache, "off");
    if (made[k][0]) {
        char cmd[1600];
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", made[k], db);
        CHECK_EQ_INT(system(cmd), 0);
        *st = h_store(db);
    } else {
        *st = h_store(db);
        arl_rollout_worker *w;
        H_DIE(arl_rollout_worker_open(c, ckpt, *st, 0, NULL, &w), "open");
        H_DIE(arl_rollout_worker_run(w), "run");
        arl_rollout_worker_close(w);
        replay_store_close(*st);
        snprintf(made[k], sizeof made[k], "%s/parent-%s", tmp, state_cache);
        char cmd[1600];
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", db, made[k]);
        CHECK_EQ_INT(system(cmd), 0);
        *st = h_store(db);
    }
    const char *parent = "rollout/g000000/r0";
    H_DIE(replay_traj_get(*st, parent, pr), "parent");
    CHECK(pr->n_segments >= 2);
    return parent;
}

/* The finished parent keeps its boundary states. */
static const char *parent_run(const char *db, arl_rollout_config *c, replay_store **st,
                              replay_traj_row *pr) {
    return parent_run_cached(db, c, st, pr, "all");
}

static void test_fork(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db", tmp);
    arl_rollout_config c;
    replay_store *st;
    replay_traj_row pr;
    const char *parent = parent_run(db, &c, &st, &pr);
    replay_seg_ref *refs;
    size_t nref;
    H_DIE(replay_traj_segments(st, pr.traj_id, &refs, &nref), "segments");
    CHECK_STR_EQ(refs[0].end_cause, "token_budget");
    const int64_t prefix_end = refs[0].tok_start + refs[0].n_tokens;
    free(refs);

    char uids[2][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    c.seed = 99; /* other draws than the parent's */
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, 1, 2, NULL, uids, &fs), "fork");
    arl_rollout_stats_print(&fs, stderr);
    CHECK_EQ_INT(fs.trajectories, 2);
    CHECK_EQ_INT(fs.masked, 0);
    /* the parent's weights: its run's version 0, so from its cached state */
    CHECK_EQ_INT(fs.forked_from_state, 2);
    replay_store_close(st);
    st = h_store(db); /* pick up the tool file */
    CHECK_EQ_INT(h_verify(st), 0);

    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = 0};
    arl_rollout_rescore_stats rs;
    float *plp = NULL, *pmu = NULL;
    size_t pn = 0;
    H_DIE(arl_rollout_rescore(st, parent, &o, &rs, &plp, &pmu, &pn), "rescore parent");
    for (int i = 0; i < 2; i++) {
        replay_traj_row r;
        H_DIE(replay_traj_get(st, uids[i], &r), uids[i]);
        CHECK_STR_EQ(r.parent_traj_uid, parent);
        CHECK_EQ_INT(r.fork_seg_index, 0);
        CHECK(r.run_id == pr.run_id && r.min_version == 0 && r.max_version == 0);
        CHECK(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED);
        /* from the cached states: the fork's first own segment starts from the parent's state */
        CHECK(h_rescore_check(st, ckpt, uids[i]) >= 1);
        /* from scratch: no cached state at all */
        arl_rollout_rescore_opts o2 = {.ckpt_dir = ckpt, .version = -1};
        float *flp = NULL;
        size_t fn = 0;
        H_DIE(arl_rollout_rescore(st, uids[i], &o2, &rs, &flp, NULL, &fn), "rescore fork");
        CHECK(rs.action_tokens > 0 && rs.max_abs < 1e-3); /* fp32 rounding, as in helpers.h */
        /* the shared prefix scores the same in the parent and the fork (one computation path:
         * a fresh start over the same stored tokens and routes) */
        CHECK((int64_t)fn > prefix_end && (int64_t)pn > prefix_end);
        CHECK(!memcmp(flp, plp, sizeof(float) * (size_t)prefix_end));
        free(flp);
    }
    free(plp);
    free(pmu);

    /* the same fork again: new trajectories after the first two (f1.2, f1.3), in a group of
     * their own; those before are untouched */
    char more[2][REPLAY_UID_MAX + 1];
    c.seed = 100;
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, 1, 2, NULL, more, &fs), "fork again");
    CHECK_EQ_INT(fs.trajectories, 2);
    CHECK_EQ_INT(fs.masked, 0);
    CHECK_STR_EQ(more[0], "rollout/g000000/r0/f1.2");
    CHECK_STR_EQ(more[1], "rollout/g000000/r0/f1.3");
    replay_store_close(st);
    st = h_store(db);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_traj_row r0, r2;
    H_DIE(replay_traj_get(st, uids[0], &r0), "first fork");
    H_DIE(replay_traj_get(st, more[0], &r2), "second fork");
    CHECK(r0.group_id != r2.group_id && r0.traj_id != r2.traj_id);
    /* a fork point that is not a boundary inside the parent (its last segment ends it): refused
     * before anything is written, naming the boundaries there are */
    char none[1][REPLAY_UID_MAX + 1], shards[800];
    snprintf(shards, sizeof shards, "%s/shards", db);
    const int n_files = count_files(shards);
    CHECK(arl_rollout_fork(&c, ckpt, st, parent, (int32_t)pr.n_segments, 1, NULL, none, &fs) ==
          ARL_ERR_RANGE);
    CHECK_EQ_INT(count_files(shards), n_files); /* no tool file either */
    CHECK_EQ_INT(fs.trajectories, 0);
    CHECK_MSG(strstr(arl_error_msg(), "not at the segment token budget") &&
                  strstr(arl_error_msg(), "its boundaries are --segment 1.."),
              "%s", arl_error_msg());
    arl_error_clear();
    char u[REPLAY_UID_MAX + 1];
    snprintf(u, sizeof u, "%s/f%d.0", parent, (int)pr.n_segments);
    CHECK(replay_traj_get(st, u, &r2) == ARL_ERR_NOT_FOUND);
    arl_error_clear();
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* The forks' group (spec/replay.md 13.7 step 3, rollout.h arl_rollout_fork): a group uid the
 * catalog has already is refused before anything is written unless it is an empty fork group of
 * the same point and size: a training group (forks would replace its members), a fork group of
 * another point, and a fork group that holds forks already.  An empty fork group of this point
 * (a fork command that stopped after creating it) is joined. */
static void test_fork_group_uid(void) {
    char db[700], shards[800];
    snprintf(db, sizeof db, "%s/db-group", tmp);
    snprintf(shards, sizeof shards, "%s/shards", db);
    arl_rollout_config c;
    replay_store *st;
    replay_traj_row pr;
    const char *parent = parent_run(db, &c, &st, &pr);
    const int n_files = count_files(shards);
    char u[1][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    arl_rollout_fork_opts o = {.group_uid = "rollout/g000000", .version = -1};
    CHECK(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &o, u, &fs) == ARL_ERR_ARG);
    CHECK_MSG(strstr(arl_error_msg(), "group 'rollout/g000000' already exists as a 'train' group"),
              "%s", arl_error_msg());
    arl_error_clear();
    CHECK_EQ_INT(count_files(shards), n_files); /* no tool file */
    replay_group_row g;
    H_DIE(replay_group_get(st, "rollout/g000000", &g), "training group");
    CHECK_EQ_INT(g.n_members, 1);
    CHECK_STR_EQ(g.kind, "train");
    replay_traj_row r;
    H_DIE(replay_traj_get(st, parent, &r), "parent");
    CHECK(r.group_id == g.group_id);

    /* empty fork groups: of another point (refused), of this point and size (joined) */
    replay_group_desc d = {.group_uid = "other-point",
                           .run_id = pr.run_id,
                           .task_id = pr.task_id,
                           .env_id = pr.env_id,
                           .kind = "fork",
                           .size = 1,
                           .parent_traj_uid = parent,
                           .parent_seg_index = 5};
    int64_t gid;
    H_DIE(replay_group_ensure(st, &d, &gid), "group of another point");
    o.group_uid = "other-point";
    CHECK(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &o, u, &fs) == ARL_ERR_ARG);
    CHECK_MSG(
        strstr(arl_error_msg(), "already holds the forks of rollout/g000000/r0 at --segment 6"),
        "%s", arl_error_msg());
    arl_error_clear();
    CHECK_EQ_INT(count_files(shards), n_files);
    d.group_uid = "this-point";
    d.parent_seg_index = 0;
    H_DIE(replay_group_ensure(st, &d, &gid), "empty group of this point");
    o.group_uid = "this-point";
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &o, u, &fs), "fork into the empty group");
    CHECK_EQ_INT(fs.trajectories, 1);
    replay_store_close(st);
    st = h_store(db);
    H_DIE(replay_traj_get(st, u[0], &r), "fork");
    CHECK(r.group_id == gid);
    /* that group holds its fork now: the same uid again is refused */
    const int n_files2 = count_files(shards);
    CHECK(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &o, u, &fs) == ARL_ERR_ARG);
    CHECK_MSG(strstr(arl_error_msg(), "already holds 1 of 1 forks"), "%s", arl_error_msg());
    arl_error_clear();
    CHECK_EQ_INT(count_files(shards), n_files2);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* The forks' run and version follow their weights (rollout.h arl_rollout_fork): a checkpoint
 * that is a version of the parent's run continues there at that version; other weights make a
 * run of their own at version 0 and do not start from the parent's cached state (computed by
 * other weights, spec/replay.md 13.7 step 1) unless use_rollout_state says so; a version the
 * checkpoint is not is refused before anything is written. */
static void test_fork_versions(void) {
    char db[700], other[700], shards[800];
    snprintf(db, sizeof db, "%s/db-versions", tmp);
    snprintf(other, sizeof other, "%s/other", tmp);
    snprintf(shards, sizeof shards, "%s/shards", db);
    h_make_ckpt(other, NULL, 4); /* other weights */
    arl_rollout_config c;
    replay_store *st;
    replay_traj_row pr;
    const char *parent = parent_run(db, &c, &st, &pr);
    char u[3][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    /* version 1 of the run is not this checkpoint (it has only version 0): refused */
    const int n_files = count_files(shards);
    arl_rollout_fork_opts v1 = {.version = 1};
    CHECK(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &v1, u, &fs) == ARL_ERR_STATE);
    CHECK_MSG(strstr(arl_error_msg(), "is not policy version 1 of run rollout (it is version 0)"),
              "%s", arl_error_msg());
    arl_error_clear();
    arl_rollout_fork_opts v0 = {.version = 0};
    CHECK(arl_rollout_fork(&c, other, st, parent, 1, 1, &v0, u, &fs) == ARL_ERR_STATE);
    CHECK_MSG(strstr(arl_error_msg(), "its weights are no version the run recorded"), "%s",
              arl_error_msg());
    arl_error_clear();
    CHECK_EQ_INT(count_files(shards), n_files);
    /* other weights: a run of their own, the prefix prefilled again */
    H_DIE(arl_rollout_fork(&c, other, st, parent, 1, 1, NULL, u, &fs), "fork (other weights)");
    CHECK_EQ_INT(fs.trajectories, 1);
    CHECK_EQ_INT(fs.forked_from_state, 0);
    /* ... or from the parent's state when asked */
    arl_rollout_fork_opts any = {.version = -1, .use_rollout_state = 1};
    H_DIE(arl_rollout_fork(&c, other, st, parent, 1, 1, &any, u + 1, &fs), "fork (any state)");
    CHECK_EQ_INT(fs.forked_from_state, 1);
    /* the parent's weights, version 0 asserted: its run, from its state */
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, 1, 1, &v0, u + 2, &fs), "fork (version 0)");
    CHECK_EQ_INT(fs.forked_from_state, 1);
    replay_store_close(st);
    st = h_store(db);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_traj_row r[3];
    for (int i = 0; i < 3; i++)
        H_DIE(replay_traj_get(st, u[i], &r[i]), u[i]);
    replay_run_info run = {0};
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", (long long)r[0].run_id);
    H_DIE(replay_run_get(st, rid, &run), "fork run");
    CHECK(r[0].run_id != pr.run_id && r[1].run_id == r[0].run_id && r[2].run_id == pr.run_id);
    CHECK_MSG(!strncmp(run.run_uid, "rollout/fork-", 13) && strlen(run.run_uid) == 25, "%s",
              run.run_uid);
    for (int i = 0; i < 3; i++)
        CHECK(r[i].min_version == 0 && r[i].max_version == 0);
    /* replay stats counts each run's versions apart: the parent's run's version 0 (the parent,
     * its fork) and the fork run's (two forks) apart, not one version 0 of every segment */
    {
        char *txt = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&txt, &len);
        replay_filter f;
        replay_filter_init(&f);
        H_DIE(replay_stats(st, &f, 0, mf), "stats");
        fclose(mf);
        char want[200];
        snprintf(want, sizeof want, "segments by min policy version: rollout: v0 %d; %s: v0 %d",
                 (int)pr.n_segments + (int)r[2].n_segments, run.run_uid,
                 (int)r[0].n_segments + (int)r[1].n_segments);
        CHECK_MSG(strstr(txt, want) != NULL, "want '%s' in:\n%s", want, txt);
        free(txt);
        mf = open_memstream(&txt, &len); /* the same as JSON: {run: {version: segments}} */
        H_DIE(replay_stats(st, &f, 1, mf), "stats --json");
        fclose(mf);
        snprintf(want, sizeof want,
                 "\"segments_by_min_version\":{\"rollout\":{\"0\":%d},\"%s\":{\"0\":%d}}",
                 (int)pr.n_segments + (int)r[2].n_segments, run.run_uid,
                 (int)r[0].n_segments + (int)r[1].n_segments);
        CHECK_MSG(strstr(txt, want) != NULL, "want '%s' in:\n%s", want, txt);
        free(txt);
    }
    replay_run_info_free(&run);
    /* the fork run's version 0 is the other checkpoint (the path realpath gives) */
    replay_version_row vr;
    H_DIE(replay_version_get(st, r[0].run_id, -1, &vr), "fork run version");
    CHECK(vr.version == 0 && strstr(vr.checkpoint_uri, "/other") &&
          strlen(vr.weights_sha256) == 64);
    /* re-scoring under the other weights: the fork's run's version 0, but the prefix's state was
     * computed by the parent's run's version 0 (other weights): not a start (spec/replay.md 9.1
     * learner/tool states "at that version"), the prefix recomputed; under the parent's weights
     * the fork of the parent's run starts from it */
    arl_rollout_rescore_opts ro = {.ckpt_dir = other, .version = ARL_ROLLOUT_RESCORE_VERSION_AUTO};
    arl_rollout_rescore_stats rs;
    H_DIE(arl_rollout_rescore(st, u[0], &ro, &rs, NULL, NULL, NULL), "rescore (other weights)");
    CHECK(rs.version == 0 && rs.segments >= 2 && rs.from_state == 0);
    ro.ckpt_dir = ckpt;
    H_DIE(arl_rollout_rescore(st, u[2], &ro, &rs, NULL, NULL, NULL), "rescore (the run's weights)");
    CHECK(rs.version == 0 && rs.from_state >= 1);
    H_DIE(replay_version_get(st, pr.run_id, -1, &vr), "parent run version");
    CHECK(vr.version == 0 && strstr(vr.checkpoint_uri, "/ckpt"));
    CHECK(replay_version_get(st, pr.run_id, 3, &vr) == ARL_ERR_NOT_FOUND);
    arl_error_clear();
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

static void test_fork_images(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-shapes", tmp);
    arl_rollout_config c;
    h_config(&c, "builtin:shapes");
    c.tasks = 1;
    c.group_size = 1;
    h_set(&c, "state-cache", "off"); /* the fork recomputes its prefix from the store */
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    arl_rollout_worker_close(w);
    const char *parent = "rollout/g000000/r0";
    replay_traj_row pr;
    H_DIE(replay_traj_get(st, parent, &pr), "parent");
    replay_seg_ref *refs;
    size_t nref;
    H_DIE(replay_traj_segments(st, pr.traj_id, &refs, &nref), "segments");
    int32_t at = -1; /* the first token_budget boundary */
    for (size_t i = 0; i + 1 < nref && at < 0; i++)
        if (!strcmp(refs[i].end_cause, "token_budget")) at = (int32_t)i;
    free(refs);
    CHECK_MSG(at >= 0, "%s has no token_budget boundary to fork at", parent);
    if (at < 0) return;
    char uids[2][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    c.seed = 99;
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, at + 1, 2, NULL, uids, &fs), "fork");
    arl_rollout_stats_print(&fs, stderr);
    CHECK_EQ_INT(fs.trajectories, 2);
    CHECK_EQ_INT(fs.masked, 0); /* before: RESUME_IMPOSSIBLE, the prefix images not found */
    replay_store_close(st);
    st = h_store(db);
    CHECK_EQ_INT(h_verify(st), 0);
    for (int i = 0; i < 2; i++) {
        arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = -1};
        arl_rollout_rescore_stats rs;
        H_DIE(arl_rollout_rescore(st, uids[i], &o, &rs, NULL, NULL, NULL), "rescore fork");
        fprintf(stderr,
                "  rescore %s from the store alone: %lld segments, %lld skipped, %lld image "
                "placeholders rebuilt, %lld action tokens, max |diff| %.3g\n",
                uids[i], (long long)rs.segments, (long long)rs.skipped, (long long)rs.images,
                (long long)rs.action_tokens, rs.max_abs);
        CHECK(rs.images > 0);
        CHECK_EQ_INT(rs.skipped, 0);
        CHECK(rs.segments >= at + 2); /* the prefix and the fork's own segments */
        CHECK(rs.action_tokens > 0);
        CHECK_MSG(rs.max_abs < 1e-3, "%s: max |l - l_mu| = %g", uids[i], rs.max_abs);
    }
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* Two stores db-<name>-0 and -1 holding the same parent without cached states, and the
 * configurations to fork it with (seed 99). */
static const char *twin_parents(const char *name, char db[2][700], arl_rollout_config c[2],
                                replay_store *st[2], replay_traj_row pr[2]) {
    const char *parent = NULL;
    for (int k = 0; k < 2; k++) {
        snprintf(db[k], 700, "%s/db-%s-%d", tmp, name, k);
        parent = parent_run_cached(db[k], &c[k], &st[k], &pr[k], "off");
        c[k].seed = 99;
    }
    return parent;
}

/* Siblings (rollout/resume.c): with no cached state the forks of one point take the prefix
 * the first of them recomputed instead of each prefilling it again.  Three forks in one call
 * are the same bits (tokens, behaviour log-probabilities, versions) as the same three forks
 * made one call at a time (the same uids, so the same streams), and prefill the prefix once
 * instead of three times.  One fork decodes at a time in both, so that the siblings' later
 * restores (after the first finished) are covered too. */
static void test_fork_siblings(void) {
    char db[2][700];
    arl_rollout_config c[2];
    replay_store *st[2];
    replay_traj_row pr[2];
    const char *parent = twin_parents("siblings", db, c, st, pr);
    for (int k = 0; k < 2; k++)
        c[k].batch_size = 1; /* decode rows alike in both (a batch's GEMM rounds otherwise) */
    replay_seg_ref *refs;
    size_t nref;
    H_DIE(replay_traj_segments(st[0], pr[0].traj_id, &refs, &nref), "segments");
    CHECK_STR_EQ(refs[0].end_cause, "token_budget");
    const int64_t prefix = refs[0].n_tokens; /* segment 0 starts fresh */
    free(refs);
    char together[3][REPLAY_UID_MAX + 1], alone[3][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs, f1;
    H_DIE(arl_rollout_fork(&c[0], ckpt, st[0], parent, 1, 3, NULL, together, &fs), "fork 3");
    CHECK_EQ_INT(fs.trajectories, 3);
    CHECK_EQ_INT(fs.masked, 0);
    CHECK_EQ_INT(fs.forked_from_state, 0); /* nothing cached: the prefix was recomputed */
    int64_t prefill_alone = 0;
    for (int i = 0; i < 3; i++) {
        H_DIE(arl_rollout_fork(&c[1], ckpt, st[1], parent, 1, 1, NULL, alone + i, &f1), "fork 1");
        CHECK_EQ_INT(f1.masked, 0);
        prefill_alone += f1.prefill_tokens;
        CHECK_STR_EQ(alone[i], together[i]);
    }
    fprintf(stderr,
            "  prefill: %lld tokens for three forks together, %lld one at a time (prefix %lld)\n",
            (long long)fs.prefill_tokens, (long long)prefill_alone, (long long)prefix);
    CHECK_EQ_INT(fs.prefill_tokens, prefill_alone - 2 * prefix);
    for (int k = 0; k < 2; k++) {
        replay_store_close(st[k]);
        st[k] = h_store(db[k]); /* pick up the tool files */
        CHECK_EQ_INT(h_verify(st[k]), 0);
    }
    for (int i = 0; i < 3; i++) {
        replay_traj_row r[2];
        replay_seg_data d[2];
        memset(d, 0, sizeof d);
        for (int k = 0; k < 2; k++)
            H_DIE(replay_traj_get(st[k], together[i], &r[k]), together[i]);
        CHECK_EQ_INT(r[0].n_segments, r[1].n_segments);
        CHECK(r[0].n_segments >= 1);
        for (int32_t g = 1; g <= r[0].n_segments && g <= r[1].n_segments; g++) {
            for (int k = 0; k < 2; k++)
                H_DIE(replay_segment_load(st[k], r[k].traj_id, g, REPLAY_LOAD_TOKENS, &d[k]),
                      "load");
            const size_t T = (size_t)d[0].ref.n_tokens;
            CHECK_EQ_INT(d[0].ref.n_tokens, d[1].ref.n_tokens);
            if (d[0].ref.n_tokens != d[1].ref.n_tokens) break;
            CHECK(!memcmp(d[0].tokens, d[1].tokens, T * sizeof *d[0].tokens));
            CHECK(!memcmp(d[0].logprobs, d[1].logprobs, T * sizeof *d[0].logprobs));
            CHECK(!memcmp(d[0].versions, d[1].versions, T * sizeof *d[0].versions));
        }
        for (int k = 0; k < 2; k++)
            replay_seg_data_free(&d[k]);
    }
    for (int k = 0; k < 2; k++) {
        replay_store_close(st[k]);
        arl_rollout_config_free(&c[k]);
    }
}

/* Tool states (spec/replay.md 13.7 step 1): a parent without rollout states whose prefix a
 * `replay rescore --save-states --routing natural` pass saved under the forks' weights starts
 * its forks from those states (no prefix prefill; the forks re-score to their behaviour
 * log-probabilities); a pass with the stored routes (another computation) is not used. */
static void test_fork_tool_states(void) {
    char db[2][700];
    arl_rollout_config c[2];
    replay_store *st[2];
    replay_traj_row pr[2];
    const char *parent = twin_parents("tool", db, c, st, pr);
    for (int k = 0; k < 2; k++) {
        /* store 0: a natural-routing pass saves its states; store 1: a stored-routes pass */
        replay_writer *tw = NULL;
        H_DIE(replay_writer_open(st[k], REPLAY_FILE_TOOL, 0, NULL, &tw), "tool writer");
        arl_rollout_rescore_opts o = {
            .ckpt_dir = ckpt, .version = -1, .save_states = tw, .natural_routing = k == 0};
        arl_rollout_rescore_stats rs;
        /* (the CLI also writes the pass's rescores rows, which reference its states; without
         * them `verify` lists the states as orphans, a warning) */
        H_DIE(arl_rollout_rescore(st[k], parent, &o, &rs, NULL, NULL, NULL), "rescore");
        CHECK(rs.states_saved > 0);
        replay_writer_close(tw);
        replay_store_close(st[k]);
        st[k] = h_store(db[k]);
    }
    replay_seg_ref *refs;
    size_t nref;
    H_DIE(replay_traj_segments(st[0], pr[0].traj_id, &refs, &nref), "segments");
    const int64_t prefix = refs[0].n_tokens;
    free(refs);
    char uids[2][2][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs[2];
    for (int k = 0; k < 2; k++) {
        H_DIE(arl_rollout_fork(&c[k], ckpt, st[k], parent, 1, 2, NULL, uids[k], &fs[k]), "fork");
        CHECK_EQ_INT(fs[k].trajectories, 2);
        CHECK_EQ_INT(fs[k].masked, 0);
    }
    fprintf(stderr, "  prefill: %lld tokens from the tool states, %lld without (prefix %lld)\n",
            (long long)fs[0].prefill_tokens, (long long)fs[1].prefill_tokens, (long long)prefix);
    CHECK_EQ_INT(fs[0].forked_from_state, 2);
    CHECK_EQ_INT(fs[1].forked_from_state, 0); /* recomputed once, shared by the sibling */
    CHECK_EQ_INT(fs[0].prefill_tokens, fs[1].prefill_tokens - prefix);
    replay_store_close(st[0]);
    st[0] = h_store(db[0]);
    CHECK_EQ_INT(h_verify(st[0]), 0);
    for (int i = 0; i < 2; i++) {
        /* from scratch: the state the fork started from was its prefix's */
        arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = -1};
        arl_rollout_rescore_stats rs;
        H_DIE(arl_rollout_rescore(st[0], uids[0][i], &o, &rs, NULL, NULL, NULL), "rescore fork");
        CHECK(rs.action_tokens > 0);
        CHECK_MSG(rs.max_abs < 1e-3, "%s: max |l - l_mu| = %g", uids[0][i], rs.max_abs);
    }
    for (int k = 0; k < 2; k++) {
        replay_store_close(st[k]);
        arl_rollout_config_free(&c[k]);
    }
}

/* A fork that cannot start is a masked trajectory in the fork's summary (it was counted as an
 * interrupted trajectory of the run, so `masked` stayed 0): the parent's stored response to step 1
 * no longer matches what the environment answers on replay, so both forks are masked
 * RESUME_DIVERGED, and the stats say 2 trajectories, 2 masked. */
static void test_fork_masked(void) {
    char db[700];
    arl_rollout_config c;
    replay_store *st;
    replay_traj_row pr;
    snprintf(db, sizeof db, "%s/db-masked", tmp);
    const char *parent = parent_run_cached(db, &c, &st, &pr, "off");
    replay_store_close(st);
    char shard[800];
    snprintf(shard, sizeof shard, "%s/shards/w1.sqlite", db);
    sqlite3 *d = NULL;
    CHECK(sqlite3_open(shard, &d) == SQLITE_OK);
    CHECK(sqlite3_exec(d, "UPDATE env_calls SET response_sha256 = zeroblob(32) WHERE call_seq = 1",
                       NULL, NULL, NULL) == SQLITE_OK);
    CHECK(sqlite3_changes(d) == 1);
    sqlite3_close(d);
    st = h_store(db);
    char uids[2][REPLAY_UID_MAX + 1];
    arl_rollout_stats fs;
    H_DIE(arl_rollout_fork(&c, ckpt, st, parent, 1, 2, NULL, uids, &fs), "fork");
    arl_rollout_stats_print(&fs, stderr);
    CHECK_EQ_INT(fs.trajectories, 2);
    CHECK_EQ_INT(fs.masked, 2);
    CHECK_EQ_INT(fs.interrupted_masked, 0);
    for (int i = 0; i < 2; i++) {
        replay_traj_row r;
        H_DIE(replay_traj_get(st, uids[i], &r), uids[i]);
        CHECK_EQ_INT(r.status, REPLAY_MASKED);
        CHECK_MSG(!strncmp(r.error_code, "RESUME_", 7), "%s: %s", uids[i], r.error_code);
    }
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-fork"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_fork);
    TEST_RUN(test_fork_group_uid);
    TEST_RUN(test_fork_versions);
    TEST_RUN(test_fork_images);
    TEST_RUN(test_fork_siblings);
    TEST_RUN(test_fork_tool_states);
    TEST_RUN(test_fork_masked);
    return test_finish();
}
