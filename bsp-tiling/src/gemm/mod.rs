//! Convolution as a matrix product with a fixed summation order: every output is one running sum,
//! started at its bias and fed one fused multiply-add per im2col row `k` in increasing order, whatever
//! the image size, the tile, the blocking, the thread count or the kernel. That is what lets a
//! convolution computed tile by tile equal the whole-image one bit for bit: an output pixel sees the
//! same operations in any tile. (Faster GEMMs split the sum by the matrix shape, and then tiled and
//! whole results differ.)
//!
//! The weights are packed once per call ([`PackedA`]). The input is read in place where it can be
//! (stride 1 along rows: the kernel reads each im2col row straight from the window, [`input_offsets`])
//! and packed one `NR`-pixel panel at a time where it cannot (column strides, a row's last pixels), so
//! no column matrix is ever written out. The kernels (`kernel.rs`: portable and AVX2 + FMA side by side)
//! agree bit for bit, so results do not depend on the CPU either. Both engines' convolutions
//! (the graph engine's and the TransformerNet stages') and the transposed convolution's products run here.

mod kernel;
pub(crate) mod pack;

pub use kernel::Kernel;
pub use pack::PackedA;

use crate::error::Result;
use crate::tensor::Tensor;
use crate::win::Win;

/// Rows of the weights (output channels) per kernel call.
pub const MR: usize = 6;
/// Output pixels per kernel call.
pub const NR: usize = 16;
/// `k` per pass over a panel, so that its `KC·NR` input values stay in L1 while every row panel of
/// the weights uses them.
const KC: usize = 256;
/// Panels packed at a time where the input is not read in place.
const BLOCK: usize = 8;

/// What each output channel starts from.
#[derive(Clone, Copy)]
pub enum Init<'a> {
    /// `bias[i]` for output channel `i`.
    Bias(&'a [f32]),
    Zero,
}

/// The kernel this CPU runs.
pub fn kernel() -> Kernel {
    kernel::best()
}

/// A convolution's im2col rows, as read from its input window.
pub struct Rows<'a> {
    x: &'a Tensor,
    /// With a column stride: `x`'s rows split into phases ([`pack::phases`]), which the rows are read from.
    phased: Option<Tensor>,
    win: [Win; 2],
    /// Input offsets of each im2col row ([`pack::input_offsets`]).
    offs: Vec<usize>,
    /// `k·NR`: the same rows in a packed panel.
    packed: Vec<usize>,
}

