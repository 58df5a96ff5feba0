/* replay/list.c: `list` and `stats` (spec sections 13.1 and 13.4) over all shards of a store.
 * Every query selects trajectories first (indexes of section 4.14) and reaches segments, turns,
 * rewards and calls through their primary keys: no full scan of segments. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "replay/select.h"

static void fmt_time(int64_t ms, char *buf, size_t cap) {
    if (ms < 0) {
        snprintf(buf, cap, "-");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

typedef struct list_row {
    replay_traj_row r;
    double key;  /* sort key, larger first (uid order: 0) */
    int has_key; /* 0: no outcome (sorted last) */
} list_row;

static int sort_uid; /* qsort has no context argument: set by collect (one thread per store) */

static int row_cmp(const void *a, const void *b) {
    const list_row *x = a, *y = b;
    if (sort_uid) {
        int c = strcmp(x->r.traj_uid, y->r.traj_uid);
        if (c) return c;
    }
    if (x->has_key != y->has_key) return x->has_key ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? 1 : -1; /* largest (newest) first */
    return (x->r.traj_id < y->r.traj_id) - (x->r.traj_id > y->r.traj_id);
}

/* ORDER BY of a sort key (section 13.1: finish time, newest first, unless --sort is given) */
static const char *sort_sql(const char *sort) {
    if (sort && !strcmp(sort, "reward"))
        return " ORDER BY t.outcome_reward IS NULL, t.outcome_reward DESC, t.traj_id DESC";
    if (sort && !strcmp(sort, "tokens")) return " ORDER BY t.n_tokens DESC, t.traj_id DESC";
    if (sort && !strcmp(sort, "turns")) return " ORDER BY t.n_turns DESC, t.traj_id DESC";
    if (sort && !strcmp(sort, "uid")) return " ORDER BY t.traj_uid";
    return " ORDER BY coalesce(t.finished_at_ms, t.updated_at_ms) DESC, t.traj_id DESC";
}

static void row_key(const char *sort, list_row *r) {
    r->has_key = 1;
    if (sort && !strcmp(sort, "reward")) {
        r->has_key = !isnan(r->r.outcome_reward);
        r->key = r->has_key ? r->r.outcome_reward : 0;
    } else if (sort && !strcmp(sort, "tokens")) {
        r->key = (double)r->r.n_tokens;
    } else if (sort && !strcmp(sort, "turns")) {
        r->key = (double)r->r.n_turns;
    } else if (sort && !strcmp(sort, "uid")) {
        r->key = 0;
    } else {
        r->key = (double)(r->r.finished_at_ms >= 0 ? r->r.finished_at_ms : r->r.updated_at_ms);
    }
}

/* Run the selection on each shard; rows appended to *rows (sorted, limited). */
static arl_status collect(replay_store *st, const rsel *sel, list_row **rows, size_t *n) {
    char tail[160];
    const int64_t off = sel->f.offset > 0 ? sel->f.offset : 0;
    if (sel->f.limit > 0) /* each shard's first offset + limit rows hold the merged page */
        snprintf(tail, sizeof tail, "%s LIMIT %lld", sort_sql(sel->f.sort),
                 (long long)(sel->f.limit + off));
    else
        snprintf(tail, sizeof tail, "%s", sort_sql(sel->f.sort));
    char *sql = rsel_sql(sel, "SELECT " RTRAJ_COLS " FROM trajectories t", tail);
    if (!sql) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    size_t cap = 0;
    arl_status s = ARL_OK;
    for (size_t i = 0; i < st->n_shards && s == ARL_OK; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind == REPLAY_FILE_LEARNER) continue;
        rdb *d;
        sqlite3_stmt *q;
        if ((s = rstore_shard_db(st, sh, &d)) != ARL_OK) break;
        if ((s = rstore_prepare(st, d, sql, &q)) != ARL_OK) break;
        rsel_bind(sel, q);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 64;
                list_row *p = realloc(*rows, cap * sizeof *p);
                if (!p) {
                    s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
                    break;
                }
                *rows = p;
            }
            list_row *r = &(*rows)[(*n)++];
            rtraj_fill(q, sh->shard_id, &r->r);
            row_key(sel->f.sort, r);
        }
        if (s == ARL_OK && rc != SQLITE_DONE) s = rdb_fail(d, rc, "listing trajectories");
        sqlite3_finalize(q);
    }
    free(sql);
    if (s != ARL_OK) return s;
    sort_uid = sel->f.sort && !strcmp(sel->f.sort, "uid");
    if (*n > 1) qsort(*rows, *n, sizeof **rows, row_cmp);
    if ((size_t)off >= *n) {
        *n = 0;
    } else if (off > 0) {
        memmove(*rows, *rows + off, (*n - (size_t)off) * sizeof **rows);
        *n -= (size_t)off;
    }
    if (sel->f.limit > 0 && *n > (size_t)sel->f.limit) *n = (size_t)sel->f.limit;
    return ARL_OK;
}

