#!/bin/bash
# replay verify against spec/replay.md section 7.4 (invariants of committed data) and section
# 13.5 (meta consistency, group_members against the shards): a store built by replay_mkstore,
# each case breaking one rule with raw SQL (/usr/bin/python3's sqlite3), verify naming it.
set -u
A=${ARL_BIN:?ARL_BIN must name build/agentrl}
MK=${ARL_BUILD_DIR:?}/tests/replay/replay_mkstore
T=$(mktemp -d /tmp/arl-test-verify-inv-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}
"$MK" "$T/base" >/dev/null || { echo "FAIL: replay_mkstore"; exit 1; }
out=$("$A" replay verify "$T/base" 2>&1)
[ $? = 0 ] || fail "the intact store does not verify: $out"

# case NAME FILE RC PATTERN SQL: a copy of the store, SQL run on FILE, verify exits RC and says
# PATTERN (an extended regular expression)
case_() {
    local name=$1 file=$2 want=$3 pat=$4 sql=$5
    local d=$T/$name
    cp -a "$T/base" "$d"
    /usr/bin/python3 -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.close()' "$d/$file" "$sql" ||
        { fail "$name: the SQL failed"; return; }
    out=$("$A" replay verify "$d" 2>&1)
    local rc=$?
    [ "$rc" = "$want" ] || fail "$name: verify exited $rc, expected $want: $out"
    grep -Eq -- "$pat" <<<"$out" || fail "$name: verify does not say '$pat': $out"
    rm -rf "$d"
}
W=shards/w1.sqlite
R1=1099511627777 # run1/g1/r1: complete, segments 0..2 (steps 1-2, 3-4, 5-6)
R2=1099511627778 # run1/g1/r2: masked SANDBOX_LOST, segment 1 'partial' (failed step 4)

# invariant 1: segments 0..n-1 without gaps, contiguous tokens, ctx_start
case_ gap $W 2 "segment 5 found where 2 was expected" \
    "PRAGMA foreign_keys=OFF; DELETE FROM segment_routes WHERE traj_id=$R1 AND seg_index=2;
     UPDATE segments SET seg_index=5 WHERE traj_id=$R1 AND seg_index=2"
case_ tok_start $W 2 "segment 1: tok_start 101 != 100" \
    "UPDATE segments SET tok_start=101 WHERE traj_id=$R1 AND seg_index=1"
case_ ctx_continue $W 2 "segment 1: ctx_start 7, expected 100" \
    "UPDATE segments SET ctx_start=7 WHERE traj_id=$R1 AND seg_index=1"
case_ ctx_fresh $W 2 "segment 1: ctx_start 100, expected 0" \
    "UPDATE segments SET start_kind='fresh' WHERE traj_id=$R1 AND seg_index=1"
# invariant 2: steps contiguous from 1; step 0 in segment 0; turns in committed segments;
# every turn with its response fields but the failed last turn of a 'partial' segment
case_ first_step0 $W 2 "segment 0 must be fresh at token 0, step 1" \
    "UPDATE segments SET first_step=2 WHERE traj_id=$R1 AND seg_index=0"
case_ first_step1 $W 2 "segment 1: first_step 3 != 4" \
    "UPDATE segments SET last_step=3 WHERE traj_id=$R1 AND seg_index=0"
case_ step0_segment $W 2 "the turn of step 0 belongs to segment 1, not 0" \
    "UPDATE turns SET seg_index=1 WHERE traj_id=$R1 AND step_index=0"
case_ turn_orphan $W 2 "1 turns belong to no committed segment" \
    "UPDATE turns SET seg_index=7 WHERE traj_id=$R1 AND step_index=3"
case_ turn_context $W 2 "step 3 \(call_seq 3\): the turn lacks its context" \
    "UPDATE turns SET context=NULL WHERE traj_id=$R1 AND step_index=3"
case_ turn_reward $W 2 "step 3 \(call_seq 3\): the turn lacks its reward" \
    "UPDATE turns SET reward=NULL WHERE traj_id=$R1 AND step_index=3"
case_ turn_call $W 2 "step 3 \(call_seq 99\): the turn lacks its call_seq's env_calls row" \
    "UPDATE turns SET call_seq=99 WHERE traj_id=$R1 AND step_index=3"
case_ turn_incomplete $W 2 "step 3 \(call_seq 3\): the turn lacks its complete response" \
    "UPDATE env_calls SET response_complete=0 WHERE traj_id=$R1 AND call_seq=3"
case_ partial_not_last $W 2 "run1/g1/r2 step 3 \(call_seq 3\): the turn lacks its context" \
    "UPDATE turns SET context=NULL WHERE traj_id=$R2 AND step_index=3"
# the failed last turn of the partial segment (no response fields) is mkstore's own: no error;
# nor that of an action_too_large trajectory, whose action was never sent (spec/aep.md 12.1)
case_ too_large $W 0 "0 errors" \
    "UPDATE turns SET context=NULL, reward=NULL WHERE traj_id=$R1 AND step_index=6;
     UPDATE trajectories SET status='truncated', end_cause='action_too_large' WHERE traj_id=$R1"
