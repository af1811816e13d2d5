//! ONNX import of the CNN subset that tiles, into a [`Graph`].
//!
//! The model is parsed with `prost` from the ONNX project's own `onnx.proto` (the Rust types in `pb.rs` are
//! generated once by `bsp-tiling/proto/gen` with protox + prost-build and committed: building needs no
//! protoc). Supported, on one `N=1, C, H, W` float input with any H and W: Conv (any kernel, stride,
//! dilation, groups, padding, `auto_pad`), ConvTranspose, BatchNormalization (inference; folded into the
//! convolution before it where that convolution feeds nothing else, a per-channel affine map otherwise),
//! InstanceNormalization, GroupNormalization (opset 18's per-group and 21's per-channel affine),
//! LayerNormalization over `C,H,W` (axis 1, per-channel affine), Relu, LeakyRelu, PRelu, Sigmoid, Tanh,
//! Clip, Softplus, Mish, HardSigmoid, HardSwish, Elu, Erf, Gelu, Neg, Abs, Exp, Sqrt, Add, Sub, Mul, Div,
//! Max, Min, Pow (between images, or with per-channel or scalar constants), Concat (channels), MaxPool,
//! AveragePool, Resize and Upsample (nearest and linear, integer or 1/integer scales), Pad (constant,
//! reflect, edge, wrap), DepthToSpace, SpaceToDepth, Identity, Dropout and Constant.
//!
//! Anything else is an [`Error::Node`] naming the node, its op and why: ops that reduce the whole image
//! (GlobalAveragePool, Reduce*), mix all pixels or need a fixed size (Gemm, MatMul, Reshape, Flatten,
//! Transpose, Softmax, attention), resizes to a fixed size, normalisation over rows or columns, training
//! mode. A file that does not parse is [`Error::OnnxFormat`].

#[allow(clippy::all, missing_docs)]
mod pb;

use crate::error::{Error, Result};
use crate::graph::ops::{
    AxisPad, BinOp, ConvOp, Coord, Nearest, NormKind, NormOp, Op, Operand, PadOp, PoolOp, ResizeOp,
    Unary, Win,
};
use crate::graph::{Graph, Node};
use crate::padding::PaddingMode;
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

/// A constant (initializer or Constant node): its shape and values as f32 (integers as well, exactly for
/// the small values shapes and pads take) and i64.
#[derive(Clone, Debug)]
struct Const {
    dims: Vec<usize>,
    f: Vec<f32>,
    i: Vec<i64>,
}

/// What a name in the graph refers to.
#[derive(Clone, Debug)]
enum Ref {
    /// A value of the image pipeline (0 = the input) with its channel count.
    Value(usize, usize),
    Const(Const),
}

fn format_err(model: &str, reason: impl Into<String>) -> Error {
    Error::OnnxFormat {
        model: model.into(),
        reason: reason.into(),
    }
}

/// Decodes a TensorProto's data.
fn tensor_const(t: &pb::TensorProto, model: &str) -> Result<Const> {
    use pb::tensor_proto::DataType as D;
    let name = t.name.clone().unwrap_or_default();
    if t.data_location == Some(pb::tensor_proto::DataLocation::External as i32) {
        return Err(format_err(
            model,
            format!(
                "tensor `{name}` keeps its data in an external file, which is not supported (save the model with its weights inside)"
            ),
        ));
    }
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                format_err(
                    model,
                    format!("tensor `{name}` has a negative dimension {d}"),
                )
            })
        })
        .collect::<Result<_>>()?;
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&c| c <= 1 << 31)
        .ok_or_else(|| format_err(model, format!("tensor `{name}` is too large")))?;
    let raw = t.raw_data.as_deref();
    let dt = t.data_type.unwrap_or(0);
    let width = |w: usize| -> Result<&[u8]> {
        let r = raw.unwrap_or(&[]);
        if r.len() != count * w {
            return Err(format_err(
                model,
                format!(
                    "tensor `{name}` has {} bytes of data for {count} values",
                    r.len()
                ),
            ));
        }
        Ok(r)
    };
    let check = |n: usize| -> Result<()> {
        if n != count {
            return Err(format_err(
                model,
                format!("tensor `{name}` has {n} values for shape {dims:?}"),
            ));
        }
        Ok(())
    };
    let f: Vec<f64> = if dt == D::Float as i32 {
        if raw.is_some() {
            width(4)?
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect()
        } else {
            check(t.float_data.len())?;
            t.float_data.iter().map(|&v| v as f64).collect()
        }
    } else if dt == D::Double as i32 {
        if raw.is_some() {
            width(8)?
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect()
        } else {
            check(t.double_data.len())?;
            t.double_data.clone()
        }
    } else if dt == D::Float16 as i32 {
        if raw.is_some() {
            width(2)?
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
                .collect()
        } else {
            check(t.int32_data.len())?;
            t.int32_data
                .iter()
                .map(|&v| half::f16::from_bits(v as u16).to_f64())
                .collect()
        }
    } else if dt == D::Int64 as i32 {
        if raw.is_some() {
            width(8)?
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64)
                .collect()
        } else {
            check(t.int64_data.len())?;
            t.int64_data.iter().map(|&v| v as f64).collect()
        }
    } else if dt == D::Int32 as i32 {
        if raw.is_some() {
            width(4)?
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64)
                .collect()
        } else {
            check(t.int32_data.len())?;
            t.int32_data.iter().map(|&v| v as f64).collect()
        }
    } else {
        return Err(format_err(
            model,
            format!(
                "tensor `{name}` has ONNX data type {dt}, not a float or integer type this importer reads"
            ),
        ));
    };
    Ok(Const {
        dims,
        f: f.iter().map(|&v| v as f32).collect(),
        i: f.iter().map(|&v| v as i64).collect(),
    })
}

