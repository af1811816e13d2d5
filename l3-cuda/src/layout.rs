//! What every kind of batch shares about its output and its launch, and plans nothing itself: the shape of
//! the output tensor ([`TensorInfo`]), how a sample batch is shaped ([`SampleOptions`]), the normalisation
//! the kernels fuse in (`scale_bias_for`), the threads per block and the v1 blocks of a launch. A leaf:
//! `plan`, `sample` and `resample` all use it, and it uses none of them.

use crate::error::Error;
use vocab::{DType, Layout, Normalize};

/// How a batch of samples is shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// Sample width and height in pixels.
    pub width: u32,
    pub height: u32,
    /// Channels per pixel, the CPU loader's `channels`: 3 (RGB: gray copied, alpha dropped), 1 (luma,
    /// Pillow's `L` of an RGB or RGBA image, taken before any resampling; a gray image as is — also
    /// what a one-channel label map needs) or 4 (RGBA: alpha 255 for an image without it). Batches of
    /// 1 or 4 channels are always made by the resampling kernels (a window is a resampling that copies).
    pub channels: u8,
    pub layout: Layout,
    pub dtype: DType,
    /// Only for the float types; float samples without it hold pixel / 255.
    pub normalize: Option<Normalize>,
    /// The pixel value of the padding (every channel), normalised like any pixel in float batches: the
    /// CPU loader's `fill`.
    pub fill: u8,
    /// Walk the row headers the decode will read on the host, for every channel of every patch under each
    /// window (alpha included), so corrupt rows are rejected with their batch index before any GPU work:
    /// exactly what [`L3File::decode_region`] / [`L3Index::decode_region`] reject for the window. A
    /// version-2 file with entry CRCs is checked by its CRCs instead (always, this option or not); one
    /// without is decoded on the host. Off by
    /// default: the kernel bounds every read anyway and reports a corrupt patch after the decode
    /// ([`Error::CorruptRows`]); it never reads alpha, so without this a corrupt alpha plane goes unnoticed.
    pub check_rows_on_host: bool,
}

impl SampleOptions {
    /// `width`×`height` samples, NCHW `u8`.
    pub fn new(width: u32, height: u32) -> Self {
        SampleOptions {
            width,
            height,
            channels: 3,
            layout: Layout::Nchw,
            dtype: DType::U8,
            normalize: None,
            fill: 0,
            check_rows_on_host: false,
        }
    }
}

/// Shape of a dense batch tensor, as a DLPack exporter needs it: dimensions and strides (in elements) in
/// memory order of `layout` (`[n, h, w, c]` for NHWC, `[n, c, h, w]` for NCHW), C-contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo {
    pub layout: Layout,
    pub dtype: DType,
    pub shape: [usize; 4],
    pub strides: [usize; 4],
}

impl TensorInfo {
    /// A contiguous `n`×`h`×`w`×`c` tensor in `layout`.
    pub fn dense(layout: Layout, dtype: DType, n: usize, h: usize, w: usize, c: usize) -> Self {
        let shape = match layout {
            Layout::Nhwc => [n, h, w, c],
            Layout::Nchw => [n, c, h, w],
        };
        let mut strides = [1usize; 4];
        for i in (0..3).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        TensorInfo {
            layout,
            dtype,
            shape,
            strides,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Channels per pixel.
    pub fn channels(&self) -> usize {
        match self.layout {
            Layout::Nhwc => self.shape[3],
            Layout::Nchw => self.shape[1],
        }
    }

    /// Width and height of one sample (or image) of the tensor.
    pub fn sample_size(&self) -> (u32, u32) {
        match self.layout {
            Layout::Nhwc => (self.shape[2] as u32, self.shape[1] as u32),
            Layout::Nchw => (self.shape[3] as u32, self.shape[2] as u32),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

/// The kernels' `stage_cap` argument: the largest patch of a batch, at most 16 KiB. The v1 kernel used to
/// stage patches up to this size in shared memory; it now reads them through L1 and ignores the argument,
/// which stays for the launch's argument order.
pub(crate) const STAGE_CAP: u32 = 16 * 1024;

/// Threads per block of a version-1 launch: the widest version-1 patch rounded up to a warp (a thread per
/// pixel of a row).
pub(crate) fn block_dim(max_v1_width: u32) -> u32 {
    max_v1_width.div_ceil(32).clamp(1, 8) * 32
}

/// Blocks of a launch that decode its `n_descs` version-1 patches. The kernel (`l3_team_lanes` in
/// kernel.cu) gives each patch a team of lanes, 8 columns per lane: a power of two of at least 4 lanes
/// with 8 × lanes ≥ `block_dim` ≥ the widest patch; a block holds `block_dim / lanes` teams.
pub(crate) fn v1_blocks(n_descs: usize, block_dim: u32) -> u32 {
    let lanes = (block_dim / 8).max(4).next_power_of_two();
    (n_descs as u32).div_ceil(block_dim / lanes)
}

/// Threads per block of the version-2 launch (`l3v2_decode_*` in kernel.cu): four warps, each decoding a
/// patch of its own, so the block size changes only how patches are grouped; 64 registers a thread
/// (`__launch_bounds__`) let 32 warps share an SM, and many chains of rANS steps in flight are what hide
/// each step's latency.
pub(crate) const V2_BLOCK: u32 = 128;

/// Blocks of the version-2 launch for `n_v2` patches: a warp each.
pub(crate) fn v2_blocks(n_v2: usize) -> u32 {
    (n_v2 as u32).div_ceil(V2_BLOCK / 32)
}

/// The kernel's (scale, bias) pairs for channels 0..4: `dtype` and `normalize` checked.
pub(crate) fn scale_bias_for(
    dtype: DType,
    normalize: Option<Normalize>,
) -> Result<[f32; 8], Error> {
    let norm = match (normalize, dtype.is_float()) {
        (Some(_), false) => return Err(Error::NormalizeNeedsFloat),
        (None, false) => return Ok([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
        (n, true) => n.unwrap_or(Normalize::UNIT),
    };
    if let Some((channel, mean, std)) = norm.invalid_channel() {
        return Err(Error::BadNormalize { channel, mean, std });
    }
    let mut sb = [0.0; 8];
    for c in 0..4 {
        (sb[2 * c], sb[2 * c + 1]) = norm.scale_bias(c);
    }
    Ok(sb)
}

// The descriptor tables are the host structs' bytes as they lie in memory; the GPU reads little-endian.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the kernel descriptors are copied in host byte order"
);
