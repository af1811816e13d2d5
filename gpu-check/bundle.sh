#!/usr/bin/env bash
# Builds the GPU bundle (`cargo xtask gpu-bundle` runs this): on a machine WITH cargo and no GPU, everything
# a GPU machine without cargo or network needs, in one git-ignored folder, gpu-bin/ at the repository root:
#
#   gpu-bin/run.sh        the device-side runner (a copy of gpu-check/run.sh; `run.sh --help`)
#   gpu-bin/manifest.txt  commit, build flags, and every file with its size and SHA-256
#   gpu-bin/bin.tar.xz    bin/: the test binaries with their GPU tests (`cargo test --release --no-run`; the GPU
#                         tests are #[ignore]d without a GPU and run there with --include-ignored):
#                           l3_cuda_gpu, l3_cuda_lib   l3-cuda's device tests; its CPU simulation + NVRTC
#                           cuda_setup_lib             the probe and pinned memory
#                           loader_gpu                 device-resident loader batches against CPU batches
#                           loader_targets             device masks against CPU masks
#                           bsp_gpu, bsp_lib           bsp-tiling's device tests; NVRTC for every arch
#                         and the programs l3-bench (`cargo xtask bench`) and fig7a (kernel speed and
#                         Figure 7(a)'s L3 rows)
#   gpu-bin/wheels/       the Python wheel (abi3: any CPython >= 3.9, so the device's 3.12)
#   gpu-bin/shared/       what the tests and measurements read from ../shared: the corpus images they
#                         name, the two style-transfer models, the L3 v2 conformance vectors
#
# The scripts the steps run (l3-cuda/scripts, sass_count.py among them, gpu-check/overlap_l3toolkit.py,
# bsp-tiling/benches/torch_peer.py, the Python tests) come with the working tree, which travels with the bundle. The bundle plus the tracked
# tree must stay under 64 MiB (what one device call carries): this script fails if they do not.
#
#     bash gpu-check/bundle.sh [extra cargo flags, e.g. --no-default-features --features cuda-12]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SHARED=${L3_SHARED_DIR:-$ROOT/../shared}
B=gpu-bin
LIMIT_MIB=64
[ -d "$SHARED/corpus" ] || { echo "no corpus in $SHARED (set L3_SHARED_DIR)" >&2; exit 2; }

# `cargo test --release --no-run ARGS` and copies the test executables it names: pairs of
# "package:target-kind:target-name" and destination file name.
tests_into() { # cargo args..., --, key=dest...
    local args=() map=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    map=("$@")
    cargo test --release --no-run --message-format=json "${args[@]}" "${EXTRA[@]}" \
        | python3 -c '
import json, shutil, sys
want = dict(kv.split("=", 1) for kv in sys.argv[2:])
dest = sys.argv[1]
found = set()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    pid = m["package_id"]  # "path+file:///…/dir#name@version", or "…/dir#version" when name == dir
    tail = pid.split("#")[-1]
    pkg = tail.split("@")[0] if "@" in tail else pid.split("#")[0].rstrip("/").split("/")[-1]
    t = m["target"]
    key = "%s:%s:%s" % (pkg, t["kind"][0], t["name"])
    for k in (key, "%s:%s" % (pkg, t["kind"][0])):
        if k in want:
            shutil.copy(m["executable"], "%s/%s" % (dest, want[k]))
            found.add(k)
missing = set(want) - found
if missing:
    sys.exit("bundle: no test executable for %s" % ", ".join(sorted(missing)))
' "$B/bin" "${map[@]}"
}

EXTRA=("$@")
rm -rf "$B"
mkdir -p "$B/bin" "$B/wheels" "$B/shared/corpus" "$B/shared/models" "$B/shared/specs"

echo "== test binaries"
tests_into -p l3-cuda --lib --test gpu -- l3-cuda:lib=l3_cuda_lib l3-cuda:test:gpu=l3_cuda_gpu
tests_into -p cuda-setup --lib -- cuda-setup:lib=cuda_setup_lib
tests_into -p loader --test gpu --test targets -- loader:test:gpu=loader_gpu loader:test:targets=loader_targets
tests_into -p bsp-tiling --lib --test gpu -- bsp-tiling:lib=bsp_lib bsp-tiling:test:gpu=bsp_gpu

echo "== programs"
cargo build --release -p l3-cuda --example fig7a "${EXTRA[@]}"
cargo build --release -p l3-bench "${EXTRA[@]}"
cp target/release/examples/fig7a target/release/l3-bench "$B/bin/"
strip "$B"/bin/*
# xz shrinks the executables to about a quarter; run.sh unpacks them (with Python's lzma where no xz is).
tar -C "$B" -cJf "$B/bin.tar.xz" bin
rm -r "$B/bin"

echo "== Python wheel"
PY=target/python/venv/bin/python
if ! [ -x "$PY" ] || ! "$PY" -c 'import maturin' 2>/dev/null; then
    python3 -m venv target/python/venv
    "$PY" -m pip install -q maturin
fi
# Stripped: release builds keep debug info, which would triple the wheel.
PATH="$ROOT/target/python/venv/bin:$PATH" MATURIN_PEP517_ARGS="--strip" "$PY" -m pip wheel -q --no-deps \
    --no-build-isolation -w "$B/wheels" ./bindings/python

echo "== data"
# The corpus images the tests and measurements name (the whole corpus would not fit in one call).
for f in $(grep -ohE '"[A-Za-z-]+\.(jpg|png)"' l3-cuda/tests/*.rs bsp-tiling/tests/*.rs \
        bench/src/sections/bsp.rs bindings/python/tests/*.py | tr -d '"' | sort -u); do
    if [ -f "$SHARED/corpus/$f" ]; then cp "$SHARED/corpus/$f" "$B/shared/corpus/"; fi
done
cp "$SHARED"/models/*.safetensors "$B/shared/models/"
[ -d "$SHARED/specs/l3v2-vectors" ] && cp -r "$SHARED/specs/l3v2-vectors" "$B/shared/specs/"
cp gpu-check/run.sh "$B/run.sh"
chmod +x "$B/run.sh"

{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%FT%TZ) on $(uname -srm), $(rustc --version)"
    echo "cargo flags: ${EXTRA[*]:-(default features: CUDA 13)}"
    echo
    (cd "$B" && find . -type f ! -name manifest.txt | sort | while read -r f; do
        printf '%10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "${f#./}"
    done)
} >"$B/manifest.txt"

bundle_kib=$(du -sk "$B" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk "{s+=\$1} END {print int(s/1024)}")
echo "bundle: $((bundle_kib / 1024)) MiB in $B; tracked tree: $((tree_kib / 1024)) MiB"
if [ $((bundle_kib + tree_kib)) -ge $((LIMIT_MIB * 1024)) ]; then
    echo "bundle + tree exceed the $LIMIT_MIB MiB a device call carries" >&2
    du -sh "$B"/* "$B"/shared/* >&2
    exit 1
fi
