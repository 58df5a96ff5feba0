/* cli/cmd_replay_admin.c: the maintenance commands of spec/replay.md section 13.8 that change a
 * store's catalog or states without the policy model:
 *   agentrl replay pin DB TRAJ [--reason TEXT]    pin a trajectory (catalog pins)
 *   agentrl replay unpin DB TRAJ                  remove the pin
 *   agentrl replay gc DB [--rollout last|all|off] [--budget-bytes N] [--min-age-ms N]
 *                                                 states garbage collection and retention
 *   agentrl replay seal DB [--shard ID]           seal finished shard files
 *   agentrl replay migrate DB                     migrate every file to this build's schema
 * The work is in replay/replay.h; exit codes: 0 ok, 1 failure, 2 usage error. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "replay/inspect.h"

typedef struct admin_opts {
    char *db, *traj, *reason;
    char *rollout;
    char *learner;
    int64_t budget_bytes, min_age_ms;
} admin_opts;

#define A(f) offsetof(admin_opts, f)
#define A_DB                                                                                       \
    {                                                                                              \
        "db", ARL_OPT_STRING, A(db), NULL, "store root", 0, 0, NULL,                               \
            ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"                                            \
    }
#define A_TRAJ                                                                                     \
    {                                                                                              \
        "traj", ARL_OPT_STRING, A(traj), NULL, "trajectory (traj_uid or traj_id)", 0, 0, NULL,     \
            ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "TRAJ"                                          \
    }

static const arl_option pin_tab[] = {
    A_DB,
    A_TRAJ,
    {"reason", ARL_OPT_STRING, A(reason), "",
     "why it is pinned (shown by show and list --json): one line of UTF-8 text, at most 1000 "
     "bytes",
     0, 0, NULL, 0, "TEXT"},
};

/* The end of the summary lines of gc, seal and migrate: ", M skipped (why)[, K missing]". */
static void print_skipped(int64_t skipped, const char *why, int64_t missing) {
    printf(", %lld skipped (%s)", (long long)skipped, why);
    if (missing) printf(", %lld missing", (long long)missing);
    printf("\n");
}

static int with_store(const char *db, replay_store **st) {
    replay_open_opts oo = {.flags = 0};
    arl_status s = replay_store_open(db, &oo, st);
    return s == ARL_OK ? 0 : cli_fail(s);
}

int cmd_replay_pin(int argc, char **argv) {
    admin_opts o;
    memset(&o, 0, sizeof o);
    const size_t n = ARL_OPTIONS_COUNT(pin_tab);
    int rc = cli_parse(pin_tab, n, argc, argv, &o, "agentrl replay pin DB TRAJ [--reason TEXT]",
                       "Pin a trajectory in the store's catalog: it keeps its cached states and "
                       "routes under every retention rule ('list --pinned' shows the pinned).");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    replay_store *st = NULL;
    if (!(rc = with_store(o.db, &st))) {
        arl_status s = replay_pin(st, o.traj, o.reason);
        rc = s == ARL_OK ? ARL_EXIT_OK : cli_fail(s);
        if (!rc) printf("pinned %s\n", o.traj);
    }
    replay_store_close(st);
    arl_options_free(pin_tab, n, &o);
    return rc;
}

static const arl_option unpin_tab[] = {A_DB, A_TRAJ};

int cmd_replay_unpin(int argc, char **argv) {
    admin_opts o;
    memset(&o, 0, sizeof o);
    const size_t n = ARL_OPTIONS_COUNT(unpin_tab);
    int rc = cli_parse(unpin_tab, n, argc, argv, &o, "agentrl replay unpin DB TRAJ",
                       "Remove a trajectory's pin (an error if it is not pinned).");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    replay_store *st = NULL;
    if (!(rc = with_store(o.db, &st))) {
        arl_status s = replay_unpin(st, o.traj);
        rc = s == ARL_OK ? ARL_EXIT_OK : cli_fail(s);
        if (!rc) printf("unpinned %s\n", o.traj);
    }
    replay_store_close(st);
    arl_options_free(unpin_tab, n, &o);
    return rc;
}

static const arl_option gc_tab[] = {
    A_DB,
    {"rollout", ARL_OPT_CHOICE, A(rollout), "last",
     "state_cache.rollout: keep the newest boundary of running trajectories (last), every "
     "boundary (all) or nothing (off); pinned trajectories keep everything",
     0, 0, "last|all|off", 0, NULL},
    {"learner", ARL_OPT_CHOICE, A(learner), "off",
     "state_cache.learner, in learner files: which consumed trajectories keep learner states: "
     "none (off), the pinned ones (pinned) or all (all)",
     0, 0, "off|pinned|all", 0, NULL},
    {"budget-bytes", ARL_OPT_INT, A(budget_bytes), "274877906944",
     "state_cache.budget_bytes per states file: evict the least recently used states beyond it "
     "(0: no budget)",
     0, 9.0e18, NULL, 0, "N"},
    {"min-age-ms", ARL_OPT_INT, A(min_age_ms), "3600000",
     "delete unfinished and unreferenced states older than this", 0, 9.0e18, NULL, 0, "MS"},
};

