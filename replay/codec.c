/* replay/codec.c: SHA-256 as hex (core/sha256.c), hex and base64 (see codec.h). */
#include "replay/codec.h"

#include <string.h>

#include "core/sha256.h"

void replay_sha256_hex(const void *data, size_t n, char out[65]) {
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256(data, n, d);
    arl_sha256_hex(d, out);
}

void replay_hex_encode(const uint8_t *in, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[in[i] >> 4];
        out[2 * i + 1] = hx[in[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int replay_hex_decode(const char *in, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        int a = hexval(in[2 * i]), b = hexval(in[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        out[i] = (uint8_t)(a * 16 + b);
    }
    return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t replay_base64_len(size_t n) {
    return (n + 2) / 3 * 4;
}

void replay_base64_encode(const uint8_t *in, size_t n, char *out) {
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8) | in[i + 2];
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = b64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i + 1] << 8);
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = '=';
    }
    out[o] = 0;
}

static int b64val(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int replay_base64_decode(const char *in, size_t n, uint8_t *out, size_t *out_len) {
    if (n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = 0;
        if (i + 4 == n) {
            if (in[i + 3] == '=') pad++;
            if (in[i + 2] == '=') {
                if (!pad) return -1;
                pad++;
            }
        }
        int a = b64val((unsigned char)in[i]), b = b64val((unsigned char)in[i + 1]);
        int c = pad >= 2 ? 0 : b64val((unsigned char)in[i + 2]);
        int d = pad >= 1 ? 0 : b64val((unsigned char)in[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0) return -1;
        uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | (uint32_t)d;
        if (pad == 2 && (v & 0xFFFF)) return -1; /* non-zero pad bits: not canonical */
        if (pad == 1 && (v & 0xFF)) return -1;
        out[o++] = (uint8_t)(v >> 16);
        if (pad < 2) out[o++] = (uint8_t)(v >> 8);
        if (pad < 1) out[o++] = (uint8_t)v;
    }
    *out_len = o;
    return 0;
}
