// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! AVX2 kernels of the v2 decoder, each tested against the portable code in `crate::v2`:
//!
//! - [`decode_chunks_avx2`]: the 32-lane rANS decoder of a patch chunk in the manner of htscodecs'
//!   `rANS_static32x16pr_avx2`: the 32 lane states live in four 8-lane registers; a step computes the 32
//!   contexts at once from the previous row's codes (and plane 0's), gathers each lane's symbol and
//!   (frequency, cumulative frequency), updates the states, and refills the lanes that fell below 2^16 from
//!   consecutive 16-bit words with a permutation chosen by the lanes' mask (the words are in lane order).
//! - [`reconstruct_row_avx2`]: one row from its residual codes, 32 pixels per step: TOP and AVG3 directly,
//!   GRAD and LEFT as a byte prefix sum plus the pixel to the left of the run.
//! - [`spread_bits`]: eight n-bit fields to eight bytes with a byte shuffle and 16-bit multiplies
//!   (BP's deltas).
//!
//! Like the v1 kernels they are `#[inline(always)] unsafe fn`s, inlined into the `#[target_feature]` copies
//! of the decoder in `crate::v2::decode`; their contract is that the CPU has AVX2, BMI2 and POPCNT. Memory
//! safety never depends on the caller: loads and stores go through bounds-checked slices, and every gather
//! index is bounded by the table sizes checked on entry.

use crate::error::{Error, PatchId};
use crate::simd::interleave::RGB_MASKS;
use crate::v2::ans::{self, LANES, PROB_BITS, STATE_BYTES, Store, Tables};
use crate::v2::bits::window;
use crate::v2::front::{ROW, RUN, runs};
use std::arch::x86_64::*;

/// The tables of [`spread_bits`] for each field width n ≤ 8: field i starts at bit `i·n`, in byte
/// `i·n / 8` at bit offset `s = i·n % 8`.
#[repr(C, align(16))]
struct SpreadTables {
    /// `pshufb` indices putting field i's byte and the next one into 16-bit lane i.
    pairs: [[u8; 16]; 9],
    /// Lane i's multiplier `2^(16 − s − n)` (0 when n = 0): the field moves to the lane's top bits.
    up: [[u16; 8]; 9],
    /// `2^n`: `pmulhuw` by it shifts the field down to bit 0, dropping the bits below it.
    down: [[u16; 8]; 9],
}

static SPREAD: SpreadTables = {
    let mut t = SpreadTables {
        pairs: [[0; 16]; 9],
        up: [[0; 8]; 9],
        down: [[0; 8]; 9],
    };
    let mut n = 0;
    while n <= 8 {
        let mut i = 0;
        while i < 8 {
            let bit = i * n;
            t.pairs[n][2 * i] = (bit / 8) as u8;
            t.pairs[n][2 * i + 1] = (bit / 8 + 1) as u8;
            t.up[n][i] = if n == 0 { 0 } else { 1 << (16 - bit % 8 - n) };
            t.down[n][i] = 1 << n;
            i += 1;
        }
        n += 1;
    }
    t
};

/// Eight `nb`-bit fields from the low bits of `v`, one per byte (`nb` ≤ 8; larger is taken as 8). `pdep`
/// does this in one instruction where it is fast (`pdep`, see [`crate::simd::fast_pdep`]); elsewhere a
/// byte shuffle and two 16-bit multiplies as per-lane shifts, since AMD before Zen 3 runs `pdep` as
/// microcode (15–100 ns per call, measured on a Zen 1 EPYC), which made BP decode slower than PNG there.
///
/// # Safety
/// The CPU must support SSSE3 (every AVX2 CPU does), and BMI2 when `pdep` is true.
#[inline(always)]
pub(crate) unsafe fn spread_bits(v: u64, nb: u8, pdep: bool) -> u64 {
    let n = usize::from(nb.min(8));
    if pdep {
        let mask = 0x0101_0101_0101_0101u64 * ((1u64 << n) - 1);
        // SAFETY: BMI2 is the caller's guarantee when `pdep` is true.
        return unsafe { _pdep_u64(v, mask) };
    }
    // SAFETY: SSE2/SSSE3 intrinsics on registers; aligned loads of 16-byte rows of `SPREAD`.
    unsafe {
        let src = _mm_cvtsi64_si128(v as i64);
        let pairs = _mm_shuffle_epi8(src, _mm_load_si128(SPREAD.pairs[n].as_ptr().cast()));
        let up = _mm_mullo_epi16(pairs, _mm_load_si128(SPREAD.up[n].as_ptr().cast()));
        let fields = _mm_mulhi_epu16(up, _mm_load_si128(SPREAD.down[n].as_ptr().cast()));
        _mm_cvtsi128_si64(_mm_packus_epi16(fields, fields)) as u64
    }
}

/// Shifts the bit string `src` right by `phase` (< 8) bits into `out`, `n32` blocks of 32 bytes:
/// `out[i] = src[i] >> phase | src[i + 1] << (8 − phase)`. `src` must hold `32·n32 + 1` bytes and `out`
/// `32·n32` (both are checked).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(crate) unsafe fn realign(src: &[u8], phase: u32, n32: usize, out: &mut [u8]) {
    assert!(src.len() > 32 * n32 && out.len() >= 32 * n32 && phase < 8);
    // SAFETY: AVX2 intrinsics; every load reads src[32i..32i + 33] and every store out[32i..32i + 32],
    // inside the lengths asserted above.
    unsafe {
        let (sh, up) = (
            _mm_cvtsi32_si128(phase as i32),
            _mm_cvtsi32_si128(8 - phase as i32),
        );
        let lo_mask = _mm256_set1_epi8((0xffu8 >> phase) as i8);
        let hi_mask = _mm256_set1_epi8((0xffu16 << (8 - phase)) as u8 as i8);
        for i in 0..n32 {
            let a = _mm256_loadu_si256(src.as_ptr().add(32 * i).cast());
            let b = _mm256_loadu_si256(src.as_ptr().add(32 * i + 1).cast());
            // Per 16-bit lane the shifts carry bits across the byte boundary; the masks keep each byte's own.
            let lo = _mm256_and_si256(_mm256_srl_epi16(a, sh), lo_mask);
            let hi = _mm256_and_si256(_mm256_sll_epi16(b, up), hi_mask);
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * i).cast(), _mm256_or_si256(lo, hi));
        }
    }
}

