/* rollout/resume.c: trajectories a dead worker left running in this worker's shard
 * (spec/replay.md 7.5).  With resume-interrupted off they are all masked INTERRUPTED; otherwise
 * those with nothing committed are masked (their slot is refilled by the job list) and each of
 * the others is brought back to its last durable step m:
 *
 *  - environment: the create request is re-sent with the original trajectory id (idempotent on a
 *    server that still holds the session) and the session is inspected with GET: a session at or
 *    ahead of m is forked at m (fork, or fork_past when ahead) and the old one deleted; else, with
 *    deterministic_replay, a new session <traj_uid>#resume<n> replays the stored actions of steps
 *    1..m and the stored segment scores, every response checked against its stored SHA-256
 *    (RESUME_DIVERGED on a difference); else RESUME_IMPOSSIBLE.  (Continuing the very session at
 *    m would need a way to attach a client session at a known step, which envs/env.h lacks; a
 *    fork at m is equivalent.)
 *  - model: the cached boundary state of the last committed segment when it is usable, else
 *    the stored tokens since the last fresh start are prefilled again at the current version;
 *  - stream: the observation of step m (the stored response, verified) is rendered after the
 *    re-parsed last turn and opens segment c, as the lost run had done.
 * Resumed trajectories then continue in the ordinary loop.  Not here: detection and the masking
 * of trajectories with nothing committed (replay_writer_recover). */
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/log.h"
#include "core/sha256.h"
#include "envs/aep_json.h"
#include "rollout/boundary.h"
#include "rollout/internal.h"
#include "rollout/media.h"
#include "rollout/rescore.h"
#include "rollout/store_read.h"

#define RESUME_MAX 3 /* spec/replay.md 7.5 step 2 */

static int parse_uid(const arl_rollout_worker *w, const char *uid, int64_t *task, int32_t *gslot,
                     int32_t *attempt) {
    size_t rl = strlen(w->cfg.run_uid);
    if (strncmp(uid, w->cfg.run_uid, rl) || uid[rl] != '/') return 0;
    long long tk;
    int sl, at = 0, used = 0;
    if (sscanf(uid + rl, "/g%lld/r%d%n", &tk, &sl, &used) != 2) return 0;
    const char *rest = uid + rl + used;
    if (*rest && (sscanf(rest, ".a%d%n", &at, &used) != 1 || rest[used])) return 0;
    if (tk < w->cfg.task_offset) return 0; /* another worker's slice */
    *task = tk - w->cfg.task_offset;      /* the index in this worker's task source */
    *gslot = sl;
    *attempt = at;
    char check[REPLAY_UID_MAX + 1], g[REPLAY_UID_MAX + 1];
    ro_group_uid_of(w, *task, g, sizeof g);
    return !strcmp(ro_traj_uid_of(check, sizeof check, g, sl, at), uid);
}

