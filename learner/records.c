/* learner/records.c: the learner_records of spec/replay.md 4.13, written after an update from
 * what it computed (learner/update.h arl_learner_records_write).
 *
 * Per token of a segment: the pi_old and reference log-probabilities of the update's passes,
 * the advantage (spec/objective.md 5.8), and, for action tokens, the truncated importance weight
 * w and the flags of the loss (learner/loss.h arl_loss_token_eval at the log-probabilities of
 * the segment's last gradient pass, so bit 7 is "clipped in the last minibatch").  Per segment:
 * its staleness, mean log-ratio and mask reason (arl_loss_seg_mask), and levels_json with the
 * terms of the advantage of each of its turns (A~^O, A~^S, A~^P, D, b^D, beta and A). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "learner/update_internal.h"

/* token_flags bits (spec/replay.md 4.13) */
enum {
    FLAG_ACTION = 1u << 0,
    FLAG_BAND = 1u << 1,
    FLAG_GEO = 1u << 2,
    FLAG_FRESH = 1u << 3,
    FLAG_ROUTES = 1u << 4,
    FLAG_VALID = 1u << 5,
    FLAG_TRUNCATED = 1u << 6,
    FLAG_CLIPPED = 1u << 7,
};

/* A JSON number (non-finite values as null). */
static int put_num(char *p, size_t cap, double v) {
    return isfinite(v) ? snprintf(p, cap, "%.17g", v) : snprintf(p, cap, "null");
}

/* levels_json of the segment at position seg_pos of t (its index without a fork prefix): {"AO":..,"AS":..,"AP":{"k":..},"D":{..},"bD":{..},
 * "beta":..,"A":{..}} over the turns k (1-based) the segment holds.  Returns the length, or
 * -1 when cap is too small. */
static int levels_json(const arl_upd_traj *t, int32_t seg_pos, double beta, char *out,
                       size_t cap) {
    size_t n = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int k_ = snprintf(out + n, cap - n, __VA_ARGS__);                                          \
        if (k_ < 0 || (size_t)k_ >= cap - n) return -1;                                            \
        n += (size_t)k_;                                                                           \
    } while (0)
#define NUM(v)                                                                                     \
    do {                                                                                           \
        int k_ = put_num(out + n, cap - n, v);                                                     \
        if (k_ < 0 || (size_t)k_ >= cap - n) return -1;                                            \
        n += (size_t)k_;                                                                           \
    } while (0)
    PUT("{\"AO\":");
    NUM(t->lv_outcome);
    PUT(",\"AS\":");
    NUM(t->lv_seg[seg_pos]);
    const double *per_turn[4] = {t->lv_proc, t->lv_kl, t->lv_klb, t->adv_turn};
    const char *names[4] = {"AP", "D", "bD", "A"};
    for (int a = 0; a < 4; a++) {
        if (a == 3) {
            PUT(",\"beta\":");
            NUM(beta);
        }
        PUT(",\"%s\":{", names[a]);
        int first = 1;
        for (int32_t k = 0; k < t->n_turns; k++) {
            if (t->turns[k].seg != seg_pos || t->turns[k].n_action == 0) continue;
            PUT("%s\"%d\":", first ? "" : ",", (int)k + 1);
            NUM(per_turn[a][k]);
            first = 0;
        }
        PUT("}");
    }
    PUT("}");
#undef PUT
#undef NUM
    return (int)n;
}

