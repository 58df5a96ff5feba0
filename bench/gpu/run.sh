#!/bin/sh
# bench/gpu/run.sh: the CUDA backend's GPU checks and benchmark (issue 9), on a machine with an
# NVIDIA GPU (H200, sm_90).  Finishes within 3 minutes after the build.
#
#   bench/gpu/run.sh [--quick] [--tests]
#
#   --tests  first run the parity tests labelled gpu (ctest -L gpu; needs the full CMake build),
#            then the CI experiment with its rollout and learner on the GPU
#   --quick  small sizes (smoke run of a few seconds)
# Environment: BUILD (build directory, default build-gpu), PYTHON (interpreter with torch for
# the PyTorch baselines; default: the first of python3, /usr/bin/python3 that imports torch).
#
# PACK=FILE: take every program from an archive of bench/gpu/pack.sh (made where the project
# builds) instead of building, for a GPU machine that lacks the CPU-side libraries (the lent
# H200: carry .gpu-pack and run `PACK=.gpu-pack/pack.tar.xz bash bench/gpu/run.sh --tests`);
# the shared libraries the pack does not hold (CUDA's) are searched for in CUDA's and Python's
# usual folders.  Without PACK: the normal CMake build of the project (Release, CUDA found).
# If configuring fails (the machine lacks a CPU-side dependency such as jansson or OpenBLAS),
# bench_gpu alone is compiled with nvcc from kernels/cuda/*.cu and core/{status,rng}.c (the
# tests then cannot run; checked where nvcc is, without a GPU: it links and exits 77).
# OUT=DIR (the lent machine's $OUT): results.txt and the logs are copied there after each step.
# Order: bench_gpu and the PyTorch baselines, bench_gpu_train (a summary of the ratios so far),
# then with --tests the parity tests, then the rest (the most wanted numbers first, should a
# time limit cut the run short).
# Output: each measurement, then a summary of ratios against the in-run baselines.  After
# bench_gpu, bench_gpu_model (bench/gpu/bench_model.c) times the mini config's whole forward on
# the GPU (policy/model_device.h) and reports its MFU against the in-run cuBLAS bf16 rate,
# bench_gpu_train (bench/gpu/bench_train.c) the MFU of a whole training step (forward, backward,
# AdamW on the device; policy/model_device_backward.h), bench_train --device cuda the learner on
# the GPU against its bare device entry points, and bench_rollout --device cuda the
# rollout worker's decode rate on the GPU against the bare device decode loop.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build-gpu}
quick=""
tests=0
usage="usage: $0 [--quick] [--tests]"
for a in "$@"; do
    case "$a" in
    --quick) quick=--quick ;;
    --tests) tests=1 ;;
    -h | --help)
        echo "$usage"
        echo
        echo "the CUDA backend's benchmark on an NVIDIA GPU: kernels against cuBLAS, PyTorch and"
        echo "copy bandwidth, the training step's MFU, then a summary of ratios against the"
        echo "baselines measured in the run (exit 77 without a GPU)"
        echo
        echo "  --quick   small sizes (a smoke run of a few seconds)"
        echo "  --tests   also the gpu-labelled parity tests and the CI experiment on the GPU"
        echo "environment: BUILD (default build-gpu), PYTHON, NVCC, PACK=FILE (bench/gpu/pack.sh's"
        echo "archive instead of a build), OUT=DIR (results and logs copied there)"
        exit 0
        ;;
    *) echo "run.sh: unknown option '$a'" >&2; echo "$usage" >&2; exit 2 ;;
    esac
done
# no GPU at all (no driver device, no nvidia-smi): say so before minutes of building
if ! ls /dev/nvidia* >/dev/null 2>&1 && ! [ -e /dev/dxg ] &&
    ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "run.sh: no NVIDIA GPU here (no /dev/nvidia*, no nvidia-smi); nothing measured" >&2
    exit 77
