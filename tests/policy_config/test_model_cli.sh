#!/bin/sh
# agentrl model info / model init end to end (spec/policy.md sections 12.5, 13, 14):
# counts printed by `model info --json` for the shipped configs, `model init` of tiny,
# determinism of the written checkpoint per seed, checkpoint checking with `model info
# --check`, refusal to overwrite, --force replacing a checkpoint whole (no stale files), usage
# errors.  Runs from the repository root.
set -u
BIN="${ARL_BIN:-build/agentrl}"
[ -x "$BIN" ] || { echo "FAIL: agentrl binary not found at $BIN"; exit 1; }
TMP=$(mktemp -d /tmp/arl-test-modelcli-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_json NAME CONFIG TOTAL ACTIVE
expect_json() {
    out=$("$BIN" model info "$2" --json) || { fail "$1: model info exited $?"; return; }
    [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$1: --json printed more than one line"
    case "$out" in *"\"total_params\":$3,"*) ;; *) fail "$1: total_params != $3: $out" ;; esac
    case "$out" in *"\"active_params\":$4,"*) ;; *) fail "$1: active_params != $4: $out" ;; esac
}
expect_json kimi-k3 configs/kimi-k3/config.json 2779931834976 104189612640
expect_json tiny configs/tiny/config.json 3008316 1741564
expect_json mini configs/mini 2773248792 407900696
expect_json tiny-by-name tiny 3008316 1741564
out=$("$BIN" model info configs/kimi-k3/config.json --json)
case "$out" in *'"text_params":2779484476000,'*) ;; *) fail "kimi-k3 text_params: $out" ;; esac
case "$out" in *'"kda_state_bytes_per_sequence":434110464,'*) ;; *) fail "kimi-k3 KDA state: $out" ;; esac
case "$out" in *'"mla_cache_bytes_per_token_bf16":27648,'*) ;; *) fail "kimi-k3 MLA cache: $out" ;; esac

# the table names every component
table=$("$BIN" model info kimi-k3) || fail "model info table exited $?"
for w in embedding kda mla dense_ffn routed_experts shared_experts latent_projections router \
         norms_attnres lm_head vision_tower projector "2,779,931,834,976" "104,189,612,640"; do
    case "$table" in *"$w"*) ;; *) fail "model info table lacks '$w'" ;; esac
done

# model init, then check and load the checkpoint
"$BIN" model init tiny "$TMP/a" --seed 5 >/dev/null 2>&1 || fail "model init exited $?"
[ -f "$TMP/a/config.json" ] && [ -f "$TMP/a/model.safetensors" ] || fail "model init wrote no files"
out=$("$BIN" model info "$TMP/a" --check --json) || fail "model info --check exited $?"
case "$out" in *'"checkpoint":{"ok":true,"tensors":560,'*) ;; *) fail "--check: $out" ;; esac
cmp -s "$TMP/a/config.json" configs/tiny/config.json || fail "written config.json differs from the shipped one"
# same seed: identical bytes; another seed: different
"$BIN" model init configs/tiny/config.json "$TMP/b" --seed 5 --threads 1 >/dev/null 2>&1 || fail "second init exited $?"
cmp -s "$TMP/a/model.safetensors" "$TMP/b/model.safetensors" || fail "same seed gave different checkpoints"
"$BIN" model init tiny "$TMP/c" --seed 6 >/dev/null 2>&1 || fail "third init exited $?"
cmp -s "$TMP/a/model.safetensors" "$TMP/c/model.safetensors" && fail "different seeds gave the same checkpoint"
# sharded
"$BIN" model init tiny "$TMP/d" --seed 5 --shard-size 2000000 >/dev/null 2>&1 || fail "sharded init exited $?"
[ -f "$TMP/d/model.safetensors.index.json" ] || fail "sharded init wrote no index"
"$BIN" model info "$TMP/d" --check >/dev/null || fail "sharded checkpoint failed --check"
# refuse to overwrite; --force replaces
"$BIN" model init tiny "$TMP/a" --seed 7 >/dev/null 2>&1
[ $? -eq 1 ] || fail "init into a non-empty dir did not fail with 1"
cmp -s "$TMP/a/model.safetensors" "$TMP/b/model.safetensors" || fail "refused init changed files"
"$BIN" model init tiny "$TMP/a" --seed 6 --force >/dev/null 2>&1 || fail "--force init exited $?"
cmp -s "$TMP/a/model.safetensors" "$TMP/c/model.safetensors" || fail "--force did not replace the checkpoint"
# --force replaces the whole checkpoint: sharded -> one file leaves no stale shard or index,
# one file -> sharded no stale model.safetensors, nothing beside OUT_DIR; it says so
cp -r "$TMP/d" "$TMP/f"
out=$("$BIN" --quiet model init tiny "$TMP/f" --seed 6 --force 2>&1) || fail "--force over shards exited $?"
[ "$(ls "$TMP/f" | tr '\n' ' ')" = "config.json model.safetensors " ] ||
    fail "--force over a sharded checkpoint left: $(ls "$TMP/f" | tr '\n' ' ')"