impl<'a> Rows<'a> {
    /// The rows of a convolution with window `win` over `cg` channels of `x` (one group).
    pub fn new(x: &'a Tensor, cg: usize, win: &[Win; 2]) -> Result<Rows<'a>> {
        let phased = (win[1].stride > 1)
            .then(|| pack::phases(x, win[1].stride))
            .transpose()?;
        let offs = pack::input_offsets(x, cg, win);
        let packed = (0..offs.len()).map(|r| r * NR).collect();
        // Read from the phases, the rows are consecutive: a stride-1 window from here on.
        let mut win = *win;
        win[1].stride = 1;
        Ok(Rows {
            x,
            phased,
            win,
            offs,
            packed,
        })
    }

    /// Output rows `y0..y1` (`wo` pixels each) of the product with `a` over the group whose first input
    /// channel is `c0`: output channel `i`, pixel `(oy, ox)` at `c + i·ldc + (oy − y0)·wo + ox`.
    ///
    /// # Safety
    /// Those `a.m × (y1 − y0)·wo` places of `c` are valid for writes and no one else touches them while
    /// this runs; `(y0..y1) × (0..wo)` are valid outputs of the window.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn product(
        &self,
        a: &PackedA,
        c0: usize,
        y0: usize,
        y1: usize,
        wo: usize,
        c: *mut f32,
        ldc: usize,
        init: Init,
        kernel: Kernel,
    ) {
        let (m, k) = (a.m, a.k);
        assert_eq!(k, self.offs.len(), "gemm: weights of another window");
        if let Init::Bias(v) = init {
            assert!(v.len() >= m, "gemm: short bias");
        }
        let x = self.phased.as_ref().unwrap_or(self.x);
        let sy = self.win[0].stride;
        // Columns are consecutive here (strided windows were split into phases): read in place where a
        // kernel wider than one column makes neighbouring im2col rows share cache lines.
        let direct = self.win[1].k > 1;
        let mb_count = m.div_ceil(MR);
        // The outputs of a block of pixels, all output channels: written to `c` a plane row at a time
        // when the block is done (tile by tile straight into `c`, every store would go to another
        // plane, far apart, and the planes' rows evict each other from the cache).
        const LDB: usize = NR * BLOCK;
        let mut out = vec![0f32; mb_count * MR * LDB];
        let mut block = if direct {
            Vec::new()
        } else {
            vec![0f32; k * LDB]
        };
        let mut tail = vec![0f32; k * NR];
        for oy in y0..y1 {
            let mut ox = 0;
            while ox < wo {
                let nb = LDB.min(wo - ox);
                if !direct {
                    pack::pack_panels(x, c0, &self.win, &self.offs, oy, ox, nb, &mut block);
                }
                let mut kc0 = 0;
                loop {
                    let kc = KC.min(k - kc0);
                    let first = kc0 == 0;
                    for p in 0..nb.div_ceil(NR) {
                        let nv = NR.min(nb - p * NR);
                        // In place, or from the packed block; a row's last, partial panel is packed
                        // alone.
                        let (b, offs) = if !direct {
                            (block[p * k * NR..].as_ptr(), &self.packed)
                        } else if nv == NR {
                            let at = c0 * x.h * x.w + oy * sy * x.w + ox + p * NR;
                            (x.data[at..].as_ptr(), &self.offs)
                        } else {
                            if first {
                                pack::pack_panels(
                                    x,
                                    c0,
                                    &self.win,
                                    &self.offs,
                                    oy,
                                    ox + p * NR,
                                    nv,
                                    &mut tail,
                                );
                            }
                            (tail.as_ptr(), &self.packed)
                        };
                        for mb in 0..mb_count {
                            let ap = a.data[(mb * k + kc0) * MR..].as_ptr();
                            let start = first.then(|| {
                                let mut s = [0f32; MR];
                                if let Init::Bias(v) = init {
                                    let mv = MR.min(m - mb * MR);
                                    s[..mv].copy_from_slice(&v[mb * MR..mb * MR + mv]);
                                }
                                s
                            });
                            // SAFETY: `ap` holds `kc·MR` values; every `b + offs[k]` NR readable ones (a
                            // full row of the window, or a packed panel); `out` MR rows of LDB from here.
                            unsafe {
                                let cp = out.as_mut_ptr().add(mb * MR * LDB + p * NR);
                                kernel(kc, ap, b, offs.as_ptr().add(kc0), cp, LDB, start.as_ref());
                            }
                        }
                    }
                    kc0 += kc;
                    if kc0 >= k {
                        break;
                    }
                }
                for (i, row) in out.chunks_exact(LDB).take(m).enumerate() {
                    // SAFETY: the caller's contract on `c`.
                    unsafe {
                        let cp = c.add(i * ldc + (oy - y0) * wo + ox);
                        std::ptr::copy_nonoverlapping(row.as_ptr(), cp, nb);
                    }
                }
                ox += nb;
            }
        }
    }
}

impl Drop for Rows<'_> {
    /// The phases' copy is as large as the window: handed back for the next superstep's buffers.
    fn drop(&mut self) {
        if let Some(t) = self.phased.take() {
            crate::buffers::give(t.data);
        }
    }
}

