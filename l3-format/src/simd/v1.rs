// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! The AVX2 row kernel of the v1 decoder ([`decode_row_avx2`]), tested against the portable one in
//! `crate::v1::kernel`.

use crate::v1::kernel::{PAD, window};

/// Per-nbit constants of the AVX2 unpacker for eight deltas (the same for both 128-bit halves, which
/// hold groups of eight that start at the same bit phase). Delta j starts at bit `o = 4 + j·nbit` of its
/// group's first byte: `shuf` gathers bytes `o/8` and `o/8 + 1` into 16-bit lane j, where the field sits
/// at bits `s = o % 8 .. s + nbit` (≤ 15). `mullo(·, mul[j])` with `mul[j] = 2^(16 − s − nbit)` moves it to
/// the top of the lane, dropping the bits above it (AVX2 has no per-lane variable shift of 16-bit lanes),
/// and one uniform right shift by `16 − nbit` brings it down. For nbit = 0 the shift by 16 clears the lane.
#[repr(C, align(32))]
struct Unpack {
    shuf: [u8; 32],
    mul: [u16; 16],
}

const UNPACK: [Unpack; 9] = {
    let mut t = [const {
        Unpack {
            shuf: [0; 32],
            mul: [0; 16],
        }
    }; 9];
    let mut nb = 0;
    while nb <= 8 {
        let mut j = 0;
        while j < 16 {
            let o = 4 + (j % 8) * nb;
            t[nb].shuf[2 * j] = (o / 8) as u8;
            t[nb].shuf[2 * j + 1] = (o / 8 + 1) as u8;
            t[nb].mul[j] = if nb == 0 { 0 } else { 1 << (16 - o % 8 - nb) };
            j += 1;
        }
        nb += 1;
    }
    t
};

/// How far past the start of a row [`decode_row_avx2`] prefetches its patch's data.
const PREFETCH_AHEAD: usize = 256;

