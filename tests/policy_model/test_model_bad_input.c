/* tests/policy_model/test_model_bad_input.c: what callers and stored data can get wrong gets a
 * clear status and message, never a crash, and leaves the model and the decode state usable:
 * a checkpoint that does not match the config, token / target ids out of range, bad document
 * boundaries, bad forced routes, batches over the model's limits, misuse of decode-state
 * slots, damaged or foreign state exports, images that are not PNG/PPM or too large, and image
 * input to a model without a vision tower.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32.h"
#include "policy/checkpoint.h"
#include "policy/image.h"
#include "policy/vision.h"
#include "tests/policy_model/tiny.h"

static tiny_model TM;

static void expect(arl_status got, arl_status want, const char *needle, const char *what) {
    CHECK_MSG(got == want, "%s: status %s, expected %s (%s)", what, arl_status_str(got),
              arl_status_str(want), arl_error_msg());
    if (needle && got == want)
        CHECK_MSG(strstr(arl_error_msg(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
                  arl_error_msg(), needle);
}

static void test_checkpoint_mismatch(void) {
    const char *dir = test_tmpdir("model_ckpt");
    char ck[1024], cfgpath[1024];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    CHECK(arl_checkpoint_save(ck, &TM.cfg, &TM.w, 0) == ARL_OK);
    /* a config with fewer experts: the expert tensors and router do not match */
    arl_model_config other;
    CHECK(arl_model_config_copy(&other, &TM.cfg) == ARL_OK);
    other.text.num_experts = 8;
    CHECK(arl_model_config_validate(&other) == ARL_OK);
    arl_model_params w;
    CHECK(arl_model_params_alloc(&w, &other) == ARL_OK);
    expect(arl_checkpoint_load(ck, &other, &w), ARL_ERR_CONFIG, NULL,
           "checkpoint whose config.json differs");
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", ck);
    CHECK(unlink(cfgpath) == 0);
    expect(arl_checkpoint_load(ck, &other, &w), ARL_ERR_SHAPE, "gate.weight",
           "checkpoint tensors of another config");
    arl_model_params_free(&w);
    arl_model_config_free(&other);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_batch_errors(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_model m;
    tiny_model_init(&m, &TM, 32, 4);
    int32_t tok[40];
    for (int i = 0; i < 40; i++)
        tok[i] = 100 + i;
    float *lg = malloc(sizeof(float) * 40 * dm->V);
    arl_forward_out o = {.logits = lg};
    arl_batch b = {.tokens = tok, .T = 10};
    tok[3] = (int32_t)dm->V;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "position 3", "token id = V");
    tok[3] = -1;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "position 3", "negative token id");
    tok[3] = 5;
    int32_t targets[10];
    for (int i = 0; i < 10; i++)
        targets[i] = -1;
    targets[7] = 999;
    b.targets = targets;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "target", "target id out of range");
    b.targets = NULL;
    b.T = 33;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "max_tokens", "too many tokens");
    b.T = 0;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_ARG, NULL, "empty batch");
    int32_t cu_bad[3] = {0, 0, 10}, cu_short[3] = {0, 4, 9};
    b.T = 10;
    b.cu = cu_bad;
    b.N = 2;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_ARG, "empty", "empty document");
    b.cu = cu_short;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_ARG, "cu_seqlens", "cu not ending at T");
    int32_t cu6[7] = {0, 1, 2, 3, 4, 5, 10};
    b.cu = cu6;
    b.N = 6;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "max_docs", "too many documents");
    b.cu = NULL;
    b.N = 0;
    /* forced routes: out of range, repeated */
    int32_t *fr = malloc(sizeof(int32_t) * dm->n_moe * 10 * dm->k);
    for (int64_t i = 0; i < dm->n_moe * 10; i++)
        for (int64_t j = 0; j < dm->k; j++)
            fr[i * dm->k + j] = (int32_t)j;
    b.forced_routes = fr;
    CHECK(arl_model_forward(&m, &b, &o) == ARL_OK);
    fr[5 * dm->k + 1] = (int32_t)dm->E;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "forced route", "route = E");
    fr[5 * dm->k + 1] = 0;
    expect(arl_model_forward(&m, &b, &o), ARL_ERR_RANGE, "repeat", "repeated route");
    free(fr);
    /* the model still works after the errors */
    b.forced_routes = NULL;
    CHECK(arl_model_forward(&m, &b, &o) == ARL_OK);
    free(lg);
    arl_model_free(&m);
}

