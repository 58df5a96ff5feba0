/* core/deflate.h: a small, fast zlib-stream (RFC 1950) writer for the per-token arrays of tensor
 * blobs (codec 1, spec/replay.md section 5.1).  It finds only the matches that such arrays are
 * made of -- a repeat of the previous element (runs of equal ids, versions, mask values, the
 * 0.0 log-probabilities of context tokens) -- and codes them with the fixed Huffman code of
 * RFC 1951; a stretch of literals that code would not shrink goes into a stored block instead
 * (never larger, and it decodes as one copy).  The stream ends with an empty final block.
 * Arrays without runs do not shrink (the caller then keeps codec 0).
 * Not a general-purpose compressor: no hash chains, no dynamic Huffman codes.  Decoded by
 * core/inflate.h and by any zlib. */
#ifndef ARL_CORE_DEFLATE_H
#define ARL_CORE_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Encode in[0..n) as a zlib stream into out[0..out_cap); *out_len = its size.  elem (1, 2, 4
 * or 8) is the element size of the array: matches repeat the previous element (distance elem)
 * or the previous byte (distance 1).  ARL_ERR_RANGE, with out partly written, when the stream
 * would not fit out_cap: a caller that wants codec 1 only when it saves at least x % passes
 * out_cap = (1 - x/100) * n and keeps the raw bytes on ARL_ERR_RANGE.  ARL_ERR_ARG for a bad
 * elem.  Deterministic: the same input gives the same bytes. */
arl_status arl_zlib_encode(const uint8_t *in, size_t n, size_t elem, uint8_t *out, size_t out_cap,
                           size_t *out_len);

#endif