arl_status replay_list(replay_store *st, const replay_filter *f, int json, FILE *out) {
    rsel sel;
    ARL_TRY(rsel_init(st, f, &sel));
    arl_status s = replay_store_refresh(st);
    list_row *rows = NULL;
    size_t n = 0;
    if (s == ARL_OK) s = collect(st, &sel, &rows, &n);
    if (s == ARL_OK && !json)
        fprintf(out, "%-32s %-9s %-20s %-14s %5s %4s %16s %9s %8s %s\n", "TRAJ_UID", "STATUS",
                "END/ERROR", "ENV", "TURNS", "SEGS", "TOKENS(ACTION)", "VERSIONS", "OUTCOME",
                "TIME");
    for (size_t i = 0; s == ARL_OK && i < n; i++) {
        const replay_traj_row *r = &rows[i].r;
        char env[128], ver[64], tm[32];
        rcat_env_name(st, r->env_id, env, sizeof env, ver, sizeof ver);
        int64_t when = r->finished_at_ms >= 0 ? r->finished_at_ms : r->updated_at_ms;
        fmt_time(when, tm, sizeof tm);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "traj_uid", json_string(r->traj_uid));
            json_object_set_new(o, "traj_id", json_integer(r->traj_id));
            json_object_set_new(o, "status", json_string(replay_status_name(r->status)));
            json_object_set_new(o, "end_cause",
                                r->end_cause[0] ? json_string(r->end_cause) : json_null());
            json_object_set_new(o, "error_code",
                                r->error_code[0] ? json_string(r->error_code) : json_null());
            json_object_set_new(o, "env", json_string(env));
            json_object_set_new(o, "env_version", json_string(ver));
            json_object_set_new(o, "turns", json_integer(r->n_turns));
            json_object_set_new(o, "segments", json_integer(r->n_segments));
            json_object_set_new(o, "tokens", json_integer(r->n_tokens));
            json_object_set_new(o, "action_tokens", json_integer(r->n_action_tokens));
            json_object_set_new(o, "versions",
                                r->min_version >= 0 ? json_pack("[II]", (json_int_t)r->min_version,
                                                                (json_int_t)r->max_version)
                                                    : json_null());
            json_object_set_new(o, "outcome",
                                isnan(r->outcome_reward) ? json_null()
                                                         : json_real(r->outcome_reward));
            json_object_set_new(o, "time_ms", json_integer(when));
            int pinned = 0;
            char reason[1024];
            if (replay_pin_get(st, r->traj_uid, &pinned, reason, sizeof reason) != ARL_OK)
                arl_error_clear(); /* listed as not pinned */
            json_object_set_new(o, "pinned", json_boolean(pinned));
            json_object_set_new(o, "pin_reason", pinned ? json_string(reason) : json_null());
            rjson_dump(o, out);
            fputc('\n', out);
            json_decref(o);
        } else {
            char endc[80], envv[160], tok[48], vers[40], outc[24];
            snprintf(endc, sizeof endc, "%s",
                     r->error_code[0]  ? r->error_code
                     : r->end_cause[0] ? r->end_cause
                                       : "-");
            snprintf(envv, sizeof envv, "%s@%s", env, ver);
            snprintf(tok, sizeof tok, "%lld(%lld)", (long long)r->n_tokens,
                     (long long)r->n_action_tokens);
            if (r->min_version >= 0)
                snprintf(vers, sizeof vers, "%lld..%lld", (long long)r->min_version,
                         (long long)r->max_version);
            else
                snprintf(vers, sizeof vers, "-");
            if (isnan(r->outcome_reward))
                snprintf(outc, sizeof outc, "-");
            else
                snprintf(outc, sizeof outc, "%.4g", r->outcome_reward);
            fprintf(out, "%-32s %-9s %-20s %-14s %5d %4d %16s %9s %8s %s\n", r->traj_uid,
                    replay_status_name(r->status), endc, envv, (int)r->n_turns, (int)r->n_segments,
                    tok, vers, outc, tm);
        }
    }
    free(rows);
    rsel_free(&sel);
    return s;
}

