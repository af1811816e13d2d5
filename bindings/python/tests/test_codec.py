"""The L3 codec from Python: round trips on every corpus image and on odd sizes, regions, info, errors."""

import errno

import numpy as np
import pytest
from conftest import corpus_files, pillow_array

import l3toolkit as l3


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.name)
def test_round_trip_every_corpus_image(path):
    img = pillow_array(path)
    data = l3.encode(img)
    assert isinstance(data, bytes) and data[:4] == b"L3IM"
    out = l3.decode(data)
    assert out.dtype == np.uint8 and out.shape == img.shape
    assert np.array_equal(out, img)
    meta = l3.info(data)
    assert (meta["height"], meta["width"], meta["channels"]) == img.shape
    assert meta["file_bytes"] == len(data)
    assert meta["raw_bytes"] == img.size
    assert meta["ratio"] == pytest.approx(len(data) / img.size)
    # Gray: a 2-D array comes back 2-D.
    gray = np.ascontiguousarray(img[::4, ::4, 1])
    assert np.array_equal(l3.decode(l3.encode(gray)), gray)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (3, 300), (257, 129), (64, 64)])
@pytest.mark.parametrize("channels", [None, 1, 3, 4])
@pytest.mark.parametrize("patch", [None, 1, 7, 255])
def test_round_trip_odd_sizes(shape, channels, patch):
    rng = np.random.default_rng(sum(shape) * 31 + (channels or 0) * 7 + (patch or 0))
    full = shape if channels is None else shape + (channels,)
    # Smooth ramps plus noise: both the filter's predictions and the bit packing are exercised.
    ramp = np.add.outer(np.arange(shape[0]), np.arange(shape[1])).astype(np.int64)
    if channels is not None:
        ramp = ramp[..., None] * np.arange(1, channels + 1)
    img = ((ramp + rng.integers(0, 4, size=full)) % 256).astype(np.uint8)
    out = l3.decode(l3.encode(img, patch))
    want = img[..., 0] if channels == 1 else img
    assert out.shape == want.shape
    assert np.array_equal(out, want)


def test_non_contiguous_and_threads_give_the_same_file():
    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, size=(90, 160, 3), dtype=np.uint8)
    view = big[:, ::2]
    assert not view.flags["C_CONTIGUOUS"]
    one = l3.encode(view, 16, threads=1)
    assert one == l3.encode(np.ascontiguousarray(view), 16, threads=2)
    assert np.array_equal(l3.decode(one, threads=3), view)


def test_regions_equal_the_whole_decode():
    img = pillow_array(corpus_files()[0])[:700, :900]
    data = l3.encode(np.ascontiguousarray(img), 64)
    whole = l3.decode(data)
    rng = np.random.default_rng(3)
    for _ in range(25):
        w, h = rng.integers(1, 300, size=2)
        x, y = rng.integers(0, 900 - w), rng.integers(0, 700 - h)
        region = l3.decode_region(data, int(x), int(y), int(w), int(h))
        assert np.array_equal(region, whole[y : y + h, x : x + w])
    with pytest.raises(l3.OptionsError, match="outside"):
        l3.decode_region(data, 800, 0, 200, 10)
    with pytest.raises(l3.OptionsError):
        l3.decode_region(data, 0, 0, 0, 10)


def test_bytes_like_and_paths(tmp_path):
    img = np.arange(40 * 30 * 3, dtype=np.uint8).reshape(40, 30, 3)
    data = l3.encode(img)
    f = tmp_path / "a.l3"
    f.write_bytes(data)
    for src in (data, bytearray(data), memoryview(data), str(f), f):
        assert np.array_equal(l3.decode(src), img)
    assert l3.info(f)["patch_size"] == 32
    assert l3.info(data)["version"] == 1


def test_read_image_is_pillows_decode():
    png = next(p for p in corpus_files() if p.suffix == ".png")
    assert np.array_equal(l3.read_image(png), pillow_array(png))


def test_errors_name_the_problem(tmp_path):
    img = np.zeros((20, 20, 3), np.uint8)
    data = l3.encode(img)
    with pytest.raises(l3.FormatError, match="not an L3 file") as e:
        l3.decode(b"PNG?" + data[4:])
    assert isinstance(e.value, ValueError) and isinstance(e.value, l3.Error)
    with pytest.raises(l3.FormatError, match="truncated"):
        l3.decode(data[:10])
    bad = tmp_path / "cut.l3"
    bad.write_bytes(data[: len(data) - 3])
    with pytest.raises(l3.FormatError, match="cut.l3"):
        l3.decode(bad)
    missing = tmp_path / "missing.l3"
    with pytest.raises(l3.IOError) as e:
        l3.decode(missing)
    assert isinstance(e.value, OSError)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert "missing.l3" in str(e.value)
    with pytest.raises(l3.OptionsError, match="float32"):
        l3.encode(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(l3.OptionsError, match="shape"):
        l3.encode(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(l3.OptionsError, match="patch size"):
        l3.encode(img, 0)
    with pytest.raises(l3.OptionsError, match="patch size"):
        l3.encode(img, 256)
    with pytest.raises(l3.OptionsError):
        l3.decode(12)
