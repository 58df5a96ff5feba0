/* Tensor blobs (core/blob.h, spec/replay.md section 5) and CRC-32 (core/crc32.h): known
 * vectors, the fast path against the table path, header layout, and every rejection a reader
 * must make (magic, versions, CRCs, flags, codec, length, kind/dtype/shape). */
#include <stdint.h>
#include <string.h>

#include "core/blob.h"
#include "core/crc32.h"
#include "core/rng.h"
#include "tests/test.h"

static void test_crc32_vectors(void) {
    /* The standard check value of CRC-32/ISO-HDLC, and values zlib.crc32 gives. */
    CHECK_EQ_INT(arl_crc32("123456789", 9), 0xCBF43926u);
    CHECK_EQ_INT(arl_crc32("", 0), 0);
    CHECK_EQ_INT(arl_crc32("a", 1), 0xE8B7BE43u);
    static uint8_t zeros[4096];
    CHECK_EQ_INT(arl_crc32(zeros, sizeof zeros), 0xC71C0011u); /* zlib.crc32(bytes(4096)) */
}

static void test_crc32_fast_equals_portable(void) {
    static uint8_t buf[70000];
    arl_rng r;
    arl_rng_seed(&r, 7);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)arl_rng_next(&r);
    int bad = 0;
    /* every length up to 600 at three alignments, then long ones: exercises the 64-byte fold,
     * the 16-byte tail fold and the table tail */
    for (size_t n = 0; n < 600; n++)
        for (size_t off = 0; off < 3; off++)
            if (arl_crc32(buf + off, n) != arl_crc32_update_portable(0, buf + off, n)) bad++;
    for (size_t n = 60000; n < 60100; n++)
        if (arl_crc32(buf + 1, n) != arl_crc32_update_portable(0, buf + 1, n)) bad++;
    CHECK_EQ_INT(bad, 0);
    /* copy-and-CRC: same CRC, same bytes, any length and alignment */
    static uint8_t dst[70000];
    bad = 0;
    for (size_t n = 0; n < 300; n++)
        for (size_t off = 0; off < 3; off++) {
            memset(dst, 0xEE, n + 8);
            uint32_t c = arl_crc32_copy(dst + 1, buf + off, n, 0);
            if (c != arl_crc32_update_portable(0, buf + off, n) || memcmp(dst + 1, buf + off, n) ||
                dst[0] != 0xEE || dst[n + 1] != 0xEE)
                bad++;
        }
    if (arl_crc32_copy(dst, buf + 3, 65537, 0) != arl_crc32(buf + 3, 65537) ||
        memcmp(dst, buf + 3, 65537))
        bad++;
    CHECK_EQ_INT(bad, 0);
    /* chaining */
    uint32_t c = arl_crc32_update(arl_crc32(buf, 1000), buf + 1000, 50000);
    CHECK_EQ_INT(c, arl_crc32(buf, 51000));
}

