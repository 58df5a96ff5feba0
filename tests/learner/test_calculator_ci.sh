#!/bin/sh
# tests/learner/test_calculator_ci.sh: the CI-length calculator experiment
# (experiments/calculator-ci.json) runs end to end with `agentrl train` - SFT warm start on the
# teacher's demonstrations, held-out evaluation, RL updates, evaluation, report - and writes
# what experiments/train.h promises: metrics.jsonl with one line per update and the metrics of
# spec/objective.md section 12, eval.json, summary.md with the evaluation, plots, checkpoints.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
tmp=$(mktemp -d /tmp/arl-test-calculator-ci-XXXXXX)
out="$tmp/run"
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$out" --set progress=plain \
    > "$tmp/log" 2>&1 || { tail -30 "$tmp/log"; fail "agentrl train exited with $?"; }
grep -q "train: done: 3 updates" "$tmp/log" || fail "no completion line in the log"
for f in experiment.json metrics.jsonl metrics.csv eval.json eval-before.json eval-after.json \
         summary.md plots reference checkpoints sft/demos.jsonl; do
    [ -e "$out/$f" ] || fail "missing $out/$f"
done
[ "$(wc -l < "$out/metrics.jsonl")" -eq 3 ] || fail "metrics.jsonl has $(wc -l < "$out/metrics.jsonl") lines, 3 expected"
for k in '"step":2' '"kl/k3"' '"kl/coef"' '"loss/total"' '"reward/outcome/mean"' '"adv/token/mean"' \
         '"mismatch/abs_logratio/mean"' '"mask/total_frac"' '"ppo/clip_frac"' '"policy/entropy"' \
         '"grad/norm/mean"' '"optim/lr"' '"state/hit_frac"' '"moe/router_agreement/overlap"' \
         '"moe/load_violation/rollout/max"' '"staleness/max"' '"time/update_s"' \
         '"throughput/action_tokens_per_s"' '"rollout/success_rate"' '"time/rollout_s"'; do
    tail -1 "$out/metrics.jsonl" | grep -q "$k" || fail "the last metrics line lacks $k"
done
# the learner's shared prompt prefix (learner option shared-prefix, on in calculator-ci.json)
grep -q '"step":0.*"state/shared_prefix_trajs":[1-9]' "$out/metrics.jsonl" || fail "update 0 started no trajectory from a shared prefix"
grep -q '"before": {"episodes": 8' "$out/eval.json" || fail "eval.json: $(cat "$out/eval.json")"
grep -q '"after": {"episodes": 8' "$out/eval.json" || fail "eval.json: $(cat "$out/eval.json")"
# the paired comparison: one outcome per held-out task in each arm, the 2x2 table in eval.json
for a in before after; do
    [ "$(tr -d '\n' < "$out/eval-$a.outcomes" | wc -c)" -eq 8 ] || fail "eval-$a.outcomes: $(cat "$out/eval-$a.outcomes")"
done
grep -q '"paired": {"both": ' "$out/eval.json" || fail "eval.json has no paired table: $(cat "$out/eval.json")"
# the three-sided prompt split (eval-split, validation-split): the evaluation drew the test side
grep -q '"set": "test"' "$out/eval.json" || fail "eval.json does not name the test set: $(cat "$out/eval.json")"
grep -q "Evaluation set: \*\*test\*\*" "$out/summary.md" || fail "summary.md does not name the evaluation set"
grep -q "Per update (kl/k3 / kl/target)" "$out/summary.md" || fail "summary.md has no per-update KL/target line"
# resumed with the other eval-set, the finished run refuses to read its test-set evaluation back
# as a validation one
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$out" --set progress=plain \
    --set eval-set=validation --resume > "$tmp/log2" 2>&1 && fail "a resume with another eval-set succeeded"
grep -q "holds an evaluation of the test set" "$tmp/log2" || { tail -5 "$tmp/log2"; fail "no eval-set mismatch message"; }
# resumed with a changed learning rate: refused, naming the setting as saved and as now, and
# the run's experiment.json left as it was
cp "$out/experiment.json" "$tmp/experiment.saved"
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$out" --set progress=plain \
    --set learner.lr=1e-3 --resume > "$tmp/log3" 2>&1 && fail "a resume with another learner.lr succeeded"
