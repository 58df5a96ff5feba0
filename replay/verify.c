/* replay/verify.c: `verify` (spec section 13.5) and `recover` (section 13.8).  verify reads
 * every file and reports every finding (it never stops at the first); recover takes over the
 * files whose writer is gone (free lock) and resolves their interrupted trajectories. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json_dump.h"
#include "core/sha256.h"
#include "replay/codec.h"
#include "replay/inspect.h"
#include "replay/internal.h"

typedef struct vrepair {
    int32_t shard_id;
    int kind;
    int64_t traj_id;
} vrepair;

typedef struct vctx {
    FILE *out;
    int64_t errors, warnings;
    int64_t evicted; /* state references to states evicted by retention or budget (spec 9.3) */
    replay_store *st;
    int64_t newest_version; /* max policy version in the catalog (-1 if none) */
    vrepair *rep;           /* --repair: unmasked trajectories with errors */
    size_t n_rep, cap_rep;
    int64_t nomem; /* checks that could not run for lack of memory: not findings about the
                    * store, but the verification is incomplete (an error, not exit 2) */
} vctx;

static void want_repair(vctx *v, int32_t shard_id, int kind, int64_t traj_id) {
    if (v->n_rep == v->cap_rep) {
        size_t c = v->cap_rep ? 2 * v->cap_rep : 16;
        vrepair *p = realloc(v->rep, c * sizeof *p);
        if (!p) return; /* reported as not repaired below: the finding stays */
        v->rep = p;
        v->cap_rep = c;
    }
    v->rep[v->n_rep++] = (vrepair){shard_id, kind, traj_id};
}

/* --repair (section 13.5): through each file's writer (its lock must be free), mask the
 * trajectories with errors STORE_CORRUPT and delete orphan states.  Never rewrites data. */
static arl_status repair(vctx *v) {
    replay_store *st = v->st;
    int64_t masked = 0, orphans = 0, skipped = 0;
    /* every worker or tool file once: masks first, then its orphan states */
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    arl_status s = ARL_OK;
    for (size_t i = 0; i < n && s == ARL_OK; i++) {
        if (ref[i].kind != REPLAY_FILE_WORKER && ref[i].kind != REPLAY_FILE_TOOL) continue;
        if (rstore_shard_sealed(st, ref[i].id)) { /* immutable: its findings stay findings */
            for (size_t k = 0; k < v->n_rep; k++)
                skipped += v->rep[k].shard_id == ref[i].id;
            continue;
        }
        replay_writer *w = NULL;
        arl_status o = rwriter_open(st, (replay_file_kind)ref[i].kind, ref[i].id, NULL, 1, &w);
        if (o == ARL_ERR_BUSY) {
            fprintf(v->out, "repair: skipped (writer alive): %s\n", arl_error_msg());
            for (size_t k = 0; k < v->n_rep; k++)
                skipped += v->rep[k].shard_id == ref[i].id;
            continue;
        }
        if (o != ARL_OK) {
            s = o;
            break;
        }
        for (size_t k = 0; k < v->n_rep && s == ARL_OK; k++) {
            if (v->rep[k].shard_id != ref[i].id) continue;
            replay_traj_row t;
            if (replay_traj_get_id(st, v->rep[k].traj_id, &t) != ARL_OK ||
                t.status == REPLAY_MASKED)
                continue;
            s = replay_traj_mask(w, v->rep[k].traj_id, "STORE_CORRUPT", "infra", "error",
                                 "{\"by\":\"verify --repair\"}");
            if (s == ARL_OK) {
                fprintf(v->out, "repair: %s: trajectory %s masked STORE_CORRUPT\n",
                        replay_writer_file(w), t.traj_uid);
                masked++;
            }
        }
        int64_t del = 0;
        /* the lock was free: no state is between S_s and C_s, any age is garbage */
        if (s == ARL_OK) s = replay_states_gc(w, 0, &del);
        orphans += del;
        replay_writer_close(w);
    }
    free(ref);
    fprintf(v->out,
            "repair: %lld trajectories masked STORE_CORRUPT, %lld orphan states deleted%s\n",
            (long long)masked, (long long)orphans,
            skipped ? " (sealed files and files with a live writer were skipped)" : "");
    return s;
}

/* A finding; one whose cause is our own lack of memory (SQLite's "out of memory", an
 * ARL_ERR_NOMEM message) says nothing about the store: it goes to standard error and counts in
 * v->nomem (the command then fails) instead of being reported as damage (exit 2, --repair). */
__attribute__((format(printf, 3, 4))) static void finding(vctx *v, int error, const char *fmt,
                                                          ...) {
    char m[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (strstr(m, "out of memory")) {
        fprintf(stderr, "agentrl: replay verify: check not run: %s\n", m);
        v->nomem++;
        return;
    }
    fprintf(v->out, "%s: %s\n", error ? "error" : "warning", m);
    if (error)
        v->errors++;
    else
        v->warnings++;
}

/* an allocation failed (or a query ran out of memory): the check is not made */
static void check_nomem(vctx *v, const char *what) {
    fprintf(stderr, "agentrl: replay verify: check not run: %s: out of memory\n", what);
    v->nomem++;
}

/* a check SQLite could not start for lack of memory, or of a temporary file (where SQLite's
 * own allocation failed, it says "unable to open a temporary database file") */
static int check_not_run(vctx *v, rdb *d, int rc, const char *what) {
    rc &= 0xFF;
    if (rc != SQLITE_NOMEM && rc != SQLITE_CANTOPEN) return 0;
    fprintf(stderr, "agentrl: replay verify: check not run: %s: %s: %s\n", d->name, what,
            sqlite3_errmsg(d->db));
    v->nomem++;
    return 1;
}

/* rdb_prepare for a check: out of memory counts in v->nomem (the check is then skipped, and
 * the command fails instead of passing a store it did not check). */
static arl_status vprep(vctx *v, rdb *d, const char *sql, sqlite3_stmt **q) {
    arl_status s = rdb_prepare(d, sql, q);
    if (s == ARL_ERR_NOMEM) check_nomem(v, "preparing a query");
    return s;
}

/* sqlite3_step for a check's loop: a step that runs out of memory ends the loop like the end
 * of the rows would, so it is counted in v->nomem. */
static int vstep(vctx *v, sqlite3_stmt *q) {
    int rc = sqlite3_step(q);
    if ((rc & 0xFF) == SQLITE_NOMEM) check_nomem(v, "reading rows");
    return rc;
}

static void integrity(vctx *v, rdb *d, int full) {
    sqlite3_stmt *q;
    int irc = sqlite3_prepare_v2(d->db, full ? "PRAGMA integrity_check" : "PRAGMA quick_check", -1,
                                 &q, NULL);
    if (irc != SQLITE_OK) {
        if (check_not_run(v, d, irc, "integrity check")) return;
        finding(v, 1, "%s: integrity check failed to run: %s", d->name, sqlite3_errmsg(d->db));
        return;
    }
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(q, 0);
        /* a page SQLite could not read for lack of memory ("error code=7", SQLITE_NOMEM) is
         * not damage of the file */
        const char *e7 = m ? strstr(m, "error code=7") : NULL;
        if (e7 && (e7[12] < '0' || e7[12] > '9'))
            check_nomem(v, "integrity check");
        else if (m && strcmp(m, "ok"))
            finding(v, 1, "%s: %s", d->name, m);
    }
    if (rc != SQLITE_DONE && !check_not_run(v, d, rc, "integrity check"))
        finding(v, 1, "%s: integrity check: %s", d->name, sqlite3_errmsg(d->db));
    sqlite3_finalize(q);
    const int tool = d->kind == REPLAY_FILE_TOOL;
    int prc = sqlite3_prepare_v2(d->db, "PRAGMA foreign_key_check", -1, &q, NULL);
    if ((prc & 0xFF) == SQLITE_NOMEM) check_nomem(v, "foreign key check");
    if (prc == SQLITE_OK) {
        while (vstep(v, q) == SQLITE_ROW) {
            /* a tool file's re-scored rewards refer to trajectories of other files: below */
            if (tool && !strcmp((const char *)sqlite3_column_text(q, 0), "rewards")) continue;
            finding(v, 1, "%s: table %s row %lld refers to a missing %s row (orphan)", d->name,
                    sqlite3_column_text(q, 0), (long long)sqlite3_column_int64(q, 1),
                    sqlite3_column_text(q, 2));
        }
        sqlite3_finalize(q);
    }
    /* rewards rows of a tool file without their trajectory in it: only re-scored rows
     * (rescore --rewards, spec section 13.6) of a trajectory that exists in the store */
    if (tool && sqlite3_prepare_v2(d->db,
                                   "SELECT DISTINCT r.traj_id, r.source FROM rewards r WHERE NOT "
                                   "EXISTS (SELECT 1 FROM trajectories t WHERE t.traj_id = "
                                   "r.traj_id)",
                                   -1, &q, NULL) == SQLITE_OK) {
        while (vstep(v, q) == SQLITE_ROW) {
            const int64_t id = sqlite3_column_int64(q, 0);
            const char *src = (const char *)sqlite3_column_text(q, 1);
            replay_traj_row t;
            if (!src || strncmp(src, "rescore:", 8))
                finding(v, 1, "%s: rewards of trajectory %lld (source %s) without its trajectory "
                              "row (orphan)",
                        d->name, (long long)id, src ? src : "NULL");
            else if (replay_traj_get_id(v->st, id, &t) != ARL_OK) {
                arl_error_clear();
                finding(v, 1, "%s: re-scored rewards (%s) of trajectory %lld, which is in no file "
                              "of the store (orphan)",
                        d->name, src, (long long)id);
            }
        }
        sqlite3_finalize(q);
    }
}

