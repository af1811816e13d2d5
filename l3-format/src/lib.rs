//! The L3 lossless image format (Bae et al., ECCV 2022): a file layout, an encoder and a fast CPU decoder.
//!
//! An image is split into planar channels, each channel into independent N×N patches; within a patch every
//! row after the first is predicted from the row above with a custom Paeth filter (no left neighbour, so a
//! whole row decodes at once) and each row is packed with base-delta bit packing. The exact rules are in
//! `SPEC.md` beside this crate.
//!
//! - [`encode`](fn@encode) / [`encode_parallel`]: interleaved HWC pixels to a complete file.
//! - [`L3Writer`]: the same file from bands of rows, for images too large to hold in memory.
//! - [`L3File`]: zero-copy, fully validated view of a file; decodes into caller buffers (HWC or CHW),
//!   on one thread or patch-parallel.
//! - [`L3File::decode_region`]: only the patches under a rectangle, straight into the caller's buffer at
//!   its strides ([`PixelLayout`]).
//! - [`L3Index`] + [`Fragments`]: the same region decode when only the header, the offset table and the
//!   byte ranges of the patches under the region were read (a crop fetched from disk or object storage).
//!   [`L3Index::read_from`] / [`L3Index::read_at`] read that prefix through the caller's reader, and
//!   [`L3Index::verify_crc_from`] / [`L3Index::verify_crc_at`] check a version-2 file's whole-file CRC-32C
//!   streamed in bounded chunks ([`ReadError`]: the reader's error or the bytes').
//! - [`decode_patch`]: one patch of one channel from its bytes alone (the GPU decoder's reference);
//!   [`patch_rows_len`] and [`L3File::check_rows`]: its row headers, or every patch's, checked as the
//!   decoder reads them without decoding (a device decoder's host check).
//! - Version 2 ([`v2`], SPEC.md part 2): [`encode_with`] and [`EncodeOptions`] write it (profile ANS or BP,
//!   [`Format`]); every reader above reads it too, checking its CRC-32Cs ([`crc32c`](fn@crc32c),
//!   [`Crc32c`]: the file's, and with [`FLAG_ENTRY_CRCS`] the prefix's and each entry's, so that region
//!   reads verify what they decode) unless [`ParseOptions`] says otherwise; [`L3File::v2_plan`] / [`L3File::ans_tables`] give a
//!   device decoder what it needs. [`DEFAULT_FORMAT`] is what callers write when they do not choose.
//!
//! # Layout
//!
//! Down this list each module uses only those above it. The one exception is `simd/` at folder level:
//! each of its kernels uses the stage it speeds up (`simd/v1.rs` the constants of `v1/kernel.rs`,
//! `simd/v2.rs` the tables and row scan of `v2/`) and is called by that version's decoder, so between
//! files, too, every dependency points one way.
//!
//! - `format`: the names and numbers: [`MAGIC`], [`VERSION`], [`HEADER_LEN`], [`Format`], [`Profile`],
//!   [`default_patch_size`], [`DEFAULT_FORMAT`].
//! - `pixel_layout`: [`PixelLayout`], where decoded pixels go in the caller's buffer.
//! - `error`: [`Error`], [`Limits`], [`ParseOptions`], [`PatchId`].
//! - `geometry`: the one header validation every reader runs, and the patch grid it defines.
//! - `simd/`: run-time CPU feature checks and the hand-written kernels, one file per stage (`v1`,
//!   `interleave`, `v2`); the only `unsafe` code besides its call sites.
//! - `crc32c`: [`crc32c`](fn@crc32c) and [`Crc32c`], version 2's checksum (the `crc32c` crate's, measured
//!   faster than the loop this crate had).
//! - `interleave`: writing decoded rows out (one plane, RGB, RGBA), shared by both versions.
//! - `v1/`: version 1, one stage a file: `paeth` (the filter), `row` (base-delta packing), `kernel` (the
//!   row decoder), `container` (the offset table), `decode` ([`decode_patch`], [`patch_rows_len`], whole images), `region`,
//!   `encode` ([`encode_patch`], whole files).
//! - [`v2`]: version 2, one stage a file: `bits`, `front` (colour, predictors, row scan), `ans`, `bp`,
//!   `container`, `plan` ([`V2Plan`]), `decode`, `encode`.
//! - `encode`: [`encode`](fn@encode), [`encode_parallel`], [`encode_with`] ([`EncodeOptions`]): check the
//!   input, then run version 1's or version 2's encoder.
//! - `region`: region decoding for both readers: check the region and the buffer, then run version 1's or
//!   version 2's region decoder.
//! - `file`: [`L3File`], a whole file validated, and its decoders.
//! - `index`: [`L3Index`] and [`Fragments`], the same from a file's prefix and the byte ranges a region
//!   needs.
//! - `read`: the container read through a caller's reader: the prefix read loop and the streamed
//!   whole-file CRC check ([`ReadError`], [`CRC_CHUNK`]).
//! - `stream/`: [`L3Writer`], the file `encode_with` writes, from bands of rows given in order, in memory
//!   bounded by a row of patches (`spill`: what waits on disk until it can be written in file order).
//
// `unsafe` lives only in `simd/` (AVX2 row kernel, interleavers, the v2 rANS and BP decoders: intrinsics,
// and unaligned loads/stores through bounds-checked slices) and at its call sites, after
// the run-time CPU feature checks: `interleave.rs`, `v1/decode.rs`, `v1/region.rs`, `v2/bp.rs`,
// `v2/decode.rs`. Everything else is safe Rust.
#![deny(unsafe_code)]

// The vocabulary: names and numbers, types, the header and the grid.
mod error;
mod format;
mod geometry;
mod pixel_layout;

// What both versions' decoders share: the fast paths and the output stage.
mod crc32c;
mod interleave;
mod simd;

// The two versions.
mod v1;
pub mod v2;

// The front ends, each handing the work to `v1/` or `v2/`.
mod encode;
mod file;
mod index;
mod read;
mod region;
mod stream;

pub use crc32c::{Crc32c, crc32c};
pub use encode::{EncodeOptions, encode, encode_parallel, encode_with};
pub use error::{Error, Limits, ParseOptions, PatchId};
pub use file::L3File;
pub use format::{
    DEFAULT_FORMAT, FLAG_ENTRY_CRCS, Format, HEADER_LEN, MAGIC, MAX_PATCH_SIZE, Profile, VERSION,
    VERSION_2, default_patch_size,
};
pub use index::{Fragments, L3Index};
pub use pixel_layout::PixelLayout;
pub use read::{CRC_CHUNK, ReadError};
pub use stream::L3Writer;
pub use v1::{decode_patch, encode_patch, patch_rows_len};
pub use v2::encode::Choices;
pub use v2::{AnsTables, V2Plan};
pub use vocab::Rect;

/// The README's example runs as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
