/* core/rng.h: the one pseudo-random generator of the toolkit (xoshiro256**, seeded by
 * splitmix64).  Deterministic for a seed on every platform; its state is four words,
 * saved and restored verbatim by train state and environments.  Not for cryptography. */
#ifndef ARL_CORE_RNG_H
#define ARL_CORE_RNG_H

#include <stdint.h>

typedef struct arl_rng {
    uint64_t s[4];
} arl_rng;

void arl_rng_seed(arl_rng *r, uint64_t seed);
/* Independent stream `stream` of seed (e.g. one per layer or per sequence). */
void arl_rng_seed_stream(arl_rng *r, uint64_t seed, uint64_t stream);
uint64_t arl_rng_next(arl_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double arl_rng_uniform(arl_rng *r);
/* Uniform integer in [0, n); n > 0; unbiased (rejection). */
uint64_t arl_rng_below(arl_rng *r, uint64_t n);
/* Standard normal (Box-Muller, both values used in turn are NOT cached: one draw = two
 * uniforms, so the stream position depends only on the number of calls). */
double arl_rng_normal(arl_rng *r);

#endif
