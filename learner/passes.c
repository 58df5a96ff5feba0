/* learner/passes.c: the forward passes of an update (learner/update.h steps 2, 3 and 5) - the
 * pi_old and reference passes over whole trajectories in waves of segments, the state cache
 * and its validity rule, start states for the gradient pass (cached or recomputed), and the
 * forward + backward of a minibatch, each forward with the image rows of its placeholders under
 * its weights (learner/media.c).  Every forward, backward and slot change goes through the
 * model facade of learner/device.c (the CPU reference or learner.device).  Not the loading
 * (batch.c) or the orchestration and metrics (update.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/log.h"
#include "learner/update_internal.h"
#include "policy/router.h"

/* ------------------------------------------------------------------------------------------ */
/* state cache                                                                                  */

void arl_state_cache_clear(arl_state_cache *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->n; i++)
        free(c->v[i].buf);
    c->n = 0;
    c->bytes = 0;
    c->dropped = 0;
}

void arl_state_cache_free(arl_state_cache *c) {
    if (!c) return;
    arl_state_cache_clear(c);
    free(c->v);
    c->v = NULL;
    c->cap = 0;
}

arl_state_entry *arl_state_cache_find(arl_state_cache *c, int32_t shard_id, int64_t traj_id,
                                      int32_t seg_index) {
    for (int32_t i = 0; i < c->n; i++)
        if (c->v[i].traj_id == traj_id && c->v[i].shard_id == shard_id &&
            c->v[i].seg_index == seg_index)
            return &c->v[i];
    return NULL;
}

arl_status arl_state_cache_put(arl_state_cache *c, const arl_state_entry *e) {
    arl_state_entry *old = arl_state_cache_find(c, e->shard_id, e->traj_id, e->seg_index);
    if (old) {
        c->bytes -= (int64_t)old->len;
        free(old->buf);
        *old = *e;
        c->bytes += (int64_t)e->len;
        return ARL_OK;
    }
    if (c->max_bytes > 0 && c->bytes + (int64_t)e->len > c->max_bytes) {
        free(e->buf);
        c->dropped++;
        return ARL_OK; /* a miss later: the prefix is recomputed */
    }
    if (c->n == c->cap) {
        int32_t nc = c->cap ? 2 * c->cap : 64;
        arl_state_entry *v = realloc(c->v, (size_t)nc * sizeof *v);
        if (!v) {
            free(e->buf);
            return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (state cache)");
        }
        c->v = v;
        c->cap = nc;
    }
    c->v[c->n++] = *e;
    c->bytes += (int64_t)e->len;
    return ARL_OK;
}

int arl_state_entry_valid(const arl_state_entry *e, const char *numerics, int64_t version,
                          int routing_replay, int64_t opt_step) {
    return e && e->buf && e->producer_learner && e->version == version &&
           !strcmp(e->numerics, numerics) && e->routing_replay == routing_replay &&
           (opt_step < 0 || e->opt_step == opt_step);
}

/* ------------------------------------------------------------------------------------------ */
/* pieces and calls                                                                             */

static arl_status pieces_reset(arl_learner *l) {
    l->n_pieces = 0;
    return ARL_OK;
}

static arl_status piece_push(arl_learner *l, const lr_piece *p) {
    if (l->n_pieces == l->cap_pieces) {
        int64_t nc = l->cap_pieces ? 2 * l->cap_pieces : 256;
        lr_piece *v = realloc(l->pieces, (size_t)nc * sizeof *v);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
        l->pieces = v;
        l->cap_pieces = nc;
    }
    l->pieces[l->n_pieces++] = *p;
    return ARL_OK;
}

/* The pieces of positions [a0, n) of one segment in runs of at most Tm (a0: its shared_start,
 * n: n_fed; or [0, P) for a shared prefix). */
static arl_status pieces_add_range(arl_learner *l, int32_t seg, int64_t a0, int64_t n, int replay,
                                   int count_splits) {
    for (int64_t a = a0; a < n; a += l->Tm) {
        int64_t b = a + l->Tm < n ? a + l->Tm : n;
        lr_piece p = {
            .seg = seg, .a = a, .b = b, .first = a == a0, .last = b == n, .replay = replay};
        if (a > a0 && count_splits) l->cnt.piece_splits++;
        ARL_TRY(piece_push(l, &p));
    }
    return ARL_OK;
}

/* The pieces of one segment: its n_fed tokens from its shared_start on. */
static arl_status pieces_add(arl_learner *l, int32_t seg, int replay, int count_splits) {
    const arl_upd_seg *s = &l->b.segs[seg];
    return pieces_add_range(l, seg, s->shared_start, s->n_fed, replay, count_splits);
}

/* The pieces [p0, *p1) of the next forward: at most Tm tokens and lim (<= N) documents, one
 * routing mode. */
static void pack_call(const arl_learner *l, int64_t p0, int64_t *p1, int32_t lim) {
    int64_t tok = 0, q = p0;
    while (q < l->n_pieces) {
        const lr_piece *p = &l->pieces[q];
        int64_t n = p->b - p->a;
        if (q > p0 && (tok + n > l->Tm || q - p0 >= lim || p->replay != l->pieces[p0].replay))
            break;
        tok += n;
        q++;
    }
    *p1 = q;
}