grep -qF "other settings (as saved -> as now): learner.lr 0.0001 -> 0.001;" "$tmp/log3" || { tail -3 "$tmp/log3"; fail "the refusal does not name learner.lr"; }
cmp -s "$out/experiment.json" "$tmp/experiment.saved" || fail "a refused resume rewrote experiment.json"
# tasks without a valid episode in one arm (masked, e.g. an observation over its cap) are not paired
grep -q "paired, [1-8] tasks" "$out/summary.md" || fail "summary.md has no paired difference"
# SFT with the shared prefix, demonstrations and evaluation split by prompt
grep -q "shared prefix of" "$tmp/log" || fail "the SFT stage did not share the prompt prefix"
grep -q "^## Evaluation" "$out/summary.md" || fail "summary.md has no Evaluation section"
grep -q "95% CI" "$out/summary.md" || fail "summary.md has no confidence interval"
ls "$out"/plots/*.svg > /dev/null 2>&1 || fail "no plots"
# staged context (context-stages 0:1536, 2:2048): the budget of each update
grep -q '"step":0.*"rollout/context_tokens":1536' "$out/metrics.jsonl" || fail "update 0 did not run with 1536 context tokens"
grep -q '"step":2.*"rollout/context_tokens":2048' "$out/metrics.jsonl" || fail "update 2 did not run with 2048 context tokens"
# the rollout stores of the three updates, each with its committed update
for n in 000000 000001 000002; do
    [ -e "$out/replay/u$n/r0/catalog.sqlite" ] || fail "missing the store of update $n"
done
# show --tokens of a consumed trajectory: the learner columns, u = exp(old - logprob) between
# ref and w (spec/replay.md 13.2; fields counted from the row's end: the text column may hold a
# quoted space)
st="$out/replay/u000001/r0"
traj=$("$bin" replay list "$st" | awk 'NR > 1 && $2 != "masked" {print $1; exit}')
"$bin" replay show "$st" "$traj" --tokens > "$tmp/show" 2>&1 || fail "replay show --tokens"
grep -q "logprob  *old  *ref  *u  *w flags  *adv" "$tmp/show" || { grep -m1 "pos" "$tmp/show"; fail "show --tokens: no u column"; }
awk 'NF >= 11 && $1 ~ /^[0-9]+$/ && $(NF-6) ~ /^-?[0-9.]+$/ {
        n++; u = exp($(NF-6) - $(NF-7)); d = $(NF-4) - u
        if (d < 0) d = -d
        if (d > 2e-4 * u + 1e-5) { print "row " $1 ": u " $(NF-4) ", exp(old - logprob) " u; bad = 1 }
     } END { if (!n) print "no learner rows"; exit bad || !n }' "$tmp/show" || fail "show --tokens: u is not exp(old - logprob)"
# groups of one sample: the run says what that means (one update, no SFT, no evaluation)
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$tmp/g1" --set progress=plain \
    --set steps=1 --set sft-demos=0 --set eval-tasks=0 --set rollout.group-size=1 \
    --set learner.keep-states=all --set learner.records=false \
    > "$tmp/log4" 2>&1 || { tail -5 "$tmp/log4"; fail "group-size 1 run exited with $?"; }
grep -q "group-size is 1: every group is degenerate" "$tmp/log4" || fail "no group-size 1 warning"
# learner.keep-states all: the pi_old pass's states in the update's learner file
grep -q "train: update 0: [1-9][0-9]* learner states kept" "$tmp/log4" || { grep "learner states" "$tmp/log4"; fail "no learner states kept"; }
ls "$tmp"/g1/replay/u000000/r0/shards/l*.states.sqlite > /dev/null 2>&1 || fail "no learner states file"
# steps raised on a finished run (its optimizer horizon fixed by learner.total-steps): the
# evaluation of the old final policy is set aside and the new final policy evaluated
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$tmp/st" --set progress=plain \
    --set steps=1 --set learner.total-steps=2 --set sft-demos=0 --set eval-tasks=4 \
    --set eval-before=false > "$tmp/log5" 2>&1 || { tail -5 "$tmp/log5"; fail "steps=1 run exited with $?"; }
"$bin" train "$src/experiments/calculator-ci.json" --set "out=$tmp/st" --set progress=plain \
    --set steps=2 --set learner.total-steps=2 --set sft-demos=0 --set eval-tasks=4 \
    --set eval-before=false --resume > "$tmp/log6" 2>&1 || { tail -5 "$tmp/log6"; fail "steps=2 resume exited with $?"; }
grep -q "eval-after held an evaluation of another policy than version 2; kept as .*eval-after.stale-1" "$tmp/log6" \
    || { grep "eval" "$tmp/log6"; fail "the old final policy's evaluation was read back as the new one's"; }
# the resolved configuration is itself a valid experiment (dry check: --keys parses nothing;
# load it with steps=0 into a scratch directory is the real check, done by test_learner_config)
echo "calculator-ci: $(grep 'held-out success' "$tmp/log" | sed 's/^train: //')"
rm -rf "$tmp"
echo "ok"
