/* tests/experiments/test_heldout.c: the prompt-level held-out split (experiments/heldout.h) on
 * the calculator's level 1, whose ~770 distinct questions make seeds alone a leaky split:
 *   - held-out and training seeds never render the same question (the property the split is
 *     for), over 600 seeds of each side;
 *   - the same question is on the same side whatever its seed;
 *   - the held-out share of questions is near the fraction (0.3; the ~550 distinct questions of
 *     1000 seeds give a binomial standard error of 2 points, so [0.2, 0.4] fails only on a real
 *     bias);
 *   - frac 0 holds out nothing; the seed lists are increasing and deterministic;
 *   - errors: an unknown environment.
 * The three-sided split (test, validation, train) that honest tuning needs:
 *   - the three sides never share a question, over 300 seeds of each;
 *   - the test side does not move when a validation side is added (the test seeds equal the
 *     two-sided ones), and every training seed of the three-sided split was a training seed of
 *     the two-sided one (validation takes its questions from training only);
 *   - deterministic (the same lists twice), each question on one side whatever its seed;
 *   - validation's share of distinct questions is near its fraction (0.15 of ~550: standard
 *     error 1.5 points, so [0.08, 0.22] fails only on a real bias);
 *   - bad fractions are ARL_ERR_ARG; the experiment keys (validation-split, eval-set) are
 *     checked: validation needs eval-split > 0, eval-set=validation needs validation-split. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/teacher.h"
#include "experiments/heldout.h"
#include "experiments/train.h"
#include "tests/test.h"

#define N 600

/* The user question of a seed (the teacher's episode). */
static void question(uint64_t seed, char *out, size_t cap) {
    json_t *opts = json_pack("{si}", "level", 1), *empty = json_object(), *conv = NULL;
    char id[64];
    snprintf(id, sizeof id, "q-%llu", (unsigned long long)seed);
    arl_env_task t = {id, seed, empty};
    double outcome;
    out[0] = 0;
    if (arl_env_demo_episode("calculator", &t, opts, &conv, &outcome) == ARL_OK) {
        json_t *m = json_array_get(json_object_get(conv, "messages"), 1);
        snprintf(out, cap, "%s", json_string_value(json_object_get(m, "content")));
    }
    json_decref(conv);
    json_decref(empty);
    json_decref(opts);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_split(void) {
    static int64_t held[N], train[N], again[N];
    const char *o = "{\"level\": 1}";
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 1000, o, 0.3, 1, N, 100000, held), ARL_OK);
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 5000, o, 0.3, 0, N, 100000, train), ARL_OK);
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 1000, o, 0.3, 1, N, 100000, again), ARL_OK);
    CHECK(memcmp(held, again, sizeof held) == 0);
    for (int i = 1; i < N; i++)
        CHECK(held[i] > held[i - 1] && train[i] > train[i - 1]);
    static char qh[N][64], qt[N][64];
    static char *ph[N];
    for (int i = 0; i < N; i++) {
        question((uint64_t)held[i], qh[i], sizeof qh[i]);
        question((uint64_t)train[i], qt[i], sizeof qt[i]);
        CHECK(qh[i][0] && qt[i][0]);
        ph[i] = qh[i];
    }
    qsort(ph, N, sizeof ph[0], cmp_str);
    int leaks = 0;
    for (int i = 0; i < N; i++)
        leaks += bsearch(&(char *){qt[i]}, ph, N, sizeof ph[0], cmp_str) != NULL;
    CHECK_EQ_INT(leaks, 0);
    /* the same question is on the same side for every seed: a task's side is its prompt's */
    for (int i = 0; i < 50; i++) {
        int h;
        CHECK_EQ_INT(arl_heldout_task("calculator", (uint64_t)held[i], o, 0.3, &h), ARL_OK);
        CHECK_EQ_INT(h, 1);
        CHECK_EQ_INT(arl_heldout_task("calculator", (uint64_t)train[i], o, 0.3, &h), ARL_OK);
        CHECK_EQ_INT(h, 0);
    }
    /* share of distinct questions held out among the seeds 0..999 */
    static char qs[1000][64];
    static char *pq[1000];
    static int side[1000];
    for (int s = 0; s < 1000; s++) {
        question((uint64_t)s, qs[s], sizeof qs[s]);
        CHECK_EQ_INT(arl_heldout_task("calculator", (uint64_t)s, o, 0.3, &side[s]), ARL_OK);
        pq[s] = qs[s];
    }
    int distinct = 0, distinct_held = 0;
    for (int s = 0; s < 1000; s++) {
        int first = 1;
        for (int t = 0; t < s && first; t++)
            if (!strcmp(qs[t], qs[s])) {
                first = 0;
                CHECK_EQ_INT(side[t], side[s]);
            }
        distinct += first;
        distinct_held += first && side[s];
    }
    double share = (double)distinct_held / distinct;
    CHECK_MSG(distinct > 300 && share > 0.2 && share < 0.4, "%d distinct, %.3f held out", distinct,
              share);
    (void)pq;
}

