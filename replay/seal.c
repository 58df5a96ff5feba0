/* replay/seal.c: `seal` and `migrate` over a store (spec/replay.md sections 2.3, 12 and 13.8).
 * seal: every worker, tool
 * or learner file whose writer is gone (its lock is free) and that is not sealed yet is sealed
 * through replay_writer_seal (final checkpoint, journal_mode DELETE, meta.sealed = 1, catalog
 * sealed_at_ms).  A sealed file is immutable: writers refuse it (replay/db.c), recover, gc and
 * verify --repair skip it; readers read it as before.  States files are a cache and stay
 * writable (their GC keeps running).
 * migrate: files older than this build's schema version are migrated: sealed ones under their
 * lock (they stay sealed), the others through their writer's open (skipped while it runs). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "replay/inspect.h"
#include "replay/internal.h"

arl_status replay_seal(replay_store *st, int32_t only_shard, FILE *out, int64_t *n_sealed) {
    if (!st->cat.db || st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: seal needs a store root with a writable catalog", st->root);
    ARL_TRY(replay_store_refresh(st));
    int64_t sealed = 0;
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    int found = only_shard <= 0;
    for (size_t i = 0; i < n; i++)
        found |= ref[i].id == only_shard;
    arl_status s = found ? ARL_OK
                         : arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no shard %d in the store",
                                      st->root, (int)only_shard);
    for (size_t i = 0; i < n && s == ARL_OK; i++) {
        if (only_shard > 0 && ref[i].id != only_shard) continue;
        char *rel = rstore_shard_rel(ref[i].kind, ref[i].id);
        if (rstore_shard_sealed(st, ref[i].id)) {
            if (out) fprintf(out, "%s: already sealed\n", rel ? rel : "?");
            free(rel);
            continue;
        }
        rstore_shard_release(st, ref[i].id); /* leaving WAL needs the file to itself */
        replay_writer *w = NULL;
        arl_status o = replay_writer_open(st, (replay_file_kind)ref[i].kind, ref[i].id, NULL, &w);
        if (o == ARL_ERR_BUSY) {
            if (out)
                fprintf(out, "%s: skipped (writer alive): %s\n", rel ? rel : "?", arl_error_msg());
            free(rel);
            continue;
        }
        if (o == ARL_OK && ref[i].kind != REPLAY_FILE_LEARNER) o = rwriter_scan_running(w);
        if (o != ARL_OK && w) {
            replay_writer_close(w);
            w = NULL;
        }
        if (o == ARL_OK) {
            size_t n_int = 0;
            const int64_t *tids;
            replay_writer_interrupted(w, &tids, &n_int);
            if (n_int) { /* running trajectories must be resolved first (recover) */
                o = arl_errorf(ARL_ERR_STATE,
                               "replay: %s: %zu trajectories are still running: run 'agentrl "
                               "replay recover --mask' (or resume them) before sealing",
                               rel ? rel : "?", n_int);
                replay_writer_close(w);
            } else {
                o = replay_writer_seal(w); /* closes w */
            }
        }
        rstore_shard_release(st, ref[i].id);
        if (o == ARL_OK) {
            if (out) fprintf(out, "%s: sealed\n", rel ? rel : "?");
            sealed++;
        }
        s = o;
        free(rel);
    }
    free(ref);
    if (n_sealed) *n_sealed = sealed;
    return s;
}

/* Migrate one sealed file under its shard's lock (section 12 rule 3): the writer's open with
 * RDB_ALLOW_SEALED runs the migrations and leaves the file sealed in rollback-journal mode. */
static arl_status migrate_sealed(replay_store *st, rshard *sh) {
    char *lock = malloc(strlen(sh->path) + 8);
    if (!lock) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    sprintf(lock, "%s.lock", sh->path);
    int fd = -1;
    uint64_t dev = 0, ino = 0;
    arl_status s = rlock_acquire(lock, sh->file, &fd, &dev, &ino);
    free(lock);
    if (s != ARL_OK) return s;
    rstore_shard_release(st, sh->shard_id);
    rdb d;
    s = rdb_open(&d, sh->path, sh->file, sh->kind, RDB_ALLOW_SEALED, st->vfs, NULL);
    rdb_close(&d);
    /* its states file (a cache, never sealed) under the same lock */
    size_t n = strlen(sh->path), m = strlen(sh->file);
    char *sp = malloc(n + 16), *sf = malloc(m + 16);
    struct stat sb;
    if (s == ARL_OK && (!sp || !sf)) s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    if (s == ARL_OK && sh->kind != REPLAY_FILE_LEARNER && n > 7 && m > 7) {
        snprintf(sp, n + 16, "%.*s.states.sqlite", (int)(n - 7), sh->path);
        snprintf(sf, m + 16, "%.*s.states.sqlite", (int)(m - 7), sh->file);
        if (stat(sp, &sb) == 0) {
            s = rdb_open(&d, sp, sf, REPLAY_FILE_STATES, RDB_ALLOW_SEALED, st->vfs, NULL);
            rdb_close(&d);
        }
    }
    free(sp);
    free(sf);
    rlock_release(fd, dev, ino);
    return s;
}

arl_status replay_migrate(replay_store *st, FILE *out, int64_t *n_migrated) {
    if (!st->cat.db || st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: migrate needs a store root with a writable catalog "
                          "(opening it migrated the catalog)",
                          st->root);
    ARL_TRY(replay_store_refresh(st));
    const int r = rschema_version();
    int64_t migrated = 0;
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    arl_status s = ARL_OK;
    for (size_t i = 0; i < n && s == ARL_OK; i++) {
        rshard *sh = rstore_shard(st, ref[i].id);
        rdb *d, *sd = NULL;
        if (!sh || (s = rstore_shard_db(st, sh, &d)) != ARL_OK) break;
        int v = d->schema_version, sv = r;
        if (sh->kind != REPLAY_FILE_LEARNER && rstore_shard_states(st, sh, &sd) == ARL_OK)
            sv = sd->schema_version;
        arl_error_clear();
        if (d->empty || (v >= r && sv >= r)) {
            if (out) fprintf(out, "%s: schema version %d, up to date\n", sh->file, v);
            continue;
        }
        int kind = sh->kind;
        char *file = strdup(sh->file);
        if (rstore_shard_sealed(st, ref[i].id)) {
            s = migrate_sealed(st, sh);
        } else { /* its writer migrates it (and its states file) at open */
            replay_writer *w = NULL;
            rstore_shard_release(st, ref[i].id);
            s = replay_writer_open(st, (replay_file_kind)kind, ref[i].id, NULL, &w);
            replay_writer_close(w);
        }
        if (s == ARL_ERR_BUSY) {
            if (out)
                fprintf(out, "%s: skipped (writer alive: it migrates at its next open)\n",
                        file ? file : "?");
            s = ARL_OK;
        } else if (s == ARL_OK) {
            if (out)
                fprintf(out, "%s: migrated from schema version %d to %d\n", file ? file : "?",
                        v < sv ? v : sv, r);
            migrated++;
        }
        free(file);
        rstore_shard_release(st, ref[i].id);
    }
    free(ref);
    if (n_migrated) *n_migrated = migrated;
    return s;
}