/// Reads `path` and imports it ([`graph_from_onnx`]).
pub fn load_onnx(path: &Path) -> Result<Graph> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    graph_from_onnx(&bytes, &path.display().to_string())
}

struct Importer<'a> {
    model: &'a str,
    names: HashMap<String, Ref>,
    nodes: Vec<Node>,
}

/// The attributes of one node, by name.
struct Attrs<'a>(HashMap<&'a str, &'a pb::AttributeProto>);

impl Attrs<'_> {
    fn i(&self, k: &str, d: i64) -> i64 {
        self.0.get(k).and_then(|a| a.i).unwrap_or(d)
    }
    fn f(&self, k: &str, d: f32) -> f32 {
        self.0.get(k).and_then(|a| a.f).unwrap_or(d)
    }
    fn ints(&self, k: &str) -> Option<Vec<i64>> {
        self.0.get(k).map(|a| a.ints.clone())
    }
    fn floats(&self, k: &str) -> Option<Vec<f32>> {
        self.0.get(k).map(|a| a.floats.clone())
    }
    fn s(&self, k: &str, d: &str) -> String {
        self.0
            .get(k)
            .and_then(|a| a.s.as_ref())
            .map_or(d.to_string(), |s| String::from_utf8_lossy(s).into_owned())
    }
    fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

/// The node being imported: its name and op for errors, its inputs.
struct Cur<'a> {
    name: String,
    op: String,
    inputs: &'a [String],
}

impl Cur<'_> {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::Node {
            node: self.name.clone(),
            op: self.op.clone(),
            reason: reason.into(),
        }
    }
    /// The name of input `j`, `None` when absent or empty (ONNX's omitted optional input).
    fn input(&self, j: usize) -> Option<&str> {
        self.inputs
            .get(j)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

impl Importer<'_> {
    fn value(&self, c: &Cur, j: usize) -> Result<(usize, usize)> {
        let name = c
            .input(j)
            .ok_or_else(|| c.err(format!("input {j} is missing")))?;
        match self.names.get(name) {
            Some(Ref::Value(v, ch)) => Ok((*v, *ch)),
            Some(Ref::Const(_)) => Err(c.err(format!("input `{name}` is a constant where an image is expected"))),
            None => Err(c.err(format!("input `{name}` is not defined before this node (an unsupported op's output, or the graph is not in topological order)"))),
        }
    }

    fn constant(&self, c: &Cur, j: usize) -> Result<Option<Const>> {
        let Some(name) = c.input(j) else {
            return Ok(None);
        };
        match self.names.get(name) {
            Some(Ref::Const(k)) => Ok(Some(k.clone())),
            Some(Ref::Value(..)) => Err(c.err(format!(
                "input `{name}` must be a constant (an initializer), it is computed from the image"
            ))),
            None => Err(c.err(format!("input `{name}` is not defined"))),
        }
    }

    fn need_const(&self, c: &Cur, j: usize, what: &str) -> Result<Const> {
        self.constant(c, j)?
            .ok_or_else(|| c.err(format!("its {what} (input {j}) is missing")))
    }

    fn push(&mut self, c: &Cur, op: Op, inputs: Vec<usize>, channels: usize) -> (usize, usize) {
        self.nodes.push(Node {
            name: c.name.clone(),
            op_type: c.op.clone(),
            op,
            inputs,
            channels,
        });
        (self.nodes.len(), channels)
    }
}

/// A per-channel vector from a constant of shape `[C]` (`exact`) or broadcastable over `[C, H, W]` per
/// channel (`[C,1,1]`, `[1,C,1,1]`, or one value).
fn per_channel(c: &Cur, k: &Const, ch: usize, what: &str, exact: bool) -> Result<Vec<f32>> {
    let n = k.f.len();
    if exact {
        if n != ch {
            return Err(c.err(format!("its {what} has {n} values for {ch} channels")));
        }
        return Ok(k.f.clone());
    }
    if n == 1 {
        return Ok(k.f.clone());
    }
    // Drop leading ones; what remains must be [C, 1, 1].
    let dims: Vec<usize> = k.dims.iter().copied().skip_while(|&d| d == 1).collect();
    if dims.len() == 3 && dims[1] == 1 && dims[2] == 1 && dims[0] == ch {
        return Ok(k.f.clone());
    }
    Err(c.err(format!(
        "its {what} has shape {:?}: only a scalar or one value per channel ([C,1,1]) can apply to an image of any size",
        k.dims
    )))
}

/// The largest kernel side, stride, dilation, padding or block size accepted (far beyond any real CNN;
/// it keeps every size computation in range).
const LIMIT: i64 = 1 << 16;

