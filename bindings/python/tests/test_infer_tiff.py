"""l3toolkit.infer on TIFF paths: files written by tifffile (classic and BigTIFF, tiled and striped,
chunky and planar, Deflate and uncompressed, uint8, uint16 and float32) are read by region and give the
same output, bit for bit, as the same pixels passed as an array; tiled BigTIFF outputs read back through
tifffile equal the array result (float32) and the PNG output (uint8); ``page=N`` of a multi-page file
equals that page written alone. Skips where onnx or tifffile is missing."""

import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import l3toolkit as l3
from conftest import require_module

onnx = require_module("onnx", module_level=True)
tifffile = require_module("tifffile", module_level=True)

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("make_models", ROOT / "bsp-tiling/tests/onnx/make_models.py")
mm = importlib.util.module_from_spec(spec)
sys.modules["make_models"] = mm
spec.loader.exec_module(mm)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m, _ = mm.norm_first()
    p = tmp_path_factory.mktemp("onnx") / "norm_first.onnx"
    p.write_bytes(m.SerializeToString())
    return l3.Model(p)


LAYOUTS = [
    dict(tile=(16, 16), compression="zlib"),
    dict(bigtiff=True, rowsperstrip=5, compression="zlib"),
    dict(bigtiff=True, tile=(16, 32), planarconfig="separate"),
    dict(rowsperstrip=1),
]


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
@pytest.mark.parametrize("h,w", [(37, 45), (7, 3), (1, 1)])
def test_tiff_input_equals_the_array(model, tmp_path, layout, h, w):
    kw = LAYOUTS[layout]
    planar = kw.get("planarconfig") == "separate"

    def write(p, a, **extra):
        # tifffile takes a planar image as (samples, height, width).
        tifffile.imwrite(p, np.ascontiguousarray(a.transpose(2, 0, 1)) if planar else a, **extra, **kw)

    rng = np.random.default_rng(h * 100 + w)
    x8 = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    p = tmp_path / "in8.tif"
    write(p, x8, photometric="rgb")
    want = l3.infer(x8, model, tile=8, in_scale=0.01)
    got = l3.infer(p, model, tile=8, in_scale=0.01)
    assert np.array_equal(got, want)

    xf = rng.standard_normal((h, w, 3)).astype(np.float32)
    p = tmp_path / "inf.tif"
    write(p, xf, photometric="rgb")
    want = l3.infer(np.ascontiguousarray(xf.transpose(2, 0, 1)), model, tile=8)
    assert np.array_equal(l3.infer(p, model, tile=8, in_scale=0.01), want), "float32 is taken as is"

    # 16-bit gray: the values times in_scale, replicated to the model's three channels.
    x16 = rng.integers(0, 65536, (h, w), dtype=np.uint16)
    p = tmp_path / "in16.tif"
    tifffile.imwrite(p, x16, photometric="minisblack", **{k: v for k, v in kw.items() if k != "planarconfig"})
    g = x16.astype(np.float32) * np.float32(0.001)
    want = l3.infer(np.stack([g, g, g]), model, tile=8)
    assert np.array_equal(l3.infer(p, model, tile=8, in_scale=0.001), want)


def test_tiled_bigtiff_output(model, tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (300, 270, 3), dtype=np.uint8)  # more than one 256² tile, not a multiple
    want = l3.infer(x, model, tile=64, in_scale=0.01)
    out = tmp_path / "out_f.tif"
    l3.infer(x, model, tile=64, in_scale=0.01, output=out, out_dtype="float32")
    with tifffile.TiffFile(out) as f:
        assert f.is_bigtiff and f.pages[0].is_tiled
        got = f.asarray()
    assert got.dtype == np.float32
    assert np.array_equal(got.transpose(2, 0, 1), want)

    png, tif = tmp_path / "out.png", tmp_path / "out8.tif"
    for o in (png, tif):
        l3.infer(x, model, tile=64, in_scale=0.01, out_scale=60, output=o)
    from PIL import Image

    assert np.array_equal(tifffile.imread(tif), np.asarray(Image.open(png)))
    with pytest.raises(l3.OptionsError):
        l3.infer(x, model, output=tmp_path / "y.tif", out_dtype="int7")


