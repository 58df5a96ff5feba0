/* rollout/rescore_rewards.c: re-scoring a stored trajectory's rewards by replaying its actions
 * against an environment with deterministic_replay (spec/replay.md 13.6 --rewards; the rules
 * are in rescore_rewards.h).  The stored exchanges come from rollout/store_read.h (the same
 * reader a resume by replay uses), the session from envs/env.h, the rows go through
 * replay_rescore_rewards_put.  What it is not: the model-side re-score (rescore.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "core/json_dump.h"
#include "core/sha256.h"
#include "envs/aep_json.h"
#include "envs/env.h"
#include "rollout/rescore_rewards.h"
#include "rollout/store_read.h"

static const char *const level_names[3] = {"process", "segment", "outcome"};

static int level_of(const char *s) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, level_names[i])) return i;
    return -1;
}

/* A re-scored row under construction. */
typedef struct rr_row {
    int level;
    int64_t scope;
    char comp[72];
    double value; /* NAN: NULL */
} rr_row;

typedef struct rr_ctx {
    rr_row *v;
    size_t n, cap;
} rr_ctx;

static arl_status push(rr_ctx *x, int level, int64_t scope, const char *comp, double value) {
    if (x->n == x->cap) {
        size_t c = x->cap ? 2 * x->cap : 64;
        rr_row *v = realloc(x->v, c * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "rescore --rewards: out of memory");
        x->v = v;
        x->cap = c;
    }
    rr_row *r = &x->v[x->n++];
    r->level = level;
    r->scope = scope;
    snprintf(r->comp, sizeof r->comp, "%s", comp);
    r->value = value;
    return ARL_OK;
}

/* The rows of one reward-bearing response, as the rollout writes them (rollout/commit.c
 * ro_rewards_rows, worker.c): '' (NULL when unscorable), one per component, '@derived' (the
 * reward; when unscorable the client's value: q = 0 for a segment, range_lo for the outcome). */
static arl_status push_response(rr_ctx *x, int level, int64_t scope, int scorable, double reward,
                                const arl_env_component *c, int32_t nc, double unscorable) {
    ARL_TRY(push(x, level, scope, "", scorable ? reward : NAN));
    for (int32_t i = 0; i < nc; i++)
        ARL_TRY(push(x, level, scope, c[i].name, c[i].value));
    return push(x, level, scope, "@derived", scorable ? reward : unscorable);
}

/* Which members of two JSON response bodies differ ("" when the bytes are equal), comma
 * separated into buf; *fatal = 1 if one of them decides what happens next (observation,
 * terminated, truncated). */
static void diff_members(const char *a, size_t na, const char *b, size_t nb, char *buf, size_t cap,
                         int *fatal) {
    buf[0] = 0;
    *fatal = 0;
    if (na == nb && !memcmp(a, b, na)) return;
    json_t *ja = arl_json_loadb(a, na, 0, NULL), *jb = arl_json_loadb(b, nb, 0, NULL);
    size_t w = 0;
    if (!json_is_object(ja) || !json_is_object(jb)) {
        snprintf(buf, cap, "the body (not a JSON object)");
        *fatal = 1;
    } else {
        const char *k;
        json_t *v;
        for (int side = 0; side < 2; side++) {
            json_t *p = side ? jb : ja, *o = side ? ja : jb;
            json_object_foreach(p, k, v) {
                json_t *u = json_object_get(o, k);
                if (side && u) continue; /* both present: seen from side 0 */
                if (u && json_equal(u, v)) continue;
                if (!strcmp(k, "observation") || !strcmp(k, "terminated") ||
                    !strcmp(k, "truncated"))
                    *fatal = 1;
                if (w < cap) w += (size_t)snprintf(buf + w, cap - w, "%s%s", w ? ", " : "", k);
            }
        }
        if (!buf[0]) snprintf(buf, cap, "formatting only (equal JSON)");
    }
    json_decref(ja);
    json_decref(jb);
}

/* Where the trajectory's run found its environment: the run configuration's "env" (as the
 * worker normalises it) and "env-config". */
