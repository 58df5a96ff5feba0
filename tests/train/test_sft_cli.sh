#!/bin/sh
# agentrl sft: help, key listing, usage errors that name the key, and a real short run of
# the CPU policy (experiments/sft_model.c) on tests/train/data/micro.  Runs from the
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

# a real short run of the CPU policy on the micro config: exit 0, metrics and a checkpoint
for i in 1 2 3 4 5 6; do
  printf '{"messages": [{"role": "user", "content": "Say %s."}, {"role": "assistant", "content": "%s %s %s"}]}\n' \
    "$i" "$i" "$i" "$i"
done > "$TMP/train.jsonl"
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set progress=plain > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "short run: expected exit 0, got $rc: $(tail -5 "$TMP/err")"
[ "$(wc -l < "$TMP/out/metrics.jsonl" 2>/dev/null)" -ge 3 ] || fail "short run: metrics.jsonl has fewer than 3 steps"
ls "$TMP/out/checkpoints" 2>/dev/null | grep -q "step-00000003" || fail "short run: no step-3 checkpoint"

# a model too large for this machine's memory (kimi-k3: 41424 GiB for its four copies) is refused
# before anything is written: no OUT (it held run.lock), no note to continue with --resume
"$BIN" sft "$TMP/exp.json" --set model=configs/kimi-k3 --set "out=$TMP/big" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "kimi-k3: expected exit 1, got $rc: $(tail -3 "$TMP/err")"
grep -q "^agentrl: error: sft: the weights, gradients and two AdamW moments of this model .* need .* GiB, more than" "$TMP/err" ||
    fail "kimi-k3: message: $(tail -3 "$TMP/err")"
[ ! -e "$TMP/big" ] || fail "kimi-k3: OUT made ($(ls "$TMP/big"))"
! grep -q -e "--resume" -e "what it saved stays" "$TMP/err" || fail "kimi-k3: a note to continue: $(tail -3 "$TMP/err")"
# so is an init checkpoint cut short (or missing its weights): exit 1 naming its file, no OUT
cp -r "$TMP/out/checkpoints/step-00000003" "$TMP/cut"
head -c 3000 "$TMP/out/checkpoints/step-00000003/model.safetensors" > "$TMP/cut/model.safetensors"
"$BIN" sft "$TMP/exp.json" --set "init=$TMP/cut" --set "out=$TMP/cutout" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "init cut short: expected exit 1, got $rc: $(tail -3 "$TMP/err")"
grep -q "^agentrl: error: $TMP/cut/model.safetensors: " "$TMP/err" ||
    fail "init cut short: message: $(tail -3 "$TMP/err")"
[ ! -e "$TMP/cutout" ] || fail "init cut short: OUT made ($(ls "$TMP/cutout"))"
rm "$TMP/cut/model.safetensors"
"$BIN" sft "$TMP/exp.json" --set "init=$TMP/cut" --set "out=$TMP/cutout" > "$TMP/err" 2>&1
[ $? -eq 1 ] || fail "init without weights: expected exit 1"
grep -qF "$TMP/cut: no checkpoint here" "$TMP/err" || fail "init without weights: $(tail -3 "$TMP/err")"
[ ! -e "$TMP/cutout" ] || fail "init without weights: OUT made ($(ls "$TMP/cutout"))"

# a resume with other eval-data (not part of the run's identity): a warning that the eval losses
# before and after differ in their conversations
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set "eval-data=$TMP/train.jsonl" \
    --resume > "$TMP/err" 2>&1 || fail "resume with eval-data: exit $?: $(tail -3 "$TMP/err")"
grep -qF "warning: sft: eval-data is '$TMP/train.jsonl', the run's was none until step 3: its eval losses before and after are of other conversations" "$TMP/err" ||
    fail "resume with eval-data: no warning: $(grep -i warn "$TMP/err")"
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set "eval-data=$TMP/train.jsonl" \
    --resume > "$TMP/err" 2>&1 || fail "resume with the same eval-data: exit $?"
