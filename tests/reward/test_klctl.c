/* The adaptive KL controller (learner/kl_ctl.h, spec/objective.md section 7): steps against
 * hand-computed values, bounds, placements, configuration errors and exact resume from the
 * state written as text.
 *
 * Hand values are products of a few decimals; they are compared with a relative tolerance of
 * 1e-14 (a few float64 roundings). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "learner/kl_ctl.h"
#include "tests/test.h"

#define RT 1e-14

static arl_klctl make(arl_kl_placement pl, double coef0, double lambda2) {
    arl_kl_config c;
    arl_kl_config_default(&c);
    c.placement = pl;
    c.coef0 = coef0;
    c.lambda2 = lambda2;
    arl_klctl k;
    CHECK(arl_klctl_init(&k, &c) == ARL_OK);
    return k;
}

static void test_steps_by_hand(void) {
    /* defaults: target 5e-3, H = 1000, bounds [1e-6, 1] */
    arl_klctl k = make(ARL_KL_PLACEMENT_REWARD, 1e-3, 0);
    CHECK(arl_klctl_beta(&k) == 1e-3 && arl_klctl_lambda2(&k) == 0);
    static const struct {
        double kl;
        int64_t n;
        double e, g, coef;
        int adapted;
    } steps[] = {
        /* KL/target - 1 = 1 -> e = 0.2; g = 8/1000; c = 1e-3 (1 + 0.0016) */
        {0.01, 8, 0.2, 0.008, 0.0010016, 1},
        /* 0.8 - 1 = -0.2; g = 0.5; c = 0.0010016 * 0.9 */
        {0.004, 500, -0.2, 0.5, 0.00090144, 1},
        /* 1.1 - 1 = 0.1; g = min(2, 1) = 1; c = 0.00090144 * 1.1 */
        {0.0055, 2000, 0.1, 1, 0.000991584, 1},
        /* no estimate (no unmasked token): unchanged */
        {NAN, 8, 0, 0.008, 0.000991584, 0},
        /* on target: unchanged */
        {0.005, 8, 0, 0.008, 0.000991584, 1},
        /* KL 0: error -1 clipped to -0.2, g = 1: c = 0.000991584 * 0.8 */
        {0.0, 1000, -0.2, 1, 0.0007932672, 1},
        /* no valid trajectory: unchanged */
        {0.02, 0, 0.2, 0, 0.0007932672, 0},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        arl_klctl_step st;
        double before = k.coef;
        CHECK(arl_klctl_update(&k, steps[i].kl, steps[i].n, &st) == ARL_OK);
        CHECK(st.coef_used == before);
        CHECK_CLOSE(st.e, steps[i].e, 1e-15, RT);
        CHECK_CLOSE(st.g, steps[i].g, 0, RT);
        CHECK_CLOSE(st.coef_next, steps[i].coef, 0, RT);
        CHECK_CLOSE(arl_klctl_beta(&k), steps[i].coef, 0, RT);
        CHECK_EQ_INT(st.adapted, steps[i].adapted);
    }
    CHECK_EQ_INT(k.updates, 7);
}

static void test_bounds_and_placements(void) {
    arl_klctl k = make(ARL_KL_PLACEMENT_REWARD, 0.9, 0);
    arl_klctl_step st;
    CHECK(arl_klctl_update(&k, 1.0, 5000, &st) == ARL_OK);
    CHECK(k.coef == 1.0); /* 0.9 * 1.2 = 1.08 clipped at c_max */
    k = make(ARL_KL_PLACEMENT_REWARD, 1.1e-6, 0);
    CHECK(arl_klctl_update(&k, 0.0, 5000, &st) == ARL_OK);
    CHECK(k.coef == 1e-6); /* 0.88e-6 clipped at c_min */
    k = make(ARL_KL_PLACEMENT_REWARD, 5.0, 0);
    CHECK(k.coef == 1.0); /* the initial value is clipped too */

    /* loss: lambda_2 adapts, beta = 0 */
    k = make(ARL_KL_PLACEMENT_LOSS, 1e-3, 0.01);
    CHECK(arl_klctl_beta(&k) == 0 && arl_klctl_lambda2(&k) == 0.01);
    CHECK(arl_klctl_update(&k, 0.01, 1000, &st) == ARL_OK);
    CHECK_CLOSE(arl_klctl_lambda2(&k), 0.012, 0, RT);
    /* both: beta adapts, lambda_2 fixed */
    k = make(ARL_KL_PLACEMENT_BOTH, 1e-3, 0.01);
    CHECK(arl_klctl_update(&k, 0.01, 1000, &st) == ARL_OK);
    CHECK_CLOSE(arl_klctl_beta(&k), 0.0012, 0, RT);
    CHECK(arl_klctl_lambda2(&k) == 0.01);
    /* none: nothing acts, nothing adapts, KL still reported */
    k = make(ARL_KL_PLACEMENT_NONE, 1e-3, 0);
    CHECK(arl_klctl_beta(&k) == 0 && arl_klctl_lambda2(&k) == 0);
    CHECK(arl_klctl_update(&k, 0.01, 1000, &st) == ARL_OK);
    CHECK(!st.adapted && k.coef == 1e-3 && st.error == 1.0);
    /* bad inputs */
    CHECK(arl_klctl_update(&k, -0.1, 10, &st) == ARL_ERR_ARG);
    CHECK(arl_klctl_update(&k, INFINITY, 10, &st) == ARL_ERR_ARG);
    CHECK(arl_klctl_update(&k, 0.1, -1, &st) == ARL_ERR_ARG);
}

