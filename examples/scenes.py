"""A small synthetic dataset with both kinds of targets, laid out as real ones are: images in a class folder,
a label map per image (a segmentation mask, same relative name) and a COCO instances file (boxes), and the
images converted to L3 by the toolkit. The training examples build it when they are given no data.

    root/png/scenes/0000.png      the images as PNG (the source of the conversion)
    root/l3/scenes/0000.l3        the same images as L3 (what the examples train on)
    root/masks/scenes/0000.png    uint8 label maps: 0 background, 1..3 the shapes' classes
    root/instances.json           COCO: one box per shape, category ids 1..3

Each image is a smooth random background with a few shapes; a shape's class decides its form and its
colour family (rectangle: reddish, ellipse: greenish, triangle: bluish), so a small network can learn the
classes in a few hundred steps, and a few steps already move the loss.
"""

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

import l3toolkit as l3

CLASSES = ("background", "rectangle", "ellipse", "triangle")
BASE_COLOUR = {1: (200, 60, 50), 2: (60, 190, 70), 3: (60, 80, 210)}


def make_scenes(root, count: int = 32, size=(96, 128), seed: int = 0) -> Path:
    """Writes the dataset under ``root`` (see the module's docstring) and returns ``root``; an image size is
    (height, width). Deterministic for a given ``seed``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    h, w = size
    coco = {
        "images": [],
        "annotations": [],
        "categories": [{"id": c, "name": name} for c, name in enumerate(CLASSES) if c],
    }
    for d in ("png/scenes", "masks/scenes"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        name = f"scenes/{i:04d}.png"
        image, mask, boxes = scene(rng, h, w)
        image.save(root / "png" / name)
        mask.save(root / "masks" / name)
        coco["images"].append({"id": i, "file_name": name, "width": w, "height": h})
        for cls, (x1, y1, x2, y2) in boxes:
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1, "image_id": i, "category_id": cls, "iscrowd": 0,
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
            })
    (root / "instances.json").write_text(json.dumps(coco))
    l3.convert(root / "png", root / "l3", to="l3", progress=False)
    return root


def scene(rng, h: int, w: int):
    """One image (RGB), its label map (L) and its boxes [(class, (x1, y1, x2, y2))] in pixels."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    a, b = rng.uniform(-1, 1, 2)
    ramp = (a * xx / w + b * yy / h + 1) / 2
    low, high = rng.integers(20, 120, 3), rng.integers(120, 235, 3)
    bg = low + ramp[..., None] * (high - low) + rng.normal(0, 6, (h, w, 3))
    image = Image.fromarray(bg.clip(0, 255).astype(np.uint8))
    mask = Image.new("L", (w, h), 0)
    instances = Image.new("L", (w, h), 0)
    draw, draw_mask, draw_inst = ImageDraw.Draw(image), ImageDraw.Draw(mask), ImageDraw.Draw(instances)
    drawn = []
    for k in range(1, int(rng.integers(2, 5))):
        cls = int(rng.integers(1, len(CLASSES)))
        bw, bh = int(rng.integers(w // 6, w // 2)), int(rng.integers(h // 6, h // 2))
        x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        x2, y2 = x1 + bw - 1, y1 + bh - 1
        colour = tuple(int(c) for c in np.clip(np.array(BASE_COLOUR[cls]) + rng.integers(-30, 31, 3), 0, 255))
        for d, fill in ((draw, colour), (draw_mask, cls), (draw_inst, k)):
            if cls == 1:
                d.rectangle((x1, y1, x2, y2), fill=fill)
            elif cls == 2:
                d.ellipse((x1, y1, x2, y2), fill=fill)
            else:
                d.polygon([(x1, y2), ((x1 + x2) // 2, y1), (x2, y2)], fill=fill)
        drawn.append((k, cls))
    # A box is the extent of what is left visible of its shape (a later shape may cover part or all of it).
    ids = np.asarray(instances)
    boxes = []
    for k, cls in drawn:
        ys, xs = np.nonzero(ids == k)
        if len(xs):
            boxes.append((cls, (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))))
    return image, mask, boxes