arl_status ro_push_resume(arl_rollout_worker *w, int64_t id) {
    if (w->n_resume == w->cap_resume) {
        size_t c = w->cap_resume ? 2 * w->cap_resume : 16;
        int64_t *v = realloc(w->resume, c * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        w->resume = v;
        w->cap_resume = c;
    }
    w->resume[w->n_resume++] = id;
    return ARL_OK;
}

arl_status ro_resume_interrupted(arl_rollout_worker *w) {
    const int64_t *ids;
    size_t n;
    replay_writer_interrupted(w->w, &ids, &n);
    if (!n) return ARL_OK;
    int64_t *copy = malloc(n * sizeof *copy);
    if (!copy) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    memcpy(copy, ids, n * sizeof *copy);
    int64_t masked = 0, resumable = 0;
    arl_status s = replay_writer_recover(w->w, !w->cfg.resume_interrupted, &masked, &resumable);
    w->stats.interrupted_masked += masked;
    arl_log_info("rollout: %zu interrupted trajectories in shard %d: %lld masked, %lld to resume",
                 n, (int)replay_writer_shard_id(w->w), (long long)masked,
                 (long long)(w->cfg.resume_interrupted ? resumable : 0));
    for (size_t i = 0; s == ARL_OK && i < n; i++) {
        replay_traj_row r;
        s = replay_traj_get_id(w->st, copy[i], &r);
        if (s == ARL_OK && r.status == REPLAY_RUNNING) s = ro_push_resume(w, copy[i]);
    }
    free(copy);
    return s;
}

/* ---- pieces ---- */

typedef struct rs_ctx {
    arl_rollout_worker *w;
    ro_traj *t;
    replay_traj_row row;
    int fork;              /* continuing a new fork of a parent, not an interrupted trajectory */
    int64_t calls_traj_id; /* whose stored calls to replay (the parent for a fork) */
    replay_seg_ref *refs;
    size_t c;  /* committed segments */
    int64_t m; /* last durable step */
    ro_calls calls;
    const char *how; /* "forked" or "replayed" */
    const char *state_how;
    char code[64], attr[8], detail[512];
    char fork_gid[ARL_AEP_MAX_ID_BYTES + 1]; /* a fork's group as the environment knows it */
    int nomem; /* fail_with could not build detail (out of memory): an error, not a mask */
} rs_ctx;

static int fail_with(rs_ctx *x, const char *code, const char *attr, const char *fmt, const char *a) {
    snprintf(x->code, sizeof x->code, "%s", code);
    snprintf(x->attr, sizeof x->attr, "%s", attr);
    char msg[400];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    json_t *j = json_pack("{s:s}", "reason", msg);
    char *txt = j ? arl_json_dumps(j, JSON_COMPACT) : NULL;
    snprintf(x->detail, sizeof x->detail, "%s", txt ? txt : "{}");
    if (!txt) x->nomem = 1;
    free(txt);
    json_decref(j);
    return 1;
}

/* Record the call the session just made into the new segment's rows. */
static arl_status rec(rs_ctx *x, int64_t step, int64_t seg) {
    const arl_env_call *c = arl_env_session_call(x->t->sess);
    return ro_record_call(x->t, c, 0, step, seg, NULL);
}

static int sha_matches(const arl_env_call *c, const ro_call *stored) {
    if (!stored || !stored->has_sha) return 1;
    if (!c->response || !c->response_complete) return 0;
    uint8_t h[32];
    arl_sha256(c->response, c->response_len, h);
    return !memcmp(h, stored->sha, 32);
}

/* The create request of the stored call 0 as task/options (borrowed from *req_json), under
 * trajectory id traj_id, or the stored request's own (NULL: the original session, found again
 * by AEP idempotency).  A fork's group is its own (ro_env_id). */
static arl_status stored_create(rs_ctx *x, json_t **req_json, arl_env_create_req *req,
                                const char *traj_id) {
    if (x->fork) ARL_TRY(ro_env_id(x->w, x->t->group_uid, "", x->fork_gid, sizeof x->fork_gid));
    const ro_call *c0 = ro_calls_step(&x->calls, 0);
    json_error_t je;
    json_t *j = c0 && c0->request ? arl_json_loadb(c0->request, c0->request_len, 0, &je) : NULL;
    if (!j && c0 && c0->request && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: %s: out of memory reading the stored create "
                          "request", x->t->uid);
    json_t *task = json_object_get(j, "task");
    if (!j || !json_is_object(task)) {
        json_decref(j);
        return arl_errorf(ARL_ERR_CORRUPT, "rollout: %s: the stored create request is missing",
                          x->t->uid);
    }
    memset(req, 0, sizeof *req);
    req->trajectory_id = traj_id ? traj_id : json_string_value(json_object_get(j, "trajectory_id"));
    if (!req->trajectory_id) req->trajectory_id = x->t->uid;
    req->group_id = x->fork ? x->fork_gid : json_string_value(json_object_get(j, "group_id"));
    req->task.id = json_string_value(json_object_get(task, "id"));
    req->task.seed = (uint64_t)json_integer_value(json_object_get(task, "seed"));
    req->task.data = json_object_get(task, "data");
    req->options = json_object_get(j, "options");
    *req_json = j;
    return ARL_OK;
}

/* Deterministic replay of steps 1..m into a new session <uid>#resume<n>. */
static arl_status replay_env(rs_ctx *x, int *failed) {
    ro_traj *t = x->t;
    arl_rollout_worker *w = x->w;
    char id[ARL_AEP_MAX_ID_BYTES + 1], sfx[32] = "";
    if (!x->fork) snprintf(sfx, sizeof sfx, "#resume%d", x->row.resume_count + 1);
    ARL_TRY(ro_env_id(w, t->uid, sfx, id, sizeof id));
    json_t *rj;
    arl_env_create_req req;
    ARL_TRY(stored_create(x, &rj, &req, id));
    arl_env_session_free(t->sess);
    t->sess = NULL;
    arl_status s = arl_env_session_create(w->env, &req, &t->sess);
    json_decref(rj);
    if (t->sess) arl_env_session_set_user(t->sess, t);
    if (s == ARL_ERR_ENV) {
        ARL_TRY(rec(x, 0, -1));
        *failed = fail_with(x, arl_env_session_call(t->sess)->error.code_str,
                            arl_env_attribution_str(arl_env_session_call(t->sess)->error.attribution),
                            "re-creating the session: %s", arl_env_session_call(t->sess)->error.message);
        return ARL_OK;
    }
    ARL_TRY(s);
    ARL_TRY(rec(x, 0, -1));
    /* the initial observation must equal the stored one */
    const ro_call *c0 = ro_calls_step(&x->calls, 0);
    const arl_env_call *c = arl_env_session_call(t->sess);
    json_error_t ea, eb;
    json_t *a = c0 && c0->response ? arl_json_loadb(c0->response, c0->response_len, 0, &ea) : NULL;
    json_t *b = c->response ? arl_json_loadb(c->response, c->response_len, 0, &eb) : NULL;
    int same = a && b && json_equal(json_object_get(a, "observation"), json_object_get(b, "observation"));
    json_decref(a);
    json_decref(b);
    /* this process out of memory: not a divergence of the environment */
    if ((!a && c0 && c0->response && arl_json_error_nomem(&ea)) ||
        (!b && c->response && arl_json_error_nomem(&eb)))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: %s: out of memory comparing the initial "
                          "observation", t->uid);
    if (!same) {
        *failed = fail_with(x, "RESUME_DIVERGED", "env", "%sthe re-created session's initial "
                                                         "observation differs from the stored one",
                            "");
        return ARL_OK;
    }
    for (size_t si = 0; si < x->c; si++) {
        const replay_seg_ref *r = &x->refs[si];
        for (int64_t k = r->first_step; k <= r->last_step; k++) {
            const ro_call *sc = ro_calls_step(&x->calls, k);
            arl_env_action act;
            char why[256];
            s = ro_call_action(sc, &act, why, sizeof why);
            if (s == ARL_ERR_NOMEM) return arl_error_prefix(s, "rollout: %s", t->uid);
            if (s) {
                *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra",
                                    "the stored action of a step cannot be read: %s", why);
                return ARL_OK;
            }
            s = arl_env_session_step(t->sess, &act, w->cfg.step_deadline_ms);
            arl_env_action_clear(&act);
            ARL_TRY(rec(x, k, -1));
            c = arl_env_session_call(t->sess);
            if (s == ARL_ERR_ENV) {
                *failed = fail_with(x, c->error.code_str, arl_env_attribution_str(c->error.attribution),
                                    "replaying a step: %s", c->error.message);
                return ARL_OK;
            }
            ARL_TRY(s);
            if (!sha_matches(c, sc)) {
                *failed = fail_with(x, "RESUME_DIVERGED", "env",
                                    "%sa replayed step answered differently from the stored response", "");
                return ARL_OK;
            }
        }
        const ro_call *ss = ro_calls_segment_score(&x->calls, r->seg_index);
        if (ss) {
            s = arl_env_session_score_segment(t->sess, r->seg_index, r->first_step, r->last_step,
                                              0);
            ARL_TRY(rec(x, -1, r->seg_index));
            c = arl_env_session_call(t->sess);
            if (s == ARL_ERR_ENV) {
                *failed = fail_with(x, c->error.code_str, arl_env_attribution_str(c->error.attribution),
                                    "replaying a segment score: %s", c->error.message);
                return ARL_OK;
            }
            ARL_TRY(s);
            if (!sha_matches(c, ss)) {
                *failed = fail_with(x, "RESUME_DIVERGED", "env",
                                    "%sa replayed segment score answered differently", "");
                return ARL_OK;
            }
        }
    }
    x->how = "replayed";
    return ARL_OK;
}

