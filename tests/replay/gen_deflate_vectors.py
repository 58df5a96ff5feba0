#!/usr/bin/python3
"""Generate tests/replay/data/deflate_vectors.bin: zlib streams (RFC 1950) made by Python's zlib
for the codec-1 blob decoder (core/inflate.c, core/blob.c; spec/replay.md section 5.1).

Run with /usr/bin/python3 (stdlib only):  /usr/bin/python3 tests/replay/gen_deflate_vectors.py

Only the streams are stored: the C test (test_deflate.c) regenerates each input from its
(pattern, seed, size) with the same generator (make_input below, fill_pattern there) and checks
that the decoder gives it back byte for byte.  Inputs mimic the per-token arrays codec 1 is for
(u32 token ids, f32 log-probabilities that are 0.0 on context tokens, u8 loss-mask runs,
constant u32 versions), plus zeros, random bytes and text; sizes up to past the 32 KiB window;
levels 0 (stored), 1, 6, 9; strategies default, filtered, huffman-only, RLE and fixed (fixed
Huffman blocks); window bits 9..15; streams with sync and full flushes (several blocks, empty
stored blocks).

File format (little-endian): "ARLZ", u32 version 1, u32 count, then per vector:
u8 pattern, u8 level, u8 strategy, u8 wbits, u32 seed, u32 raw_len, u32 flush_every,
u32 z_len, z bytes.
"""
import os
import struct
import zlib

MASK = (1 << 64) - 1


class Gen:
    """64-bit LCG; next_u8 is the top byte.  Mirrored in test_deflate.c."""

    def __init__(self, seed):
        self.x = (seed * 0x9E3779B97F4A7C15 + 1) & MASK

    def next(self):
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) & MASK
        return self.x >> 32  # 32 bits


def make_input(pattern, seed, n):
    g = Gen(seed)
    out = bytearray()
    if pattern == 0:  # zeros
        out = bytearray(n)
    elif pattern == 1:  # random bytes
        out = bytearray(g.next() & 0xFF for _ in range(n))
    elif pattern == 2:  # u32 token ids < 160000
        while len(out) < n:
            out += struct.pack('<I', g.next() % 160000)
    elif pattern == 3:  # f32 log-probs: runs of 0.0 (context) and negative values (actions)
        act = 0
        left = 0
        while len(out) < n:
            if left == 0:
                act ^= 1
                left = 1 + g.next() % 300
            left -= 1
            v = -(g.next() % 100000) / 7919.0 if act else 0.0
            out += struct.pack('<f', v)
    elif pattern == 4:  # u8 loss-mask runs
        v = 0
        while len(out) < n:
            run = 1 + g.next() % 700
            out += bytes([v]) * run
            v ^= 1
    elif pattern == 5:  # text: words from a small vocabulary
        words = [b'the', b'tool', b'call', b'returned', b'SELECT', b'count(*)', b'FROM',
                 b'orders', b'{"role":', b'"assistant"', b'42', b'\n', b'error', b'of']
        while len(out) < n:
            out += words[g.next() % len(words)] + b' '
    elif pattern == 6:  # u32 constant version tag
        while len(out) < n:
            out += struct.pack('<I', 7)
    return bytes(out[:n])


STRATEGIES = [zlib.Z_DEFAULT_STRATEGY, zlib.Z_FILTERED, zlib.Z_HUFFMAN_ONLY, zlib.Z_RLE,
              zlib.Z_FIXED]


def compress(data, level, strategy, wbits, flush_every):
    c = zlib.compressobj(level, zlib.DEFLATED, wbits, 8, strategy)
    if not flush_every:
        return c.compress(data) + c.flush()
    out = b''
    for i in range(0, len(data), flush_every):
        out += c.compress(data[i:i + flush_every])
        out += c.flush(zlib.Z_SYNC_FLUSH if (i // flush_every) % 2 == 0 else zlib.Z_FULL_FLUSH)
    return out + c.flush()


def main():
    vecs = []
    seed = 1
    sizes = [0, 1, 2, 3, 7, 100, 1000, 4096, 33000]
    for pattern in range(7):
        for n in sizes:
            for level in (0, 1, 6, 9):
                if n > 4096 and (level != 6 or pattern in (1, 2)):
                    continue  # big inputs: compressible ones at level 6 only (file size)
                if level == 0 and n > 1000:
                    continue  # stored blocks of big inputs: one case below
                vecs.append((pattern, level, 0, 15, seed, n, 0))
                seed += 1
    # every strategy on the per-token patterns
    for pattern in (2, 3, 4, 6):
        for si in range(1, len(STRATEGIES)):
            vecs.append((pattern, 6, si, 15, seed, 4096, 0))
            seed += 1
    # window sizes (CINFO 1..7)
    for wbits in range(9, 16):
        vecs.append((5, 9, 0, wbits, seed, 6000, 0))
        seed += 1
    # several blocks, empty stored blocks from flushes
    for pattern in (1, 3, 5):
        vecs.append((pattern, 6, 0, 15, seed, 5000, 777))
        seed += 1
    # several stored blocks (level 0 with flushes: full, then empty stored blocks)
    vecs.append((4, 0, 0, 15, seed, 3000, 777))
    seed += 1
    # a long match-heavy input at level 9 (matches of 258, distances near 32 KiB)
    vecs.append((5, 9, 0, 15, seed, 200000, 0))

    body = b''
    for (pattern, level, si, wbits, sd, n, fe) in vecs:
        raw = make_input(pattern, sd, n)
        z = compress(raw, level, STRATEGIES[si], wbits, fe)
        assert zlib.decompress(z) == raw
        body += struct.pack('<BBBBIIII', pattern, level, si, wbits, sd, n, fe, len(z)) + z
    out = b'ARLZ' + struct.pack('<II', 1, len(vecs)) + body
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'deflate_vectors.bin')
    with open(path, 'wb') as f:
        f.write(out)
    print(f'{path}: {len(vecs)} vectors, {len(out)} bytes')


if __name__ == '__main__':
    main()
