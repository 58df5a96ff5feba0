# tests/envs_builtin/failalloc_sweep.sh: sourced by host_open_failalloc.sh and
# inproc_failalloc.sh.  failalloc_sweep PROGRAM STRIDE ENV runs `PROGRAM ENV` once plainly (its
# output the baseline), counts its allocations, then runs it with allocation N failing
# (tests/core/failalloc_preload.c) for N = 1, 1 + STRIDE, ... up to the count.  Each run must
# print the baseline (exit 0: the code got round the failure) or end in a clean error that
# names out of memory (exit 1); anything else (another exit status, a signal, a hang of 20 s,
# exit 0 with other output) is counted in $fails with a FAIL line.  Needs $SHIM and $T.
failalloc_sweep() {
    local prog=$1 stride=$2 env=$3
    "$prog" "$env" >"$T/base" 2>"$T/err" || { echo "FAIL: $env: exit $?: $(cat "$T/err")"; exit 1; }
    rm -f "$T/rep"
    env LD_PRELOAD="$SHIM" ARL_TEST_FAIL_ALLOC=0 ARL_TEST_FAIL_ALLOC_REPORT="$T/rep" "$prog" "$env" >/dev/null
    local count
    count=$(sed -n 's/^calls //p' "$T/rep")
    [ -n "$count" ] && [ "$count" -gt 0 ] || { echo "FAIL: $env: no allocation counted"; exit 1; }
    local clean=0 same=0 n rc
    for n in $(seq 1 "$stride" "$count"); do
        timeout 20 env LD_PRELOAD="$SHIM" ARL_TEST_FAIL_ALLOC="$n" "$prog" "$env" >"$T/out" 2>"$T/err"
        rc=$?
        if [ "$rc" = 0 ] && cmp -s "$T/out" "$T/base"; then
            same=$((same + 1))
        elif [ "$rc" = 1 ] && grep -q 'out of memory' "$T/err"; then
            clean=$((clean + 1))
        else
            echo "FAIL: $env: allocation $n: exit $rc: $(grep -v '^failalloc' "$T/err" | head -c 300) $(diff "$T/base" "$T/out" | head -3 | tr '\n' ' ' | head -c 300)"
            fails=$((fails + 1))
        fi
    done
    echo "$env: $((clean + same)) of $count allocations failed in turn: $clean clean errors," \
        "$same runs got round it"
}
