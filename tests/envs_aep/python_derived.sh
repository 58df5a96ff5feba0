#!/bin/bash
# tests/envs_aep/python_derived.sh: what `agentrl env check` tells the author of a new
# environment, run against variants of the Python example (wordcount_variant.py):
#  - a derived script whose answer action must be repeated (spec/aep.md 15.1) passes, check 21
#    (concurrency) included: its sessions are sent the same repeated answers as the reference;
#  - a derived script that cannot end the episode fails check 7 with a hint to give --script;
#  - a refused request shows the server's error message, not only its code.
# Skipped (77) without /usr/bin/python3.
set -u
BIN=${ARL_BIN:-build/agentrl}
SRC=${ARL_SOURCE_DIR:-.}
export ARL_SOURCE_DIR=$SRC
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "skip: no $PY"; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/../serve_url.sh"
fail=0
# check MODE WANT_RC PATTERN: env check of the variant MODE exits WANT_RC and prints PATTERN
check() {
    # a file of each mode's own: the background job truncates its file after the shell goes on,
    # so serve_url could read the previous server's URL from a shared one (a dead port)
    "$PY" "$(dirname "$0")/wordcount_variant.py" --mode "$1" --port 0 > "$tmp/out-$1" 2> "$tmp/err" &
    pid=$!
    url=$(serve_url "$tmp/out-$1" "$pid") || { echo "FAIL: the $1 server did not start"; cat "$tmp/err"; fail=1; return; }
    "$BIN" env check "$url" > "$tmp/c" 2>&1
    rc=$?
    if [ $rc -ne "$2" ] || ! grep -qF -- "$3" "$tmp/c"; then
        echo "FAIL: mode $1: exit $rc (want $2), output lacks: $3"; cat "$tmp/c"; fail=1
    else
        echo "ok: mode $1: $(grep -F -- "$3" "$tmp/c" | head -n 1)"
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
}
check repeat 0 "pass    21 concurrency"
check never 1 "did not reach terminated: true (4 steps): give a conformance script, --script FILE"
check reject 1 'GET /info: expected 200, got 400 UNSUPPORTED_VERSION ("AEP-Version must be 1.0")'
exit $fail
