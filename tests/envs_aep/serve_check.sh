#!/bin/bash
# tests/envs_aep/serve_check.sh: `agentrl env check` (with and without a conformance script)
# passes against `agentrl env serve` for the echo test environment and every built-in
# environment that ships a script (envs/builtin/conformance/NAME.json); --json is valid JSON;
# the server picks a free loopback port, prints it, and exits 0 on SIGTERM; --connection-timeout-s
# closes idle connections; usage errors exit 2 and an unreachable server exits 1.
set -u
BIN=${ARL_BIN:-build/agentrl}
SRC=${ARL_SOURCE_DIR:-.}
[ -x "$BIN" ] || { echo "no $BIN"; exit 1; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

. "$(dirname "$0")/../serve_url.sh"
serve() { # NAME [OPTION...] -> sets pid, url
    # emptied here, not by the background job's redirection, which may run after the first
    # grep below and let it read the previous server's URL
    : > "$tmp/out"
    "$BIN" env serve "$@" --port 0 > "$tmp/out" 2> "$tmp/err" &
    pid=$!
    url=$(serve_url "$tmp/out" "$pid") && return 0
    cat "$tmp/err"
    return 1
}

stop() { # SIGTERM: drain, then exit 0
    kill -TERM "$pid"
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then bad "server $1 still running 10 s after SIGTERM"; kill -9 "$pid"; fi
    wait "$pid"; rc=$?
    [ "$rc" = 0 ] || bad "server $1 exited $rc after SIGTERM"
    pid=
}

check() { # NAME URL [SCRIPT]
    local name=$1 u=$2 script=${3:-}
    if [ -n "$script" ]; then
        "$BIN" env check "$u" --script "$script" > "$tmp/check" 2>&1
    else
        "$BIN" env check "$u" > "$tmp/check" 2>&1
    fi
    rc=$?
    if [ "$rc" != 0 ]; then bad "env check $name ${script:+--script $script} exited $rc"; cat "$tmp/check"; fi
    grep -q "conformant" "$tmp/check" || bad "no verdict line for $name"
    ! grep -q " $" "$tmp/check" || bad "env check $name: a line ends in spaces: $(grep -n " $" "$tmp/check" | head -1)"
}

names="echo"
for f in "$SRC"/envs/builtin/conformance/*.json; do
    [ -f "$f" ] && names="$names $(basename "$f" .json)"
done
for name in $names; do
    serve "$name" || { bad "env serve $name did not print its URL"; continue; }
    case $name in
        echo) script="$SRC/tests/envs_aep/echo_script.json" ;;
        *) script="$SRC/envs/builtin/conformance/$name.json" ;;
    esac
    check "$name" "$url"
    check "$name" "$url" "$script"
    echo "ok   $name: $(tail -1 "$tmp/check")"
    stop "$name"
done

# --json: a JSON report on stdout with one entry per check
serve echo || bad "env serve echo"
"$BIN" env check "$url" --json > "$tmp/report.json" 2> /dev/null || bad "env check --json exited non-zero"
grep -q '"conformant": true' "$tmp/report.json" || bad "--json report lacks \"conformant\": true"
[ "$(grep -c '"id":' "$tmp/report.json")" = 26 ] || bad "--json report does not list 26 checks"
# a URL ending in /aep/v1 is accepted
"$BIN" env check "$url/aep/v1" > /dev/null 2>&1 || bad "URL with /aep/v1 suffix"
# a base whose /aep/v1/info is not there (404): check 1 says what the URL should be
"$BIN" env check "$url/other" > "$tmp/check" 2>&1; [ $? = 1 ] || bad "a wrong base should exit 1"
grep -q "GET $url/other/aep/v1/info answered 404: is this an AEP/1 server" "$tmp/check" ||
    { cat "$tmp/check"; bad "a wrong base: check 1 should name the URL tried"; }
# an invalid script is named
echo '{' > "$tmp/bad.json"
"$BIN" env check "$url" --script "$tmp/bad.json" > "$tmp/check" 2>&1; [ $? = 2 ] || bad "an invalid script should exit 2"
grep -q "error: --script $tmp/bad.json: conformance script: invalid JSON" "$tmp/check" ||
    { cat "$tmp/check"; bad "an invalid script should be named"; }
stop echo

# --connection-timeout-s: an idle connection (a client that connects and sends nothing, or
# stops in the middle of a request) is closed after that many seconds, not after 900
serve echo --connection-timeout-s 1 || bad "env serve --connection-timeout-s 1"
port=${url##*:}
for partial in "" "GET /aep/v1/info HTTP/1.1\r\nHost: x\r\n"; do
    start=$(date +%s%N)
    # the read ends when the server closes the connection (timeout 10 s otherwise)
    if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
        printf "$partial" >&3
        timeout 10 cat <&3 > /dev/null
        exec 3<&-
        ms=$((($(date +%s%N) - start) / 1000000))
        { [ "$ms" -ge 700 ] && [ "$ms" -lt 5000 ]; } ||
            bad "idle connection (sent '$partial') closed after $ms ms, expected about 1000"
    else
        bad "cannot connect to port $port"
    fi
done
stop echo
grep -q "^agentrl env serve: stopped (0 sessions left)$" "$tmp/err" ||
    bad "no 'stopped' line after SIGTERM: $(cat "$tmp/err")"
# --quiet: standard error keeps warnings and errors alone (nothing on a clean stop); env demos too
: > "$tmp/out"
"$BIN" --quiet env serve echo --port 0 > "$tmp/out" 2> "$tmp/err" &
pid=$!
serve_url "$tmp/out" "$pid" > /dev/null || bad "--quiet env serve printed no URL"
stop echo
[ -s "$tmp/err" ] && bad "--quiet env serve wrote to stderr: $(cat "$tmp/err")"
"$BIN" env demos calculator --episodes 2 --out "$tmp/d.jsonl" 2> "$tmp/err" ||
    bad "env demos exited $?"
grep -q "^env demos: calculator: 2 episodes, 2 conversations written" "$tmp/err" ||
    bad "env demos summary: $(cat "$tmp/err")"
"$BIN" --quiet env demos calculator --episodes 2 --out "$tmp/d2.jsonl" 2> "$tmp/err" ||
    bad "--quiet env demos exited $?"
[ -s "$tmp/err" ] && bad "--quiet env demos wrote to stderr: $(cat "$tmp/err")"
cmp -s "$tmp/d.jsonl" "$tmp/d2.jsonl" || bad "--quiet env demos wrote other demonstrations"
"$BIN" env serve echo --port 0 --connection-timeout-s 0 > /dev/null 2>&1; [ $? = 2 ] ||
    bad "--connection-timeout-s 0 should exit 2"

# usage errors (2) and an unreachable server (1)
"$BIN" env check > /dev/null 2>&1; [ $? = 2 ] || bad "env check without URL should exit 2"
"$BIN" env check http://127.0.0.1:9 --script /nonexistent.json > /dev/null 2>&1; [ $? = 2 ] || bad "missing script should exit 2"
echo '{"task": {}}' > "$tmp/bad.json"
"$BIN" env check builtin:echo --script "$tmp/bad.json" > /dev/null 2>&1; [ $? = 2 ] || bad "invalid script should exit 2"
"$BIN" env check http://127.0.0.1:9 > /dev/null 2>&1; [ $? = 1 ] || bad "unreachable server should exit 1"
"$BIN" env serve no-such-env --port 0 > /dev/null 2>&1; [ $? = 2 ] || bad "unknown environment should exit 2"

[ $fail = 0 ] && echo "serve_check: all passed"
exit $fail
