/* cli/cmd_replay_view.c: `agentrl replay view DB [--host 127.0.0.1] [--port P]` (spec/replay.md
 * section 13.8): the renderings of list, show and stats as read-only HTML pages, served by
 * libmicrohttpd on loopback unless told otherwise.
 *   GET /       list (query: run, status, env, group: filters; limit: 1..10000 per page, default
 *               200; offset: the first row of the page, with previous/next links)
 *   GET /show?traj=UID[&tokens=1][&group=1][&turns=A:B]   show (turns: token rows of steps A..B)
 *   GET /stats  stats
 * HEAD answers as GET without the body; other methods get 405 with Allow.
 * What it is not: an editor (the store is opened read-only) or a multi-user server: one polling
 * thread answers the requests in turn (the store handle is not thread-safe).  The pages are the
 * text renderings of replay/inspect.h, HTML-escaped (invalid UTF-8 and control bytes shown as
 * U+FFFD), with links between them (query values percent-encoded).
 * Guards of a local viewer of private data, in the order they apply:
 *   - Host: a request must name this server (localhost, 127.0.0.1, [::1] or the --host address;
 *     with --host 0.0.0.0 any IPv4 literal, with --host :: any IP literal; any port, so that
 *     ssh -L tunnels work), else 403:
 *     a web page the user visits cannot read the store through a DNS-rebinding name.  An
 *     HTTP/1.0 request without Host is answered (no browser sends one), HTTP/1.1 without Host
 *     is 400 (RFC 9112 section 3.2).
 *   - the store deleted or replaced while served: 410 (the open handle would show stale data).
 *   - parameters: unknown, repeated or malformed ones are 400 naming the parameter.
 *   - size: a show or stats rendering is cut at --max-page-bytes with a note; list pages hold
 *     at most 10000 rows.
 *   - headers: Content-Security-Policy without scripts, frames, forms or remote loads;
 *     nosniff; no-referrer; no-store. */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "policy/tokenizer.h"
#include "replay/inspect.h"

#define VIEW_LIST_MAX 10000 /* rows of one list page */

typedef struct view_opts {
    char *db, *host;
    int64_t port, max_requests, max_page_bytes;
} view_opts;

static const arl_option view_tab[] = {
    {"db", ARL_OPT_STRING, offsetof(view_opts, db), NULL, "store root (or shard file)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"},
    {"host", ARL_OPT_STRING, offsetof(view_opts, host), "127.0.0.1",
     "IPv4 or IPv6 address to listen on (not loopback: anyone who reaches it reads the store, "
     "no authentication)",
     0, 0, NULL, 0, "ADDR"},
    {"port", ARL_OPT_INT, offsetof(view_opts, port), "8765", "port (0: any free port)", 0, 65535,
     NULL, 0, "P"},
    {"max-requests", ARL_OPT_INT, offsetof(view_opts, max_requests), "0",
     "stop after answering N requests (0: serve until interrupted)", 0, 1e9, NULL, 0, "N"},
    {"max-page-bytes", ARL_OPT_INT, offsetof(view_opts, max_page_bytes), "8388608",
     "cut a show or stats rendering after N bytes, with a note (memory per request)", 4096, 1e9,
     NULL, 0, "N"},
};

typedef struct view_server {
    replay_store *st;
    const char *db;
    int v6;                /* listening on an IPv6 address (addr6), else IPv4 (addr) */
    struct in_addr addr;   /* listening address */
    struct in6_addr addr6; /* (v6) */
    int any;               /* listening on 0.0.0.0 or :: (with ::, IPv4 too where dual-stack) */
    int port;            /* bound port */
    size_t max_page;     /* --max-page-bytes */
    dev_t dev;           /* the store root when opened (deleted or replaced: 410) */
    ino_t ino;
    int gone_warned;
    atomic_long served;
} view_server;

static volatile sig_atomic_t view_stop = 0;
static void on_signal(int sig) {
    (void)sig;
    view_stop = 1;
}

/* Append n bytes of text, HTML-escaped (also for attribute values in double or single quotes);
 * invalid UTF-8 and control characters other than tab, CR and LF become U+FFFD. */
static void html_escape(FILE *f, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const unsigned c = p[i];
        if (c >= 0x80) {
            const size_t len = arl_utf8_char_len(p + i, n - i);
            if (len)
                fwrite(p + i, 1, len, f);
            else
                fputs("\xEF\xBF\xBD", f);
            i += len ? len : 1;
            continue;
        }
        i++;
        switch (c) {
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
        case '\'':
            fputs("&#39;", f);
            break;
        default:
            if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F)
                fputs("\xEF\xBF\xBD", f);
            else
                fputc((int)c, f);
        }
    }
}

