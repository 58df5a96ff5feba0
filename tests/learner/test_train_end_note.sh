#!/bin/sh
# tests/learner/test_train_end_note.sh: a SIGTERM that reaches `agentrl train` after its failure
# was said adds no "interrupted ... Continue with ... --resume" note.  Under mpirun the launcher
# ends the job's last processes with SIGTERM once one rank has exited non-zero, and rank 0, still
# finishing, printed that note: after a refused setting (rank 1 started with another --set, a
# missing init) the only advice shown, and a wrong one (nothing saved, a resume fails again);
# after a full disk a second, contradicting note.  The SIGTERM comes from a shim ($1) at
# MPI_Finalize, where mpirun's reaches rank 0.  Skipped (77) in a build without MPI.
set -u
bin="${ARL_BIN:?ARL_BIN is not set}"
src="${ARL_SOURCE_DIR:-.}"
shim="${1:?the finalize-SIGTERM shim is not given}"
ldd "$bin" 2> /dev/null | grep -q libmpi || { echo "SKIP: agentrl is built without MPI"; exit 77; }
tmp=$(mktemp -d /tmp/arl-test-train-end-note-XXXXXX)
fail() { echo "FAIL: $*"; echo "(output kept in $tmp)"; exit 1; }
exp="$src/experiments/calculator-ci.json"
run() { # run LOG ARGS...: train under the shim, its exit status checked (143: the SIGTERM)
    log=$1
    shift
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        ARL_TEST_TERM_AT_FINALIZE=1 LD_PRELOAD="$shim" "$bin" train "$exp" --set progress=off \
        --set threads=1 "$@" > "$log" 2>&1
    rc=$?
    [ "$rc" -eq 143 ] || { tail -3 "$log"; fail "$log: exit $rc, 143 expected (the shim's SIGTERM missed)"; }
}
# a refused setting: its error, and no advice to resume
run "$tmp/init.log" --set "out=$tmp/a" --set "init=$tmp/none"
grep -q "^agentrl: error: key 'init': .*no checkpoint there" "$tmp/init.log" || { tail -3 "$tmp/init.log"; fail "missing init: not refused"; }
grep -q "interrupted\|--resume" "$tmp/init.log" && { tail -4 "$tmp/init.log"; fail "missing init: a note to resume after the refusal"; }
# a failure that continuing gets past (sft/ a file in the way): its note once, not a second
mkdir "$tmp/b" && : > "$tmp/b/sft"
run "$tmp/io.log" --set "out=$tmp/b"
n=$(grep -c "continue with" "$tmp/io.log")
[ "$n" -eq 1 ] || { tail -6 "$tmp/io.log"; fail "sft/ a file: $n notes to continue, 1 expected"; }
grep -q "interrupted" "$tmp/io.log" && { tail -6 "$tmp/io.log"; fail "sft/ a file: an 'interrupted' note after the failure's"; }
rm -rf "$tmp"
echo "ok"
