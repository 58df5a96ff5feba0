/* replay/export.c: `export` and `import` (spec sections 13.3 and 14): one agentrl.trajectory/1
 * JSON line per trajectory; with --full, "rows" carries every row of the trajectory in the
 * worker tables and its catalog rows (BLOBs as base64, integer ids replaced by uids or content)
 * so that import into another store and a second export reproduce the line byte for byte. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/defer.h"
#include "core/json_dump.h"
#include "replay/codec.h"
#include "replay/select.h"

/* An export line is written only when everything it should hold went into it.  jansson's
 * builders fail quietly (json_object_set_new with a NULL value leaves the key out), a query
 * whose step fails looks like its last row, and a stored JSON text that cannot be parsed for
 * lack of memory would become null: each such failure sets exp_bad, which export_one checks
 * before it writes the line (an error, never a line missing a part that import would take for
 * the data).  jansson's own allocations are counted by core/json_dump.h's watch
 * (arl_json_alloc_failures, this thread's): one that failed while a line was built fails it. */
static _Thread_local int exp_bad;

static int xset(json_t *o, const char *key, json_t *v) {
    int r = json_object_set_new(o, key, v);
    if (r) exp_bad = 1;
    return r;
}

static int xappend(json_t *a, json_t *v) {
    int r = json_array_append_new(a, v);
    if (r) exp_bad = 1;
    return r;
}

/* rdb_prepare; a failure sets exp_bad (a look-up skipped on it would leave its keys out) */
static arl_status xprepare(rdb *d, const char *sql, sqlite3_stmt **q) {
    arl_status s = rdb_prepare(d, sql, q);
    if (s != ARL_OK) exp_bad = 1;
    return s;
}

/* sqlite3_step; an error (not a row, not the end) sets exp_bad */
static int xstep(sqlite3_stmt *q) {
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) exp_bad = 1;
    return rc;
}

static json_t *b64_json(const void *p, size_t n) {
    char *s = malloc(replay_base64_len(n) + 1);
    if (!s) {
        exp_bad = 1;
        return NULL;
    }
    replay_base64_encode((const uint8_t *)p, n, s);
    json_t *j = json_string(s);
    free(s);
    return j;
}

/* The tensor of a blob as base64 of its raw little-endian payload (no header): codec 1 is
 * inflated first.  A blob that does not parse is exported as it is stored after its 64 bytes
 * of header (verify reports it); NULL when there is none. */
static json_t *blob_payload_json(const uint8_t *b, size_t n) {
    arl_blob_header h;
    if (n < ARL_BLOB_HEADER_SIZE) return json_null();
    if (arl_blob_parse(b, n, &h, NULL) == ARL_OK && h.codec == ARL_BLOB_CODEC_DEFLATE) {
        uint64_t tn = arl_blob_tensor_nbytes(&h);
        void *t = malloc(tn ? (size_t)tn : 1);
        json_t *j = NULL;
        if (t && arl_blob_check_copy(b, n, NULL, &h, t, (size_t)tn) == ARL_OK)
            j = b64_json(t, (size_t)tn);
        free(t);
        if (j) return j;
    }
    return b64_json(b + ARL_BLOB_HEADER_SIZE, n - ARL_BLOB_HEADER_SIZE);
}

/* Column value as JSON (BLOB as base64). */
static json_t *col_json(sqlite3_stmt *q, int i) {
    switch (sqlite3_column_type(q, i)) {
    case SQLITE_INTEGER:
        return json_integer(sqlite3_column_int64(q, i));
    case SQLITE_FLOAT:
        return json_real(sqlite3_column_double(q, i));
    case SQLITE_TEXT:
        return json_stringn((const char *)sqlite3_column_text(q, i),
                            (size_t)sqlite3_column_bytes(q, i));
    case SQLITE_BLOB:
        return b64_json(sqlite3_column_blob(q, i), (size_t)sqlite3_column_bytes(q, i));
    default:
        return json_null();
    }
}

typedef struct id_subst {
    const char *col;
    json_t *value; /* borrowed */
} id_subst;

/* All rows of `sql` (one int64 parameter) as objects; columns named in subs are replaced. */
static arl_status rows_json(rdb *d, const char *sql, int64_t param, const id_subst *subs,
                            size_t nsubs, json_t *arr) {
    sqlite3_stmt *q;
    ARL_TRY(xprepare(d, sql, &q));
    sqlite3_bind_int64(q, 1, param);
    int rc;
    while ((rc = xstep(q)) == SQLITE_ROW) {
        json_t *o = json_object();
        int nc = sqlite3_column_count(q);
        for (int i = 0; i < nc; i++) {
            const char *name = sqlite3_column_name(q, i);
            json_t *v = NULL;
            for (size_t k = 0; k < nsubs; k++)
                if (!strcmp(subs[k].col, name)) v = json_incref(subs[k].value);
            xset(o, name, v ? v : col_json(q, i));
        }
        xappend(arr, o);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "exporting rows");
    return ARL_OK;
}

static json_t *parse_or_null(const char *s) {
    json_t *j = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    return j ? j : json_null();
}

/* Rewards of one level as the export's objects. */
static arl_status rewards_json(rdb *d, int64_t traj_id, const char *level, json_t *dst,
                               int as_list) {
    sqlite3_stmt *q;
    ARL_TRY(xprepare(d,
                     "SELECT scope_index, component, value FROM rewards WHERE traj_id = ?1 AND "
                     "level = ?2 AND source IN ('env','client') ORDER BY scope_index, component, "
                     "source DESC",
                     &q));
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_text(q, 2, level, -1, SQLITE_STATIC);
    json_t *cur = NULL;
    int64_t cur_scope = -1;
    int rc;
    while ((rc = xstep(q)) == SQLITE_ROW) {
        int64_t sc = sqlite3_column_int64(q, 0);
        if (!cur || sc != cur_scope) {
            cur = json_object();
            if (as_list) xset(cur, !strcmp(level, "segment") ? "index" : "step", json_integer(sc));
            xset(cur, "derived", json_null());
            xset(cur, "reward", json_null());
            xset(cur, "components", json_object());
            if (as_list)
                xappend(dst, cur);
            else
                xset(dst, level, cur);
            cur_scope = sc;
        }
        const char *comp = (const char *)sqlite3_column_text(q, 1);
        json_t *v = sqlite3_column_type(q, 2) == SQLITE_NULL
                        ? json_null()
                        : json_real(sqlite3_column_double(q, 2));
        if (!strcmp(comp, "@derived"))
            xset(cur, "derived", v);
        else if (!*comp)
            xset(cur, "reward", v);
        else
            xset(json_object_get(cur, "components"), comp, v);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "exporting rewards");
    if (!as_list && !json_object_get(dst, level)) xset(dst, level, json_null());
    return ARL_OK;
}

