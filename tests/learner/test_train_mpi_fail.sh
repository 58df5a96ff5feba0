#!/bin/sh
# tests/learner/test_train_mpi_fail.sh MPIEXEC: `mpirun -np 3 agentrl train` (learners 0 and 1,
# rollout rank 2) where learner 1 alone cannot open the update's store (it sees its own empty
# OUT/replay, as a rank on a node without the shared file system would): the job ends within
# seconds, naming the store and the rank that failed, in its own line too (it waited for ever: learner 1 in the
# driver's status exchange, learner 0 in the update's all-reduce).  Needs mpirun, unshare and
# mount (root): exits 77 (skipped) without them.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
mpiexec="${1:-mpirun}"
case "$mpiexec" in ""|*NOTFOUND*) mpiexec=mpirun ;; esac
command -v "$mpiexec" > /dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
command -v unshare > /dev/null 2>&1 || { echo "SKIP: no unshare"; exit 77; }
unshare -m sh -c 'mount -t tmpfs tmpfs /mnt' 2> /dev/null || { echo "SKIP: cannot mount in a mount namespace (not root?)"; exit 77; }
tmp=$(mktemp -d /tmp/arl-test-train-mpi-fail-XXXXXX)
out="$tmp/run"
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
# --resume: a fresh run refuses an existing replay/, which rank 1's mount needs
mkdir -p "$out/replay"
set -- "$src/experiments/calculator-ci.json" --set "out=$out" --set progress=plain \
    --set sft-demos=0 --set eval-tasks=0 --set steps=1 --set tasks-per-update=2 \
    --set rollout.group-size=2 --set learner.dist-learners=2 --set threads=1 --resume
timeout 120 "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
    -np 1 "$bin" train "$@" \
    : -np 1 unshare -m sh -c 'mount -t tmpfs tmpfs "$0" && exec "$@"' "$out/replay" "$bin" train "$@" \
    : -np 1 "$bin" train "$@" > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 124 ] && { tail -20 "$tmp/log"; fail "the job hung (killed after 120 s)"; }
[ "$rc" -ne 0 ] || fail "the job succeeded"
grep -q "^agentrl: error: rank 1: .*replay/u000000/r0: no such store" "$tmp/log" || { tail -20 "$tmp/log"; fail "learner 1's error (naming its rank) is not in the log"; }
grep -q "train: rank 1 failed (see its message)" "$tmp/log" || { tail -20 "$tmp/log"; fail "the other ranks do not name rank 1"; }
rm -rf "$tmp"
echo "ok"
