/* envs/aep_server.c: the AEP/1 HTTP front end over an arl_env_vtable (see envs/aep_server.h).
 *
 * Per request: check 1 (AEP-Version, token), check 2 (route), 413 for bodies over
 * max_request_bytes (answered before 100 Continue when the client asked for it, otherwise after
 * reading and discarding up to 64 MiB), check 4's header part (Content-Type, Accept; after the
 * session lookup of check 3, which the vtable does), then the vtable call.  Every response gets
 * AEP-Version: 1, bodies get a JSON Content-Type, and 503 responses Retry-After =
 * ceil(retry_after_ms / 1000).  Thread per connection: a slow step never blocks other sessions.
 * The bearer token is compared in constant time (token_ok); a connection idle for
 * connection_timeout_s (between requests, or mid-request) is closed; %00 in a path is not
 * decoded (unescape).
 *
 * Not JSON: libmicrohttpd (0.9.x) answers some malformed requests itself, before on_request
 * runs, with its compiled-in HTML body, and offers no hook to replace it: a request line
 * over the connection memory (32 KiB; 414 URI Too Long), headers over it (431), an HTTP
 * version other than 1.0/1.1 (505), an invalid Content-Length or chunked encoding, a header
 * line without a colon (400); a request line that is not HTTP at all gets the connection
 * closed without an answer.  No conforming client sends these (they are not AEP requests).
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "core/json_dump.h"
#include "core/sha256.h"
#include "envs/aep_json.h"
#include "envs/aep_server.h"

#define DISCARD_LIMIT ((size_t)64 << 20) /* §12.1: may stop reading an oversized body here */

struct arl_aep_server {
    struct MHD_Daemon *d;
    const arl_env_vtable *vt;
    void *inst;
    int has_token;
    uint8_t token_digest[ARL_SHA256_BYTES]; /* SHA-256 of the bearer token (token_ok) */
    int64_t max_request_bytes;
    int port;
};

typedef struct conn_ctx {
    char *buf;
    size_t len, cap;
    size_t seen;
    int too_large;
    int responded;
} conn_ctx;

static const char *JSON_CT = "application/json; charset=utf-8";

static enum MHD_Result send_bytes(struct MHD_Connection *c, int status, const char *body, size_t len, int close_conn) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "AEP-Version", "1");
    if (status != 204) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_CT);
    if (status == 503 && body) {
        json_t *v = arl_json_loadb(body, len, 0, NULL);
        json_t *ra = json_object_get(json_object_get(v, "error"), "retry_after_ms");
        long long ms = json_is_integer(ra) ? json_integer_value(ra) : 1000;
        char sec[32];
        snprintf(sec, sizeof sec, "%lld", (ms + 999) / 1000);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, sec);
        if (v) json_decref(v);
    }
    if (close_conn) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_err(struct MHD_Connection *c, arl_env_errcode code, const char *msg, int close_conn) {
    size_t len = 0;
    char *b = aep_envelope(code, NULL, msg, -1, &len);
    enum MHD_Result r = send_bytes(c, arl_env_errcode_http(code), b, len, close_conn);
    free(b);
    return r;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Accept admits application/json? (absent: yes) */
static int accept_ok(const char *a) {
    if (!a) return 1;
    const char *p = a;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ';') e++;
        size_t n = (size_t)(e - p);
        while (n && p[n - 1] == ' ') n--;
        if ((n == 16 && !strncasecmp(p, "application/json", 16)) || (n == 13 && !strncasecmp(p, "application/*", 13)) ||
            (n == 3 && !strncmp(p, "*/*", 3)))
            return 1;
        while (*e && *e != ',') e++;
        p = e;
    }
    return 0;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *x = *con_cls;
    if (!x) return;
    free(x->buf);
    free(x);
    *con_cls = NULL;
}

typedef enum route {
    R_NONE,
    R_INFO,
    R_HEALTH,
    R_CREATE,
    R_STEP,
    R_SCORE,
    R_FORK,
    R_GET,
    R_DELETE,
} route;

