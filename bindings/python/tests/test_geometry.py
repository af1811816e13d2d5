"""Resampling recipes (``scale``/``ratio``, ``resize``, ``jitter``, ``interpolation``, ``fill``) against
independent references: Pillow's bilinear resize (within ±1 per value) of the window each batch reports
in ``windows`` / ``flipped``, and torchvision's nearest index rule written out in NumPy (exact)."""

import math

import numpy as np
import pytest
from PIL import Image

import l3toolkit as l3
from conftest import require_module

# Odd sizes on purpose: a single pixel, a 7x3 sliver, a 4097x2161 frame, and two ordinary photos' sizes.
SIZES = [(1, 1), (7, 3), (4097, 2161), (640, 480), (301, 203)]
CROP = (48, 64)  # height, width


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A folder of PNGs of SIZES (smooth gradients plus noise, one gray), the same as L3, and their pixels."""
    root = tmp_path_factory.mktemp("geometry")
    png = root / "png" / "c"
    png.mkdir(parents=True)
    rng = np.random.default_rng(5)
    pixels = []
    for n, (w, h) in enumerate(SIZES):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
        img = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
        if n == 3:
            img[..., 1] = img[..., 2] = img[..., 0]
            Image.fromarray(img[..., 0], "L").save(png / f"{n}.png")
        else:
            Image.fromarray(img, "RGB").save(png / f"{n}.png")
        pixels.append(img)
    l3.convert(root / "png", root / "l3", to="l3", progress=False)
    return root, pixels


def nhwc(batch):
    a = np.from_dlpack(batch.images)
    if a.shape[1] == 3 and a.shape[-1] != 3:
        a = a.transpose(0, 2, 3, 1)
    return a


def pil_resize(img, size, box=None):
    im = Image.fromarray(img, "RGB")
    return np.asarray(im.resize(size, Image.BILINEAR, box=box, reducing_gap=None))


def nearest_index(in_len, out_len):
    """torchvision's ``interpolate(mode="nearest")``: floor(i * (in / out)) in float32, clamped."""
    scale = np.float32(in_len) / np.float32(out_len)
    i = np.arange(out_len, dtype=np.float32)
    return np.minimum(np.floor(i * scale).astype(np.int64), in_len - 1)


def resize_shorter(w, h, s):
    """torchvision's Resize(s): the shorter side s, the longer int(s * long / short)."""
    if w <= h:
        return s, int(s * h / w)
    return int(s * w / h), s


def place(length, crop):
    """torchvision's CenterCrop on one axis: (offset into the image, padding before it)."""
    if length >= crop:
        return int(round((length - crop) / 2.0)), 0
    return 0, (crop - length) // 2


def expect_resized_crop(img, win, flipped, nearest):
    top, left, h, w = win
    ch, cw = CROP
    if nearest:
        ys = top + nearest_index(h, ch)
        xs = left + nearest_index(w, cw)
        out = img[ys][:, xs]
    else:
        out = pil_resize(np.ascontiguousarray(img[top : top + h, left : left + w]), (cw, ch))
    return out[:, ::-1] if flipped else out


def expect_resize_then_crop(img, size, fill, offsets, nearest):
    """The whole image resized to ``size`` (w, h), then a CROP at ``offsets`` (oy, ox) in the resized
    frame (negative: padding before), filled with ``fill`` outside."""
    rw, rh = size
    if nearest:
        big = img[nearest_index(img.shape[0], rh)][:, nearest_index(img.shape[1], rw)]
    else:
        big = pil_resize(img, (rw, rh))
    ch, cw = CROP
    out = np.full((ch, cw, 3), fill, np.uint8)
    oy, ox = offsets
    y0, x0 = max(oy, 0), max(ox, 0)
    y1, x1 = min(oy + ch, rh), min(ox + cw, rw)
    out[y0 - oy : y1 - oy, x0 - ox : x1 - ox] = big[y0:y1, x0:x1]
    return out


def batches(source, **kw):
    with l3.Loader(source, len(SIZES), crop=CROP, shuffle=False, threads=2, **kw) as loader:
        return list(loader)