fn two(c: &Cur, v: Option<Vec<i64>>, d: i64, what: &str) -> Result<[usize; 2]> {
    match v {
        None => Ok([d as usize; 2]),
        Some(v) if v.len() == 2 && v.iter().all(|&x| (1..=LIMIT).contains(&x)) => {
            Ok([v[0] as usize, v[1] as usize])
        }
        Some(v) => Err(c.err(format!(
            "{what} {v:?}: expected two positive values (a 2-D op on N×C×H×W)"
        ))),
    }
}

fn pads4(c: &Cur, a: &Attrs) -> Result<[AxisPad; 2]> {
    match a.s("auto_pad", "NOTSET").as_str() {
        "NOTSET" => {}
        "VALID" => return Ok([AxisPad::Explicit(0, 0); 2]),
        "SAME_UPPER" => return Ok([AxisPad::Same { upper: true }; 2]),
        "SAME_LOWER" => return Ok([AxisPad::Same { upper: false }; 2]),
        other => return Err(c.err(format!("auto_pad {other:?} is not an ONNX value"))),
    }
    match a.ints("pads") {
        None => Ok([AxisPad::Explicit(0, 0); 2]),
        Some(p) if p.len() == 4 && p.iter().all(|&x| (0..=LIMIT).contains(&x)) => Ok([
            AxisPad::Explicit(p[0] as usize, p[2] as usize),
            AxisPad::Explicit(p[1] as usize, p[3] as usize),
        ]),
        Some(p) => Err(c.err(format!("pads {p:?}: expected four non-negative values"))),
    }
}

const GLOBAL_OPS: &[&str] = &[
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GlobalLpPool",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceSum",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
];
const DENSE_OPS: &[&str] = &[
    "Gemm",
    "MatMul",
    "Flatten",
    "Reshape",
    "Transpose",
    "Softmax",
    "LogSoftmax",
    "Attention",
    "MultiHeadAttention",
    "Squeeze",
    "Unsqueeze",
    "Einsum",
    "Shape",
    "Gather",
    "Slice",
    "Split",
    "Expand",
    "Tile",
];

/// Imports an ONNX model (the bytes of a `.onnx` file; `model` names it in errors).
pub fn graph_from_onnx(bytes: &[u8], model: &str) -> Result<Graph> {
    let m = pb::ModelProto::decode(bytes)
        .map_err(|e| format_err(model, format!("not an ONNX protobuf: {e}")))?;
    let g = m
        .graph
        .as_ref()
        .ok_or_else(|| format_err(model, "the model has no graph"))?;
    let opset = m
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(1);
    let mut imp = Importer {
        model,
        names: HashMap::new(),
        nodes: vec![],
    };
    for t in &g.initializer {
        let name = t.name.clone().unwrap_or_default();
        imp.names.insert(name, Ref::Const(tensor_const(t, model)?));
    }
    // The image input: the one graph input that is not an initializer.
    let inputs: Vec<&pb::ValueInfoProto> = g
        .input
        .iter()
        .filter(|i| !imp.names.contains_key(i.name.as_deref().unwrap_or("")))
        .collect();
    let [input] = inputs[..] else {
        return Err(format_err(
            model,
            format!(
                "the graph has {} image inputs; exactly one N×C×H×W input is supported",
                inputs.len()
            ),
        ));
    };
    let in_name = input.name.clone().unwrap_or_default();
    let dyn_err = |why: String| Error::Node {
        node: in_name.clone(),
        op: "graph input".into(),
        reason: why,
    };
    let tensor_type = match input.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(pb::type_proto::Value::TensorType(t)) => t,
        _ => return Err(dyn_err("is not a tensor".into())),
    };
    if tensor_type.elem_type != Some(pb::tensor_proto::DataType::Float as i32) {
        return Err(dyn_err(format!(
            "has element type {:?}; only float32 images are supported",
            tensor_type.elem_type
        )));
    }
    let dims = tensor_type
        .shape
        .as_ref()
        .map(|s| s.dim.clone())
        .unwrap_or_default();
    if dims.len() != 4 {
        return Err(dyn_err(format!(
            "has rank {}; an image input is N×C×H×W",
            dims.len()
        )));
    }
    use pb::tensor_shape_proto::dimension::Value as DV;
    let channels = match &dims[1].value {
        Some(DV::DimValue(c)) if *c > 0 => *c as usize,
        Some(DV::DimParam(p)) => {
            return Err(dyn_err(format!(
                "has a dynamic channel count `{p}`, which cannot be resolved from the image (export it with a fixed C)"
            )));
        }
        _ => return Err(dyn_err("has no channel count".into())),
    };
    if let Some(DV::DimValue(n)) = &dims[0].value
        && *n != 1
    {
        return Err(dyn_err(format!(
            "has batch size {n}; one image at a time (N = 1 or symbolic) is supported"
        )));
    }
    imp.names.insert(in_name, Ref::Value(0, channels));

    for (idx, n) in g.node.iter().enumerate() {
        let op_type = n.op_type.clone().unwrap_or_default();
        let name = n
            .name
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| n.output.first().cloned())
            .unwrap_or_else(|| format!("#{idx}"));
        let c = Cur {
            name,
            op: op_type.clone(),
            inputs: &n.input,
        };
        if !matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            return Err(c.err(format!(
                "operator domain {:?} is not supported (only the default ONNX domain)",
                n.domain.as_deref().unwrap_or("")
            )));
        }
        let a = Attrs(
            n.attribute
                .iter()
                .map(|at| (at.name.as_deref().unwrap_or(""), at))
                .collect(),
        );
        let out = import_node(&mut imp, &c, &a, opset)?;
        let first = n.output.first().cloned().unwrap_or_default();
        imp.names.insert(first, out);
    }
    let outs: Vec<&str> = g
        .output
        .iter()
        .map(|o| o.name.as_deref().unwrap_or(""))
        .collect();
    let [out] = outs[..] else {
        return Err(format_err(
            model,
            format!(
                "the graph has {} outputs; exactly one is supported",
                outs.len()
            ),
        ));
    };
    let output = match imp.names.get(out) {
        Some(Ref::Value(v, _)) if *v > 0 => *v,
        Some(Ref::Value(..)) => return Err(format_err(model, "the output is the input itself")),
        _ => {
            return Err(format_err(
                model,
                format!("the output `{out}` is not computed from the image"),
            ));
        }
    };
    let graph = Graph {
        name: g
            .name
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| model.to_string()),
        channels,
        nodes: imp.nodes,
        output,
    };
    Ok(simplify(graph))
}

