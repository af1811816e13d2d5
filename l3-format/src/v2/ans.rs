//! Profile ANS (SPEC.md §2.7): contexts, frequency tables, and the 32-lane static rANS coder of one patch
//! chunk (portable code; the AVX2 decoder is `crate::simd::rans`, tested against this one).

use super::bits::{BitReader, BitWriter, OutOfBits};
use super::front::{bitlen, runs};
use crate::error::{Error, PatchId};

/// Probability resolution: frequencies are 12-bit and sum to 4096 per used context.
pub const PROB_BITS: u32 = 12;
pub(crate) const PROB_SCALE: u32 = 1 << PROB_BITS;
/// The lower bound of a normalised rANS state (L = 2^16; states live in [2^16, 2^32)).
pub const RANS_L: u32 = 1 << 16;
/// The coarsest decode-table resolution used: 4096 >> 4 = 256 entries per context.
pub const MAX_TABLE_SHIFT: u32 = 4;
/// Lanes (interleaved rANS states) per patch chunk.
pub const LANES: usize = 32;
/// Bytes of lane states at the start of every chunk.
pub const STATE_BYTES: usize = 4 * LANES;

/// Contexts of an image with `channels` channels: 102 (gray and RGB share the numbering), 148 with alpha.
pub fn contexts(channels: u8) -> usize {
    if channels == 4 { 148 } else { 102 }
}

/// The context class of the residual above: `min(bitlen((zTL + 2·zT + zTR + 2) >> 2), 7)`, or 8 in row 0.
#[inline(always)]
pub fn bucket(ztl: u8, zt: u8, ztr: u8) -> u8 {
    let avg = (u16::from(ztl) + 2 * u16::from(zt) + u16::from(ztr) + 2) >> 2;
    (16 - avg.leading_zeros() as u8).min(7)
}

/// Bucket of row 0.
pub const FIRST_ROW_BUCKET: u8 = 8;

/// The context of a residual of plane `plane` with bucket `bucket` (0..=8), given `z0`, the residual of
/// plane 0 at the same pixel (ignored for plane 0).
#[inline(always)]
pub fn residual_context(plane: usize, bucket: u8, z0: u8) -> u8 {
    let cls = bitlen(z0).min(4);
    match plane {
        0 => bucket,
        1 | 2 => 9 + 45 * (plane as u8 - 1) + 5 * bucket + cls,
        _ => 102 + 5 * bucket + cls,
    }
}

/// The lowest and highest residual context of plane `plane` (every bucket and class).
pub(crate) fn residual_context_range(plane: usize) -> (usize, usize) {
    let lo = usize::from(residual_context(plane, 0, 0));
    (
        lo,
        usize::from(residual_context(plane, FIRST_ROW_BUCKET, 255)),
    )
}

/// The context of plane `plane`'s selectors.
#[inline(always)]
pub fn selector_context(plane: usize) -> u8 {
    if plane < 3 { 99 + plane as u8 } else { 147 }
}

/// The plane whose residuals or selectors context `ctx` codes.
pub(crate) fn plane_of_context(ctx: usize) -> usize {
    match ctx {
        0..=8 => 0,
        9..=53 => 1,
        54..=98 => 2,
        99..=101 => ctx - 99,
        _ => 3,
    }
}

/// Where one plane's contexts live in the decode table (see [`AnsTables::decode_table`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PlaneTable {
    /// k: the plane's tables have `4096 >> k` entries, looked up by `slot >> k`.
    pub shift: u32,
    /// The plane's lowest residual context.
    pub first_context: u32,
    /// Table of residual context `first_context + i` at `residual_base + (i << (12 − k))`.
    pub residual_base: u32,
    /// Table of the plane's selector context.
    pub selector_base: u32,
}

impl PlaneTable {
    /// Start of context `ctx`'s table (a context of this plane).
    #[inline(always)]
    pub(crate) fn base(&self, ctx: usize) -> usize {
        if is_selector_context(ctx) {
            self.selector_base as usize
        } else {
            self.residual_base as usize
                + ((ctx - self.first_context as usize) << (PROB_BITS - self.shift))
        }
    }
}

