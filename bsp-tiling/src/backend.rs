//! The compute backend: the handful of tensor operations the tiler needs, on activations the backend holds.
//!
//! The tiling logic (`bsp`, `onepass`, `naive`, the whole-image reference in `model`) is written once,
//! generic over [`Backend`]; a backend brings its own activation type ([`Backend::Buf`]: a host [`Tensor`]
//! for the CPU, a device buffer for CUDA) and its own prepared weights ([`Backend::Weights`]). Data crosses
//! between host and backend only through [`Backend::upload`] / [`Backend::download_into`], so a device
//! backend keeps a tile on the device from its window to its normalised output, and the BSP engine can keep
//! whole layers resident there ([`crate::place`]).
//!
//! [`CpuBackend`] is the reference: im2col + GEMM in a fixed summation order ([`crate::gemm`]), split over
//! threads. The host
//! operations it is made of are public functions ([`host`]) so that other host-side backends
//! ([`crate::sim::DeviceSim`]) compute bit for bit the same.

use crate::error::Result;
use crate::meter::Meter;
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

impl Norm {
    /// The per-channel affine map `y = x·scale + shift` that normalising with `stats` amounts to,
    /// computed in f64 and rounded once: every backend applies exactly these two f32 numbers per channel.
    pub fn scale_shift(&self, stats: &[ChannelStats]) -> (Vec<f32>, Vec<f32>) {
        stats
            .iter()
            .enumerate()
            .map(|(c, st)| {
                let inv = 1.0 / (st.variance() + self.eps).sqrt();
                let g = self.gamma[c] as f64;
                (
                    (g * inv) as f32,
                    (self.beta[c] as f64 - st.mean * g * inv) as f32,
                )
            })
            .unzip()
    }
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

/// The operations of the engine. `threads` is how many CPU threads one call may use (a GPU backend
/// ignores it). Every operation returns a `Result`: a device can fail (or run out of its budget) where
/// the CPU cannot.
pub trait Backend: Sync {
    /// A `C×H×W` f32 activation where this backend computes.
    type Buf: Send + Sync;
    /// A convolution's weights prepared for this backend.
    type Weights: Send + Sync;

    fn name(&self) -> String;

    /// Tiles worked on at once when the caller grants `threads` threads (a GPU: one at a time, its
    /// parallelism is inside each call).
    fn concurrency(&self, threads: usize) -> usize {
        threads.max(1)
    }

    /// The meter of a backend whose activations live in their own, budgeted memory (a GPU's); `None` for
    /// the CPU, whose activations are host memory governed by [`crate::Budget`].
    fn meter(&self) -> Option<&Meter> {
        None
    }

    /// Bytes of metered memory [`Backend::weights`] takes for `conv`.
    fn weight_bytes(&self, _conv: &Conv2d) -> u64 {
        0
    }
    /// Bytes of metered scratch one [`Backend::conv2d_valid`] call producing `ho × wo` takes besides its
    /// input and output.
    fn conv_scratch_bytes(&self, _conv: &Conv2d, _ho: usize, _wo: usize) -> u64 {
        0
    }
    /// Bytes of metered scratch a [`Backend::channel_stats`] call on `c` planes of `plane` takes.
    fn stats_scratch_bytes(&self, _c: usize, _plane: usize) -> u64 {
        0
    }
    /// Bytes of metered scratch a [`Backend::gather`] call with `ny + nx` indices takes besides its output.
    fn gather_scratch_bytes(&self, _ny: usize, _nx: usize) -> u64 {
        0
    }
    /// Bytes of metered scratch a [`Backend::normalize`] call on `c` channels takes.
    fn norm_scratch_bytes(&self, _c: usize) -> u64 {
        0
    }

    /// Prepares a convolution's weights (uploads them, converts them).
    fn weights(&self, conv: &Conv2d) -> Result<Self::Weights>;

    /// `(c, h, w)` of an activation.
    fn dims(&self, x: &Self::Buf) -> (usize, usize, usize);

