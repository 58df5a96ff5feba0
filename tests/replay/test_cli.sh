#!/bin/bash
# The `agentrl replay` commands over a store built by replay_mkstore (spec/replay.md section 13):
# list with filters, show, export/import round trip (byte for byte), stats, verify (exit 2 and
# every finding on damage), recover of a dead writer's trajectories, and usage errors.
set -u
A=${ARL_BIN:?ARL_BIN must name build/agentrl}
MK=${ARL_BUILD_DIR:?}/tests/replay/replay_mkstore
T=$(mktemp -d /tmp/arl-test-cli-XXXXXX)
S=$T/store
. "$(dirname "$0")/expect.sh" # fail, expect, has; $fails
lines() { [ "$(grep -c . <<<"$out")" = "$1" ] || fail "expected $1 lines, got: $out"; }

"$MK" "$S" >/dev/null || { echo "FAIL: replay_mkstore"; exit 1; }

# list and its filters
expect 0 "$A" replay list "$S"
lines 8
has "run1/g1/r2 .*masked .*SANDBOX_LOST"
has "run1/g1/r0#fork1 .*complete"
expect 0 "$A" replay list "$S" --status masked
lines 2
expect 0 "$A" replay list "$S" --json --min-reward 0.5
lines 2
has '"traj_uid":"run1/g1/r0","traj_id":1099511627776,"status":"complete"'
# section 13.1: --min-reward X selects what --where outcome.derived>=X does (the copied column
# trajectories.outcome_reward against the rewards rows)
for x in -1 0 0.25 0.5 1 2; do
    a=$("$A" replay list "$S" --min-reward "$x" --sort uid 2>&1)
    b=$("$A" replay list "$S" --where "outcome.derived>=$x" --sort uid 2>&1)
    [ "$a" = "$b" ] || fail "--min-reward $x and --where outcome.derived>=$x differ: $a // $b"
done
expect 0 "$A" replay list "$S" --where 'outcome.answer_correct<1' --json
lines 3
expect 0 "$A" replay list "$S" --run run1 --status complete --limit 2 --json
lines 2
expect 0 "$A" replay list "$S" --env calc --version-range 3:3
has "run1/g2/r0"
expect 0 "$A" replay list "$S" --forks-of run1/g1/r0
lines 2
expect 0 "$A" replay list "$S" --run nosuchrun
lines 1
expect 2 "$A" replay list "$S" --bogus
has "unknown option"
expect 2 "$A" replay list "$S" --where 'outcome.x<<1'
has "LEVEL.NAME OP NUMBER"
expect 1 "$A" replay list /nonexistent/store
has "no such store"

# show
expect 0 "$A" replay show "$S" run1/g1/r2
has "status masked  end_cause error  error SANDBOX_LOST (infra)"
has "\[image 4x3 sha256:"
has "tool call call_1_0 add({\"a\":2,\"b\":1}) ok"
has "== segment 1  continue -> partial"
has "response prefix: <html>502 Bad Gateway</html>"
has "detail: {\"violation\":\"backend lost\"}"
expect 0 "$A" replay show "$S" 1099511627776 --tokens
has "routes (experts per MoE layer)"
has "outcome: reward=1 derived=1 answer_correct=1"
expect 0 "$A" replay show "$S" 'run1/g1/r0#fork1' --raw
has "fork of run1/g1/r0 after segment 1"
has "request: {\"step_index\":7"
expect 1 "$A" replay show "$S" nope
has "no trajectory 'nope'"
expect 0 "$A" replay show "$S" run1/g1/r0 --group
has "== group run1/g000001"
has "run1/g1/r2 .*masked .*SANDBOX_LOST"
has "run1/g1/r0 .*<-"
expect 0 "$A" replay show "$S" run1/g1/r0 --tokens --rescore nope
has "no re-score 'nope' of this segment"
has "rescored"
all_rows=$(grep -c "^ *[0-9][0-9]* *[0-9][0-9]* *[01] " <<<"$out")
expect 0 "$A" replay show "$S" run1/g1/r0 --tokens --turns 1:1
turn_rows=$(grep -c "^ *[0-9][0-9]* *[0-9][0-9]* *[01] " <<<"$out")
[ "$turn_rows" -gt 0 ] && [ "$turn_rows" -lt "$all_rows" ] ||
    fail "--turns 1:1 printed $turn_rows token rows of $all_rows"
expect 2 "$A" replay show "$S" run1/g1/r0 --tokens --turns 3:2
has "expected A:B"
for t in +1:2 " 1:2" 1:x 1 0:2 1:99999999999; do # one parser with the view (replay_show_turns_parse)
    expect 2 "$A" replay show "$S" run1/g1/r0 --tokens --turns "$t"
    has "expected A:B"
done

