//! Version 2 (SPEC.md, part 2): the same patch grid as v1 with a colour transform, per-run predictor
//! selectors that may use the left neighbour (a row decodes as a prefix sum), and two entropy back ends —
//! BP (bit-packed groups, no tables) and ANS (static context rANS, 32 lanes per patch) — in a container
//! that ends with a CRC-32C.
//!
//! Its stages, each in its own file and each using only those listed before it (the AVX2 copies of the
//! decoder's kernels are `simd/v2.rs`, beside the other SIMD code):
//! - `bits`: LSB-first bit strings (writer, reader, 64-bit windows).
//! - `front`: colour, prediction, zigzag, the row scan (shared by both profiles and both directions).
//! - `ans`, `bp`: the two entropy back ends' bitstreams (ANS with its frequency tables).
//! - `container`: the container (`Layout`), validated from a whole file or from a prefix and a length; the
//!   CRC-32C check.
//! - `plan`: [`V2Plan`], what a device decoder needs.
//! - `decode`, `encode`: whole images, regions, threads.
//!
//! [`Format`] and [`Profile`] name the formats of both versions; they are defined with the crate's other
//! names and numbers and named here too.

pub(crate) mod ans;
pub(crate) mod bits;
pub(crate) mod bp;
pub(crate) mod container;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod front;
pub(crate) mod plan;

pub use crate::format::{Format, Profile, V2_DEFAULT_PATCH_SIZE, valid_v2_patch_size};
pub use ans::{
    AnsTables, FIRST_ROW_BUCKET, LANES, PROB_BITS, RANS_L, STATE_BYTES, bucket, contexts,
    residual_context, selector_context,
};
pub use plan::V2Plan;