/* Stored response body of a call with images restored; NULL if none. Caller frees. */
static uint8_t *restored_body(rdb *d, int64_t traj_id, int64_t call_seq, const void *b, size_t n,
                              size_t *out_n) {
    sqlite3_stmt *q;
    if (xprepare(d,
                 "SELECT r.body_offset, i.png FROM image_refs r JOIN images i ON i.image_id = "
                 "r.image_id WHERE r.traj_id = ?1 AND r.call_seq = ?2 ORDER BY r.body_offset",
                 &q) != ARL_OK) {
        exp_bad = 1;
        return NULL;
    }
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int64(q, 2, call_seq);
    rimage_ref refs[64];
    uint8_t *copies[64];
    size_t nr = 0;
    while (nr < 64 && xstep(q) == SQLITE_ROW) {
        size_t pn = (size_t)sqlite3_column_bytes(q, 1);
        copies[nr] = malloc(pn ? pn : 1);
        if (!copies[nr]) {
            exp_bad = 1;
            break;
        }
        memcpy(copies[nr], sqlite3_column_blob(q, 1), pn);
        refs[nr] = (rimage_ref){(size_t)sqlite3_column_int64(q, 0), copies[nr], pn};
        nr++;
    }
    sqlite3_finalize(q);
    uint8_t *out = NULL;
    if (rimages_restore(b, n, refs, nr, &out, out_n) != ARL_OK) {
        out = NULL;
        exp_bad = 1;
    }
    for (size_t i = 0; i < nr; i++)
        free(copies[i]);
    return out;
}

static void append_messages(json_t *msgs, json_t *obs, int32_t next_seg, int is_step) {
    if (!obs) return;
    const char *ctx = json_string_value(json_object_get(obs, "context"));
    if (is_step && ctx && !strcmp(ctx, "reset"))
        xappend(msgs, json_pack("{sssi}", "role", "context_reset", "segment", (int)next_seg));
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(obs, "messages"), i, m) json_array_append(msgs, m);
}

static json_t *assistant_json(const char *action_json, int32_t step, int32_t seg) {
    json_t *a = action_json ? json_loads(action_json, 0, NULL) : NULL;
    json_t *m = json_object();
    xset(m, "role", json_string("assistant"));
    xset(m, "step", json_integer(step));
    xset(m, "segment", json_integer(seg));
    json_t *content = json_object_get(a, "content");
    xset(m, "content", json_is_string(content) ? json_incref(content) : json_string(""));
    json_t *r = json_object_get(a, "reasoning");
    if (json_is_string(r)) json_object_set(m, "reasoning", r);
    json_t *tcs = json_object_get(a, "tool_calls");
    if (json_array_size(tcs)) {
        json_t *arr = json_array();
        size_t i;
        json_t *c;
        json_array_foreach(tcs, i, c) {
            char *args = rjson_dumps(json_object_get(c, "arguments"));
            xappend(arr, json_pack("{sOsss{sOss}}", "id", json_object_get(c, "id"), "type",
                                   "function", "function", "name", json_object_get(c, "name"),
                                   "arguments", args ? args : "{}"));
            free(args);
        }
        xset(m, "tool_calls", arr);
    }
    json_t *pe = json_object_get(a, "parse_errors");
    json_t *ps = json_object_get(a, "parse_status");
    if (ps) json_object_set(m, "parse_status", ps);
    json_t *fr = json_object_get(a, "finish_reason");
    if (fr) json_object_set(m, "finish_reason", fr);
    if (json_array_size(pe)) json_object_set(m, "parse_errors", pe);
    json_decref(a);
    return m;
}

static arl_status catalog_rows(replay_store *st, const replay_traj_row *t, json_t *ids_run,
                               json_t *ids_group, json_t *ids_task, json_t *ids_env, json_t *cat) {
    if (!st->cat.db) return ARL_OK;
    struct {
        const char *name, *sql;
        int64_t id;
    } q[] = {{"runs", "SELECT * FROM runs WHERE run_id = ?1", t->run_id},
             {"envs", "SELECT * FROM envs WHERE env_id = ?1", t->env_id},
             {"tasks", "SELECT * FROM tasks WHERE task_id = ?1", t->task_id},
             {"task_groups", "SELECT * FROM task_groups WHERE group_id = ?1", t->group_id}};
    id_subst subs[] = {
        {"run_id", ids_run}, {"group_id", ids_group}, {"task_id", ids_task}, {"env_id", ids_env}};
    for (size_t i = 0; i < 4; i++) {
        json_t *arr = json_array();
        arl_status s = rows_json(&st->cat, q[i].sql, q[i].id, subs, 4, arr);
        if (s != ARL_OK) {
            json_decref(arr);
            return s;
        }
        json_object_set(cat, q[i].name,
                        json_array_size(arr) ? json_array_get(arr, 0) : json_null());
        json_decref(arr);
    }
    return ARL_OK;
}

static arl_status learner_json(replay_store *st, const char *traj_uid, json_t *arr) {
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind != REPLAY_FILE_LEARNER && sh->kind != REPLAY_FILE_TOOL) continue;
        rdb *d;
        ARL_TRY(rstore_shard_db(st, sh, &d));
        sqlite3_stmt *q;
        ARL_TRY(
            xprepare(d,
                     "SELECT update_n, seg_index, levels_json, mask_reason, old_logprobs, "
                     "ref_logprobs, is_weights, token_flags, advantages FROM learner_records WHERE "
                     "traj_uid = ?1 ORDER BY run_id, update_n, seg_index",
                     &q));
        sqlite3_bind_text(q, 1, traj_uid, -1, SQLITE_STATIC);
        static const char *const names[5] = {"old_logprobs", "ref_logprobs", "is_weights",
                                             "token_flags", "advantages"};
        while (xstep(q) == SQLITE_ROW) {
            json_t *o = json_object();
            xset(o, "update", json_integer(sqlite3_column_int64(q, 0)));
            xset(o, "segment", json_integer(sqlite3_column_int64(q, 1)));
            xset(o, "levels", parse_or_null((const char *)sqlite3_column_text(q, 2)));
            xset(o, "mask_reason", col_json(q, 3));
            for (int k = 0; k < 5; k++) {
                const uint8_t *b = sqlite3_column_blob(q, 4 + k);
                size_t n = (size_t)sqlite3_column_bytes(q, 4 + k);
                xset(o, names[k], blob_payload_json(b, n));
            }
            xappend(arr, o);
        }
        sqlite3_finalize(q);
    }
    return ARL_OK;
}

