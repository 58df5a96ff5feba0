#!/bin/sh
# tests/learner/test_train_policy_resume.sh: `agentrl train --resume` after a kill rewrites the
# rollout workers' policy/vN from its checkpoint's weights instead of taking the copy on disk,
# and ends bit-identical to an uninterrupted run.  Before, policy/v1 changed by a byte inside a
# tensor (a change its load does not detect) was used as it was for update 1's rollout, made
# again after the kill, and the run went on with other bits without a word.  The kill comes from
# the rename-kill shim ($1) at the rename onto replay/u000001/window-r0.json, after update 1's
# rollout (policy/v1 written, update 1 not checkpointed).
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:?the rename-kill shim is not given}"
tmp=$(mktemp -d /tmp/arl-test-train-policy-resume-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set progress=off --set threads=1 --set sft-demos=2 --set sft.steps=2 --set eval-tasks=0
       --set steps=2 --set tasks-per-update=1 --set rollout.group-size=2"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" > "$tmp/a.log" 2>&1 || { tail -3 "$tmp/a.log"; fail "the uninterrupted run failed"; }
# shellcheck disable=SC2086
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
    ARL_TEST_KILL_RENAME="u000001/window-r0.json" LD_PRELOAD="$shim" \
    "$bin" train "$exp" $small --set "out=$tmp/k" > "$tmp/k.log" 2>&1
rc=$?
[ "$rc" -eq 137 ] || { tail -3 "$tmp/k.log"; fail "killed after update 1's rollout: exit $rc, 137 expected"; }
p="$tmp/k/policy/v1/model.safetensors"
[ -f "$p" ] || fail "no policy/v1 at the kill"
size=$(wc -c < "$p")
# 16 bytes inside the tensor data (its last quarter: past the header)
printf 'XXXXXXXXXXXXXXXX' | dd of="$p" bs=1 seek=$((size * 3 / 4)) conv=notrunc 2> /dev/null
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/k" --resume >> "$tmp/k.log" 2>&1 || { tail -3 "$tmp/k.log"; fail "the resume failed"; }
# the trained weights first (what the rollout made with the damaged copy changed), then the copy
for f in checkpoints/step-00000004/model.safetensors \
         checkpoints/step-00000004/optimizer.safetensors policy/v1/model.safetensors; do
    cmp -s "$tmp/a/$f" "$tmp/k/$f" || fail "$f differs from the uninterrupted run's"
done
rm -rf "$tmp"
echo "ok"
