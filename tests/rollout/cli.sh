#!/bin/sh
# tests/rollout/cli.sh: `agentrl rollout` end to end on the calculator built-in, then the store's
# own checks: `agentrl replay verify` (exit 0), `agentrl replay rescore` (every action token's
# behaviour log-probability recomputed from the cached states - state_cache all keeps those of
# finished trajectories - within 1e-3 nats: fp32 rounding
# of other batch compositions, spec/policy.md 16.4), `agentrl replay fork`, a restart on the same
# shard that finds nothing left to do, and usage errors (exit 2); `replay rescore --rewards`
# (the stored rewards reproduced exactly by replay, the rows visible to show and verify).
set -u
BIN=${ARL_BIN:-build/agentrl}
[ -x "$BIN" ] || { echo "no $BIN (build the agentrl target)"; exit 77; }
T=$(mktemp -d /tmp/arl-test-rollout-cli-XXXXXX)
fail() { echo "FAIL: $*"; exit 1; }
# term_when PID LOG PATTERN: SIGTERM to PID once LOG holds PATTERN (15 s at most), then wait for
# it: true when it ended by that signal (exit 143); its status in rc
term_when() {
    k=0
    while ! grep -q "$3" "$2" && [ $k -lt 300 ]; do sleep 0.05; k=$((k + 1)); done
    kill -TERM "$1"
    wait "$1"; rc=$?
    [ $rc -eq 143 ]
}
"$BIN" model init tiny "$T/ckpt" --seed 3 >/dev/null 2>&1 || fail "model init"
cat > "$T/exp.json" <<'JSON'
{"learner": {"ignored": "by rollout"},
 "rollout": {"env": "calculator", "group_size": 2, "turn_tokens": 24, "segment_tokens": 1024,
             "observation_tokens": 512, "context_tokens": 4096, "trajectory_tokens": 4096,
             "max_turns": 3, "batch_size": 4, "progress_s": 0, "state_cache": "all"}}
JSON
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 --shard 1 > "$T/out" 2> "$T/err" \
    || { cat "$T/err"; fail "rollout"; }
grep -q "trajectories  4 (complete" "$T/out" || { cat "$T/out"; fail "summary"; }
grep -q "success rate" "$T/out" || fail "summary: success rate"
grep -q "group-size *= 2" "$T/err" || fail "resolved config not printed"
# an environment that cannot be reached: exit 1, an error naming it once, no summary of nothing
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-gone" --tasks 1 --env http://127.0.0.1:9 \
    > "$T/out-gone" 2> "$T/err-gone"
[ $? -eq 1 ] || { cat "$T/err-gone"; fail "unreachable env: exit 1 expected"; }
[ "$(grep -o "127.0.0.1:9" "$T/err-gone" | wc -l)" -eq 2 ] || { cat "$T/err-gone"; fail "unreachable env: the error should name it once (and the resolved config once)"; }
grep -q "rollout summary" "$T/out-gone" && fail "unreachable env: a summary of nothing printed"
# a run that could not start leaves no new store behind (an existing one stays as it was)
[ -e "$T/db-gone" ] && fail "unreachable env: an empty store left behind"
"$BIN" rollout "$T/exp.json" --ckpt "$T/no-such-ckpt" --out "$T/db-nockpt" --tasks 1 > /dev/null 2>&1
[ $? -eq 1 ] && [ ! -e "$T/db-nockpt" ] || fail "missing checkpoint: exit 1 and no store expected"
# --tasks too many to list: exit 1 naming it, no crash (freed a task list it never made), no
# store; 0 without a task file: a usage error (exit 2, was 1 after loading the model)
# (under AddressSanitizer, a failed allocation returns NULL as it does without it)
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-huge" --tasks 99999999999 > /dev/null 2> "$T/err-huge"
[ $? -eq 1 ] && grep -q "error: rollout: tasks 99999999999: out of memory for the task list" "$T/err-huge" \
    && [ ! -e "$T/db-huge" ] || { tail -2 "$T/err-huge"; fail "--tasks 99999999999: exit 1, a message, no store"; }
# --context-tokens too large for memory: the model's message names max_context (it said
# "max_tokens 2048; lower it") and the key; no store
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-huge" --tasks 1 \
    --context-tokens 999999999999 --trajectory-tokens 999999999999 > /dev/null 2> "$T/err-huge"
