/* The streaming UTF-8 decoder of `agentrl generate` (policy/tokenizer.h arl_utf8_stream): a
 * character cut between pieces (tokens) is held back until it completes, 2-, 3- and 4-byte
 * characters pass whole, invalid bytes and a character cut by the end become U+FFFD, and the
 * output is always valid UTF-8 and equal to arl_tokenizer_decode(ARL_DECODE_UTF8_REPLACE) of the
 * whole text however it is cut (every cut of short texts, random cuts of random bytes). */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "policy/tokenizer.h"
#include "tests/test.h"

#define FFFD "\xEF\xBF\xBD"

/* Stream text[0..len) in pieces of the lengths cuts[0..n_cuts) (then the rest), then end it.
 * The output is in out (cap bytes), its length returned; after_piece[i] the length of the
 * output after piece i (NULL: not wanted). */
static size_t stream(const char *text, size_t len, const size_t *cuts, size_t n_cuts, char *out,
                     size_t cap, size_t *after_piece) {
    arl_utf8_stream u;
    memset(&u, 0, sizeof u);
    size_t o = 0, at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        const size_t k = i < n_cuts ? cuts[i] : len - at;
        ARL_ASSERT(o + ARL_UTF8_STREAM_OUT(k) <= cap);
        o += arl_utf8_stream_put(&u, text + at, k, out + o);
        at += k;
        if (after_piece) after_piece[i] = o;
    }
    ARL_ASSERT(o + ARL_UTF8_STREAM_OUT(0) <= cap);
    o += arl_utf8_stream_end(&u, out + o);
    CHECK_EQ_INT(u.n_held, 0);
    return o;
}

/* The text of arl_tokenizer_decode with ARL_DECODE_UTF8_REPLACE of bytes text[0..len). */
static char *whole(const char *text, size_t len, size_t *n) {
    arl_tokenizer_spec s;
    arl_tokenizer_spec_default(&s);
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    ARL_ASSERT(ids);
    arl_tokenizer_encode(text, len, ids);
    char *out = NULL;
    CHECK(arl_tokenizer_decode(&s, ids, len, ARL_DECODE_UTF8_REPLACE, &out, n) == ARL_OK);
    free(ids);
    return out;
}

#define CHECK_OUT(got, n, want)                                                                    \
    CHECK_MSG((n) == sizeof(want) - 1 && !memcmp((got), (want), (n)), "got %zu bytes '%.*s'", (n), \
              (int)(n), (got))

static void test_cut_characters_held(void) {
    char out[256];
    size_t after[8];
    /* "é" (C3 A9) cut after its first byte: nothing of it until the second */
    const size_t c1[] = {2, 1};
    size_t n = stream("a\xC3\xA9z", 4, c1, 2, out, sizeof out, after);
    CHECK_EQ_INT(after[0], 1); /* "a", C3 held */
    CHECK_EQ_INT(after[1], 3); /* "é" */
    CHECK_OUT(out, n, "a\xC3\xA9z");
    /* "€" (E2 82 AC) one byte a token */
    const size_t c2[] = {1, 1, 1};
    n = stream("\xE2\x82\xAC", 3, c2, 3, out, sizeof out, after);
    CHECK_EQ_INT(after[0], 0);
    CHECK_EQ_INT(after[1], 0);
    CHECK_EQ_INT(after[2], 3);
    CHECK_OUT(out, n, "\xE2\x82\xAC");
    /* 4-byte "😀" (F0 9F 98 80) and U+10FFFF (F4 8F BF BF), byte by byte and 3 + 1 */
    const size_t c3[] = {1, 1, 1, 1, 3};
    n = stream("\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF", 8, c3, 5, out, sizeof out, after);
    CHECK_EQ_INT(after[2], 0);
    CHECK_EQ_INT(after[3], 4);
    CHECK_EQ_INT(after[4], 4);
    CHECK_OUT(out, n, "\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF");
}

static void test_incomplete_at_end(void) {
    char out[256];
    /* a reply ended by --max-tokens inside a character: U+FFFD per byte held, as
     * arl_tokenizer_decode of the whole has it */
    size_t n = stream("ok\xE2\x82", 4, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, "ok" FFFD FFFD);
    n = stream("\xF0\x9F\x98", 3, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD FFFD FFFD);
    n = stream("\xC3", 1, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD);
    /* a special token's name (ASCII) after a cut character ends it */
    n = stream("\xE2\x82<|sep|>", 9, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD FFFD "<|sep|>");
}

