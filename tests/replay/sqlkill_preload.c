/* tests/replay/sqlkill_preload.c: an LD_PRELOAD shim that crashes a process at a chosen SQL
 * statement: when sqlite3_prepare_v2 is given SQL that begins with $ARL_TEST_KILL_SQL, the
 * process sends itself SIGKILL (what a kill -9 or a power loss does there: nothing after it
 * runs, an open transaction is never committed); every other call is SQLite's.  For tests of
 * what a crash between two writes leaves (tests/rollout/rescore_cli.sh).  $ARL_TEST_KILL_SIGNAL
 * (a number, e.g. 15 for SIGTERM) sends that signal instead; when the process lives on (a
 * handler, or a signal held back), the statement is prepared as SQLite would: a deterministic
 * Ctrl-C or SIGTERM at one point of a command (tests/replay/test_import_cli.sh).  Not for the
 * library: a test fixture only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

int sqlite3_prepare_v2(sqlite3 *db, const char *sql, int n, sqlite3_stmt **st, const char **tail) {
    static int (*real)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "sqlite3_prepare_v2");
    const char *kill_at = getenv("ARL_TEST_KILL_SQL"), *sig = getenv("ARL_TEST_KILL_SIGNAL");
    if (kill_at && *kill_at && sql && !strncmp(sql, kill_at, strlen(kill_at)))
        raise(sig && *sig ? atoi(sig) : SIGKILL);
    return real ? real(db, sql, n, st, tail) : SQLITE_ERROR;
}