[ $? -eq 1 ] && grep -q "(max_context 999999999999, the longest context attended over, and max_tokens [0-9]*; lower them); max_context is the rollout's context-tokens (999999999999)" "$T/err-huge" \
    && [ ! -e "$T/db-huge" ] || { tail -2 "$T/err-huge"; fail "--context-tokens 999999999999: exit 1, a message, no store"; }
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-huge" --tasks 0 > /dev/null 2> "$T/err-huge"
[ $? -eq 2 ] && grep -q "error: key 'tasks' must be >= 1" "$T/err-huge" && [ ! -e "$T/db-huge" ] \
    || { tail -2 "$T/err-huge"; fail "--tasks 0: exit 2 expected"; }
# --out a file, or a store's shards/ folder: exit 2 naming it, nothing written (a file was
# reported as a damaged database; the shards folder got a second store made inside it)
: > "$T/a-file"
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/a-file" --tasks 1 > /dev/null 2> "$T/err-out"
[ $? -eq 2 ] && grep -q "error: replay: $T/a-file: not a directory" "$T/err-out" \
    || { tail -2 "$T/err-out"; fail "--out a file: exit 2 expected"; }
ls "$T/db/shards" > "$T/shards-before"
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db/shards" --tasks 1 > /dev/null 2> "$T/err-out"
[ $? -eq 2 ] && grep -q "error: replay: $T/db/shards: holds store files (.*) but no catalog.sqlite" "$T/err-out" \
    || { tail -2 "$T/err-out"; fail "--out a shards folder: exit 2 expected"; }
ls "$T/db/shards" | cmp -s - "$T/shards-before" || fail "--out a shards folder: it was written to"
# the same rule for every writer of a store (replay_store_open with REPLAY_OPEN_CREATE): import
echo '{}' > "$T/none.jsonl"
"$BIN" replay import "$T/db/shards" "$T/none.jsonl" > /dev/null 2> "$T/err-out"
[ $? -eq 2 ] && grep -q "error: replay: $T/db/shards: holds store files" "$T/err-out" \
    || { tail -2 "$T/err-out"; fail "import into a shards folder: exit 2 expected"; }
ls "$T/db/shards" | cmp -s - "$T/shards-before" || fail "import into a shards folder: it was written to"
# a checkpoint with other weights for the version a stored run records: refused before a shard
# is written (its trajectories joined the run's groups as samples of the recorded weights)
"$BIN" model init tiny "$T/ckpt2" --seed 4 >/dev/null 2>&1 || fail "model init ckpt2"
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt2" --out "$T/db" --tasks 3 > /dev/null 2> "$T/err-w"
[ $? -eq 1 ] && grep -q "error: rollout: run uid 'rollout' of the store records policy version 0 as the weights of .*/ckpt (sha256 [0-9a-f]*...), but .*/ckpt2 holds other weights" "$T/err-w" \
    || { tail -2 "$T/err-w"; fail "other weights for a recorded version: exit 1 and the message"; }
ls "$T/db/shards" | cmp -s - "$T/shards-before" || fail "other weights: a shard was written"
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify"; }
"$BIN" replay rescore "$T/db" rollout/g000000/r0 rollout/g000001/r1 --ckpt "$T/ckpt" --json > "$T/rescore" \
    || fail "rescore"
awk -F'"max_abs":' '{ split($2, a, ","); if (a[1] + 0 > 1e-3 || index($0, "\"action_tokens\":0,")) bad = 1 }
     END { exit bad }' "$T/rescore" || { cat "$T/rescore"; fail "rescore mismatch"; }
# --rewards (spec/replay.md 13.6): replaying the stored actions against the same built-in
# reproduces every stored reward exactly (no differing row, max |diff| 0); the rows land in a
# tool file (source rescore:<label>) that verify accepts and show lists; with --ckpt both
"$BIN" replay rescore "$T/db" rollout/g000000/r0 --rewards --label audit --json > "$T/rw" 2> "$T/rwerr" \
    || { cat "$T/rwerr"; fail "rescore --rewards"; }
