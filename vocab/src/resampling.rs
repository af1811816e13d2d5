//! How a sample is resampled out of its image, as integer tables computed on the host: [`Resampling`]
//! (one item's two axes, bilinear or nearest, and the source rectangle they read) and [`Coeffs`] (the
//! tables of one bilinear axis: for each kept output, the first source pixel it reads and its integer
//! weights). They are Pillow's (`precompute_coeffs` and `normalize_coeffs_8bpc`
//! in `libImaging/Resample.c`) so that a sample equals Pillow's resize to the value, and they are plain
//! integers so that any other executor — the CPU passes here, a GPU kernel given the same tables —
//! computes the same bytes: the loader's CPU passes and `l3-cuda`'s kernel both take their tables from here.
//! Only this file uses floating point; the passes are integer-only.
//!
//! For output `j` of an [`Axis`], with `scale = src_len / dst_len` (in `f64`, from the `f32` span length
//! as Pillow computes it), `filterscale = max(scale, 1)` and `support = 1 * filterscale` (the triangle's
//! support widened when shrinking: the antialiasing):
//!
//! - `center = (offset + j + 0.5) * scale`, relative to the span;
//! - `xmin = max(trunc(center - support + 0.5), 0)`, `xmax = min(trunc(center + support + 0.5), src_len)`;
//! - `w[x] = tri((x + xmin - center + 0.5) / filterscale)` for `x < xmax - xmin`, `tri(t) = max(1 - |t|, 0)`,
//!   then divided by their sum;
//! - the integer weight is `trunc(0.5 + w * 2^22)` (`trunc(-0.5 + w * 2^22)` if negative).
//!
//! A pass then computes `clamp((2^21 + Σ v·k) >> 22, 0, 255)` per channel.

use crate::{Axis, Geometry, Interpolation, Rect};

/// The tables of one item's resampling: what its passes read and with which weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resampling {
    Bilinear {
        x: Coeffs,
        y: Coeffs,
    },
    /// The source index of each kept output ([`Axis::nearest`]).
    Nearest {
        x: Vec<u32>,
        y: Vec<u32>,
    },
}

impl Resampling {
    pub fn new(g: &Geometry, interpolation: Interpolation) -> Resampling {
        match interpolation {
            Interpolation::Bilinear => Resampling::Bilinear {
                x: Coeffs::bilinear(&g.x),
                y: Coeffs::bilinear(&g.y),
            },
            Interpolation::Nearest => Resampling::Nearest {
                x: nearest(&g.x),
                y: nearest(&g.y),
            },
        }
    }

    /// The source pixels the sample reads: what a region read decodes.
    pub fn source(&self) -> Rect {
        let span = |v: &[u32]| {
            let lo = v.iter().copied().min().unwrap_or(0);
            (lo, v.iter().copied().max().map_or(lo + 1, |m| m + 1))
        };
        let ((x0, x1), (y0, y1)) = match self {
            Resampling::Bilinear { x, y } => (x.span(), y.span()),
            Resampling::Nearest { x, y } => (span(x), span(y)),
        };
        Rect::new(x0, y0, x1 - x0, y1 - y0)
    }

    /// The kept outputs: width and height.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Resampling::Bilinear { x, y } => (x.first.len() as u32, y.first.len() as u32),
            Resampling::Nearest { x, y } => (x.len() as u32, y.len() as u32),
        }
    }
}

/// Fractional bits of the integer weights: Pillow's `PRECISION_BITS` (32 − 8 − 2), which leaves room for a
/// sum of 8-bit values times weights that may exceed one.
pub const PRECISION_BITS: u32 = 22;

/// One axis's tables: output `j` reads source pixels `first[j] .. first[j] + taps[j]` (absolute source
/// coordinates) with weights `weights[j * ksize ..][..taps[j]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coeffs {
    pub ksize: usize,
    pub first: Vec<u32>,
    pub taps: Vec<u32>,
    pub weights: Vec<i32>,
}

fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

impl Coeffs {
    /// The bilinear (triangle, antialiased) tables of `axis`'s kept outputs.
    pub fn bilinear(axis: &Axis) -> Coeffs {
        let in_size = axis.src_len as i64;
        // Pillow: `(double)(in1 - in0) / outSize` with `float` box edges.
        let scale = f64::from(axis.src_len as f32) / f64::from(axis.dst_len);
        let filterscale = scale.max(1.0);
        let support = filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let n = axis.len as usize;
        let mut c = Coeffs {
            ksize,
            first: Vec::with_capacity(n),
            taps: Vec::with_capacity(n),
            weights: vec![0; n * ksize],
        };
        let ss = 1.0 / filterscale;
        let mut w = vec![0f64; ksize];
        for j in 0..n {
            let center = (f64::from(axis.offset) + j as f64 + 0.5) * scale;
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size) - xmin;
            let taps = xmax.max(0) as usize;
            let mut sum = 0.0;
            for (x, wx) in w.iter_mut().enumerate().take(taps) {
                *wx = triangle((x as f64 + xmin as f64 - center + 0.5) * ss);
                sum += *wx;
            }
            let k = &mut c.weights[j * ksize..][..ksize];
            for (x, kx) in k.iter_mut().enumerate().take(taps) {
                let v = if sum != 0.0 { w[x] / sum } else { w[x] };
                let f = v * f64::from(1u32 << PRECISION_BITS);
                *kx = if v < 0.0 {
                    (-0.5 + f) as i32
                } else {
                    (0.5 + f) as i32
                };
            }
            c.first.push(axis.src + xmin as u32);
            c.taps.push(taps as u32);
        }
        c
    }

    /// The source span the kept outputs read: `(first, end)`.
    pub fn span(&self) -> (u32, u32) {
        let lo = self.first.iter().copied().min().unwrap_or(0);
        let hi = self
            .first
            .iter()
            .zip(&self.taps)
            .map(|(f, t)| f + t)
            .max()
            .unwrap_or(lo);
        (lo, hi)
    }
}

/// The nearest-neighbour source index of each kept output of `axis` ([`Axis::nearest`]).
pub fn nearest(axis: &Axis) -> Vec<u32> {
    (0..axis.len).map(|j| axis.nearest(j)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_copy_is_exact() {
        let copy = Coeffs::bilinear(&Axis::copy(5, 7));
        for j in 0..7 {
            let k = &copy.weights[j * copy.ksize..][..copy.taps[j] as usize];
            assert_eq!(copy.first[j], 5 + j as u32);
            assert_eq!(
                k[0],
                1 << PRECISION_BITS,
                "a copy takes its own pixel whole"
            );
            assert!(k[1..].iter().all(|&w| w == 0));
        }
        let shrink = Coeffs::bilinear(&Axis {
            src: 0,
            src_len: 4097,
            dst_len: 224,
            offset: 0,
            len: 224,
        });
        for j in 0..224 {
            let k = &shrink.weights[j * shrink.ksize..][..shrink.taps[j] as usize];
            let s: i64 = k.iter().map(|&w| i64::from(w)).sum();
            assert!(
                (s - (1 << PRECISION_BITS)).abs() <= k.len() as i64,
                "{j}: {s}"
            );
        }
        assert_eq!(shrink.span(), (0, 4097));
    }
}
