/* replay/ledger.c: the consumption ledger of spec/replay.md section 7.7 in the catalog: plan an
 * update (a deterministic selection of final groups, recorded before the update runs), commit it
 * (the groups become consumed exactly once, with the next policy version, in one transaction),
 * abort it, and find a planned update after a restart.  What it is not: the update itself, or
 * the check of the checkpoint that decides between commit and re-run on restart (the learner's;
 * this module only answers "which update was planned, with which groups"). */
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

static arl_status ledger_catalog(replay_store *st) {
    if (!st->cat.db || st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: the consumption ledger needs the store's catalog.sqlite "
                          "opened read-write",
                          st->root);
    return ARL_OK;
}

/* Append every group_id of q's rows (column 0) to *ids. */
static arl_status collect_ids(rdb *c, sqlite3_stmt *q, int64_t **ids, size_t *n) {
    size_t cap = 0;
    int rc;
    *ids = NULL;
    *n = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            int64_t *p = realloc(*ids, cap * sizeof *p);
            if (!p) {
                free(*ids);
                *ids = NULL;
                *n = 0;
                return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            }
            *ids = p;
        }
        (*ids)[(*n)++] = sqlite3_column_int64(q, 0);
    }
    if (rc != SQLITE_DONE) {
        free(*ids);
        *ids = NULL;
        *n = 0;
        return rdb_fail(c, rc, "reading the ledger");
    }
    return ARL_OK;
}

static arl_status update_status(rdb *c, int64_t run_id, int64_t update_n, char *buf, size_t cap,
                                int *found) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(c, "SELECT status FROM updates WHERE run_id = ?1 AND update_n = ?2", &q));
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int64(q, 2, update_n);
    int rc = sqlite3_step(q);
    *found = rc == SQLITE_ROW;
    buf[0] = 0;
    if (rc == SQLITE_ROW) rdb_col_text(q, 0, buf, cap);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(c, rc, "reading an update");
    return ARL_OK;
}

arl_status replay_update_groups(replay_store *st, int64_t run_id, int64_t update_n,
                                int64_t **group_ids, size_t *n) {
    *group_ids = NULL;
    *n = 0;
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_STATE, "replay: %s: the store has no catalog", st->root);
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT group_id FROM update_groups WHERE run_id = ?1 AND update_n = ?2 "
                        "ORDER BY group_id",
                        &q));
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int64(q, 2, update_n);
    arl_status s = collect_ids(&st->cat, q, group_ids, n);
    sqlite3_finalize(q);
    return s;
}

arl_status replay_update_pending(replay_store *st, int64_t run_id, int64_t *update_n) {
    *update_n = -1;
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_STATE, "replay: %s: the store has no catalog", st->root);
    int found = 0;
    int64_t v = -1;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT max(update_n) FROM updates WHERE run_id = ?1 AND status = "
                        "'planned'",
                        &q));
    sqlite3_bind_int64(q, 1, run_id);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) {
        v = sqlite3_column_int64(q, 0);
        found = 1;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW) return rdb_fail(&st->cat, rc, "reading planned updates");
    if (found) *update_n = v;
    return ARL_OK;
}

