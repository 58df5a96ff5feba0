/* tests/policy_backward/test_backward_variants.c: the whole-model backward on config variants
 * that the golden model (the tiny config) does not cover, checked by finite differences against
 * the inference forward (arl_model_forward):
 *   A  every option of spec 12.1 at its other value: no AttnRes (attn_res_block_size null, the
 *      plain pre-norm residual of 2.1), the softplus KDA gate (gate_lower_bound null), the
 *      low-rank KDA output gate, direct q_proj (q_lora_rank null), no MLA output gate, no
 *      latent norm with rho = 2.5, no shared experts, SwiGLU ("silu");
 *   B  AttnRes with B = 1 (every layer starts a block: 9 sources in the last mixes);
 *   C  AttnRes with B = 8 = L (one snapshot, at layer 0).
 * Weights: arl_params_init, then rescaled to N(0, 1/fan_in) matrices and non-zero AttnRes
 * projections, so that every stage runs at O(1) activations (as the golden weights do).
 * For each tensor with a gradient - all norm and AttnRes vectors and the model-level tensors
 * (embedding, lm_head: an AttnRes bookkeeping error reaches them), and in variant A also every
 * other tensor of layers 0, 1, 3 and 7 (routed experts of layer 1 only; for time) - the directional
 * derivative along the gradient, |g|, is compared with a central difference of the loss (sum of
 * -log pi over a packed batch of two documents) with the forward's routes forced (a top-k flip
 * would make the loss jump).  Also: checkpointing on/off bit-identical in each variant.
 * Step h = min(1e-2, 0.1 / |g|) along the unit direction, so the loss moves by at most 0.1 and
 * stays in its near-linear range (gradients of the first layers reach |g| ~ 1e3 here: the norms
 * amplify small-scale inputs).  Tolerance: |fd - |g|| <= 2e-2 |g| + 2e-4 (loss: ~40 fp32
 * log-probabilities, rounding ~1e-5 absolute over 2h; truncation O(h^2); a missing term or wrong
 * branch is O(|g|)).
 */
#include "tests/policy_backward/bw_util.h"

enum { TT = 40 };
static const int32_t CU[3] = {0, 17, 40};

typedef struct variant {
    arl_model_config cfg;
    arl_model_params w;
    int32_t tok[TT], tgt[TT];
    int32_t *routes;
    arl_model m;
} variant;

static void rescale_weights(variant *v, uint64_t seed) {
    CHECK(arl_params_init(&v->w, &v->cfg, seed, 1) == ARL_OK);
    arl_rng r;
    arl_rng_seed(&r, seed + 1);
    const arl_param_inventory *inv = &v->w.inv;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        float *x = arl_model_params_tensor(&v->w, i);
        if (t->init == ARL_INIT_NORMAL && t->rank >= 2) {
            double s = 1.0 / sqrt((double)t->shape[t->rank - 1]) / v->cfg.text.initializer_range;
            for (int64_t j = 0; j < t->numel; j++)
                x[j] = (float)(x[j] * s);
        } else if (t->init == ARL_INIT_ZEROS && !t->no_grad) { /* AttnRes projections */
            for (int64_t j = 0; j < t->numel; j++)
                x[j] = (float)(0.05 * arl_rng_normal(&r));
        }
    }
}

static double loss_of(variant *v) {
    float lp[TT];
    arl_batch b = {
        .tokens = v->tok, .T = TT, .cu = CU, .N = 2, .targets = v->tgt, .forced_routes = v->routes};
    arl_forward_out o = {.logprobs = lp};
    CHECK(arl_model_forward(&v->m, &b, &o) == ARL_OK);
    double L = 0;
    for (int64_t t = 0; t < TT; t++)
        L -= v->tgt[t] >= 0 ? lp[t] : 0.0;
    return L;
}