/// `CODE_AT[b]`: 2-bit code b at each of a byte's four code positions, for 16 bytes.
const CODE_AT: [[u8; 16]; 4] = {
    let mut t = [[0u8; 16]; 4];
    let mut b = 0;
    while b < 4 {
        let mut i = 0;
        while i < 16 {
            t[b][i] = (b << (2 * (i % 4))) as u8;
            i += 1;
        }
        b += 1;
    }
    t
};

/// The widths of a BP row r ≥ 1 from its 2-bit codes and the escaped widths that follow them in `rest`
/// (from bit `bit` on, 4 bits each), like `crate::v2::bp::widths_from_codes` plus its escape loop, but
/// kept in a register until one 32-byte store into `out`: escapes written byte by byte and then loaded as
/// a vector would wait for the stores to leave the store buffer. Returns Σ widths over the `ng` groups and
/// the bit after the escapes, or the first group whose width is out of range, with that width.
///
/// # Safety
/// The CPU must support AVX2 and BMI2.
#[inline(always)]
pub(crate) unsafe fn widths_avx2(
    codes: u64,
    prev: &[u8; 32],
    ng: usize,
    rest: &[u8],
    mut bit: usize,
    out: &mut [u8; 32],
) -> Result<(usize, usize), (usize, i32)> {
    // SAFETY: AVX2/BMI2 intrinsics; the loads and stores cover exactly the 32-byte arrays.
    unsafe {
        // Code byte i/4 into byte i, then each byte's own two bits compared in place (no shifts).
        let c = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(codes as i64),
            _mm256_setr_epi8(
                0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6,
                7, 7, 7, 7,
            ),
        );
        let c = _mm256_and_si256(c, bytes16(&CODE_AT[3]));
        // code 1: +1, 2: −1, 3: escape (replaced below); compares give −1 where true.
        let (plus, minus) = (
            _mm256_cmpeq_epi8(c, bytes16(&CODE_AT[1])),
            _mm256_cmpeq_epi8(c, bytes16(&CODE_AT[2])),
        );
        let mut v = _mm256_add_epi8(
            _mm256_sub_epi8(_mm256_loadu_si256(prev.as_ptr().cast()), plus),
            minus,
        );
        let live = (u64::MAX >> (64 - ng.clamp(1, 32))) as u32;
        let mut esc =
            _mm256_movemask_epi8(_mm256_cmpeq_epi8(c, bytes16(&CODE_AT[3]))) as u32 & live;
        let ok = _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(8)), v);
        let bad = !(_mm256_movemask_epi8(ok) as u32) & !esc & live;
        if bad != 0 {
            let g = bad.trailing_zeros() as usize;
            let d = [0, 1, -1, 0][((codes >> (2 * g)) & 3) as usize];
            return Err((g, i32::from(prev[g]) + d));
        }
        let lanes = _mm256_setr_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31,
        );
        while esc != 0 {
            let g = esc.trailing_zeros() as usize;
            let w = (window(rest, bit) & 15) as u8;
            if w > 8 {
                return Err((g, i32::from(w)));
            }
            let at = _mm256_cmpeq_epi8(lanes, _mm256_set1_epi8(g as i8));
            v = _mm256_blendv_epi8(v, _mm256_set1_epi8(w as i8), at);
            bit += 4;
            esc &= esc - 1;
        }
        let keep = _mm256_cmpgt_epi8(_mm256_set1_epi8(ng.min(32) as i8), lanes);
        _mm256_storeu_si256(out.as_mut_ptr().cast(), v);
        let s = _mm256_sad_epu8(_mm256_and_si256(v, keep), _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        Ok((
            (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as usize,
            bit,
        ))
    }
}

