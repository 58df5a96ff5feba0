#!/bin/sh
# tests/learner/test_train_alert_resume.sh: the client-fault alert window (spec/aep.md 8.6) across
# `agentrl train --resume`.  The window holds the last 200 finished training trajectories of the
# run, kept across updates; a resumed run started it empty, so its alert came at another
# trajectory than an uninterrupted run's (or not at all).  The run: the "echo" environment, 2
# tasks x 4 samples per update, updates 0 and 1 unmasked (16 trajectories), every task of update 2
# rejected at creation (VALIDATION_ERROR, masked); alert-masked-frac 0.3: the uninterrupted run
# halts at the 7th masked trajectory, "7 of the last 23".  The killed run (kills from the
# rename-kill shim, $1, at the rename onto a file) is resumed through the three ways a resume
# meets the window, and must halt at the same trajectory with the same alert:
# - killed at the rename onto replay/u000001/window-r0.json (update 1's store complete, its
#   window not saved): the resume rolls update 1 out again from update 0's window;
# - killed at the rename onto checkpoints/step-00000004 (update 1's checkpoint): the resume starts
#   from update 0's window file and reads update 1's (its complete store is not rolled out again);
# - the last resume runs update 2 to the alert.
# The temporary the first kill left (window-r0.json.tmp-XXXXXX) is removed by the resume.
# Under mpirun ($2; skipped without it), 3 ranks with dist-learners 1: two rollout-only ranks,
# each with its own window (group-size 8: the same numbers per rank), the second one killed as
# it saves update 1's window, then rank 0 at update 1's checkpoint: both ranks halt with the
# uninterrupted job's alert, and their window files are the uninterrupted job's.
# Before, the last resume halted with "every finished trajectory (8) was masked" (an empty
# window: 8 < 20 finished, no rate).
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:?the rename-kill shim is not given}"
mpiexec="${2:-mpirun}"
case "$mpiexec" in ""|*NOTFOUND*) mpiexec=mpirun ;; esac
tmp=$(mktemp -d /tmp/arl-test-train-alert-resume-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
i=0
while [ $i -lt 6 ]; do
    if [ $i -ge 4 ]; then rej=true; else rej=false; fi
    echo "{\"id\": \"t$i\", \"seed\": $i, \"data\": {\"reject\": $rej}}"
    i=$((i + 1))
done > "$tmp/tasks.jsonl"
small="--set model=$src/configs/tiny --set progress=off --set threads=1 --set sft-demos=0
       --set eval-tasks=0 --set eval-split=0 --set validation-split=0 --set steps=3
       --set tasks-per-update=2 --set rollout.group-size=4 --set rollout.env=echo
       --set rollout.task-file=$tmp/tasks.jsonl --set rollout.alert-masked-frac=0.3
       --set rollout.alert-client-codes=200 --set rollout.max-turns=1 --set rollout.turn-tokens=8"
# the alert of a log: the trajectory that crossed the limit, then the alert and the run's error
# (the run folder, in the alert's replay command, written OUT)
alert_of() {
    { grep -B1 "rollout: ALERT:" "$1" | sed 's/ {.*//'; grep "^agentrl: error: rollout: stopped admitting groups" "$1"; } |
        sed -e "s|$tmp/[ak]/|OUT/|g"
}
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" > "$tmp/a.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/a.log"; fail "the uninterrupted run: exit $rc, 1 (its alert) expected"; }
alert_of "$tmp/a.log" > "$tmp/a.alert"
grep -q "stopped admitting groups: 7 of the last 23 finished trajectories of environment echo@1.0.0 were masked" "$tmp/a.alert" ||
    { cat "$tmp/a.alert"; tail -3 "$tmp/a.log"; fail "the uninterrupted run: not the alert expected"; }
out="$tmp/k"
resume=""
for at in u000001/window-r0.json step-00000004; do
    # shellcheck disable=SC2086
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        ARL_TEST_KILL_RENAME="$at" LD_PRELOAD="$shim" \
        "$bin" train "$exp" $small --set "out=$out" $resume >> "$tmp/k.log" 2>&1
    rc=$?
    [ "$rc" -eq 137 ] || { tail -3 "$tmp/k.log"; fail "killed renaming onto $at: exit $rc, 137 expected"; }
    resume=--resume
done
grep -q "held a rollout that stopped before it was recorded as finished" "$tmp/k.log" ||
    { tail -5 "$tmp/k.log"; fail "update 1's complete store without its window was not rolled out again"; }
: > "$tmp/k2.log"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$out" --resume > "$tmp/k2.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/k2.log"; fail "the last resume: exit $rc, 1 (the alert) expected"; }
grep -q "train: resuming after update 1 " "$tmp/k2.log" || { tail -3 "$tmp/k2.log"; fail "the last resume did not start after update 1"; }
! grep -q "rollout: 8/8 trajectories (0 complete, 8 truncated" "$tmp/k2.log" ||
    fail "the last resume rolled update 1's complete store out again"
alert_of "$tmp/k2.log" > "$tmp/k.alert"
cmp -s "$tmp/a.alert" "$tmp/k.alert" ||
    { echo "uninterrupted:"; cat "$tmp/a.alert"; echo "resumed:"; cat "$tmp/k.alert"; tail -3 "$tmp/k2.log"; fail "the resumed run's alert differs"; }
cmp -s "$tmp/a/replay/u000001/window-r0.json" "$out/replay/u000001/window-r0.json" ||
    fail "update 1's window file differs from the uninterrupted run's"
# the temporary of the window write the first kill cut short is gone
left=$(find "$out" -name '*.tmp-??????' | sed "s|^$out/||")
[ -z "$left" ] || fail "temporaries of the killed writes stay: $(echo "$left" | tr '\n' ' ')"
# the same under mpirun, by rollout rank
command -v "$mpiexec" > /dev/null 2>&1 || { rm -rf "$tmp"; echo "ok (the mpirun part skipped: no mpirun)"; exit 0; }
mpi() { # OUT LOG ARGS...: the job on 3 ranks (120 s at most)
    o=$1 l=$2
    shift 2
    # shellcheck disable=SC2086
    timeout 120 "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
        -x LD_PRELOAD -x ARL_TEST_KILL_RENAME -x ASAN_OPTIONS -np 3 \
        "$bin" train "$exp" $small --set rollout.group-size=8 --set learner.dist-learners=1 \
        --set "out=$o" "$@" > "$l" 2>&1
}
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
LD_PRELOAD="" ARL_TEST_KILL_RENAME="" mpi "$tmp/ma" "$tmp/ma.log"
rc=$?
[ "$rc" -eq 1 ] || { tail -5 "$tmp/ma.log"; fail "mpirun: the uninterrupted job: exit $rc, 1 (its alert) expected"; }
resume=""
for at in u000001/window-r1.json step-00000004; do
    LD_PRELOAD="$shim" ARL_TEST_KILL_RENAME="$at" mpi "$tmp/mk" "$tmp/mk.log" $resume
    rc=$?
    case "$rc" in 0|1|124) tail -5 "$tmp/mk.log"; fail "mpirun: killed renaming onto $at: exit $rc" ;; esac
    resume=--resume
