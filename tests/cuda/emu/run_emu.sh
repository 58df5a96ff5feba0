#!/bin/sh
# tests/cuda/emu/run_emu.sh BUILD_DIR [WORK_DIR]: run the CUDA parity tests (tests/cuda/*.c,
# list below) on the CPU, with every kernel of kernels/cuda/*.cu executed by the emulator of
# emu_cuda.h (every CUDA thread a fiber: emu_rt.cpp).  BUILD_DIR holds libarl_policy.a,
# libarl_kernels.a and libarl_core.a of a CPU build (any build dir of this project).
# Checks the kernels' indexing, synchronisation and contracts, not GPU numerics or speed
# (see emu_cuda.h).  About 4 minutes on a 2-core machine (half a minute of it compiling),
# after the emulator's self-test (emu_selftest.cpp).  Exits 77 when g++ or the libraries are
# missing.
# EMU_ASAN=1: build with AddressSanitizer and give every arena allocation its own heap block,
# so an out-of-bounds access of a kernel to a buffer (or to its shared memory) is reported
# (slower still: run it when a kernel's indexing changes).
# EMU_CP_ASYNC=defer: an asynchronous copy (cp.async) lands only when the wait_group that
# retires its group runs, not at once: a kernel that reads a tile before waiting for it reads
# stale bytes (or the NaN of fresh shared memory) and fails its test (run it when a pipeline
# changes).
# EMU_WGMMA=defer: a Hopper warpgroup product (wgmma, kernels/cuda/*_wgmma.cu) is computed at
# the wait that retires it, not when issued: a kernel that refills a stage the products still
# read (copies landing at once), or reads the accumulators before the wait, fails its test.
# EMU_TSAN=1: build with ThreadSanitizer: two threads of a block touching the same bytes (shared
# or global memory) without a barrier, __syncwarp, shuffle or atomic between them - a missing
# __syncthreads, a reuse of shared memory a previous step still reads - is reported even when
# the numbers come out right, and the test fails (exit 66); races between blocks are not seen
# (blocks run one at a time).  Slower again; OpenBLAS runs single-threaded under it.
# EMU_SCHED=reverse: a block's threads run in the opposite order (a result that depends on the
# order shows).  EMU_PTHREADS=1: a pthread per CUDA thread instead of fibers (far slower; to
# cross-check the fibers).
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
emu="$root/tests/cuda/emu"
build=${1:?usage: run_emu.sh BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d /tmp/arl-cuda-emu-XXXXXX)}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v g++ >/dev/null 2>&1 || { echo "skip: no g++"; exit 77; }
for l in libarl_policy.a libarl_kernels.a libarl_core.a; do
    [ -f "$build/$l" ] || { echo "skip: $build/$l not built"; exit 77; }
done
mkdir -p "$work"
flags="-O1"
rtflags="" # emu_rt.cpp: fibers, or a pthread per CUDA thread (EMU_PTHREADS=1; its header)
[ "${EMU_PTHREADS:-0}" = 1 ] && rtflags="-DEMU_PTHREADS"
if [ "${EMU_ASAN:-0}" = 1 ]; then
    flags="-O1 -g -fsanitize=address"
    export ASAN_OPTIONS=detect_leaks=0
fi
if [ "${EMU_TSAN:-0}" = 1 ]; then
    flags="-O1 -g -fsanitize=thread"
    export TSAN_OPTIONS="report_signal_unsafe=0 ${TSAN_OPTIONS:-}"
    export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