/// Σ `nbit[..ng]` (`ng` ≤ 32).
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(crate) unsafe fn sum_widths(nbit: &[u8; 32], ng: usize) -> usize {
    static KEEP: [u8; 64] = {
        let mut k = [0u8; 64];
        let mut i = 0;
        while i < 32 {
            k[i] = 0xff;
            i += 1;
        }
        k
    };
    let keep = &KEEP[32 - ng.min(32)..][..32];
    // SAFETY: AVX2 intrinsics; both loads cover exactly 32-byte slices.
    unsafe {
        let v = _mm256_and_si256(
            _mm256_loadu_si256(nbit.as_ptr().cast()),
            _mm256_loadu_si256(keep.as_ptr().cast()),
        );
        let s = _mm256_sad_epu8(v, _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as usize
    }
}

/// `PERM[m]`: for each lane i whose bit is set in the 8-bit mask m, the index of the word it takes among
/// the words loaded for the vector (the number of set bits below i).
#[repr(C, align(32))]
struct Perm([[u32; 8]; 256]);

static PERM: Perm = {
    let mut t = [[0u32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut k = 0u32;
        let mut i = 0;
        while i < 8 {
            if m & (1 << i) != 0 {
                t[m][i] = k;
                k += 1;
            }
            i += 1;
        }
        m += 1;
    }
    Perm(t)
};

/// Nibble lookup tables of a byte's bitlen capped at 7 (the residual bucket): low nibble, and high nibble
/// (4 + bitlen, 0 for 0); the larger of the two is the answer.
const BUCKET_LO: [u8; 16] = [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4];
const BUCKET_HI: [u8; 16] = [0, 5, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7];
/// The same for bitlen capped at 4 (the class of plane 0's code).
const CLASS_LO: [u8; 16] = [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4];
const CLASS_HI: [u8; 16] = [0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4];
/// 5·b for a bucket b ≤ 8.
const TIMES_FIVE: [u8; 16] = [0, 5, 10, 15, 20, 25, 30, 35, 40, 0, 0, 0, 0, 0, 0, 0];

/// Constants of the context computation.
struct CtxConsts {
    bucket: [__m256i; 2],
    class: [__m256i; 2],
    five: __m256i,
    nib: __m256i,
    one: __m256i,
    used_lo: __m256i,
    used_hi: __m256i,
    bit: __m256i,
    fifteen: __m256i,
}

/// Every byte's bitlen, capped by the nibble tables `lut` (low, high).
#[inline(always)]
unsafe fn bitlen8(v: __m256i, lut: &[__m256i; 2], nib: __m256i) -> __m256i {
    // SAFETY: AVX2 intrinsics on registers (the caller's guarantee).
    unsafe {
        let lo = _mm256_shuffle_epi8(lut[0], _mm256_and_si256(v, nib));
        let hi = _mm256_shuffle_epi8(lut[1], _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        _mm256_max_epu8(lo, hi)
    }
}

/// Loads 32 bytes at `s[at..at + 32]` (bounds-checked).
#[inline(always)]
unsafe fn load32(s: &[u8], at: usize) -> __m256i {
    let b = &s[at..at + 32];
    // SAFETY: `b` holds 32 bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// Stores 32 bytes at `s[at..at + 32]` (bounds-checked).
#[inline(always)]
unsafe fn store32(s: &mut [u8], at: usize, v: __m256i) {
    let b = &mut s[at..at + 32];
    // SAFETY: `b` holds 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(b.as_mut_ptr().cast(), v) }
}

/// The 32 residual contexts of row r ≥ 1 of plane `p` at columns c0..c0+32, relative to the plane's first
/// context: from the previous row's codes `zp` (padded: column c at c + 1) and plane 0's codes of this row
/// `z0` (same padding).
#[inline(always)]
unsafe fn contexts32(zp: &[u8], z0: &[u8], c0: usize, p: usize, k: &CtxConsts) -> __m256i {
    // SAFETY: AVX2 intrinsics; loads through `load32`.
    unsafe {
        let tl = load32(zp, c0);
        let t = load32(zp, c0 + 1);
        let tr = load32(zp, c0 + 2);
        // (TL + 2T + TR + 2) >> 2 = avg(floor((TL + TR) / 2), T), exactly, in bytes.
        let half = _mm256_sub_epi8(
            _mm256_avg_epu8(tl, tr),
            _mm256_and_si256(_mm256_xor_si256(tl, tr), k.one),
        );
        let avg = _mm256_avg_epu8(half, t);
        row_context(bitlen8(avg, &k.bucket, k.nib), z0, c0, p, k)
    }
}

/// Contexts relative to plane p's first from bucket bytes `b`: plane 0's contexts are b, plane p's
/// first + 5b + min(bitlen(z0), 4) (`ans::residual_context`).
#[inline(always)]
unsafe fn row_context(b: __m256i, z0: &[u8], c0: usize, p: usize, k: &CtxConsts) -> __m256i {
    // SAFETY: AVX2 intrinsics; loads through `load32`.
    unsafe {
        if p == 0 {
            return b;
        }
        let class = bitlen8(load32(z0, c0 + 1), &k.class, k.nib);
        _mm256_add_epi8(_mm256_shuffle_epi8(k.five, b), class)
    }
}

/// Lanes (bits of the result) whose context byte has no table.
#[inline(always)]
unsafe fn unused_lanes(ctx: __m256i, k: &CtxConsts) -> u32 {
    // SAFETY: AVX2 intrinsics on registers.
    unsafe {
        let byte = _mm256_and_si256(_mm256_srli_epi16(ctx, 3), _mm256_set1_epi8(31));
        let lo = _mm256_shuffle_epi8(k.used_lo, byte);
        let hi = _mm256_shuffle_epi8(k.used_hi, byte);
        let m = _mm256_blendv_epi8(lo, hi, _mm256_cmpgt_epi8(byte, k.fifteen));
        let bit = _mm256_shuffle_epi8(k.bit, _mm256_and_si256(ctx, _mm256_set1_epi8(7)));
        let none = _mm256_cmpeq_epi8(_mm256_and_si256(m, bit), _mm256_setzero_si256());
        _mm256_movemask_epi8(none) as u32
    }
}

/// 16 bytes broadcast to both halves of a register.
#[inline(always)]
unsafe fn bytes16(a: &[u8]) -> __m256i {
    // SAFETY: a 16-byte slice, unaligned load.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(a[..16].as_ptr().cast())) }
}

/// An error naming the first of the `active` lanes whose context has no table, if any.
#[inline(always)]
unsafe fn check_used(ctx: __m256i, active: usize, k: &CtxConsts, id: PatchId) -> Result<(), Error> {
    // SAFETY: AVX2 intrinsics; the store goes to a local array.
    unsafe {
        let m = unused_lanes(ctx, k) & (u32::MAX >> (32 - active.clamp(1, 32)));
        if m != 0 {
            let mut b = [0u8; 32];
            _mm256_storeu_si256(b.as_mut_ptr().cast(), ctx);
            return Err(Error::UnusedContext {
                patch: id,
                context: usize::from(b[m.trailing_zeros() as usize]),
            });
        }
    }
    Ok(())
}

/// Bytes of zeros after a chunk's words in [`Lanes`]: the widest refill load (16 words) at the last word
/// stays inside the buffer.
const WORD_PAD: usize = 32;

/// Where a chunk's refill words come from: a copy of the chunk's words followed by [`WORD_PAD`] zero
/// bytes, so that a load of 8 (16) words at `min(pos, nwords)` never leaves the buffer and a damaged chunk
/// reads zeros past its end (the decoder reports it once the plane is done). The lane states and the word
/// cursor are locals of the decode loop, so that they stay in registers.
pub(crate) struct Lanes<'a> {
    padded: &'a [u8],
    nwords: usize,
}

impl<'a> Lanes<'a> {
    /// Copies a chunk's `words` into `buf` (reused across calls) and pads it.
    fn fill(buf: &mut Vec<u8>, words: &[u8]) {
        buf.clear();
        buf.extend_from_slice(&words[..words.len() / 2 * 2]);
        buf.extend_from_slice(&[0; WORD_PAD]);
    }

    /// The words of a buffer [`Lanes::fill`] filled.
    fn new(padded: &'a [u8]) -> Self {
        Lanes {
            padded,
            nwords: padded.len().saturating_sub(WORD_PAD) / 2,
        }
    }

    /// The 8 words from word `pos` on (zeros past the end).
    #[inline(always)]
    unsafe fn next8(&self, pos: usize) -> __m128i {
        // SAFETY: 2·min(pos, nwords) + 16 ≤ 2·nwords + WORD_PAD = the buffer's length.
        unsafe { _mm_loadu_si128(self.padded.as_ptr().add(2 * pos.min(self.nwords)).cast()) }
    }

    /// The 16 words from word `pos` on (zeros past the end).
    #[inline(always)]
    pub(crate) unsafe fn next16(&self, pos: usize) -> __m256i {
        // SAFETY: 2·min(pos, nwords) + 32 ≤ 2·nwords + WORD_PAD = the buffer's length.
        unsafe { _mm256_loadu_si256(self.padded.as_ptr().add(2 * pos.min(self.nwords)).cast()) }
    }
}

const PROB_BITS_I: i32 = PROB_BITS as i32;

/// `dec[idx[i]]` for each lane (indices bounded by the caller): eight scalar loads from indices taken out
/// of the register 64 bits at a time. On Zen 3 a hardware gather of eight lanes has about the same latency
/// (~25 cycles) but costs more issue slots (one per ~10–14 cycles against ~9 for this form, measured),
/// and the decoder has many lookups in flight; where the hardware gather is fast, [`Lookup`] says so
/// (see [`crate::simd::fast_gather`]).
#[inline(always)]
unsafe fn gather_dec(dec: &[u32], idx: __m256i) -> __m256i {
    // SAFETY: see `step_vec`: every index is within `dec`.
    unsafe {
        let t = dec.as_ptr();
        let lo = _mm256_castsi256_si128(idx);
        let hi = _mm256_extracti128_si256::<1>(idx);
        let q = [
            _mm_cvtsi128_si64(lo) as u64,
            _mm_extract_epi64::<1>(lo) as u64,
            _mm_cvtsi128_si64(hi) as u64,
            _mm_extract_epi64::<1>(hi) as u64,
        ];
        let ld = |q: u64| {
            (
                *t.add((q & 0xffff_ffff) as usize) as i32,
                *t.add((q >> 32) as usize) as i32,
            )
        };
        let (e0, e1) = ld(q[0]);
        let (e2, e3) = ld(q[1]);
        let (e4, e5) = ld(q[2]);
        let (e6, e7) = ld(q[3]);
        _mm256_setr_epi32(e0, e1, e2, e3, e4, e5, e6, e7)
    }
}

/// How the lanes of a step find their decode-table entries: `base + (rel << (12 − k)) + (slot >> k)`, rel
/// being a lane's context less its plane's first (0 for selectors), and the offset within the symbol
/// adds `slot & low` (see `AnsTables::decode_table`); `hardware`: read them with `vpgatherdd`.
#[derive(Clone, Copy)]
pub(crate) struct Lookup<'t> {
    pub(crate) dec: &'t [u32],
    pub(crate) base: __m256i,
    pub(crate) up: __m128i,
    pub(crate) down: __m128i,
    pub(crate) low: __m256i,
    hardware: bool,
}

impl<'t> Lookup<'t> {
    /// The lookup of plane table `pt`'s residual (`selector` false) or selector contexts in `dec`.
    #[inline(always)]
    unsafe fn new(dec: &'t [u32], pt: &ans::PlaneTable, selector: bool, hardware: bool) -> Self {
        let base = if selector {
            pt.selector_base
        } else {
            pt.residual_base
        };
        // SAFETY: AVX2 intrinsics on registers (the caller's guarantee).
        unsafe {
            Lookup {
                dec,
                base: _mm256_set1_epi32(base as i32),
                up: _mm_cvtsi32_si128((PROB_BITS - pt.shift) as i32),
                down: _mm_cvtsi32_si128(pt.shift as i32),
                low: _mm256_set1_epi32((1i32 << pt.shift) - 1),
                hardware,
            }
        }
    }
}

/// Decodes lanes 8v..8v+8 of a step (`c8`: their 8 relative context bytes in the low half; `active` lanes
/// in the step) and returns their decode-table entries (the symbol in the high byte of each 32-bit lane).
#[inline(always)]
unsafe fn step_vec(
    l: &Lanes<'_>,
    state: &mut __m256i,
    pos: &mut usize,
    v: usize,
    c8: __m128i,
    active: usize,
    look: &Lookup<'_>,
) -> __m256i {
    // SAFETY (whole body): AVX2 intrinsics. Table reads: relative contexts stay below the plane's context
    // count by construction and slots are < 4096, and `decode_chunks_avx2` checked on entry that every
    // plane's tables lie inside `dec`, so each read does. Word loads: see `Lanes::next8`.
    unsafe {
        let rel = _mm256_cvtepu8_epi32(c8);
        let x = *state;
        let slot = _mm256_and_si256(x, _mm256_set1_epi32(0xfff));
        let idx = _mm256_add_epi32(
            _mm256_add_epi32(look.base, _mm256_sll_epi32(rel, look.up)),
            _mm256_srl_epi32(slot, look.down),
        );
        let e = if look.hardware {
            _mm256_i32gather_epi32::<4>(look.dec.as_ptr().cast(), idx)
        } else {
            gather_dec(look.dec, idx)
        };
        // e = symbol << 24 | (f − 1) << 12 | (first slot − cum); the offset adds slot's low k bits.
        // x' = f·(x >> 12) + offset = (f − 1)·q + q + offset.
        let mask = _mm256_set1_epi32(0xfff);
        let q = _mm256_srli_epi32::<PROB_BITS_I>(x);
        let fm1 = _mm256_and_si256(_mm256_srli_epi32::<12>(e), mask);
        let off = _mm256_add_epi32(_mm256_and_si256(e, mask), _mm256_and_si256(slot, look.low));
        let mut nx = _mm256_add_epi32(_mm256_add_epi32(_mm256_mullo_epi32(fm1, q), q), off);
        let mut need = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(nx), _mm256_setzero_si256());
        let first = 8 * v;
        if active < first + 8 {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let on = _mm256_cmpgt_epi32(_mm256_set1_epi32((active - first) as i32), lane);
            need = _mm256_and_si256(need, on);
            nx = _mm256_blendv_epi8(x, nx, on);
        }
        let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
        let perm = _mm256_load_si256(PERM.0[m].as_ptr().cast());
        let w = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(l.next8(*pos)), perm);
        let renorm = _mm256_or_si256(_mm256_slli_epi32::<16>(nx), w);
        *state = _mm256_blendv_epi8(nx, renorm, need);
        *pos += m.count_ones() as usize;
        e
    }
}

