/* replay/elide.c: lossless image elision in stored response bodies (spec/replay.md section
 * 4.10).  A JSON string member "data" whose raw bytes are canonical base64 of a PNG is
 * replaced by the 71-byte placeholder "sha256:<hex>"; reconstruction puts base64(png) back.
 * The scanner tracks JSON string boundaries (escapes included), so text inside other strings is
 * never touched; a body that is not JSON is stored unchanged. */
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "replay/codec.h"
#include "replay/internal.h"

#define PLACEHOLDER_LEN 71 /* "sha256:" + 64 hex */

/* End of the JSON string starting at b[i] == '"': index of the closing quote, or n.  *esc is
 * set when the string contains a backslash. */
static size_t string_end(const uint8_t *b, size_t n, size_t i, int *esc) {
    *esc = 0;
    for (size_t j = i + 1; j < n; j++) {
        if (b[j] == '\\') {
            *esc = 1;
            j++;
        } else if (b[j] == '"') {
            return j;
        }
    }
    return n;
}

static size_t skip_ws(const uint8_t *b, size_t n, size_t i) {
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

void relided_free(relided_image *imgs, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(imgs[i].png);
    free(imgs);
}

arl_status relide_images(const uint8_t *body, size_t n, uint8_t **out, size_t *out_len,
                         relided_image **imgs_out, size_t *n_imgs_out) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    relided_image *imgs = NULL;
    size_t n_imgs = 0, cap_imgs = 0;
    uint8_t *o = malloc(n ? n : 1);
    size_t on = 0, copied = 0; /* body[copied..) is not yet in o */
    if (!o) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory eliding images");
    size_t i = 0;
    while (i < n) {
        if (body[i] != '"') {
            i++;
            continue;
        }
        int esc;
        size_t e = string_end(body, n, i, &esc);
        if (e >= n) break;
        int is_data_key = !esc && e - i - 1 == 4 && !memcmp(body + i + 1, "data", 4);
        size_t next = e + 1;
        if (is_data_key) {
            size_t c = skip_ws(body, n, e + 1);
            if (c < n && body[c] == ':') {
                size_t v = skip_ws(body, n, c + 1);
                if (v < n && body[v] == '"') {
                    int vesc;
                    size_t ve = string_end(body, n, v, &vesc);
                    size_t len = ve - v - 1;
                    next = ve < n ? ve + 1 : n;
                    if (ve < n && !vesc && len > PLACEHOLDER_LEN && len % 4 == 0) {
                        uint8_t *png = malloc(len / 4 * 3);
                        size_t pn = 0;
                        if (!png) goto nomem;
                        if (!replay_base64_decode((const char *)body + v + 1, len, png, &pn) &&
                            pn >= 24 && !memcmp(png, png_sig, 8) && !memcmp(png + 12, "IHDR", 4)) {
                            if (n_imgs == cap_imgs) {
                                cap_imgs = cap_imgs ? cap_imgs * 2 : 4;
                                relided_image *p = realloc(imgs, cap_imgs * sizeof *p);
                                if (!p) {
                                    free(png);
                                    goto nomem;
                                }
                                imgs = p;
                            }
                            relided_image *im = &imgs[n_imgs++];
                            im->png = png;
                            im->png_nbytes = pn;
                            im->width = (int32_t)be32(png + 16);
                            im->height = (int32_t)be32(png + 20);
                            arl_sha256(png, pn, im->sha256);
                            /* copy up to the string's first byte, then the placeholder */
                            memcpy(o + on, body + copied, v + 1 - copied);
                            on += v + 1 - copied;
                            im->body_offset = on;
                            char hex[65];
                            replay_hex_encode(im->sha256, 32, hex);
                            memcpy(o + on, "sha256:", 7);
                            memcpy(o + on + 7, hex, 64);
                            on += PLACEHOLDER_LEN;
                            copied = ve; /* resume at the closing quote */
                        } else {
                            free(png);
                        }
                    }
                }
            }
        }
        i = next;
    }
    memcpy(o + on, body + copied, n - copied);
    on += n - copied;
    *out = o;
    *out_len = on;
    *imgs_out = imgs;
    *n_imgs_out = n_imgs;
    return ARL_OK;
nomem:
    free(o);
    relided_free(imgs, n_imgs);
    return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory eliding images");
}

arl_status rimages_restore(const uint8_t *stored, size_t n, const rimage_ref *refs, size_t n_refs,
                           uint8_t **out, size_t *out_len) {
    size_t total = n;
    for (size_t i = 0; i < n_refs; i++)
        total += replay_base64_len(refs[i].png_nbytes);
    uint8_t *o = malloc(total + 1);
    if (!o) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory restoring images");
    size_t on = 0, at = 0;
    for (size_t i = 0; i < n_refs; i++) {
        size_t off = refs[i].body_offset;
        uint8_t sha[32];
        char want[PLACEHOLDER_LEN + 1];
        arl_sha256(refs[i].png, refs[i].png_nbytes, sha);
        memcpy(want, "sha256:", 7);
        replay_hex_encode(sha, 32, want + 7);
        if (off < at || off + PLACEHOLDER_LEN > n || memcmp(stored + off, want, PLACEHOLDER_LEN)) {
            free(o);
            return arl_errorf(ARL_ERR_CORRUPT,
                              "image placeholder at body offset %zu does not match its image", off);
        }
        memcpy(o + on, stored + at, off - at);
        on += off - at;
        replay_base64_encode(refs[i].png, refs[i].png_nbytes, (char *)o + on);
        on += replay_base64_len(refs[i].png_nbytes);
        at = off + PLACEHOLDER_LEN;
    }
    memcpy(o + on, stored + at, n - at);
    on += n - at;
    *out = o;
    *out_len = on;
    return ARL_OK;
}
