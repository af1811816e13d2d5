#!/usr/bin/env python3
"""Builds the ONNX test models of bsp-tiling with the `onnx` helper API (no torch), and onnxruntime's outputs.

    python3 make_models.py OUT_DIR [--transformer SAFETENSORS NAME]...

Writes, for every model M: M.onnx, and for every test size HxW: M.in.HxW.npy (the input, float32 N=1 dropped:
C×H×W) and M.ort.HxW.npy (onnxruntime's output on the CPU, C×H×W). Bad models (bad_*.onnx) have no outputs.
Weights are seeded: the same files every run. `--transformer` also exports a TransformerNet from its
safetensors (the PyTorch fast_neural_style layout) to NAME.onnx: Pad(reflect) + Conv, InstanceNormalization,
Relu, Add, Resize(nearest, asymmetric/floor) — the graph that PyTorch's exporter writes for it.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21


class B:
    """A tiny graph builder: every method adds a node and returns its output name."""

    def __init__(self, name, cin, seed):
        self.name = name
        self.cin = cin
        self.nodes = []
        self.inits = []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _name(self, op):
        self.n += 1
        return f"{op.lower()}_{self.n}"

    def const(self, arr, name=None):
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op, inputs, outputs=1, **attrs):
        name = self._name(op)
        outs = [name] if outputs == 1 else [f"{name}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def conv(self, x, cin, cout, k, stride=1, pad=None, dil=1, group=1, bias=True, **kw):
        kh, kw_ = (k, k) if isinstance(k, int) else k
        if pad is None:
            pad = [dil * (kh - 1) // 2, dil * (kw_ - 1) // 2] * 2
        w = (self.rng.standard_normal((cout, cin // group, kh, kw_)) * np.sqrt(2.0 / (cin // group * kh * kw_))).astype(np.float32)
        ins = [x, self.const(w)]
        if bias:
            ins.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32)))
        attrs = dict(kernel_shape=[kh, kw_], strides=[stride, stride], dilations=[dil, dil], group=group)
        if "auto_pad" in kw:
            attrs["auto_pad"] = kw["auto_pad"]
        else:
            attrs["pads"] = pad
        return self.node("Conv", ins, **attrs)

    def convt(self, x, cin, cout, k, stride, pad, out_pad=0):
        w = (self.rng.standard_normal((cin, cout, k, k)) * np.sqrt(1.0 / (cin * k))).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
        return self.node("ConvTranspose", [x, self.const(w), self.const(b)], kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, output_padding=[out_pad, out_pad])

    def bn(self, x, c):
        r = self.rng
        g = (1 + 0.2 * r.standard_normal(c)).astype(np.float32)
        b = (0.1 * r.standard_normal(c)).astype(np.float32)
        m = (0.1 * r.standard_normal(c)).astype(np.float32)
        v = (0.5 + r.random(c)).astype(np.float32)
        return self.node("BatchNormalization", [x, self.const(g), self.const(b), self.const(m), self.const(v)], epsilon=1e-5)

    def affine(self, c):
        r = self.rng
        return (1 + 0.2 * r.standard_normal(c)).astype(np.float32), (0.1 * r.standard_normal(c)).astype(np.float32)

    def gn(self, x, c, groups):
        g, b = self.affine(c)
        return self.node("GroupNormalization", [x, self.const(g), self.const(b)], num_groups=groups, epsilon=1e-5)

    def inorm(self, x, c):
        g, b = self.affine(c)
        return self.node("InstanceNormalization", [x, self.const(g), self.const(b)], epsilon=1e-5)

    def lnorm(self, x, c):
        g, b = self.affine(c)
        return self.node("LayerNormalization", [x, self.const(g.reshape(c, 1, 1)), self.const(b.reshape(c, 1, 1))], axis=1, epsilon=1e-5)

    def silu(self, x):
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def resize(self, x, s, mode="nearest", coord="half_pixel", nearest="round_prefer_floor"):
        scales = self.const(np.array([1, 1, s, s], dtype=np.float32))
        return self.node("Resize", [x, "", scales], mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest)

    def model(self, out, cout, cin=None, dyn_c=False):
        cin = cin or self.cin
        x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, "C" if dyn_c else cin, "H", "W"])
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, cout, None, None])
        g = helper.make_graph(self.nodes, self.name, [x], [y], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bsp-tiling tests")
        m.ir_version = 10
        return m


def unet():
    """U-Net: GroupNorm + SiLU, a strided conv and a max pool down, nearest resize and ConvTranspose up,
    skip connections by Concat, a LayerNorm over C,H,W and an InstanceNorm, a global residual."""
    b = B("unet_gn", 3, 1)
    x = "image"
    e1 = b.silu(b.gn(b.conv(x, 3, 8, 3), 8, 4))
    d1 = b.node("Relu", [b.gn(b.conv(e1, 8, 16, 3, stride=2), 16, 4)])
    e2 = b.silu(b.gn(b.conv(d1, 16, 16, 3), 16, 8))
    d2 = b.node("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2])
    m = b.node("Relu", [b.lnorm(b.conv(d2, 16, 32, 3), 32)])
    m = b.node("LeakyRelu", [b.inorm(b.conv(m, 32, 32, 3, dil=2), 32)], alpha=0.2)
    u2 = b.conv(b.resize(m, 2), 32, 16, 3)
    c2 = b.silu(b.gn(b.conv(b.node("Concat", [u2, e2], axis=1), 32, 16, 3), 16, 4))
    u1 = b.convt(c2, 16, 8, 2, 2, 0)
    c1 = b.node("LeakyRelu", [b.conv(b.node("Concat", [u1, e1], axis=1), 16, 8, 3)], alpha=0.1)
    y = b.node("Add", [b.conv(c1, 8, 3, 1), x])
    return b.model(y, 3), [(44, 60), (36, 28)]


def esrgan():
    """An ESRGAN-style 4× upscaler: residual dense blocks with LeakyReLU, a scaled residual, pixel shuffle
    (DepthToSpace CRD, as PyTorch exports it) then a bilinear resize."""
    b = B("esrgan_x4", 3, 2)
    f = b.conv("image", 3, 16, 3)
    h = f
    for _ in range(2):
        a1 = b.node("LeakyRelu", [b.conv(h, 16, 8, 3)], alpha=0.2)
        a2 = b.node("LeakyRelu", [b.conv(b.node("Concat", [h, a1], axis=1), 24, 8, 3)], alpha=0.2)
        a3 = b.conv(b.node("Concat", [h, a1, a2], axis=1), 32, 16, 3)
        h = b.node("Add", [h, b.node("Mul", [a3, b.const(np.array(0.2, dtype=np.float32))])])
    h = b.node("Add", [f, b.conv(h, 16, 16, 3)])
    up = b.node("DepthToSpace", [b.conv(h, 16, 64, 3)], blocksize=2, mode="CRD")
    up = b.node("LeakyRelu", [up], alpha=0.2)
    up = b.resize(up, 2, mode="linear", coord="half_pixel")
    up = b.node("LeakyRelu", [b.conv(up, 16, 16, 3)], alpha=0.2)
    y = b.conv(up, 16, 3, 3)
    return b.model(y, 3), [(23, 37), (30, 17)]


def resnet_fcn():
    """A ResNet-style FCN: 7×7/2 stem + BatchNorm + max pool, basic blocks with BatchNorm (folded), a strided
    block with a 1×1/2 shortcut, PRelu, a segmentation head upsampled by ConvTranspose, AveragePool,
    Clip and a Sigmoid."""
    b = B("resnet_fcn", 3, 3)
    x = b.node("Relu", [b.bn(b.conv("image", 3, 16, 7, stride=2, pad=[3, 3, 3, 3], bias=False), 16)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = b.node("Relu", [b.bn(b.conv(x, 16, 16, 3, bias=False), 16)])
    y = b.bn(b.conv(y, 16, 16, 3, bias=False), 16)
    x = b.node("Relu", [b.node("Add", [x, y])])
    y = b.node("Relu", [b.bn(b.conv(x, 16, 32, 3, stride=2, bias=False), 32)])
    y = b.bn(b.conv(y, 32, 32, 3, bias=False), 32)
    s = b.bn(b.conv(x, 16, 32, 1, stride=2, pad=[0, 0, 0, 0], bias=False), 32)
    slope = b.const((0.1 + 0.05 * b.rng.random((32, 1, 1))).astype(np.float32))
    x = b.node("PRelu", [b.node("Add", [y, s]), slope])
    x = b.bn(x, 32)  # a BatchNorm after a non-conv: a per-channel affine map
    h = b.conv(x, 32, 5, 1, pad=[0, 0, 0, 0])
    h = b.convt(h, 5, 5, 4, 2, 1)
    h = b.node("AveragePool", [h], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
    h = b.node("Clip", [h, b.const(np.array(-3.0, dtype=np.float32)), b.const(np.array(3.0, dtype=np.float32))])
    y = b.node("Sigmoid", [h])
    return b.model(y, 5), [(45, 39), (64, 48)]


def ops_mix():
    """Everything else of the subset: grouped, dilated, rectangular and SAME-padded strided convs, Pad
    (reflect, edge, constant 0.5), SpaceToDepth, nearest resize (asymmetric/floor, as Upsample), a ×1/2 resize,
    ceil-mode average pooling, Tanh, Softplus, Mish, HardSwish, HardSigmoid, Elu, Gelu, Sub, Div, Max."""
    b = B("ops_mix", 4, 4)
    x = b.node("Pad", ["image", b.const(np.array([0, 0, 2, 1, 0, 0, 1, 2], dtype=np.int64))], mode="reflect")
    x = b.node("Tanh", [b.conv(x, 4, 8, (3, 5), pad=[0, 0, 0, 0])])
    x = b.node("Mish", [b.conv(x, 8, 8, 3, group=4)])
    x = b.node("Pad", [x, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64)), b.const(np.array(0.5, dtype=np.float32))], mode="constant")
    x = b.node("HardSwish", [b.conv(x, 8, 8, 3, dil=2, pad=[0, 0, 0, 0])])
    s = b.node("Softplus", [b.conv(x, 8, 16, 3, stride=2, auto_pad="SAME_UPPER")])
    s = b.node("SpaceToDepth", [b.node("Pad", [s, b.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))], mode="edge")], blocksize=2)
    s = b.node("Elu", [b.conv(s, 64, 16, 3)], alpha=0.7)
    s = b.node("Gelu", [s])
    s = b.resize(s, 4, coord="asymmetric", nearest="floor")
    s = b.resize(s, 0.5)
    s = b.node("AveragePool", [s], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1], count_include_pad=1)
    s = b.node("Div", [s, b.const(np.full((16, 1, 1), 2.5, dtype=np.float32))])
    s = b.node("Sub", [b.const(np.array(0.25, dtype=np.float32)), s])
    y = b.node("Max", [b.conv(s, 16, 16, 3), b.node("HardSigmoid", [s], alpha=0.3, beta=0.4)])
    return b.model(y, 16), [(40, 50), (33, 46)]


def norm_first():
    """Normalisations of the graph input itself (an InstanceNorm, then a GroupNorm of one group), before
    any convolution: the statistics superstep over the input's own tiles."""
    b = B("norm_first", 3, 6)
    x = b.gn(b.inorm("image", 3), 3, 1)
    y = b.conv(b.node("Relu", [b.conv(x, 3, 8, 3)]), 8, 3, 3)
    return b.model(y, 3), [(41, 29)]


