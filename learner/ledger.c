/* learner/ledger.c: the learner's catalog and shard reads (learner/ledger.h),
 * plain SQL on the store's SQLite files with the names of spec/replay.md section 4. */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "learner/ledger.h"

struct arl_ledger {
    sqlite3 *db;
    char path[4200];
};

static arl_status db_fail(sqlite3 *db, const char *path, int rc, const char *what) {
    arl_status s = rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? ARL_ERR_BUSY : ARL_ERR_DB;
    return arl_errorf(s, "learner: %s: %s failed: %s (rc %d)%s", path, what,
                      db ? sqlite3_errmsg(db) : "cannot open", rc,
                      s == ARL_ERR_BUSY ? "; another process holds the file: retry" : "");
}

static arl_status exec(arl_ledger *l, const char *sql, const char *what) {
    int rc = sqlite3_exec(l->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? ARL_OK : db_fail(l->db, l->path, rc, what);
}

static arl_status prep(sqlite3 *db, const char *path, const char *sql, sqlite3_stmt **st) {
    int rc = sqlite3_prepare_v2(db, sql, -1, st, NULL);
    return rc == SQLITE_OK ? ARL_OK : db_fail(db, path, rc, "preparing a query");
}

static void col_text(sqlite3_stmt *q, int i, char *buf, size_t cap) {
    const unsigned char *t = sqlite3_column_text(q, i);
    snprintf(buf, cap, "%s", t ? (const char *)t : "");
}

arl_status arl_ledger_open(const char *root, arl_ledger **out) {
    *out = NULL;
    arl_ledger *l = calloc(1, sizeof *l);
    if (!l) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    snprintf(l->path, sizeof l->path, "%s/catalog.sqlite", root);
    int rc = sqlite3_open_v2(l->path, &l->db, SQLITE_OPEN_READWRITE, NULL);
    if (rc != SQLITE_OK) {
        arl_status s = rc == SQLITE_CANTOPEN ? arl_errorf(ARL_ERR_NOT_FOUND,
                                                          "learner: %s: no catalog (is %s a replay "
                                                          "store with a catalog?)",
                                                          l->path, root)
                                             : db_fail(l->db, l->path, rc, "opening");
        sqlite3_close(l->db);
        free(l);
        return s;
    }
    sqlite3_busy_timeout(l->db, 10000);
    arl_status s = exec(l,
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; "
                        "PRAGMA foreign_keys = ON;",
                        "setting the connection");
    if (s) {
        arl_ledger_close(l);
        return s;
    }
    *out = l;
    return ARL_OK;
}

void arl_ledger_close(arl_ledger *l) {
    if (!l) return;
    sqlite3_close(l->db);
    free(l);
}

arl_status arl_ledger_run_id(arl_ledger *l, const char *run_uid, int64_t *run_id) {
    sqlite3_stmt *q;
    ARL_TRY(prep(l->db, l->path, "SELECT run_id FROM runs WHERE run_uid = ?1", &q));
    sqlite3_bind_text(q, 1, run_uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc == SQLITE_ROW)
        *run_id = sqlite3_column_int64(q, 0);
    else if (rc == SQLITE_DONE)
        s = arl_errorf(ARL_ERR_NOT_FOUND, "learner: %s: no run '%s'", l->path, run_uid);
    else
        s = db_fail(l->db, l->path, rc, "reading runs");
    sqlite3_finalize(q);
    return s;
}

arl_status arl_ledger_group_counts(arl_ledger *l, int64_t run_id, const char *kind,
                                   arl_ledger_counts *c) {
    memset(c, 0, sizeof *c);
    sqlite3_stmt *q;
    ARL_TRY(prep(l->db, l->path,
                 "SELECT status, count(*) FROM task_groups WHERE run_id = ?1 AND kind = ?2 "
                 "GROUP BY status",
                 &q));
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_text(q, 2, kind, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *st = (const char *)sqlite3_column_text(q, 0);
        int64_t n = sqlite3_column_int64(q, 1);
        if (!strcmp(st, "open"))
            c->open = n;
        else if (!strcmp(st, "final"))
            c->final = n;
        else if (!strcmp(st, "consumed"))
            c->consumed = n;
        else if (!strcmp(st, "abandoned"))
            c->abandoned = n;
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? ARL_OK : db_fail(l->db, l->path, rc, "counting groups");
}

/* Rows of a query with two int64 parameters into ids (cap). */
static arl_status ids_query(arl_ledger *l, const char *sql, int64_t a, int64_t b, const char *c,
                            int64_t limit, int64_t *ids, int64_t cap, int64_t *n) {
    sqlite3_stmt *q;
    *n = 0;
    ARL_TRY(prep(l->db, l->path, sql, &q));
    sqlite3_bind_int64(q, 1, a);
    sqlite3_bind_int64(q, 2, b);
    if (c) sqlite3_bind_text(q, 3, c, -1, SQLITE_STATIC);
    if (limit >= 0) sqlite3_bind_int64(q, 4, limit);
    int rc;
    arl_status s = ARL_OK;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n >= cap) {
            s = arl_errorf(ARL_ERR_RANGE, "learner: %s: update has more than %lld groups", l->path,
                           (long long)cap);
            break;
        }
        ids[(*n)++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (s) return s;
    return rc == SQLITE_DONE ? ARL_OK : db_fail(l->db, l->path, rc, "reading groups");
}

arl_status arl_ledger_groups(arl_ledger *l, int64_t run_id, const char *kind, int64_t *group_ids,
                             int64_t cap, int64_t *n) {
    return ids_query(l,
                     "SELECT group_id FROM task_groups WHERE run_id = ?1 AND ?2 = 0 AND kind = ?3 "
                     "ORDER BY group_id",
                     run_id, 0, kind, -1, group_ids, cap, n);
}

arl_status arl_ledger_groups_alloc(arl_ledger *l, int64_t run_id, const char *kind,
                                   int64_t **group_ids, int64_t *n) {
    *group_ids = NULL;
    *n = 0;
    arl_ledger_counts c;
    ARL_TRY(arl_ledger_group_counts(l, run_id, kind, &c));
    const int64_t cap = c.open + c.final + c.consumed + c.abandoned;
    if (cap == 0) return ARL_OK;
    int64_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    const arl_status s = arl_ledger_groups(l, run_id, kind, ids, cap, n);
    if (s) {
        free(ids);
        *n = 0;
        return s;
    }
    *group_ids = ids;
    return ARL_OK;
}

arl_status arl_ledger_members(arl_ledger *l, int64_t group_id, arl_ledger_member *m, int32_t cap,
                              int32_t *n) {
    *n = 0;
    sqlite3_stmt *q;
    ARL_TRY(prep(l->db, l->path,
                 "SELECT slot, attempt, shard_id, traj_id, status FROM group_members m WHERE "
                 "group_id = ?1 AND attempt = (SELECT max(attempt) FROM group_members x WHERE "
                 "x.group_id = ?1 AND x.slot = m.slot) ORDER BY slot",
                 &q));
    sqlite3_bind_int64(q, 1, group_id);
    int rc;
    arl_status s = ARL_OK;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n >= cap) {
            s = arl_errorf(ARL_ERR_RANGE, "learner: group %lld has more than %d members",
                           (long long)group_id, (int)cap);
            break;
        }
        arl_ledger_member *e = &m[(*n)++];
        e->slot = sqlite3_column_int(q, 0);
        e->attempt = sqlite3_column_int(q, 1);
        e->shard_id = sqlite3_column_int(q, 2);
        e->traj_id = sqlite3_column_int64(q, 3);
        col_text(q, 4, e->status, sizeof e->status);
    }
    sqlite3_finalize(q);
    if (s) return s;
    return rc == SQLITE_DONE ? ARL_OK : db_fail(l->db, l->path, rc, "reading group_members");
}

