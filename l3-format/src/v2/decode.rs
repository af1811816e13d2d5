//! The v2 decoder: the patches under a region (the whole image is one region) into the caller's buffer at
//! its strides, patch after patch; whole images spread bands of patch rows over `stdx::parallel`.
//!
//! Per patch: BP decodes each plane's rows in lockstep (header, deltas, reconstruction) and writes each row
//! as it is done; ANS first entropy-decodes the whole chunk (every plane's selectors and residual codes:
//! the contexts of plane p need plane 0's codes), then reconstructs and writes row by row. Rows below the
//! region are not reconstructed; rows above it are (each row predicts from the one above) but not written.

use super::ans::{self, AnsTables, Store};
use super::bits::window;
use super::bp::{BpRows, GROUP, MAX_GROUPS};
use super::container::{Layout, entry_range, tables_end};
use super::front::{ROW, reconstruct_row};
use crate::error::{Error, PatchId};
use crate::format::{HEADER_LEN, Profile};
use crate::geometry::Geometry;
use crate::interleave::{interleave3, interleave4};
use crate::pixel_layout::PixelLayout;
use vocab::Rect;

/// The ANS decode table built once per decode call (see [`AnsTables::decode_table`]): one `u32` per
/// (context, slot >> k) giving symbol, frequency and the slot's offset in one load. At full resolution
/// (16 KiB per context) a colour plane's tables outgrow the L2 cache; a symbol table plus a frequency
/// table would not, but a second dependent lookup per symbol costs more than the misses (measured on a
/// Zen 3 EPYC: 20–30 % slower). Files whose frequencies are coarse (the default encoder's) get tables of
/// 4096 >> k entries instead, and stay in L2.
pub(crate) struct Prepared {
    pub dec: Vec<u32>,
    pub planes: [ans::PlaneTable; 4],
    pub used: [u64; 4],
}

impl Prepared {
    pub(crate) fn new(t: &AnsTables) -> Self {
        let mut dec = Vec::new();
        let planes = t.decode_table(&mut dec);
        Prepared {
            dec,
            planes,
            used: t.used_mask(),
        }
    }

    pub(crate) fn tables(&self) -> ans::Tables<'_> {
        ans::Tables {
            dec: &self.dec,
            planes: self.planes,
            used: self.used,
        }
    }
}

thread_local! {
    /// This thread's decode tables, rebuilt for each call: only the contexts a file uses are written, so
    /// the buffers are reused without clearing (a lookup in another context is refused before it is made).
    static PREPARED: std::cell::RefCell<Option<Prepared>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with decode tables for `t` (none for BP), built in this thread's reusable buffers.
fn with_prepared<R>(t: Option<&AnsTables>, f: impl FnOnce(Option<&Prepared>) -> R) -> R {
    let Some(t) = t else { return f(None) };
    PREPARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let p = slot.get_or_insert_with(|| Prepared {
                dec: Vec::new(),
                planes: Default::default(),
                used: [0; 4],
            });
            p.planes = t.decode_table(&mut p.dec);
            p.used = t.used_mask();
            f(Some(p))
        }
        Err(_) => f(Some(&Prepared::new(t))),
    })
}

/// Where decoded pixels go, in coordinates relative to the region's top-left corner.
pub(crate) enum Out<'o> {
    /// Pixel (x, y), channel c at `y·row_stride + x·C + c`.
    Interleaved {
        buf: &'o mut [u8],
        row_stride: usize,
    },
    /// Channel c's pixel (x, y) at `planes[c][y·row_stride + x]`.
    Planar {
        planes: Vec<&'o mut [u8]>,
        row_stride: usize,
    },
}

/// The "row above" row 0: zeros (row 0 predicts pred = L, 0 at column 0).
static ZERO_ROW: [u8; ROW] = [0; ROW];

/// Per-call scratch: the ANS symbol store and each plane's two rolling reconstruction rows.
pub(crate) struct Work {
    /// (patch size, channels) it was made for.
    key: (usize, usize),
    store: Store,
    /// Two symbol stores: ANS decodes two patches of the same shape at once.
    z: [Vec<u8>; 2],
    sel: [Vec<u8>; 2],
    /// The ANS decoder's padded copies of the two chunks' words.
    words: [Vec<u8>; 2],
    rows: [[[u8; ROW]; 2]; 4],
}

