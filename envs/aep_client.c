/* envs/aep_client.c: sessions over AEP/1 (envs/env.h, part C): the HTTP client on libcurl
 * (one easy handle per session for keep-alive, one multi handle per client for many sessions in
 * flight) and the in-process transport over an arl_env_vtable (spec §14), behind one state
 * machine: deadlines (§11), retries with the delays and attempt limits of §10.3, the response
 * cap and the validation of §12, and the per-call record the replay store keeps.
 * Not here: response validation itself (envs/aep_parse.c), the server (envs/aep_server.c). */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "core/log.h"
#include "core/rng.h"
#include "envs/aep_json.h"

#define EVIDENCE_BYTES 65536 /* §12.2 item 4: first 64 KiB of an incomplete body */

typedef struct req_state {
    arl_env_endpoint ep;
    char *url;
    char *body;      /* exact bytes sent on every attempt */
    size_t body_len;
    char request_id[48];
    int64_t deadline_ms; /* the request's deadline_ms (0 for GET/DELETE) */
    int64_t timeout_ms;  /* total per attempt: deadline + slack, or get_timeout_ms */
    int64_t started_ms;
    int64_t retry_at_ms; /* > 0: waiting to retry */
    int in_curl;
    int attempts, n_transport, n_deadline;
    int64_t queued_ms;
    /* the current attempt's response */
    char *resp;
    size_t resp_len, resp_cap, total;
    int over_cap;
    int over_cap_declared; /* over_cap from Content-Length (total: the declared length) */
    char ctype[128];
    int64_t retry_after_hdr_ms;
    struct curl_slist *hdrs; /* the session's header list for this method (not owned) */
    /* expectations for validation */
    aep_expect x;
    char **ids; /* call ids then parse-error ids (owned) */
    int32_t n_ids;
    int64_t step_index;
    arl_env_session *child; /* FORK */
    unsigned long nomem0;   /* arl_nomem_count() when the request began to be built */
} req_state;

struct arl_env_client {
    arl_env_client_config cfg;
    char *token;
    CURLM *multi;
    arl_rng rng;
    uint64_t req_counter;
    arl_env_session *inflight; /* sessions with a request started and not finished */
    arl_env_session **done;    /* finished, not yet reported */
    int n_done, cap_done;
    int pending;
    int64_t retry_said_ms;  /* when a session call's retry was last said (0: never) */
    int64_t retries_unsaid; /* session call retries since then, not said */
};

struct arl_env {
    arl_env_client *client;
    int remote;
    char *base; /* ".../aep/v1" */
    const arl_env_vtable *vt;
    void *inst;
    int unhealthy; /* an in-process call overran its deadline (§14.5) */
    arl_env_info info;
    char *info_body;
    size_t info_len;
    arl_env_error last_error;
    arl_env_session *ctl; /* for /info and /health */
    int n_sessions;
};

struct arl_env_session {
    arl_env *env;
    arl_env_client *client;
    CURL *easy;
    char sid[ARL_AEP_MAX_SID_BYTES + 1];
    char traj[ARL_AEP_MAX_ID_BYTES + 1];
    int64_t last_step;
    int ended;
    int busy;     /* a call started and not yet reported */
    int finished; /* the call finished (reported or not) */
    req_state rq;
    arl_env_call call;
    char *call_req, *call_resp;
    arl_env_session *prev, *next; /* in client->inflight */
    void *user;
    /* request headers, built once per session; the AEP-Request-Id value is rewritten in place */
    struct curl_slist *hpost, *hget;
    char *rid_post, *rid_get; /* (RID_LEN) characters inside the lists */
};

#define RID_LEN 25 /* "r" + 16 + 8 hex digits */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

arl_status arl_env_client_open(const arl_env_client_config *cfg, arl_env_client **out) {
    *out = NULL;
    pthread_once(&curl_once, curl_init_once);
    arl_env_client *c = calloc(1, sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "env client: out of memory");
    if (cfg)
        c->cfg = *cfg;
    else
        arl_env_client_config_default(&c->cfg);
    c->cfg.token = NULL;
    if (cfg && cfg->token) c->token = strdup(cfg->token);
    c->multi = curl_multi_init();
    if (!c->multi || (cfg && cfg->token && !c->token)) {
        if (c->multi) curl_multi_cleanup(c->multi);
        free(c->token);
        free(c);
        return arl_errorf(ARL_ERR_NOMEM, "env client: cannot create the curl multi handle");
    }
    arl_rng_seed(&c->rng, c->cfg.seed);
    *out = c;
    return ARL_OK;
}

void arl_env_client_close(arl_env_client *c) {
    if (!c) return;
    curl_multi_cleanup(c->multi);
    free(c->done);
    free(c->token);
    free(c);
}

/* ---- request state ---- */

static void rq_reset_response(req_state *r) {
    r->resp_len = 0;
    r->total = 0;
    r->over_cap = 0;
    r->over_cap_declared = 0;
    r->ctype[0] = 0;
    r->retry_after_hdr_ms = -1;
}