# invariant 3: counters
case_ n_tokens $W 2 "counters \(segments 3, tokens 301, action 150\) differ" \
    "UPDATE trajectories SET n_tokens=301 WHERE traj_id=$R1"
case_ n_segments $W 2 "counters \(segments 2, tokens 300" \
    "UPDATE trajectories SET n_segments=2 WHERE traj_id=$R1"
case_ n_action $W 2 "action 1\) differ from its segments" \
    "UPDATE trajectories SET n_action_tokens=1 WHERE traj_id=$R1"
case_ n_turns $W 2 "n_turns 5 but 6 turns stored" \
    "UPDATE trajectories SET n_turns=5 WHERE traj_id=$R1"
case_ versions $W 2 "version range 3..9 differs from its segments' 3..4" \
    "UPDATE trajectories SET max_version=9 WHERE traj_id=$R1"
# invariant 4: running without outcome rows (end_cause and finished_at_ms: the table's CHECKs)
case_ running_outcome shards/w2.sqlite 2 "run1/g3/r0 is running but has outcome rewards" \
    "INSERT INTO rewards(traj_id, level, scope_index, component, value)
     SELECT traj_id, 'outcome', 0, '@derived', 1.0 FROM trajectories WHERE traj_uid='run1/g3/r0'"
# invariant 5: complete => last segment 'end' and an outcome @derived value
case_ last_end $W 2 "run1/g1/r1 is complete but its last segment does not end 'end'" \
    "UPDATE segments SET end_cause='token_budget' WHERE traj_id=$R1 AND seg_index=2"
case_ no_derived $W 2 "run1/g1/r1 is complete without an outcome '@derived' value" \
    "DELETE FROM rewards WHERE traj_id=$R1 AND level='outcome' AND component='@derived'"
case_ null_derived $W 2 "run1/g1/r1 is complete without an outcome '@derived' value" \
    "UPDATE rewards SET value=NULL WHERE traj_id=$R1 AND level='outcome' AND component='@derived'"
# invariant 6: masked => last segment 'partial' or 'end'
case_ masked_last $W 2 "run1/g1/r2 is masked \(SANDBOX_LOST\) but its last segment ends 'token_budget'" \
    "UPDATE segments SET end_cause='token_budget' WHERE traj_id=$R2 AND seg_index=1"
# invariant 7: blobs (section 5.3), LOSS_MASK against the action ranges, VERSIONS <= newest
case_ blob_kind $W 2 "segment 1 column tokens: blob kind VERSIONS \(4\), expected TOKENS" \
    "UPDATE segments SET tokens=versions WHERE traj_id=$R1 AND seg_index=1"
case_ blob_crc $W 2 "segment 1 column logprobs: blob LOGPROBS payload CRC mismatch" \
    "UPDATE segments SET logprobs=CAST(substr(logprobs,1,64)||zeroblob(400) AS BLOB)
     WHERE traj_id=$R1 AND seg_index=1"
case_ loss_mask $W 2 "segment 1: loss_mask disagrees with the turns' action ranges" \
    "UPDATE turns SET act_tok_end=149 WHERE traj_id=$R1 AND step_index=3"
case_ newest_version catalog.sqlite 2 "version tag 4 is newer than the newest policy version 3" \
    "DELETE FROM policy_versions WHERE version >= 4"
# 13.5 item 2: meta consistency (shard_id against the catalog's registration)
case_ meta_shard_id $W 2 "meta.shard_id is 2 but the catalog registers the file as shard 1" \
    "UPDATE meta SET value='2' WHERE key='shard_id'"
case_ meta_states_shard_id shards/w1.states.sqlite 2 \
    "w1.states.sqlite: meta.shard_id is 2 but the catalog registers the file as shard 1" \
    "UPDATE meta SET value='2' WHERE key='shard_id'"
# 13.5 item 6: group_members against the shards
case_ member_lost catalog.sqlite 2 \
    "group member run1/g1/r3 is complete in the catalog but shard 1 holds no such trajectory" \
    "INSERT INTO group_members VALUES (1, 3, 0, 'run1/g1/r3', 1, 1099511627790, 'complete')"
case_ member_running catalog.sqlite 0 "warning: catalog.sqlite: group member run1/g1/r3 \(running\)" \
    "INSERT INTO group_members VALUES (1, 3, 0, 'run1/g1/r3', 1, 1099511627790, 'running')"
# 13.5 item 7: the ledger
case_ consumed_unplanned catalog.sqlite 2 "consumed group 2 is not in exactly one committed update" \
    "UPDATE task_groups SET status='consumed', consumed_update=0 WHERE group_id=2"

[ "$fails" = 0 ] || { echo "$fails failures" >&2; exit 1; }
echo "test_verify_invariants: all passed"