fn import_node(imp: &mut Importer, c: &Cur, a: &Attrs, opset: i64) -> Result<Ref> {
    let op = c.op.as_str();
    if GLOBAL_OPS.contains(&op) {
        return Err(c.err("reduces the whole image to one value per channel: every output pixel would depend on every input pixel, which a tiled CNN cannot compute (nor any dense layer after it)"));
    }
    if DENSE_OPS.contains(&op) {
        return Err(c.err("is a dense, reshaping or attention op: it mixes pixels across the whole image or needs a fixed image size, so it cannot be tiled"));
    }
    let unary = |imp: &mut Importer, u: Unary| -> Result<Ref> {
        let (x, ch) = imp.value(c, 0)?;
        let (v, ch) = imp.push(c, Op::Unary(u), vec![x], ch);
        Ok(Ref::Value(v, ch))
    };
    match op {
        "Constant" => {
            if let Some(t) = a.0.get("value").and_then(|at| at.t.as_ref()) {
                return Ok(Ref::Const(tensor_const(t, imp.model)?));
            }
            if let Some(f) = a.0.get("value_float").and_then(|at| at.f) {
                return Ok(Ref::Const(Const {
                    dims: vec![],
                    f: vec![f],
                    i: vec![f as i64],
                }));
            }
            if let Some(fs) = a.floats("value_floats").filter(|_| a.has("value_floats")) {
                return Ok(Ref::Const(Const {
                    dims: vec![fs.len()],
                    i: fs.iter().map(|&v| v as i64).collect(),
                    f: fs,
                }));
            }
            if let Some(i) = a.0.get("value_int").and_then(|at| at.i) {
                return Ok(Ref::Const(Const {
                    dims: vec![],
                    f: vec![i as f32],
                    i: vec![i],
                }));
            }
            if let Some(is) = a.ints("value_ints").filter(|_| a.has("value_ints")) {
                return Ok(Ref::Const(Const {
                    dims: vec![is.len()],
                    f: is.iter().map(|&v| v as f32).collect(),
                    i: is,
                }));
            }
            Err(c.err("has no value this importer reads (value, value_float(s), value_int(s))"))
        }
        "Identity" | "Dropout" => {
            if let Some(Ref::Const(k)) = c.input(0).and_then(|n| imp.names.get(n)) {
                return Ok(Ref::Const(k.clone()));
            }
            let (x, ch) = imp.value(c, 0)?;
            let (v, ch) = imp.push(c, Op::Identity, vec![x], ch);
            Ok(Ref::Value(v, ch))
        }
        "Conv" | "ConvTranspose" => {
            let (x, ch) = imp.value(c, 0)?;
            let w = imp.need_const(c, 1, "weight")?;
            if w.dims.len() != 4 {
                return Err(c.err(format!(
                    "has a weight of shape {:?}: only 2-D convolutions (4-D weights) are supported",
                    w.dims
                )));
            }
            let groups = a.i("group", 1).max(1) as usize;
            let (kh, kw) = (w.dims[2], w.dims[3]);
            if let Some(ks) = a.ints("kernel_shape")
                && ks != [kh as i64, kw as i64]
            {
                return Err(c.err(format!(
                    "kernel_shape {ks:?} disagrees with its weight {:?}",
                    w.dims
                )));
            }
            if kh == 0 || kw == 0 || kh as i64 > LIMIT || kw as i64 > LIMIT {
                return Err(c.err("has an empty kernel"));
            }
            let (cin, cout) = if op == "Conv" {
                (w.dims[1] * groups, w.dims[0])
            } else {
                (w.dims[0], w.dims[1] * groups)
            };
            if cin != ch {
                return Err(c.err(format!(
                    "expects {cin} input channels (weight {:?}, group {groups}), gets {ch}",
                    w.dims
                )));
            }
            if groups == 0 || cin % groups != 0 || cout % groups != 0 {
                return Err(c.err(format!(
                    "group {groups} does not divide its {cin} input and {cout} output channels"
                )));
            }
            let strides = two(c, a.ints("strides"), 1, "strides")?;
            let dil = two(c, a.ints("dilations"), 1, "dilations")?;
            let win = [
                Win {
                    k: kh,
                    stride: strides[0],
                    dilation: dil[0],
                },
                Win {
                    k: kw,
                    stride: strides[1],
                    dilation: dil[1],
                },
            ];
            let pad = pads4(c, a)?;
            let bias = match imp.constant(c, 2)? {
                Some(b) => per_channel(c, &b, cout, "bias", true)?,
                None => vec![0.0; cout],
            };
            let conv = ConvOp {
                cin,
                cout,
                groups,
                win,
                pad,
                output_padding: [0; 2],
                weight: w.f,
                bias,
            };
            let op = if op == "Conv" {
                Op::Conv(conv)
            } else {
                if a.has("output_shape") {
                    return Err(c.err("has a fixed output_shape, which cannot follow the image size (export with pads/output_padding instead)"));
                }
                let op_ = match a.ints("output_padding") {
                    None => [0, 0],
                    Some(p) if p.len() == 2 && p.iter().all(|&v| v >= 0) => {
                        [p[0] as usize, p[1] as usize]
                    }
                    Some(p) => {
                        return Err(c.err(format!(
                            "output_padding {p:?}: expected two non-negative values"
                        )));
                    }
                };
                Op::ConvTranspose(ConvOp {
                    output_padding: op_,
                    ..conv
                })
            };
            let (v, ch) = imp.push(c, op, vec![x], cout);
            Ok(Ref::Value(v, ch))
        }
        "BatchNormalization" => {
            if a.i("training_mode", 0) != 0 {
                return Err(c.err(
                    "is in training mode (statistics of the batch); export the model in eval mode",
                ));
            }
            let (x, ch) = imp.value(c, 0)?;
            let k = |j, what| -> Result<Vec<f32>> {
                per_channel(c, &imp.need_const(c, j, what)?, ch, what, true)
            };
            let (gamma, beta, mean, var) = (
                k(1, "scale")?,
                k(2, "bias")?,
                k(3, "mean")?,
                k(4, "variance")?,
            );
            let eps = a.f("epsilon", 1e-5) as f64;
            let (scale, shift): (Vec<f32>, Vec<f32>) = (0..ch)
                .map(|i| {
                    let s = gamma[i] as f64 / (var[i] as f64 + eps).sqrt();
                    (s as f32, (beta[i] as f64 - mean[i] as f64 * s) as f32)
                })
                .unzip();
            let (v, ch) = imp.push(c, Op::Affine { scale, shift }, vec![x], ch);
            Ok(Ref::Value(v, ch))
        }
        "InstanceNormalization" | "GroupNormalization" | "LayerNormalization" => {
            let (x, ch) = imp.value(c, 0)?;
            let scale = imp.need_const(c, 1, "scale")?;
            let bias = imp.constant(c, 2)?;
            let eps = a.f("epsilon", 1e-5) as f64;
            let (kind, gamma, beta) = match op {
                "InstanceNormalization" => {
                    let b = bias.ok_or_else(|| c.err("its bias (input 2) is missing"))?;
                    (
                        NormKind::Instance,
                        per_channel(c, &scale, ch, "scale", true)?,
                        per_channel(c, &b, ch, "bias", true)?,
                    )
                }
                "GroupNormalization" => {
                    let groups = a.i("num_groups", 0);
                    if groups <= 0 || ch % groups as usize != 0 {
                        return Err(c.err(format!(
                            "num_groups {groups} does not divide its {ch} channels"
                        )));
                    }
                    let gs = ch / groups as usize;
                    let b = bias.ok_or_else(|| c.err("its bias (input 2) is missing"))?;
                    // Opset 18: one scale/bias per group; opset 21: per channel.
                    let expand = |k: &Const, what: &str| -> Result<Vec<f32>> {
                        if k.f.len() == ch {
                            Ok(k.f.clone())
                        } else if k.f.len() == groups as usize {
                            Ok((0..ch).map(|i| k.f[i / gs]).collect())
                        } else {
                            Err(c.err(format!("its {what} has {} values, neither {ch} channels nor {groups} groups", k.f.len())))
                        }
                    };
                    (
                        NormKind::Group(groups as usize),
                        expand(&scale, "scale")?,
                        expand(&b, "bias")?,
                    )
                }
                _ => {
                    let axis = a.i("axis", -1);
                    if axis != 1 && axis != -3 {
                        return Err(c.err(format!(
                            "normalises from axis {axis} of an N×C×H×W tensor: over rows or columns, statistics that depend on where the image is cut; only axis 1 (C,H,W: the whole image, tiled with merged statistics) is supported"
                        )));
                    }
                    let gamma = per_channel(c, &scale, ch, "scale", false)?;
                    let beta = match bias {
                        Some(b) => per_channel(c, &b, ch, "bias", false)?,
                        None => vec![0.0],
                    };
                    let full = |v: Vec<f32>| if v.len() == 1 { vec![v[0]; ch] } else { v };
                    (NormKind::Group(1), full(gamma), full(beta))
                }
            };
            let (v, ch) = imp.push(
                c,
                Op::Norm(NormOp {
                    kind,
                    gamma,
                    beta,
                    eps,
                }),
                vec![x],
                ch,
            );
            Ok(Ref::Value(v, ch))
        }
        "Relu" => unary(imp, Unary::Relu),
        "LeakyRelu" => unary(imp, Unary::LeakyRelu(a.f("alpha", 0.01))),
        "Sigmoid" => unary(imp, Unary::Sigmoid),
        "Tanh" => unary(imp, Unary::Tanh),
        "Softplus" => unary(imp, Unary::Softplus),
        "Mish" => unary(imp, Unary::Mish),
        "HardSigmoid" => unary(imp, Unary::HardSigmoid(a.f("alpha", 0.2), a.f("beta", 0.5))),
        "HardSwish" => unary(imp, Unary::HardSwish),
        "Elu" => unary(imp, Unary::Elu(a.f("alpha", 1.0))),
        "Erf" => unary(imp, Unary::Erf),
        "Gelu" => {
            let t = a.s("approximate", "none") == "tanh";
            unary(imp, Unary::Gelu { tanh: t })
        }
        "Neg" => unary(imp, Unary::Neg),
        "Abs" => unary(imp, Unary::Abs),
        "Exp" => unary(imp, Unary::Exp),
        "Sqrt" => unary(imp, Unary::Sqrt),
        "PRelu" => {
            let (_, ch) = imp.value(c, 0)?;
            let s = imp.need_const(c, 1, "slope")?;
            let s = per_channel(c, &s, ch, "slope", false)?;
            unary(imp, Unary::PRelu(s))
        }
        "Clip" => {
            let (lo, hi) = if opset < 11 {
                (a.f("min", f32::NEG_INFINITY), a.f("max", f32::INFINITY))
            } else {
                let get = |j, d: f32| -> Result<f32> {
                    Ok(match imp.constant(c, j)? {
                        Some(k) if k.f.len() == 1 => k.f[0],
                        Some(_) => return Err(c.err("its min/max must be scalars")),
                        None => d,
                    })
                };
                (get(1, f32::NEG_INFINITY)?, get(2, f32::INFINITY)?)
            };
            unary(imp, Unary::Clip(lo, hi))
        }
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" => {
            let bop = match op {
                "Add" => BinOp::Add,
                "Sub" => BinOp::Sub,
                "Mul" => BinOp::Mul,
                "Div" => BinOp::Div,
                "Max" => BinOp::Max,
                "Min" => BinOp::Min,
                _ => BinOp::Pow,
            };
            if c.inputs.len() != 2 {
                return Err(c.err(format!("has {} inputs; two are supported", c.inputs.len())));
            }
            let mut ins = vec![];
            let mut chs = vec![];
            let mut operands = vec![];
            for j in 0..2 {
                let name = c
                    .input(j)
                    .ok_or_else(|| c.err(format!("input {j} is missing")))?;
                match imp.names.get(name) {
                    Some(Ref::Value(v, ch)) => {
                        operands.push(Operand::Input(ins.len()));
                        ins.push(*v);
                        chs.push(*ch);
                    }
                    Some(Ref::Const(_)) => operands.push(Operand::Const(vec![])),
                    None => {
                        return Err(
                            c.err(format!("input `{name}` is not defined before this node"))
                        );
                    }
                }
            }
            if ins.is_empty() {
                return Err(c.err("combines two constants (fold them before export)"));
            }
            let ch = *chs.iter().max().expect("one value");
            if chs.iter().any(|&x| x != ch && x != 1) {
                return Err(c.err(format!(
                    "combines images of {} and {} channels",
                    chs[0], chs[1]
                )));
            }
            for (j, o) in operands.iter_mut().enumerate() {
                if let Operand::Const(v) = o {
                    let k = imp.need_const(c, j, "operand")?;
                    *v = per_channel(c, &k, ch, "constant operand", false)?;
                }
            }
            let mut it = operands.into_iter();
            let (lhs, rhs) = (it.next().expect("two"), it.next().expect("two"));
            let (v, ch) = imp.push(c, Op::Binary { op: bop, lhs, rhs }, ins, ch);
            Ok(Ref::Value(v, ch))
        }
        "Concat" => {
            let axis = a.i("axis", 1);
            if axis != 1 && axis != -3 {
                return Err(c.err(format!(
                    "concatenates along axis {axis}; only channels (axis 1) keep the image tileable"
                )));
            }
            if c.inputs.is_empty() {
                return Err(c.err("has no inputs"));
            }
            let mut ins = vec![];
            let mut ch = 0;
            for j in 0..c.inputs.len() {
                let (v, k) = imp.value(c, j)?;
                ins.push(v);
                ch += k;
            }
            let (v, ch) = imp.push(c, Op::Concat, ins, ch);
            Ok(Ref::Value(v, ch))
        }
        "MaxPool" | "AveragePool" => {
            let (x, ch) = imp.value(c, 0)?;
            let ks = two(c, a.ints("kernel_shape"), 0, "kernel_shape")?;
            if ks[0] == 0 {
                return Err(c.err("has no kernel_shape"));
            }
            let strides = two(c, a.ints("strides"), 1, "strides")?;
            let dil = two(c, a.ints("dilations"), 1, "dilations")?;
            if a.i("storage_order", 0) != 0 {
                return Err(c.err("storage_order 1 is not supported"));
            }
            let p = PoolOp {
                max: op == "MaxPool",
                win: [
                    Win {
                        k: ks[0],
                        stride: strides[0],
                        dilation: dil[0],
                    },
                    Win {
                        k: ks[1],
                        stride: strides[1],
                        dilation: dil[1],
                    },
                ],
                pad: pads4(c, a)?,
                ceil_mode: a.i("ceil_mode", 0) != 0,
                count_include_pad: a.i("count_include_pad", 0) != 0,
            };
            let (v, ch) = imp.push(c, Op::Pool(p), vec![x], ch);
            Ok(Ref::Value(v, ch))
        }
        "Resize" | "Upsample" => {
            let (x, ch) = imp.value(c, 0)?;
            let mode = a.s("mode", "nearest");
            let linear = match mode.as_str() {
                "nearest" => false,
                "linear" | "bilinear" => true,
                m => {
                    return Err(c.err(format!(
                        "mode {m:?} is not supported (nearest and linear are)"
                    )));
                }
            };
            let scales: Vec<f32> = if op == "Upsample" {
                match a.floats("scales") {
                    Some(s) => s,
                    None => imp.need_const(c, 1, "scales")?.f,
                }
            } else {
                let j = if opset < 11 { 1 } else { 2 };
                match imp.constant(c, j)? {
                    Some(k) if !k.f.is_empty() => k.f,
                    _ => {
                        if c.input(3).is_some() {
                            return Err(c.err("resizes to fixed `sizes`, which cannot follow the image size; export with `scales`"));
                        }
                        return Err(c.err("has neither scales nor sizes"));
                    }
                }
            };
            if scales.len() != 4 || scales[0] != 1.0 || scales[1] != 1.0 {
                return Err(c.err(format!(
                    "scales {scales:?}: expected [1, 1, sh, sw] (only the image axes resized)"
                )));
            }
            let ok = |s: f32| {
                s > 0.0 && s.is_finite() && (1.0 / 64.0..=64.0).contains(&s) && {
                    let v = if s >= 1.0 { s as f64 } else { 1.0 / s as f64 };
                    (v - v.round()).abs() < 1e-6
                }
            };
            if !ok(scales[2]) || !ok(scales[3]) || (scales[2] >= 1.0) != (scales[3] >= 1.0) {
                return Err(c.err(format!("scales {:?}: only integer or 1/integer factors (the same direction on both axes) cut the image into whole-pixel tiles", &scales[2..])));
            }
            if a.i("antialias", 0) != 0 && scales[2] < 1.0 {
                return Err(c.err("antialiased downscaling is not supported"));
            }
            if a.has("axes") || a.i("exclude_outside", 0) != 0 {
                return Err(c.err("axes / exclude_outside are not supported"));
            }
            let (coord, nearest) = if op == "Upsample" || opset < 11 {
                (Coord::Asymmetric, Nearest::Floor)
            } else {
                let coord = match a.s("coordinate_transformation_mode", "half_pixel").as_str() {
                    "half_pixel" => Coord::HalfPixel,
                    "pytorch_half_pixel" => Coord::PytorchHalfPixel,
                    "align_corners" => Coord::AlignCorners,
                    "asymmetric" => Coord::Asymmetric,
                    m => {
                        return Err(c.err(format!(
                            "coordinate_transformation_mode {m:?} is not supported"
                        )));
                    }
                };
                let nearest = match a.s("nearest_mode", "round_prefer_floor").as_str() {
                    "round_prefer_floor" => Nearest::RoundPreferFloor,
                    "round_prefer_ceil" => Nearest::RoundPreferCeil,
                    "floor" => Nearest::Floor,
                    "ceil" => Nearest::Ceil,
                    m => return Err(c.err(format!("nearest_mode {m:?} is not an ONNX value"))),
                };
                (coord, nearest)
            };
            if coord == Coord::AlignCorners {
                return Err(c.err("align_corners maps pixels by the whole image's size: a tile's result would depend on where the image ends at every scale; use half_pixel"));
            }
            let r = ResizeOp {
                linear,
                scale: [scales[2] as f64, scales[3] as f64],
                coord,
                nearest,
            };
            let (v, ch) = imp.push(c, Op::Resize(r), vec![x], ch);
            Ok(Ref::Value(v, ch))
        }
        "Pad" => {
            let (x, ch) = imp.value(c, 0)?;
            let (pads, value) = if opset < 11 {
                (a.ints("pads").unwrap_or_default(), a.f("value", 0.0))
            } else {
                let p = imp.need_const(c, 1, "pads")?.i;
                let v = imp
                    .constant(c, 2)?
                    .map_or(0.0, |k| k.f.first().copied().unwrap_or(0.0));
                if c.input(3).is_some() {
                    let axes = imp.need_const(c, 3, "axes")?.i;
                    // Expand to the 4-D form.
                    let mut full = vec![0i64; 8];
                    for (k, &ax) in axes.iter().enumerate() {
                        let ax = if ax < 0 { ax + 4 } else { ax };
                        if !(0..4).contains(&ax) || p.len() != 2 * axes.len() {
                            return Err(c.err(format!(
                                "axes {axes:?} with pads {p:?} are not valid for a 4-D tensor"
                            )));
                        }
                        full[ax as usize] = p[k];
                        full[ax as usize + 4] = p[k + axes.len()];
                    }
                    (full, v)
                } else {
                    (p, v)
                }
            };
            if pads.len() != 8 {
                return Err(c.err(format!("pads {pads:?}: expected 8 values for a 4-D tensor")));
            }
            if pads.iter().any(|&p| p > LIMIT) {
                return Err(c.err(format!("pads {pads:?} exceed {LIMIT}")));
            }
            if pads.iter().any(|&p| p < 0) {
                return Err(
                    c.err("has negative pads (cropping), which depend on where the image ends")
                );
            }
            if pads[0] != 0 || pads[1] != 0 || pads[4] != 0 || pads[5] != 0 {
                return Err(
                    c.err("pads the batch or channel axis; only H and W padding is supported")
                );
            }
            let mode = match a.s("mode", "constant").as_str() {
                "constant" => None,
                "reflect" => Some(PaddingMode::Reflect),
                "edge" => Some(PaddingMode::Replicate),
                "wrap" => Some(PaddingMode::Circular),
                m => return Err(c.err(format!("mode {m:?} is not an ONNX Pad mode"))),
            };
            let p = PadOp {
                pads: [
                    (pads[2] as usize, pads[6] as usize),
                    (pads[3] as usize, pads[7] as usize),
                ],
                mode,
                value,
            };
            let (v, ch) = imp.push(c, Op::Pad(p), vec![x], ch);
            Ok(Ref::Value(v, ch))
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let (x, ch) = imp.value(c, 0)?;
            let b = a.i("blocksize", 0);
            if !(1..=64).contains(&b) {
                return Err(c.err(format!("blocksize {b} is not in 1..=64")));
            }
            let b = b as usize;
            let (op, out) = if op == "DepthToSpace" {
                if ch % (b * b) != 0 {
                    return Err(c.err(format!(
                        "{ch} channels are not a multiple of blocksize² = {}",
                        b * b
                    )));
                }
                let crd = match a.s("mode", "DCR").as_str() {
                    "DCR" => false,
                    "CRD" => true,
                    m => return Err(c.err(format!("mode {m:?} is not DCR or CRD"))),
                };
                (Op::DepthToSpace { block: b, crd }, ch / (b * b))
            } else {
                (Op::SpaceToDepth { block: b }, ch * b * b)
            };
            let (v, ch) = imp.push(c, op, vec![x], out);
            Ok(Ref::Value(v, ch))
        }
        _ => Err(c.err("is not an operator of the supported CNN subset (see `bsp_tiling::onnx`)")),
    }
}

