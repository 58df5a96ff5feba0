/* replay/gc.c: retention of cached rollout states (spec/replay.md sections 7.6 and 9.3) in a
 * writer's states file, and `gc` over every shard of a store (section 13.8):
 *   1. garbage: 'writing' states and complete states no segment references, older than
 *      min_age_ms, are deleted (replay_states_gc);
 *   2. state_cache.rollout: 'last' keeps, per running trajectory, the newest committed
 *      boundary only (its kda_boundary and the mla_segment states since the last fresh or fork
 *      start) and evicts the rollout states of final trajectories; 'off' evicts every rollout
 *      state; 'all' keeps them;
 *   3. the byte budget: while the complete states exceed it, evict in ascending
 *      last_used_at_ms, states of running trajectories last.
 * In a learner file (learner-produced states) step 1 counts a state referenced when a
 * learner record of its trajectory and segment exists or its trajectory's group is consumed
 * (replay/writer.c learner_state_consumed), and step 2 is state_cache.learner:
 * 'off' and 'pinned' evict the states of consumed trajectories (their group is consumed in
 * the catalog), 'all' keeps them; the budget of step 3 applies as well.
 * Pinned trajectories (catalog pins) keep everything.  Eviction sets status 'evicted' and
 * deletes the chunks: the row stays as a tombstone.  A reader then sees a cache miss.
 * Pins are written by other processes (`agentrl replay pin`) at any time: the eviction reads
 * them again under the catalog's write lock (evict), which replay_pin needs too, so a pin that
 * returned before an eviction keeps its states and one that commits later waits for it.
 * A sealed shard is immutable, its states file is not (a cache, section 2.3): gc opens the
 * sealed file read-only and collects its states file under the shard's lock (sealed_writer).
 * A file that fails is reported and gc goes on with the others; the first error is returned. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "replay/inspect.h"
#include "replay/internal.h"

typedef struct gc_state {
    int64_t id, bytes, last_used;
    int32_t seg_index;
    int is_kda, running, pinned, evict;
    char uid[REPLAY_UID_MAX + 1]; /* its trajectory: evict reads its pin again */
} gc_state;

static void (*test_hook)(void *arg);
static void *test_hook_arg;

void rgc_test_hook_set(void (*fn)(void *arg), void *arg) {
    test_hook = fn;
    test_hook_arg = arg;
}

static int by_lru(const void *a, const void *b) {
    const gc_state *x = *(const gc_state *const *)a, *y = *(const gc_state *const *)b;
    if (x->running != y->running) return x->running - y->running; /* running ones last */
    if (x->last_used != y->last_used) return x->last_used < y->last_used ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Per trajectory uid: running?, last committed segment L and last fresh/fork start F. */
static arl_status traj_bounds(replay_writer *w, const char *uid, int *found, int *running,
                              int32_t *L, int32_t *F) {
    sqlite3_stmt *q;
    *found = 0;
    ARL_TRY(rdb_prepare(&w->w,
                        "SELECT s.seg_index, s.start_kind, t.status FROM trajectories t LEFT JOIN "
                        "segments s ON s.traj_id = t.traj_id WHERE t.traj_uid = ?1 ORDER BY "
                        "s.seg_index",
                        &q));
    sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    *L = -1;
    *F = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        *found = 1;
        *running = !strcmp((const char *)sqlite3_column_text(q, 2), "running");
        if (sqlite3_column_type(q, 0) == SQLITE_NULL) continue;
        int32_t si = sqlite3_column_int(q, 0);
        const char *k = (const char *)sqlite3_column_text(q, 1);
        if (k && strcmp(k, "continue")) *F = si; /* fresh or fork: the context restarts */
        *L = si;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&w->w, rc, "reading trajectories for retention");
    return ARL_OK;
}

/* Whether trajectory uid belongs to a consumed group (catalog; no catalog: not consumed). */
static arl_status traj_consumed(replay_store *st, const char *uid, int *consumed) {
    *consumed = 0;
    if (!st->cat.db) return ARL_OK;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT 1 FROM group_members m JOIN task_groups g ON g.group_id = "
                        "m.group_id WHERE m.traj_uid = ?1 AND g.status = 'consumed'",
                        &q));
    sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rdb_fail(&st->cat, rc, "reading group status for retention");
    *consumed = rc == SQLITE_ROW;
    return ARL_OK;
}

/* States evicted per batch: a batch holds the catalog's write lock (below), which the
 * coordinator's and the workers' catalog writes and replay_pin wait for (busy_timeout 10 s);
 * deleting 64 chunked states takes far less. */
#define GC_EVICT_BATCH 64