grep -q "eval-data is" "$TMP/err" && fail "resume with the same eval-data warned: $(grep -i warn "$TMP/err")"
# an eval file that repeats training conversations: a warning naming how many and where
"$BIN" sft "$TMP/exp.json" --set steps=1 --set batch-tokens=256 --set "out=$TMP/out3" \
    --set "eval-data=$TMP/train.jsonl" > "$TMP/err" 2>&1 || fail "eval = train data: exit $?"
grep -qF "warning: sft: 6 of the 6 eval conversations ($TMP/train.jsonl lines 1, 2, 3, 4, 5, 6) also occur in the training data" "$TMP/err" ||
    fail "no overlap warning: $(grep -i warn "$TMP/err")"
# --quiet: the warning alone on stderr (no resolved configuration, no progress lines)
"$BIN" --quiet sft "$TMP/exp.json" --set steps=1 --set batch-tokens=256 --set "out=$TMP/outq" \
    --set "eval-data=$TMP/train.jsonl" --set progress=plain > "$TMP/out.q" 2> "$TMP/err" ||
    fail "--quiet: exit $?: $(cat "$TMP/err")"
[ -s "$TMP/out.q" ] && fail "--quiet: stdout not empty: $(cat "$TMP/out.q")"
[ "$(grep -vc '^agentrl: warning: sft: 6 of the 6 eval conversations' "$TMP/err")" -eq 0 ] ||
    fail "--quiet: more than the warning on stderr: $(head -5 "$TMP/err")"
grep -q "eval conversations" "$TMP/err" || fail "--quiet: the warning is gone"
# a directory as the data: a usage error (exit 2) naming it, no note to continue
mkdir "$TMP/adir"
"$BIN" sft "$TMP/exp.json" --set "data=$TMP/adir" --set "out=$TMP/out4" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "data a directory: expected exit 2, got $rc"
grep -qF "$TMP/adir is a directory" "$TMP/err" || fail "data a directory: $(tail -2 "$TMP/err")"
grep -q "continue with" "$TMP/err" && fail "data a directory: a continue note: $(tail -2 "$TMP/err")"
[ -e "$TMP/out4" ] && fail "data a directory: the output directory was made"
# a file as the output directory: an error naming it, no note to continue (nothing was saved,
# and --resume would fail the same way)
: > "$TMP/afile"
"$BIN" sft "$TMP/exp.json" --set "out=$TMP/afile" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "out a file: exit $rc, 2 expected (a usage error, as train's)"
grep -qF "error: key 'out': $TMP/afile exists and is not a directory" "$TMP/err" || fail "out a file: $(tail -2 "$TMP/err")"
grep -q "continue with" "$TMP/err" && fail "out a file: a continue note: $(tail -2 "$TMP/err")"

# stopped by an I/O error (a file where its checkpoints folder goes): the note says how to
# continue, and that command runs to the end once the file is gone
mkdir -p "$TMP/out2" && : > "$TMP/out2/checkpoints"
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set "out=$TMP/out2" > "$TMP/err" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "checkpoints folder a file: expected exit 1, got $rc"
grep -qi "checkpoints: .*not a directory" "$TMP/err" || fail "no 'not a directory' error: $(tail -3 "$TMP/err")"
grep -q "^agentrl: sft stopped; what it saved stays. Once the cause above is dealt with, continue with:$" "$TMP/err" ||
    fail "no continue note: $(tail -3 "$TMP/err")"
# (the binary as it was started: $BIN, a path; the command runs as printed)
cmd="  $BIN sft $TMP/exp.json --set steps=3 --set batch-tokens=256 --set out=$TMP/out2 --resume"
grep -qxF "$cmd" "$TMP/err" ||
    fail "the continue command is not the run's own with --resume: $(tail -2 "$TMP/err")"
