#!/bin/sh
# tests/rollout/env_ids.sh: the ids an environment gets are the store's (rollout/internal.h
# ro_env_id, spec/aep.md 3: globally unique, never reused).  Two rollouts of one run uid into two
# new stores against one `agentrl env serve` process (which keeps every id it has seen) both
# finish with nothing masked - before, the second was masked SESSION_CLOSED throughout - and the
# create requests they stored carry "<traj_uid>@<12 hex digits of their store's uid>".  (A resume
# in the same store finding its session again: tests/rollout/test_kill.c test_resume_remote.)
set -u
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "no $BIN (build the agentrl target)"; exit 77; }
command -v sqlite3 > /dev/null || { echo "no sqlite3"; exit 77; }
T=$(mktemp -d /tmp/arl-test-env-ids-XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$BIN" model init tiny "$T/ckpt" --seed 3 > /dev/null 2>&1 || fail "model init"
. "$(dirname "$0")/../serve_url.sh"
"$BIN" env serve calculator --port 0 > "$T/serve" 2> "$T/serve.err" &
pid=$!
url=$(serve_url "$T/serve" "$pid") || { cat "$T/serve.err"; fail "env serve printed no URL"; }
cat > "$T/exp.json" <<JSON
{"rollout": {"env": "$url", "group_size": 2, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 4, "progress_s": 0}}
JSON
for db in a b; do
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/$db" --tasks 2 > "$T/out-$db" 2> "$T/err-$db" \
        || { tail -5 "$T/err-$db"; fail "rollout into $db"; }
    grep -q "trajectories  4 (complete [0-9]*, truncated [0-9]*, masked 0" "$T/out-$db" \
        || { cat "$T/out-$db"; grep -m3 "masked" "$T/err-$db"; fail "rollout into $db: masked trajectories"; }
    uid=$(sqlite3 "$T/$db/catalog.sqlite" "SELECT value FROM meta WHERE key = 'store_uid'")
    tag=$(echo "$uid" | cut -c1-12)
    [ ${#tag} -eq 12 ] || fail "$db: no store_uid ($uid)"
    ids=$(sqlite3 "$T/$db/shards/w1.sqlite" \
        "SELECT json_extract(CAST(request_body AS TEXT), '\$.trajectory_id') FROM env_calls WHERE endpoint = 'create' ORDER BY 1")
    n=$(echo "$ids" | grep -c "^rollout/g00000[01]/r[01]@$tag\$")
    [ "$n" -eq 4 ] || { echo "$ids"; fail "$db: create requests without '@$tag'"; }
done
# the same run uid in both stores, other ids on the wire
[ "$(sqlite3 "$T/a/catalog.sqlite" "SELECT value FROM meta WHERE key = 'store_uid'")" != \
  "$(sqlite3 "$T/b/catalog.sqlite" "SELECT value FROM meta WHERE key = 'store_uid'")" ] || fail "one store uid twice"
echo ok
