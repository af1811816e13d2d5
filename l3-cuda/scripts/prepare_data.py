#!/usr/bin/env python3
"""The data set of the GPU measurements: every image of the corpus scaled with Lanczos (Pillow, as the
paper did for Figure 7(a)) to exactly HD 1080x720, FHD 1920x1080 and UHD 3840x2160 (aspect ratio not kept:
every image of a resolution has the same size, so a batch is one tensor), saved as RGB PNG and as JPEG
quality 90. The L3 files are encoded from these PNGs by the `fig7a` example on first use.

    python3 l3-cuda/scripts/prepare_data.py CORPUS_DIR DATA_DIR [--res hd,fhd,uhd]

Existing outputs are kept. Prints what it wrote.
"""
import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor

RESOLUTIONS = {"hd": (1080, 720), "fhd": (1920, 1080), "uhd": (3840, 2160)}


def scale(job):
    """Worker: one image to one resolution, as PNG and JPEG q90 (kept when both exist)."""
    src, png, jpg, w, h = job
    if os.path.exists(png) and os.path.exists(jpg):
        return 0
    from PIL import Image

    with Image.open(src) as im:
        im = im.convert("RGB").resize((w, h), Image.LANCZOS)
    im.save(png, compress_level=6)
    im.save(jpg, quality=90)
    return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("data")
    ap.add_argument("--res", default="hd,fhd,uhd")
    a = ap.parse_args()
    try:
        import PIL  # noqa: F401  (the workers use it)
    except ImportError:
        print("Pillow is needed (pip install pillow; it comes with torchvision)", file=sys.stderr)
        return 2
    names = sorted(n for n in os.listdir(a.corpus) if n.lower().endswith((".png", ".jpg", ".jpeg")))
    if not names:
        print(f"no PNG or JPEG in {a.corpus}", file=sys.stderr)
        return 2
    jobs = {}
    for res in a.res.split(","):
        w, h = RESOLUTIONS[res]
        out = os.path.join(a.data, res)
        os.makedirs(out, exist_ok=True)
        for name in names:
            stem = os.path.join(out, os.path.splitext(name)[0])
            jobs.setdefault(res, []).append((os.path.join(a.corpus, name), stem + ".png", stem + ".jpg", w, h))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        for res, js in jobs.items():
            wrote = sum(pool.map(scale, js))
            w, h = RESOLUTIONS[res]
            print(f"{res}: {len(js)} images {w}x{h} in {os.path.join(a.data, res)} ({wrote} written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
