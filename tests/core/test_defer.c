/* tests/core/test_defer.c: core/defer.h - without hooks the stretches do nothing; with hooks
 * they run at the outermost begin and end only (stretches nest), an end without its begin is
 * ignored, and hooks set to NULL are not called. */
#include "core/defer.h"
#include "tests/test.h"

static int g_begins, g_ends;
static void on_begin(void) { g_begins++; }
static void on_end(void) { g_ends++; }

static void test_no_hooks(void) {
    arl_defer_hooks_set(NULL, NULL);
    arl_defer_begin();
    arl_defer_end();
    arl_defer_end(); /* (no begin) */
}

static void test_nesting(void) {
    g_begins = g_ends = 0;
    arl_defer_hooks_set(on_begin, on_end);
    arl_defer_begin();
    CHECK_EQ_INT(g_begins, 1);
    arl_defer_begin(); /* (a stretch inside: nothing more) */
    arl_defer_begin();
    CHECK_EQ_INT(g_begins, 1);
    arl_defer_end();
    arl_defer_end();
    CHECK_EQ_INT(g_ends, 0);
    arl_defer_end();
    CHECK_EQ_INT(g_ends, 1);
    arl_defer_end(); /* an end without its begin: ignored, the next stretch as before */
    CHECK_EQ_INT(g_ends, 1);
    arl_defer_begin();
    arl_defer_end();
    CHECK_EQ_INT(g_begins, 2);
    CHECK_EQ_INT(g_ends, 2);
    arl_defer_hooks_set(NULL, NULL);
}

int main(void) {
    TEST_RUN(test_no_hooks);
    TEST_RUN(test_nesting);
    return test_finish();
}
