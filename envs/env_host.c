/* envs/env_host.c: the AEP/1 server state machine around a typed environment (arl_env_def),
 * exposed through the byte-level C ABI of spec §14 (arl_env_vtable).
 *
 * It owns everything an environment author should not have to write: session ids, the
 * trajectory-id namespace shared by create and fork (§6.3, §6.6), the order of checks (§8.7
 * checks 3-6, without the HTTP-only checks 1, 2 and the header part of 4), step sequencing and
 * byte-identical replays (§6.4, §10), score keys (§6.5), fork rules including fork_past (§6.6),
 * the lifecycle (§7), capacity and draining (§6.2, §6.3), busy sessions (§2.4: STEP_IN_PROGRESS,
 * and waiting retries of the executing request), idle reaping (§11.6), max_steps truncation,
 * TOOL_CALL_LIMIT without parallel_tool_calls (§4.6), the observation budget (below) and
 * validation of the environment's own output with the client's parser before it is sent.
 *
 * The observation budget.  A step's observation must fit min(limits.max_observation_bytes,
 * 8 MiB) serialised and 4096 messages (§12.1, the client defaults), yet every call of the
 * action needs its tool message (§4.3), and many calls or long outputs are model faults that
 * are answered 200 (§9 rule 1).  So when the environment's observation is too large, the host
 * shortens its tool messages, deterministically (a function of that observation alone, so
 * deterministic_replay holds), and only as far as needed:
 *   1. error tool messages (is_error) lose their text, last first: content "", tool_call_id
 *      and error_code kept (the chat template shows the code).  A flood of calls is mostly
 *      error answers (TOOL_CALL_LIMIT past the environment's per-turn cap), and the first of
 *      them keep their explanation;
 *   2. then tool outputs longer than a common size are cut to it, the largest size that fits,
 *      at a UTF-8 character boundary, end in "...[truncated]" and carry output_truncated and
 *      original_bytes (§4.1); a parts content becomes its text, images dropped.
 * User messages are never changed, and rewards are the environment's (calls past its cap are
 * already counted in its format penalty).  Only when even that shortest answer does not fit
 * (in the calculator's 64 KiB, about 600 calls) is the step answered 500
 * X_OBSERVATION_TOO_LARGE (not retryable, attribution env, the numbers in the message) and the
 * session failed: never ENV_INTERNAL.
 *
 * Locking: one mutex per instance protects the tables and every session's metadata; an
 * environment callback runs without it, with the session marked busy (so no other call touches
 * that session's state).  Environments with thread_safety 0 are additionally serialised by a
 * second mutex.  Not here: HTTP (envs/aep_server.c). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "core/rng.h"
#include "envs/aep_json.h"

#define HOST_STEP_IN_PROGRESS_MS 100 /* retry_after_ms hint for STEP_IN_PROGRESS */
#define HOST_CAPACITY_RETRY_MS 1000  /* retry_after_ms hint for CAPACITY_REACHED / DRAINING */
#define HOST_MAX_TOMBSTONES 65536    /* default: closed sessions remembered for 410 answers */
#define HOST_TOO_LARGE_CODE "X_OBSERVATION_TOO_LARGE" /* reply_too_large */

/* ---- a small string-keyed hash map ---- */

typedef struct smap_ent {
    char *key; /* NULL: empty; (char *)1: deleted */
    void *val;
} smap_ent;
typedef struct smap {
    smap_ent *e;
    size_t cap, n, used;
} smap;
#define SMAP_DEL ((char *)1)

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}
static void *smap_get(const smap *m, const char *k) {
    if (!m->cap) return NULL;
    for (size_t i = str_hash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].key) return NULL;
        if (m->e[i].key != SMAP_DEL && !strcmp(m->e[i].key, k)) return m->e[i].val;
    }
}
static int smap_put(smap *m, const char *k, void *v);
/* Rehash into a table sized for the live entries: deleted slots count towards the load
 * factor, so a table whose entries come and go is rehashed at the same size instead of
 * doubling on every rehash (the maps would otherwise grow with every session ever created). */
static int smap_grow(smap *m) {
    size_t cap = 64;
    while ((m->n + 1) * 2 >= cap)
        cap *= 2;
    smap old = *m;
    m->e = calloc(cap, sizeof *m->e);
    if (!m->e) {
        *m = old;
        return -1;
    }
    m->cap = cap;
    m->n = m->used = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.e[i].key && old.e[i].key != SMAP_DEL) {
            smap_put(m, old.e[i].key, old.e[i].val);
            free(old.e[i].key);
        }
    free(old.e);
    return 0;
}
static int smap_put(smap *m, const char *k, void *v) {
    if ((m->used + 1) * 4 >= m->cap * 3 && smap_grow(m)) return -1;
    size_t i = str_hash(k) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].key) break;
        if (m->e[i].key != SMAP_DEL && !strcmp(m->e[i].key, k)) {
            m->e[i].val = v;
            return 0;
        }
    }
    char *kk = strdup(k);
    if (!kk) return -1;
    m->e[i].key = kk;
    m->e[i].val = v;
    m->n++;
    m->used++;
    return 0;
}
static void smap_del(smap *m, const char *k) {
    if (!m->cap) return;
    for (size_t i = str_hash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].key) return;
        if (m->e[i].key != SMAP_DEL && !strcmp(m->e[i].key, k)) {
            free(m->e[i].key);
            m->e[i].key = SMAP_DEL;
            m->n--;
            return;
        }
    }
}
static void smap_free(smap *m) {
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].key && m->e[i].key != SMAP_DEL) free(m->e[i].key);
    free(m->e);
    memset(m, 0, sizeof *m);
}

/* ---- sessions ---- */

typedef struct hstep {
    char *resp; /* stored response body of this step (step 0: the create response) */
    size_t len;
    json_t *action; /* the action as received (identity comparison); NULL for step 0 */
    void *state;    /* fork_past: state right after this step (owned); else NULL */
    int ended;      /* the response had terminated or truncated */
} hstep;

typedef struct hscore {
    int64_t seg, first, last;
    char *resp;
    size_t len;
} hscore;

typedef struct hsess {
    char sid[48];
    char *traj, *group;
    int is_fork;
    char parent_sid[48];
    int64_t fork_at;
    json_t *task, *options; /* identity of creation (options NULL when absent); a closed
                               session keeps only ident_digest, for 409-or-410 answers */
    uint8_t ident_digest[ARL_SHA256_BYTES];
    int ident_hashed; /* task and options were replaced by ident_digest */
    char *ident_resp; /* the 201 body of create or fork (freed once closed) */
    size_t ident_len;
    void *state;
    int64_t last;     /* last applied step */
    hstep *hist;      /* steps hist_base .. last */
    int64_t hist_base;
    arl_env_session_status status;
    int creating;     /* reserved, creation running */
    int closed;       /* deleted or reaped */
    int counted;      /* counts towards max_sessions */
    int64_t max_steps;
    hscore *segs;
    int32_t n_segs;
    char *ep_resp;
    size_t ep_len;
    int ep_reason; /* -1: not scored */
    int busy;
    arl_env_endpoint busy_ep;
    json_t *busy_body; /* request being executed (deadline_ms removed) */
    pthread_cond_t cv;
    int64_t last_active_ms;
    int refs;
    struct hsess *next_closed; /* tombstone queue */
} hsess;

typedef struct host {
    const arl_env_def *def;
    const arl_env_ops *ops;
    void *env_inst;
    arl_env_info info;
    char *info_body;
    size_t info_len;
    pthread_mutex_t mu;
    pthread_mutex_t envmu;
    smap by_sid, by_traj;
    int64_t active;
    int draining;
    arl_rng rng;
    uint64_t counter;
    hsess *tomb_head, *tomb_tail;
    size_t n_tomb, max_tomb;
    void **grave; /* states to free once h->mu is released (grave_flush) */
    size_t n_grave, cap_grave;
} host;

static void env_lock(host *h) {
    if (!h->ops->thread_safety) pthread_mutex_lock(&h->envmu);
}
static void env_unlock(host *h) {
    if (!h->ops->thread_safety) pthread_mutex_unlock(&h->envmu);
}

/* Environment states are freed outside h->mu (free_state may wait for the environment lock). */
static void grave_push(host *h, void *state) {
    if (!state) return;
    if (h->n_grave == h->cap_grave) {
        size_t cap = h->cap_grave ? 2 * h->cap_grave : 16;
        void **g = realloc(h->grave, cap * sizeof *g);
        if (!g) { /* cannot defer: free now (blocking but correct) */
            if (!h->ops->thread_safety) pthread_mutex_lock(&h->envmu);
            h->ops->free_state(h->env_inst, state);
            if (!h->ops->thread_safety) pthread_mutex_unlock(&h->envmu);
            return;
        }
        h->grave = g;
        h->cap_grave = cap;
    }
    h->grave[h->n_grave++] = state;
}


/* ---- replies ---- */

static int reply_copy(char **resp, size_t *rlen, int status, const char *body, size_t len) {
    *resp = malloc(len + 1);
    if (!*resp) { /* (a 500 without a body; see reply_err for the note) */
        arl_nomem_note();
        *rlen = 0;
        return 500;
    }
    memcpy(*resp, body, len);
    (*resp)[len] = 0;
    *rlen = len;
    return status;
}

static int reply_own(char **resp, size_t *rlen, int status, char *body, size_t len) {
    *resp = body;
    *rlen = len;
    return status;
}

