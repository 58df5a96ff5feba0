/* core/blob.h: the agentrl tensor blob (spec/replay.md sections 5 and 6): a 64-byte
 * little-endian header (magic "ARLB", format version, kind, dtype, codec, shape, payload size,
 * payload CRC-32, header CRC-32) followed by the tensor in row-major order.
 *
 * Used by the replay store for every tensor column and state chunk, and by the policy's decode
 * state export (spec/policy.md section 4.4), which is why it lives in core/ and knows nothing of
 * SQLite.  It is not a tensor library: no strides, no views, no conversions (core/dtype.h
 * converts elements).  Codec 1 (deflate, a zlib stream, section 5.1) is decoded by
 * arl_blob_check_copy (core/inflate.h) and validated by arl_blob_check; arl_blob_encode_deflate
 * writes it (core/deflate.h).
 *
 * Dtype and kind codes are the stable numbers of spec/replay.md sections 5.2 and 5.3; they are
 * NOT the values of core/dtype.h's arl_dtype.
 */
#ifndef ARL_CORE_BLOB_H
#define ARL_CORE_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define ARL_BLOB_MAGIC "ARLB"
#define ARL_BLOB_FORMAT_VERSION 1
#define ARL_BLOB_HEADER_SIZE 64
#define ARL_BLOB_MAX_DIMS 4
/* Writers keep every blob at or below this size (spec/replay.md section 5.4). */
#define ARL_BLOB_MAX_BYTES ((uint64_t)64 << 20)

typedef enum arl_blob_dtype {
    ARL_BLOB_U8 = 0x01,
    ARL_BLOB_U16 = 0x02,
    ARL_BLOB_U32 = 0x03,
    ARL_BLOB_U64 = 0x04,
    ARL_BLOB_I8 = 0x05,
    ARL_BLOB_I16 = 0x06,
    ARL_BLOB_I32 = 0x07,
    ARL_BLOB_I64 = 0x08,
    ARL_BLOB_F16 = 0x10,
    ARL_BLOB_BF16 = 0x11,
    ARL_BLOB_F32 = 0x12,
    ARL_BLOB_F64 = 0x13,
} arl_blob_dtype;

typedef enum arl_blob_kind {
    ARL_BLOB_KIND_ANY = 0, /* only in arl_blob_expect: accept any kind */
    ARL_BLOB_TOKENS = 1,           /* u32 [n] */
    ARL_BLOB_LOGPROBS = 2,         /* f32 [n] */
    ARL_BLOB_LOSS_MASK = 3,        /* u8  [n] */
    ARL_BLOB_VERSIONS = 4,         /* u32 [n] */
    ARL_BLOB_ROUTES = 5,           /* u8 or u16 [n, k] */
    ARL_BLOB_KDA_STATE = 16,       /* f32 [H, dk, dv] */
    ARL_BLOB_CONV_TAIL = 17,       /* f32 [3, P, W-1] */
    ARL_BLOB_MLA_LATENT = 18,      /* bf16 or f32 [rows, r] */
    ARL_BLOB_OLD_LOGPROBS = 32,    /* f32 [n] */
    ARL_BLOB_REF_LOGPROBS = 33,    /* f32 [n] */
    ARL_BLOB_IS_WEIGHTS = 34,      /* f32 [n] */
    ARL_BLOB_TOKEN_FLAGS = 35,     /* u8  [n] */
    ARL_BLOB_ADVANTAGES = 36,      /* f32 [n] */
    ARL_BLOB_RESCORE_LOGPROBS = 37 /* f32 [n] */
} arl_blob_kind;

enum { ARL_BLOB_CODEC_RAW = 0, ARL_BLOB_CODEC_DEFLATE = 1 };

/* A decoded header (host values). */
typedef struct arl_blob_header {
    uint16_t format_version;
    uint16_t header_size;
    uint16_t kind;           /* arl_blob_kind */
    uint8_t dtype;           /* arl_blob_dtype */
    uint8_t codec;
    uint8_t ndim;            /* 0..4 */
    uint8_t flags;           /* 0 in version 1 */
    uint64_t dims[ARL_BLOB_MAX_DIMS]; /* entries >= ndim are 0 */
    uint64_t payload_nbytes; /* bytes after the header */
    uint32_t payload_crc32;  /* CRC-32 of the uncompressed payload */
    uint32_t header_crc32;   /* CRC-32 of header bytes 0..59 */
} arl_blob_header;

/* What a reader expects of a blob (arl_blob_check).  Zero-initialise, then set what matters:
 * a zeroed struct accepts any valid blob. */
typedef struct arl_blob_expect {
    arl_blob_kind kind;      /* ARL_BLOB_KIND_ANY (0): any */
    uint8_t dtype;           /* 0: any dtype the kind allows (section 5.3); else this one */
    int ndim;                /* 0: the kind's rank (any rank when kind is ANY); else this */
    unsigned dims_mask;      /* bit i set: dims[i] must equal want->dims[i] */
    uint64_t dims[ARL_BLOB_MAX_DIMS];
} arl_blob_expect;