static void rq_clear(req_state *r) {
    free(r->url);
    free(r->body);
    free(r->resp);
    for (int32_t i = 0; i < r->n_ids; i++) free(r->ids[i]);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

static void call_clear(arl_env_session *s) {
    arl_env_error_clear(&s->call.error);
    arl_env_result_clear(&s->call.result);
    arl_env_score_result_clear(&s->call.score);
    if (s->call.snapshot) json_decref(s->call.snapshot);
    free(s->call_req);
    free(s->call_resp);
    s->call_req = s->call_resp = NULL;
    memset(&s->call, 0, sizeof s->call);
    s->call.error.retry_after_ms = -1;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    arl_env_session *s = ud;
    req_state *r = &s->rq;
    size_t n = size * nmemb;
    r->total += n;
    if ((int64_t)r->total > s->client->cfg.max_response_bytes) {
        r->over_cap = 1;
        /* keep evidence up to the first 64 KiB */
        size_t keep = r->resp_len < EVIDENCE_BYTES ? EVIDENCE_BYTES - r->resp_len : 0;
        if (keep > n) keep = n;
        if (keep && r->resp_len + keep <= r->resp_cap) {
            memcpy(r->resp + r->resp_len, ptr, keep);
            r->resp_len += keep;
        }
        return 0; /* abort the transfer at the cap (§12.2 item 1) */
    }
    if (r->resp_len + n + 1 > r->resp_cap) {
        size_t cap = r->resp_cap ? r->resp_cap : 4096;
        while (cap < r->resp_len + n + 1) cap *= 2;
        char *p = realloc(r->resp, cap);
        if (!p) { /* (over HTTP curl then fails the transfer; in-process the answer is cut) */
            arl_nomem_note();
            return 0;
        }
        r->resp = p;
        r->resp_cap = cap;
    }
    memcpy(r->resp + r->resp_len, ptr, n);
    r->resp_len += n;
    r->resp[r->resp_len] = 0;
    return n;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud) {
    arl_env_session *s = ud;
    req_state *r = &s->rq;
    size_t n = size * nitems;
    if (n >= 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response (also after 100 Continue) */
        r->ctype[0] = 0;
        r->retry_after_hdr_ms = -1;
        return n;
    }
    const char *colon = memchr(buf, ':', n);
    if (!colon) return n;
    size_t kl = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vl = n - kl - 1;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    if (kl == 12 && !strncasecmp(buf, "Content-Type", 12)) {
        if (vl >= sizeof r->ctype) vl = sizeof r->ctype - 1;
        memcpy(r->ctype, v, vl);
        r->ctype[vl] = 0;
    } else if (kl == 11 && !strncasecmp(buf, "Retry-After", 11)) {
        char tmp[32];
        if (vl >= sizeof tmp) vl = sizeof tmp - 1;
        memcpy(tmp, v, vl);
        tmp[vl] = 0;
        char *end;
        long long sec = strtoll(tmp, &end, 10);
        if (end != tmp && *end == 0 && sec >= 0 && sec < 86400) r->retry_after_hdr_ms = sec * 1000;
    } else if (kl == 14 && !strncasecmp(buf, "Content-Length", 14)) {
        char tmp[32];
        if (vl >= sizeof tmp) vl = sizeof tmp - 1;
        memcpy(tmp, v, vl);
        tmp[vl] = 0;
        long long cl = strtoll(tmp, NULL, 10);
        if (cl > s->client->cfg.max_response_bytes) {
            r->over_cap = 1;
            r->over_cap_declared = 1;
            r->total = (size_t)cl;
            return 0; /* refuse before reading the body */
        }
    }
    return n;
}

/* ---- finishing and retrying ---- */

static void push_done(arl_env_client *c, arl_env_session *s) {
    if (c->n_done == c->cap_done) {
        int cap = c->cap_done ? 2 * c->cap_done : 16;
        arl_env_session **d = realloc(c->done, (size_t)cap * sizeof *d);
        if (!d) return; /* reported only through the synchronous path; never lost there */
        c->done = d;
        c->cap_done = cap;
    }
    c->done[c->n_done++] = s;
}

static void inflight_add(arl_env_client *c, arl_env_session *s) {
    s->prev = NULL;
    s->next = c->inflight;
    if (c->inflight) c->inflight->prev = s;
    c->inflight = s;
}

static void inflight_del(arl_env_client *c, arl_env_session *s) {
    if (s->prev)
        s->prev->next = s->next;
    else if (c->inflight == s)
        c->inflight = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void finish(arl_env_session *s, const arl_env_error *err) {
    arl_env_client *c = s->client;
    req_state *r = &s->rq;
    arl_env_call *call = &s->call;
    call->endpoint = r->ep;
    call->error = *err; /* takes the details reference */
    call->status = err->code == ARL_ENV_E_NONE ? ARL_OK : ARL_ERR_ENV;
    call->http_status = err->http_status;
    s->call_req = r->body;
    r->body = NULL;
    call->request = s->call_req;
    call->request_len = r->body_len;
    size_t keep = r->over_cap && r->resp_len > EVIDENCE_BYTES ? EVIDENCE_BYTES : r->resp_len;
    s->call_resp = malloc(keep + 1);
    if (s->call_resp) {
        if (keep) memcpy(s->call_resp, r->resp, keep);
        s->call_resp[keep] = 0;
        call->response = s->call_resp;
        call->response_len = keep;
    } else {
        arl_nomem_note(); /* the record would lack the response it is kept for */
    }
    /* An allocation of this thread failed since the request began to be built.  In-process,
     * the environment answered in this thread: its "500 ENV_INTERNAL: out of memory", a 400 for
     * a request it could not read, or an answer built short of a key is this process's out of
     * memory, and so is a response the parser could not hold (MALFORMED_RESPONSE).  Over HTTP
     * only the client's own part runs here: an error is then this process's too (another
     * session's failure in the window also ends it, conservatively), a success stands. */
    if (arl_nomem_count() != r->nomem0 && (call->status != ARL_OK || !s->env->remote)) {
        call->status = ARL_ERR_NOMEM;
        char was[sizeof call->error.message];
        snprintf(was, sizeof was, "%s",
                 call->error.code != ARL_ENV_E_NONE ? call->error.code_str : "");
        snprintf(call->error.message, sizeof call->error.message,
                 "out of memory in this process during the %s call%s%s%s",
                 s->env->remote ? "environment" : "in-process environment",
                 was[0] ? " (it read as " : "", was, was[0] ? ")" : "");
        arl_errorf(ARL_ERR_NOMEM, "env: %s", call->error.message);
    }
    call->response_total = r->total;
    call->response_complete = !r->over_cap && err->code != ARL_ENV_E_TRANSPORT_ERROR &&
                              err->code != ARL_ENV_E_CLIENT_TIMEOUT;
    call->attempts = r->attempts;
    call->elapsed_ms = aep_now_ms() - r->started_ms;
    call->queued_ms = r->queued_ms;
    /* bookkeeping of the session */
    if (call->status == ARL_OK) {
        switch (r->ep) {
        case ARL_ENV_EP_CREATE:
            snprintf(s->sid, sizeof s->sid, "%s", call->result.session_id);
            s->last_step = 0;
            break;
        case ARL_ENV_EP_STEP:
            s->last_step = r->step_index;
            if (call->result.terminated || call->result.truncated) s->ended = 1;
            break;
        case ARL_ENV_EP_SCORE:
            if (call->score.scope == ARL_ENV_SCOPE_EPISODE) s->ended = 1;
            break;
        case ARL_ENV_EP_FORK:
            if (r->child) {
                snprintf(r->child->sid, sizeof r->child->sid, "%s", call->result.session_id);
                r->child->last_step = call->result.step_index;
            }
            break;
        default: break;
        }
    }
    free(r->url);
    r->url = NULL;
    r->hdrs = NULL;
    for (int32_t i = 0; i < r->n_ids; i++) free(r->ids[i]);
    free(r->ids);
    r->ids = NULL;
    r->n_ids = 0;
    r->retry_at_ms = 0;
    s->finished = 1;
    inflight_del(c, s);
    push_done(c, s);
}

/* §10.3: returns the delay before the next attempt, or -1 to give up. */
static int64_t retry_delay(arl_env_session *s, const arl_env_error *e) {
    arl_env_client *c = s->client;
    req_state *r = &s->rq;
    if (!e->retryable) return -1;
    int queue = e->code == ARL_ENV_E_CAPACITY_REACHED || e->code == ARL_ENV_E_DRAINING ||
                e->code == ARL_ENV_E_STEP_IN_PROGRESS;
    if (e->code == ARL_ENV_E_DEADLINE_EXCEEDED) {
        if (++r->n_deadline >= 2) return -1;
    } else if (!queue) {
        if (++r->n_transport >= 5) return -1;
    }
    int a = r->attempts; /* a = 1 for the first retry */
    double base = (double)c->cfg.backoff_base_ms * pow(2.0, a - 1);
    if (base > (double)c->cfg.backoff_max_ms) base = (double)c->cfg.backoff_max_ms;
    double d = base * (0.5 + 0.5 * arl_rng_uniform(&c->rng));
    int64_t hint = e->retry_after_ms >= 0 ? e->retry_after_ms : 0;
    int64_t delay = (int64_t)d > hint ? (int64_t)d : hint;
    if (queue) {
        if (r->queued_ms + delay > c->cfg.queue_budget_ms) return -1;
        r->queued_ms += delay;
    }
    return delay;
}

/* A retry's delay for a log line: "150 ms" under a second ("0.1 s" said less and 0 ms read as
 * "0.0 s"), "2.5 s" from a second on. */
static const char *delay_str(char *buf, size_t cap, int64_t ms) {
    if (ms < 1000)
        snprintf(buf, cap, "%lld ms", (long long)ms);
    else
        snprintf(buf, cap, "%.1f s", 1e-3 * (double)ms);
    return buf;
}

/* A session call's retry on a remote environment is said (a server that died mid-run was
 * retried for tens of seconds in silence before its trajectories were masked), but at most one
 * line every cfg.retry_say_ms per client: with a dead server every session of a worker retries
 * at once.  The line counts the retries left unsaid since the last one; each call's attempt log
 * keeps them all. */
static void retry_say(arl_env_session *s, const arl_env_error *e, int64_t delay) {
    static const char *const method[] = {"GET",  "GET",  "POST", "POST",
                                         "POST", "POST", "GET",  "DELETE"};
    arl_env_client *c = s->client;
    const req_state *r = &s->rq;
    const int64_t now = aep_now_ms();
    const int64_t every = c->cfg.retry_say_ms > 0 ? c->cfg.retry_say_ms : 10000;
    if (c->retry_said_ms > 0 && now - c->retry_said_ms < every) {
        c->retries_unsaid++;
        return;
    }
    char more[96] = "";
    if (c->retries_unsaid > 0)
        snprintf(more, sizeof more, "; %lld more retr%s of this worker's calls since the last note",
                 (long long)c->retries_unsaid, c->retries_unsaid == 1 ? "y" : "ies");
    char in[32];
    arl_log_warn("env: %s %s: %s%s%s (attempt %d); retrying in %s%s (retries are said at "
                 "most every %.0f s)",
                 (unsigned)r->ep < sizeof method / sizeof *method ? method[r->ep] : "?",
                 r->url ? r->url : "?", e->code_str, e->message[0] ? ": " : "", e->message,
                 r->attempts, delay_str(in, sizeof in, delay), more, 1e-3 * (double)every);
    c->retry_said_ms = now;
    c->retries_unsaid = 0;
}

/* One attempt finished: classify and finish or schedule a retry. */
static void attempt_done(arl_env_session *s, int transport, CURLcode cc, int http_status) {
    req_state *r = &s->rq;
    arl_env_error e;
    memset(&e, 0, sizeof e);
    arl_env_error_clear(&e);
    arl_env_result_clear(&s->call.result);
    arl_env_score_result_clear(&s->call.score);
    if (s->call.snapshot) {
        json_decref(s->call.snapshot);
        s->call.snapshot = NULL;
    }
    if (r->over_cap) {
        e.http_status = http_status;
        arl_env_error_set(&e, ARL_ENV_E_RESPONSE_TOO_LARGE, "response body over %lld bytes",
                          (long long)s->client->cfg.max_response_bytes);
        if (r->over_cap_declared)
            snprintf(
                e.violation, sizeof e.violation,
                "/: body over the %lld-byte cap (Content-Length %zu; refused before reading it)",
                (long long)s->client->cfg.max_response_bytes, r->total);
        else
            snprintf(e.violation, sizeof e.violation,
                     "/: body over the %lld-byte cap (reading stopped after %zu bytes)",
                     (long long)s->client->cfg.max_response_bytes, r->total);
    } else if (transport && cc == CURLE_OPERATION_TIMEDOUT) {
        arl_env_error_set(&e, ARL_ENV_E_CLIENT_TIMEOUT, "no complete response within %lld ms",
                          (long long)r->timeout_ms);
    } else if (transport && cc != CURLE_OK) {
        arl_env_error_set(&e, ARL_ENV_E_TRANSPORT_ERROR, "%s", curl_easy_strerror(cc));
        e.http_status = http_status;
    } else {
        int64_t ha = 0, hm = 0;
        aep_response_parse(&r->x, http_status, r->ctype[0] ? r->ctype : NULL, r->resp, r->resp_len, &e,
                           &s->call.result, &s->call.score, &s->call.snapshot, &ha, &hm);
        if (e.code != ARL_ENV_E_NONE && e.retry_after_ms < 0 && r->retry_after_hdr_ms >= 0)
            e.retry_after_ms = r->retry_after_hdr_ms;
    }
    /* (an error while an allocation of this thread failed is not retried: finish says why) */
    int64_t delay =
        e.code == ARL_ENV_E_NONE || arl_nomem_count() != r->nomem0 ? -1 : retry_delay(s, &e);
    if (delay < 0) {
        finish(s, &e);
        return;
    }
    /* a queue retry of /info or /health (the control session: env open, env check; 503
     * CAPACITY_REACHED or DRAINING, up to the queue budget) is said, so that a server busy for
     * minutes does not look like a hang; a session call's retries are said by retry_say */
    char in[32];
    if (s->env && s == s->env->ctl &&
        (e.code == ARL_ENV_E_CAPACITY_REACHED || e.code == ARL_ENV_E_DRAINING))
        arl_log_warn("env %s: %s answered %s%s%s (attempt %d); retrying in %s (%.0f s of the "
                     "%.0f s queue budget spent)",
                     s->env->base, r->ep == ARL_ENV_EP_INFO ? "GET /info" : "GET /health",
                     e.code_str, e.message[0] ? ": " : "", e.message, r->attempts,
                     delay_str(in, sizeof in, delay), 1e-3 * (double)r->queued_ms,
                     1e-3 * (double)s->client->cfg.queue_budget_ms);
    else if (s->env && s->env->remote && s != s->env->ctl)
        retry_say(s, &e, delay);
    arl_env_error_clear(&e);
    r->retry_at_ms = aep_now_ms() + delay;
}

/* ---- transports ---- */

/* Set the easy handle up for the next attempt. */
static void prepare_attempt(arl_env_session *s) {
    req_state *r = &s->rq;
    arl_env_client *c = s->client;
    CURL *h = s->easy;
    rq_reset_response(r);
    r->attempts++;
    r->retry_at_ms = 0;
    curl_easy_setopt(h, CURLOPT_URL, r->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
    if (r->body) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        if (r->ep == ARL_ENV_EP_DELETE) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)r->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->cfg.connect_timeout_ms);
}

/* An attempt through the multi handle (completion is seen by drive). */
static void start_attempt_http(arl_env_session *s) {
    prepare_attempt(s);
    if (curl_multi_add_handle(s->client->multi, s->easy) != CURLM_OK) {
        attempt_done(s, 1, CURLE_FAILED_INIT, 0);
        return;
    }
    s->rq.in_curl = 1;
}

/* A blocking attempt, used when this session is the only one with a request in flight: one
 * transfer on the handle's own connection, without the multi handle's extra wake-ups. */
static void run_attempt_blocking(arl_env_session *s) {
    prepare_attempt(s);
    CURLcode cc = curl_easy_perform(s->easy);
    long code = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &code);
    if (cc == CURLE_WRITE_ERROR && s->rq.over_cap) cc = CURLE_OK; /* classified as too large */
    attempt_done(s, 1, cc, (int)code);
}

