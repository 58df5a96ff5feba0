/* tests/envs_builtin/test_png.c: the stored-block PNG encoder (envs/builtin/png_write.c)
 * writes valid files: signature, chunk layout and CRCs (checked with an independent bitwise
 * CRC-32), IHDR fields, a zlib stream whose stored blocks and Adler-32 are checked by a
 * decoder written here, and pixels that decode to the input. */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "envs/builtin/png_write.h"
#include "tests/envs_builtin/png_decode.h"
#include "tests/test.h"

static void roundtrip(int w, int h, uint64_t seed) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    uint8_t *img = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        img[i] = (uint8_t)arl_rng_next(&r);
    uint8_t *png = NULL;
    size_t len = 0;
    CHECK_EQ_INT(arl_png_write_rgb(img, w, h, &png, &len), ARL_OK);
    int dw = 0, dh = 0;
    uint8_t *out = NULL;
    CHECK_MSG(png_decode(png, len, &dw, &dh, &out), "%dx%d does not decode", w, h);
    CHECK_EQ_INT(dw, w);
    CHECK_EQ_INT(dh, h);
    if (out) CHECK(!memcmp(out, img, (size_t)w * h * 3));
    /* deterministic: the same pixels give the same bytes */
    uint8_t *png2 = NULL;
    size_t len2 = 0;
    CHECK_EQ_INT(arl_png_write_rgb(img, w, h, &png2, &len2), ARL_OK);
    CHECK(len2 == len && !memcmp(png, png2, len));
    free(out);
    free(png);
    free(png2);
    free(img);
}

static void test_roundtrip(void) {
    roundtrip(1, 1, 1);
    roundtrip(28, 28, 2);
    roundtrip(56, 56, 3);
    roundtrip(7, 5, 4);
    roundtrip(200, 120, 5); /* 72120 filtered bytes: two stored blocks */
    roundtrip(5, 4096, 6);  /* 4096 rows of 16 bytes: exactly 65536 bytes, blocks of 65535 and 1 */
}

static void test_errors(void) {
    uint8_t px[3] = {0};
    uint8_t *png = (uint8_t *)1;
    size_t len = 1;
    CHECK_EQ_INT(arl_png_write_rgb(px, 0, 1, &png, &len), ARL_ERR_ARG);
    CHECK(png == NULL && len == 0);
    CHECK_EQ_INT(arl_png_write_rgb(px, 1, 5000, &png, &len), ARL_ERR_ARG);
}

int main(void) {
    TEST_RUN(test_roundtrip);
    TEST_RUN(test_errors);
    return test_finish();
}
