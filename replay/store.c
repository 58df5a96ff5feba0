/* replay/store.c: opening a store root, the shard registry (files under shards/), ownership
 * locks, and the catalog's rows (runs, versions, envs, tasks, groups, member mirror). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "replay/codec.h"
#include "replay/internal.h"

#ifndef AGENTRL_VERSION
#define AGENTRL_VERSION "0.0.0"
#endif

/* Inverse of name_of over 0..max: the value named name; -1 if none or name is NULL. */
static int name_parse(const char *name, const char *(*name_of)(int), int max) {
    for (int v = 0; v <= max; v++)
        if (name && !strcmp(name, name_of(v))) return v;
    return -1;
}

const char *replay_status_name(int status) {
    switch (status) {
    case REPLAY_RUNNING:
        return "running";
    case REPLAY_COMPLETE:
        return "complete";
    case REPLAY_TRUNCATED:
        return "truncated";
    case REPLAY_MASKED:
        return "masked";
    default:
        return "?";
    }
}

int replay_status_parse(const char *name) {
    return name_parse(name, replay_status_name, REPLAY_MASKED);
}

const char *replay_file_kind_name(int kind) {
    switch (kind) {
    case REPLAY_FILE_CATALOG:
        return "catalog";
    case REPLAY_FILE_WORKER:
        return "worker";
    case REPLAY_FILE_STATES:
        return "states";
    case REPLAY_FILE_LEARNER:
        return "learner";
    case REPLAY_FILE_TOOL:
        return "tool";
    default:
        return "?";
    }
}

int rfile_kind_parse(const char *name) {
    return name_parse(name, replay_file_kind_name, REPLAY_FILE_TOOL);
}

const char *rstore_kind_letter(int kind) {
    switch (kind) {
    case REPLAY_FILE_WORKER:
        return "w";
    case REPLAY_FILE_LEARNER:
        return "l";
    case REPLAY_FILE_TOOL:
        return "t";
    default:
        return "?";
    }
}

int64_t rnow_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *rstore_shard_rel(int kind, int32_t shard_id) {
    char *p = malloc(48);
    if (p) snprintf(p, 48, "shards/%s%d.sqlite", rstore_kind_letter(kind), (int)shard_id);
    return p;
}

char *rstore_join(const char *dir, const char *rel) {
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s%s", dir, *dir ? "/" : "", rel);
    return p;
}

/* ---- ownership locks (spec section 2.2) ---- */

/* Byte RLOCK_OWNER of "<file>.lock" is the ownership lock, held by a writer for its life.  A
 * brief holder (a maintenance command that takes a file over for a moment: gc, seal, migrate,
 * recover, verify --repair) holds byte RLOCK_BRIEF as well, taken first and let go last, so
 * that a writer that finds the ownership lock taken can tell that it will soon be free: it
 * waits for a brief holder (up to RLOCK_WAIT_MS, SQLite's busy timeout) and fails at once
 * when a writer holds it.  Older builds locked the whole file: they count as both. */
enum { RLOCK_OWNER = 0, RLOCK_BRIEF = 1 };
#define RLOCK_WAIT_MS 10000
#define RLOCK_PAUSE_US 20000

static pthread_mutex_t lock_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t dev, ino; } lock_held[256];
static int lock_nheld;
static pid_t lock_pid; /* the process the list is of: a child of fork holds none of its locks */

/* lock_held of this process (lock_mu held): emptied in a child of fork. */
static void held_list_own(void) {
    if (lock_pid == getpid()) return;
    lock_pid = getpid();
    lock_nheld = 0;
}

static int lock_byte(int fd, off_t at) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(fd, F_SETLK, &fl);
}

/* The pid of another process that holds byte at of fd's file; 0 if none or it cannot be told. */
static long byte_holder(int fd, off_t at) {
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? (long)q.l_pid : 0;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 1 if this process holds the lock of the lock file at path (lock_mu held).  Checked before
 * opening it: closing any descriptor of a file lets go of every lock the process holds on it. */
static int held_here(const char *path) {
    struct stat sb;
    held_list_own();
    if (stat(path, &sb)) return 0;
    for (int i = 0; i < lock_nheld; i++)
        if (lock_held[i].dev == (uint64_t)sb.st_dev && lock_held[i].ino == (uint64_t)sb.st_ino)
            return 1;
    return 0;
}

arl_status rlock_acquire(const char *path, const char *name, int brief, int *fd_out, uint64_t *dev,
                         uint64_t *ino) {
    pthread_mutex_lock(&lock_mu);
    const int mine = held_here(path);
    pthread_mutex_unlock(&lock_mu);
    if (mine)
        return arl_errorf(ARL_ERR_BUSY,
                          "replay: %s: already open for writing in this process (one writer per "
                          "file: use another shard)",
                          name);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                          "replay: %s: cannot open its lock file %s: %s (check permissions)", name,
                          path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        close(fd);
        return arl_errorf(ARL_ERR_IO, "replay: %s: fstat(%s): %s", name, path, strerror(errno));
    }
    int e = 0, at = RLOCK_OWNER;
    if (brief && lock_byte(fd, RLOCK_BRIEF)) { /* another brief holder: no wait */
        e = errno;
        at = RLOCK_BRIEF;
    }
    const int64_t t0 = mono_ms();
    while (!e) {
        pthread_mutex_lock(&lock_mu);
        held_list_own();
        for (int i = 0; i < lock_nheld; i++)
            if (lock_held[i].dev == (uint64_t)sb.st_dev &&
                lock_held[i].ino == (uint64_t)sb.st_ino) {
                pthread_mutex_unlock(&lock_mu);
                close(fd);
                return arl_errorf(ARL_ERR_BUSY,
                                  "replay: %s: already open for writing in this process (one "
                                  "writer per file: use another shard)",
                                  name);
            }
        if (lock_byte(fd, RLOCK_OWNER) == 0) {
            if (lock_nheld < (int)(sizeof lock_held / sizeof *lock_held)) {
                lock_held[lock_nheld].dev = (uint64_t)sb.st_dev;
                lock_held[lock_nheld].ino = (uint64_t)sb.st_ino;
                lock_nheld++;
            }
            pthread_mutex_unlock(&lock_mu);
            *fd_out = fd;
            *dev = (uint64_t)sb.st_dev;
            *ino = (uint64_t)sb.st_ino;
            return ARL_OK;
        }
        e = errno;
        pthread_mutex_unlock(&lock_mu);
        /* a maintenance command has the file for a moment: a writer waits for it */
        if ((e == EACCES || e == EAGAIN) && !brief && byte_holder(fd, RLOCK_BRIEF) > 0 &&
            mono_ms() - t0 < RLOCK_WAIT_MS) {
            usleep(RLOCK_PAUSE_US);
            e = 0;
        }
    }
    const long pid = byte_holder(fd, at);
    const int tool = at == RLOCK_BRIEF || (!brief && byte_holder(fd, RLOCK_BRIEF) > 0);
    close(fd);
    if ((e == EACCES || e == EAGAIN) && tool)
        return arl_errorf(ARL_ERR_BUSY,
                          "replay: %s: another replay command (pid %ld: gc, seal, migrate, recover "
                          "or verify --repair) %s: run this one again when it has finished",
                          name, pid ? pid : -1,
                          brief ? "is using this file" : "held this file for more than 10 s");
    if (e == EACCES || e == EAGAIN)
        return arl_errorf(ARL_ERR_BUSY,
                          "replay: %s: another process (pid %ld) is writing this file (one "
                          "writer per file: use another shard, or wait for it to finish)",
                          name, pid ? pid : -1);
    return arl_errorf(ARL_ERR_IO, "replay: %s: locking %s: %s", name, path, strerror(e));
}

