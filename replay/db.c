/* replay/db.c: one SQLite file of the store (rdb): open with the spec's connection settings,
 * error mapping with the file's name and advice, small query helpers. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "replay/internal.h"

static const char *rc_advice(int rc) {
    switch (rc & 0xFF) {
    case SQLITE_FULL:
        return "the disk or quota is full: free space and retry; everything committed before is "
               "intact";
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return "the file is damaged or not an agentrl store file: run 'agentrl replay verify' "
               "and restore the file from a backup";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return "another process held the database lock for more than 10 s: retry later";
    case SQLITE_READONLY:
        return "the file or its directory is not writable: check permissions";
    case SQLITE_CANTOPEN:
        return "check that the path exists and is accessible";
    case SQLITE_IOERR:
        return "an I/O error: check the disk, free space and the file system";
    case SQLITE_NOMEM:
        return "out of memory";
    case SQLITE_CONSTRAINT:
        return "a value violates the schema of spec/replay.md section 4";
    case SQLITE_TOOBIG:
        return "a value exceeds SQLite's size limit";
    default:
        return "see the SQLite message";
    }
}

static arl_status rc_status(int rc) {
    switch (rc & 0xFF) {
    case SQLITE_FULL:
        return ARL_ERR_FULL;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return ARL_ERR_CORRUPT;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return ARL_ERR_BUSY;
    case SQLITE_CANTOPEN:
        return ARL_ERR_IO;
    case SQLITE_READONLY:
    case SQLITE_IOERR:
        return ARL_ERR_IO;
    case SQLITE_NOMEM:
        return ARL_ERR_NOMEM;
    case SQLITE_CONSTRAINT:
        return ARL_ERR_ARG;
    case SQLITE_TOOBIG:
        return ARL_ERR_RANGE;
    default:
        return ARL_ERR_DB;
    }
}

arl_status rdb_fail(rdb *d, int rc, const char *what) {
    const char *msg = d->db ? sqlite3_errmsg(d->db) : sqlite3_errstr(rc);
    int xrc = d->db ? sqlite3_extended_errcode(d->db) : rc;
    /* An I/O error caused by a full disk is reported as one. */
    arl_status s = rc_status(rc);
    int e = d->db ? sqlite3_system_errno(d->db) : 0;
    if ((rc & 0xFF) == SQLITE_IOERR && (e == ENOSPC || e == EDQUOT)) {
        s = ARL_ERR_FULL;
        rc = SQLITE_FULL;
    }
    char m[1024];
    snprintf(m, sizeof m, "%s", msg ? msg : "");
    /* the file by its path: a store-relative name does not say which store (a run has many) */
    arl_errorf(s, "replay: %s: %s: %s (SQLite code %d) (%s)",
               d->path   ? d->path
               : d->name ? d->name
                         : "?",
               what, m, xrc, rc_advice(rc));
    if (d->db && !d->readonly && !sqlite3_get_autocommit(d->db))
        sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

arl_status rdb_exec(rdb *d, const char *sql) {
    int rc = sqlite3_exec(d->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        /* a schema's text is long: cut, the cause after it must not be cut off the message */
        char what[256];
        snprintf(what, sizeof what, "%.200s%s", sql, strlen(sql) > 200 ? "..." : "");
        return rdb_fail(d, rc, what);
    }
    return ARL_OK;
}

arl_status rdb_prepare(rdb *d, const char *sql, sqlite3_stmt **st) {
    int rc = sqlite3_prepare_v2(d->db, sql, -1, st, NULL);
    if (rc != SQLITE_OK) {
        char what[256];
        snprintf(what, sizeof what, "preparing \"%.200s\"", sql);
        return rdb_fail(d, rc, what);
    }
    return ARL_OK;
}

arl_status rdb_begin(rdb *d) {
    int rc = sqlite3_exec(d->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rdb_fail(d, rc, "starting a write transaction");
    return ARL_OK;
}

arl_status rdb_commit(rdb *d) {
    int rc = sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return rdb_fail(d, rc, "committing");
    return ARL_OK;
}

void rdb_rollback(rdb *d) {
    if (d->db && !sqlite3_get_autocommit(d->db)) sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL);
}

arl_status rdb_end(rdb *d, arl_status s) {
    if (s != ARL_OK) {
        rdb_rollback(d);
        return s;
    }
    return rdb_commit(d);
}

void rdb_read_begin(rdb *d) {
    if (d->db && sqlite3_get_autocommit(d->db)) sqlite3_exec(d->db, "BEGIN", NULL, NULL, NULL);
}

