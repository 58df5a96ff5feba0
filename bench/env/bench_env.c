/* bench/env/bench_env.c: cost of the AEP/1 client (envs/aep_client.c) over HTTP.
 *
 * One in-process server (envs/aep_server.c around the echo test environment) on loopback.
 * Baseline: a raw-socket client that sends the very bytes the library sends (same headers,
 * same body) on one kept-alive connection and reads the response by Content-Length, without
 * parsing it.  Measured in the same run, interleaved step by step:
 *   1. step round trip p50/p99, library vs raw, connections reused; overhead = difference;
 *   2. throughput of 64 concurrent sessions through the multi interface, against the raw
 *      single-connection rate.
 * Ratios: the library's p50 time over the raw client's (> 1: the library is slower), and the
 * 64-session rate over the raw single-connection rate (> 1: the sessions' rate is higher).
 * Usage: bench_env [--steps N] [STEPS] (--help; default 4000 steps).
 * Exit status: 0 done, 1 failure (a step or the server failed), 2 usage error. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/bench.h"
#include "core/options.h"
#include "envs/aep_json.h"
#include "envs/aep_server.h"
#include "envs/env.h"

static int64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int64_t pct(int64_t *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void make_action(arl_env_action *a, int64_t k) {
    char id[32];
    snprintf(id, sizeof id, "call_%lld_0", (long long)k);
    arl_env_action_clear(a);
    arl_env_action_add_call(a, id, "echo", json_pack("{s:s}", "text", "benchmark"));
    arl_env_action_set_parse_status(a);
    a->finish_reason = ARL_ENV_FINISH_TOOL_CALLS;
    a->num_tokens = 12;
}

/* The request the library sends for step k (same serialisation, same headers). */
static char *raw_request(int port, const char *sid, int64_t k, size_t *len) {
    arl_env_action a = {0};
    make_action(&a, k);
    size_t bl;
    char *body = aep_step_request(k, &a, 60000, &bl);
    arl_env_action_clear(&a);
    char *req = bench_xmalloc("bench_env", bl + 512);
    int n = snprintf(req, 512,
                     "POST /aep/v1/sessions/%s/step HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAEP-Version: 1\r\n"
                     "Accept: application/json\r\nContent-Type: application/json; charset=utf-8\r\n"
                     "AEP-Request-Id: r%016llx00000000\r\nContent-Length: %zu\r\n\r\n",
                     sid, port, (unsigned long long)k, bl);
    memcpy(req + n, body, bl);
    free(body);
    *len = (size_t)n + bl;
    return req;
}

typedef struct rawconn {
    int fd;
    char buf[1 << 16];
    size_t have;
} rawconn;

