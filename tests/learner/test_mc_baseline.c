/* tests/learner/test_mc_baseline.c: Monte-Carlo segment baselines (spec/objective.md 5.3,
 * learner.segment-baseline mc) end to end on calculator trajectories with continue segments:
 *   (a) arl_mc_forks_make (experiments/mc_forks.h) makes `count` forks at every inner segment
 *       boundary of every finished train trajectory, tops up a boundary that has fewer, adds
 *       nothing when called again, and, while a fork a kill left running is in the store,
 *       forks nothing and says so (masked, it counts as made); the points go to one fork worker
 * (arl_rollout_fork_many), which refuses a point given twice before writing anything; (b) the
 * learner's baseline of segment s of trajectory i is the mean, over i's finished forks at the start
 * of s, of their discounted segment returns (gamma_S = 0.9) from s on, computed here from the
 * forks' stored reward rows found by their uids (independently of the catalog query the learner
 * uses), after those rows were given distinct non-zero values; segment 0 has none (NaN); (c) the
 * update uses them (adv/segment_mc_baseline_frac = the share of segments with forks), and with
 * segment-baseline loo the learner reads no forks (the share is 0). Fails without the learner's
 * fork lookup (b: every baseline NaN) or the driver's top-up (a). */
#include <math.h>
#include <sqlite3.h>

#include "experiments/mc_forks.h"
#include "learner/update_internal.h"
#include "replay/inspect.h"
#include "tests/learner/lhelpers.h"

static char tmp[512], ckpt[600], db[700];
static char stale_parent[REPLAY_UID_MAX + 1]; /* the trajectory given a stale fork */
static int64_t gids[16], ng;

/* Members of the fork groups at the end of segment seg of parent, by status. */
static void fork_counts(const char *parent, int32_t seg, int *done, int *running) {
    replay_store *st;
    replay_open_opts o = {.flags = REPLAY_OPEN_READONLY};
    L_DIE(replay_store_open(db, &o, &st), "store");
    replay_fork_member *m;
    size_t n;
    L_DIE(replay_forks_at(st, parent, seg, &m, &n), "forks");
    *done = *running = 0;
    for (size_t i = 0; i < n; i++)
        *(m[i].status == REPLAY_RUNNING ? running : done) += 1;
    free(m);
    replay_store_close(st);
}

/* A fork of parent at segment 1 begun in a tool file whose writer then goes away, as a killed
 * driver leaves it. */
static void stale_fork(const char *parent) {
    replay_store *st;
    replay_open_opts o = {0};
    L_DIE(replay_store_open(db, &o, &st), "store");
    replay_traj_row p;
    L_DIE(replay_traj_get(st, parent, &p), "parent");
    replay_writer *w;
    L_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, "lt", &w), "writer");
    char guid[REPLAY_UID_MAX + 1], uid[REPLAY_UID_MAX + 1];
    snprintf(guid, sizeof guid, "%s/fork1", parent);
    snprintf(uid, sizeof uid, "%s/f1.0", parent);
    replay_group_desc gd = {.group_uid = guid,
                            .run_id = p.run_id,
                            .task_id = p.task_id,
                            .env_id = p.env_id,
                            .kind = "fork",
                            .size = 1,
                            .admitted_version = 0,
                            .parent_traj_uid = p.traj_uid,
                            .parent_seg_index = 0};
    int64_t gid, id;
    L_DIE(replay_group_ensure(st, &gd, &gid), "group");
    replay_traj_desc d = {.traj_uid = uid,
                          .run_id = p.run_id,
                          .group_id = gid,
                          .task_id = p.task_id,
                          .env_id = p.env_id,
                          .slot = 0,
                          .policy_version = 0};
    L_DIE(replay_fork_begin(w, p.traj_uid, 1, &d, &id, NULL), "fork begin");
    replay_writer_close(w);
    replay_store_close(st);
}