static int reply_err(char **resp, size_t *rlen, arl_env_errcode code, int64_t retry_after_ms,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int reply_err(char **resp, size_t *rlen, arl_env_errcode code, int64_t retry_after_ms,
                     const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the host's own failed allocations are answered with messages that begin so: noted for
     * a client in the same thread (the in-process transport), for which they are its own out of
     * memory, not the environment's fault (core/json_dump.h arl_nomem_note) */
    if (!strncmp(msg, "out of memory", 13)) arl_nomem_note();
    *resp = aep_envelope(code, NULL, msg, retry_after_ms, rlen);
    if (!*resp) *rlen = 0;
    return arl_env_errcode_http(code);
}

/* 500 X_OBSERVATION_TOO_LARGE: a step whose shortest valid observation is over the limits
 * (see the observation budget below).  Not retryable, attribution env: the properties of the
 * RESPONSE_TOO_LARGE a client records for an oversized observation (§8.4), which a server
 * cannot send itself (§8.1 allows §8.3 codes and X_ codes). */
static int reply_too_large(char **resp, size_t *rlen, const char *msg) {
    *resp = aep_envelope(ARL_ENV_E_ENV_INTERNAL, HOST_TOO_LARGE_CODE, msg, -1, rlen);
    if (!*resp) *rlen = 0;
    return 500;
}

/* ---- session memory ---- */

static void hstep_clear(host *h, hstep *s) {
    free(s->resp);
    if (s->action) json_decref(s->action);
    grave_push(h, s->state);
    memset(s, 0, sizeof *s);
}

/* Free deferred states; call without h->mu. */
static void grave_flush(host *h) {
    pthread_mutex_lock(&h->mu);
    void **g = h->grave;
    size_t n = h->n_grave;
    h->grave = NULL;
    h->n_grave = h->cap_grave = 0;
    pthread_mutex_unlock(&h->mu);
    if (!n) {
        free(g);
        return;
    }
    env_lock(h);
    for (size_t i = 0; i < n; i++) h->ops->free_state(h->env_inst, g[i]);
    env_unlock(h);
    free(g);
}

/* §10.1 identity of a creation as a digest (aep_json_ident_hash); 0, or -1 on OOM. */
static int ident_digest(const json_t *task, const json_t *opts, uint8_t out[ARL_SHA256_BYTES]) {
    arl_sha256_ctx c;
    arl_sha256_init(&c);
    if (aep_json_ident_hash(&c, task) || aep_json_ident_hash(&c, opts)) return -1;
    arl_sha256_final(&c, out);
    return 0;
}

/* Do task and options equal the creation identity of t (live or closed)? */
static int sess_ident_equal(const hsess *t, const json_t *task, const json_t *opts) {
    if (!t->ident_hashed)
        return aep_json_ident_equal(t->task, task) && aep_json_ident_equal(t->options, opts);
    uint8_t d[ARL_SHA256_BYTES];
    return !ident_digest(task, opts, d) && !memcmp(d, t->ident_digest, sizeof d);
}

/* Free the heavy parts of a closed session (state, history, scores, the create/fork response,
 * task and options: a request may carry megabytes of task data, and closed sessions are
 * remembered by the thousand); keeps what answers repeats: ids and a digest of the identity. */
static void sess_release(host *h, hsess *s) {
    if (s->closed) {
        /* a fork's repeats compare parent, step and group only */
        if (!s->is_fork && !s->ident_hashed && s->task &&
            !ident_digest(s->task, s->options, s->ident_digest))
            s->ident_hashed = 1;
        if (s->is_fork || s->ident_hashed) {
            if (s->task) json_decref(s->task);
            if (s->options) json_decref(s->options);
            s->task = s->options = NULL;
        }
        free(s->ident_resp);
        s->ident_resp = NULL;
        s->ident_len = 0;
    }
    grave_push(h, s->state);
    s->state = NULL;
    if (s->hist) {
        for (int64_t i = 0; i <= s->last - s->hist_base; i++) hstep_clear(h, &s->hist[i]);
        free(s->hist);
        s->hist = NULL;
    }
    for (int32_t i = 0; i < s->n_segs; i++) free(s->segs[i].resp);
    free(s->segs);
    s->segs = NULL;
    s->n_segs = 0;
    free(s->ep_resp);
    s->ep_resp = NULL;
}

static void sess_free(host *h, hsess *s) {
    sess_release(h, s);
    free(s->traj);
    free(s->group);
    if (s->task) json_decref(s->task);
    if (s->options) json_decref(s->options);
    free(s->ident_resp);
    if (s->busy_body) json_decref(s->busy_body);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Mark closed (under h->mu).  The heavy parts are freed now unless a call is executing. */
static void sess_close_locked(host *h, hsess *s) {
    if (s->closed) return;
    s->closed = 1;
    if (s->counted) {
        s->counted = 0;
        h->active--;
    }
    if (!s->busy) sess_release(h, s);
    s->next_closed = NULL;
    if (h->tomb_tail)
        h->tomb_tail->next_closed = s;
    else
        h->tomb_head = s;
    h->tomb_tail = s;
    h->n_tomb++;
    /* forget the oldest tombstones that nobody references */
    while (h->n_tomb > h->max_tomb && h->tomb_head && !h->tomb_head->refs && !h->tomb_head->busy) {
        hsess *o = h->tomb_head;
        h->tomb_head = o->next_closed;
        if (!h->tomb_head) h->tomb_tail = NULL;
        h->n_tomb--;
        if (smap_get(&h->by_sid, o->sid) == o) smap_del(&h->by_sid, o->sid);
        if (smap_get(&h->by_traj, o->traj) == o) smap_del(&h->by_traj, o->traj);
        sess_free(h, o);
    }
}

static hsess *sess_new(host *h, const char *traj, const char *group) {
    hsess *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->traj = strdup(traj);
    s->group = strdup(group);
    if (!s->traj || !s->group || pthread_cond_init(&s->cv, NULL)) {
        free(s->traj);
        free(s->group);
        free(s);
        return NULL;
    }
    snprintf(s->sid, sizeof s->sid, "s-%llx-%08llx", (unsigned long long)++h->counter,
             (unsigned long long)(arl_rng_next(&h->rng) & 0xffffffffull));
    s->ep_reason = -1;
    s->last_active_ms = aep_now_ms();
    return s;
}

/* ---- request helpers ---- */

static json_t *without_deadline(const json_t *body) {
    json_t *c = json_deep_copy(body);
    if (c && json_is_object(c)) json_object_del(c, "deadline_ms");
    return c;
}

static int64_t body_deadline(host *h, const json_t *body, int64_t def) {
    int64_t d;
    if (!aep_json_get_index(body, "deadline_ms", &d)) d = def;
    if (d > h->info.limits.max_deadline_ms) d = h->info.limits.max_deadline_ms;
    return d;
}

/* §2.4 for a busy session (under h->mu): a retry of the executing request waits until it has
 * finished (returns 0), anything else is STEP_IN_PROGRESS (returns an HTTP status). */
static int busy_gate(host *h, hsess *s, arl_env_endpoint ep, const json_t *body, char **resp,
                     size_t *rlen) {
    if (!s->busy) return 0;
    json_t *mine = without_deadline(body);
    int same = mine && s->busy_ep == ep && aep_json_ident_equal(mine, s->busy_body);
    if (mine) json_decref(mine);
    if (!same)
        return reply_err(resp, rlen, ARL_ENV_E_STEP_IN_PROGRESS, HOST_STEP_IN_PROGRESS_MS,
                         "another request for session %s is executing", s->sid);
    int64_t deadline = body_deadline(h, body, h->info.limits.default_step_timeout_ms);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += deadline / 1000;
    ts.tv_nsec += (deadline % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    s->refs++;
    int rc = 0;
    while (s->busy && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&s->cv, &h->mu, &ts);
    s->refs--;
    if (s->busy)
        return reply_err(resp, rlen, ARL_ENV_E_DEADLINE_EXCEEDED, -1,
                         "the retried request did not finish within deadline_ms %lld",
                         (long long)deadline);
    return 0;
}

/* Lookup for per-session endpoints (check 3), under h->mu. */
static hsess *lookup(host *h, const char *sid, char **resp, size_t *rlen, int *status) {
    hsess *s = sid ? smap_get(&h->by_sid, sid) : NULL;
    if (!s || s->creating) {
        *status = reply_err(resp, rlen, ARL_ENV_E_UNKNOWN_SESSION, -1, "no session '%.128s'",
                            sid ? sid : "");
        return NULL;
    }
    if (s->closed) {
        *status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1,
                            "session '%s' was deleted or reaped", s->sid);
        return NULL;
    }
    return s;
}

static json_t *parse_body(const char *req, size_t len, char **resp, size_t *rlen, int *status) {
    char why[256];
    json_t *v = aep_json_loads(req ? req : "", req ? len : 0, ARL_AEP_MAX_DEPTH, why, sizeof why);
    if (!v) *status = reply_err(resp, rlen, ARL_ENV_E_INVALID_REQUEST, -1, "request body: %s", why);
    return v;
}

/* Validate an output body with the client's parser; 0 if fine, else fills msg. */
static int self_check(host *h, const aep_expect *x, int status, const char *body, size_t len,
                      char *msg, size_t cap) {
    arl_env_error e;
    memset(&e, 0, sizeof e);
    arl_env_result r;
    arl_env_score_result sr;
    memset(&r, 0, sizeof r);
    memset(&sr, 0, sizeof sr);
    aep_response_parse(x, status, "application/json", body, len, &e, &r, &sr, NULL, NULL, NULL);
    int bad = e.code != ARL_ENV_E_NONE;
    if (bad) snprintf(msg, cap, "environment '%s' produced an invalid response (%s): %s", h->def->name,
                      e.code_str, e.violation[0] ? e.violation : e.message);
    arl_env_error_clear(&e);
    arl_env_result_clear(&r);
    arl_env_score_result_clear(&sr);
    (void)h;
    return bad;
}

static int env_status_reply(host *h, arl_status st, int is_reset, char **resp, size_t *rlen) {
    const char *m = arl_error_msg();
    if (st == ARL_ERR_NOMEM) arl_nomem_note(); /* (see reply_err) */
    if (st == ARL_ERR_ARG && is_reset)
        return reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "%s", m && *m ? m : "task data rejected");
    if (st == ARL_ERR_TIMEOUT)
        return reply_err(resp, rlen, ARL_ENV_E_DEADLINE_EXCEEDED, -1, "%s", m && *m ? m : "deadline exceeded");
    if (st == ARL_ERR_BUSY)
        return reply_err(resp, rlen, ARL_ENV_E_CAPACITY_REACHED, HOST_CAPACITY_RETRY_MS, "%s",
                         m && *m ? m : "environment busy");
    return reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "environment '%s': %s", h->def->name,
                     m && *m ? m : arl_status_str(st));
}

