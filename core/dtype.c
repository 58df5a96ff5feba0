/* core/dtype.c: element sizes, names and fp32 conversions of arl_dtype (see core/dtype.h).
 * Bit-level conversions use integer arithmetic only, so results do not depend on the FPU
 * rounding mode or on flush-to-zero settings. */
#include "core/dtype.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "agentrl's stored formats assume a little-endian host"
#endif

typedef struct dtype_info {
    const char *name;  /* safetensors name */
    const char *descr; /* numpy descr or NULL */
    size_t size;
    int is_float;
} dtype_info;

static const dtype_info DTYPES[ARL_DTYPE_COUNT_] = {
    [ARL_DTYPE_INVALID] = {"INVALID", NULL, 0, 0}, [ARL_DTYPE_F32] = {"F32", "<f4", 4, 1},
    [ARL_DTYPE_F64] = {"F64", "<f8", 8, 1},        [ARL_DTYPE_BF16] = {"BF16", NULL, 2, 1},
    [ARL_DTYPE_F16] = {"F16", "<f2", 2, 1},        [ARL_DTYPE_U8] = {"U8", "|u1", 1, 0},
    [ARL_DTYPE_I8] = {"I8", "|i1", 1, 0},          [ARL_DTYPE_I16] = {"I16", "<i2", 2, 0},
    [ARL_DTYPE_U16] = {"U16", "<u2", 2, 0},        [ARL_DTYPE_I32] = {"I32", "<i4", 4, 0},
    [ARL_DTYPE_U32] = {"U32", "<u4", 4, 0},        [ARL_DTYPE_I64] = {"I64", "<i8", 8, 0},
    [ARL_DTYPE_U64] = {"U64", "<u8", 8, 0},        [ARL_DTYPE_BOOL] = {"BOOL", "|b1", 1, 0},
    [ARL_DTYPE_F8_E4M3] = {"F8_E4M3", NULL, 1, 1}, [ARL_DTYPE_F8_E5M2] = {"F8_E5M2", NULL, 1, 1},
};

static int valid(arl_dtype dt) {
    return dt > ARL_DTYPE_INVALID && dt < ARL_DTYPE_COUNT_;
}

size_t arl_dtype_size(arl_dtype dt) {
    return valid(dt) ? DTYPES[dt].size : 0;
}

int arl_dtype_is_float(arl_dtype dt) {
    return valid(dt) ? DTYPES[dt].is_float : 0;
}

const char *arl_dtype_name(arl_dtype dt) {
    return valid(dt) ? DTYPES[dt].name : "INVALID";
}

arl_dtype arl_dtype_from_name(const char *name) {
    if (!name) return ARL_DTYPE_INVALID;
    for (int i = 1; i < ARL_DTYPE_COUNT_; i++)
        if (!strcmp(DTYPES[i].name, name)) return (arl_dtype)i;
    return ARL_DTYPE_INVALID;
}

const char *arl_dtype_npy_descr(arl_dtype dt) {
    return valid(dt) ? DTYPES[dt].descr : NULL;
}

arl_dtype arl_dtype_from_npy_descr(const char *descr) {
    if (!descr || strlen(descr) < 2) return ARL_DTYPE_INVALID;
    char order = descr[0];
    for (int i = 1; i < ARL_DTYPE_COUNT_; i++) {
        const char *d = DTYPES[i].descr;
        if (!d || strcmp(d + 1, descr + 1)) continue;
        if (order == d[0] || order == '=' ||
            (DTYPES[i].size == 1 && (order == '|' || order == '<')))
            return (arl_dtype)i;
    }
    return ARL_DTYPE_INVALID;
}

/* ---- scalar conversions ---- */

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float arl_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t arl_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; overflow carries into inf */
    return (uint16_t)(u >> 16);
}

float arl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0) return bits_f32(sign);
    /* subnormal: m * 2^-24; normalise the mantissa */
    int shift = 0;
    while (!(m & 0x400u)) {
        m <<= 1;
        shift++;
    }
    /* value = (m / 2^10) * 2^(-14 - shift), m now has bit 10 set */
    return bits_f32(sign | ((uint32_t)(127 - 14 - shift) << 23) | ((m & 0x3ffu) << 13));
}

uint16_t arl_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                                  /* normal f16 range */
        a -= 0x38000000u;                                    /* rebias exponent 127 -> 15 */
        a += 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | (a >> 13));
    }
    /* f16 subnormal or zero: round(|x| / 2^-24) to nearest even */
    uint32_t e = a >> 23;
    if (e == 0) return sign;                     /* f32 zero/subnormal: far below 2^-25 */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u; /* |x| = mant * 2^(e-150) */
    uint32_t shift = 126u - e;                   /* |x| / 2^-24 = mant * 2^-shift, shift >= 14 */
    if (shift >= 32) return sign;
    uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float arl_f8e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
    if (e == 0xf && m == 0x7) return bits_f32(sign | 0x7fc00000u);
    if (e != 0) return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
    if (m == 0) return bits_f32(sign);
    int shift = 0;
    while (!(m & 0x8u)) {
        m <<= 1;
        shift++;
    }
    return bits_f32(sign | ((uint32_t)(127 - 6 - shift) << 23) | ((m & 0x7u) << 20));
}

