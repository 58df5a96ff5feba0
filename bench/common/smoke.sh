#!/bin/sh
# bench/common/smoke.sh: the benchmark programs as a user runs them, in seconds (ctest
# bench_smoke; ARL_BUILD_DIR is the build).  Checks, for every CPU benchmark: --help (exit 0,
# every option described), an unknown option and a bad value (exit 2, a message naming the
# option); then tiny runs that must end 0 and leave nothing in $TMPDIR, a run stopped by SIGTERM
# that must remove its directory too, a PyTorch baseline stopped by SIGINT (no traceback),
# TMPDIR pointing nowhere (a clear message, exit 1), no 'nan' printed without the PyTorch
# baseline, the GPU programs' arguments (checked before they look for a GPU; without one they
# exit 77) and bench_train --device cuda without a GPU (it says so before its rollout).
set -u
build=${ARL_BUILD_DIR:-build}
b=$build/bench
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_smoke.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# expect CODE TEXT CMD...: CMD exits CODE and its output (stdout + stderr) contains TEXT
expect() {
    code=$1 text=$2
    shift 2
    "$@" >"$work/out" 2>&1
    got=$?
    [ "$got" = "$code" ] || { fail "$* exited $got, expected $code"; sed 's/^/  /' "$work/out" | tail -5; }
    grep -q -- "$text" "$work/out" || { fail "$*: no '$text' in its output"; tail -5 "$work/out"; }
}

# ---- the command lines ----
for p in kernels/bench_kernels replay/bench_replay env/bench_env rollout/bench_rollout \
    train/bench_train train_step/bench_train_step policy/bench_policy; do
    prog=$b/$p
    [ -x "$prog" ] || { fail "$prog not built"; continue; }
    expect 0 "usage:" "$prog" --help
    # every option of the help has a description (a line '  --name ...  text')
    if grep -E '^  --[a-z0-9-]+( [A-Za-z|]+)? *$' "$work/out"; then
        fail "$p --help: an option without a description"
    fi
    expect 2 "'--no-such-option'" "$prog" --no-such-option
done
expect 2 "option 'threads'" "$b/kernels/bench_kernels" --threads 0
expect 2 "option 'threads-arg'" "$b/kernels/bench_kernels" 3x
expect 2 "option 'segments'" "$b/replay/bench_replay" --segments abc
expect 2 "option 'rounds'" "$b/replay/bench_replay" --rounds -1
expect 2 "option 'steps'" "$b/env/bench_env" --steps 99999999999
expect 2 "option 'steps-arg'" "$b/env/bench_env" 5
expect 2 "option 'turns'" "$b/rollout/bench_rollout" --turns 1x
expect 2 "option 'only'" "$b/rollout/bench_rollout" --only neither
expect 2 "option 'tasks'" "$b/train/bench_train" --tasks 0
expect 2 "option 'device'" "$b/train/bench_train" --device gpu
expect 2 "option 'rounds'" "$b/train_step/bench_train_step" --rounds 0
expect 2 "option 'reps'" "$b/policy/bench_policy" --reps 1e3

