/* rollout/worker.c: the rollout worker loop (see rollout.h): admission of group members, the
 * trajectory state machine (create -> prefill -> sample a turn -> step -> rules of
 * spec/objective.md 3.2 -> [segment score, S_s + C_s] -> prefill -> ... -> episode score ->
 * C_end), environment faults (C_mask), batched prefill and decode over the decode-state slots,
 * weight updates between turns, progress and counters.  Resuming a dead worker's trajectories
 * is rollout/resume.c; rows and states are rollout/commit.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json_dump.h"
#include "core/log.h"
#include "envs/aep_json.h"
#include "kernels/threadpool.h"
#include "policy/vision.h"
#include "replay/codec.h"
#include "rollout/internal.h"

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

/* ---- identifiers, tasks, catalog ---- */

uint64_t ro_uid_hash(const char *s) { return fnv1a(s); }

/* Group uids carry the task's global index (task-offset + the index in this worker's task
 * source), so that the trajectories' sampling streams, seeded from their uids, are globally
 * unique and the same for a task whichever worker runs it. */
void ro_group_uid_of(const arl_rollout_worker *w, int64_t task, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/g%06lld", w->cfg.run_uid, (long long)(w->cfg.task_offset + task));
}

const char *ro_traj_uid_of(char *buf, size_t cap, const char *group_uid, int32_t gslot,
                           int32_t attempt) {
    if (attempt > 0)
        snprintf(buf, cap, "%s/r%d.a%d", group_uid, (int)gslot, (int)attempt);
    else
        snprintf(buf, cap, "%s/r%d", group_uid, (int)gslot);
    return buf;
}

static arl_status tasks_load(arl_rollout_worker *w) {
    const arl_rollout_config *c = &w->cfg;
    if (!c->task_file) {
        /* (tasks >= 1: arl_rollout_config_validate) n_tasks is set once the list exists, so
         * that arl_rollout_worker_close frees only what was made */
        w->tasks = calloc((size_t)c->tasks, sizeof *w->tasks);
        if (!w->tasks)
            return arl_errorf(ARL_ERR_NOMEM,
                              "rollout: tasks %lld: out of memory for the task list (lower "
                              "--tasks, or run the tasks in slices with --task-offset)",
                              (long long)c->tasks);
        w->n_tasks = c->tasks;
        for (int64_t i = 0; i < w->n_tasks; i++) {
            char id[64];
            snprintf(id, sizeof id, "task%lld", (long long)(c->task_offset + i));
            w->tasks[i].id = strdup(id);
            w->tasks[i].seed = (uint64_t)(c->task_seed + c->task_offset + i);
            w->tasks[i].data = arl_json_loads(c->task_data ? c->task_data : "{}", 0, NULL);
            if (!w->tasks[i].id || !w->tasks[i].data)
                return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        }
        return ARL_OK;
    }
    FILE *f = fopen(c->task_file, "r");
    if (!f) return arl_errorf(ARL_ERR_IO, "rollout: cannot open task-file %s", c->task_file);
    char *line = NULL;
    size_t cap = 0, cap_t = 0;
    ssize_t len;
    int64_t ln = 0;
    arl_status s = ARL_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        ln++;
        if (len <= 1 && (len == 0 || line[0] == '\n')) continue;
        if (c->tasks > 0 && w->n_tasks >= c->tasks) break;
        json_error_t je;
        json_t *j = arl_json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &je);
        if (!j && arl_json_error_nomem(&je)) {
            s = arl_errorf(ARL_ERR_NOMEM, "%s:%lld: out of memory", c->task_file, (long long)ln);
            break;
        }
        json_t *id = json_object_get(j, "id"), *seed = json_object_get(j, "seed"),
               *data = json_object_get(j, "data");
        if (!j || !json_is_string(id) || (seed && !json_is_integer(seed)) ||
            (data && !json_is_object(data))) {
            json_decref(j);
            s = arl_errorf(ARL_ERR_CONFIG,
                           "%s:%lld: expected {\"id\": string, \"seed\": integer, \"data\": "
                           "object}%s%s",
                           c->task_file, (long long)ln, j ? "" : ": ", j ? "" : je.text);
            break;
        }
        if ((size_t)w->n_tasks == cap_t) {
            cap_t = cap_t ? 2 * cap_t : 64;
            ro_task *v = realloc(w->tasks, cap_t * sizeof *v);
            if (!v) {
                json_decref(j);
                s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                break;
            }
            w->tasks = v;
        }
        ro_task *t = &w->tasks[w->n_tasks++];
        t->id = strdup(json_string_value(id));
        t->seed = seed ? (uint64_t)json_integer_value(seed)
                       : (uint64_t)(c->task_seed + c->task_offset + ln - 1);
        t->data = data ? json_incref(data) : json_object();
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (s == ARL_OK && w->n_tasks == 0)
        s = arl_errorf(ARL_ERR_CONFIG, "%s: no tasks", c->task_file);
    if (s == ARL_OK && c->tasks > w->n_tasks)
        arl_log_warn("rollout: tasks %lld, but task-file %s holds %lld: all of them are run",
                     (long long)c->tasks, c->task_file, (long long)w->n_tasks);
    return s;
}

/* A task's data as stored (tasks.data_json: compact, keys sorted); NULL when out of memory. */
static char *task_data_json(const ro_task *tk) {
    return arl_json_dumps(tk->data, JSON_COMPACT | JSON_SORT_KEYS);
}

arl_status ro_task_ensure(arl_rollout_worker *w, int64_t task) {
    if (w->group_ids[task]) return ARL_OK;
    const ro_task *tk = &w->tasks[task];
    char *data = task_data_json(tk);
    if (!data) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    replay_task_desc td = {.task_uid = tk->id, .env_name = w->info->name,
                           .seed = (int64_t)tk->seed, .data_json = data};
    arl_status s = replay_task_ensure(w->st, &td, &w->task_ids[task]);
    free(data);
    ARL_TRY(s);
    char g[REPLAY_UID_MAX + 1];
    ro_group_uid_of(w, task, g, sizeof g);
    replay_group_desc gd = {.group_uid = g, .run_id = w->run_id, .task_id = w->task_ids[task],
                            .env_id = w->env_id, .kind = w->cfg.group_kind,
                            .size = (int32_t)w->cfg.group_size, .admitted_version = w->eng.version,
                            .parent_seg_index = -1};
    return replay_group_ensure(w->st, &gd, &w->group_ids[task]);
}

/* ---- trajectories ---- */

arl_status ro_traj_new(arl_rollout_worker *w, int64_t task, int32_t gslot, int32_t attempt,
                       ro_traj **out) {
    *out = NULL;
    ro_traj *t = calloc(1, sizeof *t);
    if (!t) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    t->task_index = task;
    t->gslot = gslot;
    t->attempt = attempt;
    t->slot = -1;
    t->traj_id = -1;
    ro_group_uid_of(w, task, t->group_uid, sizeof t->group_uid);
    ro_traj_uid_of(t->uid, sizeof t->uid, t->group_uid, gslot, attempt);
    arl_rng_seed_stream(&t->rng, (uint64_t)w->cfg.seed, fnv1a(t->uid));
    arl_chat_conv_init(&t->conv);
    t->seg.route_bytes = w->eng.route_bytes;
    t->seg.rk = w->eng.n_moe * w->eng.k;
    t->ctx_vmin = t->ctx_vmax = -1;
    arl_status s = ro_engine_slot_join(&w->eng, &t->slot);
    if (s) {
        free(t);
        return arl_error_prefix(s, "rollout: no free decode slot");
    }
    if (w->cfg.reserve_context &&
        (s = arl_decode_state_reserve(&w->eng.st, t->slot, w->cfg.context_tokens)) != ARL_OK) {
        arl_decode_state_leave(&w->eng.st, t->slot);
        free(t);
        return s;
    }
    w->by_slot[t->slot] = t;
    t->next_all = w->all;
    w->all = t;
    w->n_live++;
    t->t0_ms = ro_now_ms();
    *out = t;
    return ARL_OK;
}

void ro_traj_destroy(arl_rollout_worker *w, ro_traj *t) {
    for (ro_traj **p = &w->all; *p; p = &(*p)->next_all)
        if (*p == t) {
            *p = t->next_all;
            break;
        }
    w->n_live--;
    if (t->slot >= 0) {
        arl_decode_state_leave(&w->eng.st, t->slot);
        w->by_slot[t->slot] = NULL;
    }
    arl_env_session_free(t->sess);
    arl_chat_conv_free(&t->conv);
    arl_env_action_clear(&t->action);
    if (t->have_parsed) arl_chat_turn_free(&t->parsed);
    ro_seg_free(&t->seg);
    free(t->media);
    free(t->e_tok);
    free(t->fin_calls);
    free(t->resume_note);
    free(t);
}

static int hook_commit(arl_rollout_worker *w, ro_traj *t, int32_t seg, int final) {
    if (w->hooks.on_commit && w->hooks.on_commit(w->hooks.user, t->uid, seg, final)) w->stop = 1;
    return w->stop;
}

/* 1 when the worker is to stop: a hook asked for it, now (hooks.stop) or at a commit. */
static int stop_asked(arl_rollout_worker *w) {
    if (!w->stop && w->hooks.stop && w->hooks.stop(w->hooks.user)) w->stop = 1;
    return w->stop;
}

/* The GC of this worker's states file (spec/replay.md 7.6, its writer's duty): stale 'writing'
 * states and unreferenced complete ones over an hour old deleted, state-cache applied and, when
 * budget, state-budget-bytes (9.3: least recently used first, running trajectories last).  Its
 * time counts as store time; the next periodic pass is due state-gc-interval-s later.  Never
 * loses what a resume needs: the boundary a running trajectory resumes from is referenced by
 * its last committed segment (kept by the garbage rule) and is its newest (kept by 'last');
 * only the budget could evict it, which is why the caller leaves the budget out while resumes
 * are pending (a cache miss then would only cost a prefill, but the state is right there). */
static arl_status gc_states(arl_rollout_worker *w, int budget) {
    replay_retention r = {.rollout = w->cfg.state_cache,
                          .budget_bytes = budget ? w->cfg.state_budget_bytes : 0,
                          .min_age_ms = -1};
    replay_gc_stats g;
    const double t0 = ro_mono_s();
    arl_status s = replay_states_retain(w->w, &r, &g);
    const double t1 = ro_mono_s();
    w->stats.store_s += t1 - t0;
    w->gc_next_s = t1 + (double)w->cfg.state_gc_interval_s;
    if (s) return arl_error_prefix(s, "rollout: GC of the states of %s", replay_writer_file(w->w));
    w->stats.state_gcs++;
    w->stats.states_deleted += g.deleted;
    w->stats.states_evicted += g.evicted;
    w->stats.state_bytes_freed += g.bytes_freed;
    if (g.evicted && budget && w->cfg.state_budget_bytes > 0)
        arl_log_info("rollout: states of %s: %lld stale deleted, %lld evicted (%lld bytes; "
                     "state-cache %s, state-budget-bytes %lld)",
                     replay_writer_file(w->w), (long long)g.deleted, (long long)g.evicted,
                     (long long)g.bytes_freed, w->cfg.state_cache,
                     (long long)w->cfg.state_budget_bytes);
    return ARL_OK;
}

/* After a commit: the periodic GC when it is due (once every resume has loaded its state),
 * else, with state-cache last (spec/replay.md 9.3), keep per running trajectory only its
 * newest boundary (the kda_boundary state and the mla_segment states since the last fresh
 * start) and nothing of final ones.  Other settings: nothing to do until the GC is due. */
static arl_status retain_states(arl_rollout_worker *w) {
    if (w->gc_next_s > 0 && w->next_resume >= w->n_resume && ro_mono_s() >= w->gc_next_s)
        return gc_states(w, 1);
    if (strcmp(w->cfg.state_cache, "last")) return ARL_OK;
    replay_retention r = {.rollout = "last", .budget_bytes = 0, .min_age_ms = -1};
    double t0 = ro_mono_s();
    arl_status s = replay_states_retain(w->w, &r, NULL);
    w->stats.store_s += ro_mono_s() - t0;
    return s;
}

static void finish_counts(arl_rollout_worker *w, ro_traj *t) {
    arl_rollout_stats *s = &w->stats;
    s->trajectories++;
    s->tokens += t->n_total - t->base_tokens; /* as `replay list` counts the stored row */
    s->turns += t->step - t->base_step;
}

/* Close the session after a final commit (DELETE is not recorded) and free t on its answer. */
static void close_session(arl_rollout_worker *w, ro_traj *t, const char *reason) {
    if (t->sess && *arl_env_session_id(t->sess) &&
        arl_env_session_delete_begin(t->sess, reason) == ARL_OK) {
        t->state = RO_T_DELETING;
        return;
    }
    ro_traj_destroy(w, t);
}

/* ---- client-fault alerting (spec/aep.md 8.6) ---- */

/* Fewest finished trajectories in the window before the masked fraction can halt admission (a
 * single early failure is not a rate). */
enum { WIN_MIN = 20 };

/* The code that occurs most in the window among masked entries, its count into *n; "" when
 * none (for the messages). */
static const char *win_top(const arl_rollout_worker *w, int32_t *n) {
    const char *best = "";
    *n = 0;
    for (int32_t i = 0; i < w->win->n; i++) {
        if (!w->win->masked[i]) continue;
        int32_t c = 0;
        for (int32_t j = 0; j < w->win->n; j++)
            c += w->win->masked[j] && !strcmp(w->win->code[i], w->win->code[j]);
        if (c > *n) {
            *n = c;
            best = w->win->code[i];
        }
    }
    return best;
}