void rlock_release(int fd, uint64_t dev, uint64_t ino) {
    if (fd < 0) return;
    pthread_mutex_lock(&lock_mu);
    held_list_own();
    for (int i = 0; i < lock_nheld; i++)
        if (lock_held[i].dev == dev && lock_held[i].ino == ino) {
            lock_held[i] = lock_held[--lock_nheld];
            break;
        }
    pthread_mutex_unlock(&lock_mu);
    close(fd); /* lets go of both bytes */
}

/* rlock_holder, and in *brief whether the holder is a brief one */
static long lock_holder(const char *path, int *brief) {
    *brief = 0;
    char *lock = malloc(strlen(path) + 8);
    if (!lock) return 0;
    sprintf(lock, "%s.lock", path);
    pthread_mutex_lock(&lock_mu);
    const int mine = held_here(lock); /* closing an fd of it would let this process's lock go */
    pthread_mutex_unlock(&lock_mu);
    const int fd = mine ? -1 : open(lock, O_RDONLY | O_CLOEXEC);
    free(lock);
    if (fd < 0) return 0;
    const long pid = byte_holder(fd, RLOCK_OWNER);
    *brief = pid > 0 && byte_holder(fd, RLOCK_BRIEF) > 0;
    close(fd);
    return pid;
}

long rlock_holder(const char *path) {
    int brief;
    return lock_holder(path, &brief);
}

int rstore_file_missing(const char *path) {
    struct stat sb;
    return stat(path, &sb) != 0 && errno == ENOENT && rlock_holder(path) == 0;
}

void rlock_print_skipped(FILE *out, const char *file, const char *path, const char *then) {
    if (!out) return;
    int brief;
    const long pid = lock_holder(path, &brief);
    if (pid > 0 && brief)
        fprintf(out,
                "%s: skipped (in use by another replay command, pid %ld): run this one again "
                "once it has finished\n",
                file, pid);
    else if (pid > 0)
        fprintf(out, "%s: skipped (writer alive, pid %ld): %s\n", file, pid, then);
    else
        fprintf(out, "%s: skipped (writer alive): %s\n", file, then);
}

/* ---- shard registry ---- */

static void shard_free(rshard *sh) {
    for (size_t i = 0; i < sizeof sh->stmt / sizeof *sh->stmt; i++)
        sqlite3_finalize(sh->stmt[i]);
    rdb_close(&sh->db);
    rdb_close(&sh->states);
    free(sh->file);
    free(sh->path);
}

static int shard_cmp(const void *a, const void *b) {
    const rshard *x = a, *y = b;
    return (x->shard_id > y->shard_id) - (x->shard_id < y->shard_id);
}

/* Parse "w12.sqlite" into kind and id; 0 if the name is not a shard file. */
static int parse_shard_name(const char *n, int *kind, int32_t *id) {
    int k;
    switch (n[0]) {
    case 'w':
        k = REPLAY_FILE_WORKER;
        break;
    case 'l':
        k = REPLAY_FILE_LEARNER;
        break;
    case 't':
        k = REPLAY_FILE_TOOL;
        break;
    default:
        return 0;
    }
    const char *p = n + 1;
    long v = 0;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > REPLAY_SHARD_MAX) return 0;
        p++;
    }
    if (strcmp(p, ".sqlite") || v < 1) return 0;
    *kind = k;
    *id = (int32_t)v;
    return 1;
}

static arl_status scan_dir(replay_store *st, const char *sub) {
    char *d = rstore_join(st->dir, sub);
    if (!d) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    DIR *dir = opendir(d);
    if (!dir) {
        free(d);
        return ARL_OK;
    }
    struct dirent *e;
    arl_status s = ARL_OK;
    while ((e = readdir(dir))) {
        int kind;
        int32_t id;
        if (!parse_shard_name(e->d_name, &kind, &id)) continue;
        int known = 0;
        for (size_t i = 0; i < st->n_shards; i++)
            if (st->shards[i].shard_id == id) known = 1;
        if (known) continue;
        rshard *ns = realloc(st->shards, (st->n_shards + 1) * sizeof *ns);
        if (!ns) {
            s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            break;
        }
        st->shards = ns;
        rshard *sh = &st->shards[st->n_shards];
        memset(sh, 0, sizeof *sh);
        sh->shard_id = id;
        sh->kind = kind;
        size_t fl = strlen(sub) + strlen(e->d_name) + 2;
        sh->file = malloc(fl);
        if (sh->file) snprintf(sh->file, fl, "%s%s%s", sub, *sub ? "/" : "", e->d_name);
        sh->path = sh->file ? rstore_join(st->dir, sh->file) : NULL;
        if (!sh->file || !sh->path) {
            free(sh->file);
            free(sh->path);
            s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            break;
        }
        st->n_shards++;
    }
    closedir(dir);
    free(d);
    if (st->n_shards > 1) qsort(st->shards, st->n_shards, sizeof *st->shards, shard_cmp);
    return s;
}

arl_status replay_store_refresh(replay_store *st) {
    if (st->single_file) return ARL_OK;
    ARL_TRY(scan_dir(st, "shards"));
    if (!st->cat.db) ARL_TRY(scan_dir(st, "")); /* a directory of copied shard files */
    return ARL_OK;
}

rshard *rstore_shard(replay_store *st, int32_t shard_id) {
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < st->n_shards; i++)
            if (st->shards[i].shard_id == shard_id) return &st->shards[i];
        if (pass == 0 && replay_store_refresh(st) != ARL_OK) return NULL;
    }
    return NULL;
}

arl_status rstore_shards_copy(const replay_store *st, rshard_ref **out, size_t *n) {
    *n = st->n_shards;
    *out = malloc((*n ? *n : 1) * sizeof **out);
    if (!*out) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    for (size_t i = 0; i < *n; i++)
        (*out)[i] = (rshard_ref){st->shards[i].shard_id, st->shards[i].kind};
    return ARL_OK;
}

void rstore_shard_release(replay_store *st, int32_t shard_id) {
    rshard *sh = rstore_shard(st, shard_id);
    if (!sh) return;
    for (size_t i = 0; i < sizeof sh->stmt / sizeof *sh->stmt; i++) {
        sqlite3_finalize(sh->stmt[i]);
        sh->stmt[i] = NULL;
    }
    rdb_close(&sh->db);
    rdb_close(&sh->states);
}

int rstore_shard_sealed(replay_store *st, int32_t shard_id) {
    rshard *sh = rstore_shard(st, shard_id);
    rdb *d;
    char v[8] = "";
    int found = 0;
    if (!sh || rstore_shard_db(st, sh, &d) != ARL_OK || d->empty ||
        rdb_meta_get(d, "sealed", v, sizeof v, &found) != ARL_OK) {
        arl_error_clear();
        return 0;
    }
    return found && !strcmp(v, "1");
}

