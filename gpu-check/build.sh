#!/usr/bin/env bash
# Builds, on a machine WITH cargo (no GPU needed), everything check.sh runs on a GPU machine without cargo,
# into gpu-bin/ at the repository root (git-ignored), one folder per part so that each stays within what one
# device call carries (64 MiB):
#   gpu-bin/l3/   l3-cuda's test binaries (gpu: the GPU tests; l3_cuda: the CPU simulation + NVRTC),
#                 cuda-setup's (cuda_setup: the probe and pinned memory on a real GPU), the loader's GPU test
#                 binary (loader_gpu: device batches against CPU batches), the `fig7a` example (kernel speed,
#                 Figure 7(a) L3 rows), the `l3` tool (`l3 bench decode --gpu`) and the Python wheel (device
#                 batches through DLPack into torch and JAX; the overlap step)
#   gpu-bin/bsp/  bsp-tiling's test binaries (gpu, bsp_tiling, kernel_sim, device_sim, exact), the l3-bench
#                 binary (`bench bsp`), and the two models and the corpus photos the tests and the bench read
# Run from anywhere:
#     bash gpu-check/build.sh [l3|bsp|all] [extra cargo flags, e.g. --no-default-features --features cuda-12]
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=all
case "${1:-}" in l3 | bsp | all) WHAT=$1; shift ;; esac

# The test executables of `cargo test ARGS --no-run`, one per line.
test_exes() {
    cargo test --release --no-run --message-format=json "$@" \
        | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//'
}
# Copies each executable whose name (hash dropped) is one of the wanted names.
copy_named() { # dest, names...
    local dest=$1; shift
    while read -r exe; do
        local name
        name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        for want in "$@"; do [ "$name" = "$want" ] && cp "$exe" "$dest/$name"; done
    done
}

if [ "$WHAT" != bsp ]; then
    BIN=gpu-bin/l3
    rm -rf "$BIN" && mkdir -p "$BIN"
    test_exes -p l3-cuda "$@" | copy_named "$BIN" gpu l3_cuda
    test_exes -p cuda-setup --lib | copy_named "$BIN" cuda_setup
    test_exes -p loader --test gpu | while read -r exe; do cp "$exe" "$BIN/loader_gpu"; done
    cargo build -p l3-cuda --release --example fig7a "$@"
    cp target/release/examples/fig7a "$BIN/"
    # The `l3` tool (optional: check.sh's `bench` step).
    if cargo build --release -p l3-cli --bin l3 2>"$BIN/l3-build.log"; then
        cp target/release/l3 "$BIN/l3"
        rm "$BIN/l3-build.log"
    else
        echo "no \`l3\` binary built (see $BIN/l3-build.log): check.sh's bench step will skip"
    fi
    # The Python wheel, with the virtual environment `cargo xtask test python` made (maturin in it).
    PY=target/python/venv/bin/python
    if [ -x "$PY" ] && "$PY" -m pip wheel --no-deps --no-build-isolation -w "$BIN/wheels" ./bindings/python \
            >"$BIN/wheel-build.log" 2>&1; then
        rm "$BIN/wheel-build.log"
    else
        echo "no wheel built (run \`cargo xtask test python\` first; see $BIN/wheel-build.log): check.sh's python and overlap steps will skip"
    fi
    # Debug info off: the device tool carries at most 64 MiB.
    strip "$BIN"/gpu "$BIN"/l3_cuda "$BIN"/cuda_setup "$BIN"/loader_gpu "$BIN"/fig7a
    [ -f "$BIN/l3" ] && strip "$BIN/l3"
    ls -la "$BIN"
    du -sh "$BIN"
fi

if [ "$WHAT" != l3 ]; then
    BIN=gpu-bin/bsp
    SHARED=${BSP_SHARED_DIR:-../shared}
    rm -rf "$BIN" && mkdir -p "$BIN/shared/models" "$BIN/shared/corpus"
    test_exes -p bsp-tiling "$@" | copy_named "$BIN" gpu bsp_tiling kernel_sim device_sim exact
    cargo build -p l3-bench --release "$@"
    cp target/release/l3-bench "$BIN/l3-bench"
    strip "$BIN"/gpu "$BIN"/bsp_tiling "$BIN"/kernel_sim "$BIN"/device_sim "$BIN"/exact "$BIN"/l3-bench
    cp "$SHARED"/models/candy_nc8.safetensors "$SHARED"/models/mosaic_nc16.safetensors "$BIN/shared/models/"
    # Every photo the tests and the bench read.
    for f in $(grep -ohE '"[A-Za-z]+\.jpg"' bsp-tiling/tests/*.rs bench/src/sections/bsp.rs | tr -d '"' | sort -u); do
        cp "$SHARED/corpus/$f" "$BIN/shared/corpus/"
    done
    ls -la "$BIN"
    du -sh "$BIN"
fi