static int32_t win_masked(const arl_rollout_worker *w) {
    int32_t m = 0;
    for (int32_t i = 0; i < w->win->n; i++)
        m += w->win->masked[i];
    return m;
}

/* A finished trajectory into the window (not for fork workers: their masks are the forks'
 * own, e.g. an environment that cannot fork); above alert-masked-frac masked (with at least
 * WIN_MIN finished) or more than alert-client-codes of one client-attributed code, no new group
 * is admitted from now on and the alert is logged once. */
static void win_push(arl_rollout_worker *w, int masked, const char *code, const char *attr) {
    if (w->n_forks || (code && !strcmp(code, "INTERRUPTED"))) return;
    const int32_t i = w->win->at;
    w->win->masked[i] = (uint8_t)(masked != 0);
    w->win->client[i] = (uint8_t)(masked && attr && !strcmp(attr, "client"));
    snprintf(w->win->code[i], sizeof w->win->code[i], "%s", masked && code ? code : "");
    w->win->at = (i + 1) % RO_WIN;
    if (w->win->n < RO_WIN) w->win->n++;
    w->win_run_n++;
    w->win_run_m += masked != 0;
    if (w->win->halted) return;
    const int32_t m = win_masked(w);
    /* only the new entry's code can have crossed the client-code limit */
    int32_t nc = 0;
    for (int32_t j = 0; w->win->client[i] && j < w->win->n; j++)
        nc += w->win->client[j] && !strcmp(w->win->code[j], w->win->code[i]);
    const int frac = w->win->n >= WIN_MIN && (double)m > w->cfg.alert_masked_frac * w->win->n;
    if (!frac && nc <= w->cfg.alert_client_codes) return;
    w->win->halted = 1;
    int32_t nt = 0;
    const char *top = win_top(w, &nt);
    if (frac)
        snprintf(w->win->alert, sizeof w->win->alert,
                 "%d of the last %d finished trajectories of environment %s@%s were masked "
                 "(over alert-masked-frac %g; most: %s, %d)",
                 (int)m, (int)w->win->n, w->info->name, w->info->version, w->cfg.alert_masked_frac,
                 top, (int)nt);
    else
        snprintf(w->win->alert, sizeof w->win->alert,
                 "the client-attributed code %s (a bug on agentrl's side) masked %d of the last %d "
                 "finished trajectories of environment %s@%s (over alert-client-codes %lld)",
                 w->win->code[i], (int)nc, (int)w->win->n, w->info->name, w->info->version,
                 (long long)w->cfg.alert_client_codes);
    arl_log_error("rollout: ALERT: %s: no new group is admitted to it (spec/aep.md 8.6); the "
                  "running trajectories finish; see 'agentrl replay list %s --status masked'",
                  w->win->alert, replay_store_root(w->st));
}

/* What the user can change when most masks in the window are code: the budgets behind
 * OBSERVATION_TOO_LONG are the run's own settings, not the environment's to mend ("" else). */
static const char *code_hint(const char *code) {
    return !strcmp(code, "OBSERVATION_TOO_LONG")
               ? " (a task's first observation must fit rollout.segment-tokens less "
                 "rollout.turn-tokens, each later one rollout.observation-tokens: raise them, or "
                 "the context stage's budget; 'replay show' gives the tokens and the limit)"
               : "";
}

/* After a run: the alert as an error, a run whose every trajectory an error masked as an
 * error (not an evaluation's: its report counts them), and a warning above 5 % masked in the
 * window. */
static arl_status win_verdict(arl_rollout_worker *w) {
    if (w->n_forks || (!w->win_run_n && !w->win->halted)) return ARL_OK;
    if (w->win->halted)
        return arl_errorf(ARL_ERR_ENV, "rollout: stopped admitting groups: %s", w->win->alert);
    const int32_t m = win_masked(w);
    int32_t nt = 0;
    const char *top = win_top(w, &nt);
    if (w->win_run_m == w->win_run_n && w->stats.env_errors >= w->win_run_m &&
        !(w->cfg.group_kind && !strcmp(w->cfg.group_kind, "eval"))) /* an eval measures it */
        return arl_errorf(ARL_ERR_ENV,
                          "rollout: every finished trajectory (%d) was masked by an error of "
                          "environment %s@%s or the client (most: %s, %d); see 'agentrl replay "
                          "list %s --status masked' and 'replay show' for the details%s",
                          (int)w->win_run_m, w->info->name, w->info->version, top, (int)nt,
                          replay_store_root(w->st), code_hint(top));
    if (20 * m > w->win->n)
        arl_log_warn("rollout: environment %s@%s: %d of the last %d finished trajectories were "
                     "masked (over 5%%; most: %s, %d)",
                     w->info->name, w->info->version, (int)m, (int)w->win->n, top, (int)nt);
    return ARL_OK;
}

arl_status ro_traj_mask(arl_rollout_worker *w, ro_traj *t, const char *code, const char *attr,
                        const char *end_cause, const char *detail, int with_segment) {
    replay_segment_desc d, *last = NULL;
    if (with_segment && t->seg.n > 0 && t->seg.last_step >= t->seg.first_step) {
        ARL_TRY(ro_seg_desc(w, t, with_segment == 2 ? "end" : "partial", -1, -1, &d));
        last = &d;
    }
    replay_finish f = {.status = REPLAY_MASKED, .end_cause = end_cause ? end_cause : "error",
                       .error_code = code, .error_attribution = attr,
                       .error_detail_json = detail, .outcome_reward = NAN,
                       .env_calls = t->fin_calls, .n_env_calls = t->n_fin_calls};
    double t0 = ro_mono_s();
    ARL_TRY(replay_traj_finish(w->w, t->traj_id, last, &f));
    w->stats.store_s += ro_mono_s() - t0;
    ARL_TRY(retain_states(w));
    arl_rollout_stats *s = &w->stats;
    s->masked++;
    if (last) {
        s->segments++;
        s->action_tokens += t->seg.n_action;
    }
    if (!strcmp(attr, "env") || !strcmp(attr, "infra") || !strcmp(attr, "client"))
        if (strcmp(code, "INTERRUPTED") && strcmp(code, "EPISODE_WALL_CLOCK")) s->env_errors++;
    if (!strcmp(code, "EPISODE_WALL_CLOCK")) s->wall_clock++;
    finish_counts(w, t);
    win_push(w, 1, code, attr);
    arl_log_info("rollout: %s masked: %s (%s)%s%s", t->uid, code, attr, detail ? " " : "",
                 detail ? detail : "");
    hook_commit(w, t, t->seg.seg_index, 1);
    if (w->cfg.refill_infra_masked && !strcmp(attr, "infra") && t->attempt == 0 &&
        t->task_index >= 0 &&
        strcmp(code, "INTERRUPTED") != 0 && strcmp(code, "EPISODE_WALL_CLOCK") != 0) {
        /* one new attempt for the slot (spec/objective.md 5.9); INTERRUPTED slots are refilled
         * by arl_rollout_worker_run when it builds the job list */
        if (w->n_jobs == w->cap_jobs) {
            size_t c = w->cap_jobs ? 2 * w->cap_jobs : 64;
            ro_job *v = realloc(w->jobs, c * sizeof *v);
            if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            w->jobs = v;
            w->cap_jobs = c;
        }
        w->jobs[w->n_jobs++] = (ro_job){t->task_index, t->gslot, 1};
    }
    close_session(w, t, !strcmp(code, "EPISODE_WALL_CLOCK") ? "wall_clock" : "error");
    return ARL_OK;
}

/* Mask because the call that just finished failed: its row goes with the final commit. */
static arl_status mask_call(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c,
                            int64_t step_index, int64_t seg_index, int with_segment) {
    int64_t seq;
    ARL_TRY(ro_record_call(t, c, 1, step_index, seg_index, &seq));
    if (c->endpoint == ARL_ENV_EP_STEP) {
        replay_turn *tu = ro_seg_find_turn(&t->seg, (int32_t)step_index);
        if (tu) tu->call_seq = seq;
    }
    const char *attr = arl_env_attribution_str(c->error.attribution);
    if (c->status != ARL_ERR_ENV) /* a local failure of the client (out of memory) */
        return arl_errorf(c->status, "rollout: %s: environment call failed locally: %s", t->uid,
                          c->error.message);
    /* the line of spec/aep.md 12.2 item 3: the environment, the step, the code's message and
     * the first violation of a malformed response */
    const char *ep = c->endpoint == ARL_ENV_EP_CREATE ? "create"
                     : c->endpoint == ARL_ENV_EP_STEP ? "step"
                                                      : "score";
    char env[200];
    snprintf(env, sizeof env, "%s@%s", w->info->name, w->info->version);
    json_t *j =
        json_pack("{s:s,s:i,s:s}", "endpoint", ep, "http_status", c->http_status, "env", env);
    if (j && step_index >= 0) json_object_set_new(j, "step_index", json_integer(step_index));
    if (j && c->error.message[0]) json_object_set_new(j, "message", json_string(c->error.message));
    if (j && c->error.violation[0])
        json_object_set_new(j, "violation", json_string(c->error.violation));
    if (j && c->endpoint == ARL_ENV_EP_CREATE &&
        (!strcmp(c->error.code_str, "SESSION_CLOSED") ||
         !strcmp(c->error.code_str, "TRAJECTORY_CONFLICT")))
        json_object_set_new(
            j, "hint",
            json_string("the environment has seen this trajectory_id before: the ids it gets are "
                        "'<traj_uid>@<the store's id>', so a copy of this store rolled out against "
                        "this server before (or the server does not keep ids apart); roll out "
                        "into a new store, or give the run its own run uid (rollout.run-uid; "
                        "spec/aep.md 3)"));
    char *detail = j ? arl_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!detail) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    const arl_status st =
        ro_traj_mask(w, t, c->error.code_str, attr, "error", detail, with_segment);
    free(detail);
    return st;
}


arl_status ro_encode_images(arl_rollout_worker *w, const ro_images *imgs, float **media,
                            int64_t *n_media) {
    *media = NULL;
    *n_media = 0;
    if (!imgs || !imgs->n) return ARL_OK;
    return arl_vision_encode_images(ro_engine_params(&w->eng), &w->eng.cfg, imgs->v, imgs->n,
                                    w->eng.tpl.image_max_patches, media, n_media);
}

arl_status ro_prefill_set(arl_rollout_worker *w, ro_traj *t, const int32_t *ids, int64_t n,
                          float *media, int64_t n_media) {
    (void)w;
    free(t->media);
    t->media = media;
    t->n_media = n_media;
    t->media_at = 0;
    int64_t at;
    ARL_TRY(ro_seg_append(&t->seg, ids, n, 0, &at));
    t->pf_at = at;
    t->pf_end = at + n;
    t->state = RO_T_PREFILL;
    return ARL_OK;
}

/* Track the versions of the context since the last fresh start. */
static void ctx_versions(ro_traj *t, int64_t v) {
    if (t->ctx_vmin < 0 || v < t->ctx_vmin) t->ctx_vmin = v;
    if (v > t->ctx_vmax) t->ctx_vmax = v;
}

/* Sample one token of the turn from a row of logits and append it as an action token. */
static arl_status sample_next(arl_rollout_worker *w, ro_traj *t, const float *logits) {
    float lp = 0;
    int32_t tok = arl_sample(&w->eng.smp, logits, &w->sp, &t->rng, &lp, NULL);
    int64_t at;
    ARL_TRY(ro_seg_append(&t->seg, &tok, 1, 1, &at));
    t->seg.logprobs[at] = lp;
    t->seg.versions[at] = (uint32_t)t->turn_version;
    if (t->seg.vmin < 0 || t->turn_version < t->seg.vmin) t->seg.vmin = t->turn_version;
    if (t->turn_version > t->seg.vmax) t->seg.vmax = t->turn_version;
    t->turn_n++;
    t->n_ctx++; /* the action is part of the context and the stream (rule 8's counts) */
    t->n_total++;
    t->pending = tok;
    int stop = 0;
    for (size_t i = 0; i < w->n_stop; i++)
        stop |= tok == w->stop_ids[i];
    t->turn_over = stop || t->turn_n >= w->L.L_turn;
    t->finish_length = !stop && t->turn_over;
    w->stats.decode_tokens++;
    return ARL_OK;
}

static arl_status start_turn(arl_rollout_worker *w, ro_traj *t, const float *logits) {
    t->turn_at = t->seg.n;
    t->turn_n = 0;
    t->turn_version = w->eng.version;
    t->turn_started_ms = ro_now_ms();
    ctx_versions(t, t->turn_version);
    t->state = RO_T_GENERATE;
    return sample_next(w, t, logits);
}

/* ---- ends ---- */

static arl_status begin_episode_score(arl_rollout_worker *w, ro_traj *t) {
    static const struct {
        const char *cause;
        arl_env_score_reason r;
    } map[] = {{"terminated", ARL_ENV_REASON_TERMINATED},
               {"env_truncated", ARL_ENV_REASON_TRUNCATED},
               {"context_budget", ARL_ENV_REASON_CONTEXT_BUDGET},
               {"turn_budget", ARL_ENV_REASON_TURN_BUDGET},
               {"action_too_large", ARL_ENV_REASON_ACTION_TOO_LARGE},
               {"wall_clock", ARL_ENV_REASON_WALL_CLOCK}};
    arl_env_score_reason r = ARL_ENV_REASON_TERMINATED;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].cause, t->out.end_cause)) r = map[i].r;
    ARL_TRY(arl_env_session_score_episode_begin(t->sess, r, 0));
    t->state = RO_T_SCORE_EP;
    return ARL_OK;
}

