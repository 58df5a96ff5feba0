/* tests/envs_aep/loopback_server.h: the HTTP/1.1 plumbing of the test servers that play an AEP/1
 * environment on loopback (header-only test helper).  Raw sockets: a listening socket on
 * 127.0.0.1 with a port the kernel chooses, an accept thread, one detached thread per connection,
 * keep-alive.  Each request goes to the server's handler, which writes its own answer on the
 * socket - a well-formed response, a broken one, a slow one or none - and says whether the
 * connection stays open.  The fault servers of tests/envs_aep/test_faults.c and
 * tests/rollout/fault_server.h are handlers of this one server. */
#ifndef ARL_TESTS_ENVS_AEP_LOOPBACK_SERVER_H
#define ARL_TESTS_ENVS_AEP_LOOPBACK_SERVER_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* One request as read from a connection; every pointer is valid during the handler call only. */
typedef struct lsrv_request {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* the request target, e.g. "/aep/v1/info" */
    const char *body;   /* Content-Length bytes, not NUL-terminated */
    size_t len;
    const char *request_id; /* the AEP-Request-Id header, "" when absent */
} lsrv_request;

/* Answers rq on fd; returns 0 to keep the connection open, nonzero to close it. */
typedef int (*lsrv_handler)(int fd, const lsrv_request *rq);

typedef struct lsrv {
    int fd, port;
    pthread_t th;
    atomic_int stop;
    atomic_int accepts; /* connections accepted; a test may reset it to 0 */
    lsrv_handler handle;
} lsrv;

static int lsrv_send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A response with AEP-Version 1 and Content-Length len; ctype (NULL: no Content-Type) and extra
 * (NULL, or whole header lines each ending in "\r\n") are added to the headers. */
static int lsrv_send(int fd, int status, const char *ctype, const char *extra, const char *body,
                     size_t len) {
    char h[512];
    int n = snprintf(h, sizeof h,
                     "HTTP/1.1 %d X\r\nAEP-Version: 1\r\nContent-Length: %zu\r\n%s%s%s%s\r\n",
                     status, len, ctype ? "Content-Type: " : "", ctype ? ctype : "",
                     ctype ? "\r\n" : "", extra ? extra : "");
    if (lsrv_send_all(fd, h, (size_t)n)) return -1;
    return len ? lsrv_send_all(fd, body, len) : 0;
}

typedef struct lsrv_conn_arg {
    lsrv *srv;
    int fd;
} lsrv_conn_arg;

static void *lsrv_conn(void *p) {
    lsrv_conn_arg arg = *(lsrv_conn_arg *)p;
    free(p);
    int fd = arg.fd;
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    size_t have = 0;
    while (buf) {
        char *end = NULL;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            if (have >= cap - 1) goto done;
            ssize_t r = recv(fd, buf + have, cap - 1 - have, 0);
            if (r <= 0) goto done;
            have += (size_t)r;
        }
        size_t hlen = (size_t)(end - buf) + 4;
        buf[hlen - 1] = 0;
        char method[16] = "", path[512] = "", rid[64] = "";
        sscanf(buf, "%15s %511s", method, path);
        size_t clen = 0;
        for (char *l = strstr(buf, "\r\n"); l && l < buf + hlen; l = strstr(l + 2, "\r\n")) {
            if (!strncasecmp(l + 2, "Content-Length:", 15))
                clen = (size_t)strtoul(l + 17, NULL, 10);
            if (!strncasecmp(l + 2, "AEP-Request-Id:", 15)) sscanf(l + 17, " %63[^\r]", rid);
        }
        while (have < hlen + clen) {
            if (hlen + clen >= cap) {
                char *nb = realloc(buf, hlen + clen + 1);
                if (!nb) goto done;
                buf = nb;
                cap = hlen + clen + 1;
            }
            ssize_t r = recv(fd, buf + have, cap - 1 - have, 0);
            if (r <= 0) goto done;
            have += (size_t)r;
        }
        lsrv_request rq = {method, path, buf + hlen, clen, rid};
        if (arg.srv->handle(fd, &rq)) goto done;
        memmove(buf, buf + hlen + clen, have - hlen - clen);
        have -= hlen + clen;
    }
done:
    free(buf);
    close(fd);
    return NULL;
}

static void *lsrv_accept(void *p) {
    lsrv *srv = p;
    while (!atomic_load(&srv->stop)) {
        int c = accept(srv->fd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (atomic_load(&srv->stop)) {
            close(c);
            break;
        }
        atomic_fetch_add(&srv->accepts, 1);
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        lsrv_conn_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            close(c);
            continue;
        }
        *arg = (lsrv_conn_arg){srv, c};
        pthread_t t;
        if (pthread_create(&t, NULL, lsrv_conn, arg) == 0) {
            pthread_detach(t);
        } else {
            free(arg);
            close(c);
        }
    }
    return NULL;
}

/* Listens on 127.0.0.1 (srv->port is set) and serves every request with handle; 0 on success.
 * srv must stay valid until lsrv_stop. */
static int lsrv_start(lsrv *srv, lsrv_handler handle) {
    srv->handle = handle;
    atomic_store(&srv->stop, 0);
    atomic_store(&srv->accepts, 0);
    srv->fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(srv->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(srv->fd, (struct sockaddr *)&a, sizeof a) || listen(srv->fd, 64)) return -1;
    socklen_t al = sizeof a;
    getsockname(srv->fd, (struct sockaddr *)&a, &al);
    srv->port = ntohs(a.sin_port);
    return pthread_create(&srv->th, NULL, lsrv_accept, srv);
}

/* Stops accepting and joins the accept thread; connections already open finish on their own. */
static void lsrv_stop(lsrv *srv) {
    atomic_store(&srv->stop, 1);
    shutdown(srv->fd, SHUT_RDWR);
    close(srv->fd);
    pthread_join(srv->th, NULL);
}

#endif