/* ---- vtable: info, health ---- */

static int host_info(void *inst, char **resp, size_t *rlen) {
    host *h = inst;
    return reply_copy(resp, rlen, 200, h->info_body, h->info_len);
}

static int host_health(void *inst, char **resp, size_t *rlen) {
    host *h = inst;
    pthread_mutex_lock(&h->mu);
    int draining = h->draining;
    int64_t active = h->active;
    pthread_mutex_unlock(&h->mu);
    if (draining) { /* details.active_sessions lets a front end wait for the drain to finish */
        char buf[400];
        int n = snprintf(buf, sizeof buf,
                         "{\"error\":{\"code\":\"DRAINING\",\"message\":\"server is shutting down (%lld "
                         "sessions remain)\",\"retryable\":true,\"retry_after_ms\":%d,\"attribution\":\"env\","
                         "\"details\":{\"active_sessions\":%lld}}}",
                         (long long)active, HOST_CAPACITY_RETRY_MS, (long long)active);
        return reply_copy(resp, rlen, 503, buf, (size_t)n);
    }
    char buf[160];
    int n = snprintf(buf, sizeof buf, "{\"status\":\"ok\",\"active_sessions\":%lld,\"max_sessions\":%lld}",
                     (long long)active, (long long)h->info.limits.max_sessions);
    return reply_copy(resp, rlen, 200, buf, (size_t)n);
}

/* ---- create ---- */

static int valid_id_member(const json_t *body, const char *k) {
    const json_t *v = json_object_get(body, k);
    return aep_json_cstr(v) && aep_valid_traj_id(aep_json_cstr(v));
}

static int host_reset_impl(void *inst, const char *req, size_t len, char **resp, size_t *rlen) {
    host *h = inst;
    int status;
    json_t *body = parse_body(req, len, resp, rlen, &status);
    if (!body) return status;
    /* check 5: schema */
    const json_t *task = json_object_get(body, "task"), *opts = json_object_get(body, "options");
    const json_t *tid = json_object_get(task, "id"), *data = json_object_get(task, "data");
    int64_t seed = 0, deadline = 0, max_steps = h->info.limits.max_steps;
    if (!json_is_object(body)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "request body: expected a JSON object");
        goto out;
    }
    const char *bad = NULL;
    if (!valid_id_member(body, "trajectory_id"))
        bad = "/trajectory_id: expected 1-256 characters of [A-Za-z0-9._:/@#+-]";
    else if (!valid_id_member(body, "group_id"))
        bad = "/group_id: expected 1-256 characters of [A-Za-z0-9._:/@#+-]";
    else if (!json_is_object(task))
        bad = "/task: expected an object";
    else if (!aep_json_cstr(tid) || json_string_length(tid) < 1 || json_string_length(tid) > 256)
        bad = "/task/id: expected a string of 1-256 bytes without U+0000";
    else if (!aep_json_get_index(task, "seed", &seed))
        bad = "/task/seed: expected an integer in [0, 2^53-1]";
    else if (!json_is_object(data))
        bad = "/task/data: expected an object";
    else if (opts && !json_is_null(opts) && !json_is_object(opts))
        bad = "/options: expected an object";
    else if (!aep_json_get_index(body, "deadline_ms", &deadline))
        bad = "/deadline_ms: required integer in [0, 2^53-1]";
    if (!bad && json_is_object(opts)) {
        const json_t *ms = json_object_get(opts, "max_steps");
        if (ms && !json_is_null(ms)) {
            if (!aep_json_get_index(opts, "max_steps", &max_steps) || max_steps < 1 ||
                max_steps > h->info.limits.max_steps)
                bad = "/options/max_steps: expected an integer in [1, limits.max_steps]";
        }
    }
    if (bad) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "%s", bad);
        goto out;
    }
    if (json_is_null(opts)) opts = NULL;
    const char *traj = json_string_value(json_object_get(body, "trajectory_id"));
    const char *group = json_string_value(json_object_get(body, "group_id"));

    pthread_mutex_lock(&h->mu);
    /* check 6, §6.3 rule 2: repeats first */
    for (;;) {
        hsess *t = smap_get(&h->by_traj, traj);
        if (!t) break;
        if (t->is_fork || strcmp(t->group, group) || !sess_ident_equal(t, task, opts)) {
            pthread_mutex_unlock(&h->mu);
            status = reply_err(resp, rlen, ARL_ENV_E_TRAJECTORY_CONFLICT, -1,
                               "trajectory_id '%.200s' was used with other identity members", traj);
            goto out;
        }
        if (t->creating) { /* a retry of the creation in progress: wait for it */
            int st = busy_gate(h, t, ARL_ENV_EP_CREATE, body, resp, rlen);
            if (st) {
                pthread_mutex_unlock(&h->mu);
                status = st;
                goto out;
            }
            continue; /* finished (or failed and removed): look again */
        }
        if (t->closed) {
            pthread_mutex_unlock(&h->mu);
            status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1,
                               "trajectory '%.200s': its session was deleted or reaped", traj);
            goto out;
        }
        t->last_active_ms = aep_now_ms();
        status = reply_copy(resp, rlen, 200, t->ident_resp, t->ident_len);
        pthread_mutex_unlock(&h->mu);
        goto out;
    }
    if (h->draining) {
        pthread_mutex_unlock(&h->mu);
        status = reply_err(resp, rlen, ARL_ENV_E_DRAINING, HOST_CAPACITY_RETRY_MS,
                           "server is draining and accepts no new sessions");
        goto out;
    }
    if (h->active >= h->info.limits.max_sessions) {
        pthread_mutex_unlock(&h->mu);
        status = reply_err(resp, rlen, ARL_ENV_E_CAPACITY_REACHED, HOST_CAPACITY_RETRY_MS,
                           "%lld/%lld sessions active", (long long)h->active,
                           (long long)h->info.limits.max_sessions);
        goto out;
    }
    hsess *s = sess_new(h, traj, group);
    if (!s) {
        pthread_mutex_unlock(&h->mu);
        status = reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "out of memory");
        goto out;
    }
    s->task = json_incref((json_t *)task);
    s->options = opts ? json_incref((json_t *)opts) : NULL;
    s->creating = 1;
    s->busy = 1;
    s->busy_ep = ARL_ENV_EP_CREATE;
    s->busy_body = without_deadline(body);
    s->counted = 1;
    s->max_steps = max_steps;
    s->refs = 1;
    h->active++;
    if (smap_put(&h->by_traj, traj, s) || smap_put(&h->by_sid, s->sid, s)) {
        smap_del(&h->by_traj, traj);
        h->active--;
        pthread_mutex_unlock(&h->mu);
        sess_free(h, s);
        status = reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "out of memory");
        goto out;
    }
    pthread_mutex_unlock(&h->mu);

    /* execute */
    arl_env_reset_req rq;
    memset(&rq, 0, sizeof rq);
    rq.trajectory_id = traj;
    rq.group_id = group;
    rq.task.id = json_string_value(tid);
    rq.task.seed = (uint64_t)seed;
    rq.task.data = data;
    rq.options = opts;
    rq.max_steps = max_steps;
    rq.deadline_ms = deadline > h->info.limits.max_deadline_ms ? h->info.limits.max_deadline_ms : deadline;
    arl_env_result out;
    memset(&out, 0, sizeof out);
    void *state = NULL;
    arl_error_clear();
    env_lock(h);
    arl_status st = h->ops->reset(h->env_inst, &rq, &state, &out);
    env_unlock(h);
    char *rb = NULL;
    size_t rl = 0;
    char msg[700] = "";
    if (st == ARL_OK) {
        json_t *o = json_object();
        json_t *obs = aep_obs_to_json(&out.obs);
        if (o && obs) {
            json_object_set_new(o, "session_id", json_string(s->sid));
            json_object_set_new(o, "trajectory_id", json_string(traj));
            json_object_set_new(o, "step_index", json_integer(0));
            json_object_set_new(o, "observation", obs);
            json_object_set_new(o, "info", out.info ? json_incref(out.info) : json_object());
            rb = aep_json_dumps(o, &rl);
        } else if (obs) {
            json_decref(obs);
        }
        if (o) json_decref(o);
        aep_expect x = {.endpoint = ARL_ENV_EP_CREATE, .info = &h->info, .trajectory_id = traj};
        if (!rb)
            snprintf(msg, sizeof msg, "out of memory serialising the create response");
        else
            self_check(h, &x, 201, rb, rl, msg, sizeof msg);
    }
    void *snap = NULL;
    if (st == ARL_OK && !msg[0] && h->info.caps.fork_past) {
        env_lock(h);
        arl_status fs = h->ops->fork(h->env_inst, state, &snap);
        env_unlock(h);
        if (fs != ARL_OK) snprintf(msg, sizeof msg, "fork_past snapshot of step 0 failed: %s", arl_error_msg());
    }
    arl_env_result_clear(&out);

    pthread_mutex_lock(&h->mu);
    s->busy = 0;
    s->refs--;
    pthread_cond_broadcast(&s->cv);
    if (st != ARL_OK || msg[0] || !(s->hist = calloc(1, sizeof *s->hist))) {
        smap_del(&h->by_traj, traj);
        smap_del(&h->by_sid, s->sid);
        if (s->counted) h->active--;
        s->counted = 0;
        int waiters = s->refs;
        pthread_mutex_unlock(&h->mu);
        env_lock(h);
        if (state) h->ops->free_state(h->env_inst, state);
        if (snap) h->ops->free_state(h->env_inst, snap);
        env_unlock(h);
        free(rb);
        if (st != ARL_OK)
            status = env_status_reply(h, st, 1, resp, rlen);
        else
            status = reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "%s", msg[0] ? msg : "out of memory");
        /* waiters (retries) re-look the trajectory up and find it gone; the object must live
         * until they leave: hand it to the tombstone queue instead of freeing it */
        if (waiters) {
            pthread_mutex_lock(&h->mu);
            s->creating = 0;
            s->closed = 1;
            s->next_closed = NULL;
            if (h->tomb_tail) h->tomb_tail->next_closed = s; else h->tomb_head = s;
            h->tomb_tail = s;
            h->n_tomb++;
            pthread_mutex_unlock(&h->mu);
        } else {
            sess_free(h, s);
        }
        goto out;
    }
    s->creating = 0;
    s->state = state;
    s->hist_base = 0;
    s->last = 0;
    s->hist[0].resp = rb;
    s->hist[0].len = rl;
    s->hist[0].state = snap;
    s->ident_resp = malloc(rl + 1);
    if (s->ident_resp) {
        memcpy(s->ident_resp, rb, rl + 1);
        s->ident_len = rl;
    }
    s->status = ARL_ENV_STATUS_ACTIVE;
    s->last_active_ms = aep_now_ms();
    if (s->busy_body) {
        json_decref(s->busy_body);
        s->busy_body = NULL;
    }
    status = reply_copy(resp, rlen, 201, rb, rl);
    pthread_mutex_unlock(&h->mu);
