"""Semantic segmentation with masks: torchvision's DeepLabV3 (MobileNetV3 backbone, no pretrained weights)
trained on L3 images and their label maps streamed by ``l3toolkit.Loader``.

    python examples/train_segmentation.py [DATA] [--steps N] [--batch-size B]

DATA is a folder laid out as ``scenes.py`` describes (``l3/`` images, ``masks/`` label maps); without it a
small synthetic one is built in a temporary folder. Prints one ``step N loss X`` line per step. On a CUDA
machine the batches are page-locked and copied to the GPU asynchronously; elsewhere it trains on the CPU.
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

import l3toolkit as l3
from scenes import CLASSES, make_scenes

IGNORE = 255  # label-map value that no loss counts: the padding past an image's edge after jitter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", type=Path, help="dataset folder (default: a synthetic one)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--crop", type=int, default=96)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="l3-scenes-") as tmp:
        root = args.data or make_scenes(tmp)
        return train(root, args)


def train(root: Path, args) -> int:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    # DeepLab's recipe: the whole image rescaled by a random factor, a random crop (padded with IGNORE in
    # the mask where it reaches past the image), a random flip; ImageNet normalisation, NCHW float32.
    loader = l3.Loader(
        root / "l3", args.batch_size, crop=args.crop, jitter=(0.5, 2.0), random_crop=True, flip=True,
        masks=root / "masks", ignore_index=IGNORE, dtype="float32",
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), seed=0, pin_memory=cuda,
        drop_last=True,  # BatchNorm in training needs more than one sample: no short tail batch
    )
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=len(CLASSES)
    ).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.steps:
        for batch in loader:  # one epoch per loop; the next loop is the next epoch
            x = torch.from_dlpack(batch.images).to(device, non_blocking=True)  # (B, 3, crop, crop), no copy
            y = torch.from_dlpack(batch.masks).to(device, non_blocking=True).long()  # (B, crop, crop)
            loss = F.cross_entropy(model(x)["out"], y, ignore_index=IGNORE)
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
