//! What the loader delivers: a [`Batch`] of samples in one [`Tensor`], with labels and provenance.

use crate::format::Format;
use crate::pipeline::buffer::HostBuffer;
use crate::sample::{DType, Layout};
use std::time::Duration;

/// A dense batch tensor `[n, h, w, 3]` (NHWC) or `[n, 3, h, w]` (NCHW) of `u8`, `f16` or `f32` elements.
///
/// Host tensors live in 64-byte-aligned memory that returns to the loader's pool when the tensor is
/// dropped; export them without a copy through [`as_ptr`](Tensor::as_ptr) (DLPack, NumPy).
#[derive(Debug)]
pub struct Tensor {
    buf: HostBuffer,
    shape: [usize; 4],
    layout: Layout,
    dtype: DType,
}

impl Tensor {
    pub(crate) fn new(buf: HostBuffer, shape: [usize; 4], layout: Layout, dtype: DType) -> Self {
        debug_assert_eq!(
            buf.len(),
            shape.iter().product::<usize>() * dtype.size(),
            "tensor size"
        );
        Tensor {
            buf,
            shape,
            layout,
            dtype,
        }
    }

    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
    /// The first byte (64-byte aligned): what a zero-copy export hands out.
    pub fn as_ptr(&self) -> *const u8 {
        self.buf.as_ptr()
    }
    /// The elements, if this is a `u8` tensor.
    pub fn as_u8(&self) -> Option<&[u8]> {
        (self.dtype == DType::U8).then(|| self.bytes())
    }
    /// The elements, if this is an `f32` tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        (self.dtype == DType::F32).then(|| bytemuck::cast_slice(self.bytes()))
    }
    /// The elements' IEEE binary16 bit patterns, if this is an `f16` tensor.
    pub fn as_f16_bits(&self) -> Option<&[u16]> {
        (self.dtype == DType::F16).then(|| bytemuck::cast_slice(self.bytes()))
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && self.layout == other.layout
            && self.dtype == other.dtype
            && self.bytes() == other.bytes()
    }
}

/// One delivered batch: the samples plus, per sample, its label, dataset index and format.
#[derive(Debug)]
pub struct Batch {
    pub epoch: usize,
    /// Position of this batch within its epoch.
    pub index: usize,
    pub pixels: Tensor,
    pub labels: Vec<u32>,
    /// Dataset indices of the samples, in buffer order.
    pub ids: Vec<usize>,
    pub formats: Vec<Format>,
    /// Per sample: whether its bytes stayed in memory from the previous epoch ([`crate::Order::Liquid`]'s
    /// shuffle buffers); always `false` under [`crate::Order::Seeded`].
    pub cached: Vec<bool>,
    /// Items and stored bytes read from storage for this batch.
    pub disk_items: usize,
    pub disk_bytes: u64,
    /// Items skipped from this batch (dataset index and reason), when skipping is on.
    pub skipped: Vec<(usize, String)>,
    /// How long the consumer waited for this batch.
    pub wait: Duration,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// `[n, h, w, 3]` for NHWC or `[n, 3, h, w]` for NCHW.
    pub fn shape(&self) -> [usize; 4] {
        self.pixels.shape()
    }
    /// Elements per sample.
    pub fn sample_len(&self) -> usize {
        let s = self.shape();
        s[1] * s[2] * s[3]
    }
    /// The bytes of sample `i`.
    pub fn sample_bytes(&self, i: usize) -> &[u8] {
        let n = self.sample_len() * self.pixels.dtype().size();
        &self.pixels.bytes()[i * n..(i + 1) * n]
    }
}
