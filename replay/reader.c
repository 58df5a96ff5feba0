/* replay/reader.c: reading a store as one (spec section 11): trajectories by id or uid,
 * iteration over committed segments, segment and state loads with blob checks, fork-prefix
 * resolution and boundary-state assembly.  Read-only connections, short read transactions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

void rtraj_fill(sqlite3_stmt *q, int32_t shard_id, replay_traj_row *r) {
    char st[16];
    memset(r, 0, sizeof *r);
    r->traj_id = sqlite3_column_int64(q, 0);
    r->shard_id = shard_id;
    rdb_col_text(q, 1, r->traj_uid, sizeof r->traj_uid);
    r->run_id = sqlite3_column_int64(q, 2);
    r->group_id = sqlite3_column_int64(q, 3);
    r->slot = sqlite3_column_int(q, 4);
    r->attempt = sqlite3_column_int(q, 5);
    r->task_id = sqlite3_column_int64(q, 6);
    r->env_id = sqlite3_column_int64(q, 7);
    rdb_col_text(q, 8, r->session_id, sizeof r->session_id);
    rdb_col_text(q, 9, st, sizeof st);
    r->status = (replay_status)replay_status_parse(st);
    rdb_col_text(q, 10, r->end_cause, sizeof r->end_cause);
    rdb_col_text(q, 11, r->error_code, sizeof r->error_code);
    rdb_col_text(q, 12, r->error_attribution, sizeof r->error_attribution);
    rdb_col_text(q, 13, r->parent_traj_uid, sizeof r->parent_traj_uid);
    r->fork_seg_index = (int32_t)rdb_col_int_or(q, 14, -1);
    r->resume_count = sqlite3_column_int(q, 15);
    r->n_segments = sqlite3_column_int(q, 16);
    r->n_turns = sqlite3_column_int(q, 17);
    r->n_tokens = sqlite3_column_int64(q, 18);
    r->n_action_tokens = sqlite3_column_int64(q, 19);
    r->min_version = rdb_col_int_or(q, 20, -1);
    r->max_version = rdb_col_int_or(q, 21, -1);
    r->outcome_reward =
        sqlite3_column_type(q, 22) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 22);
    r->created_at_ms = sqlite3_column_int64(q, 23);
    r->updated_at_ms = sqlite3_column_int64(q, 24);
    r->finished_at_ms = rdb_col_int_or(q, 25, -1);
}

/* Query one trajectory row in shard sh by id (by_uid 0) or uid; 1 found, 0 not, <0 error. */
static int traj_query(replay_store *st, rshard *sh, int64_t id, const char *uid,
                      replay_traj_row *out, arl_status *err) {
    rdb *d;
    *err = rstore_shard_db(st, sh, &d);
    if (*err != ARL_OK) return -1;
    if (sh->kind == REPLAY_FILE_LEARNER) return 0;
    sqlite3_stmt *q;
    *err = rdb_prepare(d,
                       uid ? "SELECT " RTRAJ_COLS " FROM trajectories WHERE traj_uid = ?1"
                           : "SELECT " RTRAJ_COLS " FROM trajectories WHERE traj_id = ?1",
                       &q);
    if (*err != ARL_OK) return -1;
    if (uid)
        sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(q, 1, id);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) rtraj_fill(q, sh->shard_id, out);
    sqlite3_finalize(q);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    *err = rdb_fail(d, rc, "reading a trajectory");
    return -1;
}

arl_status replay_traj_get_id(replay_store *st, int64_t traj_id, replay_traj_row *out) {
    int32_t shard = (int32_t)(traj_id >> REPLAY_TRAJ_ID_SHIFT);
    rshard *sh = rstore_shard(st, shard);
    if (!sh && st->single_file) sh = &st->shards[0];
    arl_status err = ARL_OK;
    if (sh) {
        int r = traj_query(st, sh, traj_id, NULL, out, &err);
        if (r > 0) return ARL_OK;
        if (r < 0) return err;
    }
    return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no trajectory with id %lld (shard %d)",
                      st->root, (long long)traj_id, (int)shard);
}

