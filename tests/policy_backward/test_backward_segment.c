/* tests/policy_backward/test_backward_segment.c: segment-wise training from a decode state
 * (spec/policy.md 3.6, 4.2, 11) on the tiny model with the model_tiny golden weights.  One
 * sequence of 100 tokens is cut into segments [0, 40), [40, 73), [73, 100) (KDA chunk length
 * 16, so segments start inside chunks of the full sequence; the conv tails cross every cut).
 *
 * What "the state is a constant input" means, tested two ways:
 *
 * 1. Exact decomposition.  The gradient of the full sequence's loss is the sum, over segments,
 *    of each segment's gradient with its initial state held constant PLUS the part that flows
 *    through the states into earlier segments.  The backward returns the gradient of a
 *    segment's initial state given that of its final state (arl_model_backward's dstate), so
 *    running the segments' backwards in reverse order, handing the state gradient back, must
 *    reproduce the full-sequence gradient.  This checks the constant-state gradient of every
 *    segment precisely: its parameter terms from the state (conv weights on tail inputs, W_kvb
 *    on earlier latent rows, the decays on S) are in the sum exactly once, and the state
 *    gradients (dS0, conv tails, earlier MLA rows, passed through a middle segment) are right.
 *    A second check shows the state path matters: the constant-state gradients alone (dstate
 *    NULL) differ from the full gradient by far more than the tolerance.
 *
 * 2. Finite differences against an independent forward.  The state after segment 1 is made by
 *    arl_model_prefill (the inference code), exported and imported; the loss of segment 2 is
 *    evaluated by arl_model_forward_state from that same imported state with perturbed
 *    parameters (so the state is held constant by construction), with the routes of the
 *    unperturbed forward forced (no top-k flip makes the loss discontinuous).  For every
 *    parameter tensor with a gradient the directional derivative along the gradient is
 *    compared with a central difference (routed experts only in layer 1, to save time).
 *
 * Also: a slot at position 0 trains bit-identically to a fresh document; an exported and
 * re-imported state gives bit-identical gradients; a batch of documents continuing different
 * slots at different positions equals the sum of each alone.
 *
 * Tolerances.  (1) and the batch test: max|ref| form per tensor, atol 0, rtol 1e-4: the two
 * sides differ in fp32 rounding only (expanded vs absorbed MLA attention, KDA chunks cut at
 * other places, GEMM row blocking), measured ~1e-5 of a tensor's largest entry; a missing or
 * doubled state term is of the order of the gradient (the "state path matters" check asserts
 * > 1e-2 for the KDA and MLA weights).  (2): |fd - g.v| <= 2e-2 |g.v| + 2e-4 for a unit
 * direction v: the loss is a sum of 33 fp32 log-probabilities (rounding ~1e-5 absolute, divided
 * by the step 2h = 0.02 gives ~5e-4 worst case, hence the absolute term), the step's
 * truncation error is O(h^2) relative (h = min(1e-2, 0.1/|g|): the loss moves by at most 0.1);
 * an error of a few percent in a tensor's gradient fails.
 */
#include "policy/state.h"
#include "tests/policy_backward/bw_util.h"

static tiny_model TM;

enum { TL = 100, NSEG = 3 };
static const int32_t CUT[NSEG + 1] = {0, 40, 73, 100};

static int32_t TOK[TL], TGT[TL];

