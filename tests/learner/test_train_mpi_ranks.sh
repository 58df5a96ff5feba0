#!/bin/sh
# tests/learner/test_train_mpi_ranks.sh MPIEXEC: the ranks of `mpirun agentrl train` agree on
# the run.  (1) A rank started with other settings (an MPMD command line: rank 2 with other
# steps and another learning rate) fails naming itself and the keys, and the others name it,
# before anything is written: before, the job waited for ever (rank 2 left the update loop for
# a collective the others never reached) or, with the learning rate alone, trained on without a
# word while the learners' weights parted.  (2) A rank with its own threads is accepted.
# (3) --resume under another number of ranks is refused naming both layouts and the -np to use
# (it failed on "replay/u000000/r1: no such store", or went on with another learner count),
# also from a checkpoint that does not record its layout (older builds: its ledger's stores);
# the same number of ranks continues.  Needs mpirun: exits 77 (skipped) without it.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
mpiexec="${1:-mpirun}"
case "$mpiexec" in ""|*NOTFOUND*) mpiexec=mpirun ;; esac
command -v "$mpiexec" > /dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d /tmp/arl-test-train-mpi-ranks-XXXXXX)
out="$tmp/run"
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
set -- "$src/experiments/calculator-ci.json" --set "out=$out" --set progress=plain \
    --set sft-demos=0 --set eval-tasks=0 --set steps=1 --set tasks-per-update=2 \
    --set rollout.group-size=2 --set learner.dist-learners=2 --set threads=1
mpi() { # NP ARGS...: `mpirun -np NP agentrl train ARGS...` (120 s at most)
    np=$1
    shift
    timeout 120 "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
        -np "$np" "$bin" train "$@" > "$tmp/log" 2>&1
}
hung() { [ "$1" -eq 124 ] && { tail -20 "$tmp/log"; fail "$2: the job hung (killed after 120 s)"; }; }

# (1) rank 2 with other settings
timeout 120 "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
    -np 2 "$bin" train "$@" : -np 1 "$bin" train "$@" --set steps=2 --set learner.lr=0.01 \
    > "$tmp/log" 2>&1
rc=$?
hung "$rc" "other settings on rank 2"
[ "$rc" -eq 2 ] || { tail -20 "$tmp/log"; fail "a rank with other settings: exit $rc, want 2 (a usage error of the launch command)"; }
grep -q "rank 2 runs with other settings than rank 0 (rank 0 -> rank 2): learner.lr 0.0001 -> 0.01, steps 1 -> 2" "$tmp/log" ||
    { tail -20 "$tmp/log"; fail "rank 2's message does not name it and the keys"; }
grep -q "train: rank 2 failed (see its message)" "$tmp/log" || { tail -20 "$tmp/log"; fail "the other ranks do not name rank 2"; }
[ ! -e "$out" ] || fail "a refused job wrote $out"

# (2) the run, rank 2 with its own threads
timeout 120 "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
    -np 2 "$bin" train "$@" : -np 1 "$bin" train "$@" --set threads=2 > "$tmp/log" 2>&1
rc=$?
hung "$rc" "the run"
[ "$rc" -eq 0 ] || { tail -20 "$tmp/log"; fail "the run (rank 2 with threads = 2) failed: exit $rc"; }
ck="$out/checkpoints/step-00000002"
[ -f "$ck/train_state.json" ] || fail "no checkpoint $ck"

# (3) --resume with 4 ranks (2 rollout workers): refused; with 3: continues
mpi 4 "$@" --resume
rc=$?
hung "$rc" "resume on 4 ranks"
[ "$rc" -ne 0 ] || fail "a resume on 4 ranks succeeded"
grep -q "step-00000002 was written by a job with 3 MPI ranks (2 learners, 1 rollout worker), and this one has 4 MPI ranks (2 learners, 2 rollout workers).*resume with the same number of ranks (mpirun -np 3)" "$tmp/log" ||
    { tail -20 "$tmp/log"; fail "resume on 4 ranks: no message naming both layouts"; }
# a checkpoint of an older build: no "mpi" record, its ledger lists one store
"$py" - "$ck/train_state.json" <<'EOF' || fail "cannot edit train_state.json"
import json, sys
p = sys.argv[1]
j = json.load(open(p))
del j["extra"]["mpi"]
json.dump(j, open(p, "w"), indent=2)
EOF
mpi 4 "$@" --resume
rc=$?
hung "$rc" "resume on 4 ranks (older checkpoint)"
[ "$rc" -ne 0 ] || fail "a resume on 4 ranks of an older checkpoint succeeded"
grep -q "step-00000002 was written by a job with 1 rollout worker, and this one has 2 rollout workers" "$tmp/log" ||
    { tail -20 "$tmp/log"; fail "resume on 4 ranks (older checkpoint): no message naming both layouts"; }
mpi 3 "$@" --resume
rc=$?
hung "$rc" "resume on 3 ranks"
[ "$rc" -eq 0 ] || { tail -20 "$tmp/log"; fail "the resume on 3 ranks failed: exit $rc"; }
rm -rf "$tmp"
echo "ok"
