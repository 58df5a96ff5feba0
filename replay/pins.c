/* replay/pins.c: catalog rows about whole trajectories and runs that are not the ledger: pins
 * (spec sections 4.5 and 13.8) and the run configuration getter (section 4.2).  What it is not:
 * the retention that honours pins (writer.c, replay_states_gc). */
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

static arl_status pins_catalog(replay_store *st, int write) {
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: pins live in catalog.sqlite, which this store lacks",
                          st->root);
    if (write && st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE, "replay: %s: store opened read-only", st->root);
    return ARL_OK;
}

/* A reason is one line of printable UTF-8 text of at most REPLAY_PIN_REASON_MAX bytes: it is
 * printed by show (a terminal) and list --json, which could not carry invalid UTF-8. */
static arl_status reason_check(const char *reason) {
    size_t n = strlen(reason);
    if (n > REPLAY_PIN_REASON_MAX)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: pin: the reason is %zu bytes, more than %d: shorten it", n,
                          REPLAY_PIN_REASON_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)reason[i] < 0x20 || reason[i] == 0x7f)
            return arl_errorf(ARL_ERR_ARG,
                              "replay: pin: the reason holds a control character (byte 0x%02x at "
                              "offset %zu): give one line of text",
                              (unsigned)(unsigned char)reason[i], i);
    json_t *j = json_stringn(reason, n); /* NULL when not valid UTF-8 */
    if (!j) return arl_errorf(ARL_ERR_ARG, "replay: pin: the reason is not valid UTF-8 text");
    json_decref(j);
    return ARL_OK;
}

arl_status replay_pin(replay_store *st, const char *traj, const char *reason) {
    ARL_TRY(pins_catalog(st, 1));
    if (!traj || !*traj) return arl_errorf(ARL_ERR_ARG, "replay: pin: no trajectory given");
    if (reason) ARL_TRY(reason_check(reason));
    replay_traj_row r;
    ARL_TRY(replay_traj_get(st, traj, &r));
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "INSERT INTO pins(traj_uid, reason, created_at_ms) VALUES (?1, ?2, ?3) "
                        "ON CONFLICT(traj_uid) DO UPDATE SET reason = excluded.reason",
                        &q));
    sqlite3_bind_text(q, 1, r.traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, reason ? reason : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, rnow_ms());
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "pinning a trajectory");
    return ARL_OK;
}

/* traj as given, or the uid of the trajectory it selects (a traj_id) */
static void resolve_uid(replay_store *st, const char *traj, char *uid, size_t cap) {
    replay_traj_row r;
    snprintf(uid, cap, "%s", traj);
    if (replay_traj_get(st, traj, &r) == ARL_OK) snprintf(uid, cap, "%s", r.traj_uid);
    arl_error_clear();
}

arl_status replay_unpin(replay_store *st, const char *traj) {
    ARL_TRY(pins_catalog(st, 1));
    if (!traj || !*traj) return arl_errorf(ARL_ERR_ARG, "replay: unpin: no trajectory given");
    char uid[REPLAY_UID_MAX + 1];
    resolve_uid(st, traj, uid, sizeof uid); /* a trajectory deleted since keeps its pin's uid */
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat, "DELETE FROM pins WHERE traj_uid = ?1", &q));
    sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "unpinning a trajectory");
    if (sqlite3_changes(st->cat.db) == 0)
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: trajectory '%s' is not pinned", st->root,
                          uid);
    return ARL_OK;
}

arl_status replay_pin_get(replay_store *st, const char *traj_uid, int *pinned, char *reason,
                          size_t cap) {
    *pinned = 0;
    if (reason && cap) reason[0] = 0;
    if (!st->cat.db) return ARL_OK; /* bare shard files: nothing is pinned */
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat, "SELECT reason FROM pins WHERE traj_uid = ?1", &q));
    sqlite3_bind_text(q, 1, traj_uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        *pinned = 1;
        if (reason && cap) rdb_col_text(q, 0, reason, cap);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "reading pins");
    return ARL_OK;
}

static char *col_dup(sqlite3_stmt *q, int i) {
    const char *t = (const char *)sqlite3_column_text(q, i);
    return t ? strdup(t) : NULL;
}

arl_status replay_run_get(replay_store *st, const char *run, replay_run_info *out) {
    memset(out, 0, sizeof *out);
    ARL_TRY(pins_catalog(st, 0));
    if (!run || !*run) return arl_errorf(ARL_ERR_ARG, "replay: no run given");
    int numeric = 1;
    for (const char *p = run; *p; p++)
        if (!isdigit((unsigned char)*p)) numeric = 0;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT run_id, run_uid, status, created_at_ms, config_json, "
                        "config_sha256, model_config_json, model_config_sha256, "
                        "tokenizer_sha256, chat_template_sha256, code_version, notes FROM runs "
                        "WHERE run_uid = ?1 OR (?2 AND run_id = ?3) ORDER BY run_uid = ?1 DESC "
                        "LIMIT 1",
                        &q));
    sqlite3_bind_text(q, 1, run, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, numeric);
    sqlite3_bind_int64(q, 3, numeric ? atoll(run) : 0);
    int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc == SQLITE_ROW) {
        out->run_id = sqlite3_column_int64(q, 0);
        rdb_col_text(q, 1, out->run_uid, sizeof out->run_uid);
        rdb_col_text(q, 2, out->status, sizeof out->status);
        out->created_at_ms = sqlite3_column_int64(q, 3);
        out->config_json = col_dup(q, 4);
        rdb_col_text(q, 5, out->config_sha256, sizeof out->config_sha256);
        out->model_config_json = col_dup(q, 6);
        rdb_col_text(q, 7, out->model_config_sha256, sizeof out->model_config_sha256);
        rdb_col_text(q, 8, out->tokenizer_sha256, sizeof out->tokenizer_sha256);
        rdb_col_text(q, 9, out->chat_template_sha256, sizeof out->chat_template_sha256);
        rdb_col_text(q, 10, out->code_version, sizeof out->code_version);
        out->notes = col_dup(q, 11);
        if (!out->config_json || !out->model_config_json ||
            (sqlite3_column_type(q, 11) != SQLITE_NULL && !out->notes))
            s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    } else if (rc == SQLITE_DONE) {
        s = arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no run '%s' in the catalog", st->root, run);
    } else {
        s = rdb_fail(&st->cat, rc, "reading a run");
    }
    sqlite3_finalize(q);
    if (s != ARL_OK) replay_run_info_free(out);
    return s;
}

void replay_run_info_free(replay_run_info *r) {
    if (!r) return;
    free(r->config_json);
    free(r->model_config_json);
    free(r->notes);
    r->config_json = r->model_config_json = r->notes = NULL;
}