impl Work {
    pub(crate) fn new(g: &Geometry) -> Self {
        let store = Store::new(g.patch_size as usize);
        Work {
            key: (g.patch_size as usize, g.channels as usize),
            store,
            z: [0, 1].map(|_| vec![0; store.z_len(g.channels as usize)]),
            sel: [0, 1].map(|_| vec![0; store.sel_len(g.channels as usize)]),
            words: [Vec::new(), Vec::new()],
            rows: [[[0; ROW]; 2]; 4],
        }
    }
}

/// Decodes `region` (checked by the caller) into `out`; `entry(i)` gives the bytes of offset-table entry i.
/// `AVX2` may be true only after the run-time check (see `crate::simd::has_avx2_bmi2`).
#[inline(always)]
pub(crate) fn decode_region<'d, const AVX2: bool>(
    g: &Geometry,
    profile: Profile,
    prep: Option<&Prepared>,
    region: Rect,
    out: &mut Out<'_>,
    work: &mut Work,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    for (first, count) in g.rows_under(region) {
        let mut p = first;
        while p < first + count {
            let r = g.patch_rect(p);
            let at = place(r, region);
            match profile {
                Profile::Bp => patch_bp::<AVX2>(g, p, r, &at, out, work, entry)?,
                Profile::Ans => {
                    let prep = prep.ok_or(Error::BadOptions {
                        reason: "ANS tables missing",
                    })?;
                    // Two patches of the same shape decode together (the AVX2 decoder interleaves them).
                    if AVX2 && p + 1 < first + count {
                        let r2 = g.patch_rect(p + 1);
                        if (r2.w, r2.h) == (r.w, r.h) {
                            let chunks = [entry(p)?, entry(p + 1)?];
                            ans_entropy::<AVX2, 2>(g, [p, p + 1], r, prep, work, chunks)?;
                            ans_emit::<AVX2>(g, r, &at, out, work, 0);
                            ans_emit::<AVX2>(g, r2, &place(r2, region), out, work, 1);
                            p += 2;
                            continue;
                        }
                    }
                    ans_entropy::<AVX2, 1>(g, [p], r, prep, work, [entry(p)?])?;
                    ans_emit::<AVX2>(g, r, &at, out, work, 0);
                }
            }
            p += 1;
        }
    }
    Ok(())
}

/// Where patch `r` meets `region`.
#[inline(always)]
fn place(r: Rect, region: Rect) -> Place {
    let (x0, x1) = (r.x.max(region.x), (r.x + r.w).min(region.x + region.w));
    let (y0, y1) = (r.y.max(region.y), (r.y + r.h).min(region.y + region.h));
    Place {
        cols: (x0 - r.x) as usize..(x1 - r.x) as usize,
        skip: (y0 - r.y) as usize,
        rows: (y1 - r.y) as usize,
        ox: (x0 - region.x) as usize,
        oy: (y0 - region.y) as usize,
    }
}

/// The part of a patch to write: patch columns `cols`, patch rows `skip..rows`, landing at (ox, oy).
struct Place {
    cols: std::ops::Range<usize>,
    skip: usize,
    rows: usize,
    ox: usize,
    oy: usize,
}

#[inline(always)]
fn patch_bp<'d, const AVX2: bool>(
    g: &Geometry,
    patch: usize,
    r: Rect,
    at: &Place,
    out: &mut Out<'_>,
    work: &mut Work,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    let c = g.channels as usize;
    let per = g.patches_per_channel();
    let pw = r.w as usize;
    let mut decs: [Option<BpRows<'d>>; 4] = [None, None, None, None];
    for (p, d) in decs.iter_mut().enumerate().take(c) {
        *d = Some(BpRows::new(
            entry(p * per + patch)?,
            pw,
            PatchId { channel: p, patch },
        ));
    }
    let mut z = [0u8; 256 + 16];
    let mut sels = [0u8; 8];
    let mut aligned = [0u8; ALIGNED_LEN];
    for row in 0..at.rows {
        let cur = row & 1;
        for (p, d) in decs.iter_mut().enumerate().take(c) {
            let Some(d) = d else { continue };
            bp_row::<AVX2>(d, &mut z, &mut sels, &mut aligned)?;
            let [a, b] = &mut work.rows[p];
            let (prev, next) = match (row, cur) {
                (0, _) => (&ZERO_ROW, a),
                (_, 0) => (&*b, a),
                _ => (&*a, b),
            };
            reconstruct::<AVX2>(prev, &z, &sels, pw, row == 0, next);
        }
        if row >= at.skip {
            emit::<AVX2>(out, c, &work.rows, cur, at, row);
        }
    }
    if at.rows == r.h as usize {
        for d in decs.iter().take(c).flatten() {
            d.finish()?;
        }
    }
    Ok(())
}