rm "$TMP/out2/checkpoints"
sh -c "$cmd" > "$TMP/err" 2>&1 || fail "continued run: exit $?: $(tail -3 "$TMP/err")"
ls "$TMP/out2/checkpoints" 2>/dev/null | grep -q "step-00000003" || fail "continued run: no step-3 checkpoint"
# the note names the binary as it was started: a bare name found on PATH as "agentrl", a path
# that needs quoting quoted (a directory with a space), and the quoted command runs as printed
mkdir -p "$TMP/a dir" "$TMP/out5" && : > "$TMP/out5/checkpoints"
ln -s "$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")" "$TMP/a dir/agentrl"
args="sft $TMP/exp.json --set steps=3 --set batch-tokens=256 --set out=$TMP/out5"
# shellcheck disable=SC2086
PATH="$TMP/a dir:$PATH" agentrl $args > "$TMP/err" 2>&1
grep -qxF "  agentrl $args --resume" "$TMP/err" || fail "run as 'agentrl': the note: $(tail -2 "$TMP/err")"
# shellcheck disable=SC2086
"$TMP/a dir/agentrl" $args > "$TMP/err" 2>&1
cmd="  '$TMP/a dir/agentrl' $args --resume"
grep -qxF "$cmd" "$TMP/err" || fail "run as '$TMP/a dir/agentrl': the note: $(tail -2 "$TMP/err")"
rm "$TMP/out5/checkpoints"
sh -c "$cmd" > "$TMP/err" 2>&1 || fail "the quoted command: exit $?: $(tail -3 "$TMP/err")"
ls "$TMP/out5/checkpoints" 2>/dev/null | grep -q "step-00000003" || fail "the quoted command: no step-3 checkpoint"
# a setting refused is not something to continue after: no note
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set "out=$TMP/out2" --set lr=1 --resume > "$TMP/err" 2>&1
[ $? -eq 1 ] || fail "changed lr on --resume: expected exit 1"
grep -q "stopped; what it saved stays" "$TMP/err" && fail "a refused setting printed the continue note: $(tail -3 "$TMP/err")"
grep -qF "belongs to a run with other settings (as saved -> as now): lr 0.0003 -> 1;" "$TMP/err" ||
    fail "the refusal does not name the changed setting: $(tail -3 "$TMP/err")"

# --resume after a save that crashed while replacing step 3 (step-3 moved aside to .old-step-,
# the new one still .tmp-step-) and beside an empty step folder: step 3 is put back and resumed
# from, the partial save removed, the empty folder set aside as damaged with a warning
cp -r "$TMP/out" "$TMP/out5"
C5="$TMP/out5/checkpoints"
mv "$C5/step-00000003" "$C5/.old-step-00000003-Ab12Cd"
mkdir "$C5/.tmp-step-00000003-Xy34Zw" "$C5/step-00000007"
echo partial > "$C5/.tmp-step-00000003-Xy34Zw/model.safetensors"
"$BIN" sft "$TMP/exp.json" --set steps=3 --set batch-tokens=256 --set progress=plain \
    --set "out=$TMP/out5" --resume > "$TMP/err" 2>&1 || fail "resume after a crashed save: exit $?: $(tail -3 "$TMP/err")"
grep -qF "sft: resuming from $C5/step-00000003 (step 3" "$TMP/err" ||
    fail "resume after a crashed save did not resume from step 3: $(grep sft: "$TMP/err" | tail -3)"
grep -qF "warning: checkpoint $C5/step-00000007 is incomplete" "$TMP/err" ||
    fail "no warning about the empty step folder: $(grep -i warn "$TMP/err")"
[ -d "$C5/damaged-step-00000007" ] && [ ! -e "$C5/step-00000007" ] ||
    fail "the empty step folder was not set aside: $(ls -a "$C5" | tr '\n' ' ')"
ls -a "$C5" | grep -q '^\.\(tmp\|old\)-' && fail "leftovers of the crashed save remain: $(ls -a "$C5" | tr '\n' ' ')"
# the same with no complete checkpoint at all: set aside too, and the run starts from step 0
mkdir -p "$TMP/out6/checkpoints/step-00000002"
"$BIN" sft "$TMP/exp.json" --set steps=1 --set batch-tokens=256 --set progress=plain \
    --set "out=$TMP/out6" --resume > "$TMP/err" 2>&1 || fail "resume beside an empty step folder: exit $?"
grep -qF "warning: checkpoint $TMP/out6/checkpoints/step-00000002 is incomplete" "$TMP/err" ||
    fail "no warning about the only, empty step folder: $(tail -3 "$TMP/err")"
[ -d "$TMP/out6/checkpoints/damaged-step-00000002" ] || fail "the only, empty step folder was not set aside"

[ $fails -eq 0 ] && echo "test_sft_cli: all passed"
exit $fails
