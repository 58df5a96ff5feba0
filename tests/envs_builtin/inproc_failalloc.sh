#!/bin/bash
# Out of memory during an episode of a built-in environment through the client's in-process
# transport: envs_inproc_calls NAME (create, the teacher's steps, a segment score, a fork and its
# step, the episode's score, DELETE) runs with allocation N failing (tests/core/failalloc_preload.c),
# every third N for calculator, every eleventh for the others (about 50 s; ARL_TEST_STRIDE=1 for
# every N, about 55 s for calculator alone).
# The host answers in the same process, so a failed allocation in it, or in the client's parser
# of its answer, is this process's out of memory: the run must end in a clean error naming out of
# memory (exit 1), or print the calls of a run without a failure; never an environment error
# (exit 3: the host's "500 ENV_INTERNAL: out of memory", a 400 for a request it could not read,
# or MALFORMED_RESPONSE for an answer the client could not hold, which the rollout took for the
# environment's fault and masked the trajectory with), a signal, a hang or other output.
set -u
B=${ARL_BUILD_DIR:?ARL_BUILD_DIR must name the build folder}
SHIM=$B/tests/core/libarl_test_failalloc_preload.so
P=$B/tests/envs_builtin/envs_inproc_calls
[ -f "$SHIM" ] || { echo "FAIL: no $SHIM"; exit 1; }
[ -x "$P" ] || { echo "FAIL: no $P"; exit 1; }
T=$(mktemp -d /tmp/arl-test-inproc-failalloc-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
. "$(dirname "$0")/failalloc_sweep.sh"
for env in ${ARL_TEST_ENVS:-calculator needle kvstore shapes}; do
    stride=${ARL_TEST_STRIDE:-11}
    [ "$env" = calculator ] && stride=${ARL_TEST_STRIDE:-3}
    failalloc_sweep "$P" "$stride" "$env"
done
[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "OK"
