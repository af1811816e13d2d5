#!/usr/bin/env python3
"""Figure 7(a) peers on the GPU machine: images/s from files in the page cache to normalised NCHW float16
batches on the device, on the data of prepare_data.py, for

  png   PNG decoded by every CPU core (Pillow in a process pool writing into shared memory that is
        registered as pinned memory), copied to the device, normalised there;
  jpeg  JPEG quality 90 decoded on the GPU by torchvision.io.decode_jpeg(device="cuda") in batches
        (nvJPEG), normalised there.

The L3 rows (GPU and CPU) come from the `fig7a` example (its JSON lines, --l3-json); with them this prints
the combined table: L3 on the GPU against each peer (target: >= 20x PNG at FHD) and the kernel's share
of the memory roofline (target: >= 40 %).

    python3 l3-cuda/scripts/fig7a_peers.py DATA [--res hd,fhd,uhd] [--batch 16] [--min-secs 3]
        [--workers N] [--what png,jpeg] [--json DATA/peers.jsonl] [--l3-json DATA/l3.jsonl]
    python3 l3-cuda/scripts/fig7a_peers.py DATA --table-only     # just the combined table

Every measurement first runs two warm-up batches (page cache, pool start-up, nvJPEG handles), then
counts the images of batches completed within --min-secs.
"""
import argparse
import glob
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import shared_memory

RESOLUTIONS = {"hd": (1080, 720), "fhd": (1920, 1080), "uhd": (3840, 2160)}
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

_shm = None


def _attach(name):
    global _shm
    _shm = shared_memory.SharedMemory(name=name)


def _decode_png(job):
    """Worker: decode one PNG with Pillow straight into the shared batch buffer."""
    path, offset, nbytes = job
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        a = np.asarray(im if im.mode == "RGB" else im.convert("RGB"))
    if a.nbytes != nbytes:
        raise ValueError(f"{path}: {a.shape}, expected {nbytes} bytes")
    dst = np.frombuffer(_shm.buf, dtype=np.uint8, count=nbytes, offset=offset)
    dst[:] = a.reshape(-1)
    del dst
    return 0


def batches(paths, batch):
    """The files, cycled, in batches of `batch`."""
    i = 0
    while True:
        yield [paths[(i + k) % len(paths)] for k in range(batch)]
        i += batch


def mean_std(torch):
    """ImageNet statistics on the device, shaped for NCHW."""
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    return mean, std


def normalise(x_nchw_u8, mean, std):
    """(x / 255 - mean) / std in float32, stored as float16."""
    return x_nchw_u8.float().div_(255.0).sub_(mean).div_(std).half().contiguous()


def png_peer(torch, paths, batch, w, h, min_secs, workers):
    sample = w * h * 3
    shm = shared_memory.SharedMemory(create=True, size=2 * batch * sample)
    host = torch.frombuffer(shm.buf, dtype=torch.uint8)
    cudart = torch.cuda.cudart()
    registered = int(cudart.cudaHostRegister(host.data_ptr(), host.numel(), 0)) == 0
    stream = torch.cuda.Stream()
    mean, std = mean_std(torch)
    torch.cuda.synchronize()
    done = [None, None]
    images, t0, rounds = 0, None, 0
    try:
        with ProcessPoolExecutor(workers, initializer=_attach, initargs=(shm.name,)) as pool:
            it = batches(paths, batch)

            def submit(k):
                jobs = [(p, (k * batch + i) * sample, sample) for i, p in enumerate(next(it))]
                return [pool.submit(_decode_png, j) for j in jobs]

            futs = [submit(0), None]
            while True:
                k = rounds % 2
                if done[1 - k] is not None:
                    done[1 - k].synchronize()
                futs[1 - k] = submit(1 - k)
                for f in futs[k]:
                    f.result()
                x = host[k * batch * sample:(k + 1) * batch * sample].view(batch, h, w, 3)
                with torch.cuda.stream(stream):
                    d = x.to("cuda", non_blocking=registered)
                    y = normalise(d.permute(0, 3, 1, 2), mean, std)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    done[k] = ev
                # The caching allocator keeps d and y's memory for `stream` until their work is done.
                del x, d, y
                rounds += 1
                if rounds == 2:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                elif rounds > 2:
                    images += batch
                    if time.perf_counter() - t0 >= min_secs:
                        break
            torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            for fs in futs:
                for f in fs or []:
                    f.result()
    finally:
        torch.cuda.synchronize()
        if registered:
            cudart.cudaHostUnregister(host.data_ptr())
        del host
        shm.close()
        shm.unlink()
    return images / secs, {"workers": workers, "pinned": int(registered)}


