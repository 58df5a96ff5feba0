/* learner/batch.c: step 1 of an update - the groups of the update read from the replay stores
 * into an arl_update_batch (learner/update.h): members and segment metadata of every group on
 * every rank, tokens / routes / turns / rewards / observation images (learner/media.c) of this
 * rank's groups, and the shard data metrics.  Not the passes (learner/passes.c). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/log.h"
#include "learner/update_internal.h"

#define MAX_MEMBERS 4096

static void seg_free(arl_upd_seg *s) {
    free(s->tokens);
    free(s->amask);
    free(s->versions);
    free(s->lp_mu);
    free(s->lp_old);
    free(s->lp_ref);
    free(s->adv);
    free(s->entropy);
    free(s->lp_theta);
    free(s->turn);
    free(s->routes);
    free(s->media_idx);
}

static void traj_free(arl_upd_traj *t) {
    free(t->turns);
    free(t->proc);
    free(t->segr);
    free(t->outc);
    free(t->seg_unscorable);
    free(t->seg_mc);
    free(t->seg_mc_n);
    free(t->adv_turn);
    free(t->lv_seg);
    free(t->lv_proc);
    free(t->lv_kl);
    free(t->lv_klb);
    if (t->anchors)
        for (int32_t k = 0; k < t->n_turns; k++)
            free(t->anchors[k]);
    free(t->anchors);
    lr_media_free(t->media);
}

void arl_update_batch_free(arl_update_batch *b) {
    if (!b) return;
    for (int32_t i = 0; i < b->n_segs; i++)
        seg_free(&b->segs[i]);
    for (int32_t i = 0; i < b->n_trajs; i++)
        traj_free(&b->trajs[i]);
    free(b->segs);
    free(b->trajs);
    free(b->groups);
    memset(b, 0, sizeof *b);
}

/* Grow helpers. */
static arl_status grow(void **v, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return ARL_OK;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*v, (size_t)nc * elem);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (batch of %d entries)", nc);
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *v = p;
    *cap = nc;
    return ARL_OK;
}

/* Levels declared in /info (reward_levels) and the top of the outcome range.  ARL_ERR_NOMEM
 * when info cannot be read for want of memory (never the defaults in its place). */
static arl_status parse_info(const char *info, arl_upd_group *g) {
    memset(g->level_absent, 0, sizeof g->level_absent);
    g->outcome_hi = 1.0;
    g->outcome_lo = 0.0;
    json_error_t je;
    json_t *j = info ? arl_json_loads(info, 0, &je) : NULL;
    if (!j && info && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "learner: group %lld: out of memory reading its "
                          "environment's info", (long long)g->group_id);
    json_t *lv = j ? json_object_get(j, "reward_levels") : NULL;
    if (json_is_object(lv)) {
        static const char *names[ARL_REWARD_NLEVELS] = {"outcome", "segment", "process"};
        for (int L = 0; L < ARL_REWARD_NLEVELS; L++)
            g->level_absent[L] = json_object_get(lv, names[L]) == NULL;
        json_t *r = json_object_get(json_object_get(lv, "outcome"), "range");
        if (json_is_array(r) && json_array_size(r) == 2 && json_is_number(json_array_get(r, 1)))
            g->outcome_hi = json_number_value(json_array_get(r, 1));
        if (json_is_array(r) && json_array_size(r) == 2 && json_is_number(json_array_get(r, 0)))
            g->outcome_lo = json_number_value(json_array_get(r, 0));
    }
    json_decref(j);
    return ARL_OK;
}

static const arl_reward_row *find_reward(const arl_reward_row *r, int32_t n, const char *level,
                                         int64_t scope, const char *comp) {
    for (int32_t i = 0; i < n; i++)
        if (r[i].scope == scope && !strcmp(r[i].level, level) && !strcmp(r[i].component, comp))
            return &r[i];
    return NULL;
}

/* The segment reward row of segment si (ncols_S values) from a trajectory's reward rows: the
 * derived scalar (0 for a scorable:false score, spec/objective.md 3.3), or the configured
 * components; NaN where missing.  *unscorable = 1 for a scorable:false score: its scalar row ''
 * is NULL (rollout/commit.c ro_rewards_rows), whether or not the client's '@derived' 0 is
 * stored next to it. */