static arl_status run_env(replay_store *st, const replay_traj_row *t, char *where, size_t cap,
                          char **config) {
    where[0] = 0;
    *config = NULL;
    replay_run_info run;
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", (long long)t->run_id);
    arl_status s = replay_run_get(st, rid, &run);
    if (s) return arl_error_prefix(s, "rescore --rewards of %s: reading its run", t->traj_uid);
    json_error_t je;
    json_t *j = run.config_json ? arl_json_loads(run.config_json, 0, &je) : NULL;
    if (!j && run.config_json && arl_json_error_nomem(&je)) {
        replay_run_info_free(&run);
        return arl_errorf(ARL_ERR_NOMEM, "rescore --rewards of %s: out of memory reading its run",
                          t->traj_uid);
    }
    const char *env = json_string_value(json_object_get(j, "env"));
    const char *ec = json_string_value(json_object_get(j, "env-config"));
    if (env && *env) {
        if (!strncmp(env, "http://", 7) || !strncmp(env, "https://", 8) ||
            !strncmp(env, "builtin:", 8))
            snprintf(where, cap, "%s", env);
        else
            snprintf(where, cap, "builtin:%s", env);
    }
    if (ec) *config = strdup(ec);
    json_decref(j);
    replay_run_info_free(&run);
    if (!where[0])
        return arl_errorf(ARL_ERR_CONFIG,
                          "rescore --rewards of %s: its run records no environment (config key "
                          "'env'): give one with --env builtin:NAME or --env URL",
                          t->traj_uid);
    return ARL_OK;
}

static int64_t now_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* A stored call that holds a complete 2xx response. */
static int answered(const ro_call *c) {
    return c && c->complete && !c->has_error && c->response && c->http_status >= 200 &&
           c->http_status < 300;
}

/* Compare a replayed response with the stored one: a fatal difference is a divergence error,
 * another one is counted. */
static arl_status check_response(const arl_env_call *c, const ro_call *sc, const char *what,
                                 int fatal_allowed, arl_rollout_rescore_rewards_stats *out) {
    if (sc->has_sha && c->response && c->response_complete) {
        uint8_t h[32];
        arl_sha256(c->response, c->response_len, h);
        if (!memcmp(h, sc->sha, 32)) return ARL_OK;
    }
    char d[200];
    int fatal;
    const unsigned long n0 = arl_nomem_count();
    diff_members(sc->response, sc->response_len, c->response ? c->response : "",
                 c->response ? c->response_len : 0, d, sizeof d, &fatal);
    if (arl_nomem_count() != n0) /* this process's: not a divergence of the environment */
        return arl_errorf(ARL_ERR_NOMEM, "out of memory comparing %s with the stored one", what);
    if (fatal && fatal_allowed)
        return arl_errorf(ARL_ERR_ENV,
                          "diverged at %s: the response differs from the stored one in %s "
                          "(the stored actions no longer apply; nothing is written for this "
                          "trajectory)",
                          what, d);
    if (!d[0]) return ARL_OK;
    if (!out->mismatched++)
        snprintf(out->first_mismatch, sizeof out->first_mismatch, "%s: %s", what, d);
    return ARL_OK;
}

static arl_status env_fail(const arl_env_call *c, const char *what) {
    return arl_errorf(ARL_ERR_ENV, "the environment answered %s with %s: %s", what,
                      c->error.code_str[0] ? c->error.code_str : "an error", c->error.message);
}

