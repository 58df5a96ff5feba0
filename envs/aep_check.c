/* envs/aep_check.c: the AEP/1 conformance suite (see envs/aep_check.h; spec §15).
 *
 * Raw HTTP through libcurl (the suite needs to send wrong headers and bodies), one keep-alive
 * connection; every response is checked for the headers of §2.2 (check 2) and, when it is an
 * error, for the envelope of §8.1 (check 17); step, create, score and fork responses go through
 * the client's parser (envs/aep_parse.c), whose findings fail the current check and also checks
 * 11 (rewards), 22 (sizes, JSON validity) and 23 (images).  Sessions created by the run are
 * deleted at the end. */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "envs/aep_check.h"
#include "envs/aep_json.h"

static const char *const check_names[ARL_CHECK_COUNT] = {
    "info",          "version header",   "health",          "create",        "create idempotency",
    "group determinism", "step sequence", "step replay",    "steps after the end", "model faults are observations",
    "rewards",       "episode score",    "segment score",   "fork",          "delete",
    "unknown session", "envelope",       "malformed requests", "deadlines",  "capacity",
    "concurrency",   "size limits",      "images",          "context reset", "idle keep-alive",
    "unicode round trip"};

typedef struct resp {
    int status;  /* 0: no response (transport error) */
    char *body;
    size_t len;
    char ctype[128];
    char version[32];
    int has_version;
    long long retry_after; /* -1: absent */
    char err[256];         /* transport error */
    double ms;
} resp;

typedef struct chk {
    const arl_check_config *cfg;
    arl_check_report *rep;
    char base[600];
    CURL *h;
    int cur; /* current check (1-based) */
    arl_env_info info;
    int have_info;
    json_t *script, *task, *options, *actions, *bad_args, *slow, *reset_action;
    json_t *answer_action; /* derived scripts: repeated up to two more times */
    char run[64];
    int traj_n;
    char **sids; /* sessions to delete at the end */
    int n_sids, cap_sids;
    int64_t step_deadline;
    int images_seen;
    int reachable;
    pthread_mutex_t mu;
} chk;

/* ---- verdicts ---- */

