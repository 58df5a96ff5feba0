/* tests/rollout/test_rescore_rewards.c: `replay rescore --rewards` (spec/replay.md 13.6, last
 * item; rollout/rescore_rewards.h arl_rollout_rescore_rewards, replay/replay.h
 * replay_rescore_rewards_put / replay_rewards_load).
 *
 * A store from a real rollout of the tiny model on the calculator built-in (deterministic_replay,
 * process rewards with components, segment scores, outcome), then:
 * - zero drift: every trajectory replayed against the same environment reproduces every stored
 *   rewards row exactly (values compared with ==: the same bytes parse to the same doubles),
 *   every response byte-identical; the rows land in a tool file with source 'rescore:<label>'
 *   (one per stored row), are found by replay_rewards_load, and verify still passes (the rows
 *   refer to a trajectory of another file); a second pass with the same label replaces them;
 * - drift: "calculator_shift" (registered here) answers like the calculator with every process
 *   reward + 0.125 and every segment and episode score + 0.25 (exact in binary): exactly the ''
 *   and '@derived' rows differ, by exactly those constants, components do not; every response is
 *   reported as differing from the stored bytes, the replay is not a divergence;
 * - divergence: "calculator_obs" changes the observation of step 1: ARL_ERR_ENV naming step 1,
 *   nothing written;
 * - refusal: "calculator_nodet" (no deterministic_replay) gives ARL_ERR_UNSUPPORTED naming the
 *   environment and the capability, nothing written; an unreachable URL fails with a message
 *   naming it, nothing written;
 * - a masked trajectory (complete, then masked by an operator) is replayed with what was stored
 *   and reported partial.
 */
#include <math.h>

#include "envs/builtin/builtin.h"
#include "envs/env.h"
#include "rollout/rescore_rewards.h"
#include "tests/rollout/helpers.h"

static char tmp[512], ckpt[600], db[700];
static const char *const uids[2] = {"rollout/g000000/r0", "rollout/g000001/r0"};

/* ---- wrapped calculators ---- */

enum { MODE_SHIFT = 1, MODE_OBS = 2, MODE_FAIL2 = 3, MODE_FAIL3 = 4 };

static arl_status w_instance_create(const json_t *config, void **inst) {
    return arl_env_calculator.ops->instance_create(config, inst);
}
static void w_instance_destroy(void *inst) {
    arl_env_calculator.ops->instance_destroy(inst);
}
static arl_status w_reset(void *inst, const arl_env_reset_req *req, void **state,
                          arl_env_result *out) {
    return arl_env_calculator.ops->reset(inst, req, state, out);
}
static arl_status w_step(int mode, void *inst, void *state, const arl_env_step_req *req,
                         arl_env_result *out) {
    ARL_TRY(arl_env_calculator.ops->step(inst, state, req, out));
    if (mode == MODE_SHIFT) out->reward += 0.125;
    if ((mode == MODE_FAIL2 && req->step_index == 2) ||
        (mode == MODE_FAIL3 && req->step_index == 3))
        return arl_errorf(ARL_ERR_INTERNAL, "test fault at step %lld", (long long)req->step_index);
    if (mode == MODE_OBS && req->step_index == 1)
        ARL_TRY(arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, "(changed)"));
    return ARL_OK;
}
static arl_status w_score(int mode, void *inst, void *state, const arl_env_score_req *req,
                          arl_env_score_result *out) {
    ARL_TRY(arl_env_calculator.ops->score(inst, state, req, out));
    if (mode == MODE_SHIFT && out->scorable) out->reward += 0.25;
    return ARL_OK;
}
static arl_status step_shift(void *i, void *s, const arl_env_step_req *r, arl_env_result *o) {
    return w_step(MODE_SHIFT, i, s, r, o);
}
static arl_status step_obs(void *i, void *s, const arl_env_step_req *r, arl_env_result *o) {
    return w_step(MODE_OBS, i, s, r, o);
}
static arl_status step_fail2(void *i, void *s, const arl_env_step_req *r, arl_env_result *o) {
    return w_step(MODE_FAIL2, i, s, r, o);
}
static arl_status step_fail3(void *i, void *s, const arl_env_step_req *r, arl_env_result *o) {
    return w_step(MODE_FAIL3, i, s, r, o);
}
static arl_status score_shift(void *i, void *s, const arl_env_score_req *r,
                              arl_env_score_result *o) {
    return w_score(MODE_SHIFT, i, s, r, o);
}
static arl_status score_plain(void *i, void *s, const arl_env_score_req *r,
                              arl_env_score_result *o) {
    return w_score(0, i, s, r, o);
}
static arl_status w_fork(void *inst, const void *state, void **child) {
    return arl_env_calculator.ops->fork(inst, state, child);
}
static void w_free_state(void *inst, void *state) {
    arl_env_calculator.ops->free_state(inst, state);
}