arl_status replay_traj_get(replay_store *st, const char *selector, replay_traj_row *out) {
    if (!selector || !*selector)
        return arl_errorf(ARL_ERR_ARG, "replay: empty trajectory selector");
    int digits = 1;
    for (const char *p = selector; *p; p++)
        if (*p < '0' || *p > '9') digits = 0;
    if (digits && strlen(selector) < 19) {
        arl_status s = replay_traj_get_id(st, atoll(selector), out);
        if (s != ARL_ERR_NOT_FOUND) return s;
    }
    /* catalog mirror first, then every shard */
    if (st->cat.db) {
        sqlite3_stmt *q;
        if (sqlite3_prepare_v2(st->cat.db, "SELECT traj_id FROM group_members WHERE traj_uid = ?1",
                               -1, &q, NULL) == SQLITE_OK) {
            sqlite3_bind_text(q, 1, selector, -1, SQLITE_STATIC);
            int64_t id = -1;
            if (sqlite3_step(q) == SQLITE_ROW) id = sqlite3_column_int64(q, 0);
            sqlite3_finalize(q);
            if (id >= 0 && replay_traj_get_id(st, id, out) == ARL_OK &&
                !strcmp(out->traj_uid, selector))
                return ARL_OK;
        }
    }
    ARL_TRY(replay_store_refresh(st));
    for (size_t i = 0; i < st->n_shards; i++) {
        arl_status err;
        int r = traj_query(st, &st->shards[i], 0, selector, out, &err);
        if (r > 0) return ARL_OK;
        if (r < 0) return err;
    }
    /* a uid given in part (its slot without its group, a group without the run): name the
     * trajectories whose uids hold it */
    char near[1024] = "";
    if (st->cat.db) {
        sqlite3_stmt *q;
        if (sqlite3_prepare_v2(st->cat.db,
                               "SELECT traj_uid, count(*) OVER () FROM group_members "
                               "WHERE traj_uid IS NOT NULL AND instr(traj_uid, ?1) > 0 "
                               "ORDER BY traj_uid LIMIT 4",
                               -1, &q, NULL) == SQLITE_OK) {
            sqlite3_bind_text(q, 1, selector, -1, SQLITE_STATIC);
            size_t at = 0;
            int64_t total = 0, shown = 0;
            while (sqlite3_step(q) == SQLITE_ROW && at < sizeof near - 300) {
                const char *u = (const char *)sqlite3_column_text(q, 0);
                total = sqlite3_column_int64(q, 1);
                at += (size_t)snprintf(near + at, sizeof near - at, "%s%.250s",
                                       shown++ ? ", " : "; did you mean ", u ? u : "?");
            }
            if (shown && total > shown)
                at += (size_t)snprintf(near + at, sizeof near - at, " (%lld of %lld)",
                                       (long long)shown, (long long)total);
            if (shown) snprintf(near + at, sizeof near - at, "?");
            sqlite3_finalize(q);
        }
    }
    return arl_errorf(ARL_ERR_NOT_FOUND,
                      "replay: %s: no trajectory '%s'%s (a trajectory is named by its whole uid "
                      "RUN/GROUP/rSLOT or its traj_id: see 'agentrl replay list')",
                      st->root, selector, near);
}

/* ---- segment metadata ---- */

#define SEG_COLS                                                                                   \
    "s.traj_id, s.seg_index, t.traj_uid, t.status, t.run_id, t.group_id, t.slot, s.start_kind, "   \
    "s.end_cause, s.first_step, s.last_step, s.tok_start, s.ctx_start, s.n_tokens, "               \
    "s.n_action_tokens, s.min_version, s.max_version, s.end_state_id, s.latent_state_id, "         \
    "s.committed_at_ms"
#define SEG_NCOLS 20

static void fill_seg(sqlite3_stmt *q, int32_t shard_id, replay_seg_ref *r) {
    char st[16];
    memset(r, 0, sizeof *r);
    r->traj_id = sqlite3_column_int64(q, 0);
    r->seg_index = sqlite3_column_int(q, 1);
    r->shard_id = shard_id;
    rdb_col_text(q, 2, r->traj_uid, sizeof r->traj_uid);
    rdb_col_text(q, 3, st, sizeof st);
    r->traj_status = (replay_status)replay_status_parse(st);
    r->run_id = sqlite3_column_int64(q, 4);
    r->group_id = sqlite3_column_int64(q, 5);
    r->slot = sqlite3_column_int(q, 6);
    rdb_col_text(q, 7, r->start_kind, sizeof r->start_kind);
    rdb_col_text(q, 8, r->end_cause, sizeof r->end_cause);
    r->first_step = sqlite3_column_int(q, 9);
    r->last_step = sqlite3_column_int(q, 10);
    r->tok_start = sqlite3_column_int64(q, 11);
    r->ctx_start = sqlite3_column_int64(q, 12);
    r->n_tokens = sqlite3_column_int64(q, 13);
    r->n_action_tokens = sqlite3_column_int64(q, 14);
    r->min_version = sqlite3_column_int64(q, 15);
    r->max_version = sqlite3_column_int64(q, 16);
    r->end_state_id = rdb_col_int_or(q, 17, -1);
    r->latent_state_id = rdb_col_int_or(q, 18, -1);
    r->committed_at_ms = sqlite3_column_int64(q, 19);
}