/// Whether context `ctx` codes selectors (alphabet 4).
fn is_selector_context(ctx: usize) -> bool {
    matches!(ctx, 99..=101 | 147)
}

/// The frequency tables of a v2-ANS file: for each context, `None` (unused) or f_0..f_{n−1} (sum 4096).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsTables {
    freqs: Vec<Option<Box<[u16]>>>,
}

/// Leading zeros an Exp-Golomb code of a frequency ≤ 4096 can have (4097 has 13 bits).
const MAX_EG_ZEROS: u32 = 12;

impl AnsTables {
    /// Parses the table bitstream at the start of `bytes` for `contexts` contexts; returns the tables and
    /// the bytes the bitstream occupies (padded to a byte). Running out of bytes is
    /// [`Error::Truncated`] with `what: "frequency tables"`.
    pub fn parse(bytes: &[u8], contexts: usize) -> Result<(AnsTables, usize), Error> {
        let truncated = |_: OutOfBits| Error::Truncated {
            what: "frequency tables",
            needed: bytes.len() + 1,
            len: bytes.len(),
        };
        let mut r = BitReader::new(bytes);
        let mut freqs = Vec::with_capacity(contexts);
        for context in 0..contexts {
            if r.get(1).map_err(truncated)? == 0 {
                freqs.push(None);
                continue;
            }
            let n = r.get(8).map_err(truncated)? as usize + 1;
            if is_selector_context(context) && n > 4 {
                return Err(Error::SelectorOutOfRange {
                    context,
                    symbols: n,
                });
            }
            let mut f = Vec::with_capacity(n);
            let mut sum = 0u32;
            for _ in 0..n {
                let v = r
                    .get_eg0(MAX_EG_ZEROS)
                    .map_err(truncated)?
                    .ok_or(Error::FrequencyCode { context })?;
                sum += v;
                if sum > PROB_SCALE {
                    return Err(Error::FrequencySum { context, sum });
                }
                f.push(v as u16);
            }
            if sum != PROB_SCALE {
                return Err(Error::FrequencySum { context, sum });
            }
            freqs.push(Some(f.into_boxed_slice()));
        }
        Ok((AnsTables { freqs }, r.bytes_used()))
    }

