#!/usr/bin/env python3
"""Overlap of decoding and training (section 4.4): ResNet-50 forward + backward + SGD step on a
high-priority compute stream, fed either by a synthetic tensor already on the device or by real L3
batches — random 224x224 crops of the FHD images, mirrored at random, normalised NCHW float16 — decoded
by l3-cuda on its low-priority stream while the previous step runs. Target: the step with L3 batches at
most 5 % slower than with the synthetic tensor.

    cargo build -p l3-cuda --release --example l3_ctypes      # on the build machine
    python3 l3-cuda/scripts/overlap.py DATA/fhd --lib l3-cuda/gpu-bin/libl3_ctypes.so
        [--batch 128] [--steps 60] [--warmup 15] [--prefetch 2] [--json DATA/overlap.jsonl]

DATA/fhd must hold the *.l3 files the `fig7a` example writes. Files are read the way a loader reads a
crop: header and offset table, then only the byte ranges of the patches under the window (pread).

The batch reaches PyTorch without a copy: its device pointer is wrapped through
__cuda_array_interface__ (stream None: no implicit synchronisation), and the compute stream waits for the
decode with cuStreamWaitEvent on the batch's ready event (l3c_batch_wait_in). After the step is queued the
batch is released in the compute stream's order (l3c_batch_release), so its memory is freed only after
the step's kernels ran. Step times are CUDA-event intervals on the compute stream, host-side submission
included in the wall-clock rate.
"""
import argparse
import ctypes
import glob
import json
import os
import random
import statistics
import sys
import time