out:
    json_decref(body);
    return status;
}

/* ---- step ---- */

/* Answer calls after the first with TOOL_CALL_LIMIT (no parallel_tool_calls, §4.6): inserted
 * right after the message that answers call 0. */
static arl_status insert_call_limits(arl_env_observation *o, const arl_env_action *a) {
    int32_t extra = a->n_tool_calls - 1;
    if (extra <= 0) return ARL_OK;
    arl_env_observation tmp;
    memset(&tmp, 0, sizeof tmp);
    for (int32_t i = 1; i < a->n_tool_calls; i++)
        ARL_TRY(arl_env_obs_add_tool(&tmp, a->tool_calls[i].id,
                                     "Only one tool call per turn is allowed; this call was not executed.",
                                     ARL_ENV_TOOL_CALL_LIMIT));
    int32_t n = o->n_messages + extra;
    arl_env_message *m = realloc(o->messages, (size_t)n * sizeof *m);
    if (!m) {
        arl_env_observation_clear(&tmp);
        return arl_errorf(ARL_ERR_NOMEM, "out of memory");
    }
    o->messages = m;
    o->cap_messages = n;
    int32_t at = o->n_messages > 0 ? 1 : 0;
    memmove(&m[at + extra], &m[at], (size_t)(o->n_messages - at) * sizeof *m);
    memcpy(&m[at], tmp.messages, (size_t)extra * sizeof *m);
    o->n_messages = n;
    free(tmp.messages);
    return ARL_OK;
}

/* ---- the observation budget (§12.1 max_observation_bytes, §9 rule 1) ---- */

/* What a step may send: min(limits.max_observation_bytes, the client's default cap) bytes and
 * the client's default number of messages, which the self-check (client parser) enforces. */
static void obs_caps(const host *h, size_t *max_bytes, int64_t *max_messages) {
    arl_env_client_config cc;
    arl_env_client_config_default(&cc);
    int64_t b = h->info.limits.max_observation_bytes;
    if (cc.max_observation_bytes < b) b = cc.max_observation_bytes;
    *max_bytes = (size_t)b;
    *max_messages = cc.max_messages;
}

#define HOST_CUT_MARKER "...[truncated]" /* ends a tool output the host cut */

/* Serialised size of v as the host sends it (aep_json_dumps); SIZE_MAX on OOM. */
static size_t json_size(const json_t *v) {
    size_t l = 0;
    char *b = aep_json_dumps(v, &l);
    if (!b) return SIZE_MAX;
    free(b);
    return l;
}

/* Bytes one byte of a string takes once escaped by aep_json_dumps. */
static size_t esc_len(unsigned char c) {
    if (c == '"' || c == '\\') return 2;
    if (c >= 0x20) return 1;
    return c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f' ? 2 : 6;
}

/* The longest prefix of s[0..n) that ends at a UTF-8 character boundary and takes at most
 * budget bytes escaped; returns its length, its escaped size in *esc. */
static size_t escaped_prefix(const char *s, size_t n, size_t budget, size_t *esc) {
    size_t i = 0, e = 0;
    while (i < n && e + esc_len((unsigned char)s[i]) <= budget)
        e += esc_len((unsigned char)s[i++]);
    while (i > 0 && i < n && ((unsigned char)s[i] & 0xC0) == 0x80) { /* continuation: 1 byte */
        i--;
        e--;
    }
    *esc = e;
    return i;
}

/* One tool message of an oversized observation. */
typedef struct fit_msg {
    int32_t idx; /* index in obs->messages */
    int is_error;
    size_t full;  /* serialised size as the environment made it */
    size_t now;   /* serialised size after the shortening decided so far */
    size_t bare;  /* error message with content "" */
    size_t cut0;  /* output with content HOST_CUT_MARKER and the truncation flags */
    size_t csize; /* serialised size of its content value, less 2 */
    char *text;   /* output: the text that is cut (content, or the text parts joined); owned */
    size_t tlen;
    int64_t orig; /* original_bytes to report */
} fit_msg;

/* Size of output message f cut so that its kept text takes at most c bytes escaped (or whole
 * when its content fits c, or when cutting would not make it smaller); *keep: bytes kept, or
 * SIZE_MAX for whole. */
static size_t fit_out_size(const fit_msg *f, size_t c, size_t *keep) {
    *keep = SIZE_MAX;
    if (f->csize <= c) return f->full;
    size_t e;
    size_t k = escaped_prefix(f->text, f->tlen, c, &e);
    if (f->cut0 + e >= f->full) return f->full;
    *keep = k;
    return f->cut0 + e;
}

/* Replace a message's content by s (owned), dropping its parts. */
static void msg_set_content(arl_env_message *m, char *s) {
    free(m->content);
    for (int32_t i = 0; i < m->n_parts; i++) {
        free(m->parts[i].text);
        free(m->parts[i].image.png);
    }
    free(m->parts);
    m->parts = NULL;
    m->n_parts = 0;
    m->content_is_parts = 0;
    m->content = s;
}

/* Shorten the tool messages of an observation of `size` bytes (serialised) so that it fits
 * max_bytes, by the rule in the header comment of this file.  Returns 0 (o changed, fits), 1
 * (even the shortest answer does not fit: the reason in msg) or -1 (out of memory). */
static int obs_fit(arl_env_observation *o, size_t size, size_t max_bytes, int64_t max_messages,
                   int32_t n_calls, char *msg, size_t cap) {
    if (o->n_messages > max_messages) {
        snprintf(msg, cap,
                 "the observation answering %d tool calls would hold %d messages, over the %lld "
                 "per observation that clients accept (spec/aep.md 12.1)",
                 (int)n_calls, (int)o->n_messages, (long long)max_messages);
        return 1;
    }
    size_t made = size;
    json_t *oj = aep_obs_to_json(o);
    fit_msg *f = calloc((size_t)o->n_messages + 1, sizeof *f);
    int32_t nf = 0;
    int rc = -1;
    if (!oj || !f) goto done;
    json_t *msgs = json_object_get(oj, "messages");
    for (int32_t i = 0; i < o->n_messages; i++) {
        const arl_env_message *m = &o->messages[i];
        if (m->role != ARL_ENV_ROLE_TOOL) continue;
        json_t *mj = json_array_get(msgs, (size_t)i);
        fit_msg *x = &f[nf++];
        x->idx = i;
        x->is_error = m->is_error;
        x->full = x->now = json_size(mj);
        size_t cs = json_size(json_object_get(mj, "content"));
        if (x->full == SIZE_MAX || cs == SIZE_MAX) goto done;
        x->csize = cs - 2;
        json_object_del(mj, "output_truncated");
        json_object_del(mj, "original_bytes");
        if (json_object_set_new(mj, "content", json_string(""))) goto done;
        if (x->is_error) {
            if ((x->bare = json_size(mj)) == SIZE_MAX) goto done;
            continue;
        }
        /* the text to cut: the content, or the text parts joined (images are dropped) */
        size_t n = 0;
        if (!m->content_is_parts) {
            n = m->content ? strlen(m->content) : 0;
        } else {
            for (int32_t p = 0; p < m->n_parts; p++)
                if (m->parts[p].type == ARL_ENV_PART_TEXT && m->parts[p].text)
                    n += strlen(m->parts[p].text);
        }
        if (!(x->text = malloc(n + 1))) goto done;
        x->tlen = 0;
        if (!m->content_is_parts) {
            memcpy(x->text, m->content ? m->content : "", n);
            x->tlen = n;
        } else {
            for (int32_t p = 0; p < m->n_parts; p++)
                if (m->parts[p].type == ARL_ENV_PART_TEXT && m->parts[p].text) {
                    size_t l = strlen(m->parts[p].text);
                    memcpy(x->text + x->tlen, m->parts[p].text, l);
                    x->tlen += l;
                }
        }
        x->text[x->tlen] = 0;
        int64_t orig = m->content_is_parts ? (int64_t)x->csize : (int64_t)x->tlen;
        x->orig = m->output_truncated && m->original_bytes > orig ? m->original_bytes : orig;
        if (json_object_set_new(mj, "content", json_string(HOST_CUT_MARKER)) ||
            json_object_set_new(mj, "output_truncated", json_true()) ||
            json_object_set_new(mj, "original_bytes", json_integer(x->orig)) ||
            (x->cut0 = json_size(mj)) == SIZE_MAX)
            goto done;
    }
    /* 1: error messages lose their text, last first */
    for (int32_t j = nf - 1; j >= 0 && size > max_bytes; j--)
        if (f[j].is_error && f[j].bare < f[j].now) {
            size -= f[j].now - f[j].bare;
            f[j].now = f[j].bare;
        }
    /* 2: tool outputs are cut to the largest common size c that fits */
    size_t c = SIZE_MAX, keep;
    if (size > max_bytes) {
        size_t rest = size, hi = 0;
        for (int32_t j = 0; j < nf; j++)
            if (!f[j].is_error) {
                rest -= f[j].full;
                if (f[j].csize > hi) hi = f[j].csize;
            }
        size_t need = rest;
        for (int32_t j = 0; j < nf; j++)
            if (!f[j].is_error) need += fit_out_size(&f[j], 0, &keep);
        if (need > max_bytes) {
            snprintf(
                msg, cap,
                "the observation answering %d tool calls takes %zu bytes with every tool message "
                "shortened (%zu bytes as made), over limits.max_observation_bytes %zu",
                (int)n_calls, need, made, max_bytes);
            rc = 1;
            goto done;
        }
        size_t lo = 0; /* fits; hi does not (the outputs whole are the oversize) */
        while (lo + 1 < hi) {
            size_t mid = lo + (hi - lo) / 2, s = rest;
            for (int32_t j = 0; j < nf; j++)
                if (!f[j].is_error) s += fit_out_size(&f[j], mid, &keep);
            if (s <= max_bytes)
                lo = mid;
            else
                hi = mid;
        }
        c = lo;
    }
    /* apply */
    for (int32_t j = 0; j < nf; j++) {
        arl_env_message *m = &o->messages[f[j].idx];
        if (f[j].is_error) {
            if (f[j].now == f[j].full) continue;
            char *e = strdup("");
            if (!e) goto done;
            msg_set_content(m, e);
            m->output_truncated = 0;
            m->original_bytes = 0;
            continue;
        }
        if (c == SIZE_MAX) continue;
        fit_out_size(&f[j], c, &keep);
        if (keep == SIZE_MAX) continue;
        char *t = malloc(keep + sizeof HOST_CUT_MARKER);
        if (!t) goto done;
        memcpy(t, f[j].text, keep);
        memcpy(t + keep, HOST_CUT_MARKER, sizeof HOST_CUT_MARKER);
        msg_set_content(m, t);
        m->output_truncated = 1;
        m->original_bytes = f[j].orig;
    }
    rc = 0;
done:
    if (rc < 0) snprintf(msg, cap, "out of memory shortening the observation");
    for (int32_t j = 0; f && j < nf; j++)
        free(f[j].text);
    free(f);
    if (oj) json_decref(oj);
    return rc;
}

