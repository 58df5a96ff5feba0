#!/bin/sh
# tests/learner/test_train_start.sh: what `agentrl train` says and leaves as it starts.
# - learner.device or rollout.device cuda on a machine without a usable CUDA device (or a build
#   without CUDA): refused before anything is written (exit 1: the value is one the key takes,
#   this machine cannot run it), no OUT (it held experiment.json and run.lock), and no note to
#   continue with --resume.  (Where a CUDA device is usable, the runs run and this is not checked.)
# - the SFT stage of a fresh run does not say "sft: --resume: no checkpoint ... yet" (train runs
#   its SFT stage as a continuation whether or not --resume was given, and the line came on every
#   fresh run); a --resume of a run killed before the stage's first checkpoint still says it.
# The kill comes from the rename-kill shim ($1) at the rename onto OUT/sft/experiment.json.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:?the rename-kill shim is not given}"
tmp=$(mktemp -d /tmp/arl-test-train-start-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set model=$src/configs/tiny --set progress=off --set threads=1 --set sft-demos=2
       --set sft.steps=2 --set eval-tasks=0 --set steps=1 --set tasks-per-update=1
       --set rollout.group-size=2 --set rollout.max-turns=1"
# the CUDA refusals (a machine with a usable device runs them instead)
for key in learner.device rollout.device; do
    # shellcheck disable=SC2086
    "$bin" train "$exp" $small --set "out=$tmp/gpu" --set "$key=cuda" > "$tmp/gpu.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "note: $key cuda ran (a CUDA device is usable here): its refusal is not checked"
        rm -rf "$tmp/gpu"
        continue
    fi
    [ "$rc" -eq 1 ] || { tail -3 "$tmp/gpu.log"; fail "$key cuda: exit $rc, 1 expected"; }
    grep -qF "agentrl: error: train: $key is cuda, and this machine has no usable CUDA device" "$tmp/gpu.log" ||
        { tail -3 "$tmp/gpu.log"; fail "$key cuda: message"; }
    [ ! -e "$tmp/gpu" ] || fail "$key cuda: OUT made ($(ls "$tmp/gpu"))"
    ! grep -q -e "--resume" -e "what it saved stays" "$tmp/gpu.log" ||
        { tail -3 "$tmp/gpu.log"; fail "$key cuda: a note to continue"; }
done
# a fresh run: no word of --resume from its SFT stage
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" > "$tmp/a.log" 2>&1 || { tail -3 "$tmp/a.log"; fail "the fresh run failed"; }
grep -q "train: SFT stage" "$tmp/a.log" || { tail -3 "$tmp/a.log"; fail "the fresh run had no SFT stage"; }
! grep -q -e "--resume" -e "resuming" "$tmp/a.log" || { grep -e "--resume" -e "resuming" "$tmp/a.log"; fail "the fresh run speaks of resuming"; }
# killed in its SFT stage before a checkpoint, then --resume: the stage says it found none
# shellcheck disable=SC2086
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
    ARL_TEST_KILL_RENAME=sft/experiment.json LD_PRELOAD="$shim" \
    "$bin" train "$exp" $small --set "out=$tmp/k" > "$tmp/k.log" 2>&1
rc=$?
[ "$rc" -eq 137 ] || { tail -3 "$tmp/k.log"; fail "killed renaming onto sft/experiment.json: exit $rc, 137 expected"; }
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/k" --resume > "$tmp/k.log" 2>&1 || { tail -3 "$tmp/k.log"; fail "the resume failed"; }
grep -q "^sft: --resume: no checkpoint in .*/k/sft/checkpoints yet, starting from step 0" "$tmp/k.log" ||
    { tail -3 "$tmp/k.log"; fail "the resume's SFT stage did not say it found no checkpoint"; }
rm -rf "$tmp"
echo "ok"