arl_status replay_update_plan(replay_store *st, int64_t run_id, int64_t update_n, const char *kind,
                              int32_t max_groups, int64_t **group_ids, size_t *n) {
    *group_ids = NULL;
    *n = 0;
    ARL_TRY(ledger_catalog(st));
    if (update_n < 0 || max_groups < 1)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: planning update %lld of run %lld: update_n >= 0 and "
                          "max_groups >= 1 needed (got %d)",
                          (long long)update_n, (long long)run_id, (int)max_groups);
    rdb *c = &st->cat;
    ARL_TRY(rdb_begin(c));
    char status[16];
    int found = 0;
    arl_status s = update_status(c, run_id, update_n, status, sizeof status, &found);
    if (s == ARL_OK && found && !strcmp(status, "committed"))
        s = arl_errorf(ARL_ERR_STATE,
                       "replay: catalog: update %lld of run %lld is already committed: plan "
                       "update %lld",
                       (long long)update_n, (long long)run_id, (long long)update_n + 1);
    if (s == ARL_OK && found && !strcmp(status, "aborted")) {
        /* an aborted update is planned afresh under its number (it still produces n + 1) */
        char del[256];
        snprintf(del, sizeof del,
                 "DELETE FROM update_groups WHERE run_id = %lld AND update_n = %lld; DELETE FROM "
                 "updates WHERE run_id = %lld AND update_n = %lld;",
                 (long long)run_id, (long long)update_n, (long long)run_id, (long long)update_n);
        s = rdb_exec(c, del);
        found = 0;
    }
    if (s == ARL_OK && found) {
        /* re-plan after a crash: the same groups (section 7.7, restart) */
        rdb_rollback(c);
        return replay_update_groups(st, run_id, update_n, group_ids, n);
    }
    /* one planned update at a time: another one must be committed or aborted first */
    int64_t other = -1;
    sqlite3_stmt *q = NULL;
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "SELECT update_n FROM updates WHERE run_id = ?1 AND status = 'planned' "
                        "LIMIT 1",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        if (sqlite3_step(q) == SQLITE_ROW) other = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        q = NULL;
        if (other >= 0)
            s = arl_errorf(ARL_ERR_STATE,
                           "replay: catalog: update %lld of run %lld is planned and not committed: "
                           "commit or abort it before planning update %lld",
                           (long long)other, (long long)run_id, (long long)update_n);
    }
    if (s == ARL_OK) {
        int64_t runs = 0;
        s = rdb_prepare(c, "SELECT count(*) FROM runs WHERE run_id = ?1", &q);
        if (s == ARL_OK) {
            sqlite3_bind_int64(q, 1, run_id);
            if (sqlite3_step(q) == SQLITE_ROW) runs = sqlite3_column_int64(q, 0);
            sqlite3_finalize(q);
            q = NULL;
            if (!runs)
                s = arl_errorf(ARL_ERR_NOT_FOUND, "replay: catalog: no run with id %lld",
                               (long long)run_id);
        }
    }
    /* the selection: oldest final groups first, ties by group_id (deterministic) */
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "SELECT group_id FROM task_groups WHERE run_id = ?1 AND status = 'final' "
                        "AND kind = ?3 ORDER BY admitted_at_ms, group_id LIMIT ?2",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int(q, 2, max_groups);
        sqlite3_bind_text(q, 3, kind ? kind : "train", -1, SQLITE_STATIC);
        s = collect_ids(c, q, group_ids, n);
        sqlite3_finalize(q);
        q = NULL;
    }
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "INSERT INTO updates(run_id, update_n, status, planned_at_ms, "
                        "n_groups) VALUES (?1, ?2, 'planned', ?3, ?4)",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n);
        sqlite3_bind_int64(q, 3, rnow_ms());
        sqlite3_bind_int64(q, 4, (int64_t)*n);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "planning an update");
        sqlite3_finalize(q);
        q = NULL;
    }
    if (s == ARL_OK)
        s = rdb_prepare(
            c, "INSERT INTO update_groups(run_id, update_n, group_id) VALUES (?1, ?2, ?3)", &q);
    for (size_t i = 0; s == ARL_OK && i < *n; i++) {
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n);
        sqlite3_bind_int64(q, 3, (*group_ids)[i]);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "recording the groups of an update");
    }
    sqlite3_finalize(q);
    if (s == ARL_OK) s = rdb_commit(c);
    if (s != ARL_OK) {
        rdb_rollback(c);
        free(*group_ids);
        *group_ids = NULL;
        *n = 0;
    }
    return s;
}

