/* policy/image.c: PNG/PPM decoding, patch grid and patchify (see image.h). */
#include "policy/image.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/file.h"
#include "core/inflate.h"

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void arl_image_free(arl_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

static arl_status check_size(const char *name, int64_t w, int64_t h, int64_t max_pixels) {
    if (w <= 0 || h <= 0)
        return arl_errorf(ARL_ERR_FORMAT, "%s: image has zero or negative size %lldx%lld", name,
                          (long long)w, (long long)h);
    if (w > 65535 || h > 65535 || w * h > max_pixels)
        return arl_errorf(ARL_ERR_RANGE,
                          "%s: image of %lldx%lld pixels is larger than the limit of %lld pixels "
                          "(downscale it first)",
                          name, (long long)w, (long long)h, (long long)max_pixels);
    return ARL_OK;
}

/* ---- PNG ---- */

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    if (pa <= pb && pa <= pc) return a;
    return pb <= pc ? b : c;
}

static arl_status png_decode(const uint8_t *d, size_t n, int64_t max_pixels, const char *name,
                             arl_image *out) {
    size_t pos = 8;
    uint32_t w = 0, h = 0;
    int depth = 0, ctype = -1, seen_ihdr = 0, seen_iend = 0;
    uint8_t palette[256 * 3];
    int npal = 0;
    uint8_t *idat = NULL;
    size_t idat_len = 0, idat_cap = 0;
    arl_status s = ARL_OK;
    while (pos + 12 <= n) {
        uint32_t len = be32(d + pos);
        const uint8_t *type = d + pos + 4;
        if (len > n - pos - 12) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: PNG chunk '%.4s' runs past the end of the file", name, type);
            goto done;
        }
        const uint8_t *body = d + pos + 8;
        if (arl_crc32(type, (size_t)len + 4) != be32(body + len)) {
            s = arl_errorf(ARL_ERR_CORRUPT, "%s: PNG chunk '%.4s' has a bad CRC", name, type);
            goto done;
        }
        if (!memcmp(type, "IHDR", 4)) {
            if (len != 13 || seen_ihdr) {
                s = arl_errorf(ARL_ERR_FORMAT, "%s: bad PNG IHDR chunk", name);
                goto done;
            }
            seen_ihdr = 1;
            w = be32(body);
            h = be32(body + 4);
            depth = body[8];
            ctype = body[9];
            if (body[10] != 0 || body[11] != 0) {
                s = arl_errorf(ARL_ERR_FORMAT, "%s: unknown PNG compression or filter method", name);
                goto done;
            }
            if (body[12] != 0) {
                s = arl_errorf(ARL_ERR_UNSUPPORTED, "%s: interlaced PNG is not supported (save it non-interlaced)", name);
                goto done;
            }
            int ok = (ctype == 0 && (depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16)) ||
                     (ctype == 3 && (depth == 1 || depth == 2 || depth == 4 || depth == 8)) ||
                     ((ctype == 2 || ctype == 4 || ctype == 6) && (depth == 8 || depth == 16));
            if (!ok) {
                s = arl_errorf(ARL_ERR_FORMAT, "%s: invalid PNG color type %d with bit depth %d", name, ctype, depth);
                goto done;
            }
            if ((s = check_size(name, w, h, max_pixels)) != ARL_OK) goto done;
        } else if (!memcmp(type, "PLTE", 4)) {
            if (len % 3 || len > 768) {
                s = arl_errorf(ARL_ERR_FORMAT, "%s: bad PNG palette", name);
                goto done;
            }
            memcpy(palette, body, len);
            npal = (int)(len / 3);
        } else if (!memcmp(type, "IDAT", 4)) {
            if (!seen_ihdr) {
                s = arl_errorf(ARL_ERR_FORMAT, "%s: PNG IDAT before IHDR", name);
                goto done;
            }
            if (idat_len + len > idat_cap) {
                size_t cap = (idat_len + len) * 2 + 1024;
                uint8_t *p = realloc(idat, cap);
                if (!p) {
                    s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", name);
                    goto done;
                }
                idat = p;
                idat_cap = cap;
            }
            if (len) memcpy(idat + idat_len, body, len); /* an empty IDAT: idat may be NULL */
            idat_len += len;
        } else if (!memcmp(type, "IEND", 4)) {
            seen_iend = 1;
            break;
        } else if (!(type[0] & 0x20)) {
            s = arl_errorf(ARL_ERR_UNSUPPORTED, "%s: unknown critical PNG chunk '%.4s'", name, type);
            goto done;
        }
        pos += (size_t)len + 12;
    }
    if (!seen_ihdr || !seen_iend || !idat_len) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: truncated PNG (missing %s)", name,
                       !seen_ihdr ? "IHDR" : !idat_len ? "image data" : "IEND");
        goto done;
    }
    if (ctype == 3 && npal == 0) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: palette PNG without a PLTE chunk", name);
        goto done;
    }
    {
        int channels = ctype == 0 ? 1 : ctype == 2 ? 3 : ctype == 3 ? 1 : ctype == 4 ? 2 : 4;
        size_t bits_pp = (size_t)channels * (size_t)depth;
        size_t rowbytes = ((size_t)w * bits_pp + 7) / 8;
        size_t bpp = (bits_pp + 7) / 8;
        size_t raw_len = (rowbytes + 1) * h, got = 0;
        uint8_t *raw = malloc(raw_len);
        uint8_t *rgb = malloc((size_t)w * h * 3);
        if (!raw || !rgb) {
            free(raw);
            free(rgb);
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", name);
            goto done;
        }
        s = arl_zlib_decode(idat, idat_len, raw, raw_len, &got);
        if (s == ARL_OK && got != raw_len)
            s = arl_errorf(ARL_ERR_FORMAT, "%s: PNG image data has %zu bytes, expected %zu", name, got, raw_len);
        if (s != ARL_OK) {
            arl_error_prefix(s, "%s", name);
            free(raw);
            free(rgb);
            goto done;
        }
        /* unfilter in place: row y at raw + y*(rowbytes+1) + 1 */
        for (uint32_t y = 0; y < h && s == ARL_OK; y++) {
            uint8_t *row = raw + (size_t)y * (rowbytes + 1);
            uint8_t ft = row[0];
            uint8_t *cur = row + 1;
            const uint8_t *prev = y ? raw + (size_t)(y - 1) * (rowbytes + 1) + 1 : NULL;
            for (size_t i = 0; i < rowbytes; i++) {
                int a = i >= bpp ? cur[i - bpp] : 0;
                int b = prev ? prev[i] : 0;
                int c = prev && i >= bpp ? prev[i - bpp] : 0;
                switch (ft) {
                case 0: break;
                case 1: cur[i] = (uint8_t)(cur[i] + a); break;
                case 2: cur[i] = (uint8_t)(cur[i] + b); break;
                case 3: cur[i] = (uint8_t)(cur[i] + ((a + b) >> 1)); break;
                case 4: cur[i] = (uint8_t)(cur[i] + paeth(a, b, c)); break;
                default:
                    s = arl_errorf(ARL_ERR_FORMAT, "%s: invalid PNG filter type %d in row %u", name, ft, y);
                    i = rowbytes;
                }
            }
            if (s != ARL_OK) break;
            for (uint32_t x = 0; x < w; x++) {
                uint8_t *px = rgb + ((size_t)y * w + x) * 3;
                if (depth < 8) {
                    size_t bit = (size_t)x * depth;
                    int v = (cur[bit / 8] >> (8 - depth - bit % 8)) & ((1 << depth) - 1);
                    if (ctype == 3) {
                        if (v >= npal) {
                            s = arl_errorf(ARL_ERR_FORMAT, "%s: PNG palette index %d out of range", name, v);
                            break;
                        }
                        memcpy(px, palette + 3 * v, 3);
                    } else {
                        uint8_t g = (uint8_t)(v * 255 / ((1 << depth) - 1));
                        px[0] = px[1] = px[2] = g;
                    }
                    continue;
                }
                size_t step = depth / 8; /* 1 or 2: take the high byte of 16-bit samples */
                const uint8_t *sp = cur + (size_t)x * channels * step;
                if (ctype == 3) {
                    if (sp[0] >= npal) {
                        s = arl_errorf(ARL_ERR_FORMAT, "%s: PNG palette index %d out of range", name, sp[0]);
                        break;
                    }
                    memcpy(px, palette + 3 * sp[0], 3);
                } else if (ctype == 0 || ctype == 4) {
                    px[0] = px[1] = px[2] = sp[0];
                } else {
                    px[0] = sp[0];
                    px[1] = sp[step];
                    px[2] = sp[2 * step];
                }
            }
        }
        free(raw);
        if (s != ARL_OK) {
            free(rgb);
            goto done;
        }
        out->width = (int32_t)w;
        out->height = (int32_t)h;
        out->rgb = rgb;
    }