/// One step of up to 32 lanes (`active`, from lane 0) in each of `K` chunks, the chunks' vectors
/// interleaved so that one chunk's table reads overlap another's arithmetic. Returns each chunk's 32 symbols.
#[inline(always)]
unsafe fn step<const K: usize, const FULL: bool>(
    l: &[Lanes<'_>; K],
    x: &mut [[__m256i; 4]; K],
    pos: &mut [usize; K],
    ctx: &[__m256i; K],
    active: usize,
    look: &Lookup<'_>,
) -> [__m256i; K] {
    // A full step has all 32 lanes: the partial-lane masks fold away.
    let active = if FULL { LANES } else { active };
    // SAFETY: AVX2 intrinsics on registers; `step_vec` as documented there.
    unsafe {
        let mut syms = [[_mm256_setzero_si256(); 4]; K];
        let mut halves = [[_mm_setzero_si128(); 2]; K];
        for k in 0..K {
            halves[k] = [
                _mm256_castsi256_si128(ctx[k]),
                _mm256_extracti128_si256::<1>(ctx[k]),
            ];
        }
        // Written out four times (not a loop) so that the lane states stay in registers.
        macro_rules! vector {
            ($v:literal) => {
                if FULL || 8 * $v < active {
                    for k in 0..K {
                        let h = halves[k][$v / 2];
                        let c8 = if $v & 1 == 0 {
                            h
                        } else {
                            _mm_srli_si128::<8>(h)
                        };
                        syms[k][$v] =
                            step_vec(&l[k], &mut x[k][$v], &mut pos[k], $v, c8, active, look);
                    }
                }
            };
        }
        vector!(0);
        vector!(1);
        vector!(2);
        vector!(3);
        let mut out = [_mm256_setzero_si256(); K];
        for k in 0..K {
            // 4 × 8 u32 symbols (low bytes) to 32 bytes in lane order.
            let lo = |v: __m256i| _mm256_srli_epi32::<24>(v);
            let a = _mm256_packus_epi32(lo(syms[k][0]), lo(syms[k][1]));
            let b = _mm256_packus_epi32(lo(syms[k][2]), lo(syms[k][3]));
            let bytes = _mm256_packus_epi16(a, b);
            out[k] = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        }
        out
    }
}

/// The lane states of `K` chunks held in vector registers, and the decode step over them: four 8-lane
/// AVX2 registers per chunk here ([`Ymm`]), two 16-lane AVX-512 ones in `crate::simd::rans512`. The rest
/// of the chunk decoder (contexts, segments, checks) is the same for both ([`decode_chunks`]).
pub(crate) trait LaneStates<const K: usize>: Sized {
    /// The chunks' initial states, lane order.
    ///
    /// # Safety
    /// The CPU must have the instructions of the implementation.
    unsafe fn load(x0: &[[u32; LANES]; K]) -> Self;
    /// One step of up to 32 lanes (`active`, from lane 0) in each chunk, contexts relative to the plane's
    /// first in `ctx` (lane i in byte i); returns each chunk's 32 symbols.
    ///
    /// # Safety
    /// As [`LaneStates::load`]; `look` must read inside its table (see `step_vec`).
    unsafe fn step<const FULL: bool>(
        &mut self,
        l: &[Lanes<'_>; K],
        pos: &mut [usize; K],
        ctx: &[__m256i; K],
        active: usize,
        look: &Lookup<'_>,
    ) -> [__m256i; K];
    /// The states, lane order.
    ///
    /// # Safety
    /// As [`LaneStates::load`].
    unsafe fn states(&self) -> [[u32; LANES]; K];
}

/// 32 lanes as four AVX2 registers per chunk.
pub(crate) struct Ymm<const K: usize>([[__m256i; 4]; K]);

impl<const K: usize> LaneStates<K> for Ymm<K> {
    #[inline(always)]
    unsafe fn load(x0: &[[u32; LANES]; K]) -> Self {
        // SAFETY: AVX2 loads of 8 lanes from 32-lane arrays.
        unsafe {
            let mut x = [[_mm256_setzero_si256(); 4]; K];
            for k in 0..K {
                for v in 0..4 {
                    x[k][v] = _mm256_loadu_si256(x0[k][8 * v..8 * v + 8].as_ptr().cast());
                }
            }
            Ymm(x)
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
        // SAFETY: the caller's guarantees are `step`'s.
        unsafe { step::<K, FULL>(l, &mut self.0, pos, ctx, active, look) }
    }

    #[inline(always)]
    unsafe fn states(&self) -> [[u32; LANES]; K] {
        let mut xs = [[0u32; LANES]; K];
        // SAFETY: AVX2 stores of 8 lanes into 32-lane arrays.
        unsafe {
            for (x, regs) in xs.iter_mut().zip(&self.0) {
                for (v, &r) in regs.iter().enumerate() {
                    _mm256_storeu_si256(x[8 * v..8 * v + 8].as_mut_ptr().cast(), r);
                }
            }
        }
        xs
    }
}

/// Whether the vector decoder's table reads stay inside `t` for planes `0..c` (see `step_vec`) and the
/// stores inside `store`'s row padding; the scalar decoder handles what does not.
fn vector_tables_fit(t: Tables<'_>, c: usize, store: Store) -> bool {
    let fits = |p: usize| {
        let pt = &t.planes[p];
        let (lo, hi) = ans::residual_context_range(p);
        let per = (1usize << PROB_BITS) >> pt.shift.min(PROB_BITS);
        pt.shift <= ans::MAX_TABLE_SHIFT
            && pt.first_context as usize == lo
            && pt.residual_base as usize + (hi + 1 - lo) * per <= t.dec.len()
            && pt.selector_base as usize + per <= t.dec.len()
    };
    (0..c).all(fits) && store.zs >= store.n + 32
}

impl CtxConsts {
    /// The constants of the context computation, with `t`'s used-context bitmap.
    #[inline(always)]
    unsafe fn new(t: Tables<'_>) -> CtxConsts {
        let mut used = [0u8; 32];
        for (i, u) in used.iter_mut().enumerate() {
            *u = (t.used[i / 8] >> (8 * (i % 8))) as u8;
        }
        // SAFETY: AVX2 register set-up and 16-byte loads from arrays of 16 or more bytes.
        unsafe {
            CtxConsts {
                bucket: [bytes16(&BUCKET_LO), bytes16(&BUCKET_HI)],
                class: [bytes16(&CLASS_LO), bytes16(&CLASS_HI)],
                five: bytes16(&TIMES_FIVE),
                nib: _mm256_set1_epi8(15),
                one: _mm256_set1_epi8(1),
                used_lo: bytes16(&used[..16]),
                used_hi: bytes16(&used[16..]),
                bit: bytes16(&[1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128]),
                fifteen: _mm256_set1_epi8(15),
            }
        }
    }
}

/// Decodes every symbol of `K` patch chunks of the same shape (`pw`×`ph`, `c` planes) like
/// [`ans::decode_chunk_scalar`] does one: chunk k into `z[k]`/`sel[k]` laid out as `store` says.
/// Decoding two chunks at once keeps twice as many table reads in flight.
///
/// # Safety
/// The CPU must support AVX2, BMI2 and POPCNT.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn decode_chunks_avx2<const K: usize>(
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
    // SAFETY: the caller's guarantees.
    unsafe { decode_chunks::<K, Ymm<K>>(chunks, t, pw, ph, c, store, z, sel, words, ids) }
}

/// [`decode_chunks_avx2`] with the lane states and step of `S`.
///
/// # Safety
/// The CPU must support AVX2, BMI2, POPCNT and the instructions of `S`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn decode_chunks<const K: usize, S: LaneStates<K>>(
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
    if words.len() < K || !vector_tables_fit(t, c, store) {
        for k in 0..K {
            ans::decode_chunk_scalar(chunks[k], t, pw, ph, c, store, z[k], sel[k], ids[k])?;
        }
        return Ok(());
    }
    let mut x0 = [[0u32; LANES]; K];
    for k in 0..K {
        x0[k] = ans::read_states(chunks[k], ids[k])?;
    }
    // SAFETY (whole body): AVX2 intrinsics on registers; memory through slices and `step_vec` (see there).
    // No closures here: a closure would be compiled without the caller's target features.
    unsafe {
        for (buf, chunk) in words.iter_mut().zip(chunks) {
            Lanes::fill(buf, &chunk[STATE_BYTES..]);
        }
        let l: [Lanes<'_>; K] = std::array::from_fn(|k| Lanes::new(&words[k]));
        let mut x = S::load(&x0);
        let mut pos = [0usize; K];
        let kc = CtxConsts::new(t);
        let nsel = runs(pw);
        let hardware = crate::simd::fast_gather();
        let mut sbuf = [[0u8; 8 * 256 + 32]; K];
        for p in 0..c {
            // The selector segment: one context.
            let n = (ph - 1) * nsel;
            if n > 0 {
                let sctx = _mm256_set1_epi8(ans::selector_context(p) as i8);
                check_used(sctx, 1, &kc, ids[0])?;
            }
            let (sel_look, res_look) = (
                Lookup::new(t.dec, &t.planes[p], true, hardware),
                Lookup::new(t.dec, &t.planes[p], false, hardware),
            );
            let first = _mm256_set1_epi8(t.planes[p].first_context as i8);
            let zero = [_mm256_setzero_si256(); K];
            for j in (0..n).step_by(LANES) {
                let s = if n - j >= LANES {
                    x.step::<true>(&l, &mut pos, &zero, LANES, &sel_look)
                } else {
                    x.step::<false>(&l, &mut pos, &zero, n - j, &sel_look)
                };
                for k in 0..K {
                    store32(&mut sbuf[k], j, s[k]);
                }
            }
            for k in 0..K {
                for r in 1..ph {
                    let at = store.srow(p, r);
                    sel[k][at..at + nsel].copy_from_slice(&sbuf[k][(r - 1) * nsel..r * nsel]);
                }
            }
            // Residual contexts of plane p stay in its range by construction: when every one of them has a
            // table, the per-step check can go.
            let (lo, hi) = ans::residual_context_range(p);
            let plane_used = (lo..=hi).all(|ctx| t.used[ctx / 64] >> (ctx % 64) & 1 == 1);
            for r in 0..ph {
                let cur = store.zrow(p, r);
                for c0 in (0..pw).step_by(RUN) {
                    let active = (pw - c0).min(LANES);
                    let mut ctx = [_mm256_setzero_si256(); K];
                    for k in 0..K {
                        ctx[k] = if r == 0 {
                            let b = _mm256_set1_epi8(ans::FIRST_ROW_BUCKET as i8);
                            row_context(b, &z[k][store.zrow(0, r)..], c0, p, &kc)
                        } else {
                            contexts32(
                                &z[k][store.zrow(p, r - 1)..],
                                &z[k][store.zrow(0, r)..],
                                c0,
                                p,
                                &kc,
                            )
                        };
                        if !plane_used {
                            check_used(_mm256_add_epi8(ctx[k], first), active, &kc, ids[k])?;
                        }
                    }
                    let s = if active == LANES {
                        x.step::<true>(&l, &mut pos, &ctx, LANES, &res_look)
                    } else {
                        x.step::<false>(&l, &mut pos, &ctx, active, &res_look)
                    };
                    for (zk, sk) in z.iter_mut().zip(s) {
                        store32(zk, cur + 1 + c0, sk);
                    }
                }
                for zk in z.iter_mut() {
                    let zr = &mut zk[cur..cur + pw + 2];
                    zr[0] = zr[1];
                    zr[pw + 1] = zr[pw];
                }
            }
            for k in 0..K {
                let nwords = l[k].nwords;
                if pos[k] > nwords {
                    return Err(Error::RansPastChunkEnd {
                        patch: ids[k],
                        words: nwords,
                    });
                }
            }
        }
        let xs = x.states();
        for k in 0..K {
            ans::finish(&xs[k], pos[k], l[k].nwords, ids[k])?;
        }
        Ok(())
    }
}

/// Writes `n` RGB pixels from a row of v2's colour planes: R = P1 + G, B = P2 + G, interleaved as
/// `dst[3i..3i + 3] = (R, G, B)`, 32 pixels per step (two adds, nine `vpshufb` and six `vpor`). The
/// planes are read 32 bytes at a time, so each must hold `32·⌈n / 32⌉` bytes (the decoders' rolling rows
/// do); `dst` must hold `3n`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(crate) unsafe fn emit_rgb_avx2(dst: &mut [u8], g: &[u8], p1: &[u8], p2: &[u8], n: usize) {
    // SAFETY (whole body): AVX2 intrinsics; loads through `load32` (bounds-checked), stores into
    // bounds-checked 16-byte slices of `dst` or of the local `tail`.
    unsafe {
        let m = RGB_MASKS.map(|plane| plane.map(|b| bytes16(&b)));
        let dst = &mut dst[..3 * n];
        let mut tail = [0u8; 96];
        for k in 0..n.div_ceil(32) {
            let c0 = 32 * k;
            let gv = load32(g, c0);
            let r = _mm256_add_epi8(load32(p1, c0), gv);
            let b = _mm256_add_epi8(load32(p2, c0), gv);
            let full = c0 + 32 <= n;
            let out: &mut [u8] = if full {
                &mut dst[3 * c0..3 * c0 + 96]
            } else {
                &mut tail
            };
            for j in 0..3 {
                let v = _mm256_or_si256(
                    _mm256_or_si256(
                        _mm256_shuffle_epi8(r, m[0][j]),
                        _mm256_shuffle_epi8(gv, m[1][j]),
                    ),
                    _mm256_shuffle_epi8(b, m[2][j]),
                );
                let lo = &mut out[16 * j..16 * j + 16];
                _mm_storeu_si128(lo.as_mut_ptr().cast(), _mm256_castsi256_si128(v));
                let hi = &mut out[48 + 16 * j..48 + 16 * j + 16];
                _mm_storeu_si128(hi.as_mut_ptr().cast(), _mm256_extracti128_si256::<1>(v));
            }
            if !full {
                let rest = 3 * (n - c0);
                dst[3 * c0..].copy_from_slice(&tail[..rest]);
            }
        }
    }
}

/// Per selector s: the masks (scan, grad, top) of [`reconstruct_row_avx2`], all-ones bytes where true:
/// scan for GRAD and LEFT, grad for GRAD, top for TOP.
#[repr(C, align(32))]
struct SelectorMasks([[[u8; 32]; 3]; 4]);

static SELECTOR_MASKS: SelectorMasks = {
    let mut m = [[[0u8; 32]; 3]; 4];
    let mut s = 0;
    while s < 4 {
        let f = [s <= 1, s == 0, s == 2];
        let mut k = 0;
        while k < 3 {
            if f[k] {
                m[s][k] = [0xff; 32];
            }
            k += 1;
        }
        s += 1;
    }
    SelectorMasks(m)
};

/// Reconstructs one row like [`crate::v2::front::reconstruct_row`], 32 pixels per step and branch-free,
/// except that the edge replicas (`cur[0]`, `cur[pw + 1]`) are neither read from `prev` nor written.
///
/// The row above is read only as T (`prev[c0 + 1..]`, the bytes one 32-byte store of the previous row
/// wrote) and TL/TR are shifted out of neighbouring T vectors in registers: loads at other offsets would
/// straddle the previous row's stores, which the CPU cannot forward while they are in flight.
///
/// # Safety
/// The CPU must support AVX2. `z` must hold at least `runs(pw)·32` bytes (the decoders' row buffers do).
#[inline(always)]
pub(crate) unsafe fn reconstruct_row_avx2(
    prev: &[u8; ROW],
    z: &[u8],
    sels: &[u8],
    pw: usize,
    first: bool,
    cur: &mut [u8; ROW],
) {
    // SAFETY (whole body): AVX2 intrinsics on registers; loads and stores through `load32`/`store32`
    // (bounds-checked: prev and cur are ROW = 288 bytes, runs start at most at 192, so the next run's T
    // ends at 192 + 65 < 288), and aligned loads of the 32-byte rows of `SELECTOR_MASKS`.
    unsafe {
        let one = _mm256_set1_epi8(1);
        let low7 = _mm256_set1_epi8(0x7f);
        let b15 = _mm256_set1_epi8(15);
        let lanes = _mm256_setr_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31,
        );
        let nr = runs(pw).min(7);
        let mut t = load32(prev, 1);
        // Column 0's TL, and its left neighbour for GRAD/LEFT, are T.
        let mut t_prev = _mm256_broadcastb_epi8(_mm256_castsi256_si128(t));
        let mut left = t_prev;
        for k in 0..nr {
            let c0 = k * RUN;
            let last = k + 1 == nr;
            let t_next = if last { t } else { load32(prev, c0 + RUN + 1) };
            let zz = load32(z, c0);
            // unzigzag: (z >> 1) ^ −(z & 1)
            let res = _mm256_xor_si256(
                _mm256_and_si256(_mm256_srli_epi16::<1>(zz), low7),
                _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_and_si256(zz, one)),
            );
            // TL = T one column right (the previous vector's last byte first), TR one column left.
            let tl = _mm256_alignr_epi8::<15>(t, _mm256_permute2x128_si256::<0x21>(t_prev, t));
            let mut tr = _mm256_alignr_epi8::<1>(_mm256_permute2x128_si256::<0x21>(t, t_next), t);
            if last {
                // The last column's TR is its T.
                let at = _mm256_set1_epi8((pw - 1 - c0) as i8);
                tr = _mm256_blendv_epi8(tr, t, _mm256_cmpeq_epi8(lanes, at));
            }
            let s = if first {
                1
            } else {
                usize::from(sels.get(k).copied().unwrap_or(1) & 3)
            };
            let masks = &SELECTOR_MASKS.0[s];
            let scan = _mm256_load_si256(masks[0].as_ptr().cast());
            let grad = _mm256_load_si256(masks[1].as_ptr().cast());
            let top = _mm256_load_si256(masks[2].as_ptr().cast());
            // GRAD / LEFT: x_c = x_{c−1} + b_c, b = (T − TL if GRAD) + res: a byte prefix sum.
            let mut b = _mm256_add_epi8(res, _mm256_and_si256(_mm256_sub_epi8(t, tl), grad));
            b = _mm256_add_epi8(b, _mm256_slli_si256::<1>(b));
            b = _mm256_add_epi8(b, _mm256_slli_si256::<2>(b));
            b = _mm256_add_epi8(b, _mm256_slli_si256::<4>(b));
            b = _mm256_add_epi8(b, _mm256_slli_si256::<8>(b));
            let carry = _mm256_shuffle_epi8(b, b15);
            b = _mm256_add_epi8(b, _mm256_permute2x128_si256::<0x08>(carry, carry));
            let scanned = _mm256_add_epi8(b, left);
            // TOP / AVG3: (TL + 2T + TR + 2) >> 2 = avg(floor((TL + TR) / 2), T).
            let half = _mm256_sub_epi8(
                _mm256_avg_epu8(tl, tr),
                _mm256_and_si256(_mm256_xor_si256(tl, tr), one),
            );
            let pred = _mm256_blendv_epi8(_mm256_avg_epu8(half, t), t, top);
            let direct = _mm256_add_epi8(pred, res);
            let x = _mm256_blendv_epi8(direct, scanned, scan);
            store32(cur, c0 + 1, x);
            let hi = _mm256_shuffle_epi8(x, b15);
            left = _mm256_permute2x128_si256::<0x11>(hi, hi);
            t_prev = t;
            t = t_next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v2::front::{reconstruct_row, zigzag};

    fn rng(seed: u32) -> impl FnMut() -> u32 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        }
    }

    #[test]
    fn avx2_reconstruction_matches_portable() {
        if !crate::simd::has_avx2() {
            return;
        }
        let mut rnd = rng(0xBEEF);
        for pw in [
            1usize, 2, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 224,
        ] {
            for trial in 0..30 {
                let mut prev = [0u8; ROW];
                for v in prev[1..pw + 1].iter_mut() {
                    *v = rnd() as u8;
                }
                prev[0] = prev[1];
                prev[pw + 1] = prev[pw];
                let mut z = [0u8; 256];
                for v in z[..pw].iter_mut() {
                    *v = if trial % 3 == 0 {
                        rnd() as u8
                    } else {
                        zigzag((rnd() % 7) as u8)
                    };
                }
                let sels: Vec<u8> = (0..runs(pw)).map(|_| (rnd() % 4) as u8).collect();
                let first = trial % 5 == 0;
                let p = if first { [0u8; ROW] } else { prev };
                let (mut want, mut got) = ([0u8; ROW], [0u8; ROW]);
                reconstruct_row(&p, &z, &sels, pw, first, &mut want);
                // The AVX2 copy reads neither the edge replicas nor anything past the row.
                let mut q = p;
                q[0] ^= 0x5a;
                for v in q[pw + 1..].iter_mut() {
                    *v = rnd() as u8;
                }
                // SAFETY: AVX2 checked above.
                unsafe { reconstruct_row_avx2(&q, &z, &sels, pw, first, &mut got) };
                assert_eq!(
                    &got[1..pw + 1],
                    &want[1..pw + 1],
                    "pw {pw} trial {trial} sels {sels:?}"
                );
            }
        }
    }

    #[test]
    fn avx2_widths_match_portable_with_escapes_and_errors() {
        if !crate::simd::has_avx2_bmi2() {
            return;
        }
        let mut rnd = rng(0xF00D);
        for ng in [1usize, 4, 13, 16, 28] {
            for trial in 0..300 {
                let mut prev = [0u8; 32];
                for p in prev[..ng].iter_mut() {
                    *p = (rnd() % 9) as u8;
                }
                let codes = (u64::from(rnd()) << 32) | u64::from(rnd());
                let rest: Vec<u8> = (0..16)
                    .map(|_| {
                        if trial % 7 == 0 {
                            rnd() as u8
                        } else {
                            (rnd() % 9) as u8 * 0x11
                        }
                    })
                    .collect();
                // Portable: widths, then each escape's 4 bits in group order.
                let mut want = [0u8; 32];
                let (mut esc, bad) = crate::v2::bp::widths_from_codes(codes, &prev, ng, &mut want);
                let expect = if bad != 0 {
                    let g = bad.trailing_zeros() as usize;
                    Err((
                        g,
                        i32::from(prev[g]) + [0, 1, -1, 0][((codes >> (2 * g)) & 3) as usize],
                    ))
                } else {
                    let mut bit = 0;
                    let mut err = None;
                    while esc != 0 && err.is_none() {
                        let g = esc.trailing_zeros() as usize;
                        let w = (window(&rest, bit) & 15) as u8;
                        if w > 8 {
                            err = Some((g, i32::from(w)));
                        }
                        want[g] = w;
                        bit += 4;
                        esc &= esc - 1;
                    }
                    match err {
                        Some(e) => Err(e),
                        None => Ok((want[..ng].iter().map(|&w| usize::from(w)).sum(), bit)),
                    }
                };
                let mut got = [0u8; 32];
                // SAFETY: AVX2 and BMI2 checked above.
                let r = unsafe { widths_avx2(codes, &prev, ng, &rest, 0, &mut got) };
                assert_eq!(r, expect, "ng {ng} trial {trial}");
                if r.is_ok() {
                    assert_eq!(&got[..ng], &want[..ng], "ng {ng} trial {trial}");
                }
            }
        }
    }

    /// Both ways of reading the decode table (the CPU decides which the decoder uses, so each machine's
    /// integration tests run only one): the same entries for random in-bounds indices.
    #[test]
    fn scalar_and_hardware_gathers_agree() {
        if !crate::simd::has_avx2_bmi2() {
            return;
        }
        #[target_feature(enable = "avx2")]
        fn both(dec: &[u32], idx: [i32; 8]) -> ([u32; 8], [u32; 8]) {
            // SAFETY: AVX2 is enabled here and checked by the caller; every index is within `dec`.
            unsafe {
                let v = _mm256_loadu_si256(idx.as_ptr().cast());
                let (mut a, mut b) = ([0u32; 8], [0u32; 8]);
                _mm256_storeu_si256(a.as_mut_ptr().cast(), gather_dec(dec, v));
                let hw = _mm256_i32gather_epi32::<4>(dec.as_ptr().cast(), v);
                _mm256_storeu_si256(b.as_mut_ptr().cast(), hw);
                (a, b)
            }
        }
        let mut s = 0x2545_f491_u32;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let dec: Vec<u32> = (0..70_000).map(|_| rnd()).collect();
        for _ in 0..2000 {
            let idx = [0; 8].map(|_: i32| (rnd() as usize % dec.len()) as i32);
            // SAFETY: AVX2 checked above.
            let (a, b) = unsafe { both(&dec, idx) };
            assert_eq!(a, b, "indices {idx:?}");
            assert_eq!(a, idx.map(|i| dec[i as usize]));
        }
    }

    #[test]
    fn spread_bits_matches_shifts() {
        if !crate::simd::has_avx2_bmi2() {
            return;
        }
        let mut rnd = rng(77);
        for nb in 0..=8u8 {
            for _ in 0..100 {
                let v = (u64::from(rnd()) << 32) | u64::from(rnd());
                let mut want = 0u64;
                for j in 0..8 {
                    want |= ((v >> (j * u32::from(nb))) & ((1u64 << nb) - 1)) << (8 * j);
                }
                for pdep in [false, true] {
                    // SAFETY: BMI2 checked above.
                    assert_eq!(
                        unsafe { spread_bits(v, nb, pdep) },
                        want,
                        "nb {nb} pdep {pdep}"
                    );
                }
            }
        }
    }
}
