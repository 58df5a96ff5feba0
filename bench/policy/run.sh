#!/bin/sh
# bench/policy/run.sh: the whole policy benchmark in one command.
#
# Builds bench_policy and the agentrl CLI (in $BUILD), writes a tiny checkpoint with
# 'agentrl model init tiny DIR --seed $SEED', checks 'agentrl score' logits on that checkpoint
# against the PyTorch baseline (bench/policy/torch_model.py --verify-only, which also checks
# itself against the golden tiny model), then runs bench_policy on the same checkpoint.
# Without /usr/bin/python3 + torch the score check is skipped and bench_policy prints the C
# numbers only.  Exit status: bench_policy's (2: a bad option, reported before any work), or 1
# if a build or check fails; 130/143 after Ctrl-C/SIGTERM, which stop the step running.  The
# work directory ($TMPDIR or /tmp) is removed in every case.
#
# Usage: bench/policy/run.sh [bench_policy options]      e.g. --reps 7   (--help: its options)
# Environment: BUILD (build dir, default build-bench), THREADS (2), SEED (1),
#   OPENBLAS_CORETYPE (passed through to both implementations; e.g. SkylakeX where
#   OpenBLAS 0.3.21 misdetects the CPU as Prescott - bench_policy prints the core in use).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
PY=/usr/bin/python3

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target bench_policy agentrl -j2 >/dev/null
BENCH=$BUILD/bench/policy/bench_policy
# --help, and the options checked before any work (a bad one: bench_policy's message, exit 2)
for a in "$@"; do
    case "$a" in -h | --help) exec "$BENCH" --help ;; esac
done
ARL_BENCH_CHECK_OPTIONS=1 "$BENCH" "$@" || exit $?

TMP=${TMPDIR:-/tmp}
WORK=$(mktemp -d "$TMP/bench_policy_run.XXXXXX") || {
    echo "run.sh: cannot create a work directory in $TMP (set TMPDIR to a writable directory)" >&2
    exit 1
}
# Each step runs in the background and is waited for, so that a signal reaches this script at
# once (a foreground step would run to its end first); the handler stops the step.  (A
# background step ignores SIGINT in a script: it is sent SIGTERM.)
pid=""
# shellcheck disable=SC2317 # (called by the traps)
stop() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    exit "$1"
}
trap 'rm -rf "$WORK"' EXIT
trap 'stop 130' INT
trap 'stop 143' TERM
step() { # step CMD ARGS...: run it as described above; its exit status
    "$@" &
    pid=$!
    st=0
    wait "$pid" || st=$?
    pid=""
    return "$st"
}
cd "$ROOT"
step "$BUILD/agentrl" --quiet model init tiny "$WORK/ckpt" --seed "$SEED" >/dev/null

if [ -x "$PY" ] && "$PY" -c "import torch, numpy" 2>/dev/null; then
    step "$PY" -c "import numpy as np; rng = np.random.default_rng($SEED);
np.save('$WORK/tok.npy', rng.integers(0, 384, 300).astype(np.int32))"
    step "$BUILD/agentrl" --quiet score --ckpt "$WORK/ckpt" --tokens "$WORK/tok.npy" \
        --logits-out "$WORK/logits.npy" --threads "$THREADS" >/dev/null
    if ! step "$PY" "$ROOT/bench/policy/torch_model.py" --ckpt "$WORK/ckpt" --threads "$THREADS" \
        --verify-only --check-tokens "$WORK/tok.npy" --check-logits "$WORK/logits.npy" \
        >"$WORK/verify.json"; then
        echo "run.sh: 'agentrl score' logits and the PyTorch baseline disagree:" >&2
        cat "$WORK/verify.json" >&2
        exit 1
    fi
    echo "run.sh: 'agentrl score' logits (T = 300) agree with the PyTorch baseline"
else
    echo "run.sh: $PY with torch unavailable: 'agentrl score' cross-check skipped"
fi

status=0
step "$BENCH" --ckpt "$WORK/ckpt" --threads "$THREADS" "$@" || status=$?
exit $status