/* Full-sequence gradient of sum_{t} -log pi(TGT[t]) over the target positions t >= from. */
static void full_grad(bw_grads *G, int64_t from) {
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    float dl[TL];
    for (int64_t t = 0; t < TL; t++)
        dl[t] = t >= from ? -1.0f : 0.0f;
    arl_batch b = {.tokens = TOK, .T = TL, .targets = TGT};
    CHECK(arl_model_train_forward(&tr, &b, NULL, NULL, NULL) == ARL_OK);
    CHECK(arl_model_backward(&tr, &b, dl, &G->g, NULL, NULL) == ARL_OK);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

static void test_exact_decomposition(void) {
    bw_grads F, S, C;
    bw_grads_init(&F, &TM);
    bw_grads_init(&S, &TM);
    bw_grads_init(&C, &TM);
    full_grad(&F, 0);

    arl_model m;
    bw_model_init(&m, &TM, 64, 4, 16);
    arl_model_train tr[NSEG];
    for (int k = 0; k < NSEG; k++)
        bw_train_init(&tr[k], &m, k == 1); /* the middle segment with checkpointing */
    arl_decode_state st, ds;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 1024) == ARL_OK);
    CHECK(arl_decode_state_init(&ds, &TM.cfg, 2, 1024) == ARL_OK);
    int32_t slot, other;
    CHECK(arl_decode_state_join(&st, &other) == ARL_OK); /* slot 1 is used: ids are not 0 */
    CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
    arl_batch b[NSEG];
    float dl[TL];
    for (int k = 0; k < NSEG; k++) {
        b[k] =
            (arl_batch){.tokens = TOK + CUT[k], .T = CUT[k + 1] - CUT[k], .targets = TGT + CUT[k]};
        arl_status s = arl_model_train_forward(&tr[k], &b[k], &st, &slot, NULL);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    }
    CHECK_EQ_INT(arl_decode_state_position(&st, slot), TL);
    for (int64_t t = 0; t < TL; t++)
        dl[t] = -1.0f;
    /* constant-state gradients only */
    for (int k = 0; k < NSEG; k++)
        CHECK(arl_model_backward(&tr[k], &b[k], dl + CUT[k], &C.g, NULL, NULL) == ARL_OK);
    /* with the state gradient handed back, last segment first */
    CHECK(arl_state_grad_prepare(&ds, slot, TL) == ARL_OK);
    for (int k = NSEG - 1; k >= 0; k--) {
        arl_status s = arl_model_backward(&tr[k], &b[k], dl + CUT[k], &S.g, &ds, NULL);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
        CHECK_EQ_INT(arl_decode_state_position(&ds, slot), CUT[k]);
    }
    double w = bw_compare("segments with state gradients vs full sequence", &TM, &S, &F, 1e-4);
    CHECK(w < 1e-4);

    /* the state path matters: without it the KDA and MLA weights are far off */
    const arl_param_inventory *inv = &TM.w.inv;
    const char *probe[] = {"language_model.model.layers.1.self_attn.q_proj.weight",
                           "language_model.model.layers.1.self_attn.q_conv1d.weight",
                           "language_model.model.layers.3.self_attn.kv_b_proj.weight",
                           "language_model.model.layers.3.self_attn.kv_a_proj_with_mqa.weight"};
    for (int i = 0; i < 4; i++) {
        int64_t id = arl_param_inventory_find(inv, probe[i]);
        CHECK(id >= 0);
        const float *a = arl_model_params_tensor(&C.g, id), *f = arl_model_params_tensor(&F.g, id);
        double mr = 0, md = 0;
        for (int64_t j = 0; j < inv->t[id].numel; j++) {
            mr = fmax(mr, fabs(f[j]));
            md = fmax(md, fabs(a[j] - f[j]));
        }
        fprintf(stderr, "  constant-state gradient vs full, %s: %.3g of max|ref|\n", probe[i],
                md / mr);
        CHECK_MSG(md > 1e-2 * mr, "%s: the state path changes nothing (%.3g)", probe[i], md / mr);
    }
    for (int k = 0; k < NSEG; k++)
        arl_model_train_free(&tr[k]);
    arl_decode_state_free(&st);
    arl_decode_state_free(&ds);
    arl_model_free(&m);
    bw_grads_free(&F);
    bw_grads_free(&S);
    bw_grads_free(&C);
}

/* ---- finite differences with the inference forward from an imported state ---- */

typedef struct fd_ctx {
    arl_model *m;
    const uint8_t *state;
    size_t state_len;
    arl_decode_state *st;
    const int32_t *routes;
} fd_ctx;

/* sum over segment 2 of -log pi(target), from the imported state, routes forced. */
static double seg2_loss(fd_ctx *c) {
    arl_decode_state_reset(c->st, 0);
    arl_status s = arl_decode_state_import(c->st, 0, c->state, c->state_len);
    CHECK(s == ARL_OK);
    float lp[TL];
    int32_t slot = 0;
    arl_batch b = {.tokens = TOK + CUT[1],
                   .T = CUT[2] - CUT[1],
                   .targets = TGT + CUT[1],
                   .forced_routes = c->routes};
    arl_forward_out o = {.logprobs = lp};
    s = arl_model_forward_state(c->m, c->st, &slot, &b, &o);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    double L = 0;
    for (int64_t t = 0; t < b.T; t++)
        L -= lp[t];
    return L;
}