static void fail_at(chk *k, int id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(chk *k, int id, const char *fmt, ...) {
    arl_check_item *it = &k->rep->items[id - 1];
    pthread_mutex_lock(&k->mu);
    if (it->result != ARL_CHECK_FAIL) {
        it->result = ARL_CHECK_FAIL;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->message, sizeof it->message, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&k->mu);
}
#define FAIL(...) fail_at(k, k->cur, __VA_ARGS__)

static void warn_at(chk *k, int id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void warn_at(chk *k, int id, const char *fmt, ...) {
    arl_check_item *it = &k->rep->items[id - 1];
    if (it->result == ARL_CHECK_PASS) {
        it->result = ARL_CHECK_WARN;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->message, sizeof it->message, fmt, ap);
        va_end(ap);
    }
}

static void skip_at(chk *k, int id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void skip_at(chk *k, int id, const char *fmt, ...) {
    arl_check_item *it = &k->rep->items[id - 1];
    if (it->result == ARL_CHECK_PASS) {
        it->result = ARL_CHECK_SKIP;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->message, sizeof it->message, fmt, ap);
        va_end(ap);
    }
}

/* ---- HTTP ---- */

enum {
    H_NO_VERSION = 1,
    H_VERSION_2 = 2,
    H_EXPECT = 4,
    H_NO_CTYPE = 8,
};

/* p, noting a failed allocation of this thread (arl_nomem_note) when it is NULL: every
 * allocation of the checker that fails is counted, so that arl_aep_check_run ends in
 * ARL_ERR_NOMEM instead of a verdict made of it (a request sent without its body or headers, a
 * response cut short, a part of a check skipped).  Worker threads carry their count back
 * (conc_arg.nomem). */
static void *noted(void *p) {
    if (!p) arl_nomem_note();
    return p;
}

static size_t on_write(char *p, size_t sz, size_t n, void *ud) {
    resp *r = ud;
    size_t m = sz * n;
    if (r->len + m > ((size_t)64 << 20)) return 0;
    char *b = noted(realloc(r->body, r->len + m + 1));
    if (!b) return 0;
    r->body = b;
    memcpy(r->body + r->len, p, m);
    r->len += m;
    r->body[r->len] = 0;
    return m;
}

static size_t on_hdr(char *buf, size_t sz, size_t n, void *ud) {
    resp *r = ud;
    size_t m = sz * n;
    if (m >= 5 && !strncmp(buf, "HTTP/", 5)) {
        r->ctype[0] = 0;
        r->has_version = 0;
        r->retry_after = -1;
        return m;
    }
    const char *colon = memchr(buf, ':', m);
    if (!colon) return m;
    size_t kl = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vl = m - kl - 1;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    char val[128];
    if (vl >= sizeof val) vl = sizeof val - 1;
    memcpy(val, v, vl);
    val[vl] = 0;
    if (kl == 12 && !strncasecmp(buf, "Content-Type", 12)) snprintf(r->ctype, sizeof r->ctype, "%s", val);
    if (kl == 11 && !strncasecmp(buf, "AEP-Version", 11)) {
        snprintf(r->version, sizeof r->version, "%s", val);
        r->has_version = 1;
    }
    if (kl == 11 && !strncasecmp(buf, "Retry-After", 11)) {
        char *end;
        long long x = strtoll(val, &end, 10);
        r->retry_after = end != val && !*end ? x : -2;
    }
    return m;
}

static void resp_free(resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

static const int status_set[] = {200, 201, 204, 400, 404, 409, 410, 413, 422, 500, 501, 502, 503, 504};

/* §8.1 envelope and §8.3 properties (check 17). */
static void check_error_response(chk *k, const resp *r, const char *what) {
    int known = 0;
    for (size_t i = 0; i < sizeof status_set / sizeof *status_set; i++)
        if (status_set[i] == r->status) known = 1;
    if (!known) {
        fail_at(k, 17, "%s: HTTP %d is not a status of §2.1", what, r->status);
        return;
    }
    char why[256];
    json_t *v = aep_ctype_is_json(r->ctype) ? aep_json_loads(r->body ? r->body : "", r->len, 32, why, sizeof why) : NULL;
    json_t *e = json_object_get(v, "error");
    const json_t *code = json_object_get(e, "code"), *msg = json_object_get(e, "message");
    const json_t *rt = json_object_get(e, "retryable"), *at = json_object_get(e, "attribution");
    const json_t *ra = json_object_get(e, "retry_after_ms");
    char env_why[300];
    if (!v) {
        fail_at(k, 17, "%s: HTTP %d without a valid error envelope (%s)", what, r->status,
                aep_ctype_is_json(r->ctype) ? why : "its Content-Type is not application/json");
    } else if (aep_envelope_check(v, r->status, env_why, sizeof env_why)) {
        fail_at(k, 17, "%s: HTTP %d without a valid error envelope (%s)", what, r->status, env_why);
    } else if (json_string_length(msg) > 4096) {
        fail_at(k, 17, "%s: error message over 4 KiB", what);
    } else {
        arl_env_errcode c = arl_env_errcode_parse(json_string_value(code));
        if (c != ARL_ENV_E_OTHER && c < ARL_ENV_E_TRANSPORT_ERROR) {
            if (json_is_true(rt) != arl_env_errcode_retryable(c))
                fail_at(k, 17, "%s: %s with retryable %s (§8.3)", what, json_string_value(code),
                        json_is_true(rt) ? "true" : "false");
            if (arl_env_attribution_parse(json_string_value(at)) != (int)arl_env_errcode_attribution(c))
                fail_at(k, 17, "%s: %s with attribution '%s' (§8.3: '%s')", what, json_string_value(code),
                        json_string_value(at), arl_env_attribution_str(arl_env_errcode_attribution(c)));
            if (arl_env_errcode_http(c) != r->status)
                fail_at(k, 17, "%s: %s with HTTP %d (§8.3: %d)", what, json_string_value(code), r->status,
                        arl_env_errcode_http(c));
        } else if (c == ARL_ENV_E_X_UNKNOWN_ROUTE) {
            if (r->status != 404 || json_is_true(rt) || strcmp(json_string_value(at), "client"))
                fail_at(k, 17, "%s: X_UNKNOWN_ROUTE must be 404, not retryable, attribution client", what);
        }
        if (r->status == 503) {
            long long want = json_is_integer(ra) ? (json_integer_value(ra) + 999) / 1000 : -1;
            if (r->retry_after < 0)
                fail_at(k, 17, "%s: 503 without a Retry-After header", what);
            else if (want >= 0 && r->retry_after != want)
                fail_at(k, 17, "%s: Retry-After %lld != ceil(retry_after_ms / 1000) = %lld", what, r->retry_after, want);
        }
    }
    if (v) json_decref(v);
}

/* One request; records header and envelope findings. */
static int http(chk *k, CURL *h, const char *method, const char *path, const char *body, size_t blen, int flags,
                resp *r) {
    memset(r, 0, sizeof *r);
    r->retry_after = -1;
    char url[1200];
    snprintf(url, sizeof url, "%s%s", k->base, path);
    /* curl_slist_append returns NULL out of memory (the list so far stays allocated) */
    struct curl_slist *hl = NULL, *hn;
#define HDR(text)                                                                                  \
    do {                                                                                           \
        if ((hn = noted(curl_slist_append(hl, (text)))) != NULL) hl = hn;                          \
    } while (0)
    if (!(flags & H_NO_VERSION)) HDR(flags & H_VERSION_2 ? "AEP-Version: 2" : "AEP-Version: 1");
    HDR("Accept: application/json");
    if (body && !(flags & H_NO_CTYPE)) HDR("Content-Type: application/json; charset=utf-8");
    HDR(flags & H_EXPECT ? "Expect: 100-continue" : "Expect:");
    if (k->cfg->token) {
        char a[600];
        snprintf(a, sizeof a, "Authorization: Bearer %s", k->cfg->token);
        HDR(a);
    }
#undef HDR
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        if (strcmp(method, "GET")) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_hdr);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(k->step_deadline + 10000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 5000L);
    int64_t t0 = aep_now_us();
    CURLcode cc = curl_easy_perform(h);
    r->ms = (double)(aep_now_us() - t0) / 1000.0;
    curl_slist_free_all(hl);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (cc == CURLE_OUT_OF_MEMORY) arl_nomem_note();
    if (cc != CURLE_OK && !(code == 413 && (flags & H_EXPECT))) {
        snprintf(r->err, sizeof r->err, "%s %s: %s", method, path, curl_easy_strerror(cc));
        r->status = 0;
        if (k->cfg->verbose) fprintf(stderr, "aep check: %s\n", r->err);
        return 0;
    }
    r->status = (int)code;
    if (k->cfg->verbose)
        fprintf(stderr, "aep check: [%d] %s %s -> %d (%zu bytes, %.1f ms)\n", k->cur, method, path, r->status, r->len,
                r->ms);
    char what[300];
    snprintf(what, sizeof what, "%s %.200s", method, path);
    if (!r->has_version || strcmp(r->version, "1")) fail_at(k, 2, "%s: response without AEP-Version: 1", what);
    if (r->status != 204 && r->len > 0 && !aep_ctype_is_json(r->ctype))
        fail_at(k, 2, "%s: body with Content-Type '%s'", what, r->ctype);
    if (r->status >= 300) check_error_response(k, r, what);
    return r->status;
}

static const char *resp_code(const resp *r) {
    static __thread char code[64];
    code[0] = 0;
    json_t *v = r->body ? arl_json_loadb(r->body, r->len, 0, NULL) : NULL;
    const json_t *c = json_object_get(json_object_get(v, "error"), "code");
    if (json_is_string(c)) snprintf(code, sizeof code, "%s", json_string_value(c));
    if (v) json_decref(v);
    return code;
}

/* The error envelope's message as ` ("...")`, cut to 160 bytes at a UTF-8 character boundary, so
 * that a failure shows why the server refused; "" when the body has none.  Valid until the
 * calling thread's next call. */
static const char *resp_why(const resp *r) {
    static __thread char why[200];
    why[0] = 0;
    json_t *v = r->body && r->status >= 300 ? arl_json_loadb(r->body, r->len, 0, NULL) : NULL;
    const char *m = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    if (m && *m) {
        size_t n = strlen(m);
        if (n > 160) {
            n = 160;
            while (n > 0 && ((unsigned char)m[n] & 0xC0) == 0x80)
                n--;
        }
        snprintf(why, sizeof why, " (\"%.*s%s\")", (int)n, m, n < strlen(m) ? "..." : "");
    }
    if (v) json_decref(v);
    return why;
}

/* Expect status and (for errors) code; returns 1 if matched, else fails the current check. */
static int expect(chk *k, const resp *r, int status, const char *code, const char *what) {
    if (r->status == 0) {
        FAIL("%s: no response (%s)", what, r->err);
        return 0;
    }
    if (r->status != status || (code && strcmp(resp_code(r), code))) {
        FAIL("%s: expected %d%s%s, got %d%s%s%s", what, status, code ? " " : "", code ? code : "",
             r->status, r->status >= 300 ? " " : "", r->status >= 300 ? resp_code(r) : "",
             resp_why(r));
        return 0;
    }
    return 1;
}

/* Validate a success response with the client's parser; routes findings to 11, 22, 23. */
static int validate(chk *k, const resp *r, const aep_expect *x, arl_env_result *res, arl_env_score_result *sr) {
    arl_env_error e;
    memset(&e, 0, sizeof e);
    arl_env_result tmp;
    arl_env_score_result stmp;
    memset(&tmp, 0, sizeof tmp);
    memset(&stmp, 0, sizeof stmp);
    aep_expect xx = *x;
    xx.info = k->have_info ? &k->info : NULL;
    aep_response_parse(&xx, r->status, r->ctype, r->body, r->len, &e, res ? res : &tmp, sr ? sr : &stmp, NULL, NULL,
                       NULL);
    int ok = e.code == ARL_ENV_E_NONE;
    if (!ok) {
        const char *v = e.violation[0] ? e.violation : e.message;
        FAIL("%s: %s", e.code_str, v);
        if (e.code == ARL_ENV_E_REWARD_OUT_OF_RANGE) fail_at(k, 11, "%s", v);
        if (e.code == ARL_ENV_E_RESPONSE_TOO_LARGE || strstr(v, "invalid JSON") || strstr(v, "deeper"))
            fail_at(k, 22, "%s: %s", e.code_str, v);
        if (strstr(v, "/image")) fail_at(k, 23, "%s", v);
    } else {
        const arl_env_result *rr = res ? res : &tmp;
        for (int32_t i = 0; i < rr->obs.n_messages; i++)
            for (int32_t j = 0; j < rr->obs.messages[i].n_parts; j++)
                if (rr->obs.messages[i].parts[j].type == ARL_ENV_PART_IMAGE) k->images_seen++;
    }
    arl_env_error_clear(&e);
    arl_env_result_clear(&tmp);
    arl_env_score_result_clear(&stmp);
    return ok;
}

/* ---- sessions and actions ---- */

static void remember_sid(chk *k, const char *sid) {
    if (k->n_sids == k->cap_sids) {
        int cap = k->cap_sids ? 2 * k->cap_sids : 64;
        char **p = noted(realloc(k->sids, (size_t)cap * sizeof *p));
        if (!p) return;
        k->sids = p;
        k->cap_sids = cap;
    }
    k->sids[k->n_sids] = noted(strdup(sid));
    if (k->sids[k->n_sids]) k->n_sids++;
}

static void new_traj(chk *k, char *buf, size_t cap) { snprintf(buf, cap, "%s/t%d", k->run, ++k->traj_n); }

static char *create_body(chk *k, const char *traj, const json_t *task, const json_t *extra_key, size_t *len) {
    json_t *o = json_object();
    if (!o) return NULL; /* (counted by the watch of jansson) */
    json_object_set_new(o, "trajectory_id", json_string(traj));
    json_object_set_new(o, "group_id", json_string(k->run));
    json_object_set(o, "task", (json_t *)task);
    if (k->options) json_object_set(o, "options", k->options);
    json_object_set_new(o, "deadline_ms", json_integer(120000));
    if (extra_key) json_object_set(o, "x_aep_check_extra", (json_t *)extra_key);
    char *s = noted(aep_json_dumps(o, len));
    json_decref(o);
    return s;
}

/* Create a session; returns 1 with sid on 201 (validated), else fails the current check. */
static int create(chk *k, const char *traj, const json_t *task, char *sid, size_t cap, resp *out) {
    size_t len;
    char *b = create_body(k, traj, task ? task : k->task, NULL, &len);
    resp r;
    http(k, k->h, "POST", "/sessions", b, len, 0, &r);
    free(b);
    int ok = expect(k, &r, 201, NULL, "create");
    if (ok) {
        aep_expect x = {.endpoint = ARL_ENV_EP_CREATE, .trajectory_id = traj};
        arl_env_result res;
        memset(&res, 0, sizeof res);
        ok = validate(k, &r, &x, &res, NULL);
        if (ok) {
            snprintf(sid, cap, "%s", res.session_id);
            remember_sid(k, sid);
        }
        arl_env_result_clear(&res);
    }
    if (out)
        *out = r;
    else
        resp_free(&r);
    return ok;
}

/* Rewrite call_<x>_<n> ids to call_<step>_<n> in a copy of the action. */
static void rewrite_id(json_t *obj, int64_t step) {
    const char *id = json_string_value(json_object_get(obj, "id"));
    if (!id || strncmp(id, "call_", 5)) return;
    const char *p = id + 5;
    const char *us = strchr(p, '_');
    if (!us || us == p) return;
    int digits = 1;
    for (const char *q = p; q < us; q++)
        if (*q < '0' || *q > '9') digits = 0;
    if (!digits && strncmp(p, "<step>", 6)) return;
    for (const char *q = us + 1; *q; q++)
        if (*q < '0' || *q > '9') return;
    if (!us[1]) return;
    char nid[128];
    snprintf(nid, sizeof nid, "call_%lld_%s", (long long)step, us + 1);
    json_object_set_new(obj, "id", json_string(nid));
}

static json_t *instantiate(const json_t *action, int64_t step) {
    json_t *a = json_deep_copy(action);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(a, "tool_calls"), i, v) rewrite_id(v, step);
    json_array_foreach(json_object_get(a, "parse_errors"), i, v) rewrite_id(v, step);
    return a;
}

static char *step_body(chk *k, int64_t idx, const json_t *action, int64_t deadline, size_t *len) {
    json_t *o = json_object();
    if (!o) return NULL; /* (counted by the watch of jansson) */
    json_object_set_new(o, "step_index", json_integer(idx));
    json_object_set_new(o, "action", instantiate(action, idx));
    json_object_set_new(o, "deadline_ms", json_integer(deadline > 0 ? deadline : k->step_deadline));
    char *s = noted(aep_json_dumps(o, len));
    json_decref(o);
    return s;
}

/* The call and parse-error ids of the action as sent at step idx. */
typedef struct ids {
    char *v[256];
    int nc, np;
} ids;
static void ids_of(const json_t *action, int64_t idx, ids *d) {
    json_t *a = instantiate(action, idx);
    d->nc = d->np = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(a, "tool_calls"), i, c) if (d->nc < 128) {
        const char *s = json_string_value(json_object_get(c, "id"));
        d->v[d->nc++] = noted(strdup(s ? s : ""));
    }
    json_array_foreach(json_object_get(a, "parse_errors"), i, c) if (d->np < 128) {
        const char *s = json_string_value(json_object_get(c, "id"));
        d->v[d->nc + d->np++] = noted(strdup(s ? s : ""));
    }
    json_decref(a);
}
static void ids_free(ids *d) {
    for (int i = 0; i < d->nc + d->np; i++) free(d->v[i]);
}

