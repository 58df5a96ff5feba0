#!/bin/sh
# agentrl sft: help, key listing, usage errors that name the key, and the run's refusal while
# the model's forward/backward is not plugged in (experiments/sft.c arl_sft_model_ops_default;
# when it is, replace the last case by a short run on tests/train/data/micro).  Runs from the
# repository root.
set -u
BIN="${ARL_BIN:-build/agentrl}"
[ -x "$BIN" ] || { echo "FAIL: agentrl binary not found at $BIN"; exit 1; }
TMP=$(mktemp -d /tmp/arl-test-sftcli-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" sft --help > "$TMP/help" 2>&1 || fail "--help exited $?"
grep -q -- "--resume" "$TMP/help" || fail "--help does not mention --resume"
"$BIN" sft --keys > "$TMP/keys" 2>&1 || fail "--keys exited $?"
for k in batch-tokens weight-decay clip-norm warmup-steps min-lr-ratio checkpoint-interval keep-last on-malformed; do
    grep -q -- "--$k" "$TMP/keys" || fail "--keys does not list $k"
done
"$BIN" sft > /dev/null 2>&1
[ $? -eq 2 ] || fail "no experiment: expected exit 2"

printf '{"hi": "there"}\n' > "$TMP/train.jsonl"
cat > "$TMP/exp.json" <<JSON
{"model": "tests/train/data/micro", "data": "$TMP/train.jsonl", "out": "$TMP/out",
 "learning_rate": 0.1}
JSON
"$BIN" sft "$TMP/exp.json" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "unknown key: expected exit 2, got $rc"
grep -q "learning_rate" "$TMP/err" || fail "unknown key not named: $(cat "$TMP/err")"

cat > "$TMP/exp.json" <<JSON
{"model": "tests/train/data/micro", "data": "$TMP/train.jsonl", "out": "$TMP/out"}
JSON
"$BIN" sft "$TMP/exp.json" --set steps=0 > "$TMP/err" 2>&1
[ $? -eq 2 ] || fail "--set steps=0: expected exit 2"
grep -q "steps" "$TMP/err" || fail "--set steps=0: key not named: $(cat "$TMP/err")"
"$BIN" sft "$TMP/exp.json" --set nosuch=1 > "$TMP/err" 2>&1
[ $? -eq 2 ] || fail "--set nosuch=1: expected exit 2"
grep -q "nosuch" "$TMP/err" || fail "--set nosuch: key not named"

"$BIN" sft "$TMP/exp.json" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "run without a model backward: expected exit 1, got $rc"
grep -q "forward/backward" "$TMP/err" || fail "run: unclear error: $(cat "$TMP/err")"

[ $fails -eq 0 ] && echo "test_sft_cli: all passed"
exit $fails
