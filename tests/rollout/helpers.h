/* tests/rollout/helpers.h: what the rollout tests share - a seeded tiny checkpoint written to a
 * temporary directory, a small rollout configuration, running a worker over a new store, the
 * store's verify, and the re-scoring check of every stored segment (header-only test helper). */
#ifndef ARL_TESTS_ROLLOUT_HELPERS_H
#define ARL_TESTS_ROLLOUT_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/params.h"
#include "replay/inspect.h"
#include "replay/replay.h"
#include "rollout/rescore.h"
#include "rollout/rollout.h"
#include "tests/test.h"

#define H_DIE(s, what)                                                                             \
    do {                                                                                           \
        if ((s) != ARL_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, what, arl_error_msg());        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Write configs/tiny (or `config` when non-NULL: a config.json path) with weights of `seed`
 * into dir. */
static inline void h_make_ckpt(const char *dir, const char *config, uint64_t seed) {
    arl_model_config cfg;
    H_DIE(arl_model_config_read(config ? config : test_src_path("configs/tiny/config.json"), &cfg),
          "config");
    arl_model_params p;
    H_DIE(arl_model_params_alloc(&p, &cfg), "params");
    H_DIE(arl_params_init(&p, &cfg, seed, 1), "init");
    H_DIE(arl_checkpoint_save(dir, &cfg, &p, 0), "save");
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
}

/* A small, fast configuration: short turns and segments so that boundaries happen. */
/* SHA-256 hex of a checkpoint's parameters as loaded (what a worker records for its version and
 * rescore matches) */
static inline void h_weights_sha(const char *ckpt, char hex[65]) {
    arl_model_config cfg;
    arl_model_params p;
    H_DIE(arl_model_config_read(ckpt, &cfg), "config");
    H_DIE(arl_model_params_alloc(&p, &cfg), "params");
    H_DIE(arl_checkpoint_load(ckpt, &cfg, &p), "load");
    arl_model_params_sha256_hex(&p, hex);
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
}

static inline void h_config(arl_rollout_config *c, const char *env) {
    H_DIE(arl_rollout_config_defaults(c), "defaults");
    free(c->env);
    c->env = strdup(env);
    c->tasks = 2;
    c->group_size = 2;
    c->turn_tokens = 24;
    c->observation_tokens = 512;
    c->segment_tokens = 1024;
    c->context_tokens = 4096;
    c->trajectory_tokens = 4096;
    c->max_turns = 6;
    c->batch_size = 4;
    c->prefill_chunk = 256;
    c->progress_s = 0;
    c->seed = 7;
}

static inline void h_set(arl_rollout_config *c, const char *key, const char *value) {
    H_DIE(arl_options_set(arl_rollout_options, arl_rollout_n_options, key, value, c), key);
}

static inline replay_store *h_store(const char *dir) {
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    H_DIE(replay_store_open(dir, &o, &st), "store");
    return st;
}

/* Verify the store; returns the number of errors (warnings are allowed: cache misses). */
static inline int64_t h_verify(replay_store *st) {
    int64_t ne = -1, nw = -1;
    replay_verify_opts vo = {0};
    FILE *devnull = fopen("/dev/null", "w");
    arl_status s = replay_verify(st, &vo, ne < 0 ? stderr : devnull, &ne, &nw);
    fclose(devnull);
    H_DIE(s, "verify");
    return ne;
}

/* Re-score trajectory uid under ckpt (version 0) and check the stored behaviour
 * log-probabilities: returns the number of segments that started from a cached state. */
static inline int64_t h_rescore_check(replay_store *st, const char *ckpt, const char *uid) {
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = 0};
    arl_rollout_rescore_stats rs;
    H_DIE(arl_rollout_rescore(st, uid, &o, &rs, NULL, NULL, NULL), "rescore");
    fprintf(stderr, "  rescore %s: %lld segments (%lld from cached states, %lld skipped), %lld "
                    "action tokens, |diff| mean %.3g p99 %.3g max %.3g\n",
            uid, (long long)rs.segments, (long long)rs.from_state, (long long)rs.skipped,
            (long long)rs.action_tokens,
            rs.mean_abs, rs.p99_abs, rs.max_abs);
    CHECK(rs.action_tokens > 0);
    /* fp32 forwards of different batch compositions and chunkings round differently
     * (spec/policy.md 16.4; measured <= 2e-6 here); 1e-3 nats is far below a real mismatch (a
     * wrong state, token or route gives differences of order 0.1-10) */
    CHECK_MSG(rs.max_abs < 1e-3, "%s: max |l - l_mu| = %g at stream token %lld", uid, rs.max_abs,
              (long long)rs.worst_token);
    return rs.from_state;
}

/* The first row's text of sql (one text column, ?1 bound to uid) in the SQLite file at path,
 * read-only (malloc'ed; NULL: no row, a NULL value or an error). */
static inline char *h_sql_text(const char *path, const char *sql, const char *uid) {
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    char *out = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK) {
        sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
        if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
            out = strdup((const char *)sqlite3_column_text(q, 0));
    }
    sqlite3_finalize(q);
    sqlite3_close(db);
    return out;
}

/* Run a worker of config c on shard `shard` of the store at db in a child process that dies
 * (_exit, as a crash would) right after the first committed boundary: another process, so its
 * death leaves the trajectory running for the next writer of the shard.  CHECKs that the
 * child got that far. */
static inline int h_exit_at_first_(void *user, const char *uid, int32_t seg, int final) {
    (void)user;
    (void)uid;
    (void)seg;
    if (!final) _exit(0);
    return 0;
}
static inline void h_run_until_first_boundary(arl_rollout_config *c, const char *ckpt,
                                              const char *db, int32_t shard) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        replay_store *cst = h_store(db);
        arl_rollout_hooks hk = {.on_commit = h_exit_at_first_};
        arl_rollout_worker *cw;
        if (arl_rollout_worker_open(c, ckpt, cst, shard, &hk, &cw) || arl_rollout_worker_run(cw))
            _exit(3);
        _exit(4); /* finished without a boundary */
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}

#endif
