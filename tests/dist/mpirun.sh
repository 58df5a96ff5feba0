#!/bin/sh
# tests/dist/mpirun.sh MPIEXEC NP PROGRAM ARGS...: run PROGRAM on NP ranks of this machine.
# Exits 77 (skipped) when mpirun is missing.  --oversubscribe: more ranks than cores (CI has
# 2); --bind-to none and mpi_yield_when_idle: ranks that share cores yield instead of
# spinning while they wait.  Root is allowed through OMPI_ALLOW_RUN_AS_ROOT* (set by ctest).
mpiexec="$1"
np="$2"
shift 2
case "$mpiexec" in
  ""|*NOTFOUND*) mpiexec=mpirun ;;
esac
if ! command -v "$mpiexec" >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (install openmpi-bin to run the MPI tests)"
  exit 77
fi
exec "$mpiexec" -np "$np" --oversubscribe --tag-output --bind-to none --mca mpi_yield_when_idle 1 "$@"