/* ---- stats ---- */

typedef struct counter {
    char key[80];
    int64_t n;
    double sum, sumsq, max;
    int64_t n2, n3; /* extra counts (failures, errors) */
} counter;

typedef struct counters {
    counter *v;
    size_t n, cap;
} counters;

static counter *cnt_get(counters *c, const char *key) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->v[i].key, key)) return &c->v[i];
    if (c->n == c->cap) { /* cap grows with the block: a failed realloc leaves both */
        size_t cap = c->cap ? c->cap * 2 : 16;
        counter *p = realloc(c->v, cap * sizeof *p);
        if (!p) return NULL;
        c->v = p;
        c->cap = cap;
    }
    counter *x = &c->v[c->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->key, sizeof x->key, "%s", key);
    return x;
}

static int cnt_cmp(const void *a, const void *b) {
    return strcmp(((const counter *)a)->key, ((const counter *)b)->key);
}

typedef struct dist {
    int64_t *v;
    size_t n, cap;
} dist;

/* -1 when out of memory (d as it was) */
static int dist_add(dist *d, int64_t x) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        int64_t *p = realloc(d->v, cap * sizeof *p);
        if (!p) return -1;
        d->v = p;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

static int i64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array (0 if empty). */
static int64_t pct(const dist *d, double p) {
    if (!d->n) return 0;
    size_t i = (size_t)ceil(p * (double)d->n);
    if (i < 1) i = 1;
    if (i > d->n) i = d->n;
    return d->v[i - 1];
}

typedef struct stats_acc {
    counters status, end_cause, error_code, seg_end, rewards, tools, calls, versions, masked_len,
        storage, states;
    dist tok, act, turns, segs, seg_tok, span;
    int64_t n_traj, tokens, action_tokens, n_files;
} stats_acc;

typedef arl_status (*row_fn)(stats_acc *a, sqlite3_stmt *q);

static arl_status run_sel(replay_store *st, rdb *d, const rsel *sel, const char *head,
                          const char *tail, stats_acc *a, row_fn fn) {
    char *sql = rsel_sql(sel, head, tail);
    if (!sql) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    sqlite3_stmt *q;
    arl_status s = rstore_prepare(st, d, sql, &q);
    free(sql);
    ARL_TRY(s);
    rsel_bind(sel, q);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW && s == ARL_OK)
        s = fn(a, q);
    sqlite3_finalize(q);
    if (s == ARL_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
        s = rdb_fail(d, rc, "computing stats");
    return s;
}

static const char *txt(sqlite3_stmt *q, int i, const char *null) {
    const unsigned char *t = sqlite3_column_text(q, i);
    return t ? (const char *)t : null;
}

/* the row callbacks' failure: a counter or a distribution that could not grow (the stats
 * would leave the row out without a word) */
static arl_status stats_nomem(void) {
    return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory computing stats");
}

