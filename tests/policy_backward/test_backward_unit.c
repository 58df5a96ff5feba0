/* tests/policy_backward/test_backward_unit.c: properties of the whole-model training forward and
 * backward (policy/model_backward.h) on the tiny model with the model_tiny golden weights:
 *   - the training forward computes the same log-probabilities and routes as arl_model_forward,
 *     bit for bit (same kernels, same order);
 *   - checkpointing on and off give bit-identical gradients (the recomputation runs the same
 *     code on the same inputs);
 *   - determinism: the same inputs give bit-identical gradients, also from a second instance;
 *   - gradients accumulate (two calls give twice one call, to a few roundings);
 *   - forced routes equal to the router's own choice change nothing;
 *   - a ragged packed batch equals the sum of its documents' gradients computed alone;
 *   - bad calls fail with the documented status.
 * The batches have ragged lengths that cross the KDA chunk length (16 here) and the conv width.
 *
 * Tolerance of the packed-vs-alone comparison: max|ref| form per tensor, atol 0, rtol 1e-4.  The
 * two computations differ only in GEMM row blocking (a batch's rows round differently from one
 * document's, policy/model.h), i.e. fp32 rounding of order 1e-6 relative to a tensor's largest
 * entry after the sums over tokens; a gradient leaking across documents (a wrong mask, conv or
 * state reset) is of the order of the gradient itself.
 */
#include "tests/policy_backward/bw_util.h"

static tiny_model TM;

enum { ND = 3 };
static const int32_t LENS[ND] = {37, 5, 50};

static void make_batch(int32_t *tok, int32_t *cu, int64_t *T) {
    cu[0] = 0;
    for (int i = 0; i < ND; i++) {
        bw_tokens(tok + cu[i], LENS[i], 1000 + i);
        cu[i + 1] = cu[i] + LENS[i];
    }
    *T = cu[ND];
}

static void test_forward_matches_model(void) {
    int32_t tok[128], cu[ND + 1], tg[128];
    int64_t T;
    make_batch(tok, cu, &T);
    arl_batch_next_token_targets(tg, tok, cu, ND, T);
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    const arl_model_dims *dm = &TM.cfg.dims;
    float lp1[128], lp2[128];
    int32_t *r1 = calloc((size_t)(dm->n_moe * T * dm->k), sizeof(int32_t));
    int32_t *r2 = calloc((size_t)(dm->n_moe * T * dm->k), sizeof(int32_t));
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = ND, .targets = tg};
    arl_forward_out o1 = {.logprobs = lp1, .routes = r1}, o2 = {.logprobs = lp2, .routes = r2};
    CHECK(arl_model_forward(&m, &b, &o1) == ARL_OK);
    CHECK(arl_model_train_forward(&tr, &b, NULL, NULL, &o2) == ARL_OK);
    CHECK_MSG(memcmp(lp1, lp2, sizeof(float) * (size_t)T) == 0,
              "training forward log-probs differ from arl_model_forward");
    CHECK(memcmp(r1, r2, sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k)) == 0);
    free(r1);
    free(r2);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

/* Gradient of the summed NLL of the batch into G (zeroed first). */
static double grad_of(arl_model_train *tr, const int32_t *tok, const int32_t *cu, int32_t N,
                      int64_t T, bw_grads *G, int zero) {
    if (zero) bw_grads_zero(G);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N};
    double nll = 0;
    arl_status s = arl_model_nll_grad(tr, &b, NULL, NULL, 1.0, &G->g, &nll, NULL);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    return nll;
}

