/* tests/rollout/test_tasks.c: group uids and sampling streams are global (key task-offset).
 *
 * Several rollout workers share one task list by slices (experiments/train.c gives rollout rank
 * r the tasks [lo_r, hi_r)).  A trajectory's sampling stream is seeded from its uid, and the
 * uid holds the task's global index task-offset + i, so:
 *   - workers over disjoint slices name their groups differently and draw distinct streams,
 *     even for tasks with identical content (here every line of the task file is the same
 *     calculator problem: before task-offset, task i of every slice drew the same tokens);
 *   - the same global task gives the same trajectory whichever worker runs it and whatever
 *     its place in that worker's slice (same uid, same tokens, same log-probabilities);
 *   - generated tasks (no task file) take id task<offset + i> and seed task-seed + offset + i;
 *   - a worker with an offset, stopped mid-trajectory and restarted on its shard, recognises its
 *     interrupted trajectories by their global names and resumes them (none is masked as "not a
 *     trajectory of this run's tasks"), then finds nothing left to do on a further restart.
 * Workers run at batch 1, so that every forward has the same composition in every worker and
 * the comparison can be exact (batched fp32 forwards of other compositions round differently,
 * which could flip a sample once in a long while). */
#include <sys/wait.h>
#include <unistd.h>

#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

/* The trajectory's whole token stream and log-probabilities (every segment). */
typedef struct stream {
    uint32_t *tok;
    float *lp;
    uint8_t *mask;
    int64_t n;
} stream;

static stream load_stream(replay_store *st, const char *uid) {
    replay_traj_row r;
    H_DIE(replay_traj_get(st, uid, &r), uid);
    CHECK_MSG(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED, "%s: status %d", uid,
              (int)r.status);
    stream s = {0};
    s.tok = malloc(sizeof(uint32_t) * (size_t)(r.n_tokens + 1));
    s.lp = malloc(sizeof(float) * (size_t)(r.n_tokens + 1));
    s.mask = malloc((size_t)(r.n_tokens + 1));
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    for (int32_t sg = 0; sg < r.n_segments; sg++) {
        H_DIE(replay_segment_load(st, r.traj_id, sg, REPLAY_LOAD_TOKENS, &d), "load");
        for (int64_t t = 0; t < d.ref.n_tokens && s.n < r.n_tokens; t++, s.n++) {
            s.tok[s.n] = d.tokens[t];
            s.lp[s.n] = d.logprobs[t];
            s.mask[s.n] = d.loss_mask[t];
        }
    }
    replay_seg_data_free(&d);
    CHECK_EQ_INT(s.n, r.n_tokens);
    return s;
}

static void stream_free(stream *s) {
    free(s->tok);
    free(s->lp);
    free(s->mask);
}

/* 1 if the sampled (action) tokens of a and b are the same sequence. */
static int same_actions(const stream *a, const stream *b) {
    int64_t i = 0, j = 0;
    for (;;) {
        while (i < a->n && !a->mask[i]) i++;
        while (j < b->n && !b->mask[j]) j++;
        if (i == a->n || j == b->n) return i == a->n && j == b->n;
        if (a->tok[i] != b->tok[j]) return 0;
        i++, j++;
    }
}

/* Bit-identical streams: tokens, masks and log-probabilities. */
static void check_identical(replay_store *sa, replay_store *sb, const char *uid) {
    stream a = load_stream(sa, uid), b = load_stream(sb, uid);
    CHECK_MSG(a.n == b.n, "%s: %lld vs %lld tokens", uid, (long long)a.n, (long long)b.n);
    int64_t n = a.n < b.n ? a.n : b.n, bad = -1;
    for (int64_t t = 0; t < n && bad < 0; t++)
        if (a.tok[t] != b.tok[t] || a.mask[t] != b.mask[t] ||
            memcmp(&a.lp[t], &b.lp[t], sizeof(float)))
            bad = t;
    CHECK_MSG(bad < 0, "%s: the two workers' streams differ at token %lld", uid, (long long)bad);
    stream_free(&a);
    stream_free(&b);
}

/* Lines [lo, hi) of the shared task list: every line the same problem (seed 11). */
static void write_slice(const char *path, int lo, int hi) {
    FILE *f = fopen(path, "w");
    H_DIE(f ? ARL_OK : ARL_ERR_IO, path);
    for (int i = lo; i < hi; i++)
        fprintf(f, "{\"id\": \"q%d\", \"seed\": 11, \"data\": {}}\n", i);
    fclose(f);
}

/* A worker over tasks [lo, hi) of the shared list (task_file) or of generated tasks (NULL). */
static replay_store *run_slice(const char *name, int with_file, int lo, int hi) {
    char db[700], tasks[700];
    snprintf(db, sizeof db, "%s/db-%s", tmp, name);
    snprintf(tasks, sizeof tasks, "%s/tasks-%s.jsonl", tmp, name);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.batch_size = 1;
    c.group_size = 2;
    c.max_turns = 3;
    c.task_offset = lo;
    c.tasks = hi - lo;
    if (with_file) {
        write_slice(tasks, lo, hi);
        h_set(&c, "task-file", tasks);
        c.tasks = 0;
    }
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 0, NULL, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->trajectories, (int64_t)(hi - lo) * 2);
    CHECK_EQ_INT(s->masked, 0);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    arl_rollout_config_free(&c);
    return st;
}