def bad_models():
    out = {}
    b = B("bad_gap", 3, 5)
    h = b.node("GlobalAveragePool", [b.conv("image", 3, 8, 3)])
    y = b.node("Gemm", [b.node("Flatten", [h]), b.const(np.ones((8, 4), np.float32))])
    out["bad_gap"] = b.model(y, 4)
    b = B("bad_dynamic_c", 3, 5)
    out["bad_dynamic_c"] = b.model(b.conv("image", 3, 8, 3), 8, dyn_c=True)
    b = B("bad_channels", 3, 5)
    out["bad_channels"] = b.model(b.conv("image", 4, 8, 3), 8)
    b = B("bad_sizes", 3, 5)
    sizes = b.const(np.array([1, 3, 64, 64], dtype=np.int64))
    out["bad_sizes"] = b.model(b.node("Resize", ["image", "", "", sizes], mode="nearest"), 3)
    b = B("bad_op", 3, 5)
    out["bad_op"] = b.model(b.node("Cos", [b.conv("image", 3, 8, 3)]), 8)
    # Valid ONNX past the importer's caps: refused as too large.
    b = B("bad_scale_cap", 3, 5)
    out["bad_scale_cap"] = b.model(b.resize("image", 1024.0, coord="asymmetric", nearest="floor"), 3)
    b = B("bad_stride_cap", 3, 5)
    out["bad_stride_cap"] = b.model(b.conv("image", 3, 8, 1, stride=100_000, pad=[0, 0, 0, 0]), 8)
    return out


