/* replay/codec.h: byte codecs the replay store needs and SQLite lacks: SHA-256 as hex (over
 * core/sha256.h, which the callers use for raw digests), lower-case hex, and standard base64
 * (RFC 4648 section 4, '=' padding, no line breaks).
 * Not a crypto library: SHA-256 is used for content addressing (images, bodies, configs). */
#ifndef ARL_REPLAY_CODEC_H
#define ARL_REPLAY_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* One-shot digest as 64 lower-case hex digits plus NUL into out[65]. */
void replay_sha256_hex(const void *data, size_t n, char out[65]);

/* n bytes as 2n lower-case hex digits plus NUL (out has 2n+1 bytes). */
void replay_hex_encode(const uint8_t *in, size_t n, char *out);
/* 2n hex digits into n bytes; 0 on success, -1 on a non-hex digit. */
int replay_hex_decode(const char *in, size_t n, uint8_t *out);

/* Encoded length of n bytes (without the NUL). */
size_t replay_base64_len(size_t n);
/* Encode n bytes into out (replay_base64_len(n) + 1 bytes, NUL-terminated). */
void replay_base64_encode(const uint8_t *in, size_t n, char *out);
/* Decode canonical base64 text in[0..n) into out (capacity n/4*3); *out_len = bytes.
 * Returns 0 on success, -1 if the text is not canonical base64 (bad length, alphabet,
 * padding, or non-zero pad bits). */
int replay_base64_decode(const char *in, size_t n, uint8_t *out, size_t *out_len);

#endif
