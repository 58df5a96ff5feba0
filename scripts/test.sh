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
  # Only the tests run here are built (CMakeLists.txt arl_test_wanted): unit and integration,
  # not mpi (OpenMPI's own allocations read as leaks), slow, bench or gpu. End-to-end training
  # runs (minutes each in Release) are marked NOT_SANITIZED and run in the Release pass only;
  # under the sanitizers they take about 4x longer (a learner update: 16 s vs 4 s). Their code
  # paths are covered by the unit tests here.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DAGENTRL_SANITIZE=ON -DAGENTRL_CUDA=OFF >/dev/null
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -L "unit|integration" -LE "slow|mpi|bench"
fi
if [ "${ARL_TEST_FUZZ:-1}" = 1 ] && command -v clang >/dev/null; then
  # libFuzzer targets (response parser, tool-call arguments, safetensors/npy headers, replay
  # blobs with codec 1, PNG/PPM images, the chat template's turn parser and conversation
  # reader, model configs and rollout keys, SFT data files), run briefly; a crash, a sanitizer
  # report (undefined behaviour included) or a failed invariant fails the suite. Longer runs:
  # ARL_FUZZ_SECONDS=600.
  echo "== fuzzing (${ARL_FUZZ_SECONDS:-10} s per target) =="
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DAGENTRL_FUZZ=ON -DAGENTRL_CUDA=OFF >/dev/null
  targets=(envs_aep/fuzz_aep_response envs_aep/fuzz_tool_args safetensors/fuzz_safetensors
           replay/fuzz_blob image/fuzz_image tokenizer/fuzz_chat policy_config/fuzz_config
           train/fuzz_sft_data)
  cmake --build build-fuzz -j "$jobs" --target "${targets[@]##*/}"
  # Seeds for the targets that read a mode byte first: the files of the project, each after
  # its mode (copies: libFuzzer writes what it finds into its first corpus folder).
  seed() { # seed NAME MODE FILE...: copies of FILE... after the byte MODE into corpus-NAME
    local dir=build-fuzz/corpus-$1 mode=$2 k=0
    shift 2
    mkdir -p "$dir"
    for f in "$@"; do
      { printf "\\$mode"; cat "$f"; } >"$dir/$k-$(basename "$f")"
      k=$((k + 1))
    done
  }
  rm -rf build-fuzz/corpus-*
  seed fuzz_image 000 tests/image/fixtures/*.png
  seed fuzz_chat 000 tests/tokenizer/fixtures/golden_conversation.json
  seed fuzz_config 000 configs/*/config.json
  seed fuzz_config 001 experiments/*.json
  # a sampled turn with a tool call: mode 1, "hi ", <|tool_call|>calc<|tool_args|>{"a":1}
  # <|tool_call_end|><|end_of_msg|> (0x01 k: the id 256 + k)
  printf '\001hi \001\012calc\001\013{"a":1}\001\014\001\011' >build-fuzz/corpus-fuzz_chat/turn
  # SFT data files after their three settings bytes (tests/fuzz/fuzz_sft_data.c): conversations
  # sharing a system prompt, a blank line and the bare-array form (shared prefix, max_seq_tokens
  # 130, budget 130); a teacher's tool-call demonstration (max_seq_tokens 258, budget 258)
  mkdir -p build-fuzz/corpus-fuzz_sft_data
  { printf '\001\100\040'
    printf '%s\n' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}' '' \
      '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}' \
      '[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]'
  } >build-fuzz/corpus-fuzz_sft_data/convs
  { printf '\000\200\100'
    printf '%s\n' '{"messages": [{"role": "user", "content": "What is 7 + 5?"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1_0", "type": "function", "function": {"name": "calc", "arguments": "{\"expression\":\"7 + 5\"}"}}]}, {"role": "tool", "tool_call_id": "call_1_0", "content": "12"}, {"role": "assistant", "content": "12"}], "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}], "meta": {"env": "calculator"}}'
  } >build-fuzz/corpus-fuzz_sft_data/tools
  # the targets run side by side, $jobs at a time (each is one process); a failure stops the
  # pass once the running ones are done
  fuzz_one() { # fuzz_one PATH: run one target for ARL_FUZZ_SECONDS, log in build-fuzz/NAME.log
    local name=${1##*/} corpus=()
    [ -d "build-fuzz/corpus-$name" ] && corpus=("build-fuzz/corpus-$name")
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "build-fuzz/tests/$1" \
      -max_total_time="${ARL_FUZZ_SECONDS:-10}" -print_final_stats=1 "${corpus[@]}" \
      >"build-fuzz/$name.log" 2>&1
  }
  declare -A pid_of=()
  fuzz_wait() { # wait for one running target; report it, fail the suite if it failed
    local done_pid rc=0 name
    wait -n -p done_pid "${!pid_of[@]}" || rc=$?
    name=${pid_of[$done_pid]}
    unset "pid_of[$done_pid]"
    if [ "$rc" != 0 ]; then
      tail -n 60 "build-fuzz/$name.log"
      echo "fuzz target $name failed (log above)" >&2
      wait # the others finish first (their logs stay in build-fuzz/)
      exit 1
    fi
    echo "$name: $(grep -E '^stat::number_of_executed_units' "build-fuzz/$name.log") (no crash)"
  }
  for t in "${targets[@]}"; do
    [ "${#pid_of[@]}" -ge "$jobs" ] && fuzz_wait
    fuzz_one "$t" &
    pid_of[$!]=${t##*/}
  done
  while [ "${#pid_of[@]}" -gt 0 ]; do fuzz_wait; done
fi
echo "== all tests passed =="