def invalid_models():
    """Models the ONNX checker and onnxruntime refuse (invalid_*.onnx): the importer must refuse them too."""
    out = {}
    b = B("invalid_dup_output", 3, 5)
    y = b.conv("image", 3, 8, 3)
    # A second node defining the first one's output.
    b.nodes.append(helper.make_node("Relu", ["image"], [y], name="redefines"))
    out["invalid_dup_output"] = b.model(y, 8)
    for name, group in [("invalid_group0", 0), ("invalid_group_neg", -1)]:
        b = B(name, 3, 5)
        y = b.conv("image", 3, 8, 1)
        for a in b.nodes[-1].attribute:
            if a.name == "group":
                a.i = group
        out[name] = b.model(y, 8)
    b = B("invalid_opset9999", 3, 5)
    m = b.model(b.conv("image", 3, 8, 3), 8)
    m.opset_import[0].version = 9999
    out["invalid_opset9999"] = m
    b = B("invalid_no_opset", 3, 5)
    m = b.model(b.conv("image", 3, 8, 3), 8)
    del m.opset_import[:]
    out["invalid_no_opset"] = m
    return out


def growing_models():
    """Models whose output is far larger than their input (grow_*.onnx): budget tests."""
    out = {}
    b = B("grow_x16", 3, 5)
    y = "image"
    for _ in range(4):
        y = b.resize(y, 2.0, coord="asymmetric", nearest="floor")
    out["grow_x16"] = b.model(y, 3)
    b = B("grow_x4096", 3, 5)
    y = b.resize("image", 64.0, coord="asymmetric", nearest="floor")
    out["grow_x4096"] = b.model(b.resize(y, 64.0, coord="asymmetric", nearest="floor"), 3)
    b = B("wide_c16384", 3, 5)
    out["wide_c16384"] = b.model(b.conv("image", 3, 16384, 1, bias=False), 16384)
    return out