/* The replay proper: rows into *x.  sess_out receives the session (freed by the caller). */
static arl_status replay(replay_store *st, const replay_traj_row *t, arl_env *env,
                         const arl_rollout_rescore_rewards_opts *o, const ro_calls *calls,
                         const replay_seg_ref *refs, size_t nref, rr_ctx *x,
                         arl_env_session **sess_out, arl_rollout_rescore_rewards_stats *out) {
    (void)st;
    const arl_env_info *info = arl_env_get_info(env);
    /* the last step with a stored, complete answer: a masked or running trajectory ends there */
    int64_t last = nref ? refs[nref - 1].last_step : 0, m = 0;
    while (m < last && answered(ro_calls_step(calls, m + 1)))
        m++;
    const int masked = t->status == REPLAY_MASKED, running = t->status == REPLAY_RUNNING;
    if (m < last && !masked && !running)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "the stored response of step %lld of %s (%s) is missing or incomplete: "
                          "run 'agentrl replay verify'",
                          (long long)(m + 1), t->traj_uid, replay_status_name(t->status));
    if (masked || running) {
        out->partial = 1;
        snprintf(out->note, sizeof out->note,
                 "%s%s%s: replayed the %lld steps with stored responses%s",
                 replay_status_name(t->status), masked ? " " : "", masked ? t->error_code : "",
                 (long long)m, running ? ", no episode score (not finished)" : "");
    }
    /* create with the stored task */
    const ro_call *c0 = ro_calls_step(calls, 0);
    json_error_t je;
    json_t *rq = c0 && c0->request ? arl_json_loadb(c0->request, c0->request_len, 0, &je) : NULL;
    if (!rq && c0 && c0->request && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the stored create request",
                          t->traj_uid);
    json_t *task = json_object_get(rq, "task");
    if (!answered(c0) || !json_is_object(task)) {
        json_decref(rq);
        return arl_errorf(ARL_ERR_CORRUPT,
                          "%s: the stored create request or its response is missing (the "
                          "trajectory was masked at creation?)",
                          t->traj_uid);
    }
    char id[REPLAY_UID_MAX + 48];
    snprintf(id, sizeof id, "%s#rescore%lld", t->traj_uid, (long long)now_ms());
    if (strlen(id) > ARL_AEP_MAX_ID_BYTES) {
        json_decref(rq);
        return arl_errorf(ARL_ERR_ARG,
                          "%s: the replay session's id %s would exceed %d bytes (spec/aep.md 3)",
                          t->traj_uid, id, ARL_AEP_MAX_ID_BYTES);
    }
    arl_env_create_req req = {
        .trajectory_id = id,
        .group_id = json_string_value(json_object_get(rq, "group_id")),
        .task = {.id = json_string_value(json_object_get(task, "id")),
                 .seed = (uint64_t)json_integer_value(json_object_get(task, "seed")),
                 .data = json_object_get(task, "data")},
        .options = json_object_get(rq, "options")};
    if (!req.group_id) req.group_id = id;
    arl_status s = arl_env_session_create(env, &req, sess_out);
    json_decref(rq);
    if (s == ARL_ERR_ENV) return env_fail(arl_env_session_call(*sess_out), "the session creation");
    ARL_TRY(s);
    arl_env_session *sess = *sess_out;
    const arl_env_call *c = arl_env_session_call(sess);
    {
        const unsigned long n0 = arl_nomem_count();
        json_t *a = arl_json_loadb(c0->response, c0->response_len, 0, NULL);
        json_t *b = c->response ? arl_json_loadb(c->response, c->response_len, 0, NULL) : NULL;
        int same = a && b &&
                   json_equal(json_object_get(a, "observation"), json_object_get(b, "observation"));
        json_decref(a);
        json_decref(b);
        if (!same && arl_nomem_count() != n0) /* this process's, not a divergence */
            return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory comparing the initial observation",
                              t->traj_uid);
        if (!same)
            return arl_errorf(ARL_ERR_ENV, "diverged at step 0: the initial observation differs "
                                           "from the stored one (another task or environment?)");
    }
    for (size_t si = 0; si < nref; si++) {
        const replay_seg_ref *r = &refs[si];
        for (int64_t k = r->first_step; k <= r->last_step && k <= m; k++) {
            const ro_call *sc = ro_calls_step(calls, k);
            arl_env_action act;
            char why[256];
            s = ro_call_action(sc, &act, why, sizeof why);
            if (s == ARL_ERR_NOMEM) return arl_error_prefix(s, "%s", t->traj_uid);
            if (s)
                return arl_errorf(ARL_ERR_CORRUPT, "%s: the stored action of step %lld cannot be "
                                                   "read: %s",
                                  t->traj_uid, (long long)k, why);
            s = arl_env_session_step(sess, &act, o->step_deadline_ms);
            arl_env_action_clear(&act);
            c = arl_env_session_call(sess);
            char what[48];
            snprintf(what, sizeof what, "step %lld", (long long)k);
            if (s == ARL_ERR_ENV) {
                if (c->error.code == ARL_ENV_E_EPISODE_ENDED)
                    return arl_errorf(ARL_ERR_ENV,
                                      "step count mismatch: the environment ended the episode "
                                      "before step %lld; the stored trajectory has %lld steps",
                                      (long long)k, (long long)last);
                return env_fail(c, what);
            }
            ARL_TRY(s);
            ARL_TRY(check_response(c, sc, what, 1, out));
            out->steps++;
            ARL_TRY(push_response(x, 0, k, 1, c->result.reward, c->result.components,
                                  c->result.n_components, 0.0));
        }
        if (r->last_step > m) break; /* the rest was not stored */
        /* the segment score, where the rollout requested one */
        const ro_call *ss = NULL;
        for (size_t i = 0; i < calls->n; i++)
            if (!strcmp(calls->v[i].endpoint, "score_segment") &&
                calls->v[i].segment_index == r->seg_index)
                ss = &calls->v[i];
        if (!ss) continue;
        s = arl_env_session_score_segment(sess, r->seg_index, r->first_step, r->last_step, 0);
        c = arl_env_session_call(sess);
        char what[48];
        snprintf(what, sizeof what, "segment %d's score", (int)r->seg_index);
        if (s == ARL_ERR_ENV && c->error.code == ARL_ENV_E_NOT_IMPLEMENTED) {
            /* the rollout's fall-back (spec/aep.md 8.3): unscored, q = 0 from the client */
            ARL_TRY(push(x, 1, r->seg_index, "@derived", 0.0));
            out->segment_scores++;
            if (answered(ss)) {
                if (!out->mismatched++)
                    snprintf(out->first_mismatch, sizeof out->first_mismatch,
                             "%s: NOT_IMPLEMENTED now, answered before", what);
            }
            continue;
        }
        if (s == ARL_ERR_ENV) return env_fail(c, what);
        ARL_TRY(s);
        if (answered(ss)) ARL_TRY(check_response(c, ss, what, 0, out));
        out->segment_scores++;
        ARL_TRY(push_response(x, 1, r->seg_index, c->score.scorable, c->score.reward,
                              c->score.components, c->score.n_components, 0.0));
    }
    /* the episode score, with the stored reason */
    const ro_call *se = NULL;
    for (size_t i = 0; i < calls->n; i++)
        if (!strcmp(calls->v[i].endpoint, "score_episode") && answered(&calls->v[i]))
            se = &calls->v[i];
    if (se && m == last) {
        json_error_t ee;
        json_t *ej = se->request ? arl_json_loadb(se->request, se->request_len, 0, &ee) : NULL;
        if (!ej && se->request && arl_json_error_nomem(&ee))
            return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the stored episode score "
                              "request", t->traj_uid);
        int reason = arl_env_score_reason_parse(json_string_value(json_object_get(ej, "reason")));
        json_decref(ej);
        if (reason < 0)
            return arl_errorf(ARL_ERR_CORRUPT,
                              "%s: the stored episode score request has no "
                              "valid reason",
                              t->traj_uid);
        s = arl_env_session_score_episode(sess, (arl_env_score_reason)reason, 0);
        c = arl_env_session_call(sess);
        if (s == ARL_ERR_ENV) return env_fail(c, "the episode score");
        ARL_TRY(s);
        ARL_TRY(check_response(c, se, "the episode score", 0, out));
        out->episode_scores = 1;
        ARL_TRY(push_response(x, 2, 0, c->score.scorable, c->score.reward, c->score.components,
                              c->score.n_components, info->level_lo[ARL_ENV_LEVEL_OUTCOME]));
    } else if (!se && !out->partial) {
        out->partial = 1;
        snprintf(out->note, sizeof out->note, "no stored episode score: none requested");
    }
    return ARL_OK;
}

