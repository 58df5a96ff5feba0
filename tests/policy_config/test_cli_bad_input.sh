#!/bin/sh
# tests/policy_config/test_cli_bad_input.sh: bad input to generate, score, tokenize, model init
# and env demos gets a clear "agentrl: error:" line and a non-zero exit, and loses nothing: an
# output path that names an input (the token file, the checkpoint's files) is refused before any
# work, a failed or interrupted command leaves an existing output file as it was and no partial
# or temporary file behind.  Runs from the repository root.
set -u
BIN="${ARL_BIN:-build/agentrl}"
[ -x "$BIN" ] || { echo "FAIL: agentrl binary not found at $BIN"; exit 1; }
T=$(mktemp -d /tmp/arl-test-cli-bad-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect RC PATTERN CMD...: CMD exits RC and its stderr has one "agentrl: error:" line matching
# the grep pattern PATTERN
expect() {
    want=$1 pat=$2
    shift 2
    "$@" > "$T/out" 2> "$T/err"
    rc=$?
    [ "$rc" -eq "$want" ] || { fail "$* exited $rc, expected $want: $(cat "$T/err")"; return; }
    grep "^agentrl: error: " "$T/err" | grep -q -- "$pat" ||
        fail "$*: no error line matching '$pat': $(cat "$T/err")"
}

"$BIN" --quiet model init tiny "$T/ck" --seed 1 > /dev/null 2>&1 || { echo "FAIL: model init"; exit 1; }
cksum "$T/ck/model.safetensors" "$T/ck/config.json" > "$T/ck.sum"
printf 'hello world\n' > "$T/hello.txt"
echo precious > "$T/mine.txt"

# --- generate and score: --ckpt that is not a checkpoint directory
expect 2 "--ckpt $T/ck/config.json: not a directory" \
    "$BIN" generate --ckpt "$T/ck/config.json" --prompt hi
expect 2 "--ckpt $T/ck/config.json: not a directory" \
    "$BIN" score --ckpt "$T/ck/config.json" --text "$T/hello.txt"
expect 1 "--ckpt $T/none: No such file" "$BIN" score --ckpt "$T/none" --text "$T/hello.txt"

# --- score: inputs
: > "$T/empty.txt"
expect 2 "--text $T/empty.txt: the file is empty" "$BIN" score --ckpt "$T/ck" --text "$T/empty.txt"
"$BIN" --quiet score --ckpt "$T/ck" --text "$T/hello.txt" --logits-out "$T/f32.npy" > /dev/null ||
    fail "score --logits-out exited $?"
expect 1 "got F32 of rank 2" "$BIN" score --ckpt "$T/ck" --tokens "$T/f32.npy"

# --- score: output paths, refused before any work
cp "$T/f32.npy" "$T/in.npy"
cksum "$T/in.npy" > "$T/in.sum"
# (a text input works too: the logits would replace the --text file)
expect 2 "is the input file --text" \
    "$BIN" score --ckpt "$T/ck" --text "$T/hello.txt" --logits-out "$T/hello.txt"
[ "$(cat "$T/hello.txt")" = "hello world" ] || fail "--logits-out replaced the --text file"
expect 2 "would replace a file of the checkpoint" \
    "$BIN" score --ckpt "$T/ck" --text "$T/hello.txt" --logits-out "$T/ck/model.safetensors"
expect 2 "would replace a file of the checkpoint" \
    "$BIN" score --ckpt "$T/ck/" --text "$T/hello.txt" --grads-out "$T/ck/../ck/config.json"
cksum "$T/ck/model.safetensors" "$T/ck/config.json" | cmp -s - "$T/ck.sum" ||
    fail "score replaced a checkpoint file"
expect 2 "name the same file" "$BIN" score --ckpt "$T/ck" --text "$T/hello.txt" \
    --logits-out "$T/x.out" --grads-out "$T/./x.out"
expect 2 "--logits-out $T/nodir/l.npy: its directory does not exist" \
    "$BIN" score --ckpt "$T/ck" --text "$T/hello.txt" --logits-out "$T/nodir/l.npy"
grep -q "^seq pos token logprob" "$T/out" && fail "score printed results before the output error"
expect 2 "--grads-out $T/ck: is a directory" \
    "$BIN" score --ckpt "$T/ck" --text "$T/hello.txt" --grads-out "$T/ck"

# --- score: interrupted while writing --logits-out: the file whole or absent, no temporary
mkdir "$T/sig"
i=0
while [ $i -lt 300 ]; do printf 'the quick brown fox jumps over the lazy dog. ' ; i=$((i + 1)); done > "$T/long.txt"
"$BIN" --quiet score --ckpt "$T/ck" --text "$T/long.txt" --no-bos --max-tokens 8192 \
    --logits-out "$T/sig/l.npy" > /dev/null 2>&1 &
pid=$!
caught=0
while kill -0 $pid 2> /dev/null; do
    set -- "$T"/sig/l.npy.tmp-*
    if [ -e "$1" ]; then
        kill -TERM $pid
        caught=1
        break
    fi
done
wait $pid 2> /dev/null
set -- "$T"/sig/l.npy.tmp-*
[ -e "$1" ] && fail "score interrupted while writing left $1"
if [ -e "$T/sig/l.npy" ]; then # whole: header (128 bytes) + 13500 x 384 floats
    [ "$(wc -c < "$T/sig/l.npy")" -eq $((128 + 13500 * 384 * 4)) ] ||
        fail "score interrupted while writing left a partial l.npy"
fi
[ $caught -eq 1 ] || echo "note: the interrupt came too late to test the write of --logits-out"

# --- env demos: a failure or an interrupt leaves --out as it was
expect 1 "no built-in environment 'bogus'" "$BIN" env demos bogus --episodes 2 --out "$T/mine.txt"
expect 2 "options: expected a JSON object" \
    "$BIN" env demos calculator --episodes 2 --options '{bad' --out "$T/mine.txt"
[ "$(cat "$T/mine.txt")" = precious ] || fail "env demos destroyed an existing --out file"
expect 2 "--out $T/ck: is a directory" "$BIN" env demos calculator --episodes 2 --out "$T/ck"
expect 1 "--out $T/nodir/d.jsonl: cannot create" \
    "$BIN" env demos calculator --episodes 2 --out "$T/nodir/d.jsonl"
"$BIN" env demos needle --episodes 1000000 --out "$T/mine.txt" > /dev/null 2>&1 &
pid=$!
sleep 1
kill -TERM $pid
wait $pid 2> /dev/null
[ "$(cat "$T/mine.txt")" = precious ] || fail "interrupted env demos replaced an existing --out file"
set -- "$T"/mine.txt.tmp-*
[ -e "$1" ] && fail "interrupted env demos left $1"
"$BIN" env demos calculator --episodes 3 --out "$T/d.jsonl" > /dev/null 2>&1 ||
    fail "env demos exited $?"
[ "$(wc -l < "$T/d.jsonl")" -eq 3 ] || fail "env demos: expected 3 lines in d.jsonl"

# --- tokenize
out=$("$BIN" tokenize --parse "$(printf 'ab\377\376cd')") || fail "tokenize --parse exited $?"
case "$out" in *'"content": "ab'*cd'"'*) ;; *) fail "tokenize --parse of invalid UTF-8: '$out'" ;; esac
echo '[{"role": "user", "content": "hi"}]' > "$T/conv.json"
expect 2 "--ids and --mask" "$BIN" tokenize "$T/conv.json" --ids --mask
expect 2 "go with CONV" "$BIN" tokenize --decode "1 2" --gen
expect 2 "goes with --decode" "$BIN" tokenize "$T/conv.json" --skip-special
expect 2 "--decode: no token ids" "$BIN" tokenize --decode " "
expect 1 "--decode: token id 999" "$BIN" tokenize --decode "1 999"

# --- model init
expect 2 "OUT_DIR: empty path" "$BIN" model init tiny "" --seed 1
expect 2 "option '--seed'" "$BIN" model init tiny "$T/ck2" --seed " 5"
expect 2 "option '--seed'" "$BIN" model init tiny "$T/ck2" --seed "+5"
[ -e "$T/ck2" ] && fail "model init with a bad seed made $T/ck2"
expect 1 "not empty; refusing to overwrite" "$BIN" model init tiny "$T/ck" --seed 2
cksum "$T/ck/model.safetensors" "$T/ck/config.json" | cmp -s - "$T/ck.sum" ||
    fail "model init changed an existing checkpoint"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "ok"
