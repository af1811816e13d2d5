//! Version 1 (the ECCV'22 paper; SPEC.md, part 1): each channel cut into independent N×N patches, every
//! patch row after the first predicted from the row above with a custom Paeth filter (no left neighbour,
//! so a whole row decodes at once), and each row packed with a per-row base and bit width.
//!
//! Its stages, each in its own file and each using only those listed before it (the AVX2 row kernel is
//! `simd/v1.rs`, beside the other SIMD code):
//! - `paeth`: the filter (the custom Paeth predictor over TL, T, TR).
//! - `row`: row-wise base-delta bit packing.
//! - `kernel`: the portable fused row decoder (unpack, predict, add in one pass).
//! - `container`: the offset table (where the patch data starts, its validation) and `V1`, a validated
//!   file's view.
//! - `decode`: one patch row by row, [`decode_patch`], [`patch_rows_len`] (its row headers walked
//!   without decoding), whole images in bands of patch rows.
//! - `region`: only the patches under a rectangle, at the caller's strides.
//! - `encode`: [`encode_patch`], whole files.

pub(crate) mod container;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod kernel;
pub(crate) mod paeth;
pub(crate) mod region;
pub(crate) mod row;

pub use decode::{decode_patch, patch_rows_len};
pub use encode::encode_patch;
