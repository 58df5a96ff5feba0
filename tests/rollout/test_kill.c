/* tests/rollout/test_kill.c: a rollout worker killed with SIGKILL in the middle of a trajectory
 * (right after a segment was committed, before the next step) and restarted on the same shard
 * (spec/replay.md 7.5):
 *  - built-in environment (its sessions die with the process): the trajectory is resumed by
 *    deterministic replay of the stored actions into a new session, its model state comes from
 *    the cached boundary state, and it finishes; nothing committed before the kill changes;
 *  - remote environment that outlives the worker (an AEP/1 server in another process): the
 *    session is found at the last durable step (a create with the stored request's own
 *    trajectory_id, "<uid>@<store>", answered by AEP idempotency) and forked there;
 *  - resume-interrupted off: every interrupted trajectory is masked INTERRUPTED and its slot
 *    refilled by a new attempt.
 * The store verifies after every restart. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "envs/aep_server.h"
#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

static int hook_stall(void *user, const char *uid, int32_t seg, int final) {
    static int fired = 0;
    if (final || fired) return 0;
    fired = 1;
    /* written beside the marker, then renamed onto it: the parent, which kills this process as
     * soon as the marker exists, never reads it half written (it did, under load) */
    char tmp[720];
    snprintf(tmp, sizeof tmp, "%s.part", (const char *)user);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%s %d\n", uid, (int)seg);
        if (fclose(f) == 0) rename(tmp, (const char *)user);
    }
    sleep(600); /* killed here: a segment committed, the next step not yet sent */
    return 0;
}

static void config(arl_rollout_config *c, const char *env, int resume) {
    h_config(c, env);
    c->tasks = 1;
    c->group_size = 2;
    c->max_turns = 6;
    c->segment_tokens = 900;
    c->resume_interrupted = resume;
}

typedef struct snap {
    char uid[128];
    int32_t n_segments;
    uint32_t *tokens; /* all committed tokens */
    int64_t n;
} snap;

static void snapshot(replay_store *st, const char *uid, snap *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->uid, sizeof s->uid, "%s", uid);
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    s->n_segments = r.n_segments;
    s->tokens = malloc(sizeof(uint32_t) * (size_t)(r.n_tokens + 1));
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    for (int32_t i = 0; i < r.n_segments; i++) {
        H_DIE(replay_segment_load(st, r.traj_id, i, REPLAY_LOAD_TOKENS, &d), "load");
        memcpy(s->tokens + s->n, d.tokens, sizeof(uint32_t) * (size_t)d.ref.n_tokens);
        s->n += d.ref.n_tokens;
    }
    replay_seg_data_free(&d);
}

/* Run a worker in a child, kill it after its first committed boundary, restart here.  Returns
 * the store (caller closes) and the killed trajectory's uid in `uid`. */
static replay_store *kill_and_restart(const char *tag, const char *env, int resume, char *uid,
                                      snap *before, arl_rollout_stats *after) {
    char db[700], marker[700];
    snprintf(db, sizeof db, "%s/db-%s", tmp, tag);
    snprintf(marker, sizeof marker, "%s/marker-%s", tmp, tag);
    arl_rollout_config c;
    config(&c, env, resume);
    pid_t pid = fork();
    if (pid == 0) {
        replay_store *st = h_store(db);
        arl_rollout_worker *w;
        arl_rollout_hooks hk = {.user = marker, .on_commit = hook_stall};
        if (arl_rollout_worker_open(&c, ckpt, st, 1, &hk, &w) || arl_rollout_worker_run(w)) {
            fprintf(stderr, "child: %s\n", arl_error_msg());
            _exit(3);
        }
        _exit(0);
    }
    struct stat sb;
    for (int i = 0; i < 6000 && stat(marker, &sb); i++) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "the child worker ended before its first boundary (status %d)\n", status);
            exit(1);
        }
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    FILE *f = fopen(marker, "r");
    int seg = -1;
    CHECK(f && fscanf(f, "%127s %d", uid, &seg) == 2);
    if (f) fclose(f);
    replay_store *st = h_store(db);
    snapshot(st, uid, before);
    CHECK_EQ_INT(before->n_segments, seg + 1);
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    CHECK_EQ_INT(r.status, REPLAY_RUNNING);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 1, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    *after = *arl_rollout_worker_stats(w);
    arl_rollout_stats_print(after, stderr);
    arl_rollout_worker_close(w);
    arl_rollout_config_free(&c);
    CHECK_EQ_INT(h_verify(st), 0);
    return st;
}