static void segment_rewards(const arl_reward_config *rc, const arl_reward_row *rw, int32_t nrw,
                            int32_t si, double *row, uint8_t *unscorable) {
    const arl_reward_row *sc = find_reward(rw, nrw, "segment", si, "");
    if (sc && isnan(sc->value)) *unscorable = 1;
    if (rc->n_comp[ARL_REWARD_LEVEL_SEGMENT] == 0) {
        const arl_reward_row *x = find_reward(rw, nrw, "segment", si, "@derived");
        if (x)
            row[0] = x->value;
        else
            row[0] = *unscorable ? 0.0 : NAN;
        return;
    }
    for (int32_t c = 0; c < rc->n_comp[ARL_REWARD_LEVEL_SEGMENT]; c++) {
        const arl_reward_row *x =
            find_reward(rw, nrw, "segment", si, rc->comp[ARL_REWARD_LEVEL_SEGMENT][c].name);
        row[c] = x ? x->value : NAN;
    }
}

/* Tokens, routes and per-token buffers of one local segment. */
static arl_status seg_load(arl_learner *l, replay_store *st, const arl_upd_traj *t, arl_upd_seg *s,
                           int is_last, replay_seg_data *d) {
    const int64_t T = s->T;
    ARL_TRY(replay_segment_load(
        st, t->traj_id, s->seg_index,
        REPLAY_LOAD_TOKENS | (l->lc.routing_replay ? REPLAY_LOAD_ROUTES : 0), d));
    if (d->ref.n_tokens != T)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "learner: trajectory %s segment %d: %lld tokens, metadata "
                          "says %lld",
                          t->row.traj_uid, (int)s->seg_index, (long long)d->ref.n_tokens,
                          (long long)T);
    s->tokens = malloc(sizeof(int32_t) * (size_t)T);
    s->amask = malloc((size_t)T);
    s->versions = malloc(sizeof(uint32_t) * (size_t)T);
    s->turn = calloc((size_t)T, sizeof(int32_t));
    s->lp_mu = calloc((size_t)T, sizeof(double));
    s->lp_old = calloc((size_t)T, sizeof(double));
    s->lp_ref = calloc((size_t)T, sizeof(double));
    s->adv = calloc((size_t)T, sizeof(double));
    s->entropy = calloc((size_t)T, sizeof(double));
    s->lp_theta = calloc((size_t)T, sizeof(double));
    if (!s->tokens || !s->amask || !s->versions || !s->turn || !s->lp_mu || !s->lp_old ||
        !s->lp_ref || !s->adv || !s->entropy || !s->lp_theta)
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (segment of %lld tokens)",
                          (long long)T);
    const int64_t media = l->cfg->media_placeholder_token_id;
    s->n_action = 0;
    for (int64_t i = 0; i < T; i++) {
        if (d->tokens[i] >= (uint32_t)l->V)
            return arl_errorf(ARL_ERR_CORRUPT,
                              "learner: trajectory %s segment %d token %lld: id "
                              "%u is outside the vocabulary [0, %lld)",
                              t->row.traj_uid, (int)s->seg_index, (long long)i, d->tokens[i],
                              (long long)l->V);
        s->tokens[i] = (int32_t)d->tokens[i];
        s->amask[i] = d->loss_mask[i] ? 1 : 0;
        s->versions[i] = d->versions[i];
        s->lp_mu[i] = s->amask[i] ? (double)d->logprobs[i] : 0.0;
        s->n_action += s->amask[i];
        /* an image placeholder the environment sent needs its image row (learner/media.c);
         * one the policy sampled is an ordinary token (it was fed as one) */
        if (media >= 0 && s->tokens[i] == media && !s->amask[i]) s->has_media = 1;
    }
    if (s->amask[0]) { /* a segment never starts with a sampled token (update.h): not trained */
        arl_log_warn("learner: trajectory %s segment %d starts with an action token; it is not "
                     "trained",
                     t->row.traj_uid, (int)s->seg_index);
        s->amask[0] = 0;
        s->n_action--;
    }
    /* routes: (n_moe, T, k); absent entries (all ones) at the tail of the last segment are
     * targets only and not fed */
    s->n_fed = T;
    s->routes_ok = !l->lc.routing_replay;
    if (l->lc.routing_replay && l->n_moe > 0 && d->routes && d->n_moe_layers == l->n_moe &&
        d->route_k == l->k) {
        const int64_t nk = l->n_moe * l->k;
        s->routes = malloc(sizeof(int32_t) * (size_t)(nk * T));
        if (!s->routes) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (routes)");
        const uint32_t absent = d->route_dtype == ARL_BLOB_U8 ? 0xFFu : 0xFFFFu;
        int64_t last_present = -1;
        int bad = 0;
        for (int64_t i = 0; i < T; i++) {
            int any_absent = 0;
            for (int64_t j = 0; j < l->n_moe; j++)
                for (int64_t c = 0; c < l->k; c++) {
                    size_t at = (size_t)((j * T + i) * l->k + c);
                    uint32_t v = d->route_dtype == ARL_BLOB_U8 ? ((const uint8_t *)d->routes)[at]
                                                               : ((const uint16_t *)d->routes)[at];
                    if (v == absent) {
                        any_absent = 1;
                        s->routes[at] = -1;
                        continue;
                    }
                    if (v >= (uint32_t)l->E) bad = 1;
                    s->routes[at] = (int32_t)v;
                    for (int64_t c2 = 0; c2 < c; c2++)
                        if (s->routes[(j * T + i) * l->k + c2] == (int32_t)v) bad = 1;
                }
            if (!any_absent) last_present = i;
        }
        /* tokens after last_present are route-less; allowed only as the trajectory's tail */
        int64_t fed = last_present + 1;
        if (is_last && fed < T) {
            s->n_fed = fed;
        }
        int absent_fed = 0;
        for (int64_t i = 0; i < s->n_fed && !absent_fed; i++)
            for (int64_t j = 0; j < l->n_moe * l->k && !absent_fed; j++)
                absent_fed = s->routes[(j / l->k * T + i) * l->k + j % l->k] < 0;
        s->routes_ok = !bad && !absent_fed;
        if (!s->routes_ok) {
            free(s->routes);
            s->routes = NULL;
            s->n_fed = T; /* natural routing: every token can be fed */
        }
    } else if (l->lc.routing_replay && l->n_moe == 0) {
        s->routes_ok = 1;
    }
    return ARL_OK;
}