static arl_status begin_segment_score(arl_rollout_worker *w, ro_traj *t, ro_after after) {
    (void)w;
    t->after = after;
    ARL_TRY(arl_env_session_score_segment_begin(t->sess, t->seg.seg_index, t->seg.first_step,
                                                t->seg.last_step, 0));
    t->state = RO_T_SCORE_SEG;
    return ARL_OK;
}

/* The episode has ended (rules 1, 2, 8, wall clock, action_too_large): score the last segment
 * when segment rewards are used, then the episode. */
static arl_status begin_end(arl_rollout_worker *w, ro_traj *t) {
    if (w->segment_scores) return begin_segment_score(w, t, RO_AFTER_END);
    return begin_episode_score(w, t);
}

/* ---- sending a turn ---- */

static arl_status end_turn(arl_rollout_worker *w, ro_traj *t) {
    ro_seg *s = &t->seg;
    const int64_t n = t->turn_n, k = t->step + 1;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)s->tokens[t->turn_at + i];
    if (t->have_parsed) arl_chat_turn_free(&t->parsed);
    t->have_parsed = 0;
    arl_status st = arl_chat_parse_tool_calls(&w->eng.tpl, ids, (size_t)n, k, &t->conv, &t->parsed);
    free(ids);
    ARL_TRY(st);
    t->have_parsed = 1;
    arl_env_action_clear(&t->action);
    ARL_TRY(ro_action_from_turn(&w->eng.tpl, &t->parsed, n, &t->action));
    int64_t deadline = w->cfg.step_deadline_ms > 0 ? w->cfg.step_deadline_ms
                                                   : w->info->limits.default_step_timeout_ms;
    size_t body_len = 0;
    char *body = aep_step_request(k, &t->action, deadline, &body_len);
    char *action_json = arl_env_action_to_json(&t->action);
    if (!body || !action_json) {
        free(body);
        free(action_json);
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    replay_turn tu = {.step_index = (int32_t)k,
                      .act_tok_start = s->tok_start + t->turn_at,
                      .act_tok_end = s->tok_start + t->turn_at + n,
                      .obs_seg_index = -1, .obs_tok_start = -1, .obs_tok_end = -1,
                      .policy_version = t->turn_version,
                      .finish_reason = arl_env_finish_reason_str(t->action.finish_reason),
                      .parse_status = arl_env_parse_status_str(t->action.parse_status),
                      .n_tool_calls = t->action.n_tool_calls, .context = NULL, .reward = NAN,
                      .call_seq = -1, .started_at_ms = t->turn_started_ms,
                      .finished_at_ms = ro_now_ms(),
                      .action_json = ro_strs_take(&s->strs, action_json)};
    if (!tu.action_json) { /* (ro_strs_take freed it) */
        free(body);
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    ARL_TRY(ro_seg_add_turn(s, &tu, NULL));
    /* tool_calls rows: one per block in order; results are filled in from the observation */
    for (size_t i = 0; i < t->parsed.n_calls; i++) {
        const arl_chat_call *c = &t->parsed.calls[i];
        const char *status = arl_chat_parse_status_str(c->status);
        char *args = NULL;
        for (int32_t j = 0; j < t->action.n_tool_calls; j++)
            if (!strcmp(t->action.tool_calls[j].id, c->id) && t->action.tool_calls[j].arguments) {
                free(args);
                args = arl_json_dumps(t->action.tool_calls[j].arguments,
                                      JSON_COMPACT | JSON_PRESERVE_ORDER);
                if (!args) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            }
        for (int32_t j = 0; j < t->action.n_parse_errors; j++)
            if (!strcmp(t->action.parse_errors[j].id, c->id))
                status = arl_env_parse_status_str(t->action.parse_errors[j].status);
        replay_tool_call r = {.step_index = (int32_t)k, .call_index = (int32_t)i,
                              .call_id = ro_strs_cstr(&s->strs, c->id),
                              .name = c->name ? ro_strs_dup(&s->strs, c->name, c->name_len) : NULL,
                              .parse_status = status, .result_is_error = -1,
                              .result_error_code = NULL, .result_bytes = -1,
                              .result_truncated = -1,
                              .arguments_json = args ? ro_strs_take(&s->strs, args) : NULL};
        if (!r.call_id || (c->name && !r.name) || (args && !r.arguments_json)) {
            free(body);
            return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        }
        ARL_TRY(ro_seg_add_tool(s, &r));
    }
    s->last_step = (int32_t)k;
    w->stats.action_tokens += n;
    if ((int64_t)body_len > w->info->limits.max_request_bytes) {
        /* spec/aep.md 12.1: never sent; the client ends the episode (action_too_large) */
        replay_env_call r = {.call_seq = t->call_seq++, .endpoint = "step",
                             .session_id = ro_strs_cstr(&s->strs, arl_env_session_id(t->sess)),
                             .step_index = k, .segment_index = -1, .http_status = -1,
                             .attempts = 1,
                             .attempt_log_json = "{\"not_sent\":\"action_too_large\"}",
                             .started_at_ms = ro_now_ms(), .latency_ms = 0,
                             .response_complete = 0, .response_len = -1,
                             .request = (const uint8_t *)ro_strs_take(&s->strs, body),
                             .request_nbytes = body_len};
        if (!r.request || !r.session_id) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        ro_seg_find_turn(s, (int32_t)k)->call_seq = r.call_seq;
        ARL_TRY(ro_seg_add_call(s, &r));
        memset(&t->out, 0, sizeof t->out);
        t->out.kind = RO_END;
        t->out.end_cause = "action_too_large";
        return begin_end(w, t);
    }
    free(body);
    ARL_TRY(arl_env_session_step_begin(t->sess, &t->action, deadline));
    t->state = RO_T_STEPPING;
    return ARL_OK;
}

/* ---- segment commits ---- */

static arl_status commit_boundary(arl_rollout_worker *w, ro_traj *t) {
    int64_t end_id = -1, lat_id = -1;
    double t0 = ro_mono_s();
    if (!t->out.next_fresh && strcmp(w->cfg.state_cache, "off"))
        ARL_TRY(ro_states_put(w, t, &end_id, &lat_id));
    replay_segment_desc d;
    ARL_TRY(ro_seg_desc(w, t, t->out.boundary_cause, end_id, lat_id, &d));
    ARL_TRY(replay_segment_append(w->w, t->traj_id, &d));
    w->stats.store_s += ro_mono_s() - t0;
    ARL_TRY(retain_states(w));
    w->stats.segments++;
    int32_t idx = t->seg.seg_index;
    ro_seg *s = &t->seg;
    int fresh = t->out.next_fresh;
    int64_t tok_start = s->tok_start + s->n, ctx_start = fresh ? 0 : s->ctx_start + s->n;
    ro_seg_reset(s, idx + 1, fresh ? "fresh" : "continue", (int32_t)t->step + 1, tok_start,
                 ctx_start);
    if (fresh) {
        ARL_TRY(ro_engine_slot_reset(&w->eng, t->slot));
        t->n_ctx = 0;
        t->ctx_vmin = t->ctx_vmax = -1;
    }
    /* e opens the new segment: the observation (and the generation prompt) */
    float *media = t->e_media;
    t->e_media = NULL;
    ARL_TRY(ro_prefill_set(w, t, t->e_tok, t->e_n, media, t->e_n_media));
    t->n_ctx += t->e_n;
    t->n_total += t->e_n;
    hook_commit(w, t, idx, 0);
    return ARL_OK;
}

/* C_end: the last segment, the episode score's row, the outcome and the final status. */
/* spec/aep.md 4.8 rule 4: reward components /info does not declare are stored but not trained
 * on; one warning per name per worker (a rollout run, or a train update; the first 32 names). */
static void warn_undeclared(arl_rollout_worker *w, const arl_env_component *c, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        int known = 0;
        for (int32_t k = 0; !known && k < w->info->n_components; k++)
            known = !strcmp(w->info->components[k].name, c[i].name);
        for (size_t k = 0; !known && k < w->n_undeclared; k++)
            known = !strcmp(w->undeclared[k], c[i].name);
        if (known || w->n_undeclared == sizeof w->undeclared / sizeof w->undeclared[0]) continue;
        arl_log_warn("rollout: environment %s@%s sends the reward component '%s', which its "
                     "/info does not declare: stored, not used for training (spec/aep.md 4.8)",
                     w->info->name, w->info->version, c[i].name);
        snprintf(w->undeclared[w->n_undeclared++], sizeof w->undeclared[0], "%s", c[i].name);
    }
}

static arl_status commit_end(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c) {
    const arl_env_score_result *sr = &c->score;
    int64_t seq;
    ARL_TRY(ro_record_call(t, c, 1, -1, -1, &seq));
    warn_undeclared(w, sr->components, sr->n_components);
    ARL_TRY(ro_rewards_rows(t, "outcome", 0, sr->reward, sr->scorable, sr->components,
                            sr->n_components, seq, 1));
    const char *cause = t->out.end_cause;
    double outcome = sr->reward;
    if (!sr->scorable) {
        if (!strcmp(w->cfg.unscorable_outcome, "mask"))
            return ro_traj_mask(w, t, "UNSCORABLE", "none", cause, NULL, 2);
        outcome = w->info->level_lo[ARL_ENV_LEVEL_OUTCOME];
        replay_reward rd = {.level = "outcome", .scope_index = 0, .component = "@derived",
                            .source = "client", .value = outcome, .call_seq = seq};
        t->fin_rewards[t->n_fin_rewards++] = rd;
    }
    if (!strcmp(cause, "wall_clock") && !w->cfg.wall_clock_truncates)
        return ro_traj_mask(w, t, "EPISODE_WALL_CLOCK", "infra", "wall_clock", NULL, 2);
    replay_segment_desc d;
    ARL_TRY(ro_seg_desc(w, t, "end", -1, -1, &d));
    int complete = !strcmp(cause, "terminated");
    replay_finish f = {.status = complete ? REPLAY_COMPLETE : REPLAY_TRUNCATED,
                       .end_cause = cause, .outcome_reward = outcome,
                       .env_calls = t->fin_calls, .n_env_calls = t->n_fin_calls,
                       .rewards = t->fin_rewards, .n_rewards = t->n_fin_rewards};
    double t0 = ro_mono_s();
    ARL_TRY(replay_traj_finish(w->w, t->traj_id, &d, &f));
    w->stats.store_s += ro_mono_s() - t0;
    ARL_TRY(retain_states(w));
    arl_rollout_stats *s = &w->stats;
    s->segments++;
    if (complete)
        s->complete++;
    else {
        s->truncated++;
        static const char *const causes[4] = {"env_truncated", "context_budget", "turn_budget",
                                              "action_too_large"};
        for (int i = 0; i < 4; i++)
            if (!strcmp(cause, causes[i])) s->truncations[i]++;
        if (!strcmp(cause, "wall_clock")) s->wall_clock++;
    }
    s->outcome_sum += outcome;
    s->outcome_n++;
    if (outcome >= w->info->level_hi[ARL_ENV_LEVEL_OUTCOME] - 1e-9) s->successes++;
    finish_counts(w, t);
    win_push(w, 0, NULL, NULL);
    hook_commit(w, t, t->seg.seg_index, 1);
    close_session(w, t, complete || !strcmp(cause, "env_truncated") ? "completed" : cause);
    return ARL_OK;
}

/* ---- environment answers ---- */

/* The info's anchor (a copy in the segment's strings), NULL when it has none; *nomem set when
 * it has one that could not be copied. */
static const char *anchor_of(ro_traj *t, const json_t *info, int *nomem) {
    const json_t *a = info ? json_object_get(info, "anchor") : NULL;
    const char *c = json_is_string(a) ? ro_strs_cstr(&t->seg.strs, json_string_value(a)) : NULL;
    if (json_is_string(a) && !c) *nomem = 1;
    return c;
}

static arl_status tokens_copy(ro_traj *t, const int32_t *a, size_t na, const int32_t *b, size_t nb,
                              const int32_t *c, size_t nc) {
    size_t n = na + nb + nc;
    if ((int64_t)n > t->e_cap) {
        int32_t *p = realloc(t->e_tok, n * sizeof *p);
        if (!p) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        t->e_tok = p;
        t->e_cap = (int64_t)n;
    }
    memcpy(t->e_tok, a, na * sizeof *a);
    if (nb) memcpy(t->e_tok + na, b, nb * sizeof *b);
    if (nc) memcpy(t->e_tok + na + nb, c, nc * sizeof *c);
    t->e_n = (int64_t)n;
    return ARL_OK;
}

