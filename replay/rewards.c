/* replay/rewards.c: rewards rows read by trajectory, and the re-scored rewards rows that
 * `agentrl replay rescore --rewards` writes into a tool file (spec/replay.md 4.9, 13.6).
 *
 * A re-scored row keeps the trajectory's global traj_id (unique over the store, section 2.1)
 * while the trajectory itself lives in another file: the tool file's rewards.traj_id then has no
 * parent row in that file.  The insert runs with foreign-key enforcement off for its
 * transaction (SQLite enforces REFERENCES per file), after checking that the trajectory exists
 * in the store; verify accepts exactly such rows (source 'rescore:<label>', trajectory found in
 * the store) in tool files.  What it is not: the computation of the rewards (rollout/). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

void replay_reward_rows_free(replay_reward_row *rows) {
    free(rows);
}

/* Append the rows of one query (traj_id bound to ?1, optional source to ?2). */
static arl_status collect(replay_store *st, rdb *d, const char *sql, int64_t traj_id,
                          const char *source, replay_reward_row **rows, size_t *n, size_t *cap) {
    sqlite3_stmt *q;
    ARL_TRY(rstore_prepare(st, d, sql, &q));
    sqlite3_bind_int64(q, 1, traj_id);
    if (source) sqlite3_bind_text(q, 2, source, -1, SQLITE_STATIC);
    int rc;
    arl_status s = ARL_OK;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == *cap) {
            size_t c = *cap ? 2 * *cap : 32;
            replay_reward_row *v = realloc(*rows, c * sizeof *v);
            if (!v) {
                s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
                break;
            }
            *rows = v;
            *cap = c;
        }
        replay_reward_row *r = &(*rows)[(*n)++];
        memset(r, 0, sizeof *r);
        rdb_col_text(q, 0, r->level, sizeof r->level);
        r->scope_index = sqlite3_column_int64(q, 1);
        rdb_col_text(q, 2, r->component, sizeof r->component);
        rdb_col_text(q, 3, r->source, sizeof r->source);
        r->value = sqlite3_column_type(q, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 4);
        r->call_seq = rdb_col_int_or(q, 5, -1);
    }
    if (s == ARL_OK && rc != SQLITE_DONE) s = rdb_fail(d, rc, "reading rewards");
    sqlite3_finalize(q);
    return s;
}

static int cmp_row(const void *a, const void *b) {
    const replay_reward_row *x = a, *y = b;
    int c = strcmp(x->level, y->level);
    if (c) return c;
    if (x->scope_index != y->scope_index) return x->scope_index < y->scope_index ? -1 : 1;
    if ((c = strcmp(x->component, y->component))) return c;
    return strcmp(x->source, y->source);
}

arl_status replay_rewards_load(replay_store *st, int64_t traj_id, const char *source,
                               replay_reward_row **rows, size_t *n) {
    *rows = NULL;
    *n = 0;
    size_t cap = 0;
    static const char *const cols =
        "SELECT level, scope_index, component, source, value, call_seq FROM rewards WHERE "
        "traj_id = ?1";
    char sql[256];
    arl_status s = ARL_OK;
    if (!source) {
        replay_traj_row t;
        ARL_TRY(replay_traj_get_id(st, traj_id, &t));
        rshard *sh = rstore_shard(st, t.shard_id);
        if (!sh && st->single_file) sh = &st->shards[0];
        rdb *d;
        if (!sh)
            return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: shard %d of trajectory %s is missing",
                              st->root, (int)t.shard_id, t.traj_uid);
        s = rstore_shard_db(st, sh, &d);
        snprintf(sql, sizeof sql, "%s", cols);
        if (s == ARL_OK) s = collect(st, d, sql, traj_id, NULL, rows, n, &cap);
    } else {
        snprintf(sql, sizeof sql, "%s AND source = ?2", cols);
        for (size_t i = 0; s == ARL_OK && i < st->n_shards; i++) {
            rshard *sh = &st->shards[i];
            if (sh->kind != REPLAY_FILE_TOOL) continue;
            rdb *d;
            s = rstore_shard_db(st, sh, &d);
            if (s == ARL_OK) s = collect(st, d, sql, traj_id, source, rows, n, &cap);
        }
    }
    if (s != ARL_OK) {
        free(*rows);
        *rows = NULL;
        *n = 0;
        return s;
    }
    if (*n > 1) qsort(*rows, *n, sizeof **rows, cmp_row);
    return ARL_OK;
}

