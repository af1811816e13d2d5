//! Liquid (Baek et al., APSys '23): keep the load and decode stages of a training input pipeline in
//! balance by storing part of a dataset raw (cheap to decode, heavy to read) and the rest compressed
//! (light to read, costly to decode), at a ratio found by profiling, and sample mini-batches from
//! two-region shuffle buffers so that disk traffic stays level from batch to batch.
//!
//! - [`manifest`]: the multi-format dataset on disk (CBOR manifest + packed data files, see SPEC.md);
//! - [`pack`]: writing one;
//! - [`profile`]: the offline profiler (load/decode probes, the paper's binary search, a fitted refinement)
//!   and the converter that writes the dataset at the chosen ratio;
//! - [`plan`]: the deterministic sampling schedule (per-format buffers, current/next regions);
//! - [`sampler`]: that schedule executed with I/O threads that bypass the page cache;
//! - [`shard`]: rank/world-size splitting like PyTorch's `DistributedSampler`;
//! - [`direct`]: `O_DIRECT` reads (fadvise fallback) and page-cache residency via `mincore`.
//!
//! The crate knows no image format: compressed decoders come from the caller ([`profile::Decoder`]).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod direct;
mod error;
pub mod manifest;
pub mod pack;
pub mod plan;
pub mod profile;
pub mod sampler;
pub mod shard;

pub use error::{Error, Result};

/// Independent [`stdx::SplitMix64`] streams (`SplitMix64::keyed(seed, STREAM, ..)`), so the profiler's, the
/// sharding's and the sampler's draws never depend on one another.
pub(crate) mod stream {
    pub const CONVERT: u64 = 1;
    pub const SHARD: u64 = 2;
    pub const SAMPLE: u64 = 3;
    pub const PROBE: u64 = 4;
    /// The sampler over a part of an epoch shared out at another world size.
    pub const PART: u64 = 5;
}

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
pub use manifest::{Dataset, Dims, FormatKind, FormatSpec, Item, Manifest, Ratio};
pub use pack::DatasetWriter;
pub use plan::{BufferPlan, Planner};
pub use profile::{Decoder, Probe, Profile, ProfileConfig, SourceItem};
pub use sampler::{Batch, Delivered, LiquidSampler, SamplerConfig, delivered, delivered_epochs};
pub use shard::ShardPolicy;
