"""L3 in Pillow: importing l3toolkit registers a plugin, and code written for Pillow — ``Image.open``,
``im.crop``, ``im.save``, torchvision's ``ImageFolder`` with its default loader, Hugging Face ``datasets``'
``imagefolder`` — reads and writes L3 files unchanged, pixel for pixel what ``l3toolkit.decode`` gives."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_files, require_module, run_python
from PIL import Image, UnidentifiedImageError

import l3toolkit as l3

MODES = {"L": 1, "RGB": 3, "RGBA": 4}


def noisy(h, w, c, seed=0):
    """A gradient with noise: compressible, but every patch has bytes of its own."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = ((x * 3 + y * 2) % 256).astype(np.uint8)
    px = np.stack([base + np.uint8(17 * k) for k in range(c)], axis=-1)
    px ^= rng.integers(0, 32, size=px.shape, dtype=np.uint8)
    return px[..., 0] if c == 1 else px


def test_the_plugin_is_registered():
    assert Image.registered_extensions()[".l3"] == "L3"
    assert Image.MIME["L3"] == "image/x-l3"
    assert "L3" in Image.OPEN and "L3" in Image.SAVE


@pytest.mark.parametrize("mode", list(MODES))
def test_save_open_round_trip_reads_the_header_first(tmp_path, mode):
    px = noisy(70, 90, MODES[mode])
    path = tmp_path / f"x-{mode}.l3"
    Image.fromarray(px, mode).save(path)
    assert np.array_equal(l3.decode(path), px), "im.save wrote what l3.encode writes"
    with Image.open(path) as im:
        assert (im.format, im.mode, im.size) == ("L3", mode, (90, 70))
        assert im.tile, "open decoded the pixels: it must read the header only"
        assert im.info["l3_version"] == 2 and im.info["l3_profile"] == "ans"
        assert np.array_equal(np.asarray(im), px)
        assert not im.tile


def test_save_takes_the_encoders_options(tmp_path):
    px = noisy(64, 64, 3)
    im = Image.fromarray(px)
    im.save(tmp_path / "v1.l3", version="v1", patch=16)
    im.save(tmp_path / "bp.l3", profile="bp", patch_size=64, threads=1)
    im.save(tmp_path / "stream.bin", format="L3")
    v1, bp = l3.info(tmp_path / "v1.l3"), l3.info(tmp_path / "bp.l3")
    assert (v1["version"], v1["patch_size"]) == (1, 16)
    assert (bp["version"], bp["profile"], bp["patch_size"]) == (2, "bp", 64)
    for name in ("v1.l3", "bp.l3", "stream.bin"):
        with Image.open(tmp_path / name) as back:
            assert np.array_equal(np.asarray(back), px), name
    with pytest.raises(l3.OptionsError, match="format"):
        im.save(tmp_path / "bad.l3", version="v9")


@pytest.mark.parametrize("mode", ["LA", "P", "I;16", "1"])
def test_modes_l3_does_not_store_are_refused(tmp_path, mode):
    im = Image.new(mode, (8, 8))
    with pytest.raises(OSError, match=f"cannot write mode {mode} as L3"):
        im.save(tmp_path / "x.l3")


def damaged_outside_the_top_left(tmp_path) -> Path:
    """A 256×256 RGB file in 32-pixel patches whose last bytes of patch data (the bottom-right patch) are
    flipped: a read of the top-left never touches them."""
    path = tmp_path / "damaged.l3"
    Image.fromarray(noisy(256, 256, 3, seed=5)).save(path, patch=32)
    data = bytearray(path.read_bytes())
    data[len(data) - 40] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_crop_of_an_unloaded_image_decodes_only_the_patches_under_the_box(tmp_path):
    px = noisy(256, 256, 3, seed=5)
    path = tmp_path / "x.l3"
    Image.fromarray(px).save(path, patch=32)
    with Image.open(path) as im:
        part = im.crop((10, 20, 74, 50))
        assert im.tile, "the crop loaded the whole image"
    assert part.size == (64, 30) and part.mode == "RGB"
    assert np.array_equal(np.asarray(part), px[20:50, 10:74])
    # Past the edges the crop is zero, as Pillow's own crop of the loaded image.
    for box in [(-5, -7, 20, 10), (240, 250, 270, 262), (300, 300, 310, 305), (3.4, 4.6, 20.5, 9.5)]:
        with Image.open(path) as lazy, Image.open(path) as loaded:
            loaded.load()
            assert np.array_equal(np.asarray(lazy.crop(box)), np.asarray(loaded.crop(box))), box
    # The proof that only the patches under the box are decoded: damage elsewhere goes unread.
    bad = damaged_outside_the_top_left(tmp_path)
    with Image.open(bad) as im:
        assert np.array_equal(np.asarray(im.crop((0, 0, 64, 64))), px[:64, :64])
    with Image.open(bad) as im, pytest.raises(l3.ImageFileError, match="damaged.l3"):
        im.crop((200, 200, 256, 256))
    with Image.open(bad) as im, pytest.raises(OSError) as caught:
        im.load()
    assert isinstance(caught.value, l3.FormatError) and str(bad) in str(caught.value)
    with Image.open(path) as im, pytest.raises(ValueError, match="right"):
        im.crop((10, 0, 5, 5))