static void test_edges(void) {
    int h = 1;
    CHECK_EQ_INT(arl_heldout_task("calculator", 7, "{\"level\": 1}", 0, &h), ARL_OK);
    CHECK_EQ_INT(h, 0);
    int64_t s[100];
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 0, NULL, 0.3, 1, 3, 10000, s), ARL_OK);
    /* a request that cannot be met within the scan limit: 100 held-out seeds among 10 */
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 0, NULL, 0.3, 1, 100, 10, s), ARL_ERR_RANGE);
    CHECK(arl_heldout_task("no-such-env", 1, NULL, 0.3, &h) != ARL_OK);
}

#define N3 300

static int in_sorted(char **sorted, int n, char *q) {
    return bsearch(&q, sorted, (size_t)n, sizeof sorted[0], cmp_str) != NULL;
}

static void test_three_sides(void) {
    const char *o = "{\"level\": 1}";
    const arl_heldout_split sp = {0.3, 0.15};
    static int64_t seeds[3][N3], again[3][N3], two[N3];
    const arl_heldout_side sides[3] = {ARL_HELDOUT_SIDE_TEST, ARL_HELDOUT_SIDE_VALIDATION,
                                       ARL_HELDOUT_SIDE_TRAIN};
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(arl_heldout_side_seeds("calculator", 1000, o, &sp, sides[k], N3, 100000,
                                            seeds[k]),
                     ARL_OK);
        CHECK_EQ_INT(arl_heldout_side_seeds("calculator", 1000, o, &sp, sides[k], N3, 100000,
                                            again[k]),
                     ARL_OK);
        CHECK(memcmp(seeds[k], again[k], sizeof seeds[k]) == 0);
        for (int i = 1; i < N3; i++)
            CHECK(seeds[k][i] > seeds[k][i - 1]);
    }
    /* the test side is the two-sided split's held-out side */
    CHECK_EQ_INT(arl_heldout_seeds("calculator", 1000, o, 0.3, 1, N3, 100000, two), ARL_OK);
    CHECK(memcmp(two, seeds[0], sizeof two) == 0);
    /* validation and training seeds were all training seeds of the two-sided split */
    for (int k = 1; k < 3; k++)
        for (int i = 0; i < N3; i++) {
            int h;
            CHECK_EQ_INT(arl_heldout_task("calculator", (uint64_t)seeds[k][i], o, 0.3, &h),
                         ARL_OK);
            CHECK_EQ_INT(h, 0);
        }
    /* no question on two sides */
    static char q[3][N3][64];
    static char *sorted[3][N3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N3; i++) {
            question((uint64_t)seeds[k][i], q[k][i], sizeof q[k][i]);
            CHECK(q[k][i][0]);
            sorted[k][i] = q[k][i];
        }
        qsort(sorted[k], N3, sizeof sorted[k][0], cmp_str);
    }
    int leaks = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            if (a != b)
                for (int i = 0; i < N3; i++)
                    leaks += in_sorted(sorted[b], N3, q[a][i]);
    CHECK_EQ_INT(leaks, 0);
    /* each seed's side, asked one by one, is the side it was listed under */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 40; i++) {
            arl_heldout_side side;
            CHECK_EQ_INT(arl_heldout_task_side("calculator", (uint64_t)seeds[k][i], o, &sp, &side),
                         ARL_OK);
            CHECK_EQ_INT(side, sides[k]);
        }
    /* validation's share of the distinct questions of seeds 0..999 */
    static char qs[1000][64];
    int distinct = 0, distinct_val = 0;
    for (int s = 0; s < 1000; s++) {
        question((uint64_t)s, qs[s], sizeof qs[s]);
        arl_heldout_side side;
        CHECK_EQ_INT(arl_heldout_task_side("calculator", (uint64_t)s, o, &sp, &side), ARL_OK);
        int first = 1;
        for (int t = 0; t < s && first; t++)
            first = strcmp(qs[t], qs[s]) != 0;
        distinct += first;
        distinct_val += first && side == ARL_HELDOUT_SIDE_VALIDATION;
    }
    double share = (double)distinct_val / distinct;
    CHECK_MSG(distinct > 300 && share > 0.08 && share < 0.22, "%d distinct, %.3f validation",
              distinct, share);
    /* bad fractions */
    const arl_heldout_split bad[3] = {{0.6, 0.5}, {-0.1, 0.2}, {0.3, -0.01}};
    for (int k = 0; k < 3; k++) {
        arl_heldout_side side;
        CHECK_EQ_INT(arl_heldout_task_side("calculator", 1, o, &bad[k], &side), ARL_ERR_ARG);
        CHECK_EQ_INT(arl_heldout_side_seeds("calculator", 1, o, &bad[k], ARL_HELDOUT_SIDE_TEST,
                                            1, 100, seeds[0]),
                     ARL_ERR_ARG);
    }
}