static arl_status export_one(replay_store *st, rshard *sh, rdb *d, const replay_traj_row *t,
                             const replay_export_opts *o, FILE *out) {
    arl_status s = ARL_OK;
    exp_bad = 0;
    const unsigned long jansson_failed = arl_json_alloc_failures();
    char run[300], group[300], task[300], env[128], ver[64];
    ARL_TRY(rcat_run_uid(st, t->run_id, run, sizeof run));
    ARL_TRY(rcat_group_uid(st, t->group_id, group, sizeof group));
    ARL_TRY(rcat_task_uid(st, t->task_id, task, sizeof task));
    ARL_TRY(rcat_env_name(st, t->env_id, env, sizeof env, ver, sizeof ver));
    json_t *j = json_object();
    xset(j, "format", json_string("agentrl.trajectory/1"));
    xset(j, "traj_uid", json_string(t->traj_uid));
    xset(j, "run_uid", json_string(run));
    xset(j, "group_uid", json_string(group));
    xset(j, "slot", json_integer(t->slot));
    /* task and env from the catalog */
    json_t *task_j = json_object(), *env_j = json_object();
    xset(task_j, "id", json_string(task));
    xset(env_j, "name", json_string(env));
    xset(env_j, "version", json_string(ver));
    if (st->cat.db) {
        sqlite3_stmt *q;
        if (xprepare(&st->cat, "SELECT seed, data_json FROM tasks WHERE task_id = ?1", &q) ==
            ARL_OK) {
            sqlite3_bind_int64(q, 1, t->task_id);
            if (xstep(q) == SQLITE_ROW) {
                xset(task_j, "seed", json_integer(sqlite3_column_int64(q, 0)));
                xset(task_j, "data", parse_or_null((const char *)sqlite3_column_text(q, 1)));
            }
            sqlite3_finalize(q);
        }
        if (xprepare(&st->cat, "SELECT info_sha256 FROM envs WHERE env_id = ?1", &q) == ARL_OK) {
            sqlite3_bind_int64(q, 1, t->env_id);
            if (xstep(q) == SQLITE_ROW)
                xset(env_j, "info_sha256", json_string((const char *)sqlite3_column_text(q, 0)));
            sqlite3_finalize(q);
        }
    }
    xset(j, "task", task_j);
    xset(j, "env", env_j);
    xset(j, "status", json_string(replay_status_name(t->status)));
    xset(j, "end_cause", t->end_cause[0] ? json_string(t->end_cause) : json_null());
    if (t->error_code[0]) {
        json_t *e = json_object();
        xset(e, "code", json_string(t->error_code));
        xset(e, "attribution", json_string(t->error_attribution));
        sqlite3_stmt *q;
        json_t *detail = json_null();
        if (xprepare(d, "SELECT error_detail_json FROM trajectories WHERE traj_id = ?1", &q) ==
            ARL_OK) {
            sqlite3_bind_int64(q, 1, t->traj_id);
            if (xstep(q) == SQLITE_ROW) {
                json_decref(detail);
                detail = parse_or_null((const char *)sqlite3_column_text(q, 0));
            }
            sqlite3_finalize(q);
        }
        xset(e, "detail", detail);
        xset(j, "error", e);
    } else {
        xset(j, "error", json_null());
    }
    xset(j, "versions",
         t->min_version >= 0
             ? json_pack("[II]", (json_int_t)t->min_version, (json_int_t)t->max_version)
             : json_null());
    xset(j, "counts",
         json_pack("{sisisIsI}", "turns", (int)t->n_turns, "segments", (int)t->n_segments, "tokens",
                   (json_int_t)t->n_tokens, "action_tokens", (json_int_t)t->n_action_tokens));
    json_t *rw = json_object(), *segr = json_array(), *procr = json_array();
    if ((s = rewards_json(d, t->traj_id, "outcome", rw, 0)) == ARL_OK &&
        (s = rewards_json(d, t->traj_id, "segment", segr, 1)) == ARL_OK)
        s = rewards_json(d, t->traj_id, "process", procr, 1);
    xset(rw, "segment", segr);
    xset(rw, "process", procr);
    xset(j, "rewards", rw);
    /* segments, tokens */
    json_t *segs = json_array(), *toks = json_array();
    sqlite3_stmt *q = NULL;
    if (s == ARL_OK)
        s = xprepare(d,
                     "SELECT seg_index, start_kind, end_cause, first_step, last_step, tok_start, "
                     "n_tokens, min_version, max_version FROM segments WHERE traj_id = ?1 ORDER BY "
                     "seg_index",
                     &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, t->traj_id);
        while (xstep(q) == SQLITE_ROW) {
            int64_t a = sqlite3_column_int64(q, 5), n = sqlite3_column_int64(q, 6);
            xappend(segs, json_pack("{sisssss[ii]s[II]s[II]}", "index", sqlite3_column_int(q, 0),
                                    "start_kind", (const char *)sqlite3_column_text(q, 1),
                                    "end_cause", (const char *)sqlite3_column_text(q, 2), "steps",
                                    sqlite3_column_int(q, 3), sqlite3_column_int(q, 4),
                                    "token_range", (json_int_t)a, (json_int_t)(a + n), "versions",
                                    (json_int_t)sqlite3_column_int64(q, 7),
                                    (json_int_t)sqlite3_column_int64(q, 8)));
            if (o->tokens || o->full) {
                replay_seg_data sd = {0};
                s = replay_segment_load(st, t->traj_id, sqlite3_column_int(q, 0),
                                        REPLAY_LOAD_TOKENS, &sd);
                if (s != ARL_OK) {
                    replay_seg_data_free(&sd);
                    break;
                }
                size_t nn = (size_t)sd.ref.n_tokens;
                xappend(toks, json_pack("{siso so so so}", "index", sqlite3_column_int(q, 0), "ids",
                                        b64_json(sd.tokens, nn * 4), "logprobs",
                                        b64_json(sd.logprobs, nn * 4), "loss_mask",
                                        b64_json(sd.loss_mask, nn), "versions",
                                        b64_json(sd.versions, nn * 4)));
                replay_seg_data_free(&sd);
            }
        }
        sqlite3_finalize(q);
        q = NULL;
    }
    xset(j, "segments", segs);
    /* messages and raw calls */
    json_t *msgs = json_array(), *calls = json_array();
    if (s == ARL_OK)
        s = xprepare(d,
                     "SELECT u.step_index, u.seg_index, u.action_json, c.response_body, "
                     "c.response_complete, c.call_seq FROM turns u LEFT JOIN env_calls c ON "
                     "c.traj_id = u.traj_id AND c.call_seq = u.call_seq WHERE u.traj_id = ?1 "
                     "ORDER BY u.step_index",
                     &q);
    if (s == ARL_OK) {
        sqlite3_bind_int64(q, 1, t->traj_id);
        while (xstep(q) == SQLITE_ROW) {
            int32_t step = sqlite3_column_int(q, 0), seg = sqlite3_column_int(q, 1);
            if (step > 0)
                xappend(msgs, assistant_json((const char *)sqlite3_column_text(q, 2), step, seg));
            const void *b = sqlite3_column_blob(q, 3);
            if (b && sqlite3_column_int(q, 4)) {
                size_t fn;
                uint8_t *full = restored_body(d, t->traj_id, sqlite3_column_int64(q, 5), b,
                                              (size_t)sqlite3_column_bytes(q, 3), &fn);
                json_t *resp = full ? json_loadb((const char *)full, fn, 0, NULL) : NULL;
                append_messages(msgs, json_object_get(resp, "observation"), seg + 1, step > 0);
                json_decref(resp);
                free(full);
            }
        }
        sqlite3_finalize(q);
        q = NULL;
    }
    xset(j, "messages", msgs);
    if (s == ARL_OK && (o->tokens || o->full)) json_object_set(j, "tokens", toks);
    if (s == ARL_OK && (o->learner || o->full)) {
        json_t *lr = json_array();
        s = learner_json(st, t->traj_uid, lr);
        xset(j, "learner", lr);
    }
    if (s == ARL_OK && (o->raw || o->full)) {
        s = xprepare(d,
                     "SELECT endpoint, step_index, http_status, error_code, request_body, "
                     "response_body, call_seq FROM env_calls WHERE traj_id = ?1 ORDER BY call_seq",
                     &q);
        if (s == ARL_OK) {
            sqlite3_bind_int64(q, 1, t->traj_id);
            while (xstep(q) == SQLITE_ROW) {
                json_t *c = json_object();
                xset(c, "endpoint", col_json(q, 0));
                xset(c, "step", col_json(q, 1));
                xset(c, "http_status", col_json(q, 2));
                xset(c, "error_code", col_json(q, 3));
                xset(c, "request_b64", col_json(q, 4));
                const void *b = sqlite3_column_blob(q, 5);
                json_t *rb = json_null();
                if (b) {
                    size_t fn;
                    uint8_t *full = restored_body(d, t->traj_id, sqlite3_column_int64(q, 6), b,
                                                  (size_t)sqlite3_column_bytes(q, 5), &fn);
                    if (full) {
                        json_decref(rb);
                        rb = b64_json(full, fn);
                    }
                    free(full);
                }
                xset(c, "response_b64", rb);
                xappend(calls, c);
            }
            sqlite3_finalize(q);
            q = NULL;
        }
        json_object_set(j, "env_calls", calls);
    }
    if (s == ARL_OK && o->full) {
        json_t *rows = json_object();
        json_t *uid = json_string(t->traj_uid), *ids_run = json_string(run),
               *ids_group = json_string(group), *ids_task = json_string(task),
               *ids_env = json_string(env);
        /* States are a cache and are not exported: their ids (local to a states file) become
         * null, so an imported segment is a cache miss instead of a dangling reference. */
        json_t *jnull = json_null();
        id_subst subs[] = {{"traj_id", uid},          {"run_id", ids_run}, {"group_id", ids_group},
                           {"task_id", ids_task},     {"env_id", ids_env}, {"end_state_id", jnull},
                           {"latent_state_id", jnull}};
        struct {
            const char *table, *sql;
        } tabs[] = {
            {"trajectories", "SELECT * FROM trajectories WHERE traj_id = ?1"},
            {"segments", "SELECT * FROM segments WHERE traj_id = ?1 ORDER BY seg_index"},
            {"segment_routes",
             "SELECT * FROM segment_routes WHERE traj_id = ?1 ORDER BY seg_index, moe_layer"},
            {"turns", "SELECT * FROM turns WHERE traj_id = ?1 ORDER BY step_index"},
            {"env_calls", "SELECT * FROM env_calls WHERE traj_id = ?1 ORDER BY call_seq"},
            {"tool_calls",
             "SELECT * FROM tool_calls WHERE traj_id = ?1 ORDER BY step_index, call_index"},
            {"rewards", "SELECT * FROM rewards WHERE traj_id = ?1 ORDER BY level, scope_index, "
                        "component, source"},
            {"trajectory_events",
             "SELECT * FROM trajectory_events WHERE traj_id = ?1 ORDER BY seq"},
        };
        for (size_t i = 0; s == ARL_OK && i < sizeof tabs / sizeof *tabs; i++) {
            json_t *arr = json_array();
            s = rows_json(d, tabs[i].sql, t->traj_id, subs, 7, arr);
            xset(rows, tabs[i].table, arr);
        }
        /* learner records of the trajectory (learner and tool files), run_id as its run_uid:
         * import writes them into its tool file (spec section 4.13) */
        json_t *lrows = json_array();
        for (size_t k = 0; s == ARL_OK && k < st->n_shards; k++) {
            rshard *lsh = &st->shards[k];
            if (lsh->kind != REPLAY_FILE_LEARNER && lsh->kind != REPLAY_FILE_TOOL) continue;
            rdb *ld;
            if ((s = rstore_shard_db(st, lsh, &ld)) != ARL_OK) break;
            if ((s = xprepare(ld,
                              "SELECT * FROM learner_records WHERE traj_uid = ?1 ORDER BY "
                              "run_id, update_n, seg_index",
                              &q)) != ARL_OK)
                break;
            sqlite3_bind_text(q, 1, t->traj_uid, -1, SQLITE_STATIC);
            while (s == ARL_OK && xstep(q) == SQLITE_ROW) {
                json_t *o = json_object();
                for (int c = 0; s == ARL_OK && c < sqlite3_column_count(q); c++) {
                    const char *name = sqlite3_column_name(q, c);
                    if (!strcmp(name, "run_id")) {
                        char ru[300];
                        s = rcat_run_uid(st, sqlite3_column_int64(q, c), ru, sizeof ru);
                        xset(o, name, json_string(ru));
                    } else {
                        xset(o, name, col_json(q, c));
                    }
                }
                xappend(lrows, o);
            }
            sqlite3_finalize(q);
            q = NULL;
        }
        xset(rows, "learner_records", lrows);
        /* images by content: image_id becomes the PNG's SHA-256 (hex) */
        json_t *imgs = json_array(), *refs = json_array();
        if (s == ARL_OK)
            s = xprepare(
                d,
                "SELECT DISTINCT i.image_id, i.sha256, i.width, i.height, i.n_bytes, i.png FROM "
                "images i JOIN image_refs r ON r.image_id = i.image_id WHERE r.traj_id = ?1 "
                "ORDER BY i.sha256",
                &q);
        if (s == ARL_OK) {
            sqlite3_bind_int64(q, 1, t->traj_id);
            while (xstep(q) == SQLITE_ROW) {
                char hex[65];
                replay_hex_encode(sqlite3_column_blob(q, 1), 32, hex);
                xappend(imgs,
                        json_pack("{sssosIsIsIso}", "image_id", hex, "sha256", col_json(q, 1),
                                  "width", (json_int_t)sqlite3_column_int64(q, 2), "height",
                                  (json_int_t)sqlite3_column_int64(q, 3), "n_bytes",
                                  (json_int_t)sqlite3_column_int64(q, 4), "png", col_json(q, 5)));
            }
            sqlite3_finalize(q);
            q = NULL;
            s = xprepare(
                d,
                "SELECT r.call_seq, r.body_offset, i.sha256 FROM image_refs r JOIN images i ON "
                "i.image_id = r.image_id WHERE r.traj_id = ?1 ORDER BY r.call_seq, r.body_offset",
                &q);
        }
        if (s == ARL_OK) {
            sqlite3_bind_int64(q, 1, t->traj_id);
            while (xstep(q) == SQLITE_ROW) {
                char hex[65];
                replay_hex_encode(sqlite3_column_blob(q, 2), 32, hex);
                xappend(refs, json_pack("{sssIsIss}", "traj_id", t->traj_uid, "call_seq",
                                        (json_int_t)sqlite3_column_int64(q, 0), "body_offset",
                                        (json_int_t)sqlite3_column_int64(q, 1), "image_id", hex));
            }
            sqlite3_finalize(q);
            q = NULL;
        }
        xset(rows, "images", imgs);
        xset(rows, "image_refs", refs);
        json_t *cat = json_object();
        if (s == ARL_OK) s = catalog_rows(st, t, ids_run, ids_group, ids_task, ids_env, cat);
        xset(rows, "catalog", cat);
        xset(j, "rows", rows);
        json_decref(uid);
        json_decref(ids_run);
        json_decref(ids_group);
        json_decref(ids_task);
        json_decref(ids_env);
    }
    json_decref(toks);
    json_decref(calls);
    (void)sh;
    if (s == ARL_OK && (exp_bad || arl_json_alloc_failures() != jansson_failed))
        s = arl_errorf(ARL_ERR_NOMEM,
                       "replay: export: out of memory (or a failed read) building the line of "
                       "trajectory %s: nothing written for it",
                       t->traj_uid);
    if (s == ARL_OK) {
        rjson_dump(j, out);
        fputc('\n', out);
        if (ferror(out)) s = arl_errorf(ARL_ERR_IO, "replay: export: write error (disk full?)");
    }
    json_decref(j);
    return s;
}

