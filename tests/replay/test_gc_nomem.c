/* Out of memory in replay_states_gc (spec/replay.md 7.6): when the list of states to delete
 * cannot grow, the GC is an error (ARL_ERR_NOMEM) and deletes nothing (rolled back), instead of
 * deleting fewer states and reporting success.  The list's growth is made to fail by a realloc
 * of this executable that fails the growth of a 64-entry list of state ids (1024 bytes) while
 * armed; the GC of 70 unreferenced states needs it.  Not sanitized: ASan owns realloc. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

static int armed, failed;

void *realloc(void *p, size_t n) {
    static void *(*real)(void *, size_t);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "realloc");
    if (armed && p && n == 128 * sizeof(int64_t)) {
        failed++;
        return NULL;
    }
    return real(p, n);
}

static int64_t count_states(replay_writer *w) {
    sqlite3_stmt *q;
    int64_t n = -1;
    if (rdb_prepare(&w->s, "SELECT count(*) FROM states", &q) != ARL_OK) return -1;
    if (sqlite3_step(q) == SQLITE_ROW) n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return n;
}

static char root[600];

static void test_gc_nomem(void) {
    replay_store *st = NULL;
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    fx_ids ids;
    replay_writer *w = NULL;
    CHECK_MSG(replay_store_open(root, &oo, &st) == ARL_OK && fx_catalog(st, 1, 1, &ids) == ARL_OK &&
                  replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w) == ARL_OK,
              "setup: %s", arl_error_msg());
    if (!w) return;
    for (int i = 0; i < 70; i++) { /* unreferenced (no segment): garbage once old enough */
        int64_t id;
        CHECK_MSG(fx_state_put(w, "g/a", i, "kda_boundary", "p1", 0, 32, &id) == ARL_OK, "%s",
                  arl_error_msg());
    }
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
    CHECK_EQ_INT(count_states(w), 70);
    int64_t del = -1;
    armed = 1;
    arl_status s = replay_states_gc(w, 0, &del);
    armed = 0;
    CHECK(failed > 0);
    CHECK_MSG(s == ARL_ERR_NOMEM, "status %d: %s", (int)s, arl_error_msg());
    CHECK(strstr(arl_error_msg(), "out of memory") != NULL);
    arl_error_clear();
    CHECK_EQ_INT(count_states(w), 70); /* rolled back: nothing deleted */
    /* with memory again, everything goes */
    CHECK_MSG(replay_states_gc(w, 0, &del) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(del, 70);
    CHECK_EQ_INT(count_states(w), 0);
    replay_writer_close(w);
    replay_store_close(st);
}

int main(void) {
    snprintf(root, sizeof root, "%s/store", test_tmpdir("gc-nomem"));
    TEST_RUN(test_gc_nomem);
    FX_CLEANUP(root);
    return test_finish();
}
