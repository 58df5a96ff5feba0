/* tests/envs_aep/test_check_nomem.c: out of memory in a worker thread of the conformance
 * checker (check 21, concurrency: one thread per session) ends arl_aep_check_run in
 * ARL_ERR_NOMEM, never in a verdict against the server under test (a step body built without
 * its action answered 4xx and failed check 21: "N failed").  arl_nomem_count is per thread:
 * the workers carry their count back to the main thread.
 * The echo server runs in a child process; in this process jansson's allocator is replaced,
 * before core/json_dump.c's watch wraps it, by one that fails the Nth allocation made by a
 * thread other than the main one (the checker's workers: no other thread of this process uses
 * jansson).  Every N up to the workers' count is tried (a run takes about 0.1 s). */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "envs/aep_check.h"
#include "envs/aep_server.h"
#include "envs/env.h"
#include "tests/test.h"

static pthread_t main_thread;
static long fail_at;      /* the Nth allocation of a worker fails; 0: none (set in the main thread
                             while no worker runs) */
static long worker_calls; /* atomic */

static void *failing_malloc(size_t n) {
    if (!pthread_equal(pthread_self(), main_thread)) {
        long c = __atomic_add_fetch(&worker_calls, 1, __ATOMIC_SEQ_CST);
        if (c == fail_at) return NULL;
    }
    return malloc(n);
}

/* The child: serve echo on a free port, write the port to wfd, run until rfd is closed. */
static void serve_child(int wfd, int rfd) {
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    arl_env_host_config hc = {0};
    arl_aep_server_config sc = {.host = "127.0.0.1", .port = 0};
    arl_aep_server *srv = NULL;
    int port = -1;
    const arl_env_def *d = arl_env_builtin_find("echo");
    if (d && arl_env_host_open(d, NULL, &hc, &inst, &vt) == ARL_OK &&
        arl_aep_server_start(vt, inst, &sc, &srv) == ARL_OK)
        port = arl_aep_server_port(srv);
    if (write(wfd, &port, sizeof port) != sizeof port) _exit(1);
    char c;
    while (read(rfd, &c, 1) > 0) {
    }
    _exit(0);
}

/* A fresh server for each run: the checker's trajectory ids are made of its pid and the time
 * in seconds, so two runs in one second against one server would collide. */
typedef struct child {
    pid_t pid;
    int wfd; /* closed: the child ends */
    char url[64];
} child;

static int child_start(child *c) {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) || pipe(to_child)) return 0;
    c->pid = fork();
    if (c->pid == 0) {
        close(to_parent[0]);
        close(to_child[1]);
        serve_child(to_parent[1], to_child[0]);
    }
    close(to_parent[1]);
    close(to_child[0]);
    c->wfd = to_child[1];
    int port = -1;
    if (read(to_parent[0], &port, sizeof port) != (ssize_t)sizeof port) port = -1;
    close(to_parent[0]);
    snprintf(c->url, sizeof c->url, "http://127.0.0.1:%d", port);
    return port > 0;
}

static void child_stop(child *c) {
    close(c->wfd);
    int ws = 0;
    waitpid(c->pid, &ws, 0);
}

/* One run of the suite against a fresh server, the Nth worker allocation failing (0: none). */
static arl_status check_once(long n, arl_check_report *rep) {
    child c;
    if (!child_start(&c)) {
        CHECK(!"the echo server did not start");
        return ARL_ERR_STATE;
    }
    arl_check_config cfg = {.url = c.url};
    fail_at = n;
    worker_calls = 0;
    arl_status s = arl_aep_check_run(&cfg, rep);
    fail_at = 0;
    child_stop(&c);
    return s;
}

static void test_check_worker_nomem(void) {
    arl_check_report rep;
    /* the count of the workers' allocations; the suite passes */
    CHECK(check_once(0, &rep) == ARL_OK);
    CHECK_EQ_INT(rep.n_fail, 0);
    CHECK(rep.items[20].result == ARL_CHECK_PASS); /* 21 concurrency ran */
    const long total = worker_calls;
    CHECK(total > 10);
    /* about 150 runs: the first 20 N, then a stride over the rest */
    const long stride = total / 130 + 1;
    int nomem = 0, wrong = 0, tried = 0;
    for (long n = 1; n <= total; n += n < 20 ? 1 : stride) {
        arl_status s = check_once(n, &rep);
        if (worker_calls < n) continue; /* this run made fewer (another order): not reached */
        tried++;
        if (s == ARL_ERR_NOMEM && strstr(arl_error_msg(), "out of memory")) {
            nomem++;
        } else {
            fprintf(stderr, "worker allocation %ld of %ld: status %d, %d failed, check 21: %s\n", n,
                    total, (int)s, rep.n_fail, rep.items[20].message);
            wrong++;
        }
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK(nomem > 100);
    fprintf(stderr,
            "%d of %d runs (worker allocations 1 .. %ld) ended out of memory, %d otherwise\n",
            nomem, tried, total, wrong);
}

int main(void) {
    main_thread = pthread_self();
    json_set_alloc_funcs(failing_malloc, free);
    arl_json_watch(); /* the watch wraps failing_malloc */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    TEST_RUN(test_check_worker_nomem);
    curl_global_cleanup();
    return test_finish();
}