static void run_variant(const char *name, void (*edit)(arl_model_config *), int wide) {
    variant *v = calloc(1, sizeof *v);
    arl_model_config base;
    CHECK(arl_model_config_read(test_src_path("configs/tiny/config.json"), &base) == ARL_OK);
    CHECK(arl_model_config_copy(&v->cfg, &base) == ARL_OK);
    arl_model_config_free(&base);
    edit(&v->cfg);
    arl_status s = arl_model_config_validate(&v->cfg);
    CHECK_MSG(s == ARL_OK, "%s: %s", name, arl_error_msg());
    CHECK(arl_model_params_alloc(&v->w, &v->cfg) == ARL_OK);
    rescale_weights(v, 31);
    bw_tokens(v->tok, CU[1], 71);
    bw_tokens(v->tok + CU[1], TT - CU[1], 72);
    arl_batch_next_token_targets(v->tgt, v->tok, CU, 2, TT);
    const arl_model_dims *dm = &v->cfg.dims;
    v->routes = calloc((size_t)(dm->n_moe * TT * dm->k), sizeof(int32_t));
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = TT;
    mo.max_docs = 2;
    mo.max_context = 256;
    mo.kda_chunk = 16;
    CHECK(arl_model_init(&v->m, &v->cfg, &v->w, &mo) == ARL_OK);

    /* gradients, with and without checkpointing */
    arl_model_train tr[2];
    arl_model_params g[2];
    float *ga[2];
    double nll[2];
    int64_t nf = v->w.inv.arena_floats;
    for (int c = 0; c < 2; c++) {
        arl_train_opts o;
        arl_train_opts_default(&o);
        o.checkpoint = c;
        CHECK(arl_model_train_init(&tr[c], &v->m, &o, NULL) == ARL_OK);
        ga[c] = calloc((size_t)nf, sizeof(float));
        CHECK(arl_model_params_view(&g[c], &v->cfg, ga[c]) == ARL_OK);
        arl_batch b = {.tokens = v->tok, .T = TT, .cu = CU, .N = 2, .targets = v->tgt};
        arl_forward_out out = {.routes = c ? NULL : v->routes};
        s = arl_model_nll_grad(&tr[c], &b, NULL, NULL, 1.0, &g[c], &nll[c], &out);
        CHECK_MSG(s == ARL_OK, "%s: %s", name, arl_error_msg());
    }
    CHECK(nll[0] == nll[1]);
    CHECK_MSG(memcmp(ga[0], ga[1], sizeof(float) * (size_t)nf) == 0,
              "%s: checkpointing changes the gradients", name);
    CHECK_CLOSE(loss_of(v), nll[0], 0.0, 1e-6);
    fprintf(stderr, "  %s: loss %.6g\n", name, nll[0]);

    /* finite differences along each tensor's gradient */
    const arl_param_inventory *inv = &v->w.inv;
    int64_t checked = 0, failed = 0;
    double worst = 0;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        float *x = arl_model_params_tensor(&v->w, i);
        const float *gr = arl_model_params_tensor(&g[0], i);
        /* for time: every norm and AttnRes vector and the model-level tensors; with `wide` also
         * the rest of layers 0, 1, 3, 7 (dense, MoE, KDA and both MLA positions), experts of
         * layer 1 only */
        int lay = t->layer < 0 ||
                  (wide && (t->layer == 0 || t->layer == 1 || t->layer == 3 || t->layer == 7));
        if (!lay && t->component != ARL_COMP_NORMS) continue;
        if (t->expert >= 0 && t->layer != 1) continue;
        double gn = 0;
        for (int64_t j = 0; j < t->numel; j++)
            gn += (double)gr[j] * gr[j];
        gn = sqrt(gn);
        if (t->no_grad || t->component == ARL_COMP_VISION || t->component == ARL_COMP_PROJECTOR) {
            CHECK_MSG(gn == 0, "%s: %s has a gradient", name, t->name);
            continue;
        }
        if (gn < 1e-3) continue;
        const double h = fmin(1e-2, 0.1 / gn); /* the loss moves by at most 0.1 */
        float *x0 = malloc(sizeof(float) * (size_t)t->numel);
        memcpy(x0, x, sizeof(float) * (size_t)t->numel);
        for (int64_t j = 0; j < t->numel; j++)
            x[j] = (float)(x0[j] + h * gr[j] / gn);
        double lp = loss_of(v);
        for (int64_t j = 0; j < t->numel; j++)
            x[j] = (float)(x0[j] - h * gr[j] / gn);
        double lm = loss_of(v);
        memcpy(x, x0, sizeof(float) * (size_t)t->numel);
        free(x0);
        double fd = (lp - lm) / (2 * h), err = fabs(fd - gn);
        checked++;
        worst = fmax(worst, err / gn);
        if (!(err <= 2e-2 * gn + 2e-4)) {
            failed++;
            fprintf(stderr, "  %s: fd mismatch %s: analytic %.6g, fd %.6g\n", name, t->name, gn,
                    fd);
        }
    }
    fprintf(stderr, "  %s: %lld tensors by finite differences, worst relative error %.3g\n", name,
            (long long)checked, worst);
    CHECK(checked > (wide ? 100 : 30));
    CHECK_EQ_INT(failed, 0);
    for (int c = 0; c < 2; c++) {
        arl_model_train_free(&tr[c]);
        arl_model_params_free(&g[c]);
        free(ga[c]);
    }
    arl_model_free(&v->m);
    arl_model_params_free(&v->w);
    arl_model_config_free(&v->cfg);
    free(v->routes);
    free(v);
}

static void edit_all_off(arl_model_config *c) {
    arl_text_config *t = &c->text;
    t->attn_res_block_size = 0;
    t->linear_attn_config.gate_lower_bound = NAN;
    t->linear_attn_config.use_full_rank_gate = 0;
    t->q_lora_rank = 0;
    t->mla_use_output_gate = 0;
    t->latent_moe_use_norm = 0;
    t->routed_scaling_factor = 2.5;
    t->num_shared_experts = 0;
    snprintf(t->hidden_act, sizeof t->hidden_act, "silu");
}

static void edit_b1(arl_model_config *c) {
    c->text.attn_res_block_size = 1;
}

static void edit_b8(arl_model_config *c) {
    c->text.attn_res_block_size = 8;
}

static void test_variant_all_off(void) {
    run_variant("A (options off)", edit_all_off, 1);
}

static void test_variant_b1(void) {
    run_variant("B (AttnRes B = 1)", edit_b1, 0);
}

static void test_variant_b8(void) {
    run_variant("C (AttnRes B = L)", edit_b8, 0);
}

int main(void) {
    arl_k_threads_init(2);
    TEST_RUN(test_variant_all_off);
    TEST_RUN(test_variant_b1);
    TEST_RUN(test_variant_b8);
    return test_finish();
}