# stats
expect 0 "$A" replay stats "$S"
has "status: complete 4, masked 1, running 2"
has "error codes: SANDBOX_LOST 1"
has "boundary causes: end 4, partial 1, token_budget 6"
has "outcome answer_correct"
expect 0 "$A" replay stats "$S" --json --status complete
has '"trajectories":4'

# export --full, import into another store, export again: the same bytes
expect 0 "$A" replay export "$S" --full --output "$T/a.jsonl"
expect 0 "$A" replay import "$T/copy" "$T/a.jsonl"
has "imported 7 trajectories"
"$A" replay export "$T/copy" --full >"$T/b.jsonl" || fail "export of the copy"
cmp -s "$T/a.jsonl" "$T/b.jsonl" || fail "export --full / import / export --full differs"
expect 0 "$A" replay verify "$T/copy"
has "0 errors"
# export --output is written whole or not at all: a failed export leaves an existing file as it
# was and nothing beside it
echo precious >"$T/keep.jsonl"
expect 2 "$A" replay export "$S" --where 'outcome.x<<1' --output "$T/keep.jsonl"
has "LEVEL.NAME OP NUMBER"
expect 1 "$A" replay export /nonexistent/store --output "$T/keep.jsonl"
[ "$(cat "$T/keep.jsonl")" = precious ] || fail "a failed export replaced its --output file"
expect 2 "$A" replay export "$S" --output "$T"
has "agentrl: error: --output $T: is a directory"
expect 1 "$A" replay export "$S" --output "$T/nodir/x.jsonl"
has "agentrl: error: --output $T/nodir/x.jsonl: cannot create a file beside it"
ls "$T" | grep -q "\.tmp-" && fail "export left a temporary file: $(ls "$T")"
expect 0 "$A" replay export "$S" --full --output "$T/keep.jsonl"
has "exported 7 trajectories to $T/keep.jsonl"
cmp -s "$T/a.jsonl" "$T/keep.jsonl" || fail "export --output over an existing file differs"
# under --quiet the summaries are left out (warnings and errors stay)
expect 0 "$A" --quiet replay export "$S" --full --output "$T/keep.jsonl"
[ -z "$out" ] || fail "--quiet export printed: $out"
expect 0 "$A" --quiet replay import "$T/copy" "$T/a.jsonl"
[ -z "$out" ] || fail "--quiet import printed: $out"
# the same lines again (an import that stopped, run again): every trajectory is there already,
# the same, so skipped; one whose stored trajectory differs from the line is an error
expect 0 "$A" replay import "$T/copy" "$T/a.jsonl"
has "imported 0 trajectories into $T/copy (7 already there, the same: skipped)"
head -2 "$T/a.jsonl" | tail -1 | sed 's|"n_turns":|"n_turns":1|' >"$T/changed.jsonl"
expect 1 "$A" replay import "$T/copy" "$T/a.jsonl" "$T/changed.jsonl"
has "changed.jsonl:1: trajectory run1/g1/r1 already exists in this store with other content"
has "imported 0 trajectories into $T/copy (7 already there, the same: skipped)"
# a new trajectory in a group this store has, but of another task or size: refused, nothing
# imported (a group's members are samples of one task; it joined the group before)
head -1 "$T/a.jsonl" | sed 's|"run1/g1/r0"|"run1/g1/r9"|g; s|"seed":7|"seed":8|g' >"$T/other.jsonl"
expect 1 "$A" replay import "$T/copy" "$T/other.jsonl"
has "other.jsonl:1: this store's group run1/g000001 is a 'train' group of 3 samples of task t1 (seed 7); the imported trajectory's group of that name differs in its task"
head -1 "$T/a.jsonl" | sed 's|"run1/g1/r0"|"run1/g1/r9"|g; s|"size":3|"size":4|' >"$T/other.jsonl"
expect 1 "$A" replay import "$T/copy" "$T/other.jsonl"
has "differs in its size"
expect 0 "$A" replay verify "$T/copy"
has "7 trajectories: 0 errors"
"$A" replay export "$S" --status complete >"$T/plain.jsonl"
expect 1 "$A" replay import "$T/copy2" "$T/plain.jsonl"
has "plain.jsonl:1: no \"rows\" member"
expect 0 "$A" replay export "$S" --status masked
has '"error":{"code":"SANDBOX_LOST","attribution":"infra","detail":{"violation":"backend lost"}}'
has '"role":"assistant","step":1,"segment":0,"content":"Let me add.","reasoning":"2+2","tool_calls":\[{"id":"call_1_0","type":"function","function":{"name":"add","arguments":"{\\"a\\":2,\\"b\\":1}"}}\]'

