/* replay/writer.c: the writer of one shard file and its states file (spec section 7): T0,
 * C_s, C_end, C_mask, S_s, resume, recovery of a dead writer's trajectories, sealing, and
 * state garbage collection.  One transaction per segment; prepared statements are reused. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/sha256.h"
#include "core/log.h"
#include "replay/codec.h"
#include "replay/internal.h"

enum {
    W_SEL_TRAJ,
    W_SEL_PREV,
    W_INS_SEG,
    W_INS_ROUTE,
    W_INS_TURN,
    W_INS_CALL,
    W_INS_IMAGE,
    W_SEL_IMAGE,
    W_INS_IMGREF,
    W_INS_TOOL,
    W_INS_REWARD,
    W_UPD_COUNTS,
    W_INS_EVENT,
    W_UPD_FINISH,
    W_INS_TRAJ,
    W_NSTMT
};

static const char *const wsql[W_NSTMT] = {
    [W_SEL_TRAJ] = "SELECT status, n_segments, fork_seg_index, traj_uid, group_id, slot, attempt, "
                   "parent_traj_uid FROM trajectories WHERE traj_id = ?1",
    [W_SEL_PREV] = "SELECT start_kind, last_step, tok_start, ctx_start, n_tokens, end_cause FROM "
                   "segments WHERE traj_id = ?1 AND seg_index = ?2",
    [W_INS_SEG] =
        "INSERT INTO segments(traj_id, seg_index, start_kind, end_cause, first_step, "
        "last_step, tok_start, n_tokens, n_action_tokens, ctx_start, min_version, "
        "max_version, routes_layout, end_state_id, latent_state_id, committed_at_ms, "
        "tokens, logprobs, loss_mask, versions) VALUES "
        "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
        "?19, ?20)",
    [W_INS_ROUTE] = "INSERT INTO segment_routes(traj_id, seg_index, moe_layer, data) VALUES "
                    "(?1, ?2, ?3, ?4)",
    [W_INS_TURN] = "INSERT INTO turns(traj_id, step_index, seg_index, act_tok_start, act_tok_end, "
                   "obs_seg_index, obs_tok_start, obs_tok_end, policy_version, finish_reason, "
                   "parse_status, n_tool_calls, context, reward, terminated, truncated, anchor, "
                   "call_seq, started_at_ms, finished_at_ms, action_json) VALUES "
                   "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
                   "?18, ?19, ?20, ?21)",
    [W_INS_CALL] = "INSERT INTO env_calls(traj_id, call_seq, endpoint, session_id, step_index, "
                   "segment_index, http_status, error_code, attempts, attempt_log_json, "
                   "started_at_ms, latency_ms, response_len, response_complete, response_sha256, "
                   "request_body, response_body) VALUES "
                   "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    [W_INS_IMAGE] = "INSERT INTO images(sha256, width, height, n_bytes, png) VALUES "
                    "(?1, ?2, ?3, ?4, ?5) ON CONFLICT(sha256) DO NOTHING",
    [W_SEL_IMAGE] = "SELECT image_id FROM images WHERE sha256 = ?1",
    [W_INS_IMGREF] = "INSERT INTO image_refs(traj_id, call_seq, body_offset, image_id) VALUES "
                     "(?1, ?2, ?3, ?4)",
    [W_INS_TOOL] = "INSERT INTO tool_calls(traj_id, step_index, call_index, call_id, name, "
                   "parse_status, result_is_error, result_error_code, result_bytes, "
                   "result_truncated, arguments_json) VALUES "
                   "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [W_INS_REWARD] = "INSERT INTO rewards(traj_id, level, scope_index, component, source, value, "
                     "call_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [W_UPD_COUNTS] = "UPDATE trajectories SET n_segments = n_segments + 1, n_turns = n_turns + ?2, "
                     "n_tokens = n_tokens + ?3, n_action_tokens = n_action_tokens + ?4, "
                     "min_version = min(coalesce(min_version, ?5), ?5), "
                     "max_version = max(coalesce(max_version, ?6), ?6), "
                     "session_id = coalesce(?7, session_id), updated_at_ms = ?8 "
                     "WHERE traj_id = ?1",
    [W_INS_EVENT] = "INSERT INTO trajectory_events(traj_id, seq, at_ms, kind, detail_json) "
                    "SELECT ?1, coalesce(max(seq), -1) + 1, ?2, ?3, ?4 FROM trajectory_events "
                    "WHERE traj_id = ?1",
    [W_UPD_FINISH] = "UPDATE trajectories SET status = ?2, end_cause = ?3, error_code = ?4, "
                     "error_attribution = ?5, error_detail_json = ?6, "
                     "outcome_reward = coalesce(?7, outcome_reward), "
                     "finished_at_ms = coalesce(finished_at_ms, ?8), updated_at_ms = ?8 "
                     "WHERE traj_id = ?1",
    [W_INS_TRAJ] = "INSERT INTO trajectories(traj_id, traj_uid, run_id, group_id, slot, attempt, "
                   "task_id, env_id, session_id, status, parent_traj_uid, fork_seg_index, "
                   "created_at_ms, updated_at_ms) VALUES "
                   "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'running', ?10, ?11, ?12, ?12)",
};

static arl_status wstmt(replay_writer *w, int i, sqlite3_stmt **out) {
    if (!w->stmt[i]) ARL_TRY(rdb_prepare(&w->w, wsql[i], &w->stmt[i]));
    sqlite3_reset(w->stmt[i]);
    sqlite3_clear_bindings(w->stmt[i]);
    *out = w->stmt[i];
    return ARL_OK;
}

/* Step a bound statement expecting DONE; leaves it reset. */
static arl_status wrun(replay_writer *w, sqlite3_stmt *s, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return rdb_fail(&w->w, rc, what);
    return ARL_OK;
}

arl_status replay_writer_scratch_reserve(replay_writer *w, size_t n) {
    if (n <= w->scratch_cap) return ARL_OK;
    size_t c = w->scratch_cap ? w->scratch_cap : 1 << 16;
    while (c < n)
        c *= 2;
    uint8_t *p = realloc(w->scratch, c);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory (%zu-byte blob buffer)", c);
    w->scratch = p;
    w->scratch_cap = c;
    return ARL_OK;
}

