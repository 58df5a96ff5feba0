/* replay/checkpoint.c: a writer file's WAL checkpoints off the writer's critical path (rckpt).
 *
 * SQLite's automatic checkpoint (PRAGMA wal_autocheckpoint = 1000, spec section 3) runs inside
 * the COMMIT that takes the WAL to 1000 frames: that append then also copies up to 1000 pages
 * into the database file and syncs it (16 MiB for a worker file, 64 MiB for a states file).
 * SQLite's documented alternative is a checkpoint on another connection in another thread; this
 * file does that, per file, with these rules:
 *   - the writer's connection keeps the spec's 1000-frame rule as a backstop: its WAL hook
 *     checkpoints in the foreground (PASSIVE, exactly what the automatic checkpoint does) when a
 *     commit leaves 1000 frames or more in the WAL, which only happens when the background
 *     thread has fallen behind; it first waits for a background pass in progress (less time
 *     than its own checkpoint would take), so the WAL never grows past the limit by more than
 *     one commit's frames;
 *   - a commit that leaves RCKPT_WAKE_FRAMES frames or more wakes the background thread (unless
 *     a pass is running: that pass copies what the commit added), which checkpoints on its own
 *     connection (same file, same VFS, same synchronous setting, so the database file is synced
 *     as the foreground checkpoint would sync it): a PASSIVE pass for the bulk, then RESTART
 *     passes without busy wait for the few frames the writer added meanwhile, so that the WAL
 *     restarts from its beginning (see ckpt_main);
 *   - replay_writer_checkpoint (rckpt_truncate) empties the WAL on the writer's connection
 *     after the background pass in progress has finished.
 * A background checkpoint never loses anything: the WAL keeps every frame until the database
 * file holds it, so a crash (SIGKILL, power) at any point of a background checkpoint leaves the
 * same committed data as one in the foreground.  It blocks the writer only for the tail of a
 * RESTART pass (the writer's BEGIN waits through its busy timeout).  A failed background
 * checkpoint (I/O error, full disk) is recorded and retried at the next wake; the writer's own
 * commits report their own errors as before.
 * Not here: the connection settings (schema.c), the writer's transactions (writer.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/assert.h"
#include "replay/internal.h"

struct rckpt {
    rdb *d;      /* the writer's file (not owned) */
    sqlite3 *db; /* the background connection (owned) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every change of wake, stop, busy */
    int wake, stop;    /* under mu */
    int busy;          /* under mu: a checkpoint (either thread's) is running */
    rckpt_stats stats; /* under mu */
};

