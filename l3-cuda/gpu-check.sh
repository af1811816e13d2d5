#!/usr/bin/env bash
# GPU verification of l3-cuda on a machine with an NVIDIA GPU, the CUDA toolkit (nvcc, compute-sanitizer)
# and NO cargo: runs test binaries and the `l3` binary built elsewhere and carried in l3-cuda/gpu-bin/
# (see README.md, "Checking on a GPU machine"). Run from the repository root:
#     bash l3-cuda/gpu-check.sh [OUT_DIR]
# Writes logs to OUT_DIR (default: $OUT if set, else /tmp/l3-gpu-check) and prints a summary.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/l3-cuda/gpu-bin"
OUT_DIR=${1:-${OUT:-/tmp/l3-gpu-check}}
mkdir -p "$OUT_DIR"
export L3_CUDA_DIR="$ROOT/l3-cuda"
for d in "$ROOT/../shared/corpus" "$ROOT/shared/corpus"; do
    if [ -d "$d" ]; then export L3_CORPUS="$d"; break; fi
done
echo "corpus: ${L3_CORPUS:-NOT FOUND (corpus tests will skip)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT_DIR/gpu.txt"
command -v nvcc >/dev/null && nvcc --version | tail -2 | tee -a "$OUT_DIR/gpu.txt"

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
    grep -h "skipping:" "$OUT_DIR/$name.log" | sort | uniq -c | sed 's/^/   /'
    grep -h "test result:" "$OUT_DIR/$name.log" | sed 's/^/   /'
}

# 1. Every test binary as built (GPU tests + the CPU simulation of the kernel + error paths).
step tests-gpu "$BIN/gpu" --test-threads=1 --nocapture
step tests-lib "$BIN/l3_cuda" --test-threads=2 --nocapture

# 2. The GPU tests under compute-sanitizer: out-of-bounds / misaligned accesses, and shared-memory races.
if command -v compute-sanitizer >/dev/null; then
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full \
        "$BIN/gpu" --test-threads=1
    # racecheck is slow: the corpus test (full-size UHD/5K images) is left to memcheck.
    step racecheck compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
        "$BIN/gpu" --test-threads=1 --skip gpu_corpus
    step synccheck compute-sanitizer --tool synccheck --error-exitcode 3 \
        "$BIN/gpu" --test-threads=1 --skip gpu_corpus
else
    echo "compute-sanitizer not found: sanitizer runs skipped"; status=1
fi

# 3. The benchmark (corpus scaled to HD, FHD, UHD).
if [ -n "${L3_CORPUS:-}" ]; then
    step bench "$BIN/l3" bench decode --gpu "$L3_CORPUS"
    cat "$OUT_DIR/bench.log"
fi
exit $status