    /// A host tensor into the backend.
    fn upload(&self, t: Tensor) -> Result<Self::Buf>;
    /// An activation back to the host, into `out` (`c·h·w` values).
    fn download_into(&self, x: &Self::Buf, out: &mut [f32]) -> Result<()>;
    /// An activation back to the host as a tensor.
    fn download(&self, x: Self::Buf) -> Result<Tensor> {
        let (c, h, w) = self.dims(&x);
        let mut t = Tensor::zeros(c, h, w);
        self.download_into(&x, &mut t.data)?;
        Ok(t)
    }
    /// A zero-filled activation (a resident layer before its tiles are written).
    fn zeros(&self, c: usize, h: usize, w: usize) -> Result<Self::Buf>;

    /// Cross-correlation without padding (PyTorch `Conv2d(padding=0)`): output `(h-k)/s+1 × (w-k)/s+1`.
    fn conv2d_valid(
        &self,
        x: &Self::Buf,
        conv: &Conv2d,
        weights: &Self::Weights,
        threads: usize,
    ) -> Result<Self::Buf>;

    /// Nearest-neighbour upsampling by 2 (`F.interpolate(scale_factor=2, mode="nearest")`).
    fn upsample_nearest2x(&self, x: &Self::Buf) -> Result<Self::Buf>;

    /// Pads with the given mode (PyTorch's `ZeroPad2d`, `ReplicationPad2d`, `ReflectionPad2d`, circular).
    fn pad(&self, x: &Self::Buf, pad: Pad, mode: PaddingMode) -> Result<Self::Buf>;

    /// The window at rows `ys` × columns `xs` of `x` (`None` = zero): a tile's input window from a
    /// resident layer, or a crop.
    fn gather(
        &self,
        x: &Self::Buf,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
    ) -> Result<Self::Buf>;

    /// Writes `src` into `dst` with its top-left corner at `(y0, x0)`; `src` must fit inside `dst`.
    fn paste(&self, dst: &mut Self::Buf, y0: usize, x0: usize, src: &Self::Buf) -> Result<()>;

    /// Per-channel (count, mean, M2).
    fn channel_stats(&self, x: &Self::Buf) -> Result<Vec<ChannelStats>>;

    /// `y = (x - mean) / sqrt(var + eps) * gamma + beta` with the given statistics, then ReLU if asked:
    /// [`Norm::scale_shift`] applied per channel.
    fn normalize(
        &self,
        x: &mut Self::Buf,
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
    ) -> Result<()>;

    fn relu(&self, x: &mut Self::Buf) -> Result<()>;

    /// `x += y` (the residual connection).
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;

    /// [`Backend::normalize`] and then the residual add on a `c × h × w` tile held in host memory, in
    /// place: the second half of a superstep for layers stored on the host. The default uploads,
    /// computes and downloads; the CPU works on the slice directly.
    #[allow(clippy::too_many_arguments)]
    fn normalize_host(
        &self,
        x: &mut [f32],
        (c, h, w): (usize, usize, usize),
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
        residual: Option<&[f32]>,
    ) -> Result<()> {
        let mut b = self.upload(Tensor::from_vec(c, h, w, x.to_vec())?)?;
        self.normalize(&mut b, stats, norm, relu)?;
        if let Some(r) = residual {
            let r = self.upload(Tensor::from_vec(c, h, w, r.to_vec())?)?;
            self.add(&mut b, &r)?;
        }
        self.download_into(&b, x)
    }
}

/// The host operations, on [`Tensor`]s: what [`CpuBackend`] is made of.
pub mod host {
    use super::{Conv2d, Norm, Pad};
    use crate::field::Region;
    use crate::padding::PaddingMode;
    use crate::stats::ChannelStats;
    use crate::tensor::Tensor;

