/* tests/learner/enospc_preload.c: an LD_PRELOAD shim for test_train_full.sh, a full disk for one
 * file: fsync or fdatasync of a file whose name (the last path component) is $ARL_TEST_ENOSPC_NAME
 * fails with ENOSPC, as it does on a full disk for data still in the page cache; every other call
 * is the system's.  Not for the library: a test fixture only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when fd's file is named $ARL_TEST_ENOSPC_NAME (its last path component) */
static int is_full(int fd) {
    const char *name = getenv("ARL_TEST_ENOSPC_NAME");
    if (!name || !*name) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    const char *base = strrchr(path, '/');
    return !strcmp(base ? base + 1 : path, name);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    if (is_full(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real ? real(fd) : (errno = ENOSYS, -1);
}

/* (SQLite syncs its files with fdatasync) */
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fdatasync");
    if (is_full(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real ? real(fd) : (errno = ENOSYS, -1);
}
