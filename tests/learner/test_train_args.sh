#!/bin/sh
# tests/learner/test_train_args.sh [MPIEXEC]: settings `agentrl train` refuses before it writes
# anything, and its continue note under mpirun.
# - context-stages TOKENS above rollout.context-tokens: a usage error naming the key (it failed
#   late, as "model: out of memory allocating the 7815702.2 MiB workspace (max_tokens 4096)").
# - rollout.context-tokens too large for memory: the error names max_context and the key.
# - SIGTERM while the report is written: the report is finished first (no *.tmp left).
# - a model too large for this machine's memory: refused before OUT is made (it held
#   experiment.json and run.lock, and the note said to continue with --resume).
# - "model": "tiny" from a directory where it is not found: an error naming 'model', and OUT not
#   made (OUT/experiment.json was written first).
# - under mpirun (2 ranks), a failure that can be continued says to run the same mpirun command
#   again with the agentrl command shown (it showed the agentrl command alone); skipped without
#   mpirun.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
src=$(cd "$src" && pwd)
mpiexec="${1:-mpirun}"
case "$mpiexec" in ""|*NOTFOUND*) mpiexec=mpirun ;; esac
tmp=$(mktemp -d /tmp/arl-test-train-args-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
small="--set progress=off --set sft-demos=0 --set eval-tasks=0 --set steps=1 --set tasks-per-update=1 --set rollout.group-size=2"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/a" --set context-stages=5:999999999999 > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 2 ] || { tail -3 "$tmp/log"; fail "context-stages 5:999999999999: exit $rc, 2 expected"; }
grep -qF "key 'context-stages': '5:999999999999': 999999999999 tokens is more than rollout.context-tokens (2048)" "$tmp/log" ||
    { tail -3 "$tmp/log"; fail "context-stages: message"; }
[ ! -e "$tmp/a" ] || fail "context-stages: OUT made"
# a misspelt built-in environment and a reward component the environment does not declare:
# usage errors naming the key, before anything is written (the first wrote reference/ and
# replay/ and blocked the corrected rerun; the second trained the level on zeros)
for bad in "rollout.env=kvstor|key 'rollout.env': no built-in environment 'kvstor' (calculator, needle, kvstore, shapes" \
    "learner.outcome-components=answr=1|key 'learner.outcome-components': calculator declares no outcome component 'answr' (its outcome components: answer_correct)" \
    "learner.process-components=answer_correct=1|calculator declares no process component 'answer_correct' (it is declared at the outcome level" \
    "learner.dist-learners=2|learner: dist-learners: 2 learner ranks requested but the job has 1 rank" \
    "sft-demos=4 --set rollout.env=shapes|key 'sft-demos': the tasks of shapes carry images, which the SFT warm start does not take yet"; do
    # shellcheck disable=SC2086
    "$bin" train "$exp" $small --set "out=$tmp/e" --set ${bad%%|*} > "$tmp/log" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || { tail -3 "$tmp/log"; fail "${bad%%|*}: exit $rc, 2 expected"; }
    grep -qF "${bad#*|}" "$tmp/log" || { tail -3 "$tmp/log"; fail "${bad%%|*}: message"; }
    [ ! -e "$tmp/e" ] || fail "${bad%%|*}: OUT made ($(ls "$tmp/e"))"
done
# an init checkpoint that is not there, beside a model config: exit 1 (a missing input) before
# anything is written (it was read after the SFT demonstrations, leaving sft/)
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/i" --set "init=$tmp/nope" > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "init missing: exit $rc, 1 expected"; }
grep -qF "key 'init': $tmp/nope: no checkpoint there" "$tmp/log" || { tail -3 "$tmp/log"; fail "init missing: message"; }
[ ! -e "$tmp/i" ] || fail "init missing: OUT made ($(ls "$tmp/i"))"
# ... and one with its weights but no config.json (only model.safetensors was looked for)
mkdir -p "$tmp/half" && : > "$tmp/half/model.safetensors"
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/i" --set "init=$tmp/half" > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "init without config.json: exit $rc, 1 expected"; }
grep -qF "key 'init': $tmp/half: no checkpoint there (no config.json;" "$tmp/log" ||
    { tail -3 "$tmp/log"; fail "init without config.json: message"; }
[ ! -e "$tmp/i" ] || fail "init without config.json: OUT made ($(ls "$tmp/i"))"
# rollout.context-tokens too large for memory: the model's message names max_context and the key
# (it named max_tokens alone)
# shellcheck disable=SC2086
"$bin" --quiet train "$exp" $small --set "out=$tmp/ctx" --set rollout.context-tokens=999999999999 \
    --set rollout.trajectory-tokens=999999999999 > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "context-tokens 999999999999: exit $rc, 1 expected"; }
grep -q "out of memory allocating the .* MiB workspace (max_context 999999999999, .*; max_context is rollout.context-tokens (999999999999)" "$tmp/log" ||
    { tail -3 "$tmp/log"; fail "context-tokens 999999999999: message"; }