    /// Valid convolution ([`crate::gemm`]: im2col into packed panels, products in a fixed order), bands
    /// of output rows shared among `threads` workers of the workspace pool.
    pub fn conv2d_valid(x: &Tensor, conv: &Conv2d, threads: usize) -> Tensor {
        let (k, s) = (conv.k, conv.stride);
        assert!(
            x.c == conv.cin && x.h >= k && x.w >= k,
            "conv2d_valid: bad input shape"
        );
        let ho = (x.h - k) / s + 1;
        let wo = (x.w - k) / s + 1;
        let win = crate::win::Win {
            k,
            stride: s,
            dilation: 1,
        };
        crate::gemm::conv_valid(
            crate::gemm::kernel(),
            x,
            conv.cout,
            1,
            &[win; 2],
            &conv.weight,
            &conv.bias,
            ho,
            wo,
            threads,
        )
    }

    /// Column matrix `[cin·k·k, (y1-y0)·wo]` for output rows `y0..y1` of a valid `k × k` convolution with
    /// stride `s`: row `(c·k + ky)·k + kx`, column `(y - y0)·wo + x` holds input `(c, y·s + ky, x·s + kx)`.
    /// `col` grows to fit (and is never shrunk or cleared). The row-major layout a device GEMM reads; the
    /// host packs its columns itself ([`crate::gemm::im2col_panels`]).
    pub fn im2col(
        x: &Tensor,
        k: usize,
        s: usize,
        y0: usize,
        y1: usize,
        wo: usize,
        col: &mut Vec<f32>,
    ) {
        let n = (y1 - y0) * wo;
        // Every element is overwritten below: only grow, never clear.
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

    pub fn upsample_nearest2x(x: &Tensor) -> Tensor {
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

    pub fn pad(x: &Tensor, pad: Pad, mode: PaddingMode) -> Tensor {
        let ys: Vec<Option<usize>> = (0..x.h + pad.top + pad.bottom)
            .map(|y| mode.map(y as isize - pad.top as isize, x.h))
            .collect();
        let xs: Vec<Option<usize>> = (0..x.w + pad.left + pad.right)
            .map(|v| mode.map(v as isize - pad.left as isize, x.w))
            .collect();
        gather(x, &ys, &xs)
    }

    /// The window of `x` at rows `ys` × columns `xs` (`None` = zero).
    pub fn gather(x: &Tensor, ys: &[Option<usize>], xs: &[Option<usize>]) -> Tensor {
        let mut out = Tensor::zeros(x.c, ys.len(), xs.len());
        let r = Region { t: x, y0: 0, x0: 0 };
        // In-memory: cannot fail.
        let _ = crate::field::Field::gather(&r, ys, xs, &mut out.data);
        out
    }

    pub fn channel_stats(x: &Tensor) -> Vec<ChannelStats> {
        (0..x.c).map(|c| ChannelStats::of(x.plane(c))).collect()
    }

    /// Normalises `x` (planes of `plane` values) in place, then ReLU if asked.
    pub fn normalize(x: &mut [f32], plane: usize, stats: &[ChannelStats], norm: &Norm, relu: bool) {
        let (scale, shift) = norm.scale_shift(stats);
        for (c, chunk) in x.chunks_mut(plane.max(1)).enumerate() {
            let (a, b) = (scale[c], shift[c]);
            if relu {
                chunk.iter_mut().for_each(|v| *v = (*v * a + b).max(0.0));
            } else {
                chunk.iter_mut().for_each(|v| *v = *v * a + b);
            }
        }
    }

    pub fn relu(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = v.max(0.0));
    }

    pub fn add(x: &mut [f32], y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }
}

/// im2col + GEMM on the CPU: the reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Buf = Tensor;
    type Weights = ();

    fn name(&self) -> String {
        "cpu (im2col + packed GEMM)".into()
    }

    fn weights(&self, _conv: &Conv2d) -> Result<()> {
        Ok(())
    }

    fn dims(&self, x: &Tensor) -> (usize, usize, usize) {
        (x.c, x.h, x.w)
    }

    fn upload(&self, t: Tensor) -> Result<Tensor> {
        Ok(t)
    }