int cmd_replay_gc(int argc, char **argv) {
    admin_opts o;
    memset(&o, 0, sizeof o);
    const size_t n = ARL_OPTIONS_COUNT(gc_tab);
    int rc = cli_parse(
        gc_tab, n, argc, argv, &o,
        "agentrl replay gc DB [--rollout last|all|off] [--learner off|pinned|all] "
        "[--budget-bytes N] [--min-age-ms MS]",
        "Garbage-collect the cached states of every shard whose writer is gone: delete "
        "unfinished and unreferenced states, evict states by the retention rule and the byte "
        "budget (evicted states leave a tombstone row; a later use is a cache miss). Sealed "
        "shards are not written, their states files are collected. A file that fails is "
        "reported and the others are still collected (exit 1).");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    replay_store *st = NULL;
    if (!(rc = with_store(o.db, &st))) {
        replay_retention r = {.rollout = o.rollout,
                              .learner = o.learner,
                              .budget_bytes = o.budget_bytes,
                              .min_age_ms = o.min_age_ms};
        replay_gc_stats t;
        arl_status s = replay_gc(st, &r, stdout, &t);
        rc = s == ARL_OK ? ARL_EXIT_OK : cli_fail(s);
        if (!rc) {
            printf("gc %s: %lld states deleted, %lld evicted, %lld bytes freed; %lld file%s "
                   "collected",
                   o.db, (long long)t.deleted, (long long)t.evicted, (long long)t.bytes_freed,
                   (long long)t.files, t.files == 1 ? "" : "s");
            print_skipped(t.skipped, "writer alive", t.missing);
        }
    }
    replay_store_close(st);
    arl_options_free(gc_tab, n, &o);
    return rc;
}

typedef struct seal_opts {
    char *db;
    int64_t shard;
} seal_opts;

static const arl_option seal_tab[] = {
    {"db", ARL_OPT_STRING, offsetof(seal_opts, db), NULL, "store root", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"},
    {"shard", ARL_OPT_INT, offsetof(seal_opts, shard), "0", "only this shard id (0: every shard)",
     0, 8388607, NULL, 0, "ID"},
};

int cmd_replay_seal(int argc, char **argv) {
    seal_opts o;
    memset(&o, 0, sizeof o);
    const size_t n = ARL_OPTIONS_COUNT(seal_tab);
    int rc = cli_parse(seal_tab, n, argc, argv, &o, "agentrl replay seal DB [--shard ID]",
                       "Seal the shard files whose writer is finished (lock free, no running "
                       "trajectory): final checkpoint, rollback-journal mode, meta.sealed = 1. "
                       "Sealed files are immutable and can be copied and opened read-only "
                       "anywhere; files with a live writer are skipped. A file that cannot be "
                       "sealed (running trajectories) is reported and the others are still "
                       "sealed (exit 1). Run again, it finishes a seal that was interrupted.");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    replay_store *st = NULL;
    if (!(rc = with_store(o.db, &st))) {
        replay_admin_stats k;
        arl_status s = replay_seal(st, (int32_t)o.shard, stdout, &k);
        rc = s == ARL_OK ? ARL_EXIT_OK : cli_fail(s);
        if (!rc) {
            printf("sealed %lld file%s of %s", (long long)k.files, k.files == 1 ? "" : "s", o.db);
            print_skipped(k.skipped, "in use", k.missing);
        }
    }
    replay_store_close(st);
    arl_options_free(seal_tab, n, &o);
    return rc;
}

typedef struct migrate_opts {
    char *db;
    int64_t backup_limit;
} migrate_opts;

static const arl_option migrate_tab[] = {
    {"db", ARL_OPT_STRING, offsetof(migrate_opts, db), NULL, "store root", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"},
    {"backup-limit-bytes", ARL_OPT_INT, offsetof(migrate_opts, backup_limit), "1073741824",
     "copy a file to '<file>.pre-v<N>' before migrating it when it is at most this size (a "
     "larger one is migrated without a backup, with a warning; 0: no backups, -1: every file)",
     -1, 9.2e18, NULL, 0, "BYTES"},
};

int cmd_replay_migrate(int argc, char **argv) {
    migrate_opts o;
    memset(&o, 0, sizeof o);
    const size_t n = ARL_OPTIONS_COUNT(migrate_tab);
    int rc = cli_parse(migrate_tab, n, argc, argv, &o,
                       "agentrl replay migrate DB [--backup-limit-bytes BYTES]",
                       "Migrate every file of the store to this build's schema version (a backup "
                       "'<file>.pre-v<N>' first, up to the backup size limit): the catalog at "
                       "open, sealed files under their "
                       "lock (they stay sealed), the others through their writer; files with a "
                       "live writer are skipped (it migrates them at its next open). A file that "
                       "fails is reported and the others are still migrated (exit 1); so is a "
                       "shard the catalog registers whose file is missing, when the catalog has "
                       "trajectories in it (gc and seal as well).");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    replay_backup_limit_set(o.backup_limit); /* (before the open: the catalog migrates then) */
    replay_store *st = NULL;
    if (!(rc = with_store(o.db, &st))) {
        replay_admin_stats k;
        arl_status s = replay_migrate(st, stdout, &k);
        rc = s == ARL_OK ? ARL_EXIT_OK : cli_fail(s);
        if (!rc) {
            printf("migrated %lld file%s of %s", (long long)k.files, k.files == 1 ? "" : "s", o.db);
            print_skipped(k.skipped, "in use", k.missing);
        }
    }
    replay_store_close(st);
    arl_options_free(migrate_tab, n, &o);
    return rc;
}
