/* tests/envs_builtin/png_decode.h: a PNG reader for the files of envs/builtin/png_write.c
 * (8-bit RGB, stored deflate blocks), written independently of the encoder: bitwise CRC-32,
 * plain Adler-32, every chunk CRC and the zlib framing checked.  Test code only. */
#ifndef ARL_TESTS_ENVS_BUILTIN_PNG_DECODE_H
#define ARL_TESTS_ENVS_BUILTIN_PNG_DECODE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Bitwise CRC-32 (no table): an independent reference for the encoder's table version. */
static inline uint32_t ref_crc(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static inline uint32_t ref_adler(const uint8_t *p, size_t n) {
    uint64_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521;
        b = (b + a) % 65521;
    }
    return (uint32_t)(b << 16 | a);
}

/* Decode a PNG written by the encoder: returns 1 and the pixels (malloc'd) when valid. */
static inline int png_decode(const uint8_t *png, size_t len, int *w, int *h, uint8_t **rgb) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    if (len < 8 || memcmp(png, sig, 8)) return fprintf(stderr, "bad signature\n"), 0;
    size_t pos = 8;
    uint8_t *z = NULL;
    size_t zlen = 0;
    int seen_ihdr = 0, seen_iend = 0;
    while (pos + 12 <= len) {
        uint32_t n = be32(png + pos);
        if (pos + 12 + n > len) return fprintf(stderr, "chunk overruns the file\n"), 0;
        const uint8_t *type = png + pos + 4, *data = png + pos + 8;
        uint32_t crc = be32(png + pos + 8 + n);
        if (crc != ref_crc(type, n + 4)) return fprintf(stderr, "bad CRC of %.4s\n", type), 0;
        if (!memcmp(type, "IHDR", 4)) {
            if (pos != 8 || n != 13) return fprintf(stderr, "IHDR not first or wrong size\n"), 0;
            *w = (int)be32(data);
            *h = (int)be32(data + 4);
            if (data[8] != 8 || data[9] != 2 || data[10] || data[11] || data[12])
                return fprintf(stderr, "unexpected IHDR fields\n"), 0;
            seen_ihdr = 1;
        } else if (!memcmp(type, "IDAT", 4)) {
            z = realloc(z, zlen + n);
            memcpy(z + zlen, data, n);
            zlen += n;
        } else if (!memcmp(type, "IEND", 4)) {
            if (n != 0) return fprintf(stderr, "IEND with data\n"), 0;
            seen_iend = 1;
            pos += 12;
            break;
        }
        pos += 12 + n;
    }
    if (!seen_ihdr || !seen_iend || pos != len || zlen < 6) {
        free(z);
        return fprintf(stderr, "missing chunks or trailing bytes\n"), 0;
    }
    /* zlib header: CM 8, window <= 32K, FCHECK, no preset dictionary */
    if ((z[0] & 15) != 8 || (z[0] >> 4) > 7 || ((z[0] << 8) | z[1]) % 31 || (z[1] & 0x20)) {
        free(z);
        return fprintf(stderr, "bad zlib header\n"), 0;
    }
    size_t raw_len = (size_t)(*h) * ((size_t)(*w) * 3 + 1);
    uint8_t *raw = malloc(raw_len + 1);
    size_t zp = 2, rp = 0;
    int final = 0;
    while (!final) {
        if (zp + 5 > zlen) break;
        uint8_t hdr = z[zp];
        final = hdr & 1;
        if (((hdr >> 1) & 3) != 0) break; /* only stored blocks are written */
        uint32_t n = z[zp + 1] | (uint32_t)z[zp + 2] << 8;
        uint32_t nn = z[zp + 3] | (uint32_t)z[zp + 4] << 8;
        if ((n ^ 0xffffu) != nn || zp + 5 + n > zlen || rp + n > raw_len) break;
        memcpy(raw + rp, z + zp + 5, n);
        rp += n;
        zp += 5 + n;
    }
    int ok = final && rp == raw_len && zp + 4 == zlen && be32(z + zp) == ref_adler(raw, rp);
    free(z);
    if (!ok) {
        free(raw);
        return fprintf(stderr, "bad deflate stream or Adler-32\n"), 0;
    }
    *rgb = malloc((size_t)(*w) * (*h) * 3);
    for (int y = 0; y < *h; y++) {
        const uint8_t *row = raw + (size_t)y * ((size_t)(*w) * 3 + 1);
        if (row[0] != 0) ok = 0; /* filter type None */
        memcpy(*rgb + (size_t)y * (*w) * 3, row + 1, (size_t)(*w) * 3);
    }
    free(raw);
    return ok;
}

#endif
