//! A sliding window's geometry along one axis (kernel size, stride, dilation): what the convolution's
//! GEMM packers (`gemm`) and the graph engine's ops (`graph::ops`) both describe windows with. A leaf,
//! so that neither has to import the other for it.

/// A convolution's (or pooling's) geometry along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Win {
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
}

impl Win {
    /// The kernel's extent in input pixels.
    pub fn span(&self) -> usize {
        self.dilation * (self.k - 1) + 1
    }
}