done:
    free(idat);
    return s;
}

/* ---- PPM ---- */

static int ppm_token(const uint8_t *d, size_t n, size_t *pos, long *val) {
    size_t p = *pos;
    for (;;) {
        while (p < n && isspace(d[p])) p++;
        if (p < n && d[p] == '#') {
            while (p < n && d[p] != '\n') p++;
            continue;
        }
        break;
    }
    if (p >= n || !isdigit(d[p])) return -1;
    long v = 0;
    while (p < n && isdigit(d[p])) {
        v = v * 10 + (d[p] - '0');
        if (v > 1000000000L) return -1;
        p++;
    }
    *val = v;
    *pos = p;
    return 0;
}

static arl_status ppm_decode(const uint8_t *d, size_t n, int64_t max_pixels, const char *name,
                             arl_image *out) {
    int ascii = d[1] == '3';
    size_t pos = 2;
    long w, h, maxval;
    if (ppm_token(d, n, &pos, &w) || ppm_token(d, n, &pos, &h) || ppm_token(d, n, &pos, &maxval))
        return arl_errorf(ARL_ERR_FORMAT, "%s: bad PPM header (expected width, height, maxval)", name);
    if (maxval < 1 || maxval > 65535)
        return arl_errorf(ARL_ERR_FORMAT, "%s: PPM maxval %ld is outside [1, 65535]", name, maxval);
    ARL_TRY(check_size(name, w, h, max_pixels));
    size_t count = (size_t)w * (size_t)h * 3;
    uint8_t *rgb = malloc(count);
    if (!rgb) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", name);
    if (ascii) {
        for (size_t i = 0; i < count; i++) {
            long v;
            if (ppm_token(d, n, &pos, &v) || v > maxval) {
                free(rgb);
                return arl_errorf(ARL_ERR_FORMAT, "%s: PPM sample %zu missing or above maxval", name, i);
            }
            rgb[i] = (uint8_t)((v * 255 + maxval / 2) / maxval);
        }
    } else {
        if (pos >= n || !isspace(d[pos])) {
            free(rgb);
            return arl_errorf(ARL_ERR_FORMAT, "%s: bad PPM header", name);
        }
        pos++;
        size_t bps = maxval > 255 ? 2 : 1;
        if (n - pos < count * bps) {
            free(rgb);
            return arl_errorf(ARL_ERR_FORMAT, "%s: truncated PPM: %zu pixel bytes, expected %zu", name, n - pos, count * bps);
        }
        for (size_t i = 0; i < count; i++) {
            long v = bps == 2 ? (long)d[pos + 2 * i] << 8 | d[pos + 2 * i + 1] : d[pos + i];
            if (v > maxval) v = maxval;
            rgb[i] = (uint8_t)((v * 255 + maxval / 2) / maxval);
        }
    }
    out->width = (int32_t)w;
    out->height = (int32_t)h;
    out->rgb = rgb;
    return ARL_OK;
}