#define ITER_BATCH 256

struct replay_seg_iter {
    replay_store *st;
    replay_seg_filter f;
    char *sql;
    size_t shard;      /* index into st->shards */
    sqlite3_stmt *q;   /* for the current shard */
    int64_t last_traj; /* keyset position */
    int32_t last_seg;
    replay_seg_ref *buf; /* (ITER_BATCH) */
    size_t n, pos;
    int shard_done;
};

arl_status replay_seg_iter_open(replay_store *st, const replay_seg_filter *f,
                                replay_seg_iter **out) {
    *out = NULL;
    replay_seg_iter *it = calloc(1, sizeof *it);
    if (!it) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    it->st = st;
    if (f)
        it->f = *f;
    else {
        it->f.version_lo = it->f.version_hi = -1;
    }
    unsigned mask = it->f.status_mask ? it->f.status_mask : REPLAY_STATUS_TRAINABLE;
    char where[512] = "";
    size_t o = 0;
    o += (size_t)snprintf(where + o, sizeof where - o, " AND t.status IN (");
    int first = 1;
    for (int s = 0; s <= REPLAY_MASKED; s++)
        if (mask & REPLAY_STATUS_BIT(s)) {
            o += (size_t)snprintf(where + o, sizeof where - o, "%s'%s'", first ? "" : ",",
                                  replay_status_name(s));
            first = 0;
        }
    o += (size_t)snprintf(where + o, sizeof where - o, ")");
    if (it->f.run_id > 0) o += (size_t)snprintf(where + o, sizeof where - o, " AND t.run_id = ?3");
    if (it->f.group_id > 0)
        o += (size_t)snprintf(where + o, sizeof where - o, " AND t.group_id = ?4");
    if (it->f.version_lo >= 0)
        o += (size_t)snprintf(where + o, sizeof where - o, " AND s.min_version >= ?5");
    if (it->f.version_hi >= 0)
        o += (size_t)snprintf(where + o, sizeof where - o, " AND s.min_version <= ?6");
    size_t n = strlen(where) + 512;
    it->sql = malloc(n);
    it->buf = malloc(ITER_BATCH * sizeof *it->buf);
    if (!it->sql || !it->buf) {
        replay_seg_iter_close(it);
        return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    }
    snprintf(it->sql, n,
             "SELECT " SEG_COLS " FROM segments s JOIN trajectories t ON t.traj_id = s.traj_id "
             "WHERE (s.traj_id, s.seg_index) > (?1, ?2)%s ORDER BY s.traj_id, s.seg_index LIMIT %d",
             where, ITER_BATCH);
    arl_status s = replay_store_refresh(st);
    if (s != ARL_OK) {
        replay_seg_iter_close(it);
        return s;
    }
    it->last_traj = -1;
    it->last_seg = -1;
    *out = it;
    return ARL_OK;
}

static arl_status iter_fill(replay_seg_iter *it) {
    replay_store *st = it->st;
    it->n = it->pos = 0;
    while (it->shard < st->n_shards) {
        rshard *sh = &st->shards[it->shard];
        if (sh->kind == REPLAY_FILE_LEARNER) {
            it->shard++;
            continue;
        }
        rdb *d;
        ARL_TRY(rstore_shard_db(st, sh, &d));
        if (!it->q) ARL_TRY(rstore_prepare(st, d, it->sql, &it->q));
        sqlite3_stmt *q = it->q;
        sqlite3_bind_int64(q, 1, it->last_traj);
        sqlite3_bind_int(q, 2, it->last_seg);
        if (it->f.run_id > 0) sqlite3_bind_int64(q, 3, it->f.run_id);
        if (it->f.group_id > 0) sqlite3_bind_int64(q, 4, it->f.group_id);
        if (it->f.version_lo >= 0) sqlite3_bind_int64(q, 5, it->f.version_lo);
        if (it->f.version_hi >= 0) sqlite3_bind_int64(q, 6, it->f.version_hi);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW)
            fill_seg(q, sh->shard_id, &it->buf[it->n++]);
        sqlite3_reset(q); /* ends the read transaction */
        if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading segments");
        if (it->n) {
            it->last_traj = it->buf[it->n - 1].traj_id;
            it->last_seg = it->buf[it->n - 1].seg_index;
            if (it->n < ITER_BATCH) it->shard_done = 1;
            return ARL_OK;
        }
        /* next shard */
        sqlite3_finalize(it->q);
        it->q = NULL;
        it->shard++;
        it->last_traj = -1;
        it->last_seg = -1;
        it->shard_done = 0;
    }
    return ARL_OK;
}

