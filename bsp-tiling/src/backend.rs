//! The compute backend: the handful of tensor operations the tiler needs, behind one trait.
//!
//! The tiling logic (`bsp`, `onepass`, `naive`) only calls these methods, so a GPU backend (cudarc + cuBLAS:
//! an im2col kernel and `cublasSgemm` for `conv2d_valid`, trivial kernels for the rest) plugs in without
//! touching it. [`CpuBackend`] is im2col + `matrixmultiply`'s SGEMM, split over threads.

use crate::padding::PaddingMode;
use crate::stats::ChannelStats;
use crate::tensor::Tensor;

/// A 2-D convolution's parameters, PyTorch layout: weight `[cout, cin, k, k]`, bias `[cout]`.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// Affine normalisation parameters (`InstanceNorm2d(affine=True)` / `BatchNorm2d`).
#[derive(Clone, Debug)]
pub struct Norm {
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
    pub eps: f64,
}

/// Pixels of padding on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pad {
    pub top: usize,
    pub bottom: usize,
    pub left: usize,
    pub right: usize,
}

impl Pad {
    pub fn all(p: usize) -> Pad {
        Pad {
            top: p,
            bottom: p,
            left: p,
            right: p,
        }
    }
}

/// The operations of the engine. `threads` is how many CPU threads one call may use (a GPU backend ignores it).
pub trait Backend: Sync {
    fn name(&self) -> String;

    /// Cross-correlation without padding (PyTorch `Conv2d(padding=0)`): output `(h-k)/s+1 × (w-k)/s+1`.
    fn conv2d_valid(&self, x: &Tensor, conv: &Conv2d, threads: usize) -> Tensor;

    /// Nearest-neighbour upsampling by 2 (`F.interpolate(scale_factor=2, mode="nearest")`).
    fn upsample_nearest2x(&self, x: &Tensor) -> Tensor {
        let mut out = Tensor::zeros(x.c, 2 * x.h, 2 * x.w);
        for c in 0..x.c {
            let p = x.plane(c);
            for y in 0..2 * x.h {
                let row = &p[(y / 2) * x.w..(y / 2 + 1) * x.w];
                let d = (c * out.h + y) * out.w;
                for (xo, o) in out.data[d..d + out.w].iter_mut().enumerate() {
                    *o = row[xo / 2];
                }
            }
        }
        out
    }

    /// Pads with the given mode (PyTorch's `ZeroPad2d`, `ReplicationPad2d`, `ReflectionPad2d`, circular).
    fn pad(&self, x: &Tensor, pad: Pad, mode: PaddingMode) -> Tensor {
        let (h, w) = (x.h + pad.top + pad.bottom, x.w + pad.left + pad.right);
        let ys: Vec<Option<usize>> = (0..h)
            .map(|y| mode.map(y as isize - pad.top as isize, x.h))
            .collect();
        let xs: Vec<Option<usize>> = (0..w)
            .map(|v| mode.map(v as isize - pad.left as isize, x.w))
            .collect();
        let mut out = Tensor::zeros(x.c, h, w);
        for c in 0..x.c {
            let p = x.plane(c);
            for (yo, sy) in ys.iter().enumerate() {
                let Some(sy) = sy else { continue };
                let row = &p[sy * x.w..(sy + 1) * x.w];
                let d = (c * h + yo) * w;
                for (o, sx) in out.data[d..d + w].iter_mut().zip(&xs) {
                    if let Some(sx) = sx {
                        *o = row[*sx];
                    }
                }
            }
        }
        out
    }

    /// Per-channel (count, mean, M2).
    fn channel_stats(&self, x: &Tensor) -> Vec<ChannelStats> {
        (0..x.c).map(|c| ChannelStats::of(x.plane(c))).collect()
    }

    /// `y = (x - mean) / sqrt(var + eps) * gamma + beta` with the given statistics, then ReLU if asked.
    fn normalize(
        &self,
        x: &mut [f32],
        plane: usize,
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
    ) {
        for (c, chunk) in x.chunks_mut(plane).enumerate() {
            let inv = 1.0 / (stats[c].variance() + norm.eps).sqrt();
            let scale = (norm.gamma[c] as f64 * inv) as f32;
            let shift = (norm.beta[c] as f64 - stats[c].mean * norm.gamma[c] as f64 * inv) as f32;
            if relu {
                chunk
                    .iter_mut()
                    .for_each(|v| *v = (*v * scale + shift).max(0.0));
            } else {
                chunk.iter_mut().for_each(|v| *v = *v * scale + shift);
            }
        }
    }

    fn relu(&self, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = v.max(0.0));
    }

    /// `x += y` (the residual connection).
    fn add(&self, x: &mut [f32], y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }
}