/* meta of one file; shard_id: the catalog's registration of a shard file (and of its states
 * file), 0 for the catalog (section 4.1: meta.shard_id in shard files only) */
static void meta_check(vctx *v, rdb *d, int32_t shard_id) {
    char uid[40], sid[24];
    int found, found_sid;
    if (rdb_meta_get(d, "store_uid", uid, sizeof uid, &found) != ARL_OK ||
        rdb_meta_get(d, "shard_id", sid, sizeof sid, &found_sid) != ARL_OK) {
        finding(v, 1, "%s: meta unreadable: %s", d->name, arl_error_msg());
        return;
    }
    if (!found)
        finding(v, 1, "%s: meta has no store_uid", d->name);
    else if (v->st->store_uid[0] && strcmp(uid, v->st->store_uid))
        finding(v, 1, "%s: store_uid %s differs from the catalog's %s (a file from another store)",
                d->name, uid, v->st->store_uid);
    if (shard_id > 0 && !found_sid)
        finding(v, 1, "%s: meta has no shard_id (the catalog registers it as shard %d)", d->name,
                (int)shard_id);
    else if (shard_id > 0 && strcmp(sid, "") && atoll(sid) != shard_id)
        finding(v, 1,
                "%s: meta.shard_id is %s but the catalog registers the file as shard %d (a file "
                "copied from another shard?)",
                d->name, sid, (int)shard_id);
    if (d->schema_version != REPLAY_SCHEMA_VERSION)
        finding(v, 0, "%s: schema version %d (this build: %d)", d->name, d->schema_version,
                REPLAY_SCHEMA_VERSION);
}

typedef struct seg_row {
    int32_t seg_index, first_step, last_step;
    int64_t tok_start, ctx_start, n_tokens, n_action, min_v, max_v, end_state, latent_state;
    char start_kind[12], end_cause[16];
} seg_row;

/* Blobs and per-token invariants of one segment; fills the loss mask for the turns check. */
static void check_segment_blobs(vctx *v, rdb *d, sqlite3_stmt *q, const char *uid, const seg_row *s,
                                uint8_t **mask, size_t *mask_cap) {
    static const char *const names[4] = {"tokens", "logprobs", "loss_mask", "versions"};
    static const arl_blob_kind kinds[4] = {ARL_BLOB_TOKENS, ARL_BLOB_LOGPROBS, ARL_BLOB_LOSS_MASK,
                                           ARL_BLOB_VERSIONS};
    if ((size_t)s->n_tokens > *mask_cap) {
        uint8_t *p = realloc(*mask, (size_t)s->n_tokens);
        if (!p) return;
        *mask = p;
        *mask_cap = (size_t)s->n_tokens;
    }
    /* the tensors are checked through a copy: codec-1 blobs (section 5.1) are inflated there */
    size_t cap = (size_t)s->n_tokens * 4;
    uint8_t *pl = malloc(cap ? cap : 1);
    if (!pl) return;
    for (int k = 0; k < 4; k++) {
        arl_blob_expect ex = {.kind = kinds[k], .dims_mask = 1, .dims = {(uint64_t)s->n_tokens}};
        arl_blob_header h;
        if (arl_blob_check_copy(sqlite3_column_blob(q, k), (size_t)sqlite3_column_bytes(q, k), &ex,
                                &h, pl, cap) != ARL_OK) {
            finding(v, 1, "%s: trajectory %s segment %d column %s: %s", d->name, uid,
                    (int)s->seg_index, names[k], arl_error_msg());
            if (k == 2) memset(*mask, 0xFF, (size_t)s->n_tokens);
            continue;
        }
        if (k == 2) {
            memcpy(*mask, pl, (size_t)s->n_tokens);
            int64_t act = 0;
            for (int64_t i = 0; i < s->n_tokens; i++) {
                if ((*mask)[i] > 1) {
                    finding(v, 1,
                            "%s: trajectory %s segment %d: loss_mask[%lld] = %u (must be 0 or 1)",
                            d->name, uid, (int)s->seg_index, (long long)i, (*mask)[i]);
                    break;
                }
                act += (*mask)[i];
            }
            if (act != s->n_action)
                finding(
                    v, 1,
                    "%s: trajectory %s segment %d: n_action_tokens %lld != %lld ones in loss_mask",
                    d->name, uid, (int)s->seg_index, (long long)s->n_action, (long long)act);
        }
        if (k == 3 && v->newest_version >= 0) {
            const uint8_t *p = pl;
            for (int64_t i = 0; i < s->n_tokens; i++) {
                uint32_t x;
                memcpy(&x, p + 4 * i, 4);
                if ((int64_t)x > v->newest_version) {
                    finding(v, 1,
                            "%s: trajectory %s segment %d: version tag %u is newer than the newest "
                            "policy version %lld in the catalog",
                            d->name, uid, (int)s->seg_index, x, (long long)v->newest_version);
                    break;
                }
            }
        }
    }
    free(pl);
}

static void check_routes(vctx *v, rdb *d, int64_t traj_id, const char *uid, const seg_row *s) {
    sqlite3_stmt *q;
    if (rdb_prepare(
            d,
            "SELECT moe_layer, data FROM segment_routes WHERE traj_id = ?1 AND seg_index = ?2 "
            "ORDER BY moe_layer",
            &q) != ARL_OK)
        return;
    sqlite3_bind_int64(q, 1, traj_id);
    sqlite3_bind_int(q, 2, s->seg_index);
    int32_t l = 0;
    uint64_t k = 0;
    uint8_t dt = 0;
    while (vstep(v, q) == SQLITE_ROW) {
        int layer = sqlite3_column_int(q, 0);
        if (layer != l)
            finding(v, 1, "%s: trajectory %s segment %d: routes of MoE layer %d missing", d->name,
                    uid, (int)s->seg_index, (int)l);
        l = layer + 1;
        arl_blob_expect ex = {.kind = ARL_BLOB_ROUTES,
                              .dtype = dt,
                              .dims_mask = k ? 3u : 1u,
                              .dims = {(uint64_t)s->n_tokens, k}};
        arl_blob_header h;
        if (arl_blob_check(sqlite3_column_blob(q, 1), (size_t)sqlite3_column_bytes(q, 1), &ex, &h,
                           NULL) != ARL_OK) {
            finding(v, 1, "%s: trajectory %s segment %d routes layer %d: %s", d->name, uid,
                    (int)s->seg_index, layer, arl_error_msg());
            continue;
        }
        k = h.dims[1];
        dt = h.dtype;
    }
    sqlite3_finalize(q);
}