# verify: clean store (an orphan state is a warning), then a damaged blob
expect 0 "$A" replay verify "$S"
has "0 errors"
has "warning: shards/w1.states.sqlite: state 3"
cp -r "$S" "$T/damaged"
if command -v sqlite3 >/dev/null; then
    sqlite3 "$T/damaged/shards/w1.sqlite" \
        "UPDATE segments SET versions = zeroblob(length(versions)) WHERE seg_index = 2 AND traj_id = 1099511627776;" ||
        fail "damaging a blob"
    expect 2 "$A" replay verify "$T/damaged"
    has "error: shards/w1.sqlite: trajectory run1/g1/r0 segment 2 column versions: bad blob magic"
    has "1 errors"
    # --repair: the damaged trajectory is masked STORE_CORRUPT (the bytes stay), the orphan
    # state deleted; a second verify still reports the damage, now on a masked trajectory
    expect 2 "$A" replay verify "$T/damaged" --repair
    has "repair: shards/w1.sqlite: trajectory run1/g1/r0 masked STORE_CORRUPT"
    has "repair: 1 trajectories masked STORE_CORRUPT, 1 orphan states deleted"
    expect 0 "$A" replay list "$T/damaged" --error-code STORE_CORRUPT
    has "run1/g1/r0 "
    expect 2 "$A" replay verify "$T/damaged" --repair
    has "repair: 0 trajectories masked STORE_CORRUPT, 0 orphan states deleted"
fi

# a group whose members are of another task, or past its size (what a second rollout with the
# same run uid and other tasks or group size wrote before rollout refused it): errors
if command -v sqlite3 >/dev/null; then
    rm -rf "$T/mixed"
    cp -r "$S" "$T/mixed"
    sqlite3 "$T/mixed/catalog.sqlite" "INSERT INTO tasks(task_uid, env_name, seed, data_json, \
        data_sha256) VALUES ('t9', 'calc', 9, '{}', 'x'); UPDATE task_groups SET size = 2, \
        task_id = (SELECT max(task_id) FROM tasks) WHERE group_uid = 'run1/g000001'" ||
        fail "mixing a group"
    expect 2 "$A" replay verify "$T/mixed"
    has "error: shards/w1.sqlite: trajectory run1/g1/r1 is of task id 1 but its group run1/g000001 is of task id 2 (a group's members are samples of one task)"
    has "error: shards/w1.sqlite: trajectory run1/g1/r2 holds slot 2 of group run1/g000001 of 2 samples"
    has " 4 errors"
fi

# a registered shard whose file is missing, or empty (no schema), while the catalog's
# group_members refer to its trajectories: their data is lost, an error; list and stats say on
# stderr that they leave it out.  A registered shard nothing refers to (a writer that died while
# creating it) stays a warning.
for how in missing empty; do
    rm -rf "$T/lost"
    cp -r "$S" "$T/lost"
    rm -f "$T/lost"/shards/w1.sqlite*
    [ "$how" = empty ] && : >"$T/lost/shards/w1.sqlite"
    what="its file is missing"
    [ "$how" = empty ] && what="its file is empty, without a schema"
    expect 2 "$A" replay verify "$T/lost"
    has "error: shards/w1.sqlite: shard 1 is registered in the catalog but $what, and the catalog's group_members refer to [1-9][0-9]* trajectories in it (e.g. run1/"
    what="is registered in the catalog but its file is missing"
    [ "$how" = empty ] && what="is empty, without a schema"
    for cmd in list stats; do
        expect 0 "$A" replay "$cmd" "$T/lost"
        has "warning: shards/w1.sqlite $what: the [1-9][0-9]* trajectories the catalog has in it"
    done
done
if command -v sqlite3 >/dev/null; then
    rm -rf "$T/lost"
    cp -r "$S" "$T/lost"
    sqlite3 "$T/lost/catalog.sqlite" "INSERT INTO shards(shard_id, kind, file_name, host, \
        created_at_ms) VALUES (99, 'worker', 'shards/w99.sqlite', 'h', 0)" || fail "registering"
    expect 0 "$A" replay verify "$T/lost"
    has "warning: shards/w99.sqlite: shard 99 is registered in the catalog but its file is missing, and nothing refers to it"
    expect 0 "$A" replay list "$T/lost"
    has "warning: shards/w99.sqlite is registered in the catalog but its file is missing; run"
fi

# recover: the dead child's two trajectories, one masked, one left resumable; then --mask
expect 0 "$A" replay recover "$S"
has "interrupted run1/g3/r1 (0 committed segments, 0 tokens): masked INTERRUPTED"
has "interrupted run1/g3/r0 (1 committed segments, 64 tokens): resumable"
expect 0 "$A" replay list "$S" --status running
lines 2
expect 0 "$A" replay recover "$S" --mask
has "run1/g3/r0 .*masked INTERRUPTED"
expect 0 "$A" replay list "$S" --status running
lines 1
expect 0 "$A" replay list "$S" --error-code INTERRUPTED
lines 3
expect 0 "$A" replay verify "$S"
has "0 errors"

