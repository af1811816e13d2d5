"""Masks and boxes from Python: a Cityscapes-like tree made from the corpus (label maps by colour
quantisation, one COCO box per class present), checked against Pillow and an independent box
computation; and torchvision's own transforms."""

import json

import numpy as np
import pytest
from PIL import Image

import l3toolkit as l3
from conftest import corpus_files, require_module

CROP = (40, 56)


def classes(rgb: np.ndarray) -> np.ndarray:
    """19 classes from colours (2 levels of red, 3 of green and blue, folded)."""
    r, g, b = rgb[..., 0] // 128, rgb[..., 1] // 86, rgb[..., 2] // 86
    return ((r.astype(np.int32) * 9 + g * 3 + b) % 19).astype(np.uint8)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("cityscapes")
    images, masks = root / "leftImg8bit", root / "gtFine"
    coco = {"images": [], "annotations": [], "categories": [{"id": c, "name": str(c)} for c in range(19)]}
    truth = {}
    for i, path in enumerate(corpus_files()[:6]):
        with Image.open(path) as im:
            im = im.convert("RGB")
            size = (31, 23) if i == 0 else (im.width // 16, im.height // 16)
            rgb = np.asarray(im.resize(size, Image.BILINEAR))
        city = ["aachen", "bochum"][i % 2]
        name = f"train/{city}/{path.stem.replace('-', '_')}_{i:06d}_leftImg8bit.png"
        for base in (images, masks):
            (base / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgb).save(images / name)
        label = classes(rgb)
        Image.fromarray(label).save(masks / name.replace("_leftImg8bit", "_gtFine_labelIds"))
        coco["images"].append({"id": i, "file_name": name, "width": rgb.shape[1], "height": rgb.shape[0]})
        boxes = []
        for c in np.unique(label):
            ys, xs = np.nonzero(label == c)
            x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            boxes.append((float(x1), float(y1), float(x2), float(y2), int(c)))
            coco["annotations"].append(
                {"id": len(coco["annotations"]) + 1, "image_id": i, "category_id": int(c), "iscrowd": 0,
                 "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]}
            )
        truth[name] = (rgb, label, boxes)
    (root / "instances.json").write_text(json.dumps(coco))
    return root, truth


def loader(root, **kw):
    return l3.Loader(
        root / "leftImg8bit", 3, crop=CROP, layout="NHWC", seed=3, threads=2,
        masks=root / "gtFine", image_suffix="_leftImg8bit", mask_suffix="_gtFine_labelIds",
        boxes=root / "instances.json", **kw,
    )


def torch_nearest(n_in: int, n_out: int) -> np.ndarray:
    """PyTorch's ``interpolate(mode="nearest")`` source indices: ``floor(j * (in / out))`` in float32."""
    scale = np.float32(n_in) / np.float32(n_out)
    return np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64), n_in - 1)


def expected_boxes(boxes, top, left, h, w, out_h, out_w, flipped, dy=0, dx=0):
    """Boxes through a window (top, left, h, w) resized to (out_h, out_w), landing at (dy, dx)."""
    exp = []
    for x1, y1, x2, y2, c in boxes:
        a = (np.array([x1, x2]) - left) * out_w / w
        if flipped:
            a = out_w - a[::-1]
        a = np.clip(a + dx, dx, dx + out_w)
        t = np.clip((np.array([y1, y2]) - top) * out_h / h + dy, dy, dy + out_h)
        if a[1] - a[0] >= 1 and t[1] - t[0] >= 1:
            exp.append((a[0], t[0], a[1], t[1], c))
    return sorted(exp)


def check_boxes(b, i, exp, name):
    got = sorted((*map(float, bx), int(c)) for bx, c in zip(b.boxes[i], b.box_labels[i]))
    assert b.boxes[i].dtype == np.float32 and b.boxes[i].shape == (len(got), 4)
    assert b.box_labels[i].dtype == np.int64
    assert len(got) == len(exp), (name, got, exp)
    for g, e in zip(got, exp):
        assert np.allclose(g[:4], e[:4], atol=1e-3) and g[4] == e[4], (name, g, e)