/// Bytes of a BP row's deltas shifted into bit phase 0 (the AVX2 copy's scratch, reused from row to row:
/// bytes past a row's deltas are read but never used).
const ALIGNED_LEN: usize = 8 * MAX_GROUPS + 40;

/// One BP row: the portable unpacker, or the AVX2 copy's realigned row and shuffle-spread groups.
#[inline(always)]
#[allow(unsafe_code)]
fn bp_row<const AVX2: bool>(
    d: &mut BpRows<'_>,
    z: &mut [u8; 272],
    sels: &mut [u8; 8],
    buf: &mut [u8; ALIGNED_LEN],
) -> Result<(), Error> {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        let ng = d.pw().div_ceil(GROUP);
        let pdep = crate::simd::fast_pdep();
        let h = d.head::<true>(sels)?;
        let data = d.data();
        // Every group holds 8·nbit bits, so all groups start at the row's bit phase: shift the row's delta
        // bytes into phase once, and each group is then 8 bytes at a byte offset (the prefix sum of nbit).
        let total = h.sum;
        let n32 = (total + 8).div_ceil(32);
        let start = h.delta_bit / 8;
        if let Some(src) = data.get(start..start + 32 * n32 + 1) {
            // SAFETY: AVX2 and BMI2 are the run-time-checked guarantee of the AVX2 copy.
            unsafe { crate::simd::v2::realign(src, (h.delta_bit % 8) as u32, n32, buf) };
            let mut off = 0usize;
            for (zg, &nb) in z.chunks_exact_mut(GROUP).zip(&h.nbit[..ng]) {
                let mut w = [0u8; 8];
                w.copy_from_slice(&buf[off..off + 8]);
                // SAFETY: as above.
                let bytes =
                    unsafe { crate::simd::v2::spread_bits(u64::from_le_bytes(w), nb, pdep) };
                zg.copy_from_slice(&bytes.to_le_bytes());
                off += usize::from(nb);
            }
            return Ok(());
        }
        // Near the end of the entry: 64-bit windows read with bounds checks.
        // Each group's first bit: a prefix sum of 8·nbit (only the last group may be shorter), computed
        // apart so that the loads below do not wait on each other.
        let mut offs = [0usize; MAX_GROUPS];
        let mut bit = h.delta_bit;
        for (o, &nb) in offs[..ng].iter_mut().zip(&h.nbit[..ng]) {
            *o = bit;
            bit += GROUP * usize::from(nb);
        }
        for ((zg, &o), &nb) in z
            .chunks_exact_mut(GROUP)
            .zip(&offs[..ng])
            .zip(&h.nbit[..ng])
        {
            let v = window(data, o);
            // SAFETY: BMI2 is part of the run-time check that makes `AVX2` true.
            let bytes = unsafe { crate::simd::v2::spread_bits(v, nb, pdep) };
            zg.copy_from_slice(&bytes.to_le_bytes());
        }
        return Ok(());
    }
    d.next_row(z, sels)
}

