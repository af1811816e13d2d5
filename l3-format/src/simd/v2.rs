// Intrinsics only: this module is where the crate allows `unsafe` (see `crate::simd`).
#![allow(unsafe_code)]

//! AVX2 kernels of the v2 decoder, each tested against the portable code in `crate::v2`:
//!
//! - [`decode_chunk_avx2`]: the 32-lane rANS decoder of a patch chunk in the manner of htscodecs'
//!   `rANS_static32x16pr_avx2`: the 32 lane states live in four 8-lane registers; a step computes the 32
//!   contexts at once from the previous row's codes (and plane 0's), gathers each lane's symbol and
//!   (frequency, cumulative frequency), updates the states, and refills the lanes that fell below 2^16 from
//!   consecutive 16-bit words with a permutation chosen by the lanes' mask (the words are in lane order).
//! - [`reconstruct_row_avx2`]: one row from its residual codes, 32 pixels per step: TOP and AVG3 directly,
//!   GRAD and LEFT as a byte prefix sum plus the pixel to the left of the run.
//! - [`spread_bits`]: eight n-bit fields to eight bytes with BMI2 `pdep` (BP's deltas).
//!
//! Like the v1 kernels they are `#[inline(always)] unsafe fn`s, inlined into the `#[target_feature]` copies
//! of the decoder in `crate::v2::decode`; their contract is that the CPU has AVX2, BMI2 and POPCNT. Memory
//! safety never depends on the caller: loads and stores go through bounds-checked slices, and every gather
//! index is bounded by the table sizes checked on entry.

use crate::error::{Error, PatchId};
use crate::v2::ans::{self, LANES, PROB_BITS, STATE_BYTES, Store, Tables};
use crate::v2::front::{ROW, RUN, runs};
use std::arch::x86_64::*;

/// `pdep` masks: the low `nb` bits of every byte.
const SPREAD: [u64; 9] = {
    let mut m = [0u64; 9];
    let mut nb = 1;
    while nb <= 8 {
        m[nb] = (((1u16 << nb) - 1) as u64) * 0x0101_0101_0101_0101;
        nb += 1;
    }
    m
};

