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
  # End-to-end training runs (minutes each in Release) run in the Release pass only; under
  # ASan at -O0 they take 10-20x longer. Their code paths are covered by the unit tests here.
  asan_skip="test_learner_calculator_ci|test_learner_resume|test_learner_update|test_train_sft_policy|test_policy_backward_(segment|variants)|test_rollout_(envs|weights|kill)"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAGENTRL_SANITIZE=ON -DAGENTRL_CUDA=OFF >/dev/null
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "unit|integration" -LE "slow|mpi|bench" \
      -E "$asan_skip"
fi
if [ "${ARL_TEST_FUZZ:-1}" = 1 ] && command -v clang >/dev/null; then
  # libFuzzer targets (response parser, tool-call arguments, safetensors/npy headers, replay
  # blobs with codec 1, PNG/PPM images), run briefly; a crash fails the suite. Longer runs:
  # ARL_FUZZ_SECONDS=600. The image target starts from the test images (copies, each after
  # the target's mode byte: libFuzzer writes what it finds into its first corpus folder).
  echo "== fuzzing (${ARL_FUZZ_SECONDS:-20} s per target) =="
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DAGENTRL_FUZZ=ON -DAGENTRL_CUDA=OFF >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_aep_response fuzz_tool_args fuzz_safetensors fuzz_blob \
    fuzz_image
  rm -rf build-fuzz/corpus-image && mkdir -p build-fuzz/corpus-image
  for f in tests/image/fixtures/*.png; do # mode byte 0: the file as it is
    { printf '\0'; cat "$f"; } >"build-fuzz/corpus-image/$(basename "$f")"
  done
  for t in build-fuzz/tests/envs_aep/fuzz_aep_response build-fuzz/tests/envs_aep/fuzz_tool_args \
           build-fuzz/tests/safetensors/fuzz_safetensors build-fuzz/tests/replay/fuzz_blob \
           build-fuzz/tests/image/fuzz_image; do
    corpus=()
    [ "$(basename "$t")" = fuzz_image ] && corpus=(build-fuzz/corpus-image)
    if ! "$t" -max_total_time="${ARL_FUZZ_SECONDS:-20}" -print_final_stats=1 "${corpus[@]}" \
        >build-fuzz/fuzz.log 2>&1; then
      tail -n 60 build-fuzz/fuzz.log
      echo "fuzz target $t failed (log above)" >&2
      exit 1
    fi
    echo "$(basename "$t"): $(grep -E '^stat::number_of_executed_units' build-fuzz/fuzz.log) (no crash)"
  done
fi
echo "== all tests passed =="
