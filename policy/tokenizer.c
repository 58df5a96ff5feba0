/* policy/tokenizer.c: byte-level encode/decode and special-token names (spec/policy.md §12.4).
 * Not the chat template (policy/chat.c). */
#include "policy/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const special_names[ARL_SPECIAL_COUNT] = {
    "<|bos|>",       "<|eos|>",       "<|pad|>",           "<|media_pad|>", "<|media_begin|>",
    "<|media_end|>", "<|open|>",      "<|close|>",         "<|sep|>",       "<|end_of_msg|>",
    "<|tool_call|>", "<|tool_args|>", "<|tool_call_end|>",
};

void arl_tokenizer_spec_default(arl_tokenizer_spec *s) {
    s->vocab_size = 384;
    for (int k = 0; k < ARL_SPECIAL_COUNT; k++)
        s->special[k] = ARL_TOKENIZER_N_BYTES + k;
}

arl_status arl_tokenizer_spec_validate(const arl_tokenizer_spec *s) {
    if (s->vocab_size < ARL_TOKENIZER_N_BYTES + ARL_SPECIAL_COUNT)
        return arl_errorf(ARL_ERR_CONFIG,
                          "tokenizer: vocab_size %d is too small for a byte-level vocabulary "
                          "(need at least %d: 256 bytes and %d special tokens)",
                          s->vocab_size, ARL_TOKENIZER_N_BYTES + ARL_SPECIAL_COUNT,
                          ARL_SPECIAL_COUNT);
    for (int k = 0; k < ARL_SPECIAL_COUNT; k++) {
        int32_t id = s->special[k];
        if (id < ARL_TOKENIZER_N_BYTES || id >= s->vocab_size)
            return arl_errorf(ARL_ERR_CONFIG,
                              "tokenizer: %s has id %d, outside the special range [256, %d) "
                              "(ids 0-255 are bytes)",
                              special_names[k], id, s->vocab_size);
        for (int j = 0; j < k; j++)
            if (s->special[j] == id)
                return arl_errorf(ARL_ERR_CONFIG, "tokenizer: %s and %s share id %d",
                                  special_names[j], special_names[k], id);
    }
    return ARL_OK;
}

const char *arl_tokenizer_special_name(arl_special k) {
    return (int)k >= 0 && k < ARL_SPECIAL_COUNT ? special_names[k] : NULL;
}

int arl_tokenizer_special_of(const arl_tokenizer_spec *s, int32_t id) {
    if (id < ARL_TOKENIZER_N_BYTES || id >= s->vocab_size) return -1;
    for (int k = 0; k < ARL_SPECIAL_COUNT; k++)
        if (s->special[k] == id) return k;
    return -1;
}

arl_status arl_tokenizer_check_ids(const arl_tokenizer_spec *s, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab_size)
            return arl_errorf(ARL_ERR_RANGE,
                              "token id %d at position %zu is outside the vocabulary [0, %d)",
                              ids[i], i, s->vocab_size);
    return ARL_OK;
}

void arl_tokenizer_encode(const char *text, size_t len, int32_t *ids) {
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len; i++)
        ids[i] = p[i];
}

/* If text[0..len) starts with "<|name|>" of a special or reserved id, return its length and
 * set *id; else 0. */
static size_t match_special(const arl_tokenizer_spec *s, const char *text, size_t len,
                            int32_t *id) {
    if (len < 5 || text[0] != '<' || text[1] != '|') return 0;
    for (int k = 0; k < ARL_SPECIAL_COUNT; k++) {
        size_t nl = strlen(special_names[k]);
        if (nl <= len && !memcmp(text, special_names[k], nl)) {
            *id = s->special[k];
            return nl;
        }
    }
    static const char res[] = "<|reserved_";
    size_t rl = sizeof res - 1;
    if (len > rl && !memcmp(text, res, rl)) {
        size_t i = rl;
        long v = 0;
        while (i < len && i < rl + 9 && text[i] >= '0' && text[i] <= '9')
            v = v * 10 + (text[i++] - '0');
        if (i > rl && i + 1 < len && text[i] == '|' && text[i + 1] == '>' && v >= 256 &&
            v < s->vocab_size && arl_tokenizer_special_of(s, (int32_t)v) < 0) {
            *id = (int32_t)v;
            return i + 2;
        }
    }
    return 0;
}

