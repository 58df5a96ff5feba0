/* experiments/sft_model.c: the CPU policy (policy/model.h, policy/model_backward.h) as the
 * model of `agentrl sft` (experiments/sft.h arl_sft_model_ops).  Each packed batch's sequences
 * start from the empty state; the loss is the summed next-token NLL on labelled positions. */
#include <stdlib.h>
#include <string.h>

#include "experiments/sft.h"
#include "kernels/threadpool.h"
#include "policy/model.h"
#include "policy/model_backward.h"

typedef struct sft_cpu {
    const arl_model_config *cfg;
    int64_t max_tokens, max_seqs;
    const arl_model_params *bound; /* params the model was built over; NULL before */
    arl_model m;
    arl_model_train tr;
    int n_moe;
    float *scores;  /* (n_moe, T, E) router scores of the last forward */
    int32_t *routes; /* (n_moe, T, k) */
    float *logp;    /* (T) eval log-probabilities */
} sft_cpu;

static void sft_cpu_unbind(sft_cpu *w) {
    if (!w->bound) return;
    arl_model_train_free(&w->tr);
    arl_model_free(&w->m);
    w->bound = NULL;
}

static void sft_cpu_destroy(void *ws) {
    sft_cpu *w = ws;
    if (!w) return;
    sft_cpu_unbind(w);
    free(w->scores);
    free(w->routes);
    free(w->logp);
    free(w);
}

static arl_status sft_cpu_create(void **ws, const arl_model_config *cfg, int64_t max_tokens,
                                 int64_t max_seqs, int threads) {
    *ws = NULL;
    if (threads > 0) ARL_TRY(arl_k_threads_init(threads));
    sft_cpu *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    w->cfg = cfg;
    w->max_tokens = max_tokens;
    w->max_seqs = max_seqs;
    const arl_model_dims *dm = &cfg->dims;
    w->n_moe = (int)dm->n_moe;
    size_t T = (size_t)max_tokens;
    w->scores = malloc(sizeof(float) * (size_t)(w->n_moe ? w->n_moe : 1) * T * (size_t)dm->E);
    w->routes = malloc(sizeof(int32_t) * (size_t)(w->n_moe ? w->n_moe : 1) * T * (size_t)dm->k);
    w->logp = malloc(sizeof(float) * T);
    if (!w->scores || !w->routes || !w->logp) {
        sft_cpu_destroy(w);
        return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory for %lld-token batches",
                          (long long)max_tokens);
    }
    *ws = w;
    return ARL_OK;
}

/* (Re)build the model over params the first time (the driver keeps one params set). */
static arl_status sft_cpu_bind(sft_cpu *w, const arl_model_params *params) {
    if (w->bound == params) return ARL_OK;
    sft_cpu_unbind(w);
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = w->max_tokens;
    o.max_docs = (int32_t)w->max_seqs;
    ARL_TRY(arl_model_init(&w->m, w->cfg, params, &o));
    arl_status s = arl_model_train_init(&w->tr, &w->m, NULL, NULL);
    if (s != ARL_OK) {
        arl_model_free(&w->m);
        return s;
    }
    w->bound = params;
    return ARL_OK;
}

static void sft_cpu_batch(const arl_sft_batch *b, arl_batch *mb) {
    memset(mb, 0, sizeof *mb);
    mb->tokens = b->ids;
    mb->T = b->T;
    mb->cu = b->cu_seqlens;
    mb->N = (int32_t)b->n_seqs;
    mb->targets = b->labels; /* ARL_SFT_IGNORE < 0: no target at that position */
}

static arl_status sft_cpu_train_step(void *ws, const arl_model_params *params,
                                     const arl_sft_batch *b, double scale,
                                     arl_model_params *grads, double *loss_sum,
                                     arl_router_scores *router) {
    sft_cpu *w = ws;
    ARL_TRY(sft_cpu_bind(w, params));
    arl_batch mb;
    sft_cpu_batch(b, &mb);
    arl_forward_out out = {0};
    if (router && w->n_moe) {
        out.router_scores = w->scores;
        out.routes = w->routes;
    }
    ARL_TRY(arl_model_nll_grad(&w->tr, &mb, NULL, NULL, scale, grads, loss_sum, &out));
    if (router && w->n_moe) {
        const arl_model_dims *dm = &w->cfg->dims;
        int64_t T = b->T, E = dm->E, k = dm->k;
        for (int l = 0; l < dm->L; l++) {
            int mi = w->m.moe_index[l];
            if (mi < 0) continue;
            float *s;
            int32_t *sel;
            ARL_TRY(arl_router_scores_append(router, l, T, &s, &sel));
            memcpy(s, w->scores + (size_t)mi * T * E, sizeof(float) * (size_t)(T * E));
            memcpy(sel, w->routes + (size_t)mi * T * k, sizeof(int32_t) * (size_t)(T * k));
        }
    }
    return ARL_OK;
}

static arl_status sft_cpu_eval(void *ws, const arl_model_params *params, const arl_sft_batch *b,
                               double *loss_sum) {
    sft_cpu *w = ws;
    ARL_TRY(sft_cpu_bind(w, params));
    arl_batch mb;
    sft_cpu_batch(b, &mb);
    arl_forward_out out = {0};
    out.logprobs = w->logp;
    ARL_TRY(arl_model_forward(&w->m, &mb, &out));
    double sum = 0;
    for (int64_t t = 0; t < b->T; t++)
        if (b->labels[t] >= 0) sum -= w->logp[t];
    *loss_sum = sum;
    return ARL_OK;
}

const arl_sft_model_ops arl_sft_model_ops_cpu = {
    "cpu policy (fp32)", sft_cpu_create, sft_cpu_destroy, sft_cpu_train_step, sft_cpu_eval,
};
