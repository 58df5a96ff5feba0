/* tests/rollout/test_weights.c: a worker picks up a new policy version between turns without
 * losing its in-flight trajectories (spec/objective.md 3.5, 9): version 1 is published through
 * policy-dir/LATEST while trajectories run; every trajectory finishes, every turn's tokens carry
 * one version (context tokens the version that prefilled them), some trajectory spans both
 * versions, the catalog records both, and the store verifies. */
#include <sys/stat.h>
#include <unistd.h>

#include "rollout/engine.h"
#include "tests/rollout/helpers.h"

static char ckpt0[600], ckpt1[600], pdir[600], tmp[512];

static int publish_after_first(void *user, const char *uid, int32_t seg, int final) {
    (void)user;
    (void)uid;
    (void)seg;
    (void)final;
    static int done = 0;
    if (done) return 0;
    done = 1;
    char p[700];
    snprintf(p, sizeof p, "%s/LATEST.tmp", pdir);
    FILE *f = fopen(p, "w");
    fprintf(f, "1 v1\n");
    fclose(f);
    char q[700];
    snprintf(q, sizeof q, "%s/LATEST", pdir);
    rename(p, q);
    return 0;
}

static void test_weight_update(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 2;
    c.group_size = 2;
    c.max_turns = 6;
    c.policy_poll_ms = 1;
    h_set(&c, "policy-dir", pdir);
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    arl_rollout_hooks hk = {.on_commit = publish_after_first};
    H_DIE(arl_rollout_worker_open(&c, ckpt0, st, 0, &hk, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->versions_loaded, 1);
    CHECK_EQ_INT(s->trajectories, 4);
    CHECK_EQ_INT(s->masked, 0);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    int spans = 0, v1_tokens = 0;
    for (int i = 0; i < 4; i++) {
        char uid[64];
        snprintf(uid, sizeof uid, "rollout/g%06d/r%d", i / 2, i % 2);
        replay_traj_row r;
        H_DIE(replay_traj_get(st, uid, &r), uid);
        spans += r.min_version == 0 && r.max_version == 1;
        replay_seg_data d;
        memset(&d, 0, sizeof d);
        for (int32_t sg = 0; sg < r.n_segments; sg++) {
            H_DIE(replay_segment_load(st, r.traj_id, sg, REPLAY_LOAD_TOKENS, &d), "load");
            /* the action tokens of one turn (a run of mask 1) share one version */
            for (int64_t t = 1; t < d.ref.n_tokens; t++)
                if (d.loss_mask[t] && d.loss_mask[t - 1])
                    CHECK_MSG(d.versions[t] == d.versions[t - 1], "%s seg %d token %lld: version %u "
                              "inside a turn sampled at %u", uid, sg, (long long)t, d.versions[t],
                              d.versions[t - 1]);
            for (int64_t t = 0; t < d.ref.n_tokens; t++) v1_tokens += d.versions[t] == 1;
        }
        replay_seg_data_free(&d);
    }
    CHECK(spans >= 1); /* in-flight trajectories continued under the new version */
    CHECK(v1_tokens > 0);
    /* each version is recorded with its own weights' hash (the worker keeps each loaded
     * buffer's hash: version 1, loaded into the buffer version 0 did not use, is hashed anew) */
    replay_traj_row r;
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "traj");
    for (int v = 0; v < 2; v++) {
        char want[65];
        h_weights_sha(v ? ckpt1 : ckpt0, want);
        replay_version_row vr;
        H_DIE(replay_version_get(st, r.run_id, v, &vr), "version");
        CHECK_MSG(!strcmp(vr.weights_sha256, want),
                  "version %d recorded weights %.12s, its "
                  "checkpoint's are %.12s",
                  v, vr.weights_sha256, want);
    }
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* The engine keeps each parameter buffer's weights hash once computed (a full-scale arena takes
 * an hour to hash) and computes it again for a buffer a new version is loaded into: versions
 * 0, 1, 2 through the two buffers (2 goes where 0 was) each hash as their checkpoint. */
static void test_engine_weights_sha(void) {
    char ckpt2[700], want[65], got[65];
    snprintf(ckpt2, sizeof ckpt2, "%s/v2", tmp);
    h_make_ckpt(ckpt2, NULL, 5);
    const char *ck[3] = {ckpt0, ckpt1, ckpt2};
    ro_engine_opts o = {.n_slots = 1, .max_tokens = 8, .max_context = 64, .device_index = -1};
    ro_engine e;
    H_DIE(ro_engine_open(&e, ckpt0, 0, &o), "engine");
    for (int v = 0; v < 3; v++) {
        if (v) {
            H_DIE(ro_engine_load_next(&e, ck[v], v), "load next");
            H_DIE(ro_engine_swap(&e), "swap");
        }
        for (int twice = 0; twice < 2; twice++) { /* (the second from the kept hash) */
            ro_engine_weights_sha256(&e, e.cur, got);
            h_weights_sha(ck[v], want);
            CHECK_MSG(!strcmp(got, want), "version %d: %.12s, its checkpoint's %.12s", v, got,
                      want);
        }
    }
    ro_engine_close(&e);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-weights"));
    snprintf(ckpt0, sizeof ckpt0, "%s/ckpt", tmp);
    snprintf(pdir, sizeof pdir, "%s/published", tmp);
    snprintf(ckpt1, sizeof ckpt1, "%s/v1", pdir);
    h_make_ckpt(ckpt0, NULL, 3);
    mkdir(pdir, 0755);
    h_make_ckpt(ckpt1, NULL, 4);
    TEST_RUN(test_weight_update);
    TEST_RUN(test_engine_weights_sha);
    return test_finish();
}
