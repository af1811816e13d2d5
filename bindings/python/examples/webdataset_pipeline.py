"""L3 images in a WebDataset pipeline: the shards hold ``.l3`` files as they are (WebDataset hands their
bytes over undecoded), and each batch of bytes is decoded in one call by ``l3toolkit.decode_batch`` — on
the CPU threads, or with ``device="cuda"`` on the GPU with l3-cuda — into one DLPack tensor.

    python webdataset_pipeline.py "shards/train-{000000..000009}.tar" --crop 224 --device cuda
"""

import argparse
import io
import tarfile

import numpy as np
import webdataset as wds

import l3toolkit as l3


def write_shard(path, samples):
    """A WebDataset shard of ``(key, l3_bytes, label)`` samples: ``KEY.l3`` and ``KEY.cls`` members."""
    with tarfile.open(path, "w") as tar:
        for key, data, label in samples:
            for ext, payload in (("l3", data), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def center_window(data, crop):
    """``(top, left, height, width)``: the centre ``crop`` × ``crop`` of an L3 file (read from its header);
    the whole image when it is smaller."""
    header = l3.info(data)
    h, w = header["height"], header["width"]
    ch, cw = min(crop, h), min(crop, w)
    return ((h - ch) // 2, (w - cw) // 2, ch, cw)


def batches(urls, batch_size, *, crop=None, device="cpu", dtype="uint8"):
    """Yields ``(images, labels)``: ``images`` one ``l3toolkit.Tensor`` of RGB samples (gray copied,
    alpha dropped; ``torch.from_dlpack`` takes it without a copy) — or a list of them when the images
    differ in size and ``crop`` is None —, ``labels`` an ``int64`` array."""
    pipeline = wds.WebDataset(urls, shardshuffle=False).to_tuple("l3", "cls").batched(
        batch_size, collation_fn=list, partial=True
    )
    for samples in pipeline:
        data = [d for d, _ in samples]
        labels = np.array([int(c) for _, c in samples], dtype=np.int64)
        windows = [center_window(d, crop) for d in data] if crop else None
        yield l3.decode_batch(data, windows=windows, channels=3, device=device, dtype=dtype), labels


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("urls", help="shard URLs in WebDataset's brace notation")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    for images, labels in batches(args.urls, args.batch_size, crop=args.crop, device=args.device):
        print(images, labels.tolist())


if __name__ == "__main__":
    main()
