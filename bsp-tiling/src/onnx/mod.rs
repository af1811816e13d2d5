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
//! mode. A file that does not parse is [`Error::OnnxFormat`]. What the ONNX checker and onnxruntime
//! refuse is refused too (`check`): no opset for the default domain or one past the newest released, a
//! value name defined twice, attributes out of their range (a group below 1); values past this
//! importer's caps (kernel sides, strides, pads, resize factors) are refused as too large.

#[allow(clippy::all, missing_docs)]
mod pb;

mod check;
mod conv;
mod elementwise;
mod importer;
mod norm;
mod resample;
mod shape;

use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node};
use importer::{Attrs, Cur, Importer, Ref, format_err, tensor_const};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

/// Reads `path` and imports it ([`graph_from_onnx`]).
pub fn load_onnx(path: &Path) -> Result<Graph> {
    let bytes = crate::model::read_model_file(path)?;
    graph_from_onnx(&bytes, &path.display().to_string())
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
    let opset = check::default_opset(&m, model)?;
    let mut defined = check::Defined::of(g, model)?;
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
    let (in_name, channels) = image_input(input)?;
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
        defined.outputs(&c, &n.output)?;
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
        min_tile: None,
    };
    Ok(simplify(graph))
}

/// The image input's name and channel count: a float32 `N×C×H×W` tensor with a fixed C and N = 1 (or
/// symbolic).
fn image_input(input: &pb::ValueInfoProto) -> Result<(String, usize)> {
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
    Ok((in_name, channels))
}

/// Imports one node by its op family.
fn import_node(imp: &mut Importer, c: &Cur, a: &Attrs, opset: i64) -> Result<Ref> {
    let op = c.op.as_str();
    if GLOBAL_OPS.contains(&op) {
        return Err(c.err("reduces the whole image to one value per channel: every output pixel would depend on every input pixel, which a tiled CNN cannot compute (nor any dense layer after it)"));
    }
    if DENSE_OPS.contains(&op) {
        return Err(c.err("is a dense, reshaping or attention op: it mixes pixels across the whole image or needs a fixed image size, so it cannot be tiled"));
    }
    match op {
        "Constant" => Ok(Ref::Const(importer::constant_node(c, a, imp.model)?)),
        "Identity" | "Dropout" => elementwise::identity(imp, c),
        "Conv" | "ConvTranspose" => conv::conv(imp, c, a),
        "BatchNormalization" => norm::batch_norm(imp, c, a),
        "InstanceNormalization" | "GroupNormalization" | "LayerNormalization" => {
            norm::norm(imp, c, a)
        }
        "PRelu" => elementwise::prelu(imp, c),
        "Clip" => elementwise::clip(imp, c, a, opset),
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" => elementwise::binary(imp, c),
        "Concat" => shape::concat(imp, c, a),
        "MaxPool" | "AveragePool" => resample::pool(imp, c, a),
        "Resize" | "Upsample" => resample::resize(imp, c, a, opset),
        "Pad" => shape::pad(imp, c, a, opset),
        "DepthToSpace" | "SpaceToDepth" => shape::depth_space(imp, c, a),
        _ => match elementwise::unary_of(op, a) {
            Some(u) => elementwise::unary(imp, c, u),
            None => {
                Err(c
                    .err("is not an operator of the supported CNN subset (see `bsp_tiling::onnx`)"))
            }
        },
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