static void read_boot_id(char *buf, size_t cap) {
    buf[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    if (fgets(buf, (int)cap, f)) buf[strcspn(buf, "\r\n")] = 0;
    fclose(f);
}

const char *replay_writer_file(const replay_writer *w) {
    return w->file;
}

int32_t replay_writer_shard_id(const replay_writer *w) {
    return w->shard_id;
}

void replay_writer_interrupted(const replay_writer *w, const int64_t **ids, size_t *n) {
    *ids = w->interrupted;
    *n = w->n_interrupted;
}

void replay_writer_close(replay_writer *w) {
    if (!w) return;
    rckpt_stop(w->ckpt_w);
    rckpt_stop(w->ckpt_s);
    for (int i = 0; i < W_NSTMT; i++)
        sqlite3_finalize(w->stmt[i]);
    for (int i = 0; i < 4; i++)
        sqlite3_finalize(w->sstmt[i]);
    rdb_close(&w->w);
    rdb_close(&w->s);
    rlock_release(w->lock_fd, w->lock_dev, w->lock_ino);
    free(w->file);
    free(w->states_file);
    free(w->lock_path);
    free(w->interrupted);
    free(w->scratch);
    free(w);
}

/* Remove "<file>.new.<pid>*" left by writers killed while creating this shard's files; only the
 * lock holder creates them, so under the lock every such file is stale. */
static void remove_stale_temps(const char *dir, const char *file, const char *states_file) {
    char *sd = rstore_join(dir, "shards");
    DIR *dd = sd ? opendir(sd) : NULL;
    const char *base = strrchr(file, '/'), *sbase = strrchr(states_file, '/');
    base = base ? base + 1 : file;
    sbase = sbase ? sbase + 1 : states_file;
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s.new.", base);
    snprintf(p2, sizeof p2, "%s.new.", sbase);
    struct dirent *e;
    while (dd && (e = readdir(dd))) {
        if (strncmp(e->d_name, p1, strlen(p1)) && strncmp(e->d_name, p2, strlen(p2))) continue;
        char *p = rstore_join(sd, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    if (dd) closedir(dd);
    free(sd);
}

arl_status rwriter_scan_running(replay_writer *w) {
    sqlite3_stmt *q;
    free(w->interrupted);
    w->interrupted = NULL;
    w->n_interrupted = 0;
    ARL_TRY(rdb_prepare(
        &w->w, "SELECT traj_id FROM trajectories WHERE status = 'running' ORDER BY traj_id", &q));
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int64_t *p = realloc(w->interrupted, (w->n_interrupted + 1) * sizeof *p);
        if (!p) {
            sqlite3_finalize(q);
            return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        }
        w->interrupted = p;
        w->interrupted[w->n_interrupted++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&w->w, rc, "listing interrupted trajectories");
    return ARL_OK;
}

/* w's file names for shard id of its kind (file, states_file, lock_path) and the paths of its
 * two files (*path, *spath: malloc'd), in place of those it had. */
static arl_status writer_names(replay_writer *w, int32_t id, char **path, char **spath) {
    free(w->file);
    free(w->states_file);
    free(w->lock_path);
    free(*path);
    free(*spath);
    w->states_file = w->lock_path = *path = *spath = NULL;
    w->shard_id = id;
    w->file = rstore_shard_rel(w->kind, id);
    if (w->file) {
        size_t n = strlen(w->file);
        w->states_file = malloc(n + 16);
        w->lock_path = malloc(strlen(w->st->dir) + n + 16);
        if (w->states_file) {
            memcpy(w->states_file, w->file, n - 7);
            strcpy(w->states_file + n - 7, ".states.sqlite");
        }
        *path = rstore_join(w->st->dir, w->file);
        *spath = w->states_file ? rstore_join(w->st->dir, w->states_file) : NULL;
        if (w->lock_path && *path) sprintf(w->lock_path, "%s.lock", *path);
    }
    if (!w->file || !w->states_file || !w->lock_path || !*path || !*spath)
        return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    return ARL_OK;
}

/* Register (shard_id 0: allocate) w's shard in the catalog.  A new id is the first above the
 * registered ones that has no file and whose lock w takes (a writer of an id given explicitly
 * holds its lock before it registers it); its names are set and its lock held before the
 * registration commits: a reader that finds the shard registered before its file exists sees
 * its writer alive, creating it (rstore_file_missing). */
static arl_status register_shard(replay_store *st, replay_writer *w, int32_t *shard_id, int brief,
                                 char **path, char **spath) {
    const int kind = w->kind;
    rdb *c = &st->cat;
    ARL_TRY(rdb_begin(c));
    arl_status s = ARL_OK;
    int64_t id = *shard_id;
    if (!id) {
        s = rdb_query_int(c, "SELECT coalesce(max(shard_id), 0) + 1 FROM shards", &id, NULL);
        if (s != ARL_OK) return s;
        for (;; id++) {
            struct stat sb;
            if (id > REPLAY_SHARD_MAX) {
                rdb_rollback(c);
                return arl_errorf(ARL_ERR_FULL, "replay: %s: all %d shard ids are used", st->root,
                                  REPLAY_SHARD_MAX);
            }
            if ((s = writer_names(w, (int32_t)id, path, spath)) != ARL_OK) break;
            if (stat(*path, &sb) == 0) continue;
            s = rlock_acquire(w->lock_path, w->file, brief, &w->lock_fd, &w->lock_dev,
                              &w->lock_ino);
            if (s != ARL_ERR_BUSY) break;
            arl_error_clear(); /* another writer's, about to register it */
            s = ARL_OK;
        }
    }
    char *rel = rstore_shard_rel(kind, (int32_t)id);
    sqlite3_stmt *q = NULL;
    if (!rel) s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    if (s == ARL_OK)
        s = rdb_prepare(c,
                        "INSERT INTO shards(shard_id, kind, file_name, host, created_at_ms) VALUES "
                        "(?1, ?2, ?3, ?4, ?5) ON CONFLICT(shard_id) DO NOTHING",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, id);
        sqlite3_bind_text(q, 2, replay_file_kind_name(kind), -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, rel, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, st->host, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 5, rnow_ms());
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "registering a shard");
    }
    sqlite3_finalize(q);
    if (s == ARL_OK) {
        /* an existing registration must agree on the kind */
        sqlite3_stmt *k = NULL;
        s = rdb_prepare(c, "SELECT kind FROM shards WHERE shard_id = ?1", &k);
        if (s == ARL_OK) {
            sqlite3_bind_int64(k, 1, id);
            if (sqlite3_step(k) == SQLITE_ROW &&
                strcmp((const char *)sqlite3_column_text(k, 0), replay_file_kind_name(kind)))
                s = arl_errorf(ARL_ERR_ARG,
                               "replay: %s: shard %lld is registered as a %s shard, not %s",
                               st->root, (long long)id, sqlite3_column_text(k, 0),
                               replay_file_kind_name(kind));
            sqlite3_finalize(k);
        }
    }
    free(rel);
    if (s != ARL_OK) {
        rdb_rollback(c);
        return s;
    }
    ARL_TRY(rdb_commit(c));
    *shard_id = (int32_t)id;
    return ARL_OK;
}

arl_status replay_writer_open(replay_store *st, replay_file_kind kind, int32_t shard_id,
                              const char *run_uid, replay_writer **out) {
    return rwriter_open(st, kind, shard_id, run_uid, 0, out);
}

arl_status rwriter_open(replay_store *st, replay_file_kind kind, int32_t shard_id,
                        const char *run_uid, int brief, replay_writer **out) {
    *out = NULL;
    if (kind != REPLAY_FILE_WORKER && kind != REPLAY_FILE_TOOL && kind != REPLAY_FILE_LEARNER)
        return arl_errorf(ARL_ERR_ARG, "replay: writers open worker, tool or learner files, not %s",
                          replay_file_kind_name(kind));
    if (!st->cat.db || st->cat.readonly || st->single_file)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: writing needs a store root opened read-write with its "
                          "catalog.sqlite",
                          st->root);
    if (shard_id < 0 || shard_id > REPLAY_SHARD_MAX)
        return arl_errorf(ARL_ERR_ARG, "replay: shard id %d outside 1..%d", (int)shard_id,
                          REPLAY_SHARD_MAX);
    replay_writer *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    w->st = st;
    w->kind = kind;
    w->lock_fd = -1;
    arl_status s = ARL_OK;
    char *path = NULL, *spath = NULL;
    /* the lock first (a new id's inside its registration), then the catalog's row */
    if (shard_id > 0 && (s = writer_names(w, shard_id, &path, &spath)) == ARL_OK)
        s = rlock_acquire(w->lock_path, w->file, brief, &w->lock_fd, &w->lock_dev, &w->lock_ino);
    if (s == ARL_OK) s = register_shard(st, w, &shard_id, brief, &path, &spath);
    if (s != ARL_OK) goto fail;
    remove_stale_temps(st->dir, w->file, w->states_file);
    char meta[1024];
    char sid[16];
    snprintf(sid, sizeof sid, "%d", (int)shard_id);
    size_t mo = 0;
    /* meta.model_config_sha256 (section 4.1): the run's, when the catalog knows it */
    char mcfg[80] = "";
    if (run_uid) {
        sqlite3_stmt *q;
        if (rdb_prepare(&st->cat, "SELECT model_config_sha256 FROM runs WHERE run_uid = ?1", &q) ==
            ARL_OK) {
            sqlite3_bind_text(q, 1, run_uid, -1, SQLITE_STATIC);
            if (sqlite3_step(q) == SQLITE_ROW) rdb_col_text(q, 0, mcfg, sizeof mcfg);
            sqlite3_finalize(q);
        }
    }
    const char *kv[] = {"store_uid", st->store_uid,         "shard_id",           sid, "run_uid",
                        run_uid,     "model_config_sha256", mcfg[0] ? mcfg : NULL};
    /* "key\0value\0...\0": the states file gets the same keys but run_uid (section 4.1) */
    char smeta[1024];
    size_t so = 0;
    for (int i = 0; i < 8; i += 2) {
        if (!kv[i + 1]) continue;
        int n = snprintf(meta + mo, sizeof meta - mo, "%s%c%s%c", kv[i], 0, kv[i + 1], 0);
        if (n < 0 || (size_t)n >= sizeof meta - mo) break;
        mo += (size_t)n;
        if (!strcmp(kv[i], "run_uid")) continue;
        n = snprintf(smeta + so, sizeof smeta - so, "%s%c%s%c", kv[i], 0, kv[i + 1], 0);
        if (n < 0 || (size_t)n >= sizeof smeta - so) break;
        so += (size_t)n;
    }
    meta[mo] = 0;
    smeta[so] = 0;
    if ((s = rdb_open(&w->w, path, w->file, kind, RDB_CREATE, st->vfs, meta)) != ARL_OK) goto fail;
    if ((s = rdb_open(&w->s, spath, w->states_file, REPLAY_FILE_STATES, RDB_CREATE, st->vfs,
                      smeta)) != ARL_OK)
        goto fail;
    char uid[40];
    if ((s = rdb_meta_get(&w->w, "store_uid", uid, sizeof uid, NULL)) != ARL_OK) goto fail;
    if (strcmp(uid, st->store_uid)) {
        s = arl_errorf(ARL_ERR_STATE,
                       "replay: %s belongs to store %s, not to this store (%s): do not copy shard "
                       "files between stores; import them",
                       w->file, uid, st->store_uid);
        goto fail;
    }
    /* Takeover (section 2.2): a previous owner that is not this process is gone. */
    char host[256], pid[32], boot[64], me_pid[32], me_boot[64];
    int had_owner;
    read_boot_id(me_boot, sizeof me_boot);
    snprintf(me_pid, sizeof me_pid, "%ld", (long)getpid());
    if ((s = rdb_meta_get(&w->w, "owner_pid", pid, sizeof pid, &had_owner)) != ARL_OK ||
        (s = rdb_meta_get(&w->w, "owner_host", host, sizeof host, NULL)) != ARL_OK ||
        (s = rdb_meta_get(&w->w, "owner_boot_id", boot, sizeof boot, NULL)) != ARL_OK)
        goto fail;
    int takeover =
        had_owner && (strcmp(pid, me_pid) || strcmp(host, st->host) || strcmp(boot, me_boot));
    /* learner files hold no trajectories: nothing can be interrupted there */
    if (takeover && kind != REPLAY_FILE_LEARNER && (s = rwriter_scan_running(w)) != ARL_OK)
        goto fail;
    char since[32];
    snprintf(since, sizeof since, "%lld", (long long)rnow_ms());
    if ((s = rdb_begin(&w->w)) != ARL_OK) goto fail;
    if ((s = rdb_meta_set(&w->w, "owner_host", st->host)) != ARL_OK ||
        (s = rdb_meta_set(&w->w, "owner_pid", me_pid)) != ARL_OK ||
        (s = rdb_meta_set(&w->w, "owner_boot_id", me_boot)) != ARL_OK ||
        (s = rdb_meta_set(&w->w, "owner_since_ms", since)) != ARL_OK)
        goto fail;
    if ((s = rdb_commit(&w->w)) != ARL_OK) goto fail;
    if (!(st->flags & REPLAY_OPEN_FG_CHECKPOINT) &&
        ((s = rckpt_start(&w->w, st->vfs, &w->ckpt_w)) != ARL_OK ||
         (s = rckpt_start(&w->s, st->vfs, &w->ckpt_s)) != ARL_OK))
        goto fail;
    free(path);
    free(spath);
    replay_store_refresh(st);
    *out = w;
    return ARL_OK;
fail:
    free(path);
    free(spath);
    replay_writer_close(w);
    return s;
}