static void test_invalid_bytes(void) {
    char out[256];
    size_t after[4];
    /* bytes that start no character pass at once as U+FFFD: a lone continuation byte, C0/C1,
     * F5..FF, an overlong E0 80, a surrogate ED A0, above U+10FFFF F4 90 */
    const size_t c1[] = {1, 1, 1};
    size_t n = stream("\x80\xC0\xFF", 3, c1, 3, out, sizeof out, after);
    CHECK_EQ_INT(after[0], 3);
    CHECK_EQ_INT(after[1], 6);
    CHECK_EQ_INT(after[2], 9);
    CHECK_OUT(out, n, FFFD FFFD FFFD);
    const size_t c2[] = {2};
    n = stream("\xE0\x80x", 3, c2, 1, out, sizeof out, after);
    CHECK_EQ_INT(after[0], 6); /* E0 80 can be no character: not held */
    CHECK_OUT(out, n, FFFD FFFD "x");
    n = stream("\xED\xA0\x80", 3, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD FFFD FFFD);
    n = stream("\xF4\x90\x80\x80", 4, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD FFFD FFFD FFFD);
    /* a character cut by a byte that cannot go on: the cut bytes U+FFFD, the rest decoded */
    n = stream("\xE2\x82\xC3\xA9", 4, NULL, 0, out, sizeof out, NULL);
    CHECK_OUT(out, n, FFFD FFFD "\xC3\xA9");
    n = stream("\xF0\x9F\x98\x41", 4, NULL, 0, out, sizeof out, NULL); /* (0x41: A) */
    CHECK_OUT(out, n, FFFD FFFD FFFD "A");
}

/* Every way to cut each text in two and in three gives the whole's decode (valid UTF-8). */
static void test_every_cut(void) {
    static const char *const texts[] = {
        "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z",
        "\xE2\x82\xF0\x9F\x98\xC3",
        "\xED\xA0\x80\xEF\xBF\xBD",
        "\xC2\x80\xDF\xBF\xE0\xA0\x80\xF0\x90\x80\x80\xF4\x8F\xBF\xBF",
        "\xFF\xFE\x80\xBF\xC1\xBF",
    };
    char out[512];
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        const size_t len = strlen(texts[t]);
        size_t wn;
        char *want = whole(texts[t], len, &wn);
        CHECK(want && arl_utf8_valid(want, wn));
        for (size_t i = 0; i <= len; i++)
            for (size_t j = i; j <= len; j++) {
                const size_t cuts[2] = {i, j - i};
                const size_t n = stream(texts[t], len, cuts, 2, out, sizeof out, NULL);
                CHECK_MSG(n == wn && !memcmp(out, want, n), "text %zu cut at %zu and %zu", t, i, j);
            }
        free(want);
    }
}

/* Random bytes (most of them from the UTF-8 lead and continuation ranges, so that characters
 * and near-characters are common) cut at random: the whole's decode, valid UTF-8. */
static void test_random(void) {
    arl_rng r;
    arl_rng_seed(&r, 7);
    enum { LEN = 64, PIECES = 12 };
    char text[LEN], out[ARL_UTF8_STREAM_OUT(LEN) * 2];
    for (int it = 0; it < 2000; it++) {
        for (size_t i = 0; i < LEN; i++) {
            const uint32_t x = (uint32_t)arl_rng_next(&r);
            text[i] = (char)(x % 4 == 0   ? 0x61 + x / 4 % 26
                             : x % 4 == 1 ? 0xC0 + x / 4 % 0x38
                                          : 0x80 + x / 4 % 0x40);
        }
        size_t cuts[PIECES], left = LEN;
        for (size_t i = 0; i < PIECES; i++) {
            cuts[i] = (size_t)(arl_rng_next(&r) % (left + 1 < 9 ? left + 1 : 9));
            left -= cuts[i];
        }
        size_t wn;
        char *want = whole(text, LEN, &wn);
        const size_t n = stream(text, LEN, cuts, PIECES, out, sizeof out, NULL);
        CHECK_MSG(n == wn && !memcmp(out, want, n), "random text %d", it);
        CHECK(arl_utf8_valid(out, n));
        free(want);
    }
}

int main(void) {
    TEST_RUN(test_cut_characters_held);
    TEST_RUN(test_incomplete_at_end);
    TEST_RUN(test_invalid_bytes);
    TEST_RUN(test_every_cut);
    TEST_RUN(test_random);
    return test_finish();
}
