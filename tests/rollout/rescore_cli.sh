#!/bin/sh
# tests/rollout/rescore_cli.sh: `agentrl replay rescore` given bad input and interrupted.
# - a --ckpt that is not a checkpoint directory, an unknown TRAJ anywhere in the list (or none),
#   a --version the run never recorded and an empty --label stop the command before anything is
#   computed or written (no tool file, no report);
# - a checkpoint of another model (other vocabulary, fewer experts than the stored routes name,
#   with --routing replay another top-k or MoE layer count) is an error that names the
#   trajectory, the checkpoint and what to do, not a model error;
# - SIGTERM mid-run: the trajectories reported on stdout (flushed as each ends) are saved whole,
#   and the note on stderr gives the command that re-scores the others, which completes the list;
#   a failure after some trajectories says where their re-scores were saved;
# - SIGKILL between a trajectory's --rewards rows and its model rows (an LD_PRELOAD shim) leaves
#   neither: one transaction per trajectory.
set -u
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "no $BIN (build the agentrl target)"; exit 77; }
T=$(mktemp -d /tmp/arl-test-rescore-cli-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
tools() { ls "$T/db/shards" | grep -c '^t[0-9]*\.sqlite$'; }

"$BIN" model init tiny "$T/ckpt" --seed 3 > /dev/null 2>&1 || fail "model init"
cat > "$T/exp.json" << 'JSON'
{"rollout": {"env": "calculator", "group_size": 2, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 4, "progress_s": 0, "state_cache": "all"}}
JSON
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 --shard 1 > /dev/null 2> "$T/err" ||
    { cat "$T/err"; fail "rollout"; }
A=rollout/g000000/r0
B=rollout/g000001/r1

# --- bad input: an error naming it, nothing computed or written
"$BIN" replay rescore "$T/db" $A --ckpt "$T/none" > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: --ckpt $T/none: No such file" "$T/err" ||
    { cat "$T/err"; fail "--ckpt missing: exit 1 naming --ckpt"; }
"$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt/config.json" > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: --ckpt $T/ckpt/config.json: not a directory" "$T/err" ||
    { cat "$T/err"; fail "--ckpt a file: exit 1 naming --ckpt (was read as a safetensors file)"; }
"$BIN" replay rescore "$T/db" $A no/such/traj --ckpt "$T/ckpt" --save-states > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "no trajectory 'no/such/traj'" "$T/err" ||
    { cat "$T/err"; fail "unknown TRAJ: exit 1 naming it"; }
[ -s "$T/out" ] && fail "unknown TRAJ: $A was re-scored before the list was checked"
"$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt" --label "" > "$T/out" 2> "$T/err"
[ $? -eq 2 ] && grep -q -- "--label: empty" "$T/err" ||
    { cat "$T/err"; fail "--label '': a usage error (exit 2) expected"; }
# --version N that the run never recorded (it was reported as "given", no state used)
"$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt" --version 7 > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: replay rescore: --version 7: run 'rollout' of $A records no policy version 7 (its newest is 0): give a version it records, auto .* or none" "$T/err" ||
    { cat "$T/out" "$T/err"; fail "--version unknown: exit 1 naming the run's versions"; }
[ -s "$T/out" ] && fail "--version unknown: $A was re-scored"
# no TRAJ: said in the command's terms (was "missing required option '--traj TRAJ'", an option
# nobody types)
"$BIN" replay rescore "$T/db" --ckpt "$T/ckpt" > "$T/out" 2> "$T/err"
[ $? -eq 2 ] && grep -q "error: missing TRAJ: name the trajectories to re-score after DB, each a traj_uid or traj_id ('agentrl replay list $T/db' shows them)" "$T/err" &&
    ! grep -q -- "--traj" "$T/err" ||
    { cat "$T/err"; fail "no TRAJ: a usage error (exit 2) naming TRAJ"; }
[ "$(tools)" -eq 0 ] || { ls "$T/db/shards"; fail "bad input left a tool file"; }

# --- the summary counts every segment once by how it started: fresh (segment 0), from a cached
# state or from a recomputed prefix (a fresh segment was in none of the counts)
"$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt" --version none --no-save > "$T/out" 2> "$T/err" ||
    { cat "$T/err"; fail "rescore --no-save"; }
sed -n 's/^[^:]*: \([0-9]*\) segments (\([0-9]*\) fresh, \([0-9]*\) from cached states, \([0-9]*\) recomputed prefixes,.*/\1 \2 \3 \4/p' "$T/out" |
    awk 'NF == 4 && $2 >= 1 && $1 == $2 + $3 + $4 { ok = 1 } END { exit !ok }' ||
    { cat "$T/out"; fail "rescore summary: segments != fresh + from cached states + recomputed"; }

# --- a checkpoint of another model
sed 's/"vocab_size": *384/"vocab_size": 300/' "$T/ckpt/config.json" > "$T/v300.json"
sed 's/"num_experts": *16/"num_experts": 8/' "$T/ckpt/config.json" > "$T/e8.json"
grep -q '"vocab_size": *300' "$T/v300.json" && grep -q '"num_experts": *8' "$T/e8.json" ||
    fail "the tiny config changed: update the sed lines"
"$BIN" model init "$T/v300.json" "$T/v300" --seed 1 > /dev/null 2>&1 || fail "model init v300"
"$BIN" model init "$T/e8.json" "$T/e8" --seed 1 > /dev/null 2>&1 || fail "model init e8"
"$BIN" replay rescore "$T/db" $A --ckpt "$T/v300" --no-save > /dev/null 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: rescore of $A under $T/v300: segment 0 holds token id [0-9]*, outside the checkpoint's vocabulary \[0, 300): the trajectory was sampled by another model" "$T/err" ||
    { cat "$T/err"; fail "other vocabulary: exit 1 and a message naming the trajectory"; }
"$BIN" replay rescore "$T/db" $A --ckpt "$T/e8" --no-save > /dev/null 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: rescore of $A under $T/e8: segment 0's stored route of MoE layer [0-9]* names expert [0-9]*, outside the checkpoint's 8 experts.*--routing natural" "$T/err" ||
    { cat "$T/err"; fail "fewer experts: exit 1 and a message naming --routing natural"; }
"$BIN" replay rescore "$T/db" $A --ckpt "$T/e8" --no-save --routing natural > /dev/null 2> "$T/err" ||
    { cat "$T/err"; fail "fewer experts, --routing natural"; }

# --- stored routes of another MoE layout (top-k, MoE layer count): --routing replay (the default)
# cannot replay them and says so (it fell back to natural routing, "router agreement over 0
# tokens" the only sign); --routing natural scores and says the agreement is not measured
sed 's/"num_experts_per_token": *4/"num_experts_per_token": 3/' "$T/ckpt/config.json" > "$T/k3.json"
sed 's/"first_k_dense_replace": *1/"first_k_dense_replace": 2/' "$T/ckpt/config.json" > "$T/d2.json"
grep -q '"num_experts_per_token": *3' "$T/k3.json" && grep -q '"first_k_dense_replace": *2' "$T/d2.json" ||
    fail "the tiny config changed: update the sed lines"
"$BIN" model init "$T/k3.json" "$T/k3" --seed 1 > /dev/null 2>&1 || fail "model init k3"
"$BIN" model init "$T/d2.json" "$T/d2" --seed 1 > /dev/null 2>&1 || fail "model init d2"
"$BIN" replay rescore "$T/db" $A --ckpt "$T/k3" --no-save > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: rescore of $A under $T/k3: segment 0's stored routes are for 7 MoE layers of top-4, the checkpoint has 7 MoE layers of top-3: the trajectory was sampled by another model (--routing natural" "$T/err" ||
    { cat "$T/out" "$T/err"; fail "other top-k, --routing replay: exit 1 naming the mismatch"; }
"$BIN" replay rescore "$T/db" $A --ckpt "$T/d2" --no-save > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: rescore of $A under $T/d2: segment 0's stored routes are for 7 MoE layers of top-4, the checkpoint has 6 MoE layers of top-4" "$T/err" ||
    { cat "$T/out" "$T/err"; fail "other MoE layer count, --routing replay: exit 1 naming the mismatch"; }
"$BIN" replay rescore "$T/db" $A --ckpt "$T/k3" --no-save --routing natural > "$T/out" 2> "$T/err" ||
    { cat "$T/err"; fail "other top-k, --routing natural"; }
grep -q "router agreement not measured in 2 segments: their stored routes are of another MoE layout" "$T/out" ||
    { cat "$T/out"; fail "other top-k, --routing natural: the agreement's absence unexplained"; }

# --- SIGTERM after the first trajectory is reported (12 in the list, about 0.15 s each)
L=""
for i in 1 2 3; do L="$L $A $B rollout/g000000/r1 rollout/g000001/r0"; done
# shellcheck disable=SC2086
"$BIN" replay rescore "$T/db" $L --ckpt "$T/ckpt" --version none --label "my label" --json \
    > "$T/out1" 2> "$T/err1" &
pid=$!
k=0
while ! [ -s "$T/out1" ] && [ $k -lt 600 ]; do sleep 0.02; k=$((k + 1)); done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || { cat "$T/err1"; fail "not interrupted mid-run (exit $rc; a report not flushed?)"; }
n1=$(grep -c '^{"traj"' "$T/out1")
[ "$n1" -ge 1 ] && [ "$n1" -lt 12 ] || fail "interrupted run reported $n1 trajectories"
grep -q "interrupted: replay rescore stops here; the re-scores of the $n1 traject.* reported above are saved in $T/db/shards/t[0-9]*.sqlite; re-score the others with:" "$T/err1" ||
    { cat "$T/err1"; fail "no interrupt note naming the saved re-scores"; }
if command -v sqlite3 > /dev/null; then # every reported trajectory saved whole (both segments)
    f=$(ls "$T/db/shards"/t*.sqlite | grep -v states)
    sqlite3 "$f" "SELECT traj_uid, count(*) FROM rescores WHERE label = 'my label' GROUP BY traj_uid" \
        > "$T/rows"
    head -"$n1" "$T/out1" | sed 's/^{"traj":"\([^"]*\)".*/\1|2/' | sort -u | cmp -s - "$T/rows" ||
        { cat "$T/rows"; fail "the saved rows are not those of the reported trajectories"; }
fi
# the note's command names the binary as it was started ($BIN, a path) and runs as printed
cmd=$(sed -n '/re-score the others with:/{n;p;}' "$T/err1")
case $cmd in "  $BIN replay rescore $T/db "*) ;; *) cat "$T/err1"; fail "no command in the note";; esac
sh -c "$cmd" > "$T/out2" 2> "$T/err2" || { cat "$T/err2"; fail "the note's command: $cmd"; }
n2=$(grep -c '^{"traj"' "$T/out2")
[ $((n1 + n2)) -eq 12 ] || fail "the note's command re-scored $n2 trajectories after $n1 of 12"
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify after the interrupt"; }