/* ---- events ---- */

static arl_status add_event(replay_writer *w, int64_t traj_id, const char *kind,
                            const char *detail) {
    sqlite3_stmt *s;
    ARL_TRY(wstmt(w, W_INS_EVENT, &s));
    sqlite3_bind_int64(s, 1, traj_id);
    sqlite3_bind_int64(s, 2, rnow_ms());
    sqlite3_bind_text(s, 3, kind, -1, SQLITE_STATIC);
    rdb_bind_text(s, 4, detail);
    return wrun(w, s, "inserting an event");
}

arl_status replay_traj_event(replay_writer *w, int64_t traj_id, const char *kind,
                             const char *detail_json) {
    ARL_TRY(rdb_begin(&w->w));
    arl_status s = add_event(w, traj_id, kind, detail_json);
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return s;
    }
    return rdb_commit(&w->w);
}

/* ---- T0 ---- */

arl_status replay_traj_begin(replay_writer *w, const replay_traj_desc *d, int64_t *traj_id) {
    if (!d->traj_uid || !*d->traj_uid || strlen(d->traj_uid) > REPLAY_UID_MAX)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: traj_uid must be 1..256 bytes", w->file);
    rdb *db = &w->w;
    /* traj ids of shard h lie in [h * 2^40, (h + 1) * 2^40) (section 2.1 rule 3); this writer
     * alone writes the shard (its lock), so the next id holds until the insert below */
    int64_t base = (int64_t)w->shard_id << REPLAY_TRAJ_ID_SHIFT, maxid = 0;
    int found = 0;
    ARL_TRY(rdb_query_int(db, "SELECT max(traj_id) FROM trajectories", &maxid, &found));
    int64_t id = (found && maxid >= base) ? maxid + 1 : base;
    if (id >= base + ((int64_t)1 << REPLAY_TRAJ_ID_SHIFT))
        return arl_errorf(ARL_ERR_FULL, "replay: %s: trajectory ids exhausted (rotate the shard)",
                          w->file);
    /* the group member first: a writer of another shard that claimed it samples it (two
     * workers of one run uid over the same tasks wrote every trajectory twice, one in each
     * shard); a catalog that cannot be written is the mirror's warning, as before */
    arl_status s =
        rcat_member_claim(w->st, d->group_id, d->slot, d->attempt, d->traj_uid, w->shard_id, id);
    if (s == ARL_ERR_BUSY) return s;
    if (s != ARL_OK) {
        arl_log_warn("%s (the catalog mirror is rebuilt by replay_catalog_reconcile)",
                     arl_error_msg());
        arl_error_clear();
    }
    ARL_TRY(rdb_begin(db));
    sqlite3_stmt *q;
    if ((s = wstmt(w, W_INS_TRAJ, &q)) != ARL_OK) goto fail;
    sqlite3_bind_int64(q, 1, id);
    sqlite3_bind_text(q, 2, d->traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, d->run_id);
    sqlite3_bind_int64(q, 4, d->group_id);
    sqlite3_bind_int(q, 5, d->slot);
    sqlite3_bind_int(q, 6, d->attempt);
    sqlite3_bind_int64(q, 7, d->task_id);
    sqlite3_bind_int64(q, 8, d->env_id);
    rdb_bind_text(q, 9, d->session_id);
    rdb_bind_text(q, 10, d->parent_traj_uid);
    rdb_bind_int_or_null(q, 11, d->parent_traj_uid ? d->fork_seg_index : -1);
    sqlite3_bind_int64(q, 12, rnow_ms());
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        if ((rc & 0xFF) == SQLITE_CONSTRAINT) {
            s = arl_errorf(ARL_ERR_STATE,
                           "replay: %s: trajectory '%s' already exists (traj_uids are "
                           "never reused)",
                           w->file, d->traj_uid);
            rdb_rollback(db);
        } else {
            s = rdb_fail(db, rc, "inserting a trajectory");
        }
        goto fail;
    }
    char detail[512];
    if (d->parent_traj_uid)
        snprintf(detail, sizeof detail,
                 "{\"policy_version\":%lld,\"fork_of\":\"%s\",\"fork_seg_index\":%d}",
                 (long long)d->policy_version, d->parent_traj_uid, (int)d->fork_seg_index);
    else
        snprintf(detail, sizeof detail, "{\"policy_version\":%lld}", (long long)d->policy_version);
    if ((s = add_event(w, id, d->parent_traj_uid ? "forked" : "created", detail)) != ARL_OK)
        goto fail;
    if ((s = rdb_commit(db)) != ARL_OK) return s;
    *traj_id = id;
    return ARL_OK;
fail:
    rdb_rollback(db);
    return s;
}

/* ---- C_s ---- */

typedef struct traj_state {
    int status;
    int32_t n_segments;
    int32_t fork_seg_index; /* -1 */
    char traj_uid[REPLAY_UID_MAX + 1];
    char parent_uid[REPLAY_UID_MAX + 1];
    int64_t group_id;
    int32_t slot, attempt;
} traj_state;

static arl_status load_traj(replay_writer *w, int64_t traj_id, traj_state *t) {
    sqlite3_stmt *q;
    ARL_TRY(wstmt(w, W_SEL_TRAJ, &q));
    sqlite3_bind_int64(q, 1, traj_id);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        char st[16];
        rdb_col_text(q, 0, st, sizeof st);
        t->status = replay_status_parse(st);
        t->n_segments = sqlite3_column_int(q, 1);
        t->fork_seg_index = (int32_t)rdb_col_int_or(q, 2, -1);
        rdb_col_text(q, 3, t->traj_uid, sizeof t->traj_uid);
        t->group_id = sqlite3_column_int64(q, 4);
        t->slot = sqlite3_column_int(q, 5);
        t->attempt = sqlite3_column_int(q, 6);
        rdb_col_text(q, 7, t->parent_uid, sizeof t->parent_uid);
    }
    sqlite3_reset(q);
    if (rc == SQLITE_DONE)
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no trajectory with id %lld", w->file,
                          (long long)traj_id);
    if (rc != SQLITE_ROW) return rdb_fail(&w->w, rc, "reading a trajectory");
    return ARL_OK;
}