# pins, the pinned and sorted list, gc (spec section 13.8)
expect 0 "$A" replay pin "$S" run1/g1/r0 --reason "debug"
has "pinned run1/g1/r0"
expect 1 "$A" replay pin "$S" nope
has "no trajectory 'nope'"
expect 0 "$A" replay list "$S" --pinned
lines 2
has "run1/g1/r0 "
# the reason is shown by show (header) and list --json
expect 0 "$A" replay show "$S" run1/g1/r0
has "^  status .*  pinned 20[0-9-]*T[0-9:]*Z (debug)$"
expect 0 "$A" replay list "$S" --json --pinned
has '"time_ms":[0-9]*,"pinned":true,"pin_reason":"debug"}'
expect 0 "$A" replay list "$S" --json --status masked
has '"pinned":false,"pin_reason":null}'
expect 0 "$A" replay list "$S" --sort uid --json
head -1 <<<"$out" | grep -q '"traj_uid":"run1/g1/r0"' || fail "--sort uid: $out"
expect 0 "$A" replay list "$S" --sort reward --json --status complete --limit 1
has '"outcome":1'
expect 2 "$A" replay list "$S" --sort sideways
has "sort"
expect 0 "$A" replay gc "$S" --min-age-ms 0
has "gc $S: 1 states deleted"
has "; 3 files collected, 0 skipped (writer alive)$" # the skipped ones were not counted
# a shard file (or a folder of them) instead of the store root is named as such (was "needs a
# store root with a writable catalog", migrate adding "(opening it migrated the catalog)")
for c in gc seal migrate; do
    expect 1 "$A" replay $c "$S/shards/w1.sqlite"
    has "replay: $S/shards/w1.sqlite is a shard file, not a store root: $c works on a store root"
    expect 1 "$A" replay $c "$S/shards"
    has "$S/shards has no catalog.sqlite: $c works on a store root"
done
expect 0 "$A" replay verify "$S"
has "0 errors, 0 warnings"
expect 0 "$A" replay unpin "$S" run1/g1/r0
expect 1 "$A" replay unpin "$S" run1/g1/r0
has "is not pinned"
expect 0 "$A" replay list "$S" --pinned
lines 1
expect 2 "$A" replay gc "$S" --rollout sometimes
expect 2 "$A" replay gc "$S" --learner sometimes
has "learner"
expect 0 "$A" replay gc --help
has "usage: agentrl replay gc DB"
has "state_cache.learner"

# seal: finished files become immutable; they are still read, and writers refuse them
expect 0 "$A" replay seal "$S"
has "shards/w1.sqlite: sealed"
expect 0 "$A" replay seal "$S" --shard 1
has "shards/w1.sqlite: already sealed"
expect 1 "$A" replay seal "$S" --shard 999
has "no shard 999"
expect 0 "$A" replay verify "$S"
has "0 errors"
expect 0 "$A" replay list "$S" --status complete
lines 5
expect 0 "$A" replay recover "$S"
expect 0 "$A" replay migrate "$S"
has "shards/w1.sqlite: schema version 1, up to date"
has "migrated 0 files"

# seal and gc go on past a file they cannot handle (and exit 1 naming it); pin reasons are one
# line of UTF-8 text (exit 2); gc collects the states of sealed shards without writing them
"$MK" "$T/adm" >/dev/null || fail "replay_mkstore adm"
expect 1 "$A" replay seal "$T/adm"
has "shards/w2.sqlite: not sealed: .*still running"
has "shards/t3.sqlite: sealed"
expect 2 "$A" replay pin "$T/adm" run1/g1/r0 --reason $'bad \xff utf-8'
has "not valid UTF-8"
expect 2 "$A" replay pin "$T/adm" run1/g1/r0 --reason $'two\nlines'
has "control character"
expect 2 "$A" replay pin "$T/adm" run1/g1/r0 --reason "$(head -c 1001 /dev/zero | tr '\0' x)"
has "more than 1000"
expect 0 "$A" replay pin "$T/adm" run1/g1/r0 --reason "$(head -c 1000 /dev/zero | tr '\0' x)"
w1sum=$(cksum <"$T/adm/shards/w1.sqlite")
printf 'not a database at all, not at all, not at all, not at all, not at all...' >"$T/adm/shards/w2.states.sqlite"
expect 1 "$A" replay gc "$T/adm" --min-age-ms 0 --rollout off
has "shards/w1.sqlite: 1 states deleted, 0 evicted"
has "failed: .*w2.states.sqlite"
has "shards/t3.sqlite: "
[ "$(cksum <"$T/adm/shards/w1.sqlite")" = "$w1sum" ] || fail "gc wrote the sealed shards/w1.sqlite"

