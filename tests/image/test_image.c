/* PNG/PPM decoding against fixtures written by gen_fixtures.py (Python's zlib), bad input at
 * every truncation point and with flipped bytes, the pixel limit, grid choice and patchify. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/file.h"
#include "policy/image.h"
#include "tests/test.h"

static const char *names[] = {"rgb8",   "rgb8_stored", "rgb8_fast", "rgba8", "rgb16", "gray8",
                              "graya8", "gray1",       "gray2",     "gray4", "pal4",  "pal8"};

static void test_fixtures(void) {
    char p1[512], p2[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p1, sizeof p1, "tests/image/fixtures/%s.png", names[i]);
        snprintf(p2, sizeof p2, "tests/image/fixtures/%s.expect.ppm", names[i]);
        arl_image a, b;
        arl_status s1 = arl_image_load(test_src_path(p1), 0, &a);
        arl_status s2 = arl_image_load(test_src_path(p2), 0, &b);
        CHECK_MSG(s1 == ARL_OK, "%s: %s", p1, arl_error_msg());
        CHECK_MSG(s2 == ARL_OK, "%s: %s", p2, arl_error_msg());
        if (s1 == ARL_OK && s2 == ARL_OK) {
            CHECK_EQ_INT(a.width, 37);
            CHECK_EQ_INT(a.height, 23);
            CHECK_MSG(a.width == b.width && a.height == b.height &&
                          !memcmp(a.rgb, b.rgb, (size_t)a.width * a.height * 3),
                      "%s: pixels differ from the expected PPM", names[i]);
        }
        arl_image_free(&a);
        arl_image_free(&b);
    }
}

static void test_ppm_ascii(void) {
    const char *txt = "P3\n# comment\n2 1\n15\n15 0 0  0 15 7\n";
    arl_image img;
    CHECK(arl_image_decode((const uint8_t *)txt, strlen(txt), 0, "ascii.ppm", &img) == ARL_OK);
    CHECK(img.width == 2 && img.height == 1);
    CHECK(img.rgb[0] == 255 && img.rgb[1] == 0 && img.rgb[4] == 255 && img.rgb[5] == 119);
    arl_image_free(&img);
    const char *bad = "P3\n2 1\n15\n15 0 0 0 16 7\n";
    CHECK(arl_image_decode((const uint8_t *)bad, strlen(bad), 0, "bad.ppm", &img) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "bad.ppm") != NULL);
}

/* Every prefix of a valid file and every single flipped byte: an error, never a crash
 * (ASan build), and never a success with a truncated file. */
static void test_bad_input(void) {
    size_t n;
    char *buf = NULL;
    CHECK_MSG(arl_file_read(test_src_path("tests/image/fixtures/rgb8.png"), 0, &buf, &n) == ARL_OK,
              "%s", arl_error_msg());
    if (!buf) return;
    uint8_t *d = (uint8_t *)buf;
    arl_image img;
    int ok_prefix = 0;
    for (size_t k = 0; k < n; k++) {
        if (arl_image_decode(d, k, 0, "trunc.png", &img) == ARL_OK) ok_prefix++;
        arl_image_free(&img);
    }
    CHECK_EQ_INT(ok_prefix, 0);
    uint8_t *c = malloc(n);
    int ok_flip = 0;
    for (size_t k = 0; k < n; k++) {
        memcpy(c, d, n);
        c[k] ^= 0x5a;
        /* a flip inside a chunk's data or CRC is a CRC error; the tEXt chunk is ancillary */
        if (arl_image_decode(c, n, 0, "flip.png", &img) == ARL_OK) ok_flip++;
        arl_image_free(&img);
    }
    /* only flips that leave a valid file may succeed: none in IHDR/IDAT/CRCs; the 8 bytes of
     * the signature fall back to "not an image"; flips in the tEXt type keep it ancillary */
    CHECK_MSG(ok_flip <= 4, "%d flipped files decoded", ok_flip);
    free(c);
    /* size limit */
    CHECK(arl_image_decode(d, n, 100, "big.png", &img) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "larger than the limit") != NULL);
    CHECK(arl_image_decode((const uint8_t *)"GIF89a....", 10, 0, "x.gif", &img) == ARL_ERR_FORMAT);
    CHECK(arl_image_load("/nonexistent/x.png", 0, &img) == ARL_ERR_NOT_FOUND);
    CHECK(strstr(arl_error_msg(), "/nonexistent/x.png") != NULL);
    free(d);
}