def check(got, want, exact, what):
    d = np.abs(got.astype(np.int16) - want.astype(np.int16))
    limit = 0 if exact else 1
    assert d.max() <= limit, f"{what}: {int((d > limit).sum())} values off, by up to {d.max()}"


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("kind", ["png", "l3"])
def test_random_resized_crops_are_pillows_resize_of_the_reported_window(images, interpolation, kind):
    root, pixels = images
    for layout in ["NCHW", "NHWC"]:
        (b,) = batches(root / kind, scale=(0.08, 1.0), flip=True, seed=3, layout=layout, interpolation=interpolation)
        a = nhwc(b)
        assert b.windows.shape == (len(SIZES), 4) and b.windows.dtype == np.int64
        assert b.flipped.dtype == np.bool_ and b.sizes.tolist() == [list(CROP)] * len(SIZES)
        for k, i in enumerate(b.indices):
            img = pixels[i]
            top, left, h, w = b.windows[k]
            assert 0 <= top and top + h <= img.shape[0] and 0 <= left and left + w <= img.shape[1]
            want = expect_resized_crop(img, b.windows[k], b.flipped[k], interpolation == "nearest")
            check(a[k], want, interpolation == "nearest", f"{kind} item {i} {layout} {interpolation}")
    flips = [bool(f) for b in batches(root / "png", scale=(0.5, 1.0), flip=True, seed=4) for f in b.flipped]
    assert any(flips) or len(flips) < 3


def test_resize_then_centre_crop_is_torchvisions_evaluation_recipe(images):
    root, pixels = images
    for interpolation in ["bilinear", "nearest"]:
        (b,) = batches(root / "png", resize=56, interpolation=interpolation, fill=7)
        a = nhwc(b)
        for k, i in enumerate(b.indices):
            img = pixels[i]
            rw, rh = resize_shorter(img.shape[1], img.shape[0], 56)
            (oy, py), (ox, px) = place(rh, CROP[0]), place(rw, CROP[1])
            want = expect_resize_then_crop(img, (rw, rh), 7, (oy - py, ox - px), interpolation == "nearest")
            check(a[k], want, interpolation == "nearest", f"resize item {i} {interpolation}")
            assert b.sizes[k].tolist() == [min(rh, CROP[0]), min(rw, CROP[1])]


@pytest.mark.parametrize("kind", ["png", "l3"])
def test_jitter_equals_resizing_the_whole_image_then_cropping(images, kind):
    root, pixels = images
    # A fixed factor, so that the test knows the rescaled size; centre crops reaching past small images.
    (b,) = batches(root / kind, jitter=(0.75, 0.75), fill=9)
    a = nhwc(b)
    for k, i in enumerate(b.indices):
        img = pixels[i]
        rw, rh = max(int(img.shape[1] * 0.75), 1), max(int(img.shape[0] * 0.75), 1)
        (oy, py), (ox, px) = place(rh, CROP[0]), place(rw, CROP[1])
        want = expect_resize_then_crop(img, (rw, rh), 9, (oy - py, ox - px), False)
        check(a[k], want, False, f"jitter item {i} ({kind})")
    # Random factors and positions stay inside the sample and the image.
    for b in batches(root / kind, jitter=(0.5, 2.0), random_crop=True, flip=True, seed=11):
        for k, i in enumerate(b.indices):
            h, w = pixels[i].shape[:2]
            top, left, wh, ww = b.windows[k]
            assert 0 <= top and top + wh <= h and 0 <= left and left + ww <= w
            assert 1 <= b.sizes[k][0] <= CROP[0] and 1 <= b.sizes[k][1] <= CROP[1]


def test_region_reads_give_the_same_samples_as_whole_reads(images):
    root, _ = images
    for kw in [dict(scale=(0.08, 1.0)), dict(jitter=(0.5, 2.0), random_crop=True), dict(resize=40)]:
        region = batches(root / "l3", decode="region", flip=True, seed=2, **kw)
        whole = batches(root / "l3", decode="whole", flip=True, seed=2, **kw)
        png = batches(root / "png", flip=True, seed=2, **kw)
        for r, w, p in zip(region, whole, png):
            assert np.array_equal(nhwc(r), nhwc(w)), kw
            assert np.array_equal(nhwc(r), nhwc(p)), kw
            assert np.array_equal(r.windows, w.windows)


def test_float_batches_hold_the_same_resampled_values(images):
    root, _ = images
    (u8,) = batches(root / "png", scale=(0.2, 0.9), seed=8)
    (f32,) = batches(root / "png", scale=(0.2, 0.9), seed=8, dtype="float32")
    back = np.rint(np.from_dlpack(f32.images) * 255).astype(np.uint8)
    assert np.array_equal(np.from_dlpack(u8.images), back)