static void test_state_errors(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_model m;
    tiny_model_init(&m, &TM, 32, 4);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 40) == ARL_OK);
    int32_t a, b2, c;
    CHECK(arl_decode_state_join(&st, &a) == ARL_OK);
    CHECK(arl_decode_state_join(&st, &b2) == ARL_OK);
    expect(arl_decode_state_join(&st, &c), ARL_ERR_FULL, "slots", "join a full state");
    int32_t tok[32];
    for (int i = 0; i < 32; i++)
        tok[i] = 40 + i;
    float *lg = malloc(sizeof(float) * 32 * dm->V);
    CHECK(arl_model_prefill(&m, &st, a, tok, 20, NULL, 0, NULL, NULL) == ARL_OK);
    int32_t slots2[2] = {a, a};
    expect(arl_model_decode_step(&m, &st, slots2, 2, tok, lg, NULL), ARL_ERR_STATE, "twice",
           "same slot twice");
    arl_decode_state_leave(&st, b2);
    expect(arl_model_decode_step(&m, &st, &b2, 1, tok, lg, NULL), ARL_ERR_STATE, "no sequence",
           "inactive slot");
    /* bad token: nothing changes in the slot */
    int32_t bad = 1000;
    expect(arl_model_decode_step(&m, &st, &a, 1, &bad, lg, NULL), ARL_ERR_RANGE, NULL,
           "bad token in a step");
    CHECK_EQ_INT(arl_decode_state_position(&st, a), 20);
    /* past max_context (40) */
    expect(arl_model_prefill(&m, &st, a, tok, 21, NULL, 0, NULL, NULL), ARL_ERR_RANGE,
           "max_context", "sequence past max_context");
    CHECK(arl_decode_state_position(&st, a) <= 40);
    /* a state allowing more positions than the model was set up for */
    arl_model small;
    arl_model_opts so;
    arl_model_opts_default(&so);
    so.max_tokens = 8;
    so.max_context = 16;
    CHECK(arl_model_init(&small, &TM.cfg, &TM.w, &so) == ARL_OK);
    arl_decode_state_reset(&st, a);
    expect(arl_model_prefill(&small, &st, a, tok, 20, NULL, 0, NULL, NULL), ARL_ERR_RANGE,
           "max_context", "state longer than the model's max_context");
    CHECK_EQ_INT(arl_decode_state_position(&st, a), 16);
    arl_model_free(&small);

    /* export damage */
    arl_decode_state_reset(&st, a);
    CHECK(arl_model_prefill(&m, &st, a, tok, 20, NULL, 0, NULL, NULL) == ARL_OK);
    uint8_t *blob;
    size_t len;
    CHECK(arl_decode_state_export_alloc(&st, a, &blob, &len) == ARL_OK);
    uint8_t *bad_blob = malloc(len + 8);
    CHECK(arl_decode_state_join(&st, &b2) == ARL_OK);