arl_status replay_seg_iter_next(replay_seg_iter *it, replay_seg_ref *ref, int *done) {
    if (it->pos >= it->n) {
        if (it->shard_done) { /* the last batch was short: move to the next shard */
            sqlite3_finalize(it->q);
            it->q = NULL;
            it->shard++;
            it->last_traj = -1;
            it->last_seg = -1;
            it->shard_done = 0;
        }
        ARL_TRY(iter_fill(it));
    }
    if (it->pos >= it->n) {
        *done = 1;
        return ARL_OK;
    }
    *ref = it->buf[it->pos++];
    *done = 0;
    return ARL_OK;
}

void replay_seg_iter_close(replay_seg_iter *it) {
    if (!it) return;
    sqlite3_finalize(it->q);
    free(it->sql);
    free(it->buf);
    free(it);
}

/* ---- segment load ---- */

enum { RD_SEG_META, RD_SEG_FULL, RD_ROUTES };

static arl_status shard_stmt(replay_store *st, rshard *sh, int which, const char *sql,
                             sqlite3_stmt **q) {
    rdb *d;
    ARL_TRY(rstore_shard_db(st, sh, &d));
    if (!sh->stmt[which]) ARL_TRY(rstore_prepare(st, d, sql, &sh->stmt[which]));
    *q = sh->stmt[which];
    return ARL_OK;
}

static arl_status grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return ARL_OK;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c);
    if (!n) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory (%zu bytes)", c);
    *p = n;
    *cap = c;
    return ARL_OK;
}

static arl_status seg_bufs(replay_seg_data *o, size_t n) {
    if (n <= o->cap_tok_) return ARL_OK;
    size_t c = o->cap_tok_ ? o->cap_tok_ : 1024;
    while (c < n)
        c *= 2;
    uint32_t *t = realloc(o->tokens, c * 4);
    if (t) o->tokens = t;
    float *l = t ? realloc(o->logprobs, c * 4) : NULL;
    if (l) o->logprobs = l;
    uint8_t *m = l ? realloc(o->loss_mask, c) : NULL;
    if (m) o->loss_mask = m;
    uint32_t *v = m ? realloc(o->versions, c * 4) : NULL;
    if (v) o->versions = v;
    if (!v) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory (%zu-token segment)", n);
    o->cap_tok_ = c;
    return ARL_OK;
}

static arl_status blob_col(rshard *sh, sqlite3_stmt *q, int col, const char *colname,
                           const replay_seg_ref *r, const arl_blob_expect *ex, void *dst,
                           size_t cap) {
    const void *b = sqlite3_column_blob(q, col);
    size_t len = (size_t)sqlite3_column_bytes(q, col);
    arl_blob_header h;
    arl_status s = arl_blob_check_copy(b, len, ex, &h, dst, cap);
    if (s != ARL_OK)
        return arl_error_prefix(ARL_ERR_CORRUPT,
                                "replay: %s: trajectory %s (%lld) segment %d column %s (mask it "
                                "STORE_CORRUPT; run 'agentrl replay verify')",
                                sh->file, r->traj_uid, (long long)r->traj_id, (int)r->seg_index,
                                colname);
    return ARL_OK;
}