/* Bytes per element of a dtype code; 0 for an unknown code. */
size_t arl_blob_dtype_size(int dtype);
/* "u8", "bf16", ...; "?" for an unknown code.  Static string. */
const char *arl_blob_dtype_name(int dtype);
/* "TOKENS", "KDA_STATE", ...; "?" for an unknown code.  Static string. */
const char *arl_blob_kind_name(int kind);
/* The rank the spec gives a kind (1, 2 or 3); 0 for an unknown kind. */
int arl_blob_kind_rank(int kind);
/* 1 if dtype is allowed for kind by spec/replay.md section 5.3 (ROUTES: u8/u16; MLA_LATENT:
 * bf16/f32; the rest one dtype each). */
int arl_blob_kind_dtype_ok(int kind, int dtype);

/* Payload bytes of a shape (product of dims times the element size; 1 element for ndim 0).
 * ARL_ERR_RANGE on overflow, ARL_ERR_ARG for a bad dtype or ndim. */
arl_status arl_blob_payload_size(int dtype, int ndim, const uint64_t *dims, uint64_t *nbytes);

/* Write the 64-byte header of a raw (codec 0) blob for the given tensor into out[64], computing
 * both CRCs (payload may be NULL only when its size is 0).  Validates kind/dtype/ndim. */
arl_status arl_blob_header_build(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                                 const uint64_t *dims, const void *payload, uint8_t out[64]);

/* Encode header + payload into out (capacity out_cap >= 64 + payload size); *out_len = total.
 * ARL_ERR_RANGE if out_cap is too small; the payload is copied as is (little-endian host). */
arl_status arl_blob_encode(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                           const uint64_t *dims, const void *payload, void *out, size_t out_cap,
                           size_t *out_len);

/* arl_blob_encode with codec 1 (spec section 5.1): the payload as a zlib stream made by
 * core/deflate.h, which shrinks runs of equal elements.  ARL_ERR_RANGE when the blob would not
 * fit out_cap: writers that use codec 1 only when it saves at least 20 % (section 5.1 rule 5)
 * pass out_cap = 64 + 0.8 * payload size and write codec 0 on ARL_ERR_RANGE.  Writers use it
 * for per-token arrays only (never for states or routes, rule 5). */
arl_status arl_blob_encode_deflate(arl_blob_kind kind, arl_blob_dtype dtype, int ndim,
                                   const uint64_t *dims, const void *payload, void *out,
                                   size_t out_cap, size_t *out_len);

/* Parse and check the header of blob[0..len): magic, format version, header size, header CRC,
 * flags, dtype, ndim and unused dims, codec, payload size against the shape (codec 0; codec 1:
 * a shape of at most 64 MiB), and len == 64 + payload_nbytes.  Does NOT check the payload CRC
 * or decode anything.  On success *h is filled and *payload (if non-NULL) points into blob at
 * offset 64 (the zlib stream for codec 1).
 * Errors: ARL_ERR_CORRUPT (with what failed), ARL_ERR_VERSION (unknown format_version).  The
 * message does not name the blob: callers prefix it. */
arl_status arl_blob_parse(const void *blob, size_t len, arl_blob_header *h, const void **payload);

/* Bytes of the tensor a parsed header describes (its uncompressed payload): the product of
 * dims times the element size. */
uint64_t arl_blob_tensor_nbytes(const arl_blob_header *h);

/* arl_blob_parse, then kind/dtype/shape against *want (NULL: no expectation), then the payload
 * CRC.  Shape, kind or dtype mismatches are ARL_ERR_SHAPE and name the field and both values.
 * Codec 1: the stream is inflated into a temporary buffer and must give exactly the tensor's
 * bytes, end exactly at the blob's end and match the payload CRC (else ARL_ERR_CORRUPT naming
 * what failed); *payload cannot point at the tensor then, so asking for it is
 * ARL_ERR_UNSUPPORTED (use arl_blob_check_copy). */
arl_status arl_blob_check(const void *blob, size_t len, const arl_blob_expect *want,
                          arl_blob_header *h, const void **payload);

/* arl_blob_check that also copies the tensor into dst (capacity dst_cap) in the same pass as
 * its CRC (readers that take the data anyway read it once); codec 1 is inflated into dst.  On
 * any failure dst may have been written and must not be used.  ARL_ERR_RANGE if the tensor
 * (arl_blob_tensor_nbytes) does not fit dst_cap. */
arl_status arl_blob_check_copy(const void *blob, size_t len, const arl_blob_expect *want,
                               arl_blob_header *h, void *dst, size_t dst_cap);

/* Format a shape as "[8192, 4]" into buf (always terminated). Returns buf. */
char *arl_blob_shape_str(const arl_blob_header *h, char *buf, size_t cap);

#endif