    fn download_into(&self, x: &Tensor, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&x.data);
        Ok(())
    }

    fn download(&self, x: Tensor) -> Result<Tensor> {
        Ok(x)
    }

    fn zeros(&self, c: usize, h: usize, w: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(c, h, w))
    }

    fn conv2d_valid(&self, x: &Tensor, conv: &Conv2d, _w: &(), threads: usize) -> Result<Tensor> {
        Ok(host::conv2d_valid(x, conv, threads))
    }

    fn upsample_nearest2x(&self, x: &Tensor) -> Result<Tensor> {
        Ok(host::upsample_nearest2x(x))
    }

    fn pad(&self, x: &Tensor, pad: Pad, mode: PaddingMode) -> Result<Tensor> {
        Ok(host::pad(x, pad, mode))
    }

    fn gather(&self, x: &Tensor, ys: &[Option<usize>], xs: &[Option<usize>]) -> Result<Tensor> {
        Ok(host::gather(x, ys, xs))
    }

    fn paste(&self, dst: &mut Tensor, y0: usize, x0: usize, src: &Tensor) -> Result<()> {
        dst.paste(y0, x0, src);
        Ok(())
    }

    fn channel_stats(&self, x: &Tensor) -> Result<Vec<ChannelStats>> {
        Ok(host::channel_stats(x))
    }

    fn normalize(
        &self,
        x: &mut Tensor,
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
    ) -> Result<()> {
        let plane = x.h * x.w;
        host::normalize(&mut x.data, plane, stats, norm, relu);
        Ok(())
    }

    fn relu(&self, x: &mut Tensor) -> Result<()> {
        host::relu(&mut x.data);
        Ok(())
    }

    fn add(&self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        host::add(&mut x.data, &y.data);
        Ok(())
    }

    fn normalize_host(
        &self,
        x: &mut [f32],
        (_, h, w): (usize, usize, usize),
        stats: &[ChannelStats],
        norm: &Norm,
        relu: bool,
        residual: Option<&[f32]>,
    ) -> Result<()> {
        host::normalize(x, h * w, stats, norm, relu);
        if let Some(r) = residual {
            host::add(x, r);
        }
        Ok(())
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
            // Several bands (2 MiB of columns per 100-row band would be more than BAND_BYTES).
            (9, 1, 3, 4, 700, 90),
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
                let got = CpuBackend.conv2d_valid(&x, &conv, &(), threads).unwrap();
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
        let p = CpuBackend
            .pad(
                &x,
                Pad {
                    top: 1,
                    bottom: 0,
                    left: 2,
                    right: 1,
                },
                PaddingMode::Reflect,
            )
            .unwrap();
        assert_eq!((p.h, p.w), (3, 6));
        assert_eq!(&p.data[..6], &[6., 5., 4., 5., 6., 5.]);
        assert_eq!(&p.data[6..12], &[3., 2., 1., 2., 3., 2.]);
        let u = CpuBackend.upsample_nearest2x(&x).unwrap();
        assert_eq!((u.h, u.w), (4, 6));
        assert_eq!(&u.data[..6], &[1., 1., 2., 2., 3., 3.]);
        assert_eq!(&u.data[18..24], &[4., 4., 5., 5., 6., 6.]);
    }

    #[test]
    fn scale_shift_is_the_normalisation() {
        let v = [1.0f32, 2.0, 4.0, 9.0];
        let st = [ChannelStats::of(&v)];
        let norm = Norm {
            gamma: vec![2.0],
            beta: vec![0.5],
            eps: 1e-5,
        };
        let mut x = Tensor::from_vec(1, 2, 2, v.to_vec()).unwrap();
        CpuBackend.normalize(&mut x, &st, &norm, false).unwrap();
        let sd = (st[0].variance() + 1e-5).sqrt();
        for (got, v) in x.data.iter().zip(v) {
            let want = (v as f64 - st[0].mean) / sd * 2.0 + 0.5;
            assert!((*got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        }
    }
}
