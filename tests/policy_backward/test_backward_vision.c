/* tests/policy_backward/test_backward_vision.c: the backward of the image front end
 * (policy/vision_backward.h) and the image-row gradient of the model backward.
 *   - vision_front golden case (spec/policy.md 16.2): two images (4x6 and 2x4 patch grids)
 *     through the tiny front end, upstream gradient dseq on the embedded sequence; the rows of
 *     the placeholders are the image tokens' gradient; every vision_tower.* and mm_projector.*
 *     gradient is compared with grad.<key>.  The recomputed tokens are bit-identical to
 *     arl_vision_fwd's.
 *   - the tiny model (model_tiny weights) on a sequence with image tokens: arl_model_backward's
 *     d_media against central differences of the loss (arl_model_forward, the inference code)
 *     in a few image-row entries; text-only batches leave the vision tower's gradient at zero
 *     (test_backward_golden checks that).
 * Tolerances: golden gradients max|ref| form, atol 0, rtol 1e-3 (spec 16.4 composite backward;
 * fp32 GEMMs over at most 588 terms give ~1e-6); forward tokens exact.  Finite differences:
 * fp32 inputs, loss in double, h = 1e-2, |fd - g| <= 2e-2 max|g| + 1e-4 (rounding ~1e-6 |L|/h,
 * truncation O(h^2); a wrong row or missing path is O(max|g|)).
 */
#include "policy/image.h"
#include "policy/vision.h"
#include "policy/vision_backward.h"
#include "tests/policy_backward/bw_util.h"

#define RTOL_BWD 1e-3

static void test_vision_golden(void) {
    arl_model_config cfg;
    arl_model_params W, G;
    CHECK(arl_model_config_read(test_src_path("configs/tiny/config.json"), &cfg) == ARL_OK);
    CHECK(arl_model_params_alloc(&W, &cfg) == ARL_OK);
    CHECK(arl_model_params_alloc(&G, &cfg) == ARL_OK);
    golden_case *gc = golden_open("vision_front");
    const arl_param_inventory *inv = &W.inv;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        if (strncmp(t->name, "language_model.", 15))
            memcpy(arl_model_params_tensor(&W, i), golden_f32(gc, t->name, t->numel),
                   sizeof(float) * (size_t)t->numel);
    }
    const arl_model_dims *dm = &cfg.dims;
    const int32_t grids[4] = {4, 6, 2, 4};
    const int64_t Np = 32, N = 8, p = dm->vp, d = dm->d;
    float *patches = golden_f32(gc, "patches", Np * 3 * p * p);
    int64_t S;
    golden_numel(gc, "tokens", &S, NULL);
    int32_t *ids = golden_i32(gc, "tokens", S);
    float *dseq = golden_f32(gc, "dseq", S * d);
    float *dtok = golden_zeros(gc, N * d);
    int64_t k = 0;
    for (int64_t t = 0; t < S; t++)
        if (ids[t] == cfg.media_placeholder_token_id) {
            memcpy(dtok + k * d, dseq + t * d, sizeof(float) * (size_t)d);
            k++;
        }
    CHECK_EQ_INT(k, N);
    int64_t wsn = arl_vision_train_ws_floats(&cfg, Np);
    float *ws = golden_zeros(gc, wsn), *tok = golden_zeros(gc, N * d),
          *tok2 = golden_zeros(gc, N * d);
    arl_status s = arl_vision_bwd(&G, tok, dtok, &W, &cfg, patches, grids, 2, ws, wsn);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    int64_t fwn = arl_vision_ws_floats(&cfg, Np);
    CHECK(arl_vision_fwd(tok2, &W, &cfg, patches, grids, 2, golden_zeros(gc, fwn), fwn, NULL) ==
          ARL_OK);
    CHECK_MSG(memcmp(tok, tok2, sizeof(float) * (size_t)(N * d)) == 0,
              "vision backward's forward differs from arl_vision_fwd");
    int64_t compared = 0;
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        const float *g = arl_model_params_tensor(&G, i);
        char key[600], what[700];
        snprintf(key, sizeof key, "grad.%s", t->name);
        if (!strncmp(t->name, "language_model.", 15)) {
            int64_t nz = 0;
            for (int64_t j = 0; j < t->numel; j++)
                nz += g[j] != 0.0f;
            CHECK_EQ_INT(nz, 0);
            continue;
        }
        snprintf(what, sizeof what, "vision_front/%s", key);
        check_close_maxref_f32(what, g, golden_f32(gc, key, t->numel), (size_t)t->numel, 0.0,
                               RTOL_BWD);
        compared++;
    }
    CHECK(compared >= 11);
    /* errors as the forward */
    const int32_t bad[2] = {3, 4};
    CHECK(arl_vision_bwd(&G, NULL, dtok, &W, &cfg, patches, bad, 1, ws, wsn) == ARL_ERR_ARG);
    CHECK(arl_vision_bwd(&G, NULL, dtok, &W, &cfg, patches, grids, 2, ws, 100) == ARL_ERR_RANGE);
    golden_close(gc);
    arl_model_params_free(&W);
    arl_model_params_free(&G);
    arl_model_config_free(&cfg);
}

