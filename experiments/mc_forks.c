/* experiments/mc_forks.c: Monte-Carlo continuations for segment baselines (mc_forks.h).  The
 * learner reads them back (learner/batch.c mc_baselines) and averages their segment returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "experiments/mc_forks.h"
#include "learner/ledger.h"
#include "replay/inspect.h"
#include "replay/replay.h"

/* Members of the fork groups at the end of parent's segment seg: those not running (*done)
 * and those running (*running). */
static arl_status forks_count(replay_store *st, const char *parent, int32_t seg, int32_t *done,
                              int32_t *running) {
    replay_fork_member *m = NULL;
    size_t n = 0;
    *done = *running = 0;
    ARL_TRY(replay_forks_at(st, parent, seg, &m, &n));
    for (size_t i = 0; i < n; i++) {
        if (m[i].status == REPLAY_RUNNING)
            (*running)++;
        else
            (*done)++;
    }
    free(m);
    return ARL_OK;
}

/* Fork points and what they add up to. */
typedef struct point_list {
    arl_rollout_fork_point *v;
    char (*parent)[REPLAY_UID_MAX + 1]; /* the points' parent uids (v[i].parent points here) */
    size_t n, cap;
    int64_t n_points, n_forks; /* boundaries seen, forks to start */
} point_list;

/* The fork points of one trajectory, appended to *pl: `count` forks at the start of each of its
 * segments s >= 1 that begins at the segment token budget, less those there already (masked ones
 * included).  A fork still running sets *interrupted and stops the walk. */
static arl_status traj_points(replay_store *st, int32_t count, const replay_traj_row *t,
                              int *interrupted, point_list *pl) {
    replay_seg_ref *refs = NULL;
    size_t nref = 0;
    arl_status s = replay_traj_segments(st, t->traj_id, &refs, &nref);
    for (size_t j = 1; s == ARL_OK && j < nref; j++) {
        if (strcmp(refs[j - 1].end_cause, "token_budget")) continue;
        int32_t done, running;
        s = forks_count(st, t->traj_uid, (int32_t)j - 1, &done, &running);
        if (s == ARL_OK && running > 0) *interrupted = 1;
        if (s != ARL_OK || *interrupted) break;
        pl->n_points++;
        if (count - done <= 0) continue;
        if (pl->n == pl->cap) {
            const size_t c = pl->cap ? 2 * pl->cap : 32;
            arl_rollout_fork_point *v = realloc(pl->v, c * sizeof *v);
            if (v) pl->v = v;
            char(*p)[REPLAY_UID_MAX + 1] = v ? realloc(pl->parent, c * sizeof *p) : NULL;
            if (p) pl->parent = p;
            if (!v || !p) {
                s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
                break;
            }
            pl->cap = c;
        }
        snprintf(pl->parent[pl->n], REPLAY_UID_MAX + 1, "%s", t->traj_uid);
        pl->v[pl->n++] = (arl_rollout_fork_point){.n_prefix = (int32_t)j, .count = count - done};
        pl->n_forks += count - done;
    }
    free(refs);
    return s;
}

arl_status arl_mc_forks_make(const arl_rollout_config *cfg, const char *root, const char *run_uid,
                             const char *ckpt_dir, int64_t version, int32_t count,
                             int *interrupted) {
    *interrupted = 0;
    if (count < 1) return ARL_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    point_list pl = {0};
    const arl_log_level level = arl_log_get_level();
    if (level > ARL_LOG_WARN) arl_log_set_level(ARL_LOG_WARN);
    arl_ledger *led = NULL;
    replay_store *st = NULL;
    replay_open_opts oo = {0};
    int64_t run_id, *gids = NULL, ng = 0;
    arl_ledger_member *mem = NULL;
    arl_status s = arl_ledger_open(root, &led);
    if (!s) s = replay_store_open(root, &oo, &st);
    if (!s) s = arl_ledger_run_id(led, run_uid, &run_id);
    if (!s) s = arl_ledger_groups_alloc(led, run_id, "train", &gids, &ng);
    enum { MAX_MEMBERS = 4096 };
    if (!s && !(mem = malloc(sizeof *mem * MAX_MEMBERS)))
        s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    for (int64_t g = 0; !s && !*interrupted && g < ng; g++) {
        int32_t nm = 0;
        s = arl_ledger_members(led, gids[g], mem, MAX_MEMBERS, &nm);
        for (int32_t i = 0; !s && !*interrupted && i < nm; i++) {
            replay_traj_row t;
            s = replay_traj_get_id(st, mem[i].traj_id, &t);
            if (s || (t.status != REPLAY_COMPLETE && t.status != REPLAY_TRUNCATED) ||
                t.parent_traj_uid[0] || t.n_segments < 2)
                continue;
            s = traj_points(st, count, &t, interrupted, &pl);
        }
    }
    /* one fork worker for them all: the forks decode together */
    char(*uids)[REPLAY_UID_MAX + 1] = NULL;
    if (!s && pl.n_forks > 0 && !(uids = malloc(sizeof *uids * (size_t)pl.n_forks)))
        s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    for (size_t i = 0; !s && i < pl.n; i++)
        pl.v[i].parent = pl.parent[i]; /* pl.parent no longer moves */
    const arl_rollout_fork_opts fo = {.version = version};
    arl_rollout_stats fs = {0};
    if (!s && !*interrupted && pl.n > 0) {
        s = arl_rollout_fork_many(cfg, ckpt_dir, st, pl.v, (int32_t)pl.n, &fo, uids, &fs);
        if (s)
            s = arl_error_prefix(s, "train: segment-baseline mc: forking %lld boundaries",
                                 (long long)pl.n);
    }
    /* masked forks give no return: say how many (an environment that cannot fork masks all) */
    char masked[160] = "";
    if (fs.masked > 0)
        snprintf(masked, sizeof masked, "; %lld of them masked (%s), no return from those",
                 (long long)fs.masked,
                 fs.masked == pl.n_forks ? "all: see the store's error codes" : "see the store");
    free(uids);
    free(pl.v);
    free(pl.parent);
    free(mem);
    free(gids);
    replay_store_close(st);
    arl_ledger_close(led);
    arl_log_set_level(level);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s == ARL_OK && !*interrupted)
        arl_log_info("train: %lld forks at %lld segment boundaries of %s for the Monte-Carlo "
                     "segment baselines (%d each), %.1f s (prefill %lld tokens, decode %lld)%s",
                     (long long)pl.n_forks, (long long)pl.n_points, run_uid, (int)count,
                     (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
                     (long long)fs.prefill_tokens, (long long)fs.decode_tokens, masked);
    return s;
}

arl_status arl_mc_states_release(const char *root) {
    replay_store *st = NULL;
    replay_open_opts oo = {0};
    const replay_retention r = {.rollout = "last", .budget_bytes = 0, .min_age_ms = -1};
    replay_gc_stats gs;
    arl_status s = replay_store_open(root, &oo, &st);
    if (!s) s = replay_gc(st, &r, NULL, &gs);
    replay_store_close(st);
    if (s) return arl_error_prefix(s, "train: evicting the states kept for the forks of %s", root);
    return ARL_OK;
}