static void html_str(FILE *f, const char *s) {
    if (s) html_escape(f, s, strlen(s));
}

/* A URL query value: everything but unreserved characters and '/' percent-encoded (so the
 * result is also safe inside an HTML attribute). */
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
    html_str(f, title);
    fputs("</title><style>body{font-family:sans-serif;margin:1em}pre{font-size:12px}"
          "td{padding:0 .6em;font-family:monospace;font-size:12px}.note{color:#a00}</style>"
          "</head><body>\n<p><a href=\"/\">list</a> | <a href=\"/stats\">stats</a> | store ",
          f);
    html_str(f, db);
    fputs("</p>\n", f);
}

/* A client's mistake or a refusal: the page head and one escaped line. */
static unsigned fail_page(FILE *f, const char *db, unsigned code, const char *msg) {
    page_head(f, "agentrl replay view: error", db);
    fputs("<p class=\"note\">error: ", f);
    html_str(f, msg);
    fputs("</p>\n", f);
    return code;
}

/* The error page of a failed operation: 404 for what does not exist, 400 for bad input. */
static unsigned error_page(FILE *f, const char *db, arl_status s) {
    return fail_page(f, db,
                     s == ARL_ERR_NOT_FOUND ? MHD_HTTP_NOT_FOUND
                     : s == ARL_ERR_ARG     ? MHD_HTTP_BAD_REQUEST
                                            : MHD_HTTP_INTERNAL_SERVER_ERROR,
                     arl_error_msg());
}

/* Headers of every page: a local viewer of private data runs no script, is framed by no one,
 * sends no referrer and is not cached. */
static const char *const view_headers[][2] = {
    {"Content-Type", "text/html; charset=utf-8"},
    {"Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"X-Frame-Options", "DENY"},
    {"Cache-Control", "no-store"},
    {"Cross-Origin-Resource-Policy", "same-origin"},
};

/* Queue the page (body: malloc'd, taken over, freed by libmicrohttpd). */
static enum MHD_Result send_page(struct MHD_Connection *c, unsigned status, char *body, size_t len,
                                 int allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    for (size_t i = 0; i < sizeof view_headers / sizeof *view_headers; i++)
        MHD_add_response_header(r, view_headers[i][0], view_headers[i][1]);
    if (allow) MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- request checks ---- */

/* Whether Host header h names this server (the DNS-rebinding guard, see the top).  The port is
 * not compared: a tunnel (ssh -L 9000:127.0.0.1:8765) gives the browser another one, and a
 * rebinding page cannot choose the name the browser sends. */
static int host_allowed(const view_server *v, const char *h) {
    char name[64];
    size_t n;
    const char *port;
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        if (!e) return 0;
        n = (size_t)(e - h) + 1;
        if (e[1] && e[1] != ':') return 0;
        port = e[1] ? e + 2 : NULL;
    } else {
        const char *c = strchr(h, ':');
        n = c ? (size_t)(c - h) : strlen(h);
        port = c ? c + 1 : NULL;
    }
    if (n == 0 || n >= sizeof name) return 0;
    if (port) {
        size_t k = strspn(port, "0123456789");
        if (k == 0 || k > 5 || port[k]) return 0;
    }
    for (size_t i = 0; i < n; i++)
        name[i] = (char)((h[i] >= 'A' && h[i] <= 'Z') ? h[i] - 'A' + 'a' : h[i]);
    name[n] = 0;
    if (!strcmp(name, "localhost") || !strcmp(name, "127.0.0.1") || !strcmp(name, "[::1]"))
        return 1;
    if (name[0] == '[') { /* an IPv6 literal */
        struct in6_addr a6;
        name[n - 1] = 0;
        if (inet_pton(AF_INET6, name + 1, &a6) != 1) return 0;
        return (v->any && v->v6) || (v->v6 && !memcmp(&a6, &v->addr6, sizeof a6));
    }
    struct in_addr a;
    if (inet_pton(AF_INET, name, &a) != 1) return 0; /* a name: the rebinding case */
    return v->any || (!v->v6 && a.s_addr == v->addr.s_addr);
}

/* Parameters of a page: each known, at most once. */
typedef struct arg_scan {
    const char *const *names; /* NULL-terminated */
    int seen[8];
    const char *bad, *why;
} arg_scan;

static enum MHD_Result arg_visit(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value) {
    (void)kind;
    (void)value;
    arg_scan *a = cls;
    size_t i = 0;
    while (a->names[i] && strcmp(a->names[i], key))
        i++;
    if (!a->names[i] || a->seen[i]++) {
        a->bad = key;
        a->why = a->names[i] ? "is given twice" : "is not a parameter of this page";
        return MHD_NO;
    }
    return MHD_YES;
}

/* 0 when the query holds only names (each once), else the 400 page's code. */
static unsigned args_check(view_server *v, struct MHD_Connection *c, FILE *f,
                           const char *const *names) {
    arg_scan a = {.names = names};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, arg_visit, &a);
    if (!a.bad) return 0;
    char msg[512], known[160] = "";
    for (size_t i = 0; names[i]; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                 names[i]);
    snprintf(msg, sizeof msg, "parameter '%.200s' %s (this page takes: %s)", a.bad, a.why,
             names[0] ? known : "none");
    return fail_page(f, v->db, MHD_HTTP_BAD_REQUEST, msg);
}