/* Step 3-4 of spec/replay.md 7.5: a session at step m. */
static arl_status restore_env(rs_ctx *x, int *failed) {
    ro_traj *t = x->t;
    arl_rollout_worker *w = x->w;
    const arl_env_capabilities *caps = &w->info->caps;
    if (x->fork) { /* the parent's session is not ours to fork: replay its steps (13.7 step 2) */
        if (caps->deterministic_replay) return replay_env(x, failed);
        *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra",
                            "%sforking needs an environment with deterministic_replay", "");
        return ARL_OK;
    }
    json_t *rj;
    arl_env_create_req req;
    ARL_TRY(stored_create(x, &rj, &req, NULL)); /* the original session (AEP idempotency) */
    arl_status s = arl_env_session_create(w->env, &req, &t->sess);
    json_decref(rj);
    if (t->sess) arl_env_session_set_user(t->sess, t);
    int64_t at = -1;
    int active = 0, sha_ok = 1;
    if (s == ARL_OK) {
        ARL_TRY(rec(x, 0, -1));
        s = arl_env_session_get(t->sess);
        ARL_TRY(rec(x, -1, -1));
        if (s == ARL_OK) {
            const json_t *snap = arl_env_session_call(t->sess)->snapshot;
            at = json_integer_value(json_object_get(snap, "step_index"));
            const char *st = json_string_value(json_object_get(snap, "status"));
            active = st && !strcmp(st, "active");
            const char *hex = json_string_value(json_object_get(snap, "last_step_response_sha256"));
            const ro_call *cm = ro_calls_step(&x->calls, x->m);
            if (hex && cm && cm->has_sha) {
                char mine[65];
                arl_sha256_hex(cm->sha, mine);
                sha_ok = !strcmp(mine, hex);
            }
        }
    }
    if (s != ARL_OK && s != ARL_ERR_ENV) return s;
    arl_error_clear();
    if (at >= x->m && ((at == x->m && active && sha_ok && caps->fork) || (at > x->m && caps->fork_past))) {
        char id[ARL_AEP_MAX_ID_BYTES + 1], sfx[32], gid[ARL_AEP_MAX_ID_BYTES + 1];
        snprintf(sfx, sizeof sfx, "#resume%d", x->row.resume_count + 1);
        ARL_TRY(ro_env_id(w, t->uid, sfx, id, sizeof id));
        ARL_TRY(ro_env_id(w, t->group_uid, "", gid, sizeof gid));
        arl_env_session *child = NULL;
        s = arl_env_session_fork(t->sess, id, gid, x->m, 0, &child);
        ARL_TRY(rec(x, x->m, -1));
        if (s == ARL_OK) {
            arl_env_session_delete(t->sess, "aborted");
            arl_env_session_free(t->sess);
            t->sess = child;
            arl_env_session_set_user(t->sess, t);
            x->how = "forked";
            return ARL_OK;
        }
        arl_env_session_free(child);
        if (s != ARL_ERR_ENV) return s;
        arl_error_clear();
    }
    if (t->sess && *arl_env_session_id(t->sess)) arl_env_session_delete(t->sess, "aborted");
    if (caps->deterministic_replay) return replay_env(x, failed);
    *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra",
                        "%sthe environment cannot bring the session back to the last durable step "
                        "(no fork at it, no deterministic replay)",
                        "");
    return ARL_OK;
}

