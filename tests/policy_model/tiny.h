/* tests/policy_model/tiny.h: the tiny model of spec/policy.md 12.3 with the seeded weights of
 * the model_tiny golden case, for the policy_model tests (header-only test helper).
 *
 * The golden weights (matrices N(0, 1/fan_in), varied norms, non-zero AttnRes projections and
 * router biases) exercise every stage at O(1) activations, unlike a 0.02 initialisation. */
#ifndef ARL_TESTS_POLICY_MODEL_TINY_H
#define ARL_TESTS_POLICY_MODEL_TINY_H

#include <stdlib.h>
#include <string.h>

#include "policy/config.h"
#include "policy/model.h"
#include "policy/params.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

typedef struct tiny_model {
    arl_model_config cfg;
    arl_model_params w;
    golden_case *gc; /* model_tiny */
} tiny_model;

/* Load configs/tiny/config.json and the model_tiny weights; exits the test on failure. */
static inline void tiny_load(tiny_model *tm) {
    memset(tm, 0, sizeof *tm);
    arl_status s = arl_model_config_read(test_src_path("configs/tiny/config.json"), &tm->cfg);
    if (s) {
        fprintf(stderr, "tiny config: %s\n", arl_error_msg());
        exit(1);
    }
    s = arl_model_params_alloc(&tm->w, &tm->cfg);
    if (s) {
        fprintf(stderr, "tiny params: %s\n", arl_error_msg());
        exit(1);
    }
    tm->gc = golden_open("model_tiny");
    const arl_param_inventory *inv = &tm->w.inv;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        /* A_log is stored zero-padded (spec 14.3); memory holds its H values */
        float *src = golden_f32(tm->gc, t->name, t->is_a_log ? t->stored_numel : t->numel);
        memcpy(arl_model_params_tensor(&tm->w, i), src, sizeof(float) * (size_t)t->numel);
    }
}

static inline void tiny_free(tiny_model *tm) {
    golden_close(tm->gc);
    arl_model_params_free(&tm->w);
    arl_model_config_free(&tm->cfg);
}

static inline void tiny_model_init(arl_model *m, tiny_model *tm, int64_t max_tokens,
                                   int32_t max_docs) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = max_tokens;
    o.max_docs = max_docs;
    o.max_context = 4096;
    arl_status s = arl_model_init(m, &tm->cfg, &tm->w, &o);
    if (s) {
        fprintf(stderr, "model init: %s\n", arl_error_msg());
        exit(1);
    }
}

#endif
