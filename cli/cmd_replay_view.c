/* cli/cmd_replay_view.c: `agentrl replay view DB [--host 127.0.0.1] [--port P]` (spec/replay.md
 * section 13.8): the renderings of list, show and stats as read-only HTML pages, served by
 * libmicrohttpd on loopback unless told otherwise.
 *   GET /                      list (query: run, status, env, group, limit; default limit 200)
 *   GET /show?traj=UID[&tokens=1][&group=1]   show
 *   GET /stats                 stats
 * What it is not: an editor (the store is opened read-only) or a multi-user server: one polling
 * thread answers the requests in turn (the store handle is not thread-safe).  The pages are the
 * text renderings of replay/inspect.h, HTML-escaped, with links between them. */
#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "replay/inspect.h"

typedef struct view_opts {
    char *db, *host;
    int64_t port, max_requests;
} view_opts;

static const arl_option view_tab[] = {
    {"db", ARL_OPT_STRING, offsetof(view_opts, db), NULL, "store root (or shard file)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"},
    {"host", ARL_OPT_STRING, offsetof(view_opts, host), "127.0.0.1",
     "address to listen on (IPv4; loopback unless told otherwise)", 0, 0, NULL, 0, "ADDR"},
    {"port", ARL_OPT_INT, offsetof(view_opts, port), "8765", "port (0: any free port)", 0, 65535,
     NULL, 0, "P"},
    {"max-requests", ARL_OPT_INT, offsetof(view_opts, max_requests), "0",
     "stop after answering N requests (0: serve until interrupted)", 0, 1e9, NULL, 0, "N"},
};

typedef struct view_server {
    replay_store *st;
    const char *db;
    atomic_long served;
} view_server;

static volatile sig_atomic_t view_stop = 0;
static void on_signal(int sig) {
    (void)sig;
    view_stop = 1;
}

/* Append text to a memstream, HTML-escaped. */
static void html_escape(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(s[i], f);
        }
    }
}

/* A URL query value: everything but unreserved characters and '/' percent-encoded. */
static void url_encode(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-_.~/", *p))
            fputc(*p, f);
        else
            fprintf(f, "%%%02X", *p);
    }
}

static void page_head(FILE *f, const char *title, const char *db) {
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", f);
    html_escape(f, title, strlen(title));
    fputs("</title><style>body{font-family:sans-serif;margin:1em}pre{font-size:12px}"
          "td{padding:0 .6em;font-family:monospace;font-size:12px}</style></head><body>\n"
          "<p><a href=\"/\">list</a> | <a href=\"/stats\">stats</a> | store ",
          f);
    html_escape(f, db, strlen(db));
    fputs("</p>\n", f);
}

static int send_page(struct MHD_Connection *c, unsigned status, char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body ? body : (char *)"", MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    int ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* The error page of a failed operation: 404 for what does not exist, 400 for bad input. */
static unsigned error_page(FILE *f, arl_status s) {
    fputs("<p>error: ", f);
    const char *m = arl_error_msg();
    html_escape(f, m, strlen(m));
    fputs("</p>", f);
    return s == ARL_ERR_NOT_FOUND ? MHD_HTTP_NOT_FOUND
           : s == ARL_ERR_ARG     ? MHD_HTTP_BAD_REQUEST
                                  : MHD_HTTP_INTERNAL_SERVER_ERROR;
}

static unsigned page_list(view_server *v, struct MHD_Connection *c, FILE *f) {
    replay_filter flt;
    replay_filter_init(&flt);
    flt.run = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "run");
    flt.status = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "status");
    flt.env = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "env");
    flt.group = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "group");
    const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    /* ?limit=N, read as replay list's --limit N (core/options.h) */
    static const arl_option limit_opt[] = {
        {"limit", ARL_OPT_INT, 0, NULL, "at most N trajectories (0: all)", 0, 1e15, NULL, 0, "N"}};
    int64_t limit = 200;
    if (lim && arl_options_set(limit_opt, 1, "limit", lim, &limit) != ARL_OK) {
        page_head(f, "agentrl replay list", v->db);
        return error_page(f, ARL_ERR_ARG);
    }
    flt.limit = limit;
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m) return MHD_HTTP_INTERNAL_SERVER_ERROR;
    arl_status s = replay_list(v->st, &flt, 1, m);
    fclose(m);
    page_head(f, "agentrl replay list", v->db);
    unsigned code = MHD_HTTP_OK;
    if (s != ARL_OK) {
        code = error_page(f, s);
    } else {
        fputs("<table><tr><th>trajectory</th><th>status</th><th>end/error</th><th>env</th>"
              "<th>turns</th><th>segments</th><th>tokens (action)</th><th>outcome</th></tr>\n",
              f);
        for (char *line = buf, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            json_t *o = json_loads(line, 0, NULL);
            const char *uid = json_string_value(json_object_get(o, "traj_uid"));
            if (uid) {
                const char *err = json_string_value(json_object_get(o, "error_code"));
                const char *end = json_string_value(json_object_get(o, "end_cause"));
                const char *env = json_string_value(json_object_get(o, "env"));
                const char *st = json_string_value(json_object_get(o, "status"));
                json_t *oc = json_object_get(o, "outcome");
                fputs("<tr><td><a href=\"/show?traj=", f);
                url_encode(f, uid);
                fputs("\">", f);
                html_escape(f, uid, strlen(uid));
                fputs("</a></td><td>", f);
                html_escape(f, st ? st : "", st ? strlen(st) : 0);
                fputs("</td><td>", f);
                const char *e = err ? err : end ? end : "-";
                html_escape(f, e, strlen(e));
                fputs("</td><td>", f);
                html_escape(f, env ? env : "", env ? strlen(env) : 0);
                fprintf(f, "</td><td>%lld</td><td>%lld</td><td>%lld (%lld)</td><td>",
                        (long long)json_integer_value(json_object_get(o, "turns")),
                        (long long)json_integer_value(json_object_get(o, "segments")),
                        (long long)json_integer_value(json_object_get(o, "tokens")),
                        (long long)json_integer_value(json_object_get(o, "action_tokens")));
                if (json_is_number(oc))
                    fprintf(f, "%.4g", json_number_value(oc));
                else
                    fputs("-", f);
                fputs("</td></tr>\n", f);
            }
            json_decref(o);
        }
        fputs("</table>\n", f);
    }
    free(buf);
    return code;
}