done
LD_PRELOAD="" ARL_TEST_KILL_RENAME="" mpi "$tmp/mk" "$tmp/mk.log" --resume
rc=$?
[ "$rc" -eq 1 ] || { tail -5 "$tmp/mk.log"; fail "mpirun: the last resume: exit $rc, 1 (the alert) expected"; }
for k in 1 2; do
    for f in "$tmp/ma.log" "$tmp/mk.log"; do
        grep -q "^agentrl: error: rank $k: rollout: stopped admitting groups: 7 of the last 23 finished trajectories" "$f" ||
            { tail -5 "$f"; fail "mpirun: rank $k did not halt with the expected alert ($f)"; }
    done
done
for f in u000000/window-r0.json u000000/window-r1.json u000001/window-r0.json u000001/window-r1.json; do
    cmp -s "$tmp/ma/replay/$f" "$tmp/mk/replay/$f" || fail "mpirun: $f differs from the uninterrupted job's"
done
if [ ! -d "$tmp/mk/replay/u000001/r1.interrupted-1" ] || [ -e "$tmp/mk/replay/u000001/r0.interrupted-1" ]; then
    fail "mpirun: not just rollout rank 1's update 1 rolled out again ($(ls "$tmp/mk/replay/u000001"))"
fi
rm -rf "$tmp"
echo "ok"
