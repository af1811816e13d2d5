//! The two bilinear passes of [`resample`](super::resample) written by hand in AVX2 intrinsics: the
//! compiler does not vectorise the horizontal pass (a few taps per output, at a per-output offset), and
//! keeps the vertical pass's accumulator row in memory between taps.
//!
//! Both compute exactly the portable passes' integers — `clamp((2^21 + Σ v·w) >> 22)` in `i32` — only in
//! another order of additions, which `i32` addition (wrapping, as the vector lanes do) does not notice:
//! the same bytes for any tables. The horizontal pass multiplies the values of two taps (all channels of
//! each) in one 8-lane `vpmulld`; the vertical pass keeps 16 values' sums in registers across all taps.
//! Each output whose loads would reach past its row is left to the portable code.
//!
//! They are `#[target_feature(enable = "avx2")]` functions, inlined into the AVX2 variant of the
//! passes; their contract is that the CPU has AVX2. Every load and store goes through a pointer into a
//! slice whose bounds were checked just before.

use std::arch::x86_64::*;
use vocab::{Coeffs, PRECISION_BITS};

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Source bytes of the 8-byte pair load, for three channels: pixel `t` then pixel `t + 1`, each spread
/// to four bytes (the fourth lane is zero).
const SPREAD3: [i8; 16] = [0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1];

/// The rounded, shifted and clamped (0..=255) low byte of each `i32` lane of `acc` (sums without
/// their half), as four bytes.
///
#[target_feature(enable = "avx2")]
#[inline]
fn finish4(acc: __m128i) -> [u8; 4] {
    let s = _mm_srai_epi32::<{ PRECISION_BITS as i32 }>(_mm_add_epi32(acc, _mm_set1_epi32(HALF)));
    // Signed saturation to i16, then unsigned to u8: the clamp to 0..=255 of each lane.
    let b = _mm_packus_epi16(_mm_packs_epi32(s, s), s);
    (_mm_cvtsi128_si32(b) as u32).to_le_bytes()
}

/// The horizontal pass over one row for `C` = 3 or 4 interleaved channels: output pixel `j` (the
/// `j`-th pixel of `out`) is the weighted sum of `cx.taps[j]` source pixels from `cx.first[j]`, `row`
/// starting at source column `x0`. Returns how many leading outputs it wrote; the caller computes the
/// rest (those whose 8-byte loads would pass the end of `row`).
///
/// # Safety
/// The CPU runs AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn horizontal_34<const C: usize>(
    row: &[u8],
    x0: u32,
    cx: &Coeffs,
    out: &mut [u8],
) -> usize {
    debug_assert!(C == 3 || C == 4);
    let n = out.len() / C;
    // SAFETY: AVX2 is this function's contract. Pixel loads read 8 bytes at `(f + t) * C` with
    // `(f + taps - 1) * C + 8 <= row.len()` checked for each output before its loads; weight loads read
    // two `i32`s of `k` at `t` with `t + 1 < taps = k.len()`; `SPREAD3` is 16 bytes.
    unsafe {
        let spread = _mm_loadu_si128(SPREAD3.as_ptr().cast());
        // Lanes 0-3 take the first weight of a pair, lanes 4-7 the second.
        let pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        for (j, (&first, &taps)) in cx.first.iter().zip(&cx.taps).enumerate().take(n) {
            let f = (first - x0) as usize;
            let taps = taps as usize;
            let k = &cx.weights[j * cx.ksize..][..taps];
            // The last load, at the last pair's or the odd tap's pixel, reads 8 bytes.
            if taps == 0 || (f + taps - 1) * C + 8 > row.len() {
                return j;
            }
            let load = |t: usize| {
                let p = _mm_loadl_epi64(row.as_ptr().add((f + t) * C).cast());
                _mm256_cvtepu8_epi32(if C == 3 {
                    _mm_shuffle_epi8(p, spread)
                } else {
                    p
                })
            };
            let mut acc = _mm256_setzero_si256();
            let mut t = 0;
            while t + 1 < taps {
                let w = _mm_loadl_epi64(k.as_ptr().add(t).cast());
                let w = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(w), pair);
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(load(t), w));
                t += 2;
            }
            if t < taps {
                // The odd last tap: the next pixel's lanes get weight 0.
                let w = _mm256_castsi128_si256(_mm_set1_epi32(k[t]));
                let w = _mm256_inserti128_si256::<1>(w, _mm_setzero_si128());
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(load(t), w));
            }
            let sum = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256::<1>(acc),
            );
            let px = finish4(sum);
            out[j * C..(j + 1) * C].copy_from_slice(&px[..C]);
        }
        n
    }
}

