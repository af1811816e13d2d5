"""`cargo xtask bench python`, the Python side: images/s of one folder through l3toolkit.Loader and
through what users run today, in one process run.

Usage: python_bench.py FOLDER FORMAT BATCH CROP THREADS SECONDS RUNS
Prints one line per row, tab-separated: NAME, then images/s, or "error" and why.
"""

import os
import sys
import time

import numpy as np

EXTS = {"png": (".png",), "jpeg": (".jpg", ".jpeg"), "l3": (".l3",)}


def files(folder, fmt):
    out = []
    for root, _, names in os.walk(folder):
        out += [os.path.join(root, n) for n in names if n.lower().endswith(EXTS[fmt]) and not n.startswith(".")]
    return sorted(out)


def timed(epoch, images_per_epoch, seconds, runs):
    """Best images/s of `runs` timings, each of as many whole epochs as fill `seconds` (after one
    warm-up epoch)."""
    t0 = time.perf_counter()
    got = epoch()
    if got != images_per_epoch:
        raise RuntimeError(f"one epoch delivered {got} of {images_per_epoch} images")
    epochs = max(1, round(seconds / max(time.perf_counter() - t0, 1e-3)))
    best = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        n = sum(epoch() for _ in range(epochs))
        best = max(best, n / (time.perf_counter() - t0))
    return best


def l3toolkit_loader(folder, paths, batch, crop, threads):
    import l3toolkit as l3

    loader = l3.Loader(folder, batch, crop=crop, layout="NHWC", threads=threads, rank=0, world_size=1)

    def epoch():
        n = 0
        for b in loader:  # one epoch per loop
            x = np.from_dlpack(b.images)
            n += x.shape[0]
        return n

    return epoch, loader.close


def center_box(w, h, crop):
    left, top = max(0, (w - crop) // 2), max(0, (h - crop) // 2)
    return left, top, left + crop, top + crop


def pillow_sample(args):
    from PIL import Image

    path, crop = args
    with Image.open(path) as im:
        return np.asarray(im.crop(center_box(im.width, im.height, crop)).convert("RGB"))


def l3_region_sample(args):
    import l3toolkit as l3

    path, crop = args
    with open(path, "rb") as f:
        data = f.read()
    meta = l3.info(data)
    x0, y0, _, _ = center_box(meta["width"], meta["height"], crop)
    px = l3.decode_region(data, x0, y0, crop, crop)
    return px[..., :3] if px.ndim == 3 else np.repeat(px[..., None], 3, axis=2)


def process_pool(paths, batch, crop, threads, sample):
    """What torch's DataLoader does with worker processes: each decodes a sample, the parent stacks
    them into numpy batches."""
    import multiprocessing

    pool = multiprocessing.get_context("fork").Pool(threads)
    rng = np.random.default_rng(0)

    def epoch():
        n, buf = 0, []
        order = [paths[i] for i in rng.permutation(len(paths))]
        for x in pool.imap_unordered(sample, [(p, crop) for p in order], chunksize=1):
            buf.append(x)
            if len(buf) == batch:
                n += np.stack(buf).shape[0]
                buf = []
        if buf:
            n += np.stack(buf).shape[0]
        return n

    return epoch, pool.terminate


def spdl_pipeline(paths, batch, crop, threads):
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    desc = spdl.io.get_video_filter_desc(crop_width=crop, crop_height=crop, pix_fmt="rgb24")
    rng = np.random.default_rng(0)

    def decode(path):
        return spdl.io.decode_packets(spdl.io.demux_image(path), filter_desc=desc)

    # SPDL's pipeline logs and drops a failing item; one decode first surfaces a missing FFmpeg library
    # (SPDL loads libavutil & co. at run time) as this row's error.
    decode(paths[0])

    def batchify(frames):
        return spdl.io.to_numpy(spdl.io.convert_frames(frames))

    def epoch():
        order = [paths[i] for i in rng.permutation(len(paths))]
        pipeline = (
            PipelineBuilder()
            .add_source(order)
            .pipe(decode, concurrency=threads)
            .aggregate(batch, drop_last=False)
            .pipe(batchify)
            .add_sink(4)
            .build(num_threads=threads)
        )
        n = 0
        with pipeline.auto_stop():
            for x in pipeline:
                n += x.shape[0]
        return n

    return epoch, lambda: None


def main():
    folder, fmt, batch, crop, threads, seconds, runs = sys.argv[1:]
    batch, crop, threads, seconds, runs = int(batch), int(crop), int(threads), float(seconds), int(runs)
    paths = files(folder, fmt)
    rows = [("l3toolkit.Loader", lambda: l3toolkit_loader(folder, paths, batch, crop, threads))]
    if fmt == "l3":
        rows.append(
            ("Pool + l3toolkit.decode_region", lambda: process_pool(paths, batch, crop, threads, l3_region_sample))
        )
    else:
        rows.append(("Pool + Pillow", lambda: process_pool(paths, batch, crop, threads, pillow_sample)))
        rows.append(("SPDL", lambda: spdl_pipeline(paths, batch, crop, threads)))
    # The loader is timed first and again last, and its best printed, as the Rust stream is timed before
    # and after this script: on a shared machine both sides then sample the same stretch of time.
    order = rows + [rows[0]]
    best, failed = {}, {}
    for name, make in order:
        try:
            epoch, close = make()
            try:
                best[name] = max(best.get(name, 0.0), timed(epoch, len(paths), seconds, runs))
            finally:
                close()
        except Exception as e:  # a peer that is missing or fails is reported, not fatal
            failed[name] = " ".join(f"{type(e).__name__}: {e}".split())
    for name, _ in rows:
        if name in failed:
            print(f"{name}\terror\t{failed[name]}", flush=True)
        else:
            print(f"{name}\t{best[name]}", flush=True)


if __name__ == "__main__":
    main()