arl_status arl_ledger_group_env(arl_ledger *l, int64_t group_id, int32_t *size, char *env_name,
                                size_t cap, char **info_json) {
    *info_json = NULL;
    sqlite3_stmt *q;
    ARL_TRY(prep(l->db, l->path,
                 "SELECT g.size, e.name, e.info_json FROM task_groups g JOIN envs e ON e.env_id = "
                 "g.env_id WHERE g.group_id = ?1",
                 &q));
    sqlite3_bind_int64(q, 1, group_id);
    int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc == SQLITE_ROW) {
        *size = sqlite3_column_int(q, 0);
        col_text(q, 1, env_name, cap);
        const unsigned char *t = sqlite3_column_text(q, 2);
        *info_json = strdup(t ? (const char *)t : "{}");
        if (!*info_json) s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    } else if (rc == SQLITE_DONE) {
        s = arl_errorf(ARL_ERR_NOT_FOUND, "learner: %s: no group %lld", l->path,
                       (long long)group_id);
    } else {
        s = db_fail(l->db, l->path, rc, "reading task_groups");
    }
    sqlite3_finalize(q);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* shard reads                                                                                  */

typedef struct shard_db {
    int32_t shard_id;
    sqlite3 *db;
    char path[4200];
} shard_db;

struct arl_shard_reader {
    char root[4096];
    shard_db *v;
    int32_t n, cap;
};

