#!/usr/bin/env bash
# Builds, on a machine WITH cargo (no GPU needed), everything gpu-check.sh runs on a GPU machine without
# cargo, into l3-cuda/gpu-bin/ (git-ignored): the l3-cuda test binaries, the loader's GPU test binary
# (device-resident batches against CPU batches), the `fig7a` example (kernel speed, Figure 7(a) L3 rows),
# libl3_ctypes.so (what scripts/overlap.py loads), the `l3` tool (for `l3 bench decode --gpu`) and the
# Python wheel (device batches through DLPack into torch and JAX).
#     bash l3-cuda/build-gpu-bin.sh [extra cargo flags for l3-cuda, e.g. --no-default-features --features cuda-12]
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
cargo test -p loader --release --test gpu --no-run --message-format=json \
    | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' \
    | while read -r exe; do cp "$exe" "$BIN/loader_gpu"; done
cargo build -p l3-cuda --release --example fig7a --example l3_ctypes "$@"
cp target/release/examples/fig7a target/release/examples/libl3_ctypes.so "$BIN/"
# The `l3` tool, from whichever workspace package provides it (optional: gpu-check's `bench` step).
if cargo build --release -p l3-cli --bin l3 2>"$BIN/l3-build.log"; then
    cp target/release/l3 "$BIN/l3"
    rm "$BIN/l3-build.log"
else
    echo "no \`l3\` binary built (see $BIN/l3-build.log): gpu-check's bench step will skip"
fi
# The Python wheel, with the virtual environment `cargo xtask test python` made (maturin in it).
PY=target/python/venv/bin/python
if [ -x "$PY" ] && "$PY" -m pip wheel --no-deps --no-build-isolation -w "$BIN/wheels" ./bindings/python \
        >"$BIN/wheel-build.log" 2>&1; then
    rm "$BIN/wheel-build.log"
else
    echo "no wheel built (run \`cargo xtask test python\` first; see $BIN/wheel-build.log): gpu-check's python step will skip"
fi
# Debug info off: the device tool carries at most 64 MiB.
strip "$BIN"/gpu "$BIN"/l3_cuda "$BIN"/loader_gpu "$BIN"/fig7a "$BIN"/libl3_ctypes.so
[ -f "$BIN/l3" ] && strip "$BIN/l3"
ls -la "$BIN"
du -sh "$BIN"