arl_status replay_export(replay_store *st, const replay_filter *f, const replay_export_opts *o,
                         FILE *out, int64_t *n_out) {
    replay_export_opts none = {0};
    if (!o) o = &none;
    rsel sel;
    ARL_TRY(rsel_init(st, f, &sel));
    char *sql = rsel_sql(&sel, "SELECT " RTRAJ_COLS " FROM trajectories t", " ORDER BY t.traj_id");
    arl_status s =
        sql ? replay_store_refresh(st) : arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    int64_t count = 0;
    for (size_t i = 0; s == ARL_OK && i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind == REPLAY_FILE_LEARNER) continue;
        rdb *d;
        sqlite3_stmt *q;
        if ((s = rstore_shard_db(st, sh, &d)) != ARL_OK) break;
        if ((s = rstore_prepare(st, d, sql, &q)) != ARL_OK) break;
        rsel_bind(&sel, q);
        /* collect the rows first: the export's own queries must not run inside this one */
        replay_traj_row *rows = NULL;
        size_t n = 0, cap = 0;
        int rc;
        while ((rc = xstep(q)) == SQLITE_ROW) {
            if (sel.f.limit > 0 && count + (int64_t)n >= sel.f.limit) break;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                replay_traj_row *p = realloc(rows, cap * sizeof *p);
                if (!p) {
                    s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
                    break;
                }
                rows = p;
            }
            rtraj_fill(q, sh->shard_id, &rows[n++]);
        }
        if (s == ARL_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
            s = rdb_fail(d, rc, "selecting trajectories");
        sqlite3_finalize(q);
        /* each trajectory from one snapshot of its file, its row read again in it: a writer's
         * commits between the selection and the export (a running trajectory's segments, its
         * end) made the header disagree with what followed */
        for (size_t k = 0; s == ARL_OK && k < n; k++) {
            replay_traj_row t;
            rdb_read_begin(d);
            s = replay_traj_get_id(st, rows[k].traj_id, &t);
            if (s == ARL_OK) s = export_one(st, sh, d, &t, o, out);
            rdb_read_end(d);
            count++;
        }
        free(rows);
    }
    free(sql);
    rsel_free(&sel);
    if (n_out) *n_out = count;
    return s;
}