/* Invariants of section 7.4 for one trajectory; returns its segments' state references. */
static void check_trajectory(vctx *v, rdb *d, sqlite3_stmt *tq, int32_t shard_id, rdb *states) {
    replay_traj_row t;
    rtraj_fill(tq, shard_id, &t);
    const char *uid = t.traj_uid;
    if (t.traj_id >> REPLAY_TRAJ_ID_SHIFT != shard_id)
        finding(v, 1, "%s: trajectory %s: traj_id %lld is outside shard %d's id range", d->name,
                uid, (long long)t.traj_id, (int)shard_id);
    sqlite3_stmt *q;
    if (rdb_prepare(
            d,
            "SELECT tokens, logprobs, loss_mask, versions, seg_index, start_kind, end_cause, "
            "first_step, last_step, tok_start, ctx_start, n_tokens, n_action_tokens, min_version, "
            "max_version, end_state_id, latent_state_id FROM segments WHERE traj_id = ?1 ORDER BY "
            "seg_index",
            &q) != ARL_OK) {
        finding(v, 1, "%s: %s", d->name, arl_error_msg());
        return;
    }
    sqlite3_bind_int64(q, 1, t.traj_id);
    int32_t first = t.fork_seg_index >= 0 ? t.fork_seg_index + 1 : 0, expect = first;
    int64_t sum_tok = 0, sum_act = 0, vmin = -1, vmax = -1;
    seg_row prev = {0}, s;
    int have_prev = 0;
    uint8_t *mask = NULL;
    size_t mask_cap = 0;
    seg_row *segs = NULL;
    size_t nseg = 0;
    while (vstep(v, q) == SQLITE_ROW) {
        memset(&s, 0, sizeof s);
        s.seg_index = sqlite3_column_int(q, 4);
        rdb_col_text(q, 5, s.start_kind, sizeof s.start_kind);
        rdb_col_text(q, 6, s.end_cause, sizeof s.end_cause);
        s.first_step = sqlite3_column_int(q, 7);
        s.last_step = sqlite3_column_int(q, 8);
        s.tok_start = sqlite3_column_int64(q, 9);
        s.ctx_start = sqlite3_column_int64(q, 10);
        s.n_tokens = sqlite3_column_int64(q, 11);
        s.n_action = sqlite3_column_int64(q, 12);
        s.min_v = sqlite3_column_int64(q, 13);
        s.max_v = sqlite3_column_int64(q, 14);
        s.end_state = rdb_col_int_or(q, 15, -1);
        s.latent_state = rdb_col_int_or(q, 16, -1);
        if (s.seg_index != expect)
            finding(v, 1, "%s: trajectory %s: segment %d found where %d was expected (gap)",
                    d->name, uid, (int)s.seg_index, (int)expect);
        expect = s.seg_index + 1;
        if (have_prev) {
            if (s.tok_start != prev.tok_start + prev.n_tokens)
                finding(v, 1,
                        "%s: trajectory %s segment %d: tok_start %lld != %lld (token ranges not "
                        "contiguous)",
                        d->name, uid, (int)s.seg_index, (long long)s.tok_start,
                        (long long)(prev.tok_start + prev.n_tokens));
            int64_t want_ctx = !strcmp(s.start_kind, "fresh") ? 0 : prev.ctx_start + prev.n_tokens;
            if (s.ctx_start != want_ctx)
                finding(v, 1, "%s: trajectory %s segment %d: ctx_start %lld, expected %lld",
                        d->name, uid, (int)s.seg_index, (long long)s.ctx_start,
                        (long long)want_ctx);
            if (s.first_step != prev.last_step + 1)
                finding(v, 1,
                        "%s: trajectory %s segment %d: first_step %d != %d (steps not contiguous)",
                        d->name, uid, (int)s.seg_index, (int)s.first_step, (int)prev.last_step + 1);
        } else if (t.fork_seg_index < 0 && (s.tok_start || s.ctx_start || s.first_step != 1 ||
                                            strcmp(s.start_kind, "fresh"))) {
            finding(v, 1, "%s: trajectory %s: segment 0 must be fresh at token 0, step 1", d->name,
                    uid);
        } else if (t.fork_seg_index >= 0 && strcmp(s.start_kind, "fork")) {
            finding(v, 1, "%s: fork %s: its first segment has start_kind '%s', not 'fork'", d->name,
                    uid, s.start_kind);
        }
        check_segment_blobs(v, d, q, uid, &s, &mask, &mask_cap);
        check_routes(v, d, t.traj_id, uid, &s);
        /* LOSS_MASK 1-runs equal the turns' action ranges of this segment (7.4 invariant 7) */
        sqlite3_stmt *uq;
        if (mask &&
            vprep(v, d,
                  "SELECT step_index, act_tok_start, act_tok_end FROM turns WHERE traj_id = ?1 "
                  "AND seg_index = ?2 AND step_index > 0 ORDER BY step_index",
                  &uq) == ARL_OK) {
            sqlite3_bind_int64(uq, 1, t.traj_id);
            sqlite3_bind_int(uq, 2, s.seg_index);
            uint8_t *want = calloc((size_t)s.n_tokens, 1);
            int bad_range = 0;
            while (want && sqlite3_step(uq) == SQLITE_ROW) {
                int step = sqlite3_column_int(uq, 0);
                if (step < s.first_step || step > s.last_step)
                    finding(
                        v, 1,
                        "%s: trajectory %s: turn %d belongs to segment %d whose steps are %d..%d",
                        d->name, uid, step, (int)s.seg_index, (int)s.first_step, (int)s.last_step);
                if (sqlite3_column_type(uq, 1) == SQLITE_NULL) continue;
                int64_t a = sqlite3_column_int64(uq, 1) - s.tok_start,
                        b = sqlite3_column_int64(uq, 2) - s.tok_start;
                if (a < 0 || b > s.n_tokens || a > b) {
                    finding(
                        v, 1,
                        "%s: trajectory %s turn %d: action range [%lld, %lld) outside segment %d",
                        d->name, uid, step, (long long)(a + s.tok_start),
                        (long long)(b + s.tok_start), (int)s.seg_index);
                    bad_range = 1;
                    continue;
                }
                memset(want + a, 1, (size_t)(b - a));
            }
            sqlite3_finalize(uq);
            if (want && !bad_range && memcmp(want, mask, (size_t)s.n_tokens) && mask[0] != 0xFF)
                finding(v, 1,
                        "%s: trajectory %s segment %d: loss_mask disagrees with the turns' action "
                        "ranges",
                        d->name, uid, (int)s.seg_index);
            free(want);
        }
        sum_tok += s.n_tokens;
        sum_act += s.n_action;
        if (vmin < 0 || s.min_v < vmin) vmin = s.min_v;
        if (s.max_v > vmax) vmax = s.max_v;
        seg_row *p = realloc(segs, (nseg + 1) * sizeof *p);
        if (p) {
            segs = p;
            segs[nseg++] = s;
        }
        prev = s;
        have_prev = 1;
    }
    sqlite3_finalize(q);
    free(mask);
    int32_t nseg_found = have_prev ? expect - first : 0;
    if (nseg_found != t.n_segments || sum_tok != t.n_tokens || sum_act != t.n_action_tokens)
        finding(
            v, 1,
            "%s: trajectory %s: counters (segments %d, tokens %lld, action %lld) differ from its "
            "segments (%d, %lld, %lld)",
            d->name, uid, (int)t.n_segments, (long long)t.n_tokens, (long long)t.n_action_tokens,
            (int)nseg_found, (long long)sum_tok, (long long)sum_act);
    if (nseg_found && (vmin != t.min_version || vmax != t.max_version))
        finding(v, 1,
                "%s: trajectory %s: version range %lld..%lld differs from its segments' %lld..%lld",
                d->name, uid, (long long)t.min_version, (long long)t.max_version, (long long)vmin,
                (long long)vmax);
    /* turns: every turn in a committed segment; n_turns */
    int64_t n_turns = 0, orphan_turns = 0;
    if (vprep(v, d,
              "SELECT count(*) FILTER (WHERE step_index > 0), count(*) FILTER (WHERE "
              "seg_index NOT IN "
              "(SELECT seg_index FROM segments s WHERE s.traj_id = ?1)) FROM turns WHERE "
              "traj_id = ?1",
              &q) == ARL_OK) {
        sqlite3_bind_int64(q, 1, t.traj_id);
        if (sqlite3_step(q) == SQLITE_ROW) {
            n_turns = sqlite3_column_int64(q, 0);
            orphan_turns = sqlite3_column_int64(q, 1);
        }
        sqlite3_finalize(q);
    }
    if (n_turns != t.n_turns)
        finding(v, 1, "%s: trajectory %s: n_turns %d but %lld turns stored", d->name, uid,
                (int)t.n_turns, (long long)n_turns);
    if (orphan_turns)
        finding(v, 1, "%s: trajectory %s: %lld turns belong to no committed segment", d->name, uid,
                (long long)orphan_turns);
    /* status invariants (4-6) */
    int64_t outcome_rows = 0, derived_ok = 0;
    if (vprep(
            v, d,
            "SELECT count(*), count(*) FILTER (WHERE component = '@derived' AND value IS NOT NULL) "
            "FROM rewards WHERE traj_id = ?1 AND level = 'outcome'",
            &q) == ARL_OK) {
        sqlite3_bind_int64(q, 1, t.traj_id);
        if (sqlite3_step(q) == SQLITE_ROW) {
            outcome_rows = sqlite3_column_int64(q, 0);
            derived_ok = sqlite3_column_int64(q, 1);
        }
        sqlite3_finalize(q);
    }
    if (t.status == REPLAY_RUNNING && outcome_rows)
        finding(v, 1, "%s: trajectory %s is running but has outcome rewards", d->name, uid);
    if (t.status == REPLAY_COMPLETE || t.status == REPLAY_TRUNCATED) {
        if (!nseg || strcmp(segs[nseg - 1].end_cause, "end"))
            finding(v, 1, "%s: trajectory %s is %s but its last segment does not end 'end'",
                    d->name, uid, replay_status_name(t.status));
        if (!derived_ok)
            finding(v, 1, "%s: trajectory %s is %s without an outcome '@derived' value", d->name,
                    uid, replay_status_name(t.status));
    }
    /* Masks applied after the fact (interruption, resume failure, corruption, operator) leave the
     * last committed segment as it was; C_mask itself writes 'partial' (invariant 6). */
    if (t.status == REPLAY_MASKED && nseg && strcmp(segs[nseg - 1].end_cause, "partial") &&
        strcmp(segs[nseg - 1].end_cause, "end") && strcmp(t.error_code, "INTERRUPTED") &&
        strncmp(t.error_code, "RESUME_", 7) && strcmp(t.error_code, "STORE_CORRUPT") &&
        strcmp(t.error_code, "OPERATOR_MASKED"))
        finding(v, 1, "%s: trajectory %s is masked (%s) but its last segment ends '%s'", d->name,
                uid, t.error_code, segs[nseg - 1].end_cause);
    /* turns (invariant 2): step 0's turn belongs to segment 0, and every turn has its response
     * fields (context; reward for steps >= 1, a create carries none; call_seq of a complete
     * response) except the last turn of a 'partial' segment, whose step failed, and the last
     * turn of an action_too_large trajectory, whose action was never sent (spec/aep.md 12.1) */
    int32_t failed_step = -1;
    if (nseg &&
        (!strcmp(segs[nseg - 1].end_cause, "partial") || !strcmp(t.end_cause, "action_too_large")))
        failed_step = segs[nseg - 1].last_step;
    if (vprep(v, d,
              "SELECT u.step_index, u.seg_index, u.context IS NULL, u.reward IS NULL, "
              "u.call_seq, c.response_complete FROM turns u LEFT JOIN env_calls c ON c.traj_id = "
              "u.traj_id AND c.call_seq = u.call_seq WHERE u.traj_id = ?1 ORDER BY u.step_index",
              &q) == ARL_OK) {
        sqlite3_bind_int64(q, 1, t.traj_id);
        while (vstep(v, q) == SQLITE_ROW) {
            const int step = sqlite3_column_int(q, 0);
            if (step == 0 && sqlite3_column_int(q, 1) != 0)
                finding(v, 1, "%s: trajectory %s: the turn of step 0 belongs to segment %d, not 0",
                        d->name, uid, sqlite3_column_int(q, 1));
            if (step == failed_step) continue;
            const char *missing = sqlite3_column_int(q, 2)               ? "context"
                                  : step > 0 && sqlite3_column_int(q, 3) ? "reward"
                                  : sqlite3_column_type(q, 5) == SQLITE_NULL
                                      ? "call_seq's env_calls row"
                                  : sqlite3_column_int(q, 5) != 1 ? "complete response (call_seq's "
                                                                    "env_calls row is incomplete)"
                                                                  : NULL;
            if (missing)
                finding(v, 1,
                        "%s: trajectory %s step %d (call_seq %lld): the turn lacks its %s; only "
                        "the failed last turn of a 'partial' segment may",
                        d->name, uid, step, (long long)sqlite3_column_int64(q, 4), missing);
        }
        sqlite3_finalize(q);
    }
    /* state references: present and of the right trajectory and segment, else a cache miss */
    for (size_t i = 0; i < nseg; i++) {
        int64_t ids[2] = {segs[i].end_state, segs[i].latent_state};
        const char *kinds[2] = {"kda_boundary", "mla_segment"};
        for (int k = 0; k < 2; k++) {
            if (ids[k] < 0) continue;
            sqlite3_stmt *sq = NULL;
            int ok = 0;
            char what[64] = "absent";
            if (states &&
                vprep(v, states,
                      "SELECT traj_uid, seg_index, kind, status FROM states WHERE state_id = ?1",
                      &sq) == ARL_OK) {
                sqlite3_bind_int64(sq, 1, ids[k]);
                if (sqlite3_step(sq) == SQLITE_ROW) {
                    const char *su = (const char *)sqlite3_column_text(sq, 0);
                    if (strcmp(su, uid) || sqlite3_column_int(sq, 1) != segs[i].seg_index ||
                        strcmp((const char *)sqlite3_column_text(sq, 2), kinds[k]))
                        finding(v, 1,
                                "%s: trajectory %s segment %d: state %lld belongs to %s segment %d "
                                "(%s), not "
                                "to this segment's %s",
                                d->name, uid, (int)segs[i].seg_index, (long long)ids[k], su,
                                sqlite3_column_int(sq, 1), sqlite3_column_text(sq, 2), kinds[k]);
                    snprintf(what, sizeof what, "%s", sqlite3_column_text(sq, 3));
                    ok = !strcmp(what, "complete");
                }
                sqlite3_finalize(sq);
            }
            /* evicted: the retention rules or the budget at work (every finished trajectory's
             * states under state_cache 'last'), counted in the summary; absent or still
             * 'writing' (lost to a crash or a power failure): a warning each */
            if (!ok && !strcmp(what, "evicted"))
                v->evicted++;
            else if (!ok)
                finding(v, 0, "%s: trajectory %s segment %d: %s state %lld is %s (cache miss)",
                        d->name, uid, (int)segs[i].seg_index, kinds[k], (long long)ids[k], what);
        }
    }
    free(segs);
    /* raw I/O: reconstructed bodies hash to response_sha256; action_json = request's action */
    if (vprep(v, d,
              "SELECT c.call_seq, c.response_body, c.response_sha256, c.request_body, c.endpoint "
              "FROM "
              "env_calls c WHERE c.traj_id = ?1 AND c.response_complete = 1 ORDER BY c.call_seq",
              &q) == ARL_OK) {
        sqlite3_bind_int64(q, 1, t.traj_id);
        while (vstep(v, q) == SQLITE_ROW) {
            int64_t seq = sqlite3_column_int64(q, 0);
            const void *b = sqlite3_column_blob(q, 1);
            size_t n = (size_t)sqlite3_column_bytes(q, 1);
            sqlite3_stmt *iq;
            rimage_ref refs[64];
            uint8_t *copies[64];
            size_t nr = 0;
            if (vprep(
                    v, d,
                    "SELECT r.body_offset, i.png, i.sha256 FROM image_refs r JOIN images i ON "
                    "i.image_id "
                    "= r.image_id WHERE r.traj_id = ?1 AND r.call_seq = ?2 ORDER BY r.body_offset",
                    &iq) == ARL_OK) {
                sqlite3_bind_int64(iq, 1, t.traj_id);
                sqlite3_bind_int64(iq, 2, seq);
                while (nr < 64 && sqlite3_step(iq) == SQLITE_ROW) {
                    size_t pn = (size_t)sqlite3_column_bytes(iq, 1);
                    uint8_t sh[32];
                    arl_sha256(sqlite3_column_blob(iq, 1), pn, sh);
                    if (sqlite3_column_bytes(iq, 2) != 32 ||
                        memcmp(sh, sqlite3_column_blob(iq, 2), 32))
                        finding(v, 1, "%s: an image's PNG does not match its sha256", d->name);
                    copies[nr] = malloc(pn ? pn : 1);
                    if (!copies[nr]) break;
                    memcpy(copies[nr], sqlite3_column_blob(iq, 1), pn);
                    refs[nr] = (rimage_ref){(size_t)sqlite3_column_int64(iq, 0), copies[nr], pn};
                    nr++;
                }
                sqlite3_finalize(iq);
            }
            uint8_t *full = NULL;
            size_t fn = 0;
            if (!b && n == 0)
                finding(v, 1, "%s: trajectory %s call %lld: response_complete but no body", d->name,
                        uid, (long long)seq);
            else if (rimages_restore(b, n, refs, nr, &full, &fn) != ARL_OK)
                finding(v, 1, "%s: trajectory %s call %lld: %s", d->name, uid, (long long)seq,
                        arl_error_msg());
            else {
                uint8_t sh[32];
                arl_sha256(full, fn, sh);
                if (sqlite3_column_bytes(q, 2) != 32 || memcmp(sh, sqlite3_column_blob(q, 2), 32))
                    finding(v, 1,
                            "%s: trajectory %s call %lld: reconstructed response does not match "
                            "response_sha256",
                            d->name, uid, (long long)seq);
            }
            free(full);
            for (size_t i = 0; i < nr; i++)
                free(copies[i]);
        }
        sqlite3_finalize(q);
    }
    if (vprep(v, d,
              "SELECT u.step_index, u.action_json, c.request_body FROM turns u JOIN env_calls c ON "
              "c.traj_id = u.traj_id AND c.call_seq = u.call_seq WHERE u.traj_id = ?1 AND "
              "u.step_index > 0 AND u.action_json IS NOT NULL AND c.endpoint = 'step'",
              &q) == ARL_OK) {
        sqlite3_bind_int64(q, 1, t.traj_id);
        while (vstep(v, q) == SQLITE_ROW) {
            json_error_t ea, er;
            const char *at = (const char *)sqlite3_column_text(q, 1);
            json_t *a = at ? arl_json_loads(at, 0, &ea) : NULL;
            json_t *r = sqlite3_column_blob(q, 2)
                            ? arl_json_loadb(sqlite3_column_blob(q, 2),
                                             (size_t)sqlite3_column_bytes(q, 2), 0, &er)
                            : NULL;
            if (!at || (!a && arl_json_error_nomem(&ea)) ||
                (sqlite3_column_blob(q, 2) && !r && arl_json_error_nomem(&er)))
                check_nomem(v, "comparing action_json with the stored request");
            else if (!json_equal(a, json_object_get(r, "action")))
                finding(
                    v, 1,
                    "%s: trajectory %s step %d: action_json differs from the action in the stored "
                    "request",
                    d->name, uid, sqlite3_column_int(q, 0));
            json_decref(a);
            json_decref(r);
        }
        sqlite3_finalize(q);
    }
    /* cross-file references */
    if (v->st->cat.db) {
        struct {
            const char *sql, *what;
            int64_t id;
        } refs[] = {{"SELECT 1 FROM runs WHERE run_id = ?1", "run", t.run_id},
                    {"SELECT 1 FROM task_groups WHERE group_id = ?1", "group", t.group_id},
                    {"SELECT 1 FROM tasks WHERE task_id = ?1", "task", t.task_id},
                    {"SELECT 1 FROM envs WHERE env_id = ?1", "environment", t.env_id}};
        for (size_t i = 0; i < 4; i++) {
            int64_t one;
            int found = 0;
            sqlite3_stmt *cq;
            if (vprep(v, &v->st->cat, refs[i].sql, &cq) != ARL_OK) continue;
            sqlite3_bind_int64(cq, 1, refs[i].id);
            found = sqlite3_step(cq) == SQLITE_ROW;
            sqlite3_finalize(cq);
            (void)one;
            if (!found)
                finding(v, 1, "%s: trajectory %s: its %s (id %lld) is not in the catalog", d->name,
                        uid, refs[i].what, (long long)refs[i].id);
        }
        /* its group's task and size: a group's members are samples of one task, slots 0..G-1 */
        sqlite3_stmt *gq;
        if (vprep(v, &v->st->cat,
                  "SELECT group_uid, task_id, size FROM task_groups WHERE group_id = ?1",
                  &gq) == ARL_OK) {
            sqlite3_bind_int64(gq, 1, t.group_id);
            if (sqlite3_step(gq) == SQLITE_ROW) {
                const char *g = (const char *)sqlite3_column_text(gq, 0);
                if (sqlite3_column_int64(gq, 1) != t.task_id)
                    finding(v, 1,
                            "%s: trajectory %s is of task id %lld but its group %s is of task id "
                            "%lld (a group's members are samples of one task)",
                            d->name, uid, (long long)t.task_id, g,
                            (long long)sqlite3_column_int64(gq, 1));
                if (t.slot < 0 || t.slot >= sqlite3_column_int(gq, 2))
                    finding(v, 1, "%s: trajectory %s holds slot %d of group %s of %d samples",
                            d->name, uid, (int)t.slot, g, sqlite3_column_int(gq, 2));
            }
            sqlite3_finalize(gq);
        }
        sqlite3_stmt *mq;
        if (vprep(v, &v->st->cat,
                  "SELECT status, traj_id, shard_id FROM group_members WHERE traj_uid = ?1",
                  &mq) == ARL_OK) {
            sqlite3_bind_text(mq, 1, uid, -1, SQLITE_STATIC);
            if (sqlite3_step(mq) == SQLITE_ROW) {
                const char *ms = (const char *)sqlite3_column_text(mq, 0);
                const int32_t member_shard = sqlite3_column_int(mq, 2);
                if (member_shard != (int32_t)(t.traj_id >> REPLAY_TRAJ_ID_SHIFT))
                    finding(v, 1,
                            "%s: trajectory %s is also written in shard %d, whose trajectory is "
                            "the catalog's group member (two writers of one run uid sampled it)",
                            d->name, uid, (int)member_shard);
                else if (strcmp(ms, replay_status_name(t.status)) ||
                         sqlite3_column_int64(mq, 1) != t.traj_id)
                    finding(v, 0,
                            "%s: trajectory %s: the catalog mirror says %s (reconciled at "
                            "coordinator start)",
                            d->name, uid, ms);
            } else {
                finding(v, 0,
                        "%s: trajectory %s is not in the catalog's group_members (reconciled at "
                        "coordinator "
                        "start)",
                        d->name, uid);
            }
            sqlite3_finalize(mq);
        }
    }
}

