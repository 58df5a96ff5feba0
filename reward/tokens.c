/* reward/tokens.c: the token side of the advantages -- counting each turn's action tokens and
 * summing its k1 increment kappa (spec/objective.md section 5.7) over windows of the token
 * stream, and mapping per-turn advantages onto tokens (section 5.8) via the turn ranges and
 * the loss mask.  Not here: the advantages themselves (reward/advantage.c). */
#include <math.h>

#include "reward/reward.h"

/* First turn whose range ends after position p (turns are ordered and disjoint). */
static int32_t first_turn_after(const arl_reward_turn *turns, int32_t n_turns, int64_t p) {
    int32_t lo = 0, hi = n_turns;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (turns[mid].tok_end <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

arl_status arl_reward_turns_scan(arl_reward_turn *turns, int32_t n_turns, int64_t tok_off,
                                 int64_t n, const uint8_t *loss_mask, const double *lp_old,
                                 const double *lp_ref) {
    if (n < 0 || tok_off < 0 || (n > 0 && !loss_mask) || (n_turns > 0 && !turns))
        return arl_errorf(ARL_ERR_ARG, "reward: token scan of window [%lld, +%lld): bad arguments",
                          (long long)tok_off, (long long)n);
    int with_kl = lp_old && lp_ref;
    int32_t k = first_turn_after(turns, n_turns, tok_off);
    for (int64_t x = 0; x < n && k < n_turns; x++) {
        int64_t p = tok_off + x;
        while (k < n_turns && turns[k].tok_end <= p)
            k++;
        if (k >= n_turns) break;
        if (p < turns[k].tok_start || !loss_mask[x]) continue;
        turns[k].n_action++;
        if (with_kl) {
            if (!isfinite(lp_old[x]) || !isfinite(lp_ref[x]))
                return arl_errorf(ARL_ERR_ARG,
                                  "reward: token %lld (turn %d): log-probabilities "
                                  "old %g, ref %g are not finite",
                                  (long long)p, k + 1, lp_old[x], lp_ref[x]);
            turns[k].kappa += lp_old[x] - lp_ref[x];
        }
    }
    return ARL_OK;
}

arl_status arl_reward_token_adv(const arl_reward_traj *tr, int64_t tok_off, int64_t n,
                                const uint8_t *loss_mask, double *adv) {
    if (n < 0 || tok_off < 0 || (n > 0 && (!loss_mask || !adv)))
        return arl_errorf(ARL_ERR_ARG,
                          "reward: token advantages of window [%lld, +%lld): bad "
                          "arguments",
                          (long long)tok_off, (long long)n);
    for (int64_t x = 0; x < n; x++)
        adv[x] = 0.0;
    if (tr->status == ARL_REWARD_TRAJ_MASKED || tr->n_turns <= 0) return ARL_OK;
    if (!tr->out.adv_turn)
        return arl_errorf(ARL_ERR_ARG, "reward: token advantages need out.adv_turn of the "
                                       "trajectory (computed by arl_reward_compute)");
    const arl_reward_turn *turns = tr->turns;
    int32_t K = tr->n_turns;
    int32_t k = first_turn_after(turns, K, tok_off);
    for (int64_t x = 0; x < n && k < K; x++) {
        int64_t p = tok_off + x;
        while (k < K && turns[k].tok_end <= p)
            k++;
        if (k >= K) break;
        if (p >= turns[k].tok_start && loss_mask[x]) adv[x] = tr->out.adv_turn[k];
    }
    return ARL_OK;
}