/* ---- import ---- */

/* Declared type of a column ("BLOB", "INTEGER", ...) of table in d; "" if unknown. */
static int col_is_blob(rdb *d, const char *table, const char *col) {
    const char *decl = NULL;
    sqlite3_table_column_metadata(d->db, NULL, table, col, &decl, NULL, NULL, NULL, NULL);
    return decl && !strcmp(decl, "BLOB");
}

typedef struct int_subst {
    const char *col;
    int64_t value;
} int_subst;

/* 1 if key names a column of table in d: an SQL identifier (letters, digits, '_') that the
 * table declares.  The keys of an imported row become the column list of an INSERT, so anything
 * else (a line from another schema, or text made to change the statement) is refused. */
static int col_exists(rdb *d, const char *table, const char *key) {
    if (!*key || isdigit((unsigned char)*key)) return 0;
    for (const char *c = key; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '_') return 0;
    return sqlite3_table_column_metadata(d->db, NULL, table, key, NULL, NULL, NULL, NULL, NULL) ==
           SQLITE_OK;
}

/* Insert the JSON row into table (columns = its keys minus `skip`, each a column of the table),
 * with integer substitutions; conflict is appended (e.g. "ON CONFLICT(run_uid) DO NOTHING"). */
static arl_status insert_row(rdb *d, const char *table, json_t *row, const int_subst *subs,
                             size_t nsubs, const char *skip, const char *conflict,
                             const char *where) {
    if (!json_is_object(row))
        return arl_errorf(ARL_ERR_FORMAT, "%s: rows.%s: expected an object", where, table);
    char sql[4096];
    size_t o = (size_t)snprintf(sql, sizeof sql, "INSERT INTO %s(", table);
    const char *key;
    json_t *v;
    int n = 0;
    json_object_foreach(row, key, v) {
        if (skip && !strcmp(key, skip)) continue;
        if (!col_exists(d, table, key))
            return arl_errorf(ARL_ERR_FORMAT,
                              "%s: rows.%s: '%.64s%s' is not a column of this store's table %s "
                              "(a line of another store version or a damaged one; export it "
                              "again with this build)",
                              where, table, key, strlen(key) > 64 ? "..." : "", table);
        if (o < sizeof sql)
            o += (size_t)snprintf(sql + o, sizeof sql - o, "%s%s", n ? "," : "", key);
        n++;
    }
    if (o < sizeof sql) o += (size_t)snprintf(sql + o, sizeof sql - o, ") VALUES (");
    for (int i = 0; i < n && o < sizeof sql; i++)
        o += (size_t)snprintf(sql + o, sizeof sql - o, "%s?%d", i ? "," : "", i + 1);
    if (o < sizeof sql)
        o += (size_t)snprintf(sql + o, sizeof sql - o, ") %s", conflict ? conflict : "");
    if (o >= sizeof sql)
        return arl_errorf(ARL_ERR_FORMAT, "%s: rows.%s: too many columns (%d)", where, table, n);
    sqlite3_stmt *q;
    arl_status s = rdb_prepare(d, sql, &q);
    if (s != ARL_OK) return arl_error_prefix(s, "%s: rows.%s", where, table);
    int i = 0;
    uint8_t **blobs = calloc((size_t)n + 1, sizeof *blobs);
    if (!blobs) {
        sqlite3_finalize(q);
        return arl_errorf(ARL_ERR_NOMEM, "%s: rows.%s: out of memory", where, table);
    }
    json_object_foreach(row, key, v) {
        if (skip && !strcmp(key, skip)) continue;
        i++;
        int done = 0;
        for (size_t k = 0; k < nsubs; k++)
            if (!strcmp(subs[k].col, key)) {
                sqlite3_bind_int64(q, i, subs[k].value);
                done = 1;
            }
        if (done) continue;
        if (json_is_null(v))
            sqlite3_bind_null(q, i);
        else if (json_is_integer(v))
            sqlite3_bind_int64(q, i, json_integer_value(v));
        else if (json_is_real(v))
            sqlite3_bind_double(q, i, json_real_value(v));
        else if (json_is_boolean(v))
            sqlite3_bind_int(q, i, json_is_true(v));
        else if (json_is_string(v) && col_is_blob(d, table, key)) {
            const char *t = json_string_value(v);
            size_t tl = json_string_length(v), bn = 0;
            uint8_t *b = malloc(tl / 4 * 3 + 4);
            if (!b) {
                s = arl_errorf(ARL_ERR_NOMEM, "%s: rows.%s.%s: out of memory", where, table, key);
                break;
            }
            if (replay_base64_decode(t, tl, b, &bn)) {
                free(b);
                s = arl_errorf(ARL_ERR_FORMAT, "%s: rows.%s.%s: not base64", where, table, key);
                break;
            }
            blobs[i - 1] = b;
            sqlite3_bind_blob64(q, i, b, bn, SQLITE_STATIC);
        } else if (json_is_string(v)) {
            sqlite3_bind_text(q, i, json_string_value(v), (int)json_string_length(v),
                              SQLITE_STATIC);
        } else {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: rows.%s.%s: unexpected JSON type", where, table,
                           key);
            break;
        }
    }
    if (s == ARL_OK) {
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) {
            s = rdb_fail(d, rc, "importing a row");
            arl_error_prefix(s, "%s: rows.%s", where, table);
        }
    }
    sqlite3_finalize(q);
    for (int k = 0; k < n; k++)
        free(blobs[k]);
    free(blobs);
    return s;
}

