// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! The RGB and RGBA interleavers of the AVX2 decoders (`crate::interleave` calls them after the run-time
//! check, and holds the portable loops that run without AVX2).

/// `pshufb` masks for interleaving three 16-byte planes into 48 RGB bytes: `RGB_MASKS[plane][block][k]` is the
/// source lane of output byte `16·block + k` when it comes from `plane`, else 0x80 (writes zero).
pub(crate) const RGB_MASKS: [[[u8; 16]; 3]; 3] = {
    let mut m = [[[0x80u8; 16]; 3]; 3];
    let mut q = 0;
    while q < 48 {
        m[q % 3][q / 16][q % 16] = (q / 3) as u8;
        q += 1;
    }
    m
};

/// Interleaves three planes' rows into RGB triples (`dst[3i + c] = r_c[i]`) with SSSE3 byte shuffles:
/// nine `pshufb` and six `por` per 16 pixels, where the portable loop compiles to a long chain of inserts.
///
/// # Safety
/// The CPU must support AVX2 (force-inlined into the AVX2 band decoder, like `simd::v1::decode_row_avx2`).
#[inline(always)]
pub(crate) unsafe fn interleave3_avx2(dst: &mut [u8], r0: &[u8], r1: &[u8], r2: &[u8]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128,
    };
    let w = r0.len().min(r1.len()).min(r2.len()).min(dst.len() / 3);
    // SAFETY (all loads and stores below): each pointer comes from a bounds-checked slice or array of
    // exactly 16 bytes; the unaligned forms are used, so any address is valid.
    let load = |s: &[u8; 16]| unsafe { _mm_loadu_si128(s.as_ptr().cast::<__m128i>()) };
    let mut m = [[load(&[0; 16]); 3]; 3];
    for (mp, rp) in m.iter_mut().zip(&RGB_MASKS) {
        for (mb, rb) in mp.iter_mut().zip(rp) {
            *mb = load(rb);
        }
    }
    let full = w / 16 * 16;
    for k in (0..full).step_by(16) {
        // SAFETY: `r[k..k + 16]` is a bounds-checked 16-byte slice (k + 16 <= w, the shortest row); an
        // unaligned load.
        let row = |r: &[u8]| unsafe { _mm_loadu_si128(r[k..k + 16].as_ptr().cast::<__m128i>()) };
        let (a, b, c) = (row(r0), row(r1), row(r2));
        let out = &mut dst[3 * k..3 * k + 48];
        for (j, o) in out.chunks_exact_mut(16).enumerate() {
            // SAFETY: SSSE3 (part of AVX2) is the caller's guarantee.
            let v = unsafe {
                _mm_or_si128(
                    _mm_or_si128(_mm_shuffle_epi8(a, m[0][j]), _mm_shuffle_epi8(b, m[1][j])),
                    _mm_shuffle_epi8(c, m[2][j]),
                )
            };
            // SAFETY: `o` is a 16-byte chunk of `dst`; an unaligned store.
            unsafe { _mm_storeu_si128(o.as_mut_ptr().cast::<__m128i>(), v) };
        }
    }
    for i in full..w {
        dst[3 * i] = r0[i];
        dst[3 * i + 1] = r1[i];
        dst[3 * i + 2] = r2[i];
    }
}

/// Interleaves four planes' rows into RGBA quadruples with byte then word unpacks (16 pixels per step).
///
/// # Safety
/// The CPU must support AVX2 (only SSE2 is used today; the contract matches the other kernels).
#[inline(always)]
pub(crate) unsafe fn interleave4_avx2(dst: &mut [u8], r0: &[u8], r1: &[u8], r2: &[u8], r3: &[u8]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_unpackhi_epi8, _mm_unpackhi_epi16,
        _mm_unpacklo_epi8, _mm_unpacklo_epi16,
    };
    let w = r0
        .len()
        .min(r1.len())
        .min(r2.len())
        .min(r3.len())
        .min(dst.len() / 4);
    let full = w / 16 * 16;
    for k in (0..full).step_by(16) {
        // SAFETY: loads and stores go through bounds-checked 16-byte slices, unaligned forms.
        let row = |r: &[u8]| unsafe { _mm_loadu_si128(r[k..k + 16].as_ptr().cast::<__m128i>()) };
        let (a, b, c, d) = (row(r0), row(r1), row(r2), row(r3));
        // SAFETY: SSE2 intrinsics, part of the caller's AVX2 guarantee.
        let v = unsafe {
            let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
            let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
            [
                _mm_unpacklo_epi16(ab_lo, cd_lo),
                _mm_unpackhi_epi16(ab_lo, cd_lo),
                _mm_unpacklo_epi16(ab_hi, cd_hi),
                _mm_unpackhi_epi16(ab_hi, cd_hi),
            ]
        };
        let out = &mut dst[4 * k..4 * k + 64];
        for (o, v) in out.chunks_exact_mut(16).zip(v) {
            // SAFETY: `o` is a 16-byte chunk of `dst`; an unaligned store.
            unsafe { _mm_storeu_si128(o.as_mut_ptr().cast::<__m128i>(), v) };
        }
    }
    for i in full..w {
        dst[4 * i] = r0[i];
        dst[4 * i + 1] = r1[i];
        dst[4 * i + 2] = r2[i];
        dst[4 * i + 3] = r3[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::has_avx2;

    #[test]
    fn shuffle_interleave_matches_scalar_for_every_width() {
        if !has_avx2() {
            return;
        }
        let planes: Vec<Vec<u8>> = (0..4)
            .map(|c| (0..255).map(|i| (i * 7 + c * 61) as u8).collect())
            .collect();
        for w in 1..=255 {
            let r: Vec<&[u8]> = planes.iter().map(|p| &p[..w]).collect();
            let (mut got3, mut got4) = (vec![0u8; 3 * w], vec![0u8; 4 * w]);
            // SAFETY: AVX2 checked above.
            unsafe {
                interleave3_avx2(&mut got3, r[0], r[1], r[2]);
                interleave4_avx2(&mut got4, r[0], r[1], r[2], r[3]);
            }
            for i in 0..w {
                for c in 0..3 {
                    assert_eq!(got3[3 * i + c], r[c][i], "w {w} px {i} ch {c}");
                }
                for c in 0..4 {
                    assert_eq!(got4[4 * i + c], r[c][i], "w {w} px {i} ch {c}");
                }
            }
        }
    }
}
