/* kernels/cpu/vec.h: private fp32 vector primitives of the CPU kernels (not a contract; the
 * contract of the array functions built on them is kernels/vmath.h).
 *
 * Written with the GCC/Clang vector extensions in portable C: no intrinsics.  VEC_N lanes, 4 by
 * default (one SSE2 or NEON register); a file compiled for AVX2 (kernels/cpu/vmath_avx2.c)
 * defines VEC_N 8 before including this header.  Every operation is an IEEE fp32 operation per
 * lane, and ISO C mode (-std=c11) keeps -ffp-contract=off (no fused multiply-adds), so a lane
 * computes exactly what the same sequence of scalar operations would: an element's value never
 * depends on its lane, its position in the array or the vector width (4 or 8).  Callers handle
 * array tails by running the same vector code on a zero-padded copy, so tails get the same bits.
 *
 * Functions (one lane each, x any fp32 including +-0, +-inf, NaN and subnormals):
 *   vec_exp      e^x: Cody-Waite reduction x = n ln2 + r, |r| <= ~0.35, e^r = 1 + r + r^2 P(r)
 *                with a degree-4 P fitted for relative error 3.5e-9 (float64 fit, coefficients
 *                rounded to fp32), 2^n applied as 2^(n/2) 2^(n - n/2) so that the subnormal
 *                range rounds once.  Overflow to +inf above ~88.72, 0 below ~-103.97, NaN in
 *                NaN out.  Max error measured < 1 ulp (tests/kernels/test_vmath.c).
 *   vec_sigmoid  1/(1+e^-x) as (x >= 0 ? 1 : e)/(1 + e), e = exp(-|x|) (no overflow; tiny
 *                results keep full relative precision).  < 2.5 ulp.
 *   vec_tanh     |x| < 0.625: x + x^3 Q(x^2), Q degree 4 (fit 4.4e-9 relative); otherwise
 *                sign(x) (1 - e)/(1 + e), e = exp(-2|x|).  < 2 ulp; exactly +-1 for |x| > 9.1.
 *                A vector whose lanes are all small skips the exp (same bits).
 * The reductions (vec_hsum) are defined for VEC_N == 4 only.
 */
#ifndef ARL_KERNELS_CPU_VEC_H
#define ARL_KERNELS_CPU_VEC_H

#include <stdint.h>
#include <string.h>

#ifndef VEC_N
#define VEC_N 4
#endif

/* Every function here is forced inline, so a vector never crosses a call. */
#define VEC_FN static inline __attribute__((always_inline))

typedef float vec_f __attribute__((vector_size(4 * VEC_N)));
typedef int32_t vec_i __attribute__((vector_size(4 * VEC_N)));
/* Integer lane arithmetic is done unsigned (wrapping, never undefined): what a signed sum
 * gives whenever it does not overflow, and UBSan has no per-lane overflow check to insert
 * (with one, the sanitized build computed these functions one lane at a time). */
typedef uint32_t vec_u __attribute__((vector_size(4 * VEC_N)));
/* An unaligned vector in memory, which may alias floats: a load or store through it is one
 * access, which AddressSanitizer checks once (no local copy whose shadow it would mark). */
typedef float vec_f_mem __attribute__((vector_size(4 * VEC_N), aligned(4), may_alias));

/* v in every lane (a scalar operand of a vector operation is broadcast; adding to integer
 * zeros keeps every bit, -0 and NaN payloads included).  No local written lane by lane: under
 * AddressSanitizer such a local's shadow was marked and cleared at every call, which made the
 * sanitized build's SiTU-GLU rows (kernels/cpu/vmath_map.h) several times slower. */
VEC_FN vec_i vec_set1i(int32_t v) {
    const vec_u zero = {0};
    return (vec_i)(zero + (uint32_t)v);
}

VEC_FN vec_f vec_set1(float v) {
    union {
        float f;
        int32_t i;
    } b = {v};
    return (vec_f)vec_set1i(b.i);
}

VEC_FN vec_f vec_load(const float *p) {
    return *(const vec_f_mem *)p;
}

VEC_FN void vec_store(float *p, vec_f v) {
    *(vec_f_mem *)p = v;
}

/* Lanes i < n of p (n < VEC_N), the others 0. */
VEC_FN vec_f vec_load_part(const float *p, int64_t n) {
    float t[VEC_N] = {0};
    memcpy(t, p, sizeof(float) * (size_t)n);
    return vec_load(t);
}