static arl_status lookup_id(rdb *d, const char *sql, json_t *row, const char *const *keys,
                            int nkeys, int64_t *id, const char *where) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(d, sql, &q));
    for (int i = 0; i < nkeys; i++) {
        json_t *v = json_object_get(row, keys[i]);
        if (json_is_integer(v))
            sqlite3_bind_int64(q, i + 1, json_integer_value(v));
        else if (json_is_string(v))
            sqlite3_bind_text(q, i + 1, json_string_value(v), -1, SQLITE_TRANSIENT);
    }
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) *id = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW)
        return arl_errorf(ARL_ERR_FORMAT, "%s: catalog row not found after insert (%s)", where,
                          sql);
    return ARL_OK;
}

/* An imported group that its run's update n consumed (status 'consumed', consumed_update n):
 * the update is recorded as committed in this store too, with the group among its groups
 * (updates, update_groups; n_groups counts its groups in this store), so that the ledger's
 * invariant holds here as in the store exported from (a consumed group is in exactly one
 * committed update; replay verify).  The export carries no update rows: the times are the
 * import's, n_action_tokens unknown.  An update (run, n) this store has already is kept, the
 * group added to it. */
static arl_status import_consumption(rdb *c, int64_t run_id, int64_t group_id) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(c,
                        "SELECT consumed_update FROM task_groups WHERE group_id = ?1 AND status = "
                        "'consumed'",
                        &q));
    sqlite3_bind_int64(q, 1, group_id);
    int rc = sqlite3_step(q);
    const int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(c, rc, "reading an imported group");
    if (n < 0) return ARL_OK;
    static const char *const sql[] = {
        "INSERT INTO updates(run_id, update_n, status, planned_at_ms, committed_at_ms, n_groups) "
        "VALUES (?1, ?2, 'committed', ?4, ?4, 0) ON CONFLICT(run_id, update_n) DO NOTHING",
        "INSERT INTO update_groups(run_id, update_n, group_id) VALUES (?1, ?2, ?3) "
        "ON CONFLICT DO NOTHING",
        "UPDATE updates SET n_groups = (SELECT count(*) FROM update_groups WHERE run_id = ?1 AND "
        "update_n = ?2) WHERE run_id = ?1 AND update_n = ?2"};
    const int64_t now = rnow_ms();
    for (size_t i = 0; i < sizeof sql / sizeof *sql; i++) {
        ARL_TRY(rdb_prepare(c, sql[i], &q));
        for (int k = 1; k <= 4; k++) /* (unused parameters stay NULL) */
            if (sqlite3_bind_parameter_name(q, k))
                sqlite3_bind_int64(q, k, k == 1 ? run_id : k == 2 ? n : k == 3 ? group_id : now);
        rc = sqlite3_step(q);
        sqlite3_finalize(q);
        if (rc != SQLITE_DONE) return rdb_fail(c, rc, "recording the update of an imported group");
    }
    return ARL_OK;
}

/* The store's group group_id (found by the imported group's uid g) must be the imported one: the
 * same run, task, kind and size (replay_group_ensure's rule: a group's members are samples of one
 * task), else the trajectory would join a group of another task. */
static arl_status import_group_check(rdb *c, json_t *g, int64_t group_id, int64_t run_id,
                                     int64_t task_id, const char *where) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(c,
                        "SELECT g.run_id, g.task_id, g.kind, g.size, t.task_uid, t.seed FROM "
                        "task_groups g LEFT JOIN tasks t ON t.task_id = g.task_id WHERE "
                        "g.group_id = ?1",
                        &q));
    sqlite3_bind_int64(q, 1, group_id);
    const int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc != SQLITE_ROW) {
        s = rc == SQLITE_DONE ? arl_errorf(ARL_ERR_INTERNAL, "%s: imported group vanished", where)
                              : rdb_fail(c, rc, "reading an imported group");
    } else {
        const char *kind = json_string_value(json_object_get(g, "kind"));
        const json_int_t size = json_integer_value(json_object_get(g, "size"));
        const char *have_kind = (const char *)sqlite3_column_text(q, 2);
        const char *what = sqlite3_column_int64(q, 0) != run_id    ? "run"
                           : sqlite3_column_int64(q, 1) != task_id ? "task"
                           : !kind || strcmp(kind, have_kind)      ? "kind"
                           : sqlite3_column_int(q, 3) != size      ? "size"
                                                                   : NULL;
        if (what)
            s = arl_errorf(ARL_ERR_STATE,
                           "%s: this store's group %s is a '%s' group of %d samples of task %s "
                           "(seed %lld); the imported trajectory's group of that name differs in "
                           "its %s (a group's members are samples of one task): import it into "
                           "another store",
                           where, json_string_value(json_object_get(g, "group_uid")), have_kind,
                           sqlite3_column_int(q, 3), (const char *)sqlite3_column_text(q, 4),
                           (long long)sqlite3_column_int64(q, 5), what);
    }
    sqlite3_finalize(q);
    return s;
}

/* The line's catalog rows (run, env, task, group; the update that consumed the group), found or
 * inserted, in a catalog write transaction that is left open on success: the caller commits it
 * with the line's shard rows, or rolls it back with them, so that a line refused part way leaves
 * no run, task or group of its own behind.  Rolled back on failure. */