fi
jobs=$(nproc 2>/dev/null || echo 4)
tmp=${TMPDIR:-/tmp}
logs=$(mktemp -d "$tmp/arl-bench-gpu-XXXXXX") || {
    echo "run.sh: cannot create a log directory in $tmp (set TMPDIR to a writable directory)" >&2
    exit 1
}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
bench=""
pack=""
if [ -n "${PACK:-}" ]; then
    xz -dc "$PACK" | tar xf - -C "$logs" || { echo "run.sh: cannot unpack $PACK" >&2; exit 1; }
    pack=$logs/pack
    LD_LIBRARY_PATH=$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # what the loader still misses (CUDA's libraries outside its path): CUDA's, Python's folders
    for l in $(ldd "$pack"/bin/* 2>/dev/null | awk '$3 == "not" {print $1}' | sort -u); do
        f=$(find /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib /usr/local/nvidia /opt \
            /usr/lib /usr/local/lib -name "$l" 2>/dev/null | head -1)
        [ -n "$f" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$f") ||
            echo "run.sh: $l not found on this machine" >&2
    done
    export LD_LIBRARY_PATH
    # OpenMPI from the pack: its plugins, and MPI_Init of a lone process without a daemon
    export OMPI_MCA_mca_base_component_path=$pack/openmpi OMPI_MCA_ess_singleton_isolated=1
    bench=$pack/bin/bench_gpu
    # the build folder's layout, as the steps below find their programs there
    build=$logs/pack-build
    mkdir -p "$build/bench/gpu" "$build/bench/rollout" "$build/bench/train"
    for b in bench/gpu/bench_gpu_model bench/gpu/bench_gpu_train bench/rollout/bench_rollout \
        bench/train/bench_train agentrl; do
        ln -s "$pack/bin/$(basename "$b")" "$build/$b"
    done
elif cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
        >"$logs/configure.log" 2>&1 &&
    cmake --build "$build" --target bench_gpu -j"$jobs" >"$logs/build.log" 2>&1; then
    bench="$build/bench/gpu/bench_gpu"
else
    # every kernels/cuda/*.cu (NCCL left out), each into DIR/cu_NAME.o, two at a time: the
    # *_wgmma.cu files for sm_90a alone (Hopper's warpgroup products), as the CMake build does
    direct_cu() {
        for f in "$root"/kernels/cuda/*.cu; do
            n=$(basename "$f" .cu)
            case $n in
            *_wgmma) arch="--generate-code=arch=compute_90a,code=sm_90a -DARL_WGMMA_SM90A=1" ;;
            *) arch=-arch=sm_90 ;;
            esac
            # shellcheck disable=SC2086
            "$nvcc" -O3 -std=c++17 $arch -D_GNU_SOURCE -I"$root" -c "$f" -o "$1/cu_$n.o" &
            [ $(jobs -r | wc -l) -lt 2 ] || wait -n || return 1
        done
        while [ $(jobs -r | wc -l) -gt 0 ]; do wait -n || return 1; done
    }
    echo "run.sh: CMake build failed (see $logs/configure.log, $logs/build.log);" \
         "compiling bench_gpu directly with nvcc" >&2
    mkdir -p "$build"
    if cc -O2 -std=c11 -D_GNU_SOURCE -I"$root" -c "$root/core/status.c" -o "$build/status.o" \
            >"$logs/nvcc.log" 2>&1 &&
        cc -O2 -std=c11 -D_GNU_SOURCE -I"$root" -c "$root/core/rng.c" -o "$build/rng.o" \
            >>"$logs/nvcc.log" 2>&1 &&
        cc -O2 -std=c11 -D_GNU_SOURCE -I"$root" -c "$root/bench/gpu/bench_gpu.c" \
            -o "$build/bench_gpu.o" >>"$logs/nvcc.log" 2>&1 &&
        direct_cu "$build" >>"$logs/nvcc.log" 2>&1 &&
        "$nvcc" -arch=sm_90 "$build"/cu_*.o "$build/status.o" "$build/rng.o" \
            "$build/bench_gpu.o" -lcublas -lpthread -lm -o "$build/bench_gpu_direct" \
            >>"$logs/nvcc.log" 2>&1; then
        bench="$build/bench_gpu_direct"
    else
        echo "run.sh: nvcc build failed too:" >&2
        tail -30 "$logs/nvcc.log" >&2
        exit 1
    fi
    tests=0
fi

rc=0

save() { # results.txt and the logs to $OUT, if set: a run cut short still returns its numbers
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT" && cp "$logs"/*.log "$logs"/results.txt "$OUT"/ 2>/dev/null
    fi
    return 0
}

# bench_step PROGRAM SECONDS SKIP_KEY [ARGS]: bench/gpu/PROGRAM of the build (built if missing),
# its output added to the results; RESULT SKIP_KEY when it cannot be built
bench_step() {
    prog=$1 secs=$2 skip=$3
    shift 3
    echo "== $prog $*"
    if [ -x "$build/bench/gpu/$prog" ] ||
        cmake --build "$build" --target "$prog" -j"$jobs" >>"$logs/build.log" 2>&1; then
        # (the program's status through a file: a pipe's status is tee's)
        { ARL_SOURCE_DIR="$root" timeout "$secs" "$build/bench/gpu/$prog" "$@"
            echo $? >"$logs/step_exit"; } | tee -a "$res"
        case $(cat "$logs/step_exit") in
        0 | 77) ;;
        *) echo "$prog $* failed (exit $(cat "$logs/step_exit"))"; rc=1 ;;
        esac
    else
        echo "RESULT $skip=${prog}_not_built" | tee -a "$res"
    fi
    save
}

summary() { # the ratios of the RESULT lines so far
    awk -F'=' '/^RESULT /{ sub(/^RESULT /, "", $1); v[$1] = $2 }
END {
    f = "%-58s %s\n"
    printf f, "cuBLAS bf16 GEMM (denominator)", v["cublas_bf16_tflops"] " TFLOP/s"
    printf f, "device-to-device copy (denominator)", v["copy_gbps"] " GB/s"
    if (v["torch_kda_fwd_ms"] != "" && v["kda_fwd_ms"] > 0)
        printf f, "KDA chunk fwd speed-up vs PyTorch eager fp32 (>= 10x)", sprintf("%.2fx", v["torch_kda_fwd_ms"] / v["kda_fwd_ms"])
    else
        printf f, "KDA chunk fwd speed-up vs PyTorch eager fp32 (>= 10x)", "not measured (" v["torch_skip"] ")"
    printf f, "KDA chunk fwd time / minimal-bytes copy time (<= 12x)", v["kda_fwd_over_copy"] "x"
    printf f, "KDA (fwd+bwd) / fwd (<= 5x)", v["kda_fwdbwd_over_fwd"] "x"
    printf f, "MoE grouped GEMM / dense cuBLAS, fine 512x512 (>= 0.35)", v["moe_fine_ratio"]
    printf f, "MoE grouped GEMM / dense cuBLAS, coarse 2048x512 (>= 0.8)", v["moe_coarse_ratio"]
    printf f, "  the same on wgmma (sm_90a), fine / coarse", v["moe_fine_wgmma_ratio"] " / " v["moe_coarse_wgmma_ratio"]
    printf f, "  gate+up+GLU fused: speed-up over separate, fine / coarse", v["moe_fine_glu_fused_speedup"] " / " v["moe_coarse_glu_fused_speedup"]
    printf f, "  dH+GLU backward fused: speed-up, fine / coarse", v["moe_fine_glu_bwd_fused_speedup"] " / " v["moe_coarse_glu_bwd_fused_speedup"]
    printf f, "  training path (fp32 operands) fwd / dX / dW, fine", v["moe_fine_train_fwd_ratio"] " / " v["moe_fine_train_dx_ratio"] " / " v["moe_fine_train_wgrad_ratio"]
    printf f, "  training path (fp32 operands) fwd / dX / dW, coarse", v["moe_coarse_train_fwd_ratio"] " / " v["moe_coarse_train_dx_ratio"] " / " v["moe_coarse_train_wgrad_ratio"]
    printf f, "  training path (bf16 operands) dX / dW, fine / coarse", v["moe_fine_train_dx_bf16_ratio"] " / " v["moe_fine_train_wgrad_bf16_ratio"] ", " v["moe_coarse_train_dx_bf16_ratio"] " / " v["moe_coarse_train_wgrad_bf16_ratio"]
    printf f, "MoE routing plan, 896 experts top-16, over minimal-bytes copy", v["moe_plan_vs_copy"] "x (" v["moe_plan_ms"] " ms)"
    printf f, "embedding backward, d 7168, V 163840, over minimal-bytes copy", v["embed_bwd_over_copy"] "x (" v["embed_bwd_ms"] " ms)"
    printf f, "MLA decode 256K rows: split keys speed-up, time over one cache read", v["mla_decode_split_speedup"] "x, " v["mla_decode_over_read"] "x (" v["mla_decode_split_ms"] " ms)"
    printf f, "block-sparse MLA training 2048 queries, 64K rows: backward over forward", v["mla_sparse_bwd_over_fwd"] "x (" v["mla_sparse_fwd_ms"] " / " v["mla_sparse_bwd_ms"] " ms)"
    printf f, "dense GEMM 16384x1024x1024, fp32 / bf16 operands", sprintf("%s / %s TFLOP/s (rounding both operands %s ms)", v["dense_n1024_f32_bf16math_tflops"], v["dense_n1024_bf16_tflops"], v["dense_n1024_round_ms"])
    printf f, "dense GEMM 16384x4096x1024, fp32 / bf16 operands", sprintf("%s / %s TFLOP/s (rounding both operands %s ms)", v["dense_n4096_f32_bf16math_tflops"], v["dense_n4096_bf16_tflops"], v["dense_n4096_round_ms"])
    printf f, "short conv fwd / bwd time over minimal-bytes copy", v["conv_fwd_over_copy"] "x / " v["conv_bwd_over_copy"] "x"
    printf f, "RMSNorm / L2 norm / log-probs over minimal-bytes copy", v["rows_rmsnorm_over_copy"] "x / " v["rows_l2norm_over_copy"] "x / " v["rows_logprob_over_copy"] "x"
    if (v["torch_sdpa_tflops"] != "" && v["torch_sdpa_tflops"] > 0)
        printf f, "MLA prefill TFLOP/s / PyTorch SDPA bf16 (>= 0.5)", sprintf("%.3f (%.2f vs %.1f TFLOP/s; 16-query warps %.3f)", v["mla_tflops"] / v["torch_sdpa_tflops"], v["mla_tflops"], v["torch_sdpa_tflops"], v["mla_rows16_tflops"] / v["torch_sdpa_tflops"])
    else
        printf f, "MLA prefill TFLOP/s / PyTorch SDPA bf16 (>= 0.5)", "not measured (" v["torch_skip"] "); MLA " v["mla_tflops"] " TFLOP/s (16-query warps " v["mla_rows16_tflops"] ")"
    if (v["torch_sdpa_bwd_tflops"] != "" && v["torch_sdpa_bwd_tflops"] > 0)
        printf f, "MLA attention backward TFLOP/s / PyTorch SDPA backward", sprintf("%.3f (%.2f vs %.1f TFLOP/s; fp32 kernels %.2f)", v["mla_bwd_tflops"] / v["torch_sdpa_bwd_tflops"], v["mla_bwd_tflops"], v["torch_sdpa_bwd_tflops"], v["mla_bwd_fp32_tflops"])
    else
        printf f, "MLA attention backward TFLOP/s / PyTorch SDPA backward", "not measured (" v["torch_skip"] "); MLA " v["mla_bwd_tflops"] " TFLOP/s"
    if (v["model_fwd_bf16_mfu"] != "")
        printf f, "mini forward MFU vs in-run cuBLAS bf16 (step target >= 25%)", sprintf("%.1f%% bf16 weights (%s ms), %.1f%% bf16 GEMM inputs (%s ms), %.1f%% tf32 (%s ms); %s GFLOP", 100 * v["model_fwd_bf16w_mfu"], v["model_fwd_bf16w_ms"], 100 * v["model_fwd_bf16_mfu"], v["model_fwd_bf16_ms"], 100 * v["model_fwd_tf32_mfu"], v["model_fwd_tf32_ms"], v["model_fwd_gflop"])
    else
        printf f, "mini forward MFU vs in-run cuBLAS bf16", "not measured (" v["model_skip"] ")"
    if (v["train_step_bf16_mfu"] != "")
        printf f, "training step MFU of the mini config (>= 25%)", sprintf("%.1f%% bf16 GEMM inputs (%s ms), %.1f%% tf32 (%s ms); %s GFLOP; AdamW alone caps it at %.0f%%", 100 * v["train_step_bf16_mfu"], v["train_step_bf16_ms"], 100 * v["train_step_tf32_mfu"], v["train_step_tf32_ms"], v["train_step_gflop"], 100 * v["train_step_bf16_mfu_bound_adamw"])
    else
        printf f, "training step MFU of the mini config (>= 25%)", "not measured (" v["train_skip"] ")"
    if (v["train_step_bf16w_mfu"] != "")
        printf f, "  the same with bf16 weight copies", sprintf("%.1f%% (%s ms)", 100 * v["train_step_bf16w_mfu"], v["train_step_bf16w_ms"])
    if (v["train_step_bf16w_T16384_mfu"] != "")
        printf f, "  with copies at 16 x 1024 tokens (a learner batch)", sprintf("%.1f%% (%s ms); %s GFLOP; AdamW alone caps it at %.0f%%", 100 * v["train_step_bf16w_T16384_mfu"], v["train_step_bf16w_T16384_ms"], v["train_step_T16384_gflop"], 100 * v["train_step_bf16w_T16384_mfu_bound_adamw"])
}' "$res"
}

res="$logs/results.txt"
echo "== bench_gpu $quick"
{ timeout 150 "$bench" $quick; echo "bench_exit=$?" >"$logs/bench_exit"; } | tee "$res"
brc=$(sed 's/bench_exit=//' "$logs/bench_exit")
if [ "$brc" = 77 ]; then
    echo "run.sh: no CUDA device here; nothing measured"
    rm -rf "$logs"
    exit 77
fi
[ "$brc" = 0 ] || { echo "bench_gpu exited $brc"; rc=1; }

save

py=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if [ -n "$p" ] && "$p" -c "import torch" >/dev/null 2>&1; then py=$p; break; fi
done
echo "== PyTorch baselines ($py)"
if [ -n "$py" ]; then
    timeout 120 "$py" "$root/bench/gpu/torch_ref.py" $quick | tee -a "$res"
else
    echo "RESULT torch_skip=no_python_with_torch" | tee -a "$res"
fi

save

# one training step (policy/model_device_backward.h) of the mini config: its MFU
# shellcheck disable=SC2086
bench_step bench_gpu_train 150 train_skip $quick
echo "== summary so far"
summary

if [ "$tests" = 1 ] && [ -n "$pack" ]; then
    echo "== parity tests (the pack's gpu-labelled tests, as ctest runs them)"
    while read -r name exe args; do
        # shellcheck disable=SC2086
        (cd "$root" && ARL_SOURCE_DIR="$root" ARL_BIN="$pack/bin/agentrl" OMPI_ALLOW_RUN_AS_ROOT=1 \
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$pack/bin/$exe" $args </dev/null \
            >"$logs/$name.log" 2>&1)
        trc=$?
        case $trc in
        0) echo "passed  $name" ;;
        77) echo "skipped $name" ;;
        *) echo "FAILED  $name (exit $trc)"; tail -20 "$logs/$name.log"; rc=1 ;;
        esac
    done <"$pack/manifest"
fi
if [ "$tests" = 1 ] && [ -z "$pack" ]; then
    echo "== parity tests (ctest -L gpu)"
    cmake --build "$build" --target test_cuda_ops test_cuda_model_ops test_cuda_nccl \
        test_cuda_select test_cuda_model_device test_cuda_model_device_cpu test_cuda_train_ops \
        test_cuda_model_train test_cuda_model_train_cpu test_cuda_model_train_state \
        test_cuda_model_sparse test_rollout_device_cuda \
        test_learner_device_cuda agentrl \
        -j"$jobs" >>"$logs/build.log" 2>&1 || { echo "test build failed"; rc=1; }
    (cd "$build" && ctest -L gpu --output-on-failure --timeout 120) || rc=1
fi
save

# the bf16 step on a model keeping bf16 weight copies (the experts' GEMMs on bf16 operands);
# then at a learner batch of 16 x 1024 tokens: AdamW's fixed time caps the MFU of the
# 2048-token step near 30%, this batch's at about 8x that
# shellcheck disable=SC2086
bench_step bench_gpu_train 150 train_skip --bf16-weights $quick
[ -z "$quick" ] && bench_step bench_gpu_train 150 train_skip --docs 16 --len 1024 --bf16-weights

# the whole-model forward (policy/model_device.h) of the mini config vs the in-run cuBLAS rate
# shellcheck disable=SC2086
bench_step bench_gpu_model 120 model_skip $quick

if [ "$tests" = 1 ]; then
    # the CI experiment with its rollout and its learner on the GPU
    echo "== agentrl train experiments/calculator-ci.json --set rollout.device=cuda --set learner.device=cuda"
    (cd "$root" && timeout 300 "$build/agentrl" train experiments/calculator-ci.json \
        --set out="$logs/train-cuda" --set rollout.device=cuda --set learner.device=cuda \
        >"$logs/train-cuda.log" 2>&1) &&
        tail -3 "$logs/train-cuda.log" || { tail -20 "$logs/train-cuda.log"; rc=1; }
fi

save

# the rollout worker on the GPU (rollout.device cuda) against the bare device decode loop, wall
# time, batch 16 (bench/rollout/bench_rollout.c --device cuda)
echo "== bench_rollout --device cuda --batch 16 --quick"
if [ -x "$build/bench/rollout/bench_rollout" ] ||
    cmake --build "$build" --target bench_rollout -j"$jobs" >>"$logs/build.log" 2>&1; then
    ARL_SOURCE_DIR="$root" timeout 120 "$build/bench/rollout/bench_rollout" --device cuda \
        --batch 16 --quick 2>/dev/null || { echo "bench_rollout failed"; rc=1; }
else
    echo "bench_rollout not built"
fi


# the learner on the GPU (learner.device cuda) against the bare device training entry points,
# wall time (bench/train/bench_train.c --device cuda; its rollout runs on the CPU)
echo "== bench_train --device cuda --reps 2"
if [ -x "$build/bench/train/bench_train" ] ||
    cmake --build "$build" --target bench_train -j"$jobs" >>"$logs/build.log" 2>&1; then
    (cd "$root" && timeout 150 "$build/bench/train/bench_train" --device cuda --reps 2 \
        2>/dev/null) || { echo "bench_train failed"; rc=1; }
else
    echo "bench_train not built"
fi

save

echo "== summary (ratios against baselines measured in this run)"
summary
echo "(logs and raw results: $logs)"
exit $rc
