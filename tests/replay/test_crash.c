/* Crash safety (spec/replay.md R5, section 7): a writer process is killed with SIGKILL at random
 * moments, 50 times (ARL_CRASH_ITERS overrides).  The writer reports each call only after it
 * returned ARL_OK.  After every kill:
 *   - the store opens and `verify` finds no error;
 *   - every trajectory whose begin was reported exists, every segment whose append was reported
 *     is present and bit-identical to what was written, every reported finish is final;
 *   - `recover` finds every trajectory the dead writer left running (none is missed), and the
 *     ones it resolves stay consistent.
 * Writers alternate between taking over the previous writer's shard and opening a new one, and
 * write states before segments, so kills land in T0, S_s, C_s, C_end, takeover and recovery. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"
#include "replay/inspect.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

#define NSEG 3
#define MAXT 4096

typedef struct rec {
    char uid[48];
    uint64_t seed;
    int64_t ntok;
    int appended; /* segments whose append (or finish) was reported */
    int finished;
} rec;

static rec recs[MAXT];
static int nrec;
static fx_ids ids;

static int64_t ntok_of(uint64_t seed) {
    return 48 + (int64_t)(seed % 80);
}

static void report(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(int fd, const char *fmt, ...) {
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (write(fd, line, (size_t)n) != n) _exit(9);
    if (getenv("ARL_CRASH_DEBUG")) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        fprintf(stderr, "[%ld.%03ld] %s", (long)t.tv_sec % 1000, t.tv_nsec / 1000000, line);
    }
}

/* The child: write trajectories until killed. */
static void writer_main(const char *root, int iter, int fd) {
    replay_store *st;
    replay_writer *w;
    report(fd, "S\n");
    if (replay_store_open(root, NULL, &st)) _exit(3);
    /* two of three writers take over shard 1 from the dead one; the third opens a new shard */
    if (replay_writer_open(st, REPLAY_FILE_WORKER, iter % 3 ? 1 : 0, "run1", &w)) _exit(4);
    report(fd, "O\n");
    replay_writer_recover(w, 1, NULL, NULL); /* takeover: resolve before writing (section 2.2) */
    report(fd, "R\n");
    for (int k = 0;; k++) {
        char uid[48];
        snprintf(uid, sizeof uid, "c%d/%d", iter, k);
        uint64_t seed = (uint64_t)iter * 1000 + (uint64_t)k;
        int64_t ntok = ntok_of(seed), t;
        replay_traj_desc td = {.traj_uid = uid,
                               .run_id = ids.run_id,
                               .group_id = ids.group_id,
                               .task_id = ids.task_id,
                               .env_id = ids.env_id,
                               .slot = k % 8,
                               .attempt = iter,
                               .policy_version = 3,
                               .fork_seg_index = -1};
        if (replay_traj_begin(w, &td, &t)) _exit(5);
        report(fd, "B %s %llu\n", uid, (unsigned long long)seed);
        for (int s = 0; s < NSEG; s++) {
            fx_seg f;
            fx_seg_make(&f, seed, s, ntok, 2, 2, 4, s * ntok, s * ntok, 1 + 2 * s, 3, s == 0);
            /* a boundary state before the segment that refers to it (S_s then C_s) */
            float S[2 * 4 * 4] = {(float)s};
            replay_state_chunk c = {.layer = 0,
                                    .tensor = "S",
                                    .kind = ARL_BLOB_KDA_STATE,
                                    .dtype = ARL_BLOB_F32,
                                    .ndim = 3,
                                    .dims = {2, 4, 4},
                                    .data = S};
            replay_state_desc sd = {.traj_uid = uid,
                                    .seg_index = s,
                                    .kind = "kda_boundary",
                                    .pass_uid = "p",
                                    .version_min = 3,
                                    .version_max = 3,
                                    .numerics = "cpu-f32",
                                    .model_config_sha256 = "00",
                                    .n_tokens = (s + 1) * ntok};
            if (s < NSEG - 1 && replay_state_put(w, &sd, &c, 1, &f.d.end_state_id)) _exit(6);
            arl_status r;
            if (s == NSEG - 1) {
                fx_finish x;
                f.d.end_cause = "end";
                fx_finish_make(&x, 1 + 2 * NSEG, 1.0);
                r = replay_traj_finish(w, t, &f.d, &x.f);
            } else {
                r = replay_segment_append(w, t, &f.d);
            }
            fx_seg_free(&f);
            if (r) _exit(7);
            report(fd, "A %s %d\n", uid, s);
        }
        report(fd, "F %s\n", uid);
    }
}