/* Step and validate; returns the HTTP status, fills res on a valid 200. */
static int step(chk *k, const char *sid, int64_t idx, const json_t *action, int64_t deadline, resp *r,
                arl_env_result *res) {
    char path[400];
    snprintf(path, sizeof path, "/sessions/%s/step", sid);
    size_t len;
    char *b = step_body(k, idx, action, deadline, &len);
    http(k, k->h, "POST", path, b, len, 0, r);
    free(b);
    if (r->status == 200) {
        ids d;
        ids_of(action, idx, &d);
        aep_expect x = {.endpoint = ARL_ENV_EP_STEP, .step_index = idx, .call_ids = (const char *const *)d.v,
                        .n_call_ids = d.nc, .perr_ids = (const char *const *)(d.v + d.nc), .n_perr_ids = d.np};
        arl_env_result tmp;
        memset(&tmp, 0, sizeof tmp);
        if (!validate(k, r, &x, res ? res : &tmp, NULL)) r->status = -200; /* invalid */
        arl_env_result_clear(&tmp);
        ids_free(&d);
    }
    return r->status;
}

static int64_t get_step_index(chk *k, const char *sid, char *status_out, size_t cap) {
    char path[400];
    snprintf(path, sizeof path, "/sessions/%s", sid);
    resp r;
    http(k, k->h, "GET", path, NULL, 0, 0, &r);
    int64_t s = -1;
    if (r.status == 200) {
        aep_expect x = {.endpoint = ARL_ENV_EP_GET};
        if (validate(k, &r, &x, NULL, NULL)) {
            json_t *v = arl_json_loadb(r.body, r.len, 0, NULL);
            s = json_integer_value(json_object_get(v, "step_index"));
            if (status_out) snprintf(status_out, cap, "%s", json_string_value(json_object_get(v, "status")) ?: "");
            if (v) json_decref(v);
        }
    } else {
        FAIL("GET %s: HTTP %d", path, r.status);
    }
    resp_free(&r);
    return s;
}

static void del(chk *k, const char *sid) {
    char path[400];
    snprintf(path, sizeof path, "/sessions/%s?reason=aborted", sid);
    resp r;
    http(k, k->h, "DELETE", path, NULL, 0, 0, &r);
    resp_free(&r);
}

static int64_t health_active(chk *k) {
    resp r;
    http(k, k->h, "GET", "/health", NULL, 0, 0, &r);
    int64_t a = -1;
    if (r.status == 200) {
        json_t *v = arl_json_loadb(r.body, r.len, 0, NULL);
        if (json_is_integer(json_object_get(v, "active_sessions"))) a = json_integer_value(json_object_get(v, "active_sessions"));
        if (v) json_decref(v);
    }
    resp_free(&r);
    return a;
}

static int span_equal(const resp *a, const resp *b, const char *member) {
    size_t oa, la, ob, lb;
    if (!aep_json_member_span(a->body, a->len, member, &oa, &la)) return 0;
    if (!aep_json_member_span(b->body, b->len, member, &ob, &lb)) return 0;
    return la == lb && !memcmp(a->body + oa, b->body + ob, la);
}

/* ---- script ---- */

static int name_is_answer(const char *n) {
    static const char *const words[] = {"answer", "submit", "final", "finish"};
    for (int i = 0; i < 4; i++)
        if (strcasestr(n, words[i])) return 1;
    return 0;
}

json_t *arl_aep_check_synth(const json_t *schema) {
    if (!json_is_object(schema)) return json_string("42");
    const json_t *en = json_object_get(schema, "enum");
    if (json_is_array(en) && json_array_size(en) > 0) return json_deep_copy(json_array_get(en, 0));
    const json_t *def = json_object_get(schema, "default");
    if (def) return json_deep_copy(def);
    const json_t *any = json_object_get(schema, "anyOf");
    if (json_is_array(any) && json_array_size(any) > 0) return arl_aep_check_synth(json_array_get(any, 0));
    const json_t *ty = json_object_get(schema, "type");
    const char *t = json_is_string(ty) ? json_string_value(ty)
                    : json_is_array(ty) && json_is_string(json_array_get(ty, 0)) ? json_string_value(json_array_get(ty, 0))
                                                                                 : "string";
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        double x = 42;
        const json_t *mn = json_object_get(schema, "minimum"), *mx = json_object_get(schema, "maximum");
        if (json_is_number(mn) && x < json_number_value(mn)) x = json_number_value(mn);
        if (json_is_number(mx) && x > json_number_value(mx)) x = json_number_value(mx);
        if (!strcmp(t, "integer")) {
            double c = ceil(x);
            if (json_is_number(mx) && c > json_number_value(mx)) c = floor(x);
            return json_integer((json_int_t)c);
        }
        return x == floor(x) ? json_integer((json_int_t)x) : json_real(x);
    }
    if (!strcmp(t, "boolean")) return json_true();
    if (!strcmp(t, "array")) return json_array();
    if (!strcmp(t, "null")) return json_null();
    if (!strcmp(t, "object")) {
        json_t *o = json_object();
        const json_t *props = json_object_get(schema, "properties");
        size_t i;
        const json_t *rq;
        json_array_foreach(json_object_get(schema, "required"), i, rq) {
            if (!json_is_string(rq)) continue;
            json_object_set_new(o, json_string_value(rq), arl_aep_check_synth(json_object_get(props, json_string_value(rq))));
        }
        return o;
    }
    /* string: "42" fitted to minLength / maxLength */
    char s[256] = "42";
    const json_t *mn = json_object_get(schema, "minLength"), *mx = json_object_get(schema, "maxLength");
    size_t want_min = json_is_integer(mn) && json_integer_value(mn) > 0 ? (size_t)json_integer_value(mn) : 0;
    if (want_min > 255) want_min = 255;
    size_t n = 2;
    while (n < want_min) s[n++] = '2';
    s[n] = 0;
    if (json_is_integer(mx) && json_integer_value(mx) >= 0 && (size_t)json_integer_value(mx) < n)
        s[json_integer_value(mx)] = 0;
    return json_string(s);
}

static json_t *call_action(const char *name, json_t *args) {
    json_t *a = json_pack("{s:s,s:n,s:[{s:s,s:s,s:o}],s:s,s:[],s:s,s:i}", "content", "", "reasoning", "tool_calls", "id",
                          "call_<step>_0", "name", name, "arguments", args, "parse_status", "ok", "parse_errors",
                          "finish_reason", "tool_calls", "num_tokens", 8);
    return a;
}

static void derive_script(chk *k) {
    k->task = json_pack("{s:s,s:i,s:{}}", "id", "aep-check-task", "seed", 7, "data");
    k->actions = json_array();
    const json_t *tools = k->info.tools;
    const json_t *first = NULL, *answer = NULL;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (!n) continue;
        if (!name_is_answer(n) && !first) first = t;
        if (name_is_answer(n) && !answer) answer = t;
    }
    if (first) {
        const json_t *f = json_object_get(first, "function");
        const json_t *params = json_object_get(f, "parameters");
        const char *name = json_string_value(json_object_get(f, "name"));
        json_array_append_new(k->actions, call_action(name, arl_aep_check_synth(params)));
        /* bad args: without its first required argument */
        const json_t *req0 = json_array_get(json_object_get(params, "required"), 0);
        if (json_is_string(req0)) {
            json_t *args = arl_aep_check_synth(params);
            json_object_del(args, json_string_value(req0));
            k->bad_args = call_action(name, args);
        }
    }
    if (answer) {
        const json_t *f = json_object_get(answer, "function");
        k->answer_action = call_action(json_string_value(json_object_get(f, "name")),
                                       arl_aep_check_synth(json_object_get(f, "parameters")));
    } else {
        k->answer_action = json_pack("{s:s,s:n,s:[],s:s,s:[],s:s,s:i}", "content", "42", "reasoning", "tool_calls",
                                     "parse_status", "no_tool_call", "parse_errors", "finish_reason", "stop", "num_tokens", 2);
    }
    json_array_append(k->actions, k->answer_action);
}

static arl_status load_script(chk *k, const char *text) {
    char why[300];
    const unsigned long n0 = arl_nomem_count();
    json_t *s = aep_json_loads(text, strlen(text), 32, why, sizeof why);
    if (!s && arl_nomem_count() != n0) /* this process's, not the script's */
        return arl_errorf(ARL_ERR_NOMEM, "conformance script: out of memory");
    if (!s) return arl_errorf(ARL_ERR_ARG, "conformance script: %s", why);
    k->script = s;
    if (!json_is_object(s)) return arl_errorf(ARL_ERR_ARG, "conformance script: expected a JSON object");
    const json_t *task = json_object_get(s, "task");
    int64_t seed;
    if (!json_is_object(task) || !json_is_string(json_object_get(task, "id")) ||
        !aep_json_get_index(task, "seed", &seed) || !json_is_object(json_object_get(task, "data")))
        return arl_errorf(ARL_ERR_ARG, "conformance script: 'task' must be {\"id\": string, \"seed\": integer >= 0, "
                                       "\"data\": object}");
    k->task = json_incref((json_t *)task);
    const json_t *opts = json_object_get(s, "options");
    if (opts && !json_is_null(opts)) {
        if (!json_is_object(opts)) return arl_errorf(ARL_ERR_ARG, "conformance script: 'options' must be an object");
        k->options = json_incref((json_t *)opts);
    }
    const json_t *acts = json_object_get(s, "actions");
    if (!json_is_array(acts) || json_array_size(acts) == 0)
        return arl_errorf(ARL_ERR_ARG, "conformance script: 'actions' must be a non-empty array of actions");
    k->actions = json_incref((json_t *)acts);
    struct {
        const char *key;
        json_t **dst;
    } opt[] = {{"bad_args_action", &k->bad_args}, {"slow_action", &k->slow}, {"reset_action", &k->reset_action}};
    for (int i = 0; i < 3; i++) {
        const json_t *a = json_object_get(s, opt[i].key);
        if (a && !json_is_null(a)) *opt[i].dst = json_incref((json_t *)a);
    }
    /* every action must be valid per §4.5 once instantiated */
    size_t n = json_array_size(acts);
    for (size_t i = 0; i < n + 3; i++) {
        const json_t *a = i < n ? json_array_get(acts, i) : *opt[i - n].dst;
        if (!a) continue;
        json_t *inst = instantiate(a, 1);
        arl_env_action act;
        int bad = aep_action_from_json(inst, &act, why, sizeof why);
        json_decref(inst);
        if (bad) {
            if (i < n) return arl_errorf(ARL_ERR_ARG, "conformance script: actions[%zu]: %s", i, why);
            return arl_errorf(ARL_ERR_ARG, "conformance script: %s: %s", opt[i - n].key, why);
        }
        arl_env_action_clear(&act);
    }
    return ARL_OK;
}

