/* policy/image.h: image input for the policy: PNG and PPM decoding to RGB8, the choice of
 * the patch grid, and resizing + normalising into patches (spec/policy.md §10.1).
 * Not the vision tower (policy/vision.c) and not an image encoder.
 *
 * Decoding accepts: PNG (8-bit gray, gray+alpha, RGB, RGBA, palette at 1/2/4/8 bits, gray at
 * 1/2/4/16 bits, RGB/RGBA at 16 bits; non-interlaced), and binary (P6) or ASCII (P3) PPM.
 * Alpha is dropped (pixels are taken as they are stored). Anything else, a truncated file, a
 * CRC mismatch or an image above the pixel limit is a clear error naming the file. */
#ifndef ARL_POLICY_IMAGE_H
#define ARL_POLICY_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct arl_image {
    int32_t width, height;
    uint8_t *rgb; /* (height, width, 3) row-major; owned, freed by arl_image_free */
} arl_image;

/* Default upper bound on width*height for decoding (16.7 Mpixel). */
#define ARL_IMAGE_MAX_PIXELS_DEFAULT (4096LL * 4096LL)

/* Decode PNG or PPM bytes (detected by signature). `name` is used in messages.
 * On success *out owns a new buffer; on failure *out is zeroed. */
arl_status arl_image_decode(const uint8_t *data, size_t n, int64_t max_pixels, const char *name,
                            arl_image *out);
/* Read and decode a file. */
arl_status arl_image_load(const char *path, int64_t max_pixels, arl_image *out);
void arl_image_free(arl_image *img);

/* Patch grid for an image: gh x gw patches of `patch` pixels, both even and >= 2, chosen as
 * the even numbers nearest to height/patch and width/patch, then scaled down (keeping the
 * aspect ratio) until gh*gw <= max_patches. max_patches >= 4. */
arl_status arl_image_grid(int32_t width, int32_t height, int32_t patch, int64_t max_patches,
                          int32_t *gh, int32_t *gw);

/* Resize img bilinearly (half-pixel centres, as torch's interpolate(align_corners=False)) to
 * (gh*patch, gw*patch) and cut it into patches in row-major grid order, each patch
 * channel-major (3, patch, patch), pixels normalised as (x/255 - 0.5)/0.5.
 * patches: (gh*gw, 3, patch, patch) fp32, caller-allocated. */
void arl_image_patchify(const arl_image *img, int32_t patch, int32_t gh, int32_t gw,
                        float *patches);

#endif
