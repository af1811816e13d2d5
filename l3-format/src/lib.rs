//! The L3 lossless image format (Bae et al., ECCV 2022): a file layout, an encoder and a fast CPU decoder.
//!
//! An image is split into planar channels, each channel into independent N×N patches; within a patch every
//! row after the first is predicted from the row above with a custom Paeth filter (no left neighbour, so a
//! whole row decodes at once) and each row is packed with base-delta bit packing. The exact rules are in
//! `SPEC.md` beside this crate.
//!
//! - [`encode`] / [`encode_parallel`]: interleaved HWC pixels to a complete file.
//! - [`L3File`]: zero-copy, fully validated view of a file; decodes into caller buffers (HWC or CHW),
//!   on one thread or patch-parallel.
//! - [`L3File::decode_region`]: only the patches under a rectangle, straight into the caller's buffer at
//!   its strides ([`PixelLayout`]).
//! - [`L3Index`] + [`Fragments`]: the same region decode when only the header, the offset table and the
//!   byte ranges of the patches under the region were read (a crop fetched from disk or object storage).
//! - [`decode_patch`]: one patch of one channel from its bytes alone (the GPU decoder's reference).
//! - Version 2 ([`v2`], SPEC.md part 2): [`encode_with`] and [`EncodeOptions`] write it (profile ANS or BP,
//!   [`Format`]); every reader above reads it too, checking its CRC-32C ([`crc32c`], [`Crc32c`]) unless
//!   [`ParseOptions`] says otherwise; [`L3File::v2_plan`] / [`L3File::ans_tables`] give a device decoder
//!   what it needs. [`DEFAULT_FORMAT`] is what callers write when they do not choose.
// `unsafe` lives only in `simd/` (AVX2 row kernels, interleavers, the v2 rANS and BP decoders, the SSE4.2
// CRC: intrinsics, and unaligned loads/stores through bounds-checked slices) and at its call sites in
// `decode.rs`, `region.rs`, `v2/decode.rs` and `crc32c.rs`, after the run-time CPU feature checks;
// everything else is safe Rust.
#![deny(unsafe_code)]

mod crc32c;
mod decode;
mod encode;
mod error;
mod file;
mod index;
mod kernel;
mod paeth;
mod region;
mod row;
mod simd;
pub mod v2;

pub use decode::decode_patch;

/// The README's example runs as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
pub use crc32c::{Crc32c, crc32c};
pub use encode::{Choices, EncodeOptions, encode, encode_parallel, encode_patch, encode_with};
pub use error::{Error, Limits, ParseOptions, PatchId};
pub use file::{L3File, Rect};
pub use index::{Fragments, L3Index};
pub use region::PixelLayout;
pub use v2::{AnsTables, Format, Profile, V2Plan};

/// The four bytes every L3 file starts with.
pub const MAGIC: [u8; 4] = *b"L3IM";
/// The format version [`encode`] and [`encode_parallel`] write (1). [`encode_with`] writes either version;
/// [`L3File::version`] tells a file's.
pub const VERSION: u16 = 1;
/// The newest format version this crate reads and writes.
pub const VERSION_2: u16 = 2;
/// The format written when the caller does not choose one ([`EncodeOptions::default`], `l3 encode`,
/// `l3 convert --to l3`). Still version 1: version 2 becomes the default once its profile ANS meets the
/// targets it was designed for — at most 0.80× PNG's size *and* at least twice the `png` crate's
/// single-threaded decode speed on the corpus — on the machines users train on, and its GPU decoder has run
/// on a GPU. It is smaller than PNG everywhere, but decodes at 2.4× PNG's speed on one core of a Sapphire
/// Rapids-class Xeon and at 1.15–1.44× on AMD Zen 1 and Zen 3 (README.md has the figures), and encodes
/// 14× slower than version 1; so asking for it stays an explicit choice (`Format::V2(Profile::Ans)`,
/// `l3 encode --format v2`).
pub const DEFAULT_FORMAT: Format = Format::V1;
/// Size in bytes of the fixed header that precedes the offset table.
pub const HEADER_LEN: usize = 20;
/// Largest patch side the format allows (the patch size is a `u8`).
pub const MAX_PATCH_SIZE: u8 = 255;

/// Default patch size N for an image of `width`×`height` pixels: 32 below 1080×720 pixels (the paper's
/// rule), 64 above. The paper uses 128 above 1920×1080; on the corpus 64 stores 5.4 % less than 128 for
/// about a fifth less decode speed, while 32 would save only 2.4 % more at another third less speed
/// (measurements in SPEC.md, "Default patch size").
pub fn default_patch_size(width: u32, height: u32) -> u8 {
    let pixels = width as u64 * height as u64;
    if pixels < 1080 * 720 { 32 } else { 64 }
}