/* ---- the checks ---- */

static void c_version(chk *k) {
    k->cur = 2;
    resp r;
    http(k, k->h, "GET", "/info", NULL, 0, H_NO_VERSION, &r);
    expect(k, &r, 400, "UNSUPPORTED_VERSION", "GET /info without AEP-Version");
    resp_free(&r);
    size_t len;
    char traj[300];
    new_traj(k, traj, sizeof traj);
    char *b = create_body(k, traj, k->task, NULL, &len);
    http(k, k->h, "POST", "/sessions", b, len, H_VERSION_2, &r);
    free(b);
    expect(k, &r, 400, "UNSUPPORTED_VERSION", "POST /sessions with AEP-Version: 2");
    resp_free(&r);
    http(k, k->h, "DELETE", "/sessions/aep-check-none?reason=aborted", NULL, 0, H_NO_VERSION, &r);
    expect(k, &r, 400, "UNSUPPORTED_VERSION", "DELETE without AEP-Version");
    resp_free(&r);
    http(k, k->h, "GET", "/no-such-route", NULL, 0, 0, &r);
    k->cur = 17;
    expect(k, &r, 404, "X_UNKNOWN_ROUTE", "GET /aep/v1/no-such-route");
    resp_free(&r);
}

static void c_health(chk *k) {
    k->cur = 3;
    resp r;
    http(k, k->h, "GET", "/health", NULL, 0, 0, &r);
    if (expect(k, &r, 200, NULL, "GET /health")) {
        aep_expect x = {.endpoint = ARL_ENV_EP_HEALTH};
        if (validate(k, &r, &x, NULL, NULL)) {
            json_t *v = arl_json_loadb(r.body, r.len, 0, NULL);
            int64_t m = json_integer_value(json_object_get(v, "max_sessions"));
            if (m > k->info.limits.max_sessions)
                FAIL("max_sessions %lld exceeds /info limits.max_sessions %lld", (long long)m,
                     (long long)k->info.limits.max_sessions);
            else if (m != k->info.limits.max_sessions)
                warn_at(k, 3, "max_sessions %lld differs from /info limits.max_sessions %lld (SHOULD)", (long long)m,
                        (long long)k->info.limits.max_sessions);
            if (v) json_decref(v);
        }
    }
    resp_free(&r);
}

typedef struct seq {
    char sid[200];
    int64_t last;   /* last applied step */
    int ended;
    resp last_resp; /* body of the last step */
    json_t *last_action;
    resp create_resp;
} seq;

/* The action of step i + 1 in a script run: the script's i-th action; past the end of a derived
 * script, its answer action (repeated up to two more times, §15.1); NULL past that. */
static const json_t *script_action(const chk *k, size_t i) {
    size_t n = json_array_size(k->actions);
    if (i < n) return json_array_get(k->actions, i);
    return !k->script && i < n + 2 ? k->answer_action : NULL;
}

/* Run the script's actions on sid (steps from 1); returns the number of steps applied. */
static int run_actions(chk *k, seq *q, int strict_end, resp *bodies, int max_bodies) {
    size_t n = json_array_size(k->actions);
    int64_t idx = 0;
    for (size_t i = 0; i < n + 2; i++) {
        const json_t *a =
            script_action(k, i); /* derived: the answer repeated up to two more times */
        if (!a || (i >= n && q->ended)) break;
        resp r;
        arl_env_result res;
        memset(&res, 0, sizeof res);
        idx++;
        int st = step(k, q->sid, idx, a, 0, &r, &res);
        if (st != 200) {
            if (st != -200) expect(k, &r, 200, NULL, "step");
            resp_free(&r);
            arl_env_result_clear(&res);
            return (int)idx - 1;
        }
        q->last = idx;
        resp_free(&q->last_resp);
        q->last_resp = r;
        if (q->last_action) json_decref(q->last_action);
        q->last_action = json_incref((json_t *)a);
        if (bodies && idx - 1 < max_bodies) {
            bodies[idx - 1].body = noted(malloc(r.len + 1));
            if (bodies[idx - 1].body) {
                memcpy(bodies[idx - 1].body, r.body, r.len + 1);
                bodies[idx - 1].len = r.len;
                bodies[idx - 1].status = 200;
            }
        }
        int ended = res.terminated || res.truncated;
        if (ended) {
            q->ended = 1;
            if (strict_end) {
                if (res.truncated && !res.terminated)
                    FAIL("step %lld ended the episode with truncated, not terminated", (long long)idx);
                else if (k->script && i + 1 < n)
                    FAIL("step %lld ended the episode before the script's last action (%zu actions)", (long long)idx, n);
            }
            arl_env_result_clear(&res);
            break;
        }
        arl_env_result_clear(&res);
    }
    if (strict_end && !q->ended && k->script)
        FAIL("the script's actions did not reach terminated: true (%lld steps)", (long long)idx);
    else if (strict_end && !q->ended) /* the user learns what was sent, and what to do */
        FAIL("the derived script (task data {}, %s%s up to 3 times, spec §15.1) did not reach "
             "terminated: true "
             "(%lld steps): give a conformance script, --script FILE (envs/examples/README.md §3)",
             json_array_size(k->actions) > 1 ? "a call of the first tool, then " : "",
             json_array_size(json_object_get(k->answer_action, "tool_calls"))
                 ? "the answer tool's call"
                 : "a plain-text turn",
             (long long)idx);
    return (int)q->last;
}

static void c_main_sequence(chk *k) {
    seq a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    char traj[300], traj2[300];
    /* 4 create */
    k->cur = 4;
    new_traj(k, traj, sizeof traj);
    if (!create(k, traj, k->task, a.sid, sizeof a.sid, &a.create_resp)) {
        const char *why = "create failed (check 4)";
        for (int id = 5; id <= 9; id++) fail_at(k, id, "%s", why);
        fail_at(k, 12, "%s", why);
        fail_at(k, 15, "%s", why);
        resp_free(&a.create_resp);
        return;
    }
    {
        json_t *v = arl_json_loadb(a.create_resp.body, a.create_resp.len, 0, NULL);
        json_t *msgs = json_object_get(json_object_get(v, "observation"), "messages");
        if (json_array_size(msgs) < 1) FAIL("the initial observation has no message");
        if (v) json_decref(v);
    }
    /* 5 create idempotency */
    k->cur = 5;
    int64_t act0 = health_active(k);
    size_t len;
    json_t *saved_opts = k->options;
    char *body = create_body(k, traj, k->task, NULL, &len);
    resp r;
    http(k, k->h, "POST", "/sessions", body, len, 0, &r);
    free(body);
    if (expect(k, &r, 200, NULL, "repeated create")) {
        if (r.len != a.create_resp.len || memcmp(r.body, a.create_resp.body, r.len))
            FAIL("the repeated create's body differs from the 201 body");
    }
    resp_free(&r);
    int64_t act1 = health_active(k);
    if (act0 >= 0 && act1 >= 0 && act1 != act0)
        FAIL("active_sessions grew from %lld to %lld on a repeated create", (long long)act0, (long long)act1);
    json_t *t2 = json_deep_copy(k->task);
    int64_t seed = 0;
    aep_json_get_index(t2, "seed", &seed);
    json_object_set_new(t2, "seed", json_integer(seed + 1));
    body = create_body(k, traj, t2, NULL, &len);
    json_decref(t2);
    http(k, k->h, "POST", "/sessions", body, len, 0, &r);
    free(body);
    expect(k, &r, 409, "TRAJECTORY_CONFLICT", "create with another task.seed under the same trajectory_id");
    resp_free(&r);
    k->options = saved_opts;
    /* 6 group determinism */
    k->cur = 6;
    new_traj(k, traj2, sizeof traj2);
    if (create(k, traj2, k->task, b.sid, sizeof b.sid, &b.create_resp)) {
        if (!span_equal(&a.create_resp, &b.create_resp, "observation"))
            FAIL("two sessions of the same task returned different observation members");
    }
    /* 7 step sequence */
    k->cur = 7;
    run_actions(k, &a, 1, NULL, 0);
    /* 8 step replay */
    k->cur = 8;
    if (a.last >= 1) {
        resp r2;
        step(k, a.sid, a.last, a.last_action, 0, &r2, NULL);
        if (expect(k, &r2, 200, NULL, "resent last step") &&
            (r2.len != a.last_resp.len || memcmp(r2.body, a.last_resp.body, r2.len)))
            FAIL("the resent last step's body differs from the original%s", a.ended ? " (after the end)" : "");
        resp_free(&r2);
        json_t *other = json_pack("{s:s,s:n,s:[],s:s,s:[],s:s,s:i}", "content", "a different action for the replay check",
                                  "reasoning", "tool_calls", "parse_status", "no_tool_call", "parse_errors", "finish_reason",
                                  "stop", "num_tokens", 3);
        if (aep_json_ident_equal(other, a.last_action)) json_object_set_new(other, "content", json_string("other 2"));
        step(k, a.sid, a.last, other, 0, &r2, NULL);
        expect(k, &r2, 409, "STEP_CONFLICT", "same index, different action");
        resp_free(&r2);
        step(k, a.sid, a.last + 2, other, 0, &r2, NULL);
        expect(k, &r2, 409, "STEP_CONFLICT", "index two ahead");
        resp_free(&r2);
        json_decref(other);
        int64_t si = get_step_index(k, a.sid, NULL, 0);
        if (si >= 0 && si != a.last) FAIL("GET shows step_index %lld after rejected steps, expected %lld", (long long)si, (long long)a.last);
    } else {
        FAIL("no step was applied (check 7)");
    }
    /* 9 steps after the end */
    k->cur = 9;
    if (a.ended) {
        resp r2;
        step(k, a.sid, a.last + 1, a.last_action, 0, &r2, NULL);
        expect(k, &r2, 409, "EPISODE_ENDED", "step last + 1 after the end");
        resp_free(&r2);
    } else {
        FAIL("the episode did not end (check 7)");
    }
    /* 12 episode score */
    k->cur = 12;
    if (a.ended) {
        char path[400];
        snprintf(path, sizeof path, "/sessions/%s/score", a.sid);
        const char *sb = "{\"scope\":\"episode\",\"reason\":\"terminated\",\"deadline_ms\":300000}";
        resp s1, s2;
        http(k, k->h, "POST", path, sb, strlen(sb), 0, &s1);
        if (expect(k, &s1, 200, NULL, "score(episode)")) {
            aep_expect x = {.endpoint = ARL_ENV_EP_SCORE, .scope = ARL_ENV_SCOPE_EPISODE};
            validate(k, &s1, &x, NULL, NULL);
            http(k, k->h, "POST", path, sb, strlen(sb), 0, &s2);
            if (expect(k, &s2, 200, NULL, "repeated score(episode)") &&
                (s1.len != s2.len || memcmp(s1.body, s2.body, s1.len)))
                FAIL("the repeated score(episode) body differs");
            resp_free(&s2);
        }
        resp_free(&s1);
    } else {
        FAIL("the episode did not end (check 7)");
    }
    /* 15 delete */
    k->cur = 15;
    for (int i = 0; i < 2; i++) {
        char path[400];
        snprintf(path, sizeof path, "/sessions/%s?reason=completed", a.sid);
        http(k, k->h, "DELETE", path, NULL, 0, 0, &r);
        if (expect(k, &r, 204, NULL, i ? "second DELETE" : "DELETE") && r.len)
            FAIL("DELETE answered 204 with a body of %zu bytes", r.len);
        resp_free(&r);
    }
    http(k, k->h, "DELETE", "/sessions/aep-check-never-existed?reason=completed", NULL, 0, 0, &r);
    expect(k, &r, 204, NULL, "DELETE of a session that never existed");
    resp_free(&r);
    {
        resp r2;
        step(k, a.sid, a.last + 1, a.last_action ? a.last_action : json_array_get(k->actions, 0), 0, &r2, NULL);
        if (r2.status != 404 && r2.status != 410)
            FAIL("step after DELETE: expected 404 UNKNOWN_SESSION or 410 SESSION_CLOSED, got %d", r2.status);
        else if (strcmp(resp_code(&r2), r2.status == 404 ? "UNKNOWN_SESSION" : "SESSION_CLOSED"))
            FAIL("step after DELETE: HTTP %d with code %s", r2.status, resp_code(&r2));
        resp_free(&r2);
    }
    resp_free(&a.create_resp);
    resp_free(&b.create_resp);
    resp_free(&a.last_resp);
    resp_free(&b.last_resp);
    if (a.last_action) json_decref(a.last_action);
    if (b.last_action) json_decref(b.last_action);
}