/* Turns and rewards of a local valid trajectory; fills t's reward inputs and the per-token
 * turn index of its segments. */
static arl_status traj_rewards(arl_learner *l, arl_shard_reader *sr, arl_upd_traj *t,
                               arl_upd_seg *segs) {
    const arl_reward_config *rc = l->in.reward;
    arl_turn_row *tr = NULL;
    int32_t ntr = 0;
    arl_reward_row *rw = NULL;
    int32_t nrw = 0;
    arl_status s = arl_shard_turns(sr, t->shard_id, t->traj_id, &tr, &ntr);
    if (s == ARL_OK) s = arl_shard_rewards(sr, t->shard_id, t->traj_id, &rw, &nrw);
    int32_t K = 0;
    for (int32_t i = 0; i < ntr; i++)
        K += tr[i].step_index > 0;
    const int32_t S = t->n_segs;
    const int32_t ncO = arl_reward_config_ncols(rc, ARL_REWARD_LEVEL_OUTCOME),
                  ncS = arl_reward_config_ncols(rc, ARL_REWARD_LEVEL_SEGMENT),
                  ncP = arl_reward_config_ncols(rc, ARL_REWARD_LEVEL_PROCESS);
    if (s == ARL_OK) {
        t->n_turns = K;
        t->turns = calloc((size_t)(K ? K : 1), sizeof *t->turns);
        t->anchors = calloc((size_t)(K ? K : 1), sizeof *t->anchors);
        t->adv_turn = calloc((size_t)(K ? K : 1), sizeof(double));
        t->proc = calloc((size_t)(K ? K : 1) * (size_t)ncP, sizeof(double));
        t->segr = calloc((size_t)(S ? S : 1) * (size_t)ncS, sizeof(double));
        t->seg_unscorable = calloc((size_t)(S ? S : 1), 1);
        t->outc = calloc((size_t)ncO, sizeof(double));
        t->lv_seg = calloc((size_t)(S ? S : 1), sizeof(double));
        t->lv_proc = calloc((size_t)(K ? K : 1), sizeof(double));
        t->lv_kl = calloc((size_t)(K ? K : 1), sizeof(double));
        t->lv_klb = calloc((size_t)(K ? K : 1), sizeof(double));
        if (!t->turns || !t->anchors || !t->adv_turn || !t->proc || !t->segr ||
            !t->seg_unscorable || !t->outc || !t->lv_seg || !t->lv_proc || !t->lv_kl || !t->lv_klb)
            s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    }
    /* anchors: a_{i,k} is the anchor of the response to step k - 1 */
    const char *prev_anchor = NULL;
    int32_t k = 0;
    for (int32_t i = 0; s == ARL_OK && i < ntr; i++) {
        const arl_turn_row *r = &tr[i];
        if (r->step_index > 0) {
            arl_reward_turn *u = &t->turns[k];
            u->tok_start = r->act_tok_start;
            u->tok_end = r->act_tok_end;
            u->seg = r->seg_index;
            if (prev_anchor && !(t->anchors[k] = strdup(prev_anchor)))
                s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
            u->anchor = t->anchors[k];
            if (rc->n_comp[ARL_REWARD_LEVEL_PROCESS] == 0) {
                t->proc[k] = r->reward;
            } else {
                for (int32_t c = 0; c < ncP; c++) {
                    const arl_reward_row *x =
                        find_reward(rw, nrw, "process", r->step_index,
                                    rc->comp[ARL_REWARD_LEVEL_PROCESS][c].name);
                    t->proc[(size_t)k * ncP + c] = x ? x->value : NAN;
                }
            }
            /* per-token turn index of the segment holding the turn */
            for (int32_t j = 0; j < S; j++) {
                arl_upd_seg *g = &segs[t->seg0 + j];
                if (g->seg_index != r->seg_index || !g->turn) continue;
                for (int64_t p = r->act_tok_start; p < r->act_tok_end; p++) {
                    int64_t q = p - g->tok_start;
                    if (q >= 0 && q < g->T && g->amask[q]) g->turn[q] = k + 1;
                }
            }
            k++;
        }
        prev_anchor = r->has_anchor ? r->anchor : NULL;
    }
    /* segment rewards */
    for (int32_t j = 0; s == ARL_OK && j < S; j++)
        segment_rewards(rc, rw, nrw, segs[t->seg0 + j].seg_index, t->segr + (size_t)j * ncS,
                        &t->seg_unscorable[j]);
    /* outcome; a scorable:false score (its scalar row '' NULL) trains on the client's
     * substitute, stored as the trajectory's outcome (range_lo, spec/objective.md 4.3) */
    if (s == ARL_OK) {
        const arl_reward_row *so = find_reward(rw, nrw, "outcome", 0, "");
        t->outc_unscorable = so && isnan(so->value);
        t->outc_subst = t->row.outcome_reward;
        if (!isfinite(t->outc_subst)) {
            const arl_reward_row *x = find_reward(rw, nrw, "outcome", 0, "@derived");
            t->outc_subst = x ? x->value : NAN;
        }
        if (rc->n_comp[ARL_REWARD_LEVEL_OUTCOME] == 0) {
            double R = t->row.outcome_reward;
            if (!isfinite(R)) {
                const arl_reward_row *x = find_reward(rw, nrw, "outcome", 0, "@derived");
                R = x ? x->value : NAN;
            }
            t->outc[0] = R;
        } else {
            for (int32_t c = 0; c < ncO; c++) {
                const arl_reward_row *x =
                    find_reward(rw, nrw, "outcome", 0, rc->comp[ARL_REWARD_LEVEL_OUTCOME][c].name);
                t->outc[c] = x ? x->value : NAN;
            }
        }
    }
    free(tr);
    free(rw);
    return s;
}