class DeviceArray:
    """A device buffer as __cuda_array_interface__ (version 3, no stream: the caller synchronises)."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class L3:
    def __init__(self, lib_path, max_in_flight):
        lib = ctypes.CDLL(lib_path)
        lib.l3c_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.l3c_last_error.restype = ctypes.c_size_t
        lib.l3c_open.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.l3c_open.restype = ctypes.c_void_p
        lib.l3c_close.argtypes = [ctypes.c_void_p]
        lib.l3c_submit.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint8),
                                   ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.l3c_submit.restype = ctypes.c_void_p
        lib.l3c_batch_ptr.argtypes = [ctypes.c_void_p]
        lib.l3c_batch_ptr.restype = ctypes.c_uint64
        lib.l3c_batch_wait_in.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.l3c_batch_wait.argtypes = [ctypes.c_void_p]
        lib.l3c_batch_release.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        self.lib = lib
        self.dec = lib.l3c_open(0, max_in_flight)
        if not self.dec:
            raise RuntimeError(f"l3c_open: {self.error()}")

    def error(self):
        buf = ctypes.create_string_buffer(4096)
        self.lib.l3c_last_error(buf, len(buf))
        return buf.value.decode(errors="replace")

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.error()}")

    def submit(self, paths, windows, flips, size):
        n = len(paths)
        c_paths = (ctypes.c_char_p * n)(*[p.encode() for p in paths])
        c_win = (ctypes.c_uint32 * (6 * n))(*[v for w in windows for v in w])
        c_flip = (ctypes.c_uint8 * n)(*flips)
        # NCHW (1), float16 (1), ImageNet normalisation (1).
        b = self.lib.l3c_submit(self.dec, c_paths, n, c_win, c_flip, size, size, 1, 1, 1)
        if not b:
            raise RuntimeError(f"l3c_submit: {self.error()}")
        return b


def image_size(path):
    with open(path, "rb") as f:
        h = f.read(20)
    if h[:4] != b"L3IM":
        raise ValueError(f"{path}: not an L3 file")
    return int.from_bytes(h[6:10], "little"), int.from_bytes(h[10:14], "little")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="directory of *.l3 files (e.g. DATA/fhd)")
    ap.add_argument("--lib", required=True, help="libl3_ctypes.so")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()

    import torch
    import torchvision

    paths = sorted(glob.glob(os.path.join(a.data, "*.l3")))
    if not paths:
        print(f"no *.l3 in {a.data} (run the fig7a example first)", file=sys.stderr)
        return 2
    sizes = {p: image_size(p) for p in paths}
    for p in paths:  # into the page cache
        with open(p, "rb") as f:
            f.read()
    rng = random.Random(0)

    def crops():
        files = [paths[rng.randrange(len(paths))] for _ in range(a.batch)]
        wins, flips = [], []
        for p in files:
            w, h = sizes[p]
            x, y = rng.randrange(w - a.size + 1), rng.randrange(h - a.size + 1)
            wins.append((x, y, a.size, a.size, 0, 0))
            flips.append(rng.randrange(2))
        return files, wins, flips

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    # The compute stream at the highest priority (lower number = higher in CUDA).
    compute = torch.cuda.Stream(priority=-1)
    labels = torch.randint(0, 1000, (a.batch,), device=dev)
    shape = (a.batch, 3, a.size, a.size)
    synthetic = torch.randn(shape, device=dev).half()
    torch.cuda.synchronize()

    def step(x):
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x.contiguous(memory_format=torch.channels_last))
            loss = loss_fn(out, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def run(source, l3=None):
        times, queue = [], []
        if source == "l3":
            for _ in range(a.prefetch):
                queue.append(l3.submit(*crops(), a.size))
        t_wall = None
        with torch.cuda.stream(compute):
            for i in range(a.warmup + a.steps):
                if i == a.warmup:
                    torch.cuda.synchronize()
                    t_wall = time.perf_counter()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(compute)
                if source == "l3":
                    b = queue.pop(0)
                    l3.check(l3.lib.l3c_batch_wait_in(b, compute.cuda_stream), "wait_in")
                    x = torch.as_tensor(DeviceArray(l3.lib.l3c_batch_ptr(b), shape, "<f2"), device=dev)
                    step(x)
                    del x
                    l3.check(l3.lib.l3c_batch_release(b, compute.cuda_stream), "release")
                    queue.append(l3.submit(*crops(), a.size))
                else:
                    step(synthetic)
                end.record(compute)
                if i >= a.warmup:
                    times.append((start, end))
            torch.cuda.synchronize()
        wall = time.perf_counter() - t_wall
        for b in queue:
            l3.check(l3.lib.l3c_batch_wait(b), "wait")
            l3.check(l3.lib.l3c_batch_release(b, 0), "release")
        ms = [s.elapsed_time(e) for s, e in times]
        return {"median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
                "wall_ms_per_step": 1e3 * wall / a.steps}

    # One more than the prefetch depth: the batch the current step reads may still be decoding.
    l3 = L3(a.lib, max_in_flight=a.prefetch + 1)
    # The first batch of real data is checked for corrupt patches (the kernel's error word) once.
    first = l3.submit(*crops(), a.size)
    l3.check(l3.lib.l3c_batch_wait(first), "first batch")
    l3.check(l3.lib.l3c_batch_release(first, 0), "release")
    res = {"synthetic": run("synthetic"), "l3": run("l3", l3), "synthetic_again": run("synthetic")}
    base = min(res["synthetic"]["median_ms"], res["synthetic_again"]["median_ms"])
    slower = res["l3"]["median_ms"] / base - 1.0
    wall_base = min(res["synthetic"]["wall_ms_per_step"], res["synthetic_again"]["wall_ms_per_step"])
    wall_slower = res["l3"]["wall_ms_per_step"] / wall_base - 1.0
    row = {"device": torch.cuda.get_device_name(0), "batch": a.batch, "size": a.size, "steps": a.steps,
           **{f"{k}_{m}": v for k, r in res.items() for m, v in r.items()},
           "step_slower": slower, "wall_slower": wall_slower}
    print(json.dumps(row))
    print(f"\nResNet-50 step, batch {a.batch} at {a.size}x{a.size}, AMP f16, on {row['device']}:")
    print("| input | median step ms (events) | wall ms / step |")
    print("|---|---|---|")
    for k, r in res.items():
        print(f"| {k} | {r['median_ms']:.2f} | {r['wall_ms_per_step']:.2f} |")
    print(f"\nL3 batches vs synthetic: step {100 * slower:+.1f} %, wall {100 * wall_slower:+.1f} % "
          f"(target <= +5 %)")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