def jpeg_peer(torch, paths, batch, w, h, min_secs):
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    def decode(datas):
        try:
            return decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
        except TypeError:  # torchvision without batched decode
            return [decode_jpeg(d, mode=ImageReadMode.RGB, device="cuda") for d in datas]

    mean, std = mean_std(torch)
    reader = ThreadPoolExecutor(1)
    it = batches(paths, batch)
    pending = reader.submit(lambda p: [read_file(x) for x in p], next(it))
    images, t0, rounds = 0, None, 0
    while True:
        datas = pending.result()
        pending = reader.submit(lambda p: [read_file(x) for x in p], next(it))
        imgs = decode(datas)
        x = torch.stack(imgs)  # [n, 3, h, w] uint8
        if x.shape[2:] != (h, w):
            raise ValueError(f"decoded {tuple(x.shape)}, expected {h}x{w}")
        y = normalise(x, mean, std)
        del y, x, imgs
        rounds += 1
        if rounds == 2:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        elif rounds > 2:
            images += batch
            if time.perf_counter() - t0 >= min_secs:
                break
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    reader.shutdown(wait=True)
    return images / secs, {}


def last_rows(path):
    rows = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows[(r["res"], r["method"])] = r
    return rows


def table(peers_json, l3_json):
    rows = last_rows(peers_json)
    rows.update(last_rows(l3_json))
    get = lambda res, method: rows.get((res, method), {}).get("images_per_s")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"
    print("\nFigure 7(a): images/s from files in the page cache to normalised NCHW f16 batches on the device")
    print("| res | PNG, all CPU cores | JPEG q90, nvJPEG | L3, all CPU cores | L3, GPU | L3 GPU / PNG | L3 GPU / JPEG | L3 GPU / L3 CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for res in RESOLUTIONS:
        png = get(res, "png cpu pool -> device NCHW f16")
        jpg = get(res, "jpeg q90 nvjpeg -> NCHW f16")
        l3c = get(res, "l3 cpu e2e NCHW f16 (+H2D)") or get(res, "l3 cpu NCHW f16 (host)")
        l3g = get(res, "l3 gpu e2e NCHW f16")
        if any(v is not None for v in (png, jpg, l3c, l3g)):
            note = " (target >= 20x)" if res == "fhd" else ""
            print(f"| {res} | {fmt(png)} | {fmt(jpg)} | {fmt(l3c)} | {fmt(l3g)} | {ratio(l3g, png)}{note} | "
                  f"{ratio(l3g, jpg)} | {ratio(l3g, l3c)} |")
    kernel = [r for (res, m), r in rows.items() if m.startswith("kernel ")]
    if kernel:
        print("\nKernel, device-resident (compressed bytes read + decoded bytes written per second vs a D2D copy's; target >= 40 %)")
        print("| res | output | images/s | written GB/s | read GB/s | traffic GB/s | D2D GB/s | share |")
        print("|---|---|---|---|---|---|---|---|")
        for r in sorted(kernel, key=lambda r: (list(RESOLUTIONS).index(r["res"]), r["method"])):
            print(f"| {r['res']} | {r['method'][7:]} | {r['images_per_s']:.1f} | {r['written_gb_s']:.1f} | "
                  f"{r['read_gb_s']:.1f} | {r['traffic_gb_s']:.1f} | {r['d2d_gb_s']:.1f} | "
                  f"{100 * r['roofline_share']:.0f} % |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--res", default="hd,fhd,uhd")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--min-secs", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--what", default="png,jpeg")
    ap.add_argument("--json")
    ap.add_argument("--l3-json")
    ap.add_argument("--table-only", action="store_true")
    a = ap.parse_args()
    peers_json = a.json or os.path.join(a.data, "peers.jsonl")
    l3_json = a.l3_json or os.path.join(a.data, "l3.jsonl")
    if not a.table_only:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device visible to torch", file=sys.stderr)
            return 2
        print(f"device: {torch.cuda.get_device_name(0)}, CPU cores: {os.cpu_count()}, "
              f"torch {torch.__version__}")
        for res in a.res.split(","):
            w, h = RESOLUTIONS[res]
            for what in a.what.split(","):
                ext = {"png": "png", "jpeg": "jpg"}[what]
                paths = sorted(glob.glob(os.path.join(a.data, res, "*." + ext)))
                if not paths:
                    print(f"{res}: no *.{ext} (run prepare_data.py)", file=sys.stderr)
                    return 2
                for p in paths:  # into the page cache
                    with open(p, "rb") as f:
                        f.read()
                if what == "png":
                    rate, extra = png_peer(torch, paths, a.batch, w, h, a.min_secs, a.workers)
                    method = "png cpu pool -> device NCHW f16"
                else:
                    rate, extra = jpeg_peer(torch, paths, a.batch, w, h, a.min_secs)
                    method = "jpeg q90 nvjpeg -> NCHW f16"
                row = {"res": res, "width": w, "height": h, "method": method, "images_per_s": rate,
                       "batch": a.batch, **extra}
                print(json.dumps(row))
                with open(peers_json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    table(peers_json, l3_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
