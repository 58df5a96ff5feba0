/* The catalog operations beyond trajectories (spec/replay.md sections 4.2, 4.5, 4.13, 7.7):
 * the consumption ledger (plan, re-plan after a crash, commit exactly once, abort, the guard
 * against a group consumed twice), pins and the pinned/sorted list, the run configuration
 * getter, learner records (writer, replacement, export, the --full import round trip, verify)
 * and re-score rows. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/inspect.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static char root[512];
static replay_store *st;
static fx_ids gid[5]; /* groups 1..3 train (final), 4 eval (final), 5 train (open) */
static int64_t traj[5];

/* The first column of the first row of sql over the catalog of the store at dir (-1 if none). */
static int64_t cat_int_in(const char *dir, const char *sql) {
    char p[700];
    snprintf(p, sizeof p, "%s/catalog.sqlite", dir);
    sqlite3 *db;
    sqlite3_stmt *q;
    int64_t v = -1;
    sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL);
    if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK) {
        if (sqlite3_step(q) == SQLITE_ROW) v = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
    }
    sqlite3_close(db);
    return v;
}

static int64_t cat_int(const char *sql) {
    return cat_int_in(root, sql);
}

static void cat_exec(const char *sql) {
    char p[600];
    snprintf(p, sizeof p, "%s/catalog.sqlite", root);
    sqlite3 *db;
    sqlite3_open(p, &db);
    sqlite3_busy_timeout(db, 5000);
    CHECK_MSG(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);
}

/* Output of fn into a malloc'ed string (caller frees). */
static char *capture_list(const replay_filter *f) {
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    arl_status s = replay_list(st, f, 1, m);
    fclose(m);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    return buf;
}

