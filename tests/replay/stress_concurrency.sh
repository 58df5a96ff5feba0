#!/bin/bash
# tests/replay/stress_concurrency.sh: several `agentrl rollout` workers write one replay store at
# once (their own --shard, or --shard 0 for a new one; two share one task range; one is SIGKILLed
# and continued with its --shard, one SIGKILLed and left to `replay recover`; a finished one's
# shard is continued again) while other processes run `replay gc`, `pin`/`unpin`,
# `list`/`stats`/`show`/`export`, `verify`, `recover` and `seal` (of the shards whose worker
# finished) in loops, and gc, seal and recover runs are SIGKILLed at random moments.
# Afterwards: every process exited as expected with no error or warning on stderr and no shard
# reported missing, seal finishes the killed seals, `recover` + `verify` pass, each expected
# trajectory is stored exactly once with its latest attempt final, each worker's summary counts
# its shard's trajectories, and every pinned trajectory kept the states it had when its pin
# returned, through a final `gc --rollout off` too.  The pass criteria do not depend on timing;
# the timings (kill delays, loop pauses) vary with STRESS_SEED, printed first.  Knobs:
# STRESS_SEED (default: random), STRESS_TASKS (tasks per worker, 4; 12 runs about 3 times as
# long), STRESS_KEEP=1 keeps the work folder.
set -u
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "no $BIN (build the agentrl target)"; exit 77; }
PY=/usr/bin/python3 # (JSON Lines read by Python: a base package, where jq is not)
[ -x "$PY" ] || { echo "no $PY"; exit 77; }
# jsonl_ok FILE: every line of FILE is one JSON value
jsonl_ok() {
    "$PY" -c 'import json, sys
for l in open(sys.argv[1]):
    if l.strip(): json.loads(l)' "$1" 2> /dev/null
}
# jsonl_get KEY [FILTER]: KEY of each JSON line on stdin for which the Python expression FILTER
# (of the line's object o) holds; true/false as JSON writes them
jsonl_get() {
    "$PY" -c 'import json, sys
for l in sys.stdin:
    if not l.strip(): continue
    o = json.loads(l)
    if len(sys.argv) > 2 and not eval(sys.argv[2]): continue
    v = o.get(sys.argv[1])
    print(json.dumps(v) if isinstance(v, bool) else v)' "$@"
}
SEED=${STRESS_SEED:-$$}
RANDOM=$SEED
K=${STRESS_TASKS:-4}
G=2
T=$(mktemp -d /tmp/arl-test-replay-stress-XXXXXX)
DB=$T/db
pids=()
declare -A wpids # worker name -> pid
cleanup() {
    touch "$T/stop"
    for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null; done
    wait 2> /dev/null
    if [ "${STRESS_KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
fail() {
    echo "FAIL (STRESS_SEED=$SEED): $*"
    exit 1
}
echo "stress: STRESS_SEED=$SEED tasks per worker $K"
# pause MIN MAX: sleep a random MIN..MAX milliseconds
pause() {
    local ms=$(($1 + RANDOM % ($2 - $1 + 1)))
    sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
}
. "$(dirname "$0")/../wait_for.sh"
"$BIN" model init tiny "$T/ckpt" --seed 1 > /dev/null 2>&1 || fail "model init"
cat > "$T/exp.json" << 'JSON'
{"rollout": {"env": "calculator", "group_size": 2, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 2, "progress_s": 0, "threads": 1}}
JSON
mkdir -p "$T/log" "$T/pins"

# ---- workers: rollout NAME OFFSET SHARD STATE_CACHE -> pid in wpids[NAME], output in log/NAME.*
rollout() {
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$DB" --tasks "$K" --task-offset "$2" \
        --shard "$3" --state-cache "$4" > "$T/log/$1.out" 2> "$T/log/$1.err" &
    wpids[$1]=$!
    pids+=($!)
}
# the store must exist before the maintenance loops start: the first worker makes it
rollout a 0 1 all
wait_for test -e "$DB/catalog.sqlite" || fail "no store made"

# ---- maintenance loops: each command's exit status and stderr are logged; an unexpected
# status or an error line fails the run at the end.  log/NAME.bad collects them.
# run NAME EXPECTED CMD...: run CMD, keep its stdout in log/NAME.last
run() {
    local name=$1 want=$2
    shift 2
    "$@" > "$T/log/$name.last" 2> "$T/log/$name.lasterr"
    local rc=$?
    echo "$rc" >> "$T/log/$name.rcs"
    case " $want " in
    *" $rc "*)
        grep -q -i -e error -e warn "$T/log/$name.lasterr" &&
            { echo "== exit $rc with errors: $*"; cat "$T/log/$name.lasterr"; } >> "$T/log/$name.bad"
        # a shard being created is not missing (gc, seal, verify report missing files)
        grep -q -e "file is missing" -e "[0-9] missing" "$T/log/$name.last" &&
            { echo "== exit $rc, a missing file reported: $*"; cat "$T/log/$name.last"; } >> "$T/log/$name.bad" ;;
    *) { echo "== exit $rc (expected $want): $*"; cat "$T/log/$name.lasterr"; } >> "$T/log/$name.bad" ;;
    esac
    return $rc
}
uids() { "$BIN" replay list "$DB" --json 2> /dev/null | jsonl_get traj_uid; }
loop_gc() {
    while [ ! -e "$T/stop" ]; do
        run gc 0 "$BIN" replay gc "$DB" --min-age-ms 0 --rollout last
        pause 50 300
    done
}
# pins a random trajectory and notes the 'complete' states `show` lists right after the pin
# returned; unpins one now and then (removing its note first)
nstates() { "$BIN" replay show "$DB" "$1" 2>> "$T/log/pin.showerr" | grep '^   states:' | grep -o 'complete' | wc -l; }
loop_pin() {
    while [ ! -e "$T/stop" ]; do
        u=$(uids | shuf -n 1)
        if [ -n "$u" ]; then
            f=$T/pins/$(echo "$u" | tr / _)
            if run pin 0 "$BIN" replay pin "$DB" "$u" --reason stress; then
                echo "$u $(nstates "$u")" > "$f"
            fi
            if [ $((RANDOM % 4)) = 0 ]; then
                v=$(find "$T/pins" -type f | shuf -n 1)
                if [ -n "$v" ]; then
                    w=$(cut -d' ' -f1 "$v")
                    rm -f "$v"
                    run unpin 0 "$BIN" replay unpin "$DB" "$w"
                fi
            fi
        fi
        pause 20 200
    done
}
loop_read() {
    while [ ! -e "$T/stop" ]; do
        if run list 0 "$BIN" replay list "$DB" --json; then
            jsonl_ok "$T/log/list.last" || cp "$T/log/list.last" "$T/log/list.badjson"
        fi
        run stats 0 "$BIN" replay stats "$DB"
        u=$(uids | shuf -n 1)
        [ -n "$u" ] && run show 0 "$BIN" replay show "$DB" "$u"
        if run export 0 "$BIN" replay export "$DB"; then
            jsonl_ok "$T/log/export.last" || cp "$T/log/export.last" "$T/log/export.badjson"
        fi
        pause 20 200
    done
}
loop_verify() {
    while [ ! -e "$T/stop" ]; do
        run verify 0 "$BIN" replay verify "$DB"
        run recover 0 "$BIN" replay recover "$DB"
        pause 100 400
    done
}
# seals the shards named in log/sealable (their workers finished for good)
loop_seal() {
    while [ ! -e "$T/stop" ]; do
        for s in $(cat "$T/log/sealable" 2> /dev/null); do # shard ids, one a line
            run seal 0 "$BIN" replay seal "$DB" --shard "$s"
            # readers hold a file for less than a second: seal waits for them
            grep -q -e "kept the file open" -e "still in WAL mode" "$T/log/seal.last" &&
                { echo "== seal skipped for readers"; cat "$T/log/seal.last"; } >> "$T/log/seal.bad"
        done
        pause 100 400
    done
}
# SIGKILLs maintenance commands at random moments (mid-eviction, mid-seal, mid-recovery)
loop_kill() {
    while [ ! -e "$T/stop" ]; do
        case $((RANDOM % 3)) in
        0) set -- gc "$DB" --min-age-ms 0 --rollout off ;;
        1) set -- seal "$DB" --shard "$(shuf -n 1 "$T/log/sealable" 2> /dev/null)" ;;
        2) set -- recover "$DB" ;;
        esac
        [ "$*" = "seal $DB --shard " ] && set -- recover "$DB" # none finished yet
        "$BIN" replay "$@" > /dev/null 2> "$T/log/kill.lasterr" &
        local p=$!
        pause 0 300
        kill -KILL $p 2> /dev/null
        { wait $p; } 2> /dev/null # (without bash's "Killed" line)
        local rc=$?
        echo "$rc" >> "$T/log/kill.rcs"
        case $rc in
        0 | 137) ;;
        *) { echo "== exit $rc (expected 0 or 137): replay $*"; cat "$T/log/kill.lasterr"; } >> "$T/log/kill.bad" ;;
        esac
        pause 50 300
    done
}
for l in loop_gc loop_pin loop_read loop_verify loop_seal loop_kill; do
    $l &
    pids+=($!)
    lpids+=($!)
