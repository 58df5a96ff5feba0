#!/usr/bin/env python3
"""Writes PNG test images with the Python standard library only (zlib + struct), each with the
expected decoded RGB as a binary PPM beside it.  Run once; the outputs are committed.

Covers: color types 0/2/3/4/6, bit depths 1/2/4/8/16, all five filter types, dynamic and
fixed Huffman blocks (zlib levels 0, 1, 9) and IDAT split across several chunks."""
import os
import random
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def chunk(tag, body):
    c = struct.pack(">I", len(body)) + tag + body
    return c + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def filter_rows(rows, bpp, ftypes):
    out = b""
    prev = bytes(len(rows[0]))
    for y, row in enumerate(rows):
        ft = ftypes[y % len(ftypes)]
        f = bytearray()
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            pred = [0, a, b, (a + b) >> 1, paeth(a, b, c)][ft]
            f.append((x - pred) & 0xFF)
        out += bytes([ft]) + bytes(f)
        prev = row
    return out


def write_png(name, w, h, ctype, depth, rows, rgb, palette=None, level=6, split=0):
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    bpp = max(1, channels * depth // 8)
    data = zlib.compress(filter_rows(rows, bpp, [0, 1, 2, 3, 4]), level)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
    if palette:
        png += chunk(b"PLTE", bytes(sum(palette, ())))
    png += chunk(b"tEXt", b"Comment\x00agentrl test")
    if split:
        for i in range(0, len(data), split):
            png += chunk(b"IDAT", data[i:i + split])
    else:
        png += chunk(b"IDAT", data)
    png += chunk(b"IEND", b"")
    with open(os.path.join(OUT, name + ".png"), "wb") as f:
        f.write(png)
    with open(os.path.join(OUT, name + ".expect.ppm"), "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (w, h) + bytes(rgb))


def main():
    os.makedirs(OUT, exist_ok=True)
    rnd = random.Random(1234)
    w, h = 37, 23
    # RGB 8-bit: smooth gradient plus noise (compresses with dynamic blocks)
    px = [[((x * 7 + rnd.randrange(8)) % 256, (y * 11) % 256, (x * y) % 256) for x in range(w)] for y in range(h)]
    rows = [bytes(sum(r, ())) for r in px]
    write_png("rgb8", w, h, 2, 8, rows, sum(sum(px, []), ()), level=9, split=100)
    write_png("rgb8_stored", w, h, 2, 8, rows, sum(sum(px, []), ()), level=0)
    write_png("rgb8_fast", w, h, 2, 8, rows, sum(sum(px, []), ()), level=1)
    # RGBA 8-bit: alpha dropped
    rows = [bytes(sum(((r, g, b, rnd.randrange(256)) for (r, g, b) in row), ())) for row in px]
    write_png("rgba8", w, h, 6, 8, rows, sum(sum(px, []), ()))
    # RGB 16-bit: high byte taken
    rows = [bytes(sum(((r, rnd.randrange(256), g, 0, b, 255) for (r, g, b) in row), ())) for row in px]
    write_png("rgb16", w, h, 2, 16, rows, sum(sum(px, []), ()))
    # gray 8 and gray+alpha 8
    g = [[(x * 5 + y * 3) % 256 for x in range(w)] for y in range(h)]
    write_png("gray8", w, h, 0, 8, [bytes(r) for r in g], sum(((v, v, v) for r in g for v in r), ()))
    write_png("graya8", w, h, 4, 8, [bytes(sum(((v, 9) for v in r), ())) for r in g],
              sum(((v, v, v) for r in g for v in r), ()))
    # gray at 1, 2, 4 bits
    for depth in (1, 2, 4):
        maxv = (1 << depth) - 1
        vals = [[rnd.randrange(maxv + 1) for x in range(w)] for y in range(h)]
        rows = []
        for r in vals:
            bits = "".join(format(v, "0%db" % depth) for v in r)
            bits += "0" * (-len(bits) % 8)
            rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
        rgb = sum(((v * 255 // maxv,) * 3 for r in vals for v in r), ())
        write_png("gray%d" % depth, w, h, 0, depth, rows, rgb)
    # palette 4-bit and 8-bit
    pal = [(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)) for _ in range(16)]
    vals = [[rnd.randrange(16) for x in range(w)] for y in range(h)]
    rows = []
    for r in vals:
        bits = "".join(format(v, "04b") for v in r)
        bits += "0" * (-len(bits) % 8)
        rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
    write_png("pal4", w, h, 3, 4, rows, sum((pal[v] for r in vals for v in r), ()), palette=pal)
    write_png("pal8", w, h, 3, 8, [bytes(r) for r in vals], sum((pal[v] for r in vals for v in r), ()), palette=pal)


if __name__ == "__main__":
    main()