/* A fresh session stepped once with `action`; returns 1 on 200 (result in res). */
static int fresh_step(chk *k, const json_t *action, int64_t deadline, resp *r, arl_env_result *res, char *sid,
                      size_t cap) {
    char traj[300];
    new_traj(k, traj, sizeof traj);
    memset(r, 0, sizeof *r);
    if (!create(k, traj, k->task, sid, cap, NULL)) return 0;
    return step(k, sid, 1, action, deadline, r, res) == 200;
}

static const arl_env_message *find_answer(const arl_env_result *res, const char *id) {
    for (int32_t i = 0; i < res->obs.n_messages; i++)
        if (res->obs.messages[i].role == ARL_ENV_ROLE_TOOL && res->obs.messages[i].tool_call_id &&
            !strcmp(res->obs.messages[i].tool_call_id, id))
            return &res->obs.messages[i];
    return NULL;
}

static void c_model_faults(chk *k) {
    k->cur = 10;
    char sid[200];
    resp r;
    arl_env_result res;
    memset(&res, 0, sizeof res);
    json_t *pe = json_pack("{s:s,s:n,s:[],s:s,s:[{s:s,s:s,s:s,s:s}],s:s,s:i}", "content", "", "reasoning", "tool_calls",
                           "parse_status", "invalid_json", "parse_errors", "id", "call_<step>_0", "status", "invalid_json",
                           "message", "expected ',' or '}' at offset 31", "raw",
                           "{\"name\": \"submit_answer\", \"arguments\": {\"answer\": 830", "finish_reason", "stop",
                           "num_tokens", 23);
    if (fresh_step(k, pe, 0, &r, &res, sid, sizeof sid)) {
        const arl_env_message *m = find_answer(&res, "call_1_0");
        if (!m || !m->is_error || !m->error_code || strcmp(m->error_code, "TOOL_PARSE_ERROR"))
            warn_at(k, 10, "the parse error was not answered with a TOOL_PARSE_ERROR tool message (SHOULD)");
    } else if (r.status > 0 && r.status != -200) {
        FAIL("a parse-error action got HTTP %d %s instead of a 200 observation", r.status, resp_code(&r));
    }
    json_decref(pe);
    resp_free(&r);
    arl_env_result_clear(&res);
    json_t *nf = call_action("aep_check_undeclared_tool", json_object());
    if (fresh_step(k, nf, 0, &r, &res, sid, sizeof sid)) {
        const arl_env_message *m = find_answer(&res, "call_1_0");
        if (!m || !m->is_error || !m->error_code || strcmp(m->error_code, "TOOL_NOT_FOUND"))
            FAIL("a call to an undeclared tool was not answered with TOOL_NOT_FOUND");
    } else if (r.status > 0 && r.status != -200) {
        FAIL("a call to an undeclared tool got HTTP %d %s instead of a 200 observation", r.status, resp_code(&r));
    }
    json_decref(nf);
    resp_free(&r);
    arl_env_result_clear(&res);
    if (k->bad_args) {
        if (fresh_step(k, k->bad_args, 0, &r, &res, sid, sizeof sid)) {
            ids d;
            ids_of(k->bad_args, 1, &d);
            const arl_env_message *m = d.nc > 0 ? find_answer(&res, d.v[0]) : NULL;
            if (!m || !m->is_error || !m->error_code || strcmp(m->error_code, "TOOL_ARGS_INVALID"))
                FAIL("bad_args_action was not answered with TOOL_ARGS_INVALID");
            ids_free(&d);
        } else if (r.status > 0 && r.status != -200) {
            FAIL("bad_args_action got HTTP %d %s instead of a 200 observation", r.status, resp_code(&r));
        }
        resp_free(&r);
        arl_env_result_clear(&res);
    } else {
        /* the part needing bad_args_action is skipped; the rest of the check stands */
        if (k->rep->items[9].result == ARL_CHECK_PASS)
            snprintf(k->rep->items[9].message, sizeof k->rep->items[9].message,
                     "TOOL_ARGS_INVALID part skipped: no bad_args_action");
    }
}

static void c_segment(chk *k) {
    k->cur = 13;
    char sid[200];
    resp r;
    arl_env_result res;
    memset(&res, 0, sizeof res);
    const json_t *a0 = json_array_get(k->actions, 0);
    if (!k->info.caps.segment_score) {
        char traj[300];
        new_traj(k, traj, sizeof traj);
        if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
        char path[400];
        snprintf(path, sizeof path, "/sessions/%s/score", sid);
        const char *sb = "{\"scope\":\"segment\",\"segment_index\":0,\"step_range\":[1,1],\"deadline_ms\":300000}";
        http(k, k->h, "POST", path, sb, strlen(sb), 0, &r);
        expect(k, &r, 501, "NOT_IMPLEMENTED", "segment score without segment_score");
        resp_free(&r);
        return;
    }
    if (!fresh_step(k, a0, 0, &r, &res, sid, sizeof sid)) {
        if (r.status != -200) FAIL("step 1 failed (HTTP %d)", r.status);
        resp_free(&r);
        arl_env_result_clear(&res);
        return;
    }
    resp_free(&r);
    arl_env_result_clear(&res);
    char path[400];
    snprintf(path, sizeof path, "/sessions/%s/score", sid);
    const char *sb = "{\"scope\":\"segment\",\"segment_index\":0,\"step_range\":[1,1],\"deadline_ms\":300000}";
    resp s1, s2;
    http(k, k->h, "POST", path, sb, strlen(sb), 0, &s1);
    if (expect(k, &s1, 200, NULL, "score(segment 0, [1, 1])")) {
        aep_expect x = {.endpoint = ARL_ENV_EP_SCORE, .scope = ARL_ENV_SCOPE_SEGMENT, .segment_index = 0};
        validate(k, &s1, &x, NULL, NULL);
        http(k, k->h, "POST", path, sb, strlen(sb), 0, &s2);
        if (expect(k, &s2, 200, NULL, "repeated segment score") && (s1.len != s2.len || memcmp(s1.body, s2.body, s1.len)))
            FAIL("the repeated segment score body differs");
        resp_free(&s2);
        const char *sc = "{\"scope\":\"segment\",\"segment_index\":0,\"step_range\":[1,2],\"deadline_ms\":300000}";
        http(k, k->h, "POST", path, sc, strlen(sc), 0, &s2);
        expect(k, &s2, 409, "SCORE_CONFLICT", "segment 0 again over [1, 2]");
        resp_free(&s2);
    }
    resp_free(&s1);
}