/* Route (check 2); sid receives the {sid} part. */
static route route_of(const char *url, const char *method, char *sid, size_t cap) {
    sid[0] = 0;
    if (strncmp(url, "/aep/v1/", 8)) return R_NONE;
    const char *p = url + 8;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    if (!strcmp(p, "info")) return get ? R_INFO : R_NONE;
    if (!strcmp(p, "health")) return get ? R_HEALTH : R_NONE;
    if (!strcmp(p, "sessions")) return post ? R_CREATE : R_NONE;
    if (strncmp(p, "sessions/", 9)) return R_NONE;
    p += 9;
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0) return R_NONE;
    /* an over-long {sid} is still this route (404 UNKNOWN_SESSION, or 204 for DELETE, §6.7),
     * not an unknown one: cut it; session ids have at most 128 bytes (§3) < cap, so the cut id
     * matches no session */
    if (n >= cap) n = cap - 1;
    memcpy(sid, p, n);
    sid[n] = 0;
    if (!slash) return get ? R_GET : del ? R_DELETE : R_NONE;
    const char *tail = slash + 1;
    if (!post) return R_NONE;
    if (!strcmp(tail, "step")) return R_STEP;
    if (!strcmp(tail, "score")) return R_SCORE;
    if (!strcmp(tail, "fork")) return R_FORK;
    return R_NONE;
}

/* Is `auth` "Bearer <the token>"?  Compared as SHA-256 digests with a loop that does not stop
 * at the first difference: the time taken tells nothing about how much of the token a guess
 * got right, nor its length (only the guess's own length, which the sender knows). */
static int token_ok(const arl_aep_server *s, const char *auth) {
    if (!auth || strncmp(auth, "Bearer ", 7)) return 0;
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256(auth + 7, strlen(auth + 7), d);
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < sizeof d; i++)
        diff |= (uint8_t)(d[i] ^ s->token_digest[i]);
    return diff == 0;
}

