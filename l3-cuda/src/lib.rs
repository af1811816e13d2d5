//! GPU decoding of L3 batches (l3-eccv22, sections 4.4 and 5) through `cudarc`.
//!
//! A batch of L3 files is validated and planned on the host, copied once through pinned staging memory,
//! and decoded by one kernel launch for its version-1 patches — a team of lanes per (image, channel,
//! patch), rows in order with the previous row in registers, eight pixels a lane for base-delta unpacking
//! and the custom Paeth filter — and one for its version-2 patches, a warp per patch and every plane of
//! it. The output goes straight into device memory as NHWC or NCHW `u8`, `f16` or `f32` with
//! per-channel normalisation fused in ([`Layout`], [`DType`], [`Normalize`]: the toolkit's one
//! batch-tensor vocabulary, which the loader re-exports).
//!
//! Two kinds of batch:
//! - whole images ([`BatchDecoder::submit`], [`BatchPlan`], [`DecodeOptions`], [`ImageSlot`]): every
//!   image in its own slot of the output, each at its own size;
//! - training samples ([`BatchDecoder::submit_samples`], [`SamplePlan`], [`SampleOptions`], [`Window`],
//!   [`SampleSource`]): ONE `[n, h, w, 3]` / `[n, 3, h, w]` tensor, sample i a window of image i (crop or
//!   padding, mirrored or not, gray copied to RGB, alpha dropped), bit-identical to the CPU loader's
//!   batches; only the patches under each window are copied and decoded, from whole files or from an
//!   [`L3Index`] + [`Fragments`] (just the byte ranges read from storage). A resampled batch
//!   ([`SamplePlan::resampled`]: random-resized crop, resize, scale jitter, as `vocab::Geometry`s) decodes
//!   each sample's window plus the filter's margin and resamples it in two more kernels with the CPU
//!   loader's integer tables, padding with `fill`: bit-identical too.
//!
//! [`DecodedBatch`] is the device-resident result: raw device pointer, [`TensorInfo`] (shape, strides,
//! type), device ordinal and ready event for a DLPack export or a consumer stream. [`Error`]: no driver,
//! no device, no NVRTC, compile and launch failures, corrupt images and bad windows by batch index.
//!
//! libcuda and libnvrtc are loaded at run time (through `cuda-setup`, the toolkit's one CUDA setup): the
//! crate builds anywhere, and without a GPU every entry point returns [`Error::NoDriver`] (or
//! [`Error::NoNvrtc`]) instead of panicking. The host-side plans need no GPU at all.
//!
//! Modules, host side, each using only those before it: `layout` (what every batch shares about its output:
//! [`TensorInfo`], [`SampleOptions`], the fused normalisation, threads per block), `v2` (version-2
//! descriptors and ANS tables), `plan` (whole-image batches), `resample` (a resampled batch's passes),
//! `sample/` (sample batches: `source`, `patches`, `desc`, `parts`), `input` (the packed device input of a
//! launch, written on several threads: the host stage).
//! Every descriptor is a `#[repr(C)]` `bytemuck::Pod` struct laid out as kernel.cu's: its bytes are the
//! table the kernel reads. Device side: `kernels`
//! (`kernel.cu`, compiled once per architecture), `decoder` ([`BatchDecoder`]: streams, pinned staging, the
//! in-flight bound), `launch` (a batch's launches), `batch` ([`DecodedBatch`], [`DeviceOutput`],
//! [`ResidentBatch`]), `pinned` ([`PinnedBatch`]), `measure` (the bandwidth and timing helpers the
//! benchmarks use). `error`: [`Error`].
#![deny(unsafe_code)]

mod batch;
mod decoder;
mod error;
mod input;
mod kernels;
mod launch;
mod layout;
mod measure;
mod pinned;
mod plan;
mod resample;
mod sample;
mod self_check;
mod v2;
#[cfg(test)]
extern crate self as l3_cuda;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod stage_tests;

pub use batch::{DecodedBatch, DeviceOutput, ResidentBatch};
pub use cudarc;
pub use decoder::{BatchDecoder, DEFAULT_MAX_IN_FLIGHT};
pub use error::Error;
pub use kernels::device_count;
pub use l3_format::{Fragments, L3Index, Rect};
pub use layout::{SampleOptions, TensorInfo};
pub use pinned::PinnedBatch;
pub use plan::{BatchPlan, DecodeOptions, ImageSlot};
pub use sample::{SamplePlan, SampleSource};

/// The README's examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The CUDA C source of the kernels (compiled at run time by NVRTC).
pub const KERNEL_SOURCE: &str = kernels::KERNEL_SRC;
