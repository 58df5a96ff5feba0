/* tests/reward/metrics.h: the metrics that a reward accumulator emits (arl_reward_acc_emit),
 * collected by name, for the reward tests. */
#ifndef ARL_TESTS_REWARD_METRICS_H
#define ARL_TESTS_REWARD_METRICS_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "reward/reward.h"
#include "tests/test.h"

typedef struct metrics {
    int n;
    char name[256][96];
    double v[256];
} metrics;

static inline void metrics_collect(void *ctx, const char *name, double v) {
    metrics *m = ctx;
    if (m->n < 256) {
        snprintf(m->name[m->n], sizeof m->name[0], "%s", name);
        m->v[m->n++] = v;
    }
}

/* The value of the metric name in m; NaN and a test failure when it was not emitted. */
static inline double metrics_get(const metrics *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->name[i], name)) return m->v[i];
    fprintf(stderr, "metric %s not emitted\n", name);
    test_failures_++;
    return NAN;
}

/* The value of the metric name that a emits under cfg. */
static inline double metric(const arl_reward_acc *a, const arl_reward_config *cfg,
                            const char *name) {
    metrics m = {0};
    arl_reward_acc_emit(a, cfg, metrics_collect, &m);
    return metrics_get(&m, name);
}

#endif