static arl_status on_create(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c) {
    if (c->status != ARL_OK) return mask_call(w, t, c, 0, -1, 0);
    const arl_env_result *res = &c->result;
    /* the initial context: the session's tool set and the observation's messages */
    char *tools = arl_json_dumps(res->obs.tools ? res->obs.tools : w->info->tools,
                                 JSON_COMPACT | JSON_PRESERVE_ORDER);
    arl_status s = tools ? arl_chat_conv_set_tools_json(&t->conv, tools, strlen(tools))
                         : arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    free(tools);
    ARL_TRY(s);
    ro_images imgs = {0};
    arl_chat_tokens e;
    arl_chat_tokens_init(&e);
    s = ro_conv_add_obs(&t->conv, &w->eng.tpl, &res->obs, &imgs);
    if (s == ARL_OK) s = arl_chat_render(&w->eng.tpl, &t->conv, 1, &e);
    if (s != ARL_OK) {
        ro_images_clear(&imgs);
        free(imgs.v);
        arl_chat_tokens_free(&e);
        return arl_error_prefix(s, "rollout: %s: rendering the initial observation", t->uid);
    }
    if ((int64_t)e.n > w->L.L_seg - w->L.L_turn) { /* rule 3 at creation: no segment */
        char detail[128];
        snprintf(detail, sizeof detail, "{\"tokens\":%zu,\"limit\":%lld}", e.n,
                 (long long)(w->L.L_seg - w->L.L_turn));
        ro_images_clear(&imgs);
        free(imgs.v);
        arl_chat_tokens_free(&e);
        int64_t seq;
        ARL_TRY(ro_record_call(t, c, 1, 0, -1, &seq));
        return ro_traj_mask(w, t, "OBSERVATION_TOO_LONG", "env", "error", detail, 0);
    }
    float *media = NULL;
    int64_t n_media = 0;
    s = ro_encode_images(w, &imgs, &media, &n_media);
    ro_images_clear(&imgs);
    free(imgs.v);
    if (s) {
        arl_chat_tokens_free(&e);
        return s;
    }
    ro_seg_reset(&t->seg, 0, "fresh", 1, 0, 0);
    int64_t seq;
    int nomem = 0;
    s = ro_record_call(t, c, 0, 0, -1, &seq);
    replay_turn tu = {.step_index = 0,
                      .act_tok_start = -1,
                      .act_tok_end = -1,
                      .obs_seg_index = 0,
                      .obs_tok_start = 0,
                      .obs_tok_end = (int64_t)e.n - w->gp_len,
                      .policy_version = -1,
                      .context = "reset",
                      .reward = NAN,
                      .call_seq = seq,
                      .anchor = anchor_of(t, res->info, &nomem),
                      .started_at_ms = ro_now_ms() - c->elapsed_ms,
                      .finished_at_ms = ro_now_ms()};
    if (s == ARL_OK && nomem) s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    if (s == ARL_OK) s = ro_seg_add_turn(&t->seg, &tu, NULL);
    if (s == ARL_OK) s = ro_prefill_set(w, t, e.ids, (int64_t)e.n, media, n_media);
    else free(media);
    t->n_ctx = t->n_total = (int64_t)e.n;
    t->step = 0;
    arl_chat_tokens_free(&e);
    t->paused_ms += c->queued_ms;
    return s;
}

/* Results of the calls answered by an observation's tool messages. */
static arl_status tool_results(ro_traj *t, int64_t k, const arl_env_observation *obs) {
    for (int32_t i = 0; i < obs->n_messages; i++) {
        const arl_env_message *m = &obs->messages[i];
        if (m->role != ARL_ENV_ROLE_TOOL || !m->tool_call_id) continue;
        for (size_t j = 0; j < t->seg.n_tools; j++) {
            replay_tool_call *r = &t->seg.tools[j];
            if (r->step_index != k || strcmp(r->call_id, m->tool_call_id)) continue;
            int64_t bytes = 0;
            if (m->content_is_parts) {
                for (int32_t p = 0; p < m->n_parts; p++)
                    if (m->parts[p].type == ARL_ENV_PART_TEXT && m->parts[p].text)
                        bytes += (int64_t)strlen(m->parts[p].text);
            } else if (m->content)
                bytes = (int64_t)strlen(m->content);
            r->result_is_error = m->is_error ? 1 : 0;
            r->result_error_code = m->is_error ? ro_strs_cstr(&t->seg.strs, m->error_code) : NULL;
            if (m->is_error && m->error_code && !r->result_error_code)
                return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            r->result_bytes = bytes;
            r->result_truncated = m->output_truncated ? 1 : 0;
        }
    }
    return ARL_OK;
}

/* Rule 5 (incremental form): the parsed turn, appended to the conversation, must render as the
 * generation prompt followed by exactly the sampled tokens.  *extra / *n_extra: the tokens the
 * rendering adds after them (the <|end_of_msg|> of a length stop), owned by *r. */
static arl_status check_turn(arl_rollout_worker *w, ro_traj *t, arl_chat_tokens *r, int *brk,
                             size_t *extra_at) {
    size_t a = t->conv.n_msgs;
    ARL_TRY(arl_chat_conv_add_turn(&t->conv, &w->eng.tpl, &t->parsed));
    ARL_TRY(arl_chat_render_messages(&w->eng.tpl, &t->conv, a, a + 1, r));
    const ro_seg *s = &t->seg;
    size_t want = (size_t)(w->gp_len + t->turn_n);
    *brk = 0;
    if (r->n < want || t->turn_at < w->gp_len)
        *brk = 1;
    else
        for (size_t i = 0; i < want && !*brk; i++)
            *brk = (uint32_t)r->ids[i] != s->tokens[t->turn_at - w->gp_len + (int64_t)i];
    if (!w->cfg.extension_check) *brk = 0;
    *extra_at = r->n < want ? r->n : want;
    return ARL_OK;
}

static arl_status on_step(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c) {
    const int64_t k = t->step + 1;
    if (c->status != ARL_OK) return mask_call(w, t, c, k, -1, 1);
    int64_t seq;
    ARL_TRY(ro_record_call(t, c, 0, k, -1, &seq));
    t->step = k;
    t->paused_ms += c->queued_ms;
    const arl_env_result *res = &c->result;
    replay_turn *tu = ro_seg_find_turn(&t->seg, (int32_t)k);
    tu->call_seq = seq;
    tu->context = arl_env_context_str(res->obs.context);
    tu->reward = res->reward;
    tu->terminated = res->terminated ? 1 : 0;
    tu->truncated = res->truncated && !res->terminated ? 1 : 0;
    int nomem = 0;
    tu->anchor = anchor_of(t, res->info, &nomem);
    if (nomem) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    tu->finished_at_ms = ro_now_ms();
    warn_undeclared(w, res->components, res->n_components);
    ARL_TRY(ro_rewards_rows(t, "process", k, res->reward, 1, res->components, res->n_components,
                            seq, 0));
    w->stats.process_sum += res->reward;
    w->stats.process_n++;
    ARL_TRY(tool_results(t, k, &res->obs));

    ro_step_facts f = {.terminated = res->terminated, .truncated = res->truncated, .k = k,
                       .n_seg = t->seg.n, .n_ctx = t->n_ctx, .n_total = t->n_total};
    f.wall_expired = w->cfg.wall_clock_s > 0 &&
                     (double)(ro_now_ms() - t->t0_ms - t->paused_ms) > 1000.0 * w->cfg.wall_clock_s;
    if (f.terminated || f.truncated || k >= w->L.K_max || f.wall_expired) {
        ro_step_rules(&w->L, &f, &t->out);
        return begin_end(w, t);
    }
    /* e: what the stream grows by (rules 4-7) */
    arl_chat_tokens r, o, full;
    arl_chat_tokens_init(&r);
    arl_chat_tokens_init(&o);
    arl_chat_tokens_init(&full);
    ro_images imgs = {0};
    size_t extra_at = 0;
    int64_t obs_a = 0, obs_b = 0;
    arl_status s = check_turn(w, t, &r, &f.template_break, &extra_at);
    f.reset = res->obs.context == ARL_ENV_CONTEXT_RESET;
    if (s == ARL_OK && f.reset) {
        char *tools = res->obs.tools
                          ? arl_json_dumps(res->obs.tools, JSON_COMPACT | JSON_PRESERVE_ORDER)
                      : t->conv.tools_json ? strdup(t->conv.tools_json)
                                           : NULL;
        const int tools_lost = !tools && (res->obs.tools || t->conv.tools_json);
        arl_chat_conv_free(&t->conv);
        t->conv_partial = 0;
        if (tools_lost)
            s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        else if (tools)
            s = arl_chat_conv_set_tools_json(&t->conv, tools, strlen(tools));
        free(tools);
        if (s == ARL_OK) s = ro_conv_add_obs(&t->conv, &w->eng.tpl, &res->obs, &imgs);
        if (s == ARL_OK) s = arl_chat_render(&w->eng.tpl, &t->conv, 1, &full);
        if (s == ARL_OK) s = tokens_copy(t, full.ids, full.n, NULL, 0, NULL, 0);
        obs_a = 0;
        obs_b = t->e_n - w->gp_len;
        f.template_break = 0;
    } else if (s == ARL_OK) {
        size_t n0 = t->conv.n_msgs;
        s = ro_conv_add_obs(&t->conv, &w->eng.tpl, &res->obs, &imgs);
        if (s == ARL_OK) s = arl_chat_render_messages(&w->eng.tpl, &t->conv, n0, t->conv.n_msgs, &o);
        f.obs_tokens = (int64_t)o.n;
        if (s == ARL_OK && f.template_break) {
            if (t->conv_partial)
                s = arl_errorf(ARL_ERR_STATE, "rollout: %s: template break after a resume "
                                              "(the conversation before it is not held)",
                               t->uid);
            if (s == ARL_OK) s = arl_chat_render(&w->eng.tpl, &t->conv, 1, &full);
            if (s == ARL_OK) s = tokens_copy(t, full.ids, full.n, NULL, 0, NULL, 0);
            obs_b = t->e_n - w->gp_len;
            obs_a = obs_b - (int64_t)o.n;
        } else if (s == ARL_OK) {
            s = tokens_copy(t, r.ids + extra_at, r.n - extra_at, o.ids, o.n, w->gp,
                            (size_t)w->gp_len);
            obs_a = (int64_t)(r.n - extra_at);
            obs_b = obs_a + (int64_t)o.n;
        }
    }
    arl_chat_tokens_free(&r);
    arl_chat_tokens_free(&o);
    arl_chat_tokens_free(&full);
    free(t->e_media);
    t->e_media = NULL;
    t->e_n_media = 0;
    int image_bad = 0; /* an image the environment sent does not decode */
    if (s == ARL_OK) {
        s = ro_encode_images(w, &imgs, &t->e_media, &t->e_n_media);
        image_bad = s == ARL_ERR_FORMAT || s == ARL_ERR_CORRUPT;
    }
    ro_images_clear(&imgs);
    free(imgs.v);
    if (image_bad) { /* the environment's fault (spec/aep.md 4.2 rule 3, 9 rule 2) */
        char env[200];
        snprintf(env, sizeof env, "%s@%s", w->info->name, w->info->version);
        json_t *j = json_pack("{s:s,s:I,s:s,s:s}", "endpoint", "step", "step_index",
                              (json_int_t)t->step, "env", env, "violation", arl_error_msg());
        char *detail = j ? arl_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(j);
        arl_error_clear();
        if (!detail) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        const arl_status st = ro_traj_mask(w, t, "MALFORMED_RESPONSE", "env", "error", detail, 1);
        free(detail);
        return st;
    }
    if (s != ARL_OK) {
        if (s == ARL_ERR_NOMEM || s == ARL_ERR_INTERNAL) return s;
        /* an observation the template or the vision front end cannot take: a client fault */
        char detail[600];
        json_t *j = json_pack("{s:s}", "reason", arl_error_msg());
        char *txt = j ? arl_json_dumps(j, JSON_COMPACT) : NULL;
        snprintf(detail, sizeof detail, "%s", txt ? txt : "{}");
        free(txt);
        json_decref(j);
        if (!txt) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        return ro_traj_mask(w, t, "X_CLIENT_RENDER", "client", "error", detail, 1);
    }
    f.e_len = t->e_n;
    ro_step_rules(&w->L, &f, &t->out);
    switch (t->out.kind) {
    case RO_END: return begin_end(w, t);
    case RO_MASK: {
        char detail[128];
        snprintf(detail, sizeof detail, "{\"tokens\":%lld,\"limit\":%lld}",
                 (long long)(f.reset ? f.e_len : f.obs_tokens),
                 (long long)(f.reset ? w->L.L_seg - w->L.L_turn : w->L.L_obs));
        return ro_traj_mask(w, t, t->out.mask_code, "env", "error", detail, 1);
    }
    case RO_APPEND: {
        tu->obs_seg_index = t->seg.seg_index;
        tu->obs_tok_start = t->seg.tok_start + t->seg.n + obs_a;
        tu->obs_tok_end = t->seg.tok_start + t->seg.n + obs_b;
        float *media = t->e_media;
        t->e_media = NULL;
        ARL_TRY(ro_prefill_set(w, t, t->e_tok, t->e_n, media, t->e_n_media));
        t->n_ctx += t->e_n;
        t->n_total += t->e_n;
        return ARL_OK;
    }
    case RO_BOUNDARY:
        tu->obs_seg_index = t->seg.seg_index + 1;
        tu->obs_tok_start = t->seg.tok_start + t->seg.n + obs_a;
        tu->obs_tok_end = t->seg.tok_start + t->seg.n + obs_b;
        if (w->segment_scores) return begin_segment_score(w, t, RO_AFTER_BOUNDARY);
        return commit_boundary(w, t);
    }
    return ARL_OK;
}