/* After the forward of a call of nd documents (status *st): when the device's shared slot
 * rows could not hold its documents at once (refused before it ran, nothing lost:
 * learner/device.c dev_room) and it has several, the error is cleared, *lim halved and 1
 * returned: the caller packs the call again from the same piece.  Otherwise *lim back to N. */
static int call_split(arl_learner *l, arl_status *st, int32_t nd, int32_t *lim) {
    const int short_rows = l->rows_short;
    l->rows_short = 0;
    if (*st != ARL_ERR_RANGE || !short_rows || nd <= 1) {
        *lim = l->N;
        return 0;
    }
    arl_error_clear();
    *st = ARL_OK;
    *lim = nd / 2;
    l->cnt.dev_splits++;
    return 1;
}

/* Fill tok, tgt, cu, forced for pieces [p0, p1); slot of piece i from slot_of. Returns T. */
static int64_t fill_call(arl_learner *l, int64_t p0, int64_t p1, const int32_t *seg_slot,
                         const int32_t *traj_slot) {
    int64_t T = 0;
    int32_t d = 0;
    l->cu[0] = 0;
    for (int64_t q = p0; q < p1; q++, d++) {
        const lr_piece *p = &l->pieces[q];
        const arl_upd_seg *s = &l->b.segs[p->seg];
        for (int64_t i = p->a; i < p->b; i++) {
            l->tok[T + i - p->a] = s->tokens[i];
            l->tgt[T + i - p->a] = i + 1 < s->T ? s->tokens[i + 1] : -1;
        }
        l->slots[d] = seg_slot ? seg_slot[p->seg] : traj_slot[s->traj];
        T += p->b - p->a;
        l->cu[d + 1] = (int32_t)T;
    }
    if (l->pieces[p0].replay) {
        int64_t off = 0;
        for (int64_t q = p0; q < p1; q++) {
            const lr_piece *p = &l->pieces[q];
            const arl_upd_seg *s = &l->b.segs[p->seg];
            const int64_t n = p->b - p->a;
            for (int64_t j = 0; j < l->n_moe; j++)
                memcpy(l->forced + (j * T + off) * l->k, s->routes + (j * s->T + p->a) * l->k,
                       sizeof(int32_t) * (size_t)(n * l->k));
            off += n;
        }
    }
    return T;
}

static arl_batch call_batch(const arl_learner *l, int64_t T, int32_t ndoc, int replay,
                            int64_t n_media) {
    arl_batch b = {.tokens = l->tok,
                   .T = T,
                   .cu = l->cu,
                   .N = ndoc,
                   .media = n_media > 0 ? l->media : NULL,
                   .n_media = n_media,
                   .targets = l->tgt,
                   .forced_routes = replay ? l->forced : NULL};
    return b;
}

/* ------------------------------------------------------------------------------------------ */
/* router agreement and expert load (spec/objective.md 11.4)                                   */

