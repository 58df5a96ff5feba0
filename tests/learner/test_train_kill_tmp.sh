#!/bin/sh
# tests/learner/test_train_kill_tmp.sh: `agentrl train` killed (SIGKILL) while it writes a file or
# a checkpoint atomically - the complete temporary beside its final name, not yet renamed - and
# resumed leaves none of these temporaries behind, and ends bit-identical to an uninterrupted
# run.  Before, experiment.json.tmp-XXXXXX, sft/experiment.json.tmp-XXXXXX, reference.tmp-XXXXXX/,
# eval-before.outcomes.tmp-XXXXXX, policy/v1.tmp-XXXXXX/ and metrics.jsonl.tmp-XXXXXX stayed in
# the run folder for good.  The kills come from an LD_PRELOAD shim (renamekill_preload.c, $1):
# rename(2) onto a path ending in /$ARL_TEST_KILL_RENAME raises SIGKILL.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:?the rename-kill shim is not given}"
tmp=$(mktemp -d /tmp/arl-test-train-kill-tmp-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set progress=off --set threads=1 --set sft-demos=2 --set sft.steps=2 --set eval-tasks=2
       --set steps=2 --set tasks-per-update=1 --set rollout.group-size=2"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" > "$tmp/a.log" 2>&1 || { tail -3 "$tmp/a.log"; fail "the uninterrupted run failed"; }
out="$tmp/k"
resume=""
# each: the path the run dies renaming onto, then the temporary it leaves (a glob)
for step in "k/experiment.json experiment.json.tmp-??????" \
            "sft/experiment.json sft/experiment.json.tmp-??????" \
            "k/reference reference.tmp-??????" \
            "k/eval-before.outcomes eval-before.outcomes.tmp-??????" \
            "policy/v1 policy/v1.tmp-??????" \
            "k/metrics.jsonl metrics.jsonl.tmp-??????"; do
    at=${step%% *} left=${step#* }
    # shellcheck disable=SC2086
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        ARL_TEST_KILL_RENAME="$at" LD_PRELOAD="$shim" \
        "$bin" train "$exp" $small --set "out=$out" $resume >> "$tmp/k.log" 2>&1
    rc=$?
    [ "$rc" -eq 137 ] || { tail -3 "$tmp/k.log"; fail "killed renaming onto $at: exit $rc, 137 expected"; }
    # shellcheck disable=SC2086
    ls -d "$out"/$left > /dev/null 2>&1 || fail "killed renaming onto $at: no $left left (the kill missed)"
    resume=--resume
done
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$out" --resume >> "$tmp/k.log" 2>&1 || { tail -3 "$tmp/k.log"; fail "the last resume failed"; }
left=$(find "$out" -name '*.tmp-??????' | sed "s|^$out/||")
[ -z "$left" ] || fail "temporaries of the killed writes stay: $(echo $left)"
for f in checkpoints/step-00000004/model.safetensors checkpoints/step-00000004/optimizer.safetensors \
         reference/model.safetensors policy/v2/model.safetensors eval.json eval-before.outcomes; do
    cmp -s "$tmp/a/$f" "$out/$f" || fail "$f differs from the uninterrupted run's"
done
rm -rf "$tmp"
echo "ok"
