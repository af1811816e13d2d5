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
        without masks, which the device path does not produce yet). The peers on PNG: `dataloader`,
        `dali` (NVIDIA DALI's CPU pipeline with DALI's own operators) and `spdl` (SPDL's thread pipeline,
        FFmpeg decoding with the recipe as FFmpeg filters). A peer row is checked (as `check` does) before
        it is timed. Prints `images_per_sec<TAB>bytes_read_per_epoch`, or `error<TAB>why`.

    tasks_bench.py check DIR RECIPE ROW THREADS
        Runs one epoch of a peer row (`dataloader`, `dali`, `spdl`) and checks that it delivers what the
        recipe says: every file once, batch shapes and dtypes, mask values in the class set or 255, padding
        where the mask says so, and image and mask with the same geometry (same window, same flip: the
        mask must agree with the classes of its own image better than with those of the mirrored image).
        Prints `ok<TAB>summary`, or `error<TAB>why`.
"""

import gc
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


class Peer:
    """A peer pipeline over the PNG files: `batches()` runs one epoch and yields (images NCHW uint8,
    masks NHW uint8 or None, the image files of the batch or None) as NumPy arrays; `per_epoch` is the
    bytes of the whole files it reads in an epoch."""

    def __init__(self, batches, per_epoch, close=lambda: None):
        self.batches, self.per_epoch, self.close = batches, per_epoch, close
        self.epochs = 0

    def epoch(self):
        n = sum(images.shape[0] for images, _, _ in self.batches())
        self.epochs += 1
        return n

    def bytes_read(self):
        return self.per_epoch * self.epochs


def pairs(data, recipe):
    """The PNG images and, for DeepLab, their masks (None for ImageNet), and the bytes of both."""
    images = files(os.path.join(data, "png"))
    masks = None
    if recipe == "deeplab":
        masks = [p.replace(os.sep + "png" + os.sep, os.sep + "masks" + os.sep).replace("_leftImg8bit", "_gtFine_labelIds")
                 for p in images]
    return images, masks, sum(os.path.getsize(p) for p in images + (masks or []))


def dataloader_row(data, recipe, threads):
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    images, masks, per_epoch = pairs(data, recipe)
    if recipe == "deeplab":
        # torchvision's segmentation reference: RandomResize of the shorter side in [0.5, 2.0) x 1024, then
        # a padded random crop (images 0, masks 255) and a flip.
        transform = v2.Compose([
            v2.RandomResize(SIZE[1] // 2, SIZE[1] * 2, antialias=True),
            v2.RandomCrop(DEEPLAB_CROP, pad_if_needed=True, fill={tv_tensors.Image: 0, tv_tensors.Mask: 255}),
            v2.RandomHorizontalFlip(),
        ])
    else:
        transform = v2.Compose([v2.RandomResizedCrop(IMAGENET_CROP, antialias=True), v2.RandomHorizontalFlip()])
    ds = Segmentation(images, masks, transform)
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH[recipe], shuffle=True, num_workers=threads,
                                         persistent_workers=True)

    def batches():
        for b in loader:
            if isinstance(b, (list, tuple)):
                yield b[0].numpy(), b[1].numpy(), None
            else:
                yield b.numpy(), None, None

    def close():
        # Dropping the persistent iterator stops its worker processes (a checked row's workers must not
        # compete with the timed one's).
        loader._iterator = None
        gc.collect()

    return Peer(batches, per_epoch, close)


def dali_row(data, recipe, threads, names=False):
    """NVIDIA DALI's CPU pipeline (`device_id=None`: no GPU, no CUDA runtime) with DALI's own operators.
    With `names`, the pipeline also returns the encoded files, whose source info names each sample's
    image and mask (the check's pairing test)."""
    from nvidia.dali import Pipeline, fn, types

    images, masks, per_epoch = pairs(data, recipe)
    batch = BATCH[recipe]
    pipe = Pipeline(batch_size=batch, num_threads=threads, device_id=None, seed=1234)
    with pipe:
        # Both readers shuffle with DALI's fixed per-epoch seed, so image and mask stay paired;
        # pad_last_batch ends each epoch on a batch boundary (the padding repeats the last file).
        encoded, _ = fn.readers.file(files=images, shuffle_after_epoch=True, pad_last_batch=True, name="images")
        image = fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
        coin = fn.random.coin_flip(probability=0.5)
        outputs = []
        if recipe == "deeplab":
            encoded_mask, _ = fn.readers.file(files=masks, shuffle_after_epoch=True, pad_last_batch=True)
            mask = fn.decoders.image(encoded_mask, device="cpu", output_type=types.GRAY)
            shape = fn.peek_image_shape(encoded)
            scale = fn.random.uniform(range=[0.5, 2.0])
            height, width = shape[0] * scale, shape[1] * scale
            image = fn.resize(image, resize_x=width, resize_y=height, interp_type=types.INTERP_LINEAR,
                              antialias=True)
            mask = fn.resize(mask, resize_x=width, resize_y=height, interp_type=types.INTERP_NN)
            x, y = fn.random.uniform(range=[0.0, 1.0]), fn.random.uniform(range=[0.0, 1.0])
            crop = dict(crop_h=DEEPLAB_CROP[0], crop_w=DEEPLAB_CROP[1], crop_pos_x=x, crop_pos_y=y,
                        out_of_bounds_policy="pad")
            image = fn.crop(image, fill_values=0, **crop)
            mask = fn.flip(fn.crop(mask, fill_values=255, **crop), horizontal=coin)
            outputs = [mask]
            if names:
                outputs.append(encoded_mask)
        else:
            image = fn.random_resized_crop(image, size=(IMAGENET_CROP, IMAGENET_CROP), random_area=[0.08, 1.0],
                                           random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10,
                                           interp_type=types.INTERP_LINEAR, antialias=True)
        image = fn.transpose(fn.flip(image, horizontal=coin), perm=[2, 0, 1])
        if names:
            outputs.append(encoded)
        pipe.set_outputs(image, *outputs)
    pipe.build()
    steps = -(-len(images) // batch)

    def batches():
        left = len(images)
        for _ in range(steps):
            out = pipe.run()
            take = min(batch, left)
            left -= take
            x = out[0].as_array()[:take]
            m = out[1].as_array()[:take, :, :, 0] if recipe == "deeplab" else None
            files_of = None
            if names:
                files_of = [out[-1][i].source_info() for i in range(take)]
                if recipe == "deeplab":
                    files_of = list(zip(files_of, (out[2][i].source_info() for i in range(take))))
            yield x, m, files_of

    return Peer(batches, per_epoch, lambda: None)


def rrc_window(rng, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's `RandomResizedCrop.get_params`: (top, left, height, width) of the window."""
    area = width * height
    log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = np.exp(rng.uniform(*log_ratio))
        w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    if width / height < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif width / height > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def spdl_row(data, recipe, threads):
    """SPDL: its thread pipeline (`PipelineBuilder`), FFmpeg decoding through `spdl.io`, and the recipe
    as FFmpeg filters in the decode call (SPDL's way of transforming while decoding): `scale` (bilinear,
    which swscale widens when shrinking) or `scale` with `flags=neighbor` for masks, `crop`, `hflip`.
    The random parameters are drawn per item from (epoch, item) in the worker; NumPy pastes a window that
    reaches past the rescaled image onto its fill and turns HWC into CHW."""
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    images, masks, per_epoch = pairs(data, recipe)
    batch = BATCH[recipe]

    def decode(path, filters):
        return spdl.io.to_numpy(spdl.io.convert_frames(
            spdl.io.decode_packets(spdl.io.demux_image(path), filter_desc=filters)))

    # SPDL's pipeline logs and drops a failing item; one decode first surfaces a missing FFmpeg library
    # (SPDL loads libavutil & co. at run time) as this row's error.
    decode(images[0], "format=rgb24")

    def deeplab(rng, i):
        packets = spdl.io.demux_image(images[i])
        s = rng.uniform(0.5, 2.0)
        w, h = int(packets.width * s), int(packets.height * s)
        (ch, cw), flip = DEEPLAB_CROP, rng.random() < 0.5
        top, left = int((h - ch) * rng.random()), int((w - cw) * rng.random())
        y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + ch, h), min(left + cw, w)
        window = f"crop={x1 - x0}:{y1 - y0}:{x0}:{y0}"
        out = []
        for src, flags, fmt, fill in [(packets, "bilinear", "rgb24", 0), (masks[i], "neighbor", "gray", 255)]:
            filters = f"scale={w}:{h}:flags={flags},{window},format={fmt}"
            if isinstance(src, str):
                src = spdl.io.demux_image(src)
            part = spdl.io.to_numpy(spdl.io.convert_frames(spdl.io.decode_packets(src, filter_desc=filters)))
            if part.shape[:2] != (ch, cw):
                canvas = np.full((ch, cw, part.shape[2]), fill, np.uint8)
                canvas[y0 - top:y1 - top, x0 - left:x1 - left] = part
                part = canvas
            out.append(part[:, ::-1] if flip else part)
        return np.ascontiguousarray(out[0].transpose(2, 0, 1)), np.ascontiguousarray(out[1][:, :, 0])

    def imagenet(rng, i):
        packets = spdl.io.demux_image(images[i])
        top, left, h, w = rrc_window(rng, packets.width, packets.height)
        filters = f"crop={w}:{h}:{left}:{top},scale={IMAGENET_CROP}:{IMAGENET_CROP}:flags=bilinear"
        if rng.random() < 0.5:
            filters += ",hflip"
        x = spdl.io.to_numpy(spdl.io.convert_frames(
            spdl.io.decode_packets(packets, filter_desc=filters + ",format=rgb24")))
        return np.ascontiguousarray(x.transpose(2, 0, 1)), None

    sample = deeplab if recipe == "deeplab" else imagenet
    epochs = [0]

    def load(item):
        epoch, i = item
        image, mask = sample(np.random.default_rng((1234, epoch, i)), i)
        return image, mask, (images[i], masks[i]) if masks else images[i]

    def collate(items):
        x = np.stack([a for a, _, _ in items])
        m = np.stack([b for _, b, _ in items]) if masks else None
        return x, m, [c for _, _, c in items]

    def batches():
        epoch = epochs[0]
        epochs[0] += 1
        order = np.random.default_rng((1234, epoch)).permutation(len(images))
        pipeline = (
            PipelineBuilder()
            .add_source([(epoch, int(i)) for i in order])
            .pipe(load, concurrency=threads)
            .aggregate(batch, drop_last=False)
            .pipe(collate)
            .add_sink(4)
            .build(num_threads=threads)
        )
        with pipeline.auto_stop():
            yield from pipeline

    return Peer(batches, per_epoch)


PEERS = {"dataloader": dataloader_row, "dali": dali_row, "spdl": spdl_row}


def check(data, recipe, row, threads):
    """One epoch of a peer row against the recipe; raises saying what is wrong, else returns a summary."""
    images, masks, _ = pairs(data, recipe)
    peer = dali_row(data, recipe, threads, names=True) if row == "dali" else PEERS[row](data, recipe, threads)
    try:
        got = []
        count, same, mirrored = 0, [], []
        shape = (3,) + (DEEPLAB_CROP if recipe == "deeplab" else (IMAGENET_CROP, IMAGENET_CROP))
        for x, m, names in peer.batches():
            x = np.asarray(x)
            if x.dtype != np.uint8 or x.shape[1:] != shape or not 0 < x.shape[0] <= BATCH[recipe]:
                raise RuntimeError(f"images {x.dtype} {x.shape}, expected uint8 (<= {BATCH[recipe]},) + {shape}")
            if x.std() == 0:
                raise RuntimeError("a batch of constant images")
            count += x.shape[0]
            if names is not None:
                got += names
            if recipe != "deeplab":
                continue
            m = None if m is None else np.asarray(m)
            if m is None or m.dtype != np.uint8 or m.shape != (x.shape[0],) + shape[1:]:
                raise RuntimeError(f"masks {getattr(m, 'dtype', None)} {getattr(m, 'shape', None)}, expected "
                                   f"uint8 {(x.shape[0],) + shape[1:]}")
            values = set(np.unique(m).tolist()) - set(range(19)) - {255}
            if values:
                raise RuntimeError(f"mask values {sorted(values)} outside the 19 classes and 255")
            hwc = x.transpose(0, 2, 3, 1)
            if hwc[m == 255].any():
                raise RuntimeError("image pixels that are not 0 where the mask is padding (255)")
            labels = classes(hwc)
            for k in range(x.shape[0]):
                valid = m[k] != 255
                if valid.sum() < 1000:
                    continue
                same.append((labels[k] == m[k])[valid].mean())
                mirrored.append((labels[k][:, ::-1] == m[k])[valid].mean())
        if count != len(images):
            raise RuntimeError(f"one epoch delivered {count} of {len(images)} images")
        if got:
            expected = list(zip(images, masks)) if masks else images
            if sorted(got, key=str) != sorted(expected, key=str):
                odd = [g for g in got if g not in expected] or [e for e in expected if got.count(e) != 1]
                raise RuntimeError(f"the epoch is not every file once with its own mask (first odd one: {odd[0]})")
        summary = f"{count} images"
        if recipe == "deeplab":
            same, mirrored = np.array(same), np.array(mirrored)
            # The label maps are the classes of the images they belong to: a mask given the geometry of its
            # own image agrees with its image's classes far better than with the mirror image's; a flip or
            # window not shared by image and mask shows as a sample whose mirror agrees better.
            odd = np.flatnonzero(mirrored > same + 0.05)
            if len(odd) or same.mean() < 0.5:
                raise RuntimeError(f"masks do not follow their images: agreement with the image's classes "
                                   f"{same.mean():.2f} on average (with the mirrored image's {mirrored.mean():.2f}); "
                                   f"{len(odd)} samples agree better with the mirror image")
            summary += (f", masks agree with their images' classes on {same.mean():.1%} of pixels "
                        f"(with the mirror image's {mirrored.mean():.1%})")
        return summary
    finally:
        peer.close()


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
    if row in PEERS:
        if source != "png":
            raise RuntimeError(f"the {row} row reads PNG (it cannot open L3 or raw)")
        print(f"{recipe} {row} check: {check(data, recipe, row, threads)}", file=sys.stderr)
        gc.collect()  # the checked pipeline's threads and buffers go before the timed one starts
        peer = PEERS[row](data, recipe, threads)
        epoch, bytes_read, close = peer.epoch, peer.bytes_read, peer.close
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
    if sys.argv[1] == "check":
        data, recipe, row, threads = sys.argv[2:]
        try:
            print(f"ok\t{check(data, recipe, row, int(threads))}", flush=True)
        except Exception as e:
            print("error\t" + " ".join(f"{type(e).__name__}: {e}".split()), flush=True)
        return
    data, recipe, source, row, threads, seconds, runs = sys.argv[2:]
    try:
        ips, per_epoch = run(data, recipe, source, row, int(threads), float(seconds), int(runs))
        print(f"{ips}\t{per_epoch}", flush=True)
    except Exception as e:  # a peer that is missing or fails is reported, not fatal
        print("error\t" + " ".join(f"{type(e).__name__}: {e}".split()), flush=True)


if __name__ == "__main__":
    main()