static void test_finite_differences(void) {
    arl_model m;
    bw_model_init(&m, &TM, 64, 2, 16);
    /* the state after segment 1, by the inference prefill, exported */
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 1, 1024) == ARL_OK);
    int32_t slot;
    CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
    CHECK(arl_model_prefill(&m, &st, slot, TOK, CUT[1], NULL, 0, NULL, NULL) == ARL_OK);
    uint8_t *exp = NULL;
    size_t len = 0;
    CHECK(arl_decode_state_export_alloc(&st, slot, &exp, &len) == ARL_OK);

    /* the gradient of segment 2 from the imported state */
    arl_decode_state st2;
    CHECK(arl_decode_state_init(&st2, &TM.cfg, 1, 1024) == ARL_OK);
    CHECK(arl_decode_state_join(&st2, &slot) == ARL_OK);
    CHECK(arl_decode_state_import(&st2, slot, exp, len) == ARL_OK);
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t T2 = CUT[2] - CUT[1];
    int32_t *routes = calloc((size_t)(dm->n_moe * T2 * dm->k), sizeof(int32_t));
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads G;
    bw_grads_init(&G, &TM);
    arl_batch b = {.tokens = TOK + CUT[1], .T = T2, .targets = TGT + CUT[1]};
    arl_forward_out o = {.routes = routes};
    double nll;
    arl_status s = arl_model_nll_grad(&tr, &b, &st2, &slot, 1.0, &G.g, &nll, &o);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());

    fd_ctx c = {&m, exp, len, &st2, routes};
    CHECK_CLOSE(seg2_loss(&c), nll, 0.0, 1e-5);
    const arl_param_inventory *inv = &TM.w.inv;
    int64_t checked = 0, failed = 0;
    double worst = 0;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        float *x = arl_model_params_tensor(&TM.w, i);
        const float *g = arl_model_params_tensor(&G.g, i);
        double gn = 0;
        for (int64_t j = 0; j < t->numel; j++)
            gn += (double)g[j] * g[j];
        gn = sqrt(gn);
        if (gn < 1e-3) continue; /* experts without tokens, the router bias, vision */
        if (t->expert >= 0 && t->layer != 1) continue; /* experts: one layer is enough (time) */
        const double h = fmin(1e-2, 0.1 / gn); /* along v = g / |g|; the loss moves <= 0.1 */
        float *x0 = malloc(sizeof(float) * (size_t)t->numel);
        memcpy(x0, x, sizeof(float) * (size_t)t->numel);
        for (int64_t j = 0; j < t->numel; j++)
            x[j] = (float)(x0[j] + h * g[j] / gn);
        double lp = seg2_loss(&c);
        for (int64_t j = 0; j < t->numel; j++)
            x[j] = (float)(x0[j] - h * g[j] / gn);
        double lm = seg2_loss(&c);
        memcpy(x, x0, sizeof(float) * (size_t)t->numel);
        free(x0);
        double fd = (lp - lm) / (2 * h), an = gn; /* g . v = |g| */
        double err = fabs(fd - an);
        checked++;
        if (err / an > worst) worst = err / an;
        if (!(err <= 2e-2 * an + 2e-4)) {
            failed++;
            fprintf(stderr, "  fd mismatch %s: analytic %.6g, fd %.6g\n", t->name, an, fd);
        }
    }
    fprintf(stderr, "  finite differences: %lld tensors, worst relative error %.3g\n",
            (long long)checked, worst);
    CHECK(checked > 100);
    CHECK_EQ_INT(failed, 0);
    free(routes);
    free(exp);
    bw_grads_free(&G);
    arl_model_train_free(&tr);
    arl_decode_state_free(&st);
    arl_decode_state_free(&st2);
    arl_model_free(&m);
}

/* ---- equalities ---- */

