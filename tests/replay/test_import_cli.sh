#!/bin/bash
# `agentrl replay import` of lines that are not what `export --full` of this build writes, and
# imports that stop part way (spec/replay.md section 13.3):
#  - a row key that is not a column of the table (1 MB long, or text that would change the
#    INSERT statement, or a column of another store version) is refused naming the key; the
#    keys made the statement's column list (a 4 KiB buffer overrun, and SQL from the file);
#  - a line refused in its shard rows leaves no run, task or group of its own in the catalog;
#  - a line of another format version (or without "format") is refused, not imported as v1;
#  - a line with a key twice is refused (jansson took the last copy);
#  - a FILE that cannot be read to its end (a directory) is an error, not "imported 0";
#  - a failed import into a new store leaves no empty store behind;
#  - SIGTERM between a line's commit and the catalog's mirror of its trajectory waits for the
#    mirror (deferred); after a SIGKILL there, the import run again puts the mirror back (verify
#    warned "not in the catalog's group_members" for good before).
# Python (/usr/bin/python3) writes the altered lines and reads the catalog.
set -u
A=${ARL_BIN:?ARL_BIN must name build/agentrl}
MK=${ARL_BUILD_DIR:?}/tests/replay/replay_mkstore
SHIM_KILL=$ARL_BUILD_DIR/tests/replay/libarl_test_sqlkill_preload.so
PY=/usr/bin/python3
T=$(mktemp -d /tmp/arl-test-import-XXXXXX)
S=$T/store
. "$(dirname "$0")/expect.sh" # fail, expect, has; $fails
[ -x "$PY" ] || { echo "SKIP: no $PY"; exit 77; }
[ -f "$SHIM_KILL" ] || { echo "FAIL: no preload shim in $ARL_BUILD_DIR"; exit 1; }
"$MK" "$S" >/dev/null || { echo "FAIL: replay_mkstore"; exit 1; }
"$A" replay export "$S" --full --output "$T/a.jsonl" >/dev/null 2>&1 || { echo "FAIL: export"; exit 1; }

# mutate KIND: the first line of a.jsonl as a new trajectory (its uid and the uid of its learner
# records changed) with one alteration
mutate() {
    "$PY" - "$T/a.jsonl" "$1" <<'EOF'
import json, sys
line = open(sys.argv[1]).readline()
uid = json.loads(line)["traj_uid"]
j = json.loads(line.replace('"%s"' % uid, '"%s-x"' % uid))
t = j["rows"]["trajectories"][0]
kind = sys.argv[2]
if kind == "longkey":
    t["k" * (1 << 20)] = 1
elif kind == "inject":
    t["status) SELECT * FROM trajectories --"] = 1
elif kind == "othercol":
    j["rows"]["segments"][0]["n_tokens_v9"] = 1
elif kind == "newcat":
    # a run, task and group this store lacks, and a segments row it refuses
    c = j["rows"]["catalog"]
    c["runs"]["run_uid"] += "-x"
    c["tasks"]["seed"] = 987654321
    c["task_groups"]["group_uid"] += "-x"
    j["rows"]["segments"][0]["n_tokens_v9"] = 1
elif kind == "format2":
    j["format"] = "agentrl.trajectory/2"
elif kind == "noformat":
    del j["format"]
print(json.dumps(j, separators=(",", ":")))
EOF
}
# catalog SQL: one value
cat_q() { "$PY" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])" "$1/catalog.sqlite" "$2"; }

C=$T/copy
expect 0 "$A" replay import "$C" "$T/a.jsonl"
has "imported 7 trajectories"

# --- keys that are not columns: refused naming the key, nothing of the line stored
for kind in longkey inject othercol; do
    mutate $kind >"$T/$kind.jsonl" || fail "mutate $kind"
    expect 1 "$A" replay import "$C" "$T/$kind.jsonl"
    has "$kind.jsonl:1: rows\.[a-z_]*: '.*' is not a column of this store's table"
    has "imported 0 trajectories"
done
expect 0 "$A" replay verify "$C"
has "7 trajectories: 0 errors, 0 warnings"

# --- a line refused in its shard rows leaves none of its catalog rows (a new run, task and
# group were committed before the shard's rows were tried, and stayed)
cat_rows() { cat_q "$C" "SELECT (SELECT count(*) FROM runs) || ' ' || (SELECT count(*) FROM tasks) || ' ' || (SELECT count(*) FROM task_groups) || ' ' || (SELECT count(*) FROM updates)"; }
before=$(cat_rows)
mutate newcat >"$T/newcat.jsonl" || fail "mutate newcat"
expect 1 "$A" replay import "$C" "$T/newcat.jsonl"
has "newcat.jsonl:1: rows\.segments: 'n_tokens_v9' is not a column of this store's table"
[ "$(cat_rows)" = "$before" ] || fail "a refused line left catalog rows: runs tasks groups updates $before -> $(cat_rows)"
expect 0 "$A" replay verify "$C"
has "7 trajectories: 0 errors, 0 warnings"

