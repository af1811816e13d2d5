"""`cargo xtask bench tasks`, the Python side.

    tasks_bench.py prepare CORPUS DIR [COPIES]
        A Cityscapes-like segmentation set from the corpus: every image resized to 2048x1024 (Pillow,
        bilinear) under DIR/png/train/, its label map (19 classes by colour quantisation) under
        DIR/masks/train/ as 8-bit PNG and DIR/masks-l3/ as one-channel L3, the images converted to L3
        (DIR/l3) and raw (DIR/raw). Every file then appears COPIES times (default 8) in its folder,
        through symbolic links, so that an epoch holds many batches: with the corpus alone an ImageNet
        epoch is a single batch, which one DataLoader worker builds while the others wait.

    tasks_bench.py run DIR RECIPE SOURCE ROW THREADS SECONDS RUNS
        Times one row — RECIPE `deeplab` (scale jitter 0.5-2.0, crop 512x1024, flip, masks) or `imagenet`
        (random-resized crop 224, scale (0.08, 1), flip) — on SOURCE (png, l3, raw), with ROW `loader`
        (l3toolkit.Loader), `loader-whole` (the same, decode="whole") or `dataloader` (torch DataLoader with
        torchvision.transforms.v2 on tv_tensors Image/Mask, PIL decode, THREADS workers); on a machine with
        a GPU also `loader-cuda` (device="cuda": every transform in the kernels, each batch handed to torch
        and its stream synchronised) and `loader-images` (the CPU loader with the same work: DeepLab
        without masks, which the device path does not produce yet). Prints
        `images_per_sec<TAB>bytes_read_per_epoch`, or `error<TAB>why`.
"""

import os
import sys
import time

import numpy as np

SIZE = (2048, 1024)
DEEPLAB_CROP = (512, 1024)
IMAGENET_CROP = 224
BATCH = {"deeplab": 8, "imagenet": 32}
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".ppm", ".bmp", ".tif", ".tiff", ".webp")


def classes(rgb):
    """19 classes from colours (2 levels of red, 3 of green and blue, folded)."""
    r, g, b = rgb[..., 0] // 128, rgb[..., 1] // 86, rgb[..., 2] // 86
    return ((r.astype(np.int32) * 9 + g * 3 + b) % 19).astype(np.uint8)


def prepare(corpus, out, copies):
    from PIL import Image

    import l3toolkit as l3

    images, masks = os.path.join(out, "png", "train"), os.path.join(out, "masks", "train")
    os.makedirs(images, exist_ok=True)
    os.makedirs(masks, exist_ok=True)
    for name in sorted(os.listdir(corpus)):
        if name.startswith(".") or not name.lower().endswith(IMAGE_EXTS):
            continue
        with Image.open(os.path.join(corpus, name)) as im:
            rgb = im.convert("RGB").resize(SIZE, Image.BILINEAR)
        stem = os.path.splitext(name)[0].replace("-", "_")
        rgb.save(os.path.join(images, f"{stem}_leftImg8bit.png"))
        Image.fromarray(classes(np.asarray(rgb))).save(os.path.join(masks, f"{stem}_gtFine_labelIds.png"))
    l3.convert(os.path.join(out, "png"), os.path.join(out, "l3"), to="l3", progress=False)
    # One-channel L3 label maps, lossless: what the L3 rows read (only the patches a sample picks from).
    l3.convert(os.path.join(out, "masks"), os.path.join(out, "masks-l3"), to="l3", progress=False)
    l3.convert(os.path.join(out, "png"), os.path.join(out, "raw"), to="raw", progress=False)
    for folder in ["png", "masks", "l3", "masks-l3", "raw"]:
        train = os.path.join(out, folder, "train")
        for name in sorted(os.listdir(train)):
            for k in range(1, copies):
                os.symlink(name, os.path.join(train, f"c{k:03}_{name}"))


def files(folder):
    out = []
    for root, _, names in os.walk(folder):
        out += [os.path.join(root, n) for n in names if not n.startswith(".")]
    return sorted(out)


def loader_row(data, recipe, source, threads, decode, device="cpu", masks=True):
    import l3toolkit as l3

    kw = dict(flip=True, layout="NCHW", threads=threads, rank=0, world_size=1, decode=decode, shuffle=True,
              device=device)
    if recipe == "deeplab":
        kw.update(crop=DEEPLAB_CROP, jitter=(0.5, 2.0), random_crop=True)
        if masks:
            kw.update(masks=os.path.join(data, "masks-l3" if source == "l3" else "masks"),
                      image_suffix="_leftImg8bit", mask_suffix="_gtFine_labelIds")
    else:
        kw.update(crop=IMAGENET_CROP, scale=(0.08, 1.0))
    loader = l3.Loader(os.path.join(data, source), BATCH[recipe], **kw)
    torch = None
    if device != "cpu":
        import torch

    def epoch():
        n = 0
        for b in loader:
            if torch is not None:
                x = torch.from_dlpack(b.images)
                torch.cuda.current_stream().synchronize()
            else:
                x = np.from_dlpack(b.images)
            if b.masks is not None:
                np.from_dlpack(b.masks)
            n += x.shape[0]
        return n

    def bytes_read():
        return loader.stats()["bytes_read"]

    def close():
        print(f"{recipe} {source} {device}: {loader.stats()}", file=sys.stderr)
        loader.close()

    return epoch, bytes_read, close