static void test_fresh_slot_and_import(void) {
    arl_model m;
    bw_model_init(&m, &TM, 64, 2, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads A, B;
    bw_grads_init(&A, &TM);
    bw_grads_init(&B, &TM);
    arl_decode_state st, st2;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 1, 1024) == ARL_OK);
    CHECK(arl_decode_state_init(&st2, &TM.cfg, 1, 1024) == ARL_OK);
    int32_t slot;
    CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
    double n1, n2;
    /* segment 1 from a slot at position 0 == a fresh document */
    arl_batch b1 = {.tokens = TOK, .T = CUT[1], .targets = TGT};
    CHECK(arl_model_nll_grad(&tr, &b1, NULL, NULL, 1.0, &A.g, &n1, NULL) == ARL_OK);
    CHECK(arl_model_nll_grad(&tr, &b1, &st, &slot, 1.0, &B.g, &n2, NULL) == ARL_OK);
    CHECK(n1 == n2);
    CHECK_MSG(memcmp(A.arena, B.arena, sizeof(float) * (size_t)A.n) == 0,
              "a slot at position 0 trains differently from a fresh document");
    /* segment 2 from the state, and from its export imported into another state */
    uint8_t *exp = NULL;
    size_t len = 0;
    CHECK(arl_decode_state_export_alloc(&st, slot, &exp, &len) == ARL_OK);
    int32_t s2;
    CHECK(arl_decode_state_join(&st2, &s2) == ARL_OK);
    CHECK(arl_decode_state_import(&st2, s2, exp, len) == ARL_OK);
    bw_grads_zero(&A);
    bw_grads_zero(&B);
    arl_batch b2 = {.tokens = TOK + CUT[1], .T = CUT[2] - CUT[1], .targets = TGT + CUT[1]};
    CHECK(arl_model_nll_grad(&tr, &b2, &st, &slot, 1.0, &A.g, &n1, NULL) == ARL_OK);
    CHECK(arl_model_nll_grad(&tr, &b2, &st2, &s2, 1.0, &B.g, &n2, NULL) == ARL_OK);
    CHECK(n1 == n2);
    CHECK_MSG(memcmp(A.arena, B.arena, sizeof(float) * (size_t)A.n) == 0,
              "an imported state trains differently");
    CHECK_EQ_INT(arl_decode_state_position(&st2, s2), CUT[2]);
    free(exp);
    bw_grads_free(&A);
    bw_grads_free(&B);
    arl_model_train_free(&tr);
    arl_decode_state_free(&st);
    arl_decode_state_free(&st2);
    arl_model_free(&m);
}

/* Two documents continuing two slots at different positions, in one batch, equal each alone. */
static void test_batch_of_segments(void) {
    arl_model m;
    bw_model_init(&m, &TM, 128, 4, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 1);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 3, 1024) == ARL_OK);
    int32_t sl[3];
    for (int i = 0; i < 3; i++)
        CHECK(arl_decode_state_join(&st, &sl[i]) == ARL_OK);
    /* slot 0: TOK[0..40) prefilled; slot 1: TOK[0..73) prefilled; both continue */
    CHECK(arl_model_prefill(&m, &st, sl[0], TOK, CUT[1], NULL, 0, NULL, NULL) == ARL_OK);
    CHECK(arl_model_prefill(&m, &st, sl[1], TOK, CUT[2], NULL, 0, NULL, NULL) == ARL_OK);
    uint8_t *e0, *e1;
    size_t n0, n1;
    CHECK(arl_decode_state_export_alloc(&st, sl[0], &e0, &n0) == ARL_OK);
    CHECK(arl_decode_state_export_alloc(&st, sl[1], &e1, &n1) == ARL_OK);
    int32_t tok[128], tgt[128], cu[3] = {0, 0, 0};
    int64_t la = CUT[2] - CUT[1], lb = CUT[3] - CUT[2];
    memcpy(tok, TOK + CUT[1], sizeof(int32_t) * (size_t)la);
    memcpy(tgt, TGT + CUT[1], sizeof(int32_t) * (size_t)la);
    memcpy(tok + la, TOK + CUT[2], sizeof(int32_t) * (size_t)lb);
    memcpy(tgt + la, TGT + CUT[2], sizeof(int32_t) * (size_t)lb);
    cu[1] = (int32_t)la;
    cu[2] = (int32_t)(la + lb);
    bw_grads P, S;
    bw_grads_init(&P, &TM);
    bw_grads_init(&S, &TM);
    double nl, ns = 0, x;
    arl_batch bp = {.tokens = tok, .T = la + lb, .cu = cu, .N = 2, .targets = tgt};
    int32_t slots2[2] = {sl[0], sl[1]};
    CHECK(arl_model_nll_grad(&tr, &bp, &st, slots2, 1.0, &P.g, &nl, NULL) == ARL_OK);
    CHECK(arl_decode_state_import(&st, sl[0], e0, n0) == ARL_OK);
    CHECK(arl_decode_state_import(&st, sl[1], e1, n1) == ARL_OK);
    arl_batch ba = {.tokens = tok, .T = la, .targets = tgt};
    arl_batch bb = {.tokens = tok + la, .T = lb, .targets = tgt + la};
    CHECK(arl_model_nll_grad(&tr, &ba, &st, &sl[0], 1.0, &S.g, &x, NULL) == ARL_OK);
    ns += x;
    CHECK(arl_model_nll_grad(&tr, &bb, &st, &sl[1], 1.0, &S.g, &x, NULL) == ARL_OK);
    ns += x;
    CHECK_CLOSE(nl, ns, 0.0, 1e-5);
    bw_compare("two segments in one batch vs each alone", &TM, &P, &S, 1e-4);
    free(e0);
    free(e1);
    bw_grads_free(&P);
    bw_grads_free(&S);
    arl_model_train_free(&tr);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