/// Entropy-decodes the chunks of `K` patches of shape `r` into the work's symbol stores 0..K.
#[inline(always)]
#[allow(unsafe_code)]
fn ans_entropy<const AVX2: bool, const K: usize>(
    g: &Geometry,
    patches: [usize; K],
    r: Rect,
    prep: &Prepared,
    work: &mut Work,
    chunks: [&[u8]; K],
) -> Result<(), Error> {
    let c = g.channels as usize;
    let (pw, ph) = (r.w as usize, r.h as usize);
    let ids = patches.map(|patch| PatchId { channel: 0, patch });
    let store = work.store;
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        let [z0, z1] = &mut work.z;
        let [s0, s1] = &mut work.sel;
        let mut zs: [&mut [u8]; 2] = [z0, z1];
        let mut ss: [&mut [u8]; 2] = [s0, s1];
        let (za, sa) = (zs.split_at_mut(K).0, ss.split_at_mut(K).0);
        let (Ok(z), Ok(sel)) = (
            <&mut [&mut [u8]; K]>::try_from(za),
            <&mut [&mut [u8]; K]>::try_from(sa),
        ) else {
            return Err(Error::BadOptions {
                reason: "decode pairs",
            });
        };
        if crate::simd::rans512::usable() {
            // SAFETY: AVX2, BMI2, POPCNT and AVX-512 F/BW/VL checked at run time by `usable`.
            return unsafe {
                crate::simd::rans512::decode_chunks_avx512::<K>(
                    chunks,
                    prep.tables(),
                    pw,
                    ph,
                    c,
                    store,
                    z,
                    sel,
                    &mut work.words,
                    ids,
                )
            };
        }
        // SAFETY: `AVX2` is true only after the run-time AVX2+BMI2+POPCNT check.
        return unsafe {
            crate::simd::v2::decode_chunks_avx2::<K>(
                chunks,
                prep.tables(),
                pw,
                ph,
                c,
                store,
                z,
                sel,
                &mut work.words,
                ids,
            )
        };
    }
    for k in 0..K {
        ans::decode_chunk_scalar(
            chunks[k],
            prep.tables(),
            pw,
            ph,
            c,
            store,
            &mut work.z[k],
            &mut work.sel[k],
            ids[k],
        )?;
    }
    Ok(())
}

/// Reconstructs the rows of a patch from symbol store `k` and writes the part `at` names.
#[inline(always)]
fn ans_emit<const AVX2: bool>(
    g: &Geometry,
    r: Rect,
    at: &Place,
    out: &mut Out<'_>,
    work: &mut Work,
    k: usize,
) {
    let c = g.channels as usize;
    let pw = r.w as usize;
    let store = work.store;
    for row in 0..at.rows {
        let cur = row & 1;
        for p in 0..c {
            let z = &work.z[k][store.zrow(p, row) + 1..];
            let s = &work.sel[k][store.srow(p, row)..store.srow(p, row) + 8];
            let [a, b] = &mut work.rows[p];
            let (prev, next) = match (row, cur) {
                (0, _) => (&ZERO_ROW, a),
                (_, 0) => (&*b, a),
                _ => (&*a, b),
            };
            reconstruct::<AVX2>(prev, z, s, pw, row == 0, next);
        }
        if row >= at.skip {
            emit::<AVX2>(out, c, &work.rows, cur, at, row);
        }
    }
}

/// One row's reconstruction: the AVX2 scan in the AVX2 copy, the portable loop otherwise.
#[inline(always)]
#[allow(unsafe_code)]
fn reconstruct<const AVX2: bool>(
    prev: &[u8; ROW],
    z: &[u8],
    sels: &[u8],
    pw: usize,
    first: bool,
    cur: &mut [u8; ROW],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is the run-time-checked guarantee of the AVX2 copy.
        unsafe { crate::simd::v2::reconstruct_row_avx2(prev, z, sels, pw, first, cur) };
        return;
    }
    reconstruct_row(prev, z, sels, pw, first, cur)
}

