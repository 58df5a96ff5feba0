/* core/blob.c: the tensor blob header (see blob.h and spec/replay.md section 5). */
#include "core/blob.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/deflate.h"
#include "core/inflate.h"

size_t arl_blob_dtype_size(int dtype) {
    switch (dtype) {
    case ARL_BLOB_U8:
    case ARL_BLOB_I8: return 1;
    case ARL_BLOB_U16:
    case ARL_BLOB_I16:
    case ARL_BLOB_F16:
    case ARL_BLOB_BF16: return 2;
    case ARL_BLOB_U32:
    case ARL_BLOB_I32:
    case ARL_BLOB_F32: return 4;
    case ARL_BLOB_U64:
    case ARL_BLOB_I64:
    case ARL_BLOB_F64: return 8;
    default: return 0;
    }
}

const char *arl_blob_dtype_name(int dtype) {
    switch (dtype) {
    case ARL_BLOB_U8: return "u8";
    case ARL_BLOB_U16: return "u16";
    case ARL_BLOB_U32: return "u32";
    case ARL_BLOB_U64: return "u64";
    case ARL_BLOB_I8: return "i8";
    case ARL_BLOB_I16: return "i16";
    case ARL_BLOB_I32: return "i32";
    case ARL_BLOB_I64: return "i64";
    case ARL_BLOB_F16: return "f16";
    case ARL_BLOB_BF16: return "bf16";
    case ARL_BLOB_F32: return "f32";
    case ARL_BLOB_F64: return "f64";
    default: return "?";
    }
}

const char *arl_blob_kind_name(int kind) {
    switch (kind) {
    case ARL_BLOB_TOKENS: return "TOKENS";
    case ARL_BLOB_LOGPROBS: return "LOGPROBS";
    case ARL_BLOB_LOSS_MASK: return "LOSS_MASK";
    case ARL_BLOB_VERSIONS: return "VERSIONS";
    case ARL_BLOB_ROUTES: return "ROUTES";
    case ARL_BLOB_KDA_STATE: return "KDA_STATE";
    case ARL_BLOB_CONV_TAIL: return "CONV_TAIL";
    case ARL_BLOB_MLA_LATENT: return "MLA_LATENT";
    case ARL_BLOB_OLD_LOGPROBS: return "OLD_LOGPROBS";
    case ARL_BLOB_REF_LOGPROBS: return "REF_LOGPROBS";
    case ARL_BLOB_IS_WEIGHTS: return "IS_WEIGHTS";
    case ARL_BLOB_TOKEN_FLAGS: return "TOKEN_FLAGS";
    case ARL_BLOB_ADVANTAGES: return "ADVANTAGES";
    case ARL_BLOB_RESCORE_LOGPROBS: return "RESCORE_LOGPROBS";
    default: return "?";
    }
}

int arl_blob_kind_rank(int kind) {
    switch (kind) {
    case ARL_BLOB_ROUTES:
    case ARL_BLOB_MLA_LATENT: return 2;
    case ARL_BLOB_KDA_STATE:
    case ARL_BLOB_CONV_TAIL: return 3;
    default: return *arl_blob_kind_name(kind) == '?' ? 0 : 1;
    }
}

int arl_blob_kind_dtype_ok(int kind, int dtype) {
    switch (kind) {
    case ARL_BLOB_TOKENS:
    case ARL_BLOB_VERSIONS: return dtype == ARL_BLOB_U32;
    case ARL_BLOB_LOSS_MASK:
    case ARL_BLOB_TOKEN_FLAGS: return dtype == ARL_BLOB_U8;
    case ARL_BLOB_ROUTES: return dtype == ARL_BLOB_U8 || dtype == ARL_BLOB_U16;
    case ARL_BLOB_MLA_LATENT: return dtype == ARL_BLOB_BF16 || dtype == ARL_BLOB_F32;
    case ARL_BLOB_LOGPROBS:
    case ARL_BLOB_KDA_STATE:
    case ARL_BLOB_CONV_TAIL:
    case ARL_BLOB_OLD_LOGPROBS:
    case ARL_BLOB_REF_LOGPROBS:
    case ARL_BLOB_IS_WEIGHTS:
    case ARL_BLOB_ADVANTAGES:
    case ARL_BLOB_RESCORE_LOGPROBS: return dtype == ARL_BLOB_F32;
    default: return 0;
    }
}

