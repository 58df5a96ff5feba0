#!/bin/bash
# Out of memory while the in-process AEP/1 host of each built-in environment opens
# (arl_env_host_open: its /info is built with jansson, parsed back and checked): envs_host_open
# NAME runs with allocation N failing (tests/core/failalloc_preload.c): every N of its run for
# calculator, every ninth for the others.  About 7 s.
# Each run must end in a clean error naming out of memory (exit 1) or print the /info of a run
# without a failure; never a signal, a hang, exit 0 with another /info, or an error that is
# not about memory: the host said "env host: environment 'calculator': t offset 300" (its
# message formatted into itself) or "/info: " with nothing after it, and a key jansson's
# builders left out quietly made an /info that failed its own check, a configuration error.
set -u
B=${ARL_BUILD_DIR:?ARL_BUILD_DIR must name the build folder}
SHIM=$B/tests/core/libarl_test_failalloc_preload.so
H=$B/tests/envs_builtin/envs_host_open
[ -f "$SHIM" ] || { echo "FAIL: no $SHIM"; exit 1; }
[ -x "$H" ] || { echo "FAIL: no $H"; exit 1; }
T=$(mktemp -d /tmp/arl-test-host-open-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
. "$(dirname "$0")/failalloc_sweep.sh"
for env in calculator needle kvstore shapes; do
    stride=9
    [ "$env" = calculator ] && stride=1
    failalloc_sweep "$H" "$stride" "$env"
done
[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "OK"