/* The step response body for out (caller frees); NULL on OOM. */
static char *step_body(int64_t k, const arl_env_result *out, size_t *rl) {
    json_t *o = json_object();
    json_t *obs = aep_obs_to_json(&out->obs);
    json_t *comps = aep_components_to_json(out->components, out->n_components);
    char *rb = NULL;
    if (o && obs && comps) {
        json_object_set_new(o, "step_index", json_integer(k));
        json_object_set_new(o, "observation", obs);
        json_object_set_new(o, "reward", json_real(out->reward));
        json_object_set_new(o, "reward_components", comps);
        json_object_set_new(o, "terminated", json_boolean(out->terminated));
        json_object_set_new(o, "truncated", json_boolean(out->truncated));
        json_object_set_new(o, "info", out->info ? json_incref(out->info) : json_object());
        rb = aep_json_dumps(o, rl);
    } else {
        if (obs) json_decref(obs);
        if (comps) json_decref(comps);
    }
    if (o) json_decref(o);
    return rb;
}

/* The end of a call sess_enter admitted, with h->mu held: the session is free again and its
 * waiters wake.  A failed call (st, or a self-check message in msg) marks the session failed
 * unless it timed out, and releases it if it was closed meanwhile; returns 1 then, and the
 * caller unlocks and replies with the error. */
static int sess_leave_locked(host *h, hsess *s, arl_status st, const char *msg) {
    s->busy = 0;
    s->refs--;
    if (s->busy_body) {
        json_decref(s->busy_body);
        s->busy_body = NULL;
    }
    pthread_cond_broadcast(&s->cv);
    s->last_active_ms = aep_now_ms();
    if (st == ARL_OK && !msg[0]) return 0;
    if (st != ARL_ERR_TIMEOUT) s->status = ARL_ENV_STATUS_FAILED;
    if (s->closed) sess_release(h, s);
    return 1;
}

/* The common start of the step and score endpoints (checks 3 and 4): look the session up, parse
 * the body outside the lock (the session is held by a reference meanwhile), pass the busy gate
 * and the deleted-while-waiting check.  Returns the session with h->mu held and *body set
 * (caller decrefs), or NULL with h->mu released, the reply in resp and its HTTP status in
 * *status. */
static hsess *sess_enter(host *h, const char *sid, arl_env_endpoint ep, const char *req,
                         size_t len, char **resp, size_t *rlen, int *status, json_t **body) {
    pthread_mutex_lock(&h->mu);
    hsess *s = lookup(h, sid, resp, rlen, status);
    if (!s) {
        pthread_mutex_unlock(&h->mu);
        return NULL;
    }
    s->refs++;
    pthread_mutex_unlock(&h->mu);
    json_t *b = parse_body(req, len, resp, rlen, status);
    pthread_mutex_lock(&h->mu);
    s->refs--;
    if (!b) {
        pthread_mutex_unlock(&h->mu);
        return NULL;
    }
    s->last_active_ms = aep_now_ms();
    *status = busy_gate(h, s, ep, b, resp, rlen);
    if (!*status && s->closed)
        *status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "session '%s' was deleted",
                            s->sid);
    if (*status) {
        pthread_mutex_unlock(&h->mu);
        json_decref(b);
        return NULL;
    }
    *body = b;
    return s;
}

static int host_step_impl(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    host *h = inst;
    int status = 0;
    json_t *body = NULL;
    hsess *s = sess_enter(h, sid, ARL_ENV_EP_STEP, req, len, resp, rlen, &status, &body);
    if (!s) return status;
    /* check 5: schema (cheap; done under the lock so the session cannot change meanwhile) */
    int64_t k = 0, deadline = 0;
    arl_env_action act;
    char why[512];
    const json_t *aj = json_object_get(body, "action");
    if (!json_is_object(body)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "request body: expected a JSON object");
    } else if (!aep_json_get_index(body, "step_index", &k)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/step_index: required integer in [0, 2^53-1]");
    } else if (!aep_json_get_index(body, "deadline_ms", &deadline)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/deadline_ms: required integer in [0, 2^53-1]");
    } else if (!aj) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/action: required object missing");
    } else if (aep_action_from_json(aj, &act, why, sizeof why)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "%s", why);
    }
    if (status) {
        pthread_mutex_unlock(&h->mu);
        json_decref(body);
        return status;
    }
    /* check 6: §6.4 rule 1 */
    int64_t m = s->last;
    if (k == m && m >= 1) {
        hstep *hs = &s->hist[m - s->hist_base];
        if (aep_json_ident_equal(hs->action, aj))
            status = reply_copy(resp, rlen, 200, hs->resp, hs->len);
        else
            status = reply_err(resp, rlen, ARL_ENV_E_STEP_CONFLICT, -1,
                               "step %lld was applied with a different action", (long long)k);
    } else if (k == m + 1) {
        if (s->status == ARL_ENV_STATUS_FAILED)
            status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "session '%s' has failed", s->sid);
        else if (s->status != ARL_ENV_STATUS_ACTIVE)
            status = reply_err(resp, rlen, ARL_ENV_E_EPISODE_ENDED, -1, "the episode ended at step %lld (%s)",
                               (long long)m, arl_env_session_status_str(s->status));
    } else {
        status = reply_err(resp, rlen, ARL_ENV_E_STEP_CONFLICT, -1, "step_index %lld out of sequence (last applied %lld)",
                           (long long)k, (long long)m);
    }
    if (status) {
        pthread_mutex_unlock(&h->mu);
        arl_env_action_clear(&act);
        json_decref(body);
        return status;
    }
    /* execute */
    s->busy = 1;
    s->busy_ep = ARL_ENV_EP_STEP;
    s->busy_body = without_deadline(body);
    s->refs++;
    int64_t max_steps = s->max_steps;
    pthread_mutex_unlock(&h->mu);

    arl_env_step_req rq = {.step_index = k, .action = &act, .max_steps = max_steps,
                           .deadline_ms = deadline > h->info.limits.max_deadline_ms ? h->info.limits.max_deadline_ms : deadline};
    arl_env_action first;
    int limited = !h->info.caps.parallel_tool_calls && act.n_tool_calls > 1;
    if (limited) { /* the environment sees only the first call */
        first = act;
        first.n_tool_calls = 1;
        rq.action = &first;
    }
    arl_env_result out;
    memset(&out, 0, sizeof out);
    arl_error_clear();
    env_lock(h);
    arl_status st = h->ops->step(h->env_inst, s->state, &rq, &out);
    void *snap = NULL;
    if (st == ARL_OK && h->info.caps.fork_past) {
        st = h->ops->fork(h->env_inst, s->state, &snap);
        if (st != ARL_OK) arl_error_prefix(st, "fork_past snapshot of step %lld", (long long)k);
    }
    env_unlock(h);
    char *rb = NULL;
    size_t rl = 0;
    char msg[700] = "";
    if (st == ARL_OK && limited && insert_call_limits(&out.obs, &act) != ARL_OK)
        snprintf(msg, sizeof msg, "out of memory");
    int too_large = 0;
    if (st == ARL_OK && !msg[0]) {
        if (!out.terminated && !out.truncated && k >= max_steps) out.truncated = 1;
        rb = step_body(k, &out, &rl);
        /* the observation budget: a model fault (many calls, long outputs) is still answered */
        size_t max_obs, off, olen;
        int64_t max_msgs;
        obs_caps(h, &max_obs, &max_msgs);
        if (rb && aep_json_member_span(rb, rl, "observation", &off, &olen) &&
            (olen > max_obs || out.obs.n_messages > max_msgs)) {
            int fr = obs_fit(&out.obs, olen, max_obs, max_msgs, act.n_tool_calls, msg, sizeof msg);
            free(rb);
            rb = NULL;
            if (fr > 0) too_large = 1;
            if (!fr && !(rb = step_body(k, &out, &rl))) snprintf(msg, sizeof msg, "out of memory");
        }
    }
    if (st == ARL_OK && !msg[0]) {
        /* every id: an action may carry any number of calls (a model fault, answered 200) */
        int32_t nc = act.n_tool_calls, np = act.n_parse_errors;
        const char **ids = malloc(((size_t)nc + (size_t)np + 1) * sizeof *ids);
        if (ids) {
            for (int32_t i = 0; i < nc; i++)
                ids[i] = act.tool_calls[i].id;
            for (int32_t i = 0; i < np; i++)
                ids[nc + i] = act.parse_errors[i].id;
        }
        aep_expect x = {.endpoint = ARL_ENV_EP_STEP,
                        .info = &h->info,
                        .step_index = k,
                        .call_ids = ids,
                        .n_call_ids = nc,
                        .perr_ids = ids ? ids + nc : NULL,
                        .n_perr_ids = np};
        if (!rb || !ids)
            snprintf(msg, sizeof msg, "out of memory serialising the step response");
        else
            self_check(h, &x, 200, rb, rl, msg, sizeof msg);
        free(ids);
    }
    int ended = out.terminated || out.truncated;
    int terminated = out.terminated;
    arl_env_result_clear(&out);
    arl_env_action_clear(&act);

    pthread_mutex_lock(&h->mu);
    if (sess_leave_locked(h, s, st, msg)) {
        pthread_mutex_unlock(&h->mu);
        free(rb);
        if (snap) {
            env_lock(h);
            h->ops->free_state(h->env_inst, snap);
            env_unlock(h);
        }
        json_decref(body);
        if (st != ARL_OK) return env_status_reply(h, st, 0, resp, rlen);
        if (too_large) return reply_too_large(resp, rlen, msg);
        return reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "%s", msg);
    }
    /* store: fork_past keeps every step, otherwise only the last */
    hstep ns = {.resp = rb, .len = rl, .action = json_incref((json_t *)aj), .state = snap, .ended = ended};
    if (h->info.caps.fork_past) {
        hstep *nh = realloc(s->hist, (size_t)(k - s->hist_base + 1) * sizeof *nh);
        if (nh) {
            s->hist = nh;
            nh[k - s->hist_base] = ns;
        } else { /* keep the last only */
            for (int64_t i = 0; i <= m - s->hist_base; i++) hstep_clear(h, &s->hist[i]);
            s->hist_base = k;
            s->hist[0] = ns;
        }
    } else {
        hstep_clear(h, &s->hist[0]);
        s->hist[0] = ns;
        s->hist_base = k;
    }
    s->last = k;
    if (ended) s->status = terminated ? ARL_ENV_STATUS_TERMINATED : ARL_ENV_STATUS_TRUNCATED;
    status = reply_copy(resp, rlen, 200, rb, rl);
    if (s->closed) sess_release(h, s);
    pthread_mutex_unlock(&h->mu);
    json_decref(body);
    return status;
}