static arl_env_ops ops_shift, ops_obs, ops_nodet, ops_fail2, ops_fail3;
static arl_env_def def_shift, def_obs, def_nodet, def_fail2, def_fail3;
static char *info_shift, *info_nodet;

static void register_envs(void) {
    const arl_env_ops base = {.thread_safety = arl_env_calculator.ops->thread_safety,
                              .instance_create = w_instance_create,
                              .instance_destroy = w_instance_destroy,
                              .reset = w_reset,
                              .fork = w_fork,
                              .free_state = w_free_state};
    ops_shift = ops_obs = ops_nodet = ops_fail2 = ops_fail3 = base;
    ops_fail2.step = step_fail2;
    ops_fail3.step = step_fail3;
    ops_fail2.score = ops_fail3.score = score_plain;
    ops_shift.step = step_shift;
    ops_shift.score = score_shift;
    ops_obs.step = step_obs;
    ops_obs.score = score_plain;
    ops_nodet.step = arl_env_calculator.ops->step;
    ops_nodet.score = score_plain;
    /* the shifted rewards need wider level ranges (the host checks them, spec/aep.md 4.8) */
    json_t *j = json_loads(arl_env_calculator.info_json, 0, NULL);
    CHECK(j != NULL);
    json_t *lv = json_object_get(j, "reward_levels");
    const char *k;
    json_t *v;
    json_object_foreach(lv, k, v) json_object_set_new(v, "range", json_pack("[f,f]", -10.0, 10.0));
    info_shift = json_dumps(j, JSON_COMPACT);
    json_object_set_new(json_object_get(j, "capabilities"), "deterministic_replay", json_false());
    info_nodet = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    def_shift = (arl_env_def){.name = "calculator_shift",
                              .version = "1.0.1",
                              .description = "the calculator with shifted rewards",
                              .info_json = info_shift,
                              .ops = &ops_shift};
    def_obs = (arl_env_def){.name = "calculator_obs",
                            .version = "1.0.1",
                            .description = "the calculator with another first observation",
                            .info_json = arl_env_calculator.info_json,
                            .ops = &ops_obs};
    def_nodet = (arl_env_def){.name = "calculator_nodet",
                              .version = "1.0.1",
                              .description = "the calculator without deterministic replay",
                              .info_json = info_nodet,
                              .ops = &ops_nodet};
    H_DIE(arl_env_builtin_register(&def_shift), "register");
    H_DIE(arl_env_builtin_register(&def_obs), "register");
    def_fail2 = def_fail3 = def_obs;
    def_fail2.name = "calculator_fail2";
    def_fail2.ops = &ops_fail2;
    def_fail3.name = "calculator_fail3";
    def_fail3.ops = &ops_fail3;
    H_DIE(arl_env_builtin_register(&def_fail2), "register");
    H_DIE(arl_env_builtin_register(&def_fail3), "register");
    H_DIE(arl_env_builtin_register(&def_nodet), "register");
}

/* ---- helpers ---- */

static replay_store *st;

static size_t rows_of(const char *uid, const char *source) {
    replay_traj_row t;
    H_DIE(replay_traj_get(st, uid, &t), "traj");
    replay_reward_row *r;
    size_t n;
    H_DIE(replay_rewards_load(st, t.traj_id, source, &r, &n), "rewards");
    replay_reward_rows_free(r);
    return n;
}

static arl_status rr(const char *uid, const char *env, const char *label, replay_writer *w,
                     arl_rollout_rescore_rewards_stats *o) {
    arl_rollout_rescore_rewards_opts op = {.env = env, .label = label};
    arl_status s = arl_rollout_rescore_rewards(st, uid, &op, w ? &w : NULL, o);
    if (s == ARL_OK)
        fprintf(
            stderr,
            "  %s against %s: %lld steps, %lld segment scores, %lld episode scores, %lld "
            "responses differ (%s); process %lld/%lld differ (max %.3g), segment %lld/%lld "
            "(max %.3g), outcome %lld/%lld (max %.3g)\n",
            uid, o->env_where, (long long)o->steps, (long long)o->segment_scores,
            (long long)o->episode_scores, (long long)o->mismatched, o->first_mismatch,
            (long long)o->level[0].differing, (long long)o->level[0].compared, o->level[0].max_abs,
            (long long)o->level[1].differing, (long long)o->level[1].compared, o->level[1].max_abs,
            (long long)o->level[2].differing, (long long)o->level[2].compared, o->level[2].max_abs);
    else
        fprintf(stderr, "  %s against %s: %s\n", uid, env ? env : "(run's)", arl_error_msg());
    return s;
}