void rdb_read_end(rdb *d) {
    if (d->db && !sqlite3_get_autocommit(d->db) &&
        sqlite3_exec(d->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL); /* never left open: a stale snapshot */
}

/* Tries of rdb_leave_wal and the pause between them: 500 x 20 ms, the busy timeout. */
#define RDB_LEAVE_WAL_TRIES 500
#define RDB_LEAVE_WAL_PAUSE_US 20000

arl_status rdb_leave_wal(rdb *d) {
    for (int i = 0;; i++) {
        ARL_TRY(rdb_exec(d, "PRAGMA wal_checkpoint(TRUNCATE)"));
        sqlite3_stmt *q;
        ARL_TRY(rdb_prepare(d, "PRAGMA journal_mode = DELETE", &q));
        const int rc = sqlite3_step(q);
        const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
        const int left = mode && !strcmp(mode, "delete");
        sqlite3_finalize(q);
        if (left) return ARL_OK;
        if (rc != SQLITE_ROW && (rc & 0xFF) != SQLITE_BUSY)
            return rdb_fail(d, rc, "leaving WAL mode (journal_mode = DELETE)");
        if (i + 1 == RDB_LEAVE_WAL_TRIES)
            return arl_errorf(ARL_ERR_BUSY,
                              "replay: %s: other processes kept the file open for 10 s (readers: "
                              "list, show, verify, view, a learner), so it stays in WAL mode: run "
                              "'agentrl replay seal' again once they have closed it",
                              d->name);
        usleep(RDB_LEAVE_WAL_PAUSE_US);
    }
}

arl_status rdb_query_int(rdb *d, const char *sql, int64_t *v, int *found) {
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(d, sql, &s));
    int rc = sqlite3_step(s);
    if (found) *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW) *v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(d, rc, sql);
    return ARL_OK;
}

arl_status rdb_meta_get(rdb *d, const char *key, char *buf, size_t cap, int *found) {
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(d, "SELECT value FROM meta WHERE key = ?1", &s));
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (found) *found = rc == SQLITE_ROW;
    if (cap) buf[0] = 0;
    if (rc == SQLITE_ROW) rdb_col_text(s, 0, buf, cap);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(d, rc, "reading meta");
    return ARL_OK;
}

arl_status rdb_meta_set(rdb *d, const char *key, const char *value) {
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(d, "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)", &s));
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return rdb_fail(d, rc, "writing meta");
    return ARL_OK;
}

int rdb_bind_text(sqlite3_stmt *s, int i, const char *v) {
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

int rdb_bind_int_or_null(sqlite3_stmt *s, int i, int64_t v) {
    return v < 0 ? sqlite3_bind_null(s, i) : sqlite3_bind_int64(s, i, v);
}

int rdb_bind_real_or_null(sqlite3_stmt *s, int i, double v) {
    return isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v);
}

void rdb_col_text(sqlite3_stmt *s, int i, char *buf, size_t cap) {
    if (!cap) return;
    const unsigned char *t = sqlite3_column_text(s, i);
    snprintf(buf, cap, "%s", t ? (const char *)t : "");
}

int64_t rdb_col_int_or(sqlite3_stmt *s, int i, int64_t if_null) {
    return sqlite3_column_type(s, i) == SQLITE_NULL ? if_null : sqlite3_column_int64(s, i);
}

/* Create d->path complete or not at all: build the file (settings, schema, meta) under a
 * temporary name, close it (SQLite checkpoints and removes its WAL), then link it into place,
 * which fails harmlessly if another process created it first.  A writer killed while creating
 * leaves at most a stray "<file>.new.<pid>", never a file without a schema or with a hot
 * rollback journal that read-only connections could not open. */