arl_status rstore_shard_db(replay_store *st, rshard *sh, rdb **out) {
    if (!sh->db.db) {
        int kind = st->single_file ? -1 : sh->kind;
        ARL_TRY(rdb_open(&sh->db, sh->path, sh->file, kind, RDB_READONLY, st->vfs, NULL));
    }
    *out = &sh->db;
    return ARL_OK;
}

arl_status rstore_shard_states(replay_store *st, rshard *sh, rdb **out) {
    if (!sh->states.db) {
        size_t n = strlen(sh->path);
        char *p = malloc(n + 16), *f = malloc(strlen(sh->file) + 16);
        if (!p || !f) {
            free(p);
            free(f);
            return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        }
        memcpy(p, sh->path, n - 7);
        strcpy(p + n - 7, ".states.sqlite");
        size_t m = strlen(sh->file);
        memcpy(f, sh->file, m - 7);
        strcpy(f + m - 7, ".states.sqlite");
        arl_status s = rdb_open(&sh->states, p, f, REPLAY_FILE_STATES, RDB_READONLY, st->vfs, NULL);
        free(p);
        free(f);
        ARL_TRY(s);
    }
    *out = &sh->states;
    return ARL_OK;
}

static void plan_append(rplan_log *l, const char *t) {
    size_t n = strlen(t);
    if (l->len + n + 1 > l->cap) {
        size_t c = (l->cap + n + 1) * 2;
        char *p = realloc(l->text, c);
        if (!p) return;
        l->text = p;
        l->cap = c;
    }
    memcpy(l->text + l->len, t, n + 1);
    l->len += n;
}

arl_status rstore_prepare(replay_store *st, rdb *d, const char *sql, sqlite3_stmt **out) {
    if (st->plan.enabled) {
        size_t n = strlen(sql) + 32;
        char *q = malloc(n);
        if (q) {
            snprintf(q, n, "EXPLAIN QUERY PLAN %s", sql);
            sqlite3_stmt *e;
            if (sqlite3_prepare_v2(d->db, q, -1, &e, NULL) == SQLITE_OK) {
                plan_append(&st->plan, "QUERY ");
                plan_append(&st->plan, sql);
                plan_append(&st->plan, "\n");
                /* Unbound parameters are NULL: the plan does not depend on them. */
                while (sqlite3_step(e) == SQLITE_ROW) {
                    plan_append(&st->plan, "  PLAN ");
                    plan_append(&st->plan, (const char *)sqlite3_column_text(e, 3));
                    plan_append(&st->plan, "\n");
                }
                sqlite3_finalize(e);
            }
            free(q);
        }
    }
    return rdb_prepare(d, sql, out);
}

/* ---- open / close ---- */

/* The directory path and its missing parents (core/file.h arl_mkdir_p), the error prefixed. */
static arl_status mkdir_p(const char *path) {
    const arl_status s = arl_mkdir_p(path);
    return s ? arl_error_prefix(s, "replay") : ARL_OK;
}

static void random_hex(char *out, size_t nbytes) {
    uint8_t b[32] = {0};
    if (nbytes > sizeof b) nbytes = sizeof b;
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(b, 1, nbytes, f) : 0;
    if (f) fclose(f);
    if (got < nbytes) { /* fall back to time and pid */
        uint64_t x = (uint64_t)rnow_ms() ^ ((uint64_t)getpid() << 32);
        for (size_t i = 0; i < nbytes; i++, x = x * 6364136223846793005ULL + 1)
            b[i] ^= (uint8_t)(x >> 56);
    }
    replay_hex_encode(b, nbytes, out);
}

/* The stores (folders holding catalog.sqlite) at most `depth` levels below dir, named relative
 * to it (rel): up to cap names into names[] (malloc'd), *n counts them all. */
static void stores_below(const char *dir, const char *rel, int depth, char **names, int cap,
                         int *n) {
    DIR *d = depth > 0 ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[4096], name[4096], cat[4200];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(name, sizeof name, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) continue;
        snprintf(cat, sizeof cat, "%s/catalog.sqlite", path);
        if (stat(cat, &sb) == 0) {
            if (*n < cap) names[*n] = strdup(name);
            ++*n;
        } else {
            stores_below(path, name, depth - 1, names, cap, n);
        }
    }
    closedir(d);
}

static int cmp_str(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    return strcmp(x ? x : "", y ? y : "");
}

/* A store to write (REPLAY_OPEN_CREATE) is a store root or a path to make one at: not a file
 * (opened read-only as one shard), and not a folder of store files without a catalog (a
 * store's shards/ folder), where a second store would be made around them.  A root whose
 * catalog was lost keeps its files in shards/ and is opened (the catalog is rebuilt). */
static arl_status create_root_check(const char *root) {
    struct stat sb;
    if (stat(root, &sb) != 0) return ARL_OK; /* made below */
    if (!S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_ARG,
                          "replay: %s: not a directory (a replay store is a folder: give a store "
                          "root, or a path to create one at)",
                          root);
    /* One listing decides: catalog.sqlite among the names is a root.  (A stat of the catalog
     * before the listing raced a second writer creating the same new store: its catalog, made
     * between the two, was taken for a stray store file.) */
    DIR *d = opendir(root);
    if (!d) return ARL_OK; /* the open below says why */
    const struct dirent *e;
    char stray[256] = "";
    int have_cat = 0;
    while (!have_cat && (e = readdir(d))) {
        const size_t len = strlen(e->d_name);
        if (!strcmp(e->d_name, "catalog.sqlite"))
            have_cat = 1;
        else if (!*stray && len > 7 && !strcmp(e->d_name + len - 7, ".sqlite"))
            snprintf(stray, sizeof stray, "%s", e->d_name);
    }
    closedir(d);
    if (have_cat || !*stray) return ARL_OK;
    return arl_errorf(ARL_ERR_ARG,
                      "replay: %s: holds store files (%s) but no catalog.sqlite, so it is not a "
                      "store root (a store's shards/ folder? give the folder that holds "
                      "catalog.sqlite, or a new path)",
                      root, stray);
}

/* The error for a folder that is no store: the stores below it named (a train run's replay/
 * holds u<N>/r<K>), or what a store is. */
static arl_status not_a_store(const char *root) {
    enum { CAP = 256 };
    char *names[CAP] = {0};
    int n = 0;
    stores_below(root, "", 3, names, CAP, &n);
    const int got = n < CAP ? n : CAP;
    qsort(names, (size_t)got, sizeof *names, cmp_str);
    char list[1024] = "";
    for (int i = 0; i < got && i < 4; i++) {
        const size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i] ? names[i] : "?");
    }
    arl_status s;
    if (n == 1)
        s = arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s is not a store; give the store in it: %s/%s",
                       root, root, names[0] ? names[0] : "?");
    else if (n > 1)
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "replay: %s is not a store but holds %d: %s%s (give one of them, e.g. "
                       "%s/%s)",
                       root, n, list, n > 4 ? ", ..." : "", root, names[0] ? names[0] : "?");
    else
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "replay: %s: neither catalog.sqlite nor shard files found (is this a store "
                       "root?)",
                       root);
    for (int i = 0; i < got; i++)
        free(names[i]);
    return s;
}