/* ---- tests ---- */

static void test_zero_drift(void) {
    replay_writer *w;
    H_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &w), "tool writer");
    int64_t total_steps = 0, seg_compared = 0;
    for (int i = 0; i < 2; i++) {
        arl_rollout_rescore_rewards_stats o;
        CHECK_EQ_INT(rr(uids[i], NULL, "same", w, &o), ARL_OK);
        CHECK_STR_EQ(o.env_where, "builtin:calculator");
        CHECK(o.steps > 0 && o.episode_scores == 1 && !o.partial);
        CHECK_EQ_INT(o.mismatched, 0); /* byte-identical responses */
        for (int l = 0; l < 3; l++) {
            CHECK_EQ_INT(o.level[l].differing, 0);
            CHECK_EQ_INT(o.level[l].missing, 0);
            CHECK_EQ_INT(o.level[l].extra, 0);
            CHECK_CLOSE(o.level[l].max_abs, 0.0, 0, 0);
        }
        /* process: '' + components + '@derived' per step; outcome at least '' and '@derived' */
        CHECK(o.level[0].compared >= 2 * o.steps);
        CHECK(o.level[2].compared >= 2);
        total_steps += o.steps;
        seg_compared += o.level[1].compared;
        /* one re-scored row per stored row, in the tool file with the label's source */
        size_t stored = rows_of(uids[i], NULL);
        CHECK_EQ_INT((int64_t)rows_of(uids[i], "rescore:same"), (int64_t)stored);
        CHECK_EQ_INT(o.rows_written, (int64_t)stored);
        CHECK_EQ_INT((int64_t)o.n_pairs, (int64_t)stored);
        for (size_t k = 0; k < o.n_pairs; k++) {
            const arl_rollout_reward_pair *p = &o.pairs[k];
            CHECK_EQ_INT(p->present, 3);
            CHECK_MSG((isnan(p->stored) && isnan(p->rescored)) || p->stored == p->rescored,
                      "level %d scope %lld '%s': stored %.17g, re-scored %.17g", p->level,
                      (long long)p->scope_index, p->component, p->stored, p->rescored);
        }
        free(o.pairs);
    }
    CHECK(total_steps > 2);
    CHECK(seg_compared > 0); /* segment scores were requested and compared */
    /* the same label again: the rows are replaced, not doubled */
    arl_rollout_rescore_rewards_stats o;
    CHECK_EQ_INT(rr(uids[0], NULL, "same", w, &o), ARL_OK);
    free(o.pairs);
    CHECK_EQ_INT((int64_t)rows_of(uids[0], "rescore:same"), (int64_t)rows_of(uids[0], NULL));
    replay_writer_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    /* `replay show` lists them under the tool file with their source */
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    H_DIE(replay_show(st, uids[0], NULL, f), "show");
    fclose(f);
    CHECK(strstr(txt, "re-scored rewards (shards/t") && strstr(txt, "derived=") &&
          strstr(txt, "@rescore:same"));
    free(txt);
}

