//! What the loader delivers: a [`Batch`] of samples in one [`Tensor`], with labels and provenance.

use crate::error::Result;
use crate::format::Format;
use crate::memory::HostBuffer;
use crate::sample::{DType, Layout};
use std::time::Duration;
use vocab::{Device, Geometry, Rect};

/// A dense batch tensor `[n, h, w, c]` (NHWC) or `[n, c, h, w]` (NCHW) of `u8`, `f16` or `f32` elements,
/// in host memory or on a CUDA device ([`device`](Tensor::device)).
///
/// Host tensors live in 64-byte-aligned memory that returns to the loader's pool when the tensor is
/// dropped; export them without a copy through [`as_ptr`](Tensor::as_ptr) (DLPack, NumPy). Device tensors
/// are the output of one `l3-cuda` launch ([`cuda`](Tensor::cuda): device pointer, ready event, consumer
/// streams); [`to_host`](Tensor::to_host) copies either kind to host memory.
#[derive(Debug)]
pub struct Tensor {
    memory: Memory,
    shape: [usize; 4],
    layout: Layout,
    dtype: DType,
}

#[derive(Debug)]
enum Memory {
    Host(HostBuffer),
    #[cfg(feature = "gpu")]
    Cuda(Box<l3_cuda::DecodedBatch>),
}

/// Where a batch's tensor or masks live: what [`Tensor`] and [`Masks`] both answer from.
impl Memory {
    fn device(&self) -> Device {
        match self {
            Memory::Host(_) => Device::Cpu,
            #[cfg(feature = "gpu")]
            Memory::Cuda(b) => Device::Cuda(b.device_ordinal()),
        }
    }
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Memory::Host(b) => Some(b.as_slice()),
            #[cfg(feature = "gpu")]
            Memory::Cuda(_) => None,
        }
    }
    fn as_ptr(&self) -> Option<*const u8> {
        match self {
            Memory::Host(b) => Some(b.as_ptr()),
            #[cfg(feature = "gpu")]
            Memory::Cuda(_) => None,
        }
    }
    #[cfg(feature = "gpu")]
    fn cuda(&self) -> Option<&l3_cuda::DecodedBatch> {
        match self {
            Memory::Host(_) => None,
            Memory::Cuda(b) => Some(b),
        }
    }
    fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            Memory::Host(b) => Ok(b.as_slice().to_vec()),
            #[cfg(feature = "gpu")]
            Memory::Cuda(b) => b
                .to_host_bytes()
                .map_err(|e| crate::Error::gpu(Some(format!("device {}", b.device_ordinal())), e)),
        }
    }
}

impl Tensor {
    pub(crate) fn new(buf: HostBuffer, shape: [usize; 4], layout: Layout, dtype: DType) -> Self {
        debug_assert_eq!(
            buf.len(),
            shape.iter().product::<usize>() * dtype.size(),
            "tensor size"
        );
        Tensor {
            memory: Memory::Host(buf),
            shape,
            layout,
            dtype,
        }
    }

    /// A sample batch decoded by `l3-cuda`, left in device memory.
    #[cfg(feature = "gpu")]
    pub(crate) fn on_device(
        batch: Box<l3_cuda::DecodedBatch>,
        layout: Layout,
        dtype: DType,
    ) -> Option<Self> {
        let t = batch.tensor()?;
        (t.layout == layout && t.dtype == dtype).then_some(Tensor {
            shape: t.shape,
            memory: Memory::Cuda(batch),
            layout,
            dtype,
        })
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
    /// Where the elements are: [`Device::Cpu`] (host memory) or [`Device::Cuda`] (that GPU's memory).
    pub fn device(&self) -> Device {
        self.memory.device()
    }
    /// Whether a host tensor lives in page-locked memory (`pin_memory`): a copy to a GPU from it can be
    /// asynchronous. The memory is reused once the tensor is dropped, after the work queued by then on the
    /// device's default stream (such a copy) has finished.
    pub fn is_pinned(&self) -> bool {
        match &self.memory {
            Memory::Host(b) => b.is_pinned(),
            #[cfg(feature = "gpu")]
            Memory::Cuda(_) => false,
        }
    }
    /// Elements in the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes in the tensor.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }
    /// The raw little-endian bytes of a host tensor (`None` on a device: see [`to_host`](Self::to_host)).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.memory.bytes()
    }
    /// The first byte of a host tensor (64-byte aligned): what a zero-copy export hands out.
    pub fn as_ptr(&self) -> Option<*const u8> {
        self.memory.as_ptr()
    }
    /// The device batch behind a CUDA tensor: its device pointer, its ready event, and
    /// [`wait_in`](l3_cuda::DecodedBatch::wait_in) for a consumer's stream.
    #[cfg(feature = "gpu")]
    pub fn cuda(&self) -> Option<&l3_cuda::DecodedBatch> {
        self.memory.cuda()
    }
    /// The raw little-endian bytes in host memory: a copy, and for a device tensor a wait for its decode
    /// and a device-to-host copy.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.memory.to_host()
    }
    /// The elements, if this is a host `u8` tensor.
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.bytes().filter(|_| self.dtype == DType::U8)
    }
    /// The elements, if this is a host `f32` tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.bytes()
            .filter(|_| self.dtype == DType::F32)
            .map(bytemuck::cast_slice)
    }
    /// The elements' IEEE binary16 bit patterns, if this is a host `f16` tensor.
    pub fn as_f16_bits(&self) -> Option<&[u16]> {
        self.bytes()
            .filter(|_| self.dtype == DType::F16)
            .map(bytemuck::cast_slice)
    }
}

/// Host tensors compare by contents; a device tensor equals nothing (compare [`Tensor::to_host`] copies).
impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && self.layout == other.layout
            && self.dtype == other.dtype
            && self.bytes().is_some_and(|a| other.bytes() == Some(a))
    }
}

