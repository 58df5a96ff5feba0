#!/bin/sh
# agentrl tokenize: the golden conversation renders as docs/chat_template.md says, ids decode,
# tool calls parse, and bad input exits 1 (failure) or 2 (usage) with a message.
set -u
BIN=${ARL_BIN:-build/agentrl}
SRC=${ARL_SOURCE_DIR:-.}
FIX=$SRC/tests/tokenizer/fixtures
TMP=$(mktemp -d /tmp/arl-test-tokenize-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

[ -x "$BIN" ] || fail "$BIN not built"
"$BIN" tokenize "$FIX/golden_conversation.json" --gen > "$TMP/out.txt" 2> "$TMP/err.txt" ||
    fail "tokenize exited $?: $(cat "$TMP/err.txt")"
grep -v '^#' "$FIX/golden_expected.txt" | cut -d' ' -f3- | tr -d '\n' > "$TMP/want.txt"
echo >> "$TMP/want.txt"
cmp -s "$TMP/out.txt" "$TMP/want.txt" || fail "rendering differs from golden_expected.txt"
grep -q '^5 messages, 445 tokens, 86 with loss mask 1$' "$TMP/err.txt" || fail "summary: $(cat "$TMP/err.txt")"
"$BIN" --quiet tokenize "$FIX/golden_conversation.json" --gen > /dev/null 2> "$TMP/err.txt" ||
    fail "--quiet tokenize exited $?"
[ -s "$TMP/err.txt" ] && fail "--quiet tokenize wrote to stderr: $(cat "$TMP/err.txt")"

ids=$("$BIN" tokenize "$FIX/golden_conversation.json" --ids | cut -d' ' -f1-3)
[ "$ids" = "256 262 115" ] || fail "--ids starts with '$ids'"
"$BIN" tokenize "$FIX/golden_conversation.json" --mask | grep -q '^0 256 0 -1 <|bos|>$' || fail "--mask"

out=$("$BIN" tokenize --decode "256 262 117 115 101 114 263 104 105 265")
[ "$out" = "<|bos|><|open|>user<|close|>hi<|end_of_msg|>" ] || fail "--decode gave '$out'"
out=$("$BIN" tokenize --decode "256 104 105 265" --skip-special)
[ "$out" = "hi" ] || fail "--decode --skip-special gave '$out'"

"$BIN" tokenize --parse '<|tool_call|>f<|tool_args|>[1]<|tool_call_end|><|end_of_msg|>' > "$TMP/p.json" ||
    fail "--parse"
grep -q '"parse_status": "arguments_not_object"' "$TMP/p.json" || fail "--parse status: $(cat "$TMP/p.json")"

"$BIN" tokenize --decode "1 400" 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 2 ] || fail "--decode of a bad id exited $rc"
grep -q 'token id 400 at position 1' "$TMP/err.txt" || fail "bad id message: $(cat "$TMP/err.txt")"

echo '[{"role": "tool", "tool_call_id": "q", "content": "x"}]' > "$TMP/bad.json"
"$BIN" tokenize "$TMP/bad.json" 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 1 ] || fail "bad conversation exited $rc"
grep -q "message 0 (tool): field 'tool_call_id'" "$TMP/err.txt" || fail "message: $(cat "$TMP/err.txt")"

# JSON Lines (SFT data, env demos): --line N renders one line, exactly as that line alone; the
# whole file is named as JSON Lines; a line past the end is an error naming the count
{ echo '[{"role": "user", "content": "a"}]'; tr -d '\n' < "$FIX/golden_conversation.json"; echo; } > "$TMP/two.jsonl"
"$BIN" tokenize "$TMP/two.jsonl" --line 2 --ids > "$TMP/l2" || fail "--line 2 exited $?"
"$BIN" tokenize "$FIX/golden_conversation.json" --ids | cmp -s - "$TMP/l2" || fail "--line 2 renders otherwise than the file alone"
"$BIN" tokenize "$TMP/two.jsonl" 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 1 ] && grep -q "holds 2 lines of JSON (JSON Lines?): render one with --line N" "$TMP/err.txt" ||
    fail "JSON Lines without --line: exit $rc: $(cat "$TMP/err.txt")"
"$BIN" tokenize "$TMP/two.jsonl" --line 3 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 1 ] && grep -q -- "--line 3, but it has 2 lines" "$TMP/err.txt" || fail "--line 3: exit $rc: $(cat "$TMP/err.txt")"

# an error of the rendering names the file (and line) first, as a parse error does
echo '[{"role": "user", "content": [{"type": "image", "image": {"width": 28, "height": 28}}]}]' > "$TMP/img.json"
"$BIN" tokenize "$TMP/img.json" --patch-size 0 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 1 ] && grep -q "^agentrl: error: $TMP/img.json: message 0 (user): content\[0\]: image input, but the model has no vision tower" "$TMP/err.txt" ||
    fail "render error: exit $rc: $(cat "$TMP/err.txt")"
{ echo '[]'; cat "$TMP/img.json"; } > "$TMP/img.jsonl"
"$BIN" tokenize "$TMP/img.jsonl" --line 2 --patch-size 0 2> "$TMP/err.txt"; rc=$?
[ $rc -eq 1 ] && grep -q "^agentrl: error: $TMP/img.jsonl line 2: message 0 (user)" "$TMP/err.txt" ||
    fail "render error of --line 2: exit $rc: $(cat "$TMP/err.txt")"

# an option of one mode given in another is refused naming it (it was ignored)
for args in "--decode 256 --step 3" "--decode 256 --patch-size 7" "--parse x --max-patches 8" \
    "--decode 256 --ids" "--parse x --skip-special" "$FIX/golden_conversation.json --step 2"; do
    # shellcheck disable=SC2086
    "$BIN" tokenize $args > /dev/null 2> "$TMP/err.txt"; rc=$?
    opt=$(echo "$args" | sed 's/.* \(--[a-z-]*\).*/\1/')
    [ $rc -eq 2 ] && grep -q -- "^agentrl: error: .*$opt" "$TMP/err.txt" ||
        fail "tokenize $args: exit $rc: $(cat "$TMP/err.txt")"
done

"$BIN" tokenize 2> /dev/null; rc=$?
[ $rc -eq 2 ] || fail "no arguments exited $rc"
echo "ok"