arl_status arl_blob_payload_size(int dtype, int ndim, const uint64_t *dims, uint64_t *nbytes) {
    size_t es = arl_blob_dtype_size(dtype);
    if (!es) return arl_errorf(ARL_ERR_ARG, "unknown blob dtype code 0x%02x", dtype);
    if (ndim < 0 || ndim > ARL_BLOB_MAX_DIMS)
        return arl_errorf(ARL_ERR_ARG, "blob ndim %d is outside 0..4", ndim);
    uint64_t n = es;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] && n > UINT64_MAX / dims[i])
            return arl_errorf(ARL_ERR_RANGE, "blob shape overflows 64 bits");
        n *= dims[i];
    }
    *nbytes = n;
    return ARL_OK;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* The header of a raw blob without its two CRCs (bytes 56..63 left 0); *nb = payload bytes. */
static arl_status header_fill(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                              const uint64_t *dims, const void *payload, uint8_t out[64],
                              uint64_t *nb) {
    if (!arl_blob_kind_rank(kind))
        return arl_errorf(ARL_ERR_ARG, "unknown blob kind %d", (int)kind);
    if (!arl_blob_kind_dtype_ok(kind, dtype))
        return arl_errorf(ARL_ERR_ARG, "blob kind %s does not allow dtype %s",
                          arl_blob_kind_name(kind), arl_blob_dtype_name(dtype));
    if (ndim != arl_blob_kind_rank(kind))
        return arl_errorf(ARL_ERR_ARG, "blob kind %s has rank %d, got ndim %d",
                          arl_blob_kind_name(kind), arl_blob_kind_rank(kind), ndim);
    ARL_TRY(arl_blob_payload_size(dtype, ndim, dims, nb));
    if (*nb && !payload) return arl_errorf(ARL_ERR_ARG, "blob payload is NULL");
    memset(out, 0, ARL_BLOB_HEADER_SIZE);
    memcpy(out, ARL_BLOB_MAGIC, 4);
    put16(out + 4, ARL_BLOB_FORMAT_VERSION);
    put16(out + 6, ARL_BLOB_HEADER_SIZE);
    put16(out + 8, (uint16_t)kind);
    out[10] = (uint8_t)dtype;
    out[11] = ARL_BLOB_CODEC_RAW;
    out[12] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) put64(out + 16 + 8 * i, dims[i]);
    put64(out + 48, *nb);
    return ARL_OK;
}

arl_status arl_blob_header_build(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                                 const uint64_t *dims, const void *payload, uint8_t out[64]) {
    uint64_t nb;
    ARL_TRY(header_fill(kind, dtype, ndim, dims, payload, out, &nb));
    put32(out + 56, arl_crc32(payload, (size_t)nb));
    put32(out + 60, arl_crc32(out, 60));
    return ARL_OK;
}

arl_status arl_blob_encode(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                           const uint64_t *dims, const void *payload, void *out, size_t out_cap,
                           size_t *out_len) {
    uint64_t nb;
    ARL_TRY(arl_blob_payload_size(dtype, ndim, dims, &nb));
    if (out_cap < ARL_BLOB_HEADER_SIZE || nb > out_cap - ARL_BLOB_HEADER_SIZE)
        return arl_errorf(ARL_ERR_RANGE, "blob of %" PRIu64 " bytes does not fit a %zu-byte buffer",
                          nb + ARL_BLOB_HEADER_SIZE, out_cap);
    uint8_t *o = (uint8_t *)out;
    ARL_TRY(header_fill(kind, dtype, ndim, dims, payload, o, &nb));
    /* one pass over the payload: copy and CRC together */
    put32(o + 56, nb ? arl_crc32_copy(o + ARL_BLOB_HEADER_SIZE, payload, (size_t)nb, 0) : 0);
    put32(o + 60, arl_crc32(o, 60));
    *out_len = (size_t)(ARL_BLOB_HEADER_SIZE + nb);
    return ARL_OK;
}

