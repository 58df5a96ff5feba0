# tests/core/failalloc_run.sh: sourced by failalloc.sh and failalloc_config.sh (which set $T and
# $SHIM first): fail() counts a failure in $fails; run N CMD... runs the command with allocation
# N failing (tests/core/failalloc_preload.c; 0: none), its output in $T/out and $T/err, its
# allocation count or failed call in $T/rep; it sets rc, and msg (the last line of standard
# error, the shim's lines left out); then POSTRUN, when set, runs without the shim (a command
# that may amend $T/out, e.g. with the hashes of the files the command wrote, and clears them
# away for the next run).
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

run() {
    local n=$1
    shift
    rm -f "$T/rep"
    # (the shim on the command only: timeout and env run without it)
    timeout 20 env LD_PRELOAD="$SHIM" ARL_TEST_FAIL_ALLOC="$n" ARL_TEST_FAIL_ALLOC_REPORT="$T/rep" \
        ARL_TEST_FAIL_ALLOC_TRACE=1 "$@" >"$T/out" 2>"$T/err"
    rc=$?
    msg=$(grep -v -e '^failalloc: ' -e '\[0x[0-9a-f]*\]$' "$T/err" | tail -1)
    [ -z "${POSTRUN:-}" ] || $POSTRUN
}