def test_every_item_once_per_epoch_and_resume_is_exact(images):
    root, _ = images
    kw = dict(crop=CROP, scale=(0.1, 1.0), flip=True, seed=6, threads=2, epochs=2)
    with l3.Loader(root / "png", 2, **kw) as loader:
        full = list(loader)
    for e in range(2):
        ids = sorted(int(i) for b in full if b.epoch == e for i in b.indices)
        assert ids == list(range(len(SIZES)))
    with l3.Loader(root / "png", 2, **kw) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    with l3.Loader(root / "png", 2, **kw) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    assert [np.from_dlpack(b.images).tobytes() for b in rest] == [
        np.from_dlpack(b.images).tobytes() for b in full[1:]
    ]
    assert all(np.array_equal(r.windows, f.windows) for r, f in zip(rest, full[1:]))
    with l3.Loader(root / "png", 2, **{**kw, "scale": (0.2, 1.0)}) as other:
        with pytest.raises(l3.OptionsError, match="scale"):
            other.load_state_dict(state)


def test_options_are_checked_by_name(images):
    root, _ = images
    for kw, name in [
        (dict(scale=(0.9, 0.1)), "scale"),
        (dict(scale=(0.1, 1.0), resize=10), "resize"),
        (dict(ratio=(1, 2)), "ratio"),
        (dict(jitter=(0, 1)), "jitter"),
        (dict(resize=0), "resize"),
        (dict(interpolation="bicubic"), "interpolation"),
        (dict(fill=300), "fill"),
    ]:
        with pytest.raises(l3.OptionsError, match=name):
            l3.Loader(root / "png", 2, **kw)


@pytest.mark.parametrize(
    "recipe",
    [
        dict(scale=(0.08, 1.0), flip=True),
        dict(resize=40, random_crop=True, interpolation="nearest", layout="NHWC"),
        dict(jitter=(0.5, 2.0), random_crop=True, fill=114, dtype="float16",
             mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        dict(scale=(0.08, 1.0), flip=True, channels=1),
        dict(jitter=(0.5, 2.0), random_crop=True, fill=7, channels=1, dtype="float32", mean=0.5, std=0.25),
        dict(resize=40, random_crop=True, interpolation="nearest", channels=4, layout="NHWC"),
        dict(jitter=(0.5, 2.0), random_crop=True, fill=9, channels=4, dtype="float16"),
        dict(random_crop=True, flip=True, channels=1),
        dict(random_crop=True, flip=True, channels=4, layout="NHWC"),
    ],
    ids=["resized-crop", "resize-nearest", "jitter-fill-f16", "luma-resized-crop", "luma-jitter-f32",
         "rgba-resize-nearest", "rgba-jitter-f16", "luma-crop", "rgba-crop"],
)
def test_cuda_resampled_batches_equal_cpu_batches(images, recipe):
    """device="cuda" applies every transform in the kernels (resampling with the CPU's integer tables,
    padding with ``fill``): each device batch, viewed by torch without a copy, equals the CPU loader's
    batch bit for bit, and so do the reported windows and flips."""
    torch = require_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root, _ = images
    kw = dict(seed=7, epochs=1, **recipe)
    gpu, cpu = batches(root / "l3", device="cuda", **kw), batches(root / "l3", **kw)
    assert len(gpu) == len(cpu) > 0
    for g, c in zip(gpu, cpu):
        assert g.images.device == "cuda:0"
        t = torch.from_dlpack(g.images)
        assert t.device.type == "cuda"
        assert np.array_equal(t.cpu().numpy(), np.from_dlpack(c.images))
        assert np.array_equal(np.asarray(g.windows), np.asarray(c.windows))
        assert np.array_equal(np.asarray(g.flipped), np.asarray(c.flipped))


def test_torchvision_v2_agrees(images):
    torch = require_module("torch")
    require_module("torchvision")
    from torchvision.transforms.v2 import functional as F

    root, pixels = images
    (b,) = batches(root / "png", scale=(0.08, 1.0), flip=True, seed=3)
    a = nhwc(b)
    for k, i in enumerate(b.indices):
        t = torch.from_numpy(pixels[i]).permute(2, 0, 1)
        top, left, h, w = (int(v) for v in b.windows[k])
        want = F.resized_crop(t, top, left, h, w, list(CROP), antialias=True)
        if b.flipped[k]:
            want = F.horizontal_flip(want)
        check(a[k], want.permute(1, 2, 0).numpy(), False, f"torchvision item {i}")