static void c_fork(chk *k) {
    k->cur = 14;
    char sid[200];
    resp r;
    arl_env_result res;
    memset(&res, 0, sizeof res);
    const json_t *a0 = json_array_get(k->actions, 0);
    if (!k->info.caps.fork) {
        char traj[300];
        new_traj(k, traj, sizeof traj);
        if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
        char path[400], body[700];
        snprintf(path, sizeof path, "/sessions/%s/fork", sid);
        int n = snprintf(body, sizeof body, "{\"trajectory_id\":\"%s#fork1\",\"group_id\":\"%s/fork\",\"at_step_index\":0,"
                         "\"deadline_ms\":120000}", traj, k->run);
        http(k, k->h, "POST", path, body, (size_t)n, 0, &r);
        expect(k, &r, 501, "NOT_IMPLEMENTED", "fork without the fork capability");
        resp_free(&r);
        return;
    }
    char traj[300];
    new_traj(k, traj, sizeof traj);
    if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
    int st = step(k, sid, 1, a0, 0, &r, &res);
    if (st != 200) {
        if (st != -200) FAIL("step 1 failed (HTTP %d)", st);
        resp_free(&r);
        arl_env_result_clear(&res);
        return;
    }
    int ended1 = res.terminated || res.truncated;
    resp_free(&r);
    arl_env_result_clear(&res);
    char path[400], body[900];
    snprintf(path, sizeof path, "/sessions/%s/fork", sid);
    int n = snprintf(body, sizeof body, "{\"trajectory_id\":\"%s#fork1\",\"group_id\":\"%s/fork\",\"at_step_index\":1,"
                     "\"deadline_ms\":120000}", traj, k->run);
    resp f1, f2;
    http(k, k->h, "POST", path, body, (size_t)n, 0, &f1);
    if (ended1) {
        expect(k, &f1, 409, "EPISODE_ENDED", "fork at the step that ended the episode");
        resp_free(&f1);
        return;
    }
    if (!expect(k, &f1, 201, NULL, "fork at step 1")) {
        resp_free(&f1);
        return;
    }
    char ctraj[400];
    snprintf(ctraj, sizeof ctraj, "%s#fork1", traj);
    aep_expect x = {.endpoint = ARL_ENV_EP_FORK, .step_index = 1, .trajectory_id = ctraj};
    arl_env_result fr;
    memset(&fr, 0, sizeof fr);
    if (!validate(k, &f1, &x, &fr, NULL)) {
        resp_free(&f1);
        return;
    }
    char csid[200];
    snprintf(csid, sizeof csid, "%s", fr.session_id);
    remember_sid(k, csid);
    arl_env_result_clear(&fr);
    http(k, k->h, "POST", path, body, (size_t)n, 0, &f2);
    if (expect(k, &f2, 200, NULL, "repeated fork") && (f1.len != f2.len || memcmp(f1.body, f2.body, f1.len)))
        FAIL("the repeated fork's body differs from the 201 body");
    resp_free(&f1);
    resp_free(&f2);
    n = snprintf(body, sizeof body, "{\"trajectory_id\":\"%s#fork2\",\"group_id\":\"%s/fork\",\"at_step_index\":3,"
                 "\"deadline_ms\":120000}", traj, k->run);
    http(k, k->h, "POST", path, body, (size_t)n, 0, &f2);
    expect(k, &f2, 409, "STEP_CONFLICT", "fork at a step not applied yet");
    resp_free(&f2);
    /* the remaining actions on the child first, then on the parent */
    size_t na = json_array_size(k->actions);
    resp *child = noted(calloc(na + 1, sizeof *child));
    int64_t cl = 1;
    for (size_t i = 1; child && i < na; i++) {
        arl_env_result rr;
        memset(&rr, 0, sizeof rr);
        int s2 = step(k, csid, (int64_t)i + 1, json_array_get(k->actions, i), 0, &child[i], &rr);
        int end = rr.terminated || rr.truncated;
        arl_env_result_clear(&rr);
        if (s2 != 200) {
            if (s2 != -200) FAIL("child step %zu: HTTP %d", i + 1, s2);
            break;
        }
        cl = (int64_t)i + 1;
        if (end) break;
    }
    int64_t ps = get_step_index(k, sid, NULL, 0);
    if (ps >= 0 && ps != 1) FAIL("the parent's GET shows step_index %lld after the child's steps, expected 1", (long long)ps);
    for (int64_t i = 1; child && i < cl; i++) {
        resp pr;
        int s2 = step(k, sid, i + 1, json_array_get(k->actions, (size_t)i), 0, &pr, NULL);
        if (s2 != 200) {
            if (s2 != -200) FAIL("parent step %lld: HTTP %d", (long long)(i + 1), s2);
            resp_free(&pr);
            break;
        }
        if (k->info.caps.deterministic_replay &&
            (pr.len != child[i].len || memcmp(pr.body, child[i].body, pr.len)))
            FAIL("with deterministic_replay, the parent's and the child's step %lld differ", (long long)(i + 1));
        resp_free(&pr);
    }
    for (size_t i = 0; child && i <= na; i++) resp_free(&child[i]);
    free(child);
}

static void c_unknown(chk *k) {
    k->cur = 16;
    const char *sid = "aep-check-unknown-session-7f3a";
    const char *eps[] = {"step", "score", "fork"};
    const char *bodies[] = {
        "{\"step_index\":1,\"deadline_ms\":60000,\"action\":{\"content\":\"\",\"reasoning\":null,\"tool_calls\":[],"
        "\"parse_status\":\"no_tool_call\",\"parse_errors\":[],\"finish_reason\":\"stop\",\"num_tokens\":1}}",
        "{\"scope\":\"episode\",\"reason\":\"terminated\",\"deadline_ms\":300000}",
        "{\"trajectory_id\":\"aep-check/unknown#fork1\",\"group_id\":\"aep-check/u\",\"at_step_index\":0,\"deadline_ms\":120000}"};
    resp r;
    for (int i = 0; i < 3; i++) {
        char path[300], what[300];
        snprintf(path, sizeof path, "/sessions/%s/%s", sid, eps[i]);
        snprintf(what, sizeof what, "POST %s for an unknown session", eps[i]);
        http(k, k->h, "POST", path, bodies[i], strlen(bodies[i]), 0, &r);
        expect(k, &r, 404, "UNKNOWN_SESSION", what);
        resp_free(&r);
    }
    char path[300];
    snprintf(path, sizeof path, "/sessions/%s", sid);
    http(k, k->h, "GET", path, NULL, 0, 0, &r);
    expect(k, &r, 404, "UNKNOWN_SESSION", "GET of an unknown session");
    resp_free(&r);
}

static void c_malformed(chk *k) {
    k->cur = 18;
    char traj[300], sid[200];
    new_traj(k, traj, sizeof traj);
    if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
    char path[400];
    snprintf(path, sizeof path, "/sessions/%s/step", sid);
    resp r;
    const char *nj = "this is not JSON {";
    http(k, k->h, "POST", path, nj, strlen(nj), 0, &r);
    expect(k, &r, 400, "INVALID_REQUEST", "non-JSON step body");
    resp_free(&r);
    json_t *a1 = instantiate(json_array_get(k->actions, 0), 1);
    char *as = noted(aep_json_dumps(a1, NULL));
    size_t asl = as ? strlen(as) : 0;
    char *dup = noted(malloc(asl + 200)), *miss = noted(malloc(asl + 200)),
         *extra = noted(malloc(asl + 300));
    if (!as || !dup || !miss || !extra) { /* noted: the run ends out of memory */
        free(as);
        free(dup);
        free(miss);
        free(extra);
        json_decref(a1);
        return;
    }
    sprintf(dup, "{\"step_index\":1,\"step_index\":1,\"action\":%s,\"deadline_ms\":%lld}", as, (long long)k->step_deadline);
    sprintf(miss, "{\"action\":%s,\"deadline_ms\":%lld}", as, (long long)k->step_deadline);
    http(k, k->h, "POST", path, dup, strlen(dup), 0, &r);
    expect(k, &r, 400, "INVALID_REQUEST", "step body with duplicate keys");
    resp_free(&r);
    http(k, k->h, "POST", path, miss, strlen(miss), 0, &r);
    expect(k, &r, 422, "VALIDATION_ERROR", "step body without step_index");
    resp_free(&r);
    json_object_set_new(a1, "x_aep_check_extra", json_pack("{s:i}", "a", 1));
    free(as);
    as = noted(aep_json_dumps(a1, NULL));
    if (as) { /* (else noted) */
        snprintf(extra, asl + 300,
                 "{\"step_index\":1,\"x_aep_check_extra\":[1,{\"b\":null}],\"action\":%s,"
                 "\"deadline_ms\":%lld}",
                 as, (long long)k->step_deadline);
        http(k, k->h, "POST", path, extra, strlen(extra), 0, &r);
        expect(k, &r, 200, NULL, "step body and action with unknown members");
        resp_free(&r);
    }
    free(as);
    free(dup);
    free(miss);
    free(extra);
    json_decref(a1);
    /* create with an unknown member */
    new_traj(k, traj, sizeof traj);
    json_t *ex = json_pack("{s:s}", "note", "unknown members are ignored");
    size_t len;
    char *cb = create_body(k, traj, k->task, ex, &len);
    json_decref(ex);
    http(k, k->h, "POST", "/sessions", cb, len, 0, &r);
    free(cb);
    if (expect(k, &r, 201, NULL, "create with an unknown member")) {
        json_t *v = arl_json_loadb(r.body, r.len, 0, NULL);
        const char *s = json_string_value(json_object_get(v, "session_id"));
        if (s) remember_sid(k, s);
        if (v) json_decref(v);
    }
    resp_free(&r);
    /* a create of max_request_bytes + 1 KiB with Expect: 100-continue */
    size_t big = (size_t)k->info.limits.max_request_bytes + 1024;
    char *bb = noted(malloc(big + 1));
    if (bb) {
        new_traj(k, traj, sizeof traj);
        int h = snprintf(bb, big, "{\"trajectory_id\":\"%s\",\"group_id\":\"%s\",\"task\":{\"id\":\"x\",\"seed\":1,"
                         "\"data\":{}},\"deadline_ms\":1000,\"pad\":\"", traj, k->run);
        memset(bb + h, 'a', big - (size_t)h - 2);
        bb[big - 2] = '"';
        bb[big - 1] = '}';
        bb[big] = 0;
        http(k, k->h, "POST", "/sessions", bb, big, H_EXPECT, &r);
        expect(k, &r, 413, "PAYLOAD_TOO_LARGE", "create of max_request_bytes + 1 KiB");
        resp_free(&r);
        free(bb);
        /* the server may close the connection after a 413: start a fresh one */
        curl_easy_reset(k->h);
    }
}

