#!/usr/bin/env bash
# Builds, on a machine WITH cargo (no GPU needed), everything gpu-check.sh runs on a GPU machine without
# cargo: the l3-cuda test binaries and the `l3` tool, copied into l3-cuda/gpu-bin/ (git-ignored).
#     bash l3-cuda/build-gpu-bin.sh [extra cargo flags, e.g. --no-default-features --features cuda-12]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=l3-cuda/gpu-bin
rm -rf "$BIN" && mkdir -p "$BIN"
cargo test -p l3-cuda --release --no-run --message-format=json "$@" \
    | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' \
    | while read -r exe; do
        name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        case "$name" in gpu | l3_cuda) cp "$exe" "$BIN/$name" ;; esac
      done
cargo build -p loader --bin l3 --release
cp target/release/l3 "$BIN/l3"
# Debug info off: the device tool carries at most 64 MiB.
strip "$BIN"/*
ls -la "$BIN"
du -sh "$BIN"