/* URL decoding for MHD (MHD_OPTION_UNESCAPE_CALLBACK): %XX as usual, except that %00 stays as
 * it is: a NUL would cut the C string MHD hands over, and "/sessions/S%00x" would then be the
 * session S.  Returns the new length. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
    return (size_t)(w - s);
}

static enum MHD_Result respond_vt(struct MHD_Connection *c, arl_aep_server *s, int status, char *resp, size_t len) {
    enum MHD_Result r = send_bytes(c, status, resp, resp ? len : 0, 0);
    if (resp) s->vt->free_buffer(s->inst, resp);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    arl_aep_server *s = cls;
    conn_ctx *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        *con_cls = x;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > s->max_request_bytes) {
            x->too_large = 1;
            const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            if (ex && !strcasecmp(ex, "100-continue")) { /* answer instead of 100 Continue, then close */
                x->responded = 1;
                char msg[128];
                snprintf(msg, sizeof msg, "request body of %s bytes exceeds max_request_bytes %lld", cl,
                         (long long)s->max_request_bytes);
                return send_err(c, ARL_ENV_E_PAYLOAD_TOO_LARGE, msg, 1);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        x->seen += n;
        if (x->responded) return MHD_YES;
        if (x->too_large || x->len + n > (size_t)s->max_request_bytes) {
            x->too_large = 1;
            free(x->buf);
            x->buf = NULL;
            x->len = x->cap = 0;
            return x->seen > DISCARD_LIMIT ? MHD_NO : MHD_YES;
        }
        if (x->len + n + 1 > x->cap) {
            size_t cap = x->cap ? x->cap : 4096;
            while (cap < x->len + n + 1) cap *= 2;
            char *b = realloc(x->buf, cap);
            if (!b) return MHD_NO;
            x->buf = b;
            x->cap = cap;
        }
        memcpy(x->buf + x->len, upload, n);
        x->len += n;
        return MHD_YES;
    }
    if (x->responded) return MHD_YES;
    x->responded = 1;

    /* check 1: version and token */
    const char *ver = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "AEP-Version");
    if (!ver || strcmp(ver, "1"))
        return send_err(c, ARL_ENV_E_UNSUPPORTED_VERSION, ver ? "AEP-Version must be 1" : "AEP-Version header missing", 0);
    if (s->has_token && !token_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                                 MHD_HTTP_HEADER_AUTHORIZATION)))
        return send_err(c, ARL_ENV_E_INVALID_REQUEST, "missing or wrong bearer token", 0);
    /* check 2: route */
    char sid[ARL_AEP_MAX_SID_BYTES * 3 + 8];
    route rt = route_of(url, method, sid, sizeof sid);
    if (rt == R_NONE) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route for %s %.200s", method, url);
        return send_err(c, ARL_ENV_E_X_UNKNOWN_ROUTE, msg, 0);
    }
    if (x->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds max_request_bytes %lld", (long long)s->max_request_bytes);
        return send_err(c, ARL_ENV_E_PAYLOAD_TOO_LARGE, msg, x->seen > DISCARD_LIMIT);
    }
    char *resp = NULL;
    size_t rl = 0;
    if (rt == R_DELETE) {
        const char *reason = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "reason");
        s->vt->close(s->inst, sid, reason ? reason : "");
        return send_bytes(c, 204, NULL, 0, 0);
    }
    /* check 4, header part (after check 3: an unknown or closed session wins) */
    const char *why = NULL;
    if (!accept_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT)))
        why = "Accept admits none of application/json, application/*, */*";
    else if (!strcmp(method, "POST") &&
             !aep_ctype_is_json(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)))
        why = "Content-Type must be application/json with charset utf-8";
    if (why) {
        if (rt == R_STEP || rt == R_SCORE || rt == R_FORK || rt == R_GET) {
            int st = s->vt->get(s->inst, sid, &resp, &rl);
            if (st == 404 || st == 410) return respond_vt(c, s, st, resp, rl);
            if (resp) s->vt->free_buffer(s->inst, resp);
            resp = NULL;
        }
        return send_err(c, ARL_ENV_E_INVALID_REQUEST, why, 0);
    }
    const char *body = x->buf ? x->buf : "";
    size_t blen = x->len;
    int st = 500;
    switch (rt) {
    case R_INFO: st = s->vt->info(s->inst, &resp, &rl); break;
    case R_HEALTH: st = s->vt->health(s->inst, &resp, &rl); break;
    case R_CREATE: st = s->vt->reset(s->inst, body, blen, &resp, &rl); break;
    case R_STEP: st = s->vt->step(s->inst, sid, body, blen, &resp, &rl); break;
    case R_SCORE: st = s->vt->score(s->inst, sid, body, blen, &resp, &rl); break;
    case R_FORK:
        if (s->vt->fork) {
            st = s->vt->fork(s->inst, sid, body, blen, &resp, &rl);
        } else { /* 404/410 first (§8.7), then 501 */
            st = s->vt->get(s->inst, sid, &resp, &rl);
            if (st == 404 || st == 410) return respond_vt(c, s, st, resp, rl);
            if (resp) s->vt->free_buffer(s->inst, resp);
            return send_err(c, ARL_ENV_E_NOT_IMPLEMENTED, "fork is not implemented", 0);
        }
        break;
    case R_GET: st = s->vt->get(s->inst, sid, &resp, &rl); break;
    default: break;
    }
    return respond_vt(c, s, st, resp, rl);
}