/* A reader given a store's shards/ folder (up = 1) or one of its shard files (up = 2) reads the
 * files without their catalog: environments show as env#N, groups and pins are unknown. Warn,
 * naming the store root, when the folder up levels above holds catalog.sqlite. */
static void warn_inside_store(const char *root, int up) {
    char *abs = realpath(root, NULL);
    if (!abs) return;
    for (int i = 0; i < up; i++) {
        char *slash = strrchr(abs, '/');
        if (!slash) break;
        if (slash == abs)
            slash[1] = 0;
        else
            *slash = 0;
    }
    char *cat = rstore_join(abs, "catalog.sqlite");
    struct stat sb;
    if (cat && stat(cat, &sb) == 0)
        arl_log_warn("replay: %s is %s of the store %s, read without its catalog "
                     "(environments show as env#N; groups and pins are not known%s): give the "
                     "store root instead",
                     root, up == 1 ? "the shards folder" : "a shard file", abs,
                     up == 1 ? "" : ", nor the store's other files");
    free(cat);
    free(abs);
}

arl_status replay_store_open(const char *root, const replay_open_opts *opts, replay_store **out) {
    *out = NULL;
    replay_store *st = calloc(1, sizeof *st);
    if (!st) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
    st->flags = opts ? opts->flags : 0;
    st->root = strdup(root);
    st->vfs = opts && opts->vfs ? strdup(opts->vfs) : NULL;
    if (opts && opts->host)
        snprintf(st->host, sizeof st->host, "%s", opts->host);
    else if (gethostname(st->host, sizeof st->host - 1))
        strcpy(st->host, "localhost");
    arl_status s = ARL_OK;
    if (!st->root) {
        s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        goto fail;
    }
    const char *env_plan = getenv("ARL_REPLAY_PLAN_LOG");
    st->plan.enabled = env_plan && *env_plan && strcmp(env_plan, "0");
    int ro = !!(st->flags & REPLAY_OPEN_READONLY);
    struct stat sb;
    if ((st->flags & REPLAY_OPEN_CREATE) && !ro && (s = create_root_check(root)) != ARL_OK)
        goto fail;
    if (stat(root, &sb) == 0 && S_ISREG(sb.st_mode)) {
        /* One shard file: read-only; its id and kind come from its meta. */
        st->single_file = 1;
        st->flags |= REPLAY_OPEN_READONLY;
        st->dir = strdup("");
        st->shards = calloc(1, sizeof *st->shards);
        if (!st->dir || !st->shards) {
            s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            goto fail;
        }
        st->n_shards = 1;
        rshard *sh = &st->shards[0];
        sh->file = strdup(root);
        sh->path = strdup(root);
        if ((s = rdb_open(&sh->db, root, root, -1, RDB_READONLY, st->vfs, NULL)) != ARL_OK)
            goto fail;
        char v[32];
        int found;
        if ((s = rdb_meta_get(&sh->db, "shard_id", v, sizeof v, &found)) != ARL_OK) goto fail;
        sh->shard_id = found ? atoi(v) : 0;
        sh->kind = sh->db.kind;
        if (sh->kind != REPLAY_FILE_WORKER && sh->kind != REPLAY_FILE_TOOL &&
            sh->kind != REPLAY_FILE_LEARNER) {
            s = arl_errorf(ARL_ERR_ARG,
                           "replay: %s: a %s file, not a shard file: give the store root directory",
                           root, replay_file_kind_name(sh->kind));
            goto fail;
        }
        warn_inside_store(root, 2);
        *out = st;
        return ARL_OK;
    }
    int exists = stat(root, &sb) == 0;
    if (exists && !S_ISDIR(sb.st_mode)) {
        s = arl_errorf(ARL_ERR_ARG, "replay: %s is neither a store directory nor a shard file",
                       root);
        goto fail;
    }
    if (!exists && !(st->flags & REPLAY_OPEN_CREATE)) {
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "replay: %s: no such store (check the path; a store is created by a run)",
                       root);
        goto fail;
    }
    if (!exists && (s = mkdir_p(root)) != ARL_OK) goto fail;
    st->dir = strdup(root);
    char *cat = rstore_join(root, "catalog.sqlite");
    if (!st->dir || !cat) {
        free(cat);
        s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        goto fail;
    }
    int have_cat = stat(cat, &sb) == 0;
    if (have_cat || ((st->flags & REPLAY_OPEN_CREATE) && !ro)) {
        char meta[96];
        char uid[33];
        random_hex(uid, 16);
        int n = snprintf(meta, sizeof meta, "store_uid%c%s%c", 0, uid, 0);
        meta[n] = 0;
        s = rdb_open(&st->cat, cat, "catalog.sqlite", REPLAY_FILE_CATALOG,
                     ro ? RDB_READONLY : RDB_CREATE, st->vfs, meta);
        if (s == ARL_OK)
            s = rdb_meta_get(&st->cat, "store_uid", st->store_uid, sizeof st->store_uid, NULL);
        if (s == ARL_OK && !ro) {
            char *sd = rstore_join(root, "shards");
            s = sd ? mkdir_p(sd) : arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            free(sd);
        }
    }
    free(cat);
    if (s != ARL_OK) goto fail;
    if ((s = replay_store_refresh(st)) != ARL_OK) goto fail;
    if (!st->cat.db && !st->n_shards) {
        s = not_a_store(root);
        goto fail;
    }
    if (!st->cat.db) warn_inside_store(root, 1);
    *out = st;
    return ARL_OK;
fail:
    replay_store_close(st);
    return s;
}

void replay_store_close(replay_store *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_shards; i++)
        shard_free(&st->shards[i]);
    free(st->shards);
    rdb_close(&st->cat);
    free(st->root);
    free(st->dir);
    free(st->vfs);
    free(st->plan.text);
    free(st);
}

const char *replay_store_root(const replay_store *st) {
    return st->root;
}

const char *replay_store_uid(const replay_store *st) {
    return st->store_uid;
}

int replay_store_has_catalog(const replay_store *st) {
    return st->cat.db != NULL;
}

/* ---- catalog rows ---- */

arl_status rstore_need_root(replay_store *st, const char *what) {
    if (st->single_file)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s is a shard file, not a store root: %s works on a store root "
                          "(the folder that holds catalog.sqlite and shards/)",
                          st->root, what);
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s has no catalog.sqlite: %s works on a store root (the folder "
                          "that holds catalog.sqlite and shards/), not on a folder of shard files",
                          st->root, what);
    if (st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: its catalog is read-only: %s writes it (check the "
                          "permissions of %s/catalog.sqlite)",
                          st->root, what, st->root);
    return ARL_OK;
}

static arl_status need_catalog(replay_store *st, int write) {
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_STATE,
                          "replay: %s: this store has no catalog.sqlite (bare shard "
                          "files are read-only)",
                          st->root);
    if (write && st->cat.readonly)
        return arl_errorf(ARL_ERR_STATE, "replay: %s: store opened read-only", st->root);
    return ARL_OK;
}

/* Run an INSERT ... ON CONFLICT DO NOTHING (bound by bind()), then a SELECT of the id, in one
 * IMMEDIATE transaction. */