def test_masks_and_boxes_match_pillow_and_an_independent_computation(tree):
    """Centre crops: the mask is Pillow's crop of the label map at ``batch.windows``, padded with 255."""
    root, truth = tree
    names = sorted(truth)
    seen = []
    with loader(root, shuffle=False) as ld:
        for b in ld:
            m = np.from_dlpack(b.masks)
            assert m.dtype == np.uint8 and m.shape == (len(b), *CROP)
            assert b.masks.dtype == "uint8"
            for i, idx in enumerate(b.indices):
                name = names[idx]
                rgb, label, boxes = truth[name]
                top, left, h, w = (int(v) for v in b.windows[i])
                assert (h, w) == tuple(b.sizes[i]) and not b.flipped[i]
                dy, dx = (CROP[0] - h) // 2, (CROP[1] - w) // 2
                want = np.full(CROP, 255, np.uint8)
                crop = Image.fromarray(label).crop((left, top, left + w, top + h))
                want[dy:dy + h, dx:dx + w] = np.asarray(crop)
                np.testing.assert_array_equal(m[i], want, err_msg=name)
                check_boxes(b, i, expected_boxes(boxes, top, left, h, w, h, w, False, dy, dx), name)
                seen.append(idx)
    assert sorted(seen) == list(range(len(names)))


def test_random_resized_crops_follow_the_windows(tree):
    """``scale=``: each mask is its window resized by PyTorch's nearest rule, mirrored as ``flipped`` says;
    boxes within 1e-3 px of the same geometry computed here."""
    root, truth = tree
    names = sorted(truth)
    with loader(root, shuffle=False, scale=(0.1, 1.0), flip=True, epochs=2) as ld:
        flips = set()
        for b in ld:
            m = np.from_dlpack(b.masks)
            for i, idx in enumerate(b.indices):
                rgb, label, boxes = truth[names[idx]]
                top, left, h, w = (int(v) for v in b.windows[i])
                rows, cols = top + torch_nearest(h, CROP[0]), left + torch_nearest(w, CROP[1])
                want = label[np.ix_(rows, cols)]
                if b.flipped[i]:
                    want = want[:, ::-1]
                flips.add(bool(b.flipped[i]))
                np.testing.assert_array_equal(m[i], want, err_msg=names[idx])
                exp = expected_boxes(boxes, top, left, h, w, *CROP, bool(b.flipped[i]))
                check_boxes(b, i, exp, names[idx])
    assert flips == {True, False}


def test_random_crops_and_flips_keep_masks_on_their_images(tree):
    """Whatever the recipe, with nearest images a mask equals its quantised image wherever the image is."""
    root, truth = tree
    with loader(root, random_crop=True, flip=True, epochs=2, jitter=(0.5, 2.0), interpolation="nearest") as ld:
        seen = []
        for b in ld:
            x = np.from_dlpack(b.images)
            m = np.from_dlpack(b.masks)
            for i in range(len(b)):
                valid = m[i] != 255
                np.testing.assert_array_equal(m[i][valid], classes(x[i])[valid])
                assert (x[i][~valid] == 0).all()
            seen += [(b.epoch, int(j)) for j in b.indices]
    assert len(seen) == len(set(seen)) == 2 * len(truth)


def test_target_errors_name_the_files(tree, tmp_path):
    root, truth = tree
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [')
    with pytest.raises(l3.FormatError, match="bad.json"):
        l3.Loader(root / "leftImg8bit", 2, crop=CROP, boxes=bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"images": [{"id": 1, "file_name": "train/x/elsewhere.png"}]}))
    with pytest.raises(l3.FormatError, match="elsewhere"):
        l3.Loader(root / "leftImg8bit", 2, crop=CROP, boxes=other)
    with pytest.raises(l3.FormatError, match="mask .*gtFine.* is missing"):
        l3.Loader(root / "leftImg8bit", 2, crop=CROP, masks=root / "gtFine")  # no suffix mapping
    # The GPU decodes L3 only: PNG masks on a device are refused by name, before any device is opened.
    with pytest.raises(l3.FormatError, match="(?s)gtFine.*l3 convert --to l3"):
        loader(root, device="cuda")