#define DAMAGE(stmt, want, needle, what)                                                           \
    do {                                                                                           \
        memcpy(bad_blob, blob, len);                                                               \
        size_t n_ = len;                                                                           \
        stmt;                                                                                      \
        expect(arl_decode_state_import(&st, b2, bad_blob, n_), want, needle, what);                \
        CHECK_EQ_INT(arl_decode_state_position(&st, b2), 0);                                       \
    } while (0)
    DAMAGE(bad_blob[0] = 'X', ARL_ERR_FORMAT, "magic", "bad magic");
    DAMAGE(bad_blob[4] = 2; bad_blob[60] ^= 0, ARL_ERR_VERSION, "format_version", "version 2");
    DAMAGE(bad_blob[45] ^= 1, ARL_ERR_CORRUPT, "CRC", "header bit flip");
    DAMAGE(bad_blob[len - 3] ^= 1, ARL_ERR_CORRUPT, "CRC", "payload bit flip");
    DAMAGE(n_ = len - 5, ARL_ERR_FORMAT, NULL, "truncated");
    DAMAGE(n_ = 30, ARL_ERR_FORMAT, "header", "shorter than the header");
    DAMAGE(memset(bad_blob + len, 0, 8);
           n_ = len + 8, ARL_ERR_FORMAT, "trailing", "trailing bytes");
    /* another config: a different hash (header CRC recomputed so that the hash is what fails) */
    DAMAGE(bad_blob[8] ^= 0xff; uint32_t cr = arl_crc32(bad_blob, 60);
           memcpy(bad_blob + 60, &cr, 4), ARL_ERR_CONFIG, "config hash", "foreign config");
    /* position beyond max_context */
    DAMAGE(bad_blob[40] = 200; uint32_t cr = arl_crc32(bad_blob, 60);
           memcpy(bad_blob + 60, &cr, 4), ARL_ERR_RANGE, "max_context", "position too large");
    /* position 21 with 20 rows per MLA layer: the blobs do not add up */
    DAMAGE(bad_blob[40] = 21; uint32_t cr = arl_crc32(bad_blob, 60);
           memcpy(bad_blob + 60, &cr, 4), ARL_ERR_SHAPE, "layer", "rows missing");
    /* the intact export still imports, and decoding continues identically */
    CHECK(arl_decode_state_import(&st, b2, blob, len) == ARL_OK);
    float *la = malloc(sizeof(float) * dm->V), *lb = malloc(sizeof(float) * dm->V);
    CHECK(arl_model_decode_step(&m, &st, &a, 1, tok + 20, la, NULL) == ARL_OK);
    CHECK(arl_model_decode_step(&m, &st, &b2, 1, tok + 20, lb, NULL) == ARL_OK);
    CHECK(memcmp(la, lb, sizeof(float) * dm->V) == 0);
    free(la);
    free(lb);
    free(bad_blob);
    free(blob);
    free(lg);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

static void test_image_errors(void) {
    arl_image im;
    const uint8_t junk[] = "not an image at all";
    expect(arl_image_decode(junk, sizeof junk, ARL_IMAGE_MAX_PIXELS_DEFAULT, "junk", &im),
           ARL_ERR_FORMAT, "junk", "not PNG/PPM");
    const char huge[] = "P6\n70000 70000\n255\n";
    arl_status s = arl_image_decode((const uint8_t *)huge, sizeof huge - 1,
                                    ARL_IMAGE_MAX_PIXELS_DEFAULT, "huge.ppm", &im);
    CHECK_MSG(s != ARL_OK && strstr(arl_error_msg(), "huge.ppm"), "huge image: %s",
              arl_error_msg());
    const uint8_t png_trunc[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I'};
    s = arl_image_decode(png_trunc, sizeof png_trunc, ARL_IMAGE_MAX_PIXELS_DEFAULT, "t.png", &im);
    CHECK_MSG(s != ARL_OK, "truncated PNG accepted");

    /* odd patch grid, and a text-only model */
    arl_image ok = {.width = 28, .height = 28};
    ok.rgb = calloc(28 * 28 * 3, 1);
    float *tok;
    int64_t n;
    CHECK(arl_vision_encode_images(&TM.w, &TM.cfg, &ok, 1, 1024, &tok, &n) == ARL_OK);
    free(tok);
    const int32_t grid[2] = {3, 4};
    float dummy[16];
    expect(arl_vision_fwd(dummy, &TM.w, &TM.cfg, dummy, grid, 1, dummy, 16, NULL), ARL_ERR_ARG,
           "even", "odd grid");
    const int32_t grid2[2] = {2, 2};
    expect(arl_vision_fwd(dummy, &TM.w, &TM.cfg, dummy, grid2, 1, dummy, 16, NULL), ARL_ERR_RANGE,
           "work buffer", "work buffer too small");
    arl_model_config text_only;
    CHECK(arl_model_config_copy(&text_only, &TM.cfg) == ARL_OK);
    text_only.has_vision = 0;
    CHECK(arl_model_config_validate(&text_only) == ARL_OK);
    expect(arl_vision_encode_images(&TM.w, &text_only, &ok, 1, 1024, &tok, &n), ARL_ERR_UNSUPPORTED,
           "no vision tower", "image to a text-only model");
    arl_model_config_free(&text_only);
    arl_image_free(&ok);
}

int main(void) {
    tiny_load(&TM);
    TEST_RUN(test_checkpoint_mismatch);
    TEST_RUN(test_batch_errors);
    TEST_RUN(test_state_errors);
    TEST_RUN(test_image_errors);
    tiny_free(&TM);
    return test_finish();
}
