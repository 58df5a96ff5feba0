/* core/inflate.h: a DEFLATE (RFC 1951) and zlib-stream (RFC 1950) decoder, enough to read
 * PNG images and codec-1 tensor blobs (core/blob.h).  Not a compressor.  Output is bounded by
 * the caller's buffer; any malformed or truncated stream is an ARL_ERR_FORMAT error, never a
 * crash or an over-read. */
#ifndef ARL_CORE_INFLATE_H
#define ARL_CORE_INFLATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Decode a zlib stream (2-byte header, deflate data, Adler-32 trailer, which is checked).
 * out: caller buffer of out_cap bytes; *out_len receives the decoded size.  A stream that
 * decodes to more than out_cap bytes is ARL_ERR_RANGE. */
arl_status arl_zlib_decode(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                           size_t *out_len);

/* arl_zlib_decode that also reports the bytes the stream took, trailer included (*in_used; may
 * be NULL), so that a caller whose stream must fill its input exactly can check it. */
arl_status arl_zlib_decode_ex(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                              size_t *out_len, size_t *in_used);

/* Raw deflate data (no zlib header).  *in_used receives the bytes consumed. */
arl_status arl_inflate(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_cap,
                       size_t *out_len, size_t *in_used);

uint32_t arl_adler32(uint32_t adler, const uint8_t *p, size_t n);

#endif
