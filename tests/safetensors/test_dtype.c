/* tests/safetensors/test_dtype.c: core/dtype.h names, sizes and conversions.
 *
 * bf16 and f16 are checked exhaustively over all 65536 bit patterns against a reference
 * formula evaluated in double (sign * 2^(e - bias) * (1 + m / 2^mbits), subnormals
 * sign * 2^(1 - bias) * m / 2^mbits).  Encoding is checked for every finite pattern: the
 * exact value encodes to itself, the midpoint to the next pattern rounds to the even one,
 * and the f32 neighbours of the midpoint round to the nearer one.  Comparisons are exact:
 * these conversions are exact or correctly rounded by definition, so no tolerance applies.
 */
#include <float.h>
#include <math.h>

#include "core/dtype.h"
#include "tests/test.h"

static double ref_decode(uint32_t bits, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1;
    uint32_t sign = bits >> (ebits + mbits);
    uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
    uint32_t m = bits & ((1u << mbits) - 1);
    double s = sign ? -1.0 : 1.0;
    if (e == (1u << ebits) - 1) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp((double)m, 1 - bias - mbits);
    return s * ldexp(1.0 + ldexp((double)m, -mbits), (int)e - bias);
}

static int same_f32(float a, double ref) {
    if (isnan(ref)) return isnan(a);
    if (a != (float)ref) return 0;
    return !signbit(a) == !signbit(ref); /* -0 vs +0 */
}

/* Check encode(x) over the neighbourhood of pattern h (finite, non-NaN), both types. */
typedef uint16_t (*enc_fn)(float);
typedef float (*dec_fn)(uint16_t);

static int check_encode(const char *what, uint16_t h, enc_fn enc, dec_fn dec) {
    int bad = 0;
    float v = dec(h);
    if (enc(v) != h) {
        fprintf(stderr, "%s: encode(decode(0x%04x) = %.9g) = 0x%04x\n", what, h, v, enc(v));
        bad++;
    }
    /* next pattern away from zero in the same sign; skip if it is inf/nan */
    uint16_t up = (uint16_t)(h + 1);
    float vu = dec(up);
    if (!isfinite(vu) || ((up ^ h) & 0x8000)) return bad;
    double mid = ((double)v + (double)vu) / 2; /* exact in double, and in float (checked) */
    float midf = (float)mid;
    if ((double)midf != mid) {
        fprintf(stderr, "%s: midpoint of 0x%04x not exact in f32\n", what, h);
        return bad + 1;
    }
    uint16_t even = (h & 1) ? up : h;
    if (enc(midf) != even) {
        fprintf(stderr, "%s: midpoint %.9g between 0x%04x and 0x%04x encoded 0x%04x\n", what, midf,
                h, up, enc(midf));
        bad++;
    }
    float below = nextafterf(midf, v), above = nextafterf(midf, vu);
    if (enc(below) != h || enc(above) != up) {
        fprintf(stderr, "%s: neighbours of midpoint 0x%04x/0x%04x: 0x%04x 0x%04x\n", what, h, up,
                enc(below), enc(above));
        bad++;
    }
    return bad;
}

static void test_bf16_exhaustive(void) {
    int bad_dec = 0, bad_enc = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = ref_decode(h, 8, 7);
        float v = arl_bf16_to_f32((uint16_t)h);
        if (!same_f32(v, ref)) {
            if (bad_dec++ < 5) fprintf(stderr, "bf16 0x%04x -> %.9g, ref %.9g\n", h, v, ref);
        }
        if (isnan(ref)) {
            uint16_t r = arl_f32_to_bf16(v);
            /* NaN stays NaN, keeps sign, becomes quiet */
            if (!isnan(arl_bf16_to_f32(r)) || (r & 0x8000) != (h & 0x8000) || !(r & 0x40))
                bad_enc++;
            continue;
        }
        bad_enc += check_encode("bf16", (uint16_t)h, arl_f32_to_bf16, arl_bf16_to_f32);
    }
    CHECK_EQ_INT(bad_dec, 0);
    CHECK_EQ_INT(bad_enc, 0);
    /* overflow: above the largest finite bf16 midpoint rounds to inf */
    CHECK_EQ_INT(arl_f32_to_bf16(FLT_MAX), 0x7f80);
    CHECK_EQ_INT(arl_f32_to_bf16(-FLT_MAX), 0xff80);
    CHECK_EQ_INT(arl_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(arl_f32_to_bf16(1.0f), 0x3f80);
    /* f32 subnormal: bf16 keeps f32's exponent range, so tiny values round like normals */
    float tiny;
    uint32_t tb = 0x00018000u; /* halfway between bf16 0x0001 and 0x0002 -> even 0x0002 */
    memcpy(&tiny, &tb, 4);
    CHECK_EQ_INT(arl_f32_to_bf16(tiny), 0x0002);
}

