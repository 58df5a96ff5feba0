/* The generator is deterministic per seed, streams differ, and moments are sane. */
#include "core/rng.h"
#include "tests/test.h"

static void test_determinism(void) {
    arl_rng a, b, c;
    arl_rng_seed(&a, 42);
    arl_rng_seed(&b, 42);
    arl_rng_seed_stream(&c, 42, 1);
    int same_c = 1;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = arl_rng_next(&a), y = arl_rng_next(&b), z = arl_rng_next(&c);
        CHECK(x == y);
        if (x != z) same_c = 0;
    }
    CHECK(!same_c);
    /* a fixed value pins the algorithm: a change of generator breaks saved runs */
    arl_rng_seed(&a, 0);
    CHECK(arl_rng_next(&a) == 0x99ec5f36cb75f2b4ULL);
}

static void test_moments(void) {
    arl_rng r;
    arl_rng_seed(&r, 7);
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = arl_rng_normal(&r);
        s += x;
        s2 += x * x;
    }
    /* 200k samples: standard error of the mean 0.0022, of the variance 0.0032 */
    CHECK_CLOSE(s / n, 0.0, 0.015, 0);
    CHECK_CLOSE(s2 / n, 1.0, 0.02, 0);
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) counts[arl_rng_below(&r, 10)]++;
    for (int i = 0; i < 10; i++) CHECK(counts[i] > 9500 && counts[i] < 10500);
}

int main(void) {
    TEST_RUN(test_determinism);
    TEST_RUN(test_moments);
    return test_finish();
}