static void test_errors(void) {
    arl_model m;
    bw_model_init(&m, &TM, 64, 4, 16);
    arl_train_opts o;
    arl_train_opts_default(&o);
    o.max_state_docs = 1;
    arl_model_train tr;
    CHECK(arl_model_train_init(&tr, &m, &o, NULL) == ARL_OK);
    arl_decode_state st, ds;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 1024) == ARL_OK);
    CHECK(arl_decode_state_init(&ds, &TM.cfg, 2, 1024) == ARL_OK);
    int32_t sl[2];
    CHECK(arl_decode_state_join(&st, &sl[0]) == ARL_OK);
    CHECK(arl_decode_state_join(&st, &sl[1]) == ARL_OK);
    int32_t cu[3] = {0, 10, 20};
    arl_batch b = {.tokens = TOK, .T = 20, .cu = cu, .N = 2, .targets = TGT};
    CHECK(arl_model_train_forward(&tr, &b, &st, sl, NULL) == ARL_ERR_RANGE); /* max_state_docs */
    arl_batch b1 = {.tokens = TOK, .T = 20, .targets = TGT};
    CHECK(arl_model_train_forward(&tr, &b1, &st, sl, NULL) == ARL_OK);
    arl_decode_state_leave(&st, sl[1]);
    int32_t gone = sl[1];
    CHECK(arl_model_train_forward(&tr, &b1, &st, &gone, NULL) == ARL_ERR_STATE);
    /* the gradient state must sit at the segment's end */
    CHECK(arl_model_train_forward(&tr, &b1, &st, &sl[0], NULL) == ARL_OK);
    float dl[20] = {0};
    bw_grads G;
    bw_grads_init(&G, &TM);
    CHECK(arl_state_grad_prepare(&ds, sl[0], 7) == ARL_OK);
    CHECK(arl_model_backward(&tr, &b1, dl, &G.g, &ds, NULL) == ARL_ERR_STATE);
    CHECK(arl_state_grad_prepare(&ds, sl[0], 40) == ARL_OK);
    CHECK(arl_model_backward(&tr, &b1, dl, &G.g, &ds, NULL) == ARL_OK);
    CHECK_EQ_INT(arl_decode_state_position(&ds, sl[0]), 20);
    bw_grads_free(&G);
    arl_model_train_free(&tr);
    arl_decode_state_free(&st);
    arl_decode_state_free(&ds);
    arl_model_free(&m);
}

int main(void) {
    arl_k_threads_init(2);
    tiny_load(&TM);
    bw_tokens(TOK, TL, 77);
    arl_batch_next_token_targets(TGT, TOK, NULL, 1, TL);
    TEST_RUN(test_exact_decomposition);
    TEST_RUN(test_finite_differences);
    TEST_RUN(test_fresh_slot_and_import);
    TEST_RUN(test_batch_of_segments);
    TEST_RUN(test_errors);
    tiny_free(&TM);
    return test_finish();
}