/* 1 in *pinned if trajectory uid is pinned now (q: SELECT 1 FROM pins WHERE traj_uid = ?1). */
static arl_status pin_now(rdb *cat, sqlite3_stmt *q, const char *uid, int *pinned) {
    sqlite3_reset(q);
    sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    *pinned = rc == SQLITE_ROW;
    sqlite3_reset(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(cat, rc, "reading pins");
    return ARL_OK;
}

/* Evict the states of v marked evict, in batches of GC_EVICT_BATCH.  Each batch takes the
 * catalog's write lock (a transaction that writes nothing), reads the pins of its states'
 * trajectories again, and evicts the unpinned ones in one states transaction committed before
 * the lock is let go: the pin check and the eviction are atomic with respect to replay_pin in
 * any process (a pin committed since replay_states_retain read the pins is seen; a later one
 * waits for the batch).  Catalog first, then the states file: the only order anyone takes the
 * two in.  *evicted and *freed count the committed batches. */
static arl_status evict(replay_writer *w, gc_state **v, size_t n, int64_t *evicted,
                        int64_t *freed) {
    rdb *db = &w->s, *cat = w->st->cat.db ? &w->st->cat : NULL;
    arl_status s = ARL_OK;
    size_t i = 0;
    while (s == ARL_OK) {
        while (i < n && !v[i]->evict)
            i++;
        if (i == n) break;
        sqlite3_stmt *up = NULL, *dc = NULL, *pq = NULL;
        int64_t ne = 0, nb = 0;
        if (cat) {
            ARL_TRY(rdb_begin(cat));
            s = rdb_prepare(cat, "SELECT 1 FROM pins WHERE traj_uid = ?1", &pq);
        }
        if (s == ARL_OK) s = rdb_begin(db);
        int in_tx = s == ARL_OK;
        if (s == ARL_OK)
            s = rdb_prepare(db, "UPDATE states SET status = 'evicted' WHERE state_id = ?1", &up);
        if (s == ARL_OK) s = rdb_prepare(db, "DELETE FROM state_chunks WHERE state_id = ?1", &dc);
        for (int k = 0; s == ARL_OK && i < n && k < GC_EVICT_BATCH; i++) {
            if (!v[i]->evict) continue;
            k++;
            int pinned = 0;
            if (pq && (s = pin_now(cat, pq, v[i]->uid, &pinned)) != ARL_OK) break;
            if (pinned) { /* pinned since the pins were read: it keeps its states */
                v[i]->evict = 0;
                continue;
            }
            sqlite3_reset(dc);
            sqlite3_bind_int64(dc, 1, v[i]->id);
            int rc = sqlite3_step(dc);
            if (rc == SQLITE_DONE) {
                sqlite3_reset(up);
                sqlite3_bind_int64(up, 1, v[i]->id);
                rc = sqlite3_step(up);
            }
            if (rc != SQLITE_DONE) {
                s = rdb_fail(db, rc, "evicting a state");
                break;
            }
            ne++;
            nb += v[i]->bytes;
        }
        sqlite3_finalize(up);
        sqlite3_finalize(dc);
        sqlite3_finalize(pq);
        if (in_tx) s = rdb_end(db, s);
        if (cat) rdb_rollback(cat); /* nothing written: let the lock go */
        if (s == ARL_OK) {
            *evicted += ne;
            *freed += nb;
        }
    }
    return s;
}

arl_status replay_states_retain(replay_writer *w, const replay_retention *r, replay_gc_stats *out) {
    replay_gc_stats z;
    memset(&z, 0, sizeof z);
    const char *mode = r && r->rollout ? r->rollout : "last";
    if (strcmp(mode, "last") && strcmp(mode, "all") && strcmp(mode, "off"))
        return arl_errorf(ARL_ERR_ARG,
                          "replay: state_cache.rollout '%s': expected last, all or off", mode);
    const char *lmode = r && r->learner ? r->learner : "off";
    if (strcmp(lmode, "off") && strcmp(lmode, "pinned") && strcmp(lmode, "all"))
        return arl_errorf(ARL_ERR_ARG,
                          "replay: state_cache.learner '%s': expected off, pinned or all", lmode);
    int learner_file = w->kind == REPLAY_FILE_LEARNER;
    /* 1. garbage (section 7.6) */
    ARL_TRY(replay_states_gc(w, r && r->min_age_ms >= 0 ? r->min_age_ms : 3600 * 1000, &z.deleted));
    /* 2. the complete states with what retention needs to know about them */
    gc_state *st = NULL;
    size_t n = 0, cap = 0;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&w->s,
                        "SELECT state_id, traj_uid, seg_index, kind, producer, n_bytes, "
                        "last_used_at_ms FROM states WHERE status = 'complete' ORDER BY traj_uid, "
                        "state_id",
                        &q));
    char cur[REPLAY_UID_MAX + 1] = "";
    int found = 0, running = 0, pinned = 0, have = 0, consumed = 0;
    int32_t L = -1, F = 0;
    arl_status s = ARL_OK;
    int rc;
    while (s == ARL_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *uid = (const char *)sqlite3_column_text(q, 1);
        if (!have || strcmp(uid, cur)) {
            snprintf(cur, sizeof cur, "%s", uid);
            have = 1;
            if (learner_file) { /* no trajectories here: the catalog says whether consumed */
                found = 1;
                running = 0;
                if ((s = traj_consumed(w->st, cur, &consumed)) != ARL_OK) break;
            } else if ((s = traj_bounds(w, cur, &found, &running, &L, &F)) != ARL_OK) {
                break;
            }
            if ((s = replay_pin_get(w->st, cur, &pinned, NULL, 0)) != ARL_OK) break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            gc_state *p = realloc(st, cap * sizeof *p);
            if (!p) {
                s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
                break;
            }
            st = p;
        }
        gc_state *g = &st[n++];
        g->id = sqlite3_column_int64(q, 0);
        snprintf(g->uid, sizeof g->uid, "%s", cur);
        g->seg_index = sqlite3_column_int(q, 2);
        g->is_kda = !strcmp((const char *)sqlite3_column_text(q, 3), "kda_boundary");
        int rollout = !strcmp((const char *)sqlite3_column_text(q, 4), "rollout");
        g->bytes = sqlite3_column_int64(q, 5);
        g->last_used = sqlite3_column_int64(q, 6);
        g->running = found && running;
        g->pinned = pinned;
        g->evict = 0;
        if (learner_file) { /* state_cache.learner */
            if (!rollout && !pinned && consumed && strcmp(lmode, "all")) g->evict = 1;
            continue;
        }
        /* a states row of a trajectory this file does not hold is left alone */
        if (!found || pinned || !rollout || !strcmp(mode, "all")) continue;
        if (!strcmp(mode, "off") || !running) {
            g->evict = 1;
        } else if (g->seg_index <= L) { /* later ones belong to a segment not yet committed */
            g->evict = g->is_kda ? g->seg_index < L : g->seg_index < F;
        }
    }
    sqlite3_finalize(q);
    if (s == ARL_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
        s = rdb_fail(&w->s, rc, "listing states for retention");
    /* 3. the byte budget */
    gc_state **order = s == ARL_OK && n ? malloc(n * sizeof *order) : NULL;
    if (s == ARL_OK && n && !order) s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    if (s == ARL_OK && n) {
        int64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            order[i] = &st[i];
            if (!st[i].evict) total += st[i].bytes;
        }
        if (r && r->budget_bytes > 0 && total > r->budget_bytes) {
            qsort(order, n, sizeof *order, by_lru);
            for (size_t i = 0; i < n && total > r->budget_bytes; i++) {
                if (order[i]->evict || order[i]->pinned) continue;
                order[i]->evict = 1;
                total -= order[i]->bytes;
            }
        }
        if (test_hook) test_hook(test_hook_arg); /* a pin from elsewhere could come now */
        s = evict(w, order, n, &z.evicted, &z.bytes_freed);
    }
    free(order);
    free(st);
    if (s != ARL_OK) return s;
    if (z.evicted) { /* return the chunks' pages to the file system (section 7.6) */
        char vac[64];
        snprintf(vac, sizeof vac, "PRAGMA incremental_vacuum(%d)",
                 (1 << 30) / RDB_PAGE_SIZE_STATES);
        ARL_TRY(rdb_exec(&w->s, vac));
    }
    if (out) *out = z;
    return ARL_OK;
}