/* Check seg against the chain of committed segments (section 7.4 invariants 1 and 2). */
static arl_status check_chain(replay_writer *w, int64_t traj_id, const traj_state *t,
                              const replay_segment_desc *sg) {
    int32_t first = t->fork_seg_index >= 0 ? t->fork_seg_index + 1 : 0;
    int32_t want = first + t->n_segments;
    const char *f = w->file;
    if (sg->seg_index != want)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: trajectory %s: segment index %d, expected %d",
                          f, t->traj_uid, (int)sg->seg_index, (int)want);
    if (sg->n_tokens <= 0 || !sg->tokens || !sg->logprobs || !sg->loss_mask || !sg->versions)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: trajectory %s segment %d: n_tokens %lld and "
                          "the four per-token arrays are required",
                          f, t->traj_uid, (int)sg->seg_index, (long long)sg->n_tokens);
    if (sg->last_step < sg->first_step)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: trajectory %s segment %d: last_step %d < first_step %d", f,
                          t->traj_uid, (int)sg->seg_index, (int)sg->last_step, (int)sg->first_step);
    if (!sg->start_kind || !sg->end_cause)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: segment start_kind and end_cause are required",
                          f);
    int is_fresh = !strcmp(sg->start_kind, "fresh"), is_fork = !strcmp(sg->start_kind, "fork");
    if (sg->seg_index == first && t->fork_seg_index < 0) {
        if (!is_fresh || sg->tok_start != 0 || sg->ctx_start != 0 || sg->first_step != 1)
            return arl_errorf(
                ARL_ERR_ARG,
                "replay: %s: trajectory %s: segment 0 must be fresh with tok_start 0, "
                "ctx_start 0 and first_step 1 (got %s, %lld, %lld, %d)",
                f, t->traj_uid, sg->start_kind, (long long)sg->tok_start, (long long)sg->ctx_start,
                (int)sg->first_step);
        return ARL_OK;
    }
    if (sg->seg_index == first) {
        /* first own segment of a fork: continues the parent's segment fork_seg_index */
        replay_seg_ref *refs = NULL;
        size_t n = 0;
        replay_traj_row pr;
        arl_status s = replay_traj_get(w->st, t->parent_uid, &pr);
        if (s == ARL_OK) s = replay_traj_segments(w->st, pr.traj_id, &refs, &n);
        if (s != ARL_OK)
            return arl_error_prefix(s, "replay: %s: fork %s: reading parent %s", f, t->traj_uid,
                                    t->parent_uid);
        arl_status r = ARL_OK;
        if ((size_t)t->fork_seg_index >= n)
            r = arl_errorf(ARL_ERR_STATE,
                           "replay: %s: fork %s: parent has %zu segments, fork point %d", f,
                           t->traj_uid, n, (int)t->fork_seg_index);
        else {
            const replay_seg_ref *p = &refs[t->fork_seg_index];
            if (!is_fork || sg->tok_start != p->tok_start + p->n_tokens ||
                sg->ctx_start != p->ctx_start + p->n_tokens || sg->first_step != p->last_step + 1)
                r = arl_errorf(
                    ARL_ERR_ARG,
                    "replay: %s: fork %s: first segment must have start_kind 'fork', "
                    "tok_start %lld, ctx_start %lld, first_step %d (got %s, %lld, %lld, %d)",
                    f, t->traj_uid, (long long)(p->tok_start + p->n_tokens),
                    (long long)(p->ctx_start + p->n_tokens), (int)p->last_step + 1, sg->start_kind,
                    (long long)sg->tok_start, (long long)sg->ctx_start, (int)sg->first_step);
        }
        free(refs);
        return r;
    }
    if (is_fork)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: trajectory %s segment %d: only the first segment "
                          "of a fork has start_kind 'fork'",
                          f, t->traj_uid, (int)sg->seg_index);
    sqlite3_stmt *q;
    ARL_TRY(wstmt(w, W_SEL_PREV, &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int(q, 2, sg->seg_index - 1);
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW) {
        sqlite3_reset(q);
        if (rc == SQLITE_DONE)
            return arl_errorf(ARL_ERR_CORRUPT,
                              "replay: %s: trajectory %s: segment %d is missing "
                              "(run 'agentrl replay verify')",
                              f, t->traj_uid, (int)sg->seg_index - 1);
        return rdb_fail(&w->w, rc, "reading the previous segment");
    }
    int32_t p_last = sqlite3_column_int(q, 1);
    int64_t p_tok = sqlite3_column_int64(q, 2), p_ctx = sqlite3_column_int64(q, 3),
            p_n = sqlite3_column_int64(q, 4);
    sqlite3_reset(q);
    int64_t want_ctx = is_fresh ? 0 : p_ctx + p_n;
    if (sg->tok_start != p_tok + p_n || sg->ctx_start != want_ctx || sg->first_step != p_last + 1)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: trajectory %s segment %d: tok_start %lld, ctx_start %lld, "
                          "first_step %d do not continue segment %d (expected %lld, %lld, %d)",
                          f, t->traj_uid, (int)sg->seg_index, (long long)sg->tok_start,
                          (long long)sg->ctx_start, (int)sg->first_step, (int)sg->seg_index - 1,
                          (long long)(p_tok + p_n), (long long)want_ctx, (int)p_last + 1);
    return ARL_OK;
}

static arl_status insert_env_call(replay_writer *w, int64_t traj_id, const replay_env_call *c) {
    sqlite3_stmt *q;
    uint8_t *body = NULL;
    size_t body_n = 0, n_imgs = 0;
    relided_image *imgs = NULL;
    arl_status s = ARL_OK;
    const uint8_t *resp = c->response;
    size_t resp_n = c->response_nbytes;
    uint8_t sha[32];
    if (!c->endpoint)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: env call %lld has no endpoint", w->file,
                          (long long)c->call_seq);
    if (resp && c->response_complete) {
        arl_sha256(resp, resp_n, sha);
        ARL_TRY(relide_images(resp, resp_n, &body, &body_n, &imgs, &n_imgs));
        resp = body;
        resp_n = body_n;
    } else if (resp && resp_n > 65536) {
        resp_n = 65536; /* the first 64 KiB of an incomplete body (section 4.8) */
    }
    if ((s = wstmt(w, W_INS_CALL, &q)) != ARL_OK) goto out;
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int64(q, 2, c->call_seq);
    sqlite3_bind_text(q, 3, c->endpoint, -1, SQLITE_STATIC);
    rdb_bind_text(q, 4, c->session_id);
    rdb_bind_int_or_null(q, 5, c->step_index);
    rdb_bind_int_or_null(q, 6, c->segment_index);
    rdb_bind_int_or_null(q, 7, c->http_status);
    rdb_bind_text(q, 8, c->error_code);
    sqlite3_bind_int(q, 9, c->attempts > 0 ? c->attempts : 1);
    rdb_bind_text(q, 10, c->attempt_log_json);
    sqlite3_bind_int64(q, 11, c->started_at_ms);
    sqlite3_bind_int64(q, 12, c->latency_ms);
    rdb_bind_int_or_null(q, 13,
                         c->response_len >= 0 ? c->response_len
                                              : (c->response ? (int64_t)c->response_nbytes : -1));
    sqlite3_bind_int(q, 14, c->response_complete ? 1 : 0);
    if (c->response && c->response_complete) sqlite3_bind_blob(q, 15, sha, 32, SQLITE_STATIC);
    if (c->request) sqlite3_bind_blob64(q, 16, c->request, c->request_nbytes, SQLITE_STATIC);
    if (resp) sqlite3_bind_blob64(q, 17, resp, resp_n, SQLITE_STATIC);
    if ((s = wrun(w, q, "inserting an env call")) != ARL_OK) goto out;
    for (size_t i = 0; i < n_imgs; i++) {
        relided_image *im = &imgs[i];
        if ((s = wstmt(w, W_INS_IMAGE, &q)) != ARL_OK) goto out;
        sqlite3_bind_blob(q, 1, im->sha256, 32, SQLITE_STATIC);
        sqlite3_bind_int(q, 2, im->width);
        sqlite3_bind_int(q, 3, im->height);
        sqlite3_bind_int64(q, 4, (int64_t)im->png_nbytes);
        sqlite3_bind_blob64(q, 5, im->png, im->png_nbytes, SQLITE_STATIC);
        if ((s = wrun(w, q, "inserting an image")) != ARL_OK) goto out;
        if ((s = wstmt(w, W_SEL_IMAGE, &q)) != ARL_OK) goto out;
        sqlite3_bind_blob(q, 1, im->sha256, 32, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        int64_t image_id = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
        sqlite3_reset(q);
        if (rc != SQLITE_ROW) {
            s = rdb_fail(&w->w, rc == SQLITE_DONE ? SQLITE_INTERNAL : rc, "finding an image");
            goto out;
        }
        if ((s = wstmt(w, W_INS_IMGREF, &q)) != ARL_OK) goto out;
        sqlite3_bind_int64(q, 1, traj_id);
        sqlite3_bind_int64(q, 2, c->call_seq);
        sqlite3_bind_int64(q, 3, (int64_t)im->body_offset);
        sqlite3_bind_int64(q, 4, image_id);
        if ((s = wrun(w, q, "inserting an image reference")) != ARL_OK) goto out;
    }
out:
    free(body);
    relided_free(imgs, n_imgs);
    return s;
}

static arl_status insert_rewards(replay_writer *w, int64_t traj_id, const replay_reward *r,
                                 size_t n) {
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *q;
        ARL_TRY(wstmt(w, W_INS_REWARD, &q));
        sqlite3_bind_int64(q, 1, traj_id);
        rdb_bind_text(q, 2, r[i].level);
        sqlite3_bind_int64(q, 3, r[i].scope_index);
        rdb_bind_text(q, 4, r[i].component ? r[i].component : "");
        sqlite3_bind_text(q, 5, r[i].source ? r[i].source : "env", -1, SQLITE_STATIC);
        rdb_bind_real_or_null(q, 6, r[i].value);
        rdb_bind_int_or_null(q, 7, r[i].call_seq);
        ARL_TRY(wrun(w, q, "inserting a reward"));
    }
    return ARL_OK;
}