def test_a_corpus_image_through_pillow(tmp_path):
    src = corpus_files()[0]
    with Image.open(src) as im:
        im = im.convert("RGBA" if im.mode == "RGBA" else "RGB")
        ref = np.asarray(im)
        im.save(tmp_path / "corpus.l3")
    with Image.open(tmp_path / "corpus.l3") as back:
        assert back.size == (ref.shape[1], ref.shape[0])
        h, w = ref.shape[:2]
        box = (w // 3, h // 3, w // 3 + 224, h // 3 + 224)
        assert np.array_equal(np.asarray(back.crop(box)), ref[box[1] : box[3], box[0] : box[2]])
        assert np.array_equal(np.asarray(back), ref)
    # And a file written by l3.convert, opened from a file object (the way torchvision opens files).
    with open(tmp_path / "corpus.l3", "rb") as f, Image.open(f) as im:
        assert np.array_equal(np.asarray(im.convert("RGB")), ref[..., :3])


def test_damage_is_named_the_pillow_way(tmp_path):
    good = tmp_path / "good.l3"
    Image.fromarray(noisy(40, 40, 3)).save(good)
    not_l3 = tmp_path / "not.l3"
    not_l3.write_bytes(b"GIF89a" + bytes(100))
    with pytest.raises(UnidentifiedImageError, match="not.l3"):
        Image.open(not_l3)
    header = tmp_path / "header.l3"
    data = bytearray(good.read_bytes())
    data[6:10] = bytes(4)  # a width of 0
    header.write_bytes(bytes(data))
    with pytest.raises(l3.ImageFileError, match="header.l3") as caught:
        Image.open(header)
    assert isinstance(caught.value, OSError) and isinstance(caught.value, l3.FormatError)
    short = tmp_path / "short.l3"
    short.write_bytes(good.read_bytes()[:30])
    with pytest.raises(OSError, match="short.l3"):
        Image.open(short).load()


def test_importing_the_package_is_the_one_step(tmp_path):
    path = tmp_path / "x.l3"
    Image.fromarray(noisy(10, 12, 3)).save(path)
    r = run_python(
        f"""
        import l3toolkit
        from PIL import Image
        im = Image.open({str(path)!r})
        print(im.format, im.mode, im.size, ".l3" in Image.registered_extensions())
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["L3", "RGB", "(12,", "10)", "True"]


def test_torchvision_image_folder_with_its_default_loader(small):
    datasets = require_module("torchvision.datasets")
    folder = datasets.ImageFolder(str(small.l3), is_valid_file=lambda p: p.endswith(".l3"))
    assert len(folder) == len(small) and folder.classes == ["photo", "render"]
    for i, (img, label) in enumerate(folder):
        assert label == small.labels[i]
        assert img.mode == "RGB"
        assert np.array_equal(np.asarray(img), small.reference(i)), folder.samples[i][0]


def test_hugging_face_datasets_imagefolder(small, tmp_path):
    require_module("datasets")
    want = sorted(
        (lab, hashlib.sha256(np.ascontiguousarray(small.reference(i)).tobytes()).hexdigest())
        for i, lab in enumerate(small.labels)
    )
    # Both import orders: datasets keeps its own list of image extensions, read when it is imported.
    for n, first in enumerate(("import datasets, l3toolkit", "import l3toolkit, datasets")):
        r = run_python(
            f"""
            {first}
            import hashlib
            import numpy as np
            ds = datasets.load_dataset("imagefolder", data_dir={str(small.l3)!r}, split="train",
                                       cache_dir={str(tmp_path / f"hf{n}")!r})
            for r in ds:
                px = np.ascontiguousarray(np.asarray(r["image"].convert("RGB"))).tobytes()
                print(r["label"], hashlib.sha256(px).hexdigest())
            """,
            env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home")},
            timeout=300,
        )
        assert r.returncode == 0, f"{first}: {r.stderr[-3000:]}"
        got = sorted((int(a), b) for a, b in (line.split() for line in r.stdout.splitlines()))
        assert got == want, first