/* The finished train trajectories' uids (lt/g<k>/r<i>) and their segment counts. */
static int train_trajs(char (*uids)[REPLAY_UID_MAX + 1], int32_t *nseg, int cap) {
    replay_store *st;
    replay_open_opts o = {.flags = REPLAY_OPEN_READONLY};
    L_DIE(replay_store_open(db, &o, &st), "store");
    int n = 0;
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 2 && n < cap; i++) {
            replay_traj_row t;
            snprintf(uids[n], REPLAY_UID_MAX + 1, "lt/g%06d/r%d", g, i);
            L_DIE(replay_traj_get(st, uids[n], &t), "traj");
            if (t.status == REPLAY_COMPLETE || t.status == REPLAY_TRUNCATED)
                nseg[n++] = t.n_segments;
        }
    replay_store_close(st);
    return n;
}

/* Tool files of the store (shards/t<k>.sqlite). */
static int count_tool_files(void) {
    int n = 0;
    for (int k = 1; k < 256; k++) {
        char p[900];
        snprintf(p, sizeof p, "%s/shards/t%d.sqlite", db, k);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            n++;
        }
    }
    return n;
}

static void test_forks_made(void) {
    char uids[8][REPLAY_UID_MAX + 1];
    int32_t nseg[8];
    const int n = train_trajs(uids, nseg, 8);
    int inner = 0;
    for (int i = 0; i < n; i++)
        inner += nseg[i] - 1;
    CHECK(inner >= 2); /* the configuration makes continue segments */
    int p = 0;
    while (p + 1 < n && nseg[p] < 2)
        p++;
    CHECK(nseg[p] >= 2);
    snprintf(stale_parent, sizeof stale_parent, "%s", uids[p]);
    stale_fork(stale_parent);
    int done, running;
    fork_counts(stale_parent, 0, &done, &running);
    CHECK(done == 0 && running == 1);

    arl_rollout_config c;
    lh_rollout_cfg(&c, 2, 2, 3, 0, 0);
    /* a fork left running: nothing is forked, the caller is told */
    int interrupted = 0;
    const int files0 = count_tool_files();
    L_DIE(arl_mc_forks_make(&c, db, "lt", ckpt, 0, 2, &interrupted), "forks (interrupted)");
    CHECK(interrupted == 1);
    CHECK(count_tool_files() == files0);
    {
        replay_store *st;
        replay_open_opts o = {0};
        L_DIE(replay_store_open(db, &o, &st), "store");
        FILE *devnull = fopen("/dev/null", "w");
        int64_t found = 0;
        L_DIE(replay_recover(st, 1, devnull, &found), "recover");
        fclose(devnull);
        CHECK(found == 1);
        replay_store_close(st);
    }
    L_DIE(arl_mc_forks_make(&c, db, "lt", ckpt, 0, 2, &interrupted), "forks (2)");
    CHECK(interrupted == 0);
    fork_counts(stale_parent, 0, &done, &running);
    CHECK(running == 0);
    CHECK(done == 2); /* the masked stale one and one new */
    for (int i = 0; i < n; i++)
        for (int32_t s = 1; s < nseg[i]; s++) {
            fork_counts(uids[i], s - 1, &done, &running);
            CHECK(done == 2 && running == 0);
        }
    /* several points in one worker: a point given twice is refused before anything is written */
    {
        replay_store *st;
        replay_open_opts o = {0};
        L_DIE(replay_store_open(db, &o, &st), "store");
        const arl_rollout_fork_point two[2] = {{stale_parent, 1, 1}, {stale_parent, 1, 2}};
        char u[3][REPLAY_UID_MAX + 1];
        const int before = count_tool_files();
        CHECK(arl_rollout_fork_many(&c, ckpt, st, two, 2, NULL, u, NULL) == ARL_ERR_ARG);
        CHECK(strstr(arl_error_msg(), "given twice") != NULL);
        CHECK(count_tool_files() == before);
        replay_store_close(st);
    }
    L_DIE(arl_mc_forks_make(&c, db, "lt", ckpt, 0, 3, &interrupted), "forks (3)");
    L_DIE(arl_mc_forks_make(&c, db, "lt", ckpt, 0, 3, &interrupted), "forks (3 again)");
    for (int i = 0; i < n; i++)
        for (int32_t s = 1; s < nseg[i]; s++) {
            fork_counts(uids[i], s - 1, &done, &running);
            CHECK(done == 3 && running == 0);
        }
    arl_rollout_config_free(&c);
}

