/* policy/sample.h: drawing the next token from a row of logits (temperature, nucleus / top-p),
 * deterministic for a given random stream, with the log-probability of the drawn token both
 * under the sampling distribution and under the raw policy (temperature 1, no truncation).
 *
 * What this is: the per-row sampling rule used by `agentrl generate` and by rollout workers.
 * What this is not: a generation loop (rollout/, cli/cmd_generate.c) or a sampler of several
 * sequences' streams (the caller keeps one arl_rng per sequence, e.g. arl_rng_seed_stream(
 * seed, sequence id), so a sequence's draws do not depend on what else is in the batch).
 *
 * Rule, for logits z (V), temperature tau and top_p:
 *   tau <= 0: greedy, the arg max (lowest index on ties); its sampling log-prob is 0.
 *   otherwise q_i = exp((z_i - max z) / tau) / sum; with top_p < 1 the kept set is the
 *   smallest prefix of the tokens sorted by q descending (ties: lower index first) whose mass
 *   reaches top_p, renormalised; the token is the first of the kept tokens (in that order,
 *   or index order when top_p >= 1) at which the running mass exceeds u * kept mass, with u
 *   one arl_rng_uniform draw.  Sums in double.
 *   logp_raw = z_tok - logsumexp(z) (fp32 result of a double computation).
 */
#ifndef ARL_POLICY_SAMPLE_H
#define ARL_POLICY_SAMPLE_H

#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"

typedef struct arl_sample_params {
    double temperature; /* tau; <= 0 means greedy */
    double top_p;       /* (0, 1]; 1 = no truncation */
} arl_sample_params;

/* Work buffers for rows of V logits; allocated once, reused for every draw. */
typedef struct arl_sampler {
    int64_t V;
    double *q;    /* (V) owned */
    int32_t *idx; /* (V) owned */
} arl_sampler;

arl_status arl_sampler_init(arl_sampler *s, int64_t V);
void arl_sampler_free(arl_sampler *s); /* NULL is a no-op */

/* ARL_ERR_ARG unless top_p is in (0, 1] and the temperature is finite. */
arl_status arl_sample_params_check(const arl_sample_params *p);

/* Draw a token from logits (V) (finite values).  logp_sample / logp_raw may be NULL.
 * Consumes one rng draw unless greedy. */
int32_t arl_sample(arl_sampler *s, const float *logits, const arl_sample_params *p, arl_rng *rng,
                   float *logp_sample, float *logp_raw);

#endif