arl_status replay_update_commit(replay_store *st, int64_t run_id, int64_t update_n,
                                int64_t n_action_tokens, const replay_version_desc *next) {
    ARL_TRY(ledger_catalog(st));
    rdb *c = &st->cat;
    ARL_TRY(rdb_begin(c));
    char status[16];
    int found = 0;
    arl_status s = update_status(c, run_id, update_n, status, sizeof status, &found);
    if (s == ARL_OK && !found)
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "replay: catalog: update %lld of run %lld was not planned",
                       (long long)update_n, (long long)run_id);
    if (s == ARL_OK && !strcmp(status, "committed")) {
        /* idempotent: a resumed run that re-does a committed update commits nothing new */
        rdb_rollback(c);
        return ARL_OK;
    }
    if (s == ARL_OK && strcmp(status, "planned"))
        s = arl_errorf(ARL_ERR_STATE, "replay: catalog: update %lld of run %lld is %s, not planned",
                       (long long)update_n, (long long)run_id, status);
    sqlite3_stmt *q = NULL;
    int64_t n_groups = 0;
    if (s == ARL_OK)
        s = rdb_prepare(c, "SELECT count(*) FROM update_groups WHERE run_id = ?1 AND update_n = ?2",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n);
        if (sqlite3_step(q) == SQLITE_ROW) n_groups = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        q = NULL;
    }
    /* every group consumed once: the guard makes a second consumption change no row */
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "UPDATE task_groups SET status = 'consumed', consumed_update = ?2 WHERE "
                        "consumed_update IS NULL AND status = 'final' AND group_id IN (SELECT "
                        "group_id FROM update_groups WHERE run_id = ?1 AND update_n = ?2)",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "consuming the groups of an update");
        sqlite3_finalize(q);
        q = NULL;
        if (s == ARL_OK && sqlite3_changes(c->db) != n_groups)
            s = arl_errorf(ARL_ERR_STATE,
                           "replay: catalog: update %lld of run %lld: %d of its %lld groups are "
                           "final and unconsumed; nothing was committed (run 'agentrl replay "
                           "verify')",
                           (long long)update_n, (long long)run_id, sqlite3_changes(c->db),
                           (long long)n_groups);
    }
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "UPDATE updates SET status = 'committed', committed_at_ms = ?3, "
                        "n_action_tokens = ?4 WHERE run_id = ?1 AND update_n = ?2",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n);
        sqlite3_bind_int64(q, 3, rnow_ms());
        rdb_bind_int_or_null(q, 4, n_action_tokens);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "committing an update");
        sqlite3_finalize(q);
        q = NULL;
    }
    /* the policy version the update produced: n + 1 */
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "INSERT INTO policy_versions(run_id, version, created_at_ms, update_n, "
                        "checkpoint_uri, weights_sha256, kl_coef, metrics_json) VALUES "
                        "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, run_id);
        sqlite3_bind_int64(q, 2, update_n + 1);
        sqlite3_bind_int64(q, 3, rnow_ms());
        sqlite3_bind_int64(q, 4, update_n);
        if (next) {
            rdb_bind_text(q, 5, next->checkpoint_uri);
            rdb_bind_text(q, 6, next->weights_sha256);
            rdb_bind_real_or_null(q, 7, next->kl_coef);
            rdb_bind_text(q, 8, next->metrics_json);
        }
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) {
            if ((rc & 0xFF) == SQLITE_CONSTRAINT)
                s = arl_errorf(ARL_ERR_STATE,
                               "replay: catalog: committing update %lld of run %lld: policy "
                               "version %lld already exists (%s)",
                               (long long)update_n, (long long)run_id, (long long)update_n + 1,
                               sqlite3_errmsg(c->db));
            else
                s = rdb_fail(c, rc, "recording the new policy version");
        }
        sqlite3_finalize(q);
        q = NULL;
    }
    return rdb_end(c, s);
}

arl_status replay_update_abort(replay_store *st, int64_t run_id, int64_t update_n) {
    ARL_TRY(ledger_catalog(st));
    rdb *c = &st->cat;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(c,
                        "UPDATE updates SET status = 'aborted' WHERE run_id = ?1 AND update_n = ?2 "
                        "AND status = 'planned'",
                        &q));
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int64(q, 2, update_n);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(c, rc, "aborting an update");
    if (sqlite3_changes(c->db) != 1)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: catalog: update %lld of run %lld is not a planned update",
                          (long long)update_n, (long long)run_id);
    return ARL_OK;
}
