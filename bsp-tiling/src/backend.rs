//! The parameters the TransformerNet's stages are made of ([`Conv2d`], [`Norm`]), and [`CpuBackend`], the
//! reference backend of the graph engine: im2col + GEMM in a fixed summation order ([`crate::gemm`]),
//! split over threads (its [`crate::GraphOps`] implementation is `graph::exec`'s).

use crate::stats::ChannelStats;

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

/// im2col + GEMM on the CPU: the reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;
