/* tests/replay/faultvfs.h: a SQLite VFS shim ("arlfault") over the default VFS that fails
 * after N calls (STYLE.md rule 20): once armed with faultvfs_arm(n, kind), the (n+1)-th xWrite
 * (FAULT_FULL: SQLITE_FULL, a full disk) or xSync (FAULT_SYNC: SQLITE_IOERR_FSYNC) fails, and
 * every later one too until faultvfs_disarm() -- a full disk stays full.  Everything else is
 * passed through, including the shared-memory methods WAL needs.  Test code only. */
#ifndef ARL_TESTS_REPLAY_FAULTVFS_H
#define ARL_TESTS_REPLAY_FAULTVFS_H

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

enum { FAULT_FULL = 1, FAULT_SYNC = 2 };

static sqlite3_vfs *fv_base;
static sqlite3_vfs fv_vfs;
static sqlite3_io_methods fv_io;
static long fv_countdown = -1; /* < 0: disarmed */
static int fv_kind, fv_fired;

typedef struct fv_file {
    sqlite3_file base;
    sqlite3_file *real; /* follows this struct in the same allocation */
} fv_file;

static int fv_fail(int kind) {
    if (fv_countdown < 0 || kind != fv_kind) return 0;
    if (fv_countdown == 0) {
        fv_fired++;
        return 1; /* sticky: stays at 0 */
    }
    fv_countdown--;
    return 0;
}

#define REAL(f) (((fv_file *)(f))->real)
static int fv_close(sqlite3_file *f) {
    int rc = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
    return rc;
}
static int fv_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) {
    return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int fv_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
    if (fv_fail(FAULT_FULL)) return SQLITE_FULL;
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int fv_truncate(sqlite3_file *f, sqlite3_int64 n) {
    return REAL(f)->pMethods->xTruncate(REAL(f), n);
}
static int fv_sync(sqlite3_file *f, int flags) {
    if (fv_fail(FAULT_SYNC)) return SQLITE_IOERR_FSYNC;
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int fv_size(sqlite3_file *f, sqlite3_int64 *s) {
    return REAL(f)->pMethods->xFileSize(REAL(f), s);
}
static int fv_lock(sqlite3_file *f, int l) {
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int fv_unlock(sqlite3_file *f, int l) {
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int fv_check(sqlite3_file *f, int *r) {
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), r);
}
static int fv_fcntl(sqlite3_file *f, int op, void *a) {
    return REAL(f)->pMethods->xFileControl(REAL(f), op, a);
}
static int fv_sector(sqlite3_file *f) {
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int fv_dev(sqlite3_file *f) {
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int fv_shmmap(sqlite3_file *f, int pg, int sz, int ext, void volatile **p) {
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, p);
}
static int fv_shmlock(sqlite3_file *f, int o, int n, int fl) {
    return REAL(f)->pMethods->xShmLock(REAL(f), o, n, fl);
}
static void fv_shmbarrier(sqlite3_file *f) {
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int fv_shmunmap(sqlite3_file *f, int del) {
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int fv_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **p) {
    return REAL(f)->pMethods->xFetch(REAL(f), o, n, p);
}
static int fv_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) {
    return REAL(f)->pMethods->xUnfetch(REAL(f), o, p);
}
#undef REAL

static int fv_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    (void)v;
    fv_file *ff = (fv_file *)f;
    ff->real = (sqlite3_file *)(ff + 1);
    memset(ff->real, 0, (size_t)fv_base->szOsFile);
    int rc = fv_base->xOpen(fv_base, name, ff->real, flags, out);
    ff->base.pMethods = ff->real->pMethods ? &fv_io : NULL;
    return rc;
}
static int fv_delete(sqlite3_vfs *v, const char *n, int s) {
    (void)v;
    return fv_base->xDelete(fv_base, n, s);
}
static int fv_access(sqlite3_vfs *v, const char *n, int fl, int *r) {
    (void)v;
    return fv_base->xAccess(fv_base, n, fl, r);
}
static int fv_fullpath(sqlite3_vfs *v, const char *n, int k, char *o) {
    (void)v;
    return fv_base->xFullPathname(fv_base, n, k, o);
}
static int fv_random(sqlite3_vfs *v, int n, char *o) {
    (void)v;
    return fv_base->xRandomness(fv_base, n, o);
}
static int fv_sleep(sqlite3_vfs *v, int us) {
    (void)v;
    return fv_base->xSleep(fv_base, us);
}
static int fv_time(sqlite3_vfs *v, double *t) {
    (void)v;
    return fv_base->xCurrentTime(fv_base, t);
}
static int fv_lasterr(sqlite3_vfs *v, int n, char *b) {
    (void)v;
    return fv_base->xGetLastError(fv_base, n, b);
}
static int fv_time64(sqlite3_vfs *v, sqlite3_int64 *t) {
    (void)v;
    return fv_base->xCurrentTimeInt64(fv_base, t);
}

/* Register "arlfault" (once). Returns SQLITE_OK. */
static inline int faultvfs_register(void) {
    if (fv_base) return SQLITE_OK;
    fv_base = sqlite3_vfs_find(NULL);
    if (!fv_base) return SQLITE_ERROR;
    fv_io = (sqlite3_io_methods){
        3,          fv_close,      fv_read,     fv_write, fv_truncate, fv_sync, fv_size,
        fv_lock,    fv_unlock,     fv_check,    fv_fcntl, fv_sector,   fv_dev,  fv_shmmap,
        fv_shmlock, fv_shmbarrier, fv_shmunmap, fv_fetch, fv_unfetch};
    fv_vfs = *fv_base;
    fv_vfs.iVersion = 2;
    fv_vfs.szOsFile = (int)sizeof(fv_file) + fv_base->szOsFile;
    fv_vfs.zName = "arlfault";
    fv_vfs.pNext = NULL;
    fv_vfs.xOpen = fv_open;
    fv_vfs.xDelete = fv_delete;
    fv_vfs.xAccess = fv_access;
    fv_vfs.xFullPathname = fv_fullpath;
    fv_vfs.xRandomness = fv_random;
    fv_vfs.xSleep = fv_sleep;
    fv_vfs.xCurrentTime = fv_time;
    fv_vfs.xGetLastError = fv_lasterr;
    fv_vfs.xCurrentTimeInt64 = fv_time64;
    return sqlite3_vfs_register(&fv_vfs, 0);
}

static inline void faultvfs_arm(long n, int kind) {
    fv_countdown = n;
    fv_kind = kind;
    fv_fired = 0;
}

static inline void faultvfs_disarm(void) {
    fv_countdown = -1;
}

#endif