# seal and migrate count the files they skip (a live writer: replay_mkstore --hold) and the
# registered shards whose file is missing, as gc does (they counted only what they did)
"$MK" "$T/skip" >/dev/null || fail "replay_mkstore skip"
expect 0 "$A" replay recover "$T/skip" --mask
"$MK" --hold "$T/skip" 0 </dev/null >"$T/hold.out" 2>&1 || fail "replay_mkstore --hold 0: $(cat "$T/hold.out")"
new=$(sed -n 's/^holding //p' "$T/hold.out") # registered, nothing in it: then deleted
[ -n "$new" ] && rm -f "$T/skip/${new%.sqlite}".* "$T/skip/$new"-*
mkfifo "$T/hold.in"
"$MK" --hold "$T/skip" 1 <"$T/hold.in" >"$T/hold.out" 2>&1 &
hpid=$!
exec 7>"$T/hold.in"
for _ in $(seq 1 100); do
    grep -q '^holding' "$T/hold.out" && break
    sleep 0.1
done
expect 0 "$A" replay seal "$T/skip" --shard 2
has "^sealed 1 file of $T/skip, 0 skipped (in use)$"
expect 0 "$A" replay seal "$T/skip"
has "shards/w1.sqlite: skipped (writer alive, pid $hpid)"
has "^sealed 1 file of $T/skip, 1 skipped (in use), 1 missing$"
expect 0 "$A" replay migrate "$T/skip"
has "^migrated 0 files of $T/skip, 0 skipped (in use), 1 missing$"
expect 0 "$A" replay gc "$T/skip" --min-age-ms 0
has "; 2 files collected, 1 skipped (writer alive), 1 missing$"
exec 7>&-
wait $hpid || fail "replay_mkstore --hold 1: $(cat "$T/hold.out")"
expect 0 "$A" replay seal "$T/skip"
has "^sealed 1 file of $T/skip, 0 skipped (in use), 1 missing$"