arl_status arl_shard_reader_open(const char *root, arl_shard_reader **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    snprintf((*out)->root, sizeof(*out)->root, "%s", root);
    return ARL_OK;
}

void arl_shard_reader_close(arl_shard_reader *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n; i++)
        sqlite3_close(r->v[i].db);
    free(r->v);
    free(r);
}

static arl_status shard_get(arl_shard_reader *r, int32_t shard_id, shard_db **out) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->v[i].shard_id == shard_id) {
            *out = &r->v[i];
            return ARL_OK;
        }
    /* the file name from the catalog */
    char cat[4200], file[1024] = "";
    snprintf(cat, sizeof cat, "%s/catalog.sqlite", r->root);
    sqlite3 *c = NULL;
    int rc = sqlite3_open_v2(cat, &c, SQLITE_OPEN_READONLY, NULL);
    if (rc != SQLITE_OK) {
        arl_status s = db_fail(c, cat, rc, "opening");
        sqlite3_close(c);
        return s;
    }
    sqlite3_busy_timeout(c, 10000);
    sqlite3_stmt *q = NULL;
    arl_status s = prep(c, cat, "SELECT file_name FROM shards WHERE shard_id = ?1", &q);
    if (s == ARL_OK) {
        sqlite3_bind_int(q, 1, shard_id);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW)
            col_text(q, 0, file, sizeof file);
        else if (rc == SQLITE_DONE)
            s = arl_errorf(ARL_ERR_NOT_FOUND, "learner: %s: no shard %d", cat, (int)shard_id);
        else
            s = db_fail(c, cat, rc, "reading shards");
    }
    sqlite3_finalize(q);
    sqlite3_close(c);
    ARL_TRY(s);
    if (r->n == r->cap) {
        int32_t nc = r->cap ? 2 * r->cap : 4;
        shard_db *v = realloc(r->v, (size_t)nc * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
        r->v = v;
        r->cap = nc;
    }
    shard_db *d = &r->v[r->n];
    memset(d, 0, sizeof *d);
    d->shard_id = shard_id;
    snprintf(d->path, sizeof d->path, "%s/%s", r->root, file);
    rc = sqlite3_open_v2(d->path, &d->db, SQLITE_OPEN_READONLY, NULL);
    if (rc != SQLITE_OK) {
        s = db_fail(d->db, d->path, rc, "opening");
        sqlite3_close(d->db);
        return s;
    }
    sqlite3_busy_timeout(d->db, 10000);
    r->n++;
    *out = d;
    return ARL_OK;
}

/* Fills one row (of the caller's row type) from the current result row of q. */
typedef void (*row_fill_fn)(sqlite3_stmt *q, void *row);

/* The rows of sql (?1 = traj_id) in the shard's file, each size bytes, filled by fill: *rows
 * malloc'ed (caller frees), NULL with *n = 0 on error; what names the read in a failure. */
static arl_status traj_rows(arl_shard_reader *r, int32_t shard_id, int64_t traj_id, const char *sql,
                            const char *what, size_t size, row_fill_fn fill, void **rows,
                            int32_t *n) {
    *rows = NULL;
    *n = 0;
    shard_db *d;
    ARL_TRY(shard_get(r, shard_id, &d));
    sqlite3_stmt *q;
    ARL_TRY(prep(d->db, d->path, sql, &q));
    sqlite3_bind_int64(q, 1, traj_id);
    int rc, cap = 0;
    arl_status s = ARL_OK;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            void *v = realloc(*rows, (size_t)cap * size);
            if (!v) {
                s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
                break;
            }
            *rows = v;
        }
        fill(q, (char *)*rows + (size_t)(*n)++ * size);
    }
    sqlite3_finalize(q);
    if (s == ARL_OK && rc != SQLITE_DONE) s = db_fail(d->db, d->path, rc, what);
    if (s) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return s;
}

static void turn_fill(sqlite3_stmt *q, void *row) {
    arl_turn_row *t = row;
    memset(t, 0, sizeof *t);
    t->step_index = sqlite3_column_int(q, 0);
    t->seg_index = sqlite3_column_int(q, 1);
    t->act_tok_start = sqlite3_column_type(q, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 2);
    t->act_tok_end = sqlite3_column_type(q, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 3);
    t->reward = sqlite3_column_type(q, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 4);
    t->has_anchor = sqlite3_column_type(q, 5) != SQLITE_NULL;
    col_text(q, 5, t->anchor, sizeof t->anchor);
    col_text(q, 6, t->parse_status, sizeof t->parse_status);
}