static void agreement(arl_learner *l, const arl_upd_seg *s, int64_t a, int64_t n, int64_t off,
                      int64_t T) {
    int32_t nat[64];
    const int64_t k = l->k, E = l->E;
    if (k > 64) return;
    for (int64_t p = 0; p < n; p++) {
        int all = 1;
        for (int64_t j = 0; j < l->n_moe; j++) {
            int64_t layer = -1;
            for (int64_t q = 0; q < l->dm.L && layer < 0; q++)
                if (l->m.moe_index[q] == j) layer = q;
            const float *bias = layer >= 0 ? l->in.params->layers[layer].moe.gate_bias : NULL;
            const int32_t *r = s->routes + (j * s->T + a + p) * k;
            int64_t inter = arl_router_overlap(l->rscores + (j * T + off + p) * E, bias, E, k, r,
                                               l->agree_ws, nat);
            for (int64_t c = 0; c < k; c++) {
                l->cnt.load_rollout[j * E + r[c]] += 1;
                l->cnt.load_trainer[j * E + nat[c]] += 1;
            }
            l->cnt.load_tokens[j] += 1;
            l->cnt.agree_layer[j] += (double)inter / (double)k;
            l->cnt.exact_layer[j] += inter == k;
            all &= inter == k;
        }
        l->cnt.agree_tokens += 1;
        l->cnt.exact_tokens += all;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* shared prompt prefixes (learner/update.h "Shared prompt prefix")                             */

/* The first segment of trajectory t when it may start from a shared prefix, else NULL; *maxp:
 * the longest prefix it allows (tokens 1..P context, at least one token left to feed). */
static arl_upd_seg *px_eligible(arl_learner *l, const arl_upd_traj *t, int64_t *maxp) {
    if (!t->valid || !t->local || t->n_segs <= 0 || t->media) return NULL;
    arl_upd_seg *s = &l->b.segs[t->seg0];
    if (!s->fresh || s->ctx_start != 0 || s->has_media || !s->tokens || s->n_fed < 2) return NULL;
    int64_t f = 1;
    while (f < s->T && !s->amask[f])
        f++;
    *maxp = f - 1 < s->n_fed - 1 ? f - 1 : s->n_fed - 1;
    return s;
}

/* Positions [0, n) on which u and c agree, n <= lim: tokens, and with routing replay the
 * stored routes (and whether routes are replayed at all). */
static int64_t px_common(const arl_learner *l, const arl_upd_seg *u, const arl_upd_seg *c,
                         int64_t lim) {
    int64_t n = 0;
    while (n < lim && u->tokens[n] == c->tokens[n])
        n++;
    if (!l->lc.routing_replay || l->n_moe == 0) return n;
    const int ru = u->routes_ok && u->routes != NULL, rc = c->routes_ok && c->routes != NULL;
    if (ru != rc) return 0;
    if (!ru) return n;
    const size_t row = sizeof(int32_t) * (size_t)l->k;
    for (int64_t j = 0; j < l->n_moe; j++)
        for (int64_t t = 0; t < n; t++)
            if (memcmp(u->routes + (j * u->T + t) * l->k, c->routes + (j * c->T + t) * l->k, row)) {
                n = t;
                break;
            }
    return n;
}

static int cmp_desc_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

arl_status lr_prefix_find(arl_learner *l) {
    arl_update_batch *b = &l->b;
    for (int32_t i = 0; i < b->n_segs; i++)
        b->segs[i].shared_start = 0;
    if (b->n_groups > l->px_cap) {
        lr_px *v = realloc(l->px, sizeof *v * (size_t)b->n_groups);
        if (!v) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (shared prefixes)");
        memset(v + l->px_cap, 0, sizeof *v * (size_t)(b->n_groups - l->px_cap));
        l->px = v;
        l->px_cap = b->n_groups;
    }
    l->px_n = b->n_groups;
    for (int32_t g = 0; g < l->px_n; g++) {
        lr_px *x = &l->px[g];
        x->seg = -1;
        x->len = 0;
        x->users = 0;
        x->kind = LR_PX_NONE;
        x->need = 0;
    }
    if (!l->lc.shared_prefix) return ARL_OK;
    const int64_t pmin = l->lc.shared_prefix_min > 0 ? l->lc.shared_prefix_min : 1;
    int64_t *len = malloc(sizeof(int64_t) * (size_t)(2 * b->n_trajs + 1));
    if (!len) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (shared prefixes)");
    int64_t *srt = len + b->n_trajs;
    for (int32_t g = 0; g < b->n_groups; g++) {
        const arl_upd_group *G = &b->groups[g];
        /* the first eligible member is the candidate; every member's agreement with it */
        const arl_upd_seg *c = NULL;
        int64_t cmax = 0;
        for (int32_t i = G->traj0; i < G->traj0 + G->n_trajs && !c; i++)
            c = px_eligible(l, &b->trajs[i], &cmax);
        if (!c || cmax < pmin) continue;
        int32_t nv = 0;
        for (int32_t i = G->traj0; i < G->traj0 + G->n_trajs; i++) {
            int64_t mp = 0;
            const arl_upd_seg *u = px_eligible(l, &b->trajs[i], &mp);
            len[i - G->traj0] = u ? px_common(l, u, c, mp < cmax ? mp : cmax) : 0;
            if (len[i - G->traj0] >= pmin) srt[nv++] = len[i - G->traj0];
        }
        /* P saving the most tokens: the k longest agreements allow P = the k-th, saving
         * P * (k - 1) (the first longest k wins a tie) */
        qsort(srt, (size_t)nv, sizeof *srt, cmp_desc_i64);
        int64_t best = 0, P = 0;
        for (int32_t k = 1; k < nv; k++)
            if (srt[k] * k > best) {
                best = srt[k] * k;
                P = srt[k];
            }
        if (best <= 0) continue;
        lr_px *x = &l->px[g];
        x->seg = (int32_t)(c - b->segs);
        x->len = P;
        for (int32_t i = G->traj0; i < G->traj0 + G->n_trajs; i++)
            if (len[i - G->traj0] >= P) {
                b->segs[b->trajs[i].seg0].shared_start = P;
                x->users++;
            }
    }
    free(len);
    return ARL_OK;
}

/* Prefill the shared prefixes of the groups with need set (all with a prefix when need_all)
 * with model m, in waves of at most N prefixes and Tm tokens per forward, and keep each one's
 * decode-state export tagged (kind, step).  Routes are replayed when mode and the prefix's
 * segment has them.  kind LR_PASS_OLD also writes the users' entropies at positions 1..P and
 * counts the router agreement of the prefix once per user (the metrics equal those of feeding
 * every user whole).  Uses pieces, tok/tgt/forced/lp/ent/rscores and traj_slot (restored to
 * -1): call before a pass builds its own pieces. */
static arl_status px_compute(arl_learner *l, arl_model *m, int mode, int need_all, int kind,
                             int64_t step) {
    arl_update_batch *b = &l->b;
    if (!l->have_pst) {
        ARL_TRY(arl_decode_state_init(&l->pst, l->cfg, l->N, l->m.opts.max_context));
        l->have_pst = 1;
    }
    arl_status st = ARL_OK;
    int32_t g = 0;
    while (st == ARL_OK && g < l->px_n) {
        /* a wave: the next prefixes to compute, one pst slot each */
        int32_t w0 = g, nw = 0;
        pieces_reset(l);
        for (; st == ARL_OK && g < l->px_n && nw < l->N; g++) {
            lr_px *x = &l->px[g];
            if (x->seg < 0 || !(need_all || x->need)) continue;
            const arl_upd_seg *s = &b->segs[x->seg];
            st = lr_slot_join(l, &l->pst, &l->traj_slot[s->traj]);
            if (st == ARL_OK)
                st = pieces_add_range(l, x->seg, 0, x->len,
                                      mode && s->routes_ok && s->routes != NULL, 0);
            nw++;
        }
        int32_t lim = l->N;
        for (int64_t p0 = 0, p1; st == ARL_OK && p0 < l->n_pieces; p0 = p1) {
            pack_call(l, p0, &p1, lim);
            const int32_t nd = (int32_t)(p1 - p0);
            const int64_t T = fill_call(l, p0, p1, NULL, l->traj_slot);
            const int replay = l->pieces[p0].replay;
            arl_batch bt = call_batch(l, T, nd, replay, 0);
            arl_forward_out fo = {.logprobs = l->lp};
            if (kind == LR_PASS_OLD) {
                fo.entropy = l->ent;
                if (replay && l->n_moe > 0) fo.router_scores = l->rscores;
            }
            st = lr_forward_state(l, m, &l->pst, l->slots, &bt, &fo);
            if (call_split(l, &st, nd, &lim)) {
                p1 = p0;
                continue;
            }
            if (st || kind != LR_PASS_OLD) continue;
            int64_t off = 0;
            for (int64_t q = p0; q < p1; q++) {
                const lr_piece *p = &l->pieces[q];
                const arl_upd_seg *s = &b->segs[p->seg];
                const arl_upd_group *G = &b->groups[b->trajs[s->traj].group];
                const int64_t n = p->b - p->a;
                for (int32_t i = G->traj0; i < G->traj0 + G->n_trajs; i++) {
                    arl_upd_seg *u = &b->segs[b->trajs[i].seg0];
                    if (u->shared_start <= 0) continue;
                    for (int64_t j = 0; j < n; j++)
                        u->entropy[p->a + j + 1] = (double)l->ent[off + j];
                    if (replay && l->n_moe > 0) agreement(l, s, p->a, n, off, T);
                }
                off += n;
            }
        }
        for (int32_t h = w0; h < g; h++) {
            lr_px *x = &l->px[h];
            if (x->seg < 0 || !(need_all || x->need)) continue;
            int32_t *slot = &l->traj_slot[b->segs[x->seg].traj];
            if (*slot < 0) continue;
            if (st == ARL_OK) {
                st = lr_slot_sync(l, &l->pst, *slot);
                const size_t sz = st ? 0 : arl_decode_state_export_size(&l->pst, *slot);
                if (sz > x->cap) {
                    uint8_t *nb = realloc(x->buf, sz);
                    if (!nb)
                        st = arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (prefix state)");
                    else {
                        x->buf = nb;
                        x->cap = sz;
                    }
                }
                if (st == ARL_OK)
                    st = arl_decode_state_export(&l->pst, *slot, x->buf, x->cap, &x->bytes);
                x->kind = st == ARL_OK ? kind : LR_PX_NONE;
                x->step = step;
            }
            lr_slot_leave(l, &l->pst, *slot);
            *slot = -1;
        }
    }
    return st;
}

/* Start segment sg (a user of its group's prefix) in slot of l->st from the prefix state. */
static arl_status px_import(arl_learner *l, int32_t sg, int32_t slot) {
    const arl_upd_seg *s = &l->b.segs[sg];
    const lr_px *x = &l->px[l->b.trajs[s->traj].group];
    ARL_ASSERT(x->seg >= 0 && x->len == s->shared_start && x->kind != LR_PX_NONE);
    ARL_TRY(lr_slot_import(l, &l->st, slot, x->buf, x->bytes));
    ARL_ASSERT(lr_slot_pos(l, &l->st, slot) == s->shared_start);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* pi_old and reference passes                                                                  */

static arl_status export_state(arl_learner *l, const arl_upd_seg *s, int32_t slot, int replay) {
    const arl_upd_traj *t = &l->b.trajs[s->traj];
    arl_state_entry e;
    memset(&e, 0, sizeof e);
    e.shard_id = t->shard_id;
    e.traj_id = t->traj_id;
    e.seg_index = s->seg_index;
    e.version = l->update_n;
    e.opt_step = l->in.opt->step;
    e.producer_learner = 1;
    e.routing_replay = replay;
    snprintf(e.numerics, sizeof e.numerics, "%s", l->numerics);
    ARL_TRY(lr_slot_sync(l, &l->st, slot));
    ARL_TRY(arl_decode_state_export_alloc(&l->st, slot, &e.buf, &e.len));
    return arl_state_cache_put(&l->cache, &e);
}

arl_status lr_score_pass(arl_learner *l, int which) {
    arl_update_batch *b = &l->b;
    arl_model *m = which == LR_PASS_OLD ? &l->m : &l->mref;
    const int mode = which == LR_PASS_OLD ? l->lc.routing_replay
                                          : l->lc.routing_replay && l->lc.ref_routing_replay;
    /* local valid trajectories, in batch order */
    int32_t *list = malloc(sizeof(int32_t) * (size_t)(b->n_trajs ? b->n_trajs : 1));
    if (!list) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    int32_t nl = 0;
    for (int32_t i = 0; i < b->n_trajs; i++)
        if (b->trajs[i].valid && b->trajs[i].local && b->trajs[i].n_segs > 0) list[nl++] = i;
    arl_status st = ARL_OK;
    /* the groups' shared prefixes under this pass's weights */
    int any = 0;
    for (int32_t g = 0; g < l->px_n; g++)
        any |= l->px[g].seg >= 0;
    if (any) st = px_compute(l, m, mode, 1, which, -1);
    for (int32_t c0 = 0; st == ARL_OK && c0 < nl; c0 += l->N) {
        const int32_t c1 = c0 + l->N < nl ? c0 + l->N : nl;
        int32_t maxS = 0;
        for (int32_t i = c0; st == ARL_OK && i < c1; i++) {
            st = lr_slot_join(l, &l->st, &l->traj_slot[list[i]]);
            if (b->trajs[list[i]].n_segs > maxS) maxS = b->trajs[list[i]].n_segs;
        }
        for (int32_t w = 0; st == ARL_OK && w < maxS; w++) {
            pieces_reset(l);
            for (int32_t i = c0; st == ARL_OK && i < c1; i++) {
                const arl_upd_traj *t = &b->trajs[list[i]];
                if (w >= t->n_segs) continue;
                const int32_t sg = t->seg0 + w;
                const arl_upd_seg *s = &b->segs[sg];
                const int32_t slot = l->traj_slot[list[i]];
                if (s->fresh) {
                    if (w > 0) lr_slot_reset(l, &l->st, slot);
                    if (s->shared_start > 0) st = px_import(l, sg, slot);
                    if (st) break;
                } else if (lr_slot_pos(l, &l->st, slot) != s->ctx_start) {
                    st = arl_errorf(ARL_ERR_CORRUPT,
                                    "learner: trajectory %s segment %d starts at context position "
                                    "%lld, the pass is at %lld",
                                    t->row.traj_uid, (int)s->seg_index, (long long)s->ctx_start,
                                    (long long)lr_slot_pos(l, &l->st, slot));
                    break;
                }
                st = pieces_add(l, sg, mode && s->routes_ok && s->routes != NULL,
                                which == LR_PASS_OLD);
            }
            int32_t lim = l->N;
            for (int64_t p0 = 0, p1; st == ARL_OK && p0 < l->n_pieces; p0 = p1) {
                pack_call(l, p0, &p1, lim);
                const int32_t nd = (int32_t)(p1 - p0);
                const int64_t T = fill_call(l, p0, p1, NULL, l->traj_slot);
                const int replay = l->pieces[p0].replay;
                int64_t n_media = 0;
                st = which == LR_PASS_OLD
                         ? lr_media_call(l, p0, p1, l->in.params, l->in.opt->step, &n_media)
                         : lr_media_call(l, p0, p1, l->in.ref_params, -1, &n_media);
                if (st) break;
                arl_batch bt = call_batch(l, T, nd, replay, n_media);
                arl_forward_out fo = {.logprobs = l->lp};
                if (which == LR_PASS_OLD) {
                    fo.entropy = l->ent;
                    if (replay && l->n_moe > 0) fo.router_scores = l->rscores;
                }
                st = lr_forward_state(l, m, &l->st, l->slots, &bt, &fo);
                if (call_split(l, &st, nd, &lim)) {
                    p1 = p0;
                    continue;
                }
                if (st) break;
                int64_t off = 0;
                for (int64_t q = p0; q < p1; q++) {
                    const lr_piece *p = &l->pieces[q];
                    arl_upd_seg *s = &b->segs[p->seg];
                    const int64_t n = p->b - p->a;
                    double *dst = which == LR_PASS_OLD ? s->lp_old : s->lp_ref;
                    for (int64_t i = 0; i < n; i++) {
                        const int64_t tp = p->a + i + 1;
                        if (tp >= s->T) break;
                        dst[tp] = s->amask[tp] ? (double)l->lp[off + i] : 0.0;
                        if (which == LR_PASS_OLD) s->entropy[tp] = (double)l->ent[off + i];
                    }
                    if (which == LR_PASS_OLD && replay && l->n_moe > 0)
                        agreement(l, s, p->a, n, off, T);
                    if (p->last && which == LR_PASS_OLD && s->has_next)
                        st = export_state(l, s, l->traj_slot[s->traj], mode);
                    if (st == ARL_OK && p->last && which == LR_PASS_OLD)
                        st = lr_states_put(l, s, l->traj_slot[s->traj], mode);
                    off += n;
                }
            }
        }
        for (int32_t i = c0; i < c1; i++)
            if (l->traj_slot[list[i]] >= 0) {
                lr_slot_leave(l, &l->st, l->traj_slot[list[i]]);
                l->traj_slot[list[i]] = -1;
            }
    }
    free(list);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* start states and the gradient pass                                                           */

/* Forward segment sg (no gradient, current weights) continuing slot, in pieces. */
static arl_status feed_segment(arl_learner *l, int32_t sg, int32_t slot, int64_t *tokens) {
    const arl_upd_seg *s = &l->b.segs[sg];
    const int replay = l->lc.routing_replay && s->routes_ok && s->routes != NULL;
    for (int64_t a = 0; a < s->n_fed; a += l->Tm) {
        const int64_t n = a + l->Tm < s->n_fed ? l->Tm : s->n_fed - a;
        for (int64_t i = 0; i < n; i++) {
            l->tok[i] = s->tokens[a + i];
            l->tgt[i] = a + i + 1 < s->T ? s->tokens[a + i + 1] : -1;
        }
        if (replay)
            for (int64_t j = 0; j < l->n_moe; j++)
                memcpy(l->forced + j * n * l->k, s->routes + (j * s->T + a) * l->k,
                       sizeof(int32_t) * (size_t)(n * l->k));
        int64_t n_media = 0;
        ARL_TRY(lr_media_span(l, sg, a, a + n, l->in.params, l->in.opt->step, &n_media));
        arl_batch bt = {.tokens = l->tok,
                        .T = n,
                        .N = 1,
                        .media = n_media > 0 ? l->media : NULL,
                        .n_media = n_media,
                        .targets = l->tgt,
                        .forced_routes = replay ? l->forced : NULL};
        arl_forward_out fo = {.logprobs = l->lp};
        ARL_TRY(lr_forward_state(l, &l->m, &l->st, &slot, &bt, &fo));
        if (tokens) *tokens += n;
    }
    return ARL_OK;
}

/* Recompute the prefix of continue segment sg (segments from the last fresh start up to
 * sg - 1) into slot at the current weights. */
static arl_status recompute_prefix(arl_learner *l, int32_t sg, int32_t slot, int64_t *tokens) {
    const arl_upd_seg *s = &l->b.segs[sg];
    const arl_upd_traj *t = &l->b.trajs[s->traj];
    int32_t f = sg - 1;
    while (f > t->seg0 && !l->b.segs[f].fresh)
        f--;
    lr_slot_reset(l, &l->st, slot);
    for (int32_t j = f; j < sg; j++)
        ARL_TRY(feed_segment(l, j, slot, tokens));
    if (lr_slot_pos(l, &l->st, slot) != s->ctx_start)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "learner: trajectory %s segment %d starts at context position %lld, "
                          "its recomputed prefix ends at %lld",
                          t->row.traj_uid, (int)s->seg_index, (long long)s->ctx_start,
                          (long long)lr_slot_pos(l, &l->st, slot));
    return ARL_OK;
}

arl_status lr_start_state(arl_learner *l, int32_t sg, int32_t slot) {
    const arl_upd_seg *s = &l->b.segs[sg];
    const arl_upd_traj *t = &l->b.trajs[s->traj];
    ARL_ASSERT(!s->fresh && sg > t->seg0);
    const arl_upd_seg *prev = &l->b.segs[sg - 1];
    l->cnt.starts++;
    arl_state_entry *e = arl_state_cache_find(&l->cache, t->shard_id, t->traj_id, prev->seg_index);
    const int64_t need_step = l->lc.prefix_per_minibatch ? l->in.opt->step : -1;
    if (arl_state_entry_valid(e, l->numerics, l->update_n, l->lc.routing_replay, need_step)) {
        arl_status st = lr_slot_import(l, &l->st, slot, e->buf, e->len);
        if (st == ARL_OK && lr_slot_pos(l, &l->st, slot) == s->ctx_start) {
            l->cnt.hits++;
            return ARL_OK;
        }
        arl_log_warn("learner: cached state of %s segment %d unusable (%s); recomputing",
                     t->row.traj_uid, (int)prev->seg_index,
                     st ? arl_error_msg() : "position mismatch");
        arl_error_clear();
    }
    return recompute_prefix(l, sg, slot, &l->cnt.recompute_tokens);
}

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* state/prefix_drift of one continue segment: recompute its prefix at the current weights and
 * compare its action-token log-probs with the ones of the gradient pass. */
static arl_status drift_segment(arl_learner *l, int32_t sg) {
    const arl_upd_seg *s = &l->b.segs[sg];
    int32_t slot;
    ARL_TRY(lr_slot_join(l, &l->st, &slot));
    arl_status st = recompute_prefix(l, sg, slot, NULL);
    double sum = 0;
    int64_t cnt = 0;
    const int replay = l->lc.routing_replay && s->routes_ok && s->routes != NULL;
    for (int64_t a = 0; st == ARL_OK && a < s->n_fed; a += l->Tm) {
        const int64_t n = a + l->Tm < s->n_fed ? l->Tm : s->n_fed - a;
        for (int64_t i = 0; i < n; i++) {
            l->tok[i] = s->tokens[a + i];
            l->tgt[i] = a + i + 1 < s->T ? s->tokens[a + i + 1] : -1;
        }
        if (replay)
            for (int64_t j = 0; j < l->n_moe; j++)
                memcpy(l->forced + j * n * l->k, s->routes + (j * s->T + a) * l->k,
                       sizeof(int32_t) * (size_t)(n * l->k));
        int64_t n_media = 0;
        st = lr_media_span(l, sg, a, a + n, l->in.params, l->in.opt->step, &n_media);
        if (st) break;
        arl_batch bt = {.tokens = l->tok,
                        .T = n,
                        .N = 1,
                        .media = n_media > 0 ? l->media : NULL,
                        .n_media = n_media,
                        .targets = l->tgt,
                        .forced_routes = replay ? l->forced : NULL};
        arl_forward_out fo = {.logprobs = l->lp};
        st = lr_forward_state(l, &l->m, &l->st, &slot, &bt, &fo);
        for (int64_t i = 0; st == ARL_OK && i < n; i++) {
            const int64_t tp = a + i + 1;
            if (tp < s->T && s->amask[tp]) {
                sum += fabs((double)l->lp[i] - s->lp_theta[tp]);
                cnt++;
            }
        }
    }
    lr_slot_leave(l, &l->st, slot);
    if (st == ARL_OK && cnt) {
        l->cnt.drift_sum += sum / (double)cnt;
        l->cnt.drift_n++;
    }
    return st;
}

/* lr_grad_pass (backward 1) and lr_loss_pass (backward 0: forward and loss only). */
static arl_status grad_pass(arl_learner *l, const arl_loss_params *lp, int32_t mb, int drift,
                            arl_loss_acc *acc, int backward, double *loss_sum) {
    arl_update_batch *b = &l->b;
    pieces_reset(l);
    arl_status st = ARL_OK;
    /* the minibatch's local segments with something to train, in minibatch order */
    const int32_t *order;
    int32_t no;
    ARL_TRY(lr_minibatch_order(l, mb, &order, &no));
    /* the shared prefixes this minibatch starts from, under this step's weights (a loss pass
     * at the same step reuses them: no gradient reaches a prefix state, so the loss of
     * perturbed weights starts from the same one, like a cached start state) */
    int any = 0;
    for (int32_t g = 0; g < l->px_n; g++)
        l->px[g].need = 0;
    for (int32_t i = 0; i < no; i++) {
        const arl_upd_seg *s = &b->segs[order[i]];
        if (!s->local || !s->mk.m || s->n_action == 0 || s->n_fed == 0 || s->shared_start <= 0)
            continue;
        lr_px *x = &l->px[b->trajs[s->traj].group];
        if (backward || x->kind != LR_PX_STEP || x->step != l->in.opt->step) {
            x->need = 1;
            any = 1;
        }
    }
    if (any)
        ARL_TRY(px_compute(l, &l->m, l->lc.routing_replay, 0, LR_PX_STEP, l->in.opt->step));
    if (backward) ARL_TRY(lr_grads_begin(l));
    pieces_reset(l);
    for (int32_t i = 0; st == ARL_OK && i < no; i++) {
        const arl_upd_seg *s = &b->segs[order[i]];
        if (!s->local || !s->mk.m || s->n_action == 0 || s->n_fed == 0) continue;
        st = pieces_add(l, order[i], l->lc.routing_replay && s->routes_ok && s->routes != NULL, 1);
    }
    int32_t lim = l->N;
    for (int64_t p0 = 0, p1; st == ARL_OK && p0 < l->n_pieces; p0 = p1) {
        pack_call(l, p0, &p1, lim);
        const int32_t nd = (int32_t)(p1 - p0);
        /* start states of the segments that begin in this call (a call made again with fewer
         * documents: those of the first try are started already) */
        for (int64_t q = p0; st == ARL_OK && q < p1; q++) {
            const lr_piece *p = &l->pieces[q];
            if (!p->first || l->seg_slot[p->seg] >= 0) continue;
            st = lr_slot_join(l, &l->st, &l->seg_slot[p->seg]);
            if (st == ARL_OK && !b->segs[p->seg].fresh)
                st = lr_start_state(l, p->seg, l->seg_slot[p->seg]);
            else if (st == ARL_OK && b->segs[p->seg].shared_start > 0)
                st = px_import(l, p->seg, l->seg_slot[p->seg]);
        }
        if (st) break;
        const int64_t T = fill_call(l, p0, p1, l->seg_slot, NULL);
        const int replay = l->pieces[p0].replay;
        int64_t n_media = 0;
        st = lr_media_call(l, p0, p1, l->in.params, l->in.opt->step, &n_media);
        if (st) break;
        arl_batch bt = call_batch(l, T, nd, replay, n_media);
        arl_forward_out fo = {.logprobs = l->lp};
        if (backward && l->qb_on && l->n_moe > 0) {
            fo.router_scores = l->rscores;
            fo.routes = l->routes_out;
        }
        st = lr_train_forward(l, l->slots, &bt, &fo);
        if (call_split(l, &st, nd, &lim)) {
            p1 = p0;
            continue;
        }
        if (st) break;
        int64_t off = 0;
        for (int64_t q = p0; st == ARL_OK && q < p1; q++) {
            const lr_piece *p = &l->pieces[q];
            arl_upd_seg *s = &b->segs[p->seg];
            const arl_upd_traj *t = &b->trajs[s->traj];
            const int64_t n = p->b - p->a;
            const int64_t r0 = p->a + 1, r1 = p->b + 1 < s->T ? p->b + 1 : s->T;
            const int64_t nt = r1 > r0 ? r1 - r0 : 0;
            for (int64_t i = 0; i < nt; i++)
                s->lp_theta[r0 + i] = s->amask[r0 + i] ? (double)l->lp[off + i] : 0.0;
            for (int64_t i = 0; i < n; i++)
                l->dlogp[off + i] = 0.0f;
            if (nt > 0) {
                arl_loss_seg v = {.n_tok = nt,
                                  .loss_mask = s->amask + r0,
                                  .lp_mu = s->lp_mu + r0,
                                  .lp_old = s->lp_old + r0,
                                  .lp_ref = s->lp_ref + r0,
                                  .adv = s->adv + r0,
                                  .versions = s->versions + r0,
                                  .routes_ok = s->routes_ok,
                                  .traj_tokens = t->n_tokens,
                                  .inv_norm = t->inv_norm};
                double loss = 0;
                st = arl_loss_seg_step(lp, &v, &s->mk, s->lp_theta + r0, &loss, l->gtmp, acc);
                if (loss_sum) *loss_sum += loss;
                for (int64_t i = 0; st == ARL_OK && i < nt; i++)
                    l->dlogp[off + i] = (float)l->gtmp[i];
            }
            off += n;
        }
        if (st) break;
        if (backward) {
            if (n_media > 0) memset(l->dmedia, 0, sizeof(float) * (size_t)(n_media * l->dm.d));
            st = lr_backward(l, &bt, l->dlogp, n_media > 0 ? l->dmedia : NULL);
            if (st) break;
            lr_media_grad(l, n_media);
        }
        if (backward && l->qb_on && l->n_moe > 0) {
            for (int64_t layer = 0; st == ARL_OK && layer < l->dm.L; layer++) {
                const int64_t j = l->m.moe_index[layer];
                if (j < 0) continue;
                float *sc;
                int32_t *sel;
                st = arl_router_scores_append(&l->rs, layer, T, &sc, &sel);
                if (st) {
                    st = arl_error_prefix(st, "learner: router scores of a step");
                    break;
                }
                memcpy(sc, l->rscores + j * T * l->E, sizeof(float) * (size_t)(T * l->E));
                memcpy(sel, l->routes_out + j * T * l->k, sizeof(int32_t) * (size_t)(T * l->k));
            }
        }
        for (int64_t q = p0; q < p1; q++) {
            const lr_piece *p = &l->pieces[q];
            if (p->last) {
                lr_slot_leave(l, &l->st, l->seg_slot[p->seg]);
                l->seg_slot[p->seg] = -1;
            }
        }
    }
    if (st == ARL_OK && backward) st = lr_grads_end(l);
    /* the image rows' gradient through the vision tower (the weights are still this step's) */
    if (st == ARL_OK && backward) st = lr_media_backward(l);
    if (st == ARL_OK && drift && l->lc.drift_sample > 0) {
        for (int32_t i = 0; st == ARL_OK && i < no; i++) {
            const arl_upd_seg *s = &b->segs[order[i]];
            if (!s->local || s->fresh || !s->mk.m || s->n_action == 0) continue;
            const arl_upd_traj *t = &b->trajs[s->traj];
            uint64_t h = mix64((uint64_t)t->traj_id * 1000003u + (uint64_t)s->seg_index +
                               ((uint64_t)l->update_n << 40));
            if ((double)(h >> 11) * 0x1.0p-53 >= l->lc.drift_sample) continue;
            st = drift_segment(l, order[i]);
        }
    }
    /* release slots of an aborted call */
    for (int32_t i = 0; i < b->n_segs; i++)
        if (l->seg_slot[i] >= 0) {
            lr_slot_leave(l, &l->st, l->seg_slot[i]);
            l->seg_slot[i] = -1;
        }
    return st;
}

arl_status lr_grad_pass(arl_learner *l, const arl_loss_params *lp, int32_t mb, int drift,
                        arl_loss_acc *acc) {
    return grad_pass(l, lp, mb, drift, acc, 1, NULL);
}

arl_status lr_loss_pass(arl_learner *l, const arl_loss_params *lp, int32_t mb, double *loss) {
    *loss = 0;
    return grad_pass(l, lp, mb, 0, NULL, 0, loss);
}