VEC_FN void vec_store_part(float *p, vec_f v, int64_t n) {
    float t[VEC_N];
    vec_store(t, v);
    memcpy(p, t, sizeof(float) * (size_t)n);
}

/* m ? a : b per lane, m a comparison result (all ones or all zeros per lane). */
VEC_FN vec_f vec_select(vec_i m, vec_f a, vec_f b) {
    return (vec_f)((m & (vec_i)a) | (~m & (vec_i)b));
}

VEC_FN vec_f vec_abs(vec_f x) {
    return (vec_f)((vec_i)x & vec_set1i(0x7fffffff));
}

/* |x| with the sign of s. */
VEC_FN vec_f vec_copysign(vec_f x, vec_f s) {
    return (vec_f)(((vec_i)x & vec_set1i(0x7fffffff)) |
                   ((vec_i)s & vec_set1i((int32_t)0x80000000)));
}

#if VEC_N == 4
VEC_FN float vec_hsum(vec_f v) {
    /* fixed pairwise order: (0 + 2) + (1 + 3) */
    return (v[0] + v[2]) + (v[1] + v[3]);
}
#endif

VEC_FN vec_f vec_exp(vec_f x) {
    const vec_f lo = vec_set1(-104.0f), hi = vec_set1(88.8f);
    const vec_f shift = vec_set1(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vec_i nan = x != x;
    vec_f xc = vec_select(nan, vec_set1(0.0f), x); /* NaN: computed as 0, returned as NaN */
    xc = vec_select(xc < lo, lo, xc);
    xc = vec_select(xc > hi, hi, xc);
    vec_f t = xc * vec_set1(1.44269504088896341f) + shift;
    vec_f nf = t - shift;                             /* n = round(x / ln2), |n| <= 150 */
    vec_i n = (vec_i)((vec_u)t - (vec_u)shift);       /* the same n as an integer */
    vec_f r = xc - nf * vec_set1(0.693145751953125f); /* ln2 high part: exact product */
    r = r - nf * vec_set1(1.428606820309417e-06f);    /* ln2 low part */
    vec_f p = vec_set1(1.3811660464853048e-03f);
    p = p * r + vec_set1(8.370134979486465e-03f);
    p = p * r + vec_set1(4.166852682828903e-02f);
    p = p * r + vec_set1(1.6666509211063385e-01f);
    p = p * r + vec_set1(4.999999403953552e-01f);
    p = (p * (r * r) + r) + vec_set1(1.0f);
    /* n1 and n2 each in [-75, 64]: normal powers of two */
    vec_i n1 = n >> 1, n2 = (vec_i)((vec_u)n - (vec_u)n1);
    vec_f s1 = (vec_f)(((vec_u)n1 + 127u) << 23), s2 = (vec_f)(((vec_u)n2 + 127u) << 23);
    return vec_select(nan, x + x, (p * s1) * s2);
}

VEC_FN vec_f vec_sigmoid(vec_f x) {
    vec_f e = vec_exp(-vec_abs(x));
    vec_f num = vec_select(x >= vec_set1(0.0f), vec_set1(1.0f), e);
    return num / (vec_set1(1.0f) + e);
}

VEC_FN vec_f vec_tanh(vec_f x) {
    vec_f ax = vec_abs(x);
    /* small |x|: odd polynomial */
    vec_f z = x * x;
    vec_f q = vec_set1(-5.704978480935097e-03f);
    q = q * z + vec_set1(2.0639078691601753e-02f);
    q = q * z + vec_set1(-5.373971164226532e-02f);
    q = q * z + vec_set1(1.3331441581249237e-01f);
    q = q * z + vec_set1(-3.333328068256378e-01f);
    vec_f ts = x + (x * z) * q;
    vec_i small = ax < vec_set1(0.625f);
    int all_small = 1;
    for (int i = 0; i < VEC_N; i++)
        all_small &= small[i] != 0;
    if (all_small) return vec_copysign(ts, x); /* the same bits as below, without the exp */
    /* large |x|: (1 - e) / (1 + e) with e = exp(-2|x|) <= e^-1.25 */
    vec_f e = vec_exp(vec_set1(-2.0f) * ax);
    vec_f tl = (vec_set1(1.0f) - e) / (vec_set1(1.0f) + e);
    return vec_copysign(vec_select(small, ts, tl), x); /* odd, -0 kept */
}

#endif
