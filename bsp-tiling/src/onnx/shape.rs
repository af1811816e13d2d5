//! Ops that move pixels between axes or along them without arithmetic: Concat over channels, Pad
//! (constant, reflect, edge, wrap), DepthToSpace and SpaceToDepth.

use super::importer::{Attrs, Cur, Importer, LIMIT, Ref};
use crate::error::Result;
use crate::graph::ops::{Op, PadOp};
use crate::padding::PaddingMode;

/// Concat along the channels.
pub(super) fn concat(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
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

/// Pad of H and W: pads from the attribute before opset 11, from constant inputs (with `axes`) since.
pub(super) fn pad(imp: &mut Importer, c: &Cur, a: &Attrs, opset: i64) -> Result<Ref> {
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
        return Err(c.err("has negative pads (cropping), which depend on where the image ends"));
    }
    if pads[0] != 0 || pads[1] != 0 || pads[4] != 0 || pads[5] != 0 {
        return Err(c.err("pads the batch or channel axis; only H and W padding is supported"));
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

/// DepthToSpace (DCR or CRD) or SpaceToDepth.
pub(super) fn depth_space(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
    let op = c.op.as_str();
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