static arl_status on_score_segment(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c) {
    if (c->status == ARL_ERR_ENV && c->error.code == ARL_ENV_E_NOT_IMPLEMENTED) {
        /* spec/aep.md 8.3: fall back - the segment is unscored (q = 0, spec/objective.md 3.3) */
        int64_t seq;
        ARL_TRY(ro_record_call(t, c, 0, -1, t->seg.seg_index, &seq));
        replay_reward rd = {.level = "segment", .scope_index = t->seg.seg_index,
                            .component = "@derived", .source = "client", .value = 0.0,
                            .call_seq = seq};
        ARL_TRY(ro_seg_add_reward(&t->seg, &rd));
        if (t->after == RO_AFTER_BOUNDARY) return commit_boundary(w, t);
        return begin_episode_score(w, t);
    }
    if (c->status != ARL_OK) return mask_call(w, t, c, -1, t->seg.seg_index, 1);
    int64_t seq;
    ARL_TRY(ro_record_call(t, c, 0, -1, t->seg.seg_index, &seq));
    t->paused_ms += c->queued_ms;
    const arl_env_score_result *sr = &c->score;
    warn_undeclared(w, sr->components, sr->n_components);
    ARL_TRY(ro_rewards_rows(t, "segment", t->seg.seg_index, sr->reward, sr->scorable,
                            sr->components, sr->n_components, seq, 0));
    if (!sr->scorable) { /* spec/objective.md 3.3: q = 0 */
        replay_reward rd = {.level = "segment", .scope_index = t->seg.seg_index,
                            .component = "@derived", .source = "client", .value = 0.0,
                            .call_seq = seq};
        ARL_TRY(ro_seg_add_reward(&t->seg, &rd));
    } else {
        w->stats.segment_sum += sr->reward;
        w->stats.segment_n++;
    }
    if (t->after == RO_AFTER_BOUNDARY) return commit_boundary(w, t);
    return begin_episode_score(w, t);
}

static arl_status on_score_episode(arl_rollout_worker *w, ro_traj *t, const arl_env_call *c) {
    if (c->status != ARL_OK) return mask_call(w, t, c, -1, -1, 1);
    return commit_end(w, t, c);
}

static arl_status handle_done(arl_rollout_worker *w, arl_env_session *sess) {
    ro_traj *t = arl_env_session_user(sess);
    if (!t) return ARL_OK;
    const arl_env_call *c = arl_env_session_call(sess);
    double dt = (double)c->elapsed_ms / 1000.0;
    w->stats.env_s += dt;
    switch (t->state) {
    case RO_T_CREATING: return on_create(w, t, c);
    case RO_T_STEPPING: return on_step(w, t, c);
    case RO_T_SCORE_SEG: return on_score_segment(w, t, c);
    case RO_T_SCORE_EP: return on_score_episode(w, t, c);
    case RO_T_DELETING: ro_traj_destroy(w, t); return ARL_OK;
    default:
        return arl_errorf(ARL_ERR_INTERNAL, "rollout: %s: an environment answer in state %d",
                          t->uid, (int)t->state);
    }
}

/* ---- admission ---- */

static arl_status push_job(arl_rollout_worker *w, int64_t task, int32_t gslot, int32_t attempt) {
    if (w->n_jobs == w->cap_jobs) {
        size_t c = w->cap_jobs ? 2 * w->cap_jobs : 64;
        ro_job *v = realloc(w->jobs, c * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        w->jobs = v;
        w->cap_jobs = c;
    }
    w->jobs[w->n_jobs++] = (ro_job){task, gslot, attempt};
    return ARL_OK;
}

static arl_status start_job(arl_rollout_worker *w, const ro_job *j) {
    ARL_TRY(ro_task_ensure(w, j->task));
    ro_traj *t;
    ARL_TRY(ro_traj_new(w, j->task, j->gslot, j->attempt, &t));
    snprintf(t->pass_uid, sizeof t->pass_uid, "%s#p0", t->uid);
    replay_traj_desc d = {.traj_uid = t->uid, .run_id = w->run_id,
                          .group_id = w->group_ids[j->task], .task_id = w->task_ids[j->task],
                          .env_id = w->env_id, .slot = j->gslot, .attempt = j->attempt,
                          .policy_version = w->eng.version, .fork_seg_index = -1};
    const arl_status s = replay_traj_begin(w->w, &d, &t->traj_id);
    if (s == ARL_ERR_BUSY) { /* another worker of this run uid samples it: left to that one */
        arl_error_clear();
        ro_traj_destroy(w, t);
        w->left_to_others++;
        return ARL_OK;
    }
    ARL_TRY(s);
    const ro_task *tk = &w->tasks[j->task];
    char tid[ARL_AEP_MAX_ID_BYTES + 1], gid[ARL_AEP_MAX_ID_BYTES + 1];
    ARL_TRY(ro_env_id(w, t->uid, "", tid, sizeof tid));
    ARL_TRY(ro_env_id(w, t->group_uid, "", gid, sizeof gid));
    arl_env_create_req req = {.trajectory_id = tid,
                              .group_id = gid,
                              .task = {.id = tk->id, .seed = tk->seed, .data = tk->data},
                              .options = w->env_options};
    ARL_TRY(arl_env_session_create_begin(w->env, &req, &t->sess));
    arl_env_session_set_user(t->sess, t);
    t->state = RO_T_CREATING;
    return ARL_OK;
}

static arl_status admit(arl_rollout_worker *w) {
    while (!w->swap_pending && w->next_resume < w->n_resume &&
           w->n_live < (int32_t)w->cfg.batch_size)
        ARL_TRY(ro_resume_one(w, w->resume[w->next_resume++]));
    if (w->next_resume < w->n_resume) return ARL_OK; /* resumes first */
    while (!w->swap_pending && w->next_job < w->n_jobs && w->n_live < (int32_t)w->cfg.batch_size) {
        ro_job j = w->jobs[w->next_job++];
        /* after an alert (spec/aep.md 8.6) only the groups already admitted go on */
        if (w->win->halted && j.task >= 0 && j.task < w->n_tasks && !w->group_ids[j.task]) {
            w->stats.not_admitted++;
            continue;
        }
        ARL_TRY(start_job(w, &j));
    }
    return ARL_OK;
}

/* ---- the model passes ---- */

static int prefill_pass(arl_rollout_worker *w, arl_status *st) {
    ro_engine *e = &w->eng;
    const int64_t media_id = e->cfg.media_placeholder_token_id;
    int32_t N = 0;
    int64_t T = 0, n_media = 0;
    e->cu[0] = 0;
    for (ro_traj *t = w->all; t && N < e->o.n_slots && T < e->o.max_tokens; t = t->next_all) {
        if (t->state != RO_T_PREFILL) continue;
        int64_t c = t->pf_end - t->pf_at;
        if (c > e->o.max_tokens - T) c = e->o.max_tokens - T;
        int64_t ph = 0;
        for (int64_t i = 0; i < c; i++) {
            int32_t id = (int32_t)t->seg.tokens[t->pf_at + i];
            e->tok[T + i] = id;
            ph += id == media_id;
        }
        if (ph) {
            if (!t->media || t->media_at + ph > t->n_media) {
                *st = arl_errorf(ARL_ERR_INTERNAL, "rollout: %s: %lld image placeholders without "
                                                   "image rows",
                                 t->uid, (long long)ph);
                return 1;
            }
            memcpy(e->media + n_media * e->d, t->media + t->media_at * e->d,
                   sizeof(float) * (size_t)(ph * e->d));
        }
        w->pf_docs[N] = t;
        e->slots[N] = t->slot;
        w->want[N] = t->pf_at + c == t->pf_end;
        T += c;
        n_media += ph;
        e->cu[++N] = (int32_t)T;
    }
    if (!N) return 0;
    double t0 = ro_mono_s(), c0 = ro_cpu_s();
    *st = ro_engine_forward(e, N, e->slots, e->cu, e->tok, T, n_media ? e->media : NULL, n_media,
                            w->want, e->logits);
    w->stats.prefill_s += ro_mono_s() - t0;
    w->stats.prefill_cpu_s += ro_cpu_s() - c0;
    if (*st) return 1;
    w->stats.prefill_tokens += T;
    for (int32_t i = 0; i < N; i++) {
        ro_traj *t = w->pf_docs[i];
        int64_t c = e->cu[i + 1] - e->cu[i];
        ro_seg_set_routes(&t->seg, t->pf_at, c, e->routes, T, e->cu[i], e->n_moe, e->k);
        for (int64_t j = 0; j < c; j++) {
            int32_t id = (int32_t)t->seg.tokens[t->pf_at + j];
            t->seg.versions[t->pf_at + j] = (uint32_t)e->version;
            t->media_at += id == media_id;
        }
        ctx_versions(t, e->version);
        t->pf_at += c;
        if (t->pf_at == t->pf_end) {
            free(t->media);
            t->media = NULL;
            t->n_media = t->media_at = 0;
            *st = start_turn(w, t, e->logits + (int64_t)i * e->V);
            if (*st) return 1;
        }
    }
    return 1;
}

static int decode_pass(arl_rollout_worker *w, arl_status *st) {
    ro_engine *e = &w->eng;
    int32_t n = 0;
    for (ro_traj *t = w->all; t; t = t->next_all)
        if (t->state == RO_T_GENERATE) {
            w->gen[n] = t;
            e->slots[n] = t->slot;
            w->gen_tok[n] = t->pending;
            n++;
        }
    if (!n) return 0;
    double t0 = ro_mono_s(), c0 = ro_cpu_s();
    *st = ro_engine_decode(e, n, e->slots, w->gen_tok);
    w->stats.decode_s += ro_mono_s() - t0;
    w->stats.decode_cpu_s += ro_cpu_s() - c0;
    w->stats.decode_steps++;
    if (*st) return 1;
    for (int32_t i = 0; i < n && !*st; i++) {
        ro_traj *t = w->gen[i];
        ro_seg_set_routes(&t->seg, t->turn_at + t->turn_n - 1, 1, e->routes, n, i, e->n_moe, e->k);
        if (t->turn_over)
            *st = end_turn(w, t);
        else
            *st = sample_next(w, t, e->logits + (int64_t)i * e->V);
    }
    return 1;
}

arl_status ro_env_id(const arl_rollout_worker *w, const char *uid, const char *suffix, char *out,
                     size_t cap) {
    const int n = snprintf(out, cap, "%s%s%s", uid, w->env_tag, suffix);
    if (n < 0 || (size_t)n >= cap || n > ARL_AEP_MAX_ID_BYTES)
        return arl_errorf(ARL_ERR_ARG,
                          "rollout: %s: its environment id '%s%s%s' would be longer than %d bytes "
                          "(spec/aep.md 3); choose a shorter run uid",
                          uid, uid, w->env_tag, suffix, ARL_AEP_MAX_ID_BYTES);
    return ARL_OK;
}

/* ---- weights ---- */

/* Record policy version `version`, loaded from uri into params[which], with its weights hash. */
static arl_status version_record(arl_rollout_worker *w, int64_t version, const char *uri,
                                 int which) {
    char wsha[65];
    ro_engine_weights_sha256(&w->eng, which, wsha);
    replay_version_desc d = {.run_id = w->run_id, .version = version, .update_n = version > 0 ? version - 1 : -1,
                             .checkpoint_uri = uri, .weights_sha256 = wsha, .kl_coef = NAN};
    arl_status s = replay_version_add(w->st, &d);
    if (s == ARL_ERR_STATE) { /* recorded before with other content (another path): keep it */
        arl_error_clear();
        return ARL_OK;
    }
    return s;
}

arl_status arl_rollout_worker_publish(arl_rollout_worker *w, int64_t version, const char *ckpt_dir) {
    if (version <= w->eng.version)
        return arl_errorf(ARL_ERR_ARG, "rollout: policy version %lld is not newer than %lld",
                          (long long)version, (long long)w->eng.version);
    ARL_TRY(ro_engine_load_next(&w->eng, ckpt_dir, version));
    ARL_TRY(version_record(w, version, ckpt_dir, 1 - w->eng.cur));
    if (!w->swap_pending) w->swap_since_ms = ro_now_ms();
    w->swap_pending = 1;
    arl_log_info("rollout: policy version %lld loaded from %s; swapping in between turns",
                 (long long)version, ckpt_dir);
    return ARL_OK;
}

static arl_status poll_weights(arl_rollout_worker *w) {
    if (!w->cfg.policy_dir) return ARL_OK;
    int64_t now = ro_now_ms();
    if (now - w->last_poll_ms < w->cfg.policy_poll_ms) return ARL_OK;
    w->last_poll_ms = now;
    char path[4200];
    snprintf(path, sizeof path, "%s/LATEST", w->cfg.policy_dir);
    FILE *f = fopen(path, "r");
    if (!f) return ARL_OK; /* nothing published yet */
    long long v = -1;
    char rel[4096] = "";
    int got = fscanf(f, "%lld %4095s", &v, rel);
    fclose(f);
    if (got < 2 || v <= w->eng.version || (w->eng.have_next && v <= w->eng.next_version))
        return ARL_OK;
    char dir[8300];
    if (rel[0] == '/')
        snprintf(dir, sizeof dir, "%s", rel);
    else
        snprintf(dir, sizeof dir, "%s/%s", w->cfg.policy_dir, rel);
    return arl_rollout_worker_publish(w, v, dir);
}

static arl_status maybe_swap(arl_rollout_worker *w) {
    if (!w->swap_pending) return ARL_OK;
    for (ro_traj *t = w->all; t; t = t->next_all)
        if (t->state == RO_T_GENERATE) return ARL_OK;
    ARL_TRY(ro_engine_swap(&w->eng));
    int64_t waited = ro_now_ms() - w->swap_since_ms;
    for (ro_traj *t = w->all; t; t = t->next_all)
        t->paused_ms += waited; /* waiting for weights is not charged to the wall clock */
    w->swap_pending = 0;
    w->stats.versions_loaded++;
    arl_log_info("rollout: now sampling with policy version %lld", (long long)w->eng.version);
    return ARL_OK;
}

/* ---- progress ---- */

static void progress(arl_rollout_worker *w, int force) {
    if (w->cfg.progress_s <= 0 && !force) return;
    int64_t now = ro_now_ms();
    if (!force && (double)(now - w->last_progress_ms) < 1000.0 * w->cfg.progress_s) return;
    w->last_progress_ms = now;
    const arl_rollout_stats *s = &w->stats;
    double el = (double)(now - w->t_start_ms) / 1000.0;
    int64_t trunc = s->truncations[0] + s->truncations[1] + s->truncations[2] + s->truncations[3];
    arl_log_info("rollout: %lld/%lld trajectories (%lld complete, %lld truncated, %lld masked), %d "
                 "running; %.0f tokens/s (decode %.0f/s, prefill %.0f/s); env errors %lld; "
                 "truncations %lld; %.0f s",
                 (long long)s->trajectories,
                 (long long)(w->n_jobs + w->n_resume) - w->left_to_others, (long long)s->complete,
                 (long long)s->truncated, (long long)s->masked, w->n_live,
                 el > 0 ? (double)(s->decode_tokens + s->prefill_tokens) / el : 0.0,
                 s->decode_s > 0 ? (double)s->decode_tokens / s->decode_s : 0.0,
                 s->prefill_s > 0 ? (double)s->prefill_tokens / s->prefill_s : 0.0,
                 (long long)s->env_errors, (long long)trunc, el);
}

/* ---- open, run, close ---- */

static arl_status copy_config(arl_rollout_config *dst, const arl_rollout_config *src) {
    *dst = *src;
    for (size_t i = 0; i < arl_rollout_n_options; i++) {
        const arl_option *o = &arl_rollout_options[i];
        if (o->type != ARL_OPT_STRING && o->type != ARL_OPT_CHOICE) continue;
        char **f = (char **)((char *)dst + o->offset);
        if (*f && !(*f = strdup(*f))) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    return ARL_OK;
}

/* A fork worker's request (arl_rollout_fork): the parent and the caller's options. */
typedef struct fork_req {
    const replay_traj_row *parent;
    const arl_rollout_fork_opts *o;
} fork_req;

/* The run and policy version a fork worker's trajectories are recorded under, once its weights
 * are loaded (rollout.h arl_rollout_fork): run_uid (cap bytes) and w->eng.version. */
static arl_status fork_run_of(arl_rollout_worker *w, replay_store *st, const fork_req *f,
                              char *run_uid, size_t cap) {
    char wsha[65], rid[32];
    ro_engine_weights_sha256(&w->eng, w->eng.cur, wsha);
    snprintf(rid, sizeof rid, "%lld", (long long)f->parent->run_id);
    replay_run_info run = {0};
    ARL_TRY(replay_run_get(st, rid, &run));
    int64_t v = -1;
    arl_status s = replay_version_find(st, f->parent->run_id, wsha, w->ckpt_dir, &v, NULL);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        s = ARL_OK;
        v = -1;
    }
    const int64_t want = f->o ? f->o->version : -1;
    if (s == ARL_OK && want >= 0 && v != want) {
        char is[64] = "its weights are no version the run recorded";
        if (v >= 0) snprintf(is, sizeof is, "it is version %lld", (long long)v);
        s = arl_errorf(ARL_ERR_STATE, "fork: %s is not policy version %lld of run %s (%s)",
                       w->ckpt_dir, (long long)want, run.run_uid, is);
    }
    if (s == ARL_OK && v >= 0) {
        snprintf(run_uid, cap, "%s", run.run_uid);
        w->eng.version = v;
    } else if (s == ARL_OK) {
        snprintf(run_uid, cap, "%s/fork-%.12s", run.run_uid, wsha);
        w->eng.version = 0;
    }
    replay_run_info_free(&run);
    return s;
}

/* A run uid names its groups (<run-uid>/g<task-offset + i>), so a rollout into a store that holds
 * groups of that name continues the run that wrote them: it samples only the (task, slot) pairs
 * not stored yet (build_jobs).  Before anything is written, each such group must be this run's
 * task i (uid, seed, data, environment), kind and group size: another run with the same run uid
 * and other tasks or settings would otherwise add its trajectories to groups of other tasks
 * (baselines over mixed tasks) or skip its own tasks unsampled, both silently. */
static arl_status groups_check(arl_rollout_worker *w) {
    const arl_rollout_config *c = &w->cfg;
    if (!replay_store_has_catalog(w->st)) return ARL_OK; /* (no groups) */
    int64_t run_id;
    const arl_status rs = replay_run_find(w->st, c->run_uid, &run_id);
    if (rs == ARL_ERR_NOT_FOUND) { /* a new run: no group of its name (one query per task took
                                      10 s of silence at a million tasks) */
        arl_error_clear();
        return ARL_OK;
    }
    ARL_TRY(rs);
    for (int64_t i = 0; i < w->n_tasks; i++) {
        char g[REPLAY_UID_MAX + 1];
        ro_group_uid_of(w, i, g, sizeof g);
        replay_group_row row;
        const arl_status s = replay_group_get(w->st, g, &row);
        if (s == ARL_ERR_NOT_FOUND) {
            arl_error_clear();
            continue;
        }
        ARL_TRY(s);
        const ro_task *tk = &w->tasks[i];
        char *data = task_data_json(tk), sha[65];
        if (!data) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        replay_sha256_hex(data, strlen(data), sha);
        free(data);
        const char *what = strcmp(row.task_uid, tk->id)          ? "task"
                           : row.task_seed != (int64_t)tk->seed  ? "task seed"
                           : strcmp(row.task_data_sha256, sha)   ? "task data"
                           : strcmp(row.task_env, w->info->name) ? "environment"
                           : strcmp(row.kind, c->group_kind)     ? "group kind"
                           : row.size != (int32_t)c->group_size  ? "group size"
                                                                 : NULL;
        if (!what) continue;
        return arl_errorf(
            ARL_ERR_STATE,
            "rollout: the store already holds group '%s' (run uid '%s'), a '%s' group of %d "
            "samples of task %s (seed %lld) of environment %s; this run's task %lld is %s "
            "(seed %lld) of %s in '%s' groups of %lld: the %s differs.  A rollout with a stored "
            "run uid continues that run (sampling only its missing trajectories), so it needs "
            "the same tasks and settings; give this run its own --run-uid (rollout.run-uid, "
            "default 'rollout') or a --task-offset past the stored tasks",
            g, c->run_uid, row.kind, (int)row.size, row.task_uid, (long long)row.task_seed,
            row.task_env, (long long)i, tk->id, (long long)tk->seed, w->info->name, c->group_kind,
            (long long)c->group_size, what);
    }
    return ARL_OK;
}

/* The settings that decide what a trajectory of a run is: how it is sampled, budgeted, ended
 * and scored.  A continue (the run uid of a stored run) must keep them; the others (threads,
 * batch size, device, state cache, progress, alerts, deadlines) may change between runs. */
static const char *const ro_run_keys[] = {
    "temperature",
    "top-p",
    "seed",
    "segment-tokens",
    "turn-tokens",
    "observation-tokens",
    "context-tokens",
    "trajectory-tokens",
    "max-turns",
    "wall-clock-s",
    "wall-clock-truncates",
    "segment-scores",
    "unscorable-outcome",
    "mla-sparse-topk",
    "mla-sparse-chunk",
    "env-config",
    "env-options",
};

/* Equal values, JSON text (env-config, env-options) compared as the values it holds. */
static int same_setting(const json_t *x, const json_t *y) {
    if (json_equal((json_t *)x, (json_t *)y)) return 1;
    if (!json_is_string(x) || !json_is_string(y)) return 0;
    json_t *px = arl_json_loads(json_string_value(x), JSON_DECODE_ANY, NULL);
    json_t *py = arl_json_loads(json_string_value(y), JSON_DECODE_ANY, NULL);
    const int eq = px && py && json_equal(px, py);
    if (px) json_decref(px);
    if (py) json_decref(py);
    return eq;
}

/* A rollout that continues a stored run must sample as the run did: its trajectories join the
 * run's groups (baselines) and its resumes continue the run's trajectories.  The run's recorded
 * configuration is compared key by key (ro_run_keys; a key the record lacks, from an older
 * build, is not compared); the differing keys are named. */
static arl_status settings_check(arl_rollout_worker *w) {
    const arl_rollout_config *c = &w->cfg;
    replay_run_info run = {0};
    arl_status s = replay_run_get(w->st, c->run_uid, &run);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        return ARL_OK;
    }
    ARL_TRY(s);
    char *now = arl_options_to_json(arl_rollout_options, arl_rollout_n_options, c);
    /* (out of memory reading either is this process's: never a run without settings to compare,
     * nor a setting that differs) */
    const unsigned long n0 = arl_nomem_count();
    json_t *a = run.config_json ? arl_json_loads(run.config_json, 0, NULL) : NULL;
    json_t *b = now ? arl_json_loads(now, 0, NULL) : NULL;
    free(now);
    char diff[1024] = "";
    size_t k = 0, n = 0;
    if (!b || (run.config_json && !a && arl_nomem_count() != n0))
        s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    for (size_t i = 0; s == ARL_OK && a && i < sizeof ro_run_keys / sizeof *ro_run_keys; i++) {
        const json_t *x = json_object_get(a, ro_run_keys[i]),
                     *y = json_object_get(b, ro_run_keys[i]);
        if (!x || !y) continue;
        const unsigned long n1 = arl_nomem_count();
        const int same = same_setting(x, y);
        if (arl_nomem_count() != n1) {
            s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            break;
        }
        if (same) continue;
        char *xs = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT),
             *ys = json_dumps(y, JSON_ENCODE_ANY | JSON_COMPACT);
        if (k < sizeof diff)
            k += (size_t)snprintf(diff + k, sizeof diff - k, "%s%s %.80s -> %.80s", n ? ", " : "",
                                  ro_run_keys[i], xs ? xs : "?", ys ? ys : "?");
        free(xs);
        free(ys);
        n++;
    }
    if (s == ARL_OK && n)
        s = arl_errorf(ARL_ERR_STATE,
                       "rollout: run uid '%s' of the store was sampled with other settings (%s): "
                       "a rollout with a stored run uid continues that run, so it needs its "
                       "settings; give this one its own --run-uid (rollout.run-uid)",
                       c->run_uid, diff);
    if (a) json_decref(a);
    if (b) json_decref(b);
    replay_run_info_free(&run);
    return s;
}