/* ---- score ---- */

static int host_score_impl(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    host *h = inst;
    int status = 0;
    json_t *body = NULL;
    hsess *s = sess_enter(h, sid, ARL_ENV_EP_SCORE, req, len, resp, rlen, &status, &body);
    if (!s) return status;
    /* check 5 */
    const json_t *sc = json_object_get(body, "scope");
    int scope = aep_json_cstr(sc) ? arl_env_scope_parse(aep_json_cstr(sc)) : -1;
    int64_t seg = 0, first = 0, last = 0, deadline = 0;
    int reason = -1;
    if (!json_is_object(body)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "request body: expected a JSON object");
    } else if (scope < 0) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/scope: expected segment or episode");
    } else if (scope == ARL_ENV_SCOPE_SEGMENT && !h->info.caps.segment_score) {
        status = reply_err(resp, rlen, ARL_ENV_E_NOT_IMPLEMENTED, -1, "segment scoring is not supported");
    } else if (!aep_json_get_index(body, "deadline_ms", &deadline)) {
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/deadline_ms: required integer in [0, 2^53-1]");
    } else if (scope == ARL_ENV_SCOPE_SEGMENT) {
        const json_t *rg = json_object_get(body, "step_range");
        json_t *tmp = json_object();
        if (tmp && json_is_array(rg) && json_array_size(rg) == 2) {
            json_object_set(tmp, "a", json_array_get(rg, 0));
            json_object_set(tmp, "b", json_array_get(rg, 1));
        }
        if (!aep_json_get_index(body, "segment_index", &seg))
            status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/segment_index: required integer");
        else if (!tmp || !aep_json_get_index(tmp, "a", &first) || !aep_json_get_index(tmp, "b", &last) ||
                 first < 1 || first > last)
            status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                               "/step_range: expected [first, last] with 1 <= first <= last");
        if (tmp) json_decref(tmp);
    } else {
        const json_t *rs = json_object_get(body, "reason");
        reason = aep_json_cstr(rs) ? arl_env_score_reason_parse(aep_json_cstr(rs)) : -1;
        if (reason < 0)
            status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                               "/reason: expected terminated, truncated, context_budget, turn_budget, "
                               "action_too_large or wall_clock");
    }
    if (status) goto unlock_out;
    /* check 6: §6.5 rule 6 */
    if (s->status == ARL_ENV_STATUS_FAILED) {
        status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "session '%s' has failed", s->sid);
        goto unlock_out;
    }
    if (scope == ARL_ENV_SCOPE_SEGMENT) {
        for (int32_t i = 0; i < s->n_segs; i++) {
            if (s->segs[i].seg != seg) continue;
            if (s->segs[i].first == first && s->segs[i].last == last)
                status = reply_copy(resp, rlen, 200, s->segs[i].resp, s->segs[i].len);
            else
                status = reply_err(resp, rlen, ARL_ENV_E_SCORE_CONFLICT, -1,
                                   "segment %lld was scored over [%lld, %lld]", (long long)seg,
                                   (long long)s->segs[i].first, (long long)s->segs[i].last);
            goto unlock_out;
        }
        if (last > s->last) {
            status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                               "/step_range: last %lld exceeds the last applied step %lld", (long long)last,
                               (long long)s->last);
            goto unlock_out;
        }
        if (seg == 0 && first != 1) {
            status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/step_range: segment 0 starts at step 1");
            goto unlock_out;
        }
        for (int32_t i = 0; i < s->n_segs; i++)
            if (seg > 0 && s->segs[i].seg == seg - 1 && first != s->segs[i].last + 1) {
                status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                                   "/step_range: segment %lld must start at step %lld", (long long)seg,
                                   (long long)(s->segs[i].last + 1));
                goto unlock_out;
            }
    } else if (s->ep_reason >= 0) {
        if (s->ep_reason == reason)
            status = reply_copy(resp, rlen, 200, s->ep_resp, s->ep_len);
        else
            status = reply_err(resp, rlen, ARL_ENV_E_SCORE_CONFLICT, -1, "the episode was scored with reason '%s'",
                               arl_env_score_reason_str((arl_env_score_reason)s->ep_reason));
        goto unlock_out;
    }
    /* execute */
    s->busy = 1;
    s->busy_ep = ARL_ENV_EP_SCORE;
    s->busy_body = without_deadline(body);
    s->refs++;
    arl_env_score_req rq = {.scope = (arl_env_scope)scope, .segment_index = seg, .first = first, .last = last,
                            .reason = reason < 0 ? ARL_ENV_REASON_TERMINATED : (arl_env_score_reason)reason,
                            .last_step = s->last, .status = s->status,
                            .deadline_ms = deadline > h->info.limits.max_deadline_ms ? h->info.limits.max_deadline_ms : deadline};
    pthread_mutex_unlock(&h->mu);
    arl_env_score_result out;
    memset(&out, 0, sizeof out);
    arl_error_clear();
    env_lock(h);
    arl_status st = h->ops->score(h->env_inst, s->state, &rq, &out);
    env_unlock(h);
    char *rb = NULL;
    size_t rl = 0;
    char msg[700] = "";
    if (st == ARL_OK) {
        json_t *o = json_object();
        json_t *comps = aep_components_to_json(out.components, out.n_components);
        if (o && comps) {
            json_object_set_new(o, "scope", json_string(arl_env_scope_str((arl_env_scope)scope)));
            if (scope == ARL_ENV_SCOPE_SEGMENT) json_object_set_new(o, "segment_index", json_integer(seg));
            json_object_set_new(o, "scorable", json_boolean(out.scorable));
            json_object_set_new(o, "reward", out.scorable ? json_real(out.reward) : json_null());
            json_object_set_new(o, "reward_components", comps);
            json_object_set_new(o, "info", out.info ? json_incref(out.info) : json_object());
            rb = aep_json_dumps(o, &rl);
        } else if (comps) {
            json_decref(comps);
        }
        if (o) json_decref(o);
        aep_expect x = {.endpoint = ARL_ENV_EP_SCORE, .info = &h->info, .scope = (arl_env_scope)scope,
                        .segment_index = seg};
        if (!rb)
            snprintf(msg, sizeof msg, "out of memory serialising the score response");
        else
            self_check(h, &x, 200, rb, rl, msg, sizeof msg);
    }
    arl_env_score_result_clear(&out);
    pthread_mutex_lock(&h->mu);
    if (sess_leave_locked(h, s, st, msg)) {
        pthread_mutex_unlock(&h->mu);
        free(rb);
        json_decref(body);
        if (st != ARL_OK) return env_status_reply(h, st, 0, resp, rlen);
        return reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "%s", msg);
    }
    if (scope == ARL_ENV_SCOPE_SEGMENT) {
        hscore *ns = realloc(s->segs, (size_t)(s->n_segs + 1) * sizeof *ns);
        if (ns) {
            s->segs = ns;
            ns[s->n_segs++] = (hscore){.seg = seg, .first = first, .last = last, .resp = rb, .len = rl};
            status = reply_copy(resp, rlen, 200, rb, rl);
        } else {
            status = reply_own(resp, rlen, 200, rb, rl);
        }
    } else {
        s->ep_reason = reason;
        s->ep_resp = rb;
        s->ep_len = rl;
        if (s->status == ARL_ENV_STATUS_ACTIVE) s->status = ARL_ENV_STATUS_SCORED;
        status = reply_copy(resp, rlen, 200, rb, rl);
    }
    if (s->closed) sess_release(h, s);
