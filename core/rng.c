/* core/rng.c: xoshiro256** with splitmix64 seeding (algorithms by Blackman and Vigna). */
#include "core/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void arl_rng_seed(arl_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

void arl_rng_seed_stream(arl_rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL);
    uint64_t mixed = splitmix64(&x);
    arl_rng_seed(r, mixed ^ stream);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t arl_rng_next(arl_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double arl_rng_uniform(arl_rng *r) {
    return (double)(arl_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t arl_rng_below(arl_rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = arl_rng_next(r);
    while (x >= limit);
    return x % n;
}

double arl_rng_normal(arl_rng *r) {
    double u1 = arl_rng_uniform(r);
    double u2 = arl_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}
