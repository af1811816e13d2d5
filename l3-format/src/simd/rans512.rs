// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! The v2 rANS step on AVX-512 (tested against the portable decoder and the AVX2 one): the same chunk
//! decoder as `crate::simd::v2` with each chunk's 32 lane states in two 16-lane registers instead of four
//! 8-lane ones. Besides halving the instructions of the arithmetic, AVX-512 has what the AVX2 step builds
//! from tables: the lanes that need a word compare into a mask register, and `vpexpandd` hands them
//! consecutive words in lane order (the AVX2 step loads a permutation by the mask), `vpgatherdd` reads
//! sixteen table entries at once. Used only where the hardware gather is fast
//! ([`crate::simd::fast_gather`]): elsewhere its sixteen reads cost more than the scalar loads of the
//! AVX2 step.

use super::v2::{LaneStates, Lanes, Lookup, decode_chunks};
use crate::error::{Error, PatchId};
use crate::v2::ans::{LANES, PROB_BITS, RANS_L, Store, Tables};
use std::arch::x86_64::*;

/// 32 lanes as two AVX-512 registers per chunk (lanes 0..16 and 16..32).
pub(crate) struct Zmm<const K: usize>([[__m512i; 2]; K]);

/// Decodes lanes 16h..16h+16 of a step (`c16`: their 16 relative context bytes; `active` lanes in the
/// step) and returns their decode-table entries (the symbol in the high byte of each 32-bit lane), like
/// the AVX2 `step_vec` on twice the lanes.
#[inline(always)]
unsafe fn step_half<const FULL: bool>(
    l: &Lanes<'_>,
    state: &mut __m512i,
    pos: &mut usize,
    h: usize,
    c16: __m128i,
    active: usize,
    look: &Lookup<'_>,
) -> __m512i {
    // SAFETY (whole body): AVX-512 intrinsics on registers. Table reads: the indices are those of the
    // AVX2 step (relative contexts below the plane's count, slots below 4096), which `decode_chunks`
    // checked lie inside `dec` on entry. Word loads: see `Lanes::next16`.
    unsafe {
        let mask = _mm512_set1_epi32(0xfff);
        let rel = _mm512_cvtepu8_epi32(c16);
        let x = *state;
        let slot = _mm512_and_si512(x, mask);
        let base = _mm512_broadcast_i32x4(_mm256_castsi256_si128(look.base));
        let low = _mm512_broadcast_i32x4(_mm256_castsi256_si128(look.low));
        let idx = _mm512_add_epi32(
            _mm512_add_epi32(base, _mm512_sll_epi32(rel, look.up)),
            _mm512_srl_epi32(slot, look.down),
        );
        let e = _mm512_i32gather_epi32::<4>(idx, look.dec.as_ptr().cast());
        // e = symbol << 24 | (f − 1) << 12 | (first slot − cum); x' = (f − 1)·q + q + offset.
        let q = _mm512_srli_epi32::<PROB_BITS>(x);
        let fm1 = _mm512_and_si512(_mm512_srli_epi32::<12>(e), mask);
        let off = _mm512_add_epi32(_mm512_and_si512(e, mask), _mm512_and_si512(slot, low));
        let mut nx = _mm512_add_epi32(_mm512_add_epi32(_mm512_mullo_epi32(fm1, q), q), off);
        let mut need = _mm512_cmplt_epu32_mask(nx, _mm512_set1_epi32(RANS_L as i32));
        if !FULL && active < 16 * h + 16 {
            let on = ((1u32 << (active - 16 * h)) - 1) as __mmask16;
            need &= on;
            nx = _mm512_mask_blend_epi32(on, x, nx);
        }
        // The lanes that need a word take the next ones in lane order.
        let w = _mm512_maskz_expand_epi32(need, _mm512_cvtepu16_epi32(l.next16(*pos)));
        *state = _mm512_mask_or_epi32(nx, need, _mm512_slli_epi32::<16>(nx), w);
        *pos += need.count_ones() as usize;
        e
    }
}

impl<const K: usize> LaneStates<K> for Zmm<K> {
    #[inline(always)]
    unsafe fn load(x0: &[[u32; LANES]; K]) -> Self {
        // SAFETY: AVX-512 loads of 16 lanes from 32-lane arrays.
        unsafe {
            let mut x = [[_mm512_setzero_si512(); 2]; K];
            for k in 0..K {
                for h in 0..2 {
                    x[k][h] = _mm512_loadu_si512(x0[k][16 * h..16 * h + 16].as_ptr().cast());
                }
            }
            Zmm(x)
        }
    }