/* A fork with no valid rollout state may start from the tool states that a `replay rescore
 * --save-states --routing natural` pass saved under these very weights, else from the learner
 * states of a pi_old pass that ran with them and natural routing (learner options keep-states
 * and routing natural; spec/replay.md 13.7 step 1): the same routes (the router's own) and MLA
 * sparsity as this engine's prefill, when the prefix since the last fresh start is the parent's
 * own segments.  States of replayed routes are left alone: a fork computes what its prefill
 * would.  *taken = 1 when imported; a miss is not an error. */
static arl_status fork_tool_state(rs_ctx *x, int *taken) {
    arl_rollout_worker *w = x->w;
    ro_engine *e = &w->eng;
    *taken = 0;
    size_t f = x->c - 1;
    while (f > 0 && strcmp(x->refs[f].start_kind, "fresh"))
        f--;
    for (size_t i = f; i < x->c; i++)
        if (x->refs[i].traj_id != x->calls_traj_id) return ARL_OK; /* a fork of a fork's */
    if (!w->fork_wsha[0]) ro_engine_weights_sha256(e, e->cur, w->fork_wsha);
    static const char *const producers[2] = {"tool", "learner"};
    for (int k = 0; k < 2; k++) {
        char pass[sizeof x->t->pass_uid];
        ro_pass_uid(producers[k], w->fork_wsha, 1, e->o.sparse_topk, e->o.sparse_chunk, pass,
                    sizeof pass);
        arl_status s = ro_pass_boundary_import(w->st, e, x->t->slot, x->row.parent_traj_uid,
                                               x->refs, x->c, producers[k], pass);
        if (s == ARL_ERR_NOT_FOUND || s == ARL_ERR_CONFIG || s == ARL_ERR_SHAPE ||
            s == ARL_ERR_FORMAT || s == ARL_ERR_CORRUPT) {
            arl_error_clear(); /* a miss */
            continue;
        }
        ARL_TRY(s);
        snprintf(x->t->pass_uid, sizeof x->t->pass_uid, "%s", pass);
        x->t->ctx_vmin = x->t->ctx_vmax = e->version;
        x->state_how = k ? "cached (learner states of these weights)"
                         : "cached (tool states of these weights)";
        *taken = 1;
        return ARL_OK;
    }
    return ARL_OK;
}

/* After a fork's prefix was recomputed: export it for the other forks of its point (its
 * siblings, restored next in a fork worker), which would prefill the same tokens at the same
 * version into the same state.  Nothing is kept for a fork without siblings. */
static arl_status fork_prefix_keep(rs_ctx *x) {
    arl_rollout_worker *w = x->w;
    const char *group = ro_fork_group_of(w, x->t->traj_id);
    int32_t siblings = -1;
    for (size_t i = 0; i < w->n_forks; i++)
        siblings += !strcmp(w->fork_groups[i], group);
    free(w->fork_prefix.buf);
    w->fork_prefix.buf = NULL;
    if (siblings < 1) return ARL_OK;
    ARL_TRY(ro_engine_slot_sync(&w->eng, x->t->slot, 0));
    ARL_TRY(arl_decode_state_export_alloc(&w->eng.st, x->t->slot, &w->fork_prefix.buf,
                                          &w->fork_prefix.len));
    w->fork_prefix.parent_id = x->calls_traj_id;
    w->fork_prefix.n_prefix = x->c;
    w->fork_prefix.left = siblings;
    return ARL_OK;
}

/* A fork whose sibling recomputed the same prefix starts from that state: 1 when taken.  The
 * state is the one its own prefill would compute (same tokens, version and chunks); its pass
 * is its own, as after a prefill. */
static int fork_prefix_shared(rs_ctx *x) {
    arl_rollout_worker *w = x->w;
    ro_traj *t = x->t;
    if (!w->fork_prefix.buf || w->fork_prefix.parent_id != x->calls_traj_id ||
        w->fork_prefix.n_prefix != x->c)
        return 0;
    if (ro_engine_slot_import(&w->eng, t->slot, w->fork_prefix.buf, w->fork_prefix.len)) {
        arl_error_clear(); /* prefill instead */
        return 0;
    }
    if (--w->fork_prefix.left <= 0) {
        free(w->fork_prefix.buf);
        w->fork_prefix.buf = NULL;
    }
    snprintf(t->pass_uid, sizeof t->pass_uid, "%s#p%d", t->uid, x->row.resume_count + 1);
    t->ctx_vmin = t->ctx_vmax = w->eng.version;
    x->state_how = "recomputed (by a sibling fork)";
    return 1;
}