done

shard_of() { sed -n 's/.*rollout: writing shard \([0-9]*\) of.*/\1/p' "$T/log/$1.err" | head -1; }
rollout b "$K" 0 last
rollout c $((2 * K)) 0 all
rollout d $((3 * K)) 0 last # d and e share their tasks
rollout e $((3 * K)) 0 last
rollout f $((4 * K)) 0 all
# kill_writing NAME PID MIN MAX: SIGKILL worker NAME once it writes, MIN..MAX ms later; its
# exit status (137, or 0 if it finished first) in $krc
kill_writing() {
    wait_for grep -qs "writing shard" "$T/log/$1.err" || fail "worker $1 did not start"
    pause "$3" "$4"
    kill -KILL "$2" 2> /dev/null
    { wait "$2"; } 2> /dev/null
    krc=$?
    [ $krc -eq 137 ] || [ $krc -eq 0 ] || { tail -3 "$T/log/$1.err"; fail "worker $1: exit $krc"; }
}
# c is SIGKILLed once writing and continued with its shard; f is SIGKILLed and left
kill_writing c "${wpids[c]}" 200 900
sc=$(shard_of c)
rollout c2 $((2 * K)) "$sc" all
kill_writing f "${wpids[f]}" 100 1500
rf=$krc

# the others end with 0; each finished shard but a's is sealed by the seal loop; a's is
# continued twice more (nothing left to do) while gc, recover and seal take it over for moments
declare -A wrc wshard
for w in a b d e c2; do
    wait "${wpids[$w]}"
    wrc[$w]=$?
    wshard[$w]=$(shard_of "$w")
    case $w in
    a)
        for k in 2 3; do
            rollout a$k 0 "${wshard[a]}" all
            wait "${wpids[a$k]}"
            wrc[a$k]=$?
        done
        ;;
    c2) ;;
    *) [ "${wrc[$w]}" -eq 0 ] && echo "${wshard[$w]}" >> "$T/log/sealable" ;;
    esac
