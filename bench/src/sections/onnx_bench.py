"""`cargo xtask bench bsp` (its ONNX part, also `cargo xtask bench onnx`), the Python side.

    onnx_bench.py models MAKE_MODELS DIR SAFETENSORS
        Builds bsp-tiling's ONNX test models with MAKE_MODELS (bsp-tiling/tests/onnx/make_models.py: the
        onnx helper API, seeded weights) into DIR, the TransformerNet of SAFETENSORS exported as
        transformer.onnx among them.

    onnx_bench.py input PHOTO SIDE SCALE PATH
        A float32 3 x SIDE x SIDE .npy from PHOTO (its centre, mirrored where it is smaller: natural
        statistics, which the sampled mode's error depends on), in 0..SCALE.

    onnx_bench.py ort MODEL INPUT OUTPUT THREADS
        onnxruntime (CPU execution provider, THREADS intra-op threads) on the whole input; writes the output
        .npy and prints `ORT secs=S e2e=E peak=BYTES` (the run's time, without the session's creation; the
        time from loading the input to the saved output, as bsp-tiling's runs are timed; this process's
        peak RSS), or `ORT error=WHY` (for instance when the whole image does not fit in memory).

    onnx_bench.py norms INPUT DIR CHILD_EXE THREADS
        How exact each side's statistics are: one-node models (InstanceNormalization; GroupNormalization
        of one group) on INPUT, run by onnxruntime and by bsp-tiling (CHILD_EXE with L3_ONNX_CHILD, exact,
        tile 1024), each compared with the same normalisation computed in float64 by NumPy. Prints
        `NORM op=OP ort=REL ours=REL` (largest difference over the reference's largest magnitude).

    onnx_bench.py compare A B
        Prints `CMP max_abs=M ref_max=R rel=M/R` between two .npy outputs of the same shape (memory-mapped).
"""

import resource
import runpy
import sys
import time

import numpy as np


def models(make_models, out, safetensors):
    sys.argv = [make_models, out, "--transformer", safetensors, "transformer"]
    runpy.run_path(make_models, run_name="__main__")


def make_input(photo, side, scale, path):
    from PIL import Image

    with Image.open(photo) as im:
        rgb = np.asarray(im.convert("RGB"))
    h, w, _ = rgb.shape

    def mirror(n, length):
        i = np.arange(n) + max(length - n, 0) // 2
        i %= 2 * length
        return np.where(i < length, i, 2 * length - 1 - i)

    ys, xs = mirror(side, h), mirror(side, w)
    x = np.empty((3, side, side), np.float32)
    for c in range(3):
        x[c] = rgb[ys][:, xs, c].astype(np.float32) * np.float32(scale / 255.0)
    np.save(path, x)


def ort(model, inp, out, threads):
    try:
        import onnxruntime as rt

        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        sess = rt.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        t_load = time.perf_counter()
        x = np.load(inp)[None]
        t0 = time.perf_counter()
        (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
        secs = time.perf_counter() - t0
        np.save(out, y[0].astype(np.float32, copy=False))
        e2e = time.perf_counter() - t_load
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"ORT secs={secs:.3f} e2e={e2e:.3f} peak={peak}", flush=True)
    except Exception as e:  # reported in the table, not fatal
        print("ORT error=" + "_".join(f"{type(e).__name__}: {e}".split())[:300], flush=True)


def norms(inp, folder, child, threads):
    import os
    import subprocess

    import onnx
    import onnxruntime as rt
    from onnx import TensorProto, helper, numpy_helper

    x = np.load(inp)
    x64 = x.astype(np.float64)
    eps = 1e-5
    for op, attrs, axes in [
        ("InstanceNormalization", dict(epsilon=eps), (1, 2)),
        ("GroupNormalization", dict(epsilon=eps, num_groups=1), (0, 1, 2)),
    ]:
        node = helper.make_node(op, ["image", "s", "b"], ["y"], **attrs)
        graph = helper.make_graph(
            [node], op, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "H", "W"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, None, None])],
            [numpy_helper.from_array(np.ones(3, np.float32), "s"),
             numpy_helper.from_array(np.zeros(3, np.float32), "b")])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        m.ir_version = 10
        model = os.path.join(folder, f"norm_{op}.onnx")
        onnx.save(m, model)
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        sess = rt.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        (ort_y,) = sess.run(None, {"image": x[None]})
        out = os.path.join(folder, f"norm_{op}.ours.npy")
        spec = f"model={model};in={inp};out={out};mode=exact;tile=1024;threads={threads};spill={folder}"
        subprocess.run([child, "onnx"], env=dict(os.environ, L3_ONNX_CHILD=spec), check=True,
                       capture_output=True)
        ours = np.load(out)
        os.remove(out)
        mu = x64.mean(axis=axes, keepdims=True)
        ref = (x64 - mu) / np.sqrt(x64.var(axis=axes, keepdims=True) + eps)
        top = np.abs(ref).max()
        e_ort = np.abs(ort_y[0] - ref).max() / top
        e_ours = np.abs(ours - ref).max() / top
        del ort_y, ours, ref
        print(f"NORM op={op} ort={e_ort:.3g} ours={e_ours:.3g}", flush=True)


def compare(a, b):
    x, y = np.load(a, mmap_mode="r"), np.load(b, mmap_mode="r")
    if x.shape != y.shape:
        print(f"CMP error=shapes_{x.shape}_and_{y.shape}".replace(" ", ""), flush=True)
        return
    m, r = 0.0, 0.0
    for c in range(x.shape[0]):
        m = max(m, float(np.max(np.abs(x[c].astype(np.float64) - y[c]))))
        r = max(r, float(np.max(np.abs(y[c]))))
    print(f"CMP max_abs={m:.6g} ref_max={r:.6g} rel={m / max(r, 1e-30):.6g}", flush=True)


def main():
    cmd = sys.argv[1]
    if cmd == "models":
        models(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "input":
        make_input(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    elif cmd == "ort":
        ort(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "norms":
        norms(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif cmd == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