arl_status replay_segment_load(replay_store *st, int64_t traj_id, int32_t seg_index, unsigned what,
                               replay_seg_data *out) {
    int32_t shard = (int32_t)(traj_id >> REPLAY_TRAJ_ID_SHIFT);
    rshard *sh = rstore_shard(st, shard);
    if (!sh && st->single_file) sh = &st->shards[0];
    if (!sh)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "replay: %s: shard %d of trajectory %lld is not in the store", st->root,
                          (int)shard, (long long)traj_id);
    int full = !!(what & REPLAY_LOAD_TOKENS);
    sqlite3_stmt *q;
    ARL_TRY(shard_stmt(st, sh, full ? RD_SEG_FULL : RD_SEG_META,
                       full ? "SELECT " SEG_COLS ", s.routes_layout, s.tokens, s.logprobs, "
                              "s.loss_mask, s.versions FROM segments s JOIN trajectories t ON "
                              "t.traj_id = s.traj_id WHERE s.traj_id = ?1 AND s.seg_index = ?2"
                            : "SELECT " SEG_COLS
                              ", s.routes_layout FROM segments s JOIN trajectories t "
                              "ON t.traj_id = s.traj_id WHERE s.traj_id = ?1 AND s.seg_index = ?2",
                       &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int(q, 2, seg_index);
    int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc != SQLITE_ROW) {
        sqlite3_reset(q);
        if (rc == SQLITE_DONE)
            return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no segment %d of trajectory %lld",
                              sh->file, (int)seg_index, (long long)traj_id);
        return rdb_fail(&sh->db, rc, "reading a segment");
    }
    fill_seg(q, sh->shard_id, &out->ref);
    rdb_col_text(q, SEG_NCOLS, out->routes_layout, sizeof out->routes_layout);
    out->n_moe_layers = 0;
    if (full) {
        const int64_t n = out->ref.n_tokens;
        s = seg_bufs(out, (size_t)n);
        arl_blob_expect ex = {.dims_mask = 1, .dims = {(uint64_t)n}};
        static const char *const names[4] = {"tokens", "logprobs", "loss_mask", "versions"};
        static const arl_blob_kind kinds[4] = {ARL_BLOB_TOKENS, ARL_BLOB_LOGPROBS,
                                               ARL_BLOB_LOSS_MASK, ARL_BLOB_VERSIONS};
        void *dst[4] = {out->tokens, out->logprobs, out->loss_mask, out->versions};
        const size_t es[4] = {4, 4, 1, 4};
        for (int k = 0; k < 4 && s == ARL_OK; k++) {
            ex.kind = kinds[k];
            s = blob_col(sh, q, SEG_NCOLS + 1 + k, names[k], &out->ref, &ex, dst[k],
                         (size_t)n * es[k]);
        }
    }
    sqlite3_reset(q);
    if (s != ARL_OK || !(what & REPLAY_LOAD_ROUTES)) return s;
    ARL_TRY(shard_stmt(st, sh, RD_ROUTES,
                       "SELECT moe_layer, data FROM segment_routes WHERE traj_id = ?1 AND "
                       "seg_index = ?2 ORDER BY moe_layer",
                       &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int(q, 2, seg_index);
    int32_t l = 0;
    size_t lay = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const void *b = sqlite3_column_blob(q, 1);
        size_t len = (size_t)sqlite3_column_bytes(q, 1);
        arl_blob_header h;
        arl_blob_expect ex = {
            .kind = ARL_BLOB_ROUTES, .dims_mask = 1, .dims = {(uint64_t)out->ref.n_tokens}};
        if (l > 0) {
            ex.dtype = out->route_dtype;
            ex.dims_mask = 3;
            ex.dims[1] = (uint64_t)out->route_k;
        }
        if (sqlite3_column_int(q, 0) != l) {
            s = arl_errorf(ARL_ERR_CORRUPT,
                           "replay: %s: trajectory %lld segment %d: routes of MoE "
                           "layer %d missing",
                           sh->file, (long long)traj_id, (int)seg_index, (int)l);
            break;
        }
        /* the header first (its shape sizes the buffer), then check and copy in one pass */
        if ((s = arl_blob_parse(b, len, &h, NULL)) == ARL_OK && l == 0 && h.ndim == 2) {
            out->route_dtype = h.dtype;
            out->route_k = (int32_t)h.dims[1];
            lay = (size_t)arl_blob_tensor_nbytes(&h); /* codec 1: not the stored size */
        }
        if (s == ARL_OK) s = grow(&out->routes, &out->cap_routes_, lay * (size_t)(l + 1));
        if (s == ARL_OK)
            s = arl_blob_check_copy(b, len, &ex, &h, (uint8_t *)out->routes + lay * (size_t)l, lay);
        if (s != ARL_OK) {
            arl_error_prefix(ARL_ERR_CORRUPT,
                             "replay: %s: trajectory %lld segment %d routes layer %d", sh->file,
                             (long long)traj_id, (int)seg_index, (int)l);
            s = ARL_ERR_CORRUPT;
            break;
        }
        l++;
    }
    sqlite3_reset(q);
    if (s != ARL_OK) return s;
    if (rc != SQLITE_DONE) return rdb_fail(&sh->db, rc, "reading routes");
    out->n_moe_layers = l;
    return ARL_OK;
}

void replay_seg_data_free(replay_seg_data *d) {
    if (!d) return;
    free(d->tokens);
    free(d->logprobs);
    free(d->loss_mask);
    free(d->versions);
    free(d->routes);
    memset(d, 0, sizeof *d);
}

