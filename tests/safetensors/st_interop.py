#!/usr/bin/python3
"""Interop of agentrl's safetensors/.npy code with independent Python implementations.

Usage: st_interop.py TOOL   (TOOL = build/tests/safetensors/st_interop_tool)

(a) Python -> C: write safetensors files with nothing but struct + json (several dtypes
    incl. BF16/F16/F8_E4M3, a scalar, an empty tensor, header order != data order, gaps,
    an unpadded header so data is unaligned), plus one expectation per tensor as a .npy
    written with struct ('<f8' values for floats, '<i8' for integers); `TOOL verify` reads
    the file with agentrl and compares tensor for tensor, exactly.  Also a sharded
    directory with an index written here.
(b) C -> Python: `TOOL write` / `TOOL write-dir` write with agentrl's writers; this script
    parses the bytes itself (header length, space padding, packed offsets, index.json) and
    checks every value against formulas and an independent bf16/f16 rounding.
If NumPy is importable the decoded arrays are cross-checked with np.frombuffer/np.load;
if torch is importable, bf16/f16 decoding and rounding are cross-checked with torch.
Neither is required.  Exit 0 on success, 1 on a mismatch.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # CI may lack numpy
    np = None
try:
    import torch
except ImportError:  # CI lacks torch
    torch = None

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL", what, file=sys.stderr)


# ---- independent scalar codecs ----

def f32_round(x):
    """Round a Python float (double) to the nearest fp32 value; overflow gives +-inf."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(float("inf"), x)


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_from_f32(x):
    """Round-to-nearest-even of an fp32 value to bf16 bits (NaN -> quiet NaN)."""
    u = f32_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    lower = u & 0xFFFF
    hi = u >> 16
    if lower > 0x8000 or (lower == 0x8000 and (hi & 1)):
        hi += 1
    return hi & 0xFFFF