typedef void (*bind_fn)(sqlite3_stmt *s, const void *d);
static arl_status ensure_row(replay_store *st, const char *ins, const char *sel, bind_fn bind_ins,
                             bind_fn bind_sel, const void *d, int64_t *id, const char *what) {
    ARL_TRY(need_catalog(st, 1));
    rdb *c = &st->cat;
    sqlite3_stmt *a = NULL, *b = NULL;
    arl_status s = rdb_begin(c);
    if (s != ARL_OK) return s;
    if ((s = rdb_prepare(c, ins, &a)) != ARL_OK) goto out;
    bind_ins(a, d);
    int rc = sqlite3_step(a);
    if (rc != SQLITE_DONE) {
        s = rdb_fail(c, rc, what);
        goto out;
    }
    if ((s = rdb_prepare(c, sel, &b)) != ARL_OK) goto out;
    bind_sel(b, d);
    rc = sqlite3_step(b);
    if (rc != SQLITE_ROW) {
        s = rc == SQLITE_DONE
                ? arl_errorf(ARL_ERR_INTERNAL, "replay: catalog: %s: row vanished", what)
                : rdb_fail(c, rc, what);
        goto out;
    }
    *id = sqlite3_column_int64(b, 0);
out:
    sqlite3_finalize(a);
    sqlite3_finalize(b);
    return rdb_end(c, s);
}

static const char *or_default(const char *v, const char *d) {
    return v ? v : d;
}

static void bind_run(sqlite3_stmt *s, const void *p) {
    const replay_run_desc *d = p;
    char h1[65], h2[65];
    const char *cfg = or_default(d->config_json, "{}"),
               *mcfg = or_default(d->model_config_json, "{}");
    replay_sha256_hex(cfg, strlen(cfg), h1);
    replay_sha256_hex(mcfg, strlen(mcfg), h2);
    sqlite3_bind_text(s, 1, d->run_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, rnow_ms());
    sqlite3_bind_text(s, 3, cfg, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, h1, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 5, mcfg, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 6, h2, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 7, or_default(d->tokenizer_sha256, ""), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 8, or_default(d->chat_template_sha256, ""), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 9, or_default(d->code_version, AGENTRL_VERSION), -1, SQLITE_STATIC);
    rdb_bind_text(s, 10, d->notes);
}
static void bind_uid1(sqlite3_stmt *s, const void *p) {
    sqlite3_bind_text(s, 1, *(const char *const *)p, -1, SQLITE_STATIC);
}

arl_status replay_run_ensure(replay_store *st, const replay_run_desc *d, int64_t *run_id) {
    if (!d->run_uid || !*d->run_uid || strlen(d->run_uid) > REPLAY_UID_MAX)
        return arl_errorf(ARL_ERR_ARG, "replay: run_uid must be 1..256 bytes");
    return ensure_row(
        st,
        "INSERT INTO runs(run_uid, status, created_at_ms, config_json, config_sha256, "
        "model_config_json, model_config_sha256, tokenizer_sha256, "
        "chat_template_sha256, code_version, notes) VALUES "
        "(?1, 'active', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
        "ON CONFLICT(run_uid) DO NOTHING",
        "SELECT run_id FROM runs WHERE run_uid = ?1", bind_run, bind_uid1, d, run_id,
        "inserting a run");
}

arl_status replay_shards_of_kind(replay_store *st, replay_file_kind kind, int32_t *ids, size_t cap,
                                 size_t *n) {
    *n = 0;
    ARL_TRY(need_catalog(st, 0));
    sqlite3_stmt *q;
    ARL_TRY(
        rdb_prepare(&st->cat, "SELECT shard_id FROM shards WHERE kind = ?1 ORDER BY shard_id", &q));
    sqlite3_bind_text(q, 1, replay_file_kind_name(kind), -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n < cap) ids[*n] = (int32_t)sqlite3_column_int64(q, 0);
        (*n)++;
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "listing the shards");
    return ARL_OK;
}

arl_status replay_run_find(replay_store *st, const char *run_uid, int64_t *run_id) {
    ARL_TRY(need_catalog(st, 0));
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(&st->cat, "SELECT run_id FROM runs WHERE run_uid = ?1", &s));
    sqlite3_bind_text(s, 1, run_uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) *run_id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (rc == SQLITE_DONE)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "replay: %s: no run '%s' in the catalog (see 'agentrl "
                          "replay stats')",
                          st->root, run_uid);
    if (rc != SQLITE_ROW) return rdb_fail(&st->cat, rc, "finding a run");
    return ARL_OK;
}

arl_status replay_run_set_status(replay_store *st, int64_t run_id, const char *status) {
    ARL_TRY(need_catalog(st, 1));
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(&st->cat, "UPDATE runs SET status = ?2 WHERE run_id = ?1", &s));
    sqlite3_bind_int64(s, 1, run_id);
    rdb_bind_text(s, 2, status);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "updating a run's status");
    if (!sqlite3_changes(st->cat.db))
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: catalog: no run with id %lld",
                          (long long)run_id);
    return ARL_OK;
}

arl_status replay_version_add(replay_store *st, const replay_version_desc *d) {
    ARL_TRY(need_catalog(st, 1));
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(&st->cat,
                        "INSERT INTO policy_versions(run_id, version, created_at_ms, update_n, "
                        "checkpoint_uri, weights_sha256, kl_coef, metrics_json) VALUES "
                        "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        &s));
    sqlite3_bind_int64(s, 1, d->run_id);
    sqlite3_bind_int64(s, 2, d->version);
    sqlite3_bind_int64(s, 3, rnow_ms());
    rdb_bind_int_or_null(s, 4, d->update_n);
    rdb_bind_text(s, 5, d->checkpoint_uri);
    rdb_bind_text(s, 6, d->weights_sha256);
    rdb_bind_real_or_null(s, 7, d->kl_coef);
    rdb_bind_text(s, 8, d->metrics_json);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        if ((rc & 0xFF) == SQLITE_CONSTRAINT)
            return arl_errorf(ARL_ERR_STATE,
                              "replay: catalog: policy version %lld of run %lld already exists or "
                              "the run does not (%s)",
                              (long long)d->version, (long long)d->run_id,
                              sqlite3_errmsg(st->cat.db));
        return rdb_fail(&st->cat, rc, "inserting a policy version");
    }
    return ARL_OK;
}

/* Same file after resolving links and relative parts (both must exist). */
static int same_path(const char *a, const char *b) {
    if (!a || !b) return 0;
    char ra[PATH_MAX], rb[PATH_MAX];
    if (!realpath(a, ra) || !realpath(b, rb)) return 0;
    return !strcmp(ra, rb);
}

arl_status replay_version_find(replay_store *st, int64_t run_id, const char *weights_sha256,
                               const char *ckpt_dir, int64_t *version, int *how) {
    *version = -1;
    if (how) *how = 0;
    if (!st->cat.db) return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s has no catalog", st->root);
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT version, weights_sha256, checkpoint_uri FROM policy_versions "
                        "WHERE run_id = ?1 ORDER BY version",
                        &q));
    sqlite3_bind_int64(q, 1, run_id);
    int rc, by_path = 0;
    int64_t v_path = -1;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *w = (const char *)sqlite3_column_text(q, 1);
        const char *u = (const char *)sqlite3_column_text(q, 2);
        if (w && weights_sha256 && !strcmp(w, weights_sha256)) {
            *version = sqlite3_column_int64(q, 0);
            if (how) *how = 1;
            break;
        }
        /* a recorded hash that differs rules the row out whatever its path says */
        if (!w && !by_path && same_path(u, ckpt_dir)) {
            by_path = 1;
            v_path = sqlite3_column_int64(q, 0);
        }
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "reading policy versions");
    if (*version < 0 && by_path) {
        *version = v_path;
        if (how) *how = 2;
    }
    if (*version < 0)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "replay: no policy version of run %lld has these weights or this "
                          "checkpoint path",
                          (long long)run_id);
    return ARL_OK;
}