/* show or stats: a text rendering into <pre>. */
static unsigned page_text(view_server *v, struct MHD_Connection *c, FILE *f, int is_show) {
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m) return MHD_HTTP_INTERNAL_SERVER_ERROR;
    arl_status s;
    const char *traj = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "traj");
    if (is_show) {
        const char *tok = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tokens");
        const char *grp = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "group");
        replay_show_opts so = {.tokens = tok && !strcmp(tok, "1"),
                               .group = grp && !strcmp(grp, "1")};
        s = traj ? replay_show(v->st, traj, &so, m)
                 : arl_errorf(ARL_ERR_ARG, "show needs ?traj=<traj_uid or traj_id>");
    } else {
        s = replay_stats(v->st, NULL, 0, m);
    }
    fclose(m);
    page_head(f, is_show ? "agentrl replay show" : "agentrl replay stats", v->db);
    unsigned code = MHD_HTTP_OK;
    if (s != ARL_OK) {
        code = error_page(f, s);
    } else {
        if (is_show) {
            fputs("<p><a href=\"/show?tokens=1&amp;traj=", f);
            url_encode(f, traj);
            fputs("\">tokens</a> | <a href=\"/show?group=1&amp;traj=", f);
            url_encode(f, traj);
            fputs("\">group</a></p>\n", f);
        }
        fputs("<pre>", f);
        html_escape(f, buf ? buf : "", n);
        fputs("</pre>\n", f);
    }
    free(buf);
    return code;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    view_server *v = cls;
    char *page = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&page, &n);
    if (!f) return MHD_NO;
    unsigned code;
    if (strcmp(method, "GET")) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        fputs("read-only: GET only\n", f);
    } else if (!strcmp(url, "/")) {
        code = page_list(v, c, f);
    } else if (!strcmp(url, "/show")) {
        code = page_text(v, c, f, 1);
    } else if (!strcmp(url, "/stats")) {
        code = page_text(v, c, f, 0);
    } else {
        code = MHD_HTTP_NOT_FOUND;
        page_head(f, "not found", v->db);
        fputs("<p>no such page</p>\n", f);
    }
    fputs("</body></html>\n", f);
    fclose(f);
    int ret = send_page(c, code, page, n);
    free(page);
    atomic_fetch_add(&v->served, 1);
    return ret == MHD_YES ? MHD_YES : MHD_NO;
}

int cmd_replay_view(int argc, char **argv) {
    view_opts o;
    memset(&o, 0, sizeof o);
    const size_t nt = ARL_OPTIONS_COUNT(view_tab);
    int rc = cli_parse(view_tab, nt, argc, argv, &o,
                       "agentrl replay view DB [--host 127.0.0.1] [--port P]",
                       "Serve the list, show and stats renderings of a store as read-only HTML "
                       "pages (GET /, /show?traj=UID, /stats) until interrupted.");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, !strcmp(o.host, "localhost") ? "127.0.0.1" : o.host, &a4.sin_addr) !=
        1) {
        fprintf(stderr, "agentrl: error: --host '%s' is not an IPv4 address\n", o.host);
        arl_options_free(view_tab, nt, &o);
        return ARL_EXIT_USAGE;
    }
    view_server v = {.db = o.db};
    atomic_init(&v.served, 0);
    replay_open_opts oo = {.flags = REPLAY_OPEN_READONLY};
    arl_status s = replay_store_open(o.db, &oo, &v.st);
    if (s != ARL_OK) {
        rc = cli_fail(s);
        arl_options_free(view_tab, nt, &o);
        return rc;
    }
    /* one polling thread: requests are answered one at a time (the store is single-threaded) */
    struct MHD_Daemon *d =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, (uint16_t)o.port, NULL,
                         NULL, on_request, &v, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a4,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "agentrl: error: replay view: cannot listen on %s port %lld (in use?)\n",
                o.host, (long long)o.port);
        replay_store_close(v.st);
        arl_options_free(view_tab, nt, &o);
        return ARL_EXIT_FAIL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("serving %s on http://%s:%d/ (Ctrl-C to stop)\n", o.db, o.host,
           di ? (int)di->port : (int)o.port);
    fflush(stdout);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    while (!view_stop && (o.max_requests <= 0 || atomic_load(&v.served) < o.max_requests)) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    printf("served %ld requests\n", (long)atomic_load(&v.served));
    replay_store_close(v.st);
    arl_options_free(view_tab, nt, &o);
    return ARL_EXIT_OK;
}