/* ---- fork prefixes ---- */

static arl_status own_segments(replay_store *st, const replay_traj_row *t, replay_seg_ref **refs,
                               size_t *n, size_t *cap) {
    rshard *sh = rstore_shard(st, t->shard_id);
    if (!sh && st->single_file) sh = &st->shards[0];
    if (!sh) return arl_errorf(ARL_ERR_NOT_FOUND, "replay: shard %d not found", (int)t->shard_id);
    rdb *d;
    ARL_TRY(rstore_shard_db(st, sh, &d));
    sqlite3_stmt *q;
    ARL_TRY(rstore_prepare(st, d,
                           "SELECT " SEG_COLS " FROM segments s JOIN trajectories t ON t.traj_id = "
                           "s.traj_id WHERE s.traj_id = ?1 ORDER BY s.seg_index",
                           &q));
    sqlite3_bind_int64(q, 1, t->traj_id);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 16;
            replay_seg_ref *p = realloc(*refs, *cap * sizeof *p);
            if (!p) {
                sqlite3_finalize(q);
                return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            }
            *refs = p;
        }
        fill_seg(q, sh->shard_id, &(*refs)[(*n)++]);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading segments");
    return ARL_OK;
}

static arl_status chain(replay_store *st, const replay_traj_row *t, int depth,
                        replay_seg_ref **refs, size_t *n, size_t *cap) {
    if (depth > 64)
        return arl_errorf(ARL_ERR_CORRUPT, "replay: fork chain of %s is deeper than 64 (a cycle?)",
                          t->traj_uid);
    if (t->parent_traj_uid[0] && t->fork_seg_index >= 0) {
        replay_traj_row p;
        ARL_TRY(replay_traj_get(st, t->parent_traj_uid, &p));
        ARL_TRY(chain(st, &p, depth + 1, refs, n, cap));
        if (*n < (size_t)t->fork_seg_index + 1)
            return arl_errorf(ARL_ERR_CORRUPT,
                              "replay: fork %s starts after segment %d of %s, which "
                              "has %zu",
                              t->traj_uid, (int)t->fork_seg_index, p.traj_uid, *n);
        *n = (size_t)t->fork_seg_index + 1; /* keep the prefix 0..s */
    }
    return own_segments(st, t, refs, n, cap);
}

arl_status replay_traj_segments(replay_store *st, int64_t traj_id, replay_seg_ref **refs,
                                size_t *n) {
    replay_traj_row t;
    *refs = NULL;
    *n = 0;
    ARL_TRY(replay_traj_get_id(st, traj_id, &t));
    size_t cap = 0;
    arl_status s = chain(st, &t, 0, refs, n, &cap);
    if (s != ARL_OK) {
        free(*refs);
        *refs = NULL;
        *n = 0;
    }
    return s;
}

/* ---- states ---- */

void replay_state_data_free(replay_state_data *d) {
    if (!d) return;
    free(d->chunks);
    free(d->buf_);
    memset(d, 0, sizeof *d);
}

