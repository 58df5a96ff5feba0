/* experiments/sft_model.c: the CPU policy (policy/model.h, policy/model_backward.h) as the
 * model of `agentrl sft` (experiments/sft.h arl_sft_model_ops).  Each packed batch's sequences
 * start from the empty state, or, when the batch carries a shared prefix
 * (experiments/sft_data.h), from the state after that prefix: slot 0 of a decode state is
 * prefilled with the prefix once per batch (no gradient), exported, and imported into slot
 * 1 + i for sequence i, which then continues it; the loss is the summed next-token NLL on
 * labelled positions. */
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
    /* shared prefix */
    arl_decode_state st; /* slot 0: the prefix; slots 1..n_slots-1: the sequences */
    int have_st;
    int32_t *slots;   /* (max_seqs) 1, 2, ... */
    uint8_t *pbuf;    /* export of slot 0 after the prefix */
    size_t pbuf_cap;
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
    if (w->have_st) arl_decode_state_free(&w->st);
    free(w->slots);
    free(w->pbuf);
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
    w->slots = malloc(sizeof(int32_t) * (size_t)(max_seqs > 0 ? max_seqs : 1));
    for (int64_t i = 0; w->slots && i < max_seqs; i++)
        w->slots[i] = (int32_t)(i + 1);
    if (!w->scores || !w->routes || !w->logp || !w->slots) {
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
    arl_train_opts to;
    arl_train_opts_default(&to);
    /* every sequence may continue the shared prefix's state */
    to.max_state_docs = (int32_t)w->max_seqs;
    arl_status s = arl_model_train_init(&w->tr, &w->m, &to, NULL);
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

/* Batches with a shared prefix: prefill it into slot 0 with the current parameters and give
 * every sequence i a copy of that state in slot 1 + i.  The state is allocated on the first
 * such batch (and grown if a later prefix is longer), never per step otherwise. */
static arl_status sft_cpu_prefix(sft_cpu *w, const arl_sft_batch *b) {
    const int64_t P = b->prefix_len;
    if (b->n_seqs > w->max_seqs)
        return arl_errorf(ARL_ERR_RANGE, "sft: batch of %lld sequences, the workspace holds %lld",
                          (long long)b->n_seqs, (long long)w->max_seqs);
    const int64_t ctx = P + w->max_tokens;
    if (!w->have_st || w->st.max_context < ctx) {
        if (w->have_st) arl_decode_state_free(&w->st);
        w->have_st = 0;
        ARL_TRY(arl_decode_state_init(&w->st, w->cfg, (int32_t)w->max_seqs + 1, ctx));
        w->have_st = 1;
        for (int64_t i = 0; i <= w->max_seqs; i++) {
            int32_t sl;
            ARL_TRY(arl_decode_state_join(&w->st, &sl));
        }
    }
    arl_decode_state_reset(&w->st, 0);
    ARL_TRY(arl_model_prefill(&w->m, &w->st, 0, b->prefix_ids, P, NULL, 0, NULL, NULL));
    const size_t need = arl_decode_state_export_size(&w->st, 0);
    if (need > w->pbuf_cap) {
        uint8_t *nb = realloc(w->pbuf, need);
        if (!nb) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory for the prefix state");
        w->pbuf = nb;
        w->pbuf_cap = need;
    }
    size_t len;
    ARL_TRY(arl_decode_state_export(&w->st, 0, w->pbuf, w->pbuf_cap, &len));
    for (int64_t i = 0; i < b->n_seqs; i++)
        ARL_TRY(arl_decode_state_import(&w->st, w->slots[i], w->pbuf, len));
    return ARL_OK;
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
    if (b->prefix_len > 0) {
        ARL_TRY(sft_cpu_prefix(w, b));
        ARL_TRY(arl_model_nll_grad(&w->tr, &mb, &w->st, w->slots, scale, grads, loss_sum, &out));
    } else {
        ARL_TRY(arl_model_nll_grad(&w->tr, &mb, NULL, NULL, scale, grads, loss_sum, &out));
    }
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
    if (b->prefix_len > 0) {
        ARL_TRY(sft_cpu_prefix(w, b));
        ARL_TRY(arl_model_forward_state(&w->m, &w->st, w->slots, &mb, &out));
    } else {
        ARL_TRY(arl_model_forward(&w->m, &mb, &out));
    }
    double sum = 0;
    for (int64_t t = 0; t < b->T; t++)
        if (b->labels[t] >= 0) sum -= w->logp[t];
    *loss_sum = sum;
    return ARL_OK;
}

const arl_sft_model_ops arl_sft_model_ops_cpu = {
    "cpu policy (fp32)", sft_cpu_create, sft_cpu_destroy, sft_cpu_train_step, sft_cpu_eval,
};
