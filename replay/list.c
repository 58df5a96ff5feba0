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

/* 1 (the error cleared) when opening a shard failed with s for a reason of the file's own
 * (another schema version, damage, an unreadable file) in a store of several files: list and
 * stats leave it out, as replay_shards_warn_unreadable told the user; out of memory, or the only
 * file given, fails. */
static int shard_left_out(const replay_store *st, arl_status s) {
    if (s == ARL_OK || s == ARL_ERR_NOMEM || st->single_file) return 0;
    arl_error_clear();
    return 1;
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
        if (shard_left_out(st, s = rstore_shard_db(st, sh, &d))) {
            s = ARL_OK;
            continue;
        }
        if (s != ARL_OK) break;
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

typedef char run_name[REPLAY_UID_MAX + 16];

/* json_object_set_new, *bad set when it fails (out of memory: the key would be missing) */
static void jset(int *bad, json_t *o, const char *key, json_t *v) {
    if (json_object_set_new(o, key, v)) *bad = 1;
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
        if ((s = rcat_env_name(st, r->env_id, env, sizeof env, ver, sizeof ver)) != ARL_OK) break;
        int64_t when = r->finished_at_ms >= 0 ? r->finished_at_ms : r->updated_at_ms;
        fmt_time(when, tm, sizeof tm);
        if (json) {
            int bad = 0;
            json_t *o = json_object();
            jset(&bad, o, "traj_uid", json_string(r->traj_uid));
            jset(&bad, o, "traj_id", json_integer(r->traj_id));
            jset(&bad, o, "status", json_string(replay_status_name(r->status)));
            jset(&bad, o, "end_cause", r->end_cause[0] ? json_string(r->end_cause) : json_null());
            jset(&bad, o, "error_code",
                 r->error_code[0] ? json_string(r->error_code) : json_null());
            jset(&bad, o, "env", json_string(env));
            jset(&bad, o, "env_version", json_string(ver));
            jset(&bad, o, "turns", json_integer(r->n_turns));
            jset(&bad, o, "segments", json_integer(r->n_segments));
            jset(&bad, o, "tokens", json_integer(r->n_tokens));
            jset(&bad, o, "action_tokens", json_integer(r->n_action_tokens));
            jset(&bad, o, "versions",
                 r->min_version >= 0
                     ? json_pack("[II]", (json_int_t)r->min_version, (json_int_t)r->max_version)
                     : json_null());
            jset(&bad, o, "outcome",
                 isnan(r->outcome_reward) ? json_null() : json_real(r->outcome_reward));
            jset(&bad, o, "time_ms", json_integer(when));
            int pinned = 0;
            char reason[1024];
            if ((s = replay_pin_get(st, r->traj_uid, &pinned, reason, sizeof reason)) != ARL_OK) {
                json_decref(o);
                break;
            }
            jset(&bad, o, "pinned", json_boolean(pinned));
            jset(&bad, o, "pin_reason", pinned ? json_string(reason) : json_null());
            if (bad || !o) {
                json_decref(o);
                s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory listing trajectories");
                break;
            }
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

/* A versions counter's run uid (its key: "<run_id> <version>"), or "run <run_id>" when the
 * catalog has no such run (or the store no catalog); a failed look-up is an error. */
static arl_status version_run(replay_store *st, const counter *c, char *buf, size_t cap) {
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", atoll(c->key));
    replay_run_info r = {0};
    arl_status s = replay_run_get(st, rid, &r);
    if (s == ARL_OK) {
        snprintf(buf, cap, "%s", r.run_uid);
    } else if (s == ARL_ERR_NOT_FOUND || s == ARL_ERR_STATE) {
        snprintf(buf, cap, "run %s", rid);
        arl_error_clear();
        s = ARL_OK;
    }
    replay_run_info_free(&r);
    return s;
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

/* The file's size, and its tables' when SQLite has dbstat.  Only a missing dbstat ("no such
 * table", SQLite built without it) skips the tables: another failure to prepare (out of
 * memory) or to step is an error, not sizes left out without a word. */
static arl_status storage_of(stats_acc *a, rdb *d, const char *file) {
    struct stat sb;
    counter *c;
    if (stat(d->path, &sb) == 0) {
        if (!(c = cnt_get(&a->storage, file))) return stats_nomem();
        c->n += (int64_t)sb.st_size;
    }
    sqlite3_stmt *q;
    int rc = sqlite3_prepare_v2(d->db, "SELECT name, sum(pgsize) FROM dbstat GROUP BY name", -1, &q,
                                NULL);
    if (rc == SQLITE_ERROR && strstr(sqlite3_errmsg(d->db), "no such table"))
        return ARL_OK; /* dbstat not compiled in: per-table sizes are skipped */
    if (rc != SQLITE_OK) return rdb_fail(d, rc, "reading table sizes (dbstat)");
    arl_status s = ARL_OK;
    while (s == ARL_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        char key[96];
        snprintf(key, sizeof key, "  %s: %s", file, txt(q, 0, "?"));
        if (!(c = cnt_get(&a->storage, key)))
            s = stats_nomem();
        else
            c->n += sqlite3_column_int64(q, 1);
    }
    if (s == ARL_OK && rc != SQLITE_DONE) s = rdb_fail(d, rc, "reading table sizes (dbstat)");
    sqlite3_finalize(q);
    return s;
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

/* NULL when out of memory */
static json_t *counts_json(counters *c) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < c->n; i++)
        if (json_object_set_new(o, c->v[i].key, json_integer(c->v[i].n))) {
            json_decref(o);
            o = NULL;
        }
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
        if (shard_left_out(st, s = rstore_shard_db(st, sh, &d))) {
            s = ARL_OK;
            continue;
        }
        if (s != ARL_OK) break;
        a.n_files++;
        if (!filtered && (s = storage_of(&a, d, sh->file)) != ARL_OK) break;
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
            /* a shard without a states file (a learner file, or none written yet) has none to
             * count; any other failure (out of memory, a damaged file) is an error */
            rdb *sd;
            arl_status ss = rstore_shard_states(st, sh, &sd);
            if (ss == ARL_ERR_NOT_FOUND) {
                arl_error_clear();
                continue;
            }
            if ((s = ss) != ARL_OK) break;
            if (!sd->db) continue;
            if ((s = storage_of(&a, sd, sd->name)) != ARL_OK) break;
            sqlite3_stmt *q;
            if ((s = rdb_prepare(sd,
                                 "SELECT producer, status, count(*), sum(n_bytes) FROM states "
                                 "GROUP BY producer, status",
                                 &q)) != ARL_OK)
                break;
            int rc;
            while (s == ARL_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
                char key[64];
                snprintf(key, sizeof key, "%s/%s", txt(q, 0, "?"), txt(q, 1, "?"));
                counter *c = cnt_get(&a.states, key);
                if (!c) {
                    s = stats_nomem();
                } else {
                    c->n += sqlite3_column_int64(q, 2);
                    c->sum += sqlite3_column_double(q, 3);
                }
            }
            if (s == ARL_OK && rc != SQLITE_DONE) s = rdb_fail(sd, rc, "counting states");
            sqlite3_finalize(q);
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
    /* the runs' uids first: a failed look-up ends the command before any output */
    size_t n_runs = 0;
    for (size_t i = 0; i < a.versions.n; i++)
        n_runs += new_run_at(&a.versions, i);
    run_name *run_names = calloc(n_runs ? n_runs : 1, sizeof *run_names);
    if (!run_names) s = stats_nomem();
    for (size_t i = 0, r = 0; s == ARL_OK && i < a.versions.n; i++)
        if (new_run_at(&a.versions, i))
            s = version_run(st, &a.versions.v[i], run_names[r++], sizeof *run_names);
    if (s != ARL_OK) {
        free(run_names);
        stats_free(&a);
        rsel_free(&sel);
        return s;
    }
    if (json) {
        int bad = 0;
        json_t *o = json_object();
        size_t r = 0;
        jset(&bad, o, "trajectories", json_integer(a.n_traj));
        jset(&bad, o, "files", json_integer(a.n_files));
        jset(&bad, o, "status", counts_json(&a.status));
        jset(&bad, o, "end_cause", counts_json(&a.end_cause));
        jset(&bad, o, "error_code", counts_json(&a.error_code));
        jset(&bad, o, "tokens", json_integer(a.tokens));
        jset(&bad, o, "action_tokens", json_integer(a.action_tokens));
        jset(&bad, o, "per_trajectory",
             json_pack("{soso soso}", "tokens", dist_json(&a.tok), "action_tokens",
                       dist_json(&a.act), "turns", dist_json(&a.turns), "segments",
                       dist_json(&a.segs)));
        jset(&bad, o, "segment_tokens", dist_json(&a.seg_tok));
        jset(&bad, o, "boundary_causes", counts_json(&a.seg_end));
        json_t *rw = json_object();
        for (size_t i = 0; i < a.rewards.n; i++) {
            counter *c = &a.rewards.v[i];
            double m = c->n ? c->sum / (double)c->n : 0,
                   var = c->n ? c->sumsq / (double)c->n - m * m : 0;
            jset(&bad, rw, c->key,
                 json_pack("{sIsfsf}", "n", (json_int_t)c->n, "mean", m, "std",
                           sqrt(var > 0 ? var : 0)));
        }
        jset(&bad, o, "rewards", rw);
        json_t *tl = json_object();
        for (size_t i = 0; i < a.tools.n; i++)
            jset(&bad, tl, a.tools.v[i].key,
                 json_pack("{sIsIsI}", "calls", (json_int_t)a.tools.v[i].n, "parse_failures",
                           (json_int_t)a.tools.v[i].n2, "errors", (json_int_t)a.tools.v[i].n3));
        jset(&bad, o, "tools", tl);
        json_t *ec = json_object();
        for (size_t i = 0; i < a.calls.n; i++) {
            counter *c = &a.calls.v[i];
            jset(&bad, ec, c->key,
                 json_pack("{sIsfsfsIsI}", "calls", (json_int_t)c->n, "mean_ms",
                           c->n ? c->sum / (double)c->n : 0.0, "max_ms", c->max, "retries",
                           (json_int_t)c->n2, "errors", (json_int_t)c->n3));
        }
        jset(&bad, o, "env_calls", ec);
        json_t *vj = json_object(), *rj = NULL; /* {run_uid: {version: segments}} */
        for (size_t i = 0; i < a.versions.n; i++) {
            if (new_run_at(&a.versions, i)) { /* the counters are sorted by run */
                jset(&bad, vj, run_names[r++], rj = json_object());
            }
            char k[32];
            snprintf(k, sizeof k, "%lld", version_of(&a.versions.v[i]));
            jset(&bad, rj, k, json_integer(a.versions.v[i].n));
        }
        jset(&bad, o, "segments_by_min_version", vj);
        jset(&bad, o, "version_span", dist_json(&a.span));
        json_t *mj = json_object();
        for (size_t i = 0; i < a.masked_len.n; i++) {
            char k[32];
            snprintf(k, sizeof k, "%lld", atoll(a.masked_len.v[i].key));
            jset(&bad, mj, k,
                 json_pack("{sIsI}", "n", (json_int_t)a.masked_len.v[i].n, "masked",
                           (json_int_t)a.masked_len.v[i].n2));
        }
        jset(&bad, o, "masked_by_length", mj);
        if (!filtered) {
            jset(&bad, o, "storage_bytes", counts_json(&a.storage));
            json_t *sj = json_object();
            for (size_t i = 0; i < a.states.n; i++)
                jset(&bad, sj, a.states.v[i].key,
                     json_pack("{sIsI}", "count", (json_int_t)a.states.v[i].n, "bytes",
                               (json_int_t)a.states.v[i].sum));
            jset(&bad, o, "states", sj);
        }
        if (bad || !o) {
            json_decref(o);
            free(run_names);
            stats_free(&a);
            rsel_free(&sel);
            return stats_nomem();
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
        size_t r = 0;
        for (size_t i = 0; i < a.versions.n; i++) {
            const int new_run = new_run_at(&a.versions, i);
            if (new_run) /* each run's versions after its uid */
                fprintf(out, "%s %s:", i ? ";" : "", run_names[r++]);
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
    free(run_names);
    stats_free(&a);
    rsel_free(&sel);
    return ARL_OK;
}