/* Give every fork's derived segment rewards distinct non-zero values (the untrained model earns
 * none), in each tool file. */
static void set_fork_rewards(void) {
    char dir[800];
    snprintf(dir, sizeof dir, "%s/shards", db);
    for (int k = 1; k < 256; k++) {
        char p[900];
        snprintf(p, sizeof p, "%s/t%d.sqlite", dir, k);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        fclose(f);
        sqlite3 *h;
        CHECK(sqlite3_open(p, &h) == SQLITE_OK);
        char *err = NULL;
        CHECK(sqlite3_exec(h,
                           "UPDATE rewards SET value = 0.05 + ((traj_id * 7 + scope_index * 3) % "
                           "11) / 10.0 WHERE level = 'segment' AND component = '@derived'",
                           NULL, NULL, &err) == SQLITE_OK);
        if (err) fprintf(stderr, "%s\n", err);
        sqlite3_free(err);
        sqlite3_close(h);
    }
}

/* Expected baseline of segment s of parent: the mean over its finished forks <parent>/f<s>.<i>
 * of parent's run of sum_k 0.9^k q_{s+k} from their stored rows; *n the forks; forks of
 * another run counted in *other_runs. */
static double expected(replay_store *st, const char *parent, int32_t s, int *n, int *other_runs) {
    double sum = 0;
    *n = 0;
    for (int i = 0;; i++) {
        char u[REPLAY_UID_MAX + 1];
        snprintf(u, sizeof u, "%s/f%d.%d", parent, (int)s, i);
        replay_traj_row t;
        arl_status r = replay_traj_get(st, u, &t);
        if (r == ARL_ERR_NOT_FOUND) {
            arl_error_clear();
            break;
        }
        L_DIE(r, "fork");
        replay_traj_row pr;
        L_DIE(replay_traj_get(st, parent, &pr), "parent");
        if (t.status != REPLAY_COMPLETE && t.status != REPLAY_TRUNCATED) continue;
        if (t.run_id != pr.run_id) { /* other weights: a run of its own, not this policy's */
            (*other_runs)++;
            continue;
        }
        replay_reward_row *rows;
        size_t nr;
        L_DIE(replay_rewards_load(st, t.traj_id, NULL, &rows, &nr), "rewards");
        double g = 0, w = 1;
        int seen = 0;
        for (int32_t k = s; k < s + t.n_segments; k++)
            for (size_t j = 0; j < nr; j++)
                if (!strcmp(rows[j].level, "segment") && rows[j].scope_index == k &&
                    !strcmp(rows[j].component, "@derived") && !strcmp(rows[j].source, "env")) {
                    g += w * rows[j].value;
                    seen++;
                }
        for (int32_t k = s; k < s + t.n_segments; k++)
            w *= 0.9;
        replay_reward_rows_free(rows);
        CHECK(seen == t.n_segments);
        sum += g;
        (*n)++;
    }
    return *n ? sum / *n : NAN;
}

typedef struct mc_rec {
    int checked, with_forks, segs, other_runs;
} mc_rec;