static void test_ledger(void) {
    int64_t run = gid[0].run_id, *g = NULL, pend = -2;
    size_t n = 0;
    CHECK(replay_update_pending(st, run, &pend) == ARL_OK && pend == -1);
    /* oldest final train groups first, at most 2: groups 1 and 2 (not eval 4, not open 5) */
    CHECK_MSG(replay_update_plan(st, run, 0, NULL, 2, &g, &n) == ARL_OK, "%s", arl_error_msg());
    CHECK(n == 2 && g[0] == gid[0].group_id && g[1] == gid[1].group_id);
    free(g);
    CHECK(replay_update_pending(st, run, &pend) == ARL_OK && pend == 0);
    /* a crash before the commit: planning the same update again selects the same groups and
     * writes nothing new, even though more groups are final now */
    CHECK(replay_update_plan(st, run, 0, NULL, 5, &g, &n) == ARL_OK);
    CHECK(n == 2 && g[0] == gid[0].group_id && g[1] == gid[1].group_id);
    free(g);
    CHECK_EQ_INT((int)cat_int("SELECT count(*) FROM updates"), 1);
    CHECK_EQ_INT((int)cat_int("SELECT count(*) FROM update_groups"), 2);
    /* one planned update at a time */
    CHECK(replay_update_plan(st, run, 1, NULL, 5, &g, &n) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "update 0") != NULL);
    /* commit: consumed exactly once, with policy version 1 */
    replay_version_desc v = {.checkpoint_uri = "ckpt/v1", .kl_coef = 0.05};
    CHECK_MSG(replay_update_commit(st, run, 0, 123, &v) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT((int)cat_int("SELECT count(*) FROM task_groups WHERE status = 'consumed' AND "
                              "consumed_update = 0"),
                 2);
    CHECK_EQ_INT((int)cat_int("SELECT update_n FROM policy_versions WHERE version = 1"), 0);
    CHECK_EQ_INT((int)cat_int("SELECT n_action_tokens FROM updates WHERE update_n = 0 AND status "
                              "= 'committed'"),
                 123);
    CHECK(replay_update_pending(st, run, &pend) == ARL_OK && pend == -1);
    CHECK(replay_update_commit(st, run, 0, 1, NULL) == ARL_OK); /* twice: a no-op */
    CHECK_EQ_INT((int)cat_int("SELECT n_action_tokens FROM updates WHERE update_n = 0"), 123);
    CHECK(replay_update_plan(st, run, 0, NULL, 5, &g, &n) == ARL_ERR_STATE); /* committed */
    CHECK(replay_update_commit(st, run, 7, 1, NULL) == ARL_ERR_NOT_FOUND);
    /* the next update takes the remaining final train group only */
    CHECK(replay_update_plan(st, run, 1, NULL, 5, &g, &n) == ARL_OK);
    CHECK(n == 1 && g[0] == gid[2].group_id);
    free(g);
    /* abort, then plan again under the same number: the group is still available */
    CHECK(replay_update_abort(st, run, 1) == ARL_OK);
    CHECK(replay_update_abort(st, run, 1) == ARL_ERR_STATE);
    CHECK(replay_update_plan(st, run, 1, NULL, 5, &g, &n) == ARL_OK);
    CHECK(n == 1 && g[0] == gid[2].group_id);
    free(g);
    /* the guard: a group consumed behind the ledger's back makes the commit change nothing */
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE task_groups SET status = 'consumed', consumed_update = 99 WHERE group_id = "
             "%lld",
             (long long)gid[2].group_id);
    cat_exec(sql);
    CHECK(replay_update_commit(st, run, 1, -1, NULL) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "0 of its 1 groups") != NULL);
    CHECK_EQ_INT((int)cat_int("SELECT count(*) FROM updates WHERE update_n = 1 AND status = "
                              "'planned'"),
                 1);
    CHECK_EQ_INT((int)cat_int("SELECT count(*) FROM policy_versions WHERE version = 2"), 0);
    snprintf(sql, sizeof sql,
             "UPDATE task_groups SET status = 'final', consumed_update = NULL WHERE group_id = "
             "%lld",
             (long long)gid[2].group_id);
    cat_exec(sql);
    CHECK(replay_update_commit(st, run, 1, -1, NULL) == ARL_OK);
    CHECK(replay_update_groups(st, run, 1, &g, &n) == ARL_OK && n == 1);
    free(g);
    /* the eval group is planned only by kind */
    CHECK(replay_update_plan(st, run, 2, "eval", 5, &g, &n) == ARL_OK);
    CHECK(n == 1 && g[0] == gid[3].group_id);
    free(g);
    CHECK(replay_update_abort(st, run, 2) == ARL_OK);
    /* bad input */
    CHECK(replay_update_plan(st, run, -1, NULL, 5, &g, &n) == ARL_ERR_ARG);
    CHECK(replay_update_plan(st, run, 2, NULL, 0, &g, &n) == ARL_ERR_ARG);
    CHECK(replay_update_plan(st, 999, 0, NULL, 5, &g, &n) == ARL_ERR_NOT_FOUND);
    /* verify's ledger checks (section 13.5 item 7) agree; the fixture's tags go up to 4 */
    for (int64_t ver = 3; ver <= 4; ver++) {
        replay_version_desc vd = {
            .run_id = run, .version = ver, .update_n = ver - 1, .kl_coef = NAN};
        CHECK(replay_version_add(st, &vd) == ARL_OK);
    }
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

