#!/usr/bin/env bash
# scripts/run.sh: install what is missing, build, and run the default experiment.
#
# The default experiment is the most complete pipeline this checkout has, end to end on the
# CPU (about 10 minutes on 2 cores): a tiny Kimi-K3-structured policy is initialised, warm-
# started by supervised fine-tuning on teacher demonstrations of the built-in calculator
# environment, sampled from, and evaluated by rollout against the environment into a replay
# store that `agentrl replay` inspects.  Everything goes to runs/default/ (removed first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

bin=build/agentrl
out=runs/default
rm -rf "$out"
mkdir -p "$out"
step() { printf '\n== %s ==\n' "$*"; }

cat <<'MSG'

agentrl default experiment: the policy on the CPU, warm-started by SFT on the calculator
environment's teacher, then evaluated by rollout. (The RL stage on top of it is
`build/agentrl train experiments/calculator.json`; its improvement has not been measured in
this build yet, so this script stops before it.)
MSG

step "parameter counts of the shipped configurations"
"$bin" model info configs/kimi-k3/config.json | tail -n 12
"$bin" model info tiny --json

step "initialise a tiny policy"
"$bin" model init tiny "$out/init" --seed 1

step "teacher demonstrations of the calculator environment (level 1)"
"$bin" env demos calculator --episodes 512 --seed 1 --out "$out/demos.jsonl"
"$bin" env demos calculator --episodes 64 --seed 1000001 --out "$out/demos-eval.jsonl"

step "supervised fine-tuning (SFT warm start)"
cat > "$out/sft.json" <<JSON
{"init": "$out/init", "data": "$out/demos.jsonl", "eval-data": "$out/demos-eval.jsonl",
 "batch-tokens": 4096, "steps": 60, "lr": 2e-3, "warmup-steps": 5, "eval-interval": 20,
 "checkpoint-interval": 20, "out": "$out/sft", "seed": 1, "progress": "plain"}
JSON
"$bin" sft "$out/sft.json"
ckpt="$(ls -d "$out"/sft/checkpoints/step-* | tail -n 1)"

step "sample from the fine-tuned policy"
"$bin" generate --ckpt "$ckpt" --prompt "What is 12 + 7?" --temperature 0 --max-tokens 64

if "$bin" rollout --help >/dev/null 2>&1; then
  step "evaluation rollout against the calculator environment"
  "$bin" rollout --ckpt "$ckpt" --out "$out/replay" --env builtin:calculator \
    --task-data '{"level": 1}' --env-options '{"max_steps": 4}' --tasks 64 --group-size 1 \
    --temperature 0 --task-seed 1000001
  step "the replay store"
  "$bin" replay stats "$out/replay"
  "$bin" replay verify "$out/replay"
  first="$("$bin" replay list "$out/replay" --limit 1 --json | sed -n 's/.*"traj_uid": *"\([^"]*\)".*/\1/p' | head -n 1)"
  [ -n "$first" ] && "$bin" replay show "$out/replay" "$first"
fi

step "done"
echo "outputs in $out/: init/ (initial checkpoint), demos.jsonl, sft/ (metrics.jsonl, checkpoints/), replay/"