# --- SIGTERM with --rewards --ckpt: a trajectory's rewards rows are saved with its model rows,
# so the one the signal cut is in neither and the note's command saves it once (its rewards rows
# were committed before the model pass: after the note's command they were in two tool files)
if command -v sqlite3 > /dev/null; then
    ls "$T/db/shards" | grep '^t[0-9]*\.sqlite$' | sort > "$T/tools0"
    L4="$A $B rollout/g000000/r1 rollout/g000001/r0"
    # shellcheck disable=SC2086
    "$BIN" replay rescore "$T/db" $L4 --ckpt "$T/ckpt" --version none --rewards --label rw \
        --json > "$T/rw-out1" 2> "$T/rw-err1" &
    pid=$!
    k=0
    while ! [ -s "$T/rw-out1" ] && [ $k -lt 600 ]; do sleep 0.02; k=$((k + 1)); done
    kill -TERM $pid
    wait $pid
    rc=$?
    n1=$(grep -c '^{"traj"' "$T/rw-out1")
    [ $rc -eq 143 ] && [ "$n1" -ge 1 ] && [ "$n1" -lt 4 ] ||
        { cat "$T/rw-err1"; fail "--rewards: not interrupted mid-run (exit $rc, $n1 reported)"; }
    cmd=$(sed -n '/re-score the others with:/{n;p;}' "$T/rw-err1")
    case $cmd in "  $BIN replay rescore $T/db "*) ;;
        *) cat "$T/rw-err1"; fail "--rewards: no command in the note";; esac
    sh -c "$cmd" > "$T/rw-out2" 2> "$T/rw-err2" ||
        { cat "$T/rw-err2"; fail "--rewards: the note's command"; }
    : > "$T/ids"
    for f in $(ls "$T/db/shards" | grep '^t[0-9]*\.sqlite$' | sort | comm -13 "$T/tools0" -); do
        sqlite3 "$T/db/shards/$f" \
            "SELECT DISTINCT traj_id FROM rewards WHERE source = 'rescore:rw'" >> "$T/ids"
    done
    [ "$(sort -u "$T/ids" | wc -l)" -eq 4 ] && [ -z "$(sort "$T/ids" | uniq -d)" ] ||
        { cat "$T/ids"; fail "--rewards interrupted: a trajectory's rows in two tool files (or none)"; }
