/* tests/experiments/test_heldout.c: the prompt-level held-out split (experiments/heldout.h) on
 * the calculator's level 1, whose ~770 distinct questions make seeds alone a leaky split:
 *   - held-out and training seeds never render the same question (the property the split is
 *     for), over 600 seeds of each side;
 *   - the same question is on the same side whatever its seed;
 *   - the held-out share of questions is near the fraction (0.3; the ~550 distinct questions of
 *     1000 seeds give a binomial standard error of 2 points, so [0.2, 0.4] fails only on a real
 *     bias);
 *   - frac 0 holds out nothing; the seed lists are increasing and deterministic;
 *   - errors: an unknown environment. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/teacher.h"
#include "experiments/heldout.h"
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

int main(void) {
    TEST_RUN(test_split);
    TEST_RUN(test_edges);
    return test_finish();
}