static void test_header_layout(void) {
    uint32_t tok[3] = {1, 2, 0xFFFFFFFFu};
    uint8_t out[64 + 12];
    size_t len;
    uint64_t dims[1] = {3};
    CHECK(arl_blob_encode(ARL_BLOB_TOKENS, ARL_BLOB_U32, 1, dims, tok, out, sizeof out, &len) ==
          ARL_OK);
    CHECK_EQ_INT(len, 76);
    CHECK(!memcmp(out, "ARLB", 4));
    CHECK_EQ_INT(out[4] | out[5] << 8, 1);  /* format_version */
    CHECK_EQ_INT(out[6] | out[7] << 8, 64); /* header_size */
    CHECK_EQ_INT(out[8] | out[9] << 8, 1);  /* kind TOKENS */
    CHECK_EQ_INT(out[10], 0x03);            /* u32 */
    CHECK_EQ_INT(out[11], 0);               /* codec raw */
    CHECK_EQ_INT(out[12], 1);               /* ndim */
    CHECK_EQ_INT(out[16], 3);               /* dims[0] */
    CHECK_EQ_INT(out[48], 12);              /* payload_nbytes */
    uint32_t pc = out[56] | out[57] << 8 | out[58] << 16 | (uint32_t)out[59] << 24;
    uint32_t hc = out[60] | out[61] << 8 | out[62] << 16 | (uint32_t)out[63] << 24;
    CHECK_EQ_INT(pc, arl_crc32(tok, 12));
    CHECK_EQ_INT(hc, arl_crc32(out, 60));
    CHECK(!memcmp(out + 64, tok, 12));
    arl_blob_header h;
    const void *pl;
    arl_blob_expect ex = {.kind = ARL_BLOB_TOKENS, .dims_mask = 1, .dims = {3}};
    CHECK(arl_blob_check(out, len, &ex, &h, &pl) == ARL_OK);
    CHECK(pl == out + 64);
    uint32_t back[3] = {0};
    CHECK(arl_blob_check_copy(out, len, &ex, &h, back, sizeof back) == ARL_OK);
    CHECK(!memcmp(back, tok, 12));
    CHECK(arl_blob_check_copy(out, len, &ex, &h, back, 8) == ARL_ERR_RANGE);
    out[64] ^= 1;
    CHECK(arl_blob_check_copy(out, len, &ex, &h, back, sizeof back) == ARL_ERR_CORRUPT);
    out[64] ^= 1;
    CHECK_EQ_INT(h.dims[0], 3);
    /* too small a buffer */
    CHECK(arl_blob_encode(ARL_BLOB_TOKENS, ARL_BLOB_U32, 1, dims, tok, out, 70, &len) ==
          ARL_ERR_RANGE);
    /* kind/dtype/rank agreement at encode */
    CHECK(arl_blob_encode(ARL_BLOB_TOKENS, ARL_BLOB_F32, 1, dims, tok, out, sizeof out, &len) ==
          ARL_ERR_ARG);
    CHECK(arl_blob_encode(ARL_BLOB_ROUTES, ARL_BLOB_U8, 1, dims, tok, out, sizeof out, &len) ==
          ARL_ERR_ARG);
}

/* State blobs in fp32 and bf16 (MLA latent rows), the shapes the policy exports. */
static void test_state_blobs(void) {
    float s[2 * 4 * 4];
    for (int i = 0; i < 32; i++)
        s[i] = (float)i * 0.5f;
    uint8_t buf[64 + sizeof s];
    size_t len;
    uint64_t d3[3] = {2, 4, 4};
    CHECK(arl_blob_encode(ARL_BLOB_KDA_STATE, ARL_BLOB_F32, 3, d3, s, buf, sizeof buf, &len) ==
          ARL_OK);
    arl_blob_header h;
    arl_blob_expect ex = {.kind = ARL_BLOB_KDA_STATE, .dims_mask = 7, .dims = {2, 4, 4}};
    CHECK(arl_blob_check(buf, len, &ex, &h, NULL) == ARL_OK);
    ex.dims[2] = 5;
    CHECK(arl_blob_check(buf, len, &ex, &h, NULL) == ARL_ERR_SHAPE);
    CHECK(strstr(arl_error_msg(), "dims[2]") != NULL);
    uint16_t lat[3 * 8] = {0x3F80};
    uint64_t d2[2] = {3, 8};
    uint8_t b2[64 + sizeof lat];
    CHECK(arl_blob_encode(ARL_BLOB_MLA_LATENT, ARL_BLOB_BF16, 2, d2, lat, b2, sizeof b2, &len) ==
          ARL_OK);
    arl_blob_expect el = {.kind = ARL_BLOB_MLA_LATENT};
    CHECK(arl_blob_check(b2, len, &el, &h, NULL) == ARL_OK);
    CHECK_EQ_INT(h.dtype, ARL_BLOB_BF16);
    el.dtype = ARL_BLOB_F32; /* a reader that needs f32 rows */
    CHECK(arl_blob_check(b2, len, &el, &h, NULL) == ARL_ERR_SHAPE);
}