/* A rollout that continues a stored run (its run uid) at a policy version the run records must
 * hold the weights recorded for that version: its trajectories join the run's groups as samples
 * of that version, and its resumes start from the run's cached states of that version.  Another
 * path to the same weights is the same version (version_record keeps the first path). */
static arl_status version_check(arl_rollout_worker *w) {
    const arl_rollout_config *c = &w->cfg;
    int64_t run_id;
    replay_version_row row;
    arl_status s = replay_run_find(w->st, c->run_uid, &run_id);
    if (s == ARL_OK) s = replay_version_get(w->st, run_id, w->eng.version, &row);
    if (s == ARL_ERR_NOT_FOUND) { /* a new run, or a version it has not recorded */
        arl_error_clear();
        return ARL_OK;
    }
    ARL_TRY(s);
    char wsha[65];
    ro_engine_weights_sha256(&w->eng, w->eng.cur, wsha);
    if (!row.weights_sha256[0] || !strcmp(row.weights_sha256, wsha)) return ARL_OK;
    return arl_errorf(
        ARL_ERR_STATE,
        "rollout: run uid '%s' of the store records policy version %lld as the weights of %s "
        "(sha256 %.12s...), but %s holds other weights (sha256 %.12s...).  A rollout with a "
        "stored run uid continues that run at its version; give this checkpoint its own "
        "--run-uid, or its own --policy-version if it is a later version of the same run",
        c->run_uid, (long long)w->eng.version, row.checkpoint_uri[0] ? row.checkpoint_uri : "?",
        row.weights_sha256, w->ckpt_dir, wsha);
}

