//! Normalisations: BatchNormalization (inference: a per-channel affine map, folded into the convolution
//! before it by `simplify`), and InstanceNormalization, GroupNormalization and LayerNormalization over
//! `C,H,W` (whole-image statistics, merged across tiles).

use super::importer::{Attrs, Const, Cur, Importer, Ref, per_channel};
use crate::error::Result;
use crate::graph::ops::{NormKind, NormOp, Op};

/// A BatchNormalization node (inference mode).
pub(super) fn batch_norm(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
    if a.i("training_mode", 0) != 0 {
        return Err(
            c.err("is in training mode (statistics of the batch); export the model in eval mode")
        );
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

/// An InstanceNormalization, GroupNormalization or LayerNormalization node.
pub(super) fn norm(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
    let op = c.op.as_str();
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
                    Err(c.err(format!(
                        "its {what} has {} values, neither {ch} channels nor {groups} groups",
                        k.f.len()
                    )))
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
