/* SHA-256 against the FIPS 180-4 / NIST example vectors, incremental == one-shot. */
#include "core/sha256.h"
#include "tests/test.h"

static void hex_of(const void *data, size_t n, char hex[ARL_SHA256_HEX_CHARS]) {
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256(data, n, d);
    arl_sha256_hex(d, hex);
}

static void test_known_vectors(void) {
    char h[ARL_SHA256_HEX_CHARS];
    hex_of("", 0, h);
    CHECK_STR_EQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, h);
    CHECK_STR_EQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m448, strlen(m448), h);
    CHECK_STR_EQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjkl"
                       "mnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    hex_of(m896, strlen(m896), h);
    CHECK_STR_EQ(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    /* one million 'a', fed in uneven pieces */
    static char a[1000000];
    memset(a, 'a', sizeof a);
    arl_sha256_ctx s;
    arl_sha256_init(&s);
    size_t off = 0, step = 1;
    while (off < sizeof a) {
        size_t n = step < sizeof a - off ? step : sizeof a - off;
        arl_sha256_update(&s, a + off, n);
        off += n;
        step = step * 3 + 1;
        if (step > 100000) step = 7;
    }
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256_final(&s, d);
    arl_sha256_hex(d, h);
    CHECK_STR_EQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Every length 0..200 across the 55/56/64-byte padding boundaries: incremental (byte by
 * byte) equals one-shot, and lengths give distinct digests. */
static void test_incremental_boundaries(void) {
    uint8_t buf[200];
    for (int i = 0; i < 200; i++)
        buf[i] = (uint8_t)(i * 7 + 1);
    uint8_t prev[ARL_SHA256_BYTES] = {0};
    for (size_t n = 0; n <= 200; n++) {
        uint8_t a[ARL_SHA256_BYTES], b[ARL_SHA256_BYTES];
        arl_sha256(buf, n, a);
        arl_sha256_ctx s;
        arl_sha256_init(&s);
        for (size_t i = 0; i < n; i++)
            arl_sha256_update(&s, buf + i, 1);
        arl_sha256_final(&s, b);
        CHECK_MSG(!memcmp(a, b, sizeof a), "length %zu", n);
        CHECK(memcmp(a, prev, sizeof a) != 0);
        memcpy(prev, a, sizeof a);
    }
}

int main(void) {
    TEST_RUN(test_known_vectors);
    TEST_RUN(test_incremental_boundaries);
    return test_finish();
}
