/* tests/policy_model/test_sample.c: token sampling (policy/sample.h): greedy choice and its
 * ties, the raw-policy and sampling log-probabilities, the nucleus set, the distribution of
 * draws, and determinism for a seed.
 *
 * Tolerances: log-probabilities are computed in double and stored as fp32: |error| <= 1e-6
 * (a few fp32 ulps of values of order 1-10).  Frequencies of 200000 seeded draws: within
 * 0.005 of the probability (5 standard deviations of a binomial with p <= 0.5 is 0.0056;
 * the stream is fixed, so the test is deterministic).
 */
#include <math.h>

#include "policy/sample.h"
#include "tests/test.h"

static void test_greedy(void) {
    arl_sampler s;
    CHECK(arl_sampler_init(&s, 5) == ARL_OK);
    const float z[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    arl_sample_params p = {.temperature = 0.0, .top_p = 1.0};
    arl_rng r;
    arl_rng_seed(&r, 1);
    float lps, lpr;
    int32_t t = arl_sample(&s, z, &p, &r, &lps, &lpr);
    CHECK_EQ_INT(t, 1); /* tie between 1 and 3 goes to the lower index */
    CHECK(lps == 0.0f);
    double lse = 0;
    for (int i = 0; i < 5; i++)
        lse += exp(z[i]);
    CHECK_CLOSE(lpr, 2.0 - log(lse), 1e-6, 0);
    arl_sampler_free(&s);
}

static void test_top_p_and_distribution(void) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1 */
    const double pr[4] = {0.5, 0.3, 0.15, 0.05};
    float z[4];
    for (int i = 0; i < 4; i++)
        z[i] = (float)log(pr[i]);
    arl_sampler s;
    CHECK(arl_sampler_init(&s, 4) == ARL_OK);
    arl_rng r;
    arl_rng_seed(&r, 42);
    arl_sample_params full = {.temperature = 1.0, .top_p = 1.0};
    arl_sample_params nuc = {.temperature = 1.0, .top_p = 0.7}; /* keeps {0, 1}: mass 0.8 */
    enum { N = 200000 };
    int64_t cnt[4] = {0}, cnt2[4] = {0};
    for (int i = 0; i < N; i++)
        cnt[arl_sample(&s, z, &full, &r, NULL, NULL)]++;
    for (int i = 0; i < N; i++)
        cnt2[arl_sample(&s, z, &nuc, &r, NULL, NULL)]++;
    for (int i = 0; i < 4; i++)
        CHECK_CLOSE((double)cnt[i] / N, pr[i], 0.005, 0);
    CHECK_CLOSE((double)cnt2[0] / N, 0.5 / 0.8, 0.005, 0);
    CHECK_CLOSE((double)cnt2[1] / N, 0.3 / 0.8, 0.005, 0);
    CHECK_EQ_INT(cnt2[2] + cnt2[3], 0);
    float lps, lpr;
    for (int tries = 0; tries < 20; tries++) {
        int32_t t = arl_sample(&s, z, &nuc, &r, &lps, &lpr);
        CHECK_CLOSE(lps, log(pr[t] / 0.8), 1e-6, 0);
        CHECK_CLOSE(lpr, log(pr[t]), 1e-6, 0);
    }
    /* temperature 2: q proportional to sqrt(p) */
    arl_sample_params hot = {.temperature = 2.0, .top_p = 1.0};
    double zs = 0;
    for (int i = 0; i < 4; i++)
        zs += sqrt(pr[i]);
    int32_t t = arl_sample(&s, z, &hot, &r, &lps, &lpr);
    CHECK_CLOSE(lps, log(sqrt(pr[t]) / zs), 1e-6, 0);
    CHECK_CLOSE(lpr, log(pr[t]), 1e-6, 0);
    /* bad parameters */
    arl_sample_params bad = {.temperature = 1.0, .top_p = 0.0};
    CHECK(arl_sample_params_check(&bad) == ARL_ERR_ARG);
    bad.top_p = 1.5;
    CHECK(arl_sample_params_check(&bad) == ARL_ERR_ARG);
    bad.top_p = 1.0;
    bad.temperature = NAN;
    CHECK(arl_sample_params_check(&bad) == ARL_ERR_ARG);
    CHECK(arl_sample_params_check(&nuc) == ARL_OK);
    arl_sampler_free(&s);
}

static void test_deterministic(void) {
    enum { V = 300 };
    float z[V];
    for (int i = 0; i < V; i++)
        z[i] = (float)sin(i * 0.37) * 3.0f;
    arl_sampler s;
    CHECK(arl_sampler_init(&s, V) == ARL_OK);
    arl_sample_params p = {.temperature = 0.8, .top_p = 0.95};
    int32_t a[64], b[64];
    for (int run = 0; run < 2; run++) {
        arl_rng r;
        arl_rng_seed_stream(&r, 123, 7);
        for (int i = 0; i < 64; i++)
            (run ? b : a)[i] = arl_sample(&s, z, &p, &r, NULL, NULL);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    arl_sampler_free(&s);
}

int main(void) {
    TEST_RUN(test_greedy);
    TEST_RUN(test_top_p_and_distribution);
    TEST_RUN(test_deterministic);
    return test_finish();
}
