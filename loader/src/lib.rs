//! Datasets, a decode pipeline and fixed-size batches over the toolkit's formats — the thin crate that
//! stitches `l3-format`, `l3-cuda`, `pcr` and `liquid-sampler` together.
//!
//! - [`Dataset`]: one trait for every source — [`ImageFolder`] (PNG, JPEG, raw PPM, L3, WebP, TIFF, BMP, GIF files),
//!   [`LiquidShards`] (the packed multi-format dataset of `liquid-sampler`), [`PcrRecords`] (PCR at a
//!   chosen scan group), [`ShardSet`] (WebDataset tar shards with an index of member offsets: random access
//!   and L3 region reads inside a member) — opened by [`open_dataset`].
//! - [`Loader`]: the pipeline (`pipeline`: order → read → decode → assemble → prefetch) delivering
//!   [`Batch`]es of one [`Tensor`] each, with seeded shuffling or Liquid's shuffle buffers ([`Order`]),
//!   rank sharding, exact [`LoaderState`] resume (at another world size too), live [`Stats`]; decoding on CPU threads into host
//!   memory, or on a CUDA [`Device`] into device memory (one windowed `l3-cuda` launch per batch).
//! - [`SampleSpec`]: how each item becomes a sample (crop, flip, [`Recipe`], [`Interpolation`],
//!   [`Layout`], [`DType`], [`Normalize`]); [`decode_sample`] is the one decode path from stored bytes to a
//!   sample; [`transform`] resamples a sample's [`Geometry`] in Pillow's integer arithmetic.
//! - [`decode_buffers`]: a caller's list of L3 buffers (windows chosen by the caller) into one tensor,
//!   on CPU threads through [`decode_l3_window`] or on a CUDA device through `l3-cuda`: what
//!   `l3toolkit.decode_batch` gives pipelines that are not the loader.
//! - [`shuffle_report`]: how far an order is from a uniform shuffle, from the schedule alone.
//! - [`convert`]: writing datasets (per-file formats, PCR records, Liquid mixes); [`import`] reads any
//!   image file with the toolkit's one set of rules.
//!
//! ```no_run
//! use loader::{ImageFolder, Loader, LoaderOptions};
//! use std::sync::Arc;
//! let data = Arc::new(ImageFolder::open("images/")?);
//! let opts = LoaderOptions { batch_size: 16, ..Default::default() };
//! for batch in Loader::new(data, opts)? {
//!     let batch = batch?;
//!     println!("epoch {} batch {}: {} images, labels {:?}", batch.epoch, batch.index, batch.len(), batch.labels);
//! }
//! # Ok::<(), loader::Error>(())
//! ```
// `unsafe` lives only in `memory.rs` (aligned batch memory, disjoint slots filled by several
// threads), `transform/avx2.rs` (the resampler's AVX2 kernels) and their call sites in
// `transform/resample.rs`, and the test that makes a FIFO.
#![deny(unsafe_code)]

mod batch;
mod buffers;
pub mod convert;
mod dataset;
mod error;
mod format;
mod image;
mod item;
mod loader;
#[allow(unsafe_code)]
mod memory;
mod options;
mod pipeline;
mod raw;
mod resume;
mod sample;
mod shuffle;
mod stats;
mod storage;
pub mod targets;
pub mod transform;

pub use batch::{Batch, Masks, Tensor};
pub use buffers::{BufferBatch, BufferOptions, L3Buffer, decode_buffers};
pub use dataset::folder::ImageFiles;
pub use dataset::{
    Blocks, Dataset, ImageFolder, LiquidShards, OpenOptions, PcrRecords, ShardSet, image_files,
    open_dataset,
};
pub use error::{Error, Result};
pub use format::Format;
pub use image::{DecodeOptions, ImportOptions, decode, import, max_image_bytes};
pub use item::{
    Decoded, SampleRequest, Scratch, Stored, decode_l3_window, decode_sample, write_pixels,
};
pub use loader::{Loader, Next, RestOfEpoch, ThreadMonitor};
#[cfg(feature = "clap")]
pub use options::clap_values;
pub use options::{
    Bytes, LoaderOptions, MAX_THREADS, Order, Pair, PerChannel, SampleSize, Sampler, Settings,
    Size, parse_setting,
};
pub use resume::{LoaderState, MAX_EPOCH, check_contents};
pub use sample::DecodeScope;
pub use shuffle::{ShuffleReport, ShuffleStat, shuffle_report};
pub use stats::Stats;
pub use storage::{
    BadEntry, CacheEntry, CacheOptions, Listing, Storage, StorageOptions, StorageStats, s3_error,
};
pub use targets::TargetOptions;
pub use vocab::{
    Axis, Crop, DEFAULT_RATIO, DType, Device, Geometry, Image, Interpolation, Invalid, ItemKey,
    Layout, Normalize, Recipe, Rect, Resampling, SampleSpec, ShardPolicy, Whole, Window,
};

/// Why a build without the `gpu` feature refuses a CUDA device or page-locked memory.
#[cfg(not(feature = "gpu"))]
const NO_GPU_FEATURE: &str =
    "this build of the loader has no GPU support (it was built without its `gpu` feature)";

// The README's examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Fuzzing entry point (not API): the one decode path on arbitrary bytes as every format, whole and
/// region, into every layout and type, with windows at the corner, the centre and beyond the image.
/// Must never panic.
#[doc(hidden)]
pub fn fuzz_decode_sample(data: &[u8]) {
    let mut scratch = Scratch::default();
    // The last is whole images (no crop), each sample at its own size, at most 64 on a side.
    let whole = vocab::Recipe::Whole(vocab::Whole {
        max_size: Some(64),
        ..vocab::Whole::default()
    });
    for (h, w, crop, recipe) in [
        (5, 7, Crop::Center, vocab::Recipe::Crop),
        (64, 64, Crop::Random, vocab::Recipe::Crop),
        (3, 300, Crop::Center, vocab::Recipe::Crop),
        (64, 64, Crop::Center, whole),
    ] {
        for (layout, dtype) in [(Layout::Nhwc, DType::U8), (Layout::Nchw, DType::F16)] {
            let spec = SampleSpec {
                height: h,
                width: w,
                crop,
                hflip: true,
                layout,
                dtype,
                normalize: None,
                recipe,
                ..SampleSpec::default()
            };
            let mut slot = vec![0u8; spec.sample_bytes()];
            for format in [Format::L3, Format::Png, Format::Jpeg, Format::Raw] {
                for scope in [DecodeScope::Region, DecodeScope::Whole] {
                    let req = SampleRequest {
                        spec: &spec,
                        key: ItemKey {
                            seed: 1,
                            epoch: 0,
                            index: data.len(),
                        },
                        scope,
                        partial_images: false,
                    };
                    let stored = Stored::Whole(data.to_vec());
                    let _ = decode_sample(
                        format,
                        &stored,
                        std::path::Path::new("fuzz"),
                        &req,
                        &mut scratch,
                        &mut slot,
                    );
                }
            }
        }
    }
}