float arl_f8e5m2_to_f32(uint8_t b) {
    return arl_f16_to_f32((uint16_t)((uint16_t)b << 8));
}

/* ---- array conversions ---- */

#define LOAD(T, p, i) (memcpy(&v_, (const unsigned char *)(p) + (i) * sizeof(T), sizeof(T)), v_)

arl_status arl_dtype_to_f32(arl_dtype src_dt, const void *src, float *dst, size_t n) {
    if (!valid(src_dt))
        return arl_errorf(ARL_ERR_ARG, "dtype conversion: invalid source dtype %d", (int)src_dt);
    const unsigned char *s = src;
    switch (src_dt) {
    case ARL_DTYPE_F32:
        if (n) memcpy(dst, src, n * 4);
        break;
    case ARL_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double v_;
            dst[i] = (float)LOAD(double, s, i);
        }
        break;
    case ARL_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v_;
            dst[i] = arl_bf16_to_f32(LOAD(uint16_t, s, i));
        }
        break;
    case ARL_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v_;
            dst[i] = arl_f16_to_f32(LOAD(uint16_t, s, i));
        }
        break;
    case ARL_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            dst[i] = arl_f8e4m3_to_f32(s[i]);
        break;
    case ARL_DTYPE_F8_E5M2:
        for (size_t i = 0; i < n; i++)
            dst[i] = arl_f8e5m2_to_f32(s[i]);
        break;
    case ARL_DTYPE_U8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        break;
    case ARL_DTYPE_I8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)s[i];
        break;
    case ARL_DTYPE_BOOL:
        for (size_t i = 0; i < n; i++)
            dst[i] = s[i] ? 1.0f : 0.0f;
        break;
#define INT_CASE(DT, T)                                                                            \
    case DT:                                                                                       \
        for (size_t i = 0; i < n; i++) {                                                           \
            T v_;                                                                                  \
            dst[i] = (float)LOAD(T, s, i);                                                         \
        }                                                                                          \
        break;
        INT_CASE(ARL_DTYPE_I16, int16_t)
        INT_CASE(ARL_DTYPE_U16, uint16_t)
        INT_CASE(ARL_DTYPE_I32, int32_t)
        INT_CASE(ARL_DTYPE_U32, uint32_t)
        INT_CASE(ARL_DTYPE_I64, int64_t)
        INT_CASE(ARL_DTYPE_U64, uint64_t)
#undef INT_CASE
    default:
        return arl_errorf(ARL_ERR_INTERNAL, "dtype conversion: unhandled dtype %d", (int)src_dt);
    }
    return ARL_OK;
}

arl_status arl_dtype_from_f32(arl_dtype dst_dt, const float *src, void *dst, size_t n) {
    unsigned char *d = dst;
    switch (dst_dt) {
    case ARL_DTYPE_F32:
        if (n) memcpy(dst, src, n * 4);
        return ARL_OK;
    case ARL_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double v = (double)src[i];
            memcpy(d + i * 8, &v, 8);
        }
        return ARL_OK;
    case ARL_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v = arl_f32_to_bf16(src[i]);
            memcpy(d + i * 2, &v, 2);
        }
        return ARL_OK;
    case ARL_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v = arl_f32_to_f16(src[i]);
            memcpy(d + i * 2, &v, 2);
        }
        return ARL_OK;
    default:
        if (!valid(dst_dt))
            return arl_errorf(ARL_ERR_ARG, "dtype conversion: invalid target dtype %d",
                              (int)dst_dt);
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "dtype conversion: cannot convert fp32 values to %s (only F32, F64, "
                          "BF16 and F16 targets are supported)",
                          arl_dtype_name(dst_dt));
    }
}

arl_status arl_dtype_convert(arl_dtype src_dt, const void *src, arl_dtype dst_dt, void *dst,
                             size_t n) {
    if (src_dt == dst_dt && valid(src_dt)) {
        if (n) memcpy(dst, src, n * DTYPES[src_dt].size);
        return ARL_OK;
    }
    if (!valid(src_dt))
        return arl_errorf(ARL_ERR_ARG, "dtype conversion: invalid source dtype %d", (int)src_dt);
    if (dst_dt == ARL_DTYPE_F32) return arl_dtype_to_f32(src_dt, src, dst, n);
    /* check the target once before converting anything */
    float probe = 0;
    unsigned char tmp8[8];
    ARL_TRY(arl_dtype_from_f32(dst_dt, &probe, tmp8, 1));
    enum { CHUNK = 1024 };
    float buf[CHUNK];
    size_t ss = DTYPES[src_dt].size, ds = DTYPES[dst_dt].size;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        ARL_TRY(arl_dtype_to_f32(src_dt, (const unsigned char *)src + i * ss, buf, m));
        ARL_TRY(arl_dtype_from_f32(dst_dt, buf, (unsigned char *)dst + i * ds, m));
    }
    return ARL_OK;
}