fi
"$py" "$emu/prep.py" "$root/kernels/cuda/internal.cuh" "$work/internal_emu.h"
objs=""
for f in "$root"/kernels/cuda/*.cu; do
    b=$(basename "$f" .cu)
    "$py" "$emu/prep.py" "$f" "$work/$b.cpp"
    if [ "${EMU_ASAN:-0}" = 1 ] && [ "$b" = context ]; then # one heap block per allocation
        sed -i 's/    \*out = ctx->arena + ctx->top;/    *out = aligned_alloc(256, need);/' \
            "$work/$b.cpp"
        grep -q 'aligned_alloc(256, need)' "$work/$b.cpp" || { echo "run_emu: alloc patch failed"; exit 1; }
    fi
    g++ -std=c++17 $flags -w -I"$root" -I"$emu" -I"$work" -c "$work/$b.cpp" -o "$work/$b.o"
    objs="$objs $work/$b.o"
done
g++ -std=c++17 $flags $rtflags -w -I"$emu" -c "$emu/emu_rt.cpp" -o "$work/emu_rt.o"
# the emulator's own barriers, shuffles and stuck-block check first
g++ -std=c++17 $flags $rtflags -w -I"$root" -I"$emu" "$emu/emu_selftest.cpp" "$work/emu_rt.o" \
    -o "$work/emu_selftest" -lpthread
echo "== emu_selftest"
env -u ARL_TEST_CASES "$work/emu_selftest" || exit 1 # all of it, whatever cases the tests run
libs="$build/libarl_policy.a $build/libarl_kernels.a $build/libarl_core.a"
extra=$(pkg-config --libs openblas jansson 2>/dev/null || echo "-lopenblas -ljansson")
# the C side of arl_cuda (backend selection) and the golden-weights reader of the model test
for c in "$root"/kernels/cuda/*.c; do
    gcc -std=c11 $flags -D_GNU_SOURCE -I"$root" -c "$c" -o "$work/$(basename "$c" .c)_c.o"
    objs="$objs $work/$(basename "$c" .c)_c.o"
done
gcc -std=c11 $flags -D_GNU_SOURCE -I"$root" -c "$root/tests/golden/golden.c" -o "$work/golden.o"
if [ "${EMU_TSAN:-0}" = 1 ]; then # the CPU reference's thread pool instrumented too (linked
    # before libarl_kernels.a, whose copy is then not pulled in): ThreadSanitizer sees its
    # hand-offs instead of reporting the reference's own threads
    gcc -std=c11 $flags -D_GNU_SOURCE -I"$root" -c "$root/kernels/cpu/threadpool.c" \
        -o "$work/threadpool_c.o"
    objs="$objs $work/threadpool_c.o"
fi
rc=0
# EMU_TESTS: the tests to run (default: all of them, fp32 cases).  test_ops, test_model_ops
# and test_train_ops: the ops of the "cuda" table, forward and training; test_model_device: the
# tiny model's forward, prefill and decode steps of policy/model_device.c ("cuda-emu": the
# fp32 cases, not the bf16 one); test_model_train: whole training steps of
# policy/model_device_backward.c, fp32 (ARL_TEST_CASES=test_cuda_bf16 runs its three bf16
# cases instead: about 5 minutes); test_model_train_state: one segment of 28 tokens
# trained from decode states (arl_model_dev_train_forward_state and the state gradients);
# test_model_sparse: block-sparse MLA in the device model's inference paths.
export ARL_CUDA_EMU=1 # the tests' cases too large for the emulator skip themselves
for t in ${EMU_TESTS:-test_ops test_model_ops test_train_ops test_model_device test_model_train \
    test_model_train_state test_model_sparse}; do
    gcc -std=c11 $flags -D_GNU_SOURCE -I"$root" -c "$root/tests/cuda/$t.c" -o "$work/$t.o"
    g++ $flags -o "$work/$t" "$work/$t.o" "$work/golden.o" $objs "$work/emu_rt.o" $libs $extra \
        -lpthread -lm
    echo "== $t (emulated)"
    arg=""
    [ "$t" = test_model_device ] && arg=cuda-emu
    [ "$t" = test_model_train ] && arg=cuda-emu
    [ "$t" = test_model_train_state ] && arg=cuda-emu
    [ "$t" = test_model_sparse ] && arg=cuda-emu
    "$work/$t" $arg || rc=1
done
exit $rc