static const char *arg(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

/* A 0/1 flag parameter: 0 or 1 into *out, -1 when malformed. */
static int arg_flag(struct MHD_Connection *c, const char *name) {
    const char *s = arg(c, name);
    if (!s || !strcmp(s, "0")) return 0;
    return !strcmp(s, "1") ? 1 : -1;
}

/* ---- pages ---- */

typedef struct list_query {
    const char *run, *status, *env, *group;
    int64_t limit, offset;
} list_query;

/* href of a list page with q's filters at offset off ("&amp;"-separated, values encoded). */
static void list_href(FILE *f, const list_query *q, int64_t off) {
    const char *names[] = {"run", "status", "env", "group"};
    const char *vals[] = {q->run, q->status, q->env, q->group};
    fputs("/?", f);
    for (size_t i = 0; i < 4; i++) {
        if (!vals[i]) continue;
        fprintf(f, "%s=", names[i]);
        url_encode(f, vals[i]);
        fputs("&amp;", f);
    }
    fprintf(f, "limit=%lld&amp;offset=%lld", (long long)q->limit, (long long)off);
}

static unsigned page_list(view_server *v, struct MHD_Connection *c, FILE *f) {
    static const char *const names[] = {"run", "status", "env", "group", "limit", "offset", NULL};
    unsigned code = args_check(v, c, f, names);
    if (code) return code;
    list_query q = {arg(c, "run"), arg(c, "status"), arg(c, "env"), arg(c, "group"), 200, 0};
    /* ?limit=N and ?offset=K, read through an option table (core/options.h): its messages */
    static const arl_option page_opt[] = {{"limit", ARL_OPT_INT, offsetof(list_query, limit), NULL,
                                           "rows per page", 1, VIEW_LIST_MAX, NULL, 0, "N"},
                                          {"offset", ARL_OPT_INT, offsetof(list_query, offset),
                                           NULL, "first row", 0, 1e12, NULL, 0, "K"}};
    const char *lim = arg(c, "limit"), *off = arg(c, "offset");
    if ((lim && arl_options_set(page_opt, 2, "limit", lim, &q) != ARL_OK) ||
        (off && arl_options_set(page_opt, 2, "offset", off, &q) != ARL_OK))
        return error_page(f, v->db, ARL_ERR_ARG);
    replay_filter flt;
    replay_filter_init(&flt);
    flt.run = q.run;
    flt.status = q.status;
    flt.env = q.env;
    flt.group = q.group;
    flt.limit = q.limit + 1; /* one more: is there a next page */
    flt.offset = q.offset;
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m) return fail_page(f, v->db, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    arl_status s = replay_list(v->st, &flt, 1, m);
    fclose(m);
    if (s != ARL_OK) {
        free(buf);
        return error_page(f, v->db, s);
    }
    page_head(f, "agentrl replay list", v->db);
    int64_t rows = 0;
    int more = 0; /* a row past the page: link the next one */
    fputs("<table><tr><th>trajectory</th><th>status</th><th>end/error</th><th>env</th>"
          "<th>turns</th><th>segments</th><th>tokens (action)</th><th>outcome</th></tr>\n",
          f);
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (rows == q.limit) {
            more = 1;
            break;
        }
        json_t *o = json_loads(line, 0, NULL);
        const char *uid = json_string_value(json_object_get(o, "traj_uid"));
        if (uid) {
            const char *err = json_string_value(json_object_get(o, "error_code"));
            const char *end = json_string_value(json_object_get(o, "end_cause"));
            json_t *oc = json_object_get(o, "outcome");
            fputs("<tr><td><a href=\"/show?traj=", f);
            url_encode(f, uid);
            fputs("\">", f);
            html_str(f, uid);
            fputs("</a></td><td>", f);
            html_str(f, json_string_value(json_object_get(o, "status")));
            fputs("</td><td>", f);
            html_str(f, err ? err : end ? end : "-");
            fputs("</td><td>", f);
            html_str(f, json_string_value(json_object_get(o, "env")));
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
            rows++;
        }
        json_decref(o);
    }
    free(buf);
    fputs("</table>\n<p>", f);
    if (rows)
        fprintf(f, "trajectories %lld to %lld", (long long)q.offset + 1,
                (long long)(q.offset + rows));
    else
        fputs("no trajectories", f);
    const char *fn[] = {"run", "status", "env", "group"};
    const char *fv[] = {q.run, q.status, q.env, q.group};
    for (size_t i = 0; i < 4; i++) {
        if (!fv[i]) continue;
        fprintf(f, " %s=", fn[i]);
        html_str(f, fv[i]);
    }
    if (q.offset > 0) {
        fputs(" | <a href=\"", f);
        list_href(f, &q, q.offset > q.limit ? q.offset - q.limit : 0);
        fputs("\">previous</a>", f);
    }
    if (more) {
        fputs(" | <a href=\"", f);
        list_href(f, &q, q.offset + q.limit);
        fputs("\">next</a>", f);
    }
    fputs("</p>\n", f);
    return MHD_HTTP_OK;
}

