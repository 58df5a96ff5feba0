/* policy/sample.c: temperature and top-p sampling of one token (see policy/sample.h). */
#include "policy/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"

arl_status arl_sampler_init(arl_sampler *s, int64_t V) {
    memset(s, 0, sizeof *s);
    if (V < 1) return arl_errorf(ARL_ERR_ARG, "sampler: vocabulary size %lld", (long long)V);
    s->V = V;
    s->q = malloc(sizeof(double) * (size_t)V);
    s->idx = malloc(sizeof(int32_t) * (size_t)V);
    if (!s->q || !s->idx) {
        arl_sampler_free(s);
        return arl_errorf(ARL_ERR_NOMEM, "sampler: out of memory");
    }
    return ARL_OK;
}

void arl_sampler_free(arl_sampler *s) {
    if (!s) return;
    free(s->q);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

arl_status arl_sample_params_check(const arl_sample_params *p) {
    if (!isfinite(p->temperature))
        return arl_errorf(ARL_ERR_ARG, "sampling: temperature must be finite, got %g",
                          p->temperature);
    if (!(p->top_p > 0.0 && p->top_p <= 1.0))
        return arl_errorf(ARL_ERR_ARG, "sampling: top_p must be in (0, 1], got %g", p->top_p);
    return ARL_OK;
}

/* qsort order: larger q first, then the lower index (a total order: deterministic). */
static _Thread_local const double *g_q; /* qsort has no context argument in C11 */
static int by_q_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_q[i] != g_q[j]) return g_q[i] > g_q[j] ? -1 : 1;
    return i < j ? -1 : (i > j);
}

int32_t arl_sample(arl_sampler *s, const float *logits, const arl_sample_params *p, arl_rng *rng,
                   float *logp_sample, float *logp_raw) {
    const int64_t V = s->V;
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    const double zmax = logits[best];
    int32_t tok = best;
    double lps = 0.0;
    if (p->temperature > 0.0) {
        double total = 0.0;
        for (int64_t i = 0; i < V; i++) {
            s->q[i] = exp(((double)logits[i] - zmax) / p->temperature);
            total += s->q[i];
        }
        int64_t kept = V;
        double kept_mass = total;
        for (int64_t i = 0; i < V; i++)
            s->idx[i] = (int32_t)i;
        if (p->top_p < 1.0) {
            g_q = s->q;
            qsort(s->idx, (size_t)V, sizeof(int32_t), by_q_desc);
            double cum = 0.0;
            for (kept = 0; kept < V;) {
                cum += s->q[s->idx[kept++]];
                if (cum >= p->top_p * total) break;
            }
            kept_mass = cum;
        }
        double u = arl_rng_uniform(rng) * kept_mass, cum = 0.0;
        tok = s->idx[kept - 1];
        for (int64_t j = 0; j < kept; j++) {
            cum += s->q[s->idx[j]];
            if (cum > u) {
                tok = s->idx[j];
                break;
            }
        }
        lps = log(s->q[tok] / kept_mass);
    }
    if (logp_sample) *logp_sample = (float)lps;
    if (logp_raw) {
        double sum = 0.0;
        for (int64_t i = 0; i < V; i++)
            sum += exp((double)logits[i] - zmax);
        *logp_raw = (float)((double)logits[tok] - zmax - log(sum));
    }
    return tok;
}
