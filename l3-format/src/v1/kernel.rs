//! The portable fused row decoder: unpack deltas, predict, add, in one pass over 16-pixel chunks (CPUs
//! with AVX2 use `crate::simd::v1::decode_row_avx2`, tested against this one).
//!
//! Unpacking, prediction and the final add run in one loop so that nothing is written to memory and read
//! back with a different width (which would stall store forwarding). Rows live in padded buffers with pixel
//! c at index c + 1, so every 16-lane chunk reads TL, T, TR at fixed offsets without edge tests; the two edge
//! columns, whose rules differ (SPEC §3.2), are then recomputed on their own. Lanes past the row width compute
//! junk that is never read as a pixel.

use super::paeth::{interior, left_edge, right_edge};
use super::row::spread;

/// Length of a padded row buffer: guard byte, up to 255 pixels, and room for the last 16-lane chunk.
pub(crate) const PAD: usize = 272;

/// Bytes of a row's data the kernels may load (row header included): every 16-pixel chunk loads two groups
/// of eight deltas, with a 9-byte window each here and a 16-byte one in the AVX2 kernel (`crate::simd::v1`).
#[inline(always)]
pub(crate) const fn window(w: usize, nbit: usize) -> usize {
    1 + 2 * w.div_ceil(16) * nbit + 16
}

/// Size of the zero-padded copy of a row near the end of its patch: the largest [`window`].
pub(crate) const SCRATCH: usize = window(255, 8);

/// Eight deltas of group `g`, one per byte.
#[inline(always)]
fn group<const NB: usize>(src: &[u8], g: usize) -> u64 {
    if NB == 0 {
        return 0;
    }
    let at = 1 + g * NB;
    let lo = u64::from_le_bytes(src[at..at + 8].try_into().unwrap_or([0; 8]));
    let bits = if NB == 8 {
        (lo >> 4) | ((src[at + 8] as u64) << 60)
    } else {
        lo >> 4
    };
    spread::<NB>(bits)
}

#[inline(always)]
fn row_fixed<const NB: usize, const FIRST: bool>(
    src: &[u8],
    base: u8,
    w: usize,
    prev: &[u8; PAD],
    out: &mut [u8; PAD],
) {
    let chunks = w.div_ceil(16);
    let src = &src[..window(w, NB)];
    for k in 0..chunks {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&group::<NB>(src, 2 * k).to_le_bytes());
        d[8..].copy_from_slice(&group::<NB>(src, 2 * k + 1).to_le_bytes());
        let at = 16 * k;
        let p: &[u8; 18] = prev[at..at + 18].try_into().unwrap_or(&[0; 18]);
        let o = &mut out[at + 1..at + 17];
        for i in 0..16 {
            let s = d[i].wrapping_add(base);
            o[i] = if FIRST {
                s
            } else {
                interior(p[i], p[i + 1], p[i + 2]).wrapping_add(s)
            };
        }
    }
    if !FIRST {
        // Recover the stored byte of each edge column and apply the edge rule instead of the interior one.
        let s0 = out[1].wrapping_sub(interior(prev[0], prev[1], prev[2]));
        if w == 1 {
            out[1] = prev[1].wrapping_add(s0);
        } else {
            let sl = out[w].wrapping_sub(interior(prev[w - 1], prev[w], prev[w + 1]));
            out[1] = left_edge(prev[1], prev[2]).wrapping_add(s0);
            out[w] = right_edge(prev[w - 1], prev[w]).wrapping_add(sl);
        }
    }
}

/// Decodes one row of width `w` (1..=255) whose bytes start at `src[0]` (header included); `src` must hold
/// at least [`window`] bytes. `first` selects row 0 (values stored as they are).
#[inline(always)]
pub(crate) fn decode_row(
    src: &[u8],
    nbit: u8,
    base: u8,
    w: usize,
    first: bool,
    prev: &[u8; PAD],
    out: &mut [u8; PAD],
) {
    macro_rules! go {
        ($nb:literal) => {
            if first {
                row_fixed::<$nb, true>(src, base, w, prev, out)
            } else {
                row_fixed::<$nb, false>(src, base, w, prev, out)
            }
        };
    }
    match nbit {
        0 => go!(0),
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        6 => go!(6),
        7 => go!(7),
        _ => go!(8),
    }
}