/* Each header field a reader must check, corrupted once (with the header CRC fixed up where
 * needed so the targeted check is the one that fires). */
static void fix_hcrc(uint8_t *b) {
    uint32_t c = arl_crc32(b, 60);
    for (int i = 0; i < 4; i++)
        b[60 + i] = (uint8_t)(c >> (8 * i));
}

static void test_rejections(void) {
    float lp[4] = {-1.0f, 0.0f, -0.5f, -2.0f};
    uint8_t good[64 + 16], b[64 + 16 + 4];
    size_t len;
    uint64_t dims[1] = {4};
    CHECK(arl_blob_encode(ARL_BLOB_LOGPROBS, ARL_BLOB_F32, 1, dims, lp, good, sizeof good, &len) ==
          ARL_OK);
    arl_blob_header h;
    arl_blob_expect ex = {.kind = ARL_BLOB_LOGPROBS, .dims_mask = 1, .dims = {4}};
#define REJECT(mutate, want_status, needle)                                                        \
    do {                                                                                           \
        memcpy(b, good, len);                                                                      \
        size_t bl = len;                                                                           \
        mutate;                                                                                    \
        arl_status s_ = arl_blob_check(b, bl, &ex, &h, NULL);                                      \
        CHECK_MSG(s_ == (want_status), "%s: got %s (%s)", #mutate, arl_status_str(s_),             \
                  arl_error_msg());                                                                \
        CHECK_MSG(strstr(arl_error_msg(), needle) != NULL, "%s: message '%s' lacks '%s'", #mutate, \
                  arl_error_msg(), needle);                                                        \
    } while (0)
    REJECT(b[0] = 'X', ARL_ERR_CORRUPT, "magic");
    REJECT(b[20] ^= 1, ARL_ERR_CORRUPT, "header CRC");
    REJECT((b[4] = 2, fix_hcrc(b)), ARL_ERR_VERSION, "format version 2");
    REJECT((b[6] = 65, fix_hcrc(b)), ARL_ERR_CORRUPT, "header_size");
    REJECT((b[13] = 1, fix_hcrc(b)), ARL_ERR_CORRUPT, "flags");
    /* codec 1 whose payload is not a zlib stream (test_replay_deflate tests real ones) */
    REJECT((b[11] = 1, fix_hcrc(b)), ARL_ERR_CORRUPT, "codec 1");
    REJECT((b[11] = 7, fix_hcrc(b)), ARL_ERR_CORRUPT, "codec");
    REJECT((b[10] = 0x20, fix_hcrc(b)), ARL_ERR_CORRUPT, "dtype");
    REJECT((b[12] = 5, fix_hcrc(b)), ARL_ERR_CORRUPT, "ndim");
    REJECT((b[24] = 1, fix_hcrc(b)), ARL_ERR_CORRUPT, "beyond ndim");
    REJECT((b[16] = 5, fix_hcrc(b)), ARL_ERR_CORRUPT, "implied by its shape");
    REJECT(bl = len - 1, ARL_ERR_CORRUPT, "truncated");
    REJECT(bl = 10, ARL_ERR_CORRUPT, "shorter than");
    REJECT(b[70] ^= 0x40, ARL_ERR_CORRUPT, "payload CRC");
    REJECT((b[8] = 33, fix_hcrc(b)), ARL_ERR_SHAPE, "kind REF_LOGPROBS");
    ex.dims[0] = 5;
    REJECT((void)0, ARL_ERR_SHAPE, "expected 5");
    /* NULL blob (a NULL column) */
    CHECK(arl_blob_parse(NULL, 0, &h, NULL) == ARL_ERR_CORRUPT);
}

int main(void) {
    TEST_RUN(test_crc32_vectors);
    TEST_RUN(test_crc32_fast_equals_portable);
    TEST_RUN(test_header_layout);
    TEST_RUN(test_state_blobs);
    TEST_RUN(test_rejections);
    return test_finish();
}