arl_status arl_tokenizer_encode_special(const arl_tokenizer_spec *s, const char *text, size_t len,
                                        int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    int32_t *out = malloc((len ? len : 1) * sizeof *out);
    if (!out) return arl_errorf(ARL_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
    size_t m = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t k = match_special(s, text + i, len - i, &id);
        if (k) {
            out[m++] = id;
            i += k;
        } else {
            out[m++] = (unsigned char)text[i++];
        }
    }
    *ids = out;
    *n = m;
    return ARL_OK;
}

size_t arl_utf8_char_len(const unsigned char *p, size_t len) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0; /* no overlong */
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90; /* no overlong */
        if (c == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else
        return 0;
    if (len < need) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return need;
}

int arl_utf8_valid(const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t k = arl_utf8_char_len(p + i, len - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

size_t arl_utf8_prefix(const char *text, size_t len, size_t max) {
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        size_t k = arl_utf8_char_len(p + i, len - i);
        if (!k) k = 1;
        if (i + k > max) break;
        i += k;
    }
    return i;
}

/* 1 when p[0..n) (n >= 1, arl_utf8_char_len 0 for it) is the start of a valid character that
 * more bytes can complete: a lead byte, then bytes that fit after it.  Positions past the second
 * take any continuation byte, so the test is a completion by 0x80s (a lone lead: C2..F4, each
 * of which has a valid second byte). */
static int utf8_incomplete(const unsigned char *p, size_t n) {
    if (n >= 4) return 0;
    if (n == 1) return p[0] >= 0xC2 && p[0] <= 0xF4;
    unsigned char full[4] = {0x80, 0x80, 0x80, 0x80};
    memcpy(full, p, n);
    return arl_utf8_char_len(full, 4) > n;
}

size_t arl_utf8_stream_put(arl_utf8_stream *u, const char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        u->held[u->n_held++] = (unsigned char)in[i];
        /* pass on what the held bytes decide: whole characters, U+FFFD for a byte that starts
         * none; keep a character's start */
        while (u->n_held) {
            size_t k = arl_utf8_char_len(u->held, u->n_held);
            if (!k && utf8_incomplete(u->held, u->n_held)) break;
            if (k)
                memcpy(out + o, u->held, k);
            else
                memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += k ? k : 3;
            k = k ? k : 1;
            memmove(u->held, u->held + k, u->n_held - k);
            u->n_held -= k;
        }
    }
    return o;
}

size_t arl_utf8_stream_end(arl_utf8_stream *u, char *out) {
    /* a held start is complete by none of the bytes after it (continuation bytes): each byte
     * of it is U+FFFD, as arl_tokenizer_decode has it */
    for (size_t i = 0; i < u->n_held; i++)
        memcpy(out + 3 * i, "\xEF\xBF\xBD", 3);
    const size_t o = 3 * u->n_held;
    u->n_held = 0;
    return o;
}

arl_status arl_tokenizer_decode(const arl_tokenizer_spec *s, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    ARL_TRY(arl_tokenizer_check_ids(s, ids, n));
    /* pass 1: bytes and names */
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < ARL_TOKENIZER_N_BYTES)
            cap += 1;
        else if (!(flags & ARL_DECODE_SKIP_SPECIAL))
            cap += 24; /* "<|reserved_NNNNNNNNNN|>" */
    }
    char *raw = malloc(cap);
    if (!raw) return arl_errorf(ARL_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < ARL_TOKENIZER_N_BYTES) {
            raw[m++] = (char)id;
        } else if (!(flags & ARL_DECODE_SKIP_SPECIAL)) {
            int k = arl_tokenizer_special_of(s, id);
            if (k >= 0) {
                size_t nl = strlen(special_names[k]);
                memcpy(raw + m, special_names[k], nl);
                m += nl;
            } else {
                m += (size_t)snprintf(raw + m, cap - m, "<|reserved_%d|>", id);
            }
        }
    }
    raw[m] = '\0';
    if (!(flags & ARL_DECODE_UTF8_REPLACE) || arl_utf8_valid(raw, m)) {
        *text = raw;
        *len = m;
        return ARL_OK;
    }
    /* pass 2: each invalid byte becomes U+FFFD (3 bytes) */
    char *out = malloc(3 * m + 1);
    if (!out) {
        free(raw);
        return arl_errorf(ARL_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    }
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)raw;
    for (size_t i = 0; i < m;) {
        size_t k = arl_utf8_char_len(p + i, m - i);
        if (k) {
            memcpy(out + o, raw + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        }
    }
    out[o] = '\0';
    free(raw);
    *text = out;
    *len = o;
    return ARL_OK;
}