    #[inline(always)]
    unsafe fn step<const FULL: bool>(
        &mut self,
        l: &[Lanes<'_>; K],
        pos: &mut [usize; K],
        ctx: &[__m256i; K],
        active: usize,
        look: &Lookup<'_>,
    ) -> [__m256i; K] {
        let active = if FULL { LANES } else { active };
        // SAFETY: AVX-512 intrinsics on registers; `step_half` as documented there.
        unsafe {
            let mut e = [[_mm512_setzero_si512(); 2]; K];
            // The two halves written out (not a loop) so that the states stay in registers; the chunks'
            // halves interleave so that one's table reads overlap another's arithmetic.
            for k in 0..K {
                let c16 = _mm256_castsi256_si128(ctx[k]);
                e[k][0] =
                    step_half::<FULL>(&l[k], &mut self.0[k][0], &mut pos[k], 0, c16, active, look);
            }
            if FULL || active > 16 {
                for k in 0..K {
                    let c16 = _mm256_extracti128_si256::<1>(ctx[k]);
                    e[k][1] = step_half::<FULL>(
                        &l[k],
                        &mut self.0[k][1],
                        &mut pos[k],
                        1,
                        c16,
                        active,
                        look,
                    );
                }
            }
            let mut out = [_mm256_setzero_si256(); K];
            for k in 0..K {
                let lo = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<24>(e[k][0]));
                let hi = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<24>(e[k][1]));
                out[k] = _mm256_set_m128i(hi, lo);
            }
            out
        }
    }

    #[inline(always)]
    unsafe fn states(&self) -> [[u32; LANES]; K] {
        let mut xs = [[0u32; LANES]; K];
        // SAFETY: AVX-512 stores of 16 lanes into 32-lane arrays.
        unsafe {
            for (x, regs) in xs.iter_mut().zip(&self.0) {
                for (h, &r) in regs.iter().enumerate() {
                    _mm512_storeu_si512(x[16 * h..16 * h + 16].as_mut_ptr().cast(), r);
                }
            }
        }
        xs
    }
}

/// The AVX-512 chunk decoder: `crate::simd::v2::decode_chunks_avx2` with [`Zmm`] states. A function of
/// its own (not inlined into the AVX2 decoder) because it is compiled for AVX-512; one call decodes whole
/// chunks, so the call costs nothing measurable.
///
/// # Safety
/// The CPU must support AVX2, BMI2, POPCNT, AVX-512F, AVX-512BW and AVX-512VL ([`usable`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,bmi2,popcnt,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn decode_chunks_avx512<const K: usize>(
    chunks: [&[u8]; K],
    t: Tables<'_>,
    pw: usize,
    ph: usize,
    c: usize,
    store: Store,
    z: &mut [&mut [u8]; K],
    sel: &mut [&mut [u8]; K],
    words: &mut [Vec<u8>],
    ids: [PatchId; K],
) -> Result<(), Error> {
    // SAFETY: the features are enabled on this function, the caller's guarantee.
    unsafe { decode_chunks::<K, Zmm<K>>(chunks, t, pw, ph, c, store, z, sel, words, ids) }
}

