/* core/deflate.c: run-matching zlib writer with the fixed Huffman code and stored blocks (see
 * deflate.h).
 * Bits are packed LSB first (RFC 1951 section 3.1.1); Huffman codes are sent most significant
 * bit first, so the tables below hold them bit-reversed. */
#include "core/deflate.h"

#include <string.h>

#include "core/inflate.h"

typedef struct bitwriter {
    uint8_t *out;
    size_t cap, n;
    uint64_t acc;
    int nacc;
    int full; /* out_cap reached */
} bitwriter;

static void put(bitwriter *w, uint32_t bits, int n) {
    w->acc |= (uint64_t)bits << w->nacc;
    w->nacc += n;
    while (w->nacc >= 8) {
        if (w->n >= w->cap) {
            w->full = 1;
            w->nacc = 0;
            w->acc = 0;
            return;
        }
        w->out[w->n++] = (uint8_t)w->acc;
        w->acc >>= 8;
        w->nacc -= 8;
    }
}

static uint32_t reverse(uint32_t code, int len) {
    uint32_t r = 0;
    for (int i = 0; i < len; i++)
        r |= ((code >> i) & 1u) << (len - 1 - i);
    return r;
}

/* fixed literal/length code of symbol s (RFC 1951 section 3.2.6), bit-reversed */
static void fixed_code(int s, uint32_t *code, int *len) {
    if (s < 144) {
        *len = 8;
        *code = reverse(0x30u + (uint32_t)s, 8);
    } else if (s < 256) {
        *len = 9;
        *code = reverse(0x190u + (uint32_t)(s - 144), 9);
    } else if (s < 280) {
        *len = 7;
        *code = reverse((uint32_t)(s - 256), 7);
    } else {
        *len = 8;
        *code = reverse(0xC0u + (uint32_t)(s - 280), 8);
    }
}

static const uint16_t len_base[29] = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                      15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                      67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};

static void put_literal(bitwriter *w, int b) {
    uint32_t c;
    int l;
    fixed_code(b, &c, &l);
    put(w, c, l);
}

static void put_match(bitwriter *w, size_t len, size_t dist) {
    int i = 28;
    while (len_base[i] > len)
        i--;
    uint32_t c;
    int l;
    fixed_code(257 + i, &c, &l);
    put(w, c, l);
    if (len_extra[i]) put(w, (uint32_t)(len - len_base[i]), len_extra[i]);
    /* distances 1, 2, 4 and 8 only: codes 0, 1, 3 and 5 (base 7, one extra bit) */
    int dc = dist == 1 ? 0 : dist == 2 ? 1 : dist == 4 ? 3 : 5;
    put(w, reverse((uint32_t)dc, 5), 5);
    if (dc == 5) put(w, (uint32_t)(dist - 7), 1);
}

static size_t match_len(const uint8_t *in, size_t n, size_t i, size_t d) {
    size_t m = n - i < 258 ? n - i : 258, k = 0;
    while (k < m && in[i + k] == in[i + k - d])
        k++;
    return k;
}

/* Bytes copied as they are (after the bitwriter is at a byte boundary). */
static void put_bytes(bitwriter *w, const uint8_t *p, size_t n) {
    if (w->full || n > w->cap - w->n) {
        w->full = 1;
        return;
    }
    memcpy(w->out + w->n, p, n);
    w->n += n;
}

/* Stored blocks (BTYPE 00, never final) holding p[0..n). */
static void put_stored(bitwriter *w, const uint8_t *p, size_t n) {
    while (n && !w->full) {
        size_t k = n < 65535 ? n : 65535;
        put(w, 0, 1); /* BFINAL 0 */
        put(w, 0, 2); /* BTYPE 00 */
        if (w->nacc) put(w, 0, 8 - w->nacc);
        put(w, (uint32_t)k, 16);
        put(w, (uint32_t)k ^ 0xFFFFu, 16);
        put_bytes(w, p, k);
        p += k;
        n -= k;
    }
}

/* The bits a stored block costs beyond its bytes, at most: the end-of-block code of the fixed
 * block before it (7), its header (3), the alignment (7), LEN and NLEN (32), and the header of
 * the fixed block after it (3). */
#define STORED_EXTRA_BITS 52

arl_status arl_zlib_encode(const uint8_t *in, size_t n, size_t elem, uint8_t *out, size_t out_cap,
                           size_t *out_len) {
    if (elem != 1 && elem != 2 && elem != 4 && elem != 8)
        return arl_errorf(ARL_ERR_ARG, "zlib encode: element size %zu is not 1, 2, 4 or 8", elem);
    bitwriter w = {out, out_cap, 0, 0, 0, 0};
    /* header: deflate, 32 KiB window, FLEVEL 0 (fastest), no dictionary: 0x78 0x01 */
    put(&w, 0x78, 8);
    put(&w, 0x01, 8);
    size_t i = 0, check = n / 8;
    int in_fixed = 0; /* inside a fixed-code block */
    while (i < n && !w.full) {
        /* the stretch of literals from i, up to the next match (or the end) */
        size_t j = i, best = 0, bd = 0;
        uint64_t fixed_bits = 0;
        for (; j < n; j++) {
            best = 0;
            if (j >= elem) {
                best = match_len(in, n, j, elem);
                bd = elem;
            }
            if (elem > 1 && j >= 1 && best < 258) {
                size_t m = match_len(in, n, j, 1);
                if (m > best) {
                    best = m;
                    bd = 1;
                }
            }
            if (best >= 3) break;
            fixed_bits += in[j] < 144 ? 8 : 9;
        }
        /* literals that the fixed code does not shrink go into a stored block: never larger,
         * and they decode as one copy */
        if (j > i && 8 * (uint64_t)(j - i) + STORED_EXTRA_BITS <= fixed_bits) {
            if (in_fixed) put_literal(&w, 256);
            in_fixed = 0;
            put_stored(&w, in + i, j - i);
        } else if (j > i) {
            if (!in_fixed) {
                put(&w, 0, 1); /* BFINAL 0 */
                put(&w, 1, 2); /* BTYPE 01: fixed Huffman codes */
                in_fixed = 1;
            }
            for (size_t k = i; k < j; k++)
                put_literal(&w, in[k]);
        }
        i = j;
        if (i < n) {
            if (!in_fixed) {
                put(&w, 0, 1);
                put(&w, 1, 2);
                in_fixed = 1;
            }
            put_match(&w, best, bd);
            i += best;
        }
        /* an array that compresses badly shows it early: stop at 1/8 of the input if the
         * stream is already over its share of out_cap by a quarter */
        if (check && i >= check) {
            if ((double)w.n > 1.25 * (double)out_cap * (double)i / (double)n) w.full = 1;
            check = 0;
        }
    }
    if (in_fixed) put_literal(&w, 256); /* end of block */
    /* the final block: empty, fixed code (10 bits) */
    put(&w, 1, 1);
    put(&w, 1, 2);
    put_literal(&w, 256);
    if (w.nacc) put(&w, 0, 8 - w.nacc); /* to a byte boundary */
    uint32_t a = arl_adler32(1, in, n);
    for (int k = 3; k >= 0; k--)
        put(&w, (a >> (8 * k)) & 0xFF, 8); /* big-endian */
    if (w.full) return arl_errorf(ARL_ERR_RANGE, "zlib encode: stream over %zu bytes", out_cap);
    *out_len = w.n;
    return ARL_OK;
}
