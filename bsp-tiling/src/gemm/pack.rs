//! Packing: the left matrix (weights) in panels of `MR` rows, `k`-major; the right matrix (im2col's
//! columns), where the kernel cannot read the input in place, one panel of `NR` output pixels at a time.

use super::{MR, NR};
use crate::graph::ops::Win;
use crate::tensor::Tensor;

/// An `m × k` matrix in panels of `MR` rows: panel `p` holds `a[p·MR + i][kk]` at `(p·k + kk)·MR + i`;
/// rows past `m` are zero.
pub struct PackedA {
    pub(super) data: Vec<f32>,
    pub(super) m: usize,
    pub(super) k: usize,
}

impl PackedA {
    /// Packs `a[i][kk] = src[i·rs + kk·cs]` for `i < m`, `kk < k`.
    pub fn new(src: &[f32], m: usize, k: usize, rs: usize, cs: usize) -> PackedA {
        let panels = m.div_ceil(MR);
        let mut data = vec![0f32; panels * k * MR];
        for (p, panel) in data.chunks_exact_mut((k * MR).max(1)).enumerate() {
            for i in 0..MR.min(m - p * MR) {
                let row = (p * MR + i) * rs;
                for kk in 0..k {
                    panel[kk * MR + i] = src[row + kk * cs];
                }
            }
        }
        PackedA { data, m, k }
    }
}

/// The im2col rows of a convolution over channels `c0..` of `x`, in order `(ci, ky, kx)`, as offsets of
/// each row's first value from that of output pixel `(oy, ox)` at `c0·h·w + oy·sy·w + ox·sx`.
pub fn input_offsets(x: &Tensor, cg: usize, w: &[Win; 2]) -> Vec<usize> {
    let mut offs = Vec::with_capacity(cg * w[0].k * w[1].k);
    for ci in 0..cg {
        for ky in 0..w[0].k {
            for kx in 0..w[1].k {
                offs.push(ci * x.h * x.w + ky * w[0].dilation * x.w + kx * w[1].dilation);
            }
        }
    }
    offs
}

/// Writes the im2col columns of output pixels `(oy, ox..ox+nv)` as one panel: row `r` of `offs` (from
/// [`input_offsets`]) at `dst[r·NR..]`, columns past `nv` zero.
#[allow(clippy::too_many_arguments)]
pub fn pack_panel(
    x: &Tensor,
    c0: usize,
    w: &[Win; 2],
    offs: &[usize],
    oy: usize,
    ox: usize,
    nv: usize,
    dst: &mut [f32],
) {
    let sx = w[1].stride;
    let base = c0 * x.h * x.w + oy * w[0].stride * x.w + ox * sx;
    for (&off, o) in offs.iter().zip(dst.chunks_exact_mut(NR)) {
        let src = &x.data[base + off..];
        if sx == 1 {
            o[..nv].copy_from_slice(&src[..nv]);
        } else {
            for (j, v) in o[..nv].iter_mut().enumerate() {
                *v = src[j * sx];
            }
        }
        o[nv..].fill(0.0);
    }
}