/// Writes row `row` of the patch (the `cur` rolling rows of every plane) at its place: inverse colour
/// transform, then interleaved or planar.
#[inline(always)]
fn emit<const AVX2: bool>(
    out: &mut Out<'_>,
    c: usize,
    rows: &[[[u8; ROW]; 2]; 4],
    cur: usize,
    at: &Place,
    row: usize,
) {
    let (c0, c1) = (at.cols.start + 1, at.cols.end + 1);
    let n = c1 - c0;
    let y = at.oy + row - at.skip;
    let p = |k: usize| &rows[k][cur][c0..c1];
    // The rows hold ROW bytes with column c at c + 1, so 32-byte blocks from c0 stay inside them.
    let wide = |k: usize| &rows[k][cur][c0..];
    match out {
        Out::Interleaved { buf, row_stride } => {
            let at_ = y * *row_stride + at.ox * c;
            let dst = &mut buf[at_..at_ + n * c];
            match c {
                1 => dst.copy_from_slice(p(0)),
                3 => rgb::<AVX2>(dst, wide(0), wide(1), wide(2), n),
                _ => {
                    let (rr, bb) = colour(wide(0), wide(1), wide(2), n);
                    interleave4::<AVX2>(dst, &rr[..n], p(0), &bb[..n], p(3))
                }
            }
        }
        Out::Planar { planes, row_stride } => {
            let at_ = y * *row_stride + at.ox;
            if c == 1 {
                planes[0][at_..at_ + n].copy_from_slice(p(0));
            } else {
                let (rr, bb) = colour(wide(0), wide(1), wide(2), n);
                planes[0][at_..at_ + n].copy_from_slice(&rr[..n]);
                planes[1][at_..at_ + n].copy_from_slice(p(0));
                planes[2][at_..at_ + n].copy_from_slice(&bb[..n]);
                if c == 4 {
                    planes[3][at_..at_ + n].copy_from_slice(p(3));
                }
            }
        }
    }
}

/// R = P1 + G and B = P2 + G for the first `n` columns (`n` ≤ 256), 32 bytes at a time.
#[inline(always)]
fn colour(g: &[u8], p1: &[u8], p2: &[u8], n: usize) -> ([u8; 256], [u8; 256]) {
    let mut rr = [0u8; 256];
    let mut bb = [0u8; 256];
    for k in 0..n.div_ceil(32) {
        let i = 32 * k;
        let (gs, a, b) = (&g[i..i + 32], &p1[i..i + 32], &p2[i..i + 32]);
        let (ro, bo) = (&mut rr[i..i + 32], &mut bb[i..i + 32]);
        for j in 0..32 {
            ro[j] = a[j].wrapping_add(gs[j]);
            bo[j] = b[j].wrapping_add(gs[j]);
        }
    }
    (rr, bb)
}

/// `n` RGB pixels from a row of G, P1, P2 (each readable 32·⌈n / 32⌉ bytes): the fused AVX2 kernel, or
/// the colour transform then the interleaver.
#[inline(always)]
#[allow(unsafe_code)]
fn rgb<const AVX2: bool>(dst: &mut [u8], g: &[u8], p1: &[u8], p2: &[u8], n: usize) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: AVX2 is the run-time-checked guarantee of the AVX2 copy.
        unsafe { crate::simd::v2::emit_rgb_avx2(dst, g, p1, p2, n) };
        return;
    }
    let (rr, bb) = colour(g, p1, p2, n);
    interleave3::<AVX2>(dst, &rr[..n], &g[..n], &bb[..n]);
}

/// Splits a planar buffer into its `c` planes (`plane_stride` apart; the last one runs to the end).
pub(crate) fn split_planes(buf: &mut [u8], c: usize, plane_stride: usize) -> Vec<&mut [u8]> {
    let mut planes = Vec::with_capacity(c);
    let mut rest = buf;
    for k in 0..c {
        if k + 1 == c {
            planes.push(rest);
            break;
        }
        let (a, b) = rest.split_at_mut(plane_stride.min(rest.len()));
        planes.push(a);
        rest = b;
    }
    planes
}

/// The [`Out`] of a caller's buffer at `layout`'s strides.
fn out_for(out: &mut [u8], layout: PixelLayout, channels: u8) -> Out<'_> {
    match layout {
        PixelLayout::Interleaved { row_stride } => Out::Interleaved {
            buf: out,
            row_stride,
        },
        PixelLayout::Planar {
            row_stride,
            plane_stride,
        } => Out::Planar {
            planes: split_planes(out, channels as usize, plane_stride),
            row_stride,
        },
    }
}

/// Decodes `region` (checked by the caller) of a `profile` file of geometry `g` into `out` at `layout`'s
/// strides: `tables` are the file's ANS tables (`None` for BP), `entry(i)` gives the bytes of offset-table
/// entry i (from the file in memory, or from the ranges read for an index).
pub(crate) fn region<'d>(
    g: &Geometry,
    profile: Profile,
    tables: Option<&AnsTables>,
    region: Rect,
    out: &mut [u8],
    layout: PixelLayout,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    let mut o = out_for(out, layout, g.channels);
    with_prepared(tables, |prep| {
        decode_region_dispatch(g, profile, prep, region, &mut o, entry)
    })
}

