/* replay/seal.c: `seal` and `migrate` over a store (spec/replay.md sections 2.3, 12 and 13.8).
 * seal: every worker, tool
 * or learner file whose writer is gone (its lock is free) and that is not sealed yet is sealed
 * through replay_writer_seal (final checkpoint, journal_mode DELETE, meta.sealed = 1, catalog
 * sealed_at_ms).  A sealed file is immutable: writers refuse it (replay/db.c), recover, gc and
 * verify --repair skip it; readers read it as before.  States files are a cache and stay
 * writable (their GC keeps running).  A seal killed after meta.sealed = 1 committed leaves the
 * file in WAL mode (that commit possibly only in <file>-wal) or the catalog's sealed_at_ms
 * unset: seal run again finishes it (seal_finish).  A file that cannot be sealed (running
 * trajectories, an error) is reported and the others are still sealed; the first error is
 * returned.
 * migrate: files older than this build's schema version are migrated: sealed ones under their
 * lock (they stay sealed, in rollback-journal mode), the others through their writer's open
 * (skipped while it runs); like seal it goes on past a file that fails and returns the first
 * error.  Both (and gc) report shards registered in the catalog whose file is missing
 * (rstore_report_missing: an error when the catalog has trajectories in it). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "replay/inspect.h"
#include "replay/internal.h"

/* 1 if the database file at path is in WAL mode (header bytes 18 and 19 are 2) or a non-empty
 * <path>-wal lies beside it: a sealed file is neither (section 2.3). */
static int file_in_wal(const char *path) {
    unsigned char h[20];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n == sizeof h && (h[18] == 2 || h[19] == 2)) return 1;
    char *wal = malloc(strlen(path) + 5);
    if (!wal) return 0;
    sprintf(wal, "%s-wal", path);
    struct stat sb;
    int pending = stat(wal, &sb) == 0 && sb.st_size > 0;
    free(wal);
    return pending;
}

/* *unset = 1 if the catalog's shards row of shard_id lacks sealed_at_ms. */
static arl_status catalog_unsealed(replay_store *st, int32_t shard_id, int *unset) {
    sqlite3_stmt *q;
    *unset = 0;
    ARL_TRY(
        rdb_prepare(&st->cat, "SELECT sealed_at_ms IS NULL FROM shards WHERE shard_id = ?1", &q));
    sqlite3_bind_int(q, 1, shard_id);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) *unset = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "reading shards");
    return ARL_OK;
}

/* Under shard sh's lock (ARL_ERR_BUSY while its writer lives): open its sealed file with
 * RDB_ALLOW_SEALED (the open migrates a file older than this build, section 12 rule 3), leave
 * it in rollback-journal mode again (the open configures WAL), and with states set do the same
 * open for its states file (a cache, never sealed). */
static arl_status sealed_reopen(replay_store *st, rshard *sh, int states) {
    char *lock = malloc(strlen(sh->path) + 8);
    if (!lock) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    sprintf(lock, "%s.lock", sh->path);
    int fd = -1;
    uint64_t dev = 0, ino = 0;
    arl_status s = rlock_acquire(lock, sh->file, 1, &fd, &dev, &ino);
    free(lock);
    if (s != ARL_OK) return s;
    rstore_shard_release(st, sh->shard_id);
    rdb d;
    s = rdb_open(&d, sh->path, sh->file, sh->kind, RDB_ALLOW_SEALED, st->vfs, NULL);
    if (s == ARL_OK) s = rdb_leave_wal(&d);
    rdb_close(&d);
    if (s == ARL_OK && file_in_wal(sh->path))
        s = arl_errorf(ARL_ERR_BUSY,
                       "replay: %s: sealed, but still in WAL mode: another process has it open "
                       "(close its readers, then run 'agentrl replay seal' again)",
                       sh->file);
    /* its states file (a cache, never sealed) under the same lock */
    size_t n = strlen(sh->path), m = strlen(sh->file);
    char *sp = malloc(n + 16), *sf = malloc(m + 16);
    struct stat sb;
    if (s == ARL_OK && (!sp || !sf)) s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    if (s == ARL_OK && states && sh->kind != REPLAY_FILE_LEARNER && n > 7 && m > 7) {
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

/* Finish sealing a file whose meta says sealed (a seal or a migrate killed before their end):
 * rollback-journal mode and the catalog's sealed_at_ms.  *done = 1 if anything was left. */
static arl_status seal_finish(replay_store *st, rshard *sh, int *done) {
    int unset = 0;
    *done = 0;
    ARL_TRY(catalog_unsealed(st, sh->shard_id, &unset));
    int wal = file_in_wal(sh->path);
    if (!wal && !unset) return ARL_OK;
    if (wal) ARL_TRY(sealed_reopen(st, sh, 0));
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "UPDATE shards SET sealed_at_ms = ?2 WHERE shard_id = ?1 AND "
                        "sealed_at_ms IS NULL",
                        &q));
    sqlite3_bind_int(q, 1, sh->shard_id);
    sqlite3_bind_int64(q, 2, rnow_ms());
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "recording a sealed shard");
    *done = 1;
    return ARL_OK;
}

