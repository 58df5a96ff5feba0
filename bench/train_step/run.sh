#!/bin/sh
# bench/train_step/run.sh: the training-step benchmark in one command.
#
# Builds bench_train_step (in $BUILD) and runs it: it writes a tiny checkpoint
# (arl_params_init --seed) and a packed batch, has the PyTorch baseline
# (bench/train_step/torch_train.py, /usr/bin/python3) verify itself against the C step (loss,
# every gradient, one AdamW step), then times C and PyTorch training steps alternately and
# prints tokens/s, their ratio (target >= 2x) and the peak memory of both.  Without torch it
# prints the C numbers only.  1.2-2 minutes on 2 shared cores (load 6-13) with the defaults.
# Exit status: bench_train_step's (0 done, 1 failure or failed check, 2 usage), or the build's.
#
# Usage: bench/train_step/run.sh [bench_train_step options]    e.g. --rounds 6 --threads 1
# Environment: BUILD (build dir, default build-bench), OPENBLAS_CORETYPE (passed through; when
#   unset, the PyTorch process gets a core type matching the CPU if OpenBLAS misdetects it).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target bench_train_step -j2 >/dev/null
cd "$ROOT"
exec "$BUILD/bench/train_step/bench_train_step" "$@"
