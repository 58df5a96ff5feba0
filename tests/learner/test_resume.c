/* tests/learner/test_resume.c: `agentrl train` killed with SIGKILL at a random point and
 * resumed with --resume ends bit-identical to an uninterrupted run (CPU, one process, one
 * thread), and every task is trained on exactly once (experiments/train.h, "Exactness and
 * resume").  A micro experiment (tiny model, SFT warm start of two steps, two updates of two
 * tasks x two samples, one held-out episode) keeps each run to seconds; the kill lands anywhere
 * from the SFT stage to the final report.  The random delay is printed (and can be fixed with
 * ARL_TEST_KILL_MS) so that a failure can be replayed.  A second process started in a running
 * run's directory is refused (core/dirlock.h) and disturbs nothing; a damaged newest
 * checkpoint is set aside and the run resumes from the one before it; SIGTERM and a failed
 * write print how to continue; a resume with another thread count warns; a run with
 * Monte-Carlo segment baselines killed while its forks run resumes bit-identical too. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/test.h"

static char tmp[512], exp_path[700];

static const char *micro =
    "{\n"
    "  \"model\": \"tiny\", \"steps\": 2, \"tasks-per-update\": 2, \"threads\": 1,\n"
    "  \"eval-tasks\": 1, \"sft-demos\": 4, \"checkpoint-interval\": 1,\n"
    "  \"rollout\": {\"env\": \"builtin:calculator\", \"task-data\": {\"level\": 1},\n"
    "              \"group-size\": 2, \"turn-tokens\": 32, \"observation-tokens\": 512,\n"
    "              \"segment-tokens\": 700, \"context-tokens\": 2048, \"trajectory-tokens\": "
    "2048,\n"
    "              \"max-turns\": 2, \"batch-size\": 4, \"prefill-chunk\": 1024, \"progress-s\": "
    "0},\n"
    "  \"learner\": {\"minibatches\": 2, \"max-tokens\": 1024, \"lr\": 1e-4},\n"
    "  \"sft\": {\"steps\": 2, \"batch-tokens\": 1024, \"shared-prefix\": true}\n"
    "}\n";

/* micro with Monte-Carlo segment baselines: more turns, so that trajectories cross segment
 * boundaries and get forks */
static const char *micro_mc =
    "{\n"
    "  \"model\": \"tiny\", \"steps\": 2, \"tasks-per-update\": 2, \"threads\": 1,\n"
    "  \"eval-tasks\": 1, \"sft-demos\": 4, \"checkpoint-interval\": 1,\n"
    "  \"rollout\": {\"env\": \"builtin:calculator\", \"task-data\": {\"level\": 1},\n"
    "              \"group-size\": 2, \"turn-tokens\": 32, \"observation-tokens\": 600,\n"
    "              \"segment-tokens\": 700, \"context-tokens\": 2048, \"trajectory-tokens\": "
    "2048,\n"
    "              \"max-turns\": 3, \"batch-size\": 4, \"prefill-chunk\": 1024, \"progress-s\": "
    "0},\n"
    "  \"learner\": {\"minibatches\": 2, \"max-tokens\": 1024, \"lr\": 1e-4,\n"
    "              \"segment-baseline\": \"mc\", \"mc-forks\": 1},\n"
    "  \"sft\": {\"steps\": 2, \"batch-tokens\": 1024, \"shared-prefix\": true}\n"
    "}\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether $ARL_BIN names the agentrl binary the tests run (else they skip, saying so). */
static int have_bin(void) {
    if (getenv("ARL_BIN")) return 1;
    fprintf(stderr, "SKIP: ARL_BIN (the agentrl binary) is not set\n");
    return 0;
}

