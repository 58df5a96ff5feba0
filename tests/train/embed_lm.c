/* tests/train/embed_lm.c: the stand-in bigram model (see embed_lm.h). */
#include "tests/train/embed_lm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct embed_lm_ws {
    int64_t V, d;
    double *z; /* (V) logits of one position */
    double *e; /* (d) gradient of one embedding row */
} embed_lm_ws;

static arl_status el_create(void **ws, const arl_model_config *cfg, int64_t max_tokens,
                            int64_t max_seqs, int threads) {
    (void)max_tokens;
    (void)max_seqs;
    (void)threads;
    embed_lm_ws *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "embed_lm: out of memory");
    w->V = cfg->dims.V;
    w->d = cfg->dims.d;
    w->z = malloc((size_t)w->V * sizeof *w->z);
    w->e = malloc((size_t)w->d * sizeof *w->e);
    if (!w->z || !w->e) {
        free(w->z);
        free(w->e);
        free(w);
        return arl_errorf(ARL_ERR_NOMEM, "embed_lm: out of memory");
    }
    *ws = w;
    return ARL_OK;
}

static void el_destroy(void *ws) {
    embed_lm_ws *w = ws;
    if (!w) return;
    free(w->z);
    free(w->e);
    free(w);
}

/* z = lm_head e(id); returns log-sum-exp. */
static double logits(const embed_lm_ws *w, const arl_model_params *p, int32_t id, double *z) {
    const float *e = p->embed_tokens + (int64_t)id * w->d;
    double mx = -INFINITY;
    for (int64_t v = 0; v < w->V; v++) {
        const float *row = p->lm_head + v * w->d;
        double acc = 0;
        for (int64_t j = 0; j < w->d; j++)
            acc += (double)row[j] * (double)e[j];
        z[v] = acc;
        if (acc > mx) mx = acc;
    }
    double s = 0;
    for (int64_t v = 0; v < w->V; v++)
        s += exp(z[v] - mx);
    return mx + log(s);
}

static arl_status el_step(void *ws, const arl_model_params *p, const arl_sft_batch *b, double scale,
                          arl_model_params *g, double *loss_sum, arl_router_scores *router) {
    (void)router;
    embed_lm_ws *w = ws;
    double total = 0;
    for (int64_t t = 0; t < b->T; t++) {
        int32_t y = b->labels[t];
        if (y == ARL_SFT_IGNORE) continue;
        if (y < 0 || y >= w->V || b->ids[t] < 0 || b->ids[t] >= w->V)
            return arl_errorf(ARL_ERR_RANGE, "embed_lm: token out of range at %lld", (long long)t);
        double lse = logits(w, p, b->ids[t], w->z);
        total += lse - w->z[y];
        if (!g) continue;
        const float *e = p->embed_tokens + (int64_t)b->ids[t] * w->d;
        for (int64_t j = 0; j < w->d; j++)
            w->e[j] = 0;
        for (int64_t v = 0; v < w->V; v++) {
            double dz = exp(w->z[v] - lse) - (v == y ? 1.0 : 0.0);
            dz *= scale;
            const float *row = p->lm_head + v * w->d;
            float *grow = g->lm_head + v * w->d;
            for (int64_t j = 0; j < w->d; j++) {
                grow[j] += (float)(dz * (double)e[j]);
                w->e[j] += dz * (double)row[j];
            }
        }
        float *ge = g->embed_tokens + (int64_t)b->ids[t] * w->d;
        for (int64_t j = 0; j < w->d; j++)
            ge[j] += (float)w->e[j];
    }
    *loss_sum = total;
    return ARL_OK;
}

static arl_status el_eval(void *ws, const arl_model_params *p, const arl_sft_batch *b,
                          double *loss_sum) {
    return el_step(ws, p, b, 0, NULL, loss_sum, NULL);
}

static const arl_sft_model_ops ops = {"embed_lm (test stand-in)", el_create, el_destroy, el_step,
                                      el_eval};

const arl_sft_model_ops *embed_lm_ops(void) {
    return &ops;
}

double embed_lm_loss_ref(const arl_model_params *p, const arl_sft_batch *b) {
    const int64_t V = p->cfg->dims.V, d = p->cfg->dims.d;
    double *z = malloc((size_t)V * sizeof *z);
    double total = 0;
    for (int64_t t = 0; t < b->T; t++) {
        int32_t y = b->labels[t];
        if (y == ARL_SFT_IGNORE) continue;
        const float *e = p->embed_tokens + (int64_t)b->ids[t] * d;
        double mx = -INFINITY;
        for (int64_t v = 0; v < V; v++) {
            double acc = 0;
            for (int64_t j = 0; j < d; j++)
                acc += (double)p->lm_head[v * d + j] * (double)e[j];
            z[v] = acc;
            mx = acc > mx ? acc : mx;
        }
        double s = 0;
        for (int64_t v = 0; v < V; v++)
            s += exp(z[v] - mx);
        total += mx + log(s) - z[y];
    }
    free(z);
    return total;
}