static int raw_roundtrip(rawconn *c, const char *req, size_t len) {
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(c->fd, req + off, len - off, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    for (;;) {
        char *end = memmem(c->buf, c->have, "\r\n\r\n", 4);
        if (end) {
            size_t hl = (size_t)(end - c->buf) + 4;
            char *cl = strcasestr(c->buf, "Content-Length:");
            size_t body = cl && cl < end ? (size_t)strtoul(cl + 15, NULL, 10) : 0;
            if (c->have >= hl + body) {
                int status = atoi(c->buf + 9);
                memmove(c->buf, c->buf + hl + body, c->have - hl - body);
                c->have -= hl + body;
                return status;
            }
        }
        ssize_t r = recv(c->fd, c->buf + c->have, sizeof c->buf - c->have, 0);
        if (r <= 0) return -1;
        c->have += (size_t)r;
    }
}

typedef struct eopts {
    int64_t steps;
    int64_t steps_pos; /* the older positional form; 0: --steps */
} eopts;

static const arl_option OPTS[] = {
    {"steps", ARL_OPT_INT, offsetof(eopts, steps), "4000",
     "timed steps per client (after 200 warm-up steps); the 64 sessions run steps/20 each", 100,
     100000, NULL, 0, "N"},
    {"steps-arg", ARL_OPT_INT, offsetof(eopts, steps_pos), "0",
     "the same as --steps N (the older form; 0: --steps)", 0, 100000, NULL, ARL_OPT_POSITIONAL,
     "STEPS"},
};

int main(int argc, char **argv) {
    eopts o;
    const char *summary = "AEP/1 client step round trip vs a raw socket client sending the same "
                          "bytes, and 64-session throughput, in the same run";
    int parsed =
        bench_options_parse("bench_env", summary, OPTS, ARL_OPTIONS_COUNT(OPTS), argc, argv, &o);
    if (parsed >= 0) return parsed;
    if (o.steps_pos && o.steps_pos < 100) {
        fprintf(stderr, "bench_env: option 'steps-arg': %lld is outside [100, 100000]\n",
                (long long)o.steps_pos);
        return 2;
    }
    const int steps = (int)(o.steps_pos ? o.steps_pos : o.steps);
    const arl_env_def *d = arl_env_builtin_find("echo");
    void *inst;
    const arl_env_vtable *vt;
    arl_env_host_config hc = {.max_sessions = 128};
    arl_aep_server *srv = NULL;
    arl_aep_server_config sc = {.host = "127.0.0.1", .port = 0};
    if (!d || arl_env_host_open(d, NULL, &hc, &inst, &vt) || arl_aep_server_start(vt, inst, &sc, &srv)) {
        fprintf(stderr, "bench_env: cannot start the server: %s\n", arl_error_msg());
        return 1;
    }
    int port = arl_aep_server_port(srv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    arl_env_client *c;
    arl_env *e;
    if (arl_env_client_open(NULL, &c) || arl_env_open(c, url, NULL, &e)) {
        fprintf(stderr, "bench_env: %s\n", arl_error_msg());
        return 1;
    }
    /* two sessions: one for the library, one for the raw client */
    arl_env_session *ls, *rs;
    arl_env_create_req cr = {.trajectory_id = "bench/lib", .group_id = "bench", .task = {.id = "t", .seed = 1}};
    arl_env_create_req cr2 = {.trajectory_id = "bench/raw", .group_id = "bench", .task = {.id = "t", .seed = 1}};
    if (arl_env_session_create(e, &cr, &ls) || arl_env_session_create(e, &cr2, &rs)) {
        fprintf(stderr, "bench_env: create failed\n");
        return 1;
    }
    int warm = 200, total = warm + steps;
    char **reqs = bench_xmalloc("bench_env", (size_t)total * sizeof *reqs);
    size_t *lens = bench_xmalloc("bench_env", (size_t)total * sizeof *lens);
    for (int i = 0; i < total; i++) reqs[i] = raw_request(port, arl_env_session_id(rs), i + 1, &lens[i]);
    rawconn *rc = bench_xmalloc("bench_env", sizeof *rc);
    rc->have = 0;
    rc->fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(rc->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(rc->fd, (struct sockaddr *)&a, sizeof a)) {
        perror("connect");
        return 1;
    }
    int64_t *tl = bench_xmalloc("bench_env", sizeof(int64_t) * (size_t)steps);
    int64_t *tr = bench_xmalloc("bench_env", sizeof(int64_t) * (size_t)steps);
    int64_t cpu_lib = 0, cpu_raw = 0; /* this thread's CPU time: robust against other load */
    arl_env_action act = {0};
    for (int i = 0; i < total; i++) {
        int64_t c0 = cpu_ns();
        make_action(&act, i + 1);
        int64_t t0 = aep_now_us();
        arl_status st = arl_env_session_step(ls, &act, 60000);
        int64_t t1 = aep_now_us();
        int64_t c1 = cpu_ns();
        int s2 = raw_roundtrip(rc, reqs[i], lens[i]);
        int64_t t2 = aep_now_us();
        int64_t c2 = cpu_ns();
        if (i >= warm) {
            cpu_lib += c1 - c0;
            cpu_raw += c2 - c1;
        }
        if (st != ARL_OK || s2 != 200) {
            fprintf(stderr, "bench_env: step %d failed (library %s, raw %d)\n", i + 1,
                    arl_env_session_call(ls)->error.code_str, s2);
            return 1;
        }
        if (i >= warm) {
            tl[i - warm] = t1 - t0;
            tr[i - warm] = t2 - t1;
        }
    }
    int64_t l50 = pct(tl, steps, 0.5), l99 = pct(tl, steps, 0.99), r50 = pct(tr, steps, 0.5),
            r99 = pct(tr, steps, 0.99);
    if (r50 < 1) r50 = 1; /* the clock counts whole microseconds: no ratio over 0 */
    printf("step round trip over loopback, %d steps each, connections reused (interleaved):\n", steps);
    printf("  raw socket (baseline): p50 %6lld us  p99 %6lld us\n", (long long)r50, (long long)r99);
    printf("  agentrl client:        p50 %6lld us  p99 %6lld us\n", (long long)l50, (long long)l99);
    printf(
        "  client overhead:       p50 %+6lld us (target <= +40 us)  p50 time agentrl/raw %.2fx\n",
        (long long)(l50 - r50), (double)l50 / (double)r50);
    printf("  client CPU per step:   agentrl %.1f us, raw %.1f us: overhead %+.1f us (building the action "
           "included)\n", cpu_lib / 1e3 / steps, cpu_raw / 1e3 / steps, (cpu_lib - cpu_raw) / 1e3 / steps);

    /* throughput: 64 sessions in flight through the multi interface (the echo environment
     * allows 64: free the two latency sessions first) */
    arl_env_session_delete(ls, "completed");
    arl_env_session_delete(rs, "completed");
    enum { NS = 64 };
    int per = steps / 20 > 20 ? steps / 20 : 20;
    arl_env_session *ss[NS];
    for (int i = 0; i < NS; i++) {
        char tid[32];
        snprintf(tid, sizeof tid, "bench/c%d", i);
        arl_env_create_req r3 = {.trajectory_id = tid, .group_id = "bench", .task = {.id = "t", .seed = 1}};
        if (arl_env_session_create(e, &r3, &ss[i])) {
            fprintf(stderr, "bench_env: create %d failed\n", i);
            return 1;
        }
    }
    int64_t t0 = aep_now_us();
    for (int i = 0; i < NS; i++) {
        make_action(&act, 1);
        arl_env_session_step_begin(ss[i], &act, 60000);
    }
    int done = 0, errors = 0;
    while (arl_env_client_pending(c) > 0) {
        arl_env_session *dn = NULL;
        arl_env_client_wait(c, 1000, &dn);
        if (!dn) continue;
        if (arl_env_session_call(dn)->status != ARL_OK) errors++;
        done++;
        int64_t k = arl_env_session_last_step(dn);
        if (k < per) {
            make_action(&act, k + 1);
            arl_env_session_step_begin(dn, &act, 60000);
        }
    }
    double secs = (double)(aep_now_us() - t0 + 1) / 1e6; /* + 1 us: never a rate over 0 */
    double tput = done / secs, raw1 = 1e6 / (double)r50;
    printf("throughput, %d sessions x %d steps in flight: %.0f steps/s (%d errors); raw single "
           "connection "
           "%.0f steps/s; rate 64 sessions/raw %.2fx\n",
           NS, per, tput, errors, raw1, tput / raw1);
    arl_env_action_clear(&act);
    for (int i = 0; i < NS; i++) {
        arl_env_session_delete(ss[i], "completed");
        arl_env_session_free(ss[i]);
    }
    arl_env_session_free(ls);
    arl_env_session_free(rs);
    arl_env_free(e);
    arl_env_client_close(c);
    close(rc->fd);
    free(rc);
    for (int i = 0; i < total; i++) free(reqs[i]);
    free(reqs);
    free(lens);
    free(tl);
    free(tr);
    arl_aep_server_stop(srv);
    vt->destroy_instance(inst);
    if (errors) fprintf(stderr, "bench_env: %d of %d throughput steps failed\n", errors, done);
    return errors ? 1 : 0;
}
