/* rollout/store_read.c: the stored environment exchanges of one trajectory (in its worker or
 * tool file), read back for a resume (spec/replay.md 7.5 steps 3-4: the create request, the actions of steps 1..m and the
 * segment-score requests with their response hashes, and bodies with their images restored).
 *
 * A workaround, not a second store implementation: replay/replay.h has no reader for env_calls
 * rows yet, so this file queries the worker file read-only with the column names of
 * spec/replay.md 4.8 and 4.10.  It writes nothing.  Replace it with the replay module's reader
 * once there is one. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "envs/aep_json.h"
#include "rollout/store_read.h"

void ro_calls_free(ro_calls *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].request);
        free(c->v[i].response);
    }
    free(c->v);
    free(c->turn_call);
    memset(c, 0, sizeof *c);
}

static arl_status fail(sqlite3 *db, const char *path, const char *what) {
    return arl_errorf(ARL_ERR_DB, "rollout: %s: %s: %s", path, what, db ? sqlite3_errmsg(db) : "");
}

/* Replace the elided images of a stored body (spec/replay.md 4.10) by their base64 text. */
static arl_status restore_images(sqlite3 *db, const char *path, int64_t traj_id, int64_t seq,
                                 ro_call *c) {
    sqlite3_stmt *q;
    if (sqlite3_prepare_v2(db,
                           "SELECT r.body_offset, i.png FROM image_refs r JOIN images i ON "
                           "i.image_id = r.image_id WHERE r.traj_id = ?1 AND r.call_seq = ?2 "
                           "ORDER BY r.body_offset DESC",
                           -1, &q, NULL) != SQLITE_OK)
        return fail(db, path, "reading image_refs");
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int64(q, 2, seq);
    arl_status s = ARL_OK;
    while (s == ARL_OK && sqlite3_step(q) == SQLITE_ROW) { /* from the end: offsets stay valid */
        size_t off = (size_t)sqlite3_column_int64(q, 0);
        size_t b64n;
        char *b64 = aep_b64_encode(sqlite3_column_blob(q, 1), (size_t)sqlite3_column_bytes(q, 1),
                                   &b64n);
        const size_t ph = 71; /* "sha256:" + 64 hex digits */
        if (!b64 || off + ph > c->response_len) {
            free(b64);
            s = arl_errorf(ARL_ERR_CORRUPT, "rollout: %s: image reference outside call %lld's body",
                           path, (long long)seq);
            break;
        }
        char *nb = malloc(c->response_len - ph + b64n + 1);
        if (!nb) {
            free(b64);
            s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            break;
        }
        memcpy(nb, c->response, off);
        memcpy(nb + off, b64, b64n);
        memcpy(nb + off + b64n, c->response + off + ph, c->response_len - off - ph);
        c->response_len = c->response_len - ph + b64n;
        nb[c->response_len] = 0;
        free(c->response);
        c->response = nb;
        free(b64);
    }
    sqlite3_finalize(q);
    return s;
}