# a model too large for this machine's memory (kimi-k3: 51780 GiB for a learner's five copies) is
# refused before anything is written: no OUT (it held experiment.json and run.lock), and no
# note to continue with --resume
# shellcheck disable=SC2086
"$bin" train "$exp" $small --set "out=$tmp/big" --set model="$src/configs/kimi-k3" > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "model kimi-k3: exit $rc, 1 expected"; }
grep -q "^agentrl: error: train: a learner's weights, reference weights, gradients and two AdamW moments .* need .* GiB, more than" "$tmp/log" ||
    { tail -3 "$tmp/log"; fail "model kimi-k3: message"; }
[ ! -e "$tmp/big" ] || fail "model kimi-k3: OUT made ($(ls "$tmp/big"))"
! grep -q -e "--resume" -e "what it saved stays" "$tmp/log" || { tail -3 "$tmp/log"; fail "model kimi-k3: a note to continue"; }
# the model config from another directory (no configs/ here, none beside a copy of the binary)
mkdir "$tmp/elsewhere" "$tmp/bin"
cp "$bin" "$tmp/bin/agentrl"
# shellcheck disable=SC2086
(cd "$tmp/elsewhere" && env -u AGENTRL_CONFIG_DIR "$tmp/bin/agentrl" train "$exp" $small --set "out=$tmp/b") > "$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { tail -3 "$tmp/log"; fail "model from elsewhere: exit $rc, 1 expected"; }
grep -qF "key 'model': config 'tiny': not a file or directory" "$tmp/log" || { tail -3 "$tmp/log"; fail "model from elsewhere: message"; }
[ ! -e "$tmp/b" ] || fail "model from elsewhere: OUT made ($(ls "$tmp/b"))"
# ... and with a path, from there, it runs
# shellcheck disable=SC2086
(cd "$tmp/elsewhere" && "$tmp/bin/agentrl" train "$exp" $small --set "out=$tmp/b" --set "model=$src/configs/tiny") > "$tmp/log" 2>&1 ||
    { tail -3 "$tmp/log"; fail "model by path from elsewhere failed"; }
# SIGTERM while the report is written (a FIFO in summary.md.tmp's place holds its open): the
# report is finished first, then the run stops by the signal with its note; no *.tmp is left
if command -v mkfifo > /dev/null 2>&1; then
    mkdir "$tmp/t"
    mkfifo "$tmp/t/summary.md.tmp"
    # shellcheck disable=SC2086
    "$bin" train "$exp" $small --set "out=$tmp/t" > "$tmp/log" 2>&1 &
    pid=$!
    k=0 # until it waits in the FIFO's open (a kernel without /proc wchan: not checked)
    until grep -qx -e wait_for_partner -e fifo_open "/proc/$pid/wchan" 2> /dev/null || [ $k -ge 1200 ]; do
        kill -0 $pid 2> /dev/null || break
        sleep 0.05
        k=$((k + 1))
    done
    if grep -qx -e wait_for_partner -e fifo_open "/proc/$pid/wchan" 2> /dev/null; then
        kill -TERM $pid
        sleep 0.3
        cat "$tmp/t/summary.md.tmp" > /dev/null
        wait $pid
        rc=$?
        [ "$rc" -eq 143 ] || { tail -3 "$tmp/log"; fail "SIGTERM in the report: exit $rc, 143 expected"; }
        left=$(find "$tmp/t" -name '*.tmp*')
        [ -z "$left" ] || fail "SIGTERM in the report left $left"
        [ -e "$tmp/t/summary.md" ] || fail "SIGTERM in the report: no summary.md (the FIFO renamed)"
        grep -q "^agentrl: interrupted: train stops here" "$tmp/log" || { tail -3 "$tmp/log"; fail "SIGTERM in the report: no note"; }
    else
        kill -9 $pid 2> /dev/null
        wait $pid 2> /dev/null
        echo "note: train never waited in the report's FIFO (no /proc wchan?): SIGTERM in the report not checked"
    fi
fi
# the note under mpirun: a full disk writing eval.json on rank 0
if command -v "$mpiexec" > /dev/null 2>&1; then
    mkdir "$tmp/c"
    ln -s /dev/full "$tmp/c/eval.json.tmp"
    # shellcheck disable=SC2086
    timeout 120 "$mpiexec" --oversubscribe --bind-to none -np 2 "$bin" train "$exp" $small \
        --set eval-tasks=2 --set threads=1 --set "out=$tmp/c" > "$tmp/log" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -5 "$tmp/log"; fail "mpirun: exit $rc"; }
    grep -q "Free space, then continue with the same mpirun command (its own options as before) running:" "$tmp/log" ||
        { tail -5 "$tmp/log"; fail "mpirun: the note does not say to rerun the mpirun command"; }
    # (the binary as mpirun started it: $bin, a path)
    grep -F -- "  $bin train $exp " "$tmp/log" | grep -q -- "^  .* --resume$" ||
        { tail -5 "$tmp/log"; fail "mpirun: the note shows no $bin train command"; }
else
    echo "note: no mpirun: the note under mpirun not checked"
fi
rm -rf "$tmp"
echo "ok"