/* Insert segment sg and everything committed with it; inside an open transaction. */
static arl_status append_in_txn(replay_writer *w, int64_t traj_id, const traj_state *t,
                                const replay_segment_desc *sg) {
    ARL_TRY(check_chain(w, traj_id, t, sg));
    const int64_t n = sg->n_tokens;
    /* counters over action tokens; versions of all tokens if there is none (section 4.7) */
    int64_t n_act = 0;
    uint32_t vmin = UINT32_MAX, vmax = 0, amin = UINT32_MAX, amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = sg->versions[i];
        if (v < vmin) vmin = v;
        if (v > vmax) vmax = v;
        if (sg->loss_mask[i]) {
            n_act++;
            if (v < amin) amin = v;
            if (v > amax) amax = v;
        }
    }
    if (n_act) {
        vmin = amin;
        vmax = amax;
    }
    /* the four per-token blobs, back to back in the scratch buffer */
    const size_t H = ARL_BLOB_HEADER_SIZE;
    size_t nb[4] = {H + 4 * (size_t)n, H + 4 * (size_t)n, H + (size_t)n, H + 4 * (size_t)n};
    ARL_TRY(replay_writer_scratch_reserve(w, nb[0] + nb[1] + nb[2] + nb[3]));
    uint64_t dims[1] = {(uint64_t)n};
    const void *pl[4] = {sg->tokens, sg->logprobs, sg->loss_mask, sg->versions};
    const arl_blob_kind kinds[4] = {ARL_BLOB_TOKENS, ARL_BLOB_LOGPROBS, ARL_BLOB_LOSS_MASK,
                                    ARL_BLOB_VERSIONS};
    const arl_blob_dtype dts[4] = {ARL_BLOB_U32, ARL_BLOB_F32, ARL_BLOB_U8, ARL_BLOB_U32};
    uint8_t *p[4];
    size_t off = 0, got;
    size_t len[4];
    for (int k = 0; k < 4; k++) {
        p[k] = w->scratch + off;
        arl_status e = ARL_ERR_RANGE;
        /* codec 1 only when it saves at least 20 % (section 5.1 rule 5) */
        if (w->st->flags & REPLAY_OPEN_DEFLATE)
            e = arl_blob_encode_deflate(kinds[k], dts[k], 1, dims, pl[k], p[k],
                                        H + (nb[k] - H) / 5 * 4, &len[k]);
        if (e == ARL_ERR_RANGE)
            e = arl_blob_encode(kinds[k], dts[k], 1, dims, pl[k], p[k], nb[k], &len[k]);
        ARL_TRY(e);
        off += nb[k];
    }
    sqlite3_stmt *q;
    ARL_TRY(wstmt(w, W_INS_SEG, &q));
    int64_t now = rnow_ms();
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int(q, 2, sg->seg_index);
    sqlite3_bind_text(q, 3, sg->start_kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, sg->end_cause, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 5, sg->first_step);
    sqlite3_bind_int(q, 6, sg->last_step);
    sqlite3_bind_int64(q, 7, sg->tok_start);
    sqlite3_bind_int64(q, 8, n);
    sqlite3_bind_int64(q, 9, n_act);
    sqlite3_bind_int64(q, 10, sg->ctx_start);
    sqlite3_bind_int64(q, 11, vmin);
    sqlite3_bind_int64(q, 12, vmax);
    rdb_bind_text(q, 13, sg->n_moe_layers > 0 ? sg->routes_layout : NULL);
    rdb_bind_int_or_null(q, 14, sg->end_state_id);
    rdb_bind_int_or_null(q, 15, sg->latent_state_id);
    sqlite3_bind_int64(q, 16, now);
    for (int k = 0; k < 4; k++)
        sqlite3_bind_blob64(q, 17 + k, p[k], len[k], SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        if ((rc & 0xFF) == SQLITE_CONSTRAINT)
            return arl_error_prefix(rdb_fail(&w->w, rc, "inserting a segment"),
                                    "replay: trajectory %s segment %d", t->traj_uid,
                                    (int)sg->seg_index);
        return rdb_fail(&w->w, rc, "inserting a segment");
    }
    /* routes: one blob per MoE layer */
    if (sg->n_moe_layers > 0) {
        size_t es = arl_blob_dtype_size(sg->route_dtype);
        if (!sg->routes || sg->route_k <= 0 ||
            (sg->route_dtype != ARL_BLOB_U8 && sg->route_dtype != ARL_BLOB_U16))
            return arl_errorf(ARL_ERR_ARG,
                              "replay: %s: segment %d: routes need data, k > 0 and "
                              "dtype u8 or u16",
                              w->file, (int)sg->seg_index);
        size_t lay = (size_t)n * (size_t)sg->route_k * es;
        if ((uint64_t)lay + H > ARL_BLOB_MAX_BYTES)
            return arl_errorf(ARL_ERR_RANGE,
                              "replay: %s: segment %d: one layer's routes (%zu bytes) "
                              "exceed the 64 MiB blob limit: use shorter segments",
                              w->file, (int)sg->seg_index, lay);
        ARL_TRY(replay_writer_scratch_reserve(w, lay + H));
        uint64_t rd[2] = {(uint64_t)n, (uint64_t)sg->route_k};
        for (int32_t l = 0; l < sg->n_moe_layers; l++) {
            ARL_TRY(arl_blob_encode(ARL_BLOB_ROUTES, sg->route_dtype, 2, rd,
                                    (const uint8_t *)sg->routes + (size_t)l * lay, w->scratch,
                                    w->scratch_cap, &got));
            ARL_TRY(wstmt(w, W_INS_ROUTE, &q));
            sqlite3_bind_int64(q, 1, traj_id);
            sqlite3_bind_int(q, 2, sg->seg_index);
            sqlite3_bind_int(q, 3, l);
            sqlite3_bind_blob64(q, 4, w->scratch, got, SQLITE_STATIC);
            ARL_TRY(wrun(w, q, "inserting routes"));
        }
    }
    int64_t n_turns = 0;
    for (size_t i = 0; i < sg->n_turns; i++) {
        const replay_turn *tu = &sg->turns[i];
        if (tu->step_index >= 1) n_turns++;
        if (tu->step_index != 0 &&
            (tu->step_index < sg->first_step || tu->step_index > sg->last_step))
            return arl_errorf(ARL_ERR_ARG, "replay: %s: segment %d holds steps %d..%d, not turn %d",
                              w->file, (int)sg->seg_index, (int)sg->first_step, (int)sg->last_step,
                              (int)tu->step_index);
        ARL_TRY(wstmt(w, W_INS_TURN, &q));
        sqlite3_bind_int64(q, 1, traj_id);
        sqlite3_bind_int(q, 2, tu->step_index);
        sqlite3_bind_int(q, 3, tu->step_index == 0 ? 0 : sg->seg_index);
        rdb_bind_int_or_null(q, 4, tu->act_tok_start);
        rdb_bind_int_or_null(q, 5, tu->act_tok_end);
        rdb_bind_int_or_null(q, 6, tu->obs_seg_index);
        rdb_bind_int_or_null(q, 7, tu->obs_tok_start);
        rdb_bind_int_or_null(q, 8, tu->obs_tok_end);
        rdb_bind_int_or_null(q, 9, tu->policy_version);
        rdb_bind_text(q, 10, tu->finish_reason);
        rdb_bind_text(q, 11, tu->parse_status);
        sqlite3_bind_int(q, 12, tu->n_tool_calls);
        rdb_bind_text(q, 13, tu->context);
        rdb_bind_real_or_null(q, 14, tu->reward);
        sqlite3_bind_int(q, 15, tu->terminated ? 1 : 0);
        sqlite3_bind_int(q, 16, tu->truncated ? 1 : 0);
        rdb_bind_text(q, 17, tu->anchor);
        sqlite3_bind_int64(q, 18, tu->call_seq);
        sqlite3_bind_int64(q, 19, tu->started_at_ms);
        sqlite3_bind_int64(q, 20, tu->finished_at_ms);
        rdb_bind_text(q, 21, tu->action_json);
        ARL_TRY(wrun(w, q, "inserting a turn"));
    }
    for (size_t i = 0; i < sg->n_env_calls; i++)
        ARL_TRY(insert_env_call(w, traj_id, &sg->env_calls[i]));
    for (size_t i = 0; i < sg->n_tool_calls; i++) {
        const replay_tool_call *c = &sg->tool_calls[i];
        ARL_TRY(wstmt(w, W_INS_TOOL, &q));
        sqlite3_bind_int64(q, 1, traj_id);
        sqlite3_bind_int(q, 2, c->step_index);
        sqlite3_bind_int(q, 3, c->call_index);
        rdb_bind_text(q, 4, c->call_id);
        rdb_bind_text(q, 5, c->name);
        rdb_bind_text(q, 6, c->parse_status);
        rdb_bind_int_or_null(q, 7, c->result_is_error);
        rdb_bind_text(q, 8, c->result_error_code);
        rdb_bind_int_or_null(q, 9, c->result_bytes);
        rdb_bind_int_or_null(q, 10, c->result_truncated);
        rdb_bind_text(q, 11, c->arguments_json);
        ARL_TRY(wrun(w, q, "inserting a tool call"));
    }
    ARL_TRY(insert_rewards(w, traj_id, sg->rewards, sg->n_rewards));
    ARL_TRY(wstmt(w, W_UPD_COUNTS, &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int64(q, 2, n_turns);
    sqlite3_bind_int64(q, 3, n);
    sqlite3_bind_int64(q, 4, n_act);
    sqlite3_bind_int64(q, 5, vmin);
    sqlite3_bind_int64(q, 6, vmax);
    rdb_bind_text(q, 7, sg->session_id);
    sqlite3_bind_int64(q, 8, now);
    ARL_TRY(wrun(w, q, "updating trajectory counters"));
    char detail[96];
    snprintf(detail, sizeof detail, "{\"seg_index\":%d,\"n_tokens\":%lld}", (int)sg->seg_index,
             (long long)n);
    return add_event(w, traj_id, "segment_committed", detail);
}

arl_status replay_segment_append(replay_writer *w, int64_t traj_id, const replay_segment_desc *sg) {
    traj_state t;
    ARL_TRY(rdb_begin(&w->w));
    arl_status s = load_traj(w, traj_id, &t);
    if (s == ARL_OK && t.status != REPLAY_RUNNING)
        s = arl_errorf(ARL_ERR_STATE,
                       "replay: %s: trajectory %s is %s: segments are appended only "
                       "while it runs",
                       w->file, t.traj_uid, replay_status_name(t.status));
    if (s == ARL_OK) s = append_in_txn(w, traj_id, &t, sg);
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return s;
    }
    return rdb_commit(&w->w);
}

/* ---- C_end / C_mask ---- */

static const char *attribution_of(const char *code) {
    if (!code) return "none";
    if (!strcmp(code, "INTERRUPTED") || !strcmp(code, "RESUME_IMPOSSIBLE") ||
        !strcmp(code, "STORE_CORRUPT"))
        return "infra";
    if (!strcmp(code, "RESUME_DIVERGED")) return "env";
    return "none";
}

