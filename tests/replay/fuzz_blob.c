/* tests/replay/fuzz_blob.c: libFuzzer target for the codec-1 path of tensor blobs: the zlib /
 * deflate decoder (core/inflate.c) and blob parsing, checking and inflating (core/blob.c).
 * Any input must give a status, never a crash, a leak or an out-of-bounds access.
 * Build: cmake -DAGENTRL_FUZZ=ON with clang; run:
 *   build/tests/replay/fuzz_blob -max_total_time=60 [corpus_dir]
 * The first byte picks the target: odd = a whole blob; even with bit 2 set = the writer
 * (core/deflate.h) round trip of the rest, element size 1 << (bits 3-4), which must decode to
 * itself; other even = a bare zlib stream. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/blob.h"
#include "core/deflate.h"
#include "core/inflate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t out[1 << 20];
    if (size < 1) return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    if ((data[0] & 5) == 4) {
        static uint8_t z[(1 << 20) * 2 + 64];
        size_t elem = (size_t)1 << ((data[0] >> 3) & 3), zn = 0, got = 0;
        if (n > (1 << 20)) return 0;
        if (arl_zlib_encode(in, n, elem, z, sizeof z, &zn) != ARL_OK) abort();
        if (arl_zlib_decode(z, zn, out, sizeof out, &got) != ARL_OK || got != n ||
            (n && memcmp(out, in, n)))
            abort();
        return 0;
    }
    if (!(data[0] & 1)) {
        size_t got = 0, used = 0;
        /* a small cap sometimes, to reach the output-bound checks */
        size_t cap = data[0] & 2 ? 64 : sizeof out;
        if (arl_zlib_decode_ex(in, n, out, cap, &got, &used) == ARL_OK && (got > cap || used > n))
            abort();
        return 0;
    }
    arl_blob_header h;
    if (arl_blob_check(in, n, NULL, &h, NULL) == ARL_OK && h.codec > 1) abort();
    (void)arl_blob_check_copy(in, n, NULL, &h, out, sizeof out);
    return 0;
}