grep -q '"differing":\[\]' "$T/rw" && grep -q '"rows_written":[1-9]' "$T/rw" \
    && ! grep -o '"max_abs":[^,}]*' "$T/rw" | grep -qv '"max_abs":0\.0$' \
    && ! grep -q '"mismatched_responses":[1-9]' "$T/rw" \
    || { cat "$T/rw"; fail "rescore --rewards drift"; }
"$BIN" replay rescore "$T/db" rollout/g000001/r1 --rewards --ckpt "$T/ckpt" > "$T/rw2" 2>&1 \
    || { cat "$T/rw2"; fail "rescore --rewards --ckpt"; }
grep -q "process: [1-9][0-9]* rows compared, 0 differ" "$T/rw2" || { cat "$T/rw2"; fail "rewards report"; }
"$BIN" replay show "$T/db" rollout/g000000/r0 | grep -q "@rescore:audit" || fail "show: re-scored rewards"
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify after --rewards"; }
# an environment that cannot be reached: exit 1, a message naming it; no --ckpt, no --rewards: 2
"$BIN" replay rescore "$T/db" rollout/g000000/r0 --rewards --env http://127.0.0.1:9 --label gone \
    > /dev/null 2> "$T/rwerr"
[ $? -eq 1 ] && grep -q "127.0.0.1:9" "$T/rwerr" || { cat "$T/rwerr"; fail "unreachable env: exit 1"; }
"$BIN" replay show "$T/db" rollout/g000000/r0 | grep -q "@rescore:gone" && fail "unreachable env wrote rows"
"$BIN" replay rescore "$T/db" rollout/g000000/r0 > /dev/null 2>&1; [ $? -eq 2 ] || fail "no --ckpt: exit 2"
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 --ckpt "$T/ckpt" --experiment "$T/exp.json" \
    --count 2 > "$T/fork" 2>&1 || { cat "$T/fork"; fail "fork"; }
grep -q "rollout/g000000/r0/f1.1" "$T/fork" || fail "fork ids"
# the fork's summary counts what the forks stored, as `replay list` shows them (it added the
# parent's prefix to the tokens and turns, not to the segments)
sum_tok=$(sed -n 's/^  mean length *\([0-9.]*\) tokens, \([0-9.]*\) turns.*/\1 \2/p' "$T/fork")
list_tok=$("$BIN" replay list "$T/db" --forks-of rollout/g000000/r0 --json |
    sed 's/.*"turns":\([0-9]*\),.*"tokens":\([0-9]*\),.*/\2 \1/' |
    awk '{ k += $1; u += $2; n++ } END { if (n) printf "%.1f %.1f\n", k / n, u / n }')
[ "$sum_tok" = "$list_tok" ] || fail "fork summary: mean tokens and turns '$sum_tok', the stored forks' '$list_tok'"
# show of a fork says where its prefix is (the parent's segments, not copied)
"$BIN" replay show "$T/db" rollout/g000000/r0/f1.0 > "$T/show-fork" 2>&1 || { cat "$T/show-fork"; fail "show of a fork"; }
grep -qF "its segments 0..0 are the parent's: agentrl replay show $T/db rollout/g000000/r0" "$T/show-fork" ||
    { head -5 "$T/show-fork"; fail "show of a fork: no pointer to its prefix"; }
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify after fork"; }
# without --experiment the forks take their run's settings from the store (environment, budgets)
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 --ckpt "$T/ckpt" > "$T/fork2" 2>&1 \
    || { cat "$T/fork2"; fail "fork with the run's settings"; }
grep -q "rollout/g000000/r0/f1.2" "$T/fork2" || { cat "$T/fork2"; fail "a second fork: ids after the first ones"; }
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify after the second fork"; }
# without --ckpt: the checkpoint the store records for the run's newest version (the rollout's
# own, version 0), said first; a version the run does not have is refused, naming its newest
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 > "$T/fork3" 2>&1 \
    || { cat "$T/fork3"; fail "fork with the run's newest version"; }
head -1 "$T/fork3" | grep -q "^policy: version 0 of the parent's run, .*/ckpt$" \
    || { cat "$T/fork3"; fail "fork names the policy it took"; }
grep -q "rollout/g000000/r0/f1.3" "$T/fork3" || { cat "$T/fork3"; fail "the third fork's id"; }
if "$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 --version 3 > "$T/fork4" 2>&1; then
    fail "fork --version 3 of a run with version 0 only"