arl_status replay_traj_finish(replay_writer *w, int64_t traj_id, const replay_segment_desc *last,
                              const replay_finish *f) {
    const char *file = w->file;
    if (f->status != REPLAY_COMPLETE && f->status != REPLAY_TRUNCATED && f->status != REPLAY_MASKED)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: finish status must be complete, truncated or masked", file);
    if (!f->end_cause)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: finish needs an end_cause", file);
    double derived = NAN;
    for (size_t i = 0; i < f->n_rewards; i++)
        if (f->rewards[i].level && !strcmp(f->rewards[i].level, "outcome") &&
            f->rewards[i].component && !strcmp(f->rewards[i].component, "@derived"))
            derived = f->rewards[i].value;
    if (f->status == REPLAY_MASKED) {
        if (!f->error_code || !*f->error_code)
            return arl_errorf(ARL_ERR_ARG, "replay: %s: a masked trajectory needs an error_code",
                              file);
        if (last && strcmp(last->end_cause, "partial") && strcmp(last->end_cause, "end"))
            return arl_errorf(ARL_ERR_ARG,
                              "replay: %s: the last segment of a masked trajectory ends "
                              "'partial' or 'end', not '%s'",
                              file, last->end_cause);
    } else {
        if (!last || strcmp(last->end_cause, "end"))
            return arl_errorf(ARL_ERR_ARG,
                              "replay: %s: a %s trajectory ends with a last segment whose "
                              "end_cause is 'end' (section 7.4 invariant 5)",
                              file, replay_status_name(f->status));
        if (isnan(derived))
            return arl_errorf(ARL_ERR_ARG,
                              "replay: %s: a %s trajectory needs an outcome '@derived' "
                              "reward with a value (section 7.4 invariant 5)",
                              file, replay_status_name(f->status));
    }
    traj_state t;
    ARL_TRY(rdb_begin(&w->w));
    arl_status s = load_traj(w, traj_id, &t);
    if (s == ARL_OK && t.status != REPLAY_RUNNING)
        s = arl_errorf(ARL_ERR_STATE, "replay: %s: trajectory %s is already %s", file, t.traj_uid,
                       replay_status_name(t.status));
    if (s == ARL_OK && last) s = append_in_txn(w, traj_id, &t, last);
    for (size_t i = 0; s == ARL_OK && i < f->n_env_calls; i++)
        s = insert_env_call(w, traj_id, &f->env_calls[i]);
    if (s == ARL_OK) s = insert_rewards(w, traj_id, f->rewards, f->n_rewards);
    sqlite3_stmt *q;
    if (s == ARL_OK) s = wstmt(w, W_UPD_FINISH, &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, traj_id);
        sqlite3_bind_text(q, 2, replay_status_name(f->status), -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, f->end_cause, -1, SQLITE_STATIC);
        if (f->status == REPLAY_MASKED) {
            sqlite3_bind_text(q, 4, f->error_code, -1, SQLITE_STATIC);
            sqlite3_bind_text(
                q, 5, f->error_attribution ? f->error_attribution : attribution_of(f->error_code),
                -1, SQLITE_STATIC);
            rdb_bind_text(q, 6, f->error_detail_json);
        }
        rdb_bind_real_or_null(q, 7, isnan(f->outcome_reward) ? derived : f->outcome_reward);
        sqlite3_bind_int64(q, 8, rnow_ms());
        s = wrun(w, q, "finishing a trajectory");
    }
    if (s == ARL_OK) {
        char detail[256];
        if (f->status == REPLAY_MASKED)
            snprintf(detail, sizeof detail, "{\"from\":\"running\",\"error_code\":\"%.64s\"}",
                     f->error_code);
        else
            snprintf(detail, sizeof detail, "{\"from\":\"running\",\"to\":\"%s\"}",
                     replay_status_name(f->status));
        s = add_event(w, traj_id, f->status == REPLAY_MASKED ? "masked" : "status_changed", detail);
    }
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return s;
    }
    ARL_TRY(rdb_commit(&w->w));
    rcat_member_mirror(w->st, t.group_id, t.slot, t.attempt, t.traj_uid, w->shard_id, traj_id,
                       replay_status_name(f->status));
    return ARL_OK;
}

static int group_consumed(replay_store *st, int64_t group_id) {
    if (!st->cat.db) return 0;
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(st->cat.db, "SELECT status FROM task_groups WHERE group_id = ?1", -1, &q,
                           NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_int64(q, 1, group_id);
    int c = sqlite3_step(q) == SQLITE_ROW &&
            !strcmp((const char *)sqlite3_column_text(q, 0), "consumed");
    sqlite3_finalize(q);
    return c;
}

arl_status replay_traj_mask(replay_writer *w, int64_t traj_id, const char *error_code,
                            const char *attribution, const char *end_cause,
                            const char *detail_json) {
    if (!error_code || !*error_code)
        return arl_errorf(ARL_ERR_ARG, "replay: %s: masking needs an error code", w->file);
    traj_state t;
    ARL_TRY(rdb_begin(&w->w));
    arl_status s = load_traj(w, traj_id, &t);
    if (s == ARL_OK && t.status == REPLAY_MASKED)
        s = arl_errorf(ARL_ERR_STATE, "replay: %s: trajectory %s is already masked", w->file,
                       t.traj_uid);
    /* a running trajectory gets its end cause and finish time; a final one keeps them (8.2) */
    sqlite3_stmt *q = NULL;
    int post = 0;
    if (s == ARL_OK) {
        post = t.status != REPLAY_RUNNING && group_consumed(w->st, t.group_id);
        s = rdb_prepare(&w->w,
                        t.status == REPLAY_RUNNING
                            ? "UPDATE trajectories SET status = 'masked', end_cause = ?2, "
                              "error_code = ?3, error_attribution = ?4, error_detail_json = ?5, "
                              "finished_at_ms = ?6, updated_at_ms = ?6 WHERE traj_id = ?1"
                            : "UPDATE trajectories SET status = 'masked', error_code = ?3, "
                              "error_attribution = ?4, error_detail_json = ?5, updated_at_ms = ?6 "
                              "WHERE traj_id = ?1",
                        &q);
    }
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, traj_id);
        if (t.status == REPLAY_RUNNING)
            sqlite3_bind_text(q, 2, end_cause ? end_cause : "error", -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, error_code, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 4, attribution ? attribution : attribution_of(error_code), -1,
                          SQLITE_STATIC);
        rdb_bind_text(q, 5, detail_json);
        sqlite3_bind_int64(q, 6, rnow_ms());
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(&w->w, rc, "masking a trajectory");
    }
    sqlite3_finalize(q);
    if (s == ARL_OK) {
        char detail[256];
        snprintf(detail, sizeof detail, "{\"from\":\"%s\",\"error_code\":\"%.64s\"%s}",
                 replay_status_name(t.status), error_code,
                 post ? ",\"post_consumption\":true" : "");
        s = add_event(w, traj_id, "masked", detail);
    }
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return s;
    }
    ARL_TRY(rdb_commit(&w->w));
    rcat_member_mirror(w->st, t.group_id, t.slot, t.attempt, t.traj_uid, w->shard_id, traj_id,
                       "masked");
    return ARL_OK;
}

arl_status replay_traj_resume(replay_writer *w, int64_t traj_id, const char *session_id,
                              const char *detail_json) {
    traj_state t;
    ARL_TRY(rdb_begin(&w->w));
    arl_status s = load_traj(w, traj_id, &t);
    if (s == ARL_OK && t.status != REPLAY_RUNNING)
        s = arl_errorf(ARL_ERR_STATE, "replay: %s: trajectory %s is %s, not running", w->file,
                       t.traj_uid, replay_status_name(t.status));
    sqlite3_stmt *q = NULL;
    if (s == ARL_OK)
        s = rdb_prepare(&w->w,
                        "UPDATE trajectories SET session_id = coalesce(?2, session_id), "
                        "resume_count = resume_count + 1, updated_at_ms = ?3 WHERE traj_id = ?1",
                        &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, traj_id);
        rdb_bind_text(q, 2, session_id);
        sqlite3_bind_int64(q, 3, rnow_ms());
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(&w->w, rc, "recording a resume");
    }
    sqlite3_finalize(q);
    if (s == ARL_OK) s = add_event(w, traj_id, "resumed", detail_json);
    if (s != ARL_OK) {
        rdb_rollback(&w->w);
        return s;
    }
    return rdb_commit(&w->w);
}

arl_status replay_writer_recover(replay_writer *w, int mask_all, int64_t *n_masked,
                                 int64_t *n_resumable) {
    int64_t masked = 0, resumable = 0;
    for (size_t i = 0; i < w->n_interrupted; i++) {
        int64_t id = w->interrupted[i];
        traj_state t;
        ARL_TRY(rdb_begin(&w->w));
        arl_status s = load_traj(w, id, &t);
        rdb_rollback(&w->w);
        if (s == ARL_ERR_NOT_FOUND) continue;
        ARL_TRY(s);
        if (t.status != REPLAY_RUNNING) continue; /* already resolved */
        if (t.n_segments == 0 || mask_all) {
            char detail[96];
            snprintf(detail, sizeof detail, "{\"n_segments\":%d,\"by\":\"%s\"}", (int)t.n_segments,
                     mask_all ? "recover --mask" : "recover");
            ARL_TRY(replay_traj_mask(w, id, "INTERRUPTED", "infra", "interrupted", detail));
            masked++;
        } else {
            /* one 'interrupted' event per detection: skip if the last event already says so */
            sqlite3_stmt *q;
            ARL_TRY(
                rdb_prepare(&w->w,
                            "SELECT kind FROM trajectory_events WHERE traj_id = ?1 ORDER BY seq "
                            "DESC LIMIT 1",
                            &q));
            sqlite3_bind_int64(q, 1, id);
            int already = sqlite3_step(q) == SQLITE_ROW &&
                          !strcmp((const char *)sqlite3_column_text(q, 0), "interrupted");
            sqlite3_finalize(q);
            if (!already) {
                char detail[96];
                snprintf(detail, sizeof detail, "{\"n_segments\":%d}", (int)t.n_segments);
                ARL_TRY(replay_traj_event(w, id, "interrupted", detail));
            }
            resumable++;
        }
    }
    if (n_masked) *n_masked = masked;
    if (n_resumable) *n_resumable = resumable;
    return ARL_OK;
}