/* The model state at the end of segment c - 1 into t->slot. */
static arl_status restore_model(rs_ctx *x, int *failed) {
    ro_traj *t = x->t;
    arl_rollout_worker *w = x->w;
    ro_engine *e = &w->eng;
    const replay_seg_ref *last = &x->refs[x->c - 1];
    replay_state_data *parts = NULL;
    size_t np = 0;
    arl_status s = replay_boundary_load(w->st, x->row.traj_id, last->seg_index, &parts, &np);
    if (s == ARL_OK && x->fork && !w->fork_any_state) {
        /* a fork starts from the state at its own version (spec/replay.md 13.7 step 1): the
         * parent's rollout state only when that version of the forks' run computed all of it */
        int same = 0;
        s = ro_boundary_at_version(w->st, parts, np, w->run_id, e->version, &same);
        if (s == ARL_OK && !same)
            s = arl_errorf(ARL_ERR_NOT_FOUND, "fork: no state at version %lld",
                           (long long)e->version);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (s == ARL_OK) s = arl_rollout_state_assemble(&e->cfg, e->cfg_hash, e->numerics, parts, np, &buf, &len);
    if (s == ARL_OK) s = ro_engine_slot_import(e, t->slot, buf, len);
    free(buf);
    if (s == ARL_OK) { /* used: last_used_at_ms of the parts in this worker's own states file */
        const double t0 = ro_mono_s();
        s = ro_states_touch(w->w, parts, np);
        w->stats.store_s += ro_mono_s() - t0;
        if (s) {
            replay_boundary_free(parts, np);
            return s;
        }
    }
    if (s == ARL_OK) {
        snprintf(t->pass_uid, sizeof t->pass_uid, "%s", parts[0].pass_uid);
        t->ctx_vmin = t->ctx_vmax = -1;
        for (size_t i = 0; i < np; i++) {
            if (t->ctx_vmin < 0 || parts[i].version_min < t->ctx_vmin) t->ctx_vmin = parts[i].version_min;
            if (parts[i].version_max > t->ctx_vmax) t->ctx_vmax = parts[i].version_max;
        }
        replay_boundary_free(parts, np);
        x->state_how = "cached";
        return ARL_OK;
    }
    if (parts) replay_boundary_free(parts, np);
    if (s != ARL_ERR_NOT_FOUND && s != ARL_ERR_CONFIG && s != ARL_ERR_SHAPE && s != ARL_ERR_FORMAT &&
        s != ARL_ERR_CORRUPT)
        return s;
    arl_error_clear();
    s = ARL_OK; /* a cache miss: tool states, the prefix a sibling fork recomputed, or prefill */
    if (x->fork) {
        int taken = 0;
        ARL_TRY(fork_tool_state(x, &taken));
        if (taken || fork_prefix_shared(x)) return ARL_OK;
    }
    /* recompute: prefill the stored tokens since the last fresh start at the current version */
    ARL_TRY(ro_engine_slot_reset(e, t->slot));
    size_t f = x->c - 1;
    while (f > 0 && strcmp(x->refs[f].start_kind, "fresh")) f--;
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    /* image placeholders get their rows rebuilt from the stored observations (rollout/media.h) */
    ro_media md;
    memset(&md, 0, sizeof md);
    int have_media = 0;
    for (size_t i = f; s == ARL_OK && i < x->c; i++) {
        const replay_seg_ref *r = &x->refs[i];
        if ((s = replay_segment_load(w->st, r->traj_id, r->seg_index, REPLAY_LOAD_TOKENS, &d))) break;
        for (int64_t c0 = 0; s == ARL_OK && c0 < r->n_tokens; c0 += e->o.max_tokens) {
            int64_t n = r->n_tokens - c0 < e->o.max_tokens ? r->n_tokens - c0 : e->o.max_tokens;
            int64_t n_ph = 0, n_media = 0;
            for (int64_t j = 0; j < n; j++) {
                e->tok[j] = (int32_t)d.tokens[c0 + j];
                n_ph += !d.loss_mask[c0 + j] &&
                        (int64_t)d.tokens[c0 + j] == e->cfg.media_placeholder_token_id;
            }
            if (n_ph > 0 && !have_media) {
                s = ro_media_load(w->st, x->row.traj_id, e, &md);
                if (s == ARL_ERR_CORRUPT) {
                    arl_error_clear();
                    s = ARL_OK; /* no rows: the take below fails */
                }
                if (s) break;
                ro_media_fresh(&md, x->refs[f].first_step - 1);
                have_media = 1;
            }
            if (n_ph > 0 && ro_media_take(&md, d.tokens + c0, d.loss_mask + c0, n, e->media,
                                          &n_media) != ARL_OK) {
                char why[200];
                snprintf(why, sizeof why, "%s", arl_error_msg());
                arl_error_clear();
                replay_seg_data_free(&d);
                ro_media_free(&md);
                *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra",
                                    "no cached state, and the prefix holds image placeholders "
                                    "the stored observations do not explain: %s",
                                    why);
                return ARL_OK;
            }
            int32_t cu[2] = {0, (int32_t)n};
            s = ro_engine_forward(e, 1, &t->slot, cu, e->tok, n, n_media ? e->media : NULL,
                                  n_media, NULL, NULL);
            w->stats.prefill_tokens += n;
        }
    }
    replay_seg_data_free(&d);
    ro_media_free(&md);
    ARL_TRY(s);
    snprintf(t->pass_uid, sizeof t->pass_uid, "%s#p%d", t->uid, x->row.resume_count + 1);
    t->ctx_vmin = t->ctx_vmax = e->version;
    x->state_how = "recomputed";
    return x->fork ? fork_prefix_keep(x) : ARL_OK;
}

