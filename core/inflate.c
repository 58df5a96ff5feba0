/* core/inflate.c: table-driven canonical-Huffman DEFLATE decoder (RFC 1951) with bounds checks
 * on every read and write.  Decoding tables are built per block on the stack (the fixed code's
 * once per process); no allocation.
 *
 * Bits: a 64-bit buffer refilled 8 bytes at a time while 8 input bytes remain, byte by byte
 * near the end of the input.  Bits above the counted ones are either zero or the stream's next
 * bits, never anything else, so a table lookup may read past the counted bits and a code is
 * accepted only when its length fits in them (else the stream is truncated).
 * Symbols: one lookup in a table indexed by the next FAST bits gives the symbol and its code
 * length for every code of at most FAST bits; longer codes (rare: dynamic blocks only) and
 * prefixes of no code take the canonical bit-by-bit decode over the buffered bits. */
#include "core/inflate.h"

#include <pthread.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "agentrl assumes a little-endian host"
#endif

typedef struct bitreader {
    const uint8_t *p;
    size_t n, pos; /* input bytes [0, pos) are consumed or counted in buf */
    uint64_t buf;  /* next bits, LSB first: cnt counted, the ones above zero or the next bits */
    int cnt;
} bitreader;

/* always inlined: codes() keeps its bitreader in registers (a local copy whose address never
 * leaves the function) */
#if defined(__GNUC__) || defined(__clang__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

INLINE void refill(bitreader *br) {
    if (br->n - br->pos >= 8) {
        uint64_t v;
        memcpy(&v, br->p + br->pos, 8);
        br->buf |= v << br->cnt;
        br->pos += (size_t)((63 - br->cnt) >> 3);
        br->cnt |= 56;
    } else {
        while (br->cnt <= 56 && br->pos < br->n) {
            br->buf |= (uint64_t)br->p[br->pos++] << br->cnt;
            br->cnt += 8;
        }
    }
}

/* Read `need` (0..16) bits, LSB first.  Returns -1 on end of input. */
INLINE int bits(bitreader *br, int need) {
    if (br->cnt < need) {
        refill(br);
        if (br->cnt < need) return -1;
    }
    int v = (int)(br->buf & ((1u << need) - 1));
    br->buf >>= need;
    br->cnt -= need;
    return v;
}

#define MAXBITS 15
#define FAST 10 /* bits of the lookup table: every fixed-code symbol, most dynamic ones */

typedef struct huffman {
    int16_t count[MAXBITS + 1]; /* number of codes of each length */
    int16_t symbol[320];        /* symbols ordered by code */
    uint16_t fast[1 << FAST];   /* next FAST bits -> symbol | length << 9; 0: longer or none */
} huffman;

/* Build the decoding tables from code lengths; returns 0 if complete, > 0 for an incomplete
 * code (the caller decides whether it is allowed), -1 if over-subscribed. */
static int huff_build(huffman *h, const uint8_t *len, int n) {
    int16_t offs[MAXBITS + 1];
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (int s = 0; s < n; s++) h->count[len[s]]++;
    if (h->count[0] == n) return 0;
    int left = 1;
    for (int l = 1; l <= MAXBITS; l++) {
        left <<= 1;
        left -= h->count[l];
        if (left < 0) return -1;
    }
    offs[1] = 0;
    for (int l = 1; l < MAXBITS; l++) offs[l + 1] = offs[l] + h->count[l];
    for (int s = 0; s < n; s++)
        if (len[s]) h->symbol[offs[len[s]]++] = (int16_t)s;
    /* canonical codes: consecutive within a length, in symbol order; the first code of length
     * l + 1 is (last code of length l + 1) << 1.  Codes are sent MSB first, so the table index
     * (the next bits, LSB first) is the code bit-reversed, with every value of the bits after
     * it. */
    unsigned code = 0;
    int idx = 0;
    for (int l = 1; l <= FAST; l++) {
        for (int k = 0; k < h->count[l]; k++, code++) {
            unsigned r = 0;
            for (int b = 0; b < l; b++) r |= ((code >> b) & 1u) << (l - 1 - b);
            uint16_t e = (uint16_t)(h->symbol[idx++] | l << 9);
            for (unsigned j = r; j < (1u << FAST); j += 1u << l) h->fast[j] = e;
        }
        code <<= 1;
    }
    return left;
}

/* The canonical decode one bit at a time, over the buffered bits (codes longer than FAST bits,
 * or no code).  -1: the input ends inside the code; -2: no code has these bits. */