arl_status replay_writer_checkpoint(replay_writer *w) {
    rdb *d[2] = {&w->w, &w->s};
    rckpt *c[2] = {w->ckpt_w, w->ckpt_s};
    arl_status s = ARL_OK;
    for (int i = 0; i < 2; i++) {
        if (!d[i]->db) continue;
        int n_log, n_done, rc = rckpt_truncate(c[i], d[i], &n_log, &n_done);
        if (rc != SQLITE_OK && s == ARL_OK)
            s = rdb_fail(d[i], rc, "checkpointing the WAL (TRUNCATE)");
    }
    return s;
}

arl_status replay_writer_seal(replay_writer *w) {
    /* leaving WAL mode needs the only connection: the checkpointers go first */
    rckpt_stop(w->ckpt_w);
    rckpt_stop(w->ckpt_s);
    w->ckpt_w = w->ckpt_s = NULL;
    arl_status s = rdb_exec(&w->w, "PRAGMA wal_checkpoint(TRUNCATE)");
    if (s == ARL_OK) s = rdb_begin(&w->w);
    if (s == ARL_OK) s = rdb_meta_set(&w->w, "sealed", "1");
    if (s == ARL_OK) s = rdb_commit(&w->w);
    for (int i = 0; i < W_NSTMT; i++) {
        sqlite3_finalize(w->stmt[i]);
        w->stmt[i] = NULL;
    }
    if (s == ARL_OK) s = rdb_leave_wal(&w->w);
    if (s == ARL_OK && w->st->cat.db) {
        sqlite3_stmt *q;
        s = rdb_prepare(&w->st->cat, "UPDATE shards SET sealed_at_ms = ?2 WHERE shard_id = ?1", &q);
        if (s == ARL_OK) {
            sqlite3_bind_int(q, 1, w->shard_id);
            sqlite3_bind_int64(q, 2, rnow_ms());
            int rc = sqlite3_step(q);
            if (rc != SQLITE_DONE) s = rdb_fail(&w->st->cat, rc, "recording a sealed shard");
            sqlite3_finalize(q);
        }
    }
    replay_writer_close(w);
    return s;
}

/* ---- S_s ---- */

enum { S_FIND, S_INS, S_CHUNK, S_DONE };
static const char *const ssql[4] = {
    [S_FIND] =
        "SELECT state_id FROM states WHERE traj_uid = ?1 AND seg_index = ?2 AND kind = ?3 AND "
        "producer = ?4 AND pass_uid = ?5 AND status = 'complete'",
    [S_INS] = "INSERT INTO states(traj_uid, seg_index, kind, producer, pass_uid, version_min, "
              "version_max, "
              "numerics, routing, model_config_sha256, ctx_start, n_tokens, n_bytes, status, "
              "created_at_ms, "
              "last_used_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 0, "
              "'writing', ?13, ?13)",
    [S_CHUNK] = "INSERT INTO state_chunks(state_id, layer, tensor, row_start, data) VALUES (?1, "
                "?2, ?3, ?4, ?5)",
    [S_DONE] = "UPDATE states SET status = 'complete', n_bytes = ?2 WHERE state_id = ?1",
};

static arl_status sstmt(replay_writer *w, int i, sqlite3_stmt **out) {
    if (!w->sstmt[i]) ARL_TRY(rdb_prepare(&w->s, ssql[i], &w->sstmt[i]));
    sqlite3_reset(w->sstmt[i]);
    sqlite3_clear_bindings(w->sstmt[i]);
    *out = w->sstmt[i];
    return ARL_OK;
}

static arl_blob_kind chunk_kind(const char *tensor) {
    if (!tensor) return ARL_BLOB_KIND_ANY;
    if (!strcmp(tensor, "S")) return ARL_BLOB_KDA_STATE;
    if (!strcmp(tensor, "conv")) return ARL_BLOB_CONV_TAIL;
    if (!strcmp(tensor, "latent")) return ARL_BLOB_MLA_LATENT;
    return ARL_BLOB_KIND_ANY;
}

arl_status replay_state_put(replay_writer *w, const replay_state_desc *d,
                            const replay_state_chunk *chunks, size_t n_chunks, int64_t *state_id) {
    rdb *db = &w->s;
    const char *producer = d->producer                       ? d->producer
                           : w->kind == REPLAY_FILE_TOOL    ? "tool"
                           : w->kind == REPLAY_FILE_LEARNER ? "learner"
                                                            : "rollout";
    if (!d->traj_uid || !d->kind || !d->pass_uid || !d->numerics || !d->model_config_sha256)
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: a state needs traj_uid, kind, pass_uid, numerics "
                          "and model_config_sha256",
                          w->states_file);
    ARL_TRY(rdb_begin(db));
    sqlite3_stmt *q = NULL;
    int64_t now = rnow_ms(), total = 0;
    /* Idempotent: the same pass's state of the same segment (a retry after C_s failed) is the
     * one already stored. */
    arl_status s = sstmt(w, S_FIND, &q);
    if (s != ARL_OK) goto fail;
    sqlite3_bind_text(q, 1, d->traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, d->seg_index);
    sqlite3_bind_text(q, 3, d->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, producer, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, d->pass_uid, -1, SQLITE_STATIC);
    if (sqlite3_step(q) == SQLITE_ROW) {
        *state_id = sqlite3_column_int64(q, 0);
        sqlite3_reset(q);
        rdb_rollback(db);
        return ARL_OK;
    }
    sqlite3_reset(q);
    if ((s = sstmt(w, S_INS, &q)) != ARL_OK) goto fail;
    sqlite3_bind_text(q, 1, d->traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, d->seg_index);
    sqlite3_bind_text(q, 3, d->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, producer, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 5, d->pass_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 6, d->version_min);
    sqlite3_bind_int64(q, 7, d->version_max);
    sqlite3_bind_text(q, 8, d->numerics, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 9, d->routing ? d->routing : "replay", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 10, d->model_config_sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 11, d->ctx_start);
    sqlite3_bind_int64(q, 12, d->n_tokens);
    sqlite3_bind_int64(q, 13, now);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        s = rdb_fail(db, rc, "inserting a state");
        goto fail;
    }
    int64_t id = sqlite3_last_insert_rowid(db->db);
    for (size_t i = 0; i < n_chunks; i++) {
        const replay_state_chunk *c = &chunks[i];
        arl_blob_kind want = chunk_kind(c->tensor);
        if (want == ARL_BLOB_KIND_ANY) {
            s = arl_errorf(ARL_ERR_ARG,
                           "replay: %s: state chunk %zu: tensor must be S, conv or latent",
                           w->states_file, i);
            goto fail;
        }
        const void *blob = c->blob;
        size_t len = c->blob_nbytes;
        if (blob) {
            arl_blob_expect ex = {.kind = want};
            arl_blob_header h;
            if ((s = arl_blob_check(blob, len, &ex, &h, NULL)) != ARL_OK) {
                arl_error_prefix(s, "replay: %s: state chunk %zu (layer %d, %s)", w->states_file, i,
                                 (int)c->layer, c->tensor);
                goto fail;
            }
        } else {
            if (c->kind != want) {
                s = arl_errorf(ARL_ERR_ARG, "replay: %s: state chunk %zu: tensor %s needs kind %s",
                               w->states_file, i, c->tensor, arl_blob_kind_name(want));
                goto fail;
            }
            uint64_t nb;
            if ((s = arl_blob_payload_size(c->dtype, c->ndim, c->dims, &nb)) != ARL_OK) goto fail;
            if ((s = replay_writer_scratch_reserve(w, (size_t)nb + ARL_BLOB_HEADER_SIZE)) != ARL_OK)
                goto fail;
            if ((s = arl_blob_encode(c->kind, c->dtype, c->ndim, c->dims, c->data, w->scratch,
                                     w->scratch_cap, &len)) != ARL_OK) {
                arl_error_prefix(s, "replay: %s: state chunk %zu", w->states_file, i);
                goto fail;
            }
            blob = w->scratch;
        }
        if (len > ARL_BLOB_MAX_BYTES + ARL_BLOB_HEADER_SIZE) {
            s = arl_errorf(ARL_ERR_RANGE,
                           "replay: %s: state chunk %zu is %zu bytes, over the 64 MiB "
                           "limit: split latent rows (section 5.4)",
                           w->states_file, i, len);
            goto fail;
        }
        if ((s = sstmt(w, S_CHUNK, &q)) != ARL_OK) goto fail;
        sqlite3_bind_int64(q, 1, id);
        sqlite3_bind_int(q, 2, c->layer);
        sqlite3_bind_text(q, 3, c->tensor, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 4, c->row_start);
        sqlite3_bind_blob64(q, 5, blob, len, SQLITE_STATIC);
        rc = sqlite3_step(q);
        sqlite3_reset(q);
        if (rc != SQLITE_DONE) {
            s = rdb_fail(db, rc, "inserting a state chunk");
            goto fail;
        }
        total += (int64_t)len;
    }
    if ((s = sstmt(w, S_DONE, &q)) != ARL_OK) goto fail;
    sqlite3_bind_int64(q, 1, id);
    sqlite3_bind_int64(q, 2, total);
    rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        s = rdb_fail(db, rc, "completing a state");
        goto fail;
    }
    ARL_TRY(rdb_commit(db));
    *state_id = id;
    return ARL_OK;