static void test_pins_and_list(void) {
    int pinned = -1;
    char reason[64];
    CHECK(replay_pin(st, "l/2", "debug this") == ARL_OK);
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)traj[0]); /* by traj_id */
    CHECK(replay_pin(st, id, NULL) == ARL_OK);
    CHECK(replay_pin(st, "l/2", "new reason") == ARL_OK); /* replaces the reason */
    CHECK(replay_pin_get(st, "l/2", &pinned, reason, sizeof reason) == ARL_OK && pinned == 1);
    CHECK_STR_EQ(reason, "new reason");
    CHECK(replay_pin_get(st, "l/1", &pinned, NULL, 0) == ARL_OK && pinned == 1);
    CHECK(replay_pin_get(st, "l/3", &pinned, NULL, 0) == ARL_OK && pinned == 0);
    CHECK(replay_pin(st, "nope", "x") == ARL_ERR_NOT_FOUND);
    replay_filter f;
    replay_filter_init(&f);
    f.pinned = 1;
    char *out = capture_list(&f);
    CHECK(out && strstr(out, "\"l/1\"") && strstr(out, "\"l/2\"") && !strstr(out, "\"l/3\""));
    free(out);
    CHECK(replay_unpin(st, "l/2") == ARL_OK);
    CHECK(replay_unpin(st, "l/2") == ARL_ERR_NOT_FOUND);
    CHECK(replay_unpin(st, id) == ARL_OK);
    out = capture_list(&f); /* nothing pinned: empty */
    CHECK(out && !strstr(out, "traj_uid"));
    free(out);
    /* --sort: uid ascending; reward highest first, trajectories without an outcome last */
    replay_filter_init(&f);
    f.sort = "uid";
    out = capture_list(&f);
    CHECK(out && strstr(out, "\"l/1\"") < strstr(out, "\"l/2\"") &&
          strstr(out, "\"l/2\"") < strstr(out, "\"l/5\""));
    free(out);
    f.sort = "reward";
    out = capture_list(&f);
    /* outcomes: l/1 0.1, l/2 0.2, l/3 0.3, l/4 0.4; l/5 is running */
    CHECK(out && strstr(out, "\"l/4\"") < strstr(out, "\"l/1\"") &&
          strstr(out, "\"l/1\"") < strstr(out, "\"l/5\""));
    free(out);
    f.sort = "bogus";
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(replay_list(st, &f, 0, devnull) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "--sort 'bogus'") != NULL);
    fclose(devnull);
}

static void test_run_get(void) {
    replay_run_info r;
    CHECK_MSG(replay_run_get(st, "run1", &r) == ARL_OK, "%s", arl_error_msg());
    CHECK_STR_EQ(r.config_json, "{\"lr\":1e-5}");
    CHECK_STR_EQ(r.model_config_json, "{\"model\":\"tiny\"}");
    CHECK_STR_EQ(r.status, "active");
    CHECK_EQ_INT((int)strlen(r.config_sha256), 64);
    int64_t id = r.run_id;
    replay_run_info_free(&r);
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)id);
    CHECK(replay_run_get(st, s, &r) == ARL_OK && r.run_id == id);
    replay_run_info_free(&r);
    CHECK(replay_run_get(st, "nope", &r) == ARL_ERR_NOT_FOUND);
    CHECK(r.config_json == NULL);
    replay_run_info_free(NULL);
}

#define LT 40 /* tokens per segment of the fixture trajectories below */

