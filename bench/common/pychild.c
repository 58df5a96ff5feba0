/* bench/common/pychild.c: the baseline child process protocol of the CPU benchmarks
 * (pychild.h). */
#include "bench/common/pychild.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void bench_child_stop(bench_child *b) {
    if (!b->pid) return;
    if (b->to) {
        fputs("quit\n", b->to);
        fclose(b->to);
    }
    if (b->from) fclose(b->from);
    int st;
    waitpid(b->pid, &st, 0);
    free(b->line);
    memset(b, 0, sizeof *b);
}

json_t *bench_child_read(bench_child *b) {
    for (;;) {
        ssize_t n = getline(&b->line, &b->cap, b->from);
        if (n < 0) return NULL;
        if (n > 0 && b->line[0] == '{') return json_loads(b->line, 0, NULL);
        fputs(b->line, stderr);
    }
}

json_t *bench_child_request(bench_child *b, const char *req, const char *who) {
    if (!b->pid || fprintf(b->to, "%s\n", req) < 0 || fflush(b->to) != 0) return NULL;
    json_t *j = bench_child_read(b);
    json_t *e = j ? json_object_get(j, "error") : NULL;
    if (e) {
        fprintf(stderr, "%s: baseline: %s\n", who,
                json_string_value(e) ? json_string_value(e) : "error");
        json_decref(j);
        return NULL;
    }
    return j;
}

bench_child_state bench_child_start(bench_child *b, char *const argv[], const char *const env[][2],
                                    int n_env, json_t **info, char *why, size_t cap) {
    memset(b, 0, sizeof *b);
    *info = NULL;
    if (access(argv[0], X_OK) != 0) {
        snprintf(why, cap, "%s not found or not executable", argv[0]);
        return BENCH_CHILD_UNAVAILABLE;
    }
    if (access(argv[1], R_OK) != 0) {
        snprintf(why, cap, "%s not readable", argv[1]);
        return BENCH_CHILD_UNAVAILABLE;
    }
    int to[2], from[2];
    if (pipe(to) != 0) {
        snprintf(why, cap, "pipe: %s", strerror(errno));
        return BENCH_CHILD_FAILED;
    }
    if (pipe(from) != 0) {
        snprintf(why, cap, "pipe: %s", strerror(errno));
        close(to[0]);
        close(to[1]);
        return BENCH_CHILD_FAILED;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        return BENCH_CHILD_FAILED;
    }
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[0]);
        close(to[1]);
        close(from[0]);
        close(from[1]);
        for (int i = 0; i < n_env; i++)
            if (env[i][1]) setenv(env[i][0], env[i][1], 1);
        execv(argv[0], argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    b->pid = pid;
    b->to = fdopen(to[1], "w");
    b->from = fdopen(from[0], "r");
    json_t *j = b->to && b->from ? bench_child_read(b) : NULL;
    if (!j) {
        if (b->to) fclose(b->to);
        if (b->from) fclose(b->from);
        int st = 0;
        waitpid(pid, &st, 0);
        free(b->line);
        memset(b, 0, sizeof *b);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
            snprintf(why, cap, "cannot run %s", argv[0]);
            return BENCH_CHILD_UNAVAILABLE;
        }
        snprintf(why, cap, "%s ended without a reply (status %d)", argv[1], st);
        return BENCH_CHILD_FAILED;
    }
    json_t *err = json_object_get(j, "error");
    if (err) {
        snprintf(why, cap, "%s", json_string_value(err) ? json_string_value(err) : "?");
        bench_child_state s = json_is_true(json_object_get(j, "unavailable"))
                                  ? BENCH_CHILD_UNAVAILABLE
                                  : BENCH_CHILD_FAILED;
        json_decref(j);
        bench_child_stop(b);
        return s;
    }
    *info = j;
    return BENCH_CHILD_OK;
}
