/* core/inflate.c: canonical-Huffman DEFLATE decoder (RFC 1951) with bounds checks on every
 * read and write.  Decoding tables are built per block on the stack; no allocation. */
#include "core/inflate.h"

#include <string.h>

typedef struct bitreader {
    const uint8_t *p;
    size_t n, pos; /* byte position */
    uint32_t bitbuf;
    int bitcnt;
} bitreader;

/* Read `need` bits (LSB first). Returns -1 on end of input. */
static int bits(bitreader *br, int need) {
    while (br->bitcnt < need) {
        if (br->pos >= br->n) return -1;
        br->bitbuf |= (uint32_t)br->p[br->pos++] << br->bitcnt;
        br->bitcnt += 8;
    }
    int v = (int)(br->bitbuf & ((1u << need) - 1));
    br->bitbuf >>= need;
    br->bitcnt -= need;
    return v;
}

#define MAXBITS 15

typedef struct huffman {
    int16_t count[MAXBITS + 1]; /* number of codes of each length */
    int16_t symbol[320];        /* symbols ordered by code */
} huffman;

/* Build a decoding table from code lengths; returns 0 if complete or an allowed incomplete
 * code, -1 if over-subscribed. */
static int huff_build(huffman *h, const uint8_t *len, int n) {
    int16_t offs[MAXBITS + 1];
    memset(h->count, 0, sizeof h->count);
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
    return left;
}

static int huff_decode(bitreader *br, const huffman *h) {
    int code = 0, first = 0, index = 0;
    for (int l = 1; l <= MAXBITS; l++) {
        int b = bits(br, 1);
        if (b < 0) return -1;
        code |= b;
        int count = h->count[l];
        if (code - count < first) return h->symbol[index + (code - first)];
        index += count;
        first += count;
        first <<= 1;
        code <<= 1;
    }
    return -2; /* invalid code */
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

static arl_status bad(const char *what) {
    return arl_errorf(ARL_ERR_FORMAT, "deflate stream: %s", what);
}

static arl_status codes(bitreader *br, const huffman *lit, const huffman *dist, uint8_t *out,
                        size_t cap, size_t *olen) {
    size_t o = *olen;
    for (;;) {
        int sym = huff_decode(br, lit);
        if (sym < 0) return bad(sym == -1 ? "truncated" : "invalid literal/length code");
        if (sym < 256) {
            if (o >= cap) return arl_errorf(ARL_ERR_RANGE, "deflate stream: output larger than %zu bytes", cap);
            out[o++] = (uint8_t)sym;
        } else if (sym == 256) {
            *olen = o;
            return ARL_OK;
        } else {
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
            if (len > cap - o) return arl_errorf(ARL_ERR_RANGE, "deflate stream: output larger than %zu bytes", cap);
            /* copy in pieces that do not overlap: the match repeats a period of d bytes, so
             * after `copied` bytes a piece may come from copied + d bytes back (a multiple of
             * d: every piece but the last is one) */
            for (size_t copied = 0; len;) {
                size_t dd = copied + d, c = dd < len ? dd : len;
                memcpy(out + o, out + o - dd, c);
                o += c;
                len -= c;
                copied += c;
            }
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
            br.bitbuf = 0;
            br.bitcnt = 0;
            if (br.pos + 4 > br.n) return bad("truncated stored block");
            unsigned len = br.p[br.pos] | (unsigned)br.p[br.pos + 1] << 8;
            unsigned nlen = br.p[br.pos + 2] | (unsigned)br.p[br.pos + 3] << 8;
            br.pos += 4;
            if ((len ^ 0xffffu) != nlen) return bad("stored block length check failed");
            if (br.pos + len > br.n) return bad("truncated stored block");
            if (len > out_cap - o) return arl_errorf(ARL_ERR_RANGE, "deflate stream: output larger than %zu bytes", out_cap);
            if (len) memcpy(out + o, br.p + br.pos, len);
            br.pos += len;
            o += len;
        } else if (type == 1 || type == 2) {
            huffman lit, dist;
            uint8_t lengths[320];
            if (type == 1) {
                int s = 0;
                for (; s < 144; s++) lengths[s] = 8;
                for (; s < 256; s++) lengths[s] = 9;
                for (; s < 280; s++) lengths[s] = 7;
                for (; s < 288; s++) lengths[s] = 8;
                huff_build(&lit, lengths, 288);
                for (s = 0; s < 30; s++) lengths[s] = 5;
                huff_build(&dist, lengths, 30);
            } else {
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
            }
            ARL_TRY(codes(&br, &lit, &dist, out, out_cap, &o));
        } else {
            return bad("invalid block type 3");
        }
    } while (!last);
    *out_len = o;
    if (in_used) *in_used = br.pos;
    return ARL_OK;
}

uint32_t arl_adler32(uint32_t adler, const uint8_t *p, size_t n) {
    uint32_t a = adler & 0xffff, b = adler >> 16;
    while (n) {
        /* 5552 bytes keep b below 2^32 before the reduction (zlib's NMAX) */
        size_t k = n < 5552 ? n : 5552;
        n -= k;
        /* 16 bytes at a time without the byte-to-byte dependency of b on a: b gains 16 a plus
         * the bytes weighted 16, 15, ..., 1; a gains their sum (the same values as one byte
         * at a time, so the same bound) */
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
