# tests/wait_for.sh: sourced by script tests that wait for another process to reach a point.
# wait_for CMD...: run CMD every 50 ms until it succeeds; status 1 after 30 s without success.
wait_for() {
    _wf=0
    until "$@"; do
        [ $_wf -lt 600 ] || return 1
        sleep 0.05
        _wf=$((_wf + 1))
    done
}
