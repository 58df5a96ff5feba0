#!/usr/bin/env bash
# scripts/run.sh: install what is missing, build, and run the default experiment.
#
# The default experiment is experiments/calculator.json run by `agentrl train`, end to end on
# the CPU (about 7 minutes of 2 cores): a tiny Kimi-K3-structured policy is warm-started by
# supervised fine-tuning on teacher demonstrations of the built-in calculator environment,
# evaluated on held-out tasks, trained by KL-constrained RL against the environment, and
# evaluated again on the same held-out tasks; the report (summary.md with the success rates
# before and after and their 95% intervals, metrics.csv, SVG plots) is printed at the end.
# Everything goes to runs/default/ (removed first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

bin=build/agentrl
out=runs/default
rm -rf "$out"
mkdir -p "$out"
step() { printf '\n== %s ==\n' "$*"; }

cat <<'MSG'

agentrl default experiment (experiments/calculator.json): SFT warm start of a tiny policy on
the calculator environment's teacher, held-out evaluation, RL updates against the environment,
held-out evaluation again, report. About 7 minutes on 2 CPU cores, plus the build.
MSG

step "parameter counts of the shipped configurations"
"$bin" model info configs/kimi-k3/config.json | tail -n 12
"$bin" model info tiny --json

step "the experiment: agentrl train experiments/calculator.json"
"$bin" train experiments/calculator.json --set "out=$out/calculator" --set progress=plain

step "the report ($out/calculator/summary.md)"
cat "$out/calculator/summary.md"

step "one held-out episode of the trained policy"
first="$("$bin" replay list "$out/calculator/replay/eval-after/r0" --limit 1 --json |
         sed -n 's/.*"traj_uid": *"\([^"]*\)".*/\1/p' | head -n 1)"
[ -n "$first" ] && "$bin" replay show "$out/calculator/replay/eval-after/r0" "$first"

step "done"
echo "outputs in $out/calculator/: summary.md, metrics.jsonl, metrics.csv, plots/, eval.json,"
echo "sft/ (demonstrations, SFT checkpoints), reference/, checkpoints/, replay/ (every rollout)"