arl_status replay_seal(replay_store *st, int32_t only_shard, FILE *out, replay_admin_stats *stats) {
    ARL_TRY(rstore_need_root(st, "seal"));
    ARL_TRY(replay_store_refresh(st));
    replay_admin_stats z = {0};
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    int found = only_shard <= 0;
    for (size_t i = 0; i < n; i++)
        found |= ref[i].id == only_shard;
    /* registered shards whose file is missing: reported (an error when data is lost) */
    int n_missing = 0;
    arl_status s = rstore_report_missing(st, only_shard, out, &n_missing);
    z.missing = n_missing;
    char *first_msg = s != ARL_OK ? strdup(arl_error_msg()) : NULL;
    if (s == ARL_OK && !found && !n_missing)
        s = arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no shard %d in the store", st->root,
                       (int)only_shard);
    arl_status first = s; /* the first failure; the other files are still sealed */
    for (size_t i = 0; i < n && found; i++) {
        if (only_shard > 0 && ref[i].id != only_shard) continue;
        char *rel = rstore_shard_rel(ref[i].kind, ref[i].id);
        if (rstore_shard_sealed(st, ref[i].id)) {
            int done = 0;
            rshard *sh = rstore_shard(st, ref[i].id);
            arl_status o = sh ? seal_finish(st, sh, &done) : ARL_OK;
            if (o == ARL_ERR_BUSY && sh && rlock_holder(sh->path) > 0) {
                arl_error_clear(); /* a live writer: the next seal finishes it */
                rlock_print_skipped(out, rel ? rel : "?", sh->path,
                                    "seal again once it has finished");
                z.skipped++;
            } else if (o == ARL_ERR_BUSY) { /* a reader: the next seal finishes it */
                if (out) fprintf(out, "%s: skipped: %s\n", rel ? rel : "?", arl_error_msg());
                z.skipped++;
            } else if (o != ARL_OK) {
                if (out) fprintf(out, "%s: failed: %s\n", rel ? rel : "?", arl_error_msg());
                if (first == ARL_OK) {
                    first = o;
                    first_msg = strdup(arl_error_msg());
                }
            } else if (out) {
                fprintf(out, "%s: %s\n", rel ? rel : "?",
                        done ? "sealed (finished an interrupted seal)" : "already sealed");
            }
            if (o == ARL_OK && done) z.files++;
            free(rel);
            continue;
        }
        rstore_shard_release(st, ref[i].id); /* leaving WAL needs the file to itself */
        replay_writer *w = NULL;
        arl_status o = rwriter_open(st, (replay_file_kind)ref[i].kind, ref[i].id, NULL, 1, &w);
        if (o == ARL_ERR_BUSY) {
            arl_error_clear();
            rshard *sh = rstore_shard(st, ref[i].id);
            rlock_print_skipped(out, rel ? rel : "?", sh ? sh->path : "",
                                "seal it once its writer has finished");
            z.skipped++;
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
            z.files++;
        } else if (o == ARL_ERR_BUSY) { /* readers kept it in WAL: the next seal finishes it */
            if (out) fprintf(out, "%s: skipped: %s\n", rel ? rel : "?", arl_error_msg());
            arl_error_clear();
            z.skipped++;
        } else {
            if (out) fprintf(out, "%s: not sealed: %s\n", rel ? rel : "?", arl_error_msg());
            if (first == ARL_OK) {
                first = o;
                first_msg = strdup(arl_error_msg());
            }
        }
        free(rel);
    }
    free(ref);
    if (stats) *stats = z;
    if (first != ARL_OK && first_msg) arl_errorf(first, "%s", first_msg);
    free(first_msg);
    return first;
}