/// Folds BatchNormalization into the convolution before it (where that convolution's output feeds
/// nothing else) and removes Identity nodes.
pub fn simplify(mut g: Graph) -> Graph {
    let nv = g.nodes.len() + 1;
    let mut readers = vec![0usize; nv];
    for n in &g.nodes {
        for &u in &n.inputs {
            readers[u] += 1;
        }
    }
    readers[g.output] += 1;
    // Fold: the BN node becomes an Identity of the (rescaled) convolution.
    for i in 0..g.nodes.len() {
        let Op::Affine { scale, shift } = &g.nodes[i].op else {
            continue;
        };
        let u = g.nodes[i].inputs[0];
        if u == 0 || readers[u] != 1 {
            continue;
        }
        let (scale, shift) = (scale.clone(), shift.clone());
        let Op::Conv(conv) = &mut g.nodes[u - 1].op else {
            continue;
        };
        let per = conv.weight.len() / conv.cout;
        for co in 0..conv.cout {
            let (s, t) = (
                scale[co.min(scale.len() - 1)],
                shift[co.min(shift.len() - 1)],
            );
            for w in &mut conv.weight[co * per..(co + 1) * per] {
                *w *= s;
            }
            conv.bias[co] = conv.bias[co] * s + t;
        }
        g.nodes[i].op = Op::Identity;
    }
    // Drop identities: every reader reads what the identity read.
    let mut alias: Vec<usize> = (0..nv).collect();
    let mut keep = vec![];
    let mut renum = vec![0usize; nv];
    for (i, n) in g.nodes.iter().enumerate() {
        let v = i + 1;
        if matches!(n.op, Op::Identity) {
            alias[v] = alias[n.inputs[0]];
        } else {
            keep.push(i);
            renum[v] = keep.len();
        }
    }
    let resolve = |u: usize| if alias[u] == 0 { 0 } else { renum[alias[u]] };
    let nodes: Vec<Node> = keep
        .iter()
        .map(|&i| {
            let mut n = g.nodes[i].clone();
            n.inputs = n.inputs.iter().map(|&u| resolve(u)).collect();
            n
        })
        .collect();
    let output = resolve(g.output);
    if output == 0 {
        // The whole graph is identities: keep one so the output is a node.
        return Graph {
            nodes: vec![Node {
                name: "identity".into(),
                op_type: "Identity".into(),
                op: Op::Identity,
                inputs: vec![0],
                channels: g.channels,
            }],
            output: 1,
            ..g
        };
    }
    Graph { nodes, output, ..g }
}
