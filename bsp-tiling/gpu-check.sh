#!/usr/bin/env bash
# GPU verification of bsp-tiling on a machine with an NVIDIA GPU and NO cargo: runs the test binaries and the
# bench built elsewhere and carried in bsp-tiling/gpu-bin/ (build-gpu-bin.sh). From the repository root:
#     bash bsp-tiling/gpu-check.sh [OUT_DIR] [bench]
# Writes one log per step to OUT_DIR (default: $OUT if set, else /tmp/bsp-gpu-check) and prints a summary.
# With `bench` it also runs `l3-bench bsp` (what `cargo xtask bench bsp` runs) (GPU rows, the PyTorch peer where torch is installed) at the
# sizes in L3_BSP_SIZES (default 2048,4096,8192,10000,16384, GPU only unless L3_BSP_DEVICES says otherwise).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/bsp-tiling/gpu-bin"
OUT_DIR=${1:-${OUT:-/tmp/bsp-gpu-check}}
mkdir -p "$OUT_DIR"
export BSP_TILING_DIR="$ROOT/bsp-tiling"
export BSP_SHARED_DIR="$BIN/shared"
export L3_CORPUS="$BIN/shared/corpus"
# libnvrtc / libcublas from pip wheels (nvidia-cuda-nvrtc, nvidia-cublas) where no toolkit is installed.
for d in "$ROOT"/.whl/*/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
         /usr/local/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | tee "$OUT_DIR/gpu.txt"
command -v nvcc >/dev/null && nvcc --version | tail -2 | tee -a "$OUT_DIR/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" 2>&1 | tail -1 | tee -a "$OUT_DIR/gpu.txt"

status=0
step() { # name, command...
    local name=$1; shift
    echo "== $name"
    local t0=$SECONDS
    if "$@" >"$OUT_DIR/$name.log" 2>&1; then
        echo "   ok ($((SECONDS - t0)) s)"
    else
        echo "   FAILED ($((SECONDS - t0)) s): tail of $OUT_DIR/$name.log"; tail -30 "$OUT_DIR/$name.log"; status=1
    fi
    grep -h "skipping" "$OUT_DIR/$name.log" | sort | uniq -c | sed 's/^/   /'
    grep -h "test result:" "$OUT_DIR/$name.log" | sed 's/^/   /'
}

# 1. The GPU tests (op by op, tiled vs whole in f32 and f16 with the figures printed, budgets, every mode),
#    the library's unit tests (NVRTC compiles the kernels for every architecture), the CPU simulation of the
#    kernels, and the engine on the simulated device and on the CPU.
step tests-gpu "$BIN/gpu" --test-threads=1 --nocapture
grep -hE "GPU tiled|f16 GEMM|budget [0-9]|GPU vs CPU" "$OUT_DIR/tests-gpu.log" | sed 's/^/   /'
step tests-lib "$BIN/bsp_tiling" --test-threads=2 --nocapture
step tests-kernel-sim "$BIN/kernel_sim" --test-threads=2
step tests-device-sim "$BIN/device_sim" --test-threads=2 --nocapture
step tests-exact "$BIN/exact" --test-threads=2

# 2. The GPU tests under compute-sanitizer: out-of-bounds and misaligned accesses, shared-memory races.
if command -v compute-sanitizer >/dev/null; then
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
        "$BIN/gpu" --test-threads=1 --skip gpu_tiled_equals_whole_f32 --skip gpu_f16_error_measured
    step racecheck compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
        "$BIN/gpu" --test-threads=1 gpu_ops_match_cpu_backend
else
    echo "compute-sanitizer not found: sanitizer runs skipped"
fi

# 3. The figures.
if [ "${2:-}" = bench ]; then
    export L3_BSP_SIZES=${L3_BSP_SIZES:-2048,4096,8192,10000,16384}
    export L3_BSP_DEVICES=${L3_BSP_DEVICES:-cuda}
    export L3_BSP_SCRATCH=${L3_BSP_SCRATCH:-/tmp/bsp-bench-scratch}
    export L3_BSP_TORCH_PEER="$ROOT/bsp-tiling/benches/torch_peer.py"
    step bench "$BIN/l3-bench" bsp
    report=$(grep -o 'wrote [^ ]*bsp.md' "$OUT_DIR/bench.log" | head -1 | cut -d' ' -f2)
    if [ -n "$report" ]; then cp "$report" "$(dirname "$report")"/bsp-*.svg "$OUT_DIR/" 2>/dev/null; cat "$OUT_DIR/bsp.md"; fi
fi
exit $status