arl_status replay_version_get(replay_store *st, int64_t run_id, int64_t version,
                              replay_version_row *out) {
    memset(out, 0, sizeof *out);
    out->version = -1;
    if (!st->cat.db) return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s has no catalog", st->root);
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        version >= 0
                            ? "SELECT version, checkpoint_uri, weights_sha256 FROM policy_versions "
                              "WHERE run_id = ?1 AND version = ?2"
                            : "SELECT version, checkpoint_uri, weights_sha256 FROM policy_versions "
                              "WHERE run_id = ?1 ORDER BY version DESC LIMIT 1",
                        &q));
    sqlite3_bind_int64(q, 1, run_id);
    if (version >= 0) sqlite3_bind_int64(q, 2, version);
    const int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        out->version = sqlite3_column_int64(q, 0);
        rdb_col_text(q, 1, out->checkpoint_uri, sizeof out->checkpoint_uri);
        rdb_col_text(q, 2, out->weights_sha256, sizeof out->weights_sha256);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rdb_fail(&st->cat, rc, "reading a policy version");
    if (rc == SQLITE_DONE) {
        if (version >= 0)
            return arl_errorf(ARL_ERR_NOT_FOUND, "replay: run %lld has no policy version %lld",
                              (long long)run_id, (long long)version);
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: run %lld records no policy version",
                          (long long)run_id);
    }
    return ARL_OK;
}

arl_status replay_forks_at(replay_store *st, const char *parent_traj_uid, int32_t parent_seg_index,
                           replay_fork_member **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!st->cat.db) return ARL_OK;
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT m.traj_id, m.shard_id, m.status FROM task_groups g JOIN "
                        "group_members m ON m.group_id = g.group_id WHERE g.kind = 'fork' AND "
                        "g.parent_traj_uid = ?1 AND g.parent_seg_index = ?2 ORDER BY m.traj_id",
                        &q));
    sqlite3_bind_text(q, 1, parent_traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, parent_seg_index);
    size_t cap = 0;
    int rc = SQLITE_DONE;
    arl_status s = ARL_OK;
    while (s == ARL_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            replay_fork_member *v = realloc(*out, cap * sizeof *v);
            if (!v) {
                s = arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
                break;
            }
            *out = v;
        }
        replay_fork_member *m = &(*out)[(*n)++];
        m->traj_id = sqlite3_column_int64(q, 0);
        m->shard_id = sqlite3_column_int(q, 1);
        const int k = replay_status_parse((const char *)sqlite3_column_text(q, 2));
        m->status = k < 0 ? REPLAY_MASKED : (replay_status)k;
    }
    if (s == ARL_OK && rc != SQLITE_DONE) s = rdb_fail(&st->cat, rc, "reading fork groups");
    sqlite3_finalize(q);
    if (s != ARL_OK) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return s;
}

typedef struct env_bind {
    const replay_env_desc *d;
    char sha[65];
} env_bind;
static void bind_env(sqlite3_stmt *s, const void *p) {
    const env_bind *e = p;
    sqlite3_bind_text(s, 1, e->d->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, e->d->version, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, e->sha, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, or_default(e->d->info_json, "{}"), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, or_default(e->d->transport, "c_abi"), -1, SQLITE_STATIC);
    rdb_bind_text(s, 6, e->d->base_url);
    sqlite3_bind_int64(s, 7, rnow_ms());
}
static void bind_env_sel(sqlite3_stmt *s, const void *p) {
    const env_bind *e = p;
    sqlite3_bind_text(s, 1, e->d->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, e->sha, -1, SQLITE_STATIC);
}

arl_status replay_env_ensure(replay_store *st, const replay_env_desc *d, int64_t *env_id) {
    if (!d->name || !d->version)
        return arl_errorf(ARL_ERR_ARG, "replay: env name and version are required");
    env_bind e = {.d = d};
    const char *info = or_default(d->info_json, "{}");
    replay_sha256_hex(info, strlen(info), e.sha);
    return ensure_row(
        st,
        "INSERT INTO envs(name, version, info_sha256, info_json, transport, base_url, "
        "first_seen_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
        "ON CONFLICT(name, info_sha256) DO NOTHING",
        "SELECT env_id FROM envs WHERE name = ?1 AND info_sha256 = ?3", bind_env, bind_env_sel, &e,
        env_id, "inserting an environment");
}

typedef struct task_bind {
    const replay_task_desc *d;
    char sha[65];
} task_bind;
static void bind_task(sqlite3_stmt *s, const void *p) {
    const task_bind *t = p;
    sqlite3_bind_text(s, 1, t->d->task_uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, t->d->env_name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, t->d->seed);
    sqlite3_bind_text(s, 4, or_default(t->d->data_json, "{}"), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, t->sha, -1, SQLITE_STATIC);
    rdb_bind_text(s, 6, t->d->dataset);
    rdb_bind_text(s, 7, t->d->split);
}
static void bind_task_sel(sqlite3_stmt *s, const void *p) {
    const task_bind *t = p;
    sqlite3_bind_text(s, 1, t->d->task_uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, t->d->env_name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, t->d->seed);
    sqlite3_bind_text(s, 5, t->sha, -1, SQLITE_STATIC);
}

arl_status replay_task_ensure(replay_store *st, const replay_task_desc *d, int64_t *task_id) {
    if (!d->task_uid || !d->env_name)
        return arl_errorf(ARL_ERR_ARG, "replay: task_uid and env_name are required");
    task_bind t = {.d = d};
    const char *data = or_default(d->data_json, "{}");
    replay_sha256_hex(data, strlen(data), t.sha);
    return ensure_row(
        st,
        "INSERT INTO tasks(task_uid, env_name, seed, data_json, data_sha256, dataset, "
        "split) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
        "ON CONFLICT(env_name, task_uid, seed, data_sha256) DO NOTHING",
        "SELECT task_id FROM tasks WHERE env_name = ?2 AND task_uid = ?1 AND seed = ?3 "
        "AND data_sha256 = ?5",
        bind_task, bind_task_sel, &t, task_id, "inserting a task");
}

static void bind_group(sqlite3_stmt *s, const void *p) {
    const replay_group_desc *d = p;
    sqlite3_bind_text(s, 1, d->group_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, d->run_id);
    sqlite3_bind_int64(s, 3, d->task_id);
    sqlite3_bind_int64(s, 4, d->env_id);
    sqlite3_bind_text(s, 5, or_default(d->kind, "train"), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 6, d->size);
    sqlite3_bind_int64(s, 7, rnow_ms());
    sqlite3_bind_int64(s, 8, d->admitted_version);
    rdb_bind_text(s, 9, d->parent_traj_uid);
    rdb_bind_int_or_null(s, 10, d->parent_traj_uid ? d->parent_seg_index : -1);
}