static arl_status worker_open(const arl_rollout_config *cfg, const char *ckpt_dir, replay_store *st,
                              replay_file_kind kind, int32_t shard_id,
                              const arl_rollout_hooks *hooks, int with_tasks, const fork_req *fork,
                              arl_rollout_worker **out) {
    *out = NULL;
    ARL_TRY(arl_rollout_config_validate(cfg));
    arl_rollout_worker *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    arl_status s = copy_config(&w->cfg, cfg);
    if (s) {
        free(w);
        return s;
    }
    *out = w;
    if (hooks) w->hooks = *hooks;
    const arl_rollout_config *c = &w->cfg;
    w->L = (ro_limits){c->segment_tokens, c->turn_tokens, c->observation_tokens,
                       c->context_tokens, c->trajectory_tokens, c->max_turns};
    if (!realpath(ckpt_dir, w->ckpt_dir)) snprintf(w->ckpt_dir, sizeof w->ckpt_dir, "%s", ckpt_dir);
    if (c->threads > 0) ARL_TRY(arl_k_threads_init((int)c->threads));
    ro_engine_opts eo = {.n_slots = (int32_t)c->batch_size,
                         .max_tokens = c->prefill_chunk,
                         .max_context = c->context_tokens,
                         .max_context_key = "the rollout's context-tokens",
                         .sparse_topk = c->mla_sparse_topk,
                         .sparse_chunk = c->mla_sparse_chunk,
                         .device = !strcmp(c->device, "cpu")          ? NULL
                                   : !strcmp(c->device, "cpu-device") ? "cpu"
                                                                      : c->device,
                         .bf16_weights = c->device_bf16,
                         .decode_graphs = c->device_graphs,
                         .device_index = (int32_t)c->device_index};
    ARL_TRY(ro_engine_open(&w->eng, w->ckpt_dir, c->policy_version, &eo));
    w->sp = (arl_sample_params){.temperature = c->temperature, .top_p = c->top_p};
    ARL_TRY(arl_sample_params_check(&w->sp));
    w->n_stop = arl_chat_stop_tokens(&w->eng.tpl, w->stop_ids);
    {
        arl_chat_conv empty;
        arl_chat_tokens g;
        arl_chat_conv_init(&empty);
        arl_chat_tokens_init(&g);
        s = arl_chat_render_gen_prompt(&w->eng.tpl, &empty, &g);
        if (s == ARL_OK && g.n > sizeof w->gp / sizeof w->gp[0])
            s = arl_errorf(ARL_ERR_INTERNAL, "rollout: generation prompt of %zu tokens", g.n);
        if (s == ARL_OK) {
            memcpy(w->gp, g.ids, g.n * sizeof(int32_t));
            w->gp_len = (int64_t)g.n;
        }
        arl_chat_tokens_free(&g);
        arl_chat_conv_free(&empty);
        ARL_TRY(s);
    }
    /* environment */
    arl_env_client_config cc;
    arl_env_client_config_default(&cc);
    cc.backoff_base_ms = c->env_backoff_ms;
    cc.seed = (uint64_t)c->seed;
    ARL_TRY(arl_env_client_open(&cc, &w->client));
    char where[1024];
    if (!strncmp(c->env, "http://", 7) || !strncmp(c->env, "https://", 8) ||
        !strncmp(c->env, "builtin:", 8))
        snprintf(where, sizeof where, "%s", c->env);
    else
        snprintf(where, sizeof where, "builtin:%s", c->env);
    s = arl_env_open(w->client, where, c->env_config, &w->env);
    if (s) {
        const arl_env_error *ee = w->env ? arl_env_last_error(w->env) : NULL;
        if (!ee && strstr(arl_error_msg(), where)) /* the message names it already */
            return arl_error_prefix(s, "rollout");
        return arl_error_prefix(s, "rollout: environment %s%s%s", where, ee ? ": " : "",
                                ee ? ee->message : "");
    }
    w->info = arl_env_get_info(w->env);
    /* the alert window: the caller's (kept across its workers) or this worker's own */
    w->win = w->hooks.window ? w->hooks.window : &w->win_own;
    {
        char env[sizeof w->win->env];
        snprintf(env, sizeof env, "%s@%s", w->info->name, w->info->version);
        if (strcmp(env, w->win->env)) { /* another environment's entries: start afresh */
            memset(w->win, 0, sizeof *w->win);
            snprintf(w->win->env, sizeof w->win->env, "%s", env);
        }
    }
    w->segment_scores = c->segment_scores && w->info->caps.segment_score;
    if (w->info->caps.multimodal && !w->eng.cfg.has_vision)
        return arl_errorf(ARL_ERR_CONFIG,
                          "rollout: environment %s sends images (capabilities.multimodal) but the "
                          "model at %s has no vision_config",
                          w->info->name, w->ckpt_dir);
    if (c->env_options) {
        json_error_t je;
        if (!(w->env_options = arl_json_loads(c->env_options, 0, &je)))
            return arl_json_error_nomem(&je)
                       ? arl_errorf(ARL_ERR_NOMEM, "rollout: key 'env-options': out of memory")
                       : arl_errorf(ARL_ERR_CONFIG, "key 'env-options': invalid JSON");
    }
    if (with_tasks) ARL_TRY(tasks_load(w));
    /* store */
    w->st = st;
    if (replay_store_uid(st)[0])
        snprintf(w->env_tag, sizeof w->env_tag, "@%.12s", replay_store_uid(st));
    if (with_tasks) ARL_TRY(groups_check(w));
    if (with_tasks) ARL_TRY(settings_check(w));
    if (with_tasks) ARL_TRY(version_check(w));
    char run_uid[REPLAY_UID_MAX + 1];
    snprintf(run_uid, sizeof run_uid, "%s", c->run_uid);
    if (fork) {
        w->fork_any_state = fork->o && fork->o->use_rollout_state;
        ARL_TRY(fork_run_of(w, st, fork, run_uid, sizeof run_uid));
    }
    if (stop_asked(w)) /* (an interrupt while the model loaded: nothing written yet) */
        return arl_errorf(ARL_ERR_CANCELLED, "rollout: stopped before writing to the store");
    ARL_TRY(replay_writer_open(st, kind, shard_id, run_uid, &w->w));
    char *cfg_json = arl_options_to_json(arl_rollout_options, arl_rollout_n_options, c);
    char *model_json = arl_model_config_dumps(&w->eng.cfg);
    replay_run_desc rd = {
        .run_uid = run_uid, .config_json = cfg_json, .model_config_json = model_json};
    s = cfg_json && model_json ? replay_run_ensure(st, &rd, &w->run_id)
                               : arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    free(cfg_json);
    free(model_json);
    ARL_TRY(s);
    size_t info_len;
    const char *info_body = arl_env_info_body(w->env, &info_len);
    char *info_copy = strndup(info_body, info_len);
    replay_env_desc ed = {.name = w->info->name, .version = w->info->version,
                          .info_json = info_copy,
                          .transport = arl_env_is_remote(w->env) ? "http" : "c_abi",
                          .base_url = arl_env_is_remote(w->env) ? c->env : NULL};
    s = info_copy ? replay_env_ensure(st, &ed, &w->env_id)
                  : arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    free(info_copy);
    ARL_TRY(s);
    ARL_TRY(version_record(w, w->eng.version, w->ckpt_dir, w->eng.cur));
    w->group_ids = calloc((size_t)w->n_tasks + 1, sizeof(int64_t));
    w->task_ids = calloc((size_t)w->n_tasks + 1, sizeof(int64_t));
    const size_t B = (size_t)c->batch_size;
    w->by_slot = calloc(B, sizeof *w->by_slot);
    w->gen = calloc(B, sizeof *w->gen);
    w->gen_tok = calloc(B, sizeof *w->gen_tok);
    w->want = calloc(B, sizeof *w->want);
    w->pf_docs = calloc(B, sizeof *w->pf_docs);
    w->row = calloc((size_t)w->eng.V, sizeof(float));
    if (!w->group_ids || !w->task_ids || !w->by_slot || !w->gen || !w->gen_tok || !w->want ||
        !w->pf_docs || !w->row)
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    return ARL_OK;
}

arl_status arl_rollout_worker_open(const arl_rollout_config *cfg, const char *ckpt_dir,
                                   replay_store *st, int32_t shard_id,
                                   const arl_rollout_hooks *hooks, arl_rollout_worker **out) {
    return worker_open(cfg, ckpt_dir, st, REPLAY_FILE_WORKER, shard_id, hooks, 1, NULL, out);
}

const char *ro_fork_group_of(const arl_rollout_worker *w, int64_t traj_id) {
    for (size_t i = 0; i < w->n_forks; i++)
        if (w->fork_ids[i] == traj_id) return w->fork_groups[i];
    return "";
}

/* The group of the forks of one point: o_group when given, else "<parent>/fork<S>", or
 * "<parent>/fork<S>.<first>" when forks of this point exist already (a group of its own for each
 * fork command). */
static void fork_group_uid(const replay_traj_row *p, int32_t n_prefix, int32_t first,
                           const char *o_group, char guid[REPLAY_UID_MAX + 1]) {
    if (o_group && *o_group)
        snprintf(guid, REPLAY_UID_MAX + 1, "%s", o_group);
    else if (first == 0)
        snprintf(guid, REPLAY_UID_MAX + 1, "%s/fork%d", p->traj_uid, (int)n_prefix);
    else
        snprintf(guid, REPLAY_UID_MAX + 1, "%s/fork%d.%d", p->traj_uid, (int)n_prefix, (int)first);
}

/* The forks' group guid, if the catalog has it already, must be a fork group of this very fork
 * point that nothing has joined yet (one that a fork command created before it stopped): the
 * members of a group are fixed once they are recorded (spec/replay.md 13.7 step 3), and forks
 * recorded into a training group would replace its members. */
static arl_status fork_group_check(replay_store *st, const replay_traj_row *p, int32_t n_prefix,
                                   int32_t count, const char *guid) {
    replay_group_row g;
    const arl_status s = replay_group_get(st, guid, &g);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        return ARL_OK;
    }
    ARL_TRY(s);
    if (strcmp(g.kind, "fork"))
        return arl_errorf(ARL_ERR_ARG,
                          "fork: group '%s' already exists as a '%s' group of the store (its "
                          "members would be replaced): forks go in a fork group of their own; "
                          "give a new --group-uid, or leave it out (default %s/fork%d)",
                          guid, g.kind, p->traj_uid, (int)n_prefix);
    if (strcmp(g.parent_traj_uid, p->traj_uid) || g.parent_seg_index != n_prefix - 1)
        return arl_errorf(ARL_ERR_ARG,
                          "fork: group '%s' already holds the forks of %s at --segment %d, not "
                          "of %s at --segment %d; give a new --group-uid, or leave it out",
                          guid, g.parent_traj_uid, (int)g.parent_seg_index + 1, p->traj_uid,
                          (int)n_prefix);
    if (g.n_members > 0 || g.size != count)
        return arl_errorf(ARL_ERR_ARG,
                          "fork: group '%s' already holds %lld of %d forks of %s at --segment "
                          "%d, and a group's members are fixed once recorded; give a new "
                          "--group-uid, or leave it out (these forks then go in a group of "
                          "their own, after the existing ones)",
                          guid, (long long)g.n_members, (int)g.size, p->traj_uid, (int)n_prefix);
    return ARL_OK; /* an empty fork group of this point and size: the forks join it */
}

/* A fork point checked before anything is written: its parent's row, the index of the first
 * of its forks (after those of earlier forks at the same point, <parent>/f<S>.<i>) and their
 * group (fork_group_uid, checked by fork_group_check). */
static arl_status fork_point_check(replay_store *st, const arl_rollout_fork_point *pt,
                                   const char *o_group, replay_traj_row *p, int32_t *first,
                                   char guid[REPLAY_UID_MAX + 1]) {
    ARL_TRY(replay_traj_get(st, pt->parent, p));
    const int32_t n_prefix = pt->n_prefix;
    if (pt->count < 1)
        return arl_errorf(ARL_ERR_RANGE, "fork: %s: a count of %d forks", p->traj_uid,
                          (int)pt->count);
    if (n_prefix < 1 ||
        n_prefix > p->n_segments + (p->fork_seg_index >= 0 ? p->fork_seg_index + 1 : 0))
        return arl_errorf(ARL_ERR_RANGE, "fork: %s has %d committed segments, --segment %d",
                          p->traj_uid, (int)p->n_segments, (int)n_prefix);
    /* the fork point must be a boundary inside the parent */
    replay_seg_ref *refs = NULL;
    size_t nref = 0;
    arl_status s = replay_traj_segments(st, p->traj_id, &refs, &nref);
    if (s == ARL_OK && (size_t)n_prefix <= nref &&
        strcmp(refs[n_prefix - 1].end_cause, "token_budget")) {
        int32_t last_inner = -1; /* the last segment that ends at the token budget */
        for (size_t i = 0; i < nref; i++)
            if (!strcmp(refs[i].end_cause, "token_budget")) last_inner = (int32_t)i;
        char where[96];
        if (last_inner >= 0)
            snprintf(where, sizeof where, "its boundaries are --segment 1..%d", last_inner + 1);
        else
            snprintf(where, sizeof where, "it has no such boundary (one segment)");
        s = arl_errorf(ARL_ERR_RANGE,
                       "fork: segment %d of %s ends '%s', not at the segment token budget: a "
                       "fork continues a boundary inside the trajectory, and %s",
                       (int)n_prefix - 1, p->traj_uid, refs[n_prefix - 1].end_cause, where);
    }
    free(refs);
    for (*first = 0; s == ARL_OK; (*first)++) {
        char u[REPLAY_UID_MAX + 1];
        replay_traj_row t;
        snprintf(u, sizeof u, "%s/f%d.%d", p->traj_uid, (int)n_prefix, (int)*first);
        const arl_status g = replay_traj_get(st, u, &t);
        if (g == ARL_ERR_NOT_FOUND) {
            arl_error_clear();
            break;
        }
        if (g != ARL_OK) s = g;
    }
    if (s != ARL_OK) return s;
    fork_group_uid(p, n_prefix, *first, o_group, guid);
    return fork_group_check(st, p, n_prefix, pt->count, guid);
}

/* Begin the forks of one checked point in the fork worker: its group guid (fork_point_check)
 * and `count` trajectories queued to continue; their uids into uids. */