static void run_attempt_inproc(arl_env_session *s) {
    req_state *r = &s->rq;
    arl_env *e = s->env;
    const arl_env_vtable *vt = e->vt;
    rq_reset_response(r);
    r->attempts++;
    char *resp = NULL;
    size_t rl = 0;
    int st = 500;
    int64_t t0 = aep_now_ms();
    const char *sid = s->sid;
    switch (r->ep) {
    case ARL_ENV_EP_INFO: st = vt->info(e->inst, &resp, &rl); break;
    case ARL_ENV_EP_HEALTH: st = vt->health(e->inst, &resp, &rl); break;
    case ARL_ENV_EP_CREATE: st = vt->reset(e->inst, r->body, r->body_len, &resp, &rl); break;
    case ARL_ENV_EP_STEP: st = vt->step(e->inst, sid, r->body, r->body_len, &resp, &rl); break;
    case ARL_ENV_EP_SCORE: st = vt->score(e->inst, sid, r->body, r->body_len, &resp, &rl); break;
    case ARL_ENV_EP_FORK:
        if (vt->fork) {
            st = vt->fork(e->inst, sid, r->body, r->body_len, &resp, &rl);
        } else {
            resp = aep_envelope(ARL_ENV_E_NOT_IMPLEMENTED, NULL, "fork is not implemented", -1, &rl);
            st = 501;
            if (resp) { /* copy into the response buffer below and free here */
                on_body(resp, 1, rl, s);
                free(resp);
                resp = NULL;
                rl = 0;
            }
        }
        break;
    case ARL_ENV_EP_GET: st = vt->get(e->inst, sid, &resp, &rl); break;
    case ARL_ENV_EP_DELETE:
        vt->close(e->inst, sid, r->url ? r->url : "completed");
        st = 204;
        break;
    }
    if (resp) {
        on_body(resp, 1, rl, s);
        vt->free_buffer(e->inst, resp);
    }
    if (r->resp_len || st != 204) snprintf(r->ctype, sizeof r->ctype, "application/json; charset=utf-8");
    int64_t el = aep_now_ms() - t0;
    if (r->timeout_ms > 0 && el > r->timeout_ms) { /* §14.5 */
        e->unhealthy = 1;
        arl_env_error err;
        memset(&err, 0, sizeof err);
        arl_env_error_set(&err, ARL_ENV_E_CLIENT_TIMEOUT, "in-process call took %lld ms > %lld ms",
                          (long long)el, (long long)r->timeout_ms);
        finish(s, &err);
        return;
    }
    attempt_done(s, 0, CURLE_OK, st);
}