/* The latent rows of one (state, layer) of a complete mla_segment state, walked in row_start
 * order: they must follow one another from row 0 and end at the state's n_tokens (section 4.12:
 * "one or more latent chunks covering the segment's tokens in order"). */
typedef struct latent_walk {
    int64_t state_id; /* -1: none open */
    int layer;
    int64_t n_tokens, next_row;
    int broken; /* a chunk that did not parse (reported): its rows are not known */
} latent_walk;

static void latent_close(vctx *v, rdb *s, latent_walk *lw) {
    if (lw->state_id >= 0 && !lw->broken && lw->next_row != lw->n_tokens)
        finding(v, 1,
                "%s: state %lld layer %d: the latent chunks cover %lld rows, the state %lld "
                "tokens",
                s->name, (long long)lw->state_id, lw->layer, (long long)lw->next_row,
                (long long)lw->n_tokens);
    lw->state_id = -1;
}

static void check_states_file(vctx *v, rdb *s, rdb *w) {
    sqlite3_stmt *q;
    if (rdb_prepare(s,
                    "SELECT c.state_id, c.layer, c.tensor, c.data, st.kind, st.n_tokens, "
                    "c.row_start, st.status FROM state_chunks c JOIN states st ON st.state_id = "
                    "c.state_id ORDER BY c.state_id, c.layer, c.tensor, c.row_start",
                    &q) != ARL_OK) {
        finding(v, 1, "%s: %s", s->name, arl_error_msg());
        return;
    }
    latent_walk lw = {.state_id = -1};
    while (vstep(v, q) == SQLITE_ROW) {
        const int64_t state_id = sqlite3_column_int64(q, 0);
        const int layer = sqlite3_column_int(q, 1);
        const char *tensor = (const char *)sqlite3_column_text(q, 2);
        const char *kind = (const char *)sqlite3_column_text(q, 4);
        const int latent = !strcmp(tensor, "latent");
        arl_blob_expect ex = {.kind = !strcmp(tensor, "S")      ? ARL_BLOB_KDA_STATE
                                      : !strcmp(tensor, "conv") ? ARL_BLOB_CONV_TAIL
                                                                : ARL_BLOB_MLA_LATENT};
        if (latent != !strcmp(kind, "mla_segment"))
            finding(v, 1, "%s: state %lld (%s) layer %d holds a '%s' chunk", s->name,
                    (long long)state_id, kind, layer, tensor);
        arl_blob_header h;
        const int ok = arl_blob_check(sqlite3_column_blob(q, 3), (size_t)sqlite3_column_bytes(q, 3),
                                      &ex, &h, NULL) == ARL_OK;
        if (!ok)
            finding(v, 1, "%s: state %lld layer %d %s: %s", s->name, (long long)state_id, layer,
                    tensor, arl_error_msg());
        if (!latent || strcmp(kind, "mla_segment") ||
            strcmp((const char *)sqlite3_column_text(q, 7), "complete"))
            continue;
        if (lw.state_id != state_id || lw.layer != layer) {
            latent_close(v, s, &lw);
            lw = (latent_walk){state_id, layer, sqlite3_column_int64(q, 5), 0, 0};
        }
        const int64_t row_start = sqlite3_column_int64(q, 6);
        if (!ok || h.ndim != 2) lw.broken = 1;
        if (lw.broken) continue;
        if (row_start != lw.next_row)
            finding(v, 1,
                    "%s: state %lld layer %d: a latent chunk starts at row %lld, the chunks "
                    "before it end at row %lld (a %s)",
                    s->name, (long long)state_id, layer, (long long)row_start,
                    (long long)lw.next_row, row_start > lw.next_row ? "gap" : "overlap");
        lw.next_row = row_start + (int64_t)h.dims[0];
    }
    latent_close(v, s, &lw);
    sqlite3_finalize(q);
    /* orphans: complete states no segment refers to (collected by GC, section 7.6); in a tool
     * file a re-score's states (producer 'tool') are referenced by its rescores rows of the
     * same trajectory and segment instead */
    if (w && vprep(v, s,
                   "SELECT state_id, traj_uid, seg_index, status, producer FROM states WHERE "
                   "status != 'evicted'",
                   &q) == ARL_OK) {
        sqlite3_stmt *rq = NULL, *tq = NULL;
        vprep(v, w,
              "SELECT 1 FROM segments WHERE end_state_id = ?1 OR latent_state_id = ?1 LIMIT 1",
              &rq);
        if (w->kind == REPLAY_FILE_TOOL)
            vprep(v, w, "SELECT 1 FROM rescores WHERE traj_uid = ?1 AND seg_index = ?2 LIMIT 1",
                  &tq);
        while (rq && vstep(v, q) == SQLITE_ROW) {
            sqlite3_reset(rq);
            sqlite3_bind_int64(rq, 1, sqlite3_column_int64(q, 0));
            int rc = vstep(v, rq), ref = rc == SQLITE_ROW;
            const char *prod = (const char *)sqlite3_column_text(q, 4);
            if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = 0;
            if (!rc && !ref && tq && prod && !strcmp(prod, "tool")) {
                sqlite3_reset(tq);
                sqlite3_bind_text(tq, 1, (const char *)sqlite3_column_text(q, 1), -1,
                                  SQLITE_TRANSIENT);
                sqlite3_bind_int(tq, 2, sqlite3_column_int(q, 2));
                rc = vstep(v, tq);
                ref = rc == SQLITE_ROW;
                if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = 0;
            }
            if (rc) continue; /* the look-up failed (counted): no orphan claimed */
            if (!ref)
                finding(v, 0,
                        "%s: state %lld (%s segment %d, %s) is referenced by no segment (orphan, "
                        "removed by "
                        "gc)",
                        s->name, (long long)sqlite3_column_int64(q, 0), sqlite3_column_text(q, 1),
                        sqlite3_column_int(q, 2), sqlite3_column_text(q, 3));
        }
        sqlite3_finalize(rq);
        sqlite3_finalize(tq);
        sqlite3_finalize(q);
    }
}