fi
grep -q "records no policy version 3 (its newest is 0)" "$T/fork4" || { cat "$T/fork4"; fail "fork --version 3: the message"; }
# a copied run: the store records the checkpoint's absolute path, which is gone; the checkpoint
# at the same place relative to the store is taken, with a note (the fork refused: "saved at
# .../ckpt, which is not there"); one whose weights are not the version's is refused
mkdir -p "$T/moved" && cp -a "$T/db" "$T/moved/db" && cp -a "$T/ckpt" "$T/moved/ckpt"
mv "$T/ckpt" "$T/ckpt.away"
"$BIN" replay fork "$T/moved/db" rollout/g000000/r0 --segment 1 --count 1 > "$T/fork6" 2> "$T/err6" \
    || { cat "$T/err6"; mv "$T/ckpt.away" "$T/ckpt"; fail "fork of a copied run"; }
grep -q "note: fork: policy version 0 of run rollout was saved at .*/ckpt, which is not there; taking $T/moved/ckpt, at the same place relative to the store" \
    "$T/err6" || { cat "$T/err6"; mv "$T/ckpt.away" "$T/ckpt"; fail "fork of a copied run: the note"; }
head -1 "$T/fork6" | grep -q "^policy: version 0 of the parent's run, $T/moved/ckpt$" \
    || { cat "$T/fork6"; mv "$T/ckpt.away" "$T/ckpt"; fail "fork of a copied run: the policy named"; }
rm -rf "$T/moved/ckpt" && "$BIN" model init tiny "$T/moved/ckpt" --seed 4 > /dev/null 2>&1
"$BIN" replay fork "$T/moved/db" rollout/g000000/r0 --segment 1 --count 1 > /dev/null 2> "$T/err6"
[ $? -eq 1 ] && grep -q "is not policy version 0 of run rollout (its weights are no version the run recorded)" \
    "$T/err6" || { cat "$T/err6"; mv "$T/ckpt.away" "$T/ckpt"; fail "fork of a copied run, other weights there: exit 1 and a refusal"; }
rm -rf "$T/moved/ckpt"
"$BIN" replay fork "$T/moved/db" rollout/g000000/r0 --segment 1 --count 1 > /dev/null 2> "$T/err6"
rc=$?
mv "$T/ckpt.away" "$T/ckpt"
[ $rc -eq 1 ] && grep -q "which is not there (moved or deleted?), nor at the same place relative to the store; give --ckpt DIR" \
    "$T/err6" || { cat "$T/err6"; fail "fork of a copied run without its checkpoint: the message"; }
# fork usage: --env is not required (the run's is used) and rollout keys a fork does not use
# are not offered and are refused by name; --segment 0 says what is wrong with it; nothing runs
"$BIN" replay fork --help > "$T/fork-help" 2>&1 || fail "fork --help"
grep -q "^  --env .*(required)" "$T/fork-help" && fail "fork --help: --env marked required"
grep -qE "^  --(tasks|group-size|run-uid) " "$T/fork-help" && fail "fork --help offers keys it ignores"
for k in "--tasks 2" "--group-size 3" "--run-uid=other"; do
    # shellcheck disable=SC2086
    "$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 $k > "$T/fork5" 2>&1
    [ $? -eq 2 ] || { cat "$T/fork5"; fail "fork $k: exit 2 expected"; }
    grep -q "error: ${k%%[ =]*}: a rollout key that replay fork does not use" "$T/fork5" \
        || { cat "$T/fork5"; fail "fork $k: the message"; }
done
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 0 > "$T/fork5" 2>&1
[ $? -eq 2 ] || { cat "$T/fork5"; fail "fork --segment 0: exit 2 expected"; }
grep -q "error: --segment 0: S must be >= 1 (the prefix keeps segments 0..S-1)" "$T/fork5" \
    || { cat "$T/fork5"; fail "fork --segment 0: the message"; }
# a fork into an existing training group is refused before anything is written
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 --group-uid rollout/g000001 > "$T/fork5" 2>&1
[ $? -eq 2 ] || { cat "$T/fork5"; fail "fork into a training group: exit 2 expected"; }
grep -q "group 'rollout/g000001' already exists as a 'train' group" "$T/fork5" \
    || { cat "$T/fork5"; fail "fork into a training group: the message"; }
