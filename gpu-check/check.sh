#!/usr/bin/env bash
# GPU verification and measurements of the toolkit's CUDA code (l3-cuda's decoder, bsp-tiling's backend,
# cuda-setup, the loader's device batches) on a machine with an NVIDIA GPU, the CUDA toolkit (nvcc,
# compute-sanitizer, ncu), Python with torch/torchvision/Pillow, and NO cargo: runs what build.sh built
# elsewhere and carried in gpu-bin/l3/ and gpu-bin/bsp/ (either may be absent: its parts are skipped, and
# said so). Run from the repository root:
#     bash gpu-check/check.sh [OUT_DIR] [STEP...]
# Steps (default: tests memcheck racecheck synccheck):
#   tests      every test binary, the GPU tests included (they are #[ignore = "needs a CUDA GPU"] elsewhere,
#              here run with --include-ignored, so a GPU that cannot be used fails them): l3-cuda's GPU
#              tests and CPU simulation (+ NVRTC on the real toolkit), cuda-setup's, the loader's
#              device-resident batches against its CPU batches; bsp-tiling's GPU tests (op by op, tiled vs
#              whole in f32 and f16 with the figures printed, budgets, every mode), library tests (NVRTC for
#              every architecture), the CPU simulation of its kernels, and the engine on the simulated
#              device and on the CPU
#   python     the Python package's tests on the GPU (device batches into torch and JAX through DLPack),
#              from the carried wheel, in a virtual environment that sees the machine's torch and JAX
#   memcheck   the GPU tests of both crates under compute-sanitizer memcheck (out-of-bounds, misaligned,
#              leaks; bsp-tiling's two largest tests left out)
#   racecheck  ... racecheck (shared-memory races; l3-cuda's corpus-sized tests left to memcheck,
#              bsp-tiling's op-by-op test)
#   synccheck  ... synccheck (barrier misuse; l3-cuda)
#   bench      `l3 bench decode --gpu` on the corpus (if the l3 binary was built)
#   prepare    the measurement data set: corpus scaled to HD/FHD/UHD as PNG and JPEG q90 (in $L3_DATA)
#   kernel     device-resident kernel speed vs a D2D copy, NHWC u8 and NCHW f16 (target >= 40 %)
#   ncu        one Nsight Compute report of the sample kernel (FHD, NCHW f16), to see what limits it
#   fig7a      Figure 7(a): L3 on the GPU and on the CPU cores, PNG on the CPU cores, JPEG on nvJPEG
#   overlap    ResNet-50 step with L3 batches from l3toolkit.Loader(device="cuda") decoded alongside vs a
#              synthetic batch (target <= +5 %; needs the wheel and the prepared FHD files)
#   bsp-bench  `l3-bench bsp` (= `cargo xtask bench bsp`; GPU rows, the PyTorch peer where torch is installed) at the sizes in
#              L3_BSP_SIZES (default 2048,4096,8192,10000,16384, GPU only unless L3_BSP_DEVICES says otherwise)
# Writes one log per step to OUT_DIR (default: $OUT if set, else /tmp/gpu-check) and prints a summary.
# $L3_DATA (default /tmp/l3-data) keeps the prepared data between calls while the machine stays up.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
L3_BIN="$ROOT/gpu-bin/l3"
BSP_BIN="$ROOT/gpu-bin/bsp"
SCRIPTS="$ROOT/l3-cuda/scripts"
OUT_DIR=${1:-${OUT:-/tmp/gpu-check}}
shift || true
STEPS=${*:-tests memcheck racecheck synccheck}
DATA=${L3_DATA:-/tmp/l3-data}
mkdir -p "$OUT_DIR"
# l3-cuda reads the whole corpus beside the repository; bsp-tiling the models and photos it carries.
for d in "$ROOT/../shared" "$ROOT/shared"; do
    if [ -d "$d/corpus" ]; then export L3_CORPUS="$d/corpus"; break; fi
done
for d in "$ROOT/../shared/specs/l3v2-vectors" "$ROOT/shared/specs/l3v2-vectors"; do
    if [ -d "$d" ]; then export L3V2_VECTORS="$d"; break; fi
