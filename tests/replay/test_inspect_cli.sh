#!/bin/bash
# What a user inspecting a store meets (README "Rollout and the replay store", spec/replay.md 13):
#  - a store in a folder this user cannot write (another user's store, or a sealed store copied
#    read-only, spec/replay.md 2.3: no -wal or -shm files beside its WAL-mode catalog) is read by
#    list, show, stats, verify and export; the commands that write it fail with exit 1 naming
#    the permissions, and no file of it changes;
#  - `show` prints the control characters of stored text (an ESC sequence, CR, BEL in a model's
#    or an environment's text) as U+FFFD, as `replay view` does, so that they cannot rewrite the
#    terminal; tab and newline stay.
# As root, the read-only part runs the readers as user nobody (setpriv), else it is skipped.
set -u
A=${ARL_BIN:?ARL_BIN must name build/agentrl}
MK=${ARL_BUILD_DIR:?}/tests/replay/replay_mkstore
PY=/usr/bin/python3
T=$(mktemp -d /tmp/arl-test-inspect-XXXXXX)
chmod 755 "$T"
S=$T/store
. "$(dirname "$0")/expect.sh" # fail, expect, has; $fails
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }

"$MK" "$S" >/dev/null || { echo "FAIL: replay_mkstore"; exit 1; }

# --- show's --turns and --rescore choose rows and columns of the --tokens table: without it a
# usage error (they were ignored); --turns naming no step says so (no table was all it printed)
expect 2 "$A" replay show "$S" run1/g1/r0 --turns 2:3
has "error: --turns chooses the rows of the --tokens table: add --tokens"
expect 2 "$A" replay show "$S" run1/g1/r0 --rescore x
has "error: --rescore chooses the columns of the --tokens table: add --tokens"
expect 0 "$A" replay show "$S" run1/g1/r0 --tokens --turns 20:
has "no token rows: --turns 20: names no step of this trajectory (steps 1..9)"
expect 0 "$A" replay show "$S" run1/g1/r0 --tokens --turns 2:3
grep -q "no token rows" <<<"$out" && fail "--turns 2:3 said no token rows: $out"

# --- show --tokens has the text of each token (spec/replay.md 13.2's "decoded text" column): a
# special's name, a byte quoted
"$A" model init tiny "$T/ckpt" --seed 1 >/dev/null 2>&1 || fail "model init"
"$A" rollout --ckpt "$T/ckpt" --out "$T/ro" --env builtin:calculator --tasks 1 --group-size 1 \
    --max-turns 1 --turn-tokens 8 --progress-s 0 >/dev/null 2>&1 || fail "rollout"
expect 0 "$A" replay show "$T/ro" rollout/g000000/r0 --tokens
has "pos      token text             mask version"
has "^ *0 *256 <|bos|>  *0 "
has "^ *2 *115 's'  *0 "
rm -rf "$T/ro" "$T/ckpt"

# --- a store's shards/ folder or one shard file given instead of the store: read, with a warning
# naming the store root (without the catalog, environments are only ids)
expect 0 "$A" replay list "$S/shards"
has "warning: replay: $S/shards is the shards folder of the store $(realpath "$S"), read without its catalog"
expect 0 "$A" replay stats "$S/shards/w1.sqlite"
has "warning: replay: $S/shards/w1.sqlite is a shard file of the store $(realpath "$S"), read without"
expect 0 "$A" replay list "$S"
grep -q "warning" <<<"$out" && fail "a warning for the store root itself: $out"

# --- a uid given in part: the error names the trajectories whose uids hold it
expect 1 "$A" replay show "$S" g1/r2
has "no trajectory 'g1/r2'; did you mean run1/g1/r2?"
expect 1 "$A" replay show "$S" r0
has "did you mean run1/g1/r0, run1/g1/r0#fork1, run1/g2/r0, run1/g3/r0?"
expect 1 "$A" replay show "$S" nosuch
has "no trajectory 'nosuch' (a trajectory is named by its whole uid"