static void test_drift(void) {
    replay_writer *w;
    H_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &w), "tool writer");
    for (int i = 0; i < 2; i++) {
        arl_rollout_rescore_rewards_stats o;
        CHECK_EQ_INT(rr(uids[i], "builtin:calculator_shift", "shift", w, &o), ARL_OK);
        /* every step and score answered with other reward bytes */
        CHECK_EQ_INT(o.mismatched, o.steps + o.segment_scores + o.episode_scores);
        CHECK(strstr(o.first_mismatch, "step 1: reward") == o.first_mismatch);
        int64_t n_diff[3] = {0, 0, 0};
        int scorable = 0; /* of the scope's '' row, which comes first in the pairs' order */
        for (size_t k = 0; k < o.n_pairs; k++) {
            const arl_rollout_reward_pair *p = &o.pairs[k];
            CHECK_EQ_INT(p->present, 3);
            if (!strcmp(p->component, "")) scorable = !isnan(p->stored);
            /* unscorable: '' NULL on both sides, '@derived' the client's value on both */
            const int scalar = !strcmp(p->component, "") || !strcmp(p->component, "@derived");
            const double shift = !scalar || !scorable ? 0.0 : p->level == 0 ? 0.125 : 0.25;
            /* exact: x + 0.125 and x + 0.25 of the env's values, parsed back from %.17g text */
            CHECK_MSG((isnan(p->stored) && isnan(p->rescored)) || p->rescored - p->stored == shift,
                      "level %d scope %lld '%s': stored %.17g, re-scored %.17g", p->level,
                      (long long)p->scope_index, p->component, p->stored, p->rescored);
            n_diff[p->level] += shift != 0.0;
        }
        for (int l = 0; l < 3; l++) {
            CHECK_EQ_INT(o.level[l].differing, n_diff[l]);
            CHECK_EQ_INT(o.level[l].missing + o.level[l].extra, 0);
        }
        CHECK_EQ_INT(o.level[0].differing, 2 * o.steps);
        CHECK_CLOSE(o.level[0].max_abs, 0.125, 0, 0);
        CHECK_CLOSE(o.level[2].max_abs, 0.25, 0, 0);
        CHECK_EQ_INT((int64_t)rows_of(uids[i], "rescore:shift"), o.rows_written);
        CHECK_CLOSE(o.level[0].rescored_sum - o.level[0].stored_sum, 0.125 * 2 * (double)o.steps,
                    1e-12, 0); /* sums of a few numbers in [-0.5, 0.5]: rounding << 1e-12 */
        free(o.pairs);
    }
    replay_writer_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
}

static void test_refused(void) {
    replay_writer *w;
    H_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &w), "tool writer");
    arl_rollout_rescore_rewards_stats o;
    CHECK_EQ_INT(rr(uids[0], "builtin:calculator_nodet", "nodet", w, &o), ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), "calculator_nodet") &&
          strstr(arl_error_msg(), "deterministic_replay"));
    CHECK(o.pairs == NULL);
    CHECK_EQ_INT((int64_t)rows_of(uids[0], "rescore:nodet"), 0);
    CHECK_EQ_INT(rr(uids[0], "builtin:calculator_obs", "obs", w, &o), ARL_ERR_ENV);
    CHECK(strstr(arl_error_msg(), "diverged at step 1") && strstr(arl_error_msg(), "observation"));
    CHECK_EQ_INT((int64_t)rows_of(uids[0], "rescore:obs"), 0);
    CHECK(rr(uids[0], "http://127.0.0.1:9", "gone", w, &o) != ARL_OK);
    CHECK(strstr(arl_error_msg(), "http://127.0.0.1:9") && strstr(arl_error_msg(), "--env"));
    CHECK_EQ_INT((int64_t)rows_of(uids[0], "rescore:gone"), 0);
    CHECK_EQ_INT(rr(uids[0], "builtin:no_such_env", "none", w, &o) != ARL_OK, 1);
    CHECK_EQ_INT(rr(uids[0], NULL, "", w, &o), ARL_ERR_ARG);
    replay_writer_close(w);
    /* a writer opened on demand: a refused replay opens no tool file */
    replay_writer *lazy = NULL;
    arl_rollout_rescore_rewards_opts op = {.env = "builtin:calculator_nodet", .label = "lazy"};
    CHECK_EQ_INT(arl_rollout_rescore_rewards(st, uids[0], &op, &lazy, &o), ARL_ERR_UNSUPPORTED);
    CHECK(lazy == NULL);
    op.env = NULL;
    CHECK_EQ_INT(arl_rollout_rescore_rewards(st, uids[0], &op, &lazy, &o), ARL_OK);
    CHECK(lazy != NULL && o.rows_written > 0);
    free(o.pairs);
    replay_writer_close(lazy);
}

static void test_masked(void) {
    /* an operator masks a complete trajectory: what was stored is replayed, reported partial */
    replay_traj_row t;
    H_DIE(replay_traj_get(st, uids[1], &t), "traj");
    replay_writer *w;
    H_DIE(replay_writer_open(st, REPLAY_FILE_WORKER, t.shard_id, NULL, &w), "worker writer");
    H_DIE(replay_traj_mask(w, t.traj_id, "X_TEST", "none", NULL, NULL), "mask");
    replay_writer_close(w);
    arl_rollout_rescore_rewards_stats o;
    CHECK_EQ_INT(rr(uids[1], NULL, "masked", NULL, &o), ARL_OK);
    CHECK_EQ_INT(o.partial, 1);
    CHECK(strstr(o.note, "masked X_TEST") != NULL);
    CHECK_EQ_INT(o.rows_written, 0); /* no tool writer: compared only */
    for (int l = 0; l < 3; l++)
        CHECK_EQ_INT(o.level[l].differing, 0);
    free(o.pairs);
}