    /// Appends the table bitstream (padded to a byte).
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut w = BitWriter::new(out);
        for f in &self.freqs {
            match f {
                None => w.put(0, 1),
                Some(f) => {
                    w.put(1, 1);
                    w.put(f.len() as u32 - 1, 8);
                    for &v in f.iter() {
                        w.put_eg0(u32::from(v));
                    }
                }
            }
        }
        w.align();
    }

    /// Heap memory the tables hold.
    pub fn heap_bytes(&self) -> usize {
        self.freqs.len() * std::mem::size_of::<Option<Box<[u16]>>>()
            + self
                .freqs
                .iter()
                .flatten()
                .map(|f| 2 * f.len())
                .sum::<usize>()
    }

    /// Cumulative frequencies of context `ctx`: `cum[s]` = f_0 + … + f_{s−1}, n + 1 values (the last is
    /// 4096); `None` if the context is unused.
    pub fn cum(&self, ctx: usize) -> Option<Vec<u16>> {
        let f = self.freqs(ctx)?;
        let mut c = Vec::with_capacity(f.len() + 1);
        let mut acc = 0u16;
        c.push(0);
        for &v in f {
            acc += v;
            c.push(acc);
        }
        Some(c)
    }

    /// Number of contexts (102 or 148).
    pub fn contexts(&self) -> usize {
        self.freqs.len()
    }

    /// Frequencies f_0..f_{n−1} of context `ctx`, `None` if it is unused (or out of range).
    pub fn freqs(&self, ctx: usize) -> Option<&[u16]> {
        self.freqs.get(ctx)?.as_deref()
    }

    /// The decode tables the CPU decoders index by context and slot (slot = state & 4095), built into `dec`
    /// (grown as needed; entries of unused contexts are never written nor read: callers check
    /// [`Self::used_mask`] first).
    ///
    /// The contexts of plane p (its residual contexts and its selector context) share a resolution k_p ≤
    /// [`MAX_TABLE_SHIFT`], the largest with every frequency of every such context a multiple of 2^k_p, and
    /// get `4096 >> k_p` entries each: entry `slot >> k_p` of a context is
    /// `symbol << 24 | (f − 1) << 12 | (first slot of the entry − cum)`, and the state's offset within its
    /// symbol is that low field plus `slot & (2^k_p − 1)`. An encoder that keeps frequencies coarse where
    /// it costs little thus shrinks the tables into a faster cache; one resolution per plane keeps it
    /// uniform across the 32 lanes of a decode step (a step never mixes planes).
    pub(crate) fn decode_table(&self, dec: &mut Vec<u32>) -> [PlaneTable; 4] {
        let mut planes = [PlaneTable::default(); 4];
        let mut len = 0usize;
        for (p, pt) in planes.iter_mut().enumerate() {
            let (lo, hi) = residual_context_range(p);
            if lo >= self.freqs.len() {
                break;
            }
            let sc = usize::from(selector_context(p));
            let k = (lo..=hi)
                .chain([sc])
                .filter_map(|ctx| self.freqs(ctx))
                .flatten()
                .filter(|&&v| v > 0)
                .map(|&v| v.trailing_zeros())
                .min()
                .unwrap_or(0)
                .min(MAX_TABLE_SHIFT);
            let per = (1usize << PROB_BITS) >> k;
            *pt = PlaneTable {
                shift: k,
                first_context: lo as u32,
                residual_base: len as u32,
                selector_base: (len + (hi + 1 - lo) * per) as u32,
            };
            len += (hi + 2 - lo) * per;
        }
        if dec.len() < len {
            // A fresh zeroed allocation (calloc: untouched pages of unused contexts cost nothing).
            *dec = vec![0; len];
        }
        for (ctx, f) in self.freqs.iter().enumerate() {
            let Some(f) = f else { continue };
            let pt = planes[plane_of_context(ctx)];
            let k = pt.shift as usize;
            let base = pt.base(ctx);
            let t = &mut dec[base..base + ((1 << PROB_BITS) >> k)];
            let mut cum = 0usize;
            for (sym, &fs) in f.iter().enumerate() {
                let fs = usize::from(fs);
                if fs == 0 {
                    continue;
                }
                let hi = ((sym as u32) << 24) | ((fs as u32 - 1) << 12);
                for (j, e) in t[cum >> k..(cum + fs) >> k].iter_mut().enumerate() {
                    *e = hi | ((j as u32) << k);
                }
                cum += fs;
            }
        }
        planes
    }

    /// Bit `ctx` set when context `ctx` has a table (contexts < 256).
    pub fn used_mask(&self) -> [u64; 4] {
        let mut m = [0u64; 4];
        for (ctx, f) in self.freqs.iter().enumerate() {
            if f.is_some() {
                m[ctx / 64] |= 1 << (ctx % 64);
            }
        }
        m
    }

    /// Tables from per-context symbol counts (`counts[ctx][sym]`), normalised by `norm`.
    pub(crate) fn from_counts(counts: &[[u32; 256]], norm: Normalize) -> AnsTables {
        let units = match norm {
            Normalize::Coarse => plane_units(counts),
            _ => [1; 4],
        };
        let freqs = counts
            .iter()
            .enumerate()
            .map(|(ctx, c)| {
                let n = c.iter().rposition(|&v| v > 0)? + 1;
                Some(match norm {
                    Normalize::Reference => normalize_reference(&c[..n]),
                    Normalize::Optimal | Normalize::Coarse => {
                        normalize_optimal(&c[..n], units[plane_of_context(ctx)])
                    }
                })
            })
            .collect();
        AnsTables { freqs }
    }
}

/// Bytes of decode tables a plane may take at the resolution [`Normalize::Coarse`] picks. A step of the CPU
/// decoder looks up 32 symbols of one plane, so with the plane's tables in a core's L2 cache (512 KiB on the
/// Zen 3 this was tuned on) its lookups rarely miss. On the corpus, colour planes in units of 4 (184 KiB for
/// 46 contexts) decoded about as fast as in units of 8 and faster than in units of 2, at a smaller size;
/// SPEC.md §2.9 has the measured sizes and speeds.
pub(crate) const PLANE_TABLE_BUDGET: usize = 192 << 10;

