#!/bin/sh
# tests/rollout/interrupt.sh: `agentrl rollout` interrupted (SIGTERM; a background job of a
# script ignores SIGINT).  Once it has written, it stops after its current step and prints the
# summary of what it finished, marked interrupted, before the note with the command that
# continues it (it printed the note alone); that command finishes the run.  Interrupted before it
# wrote (held in its environment's first request: an `agentrl env serve` that is stopped), it
# leaves no new store behind (an empty one stayed), also when a second signal stops it at once
# (one stayed), and a store that existed stays as it was.
set -u
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "no $BIN (build the agentrl target)"; exit 77; }
T=$(mktemp -d /tmp/arl-test-rollout-int-XXXXXX)
srv=
pid=
cleanup() {
    [ -n "$srv" ] && { kill -CONT "$srv"; kill "$srv"; } 2>/dev/null
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$(dirname "$0")/../wait_for.sh"
"$BIN" model init tiny "$T/ckpt" --seed 3 > /dev/null 2>&1 || fail "model init"
cat > "$T/exp.json" <<'JSON'
{"rollout": {"env": "calculator", "group_size": 2, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 4, "progress_s": 0.05}}
JSON
# --- SIGTERM once trajectories have finished: exit 143, the partial summary (stdout) before the
# note (stderr), its count that of the finished trajectories in the store
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 20 > "$T/all" 2>&1 &
pid=$!
wait_for grep -q "rollout: [1-9][0-9]*/40 trajectories" "$T/all" || fail "no trajectory finished"
kill -TERM $pid
wait $pid
rc=$?
pid=
[ $rc -eq 143 ] || { tail -5 "$T/all"; fail "SIGTERM: exit $rc, 143 expected"; }
grep -q "^agentrl: error" "$T/all" && { tail -5 "$T/all"; fail "SIGTERM: an error printed"; }
at_sum=$(grep -n "^rollout summary (interrupted: what it finished before the interrupt)$" "$T/all" | cut -d: -f1)
at_note=$(grep -n "^agentrl: interrupted: rollout stops here; what it saved stays. Continue with:$" "$T/all" | cut -d: -f1)
[ -n "$at_sum" ] || { tail -15 "$T/all"; fail "SIGTERM: no summary marked interrupted"; }
[ -n "$at_note" ] && [ "$at_sum" -lt "$at_note" ] || { tail -15 "$T/all"; fail "SIGTERM: the note is not after the summary"; }
grep -q "^stored in $T/db (shard 1)$" "$T/all" || { tail -15 "$T/all"; fail "SIGTERM: no 'stored in'"; }
n_sum=$(sed -n 's/^  trajectories  \([0-9]*\) (complete.*/\1/p' "$T/all")
n_all=$("$BIN" replay list "$T/db" | tail -n +2 | wc -l)
n_run=$("$BIN" replay list "$T/db" --status running | tail -n +2 | wc -l)
[ -n "$n_sum" ] && [ "$n_sum" -ge 1 ] && [ "$n_sum" -eq $((n_all - n_run)) ] ||
    { tail -15 "$T/all"; fail "SIGTERM: summary counts ${n_sum:-none}, the store holds $((n_all - n_run)) finished"; }
cmd=$(grep -A1 "Continue with:$" "$T/all" | tail -1)
# (the binary as it was started: $BIN, a path)
[ "$cmd" = "  $BIN rollout $T/exp.json --ckpt $T/ckpt --out $T/db --tasks 20 --shard 1" ] ||
    { tail -3 "$T/all"; fail "SIGTERM: the continue command: $cmd"; }
# run as printed (a shell's command line)
sh -c "$cmd --progress-s 0" > "$T/out2" 2> "$T/err2" ||
    { tail -3 "$T/err2"; fail "the continue command failed"; }
grep -q "^rollout summary$" "$T/out2" || { cat "$T/out2"; fail "a run to its end: the plain summary"; }
"$BIN" replay list "$T/db" --status running | grep -q "^rollout/" && fail "trajectories left running"

# --- SIGTERM before the worker wrote: the rollout waits for the environment's info (its server
# is stopped) when the signal comes, after the store was made; then the server goes on
. "$(dirname "$0")/../serve_url.sh"
"$BIN" env serve calculator --port 0 > "$T/serve" 2> "$T/serve.err" &
srv=$!
url=$(serve_url "$T/serve" "$srv") || { cat "$T/serve.err"; fail "env serve printed no URL"; }
kill -STOP "$srv"
# early OUT [twice]: SIGTERM while held (twice: a second one once the first was noted, which
# stops it at once); exit 143, OUT as it was after (absent, or the same files)
early() {
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$1" --tasks 2 --env "$url" > "$T/out-e" 2> "$T/err-e" &
    pid=$!
    # (its resolved configuration is printed just before the handling is armed, the store made
    # after; then a pause, to be held in the environment's request when the signal comes)
    wait_for grep -q "group-size *=" "$T/err-e" || fail "early $*: no configuration printed"
    wait_for test -d "$1/shards" || fail "early $*: no store made"
    sleep 0.2
    kill -TERM $pid
    if [ $# -gt 1 ]; then
        wait_for grep -q "stopping after the current step" "$T/err-e" || fail "early $*: the first signal was not noted"
        kill -TERM $pid
    fi
    kill -CONT "$srv"
    wait $pid
    rc=$?
    pid=
    kill -STOP "$srv"
    [ $rc -eq 143 ] || { tail -3 "$T/err-e"; fail "early $*: exit $rc, 143 expected"; }
}
# early_said OUT: no error, no summary, the note of a rollout that had not started
early_said() {
    grep -q "^agentrl: error" "$T/err-e" && { tail -3 "$T/err-e"; fail "early $1: an error printed"; }
    grep -qx "agentrl: interrupted: rollout stops here, before it started (run the same command to start it)" \
        "$T/err-e" || { tail -3 "$T/err-e"; fail "early $1: the note"; }
    [ -s "$T/out-e" ] && { cat "$T/out-e"; fail "early $1: a summary of nothing"; }
    return 0
}
early "$T/db-early"
[ -e "$T/db-early" ] && { ls -R "$T/db-early"; fail "early: an empty store left behind"; }
early_said "$T/db-early"
early "$T/db-early2" twice
[ -e "$T/db-early2" ] && { ls -R "$T/db-early2"; fail "early, a second signal: an empty store left behind"; }
early_said "$T/db-early2"
# (its files but a SQLite -wal or -shm, which come and go with the connections; its rows)
files() { ls -R "$1" | grep -v -e '-wal$' -e '-shm$'; "$BIN" replay list "$1" --sort uid; }
files "$T/db" > "$T/db-before"
early "$T/db"
files "$T/db" | diff - "$T/db-before" || fail "early into an existing store: it changed"
early_said "$T/db"
early "$T/db" twice
files "$T/db" | diff - "$T/db-before" || fail "early, a second signal, into an existing store: it changed"
early_said "$T/db"
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "early: verify"; }
# --quiet: no resolved configuration and no progress lines on stderr, the summary on stdout
kill -CONT "$srv"
"$BIN" --quiet rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-q" --tasks 1 --env "$url" \
    > "$T/out-q" 2> "$T/err-q" || { cat "$T/err-q"; fail "--quiet rollout"; }
[ -s "$T/err-q" ] && { head -5 "$T/err-q"; fail "--quiet rollout wrote to stderr"; }
grep -q "^rollout summary$" "$T/out-q" || { cat "$T/out-q"; fail "--quiet rollout: no summary"; }
echo ok