arl_status arl_image_decode(const uint8_t *data, size_t n, int64_t max_pixels, const char *name,
                            arl_image *out) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memset(out, 0, sizeof *out);
    if (max_pixels <= 0) max_pixels = ARL_IMAGE_MAX_PIXELS_DEFAULT;
    if (n >= 8 && !memcmp(data, png_sig, 8)) return png_decode(data, n, max_pixels, name, out);
    if (n >= 2 && data[0] == 'P' && (data[1] == '6' || data[1] == '3'))
        return ppm_decode(data, n, max_pixels, name, out);
    return arl_errorf(ARL_ERR_FORMAT, "%s: not a PNG or PPM (P3/P6) image", name);
}

arl_status arl_image_load(const char *path, int64_t max_pixels, arl_image *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    ARL_TRY(arl_file_read(path, (size_t)1 << 30, &buf, &len)); /* at most 1 GiB */
    arl_status s = arl_image_decode((const uint8_t *)buf, len, max_pixels, path, out);
    free(buf);
    return s;
}

arl_status arl_image_grid(int32_t width, int32_t height, int32_t patch, int64_t max_patches,
                          int32_t *gh, int32_t *gw) {
    if (patch <= 0 || max_patches < 4 || width <= 0 || height <= 0)
        return arl_errorf(ARL_ERR_ARG, "image grid: bad arguments (size %dx%d, patch %d, max %lld)",
                          width, height, patch, (long long)max_patches);
    double sh = (double)height / patch, sw = (double)width / patch;
    double scale = 1.0;
    for (;;) {
        int32_t h = 2 * (int32_t)lround(sh * scale / 2), w = 2 * (int32_t)lround(sw * scale / 2);
        if (h < 2) h = 2;
        if (w < 2) w = 2;
        if ((int64_t)h * w <= max_patches || (h == 2 && w == 2)) {
            *gh = h;
            *gw = w;
            return ARL_OK;
        }
        scale *= 0.97;
    }
}

