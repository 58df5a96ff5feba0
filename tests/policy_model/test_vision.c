/* tests/policy_model/test_vision.c: the image front end (policy/vision.h) against the
 * vision_front golden case (spec/policy.md 10.3, 16.2): patchify of two images, patch
 * embedding + resized position grid, the encoder block with 2-D RoPE and per-image attention,
 * final norm, 2x2 merge, projector, and the placement of the image tokens into an embedded
 * token stream; then the same tokens through arl_vision_encode_images and a whole-model
 * forward with image rows.
 *
 * Tolerances: patches are one rounding of (x/255 - 0.5)/0.5: elementwise atol 1e-6, rtol 1e-5
 * (spec 16.4 elementwise ops).  Composite outputs use the max|ref| form with atol 0, rtol 1e-4
 * (spec 16.4: the vision front end is a composite case; fp32 GEMMs over at most 588 terms and
 * softmaxes over at most 24 keys give ~1e-6 relative); a wrong pair order in RoPE, merge
 * order, resize or norm epsilon gives errors of order max|ref|.
 */
#include "policy/vision.h"

#include "policy/model.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

#define RTOL 1e-4

static arl_model_config CFG;
static arl_model_params W;
static golden_case *GC;

static void cmp(const char *name, const float *a, int64_t n) {
    char what[128];
    snprintf(what, sizeof what, "vision_front/%s", name);
    check_close_maxref_f32(what, a, golden_f32(GC, name, n), (size_t)n, 0.0, RTOL);
}

static arl_image golden_image(const char *name) {
    int64_t shape[8];
    int32_t rank;
    golden_numel(GC, name, shape, &rank);
    float *px = golden_f32(GC, name, -1); /* U8, converted exactly */
    arl_image im = {.width = (int32_t)shape[1], .height = (int32_t)shape[0]};
    im.rgb = malloc((size_t)(shape[0] * shape[1] * 3));
    for (int64_t i = 0; i < shape[0] * shape[1] * 3; i++)
        im.rgb[i] = (uint8_t)px[i];
    return im;
}

static void test_front_end(void) {
    const arl_model_dims *dm = &CFG.dims;
    const int32_t grids[4] = {4, 6, 2, 4};
    const int64_t Np = 32, N = 8, p = dm->vp, D = dm->vD;
    arl_image im[2] = {golden_image("img0"), golden_image("img1")};
    float *patches = golden_zeros(GC, Np * 3 * p * p);
    arl_image_patchify(&im[0], (int32_t)p, 4, 6, patches);
    arl_image_patchify(&im[1], (int32_t)p, 2, 4, patches + 24 * 3 * p * p);
    check_close_f32("vision_front/patches", patches, golden_f32(GC, "patches", Np * 3 * p * p),
                    (size_t)(Np * 3 * p * p), 1e-6, 1e-5);

    int64_t wsn = arl_vision_ws_floats(&CFG, Np);
    float *ws = golden_zeros(GC, wsn), *tok = golden_zeros(GC, N * dm->d);
    arl_vision_trace tr = {.patch_tokens = golden_zeros(GC, Np * D),
                           .tower = golden_zeros(GC, Np * D),
                           .merged = golden_zeros(GC, N * 4 * D)};
    arl_status s = arl_vision_fwd(tok, &W, &CFG, patches, grids, 2, ws, wsn, &tr);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    cmp("patch_tokens", tr.patch_tokens, Np * D);
    cmp("tower", tr.tower, Np * D);
    cmp("merged", tr.merged, N * 4 * D);
    cmp("vision_tokens", tok, N * dm->d);

    /* placement into the token stream (the case's own embedding table) */
    int64_t S;
    golden_numel(GC, "tokens", &S, NULL);
    int32_t *ids = golden_i32(GC, "tokens", S);
    float *seq = golden_zeros(GC, S * dm->d);
    s = arl_vision_place(seq, golden_f32(GC, "embed", dm->V * dm->d), dm->V, dm->d, ids, S,
                         CFG.media_placeholder_token_id, tok, N);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    cmp("seq", seq, S * dm->d);
    CHECK(arl_vision_place(seq, golden_f32(GC, "embed", -1), dm->V, dm->d, ids, S,
                           CFG.media_placeholder_token_id, tok, N - 1) == ARL_ERR_ARG);

    /* decoded images -> tokens in one call (grids from arl_image_grid: 4x6 and 2x4) */
    float *tok2;
    int64_t n2;
    s = arl_vision_encode_images(&W, &CFG, im, 2, 1024, &tok2, &n2);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(n2, N);
    if (!s) cmp("vision_tokens", tok2, N * dm->d);

    /* a whole-model forward reads the image rows in place of the placeholders: the logits
     * differ from a forward that embeds the placeholders as ordinary tokens, and the rows
     * after the first placeholder only */
    arl_model m;
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    CHECK(arl_model_init(&m, &CFG, &W, &o) == ARL_OK);
    float *la = golden_zeros(GC, S * dm->V), *lb = golden_zeros(GC, S * dm->V);
    arl_batch b = {.tokens = ids, .T = S, .media = tok2, .n_media = n2};
    arl_forward_out fa = {.logits = la}, fb = {.logits = lb};
    CHECK(arl_model_forward(&m, &b, &fa) == ARL_OK);
    b.media = NULL;
    CHECK(arl_model_forward(&m, &b, &fb) == ARL_OK);
    int64_t first = 0;
    while (ids[first] != CFG.media_placeholder_token_id)
        first++;
    CHECK(memcmp(la, lb, sizeof(float) * first * dm->V) == 0);
    CHECK(memcmp(la + first * dm->V, lb + first * dm->V, sizeof(float) * dm->V) != 0);
    b.media = tok2;
    b.n_media = n2 - 1;
    CHECK(arl_model_forward(&m, &b, &fa) == ARL_ERR_ARG);
    arl_model_free(&m);
    free(tok2);
    for (int i = 0; i < 2; i++)
        arl_image_free(&im[i]);
}

int main(void) {
    if (arl_model_config_read(test_src_path("configs/tiny/config.json"), &CFG) ||
        arl_model_params_alloc(&W, &CFG)) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    GC = golden_open("vision_front");
    const arl_param_inventory *inv = &W.inv;
    for (int64_t i = 0; i < inv->n; i++) { /* vision weights from the case; text ones stay 0 */
        const arl_param_tensor *t = &inv->t[i];
        if (strncmp(t->name, "language_model.", 15))
            memcpy(arl_model_params_tensor(&W, i), golden_f32(GC, t->name, t->numel),
                   sizeof(float) * (size_t)t->numel);
    }
    /* text weights: a small non-zero embedding so the model forward has something to carry */
    for (int64_t i = 0; i < CFG.dims.V * CFG.dims.d; i++)
        W.embed_tokens[i] = (float)((i * 7919) % 13) * 0.01f;
    for (int64_t i = 0; i < CFG.dims.V * CFG.dims.d; i++)
        W.lm_head[i] = W.embed_tokens[i];
    for (int64_t i = 0; i < CFG.dims.d; i++)
        W.norm[i] = 1.0f;
    TEST_RUN(test_front_end);
    golden_close(GC);
    arl_model_params_free(&W);
    arl_model_config_free(&CFG);
    return test_finish();
}
