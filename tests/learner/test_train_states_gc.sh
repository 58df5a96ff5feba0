#!/bin/sh
# tests/learner/test_train_states_gc.sh: `agentrl train` with learner.keep-states collects the
# learner states file it writes (spec/replay.md 7.6, 9.3): after an update (with
# learner.state-gc-interval-s 0) the file is within learner.state-budget-bytes, the evicted
# states left as tombstones without chunks; a --resume with other GC settings (the learner's and
# the rollout's) is accepted (they are not part of the run's identity) and runs with them;
# without learner records (learner.records false) the states of the consumed trajectories are
# not garbage: `replay gc --learner all` keeps them, `--learner off` evicts them (tombstones).
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
command -v sqlite3 > /dev/null || { echo "no sqlite3"; exit 77; }
tmp=$(mktemp -d /tmp/arl-test-train-states-gc-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
out="$tmp/run"
budget=1000000
set -- --set "out=$out" --set progress=plain --set sft-demos=0 --set eval-tasks=0 \
    --set rollout.group-size=1 --set learner.total-steps=2 --set learner.keep-states=all \
    --set learner.records=false
"$bin" train "$src/experiments/calculator-ci.json" "$@" --set steps=1 \
    --set learner.state-budget-bytes=$budget --set learner.state-gc-interval-s=0 \
    > "$tmp/log" 2>&1 || { rc=$?; tail -5 "$tmp/log"; fail "train exited with $rc"; }
sf() { ls "$out"/replay/u00000"$1"/r0/shards/l*.states.sqlite 2> /dev/null | head -1; }
q() { sqlite3 "$1" "$2"; }
f0=$(sf 0)
[ -n "$f0" ] || fail "no learner states file in update 0's store"
# update 0: within the budget, the least recently used evicted (tombstones, no chunks)
total=$(q "$f0" "SELECT coalesce(sum(n_bytes), 0) FROM states WHERE status = 'complete'")
kept=$(q "$f0" "SELECT count(*) FROM states WHERE status = 'complete'")
evicted=$(q "$f0" "SELECT count(*) FROM states WHERE status = 'evicted'")
[ "$total" -le $budget ] || fail "update 0's learner states hold $total bytes, over the budget $budget"
[ "$kept" -ge 1 ] || fail "the budget $budget left no state"
[ "$evicted" -ge 1 ] || fail "no state evicted ($total bytes kept)"
[ "$(q "$f0" "SELECT count(*) FROM state_chunks c JOIN states s ON s.state_id = c.state_id WHERE s.status = 'evicted'")" -eq 0 ] \
    || fail "evicted states kept chunks"
grep -q "learner: states of shards/l[0-9]*.sqlite: 0 stale deleted, $evicted evicted" "$tmp/log" \
    || { grep "learner" "$tmp/log"; fail "no log line of the eviction"; }
# a resume with other GC settings is the same run: update 1 with no budget keeps every state
"$bin" train "$src/experiments/calculator-ci.json" "$@" --set steps=2 \
    --set learner.state-budget-bytes=0 --set learner.state-gc-interval-s=1 \
    --set rollout.state-budget-bytes=0 --set rollout.state-gc-interval-s=60 --resume \
    > "$tmp/log2" 2>&1 || { rc=$?; tail -5 "$tmp/log2"; fail "the resume with other GC settings exited with $rc"; }
f1=$(sf 1)
[ -n "$f1" ] || fail "no learner states file in update 1's store"
n1=$(q "$f1" "SELECT count(*) FROM states WHERE status = 'complete'")
[ "$n1" -ge 2 ] && [ "$(q "$f1" "SELECT count(*) FROM states")" -eq "$n1" ] \
    || fail "update 1 (state-budget-bytes 0): $(q "$f1" "SELECT status, count(*) FROM states GROUP BY status")"
! grep -q "learner: states of" "$tmp/log2" || fail "a GC line with nothing evicted"
# no learner records: the consumed trajectories' states are kept by `replay gc --learner all`,
# even with no age limit, and evicted (not deleted) by --learner off
"$bin" replay gc "$out/replay/u000001/r0" --learner all --min-age-ms 0 > "$tmp/gc1" 2>&1 \
    || { rc=$?; cat "$tmp/gc1"; fail "replay gc --learner all exited with $rc"; }
[ "$(q "$f1" "SELECT count(*) FROM states WHERE status = 'complete'")" -eq "$n1" ] \
    || { cat "$tmp/gc1"; fail "replay gc --learner all deleted learner states that keep-states kept"; }
"$bin" replay gc "$out/replay/u000001/r0" --learner off --min-age-ms 0 > "$tmp/gc2" 2>&1 \
    || { rc=$?; cat "$tmp/gc2"; fail "replay gc --learner off exited with $rc"; }
[ "$(q "$f1" "SELECT count(*) FROM states WHERE status = 'evicted'")" -eq "$n1" ] \
    || { cat "$tmp/gc2"; fail "replay gc --learner off: $(q "$f1" "SELECT status, count(*) FROM states GROUP BY status")"; }
rm -rf "$tmp"
echo "ok"