def bf16_to_float(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def f16_bits(x):
    """fp32 value -> IEEE half bits, round to nearest even; overflow gives inf."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0x7C00 | (0x8000 if x < 0 else 0)


def f16_to_float(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


def f8e4m3_to_float(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1 + m / 8) * 2.0 ** (e - 7)


# ---- minimal .npy writer/reader (format 1.0) with struct only ----

def npy_bytes(descr, shape, payload):
    shp = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shp)
    total = 10 + len(d) + 1
    pad = (64 - total % 64) % 64
    hdr = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + payload


def write_expect(dirname, name, shape, values, is_float):
    fmt = "<%d%s" % (len(values), "d" if is_float else "q")
    with open(os.path.join(dirname, name + ".npy"), "wb") as f:
        f.write(npy_bytes("<f8" if is_float else "<i8", shape, struct.pack(fmt, *values)))


def npy_parse(buf):
    assert buf[:8] == b"\x93NUMPY\x01\x00", buf[:8]
    hl = struct.unpack("<H", buf[8:10])[0]
    d = eval(buf[10:10 + hl].decode("latin1"), {"__builtins__": {}}, {"False": False, "True": True})
    return d, buf[10 + hl:], (10 + hl) % 64 == 0


# ---- (a) Python writes, C reads ----

def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def python_tensors():
    """(name, dtype, shape, raw bytes, expected values, is_float) for the Python-written file."""
    out = []
    vals = [((i * 37) % 23 - 11) / 8.0 for i in range(12)]
    out.append(("f32.mat", "F32", [3, 4], struct.pack("<12f", *vals), vals, True))
    v64 = [1 / 3, -2.5e-300, 1e300, float("inf"), -0.0]
    out.append(("f64.vec", "F64", [5], struct.pack("<5d", *v64), [f32_round(x) for x in v64], True))
    src = [math.sin(i) * 300 for i in range(12)] + [float("nan"), 3.0e38, -1e-40]
    bits = [bf16_from_f32(f32_round(x)) for x in src]
    out.append(("bf16.w", "BF16", [3, 5], struct.pack("<15H", *bits),
                [bf16_to_float(h) for h in bits], True))
    hsrc = [1.0, -2.5, 65504.0, 6e-8, 1e-5, -0.0, float("inf"), 0.333]
    hb = [f16_bits(f32_round(x)) for x in hsrc]
    out.append(("f16.h", "F16", [8], struct.pack("<8H", *hb), [f16_to_float(h) for h in hb], True))
    f8 = [0x00, 0x01, 0x38, 0x7E, 0xFE, 0x7F, 0x80, 0x45]
    out.append(("f8.e4m3", "F8_E4M3", [2, 4], bytes(f8), [f8e4m3_to_float(b) for b in f8], True))
    ints = [
        ("i8", "I8", "b", [-128, -1, 0, 127]),
        ("u8", "U8", "B", [0, 1, 200, 255]),
        ("i16", "I16", "h", [-32768, 12345, 32767]),
        ("u16", "U16", "H", [0, 65535]),
        ("i32", "I32", "i", [-2**31, 7, 2**31 - 1, 16777217]),
        ("u32", "U32", "I", [2**32 - 1, 5]),
        ("i64", "I64", "q", [-2**63, 2**40 + 1, 2**63 - 1]),
        ("u64", "U64", "Q", [0, 2**62]),
        ("bool", "BOOL", "B", [1, 0, 0, 1, 1]),
    ]
    for name, dt, fmt, v in ints:
        out.append(("int." + name, dt, [len(v)], struct.pack("<%d%s" % (len(v), fmt), *v), v, False))
    out.append(("scalar", "F32", [], struct.pack("<f", 2.75), [2.75], True))
    out.append(("empty", "BF16", [0, 3], b"", [], True))
    out.append(("i32.mat", "I32", [2, 1, 2], struct.pack("<4i", 1, -2, 3, -4), [1, -2, 3, -4], False))
    return out


def write_safetensors(path, tensors, metadata, unaligned=True):
    """Data in reverse declaration order with 3-byte gaps; header not padded (odd length)."""
    data = b""
    offs = {}
    for name, _dt, _shape, raw, _v, _f in reversed(tensors):
        data += b"\xAB" * 3
        offs[name] = (len(data), len(data) + len(raw))
        data += raw
    hdr = {"__metadata__": metadata} if metadata is not None else {}
    for name, dt, shape, _raw, _v, _f in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": list(offs[name])}
    text = json.dumps(hdr, separators=(",", ":")).encode()
    if unaligned and len(text) % 2 == 0:
        text += b" "
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def part_a(tool, tmp):
    tensors = python_tensors()
    exp = os.path.join(tmp, "expect")
    os.makedirs(exp)
    for name, _dt, shape, _raw, vals, is_float in tensors:
        write_expect(exp, name, shape, vals, is_float)
        check(len(vals) == numel(shape), "fixture %s size" % name)
    path = os.path.join(tmp, "py.safetensors")
    write_safetensors(path, tensors, {"format": "pt", "source": "st_interop.py"})
    r = subprocess.run([tool, "verify", path, exp, str(len(tensors)), "format=pt",
                        "source=st_interop.py"], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    check(r.returncode == 0, "C verify of the Python-written file (rc %d)" % r.returncode)
    nok = sum(1 for line in r.stdout.splitlines() if line.startswith("ok "))
    check(nok == len(tensors), "%d of %d tensors ok" % (nok, len(tensors)))

    # a sharded directory written here: 2 shards + index.json
    d = os.path.join(tmp, "pyckpt")
    os.makedirs(d)
    half = len(tensors) // 2
    shards = {"model-00001-of-00002.safetensors": tensors[:half],
              "model-00002-of-00002.safetensors": tensors[half:]}
    wm = {}
    for fname, ts in shards.items():
        write_safetensors(os.path.join(d, fname), ts, {"format": "pt"})
        for t in ts:
            wm[t[0]] = fname
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(len(t[3]) for t in tensors)}, "weight_map": wm}, f)
    r = subprocess.run([tool, "verify", d, exp, str(len(tensors)), "format=pt"],
                       capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    check(r.returncode == 0, "C verify of the Python-written sharded directory (rc %d)" % r.returncode)


# ---- (b) C writes, Python reads ----

def formula(i):
    return f32_round(((i * 7919) % 2001 - 1000) / 64.0 + (i % 3) * 1e-3)


def expected_c_tensors():
    f = [formula(i) for i in range(24)]
    big = [formula(i + 100) for i in range(3000)]
    return {
        "w.f32": ("F32", [2, 3, 4], f),
        "w.bf16": ("BF16", [30, 100], [bf16_from_f32(x) for x in big]),
        "w.f16": ("F16", [30, 100], [f16_bits(x) for x in big]),
        "w.f64": ("F64", [2, 3, 4], f),
        "i.i32": ("I32", [2, 3], [(i - 3) * 1000003 for i in range(6)]),
        "i.i64": ("I64", [3], [-1, 2**40, -2**63]),
        "i.u8": ("U8", [5], [i * 60 for i in range(5)]),
        "i.bool": ("BOOL", [4], [i & 1 for i in range(4)]),
        "s.scalar": ("F32", [], [-0.0]),
        "s.empty": ("F32", [0, 4], []),
    }, big


FMT = {"F32": "f", "F64": "d", "BF16": "H", "F16": "H", "I32": "i", "I64": "q", "U8": "B",
       "BOOL": "B"}
NPDT = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1",
        "BOOL": "?"}


def parse_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    text = buf[8:8 + n]
    check(n % 8 == 0, "%s: header length %d is a multiple of 8" % (path, n))
    stripped = text.rstrip(b" ")
    check(len(text) - len(stripped) < 8, "%s: padding below 8 spaces" % path)
    hdr = json.loads(text)
    return hdr, buf[8 + n:]


def check_c_file(hdr, data, expect, names, path):
    meta = hdr.pop("__metadata__", None)
    check(meta is not None and meta.get("format") == "pt", "%s: metadata format=pt" % path)
    check(sorted(hdr) == sorted(names), "%s: tensor names %s" % (path, sorted(hdr)))
    pos = 0
    for name in names:  # declaration order = data order, packed
        e = hdr[name]
        dt, shape, vals = expect[name]
        b, end = e["data_offsets"]
        check(e["dtype"] == dt and e["shape"] == shape, "%s: %s dtype/shape" % (path, name))
        check(b == pos, "%s: %s packed at %d (got %d)" % (path, name, pos, b))
        raw = data[b:end]
        got = list(struct.unpack("<%d%s" % (len(vals), FMT[dt]), raw))
        same = all(
            (g == v and math.copysign(1, g) == math.copysign(1, v)) if isinstance(v, float) else g == v
            for g, v in zip(got, vals)) and len(got) == len(vals)
        check(same, "%s: %s values" % (path, name))
        if np is not None and dt in NPDT:
            a = np.frombuffer(raw, dtype=NPDT[dt])
            if dt in ("F16",):
                ref = np.array([f16_to_float(h) for h in vals], dtype=np.float64)
            else:
                ref = np.array(vals, dtype=np.float64 if dt in ("F32", "F64") else np.int64)
            check(a.size == len(vals) and np.array_equal(a.astype(ref.dtype), ref),
                  "%s: %s numpy decode" % (path, name))
        pos = end
    check(pos == len(data), "%s: data section ends at the last tensor" % path)


def part_b(tool, tmp):
    expect, big = expected_c_tensors()
    names = ["w.f32", "w.bf16", "w.f16", "w.f64", "i.i32", "i.i64", "i.u8", "i.bool", "s.scalar",
             "s.empty"]
    path, npy = os.path.join(tmp, "c.safetensors"), os.path.join(tmp, "c.npy")
    r = subprocess.run([tool, "write", path, npy], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    check(r.returncode == 0, "C write (rc %d)" % r.returncode)
    if r.returncode:
        return
    hdr, data = parse_safetensors(path)
    check(hdr.get("__metadata__", {}).get("writer") == "agentrl", "metadata writer=agentrl")
    check(list(hdr)[0] == "__metadata__", "__metadata__ comes first")
    check_c_file(hdr, data, expect, names, path)

    # the .npy written by agentrl: struct parse, and numpy.load if present
    with open(npy, "rb") as f:
        buf = f.read()
    d, payload, aligned = npy_parse(buf)
    check(d == {"descr": "<f4", "fortran_order": False, "shape": (3, 5)}, "npy header %r" % d)
    check(aligned, "npy data 64-byte aligned")
    check(list(struct.unpack("<15f", payload)) == [formula(i) for i in range(15)], "npy values")
    if np is not None:
        a = np.load(npy)
        check(a.dtype == np.float32 and a.shape == (3, 5) and
              a.ravel().tolist() == [formula(i) for i in range(15)], "numpy.load of agentrl npy")

    # sharded, limit 6100 bytes: [w.f32 96 + w.bf16 6000] [w.f16 6000] [w.f64 192 + the rest]
    d = os.path.join(tmp, "cckpt")
    r = subprocess.run([tool, "write-dir", d, "6100"], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    check(r.returncode == 0, "C write-dir (rc %d)" % r.returncode)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    wm = idx["weight_map"]
    files = sorted(set(wm.values()))
    check(files == ["model-%05d-of-00003.safetensors" % k for k in (1, 2, 3)], "shard names %s" % files)
    total = 0
    for fname in files:
        hdr, data = parse_safetensors(os.path.join(d, fname))
        mine = [n for n in names if wm[n] == fname]
        check_c_file(hdr, data, expect, mine, fname)
        total += len(data)
    check(idx["metadata"]["total_size"] == total, "total_size %s == %d" % (idx["metadata"], total))

    # torch cross-checks of bf16/f16 rounding and decoding (optional)
    if torch is not None:
        hdr, data = parse_safetensors(path)
        b, e = hdr["w.bf16"]["data_offsets"]
        tb = torch.frombuffer(bytearray(data[b:e]), dtype=torch.bfloat16)
        ref = torch.tensor(big, dtype=torch.float32).to(torch.bfloat16)
        check(torch.equal(tb.view(torch.int16), ref.view(torch.int16)), "torch bf16 rounding")
        check(tb.float().tolist() == [bf16_to_float(h) for h in expect["w.bf16"][2]],
              "torch bf16 decode")
        b, e = hdr["w.f16"]["data_offsets"]
        th = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float16)
        ref = torch.tensor(big, dtype=torch.float32).to(torch.float16)
        check(torch.equal(th.view(torch.int16), ref.view(torch.int16)), "torch f16 rounding")
        # an extreme-value sweep: every bf16 pattern decoded by torch vs struct
        allb = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        dec = allb.float().tolist()
        ok = all((a == bf16_to_float(h)) or (math.isnan(a) and math.isnan(bf16_to_float(h)))
                 for h, a in enumerate(dec))
        check(ok, "torch bf16 decode of all patterns")
        print("torch cross-checks done (torch %s)" % torch.__version__)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="arl-st-interop-") as tmp:
        part_a(tool, tmp)
        part_b(tool, tmp)
    print("numpy: %s, torch: %s" % ("yes" if np is not None else "no", "yes" if torch is not None else "no"))
    if FAILS:
        print("%d checks failed" % len(FAILS))
        return 1
    print("st_interop: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