arl_status arl_shard_turns(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                           arl_turn_row **rows, int32_t *n) {
    void *v;
    arl_status s = traj_rows(r, shard_id, traj_id,
                             "SELECT step_index, seg_index, act_tok_start, act_tok_end, reward, "
                             "anchor, parse_status FROM turns WHERE traj_id = ?1 ORDER BY "
                             "step_index",
                             "reading turns", sizeof **rows, turn_fill, &v, n);
    *rows = v;
    return s;
}

static void reward_fill(sqlite3_stmt *q, void *row) {
    arl_reward_row *t = row;
    col_text(q, 0, t->level, sizeof t->level);
    t->scope = sqlite3_column_int64(q, 1);
    col_text(q, 2, t->component, sizeof t->component);
    t->value = sqlite3_column_type(q, 3) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 3);
}

arl_status arl_shard_rewards(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                             arl_reward_row **rows, int32_t *n) {
    void *v;
    arl_status s = traj_rows(r, shard_id, traj_id,
                             "SELECT level, scope_index, component, value FROM rewards WHERE "
                             "traj_id = ?1 AND source = 'env' ORDER BY level, scope_index, "
                             "component",
                             "reading rewards", sizeof **rows, reward_fill, &v, n);
    *rows = v;
    return s;
}

const char *const arl_shard_parse_names[8] = {
    "ok",           "no_tool_call",   "invalid_json",        "arguments_not_object",
    "missing_name", "unclosed_block", "malformed_structure", "other"};
const char *const arl_shard_endpoint_names[7] = {
    "create", "step", "score_segment", "score_episode", "fork", "delete", "get"};

void arl_shard_stats_free(arl_shard_stats *s) {
    if (!s) return;
    for (int i = 0; i < 7; i++)
        free(s->lat[i]);
    memset(s, 0, sizeof *s);
}

arl_status arl_shard_stats_add(arl_shard_reader *r, int32_t shard_id, int64_t traj_id,
                               arl_shard_stats *st) {
    shard_db *d;
    ARL_TRY(shard_get(r, shard_id, &d));
    sqlite3_stmt *q;
    int rc;
    /* parse statuses of model turns */
    ARL_TRY(prep(d->db, d->path,
                 "SELECT parse_status FROM turns WHERE traj_id = ?1 AND step_index > 0", &q));
    sqlite3_bind_int64(q, 1, traj_id);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *p = (const char *)sqlite3_column_text(q, 0);
        int k = 7;
        for (int i = 0; p && i < 7; i++)
            if (!strcmp(p, arl_shard_parse_names[i])) k = i;
        st->turns++;
        st->parse_n[k]++;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return db_fail(d->db, d->path, rc, "reading turns");
    /* tool calls by result error code */
    ARL_TRY(
        prep(d->db, d->path, "SELECT result_error_code FROM tool_calls WHERE traj_id = ?1", &q));
    sqlite3_bind_int64(q, 1, traj_id);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        st->tool_calls++;
        const char *e = (const char *)sqlite3_column_text(q, 0);
        if (!e || !*e) continue;
        int32_t k = -1;
        for (int32_t i = 0; i < st->n_tool_err; i++)
            if (!strcmp(st->tool_err_name[i], e)) k = i;
        if (k < 0 && st->n_tool_err < 16) {
            k = st->n_tool_err++;
            snprintf(st->tool_err_name[k], sizeof st->tool_err_name[k], "%s", e);
        }
        if (k >= 0) st->tool_err_n[k]++;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return db_fail(d->db, d->path, rc, "reading tool_calls");
    /* environment calls: latency per endpoint, retries */
    ARL_TRY(prep(d->db, d->path,
                 "SELECT endpoint, latency_ms, attempts FROM env_calls WHERE "
                 "traj_id = ?1",
                 &q));
    sqlite3_bind_int64(q, 1, traj_id);
    arl_status s = ARL_OK;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *e = (const char *)sqlite3_column_text(q, 0);
        int k = -1;
        for (int i = 0; e && i < 7; i++)
            if (!strcmp(e, arl_shard_endpoint_names[i])) k = i;
        int64_t att = sqlite3_column_int64(q, 2);
        if (att > 1) st->retries += att - 1;
        if (k < 0) continue;
        if (st->n_lat[k] == st->cap_lat[k]) {
            int64_t nc = st->cap_lat[k] ? 2 * st->cap_lat[k] : 64;
            double *v = realloc(st->lat[k], (size_t)nc * sizeof *v);
            if (!v) {
                s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
                break;
            }
            st->lat[k] = v;
            st->cap_lat[k] = nc;
        }
        st->lat[k][st->n_lat[k]++] = (double)sqlite3_column_int64(q, 1);
    }
    sqlite3_finalize(q);
    if (s) return s;
    if (rc != SQLITE_DONE) return db_fail(d->db, d->path, rc, "reading env_calls");
    return ARL_OK;
}