void arl_image_patchify(const arl_image *img, int32_t patch, int32_t gh, int32_t gw,
                        float *patches) {
    int32_t oh = gh * patch, ow = gw * patch;
    double fy = (double)img->height / oh, fx = (double)img->width / ow;
    for (int32_t y = 0; y < oh; y++) {
        double sy = (y + 0.5) * fy - 0.5;
        if (sy < 0) sy = 0;
        int32_t y0 = (int32_t)sy;
        if (y0 > img->height - 1) y0 = img->height - 1;
        int32_t y1 = y0 + 1 < img->height ? y0 + 1 : y0;
        double wy = sy - y0;
        for (int32_t x = 0; x < ow; x++) {
            double sx = (x + 0.5) * fx - 0.5;
            if (sx < 0) sx = 0;
            int32_t x0 = (int32_t)sx;
            if (x0 > img->width - 1) x0 = img->width - 1;
            int32_t x1 = x0 + 1 < img->width ? x0 + 1 : x0;
            double wx = sx - x0;
            size_t pidx = (size_t)(y / patch) * gw + (size_t)(x / patch);
            int32_t py = y % patch, px = x % patch;
            for (int c = 0; c < 3; c++) {
                double v00 = img->rgb[((size_t)y0 * img->width + x0) * 3 + c];
                double v01 = img->rgb[((size_t)y0 * img->width + x1) * 3 + c];
                double v10 = img->rgb[((size_t)y1 * img->width + x0) * 3 + c];
                double v11 = img->rgb[((size_t)y1 * img->width + x1) * 3 + c];
                double v = (1 - wy) * ((1 - wx) * v00 + wx * v01) + wy * ((1 - wx) * v10 + wx * v11);
                patches[((pidx * 3 + c) * patch + py) * patch + px] = (float)((v / 255.0 - 0.5) / 0.5);
            }
        }
    }
}