/* The last turn re-parsed, the observation of step m rendered: e opens segment c. */
static arl_status restore_stream(rs_ctx *x, int fresh, int *failed) {
    ro_traj *t = x->t;
    arl_rollout_worker *w = x->w;
    const replay_seg_ref *last = &x->refs[x->c - 1];
    /* the stored response of step m (verified by replay, or the server said it is there) */
    const ro_call *cm = ro_calls_step(&x->calls, x->m);
    const ro_call *c0 = ro_calls_step(&x->calls, 0);
    if (!cm || !cm->response || !cm->complete || !c0 || !c0->response) {
        *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra", "%sthe response of the last durable "
                                                             "step is not stored",
                            "");
        return ARL_OK;
    }
    arl_env_action act;
    char why[256];
    arl_status as = ro_call_action(cm, &act, why, sizeof why);
    if (as == ARL_ERR_NOMEM) return arl_error_prefix(as, "rollout: %s", x->t->uid);
    if (as) {
        *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra", "stored action unreadable: %s", why);
        return ARL_OK;
    }
    const char **ids = calloc((size_t)(act.n_tool_calls + act.n_parse_errors + 1), sizeof *ids);
    if (!ids) {
        arl_env_action_clear(&act);
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    for (int32_t i = 0; i < act.n_tool_calls; i++) ids[i] = act.tool_calls[i].id;
    for (int32_t i = 0; i < act.n_parse_errors; i++) ids[act.n_tool_calls + i] = act.parse_errors[i].id;
    aep_expect ex = {.endpoint = ARL_ENV_EP_STEP, .info = w->info, .step_index = x->m,
                     .call_ids = ids, .n_call_ids = act.n_tool_calls,
                     .perr_ids = ids + act.n_tool_calls, .n_perr_ids = act.n_parse_errors};
    arl_env_error err;
    memset(&err, 0, sizeof err);
    arl_env_result res, res0;
    memset(&res, 0, sizeof res);
    memset(&res0, 0, sizeof res0);
    aep_response_parse(&ex, 200, "application/json", cm->response, cm->response_len, &err, &res,
                       NULL, NULL, NULL, NULL);
    free(ids);
    arl_env_action_clear(&act);
    aep_expect e0 = {.endpoint = ARL_ENV_EP_CREATE, .info = w->info};
    arl_env_error err0;
    memset(&err0, 0, sizeof err0);
    if (err.code == ARL_ENV_E_NONE)
        aep_response_parse(&e0, 201, "application/json", c0->response, c0->response_len, &err0,
                           &res0, NULL, NULL, NULL, NULL);
    arl_status s = ARL_OK;
    if (err.code != ARL_ENV_E_NONE || err0.code != ARL_ENV_E_NONE) {
        *failed = fail_with(x, "RESUME_IMPOSSIBLE", "infra", "stored responses unreadable: %s",
                            err.code != ARL_ENV_E_NONE ? err.violation : err0.violation);
        goto out;
    }
    /* tools of the session: the initial observation's (or /info's) */
    char *tools = arl_json_dumps(res0.obs.tools ? res0.obs.tools : w->info->tools,
                                 JSON_COMPACT | JSON_PRESERVE_ORDER);
    s = tools ? arl_chat_conv_set_tools_json(&t->conv, tools, strlen(tools))
              : arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    free(tools);
    if (s) goto out;
    t->conv_partial = 1;
    /* the last turn: the final run of action tokens of segment c - 1 */
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    if ((s = replay_segment_load(w->st, last->traj_id, last->seg_index, REPLAY_LOAD_TOKENS, &d)))
        goto out;
    int64_t b = last->n_tokens, a = b;
    while (a > 0 && d.loss_mask[a - 1]) a--;
    int32_t *ids2 = malloc(sizeof(int32_t) * (size_t)(b - a + 1));
    for (int64_t i = a; ids2 && i < b; i++) ids2[i - a] = (int32_t)d.tokens[i];
    replay_seg_data_free(&d);
    if (!ids2) {
        s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        goto out;
    }
    if (t->have_parsed) arl_chat_turn_free(&t->parsed);
    s = arl_chat_parse_tool_calls(&w->eng.tpl, ids2, (size_t)(b - a), x->m, NULL, &t->parsed);
    free(ids2);
    if (s) goto out;
    t->have_parsed = 1;
    arl_chat_tokens r, o, full;
    arl_chat_tokens_init(&r);
    arl_chat_tokens_init(&o);
    arl_chat_tokens_init(&full);
    ro_images imgs = {0};
    size_t na = t->conv.n_msgs;
    s = arl_chat_conv_add_turn(&t->conv, &w->eng.tpl, &t->parsed);
    if (s == ARL_OK) s = arl_chat_render_messages(&w->eng.tpl, &t->conv, na, na + 1, &r);
    size_t extra = (size_t)(w->gp_len + (b - a));
    if (s == ARL_OK && fresh) {
        char *tl = res.obs.tools ? arl_json_dumps(res.obs.tools, JSON_COMPACT | JSON_PRESERVE_ORDER)
                   : t->conv.tools_json ? strdup(t->conv.tools_json)
                                        : NULL;
        const int tools_lost = !tl && (res.obs.tools || t->conv.tools_json);
        arl_chat_conv_free(&t->conv);
        t->conv_partial = 0;
        if (tools_lost)
            s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        else if (tl)
            s = arl_chat_conv_set_tools_json(&t->conv, tl, strlen(tl));
        free(tl);
        if (s == ARL_OK) s = ro_conv_add_obs(&t->conv, &w->eng.tpl, &res.obs, &imgs);
        if (s == ARL_OK) s = arl_chat_render(&w->eng.tpl, &t->conv, 1, &full);
        if (s == ARL_OK) {
            t->e_n = 0;
            int32_t *p = realloc(t->e_tok, full.n * sizeof *p);
            if (!p) s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            else {
                t->e_tok = p;
                memcpy(p, full.ids, full.n * sizeof *p);
                t->e_n = (int64_t)full.n;
            }
        }
    } else if (s == ARL_OK) {
        size_t n0 = t->conv.n_msgs;
        s = ro_conv_add_obs(&t->conv, &w->eng.tpl, &res.obs, &imgs);
        if (s == ARL_OK) s = arl_chat_render_messages(&w->eng.tpl, &t->conv, n0, t->conv.n_msgs, &o);
        if (s == ARL_OK) {
            size_t ne = (r.n > extra ? r.n - extra : 0) + o.n + (size_t)w->gp_len;
            int32_t *p = realloc(t->e_tok, (ne ? ne : 1) * sizeof *p);
            if (!p) s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            else {
                t->e_tok = p;
                size_t k = 0;
                for (size_t i = extra; i < r.n; i++) p[k++] = r.ids[i];
                for (size_t i = 0; i < o.n; i++) p[k++] = o.ids[i];
                for (int64_t i = 0; i < w->gp_len; i++) p[k++] = w->gp[i];
                t->e_n = (int64_t)k;
            }
        }
    }
    float *media = NULL;
    int64_t n_media = 0;
    if (s == ARL_OK) s = ro_encode_images(w, &imgs, &media, &n_media);
    ro_images_clear(&imgs);
    free(imgs.v);
    arl_chat_tokens_free(&r);
    arl_chat_tokens_free(&o);
    arl_chat_tokens_free(&full);
    if (s == ARL_OK) {
        free(t->e_media);
        t->e_media = media;
        t->e_n_media = n_media;
    } else {
        free(media);
    }
out:
    arl_env_result_clear(&res);
    arl_env_result_clear(&res0);
    return s;
}