static void c_deadlines(chk *k) {
    k->cur = 19;
    if (!k->slow) {
        skip_at(k, 19, "no slow_action in the script");
        return;
    }
    char traj[300], sid[200];
    new_traj(k, traj, sizeof traj);
    if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
    resp r;
    int64_t t0 = aep_now_ms();
    int st = step(k, sid, 1, k->slow, 1000, &r, NULL);
    int64_t el = aep_now_ms() - t0;
    if (st == 200) {
        if (el > 2000) FAIL("slow_action with deadline_ms 1000 answered 200 after %lld ms (> 2000)", (long long)el);
    } else if (st == 504 && !strcmp(resp_code(&r), "DEADLINE_EXCEEDED")) {
        if (el > 2000) FAIL("504 after %lld ms (> 2000)", (long long)el);
        int64_t si = get_step_index(k, sid, NULL, 0);
        if (si != 0) FAIL("after DEADLINE_EXCEEDED, GET shows step_index %lld (expected 0: no effect)", (long long)si);
        resp r2;
        int s2 = step(k, sid, 1, k->slow, 60000, &r2, NULL);
        if (s2 != 200 && s2 != -200) FAIL("slow_action resent with deadline_ms 60000: HTTP %d %s", s2, resp_code(&r2));
        resp_free(&r2);
    } else if (st != -200) {
        FAIL("slow_action with deadline_ms 1000: HTTP %d %s (expected 200 in time or 504 DEADLINE_EXCEEDED)", st,
             resp_code(&r));
    }
    resp_free(&r);
}

static void c_reset(chk *k) {
    k->cur = 24;
    if (!k->reset_action) {
        skip_at(k, 24, "no reset_action in the script");
        return;
    }
    char sid[200];
    resp r;
    arl_env_result res;
    memset(&res, 0, sizeof res);
    if (fresh_step(k, k->reset_action, 0, &r, &res, sid, sizeof sid)) {
        if (res.obs.context != ARL_ENV_CONTEXT_RESET) FAIL("reset_action was answered with context '%s'",
                                                           arl_env_context_str(res.obs.context));
    } else if (r.status > 0 && r.status != -200) {
        FAIL("reset_action: HTTP %d %s", r.status, resp_code(&r));
    }
    resp_free(&r);
    arl_env_result_clear(&res);
}

static void c_unicode(chk *k) {
    k->cur = 26;
    const char *text = "Unicode: h\xc3\xa9llo w\xc3\xb6rld \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
                       "\xf0\x9f\x98\x80 \xf0\x9d\x84\x9e";
    for (int esc = 0; esc < 2; esc++) {
        char traj[300], sid[200];
        new_traj(k, traj, sizeof traj);
        if (!create(k, traj, k->task, sid, sizeof sid, NULL)) return;
        json_t *a = instantiate(json_array_get(k->actions, 0), 1);
        json_object_set_new(a, "content", json_string(text));
        json_t *o = json_pack("{s:i,s:o,s:I}", "step_index", 1, "action", a, "deadline_ms", (json_int_t)k->step_deadline);
        char *b = o ? arl_json_dumps(o, JSON_COMPACT | (esc ? JSON_ENSURE_ASCII : 0)) : NULL;
        json_decref(o);
        if (!b) {
            FAIL("internal: out of memory building the request");
            return;
        }
        if (esc && !strcasestr(b, "\\ud83d\\ude00")) FAIL("internal: the escaped form lacks a surrogate pair");
        char path[400];
        snprintf(path, sizeof path, "/sessions/%s/step", sid);
        resp r;
        http(k, k->h, "POST", path, b, strlen(b), 0, &r);
        free(b);
        if (expect(k, &r, 200, NULL, esc ? "non-ASCII content as \\u escapes" : "non-ASCII content as raw UTF-8")) {
            ids d;
            ids_of(json_array_get(k->actions, 0), 1, &d);
            aep_expect x = {.endpoint = ARL_ENV_EP_STEP, .step_index = 1, .call_ids = (const char *const *)d.v,
                            .n_call_ids = d.nc, .perr_ids = (const char *const *)(d.v + d.nc), .n_perr_ids = d.np};
            validate(k, &r, &x, NULL, NULL);
            ids_free(&d);
        }
        resp_free(&r);
    }
}

typedef struct conc_arg {
    chk *k;
    char sid[200];
    resp *bodies; /* per step */
    int n;
    unsigned long nomem; /* this worker's failed allocations (arl_nomem_count is per thread) */
} conc_arg;

/* Steps one session through its n actions.  Its failed allocations (jansson's, the AEP
 * parser's, the checker's own noted ones) are counted in this thread: they go back in
 * a->nomem, for c_concurrency to note in the main thread. */
static void *conc_worker(void *p) {
    conc_arg *a = p;
    chk *k = a->k;
    const unsigned long nomem0 = arl_nomem_count();
    CURL *h = noted(curl_easy_init()); /* (it fails for want of memory) */
    if (!h) {
        a->nomem = arl_nomem_count() - nomem0;
        return NULL;
    }
    for (int i = 0; i < a->n; i++) {
        char path[400];
        snprintf(path, sizeof path, "/sessions/%s/step", a->sid);
        size_t len;
        char *b = step_body(k, i + 1, script_action(k, (size_t)i), 0, &len);
        http(k, h, "POST", path, b, len, 0, &a->bodies[i]);
        free(b);
        if (a->bodies[i].status != 200) break;
    }
    curl_easy_cleanup(h);
    a->nomem = arl_nomem_count() - nomem0;
    return NULL;
}

static int members_equal(const resp *a, const resp *b) {
    json_t *x = arl_json_loadb(a->body, a->len, 0, NULL),
           *y = arl_json_loadb(b->body, b->len, 0, NULL);
    static const char *const m[] = {"observation", "reward", "reward_components", "terminated", "truncated"};
    int eq = x && y;
    for (int i = 0; eq && i < 5; i++) eq = aep_json_ident_equal(json_object_get(x, m[i]), json_object_get(y, m[i]));
    if (x) json_decref(x);
    if (y) json_decref(y);
    return eq;
}

static void c_concurrency(chk *k) {
    k->cur = 21;
    int64_t active = health_active(k);
    int64_t room = k->info.limits.max_sessions - (active < 0 ? 0 : active) - 1; /* one for the reference */
    int n = room < 32 ? (int)room : 32;
    if (n < 2) {
        skip_at(k, 21, "max_sessions leaves room for fewer than 2 sessions");
        return;
    }
    /* reference: one session stepped alone */
    seq ref;
    memset(&ref, 0, sizeof ref);
    char traj[300];
    new_traj(k, traj, sizeof traj);
    if (!create(k, traj, k->task, ref.sid, sizeof ref.sid, NULL)) return;
    int na = (int)json_array_size(k->actions) + 2; /* with a derived script's repeated answers */
    resp *rb = calloc((size_t)na, sizeof *rb);
    conc_arg *args = calloc((size_t)n, sizeof *args);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!rb || !args || !th) {
        arl_nomem_note();
        free(rb);
        free(args);
        free(th);
        return;
    }
    int nref = run_actions(k, &ref, 0, rb, na);
    resp_free(&ref.last_resp);
    if (ref.last_action) json_decref(ref.last_action);
    int made = 0;
    for (int i = 0; i < n; i++) {
        args[i].k = k;
        args[i].n = nref;
        args[i].bodies = noted(calloc((size_t)(nref > 0 ? nref : 1), sizeof(resp)));
        new_traj(k, traj, sizeof traj);
        if (!args[i].bodies || !create(k, traj, k->task, args[i].sid, sizeof args[i].sid, NULL)) break;
        made++;
    }
    int started = 0;
    for (int i = 0; i < made; i++)
        if (!pthread_create(&th[i], NULL, conc_worker, &args[i])) started = i + 1;
        else {
            arl_nomem_note(); /* this process's resources, not the server's: the run ends so */
            break;
        }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    /* a worker's failed allocation is this process's: carried into this thread's count, which
     * arl_aep_check_run compares at its end (ARL_ERR_NOMEM, not a verdict) */
    for (int i = 0; i < started; i++)
        if (args[i].nomem) arl_nomem_note();
    for (int i = 0; i < made; i++) {
        for (int s = 0; s < nref; s++) {
            resp *got = &args[i].bodies[s];
            if (got->status != 200) {
                FAIL("session %d of %d, step %d: HTTP %d %s%s", i + 1, made, s + 1, got->status,
                     got->status ? resp_code(got) : got->err, resp_why(got));
                break;
            }
            int same = k->info.caps.deterministic_replay
                           ? got->len == rb[s].len && !memcmp(got->body, rb[s].body, got->len)
                           : members_equal(got, &rb[s]);
            if (!same) {
                FAIL("session %d of %d, step %d: the concurrent response differs from the sequential one%s", i + 1,
                     made, s + 1, k->info.caps.deterministic_replay ? " (deterministic_replay: bytes)" : "");
                break;
            }
        }
        for (int s = 0; s < nref; s++) resp_free(&args[i].bodies[s]);
        free(args[i].bodies);
    }
    for (int i = made; i < n; i++) free(args[i].bodies);
    for (int s = 0; s < na; s++) resp_free(&rb[s]);
    free(rb);
    free(args);
    free(th);
    /* free their capacity for check 20 */
    for (int i = 0; i < k->n_sids; i++) del(k, k->sids[i]);
}