class Segmentation:
    """A torch Dataset of PIL-decoded images (and masks) through a transforms.v2 pipeline."""

    def __init__(self, images, masks, transform):
        self.images, self.masks, self.transform = images, masks, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms.v2 import functional as F

        with Image.open(self.images[i]) as im:
            img = tv_tensors.Image(F.pil_to_tensor(im.convert("RGB")))
        if self.masks is None:
            return self.transform(img)
        with Image.open(self.masks[i]) as m:
            mask = tv_tensors.Mask(F.pil_to_tensor(m)[0])
        return self.transform(img, mask)


def dataloader_row(data, recipe, source, threads):
    if source != "png":
        raise RuntimeError("the DataLoader row reads PNG (Pillow cannot open L3 or raw)")
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    images = files(os.path.join(data, "png"))
    if recipe == "deeplab":
        masks = [p.replace(os.sep + "png" + os.sep, os.sep + "masks" + os.sep).replace("_leftImg8bit", "_gtFine_labelIds")
                 for p in images]
        # torchvision's segmentation reference: RandomResize of the shorter side in [0.5, 2.0) x 1024, then
        # a padded random crop (images 0, masks 255) and a flip.
        transform = v2.Compose([
            v2.RandomResize(SIZE[1] // 2, SIZE[1] * 2, antialias=True),
            v2.RandomCrop(DEEPLAB_CROP, pad_if_needed=True, fill={tv_tensors.Image: 0, tv_tensors.Mask: 255}),
            v2.RandomHorizontalFlip(),
        ])
    else:
        masks = None
        transform = v2.Compose([v2.RandomResizedCrop(IMAGENET_CROP, antialias=True), v2.RandomHorizontalFlip()])
    ds = Segmentation(images, masks, transform)
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH[recipe], shuffle=True, num_workers=threads,
                                         persistent_workers=True)
    per_epoch = sum(os.path.getsize(p) for p in images + (masks or []))
    epochs = [0]

    def epoch():
        n = 0
        for b in loader:
            x = b[0] if isinstance(b, (list, tuple)) else b
            n += x.shape[0]
        epochs[0] += 1
        return n

    return epoch, lambda: per_epoch * epochs[0], lambda: None


def timed(epoch, images_per_epoch, seconds, runs):
    """Best images/s of `runs` timings, each of as many whole epochs as fill `seconds` (after one
    warm-up epoch), and the epochs run in all."""
    t0 = time.perf_counter()
    got = epoch()
    if got != images_per_epoch:
        raise RuntimeError(f"one epoch delivered {got} of {images_per_epoch} images")
    epochs = max(1, round(seconds / max(time.perf_counter() - t0, 1e-3)))
    best, total = 0.0, 1
    for _ in range(runs):
        t0 = time.perf_counter()
        n = sum(epoch() for _ in range(epochs))
        best = max(best, n / (time.perf_counter() - t0))
        total += epochs
    return best, total


def run(data, recipe, source, row, threads, seconds, runs):
    n = len(files(os.path.join(data, "png")))
    if row == "dataloader":
        epoch, bytes_read, close = dataloader_row(data, recipe, source, threads)
    elif row == "loader-cuda":
        epoch, bytes_read, close = loader_row(data, recipe, source, threads, "region", "cuda", masks=False)
    elif row == "loader-images":
        epoch, bytes_read, close = loader_row(data, recipe, source, threads, "region", masks=False)
    else:
        epoch, bytes_read, close = loader_row(data, recipe, source, threads, "whole" if row == "loader-whole" else "region")
    try:
        best, epochs = timed(epoch, n, seconds, runs)
        return best, bytes_read() / epochs
    finally:
        close()


def main():
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 8)
        return
    data, recipe, source, row, threads, seconds, runs = sys.argv[2:]
    try:
        ips, per_epoch = run(data, recipe, source, row, int(threads), float(seconds), int(runs))
        print(f"{ips}\t{per_epoch}", flush=True)
    except Exception as e:  # a peer that is missing or fails is reported, not fatal
        print("error\t" + " ".join(f"{type(e).__name__}: {e}".split()), flush=True)


if __name__ == "__main__":
    main()
