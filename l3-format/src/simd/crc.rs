// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! CRC-32C with the SSE4.2 `crc32` instruction, 8 bytes per instruction (one dependent chain: about 8 bytes
//! per 3 cycles, several GB/s, a small fraction of a v2 decode's time).

use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};

/// Continues a raw CRC register over `bytes`.
///
/// # Safety
/// The CPU must support SSE4.2. Memory safety does not depend on the caller (slices only).
#[target_feature(enable = "sse4.2")]
pub(crate) unsafe fn update_sse42(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = u64::from(crc);
    let mut chunks = bytes.chunks_exact(8);
    for ch in &mut chunks {
        let v = u64::from_le_bytes([ch[0], ch[1], ch[2], ch[3], ch[4], ch[5], ch[6], ch[7]]);
        c = _mm_crc32_u64(c, v);
    }
    let mut c = c as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

/// Continues two raw CRC registers over the same `bytes`: the two `crc32` chains are independent, so the
/// second runs in the first one's latency shadow and both cost about what one does (a whole-file read of a
/// file with entry CRCs checks the file's and each entry's checksum in one pass).
///
/// # Safety
/// As [`update_sse42`].
#[target_feature(enable = "sse4.2")]
pub(crate) unsafe fn update2_sse42(a: u32, b: u32, bytes: &[u8]) -> (u32, u32) {
    let (mut x, mut y) = (u64::from(a), u64::from(b));
    let mut chunks = bytes.chunks_exact(8);
    for ch in &mut chunks {
        let v = u64::from_le_bytes([ch[0], ch[1], ch[2], ch[3], ch[4], ch[5], ch[6], ch[7]]);
        x = _mm_crc32_u64(x, v);
        y = _mm_crc32_u64(y, v);
    }
    let (mut x, mut y) = (x as u32, y as u32);
    for &byte in chunks.remainder() {
        x = _mm_crc32_u8(x, byte);
        y = _mm_crc32_u8(y, byte);
    }
    (x, y)
}
