/* tests/envs_aep/test_drain.c: arl_aep_server_drain_wait (what `agentrl env serve` does after
 * SIGTERM).  A count of the active sessions that fails (this process out of memory: the host's
 * health answer could not be made) is not "none left": the drain goes on waiting for the
 * sessions still running, and a count that keeps failing makes it wait its whole timeout and
 * end in ARL_ERR_NOMEM.  The echo host's health is wrapped by one that fails on demand. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "envs/aep_server.h"
#include "envs/env.h"
#include "tests/test.h"

static const arl_env_vtable *real_vt;
static arl_env_vtable flaky_vt;
static volatile int health_fail; /* the next calls of health that fail; -1: all */

static int flaky_health(void *inst, char **resp, size_t *rlen) {
    if (health_fail) {
        if (health_fail > 0) health_fail--;
        arl_nomem_note(); /* as the host's reply_copy out of memory: 500 without a body */
        *resp = NULL;
        *rlen = 0;
        return 500;
    }
    return real_vt->health(inst, resp, rlen);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *inst;
static char sids[2][128];

static void open_session(int i) {
    char body[256];
    int n =
        snprintf(body, sizeof body,
                 "{\"trajectory_id\":\"d/%d\",\"group_id\":\"d\",\"task\":{\"id\":\"t\",\"seed\":1,"
                 "\"data\":{}},\"deadline_ms\":5000}",
                 i);
    char *r = NULL;
    size_t rl = 0;
    CHECK_EQ_INT(real_vt->reset(inst, body, (size_t)n, &r, &rl), 201);
    json_t *v = r ? json_loadb(r, rl, 0, NULL) : NULL;
    const char *sid = json_string_value(json_object_get(v, "session_id"));
    CHECK(sid != NULL);
    snprintf(sids[i], sizeof sids[i], "%s", sid ? sid : "");
    json_decref(v);
    real_vt->free_buffer(inst, r);
}

static void *close_later(void *p) {
    (void)p;
    usleep(400 * 1000);
    for (int i = 0; i < 2; i++)
        real_vt->close(inst, sids[i], "test");
    return NULL;
}

static void test_drain_count_fails(void) {
    const arl_env_def *d = arl_env_builtin_find("echo");
    arl_env_host_config hc = {.max_sessions = 4};
    CHECK(d && arl_env_host_open(d, NULL, &hc, &inst, &real_vt) == ARL_OK);
    if (!real_vt) return;
    flaky_vt = *real_vt;
    flaky_vt.health = flaky_health;
    arl_aep_server_config sc = {.host = "127.0.0.1", .port = 0};
    arl_aep_server *srv = NULL;
    CHECK(arl_aep_server_start(&flaky_vt, inst, &sc, &srv) == ARL_OK);
    if (!srv) return;
    open_session(0);
    open_session(1);
    arl_aep_server_drain(srv);
    CHECK_EQ_INT(arl_aep_server_active_sessions(srv), 2);
    int64_t left = 99, t0, dt;

    /* sessions still running at the timeout: ARL_OK with their count */
    health_fail = 2;
    t0 = now_ms();
    CHECK(arl_aep_server_drain_wait(srv, 300, NULL, &left) == ARL_OK);
    CHECK_EQ_INT(left, 2);
    CHECK(now_ms() - t0 >= 290);

    /* every count fails: the drain waits its whole time and says out of memory */
    health_fail = -1;
    t0 = now_ms();
    arl_status st = arl_aep_server_drain_wait(srv, 500, NULL, &left);
    dt = now_ms() - t0;
    CHECK_EQ_INT(st, ARL_ERR_NOMEM);
    CHECK_EQ_INT(left, -1);
    CHECK(dt >= 490);
    CHECK(strstr(arl_error_msg(), "out of memory") != NULL);
    CHECK(strstr(arl_error_msg(), "whole 500 ms") != NULL);

    /* a second signal stops the wait at once */
    health_fail = 0;
    volatile sig_atomic_t stop = 1;
    t0 = now_ms();
    CHECK(arl_aep_server_drain_wait(srv, 5000, &stop, &left) == ARL_OK);
    CHECK_EQ_INT(left, 2);
    CHECK(now_ms() - t0 < 1000);

    /* the first counts fail while two sessions run; they end 400 ms later: the drain waits for
     * them (the old loop took the failed count for none left and stopped at once) */
    health_fail = 3;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, close_later, NULL) == 0);
    t0 = now_ms();
    CHECK(arl_aep_server_drain_wait(srv, 5000, NULL, &left) == ARL_OK);
    dt = now_ms() - t0;
    pthread_join(th, NULL);
    CHECK_EQ_INT(left, 0);
    CHECK(dt >= 350 && dt < 4000);

    arl_aep_server_stop(srv);
    real_vt->destroy_instance(inst);
}

int main(void) {
    TEST_RUN(test_drain_count_fails);
    return test_finish();
}