case "$out" in *"replaced the checkpoint that was in $TMP/f (its "*" files removed)"*) ;;
    *) fail "--force did not say that it replaced the checkpoint: $out" ;; esac
cmp -s "$TMP/f/model.safetensors" "$TMP/c/model.safetensors" || fail "--force over shards: wrong weights"
"$BIN" model init tiny "$TMP/f" --seed 5 --shard-size 2000000 --force >/dev/null 2>&1 ||
    fail "--force to shards exited $?"
[ -e "$TMP/f/model.safetensors" ] && fail "--force to shards left the stale model.safetensors"
[ "$(ls "$TMP/f" | tr '\n' ' ')" = "$(ls "$TMP/d" | tr '\n' ' ')" ] ||
    fail "--force to shards: $(ls "$TMP/f" | tr '\n' ' ')"
"$BIN" model info "$TMP/f" --check >/dev/null || fail "--force to shards: checkpoint fails --check"
set -- "$TMP"/f.*
[ -e "$1" ] && fail "--force left $1 beside the checkpoint"
# ... and refuses, changing nothing, when OUT_DIR holds more than a checkpoint
echo mine > "$TMP/f/notes.txt"
cksum "$TMP/f"/* > "$TMP/f.sum"
"$BIN" model init tiny "$TMP/f" --seed 6 --force >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] || fail "--force over a folder with other files did not exit 1"
grep -q "^agentrl: error: $TMP/f: holds more than a model checkpoint .*notes.txt" "$TMP/err" ||
    fail "--force over other files: $(cat "$TMP/err")"
cksum "$TMP/f"/* | cmp -s - "$TMP/f.sum" || fail "refused --force changed the folder"
# a damaged checkpoint fails --check
rm "$TMP/d/model-00001-of-0000"*.safetensors
"$BIN" model info "$TMP/d" --check >/dev/null 2>&1 && fail "--check passed with a shard missing"
# usage errors exit 2, failures 1
"$BIN" model init tiny "$TMP/e" >/dev/null 2>&1
[ $? -eq 2 ] || fail "missing --seed did not exit 2"
"$BIN" model init tiny "$TMP/e" --seed abc >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad --seed did not exit 2"
"$BIN" model info no-such-config >/dev/null 2>&1
[ $? -eq 1 ] || fail "unknown config did not exit 1"
"$BIN" model info kimi-k3 --bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown option did not exit 2"

# the resolved configuration on stderr, left out under --quiet (init and score)
"$BIN" model init tiny "$TMP/q" --seed 1 2> "$TMP/err" > /dev/null || fail "init for --quiet: exit $?"
grep -q "^model init" "$TMP/err" || fail "model init printed no configuration: $(cat "$TMP/err")"
"$BIN" --quiet model init tiny "$TMP/q" --seed 1 --force 2> "$TMP/err" > /dev/null ||
    fail "--quiet model init: exit $?"
[ -s "$TMP/err" ] && fail "--quiet model init wrote to stderr: $(cat "$TMP/err")"
printf 'hello world\n' > "$TMP/hello.txt"
"$BIN" score --ckpt "$TMP/q" --text "$TMP/hello.txt" 2> "$TMP/err" > /dev/null || fail "score: exit $?"
grep -q "^score" "$TMP/err" || fail "score printed no configuration: $(cat "$TMP/err")"
"$BIN" --quiet score --ckpt "$TMP/q" --text "$TMP/hello.txt" 2> "$TMP/err" > /dev/null ||
    fail "--quiet score: exit $?"
[ -s "$TMP/err" ] && fail "--quiet score wrote to stderr: $(cat "$TMP/err")"

# a checkpoint whose config.json is a FIFO is read to its end (its size from seeking made it
# "out of memory")
mkdir "$TMP/fifo"
cp "$TMP/q/model.safetensors" "$TMP/fifo/"
mkfifo "$TMP/fifo/config.json"
(for _ in 1 2 3; do cat "$TMP/q/config.json" > "$TMP/fifo/config.json"; sleep 0.5; done) &
feeder=$!
timeout 60 "$BIN" --quiet score --ckpt "$TMP/fifo" --text "$TMP/hello.txt" > /dev/null 2> "$TMP/err" ||
    fail "score with a FIFO config.json: $(cat "$TMP/err")"
kill "$feeder" 2> /dev/null
rm -f "$TMP/fifo/config.json"
wait "$feeder" 2> /dev/null

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "model CLI: all checks passed"
