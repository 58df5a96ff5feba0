# tests/replay/expect.sh: the checks the replay CLI test scripts share (bash; source it).
# fail MSG: count a failure (the script reports $fails at its end); expect RC CMD...: run CMD,
# keep its stdout and stderr in $out, and fail unless it exited RC; has TEXT: fail unless $out
# holds TEXT.  Messages show at most 600 bytes of the command line's start and of the output.
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
expect() {
    local want=$1
    shift
    out=$("$@" 2>&1)
    local rc=$?
    [ "$rc" = "$want" ] || fail "'${*:0:6}' exited $rc, expected $want: ${out:0:600}"
}
has() { grep -q -- "$1" <<<"$out" || fail "output lacks '$1': ${out:0:600}"; }