static int cmp_pair(const void *a, const void *b) {
    const arl_rollout_reward_pair *x = a, *y = b;
    if (x->level != y->level) return x->level - y->level;
    if (x->scope_index != y->scope_index) return x->scope_index < y->scope_index ? -1 : 1;
    return strcmp(x->component, y->component);
}

/* Pair the stored rows (env, client) with the re-scored ones and fill the drift. */
static arl_status compare(const replay_reward_row *sr, size_t ns, const rr_ctx *x,
                          arl_rollout_rescore_rewards_stats *out) {
    arl_rollout_reward_pair *p = calloc(ns + x->n + 1, sizeof *p);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "rescore --rewards: out of memory");
    size_t np = 0;
    for (size_t i = 0; i < ns; i++) {
        int lv = level_of(sr[i].level);
        if (lv < 0 || (strcmp(sr[i].source, "env") && strcmp(sr[i].source, "client"))) continue;
        arl_rollout_reward_pair *q = &p[np++];
        q->level = lv;
        q->scope_index = sr[i].scope_index;
        snprintf(q->component, sizeof q->component, "%s", sr[i].component);
        q->stored = sr[i].value;
        q->rescored = NAN;
        q->present = 1;
    }
    qsort(p, np, sizeof *p, cmp_pair);
    const size_t nstored = np;
    for (size_t i = 0; i < x->n; i++) {
        arl_rollout_reward_pair key = {.level = x->v[i].level, .scope_index = x->v[i].scope};
        snprintf(key.component, sizeof key.component, "%s", x->v[i].comp);
        arl_rollout_reward_pair *q =
            nstored ? bsearch(&key, p, nstored, sizeof *p, cmp_pair) : NULL;
        if (!q) {
            q = &p[np++];
            *q = key;
            q->stored = NAN;
        }
        q->rescored = x->v[i].value;
        q->present |= 2;
    }
    qsort(p, np, sizeof *p, cmp_pair);
    for (size_t i = 0; i < np; i++) {
        arl_rollout_reward_drift *d = &out->level[p[i].level];
        if (p[i].present == 1) {
            d->missing++;
            continue;
        }
        if (p[i].present == 2) {
            d->extra++;
            continue;
        }
        d->compared++;
        const double a = p[i].stored, b = p[i].rescored;
        if (isnan(a) && isnan(b)) continue;
        if (isnan(a) || isnan(b)) {
            d->differing++;
            continue;
        }
        d->differing += a != b;
        double df = fabs(b - a);
        if (df > d->max_abs) d->max_abs = df;
        d->stored_sum += a;
        d->rescored_sum += b;
        d->n_values++;
    }
    out->pairs = p;
    out->n_pairs = np;
    return ARL_OK;
}