/* segment_baseline mc (spec/objective.md 5.3): for every segment s >= 1 of t, the mean
 * G^S_{f,s} over the finished forks f of t at the start of s (its fork groups at
 * parent_seg_index s - 1) that belong to t's run, each return from the rewards of the fork's own
 * segments s, s + 1,
 * ...; NaN, so the leave-one-out baseline applies, where no fork has one. */
static arl_status mc_baselines(arl_learner *l, replay_store *st, arl_shard_reader *sr,
                               arl_upd_traj *t, const arl_upd_seg *segs) {
    const arl_reward_config *rc = l->in.reward;
    const int32_t S = t->n_segs, ncS = arl_reward_config_ncols(rc, ARL_REWARD_LEVEL_SEGMENT);
    t->seg_mc = malloc(sizeof(double) * (size_t)(S ? S : 1));
    t->seg_mc_n = calloc((size_t)(S ? S : 1), sizeof(int32_t));
    if (!t->seg_mc || !t->seg_mc_n) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    double *row = NULL; /* (F, ncS) a fork's segment rewards */
    size_t cap_row = 0;
    arl_status s = ARL_OK;
    for (int32_t j = 0; s == ARL_OK && j < S; j++) {
        t->seg_mc[j] = NAN;
        const int32_t si = segs[t->seg0 + j].seg_index;
        if (si < 1) continue;
        replay_fork_member *m = NULL;
        size_t nm = 0;
        s = replay_forks_at(st, t->row.traj_uid, si - 1, &m, &nm);
        double sum = 0;
        int32_t n = 0;
        for (size_t k = 0; s == ARL_OK && k < nm; k++) {
            if (m[k].status != REPLAY_COMPLETE && m[k].status != REPLAY_TRUNCATED) continue;
            replay_traj_row fr;
            s = replay_traj_get_id(st, m[k].traj_id, &fr);
            /* only forks of t's own run: one with other weights has a run of its own */
            const int32_t F = s == ARL_OK && fr.run_id == t->row.run_id ? fr.n_segments : 0;
            if (F < 1) continue;
            if ((size_t)F * (size_t)ncS > cap_row) {
                cap_row = (size_t)F * (size_t)ncS;
                double *v = realloc(row, cap_row * sizeof *v);
                if (!v) {
                    s = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
                    break;
                }
                row = v;
            }
            arl_reward_row *rw = NULL;
            int32_t nrw = 0;
            s = arl_shard_rewards(sr, m[k].shard_id, m[k].traj_id, &rw, &nrw);
            for (int32_t f = 0; s == ARL_OK && f < F; f++) {
                uint8_t unscorable = 0;
                segment_rewards(rc, rw, nrw, si + f, row + (size_t)f * ncS, &unscorable);
            }
            free(rw);
            const double g = s == ARL_OK ? arl_reward_segment_return(rc, row, F) : NAN;
            if (isfinite(g)) {
                sum += g;
                n++;
            }
        }
        free(m);
        if (s == ARL_OK && n > 0) {
            t->seg_mc[j] = sum / n;
            t->seg_mc_n[j] = n;
        }
    }
    free(row);
    return s;
}