/* How many catalog group_members rows refer to trajectories of shard shard_id (by their
 * shard_id, or by traj_id >> 40, the shard part of a global id), and the uid of one into
 * example (cap bytes; "" when none). -1 when the catalog cannot be read. */
static int64_t members_in_shard(replay_store *st, int32_t shard_id, char *example, size_t cap) {
    if (cap) example[0] = 0;
    if (!st->cat.db) return 0;
    sqlite3_stmt *q;
    if (rdb_prepare(&st->cat,
                    "SELECT count(*), min(traj_uid) FROM group_members WHERE shard_id = ?1 OR "
                    "(traj_id >> 40) = ?1",
                    &q) != ARL_OK) {
        arl_error_clear();
        return -1;
    }
    sqlite3_bind_int(q, 1, shard_id);
    int64_t n = -1;
    if (sqlite3_step(q) == SQLITE_ROW) {
        n = sqlite3_column_int64(q, 0);
        rdb_col_text(q, 1, example, cap);
    }
    sqlite3_finalize(q);
    return n;
}

/* A registered shard whose file is missing or has no schema (what = "its file is missing" or
 * "its file is empty, without a schema"): an error when the catalog's group_members refer to
 * trajectories in it (their data is lost), else a warning (a writer that died while creating
 * it). */
