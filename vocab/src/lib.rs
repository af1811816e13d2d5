//! The words every crate of the toolkit uses for samples and devices, defined once.
//!
//! - [`Rect`]: a rectangle of pixels (a patch, a crop, a region to decode).
//! - [`Window`]: where a rectangle of an image lands in a fixed-size sample, mirrored or not.
//! - [`Recipe`], [`Interpolation`] and [`Geometry`]: how an image is cropped and resampled into a sample,
//!   and the one per-item description (per-axis [`Axis`] resampling, placement, flip) that images, masks,
//!   boxes and the GPU kernel all follow; [`Resampling`]: its integer tables (Pillow's bilinear weights,
//!   torchvision's nearest indices), which the CPU passes and the GPU kernels apply alike.
//! - [`Layout`], [`DType`], [`Normalize`]: how a batch tensor is laid out, its element type and the
//!   per-channel arithmetic of float batches — shared by the CPU loader and the GPU kernel so that their
//!   batches are bit-identical.
//! - [`Device`]: `cpu`, `cuda` or `cuda:N`, one spelling for every command and keyword.
//! - [`Image`]: an 8-bit image with 1 to 4 interleaved channels.
//! - [`ShardPolicy`]: what happens to the tail of an epoch that does not split evenly across ranks.
//! - [`SampleSpec`] and [`Crop`]: how every item becomes a sample, validated ([`SampleSpec::validate`]);
//!   [`ItemKey`] keys each item's randomness by (seed, epoch, item).
//! - [`Invalid`]: the one error for a bad option value, whose text the command line and Python print alike.
//!
//! No CUDA here: this crate sits at the bottom of the graph beside `stdx`, so that the loader, the GPU
//! decoder, PCR, BSP tiling and the Python package can all use it without depending on each other.
#![deny(unsafe_code)]

mod device;
mod error;
mod geometry;
mod image;
mod rect;
mod resampling;
mod sample;
mod shard;
mod tensor;

pub use device::Device;
pub use error::Invalid;
pub use geometry::{
    Axis, DEFAULT_RATIO, Geometry, Interpolation, MAX_SAMPLE_SIDE, Recipe, Whole, resize_shorter,
};
pub use image::Image;
pub use rect::{Rect, Window};
pub use resampling::{Coeffs, PRECISION_BITS, Resampling, nearest};
pub use sample::{Channels, Crop, ItemKey, SampleSpec};
pub use shard::ShardPolicy;
pub use tensor::{DType, Layout, Normalize};

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