unlock_out:
    pthread_mutex_unlock(&h->mu);
    json_decref(body);
    return status;
}

/* ---- fork ---- */

static int host_fork_impl(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    host *h = inst;
    int status = 0;
    pthread_mutex_lock(&h->mu);
    hsess *p = lookup(h, sid, resp, rlen, &status);
    if (!p) {
        pthread_mutex_unlock(&h->mu);
        return status;
    }
    if (!h->info.caps.fork) {
        pthread_mutex_unlock(&h->mu);
        return reply_err(resp, rlen, ARL_ENV_E_NOT_IMPLEMENTED, -1, "fork is not supported");
    }
    p->refs++;
    pthread_mutex_unlock(&h->mu);
    json_t *body = parse_body(req, len, resp, rlen, &status);
    pthread_mutex_lock(&h->mu);
    p->refs--;
    if (!body) {
        pthread_mutex_unlock(&h->mu);
        return status;
    }
    p->last_active_ms = aep_now_ms();
    status = busy_gate(h, p, ARL_ENV_EP_FORK, body, resp, rlen);
    if (!status && p->closed)
        status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "session '%s' was deleted", p->sid);
    if (status) goto unlock_out;
    int64_t at = 0, deadline = 0;
    if (!json_is_object(body))
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "request body: expected a JSON object");
    else if (!valid_id_member(body, "trajectory_id"))
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                           "/trajectory_id: expected 1-256 characters of [A-Za-z0-9._:/@#+-]");
    else if (!valid_id_member(body, "group_id"))
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1,
                           "/group_id: expected 1-256 characters of [A-Za-z0-9._:/@#+-]");
    else if (!aep_json_get_index(body, "at_step_index", &at))
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/at_step_index: required integer");
    else if (!aep_json_get_index(body, "deadline_ms", &deadline))
        status = reply_err(resp, rlen, ARL_ENV_E_VALIDATION_ERROR, -1, "/deadline_ms: required integer in [0, 2^53-1]");
    if (status) goto unlock_out;
    const char *traj = json_string_value(json_object_get(body, "trajectory_id"));
    const char *group = json_string_value(json_object_get(body, "group_id"));
    /* rule 4: repeats */
    hsess *t = smap_get(&h->by_traj, traj);
    if (t) {
        if (!t->is_fork || strcmp(t->parent_sid, p->sid) || t->fork_at != at || strcmp(t->group, group))
            status = reply_err(resp, rlen, ARL_ENV_E_TRAJECTORY_CONFLICT, -1,
                               "trajectory_id '%.200s' was used with other identity members", traj);
        else if (t->closed)
            status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "fork '%.200s' was deleted or reaped", traj);
        else
            status = reply_copy(resp, rlen, 200, t->ident_resp, t->ident_len);
        goto unlock_out;
    }
    if (p->status == ARL_ENV_STATUS_FAILED) {
        status = reply_err(resp, rlen, ARL_ENV_E_SESSION_CLOSED, -1, "session '%s' has failed", p->sid);
        goto unlock_out;
    }
    if (at > p->last || (at != p->last && !h->info.caps.fork_past) || at < p->hist_base) {
        status = reply_err(resp, rlen, ARL_ENV_E_STEP_CONFLICT, -1, "cannot fork at step %lld (last applied %lld%s)",
                           (long long)at, (long long)p->last, h->info.caps.fork_past ? "" : ", no fork_past");
        goto unlock_out;
    }
    if (p->hist[at - p->hist_base].ended || (at == p->last && p->status == ARL_ENV_STATUS_SCORED)) {
        status = reply_err(resp, rlen, ARL_ENV_E_EPISODE_ENDED, -1, "the episode ended at step %lld", (long long)at);
        goto unlock_out;
    }
    if (h->draining) {
        status = reply_err(resp, rlen, ARL_ENV_E_DRAINING, HOST_CAPACITY_RETRY_MS, "server is draining");
        goto unlock_out;
    }
    if (h->active >= h->info.limits.max_sessions) {
        status = reply_err(resp, rlen, ARL_ENV_E_CAPACITY_REACHED, HOST_CAPACITY_RETRY_MS, "%lld/%lld sessions active",
                           (long long)h->active, (long long)h->info.limits.max_sessions);
        goto unlock_out;
    }
    hsess *c = sess_new(h, traj, group);
    int64_t nh = h->info.caps.fork_past ? at - p->hist_base + 1 : 1;
    if (c) c->hist = calloc((size_t)nh, sizeof *c->hist);
    if (!c || !c->hist || smap_put(&h->by_traj, traj, c) || smap_put(&h->by_sid, c->sid, c)) {
        if (c) {
            smap_del(&h->by_traj, traj);
            free(c->hist);
            c->hist = NULL;
            sess_free(h, c);
        }
        status = reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "out of memory");
        goto unlock_out;
    }
    c->is_fork = 1;
    snprintf(c->parent_sid, sizeof c->parent_sid, "%s", p->sid);
    c->fork_at = at;
    c->task = json_incref(p->task);
    c->options = p->options ? json_incref(p->options) : NULL;
    c->max_steps = p->max_steps;
    c->creating = 1;
    c->busy = 1;
    c->busy_ep = ARL_ENV_EP_FORK;
    c->counted = 1;
    c->refs = 1;
    h->active++;
    p->busy = 1; /* the parent's state is read by ops->fork: keep other requests off it */
    p->busy_ep = ARL_ENV_EP_FORK;
    p->busy_body = without_deadline(body);
    p->refs++;
    /* copies of the stored responses and actions the child inherits */
    int ok = 1;
    for (int64_t i = 0; i < nh; i++) {
        hstep *src = h->info.caps.fork_past ? &p->hist[i] : &p->hist[at - p->hist_base];
        c->hist[i].resp = malloc(src->len + 1);
        if (!c->hist[i].resp) { ok = 0; break; }
        memcpy(c->hist[i].resp, src->resp, src->len + 1);
        c->hist[i].len = src->len;
        c->hist[i].action = src->action ? json_incref(src->action) : NULL;
        c->hist[i].ended = src->ended;
    }
    c->hist_base = h->info.caps.fork_past ? p->hist_base : at;
    c->last = at;
    const void *src_state = at == p->last ? p->state : p->hist[at - p->hist_base].state;
    pthread_mutex_unlock(&h->mu);

    arl_error_clear();
    arl_status st = ok ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "out of memory copying the parent's history");
    void *cstate = NULL;
    env_lock(h);
    if (st == ARL_OK) st = h->ops->fork(h->env_inst, src_state, &cstate);
    if (st == ARL_OK && h->info.caps.fork_past)
        for (int64_t i = 0; i < nh && st == ARL_OK; i++)
            if (p->hist[i].state) st = h->ops->fork(h->env_inst, p->hist[i].state, &c->hist[i].state);
    env_unlock(h);
    char buf[700];
    int bl = snprintf(buf, sizeof buf, "{\"session_id\":\"%s\",\"trajectory_id\":\"%s\",\"step_index\":%lld,\"info\":{}}",
                      c->sid, traj, (long long)at);

    pthread_mutex_lock(&h->mu);
    p->busy = 0;
    p->refs--;
    if (p->busy_body) {
        json_decref(p->busy_body);
        p->busy_body = NULL;
    }
    pthread_cond_broadcast(&p->cv);
    if (p->closed) sess_release(h, p);
    c->busy = 0;
    c->creating = 0;
    c->refs--;
    if (st != ARL_OK) {
        smap_del(&h->by_traj, traj);
        smap_del(&h->by_sid, c->sid);
        h->active--;
        c->counted = 0;
        pthread_mutex_unlock(&h->mu);
        c->state = cstate;
        sess_free(h, c);
        json_decref(body);
        return env_status_reply(h, st, 0, resp, rlen);
    }
    c->state = cstate;
    c->status = ARL_ENV_STATUS_ACTIVE;
    c->ident_resp = malloc((size_t)bl + 1);
    if (c->ident_resp) {
        memcpy(c->ident_resp, buf, (size_t)bl + 1);
        c->ident_len = (size_t)bl;
    }
    status = reply_copy(resp, rlen, 201, buf, (size_t)bl);
unlock_out:
    pthread_mutex_unlock(&h->mu);
    json_decref(body);
    return status;
}

/* ---- get, close ---- */