/* A writer of a sealed shard's states file only: the shard's lock, the sealed file opened
 * read-only (the segments that reference states), its states file read-write.  *out = NULL
 * when the shard has no states file.  Close with replay_writer_close. */
static arl_status sealed_writer(replay_store *st, rshard *sh, replay_writer **out) {
    *out = NULL;
    replay_writer *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    w->st = st;
    w->kind = sh->kind;
    w->shard_id = sh->shard_id;
    w->lock_fd = -1;
    size_t n = strlen(sh->file), m = strlen(sh->path);
    w->file = strdup(sh->file);
    w->states_file = malloc(n + 16);
    w->lock_path = malloc(m + 8);
    char *spath = malloc(m + 16);
    arl_status s = ARL_OK;
    if (!w->file || !w->states_file || !w->lock_path || !spath || n < 7 || m < 7) {
        s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        goto done;
    }
    snprintf(w->states_file, n + 16, "%.*s.states.sqlite", (int)(n - 7), sh->file);
    snprintf(spath, m + 16, "%.*s.states.sqlite", (int)(m - 7), sh->path);
    sprintf(w->lock_path, "%s.lock", sh->path);
    if ((s = rlock_acquire(w->lock_path, w->file, 1, &w->lock_fd, &w->lock_dev, &w->lock_ino)) !=
        ARL_OK)
        goto done;
    struct stat sb;
    if (stat(spath, &sb) != 0) goto done; /* no states: nothing to collect */
    if ((s = rdb_open(&w->w, sh->path, w->file, sh->kind, RDB_READONLY, st->vfs, NULL)) != ARL_OK)
        goto done;
    if ((s = rdb_open(&w->s, spath, w->states_file, REPLAY_FILE_STATES, 0, st->vfs, NULL)) !=
        ARL_OK)
        goto done;
    *out = w;
    w = NULL;
done:
    free(spath);
    replay_writer_close(w);
    return s;
}