def read_safetensors(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, e = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out


def transformer(path, name):
    """TransformerNet (fast_neural_style) from its safetensors, as PyTorch's exporter writes it."""
    sd = read_safetensors(path)
    b = B(name, 3, 0)

    def layer(x, conv, k, stride, up=False):
        if up:
            x = b.resize(x, 2, coord="asymmetric", nearest="floor")
        p = k // 2
        x = b.node("Pad", [x, b.const(np.array([0, 0, p, p, 0, 0, p, p], dtype=np.int64))], mode="reflect")
        w, bias = sd[f"{conv}.conv2d.weight"], sd[f"{conv}.conv2d.bias"]
        return b.node("Conv", [x, b.const(w), b.const(bias)], kernel_shape=[k, k], strides=[stride, stride])

    def inorm(x, n):
        return b.node("InstanceNormalization", [x, b.const(sd[f"{n}.weight"]), b.const(sd[f"{n}.bias"])], epsilon=1e-5)

    relu = lambda x: b.node("Relu", [x])
    y = relu(inorm(layer("image", "conv1", 9, 1), "in1"))
    y = relu(inorm(layer(y, "conv2", 3, 2), "in2"))
    y = relu(inorm(layer(y, "conv3", 3, 2), "in3"))
    for r in range(1, 6):
        h = relu(inorm(layer(y, f"res{r}.conv1", 3, 1), f"res{r}.in1"))
        h = inorm(layer(h, f"res{r}.conv2", 3, 1), f"res{r}.in2")
        y = b.node("Add", [h, y])
    y = relu(inorm(layer(y, "deconv1", 3, 1, up=True), "in4"))
    y = relu(inorm(layer(y, "deconv2", 3, 1, up=True), "in5"))
    y = layer(y, "deconv3", 9, 1)
    return b.model(y, 3), [(37, 53), (64, 48)]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    models = [unet(), esrgan(), resnet_fcn(), ops_mix(), norm_first()]
    args = sys.argv[2:]
    while args:
        assert args[0] == "--transformer"
        models.append(transformer(args[1], args[2]))
        args = args[3:]
    for m, sizes in models:
        onnx.checker.check_model(m)
        name = m.graph.name
        data = m.SerializeToString()
        (out / f"{name}.onnx").write_bytes(data)
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        cin = m.graph.input[0].type.tensor_type.shape.dim[1].dim_value
        rng = np.random.default_rng(len(name))
        scale = 255.0 if name.startswith("transformer") or "nc" in name else 1.0
        for h, w in sizes:
            x = (rng.random((1, cin, h, w), dtype=np.float32) * scale).astype(np.float32)
            (y,) = sess.run(None, {"image": x})
            np.save(out / f"{name}.in.{h}x{w}.npy", x[0])
            np.save(out / f"{name}.ort.{h}x{w}.npy", y[0].astype(np.float32))
    for name, m in {**bad_models(), **invalid_models(), **growing_models()}.items():
        (out / f"{name}.onnx").write_bytes(m.SerializeToString())
    print(f"wrote {len(models)} models to {out}")


if __name__ == "__main__":
    main()