INLINE int huff_slow(bitreader *br, const huffman *h) {
    int code = 0, first = 0, index = 0;
    for (int l = 1; l <= MAXBITS; l++) {
        if (l > br->cnt) return -1;
        code |= (int)((br->buf >> (l - 1)) & 1u);
        int count = h->count[l];
        if (code - count < first) {
            br->buf >>= l;
            br->cnt -= l;
            return h->symbol[index + (code - first)];
        }
        index += count;
        first += count;
        first <<= 1;
        code <<= 1;
    }
    return -2;
}

INLINE int huff_decode(bitreader *br, const huffman *h) {
    if (br->cnt < MAXBITS) refill(br);
    unsigned e = h->fast[br->buf & ((1u << FAST) - 1)];
    int l = (int)(e >> 9);
    if (!l) return huff_slow(br, h);
    if (l > br->cnt) return -1;
    br->buf >>= l;
    br->cnt -= l;
    return (int)(e & 511u);
}

static const uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1,    2,    3,    4,    5,    7,     9,     13,    17,  25,
                                       33,   49,   65,   97,   129,  193,   257,   385,   513, 769,
                                       1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                       6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* The fixed code (RFC 1951 section 3.2.6), built once. */
static huffman fixed_lit, fixed_dist;
static pthread_once_t fixed_once = PTHREAD_ONCE_INIT;

static void fixed_build(void) {
    uint8_t lengths[288];
    int s = 0;
    for (; s < 144; s++) lengths[s] = 8;
    for (; s < 256; s++) lengths[s] = 9;
    for (; s < 280; s++) lengths[s] = 7;
    for (; s < 288; s++) lengths[s] = 8;
    huff_build(&fixed_lit, lengths, 288);
    for (s = 0; s < 30; s++) lengths[s] = 5;
    huff_build(&fixed_dist, lengths, 30);
}

static arl_status bad(const char *what) {
    return arl_errorf(ARL_ERR_FORMAT, "deflate stream: %s", what);
}

static arl_status too_big(size_t cap) {
    return arl_errorf(ARL_ERR_RANGE, "deflate stream: output larger than %zu bytes", cap);
}

static arl_status codes(bitreader *brp, const huffman *lit, const huffman *dist, uint8_t *out,
                        size_t cap, size_t *olen) {
    bitreader b = *brp, *br = &b;
    size_t o = *olen;
    for (;;) {
        int sym = huff_decode(br, lit);
        if (sym < 256) {
            if (sym < 0) return bad(sym == -1 ? "truncated" : "invalid literal/length code");
            if (o >= cap) return too_big(cap);
            out[o++] = (uint8_t)sym;
            continue;
        }
        if (sym == 256) {
            *olen = o;
            *brp = b;
            return ARL_OK;
        }
        sym -= 257;
        if (sym >= 29) return bad("invalid length symbol");
        int e = bits(br, len_extra[sym]);
        if (e < 0) return bad("truncated");
        size_t len = len_base[sym] + (size_t)e;
        int ds = huff_decode(br, dist);
        if (ds < 0) return bad(ds == -1 ? "truncated" : "invalid distance code");
        if (ds >= 30) return bad("invalid distance symbol");
        int de = bits(br, dist_extra[ds]);
        if (de < 0) return bad("truncated");
        size_t d = dist_base[ds] + (size_t)de;
        if (d > o) return bad("distance too far back");
        if (len > cap - o) return too_big(cap);
        if (d >= 8) {
            /* 8 bytes at a time: from 8 or more bytes back, each piece reads bytes already
             * written */
            for (; len >= 8; len -= 8, o += 8)
                memcpy(out + o, out + o - d, 8);
            for (; len; len--, o++)
                out[o] = out[o - d];
            continue;
        }
        if (d == 1 || d == 2 || d == 4) {
            /* a period that divides 8, spread over 8 bytes and stored 8 at a time */
            uint64_t unit = 0, v;
            memcpy(&unit, out + o - d, d);
            v = d == 1 ? unit * 0x0101010101010101ull
                : d == 2 ? unit * 0x0001000100010001ull
                         : unit * 0x0000000100000001ull;
            for (; len >= 8; len -= 8, o += 8)
                memcpy(out + o, &v, 8);
            for (int k = 0; len; len--, k++)
                out[o++] = (uint8_t)(v >> (8 * k));
            continue;
        }
        /* other periods: pieces that do not overlap: the match repeats a period of d bytes, so
         * after `copied` bytes a piece may come from copied + d bytes back (a multiple of d:
         * every piece but the last is one) */
        for (size_t copied = 0; len;) {
            size_t dd = copied + d, c = dd < len ? dd : len;
            memcpy(out + o, out + o - dd, c);
            o += c;
            len -= c;
            copied += c;
        }
    }
}

