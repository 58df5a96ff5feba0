/* core/defer.c: see core/defer.h. */
#include "core/defer.h"

static void (*g_begin)(void), (*g_end)(void);
static int g_depth; /* stretches open */

void arl_defer_hooks_set(void (*begin)(void), void (*end)(void)) {
    g_begin = begin;
    g_end = end;
}

void arl_defer_begin(void) {
    if (g_depth++ == 0 && g_begin) g_begin();
}

void arl_defer_end(void) {
    if (g_depth == 0) return; /* (an end without its begin) */
    if (--g_depth == 0 && g_end) g_end();
}
