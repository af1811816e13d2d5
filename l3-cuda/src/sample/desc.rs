//! A sample batch's plan ([`SamplePlan`]) and the tables its launch reads: one descriptor per (channel, patch) under a window, one per padding
//! block, and the copies that build the device input. The descriptors are `#[repr(C)]` plain-old-data
//! laid out exactly as kernel.cu's structs, so their bytes are what the kernel reads.

use crate::layout::TensorInfo;
use crate::resample::ResampleStage;
use crate::v2::V2Batch;
use l3_format::Rect;
use std::ops::Range;

/// One patch of one channel under a window: the kernel's unit of work (one thread block), laid out exactly
/// as `struct SampleDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct SampleDesc {
    pub data_offset: u64,
    /// Output element of patch pixel (col0, skip) in output channel `channel`.
    pub out_offset: u64,
    pub data_len: u32,
    pub row_stride: i32,
    /// Negative when the sample is mirrored.
    pub col_stride: i32,
    pub copy_stride: u32,
    pub w: u16,
    pub rows: u16,
    pub skip: u16,
    pub col0: u16,
    pub col1: u16,
    pub channel: u8,
    pub copies: u8,
    /// 1 when `rows` reaches the patch's last row: then the rows must use the patch's bytes exactly, as
    /// `l3-format`'s region decoder checks for a window that reaches a patch's bottom.
    pub exact: u8,
    pub pad: [u8; 3],
}

pub(crate) const SAMPLE_DESC_BYTES: usize = std::mem::size_of::<SampleDesc>();
const _: () = assert!(SAMPLE_DESC_BYTES == 48);

/// The padding of sample rows `[y0, y1)` around the window `(dx, dy, w, h)`: one thread block.
/// Laid out exactly as `struct FillDesc` in kernel.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct FillDesc {
    pub out_offset: u64,
    pub y0: u32,
    pub y1: u32,
    pub dx: u32,
    pub dy: u32,
    pub w: u32,
    pub h: u32,
    pub fill: u32,
    pub pad: u32,
}

pub(crate) const FILL_DESC_BYTES: usize = std::mem::size_of::<FillDesc>();
const _: () = assert!(FILL_DESC_BYTES == 40);

/// Output elements one padding block writes at most (whole rows; at least one row).
pub(super) const FILL_ELEMS_PER_BLOCK: usize = 16 * 1024;

/// Bytes `file` of source `sample` are copied to byte `at` of the device input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopyRun {
    pub sample: usize,
    pub file: Range<u64>,
    pub at: usize,
}

/// A validated batch of samples, ready to copy and launch.
#[derive(Debug, Clone)]
pub struct SamplePlan {
    pub(crate) tensor: TensorInfo,
    pub(crate) descs: Vec<SampleDesc>,
    /// Per descriptor: (sample, channel, patch), to name a patch the kernel rejects.
    pub(crate) ids: Vec<(u32, u8, u32)>,
    pub(crate) fills: Vec<FillDesc>,
    pub(crate) copies: Vec<CopyRun>,
    /// Per sample: the file length of its source.
    pub(crate) file_lens: Vec<u64>,
    /// Per sample: the image rectangle it decodes.
    pub(crate) rects: Vec<Rect>,
    pub(crate) data_len: usize,
    pub(crate) block_dim: u32,
    pub(crate) stage_cap: u32,
    /// (scale, bias) for output channels 0..3 (and an unused fourth pair).
    pub(crate) scale_bias: [f32; 8],
    /// Version-2 sources' patches (one descriptor per patch under a window), decoded by the blocks after
    /// the version-1 ones.
    pub(crate) v2: V2Batch,
    /// A resampled batch: the passes after the decode, which then writes the intermediate `tensor`.
    pub(crate) resample: Option<Box<ResampleStage>>,
}

impl SamplePlan {
    /// The descriptor table as the kernel reads it (`struct SampleDesc`).
    pub(crate) fn descriptor_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.descs)
    }

    /// The padding table as the kernel reads it (`struct FillDesc`).
    pub(crate) fn fill_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.fills)
    }
}