# view: read-only HTML pages on loopback (an ephemeral port; stopped by SIGTERM)
# view_start DB ARGS...: start `replay view` in the background; sets vpid, port and U
view_start() {
    local db=$1
    shift
    timeout 120 "$A" replay view "$db" --port 0 "$@" >"$T/view.out" 2>&1 &
    vpid=$!
    port=""
    for _ in $(seq 1 100); do
        port=$(grep -o '[0-9.]*:[0-9]*/ (Ctrl-C' "$T/view.out" 2>/dev/null | cut -d: -f2 | cut -d/ -f1)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || fail "replay view did not start: $(cat "$T/view.out")"
    U=http://127.0.0.1:$port
}
code() { curl -s -o /dev/null -w "%{http_code}" "$@"; }
# raw REQUEST: send bytes to the server, print its status line
raw() {
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf '%b' "$1" >&3
    head -n 1 <&3 | tr -d '\r'
    exec 3>&-
}
if command -v curl >/dev/null; then
    view_start "$S"
    out=$(curl -s "$U/")
    has '<a href="/show?traj=run1/g1/r0">run1/g1/r0</a>'
    has '<a href="/show?traj=run1/g1/r0%23fork1">run1/g1/r0#fork1</a>'
    out=$(curl -s "$U/show?traj=run1/g1/r2")
    has "error SANDBOX_LOST (infra)"
    has "&lt;html&gt;502 Bad Gateway&lt;/html&gt;"
    out=$(curl -s "$U/stats")
    has "status: complete 4"
    [ "$(code "$U/show?traj=nope")" = 404 ] || fail "view of an unknown trajectory"
    [ "$(code "$U/nope")" = 404 ] || fail "view of an unknown page"
    out=$(curl -s "$U/?limit=1")
    [ "$(echo "$out" | grep -c '<tr><td>')" -eq 1 ] || fail "view ?limit=1: $out"
    [ "$(code "$U/?limit=abc")" = 400 ] || fail "view ?limit=abc (was taken as 'no limit')"
    # DNS rebinding: a Host that is not this server's is refused; localhost and IP forms (any
    # port: ssh tunnels) are served; HTTP/1.1 needs a Host, HTTP/1.0 may go without
    out=$(curl -s -w "%{http_code}" -H "Host: rebind.example:$port" "$U/")
    has "403$"
    has "Host &#39;rebind.example:$port&#39; does not name this server"
    for h in "localhost:$port" "LOCALHOST" "127.0.0.1:9000" "[::1]:$port"; do
        [ "$(code -H "Host: $h" "$U/")" = 200 ] || fail "view with Host: $h"
    done
    for h in "10.1.2.3:$port" "localhost.rebind.example" "127.0.0.1.nip.io:$port" "localhost:x"; do
        [ "$(code -H "Host: $h" "$U/")" = 403 ] || fail "view with Host: $h was served"
    done
    out=$(raw 'GET / HTTP/1.1\r\nConnection: close\r\n\r\n')
    has "HTTP/1.1 400"
    out=$(raw 'GET / HTTP/1.0\r\n\r\n')
    has "HTTP/1.1 200"
    # methods: HEAD as GET without the body; the others 405 with Allow
    out=$(curl -s -I "$U/")
    has "HTTP/1.1 200"
    has "Content-Type: text/html; charset=utf-8"
    # headers of a local viewer: no scripts, frames, referrers, sniffing or caching
    has "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'"
    has "frame-ancestors 'none'"
    has "X-Content-Type-Options: nosniff"
    has "Referrer-Policy: no-referrer"
    has "Cache-Control: no-store"
    out=$(curl -s -i -X POST "$U/")
    has "HTTP/1.1 405"
    has "Allow: GET, HEAD"
    out=$(curl -s -i -X DELETE "$U/show?traj=run1/g1/r0")
    has "HTTP/1.1 405"
    # parameters: unknown, repeated or malformed ones are 400 naming the parameter
    out=$(curl -s -w "%{http_code}" "$U/?bogus=1")
    has "400$"
    has "parameter &#39;bogus&#39; is not a parameter of this page"
    out=$(curl -s -w "%{http_code}" "$U/?limit=1&limit=5")
    has "400$"
    has "parameter &#39;limit&#39; is given twice"
    for q in "/?limit=0" "/?limit=-3" "/?limit=99999999999999999999" "/?offset=-1" \
        "/show?traj=run1/g1/r0&tokens=yes" "/show?traj=run1/g1/r0&turns=2:1" \
        "/show?traj=run1/g1/r0&turns=-1:" "/show" "/show?traj=" "/stats?traj=x"; do
        [ "$(code "$U$q")" = 400 ] || fail "view $q: HTTP $(code "$U$q"), expected 400"
    done
    [ "$(code "$U/show?traj=run1/g1/r0&turns=1:1")" = 200 ] || fail "view turns=1:1"
    # what comes back from the query is escaped and valid UTF-8 (bad bytes become U+FFFD)
    out=$(curl -s "$U/show?traj=%FF%FE%3Cb%3E%22%01")
    has "no trajectory &#39;"$'\xef\xbf\xbd\xef\xbf\xbd'"&lt;b&gt;&quot;"$'\xef\xbf\xbd'"&#39;"
    if command -v iconv >/dev/null; then
        curl -s "$U/show?traj=%FF%C3%28" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1 ||
            fail "view echoed invalid UTF-8 into a utf-8 page"
    fi
    out=$(curl -s "$U/?run=%22%3Cx%27")
    has "no trajectories run=&quot;&lt;x&#39;"
    # paging: the filters travel in the links, encoded
    out=$(curl -s "$U/?status=complete&limit=3")
    has "trajectories 1 to 3 status=complete"
    has '<a href="/?status=complete&amp;limit=3&amp;offset=3">next</a>'
    out=$(curl -s "$U/?status=complete&limit=3&offset=3")
    [ "$(echo "$out" | grep -c '<tr><td>')" -eq 1 ] || fail "view second page: $out"
    has '<a href="/?status=complete&amp;limit=3&amp;offset=0">previous</a>'
    grep -q '>next<' <<<"$out" && fail "view: a next link after the last page"
    # the port in use: a clear error
    expect 1 "$A" replay view "$S" --port "$port"
    has "cannot listen on 127.0.0.1 port $port: Address already in use"
    kill -TERM "$vpid"
    wait "$vpid" || fail "replay view exited non-zero after SIGTERM"
    grep -q "served [0-9]* requests" "$T/view.out" || fail "view: $(cat "$T/view.out")"

    # a store that changes while served (another import), then is deleted; a small page cap;
    # not loopback: a warning; --max-requests counts answered requests
    "$A" replay export "$S" --full --output "$T/v.jsonl" >/dev/null || fail "export for view"
    head -n 1 "$T/v.jsonl" >"$T/v1.jsonl"
    "$A" replay import "$T/live" "$T/v1.jsonl" >/dev/null || fail "import for view"
    view_start "$T/live" --max-page-bytes 4096 --host 0.0.0.0 --max-requests 5
    grep -q "warning: replay view: --host 0.0.0.0 is not a loopback address" "$T/view.out" ||
        fail "view on 0.0.0.0 without a warning: $(cat "$T/view.out")"
    [ "$(curl -s "$U/" | grep -c '<tr><td>')" -eq 1 ] || fail "view of the live store"
    "$A" replay import "$T/live" "$T/v.jsonl" >/dev/null || fail "import into a viewed store"
    [ "$(curl -s "$U/" | grep -c '<tr><td>')" -eq 7 ] || fail "view after an import"
    out=$(curl -s "$U/show?traj=run1/g1/r0&tokens=1")
    has "cut: the first [0-9]* bytes of [0-9]* (replay view --max-page-bytes)"
    [ "${#out}" -lt 8000 ] || fail "view page over --max-page-bytes: ${#out} bytes"
    [ "$(code -H "Host: 192.168.7.7" "$U/")" = 200 ] || fail "view on 0.0.0.0: an IP literal Host"
    rm -rf "$T/live"
    out=$(curl -s -w "%{http_code}" "$U/")
    has "410$"
    has "was deleted while being served"
    wait "$vpid" || fail "replay view exited non-zero"
    grep -q "served 5 requests" "$T/view.out" || fail "view: $(cat "$T/view.out")"

    # IPv6: --host ::1 (where this machine has IPv6 loopback); the Host guard knows IPv6
    # literals, and --host :: takes any IP literal
    timeout 120 "$A" replay view "$S" --host ::1 --port 0 --max-requests 4 >"$T/view.out" 2>&1 &
    vpid=$!
    for _ in $(seq 1 100); do
        grep -q "Ctrl-C" "$T/view.out" 2>/dev/null || ! kill -0 "$vpid" 2>/dev/null && break
        sleep 0.1
    done
    if ! kill -0 "$vpid" 2>/dev/null && grep -qE "Cannot assign|Address family not supported" "$T/view.out"; then
        echo "note: no IPv6 loopback here: replay view --host ::1 not checked"
    else
        port=$(grep -o ']:[0-9]*/ (Ctrl-C' "$T/view.out" | cut -d: -f2 | cut -d/ -f1)
        [ -n "$port" ] || fail "replay view --host ::1 did not start: $(cat "$T/view.out")"
        grep -q "on http://\[::1\]:$port/ (Ctrl-C" "$T/view.out" || fail "view on ::1: $(cat "$T/view.out")"
        grep -q "warning" "$T/view.out" && fail "view on ::1 (loopback) warned: $(cat "$T/view.out")"
        U6="http://[::1]:$port"
        [ "$(code -g "$U6/")" = 200 ] || fail "view on ::1: GET /"
        [ "$(code -g -H "Host: [::1]:9" "$U6/")" = 200 ] || fail "view on ::1: Host [::1]"
        [ "$(code -g -H "Host: [::2]" "$U6/")" = 403 ] || fail "view on ::1: Host [::2] answered"
        [ "$(code -g -H "Host: evil.example" "$U6/")" = 403 ] || fail "view on ::1: a name answered"
        wait "$vpid" || fail "replay view on ::1 exited non-zero"
        view_start "$S" --host :: --max-requests 2
        grep -q "warning: replay view: --host :: is not a loopback address" "$T/view.out" ||
            fail "view on :: without a warning: $(cat "$T/view.out")"
        [ "$(code -g -H "Host: [fe80::1]:5" "http://[::1]:$port/")" = 200 ] || fail "view on ::: an IPv6 literal Host"
        [ "$(code -g -H "Host: evil.example" "http://[::1]:$port/")" = 403 ] || fail "view on ::: a name answered"
        wait "$vpid" || fail "replay view on :: exited non-zero"
    fi
    expect 2 "$A" replay view "$S" --host fe80::zz
    has "agentrl: error: --host 'fe80::zz' is not an IPv4 or IPv6 address"
fi

# help
expect 0 "$A" replay show --help
has "usage: agentrl replay show DB TRAJ"

# rescore (spec/replay.md 13.6): a trajectory rolled out under checkpoint a re-scores under a with
# router agreement exactly 1 (same weights, same inputs: the natural top-k equals the stored
# routes), under b (other weights) well below 1; the entropy mean is printed; the rescores rows
# carry both in stats_json (checked with the sqlite3 shell when present)
R=$T/rescore
mkdir -p "$R"
expect 0 "$A" model init tiny "$R/a" --seed 3
expect 0 "$A" model init tiny "$R/b" --seed 4
cat > "$R/exp.json" <<'JSON'
{"rollout": {"env": "calculator", "group_size": 1, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 4, "progress_s": 0, "state_cache": "off"}}
JSON
expect 0 "$A" rollout "$R/exp.json" --ckpt "$R/a" --out "$R/db" --tasks 1 --shard 1
expect 0 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/a"
has "router agreement over [1-9][0-9]* tokens: overlap 1.0000 exact layer 1.0000 exact token 1.0000"
has "start states: rollout states of version 0 (the run's version with these weights)"
has "entropy mean [0-9]"
expect 0 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/a" --routing natural --json \
    --label a-nat
has '"agree_overlap":1,"agree_exact_layer":1,"agree_exact_token":1,'
# --version N without --ckpt (spec 13.6: "--ckpt DIR, or --version n of the run"): the
# checkpoint the store records for version N of the trajectory's run (a's), label vN
expect 0 "$A" replay rescore "$R/db" rollout/g000000/r0 --version 0
has "router agreement over [1-9][0-9]* tokens: overlap 1.0000 exact layer 1.0000 exact token 1.0000"
expect 0 "$A" replay show "$R/db" rollout/g000000/r0 --tokens --rescore v0
has "rescored"
grep -q "no re-score" <<<"$out" && fail "rescore --version 0 saved no re-score labelled v0: $out"
expect 1 "$A" replay rescore "$R/db" rollout/g000000/r0 --version 7
has "records no policy version 7 (its newest is 0); give another --version, or --ckpt DIR"
# ... and refused when the checkpoint there now holds other weights (b's): the scores would be
# labelled v0 but be b's (they were saved)
mv "$R/a" "$R/a.real" && cp -a "$R/b" "$R/a"
expect 1 "$A" replay rescore "$R/db" rollout/g000000/r0 --version 0 --label v0-other
rm -rf "$R/a" && mv "$R/a.real" "$R/a"
has "error: replay rescore: .*/a holds other weights than the run of rollout/g000000/r0 recorded for policy version 0 (weights_sha256); give --ckpt DIR"
expect 0 "$A" replay show "$R/db" rollout/g000000/r0 --tokens --rescore v0-other
grep -q "no re-score" <<<"$out" || fail "rescore --version 0 under other weights saved a re-score: $out"
# --save-states (spec 13.6 step 3) under b, then the plain rescore under b starts its second
# segment from those tool states; with the default --version auto no rollout version is b's
expect 0 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/b" --json --save-states \
    --label b-states
has '"segments":[2-9],"from_state":0,'
has '"version":-1,"version_how":"none","from_tool_state":0,"states_saved":[2-9]'
expect 0 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/b" --json
has '"route_tokens":[1-9]'
has '"agree_overlap":0\.[0-8]'
has '"from_state":[1-9]'
has '"from_tool_state":[1-9]'
# the saved states are referenced by their rescores rows: no orphan warning
expect 0 "$A" replay verify "$R/db"
has "0 errors, 0 warnings"
# show lists each segment's states from every states file (spec 13.2): the tool states beside
# the rollout's
expect 0 "$A" replay show "$R/db" rollout/g000000/r0
has "^   states: .*tool kda_boundary complete, tool mla_segment complete"
# verify: an mla_segment state's latent chunks cover its tokens in order, per layer (spec 4.12)
lat() { # NAME SQL: a copy of the store with SQL run on every states file
    rm -rf "$R/db-$1" && cp -a "$R/db" "$R/db-$1"
    for f in "$R/db-$1"/shards/*.states.sqlite; do
        /usr/bin/python3 -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.close()' "$f" "$2" || fail "lat $1: SQL"
    done
}
lat gap "UPDATE state_chunks SET row_start = 1 WHERE tensor = 'latent' AND row_start = 0 AND
         layer = (SELECT min(layer) FROM state_chunks WHERE tensor = 'latent')"
expect 2 "$A" replay verify "$R/db-gap"
has "layer [0-9]*: a latent chunk starts at row 1, the chunks before it end at row 0 (a gap)"
lat short "UPDATE states SET n_tokens = n_tokens + 1 WHERE kind = 'mla_segment'"
expect 2 "$A" replay verify "$R/db-short"
has "layer [0-9]*: the latent chunks cover [0-9]* rows, the state [0-9]* tokens"
lat kind "UPDATE state_chunks SET tensor = 'latent' WHERE tensor = 'conv' AND
          state_id = (SELECT min(state_id) FROM states WHERE kind = 'kda_boundary')"
expect 2 "$A" replay verify "$R/db-kind"
has "(kda_boundary) layer [0-9]* holds a 'latent' chunk"
expect 2 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/b" --version soon
has "expected auto, none, -1 or a version"
# rescore's own usage errors read as every command's: "agentrl: error: ..." and the usage line
has "^agentrl: error: replay rescore: --version: "
has "^usage: agentrl replay rescore DB TRAJ"
expect 2 "$A" replay rescore "$R/db" rollout/g000000/r0 --ckpt "$R/b" --save-states --no-save
has "^agentrl: error: replay rescore: --save-states writes into a tool file"
has "^usage: agentrl replay rescore DB TRAJ"
expect 2 "$A" replay rescore "$R/db" rollout/g000000/r0
has "^agentrl: error: replay rescore: missing required option '--ckpt DIR'"
if command -v sqlite3 >/dev/null 2>&1; then
    out=$(for f in "$R"/db/shards/t*.sqlite; do
        sqlite3 "$f" "SELECT label, stats_json FROM rescores"; done 2>&1)
    has '^a|.*"entropy_mean":[0-9].*"router_agreement":{"tokens":[1-9][0-9]*,"overlap":1,"exact_layer":1,"exact_token":1,"layer":\[1,'
    has '^b|.*"router_agreement":{"tokens":[1-9][0-9]*,"overlap":0\.[0-8]'
fi

if [ "$fails" = 0 ]; then
    rm -rf "$T"
    echo "test_replay_cli: all checks passed"
    exit 0
fi
echo "test_replay_cli: $fails failed (files kept in $T)" >&2
exit 1