static void test_learner_records(void) {
    replay_writer *lw = NULL, *ww = NULL;
    CHECK_MSG(replay_writer_open(st, REPLAY_FILE_LEARNER, 0, "run1", &lw) == ARL_OK, "%s",
              arl_error_msg());
    if (!lw) return;
    CHECK(!strncmp(replay_writer_file(lw), "shards/l", 8));
    float old[LT], ref[LT], isw[LT], adv[LT];
    uint8_t flags[LT];
    for (int i = 0; i < LT; i++) {
        old[i] = -0.5f - 0.01f * (float)i;
        ref[i] = -0.6f;
        isw[i] = 1.0f;
        adv[i] = (float)i / LT;
        flags[i] = (uint8_t)(i % 2 ? 0x3f : 0x3e);
    }
    replay_learner_record r = {.run_id = gid[0].run_id,
                               .update_n = 0,
                               .traj_uid = "l/1",
                               .seg_index = 0,
                               .version = 0,
                               .staleness = 1,
                               .seg_mean_logratio = 0.01,
                               .levels_json = "{\"AO\":1.0,\"beta\":0.05}",
                               .n_tokens = LT,
                               .old_logprobs = old,
                               .ref_logprobs = ref,
                               .is_weights = isw,
                               .token_flags = flags,
                               .advantages = adv};
    CHECK_MSG(replay_learner_record_put(lw, &r) == ARL_OK, "%s", arl_error_msg());
    r.seg_mean_logratio = 0.02; /* a re-run of update 0 replaces the row */
    CHECK(replay_learner_record_put(lw, &r) == ARL_OK);
    r.seg_index = 1;
    r.mask_reason = "stale";
    CHECK(replay_learner_record_put(lw, &r) == ARL_OK);
    /* bad input: nothing stored */
    r.mask_reason = "bogus";
    CHECK(replay_learner_record_put(lw, &r) == ARL_ERR_ARG);
    r.mask_reason = NULL;
    r.levels_json = "{not json";
    CHECK(replay_learner_record_put(lw, &r) == ARL_ERR_ARG);
    r.levels_json = NULL;
    CHECK(replay_learner_record_put(lw, &r) == ARL_ERR_ARG);
    r.levels_json = "{}";
    /* only learner and tool files hold learner records; only tool files re-scores */
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &ww) == ARL_OK);
    if (ww) {
        CHECK(replay_learner_record_put(ww, &r) == ARL_ERR_ARG);
        replay_rescore_desc rd = {.label = "x",
                                  .traj_uid = "l/1",
                                  .stats_json = "{}",
                                  .n_tokens = LT,
                                  .logprobs = old,
                                  .version = -1};
        CHECK(replay_rescore_put(ww, &rd) == ARL_ERR_ARG);
        replay_writer_close(ww);
    }
    replay_writer_close(lw);
    /* a learner file is reopened without a takeover scan (it has no trajectories) */
    int32_t lid = 0;
    CHECK(replay_writer_open(st, REPLAY_FILE_LEARNER, 0, "run1", &lw) == ARL_OK);
    if (lw) lid = replay_writer_shard_id(lw);
    replay_writer_close(lw);
    CHECK(lid > 0);
    /* export --learner shows both records of l/1, verify accepts them */
    replay_store_refresh(st);
    replay_filter f;
    replay_filter_init(&f);
    f.task = "t1";
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    replay_export_opts eo = {.learner = 1};
    CHECK(replay_export(st, &f, &eo, m, NULL) == ARL_OK);
    fclose(m);
    const char *l1 = buf ? strstr(buf, "\"traj_uid\":\"l/1\"") : NULL;
    CHECK(l1 && strstr(l1, "\"learner\":[{\"update\":0,\"segment\":0") &&
          strstr(l1, "\"mask_reason\":\"stale\""));
    free(buf);
    CHECK_EQ_INT((int)fx_verify_errors(st), 0);
}

/* export --full, import into a fresh store, export --full again: byte-identical lines, learner
 * records included (spec section 13.3). */
static void test_full_round_trip(void) {
    char root2[600];
    snprintf(root2, sizeof root2, "%s2", root);
    replay_filter f;
    replay_filter_init(&f);
    f.status = "complete";
    f.sort = "uid";
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FILE *m = open_memstream(&a, &na);
    replay_export_opts eo = {.full = 1};
    int64_t cnt = 0;
    CHECK(replay_export(st, &f, &eo, m, &cnt) == ARL_OK);
    fclose(m);
    CHECK(cnt == 4 && a && strstr(a, "\"learner_records\":[{"));
    replay_store *s2 = NULL;
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    CHECK(replay_store_open(root2, &oo, &s2) == ARL_OK);
    FILE *in = fmemopen(a, na, "r");
    int64_t k = 0;
    CHECK_MSG(replay_import(s2, in, "mem", &k, NULL) == ARL_OK, "%s", arl_error_msg());
    fclose(in);
    CHECK(k == 4);
    replay_store_refresh(s2);
    m = open_memstream(&b, &nb);
    CHECK(replay_export(s2, &f, &eo, m, NULL) == ARL_OK);
    fclose(m);
    CHECK_MSG(na == nb && !memcmp(a, b, na), "round trip differs (%zu vs %zu bytes)", na, nb);
    /* the imported groups that training consumed are in their update, committed here too: the
     * copy verifies (it reported "consumed group N is not in exactly one committed update") */
    int64_t errors = -1, warnings = 0, consumed, in_updates;
    FILE *devnull = fopen("/dev/null", "w");
    replay_verify_opts vo = {0};
    CHECK(replay_verify(s2, &vo, devnull, &errors, &warnings) == ARL_OK);
    fclose(devnull);
    CHECK_EQ_INT((int)errors, 0);
    consumed = cat_int_in(root2, "SELECT count(*) FROM task_groups WHERE status = 'consumed'");
    in_updates = cat_int_in(root2, "SELECT count(*) FROM update_groups g JOIN updates u USING "
                                   "(run_id, update_n) WHERE u.status = 'committed' AND "
                                   "u.n_groups >= 1");
    CHECK_MSG(consumed >= 1 && in_updates == consumed, "%lld consumed, %lld in updates",
              (long long)consumed, (long long)in_updates);
    replay_store_close(s2);
    free(a);
    free(b);
    fx_rmtree(root2);
}