arl_status replay_state_load(replay_store *st, int32_t shard_id, int64_t state_id,
                             replay_state_data *out) {
    rshard *sh = rstore_shard(st, shard_id);
    if (!sh && st->single_file) sh = &st->shards[0];
    if (!sh) return arl_errorf(ARL_ERR_NOT_FOUND, "replay: shard %d not found", (int)shard_id);
    rdb *d;
    arl_status s = rstore_shard_states(st, sh, &d);
    if (s == ARL_ERR_NOT_FOUND)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "replay: %s: no states file: state %lld is a cache miss", sh->file,
                          (long long)state_id);
    ARL_TRY(s);
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(d,
                        "SELECT traj_uid, seg_index, kind, producer, pass_uid, version_min, "
                        "version_max, numerics, routing, model_config_sha256, ctx_start, n_tokens, "
                        "n_bytes, status FROM states WHERE state_id = ?1",
                        &q));
    sqlite3_bind_int64(q, 1, state_id);
    /* one read transaction for the row and its chunks */
    sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        out->state_id = state_id;
        out->shard_id = sh->shard_id;
        rdb_col_text(q, 0, out->traj_uid, sizeof out->traj_uid);
        out->seg_index = sqlite3_column_int(q, 1);
        rdb_col_text(q, 2, out->kind, sizeof out->kind);
        rdb_col_text(q, 3, out->producer, sizeof out->producer);
        rdb_col_text(q, 4, out->pass_uid, sizeof out->pass_uid);
        out->version_min = sqlite3_column_int64(q, 5);
        out->version_max = sqlite3_column_int64(q, 6);
        rdb_col_text(q, 7, out->numerics, sizeof out->numerics);
        rdb_col_text(q, 8, out->routing, sizeof out->routing);
        rdb_col_text(q, 9, out->model_config_sha256, sizeof out->model_config_sha256);
        out->ctx_start = sqlite3_column_int64(q, 10);
        out->n_tokens = sqlite3_column_int64(q, 11);
        out->n_bytes = sqlite3_column_int64(q, 12);
        rdb_col_text(q, 13, out->status, sizeof out->status);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW) {
        sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
        if (rc == SQLITE_DONE)
            return arl_errorf(ARL_ERR_NOT_FOUND,
                              "replay: %s: state %lld is absent (cache miss: "
                              "recompute from the tokens)",
                              d->name, (long long)state_id);
        return rdb_fail(d, rc, "reading a state");
    }
    if (strcmp(out->status, "complete")) {
        sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "replay: %s: state %lld is '%s' (cache miss: recompute "
                          "from the tokens)",
                          d->name, (long long)state_id, out->status);
    }
    s = rdb_prepare(d,
                    "SELECT layer, tensor, row_start, data FROM state_chunks WHERE state_id = ?1 "
                    "ORDER BY layer, tensor, row_start",
                    &q);
    if (s != ARL_OK) {
        sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
        return s;
    }
    sqlite3_bind_int64(q, 1, state_id);
    out->n_chunks = 0;
    size_t used = 0;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const void *b = sqlite3_column_blob(q, 3);
        size_t len = (size_t)sqlite3_column_bytes(q, 3);
        char tensor[8];
        rdb_col_text(q, 1, tensor, sizeof tensor);
        arl_blob_expect ex = {0};
        ex.kind = !strcmp(tensor, "S")      ? ARL_BLOB_KDA_STATE
                  : !strcmp(tensor, "conv") ? ARL_BLOB_CONV_TAIL
                                            : ARL_BLOB_MLA_LATENT;
        arl_blob_header h;
        /* the header first (its shape sizes the buffer), then check and copy (or inflate, codec
         * 1) in one pass */
        s = arl_blob_parse(b, len, &h, NULL);
        size_t tn = s == ARL_OK ? (size_t)arl_blob_tensor_nbytes(&h) : 0;
        size_t pad = (used + 63) & ~(size_t)63; /* 64-byte aligned payloads */
        if (s == ARL_OK) {
            arl_status g = grow((void **)&out->chunks, &out->cap_chunks_,
                                (out->n_chunks + 1) * sizeof *out->chunks);
            if (g == ARL_OK) g = grow((void **)&out->buf_, &out->cap_buf_, pad + tn);
            if (g != ARL_OK) {
                s = g;
                break;
            }
            s = arl_blob_check_copy(b, len, &ex, &h, out->buf_ + pad, tn);
        }
        if (s != ARL_OK) {
            arl_error_prefix(ARL_ERR_CORRUPT, "replay: %s: state %lld chunk (layer %d, %s)",
                             d->name, (long long)state_id, sqlite3_column_int(q, 0), tensor);
            s = ARL_ERR_CORRUPT;
            break;
        }
        /* h describes the tensor as it is in memory now: raw (codec 0) */
        h.codec = ARL_BLOB_CODEC_RAW;
        h.payload_nbytes = tn;
        replay_state_chunk_data *c = &out->chunks[out->n_chunks++];
        c->layer = sqlite3_column_int(q, 0);
        snprintf(c->tensor, sizeof c->tensor, "%s", tensor);
        c->row_start = sqlite3_column_int64(q, 2);
        c->h = h;
        c->data = (const void *)(uintptr_t)pad; /* offset until the buffer stops moving */
        used = pad + tn;
    }
    sqlite3_finalize(q);
    sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
    for (size_t i = 0; i < out->n_chunks; i++)
        out->chunks[i].data = out->buf_ + (uintptr_t)out->chunks[i].data;
    if (s != ARL_OK) return s;
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading state chunks");
    return ARL_OK;
}