static arl_status on_traj(stats_acc *a, sqlite3_stmt *q) {
    a->n_traj++;
    counter *c;
    if (!(c = cnt_get(&a->status, txt(q, 0, "?")))) return stats_nomem();
    c->n++;
    if (!(c = cnt_get(&a->end_cause, txt(q, 1, "(running)")))) return stats_nomem();
    c->n++;
    if (sqlite3_column_type(q, 2) != SQLITE_NULL) {
        if (!(c = cnt_get(&a->error_code, txt(q, 2, "")))) return stats_nomem();
        c->n++;
    }
    int64_t tok = sqlite3_column_int64(q, 3), act = sqlite3_column_int64(q, 4);
    a->tokens += tok;
    a->action_tokens += act;
    if (dist_add(&a->tok, tok) || dist_add(&a->act, act) ||
        dist_add(&a->turns, sqlite3_column_int64(q, 5)) ||
        dist_add(&a->segs, sqlite3_column_int64(q, 6)))
        return stats_nomem();
    if (sqlite3_column_type(q, 7) != SQLITE_NULL &&
        dist_add(&a->span, sqlite3_column_int64(q, 8) - sqlite3_column_int64(q, 7)))
        return stats_nomem();
    /* masked fraction by length bucket: [2^k, 2^(k+1)) tokens */
    char b[48];
    int k = 0;
    while (k < 40 && ((int64_t)1 << (k + 1)) <= tok)
        k++;
    snprintf(b, sizeof b, "%012lld", (long long)((int64_t)1 << k));
    if (!(c = cnt_get(&a->masked_len, b))) return stats_nomem();
    c->n++;
    if (!strcmp(txt(q, 0, ""), "masked")) c->n2++;
    return ARL_OK;
}

static arl_status on_reward(stats_acc *a, sqlite3_stmt *q) {
    char key[96];
    const char *comp = txt(q, 1, "");
    snprintf(key, sizeof key, "%s %s", txt(q, 0, "?"),
             !*comp                      ? "(reward)"
             : !strcmp(comp, "@derived") ? "(derived)"
                                         : comp);
    counter *c = cnt_get(&a->rewards, key);
    if (!c) return stats_nomem();
    c->n += sqlite3_column_int64(q, 2);
    c->sum += sqlite3_column_double(q, 3);
    c->sumsq += sqlite3_column_double(q, 4);
    return ARL_OK;
}

static arl_status on_segment(stats_acc *a, sqlite3_stmt *q) {
    if (dist_add(&a->seg_tok, sqlite3_column_int64(q, 0))) return stats_nomem();
    counter *c = cnt_get(&a->seg_end, txt(q, 1, "?"));
    if (!c) return stats_nomem();
    c->n++;
    char v[40]; /* run, then version: the numbers of different runs are not added up */
    snprintf(v, sizeof v, "%012lld %012lld", (long long)sqlite3_column_int64(q, 3),
             (long long)sqlite3_column_int64(q, 2));
    if (!(c = cnt_get(&a->versions, v))) return stats_nomem();
    c->n++;
    return ARL_OK;
}

/* A versions counter's run uid (its key: "<run_id> <version>"), or "run <run_id>". */
static void version_run(replay_store *st, const counter *c, char *buf, size_t cap) {
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", atoll(c->key));
    replay_run_info r = {0};
    if (replay_run_get(st, rid, &r) == ARL_OK)
        snprintf(buf, cap, "%s", r.run_uid);
    else
        snprintf(buf, cap, "run %s", rid);
    replay_run_info_free(&r);
    arl_error_clear();
}

/* 1 if versions counter i is the first of its run (the counters sorted by key). */
static int new_run_at(const counters *v, size_t i) {
    return i == 0 || atoll(v->v[i].key) != atoll(v->v[i - 1].key);
}

/* A versions counter's policy version. */
static long long version_of(const counter *c) {
    const char *sp = strchr(c->key, ' ');
    return sp ? atoll(sp + 1) : -1;
}

static arl_status on_tool(stats_acc *a, sqlite3_stmt *q) {
    counter *c = cnt_get(&a->tools, txt(q, 0, "(no name)"));
    if (!c) return stats_nomem();
    c->n += sqlite3_column_int64(q, 1);
    c->n2 += sqlite3_column_int64(q, 2);
    c->n3 += sqlite3_column_int64(q, 3);
    return ARL_OK;
}