arl_status replay_gc(replay_store *st, const replay_retention *r, FILE *out,
                     replay_gc_stats *total) {
    ARL_TRY(rstore_need_root(st, "gc"));
    ARL_TRY(replay_store_refresh(st));
    replay_gc_stats sum;
    memset(&sum, 0, sizeof sum);
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    arl_status first = ARL_OK; /* the first failure; the other files are still collected */
    char *first_msg = NULL;
    int n_missing = 0; /* registered shards without a file: reported, the data lost an error */
    if ((first = rstore_report_missing(st, 0, out, &n_missing)) != ARL_OK)
        first_msg = strdup(arl_error_msg());
    sum.missing = n_missing;
    for (size_t i = 0; i < n; i++) {
        if (ref[i].kind != REPLAY_FILE_WORKER && ref[i].kind != REPLAY_FILE_TOOL &&
            ref[i].kind != REPLAY_FILE_LEARNER)
            continue;
        replay_writer *w = NULL;
        rshard *sh = rstore_shard(st, ref[i].id);
        arl_status o;
        if (sh && rstore_shard_sealed(st, ref[i].id)) { /* immutable, but not its states file */
            rstore_shard_release(st, ref[i].id);
            o = sealed_writer(st, sh, &w);
            if (o == ARL_OK && !w) continue;
        } else {
            o = rwriter_open(st, (replay_file_kind)ref[i].kind, ref[i].id, NULL, 1, &w);
        }
        if (o == ARL_ERR_BUSY) { /* its writer runs its own GC (section 7.6) */
            arl_error_clear();
            sh = rstore_shard(st, ref[i].id);
            rlock_print_skipped(out, sh ? sh->file : "?", sh ? sh->path : "",
                                "it collects its own states");
            sum.skipped++;
            continue;
        }
        replay_gc_stats g;
        if (o == ARL_OK) o = replay_states_retain(w, r, &g);
        if (o == ARL_OK) {
            if (out)
                fprintf(out, "%s: %lld states deleted, %lld evicted, %lld bytes freed\n",
                        replay_writer_file(w), (long long)g.deleted, (long long)g.evicted,
                        (long long)g.bytes_freed);
            sum.deleted += g.deleted;
            sum.evicted += g.evicted;
            sum.bytes_freed += g.bytes_freed;
            sum.files++;
        } else {
            if (out) fprintf(out, "failed: %s\n", arl_error_msg());
            if (first == ARL_OK) {
                first = o;
                first_msg = strdup(arl_error_msg());
            }
        }
        replay_writer_close(w);
        rstore_shard_release(st, ref[i].id);
    }
    if (first != ARL_OK && first_msg) arl_errorf(first, "%s", first_msg);
    free(first_msg);
    free(ref);
    if (total) *total = sum;
    return first;
}

arl_status replay_states_touch(replay_writer *w, const int64_t *state_ids, size_t n) {
    if (!n) return ARL_OK;
    rdb *db = &w->s;
    ARL_TRY(rdb_begin(db));
    sqlite3_stmt *q = NULL;
    arl_status s = rdb_prepare(db,
                               "UPDATE states SET last_used_at_ms = ?2 WHERE state_id = ?1 AND "
                               "status = 'complete'",
                               &q);
    const int64_t now = rnow_ms();
    for (size_t i = 0; s == ARL_OK && i < n; i++) {
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, state_ids[i]);
        sqlite3_bind_int64(q, 2, now);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_DONE) s = rdb_fail(db, rc, "recording the use of a state");
    }
    sqlite3_finalize(q);
    return rdb_end(db, s);
}
