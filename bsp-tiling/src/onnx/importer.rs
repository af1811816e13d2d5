//! What importing a node works with: the names defined so far (image values and constants), a node's
//! attributes and inputs, constants decoded from tensors, and the checks every op family shares
//! (per-channel vectors, 2-D geometry, padding).

use super::pb;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::graph::ops::{AxisPad, Op};
use std::collections::HashMap;

/// A constant (initializer or Constant node): its shape and values as f32 (integers as well, exactly for
/// the small values shapes and pads take) and i64.
#[derive(Clone, Debug)]
pub(super) struct Const {
    pub(super) dims: Vec<usize>,
    pub(super) f: Vec<f32>,
    pub(super) i: Vec<i64>,
}

/// What a name in the graph refers to.
#[derive(Clone, Debug)]
pub(super) enum Ref {
    /// A value of the image pipeline (0 = the input) with its channel count.
    Value(usize, usize),
    Const(Const),
}

pub(super) fn format_err(model: &str, reason: impl Into<String>) -> Error {
    Error::OnnxFormat {
        model: model.into(),
        reason: reason.into(),
    }
}

/// Decodes a TensorProto's data.
pub(super) fn tensor_const(t: &pb::TensorProto, model: &str) -> Result<Const> {
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

pub(super) struct Importer<'a> {
    pub(super) model: &'a str,
    pub(super) names: HashMap<String, Ref>,
    pub(super) nodes: Vec<Node>,
}

/// The attributes of one node, by name.
pub(super) struct Attrs<'a>(pub(super) HashMap<&'a str, &'a pb::AttributeProto>);

impl Attrs<'_> {
    pub(super) fn i(&self, k: &str, d: i64) -> i64 {
        self.0.get(k).and_then(|a| a.i).unwrap_or(d)
    }
    pub(super) fn f(&self, k: &str, d: f32) -> f32 {
        self.0.get(k).and_then(|a| a.f).unwrap_or(d)
    }
    pub(super) fn ints(&self, k: &str) -> Option<Vec<i64>> {
        self.0.get(k).map(|a| a.ints.clone())
    }
    pub(super) fn floats(&self, k: &str) -> Option<Vec<f32>> {
        self.0.get(k).map(|a| a.floats.clone())
    }
    pub(super) fn s(&self, k: &str, d: &str) -> String {
        self.0
            .get(k)
            .and_then(|a| a.s.as_ref())
            .map_or(d.to_string(), |s| String::from_utf8_lossy(s).into_owned())
    }
    pub(super) fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

/// The node being imported: its name and op for errors, its inputs.
pub(super) struct Cur<'a> {
    pub(super) name: String,
    pub(super) op: String,
    pub(super) inputs: &'a [String],
}

impl Cur<'_> {
    pub(super) fn err(&self, reason: impl Into<String>) -> Error {
        Error::Node {
            node: self.name.clone(),
            op: self.op.clone(),
            reason: reason.into(),
        }
    }
    /// The name of input `j`, `None` when absent or empty (ONNX's omitted optional input).
    pub(super) fn input(&self, j: usize) -> Option<&str> {
        self.inputs
            .get(j)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

impl Importer<'_> {
    pub(super) fn value(&self, c: &Cur, j: usize) -> Result<(usize, usize)> {
        let name = c
            .input(j)
            .ok_or_else(|| c.err(format!("input {j} is missing")))?;
        match self.names.get(name) {
            Some(Ref::Value(v, ch)) => Ok((*v, *ch)),
            Some(Ref::Const(_)) => Err(c.err(format!("input `{name}` is a constant where an image is expected"))),
            None => Err(c.err(format!("input `{name}` is not defined before this node (an unsupported op's output, or the graph is not in topological order)"))),
        }
    }

    pub(super) fn constant(&self, c: &Cur, j: usize) -> Result<Option<Const>> {
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

    pub(super) fn need_const(&self, c: &Cur, j: usize, what: &str) -> Result<Const> {
        self.constant(c, j)?
            .ok_or_else(|| c.err(format!("its {what} (input {j}) is missing")))
    }

    pub(super) fn push(
        &mut self,
        c: &Cur,
        op: Op,
        inputs: Vec<usize>,
        channels: usize,
    ) -> (usize, usize) {
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
pub(super) fn per_channel(
    c: &Cur,
    k: &Const,
    ch: usize,
    what: &str,
    exact: bool,
) -> Result<Vec<f32>> {
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
pub(super) const LIMIT: i64 = 1 << 16;

/// A value past [`LIMIT`]: refused as too large for this importer (it may be valid ONNX).
pub(super) fn too_large(what: &str, v: i64) -> String {
    format!("attribute {what} {v} is larger than this importer's cap of {LIMIT}")
}

pub(super) fn two(c: &Cur, v: Option<Vec<i64>>, d: i64, what: &str) -> Result<[usize; 2]> {
    match v {
        None => Ok([d as usize; 2]),
        Some(v) if v.len() == 2 && v.iter().all(|&x| (1..=LIMIT).contains(&x)) => {
            Ok([v[0] as usize, v[1] as usize])
        }
        Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
            let big = v.iter().copied().max().unwrap_or(0);
            Err(c.err(too_large(what, big)))
        }
        Some(v) => Err(c.err(format!(
            "{what} {v:?}: expected two positive values (a 2-D op on N×C×H×W)"
        ))),
    }
}

pub(super) fn pads4(c: &Cur, a: &Attrs) -> Result<[AxisPad; 2]> {
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
        Some(p) if p.len() == 4 && p.iter().all(|&x| x >= 0) => {
            let big = p.iter().copied().max().unwrap_or(0);
            Err(c.err(too_large("pads", big)))
        }
        Some(p) => Err(c.err(format!("pads {p:?}: expected four non-negative values"))),
    }
}

/// A Constant node's value (`value`, `value_float(s)`, `value_int(s)`).
pub(super) fn constant_node(c: &Cur, a: &Attrs, model: &str) -> Result<Const> {
    if let Some(t) = a.0.get("value").and_then(|at| at.t.as_ref()) {
        return tensor_const(t, model);
    }
    if let Some(f) = a.0.get("value_float").and_then(|at| at.f) {
        return Ok(Const {
            dims: vec![],
            f: vec![f],
            i: vec![f as i64],
        });
    }
    if let Some(fs) = a.floats("value_floats").filter(|_| a.has("value_floats")) {
        return Ok(Const {
            dims: vec![fs.len()],
            i: fs.iter().map(|&v| v as i64).collect(),
            f: fs,
        });
    }
    if let Some(i) = a.0.get("value_int").and_then(|at| at.i) {
        return Ok(Const {
            dims: vec![],
            f: vec![i as f32],
            i: vec![i],
        });
    }
    if let Some(is) = a.ints("value_ints").filter(|_| a.has("value_ints")) {
        return Ok(Const {
            dims: vec![is.len()],
            f: is.iter().map(|&v| v as f32).collect(),
            i: is,
        });
    }
    Err(c.err("has no value this importer reads (value, value_float(s), value_int(s))"))
}