/* The record of segment s (local, of a valid trajectory) into w; buffers of at least s->T. */
static arl_status record_put(const arl_learner *l, int64_t n, const arl_upd_seg *s,
                             const arl_upd_traj *t, replay_writer *w, float *old, float *ref,
                             float *wt, uint8_t *flags, float *adv, char *lv, size_t lv_cap) {
    const arl_loss_seg_mask *mk = &s->mk;
    const int valid = t->valid && !t->media_bad;
    uint8_t seg_bits = (uint8_t)((mk->m_seg ? FLAG_GEO : 0) | (mk->m_stale ? FLAG_FRESH : 0) |
                                 (mk->m_route ? FLAG_ROUTES : 0) | (valid ? FLAG_VALID : 0));
    for (int64_t i = 0; i < s->T; i++) {
        old[i] = (float)s->lp_old[i];
        ref[i] = s->lp_ref ? (float)s->lp_ref[i] : NAN;
        adv[i] = (float)s->adv[i];
        wt[i] = 0.0f;
        flags[i] = seg_bits;
        if (!s->amask[i]) continue;
        arl_loss_token k;
        arl_loss_token_eval(&l->lpar, s->lp_mu[i], s->lp_old[i], s->lp_theta[i],
                            s->lp_ref ? s->lp_ref[i] : NAN, s->adv[i], mk->m, &k);
        wt[i] = (float)k.w;
        flags[i] |= (uint8_t)(FLAG_ACTION | (k.m_tok ? FLAG_BAND : 0) |
                              (k.truncated ? FLAG_TRUNCATED : 0) | (k.clipped ? FLAG_CLIPPED : 0));
    }
    const int32_t seg_pos = (int32_t)(s - l->b.segs) - t->seg0;
    if (levels_json(t, seg_pos, l->b.beta, lv, lv_cap) < 0)
        return arl_errorf(ARL_ERR_RANGE, "learner: %s segment %d: levels_json over %zu bytes",
                          t->row.traj_uid, (int)s->seg_index, lv_cap);
    const char *reason = !mk->m_route ? "routes" : !mk->m_stale ? "stale" : !mk->m_seg ? "geo" : NULL;
    const replay_learner_record r = {.run_id = t->row.run_id,
                                     .update_n = n,
                                     .traj_uid = t->row.traj_uid,
                                     .seg_index = s->seg_index,
                                     .version = n,
                                     .staleness = mk->staleness,
                                     .seg_mean_logratio = isfinite(mk->gbar) ? mk->gbar : 0.0,
                                     .mask_reason = reason,
                                     .levels_json = lv,
                                     .n_tokens = s->T,
                                     .old_logprobs = old,
                                     .ref_logprobs = ref,
                                     .is_weights = wt,
                                     .token_flags = flags,
                                     .advantages = adv};
    return replay_learner_record_put(w, &r);
}

arl_status arl_learner_records_write(const arl_learner *l, int64_t n, const arl_update_source *src,
                                     int32_t n_src, const int32_t *shards, int64_t *n_records) {
    *n_records = 0;
    const arl_update_batch *b = &l->b;
    int64_t T_max = 1, K_max = 1;
    for (int32_t i = 0; i < b->n_segs; i++)
        if (b->segs[i].T > T_max) T_max = b->segs[i].T;
    for (int32_t i = 0; i < b->n_trajs; i++)
        if (b->trajs[i].n_turns > K_max) K_max = b->trajs[i].n_turns;
    const size_t lv_cap = 256 + (size_t)K_max * 4 * 40;
    float *buf = malloc(sizeof(float) * (size_t)T_max * 4);
    uint8_t *flags = malloc((size_t)T_max);
    char *lv = malloc(lv_cap);
    arl_status s = buf && flags && lv ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
    for (int32_t si = 0; s == ARL_OK && si < n_src; si++) {
        replay_writer *w = NULL;
        for (int32_t i = 0; s == ARL_OK && i < b->n_segs; i++) {
            const arl_upd_seg *sg = &b->segs[i];
            const arl_upd_traj *t = &b->trajs[sg->traj];
            if (!t->valid || !t->local || !sg->local || b->groups[t->group].source != si) continue;
            if (!w) {
                s = replay_writer_open(src[si].store, REPLAY_FILE_LEARNER, shards[si], NULL, &w);
                if (s) {
                    s = arl_error_prefix(s, "learner: the learner file of %s", src[si].root);
                    break;
                }
            }
            const size_t T = (size_t)T_max;
            s = record_put(l, n, sg, t, w, buf, buf + T, buf + 2 * T, flags, buf + 3 * T, lv,
                           lv_cap);
            if (s == ARL_OK) (*n_records)++;
        }
        replay_writer_close(w);
    }
    free(buf);
    free(flags);
    free(lv);
    return s;
}
