//! Packing: the left matrix (weights) in panels of `MR` rows, `k`-major; the right matrix (im2col's
//! columns), where the kernel cannot read the input in place, one panel of `NR` output pixels at a time.

use super::{MR, NR};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::win::Win;

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
/// each row's first value from that of output pixel `(oy, ox)` at `c0·h·w + oy·sy·w + ox`. With a column
/// stride `s > 1`, `x` is [`phases`]' copy: the column a kernel column reads sits in phase
/// `(kx·dx) mod s`, at `(kx·dx) div s` past the output column.
pub fn input_offsets(x: &Tensor, cg: usize, w: &[Win; 2]) -> Vec<usize> {
    let s = w[1].stride;
    let starts = phase_starts(x.w, s);
    let mut offs = Vec::with_capacity(cg * w[0].k * w[1].k);
    for ci in 0..cg {
        for ky in 0..w[0].k {
            for kx in 0..w[1].k {
                let col = kx * w[1].dilation;
                offs.push(ci * x.h * x.w + ky * w[0].dilation * x.w + starts[col % s] + col / s);
            }
        }
    }
    offs
}

/// Where each phase starts in a row of `w` values split by a column stride `s`: phase `p` holds columns
/// `p, p + s, p + 2s, …`.
pub(crate) fn phase_starts(w: usize, s: usize) -> Vec<usize> {
    let mut at = 0;
    (0..s)
        .map(|p| {
            let start = at;
            at += w.saturating_sub(p).div_ceil(s);
            start
        })
        .collect()
}

/// Each row of `x` split into its `s` phases (see [`phase_starts`]): a convolution or a pooling with
/// column stride `s` then reads every kernel column's values as consecutive ones, in place, like a
/// stride-1 one. One pass over the window instead of a strided read per kernel column.
pub(crate) fn phases(x: &Tensor, s: usize) -> Result<Tensor> {
    let starts = phase_starts(x.w, s);
    let mut out = Tensor::scratch(x.c, x.h, x.w)?;
    for (src, dst) in x
        .data
        .chunks_exact(x.w.max(1))
        .zip(out.data.chunks_exact_mut(x.w.max(1)))
    {
        match s {
            2 => split_row::<2>(src, dst, &starts),
            3 => split_row::<3>(src, dst, &starts),
            4 => split_row::<4>(src, dst, &starts),
            _ => {
                for (p, &start) in starts.iter().enumerate() {
                    for (d, &v) in dst[start..].iter_mut().zip(src[p..].iter().step_by(s)) {
                        *d = v;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// [`phases`] of one row for a stride known at compile time: whole groups of `S` columns dealt out to
/// the phases (a loop the compiler vectorises), then the last, partial group.
fn split_row<const S: usize>(src: &[f32], dst: &mut [f32], starts: &[usize]) {
    let full = src.len() / S;
    for p in 0..S {
        let d = &mut dst[starts[p]..starts[p] + full];
        for (o, group) in d.iter_mut().zip(src.chunks_exact(S)) {
            *o = group[p];
        }
    }
    for (p, &v) in src[full * S..].iter().enumerate() {
        dst[starts[p] + full] = v;
    }
}

/// Writes the im2col columns of output pixels `(oy, ox..ox+nv)` as `nv.div_ceil(NR)` panels of
/// `offs.len()` rows each: row `r` of `offs` (from [`input_offsets`]) of panel `p` at
/// `dst[(p·k + r)·NR..]`, columns past `nv` zero. `x` has column stride 1 (a strided convolution's
/// window is split into [`phases`] first), so each row is one run along the input row, which the
/// prefetchers follow (panel by panel, a 1×1 convolution's rows are as many far-apart streams as it
/// has input channels).
#[allow(clippy::too_many_arguments)]
pub fn pack_panels(
    x: &Tensor,
    c0: usize,
    w: &[Win; 2],
    offs: &[usize],
    oy: usize,
    ox: usize,
    nv: usize,
    dst: &mut [f32],
) {
    debug_assert_eq!(
        w[1].stride, 1,
        "pack_panels reads phases, not strided columns"
    );
    let k = offs.len();
    let base = c0 * x.h * x.w + oy * w[0].stride * x.w + ox;
    let panels = nv.div_ceil(NR);
    for (r, &off) in offs.iter().enumerate() {
        let src = &x.data[base + off..];
        for p in 0..panels {
            let o = &mut dst[(p * k + r) * NR..][..NR];
            let n = NR.min(nv - p * NR);
            o[..n].copy_from_slice(&src[p * NR..p * NR + n]);
            o[n..].fill(0.0);
        }
    }
}