@pytest.mark.parametrize(
    "recipe",
    [
        dict(flip=True),
        dict(jitter=(0.5, 2.0), random_crop=True, flip=True, fill=7, ignore_index=250),
        dict(scale=(0.08, 1.0), flip=True, interpolation="nearest", channels=1),
    ],
    ids=["crop", "jitter", "resized-crop-luma"],
)
def test_cuda_masks_equal_cpu_masks(tree, tmp_path, recipe):
    """device="cuda" decodes one-channel L3 masks in the kernels beside their images, with the images'
    geometries: each device batch's images and masks, viewed by torch without a copy, equal the CPU
    loader's byte for byte."""
    torch = require_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root, _ = tree
    l3.convert(root / "leftImg8bit", tmp_path / "img", to="l3", progress=False)
    l3.convert(root / "gtFine", tmp_path / "gt", to="l3", progress=False)
    kw = dict(crop=CROP, seed=3, threads=2, epochs=2, masks=tmp_path / "gt", image_suffix="_leftImg8bit",
              mask_suffix="_gtFine_labelIds", **recipe)
    with l3.Loader(tmp_path / "img", 3, device="cuda", **kw) as g, l3.Loader(tmp_path / "img", 3, **kw) as c:
        gpu, cpu = list(g), list(c)
    assert len(gpu) == len(cpu) > 0
    for a, b in zip(gpu, cpu):
        assert a.masks.device == "cuda:0" and a.masks.dtype == "uint8"
        m = torch.from_dlpack(a.masks)
        assert m.device.type == "cuda" and tuple(m.shape) == a.masks.shape
        assert np.array_equal(m.cpu().numpy(), np.from_dlpack(b.masks))
        assert a.masks.tobytes() == b.masks.tobytes()
        assert np.array_equal(torch.from_dlpack(a.images).cpu().numpy(), np.from_dlpack(b.images))
        assert np.array_equal(np.asarray(a.windows), np.asarray(b.windows))


def test_against_torchvision(tree):
    torch = require_module("torch")
    require_module("torchvision")
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F

    root, truth = tree
    names = sorted(truth)
    with loader(root, shuffle=False, scale=(0.1, 1.0), flip=True) as ld:
        for b in ld:
            m = torch.from_dlpack(b.masks)
            for i, idx in enumerate(b.indices):
                rgb, label, boxes = truth[names[idx]]
                top, left, h, w = (int(v) for v in b.windows[i])
                mask = tv_tensors.Mask(torch.from_numpy(label)[None])
                ref = F.resized_crop(mask, top, left, h, w, list(CROP))
                if b.flipped[i]:
                    ref = F.horizontal_flip(ref)
                assert torch.equal(m[i], ref[0]), names[idx]


def test_batches_whose_every_item_is_skipped_are_never_delivered(tmp_path):
    """Six flat images in batches of two; the masks of the last four are of another size, so the
    second and third batches have every item skipped: each epoch's loop yields only the first batch
    (never an empty one), its skipped items come with the next batch delivered, and the loop ends
    with the epoch."""
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    for i, name in enumerate("abcdef"):
        Image.fromarray(np.full((24, 32, 3), 10 * (i + 1), np.uint8)).save(images / f"{name}.png")
        size = (32, 24) if i < 2 else (5, 5)
        Image.fromarray(np.full(size[::-1], i + 1, np.uint8)).save(masks / f"{name}.png")
    loader = l3.Loader(images, 2, crop=(24, 32), shuffle=False, threads=2, masks=masks, skip_errors=True)
    for epoch in range(2):
        batches = list(loader)
        assert [len(b) for b in batches] == [2], epoch
        assert [int(i) for i in batches[0].indices] == [0, 1]
        # Epoch 0's first batch has nothing skipped before it; epoch 1's carries epoch 0's four.
        assert len(batches[0].skipped) == 4 * epoch