arl_status replay_group_ensure(replay_store *st, const replay_group_desc *d, int64_t *group_id) {
    if (!d->group_uid || !*d->group_uid || strlen(d->group_uid) > REPLAY_UID_MAX)
        return arl_errorf(ARL_ERR_ARG, "replay: group_uid must be 1..256 bytes");
    ARL_TRY(ensure_row(
        st,
        "INSERT INTO task_groups(group_uid, run_id, task_id, env_id, kind, size, status, "
        "admitted_at_ms, admitted_version, parent_traj_uid, parent_seg_index) VALUES "
        "(?1, ?2, ?3, ?4, ?5, ?6, 'open', ?7, ?8, ?9, ?10) "
        "ON CONFLICT(group_uid) DO NOTHING",
        "SELECT group_id FROM task_groups WHERE group_uid = ?1", bind_group, bind_uid1, d, group_id,
        "inserting a group"));
    replay_group_row g;
    ARL_TRY(replay_group_get(st, d->group_uid, &g));
    const char *kind = or_default(d->kind, "train");
    if (g.run_id == d->run_id && g.task_id == d->task_id && !strcmp(g.kind, kind) &&
        g.size == d->size)
        return ARL_OK;
    *group_id = 0;
    return arl_errorf(ARL_ERR_STATE,
                      "replay: %s: group '%s' exists as run %lld's '%s' group of %d samples of "
                      "task %s (seed %lld, task id %lld), not run %lld's '%s' group of %d of "
                      "task id %lld: a group's run, task, kind and size are fixed when it is "
                      "first written (its members are samples of one task)",
                      st->root, d->group_uid, (long long)g.run_id, g.kind, (int)g.size, g.task_uid,
                      (long long)g.task_seed, (long long)g.task_id, (long long)d->run_id, kind,
                      (int)d->size, (long long)d->task_id);
}

arl_status replay_group_get(replay_store *st, const char *group_uid, replay_group_row *out) {
    memset(out, 0, sizeof *out);
    out->parent_seg_index = -1;
    if (!st->cat.db)
        return arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no catalog, so no group '%s'", st->root,
                          group_uid ? group_uid : "");
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat,
                        "SELECT g.group_id, g.run_id, g.group_uid, g.kind, g.status, g.size, "
                        "g.parent_traj_uid, g.parent_seg_index, (SELECT count(*) FROM "
                        "group_members m WHERE m.group_id = g.group_id), g.task_id, t.task_uid, "
                        "t.env_name, t.seed, t.data_sha256 FROM task_groups g LEFT JOIN tasks t "
                        "ON t.task_id = g.task_id WHERE g.group_uid = ?1",
                        &q));
    sqlite3_bind_text(q, 1, group_uid ? group_uid : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    arl_status s = ARL_OK;
    if (rc == SQLITE_ROW) {
        out->group_id = sqlite3_column_int64(q, 0);
        out->run_id = sqlite3_column_int64(q, 1);
        rdb_col_text(q, 2, out->group_uid, sizeof out->group_uid);
        rdb_col_text(q, 3, out->kind, sizeof out->kind);
        rdb_col_text(q, 4, out->status, sizeof out->status);
        out->size = sqlite3_column_int(q, 5);
        rdb_col_text(q, 6, out->parent_traj_uid, sizeof out->parent_traj_uid);
        if (sqlite3_column_type(q, 7) != SQLITE_NULL)
            out->parent_seg_index = sqlite3_column_int(q, 7);
        out->n_members = sqlite3_column_int64(q, 8);
        out->task_id = sqlite3_column_int64(q, 9);
        rdb_col_text(q, 10, out->task_uid, sizeof out->task_uid);
        rdb_col_text(q, 11, out->task_env, sizeof out->task_env);
        out->task_seed = sqlite3_column_int64(q, 12);
        rdb_col_text(q, 13, out->task_data_sha256, sizeof out->task_data_sha256);
    } else if (rc == SQLITE_DONE) {
        s = arl_errorf(ARL_ERR_NOT_FOUND, "replay: %s: no group '%s' in the catalog", st->root,
                       group_uid ? group_uid : "");
    } else {
        s = rdb_fail(&st->cat, rc, "reading a group");
    }
    sqlite3_finalize(q);
    return s;
}

/* ?1..?6 of a group_members insert: group_id, slot, attempt, traj_uid, shard_id, traj_id */
static void bind_member(sqlite3_stmt *a, int64_t group_id, int32_t slot, int32_t attempt,
                        const char *traj_uid, int32_t shard_id, int64_t traj_id) {
    sqlite3_bind_int64(a, 1, group_id);
    sqlite3_bind_int(a, 2, slot);
    sqlite3_bind_int(a, 3, attempt);
    sqlite3_bind_text(a, 4, traj_uid, -1, SQLITE_STATIC);
    sqlite3_bind_int(a, 5, shard_id);
    sqlite3_bind_int64(a, 6, traj_id);
}

static arl_status member_mirror(replay_store *st, int64_t group_id, int32_t slot, int32_t attempt,
                                const char *traj_uid, int32_t shard_id, int64_t traj_id,
                                const char *status) {
    rdb *c = &st->cat;
    sqlite3_stmt *a = NULL, *b = NULL;
    ARL_TRY(rdb_begin(c));
    arl_status s =
        rdb_prepare(c,
                    "INSERT INTO group_members(group_id, slot, attempt, traj_uid, shard_id, "
                    "traj_id, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                    "ON CONFLICT(group_id, slot, attempt) DO UPDATE SET "
                    "traj_uid = excluded.traj_uid, shard_id = excluded.shard_id, "
                    "traj_id = excluded.traj_id, status = excluded.status",
                    &a);
    if (s != ARL_OK) goto out;
    bind_member(a, group_id, slot, attempt, traj_uid, shard_id, traj_id);
    sqlite3_bind_text(a, 7, status, -1, SQLITE_STATIC);
    int rc = sqlite3_step(a);
    if (rc != SQLITE_DONE) {
        s = rdb_fail(c, rc, "mirroring a group member");
        goto out;
    }
    /* A group is final when the latest attempt of every slot is final (section 4.4). */
    s = rdb_prepare(
        c,
        "UPDATE task_groups SET status = 'final' WHERE group_id = ?1 AND status = 'open' "
        "AND size = (SELECT count(*) FROM group_members m WHERE m.group_id = ?1 AND "
        "m.status != 'running' AND m.attempt = (SELECT max(attempt) FROM group_members "
        "x WHERE x.group_id = ?1 AND x.slot = m.slot))",
        &b);
    if (s != ARL_OK) goto out;
    sqlite3_bind_int64(b, 1, group_id);
    rc = sqlite3_step(b);
    if (rc != SQLITE_DONE) s = rdb_fail(c, rc, "updating a group's status");
out:
    sqlite3_finalize(a);
    sqlite3_finalize(b);
    return rdb_end(c, s);
}

void rcat_member_mirror(replay_store *st, int64_t group_id, int32_t slot, int32_t attempt,
                        const char *traj_uid, int32_t shard_id, int64_t traj_id,
                        const char *status) {
    if (!st->cat.db || st->cat.readonly) return;
    arl_status s = member_mirror(st, group_id, slot, attempt, traj_uid, shard_id, traj_id, status);
    if (s != ARL_OK) /* the shard is the source of truth; the mirror is rebuilt at reconcile */
        arl_log_warn("%s (the catalog mirror is rebuilt by replay_catalog_reconcile)",
                     arl_error_msg());
}

