#!/usr/bin/env bash
# GPU verification and measurements of l3-cuda on a machine with an NVIDIA GPU, the CUDA toolkit (nvcc,
# compute-sanitizer, ncu), Python with torch/torchvision/Pillow, and NO cargo: runs what build-gpu-bin.sh
# built elsewhere and carried in l3-cuda/gpu-bin/ (see README.md, "Checking on a GPU machine").
# Run from the repository root:
#     bash l3-cuda/gpu-check.sh [OUT_DIR] [STEP...]
# Steps (default: tests memcheck racecheck synccheck):
#   tests      every test binary: the GPU tests (tests/gpu.rs), the CPU simulation (src/sim_tests.rs), and
#              the loader's device-resident batches against its CPU batches (loader/tests/gpu.rs)
#   python     the Python package's tests on the GPU (device batches into torch and JAX through DLPack),
#              from the carried wheel, in a virtual environment that sees the machine's torch and JAX
#   memcheck   the GPU tests under compute-sanitizer memcheck (out-of-bounds, misaligned, leaks)
#   racecheck  ... racecheck (shared-memory races; the corpus-sized tests are left to memcheck)
#   synccheck  ... synccheck (barrier misuse)
#   bench      `l3 bench decode --gpu` on the corpus (if the l3 binary was built)
#   prepare    the measurement data set: corpus scaled to HD/FHD/UHD as PNG and JPEG q90 (in $L3_DATA)
#   kernel     device-resident kernel speed vs a D2D copy, NHWC u8 and NCHW f16 (target >= 40 %)
#   ncu        one Nsight Compute report of the sample kernel (FHD, NCHW f16), to see what limits it
#   fig7a      Figure 7(a): L3 on the GPU and on the CPU cores, PNG on the CPU cores, JPEG on nvJPEG
#   overlap    ResNet-50 step with L3 batches decoding alongside vs a synthetic tensor (target <= +5 %)
# Writes one log per step to OUT_DIR (default: $OUT if set, else /tmp/l3-gpu-check) and prints a summary.
# $L3_DATA (default /tmp/l3-data) keeps the prepared data between calls while the machine stays up.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/l3-cuda/gpu-bin"
SCRIPTS="$ROOT/l3-cuda/scripts"
OUT_DIR=${1:-${OUT:-/tmp/l3-gpu-check}}
shift || true
STEPS=${*:-tests memcheck racecheck synccheck}
DATA=${L3_DATA:-/tmp/l3-data}
mkdir -p "$OUT_DIR"
export L3_CUDA_DIR="$ROOT/l3-cuda"
for d in "$ROOT/../shared/corpus" "$ROOT/shared/corpus"; do
    if [ -d "$d" ]; then export L3_CORPUS="$d"; break; fi
done
echo "corpus: ${L3_CORPUS:-NOT FOUND (corpus tests will skip)}; steps: $STEPS"
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
    grep -h "test result:\|ERROR SUMMARY" "$OUT_DIR/$name.log" | sed 's/^/   /'
}
sanitizer() { # tool, "sanitizer options", "test-binary options" (each word-split)
    local tool=$1
    if command -v compute-sanitizer >/dev/null; then
        # shellcheck disable=SC2086
        step "$tool" compute-sanitizer --tool "$tool" --error-exitcode 3 $2 "$BIN/gpu" --test-threads=1 $3
    else
        echo "compute-sanitizer not found: $tool skipped"; status=1
    fi
}
need_data() {
    [ -d "$DATA/fhd" ] || { echo "no data in $DATA: run the prepare step first"; status=1; return 1; }
}

for s in $STEPS; do
    case "$s" in
    tests)
        step tests-gpu "$BIN/gpu" --test-threads=1 --nocapture
        step tests-lib "$BIN/l3_cuda" --test-threads=4 --nocapture
        step tests-loader "$BIN/loader_gpu" --test-threads=1 --nocapture ;;
    python)
        if ls "$BIN"/wheels/*.whl >/dev/null 2>&1; then
            venv="$OUT_DIR/venv"
            python3 -m venv --system-site-packages "$venv" &&
                "$venv/bin/pip" install --no-deps --no-index "$BIN"/wheels/*.whl >"$OUT_DIR/pip.log" 2>&1
            if "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
                step python "$venv/bin/python" -m pytest -q -rs "$ROOT/bindings/python/tests/test_frameworks.py" \
                    "$ROOT/bindings/python/tests/test_loader.py"
            else
                echo "python skipped: no pytest on this machine"
            fi
        else
            echo "python skipped: no wheel in $BIN/wheels"
        fi ;;
    memcheck) sanitizer memcheck "--leak-check full" "" ;;
    # racecheck and synccheck are slow: the corpus-sized tests are left to memcheck.
    racecheck) sanitizer racecheck "--racecheck-report all" "--skip corpus" ;;
    synccheck) sanitizer synccheck "" "--skip corpus" ;;
    bench)
        if [ -x "$BIN/l3" ] && [ -n "${L3_CORPUS:-}" ]; then
            step bench "$BIN/l3" bench decode --gpu "$L3_CORPUS"; cat "$OUT_DIR/bench.log"
        else
            echo "bench skipped: no l3 binary or no corpus"
        fi ;;
    prepare)
        step prepare python3 "$SCRIPTS/prepare_data.py" "${L3_CORPUS:?no corpus}" "$DATA"
        cat "$OUT_DIR/prepare.log" ;;
    kernel)
        need_data && { step kernel "$BIN/fig7a" "$DATA" --what kernel --json "$OUT_DIR/l3.jsonl"
            cat "$OUT_DIR/kernel.log"; } ;;
    ncu)
        need_data && step ncu ncu --kernel-name regex:l3_samples --launch-skip 2 --launch-count 1 \
            --set full -o "$OUT_DIR/l3_samples_fhd_nchw_f16" -f \
            "$BIN/fig7a" "$DATA" --what kernel --res fhd --min-secs 0 --json "$OUT_DIR/ncu.jsonl" ;;
    fig7a)
        need_data && {
            step fig7a-l3 "$BIN/fig7a" "$DATA" --what gpu,cpu --json "$OUT_DIR/l3.jsonl"
            step fig7a-peers python3 "$SCRIPTS/fig7a_peers.py" "$DATA" --json "$OUT_DIR/peers.jsonl" \
                --l3-json "$OUT_DIR/l3.jsonl"
            cat "$OUT_DIR/fig7a-l3.log" "$OUT_DIR/fig7a-peers.log"
        } ;;
    overlap)
        need_data && { step overlap python3 "$SCRIPTS/overlap.py" "$DATA/fhd" --lib "$BIN/libl3_ctypes.so" \
            --json "$OUT_DIR/overlap.jsonl"; cat "$OUT_DIR/overlap.log"; } ;;
    *) echo "unknown step $s"; status=1 ;;
    esac
done
exit $status