/// im2col + SGEMM on the CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// im2col buffers are built for bands of output rows of about this many bytes, so that a whole-image
/// convolution never materialises the `k²·cin`-times larger column matrix.
const BAND_BYTES: usize = 4 << 20;

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu (im2col + matrixmultiply sgemm)".into()
    }

    fn conv2d_valid(&self, x: &Tensor, conv: &Conv2d, threads: usize) -> Tensor {
        let (k, s) = (conv.k, conv.stride);
        assert!(
            x.c == conv.cin && x.h >= k && x.w >= k,
            "conv2d_valid: bad input shape"
        );
        let ho = (x.h - k) / s + 1;
        let wo = (x.w - k) / s + 1;
        let kk = conv.cin * k * k;
        let mut out = Tensor::zeros(conv.cout, ho, wo);
        let rows_per_band = (BAND_BYTES / (kk * wo * 4).max(1)).clamp(1, ho);
        let bands = ho.div_ceil(rows_per_band);
        let threads = threads.clamp(1, bands);
        let plane = ho * wo;
        // Each band writes a disjoint set of output rows in every channel plane.
        let out_ptr = SendPtr(out.data.as_mut_ptr());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || {
            let mut col = Vec::new();
            loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if b >= bands {
                    break;
                }
                let y0 = b * rows_per_band;
                let y1 = (y0 + rows_per_band).min(ho);
                let n = (y1 - y0) * wo;
                im2col(x, k, s, y0, y1, wo, &mut col);
                // SAFETY: band b owns rows y0..y1 of every output plane; the bias pass and the GEMM
                // below touch only those rows, and `out` outlives the scope.
                unsafe {
                    let base = out_ptr.get().add(y0 * wo);
                    for co in 0..conv.cout {
                        let row = std::slice::from_raw_parts_mut(base.add(co * plane), n);
                        row.fill(conv.bias[co]);
                    }
                    matrixmultiply::sgemm(
                        conv.cout,
                        kk,
                        n,
                        1.0,
                        conv.weight.as_ptr(),
                        kk as isize,
                        1,
                        col.as_ptr(),
                        n as isize,
                        1,
                        1.0,
                        base,
                        plane as isize,
                        1,
                    );
                }
            }
        };
        if threads == 1 {
            work();
        } else {
            std::thread::scope(|sc| {
                for _ in 0..threads {
                    sc.spawn(work);
                }
            });
        }
        out
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only for disjoint writes, see `conv2d_valid`.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Column matrix `[cin·k·k, (y1-y0)·wo]` for output rows `y0..y1`.
fn im2col(x: &Tensor, k: usize, s: usize, y0: usize, y1: usize, wo: usize, col: &mut Vec<f32>) {
    let n = (y1 - y0) * wo;
    // Every element is overwritten below: only grow, never clear (zeroing showed up in profiles).
    if col.len() < x.c * k * k * n {
        col.resize(x.c * k * k * n, 0.0);
    }
    let mut r = 0;
    for c in 0..x.c {
        let p = x.plane(c);
        for ky in 0..k {
            for kx in 0..k {
                let dst = &mut col[r * n..(r + 1) * n];
                for (i, y) in (y0..y1).enumerate() {
                    let src = &p[(y * s + ky) * x.w + kx..];
                    let d = &mut dst[i * wo..(i + 1) * wo];
                    if s == 1 {
                        d.copy_from_slice(&src[..wo]);
                    } else {
                        for (xo, v) in d.iter_mut().enumerate() {
                            *v = src[xo * s];
                        }
                    }
                }
                r += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct convolution, the definition, for checking im2col + GEMM.
    fn direct(x: &Tensor, c: &Conv2d) -> Tensor {
        let ho = (x.h - c.k) / c.stride + 1;
        let wo = (x.w - c.k) / c.stride + 1;
        let mut out = Tensor::zeros(c.cout, ho, wo);
        for co in 0..c.cout {
            for y in 0..ho {
                for xo in 0..wo {
                    let mut acc = c.bias[co] as f64;
                    for ci in 0..c.cin {
                        for ky in 0..c.k {
                            for kx in 0..c.k {
                                acc += c.weight[((co * c.cin + ci) * c.k + ky) * c.k + kx] as f64
                                    * x.at(ci, y * c.stride + ky, xo * c.stride + kx) as f64;
                            }
                        }
                    }
                    out.data[(co * ho + y) * wo + xo] = acc as f32;
                }
            }
        }
        out
    }

    #[test]
    fn im2col_gemm_matches_direct() {
        let mut seed = 7u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) - 0.5
        };
        for (k, s, cin, cout, h, w) in [
            (3, 1, 4, 5, 9, 11),
            (3, 2, 3, 2, 10, 7),
            (5, 2, 2, 3, 12, 13),
            (1, 1, 3, 4, 4, 5),
        ] {
            let x = Tensor::from_vec(cin, h, w, (0..cin * h * w).map(|_| rnd()).collect()).unwrap();
            let conv = Conv2d {
                cin,
                cout,
                k,
                stride: s,
                weight: (0..cout * cin * k * k).map(|_| rnd()).collect(),
                bias: (0..cout).map(|_| rnd()).collect(),
            };
            let want = direct(&x, &conv);
            for threads in [1, 3] {
                let got = CpuBackend.conv2d_valid(&x, &conv, threads);
                assert_eq!((got.c, got.h, got.w), (want.c, want.h, want.w));
                let err = got
                    .data
                    .iter()
                    .zip(&want.data)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(err < 1e-5, "k{k} s{s}: {err}");
            }
        }
    }

    #[test]
    fn pad_and_upsample() {
        let x = Tensor::from_vec(1, 2, 3, vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let p = CpuBackend.pad(
            &x,
            Pad {
                top: 1,
                bottom: 0,
                left: 2,
                right: 1,
            },
            PaddingMode::Reflect,
        );
        assert_eq!((p.h, p.w), (3, 6));
        assert_eq!(&p.data[..6], &[6., 5., 4., 5., 6., 5.]);
        assert_eq!(&p.data[6..12], &[3., 2., 1., 2., 3., 2.]);
        let u = CpuBackend.upsample_nearest2x(&x);
        assert_eq!((u.h, u.w), (4, 6));
        assert_eq!(&u.data[..6], &[1., 1., 2., 2., 3., 3.]);
        assert_eq!(&u.data[18..24], &[4., 4., 5., 5., 6., 6.]);
    }
}
