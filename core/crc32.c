/* core/crc32.c: CRC-32 (see crc32.h).  Table path: slicing-by-8.  Fast path (x86-64 with
 * PCLMULQDQ and SSE4.1, checked at run time): fold 64-byte blocks with carry-less
 * multiplication, then reduce 128 -> 64 -> 32 bits with a Barrett step.
 *
 * Folding constants (bit-reflected, shifted left by one, as the reflected algorithm needs), with
 * P = 0x104C11DB7 and everything mod P over GF(2); computed by tests/replay/crc32_constants.py:
 *   K1 = x^(512+32), K2 = x^(512-32)   fold four 128-bit lanes ahead by 512 bits
 *   K3 = x^(128+32), K4 = x^(128-32)   fold one lane ahead by 128 bits
 *   K5 = x^64                           fold 96 -> 64 bits
 *   MU = floor(x^64 / P), PR = P        Barrett reduction 64 -> 32 bits
 */
#include "core/crc32.h"

#include <pthread.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "agentrl assumes a little-endian host"
#endif

static uint32_t crc_tab[8][256];
static pthread_once_t crc_tab_once = PTHREAD_ONCE_INIT;

static void crc_tab_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            crc_tab[k][i] = (crc_tab[k - 1][i] >> 8) ^ crc_tab[0][crc_tab[k - 1][i] & 0xFF];
}

/* c is the working register (already complemented). */
static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
        a ^= c;
        c = crc_tab[7][a & 0xFF] ^ crc_tab[6][(a >> 8) & 0xFF] ^ crc_tab[5][(a >> 16) & 0xFF] ^
            crc_tab[4][a >> 24] ^ crc_tab[3][b & 0xFF] ^ crc_tab[2][(b >> 8) & 0xFF] ^
            crc_tab[1][(b >> 16) & 0xFF] ^ crc_tab[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xFF];
    return c;
}

uint32_t arl_crc32_update_portable(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_tab_once, crc_tab_init);
    if (!n) return crc;
    return ~crc_slice8(~crc, (const uint8_t *)data, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ARL_CRC_HAVE_CLMUL 1

/* One 128-bit lane folded ahead: (lo(x) * klo) ^ (hi(x) * khi) ^ next. */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i crc_fold(__m128i x, __m128i k,
                                                                         __m128i next) {
    __m128i a = _mm_clmulepi64_si128(x, k, 0x00);
    __m128i b = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(a, b), next);
}

/* Working register c over p[0..n), n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_clmul(uint32_t c, const uint8_t *p,
                                                                    size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL); /* lo P, hi MU */
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);

    __m128i x0 = _mm_loadu_si128((const __m128i *)(p + 0));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x0 = crc_fold(x0, k1k2, _mm_loadu_si128((const __m128i *)(p + 0)));
        x1 = crc_fold(x1, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = crc_fold(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = crc_fold(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x0 = crc_fold(x0, k3k4, x1);
    x0 = crc_fold(x0, k3k4, x2);
    x0 = crc_fold(x0, k3k4, x3);
    while (n >= 16) {
        x0 = crc_fold(x0, k3k4, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    /* 128 -> 96 bits: low lane times K4 added to the high lane. */
    __m128i t = _mm_clmulepi64_si128(x0, k3k4, 0x10);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    /* 96 -> 64 bits: low 32 bits times K5 added to the rest. */
    t = _mm_srli_si128(x0, 4);
    x0 = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00);
    x0 = _mm_xor_si128(x0, t);
    /* Barrett: q = lo32(x) * MU, r = x ^ lo32(q) * P; the CRC is bits 32..63 of r. */
    t = _mm_and_si128(x0, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x10);
    t = _mm_and_si128(t, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_extract_epi32(x0, 1);
}

/* crc_clmul that also stores every 16 bytes it loads into d. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_clmul_copy(uint32_t c, uint8_t *d,
                                                                         const uint8_t *p, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
#define LD(off) ld_st(p + (off), d + (off))
    __m128i x0, x1, x2, x3, y;
#define ld_st(src, dst) (y = _mm_loadu_si128((const __m128i *)(src)), _mm_storeu_si128((__m128i *)(dst), y), y)
    x0 = LD(0);
    x1 = LD(16);
    x2 = LD(32);
    x3 = LD(48);
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
    p += 64;
    d += 64;
    n -= 64;
    while (n >= 64) {
        x0 = crc_fold(x0, k1k2, LD(0));
        x1 = crc_fold(x1, k1k2, LD(16));
        x2 = crc_fold(x2, k1k2, LD(32));
        x3 = crc_fold(x3, k1k2, LD(48));
        p += 64;
        d += 64;
        n -= 64;
    }
    x0 = crc_fold(x0, k3k4, x1);
    x0 = crc_fold(x0, k3k4, x2);
    x0 = crc_fold(x0, k3k4, x3);
    while (n >= 16) {
        x0 = crc_fold(x0, k3k4, LD(0));
        p += 16;
        d += 16;
        n -= 16;
    }
#undef LD
#undef ld_st
    __m128i t = _mm_clmulepi64_si128(x0, k3k4, 0x10);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    t = _mm_srli_si128(x0, 4);
    x0 = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00);
    x0 = _mm_xor_si128(x0, t);
    t = _mm_and_si128(x0, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x10);
    t = _mm_and_si128(t, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_extract_epi32(x0, 1);
}

static int crc_have_clmul = -1;
static void crc_detect(void) {
    __builtin_cpu_init();
    crc_have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}
static pthread_once_t crc_detect_once = PTHREAD_ONCE_INIT;
#endif

uint32_t arl_crc32_update(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_tab_once, crc_tab_init);
    if (!n) return crc;
    const uint8_t *p = (const uint8_t *)data;
    uint32_t c = ~crc;
#ifdef ARL_CRC_HAVE_CLMUL
    pthread_once(&crc_detect_once, crc_detect);
    if (n >= 64 && crc_have_clmul) {
        size_t m = n & ~(size_t)15;
        c = crc_clmul(c, p, m);
        p += m;
        n -= m;
    }
#endif
    return ~crc_slice8(c, p, n);
}

uint32_t arl_crc32_copy(void *dst, const void *src, size_t n, uint32_t crc) {
    pthread_once(&crc_tab_once, crc_tab_init);
    if (!n) return crc;
    const uint8_t *p = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    uint32_t c = ~crc;
#ifdef ARL_CRC_HAVE_CLMUL
    pthread_once(&crc_detect_once, crc_detect);
    if (n >= 64 && crc_have_clmul) {
        size_t m = n & ~(size_t)15;
        c = crc_clmul_copy(c, d, p, m);
        p += m;
        d += m;
        n -= m;
    }
#endif
    memcpy(d, p, n);
    return ~crc_slice8(c, p, n);
}

uint32_t arl_crc32(const void *data, size_t n) {
    return arl_crc32_update(0, data, n);
}
