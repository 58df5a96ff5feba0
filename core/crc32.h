/* core/crc32.h: CRC-32 (ISO/IEC 3309, IEEE 802.3; reflected polynomial 0xEDB88320, initial
 * value and final XOR 0xFFFFFFFF) -- the value zlib's crc32() computes.  Used by the tensor
 * blob format (core/blob.h, spec/replay.md section 5.1 rule 3) and the policy's state export.
 *
 * Not a hash for security, not CRC-32C.  On x86-64 with PCLMULQDQ the bulk of long buffers is
 * folded with carry-less multiplication (about 10x the table path); everywhere else a
 * slicing-by-8 table is used.  Both give identical results (tests/replay/test_replay_blob.c).
 */
#ifndef ARL_CORE_CRC32_H
#define ARL_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32 of data[0..n). */
uint32_t arl_crc32(const void *data, size_t n);

/* Continue a CRC: arl_crc32_update(arl_crc32(a, na), b, nb) == CRC-32 of a followed by b.
 * Start with crc = 0. data may be NULL when n == 0. Thread-safe. */
uint32_t arl_crc32_update(uint32_t crc, const void *data, size_t n);

/* Copy n bytes from src to dst (no overlap) and return the CRC-32 of them continued from crc,
 * in one pass over the data (what a reader needs to check and take a payload at once). */
uint32_t arl_crc32_copy(void *dst, const void *src, size_t n, uint32_t crc);

/* The same with the portable table path only (for tests and benchmarks of the fast path). */
uint32_t arl_crc32_update_portable(uint32_t crc, const void *data, size_t n);

#endif
