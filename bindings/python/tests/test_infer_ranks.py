"""One image shared among processes. ``python -m l3toolkit.infer`` under ``torchrun`` (gloo) writes exactly
the bytes ``l3 infer`` writes, for every output format and on 1, 2 and 3 ranks; ``l3toolkit.infer(...,
group="jax")`` under JAX's multi-process runtime (gloo collectives) and with a collective of threads does
too, and returns the array on rank 0 only; a rank that fails — a missing input, an exception in its
collective — stops every other one with an error naming it, and no output is left behind. torch and JAX
are in the test environment: a machine without one says so (and CI fails)."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import l3toolkit as l3
from conftest import REPO, l3_binary, models_dir, require_module

ONNX = REPO / "bsp-tiling" / "tests" / "data" / "onnx" / "unet_gn.onnx"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    rng = np.random.default_rng(3)
    # An image for the TransformerNet (0..255, float32 C×H×W) and one for the ONNX U-Net.
    image = d / "image.npy"
    np.save(image, (rng.random((3, 70, 94), dtype=np.float32) * 255).astype(np.float32))
    small = d / "small.npy"
    np.save(small, rng.random((3, 40, 56), dtype=np.float32))
    return d, image, small


def l3_infer(model, src, out, *flags):
    subprocess.run([str(l3_binary()), "infer", "--model", str(model), str(src), str(out), *flags], check=True,
                   capture_output=True)
    return Path(out).read_bytes()


def torchrun(ranks, model, src, out, *flags, timeout=300):
    require_module("torch")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "l3toolkit.infer", "--model", str(model), str(src), str(out), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("ext", ["png", "npy", "tif", "l3"])
def test_torchrun_writes_the_bytes_l3_infer_writes(inputs, ext):
    d, image, _ = inputs
    model = models_dir() / "candy_nc8.safetensors"
    flags = ["--tile", "32", "--threads", "1"]
    want = l3_infer(model, image, d / f"want.{ext}", *flags)
    for ranks in (1, 2, 3):
        out = d / f"got{ranks}.{ext}"
        r = torchrun(ranks, model, image, out, *flags)
        assert r.returncode == 0, r.stderr[-3000:]
        assert out.read_bytes() == want, f"{ranks} ranks, .{ext}: other bytes than l3 infer"
        assert sorted(p.name for p in d.glob(f".got{ranks}*")) == [], "a temporary left behind"


@pytest.mark.parametrize("flags", [["--mode", "recompute", "--tile", "8"], ["--tile", "8", "--crop-to-input"],
                                   ["--mode", "sampled", "--tile", "16", "--full=false"]])
def test_torchrun_any_flag_of_l3_infer_on_an_onnx_model(inputs, flags):
    d, _, small = inputs
    tag = "-".join(f.strip("-").replace("=", "") for f in flags)
    want = l3_infer(ONNX, small, d / f"want-{tag}.npy", *flags, "--threads", "1")
    out = d / f"got-{tag}.npy"
    r = torchrun(2, ONNX, small, out, *flags, "--threads", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_bytes() == want, flags


def test_torchrun_a_rank_that_fails_stops_them_all(inputs):
    d, image, _ = inputs
    model = models_dir() / "candy_nc8.safetensors"
    out = d / "never.png"
    # A bad option is refused on every rank before anything runs.
    r = torchrun(2, model, image, out, "--tile", "30")
    assert r.returncode != 0
    assert "tile" in r.stderr, r.stderr[-2000:]
    assert not out.exists()
    # Rank 1's input is missing (each rank reads the path its environment names): rank 0 stops naming it.
    code = (
        "import os, sys, torch.distributed as dist, l3toolkit as l3\n"
        "dist.init_process_group('gloo')\n"
        f"src = {str(image)!r} if dist.get_rank() == 0 else '/nonexistent/image.npy'\n"
        "try:\n"
        f"    l3.infer(src, {str(model)!r}, output={str(out)!r}, tile=32, threads=1, group=dist.group.WORLD)\n"
        "except l3.Error as e:\n"
        "    print(f'rank {dist.get_rank()}: {type(e).__name__}: {e}')\n"
        "dist.destroy_process_group()\n"
    )
    script = d / "fail.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0: Error: rank 1 of 2 failed" in r.stdout and "nonexistent" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "rank 1: IOError" in r.stdout, r.stdout
    assert not out.exists()


JAX_RANK = """
import os, sys
import numpy as np
import jax
import l3toolkit as l3
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address="127.0.0.1:" + os.environ["JAX_PORT"],
                           num_processes=int(os.environ["WORLD_SIZE"]), process_id=int(os.environ["RANK"]))
model, src, out = sys.argv[1:]
got = l3.infer(src, model, output=out, tile=32, threads=1, group="jax")
arr = l3.infer(src, model, tile=32, threads=1, group="jax")
if jax.process_index() == 0:
    np.save(out + ".array.npy", arr)
else:
    assert arr is None, "only rank 0 returns the array"