/// Decodes `region` with the widest vector unit the CPU has.
#[allow(unsafe_code)]
fn decode_region_dispatch<'d>(
    g: &Geometry,
    profile: Profile,
    prep: Option<&Prepared>,
    region: Rect,
    out: &mut Out<'_>,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    with_work(g, |work| {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2_bmi2() {
            // SAFETY: the AVX2 copies need AVX2, BMI2 and POPCNT, checked just above.
            return unsafe {
                match profile {
                    Profile::Bp => decode_region_avx2_bp(g, prep, region, out, work, entry),
                    Profile::Ans => decode_region_avx2_ans(g, prep, region, out, work, entry),
                }
            };
        }
        decode_region::<false>(g, profile, prep, region, out, work, entry)
    })
}

thread_local! {
    /// The last scratch this thread used, kept for the next call with the same patch size and channels
    /// (every buffer in it is written before it is read, so it needs no clearing between calls).
    static WORK: std::cell::RefCell<Option<Work>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's scratch for `g`'s shape.
fn with_work<R>(g: &Geometry, f: impl FnOnce(&mut Work) -> R) -> R {
    let key = (g.patch_size as usize, g.channels as usize);
    WORK.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let w = match slot.take() {
                Some(w) if w.key == key => w,
                _ => Work::new(g),
            };
            let w = slot.insert(w);
            f(w)
        }
        // Re-entered (cannot happen today): a fresh scratch.
        Err(_) => f(&mut Work::new(g)),
    })
}

/// The AVX2 copy of [`decode_region`] for BP files (one copy per profile keeps each profile's hot loops
/// together).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2,popcnt")]
fn decode_region_avx2_bp<'d>(
    g: &Geometry,
    prep: Option<&Prepared>,
    region: Rect,
    out: &mut Out<'_>,
    work: &mut Work,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    decode_region::<true>(g, Profile::Bp, prep, region, out, work, entry)
}

/// The AVX2 copy of [`decode_region`] for ANS files.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2,popcnt")]
fn decode_region_avx2_ans<'d>(
    g: &Geometry,
    prep: Option<&Prepared>,
    region: Rect,
    out: &mut Out<'_>,
    work: &mut Work,
    entry: &dyn Fn(usize) -> Result<&'d [u8], Error>,
) -> Result<(), Error> {
    decode_region::<true>(g, Profile::Ans, prep, region, out, work, entry)
}

/// A validated v2 file: geometry, layout and bytes.
pub(crate) struct V2<'a> {
    pub g: Geometry,
    pub l: Layout,
    pub bytes: &'a [u8],
}

impl<'a> V2<'a> {
    /// The ANS tables (validated at parse, so reading them again cannot fail).
    pub(crate) fn tables(&self) -> Option<AnsTables> {
        match self.l.profile {
            Profile::Bp => None,
            Profile::Ans => Some(
                tables_end(&self.g, &self.bytes[HEADER_LEN..self.l.offsets_at])
                    .ok()?
                    .0,
            ),
        }
    }

    #[cfg(test)]
    pub(crate) fn prepared(&self) -> Option<Prepared> {
        self.tables().map(|t| Prepared::new(&t))
    }