arl_status replay_rescore_rewards_put(replay_writer *w, int64_t traj_id, const char *source,
                                      const replay_reward *rows, size_t n) {
    if (w->kind != REPLAY_FILE_TOOL)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: re-scored rewards go into a tool file, not a %s file",
                          w->file, replay_file_kind_name(w->kind));
    if (!source || strncmp(source, "rescore:", 8) || !source[8])
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: re-scored rewards need the source 'rescore:<label>', got "
                          "'%s'",
                          w->file, source ? source : "(null)");
    for (size_t i = 0; i < n; i++)
        if (!rows[i].level || !rows[i].component ||
            (rows[i].source && strcmp(rows[i].source, source)))
            return arl_errorf(ARL_ERR_ARG,
                              "replay: %s: re-scored reward row %zu needs a level, a component "
                              "and the source '%s'",
                              w->file, i, source);
    replay_traj_row t;
    ARL_TRY(replay_traj_get_id(w->st, traj_id, &t)); /* the trajectory exists in the store */
    /* foreign_keys can only change outside a transaction (a re-score transaction has them
     * off already) */
    const int own = !w->rescore_tx;
    if (own) ARL_TRY(rdb_exec(&w->w, "PRAGMA foreign_keys = OFF"));
    arl_status s = own ? rdb_begin(&w->w) : rrescore_tx_live(w);
    sqlite3_stmt *del = NULL, *ins = NULL;
    if (s == ARL_OK)
        s = rdb_prepare(&w->w, "DELETE FROM rewards WHERE traj_id = ?1 AND source = ?2", &del);
    if (s == ARL_OK)
        s = rdb_prepare(&w->w,
                        "INSERT INTO rewards(traj_id, level, scope_index, component, source, "
                        "value, call_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        &ins);
    if (s == ARL_OK) {
        sqlite3_bind_int64(del, 1, traj_id);
        sqlite3_bind_text(del, 2, source, -1, SQLITE_STATIC);
        int rc = sqlite3_step(del);
        if (rc != SQLITE_DONE) s = rdb_fail(&w->w, rc, "replacing re-scored rewards");
    }
    for (size_t i = 0; s == ARL_OK && i < n; i++) {
        const replay_reward *r = &rows[i];
        sqlite3_reset(ins);
        sqlite3_bind_int64(ins, 1, traj_id);
        sqlite3_bind_text(ins, 2, r->level, -1, SQLITE_STATIC);
        sqlite3_bind_int64(ins, 3, r->scope_index);
        sqlite3_bind_text(ins, 4, r->component, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 5, source, -1, SQLITE_STATIC);
        rdb_bind_real_or_null(ins, 6, r->value);
        rdb_bind_int_or_null(ins, 7, r->call_seq);
        int rc = sqlite3_step(ins);
        if (rc != SQLITE_DONE) s = rdb_fail(&w->w, rc, "writing re-scored rewards");
    }
    sqlite3_finalize(del);
    sqlite3_finalize(ins);
    if (s == ARL_OK && own) s = rdb_commit(&w->w);
    if (s != ARL_OK) rdb_rollback(&w->w);
    if (own) {
        arl_status f = rdb_exec(&w->w, "PRAGMA foreign_keys = ON");
        if (s == ARL_OK) s = f;
    }
    if (s != ARL_OK)
        return arl_error_prefix(s, "replay: re-scored rewards '%s' of %s", source, t.traj_uid);
    return ARL_OK;
}