arl_status replay_state_find(replay_store *st, const char *traj_uid, int32_t seg_index,
                             const char *kind, const char *producer, const char *pass_uid,
                             replay_state_data *out) {
    if (replay_store_refresh(st) != ARL_OK) arl_error_clear(); /* the shards known so far */
    for (size_t k = 0; k < st->n_shards; k++) {
        rshard *sh = &st->shards[k];
        rdb *d;
        arl_status s = rstore_shard_states(st, sh, &d);
        if (s == ARL_ERR_NOT_FOUND) {
            arl_error_clear();
            continue;
        }
        ARL_TRY(s);
        sqlite3_stmt *q;
        ARL_TRY(rstore_prepare(st, d,
                               "SELECT state_id FROM states WHERE traj_uid = ?1 AND seg_index = ?2 "
                               "AND kind = ?3 AND producer = ?4 AND pass_uid = ?5 AND status = "
                               "'complete'",
                               &q));
        sqlite3_bind_text(q, 1, traj_uid, -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, seg_index);
        sqlite3_bind_text(q, 3, kind, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, producer, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 5, pass_uid, -1, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
        sqlite3_finalize(q);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(d, rc, "finding a state");
        if (id >= 0) return replay_state_load(st, sh->shard_id, id, out);
    }
    return arl_errorf(ARL_ERR_NOT_FOUND, "replay: no complete %s state of %s segment %d by %s "
                                         "pass %s (cache miss)",
                      kind, traj_uid, (int)seg_index, producer, pass_uid);
}

void replay_boundary_free(replay_state_data *parts, size_t n_parts) {
    if (!parts) return;
    for (size_t i = 0; i < n_parts; i++)
        replay_state_data_free(&parts[i]);
    free(parts);
}

arl_status replay_boundary_load(replay_store *st, int64_t traj_id, int32_t seg_index,
                                replay_state_data **parts_out, size_t *n_out) {
    *parts_out = NULL;
    *n_out = 0;
    replay_seg_ref *refs;
    size_t n;
    ARL_TRY(replay_traj_segments(st, traj_id, &refs, &n));
    arl_status s = ARL_OK;
    if (seg_index < 0 || (size_t)seg_index >= n) {
        free(refs);
        return arl_errorf(ARL_ERR_RANGE, "replay: trajectory %lld has %zu segments, no segment %d",
                          (long long)traj_id, n, (int)seg_index);
    }
    int32_t f = seg_index;
    while (f > 0 && strcmp(refs[f].start_kind, "fresh"))
        f--;
    size_t np = 1 + (size_t)(seg_index - f + 1);
    replay_state_data *parts = calloc(np, sizeof *parts);
    if (!parts) {
        free(refs);
        return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    }
    const replay_seg_ref *b = &refs[seg_index];
    if (b->end_state_id < 0)
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "replay: %s segment %d has no cached boundary state (cache "
                       "miss: prefill the stored tokens)",
                       b->traj_uid, (int)seg_index);
    else
        s = replay_state_load(st, b->shard_id, b->end_state_id, &parts[0]);
    for (int32_t i = f; s == ARL_OK && i <= seg_index; i++) {
        const replay_seg_ref *r = &refs[i];
        if (r->latent_state_id < 0)
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "replay: %s segment %d has no cached MLA entries (cache "
                           "miss: prefill the stored tokens)",
                           r->traj_uid, (int)i);
        else
            s = replay_state_load(st, r->shard_id, r->latent_state_id, &parts[1 + i - f]);
    }
    /* a state seeds the engine only if it is the one of its segment (section 9.2): the
     * trajectory, segment and kind its row says, or the segment's id points elsewhere (a cache
     * miss: verify reports the reference) */
    for (size_t i = 0; s == ARL_OK && i < np; i++) {
        const replay_seg_ref *r = i ? &refs[f + (int32_t)i - 1] : b;
        const char *kind = i ? "mla_segment" : "kda_boundary";
        if (strcmp(parts[i].traj_uid, r->traj_uid) || parts[i].seg_index != r->seg_index ||
            strcmp(parts[i].kind, kind))
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "replay: %s segment %d references state %lld, which is the %s of %s "
                           "segment %d, not its %s (cache miss: recompute; run 'agentrl replay "
                           "verify')",
                           r->traj_uid, (int)r->seg_index, (long long)parts[i].state_id,
                           parts[i].kind, parts[i].traj_uid, (int)parts[i].seg_index, kind);
    }
    for (size_t i = 1; s == ARL_OK && i < np; i++)
        if (strcmp(parts[i].pass_uid, parts[0].pass_uid))
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "replay: boundary of %s segment %d mixes passes '%s' and "
                           "'%s' (cache miss: recompute)",
                           b->traj_uid, (int)seg_index, parts[0].pass_uid, parts[i].pass_uid);
    free(refs);
    if (s != ARL_OK) {
        replay_boundary_free(parts, np);
        return s;
    }
    *parts_out = parts;
    *n_out = np;
    return ARL_OK;
}