static arl_status on_call(stats_acc *a, sqlite3_stmt *q) {
    counter *c = cnt_get(&a->calls, txt(q, 0, "?"));
    if (!c) return stats_nomem();
    c->n += sqlite3_column_int64(q, 1);
    c->sum += sqlite3_column_double(q, 2);
    double mx = sqlite3_column_double(q, 3);
    if (mx > c->max) c->max = mx;
    c->n2 += sqlite3_column_int64(q, 4);
    c->n3 += sqlite3_column_int64(q, 5);
    return ARL_OK;
}

static void storage_of(stats_acc *a, rdb *d, const char *file) {
    struct stat sb;
    counter *c;
    if (stat(d->path, &sb) == 0 && (c = cnt_get(&a->storage, file))) c->n += (int64_t)sb.st_size;
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(d->db, "SELECT name, sum(pgsize) FROM dbstat GROUP BY name", -1, &q,
                           NULL) != SQLITE_OK)
        return; /* dbstat not compiled in: per-table sizes are skipped */
    while (sqlite3_step(q) == SQLITE_ROW) {
        char key[96];
        snprintf(key, sizeof key, "  %s: %s", file, txt(q, 0, "?"));
        if ((c = cnt_get(&a->storage, key))) c->n += sqlite3_column_int64(q, 1);
    }
    sqlite3_finalize(q);
}

static void stats_free(stats_acc *a) {
    counters *cs[] = {&a->status,     &a->end_cause, &a->error_code, &a->seg_end,
                      &a->rewards,    &a->tools,     &a->calls,      &a->versions,
                      &a->masked_len, &a->storage,   &a->states};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
        free(cs[i]->v);
    dist *ds[] = {&a->tok, &a->act, &a->turns, &a->segs, &a->seg_tok, &a->span};
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++)
        free(ds[i]->v);
}

static json_t *counts_json(counters *c) {
    json_t *o = json_object();
    for (size_t i = 0; i < c->n; i++)
        json_object_set_new(o, c->v[i].key, json_integer(c->v[i].n));
    return o;
}

static json_t *dist_json(dist *d) {
    return json_pack("{sIsIsIsIsI}", "n", (json_int_t)d->n, "p50", (json_int_t)pct(d, 0.5), "p90",
                     (json_int_t)pct(d, 0.9), "p99", (json_int_t)pct(d, 0.99), "max",
                     (json_int_t)(d->n ? d->v[d->n - 1] : 0));
}

static void print_counts(FILE *out, const char *title, counters *c) {
    fprintf(out, "%s:", title);
    if (!c->n) fprintf(out, " -");
    for (size_t i = 0; i < c->n; i++)
        fprintf(out, "%s %s %lld", i ? "," : "", c->v[i].key, (long long)c->v[i].n);
    fprintf(out, "\n");
}

static void print_dist(FILE *out, const char *name, dist *d) {
    fprintf(out, "  %-22s %8zu %10lld %10lld %10lld %10lld\n", name, d->n, (long long)pct(d, 0.5),
            (long long)pct(d, 0.9), (long long)pct(d, 0.99),
            (long long)(d->n ? d->v[d->n - 1] : 0));
}