"$BIN" replay list "$T/db" --group rollout/g000001 | grep -q "/f1\." && fail "a fork joined a training group"
# SIGTERM during a fork: the note says how to mask the forks left running (a tool file's
# trajectories are continued by no worker)
"$BIN" replay fork "$T/db" rollout/g000000/r0 --segment 1 --count 400 > /dev/null 2> "$T/err-fork" &
term_when $! "$T/err-fork" "forked at step" || fail "fork SIGTERM: exit $rc, 143 expected"
grep -qxF "  $BIN replay recover $T/db --mask" "$T/err-fork" ||
    { tail -3 "$T/err-fork"; fail "fork SIGTERM: no recover command"; }
"$BIN" replay recover "$T/db" --mask > /dev/null 2>&1 || fail "recover --mask after the fork"
"$BIN" replay list "$T/db" --status running | grep -q "^rollout/" && fail "forks left running after recover --mask"
# a restart on the same shard: every group is final, nothing runs again
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 --shard 1 > "$T/out2" 2>/dev/null \
    || fail "restart"
grep -q "trajectories  0 " "$T/out2" || { cat "$T/out2"; fail "restart reran finished groups"; }
# a rerun into a new shard continues the run too, and says so; a run with the same run uid and
# other tasks or group size is refused before it writes anything (it added its trajectories to
# the stored groups of other tasks, or left its own tasks unsampled, silently)
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 > "$T/out3" 2> "$T/err-re" \
    || { cat "$T/err-re"; fail "rerun"; }
grep -q "run uid 'rollout': 4 of the 4 trajectories of its 2 tasks are in the store already (a rerun continues the run; masked ones stay masked, a new run-uid samples their tasks again): 0 to sample" \
    "$T/err-re" || { cat "$T/err-re"; fail "rerun: no note of the stored trajectories"; }
n_files=$(ls "$T/db/shards" | wc -l)
for k in "--task-seed 5" "--group-size 3" "--group-kind eval"; do
    # shellcheck disable=SC2086
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 $k > /dev/null 2> "$T/err-re"
    [ $? -eq 1 ] || { cat "$T/err-re"; fail "rerun $k: exit 1 expected"; }
    grep -q "error: rollout: the store already holds group 'rollout/g000000' (run uid 'rollout').*differs.*give this run its own --run-uid" \
        "$T/err-re" || { cat "$T/err-re"; fail "rerun $k: the message"; }
    [ "$(ls "$T/db/shards" | wc -l)" -eq "$n_files" ] || fail "rerun $k: a shard was written"