arl_status arl_rollout_rescore_rewards_save(replay_store *st, const char *traj, const char *label,
                                            replay_writer **tool,
                                            arl_rollout_rescore_rewards_stats *r) {
    if (!label || !*label) return arl_errorf(ARL_ERR_ARG, "rescore --rewards: a label is required");
    replay_traj_row t;
    ARL_TRY(replay_traj_get(st, traj, &t));
    char source[300];
    snprintf(source, sizeof source, "rescore:%s", label);
    size_t n = 0;
    replay_reward *rows = calloc(r->n_pairs + 1, sizeof *rows);
    if (!rows) return arl_errorf(ARL_ERR_NOMEM, "rescore --rewards: out of memory");
    for (size_t i = 0; i < r->n_pairs; i++) {
        const arl_rollout_reward_pair *p = &r->pairs[i];
        if (!(p->present & 2)) continue; /* a stored row the replay did not produce */
        rows[n++] = (replay_reward){.level = level_names[p->level],
                                    .scope_index = p->scope_index,
                                    .component = p->component,
                                    .source = source,
                                    .value = p->rescored,
                                    .call_seq = -1};
    }
    arl_status s = *tool ? ARL_OK : replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, tool);
    if (s == ARL_OK) s = replay_rescore_rewards_put(*tool, t.traj_id, source, rows, n);
    if (s == ARL_OK) r->rows_written = (int64_t)n;
    free(rows);
    return s;
}