done
pause 300 800
touch "$T/stop"
for p in "${lpids[@]}"; do wait "$p"; done

# ---- verdicts
bad=0
for w in a a2 a3 b d e c2; do
    if [ "${wrc[$w]}" -ne 0 ]; then
        echo "worker $w: exit ${wrc[$w]}"
        tail -5 "$T/log/$w.err"
        bad=1
    fi
    if grep -v -e "^agentrl: rollout: writing shard" -e "^  " -e "^rollout" -e "^agentrl: rollout: [0-9]*/[0-9]* trajectories" \
        -e "resolved configuration" -e "^$" "$T/log/$w.err" | grep -q -i -e error -e warn; then
        echo "worker $w: stderr:"
        grep -i -e error -e warn "$T/log/$w.err" | head -5
        bad=1
    fi
done
for f in "$T"/log/*.bad; do
    [ -e "$f" ] || continue
    echo "--- $(basename "$f" .bad): $(grep -c '^==' "$f") unexpected results, the first:"
    head -8 "$f"
    bad=1
done
for f in "$T"/log/*.badjson; do
    [ -e "$f" ] && { echo "--- $f: not JSON lines"; bad=1; }
done
for n in gc pin list stats show export verify recover seal kill; do
    printf '%s %s; ' "$n" "$(wc -l 2> /dev/null < "$T/log/$n.rcs" || echo 0)"
done
echo
[ $bad -eq 0 ] || fail "unexpected results above"

# a seal that was killed is finished by the next one
for sh in $(cat "$T/log/sealable"); do
    "$BIN" replay seal "$DB" --shard "$sh" > "$T/seal" 2>&1 || { cat "$T/seal"; fail "seal of shard $sh after the run"; }
    grep -q ": skipped" "$T/seal" && { cat "$T/seal"; fail "seal of shard $sh after the run: skipped"; }
done
# recover the killed worker's shard, then verify the whole store
"$BIN" replay recover "$DB" > "$T/recover" 2>&1 || { cat "$T/recover"; fail "recover after the run"; }
"$BIN" replay verify "$DB" > "$T/verify" 2>&1 || { tail -20 "$T/verify"; fail "verify after the run"; }
"$BIN" replay list "$DB" --json > "$T/all.json" || fail "list after the run"
jsonl_get traj_uid < "$T/all.json" | sort > "$T/uids"
dups=$(uniq -d "$T/uids")
[ -z "$dups" ] || fail "trajectories stored twice: $dups"
# every slot of the workers that finished (a b c d e: tasks 0 .. 4K-1) once, its latest attempt
# final (an earlier one masked: a refill of a trajectory killed before its first commit)
"$PY" -c 'import json, re, sys
for l in sys.stdin:
    if not l.strip(): continue
    o = json.loads(l)
    m = re.fullmatch(r"rollout/g([0-9]+)/r([0-9]+)(?:\.a([0-9]+))?", o["traj_uid"])
    if not m: sys.exit("unexpected trajectory uid " + o["traj_uid"])
    print(int(m[1]), m[2], m[3] or "0", o["status"], o["error_code"])' < "$T/all.json" |
    sort -n -k1,1 -k2,2 -k3,3 > "$T/slots" || fail "unexpected trajectory uids"
for ((t = 0; t < 4 * K; t++)); do
    for ((r = 0; r < G; r++)); do
        grep "^$t $r " "$T/slots" > "$T/slot"
        [ -s "$T/slot" ] || fail "task $t slot $r: no trajectory"
        read -r _ _ a st _ <<< "$(tail -1 "$T/slot")"
        case "$st" in
        complete | truncated | masked) ;;
        *) fail "task $t slot $r attempt $a: status '$st' (expected a final one)" ;;
        esac
        head -n -1 "$T/slot" | grep -v " masked " && fail "task $t slot $r: an earlier attempt not masked"
    done
done
# each worker's summary counts the final trajectories of its shard (d and e together their range)
nsum() { sed -n 's/^  trajectories  \([0-9]*\) (.*/\1/p' "$T/log/$1.out"; }
nfinal() { jsonl_get traj_uid "o['traj_id'] // 1099511627776 == $1 and o['status'] != 'running'" < "$T/all.json" | wc -l; }
for w in a b d e; do
    [ "$(nsum $w)" = "$(nfinal "${wshard[$w]}")" ] ||
        fail "worker $w: its summary says $(nsum $w), its shard ${wshard[$w]} holds $(nfinal "${wshard[$w]}") final"
