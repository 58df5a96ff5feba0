/* replay/records.c: rows that learner and tool files hold besides trajectories (spec section
 * 4.13): learner_records (one per consumed segment and update, written by the learner) and
 * rescores (one per re-scored segment, written by `agentrl replay rescore`).  Each put is one
 * transaction on the writer's own file, or a part of a re-score transaction (the rows of one
 * trajectory, replay_rescore_tx_begin).  What it is not: the computation of these values (the
 * learner's and rollout/rescore's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "replay/internal.h"

/* Encode the per-token arrays back to back into the writer's scratch; p[k], nb[k] point there. */
static arl_status encode_arrays(replay_writer *w, int64_t n, int k, const arl_blob_kind *kinds,
                                const arl_blob_dtype *dts, const void *const *data, uint8_t **p,
                                size_t *nb) {
    size_t total = 0;
    for (int i = 0; i < k; i++) {
        nb[i] = ARL_BLOB_HEADER_SIZE + (size_t)n * arl_blob_dtype_size(dts[i]);
        total += nb[i];
    }
    ARL_TRY(replay_writer_scratch_reserve(w, total));
    uint64_t dims[1] = {(uint64_t)n};
    size_t off = 0, got;
    for (int i = 0; i < k; i++) {
        p[i] = w->scratch + off;
        ARL_TRY(arl_blob_encode(kinds[i], dts[i], 1, dims, data[i], p[i], nb[i], &got));
        off += nb[i];
    }
    return ARL_OK;
}

static arl_status step_in_txn(replay_writer *w, sqlite3_stmt *q, const char *what) {
    int rc = sqlite3_step(q);
    if (rc == SQLITE_DONE) return ARL_OK;
    return rdb_fail(&w->w, rc, what); /* rolls the transaction back */
}

arl_status replay_learner_record_put(replay_writer *w, const replay_learner_record *r) {
    if (w->kind != REPLAY_FILE_LEARNER && w->kind != REPLAY_FILE_TOOL)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: learner records go into a learner (or tool) file, not a %s "
                          "file",
                          w->file, replay_file_kind_name(w->kind));
    if (!r->traj_uid || !*r->traj_uid || !r->levels_json || r->n_tokens <= 0 || !r->old_logprobs ||
        !r->ref_logprobs || !r->is_weights || !r->token_flags || !r->advantages ||
        !isfinite(r->seg_mean_logratio))
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: a learner record needs traj_uid, levels_json, n_tokens > 0, "
                          "the five per-token arrays and a finite seg_mean_logratio",
                          w->file);
    const arl_blob_kind kinds[5] = {ARL_BLOB_OLD_LOGPROBS, ARL_BLOB_REF_LOGPROBS,
                                    ARL_BLOB_IS_WEIGHTS, ARL_BLOB_TOKEN_FLAGS, ARL_BLOB_ADVANTAGES};
    const arl_blob_dtype dts[5] = {ARL_BLOB_F32, ARL_BLOB_F32, ARL_BLOB_F32, ARL_BLOB_U8,
                                   ARL_BLOB_F32};
    const void *data[5] = {r->old_logprobs, r->ref_logprobs, r->is_weights, r->token_flags,
                           r->advantages};
    uint8_t *p[5];
    size_t nb[5];
    ARL_TRY(encode_arrays(w, r->n_tokens, 5, kinds, dts, data, p, nb));
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&w->w,
                        "INSERT OR REPLACE INTO learner_records(run_id, update_n, traj_uid, "
                        "seg_index, version, staleness, seg_mean_logratio, mask_reason, "
                        "levels_json, metrics_json, old_logprobs, ref_logprobs, is_weights, "
                        "token_flags, advantages) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
                        "?10, ?11, ?12, ?13, ?14, ?15)",
                        &q));
    sqlite3_bind_int64(q, 1, r->run_id);
    sqlite3_bind_int64(q, 2, r->update_n);
    sqlite3_bind_text(q, 3, r->traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 4, r->seg_index);
    sqlite3_bind_int64(q, 5, r->version);
    sqlite3_bind_int64(q, 6, r->staleness);
    sqlite3_bind_double(q, 7, r->seg_mean_logratio);
    rdb_bind_text(q, 8, r->mask_reason);
    sqlite3_bind_text(q, 9, r->levels_json, -1, SQLITE_STATIC);
    rdb_bind_text(q, 10, r->metrics_json);
    for (int k = 0; k < 5; k++)
        sqlite3_bind_blob64(q, 11 + k, p[k], nb[k], SQLITE_STATIC);
    arl_status s = rdb_begin(&w->w);
    if (s == ARL_OK) s = step_in_txn(w, q, "writing a learner record");
    sqlite3_finalize(q);
    if (s == ARL_OK) s = rdb_commit(&w->w);
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return arl_error_prefix(s, "replay: learner record of %s segment %d update %lld",
                                r->traj_uid, (int)r->seg_index, (long long)r->update_n);
    }
    return ARL_OK;
}

