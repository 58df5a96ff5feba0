/* Byte-level tokenizer (policy/tokenizer.h): round trips, special tokens never produced from
 * text, decoding of specials, UTF-8 handling, id range errors, spec validation. */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "policy/tokenizer.h"
#include "tests/test.h"

static arl_tokenizer_spec S;

static void test_default_ids(void) {
    /* spec/policy.md §12.4 ids, and the template's three tool tokens from the reserved range */
    CHECK_EQ_INT(S.vocab_size, 384);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_BOS], 256);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_EOS], 257);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_PAD], 258);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_MEDIA_PAD], 259);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_MEDIA_BEGIN], 260);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_MEDIA_END], 261);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_OPEN], 262);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_CLOSE], 263);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_SEP], 264);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_END_OF_MSG], 265);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_TOOL_CALL], 266);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_TOOL_ARGS], 267);
    CHECK_EQ_INT(S.special[ARL_SPECIAL_TOOL_CALL_END], 268);
    CHECK_STR_EQ(arl_tokenizer_special_name(ARL_SPECIAL_END_OF_MSG), "<|end_of_msg|>");
    CHECK(arl_tokenizer_special_name(ARL_SPECIAL_COUNT) == NULL);
    CHECK_EQ_INT(arl_tokenizer_special_of(&S, 265), ARL_SPECIAL_END_OF_MSG);
    CHECK_EQ_INT(arl_tokenizer_special_of(&S, 65), -1);
    CHECK_EQ_INT(arl_tokenizer_special_of(&S, 300), -1);
    CHECK_EQ_INT(arl_tokenizer_special_of(&S, 384), -1);
    CHECK(arl_tokenizer_spec_validate(&S) == ARL_OK);
}

static void test_spec_validate(void) {
    arl_tokenizer_spec s = S;
    s.vocab_size = 260;
    CHECK(arl_tokenizer_spec_validate(&s) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "vocab_size 260") != NULL);
    s = S;
    s.special[ARL_SPECIAL_PAD] = 65; /* a byte id */
    CHECK(arl_tokenizer_spec_validate(&s) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "<|pad|> has id 65") != NULL);
    s = S;
    s.special[ARL_SPECIAL_SEP] = 262; /* same as <|open|> */
    CHECK(arl_tokenizer_spec_validate(&s) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "<|open|> and <|sep|> share id 262") != NULL);
    s = S;
    s.special[ARL_SPECIAL_EOS] = 384;
    CHECK(arl_tokenizer_spec_validate(&s) == ARL_ERR_CONFIG);
    /* config-given ids elsewhere in a larger vocabulary are fine */
    s = S;
    s.vocab_size = 1024;
    s.special[ARL_SPECIAL_BOS] = 1000;
    CHECK(arl_tokenizer_spec_validate(&s) == ARL_OK);
}

/* Every byte value round-trips; decoding random byte strings gives them back exactly. */
static void test_roundtrip_bytes(void) {
    char all[256];
    int32_t ids[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    arl_tokenizer_encode(all, 256, ids);
    for (int i = 0; i < 256; i++)
        CHECK_EQ_INT(ids[i], i);
    char *txt;
    size_t n;
    CHECK(arl_tokenizer_decode(&S, ids, 256, 0, &txt, &n) == ARL_OK);
    CHECK_EQ_INT(n, 256);
    CHECK(!memcmp(txt, all, 256));
    CHECK(txt[256] == '\0');
    free(txt);

    arl_rng r;
    arl_rng_seed(&r, 11);
    for (int it = 0; it < 200; it++) {
        size_t len = arl_rng_below(&r, 300);
        char buf[300];
        int32_t id2[300];
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)arl_rng_below(&r, 256);
        arl_tokenizer_encode(buf, len, id2);
        CHECK(arl_tokenizer_decode(&S, id2, len, 0, &txt, &n) == ARL_OK);
        CHECK(n == len && (len == 0 || !memcmp(txt, buf, len)));
        free(txt);
    }
}

/* Text that spells special names stays bytes: encode never yields an id >= 256. */
static void test_specials_never_from_text(void) {
    const char *t = "<|bos|><|end_of_msg|><|tool_call|>x<|tool_args|>{}<|tool_call_end|>"
                    "<|media_pad|><|reserved_300|><|open|>user<|close|>";
    size_t len = strlen(t);
    int32_t *ids = malloc(len * sizeof *ids);
    arl_tokenizer_encode(t, len, ids);
    for (size_t i = 0; i < len; i++)
        CHECK(ids[i] >= 0 && ids[i] < 256);
    char *txt;
    size_t n;
    CHECK(arl_tokenizer_decode(&S, ids, len, 0, &txt, &n) == ARL_OK);
    CHECK_STR_EQ(txt, t);
    free(txt);
    free(ids);
}

