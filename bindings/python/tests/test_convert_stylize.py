"""Dataset conversion and BSP-tiled style transfer from Python; the package's surface (stubs, docs)."""

import ast
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import models_dir, pillow_array

import l3toolkit as l3


@pytest.mark.parametrize("to", ["l3", "raw", "png"])
def test_lossless_conversions_keep_every_pixel(small, tmp_path, to):
    out = tmp_path / to
    s = l3.convert(small.png, out, to=to, progress=False)
    assert s["converted"] == len(small) and s["skipped"] == 0
    files = sorted(p for p in out.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert len(files) == len(small)
    for rel in small.items:
        (f,) = [p for p in files if p.relative_to(out).with_suffix("") == rel]
        src = pillow_array(small.png / rel.with_suffix(".png"))
        assert np.array_equal(l3.read_image(f), src), f
    again = l3.convert(small.png, out, to=to, progress=False)
    assert (again["converted"], again["skipped"]) == (0, len(small))


@pytest.mark.parametrize("kw,version,profile", [({"format": "v1"}, 1, None), ({"profile": "bp"}, 2, "bp")])
def test_convert_to_l3_writes_the_format_asked_for(small, tmp_path, kw, version, profile):
    out = tmp_path / "l3"
    l3.convert(small.png, out, to="l3", progress=False, **kw)
    files = sorted(out.rglob("*.l3"))
    assert len(files) == len(small)
    for f in files:
        meta = l3.info(f)
        assert (meta["version"], meta["profile"]) == (version, profile), f
        rel = f.relative_to(out).with_suffix(".png")
        assert np.array_equal(l3.decode(f), pillow_array(small.png / rel)), f


def test_progress_goes_to_stderr(small, tmp_path, capfd):
    l3.convert(small.jpeg, tmp_path / "out", to="jpeg", quality=80)
    err = capfd.readouterr().err
    n = sum(1 for _ in small.jpeg.rglob("*.jpg"))
    assert f"{n}/{n}" in err
    l3.convert(small.jpeg, tmp_path / "quiet", to="l3", progress=False)
    assert capfd.readouterr().err == ""


def test_conversion_errors(small, tmp_path):
    with pytest.raises(l3.OptionsError, match="quality"):
        l3.convert(small.png, tmp_path / "x", to="l3", quality=90)
    with pytest.raises(l3.OptionsError, match='to "webp": expected'):
        l3.convert(small.png, tmp_path / "x", to="webp")
    with pytest.raises(l3.OptionsError, match='to "png": expected l3 when format or profile'):
        l3.convert(small.png, tmp_path / "x", to="png", profile="ans")
    with pytest.raises(l3.OptionsError, match="version 2 only"):
        l3.convert(small.png, tmp_path / "x", to="l3", format="v1", profile="bp")
    with pytest.raises(l3.OptionsError, match='quality "0": expected 1 to 100'):
        l3.convert(small.png, tmp_path / "x", to="jpeg", quality=0)
    with pytest.raises(l3.IOError):
        l3.convert(tmp_path / "missing", tmp_path / "y", to="l3")
    summary = l3.convert(small.png, tmp_path / "lossy-pcr", to="pcr", quality=90, progress=False)
    assert summary["reencoded"] == len(small)


@pytest.fixture(scope="module")
def picture():
    img = pillow_array(next(p for p in sorted(models_dir().parent.glob("corpus/*.jpg"))))
    return np.ascontiguousarray(img[:90, :118, :3])


def test_stylize_exact_tiles_equal_the_whole_image(picture):
    model = l3.Model(models_dir() / "candy_nc8.safetensors")
    whole = l3.stylize(picture, model, mode="whole")
    assert whole.shape == picture.shape and whole.dtype == np.uint8
    exact = l3.stylize(picture, model, mode="exact", tile=32)
    diff = np.abs(exact.astype(int) - whole.astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.01
    naive = l3.stylize(picture, model, mode="naive", tile=32)
    assert np.abs(naive.astype(int) - whole.astype(int)).mean() > 1
    full = l3.stylize(picture, str(models_dir() / "candy_nc8.safetensors"), mode="whole", full=True)
    assert full.shape == (92, 120, 3)
    assert np.array_equal(full[:90, :118], whole)


def test_stylize_errors(picture, tmp_path):
    model = l3.Model(models_dir() / "candy_nc8.safetensors")
    with pytest.raises(l3.OptionsError, match=r"\(H, W, 3\)"):
        l3.stylize(picture[..., 0], model)
    with pytest.raises(l3.OptionsError, match="mode"):
        l3.stylize(picture, model, mode="fast")
    with pytest.raises(l3.OptionsError, match="tile"):
        l3.stylize(picture, model, tile=2)
    with pytest.raises(l3.OptionsError, match="padding"):
        l3.stylize(picture, model, padding="zero")
    with pytest.raises(l3.IOError, match="nothing.safetensors"):
        l3.Model(tmp_path / "nothing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(l3.FormatError, match="junk.safetensors"):
        l3.Model(junk)


def test_stylize_device_options(picture):
    model = l3.Model(models_dir() / "candy_nc8.safetensors")
    for precision in ["f16", "tf32"]:
        with pytest.raises(l3.OptionsError, match="precision"):
            l3.stylize(picture, model, precision=precision)
    with pytest.raises(l3.OptionsError, match="precision"):
        l3.stylize(picture, model, precision="f64", device="cuda")
    with pytest.raises(l3.OptionsError, match="gpu_memory"):
        l3.stylize(picture, model, gpu_memory=1 << 30)
    with pytest.raises(l3.OptionsError, match="device"):
        l3.stylize(picture, model, device="tpu")
    cpu = l3.stylize(picture, model, tile=32, device="cpu")
    assert np.array_equal(cpu, l3.stylize(picture, model, tile=32))
    try:
        gpu = l3.stylize(picture, model, tile=32, device="cuda:0")
    except l3.GpuError as e:
        # No usable GPU here: the reason, in the call's own words; never a silent CPU run.
        assert str(e).startswith("device cuda") and "--" not in str(e), str(e)
        if os.environ.get("L3_EXPECT_GPU"):
            raise  # the GPU bundle's run: this machine has a GPU, so a refusal is a failure
        return
    # On a GPU: the CUDA backend's f32 result is within rounding of the CPU reference.
    assert gpu.shape == cpu.shape
    assert np.abs(gpu.astype(int) - cpu.astype(int)).max() <= 1
    half = l3.stylize(picture, model, tile=32, device="cuda:0", precision="f16", gpu_memory=256 << 20)
    assert np.abs(half.astype(int) - cpu.astype(int)).mean() < 1
    tf32 = l3.stylize(picture, model, tile=32, device="cuda:0", precision="tf32")
    assert np.abs(tf32.astype(int) - cpu.astype(int)).mean() < 1


def test_stubs_cover_the_module_and_everything_is_documented():
    stub = Path(l3.__file__).with_name("__init__.pyi")
    assert stub.is_file() and Path(l3.__file__).with_name("py.typed").is_file()
    tree = ast.parse(stub.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    public = set(l3.__all__) - {"__version__"}
    assert public == stubbed
    for name in public:
        assert (getattr(l3, name).__doc__ or "").strip(), name
    for cls in (l3.Loader, l3.Tensor, l3.Batch):
        for attr in dir(cls):
            if not attr.startswith("_"):
                assert getattr(cls, attr).__doc__, f"{cls.__name__}.{attr}"
    assert issubclass(l3.IOError, OSError) and issubclass(l3.OptionsError, ValueError)