/* Start `agentrl train EXP --set out=OUT [--resume]` with output to OUT<log>, appended. */
static pid_t start_logged(const char *out, int resume, const char *log) {
    const char *bin = getenv("ARL_BIN");
    char setout[800], logp[800];
    snprintf(setout, sizeof setout, "out=%s", out);
    snprintf(logp, sizeof logp, "%s%s", out, log);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(logp, "a", stderr);
        (void)f;
        if (resume)
            execl(bin, bin, "train", exp_path, "--set", setout, "--set", "progress=plain",
                  "--resume", (char *)NULL);
        else
            execl(bin, bin, "train", exp_path, "--set", setout, "--set", "progress=plain",
                  (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* start_logged with output to OUT.log */
static pid_t start(const char *out, int resume) {
    return start_logged(out, resume, ".log");
}

static int wait_exit(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

/* The log OUT<log> of a run (start_logged) into buf (cap bytes, NUL-terminated; empty when it
 * cannot be read); returns buf. */
static char *read_log(const char *out, const char *log, char *buf, size_t cap) {
    char p[900];
    snprintf(p, sizeof p, "%s%s", out, log);
    FILE *f = fopen(p, "r");
    size_t n = 0;
    if (f) {
        n = fread(buf, 1, cap - 1, f);
        fclose(f);
    }
    buf[n] = 0;
    return buf;
}

/* The end state of run b (final weights and moments, reference, held-out results) is that of
 * run a, bit for bit. */
static void same_end_state(const char *a, const char *b) {
    static const char *files[] = {"checkpoints/step-00000004/model.safetensors",
                                  "checkpoints/step-00000004/optimizer.safetensors",
                                  "reference/model.safetensors", "eval.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char pa[900], pb[900];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        CHECK_MSG(files_equal(pa, pb), "%s: %s differs from %s", files[i], b, a);
    }
}

/* Seeds of the tasks update n consumed, from its store's ledger; returns the count. */
static int consumed_seeds(const char *out, int n, long long *seeds, int cap, int *n_committed) {
    char p[900];
    snprintf(p, sizeof p, "%s/replay/u%06d/r0/catalog.sqlite", out, n);
    sqlite3 *db = NULL;
    int k = 0;
    *n_committed = 0;
    if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return -1;
    }
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT t.seed FROM updates u JOIN update_groups ug ON ug.run_id = "
            "u.run_id AND ug.update_n = u.update_n JOIN task_groups g ON g.group_id = "
            "ug.group_id JOIN tasks t ON t.task_id = g.task_id WHERE u.status = "
            "'committed' AND u.update_n = ?1 AND g.status = 'consumed' AND "
            "g.consumed_update = ?1 ORDER BY t.seed",
            -1, &q, NULL) == SQLITE_OK) {
        sqlite3_bind_int(q, 1, n);
        while (sqlite3_step(q) == SQLITE_ROW && k < cap)
            seeds[k++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM updates WHERE status = 'committed'", -1, &q,
                           NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        *n_committed = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return k;
}

/* The "step" values of a metrics file, in order. */
static int metric_steps(const char *out, int *steps, int cap) {
    char p[900], line[65536];
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    FILE *f = fopen(p, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f) && n < cap) {
        const char *s = strstr(line, "\"step\":");
        if (s) steps[n++] = atoi(s + 7);
    }
    if (f) fclose(f);
    return n;
}

/* The uninterrupted run's folder into a (cap bytes), made if no case before made it (the first,
 * test_kill_resume, does). */
static void uninterrupted(char *a, size_t cap) {
    snprintf(a, cap, "%s/uninterrupted", tmp);
    struct stat sb;
    if (stat(a, &sb)) CHECK_EQ_INT(wait_exit(start(a, 0)), 0);
}

/* The learner_records of update n of OUT (every learner file of its store): *total rows and
 * *distinct (traj, segment) keys; returns the sum of their seg_mean_logratio (a digest). */
static double update_records(const char *out, int n, int64_t *total, int64_t *distinct) {
    char dir[900], p[1200];
    snprintf(dir, sizeof dir, "%s/replay/u%06d/r0/shards", out, n);
    *total = *distinct = 0;
    sqlite3 *db = NULL;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) return NAN;
    char sql[8192] = "";
    size_t len = 0;
    int k = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        const size_t m = strlen(e->d_name);
        if (e->d_name[0] != 'l' || m < 8 || strcmp(e->d_name + m - 7, ".sqlite") ||
            strstr(e->d_name, ".states"))
            continue;
        snprintf(p, sizeof p, "ATTACH '%s/%s' AS l%d", dir, e->d_name, k);
        if (sqlite3_exec(db, p, NULL, NULL, NULL) != SQLITE_OK) continue;
        len += (size_t)snprintf(sql + len, sizeof sql - len,
                                "%sSELECT traj_uid, seg_index, seg_mean_logratio FROM "
                                "l%d.learner_records",
                                k ? " UNION ALL " : "", k);
        k++;
    }
    if (d) closedir(d);
    double sum = NAN;
    char q[8400];
    snprintf(q, sizeof q,
             "SELECT count(*), count(DISTINCT traj_uid || '/' || seg_index), "
             "sum(seg_mean_logratio) FROM (%s)",
             sql);
    sqlite3_stmt *st = NULL;
    if (k > 0 && sqlite3_prepare_v2(db, q, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        *total = sqlite3_column_int64(st, 0);
        *distinct = sqlite3_column_int64(st, 1);
        sum = sqlite3_column_double(st, 2);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return sum;
}

static void test_kill_resume(void) {
    if (!have_bin()) return;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/uninterrupted", tmp);
    snprintf(b, sizeof b, "%s/killed", tmp);
    const double t0 = now_s();
    CHECK_EQ_INT(wait_exit(start(a, 0)), 0);
    const double ta = now_s() - t0;
    /* the kill: anywhere in the first 90% of an uninterrupted run's time */
    long kill_ms;
    if (getenv("ARL_TEST_KILL_MS")) {
        kill_ms = atol(getenv("ARL_TEST_KILL_MS"));
    } else {
        srand((unsigned)time(NULL) ^ (unsigned)getpid());
        kill_ms = (long)(1000.0 * ta * (0.02 + 0.88 * (double)rand() / RAND_MAX));
    }
    fprintf(stderr,
            "  uninterrupted run %.1f s; killing the second run after %ld ms "
            "(ARL_TEST_KILL_MS=%ld replays it)\n",
            ta, kill_ms, kill_ms);
    pid_t pid = start(b, 0);
    struct timespec ts = {kill_ms / 1000, (kill_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int rc = wait_exit(pid);
    fprintf(stderr, "  killed run exited with %d\n", rc);
    CHECK_EQ_INT(wait_exit(start(b, 1)), 0);
    same_end_state(a, b);
    /* the learner_records: those of the uninterrupted run, once each (an update re-run after
     * the kill replaces its rows in the same learner file) */
    for (int n = 0; n < 2; n++) {
        int64_t ta_, da, tb, dbn;
        const double sa = update_records(a, n, &ta_, &da), sb = update_records(b, n, &tb, &dbn);
        CHECK_MSG(ta_ > 0 && ta_ == da && tb == ta_ && dbn == tb && sa == sb,
                  "update %d: records %lld (%lld distinct, sum %.17g) uninterrupted, %lld (%lld, "
                  "%.17g) resumed",
                  n, (long long)ta_, (long long)da, sa, (long long)tb, (long long)dbn, sb);
    }
    /* every task once: update n consumed exactly the tasks with seeds 2n and 2n + 1 */
    for (int n = 0; n < 2; n++) {
        long long seeds[8];
        int nc = 0;
        int k = consumed_seeds(b, n, seeds, 8, &nc);
        CHECK_EQ_INT(k, 2);
        CHECK_EQ_INT(nc, 1);
        if (k == 2) {
            CHECK_EQ_INT(seeds[0], 2 * n);
            CHECK_EQ_INT(seeds[1], 2 * n + 1);
        }
    }
    int steps[16];
    int ns = metric_steps(b, steps, 16);
    CHECK_EQ_INT(ns, 2);
    for (int i = 0; i < ns; i++)
        CHECK_EQ_INT(steps[i], i);
}

/* The holder's pid from OUT/run.lock once it is there (the lock is taken, core/dirlock.h), or -1
 * after 30 s. */
static long lock_pid(const char *out) {
    char p[900];
    snprintf(p, sizeof p, "%s/run.lock", out);
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen(p, "r");
        long pid = -1;
        if (f) {
            if (fscanf(f, "%ld", &pid) != 1) pid = -1;
            fclose(f);
        }
        if (pid > 0) return pid;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* A second process in a running run's directory (`--resume` while it runs) is refused at once
 * with the holder's pid, writes nothing, and the running one ends as an uninterrupted run does
 * (the same bits); once it has ended, --resume finds the run finished. */
static void test_second_process_refused(void) {
    if (!have_bin()) return;
    char a[600], c[600];
    uninterrupted(a, sizeof a);
    snprintf(c, sizeof c, "%s/busy", tmp);
    pid_t first = start(c, 0);
    const long holder = lock_pid(c);
    CHECK_EQ_INT(holder, first);
    CHECK_EQ_INT(wait_exit(start_logged(c, 1, ".second.log")), 1);
    char msg[120];
    snprintf(msg, sizeof msg, "is in use by another process (pid %ld)", (long)first);
    static char buf[1 << 16]; /* the refused run's own log */
    read_log(c, ".second.log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, msg) != NULL, "the refused run's output: %s", buf);
    CHECK_EQ_INT(wait_exit(first), 0);
    same_end_state(a, c);
    int steps[16];
    CHECK_EQ_INT(metric_steps(c, steps, 16), 2);
    CHECK_EQ_INT(wait_exit(start(c, 1)), 0); /* free again: the finished run resumes to its end */
}

/* The log of run OUT (OUT.log) holds the line head, then the command that continues the run
 * (the binary as it was started, $ARL_BIN, with its own arguments and --resume), and needle
 * when not NULL. */
static void log_has_note(const char *out, const char *head, const char *needle) {
    static char buf[1 << 16];
    char want[2800];
    const size_t n = strlen(read_log(out, ".log", buf, sizeof buf));
    snprintf(want, sizeof want, "%s\n  %s train %s --set out=%s --set progress=plain --resume\n",
             head, getenv("ARL_BIN"), exp_path, out);
    CHECK_MSG(strstr(buf, want) && (!needle || strstr(buf, needle)), "log ends: %s",
              n > 600 ? buf + n - 600 : buf);
}

/* SIGTERM (or SIGINT) to a running `agentrl train`: it says it was interrupted and how to
 * continue (its own arguments with --resume), then ends by the signal as before (143). */
static void test_interrupt_note(void) {
    if (!have_bin()) return;
    char g[600];
    snprintf(g, sizeof g, "%s/interrupted", tmp);
    pid_t pid = start(g, 0);
    CHECK_EQ_INT(lock_pid(g), pid); /* running (the note is set before the lock is taken) */
    kill(pid, SIGTERM);
    CHECK_EQ_INT(wait_exit(pid), 128 + SIGTERM);
    log_has_note(
        g, "agentrl: interrupted: train stops here; what it saved stays. Continue with:", NULL);
}

/* A run in new directory OUT with a file where policy/ goes (OUT/policy, path into p): it makes
 * its SFT stage and reference, then fails writing the first policy version (exit 1 checked). */
static void stop_before_policy(const char *out, char *p, size_t cap) {
    CHECK(mkdir(out, 0755) == 0);
    snprintf(p, cap, "%s/policy", out);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK_EQ_INT(wait_exit(start(out, 0)), 1);
}

/* A run stopped by an I/O error (a file where the run's policy/ folder goes: the first policy
 * version, after the SFT stage, cannot be saved) says that what it saved stays and prints the
 * command that continues it; that command, once the file is gone, ends bit-identical to the
 * uninterrupted run. */
static void test_failure_note(void) {
    if (!have_bin()) return;
    char a[600], g[600], p[900];
    uninterrupted(a, sizeof a);
    snprintf(g, sizeof g, "%s/failed-write", tmp);
    struct stat sb;
    stop_before_policy(g, p, sizeof p);
    log_has_note(g,
                 "agentrl: train stopped; what it saved stays. Once the cause above is dealt "
                 "with, continue with:",
                 "policy: not a directory");
    snprintf(p, sizeof p, "%s/sft/checkpoints", g);
    CHECK(stat(p, &sb) == 0); /* the SFT stage was saved before */
    snprintf(p, sizeof p, "%s/policy", g);
    CHECK(unlink(p) == 0);
    CHECK_EQ_INT(wait_exit(start(g, 1)), 0);
    same_end_state(a, g);
}

/* A finished run whose newest checkpoint is damaged (its optimizer file cut short) resumes from
 * the one before it: the damaged one is moved to damaged-step-00000004, the last update is done
 * again from its stored rollouts (the ledger had committed it), and the run ends bit-identical
 * to the uninterrupted one, each task consumed once. */
static void test_damaged_checkpoint(void) {
    if (!have_bin()) return;
    char a[600], e[600], cmd[1400], p[900];
    uninterrupted(a, sizeof a);
    snprintf(e, sizeof e, "%s/damaged", tmp);
    struct stat sb;
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && rm -f '%s/run.lock'", a, e, e);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000004/optimizer.safetensors", e);
    CHECK(truncate(p, 64) == 0);
    CHECK_EQ_INT(wait_exit(start(e, 1)), 0);
    snprintf(p, sizeof p, "%s/checkpoints/damaged-step-00000004", e);
    CHECK(stat(p, &sb) == 0);
    static char buf[1 << 16];
    read_log(e, ".log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, "is damaged") && strstr(buf, "resuming after update 1"), "log: %s", buf);
    same_end_state(a, e);
    for (int n = 0; n < 2; n++) {
        long long seeds[8];
        int nc = 0;
        CHECK_EQ_INT(consumed_seeds(e, n, seeds, 8, &nc), 2);
    }
}

/* --resume with another thread count than the checkpoint's: a warning that the run may not be
 * bit-identical (where the kernels' sums depend on their split), and the run goes on (a copy of
 * the finished run: nothing left to do). */
static void test_threads_warning(void) {
    if (!have_bin()) return;
    char a[600], e[600], cmd[2400];
    uninterrupted(a, sizeof a);
    snprintf(e, sizeof e, "%s/threads", tmp);
    snprintf(cmd, sizeof cmd,
             "cp -a '%s' '%s' && rm -f '%s/run.lock' && '%s' train '%s' --set out='%s' --set "
             "progress=plain --set threads=2 --resume > '%s.log' 2>&1",
             a, e, e, getenv("ARL_BIN"), exp_path, e, e);
    CHECK_EQ_INT(system(cmd), 0);
    static char buf[1 << 16];
    read_log(e, ".log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, "the checkpoint was written with threads = 1, this run uses 2"),
              "log: %s", buf);
}

/* Forks of kind 'fork' running in the catalog of OUT's first update store (-1: unreadable). */
static int running_forks(const char *out) {
    char p[900];
    snprintf(p, sizeof p, "%s/replay/u000000/r0/catalog.sqlite", out);
    sqlite3 *db = NULL;
    int n = -1;
    if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_stmt *q = NULL;
        if (sqlite3_prepare_v2(db,
                               "SELECT count(*) FROM task_groups g JOIN group_members m ON "
                               "m.group_id = g.group_id WHERE g.kind = 'fork' AND m.status = "
                               "'running'",
                               -1, &q, NULL) == SQLITE_OK &&
            sqlite3_step(q) == SQLITE_ROW)
            n = sqlite3_column_int(q, 0);
        sqlite3_finalize(q);
    }
    sqlite3_close(db);
    return n;
}

static int forks_running(const char *out) {
    return running_forks(out) > 0;
}

static int path_there(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Poll cond(arg) every step_ns nanoseconds for up to `seconds`: 1 once it holds, else 0. */
static int wait_until(int (*cond)(const char *), const char *arg, long step_ns, double seconds) {
    for (double waited = 0; waited < seconds; waited += (double)step_ns * 1e-9) {
        if (cond(arg)) return 1;
        struct timespec ts = {0, step_ns};
        nanosleep(&ts, NULL);
    }
    return cond(arg);
}

/* Run OUT (`start`), SIGKILL it once cond(arg) holds (polled every step_ns, 120 s at most),
 * then resume it to the end (exit 0 checked): 1 when cond was seen. */
static int kill_when_resume(const char *out, int (*cond)(const char *), const char *arg,
                            long step_ns) {
    pid_t pid = start(out, 0);
    const int seen = wait_until(cond, arg, step_ns, 120);
    kill(pid, SIGKILL);
    wait_exit(pid);
    CHECK_EQ_INT(wait_exit(start(out, 1)), 0);
    return seen;
}

/* The forks of OUT's first update store as "uid tokens status;" per fork in uid order, from its
 * tool files (shards/t<k>.sqlite), into buf; returns the number of forks. */
static int fork_digest(const char *out, char *buf, size_t cap) {
    size_t len = 0;
    int n = 0;
    buf[0] = 0;
    for (int k = 1; k < 64; k++) {
        char p[900];
        snprintf(p, sizeof p, "%s/replay/u000000/r0/shards/t%d.sqlite", out, k);
        struct stat sb;
        if (stat(p, &sb)) continue;
        sqlite3 *db = NULL;
        sqlite3_stmt *q = NULL;
        if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
            sqlite3_prepare_v2(db,
                               "SELECT traj_uid, n_tokens, status FROM trajectories WHERE "
                               "parent_traj_uid IS NOT NULL ORDER BY traj_uid",
                               -1, &q, NULL) == SQLITE_OK)
            while (sqlite3_step(q) == SQLITE_ROW && len + 300 < cap) {
                len += (size_t)snprintf(
                    buf + len, cap - len, "%s %lld %s;", (const char *)sqlite3_column_text(q, 0),
                    (long long)sqlite3_column_int64(q, 1), (const char *)sqlite3_column_text(q, 2));
                n++;
            }
        sqlite3_finalize(q);
        sqlite3_close(db);
    }
    return n;
}

/* An integer query over the SQLite file at path (-1 when it cannot be read). */
static int64_t sql_count(const char *path, const char *sql) {
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    int64_t n = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return n;
}

/* OUT's first update store after its forks: *forked receives the forks started and *cached
 * those started from a cached state (their "forked" events); returns the states left complete
 * (not evicted) in its states files. */
static int64_t mc_states(const char *out, int64_t *forked, int64_t *cached) {
    char dir[900], p[1200];
    snprintf(dir, sizeof dir, "%s/replay/u000000/r0/shards", out);
    *forked = *cached = 0;
    int64_t left = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t n = strlen(e->d_name);
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (n > 14 && !strcmp(e->d_name + n - 14, ".states.sqlite")) {
            left += sql_count(p, "SELECT count(*) FROM states WHERE status = 'complete'");
        } else if (e->d_name[0] == 't' && n > 7 && !strcmp(e->d_name + n - 7, ".sqlite")) {
            *forked += sql_count(p, "SELECT count(*) FROM trajectory_events WHERE kind = "
                                    "'forked' AND detail_json LIKE '%\"state\":%'");
            *cached += sql_count(p, "SELECT count(*) FROM trajectory_events WHERE kind = "
                                    "'forked' AND detail_json LIKE '%\"state\":\"cached\"%'");
        }
    }
    closedir(d);
    return left;
}

/* Monte-Carlo segment baselines (learner.segment-baseline mc): a run killed while the forks of
 * its first update run resumes to the uninterrupted run's bits: the update's store is set aside
 * and rolled out again with its forks (experiments/mc_forks.h), since forks continued or
 * replaced would sample other streams.  The forks start from the rollout's states, which are
 * evicted after them. */
static void test_kill_during_forks(void) {
    if (!have_bin()) return;
    char saved[700];
    snprintf(saved, sizeof saved, "%s", exp_path);
    snprintf(exp_path, sizeof exp_path, "%s/micro-mc.json", tmp);
    FILE *f = fopen(exp_path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(micro_mc, f);
    fclose(f);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/mc-uninterrupted", tmp);
    snprintf(b, sizeof b, "%s/mc-killed", tmp);
    CHECK_EQ_INT(wait_exit(start(a, 0)), 0);
    static char buf[1 << 16];
    CHECK_MSG(strstr(read_log(a, ".log", buf, sizeof buf), "forks at") != NULL, "log: %s", buf);
    /* the rollout kept its boundary states for the forks (state-cache 'last' in the
     * experiment): every fork started from one, and none is left after them */
    int64_t forked, cached;
    const int64_t left = mc_states(a, &forked, &cached);
    CHECK_MSG(forked > 0 && cached == forked, "%lld forks, %lld from cached states",
              (long long)forked, (long long)cached);
    CHECK_EQ_INT(left, 0);
    CHECK_MSG(kill_when_resume(b, forks_running, b, 5000000L), "no fork was seen running in %s",
              b);
    same_end_state(a, b);
    char aside[700];
    snprintf(aside, sizeof aside, "%s/replay/u000000/r0.interrupted-1", b);
    struct stat sb;
    CHECK_MSG(stat(aside, &sb) == 0, "%s was not set aside", aside);
    CHECK_MSG(strstr(read_log(b, ".log", buf, sizeof buf), "forks of an interrupted run") != NULL,
              "log: %s", buf);
    /* the same forks, token for token in count */
    static char fa[1 << 14], fb[1 << 14];
    CHECK(fork_digest(a, fa, sizeof fa) > 0);
    fork_digest(b, fb, sizeof fb);
    CHECK_MSG(!strcmp(fa, fb), "forks differ:\n  %s\n  %s", fa, fb);
    snprintf(exp_path, sizeof exp_path, "%s", saved);
}

/* SIGKILL the moment the first update's checkpoint appears (it lands between the checkpoint and
 * the ledger commit or just after): the resumed run ends bit-identical with one metrics line per
 * update - the line of an update is written before its checkpoint, so a resume from that
 * checkpoint keeps it (it was lost when the kill fell between the two). */
static void test_kill_at_checkpoint(void) {
    if (!have_bin()) return;
    char a[600], b[600], p[900];
    uninterrupted(a, sizeof a);
    snprintf(b, sizeof b, "%s/kill-at-checkpoint", tmp);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000002", b);
    CHECK_MSG(kill_when_resume(b, path_there, p, 50000L), "%s never appeared", p);
    same_end_state(a, b);
    int steps[16];
    const int ns = metric_steps(b, steps, 16);
    CHECK_EQ_INT(ns, 2);
    for (int i = 0; i < ns; i++)
        CHECK_EQ_INT(steps[i], i);
}

/* A finished run whose eval-after.outcomes is gone (a stop between eval-after.json and it, or
 * removed) and eval.json with it: the resume counts the arm again from its kept store, and
 * eval.json has its paired table again, as the uninterrupted run's.  Its metrics.jsonl with the
 * first line cut in the middle: the resume names the damaged line and keeps the file as it was
 * beside it. */
static void test_eval_outcomes_missing(void) {
    if (!have_bin()) return;
    char a[600], e[600], cmd[1400], p[900];
    uninterrupted(a, sizeof a);
    snprintf(e, sizeof e, "%s/no-outcomes", tmp);
    snprintf(cmd, sizeof cmd,
             "cp -a '%s' '%s' && rm -f '%s/run.lock' '%s/eval.json' "
             "'%s/eval-after.outcomes'",
             a, e, e, e, e);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "sed -i '1s/,\"kl.*//' '%s/metrics.jsonl'", e);
    CHECK_EQ_INT(system(cmd), 0);
    CHECK_EQ_INT(wait_exit(start(e, 1)), 0);
    same_end_state(a, e);
    static char buf[1 << 16];
    read_log(e, ".log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, "(the first: line 1) is no metrics line (damaged)") &&
                  strstr(buf, "has no line of 1 update before 2 (the first: update 0)"),
              "log: %s", buf);
    struct stat sb;
    snprintf(p, sizeof p, "%s/metrics.jsonl.damaged-1", e);
    CHECK(stat(p, &sb) == 0);
    char pa[900];
    snprintf(pa, sizeof pa, "%s/eval-after.outcomes", a);
    snprintf(p, sizeof p, "%s/eval-after.outcomes", e);
    CHECK_MSG(files_equal(pa, p), "%s differs from %s", p, pa);
}

/* The settings of a run stopped before its first training checkpoint (a file where policy/
 * goes: the SFT stage and the reference are made, no update): a --resume with another
 * rollout.temperature is refused naming it and leaves experiment.json as it was (the rollouts
 * and the reference were made with the saved settings); a run without --resume is refused in a
 * folder holding a reference; --resume with the saved settings goes on. */
static void test_settings_before_checkpoint(void) {
    if (!have_bin()) return;
    char g[600], p[900], snap[900], keep[900], cmd[2400];
    snprintf(g, sizeof g, "%s/settings", tmp);
    stop_before_policy(g, p, sizeof p);
    snprintf(snap, sizeof snap, "%s/experiment.json", g);
    snprintf(keep, sizeof keep, "%s/experiment.saved", tmp);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", snap, keep);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' train '%s' --set out='%s' --set rollout.temperature=0.5 --resume > "
             "'%s.changed.log' 2>&1",
             getenv("ARL_BIN"), exp_path, g, g);
    CHECK(system(cmd) != 0);
    static char buf[1 << 16];
    read_log(g, ".changed.log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, "has other settings (as saved -> as now): rollout.temperature 1 -> 0.5"),
              "log: %s", buf);
    CHECK_MSG(files_equal(snap, keep), "a refused resume changed %s", snap);
    /* a fresh run where one was interrupted before its first checkpoint (no SFT stage here) */
    char h[600];
    snprintf(h, sizeof h, "%s/settings-ref", tmp);
    snprintf(p, sizeof p, "%s/reference", h);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    CHECK_EQ_INT(system(cmd), 0);
    CHECK_EQ_INT(wait_exit(start(h, 0)), 1);
    read_log(h, ".log", buf, sizeof buf);
    CHECK_MSG(strstr(buf, "already holds a run") && strstr(buf, "/reference)"), "log: %s", buf);
    snprintf(p, sizeof p, "%s/policy", g);
    CHECK(unlink(p) == 0);
    CHECK_EQ_INT(wait_exit(start(g, 1)), 0);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-resume"));
    snprintf(exp_path, sizeof exp_path, "%s/micro.json", tmp);
    FILE *f = fopen(exp_path, "w");
    if (!f) return 1;
    fputs(micro, f);
    fclose(f);
    TEST_RUN(test_kill_resume);
    TEST_RUN(test_second_process_refused);
    TEST_RUN(test_damaged_checkpoint);
    TEST_RUN(test_interrupt_note);
    TEST_RUN(test_failure_note);
    TEST_RUN(test_threads_warning);
    TEST_RUN(test_kill_during_forks);
    TEST_RUN(test_kill_at_checkpoint);
    TEST_RUN(test_eval_outcomes_missing);
    TEST_RUN(test_settings_before_checkpoint);
    return test_finish();
}
