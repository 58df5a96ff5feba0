#!/bin/sh
# tests/policy_config/test_cli_bad_input.sh: bad input to generate, score, tokenize, model init
# and env demos gets a clear "agentrl: error:" line and a non-zero exit, and loses nothing: an
# output path that names an input (the token file, the checkpoint's files) is refused before any
# work, a failed or interrupted command leaves an existing output file (or checkpoint) as it was
# and no partial or temporary file behind; an interrupted generate shows the text it had drawn.
# Runs from the repository root.
set -u
BIN="${ARL_BIN:-build/agentrl}"
[ -x "$BIN" ] || { echo "FAIL: agentrl binary not found at $BIN"; exit 1; }
T=$(mktemp -d /tmp/arl-test-cli-bad-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# term_on_file PID PATTERN...: SIGTERM to PID as soon as a file matching one of the (unquoted)
# glob patterns exists, polled without a pause (the window is a write of a few ms); caught=1 when
# the signal was sent in time; then PID is waited for (its status is the function's)
term_on_file() {
    pid_=$1
    shift
    caught=0
    while kill -0 "$pid_" 2> /dev/null; do
        for g in "$@"; do
            for f in $g; do
                if [ -e "$f" ]; then
                    kill -TERM "$pid_"
                    caught=1
                    break 3
                fi
            done
        done
    done
    wait "$pid_" 2> /dev/null
}

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

# --- generate prints its resolved configuration to stderr, but not under --quiet (warnings and
# errors only, as for every command)
"$BIN" generate --ckpt "$T/ck" --prompt hi --max-tokens 2 --threads 1 > /dev/null 2> "$T/err" ||
    fail "generate: $(cat "$T/err")"
grep -q "max-tokens *= 2" "$T/err" || fail "generate: no resolved configuration: $(cat "$T/err")"
"$BIN" --quiet generate --ckpt "$T/ck" --prompt hi --max-tokens 2 --threads 1 > /dev/null \
    2> "$T/err" || fail "generate --quiet: $(cat "$T/err")"
[ -s "$T/err" ] && fail "generate --quiet wrote to stderr: $(cat "$T/err")"

# --- generate writes valid UTF-8: the model draws bytes one token at a time (at temperature 2
# many of them above 0x7F: characters spread over tokens, bytes that start none, a character cut
# by --max-tokens), and what went to stdout was those bytes as drawn
if command -v iconv > /dev/null; then
    for seed in 1 2 3 4; do
        for m in 3 8 24; do
            "$BIN" --quiet generate --ckpt "$T/ck" --prompt hi --max-tokens $m --seed $seed \
                --temperature 2 --threads 1 > "$T/gen.utf8" 2> "$T/err" || fail "generate: $(cat "$T/err")"
            iconv -f UTF-8 -t UTF-8 "$T/gen.utf8" > /dev/null 2>&1 ||
                fail "generate --seed $seed --max-tokens $m wrote invalid UTF-8: $(od -An -tx1 "$T/gen.utf8" | head -3)"
        done
    done
fi

# --- generate and score: --ckpt that is not a checkpoint directory: exit 1 whether it is
# missing or a file, as for every command's input path that is not there
expect 1 "--ckpt $T/ck/config.json: not a directory" \
    "$BIN" generate --ckpt "$T/ck/config.json" --prompt hi
expect 1 "--ckpt $T/ck/config.json: not a directory" \
    "$BIN" score --ckpt "$T/ck/config.json" --text "$T/hello.txt"
expect 1 "--ckpt $T/none: No such file" "$BIN" score --ckpt "$T/none" --text "$T/hello.txt"
expect 1 "--ckpt $T/none: No such file" "$BIN" generate --ckpt "$T/none" --prompt hi

# --- generate: an empty prompt is a usage error
expect 2 "--prompt: empty" "$BIN" generate --ckpt "$T/ck" --prompt ""

# --- generate --prompt-file FILE (- : standard input) is the message --prompt gives (one longer
# than a command line takes); exactly one of the two; an empty file is a usage error
printf 'What is 3 + 4?' > "$T/q.txt"
"$BIN" --quiet generate --ckpt "$T/ck" --prompt "What is 3 + 4?" --max-tokens 6 --seed 2 \
    --threads 1 > "$T/g.arg" 2> "$T/err" || fail "generate --prompt: $(cat "$T/err")"
"$BIN" --quiet generate --ckpt "$T/ck" --prompt-file "$T/q.txt" --max-tokens 6 --seed 2 \
    --threads 1 > "$T/g.file" 2> "$T/err" || fail "generate --prompt-file: $(cat "$T/err")"
"$BIN" --quiet generate --ckpt "$T/ck" --prompt-file - --max-tokens 6 --seed 2 --threads 1 \
    < "$T/q.txt" > "$T/g.stdin" 2> "$T/err" || fail "generate --prompt-file -: $(cat "$T/err")"
cmp -s "$T/g.arg" "$T/g.file" || fail "generate: --prompt-file differs from --prompt"
cmp -s "$T/g.arg" "$T/g.stdin" || fail "generate: --prompt-file - differs from --prompt"
expect 2 "exactly one of --prompt TEXT or --prompt-file FILE" \
    "$BIN" generate --ckpt "$T/ck" --prompt hi --prompt-file "$T/q.txt"
expect 2 "exactly one of --prompt TEXT or --prompt-file FILE" "$BIN" generate --ckpt "$T/ck"
: > "$T/empty.txt"
expect 2 "--prompt-file $T/empty.txt: the file is empty" \
    "$BIN" generate --ckpt "$T/ck" --prompt-file "$T/empty.txt"
expect 1 "--prompt-file: $T/none.txt: cannot open" \
    "$BIN" generate --ckpt "$T/ck" --prompt-file "$T/none.txt"

# --- score: inputs
: > "$T/empty.txt"
expect 2 "--text $T/empty.txt: the file is empty" "$BIN" score --ckpt "$T/ck" --text "$T/empty.txt"
"$BIN" --quiet score --ckpt "$T/ck" --text "$T/hello.txt" --logits-out "$T/f32.npy" > /dev/null ||
    fail "score --logits-out exited $?"
expect 1 "got F32 of rank 2" "$BIN" score --ckpt "$T/ck" --tokens "$T/f32.npy"
if /usr/bin/python3 -c "import numpy as np; np.save('$T/none.npy', np.zeros((0,), np.int32))" 2> /dev/null; then
    expect 2 "--tokens $T/none.npy: nothing to score" "$BIN" score --ckpt "$T/ck" --tokens "$T/none.npy"
fi

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
term_on_file $pid "$T/sig/l.npy.tmp-*"
set -- "$T"/sig/l.npy.tmp-*
[ -e "$1" ] && fail "score interrupted while writing left $1"
if [ -e "$T/sig/l.npy" ]; then # whole: header (128 bytes) + 13500 x 384 floats
    [ "$(wc -c < "$T/sig/l.npy")" -eq $((128 + 13500 * 384 * 4)) ] ||
        fail "score interrupted while writing left a partial l.npy"
fi
[ $caught -eq 1 ] || echo "note: the interrupt came too late to test the write of --logits-out"

# --- env demos: a failure or an interrupt leaves --out as it was
expect 2 "no built-in environment 'bogus'" "$BIN" env demos bogus --episodes 2 --out "$T/mine.txt"
expect 2 "no built-in environment 'echo' with a teacher (calculator, needle, kvstore, shapes)" "$BIN" env demos echo --episodes 2
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
expect 2 "--decode: token id 999" "$BIN" tokenize --decode "1 999"

# --- model init
expect 2 "OUT_DIR: empty path" "$BIN" model init tiny "" --seed 1
expect 2 "option '--seed'" "$BIN" model init tiny "$T/ck2" --seed " 5"
expect 2 "option '--seed'" "$BIN" model init tiny "$T/ck2" --seed "+5"
[ -e "$T/ck2" ] && fail "model init with a bad seed made $T/ck2"
expect 1 "not empty; refusing to overwrite" "$BIN" model init tiny "$T/ck" --seed 2
cksum "$T/ck/model.safetensors" "$T/ck/config.json" | cmp -s - "$T/ck.sum" ||
    fail "model init changed an existing checkpoint"

# --- model init of a larger model (62 MB): a failure or an interrupt leaves OUT_DIR as it was
# (the old checkpoint whole, or none) and nothing beside it; --force replaces it in one step
sed 's/"vocab_size": 384/"vocab_size": 50000/' configs/tiny/config.json > "$T/big.json"
sums() { (cd "$2" && cksum -- *) > "$T/$1.sum"; } # sums NAME DIR: each file of DIR by name
same() { (cd "$1" && cksum -- *) | cmp -s - "$T/$2.sum"; }
"$BIN" --quiet model init "$T/big.json" "$T/new2" --seed 2 --shard-size 200000 > /dev/null 2>&1 ||
    fail "model init of big.json exited $?"
sums new "$T/new2"
# interrupted while writing a new OUT_DIR: nothing left
"$BIN" --quiet model init "$T/big.json" "$T/bg" --seed 1 --shard-size 200000 --threads 1 \
    > /dev/null 2>&1 &
pid=$!
term_on_file $pid "$T/bg.tmp-*/model-00005-*"
rc=$?
set -- "$T"/bg*
if [ $rc -ne 0 ]; then
    [ -e "$1" ] && fail "interrupted model init left $*"
else
    [ "$*" = "$T/bg" ] || fail "model init left $*"
fi
rm -rf "$T"/bg*
[ $caught -eq 1 ] || echo "note: the interrupt came too late to test model init of a new directory"
"$BIN" --quiet model init "$T/big.json" "$T/bg" --seed 1 --shard-size 200000 > /dev/null 2>&1 ||
    fail "model init of big.json exited $?"
sums old "$T/bg"
# interrupted while writing --force's replacement: the old checkpoint whole (or the new one
# whole, if too late), nothing beside it
"$BIN" --quiet model init "$T/big.json" "$T/bg" --seed 2 --shard-size 200000 --threads 1 --force \
    > /dev/null 2> "$T/err" &
pid=$!
term_on_file $pid "$T/bg.tmp-*/model-00005-*" "$T/bg/model-00005-*.tmp-*"
rc=$?
same "$T/bg" old || same "$T/bg" new || fail "interrupted model init --force left a mixed checkpoint"
set -- "$T"/bg.*
[ -e "$1" ] && fail "interrupted model init --force left $*"
if [ $rc -ne 0 ]; then
    grep -q "interrupted: model init stops here; $T/bg is as it was" "$T/err" ||
        fail "interrupted model init --force: $(cat "$T/err")"
fi
[ $caught -eq 1 ] || echo "note: the interrupt came too late to test model init --force"
# a write that fails part-way (the file size limit): the old checkpoint stays, nothing beside it
"$BIN" --quiet model init "$T/big.json" "$T/bg" --seed 1 --shard-size 200000 --force \
    > /dev/null 2>&1 || fail "model init --force exited $?"
(
    trap '' XFSZ
    ulimit -f 4000
    exec "$BIN" --quiet model init "$T/big.json" "$T/bg" --seed 2 --force
) > /dev/null 2> "$T/err"
[ $? -eq 1 ] || fail "model init --force over the file size limit did not exit 1: $(cat "$T/err")"
grep -q "^agentrl: error: .*File too large" "$T/err" || fail "file size limit: $(cat "$T/err")"
same "$T/bg" old || fail "model init --force that failed changed the checkpoint"
set -- "$T"/bg.*
[ -e "$1" ] && fail "model init --force that failed left $*"

# --- generate: tokens are printed as they are drawn, so an interrupt leaves the text so far
# (and says so); the 62 MB model draws 2000 tokens in seconds
"$BIN" --quiet generate --ckpt "$T/new2" --prompt hi --max-tokens 2000 --threads 1 \
    > "$T/gen.out" 2> "$T/gen.err" &
pid=$!
while kill -0 $pid 2> /dev/null && [ ! -s "$T/gen.out" ]; do :; done
kill -TERM $pid 2> /dev/null
wait $pid 2> /dev/null
rc=$?
[ -s "$T/gen.out" ] || fail "interrupted generate printed nothing"
[ $rc -eq 143 ] ||
    fail "generate was not interrupted after its first token (exit $rc): tokens not printed as drawn"
grep -q "interrupted: generate stops here; the text above is what it had sampled" "$T/gen.err" ||
    fail "interrupted generate: $(cat "$T/gen.err")"

# --- generate --image: an image that cannot be used names --image (exit 1; the message was
# the bare file name), a too-large one --max-pixels; an image alone is a prompt; --help does not
# call --device cuda text-only (the device prefill takes the image rows); the same seed gives
# the same text, whatever --threads
grep -q vision_config "$T/ck/config.json" || fail "the tiny config has no vision tower"
# a 64x48 PPM image
{ printf 'P6 64 48 255\n'; head -c 9216 /dev/zero | tr '\0' 'x'; } > "$T/img.ppm"
: > "$T/empty.png"
echo '{}' > "$T/notes.json"

expect 1 "^agentrl: error: --image: $T/none.png: cannot open" \
    "$BIN" generate --ckpt "$T/ck" --prompt hi --image "$T/none.png"
expect 1 "^agentrl: error: --image: $T: " "$BIN" generate --ckpt "$T/ck" --prompt hi --image "$T"
expect 1 "^agentrl: error: --image: $T/empty.png: not a PNG or PPM" \
    "$BIN" generate --ckpt "$T/ck" --prompt hi --image "$T/empty.png"
expect 1 "^agentrl: error: --image: $T/notes.json: not a PNG or PPM" \
    "$BIN" generate --ckpt "$T/ck" --prompt hi --image "$T/notes.json"
expect 1 "^agentrl: error: --image (--max-pixels 100): $T/img.ppm: image of 64x48 pixels" \
    "$BIN" generate --ckpt "$T/ck" --prompt hi --image "$T/img.ppm" --max-pixels 100
"$BIN" --quiet generate --ckpt "$T/ck" --prompt "" --image "$T/img.ppm" --max-tokens 4 > /dev/null \
    2> "$T/err" || fail "an image alone as the prompt: $(cat "$T/err")"

"$BIN" generate --help > "$T/help" 2>&1
grep -q "text prompts only" "$T/help" && fail "--help: --device cuda called text-only (it takes --image)"

# the same seed, the same text (1 and 2 threads)
for t in 1 2; do
    "$BIN" --quiet generate --ckpt "$T/ck" --prompt "What is 3 + 4?" --seed 5 --temperature 0.8 \
        --top-p 0.9 --max-tokens 40 --threads $t > "$T/gen$t" 2> /dev/null || fail "generate --threads $t"
done
"$BIN" --quiet generate --ckpt "$T/ck" --prompt "What is 3 + 4?" --seed 5 --temperature 0.8 \
    --top-p 0.9 --max-tokens 40 --threads 1 > "$T/gen3" 2> /dev/null || fail "generate again"
[ -s "$T/gen1" ] && cmp -s "$T/gen1" "$T/gen2" && cmp -s "$T/gen1" "$T/gen3" ||
    fail "the same seed gave other text"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "ok"