/* Resume one interrupted trajectory into a free slot. */
arl_status ro_resume_one(arl_rollout_worker *w, int64_t traj_id) {
    rs_ctx x;
    memset(&x, 0, sizeof x);
    x.w = w;
    ARL_TRY(replay_traj_get_id(w->st, traj_id, &x.row));
    if (x.row.status != REPLAY_RUNNING) return ARL_OK;
    x.fork = x.row.parent_traj_uid[0] && x.row.fork_seg_index >= 0 && x.row.n_segments == 0;
    x.calls_traj_id = traj_id;
    int64_t task = 0;
    int32_t gslot = 0, attempt = 0;
    if (x.fork) {
        replay_traj_row p;
        ARL_TRY(replay_traj_get(w->st, x.row.parent_traj_uid, &p));
        x.calls_traj_id = p.traj_id;
    } else if (x.row.resume_count >= RESUME_MAX ||
               !parse_uid(w, x.row.traj_uid, &task, &gslot, &attempt) || task >= w->n_tasks ||
               gslot >= w->cfg.group_size) {
        const char *why = x.row.resume_count >= RESUME_MAX
                              ? "{\"reason\":\"the resume budget (3) is spent\"}"
                              : "{\"reason\":\"not a trajectory of this run's tasks\"}";
        ARL_TRY(replay_traj_mask(w->w, traj_id, "RESUME_IMPOSSIBLE", "infra", "interrupted", why));
        w->stats.interrupted_masked++;
        return ARL_OK;
    }
    if (!x.fork) ARL_TRY(ro_task_ensure(w, task));
    ro_traj *t;
    ARL_TRY(ro_traj_new(w, task, gslot, attempt, &t));
    x.t = t;
    t->traj_id = traj_id;
    if (x.fork) {
        t->task_index = -1;
        snprintf(t->uid, sizeof t->uid, "%s", x.row.traj_uid);
        snprintf(t->group_uid, sizeof t->group_uid, "%s", ro_fork_group_of(w, traj_id));
    }
    /* a new stream per resume, named by the uid (not the store-local traj_id: two workers'
     * stores number their trajectories alike) */
    arl_rng_seed_stream(&t->rng, (uint64_t)w->cfg.seed,
                        0x9E3779B97F4A7C15ULL * (uint64_t)(x.row.resume_count + 1) ^
                            ro_uid_hash(t->uid));
    arl_status s = replay_traj_segments(w->st, traj_id, &x.refs, &x.c);
    if (s == ARL_OK && x.c == 0)
        s = arl_errorf(ARL_ERR_STATE, "rollout: %s has no committed segment", t->uid);
    if (s == ARL_OK) s = ro_calls_load(w->st, x.calls_traj_id, &x.calls);
    int failed = 0;
    int fresh = 0;
    if (s == ARL_OK) {
        const replay_seg_ref *last = &x.refs[x.c - 1];
        x.m = last->last_step;
        t->call_seq = x.calls.max_seq + 1;
        t->step = x.m;
        t->n_total = last->tok_start + last->n_tokens;
        if (x.fork) { /* the prefix is the parent's: the fork's summary counts its own part */
            t->base_step = t->step;
            t->base_tokens = t->n_total;
        }
        fresh = !strcmp(last->end_cause, "env_reset") || !strcmp(last->end_cause, "template_break");
        if (x.fork && strcmp(last->end_cause, "token_budget"))
            failed = fail_with(&x, "RESUME_IMPOSSIBLE", "infra",
                               "a fork continues a token_budget boundary; this segment ends '%s'",
                               last->end_cause);
        else if (!strcmp(last->end_cause, "template_break"))
            failed = fail_with(&x, "RESUME_IMPOSSIBLE", "infra",
                               "%sa template break needs the whole conversation, which is not kept", "");
        t->n_ctx = fresh ? 0 : last->ctx_start + last->n_tokens;
        ro_seg_reset(&t->seg, last->seg_index + 1,
                     x.fork ? "fork" : fresh ? "fresh" : "continue", (int32_t)x.m + 1, t->n_total,
                     fresh ? 0 : t->n_ctx);
    }
    if (s == ARL_OK && !failed) s = restore_env(&x, &failed);
    if (s == ARL_OK && !failed) {
        if (fresh) {
            s = ro_engine_slot_reset(&w->eng, t->slot);
            snprintf(t->pass_uid, sizeof t->pass_uid, "%s#p%d", t->uid, x.row.resume_count + 1);
            x.state_how = "fresh";
        } else {
            s = restore_model(&x, &failed);
        }
    }
    if (s == ARL_OK && !failed) s = restore_stream(&x, fresh, &failed);
    if (s == ARL_OK && failed && x.nomem) s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    if (s == ARL_OK && failed) {
        arl_log_warn("rollout: %s cannot be resumed: %s %s", t->uid, x.code, x.detail);
        ro_seg_reset(&t->seg, t->seg.seg_index, t->seg.start_kind, t->seg.first_step,
                     t->seg.tok_start, t->seg.ctx_start); /* nothing of it is committed */
        s = replay_traj_mask(w->w, traj_id, x.code, x.attr, x.fork ? "error" : "interrupted",
                             x.detail);
        if (s == ARL_OK && x.fork) { /* a fork that cannot start: a masked trajectory */
            w->stats.trajectories++;
            w->stats.masked++;
            if (strcmp(x.attr, "none")) w->stats.env_errors++;
        } else if (s == ARL_OK) {
            w->stats.interrupted_masked++;
        }
        if (t->sess && *arl_env_session_id(t->sess)) arl_env_session_delete(t->sess, "error");
        ro_traj_destroy(w, t);
    } else if (s == ARL_OK) {
        char detail[400];
        snprintf(detail, sizeof detail,
                 "{\"from_step\":%lld,\"env\":\"%s\",\"state\":\"%s\",\"version\":%lld,"
                 "\"session_id\":\"%s\"}",
                 (long long)x.m, x.how, x.state_how, (long long)w->eng.version,
                 arl_env_session_id(t->sess));
        if (!x.fork) s = replay_traj_resume(w->w, traj_id, arl_env_session_id(t->sess), detail);
        else s = replay_traj_event(w->w, traj_id, "forked", detail);
        if (s == ARL_OK) {
            float *media = t->e_media;
            t->e_media = NULL;
            s = ro_prefill_set(w, t, t->e_tok, t->e_n, media, t->e_n_media);
            t->n_ctx += t->e_n;
            t->n_total += t->e_n;
            const int cached = !strncmp(x.state_how, "cached", 6);
            if (x.fork) {
                w->stats.forked++;
                w->stats.forked_from_state += cached;
            } else {
                w->stats.resumed++;
                w->stats.resumed_from_state += cached;
            }
            arl_log_info("rollout: %s %s at step %lld (environment %s, model state %s)", t->uid,
                         x.fork ? "forked" : "resumed", (long long)x.m, x.how, x.state_how);
        }
    } else {
        ro_traj_destroy(w, t);
    }
    free(x.refs);
    ro_calls_free(&x.calls);
    return s;
}