static void c_capacity(chk *k) {
    k->cur = 20;
    for (int i = 0; i < k->n_sids; i++) del(k, k->sids[i]);
    int64_t active = health_active(k);
    if (active < 0) {
        FAIL("GET /health failed");
        return;
    }
    int64_t need = k->info.limits.max_sessions - active;
    if (need > 4096) {
        skip_at(k, 20, "more than 4096 creations would be needed (max_sessions %lld)", (long long)k->info.limits.max_sessions);
        return;
    }
    int64_t made = 0;
    char first_sid[200] = "";
    for (int64_t i = 0; i < need; i++) {
        char traj[300], sid[200];
        new_traj(k, traj, sizeof traj);
        if (!create(k, traj, k->task, sid, sizeof sid, NULL)) {
            FAIL("creation %lld of %lld (up to max_sessions) failed", (long long)(i + 1), (long long)need);
            return;
        }
        if (!made) snprintf(first_sid, sizeof first_sid, "%s", sid);
        made++;
    }
    char traj[300];
    new_traj(k, traj, sizeof traj);
    size_t len;
    char *b = create_body(k, traj, k->task, NULL, &len);
    resp r;
    http(k, k->h, "POST", "/sessions", b, len, 0, &r);
    if (expect(k, &r, 503, "CAPACITY_REACHED", "one creation beyond max_sessions") && r.retry_after < 0)
        FAIL("CAPACITY_REACHED without Retry-After");
    resp_free(&r);
    if (first_sid[0]) del(k, first_sid);
    else if (k->n_sids) del(k, k->sids[0]);
    http(k, k->h, "POST", "/sessions", b, len, 0, &r);
    if (expect(k, &r, 201, NULL, "creation after one delete")) {
        json_t *v = arl_json_loadb(r.body, r.len, 0, NULL);
        const char *s = json_string_value(json_object_get(v, "session_id"));
        if (s) remember_sid(k, s);
        if (v) json_decref(v);
    }
    resp_free(&r);
    free(b);
}

/* ---- the run ---- */

arl_status arl_aep_check_run(const arl_check_config *cfg, arl_check_report *rep) {
    memset(rep, 0, sizeof *rep);
    for (int i = 0; i < ARL_CHECK_COUNT; i++) {
        rep->items[i].id = i + 1;
        rep->items[i].name = check_names[i];
    }
    int64_t t0 = aep_now_ms();
    chk kk, *k = &kk;
    memset(k, 0, sizeof *k);
    pthread_mutex_init(&k->mu, NULL);
    k->cfg = cfg;
    k->rep = rep;
    snprintf(rep->url, sizeof rep->url, "%s", cfg->url ? cfg->url : "");
    size_t n = strlen(rep->url);
    while (n > 0 && rep->url[n - 1] == '/') rep->url[--n] = 0;
    if (n >= 7 && !strcmp(rep->url + n - 7, "/aep/v1")) rep->url[n - 7] = 0;
    snprintf(k->base, sizeof k->base, "%s/aep/v1", rep->url);
    snprintf(k->run, sizeof k->run, "aep-check-%x-%llx", (unsigned)getpid(), (unsigned long long)time(NULL));
    rep->script_given = cfg->script_json != NULL;
    arl_status st = ARL_OK;
    /* a failed allocation of this thread during the run (jansson's parse of a body, the AEP
     * parser's) may have made a verdict: the run ends as this process's out of memory */
    const unsigned long nomem0 = arl_nomem_count();
    k->h = curl_easy_init();
    if (!k->h) return arl_errorf(ARL_ERR_NOMEM, "env check: cannot create a curl handle");
    k->step_deadline = 60000;
    /* 1 info */
    k->cur = 1;
    resp r;
    http(k, k->h, "GET", "/info", NULL, 0, 0, &r);
    if (r.status == 0) {
        for (int i = 0; i < ARL_CHECK_COUNT; i++) fail_at(k, i + 1, "the server cannot be reached: %s", r.err);
        goto done;
    }
    k->reachable = 1;
    if (r.status == 404) /* not an AEP/1 server, or the wrong base */
        FAIL("GET %s/info answered 404: is this an AEP/1 server? Give the base its /aep/v1/ "
             "routes are under (http://HOST:PORT for info at http://HOST:PORT/aep/v1/info)",
             k->base);
    else if (expect(k, &r, 200, NULL, "GET /info")) {
        aep_sha256_hex(r.body, r.len, rep->info_sha256);
        if (arl_env_info_parse(r.body, r.len, &k->info) == ARL_OK)
            k->have_info = 1;
        else
            FAIL("%s", arl_error_msg());
    }
    resp_free(&r);
    if (!k->have_info) {
        for (int i = 1; i < ARL_CHECK_COUNT; i++) fail_at(k, i + 1, "no valid /info (check 1)");
        goto done;
    }
    snprintf(rep->env_name, sizeof rep->env_name, "%s", k->info.name);
    snprintf(rep->env_version, sizeof rep->env_version, "%s", k->info.version);
    k->step_deadline = cfg->step_deadline_ms > 0 ? cfg->step_deadline_ms : k->info.limits.default_step_timeout_ms;
    if (k->step_deadline > k->info.limits.max_deadline_ms) k->step_deadline = k->info.limits.max_deadline_ms;
    if (cfg->script_json) {
        st = load_script(k, cfg->script_json);
        if (st != ARL_OK) goto done;
    } else {
        derive_script(k);
    }
    c_version(k);
    c_health(k);
    c_main_sequence(k);
    c_model_faults(k);
    c_segment(k);
    c_fork(k);
    c_unknown(k);
    c_malformed(k);
    c_deadlines(k);
    c_reset(k);
    c_unicode(k);
    c_concurrency(k);
    c_capacity(k);
    if (!k->info.caps.multimodal) skip_at(k, 23, "multimodal not declared");
    else if (rep->items[22].result == ARL_CHECK_PASS)
        snprintf(rep->items[22].message, sizeof rep->items[22].message, "%d images seen, all valid", k->images_seen);
    skip_at(k, 25, "long-running suite only");
done:
    for (int i = 0; i < k->n_sids; i++) {
        if (k->reachable) del(k, k->sids[i]);
        free(k->sids[i]);
    }
    free(k->sids);
    if (k->h) curl_easy_cleanup(k->h);
    if (k->script) json_decref(k->script);
    if (k->task) json_decref(k->task);
    if (k->options) json_decref(k->options);
    if (k->actions) json_decref(k->actions);
    if (k->bad_args) json_decref(k->bad_args);
    if (k->slow) json_decref(k->slow);
    if (k->reset_action) json_decref(k->reset_action);
    if (k->answer_action) json_decref(k->answer_action);
    arl_env_info_clear(&k->info);
    pthread_mutex_destroy(&k->mu);
    rep->seconds = (double)(aep_now_ms() - t0) / 1000.0;
    if (st == ARL_OK && arl_nomem_count() != nomem0)
        st = arl_errorf(ARL_ERR_NOMEM, "env check: out of memory (the verdicts would not be the "
                                       "server's)");
    for (int i = 0; i < ARL_CHECK_COUNT; i++) {
        switch (rep->items[i].result) {
        case ARL_CHECK_PASS: rep->n_pass++; break;
        case ARL_CHECK_FAIL: rep->n_fail++; break;
        case ARL_CHECK_SKIP: rep->n_skip++; break;
        case ARL_CHECK_WARN: rep->n_warn++; break;
        }
    }
    return st;
}

static const char *result_str(arl_check_result r) {
    return r == ARL_CHECK_PASS ? "pass" : r == ARL_CHECK_FAIL ? "fail" : r == ARL_CHECK_SKIP ? "skipped" : "warning";
}

void arl_aep_check_print(FILE *f, const arl_check_report *rep) {
    fprintf(f, "AEP/1 conformance of %s (%s %s), %s script\n", rep->url, rep->env_name[0] ? rep->env_name : "?",
            rep->env_version, rep->script_given ? "given" : "derived");
    for (int i = 0; i < ARL_CHECK_COUNT; i++) {
        const arl_check_item *it = &rep->items[i];
        if (it->message[0]) /* the name padded to the messages' column; none: no trailing spaces */
            fprintf(f, "  %-7s %2d %-30s %s\n", result_str(it->result), it->id, it->name,
                    it->message);
        else
            fprintf(f, "  %-7s %2d %s\n", result_str(it->result), it->id, it->name);
    }
    fprintf(f, "%d passed, %d failed, %d skipped, %d warnings in %.1f s: %s\n", rep->n_pass, rep->n_fail, rep->n_skip,
            rep->n_warn, rep->seconds, rep->n_fail ? "NOT conformant" : "conformant");
}

char *arl_aep_check_json(const arl_check_report *rep) {
    const unsigned long failed = arl_json_alloc_failures(); /* a key left out: NULL, not a report */
    json_t *o = json_object(), *arr = json_array();
    json_object_set_new(o, "url", json_string(rep->url));
    json_object_set_new(o, "env", json_pack("{s:s,s:s}", "name", rep->env_name, "version", rep->env_version));
    json_object_set_new(o, "info_sha256", json_string(rep->info_sha256));
    json_object_set_new(o, "script", json_string(rep->script_given ? "given" : "derived"));
    for (int i = 0; i < ARL_CHECK_COUNT; i++) {
        const arl_check_item *it = &rep->items[i];
        json_array_append_new(arr, json_pack("{s:i,s:s,s:s,s:s}", "id", it->id, "name", it->name, "result",
                                             result_str(it->result), "message", it->message));
    }
    json_object_set_new(o, "checks", arr);
    json_object_set_new(o, "passed", json_integer(rep->n_pass));
    json_object_set_new(o, "failed", json_integer(rep->n_fail));
    json_object_set_new(o, "skipped", json_integer(rep->n_skip));
    json_object_set_new(o, "warnings", json_integer(rep->n_warn));
    json_object_set_new(o, "conformant", json_boolean(rep->n_fail == 0));
    json_object_set_new(o, "seconds", json_real(rep->seconds));
    char *s = arl_json_alloc_failures() == failed ? arl_json_dumps(o, JSON_INDENT(2)) : NULL;
    json_decref(o);
    return s;
}

int arl_aep_check_exit_code(const arl_check_report *rep) { return rep->n_fail ? 1 : 0; }