static void test_checkpoint_and_determinism(void) {
    int32_t tok[128], cu[ND + 1];
    int64_t T;
    make_batch(tok, cu, &T);
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train keep, ckpt, keep2;
    bw_train_init(&keep, &m, 0);
    bw_train_init(&ckpt, &m, 1);
    bw_train_init(&keep2, &m, 0);
    CHECK(ckpt.arena_floats < keep.arena_floats);
    fprintf(stderr, "  activation arena for 128 tokens: %.1f MiB kept, %.1f MiB checkpointed\n",
            keep.arena_floats * 4.0 / 1048576.0, ckpt.arena_floats * 4.0 / 1048576.0);
    bw_grads A, B, C;
    bw_grads_init(&A, &TM);
    bw_grads_init(&B, &TM);
    bw_grads_init(&C, &TM);
    double la = grad_of(&keep, tok, cu, ND, T, &A, 1);
    double lb = grad_of(&ckpt, tok, cu, ND, T, &B, 1);
    CHECK(la == lb);
    CHECK_MSG(memcmp(A.arena, B.arena, sizeof(float) * (size_t)A.n) == 0,
              "checkpointing changes the gradients");
    /* determinism: the same instance again, and a second instance */
    grad_of(&keep, tok, cu, ND, T, &B, 1);
    CHECK_MSG(memcmp(A.arena, B.arena, sizeof(float) * (size_t)A.n) == 0,
              "a repeated backward differs");
    grad_of(&keep2, tok, cu, ND, T, &C, 1);
    CHECK_MSG(memcmp(A.arena, C.arena, sizeof(float) * (size_t)A.n) == 0,
              "a second instance differs");
    /* accumulation: a second call adds the same gradient.  Not bit-exact 2g: a GEMM with
     * beta = 1 may add its partial products into the accumulator in several steps; 1e-5 of
     * max|ref| allows a few fp32 roundings of sums over tokens */
    grad_of(&ckpt, tok, cu, ND, T, &C, 0);
    for (int64_t i = 0; i < A.n; i++)
        B.arena[i] = 2.0f * A.arena[i];
    bw_compare("two accumulated backwards vs twice one", &TM, &C, &B, 1e-5);
    bw_grads_free(&A);
    bw_grads_free(&B);
    bw_grads_free(&C);
    arl_model_train_free(&keep);
    arl_model_train_free(&ckpt);
    arl_model_train_free(&keep2);
    arl_model_free(&m);
}

static void test_forced_routes(void) {
    int32_t tok[128], cu[ND + 1], tg[128];
    int64_t T;
    make_batch(tok, cu, &T);
    arl_batch_next_token_targets(tg, tok, cu, ND, T);
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 1);
    int32_t *routes = calloc((size_t)(dm->n_moe * T * dm->k), sizeof(int32_t));
    bw_grads A, B;
    bw_grads_init(&A, &TM);
    bw_grads_init(&B, &TM);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = ND, .targets = tg};
    arl_forward_out o = {.routes = routes};
    double nll;
    CHECK(arl_model_nll_grad(&tr, &b, NULL, NULL, 0.5, &A.g, &nll, &o) == ARL_OK);
    b.forced_routes = routes;
    CHECK(arl_model_nll_grad(&tr, &b, NULL, NULL, 0.5, &B.g, &nll, NULL) == ARL_OK);
    CHECK(memcmp(A.arena, B.arena, sizeof(float) * (size_t)A.n) == 0);
    /* other forced routes change the expert gradients: expert 0's are non-zero only if some
     * token is routed to it */
    for (int64_t i = 0; i < dm->n_moe * T * dm->k; i++)
        routes[i] = (int32_t)(i % dm->k); /* experts 0..k-1 only */
    bw_grads_zero(&B);
    CHECK(arl_model_nll_grad(&tr, &b, NULL, NULL, 0.5, &B.g, &nll, NULL) == ARL_OK);
    const float *w1_last = B.g.layers[1].moe.w1 + (dm->E - 1) * dm->f * dm->dz;
    int64_t nz = 0;
    for (int64_t i = 0; i < dm->f * dm->dz; i++)
        nz += w1_last[i] != 0.0f;
    CHECK_EQ_INT(nz, 0); /* an expert without tokens gets no gradient */
    const float *w1_0 = B.g.layers[1].moe.w1;
    nz = 0;
    for (int64_t i = 0; i < dm->f * dm->dz; i++)
        nz += w1_0[i] != 0.0f;
    CHECK(nz > 0);
    free(routes);
    bw_grads_free(&A);
    bw_grads_free(&B);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