arl_status arl_blob_encode_deflate(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                                   const uint64_t *dims, const void *payload, void *out,
                                   size_t out_cap, size_t *out_len) {
    uint8_t *o = (uint8_t *)out;
    if (out_cap < ARL_BLOB_HEADER_SIZE)
        return arl_errorf(ARL_ERR_RANGE, "a blob does not fit a %zu-byte buffer", out_cap);
    ARL_TRY(arl_blob_header_build(kind, dtype, ndim, dims, payload, o));
    uint64_t nb;
    ARL_TRY(arl_blob_payload_size(dtype, ndim, dims, &nb));
    if (nb > ARL_BLOB_MAX_BYTES)
        return arl_errorf(ARL_ERR_RANGE, "codec-1 blob of %" PRIu64 " bytes, over the 64 MiB limit",
                          nb);
    size_t zn;
    ARL_TRY(arl_zlib_encode((const uint8_t *)payload, (size_t)nb, arl_blob_dtype_size(dtype),
                            o + ARL_BLOB_HEADER_SIZE, out_cap - ARL_BLOB_HEADER_SIZE, &zn));
    o[11] = ARL_BLOB_CODEC_DEFLATE;
    put64(o + 48, zn);
    put32(o + 60, arl_crc32(o, 60));
    *out_len = ARL_BLOB_HEADER_SIZE + zn;
    return ARL_OK;
}

arl_status arl_blob_parse(const void *blob, size_t len, arl_blob_header *h, const void **payload) {
    const uint8_t *b = (const uint8_t *)blob;
    if (!b || len < ARL_BLOB_HEADER_SIZE)
        return arl_errorf(ARL_ERR_CORRUPT, "blob of %zu bytes is shorter than its 64-byte header",
                          b ? len : 0);
    if (memcmp(b, ARL_BLOB_MAGIC, 4))
        return arl_errorf(ARL_ERR_CORRUPT, "bad blob magic %02x %02x %02x %02x (expected 'ARLB')",
                          b[0], b[1], b[2], b[3]);
    memset(h, 0, sizeof *h);
    h->format_version = get16(b + 4);
    h->header_size = get16(b + 6);
    h->kind = get16(b + 8);
    h->dtype = b[10];
    h->codec = b[11];
    h->ndim = b[12];
    h->flags = b[13];
    for (int i = 0; i < ARL_BLOB_MAX_DIMS; i++) h->dims[i] = get64(b + 16 + 8 * i);
    h->payload_nbytes = get64(b + 48);
    h->payload_crc32 = get32(b + 56);
    h->header_crc32 = get32(b + 60);
    uint32_t hc = arl_crc32(b, 60);
    if (hc != h->header_crc32)
        return arl_errorf(ARL_ERR_CORRUPT, "blob header CRC mismatch (stored %08x, computed %08x)",
                          h->header_crc32, hc);
    if (h->format_version != ARL_BLOB_FORMAT_VERSION)
        return arl_errorf(ARL_ERR_VERSION,
                          "blob format version %u is not supported (this build reads version %d)",
                          h->format_version, ARL_BLOB_FORMAT_VERSION);
    if (h->header_size != ARL_BLOB_HEADER_SIZE)
        return arl_errorf(ARL_ERR_CORRUPT, "blob header_size %u (expected 64)", h->header_size);
    if (h->flags) return arl_errorf(ARL_ERR_CORRUPT, "blob flags 0x%02x (must be 0)", h->flags);
    if (b[14] || b[15]) return arl_errorf(ARL_ERR_CORRUPT, "blob reserved bytes are not 0");
    if (!arl_blob_dtype_size(h->dtype))
        return arl_errorf(ARL_ERR_CORRUPT, "unknown blob dtype code 0x%02x", h->dtype);
    if (h->ndim > ARL_BLOB_MAX_DIMS)
        return arl_errorf(ARL_ERR_CORRUPT, "blob ndim %u > 4", h->ndim);
    for (int i = h->ndim; i < ARL_BLOB_MAX_DIMS; i++)
        if (h->dims[i])
            return arl_errorf(ARL_ERR_CORRUPT, "blob dims[%d] = %" PRIu64 " beyond ndim %u", i,
                              h->dims[i], h->ndim);
    uint64_t want;
    if (arl_blob_payload_size(h->dtype, h->ndim, h->dims, &want) != ARL_OK)
        return arl_errorf(ARL_ERR_CORRUPT, "blob shape overflows 64 bits");
    if (h->codec != ARL_BLOB_CODEC_RAW && h->codec != ARL_BLOB_CODEC_DEFLATE)
        return arl_errorf(ARL_ERR_CORRUPT, "unknown blob codec %u", h->codec);
    if (h->codec == ARL_BLOB_CODEC_DEFLATE && want > ARL_BLOB_MAX_BYTES)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "codec-1 blob of shape size %" PRIu64 " bytes, over the 64 MiB blob "
                          "limit (spec section 5.4)",
                          want);
    if (h->codec == ARL_BLOB_CODEC_RAW && h->payload_nbytes != want)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob payload_nbytes %" PRIu64 " != %" PRIu64 " implied by its shape",
                          h->payload_nbytes, want);
    if (h->payload_nbytes != (uint64_t)(len - ARL_BLOB_HEADER_SIZE))
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob length %zu != 64 + payload_nbytes %" PRIu64 " (truncated?)", len,
                          h->payload_nbytes);
    if (payload) *payload = b + ARL_BLOB_HEADER_SIZE;
    return ARL_OK;
}