arl_status lr_batch_load(arl_learner *l, const arl_update_source *src, int32_t n_src,
                         arl_shard_stats *sstats) {
    arl_update_batch *b = &l->b;
    arl_update_batch_free(b);
    const int32_t L =
        l->in.dist && l->in.dist->learners ? arl_dist_comm_size(l->in.dist->learners) : 1;
    const int32_t me =
        l->in.dist && l->in.dist->learners ? arl_dist_comm_rank(l->in.dist->learners) : 0;
    int32_t cap_g = 0, cap_t = 0, cap_s = 0;
    arl_ledger_member *mem = malloc(sizeof *mem * MAX_MEMBERS);
    if (!mem) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    arl_status s = ARL_OK;
    int64_t gi = 0;
    for (int32_t si = 0; s == ARL_OK && si < n_src; si++) {
        arl_ledger *led = NULL;
        arl_shard_reader *sr = NULL;
        s = arl_ledger_open(src[si].root, &led);
        if (s == ARL_OK) s = arl_shard_reader_open(src[si].root, &sr);
        for (int64_t q = 0; s == ARL_OK && q < src[si].n_groups; q++, gi++) {
            s = grow((void **)&b->groups, &cap_g, b->n_groups + 1, sizeof *b->groups);
            if (s) break;
            arl_upd_group *g = &b->groups[b->n_groups++];
            memset(g, 0, sizeof *g);
            g->group_id = src[si].group_ids[q];
            g->source = si;
            g->local = (int32_t)(gi % L) == me;
            char *info = NULL;
            s = arl_ledger_group_env(led, g->group_id, &g->size, g->env_name, sizeof g->env_name,
                                     &info);
            if (s) break;
            s = parse_info(info, g);
            if (s) {
                free(info);
                break;
            }
            s = arl_reward_sources_from_info(l->in.reward, info, g->process_model);
            free(info);
            if (s) break;
            int32_t nm = 0;
            s = arl_ledger_members(led, g->group_id, mem, MAX_MEMBERS, &nm);
            if (s) break;
            g->traj0 = b->n_trajs;
            int running = 0;
            for (int32_t mi = 0; s == ARL_OK && mi < nm; mi++) {
                s = grow((void **)&b->trajs, &cap_t, b->n_trajs + 1, sizeof *b->trajs);
                if (s) break;
                arl_upd_traj *t = &b->trajs[b->n_trajs++];
                memset(t, 0, sizeof *t);
                t->group = b->n_groups - 1;
                t->member = mi;
                t->shard_id = mem[mi].shard_id;
                t->traj_id = mem[mi].traj_id;
                t->local = g->local;
                t->seg0 = b->n_segs;
                s = replay_traj_get_id(src[si].store, t->traj_id, &t->row);
                if (s) break;
                if (t->row.status == REPLAY_RUNNING) running = 1;
                t->valid =
                    (t->row.status == REPLAY_COMPLETE || t->row.status == REPLAY_TRUNCATED) &&
                    !t->row.parent_traj_uid[0];
                if (t->row.parent_traj_uid[0] && t->valid)
                    arl_log_warn("learner: %s is a fork; forks are not trained", t->row.traj_uid);
                if (!t->valid) continue;
                replay_seg_ref *refs = NULL;
                size_t nr = 0;
                s = replay_traj_segments(src[si].store, t->traj_id, &refs, &nr);
                if (s) break;
                s = grow((void **)&b->segs, &cap_s, b->n_segs + (int32_t)nr, sizeof *b->segs);
                for (size_t j = 0; s == ARL_OK && j < nr; j++) {
                    arl_upd_seg *sg = &b->segs[b->n_segs++];
                    memset(sg, 0, sizeof *sg);
                    sg->traj = b->n_trajs - 1;
                    sg->seg_index = refs[j].seg_index;
                    sg->fresh = !strcmp(refs[j].start_kind, "fresh");
                    snprintf(sg->end_cause, sizeof sg->end_cause, "%s", refs[j].end_cause);
                    sg->tok_start = refs[j].tok_start;
                    sg->first_step = refs[j].first_step;
                    sg->ctx_start = refs[j].ctx_start;
                    sg->T = refs[j].n_tokens;
                    sg->n_action = refs[j].n_action_tokens;
                    sg->local = t->local;
                    sg->minibatch = -1;
                    t->n_tokens += sg->T;
                    t->n_action += sg->n_action;
                }
                t->n_segs = (int32_t)nr;
                free(refs);
                for (int32_t j = 0; s == ARL_OK && j + 1 < t->n_segs; j++)
                    b->segs[t->seg0 + j].has_next = !b->segs[t->seg0 + j + 1].fresh;
            }
            if (s) break;
            g->n_trajs = b->n_trajs - g->traj0;
            if (running) { /* spec/replay.md section 11: a raced notification; skip the group */
                arl_log_warn("learner: group %lld has a member still running in its shard; it "
                             "contributes nothing to this update",
                             (long long)g->group_id);
                for (int32_t j = g->traj0; j < b->n_trajs; j++)
                    b->trajs[j].valid = 0;
            }
            /* data of this rank's trajectories */
            for (int32_t j = g->traj0; s == ARL_OK && j < b->n_trajs; j++) {
                arl_upd_traj *t = &b->trajs[j];
                if (sstats && me == 0 && t->row.status != REPLAY_RUNNING)
                    s = arl_shard_stats_add(sr, t->shard_id, t->traj_id, sstats);
                if (s || !t->valid || !t->local) continue;
                for (int32_t k = 0; s == ARL_OK && k < t->n_segs; k++)
                    s = seg_load(l, src[si].store, t, &b->segs[t->seg0 + k], k + 1 == t->n_segs,
                                 &d);
                if (s == ARL_OK) s = lr_media_load(l, src[si].store, t);
                if (s == ARL_OK) s = traj_rewards(l, sr, t, b->segs);
                if (s == ARL_OK && l->in.reward->segment_baseline == ARL_REWARD_SB_MC)
                    s = mc_baselines(l, src[si].store, sr, t, b->segs);
            }
        }
        arl_shard_reader_close(sr);
        arl_ledger_close(led);
    }
    replay_seg_data_free(&d);
    free(mem);
    if (s) return s;
    b->n_valid = 0;
    b->n_action = 0;
    for (int32_t i = 0; i < b->n_trajs; i++)
        if (b->trajs[i].valid) {
            b->n_valid++;
            b->n_action += b->trajs[i].n_action;
        }
    return ARL_OK;
}