static void test_packed_equals_alone(void) {
    int32_t tok[128], cu[ND + 1];
    int64_t T;
    make_batch(tok, cu, &T);
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads P, S;
    bw_grads_init(&P, &TM);
    bw_grads_init(&S, &TM);
    double lp = grad_of(&tr, tok, cu, ND, T, &P, 1);
    double ls = 0;
    for (int i = 0; i < ND; i++)
        ls += grad_of(&tr, tok + cu[i], NULL, 1, LENS[i], &S, 0);
    CHECK_CLOSE(lp, ls, 0.0, 1e-5);
    bw_compare("packed vs documents alone", &TM, &P, &S, 1e-4);
    bw_grads_free(&P);
    bw_grads_free(&S);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

static void test_errors(void) {
    int32_t tok[128], cu[ND + 1], tg[128];
    int64_t T;
    make_batch(tok, cu, &T);
    arl_batch_next_token_targets(tg, tok, cu, ND, T);
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads G;
    bw_grads_init(&G, &TM);
    float dlogp[128] = {0};
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = ND, .targets = tg};
    CHECK(arl_model_backward(&tr, &b, dlogp, &G.g, NULL, NULL) == ARL_ERR_STATE);
    CHECK(arl_model_train_forward(&tr, &b, NULL, NULL, NULL) == ARL_OK);
    arl_batch b2 = b;
    b2.T = T - 1;
    b2.cu = NULL;
    b2.N = 1;
    CHECK(arl_model_backward(&tr, &b2, dlogp, &G.g, NULL, NULL) == ARL_ERR_ARG);
    b2 = b;
    b2.targets = NULL;
    CHECK(arl_model_backward(&tr, &b2, dlogp, &G.g, NULL, NULL) == ARL_ERR_ARG);
    arl_decode_state ds;
    CHECK(arl_decode_state_init(&ds, &TM.cfg, 1, 256) == ARL_OK);
    CHECK(arl_model_backward(&tr, &b, dlogp, &G.g, &ds, NULL) == ARL_ERR_ARG);
    arl_decode_state_free(&ds);
    CHECK(arl_model_backward(&tr, &b, dlogp, &G.g, NULL, NULL) == ARL_OK);
    /* dlogp all zero: no gradient anywhere */
    int64_t nz = 0;
    for (int64_t i = 0; i < G.n; i++)
        nz += G.arena[i] != 0.0f;
    CHECK_EQ_INT(nz, 0);
    /* a bad token fails before anything is computed, and a backward then refuses */
    tok[3] = 999;
    CHECK(arl_model_train_forward(&tr, &b, NULL, NULL, NULL) == ARL_ERR_RANGE);
    CHECK(arl_model_backward(&tr, &b, dlogp, &G.g, NULL, NULL) == ARL_ERR_STATE);
    arl_model_train_free(&tr);
    arl_model_free(&m);
    /* block-sparse MLA trains too (its gradients: tests/policy_backward/test_mla_sparse_train.c) */
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    o.mla_sparse_topk = 2;
    o.mla_sparse_chunk = 16;
    CHECK(arl_model_init(&m, &TM.cfg, &TM.w, &o) == ARL_OK);
    CHECK(arl_model_train_init(&tr, &m, NULL, NULL) == ARL_OK);
    arl_model_train_free(&tr);
    arl_model_free(&m);
    bw_grads_free(&G);
}

int main(void) {
    arl_k_threads_init(2);
    tiny_load(&TM);
    TEST_RUN(test_forward_matches_model);
    TEST_RUN(test_checkpoint_and_determinism);
    TEST_RUN(test_forced_routes);
    TEST_RUN(test_packed_equals_alone);
    TEST_RUN(test_errors);
    tiny_free(&TM);
    return test_finish();
}