static arl_status import_catalog(replay_store *st, json_t *cat, int64_t *run_id, int64_t *env_id,
                                 int64_t *task_id, int64_t *group_id, const char *where) {
    if (!json_is_object(cat) || !json_is_object(json_object_get(cat, "runs")) ||
        !json_is_object(json_object_get(cat, "envs")) ||
        !json_is_object(json_object_get(cat, "tasks")) ||
        !json_is_object(json_object_get(cat, "task_groups")))
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: rows.catalog needs runs, envs, tasks and task_groups "
                          "(export from a store with a catalog)",
                          where);
    rdb *c = &st->cat;
    ARL_TRY(rdb_begin(c));
    json_t *r = json_object_get(cat, "runs"), *e = json_object_get(cat, "envs"),
           *t = json_object_get(cat, "tasks"), *g = json_object_get(cat, "task_groups");
    static const char *const k_run[] = {"run_uid"}, *const k_env[] = {"name", "info_sha256"},
                             *const k_task[] = {"env_name", "task_uid", "seed", "data_sha256"},
                             *const k_group[] = {"group_uid"};
    arl_status s =
        insert_row(c, "runs", r, NULL, 0, "run_id", "ON CONFLICT(run_uid) DO NOTHING", where);
    if (s == ARL_OK)
        s = lookup_id(c, "SELECT run_id FROM runs WHERE run_uid = ?1", r, k_run, 1, run_id, where);
    if (s == ARL_OK)
        s = insert_row(c, "envs", e, NULL, 0, "env_id", "ON CONFLICT(name, info_sha256) DO NOTHING",
                       where);
    if (s == ARL_OK)
        s = lookup_id(c, "SELECT env_id FROM envs WHERE name = ?1 AND info_sha256 = ?2", e, k_env,
                      2, env_id, where);
    if (s == ARL_OK)
        s = insert_row(c, "tasks", t, NULL, 0, "task_id",
                       "ON CONFLICT(env_name, task_uid, seed, data_sha256) DO NOTHING", where);
    if (s == ARL_OK)
        s = lookup_id(
            c,
            "SELECT task_id FROM tasks WHERE env_name = ?1 AND task_uid = ?2 AND seed = ?3 AND "
            "data_sha256 = ?4",
            t, k_task, 4, task_id, where);
    int_subst gs[] = {{"run_id", *run_id}, {"task_id", *task_id}, {"env_id", *env_id}};
    if (s == ARL_OK)
        s = insert_row(c, "task_groups", g, gs, 3, "group_id", "ON CONFLICT(group_uid) DO NOTHING",
                       where);
    if (s == ARL_OK)
        s = lookup_id(c, "SELECT group_id FROM task_groups WHERE group_uid = ?1", g, k_group, 1,
                      group_id, where);
    if (s == ARL_OK) s = import_group_check(c, g, *group_id, *run_id, *task_id, where);
    if (s == ARL_OK) s = import_consumption(c, *run_id, *group_id);
    if (s != ARL_OK) rdb_rollback(c);
    return s;
}

/* The stored trajectory t as its 'export --full' line, without the newline, in *line
 * (malloc'ed, *n bytes). */
static arl_status full_line_of(replay_store *st, const replay_traj_row *t, char **line, size_t *n) {
    *line = NULL;
    *n = 0;
    rshard *sh = rstore_shard(st, t->shard_id);
    if (!sh)
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: trajectory %s: no shard %d", st->root,
                          t->traj_uid, (int)t->shard_id);
    rdb *d;
    ARL_TRY(rstore_shard_db(st, sh, &d));
    FILE *f = open_memstream(line, n);
    if (!f) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    const replay_export_opts o = {.full = 1};
    const arl_status s = export_one(st, sh, d, t, &o, f);
    if (fclose(f) && s == ARL_OK) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    while (*n && (*line)[*n - 1] == '\n')
        (*line)[--*n] = 0;
    return s;
}

/* The catalog's group_members row of the stored trajectory t, mirrored again when it lacks it:
 * an import killed between a line's commit and its mirror, run again (the shard is the source of
 * truth; verify warned about the missing member, and no other command puts it back). */
static void import_mirror_again(replay_store *st, const replay_traj_row *t) {
    sqlite3_stmt *q;
    if (rdb_prepare(&st->cat,
                    "SELECT 1 FROM group_members WHERE group_id = ?1 AND slot = ?2 AND "
                    "attempt = ?3 AND traj_uid = ?4",
                    &q) != ARL_OK)
        return;
    sqlite3_bind_int64(q, 1, t->group_id);
    sqlite3_bind_int(q, 2, t->slot);
    sqlite3_bind_int(q, 3, t->attempt);
    sqlite3_bind_text(q, 4, t->traj_uid, -1, SQLITE_STATIC);
    const int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc == SQLITE_DONE)
        rcat_member_mirror(st, t->group_id, t->slot, t->attempt, t->traj_uid, t->shard_id,
                           t->traj_id, replay_status_name(t->status));
}

/* A line whose trajectory the store has already: skipped (*skipped = 1) when the stored one
 * exports as this very line (an import run again after it stopped), else an error. */
static arl_status import_existing(replay_store *st, const replay_traj_row *t, const char *line,
                                  size_t len, const char *where, int *skipped) {
    char *have = NULL;
    size_t n = 0;
    arl_status s = full_line_of(st, t, &have, &n);
    if (s == ARL_OK && n == len && !memcmp(have, line, len)) {
        *skipped = 1;
        import_mirror_again(st, t);
    } else if (s == ARL_OK)
        s = arl_errorf(ARL_ERR_STATE,
                       "%s: trajectory %s already exists in this store with other content "
                       "(traj_uids are unique; its 'export --full' line differs from this one)",
                       where, t->traj_uid);
    free(have);
    return s;
}

#define IMPORT_FORMAT "agentrl.trajectory/1"

