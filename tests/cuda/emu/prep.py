#!/usr/bin/env python3
"""tests/cuda/emu/prep.py SRC.cu OUT.cpp: rewrite a kernels/cuda source for the CPU emulator.

- CUDA/cuBLAS/WMMA/NCCL system includes are dropped (emu_cuda.h stands in for them);
  kernels/cuda/internal.cuh becomes the rewritten internal_emu.h;
- `extern __shared__ float sm[];` becomes a pointer to the emulated block's shared memory;
- every launch `kern<<<grid, block, smem, stream>>>(args);` becomes
  `emu_launch(dim3(grid), dim3(block), smem, [k = kern, a = make_tuple(args)] { apply(k, a); });`
  (arguments evaluated at the launch, as CUDA does: graph replays see the launch's values).
Only the text the backend actually uses is handled; this is a test tool, not a CUDA parser.
"""
import re
import sys

src = open(sys.argv[1]).read()
out = []
for line in src.split("\n"):
    if line.startswith("#include"):
        if line.endswith('internal.cuh"'):
            out.append('#include "internal_emu.h"')
        elif "<" in line and any(w in line for w in ("cuda", "cublas", "mma", "nccl")):
            pass
        else:
            out.append(line)
        continue
    out.append(line)
src = "\n".join(out)
src = src.replace("extern __shared__ float sm[];", "float *sm = emu_sm();")


def split_top(cfg):
    parts, depth, cur = [], 0, ""
    for ch in cfg:
        if ch in "([":
            depth += 1
        if ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def launch(m):
    name, cfg, args = m.group(1), m.group(2), m.group(3)
    args = re.sub(r"\bNULL\b", "nullptr", args)  # a tuple keeps nullptr convertible
    p = split_top(cfg)
    smem = p[2] if len(p) > 2 else "0"
    # the arguments are evaluated at the launch (as CUDA copies them), not when the emulated
    # kernel runs: a graph replay must not read the launcher's (dead) locals
    # (the kernel is captured too: it may be a local function pointer)
    return ("emu_launch(dim3(%s), dim3(%s), (size_t)(%s), "
            "[emu_k_ = %s, emu_args_ = std::make_tuple(%s)] { std::apply(emu_k_, emu_args_); });" % (
                p[0], p[1], smem, name, args))


# (a line break may stand between the kernel's name and <<<: clang-format puts one there)
src = re.sub(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\((.*?)\);", launch, src, flags=re.S)
if sys.argv[1].endswith("internal.cuh"):
    src = src.replace('#include "kernels/cuda/cuda.h"',
                      '#include "emu_cuda.h"\n#include "kernels/cuda/cuda.h"')
    src = src.replace('extern "C" {\n', 'extern "C" {\n#include "core/status.h"\n', 1)
open(sys.argv[2], "w").write(src)