arl_status arl_rollout_rescore_rewards(replay_store *st, const char *traj,
                                       const arl_rollout_rescore_rewards_opts *o,
                                       replay_writer **tool,
                                       arl_rollout_rescore_rewards_stats *out) {
    memset(out, 0, sizeof *out);
    if (!o->label || !*o->label)
        return arl_errorf(ARL_ERR_ARG, "rescore --rewards: a label is required");
    replay_traj_row t;
    ARL_TRY(replay_traj_get(st, traj, &t));
    if (t.parent_traj_uid[0])
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "rescore --rewards of %s: a fork's first steps are its parent's (%s): "
                          "re-score the parent's rewards instead",
                          t.traj_uid, t.parent_traj_uid);
    char where[512], *cfg = NULL;
    arl_status s = ARL_OK;
    if (o->env && *o->env) {
        if (!strncmp(o->env, "http://", 7) || !strncmp(o->env, "https://", 8) ||
            !strncmp(o->env, "builtin:", 8))
            snprintf(where, sizeof where, "%s", o->env);
        else
            snprintf(where, sizeof where, "builtin:%s", o->env);
        if (!o->env_config) { /* the run's env-config, when --env names the run's environment */
            char w2[512];
            if (run_env(st, &t, w2, sizeof w2, &cfg) != ARL_OK) arl_error_clear();
            if (strcmp(w2, where)) {
                free(cfg);
                cfg = NULL;
            }
        }
    } else {
        s = run_env(st, &t, where, sizeof where, &cfg);
    }
    if (s) return s;
    const char *config = o->env_config ? o->env_config : cfg;
    snprintf(out->env_where, sizeof out->env_where, "%s", where);
    replay_seg_ref *refs = NULL;
    size_t nref = 0;
    ro_calls calls;
    memset(&calls, 0, sizeof calls);
    arl_env_client *cl = NULL;
    arl_env *env = NULL;
    arl_env_session *sess = NULL;
    rr_ctx x = {0};
    replay_reward_row *stored = NULL;
    size_t nstored = 0;
    arl_env_client_config cc;
    arl_env_client_config_default(&cc);
    s = arl_env_client_open(&cc, &cl);
    if (s == ARL_OK) {
        s = arl_env_open(cl, where, config, &env);
        if (s) {
            const arl_env_error *ee = env ? arl_env_last_error(env) : NULL;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", arl_error_msg());
            s = arl_errorf(s,
                           "rescore --rewards of %s: environment %s cannot be opened: %s%s%s "
                           "(start it, or name another with --env)",
                           t.traj_uid, where, msg, ee && ee->message[0] ? ": " : "",
                           ee && ee->message[0] ? ee->message : "");
        }
    }
    if (s == ARL_OK) {
        const arl_env_info *info = arl_env_get_info(env);
        snprintf(out->env_name, sizeof out->env_name, "%s", info->name);
        snprintf(out->env_version, sizeof out->env_version, "%s", info->version);
        if (!info->caps.deterministic_replay)
            s = arl_errorf(ARL_ERR_UNSUPPORTED,
                           "rescore --rewards of %s: environment %s %s (%s) does not declare "
                           "capabilities.deterministic_replay: its sessions cannot be rebuilt by "
                           "replaying the stored actions, so its rewards cannot be re-scored",
                           t.traj_uid, info->name, info->version, where);
    }
    if (s == ARL_OK) s = replay_traj_segments(st, t.traj_id, &refs, &nref);
    if (s == ARL_OK) s = ro_calls_load(st, t.traj_id, &calls);
    if (s == ARL_OK) {
        s = replay(st, &t, env, o, &calls, refs, nref, &x, &sess, out);
        if (s) s = arl_error_prefix(s, "rescore --rewards of %s against %s", t.traj_uid, where);
    }
    if (sess && *arl_env_session_id(sess)) arl_env_session_delete(sess, s ? "error" : "completed");
    arl_env_session_free(sess);
    if (s == ARL_OK) s = replay_rewards_load(st, t.traj_id, NULL, &stored, &nstored);
    if (s == ARL_OK) s = compare(stored, nstored, &x, out);
    if (s == ARL_OK && tool)
        s = arl_rollout_rescore_rewards_save(st, t.traj_uid, o->label, tool, out);
    if (s != ARL_OK) {
        free(out->pairs);
        out->pairs = NULL;
        out->n_pairs = 0;
    }
    replay_reward_rows_free(stored);
    free(x.v);
    ro_calls_free(&calls);
    free(refs);
    arl_env_free(env);
    arl_env_client_close(cl);
    free(cfg);
    return s;
}
