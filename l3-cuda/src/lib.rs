//! GPU decoding of L3 batches (l3-eccv22, sections 4.4 and 5) through `cudarc`.
//!
//! A batch of L3 files is validated and planned on the host ([`BatchPlan`]), copied once through pinned
//! staging memory, and decoded by ONE kernel launch: a thread block per (image, channel, patch), rows in
//! order with the previous row in shared memory, a thread per pixel for base-delta unpacking and the
//! custom Paeth filter. The output goes straight into device memory as NHWC/NCHW `u8` or NCHW `f32`/`f16`
//! with per-channel normalisation fused in ([`Layout`], [`DType`], [`Normalize`]: the toolkit's one
//! batch-tensor vocabulary, which the loader re-exports).
//!
//! - [`BatchDecoder`]: streams, NVRTC-compiled kernels, double-buffered submission; [`DecodedBatch`] is
//!   its result.
//! - [`BatchPlan`], [`DecodeOptions`], [`ImageSlot`]: the host side, usable (and tested) without a GPU.
//! - [`Error`]: no driver, no device, no NVRTC, compile and launch failures, corrupt images by batch index.
//!
//! libcuda and libnvrtc are loaded at run time: the crate builds anywhere, and without a GPU every entry
//! point returns [`Error::NoDriver`] (or [`Error::NoNvrtc`]) instead of panicking.

mod device;
mod error;
mod plan;
mod sample;
mod tensor;
#[cfg(test)]
extern crate self as l3_cuda;
#[cfg(test)]
mod sim_tests;

pub use cudarc;
pub use device::{
    BatchDecoder, DEFAULT_MAX_IN_FLIGHT, DecodedBatch, DeviceOutput, PinnedBatch, ResidentBatch,
    device_count,
};
pub use error::Error;
pub use l3_format::{Fragments, L3Index, Rect};
pub use plan::{BatchPlan, DecodeOptions, ImageSlot};
pub use sample::{SampleOptions, SamplePlan, SampleSource, TensorInfo, Window};
pub use tensor::{DType, Layout, Normalize};

/// The CUDA C source of the kernels (compiled at run time by NVRTC).
pub const KERNEL_SOURCE: &str = device::KERNEL_SRC;
