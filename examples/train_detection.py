"""Object detection with boxes: torchvision's Faster R-CNN (MobileNetV3-FPN backbone at 320 px, no pretrained
weights) trained on whole L3 images and their COCO boxes streamed by ``l3toolkit.Loader``.

    python examples/train_detection.py [DATA] [--steps N] [--batch-size B]

DATA is a folder laid out as ``scenes.py`` describes (``l3/`` images, ``instances.json`` COCO boxes); without
it a small synthetic one is built in a temporary folder. Prints one ``step N loss X`` line per step (the sum
of Faster R-CNN's four losses). On a CUDA machine the batches are page-locked and copied to the GPU
asynchronously; elsewhere it trains on the CPU.
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch
import torchvision

import l3toolkit as l3
from scenes import CLASSES, make_scenes

SHORTER, LONGER = 320, 640  # the model's own resize, done by the loader instead (torchvision's rule)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", type=Path, help="dataset folder (default: a synthetic one)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="l3-scenes-") as tmp:
        root = args.data or make_scenes(tmp)
        return train(root, args)


def train(root: Path, args) -> int:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    # Detection's recipe: whole images (crop=None), resized to a shorter side of SHORTER with the longer one
    # at most LONGER, randomly flipped — the boxes scaled and mirrored with them. Each batch is padded to its
    # largest image; batch.sizes gives every image's valid height and width. float32 in [0, 1], as
    # torchvision's detection models take it (they normalise inside).
    loader = l3.Loader(
        root / "l3", args.batch_size, crop=None, resize=SHORTER, max_size=LONGER, flip=True,
        boxes=root / "instances.json", dtype="float32", seed=0, pin_memory=cuda,
        drop_last=True,  # BatchNorm in training needs more than one sample: no short tail batch
    )
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=len(CLASSES), min_size=SHORTER, max_size=LONGER,
    ).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    step = 0
    while step < args.steps:
        for batch in loader:  # one epoch per loop; the next loop is the next epoch
            x = torch.from_dlpack(batch.images).to(device, non_blocking=True)  # (B, 3, H, W), no copy
            images = [x[k, :, :h, :w] for k, (h, w) in enumerate(batch.sizes.tolist())]
            targets = [
                {"boxes": torch.from_numpy(b).to(device), "labels": torch.from_numpy(c).to(device)}
                for b, c in zip(batch.boxes, batch.box_labels)
            ]
            losses = model(images, targets)
            loss = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            value = loss.item()
            print(f"step {step} loss {value:.4f}", flush=True)
            if not math.isfinite(value):
                print("the loss is not finite", file=sys.stderr)
                return 1
            step += 1
            if step == args.steps:
                break
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
