/* envs/builtin/png_write.h: a minimal PNG encoder for the built-in environments' images.
 *
 * Writes 8-bit RGB, non-interlaced PNG files whose zlib stream uses stored (uncompressed)
 * deflate blocks, with the chunk CRC-32s and the zlib Adler-32 a decoder checks (core/crc32.h,
 * core/inflate.h arl_adler32).  The output
 * is a deterministic function of the pixels.  Not a decoder, not a compressor: images here are
 * tiny (28x28 to 112x112), so the missing compression costs a few KiB at most.
 */
#ifndef ARL_ENVS_BUILTIN_PNG_WRITE_H
#define ARL_ENVS_BUILTIN_PNG_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Encode rgb (height rows of width*3 bytes, top row first) as a PNG file.  1 <= width, height
 * <= 4096.  *png is malloc'd (caller frees) with *len bytes.  ARL_ERR_ARG on bad sizes,
 * ARL_ERR_NOMEM. */
arl_status arl_png_write_rgb(const uint8_t *rgb, int32_t width, int32_t height, uint8_t **png,
                             size_t *len);

#endif