/// Per plane, the frequency unit of [`Normalize::Coarse`]: the smallest power of two ≤ 8 at which the
/// plane's used contexts (residual and selector) take at most [`PLANE_TABLE_BUDGET`] of decode tables
/// (4 bytes per entry, 4096 / unit entries per context).
fn plane_units(counts: &[[u32; 256]]) -> [u32; 4] {
    let mut units = [1u32; 4];
    for (p, u) in units.iter_mut().enumerate() {
        let (lo, hi) = residual_context_range(p);
        let sc = usize::from(selector_context(p));
        let used = (lo..=hi)
            .chain([sc])
            .filter(|&ctx| counts.get(ctx).is_some_and(|c| c.iter().any(|&v| v > 0)))
            .count();
        while *u < 8 && used * (4 << PROB_BITS) / *u as usize > PLANE_TABLE_BUDGET {
            *u *= 2;
        }
    }
    units
}

/// How symbol counts become 12-bit frequencies (the encoder's free choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Normalize {
    /// The conformance vectors' rule: f = max(1, round(4096·count/total)) for every seen symbol, then the
    /// largest f absorbs the difference.
    Reference,
    /// The allocation that minimises the coded size Σ count·log2(4096/f).
    Optimal,
    /// As `Optimal`, with every frequency of plane p a multiple of the unit [`plane_units`] gives it, so
    /// that decoders can look its symbols up in tables of 4096 / unit entries.
    Coarse,
}

/// The vectors' rule (see [`Normalize::Reference`]), with a fallback when the largest f cannot absorb the
/// excess (many rare symbols): then the largest frequencies give up one unit at a time.
pub(crate) fn normalize_reference(counts: &[u32]) -> Box<[u16]> {
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let mut f: Vec<i64> = counts
        .iter()
        .map(|&c| {
            if c == 0 {
                0
            } else {
                // round(4096·c/total), halves up, in integers.
                ((2 * u64::from(c) * u64::from(PROB_SCALE) + total) / (2 * total)).max(1) as i64
            }
        })
        .collect();
    let sum: i64 = f.iter().sum();
    let largest = first_max(&f);
    f[largest] += i64::from(PROB_SCALE) - sum;
    if f[largest] < 1 {
        f[largest] = 1;
        let mut excess: i64 = f.iter().sum::<i64>() - i64::from(PROB_SCALE);
        while excess > 0 {
            let i = first_max(&f);
            f[i] -= 1;
            excess -= 1;
        }
    }
    f.into_iter().map(|v| v as u16).collect()
}

fn first_max(f: &[i64]) -> usize {
    let mut best = 0;
    for (i, &v) in f.iter().enumerate() {
        if v > f[best] {
            best = i;
        }
    }
    best
}

