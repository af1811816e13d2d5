//! Conv and ConvTranspose: weights, groups, strides, dilations, padding (`auto_pad` too), a transposed
//! convolution's output padding.

use super::importer::{Attrs, Cur, Importer, LIMIT, Ref, pads4, per_channel, too_large, two};
use crate::error::Result;
use crate::graph::ops::{ConvOp, Op, Win};

/// A Conv or ConvTranspose node.
pub(super) fn conv(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
    let op = c.op.as_str();
    let (x, ch) = imp.value(c, 0)?;
    let w = imp.need_const(c, 1, "weight")?;
    if w.dims.len() != 4 {
        return Err(c.err(format!(
            "has a weight of shape {:?}: only 2-D convolutions (4-D weights) are supported",
            w.dims
        )));
    }
    // The checker's range: a group count below 1 is invalid (onnxruntime refuses it), not a single group.
    let groups = match a.i("group", 1) {
        g @ 1..=LIMIT => g as usize,
        g if g > LIMIT => return Err(c.err(too_large("group", g))),
        g => return Err(c.err(format!("attribute group {g}: must be at least 1"))),
    };
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
    if cin % groups != 0 || cout % groups != 0 {
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
            Some(p) if p.len() == 2 && p.iter().all(|&v| v >= 0) => [p[0] as usize, p[1] as usize],
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
