"""The L3 codec from Python: round trips on every corpus image and on odd sizes, regions, info, errors."""

import errno

import numpy as np
import pytest
from conftest import corpus_dir, corpus_files, pillow_array

import l3toolkit as l3


FORMATS = [
    ({}, 2, "ans"),
    ({"format": "v1"}, 1, None),
    ({"format": "v2"}, 2, "ans"),
    ({"format": 2, "profile": "bp"}, 2, "bp"),
    ({"profile": "ans"}, 2, "ans"),
]


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.name)
@pytest.mark.parametrize("kw,version,profile", FORMATS[1:4], ids=["v1", "v2-ans", "v2-bp"])
def test_round_trip_every_corpus_image(path, kw, version, profile):
    img = pillow_array(path)
    data = l3.encode(img, **kw)
    assert isinstance(data, bytes) and data[:4] == b"L3IM"
    out = l3.decode(data)
    assert out.dtype == np.uint8 and out.shape == img.shape
    assert np.array_equal(out, img)
    meta = l3.info(data)
    assert (meta["version"], meta["profile"]) == (version, profile)
    assert 0 < meta["patch_data_bytes"] < meta["file_bytes"]
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
    # Version 1 takes any patch side from 1 to 255.
    out = l3.decode(l3.encode(img, patch, format="v1"))
    want = img[..., 0] if channels == 1 else img
    assert out.shape == want.shape
    assert np.array_equal(out, want)
    # Version 2 takes patch sides that are multiples of 32.
    v2_patch = None if patch is None else 32 * (1 + patch % 7)
    for profile in ("ans", "bp"):
        out = l3.decode(l3.encode(img, v2_patch, profile=profile))
        assert np.array_equal(out, want), (profile, v2_patch)


@pytest.mark.parametrize("kw,version,profile", FORMATS, ids=lambda v: str(v))
def test_format_keywords_choose_the_written_format(kw, version, profile):
    img = np.add.outer(np.arange(70), np.arange(90)).astype(np.uint8)
    meta = l3.info(l3.encode(img, **kw))
    assert (meta["version"], meta["profile"]) == (version, profile)


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"format": "v1", "profile": "ans"}, "version 2 only"),
        ({"format": "v3"}, "v3"),
        ({"format": 0}, "format=0"),
        ({"profile": "huffman"}, "huffman"),
        ({"format": "v2", "patch": 48}, "48"),
    ],
)
def test_contradictory_or_unknown_formats_are_refused(kw, words):
    img = np.zeros((40, 40, 3), np.uint8)
    with pytest.raises(l3.OptionsError if "patch" not in kw else l3.Error, match=words):
        l3.encode(img, **kw)


def test_conformance_vectors_decode_exactly():
    """The design's independent reference files decode pixel for pixel from Python too."""
    import hashlib
    import json

    root = corpus_dir().parent / "specs" / "l3v2-vectors"
    assert (root / "manifest.json").is_file(), f"the conformance vectors are missing: {root}"
    entries = json.loads((root / "manifest.json").read_text())
    assert len(entries) == 40
    for v in entries:
        data = (root / v["file"]).read_bytes()
        meta = l3.info(data)
        assert meta["version"] == 2 and meta["profile"] == v["profile"].lower(), v["file"]
        out = l3.decode(data)
        rgb = out if out.ndim == 3 else out[..., None]
        assert hashlib.sha256(np.ascontiguousarray(rgb).tobytes()).hexdigest() == v["pixels_sha256"], v["file"]


def test_non_contiguous_and_threads_give_the_same_file():
    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, size=(90, 160, 3), dtype=np.uint8)
    view = big[:, ::2]
    assert not view.flags["C_CONTIGUOUS"]
    one = l3.encode(view, 32, threads=1)
    assert one == l3.encode(np.ascontiguousarray(view), 32, threads=2)
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
    # Nothing asked is the default format, version 2 with profile ANS, at its patch size.
    meta = l3.info(f)
    assert (meta["version"], meta["profile"], meta["patch_size"]) == (2, "ans", 128)
    assert l3.info(data) == meta


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
