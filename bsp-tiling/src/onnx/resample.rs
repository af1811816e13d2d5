//! Pooling and resizing: MaxPool, AveragePool, Resize and Upsample (nearest and linear, integer or
//! 1/integer scales).

use super::importer::{Attrs, Cur, Importer, Ref, pads4, two};
use crate::error::Result;
use crate::graph::ops::{Coord, Nearest, Op, PoolOp, ResizeOp, Win};

/// MaxPool or AveragePool.
pub(super) fn pool(imp: &mut Importer, c: &Cur, a: &Attrs) -> Result<Ref> {
    let op = c.op.as_str();
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

/// The largest factor one Resize may scale by (or its inverse): far beyond any real network's.
const MAX_SCALE: f32 = 64.0;

/// Resize or Upsample by scales that cut the image into whole-pixel tiles.
pub(super) fn resize(imp: &mut Importer, c: &Cur, a: &Attrs, opset: i64) -> Result<Ref> {
    let op = c.op.as_str();
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
    if let Some(s) = scales[2..]
        .iter()
        .find(|&&s| s.is_finite() && !(1.0 / MAX_SCALE..=MAX_SCALE).contains(&s) && s > 0.0)
    {
        return Err(c.err(format!(
            "scale {s} is past this importer's cap of {MAX_SCALE} (or 1/{MAX_SCALE}) per Resize"
        )));
    }
    let ok = |s: f32| {
        s > 0.0 && s.is_finite() && (1.0 / MAX_SCALE..=MAX_SCALE).contains(&s) && {
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