static void test_config(void) {
    arl_kl_opts o;
    arl_kl_config c, d;
    arl_options_defaults(arl_kl_options, arl_kl_options_count, &o);
    CHECK(arl_kl_config_from_opts(&o, &c) == ARL_OK);
    arl_kl_config_default(&d);
    CHECK(c.placement == d.placement && c.coef0 == d.coef0 && c.lambda2 == d.lambda2 &&
          c.target == d.target && c.horizon == d.horizon && c.coef_min == d.coef_min &&
          c.coef_max == d.coef_max);
    arl_options_free(arl_kl_options, arl_kl_options_count, &o);
    arl_options_defaults(arl_kl_options, arl_kl_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_kl_options, arl_kl_options_count,
                                      "{\"kl_placement\": \"loss\"}", "t", &o) == ARL_OK);
    CHECK(arl_kl_config_from_opts(&o, &c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "kl-lambda2") != NULL);
    arl_options_free(arl_kl_options, arl_kl_options_count, &o);
    arl_options_defaults(arl_kl_options, arl_kl_options_count, &o);
    CHECK(arl_options_parse_json_text(arl_kl_options, arl_kl_options_count,
                                      "{\"kl_coef_min\": 0.5, \"kl_coef_max\": 0.1}", "t",
                                      &o) == ARL_OK);
    CHECK(arl_kl_config_from_opts(&o, &c) == ARL_ERR_CONFIG);
    arl_options_free(arl_kl_options, arl_kl_options_count, &o);
}

/* Save after 7 updates as text (17 significant digits), restore into a fresh controller, and
 * continue both with the same inputs: bit-identical coefficients. */
static void test_exact_resume(void) {
    arl_rng r;
    arl_rng_seed(&r, 42);
    double kl[12];
    int64_t n[12];
    for (int i = 0; i < 12; i++) {
        kl[i] = 0.01 * arl_rng_uniform(&r);
        n[i] = 1 + (int64_t)arl_rng_below(&r, 400);
    }
    arl_klctl a = make(ARL_KL_PLACEMENT_REWARD, 1e-3, 0);
    for (int i = 0; i < 7; i++)
        CHECK(arl_klctl_update(&a, kl[i], n[i], NULL) == ARL_OK);
    arl_klctl_state s;
    arl_klctl_state_get(&a, &s);
    char text[128];
    snprintf(text, sizeof text, "%.17g %lld", s.coef, (long long)s.updates);
    char *end;
    arl_klctl_state back = {strtod(text, &end), strtoll(end, NULL, 10)};
    arl_klctl b = make(ARL_KL_PLACEMENT_REWARD, 1e-3, 0);
    CHECK(arl_klctl_state_set(&b, &back) == ARL_OK);
    CHECK(!memcmp(&a.coef, &b.coef, sizeof a.coef) && b.updates == 7);
    for (int i = 7; i < 12; i++) {
        CHECK(arl_klctl_update(&a, kl[i], n[i], NULL) == ARL_OK);
        CHECK(arl_klctl_update(&b, kl[i], n[i], NULL) == ARL_OK);
        CHECK(!memcmp(&a.coef, &b.coef, sizeof a.coef));
    }
    /* damaged or foreign states are refused and leave the controller unchanged */
    double before = b.coef;
    arl_klctl_state bad[] = {{NAN, 3}, {2.0, 3}, {1e-9, 3}, {1e-3, -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(arl_klctl_state_set(&b, &bad[i]) == ARL_ERR_CORRUPT);
        CHECK(b.coef == before);
    }
}

typedef struct seen {
    double coef, target, error;
} seen;
static void grab(void *ctx, const char *name, double v) {
    seen *s = ctx;
    if (!strcmp(name, "kl/coef")) s->coef = v;
    if (!strcmp(name, "kl/target")) s->target = v;
    if (!strcmp(name, "kl/error")) s->error = v;
}

static void test_metrics(void) {
    arl_klctl k = make(ARL_KL_PLACEMENT_REWARD, 1e-3, 0);
    arl_klctl_step st;
    CHECK(arl_klctl_update(&k, 0.02, 10, &st) == ARL_OK);
    seen s = {0};
    arl_klctl_emit(&k, &st, grab, &s);
    CHECK(s.coef == 1e-3 && s.target == 5e-3);
    CHECK_CLOSE(s.error, 3.0, 0, RT); /* unclipped */
}

int main(void) {
    TEST_RUN(test_steps_by_hand);
    TEST_RUN(test_bounds_and_placements);
    TEST_RUN(test_config);
    TEST_RUN(test_exact_resume);
    TEST_RUN(test_metrics);
    return test_finish();
}
