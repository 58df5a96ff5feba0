/* tests/learner/renamekill_preload.c: an LD_PRELOAD shim for test_train_kill_tmp.sh, a kill
 * while a file or checkpoint is written: rename(2) onto a path that ends with
 * "/$ARL_TEST_KILL_RENAME" raises SIGKILL instead (or $ARL_TEST_KILL_RENAME_SIGNAL), so the
 * process dies with the complete temporary file or directory of an atomic write still beside its
 * final name, as a kill -9 just before the rename leaves it; every other call is the system's.
 * Not for the library: a test fixture only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rename(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "rename");
    const char *name = getenv("ARL_TEST_KILL_RENAME");
    if (name && *name && to) {
        const size_t n = strlen(name), m = strlen(to);
        if (m > n && to[m - n - 1] == '/' && !strcmp(to + m - n, name)) {
            const char *sig = getenv("ARL_TEST_KILL_RENAME_SIGNAL");
            raise(sig && *sig ? atoi(sig) : SIGKILL);
        }
    }
    return real ? real(from, to) : (errno = ENOSYS, -1);
}
