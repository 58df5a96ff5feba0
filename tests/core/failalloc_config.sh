#!/bin/bash
# Out of memory while a command reads its configuration is the process's failure (exit 1, "out
# of memory"), never the input's (exit 2 with the usage line): core/options.c
# arl_options_parse_json_text turned every failed parse of an experiment file into "invalid
# JSON: out of memory" and exit 2, cli/cmd_rollout.c printed its usage line for a failed copy of
# an option and read no experiment at all when the copy of its name failed ("missing required
# option '--env ENV'"), env demos --options said "expected a JSON object".  Each command runs
# with allocation N failing (tests/core/libarl_test_failalloc_preload.so) for every N up to its
# count (env demos: its first 40, then a stride; about 235 runs, 5 s).  Each run must end as the
# run without a failure ends (the same exit status, message and output: the rollouts stop at a
# missing checkpoint) or as a clean error of the process: exit 1 exactly and "out of memory" (or
# strerror(ENOMEM)) on standard error; never a signal or another message.  jansson#362 (a crash
# when its lexer's buffer cannot grow, inside json_load*) is counted apart, as in failalloc.sh;
# its false syntax errors are not (arl_json_load* says out of memory for them).
set -u
A=${ARL_BIN:?ARL_BIN must name build/agentrl}
B=${ARL_BUILD_DIR:?}
SHIM=$B/tests/core/libarl_test_failalloc_preload.so
[ -f "$SHIM" ] || { echo "FAIL: no $SHIM"; exit 1; }
T=$(mktemp -d /tmp/arl-test-failalloc-config-XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/failalloc_run.sh"

# sweep NAME K S CMD...: allocation N of the command failing, for N = 1..K, then every Sth
sweep() {
    local name=$1 k=$2 stride=$3
    shift 3
    run 0 "$@"
    local rc0=$rc msg0=$msg count
    cp "$T/out" "$T/base"
    count=$(sed -n 's/^calls //p' "$T/rep")
    [ -n "$count" ] && [ "$count" -gt 0 ] || { fail "$name: no allocation counted"; return; }
    local same=0 clean=0 jansson=0 tested=0
    [ "$k" -le "$count" ] || k=$count
    for n in $(seq 1 "$k") $(seq $((k + 1)) "$stride" "$count"); do
        run "$n" "$@"
        grep -q "^fail $n\$" "$T/rep" 2>/dev/null || continue
        tested=$((tested + 1))
        if [ "$rc" = "$rc0" ] && [ "$msg" = "$msg0" ] && cmp -s "$T/out" "$T/base"; then
            same=$((same + 1))
        elif [ "$rc" = 1 ] &&
            grep -q -i -e 'out of memory' -e 'cannot allocate memory' <<<"$msg"; then
            clean=$((clean + 1))
        elif [ "$rc" -ge 128 ] && [ "$rc" != 124 ] && grep -q '(json_load' "$T/err"; then
            jansson=$((jansson + 1)) # (arl_json_load* says out of memory for the rest)
        else
            fail "$name: allocation $n: exit $rc: $msg (without a failure: exit $rc0: $msg0)"
        fi
    done
    echo "$name: $tested failures injected (of $count allocations): $clean clean errors," \
        "$same runs as without one," \
        "$jansson crashes in jansson's parser (jansson#362)"
    [ "$tested" -gt 0 ] || fail "$name: no allocation failed (is the shim loaded?)"
}

cd "$T" || exit 1
# an experiment with a rollout section (object-valued keys: rollout/config.c flattens them and
# checks each), then a checkpoint that is not there: exit 1 naming --ckpt
printf '%s\n' '{"rollout": {"env": "builtin:calculator", "env-options": {"level": 2},' \
    '"task-data": {"a": [1, 2]}, "temperature": 0.7, "run-uid": "r1"}}' >exp.json
sweep "rollout EXPERIMENT.json" 1000 1 "$A" rollout exp.json --ckpt "$T/none" --out "$T/store"
sweep "rollout keys as options" 1000 1 "$A" rollout --env builtin:calculator \
    --env-options '{"level": 2}' \
    --task-data '{"a": 1}' --ckpt "$T/none" --out "$T/store"
# env demos --options (envs/builtin/teacher.c, read before the episode, within its first 20
# allocations): one episode, its first 40 allocations, then a stride
sweep "env demos --options" 40 101 "$A" env demos calculator --episodes 1 --options '{"level": 2}'

[ "$fails" = 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "OK"