# --- a shard file of a newer schema that this build cannot read (a newer agentrl wrote it into
# the store): list and stats leave its trajectories out with a warning, as they say, and the
# error of a command that needs it names the file by its path
N=$T/newer
cp -a "$S" "$N"
"$PY" -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE meta SET value='9' WHERE key='min_reader_version'\"); c.commit()" "$N/shards/t3.sqlite" || fail "editing t3's meta"
expect 0 "$A" replay list "$N"
has "warning: shards/t3.sqlite cannot be read (replay: $N/shards/t3.sqlite: schema version 1 (readable by version 9 and newer)"
has "run1/g1/r0 .*complete"
grep -q "fork1" <<<"$(grep -v warning <<<"$out")" && fail "list showed a trajectory of the unreadable file: $out"
expect 0 "$A" replay stats "$N"
has "6 trajectories in 2 files"
expect 1 "$A" replay show "$N" "run1/g1/r0#fork1"
has "$N/shards/t3.sqlite: schema version 1 (readable by version 9 and newer) cannot be read"
rm -rf "$N"

# --- show: control characters of stored text as U+FFFD (tab and newline kept)
"$PY" - "$S/shards/w1.sqlite" <<'EOF' || fail "editing a turn's content"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("UPDATE turns SET action_json = json_set(action_json, '$.content', "
          "'A' || char(27) || '[2J' || char(13) || 'B' || char(7) || char(9) || 'C' || "
          "char(10) || 'D' || char(155) || 'E') WHERE traj_id = 1099511627776 AND step_index = 1")
c.commit()
EOF
expect 0 "$A" replay show "$S" run1/g1/r0
has $'content: A\xef\xbf\xbd\\[2J\xef\xbf\xbdB\xef\xbf\xbd\tC'
has $'^             D\xef\xbf\xbdE$'
LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out" && fail "show printed a control character"
# the same through the viewer's renderer: equal text
out2=$("$A" replay show "$S" run1/g1/r0 --tokens 2>&1)
LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out2" && fail "show --tokens printed a control character"

# --- a read-only store
if [ "$(id -u)" = 0 ]; then
    RUN="setpriv --reuid=65534 --regid=65534 --clear-groups"
    command -v setpriv >/dev/null && $RUN test -x "$A" || RUN=skip
else
    RUN=""
fi
if [ "$RUN" = skip ]; then
    echo "SKIP: read-only part (root without setpriv, or $A not reachable by nobody)"
else
    expect 0 "$A" replay recover "$S" --mask
    expect 0 "$A" replay seal "$S"
    R=$T/readonly
    cp -a "$S" "$R"
    rm -f "$R"/*-wal "$R"/*-shm "$R"/shards/*-wal "$R"/shards/*-shm
    chmod -R a+rX,a-w "$R"
    before=$(sums "$R")
    expect 0 $RUN "$A" replay list "$R"
    has "run1/g1/r2 .*masked .*SANDBOX_LOST"
    expect 0 $RUN "$A" replay show "$R" run1/g1/r0 --tokens
    has "trajectory run1/g1/r0"
    expect 0 $RUN "$A" replay stats "$R"
    has "7 trajectories"
    # (it finds the content edited above, which the stored request lacks: exit 2)
    expect 2 $RUN "$A" replay verify "$R"
    has "7 trajectories: 1 errors"
    expect 0 $RUN "$A" replay export "$R" --full
    [ "$(grep -c '"format":"agentrl.trajectory/1"' <<<"$out")" = 7 ] || fail "export: $out"
    for cmd in "pin $R run1/g1/r0" "gc $R" "seal $R" "recover $R --mask" "migrate $R"; do
        # shellcheck disable=SC2086
        expect 1 $RUN "$A" replay $cmd
        has "not writable"
    done
    [ "$(sums "$R")" = "$before" ] || fail "a file of the read-only store changed"
    chmod -R u+w "$R"
fi

rm -rf "$T"
[ "$fails" = 0 ] && echo "PASS" || { echo "$fails failure(s)"; exit 1; }
