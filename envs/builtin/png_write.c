/* envs/builtin/png_write.c: the stored-block PNG encoder of png_write.h.
 *
 * File layout: signature, IHDR (13 bytes), one IDAT holding the zlib stream
 * (header 0x78 0x01, stored deflate blocks of at most 65535 bytes, Adler-32 big-endian) of the
 * filtered rows (filter byte 0 "None" then width*3 bytes per row), IEND. */
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/inflate.h"
#include "envs/builtin/png_write.h"

static uint8_t *put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return p + 4;
}

/* Write a chunk (length, type, data, CRC over type+data); returns the end. */
static uint8_t *chunk(uint8_t *p, const char type[4], const uint8_t *data, size_t n) {
    p = put32(p, (uint32_t)n);
    uint8_t *t = p;
    memcpy(p, type, 4);
    p += 4;
    if (n) memmove(p, data, n);
    p += n;
    return put32(p, arl_crc32_update(0, t, n + 4));
}

arl_status arl_png_write_rgb(const uint8_t *rgb, int32_t width, int32_t height, uint8_t **png,
                             size_t *len) {
    *png = NULL;
    *len = 0;
    if (width < 1 || height < 1 || width > 4096 || height > 4096)
        return arl_errorf(ARL_ERR_ARG, "png_write: image size %dx%d outside 1..4096", width,
                          height);
    size_t row = (size_t)width * 3 + 1;
    size_t raw = row * (size_t)height;
    size_t nblocks = (raw + 65534) / 65535;
    size_t zlen = 2 + nblocks * 5 + raw + 4;
    size_t total = 8 + (12 + 13) + (12 + zlen) + 12;
    uint8_t *out = malloc(total);
    uint8_t *z = malloc(zlen);
    if (!out || !z) {
        free(out);
        free(z);
        return arl_errorf(ARL_ERR_NOMEM, "png_write: out of memory for a %dx%d image", width,
                          height);
    }
    /* zlib stream: CMF 0x78 (deflate, 32K window), FLG 0x01 (check bits: 0x7801 % 31 == 0). */
    uint8_t *q = z;
    *q++ = 0x78;
    *q++ = 0x01;
    uint32_t adler = 1;
    size_t done = 0; /* bytes of the filtered image emitted */
    while (done < raw) {
        size_t n = raw - done < 65535 ? raw - done : 65535;
        *q++ = done + n == raw ? 1 : 0; /* BFINAL, BTYPE 00 (stored) */
        *q++ = (uint8_t)n;
        *q++ = (uint8_t)(n >> 8);
        *q++ = (uint8_t)~n;
        *q++ = (uint8_t)(~n >> 8);
        for (size_t i = 0; i < n; i++) {
            size_t k = done + i, y = k / row, x = k % row;
            q[i] = x == 0 ? 0 : rgb[y * (row - 1) + (x - 1)];
        }
        adler = arl_adler32(adler, q, n);
        q += n;
        done += n;
    }
    q = put32(q, adler);
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    uint8_t ihdr[13];
    put32(ihdr, (uint32_t)width);
    put32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* colour type: RGB */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* filter method 0 */
    ihdr[12] = 0; /* no interlace */
    uint8_t *p = out;
    memcpy(p, sig, 8);
    p += 8;
    p = chunk(p, "IHDR", ihdr, 13);
    p = chunk(p, "IDAT", z, (size_t)(q - z));
    p = chunk(p, "IEND", NULL, 0);
    free(z);
    *png = out;
    *len = (size_t)(p - out);
    return ARL_OK;
}
