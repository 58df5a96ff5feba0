#!/bin/sh
# tests/learner/test_train_out.sh: `agentrl train` refuses an output directory ('out') that is a
# file, a replay store, or lies inside a replay store or inside another run's output directory
# (one holding run.lock), as a usage error (exit 2) naming both, before it writes anything; a
# new directory beside a run is taken.  (Before, a run inside another's replay/ or checkpoints/
# mixed its files with that run's: `replay list OUT/replay` then counted the nested run's stores.)
# The --resume of a run that failed at set-up, before it saved anything but experiment.json, may
# change its settings (it refused them, so a setting that made the run fail could not be mended).
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
tmp=$(mktemp -d /tmp/arl-test-train-out-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set progress=off --set sft-demos=0 --set eval-tasks=0 --set steps=1 --set tasks-per-update=1 --set rollout.group-size=2"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" > "$tmp/log" 2>&1 || { rc=$?; tail -5 "$tmp/log"; fail "the first run exited with $rc"; }
[ -e "$tmp/a/replay/u000000/r0/catalog.sqlite" ] || fail "the first run wrote no store"
refuse() { # OUT EXPECTED-TEXT
    # shellcheck disable=SC2086
    "$bin" train "$exp" $small --set "out=$1" > "$tmp/log2" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || { tail -3 "$tmp/log2"; fail "out=$1: exit $rc, 2 expected"; }
    grep -qF "$2" "$tmp/log2" || { tail -3 "$tmp/log2"; fail "out=$1: no '$2' in the message"; }
    ! grep -q "continue with" "$tmp/log2" || fail "out=$1: the refusal offers --resume"
}
echo text > "$tmp/file"
refuse "$tmp/file" "key 'out': $tmp/file exists and is not a directory"
refuse "$tmp/a/replay/u000000/r0" "is the replay store $tmp/a/replay/u000000/r0"
refuse "$tmp/a/replay/u000000/r0/x/y" "is inside the replay store $tmp/a/replay/u000000/r0"
refuse "$tmp/a/checkpoints" "inside the output directory of another run, $tmp/a (it holds run.lock)"
refuse "$tmp/a/replay" "inside the output directory of another run, $tmp/a"
[ ! -e "$tmp/a/replay/u000000/r0/x" ] || fail "a refused out was created"
[ ! -e "$tmp/a/replay/run.lock" ] && [ ! -e "$tmp/a/checkpoints/experiment.json" ] || fail "a refused run wrote into the first run"
"$bin" replay list "$tmp/a/replay" > "$tmp/log3" 2>&1
! grep -q "replay/replay" "$tmp/log3" || fail "the first run's replay/ holds a nested run: $(cat "$tmp/log3")"
# a new directory beside the run (and the run itself, resumed) are fine
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/b" > "$tmp/log4" 2>&1 || { tail -3 "$tmp/log4"; fail "out beside a run refused"; }
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" --resume > "$tmp/log5" 2>&1 || { tail -3 "$tmp/log5"; fail "the run's own resume refused"; }
# a run that failed at set-up saved nothing but its settings: its --resume may change them (a
# fixed setting), and the settings saved are the new ones; a run that saved more keeps its own
# shellcheck disable=SC2086
# (task data the environment refuses: the held-out split meets it after OUT is made; a missing
# init is refused before, and leaves nothing)
"$bin" train "$exp" $small --set "out=$tmp/c" --set 'rollout.task-data={"bogus": 1}' > "$tmp/log6" 2>&1 && fail "task data the environment refuses was taken"
[ -e "$tmp/c/experiment.json" ] && [ ! -e "$tmp/c/reference" ] || fail "the failed set-up left other files than expected: $(ls "$tmp/c")"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/c" --set rollout.temperature=0.5 --resume > "$tmp/log7" 2>&1 || { tail -3 "$tmp/log7"; fail "the resume of a run that saved nothing refused a changed setting"; }
grep -qF "saved nothing but its settings; it starts with the settings as now (as saved -> as now: rollout.task-data.bogus 1 -> (unset), rollout.task-data.level (unset) -> 1, rollout.temperature 1 -> 0.5)" "$tmp/log7" || { grep "resume" "$tmp/log7"; fail "the resume did not say it takes the new settings"; }
grep -q '"temperature": 0.5' "$tmp/c/experiment.json" || fail "experiment.json keeps the old settings"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/c" --resume > "$tmp/log8" 2>&1 && fail "a resume with other settings than a run with stores was taken"
grep -qF "has other settings (as saved -> as now): rollout.temperature 0.5 -> 1" "$tmp/log8" || { tail -3 "$tmp/log8"; fail "no settings refusal"; }
rm -rf "$tmp"
echo "ok"