fi

# --- SIGKILL as the first model row of a --rewards --ckpt re-score is written (an LD_PRELOAD
# shim, tests/replay/sqlkill_preload.c): the trajectory's rewards rows and model rows are one
# transaction, so neither is saved (its rewards rows were committed alone before); the same
# command then saves all of them.
SHIM=${ARL_BUILD_DIR:-$(dirname "$BIN")}/tests/replay/libarl_test_sqlkill_preload.so
[ -f "$SHIM" ] || fail "no $SHIM (build the arl_test_sqlkill_preload target)"
# rows T LABEL: the rewards rows (source rescore:LABEL) and rescores rows (label LABEL) of every
# tool file, as "REWARDS RESCORES"
rows() {
    nr=0
    ns=0
    for f in $(ls "$T/db/shards" | grep '^t[0-9]*\.sqlite$'); do
        nr=$((nr + $(sqlite3 "$T/db/shards/$f" "SELECT count(*) FROM rewards WHERE source = 'rescore:$1'")))
        ns=$((ns + $(sqlite3 "$T/db/shards/$f" "SELECT count(*) FROM rescores WHERE label = '$1'")))
    done
    echo "$nr $ns"
}
ARL_TEST_KILL_SQL="INSERT OR REPLACE INTO rescores" LD_PRELOAD="$SHIM" \
    ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
    "$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt" --version none --rewards --label crash \
    > "$T/out" 2> "$T/err"