done
# ... and so is one that samples, budgets or scores otherwise (it joined the run's groups with its
# own temperature or turn budget, silently); threads and batch size may change
for k in "--temperature 0.5" "--max-turns 2" "--seed 3"; do
    # shellcheck disable=SC2086
    "$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 3 $k > /dev/null 2> "$T/err-re"
    [ $? -eq 1 ] || { cat "$T/err-re"; fail "rerun $k: exit 1 expected"; }
    key=${k#--}
    grep -q "error: rollout: run uid 'rollout' of the store was sampled with other settings (${key%% *} .* -> ${key#* }): .*give this one its own --run-uid" \
        "$T/err-re" || { cat "$T/err-re"; fail "rerun $k: the message"; }
    [ "$(ls "$T/db/shards" | wc -l)" -eq "$n_files" ] || fail "rerun $k: a shard was written"
done
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --tasks 2 --threads 1 --batch-size 1 \
    > /dev/null 2> "$T/err-re" || { cat "$T/err-re"; fail "rerun with other threads and batch size"; }
"$BIN" replay verify "$T/db" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify after the reruns"; }
# two workers of one run uid started together over the same tasks share them: each trajectory is
# begun once, by the worker that claims its group member first (both wrote every one, each in
# its own shard, the catalog mirroring the later)
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-two" --tasks 4 > /dev/null 2> "$T/err-a" &
pa=$!
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-two" --tasks 4 > /dev/null 2> "$T/err-b" \
    || { cat "$T/err-b"; fail "the second of two workers"; }
wait $pa || { cat "$T/err-a"; fail "the first of two workers"; }
"$BIN" replay list "$T/db-two" --json > "$T/two" || fail "list of two workers' store"
[ "$(grep -c '"traj_uid"' "$T/two")" -eq 8 ] && [ "$(grep -o '"traj_uid":"[^"]*"' "$T/two" | sort -u | wc -l)" -eq 8 ] \
    || { cat "$T/two"; fail "two workers: 8 distinct trajectories expected"; }
"$BIN" replay verify "$T/db-two" > "$T/verify" 2>&1 || { cat "$T/verify"; fail "verify of two workers' store"; }
# SIGTERM once it writes: the note names the command that continues it, with the shard it
# wrote (in place of --shard 0, a new one); that command leaves no trajectory running
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-term" --shard 0 --tasks 4 > /dev/null 2> "$T/err-term" &
term_when $! "$T/err-term" "writing shard" || fail "SIGTERM: exit $rc, 143 expected"
grep -qxF "  $BIN rollout $T/exp.json --ckpt $T/ckpt --out $T/db-term --tasks 4 --shard 1" "$T/err-term" ||
    { tail -3 "$T/err-term"; fail "SIGTERM: no continue command with the shard"; }
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-term" --tasks 4 --shard 1 > /dev/null 2>&1 ||
    fail "the continue command failed"
"$BIN" replay list "$T/db-term" --status running | grep -q "^rollout/" && fail "trajectories left running"
# every trajectory masked (the calculator refuses the task data): exit 1, the store named in the
# error, and the way out is a new run uid, not --shard (a rerun samples nothing: masked stays)
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-masked" --tasks 1 \
    --task-data '{"bogus": 1}' > /dev/null 2> "$T/err-masked"
[ $? -eq 1 ] || { cat "$T/err-masked"; fail "all masked: exit 1 expected"; }
grep -q "every finished trajectory (2) was masked.*replay list $T/db-masked --status masked" \
    "$T/err-masked" || { cat "$T/err-masked"; fail "all masked: the error should name the store"; }
grep -q "Masked trajectories stay masked: .* under a new run uid (--run-uid NAME)" "$T/err-masked" \
    || { cat "$T/err-masked"; fail "all masked: no note on a new run uid"; }
grep -q "continue with" "$T/err-masked" && { cat "$T/err-masked"; fail "all masked: a continue command that samples nothing"; }
# every trajectory masked because the first prompt does not fit the segment budget: the error
# says which settings to raise (they are the run's, not the environment's)
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-obs" --tasks 1 --segment-tokens 400 \
    --observation-tokens 300 > /dev/null 2> "$T/err-obs"
[ $? -eq 1 ] || { cat "$T/err-obs"; fail "first prompt too long: exit 1 expected"; }
grep -q "most: OBSERVATION_TOO_LONG, 2).*first observation must fit rollout.segment-tokens less rollout.turn-tokens" \
    "$T/err-obs" || { cat "$T/err-obs"; fail "first prompt too long: no hint naming the budgets"; }
# more tasks asked for than the task file holds: all of them run, and it says so
printf '{"id": "a", "seed": 1}\n{"id": "b", "seed": 2}\n' > "$T/two-tasks.jsonl"
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db-tf" --task-file "$T/two-tasks.jsonl" \
    --tasks 5 --group-size 1 --max-turns 1 > /dev/null 2> "$T/err-tf" || { cat "$T/err-tf"; fail "task file"; }
grep -q "warning: rollout: tasks 5, but task-file .*two-tasks.jsonl holds 2: all of them are run" "$T/err-tf" \
    || { cat "$T/err-tf"; fail "task file shorter than --tasks: no warning"; }
# usage errors
"$BIN" rollout "$T/exp.json" --out "$T/db" > /dev/null 2>&1; [ $? -eq 2 ] || fail "missing --ckpt: exit 2"
"$BIN" rollout "$T/exp.json" --ckpt "$T/ckpt" --out "$T/db" --bogus 1 > /dev/null 2>&1
[ $? -eq 2 ] || fail "unknown option: exit 2"
echo '{"rollout": {"env": "calculator", "segment_tokens": 100}}' > "$T/bad.json"
"$BIN" rollout "$T/bad.json" --ckpt "$T/ckpt" --out "$T/db2" > /dev/null 2> "$T/err3"
[ $? -eq 2 ] && grep -q "segment-tokens" "$T/err3" || { cat "$T/err3"; fail "budget check"; }
rm -rf "$T"
echo "ok"