char *arl_blob_shape_str(const arl_blob_header *h, char *buf, size_t cap) {
    size_t o = 0;
    if (!cap) return buf;
    buf[0] = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < h->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRIu64, i ? ", " : "", h->dims[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static arl_status check_header(const void *blob, size_t len, const arl_blob_expect *want,
                               arl_blob_header *h, const void **pl) {
    ARL_TRY(arl_blob_parse(blob, len, h, pl));
    if (!want) return ARL_OK;
    if (want->kind != ARL_BLOB_KIND_ANY && h->kind != want->kind)
        return arl_errorf(ARL_ERR_SHAPE, "blob kind %s (%u), expected %s", arl_blob_kind_name(h->kind),
                          h->kind, arl_blob_kind_name(want->kind));
    if (want->dtype ? h->dtype != want->dtype
                    : (h->kind && arl_blob_kind_rank(h->kind) && !arl_blob_kind_dtype_ok(h->kind, h->dtype)))
        return arl_errorf(ARL_ERR_SHAPE, "blob dtype %s not allowed for kind %s%s%s",
                          arl_blob_dtype_name(h->dtype), arl_blob_kind_name(h->kind),
                          want->dtype ? ", expected " : "", want->dtype ? arl_blob_dtype_name(want->dtype) : "");
    int rank = want->ndim ? want->ndim : arl_blob_kind_rank(want->kind);
    if (rank && h->ndim != rank)
        return arl_errorf(ARL_ERR_SHAPE, "blob %s has ndim %u, expected %d", arl_blob_kind_name(h->kind),
                          h->ndim, rank);
    for (int i = 0; i < ARL_BLOB_MAX_DIMS; i++)
        if ((want->dims_mask & (1u << i)) && h->dims[i] != want->dims[i]) {
            char s[96];
            return arl_errorf(ARL_ERR_SHAPE, "blob %s shape %s: dims[%d] = %" PRIu64 ", expected %" PRIu64,
                              arl_blob_kind_name(h->kind), arl_blob_shape_str(h, s, sizeof s), i, h->dims[i],
                              want->dims[i]);
        }
    return ARL_OK;
}

uint64_t arl_blob_tensor_nbytes(const arl_blob_header *h) {
    uint64_t n = 0;
    if (arl_blob_payload_size(h->dtype, h->ndim, h->dims, &n) != ARL_OK) return 0;
    return n;
}

/* Inflate the codec-1 payload pl[0..h->payload_nbytes) into dst, which has room for exactly the
 * tensor's size (arl_blob_tensor_nbytes), and check the exact size, the stream's end and the
 * payload CRC-32 of the uncompressed bytes. */
static arl_status inflate_payload(const arl_blob_header *h, const uint8_t *pl, void *dst,
                                  uint64_t want) {
    size_t got = 0, used = 0;
    arl_status s = arl_zlib_decode_ex(pl, (size_t)h->payload_nbytes, (uint8_t *)dst, (size_t)want,
                                      &got, &used);
    if (s == ARL_ERR_RANGE)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s (codec 1) inflates to more than the %" PRIu64
                          " bytes its shape implies",
                          arl_blob_kind_name(h->kind), want);
    if (s != ARL_OK) {
        char why[160];
        snprintf(why, sizeof why, "%s", arl_error_msg());
        return arl_errorf(ARL_ERR_CORRUPT, "blob %s (codec 1): %s", arl_blob_kind_name(h->kind),
                          why);
    }
    if (got != want)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s (codec 1) inflates to %zu bytes, its shape implies %" PRIu64,
                          arl_blob_kind_name(h->kind), got, want);
    if (used != h->payload_nbytes)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s (codec 1): %" PRIu64 " bytes after the end of the zlib stream",
                          arl_blob_kind_name(h->kind), h->payload_nbytes - (uint64_t)used);
    uint32_t pc = arl_crc32(dst, (size_t)want);
    if (pc != h->payload_crc32)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s payload CRC mismatch (stored %08x, computed %08x)",
                          arl_blob_kind_name(h->kind), h->payload_crc32, pc);
    return ARL_OK;
}