/// Whether this CPU runs [`decode_chunks_avx512`], and fast: the instructions, and a hardware gather
/// that is not the slow, mitigated kind ([`crate::simd::fast_gather`]).
pub(crate) fn usable() -> bool {
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE.get_or_init(|| {
        crate::simd::has_avx2_bmi2()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && crate::simd::fast_gather()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v2::ans::decode_chunk_scalar;
    use crate::v2::front::runs;
    use crate::{Choices, EncodeOptions, Format, L3File, Profile, encode_with};

    /// The AVX2 chunk decoder compiled for AVX2 (as the decoder is), for the comparison.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,bmi2,popcnt")]
    unsafe fn avx2_chunks<const K: usize>(
        chunks: [&[u8]; K],
        t: Tables<'_>,
        pw: usize,
        ph: usize,
        c: usize,
        store: Store,
        z: &mut [&mut [u8]; K],
        sel: &mut [&mut [u8]; K],
        words: &mut [Vec<u8>],
        ids: [PatchId; K],
    ) -> Result<(), Error> {
        // SAFETY: the caller checked the features.
        unsafe {
            crate::simd::v2::decode_chunks_avx2::<K>(
                chunks, t, pw, ph, c, store, z, sel, words, ids,
            )
        }
    }

    /// What a chunk decoder produced: its result and, when it succeeded, the codes and selectors of every
    /// row (the bytes past a row are scratch and may differ between decoders).
    type Decoded = Result<Vec<Vec<u8>>, Error>;

    fn rows_of(z: &[u8], sel: &[u8], store: Store, pw: usize, ph: usize, c: usize) -> Vec<Vec<u8>> {
        let mut rows = Vec::new();
        for p in 0..c {
            for r in 0..ph {
                rows.push(z[store.zrow(p, r)..][..pw + 2].to_vec());
                if r > 0 {
                    rows.push(sel[store.srow(p, r)..][..runs(pw)].to_vec());
                }
            }
        }
        rows
    }

    /// Decodes chunks `chunks` (each a `pw`×`ph` patch) by the portable, AVX2 and AVX-512 decoders, two
    /// at a time when there are two; returns each decoder's outcome per chunk.
    fn decode_three(
        chunks: &[&[u8]],
        t: Tables<'_>,
        (pw, ph, c): (usize, usize, usize),
        store: Store,
    ) -> [Vec<Decoded>; 3] {
        let fresh = || (vec![0u8; store.z_len(c)], vec![0u8; store.sel_len(c)]);
        let ids: Vec<PatchId> = (0..chunks.len())
            .map(|patch| PatchId { channel: 0, patch })
            .collect();
        let portable = chunks
            .iter()
            .zip(&ids)
            .map(|(ch, &id)| {
                let (mut z, mut s) = fresh();
                decode_chunk_scalar(ch, t, pw, ph, c, store, &mut z, &mut s, id)
                    .map(|()| rows_of(&z, &s, store, pw, ph, c))
            })
            .collect();
        let mut vector = [Vec::new(), Vec::new()];
        for (which, out) in vector.iter_mut().enumerate() {
            let (mut z0, mut s0) = fresh();
            let (mut z1, mut s1) = fresh();
            let mut words = vec![Vec::new(), Vec::new()];
            let r = if chunks.len() == 2 {
                let mut z: [&mut [u8]; 2] = [&mut z0, &mut z1];
                let mut s: [&mut [u8]; 2] = [&mut s0, &mut s1];
                let (c2, i2) = ([chunks[0], chunks[1]], [ids[0], ids[1]]);
                // SAFETY: the test runs only where `usable` said the CPU has every feature.
                unsafe {
                    if which == 0 {
                        avx2_chunks::<2>(c2, t, pw, ph, c, store, &mut z, &mut s, &mut words, i2)
                    } else {
                        decode_chunks_avx512::<2>(
                            c2, t, pw, ph, c, store, &mut z, &mut s, &mut words, i2,
                        )
                    }
                }
            } else {
                let mut z: [&mut [u8]; 1] = [&mut z0];
                let mut s: [&mut [u8]; 1] = [&mut s0];
                let (c1, i1) = ([chunks[0]], [ids[0]]);
                // SAFETY: as above.
                unsafe {
                    if which == 0 {
                        avx2_chunks::<1>(c1, t, pw, ph, c, store, &mut z, &mut s, &mut words, i1)
                    } else {
                        decode_chunks_avx512::<1>(
                            c1, t, pw, ph, c, store, &mut z, &mut s, &mut words, i1,
                        )
                    }
                }
            };
            // The pair decoders stop at the first error of either chunk: compare the first error, or
            // every chunk's rows.
            *out = match r {
                Err(e) => vec![Err(e)],
                Ok(()) => [(z0, s0), (z1, s1)][..chunks.len()]
                    .iter()
                    .map(|(z, s)| Ok(rows_of(z, s, store, pw, ph, c)))
                    .collect(),
            };
        }
        let [avx2, avx512] = vector;
        [portable, avx2, avx512]
    }

    /// The first error of the portable decoder over the chunks, or every chunk's rows.
    fn first_error(v: Vec<Decoded>) -> Vec<Decoded> {
        match v.iter().find(|d| d.is_err()) {
            Some(Err(e)) => vec![Err(e.clone())],
            _ => v,
        }
    }

    fn synthetic(w: usize, h: usize, c: usize, seed: u32) -> Vec<u8> {
        let mut s = seed | 1;
        (0..w * h * c)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let (x, y) = ((i / c) % w, (i / c) / w);
                if (x / 40 + y / 30) % 3 == 0 {
                    s as u8
                } else {
                    (x + 2 * y + 50 * (i % c)) as u8 ^ (s as u8 & 3)
                }
            })
            .collect()
    }

    /// A 300×200 crop of a corpus photograph, or `None` (with the reason) where the corpus is missing.
    fn corpus_crop() -> Option<Vec<u8>> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/corpus/TwoWings.jpg");
        let img = match image::open(&path) {
            Ok(img) => img.to_rgb8(),
            Err(e) => {
                stdx::testing::skip(format!("{}: {e}", path.display()));
                return None;
            }
        };
        let (x0, y0) = (1000, 700);
        let mut px = Vec::with_capacity(300 * 200 * 3);
        for y in y0..y0 + 200 {
            for x in x0..x0 + 300 {
                px.extend_from_slice(&img.get_pixel(x, y).0);
            }
        }
        Some(px)
    }

    /// The AVX-512 step decodes every chunk exactly as the portable and AVX2 decoders do, whole and
    /// damaged (the same first error), on a photograph and on synthetic images of every channel count,
    /// with full-resolution and coarse tables, partial patches and patch pairs.
    #[test]
    fn avx512_chunks_match_portable_and_avx2() {
        if !usable() {
            stdx::testing::skip("this CPU has no AVX-512 F/BW/VL with a fast gather");
            return;
        }
        let mut images = vec![
            (synthetic(301, 177, 3, 5), 301u32, 177u32, 3u8, 64u8),
            (synthetic(130, 65, 4, 6), 130, 65, 4, 32),
            (synthetic(67, 140, 1, 7), 67, 140, 1, 128),
            (synthetic(1, 5, 3, 8), 1, 5, 3, 32),
            (synthetic(7, 3, 3, 9), 7, 3, 3, 32),
        ];
        if let Some(px) = corpus_crop() {
            images.push((px, 300, 200, 3, 128));
        }
        let mut s = 0x1234_5678u32;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for (px, w, h, c, n) in &images {
            for choices in [Choices::Reference, Choices::FastDecode] {
                let opts = EncodeOptions {
                    format: Format::V2(Profile::Ans),
                    patch_size: Some(*n),
                    choices,
                    ..EncodeOptions::default()
                };
                let file = encode_with(px, *w, *h, *c, &opts).unwrap();
                let f = L3File::parse(&file).unwrap();
                let v = f.v2().unwrap();
                let prep = v.prepared().unwrap();
                let store = Store::new(usize::from(*n));
                let per = v.g.patches_per_channel();
                for p in 0..per {
                    let r = v.g.patch_rect(p);
                    let shape = (r.w as usize, r.h as usize, usize::from(*c));
                    let pair = p + 1 < per && {
                        let r2 = v.g.patch_rect(p + 1);
                        (r2.w, r2.h) == (r.w, r.h)
                    };
                    let whole: Vec<&[u8]> = if pair {
                        vec![v.entry(p), v.entry(p + 1)]
                    } else {
                        vec![v.entry(p)]
                    };
                    for damage in 0..4 {
                        let mut chunks: Vec<Vec<u8>> = whole.iter().map(|c| c.to_vec()).collect();
                        if damage > 0 {
                            // A flipped byte, a cut-off word or a lane state below 2^16.
                            let which = rnd() as usize % chunks.len();
                            let ch = &mut chunks[which];
                            match damage {
                                1 => {
                                    let at = rnd() as usize % ch.len();
                                    ch[at] ^= 1 << (rnd() % 8);
                                }
                                2 if ch.len() > 130 => ch.truncate(ch.len() - 2),
                                _ => ch[4 * (rnd() as usize % 32) + 2..][..2].fill(0),
                            }
                        }
                        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                        let [portable, avx2, avx512] =
                            decode_three(&refs, prep.tables(), shape, store);
                        let what =
                            format!("{w}x{h}x{c} N={n} {choices:?} patch {p} damage {damage}");
                        // The vector decoders are one algorithm: the same rows or the same error.
                        assert_eq!(avx512, avx2, "{what}");
                        // The portable one checks the word count per segment rather than per plane, so
                        // a damaged chunk may fail with another error; a sound one decodes the same.
                        let want = first_error(portable);
                        assert_eq!(
                            avx2.iter().all(Result::is_ok),
                            want.iter().all(Result::is_ok),
                            "{what}"
                        );
                        if damage == 0 || want.iter().all(Result::is_ok) {
                            assert_eq!(avx2, want, "{what}");
                        }
                    }
                }
            }
        }
    }
}