static void lost_shard(vctx *v, int32_t shard_id, const char *file, const char *what) {
    char ex[REPLAY_UID_MAX + 1];
    const int64_t n = members_in_shard(v->st, shard_id, ex, sizeof ex);
    if (n > 0)
        finding(v, 1,
                "%s: shard %d is registered in the catalog but %s, and the catalog's "
                "group_members refer to %lld trajectories in it (e.g. %s): their data is lost; "
                "restore the file from a backup",
                file, (int)shard_id, what, (long long)n, ex);
    else
        finding(v, 0,
                "%s: shard %d is registered in the catalog but %s, and nothing refers to it (its "
                "writer died while creating it)",
                file, (int)shard_id, what);
}

arl_status rstore_report_missing(replay_store *st, int32_t only_shard, FILE *out, int *n_missing) {
    *n_missing = 0;
    if (!st->cat.db) return ARL_OK;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat, "SELECT shard_id, file_name FROM shards ORDER BY shard_id", &q));
    arl_status first = ARL_OK;
    char first_msg[1024] = "";
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const int32_t id = sqlite3_column_int(q, 0);
        const char *file = (const char *)sqlite3_column_text(q, 1);
        if (only_shard > 0 && id != only_shard) continue;
        char *p = rstore_join(st->dir, file);
        const int missing = p && rstore_file_missing(p);
        free(p);
        if (!missing) continue;
        (*n_missing)++;
        char ex[REPLAY_UID_MAX + 1];
        const int64_t n = members_in_shard(st, id, ex, sizeof ex);
        if (n > 0) {
            if (out)
                fprintf(out,
                        "%s: failed: registered in the catalog but its file is missing: the %lld "
                        "trajectories the catalog has in it (e.g. %s) are lost (restore the file "
                        "from a backup; 'agentrl replay verify' lists the damage)\n",
                        file, (long long)n, ex);
            if (first == ARL_OK) {
                first = ARL_ERR_CORRUPT;
                snprintf(first_msg, sizeof first_msg,
                         "replay: %s: registered in the catalog but its file is missing, with the "
                         "%lld trajectories the catalog has in it (e.g. %s): restore it from a "
                         "backup ('agentrl replay verify' lists the damage)",
                         file, (long long)n, ex);
            }
        } else if (out) {
            fprintf(out,
                    "%s: skipped: registered in the catalog but its file is missing; nothing "
                    "refers to it (its writer died while creating it)\n",
                    file);
        }
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "listing the shards");
    return first == ARL_OK ? ARL_OK : arl_errorf(first, "%s", first_msg);
}