/* A trajectory the rollout masked: its environment failed at step 3 (ENV_INTERNAL).  Replayed
 * against its own environment or the plain calculator, steps 1-2 (the stored responses) are
 * re-scored exactly, no episode score is requested, and the report says partial.  An environment
 * that fails at step 2 during the replay is an error naming the step, nothing written. */
static void test_rollout_masked(void) {
    char db2[800];
    snprintf(db2, sizeof db2, "%s/db2", tmp);
    arl_rollout_config c;
    h_config(&c, "builtin:calculator_fail3");
    c.tasks = 1;
    c.group_size = 1;
    replay_store *st2 = h_store(db2);
    arl_rollout_worker *wk;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st2, 0, NULL, &wk), "open");
    /* every trajectory of the run masked by the environment: the run says so (spec/aep.md
     * 8.6, rollout/worker.c win_verdict); the store keeps it */
    CHECK_EQ_INT(arl_rollout_worker_run(wk), ARL_ERR_ENV);
    arl_error_clear();
    arl_rollout_worker_close(wk);
    arl_rollout_config_free(&c);
    replay_traj_row t;
    H_DIE(replay_traj_get(st2, uids[0], &t), "traj");
    CHECK_EQ_INT(t.status, REPLAY_MASKED);
    CHECK_STR_EQ(t.error_code, "ENV_INTERNAL");
    replay_store *keep = st;
    st = st2;
    const char *envs[2] = {NULL, "builtin:calculator"};
    for (int i = 0; i < 2; i++) {
        replay_writer *w = NULL;
        arl_rollout_rescore_rewards_opts op = {.env = envs[i], .label = i ? "plain" : "own"};
        arl_rollout_rescore_rewards_stats o;
        CHECK_EQ_INT(arl_rollout_rescore_rewards(st, uids[0], &op, &w, &o), ARL_OK);
        fprintf(stderr, "  masked %s against %s: %lld steps, partial %d (%s)\n", uids[0],
                o.env_where, (long long)o.steps, o.partial, o.note);
        CHECK_EQ_INT(o.steps, 2);
        CHECK_EQ_INT(o.partial, 1);
        CHECK(strstr(o.note, "masked ENV_INTERNAL: replayed the 2 steps") != NULL);
        CHECK_EQ_INT(o.episode_scores, 0);
        CHECK_EQ_INT(o.mismatched, 0);
        for (int l = 0; l < 3; l++) {
            CHECK_EQ_INT(o.level[l].differing, 0);
            CHECK_EQ_INT(o.level[l].missing + o.level[l].extra, 0);
        }
        CHECK(o.level[0].compared >= 4); /* steps 1 and 2: '', components, '@derived' */
        CHECK_EQ_INT(o.level[2].compared, 0);
        CHECK_EQ_INT((int64_t)rows_of(uids[0], i ? "rescore:plain" : "rescore:own"),
                     o.rows_written);
        free(o.pairs);
        replay_writer_close(w);
    }
    replay_writer *w = NULL;
    arl_rollout_rescore_rewards_opts op = {.env = "builtin:calculator_fail2", .label = "f2"};
    arl_rollout_rescore_rewards_stats o;
    CHECK_EQ_INT(arl_rollout_rescore_rewards(st, uids[0], &op, &w, &o), ARL_ERR_ENV);
    CHECK(strstr(arl_error_msg(), "step 2") && strstr(arl_error_msg(), "ENV_INTERNAL"));
    CHECK(w == NULL);
    CHECK_EQ_INT((int64_t)rows_of(uids[0], "rescore:f2"), 0);
    CHECK_EQ_INT(h_verify(st), 0);
    st = keep;
    replay_store_close(st2);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rescore_rewards"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    snprintf(db, sizeof db, "%s/db", tmp);
    h_make_ckpt(ckpt, NULL, 5);
    register_envs();
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.group_size = 1;
    c.segment_tokens = 900; /* several segments: segment scores at their boundaries */
    st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    arl_rollout_worker_close(w);
    arl_rollout_config_free(&c);
    TEST_RUN(test_zero_drift);
    TEST_RUN(test_drift);
    TEST_RUN(test_refused);
    TEST_RUN(test_masked);
    TEST_RUN(test_rollout_masked);
    replay_store_close(st);
    free(info_shift);
    free(info_nodet);
    return test_finish();
}