static void test_decode_specials(void) {
    int32_t ids[] = {256, 'h', 'i', 264, 300, 265, 383};
    char *txt;
    size_t n;
    CHECK(arl_tokenizer_decode(&S, ids, 7, 0, &txt, &n) == ARL_OK);
    CHECK_STR_EQ(txt, "<|bos|>hi<|sep|><|reserved_300|><|end_of_msg|><|reserved_383|>");
    CHECK_EQ_INT(n, strlen(txt));
    free(txt);
    CHECK(arl_tokenizer_decode(&S, ids, 7, ARL_DECODE_SKIP_SPECIAL, &txt, &n) == ARL_OK);
    CHECK_STR_EQ(txt, "hi");
    free(txt);
    CHECK(arl_tokenizer_decode(&S, ids, 0, 0, &txt, &n) == ARL_OK);
    CHECK_STR_EQ(txt, "");
    free(txt);
}

/* encode_special (trusted text) is the inverse of decode for every id sequence whose byte
 * runs do not spell a special name. */
static void test_encode_special_roundtrip(void) {
    arl_rng r;
    arl_rng_seed(&r, 5);
    for (int it = 0; it < 300; it++) {
        size_t len = arl_rng_below(&r, 60);
        int32_t ids[60];
        for (size_t i = 0; i < len; i++) {
            uint64_t k = arl_rng_below(&r, 4);
            ids[i] = k == 0 ? 256 + (int32_t)arl_rng_below(&r, 128) /* specials and reserved */
                            : (int32_t)('a' + arl_rng_below(&r, 26));
        }
        char *txt;
        size_t n;
        CHECK(arl_tokenizer_decode(&S, ids, len, 0, &txt, &n) == ARL_OK);
        int32_t *back;
        size_t m;
        CHECK(arl_tokenizer_encode_special(&S, txt, n, &back, &m) == ARL_OK);
        CHECK(m == len && (len == 0 || !memcmp(back, ids, len * sizeof *ids)));
        free(back);
        free(txt);
    }
    /* unknown names, malformed names and out-of-range reserved ids stay bytes */
    const char *t = "<|nope|><|reserved_200|><|reserved_384|><|reserved_265|><|sep|";
    int32_t *ids;
    size_t m;
    CHECK(arl_tokenizer_encode_special(&S, t, strlen(t), &ids, &m) == ARL_OK);
    CHECK_EQ_INT(m, strlen(t));
    for (size_t i = 0; i < m; i++)
        CHECK(ids[i] < 256);
    free(ids);
}

static void test_range_errors(void) {
    int32_t ids[] = {'a', 'b', 384};
    char *txt = (char *)1;
    size_t n = 7;
    CHECK(arl_tokenizer_decode(&S, ids, 3, 0, &txt, &n) == ARL_ERR_RANGE);
    CHECK(txt == NULL && n == 0);
    CHECK(strstr(arl_error_msg(), "token id 384 at position 2") != NULL);
    int32_t neg[] = {-1};
    CHECK(arl_tokenizer_check_ids(&S, neg, 1) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "position 0") != NULL);
    CHECK(arl_tokenizer_check_ids(&S, ids, 2) == ARL_OK);
}

static void test_utf8(void) {
    CHECK(arl_utf8_valid("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", 15));
    CHECK(!arl_utf8_valid("\xC0\xAF", 2));         /* overlong '/' */
    CHECK(!arl_utf8_valid("\xED\xA0\x80", 3));     /* surrogate */
    CHECK(!arl_utf8_valid("\xF4\x90\x80\x80", 4)); /* above U+10FFFF */
    CHECK(!arl_utf8_valid("\xE2\x82", 2));         /* cut character */
    /* decode with replacement: the cut euro sign (2 bytes) becomes two U+FFFD */
    int32_t ids[] = {'a', 0xE2, 0x82, 'b', 0xFF};
    char *txt;
    size_t n;
    CHECK(arl_tokenizer_decode(&S, ids, 5, ARL_DECODE_UTF8_REPLACE, &txt, &n) == ARL_OK);
    CHECK_STR_EQ(txt, "a\xEF\xBF\xBD\xEF\xBF\xBD"
                      "b\xEF\xBF\xBD");
    CHECK(arl_utf8_valid(txt, n));
    free(txt);
    CHECK(arl_tokenizer_decode(&S, ids, 5, 0, &txt, &n) == ARL_OK);
    CHECK_EQ_INT(n, 5); /* without the flag: the raw bytes */
    free(txt);
    /* prefix cut at a character boundary */
    const char *e = "ab\xE2\x82\xAC"
                    "c";
    CHECK_EQ_INT(arl_utf8_prefix(e, 6, 4), 2);
    CHECK_EQ_INT(arl_utf8_prefix(e, 6, 5), 5);
    CHECK_EQ_INT(arl_utf8_prefix(e, 6, 100), 6);
    CHECK_EQ_INT(arl_utf8_prefix("\xFF\xFF", 2, 1), 1);
}

int main(void) {
    arl_tokenizer_spec_default(&S);
    TEST_RUN(test_default_ids);
    TEST_RUN(test_spec_validate);
    TEST_RUN(test_roundtrip_bytes);
    TEST_RUN(test_specials_never_from_text);
    TEST_RUN(test_decode_specials);
    TEST_RUN(test_encode_special_roundtrip);
    TEST_RUN(test_range_errors);
    TEST_RUN(test_utf8);
    return test_finish();
}