arl_status arl_blob_check(const void *blob, size_t len, const arl_blob_expect *want,
                          arl_blob_header *h, const void **payload) {
    const void *pl;
    ARL_TRY(check_header(blob, len, want, h, &pl));
    if (h->codec == ARL_BLOB_CODEC_DEFLATE) {
        /* no pointer into the blob can hold the tensor: validate through a scratch copy */
        if (payload)
            return arl_errorf(ARL_ERR_UNSUPPORTED,
                              "blob %s uses codec 1 (deflate): read it with arl_blob_check_copy",
                              arl_blob_kind_name(h->kind));
        uint64_t n = arl_blob_tensor_nbytes(h);
        void *tmp = malloc(n ? (size_t)n : 1);
        if (!tmp)
            return arl_errorf(ARL_ERR_NOMEM, "out of memory inflating a %" PRIu64 "-byte blob", n);
        arl_status s = inflate_payload(h, (const uint8_t *)pl, tmp, n);
        free(tmp);
        return s;
    }
    uint32_t pc = arl_crc32(pl, (size_t)h->payload_nbytes);
    if (pc != h->payload_crc32)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s payload CRC mismatch (stored %08x, computed %08x)",
                          arl_blob_kind_name(h->kind), h->payload_crc32, pc);
    if (payload) *payload = pl;
    return ARL_OK;
}

arl_status arl_blob_check_copy(const void *blob, size_t len, const arl_blob_expect *want,
                               arl_blob_header *h, void *dst, size_t dst_cap) {
    const void *pl;
    ARL_TRY(check_header(blob, len, want, h, &pl));
    uint64_t n = arl_blob_tensor_nbytes(h);
    if (n > dst_cap)
        return arl_errorf(ARL_ERR_RANGE,
                          "blob %s payload of %" PRIu64 " bytes does not fit %zu bytes",
                          arl_blob_kind_name(h->kind), n, dst_cap);
    if (h->codec == ARL_BLOB_CODEC_DEFLATE) return inflate_payload(h, (const uint8_t *)pl, dst, n);
    uint32_t pc = arl_crc32_copy(dst, pl, (size_t)h->payload_nbytes, 0);
    if (pc != h->payload_crc32)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "blob %s payload CRC mismatch (stored %08x, computed %08x)",
                          arl_blob_kind_name(h->kind), h->payload_crc32, pc);
    return ARL_OK;
}