/* Run in-process attempts to completion (retry delays are slept). */
static void run_inproc(arl_env_session *s) {
    for (;;) {
        run_attempt_inproc(s);
        if (s->finished) return;
        int64_t wait = s->rq.retry_at_ms - aep_now_ms();
        if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- beginning a request ---- */

static struct curl_slist *headers_for(const arl_env_client *c, int post, char **rid) {
    char line[64];
    struct curl_slist *h = NULL, *t;
    const char *fixed[] = {"AEP-Version: 1", "Accept: application/json",
                           post ? "Content-Type: application/json; charset=utf-8" : NULL,
                           post ? "Expect:" : NULL}; /* "Expect:": no 100-continue round trip */
    for (int i = 0; i < 4; i++) {
        if (!fixed[i]) continue;
        if (!(t = curl_slist_append(h, fixed[i]))) goto fail;
        h = t;
    }
    snprintf(line, sizeof line, "AEP-Request-Id: %0*d", RID_LEN, 0);
    if (!(t = curl_slist_append(h, line))) goto fail;
    h = t;
    struct curl_slist *last = h;
    while (last->next) last = last->next;
    *rid = last->data + strlen("AEP-Request-Id: ");
    if (c->token) {
        size_t tl = strlen(c->token) + 32;
        char *auth = malloc(tl);
        if (!auth) goto fail;
        snprintf(auth, tl, "Authorization: Bearer %s", c->token);
        t = curl_slist_append(h, auth);
        free(auth);
        if (!t) goto fail;
        h = t;
    }
    return h;
fail:
    curl_slist_free_all(h);
    return NULL;
}

static int make_headers(arl_env_session *s) {
    s->hpost = headers_for(s->client, 1, &s->rid_post);
    s->hget = headers_for(s->client, 0, &s->rid_get);
    if (s->hpost && s->hget) return 0;
    curl_slist_free_all(s->hpost);
    curl_slist_free_all(s->hget);
    s->hpost = s->hget = NULL;
    return -1;
}

/* Start a call with the request body (owned; NULL for GET/DELETE) that the caller began to
 * build when arl_nomem_count() was nomem0: jansson's builders leave a key out quietly when an
 * allocation fails, so a body built while the count moved may lack one (a create without its
 * task's data, a score without its step_range, which the environment then refuses as the
 * client's fault): out of memory instead. */
static arl_status begin(arl_env_session *s, arl_env_endpoint ep, const char *path, char *body,
                        size_t body_len, int64_t deadline_ms, unsigned long nomem0) {
    arl_env_client *c = s->client;
    arl_env *e = s->env;
    req_state *r = &s->rq;
    if (arl_nomem_count() != nomem0) {
        free(body);
        return arl_errorf(ARL_ERR_NOMEM, "env client: out of memory building a request");
    }
    r->nomem0 = nomem0;
    call_clear(s);
    free(r->url);
    r->url = NULL;
    r->hdrs = NULL;
    r->ep = ep;
    r->body = body;
    r->body_len = body_len;
    r->deadline_ms = deadline_ms;
    r->timeout_ms = body ? deadline_ms + c->cfg.slack_ms : c->cfg.get_timeout_ms;
    r->started_ms = aep_now_ms();
    r->attempts = r->n_transport = r->n_deadline = 0;
    r->queued_ms = 0;
    r->retry_at_ms = 0;
    r->x.endpoint = ep;
    r->x.info = e->info_body ? &e->info : NULL;
    r->x.cc = &c->cfg;
    snprintf(r->request_id, sizeof r->request_id, "r%016llx%08llx", (unsigned long long)++c->req_counter,
             (unsigned long long)(arl_rng_next(&c->rng) & 0xffffffffull));
    s->busy = 1;
    s->finished = 0;
    c->pending++;
    inflight_add(c, s);
    if (!e->remote) {
        if (ep == ARL_ENV_EP_DELETE) r->url = strdup(path ? path : "completed"); /* the reason */
        if (e->unhealthy && ep == ARL_ENV_EP_CREATE) {
            arl_env_error err;
            memset(&err, 0, sizeof err);
            arl_env_error_set(&err, ARL_ENV_E_CLIENT_TIMEOUT,
                              "the in-process environment overran a deadline and takes no new sessions");
            finish(s, &err);
            return ARL_OK;
        }
        run_inproc(s);
        return ARL_OK;
    }
    size_t ul = strlen(e->base) + strlen(path) + 1;
    r->url = malloc(ul);
    if (!r->url) goto nomem;
    snprintf(r->url, ul, "%s%s", e->base, path);
    if (!s->hpost && make_headers(s)) goto nomem;
    r->hdrs = body ? s->hpost : s->hget;
    memcpy(body ? s->rid_post : s->rid_get, r->request_id, RID_LEN);
    r->retry_at_ms = 1; /* due now: started by the next drive, or blocking by run_sync */
    return ARL_OK;
nomem:
    inflight_del(c, s);
    c->pending--;
    s->busy = 0;
    r->body = NULL;
    free(body);
    return arl_errorf(ARL_ERR_NOMEM, "env client: out of memory starting a request");
}

/* ---- driving ---- */

static void drive(arl_env_client *c, int64_t timeout_ms) {
    int64_t now = aep_now_ms();
    /* due retries */
    int64_t next_retry = -1;
    for (arl_env_session *s = c->inflight, *n; s; s = n) {
        n = s->next;
        if (s->rq.retry_at_ms > 0) {
            if (s->rq.retry_at_ms <= now)
                start_attempt_http(s);
            else if (next_retry < 0 || s->rq.retry_at_ms < next_retry)
                next_retry = s->rq.retry_at_ms;
        }
    }
    int running = 0;
    curl_multi_perform(c->multi, &running);
    int64_t wait = timeout_ms;
    if (next_retry >= 0 && next_retry - now < wait) wait = next_retry - now;
    if (wait < 0) wait = 0;
    if (running && wait > 0) {
        curl_multi_wait(c->multi, NULL, 0, (int)(wait > 1000 ? 1000 : wait), NULL);
        curl_multi_perform(c->multi, &running);
    } else if (!running && wait > 0) {
        struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
        if (wait > 5) ts = (struct timespec){0, 5000000L}; /* nothing in curl: short naps */
        nanosleep(&ts, NULL);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *h = m->easy_handle;
        CURLcode res = m->data.result;
        arl_env_session *s = NULL;
        curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&s);
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        curl_multi_remove_handle(c->multi, h);
        if (!s) continue;
        s->rq.in_curl = 0;
        if (res == CURLE_WRITE_ERROR && s->rq.over_cap) res = CURLE_OK; /* classified as too large */
        attempt_done(s, 1, res, (int)code);
    }
}

static void unqueue_done(arl_env_client *c, arl_env_session *s) {
    for (int i = 0; i < c->n_done; i++)
        if (c->done[i] == s) {
            memmove(&c->done[i], &c->done[i + 1], (size_t)(c->n_done - i - 1) * sizeof *c->done);
            c->n_done--;
            break;
        }
    if (s->busy) {
        s->busy = 0;
        c->pending--;
    }
}

arl_status arl_env_client_wait(arl_env_client *c, int64_t timeout_ms, arl_env_session **done) {
    *done = NULL;
    int64_t end = aep_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        if (c->n_done > 0) {
            arl_env_session *s = c->done[0];
            unqueue_done(c, s);
            *done = s;
            return ARL_OK;
        }
        int64_t left = end - aep_now_ms();
        if (!c->inflight || (left <= 0 && timeout_ms > 0)) return ARL_OK;
        drive(c, left > 0 ? left : 0);
        if (timeout_ms <= 0 && c->n_done == 0) return ARL_OK;
    }
}