/* A stream that keeps the first cap bytes written and counts the rest (a rendering's page). */
typedef struct cap_buf {
    char *p;
    size_t n, alloc, cap, dropped;
    int nomem;
} cap_buf;

static ssize_t cap_write(void *cookie, const char *buf, size_t size) {
    cap_buf *b = cookie;
    size_t keep = b->n < b->cap ? b->cap - b->n : 0;
    if (keep > size) keep = size;
    if (b->n + keep > b->alloc) {
        size_t a = b->alloc ? b->alloc : 4096;
        while (a < b->n + keep)
            a *= 2;
        char *q = realloc(b->p, a);
        if (!q) {
            b->nomem = 1;
            return -1;
        }
        b->p = q, b->alloc = a;
    }
    memcpy(b->p + b->n, buf, keep);
    b->n += keep;
    b->dropped += size - keep;
    return (ssize_t)size; /* the rest is counted, not an error: the renderer goes on */
}

/* show or stats: a text rendering into <pre>, cut at --max-page-bytes. */
static unsigned page_text(view_server *v, struct MHD_Connection *c, FILE *f, int is_show) {
    static const char *const show_names[] = {"traj", "tokens", "group", "turns", NULL};
    static const char *const stats_names[] = {NULL};
    unsigned code = args_check(v, c, f, is_show ? show_names : stats_names);
    if (code) return code;
    const char *traj = arg(c, "traj");
    replay_show_opts so = {.token_text = cli_replay_token_text}; /* the text column of show */
    if (is_show) {
        const int tok = arg_flag(c, "tokens"), grp = arg_flag(c, "group");
        const char *turns = arg(c, "turns");
        if (tok < 0 || grp < 0)
            return fail_page(f, v->db, MHD_HTTP_BAD_REQUEST,
                             tok < 0 ? "parameter 'tokens': expected 0 or 1"
                                     : "parameter 'group': expected 0 or 1");
        if (!traj)
            return fail_page(f, v->db, MHD_HTTP_BAD_REQUEST,
                             "show needs ?traj=<traj_uid or traj_id>");
        if (turns && replay_show_turns_parse(turns, &so.turn_lo, &so.turn_hi) != ARL_OK)
            return error_page(f, v->db, ARL_ERR_ARG);
        so.tokens = tok || turns; /* turns selects token rows */
        so.group = grp;
    }
    cap_buf b = {.cap = v->max_page};
    FILE *m = fopencookie(&b, "w", (cookie_io_functions_t){.write = cap_write});
    if (!m) return fail_page(f, v->db, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    arl_status s = is_show ? replay_show(v->st, traj, &so, m) : replay_stats(v->st, NULL, 0, m);
    fclose(m);
    if (s == ARL_OK && b.nomem) s = arl_errorf(ARL_ERR_NOMEM, "replay view: out of memory");
    if (s != ARL_OK) {
        free(b.p);
        return error_page(f, v->db, s);
    }
    page_head(f, is_show ? "agentrl replay show" : "agentrl replay stats", v->db);
    if (is_show) {
        fputs("<p><a href=\"/show?traj=", f);
        url_encode(f, traj);
        fputs("\">trajectory</a> | <a href=\"/show?tokens=1&amp;traj=", f);
        url_encode(f, traj);
        fputs("\">tokens</a> | <a href=\"/show?group=1&amp;traj=", f);
        url_encode(f, traj);
        fputs("\">group</a></p>\n", f);
    }
    if (b.dropped) {
        while (b.n > 0 && b.p[b.n - 1] != '\n') /* whole lines */
            b.dropped++, b.n--;
        fprintf(f,
                "<p class=\"note\">cut: the first %zu bytes of %zu (replay view "
                "--max-page-bytes); ",
                b.n, b.n + b.dropped);
        if (is_show && so.tokens) fputs("choose steps with &amp;turns=A:B, or ", f);
        fputs("run <code>agentrl replay ", f);
        fputs(is_show ? "show DB TRAJ" : "stats DB", f);
        if (so.tokens) fputs(" --tokens", f);
        if (so.group) fputs(" --group", f);
        fputs("</code> for the whole text</p>\n", f);
    }
    fputs("<pre>", f);
    html_escape(f, b.p ? b.p : "", b.n);
    fputs("</pre>\n", f);
    free(b.p);
    return MHD_HTTP_OK;
}

/* 0 while the store root is the one opened, else the 410 page's code. */
static unsigned store_check(view_server *v, FILE *f) {
    struct stat sb;
    const int found = stat(v->db, &sb) == 0;
    if (found && sb.st_dev == v->dev && sb.st_ino == v->ino) return 0;
    char msg[600];
    snprintf(msg, sizeof msg,
             "the store %.400s was %s while being served: restart 'agentrl replay view'", v->db,
             found ? "replaced" : "deleted");
    if (!v->gone_warned) {
        fprintf(stderr, "agentrl: warning: replay view: %s\n", msg);
        v->gone_warned = 1;
    }
    return fail_page(f, v->db, MHD_HTTP_GONE, msg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    view_server *v = cls;
    char *page = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&page, &n);
    if (!f) return MHD_NO;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    unsigned code;
    if (!host && strcmp(version, MHD_HTTP_VERSION_1_0)) {
        code = fail_page(f, v->db, MHD_HTTP_BAD_REQUEST, "an HTTP/1.1 request needs a Host header");
    } else if (host && !host_allowed(v, host)) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "refused: Host '%.200s' does not name this server (another site reaching it "
                 "through DNS rebinding?); open http://127.0.0.1:%d/",
                 host, v->port);
        code = fail_page(f, v->db, MHD_HTTP_FORBIDDEN, msg);
    } else if (!get) {
        code = fail_page(f, v->db, MHD_HTTP_METHOD_NOT_ALLOWED, "read-only: GET and HEAD only");
    } else if ((code = store_check(v, f)) != 0) {
    } else if (!strcmp(url, "/")) {
        code = page_list(v, c, f);
    } else if (!strcmp(url, "/show")) {
        code = page_text(v, c, f, 1);
    } else if (!strcmp(url, "/stats")) {
        code = page_text(v, c, f, 0);
    } else {
        code = fail_page(f, v->db, MHD_HTTP_NOT_FOUND, "no such page (/, /show, /stats)");
    }
    fputs("</body></html>\n", f);
    if (fclose(f) != 0) {
        free(page);
        return MHD_NO;
    }
    return send_page(c, code, page, n, code == MHD_HTTP_METHOD_NOT_ALLOWED);
}