done
BSP_ENV=(env BSP_SHARED_DIR="$BSP_BIN/shared" L3_CORPUS="$BSP_BIN/shared/corpus")
# libnvrtc / libcublas from pip wheels (nvidia-cuda-nvrtc, nvidia-cublas) where no toolkit is installed.
for d in "$ROOT"/.whl/*/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
         /usr/local/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
echo "corpus: ${L3_CORPUS:-NOT FOUND (corpus tests will skip)}; steps: $STEPS"
for part in "$L3_BIN" "$BSP_BIN"; do
    [ -d "$part" ] || echo "no $part: its steps skip (build it with gpu-check/build.sh)"
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
    grep -h "test result:\|ERROR SUMMARY" "$OUT_DIR/$name.log" | sed 's/^/   /'
}
have() { # binary: present, else say which step part skips
    [ -x "$1" ] && return 0
    echo "   $(basename "$(dirname "$1")")/$(basename "$1") not carried: skipped"; return 1
}
sanitizer() { # step name, tool, "sanitizer options", binary, test-binary options... (word-split)
    local name=$1 tool=$2 opts=$3 bin=$4; shift 4
    if ! command -v compute-sanitizer >/dev/null; then
        echo "compute-sanitizer not found: $name skipped"; status=1; return
    fi
    # shellcheck disable=SC2086
    have "$bin" && step "$name" "${PREFIX[@]}" compute-sanitizer --tool "$tool" --error-exitcode 3 $opts "$bin" \
        --include-ignored --test-threads=1 "$@"
}
need_data() {
    [ -d "$DATA/fhd" ] || { echo "no data in $DATA: run the prepare step first"; status=1; return 1; }
}
# A virtual environment with the carried wheel that sees the machine's torch and JAX; sets $VENV.
venv_with_wheel() {
    ls "$L3_BIN"/wheels/*.whl >/dev/null 2>&1 || { echo "no wheel in $L3_BIN/wheels: skipped"; return 1; }
    VENV="$OUT_DIR/venv"
    [ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install --no-deps --no-index --force-reinstall "$L3_BIN"/wheels/*.whl >"$OUT_DIR/pip.log" 2>&1
}

for s in $STEPS; do
    PREFIX=()
    case "$s" in
    tests)
        have "$L3_BIN/gpu" && step l3-tests-gpu "$L3_BIN/gpu" --include-ignored --test-threads=1 --nocapture
        have "$L3_BIN/l3_cuda" && step l3-tests-lib "$L3_BIN/l3_cuda" --include-ignored --test-threads=4 --nocapture
        have "$L3_BIN/cuda_setup" && step cuda-setup-tests "$L3_BIN/cuda_setup" --include-ignored --nocapture
        have "$L3_BIN/loader_gpu" && step loader-tests-gpu "$L3_BIN/loader_gpu" --include-ignored --test-threads=1 --nocapture
        if have "$BSP_BIN/gpu"; then
            step bsp-tests-gpu "${BSP_ENV[@]}" "$BSP_BIN/gpu" --include-ignored --test-threads=1 --nocapture
            grep -hE "GPU tiled|f16 GEMM|budget [0-9]|GPU vs CPU" "$OUT_DIR/bsp-tests-gpu.log" | sed 's/^/   /'
        fi
        have "$BSP_BIN/bsp_tiling" && step bsp-tests-lib "${BSP_ENV[@]}" "$BSP_BIN/bsp_tiling" --include-ignored --test-threads=2 --nocapture
        have "$BSP_BIN/kernel_sim" && step bsp-tests-kernel-sim "${BSP_ENV[@]}" "$BSP_BIN/kernel_sim" --test-threads=2
        have "$BSP_BIN/device_sim" && step bsp-tests-device-sim "${BSP_ENV[@]}" "$BSP_BIN/device_sim" --test-threads=2 --nocapture
        have "$BSP_BIN/exact" && step bsp-tests-exact "${BSP_ENV[@]}" "$BSP_BIN/exact" --test-threads=2 ;;
    python)
        if venv_with_wheel; then
            if "$VENV/bin/python" -c 'import pytest' 2>/dev/null; then
                step python "$VENV/bin/python" -m pytest -q -rs "$ROOT/bindings/python/tests/test_frameworks.py" \
                    "$ROOT/bindings/python/tests/test_loader.py"
            else
                echo "python skipped: no pytest on this machine"
            fi
        fi ;;
    memcheck)
        sanitizer l3-memcheck memcheck "--leak-check full" "$L3_BIN/gpu"
        PREFIX=("${BSP_ENV[@]}")
        sanitizer bsp-memcheck memcheck "--leak-check full" "$BSP_BIN/gpu" \
            --skip gpu_tiled_equals_whole_f32 --skip gpu_f16_error_measured ;;
    # racecheck and synccheck are slow: the corpus-sized tests are left to memcheck.
    racecheck)
        sanitizer l3-racecheck racecheck "--racecheck-report all" "$L3_BIN/gpu" --skip corpus
        PREFIX=("${BSP_ENV[@]}")
        sanitizer bsp-racecheck racecheck "--racecheck-report all" "$BSP_BIN/gpu" gpu_ops_match_cpu_backend ;;
    synccheck) sanitizer l3-synccheck synccheck "" "$L3_BIN/gpu" --skip corpus ;;
    bench)
        if [ -x "$L3_BIN/l3" ] && [ -n "${L3_CORPUS:-}" ]; then
            step bench "$L3_BIN/l3" bench decode --gpu "$L3_CORPUS"; cat "$OUT_DIR/bench.log"
        else
            echo "bench skipped: no l3 binary or no corpus"
        fi ;;
    prepare)
        step prepare python3 "$SCRIPTS/prepare_data.py" "${L3_CORPUS:?no corpus}" "$DATA"
        cat "$OUT_DIR/prepare.log" ;;
    kernel)
        need_data && have "$L3_BIN/fig7a" && { step kernel "$L3_BIN/fig7a" "$DATA" --what kernel --json "$OUT_DIR/l3.jsonl"
            cat "$OUT_DIR/kernel.log"; } ;;
    ncu)
        need_data && have "$L3_BIN/fig7a" && step ncu ncu --kernel-name regex:l3_samples --launch-skip 2 --launch-count 1 \
            --set full -o "$OUT_DIR/l3_samples_fhd_nchw_f16" -f \
            "$L3_BIN/fig7a" "$DATA" --what kernel --res fhd --min-secs 0 --json "$OUT_DIR/ncu.jsonl" ;;
    fig7a)
        need_data && have "$L3_BIN/fig7a" && {
            step fig7a-l3 "$L3_BIN/fig7a" "$DATA" --what gpu,cpu --json "$OUT_DIR/l3.jsonl"
            step fig7a-peers python3 "$SCRIPTS/fig7a_peers.py" "$DATA" --json "$OUT_DIR/peers.jsonl" \
                --l3-json "$OUT_DIR/l3.jsonl"
            cat "$OUT_DIR/fig7a-l3.log" "$OUT_DIR/fig7a-peers.log"
        } ;;
    overlap)
        need_data && venv_with_wheel && {
            step overlap "$VENV/bin/python" "$SCRIPTS/overlap_l3toolkit.py" "$DATA/fhd" --json "$OUT_DIR/overlap.jsonl"
            cat "$OUT_DIR/overlap.log"; } ;;
    bsp-bench)
        if have "$BSP_BIN/l3-bench"; then
            export L3_BSP_SIZES=${L3_BSP_SIZES:-2048,4096,8192,10000,16384}
            export L3_BSP_DEVICES=${L3_BSP_DEVICES:-cuda}
            export L3_BSP_SCRATCH=${L3_BSP_SCRATCH:-/tmp/bsp-bench-scratch}
            export L3_BSP_TORCH_PEER="$ROOT/bsp-tiling/benches/torch_peer.py"
            step bsp-bench "${BSP_ENV[@]}" "$BSP_BIN/l3-bench" bsp
            report=$(grep -o 'wrote [^ ]*bsp.md' "$OUT_DIR/bsp-bench.log" | head -1 | cut -d' ' -f2)
            if [ -n "$report" ]; then cp "$report" "$(dirname "$report")"/bsp-*.svg "$OUT_DIR/" 2>/dev/null; cat "$OUT_DIR/bsp.md"; fi
        fi ;;
    *) echo "unknown step $s"; status=1 ;;
    esac
done
exit $status