# ---- tiny runs: exit 0, nothing left in TMPDIR ----
mkdir "$work/tmp"
left() { # left WHAT: fail when the run left something in $work/tmp
    if [ -n "$(ls -A "$work/tmp")" ]; then
        fail "$1 left $(ls -A "$work/tmp") in TMPDIR"
        rm -rf "${work:?}"/tmp/*
    fi
}
export TMPDIR="$work/tmp"
expect 0 "raw socket" "$b/env/bench_env" --steps 100
expect 0 "READ ratio" "$b/replay/bench_replay" --segments 1 --rounds 1 --sustained 1 \
    --sustained-rounds 1
left bench_replay
# ARL_BENCH_KEEP=0 keeps nothing (any value kept the directory); =1 keeps it
ARL_BENCH_KEEP=0 expect 0 "READ ratio" "$b/replay/bench_replay" --segments 1 --rounds 1 \
    --sustained 1 --sustained-rounds 1
left "bench_replay with ARL_BENCH_KEEP=0"
ARL_BENCH_KEEP=1 expect 0 "READ ratio" "$b/replay/bench_replay" --segments 1 --rounds 1 \
    --sustained 1 --sustained-rounds 1
[ -n "$(ls -A "$work/tmp")" ] || fail "bench_replay with ARL_BENCH_KEEP=1 kept nothing"
rm -rf "${work:?}"/tmp/*
expect 0 "prefill tokens/s" "$b/rollout/bench_rollout" --quick --batch 1 --reps 1 --turns 1 \
    --turn-tokens 8 --obs-bytes 16
left bench_rollout
expect 0 "one side only" "$b/rollout/bench_rollout" --batch 1 --reps 1 --turns 1 \
    --turn-tokens 8 --obs-bytes 16 --only bare
left "bench_rollout --only bare"
expect 0 "learner update" "$b/train/bench_train" --tasks 1 --group 1 --reps 1
left bench_train
expect 0 "training sanity" "$b/train_step/bench_train_step" --no-baseline --docs 1 \
    --doc-tokens 32 --rounds 1 --steps 1
grep -i -w -E 'nan|inf' "$work/out" && fail "bench_train_step --no-baseline printed nan or inf"
left bench_train_step

# ---- SIGTERM: the run's directory goes with it ----
"$b/replay/bench_replay" >"$work/out" 2>&1 &
pid=$!
i=0
while [ -z "$(ls -A "$work/tmp")" ] && [ $i -lt 100 ]; do
    sleep 0.05
    i=$((i + 1))
done
sleep 0.3
kill -TERM $pid
wait $pid
rc=$?
[ $rc = 143 ] || fail "bench_replay after SIGTERM exited $rc, expected 143"
left "bench_replay stopped by SIGTERM"

# ---- a PyTorch baseline stopped by Ctrl-C (SIGINT) ends quietly, without a traceback ----
# (env --default-signal: a background job of a script starts with SIGINT ignored)
src=$(cd "$(dirname "$0")/../.." && pwd)
if /usr/bin/python3 -c 'import torch' 2>/dev/null &&
    "$build/agentrl" model init tiny "$work/ckpt" --seed 1 >/dev/null 2>&1; then
    mkfifo "$work/in"
    env --default-signal=INT /usr/bin/python3 "$src/bench/policy/torch_model.py" \
        --ckpt "$work/ckpt" --no-verify --serve <"$work/in" >"$work/out" 2>"$work/err" &
    pid=$!
    exec 3>"$work/in"
    i=0
    while ! grep -q '"ready"' "$work/out" && [ $i -lt 600 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -INT $pid
    wait $pid
    exec 3>&-
    grep -q '"ready"' "$work/out" || fail "torch_model.py --serve never said ready"
    grep -q Traceback "$work/err" && { fail "torch_model.py printed a traceback on SIGINT"; tail -3 "$work/err"; }
else
    echo "(no torch for /usr/bin/python3: the baseline's SIGINT check skipped)"
fi

# ---- TMPDIR pointing nowhere ----
TMPDIR=$work/none
expect 1 "cannot create a temporary directory in $work/none" "$b/train/bench_train" --reps 1
unset TMPDIR

# ---- the GPU programs (when built): arguments first, then exit 77 without a GPU ----
for p in bench_gpu bench_gpu_model bench_gpu_train; do
    prog=$b/gpu/$p
    [ -x "$prog" ] || continue
    expect 0 "usage:" "$prog" --help
    expect 2 "'--no-such-option'" "$prog" --no-such-option
done
[ -x "$b/gpu/bench_gpu_train" ] && expect 2 "option 'docs'" "$b/gpu/bench_gpu_train" --docs x
# bench_train --device cuda where it cannot run (no GPU, or a build without CUDA) says so
# before its CPU rollout: exit 77 without a device, 1 without the backend
if ! nvidia-smi -L >/dev/null 2>&1; then
    "$b/train/bench_train" --device cuda --tasks 1 --group 1 --reps 1 >"$work/out" 2>&1
    rc=$?
    case $rc in 1 | 77) ;; *) fail "bench_train --device cuda without a GPU exited $rc" ;; esac
    grep -q "device 'cuda'" "$work/out" || fail "bench_train --device cuda: no message naming the device"
    grep -q "rollout:" "$work/out" && fail "bench_train --device cuda ran its rollout before saying it cannot run"
fi

[ $fails = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "bench smoke: all checks passed"