arl_status ro_calls_load(replay_store *st, int64_t traj_id, ro_calls *out) {
    memset(out, 0, sizeof *out);
    /* shard ids are unique over the kinds of files: a worker file w<id>, else a tool file
     * t<id> (imports, forks) or a learner file l<id> */
    char path[4200];
    static const char kinds[] = "wtl";
    for (int i = 0; i < 4; i++) { /* none there: the worker file's name, for the message */
        snprintf(path, sizeof path, "%s/shards/%c%d.sqlite", replay_store_root(st), kinds[i % 3],
                 (int)(traj_id >> REPLAY_TRAJ_ID_SHIFT));
        if (i < 3 && access(path, F_OK) == 0) break;
    }
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        arl_status s = fail(db, path, "opening");
        sqlite3_close(db);
        return s;
    }
    sqlite3_busy_timeout(db, 10000);
    arl_status s = ARL_OK;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT call_seq, endpoint, step_index, segment_index, http_status, "
                           "error_code, response_complete, response_sha256, request_body, "
                           "response_body FROM env_calls WHERE traj_id = ?1 ORDER BY call_seq",
                           -1, &q, NULL) != SQLITE_OK)
        s = fail(db, path, "reading env_calls");
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, traj_id);
        size_t cap = 0;
        while (sqlite3_step(q) == SQLITE_ROW) {
            if (out->n == cap) {
                cap = cap ? 2 * cap : 16;
                ro_call *v = realloc(out->v, cap * sizeof *v);
                if (!v) {
                    s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                    break;
                }
                out->v = v;
            }
            ro_call *c = &out->v[out->n++];
            memset(c, 0, sizeof *c);
            c->call_seq = sqlite3_column_int64(q, 0);
            snprintf(c->endpoint, sizeof c->endpoint, "%s", (const char *)sqlite3_column_text(q, 1));
            c->step_index = sqlite3_column_type(q, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 2);
            c->segment_index =
                sqlite3_column_type(q, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 3);
            c->http_status = sqlite3_column_type(q, 4) == SQLITE_NULL ? -1 : sqlite3_column_int(q, 4);
            c->has_error = sqlite3_column_type(q, 5) != SQLITE_NULL;
            c->complete = sqlite3_column_int(q, 6);
            if (sqlite3_column_bytes(q, 7) == 32) {
                memcpy(c->sha, sqlite3_column_blob(q, 7), 32);
                c->has_sha = 1;
            }
            for (int k = 0; k < 2; k++) {
                int n = sqlite3_column_bytes(q, 8 + k);
                const void *b = sqlite3_column_blob(q, 8 + k);
                if (!b) continue;
                char *p = malloc((size_t)n + 1);
                if (!p) {
                    s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                    break;
                }
                memcpy(p, b, (size_t)n);
                p[n] = 0;
                if (k == 0) {
                    c->request = p;
                    c->request_len = (size_t)n;
                } else {
                    c->response = p;
                    c->response_len = (size_t)n;
                }
            }
            if (s) break;
            if (c->response && c->complete) s = restore_images(db, path, traj_id, c->call_seq, c);
            if (s) break;
            if (c->call_seq > out->max_seq) out->max_seq = c->call_seq;
        }
    }
    sqlite3_finalize(q);
    q = NULL;
    /* the call of each step's turn (its action's canonical call) */
    if (s == ARL_OK &&
        sqlite3_prepare_v2(db, "SELECT step_index, call_seq FROM turns WHERE traj_id = ?1 ORDER BY "
                               "step_index",
                           -1, &q, NULL) != SQLITE_OK)
        s = fail(db, path, "reading turns");
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, traj_id);
        while (sqlite3_step(q) == SQLITE_ROW) {
            int64_t k = sqlite3_column_int64(q, 0);
            if (k >= out->n_turn_call) {
                int64_t c = k + 16;
                int64_t *v = realloc(out->turn_call, (size_t)c * sizeof *v);
                if (!v) {
                    s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                    break;
                }
                for (int64_t i = out->n_turn_call; i < c; i++) v[i] = -1;
                out->turn_call = v;
                out->n_turn_call = c;
            }
            out->turn_call[k] = sqlite3_column_int64(q, 1);
        }
    }
    sqlite3_finalize(q);
    sqlite3_close(db);
    if (s) ro_calls_free(out);
    return s;
}

const ro_call *ro_calls_find(const ro_calls *c, int64_t call_seq) {
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].call_seq == call_seq) return &c->v[i];
    return NULL;
}

const ro_call *ro_calls_step(const ro_calls *c, int64_t step) {
    if (step < 0 || step >= c->n_turn_call || c->turn_call[step] < 0) return NULL;
    return ro_calls_find(c, c->turn_call[step]);
}

const ro_call *ro_calls_segment_score(const ro_calls *c, int64_t seg) {
    const ro_call *best = NULL;
    for (size_t i = 0; i < c->n; i++) {
        const ro_call *x = &c->v[i];
        if (!strcmp(x->endpoint, "score_segment") && x->segment_index == seg && x->complete &&
            !x->has_error)
            best = x;
    }
    return best;
}

arl_status ro_call_action(const ro_call *c, arl_env_action *act, char *why, size_t why_size) {
    memset(act, 0, sizeof *act);
    if (why_size) why[0] = 0;
    const unsigned long n0 = arl_nomem_count();
    json_t *rq = c && c->request ? arl_json_loadb(c->request, c->request_len, 0, NULL) : NULL;
    if (!rq && arl_nomem_count() != n0)
        return arl_errorf(ARL_ERR_NOMEM, "out of memory reading a stored action");
    if (!rq) {
        snprintf(why, why_size, "no request body");
        return ARL_ERR_CORRUPT;
    }
    int bad = aep_action_from_json(json_object_get(rq, "action"), act, why, why_size);
    json_decref(rq);
    if (bad && arl_nomem_count() != n0) { /* this process's, not the stored body's */
        arl_env_action_clear(act);
        return arl_errorf(ARL_ERR_NOMEM, "out of memory reading a stored action");
    }
    if (bad) {
        arl_env_action_clear(act);
        if (why_size && !why[0]) snprintf(why, why_size, "no action in the request body");
        return ARL_ERR_CORRUPT;
    }
    return ARL_OK;
}