void replay_shards_warn_unreadable(replay_store *st, FILE *err) {
    if (!st->cat.db || !err) return;
    sqlite3_stmt *q;
    if (rdb_prepare(&st->cat, "SELECT shard_id, file_name FROM shards ORDER BY shard_id", &q) !=
        ARL_OK) {
        arl_error_clear();
        return;
    }
    while (sqlite3_step(q) == SQLITE_ROW) {
        const int32_t id = sqlite3_column_int(q, 0);
        const char *file = (const char *)sqlite3_column_text(q, 1);
        rshard *sh = rstore_shard(st, id);
        char ex[REPLAY_UID_MAX + 1] = "";
        int64_t n = 0; /* counted only for a file that is not readable (a scan of the members) */
        char what[512] = "";
        rdb *d;
        char *p = sh ? NULL : rstore_join(st->dir, file);
        const int missing = !sh && p && rstore_file_missing(p); /* not a new one's writer's */
        free(p);
        if (!sh && !missing) continue;
        if (!sh)
            snprintf(what, sizeof what, "is registered in the catalog but its file is missing");
        else if (rstore_shard_db(st, sh, &d) != ARL_OK)
            snprintf(what, sizeof what, "cannot be read (%s)", arl_error_msg());
        else if (d->empty && (n = members_in_shard(st, id, ex, sizeof ex)) > 0)
            snprintf(what, sizeof what, "is empty, without a schema");
        arl_error_clear();
        if (!what[0]) continue;
        if (!n) n = members_in_shard(st, id, ex, sizeof ex);
        if (n > 0)
            fprintf(err,
                    "warning: %s %s: the %lld trajectories the catalog has in it (e.g. %s) are "
                    "left out; run 'agentrl replay verify' on the store\n",
                    file, what, (long long)n, ex);
        else
            fprintf(err, "warning: %s %s; run 'agentrl replay verify' on the store\n", file, what);
    }
    sqlite3_finalize(q);
}

static void check_ledger(vctx *v) {
    rdb *c = &v->st->cat;
    sqlite3_stmt *q;
    if (vprep(v, c,
              "SELECT g.group_id, count(*) FROM update_groups g JOIN updates u ON u.run_id = "
              "g.run_id AND "
              "u.update_n = g.update_n WHERE u.status = 'committed' GROUP BY g.group_id "
              "HAVING count(*) > 1",
              &q) == ARL_OK) {
        while (vstep(v, q) == SQLITE_ROW)
            finding(v, 1, "catalog.sqlite: group %lld is in %d committed updates",
                    (long long)sqlite3_column_int64(q, 0), sqlite3_column_int(q, 1));
        sqlite3_finalize(q);
    }
    if (vprep(v, c,
              "SELECT group_id FROM task_groups t WHERE status = 'consumed' AND (SELECT "
              "count(*) FROM "
              "update_groups g JOIN updates u ON u.run_id = g.run_id AND u.update_n = "
              "g.update_n WHERE "
              "g.group_id = t.group_id AND u.status = 'committed') != 1",
              &q) == ARL_OK) {
        while (vstep(v, q) == SQLITE_ROW)
            finding(v, 1,
                    "catalog.sqlite: consumed group %lld is not in exactly one committed update",
                    (long long)sqlite3_column_int64(q, 0));
        sqlite3_finalize(q);
    }
    /* registered shards without files */
    if (vprep(v, c, "SELECT shard_id, file_name FROM shards ORDER BY shard_id", &q) == ARL_OK) {
        while (vstep(v, q) == SQLITE_ROW) {
            char *p = rstore_join(v->st->dir, (const char *)sqlite3_column_text(q, 1));
            if (p && rstore_file_missing(p))
                lost_shard(v, sqlite3_column_int(q, 0), (const char *)sqlite3_column_text(q, 1),
                           "its file is missing");
            free(p);
        }
        sqlite3_finalize(q);
    }
}

/* The catalog's group_members against the shards (section 13.5 item 6): a member whose
 * trajectory its shard does not hold.  A running one is a warning (its writer claims the member
 * just before T0 and may die in between; reconciled at coordinator start); a final one is an
 * error: the shard had it and lost it (a shard restored from an older backup).  Members of a
 * shard whose file is missing, empty or unreadable are reported with that file. */
static void check_members(vctx *v) {
    sqlite3_stmt *q;
    if (vprep(v, &v->st->cat,
              "SELECT traj_uid, shard_id, status FROM group_members ORDER BY shard_id, traj_uid",
              &q) != ARL_OK)
        return;
    while (vstep(v, q) == SQLITE_ROW) {
        const char *uid = (const char *)sqlite3_column_text(q, 0);
        const int32_t shard_id = sqlite3_column_int(q, 1);
        const char *status = (const char *)sqlite3_column_text(q, 2);
        rshard *sh = rstore_shard(v->st, shard_id);
        rdb *d = NULL;
        if (sh) {
            const arl_status os = rstore_shard_db(v->st, sh, &d);
            if (os == ARL_ERR_NOMEM) check_nomem(v, "opening a shard to find its group members");
            arl_error_clear();
            if (os != ARL_OK || d->empty) continue; /* reported with the shard's file */
        }
        sqlite3_stmt *tq;
        int found = 0;
        if (sh) {
            if (vprep(v, d, "SELECT 1 FROM trajectories WHERE traj_uid = ?1", &tq) != ARL_OK)
                continue;
            sqlite3_bind_text(tq, 1, uid, -1, SQLITE_STATIC);
            const int rc = vstep(v, tq);
            found = rc == SQLITE_ROW;
            sqlite3_finalize(tq);
            if (rc != SQLITE_ROW && rc != SQLITE_DONE) continue; /* counted, or not a finding */
        }
        if (found) continue;
        if (!strcmp(status, "running"))
            finding(v, 0,
                    "catalog.sqlite: group member %s (running) is not in shard %d (its writer "
                    "died before writing it; reconciled at coordinator start)",
                    uid, (int)shard_id);
        else
            finding(v, 1,
                    "catalog.sqlite: group member %s is %s in the catalog but shard %d holds no "
                    "such trajectory: its data is lost (restore the shard from a backup)",
                    uid, status, (int)shard_id);
    }
    sqlite3_finalize(q);
}

