"""``crop=None``: whole images, each at its own size (after ``resize``, ``jitter`` or ``max_size``), every
batch padded bottom and right to its largest — checked against Pillow's resize of each image, with masks
(nearest, padded with ``ignore_index``) and boxes, from PNG and L3, in both layouts and as floats; resume
and the refusals by name."""

import json
import os

import numpy as np
import pytest
from PIL import Image

import l3toolkit as l3
from conftest import require_module
from test_targets import torch_nearest

# name: (width, height); odd sizes, a 1x1, one wider and one taller than the rest.
SIZES = {"a": (37, 29), "b": (23, 41), "c": (64, 17), "d": (1, 1), "e": (7, 3), "f": (50, 50)}
NAMES = sorted(SIZES)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    rng = np.random.default_rng(5)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for i, name in enumerate(NAMES):
        w, h = SIZES[name]
        for d in ("png/x", "masks/x"):
            (root / d).mkdir(parents=True, exist_ok=True)
        # Smooth images, so that a resize has structure to keep (and noise would not hide a shift).
        yy, xx = np.mgrid[0:h, 0:w]
        rgb = np.stack([(xx * 7 + yy * 3) % 256, (yy * 11) % 256, rng.integers(0, 256, (h, w))], -1)
        Image.fromarray(rgb.astype(np.uint8)).save(root / "png/x" / f"{name}.png")
        Image.fromarray(((xx + yy) % 19).astype(np.uint8)).save(root / "masks/x" / f"{name}.png")
        coco["images"].append({"id": i, "file_name": f"x/{name}.png", "width": w, "height": h})
        coco["annotations"].append(
            {"id": i + 1, "image_id": i, "category_id": 1, "iscrowd": 0, "bbox": [0.0, 0.0, w / 2, h / 2]}
        )
    (root / "boxes.json").write_text(json.dumps(coco))
    l3.convert(root / "png", root / "l3", to="l3", progress=False)
    return root


def nhwc(batch):
    a = np.from_dlpack(batch.images)
    return a if a.shape[-1] == 3 else a.transpose(0, 2, 3, 1)


def whole_size(w, h, shorter=None, max_size=None):
    """torchvision's ``Resize(shorter, max_size=...)`` sizes (``max_size`` alone: shrink only)."""
    if shorter is not None:
        short, long = min(w, h), max(w, h)
        new_short, new_long = shorter, int(shorter * long / short)
        w, h = (new_short, new_long) if w <= h else (new_long, new_short)
    if max_size is not None and max(w, h) > max_size:
        short, long = min(w, h), max(w, h)
        new_short = max(1, int(max_size * short / long))
        w, h = (new_short, max_size) if w <= h else (max_size, new_short)
    return w, h


def run(root, source, **kw):
    opts = dict(crop=None, shuffle=True, seed=7, epochs=1, rank=0, world_size=1, threads=2)
    opts.update(kw)
    return list(l3.Loader(root / source, 4, **opts))


