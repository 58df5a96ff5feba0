#!/bin/sh
# tests/learner/test_train_full.sh: a full disk while `agentrl train` writes its run folder is
# ARL_ERR_FULL, named with the file and the system's reason, and the note says to free space
# ("Free space, then continue"; before: "write error" or "writing F failed" without errno, and
# "Once the cause above is dealt with").  The full disk is /dev/full behind a temporary file's
# name (eval.json.tmp, summary.md.tmp, sft/demos.jsonl.tmp) and, for metrics.jsonl (appended in
# place), an LD_PRELOAD shim (enospc_preload.c, $1) that fails its fsync with ENOSPC; the same
# shim fails a replay store's sync, whose error names the store's file by its path.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:-}"
tmp=$(mktemp -d /tmp/arl-test-train-full-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set progress=off --set sft-demos=0 --set eval-tasks=2 --set steps=1 --set tasks-per-update=1 --set rollout.group-size=2"
full() { # OUT FILE-NAMED EXTRA-ARGS...: the run fails on a full disk writing FILE-NAMED
    out=$1 what=$2
    shift 2
    # shellcheck disable=SC2086
    "$bin" train "$exp" $small --set "out=$out" "$@" > "$tmp/log" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "$what: exit $rc, 1 expected"; }
    grep -qF "$what: " "$tmp/log" && grep -qF "No space left on device" "$tmp/log" ||
        { tail -3 "$tmp/log"; fail "$what: the message names neither the file nor ENOSPC"; }
    grep -q "Free space, then continue with:" "$tmp/log" || { tail -3 "$tmp/log"; fail "$what: no 'Free space' note"; }
}
mkdir "$tmp/a"
ln -s /dev/full "$tmp/a/eval.json.tmp"
full "$tmp/a" "$tmp/a/eval.json.tmp: write failed"
[ ! -e "$tmp/a/eval.json.tmp" ] && [ ! -e "$tmp/a/eval.json" ] || fail "eval.json: a temporary file or a partial eval.json stays"
ln -s /dev/full "$tmp/a/summary.md.tmp"
full "$tmp/a" "$tmp/a/summary.md.tmp: write failed" --resume
[ -s "$tmp/a/eval.json" ] && [ ! -e "$tmp/a/summary.md" ] || fail "summary.md: eval.json missing or summary.md written"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" --resume > "$tmp/log" 2>&1 || { tail -3 "$tmp/log"; fail "the continued run failed"; }
[ -s "$tmp/a/summary.md" ] || fail "the continued run wrote no summary.md"
# the SFT stage's demonstrations
mkdir -p "$tmp/b/sft"
ln -s /dev/full "$tmp/b/sft/demos.jsonl.tmp"
full "$tmp/b" "$tmp/b/sft/demos.jsonl.tmp" --set sft-demos=2 --resume
# metrics.jsonl, appended after each update
if [ -n "$shim" ] && [ -f "$shim" ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
    export ASAN_OPTIONS ARL_TEST_ENOSPC_NAME=metrics.jsonl LD_PRELOAD="$shim"
    full "$tmp/c" "$tmp/c/metrics.jsonl: train: cannot append the metrics"
    # a replay store's file is named by its path (it was "replay: catalog.sqlite:", which does
    # not say which of the run's stores)
    # shellcheck disable=SC2086
    ARL_TEST_ENOSPC_NAME=catalog.sqlite-wal "$bin" train "$exp" $small --set "out=$tmp/d" > "$tmp/log" 2>&1 &&
        fail "a store's failed sync: exit 0"
    grep -qF "agentrl: error: replay: $tmp/d/replay/eval-before/r0/catalog.sqlite: " "$tmp/log" ||
        { tail -3 "$tmp/log"; fail "a store's failed sync: the message does not name the store's file by its path"; }
    unset LD_PRELOAD ARL_TEST_ENOSPC_NAME
else
    echo "note: no preload shim given: metrics.jsonl not checked"
fi
rm -rf "$tmp"
echo "ok"