static void test_rescores(void) {
    replay_writer *tw = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw) == ARL_OK);
    if (!tw) return;
    float lp[LT];
    for (int i = 0; i < LT; i++)
        lp[i] = -0.25f;
    replay_rescore_desc rd = {.label = "v1",
                              .traj_uid = "l/1",
                              .seg_index = 0,
                              .run_uid = "run1",
                              .version = 1,
                              .stats_json = "{\"mean_abs\":0.1}",
                              .n_tokens = LT,
                              .logprobs = lp};
    CHECK_MSG(replay_rescore_put(tw, &rd) == ARL_OK, "%s", arl_error_msg());
    CHECK(replay_rescore_put(tw, &rd) == ARL_OK); /* replaces */
    rd.routing = "natural";
    CHECK(replay_rescore_put(tw, &rd) == ARL_OK);
    rd.routing = "sideways";
    CHECK(replay_rescore_put(tw, &rd) == ARL_ERR_ARG);
    rd.routing = NULL;
    rd.stats_json = "[";
    CHECK(replay_rescore_put(tw, &rd) == ARL_ERR_ARG);
    char p[700];
    snprintf(p, sizeof p, "%s/%s", root, replay_writer_file(tw));
    replay_writer_close(tw);
    sqlite3 *db;
    sqlite3_stmt *q;
    sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL);
    CHECK(sqlite3_prepare_v2(db, "SELECT count(*), sum(length(logprobs)) FROM rescores", -1, &q,
                             NULL) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 2);
    CHECK_EQ_INT(sqlite3_column_int(q, 1), 2 * (64 + 4 * LT));
    sqlite3_finalize(q);
    sqlite3_close(db);
}

int main(void) {
    snprintf(root, sizeof root, "%s/store", test_tmpdir("ledger"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_writer *w = NULL;
    if (replay_store_open(root, &oo, &st) != ARL_OK) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < 5 && !bad; i++) {
        bad |= fx_catalog(st, i + 1, 1, &gid[i]) != ARL_OK;
        if (i == 3 && !bad) { /* group 4 is an eval group: never consumed by training */
            char sql[128];
            snprintf(sql, sizeof sql, "UPDATE task_groups SET kind = 'eval' WHERE group_id = %lld",
                     (long long)gid[i].group_id);
            cat_exec(sql);
        }
    }
    if (!bad) bad |= replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) != ARL_OK;
    for (int i = 0; i < 4 && !bad; i++) {
        char uid[16];
        snprintf(uid, sizeof uid, "l/%d", i + 1);
        bad |= fx_write_traj(w, &gid[i], uid, 900 + (uint64_t)i, 0, 2, LT, 2, 2, 0.1 * (i + 1),
                             &traj[i]) != ARL_OK;
    }
    if (!bad) { /* group 5: a running trajectory, its group stays open */
        replay_traj_desc td = {.traj_uid = "l/5",
                               .run_id = gid[4].run_id,
                               .group_id = gid[4].group_id,
                               .task_id = gid[4].task_id,
                               .env_id = gid[4].env_id,
                               .fork_seg_index = -1};
        bad |= replay_traj_begin(w, &td, &traj[4]) != ARL_OK;
    }
    replay_writer_close(w);
    if (!bad) bad |= replay_catalog_reconcile(st) != ARL_OK;
    if (bad) {
        fprintf(stderr, "setup: %s\n", arl_error_msg());
        return 1;
    }
    TEST_RUN(test_ledger);
    TEST_RUN(test_pins_and_list);
    TEST_RUN(test_run_get);
    TEST_RUN(test_learner_records);
    TEST_RUN(test_full_round_trip);
    TEST_RUN(test_rescores);
    replay_store_close(st);
    FX_CLEANUP(root);
    return test_finish();
}