static rec *find(const char *uid) {
    for (int i = nrec - 1; i >= 0; i--)
        if (!strcmp(recs[i].uid, uid)) return &recs[i];
    return NULL;
}

static char rbuf[1 << 16];
static size_t rn;

/* Read reports until `what` (e.g. "R\n": ready to write) has been reported, or it dies. */
static void wait_for(int fd, const char *what) {
    ssize_t r;
    while (!strstr(rbuf, what) && (r = read(fd, rbuf + rn, sizeof rbuf - 1 - rn)) > 0) {
        rn += (size_t)r;
        rbuf[rn] = 0;
    }
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void parse_reports(int fd) {
    char *buf = rbuf;
    size_t n = rn;
    ssize_t r;
    while ((r = read(fd, buf + n, sizeof rbuf - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
    rn = 0; /* the next writer's reports start afresh (strtok below ends the text) */
    char *save, *line = strtok_r(buf, "\n", &save);
    for (; line; line = strtok_r(NULL, "\n", &save)) {
        char uid[48];
        unsigned long long seed;
        int s;
        if (sscanf(line, "B %47s %llu", uid, &seed) == 2 && nrec < MAXT) {
            rec *x = &recs[nrec++];
            snprintf(x->uid, sizeof x->uid, "%s", uid);
            x->seed = seed;
            x->ntok = ntok_of(seed);
        } else if (sscanf(line, "A %47s %d", uid, &s) == 2) {
            rec *x = find(uid);
            if (x) x->appended = s + 1;
        } else if (sscanf(line, "F %47s", uid) == 1) {
            rec *x = find(uid);
            if (x) x->finished = 1;
        }
    }
    rbuf[0] = 0;
}

static int check_after_kill(const char *root, int iter, int64_t *n_found_total) {
    replay_store *st;
    int before = test_failures_;
    arl_status s = replay_store_open(root, NULL, &st);
    CHECK_MSG(s == ARL_OK, "iteration %d: store does not open: %s", iter, arl_error_msg());
    if (s != ARL_OK) return 1;
    /* verify: no error */
    char *vout = NULL;
    size_t vn = 0;
    FILE *vf = open_memstream(&vout, &vn);
    int64_t errors = -1, warnings = 0;
    CHECK(replay_verify(st, NULL, vf, &errors, &warnings) == ARL_OK);
    fclose(vf);
    CHECK_MSG(errors == 0, "iteration %d: verify found %lld errors:\n%s", iter, (long long)errors,
              vout);
    free(vout);
    /* every reported segment intact, every reported begin present, every reported finish final */
    replay_seg_data d = {0};
    int running_known = 0;
    for (int i = 0; i < nrec; i++) {
        rec *x = &recs[i];
        replay_traj_row r;
        s = replay_traj_get(st, x->uid, &r);
        CHECK_MSG(s == ARL_OK, "iteration %d: reported trajectory %s missing: %s", iter, x->uid,
                  arl_error_msg());
        if (s != ARL_OK) continue;
        CHECK_MSG(r.n_segments >= x->appended, "%s: %d segments stored, %d reported", x->uid,
                  (int)r.n_segments, x->appended);
        if (x->finished)
            CHECK_MSG(r.status == REPLAY_COMPLETE, "%s: reported finished, status %s", x->uid,
                      replay_status_name(r.status));
        if (r.status == REPLAY_RUNNING) running_known++;
        for (int sg = 0; sg < x->appended; sg++) {
            s = replay_segment_load(st, r.traj_id, sg, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES, &d);
            CHECK_MSG(s == ARL_OK, "%s segment %d: %s", x->uid, sg, arl_error_msg());
            if (s != ARL_OK) continue;
            fx_seg f;
            fx_seg_make(&f, x->seed, sg, x->ntok, 2, 2, 4, sg * x->ntok, sg * x->ntok, 1 + 2 * sg,
                        3, sg == 0);
            int same =
                d.ref.n_tokens == x->ntok && !memcmp(d.tokens, f.tokens, (size_t)x->ntok * 4) &&
                !memcmp(d.logprobs, f.logprobs, (size_t)x->ntok * 4) &&
                !memcmp(d.loss_mask, f.mask, (size_t)x->ntok) &&
                !memcmp(d.versions, f.versions, (size_t)x->ntok * 4) && d.n_moe_layers == 2 &&
                !memcmp(d.routes, f.routes, (size_t)(2 * x->ntok * 4));
            CHECK_MSG(same, "%s segment %d differs from what was written", x->uid, sg);
            fx_seg_free(&f);
        }
    }
    replay_seg_data_free(&d);
    /* every running trajectory in the store (those of the writer just killed, which are the only
     * ones: earlier ones were resolved) is found by recover */
    int64_t running = 0;
    replay_seg_iter *it = NULL;
    (void)it;
    {
        replay_filter f;
        replay_filter_init(&f);
        f.status = "running";
        char *lout = NULL;
        size_t ln = 0;
        FILE *lf = open_memstream(&lout, &ln);
        CHECK(replay_list(st, &f, 1, lf) == ARL_OK);
        fclose(lf);
        for (char *p = lout; p && (p = strstr(p, "\"traj_uid\"")); p++)
            running++;
        free(lout);
    }
    char *rout = NULL;
    size_t rn = 0;
    FILE *rf = open_memstream(&rout, &rn);
    int64_t found = -1;
    s = replay_recover(st, iter % 2, rf, &found);
    fclose(rf);
    CHECK_MSG(s == ARL_OK, "iteration %d: recover: %s", iter, arl_error_msg());
    CHECK_MSG(found == running, "iteration %d: %lld running trajectories, recover found %lld:\n%s",
              iter, (long long)running, (long long)found, rout);
    CHECK(running >= running_known);
    free(rout);
    *n_found_total += found;
    replay_store_close(st);
    return test_failures_ != before;
}

static void test_kill_writer(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/store", test_tmpdir("crash"));
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    CHECK(replay_store_open(root, &oo, &st) == ARL_OK);
    CHECK(fx_catalog(st, 1, 8, &ids) == ARL_OK);
    replay_store_close(st);
    const char *e = getenv("ARL_CRASH_ITERS");
    int iters = e ? atoi(e) : 50;
    arl_rng rng;
    const char *seed = getenv("ARL_CRASH_SEED");
    arl_rng_seed(&rng, seed ? (uint64_t)atoll(seed) : 20240611);
    int64_t found = 0;
    int killed_busy = 0;
    /* Calibration (iteration -1): how long this machine and build (sanitizers are slow) take to
     * get a writer ready and to write one trajectory; the kill windows scale with both. */
    double ready_s = 0.01, traj_s = 0.005;
    for (int it = -1; it < iters; it++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        double t0 = mono();
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            writer_main(root, it < 0 ? iters : it, fds[1]);
            _exit(0);
        }
        close(fds[1]);
        uint64_t us;
        if (it < 0) {
            wait_for(fds[0], "R\n");
            double t1 = mono();
            wait_for(fds[0], "F ");
            ready_s = t1 - t0;
            traj_s = mono() - t1;
            us = 0;
        } else if (arl_rng_below(&rng, 4)) {
            /* three quarters: within 4 trajectories' time after the writer is ready (T0, S_s,
             * C_s, C_end) */
            wait_for(fds[0], "R\n");
            us = arl_rng_below(&rng, (uint64_t)(4e6 * traj_s) + 1);
        } else {
            /* a quarter: from the start (store open, shard creation, takeover: a takeover
             * replays the dead writer's WAL, up to 64 MiB for states) */
            us = arl_rng_below(&rng, (uint64_t)(1.5e6 * ready_s) + 1);
        }
        struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int stat = 0;
        waitpid(pid, &stat, 0);
        if (WIFSIGNALED(stat))
            killed_busy += it >= 0;
        else
            CHECK_MSG(0, "iteration %d: writer exited with %d before the kill", it,
                      WEXITSTATUS(stat));
        parse_reports(fds[0]);
        close(fds[0]);
        if (check_after_kill(root, it, &found)) break;
    }
    int segs = 0;
    for (int i = 0; i < nrec; i++)
        segs += recs[i].appended;
    fprintf(stderr,
            "crash: %d kills, %d trajectories begun, %d segments reported, %lld interrupted found "
            "(writer ready in %.1f ms, %.1f ms per trajectory)\n",
            killed_busy, nrec, segs, (long long)found, ready_s * 1e3, traj_s * 1e3);
    CHECK(killed_busy == iters);
    CHECK(segs > iters / 2); /* the writers made progress between kills */
    CHECK(found > 0);        /* some kills left trajectories running */
    FX_CLEANUP(root);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(test_kill_writer);
    return test_finish();
}
