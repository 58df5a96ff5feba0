/* The inspection queries use indexes (spec/replay.md section 4.14): every query that list,
 * show, stats and the learner's segment iterator run is checked through EXPLAIN QUERY PLAN
 * (the store's plan log): none scans the segments table (or an index of it) in full, and
 * filters with an index of their own use it. */
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "replay/inspect.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static replay_store *st;

/* 1 if some PLAN line of the log is a full scan of segments (aliased s or not). */
static int scans_segments(const char *log, char *bad, size_t cap) {
    regex_t re;
    regcomp(&re, "^  PLAN SCAN (s|segments)( |$)", REG_EXTENDED | REG_NEWLINE);
    regmatch_t m;
    int hit = regexec(&re, log, 1, &m, 0) == 0;
    if (hit) snprintf(bad, cap, "%.*s", (int)(m.rm_eo - m.rm_so + 60), log + m.rm_so);
    regfree(&re);
    return hit;
}

static void check_run(const char *what, arl_status s) {
    CHECK_MSG(s == ARL_OK, "%s: %s", what, arl_error_msg());
    const char *log = replay_plan_log(st);
    char bad[256];
    CHECK_MSG(strstr(log, "QUERY ") != NULL, "%s: no query was logged", what);
    CHECK_MSG(!scans_segments(log, bad, sizeof bad), "%s: full scan of segments: %s\nlog:\n%s",
              what, bad, log);
}

static void test_list_filters(void) {
    FILE *out = fopen("/dev/null", "w");
    const char *where_outcome[] = {"outcome.answer_correct<1"};
    const char *where_process[] = {"process.derived<0"};
    struct {
        const char *name;
        replay_filter f;
        const char *want; /* an index the plan must use (NULL: any) */
    } cases[10];
    for (int i = 0; i < 10; i++)
        replay_filter_init(&cases[i].f), cases[i].want = NULL;
    cases[0].name = "no filter";
    cases[1].name = "run+status";
    cases[1].f.run = "run1";
    cases[1].f.status = "complete";
    cases[1].want = "trajectories_by_status";
    cases[2].name = "error code";
    cases[2].f.error_code = "SANDBOX_LOST";
    cases[2].want = "trajectories_by_error";
    cases[3].name = "run+min reward";
    cases[3].f.run = "run1";
    cases[3].f.min_reward = 0.5;
    cases[4].name = "where outcome";
    cases[4].f.where = where_outcome;
    cases[4].f.n_where = 1;
    cases[5].name = "where process + parse failures + tool";
    cases[5].f.where = where_process;
    cases[5].f.n_where = 1;
    cases[5].f.parse_failures = 1;
    cases[5].f.tool = "add";
    cases[6].name = "group+version range+tokens";
    cases[6].f.group = "run1/g000001";
    cases[6].f.version_lo = 3;
    cases[6].f.version_hi = 4;
    cases[6].f.min_tokens = 10;
    cases[6].want = "trajectories_by_group";
    cases[7].name = "env+limit";
    cases[7].f.env = "calc";
    cases[7].f.limit = 2;
    cases[8].name = "pinned"; /* the pinned uids through the traj_uid UNIQUE index */
    cases[8].f.pinned = 1;
    cases[8].want = "sqlite_autoindex_trajectories";
    cases[9].name = "run+sort by reward";
    cases[9].f.run = "run1";
    cases[9].f.sort = "reward";
    cases[9].f.limit = 3;
    for (int i = 0; i < 10; i++) {
        char what[96];
        replay_plan_log_clear(st);
        snprintf(what, sizeof what, "list %s", cases[i].name);
        check_run(what, replay_list(st, &cases[i].f, 0, out));
        if (cases[i].want)
            CHECK_MSG(strstr(replay_plan_log(st), cases[i].want) != NULL,
                      "%s: plan does not use %s:\n%s", what, cases[i].want, replay_plan_log(st));
        replay_plan_log_clear(st);
        snprintf(what, sizeof what, "stats %s", cases[i].name);
        check_run(what, replay_stats(st, &cases[i].f, 1, out));
    }
    fclose(out);
}

static void test_show_and_iterate(void) {
    FILE *out = fopen("/dev/null", "w");
    replay_plan_log_clear(st);
    replay_show_opts o = {.tokens = 1};
    check_run("show", replay_show(st, "p/0", &o, out));
    fclose(out);
    /* the learner's iteration, with a version range (segments_by_version) */
    replay_seg_filter f = {.version_lo = 3, .version_hi = 3};
    replay_seg_iter *it;
    replay_plan_log_clear(st);
    CHECK(replay_seg_iter_open(st, &f, &it) == ARL_OK);
    replay_seg_ref ref;
    int done = 0, n = 0;
    while (replay_seg_iter_next(it, &ref, &done) == ARL_OK && !done)
        n++;
    replay_seg_iter_close(it);
    CHECK(n > 0);
    check_run("segment iterator", ARL_OK);
    /* the index a filtered plan uses is not an accident of the data: check one directly */
    CHECK_MSG(strstr(replay_plan_log(st), "SEARCH s USING") != NULL, "%s", replay_plan_log(st));
}

int main(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/store", test_tmpdir("plans"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    if (replay_store_open(root, &oo, &st) != ARL_OK) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    fx_ids ids;
    replay_writer *w;
    if (fx_catalog(st, 1, 8, &ids) || replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w)) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    /* enough rows that a scan and a search differ in cost for the planner */
    for (int i = 0; i < 8; i++) {
        char uid[32];
        int64_t t;
        snprintf(uid, sizeof uid, "p/%d", i);
        if (fx_write_traj(w, &ids, uid, 500 + (uint64_t)i, i, 2, 40, 2, 2, i % 2, &t)) {
            fprintf(stderr, "%s\n", arl_error_msg());
            return 1;
        }
    }
    replay_writer_close(w);
    if (replay_pin(st, "p/1", "plans") != ARL_OK) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    replay_plan_log_enable(st, 1);
    TEST_RUN(test_list_filters);
    TEST_RUN(test_show_and_iterate);
    replay_store_close(st);
    FX_CLEANUP(root);
    return test_finish();
}
