/* core/dtype.h: element types of stored tensors and arrays (safetensors, .npy, replay blobs),
 * their sizes and names, and conversions between them and fp32.
 *
 * This is the one place that knows bit layouts of bf16/f16/f8.  It is not a tensor library:
 * there are no shapes here, only element types and flat arrays of n elements.
 *
 * Byte order: every stored format agentrl reads or writes is little-endian, and so is every
 * host it builds for (x86-64, aarch64); "raw bytes" below means the host/little-endian layout.
 * Raw source pointers need no alignment (conversions read through memcpy).
 *
 * Conversions:
 *   - to fp32 (arl_dtype_to_f32): exact for F32, BF16, F16, F8_*, U8, I8, BOOL, I16, U16;
 *     F64 is rounded to nearest fp32 (overflow gives +-inf); I32/U32/I64/U64 are rounded to
 *     nearest fp32 (exact only up to 2^24 in magnitude).  BOOL: any non-zero byte is 1.0.
 *   - from fp32 (arl_dtype_from_f32): F32 copy, F64 exact widening, BF16 and F16
 *     round-to-nearest-even (overflow to +-inf, f16 subnormals kept, NaN stays a quiet NaN
 *     with its sign).  Integer/bool/f8 targets are ARL_ERR_UNSUPPORTED.
 *
 * The numeric values of arl_dtype are stable (they appear in binary blob headers): append only.
 */
#ifndef ARL_CORE_DTYPE_H
#define ARL_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum arl_dtype {
    ARL_DTYPE_INVALID = 0,
    ARL_DTYPE_F32 = 1,
    ARL_DTYPE_F64 = 2,
    ARL_DTYPE_BF16 = 3,
    ARL_DTYPE_F16 = 4,
    ARL_DTYPE_U8 = 5,
    ARL_DTYPE_I8 = 6,
    ARL_DTYPE_I16 = 7,
    ARL_DTYPE_U16 = 8,
    ARL_DTYPE_I32 = 9,
    ARL_DTYPE_U32 = 10,
    ARL_DTYPE_I64 = 11,
    ARL_DTYPE_U64 = 12,
    ARL_DTYPE_BOOL = 13,    /* one byte per element, 0 or 1 */
    ARL_DTYPE_F8_E4M3 = 14, /* "F8_E4M3" (e4m3fn: bias 7, no inf, S.1111.111 = NaN); read only */
    ARL_DTYPE_F8_E5M2 = 15, /* "F8_E5M2" (bias 15, IEEE-like); read only */
    ARL_DTYPE_COUNT_
} arl_dtype;

/* Bytes per element; 0 for ARL_DTYPE_INVALID or an out-of-range value. */
size_t arl_dtype_size(arl_dtype dt);

/* 1 if dt is a floating-point type (F32, F64, BF16, F16, F8_*), else 0. */
int arl_dtype_is_float(arl_dtype dt);

/* The safetensors name ("F32", "BF16", "U8", "BOOL", "F8_E4M3", ...); "INVALID" for an
 * invalid value.  Static string, never NULL. */
const char *arl_dtype_name(arl_dtype dt);

/* Inverse of arl_dtype_name (exact, case-sensitive match); ARL_DTYPE_INVALID if unknown. */
arl_dtype arl_dtype_from_name(const char *name);

/* The NumPy descr ("<f4", "<f8", "<i4", "<i8", "|u1", "|i1", "|b1", "<f2", "<i2", "<u2",
 * "<u4", "<u8"); NULL for dtypes without one (BF16, F8_*, INVALID).  Static string. */
const char *arl_dtype_npy_descr(arl_dtype dt);

/* Inverse of arl_dtype_npy_descr; also accepts "=" or "|" as the byte-order mark for 1-byte
 * types and "=" (native = little) for wider ones.  ARL_DTYPE_INVALID if unknown or big-endian. */
arl_dtype arl_dtype_from_npy_descr(const char *descr);

/* Scalar conversions (bit patterns as uint16_t / uint8_t). */
float arl_bf16_to_f32(uint16_t h);  /* exact */
uint16_t arl_f32_to_bf16(float x);  /* round to nearest even; NaN -> quiet NaN */
float arl_f16_to_f32(uint16_t h);   /* exact, incl. subnormals, inf, NaN */
uint16_t arl_f32_to_f16(float x);   /* round to nearest even; overflow -> inf */
float arl_f8e4m3_to_f32(uint8_t b); /* exact */
float arl_f8e5m2_to_f32(uint8_t b); /* exact */

/* Convert n elements of raw type src_dt at src (any alignment) into dst (n floats).
 * ARL_ERR_ARG for an invalid dtype.  src and dst must not overlap. */
arl_status arl_dtype_to_f32(arl_dtype src_dt, const void *src, float *dst, size_t n);

/* Convert n floats at src into n elements of type dst_dt at dst (any alignment).
 * ARL_ERR_UNSUPPORTED for integer, bool and f8 targets. src and dst must not overlap. */
arl_status arl_dtype_from_f32(arl_dtype dst_dt, const float *src, void *dst, size_t n);

/* Convert n elements between two types: a memcpy when src_dt == dst_dt (any type),
 * otherwise through fp32 (arl_dtype_to_f32 then arl_dtype_from_f32, in chunks, no
 * allocation).  Same errors as those two.  src and dst must not overlap. */
arl_status arl_dtype_convert(arl_dtype src_dt, const void *src, arl_dtype dst_dt, void *dst,
                             size_t n);

#endif