static void check_hook(void *ctx, arl_learner *l) {
    mc_rec *r = ctx;
    const arl_update_batch *b = arl_learner_batch(l);
    replay_store *st;
    replay_open_opts o = {.flags = REPLAY_OPEN_READONLY};
    L_DIE(replay_store_open(db, &o, &st), "store");
    for (int32_t i = 0; i < b->n_trajs; i++) {
        const arl_upd_traj *t = &b->trajs[i];
        if (!t->valid || !t->local) continue;
        CHECK(t->seg_mc != NULL && t->seg_mc_n != NULL);
        if (!t->seg_mc) continue;
        for (int32_t j = 0; j < t->n_segs; j++) {
            const int32_t s = b->segs[t->seg0 + j].seg_index;
            r->segs++;
            if (s == 0) {
                CHECK(isnan(t->seg_mc[j]) && t->seg_mc_n[j] == 0);
                continue;
            }
            int n;
            const double e = expected(st, t->row.traj_uid, s, &n, &r->other_runs);
            /* 3 each, less those masked (the stale fork at segment 1 of stale_parent, which
             * counts as made, and any the environment refused) */
            if (n != 3)
                fprintf(stderr, "%s segment %d: %d finished forks\n", t->row.traj_uid, (int)s, n);
            CHECK(n >= 1 && n <= (s == 1 && !strcmp(t->row.traj_uid, stale_parent) ? 2 : 3));
            CHECK(t->seg_mc_n[j] == n);
            CHECK(fabs(t->seg_mc[j] - e) <= 1e-12 * fmax(1.0, fabs(e)));
            CHECK(e > 0.04); /* non-trivial values */
            r->with_forks++;
            r->checked++;
        }
    }
    replay_store_close(st);
}

static void run_update(int mc, mc_rec *rec, double *frac) {
    lh_learner h;
    lh_learner_open(&h, ckpt, NULL, 2, 4, NULL);
    h.rc.segment_baseline = mc ? ARL_REWARD_SB_MC : ARL_REWARD_SB_LOO;
    h.rc.gamma_segment = 0.9;
    if (mc) arl_learner_set_hook(h.l, check_hook, rec);
    replay_store *st;
    replay_open_opts o = {0};
    L_DIE(replay_store_open(db, &o, &st), "store");
    arl_update_source src = {.store = st, .root = db, .group_ids = gids, .n_groups = ng};
    arl_update_result res;
    L_DIE(arl_learner_update(h.l, 0, &src, 1, &res), "update");
    *frac = lh_metric(res.metrics_json, "adv/segment_mc_baseline_frac");
    free(res.metrics_json);
    replay_store_close(st);
    lh_learner_close(&h);
}

static void test_learner_baselines(void) {
    /* a fork under other weights (a run of its own) at stale_parent's segment 1: not a
     * continuation of this policy, so no part of its baseline */
    {
        char other[700];
        snprintf(other, sizeof other, "%s/other", tmp);
        lh_make_ckpt(other, 8);
        arl_rollout_config c;
        lh_rollout_cfg(&c, 2, 2, 3, 0, 0);
        replay_store *st;
        replay_open_opts o = {0};
        L_DIE(replay_store_open(db, &o, &st), "store");
        char u[1][REPLAY_UID_MAX + 1];
        L_DIE(arl_rollout_fork(&c, other, st, stale_parent, 1, 1, NULL, u, NULL), "other fork");
        replay_store_close(st);
        arl_rollout_config_free(&c);
    }
    set_fork_rewards();
    ng = lh_plan(db, 0, 16, gids);
    CHECK(ng == 2);
    mc_rec rec = {0};
    double frac_mc, frac_loo;
    run_update(1, &rec, &frac_mc);
    CHECK(rec.checked >= 2);
    CHECK(rec.other_runs == 1);
    CHECK(rec.segs > 0 && fabs(frac_mc - (double)rec.with_forks / rec.segs) < 1e-12);
    /* the planned update 0 is re-planned the same for the loo run (not committed) */
    run_update(0, &rec, &frac_loo);
    CHECK(frac_loo == 0.0);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-mc-baseline"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    lh_make_ckpt(ckpt, 7);
    lh_rollout(db, ckpt, 2, 2, 3);
    TEST_RUN(test_forks_made);
    TEST_RUN(test_learner_baselines);
    return test_finish();
}