/* A request answered (sent, or its connection closed): counted for --max-requests here, after
 * the response went out, so that the last one is not cut off by the stop. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)con_cls;
    (void)toe;
    view_server *v = cls;
    atomic_fetch_add(&v->served, 1);
}

static int is_loopback(const view_server *v) {
    return v->v6 ? IN6_IS_ADDR_LOOPBACK(&v->addr6) : (ntohl(v->addr.s_addr) >> 24) == 127;
}

/* --host: "localhost" (127.0.0.1), an IPv4 address, or an IPv6 one (brackets allowed). */
static int host_parse(view_server *v, const char *host) {
    if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &v->addr) == 1) {
        v->any = v->addr.s_addr == htonl(INADDR_ANY);
        return 1;
    }
    char b[INET6_ADDRSTRLEN + 2];
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof b) {
        memcpy(b, host + 1, n - 2);
        b[n - 2] = 0;
        host = b;
    }
    if (inet_pton(AF_INET6, host, &v->addr6) != 1) return 0;
    v->v6 = 1;
    v->any = IN6_IS_ADDR_UNSPECIFIED(&v->addr6);
    return 1;
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
    view_server v = {.db = o.db, .max_page = (size_t)o.max_page_bytes};
    atomic_init(&v.served, 0);
    if (!host_parse(&v, o.host)) {
        fprintf(stderr, "agentrl: error: --host '%s' is not an IPv4 or IPv6 address\n", o.host);
        arl_options_free(view_tab, nt, &o);
        return ARL_EXIT_USAGE;
    }
    struct stat sb;
    replay_open_opts oo = {.flags = REPLAY_OPEN_READONLY};
    arl_status s = replay_store_open(o.db, &oo, &v.st);
    if (s == ARL_OK && stat(o.db, &sb) != 0)
        s = arl_errorf(ARL_ERR_IO, "replay view: %s: %s", o.db, strerror(errno));
    if (s != ARL_OK) {
        rc = cli_fail(s);
        replay_store_close(v.st);
        arl_options_free(view_tab, nt, &o);
        return rc;
    }
    v.dev = sb.st_dev, v.ino = sb.st_ino;
    /* our own socket: bind's errno names the failure (in use, not an address of this machine) */
    union {
        struct sockaddr sa;
        struct sockaddr_in a4;
        struct sockaddr_in6 a6;
    } a;
    memset(&a, 0, sizeof a);
    if (v.v6) {
        a.a6.sin6_family = AF_INET6;
        a.a6.sin6_port = htons((uint16_t)o.port);
        a.a6.sin6_addr = v.addr6;
    } else {
        a.a4.sin_family = AF_INET;
        a.a4.sin_port = htons((uint16_t)o.port);
        a.a4.sin_addr = v.addr;
    }
    socklen_t alen = v.v6 ? sizeof a.a6 : sizeof a.a4;
    int one = 1, fd = socket(v.v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, &a.sa, alen) != 0 || listen(fd, 64) != 0 || getsockname(fd, &a.sa, &alen) != 0) {
        const int e = errno;
        fprintf(stderr, "agentrl: error: replay view: cannot listen on %s port %lld: %s%s\n",
                o.host, (long long)o.port, strerror(e),
                e == EADDRINUSE ? " (another server has it: choose --port, or --port 0 for a free "
                                  "one)"
                                : "");
        if (fd >= 0) close(fd);
        replay_store_close(v.st);
        arl_options_free(view_tab, nt, &o);
        return ARL_EXIT_FAIL;
    }
    v.port = ntohs(v.v6 ? a.a6.sin6_port : a.a4.sin_port);
    if (!is_loopback(&v))
        fprintf(stderr,
                "agentrl: warning: replay view: --host %s is not a loopback address: anyone who "
                "can reach port %d of this machine can read the store (no authentication)\n",
                o.host, v.port);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* one polling thread: requests are answered one at a time (the store is single-threaded) */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, on_request, &v,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &v,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "agentrl: error: replay view: cannot start the HTTP server on %s port %d\n",
                o.host, v.port);
        close(fd);
        replay_store_close(v.st);
        arl_options_free(view_tab, nt, &o);
        return ARL_EXIT_FAIL;
    }
    char shown[INET6_ADDRSTRLEN + 2] = "";
    if (v.v6) { /* the URL's form of the address: in brackets */
        char t[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &v.addr6, t, sizeof t);
        snprintf(shown, sizeof shown, "[%s]", t);
    }
    printf("serving %s on http://%s:%d/ (Ctrl-C to stop)\n", o.db, v.v6 ? shown : o.host, v.port);
    fflush(stdout);
    while (!view_stop && (o.max_requests <= 0 || atomic_load(&v.served) < o.max_requests)) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d); /* closes fd */
    printf("served %ld requests\n", (long)atomic_load(&v.served));
    replay_store_close(v.st);
    arl_options_free(view_tab, nt, &o);
    return ARL_EXIT_OK;
}