static void check_resumed(replay_store *st, const char *uid, const snap *before,
                          const arl_rollout_stats *s) {
    CHECK(s->resumed >= 1);
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    CHECK_MSG(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED, "%s is %s", uid,
              replay_status_name(r.status));
    CHECK_EQ_INT(r.resume_count, 1);
    CHECK(r.n_segments > before->n_segments);
    snap now;
    snapshot(st, uid, &now);
    /* nothing committed before the kill changed */
    CHECK(now.n >= before->n && !memcmp(now.tokens, before->tokens, sizeof(uint32_t) * (size_t)before->n));
    free(now.tokens);
    /* every segment, old and new, re-scores from its cached states under the same weights */
    h_rescore_check(st, ckpt, uid);
}

static void test_resume_builtin(void) {
    char uid[128];
    snap before;
    arl_rollout_stats s;
    replay_store *st = kill_and_restart("builtin", "builtin:calculator", 1, uid, &before, &s);
    check_resumed(st, uid, &before, &s);
    replay_store_close(st);
    free(before.tokens);
}

static void test_mask_interrupted(void) {
    char uid[128];
    snap before;
    arl_rollout_stats s;
    replay_store *st = kill_and_restart("mask", "builtin:calculator", 0, uid, &before, &s);
    CHECK_EQ_INT(s.resumed, 0);
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    CHECK_EQ_INT(r.status, REPLAY_MASKED);
    CHECK_STR_EQ(r.error_code, "INTERRUPTED");
    CHECK_STR_EQ(r.error_attribution, "infra");
    CHECK_STR_EQ(r.end_cause, "interrupted");
    CHECK_EQ_INT(r.n_segments, before.n_segments); /* kept, never dropped */
    char refill[140];
    snprintf(refill, sizeof refill, "%s.a1", uid);
    H_DIE(replay_traj_get(st, refill, &r), refill);
    CHECK(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED);
    replay_store_close(st);
    free(before.tokens);
}

/* The detail_json of trajectory uid's 'resumed' event in worker file `path` (malloc'ed; NULL:
 * none). */
static char *resumed_detail(const char *path, const char *uid) {
    return h_sql_text(path,
                      "SELECT e.detail_json FROM trajectory_events e JOIN trajectories t ON "
                      "t.traj_id = e.traj_id WHERE t.traj_uid = ?1 AND e.kind = 'resumed'",
                      uid);
}

static void test_resume_remote(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t srv = fork();
    if (srv == 0) { /* the environment's own process: it outlives the worker */
        void *inst;
        const arl_env_vtable *vt;
        arl_aep_server *s;
        if (arl_env_host_open(arl_env_builtin_find("calculator"), NULL, NULL, &inst, &vt) ||
            arl_aep_server_start(vt, inst, NULL, &s))
            _exit(3);
        int port = arl_aep_server_port(s);
        if (write(fds[1], &port, sizeof port) != sizeof port) _exit(3);
        for (;;) pause();
    }
    int port = 0;
    CHECK(read(fds[0], &port, sizeof port) == sizeof port);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    char uid[128];
    snap before;
    arl_rollout_stats s;
    replay_store *st = kill_and_restart("remote", url, 1, uid, &before, &s);
    check_resumed(st, uid, &before, &s);
    replay_store_close(st);
    /* the killed worker's session, found again and forked at the last durable step (not a
     * new session replayed from step 0) */
    char shard[700];
    snprintf(shard, sizeof shard, "%s/db-remote/shards/w1.sqlite", tmp);
    char *d = resumed_detail(shard, uid);
    CHECK_MSG(d && strstr(d, "\"env\":\"forked\""), "resumed: %s", d ? d : "(no event)");
    free(d);
    free(before.tokens);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
}

/* Each scenario runs in a process of its own: the kernels' thread pool of one scenario's
 * in-process worker must not be inherited, without its threads, by the next scenario's forked
 * worker. */
static void isolated(void (*fn)(void), const char *name) {
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        fflush(stderr);
        _exit(test_failures_ ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: scenario process status %d", name,
              status);
}

static void test_resume_builtin_iso(void) { isolated(test_resume_builtin, "resume_builtin"); }
static void test_mask_interrupted_iso(void) { isolated(test_mask_interrupted, "mask_interrupted"); }
static void test_resume_remote_iso(void) { isolated(test_resume_remote, "resume_remote"); }

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-kill"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_resume_builtin_iso);
    TEST_RUN(test_mask_interrupted_iso);
    TEST_RUN(test_resume_remote_iso);
    return test_finish();
}