arl_status arl_aep_server_start(const arl_env_vtable *vt, void *inst, const arl_aep_server_config *cfg,
                                arl_aep_server **out) {
    *out = NULL;
    arl_aep_server_config def = {0};
    if (!cfg) cfg = &def;
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    char *ib = NULL;
    size_t il = 0;
    int st = vt->info(inst, &ib, &il);
    arl_env_info info;
    arl_status as = st == 200 ? arl_env_info_parse(ib, il, &info) : arl_errorf(ARL_ERR_PROTOCOL, "/info: HTTP %d", st);
    if (ib) vt->free_buffer(inst, ib);
    if (as != ARL_OK) return arl_error_prefix(ARL_ERR_PROTOCOL, "env serve");
    arl_aep_server *s = calloc(1, sizeof *s);
    if (!s) {
        arl_env_info_clear(&info);
        return arl_errorf(ARL_ERR_NOMEM, "env serve: out of memory");
    }
    s->vt = vt;
    s->inst = inst;
    s->max_request_bytes = cfg->max_request_bytes > 0 ? cfg->max_request_bytes : info.limits.max_request_bytes;
    arl_env_info_clear(&info);
    if (cfg->token) {
        s->has_token = 1;
        arl_sha256(cfg->token, strlen(cfg->token), s->token_digest);
    }
    if (cfg->connection_timeout_s < 0 ||
        cfg->connection_timeout_s > ARL_AEP_MAX_CONNECTION_TIMEOUT_S) {
        free(s);
        return arl_errorf(ARL_ERR_ARG,
                          "env serve: connection timeout %lld s outside [1, %d] (0: %d)",
                          (long long)cfg->connection_timeout_s, ARL_AEP_MAX_CONNECTION_TIMEOUT_S,
                          ARL_AEP_DEFAULT_CONNECTION_TIMEOUT_S);
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
            free(s);
            return arl_errorf(ARL_ERR_ARG, "env serve: --host '%s' is not an IPv6 address", host);
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &a4->sin_addr) !=
            1) {
            free(s);
            return arl_errorf(ARL_ERR_ARG, "env serve: --host '%s' is not an IPv4 address", host);
        }
    }
    unsigned timeout =
        (unsigned)(cfg->connection_timeout_s > 0 ? cfg->connection_timeout_s
                                                 : ARL_AEP_DEFAULT_CONNECTION_TIMEOUT_S);
    s->d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
    if (!s->d) {
        free(s);
        return arl_errorf(ARL_ERR_NET, "env serve: cannot listen on %s port %d (in use, or not a local address?)",
                          host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return ARL_OK;
}

int arl_aep_server_port(const arl_aep_server *s) { return s->port; }

void arl_aep_server_drain(arl_aep_server *s) {
    if (s->vt->struct_size >= offsetof(arl_env_vtable, drain) + sizeof s->vt->drain && s->vt->drain)
        s->vt->drain(s->inst);
}

int arl_aep_server_reap(arl_aep_server *s) {
    if (s->vt->struct_size >= offsetof(arl_env_vtable, reap_idle) + sizeof s->vt->reap_idle && s->vt->reap_idle)
        return s->vt->reap_idle(s->inst);
    return 0;
}

/* The environment's count of active sessions into *n: ARL_ERR_NOMEM when this process ran out
 * of memory making or reading the health body (the in-process host answers 500 without a body
 * and notes it; jansson's parse is watched), ARL_ERR_PROTOCOL when the body has no count. */
static arl_status sessions_count(arl_aep_server *s, int64_t *n) {
    *n = -1;
    const unsigned long nomem0 = arl_nomem_count();
    char *b = NULL;
    size_t l = 0;
    s->vt->health(s->inst, &b, &l);
    json_t *v = b ? arl_json_loadb(b, l, 0, NULL) : NULL;
    json_t *a = json_object_get(v, "active_sessions");
    if (!a) a = json_object_get(json_object_get(json_object_get(v, "error"), "details"), "active_sessions");
    if (json_is_integer(a)) *n = json_integer_value(a);
    if (v) json_decref(v);
    if (b) s->vt->free_buffer(s->inst, b);
    if (arl_nomem_count() != nomem0 || !b) {
        *n = -1;
        return arl_errorf(ARL_ERR_NOMEM, "env serve: out of memory counting the active sessions");
    }
    if (*n < 0)
        return arl_errorf(ARL_ERR_PROTOCOL,
                          "env serve: the environment's health body has no active_sessions");
    return ARL_OK;
}

int64_t arl_aep_server_active_sessions(arl_aep_server *s) {
    int64_t n;
    return sessions_count(s, &n) == ARL_OK ? n : -1;
}

arl_status arl_aep_server_drain_wait(arl_aep_server *s, int64_t timeout_ms,
                                     const volatile sig_atomic_t *stop, int64_t *left) {
    int64_t n = -1, waited = 0;
    arl_status st = sessions_count(s, &n);
    /* a count that failed is not "none left": wait and count again (a session it could not see
     * is still running) */
    while (!(st == ARL_OK && n == 0) && waited < timeout_ms && !(stop && *stop)) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        waited += 100;
        if (waited % 5000 == 0) arl_aep_server_reap(s);
        st = sessions_count(s, &n);
    }
    if (left) *left = n;
    if (st != ARL_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", arl_error_msg());
        return arl_errorf(
            st,
            "%s; the drain waited its whole %lld ms (a session it could not count may have been "
            "cut off)",
            why, (long long)waited);
    }
    return ARL_OK;
}

void arl_aep_server_stop(arl_aep_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    free(s);
}
