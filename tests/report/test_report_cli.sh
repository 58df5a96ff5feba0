#!/bin/sh
# tests/report/test_report_cli.sh: `agentrl report RUN_DIR [--out DIR]` on a small run folder:
# exit codes, the printed summary line, the files of the report; a metrics.jsonl without a
# single metric (empty, or no valid line) is an error that names it.
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "skip: $BIN not built"; exit 77; }
"$BIN" report --help >/dev/null 2>&1 || { echo "skip: 'report' is not registered in this build"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

tmp=$(mktemp -d /tmp/arl-test-report-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/metrics.jsonl" <<'JSONL'
{"step": 1, "reward/outcome/mean": 0.1, "kl/k1": 0.001, "kl/coef": 0.1}
{"step": 2, "reward/outcome/mean": 0.2, "kl/k1": 0.002, "kl/coef": 0.09}
{"step": 3, "reward/outcome/mean":
{"step": 4, "reward/outcome/mean": 0.4, "kl/k1": 0.003, "kl/coef": 0.08}
JSONL
echo '{"before": {"episodes": 100, "successes": 45}, "after": {"episodes": 100, "successes": 62}, "kl_target": 0.01, "kl_mean": 0.0123}' > "$tmp/eval.json"

out=$("$BIN" report "$tmp" --out "$tmp/r" 2>"$tmp/err") || fail "report exited $?: $(cat "$tmp/err")"
echo "$out" | grep -q "1 malformed skipped" || fail "summary line: $out"
grep -q "metrics.jsonl:3:" "$tmp/err" || fail "no warning with the line number: $(cat "$tmp/err")"
for f in summary.md metrics.csv metrics.jsonl eval.json plots/reward.svg plots/kl.svg; do
    [ -s "$tmp/r/$f" ] || fail "$f missing"
done
grep -q "| before | 100 | 45 | 0.4500 | \[0.3561, 0.5476\] |" "$tmp/r/summary.md" || fail "eval table"
[ "$(head -1 "$tmp/r/metrics.csv")" = "step,kl/coef,kl/k1,reward/outcome/mean" ] || fail "csv header"
[ "$(wc -l < "$tmp/r/metrics.csv")" -eq 4 ] || fail "csv rows"

"$BIN" report "$tmp/none" >/dev/null 2>&1; rc=$?
[ $rc -eq 1 ] || fail "missing run folder: exit $rc, expected 1"
"$BIN" report >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no argument: exit $rc, expected 2"
echo '{"after": {"episodes": 1, "successes": 2}}' > "$tmp/eval.json"
err=$("$BIN" report "$tmp" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "bad eval.json: exit $rc, expected 1"
echo "$err" | grep -q "successes 2 > episodes 1" || fail "bad eval.json message: $err"
# an unfinished run (killed between the evaluations): its evaluation before RL, after not run
rm "$tmp/eval.json"
echo '{"version": 1, "before": {"episodes": 8, "successes": 2}, "set": "test"}' > "$tmp/eval-before.json"
"$BIN" report "$tmp" --out "$tmp/r2" >/dev/null 2>"$tmp/err" || fail "unfinished run: exit $?: $(cat "$tmp/err")"
grep -q "| before | 8 | 2 | 0.2500 |" "$tmp/r2/summary.md" && grep -q "| after | .* | not evaluated |" "$tmp/r2/summary.md" ||
    fail "unfinished run: $(grep -A6 "## Evaluation" "$tmp/r2/summary.md")"
[ -s "$tmp/r2/eval-before.json" ] || fail "unfinished run: eval-before.json not copied"
# eval.json with a key twice: which one is meant is not guessed (jansson kept the last)
echo '{"version": 1, "before": {"episodes": 8, "successes": 2}, "before": {"episodes": 8, "successes": 7}}' > "$tmp/eval.json"
err=$("$BIN" report "$tmp" --out "$tmp/r3" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "eval.json with a key twice: exit $rc, expected 1"
echo "$err" | grep -q "eval.json:1: not valid JSON: duplicate object key" || fail "eval.json with a key twice: $err"
rm "$tmp/eval.json"
# a run that has not finished an update: no metrics.jsonl, its eval-before.json named
mkdir "$tmp/early"
cp "$tmp/eval-before.json" "$tmp/early/"
err=$("$BIN" report "$tmp/early" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "no update yet: exit $rc, expected 1"
echo "$err" | grep -q "metrics.jsonl: not found: the run has not finished an update yet ($tmp/early/eval-before.json holds its evaluation before RL)" ||
    fail "no update yet: $err"
rm "$tmp/early/eval-before.json"
mkdir "$tmp/early/metrics.jsonl"
err=$("$BIN" report "$tmp/early" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "metrics.jsonl a directory: exit $rc, expected 1"
echo "$err" | grep -q "metrics.jsonl: is a directory" || fail "metrics.jsonl a directory: $err"
# --out naming another run's folder: its metrics.jsonl is not replaced by this run's
mkdir "$tmp/other"
echo '{"step": 1, "loss": 9}' > "$tmp/other/metrics.jsonl"
err=$("$BIN" report "$tmp" --out "$tmp/other" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "--out another run: exit $rc, expected 1"
echo "$err" | grep -q "^agentrl: error: --out $tmp/other holds the metrics.jsonl of another run" ||
    fail "--out another run: message: $err"
[ "$(cat "$tmp/other/metrics.jsonl")" = '{"step": 1, "loss": 9}' ] || fail "--out another run: metrics.jsonl replaced"
[ -e "$tmp/other/summary.md" ] && fail "--out another run: summary.md written"
# ... but an earlier report of this run (its metrics.jsonl the start of the run's) is brought up to date
head -2 "$tmp/metrics.jsonl" > "$tmp/r/metrics.jsonl"
"$BIN" report "$tmp" --out "$tmp/r" >/dev/null 2>"$tmp/err" || fail "report into its earlier copy: exit $?: $(cat "$tmp/err")"
cmp -s "$tmp/metrics.jsonl" "$tmp/r/metrics.jsonl" || fail "report into its earlier copy: metrics.jsonl not updated"
# metrics.jsonl without a single metric: an error naming the file and what it held, exit 1,
# nothing written (an earlier report stays); some valid lines among bad ones still work (above)
mkdir "$tmp/bad"
echo "# keep" > "$tmp/bad/summary.md"
# expect_bad CONTENT PATTERN: metrics.jsonl holding CONTENT fails with an error matching PATTERN
expect_bad() {
    printf "$1" > "$tmp/bad/metrics.jsonl"
    err=$("$BIN" report "$tmp/bad" 2>&1); rc=$?
    [ $rc -eq 1 ] || fail "metrics.jsonl '$1': exit $rc, expected 1: $err"
    echo "$err" | grep -q "^agentrl: error: $tmp/bad/metrics.jsonl: $2" ||
        fail "metrics.jsonl '$1': message: $err"
    [ "$(cat "$tmp/bad/summary.md")" = "# keep" ] || fail "metrics.jsonl '$1': summary.md replaced"
    [ -e "$tmp/bad/metrics.csv" ] && fail "metrics.jsonl '$1': metrics.csv written"
}
expect_bad '' "the file is empty: no metrics to report"
expect_bad '\n  \n' "only blank lines: no metrics to report"
expect_bad 'not json\n[1, 2]\n{"step": 1,' \
    "none of its 3 lines is a metrics line (a JSON object); 3 malformed, the first: .*metrics.jsonl:1: not valid JSON"
expect_bad '{"note": "x"}\n{}\n' "no numeric metric in any of its 2 JSON objects (1 non-numeric value skipped, the first: line 1, key \"note\")"
expect_bad '{}\n' "no numeric metric in its one JSON object (empty)"
err=$("$BIN" report "$tmp/bad" --out "$tmp/bad-out" 2>&1) && fail "bad metrics with --out: exit 0"
[ -e "$tmp/bad-out" ] && fail "bad metrics with --out: $tmp/bad-out made"
# a full disk (/dev/full behind the temporary file's name): the file and the system's reason,
# exit 1, no temporary file left (before: "summary.md: write error", "cannot copy to")
mkdir "$tmp/full"
head -2 "$tmp/metrics.jsonl" > "$tmp/full/metrics.jsonl"
for f in metrics.csv plots/reward.svg summary.md; do
    mkdir -p "$tmp/full/plots"
    ln -s /dev/full "$tmp/full/$f.tmp"
    err=$("$BIN" report "$tmp/full" 2>&1); rc=$?
    [ $rc -eq 1 ] || fail "full disk at $f: exit $rc, expected 1: $err"
    echo "$err" | grep -qF "$tmp/full/$f.tmp: write failed: No space left on device" ||
        fail "full disk at $f: message: $err"
    [ -e "$tmp/full/$f.tmp" ] && fail "full disk at $f: $f.tmp left"
done
mkdir "$tmp/full-out"
ln -s /dev/full "$tmp/full-out/metrics.jsonl.tmp"
err=$("$BIN" report "$tmp/full" --out "$tmp/full-out" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "full disk at the copy: exit $rc, expected 1: $err"
echo "$err" | grep -qF "$tmp/full-out/metrics.jsonl.tmp: write failed: No space left on device" ||
    fail "full disk at the copy: message: $err"
# SIGTERM while a file of the report is being written (held open: a FIFO in the temporary file's
# place) leaves no temporary file: the report finishes that file, then stops by the signal
if command -v mkfifo >/dev/null 2>&1; then
    mkdir "$tmp/term"
    head -2 "$tmp/metrics.jsonl" > "$tmp/term/metrics.jsonl"
    mkfifo "$tmp/term/summary.md.tmp"
    "$BIN" report "$tmp/term" >/dev/null 2>"$tmp/term.err" &
    pid=$!
    sleep 0.5
    kill -TERM $pid
    sleep 0.2
    cat "$tmp/term/summary.md.tmp" >/dev/null 2>&1 &
    wait $pid; rc=$?
    [ $rc -eq 143 ] || fail "SIGTERM: exit $rc, expected 143: $(cat "$tmp/term.err")"
    left=$(find "$tmp/term" -name '*.tmp')
    [ -z "$left" ] || fail "SIGTERM during the report left $left"
fi
echo "ok"
