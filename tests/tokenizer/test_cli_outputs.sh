#!/bin/sh
# Where the results of `agentrl tokenize` and `agentrl env demos` go (cli/interrupt.c
# cli_out_open, cli/main.c):
#  - a write to standard output that fails (a full disk under '> FILE'; /dev/full here) exits 1
#    naming standard output, instead of 0 with the output cut short;
#  - --out naming a FIFO (or a device: /dev/null, /dev/stdout) writes into it; the temporary file
#    renamed onto the name replaced the node itself with a regular file (as root, /dev/null);
#  - --out naming a symbolic link replaces the file the link names and keeps the link;
#  - env demos stopped by a full disk names the file (or standard output) and the reason.
set -u
BIN=${ARL_BIN:-build/agentrl}
SRC=${ARL_SOURCE_DIR:-.}
FIX=$SRC/tests/tokenizer/fixtures
TMP=$(mktemp -d /tmp/arl-test-outputs-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "$BIN not built"

# standard output that cannot be written
if [ -w /dev/full ]; then
    for cmd in "tokenize $FIX/golden_conversation.json" "env demos calculator --episodes 2" \
        "model info tiny"; do
        # shellcheck disable=SC2086
        "$BIN" --quiet $cmd > /dev/full 2> "$TMP/err"
        rc=$?
        [ $rc = 1 ] || fail "'$cmd > /dev/full' exited $rc, expected 1: $(cat "$TMP/err")"
        grep -q "^agentrl: error: standard output: write failed: No space left on device" \
            "$TMP/err" || fail "'$cmd > /dev/full' said: $(cat "$TMP/err")"
    done
fi

# env demos on a full disk (/dev/full: --out naming a device is written in place; the write
# fails while the conversations are written, not at the end): exit 1, the file and the
# system's reason named (it said "env demos: write failed after 3 conversations")
if [ -w /dev/full ]; then
    "$BIN" --quiet env demos calculator --episodes 64 --out /dev/full > /dev/null 2> "$TMP/err"
    rc=$?
    [ $rc = 1 ] || fail "env demos --out /dev/full exited $rc, expected 1: $(cat "$TMP/err")"
    grep -q "^agentrl: error: env demos: --out /dev/full: write failed after [0-9]* conversations: No space left on device$" \
        "$TMP/err" || fail "env demos --out /dev/full said: $(cat "$TMP/err")"
    "$BIN" --quiet env demos calculator --episodes 64 > /dev/full 2> "$TMP/err"
    rc=$?
    [ $rc = 1 ] || fail "env demos > /dev/full exited $rc, expected 1: $(cat "$TMP/err")"
    grep -q "^agentrl: error: env demos: standard output: write failed after [0-9]* conversations: No space left on device$" \
        "$TMP/err" || fail "env demos > /dev/full said: $(cat "$TMP/err")"
fi

# --out FIFO: the reader gets every line; the FIFO stays a FIFO
mkfifo "$TMP/demos.fifo" || fail "mkfifo"
timeout 20 cat "$TMP/demos.fifo" > "$TMP/got" &
reader=$!
"$BIN" --quiet env demos calculator --episodes 3 --out "$TMP/demos.fifo" 2> "$TMP/err" ||
    fail "env demos --out FIFO exited $?: $(cat "$TMP/err")"
[ -p "$TMP/demos.fifo" ] || { kill $reader 2> /dev/null; fail "--out FIFO replaced the FIFO"; }
wait $reader
[ "$(grep -c . "$TMP/got")" = 3 ] || fail "the FIFO's reader got $(grep -c . "$TMP/got") lines, expected 3"
ls "$TMP" | grep -q '\.tmp-' && fail "a temporary file is left: $(ls "$TMP")"

# --out symbolic link: the file it names is replaced, the link stays
mkdir "$TMP/d"
echo old > "$TMP/d/real.jsonl"
ln -s d/real.jsonl "$TMP/link.jsonl"
"$BIN" --quiet env demos calculator --episodes 2 --out "$TMP/link.jsonl" 2> "$TMP/err" ||
    fail "env demos --out LINK exited $?: $(cat "$TMP/err")"
[ -L "$TMP/link.jsonl" ] || fail "--out LINK replaced the link with a file"
[ "$(grep -c . "$TMP/d/real.jsonl")" = 2 ] || fail "the linked file holds: $(cat "$TMP/d/real.jsonl")"
ls "$TMP" "$TMP/d" | grep -q '\.tmp-' && fail "a temporary file is left"
echo "1 passed, 0 failed"