arl_status replay_rescore_put(replay_writer *w, const replay_rescore_desc *r) {
    if (w->kind != REPLAY_FILE_TOOL)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: re-scores go into a tool file, not a %s file",
                          w->file, replay_file_kind_name(w->kind));
    if (!r->label || !*r->label || !r->traj_uid || !*r->traj_uid || !r->stats_json ||
        r->n_tokens <= 0 || !r->logprobs)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: a re-score needs label, traj_uid, stats_json, n_tokens > 0 "
                          "and the log-probabilities",
                          w->file);
    const arl_blob_kind kind = ARL_BLOB_RESCORE_LOGPROBS;
    const arl_blob_dtype dt = ARL_BLOB_F32;
    const void *data[1] = {r->logprobs};
    uint8_t *p[1];
    size_t nb[1];
    ARL_TRY(encode_arrays(w, r->n_tokens, 1, &kind, &dt, data, p, nb));
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&w->w,
                        "INSERT OR REPLACE INTO rescores(label, traj_uid, seg_index, run_uid, "
                        "version, checkpoint_uri, routing, created_at_ms, stats_json, logprobs) "
                        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                        &q));
    sqlite3_bind_text(q, 1, r->label, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, r->traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 3, r->seg_index);
    rdb_bind_text(q, 4, r->run_uid);
    rdb_bind_int_or_null(q, 5, r->version);
    rdb_bind_text(q, 6, r->checkpoint_uri);
    sqlite3_bind_text(q, 7, r->routing ? r->routing : "replay", -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 8, rnow_ms());
    sqlite3_bind_text(q, 9, r->stats_json, -1, SQLITE_STATIC);
    sqlite3_bind_blob64(q, 10, p[0], nb[0], SQLITE_STATIC);
    arl_status s = w->rescore_tx ? rrescore_tx_live(w) : rdb_begin(&w->w);
    if (s == ARL_OK) s = step_in_txn(w, q, "writing a re-score");
    sqlite3_finalize(q);
    if (s == ARL_OK && !w->rescore_tx) s = rdb_commit(&w->w);
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return arl_error_prefix(s, "replay: re-score '%s' of %s segment %d", r->label, r->traj_uid,
                                (int)r->seg_index);
    }
    return ARL_OK;
}

arl_status rrescore_tx_live(replay_writer *w) {
    if (!sqlite3_get_autocommit(w->w.db)) return ARL_OK;
    return arl_errorf(ARL_ERR_STATE,
                      "replay: %s: the re-score transaction was rolled back by an earlier failure "
                      "(end it with replay_rescore_tx_end)",
                      w->file);
}

arl_status replay_rescore_tx_begin(replay_writer *w) {
    ARL_ASSERT(!w->rescore_tx);
    if (w->kind != REPLAY_FILE_TOOL)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: re-scores go into a tool file, not a %s file",
                          w->file, replay_file_kind_name(w->kind));
    /* foreign_keys can only change outside a transaction (replay_rescore_rewards_put) */
    ARL_TRY(rdb_exec(&w->w, "PRAGMA foreign_keys = OFF"));
    arl_status s = rdb_begin(&w->w);
    if (s != ARL_OK) {
        rdb_exec(&w->w, "PRAGMA foreign_keys = ON");
        return s;
    }
    w->rescore_tx = 1;
    return ARL_OK;
}

arl_status replay_rescore_tx_end(replay_writer *w, arl_status s) {
    ARL_ASSERT(w->rescore_tx);
    w->rescore_tx = 0;
    if (s == ARL_OK) s = rrescore_tx_live(w);
    s = rdb_end(&w->w, s);
    arl_status f = rdb_exec(&w->w, "PRAGMA foreign_keys = ON");
    return s != ARL_OK ? s : f;
}
