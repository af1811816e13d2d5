//! The thin stitching crate: datasets, a decode pipeline and fixed-size batches over the toolkit's formats.
//!
//! - [`Dataset`]: one trait for every source — [`ImageFolder`] (PNG, JPEG, raw PPM, L3 files),
//!   the packed multi-format shards of `liquid-sampler`, PCR records at a chosen scan group.
//! - [`Loader`]: I/O threads → decode pool → batch assembly → bounded prefetch queue, with seeded shuffling
//!   or Liquid's two-region shuffle buffers ([`Order`]), rank sharding, exact [`LoaderState`] resume,
//!   live [`Stats`].
//!
//! The `l3` command-line tool lives in `src/bin/l3/`, one module per subcommand group.
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

pub mod compare;
pub mod convert;
mod dataset;
mod error;
mod folder;
mod gpu;
mod image;
mod loader;
mod open;
mod order;
mod pcr_records;
pub mod raw;
mod shards;
mod stats;
pub mod synth;
mod transform;

pub use dataset::Dataset;
pub use error::{Error, Result};
pub use folder::{ImageFolder, image_files};
pub use image::{Format, Image, decode, decode_file};
pub use loader::{Batch, Loader, LoaderOptions, LoaderState, Order, ThreadMonitor};
pub use open::{OpenOptions, open_dataset};
pub use order::{ShardTail, ShardedOrder, SplitMix64};
pub use pcr_records::PcrRecords;
pub use shards::LiquidShards;
pub use stats::Stats;
pub use transform::{Crop, Layout, Normalize, Pixels, SampleSpec};

// The README's example is compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Fuzzing entry point (not API): the L3 crop-window decoder on arbitrary bytes, with windows at the
/// image's corner, centre and full extent. Must never panic.
#[doc(hidden)]
pub fn fuzz_l3_window(data: &[u8]) {
    let mut img = Image::default();
    let mut scratch = Vec::new();
    type Window = fn(u32, u32) -> (u32, u32, u32, u32);
    let windows: [Window; 3] = [
        |w, h| (0, 0, w.min(7), h.min(5)),
        |w, h| (w / 3, h / 3, w - w / 3, h - h / 3),
        |w, h| (0, 0, w, h),
    ];
    for place in windows {
        let _ = image::decode_l3_window(
            data,
            std::path::Path::new("fuzz"),
            place,
            &mut img,
            &mut scratch,
        );
    }
}