fail:
    rdb_rollback(db);
    return s;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A learner file's states are referenced by its learner records (section 7.6: "no committed
 * segment or learner record references"): a record of the same trajectory and segment (the
 * segment a kda_boundary state ends, or whose mla_segment entries it holds).  Likewise the
 * states a re-score saved in a tool file (producer 'tool', spec 13.6 step 3) are referenced by
 * its rescores rows of the same trajectory and segment.  *ref = 1 if one exists. */
static arl_status record_state_referenced(replay_writer *w, sqlite3_stmt **q, const char *uid,
                                          int32_t seg, int *ref) {
    if (!*q)
        ARL_TRY(rdb_prepare(&w->w,
                            w->kind == REPLAY_FILE_LEARNER
                                ? "SELECT 1 FROM learner_records WHERE traj_uid = ?1 AND "
                                  "seg_index = ?2 LIMIT 1"
                                : "SELECT 1 FROM rescores WHERE traj_uid = ?1 AND seg_index = ?2 "
                                  "LIMIT 1",
                            q));
    sqlite3_reset(*q);
    sqlite3_bind_text(*q, 1, uid, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(*q, 2, seg);
    int rc = sqlite3_step(*q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(&w->w, rc, "reading learner records");
    *ref = rc == SQLITE_ROW;
    sqlite3_reset(*q);
    return ARL_OK;
}

/* A learner file's state is also referenced when its trajectory's group is consumed (the
 * catalog, section 7.7): the update whose pi_old pass wrote it committed.  The learner file is
 * the learner's, with a record per consumed segment (section 2); with learner.records false
 * there are none, and the states keep-states kept on purpose would be garbage an hour later.
 * Which consumed trajectories keep them is state_cache.learner's to say (section 9.3, applied
 * by replay_states_retain), not the garbage rule's.  States of an update that never committed
 * stay garbage.  No catalog: not consumed.  *ref = 1 if consumed. */
static arl_status learner_state_consumed(replay_writer *w, sqlite3_stmt **q, const char *uid,
                                         int *ref) {
    *ref = 0;
    rdb *cat = &w->st->cat;
    if (!cat->db) return ARL_OK;
    if (!*q)
        ARL_TRY(rdb_prepare(cat,
                            "SELECT 1 FROM group_members m JOIN task_groups g ON g.group_id = "
                            "m.group_id WHERE m.traj_uid = ?1 AND g.status = 'consumed' LIMIT 1",
                            q));
    sqlite3_reset(*q);
    sqlite3_bind_text(*q, 1, uid, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(*q);
    *ref = rc == SQLITE_ROW;
    sqlite3_reset(*q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(cat, rc, "reading group status");
    return ARL_OK;
}

arl_status replay_states_gc(replay_writer *w, int64_t min_age_ms, int64_t *n_deleted) {
    int learner = w->kind == REPLAY_FILE_LEARNER;
    /* referenced state ids (segments of this shard; a learner file has none: its records
     * reference states by trajectory and segment, record_state_referenced) */
    int64_t *refs = NULL;
    size_t nref = 0, cap = 0;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&w->w,
                        learner ? "SELECT 0 WHERE 0"
                                : "SELECT end_state_id FROM segments WHERE end_state_id IS NOT NULL "
                                  "UNION SELECT latent_state_id FROM segments WHERE "
                                  "latent_state_id IS NOT NULL",
                        &q));
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (nref == cap) {
            cap = cap ? cap * 2 : 256;
            int64_t *p = realloc(refs, cap * sizeof *p);
            if (!p) {
                sqlite3_finalize(q);
                free(refs);
                return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            }
            refs = p;
        }
        refs[nref++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) {
        free(refs);
        return rdb_fail(&w->w, rc, "listing referenced states");
    }
    if (nref > 1) qsort(refs, nref, sizeof *refs, cmp_i64);
    int64_t cutoff = rnow_ms() - min_age_ms, deleted = 0;
    rdb *db = &w->s;
    arl_status s = rdb_begin(db);
    sqlite3_stmt *sel = NULL, *dc = NULL, *ds = NULL, *lq = NULL, *cq = NULL;
    if (s == ARL_OK)
        s = rdb_prepare(
            db,
            "SELECT state_id, status, traj_uid, seg_index, producer FROM states WHERE status "
            "IN ('writing','complete') AND created_at_ms < ?1",
            &sel);
    if (s == ARL_OK) s = rdb_prepare(db, "DELETE FROM state_chunks WHERE state_id = ?1", &dc);
    if (s == ARL_OK) s = rdb_prepare(db, "DELETE FROM states WHERE state_id = ?1", &ds);
    if (s == ARL_OK) {
        sqlite3_bind_int64(sel, 1, cutoff);
        int64_t *victims = NULL;
        size_t nv = 0, vc = 0;
        while ((rc = sqlite3_step(sel)) == SQLITE_ROW) {
            int64_t id = sqlite3_column_int64(sel, 0);
            int writing = !strcmp((const char *)sqlite3_column_text(sel, 1), "writing");
            if (!writing && nref && bsearch(&id, refs, nref, sizeof *refs, cmp_i64)) continue;
            if (!writing &&
                (learner || (w->kind == REPLAY_FILE_TOOL &&
                             !strcmp((const char *)sqlite3_column_text(sel, 4), "tool")))) {
                int ref = 0;
                if ((s = record_state_referenced(w, &lq, (const char *)sqlite3_column_text(sel, 2),
                                                 sqlite3_column_int(sel, 3), &ref)) != ARL_OK)
                    break;
                if (!ref && learner &&
                    (s = learner_state_consumed(w, &cq, (const char *)sqlite3_column_text(sel, 2),
                                                &ref)) != ARL_OK)
                    break;
                if (ref) continue;
            }
            if (nv == vc) {
                vc = vc ? vc * 2 : 64;
                int64_t *p = realloc(victims, vc * sizeof *p);
                if (!p) { /* an error, rolled back: never fewer deletions reported as done */
                    s = arl_errorf(ARL_ERR_NOMEM,
                                   "replay: %s: out of memory listing states to "
                                   "delete",
                                   w->states_file);
                    break;
                }
                victims = p;
            }
            victims[nv++] = id;
        }
        if (s == ARL_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
            s = rdb_fail(db, rc, "listing states");
        for (size_t i = 0; s == ARL_OK && i < nv; i++) {
            sqlite3_reset(dc);
            sqlite3_bind_int64(dc, 1, victims[i]);
            rc = sqlite3_step(dc);
            if (rc == SQLITE_DONE) {
                sqlite3_reset(ds);
                sqlite3_bind_int64(ds, 1, victims[i]);
                rc = sqlite3_step(ds);
            }
            if (rc != SQLITE_DONE) s = rdb_fail(db, rc, "deleting a state");
            deleted++;
        }
        free(victims);
    }
    sqlite3_finalize(sel);
    sqlite3_finalize(dc);
    sqlite3_finalize(ds);
    sqlite3_finalize(lq);
    sqlite3_finalize(cq);
    free(refs);
    if (s != ARL_OK) {
        rdb_rollback(db);
        return s;
    }
    ARL_TRY(rdb_commit(db));
    /* return up to 1 GiB of free pages to the file system (section 7.6) */
    char vac[64];
    snprintf(vac, sizeof vac, "PRAGMA incremental_vacuum(%d)", (1 << 30) / RDB_PAGE_SIZE_STATES);
    ARL_TRY(rdb_exec(db, vac));
    if (n_deleted) *n_deleted = deleted;
    return ARL_OK;
}

/* ---- forks ---- */

arl_status replay_fork_begin(replay_writer *w, const char *parent_traj_uid, int32_t n_prefix,
                             const replay_traj_desc *d, int64_t *traj_id, replay_seg_ref *next) {
    if (n_prefix < 1)
        return arl_errorf(ARL_ERR_ARG, "replay: fork keeps S >= 1 segments, got %d", (int)n_prefix);
    replay_traj_row pr;
    ARL_TRY(replay_traj_get(w->st, parent_traj_uid, &pr));
    replay_seg_ref *refs = NULL;
    size_t n = 0;
    ARL_TRY(replay_traj_segments(w->st, pr.traj_id, &refs, &n));
    if ((size_t)n_prefix > n) {
        free(refs);
        return arl_errorf(ARL_ERR_RANGE,
                          "replay: fork of %s at --segment %d: it has %zu committed "
                          "segments",
                          parent_traj_uid, (int)n_prefix, n);
    }
    replay_seg_ref b = refs[n_prefix - 1];
    free(refs);
    replay_traj_desc c = *d;
    c.parent_traj_uid = parent_traj_uid;
    c.fork_seg_index = n_prefix - 1;
    ARL_TRY(replay_traj_begin(w, &c, traj_id));
    if (next) {
        memset(next, 0, sizeof *next);
        next->traj_id = *traj_id;
        next->seg_index = n_prefix;
        next->shard_id = w->shard_id;
        snprintf(next->traj_uid, sizeof next->traj_uid, "%s", d->traj_uid);
        snprintf(next->start_kind, sizeof next->start_kind, "fork");
        next->first_step = b.last_step + 1;
        next->tok_start = b.tok_start + b.n_tokens;
        next->ctx_start = b.ctx_start + b.n_tokens;
        next->end_state_id = b.end_state_id; /* the parent's boundary state (may be -1) */
        next->latent_state_id = -1;
    }
    return ARL_OK;
}