static arl_status fork_point_begin(arl_rollout_worker *w, const replay_traj_row *p,
                                   const arl_rollout_fork_point *pt, int32_t first,
                                   const char *guid, char (*uids)[REPLAY_UID_MAX + 1]) {
    const int32_t n_prefix = pt->n_prefix;
    replay_group_desc gd = {.group_uid = guid,
                            .run_id = w->run_id,
                            .task_id = p->task_id,
                            .env_id = p->env_id,
                            .kind = "fork",
                            .size = pt->count,
                            .admitted_version = w->eng.version,
                            .parent_traj_uid = p->traj_uid,
                            .parent_seg_index = n_prefix - 1};
    int64_t group_id = 0;
    ARL_TRY(replay_group_ensure(w->st, &gd, &group_id));
    for (int32_t i = 0; i < pt->count; i++) {
        snprintf(uids[i], REPLAY_UID_MAX + 1, "%s/f%d.%d", p->traj_uid, (int)n_prefix,
                 (int)(first + i));
        replay_traj_desc d = {.traj_uid = uids[i],
                              .run_id = w->run_id,
                              .group_id = group_id,
                              .task_id = p->task_id,
                              .env_id = p->env_id,
                              .slot = i,
                              .policy_version = w->eng.version};
        int64_t id;
        ARL_TRY(replay_fork_begin(w->w, p->traj_uid, n_prefix, &d, &id, NULL));
        ARL_TRY(ro_push_resume(w, id));
        w->fork_ids[w->n_forks] = id;
        snprintf(w->fork_groups[w->n_forks], REPLAY_UID_MAX + 1, "%s", guid);
        w->n_forks++;
    }
    return ARL_OK;
}

arl_status arl_rollout_fork_many(const arl_rollout_config *cfg, const char *ckpt_dir,
                                 replay_store *st, const arl_rollout_fork_point *pts, int32_t n_pts,
                                 const arl_rollout_fork_opts *o, char (*uids)[REPLAY_UID_MAX + 1],
                                 arl_rollout_stats *stats) {
    if (stats) *stats = (arl_rollout_stats){0};
    if (n_pts <= 0) return ARL_OK;
    const char *group_uid = o ? o->group_uid : NULL;
    if (group_uid && *group_uid && n_pts > 1)
        return arl_errorf(ARL_ERR_ARG, "fork: one group uid for %d fork points", (int)n_pts);
    /* the parents, the fork points and the uids first: a refusal writes nothing (the worker's
     * open adds a tool file to the store) */
    replay_traj_row *par = calloc((size_t)n_pts, sizeof *par);
    int32_t *first = calloc((size_t)n_pts, sizeof *first);
    char(*guids)[REPLAY_UID_MAX + 1] = calloc((size_t)n_pts, sizeof *guids);
    size_t total = 0;
    arl_status s =
        par && first && guids ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    for (int32_t k = 0; s == ARL_OK && k < n_pts; k++) {
        s = fork_point_check(st, &pts[k], group_uid, &par[k], &first[k], guids[k]);
        total += s == ARL_OK ? (size_t)pts[k].count : 0;
        for (int32_t q = 0; s == ARL_OK && q < k; q++) {
            if (par[q].traj_id == par[k].traj_id && pts[q].n_prefix == pts[k].n_prefix)
                s = arl_errorf(ARL_ERR_ARG, "fork: fork point %s --segment %d given twice",
                               par[k].traj_uid, (int)pts[k].n_prefix);
            else if (par[q].run_id != par[k].run_id)
                s = arl_errorf(ARL_ERR_ARG,
                               "fork: %s and %s belong to different runs: one fork worker "
                               "continues one run's trajectories",
                               par[q].traj_uid, par[k].traj_uid);
        }
    }
    arl_rollout_worker *w = NULL;
    const fork_req fr = {.parent = par, .o = o};
    if (s == ARL_OK) s = worker_open(cfg, ckpt_dir, st, REPLAY_FILE_TOOL, 0, NULL, 0, &fr, &w);
    if (s == ARL_OK) {
        w->fork_ids = malloc(total * sizeof *w->fork_ids);
        w->fork_groups = malloc(total * sizeof *w->fork_groups);
        if (!w->fork_ids || !w->fork_groups)
            s = arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    }
    size_t at = 0;
    for (int32_t k = 0; s == ARL_OK && k < n_pts; k++) {
        s = fork_point_begin(w, &par[k], &pts[k], first[k], guids[k], uids + at);
        at += (size_t)pts[k].count;
    }
    if (s == ARL_OK) s = arl_rollout_worker_run(w);
    if (stats && w) *stats = w->stats;
    arl_rollout_worker_close(w);
    free(par);
    free(first);
    free(guids);
    return s;
}

arl_status arl_rollout_fork(const arl_rollout_config *cfg, const char *ckpt_dir, replay_store *st,
                            const char *parent, int32_t n_prefix, int32_t count,
                            const arl_rollout_fork_opts *o, char (*uids)[REPLAY_UID_MAX + 1],
                            arl_rollout_stats *stats) {
    const arl_rollout_fork_point pt = {.parent = parent, .n_prefix = n_prefix, .count = count};
    return arl_rollout_fork_many(cfg, ckpt_dir, st, &pt, 1, o, uids, stats);
}

/* Jobs for every (task, slot) not yet in the store; refills for slots whose first attempt was
 * masked INTERRUPTED with nothing committed (spec/replay.md 7.5 step 1). */
static arl_status build_jobs(arl_rollout_worker *w) {
    const arl_rollout_config *c = &w->cfg;
    int64_t stored = 0; /* (task, slot) pairs an earlier run of this run uid sampled */
    for (int64_t i = 0; i < w->n_tasks; i++) {
        char g[REPLAY_UID_MAX + 1], u[REPLAY_UID_MAX + 1];
        ro_group_uid_of(w, i, g, sizeof g);
        for (int32_t sl = 0; sl < (int32_t)c->group_size; sl++) {
            replay_traj_row row;
            ro_traj_uid_of(u, sizeof u, g, sl, 0);
            arl_status s = replay_traj_get(w->st, u, &row);
            if (s == ARL_ERR_NOT_FOUND) {
                arl_error_clear();
                ARL_TRY(push_job(w, i, sl, 0));
                continue;
            }
            ARL_TRY(s);
            stored++;
            if (row.status != REPLAY_MASKED || strcmp(row.error_attribution, "infra") ||
                !c->refill_infra_masked)
                continue;
            ro_traj_uid_of(u, sizeof u, g, sl, 1);
            s = replay_traj_get(w->st, u, &row);
            if (s == ARL_ERR_NOT_FOUND) {
                arl_error_clear();
                ARL_TRY(push_job(w, i, sl, 1));
            } else
                ARL_TRY(s);
        }
    }
    if (stored)
        arl_log_info("rollout: run uid '%s': %lld of the %lld trajectories of its %lld tasks are "
                     "in the store already (a rerun continues the run; masked ones stay "
                     "masked, a new run-uid samples their tasks again): %zu to sample",
                     c->run_uid, (long long)stored, (long long)(w->n_tasks * c->group_size),
                     (long long)w->n_tasks, w->n_jobs);
    return ARL_OK;
}

arl_status arl_rollout_worker_run(arl_rollout_worker *w) {
    w->t_start_ms = w->last_progress_ms = ro_now_ms();
    ARL_TRY(ro_resume_interrupted(w));
    /* the GC at open (spec/replay.md 7.6), once recovery has decided what resumes; with resumes
     * pending the budget waits for them (gc_states), the periodic pass being due at once */
    ARL_TRY(gc_states(w, w->n_resume == 0));
    if (w->n_resume) w->gc_next_s = ro_mono_s();
    ARL_TRY(build_jobs(w));
    arl_status st = ARL_OK;
    while (!stop_asked(w)) {
        ARL_TRY(poll_weights(w));
        ARL_TRY(maybe_swap(w));
        ARL_TRY(admit(w));
        for (;;) {
            arl_env_session *done = NULL;
            ARL_TRY(arl_env_client_wait(w->client, 0, &done));
            if (!done) break;
            ARL_TRY(handle_done(w, done));
            if (w->stop) break;
        }
        if (w->stop) break;
        int did = 0;
        /* prefill first (all of it): new turns then join the decode batch together, which keeps
         * decode steps as wide as the batch allows */
        while (!w->swap_pending && !stop_asked(w) && prefill_pass(w, &st)) {
            did = 1;
            ARL_TRY(st);
        }
        ARL_TRY(st);
        if (w->stop) break;
        did |= decode_pass(w, &st);
        ARL_TRY(st);
        progress(w, 0);
        if (!w->n_live && w->next_job >= w->n_jobs && w->next_resume >= w->n_resume) break;
        if (!did) {
            arl_env_session *done = NULL;
            ARL_TRY(arl_env_client_wait(w->client, 50, &done));
            if (done) ARL_TRY(handle_done(w, done));
            else if (!arl_env_client_pending(w->client) && w->n_live && !w->swap_pending) {
                int busy = 0;
                for (ro_traj *t = w->all; t; t = t->next_all)
                    busy |= t->state == RO_T_PREFILL || t->state == RO_T_GENERATE;
                if (!busy)
                    return arl_errorf(ARL_ERR_INTERNAL, "rollout: %d trajectories wait for "
                                                        "nothing (scheduler bug)",
                                      w->n_live);
            }
        }
    }
    progress(w, 1);
    if (w->left_to_others)
        arl_log_info("rollout: %lld trajectories were begun by another worker of run uid '%s' "
                     "into its own shard: left to it",
                     (long long)w->left_to_others, w->cfg.run_uid);
    if (w->stop) return arl_errorf(ARL_ERR_CANCELLED, "rollout: stopped by a hook");
    return win_verdict(w);
}

const arl_rollout_stats *arl_rollout_worker_stats(const arl_rollout_worker *w) { return &w->stats; }
int32_t arl_rollout_worker_shard(const arl_rollout_worker *w) {
    return w->w ? replay_writer_shard_id(w->w) : 0;
}

void arl_rollout_worker_close(arl_rollout_worker *w) {
    if (!w) return;
    while (w->all) ro_traj_destroy(w, w->all);
    replay_writer_close(w->w);
    arl_env_free(w->env);
    arl_env_client_close(w->client);
    json_decref(w->env_options);
    ro_engine_close(&w->eng);
    for (int64_t i = 0; i < w->n_tasks; i++) {
        free(w->tasks[i].id);
        json_decref(w->tasks[i].data);
    }
    free(w->tasks);
    free(w->jobs);
    free(w->resume);
    free(w->fork_ids);
    free(w->fork_groups);
    free(w->fork_prefix.buf);
    free(w->group_ids);
    free(w->task_ids);
    free(w->by_slot);
    free(w->gen);
    free(w->gen_tok);
    free(w->want);
    free(w->pf_docs);
    free(w->row);
    free(w->route_scratch);
    arl_rollout_config_free(&w->cfg);
    free(w);
}

void arl_rollout_stats_print(const arl_rollout_stats *s, FILE *f) {
    arl_rollout_stats_print_titled(s, "rollout summary", f);
}

void arl_rollout_stats_print_titled(const arl_rollout_stats *s, const char *title, FILE *f) {
    fprintf(f, "%s\n", title);
    fprintf(f, "  trajectories  %lld (complete %lld, truncated %lld, masked %lld)\n",
            (long long)s->trajectories, (long long)s->complete, (long long)s->truncated,
            (long long)s->masked);
    int64_t valid = s->complete + s->truncated;
    fprintf(f, "  success rate  %.3f (%lld of %lld valid reach the top of the outcome range)\n",
            valid ? (double)s->successes / (double)valid : 0.0, (long long)s->successes,
            (long long)valid);
    fprintf(f, "  reward        outcome %.4f (n %lld), segment %.4f (n %lld), process %.4f (n %lld)\n",
            s->outcome_n ? s->outcome_sum / (double)s->outcome_n : 0.0, (long long)s->outcome_n,
            s->segment_n ? s->segment_sum / (double)s->segment_n : 0.0, (long long)s->segment_n,
            s->process_n ? s->process_sum / (double)s->process_n : 0.0, (long long)s->process_n);
    fprintf(f, "  mean length   %.1f tokens, %.1f turns, %.2f segments per trajectory\n",
            s->trajectories ? (double)s->tokens / (double)s->trajectories : 0.0,
            s->trajectories ? (double)s->turns / (double)s->trajectories : 0.0,
            s->trajectories ? (double)s->segments / (double)s->trajectories : 0.0);
    fprintf(f, "  truncations   env %lld, context_budget %lld, turn_budget %lld, "
               "action_too_large %lld; wall clock %lld\n",
            (long long)s->truncations[0], (long long)s->truncations[1],
            (long long)s->truncations[2], (long long)s->truncations[3], (long long)s->wall_clock);
    fprintf(f, "  env errors    %lld masked; resumed %lld (%lld from cached states), interrupted "
               "masked %lld\n",
            (long long)s->env_errors, (long long)s->resumed, (long long)s->resumed_from_state,
            (long long)s->interrupted_masked);
    if (s->not_admitted)
        fprintf(f, "  not admitted  %lld trajectories of groups not started after a client-fault "
                   "alert\n",
                (long long)s->not_admitted);
    if (s->forked)
        fprintf(f,
                "  forks         %lld started, %lld from cached states (the others prefilled, once "
                "per point)\n",
                (long long)s->forked, (long long)s->forked_from_state);
    if (s->states_evicted || s->states_deleted)
        fprintf(f, "  states GC     %lld passes: %lld stale deleted, %lld evicted (%lld bytes)\n",
                (long long)s->state_gcs, (long long)s->states_deleted, (long long)s->states_evicted,
                (long long)s->state_bytes_freed);
    fprintf(f, "  tokens        %lld sampled (%.0f/s), %lld prefilled (%.0f/s)\n",
            (long long)s->decode_tokens, s->decode_s > 0 ? (double)s->decode_tokens / s->decode_s : 0.0,
            (long long)s->prefill_tokens,
            s->prefill_s > 0 ? (double)s->prefill_tokens / s->prefill_s : 0.0);
}