/* ---- image rows through the whole model ---- */

static tiny_model TM;

typedef struct media_fd {
    arl_model *m;
    arl_batch b;
    float *media;
} media_fd;

static double media_loss(void *vctx) {
    media_fd *f = vctx;
    float lp[64];
    arl_forward_out o = {.logprobs = lp};
    f->b.media = f->media;
    CHECK(arl_model_forward(f->m, &f->b, &o) == ARL_OK);
    double L = 0;
    for (int64_t t = 0; t < f->b.T; t++)
        L -= f->b.targets[t] >= 0 ? lp[t] : 0.0;
    return L;
}

static void test_model_media_rows(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    enum { T = 30, NM = 6 };
    int32_t tok[T], tgt[T];
    bw_tokens(tok, T, 3);
    for (int i = 0; i < NM; i++)
        tok[9 + i] = (int32_t)TM.cfg.media_placeholder_token_id;
    arl_batch_next_token_targets(tgt, tok, NULL, 1, T);
    float media[NM * 128], dmedia[NM * 128] = {0};
    ARL_ASSERT(dm->d == 128);
    arl_rng r;
    arl_rng_seed(&r, 4);
    for (int i = 0; i < NM * 128; i++)
        media[i] = (float)arl_rng_normal(&r);
    arl_model m;
    bw_model_init(&m, &TM, 64, 2, 16);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads G;
    bw_grads_init(&G, &TM);
    arl_batch b = {.tokens = tok, .T = T, .targets = tgt, .media = media, .n_media = NM};
    float dl[T];
    for (int t = 0; t < T; t++)
        dl[t] = -1.0f;
    int32_t *routes = calloc((size_t)(dm->n_moe * T * dm->k), sizeof(int32_t));
    arl_forward_out o = {.routes = routes};
    CHECK(arl_model_train_forward(&tr, &b, NULL, NULL, &o) == ARL_OK);
    CHECK(arl_model_backward(&tr, &b, dl, &G.g, NULL, dmedia) == ARL_OK);
    /* the placeholder's own embedding row gets nothing from image positions */
    const float *pe = G.g.embed_tokens + TM.cfg.media_placeholder_token_id * dm->d;
    int64_t nz = 0;
    for (int64_t i = 0; i < dm->d; i++)
        nz += pe[i] != 0.0f;
    CHECK_EQ_INT(nz, 0);
    /* finite differences in 24 entries spread over the rows, with the routes of the
     * unperturbed forward forced (a top-k flip would make the loss jump) */
    media_fd f = {&m, b, media};
    f.b.forced_routes = routes;
    float gsel[24], xsel[24];
    int idx[24];
    for (int i = 0; i < 24; i++) {
        idx[i] = (i * 977 + 13) % (NM * 128);
        gsel[i] = dmedia[idx[i]];
    }
    double maxg = 0, worst = 0;
    for (int i = 0; i < 24; i++)
        maxg = fmax(maxg, fabs(gsel[i]));
    for (int i = 0; i < 24; i++) {
        float x0 = media[idx[i]];
        media[idx[i]] = x0 + 1e-2f;
        double lp = media_loss(&f);
        media[idx[i]] = x0 - 1e-2f;
        double lm = media_loss(&f);
        media[idx[i]] = x0;
        xsel[i] = (float)((lp - lm) / ((double)(x0 + 1e-2f) - (double)(x0 - 1e-2f)));
        worst = fmax(worst, fabs(xsel[i] - gsel[i]));
    }
    fprintf(stderr, "  d_media vs finite differences: max|diff| %.3g, max|g| %.3g\n", worst, maxg);
    CHECK(maxg > 1e-3);
    CHECK(worst <= 2e-2 * maxg + 1e-4);
    free(routes);
    bw_grads_free(&G);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

int main(void) {
    arl_k_threads_init(2);
    TEST_RUN(test_vision_golden);
    tiny_load(&TM);
    TEST_RUN(test_model_media_rows);
    tiny_free(&TM);
    return test_finish();
}