done
[ $(($(nsum d) + $(nsum e))) -eq $((K * G)) ] || fail "workers d and e: $(nsum d) + $(nsum e) trajectories, $((K * G)) expected"
[ "$(nsum c2)" -le "$(nfinal "$sc")" ] || fail "worker c2: its summary says $(nsum c2), its shard $sc holds $(nfinal "$sc") final"
# the pinned trajectories kept the states they had when pinned
np=0
for f in "$T"/pins/*; do
    [ -e "$f" ] || continue
    read -r u n < "$f"
    now=$(nstates "$u")
    [ "$now" -ge "$n" ] || fail "$u: pinned with $n complete states, $now left"
    [ "$(jsonl_get pinned "o['traj_uid'] == '$u'" < "$T/all.json")" = true ] || fail "$u: not listed as pinned"
    np=$((np + 1))
done
# a final gc keeps them too
"$BIN" replay gc "$DB" --min-age-ms 0 --rollout off > "$T/gc" 2>&1 || { cat "$T/gc"; fail "final gc"; }
for f in "$T"/pins/*; do
    [ -e "$f" ] || continue
    read -r u n < "$f"
    [ "$(nstates "$u")" -ge "$n" ] || fail "$u: the final gc evicted a pinned trajectory's states"
done
"$BIN" replay verify "$DB" > "$T/verify" 2>&1 || { tail -20 "$T/verify"; fail "verify after the final gc"; }
echo "ok: $(wc -l < "$T/uids") trajectories, $np pinned, worker f killed with exit $rf"