/// A batch's label maps: `(n, h, w)` values, `u8` or (for 16-bit masks) `u16` little-endian, in
/// 64-byte-aligned host memory recycled like a [`Tensor`]'s, or — with a CUDA device — `u8` in the memory
/// of the GPU that decoded them beside their images ([`cuda`](Masks::cuda)); each follows its sample's
/// geometry exactly.
#[derive(Debug)]
pub struct Masks {
    memory: Memory,
    shape: [usize; 3],
    wide: bool,
}

impl Masks {
    pub(crate) fn new(buf: HostBuffer, shape: [usize; 3], wide: bool) -> Masks {
        debug_assert_eq!(
            buf.len(),
            shape.iter().product::<usize>() * if wide { 2 } else { 1 }
        );
        Masks {
            memory: Memory::Host(buf),
            shape,
            wide,
        }
    }

    /// Label maps decoded by `l3-cuda` (a one-channel `u8` batch), left in device memory.
    #[cfg(feature = "gpu")]
    pub(crate) fn on_device(batch: Box<l3_cuda::DecodedBatch>) -> Option<Masks> {
        let t = batch.tensor()?;
        let (w, h) = t.sample_size();
        (t.dtype == DType::U8 && t.channels() == 1).then_some(Masks {
            shape: [t.shape[0], h as usize, w as usize],
            memory: Memory::Cuda(batch),
            wide: false,
        })
    }
    /// `(n, h, w)`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
    /// Whether values are `u16` (16-bit masks) rather than `u8`.
    pub fn is_wide(&self) -> bool {
        self.wide
    }
    /// Where the values are: [`Device::Cpu`] (host memory) or [`Device::Cuda`] (that GPU's memory).
    pub fn device(&self) -> Device {
        self.memory.device()
    }
    /// The raw little-endian bytes of host masks (`None` on a device: see [`to_host`](Self::to_host)).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.memory.bytes()
    }
    /// The first byte of host masks (64-byte aligned): what a zero-copy export hands out.
    pub fn as_ptr(&self) -> Option<*const u8> {
        self.memory.as_ptr()
    }
    /// The device batch behind masks on a GPU: its device pointer, its ready event, and
    /// [`wait_in`](l3_cuda::DecodedBatch::wait_in) for a consumer's stream.
    #[cfg(feature = "gpu")]
    pub fn cuda(&self) -> Option<&l3_cuda::DecodedBatch> {
        self.memory.cuda()
    }
    /// The raw little-endian bytes in host memory: a copy, and for masks on a device a wait for their
    /// decode and a device-to-host copy.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.memory.to_host()
    }
    /// The values of 8-bit host masks.
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.bytes().filter(|_| !self.wide)
    }
    /// The values of 16-bit host masks.
    pub fn as_u16(&self) -> Option<&[u16]> {
        self.bytes().filter(|_| self.wide).map(bytemuck::cast_slice)
    }
    /// Host mask `i`'s values, widened to `u16`.
    pub fn mask(&self, i: usize) -> Option<Vec<u16>> {
        let n = self.shape[1] * self.shape[2];
        if i >= self.shape[0] {
            return None;
        }
        Some(match self.as_u16() {
            Some(v) => v[i * n..(i + 1) * n].to_vec(),
            None => self.bytes()?[i * n..(i + 1) * n]
                .iter()
                .map(|&v| u16::from(v))
                .collect(),
        })
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
    /// Per sample: where its pixels came from — the source window, the resampling, where it lands and
    /// whether it is mirrored — so that anything else a user holds can be given the same geometry.
    pub geometry: Vec<Geometry>,
    /// Items and stored bytes read from storage for this batch.
    pub disk_items: usize,
    pub disk_bytes: u64,
    /// Items skipped from this batch (dataset index and reason), when skipping is on.
    pub skipped: Vec<(usize, String)>,
    /// How long the consumer waited for this batch.
    pub wait: Duration,
    /// Each sample's label map, when the loader has `masks`.
    pub masks: Option<Masks>,
    /// Each sample's boxes, `[x1, y1, x2, y2]` in output pixels, when the loader has `boxes`.
    pub boxes: Option<Vec<Vec<[f32; 4]>>>,
    /// Each box's category id, beside `boxes`.
    pub box_labels: Option<Vec<Vec<i64>>>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// `[n, h, w, c]` for NHWC or `[n, c, h, w]` for NCHW (`c`: the spec's channels, 3 by default).
    pub fn shape(&self) -> [usize; 4] {
        self.pixels.shape()
    }
    /// Elements per sample.
    pub fn sample_len(&self) -> usize {
        let s = self.shape();
        s[1] * s[2] * s[3]
    }
    /// Per sample, the window in source pixels it shows ([`Geometry::window`]): `batch.windows`.
    pub fn windows(&self) -> Vec<Rect> {
        self.geometry.iter().map(Geometry::window).collect()
    }
    /// Per sample, whether it is mirrored left-right: `batch.flipped`.
    pub fn flipped(&self) -> Vec<bool> {
        self.geometry.iter().map(|g| g.flip).collect()
    }
    /// Per sample, the (height, width) of its valid part (the rest is padding): `batch.sizes`.
    pub fn sizes(&self) -> Vec<(u32, u32)> {
        self.geometry.iter().map(|g| (g.y.len, g.x.len)).collect()
    }
    /// The bytes of sample `i` of a host batch (`None` for a device batch or past the end).
    pub fn sample_bytes(&self, i: usize) -> Option<&[u8]> {
        let n = self.sample_len() * self.pixels.dtype().size();
        self.pixels.bytes()?.get(i * n..(i + 1) * n)
    }
}