arl_status arl_inflate(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                       size_t *out_len, size_t *in_used) {
    bitreader br = {in, in_len, 0, 0, 0};
    size_t o = 0;
    int last;
    do {
        last = bits(&br, 1);
        int type = bits(&br, 2);
        if (last < 0 || type < 0) return bad("truncated block header");
        if (type == 0) {
            /* to the next byte boundary; whole bytes still buffered go back to the input */
            br.pos -= (size_t)(br.cnt >> 3);
            br.buf = 0;
            br.cnt = 0;
            if (br.pos + 4 > br.n) return bad("truncated stored block");
            unsigned len = br.p[br.pos] | (unsigned)br.p[br.pos + 1] << 8;
            unsigned nlen = br.p[br.pos + 2] | (unsigned)br.p[br.pos + 3] << 8;
            br.pos += 4;
            if ((len ^ 0xffffu) != nlen) return bad("stored block length check failed");
            if (br.pos + len > br.n) return bad("truncated stored block");
            if (len > out_cap - o) return too_big(out_cap);
            if (len) memcpy(out + o, br.p + br.pos, len);
            br.pos += len;
            o += len;
        } else if (type == 1) {
            pthread_once(&fixed_once, fixed_build);
            ARL_TRY(codes(&br, &fixed_lit, &fixed_dist, out, out_cap, &o));
        } else if (type == 2) {
            huffman lit, dist;
            uint8_t lengths[320];
            int nlen = bits(&br, 5), ndist = bits(&br, 5), ncode = bits(&br, 4);
            if (nlen < 0 || ndist < 0 || ncode < 0) return bad("truncated dynamic header");
            nlen += 257;
            ndist += 1;
            ncode += 4;
            if (nlen > 286 || ndist > 30) return bad("bad dynamic block counts");
            static const uint8_t order[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                              11, 4,  12, 3, 13, 2, 14, 1, 15};
            uint8_t cl[19] = {0};
            for (int i = 0; i < ncode; i++) {
                int v = bits(&br, 3);
                if (v < 0) return bad("truncated code lengths");
                cl[order[i]] = (uint8_t)v;
            }
            huffman lencode;
            if (huff_build(&lencode, cl, 19) != 0) return bad("bad code-length code");
            int idx = 0;
            while (idx < nlen + ndist) {
                int sym = huff_decode(&br, &lencode);
                if (sym < 0) return bad("bad code lengths");
                if (sym < 16) {
                    lengths[idx++] = (uint8_t)sym;
                } else {
                    int rep, val = 0;
                    if (sym == 16) {
                        if (idx == 0) return bad("repeat with no previous length");
                        val = lengths[idx - 1];
                        rep = bits(&br, 2);
                        rep = rep < 0 ? -1 : 3 + rep;
                    } else if (sym == 17) {
                        rep = bits(&br, 3);
                        rep = rep < 0 ? -1 : 3 + rep;
                    } else {
                        rep = bits(&br, 7);
                        rep = rep < 0 ? -1 : 11 + rep;
                    }
                    if (rep < 0) return bad("truncated code lengths");
                    if (idx + rep > nlen + ndist) return bad("too many code lengths");
                    while (rep--) lengths[idx++] = (uint8_t)val;
                }
            }
            if (lengths[256] == 0) return bad("no end-of-block code");
            int e1 = huff_build(&lit, lengths, nlen);
            if (e1 < 0 || (e1 > 0 && nlen - lit.count[0] != 1)) return bad("bad literal/length code");
            int e2 = huff_build(&dist, lengths + nlen, ndist);
            if (e2 < 0 || (e2 > 0 && ndist - dist.count[0] != 1)) return bad("bad distance code");
            ARL_TRY(codes(&br, &lit, &dist, out, out_cap, &o));
        } else {
            return bad("invalid block type 3");
        }
    } while (!last);
    *out_len = o;
    /* the last byte counts as used once any of its bits is; whole buffered bytes do not */
    if (in_used) *in_used = br.pos - (size_t)(br.cnt >> 3);
    return ARL_OK;
}

