/* core/sha256.h: SHA-256 (FIPS 180-4), one-shot and incremental, plus lower-case hex.
 *
 * What this is: the hash used for config hashes (spec/policy.md section 12.1), replay
 * checksums of stored bodies and images, and file identities.  What this is not: an HMAC,
 * a key-derivation function or a constant-time implementation for secrets.
 */
#ifndef ARL_CORE_SHA256_H
#define ARL_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define ARL_SHA256_BYTES 32
#define ARL_SHA256_HEX_CHARS 65 /* 64 hex digits + NUL */

typedef struct arl_sha256_ctx {
    uint32_t h[8];
    uint64_t nbytes; /* message bytes absorbed so far */
    uint8_t buf[64]; /* pending partial block */
    uint32_t nbuf;   /* bytes pending in buf (< 64) */
} arl_sha256_ctx;

void arl_sha256_init(arl_sha256_ctx *s);
/* Absorb len bytes of data (data may be NULL when len == 0). */
void arl_sha256_update(arl_sha256_ctx *s, const void *data, size_t len);
/* Write the 32-byte digest to out; s must be re-initialised before reuse. */
void arl_sha256_final(arl_sha256_ctx *s, uint8_t out[ARL_SHA256_BYTES]);

/* One-shot digest of len bytes. */
void arl_sha256(const void *data, size_t len, uint8_t out[ARL_SHA256_BYTES]);

/* Lower-case hex of a 32-byte digest into hex (65 bytes with the NUL); returns hex. */
char *arl_sha256_hex(const uint8_t digest[ARL_SHA256_BYTES], char hex[ARL_SHA256_HEX_CHARS]);

#endif