/* The experiment keys: an experiment given by --set lines only. */
static arl_status load_sets(const char *a, const char *b, const char *c) {
    const char *sets[] = {"model=tiny", "out=/tmp/arl-heldout-x", "rollout.env=builtin:calculator",
                          a, b, c};
    int n = 3 + (a != NULL) + (b != NULL) + (c != NULL);
    arl_strlist sl = {(char **)sets, n};
    arl_train_config cfg;
    arl_status s = arl_train_config_load(NULL, &sl, &cfg);
    arl_train_config_free(&cfg);
    return s;
}

static void test_config_keys(void) {
    CHECK_EQ_INT(load_sets(NULL, NULL, NULL), ARL_OK);
    CHECK_EQ_INT(load_sets("eval-split=0.3", "validation-split=0.15", "eval-set=validation"),
                 ARL_OK);
    CHECK_EQ_INT(load_sets("eval-split=0.3", "validation-split=0.15", "eval-set=test"), ARL_OK);
    CHECK_EQ_INT(load_sets("validation-split=0.15", NULL, NULL), ARL_ERR_CONFIG);
    CHECK_EQ_INT(load_sets("eval-split=0.3", "eval-set=validation", NULL), ARL_ERR_CONFIG);
    CHECK_EQ_INT(load_sets("eval-split=0.6", "validation-split=0.5", NULL), ARL_ERR_CONFIG);
    CHECK(load_sets("eval-split=0.3", "validation-split=0.15", "eval-set=train") != ARL_OK);
}

int main(void) {
    TEST_RUN(test_split);
    TEST_RUN(test_three_sides);
    TEST_RUN(test_config_keys);
    TEST_RUN(test_edges);
    return test_finish();
}
