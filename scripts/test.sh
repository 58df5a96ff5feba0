#!/usr/bin/env bash
# scripts/test.sh: set up (packages, configure, build) and run the whole test suite with ctest.
# Tests labelled `slow` are excluded (run them with: ctest --test-dir build -L slow);
# `gpu` tests skip themselves (exit 77) on machines without a GPU.
#
# ARL_TEST_SANITIZE=1 (the default) also builds with AddressSanitizer + UBSan into
# build-asan/ and runs the unit and integration tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
export ARL_SETUP_TESTS=1
bash scripts/setup.sh

jobs="$(nproc 2>/dev/null || echo 2)"
build="${ARL_BUILD_DIR:-build}"
echo "== test suite ($build) =="
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE slow

if [ "${ARL_TEST_SANITIZE:-1}" = 1 ]; then
  echo "== AddressSanitizer + UBSan build (build-asan) =="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAGENTRL_SANITIZE=ON -DAGENTRL_CUDA=OFF >/dev/null
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "unit|integration" -LE "slow|mpi|bench"
fi
echo "== all tests passed =="