    /// The bytes of offset-table entry `i`.
    pub(crate) fn entry(&self, i: usize) -> &'a [u8] {
        &self.bytes[entry_range(&self.l, self.bytes, i)]
    }

    /// Decodes the whole image, HWC (`planar = false`) or CHW, with bands of patch rows spread over
    /// `threads` threads (1 = this thread only, 0 = every core).
    pub(crate) fn whole(&self, out: &mut [u8], planar: bool, threads: usize) -> Result<(), Error> {
        with_prepared(self.tables().as_ref(), |prep| {
            self.whole_with(prep, out, planar, threads)
        })
    }

    fn whole_with(
        &self,
        prep: Option<&Prepared>,
        out: &mut [u8],
        planar: bool,
        threads: usize,
    ) -> Result<(), Error> {
        let g = &self.g;
        let (w, h, c, n) = (
            g.width as usize,
            g.height as usize,
            g.channels as usize,
            g.patch_size as usize,
        );
        let band = |py: usize| Rect::new(0, (py * n) as u32, w as u32, n.min(h - py * n) as u32);
        let run = |py: usize, mut o: Out<'_>| {
            decode_region_dispatch(g, self.l.profile, prep, band(py), &mut o, &|i| {
                Ok(self.entry(i))
            })
        };
        if !planar {
            let tasks = out.chunks_mut(n * w * c).enumerate();
            stdx::parallel::for_each(tasks, threads, |(py, buf)| {
                run(
                    py,
                    Out::Interleaved {
                        buf,
                        row_stride: w * c,
                    },
                )
            })
        } else {
            let mut per_band: Vec<Vec<&mut [u8]>> = (0..g.patches_y as usize)
                .map(|_| Vec::with_capacity(c))
                .collect();
            for plane in out.chunks_mut(w * h) {
                for (py, b) in plane.chunks_mut(n * w).enumerate() {
                    per_band[py].push(b);
                }
            }
            let tasks = per_band.into_iter().enumerate();
            stdx::parallel::for_each(tasks, threads, |(py, planes)| {
                run(
                    py,
                    Out::Planar {
                        planes,
                        row_stride: w,
                    },
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Choices, EncodeOptions, Format, L3File, PixelLayout, encode_with};

    fn image(w: usize, h: usize, c: usize, seed: u32) -> Vec<u8> {
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

    /// The public decoders take the AVX2 path (BMI2 unpack, 32-lane rANS on two patches at once, vector
    /// reconstruction) where the CPU has it; the portable copy must give the same pixels and errors.
    #[test]
    fn portable_and_dispatched_decoders_agree() {
        for (w, h, c, n) in [
            (301u32, 177u32, 3u8, 64u8),
            (130, 65, 4, 32),
            (67, 140, 1, 128),
            (1, 5, 3, 32),
        ] {
            let px = image(w as usize, h as usize, c as usize, w * h);
            // ANS with full-resolution tables and with each plane's own coarser ones.
            for (profile, choices) in [
                (Profile::Bp, Choices::Reference),
                (Profile::Ans, Choices::Reference),
                (Profile::Ans, Choices::FastDecode),
            ] {
                let opts = EncodeOptions {
                    format: Format::V2(profile),
                    patch_size: Some(n),
                    choices,
                    ..EncodeOptions::default()
                };
                let mut file = encode_with(&px, w, h, c, &opts).unwrap();
                let f = L3File::parse(&file).unwrap();
                let v = f.v2().unwrap();
                let region = Rect::new(0, 0, w, h);
                let layout = PixelLayout::packed(w, h, c, false);
                let mut out = vec![0u8; px.len()];
                let prep = v.prepared();
                let mut work = Work::new(&v.g);
                decode_region::<false>(
                    &v.g,
                    profile,
                    prep.as_ref(),
                    region,
                    &mut out_for(&mut out, layout, c),
                    &mut work,
                    &|i| Ok(v.entry(i)),
                )
                .unwrap();
                assert!(out == px, "portable {profile} {w}x{h}x{c}");
                // Damage one byte of patch data: both paths fail the same way (or both still decode).
                let at = f.data_offset() + (file.len() - 4 - f.data_offset()) / 3;
                file[at] ^= 0x5a;
                let opts = crate::ParseOptions {
                    verify_crc: false,
                    ..Default::default()
                };
                let f = L3File::parse_with(&file, &opts).unwrap();
                let v = f.v2().unwrap();
                let mut a = vec![0u8; px.len()];
                let ra = f.decode_hwc(&mut a);
                let mut b = vec![0u8; px.len()];
                let rb = decode_region::<false>(
                    &v.g,
                    profile,
                    prep.as_ref(),
                    region,
                    &mut out_for(&mut b, layout, c),
                    &mut work,
                    &|i| Ok(v.entry(i)),
                );
                assert_eq!(ra, rb, "{profile} {w}x{h}x{c}");
                if ra.is_ok() {
                    assert!(a == b);
                }
            }
        }
    }
}
