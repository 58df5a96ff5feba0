/* tests/policy_model/test_model_golden.c: the whole tiny model against the model_tiny golden
 * case (spec/policy.md 16.2): logits and target log-probabilities of a packed batch of two
 * documents, the loss, the routes of every MoE layer, the decode state after a prefix of the
 * second document (KDA S and conv tails, MLA latent rows) and the logits of 16 one-token decode
 * steps from that state.
 *
 * Tolerance (spec 16.4, whole-model comparisons on the fp32 CPU): max|ref| form, atol 0,
 * rtol 1e-4.  Eight layers of fp32 GEMMs, norms, softmaxes and the KDA recurrence give
 * relative errors of order 1e-6; a wrong mask, gate, norm epsilon, AttnRes source or
 * expert gives errors of order max|ref|.  Routes are integers and must match exactly (the
 * golden generator chose a seed whose router top-k margins exceed 1e-4, far above fp32
 * noise).
 */
#include "tests/policy_model/tiny.h"

#define RTOL 1e-4

static tiny_model TM;

static void cmp(const char *name, const float *a, int64_t n) {
    char what[256];
    snprintf(what, sizeof what, "model_tiny/%s", name);
    check_close_maxref_f32(what, a, golden_f32(TM.gc, name, n), (size_t)n, 0.0, RTOL);
}

static void test_packed_forward(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    int64_t T;
    golden_numel(TM.gc, "tokens", &T, NULL);
    int32_t *tok = golden_i32(TM.gc, "tokens", T);
    int32_t *cu = golden_i32(TM.gc, "cu_seqlens", 3);
    int32_t N = 2;
    arl_model m;
    tiny_model_init(&m, &TM, 128, 4);
    int32_t *targets = malloc(sizeof(int32_t) * T);
    arl_batch_next_token_targets(targets, tok, cu, N, T);
    float *logits = golden_zeros(TM.gc, T * dm->V);
    float *lp = golden_zeros(TM.gc, T);
    int32_t *routes = malloc(sizeof(int32_t) * dm->n_moe * T * dm->k);
    int64_t *load = malloc(sizeof(int64_t) * dm->n_moe * dm->E);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N, .targets = targets};
    arl_forward_out o = {.logits = logits, .logprobs = lp, .routes = routes, .expert_load = load};
    arl_status s = arl_model_forward(&m, &b, &o);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    cmp("logits", logits, T * dm->V);

    /* target log-probs at target_pos, and the mean loss */
    int64_t nt;
    golden_numel(TM.gc, "target_pos", &nt, NULL);
    int64_t *pos = golden_i64(TM.gc, "target_pos", nt);
    float *ref = golden_f32(TM.gc, "target_logprob", nt);
    float *got = golden_zeros(TM.gc, nt);
    double loss = 0;
    int64_t n_targets = 0;
    for (int64_t t = 0; t < T; t++)
        n_targets += targets[t] >= 0;
    CHECK_EQ_INT(n_targets, nt);
    for (int64_t i = 0; i < nt; i++) {
        got[i] = lp[pos[i]];
        loss -= got[i];
    }
    loss /= (double)nt;
    check_close_maxref_f32("model_tiny/target_logprob", got, ref, (size_t)nt, 0.0, RTOL);
    CHECK_CLOSE(loss, golden_f64(TM.gc, "loss", 1)[0], 0.0, RTOL);

    /* routes: integers, exactly; and the loads are their per-expert counts */
    int64_t *rref = golden_i64(TM.gc, "routes", dm->n_moe * T * dm->k);
    int64_t bad = 0;
    for (int64_t i = 0; i < dm->n_moe * T * dm->k; i++)
        bad += routes[i] != rref[i];
    CHECK_EQ_INT(bad, 0);
    for (int64_t j = 0; j < dm->n_moe; j++) {
        int64_t sum = 0;
        for (int64_t e = 0; e < dm->E; e++) {
            int64_t c = 0;
            for (int64_t i = 0; i < T * dm->k; i++)
                c += rref[j * T * dm->k + i] == e;
            CHECK_EQ_INT(load[j * dm->E + e], c);
            sum += load[j * dm->E + e];
        }
        CHECK_EQ_INT(sum, T * dm->k);
    }

    /* log-probs without (T, V) logits go through the row-block path: same values */
    float *lp2 = golden_zeros(TM.gc, T);
    arl_forward_out o2 = {.logprobs = lp2};
    CHECK(arl_model_forward(&m, &b, &o2) == ARL_OK);
    int64_t diff = 0;
    for (int64_t t = 0; t < T; t++)
        diff += lp2[t] != lp[t];
    CHECK_EQ_INT(diff, 0);

    free(targets);
    free(routes);
    free(load);
    arl_model_free(&m);
}

static void test_decode_state_and_steps(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    int64_t T;
    golden_numel(TM.gc, "tokens", &T, NULL);
    int32_t *tok = golden_i32(TM.gc, "tokens", T);
    int32_t *cu = golden_i32(TM.gc, "cu_seqlens", 3);
    const int64_t n_pre = 19, n_dec = 16; /* manifest: decode_prefix, decode_tokens */
    CHECK_EQ_INT(cu[2] - cu[1], n_pre + n_dec);
    const int32_t *doc = tok + cu[1];

    arl_model m;
    tiny_model_init(&m, &TM, 64, 4);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 4096) == ARL_OK);
    int32_t slot;
    CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
    arl_status s = arl_model_prefill(&m, &st, slot, doc, n_pre, NULL, 0, NULL, NULL);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(arl_decode_state_position(&st, slot), n_pre);
    for (int64_t l = 0; l < dm->L; l++) {
        char name[64];
        if (arl_model_config_layer_kind(&TM.cfg, l) == ARL_LAYER_KDA) {
            snprintf(name, sizeof name, "state.%lld.S", (long long)l);
            cmp(name, arl_decode_state_kda_S(&st, slot, l), dm->H * dm->dk * dm->dv);
            snprintf(name, sizeof name, "state.%lld.conv", (long long)l);
            cmp(name, arl_decode_state_kda_conv(&st, slot, l), 3 * dm->P * (dm->W - 1));
        } else {
            snprintf(name, sizeof name, "state.%lld.latent", (long long)l);
            cmp(name, arl_decode_state_latent(&st, slot, l), n_pre * (dm->rkv + dm->r));
        }
    }
    float *dec = golden_zeros(TM.gc, n_dec * dm->V);
    for (int64_t i = 0; i < n_dec; i++) {
        s = arl_model_decode_step(&m, &st, &slot, 1, doc + n_pre + i, dec + i * dm->V, NULL);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    }
    cmp("decode_logits", dec, n_dec * dm->V);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

int main(void) {
    tiny_load(&TM);
    TEST_RUN(test_packed_forward);
    TEST_RUN(test_decode_state_and_steps);
    tiny_free(&TM);
    return test_finish();
}
