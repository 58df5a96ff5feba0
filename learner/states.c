/* learner/states.c: the learner's states in the store (spec/replay.md 9.1, producer 'learner').
 *
 * With the learner option keep-states (state_cache.learner, spec/replay.md 9.3) 'pinned' or
 * 'all', the pi_old pass of update n writes the end state of every segment of the chosen
 * trajectories (all, or those pinned in the catalog) into the learner file its source names
 * (arl_update_source.states_out): a kda_boundary and an mla_segment per segment, version_min =
 * version_max = n, the learner's numerics tag and routing mode, and one pass_uid for the whole
 * pass, ro_pass_uid("learner", SHA-256 of the weights, ...).  Keyed by the weights like the tool
 * states of `replay rescore --save-states`, they start `replay rescore` of any checkpoint with
 * these weights (and forks, when the pass routed naturally): rollout/rescore.h, rollout/resume.c.
 *
 * A segment whose end state is not the boundary of the stored segment is not written, and
 * neither is anything after it in its trajectory: a segment fed short of its last token (routes
 * absent at the end), one whose replayed routes were unusable (its pass routed naturally, so
 * the state is of neither routing mode alone), and trajectories whose images could not be
 * rebuilt.  A re-run of an update writes the same pass_uid and keeps the states already there
 * (replay_state_put is idempotent per pass).
 *
 * The learner is the writer of that states file while it holds it, and collects it (spec/replay.md
 * 7.6): arl_learner_states_open runs the GC at open, the caller again between updates
 * (arl_learner_states_gc; experiments/train.c after an update once learner.state-gc-interval-s
 * have passed). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/sha256.h"
#include "learner/update_internal.h"
#include "rollout/boundary.h"

arl_status lr_states_plan(arl_learner *l, const arl_update_source *src, int32_t n_src) {
    l->states_src = src;
    l->states_nsrc = n_src;
    l->states_saved = 0;
    l->states_pass[0] = '\0';
    arl_update_batch *b = &l->b;
    for (int32_t i = 0; i < b->n_trajs; i++)
        b->trajs[i].keep_states = 0;
    if (l->lc.keep_states == ARL_LEARNER_KEEP_OFF) return ARL_OK;
    for (int32_t i = 0; i < b->n_trajs; i++) {
        arl_upd_traj *t = &b->trajs[i];
        const int32_t si = b->groups[t->group].source;
        if (!t->valid || !t->local || t->media_bad || si < 0 || si >= n_src ||
            !src[si].states_out)
            continue;
        int keep = l->lc.keep_states == ARL_LEARNER_KEEP_ALL;
        if (!keep) {
            arl_status s = replay_pin_get(src[si].store, t->row.traj_uid, &keep, NULL, 0);
            if (s) return arl_error_prefix(s, "learner: keep-states: is %s pinned", t->row.traj_uid);
        }
        t->keep_states = keep;
    }
    /* the weights of this pass: the parameters as loaded, before any step of the update */
    char hex[ARL_SHA256_HEX_CHARS];
    arl_model_params_sha256_hex(l->in.params, hex);
    ro_pass_uid("learner", hex, !l->lc.routing_replay, l->lc.mla_sparse_topk,
                l->lc.mla_sparse_chunk, l->states_pass, sizeof l->states_pass);
    return arl_model_config_hash_hex(l->cfg, l->states_cfg_hash);
}

arl_status lr_states_put(arl_learner *l, const arl_upd_seg *s, int32_t slot, int replay) {
    arl_upd_traj *t = &l->b.trajs[s->traj];
    if (!t->keep_states) return ARL_OK;
    /* the end state of the whole stored segment, of one routing mode */
    if (s->n_fed != s->T || replay != l->lc.routing_replay ||
        (l->lc.routing_replay && !s->routes_ok)) {
        t->keep_states = 0;
        return ARL_OK;
    }
    ARL_TRY(lr_slot_sync(l, &l->st, slot));
    const replay_state_desc id = {.traj_uid = t->row.traj_uid,
                                  .seg_index = s->seg_index,
                                  .producer = "learner",
                                  .pass_uid = l->states_pass,
                                  .routing = replay ? "replay" : "natural",
                                  .version_min = l->update_n,
                                  .version_max = l->update_n};
    replay_writer *w = l->states_src[l->b.groups[t->group].source].states_out;
    int64_t end_id, lat_id;
    arl_status st = ro_boundary_put_state(w, l->cfg, l->states_cfg_hash, l->numerics, &l->st, slot,
                                          &id, s->ctx_start, s->T, l->update_n, l->update_n,
                                          &end_id, &lat_id);
    if (st) return arl_error_prefix(st, "learner: the state after %s segment %d", t->row.traj_uid,
                                    (int)s->seg_index);
    l->states_saved++;
    return ARL_OK;
}

/* state_cache.learner of keep-states (ARL_LEARNER_KEEP_*) */
static const char *keep_name(int keep) {
    return keep == ARL_LEARNER_KEEP_ALL      ? "all"
           : keep == ARL_LEARNER_KEEP_PINNED ? "pinned"
                                             : "off";
}

arl_status arl_learner_states_gc(replay_writer *w, int keep, int64_t budget_bytes,
                                 replay_gc_stats *out) {
    replay_retention r = {.learner = keep_name(keep),
                          .budget_bytes = budget_bytes > 0 ? budget_bytes : 0,
                          .min_age_ms = -1};
    replay_gc_stats g;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    arl_status s = replay_states_retain(w, &r, &g);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s) return arl_error_prefix(s, "learner: GC of the states of %s", replay_writer_file(w));
    if (g.evicted)
        arl_log_info("learner: states of %s: %lld stale deleted, %lld evicted (%lld bytes; "
                     "keep-states %s, state-budget-bytes %lld; %.3f s)",
                     replay_writer_file(w), (long long)g.deleted, (long long)g.evicted,
                     (long long)g.bytes_freed, r.learner, (long long)budget_bytes,
                     (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    if (out) *out = g;
    return ARL_OK;
}

arl_status arl_learner_states_open(replay_store *st, int32_t shard_id, int keep,
                                   int64_t budget_bytes, replay_writer **out) {
    *out = NULL;
    replay_writer *w = NULL;
    ARL_TRY(replay_writer_open(st, REPLAY_FILE_LEARNER, shard_id, NULL, &w));
    arl_status s = arl_learner_states_gc(w, keep, budget_bytes, NULL);
    if (s) {
        replay_writer_close(w);
        return s;
    }
    *out = w;
    return ARL_OK;
}