def test_whole_decode_is_said(model, tmp_path):
    from PIL import Image

    x = np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    p = tmp_path / "in.png"
    Image.fromarray(x).save(p)
    with pytest.warns(UserWarning, match="decoded whole"):
        got = l3.infer(p, model, tile=8)
    assert np.array_equal(got, l3.infer(x, model, tile=8))
    t = tmp_path / "in.tif"
    tifffile.imwrite(t, x, tile=(16, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        l3.infer(t, model, tile=8)


def test_damaged_tiff_names_the_file(model, tmp_path):
    x = np.random.default_rng(2).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    p = tmp_path / "cut.tif"
    tifffile.imwrite(p, x, tile=(16, 16), compression="zlib")
    b = p.read_bytes()
    p.write_bytes(b[: len(b) // 2])
    with pytest.raises(l3.Error, match="cut.tif"):
        l3.infer(p, model, tile=8)


def write_three_pages(p, reduced, rng):
    """A slide-like file: page 0 a 120×90 RGB image in 32×32 tiles, page 1 ``reduced`` (NewSubfileType = 1,
    Deflate strips of 6 rows), page 2 a 1-channel 16-bit page in strips."""
    with tifffile.TiffWriter(p) as t:
        t.write(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8), photometric="rgb", tile=(32, 32))
        t.write(reduced, photometric="rgb", subfiletype=1, rowsperstrip=6, compression="zlib")
        t.write(rng.integers(0, 65536, (20, 25), dtype=np.uint16), photometric="minisblack")


def test_a_page_equals_that_page_written_alone(model, tmp_path):
    rng = np.random.default_rng(8)
    reduced = rng.integers(0, 256, (45, 60, 3), dtype=np.uint8)
    slide, alone = tmp_path / "slide.tif", tmp_path / "alone.tif"
    write_three_pages(slide, reduced, rng)
    tifffile.imwrite(alone, reduced, photometric="rgb")
    with tifffile.TiffFile(slide) as f:
        assert len(f.pages) == 3 and f.pages[1].subfiletype == 1

    got = l3.infer(slide, model, tile=16, in_scale=0.01, page=1)
    assert got.shape[1:] == (45, 60)
    assert np.array_equal(got, l3.infer(alone, model, tile=16, in_scale=0.01))
    assert np.array_equal(got, l3.infer(reduced, model, tile=16, in_scale=0.01))
    # Written to a file: byte for byte the single-page file's output.
    for name in ("a.npy", "b.npy"):
        src = slide if name == "a.npy" else alone
        l3.infer(src, model, tile=16, in_scale=0.01, output=tmp_path / name, page=1 if src == slide else None)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    # Page 0 is the default.
    assert np.array_equal(l3.infer(slide, model, tile=16, page=0), l3.infer(slide, model, tile=16))
    assert l3.infer(slide, model, tile=16).shape[1:] == (90, 120)


def test_page_refusals(model, tmp_path):
    rng = np.random.default_rng(9)
    slide = tmp_path / "slide.tif"
    write_three_pages(slide, rng.integers(0, 256, (45, 60, 3), dtype=np.uint8), rng)
    with pytest.raises(l3.OptionsError, match=r"slide\.tif.*no page 3.*3 pages"):
        l3.infer(slide, model, tile=16, page=3)
    x = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    with pytest.raises(l3.OptionsError, match="not to an array"):
        l3.infer(x, model, tile=8, page=0)
    npy = tmp_path / "x.npy"
    np.save(npy, x.transpose(2, 0, 1).astype(np.float32))
    with pytest.raises(l3.OptionsError, match=r"x\.npy.*only TIFF inputs"):
        l3.infer(npy, model, tile=8, page=1)


def test_a_subifd_level_equals_that_level_as_an_array(model, tmp_path):
    # A pyramid as OME-TIFF writers lay it out: the reduced resolutions in page 0's SubIFDs.
    rng = np.random.default_rng(10)
    levels = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(90, 120), (45, 60), (23, 30)]]
    slide = tmp_path / "pyramid.ome.tif"
    with tifffile.TiffWriter(slide, bigtiff=True) as t:
        t.write(levels[0], subifds=2, tile=(16, 16), photometric="rgb")
        for lv in levels[1:]:
            t.write(lv, subfiletype=1, tile=(16, 16), photometric="rgb", compression="zlib")
    with tifffile.TiffFile(slide) as f:
        assert len(f.pages) == 1 and len(f.pages[0].subifds) == 2
    for level, arr in enumerate(levels):
        got = l3.infer(slide, model, tile=16, in_scale=0.01, level=level)
        assert got.shape[1:] == arr.shape[:2]
        assert np.array_equal(got, l3.infer(arr, model, tile=16, in_scale=0.01))
    assert np.array_equal(l3.infer(slide, model, tile=16, page=0, level=0), l3.infer(slide, model, tile=16))
    with pytest.raises(l3.OptionsError, match=r"pyramid\.ome\.tif.*no level 3"):
        l3.infer(slide, model, tile=16, level=3)
    with pytest.raises(l3.OptionsError, match="not to an array"):
        l3.infer(levels[0], model, tile=8, level=1)
