/* bench/common/tmpdir.c: the temporary directory of one benchmark run (tmpdir.h). */
#include "bench/common/tmpdir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];
static int g_depth;

static void remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[2048];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (remove(path) != 0 && depth > 0) remove_tree(path, depth - 1);
    }
    closedir(d);
    rmdir(dir);
}

static void cleanup(void) {
    if (g_dir[0]) remove_tree(g_dir, g_depth);
    g_dir[0] = 0;
}

/* The baseline child sees EOF on its stdin when this process ends, and ends too. */
static void on_signal(int sig) {
    cleanup();
    _exit(128 + sig);
}

const char *bench_tmpdir_create(const char *name, int depth) {
    if (g_dir[0]) {
        fprintf(stderr, "%s: bench_tmpdir_create called twice\n", name);
        return NULL;
    }
    char tmpl[sizeof g_dir];
    snprintf(tmpl, sizeof tmpl, "/tmp/%s_XXXXXX", name);
    if (!mkdtemp(tmpl)) {
        fprintf(stderr, "%s: mkdtemp: %s\n", name, strerror(errno));
        return NULL;
    }
    memcpy(g_dir, tmpl, sizeof g_dir);
    g_depth = depth;
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    return g_dir;
}