/// Decodes one row like [`crate::v1::kernel::decode_row`], 16 pixels per step in 16-bit AVX2 lanes, with no
/// branch on nbit (table-driven unpack), none on the edge columns (absence of TL/TR is a lane mask built
/// from the column index, SPEC §3.2) and none on row 0 (the caller's `prev` is then all zero, which
/// predicts 0 for every column). `src` must hold at least [`crate::v1::kernel::window`] bytes.
///
/// Not a `#[target_feature]` function but `#[inline(always)]`, so that it is inlined into the AVX2 band
/// decoders (a target-feature function cannot be force-inlined, and a call per row costs ~10 %).
///
/// # Safety
/// The CPU must support AVX2. Memory safety does not depend on the caller: every access is bounds-checked.
#[inline(always)]
pub(crate) unsafe fn decode_row_avx2(
    src: &[u8],
    nbit: u8,
    base: u8,
    w: usize,
    prev: &[u8; PAD],
    out: &mut [u8; PAD],
) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is the caller's guarantee; loads and stores as noted below.
    unsafe {
        // Each band decodes up to 8 patches × C channels in lockstep, more streams than the hardware
        // prefetcher follows; ask for this patch's data a few rows ahead (a hint: never faults).
        _mm_prefetch::<_MM_HINT_T0>(src.as_ptr().wrapping_add(PREFETCH_AHEAD).cast());
        let nb = (nbit as usize).min(8);
        let src = &src[..window(w, nb)];
        let t = &UNPACK[nb];
        // SAFETY (every load and store below): the pointer comes from a bounds-checked slice of at least the
        // accessed length (16 or 32 bytes); only unaligned forms are used.
        let shuf = _mm256_loadu_si256(t.shuf.as_ptr().cast());
        let mul = _mm256_loadu_si256(t.mul.as_ptr().cast());
        let down = _mm_cvtsi32_si128(16 - nb as i32);
        let basev = _mm256_set1_epi16(base as i16);
        let lanes = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let last = _mm256_set1_epi16((w - 1) as i16);
        let far = _mm256_set1_epi16(0x7fff);
        let low_byte = _mm256_set1_epi16(0xff);
        let load = |s: &[u8]| _mm_loadu_si128(s[..16].as_ptr().cast());
        // At most 16 chunks (w ≤ 255): lets the compiler drop the bounds checks on `prev` and `out`.
        for k in 0..w.div_ceil(16).min(16) {
            let g = 1 + 2 * k * nb;
            let packed = _mm256_set_m128i(load(&src[g + nb..]), load(&src[g..]));
            let lanes16 = _mm256_mullo_epi16(_mm256_shuffle_epi8(packed, shuf), mul);
            let delta = _mm256_srl_epi16(lanes16, down);
            let stored = _mm256_add_epi16(delta, basev);

            let at = 16 * k;
            let col = _mm256_add_epi16(lanes, _mm256_set1_epi16(at as i16));
            let no_tl = _mm256_cmpeq_epi16(col, _mm256_setzero_si256());
            let no_tr = _mm256_cmpeq_epi16(col, last);
            // TL of column 0 is the zero guard byte prev[0]; TR of the last column is masked to 0.
            let tl = _mm256_cvtepu8_epi16(load(&prev[at..]));
            let tt = _mm256_cvtepu8_epi16(load(&prev[at + 1..]));
            let tr = _mm256_andnot_si256(no_tr, _mm256_cvtepu8_epi16(load(&prev[at + 2..])));
            let two_t = _mm256_add_epi16(tt, tt);
            // |p − TL|, |p − T|, |p − TR| with p = TL + TR − T; an absent neighbour gets an unbeatable distance.
            let da = _mm256_or_si256(
                _mm256_abs_epi16(_mm256_sub_epi16(tr, tt)),
                _mm256_and_si256(no_tl, far),
            );
            let db = _mm256_abs_epi16(_mm256_sub_epi16(_mm256_add_epi16(tl, tr), two_t));
            let dc = _mm256_or_si256(
                _mm256_abs_epi16(_mm256_sub_epi16(tl, tt)),
                _mm256_and_si256(no_tr, far),
            );
            let t_or_tr = _mm256_blendv_epi8(tt, tr, _mm256_cmpgt_epi16(db, dc));
            let not_tl = _mm256_or_si256(_mm256_cmpgt_epi16(da, db), _mm256_cmpgt_epi16(da, dc));
            let pred = _mm256_blendv_epi8(tl, t_or_tr, not_tl);

            let x = _mm256_and_si256(_mm256_add_epi16(pred, stored), low_byte);
            let bytes = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi16(x, x));
            let dst = &mut out[at + 1..at + 17];
            _mm_storeu_si128(dst.as_mut_ptr().cast(), _mm256_castsi256_si128(bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::has_avx2;
    use crate::v1::kernel::{SCRATCH, decode_row};
    use crate::v1::row::{pack_row, read_header};

    /// Compiles the force-inlined kernel with AVX2 enabled, as the band decoders do.
    #[target_feature(enable = "avx2")]
    fn row_avx2(src: &[u8], nbit: u8, base: u8, w: usize, prev: &[u8; PAD], out: &mut [u8; PAD]) {
        // SAFETY: this function is AVX2-enabled.
        unsafe { decode_row_avx2(src, nbit, base, w, prev, out) }
    }

    #[test]
    fn avx2_row_kernel_matches_portable_kernel() {
        if !has_avx2() {
            return;
        }
        let mut s = 0x9e37_79b9_u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for w in 1..=255 {
            for nbit in 0..=8u32 {
                for trial in 0..3 {
                    let vals: Vec<u8> = (0..w).map(|_| (rnd() % (1 << nbit)) as u8).collect();
                    let mut packed = Vec::new();
                    pack_row(&vals, &mut packed);
                    let (nb, base) = read_header(&packed);
                    // Junk after the row must not matter: the kernels read past it.
                    let mut src = [0u8; SCRATCH];
                    for b in src.iter_mut() {
                        *b = rnd() as u8;
                    }
                    src[..packed.len()].copy_from_slice(&packed);
                    // Row 0 (zero previous row) and rows after a random one, with small values in the
                    // last trial so that edge ties are common.
                    let mut prev = [0u8; PAD];
                    if trial > 0 {
                        for p in prev[1..w + 1].iter_mut() {
                            *p = if trial == 2 {
                                rnd() as u8 % 4
                            } else {
                                rnd() as u8
                            };
                        }
                    }
                    let (mut want, mut got) = ([0u8; PAD], [0u8; PAD]);
                    decode_row(&src, nb, base, w, trial == 0, &prev, &mut want);
                    // SAFETY: AVX2 checked above.
                    unsafe { row_avx2(&src, nb, base, w, &prev, &mut got) };
                    assert_eq!(
                        got[1..w + 1],
                        want[1..w + 1],
                        "w {w} nbit {nbit} trial {trial}"
                    );
                }
            }
        }
    }
}
