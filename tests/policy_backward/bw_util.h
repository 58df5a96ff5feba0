/* tests/policy_backward/bw_util.h: helpers of the policy_backward tests (header-only): a tiny
 * model with chosen settings, gradient arenas, random token documents, and tensor-by-tensor
 * gradient comparisons in the max|ref| form of spec 16.4. */
#ifndef ARL_TESTS_POLICY_BACKWARD_BW_UTIL_H
#define ARL_TESTS_POLICY_BACKWARD_BW_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "kernels/threadpool.h"
#include "policy/model_backward.h"
#include "tests/policy_model/tiny.h"

/* A gradient arena with a params view over it. */
typedef struct bw_grads {
    arl_model_params g;
    float *arena;
    int64_t n;
} bw_grads;

static inline void bw_grads_init(bw_grads *G, const tiny_model *tm) {
    G->n = tm->w.inv.arena_floats;
    G->arena = calloc((size_t)G->n, sizeof(float));
    if (!G->arena || arl_model_params_view(&G->g, &tm->cfg, G->arena)) {
        fprintf(stderr, "gradient arena: out of memory\n");
        exit(1);
    }
}

static inline void bw_grads_zero(bw_grads *G) {
    memset(G->arena, 0, sizeof(float) * (size_t)G->n);
}

static inline void bw_grads_free(bw_grads *G) {
    arl_model_params_free(&G->g);
    free(G->arena);
    memset(G, 0, sizeof *G);
}

static inline void bw_model_init(arl_model *m, tiny_model *tm, int64_t max_tokens, int32_t max_docs,
                                 int64_t kda_chunk) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = max_tokens;
    o.max_docs = max_docs;
    o.max_context = 1024;
    o.kda_chunk = kda_chunk;
    arl_status s = arl_model_init(m, &tm->cfg, &tm->w, &o);
    if (s) {
        fprintf(stderr, "model init: %s\n", arl_error_msg());
        exit(1);
    }
}

static inline void bw_train_init(arl_model_train *tr, arl_model *m, int checkpoint) {
    arl_train_opts o;
    arl_train_opts_default(&o);
    o.checkpoint = checkpoint;
    arl_status s = arl_model_train_init(tr, m, &o, NULL);
    if (s) {
        fprintf(stderr, "train init: %s\n", arl_error_msg());
        exit(1);
    }
}

/* n random tokens: <|bos|> then ids in [0, 266) (bytes and specials, no placeholder use). */
static inline void bw_tokens(int32_t *tok, int64_t n, uint64_t seed) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    for (int64_t t = 0; t < n; t++) {
        int32_t v = (int32_t)arl_rng_below(&r, 266);
        if (v == 259) v = 97; /* not the media placeholder */
        tok[t] = t == 0 ? 256 : v;
    }
}

/* Compare every trained tensor of got with ref in the max|ref| form (atol 0); tensors whose ref
 * is all zero must be exactly zero.  Returns the worst max|diff| / max|ref| over the tensors. */
static inline double bw_compare(const char *what, const tiny_model *tm, const bw_grads *got,
                                const bw_grads *ref, double rtol) {
    const arl_param_inventory *inv = &tm->w.inv;
    double worst = 0;
    const char *wn = "";
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        const float *a = arl_model_params_tensor(&got->g, i);
        const float *b = arl_model_params_tensor(&ref->g, i);
        char w[600];
        snprintf(w, sizeof w, "%s: %s", what, t->name);
        check_close_maxref_f32(w, a, b, (size_t)t->numel, 0.0, rtol);
        double mr = 0, md = 0;
        for (int64_t j = 0; j < t->numel; j++) {
            mr = fabs(b[j]) > mr ? fabs(b[j]) : mr;
            md = fabs(a[j] - b[j]) > md ? fabs(a[j] - b[j]) : md;
        }
        if (mr > 0 && md / mr > worst) {
            worst = md / mr;
            wn = t->name;
        }
    }
    fprintf(stderr, "  %s: worst max|diff|/max|ref| %.3g (%s)\n", what, worst, wn);
    return worst;
}

#endif