static arl_status create_atomically(rdb *d, const char *vfs, const char *meta_init) {
    size_t n = strlen(d->path) + 64;
    char *tmp = malloc(n), *side = malloc(n + 16);
    if (!tmp || !side) {
        free(tmp);
        free(side);
        return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    }
    snprintf(tmp, n, "%s.new.%ld", d->path, (long)getpid());
    static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
    for (int i = 0; i < 4; i++) {
        snprintf(side, n + 16, "%s%s", tmp, sfx[i]);
        unlink(side);
    }
    rdb t;
    memset(&t, 0, sizeof t);
    t.path = tmp;
    t.name = d->name;
    t.kind = d->kind;
    int rc = sqlite3_open_v2(tmp, &t.db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, vfs);
    arl_status s = ARL_OK;
    if (rc != SQLITE_OK) s = rdb_fail(&t, rc, "creating");
    /* Build it with a rollback journal (every step atomic, nothing left in a WAL), switch it to
     * WAL last, and link it only if all of that and the close succeeded. */
    if (s == ARL_OK) {
        char sql[160];
        int states = d->kind == REPLAY_FILE_STATES;
        sqlite3_extended_result_codes(t.db, 1);
        snprintf(sql, sizeof sql,
                 "PRAGMA page_size = %d; PRAGMA auto_vacuum = %s; PRAGMA journal_mode = DELETE; "
                 "PRAGMA synchronous = FULL;",
                 states ? RDB_PAGE_SIZE_STATES : RDB_PAGE_SIZE, states ? "INCREMENTAL" : "NONE");
        s = rdb_exec(&t, sql);
    }
    if (s == ARL_OK) s = rschema_create(&t, meta_init);
    if (s == ARL_OK) {
        sqlite3_stmt *q;
        s = rdb_prepare(&t, "PRAGMA journal_mode = WAL", &q);
        if (s == ARL_OK) {
            rc = sqlite3_step(q);
            const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(q, 0) : NULL;
            if (!mode || strcmp(mode, "wal"))
                s = rdb_fail(&t, rc == SQLITE_ROW ? SQLITE_IOERR : rc, "switching to WAL");
            sqlite3_finalize(q);
        }
    }
    if (t.db && sqlite3_close(t.db) != SQLITE_OK && s == ARL_OK)
        s = arl_errorf(ARL_ERR_IO, "replay: %s: closing the new file failed", d->name);
    struct stat wsb;
    snprintf(side, n + 16, "%s-wal", tmp);
    if (s == ARL_OK && stat(side, &wsb) == 0 && wsb.st_size > 0)
        s = arl_errorf(ARL_ERR_IO,
                       "replay: %s: the new file could not be completed (check free space)",
                       d->name);
    if (s == ARL_OK && link(tmp, d->path) && errno != EEXIST)
        s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                       "replay: %s: cannot create %s: %s", d->name, d->path, strerror(errno));
    for (int i = 0; i < 4; i++) {
        snprintf(side, n + 16, "%s%s", tmp, sfx[i]);
        unlink(side);
    }
    if (s == ARL_OK) { /* make the new directory entry durable */
        char *slash = strrchr(d->path, '/');
        snprintf(side, n + 16, "%.*s", slash ? (int)(slash - d->path) : 1, slash ? d->path : ".");
        if (slash == d->path) snprintf(side, n + 16, "/");
        int fd = open(side, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
    }
    free(tmp);
    free(side);
    return s;
}

/* A reader of a WAL-mode file that cannot create its shared-memory file: the folder is not
 * writable by this user (a read-only copy, a store of another user, spec/replay.md 2.3) and no
 * -shm is there. Without a -shm file and with no -wal file (or an empty one), every committed
 * transaction is in the main file and no connection has it open (the last one to close removes
 * both), so the file is read as immutable: 1 when that applies, after reopening d->db with
 * immutable=1. A writer that opens the file later is not seen (a reader's view of a store it
 * cannot write). */
static int reopen_immutable(rdb *d, int xrc, const char *vfs) {
    if ((xrc & 0xFF) != SQLITE_READONLY && (xrc & 0xFF) != SQLITE_CANTOPEN) return 0;
    size_t n = strlen(d->path);
    char *uri = malloc(3 * n + 32);
    if (!uri) return 0;
    memcpy(uri, d->path, n);
    memcpy(uri + n, "-wal", 5);
    struct stat wsb;
    if (stat(uri, &wsb) == 0 && wsb.st_size > 0) {
        free(uri);
        return 0;
    }
    memcpy(uri + n, "-shm", 5);
    if (stat(uri, &wsb) == 0) { /* SQLite reads one it cannot write: this failed otherwise */
        free(uri);
        return 0;
    }
    /* file: URI, every byte but unreserved ones and '/' percent-encoded */
    char *o = uri + sprintf(uri, "file:");
    for (const unsigned char *p = (const unsigned char *)d->path; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-_.~/", *p))
            *o++ = (char)*p;
        else
            o += sprintf(o, "%%%02X", *p);
    }
    strcpy(o, "?immutable=1");
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX,
                             vfs);
    free(uri);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "SELECT count(*) FROM sqlite_schema", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_close(db);
        return 0;
    }
    sqlite3_close_v2(d->db);
    d->db = db;
    sqlite3_extended_result_codes(d->db, 1);
    return 1;
}