/// Eight `nb`-bit fields from the low bits of `v`, one per byte (`nb` ≤ 8).
///
/// # Safety
/// The CPU must support BMI2.
#[inline(always)]
pub(crate) unsafe fn spread_bits(v: u64, nb: u8) -> u64 {
    // SAFETY: BMI2 is the caller's guarantee.
    unsafe { _pdep_u64(v, SPREAD[usize::from(nb.min(8))]) }
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

/// BP row widths from 2-bit codes, 32 groups at once (see `crate::v2::bp::widths_from_codes`).
///
/// # Safety
/// The CPU must support AVX2 and BMI2.
#[inline(always)]
pub(crate) unsafe fn widths_from_codes(
    codes: u64,
    prev: &[u8; 32],
    ng: usize,
    out: &mut [u8; 32],
) -> (u32, u32) {
    // SAFETY: AVX2/BMI2 intrinsics; the load and store cover exactly the 32-byte arrays.
    unsafe {
        let m = 0x0303_0303_0303_0303u64;
        let q = |sh: u32| _pdep_u64(codes >> sh, m) as i64;
        let c = _mm256_setr_epi64x(q(0), q(16), q(32), q(48));
        // code → width change: 0, +1, −1, 0 (escape, replaced later).
        let delta = _mm256_shuffle_epi8(
            bytes16(&[0, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            c,
        );
        let v = _mm256_add_epi8(_mm256_loadu_si256(prev.as_ptr().cast()), delta);
        _mm256_storeu_si256(out.as_mut_ptr().cast(), v);
        let live = (u64::MAX >> (64 - ng.clamp(1, 32))) as u32;
        let esc = _mm256_movemask_epi8(_mm256_cmpeq_epi8(c, _mm256_set1_epi8(3))) as u32 & live;
        let ok = _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(8)), v);
        let bad = !(_mm256_movemask_epi8(ok) as u32) & !esc & live;
        (esc, bad)
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

/// Nibble lookup tables for bitlen of a byte: low nibble, and high nibble (4 + bitlen, 0 for 0).
const BITLEN_LO: [u8; 16] = [0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4];
const BITLEN_HI: [u8; 16] = [0, 5, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 8];

/// Constants of the context computation.
struct CtxConsts {
    lo: __m256i,
    hi: __m256i,
    nib: __m256i,
    one: __m256i,
    seven: __m256i,
    four: __m256i,
    used_lo: __m256i,
    used_hi: __m256i,
    bit: __m256i,
    fifteen: __m256i,
}

/// bitlen of every byte.
#[inline(always)]
unsafe fn bitlen8(v: __m256i, k: &CtxConsts) -> __m256i {
    // SAFETY: AVX2 intrinsics on registers (the caller's guarantee).
    unsafe {
        let lo = _mm256_shuffle_epi8(k.lo, _mm256_and_si256(v, k.nib));
        let hi = _mm256_shuffle_epi8(k.hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), k.nib));
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

/// The 32 residual contexts of row r ≥ 1 of plane `p` at columns c0..c0+32: from the previous row's codes
/// `zp` (padded: column c at c + 1) and plane 0's codes of this row `z0` (same padding).
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
        let b = _mm256_min_epu8(bitlen8(avg, k), k.seven);
        row_context(b, z0, c0, p, k)
    }
}

/// Context bytes from bucket bytes `b` (plane 0: b itself; else base + 5b + min(bitlen(z0), 4)).
#[inline(always)]
unsafe fn row_context(b: __m256i, z0: &[u8], c0: usize, p: usize, k: &CtxConsts) -> __m256i {
    // SAFETY: AVX2 intrinsics; loads through `load32`.
    unsafe {
        if p == 0 {
            return b;
        }
        let cls = _mm256_min_epu8(bitlen8(load32(z0, c0 + 1), k), k.four);
        let base = match p {
            1 => 9,
            2 => 54,
            _ => 102,
        };
        let five_b = _mm256_add_epi8(
            _mm256_add_epi8(b, b),
            _mm256_add_epi8(_mm256_add_epi8(b, b), b),
        );
        _mm256_add_epi8(_mm256_add_epi8(five_b, cls), _mm256_set1_epi8(base))
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

/// The lane states and word cursor of a chunk.
struct Lanes<'a> {
    x: [__m256i; 4],
    /// The chunk's words (after the lane states).
    words: &'a [u8],
    nwords: usize,
    pos: usize,
    /// Refills load 8 words at once: from `tail_start` on they come from `tail`, the last words followed
    /// by zeros, so that a load never leaves a buffer (and a damaged chunk reads zeros past its end).
    tail_start: usize,
    tail: [u8; 32],
}

impl<'a> Lanes<'a> {
    fn new(words: &'a [u8]) -> Self {
        let nwords = words.len() / 2;
        let tail_start = nwords.saturating_sub(8);
        let mut tail = [0u8; 32];
        tail[..2 * (nwords - tail_start)].copy_from_slice(&words[2 * tail_start..2 * nwords]);
        Lanes {
            x: [unsafe_zero(); 4],
            words,
            nwords,
            pos: 0,
            tail_start,
            tail,
        }
    }

    /// The next 8 words (zeros past the end).
    #[inline(always)]
    unsafe fn next8(&self) -> __m128i {
        let pos = self.pos;
        // SAFETY: below `tail_start`, pos + 8 ≤ nwords, so 16 bytes lie inside `words`; from it on, the
        // offset into `tail` is at most 2·8 = 16 and `tail` has 32 bytes.
        unsafe {
            let p = if pos < self.tail_start {
                self.words.as_ptr().add(2 * pos)
            } else {
                self.tail
                    .as_ptr()
                    .add(2 * (pos.min(self.nwords) - self.tail_start))
            };
            _mm_loadu_si128(p.cast())
        }
    }
}

/// An all-zero register (a plain function so that `Lanes::new` needs no target feature).
#[inline(always)]
fn unsafe_zero() -> __m256i {
    // SAFETY: a zeroed `__m256i` is a valid value.
    unsafe { std::mem::zeroed() }
}

const PROB_BITS_I: i32 = PROB_BITS as i32;

/// `dec[idx[i]]` for each lane (indices bounded by the caller). A hardware gather: eight scalar loads in
/// its place (as htscodecs does where gathers are slow) measured no faster on a Zen 3 EPYC.
#[inline(always)]
unsafe fn gather_dec(dec: &[u32], idx: __m256i) -> __m256i {
    // SAFETY: see `step_vec`: every index is within `dec`.
    unsafe { _mm256_i32gather_epi32::<4>(dec.as_ptr().cast(), idx) }
}

/// Decodes lanes 8v..8v+8 of a step (`c8`: their 8 context bytes in the low half; `active` lanes in the
/// step) and returns their decode-table entries (the symbol in the low byte of each 32-bit lane).
#[inline(always)]
unsafe fn step_vec(
    l: &mut Lanes<'_>,
    v: usize,
    c8: __m128i,
    active: usize,
    t: &Tables<'_>,
) -> __m256i {
    // SAFETY (whole body): AVX2 intrinsics. Table reads: every context index is below the number of
    // contexts the table was built for (checked on entry to `decode_chunks_avx2` against its length;
    // contexts are at most 147 by construction) and slots are < 4096, so each read lies inside `t.dec`.
    // Word loads: see `Lanes::next8`.
    unsafe {
        let c32 = _mm256_cvtepu8_epi32(c8);
        let x = l.x[v];
        let slot = _mm256_and_si256(x, _mm256_set1_epi32(0xfff));
        let e = gather_dec(t.dec, _mm256_or_si256(_mm256_slli_epi32::<12>(c32), slot));
        // e = (f − 1) << 20 | (slot − cum) << 8 | symbol.
        let f = _mm256_add_epi32(_mm256_srli_epi32::<20>(e), _mm256_set1_epi32(1));
        let bias = _mm256_and_si256(_mm256_srli_epi32::<8>(e), _mm256_set1_epi32(0xfff));
        let mut nx = _mm256_add_epi32(
            _mm256_mullo_epi32(f, _mm256_srli_epi32::<PROB_BITS_I>(x)),
            bias,
        );
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
        let w = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(l.next8()), perm);
        let renorm = _mm256_or_si256(_mm256_slli_epi32::<16>(nx), w);
        l.x[v] = _mm256_blendv_epi8(nx, renorm, need);
        l.pos += m.count_ones() as usize;
        e
    }
}

/// One step of up to 32 lanes (`active`, from lane 0) in each of `K` chunks, the chunks' vectors
/// interleaved so that one chunk's table reads overlap another's arithmetic. Returns each chunk's 32 symbols.
#[inline(always)]
unsafe fn step<const K: usize, const FULL: bool>(
    l: &mut [Lanes<'_>; K],
    ctx: &[__m256i; K],
    active: usize,
    t: &Tables<'_>,
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
                        syms[k][$v] = step_vec(&mut l[k], $v, c8, active, t);
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
            let lo = |v: __m256i| _mm256_and_si256(v, _mm256_set1_epi32(0xff));
            let a = _mm256_packus_epi32(lo(syms[k][0]), lo(syms[k][1]));
            let b = _mm256_packus_epi32(lo(syms[k][2]), lo(syms[k][3]));
            let bytes = _mm256_packus_epi16(a, b);
            out[k] = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        }
        out
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
    ids: [PatchId; K],
) -> Result<(), Error> {
    let k_all = ans::contexts(c as u8);
    // The table reads rely on these sizes (see `step_vec`); the stores on the row padding.
    if t.dec.len() < k_all << PROB_BITS || store.zs < store.n + 32 {
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
        let mut l: [Lanes<'_>; K] = std::array::from_fn(|k| Lanes::new(&chunks[k][STATE_BYTES..]));
        for k in 0..K {
            for v in 0..4 {
                l[k].x[v] = _mm256_loadu_si256(x0[k][8 * v..8 * v + 8].as_ptr().cast());
            }
        }
        let mut used = [0u8; 32];
        for (i, u) in used.iter_mut().enumerate() {
            *u = (t.used[i / 8] >> (8 * (i % 8))) as u8;
        }
        let kc = CtxConsts {
            lo: bytes16(&BITLEN_LO),
            hi: bytes16(&BITLEN_HI),
            nib: _mm256_set1_epi8(15),
            one: _mm256_set1_epi8(1),
            seven: _mm256_set1_epi8(7),
            four: _mm256_set1_epi8(4),
            used_lo: bytes16(&used[..16]),
            used_hi: bytes16(&used[16..]),
            bit: bytes16(&[1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128]),
            fifteen: _mm256_set1_epi8(15),
        };
        let nsel = runs(pw);
        let mut sbuf = [[0u8; 8 * 256 + 32]; K];
        for p in 0..c {
            // The selector segment: one context.
            let n = (ph - 1) * nsel;
            let sctx = [_mm256_set1_epi8(ans::selector_context(p) as i8); K];
            if n > 0 {
                check_used(sctx[0], 1, &kc, ids[0])?;
            }
            for j in (0..n).step_by(LANES) {
                let s = if n - j >= LANES {
                    step::<K, true>(&mut l, &sctx, LANES, &t)
                } else {
                    step::<K, false>(&mut l, &sctx, n - j, &t)
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
                            check_used(ctx[k], active, &kc, ids[k])?;
                        }
                    }
                    let s = if active == LANES {
                        step::<K, true>(&mut l, &ctx, LANES, &t)
                    } else {
                        step::<K, false>(&mut l, &ctx, active, &t)
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
                if l[k].pos > nwords {
                    return Err(Error::RansPastChunkEnd {
                        patch: ids[k],
                        words: nwords,
                    });
                }
            }
        }
        for k in 0..K {
            let mut x = [0u32; LANES];
            for v in 0..4 {
                _mm256_storeu_si256(x[8 * v..8 * v + 8].as_mut_ptr().cast(), l[k].x[v]);
            }
            ans::finish(&x, l[k].pos, l[k].nwords, ids[k])?;
        }
        Ok(())
    }
}

/// Reconstructs one row like [`crate::v2::front::reconstruct_row`], 32 pixels per step and branch-free.
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
    // (bounds-checked: prev and cur are ROW = 288 bytes, runs start at most at 192).
    unsafe {
        let one = _mm256_set1_epi8(1);
        let low7 = _mm256_set1_epi8(0x7f);
        let b15 = _mm256_set1_epi8(15);
        let mut left = _mm256_set1_epi8(prev[0] as i8);
        for k in 0..runs(pw).min(7) {
            let c0 = k * RUN;
            let zz = load32(z, c0);
            // unzigzag: (z >> 1) ^ −(z & 1)
            let res = _mm256_xor_si256(
                _mm256_and_si256(_mm256_srli_epi16::<1>(zz), low7),
                _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_and_si256(zz, one)),
            );
            let tl = load32(prev, c0);
            let t = load32(prev, c0 + 1);
            let tr = load32(prev, c0 + 2);
            let s = if first {
                1
            } else {
                sels.get(k).copied().unwrap_or(1)
            };
            let scan = _mm256_set1_epi8(-i8::from(s <= 1));
            let grad = _mm256_set1_epi8(-i8::from(s == 0));
            let top = _mm256_set1_epi8(-i8::from(s == 2));
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
        }
    }
    cur[0] = cur[1];
    cur[pw + 1] = cur[pw];
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
                // SAFETY: AVX2 checked above.
                unsafe { reconstruct_row_avx2(&p, &z, &sels, pw, first, &mut got) };
                assert_eq!(
                    &got[..pw + 2],
                    &want[..pw + 2],
                    "pw {pw} trial {trial} sels {sels:?}"
                );
            }
        }
    }

    #[test]
    fn pdep_spread_matches_shifts() {
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
                // SAFETY: BMI2 checked above.
                assert_eq!(unsafe { spread_bits(v, nb) }, want, "nb {nb}");
            }
        }
    }
}
