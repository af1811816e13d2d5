//! Resampling a sample's [`Geometry`] out of its image: the host-computed integer tables ([`coeffs`]),
//! the passes that apply them ([`resample`]), and [`Plan`], which ties one item's geometry and
//! interpolation to the source rectangle it reads (the window plus the filter's margin) and the pixels it
//! makes.

pub mod coeffs;
pub mod resample;

use coeffs::Coeffs;
use resample::{Buffers, Source};
use vocab::{Geometry, Interpolation, Rect};

/// The tables of one item's resampling, and what they read.
#[derive(Clone, Debug)]
pub enum Plan {
    Bilinear { x: Coeffs, y: Coeffs },
    Nearest { x: Vec<u32>, y: Vec<u32> },
}

impl Plan {
    pub fn new(g: &Geometry, interpolation: Interpolation) -> Plan {
        match interpolation {
            Interpolation::Bilinear => Plan::Bilinear {
                x: Coeffs::bilinear(&g.x),
                y: Coeffs::bilinear(&g.y),
            },
            Interpolation::Nearest => Plan::Nearest {
                x: coeffs::nearest(&g.x),
                y: coeffs::nearest(&g.y),
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
            Plan::Bilinear { x, y } => (x.span(), y.span()),
            Plan::Nearest { x, y } => (span(x), span(y)),
        };
        Rect::new(x0, y0, x1 - x0, y1 - y0)
    }

    /// The kept outputs of `src`, packed and interleaved. `false` if `src` does not hold [`Plan::source`].
    pub fn apply(&self, src: &Source<u8>, buf: &mut Buffers, out: &mut Vec<u8>) -> bool {
        match self {
            Plan::Bilinear { x, y } => resample::bilinear(src, x, y, buf, out),
            Plan::Nearest { x, y } => resample::nearest(src, x, y, out),
        }
    }
}