arl_status replay_verify(replay_store *st, const replay_verify_opts *o, FILE *out,
                         int64_t *n_errors, int64_t *n_warnings) {
    vctx v = {.out = out, .st = st, .newest_version = -1};
    int full = o && o->full;
    ARL_TRY(replay_store_refresh(st));
    int64_t n_traj = 0;
    if (st->cat.db) {
        integrity(&v, &st->cat, full);
        meta_check(&v, &st->cat, 0);
        int found;
        if (rdb_query_int(&st->cat, "SELECT max(version) FROM policy_versions", &v.newest_version,
                          &found) != ARL_OK ||
            !found)
            v.newest_version = -1;
        sqlite3_stmt *q;
        if (vprep(&v, &st->cat, "SELECT count(*), max(version) IS NULL FROM policy_versions", &q) ==
            ARL_OK) {
            if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int(q, 1)) v.newest_version = -1;
            sqlite3_finalize(q);
        }
        check_ledger(&v);
    }
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        rdb *d;
        if (rstore_shard_db(st, sh, &d) != ARL_OK) {
            finding(&v, 1, "%s: cannot be opened: %s", sh->file, arl_error_msg());
            continue;
        }
        if (d->empty) {
            lost_shard(&v, sh->shard_id, sh->file, "its file is empty, without a schema");
            continue;
        }
        integrity(&v, d, full);
        meta_check(&v, d, sh->shard_id);
        rdb *sd = NULL;
        if (sh->kind != REPLAY_FILE_LEARNER) {
            arl_status ss = rstore_shard_states(st, sh, &sd);
            if (ss != ARL_OK) {
                sd = NULL;
                if (ss != ARL_ERR_NOT_FOUND)
                    finding(&v, 1, "%s: states file: %s", sh->file, arl_error_msg());
            } else if (!sd->empty) {
                integrity(&v, sd, full);
                meta_check(&v, sd, sh->shard_id);
                check_states_file(&v, sd, d);
            }
            sqlite3_stmt *q;
            if (rdb_prepare(d, "SELECT " RTRAJ_COLS " FROM trajectories ORDER BY traj_id", &q) !=
                ARL_OK) {
                finding(&v, 1, "%s: %s", sh->file, arl_error_msg());
                continue;
            }
            int rc;
            while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
                int64_t before = v.errors;
                check_trajectory(&v, d, q, sh->shard_id, sd);
                const char *status = (const char *)sqlite3_column_text(q, 9);
                if (o && o->repair && v.errors > before && status && strcmp(status, "masked"))
                    want_repair(&v, sh->shard_id, sh->kind, sqlite3_column_int64(q, 0));
                n_traj++;
            }
            if (rc != SQLITE_DONE)
                finding(&v, 1, "%s: reading trajectories: %s", sh->file, sqlite3_errmsg(d->db));
            sqlite3_finalize(q);
            /* images no reference uses */
            if (vprep(&v, d,
                      "SELECT count(*) FROM images i WHERE NOT EXISTS (SELECT 1 FROM "
                      "image_refs r WHERE "
                      "r.image_id = i.image_id)",
                      &q) == ARL_OK) {
                if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int64(q, 0))
                    finding(&v, 0, "%s: %lld images are referenced by no body (orphans)", sh->file,
                            (long long)sqlite3_column_int64(q, 0));
                sqlite3_finalize(q);
            }
        }
        if (sh->kind == REPLAY_FILE_LEARNER || sh->kind == REPLAY_FILE_TOOL) {
            static const char *const cols[5] = {"old_logprobs", "ref_logprobs", "is_weights",
                                                "token_flags", "advantages"};
            static const arl_blob_kind kinds[5] = {ARL_BLOB_OLD_LOGPROBS, ARL_BLOB_REF_LOGPROBS,
                                                   ARL_BLOB_IS_WEIGHTS, ARL_BLOB_TOKEN_FLAGS,
                                                   ARL_BLOB_ADVANTAGES};
            sqlite3_stmt *q;
            if (vprep(
                    &v, d,
                    "SELECT traj_uid, seg_index, update_n, old_logprobs, ref_logprobs, is_weights, "
                    "token_flags, advantages FROM learner_records",
                    &q) == ARL_OK) {
                while (vstep(&v, q) == SQLITE_ROW) {
                    const char *uid = (const char *)sqlite3_column_text(q, 0);
                    int seg = sqlite3_column_int(q, 1);
                    replay_traj_row t;
                    int64_t n = -1;
                    if (replay_traj_get(st, uid, &t) == ARL_OK) {
                        replay_seg_data sd2 = {0};
                        if (replay_segment_load(st, t.traj_id, seg, 0, &sd2) == ARL_OK)
                            n = sd2.ref.n_tokens;
                        replay_seg_data_free(&sd2);
                    }
                    if (n < 0)
                        finding(&v, 1,
                                "%s: learner record of %s segment %d refers to no stored segment",
                                sh->file, uid, seg);
                    for (int k = 0; k < 5; k++) {
                        arl_blob_expect ex = {
                            .kind = kinds[k], .dims_mask = n >= 0 ? 1u : 0u, .dims = {(uint64_t)n}};
                        arl_blob_header h;
                        if (arl_blob_check(sqlite3_column_blob(q, 3 + k),
                                           (size_t)sqlite3_column_bytes(q, 3 + k), &ex, &h,
                                           NULL) != ARL_OK)
                            finding(&v, 1, "%s: learner record %s segment %d update %d %s: %s",
                                    sh->file, uid, seg, sqlite3_column_int(q, 2), cols[k],
                                    arl_error_msg());
                    }
                }
                sqlite3_finalize(q);
            }
        }
    }
    if (st->cat.db) check_members(&v);
    fprintf(out, "verify %s: %zu files, %lld trajectories: %lld errors, %lld warnings", st->root,
            st->n_shards + (st->cat.db ? 1 : 0), (long long)n_traj, (long long)v.errors,
            (long long)v.warnings);
    if (v.evicted)
        fprintf(out,
                "; %lld cached states that segments refer to were evicted by the retention rules "
                "(cache misses: recomputed when needed)",
                (long long)v.evicted);
    fputc('\n', out);
    if (n_errors) *n_errors = v.errors;
    if (n_warnings) *n_warnings = v.warnings;
    arl_status rs = ARL_OK;
    if (v.nomem) /* never a repair after an incomplete check */
        rs = arl_errorf(ARL_ERR_NOMEM,
                        "replay: %s: %lld checks could not run (out of memory, or no temporary "
                        "file): the verification is incomplete, run it again",
                        st->root, (long long)v.nomem);
    else if (o && o->repair) {
        if (!st->cat.db || st->cat.readonly)
            rs = arl_errorf(ARL_ERR_STATE,
                            "replay: %s: --repair needs a store root with a writable catalog",
                            st->root);
        else
            rs = repair(&v);
    }
    free(v.rep);
    return rs;
}

/* ---- recover ---- */

arl_status replay_recover(replay_store *st, int mask, FILE *out, int64_t *n_found) {
    if (!st->cat.db || st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: recover needs a store root with a writable catalog",
                          st->root);
    ARL_TRY(replay_store_refresh(st));
    int64_t found = 0;
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    arl_status s = ARL_OK;
    for (size_t i = 0; i < n && s == ARL_OK; i++) {
        if (ref[i].kind != REPLAY_FILE_WORKER && ref[i].kind != REPLAY_FILE_TOOL) continue;
        if (rstore_shard_sealed(st, ref[i].id)) continue; /* sealed when its writer finished */
        replay_writer *w = NULL;
        arl_status o = rwriter_open(st, (replay_file_kind)ref[i].kind, ref[i].id, NULL, 1, &w);
        char *rel = rstore_shard_rel(ref[i].kind, ref[i].id);
        if (o == ARL_ERR_BUSY) {
            fprintf(out, "%s: writer alive: %s\n", rel ? rel : "?", arl_error_msg());
            free(rel);
            continue;
        }
        if (o != ARL_OK) {
            s = o;
            free(rel);
            break;
        }
        const int64_t *tids;
        size_t nt;
        /* the lock was free: nobody generates this file's running trajectories */
        if ((s = rwriter_scan_running(w)) != ARL_OK) {
            replay_writer_close(w);
            free(rel);
            break;
        }
        replay_writer_interrupted(w, &tids, &nt);
        for (size_t k = 0; k < nt; k++) {
            replay_traj_row t;
            if (replay_traj_get_id(st, tids[k], &t) != ARL_OK || t.status != REPLAY_RUNNING)
                continue;
            int masks = mask || t.n_segments == 0;
            fprintf(out, "%s: interrupted %s (%d committed segments, %lld tokens): %s\n",
                    rel ? rel : "?", t.traj_uid, (int)t.n_segments, (long long)t.n_tokens,
                    masks ? "masked INTERRUPTED" : "resumable ('interrupted' event written)");
            found++;
        }
        s = replay_writer_recover(w, mask, NULL, NULL);
        replay_writer_close(w);
        free(rel);
    }
    free(ref);
    if (s == ARL_OK)
        fprintf(out, "recover %s: %lld interrupted trajectories\n", st->root, (long long)found);
    if (n_found) *n_found = found;
    return s;
}