rc=$?
[ $rc -eq 137 ] || { cat "$T/out" "$T/err"; fail "the shim did not kill the re-score (exit $rc)"; }
if command -v sqlite3 > /dev/null; then
    [ "$(rows crash)" = "0 0" ] ||
        fail "SIGKILL before the model rows left rows (rewards, rescores): $(rows crash)"
fi
"$BIN" replay rescore "$T/db" $A --ckpt "$T/ckpt" --version none --rewards --label crash \
    --json > "$T/out" 2> "$T/err" || { cat "$T/err"; fail "re-score after the crash"; }
if command -v sqlite3 > /dev/null; then
    nw=$(grep -o '"rows_written":[0-9]*' "$T/out" | cut -d: -f2)
    [ -n "$nw" ] && [ "$nw" -gt 0 ] && [ "$(rows crash)" = "$nw 2" ] ||
        { cat "$T/out"; fail "after the crash and a run: rows (rewards, rescores) $(rows crash), not $nw 2"; }
fi

# --- a failure after the first trajectory (--rewards of a fork is refused) says what was saved
"$BIN" replay fork "$T/db" $A --segment 1 --ckpt "$T/ckpt" --count 1 > "$T/fork" 2> "$T/err" ||
    { cat "$T/err"; fail "fork"; }
F=$(tail -1 "$T/fork")
"$BIN" replay rescore "$T/db" $A "$F" --rewards > /dev/null 2> "$T/err"
[ $? -eq 1 ] && grep -q "error: rescore --rewards of $F: a fork's first steps" "$T/err" &&
    grep -q "^agentrl: replay rescore stopped at $F; 1 trajectory was reported above, their re-scores saved in $T/db/shards/t[0-9]*.sqlite" "$T/err" ||
    { cat "$T/err"; fail "a failure mid-list: exit 1 and where the re-scores before it went"; }
echo "rescore_cli: ok"
