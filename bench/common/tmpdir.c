/* bench/common/tmpdir.c: the temporary directory of one benchmark run (tmpdir.h). */
#include "bench/common/tmpdir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[512];
static int g_depth;
static int g_keep;

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
    if (g_dir[0] && g_keep) fprintf(stderr, "kept %s (ARL_BENCH_KEEP)\n", g_dir);
    if (g_dir[0] && !g_keep) remove_tree(g_dir, g_depth);
    g_dir[0] = 0;
}

/* The baseline child sees EOF on its stdin when this process ends, and ends too. */
static void on_signal(int sig) {
    cleanup();
    _exit(128 + sig);
}

/* Catch sig unless the process was started with it ignored (nohup, a background job). */
static void catch_signal(int sig) {
    struct sigaction old;
    if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN) return;
    signal(sig, on_signal);
}

const char *bench_tmpdir_create(const char *name, int depth) {
    if (g_dir[0]) {
        fprintf(stderr, "%s: bench_tmpdir_create called twice\n", name);
        return NULL;
    }
    const char *base = getenv("TMPDIR");
    if (!base || !base[0]) base = "/tmp";
    char tmpl[sizeof g_dir];
    int n = snprintf(tmpl, sizeof tmpl, "%s/%s_XXXXXX", base, name);
    if (n < 0 || (size_t)n >= sizeof tmpl) {
        fprintf(stderr, "%s: TMPDIR %s: path too long (set TMPDIR to a shorter directory)\n", name,
                base);
        return NULL;
    }
    if (!mkdtemp(tmpl)) {
        fprintf(stderr,
                "%s: cannot create a temporary directory in %s: %s (set TMPDIR to a writable "
                "directory)\n",
                name, base, strerror(errno));
        return NULL;
    }
    memcpy(g_dir, tmpl, sizeof g_dir);
    g_depth = depth;
    const char *keep = getenv("ARL_BENCH_KEEP"); /* (set and not "0", as the README says) */
    g_keep = keep && *keep && strcmp(keep, "0");
    atexit(cleanup);
    catch_signal(SIGINT);
    catch_signal(SIGTERM);
    catch_signal(SIGHUP);  /* the terminal went away */
    catch_signal(SIGPIPE); /* stdout piped into a reader that quit (| head) */
    return g_dir;
}
