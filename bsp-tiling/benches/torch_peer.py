#!/usr/bin/env python3
"""The PyTorch peer of `cargo xtask bench bsp`: the same TransformerNet (PyTorch's fast_neural_style example)
from the same safetensors file, in a few lines of torch, run on the whole image on the GPU and timed.

    python3 torch_peer.py MODEL.safetensors SIDE [SIDE ...] [--half] [--tf32] [--repeat N] [--save OUT.f32]
                          [--input IN.f32] [--cpu]

Prints one line per side: `TORCHPEER side=S secs=T peak=BYTES dtype=... note=...` (secs: the best of --repeat
runs after a warm-up, synchronised; peak: torch.cuda.max_memory_allocated). A side that does not fit prints
note=out_of_memory. The input is seeded noise in 0..255 (speed does not depend on content); --save writes the
f32 output of the last side (C×H×W, little-endian) for comparison with bsp-tiling's, and --input reads the
input from such a file instead (3×SIDE×SIDE); --cpu runs on the CPU (a correctness check of this script
against bsp-tiling's CPU backend, where no GPU is at hand). Needs only torch (and numpy for --save/--input): the
safetensors file is parsed here (8-byte header length, JSON header, raw little-endian data).
"""
import json
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load_safetensors(path, device):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    params = {}
    for key, meta in header.items():
        if key == "__metadata__" or key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            continue
        assert meta["dtype"] == "F32", f"{key}: {meta['dtype']}"
        a, b = meta["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a : base + b]), dtype=torch.float32)
        params[key] = t.reshape(meta["shape"]).to(device)
    return params


def conv(x, p, name, stride=1, upsample=False):
    w, b = p[f"{name}.conv2d.weight"], p[f"{name}.conv2d.bias"]
    if upsample:
        x = F.interpolate(x, scale_factor=2, mode="nearest")
    k = w.shape[-1]
    x = F.pad(x, (k // 2,) * 4, mode="reflect")
    return F.conv2d(x, w.to(x.dtype), b.to(x.dtype), stride=stride)


def inorm(x, p, name):
    return F.instance_norm(x, weight=p[f"{name}.weight"].to(x.dtype), bias=p[f"{name}.bias"].to(x.dtype), eps=1e-5)


def transformer_net(x, p):
    y = F.relu(inorm(conv(x, p, "conv1"), p, "in1"))
    y = F.relu(inorm(conv(y, p, "conv2", 2), p, "in2"))
    y = F.relu(inorm(conv(y, p, "conv3", 2), p, "in3"))
    for r in range(1, 6):
        res = y
        y = F.relu(inorm(conv(y, p, f"res{r}.conv1"), p, f"res{r}.in1"))
        y = inorm(conv(y, p, f"res{r}.conv2"), p, f"res{r}.in2") + res
    y = F.relu(inorm(conv(y, p, "deconv1", upsample=True), p, "in4"))
    y = F.relu(inorm(conv(y, p, "deconv2", upsample=True), p, "in5"))
    return conv(y, p, "deconv3")


def option(argv, args, name):
    if name not in argv:
        return None
    value = argv[argv.index(name) + 1]
    args.remove(value)
    return value


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    half = "--half" in argv
    cpu = "--cpu" in argv
    repeat = int(option(argv, args, "--repeat") or 1)
    save = option(argv, args, "--save")
    given = option(argv, args, "--input")
    model, sides = args[0], [int(s) for s in args[1:]]
    # f32 means f32: no TF32 in convolutions (PyTorch allows it for cuDNN convolutions by default).
    torch.backends.cudnn.allow_tf32 = "--tf32" in argv
    torch.backends.cuda.matmul.allow_tf32 = "--tf32" in argv
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cpu" if cpu else "cuda")
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    peak_bytes = (lambda: 0) if cpu else torch.cuda.max_memory_allocated
    dtype = torch.float16 if half else torch.float32
    p = load_safetensors(model, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.inference_mode():
        transformer_net(torch.rand(1, 3, 256, 256, device=dev, dtype=dtype, generator=g) * 255, p)
        sync()
        for side in sides:
            note = "ok"
            best = None
            try:
                if given:
                    import numpy as np

                    x = torch.from_numpy(np.fromfile(given, dtype="<f4").reshape(1, 3, side, side)).to(dev, dtype)
                else:
                    x = torch.rand(1, 3, side, side, device=dev, dtype=dtype, generator=g) * 255
                if not cpu:
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(repeat):
                    sync()
                    t0 = time.perf_counter()
                    y = transformer_net(x, p)
                    sync()
                    secs = time.perf_counter() - t0
                    best = secs if best is None else min(best, secs)
                peak = peak_bytes()
                if save:
                    y[0].float().cpu().numpy().astype("<f4").tofile(save)
                del x, y
            except torch.cuda.OutOfMemoryError:
                note, peak = "out_of_memory", peak_bytes()
            if not cpu:
                torch.cuda.empty_cache()
            secs_s = f"{best:.4f}" if best is not None else "nan"
            print(f"TORCHPEER side={side} secs={secs_s} peak={peak} dtype={str(dtype)[6:]} note={note}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
