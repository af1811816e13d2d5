//! Runtime choice of instruction set for the decode loops.
//!
//! The row kernel is plain Rust written as fixed 16-lane chunks; compiled for baseline x86-64 it uses SSE2.
//! On CPUs with AVX2 the band decoders are compiled a second time with AVX2 enabled (`*_avx2` in
//! `decode.rs`, same `#[inline(always)]` source), so the predictor runs on twice as many lanes per
//! instruction. The choice is made once per band, after this run-time check.
//!
//! The AVX2 copies also use the hand-written kernels below: the row decoder [`decode_row_avx2`] and the
//! RGB/RGBA interleavers. They are `#[inline(always)] unsafe fn`s rather than `#[target_feature]` ones so
//! that they inline into the AVX2 band decoders (a call per row costs ~10 %); their contract is that the
//! CPU has AVX2. Inside, `unsafe` covers the intrinsics and unaligned loads and stores through pointers
//! taken from bounds-checked slices. Each has a test against the portable code.

#[cfg(target_arch = "x86_64")]
use crate::kernel::{PAD, window};

#[cfg(target_arch = "x86_64")]
pub(crate) mod crc;
#[cfg(target_arch = "x86_64")]
pub(crate) mod v2;

/// Whether this CPU can run the AVX2 copies (the answer is cached by `std`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Whether this CPU can run the v2 AVX2 copies, which are also compiled for BMI2 (`shlx`, `tzcnt`) and
/// `popcnt`.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2_bmi2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("popcnt")
}

/// Whether the ANS decoder's table reads should use the hardware gather (`vpgatherdd`) rather than eight
/// scalar loads. The gather wins on Intel CPUs that do without the microcode fix for Gather Data Sampling
/// (Linux reports them "Not affected", or "Vulnerable" where the fix is off): +10–14 % ANS decode on a
/// Sapphire Rapids-class Xeon. With the fix (Skylake to Ice Lake servers) gathers run several times
/// slower, and on AMD Zen 1 and Zen 3 the scalar loads measured faster, so those keep them, as does any
/// CPU whose status cannot be read.
#[cfg(target_arch = "x86_64")]
pub(crate) fn fast_gather() -> bool {
    static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAST.get_or_init(|| {
        let status =
            std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling");
        cpu_vendor() == *b"GenuineIntel"
            && status.is_ok_and(|s| s.starts_with("Not affected") || s.starts_with("Vulnerable"))
    })
}

/// The CPU's vendor string (CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...).
#[cfg(target_arch = "x86_64")]
fn cpu_vendor() -> [u8; 12] {
    let id = std::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    for (chunk, reg) in v.chunks_exact_mut(4).zip([id.ebx, id.edx, id.ecx]) {
        chunk.copy_from_slice(&reg.to_le_bytes());
    }
    v
}

/// Whether BMI2's `pdep` is a fast instruction here (Intel; AMD from Zen 3, family 19h) rather than
/// microcode (AMD before Zen 3: 15–100 ns a call on a Zen 1 EPYC). BP's group spread uses it where fast
/// (+3–6 % BP decode on a Sapphire Rapids-class Xeon over the shuffle-and-multiply form).
#[cfg(target_arch = "x86_64")]
pub(crate) fn fast_pdep() -> bool {
    static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAST.get_or_init(|| {
        let vendor = cpu_vendor();
        let eax = std::arch::x86_64::__cpuid(1).eax;
        let base = (eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((eax >> 20) & 0xff)
        } else {
            base
        };
        has_avx2_bmi2()
            && (vendor == *b"GenuineIntel" || (vendor == *b"AuthenticAMD" && family >= 0x19))
    })
}

/// Whether this CPU has the SSE4.2 `crc32` instruction.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_sse42() -> bool {
    std::arch::is_x86_feature_detected!("sse4.2")
}

/// `pshufb` masks for interleaving three 16-byte planes into 48 RGB bytes: `RGB_MASKS[plane][block][k]` is the
/// source lane of output byte `16·block + k` when it comes from `plane`, else 0x80 (writes zero).
#[cfg(target_arch = "x86_64")]
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
/// The CPU must support AVX2 (force-inlined into the AVX2 band decoder, like [`decode_row_avx2`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
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
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
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

/// Per-nbit constants of the AVX2 unpacker for eight deltas (the same for both 128-bit halves, which
/// hold groups of eight that start at the same bit phase). Delta j starts at bit `o = 4 + j·nbit` of its
/// group's first byte: `shuf` gathers bytes `o/8` and `o/8 + 1` into 16-bit lane j, where the field sits
/// at bits `s = o % 8 .. s + nbit` (≤ 15). `mullo(·, mul[j])` with `mul[j] = 2^(16 − s − nbit)` moves it to
/// the top of the lane, dropping the bits above it (AVX2 has no per-lane variable shift of 16-bit lanes),
/// and one uniform right shift by `16 − nbit` brings it down. For nbit = 0 the shift by 16 clears the lane.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(32))]
struct Unpack {
    shuf: [u8; 32],
    mul: [u16; 16],
}

#[cfg(target_arch = "x86_64")]
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
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 256;

/// Decodes one row like [`crate::kernel::decode_row`], 16 pixels per step in 16-bit AVX2 lanes, with no
/// branch on nbit (table-driven unpack), none on the edge columns (absence of TL/TR is a lane mask built
/// from the column index, SPEC §3.2) and none on row 0 (the caller's `prev` is then all zero, which
/// predicts 0 for every column). `src` must hold at least [`crate::kernel::window`] bytes.
///
/// Not a `#[target_feature]` function but `#[inline(always)]`, so that it is inlined into the AVX2 band
/// decoders (a target-feature function cannot be force-inlined, and a call per row costs ~10 %).
///
/// # Safety
/// The CPU must support AVX2. Memory safety does not depend on the caller: every access is bounds-checked.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernel::{SCRATCH, decode_row};
    use crate::row::{pack_row, read_header};

    /// Compiles the force-inlined kernel with AVX2 enabled, as the band decoders do.
    #[target_feature(enable = "avx2")]
    #[allow(unsafe_code)]
    fn row_avx2(src: &[u8], nbit: u8, base: u8, w: usize, prev: &[u8; PAD], out: &mut [u8; PAD]) {
        // SAFETY: this function is AVX2-enabled.
        unsafe { decode_row_avx2(src, nbit, base, w, prev, out) }
    }

    #[test]
    #[allow(unsafe_code)]
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

    #[test]
    #[allow(unsafe_code)]
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