jax.distributed.shutdown()
"""


def test_jax_ranks_write_the_bytes_one_process_writes(inputs):
    require_module("jax")
    from test_elastic import free_port

    d, image, _ = inputs
    model = models_dir() / "candy_nc8.safetensors"
    want = l3_infer(model, image, d / "jax-want.npy", "--tile", "32", "--threads", "1")
    script = d / "jax_rank.py"
    script.write_text(JAX_RANK)
    out = d / "jax-got.npy"
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(model), str(image), str(out)],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", JAX_PORT=port),
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert out.read_bytes() == want
    alone = l3.infer(str(image), str(model), tile=32, threads=1)
    assert np.array_equal(np.load(str(out) + ".array.npy"), alone)


class Threads:
    """Ranks as threads of this process: the duck-typed collective ``group=`` also takes."""

    def __init__(self, size, rank, shared, fail_at=None):
        self.rank, self.size, self._shared, self._fail_at, self._calls = rank, size, shared, fail_at, 0

    def all_gather(self, mine):
        self._calls += 1
        if self._calls == self._fail_at:
            # As gloo does when a peer's link breaks: the others' collective fails too.
            self._shared[1].abort()
            raise ConnectionError("the link to rank 0 went down")
        slots, barrier = self._shared
        slots[self.rank] = mine
        barrier.wait(timeout=60)
        got = list(slots)
        barrier.wait(timeout=60)
        return got


def on_threads(size, fn, fail=None):
    shared = ([None] * size, threading.Barrier(size))
    results = [None] * size

    def run(r):
        try:
            results[r] = fn(Threads(size, r, shared, fail_at=fail.get(r) if fail else None))
        except Exception as e:  # noqa: BLE001 (the test reads it)
            results[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def test_a_collective_of_threads_gives_the_array_of_one_process(inputs):
    _, _, small = inputs
    x = np.load(small)
    want = l3.infer(x, str(ONNX), tile=8, threads=1)
    for size in (2, 3):
        got = on_threads(size, lambda g: l3.infer(x, str(ONNX), tile=8, threads=1, group=g))
        assert isinstance(got[0], np.ndarray), got[0]
        assert np.array_equal(got[0], want)
        assert all(r is None for r in got[1:]), got[1:]


class ThreadsWithSends(Threads):
    """A collective of threads with point-to-point sends: ``exchange`` hands each part to its rank alone
    (through a matrix of slots), and counts its calls."""

    exchanges = 0

    def __init__(self, size, rank, shared, matrix):
        super().__init__(size, rank, shared)
        self._matrix = matrix

    def exchange(self, parts):
        type(self).exchanges += 1
        matrix, barrier = self._matrix, self._shared[1]
        matrix[self.rank] = list(parts)
        barrier.wait(timeout=60)
        got = [matrix[r][self.rank] for r in range(self.size)]
        barrier.wait(timeout=60)
        return got


def test_a_collective_with_sends_moves_the_halos_point_to_point(inputs):
    _, _, small = inputs
    x = np.load(small)
    want = l3.infer(x, str(ONNX), tile=8, threads=1)
    size = 3
    shared, matrix = ([None] * size, threading.Barrier(size)), [None] * size
    results = [None] * size

    def run(r):
        try:
            g = ThreadsWithSends(size, r, shared, matrix)
            results[r] = l3.infer(x, str(ONNX), tile=8, threads=1, group=g)
        except Exception as e:  # noqa: BLE001 (the test reads it)
            results[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert isinstance(results[0], np.ndarray), results[0]
    assert np.array_equal(results[0], want)
    assert ThreadsWithSends.exchanges > 0, "the collective's own exchange was never called"


def test_a_collective_that_fails_stops_every_rank_naming_it(inputs):
    d, _, small = inputs
    x = np.load(small)
    out = d / "broken.npy"
    # Rank 1's collective raises at its third call: rank 1 reports it, rank 0 is stopped, nothing written.
    got = on_threads(2, lambda g: l3.infer(x, str(ONNX), output=str(out), tile=8, threads=1, group=g),
                     fail={1: 3})
    assert isinstance(got[1], l3.Error) and "link to rank 0 went down" in str(got[1]), got[1]
    assert isinstance(got[0], l3.Error) and "collective" in str(got[0]), got[0]
    assert not out.exists()
    bad = on_threads(2, lambda g: l3.infer(x, str(ONNX), tile=8, threads=1, group=object()))
    assert all(isinstance(e, TypeError) and "group" in str(e) for e in bad), bad


def test_torchrun_nccl_on_the_device_or_says_why_it_cannot(inputs):
    """``--device cuda`` under torchrun: NCCL, each rank on its ``LOCAL_RANK``'s GPU (one rank: NCCL does not
    take two ranks on one GPU). Where no GPU can be used, the run fails saying why; never a CPU run."""
    torch = require_module("torch")
    d, image, _ = inputs
    model = models_dir() / "candy_nc8.safetensors"
    want, got = d / "nccl-want.npy", d / "nccl-got.npy"
    alone = subprocess.run([sys.executable, "-m", "l3toolkit.infer", "--group", "none", "--model", str(model),
                            str(image), str(want), "--device", "cuda", "--tile", "32"],
                           capture_output=True, text=True, timeout=300)
    if not torch.cuda.is_available():
        assert alone.returncode != 0 and "cuda" in alone.stderr.lower(), alone.stderr[-2000:]
        if os.environ.get("L3_EXPECT_GPU"):
            pytest.fail("no CUDA device for torch on a machine that has one")
        return
    assert alone.returncode == 0, alone.stderr[-3000:]
    r = torchrun(1, model, image, got, "--device", "cuda", "--tile", "32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert got.read_bytes() == want.read_bytes()
