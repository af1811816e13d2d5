"""l3toolkit.infer on ONNX models built here with the onnx helper API: equal to onnxruntime (CPU) within
1e-4 of the output's largest magnitude, exact tiles equal to the whole image within 1e-5, on arrays and on
paths; bad models raise naming the node. Skips where onnx or onnxruntime is missing."""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import l3toolkit as l3
from conftest import require_module

onnx = require_module("onnx", module_level=True)
ort = require_module("onnxruntime", module_level=True)

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("make_models", ROOT / "bsp-tiling/tests/onnx/make_models.py")
mm = importlib.util.module_from_spec(spec)
sys.modules["make_models"] = mm
spec.loader.exec_module(mm)

BUILDERS = {"unet_gn": mm.unet, "esrgan_x4": mm.esrgan, "resnet_fcn": mm.resnet_fcn, "ops_mix": mm.ops_mix}
TILES = {"unet_gn": [8, 16], "esrgan_x4": [5, 16], "resnet_fcn": [8, 24], "ops_mix": [4, 12]}


def rel(a, b):
    assert a.shape == b.shape
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, build in BUILDERS.items():
        m, sizes = build()
        p = d / f"{name}.onnx"
        p.write_bytes(m.SerializeToString())
        out[name] = (p, sizes, ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]))
    return out


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_equals_onnxruntime_and_tiles_equal_whole(models, name):
    path, sizes, sess = models[name]
    model = l3.Model(path)
    rng = np.random.default_rng(7)
    for h, w in sizes:
        x = rng.random((model.channels, h, w), dtype=np.float32)
        (ref,) = sess.run(None, {"image": x[None]})
        # full=True: the network's whole output, as onnxruntime gives it (not cropped to the input's size).
        whole = l3.infer(x, model, mode="whole", full=True)
        assert rel(whole, ref[0]) <= 1e-4, (name, h, w)
        for t in TILES[name]:
            tiled = l3.infer(x, path, tile=t, mode="exact", threads=2, full=True)
            assert rel(tiled, whole) <= 1e-5, (name, h, w, t)


def test_paths_in_and_out(models, tmp_path):
    path, sizes, sess = models["resnet_fcn"]
    h, w = sizes[0]
    x = np.random.default_rng(3).random((3, h, w), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    (ref,) = sess.run(None, {"image": x[None]})
    assert l3.infer(tmp_path / "x.npy", path, output=tmp_path / "y.npy", tile=16) is None
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32 and y.shape == ref[0].shape
    assert rel(y, ref[0]) <= 1e-4
    # An 8-bit image in, a PNG out (rows streamed): 255 × the sigmoid output, clamped; channel 0..2 of 5
    # cannot be an image: the error says so.
    img = (x.transpose(1, 2, 0) * 255).astype(np.uint8)
    with pytest.raises(l3.Error, match="channels"):
        l3.infer(img, path, output=tmp_path / "y.png", in_scale=1 / 255)


def test_esrgan_png_rows_streamed(models, tmp_path):
    path, sizes, sess = models["esrgan_x4"]
    img = (np.random.default_rng(5).random((30, 17, 3)) * 255).astype(np.uint8)
    x = img.transpose(2, 0, 1).astype(np.float32) / 255
    (ref,) = sess.run(None, {"image": x[None]})
    l3.infer(img, path, output=tmp_path / "up.png", tile=8, in_scale=1 / 255, out_scale=255)
    got = l3.read_image(tmp_path / "up.png")
    want = np.clip(np.round(ref[0] * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    assert got.shape == (120, 68, 3)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_bad_models_name_the_node(tmp_path):
    for name, m in mm.bad_models().items():
        p = tmp_path / f"{name}.onnx"
        p.write_bytes(m.SerializeToString())
        with pytest.raises(l3.FormatError) as e:
            l3.Model(p)
        assert "node" in str(e.value), str(e.value)
    (tmp_path / "cut.onnx").write_bytes(b"\x08\x07\x12\x05abc")
    with pytest.raises(l3.FormatError):
        l3.Model(tmp_path / "cut.onnx")


def test_cuda_runs_the_graph_or_says_why(models):
    path, sizes, _ = models["unet_gn"]
    h, w = sizes[0]
    x = np.random.default_rng(5).random((3, h, w), dtype=np.float32)
    with pytest.raises(l3.OptionsError, match="precision"):
        l3.infer(x, path, precision="f16")
    with pytest.raises(l3.OptionsError, match="gpu_memory"):
        l3.infer(x, path, gpu_memory=1 << 30)
    cpu = l3.infer(x, path, tile=8)
    try:
        gpu = l3.infer(x, path, tile=8, device="cuda:0")
    except l3.GpuError as e:
        # No usable GPU here: the probe's reason, in the call's own words; never a silent CPU run.
        assert str(e).startswith("device cuda") and "--" not in str(e), str(e)
        if os.environ.get("L3_EXPECT_GPU"):
            raise  # the GPU bundle's run: this machine has a GPU, so a refusal is a failure
        return
    # On a GPU: every node on the CUDA backend, within 1e-4 of the output's largest magnitude.
    assert gpu.shape == cpu.shape
    assert np.abs(gpu - cpu).max() <= 1e-4 * np.abs(cpu).max()