static int host_get(void *inst, const char *sid, char **resp, size_t *rlen) {
    host *h = inst;
    int status = 0;
    pthread_mutex_lock(&h->mu);
    hsess *s = lookup(h, sid, resp, rlen, &status);
    if (!s) {
        pthread_mutex_unlock(&h->mu);
        return status;
    }
    int64_t now = aep_now_ms();
    json_t *o = json_object();
    if (o) {
        json_object_set_new(o, "session_id", json_string(s->sid));
        json_object_set_new(o, "trajectory_id", json_string(s->traj));
        json_object_set_new(o, "group_id", json_string(s->group));
        json_object_set_new(o, "step_index", json_integer(s->last));
        json_object_set_new(o, "status", json_string(arl_env_session_status_str(s->status)));
        json_object_set_new(o, "idle_ms", json_integer(now - s->last_active_ms));
        hstep *hs = &s->hist[s->last - s->hist_base];
        char hex[65];
        aep_sha256_hex(hs->resp, hs->len, hex);
        json_object_set_new(o, "last_step_response_sha256", json_string(hex));
        /* the state is read only when no call executes on it; an environment without
         * thread safety is not waited for (h->mu is held) */
        if (!s->busy && h->ops->debug_state &&
            (h->ops->thread_safety || !pthread_mutex_trylock(&h->envmu))) {
            json_t *dbg = h->ops->debug_state(h->env_inst, s->state);
            if (!h->ops->thread_safety) pthread_mutex_unlock(&h->envmu);
            if (dbg) json_object_set_new(o, "state", dbg);
        }
    }
    s->last_active_ms = now;
    pthread_mutex_unlock(&h->mu);
    size_t l = 0;
    char *b = o ? aep_json_dumps(o, &l) : NULL;
    if (o) json_decref(o);
    if (!b) return reply_err(resp, rlen, ARL_ENV_E_ENV_INTERNAL, -1, "out of memory");
    return reply_own(resp, rlen, 200, b, l);
}

static void host_close(void *inst, const char *sid, const char *reason) {
    host *h = inst;
    (void)reason;
    if (!sid) return;
    pthread_mutex_lock(&h->mu);
    hsess *s = smap_get(&h->by_sid, sid);
    if (s && !s->creating) sess_close_locked(h, s);
    pthread_mutex_unlock(&h->mu);
    grave_flush(h);
}

static void host_free_buffer(void *inst, char *buf) {
    (void)inst;
    free(buf);
}

static void host_drain(void *inst) {
    host *h = inst;
    pthread_mutex_lock(&h->mu);
    h->draining = 1;
    pthread_mutex_unlock(&h->mu);
}

static int host_reap_idle(void *inst) {
    host *h = inst;
    int n = 0;
    int64_t now = aep_now_ms();
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < h->by_sid.cap; i++) {
        smap_ent *e = &h->by_sid.e[i];
        if (!e->key || e->key == SMAP_DEL) continue;
        hsess *s = e->val;
        if (s->closed || s->busy || s->creating) continue;
        if (now - s->last_active_ms > h->info.limits.session_idle_timeout_ms) {
            sess_close_locked(h, s);
            n++;
        }
    }
    pthread_mutex_unlock(&h->mu);
    grave_flush(h);
    return n;
}

static void host_destroy(void *inst) {
    host *h = inst;
    if (!h) return;
    /* failed creations handed to the tombstone queue are in no map: free them first */
    for (hsess *s = h->tomb_head; s;) {
        hsess *n = s->next_closed;
        if (smap_get(&h->by_sid, s->sid) != s) sess_free(h, s);
        s = n;
    }
    for (size_t i = 0; i < h->by_sid.cap; i++) {
        smap_ent *e = &h->by_sid.e[i];
        if (e->key && e->key != SMAP_DEL) sess_free(h, e->val);
    }
    for (size_t i = 0; i < h->n_grave; i++) h->ops->free_state(h->env_inst, h->grave[i]);
    free(h->grave);
    smap_free(&h->by_sid);
    smap_free(&h->by_traj);
    if (h->ops->instance_destroy) h->ops->instance_destroy(h->env_inst);
    arl_env_info_clear(&h->info);
    free(h->info_body);
    pthread_mutex_destroy(&h->mu);
    pthread_mutex_destroy(&h->envmu);
    free(h);
}

static int host_reset(void *inst, const char *req, size_t len, char **resp, size_t *rlen) {
    int st = host_reset_impl(inst, req, len, resp, rlen);
    grave_flush(inst);
    return st;
}

static int host_step(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    int st = host_step_impl(inst, sid, req, len, resp, rlen);
    grave_flush(inst);
    return st;
}

static int host_score(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    int st = host_score_impl(inst, sid, req, len, resp, rlen);
    grave_flush(inst);
    return st;
}

static int host_fork(void *inst, const char *sid, const char *req, size_t len, char **resp, size_t *rlen) {
    int st = host_fork_impl(inst, sid, req, len, resp, rlen);
    grave_flush(inst);
    return st;
}

static const arl_env_vtable host_vtable = {
    .abi_version = ARL_ENV_ABI_VERSION,
    .struct_size = sizeof(arl_env_vtable),
    .thread_safety = 1,
    .create_instance = NULL,
    .destroy_instance = host_destroy,
    .info = host_info,
    .health = host_health,
    .reset = host_reset,
    .step = host_step,
    .score = host_score,
    .fork = host_fork,
    .get = host_get,
    .close = host_close,
    .free_buffer = host_free_buffer,
    .drain = host_drain,
    .reap_idle = host_reap_idle,
};

arl_status arl_env_host_open(const arl_env_def *def, const char *config_json, const arl_env_host_config *cfg,
                             void **inst, const arl_env_vtable **vt) {
    *inst = NULL;
    *vt = NULL;
    if (!def || !def->ops || !def->ops->reset || !def->ops->step || !def->ops->score || !def->ops->free_state)
        return arl_errorf(ARL_ERR_CONFIG, "env host: environment '%s' lacks reset, step, score or free_state",
                          def && def->name ? def->name : "?");
    char err[512];
    json_t *rest = aep_json_loads(def->info_json ? def->info_json : "{}",
                                  def->info_json ? strlen(def->info_json) : 2, ARL_AEP_MAX_DEPTH, err, sizeof err);
    if (!rest || !json_is_object(rest)) {
        if (rest) json_decref(rest);
        return arl_errorf(!rest && strstr(err, "out of memory") ? ARL_ERR_NOMEM : ARL_ERR_CONFIG,
                          "env host: '%s': info_json: %s", def->name,
                          rest ? "expected an object" : err);
    }
    /* jansson's builders leave a key out quietly when an allocation fails: then out of memory,
     * not an /info that fails its own check (or passes it short of a key) */
    const unsigned long jfail = arl_json_alloc_failures();
    json_t *info = json_object();
    json_t *env = json_object();
    json_object_set_new(info, "protocol", json_string(ARL_AEP_PROTOCOL));
    json_object_set_new(info, "protocol_revision", json_integer(ARL_AEP_PROTOCOL_REVISION));
    json_object_set_new(env, "name", json_string(def->name ? def->name : ""));
    json_object_set_new(env, "version", json_string(def->version ? def->version : ""));
    json_object_set_new(env, "description", json_string(def->description ? def->description : ""));
    json_object_set_new(info, "env", env);
    json_object_update(info, rest);
    json_decref(rest);
    json_t *lim = json_object_get(info, "limits");
    if (!json_is_object(lim)) {
        lim = json_object();
        json_object_set_new(info, "limits", lim);
    }
    if (cfg && cfg->max_sessions > 0) {
        int64_t cur = 64;
        aep_json_get_index(lim, "max_sessions", &cur);
        if (cfg->max_sessions < cur || !json_object_get(lim, "max_sessions"))
            json_object_set_new(lim, "max_sessions", json_integer(cfg->max_sessions < cur ? cfg->max_sessions : cur));
    }
    if (cfg && cfg->session_idle_timeout_ms > 0)
        json_object_set_new(lim, "session_idle_timeout_ms", json_integer(cfg->session_idle_timeout_ms));
    host *h = arl_json_alloc_failures() == jfail ? calloc(1, sizeof *h) : NULL;
    if (!h) {
        json_decref(info);
        return arl_errorf(ARL_ERR_NOMEM, "env host: out of memory");
    }
    h->def = def;
    h->ops = def->ops;
    h->max_tomb = cfg && cfg->max_closed_sessions > 0 ? (size_t)cfg->max_closed_sessions
                                                      : HOST_MAX_TOMBSTONES;
    h->info_body = aep_json_dumps(info, &h->info_len);
    json_decref(info);
    if (!h->info_body) {
        free(h);
        return arl_errorf(ARL_ERR_NOMEM, "env host: out of memory");
    }
    arl_status st = arl_env_info_parse(h->info_body, h->info_len, &h->info);
    if (st != ARL_OK) {
        /* (arl_error_prefix: the message formatted into itself came out garbled) */
        st = arl_error_prefix(st == ARL_ERR_NOMEM ? st : ARL_ERR_CONFIG,
                              "env host: environment '%s'", def->name);
        free(h->info_body);
        free(h);
        return st;
    }
    if (h->info.caps.fork && !h->ops->fork) {
        arl_env_info_clear(&h->info);
        free(h->info_body);
        free(h);
        return arl_errorf(ARL_ERR_CONFIG, "env host: environment '%s' declares fork but has no fork callback",
                          def->name);
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->envmu, NULL);
    arl_rng_seed(&h->rng, (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)h);
    /* checked also for an environment without configuration: a typo is an error, not ignored */
    const unsigned long cfg_n0 = arl_nomem_count();
    json_t *cj =
        aep_json_loads(config_json ? config_json : "{}", config_json ? strlen(config_json) : 2,
                       ARL_AEP_MAX_DEPTH, err, sizeof err);
    if (!cj || !json_is_object(cj)) {
        int obj = cj != NULL;
        if (cj) json_decref(cj);
        host_destroy(h);
        return arl_errorf(!obj && arl_nomem_count() != cfg_n0 ? ARL_ERR_NOMEM : ARL_ERR_CONFIG,
                          "env host: '%s': configuration: %s", def->name,
                          obj ? "expected a JSON object" : err);
    }
    st = h->ops->instance_create ? h->ops->instance_create(cj, &h->env_inst) : ARL_OK;
    json_decref(cj);
    if (st != ARL_OK) {
        arl_error_prefix(st, "env host: '%s': instance_create", def->name);
        arl_env_info_clear(&h->info);
        free(h->info_body);
        pthread_mutex_destroy(&h->mu);
        pthread_mutex_destroy(&h->envmu);
        free(h);
        return st;
    }
    *inst = h;
    *vt = &host_vtable;
    return ARL_OK;
}
