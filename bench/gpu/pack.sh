#!/bin/sh
# bench/gpu/pack.sh: everything bench/gpu/run.sh --tests runs, prebuilt, in one archive small
# enough to travel to a GPU machine that has CUDA but not this project's CPU-side libraries
# (the lent H200's image: nvcc, cuBLAS, PyTorch; no jansson, OpenBLAS, SQLite, libcurl,
# libmicrohttpd or OpenMPI, and nothing can be installed there).
#
#   bench/gpu/pack.sh [BUILD_DIR] [OUT]     # default: build, .gpu-pack/pack.tar.xz
#   PACK=.gpu-pack/pack.tar.xz bash bench/gpu/run.sh --tests   # there: no build, the pack's
#
# BUILD_DIR: a Release build with CUDA (nvcc found; sm_90 by default).  The pack holds: the
# gpu-labelled tests and a manifest of their ctest arguments, the GPU benchmarks, agentrl,
# bench_train and bench_rollout, stripped; the shared libraries they load except the C library
# and CUDA's own (cudart, cuBLAS, NCCL: the GPU machine's, found there by run.sh); OpenMPI's
# plugins and the libraries those load (MPI_Init of a lone process needs them).  Prints the
# archive's size (a device call carries at most 64 MiB in all: .gpu-pack/ is git-ignored, so
# name it in the call's carry).  Exits 1 when a target does not build.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
usage="usage: $0 [BUILD_DIR] [OUT]   (default: build, .gpu-pack/pack.tar.xz)"
case "${1:-}" in
-h | --help)
    echo "$usage"
    echo "the GPU programs and tests of a CUDA build, with their libraries, in one archive for"
    echo "a GPU machine without this project's packages: PACK=OUT bash bench/gpu/run.sh --tests"
    exit 0
    ;;
-*) echo "pack.sh: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
esac
[ -d "${1:-$root/build}" ] ||
    { echo "pack.sh: ${1:-$root/build}: no such build directory" >&2; exit 1; }
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/.gpu-pack/pack.tar.xz}
jobs=$(nproc 2>/dev/null || echo 2)
# (a cache where nvcc was named but the CUDA backend is off says CMAKE_CUDA_COMPILER:UNINITIALIZED)
{ grep -q '^CMAKE_CUDA_COMPILER:\(STRING\|FILEPATH\)=.*nvcc' "$build/CMakeCache.txt" &&
    ! grep -q '^AGENTRL_CUDA:BOOL=OFF' "$build/CMakeCache.txt"; } 2>/dev/null ||
    { echo "pack.sh: $build is not a build with CUDA (configure where nvcc is found)" >&2; exit 1; }

stage=$(mktemp -d "${TMPDIR:-/tmp}/arl-gpu-pack-XXXXXX") ||
    { echo "pack.sh: cannot create a directory in ${TMPDIR:-/tmp} (set TMPDIR)" >&2; exit 1; }
trap 'rm -rf "$stage"' EXIT
p=$stage/pack
mkdir -p "$p/bin" "$p/lib" "$p/openmpi"
# the gpu-labelled tests (the manifest: a test a line, its name, program and arguments)
(cd "$build" && ctest -L gpu --show-only=json-v1) | /usr/bin/python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    print(" ".join([t["name"], t["command"][0]] + t["command"][1:]))
' >"$stage/tests"
[ -s "$stage/tests" ] || { echo "pack.sh: no gpu-labelled tests in $build" >&2; exit 1; }
benches="bench_gpu bench_gpu_model bench_gpu_train bench_train bench_rollout agentrl"
targets="$(awk '{n = split($2, a, "/"); print a[n]}' "$stage/tests" | sort -u | tr '\n' ' ')"
# shellcheck disable=SC2086
cmake --build "$build" -j"$jobs" --target $targets $benches >/dev/null ||
    { echo "pack.sh: the build failed" >&2; exit 1; }
while read -r name exe args; do
    cp "$exe" "$p/bin/"
    echo "$name $(basename "$exe") $args"
done <"$stage/tests" >"$p/manifest"
for b in $benches; do
    f=$(find "$build" -type f -name "$b" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "pack.sh: $b not found under $build" >&2; exit 1; }
    cp "$f" "$p/bin/"
done
strip "$p"/bin/*
ompi=$(find /usr/lib -maxdepth 4 -type d -name 'openmpi3' -path '*openmpi/lib*' | head -1)
[ -n "$ompi" ] && cp "$ompi"/*.so "$p/openmpi/"
# the shared libraries, except glibc's and CUDA's (cudart, cuBLAS, NCCL: the GPU machine has them)
ldd "$p"/bin/* "$p"/openmpi/*.so 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so|libcuda|libcudart|libcublas|libnccl' |
    while read -r l; do cp -L "$l" "$p/lib/"; done
mkdir -p "$(dirname "$out")"
# one xz stream with a 64 MiB window: the programs share most of their bytes (the kernels)
(cd "$stage" && tar cf - pack) | xz -T1 -9 >"$out"
echo "pack.sh: $(wc -l <"$p/manifest") tests, $(ls "$p/bin" | wc -l) programs, $(ls "$p/lib" | wc -l) libraries: $out ($(du -h "$out" | cut -f1))"
if git -C "$root" rev-parse >/dev/null 2>&1; then # what a device call carries: the tree and the pack
    tree=$(cd "$root" && git ls-files -z | xargs -0 cat | wc -c)
    all=$(( (tree + $(wc -c <"$out")) / 1048576 ))
    echo "pack.sh: the tracked tree and the pack together: $all MiB (a device call carries 64 MiB at most)"
    [ "$all" -lt 64 ] || echo "pack.sh: warning: too large to travel with the tree" >&2
fi