static void test_f16_exhaustive(void) {
    int bad_dec = 0, bad_enc = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = ref_decode(h, 5, 10);
        float v = arl_f16_to_f32((uint16_t)h);
        if (!same_f32(v, ref)) {
            if (bad_dec++ < 5) fprintf(stderr, "f16 0x%04x -> %.9g, ref %.9g\n", h, v, ref);
        }
        if (isnan(ref)) {
            uint16_t r = arl_f32_to_f16(v);
            if (!isnan(arl_f16_to_f32(r)) || (r & 0x8000) != (h & 0x8000) || !(r & 0x200))
                bad_enc++;
            /* payload's top bits survive the round trip */
            if ((r & 0x1ff) != (h & 0x1ff)) bad_enc++;
            continue;
        }
        bad_enc += check_encode("f16", (uint16_t)h, arl_f32_to_f16, arl_f16_to_f32);
    }
    CHECK_EQ_INT(bad_dec, 0);
    CHECK_EQ_INT(bad_enc, 0);
    CHECK_EQ_INT(arl_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(arl_f32_to_f16(65519.996f), 0x7bff); /* just below the midpoint to inf */
    CHECK_EQ_INT(arl_f32_to_f16(65520.0f), 0x7c00);   /* midpoint: ties to even = inf */
    CHECK_EQ_INT(arl_f32_to_f16(1e30f), 0x7c00);
    CHECK_EQ_INT(arl_f32_to_f16(-INFINITY), 0xfc00);
    CHECK_EQ_INT(arl_f32_to_f16(ldexpf(1, -24)), 0x0001);  /* smallest subnormal */
    CHECK_EQ_INT(arl_f32_to_f16(ldexpf(1, -25)), 0x0000);  /* half of it: ties to even 0 */
    CHECK_EQ_INT(arl_f32_to_f16(ldexpf(3, -26)), 0x0001);  /* 0.75 ulp: up */
    CHECK_EQ_INT(arl_f32_to_f16(-ldexpf(1, -26)), 0x8000); /* below half: -0 */
    CHECK_EQ_INT(arl_f32_to_f16(ldexpf(1, -140)), 0x0000); /* f32 subnormal */
    CHECK_EQ_INT(arl_f32_to_f16(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400); /* tie -> normal */
}

static void test_f8(void) {
    int bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        /* e4m3fn: like an IEEE e4m3 but the exponent-15 codes are finite except m=7 (NaN) */
        uint32_t e = (b >> 3) & 15, m = b & 7;
        double ref;
        if (e == 15 && m == 7)
            ref = NAN;
        else if (e == 0)
            ref = ldexp((double)m, -9);
        else
            ref = ldexp(1.0 + m / 8.0, (int)e - 7);
        if (b & 0x80) ref = -ref;
        if (!same_f32(arl_f8e4m3_to_f32((uint8_t)b), ref)) bad++;
        if (!same_f32(arl_f8e5m2_to_f32((uint8_t)b), ref_decode(b, 5, 2))) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(arl_f8e4m3_to_f32(0x7e) == 448.0f); /* largest e4m3fn */
}

static void test_names(void) {
    for (int i = 1; i < ARL_DTYPE_COUNT_; i++) {
        arl_dtype dt = (arl_dtype)i;
        CHECK(arl_dtype_size(dt) > 0);
        CHECK_EQ_INT(arl_dtype_from_name(arl_dtype_name(dt)), dt);
        const char *d = arl_dtype_npy_descr(dt);
        if (d) CHECK_EQ_INT(arl_dtype_from_npy_descr(d), dt);
    }
    CHECK_EQ_INT(arl_dtype_size(ARL_DTYPE_BF16), 2);
    CHECK_EQ_INT(arl_dtype_size(ARL_DTYPE_I64), 8);
    CHECK_EQ_INT(arl_dtype_size(ARL_DTYPE_BOOL), 1);
    CHECK_EQ_INT(arl_dtype_size(ARL_DTYPE_INVALID), 0);
    CHECK_EQ_INT(arl_dtype_size((arl_dtype)999), 0);
    CHECK_STR_EQ(arl_dtype_name(ARL_DTYPE_BF16), "BF16");
    CHECK_STR_EQ(arl_dtype_name((arl_dtype)999), "INVALID");
    CHECK_EQ_INT(arl_dtype_from_name("bf16"), ARL_DTYPE_INVALID); /* case-sensitive */
    CHECK_EQ_INT(arl_dtype_from_name("F8_E4M3"), ARL_DTYPE_F8_E4M3);
    CHECK_EQ_INT(arl_dtype_from_name(NULL), ARL_DTYPE_INVALID);
    CHECK_EQ_INT(arl_dtype_from_npy_descr("<f4"), ARL_DTYPE_F32);
    CHECK_EQ_INT(arl_dtype_from_npy_descr("=f4"), ARL_DTYPE_F32);
    CHECK_EQ_INT(arl_dtype_from_npy_descr(">f4"), ARL_DTYPE_INVALID);
    CHECK_EQ_INT(arl_dtype_from_npy_descr("|u1"), ARL_DTYPE_U8);
    CHECK_EQ_INT(arl_dtype_from_npy_descr("|b1"), ARL_DTYPE_BOOL);
    CHECK_EQ_INT(arl_dtype_from_npy_descr("<U8"), ARL_DTYPE_INVALID);
    CHECK(arl_dtype_npy_descr(ARL_DTYPE_BF16) == NULL);
    CHECK(arl_dtype_is_float(ARL_DTYPE_BF16) && !arl_dtype_is_float(ARL_DTYPE_I32));
}

static void test_arrays(void) {
    /* unaligned sources: conversions read through memcpy */
    unsigned char raw[1 + 8 * 4];
    float out[4];
    double dv[4] = {1.5, -2.25, 1e300, 3.0000001};
    memcpy(raw + 1, dv, sizeof dv);
    CHECK(arl_dtype_to_f32(ARL_DTYPE_F64, raw + 1, out, 4) == ARL_OK);
    CHECK(out[0] == 1.5f && out[1] == -2.25f && isinf(out[2]) && out[3] == (float)3.0000001);
    int64_t iv[3] = {-5, 1LL << 40, 16777217};
    memcpy(raw + 1, iv, sizeof iv);
    CHECK(arl_dtype_to_f32(ARL_DTYPE_I64, raw + 1, out, 3) == ARL_OK);
    CHECK(out[0] == -5.0f && out[1] == ldexpf(1, 40) && out[2] == 16777216.0f);
    unsigned char bv[3] = {0, 1, 7};
    CHECK(arl_dtype_to_f32(ARL_DTYPE_BOOL, bv, out, 3) == ARL_OK);
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 1);
    int8_t i8[2] = {-128, 127};
    CHECK(arl_dtype_to_f32(ARL_DTYPE_I8, i8, out, 2) == ARL_OK);
    CHECK(out[0] == -128 && out[1] == 127);

    /* from f32 and convert: 3000 elements crosses the 1024-element chunk of convert */
    enum { N = 3000 };
    static float src[N], back[N];
    static uint16_t h[N], h2[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)sin(i * 0.37) * 100.0f;
    CHECK(arl_dtype_from_f32(ARL_DTYPE_BF16, src, (unsigned char *)raw, 0) == ARL_OK);
    CHECK(arl_dtype_from_f32(ARL_DTYPE_BF16, src, h, N) == ARL_OK);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != arl_f32_to_bf16(src[i]);
    CHECK_EQ_INT(bad, 0);
    /* BF16 -> F16 via convert equals f16(bf16 value) */
    CHECK(arl_dtype_convert(ARL_DTYPE_BF16, h, ARL_DTYPE_F16, h2, N) == ARL_OK);
    for (int i = 0; i < N; i++)
        bad += h2[i] != arl_f32_to_f16(arl_bf16_to_f32(h[i]));
    CHECK_EQ_INT(bad, 0);
    CHECK(arl_dtype_convert(ARL_DTYPE_BF16, h, ARL_DTYPE_F32, back, N) == ARL_OK);
    for (int i = 0; i < N; i++)
        bad += back[i] != arl_bf16_to_f32(h[i]);
    CHECK_EQ_INT(bad, 0);
    CHECK(arl_dtype_convert(ARL_DTYPE_I32, iv, ARL_DTYPE_I32, h2, 2) == ARL_OK); /* memcpy */
    CHECK(!memcmp(h2, iv, 8));
    CHECK(arl_dtype_from_f32(ARL_DTYPE_I32, src, h2, 1) == ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), "I32") != NULL);
    CHECK(arl_dtype_convert(ARL_DTYPE_F32, src, ARL_DTYPE_U8, h2, 4) == ARL_ERR_UNSUPPORTED);
    CHECK(arl_dtype_to_f32(ARL_DTYPE_INVALID, src, out, 1) == ARL_ERR_ARG);
    CHECK(arl_dtype_from_f32((arl_dtype)77, src, h2, 1) == ARL_ERR_ARG);
}

int main(void) {
    TEST_RUN(test_names);
    TEST_RUN(test_bf16_exhaustive);
    TEST_RUN(test_f16_exhaustive);
    TEST_RUN(test_f8);
    TEST_RUN(test_arrays);
    return test_finish();
}
