"""``channels=1`` (luma, as Pillow's ``L``) and ``channels=4`` (RGBA) against Pillow's own conversions of
the window each batch reports, from PNG and L3 sources (whose gray and RGBA images are written straight
into the sample), with plain crops, flips and padding, and with resampling."""

import numpy as np
import pytest
from PIL import Image

import l3toolkit as l3

# name: (width, height, Pillow mode of the stored image)
IMAGES = {"rgb": (37, 29, "RGB"), "gray": (23, 41, "L"), "rgba": (50, 31, "RGBA"), "dot": (1, 1, "RGB")}
MODES = {1: "L", 3: "RGB", 4: "RGBA"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("channels")
    d = root / "png" / "c"
    d.mkdir(parents=True)
    rng = np.random.default_rng(11)
    for name, (w, h, mode) in IMAGES.items():
        c = len(mode)
        a = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        Image.fromarray(a[..., 0] if c == 1 else a, mode).save(d / f"{name}.png")
    l3.convert(root / "png", root / "l3", to="l3", progress=False)
    return root


def nhwc(batch, channels):
    a = np.from_dlpack(batch.images)
    return a if a.shape[-1] == channels else a.transpose(0, 2, 3, 1)


def nearest_index(in_len, out_len):
    """torchvision's ``interpolate(mode="nearest")``: floor(i * (in / out)) in float32, clamped."""
    scale = np.float32(in_len) / np.float32(out_len)
    i = np.arange(out_len, dtype=np.float32)
    return np.minimum(np.floor(i * scale).astype(np.int64), in_len - 1)


def reference(folder, name, channels, batch, k, crop, fill):
    """Pillow's conversion of the item's image, cut at the reported window, mirrored as reported, placed
    at the centre of a `fill`ed sample (the crop recipe pads a smaller image around its centre)."""
    with Image.open(folder / "png" / "c" / f"{name}.png") as im:
        img = np.asarray(im.convert(MODES[channels]))
    img = img.reshape(img.shape[0], img.shape[1], channels)
    top, left, h, w = (int(v) for v in np.asarray(batch.windows)[k])
    win = img[top : top + h, left : left + w]
    if np.asarray(batch.flipped)[k]:
        win = win[:, ::-1]
    out = np.full((crop[0], crop[1], channels), fill, np.uint8)
    dy, dx = (crop[0] - h) // 2, (crop[1] - w) // 2
    out[dy : dy + h, dx : dx + w] = win
    return out


@pytest.mark.parametrize("source", ["png", "l3"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("channels", [1, 4, 3])
def test_samples_equal_pillows_conversion(folder, source, layout, channels):
    crop = (24, 30)  # taller than some images, wider than others: crops and padding both
    loader = l3.Loader(
        folder / source, 2, crop=crop, random_crop=True, flip=True, seed=3, epochs=2, shuffle=True,
        layout=layout, channels=channels, fill=7, rank=0, world_size=1,
    )
    names = sorted(IMAGES)  # the dataset's item order: the folder's sorted files
    seen = 0
    for batch in loader:
        x = nhwc(batch, channels)
        assert x.shape[1:] == (crop[0], crop[1], channels)
        for k, item in enumerate(batch.indices):
            want = reference(folder, names[item], channels, batch, k, crop, 7)
            np.testing.assert_array_equal(x[k], want, err_msg=f"{source} {names[item]}")
            seen += 1
    assert seen == 2 * len(IMAGES)


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_a_luma_sample_is_resampled_after_the_conversion(folder, interpolation):
    """As ``Image.convert("L").resize(...)``: the colour window becomes luma first, then is resampled
    (bilinear within ±1 of Pillow; nearest picks source pixels, so it is exact either way)."""
    crop = (16, 16)
    loader = l3.Loader(
        folder / "l3", 4, crop=crop, scale=(0.3, 1.0), interpolation=interpolation, flip=True,
        channels=1, shuffle=False, epochs=1, rank=0, world_size=1,
    )
    names = sorted(IMAGES)
    for batch in loader:
        x = nhwc(batch, 1)[..., 0]
        for k, item in enumerate(batch.indices):
            top, left, h, w = (int(v) for v in np.asarray(batch.windows)[k])
            with Image.open(folder / "png" / "c" / f"{names[item]}.png") as im:
                gray = im.convert("L")
            if interpolation == "bilinear":
                # torchvision's RandomResizedCrop: the window cut out, then resized.
                window = gray.crop((left, top, left + w, top + h))
                ref = np.asarray(window.resize((crop[1], crop[0]), Image.BILINEAR, reducing_gap=None))
            else:
                a = np.asarray(gray)[top : top + h, left : left + w]
                ys = nearest_index(h, crop[0])
                xs = nearest_index(w, crop[1])
                ref = a[ys][:, xs]
            if np.asarray(batch.flipped)[k]:
                ref = ref[:, ::-1]
            diff = np.abs(x[k].astype(int) - ref.astype(int)).max()
            assert diff <= (1 if interpolation == "bilinear" else 0), (names[item], diff)


def test_luma_floats_take_one_mean_and_std(folder):
    kw = dict(crop=(8, 8), shuffle=False, epochs=1, channels=1, dtype="float32", rank=0, world_size=1)
    u8 = next(iter(l3.Loader(folder / "png", 4, channels=1, crop=(8, 8), shuffle=False, epochs=1,
                             rank=0, world_size=1)))
    f = next(iter(l3.Loader(folder / "png", 4, mean=0.5, std=0.25, **kw)))
    got = np.from_dlpack(f.images)
    want = (np.from_dlpack(u8.images).astype(np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    with pytest.raises(l3.OptionsError, match="mean"):
        l3.Loader(folder / "png", 4, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), **kw)


def test_bad_channels_are_refused_by_name(folder):
    for bad in (0, 2, 5):
        with pytest.raises(l3.OptionsError, match="channels"):
            l3.Loader(folder / "png", 2, channels=bad, rank=0, world_size=1)


def test_a_state_resumes_only_with_the_same_channels(folder):
    kw = dict(crop=(8, 8), shuffle=True, seed=1, epochs=1, rank=0, world_size=1)
    a = l3.Loader(folder / "png", 1, channels=1, **kw)
    next(iter(a))
    state = a.state_dict()
    assert state["options"]["channels"] == 1
    with pytest.raises(l3.OptionsError, match="channels"):
        l3.Loader(folder / "png", 1, channels=4, **kw).load_state_dict(state)
    b = l3.Loader(folder / "png", 1, channels=1, **kw)
    b.load_state_dict(state)
    rest = [x.indices for x in b]
    assert len(rest) == len(IMAGES) - 1