/// Frequencies minimising Σ c·log2(4096/f) over the multiples f of `unit` (a power of two ≤ 16), f ≥ unit
/// for c > 0, summing to 4096: start from the floor of the exact shares (at least one unit), then hand
/// out or take back one unit at a time where it gains the most or costs the least.
pub(crate) fn normalize_optimal(counts: &[u32], unit: u32) -> Box<[u16]> {
    let scale = PROB_SCALE / unit;
    let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let mut f: Vec<u32> = counts
        .iter()
        .map(|&c| {
            if c == 0 {
                0
            } else {
                ((u64::from(c) * u64::from(scale) / total) as u32).max(1)
            }
        })
        .collect();
    let mut sum: u32 = f.iter().sum();
    // Gain of f → f+1 is c·log2((f+1)/f); loss of f → f−1 is c·log2(f/(f−1)).
    let gain = |c: u32, f: u32| f64::from(c) * (f64::from(f + 1) / f64::from(f)).log2();
    let loss = |c: u32, f: u32| f64::from(c) * (f64::from(f) / f64::from(f - 1)).log2();
    while sum < scale {
        let mut best = (f64::MIN, 0);
        for (i, (&c, &fi)) in counts.iter().zip(&f).enumerate() {
            if c > 0 && gain(c, fi) > best.0 {
                best = (gain(c, fi), i);
            }
        }
        f[best.1] += 1;
        sum += 1;
    }
    while sum > scale {
        let mut best = (f64::MAX, 0);
        for (i, (&c, &fi)) in counts.iter().zip(&f).enumerate() {
            if fi > 1 && loss(c, fi) < best.0 {
                best = (loss(c, fi), i);
            }
        }
        f[best.1] -= 1;
        sum -= 1;
    }
    // Then swap units while moving one from i to j lowers the cost (a few passes settle it).
    for _ in 0..8 {
        let mut moved = false;
        let (mut gi, mut li) = (None::<(f64, usize)>, None::<(f64, usize)>);
        for (i, (&c, &fi)) in counts.iter().zip(&f).enumerate() {
            if c == 0 {
                continue;
            }
            let g = gain(c, fi);
            if gi.is_none_or(|(b, _)| g > b) {
                gi = Some((g, i));
            }
            if fi > 1 {
                let l = loss(c, fi);
                if li.is_none_or(|(b, _)| l < b) {
                    li = Some((l, i));
                }
            }
        }
        if let (Some((g, i)), Some((l, j))) = (gi, li)
            && i != j
            && g > l + 1e-12
        {
            f[i] += 1;
            f[j] -= 1;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    f.into_iter().map(|v| (v * unit) as u16).collect()
}

/// The symbols of one patch in chunk order (SPEC.md §2.7.2), produced by the front end: for each plane the
/// selector segment, then one segment per row.
pub(crate) struct PatchSymbols {
    /// `(ctx, sym)` per symbol, chunk order.
    pub syms: Vec<(u8, u8)>,
    /// Length of each segment, in order (selector segments may be empty).
    pub segments: Vec<u32>,
}

/// Per-symbol encoder data: frequency and cumulative frequency (f = 0: unused symbol).
#[derive(Clone, Copy, Default)]
struct EncSym {
    f: u32,
    cum: u32,
}

/// Encoder view of the tables: `(f, cum)` for every (context, symbol).
pub(crate) struct EncTables {
    syms: Vec<[EncSym; 256]>,
}

impl EncTables {
    pub(crate) fn new(t: &AnsTables) -> Self {
        let syms = t
            .freqs
            .iter()
            .map(|f| {
                let mut e = [EncSym::default(); 256];
                if let Some(f) = f {
                    let mut cum = 0;
                    for (s, &fs) in f.iter().enumerate() {
                        e[s] = EncSym {
                            f: u32::from(fs),
                            cum,
                        };
                        cum += u32::from(fs);
                    }
                }
                e
            })
            .collect();
        EncTables { syms }
    }
}

/// rANS-encodes one patch's symbols into a chunk (32 lane states, then the 16-bit words in decode order),
/// appended to `out`. Every symbol must have f > 0 in its context.
pub(crate) fn encode_chunk(p: &PatchSymbols, t: &EncTables, out: &mut Vec<u8>) {
    // Lane of each symbol: j mod 32 within its segment.
    let mut lanes = Vec::with_capacity(p.syms.len());
    for &n in &p.segments {
        lanes.extend((0..n).map(|j| (j % LANES as u32) as u8));
    }
    let mut x = [RANS_L; LANES];
    let mut words: Vec<u16> = Vec::with_capacity(p.syms.len() / 2);
    for (&(ctx, sym), &lane) in p.syms.iter().zip(&lanes).rev() {
        let e = t.syms[ctx as usize][sym as usize];
        debug_assert!(e.f > 0, "symbol {sym} of context {ctx} has no frequency");
        let s = &mut x[lane as usize];
        // x_max = f·2^20 (2^32 for f = 4096, which no u32 state reaches).
        if u64::from(*s) >= u64::from(e.f) << 20 {
            words.push(*s as u16);
            *s >>= 16;
        }
        *s = ((*s / e.f) << PROB_BITS) + *s % e.f + e.cum;
    }
    for s in x {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.reserve(2 * words.len());
    for w in words.iter().rev() {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// Geometry of a patch's symbol store: plane p's row r of residual codes lives at
/// `z[(p·n + r)·zs + 1 ..][..pw]` with replicas of its first and last code at offsets 0 and pw + 1;
/// selectors of row r at `sel[(p·n + r)·8 ..][..runs(pw)]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Store {
    pub n: usize,
    pub zs: usize,
}

impl Store {
    pub(crate) fn new(n: usize) -> Self {
        Store { n, zs: n + 32 }
    }
    #[inline(always)]
    pub(crate) fn zrow(&self, p: usize, r: usize) -> usize {
        (p * self.n + r) * self.zs
    }
    #[inline(always)]
    pub(crate) fn srow(&self, p: usize, r: usize) -> usize {
        (p * self.n + r) * 8
    }
    pub(crate) fn z_len(&self, c: usize) -> usize {
        c * self.n * self.zs + 64
    }
    pub(crate) fn sel_len(&self, c: usize) -> usize {
        c * self.n * 8
    }
}

/// Reads the 32 lane states of a chunk and checks each is a normalised state.
pub(crate) fn read_states(chunk: &[u8], id: PatchId) -> Result<[u32; LANES], Error> {
    let mut x = [0u32; LANES];
    for (lane, s) in x.iter_mut().enumerate() {
        let b = &chunk[4 * lane..4 * lane + 4];
        *s = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if *s < RANS_L {
            return Err(Error::RansStateOutOfRange {
                patch: id,
                lane,
                state: *s,
            });
        }
    }
    Ok(x)
}

/// After the last symbol: every lane back at 2^16 and every word used.
pub(crate) fn finish(x: &[u32; LANES], pos: usize, words: usize, id: PatchId) -> Result<(), Error> {
    if let Some((lane, &state)) = x.iter().enumerate().find(|(_, s)| **s != RANS_L) {
        return Err(Error::RansFinalState {
            patch: id,
            lane,
            state,
        });
    }
    if pos != words {
        return Err(Error::TrailingPatchBytes {
            patch: Some(id),
            unused: 2 * (words - pos),
        });
    }
    Ok(())
}

/// The portable scalar decoder of one chunk into `z`/`sel` (see [`Store`]).
pub(crate) struct ScalarDecoder<'a> {
    pub x: [u32; LANES],
    pub words: &'a [u8],
    pub pos: usize,
    pub t: Tables<'a>,
    pub id: PatchId,
}

/// The decode table of [`AnsTables::decode_table`] with the used-context mask.
#[derive(Clone, Copy)]
pub(crate) struct Tables<'a> {
    pub dec: &'a [u32],
    /// Each plane's place in `dec` (see [`AnsTables::decode_table`]).
    pub planes: [PlaneTable; 4],
    pub used: [u64; 4],
}

impl ScalarDecoder<'_> {
    /// Decodes one segment of `n` symbols whose contexts `ctx(j)` gives, into `out[j]`. The renormalisation
    /// is branch-free (whether a lane needs a word is data, not control flow: a mispredicted branch per
    /// few symbols would cost more than the decode); running out of words is checked once per segment.
    #[inline(always)]
    pub(crate) fn segment(
        &mut self,
        n: usize,
        ctx: impl Fn(usize) -> u8,
        out: &mut [u8],
    ) -> Result<(), Error> {
        let nwords = self.words.len() / 2;
        let mut pos = self.pos;
        for (j, o) in out[..n].iter_mut().enumerate() {
            let c = ctx(j);
            if self.t.used[c as usize / 64] >> (c % 64) & 1 == 0 {
                return Err(Error::UnusedContext {
                    patch: self.id,
                    context: c as usize,
                });
            }
            let lane = j % LANES;
            let s = self.x[lane];
            let slot = s & (PROB_SCALE - 1);
            let pt = &self.t.planes[plane_of_context(usize::from(c))];
            let k = pt.shift;
            let e = self.t.dec[pt.base(usize::from(c)) + (slot >> k) as usize];
            *o = (e >> 24) as u8;
            let s = (((e >> 12) & (PROB_SCALE - 1)) + 1) * (s >> PROB_BITS)
                + (e & (PROB_SCALE - 1))
                + (slot & ((1 << k) - 1));
            let w = match self.words.get(2 * pos..2 * pos + 2) {
                Some(b) => u32::from(u16::from_le_bytes([b[0], b[1]])),
                None => 0,
            };
            let need = s < RANS_L;
            self.x[lane] = if need { (s << 16) | w } else { s };
            pos += usize::from(need);
        }
        self.pos = pos;
        if pos > nwords {
            return Err(Error::RansPastChunkEnd {
                patch: self.id,
                words: nwords,
            });
        }
        Ok(())
    }
}

/// Decodes every symbol of a patch chunk (portable): selectors and residual codes of `c` planes of a
/// `pw`×`ph` patch into `z`/`sel` laid out as `store` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_chunk_scalar(
    chunk: &[u8],
    t: Tables<'_>,
    pw: usize,
    ph: usize,
    c: usize,
    store: Store,
    z: &mut [u8],
    sel: &mut [u8],
    id: PatchId,
) -> Result<(), Error> {
    let x = read_states(chunk, id)?;
    let mut d = ScalarDecoder {
        x,
        words: &chunk[STATE_BYTES..],
        pos: 0,
        t,
        id,
    };
    let nsel = runs(pw);
    let mut sbuf = [0u8; 8 * 256];
    let mut row = [0u8; 256];
    for p in 0..c {
        let n = (ph - 1) * nsel;
        let sc = selector_context(p);
        d.segment(n, |_| sc, &mut sbuf)?;
        for r in 1..ph {
            let at = store.srow(p, r);
            sel[at..at + nsel].copy_from_slice(&sbuf[(r - 1) * nsel..r * nsel]);
        }
        for r in 0..ph {
            let cur = store.zrow(p, r);
            {
                let zp = if r > 0 {
                    Some(&z[store.zrow(p, r - 1)..])
                } else {
                    None
                };
                let z0 = &z[store.zrow(0, r) + 1..];
                let ctx = |j: usize| {
                    let b = match zp {
                        None => FIRST_ROW_BUCKET,
                        Some(zp) => bucket(zp[j], zp[j + 1], zp[j + 2]),
                    };
                    residual_context(p, b, if p > 0 { z0[j] } else { 0 })
                };
                d.segment(pw, ctx, &mut row)?;
            }
            let zr = &mut z[cur..cur + pw + 2];
            zr[1..pw + 1].copy_from_slice(&row[..pw]);
            zr[0] = row[0];
            zr[pw + 1] = row[pw - 1];
        }
    }
    let nwords = d.words.len() / 2;
    finish(&d.x, d.pos, nwords, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_normalisation_sums_to_4096_even_with_many_rare_symbols() {
        let mut c = vec![1u32; 256];
        c[0] = 1_000_000;
        for counts in [c.clone(), vec![5, 0, 3], vec![7], {
            let mut v = vec![1u32; 255];
            v.push(300);
            v
        }] {
            for f in [
                normalize_reference(&counts),
                normalize_optimal(&counts, 1),
                normalize_optimal(&counts, 8),
            ] {
                assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), 4096);
                for (&fi, &ci) in f.iter().zip(&counts) {
                    assert_eq!(fi > 0, ci > 0);
                }
            }
        }
    }

    #[test]
    fn optimal_normalisation_never_codes_larger() {
        let cost = |c: &[u32], f: &[u16]| -> f64 {
            c.iter()
                .zip(f)
                .filter(|(c, _)| **c > 0)
                .map(|(&c, &f)| f64::from(c) * (4096.0 / f64::from(f)).log2())
                .sum()
        };
        let mut s = 77u32;
        for _ in 0..50 {
            let n = 1 + (s % 200) as usize;
            let counts: Vec<u32> = (0..n)
                .map(|i| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    if (s >> 28) < 3 {
                        0
                    } else {
                        (s >> 16) % (1 + 5000 / (i as u32 + 1))
                    }
                })
                .chain(std::iter::once(3))
                .collect();
            let a = cost(&counts, &normalize_reference(&counts));
            let b = cost(&counts, &normalize_optimal(&counts, 1));
            assert!(b <= a + 1e-6, "{b} > {a}");
        }
    }

    #[test]
    fn tables_round_trip_through_their_bitstream() {
        let mut counts = vec![[0u32; 256]; 102];
        counts[3][0] = 10;
        counts[3][7] = 1;
        counts[99][2] = 5;
        counts[50][255] = 9;
        let t = AnsTables::from_counts(&counts, Normalize::Reference);
        let mut bytes = Vec::new();
        t.write(&mut bytes);
        let (back, used) = AnsTables::parse(&bytes, 102).unwrap();
        assert_eq!(back, t);
        assert_eq!(used, bytes.len());
        assert_eq!(back.freqs(50).map(<[u16]>::len), Some(256));
        assert!(back.freqs(0).is_none());
        for cut in 0..bytes.len() {
            assert!(matches!(
                AnsTables::parse(&bytes[..cut], 102),
                Err(Error::Truncated { .. })
            ));
        }
    }

    /// Frequencies of `n` symbols, multiples of `unit`, summing to 4096 (uneven: one or two units each,
    /// the rest to symbol 0).
    fn freqs_in_units(n: usize, unit: u16) -> Box<[u16]> {
        let mut f: Vec<u16> = (0..n).map(|i| unit * (1 + u16::from(i % 3 == 0))).collect();
        let sum: u16 = f.iter().sum();
        f[0] += 4096 - sum;
        f.into_boxed_slice()
    }

    #[test]
    fn decode_table_finds_every_slot_at_each_planes_resolution() {
        // Plane 0 at full resolution, plane 1 in units of 16 (the table caps at MAX_TABLE_SHIFT), plane 2 in
        // units of 4 but one context only in units of 2 (so the plane uses 2), alpha in units of 8.
        let mut freqs: Vec<Option<Box<[u16]>>> = vec![None; 148];
        for ctx in [0usize, 3, 8, 99] {
            freqs[ctx] = Some(if ctx == 99 {
                [1000, 3000, 96].into()
            } else {
                freqs_in_units(37, 1)
            });
        }
        for ctx in [9usize, 30, 53, 100] {
            freqs[ctx] = Some(freqs_in_units(if ctx == 100 { 4 } else { 60 }, 32));
        }
        for ctx in [54usize, 60, 98, 101] {
            freqs[ctx] = Some(freqs_in_units(90, if ctx == 60 { 2 } else { 4 }));
        }
        for ctx in [102usize, 146, 147] {
            freqs[ctx] = Some(freqs_in_units(if ctx == 147 { 3 } else { 256 }, 8));
        }
        let t = AnsTables { freqs };
        let mut dec = Vec::new();
        let planes = t.decode_table(&mut dec);
        assert_eq!(planes.map(|p| p.shift), [0, MAX_TABLE_SHIFT, 1, 3]);
        for ctx in 0..t.contexts() {
            let Some(cum) = t.cum(ctx) else { continue };
            let pt = planes[plane_of_context(ctx)];
            for slot in 0..PROB_SCALE {
                let e = dec[pt.base(ctx) + (slot >> pt.shift) as usize];
                let sym = (e >> 24) as usize;
                assert!(
                    cum[sym] as u32 <= slot && slot < cum[sym + 1] as u32,
                    "context {ctx} slot {slot}: symbol {sym}"
                );
                assert_eq!(((e >> 12) & 0xfff) + 1, u32::from(cum[sym + 1] - cum[sym]));
                let offset = (e & 0xfff) + (slot & ((1 << pt.shift) - 1));
                assert_eq!(
                    offset,
                    slot - u32::from(cum[sym]),
                    "context {ctx} slot {slot}"
                );
            }
        }
    }

    #[test]
    fn coarse_units_keep_each_planes_tables_within_the_budget() {
        let used = |ctxs: std::ops::Range<usize>| {
            let mut counts = vec![[0u32; 256]; 148];
            for ctx in ctxs {
                counts[ctx][ctx % 5] = 3;
            }
            counts
        };
        // Every context used: plane 0 (10 tables of 16 KiB) fits at full resolution, planes 1–3 (46
        // tables) need units of 4.
        assert_eq!(plane_units(&used(0..148)), [1, 4, 4, 4]);
        // Twelve tables of plane 1 fit exactly; thirteen do not.
        assert_eq!(plane_units(&used(9..21))[1], 1);
        assert_eq!(plane_units(&used(9..22))[1], 2);
        let t = AnsTables::from_counts(&used(0..148), Normalize::Coarse);
        for ctx in 0..148 {
            let unit = [1, 4, 4, 4][plane_of_context(ctx)];
            assert!(
                t.freqs(ctx).unwrap().iter().all(|&f| f % unit == 0),
                "context {ctx}"
            );
        }
    }
}