static arl_status import_line(replay_store *st, replay_writer **w, json_t *j, const char *line,
                              size_t len, const char *where, int64_t *next_id, int *skipped) {
    json_t *fmt = json_object_get(j, "format");
    if (fmt && !(json_is_string(fmt) && !strcmp(json_string_value(fmt), IMPORT_FORMAT)))
        return arl_errorf(ARL_ERR_VERSION,
                          "%s: format %.64s: this build imports " IMPORT_FORMAT " lines only "
                          "(export them with a build that writes that format)",
                          where, json_is_string(fmt) ? json_string_value(fmt) : "(not a string)");
    json_t *rows = json_object_get(j, "rows");
    if (!json_is_object(rows))
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: no \"rows\" member (import needs lines written by "
                          "'agentrl replay export --full')",
                          where);
    if (!fmt)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: no \"format\" member (import needs " IMPORT_FORMAT " lines, as "
                          "'agentrl replay export --full' writes them)",
                          where);
    json_t *tr = json_array_get(json_object_get(rows, "trajectories"), 0);
    const char *uid = json_string_value(json_object_get(tr, "traj_uid"));
    if (!uid) return arl_errorf(ARL_ERR_FORMAT, "%s: rows.trajectories[0] lacks traj_uid", where);
    replay_traj_row existing;
    const arl_status e = replay_traj_get(st, uid, &existing);
    if (e == ARL_OK) return import_existing(st, &existing, line, len, where, skipped);
    if (e != ARL_ERR_NOT_FOUND) return e;
    arl_error_clear();
    int64_t run_id, env_id, task_id, group_id;
    json_t *cat = json_object_get(rows, "catalog");
    ARL_TRY(import_catalog(st, cat, &run_id, &env_id, &task_id, &group_id, where));
    if (!*w) {
        /* the tool file is made (and registered in the catalog, by its own transaction) for the
         * first line whose catalog rows are good; the catalog's part is then found again */
        rdb_rollback(&st->cat);
        ARL_TRY(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, w));
        ARL_TRY(import_catalog(st, cat, &run_id, &env_id, &task_id, &group_id, where));
    }
    rdb *d = &(*w)->w;
    arl_status s = rdb_begin(d);
    if (s != ARL_OK) {
        rdb_rollback(&st->cat);
        return s;
    }
    if (*next_id < 0) {
        int64_t mx = 0;
        int found;
        s = rdb_query_int(d, "SELECT max(traj_id) FROM trajectories", &mx, &found);
        int64_t base = (int64_t)(*w)->shard_id << REPLAY_TRAJ_ID_SHIFT;
        *next_id = found && mx >= base ? mx + 1 : base;
    }
    int64_t id = *next_id;
    int_subst ts[] = {{"traj_id", id},
                      {"run_id", run_id},
                      {"group_id", group_id},
                      {"task_id", task_id},
                      {"env_id", env_id}};
    if (s == ARL_OK) s = insert_row(d, "trajectories", tr, ts, 5, NULL, NULL, where);
    static const char *const tables[] = {"segments",         "segment_routes", "turns",
                                         "env_calls",        "tool_calls",     "rewards",
                                         "trajectory_events"};
    for (size_t k = 0; s == ARL_OK && k < sizeof tables / sizeof *tables; k++) {
        size_t i;
        json_t *row;
        json_array_foreach(json_object_get(rows, tables[k]), i, row) {
            s = insert_row(d, tables[k], row, ts, 1, NULL, NULL, where);
            if (s != ARL_OK) break;
        }
    }
    /* images by content, then references with the local image ids */
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(rows, "images"), i, row) {
        if (s != ARL_OK) break;
        s = insert_row(d, "images", row, NULL, 0, "image_id", "ON CONFLICT(sha256) DO NOTHING",
                       where);
    }
    json_array_foreach(json_object_get(rows, "image_refs"), i, row) {
        if (s != ARL_OK) break;
        const char *hex = json_string_value(json_object_get(row, "image_id"));
        uint8_t sha[32];
        if (!hex || strlen(hex) != 64 || replay_hex_decode(hex, 32, sha)) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "%s: rows.image_refs[%zu].image_id: expected 64 hex digits", where, i);
            break;
        }
        sqlite3_stmt *q;
        int64_t image_id = -1;
        if ((s = rdb_prepare(d, "SELECT image_id FROM images WHERE sha256 = ?1", &q)) != ARL_OK)
            break;
        sqlite3_bind_blob(q, 1, sha, 32, SQLITE_STATIC);
        if (sqlite3_step(q) == SQLITE_ROW) image_id = sqlite3_column_int64(q, 0);
        sqlite3_finalize(q);
        if (image_id < 0) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: image %s referenced but not in rows.images", where,
                           hex);
            break;
        }
        int_subst rs[] = {{"traj_id", id}, {"image_id", image_id}};
        s = insert_row(d, "image_refs", row, rs, 2, NULL, NULL, where);
    }
    /* learner records, their run by uid (the trajectory's run unless named otherwise) */
    json_array_foreach(json_object_get(rows, "learner_records"), i, row) {
        if (s != ARL_OK) break;
        const char *ru = json_string_value(json_object_get(row, "run_id"));
        int64_t lrun = run_id;
        if (ru) {
            sqlite3_stmt *q;
            if ((s = rdb_prepare(&st->cat, "SELECT run_id FROM runs WHERE run_uid = ?1", &q)) !=
                ARL_OK)
                break;
            sqlite3_bind_text(q, 1, ru, -1, SQLITE_STATIC);
            lrun = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
            sqlite3_finalize(q);
            if (lrun < 0) {
                s = arl_errorf(ARL_ERR_FORMAT,
                               "%s: rows.learner_records[%zu]: run '%s' is not in rows.catalog "
                               "or the store",
                               where, i, ru);
                break;
            }
        }
        int_subst ls[] = {{"run_id", lrun}};
        s = insert_row(d, "learner_records", row, ls, 1, NULL, NULL, where);
    }
    if (s != ARL_OK) {
        rdb_rollback(d);
        rdb_rollback(&st->cat);
        return s;
    }
    /* the commits and the catalog's mirror of the new member are not cut in two by an interrupt
     * (SIGINT, SIGTERM: the CLI holds them back until the stretch ends).  The catalog's rows
     * first: a crash between the two commits leaves a run, task or group without the member,
     * which the import run again takes up (the other order would leave a trajectory whose ids
     * name catalog rows that were never made) */
    arl_defer_begin();
    s = rdb_commit(&st->cat);
    if (s == ARL_OK) {
        s = rdb_commit(d);
    } else {
        rdb_rollback(&st->cat);
        rdb_rollback(d);
    }
    if (s == ARL_OK) {
        (*next_id)++;
        const char *status = json_string_value(json_object_get(tr, "status"));
        rcat_member_mirror(st, group_id, (int32_t)json_integer_value(json_object_get(tr, "slot")),
                           (int32_t)json_integer_value(json_object_get(tr, "attempt")), uid,
                           (*w)->shard_id, id, status ? status : "running");
    }
    arl_defer_end();
    return s;
}

arl_status replay_import(replay_store *st, FILE *in, const char *in_name, int64_t *n_out,
                         int64_t *n_skipped) {
    if (!st->cat.db || st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: import needs a store root with a writable catalog",
                          st->root);
    replay_writer *w = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t lineno = 0, n = 0, n_skip = 0, next_id = -1;
    arl_status s = ARL_OK;
    while ((len = getline(&line, &cap, in)) > 0) {
        lineno++;
        char where[600];
        snprintf(where, sizeof where, "%s:%lld", in_name, (long long)lineno);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!len) continue;
        json_error_t err;
        json_t *j = arl_json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &err);
        if (!j) {
            s = arl_json_error_nomem(&err)
                    ? arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the line", where)
                    : arl_errorf(ARL_ERR_FORMAT, "%s: not JSON: %s (column %d)", where, err.text,
                                 err.column);
            break;
        }
        int skipped = 0;
        s = import_line(st, &w, j, line, (size_t)len, where, &next_id, &skipped);
        json_decref(j);
        if (s != ARL_OK) break;
        *(skipped ? &n_skip : &n) += 1;
    }
    if (s == ARL_OK && ferror(in)) /* (a directory, an I/O error: not an end of the lines) */
        s = arl_errorf(ARL_ERR_IO, "%s: read error after line %lld: %s", in_name, (long long)lineno,
                       strerror(errno));
    free(line);
    replay_writer_close(w);
    if (n_out) *n_out = n;
    if (n_skipped) *n_skipped = n_skip;
    return s;
}