@pytest.mark.parametrize("source", ["png", "l3"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sizing", [{}, {"max_size": 40}, {"resize": 20, "max_size": 48}])
def test_whole_images_are_padded_to_the_largest_of_their_batch(tree, source, layout, sizing):
    batches = run(tree, source, layout=layout, flip=True, fill=9, **sizing)
    seen = []
    for batch in batches:
        x = nhwc(batch)
        sizes = np.asarray(batch.sizes)
        windows = np.asarray(batch.windows)
        assert x.shape[1:3] == (sizes[:, 0].max(), sizes[:, 1].max()), "padded to the batch's largest"
        for k, item in enumerate(batch.indices):
            name = NAMES[item]
            w, h = SIZES[name]
            ow, oh = whole_size(w, h, sizing.get("resize"), sizing.get("max_size"))
            assert tuple(sizes[k]) == (oh, ow), name
            assert tuple(windows[k]) == (0, 0, h, w), "the whole image is the window"
            with Image.open(tree / "png/x" / f"{name}.png") as im:
                ref = np.asarray(im.convert("RGB").resize((ow, oh), Image.BILINEAR, reducing_gap=None))
            if np.asarray(batch.flipped)[k]:
                ref = ref[:, ::-1]
            got = x[k, :oh, :ow]
            tol = 0 if (ow, oh) == (w, h) else 1
            assert np.abs(got.astype(int) - ref.astype(int)).max() <= tol, (name, ow, oh)
            assert (x[k, oh:] == 9).all() and (x[k, :, ow:] == 9).all(), "padding holds fill"
            seen.append(item)
    assert sorted(seen) == list(range(len(NAMES))), "every item exactly once"


def test_masks_and_boxes_follow_each_whole_image(tree):
    batches = run(
        tree, "l3", max_size=30, flip=True, layout="NHWC", masks=tree / "masks", boxes=tree / "boxes.json",
        ignore_index=250,
    )
    for batch in batches:
        m = np.from_dlpack(batch.masks)
        sizes = np.asarray(batch.sizes)
        assert m.shape == (len(batch), sizes[:, 0].max(), sizes[:, 1].max())
        for k, item in enumerate(batch.indices):
            name = NAMES[item]
            w, h = SIZES[name]
            oh, ow = (int(v) for v in sizes[k])
            with Image.open(tree / "masks/x" / f"{name}.png") as im:
                label = np.asarray(im)
            ref = label[torch_nearest(h, oh)][:, torch_nearest(w, ow)]
            flipped = bool(np.asarray(batch.flipped)[k])
            if flipped:
                ref = ref[:, ::-1]
            np.testing.assert_array_equal(m[k, :oh, :ow], ref, err_msg=name)
            assert (m[k, oh:] == 250).all() and (m[k, :, ow:] == 250).all(), "masks padded with ignore_index"
            # The one box covers the top-left quarter of the image, scaled and mirrored with it.
            x1, x2 = 0.0, (w / 2) * ow / w
            if flipped:
                x1, x2 = ow - x2, ow - x1
            want = np.array([[x1, 0.0, x2, (h / 2) * oh / h]], np.float32)
            got = np.asarray(batch.boxes[k])
            if min(x2 - x1, (h / 2) * oh / h) < 1:
                assert got.shape == (0, 4), "boxes under min_box_size are dropped"
            else:
                np.testing.assert_allclose(got, want, atol=1e-3, err_msg=name)


def test_whole_float_batches_pad_with_the_normalised_fill(tree):
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    u8 = run(tree, "png", shuffle=False, fill=20, layout="NHWC")
    f32 = run(tree, "png", shuffle=False, fill=20, layout="NHWC", dtype="float32", mean=mean, std=std)
    for a, b in zip(u8, f32):
        want = (np.from_dlpack(a.images).astype(np.float32) / 255 - np.float32(mean)) / np.float32(std)
        np.testing.assert_allclose(np.from_dlpack(b.images), want, rtol=0, atol=1e-5)


def test_jitter_rescales_whole_images_and_resume_repeats_them(tree):
    kw = dict(jitter=(0.5, 1.5), max_size=60, seed=11, epochs=2)
    whole = run(tree, "png", **kw)
    for batch in whole:
        for k, item in enumerate(batch.indices):
            oh, ow = (int(v) for v in np.asarray(batch.sizes)[k])
            w, h = SIZES[NAMES[item]]
            assert max(oh, ow) <= 60 and oh >= 1 and ow >= 1
            f_w, f_h = ow / w, oh / h
            if max(w, h) >= 8 and max(ow, oh) < 60:
                assert 0.5 - 1 / min(w, h) <= min(f_w, f_h) and max(f_w, f_h) <= 1.5 + 1e-9, (item, ow, oh)
    loader = l3.Loader(tree / "png", 4, crop=None, rank=0, world_size=1, threads=2, **kw)
    it = iter(loader)
    first = next(it)
    state = loader.state_dict()
    assert state["options"]["crop"] is None and state["options"]["max_size"] == 60
    resumed = l3.Loader(tree / "png", 4, crop=None, rank=0, world_size=1, threads=2, **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 1
    for a, b in zip([first] + rest, whole):
        assert list(a.indices) == list(b.indices)
        np.testing.assert_array_equal(np.from_dlpack(a.images), np.from_dlpack(b.images))
    other = l3.Loader(tree / "png", 4, crop=None, rank=0, world_size=1, threads=2, jitter=(0.5, 1.5), seed=11)
    with pytest.raises(l3.OptionsError, match="max_size"):
        other.load_state_dict(state)


def test_whole_image_options_are_refused_by_name(tree):
    base = dict(rank=0, world_size=1)
    with pytest.raises(l3.OptionsError, match="max_size"):
        l3.Loader(tree / "png", 2, crop=(8, 8), max_size=10, **base)
    with pytest.raises(l3.OptionsError, match="scale"):
        l3.Loader(tree / "png", 2, crop=None, scale=(0.5, 1.0), **base)
    with pytest.raises(l3.OptionsError, match="random_crop"):
        l3.Loader(tree / "png", 2, crop=None, random_crop=True, **base)
    with pytest.raises(l3.OptionsError, match="max_size"):
        l3.Loader(tree / "png", 2, crop=None, resize=50, max_size=40, **base)


def test_skipped_items_leave_the_padding_to_the_rest(tree, tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    for name in ("a", "c"):
        (d / f"{name}.png").write_bytes((tree / "png/x" / f"{name}.png").read_bytes())
    (d / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    (batch,) = list(l3.Loader(tmp_path, 3, crop=None, shuffle=False, epochs=1, skip_errors=True,
                              layout="NHWC", rank=0, world_size=1))
    assert len(batch) == 2 and len(batch.skipped) == 1
    # a is 37x29 and c is 64x17: padded to 29 rows and 64 columns.
    assert np.from_dlpack(batch.images).shape == (2, 29, 64, 3)


def test_torchvision_v2_agrees(tree):
    """torchvision's ``Resize(20, max_size=48)`` of each whole image and its mask (``tv_tensors.Mask``:
    nearest), flipped as reported: images within ±1 (antialiased bilinear on uint8), masks exact."""
    torch = require_module("torch")
    require_module("torchvision")
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F

    batches = run(tree, "l3", resize=20, max_size=48, flip=True, layout="NHWC", masks=tree / "masks")
    for batch in batches:
        x, m = nhwc(batch), np.from_dlpack(batch.masks)
        for k, item in enumerate(batch.indices):
            name = NAMES[item]
            oh, ow = (int(v) for v in np.asarray(batch.sizes)[k])
            with Image.open(tree / "png/x" / f"{name}.png") as im:
                img = tv_tensors.Image(torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1))
            with Image.open(tree / "masks/x" / f"{name}.png") as im:
                mask = tv_tensors.Mask(torch.from_numpy(np.asarray(im).copy())[None])
            want = F.resize(img, [20], max_size=48, antialias=True)
            want_mask = F.resize(mask, [20], max_size=48)
            if np.asarray(batch.flipped)[k]:
                want, want_mask = F.horizontal_flip(want), F.horizontal_flip(want_mask)
            assert tuple(want.shape[1:]) == (oh, ow), name
            diff = np.abs(x[k, :oh, :ow].astype(int) - want.permute(1, 2, 0).numpy().astype(int)).max()
            assert diff <= 1, (name, diff)
            np.testing.assert_array_equal(m[k, :oh, :ow], want_mask[0].numpy(), err_msg=name)


@pytest.mark.parametrize(
    "sizing",
    [
        dict(),
        dict(max_size=30, flip=True, fill=9, layout="NHWC"),
        dict(resize=20, max_size=48, flip=True, dtype="float16", mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)),
        dict(jitter=(0.5, 1.5), max_size=60, interpolation="nearest", channels=1),
    ],
    ids=["own-size", "bounded-flip", "resize-f16", "jitter-nearest-luma"],
)
def test_cuda_whole_batches_equal_cpu_batches(tree, tmp_path, sizing):
    """device="cuda" with crop=None: the kernels resample each whole image and pad its batch to the
    largest (images with ``fill``, masks with ``ignore_index``), equal to the CPU loader byte for byte,
    with the same sizes, windows, flips and boxes. Without a GPU the loader is refused with the device's
    reason — never for the options."""
    l3.convert(tree / "masks", tmp_path / "masks", to="l3", progress=False)
    kw = dict(
        crop=None, shuffle=True, seed=5, epochs=2, rank=0, world_size=1, threads=2, masks=tmp_path / "masks",
        boxes=tree / "boxes.json", ignore_index=250, **sizing,
    )
    try:
        gpu = l3.Loader(tree / "l3", 4, device="cuda", **kw)
    except l3.GpuError as e:
        assert "device 0" in str(e), str(e)
        if os.environ.get("L3_EXPECT_GPU"):
            raise  # the GPU bundle's run: this machine has a GPU, so a refusal is a failure
        pytest.skip(f"no usable CUDA device: {e}")
    torch = require_module("torch")
    with gpu, l3.Loader(tree / "l3", 4, **kw) as cpu:
        on_gpu, on_cpu = list(gpu), list(cpu)
    assert len(on_gpu) == len(on_cpu) > 0
    for a, b in zip(on_gpu, on_cpu):
        assert a.images.device == "cuda:0" and a.masks.device == "cuda:0"
        assert a.images.shape == b.images.shape and a.masks.shape == b.masks.shape
        assert np.array_equal(torch.from_dlpack(a.images).cpu().numpy(), np.from_dlpack(b.images))
        assert np.array_equal(torch.from_dlpack(a.masks).cpu().numpy(), np.from_dlpack(b.masks))
        for field in ("sizes", "windows", "flipped", "indices"):
            assert np.array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field))), field
        for x, y in zip(a.boxes, b.boxes):
            assert np.array_equal(np.asarray(x), np.asarray(y))