arl_status rdb_open(rdb *d, const char *path, const char *name, int kind, unsigned flags,
                    const char *vfs, const char *meta_init) {
    memset(d, 0, sizeof *d);
    d->path = strdup(path);
    d->name = strdup(name ? name : path);
    d->kind = kind;
    d->readonly = !!(flags & RDB_READONLY);
    d->allow_sealed = !!(flags & RDB_ALLOW_SEALED);
    if (!d->path || !d->name) {
        rdb_close(d);
        return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory opening %s", path);
    }
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (!exists && !(flags & RDB_CREATE)) {
        arl_status s =
            arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no such file (%s)", d->name, path);
        rdb_close(d);
        return s;
    }
    if (!exists && !d->readonly) {
        arl_status c = create_atomically(d, vfs, meta_init);
        if (c != ARL_OK) {
            rdb_close(d);
            return c;
        }
    }
    int oflags = d->readonly
                     ? SQLITE_OPEN_READONLY
                     : SQLITE_OPEN_READWRITE | ((flags & RDB_CREATE) ? SQLITE_OPEN_CREATE : 0);
    int rc = sqlite3_open_v2(path, &d->db, oflags | SQLITE_OPEN_NOMUTEX, vfs);
    arl_status s = ARL_OK;
    if (rc != SQLITE_OK) {
        s = rdb_fail(d, rc, "opening");
        rdb_close(d);
        return s;
    }
    sqlite3_extended_result_codes(d->db, 1);
    sqlite3_busy_timeout(d->db, 10000);
    /* A new file: no schema yet (an interrupted creation left nothing, DDL is transactional). */
    int is_new = 0;
    if (!d->readonly) {
        int64_t nobj = 0;
        s = rdb_query_int(d, "SELECT count(*) FROM sqlite_schema", &nobj, NULL);
        if (s != ARL_OK) goto fail;
        is_new = nobj == 0;
    }
    if (d->readonly &&
        sqlite3_exec(d->db, "SELECT count(*) FROM sqlite_schema", NULL, NULL, NULL) != SQLITE_OK &&
        reopen_immutable(d, sqlite3_extended_errcode(d->db), vfs))
        sqlite3_busy_timeout(d->db, 10000);
    if (d->readonly) {
        /* A file whose writer died before its schema committed holds no data: read it as an
         * empty file of its kind (an in-memory copy of the schema), and let verify warn. */
        int64_t nobj = -1, uv = -1;
        if (rdb_query_int(d, "SELECT count(*) FROM sqlite_schema", &nobj, NULL) == ARL_OK &&
            rdb_query_int(d, "PRAGMA user_version", &uv, NULL) == ARL_OK && nobj == 0 && uv == 0) {
            sqlite3_close_v2(d->db);
            d->db = NULL;
            if (d->kind < 0) d->kind = REPLAY_FILE_WORKER;
            rc = sqlite3_open_v2(":memory:", &d->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                                 NULL);
            if (rc != SQLITE_OK) {
                s = rdb_fail(d, rc, "opening an empty file");
                goto fail;
            }
            d->readonly = 0; /* to create the schema in memory */
            s = rschema_create(d, NULL);
            d->readonly = 1;
            d->empty = 1;
            if (s != ARL_OK) goto fail;
            return ARL_OK;
        }
        arl_error_clear();
    }
    if (!d->readonly && !is_new && !(flags & RDB_ALLOW_SEALED)) {
        /* a sealed file is immutable (section 2.3): refuse before configuring (WAL) anything */
        char sealed[8] = "";
        int found = 0;
        if (rdb_meta_get(d, "sealed", sealed, sizeof sealed, &found) != ARL_OK) arl_error_clear();
        if (found && !strcmp(sealed, "1")) {
            s = arl_errorf(ARL_ERR_STATE,
                           "replay: %s: the file is sealed (immutable, spec section 2.3): read it, "
                           "copy it, or import it into another store",
                           d->name);
            goto fail;
        }
    }
    s = rschema_configure(d, is_new);
    if (s != ARL_OK) goto fail;
    s = is_new ? rschema_create(d, meta_init) : rschema_check(d);
    if (s != ARL_OK) goto fail;
    return ARL_OK;
fail:
    rdb_close(d);
    return s;
}

void rdb_close(rdb *d) {
    if (!d) return;
    if (d->db) sqlite3_close_v2(d->db);
    free(d->path);
    free(d->name);
    memset(d, 0, sizeof *d);
}