static int wal_hook(void *arg, sqlite3 *db, const char *name, int n) {
    rckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    c->stats.last_frames = n;
    if (n > c->stats.max_frames) c->stats.max_frames = n;
    if (n >= RCKPT_BACKSTOP_FRAMES) {
        /* The spec's wal_autocheckpoint = 1000, as SQLite's own hook does it (errors ignored
         * there too: the WAL still holds every frame).  A background pass in progress is waited
         * for first: a PASSIVE checkpoint returns at once while another one runs, and the WAL
         * would grow past the limit. */
        c->stats.n_foreground++;
        while (c->busy)
            pthread_cond_wait(&c->cv, &c->mu);
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        pthread_cond_broadcast(&c->cv);
    } else if (n >= RCKPT_WAKE_FRAMES && !c->wake && !c->busy) {
        /* not while a pass runs: its loop copies the frames appended meanwhile, and a wake
         * queued now would start another pass (two more syncs) on the WAL that pass left,
         * usually restarted and nearly empty by then */
        c->wake = 1;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return SQLITE_OK;
}

static void *ckpt_main(void *arg) {
    rckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while ((!c->wake || c->busy) && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) break;
        c->wake = 0;
        c->busy = 1;
        pthread_mutex_unlock(&c->mu);
        /* The first pass copies the bulk without blocking the writer (PASSIVE).  The writer's
         * next transaction restarts the WAL from its beginning only if no frame is left to copy
         * when it starts, which a writer that commits while the pass runs rarely allows: the
         * WAL would then grow to the 1000-frame backstop with a pass (two syncs) after nearly
         * every commit.  So the next passes are RESTART checkpoints with no busy wait: between
         * two of the writer's transactions one takes the write lock, copies the few frames
         * left, syncs and leaves the WAL to be restarted (the writer's next BEGIN waits for
         * that short tail); while the writer is inside a transaction, or a reader still uses
         * the WAL, it copies what it can and answers SQLITE_BUSY, and is tried again after a
         * millisecond, up to 8 passes per wake. */
        int rc = SQLITE_OK, n_log = 0, n_done = 0;
        for (int pass = 0; pass < 8; pass++) {
            rc = sqlite3_wal_checkpoint_v2(c->db, "main",
                                           pass ? SQLITE_CHECKPOINT_RESTART
                                                : SQLITE_CHECKPOINT_PASSIVE,
                                           &n_log, &n_done);
            if (rc == SQLITE_BUSY) {
                rc = SQLITE_OK;
                usleep(1000);
                continue;
            }
            if (rc != SQLITE_OK || pass) break;
        }
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        pthread_cond_broadcast(&c->cv);
        if (rc == SQLITE_OK) {
            c->stats.n_background++;
            c->stats.frames_copied += n_done;
        } else {
            c->stats.n_failed++;
            c->stats.last_rc = sqlite3_extended_errcode(c->db);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

arl_status rckpt_start(rdb *d, const char *vfs, rckpt **out) {
    *out = NULL;
    ARL_ASSERT(d->db && !d->readonly);
    /* a single-threaded SQLite: keep its own checkpoint */
    if (!sqlite3_threadsafe()) return ARL_OK;
    rckpt *c = calloc(1, sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    c->d = d;
    int rc = sqlite3_open_v2(d->path, &c->db, SQLITE_OPEN_READWRITE, vfs);
    if (rc == SQLITE_OK) {
        /* the checkpoint syncs as the writer's would; it never writes a transaction itself */
        char sql[160];
        snprintf(sql, sizeof sql,
                 "PRAGMA synchronous = %s; PRAGMA wal_autocheckpoint = 0; PRAGMA busy_timeout = 0",
                 d->kind == REPLAY_FILE_STATES ? "NORMAL" : "FULL");
        rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
    }
    if (rc != SQLITE_OK) {
        arl_status s = arl_errorf(ARL_ERR_DB,
                                  "replay: %s: opening the checkpoint connection: %s (SQLite code "
                                  "%d) (check the file system and free file descriptors)",
                                  d->name, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc), rc);
        sqlite3_close(c->db);
        free(c);
        return s;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    const int e = pthread_create(&c->thread, NULL, ckpt_main, c);
    if (e) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        sqlite3_close(c->db);
        free(c);
        return arl_errorf(ARL_ERR_NOMEM,
                          "replay: %s: cannot start the checkpoint thread: %s (out of memory, or "
                          "the process's thread limit)",
                          d->name, strerror(e));
    }
    sqlite3_wal_hook(d->db, wal_hook, c);
    *out = c;
    return ARL_OK;
}

void rckpt_stop(rckpt *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    /* back to SQLite's automatic checkpoint at the spec's 1000 frames */
    if (c->d->db) sqlite3_wal_autocheckpoint(c->d->db, RCKPT_BACKSTOP_FRAMES);
    sqlite3_close(c->db);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int rckpt_truncate(rckpt *c, rdb *d, int *n_log, int *n_done) {
    *n_log = *n_done = 0;
    if (c) {
        /* the background pass in progress finishes first; none starts until this one is done */
        pthread_mutex_lock(&c->mu);
        while (c->busy)
            pthread_cond_wait(&c->cv, &c->mu);
        c->busy = 1;
        c->wake = 0;
        pthread_mutex_unlock(&c->mu);
    }
    int rc = sqlite3_wal_checkpoint_v2(d->db, "main", SQLITE_CHECKPOINT_TRUNCATE, n_log, n_done);
    if (c) {
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        if (rc == SQLITE_OK) c->stats.last_frames = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

void rckpt_get_stats(rckpt *c, rckpt_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

void rckpt_wake(rckpt *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->wake = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}
