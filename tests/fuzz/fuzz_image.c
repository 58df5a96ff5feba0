/* tests/fuzz/fuzz_image.c: libFuzzer target for the image decoders (policy/image.c: PNG with
 * its zlib stream through core/inflate.c, and PPM).  Images reach the policy from environments
 * over HTTP (observations), so every byte of them is untrusted.
 *
 * A PNG's chunks carry CRCs and its zlib stream an Adler-32, which random mutations almost never
 * keep right; the decoder would stop at the first check.  So the first byte of an input picks
 * how the rest becomes the bytes decoded:
 *   even: the rest as it is, each PNG chunk's CRC rewritten to match (chunk parsing, inflate of
 *         whatever the IDAT holds, PPM);
 *   odd:  a PNG built from the rest: width, height, colour type and depth, a palette, then the
 *         filtered scanlines, wrapped in a zlib stream of stored blocks with its Adler-32 (the
 *         filters, bit depths, palette lookups and size checks behind a valid stream).
 * Each is decoded with a pixel limit of 2^16 (larger images must fail with a clear error, not
 * allocate).  Whatever decodes must be width x height RGB pixels within the limit, every byte
 * of them read, and it goes through the patch grid and the resize into patches (the sanitizers
 * catch any access outside the pixels or the patches).  Built by tests/image/CMakeLists.txt
 * with clang and -DAGENTRL_FUZZ=ON:
 *   build-fuzz/tests/image/fuzz_image -max_total_time=60 CORPUS_DIR
 * scripts/test.sh seeds the corpus with tests/image/fixtures/ (PNG files of every colour type).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/crc32.h"
#include "core/inflate.h"
#include "policy/image.h"

#define FUZZ_MAX_PIXELS (1 << 16)

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* Rewrite the CRC of every whole chunk of the PNG in b[0..n). */
static void crc_fix(uint8_t *b, size_t n) {
    if (n < 8 || memcmp(b, png_sig, 8)) return;
    for (size_t pos = 8; pos + 12 <= n;) {
        uint32_t len = get32(b + pos);
        if (len > n - pos - 12) return;
        put32(b + pos + 8 + len, arl_crc32(b + pos + 4, (size_t)len + 4));
        pos += (size_t)len + 12;
    }
}

/* Append a chunk of type with len bytes of body at *o (CRC included). */
static uint8_t *chunk(uint8_t *o, const char *type, const uint8_t *body, size_t len) {
    put32(o, (uint32_t)len);
    memcpy(o + 4, type, 4);
    if (len) memcpy(o + 8, body, len);
    put32(o + 8 + len, arl_crc32(o + 4, len + 4));
    return o + 12 + len;
}

/* The PNG described by d[0..n): d[0] width - 1 (mod 64), d[1] height - 1 (mod 64), d[2] the
 * (colour type, depth) pair, d[3] palette entries (0: no PLTE), then the palette's bytes, then
 * the scanlines (each a filter byte and its row; too few or too many is the decoder's to
 * reject).  *out malloc'ed, *outn its size. */
static void png_build(const uint8_t *d, size_t n, uint8_t **out, size_t *outn) {
    static const uint8_t kinds[][2] = {{0, 1}, {0, 2}, {0, 4},  {0, 8}, {0, 16}, {3, 1}, {3, 2},
                                       {3, 4}, {3, 8}, {2, 8},  {2, 16}, {4, 8}, {4, 16}, {6, 8},
                                       {6, 16}, {5, 8}, {2, 4}}; /* the last two are invalid */
    uint8_t hdr[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < 4 && i < n; i++)
        hdr[i] = d[i];
    size_t used = n < 4 ? n : 4;
    uint8_t ihdr[13] = {0};
    put32(ihdr, 1u + hdr[0] % 64);
    put32(ihdr + 4, 1u + hdr[1] % 64);
    const uint8_t *k = kinds[hdr[2] % (sizeof kinds / sizeof kinds[0])];
    ihdr[8] = k[1];
    ihdr[9] = k[0];
    size_t npal = hdr[3];
    size_t pal_len = 3 * npal < n - used ? 3 * npal : n - used;
    const uint8_t *pal = d + used;
    used += pal_len;
    const uint8_t *raw = d + used;
    size_t raw_len = n - used;
    /* zlib: header, stored blocks of at most 65535 bytes, Adler-32 */
    size_t nblocks = raw_len / 65535 + 1;
    size_t z_len = 2 + raw_len + 5 * nblocks + 4;
    *out = malloc(8 + 25 + (12 + pal_len) + (12 + z_len) + 12);
    ARL_ASSERT(*out);
    uint8_t *z = malloc(z_len);
    ARL_ASSERT(z);
    uint8_t *zp = z;
    *zp++ = 0x78;
    *zp++ = 0x01;
    for (size_t off = 0, left = raw_len;; ) {
        size_t m = left < 65535 ? left : 65535;
        *zp++ = left == m ? 1 : 0; /* BFINAL on the last; BTYPE 00 */
        *zp++ = (uint8_t)m;
        *zp++ = (uint8_t)(m >> 8);
        *zp++ = (uint8_t)~m;
        *zp++ = (uint8_t)(~m >> 8);
        memcpy(zp, raw + off, m);
        zp += m;
        off += m;
        left -= m;
        if (!left) break;
    }
    put32(zp, arl_adler32(1, raw, raw_len));
    zp += 4;
    uint8_t *o = *out;
    memcpy(o, png_sig, 8);
    o = chunk(o + 8, "IHDR", ihdr, 13);
    if (npal) o = chunk(o, "PLTE", pal, pal_len);
    o = chunk(o, "IDAT", z, (size_t)(zp - z));
    o = chunk(o, "IEND", NULL, 0);
    *outn = (size_t)(o - *out);
    free(z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t *buf;
    size_t n;
    if (data[0] & 1) {
        png_build(data + 1, size - 1, &buf, &n);
    } else {
        n = size - 1;
        buf = malloc(n ? n : 1);
        ARL_ASSERT(buf);
        memcpy(buf, data + 1, n);
        crc_fix(buf, n);
    }
    arl_image img;
    arl_status s = arl_image_decode(buf, n, FUZZ_MAX_PIXELS, "fuzz", &img);
    free(buf);
    if (s != ARL_OK) {
        ARL_ASSERT(!img.rgb && img.width == 0 && img.height == 0);
        return 0;
    }
    ARL_ASSERT(img.rgb && img.width > 0 && img.height > 0);
    ARL_ASSERT((int64_t)img.width * img.height <= FUZZ_MAX_PIXELS);
    /* every pixel byte is read (a buffer shorter than width x height x 3 shows under
     * AddressSanitizer); the volatile sum keeps the loop */
    volatile unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img.width * img.height * 3; i++)
        sum += img.rgb[i];
    (void)sum;
    /* the patch grid of the vision tower (patch 14, at most 64 patches) and the resize */
    int32_t gh, gw;
    ARL_ASSERT(arl_image_grid(img.width, img.height, 14, 64, &gh, &gw) == ARL_OK);
    ARL_ASSERT(gh >= 2 && gw >= 2 && gh % 2 == 0 && gw % 2 == 0 && (int64_t)gh * gw <= 64);
    float *p = malloc((size_t)gh * gw * 3 * 14 * 14 * sizeof *p);
    ARL_ASSERT(p);
    arl_image_patchify(&img, 14, gh, gw, p);
    free(p);
    arl_image_free(&img);
    return 0;
}