/// A valid convolution of `x` (its padding already gathered) to `ho × wo` outputs: `weight` is
/// `[cout][cin/groups][kh][kw]`, `bias` `[cout]`. Bands of output rows are shared among `threads`.
#[allow(clippy::too_many_arguments)]
pub fn conv_valid(
    kernel: Kernel,
    x: &Tensor,
    cout: usize,
    groups: usize,
    win: &[Win; 2],
    weight: &[f32],
    bias: &[f32],
    ho: usize,
    wo: usize,
    threads: usize,
) -> Result<Tensor> {
    let cg = x.c / groups;
    let og = cout / groups;
    let kk = cg * win[0].k * win[1].k;
    // Every element is written: each output starts at its bias.
    let mut out = Tensor::scratch(cout, ho, wo)?;
    if ho == 0 || wo == 0 {
        return Ok(out);
    }
    let packed: Vec<PackedA> = (0..groups)
        .map(|g| PackedA::new(&weight[g * og * kk..], og, kk, kk, 1))
        .collect();
    let rows = Rows::new(x, cg, win)?;
    // A few bands per thread, so that uneven bands even out.
    let band = ho.div_ceil(4 * threads.max(1)).max(1);
    let bands = ho.div_ceil(band);
    let plane = ho * wo;
    let ptr = SendPtr(out.data.as_mut_ptr());
    let _ = stdx::parallel::for_each(0..bands, threads.clamp(1, bands), |b| {
        let y0 = b * band;
        let y1 = (y0 + band).min(ho);
        for (g, a) in packed.iter().enumerate() {
            // SAFETY: band b writes rows y0..y1 of the group's output planes only; `out` outlives the
            // pool.
            unsafe {
                rows.product(
                    a,
                    g * cg,
                    y0,
                    y1,
                    wo,
                    ptr.get().add(g * og * plane + y0 * wo),
                    plane,
                    Init::Bias(&bias[g * og..(g + 1) * og]),
                    kernel,
                );
            }
        }
        Ok::<(), ()>(())
    });
    Ok(out)
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only for disjoint writes (each band its own output rows).
unsafe impl Send for SendPtr {}
// SAFETY: the band workers share it only to copy the pointer out (`get`); each writes through it to its
// own output rows alone, so no two threads touch the same memory.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: &mut u32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 17;
                *seed ^= *seed << 5;
                (*seed as f32 / u32::MAX as f32) - 0.5
            })
            .collect()
    }

    struct Case {
        cin: usize,
        cout: usize,
        groups: usize,
        win: [Win; 2],
        h: usize,
        w: usize,
    }

    fn win(k: usize, stride: usize, dilation: usize) -> Win {
        Win {
            k,
            stride,
            dilation,
        }
    }

    /// Odd sizes, remainders of MR and NR, several KC passes, groups, strides and dilations per axis.
    fn cases() -> Vec<Case> {
        let c = |cin, cout, groups, wy, wx, h, w| Case {
            cin,
            cout,
            groups,
            win: [wy, wx],
            h,
            w,
        };
        vec![
            c(3, 5, 1, win(3, 1, 1), win(3, 1, 1), 9, 40),
            c(4, 13, 1, win(3, 2, 1), win(3, 2, 1), 11, 37),
            c(6, 6, 3, win(3, 1, 2), win(5, 1, 1), 12, 23),
            c(2, 7, 1, win(1, 1, 1), win(1, 1, 1), 3, 17),
            c(1, 1, 1, win(1, 1, 1), win(1, 1, 1), 1, 1),
            c(2, 3, 1, win(7, 1, 1), win(2, 3, 1), 8, 9),
            c(2, 3, 1, win(3, 1, 1), win(5, 4, 1), 6, 41),
            c(3, 2, 1, win(1, 1, 1), win(3, 5, 2), 4, 38),
            // 300 and 576 im2col rows: more than one KC pass.
            c(12, 8, 1, win(5, 1, 1), win(5, 1, 1), 7, 35),
            c(64, 6, 1, win(3, 1, 1), win(3, 1, 1), 4, 20),
        ]
    }

    fn out_len(n: usize, w: &Win) -> usize {
        (n - w.span()) / w.stride + 1
    }

    /// The definition, in f64.
    fn direct(x: &Tensor, c: &Case, weight: &[f32], bias: &[f32]) -> Vec<f64> {
        let (ho, wo) = (out_len(x.h, &c.win[0]), out_len(x.w, &c.win[1]));
        let (cg, og) = (c.cin / c.groups, c.cout / c.groups);
        let (kh, kw) = (c.win[0].k, c.win[1].k);
        let mut out = vec![0f64; c.cout * ho * wo];
        for co in 0..c.cout {
            let g = co / og;
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut s = bias[co] as f64;
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = oy * c.win[0].stride + ky * c.win[0].dilation;
                                let ix = ox * c.win[1].stride + kx * c.win[1].dilation;
                                s += weight[((co * cg + ci) * kh + ky) * kw + kx] as f64
                                    * x.at(g * cg + ci, iy, ix) as f64;
                            }
                        }
                    }
                    out[(co * ho + oy) * wo + ox] = s;
                }
            }
        }
        out
    }

    fn run(
        k: Kernel,
        x: &Tensor,
        c: &Case,
        weight: &[f32],
        bias: &[f32],
        threads: usize,
    ) -> Tensor {
        let (ho, wo) = (out_len(x.h, &c.win[0]), out_len(x.w, &c.win[1]));
        conv_valid(
            k, x, c.cout, c.groups, &c.win, weight, bias, ho, wo, threads,
        )
        .unwrap()
    }

    #[test]
    fn convolutions_match_the_definition_and_every_kernel_gives_the_same_bits() {
        let mut seed = 11;
        for c in cases() {
            let x =
                Tensor::from_vec(c.cin, c.h, c.w, random(c.cin * c.h * c.w, &mut seed)).unwrap();
            let kk = c.cin / c.groups * c.win[0].k * c.win[1].k;
            let weight = random(c.cout * kk, &mut seed);
            let bias = random(c.cout, &mut seed);
            let want = direct(&x, &c, &weight, &bias);
            let reference = run(kernel::portable, &x, &c, &weight, &bias, 1);
            let err = reference
                .data
                .iter()
                .zip(&want)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(err < 1e-5, "{kk} rows: {err}");
            for threads in [1, 3] {
                let got = run(kernel(), &x, &c, &weight, &bias, threads);
                assert!(
                    got.data
                        .iter()
                        .zip(&reference.data)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kk} rows, {threads} threads: the kernels disagree"
                );
            }
        }
    }

    /// A window cut out of the input gives the outputs under it bit for bit, although its pixels fall
    /// at other places of the kernel's panels (read in place in one, packed in the other).
    #[test]
    fn a_window_of_the_input_gives_the_same_bits_as_the_whole() {
        let mut seed = 5;
        for c in cases().into_iter().filter(|c| c.h >= 7 && c.w >= 20) {
            let x =
                Tensor::from_vec(c.cin, c.h, c.w, random(c.cin * c.h * c.w, &mut seed)).unwrap();
            let kk = c.cin / c.groups * c.win[0].k * c.win[1].k;
            let weight = random(c.cout * kk, &mut seed);
            let bias = random(c.cout, &mut seed);
            let whole = run(kernel(), &x, &c, &weight, &bias, 2);
            // Outputs from (1, 3) on: the window starts at input (sy, 3·sx).
            let (sy, sx) = (c.win[0].stride, c.win[1].stride);
            let part = x.crop(sy, x.h, 3 * sx, x.w - 1);
            let got = run(kernel(), &part, &c, &weight, &bias, 1);
            for co in 0..c.cout {
                for oy in 0..got.h {
                    for ox in 0..got.w {
                        assert_eq!(
                            got.at(co, oy, ox).to_bits(),
                            whole.at(co, oy + 1, ox + 3).to_bits(),
                            "channel {co} at ({oy}, {ox})"
                        );
                    }
                }
            }
        }
    }
}
