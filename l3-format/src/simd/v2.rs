// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! AVX2 kernels of the v2 decoder (placeholder: portable bodies until the vector code lands).

use crate::error::{Error, PatchId};
use crate::v2::ans::Store;
use crate::v2::front::ROW;

/// Eight `nb`-bit fields from the low bits of `v`, one per byte.
///
/// # Safety
/// The CPU must support BMI2.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) unsafe fn spread_bits(v: u64, nb: u8) -> u64 {
    let mut o = 0u64;
    for j in 0..8 {
        o |= ((v >> (j * nb as u32)) & ((1u64 << nb) - 1)) << (8 * j);
    }
    o
}

/// # Safety
/// The CPU must support AVX2, BMI2 and POPCNT.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) unsafe fn decode_chunk_avx2(
    chunk: &[u8],
    table: &[u32],
    used: [u64; 4],
    pw: usize,
    ph: usize,
    c: usize,
    store: Store,
    z: &mut [u8],
    sel: &mut [u8],
    id: PatchId,
) -> Result<(), Error> {
    crate::v2::ans::decode_chunk_scalar(chunk, table, used, pw, ph, c, store, z, sel, id)
}

/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) unsafe fn reconstruct_row_avx2(
    prev: &[u8; ROW],
    z: &[u8],
    sels: &[u8],
    pw: usize,
    first: bool,
    cur: &mut [u8; ROW],
) {
    crate::v2::front::reconstruct_row(prev, z, sels, pw, first, cur)
}