# --- a key twice in a line: refused (jansson kept the last one, so the line's meaning depended
# on which copy a reader takes)
"$PY" -c 'import sys; l = open(sys.argv[1]).readline(); sys.stdout.write("{\"format\": \"agentrl.trajectory/1\", " + l[1:])' \
    "$T/a.jsonl" >"$T/dup.jsonl"
expect 1 "$A" replay import "$C" "$T/dup.jsonl"
has "dup.jsonl:1: not JSON: duplicate object key"
has "imported 0 trajectories"

# --- another format version, or none: refused
mutate format2 >"$T/f2.jsonl"
expect 1 "$A" replay import "$C" "$T/f2.jsonl"
has "f2.jsonl:1: format agentrl.trajectory/2: this build imports agentrl.trajectory/1 lines only"
mutate noformat >"$T/nf.jsonl"
expect 1 "$A" replay import "$C" "$T/nf.jsonl"
has "nf.jsonl:1: no \"format\" member"
expect 0 "$A" replay list "$C"
[ "$(grep -c -- '-x ' <<<"$out")" = 0 ] || fail "a refused line was imported: $out"

# --- a directory as FILE: an error, not an empty import
mkdir -p "$T/dir.jsonl"
expect 1 "$A" replay import "$C" "$T/dir.jsonl"
has "dir.jsonl: read error after line 0: Is a directory"

# --- a failed import into a new store leaves none behind (an empty one stayed), nor does a
# FILE that is not there (checked before the store is made); an existing empty folder stays
mutate format2 >"$T/f2.jsonl"
expect 1 "$A" replay import "$T/new1" "$T/f2.jsonl"
[ -e "$T/new1" ] && fail "a failed import left a new store: $(ls -R "$T/new1")"
expect 1 "$A" replay import "$T/new2" "$T/none.jsonl"
has "cannot read $T/none.jsonl: No such file"
[ -e "$T/new2" ] && fail "an import of a missing FILE made a store"
mkdir "$T/new3"
expect 1 "$A" replay import "$T/new3" "$T/f2.jsonl"
[ -d "$T/new3" ] && [ -z "$(ls -A "$T/new3")" ] || fail "a failed import into an empty folder: $(ls -A "$T/new3" 2>&1)"

# --- SIGTERM as the catalog's mirror of the first imported trajectory begins: the mirror is
# made, then the import stops (exit 143); verify finds the catalog whole
D=$T/term
ARL_TEST_KILL_SQL="INSERT INTO group_members" ARL_TEST_KILL_SIGNAL=15 LD_PRELOAD="$SHIM_KILL" \
    ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
    "$A" replay import "$D" "$T/a.jsonl" >"$T/out" 2>&1
rc=$?
[ $rc = 143 ] || { cat "$T/out"; fail "SIGTERM at the mirror: exit $rc, expected 143"; }
n=$(cat_q "$D" "SELECT count(*) FROM group_members")
[ "$n" = 1 ] || fail "SIGTERM at the mirror: $n group_members rows, expected 1 (the mirror was cut off)"
expect 0 "$A" replay verify "$D"
has "1 trajectories: 0 errors, 0 warnings"
expect 0 "$A" replay import "$D" "$T/a.jsonl"
has "imported 6 trajectories into $D (1 already there, the same: skipped)"
expect 0 "$A" replay verify "$D"
has "7 trajectories: 0 errors, 0 warnings"

# --- SIGKILL there (nothing can wait): the trajectory is committed without its mirror; the
# import run again puts the mirror back
K=$T/kill
ARL_TEST_KILL_SQL="INSERT INTO group_members" LD_PRELOAD="$SHIM_KILL" \
    ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" \
    "$A" replay import "$K" "$T/a.jsonl" >"$T/out" 2>&1
rc=$?
[ $rc = 137 ] || { cat "$T/out"; fail "SIGKILL at the mirror: exit $rc, expected 137"; }
expect 0 "$A" replay verify "$K"
has "not in the catalog's group_members"
expect 0 "$A" replay import "$K" "$T/a.jsonl"
has "imported 6 trajectories into $K (1 already there, the same: skipped)"
expect 0 "$A" replay verify "$K"
has "7 trajectories: 0 errors, 0 warnings"
"$A" replay export "$K" --full | cmp -s - "$T/a.jsonl" || fail "export of the re-run import differs"

if [ $fails = 0 ]; then
    rm -rf "$T"
    echo "1 passed, 0 failed"
    exit 0
fi
echo "0 passed, 1 failed ($fails checks; kept $T)"
exit 1