int arl_env_client_pending(const arl_env_client *c) { return c->pending; }

static arl_status run_sync(arl_env_session *s) {
    arl_env_client *c = s->client;
    while (!s->finished) {
        if (s->env->remote && !s->rq.in_curl && c->inflight == s && !s->next) {
            /* alone: blocking attempts (retry delays slept) */
            int64_t wait = s->rq.retry_at_ms - aep_now_ms();
            if (wait > 0) {
                struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            run_attempt_blocking(s);
            continue;
        }
        drive(c, 1000);
    }
    unqueue_done(c, s);
    return s->call.status;
}

/* ---- environments ---- */

static arl_env_session *session_new(arl_env *e) {
    arl_env_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->env = e;
    s->client = e->client;
    s->call.error.retry_after_ms = -1;
    if (e->remote) {
        s->easy = curl_easy_init();
        if (!s->easy) {
            free(s);
            return NULL;
        }
        curl_easy_setopt(s->easy, CURLOPT_PRIVATE, (char *)s);
        curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
        curl_easy_setopt(s->easy, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(s->easy, CURLOPT_HEADERDATA, s);
        curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(s->easy, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(s->easy, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(s->easy, CURLOPT_TCP_KEEPALIVE, 1L);
    }
    e->n_sessions++;
    return s;
}

void arl_env_session_free(arl_env_session *s) {
    if (!s) return;
    arl_env_client *c = s->client;
    if (s->rq.in_curl) curl_multi_remove_handle(c->multi, s->easy);
    if (!s->finished && s->busy) inflight_del(c, s);
    unqueue_done(c, s);
    inflight_del(c, s);
    /* a pending fork's child loses its parent's request */
    if (s->easy) curl_easy_cleanup(s->easy);
    curl_slist_free_all(s->hpost);
    curl_slist_free_all(s->hget);
    call_clear(s);
    rq_clear(&s->rq);
    s->env->n_sessions--;
    free(s);
}

arl_status arl_env_open(arl_env_client *c, const char *where, const char *config_json, arl_env **out) {
    *out = NULL;
    if (!where) return arl_errorf(ARL_ERR_ARG, "env: no environment given");
    arl_env *e = calloc(1, sizeof *e);
    if (!e) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    e->client = c;
    arl_env_error_clear(&e->last_error);
    if (!strncmp(where, "builtin:", 8)) {
        const arl_env_def *d = arl_env_builtin_find(where + 8);
        if (!d) {
            free(e);
            return arl_errorf(ARL_ERR_ARG, "env: no built-in environment named '%s'", where + 8);
        }
        arl_status st = arl_env_host_open(d, config_json, NULL, &e->inst, &e->vt);
        if (st != ARL_OK) {
            free(e);
            return st;
        }
    } else if (!strncmp(where, "http://", 7) || !strncmp(where, "https://", 8)) {
        e->remote = 1;
        size_t n = strlen(where);
        while (n > 8 && where[n - 1] == '/') n--;
        if (n >= 7 && !strncmp(where + n - 7, "/aep/v1", 7)) {
            arl_log_warn("env: base URL '%s' ends in /aep/v1; using the part before it", where);
            n -= 7;
        }
        e->base = malloc(n + 8);
        if (!e->base) {
            free(e);
            return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
        }
        memcpy(e->base, where, n);
        memcpy(e->base + n, "/aep/v1", 8);
    } else {
        free(e);
        return arl_errorf(ARL_ERR_ARG, "env: '%s' is neither a base URL (http://host:port) nor builtin:NAME", where);
    }
    e->ctl = session_new(e);
    if (!e->ctl) {
        arl_env_free(e);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    e->n_sessions--; /* the control session is not counted */
    arl_status st = begin(e->ctl, ARL_ENV_EP_INFO, "/info", NULL, 0, 0, arl_nomem_count());
    if (st == ARL_OK) st = run_sync(e->ctl);
    if (st != ARL_OK) {
        const arl_env_call *cl = &e->ctl->call;
        arl_env_error_clear(&e->last_error);
        e->last_error = cl->error;
        if (cl->error.details) json_incref(cl->error.details);
        if (st == ARL_ERR_NOMEM) /* (begin's, or the call's: finish said it) */
            st = arl_errorf(ARL_ERR_NOMEM, "env %s: GET /info: %s", where,
                            cl->status == ARL_ERR_NOMEM ? cl->error.message : "out of memory");
        else
            st = arl_errorf(ARL_ERR_ENV, "env %s: GET /info failed: %s: %s", where,
                            cl->error.code_str,
                            cl->error.violation[0] ? cl->error.violation : cl->error.message);
        arl_env_free(e);
        return st;
    }
    st = arl_env_info_parse(e->ctl->call.response, e->ctl->call.response_len, &e->info);
    if (st != ARL_OK) {
        st = arl_error_prefix(st, "env %s", where);
        arl_env_free(e);
        return st;
    }
    e->info_body = malloc(e->ctl->call.response_len + 1);
    if (!e->info_body) {
        arl_env_free(e);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    memcpy(e->info_body, e->ctl->call.response, e->ctl->call.response_len + 1);
    e->info_len = e->ctl->call.response_len;
    *out = e;
    return ARL_OK;
}

void arl_env_free(arl_env *e) {
    if (!e) return;
    if (e->ctl) {
        e->n_sessions++;
        arl_env_session_free(e->ctl);
    }
    if (e->vt && e->inst) e->vt->destroy_instance(e->inst);
    arl_env_info_clear(&e->info);
    arl_env_error_clear(&e->last_error);
    free(e->info_body);
    free(e->base);
    free(e);
}

const arl_env_info *arl_env_get_info(const arl_env *e) { return &e->info; }
const char *arl_env_info_body(const arl_env *e, size_t *len) {
    if (len) *len = e->info_len;
    return e->info_body;
}
const arl_env_error *arl_env_last_error(const arl_env *e) { return &e->last_error; }
int arl_env_is_remote(const arl_env *e) { return e->remote; }

arl_status arl_env_health(arl_env *e, int64_t *active, int64_t *max) {
    arl_status st = begin(e->ctl, ARL_ENV_EP_HEALTH, "/health", NULL, 0, 0, arl_nomem_count());
    if (st == ARL_OK) st = run_sync(e->ctl);
    arl_env_error_clear(&e->last_error);
    if (st != ARL_OK) {
        e->last_error = e->ctl->call.error;
        if (e->last_error.details) json_incref(e->last_error.details);
        return st;
    }
    json_error_t je;
    json_t *v = arl_json_loadb(e->ctl->call.response, e->ctl->call.response_len, 0, &je);
    if (!v && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory reading the answer to /health");
    if (active) *active = v ? json_integer_value(json_object_get(v, "active_sessions")) : 0;
    if (max) *max = v ? json_integer_value(json_object_get(v, "max_sessions")) : 0;
    if (v) json_decref(v);
    return ARL_OK;
}

/* ---- sessions ---- */

static int64_t clamp_deadline(const arl_env *e, int64_t d, int64_t def) {
    if (d <= 0) d = def;
    if (d < 1000) d = 1000;
    if (d > e->info.limits.max_deadline_ms) d = e->info.limits.max_deadline_ms;
    return d;
}

static char *dump_with_deadline(json_t *o, int64_t deadline, size_t *len) {
    json_object_set_new(o, "deadline_ms", json_integer(deadline));
    char *s = aep_json_dumps(o, len);
    json_decref(o);
    return s;
}

static arl_status check_idle(arl_env_session *s) {
    if (s->busy) return arl_errorf(ARL_ERR_STATE, "env session %s: a call is already in flight", s->sid);
    return ARL_OK;
}

arl_status arl_env_session_create_begin(arl_env *e, const arl_env_create_req *req, arl_env_session **out) {
    const unsigned long n0 = arl_nomem_count();
    *out = NULL;
    if (!req->trajectory_id || !req->group_id || !req->task.id)
        return arl_errorf(ARL_ERR_ARG, "env: create needs trajectory_id, group_id and task.id");
    arl_env_session *s = session_new(e);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    snprintf(s->traj, sizeof s->traj, "%s", req->trajectory_id);
    int64_t d = clamp_deadline(e, req->deadline_ms, e->client->cfg.create_deadline_ms);
    json_t *o = json_object();
    json_t *task = json_object();
    if (!o || !task) {
        if (o) json_decref(o);
        if (task) json_decref(task);
        arl_env_session_free(s);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    json_object_set_new(o, "trajectory_id", json_string(req->trajectory_id));
    json_object_set_new(o, "group_id", json_string(req->group_id));
    json_object_set_new(task, "id", json_string(req->task.id));
    json_object_set_new(task, "seed", json_integer((json_int_t)req->task.seed));
    json_object_set_new(task, "data", req->task.data ? json_deep_copy(req->task.data) : json_object());
    json_object_set_new(o, "task", task);
    if (req->options) json_object_set_new(o, "options", json_deep_copy(req->options));
    size_t len;
    char *body = dump_with_deadline(o, d, &len);
    if (!body) {
        arl_env_session_free(s);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    s->rq.x.trajectory_id = s->traj;
    arl_status st = begin(s, ARL_ENV_EP_CREATE, "/sessions", body, len, d, n0);
    if (st != ARL_OK) {
        arl_env_session_free(s);
        return st;
    }
    *out = s;
    return ARL_OK;
}

arl_status arl_env_session_create(arl_env *e, const arl_env_create_req *req, arl_env_session **out) {
    ARL_TRY(arl_env_session_create_begin(e, req, out));
    return run_sync(*out);
}

static arl_status path_for(arl_env_session *s, const char *suffix, char *buf, size_t cap) {
    if (!s->sid[0]) return arl_errorf(ARL_ERR_STATE, "env: session has no id (creation did not succeed)");
    snprintf(buf, cap, "/sessions/%s%s", s->sid, suffix);
    return ARL_OK;
}

arl_status arl_env_session_step_begin(arl_env_session *s, const arl_env_action *a, int64_t deadline_ms) {
    const unsigned long n0 = arl_nomem_count();
    ARL_TRY(check_idle(s));
    char path[200];
    ARL_TRY(path_for(s, "/step", path, sizeof path));
    arl_env *e = s->env;
    int64_t d = clamp_deadline(e, deadline_ms, e->info.limits.default_step_timeout_ms);
    int64_t k = s->last_step + 1;
    size_t len;
    char *body = aep_step_request(k, a, d, &len);
    if (!body) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    req_state *r = &s->rq;
    int32_t n = a->n_tool_calls + a->n_parse_errors;
    char **ids = n ? calloc((size_t)n, sizeof *ids) : NULL;
    if (n && !ids) {
        free(body);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        const char *id = i < a->n_tool_calls ? a->tool_calls[i].id : a->parse_errors[i - a->n_tool_calls].id;
        ids[i] = strdup(id ? id : "");
        if (!ids[i]) {
            for (int32_t j = 0; j < i; j++) free(ids[j]);
            free(ids);
            free(body);
            return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
        }
    }
    r->ids = ids;
    r->n_ids = n;
    r->step_index = k;
    memset(&r->x, 0, sizeof r->x);
    r->x.step_index = k;
    r->x.call_ids = (const char *const *)ids;
    r->x.n_call_ids = a->n_tool_calls;
    r->x.perr_ids = (const char *const *)(ids + a->n_tool_calls);
    r->x.n_perr_ids = a->n_parse_errors;
    return begin(s, ARL_ENV_EP_STEP, path, body, len, d, n0);
}

arl_status arl_env_session_step(arl_env_session *s, const arl_env_action *a, int64_t deadline_ms) {
    ARL_TRY(arl_env_session_step_begin(s, a, deadline_ms));
    return run_sync(s);
}

static arl_status score_begin(arl_env_session *s, int seg, int64_t segment_index, int64_t first, int64_t last,
                              arl_env_score_reason reason, int64_t deadline_ms) {
    const unsigned long n0 = arl_nomem_count();
    ARL_TRY(check_idle(s));
    char path[200];
    ARL_TRY(path_for(s, "/score", path, sizeof path));
    int64_t d = clamp_deadline(s->env, deadline_ms, s->client->cfg.score_deadline_ms);
    json_t *o = json_object();
    if (!o) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    json_object_set_new(o, "scope", json_string(seg ? "segment" : "episode"));
    if (seg) {
        json_object_set_new(o, "segment_index", json_integer(segment_index));
        json_object_set_new(o, "step_range", json_pack("[I,I]", (json_int_t)first, (json_int_t)last));
    } else {
        json_object_set_new(o, "reason", json_string(arl_env_score_reason_str(reason)));
    }
    size_t len;
    char *body = dump_with_deadline(o, d, &len);
    if (!body) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    memset(&s->rq.x, 0, sizeof s->rq.x);
    s->rq.x.scope = seg ? ARL_ENV_SCOPE_SEGMENT : ARL_ENV_SCOPE_EPISODE;
    s->rq.x.segment_index = segment_index;
    return begin(s, ARL_ENV_EP_SCORE, path, body, len, d, n0);
}

arl_status arl_env_session_score_segment_begin(arl_env_session *s, int64_t segment_index, int64_t first, int64_t last,
                                               int64_t deadline_ms) {
    return score_begin(s, 1, segment_index, first, last, ARL_ENV_REASON_TERMINATED, deadline_ms);
}
arl_status arl_env_session_score_episode_begin(arl_env_session *s, arl_env_score_reason reason, int64_t deadline_ms) {
    return score_begin(s, 0, 0, 0, 0, reason, deadline_ms);
}
arl_status arl_env_session_score_segment(arl_env_session *s, int64_t segment_index, int64_t first, int64_t last,
                                         int64_t deadline_ms) {
    ARL_TRY(arl_env_session_score_segment_begin(s, segment_index, first, last, deadline_ms));
    return run_sync(s);
}
arl_status arl_env_session_score_episode(arl_env_session *s, arl_env_score_reason reason, int64_t deadline_ms) {
    ARL_TRY(arl_env_session_score_episode_begin(s, reason, deadline_ms));
    return run_sync(s);
}

arl_status arl_env_session_fork(arl_env_session *s, const char *child_traj, const char *group_id,
                                int64_t at_step_index, int64_t deadline_ms, arl_env_session **child) {
    const unsigned long n0 = arl_nomem_count();
    *child = NULL;
    ARL_TRY(check_idle(s));
    char path[200];
    ARL_TRY(path_for(s, "/fork", path, sizeof path));
    arl_env_session *c = session_new(s->env);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    snprintf(c->traj, sizeof c->traj, "%s", child_traj ? child_traj : "");
    int64_t d = clamp_deadline(s->env, deadline_ms, s->client->cfg.fork_deadline_ms);
    json_t *o = json_pack("{s:s,s:s,s:I}", "trajectory_id", child_traj ? child_traj : "", "group_id",
                          group_id ? group_id : "", "at_step_index", (json_int_t)at_step_index);
    size_t len;
    char *body = o ? dump_with_deadline(o, d, &len) : NULL;
    if (!body) {
        arl_env_session_free(c);
        return arl_errorf(ARL_ERR_NOMEM, "env: out of memory");
    }
    memset(&s->rq.x, 0, sizeof s->rq.x);
    s->rq.x.step_index = at_step_index;
    s->rq.x.trajectory_id = c->traj;
    s->rq.child = c;
    arl_status st = begin(s, ARL_ENV_EP_FORK, path, body, len, d, n0);
    if (st == ARL_OK) st = run_sync(s);
    s->rq.child = NULL;
    if (st != ARL_OK) {
        arl_env_session_free(c);
        return st;
    }
    *child = c;
    return ARL_OK;
}

arl_status arl_env_session_get(arl_env_session *s) {
    ARL_TRY(check_idle(s));
    char path[200];
    ARL_TRY(path_for(s, "", path, sizeof path));
    memset(&s->rq.x, 0, sizeof s->rq.x);
    ARL_TRY(begin(s, ARL_ENV_EP_GET, path, NULL, 0, 0, arl_nomem_count()));
    return run_sync(s);
}

arl_status arl_env_session_delete_begin(arl_env_session *s, const char *reason) {
    ARL_TRY(check_idle(s));
    char path[300];
    if (!s->sid[0]) return arl_errorf(ARL_ERR_STATE, "env: session has no id");
    memset(&s->rq.x, 0, sizeof s->rq.x);
    if (!s->env->remote)
        return begin(s, ARL_ENV_EP_DELETE, reason ? reason : "completed", NULL, 0, 0,
                     arl_nomem_count());
    snprintf(path, sizeof path, "/sessions/%s?reason=%s", s->sid, reason ? reason : "completed");
    return begin(s, ARL_ENV_EP_DELETE, path, NULL, 0, 0, arl_nomem_count());
}

arl_status arl_env_session_delete(arl_env_session *s, const char *reason) {
    ARL_TRY(arl_env_session_delete_begin(s, reason));
    return run_sync(s);
}

int arl_env_session_busy(const arl_env_session *s) { return s->busy; }
const arl_env_call *arl_env_session_call(const arl_env_session *s) { return &s->call; }
const char *arl_env_session_id(const arl_env_session *s) { return s->sid; }
const char *arl_env_session_trajectory(const arl_env_session *s) { return s->traj; }
int64_t arl_env_session_last_step(const arl_env_session *s) { return s->last_step; }
int arl_env_session_ended(const arl_env_session *s) { return s->ended; }
arl_env *arl_env_session_env(const arl_env_session *s) { return s->env; }
void arl_env_session_set_user(arl_env_session *s, void *user) { s->user = user; }
void *arl_env_session_user(const arl_env_session *s) { return s->user; }