arl_status rcat_member_claim(replay_store *st, int64_t group_id, int32_t slot, int32_t attempt,
                             const char *traj_uid, int32_t shard_id, int64_t traj_id) {
    if (!st->cat.db || st->cat.readonly) return ARL_OK;
    rdb *c = &st->cat;
    sqlite3_stmt *a = NULL, *b = NULL;
    ARL_TRY(rdb_begin(c));
    /* a new member, or one of this very shard (its writer restarted): claimed; this trajectory
     * of another shard stays as it is (another member that held the key is replaced, as the
     * mirror does) */
    arl_status s =
        rdb_prepare(c,
                    "INSERT INTO group_members(group_id, slot, attempt, traj_uid, shard_id, "
                    "traj_id, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running') "
                    "ON CONFLICT(group_id, slot, attempt) DO UPDATE SET "
                    "traj_uid = excluded.traj_uid, traj_id = excluded.traj_id, "
                    "status = excluded.status, shard_id = excluded.shard_id WHERE "
                    "group_members.shard_id = excluded.shard_id OR group_members.traj_uid != "
                    "excluded.traj_uid",
                    &a);
    if (s != ARL_OK) goto out;
    bind_member(a, group_id, slot, attempt, traj_uid, shard_id, traj_id);
    int rc = sqlite3_step(a);
    if (rc != SQLITE_DONE) {
        s = rdb_fail(c, rc, "claiming a group member");
        goto out;
    }
    if (sqlite3_changes(c->db) > 0) goto out;
    if ((s = rdb_prepare(c,
                         "SELECT shard_id, traj_uid, status FROM group_members WHERE group_id = "
                         "?1 AND slot = ?2 AND attempt = ?3",
                         &b)) != ARL_OK)
        goto out;
    sqlite3_bind_int64(b, 1, group_id);
    sqlite3_bind_int(b, 2, slot);
    sqlite3_bind_int(b, 3, attempt);
    rc = sqlite3_step(b);
    if (rc == SQLITE_ROW)
        s = arl_errorf(ARL_ERR_BUSY,
                       "replay: %s: trajectory %s is shard %d's (%s, %s): another writer of the "
                       "run samples it",
                       st->root, traj_uid, sqlite3_column_int(b, 0),
                       (const char *)sqlite3_column_text(b, 1),
                       (const char *)sqlite3_column_text(b, 2));
    else
        s = rdb_fail(c, rc, "reading a group member");
out:
    sqlite3_finalize(a);
    sqlite3_finalize(b);
    return rdb_end(c, s);
}

arl_status replay_catalog_reconcile(replay_store *st) {
    ARL_TRY(need_catalog(st, 1));
    ARL_TRY(replay_store_refresh(st));
    for (size_t i = 0; i < st->n_shards; i++) {
        rshard *sh = &st->shards[i];
        if (sh->kind == REPLAY_FILE_LEARNER) continue;
        rdb *d;
        ARL_TRY(rstore_shard_db(st, sh, &d));
        sqlite3_stmt *s;
        ARL_TRY(rdb_prepare(d,
                            "SELECT group_id, slot, attempt, traj_uid, traj_id, status FROM "
                            "trajectories ORDER BY traj_id",
                            &s));
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            arl_status e = member_mirror(
                st, sqlite3_column_int64(s, 0), sqlite3_column_int(s, 1), sqlite3_column_int(s, 2),
                (const char *)sqlite3_column_text(s, 3), sh->shard_id, sqlite3_column_int64(s, 4),
                (const char *)sqlite3_column_text(s, 5));
            if (e != ARL_OK) {
                sqlite3_finalize(s);
                return e;
            }
        }
        sqlite3_finalize(s);
        if (rc != SQLITE_DONE) return rdb_fail(d, rc, "reading trajectories");
    }
    return ARL_OK;
}

/* ---- display lookups ---- */

/* The first (and second) column of sql's row for id, copied into buf (buf2); *found 0 and ""
 * when there is no such row or no catalog.  A failed query (out of memory, an I/O error, a
 * damaged catalog) is an error, never taken for a missing row: a caller would show or export a
 * stand-in as if it were the name. */
static arl_status lookup_text(replay_store *st, const char *sql, int64_t id, char *buf, size_t cap,
                              char *buf2, size_t cap2, int *found) {
    *found = 0;
    if (cap) buf[0] = 0;
    if (cap2) buf2[0] = 0;
    if (!st->cat.db) return ARL_OK;
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(&st->cat, sql, &s));
    sqlite3_bind_int64(s, 1, id);
    int rc = sqlite3_step(s);
    arl_status r = ARL_OK;
    if (rc == SQLITE_ROW) {
        for (int i = 0; i < (buf2 ? 2 : 1) && r == ARL_OK; i++) {
            /* NULL from a non-NULL column: its conversion to text ran out of memory */
            if (!sqlite3_column_text(s, i) && sqlite3_column_type(s, i) != SQLITE_NULL)
                r = rdb_fail(&st->cat, SQLITE_NOMEM, "reading a name");
        }
        if (r == ARL_OK) {
            rdb_col_text(s, 0, buf, cap);
            if (buf2) rdb_col_text(s, 1, buf2, cap2);
            *found = 1;
        }
    } else if (rc != SQLITE_DONE) {
        r = rdb_fail(&st->cat, rc, "reading a name");
    }
    sqlite3_finalize(s);
    return r;
}

/* A row the catalog lacks (a store without a catalog, a shard copied from another store) is
 * shown by its id: "run#3". */
arl_status rcat_run_uid(replay_store *st, int64_t run_id, char *buf, size_t cap) {
    int found;
    ARL_TRY(lookup_text(st, "SELECT run_uid FROM runs WHERE run_id = ?1", run_id, buf, cap, NULL, 0,
                        &found));
    if (!buf[0]) snprintf(buf, cap, "run#%lld", (long long)run_id);
    return ARL_OK;
}

arl_status rcat_group_uid(replay_store *st, int64_t group_id, char *buf, size_t cap) {
    int found;
    ARL_TRY(lookup_text(st, "SELECT group_uid FROM task_groups WHERE group_id = ?1", group_id, buf,
                        cap, NULL, 0, &found));
    if (!buf[0]) snprintf(buf, cap, "group#%lld", (long long)group_id);
    return ARL_OK;
}

arl_status rcat_env_name(replay_store *st, int64_t env_id, char *name, size_t ncap, char *version,
                         size_t vcap) {
    int found;
    ARL_TRY(lookup_text(st, "SELECT name, version FROM envs WHERE env_id = ?1", env_id, name, ncap,
                        version, vcap, &found));
    if (!name[0]) snprintf(name, ncap, "env#%lld", (long long)env_id);
    return ARL_OK;
}

arl_status rcat_task_uid(replay_store *st, int64_t task_id, char *buf, size_t cap) {
    int found;
    ARL_TRY(lookup_text(st, "SELECT task_uid FROM tasks WHERE task_id = ?1", task_id, buf, cap,
                        NULL, 0, &found));
    if (!buf[0]) snprintf(buf, cap, "task#%lld", (long long)task_id);
    return ARL_OK;
}