arl_status replay_stats(replay_store *st, const replay_filter *f, int json, FILE *out) {
    rsel sel;
    ARL_TRY(rsel_init(st, f, &sel));
    stats_acc a;
    memset(&a, 0, sizeof a);
    arl_status s = replay_store_refresh(st);
    int filtered =
        f &&
        (f->run || f->status || f->env || f->group || f->task || f->error_code || f->end_cause ||
         f->min_tokens >= 0 || f->max_tokens >= 0 || f->min_turns >= 0 || !isnan(f->min_reward) ||
         f->version_lo >= 0 || f->version_hi >= 0 || f->since_ms >= 0 || f->until_ms >= 0 ||
         f->parse_failures || f->tool || f->tool_error || f->n_where || f->forks_of);
    for (size_t i = 0; i < st->n_shards && s == ARL_OK; i++) {
        rshard *sh = &st->shards[i];
        rdb *d;
        if ((s = rstore_shard_db(st, sh, &d)) != ARL_OK) break;
        a.n_files++;
        if (!filtered) storage_of(&a, d, sh->file);
        if (sh->kind != REPLAY_FILE_LEARNER) {
            if ((s = run_sel(
                     st, d, &sel,
                     "SELECT t.status, t.end_cause, t.error_code, t.n_tokens, t.n_action_tokens, "
                     "t.n_turns, t.n_segments, t.min_version, t.max_version FROM trajectories t",
                     NULL, &a, on_traj)) != ARL_OK)
                break;
            /* CROSS JOIN fixes the loop order: trajectories outside, children by primary key */
            if ((s = run_sel(st, d, &sel,
                             "SELECT r.level, r.component, count(r.value), sum(r.value), "
                             "sum(r.value * r.value) FROM trajectories t CROSS JOIN rewards r ON "
                             "r.traj_id = t.traj_id",
                             " GROUP BY r.level, r.component", &a, on_reward)) != ARL_OK)
                break;
            if ((s = run_sel(
                     st, d, &sel,
                     "SELECT s.n_tokens, s.end_cause, s.min_version, t.run_id FROM trajectories t "
                     "CROSS JOIN segments s ON s.traj_id = t.traj_id",
                     NULL, &a, on_segment)) != ARL_OK)
                break;
            if ((s = run_sel(st, d, &sel,
                             "SELECT c.name, count(*), sum(c.parse_status != 'ok'), "
                             "sum(coalesce(c.result_is_error, 0)) FROM trajectories t CROSS JOIN "
                             "tool_calls c ON c.traj_id = t.traj_id",
                             " GROUP BY c.name", &a, on_tool)) != ARL_OK)
                break;
            if ((s = run_sel(
                     st, d, &sel,
                     "SELECT e.endpoint, count(*), sum(e.latency_ms), max(e.latency_ms), "
                     "sum(e.attempts - 1), sum(e.error_code IS NOT NULL) FROM trajectories t "
                     "CROSS JOIN env_calls e ON e.traj_id = t.traj_id",
                     " GROUP BY e.endpoint", &a, on_call)) != ARL_OK)
                break;
        }
        if (!filtered) {
            rdb *sd;
            if (rstore_shard_states(st, sh, &sd) == ARL_OK) {
                storage_of(&a, sd, sd->name);
                sqlite3_stmt *q;
                if (sqlite3_prepare_v2(sd->db,
                                       "SELECT producer, status, count(*), sum(n_bytes) FROM "
                                       "states GROUP BY producer, status",
                                       -1, &q, NULL) == SQLITE_OK) {
                    while (sqlite3_step(q) == SQLITE_ROW) {
                        char key[64];
                        snprintf(key, sizeof key, "%s/%s", txt(q, 0, "?"), txt(q, 1, "?"));
                        counter *c = cnt_get(&a.states, key);
                        if (c) {
                            c->n += sqlite3_column_int64(q, 2);
                            c->sum += sqlite3_column_double(q, 3);
                        }
                    }
                    sqlite3_finalize(q);
                }
            }
            arl_error_clear();
        }
    }
    if (s != ARL_OK) {
        stats_free(&a);
        rsel_free(&sel);
        return s;
    }
    counters *cs[] = {&a.status, &a.end_cause, &a.error_code, &a.seg_end, &a.rewards, &a.tools,
                      &a.calls,  &a.versions,  &a.masked_len, &a.storage, &a.states};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
        if (cs[i] != &a.storage && cs[i]->n > 1)
            qsort(cs[i]->v, cs[i]->n, sizeof *cs[i]->v, cnt_cmp);
    dist *ds[] = {&a.tok, &a.act, &a.turns, &a.segs, &a.seg_tok, &a.span};
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++)
        if (ds[i]->n > 1) qsort(ds[i]->v, ds[i]->n, sizeof(int64_t), i64_cmp);
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "trajectories", json_integer(a.n_traj));
        json_object_set_new(o, "files", json_integer(a.n_files));
        json_object_set_new(o, "status", counts_json(&a.status));
        json_object_set_new(o, "end_cause", counts_json(&a.end_cause));
        json_object_set_new(o, "error_code", counts_json(&a.error_code));
        json_object_set_new(o, "tokens", json_integer(a.tokens));
        json_object_set_new(o, "action_tokens", json_integer(a.action_tokens));
        json_object_set_new(o, "per_trajectory",
                            json_pack("{soso soso}", "tokens", dist_json(&a.tok), "action_tokens",
                                      dist_json(&a.act), "turns", dist_json(&a.turns), "segments",
                                      dist_json(&a.segs)));
        json_object_set_new(o, "segment_tokens", dist_json(&a.seg_tok));
        json_object_set_new(o, "boundary_causes", counts_json(&a.seg_end));
        json_t *rw = json_object();
        for (size_t i = 0; i < a.rewards.n; i++) {
            counter *c = &a.rewards.v[i];
            double m = c->n ? c->sum / (double)c->n : 0,
                   var = c->n ? c->sumsq / (double)c->n - m * m : 0;
            json_object_set_new(rw, c->key,
                                json_pack("{sIsfsf}", "n", (json_int_t)c->n, "mean", m, "std",
                                          sqrt(var > 0 ? var : 0)));
        }
        json_object_set_new(o, "rewards", rw);
        json_t *tl = json_object();
        for (size_t i = 0; i < a.tools.n; i++)
            json_object_set_new(tl, a.tools.v[i].key,
                                json_pack("{sIsIsI}", "calls", (json_int_t)a.tools.v[i].n,
                                          "parse_failures", (json_int_t)a.tools.v[i].n2, "errors",
                                          (json_int_t)a.tools.v[i].n3));
        json_object_set_new(o, "tools", tl);
        json_t *ec = json_object();
        for (size_t i = 0; i < a.calls.n; i++) {
            counter *c = &a.calls.v[i];
            json_object_set_new(ec, c->key,
                                json_pack("{sIsfsfsIsI}", "calls", (json_int_t)c->n, "mean_ms",
                                          c->n ? c->sum / (double)c->n : 0.0, "max_ms", c->max,
                                          "retries", (json_int_t)c->n2, "errors",
                                          (json_int_t)c->n3));
        }
        json_object_set_new(o, "env_calls", ec);
        json_t *vj = json_object(), *rj = NULL; /* {run_uid: {version: segments}} */
        for (size_t i = 0; i < a.versions.n; i++) {
            if (new_run_at(&a.versions, i)) { /* the counters are sorted by run */
                char run[REPLAY_UID_MAX + 16];
                version_run(st, &a.versions.v[i], run, sizeof run);
                json_object_set_new(vj, run, rj = json_object());
            }
            char k[32];
            snprintf(k, sizeof k, "%lld", version_of(&a.versions.v[i]));
            json_object_set_new(rj, k, json_integer(a.versions.v[i].n));
        }
        json_object_set_new(o, "segments_by_min_version", vj);
        json_object_set_new(o, "version_span", dist_json(&a.span));
        json_t *mj = json_object();
        for (size_t i = 0; i < a.masked_len.n; i++) {
            char k[32];
            snprintf(k, sizeof k, "%lld", atoll(a.masked_len.v[i].key));
            json_object_set_new(mj, k,
                                json_pack("{sIsI}", "n", (json_int_t)a.masked_len.v[i].n, "masked",
                                          (json_int_t)a.masked_len.v[i].n2));
        }
        json_object_set_new(o, "masked_by_length", mj);
        if (!filtered) {
            json_object_set_new(o, "storage_bytes", counts_json(&a.storage));
            json_t *sj = json_object();
            for (size_t i = 0; i < a.states.n; i++)
                json_object_set_new(sj, a.states.v[i].key,
                                    json_pack("{sIsI}", "count", (json_int_t)a.states.v[i].n,
                                              "bytes", (json_int_t)a.states.v[i].sum));
            json_object_set_new(o, "states", sj);
        }
        rjson_dump(o, out);
        fputc('\n', out);
        json_decref(o);
    } else {
        fprintf(out, "store %s: %lld trajectories in %lld files\n", st->root, (long long)a.n_traj,
                (long long)a.n_files);
        print_counts(out, "status", &a.status);
        print_counts(out, "end cause", &a.end_cause);
        print_counts(out, "error codes", &a.error_code);
        fprintf(out, "tokens: %lld (action %lld)\n", (long long)a.tokens,
                (long long)a.action_tokens);
        fprintf(out, "distributions              %8s %10s %10s %10s %10s\n", "n", "p50", "p90",
                "p99", "max");
        print_dist(out, "tokens/trajectory", &a.tok);
        print_dist(out, "action tokens/traj", &a.act);
        print_dist(out, "turns/trajectory", &a.turns);
        print_dist(out, "segments/trajectory", &a.segs);
        print_dist(out, "tokens/segment", &a.seg_tok);
        print_dist(out, "version span/traj", &a.span);
        print_counts(out, "boundary causes", &a.seg_end);
        fprintf(out, "rewards (level component): n, mean, std\n");
        for (size_t i = 0; i < a.rewards.n; i++) {
            counter *c = &a.rewards.v[i];
            double m = c->n ? c->sum / (double)c->n : 0,
                   var = c->n ? c->sumsq / (double)c->n - m * m : 0;
            fprintf(out, "  %-32s %8lld %10.4f %10.4f\n", c->key, (long long)c->n, m,
                    sqrt(var > 0 ? var : 0));
        }
        fprintf(out, "segments by min policy version:");
        for (size_t i = 0; i < a.versions.n; i++) {
            const int new_run = new_run_at(&a.versions, i);
            if (new_run) { /* each run's versions after its uid */
                char run[REPLAY_UID_MAX + 16];
                version_run(st, &a.versions.v[i], run, sizeof run);
                fprintf(out, "%s %s:", i ? ";" : "", run);
            }
            fprintf(out, "%s v%lld %lld", new_run ? "" : ",", version_of(&a.versions.v[i]),
                    (long long)a.versions.v[i].n);
        }
        fprintf(out, "\nmasked fraction by length (tokens >= bucket):");
        for (size_t i = 0; i < a.masked_len.n; i++)
            fprintf(out, "%s %lld: %lld/%lld", i ? "," : "", atoll(a.masked_len.v[i].key),
                    (long long)a.masked_len.v[i].n2, (long long)a.masked_len.v[i].n);
        fprintf(out, "\ntools: calls, parse failures, result errors\n");
        for (size_t i = 0; i < a.tools.n; i++)
            fprintf(out, "  %-24s %8lld %8lld %8lld\n", a.tools.v[i].key, (long long)a.tools.v[i].n,
                    (long long)a.tools.v[i].n2, (long long)a.tools.v[i].n3);
        fprintf(out, "env calls: calls, mean ms, max ms, retries, errors\n");
        for (size_t i = 0; i < a.calls.n; i++) {
            counter *c = &a.calls.v[i];
            fprintf(out, "  %-24s %8lld %8.1f %8.0f %8lld %8lld\n", c->key, (long long)c->n,
                    c->n ? c->sum / (double)c->n : 0.0, c->max, (long long)c->n2, (long long)c->n3);
        }
        if (!filtered) {
            fprintf(out, "storage (bytes):\n");
            for (size_t i = 0; i < a.storage.n; i++)
                fprintf(out, "  %-56s %12lld\n", a.storage.v[i].key, (long long)a.storage.v[i].n);
            fprintf(out, "states (producer/status): count, bytes\n");
            for (size_t i = 0; i < a.states.n; i++)
                fprintf(out, "  %-24s %8lld %14.0f\n", a.states.v[i].key,
                        (long long)a.states.v[i].n, a.states.v[i].sum);
        }
    }
    stats_free(&a);
    rsel_free(&sel);
    return ARL_OK;
}
