#!/bin/bash
# tests/envs_aep/python_example.sh: the Python example server (envs/examples/wordcount_server.py,
# standard library only) passes `agentrl env check` with its conformance script and with a
# script derived from /info, and drains and exits on SIGTERM.  Skipped (77) without
# /usr/bin/python3.
set -u
BIN=${ARL_BIN:-build/agentrl}
SRC=${ARL_SOURCE_DIR:-.}
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "skip: no $PY"; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
"$PY" "$SRC/envs/examples/wordcount_server.py" --port 0 > "$tmp/out" 2> "$tmp/err" &
pid=$!
. "$(dirname "$0")/../serve_url.sh"
url=$(serve_url "$tmp/out" "$pid") || { echo "FAIL: the example server did not start"; cat "$tmp/err"; exit 1; }
fail=0
"$BIN" env check "$url" --script "$SRC/envs/examples/wordcount_script.json" > "$tmp/c1" 2>&1 || { fail=1; cat "$tmp/c1"; }
"$BIN" env check "$url" > "$tmp/c2" 2>&1 || { fail=1; cat "$tmp/c2"; }
tail -1 "$tmp/c1"; tail -1 "$tmp/c2"
kill -TERM "$pid"
for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$pid" 2>/dev/null; then echo "FAIL: still running after SIGTERM"; fail=1; fi
pid=
[ -s "$tmp/err" ] && { echo "server stderr:"; cat "$tmp/err"; }
exit $fail
