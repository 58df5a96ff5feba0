# tests/serve_url.sh: sourced by the script tests that start a server which prints its URL
# (`agentrl env serve --port 0`, the Python example server).
# serve_url FILE PID: prints the first http://127.0.0.1:PORT the server wrote into FILE; waits
# 10 s at most and not past the end of process PID; status 1 (nothing printed) when none came.
serve_url() {
    for _ in $(seq 200); do
        u=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$1" 2>/dev/null | head -n 1)
        [ -n "$u" ] && { echo "$u"; return 0; }
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