/// The horizontal pass over one row of one channel: eight taps per `vpmulld`, the lanes past an
/// output's taps masked to weight 0. Returns how many leading outputs it wrote, as
/// [`horizontal_34`].
///
/// # Safety
/// The CPU runs AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn horizontal_1(row: &[u8], x0: u32, cx: &Coeffs, out: &mut [u8]) -> usize {
    // SAFETY: AVX2 is this function's contract. Each output's loads read whole blocks of eight from `f`
    // in `row` and from `at` in `cx.weights`, both checked to fit (`f + blocks <= row.len()`,
    // `at + blocks <= cx.weights.len()`) before the first load.
    unsafe {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (j, o) in out.iter_mut().enumerate() {
            let f = (cx.first[j] - x0) as usize;
            let taps = cx.taps[j] as usize;
            let at = j * cx.ksize;
            // Whole blocks of eight from `f` (pixels) and `at` (weights).
            let blocks = taps.div_ceil(8) * 8;
            if taps == 0 || f + blocks > row.len() || at + blocks > cx.weights.len() {
                return j;
            }
            let mut acc = _mm256_setzero_si256();
            let mut t = 0;
            while t < taps {
                let p = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.as_ptr().add(f + t).cast()));
                let w = _mm256_loadu_si256(cx.weights.as_ptr().add(at + t).cast());
                let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((taps - t) as i32), lanes);
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(p, _mm256_and_si256(w, keep)));
                t += 8;
            }
            let s = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256::<1>(acc),
            );
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            *o = finish4(s)[0];
        }
        out.len()
    }
}

/// The vertical pass for one output row: `dst[e] = clamp((2^21 + Σ_t rows[t][e]·k[t]) >> 22)`, where
/// `rows` holds the intermediate rows (`len` = `dst.len()` values each, `row_len` apart) from the
/// first one this output reads. Sixteen values at a time with their sums in registers; returns how
/// many leading values it wrote (the rest, fewer than sixteen, are the caller's).
///
/// # Safety
/// The CPU runs AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn vertical(rows: &[u8], row_len: usize, k: &[i32], dst: &mut [u8]) -> usize {
    let n = dst.len();
    let taps = k.len();
    if taps == 0 || rows.len() < (taps - 1) * row_len + n || n < 16 {
        return 0;
    }
    let done = n / 16 * 16;
    // SAFETY: AVX2 is this function's contract. Loads read 16 bytes at `t * row_len + e` with
    // `e + 16 <= done <= n` and `rows.len() >= (taps - 1) * row_len + n` checked above; stores write 16
    // bytes at `e` into `dst`, whose length is `n`.
    unsafe {
        let half = _mm256_set1_epi32(HALF);
        let mut e = 0;
        while e < done {
            let (mut a, mut b) = (half, half);
            for (t, &w) in k.iter().enumerate() {
                let w = _mm256_set1_epi32(w);
                let v = _mm_loadu_si128(rows.as_ptr().add(t * row_len + e).cast());
                a = _mm256_add_epi32(a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v), w));
                let v = _mm_unpackhi_epi64(v, v);
                b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v), w));
            }
            let a = _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(a);
            let b = _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(b);
            // Lane-wise packs interleave the halves: a0-3 b0-3 a4-7 b4-7 as i16; the 64-bit permute
            // puts them back in order before the final pack to bytes.
            let w16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
            let bytes = _mm_packus_epi16(
                _mm256_castsi256_si128(w16),
                _mm256_extracti128_si256::<1>(w16),
            );
            _mm_storeu_si128(dst.as_mut_ptr().add(e).cast(), bytes);
            e += 16;
        }
    }
    done
}