/* Empty IDAT chunks (allowed: the image data is the IDATs' concatenation) before and after
 * the data give the same pixels.  An empty first IDAT was a copy of 0 bytes to a NULL
 * buffer (undefined behaviour, found by tests/fuzz/fuzz_image.c). */
static void test_empty_idat(void) {
    char *buf = NULL;
    size_t n = 0;
    CHECK(arl_file_read(test_src_path("tests/image/fixtures/rgb8.png"), 0, &buf, &n) == ARL_OK);
    if (!buf) return;
    const uint8_t *d = (const uint8_t *)buf;
    /* an empty IDAT: length 0, type, the CRC of the type */
    const uint8_t empty[12] = {0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xaf, 0x06, 0x1e};
    CHECK(arl_crc32("IDAT", 4) == 0x35af061eu);
    size_t ihdr_end = 8 + 12 + 13, iend = n - 12; /* the signature and IHDR; IEND is last */
    CHECK(!memcmp(d + iend + 4, "IEND", 4));
    uint8_t *e = malloc(n + 3 * sizeof empty);
    size_t m = 0;
    memcpy(e, d, ihdr_end);
    m = ihdr_end;
    memcpy(e + m, empty, sizeof empty);
    m += sizeof empty;
    memcpy(e + m, d + ihdr_end, iend - ihdr_end);
    m += iend - ihdr_end;
    memcpy(e + m, empty, sizeof empty);
    m += sizeof empty;
    memcpy(e + m, d + iend, 12);
    m += 12;
    arl_image a, b;
    CHECK(arl_image_decode(d, n, 0, "rgb8.png", &a) == ARL_OK);
    CHECK_MSG(arl_image_decode(e, m, 0, "empty_idat.png", &b) == ARL_OK, "%s", arl_error_msg());
    CHECK(a.width == b.width && a.height == b.height && b.rgb &&
          !memcmp(a.rgb, b.rgb, (size_t)a.width * a.height * 3));
    arl_image_free(&a);
    arl_image_free(&b);
    free(e);
    free(buf);
}

static void test_grid_and_patchify(void) {
    int32_t gh, gw;
    CHECK(arl_image_grid(56, 28, 14, 1024, &gh, &gw) == ARL_OK);
    CHECK(gh == 2 && gw == 4);
    CHECK(arl_image_grid(5, 5, 14, 1024, &gh, &gw) == ARL_OK);
    CHECK(gh == 2 && gw == 2);
    CHECK(arl_image_grid(1400, 700, 14, 64, &gh, &gw) == ARL_OK);
    CHECK((int64_t)gh * gw <= 64 && gh % 2 == 0 && gw % 2 == 0 && gw >= gh);
    /* exact size: patches hold the normalised pixels in (patch, c, y, x) order */
    arl_image img = {4, 4, malloc(48)};
    for (int i = 0; i < 48; i++) img.rgb[i] = (uint8_t)(i * 5);
    float p[4 * 3 * 2 * 2];
    arl_image_patchify(&img, 2, 2, 2, p);
    /* patch 1 = grid (0,1): pixel (y=0,x=2), channel 1 */
    CHECK_CLOSE(p[(1 * 3 + 1) * 4 + 0], (img.rgb[(0 * 4 + 2) * 3 + 1] / 255.0 - 0.5) / 0.5, 1e-6, 0);
    /* patch 3 = grid (1,1): pixel (y=3,x=3), channel 2 */
    CHECK_CLOSE(p[(3 * 3 + 2) * 4 + 3], (img.rgb[(3 * 4 + 3) * 3 + 2] / 255.0 - 0.5) / 0.5, 1e-6, 0);
    /* halving: half-pixel bilinear averages each 2x2 block */
    float q[1 * 3 * 2 * 2];
    arl_image_patchify(&img, 2, 1, 1, q);
    double avg = (img.rgb[0] + img.rgb[3] + img.rgb[12] + img.rgb[15]) / 4.0;
    CHECK_CLOSE(q[0], (avg / 255.0 - 0.5) / 0.5, 1e-6, 0);
    arl_image_free(&img);
}

int main(void) {
    TEST_RUN(test_fixtures);
    TEST_RUN(test_ppm_ascii);
    TEST_RUN(test_bad_input);
    TEST_RUN(test_empty_idat);
    TEST_RUN(test_grid_and_patchify);
    return test_finish();
}
