#!/usr/bin/env bash
# Builds, on a machine WITH cargo (no GPU needed), everything gpu-check.sh runs on a GPU machine without
# cargo: the bsp-tiling test binaries and the l3-bench binary (for its `bsp` section), stripped, plus the two models
# and the corpus photo the tests and the bench read, into bsp-tiling/gpu-bin/ (git-ignored, < 64 MiB).
#     bash bsp-tiling/build-gpu-bin.sh [extra cargo flags, e.g. --no-default-features --features cuda-12]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=bsp-tiling/gpu-bin
SHARED=${BSP_SHARED_DIR:-../shared}
rm -rf "$BIN" && mkdir -p "$BIN/shared/models" "$BIN/shared/corpus"
cargo test -p bsp-tiling --release --no-run --message-format=json "$@" \
    | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' \
    | while read -r exe; do
        name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        case "$name" in gpu | bsp_tiling | kernel_sim | device_sim | exact) cp "$exe" "$BIN/$name" ;; esac
      done
cargo build -p l3-bench --release "$@"
cp target/release/l3-bench "$BIN/l3-bench"
strip "$BIN"/gpu "$BIN"/bsp_tiling "$BIN"/kernel_sim "$BIN"/device_sim "$BIN"/exact "$BIN"/l3-bench
cp "$SHARED"/models/candy_nc8.safetensors "$SHARED"/models/mosaic_nc16.safetensors "$BIN/shared/models/"
# Every photo the tests and the bench read.
for f in $(grep -ohE '"[A-Za-z]+\.jpg"' bsp-tiling/tests/*.rs bench/src/sections/bsp.rs | tr -d '"' | sort -u); do cp "$SHARED/corpus/$f" "$BIN/shared/corpus/"; done
ls -la "$BIN"
du -sh "$BIN"