static const char *uid_of(char *buf, int task, int slot) {
    snprintf(buf, 64, "rollout/g%06d/r%d", task, slot);
    return buf;
}

/* Two ranks over tasks [0, 2) and [2, 4) of one list, and a third worker over [1, 3). */
static void test_slices(void) {
    replay_store *a = run_slice("a", 1, 0, 2), *b = run_slice("b", 1, 2, 4),
                 *c = run_slice("c", 1, 1, 3);
    char u[64];
    replay_traj_row r;
    /* each store holds its own slice's groups under their global names, and only those */
    for (int task = 0; task < 4; task++) {
        replay_store *own = task < 2 ? a : b, *other = task < 2 ? b : a;
        CHECK_MSG(replay_traj_get(own, uid_of(u, task, 0), &r) == ARL_OK, "%s missing", u);
        CHECK_MSG(replay_traj_get(other, uid_of(u, task, 0), &r) == ARL_ERR_NOT_FOUND,
                  "%s in the other worker's store", u);
        arl_error_clear();
    }
    /* distinct streams: the 8 trajectories of the two ranks solve the same problem, yet no two
     * sample the same tokens (identical uids, and so streams, would give identical tokens) */
    stream s[8];
    for (int i = 0; i < 8; i++)
        s[i] = load_stream(i < 4 ? a : b, uid_of(u, i / 2, i % 2));
    for (int i = 0; i < 8; i++)
        for (int j = i + 1; j < 8; j++)
            CHECK_MSG(!same_actions(&s[i], &s[j]), "task %d slot %d and task %d slot %d sampled "
                      "the same tokens", i / 2, i % 2, j / 2, j % 2);
    for (int i = 0; i < 8; i++) stream_free(&s[i]);
    /* the same global task, another worker and another place in its slice: the same
     * trajectory (task 1 is rank a's second task and c's first; task 2 b's first, c's second) */
    for (int slot = 0; slot < 2; slot++) {
        check_identical(a, c, uid_of(u, 1, slot));
        check_identical(b, c, uid_of(u, 2, slot));
    }
    replay_store_close(a);
    replay_store_close(b);
    replay_store_close(c);
}

/* Generated tasks: task<offset + i> with seed task-seed + offset + i, so a worker over [1, 2)
 * reproduces task 1 of a worker over [0, 2). */
static void test_generated(void) {
    replay_store *a = run_slice("gen-a", 0, 0, 2), *b = run_slice("gen-b", 0, 1, 2);
    char u[64];
    replay_traj_row r;
    CHECK(replay_traj_get(b, uid_of(u, 0, 0), &r) == ARL_ERR_NOT_FOUND);
    arl_error_clear();
    for (int slot = 0; slot < 2; slot++) check_identical(a, b, uid_of(u, 1, slot));
    replay_store_close(a);
    replay_store_close(b);
}

static int exit_at_boundary(void *user, const char *uid, int32_t seg, int final) {
    (void)user;
    (void)uid;
    (void)seg;
    if (!final) _exit(0); /* the first committed boundary: die as a crash would */
    return 0;
}

static void test_resume_offset(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/db-resume", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.task_offset = 5;
    c.tasks = 1;
    c.group_size = 2;
    c.segment_tokens = 900; /* token_budget boundaries within six turns */
    /* the first worker runs in a child: only another process's death leaves its trajectories
     * interrupted for the next writer of the shard */
    const int32_t shard = 1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        replay_store *cst = h_store(db);
        arl_rollout_hooks hk = {.on_commit = exit_at_boundary};
        arl_rollout_worker *cw;
        if (arl_rollout_worker_open(&c, ckpt, cst, shard, &hk, &cw) || arl_rollout_worker_run(cw))
            _exit(3);
        _exit(4); /* finished without a boundary */
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    replay_traj_row r;
    char u[64];
    H_DIE(replay_traj_get(st, uid_of(u, 5, 0), &r), u);
    CHECK(r.status == REPLAY_RUNNING);
    /* restart on the same shard */
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, shard, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK(s->resumed >= 1);
    CHECK_EQ_INT(s->masked, 0);
    arl_rollout_worker_close(w);
    /* each slot: finished, or (nothing committed at the crash) masked INTERRUPTED and refilled
     * by a second attempt that finished; never RESUME_IMPOSSIBLE */
    for (int slot = 0; slot < 2; slot++) {
        H_DIE(replay_traj_get(st, uid_of(u, 5, slot), &r), u);
        if (r.status == REPLAY_MASKED) {
            CHECK_MSG(!strcmp(r.error_code, "INTERRUPTED"), "%s: masked %s", u, r.error_code);
            snprintf(u, sizeof u, "rollout/g000005/r%d.a1", slot);
            H_DIE(replay_traj_get(st, u, &r), u);
        }
        CHECK_MSG(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED, "%s: status %d", u,
                  (int)r.status);
    }
    /* and once more: every group is final */
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, shard, NULL, &w), "reopen 2");
    H_DIE(arl_rollout_worker_run(w), "rerun 2");
    CHECK_EQ_INT(arl_rollout_worker_stats(w)->trajectories, 0);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-tasks"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    TEST_RUN(test_slices);
    TEST_RUN(test_generated);
    TEST_RUN(test_resume_offset);
    return test_finish();
}