arl_status replay_migrate(replay_store *st, FILE *out, replay_admin_stats *stats) {
    ARL_TRY(rstore_need_root(st, "migrate"));
    ARL_TRY(replay_store_refresh(st));
    const int r = rschema_version();
    replay_admin_stats z = {0};
    size_t n;
    rshard_ref *ref;
    ARL_TRY(rstore_shards_copy(st, &ref, &n));
    /* registered shards whose file is missing: reported (an error when data is lost) */
    int n_missing = 0;
    arl_status first = rstore_report_missing(st, 0, out, &n_missing);
    z.missing = n_missing;
    char *first_msg = first != ARL_OK ? strdup(arl_error_msg()) : NULL;
    /* a file that fails is reported and the others are still migrated (as seal and gc) */
    for (size_t i = 0; i < n; i++) {
        rshard *sh = rstore_shard(st, ref[i].id);
        char *rel = rstore_shard_rel(ref[i].kind, ref[i].id);
        rdb *d, *sd = NULL;
        arl_status s =
            sh ? rstore_shard_db(st, sh, &d)
               : arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: its file is gone", rel ? rel : "?");
        if (s != ARL_OK) {
            if (out) fprintf(out, "%s: failed: %s\n", rel ? rel : "?", arl_error_msg());
            if (first == ARL_OK) {
                first = s;
                first_msg = strdup(arl_error_msg());
            }
            free(rel);
            rstore_shard_release(st, ref[i].id);
            continue;
        }
        int v = d->schema_version, sv = r;
        if (sh->kind != REPLAY_FILE_LEARNER && rstore_shard_states(st, sh, &sd) == ARL_OK)
            sv = sd->schema_version;
        arl_error_clear();
        int sealed = rstore_shard_sealed(st, ref[i].id);
        /* a sealed file left in WAL mode: a migrate or seal killed before their end */
        if (d->empty || (v >= r && sv >= r && !(sealed && file_in_wal(sh->path)))) {
            if (out) fprintf(out, "%s: schema version %d, up to date\n", sh->file, v);
            free(rel);
            continue;
        }
        int kind = sh->kind;
        char *file = strdup(sh->file), *path = strdup(sh->path);
        if (sealed) {
            s = sealed_reopen(st, sh, 1);
        } else { /* its writer migrates it (and its states file) at open */
            replay_writer *w = NULL;
            rstore_shard_release(st, ref[i].id);
            s = rwriter_open(st, (replay_file_kind)kind, ref[i].id, NULL, 1, &w);
            replay_writer_close(w);
        }
        if (s == ARL_ERR_BUSY && path && rlock_holder(path) > 0) {
            arl_error_clear();
            rlock_print_skipped(out, file ? file : "?", path,
                                "it migrates the file at its next open");
            z.skipped++;
        } else if (s == ARL_ERR_BUSY) { /* a reader (a sealed file in WAL mode): next time */
            if (out) fprintf(out, "%s: skipped: %s\n", file ? file : "?", arl_error_msg());
            arl_error_clear();
            z.skipped++;
        } else if (s == ARL_OK && v >= r && sv >= r) { /* only left WAL mode again */
            if (out)
                fprintf(out,
                        "%s: schema version %d, up to date (sealed: back in rollback-journal "
                        "mode, an interrupted migrate or seal)\n",
                        file ? file : "?", v);
        } else if (s == ARL_OK) {
            if (out)
                fprintf(out, "%s: migrated from schema version %d to %d\n", file ? file : "?",
                        v < sv ? v : sv, r);
            z.files++;
        } else {
            if (out) fprintf(out, "%s: failed: %s\n", file ? file : "?", arl_error_msg());
            if (first == ARL_OK) {
                first = s;
                first_msg = strdup(arl_error_msg());
            }
        }
        free(file);
        free(path);
        free(rel);
        rstore_shard_release(st, ref[i].id);
    }
    free(ref);
    if (stats) *stats = z;
    if (first != ARL_OK && first_msg) arl_errorf(first, "%s", first_msg);
    free(first_msg);
    return first;
}
