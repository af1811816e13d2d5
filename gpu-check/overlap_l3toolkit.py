#!/usr/bin/env python3
"""Overlap of decoding and training (section 4.4) through the Python package: a ResNet-50 step (forward,
backward, SGD; AMP float16, channels-last) on a high-priority compute stream, fed first by a synthetic
tensor already on the device, then by L3 batches from ``l3toolkit.Loader(..., device="cuda")`` (random
224x224 crops of the FHD files, random flips, normalised NCHW float16, decoded on the GPU while the
previous step runs), then synthetic again. Target: the median step with L3 batches at most 5 % slower
than with the synthetic tensor.

    python3 gpu-check/overlap_l3toolkit.py DATA/fhd [--batch 128] [--steps 60] [--warmup 15]
        [--json OUT/overlap.jsonl]

DATA/fhd holds the *.l3 files the `fig7a` example writes (gpu-bin/run.sh's `prepare` and `kernel` or
`fig7a` steps). Each batch reaches torch without a copy through DLPack: ``torch.from_dlpack`` on the
batch's images while the compute stream is current, which makes that stream wait for the decode.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torchvision

import l3toolkit


def dataset_of(data, batch):
    """A folder holding only the version-1 L3 files of `data` (beside them are the PNG and JPEG sources and
    other formats' files, and a dataset folder holds each image once), each hard-linked under as many
    names as two batches need, so that `drop_last` leaves whole batches."""
    files = sorted(f for f in os.listdir(data) if f.endswith(".l3") and ".v2-" not in f)
    if not files:
        sys.exit(f"overlap: no .l3 files in {data} (run the fig7a example first)")
    out = tempfile.mkdtemp(prefix="l3-overlap-")
    copies = -(-2 * batch // len(files))
    for k in range(copies):
        for f in files:
            os.link(os.path.join(data, f), os.path.join(out, f"{k:03d}-{f}"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="folder of .l3 files (FHD)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--json", help="append the result as one JSON line")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("overlap: torch sees no CUDA device")

    device = torch.device("cuda", 0)
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    _, greatest = torch.cuda.Stream.priority_range()
    compute = torch.cuda.Stream(device, priority=greatest)
    labels = torch.randint(0, 1000, (args.batch,), device=device)

    def step(x):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), labels)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def timed(batches, n):
        """Median and mean of n steps' CUDA-event times on the compute stream, after the warm-up."""
        times = []
        with torch.cuda.stream(compute):
            for i in range(args.warmup + n):
                x = next(batches)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(compute)
                step(x)
                end.record(compute)
                if i >= args.warmup:
                    times.append((start, end))
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in times]
        return statistics.median(ms), statistics.fmean(ms)

    synthetic = torch.randn(args.batch, 3, 224, 224, device=device, dtype=torch.float16)

    def synthetic_batches():
        while True:
            yield synthetic

    def l3_batches():
        loader = l3toolkit.Loader(
            dataset_of(args.data, args.batch),
            args.batch,
            crop=(224, 224),
            random_crop=True,
            flip=True,
            layout="NCHW",
            dtype="float16",
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            device="cuda",
            drop_last=True,
        )
        while True:
            delivered = 0
            for batch in loader:
                delivered += 1
                # Consumed under `torch.cuda.stream(compute)`: torch passes that stream to __dlpack__, which
                # makes it wait for the decode; the tensor shares the batch's device memory.
                yield torch.from_dlpack(batch.images)
            if delivered == 0:
                sys.exit("overlap: the loader delivered no batch in an epoch")

    before = timed(synthetic_batches(), args.steps)
    l3 = timed(l3_batches(), args.steps)
    after = timed(synthetic_batches(), args.steps)
    base = min(before[0], after[0])
    slowdown = l3[0] / base - 1
    row = {
        "what": "overlap",
        "gpu": torch.cuda.get_device_name(device),
        "batch": args.batch,
        "synthetic_median_ms": base,
        "l3_median_ms": l3[0],
        "l3_mean_ms": l3[1],
        "slowdown": slowdown,
        "target_met": slowdown <= 0.05,
    }
    print(
        f"ResNet-50 step, batch {args.batch}: synthetic {base:.2f} ms, with L3 batches {l3[0]:.2f} ms "
        f"({100 * slowdown:+.1f} %, target <= +5 %)"
    )
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    sys.exit(0 if slowdown <= 0.05 else 1)


if __name__ == "__main__":
    main()