/* Adler-32, portable: 16 bytes at a time without the byte-to-byte dependency of b on a. */
static uint32_t adler32_portable(uint32_t adler, const uint8_t *p, size_t n) {
    uint32_t a = adler & 0xffff, b = adler >> 16;
    while (n) {
        /* 5552 bytes keep b below 2^32 before the reduction (zlib's NMAX) */
        size_t k = n < 5552 ? n : 5552;
        n -= k;
        /* b gains 16 a plus the bytes weighted 16, 15, ..., 1; a gains their sum (the same
         * values as one byte at a time, so the same bound) */
        for (; k >= 16; k -= 16, p += 16) {
            uint32_t s = 0, w = 0;
            for (int i = 0; i < 16; i++) {
                s += p[i];
                w += (uint32_t)(16 - i) * p[i];
            }
            b += 16 * a + w;
            a += s;
        }
        while (k--) {
            a += *p++;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    return (b << 16) | a;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ARL_ADLER_HAVE_SSSE3 1

/* Adler-32 with SSSE3, 16 bytes per step.  Per step j of a run of K steps (16 K <= 5536 bytes,
 * so every sum below stays under 2^32 as in the portable form):
 *   a += sum of the 16 bytes;  b += 16 a_before + sum of (16 - i) byte_i.
 * Lanes: vs1 holds byte sums (psadbw, two 64-bit lanes), vps the sum over steps of vs1 before
 * each step (the 16 a_before terms, times 16 at the end), vs2 the weighted sums (pmaddubsw then
 * pmaddwd: 4 lanes).  Lane sums are parts of non-negative totals, so no lane overflows. */
__attribute__((target("ssse3"))) static uint32_t adler32_ssse3(uint32_t adler, const uint8_t *p,
                                                               size_t n) {
    uint32_t a = adler & 0xffff, b = adler >> 16;
    const __m128i zero = _mm_setzero_si128();
    const __m128i weights = _mm_setr_epi8(16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m128i ones = _mm_set1_epi16(1);
    while (n >= 16) {
        size_t steps = n / 16 < 5536 / 16 ? n / 16 : 5536 / 16;
        n -= steps * 16;
        __m128i vs1 = zero, vs2 = zero, vps = zero;
        for (size_t j = 0; j < steps; j++, p += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            vps = _mm_add_epi32(vps, vs1);
            vs1 = _mm_add_epi32(vs1, _mm_sad_epu8(x, zero));
            vs2 = _mm_add_epi32(vs2, _mm_madd_epi16(_mm_maddubs_epi16(x, weights), ones));
        }
        vs2 = _mm_add_epi32(vs2, _mm_slli_epi32(vps, 4));
        uint32_t t1[4], t2[4];
        _mm_storeu_si128((__m128i *)t1, vs1);
        _mm_storeu_si128((__m128i *)t2, vs2);
        b += (uint32_t)(16 * steps) * a + t2[0] + t2[1] + t2[2] + t2[3];
        a += t1[0] + t1[2];
        a %= 65521;
        b %= 65521;
    }
    return adler32_portable((b << 16) | a, p, n);
}
#endif

uint32_t arl_adler32(uint32_t adler, const uint8_t *p, size_t n) {
#ifdef ARL_ADLER_HAVE_SSSE3
    if (__builtin_cpu_supports("ssse3")) return adler32_ssse3(adler, p, n);
#endif
    return adler32_portable(adler, p, n);
}

arl_status arl_zlib_decode_ex(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                              size_t *out_len, size_t *in_used) {
    if (in_len < 6) return bad("zlib stream too short");
    if ((in[0] & 0x0f) != 8 || ((in[0] << 8) | in[1]) % 31 != 0) return bad("bad zlib header");
    if ((in[0] >> 4) > 7) return bad("zlib window size over 32 KiB (CINFO > 7)");
    if (in[1] & 0x20) return bad("zlib preset dictionary not supported");
    size_t used = 0;
    ARL_TRY(arl_inflate(in + 2, in_len - 2, out, out_cap, out_len, &used));
    if (2 + used + 4 > in_len) return bad("truncated zlib trailer");
    const uint8_t *t = in + 2 + used;
    uint32_t want = (uint32_t)t[0] << 24 | (uint32_t)t[1] << 16 | (uint32_t)t[2] << 8 | t[3];
    if (arl_adler32(1, out, *out_len) != want) return bad("Adler-32 checksum mismatch");
    if (in_used) *in_used = 2 + used + 4;
    return ARL_OK;
}

arl_status arl_zlib_decode(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                           size_t *out_len) {
    return arl_zlib_decode_ex(in, in_len, out, out_cap, out_len, NULL);
}
