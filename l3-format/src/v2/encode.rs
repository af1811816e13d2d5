//! The v2 encoder: the front end per patch (colour transform, selectors, residual codes), then the BP rows
//! or, for ANS, context counts over the whole image, the tables, and one rANS chunk per patch.

use super::ans::{
    self, AnsTables, EncTables, FIRST_ROW_BUCKET, Normalize, PatchSymbols, bucket,
    residual_context, selector_context,
};
use super::bp::{self, MAX_GROUPS};
use super::container::{CRC_LEN, crc_table_len};
use super::front::{Cost, RUN, candidates, choose, runs, zigzag};
use crate::crc32c::crc32c;
use crate::error::Error;
use crate::format::{FLAG_ENTRY_CRCS, HEADER_LEN, MAGIC, Profile};

/// How the v2 encoder makes the choices the format leaves free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Choices {
    /// The design's reference choices, which reproduce the conformance vectors byte for byte: per run the
    /// selector with the lowest cost (BP: Σ 8·nbit over its groups; ANS: Σ bitlen(z)), ties to the lowest;
    /// frequencies rounded to 4096 with the largest fixed up.
    Reference,
    /// ANS only (BP is as `Reference`): after a first pass with the reference choices, every run's selector
    /// is chosen again by its cost under the first pass's tables (the coder's true cost in bits, selector
    /// symbol included), and frequencies are normalised to minimise the coded size. Smaller files, about
    /// twice the encode time.
    Smallest,
    /// ANS only: as `Smallest`, but each plane's frequencies are multiples of the smallest power of two
    /// (≤ 8) that keeps the plane's decode tables within 192 KiB, so that a CPU decoder's lookups stay in
    /// its L2 cache (see SPEC.md §2.9). Files stay conforming; on the corpus they are smaller than with
    /// `Reference` and decode markedly faster. The default.
    #[default]
    FastDecode,
}

/// One patch after the front end: residual codes of every plane (`z[(p·ph + r)·pw + c]`) and selectors
/// (`sel[(p·ph + r)·nsel + k]`, row 0 unused).
pub(crate) struct Front {
    pw: usize,
    ph: usize,
    z: Vec<u8>,
    sel: Vec<u8>,
}

/// Bit costs (×256) of every symbol in every context, from tables; unseen symbols cost 16 bits.
pub(crate) struct BitCosts(Vec<[u16; 256]>);

impl BitCosts {
    fn new(t: &AnsTables) -> Self {
        BitCosts(
            (0..t.contexts())
                .map(|ctx| {
                    let mut c = [16 * 256u16; 256];
                    if let Some(f) = t.freqs(ctx) {
                        for (s, &fs) in f.iter().enumerate() {
                            if fs > 0 {
                                c[s] = ((12.0 - f64::from(fs).log2()) * 256.0).round() as u16;
                            }
                        }
                    }
                    c
                })
                .collect(),
        )
    }
}

#[allow(clippy::too_many_arguments)]
/// Extracts plane `p` of the patch at (x0, y0) into `out` (pw × ph, stride pw), colour-transformed.
fn extract(
    px: &[u8],
    width: usize,
    c: usize,
    x0: usize,
    y0: usize,
    pw: usize,
    ph: usize,
    p: usize,
    out: &mut [u8],
) {
    for r in 0..ph {
        let src = &px[((y0 + r) * width + x0) * c..((y0 + r) * width + x0 + pw) * c];
        let dst = &mut out[r * pw..(r + 1) * pw];
        match (c, p) {
            (1, _) | (4, 3) => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(c)) {
                    *d = s[p];
                }
            }
            (_, 0) => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(c)) {
                    *d = s[1];
                }
            }
            // P1 = R − G, P2 = B − G.
            (_, _) => {
                let ch = if p == 1 { 0 } else { 2 };
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(c)) {
                    *d = s[ch].wrapping_sub(s[1]);
                }
            }
        }
    }
}

/// Runs the front end on one patch: selectors by `cost` (or, with `costs`, by the coder cost under those
/// tables), and residual codes.
#[allow(clippy::too_many_arguments)]
fn front(
    px: &[u8],
    width: usize,
    c: usize,
    x0: usize,
    y0: usize,
    pw: usize,
    ph: usize,
    cost: Cost,
    costs: Option<&BitCosts>,
) -> Front {
    let nsel = runs(pw);
    let mut f = Front {
        pw,
        ph,
        z: vec![0; c * pw * ph],
        sel: vec![0; c * ph * nsel],
    };
    let mut plane = vec![0u8; pw * ph];
    let mut zs = [[0u8; 256]; 4];
    for p in 0..c {
        extract(px, width, c, x0, y0, pw, ph, p, &mut plane);
        let zbase = p * ph * pw;
        // Row 0: pred = L, 0 at column 0.
        for col in 0..pw {
            let pred = if col == 0 { 0 } else { plane[col - 1] };
            f.z[zbase + col] = zigzag(plane[col].wrapping_sub(pred));
        }
        for r in 1..ph {
            let (prev, cur) = (&plane[(r - 1) * pw..r * pw], &plane[r * pw..(r + 1) * pw]);
            candidates(prev, cur, &mut zs);
            for k in 0..nsel {
                let (c0, c1) = (k * RUN, (k * RUN + RUN).min(pw));
                let s = match costs {
                    None => choose(&zs, c0, c1, cost),
                    Some(bc) => {
                        let zp = &f.z[zbase + (r - 1) * pw..zbase + r * pw];
                        let z0 = &f.z[r * pw..(r + 1) * pw];
                        let sc = &bc.0[selector_context(p) as usize];
                        let mut best = (u32::MAX, 0u8);
                        for (s, z) in zs.iter().enumerate() {
                            let mut bits = u32::from(sc[s]);
                            for col in c0..c1 {
                                let t = zp[col];
                                let tl = if col == 0 { t } else { zp[col - 1] };
                                let tr = if col + 1 == pw { t } else { zp[col + 1] };
                                let ctx = residual_context(
                                    p,
                                    bucket(tl, t, tr),
                                    if p > 0 { z0[col] } else { 0 },
                                );
                                bits += u32::from(bc.0[ctx as usize][z[col] as usize]);
                            }
                            if bits < best.0 {
                                best = (bits, s as u8);
                            }
                        }
                        best.1
                    }
                };
                f.sel[(p * ph + r) * nsel + k] = s;
                f.z[zbase + r * pw + c0..zbase + r * pw + c1]
                    .copy_from_slice(&zs[s as usize][c0..c1]);
            }
        }
    }
    f
}

/// Calls `each(ctx, sym)` for every symbol of a patch in chunk order; `segment(n)` at each segment start.
fn symbols(f: &Front, c: usize, mut segment: impl FnMut(usize), mut each: impl FnMut(u8, u8)) {
    let (pw, ph) = (f.pw, f.ph);
    let nsel = runs(pw);
    for p in 0..c {
        segment((ph - 1) * nsel);
        let sc = selector_context(p);
        for r in 1..ph {
            for k in 0..nsel {
                each(sc, f.sel[(p * ph + r) * nsel + k]);
            }
        }
        let zb = p * ph * pw;
        for r in 0..ph {
            segment(pw);
            for col in 0..pw {
                let b = if r == 0 {
                    FIRST_ROW_BUCKET
                } else {
                    let zp = &f.z[zb + (r - 1) * pw..zb + r * pw];
                    let t = zp[col];
                    let tl = if col == 0 { t } else { zp[col - 1] };
                    let tr = if col + 1 == pw { t } else { zp[col + 1] };
                    bucket(tl, t, tr)
                };
                let z0 = if p > 0 { f.z[r * pw + col] } else { 0 };
                each(residual_context(p, b, z0), f.z[zb + r * pw + col]);
            }
        }
    }
}

/// The fronts of one row of patches — `src` holds its rows of interleaved pixels, `w` wide — patch
/// columns spread over `threads` threads (the result does not depend on it).
pub(crate) fn band_fronts(
    src: &[u8],
    w: usize,
    c: usize,
    nn: usize,
    cost: Cost,
    costs: Option<&BitCosts>,
    threads: usize,
) -> Vec<Front> {
    let ph = src.len() / (w * c);
    let cols: Vec<usize> = (0..w.div_ceil(nn)).collect();
    let fronts = stdx::parallel::map(&cols, threads, |_, &px| {
        let x0 = px * nn;
        Ok::<_, std::convert::Infallible>(front(src, w, c, x0, 0, nn.min(w - x0), ph, cost, costs))
    });
    match fronts {
        Ok(f) => f,
        Err(never) => match never {},
    }
}

/// BP: encodes one row of patches (`src`, as [`band_fronts`]), appending its entries in the file's
/// plane-major order to `bytes` and each entry's length to `lens`.
pub(crate) fn bp_band(
    src: &[u8],
    w: usize,
    c: usize,
    nn: usize,
    threads: usize,
    bytes: &mut Vec<u8>,
    lens: &mut Vec<usize>,
) {
    let fronts = band_fronts(src, w, c, nn, Cost::Bp, None, threads);
    for p in 0..c {
        for f in &fronts {
            let before = bytes.len();
            let nsel = runs(f.pw);
            let mut nbit = [0u8; MAX_GROUPS];
            for r in 0..f.ph {
                let z = &f.z[(p * f.ph + r) * f.pw..(p * f.ph + r + 1) * f.pw];
                let s = &f.sel[(p * f.ph + r) * nsel..(p * f.ph + r + 1) * nsel];
                bp::pack_row(z, s, r == 0, &mut nbit, bytes);
            }
            lens.push(bytes.len() - before);
        }
    }
}

/// ANS: adds the context counts of `fronts` to `counts` (one `[u32; 256]` per context).
pub(crate) fn count_fronts(fronts: &[Front], c: usize, counts: &mut [[u32; 256]]) {
    for f in fronts {
        symbols(f, c, |_| {}, |ctx, s| counts[ctx as usize][s as usize] += 1);
    }
}

/// ANS: how `choices` turns counts into frequencies.
pub(crate) fn normalization(choices: Choices) -> Normalize {
    match choices {
        Choices::Reference => Normalize::Reference,
        Choices::Smallest => Normalize::Optimal,
        Choices::FastDecode => Normalize::Coarse,
    }
}

/// ANS: the costs the second front-end pass chooses selectors by — `None` for the reference choices,
/// which make one pass — from the first pass's counts.
pub(crate) fn second_pass_costs(counts: &[[u32; 256]], choices: Choices) -> Option<BitCosts> {
    (choices != Choices::Reference)
        .then(|| BitCosts::new(&AnsTables::from_counts(counts, normalization(choices))))
}

/// ANS: the final tables from the counts of the last front-end pass, and their bytes.
pub(crate) fn final_tables(counts: &[[u32; 256]], choices: Choices) -> (EncTables, Vec<u8>) {
    let tables = AnsTables::from_counts(counts, normalization(choices));
    let mut bytes = Vec::new();
    tables.write(&mut bytes);
    (EncTables::new(&tables), bytes)
}

/// ANS: one chunk per patch of `fronts`, appended to `bytes`, each chunk's length to `lens`; patches
/// spread over `threads` threads.
pub(crate) fn ans_band(
    fronts: &[Front],
    c: usize,
    enc: &EncTables,
    threads: usize,
    bytes: &mut Vec<u8>,
    lens: &mut Vec<usize>,
) {
    let chunk = |f: &Front, out: &mut Vec<u8>| {
        let mut ps = PatchSymbols {
            syms: Vec::with_capacity(f.z.len() + f.sel.len()),
            segments: Vec::with_capacity(c * (f.ph + 1)),
        };
        symbols(
            f,
            c,
            |n| ps.segments.push(n as u32),
            |ctx, s| ps.syms.push((ctx, s)),
        );
        ans::encode_chunk(&ps, enc, out);
    };
    if stdx::parallel::threads(threads) <= 1 {
        for f in fronts {
            let before = bytes.len();
            chunk(f, bytes);
            lens.push(bytes.len() - before);
        }
        return;
    }
    let chunks = stdx::parallel::map(fronts, threads, |_, f| {
        let mut out = Vec::new();
        chunk(f, &mut out);
        Ok::<_, std::convert::Infallible>(out)
    });
    let chunks = match chunks {
        Ok(ch) => ch,
        Err(never) => match never {},
    };
    for ch in chunks {
        bytes.extend_from_slice(&ch);
        lens.push(ch.len());
    }
}

/// The 20-byte version-2 header.
pub(crate) fn header(
    width: u32,
    height: u32,
    channels: u8,
    n: u8,
    profile: Profile,
    entry_crcs: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    let flags = if entry_crcs { FLAG_ENTRY_CRCS } else { 0 };
    out.extend_from_slice(&[channels, 8, n, profile.byte(), flags, 0]);
    out
}

/// Where the first entry starts: after the header, the ANS tables (`tables_len` bytes), the offset table
/// of `entries` entries and, with `entry_crcs`, their CRC table and the prefix CRC.
pub(crate) fn data_start(tables_len: usize, entries: usize, entry_crcs: bool) -> usize {
    let crcs = if entry_crcs {
        crc_table_len(entries)
    } else {
        0
    };
    HEADER_LEN + tables_len + 4 * entries + crcs
}

/// Refuses a file whose last entry would end past what `u32` offsets address.
pub(crate) fn check_size(data_start: usize, data_len: usize) -> Result<(), Error> {
    let total = data_start + data_len + CRC_LEN;
    if u32::try_from(total - CRC_LEN).is_err() {
        return Err(Error::EncodedTooLarge { bytes: total });
    }
    Ok(())
}

/// Every byte before the first entry: `header`, the ANS `tables`, the offset table made from each entry's
/// length (`lens`, in file order) and, when `crcs` holds the entries' CRC-32Cs (file order), their table and
/// the prefix CRC. The sizes were checked ([`check_size`]).
pub(crate) fn prefix(
    header: &[u8],
    tables: &[u8],
    lens: &[usize],
    crcs: Option<&[u32]>,
) -> Vec<u8> {
    let start = data_start(tables.len(), lens.len(), crcs.is_some());
    let mut out = Vec::with_capacity(start);
    out.extend_from_slice(header);
    out.extend_from_slice(tables);
    let mut offset = start;
    for l in lens {
        out.extend_from_slice(&(offset as u32).to_le_bytes());
        offset += l;
    }
    if let Some(crcs) = crcs {
        for crc in crcs {
            out.extend_from_slice(&crc.to_le_bytes());
        }
        let prefix = crc32c(&out);
        out.extend_from_slice(&prefix.to_le_bytes());
    }
    debug_assert_eq!(out.len(), start);
    out
}

/// Per-band results: BP rows of each (plane, patch) or ANS chunks, with each entry's length.
#[derive(Default)]
struct Band {
    bytes: Vec<u8>,
    lens: Vec<usize>,
    fronts: Vec<Front>,
}

/// Encodes validated HWC pixels as a v2 file.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: u8,
    n: u8,
    profile: Profile,
    choices: Choices,
    entry_crcs: bool,
    threads: usize,
) -> Result<Vec<u8>, Error> {
    let (w, c, nn) = (width as usize, channels as usize, n as usize);
    let px_n = w.div_ceil(nn);
    let band_px = nn * w * c;
    let mut bands: Vec<Band> = pixels.chunks(band_px).map(|_| Band::default()).collect();
    let mut tables_bytes = Vec::new();
    match profile {
        Profile::Bp => {
            let tasks = bands.iter_mut().zip(pixels.chunks(band_px));
            stdx::parallel::for_each(tasks, threads, |(band, src)| {
                bp_band(src, w, c, nn, 1, &mut band.bytes, &mut band.lens);
                Ok::<(), Error>(())
            })?;
        }
        Profile::Ans => {
            let k = ans::contexts(channels);
            let count = |bands: &mut Vec<Band>, costs: Option<&BitCosts>| {
                let partial = std::sync::Mutex::new(vec![[0u32; 256]; k]);
                let tasks = bands.iter_mut().zip(pixels.chunks(band_px));
                stdx::parallel::for_each(tasks, threads, |(band, src)| {
                    let mut local = vec![[0u32; 256]; k];
                    band.fronts = band_fronts(src, w, c, nn, Cost::Ans, costs, 1);
                    count_fronts(&band.fronts, c, &mut local);
                    let mut all = partial.lock().unwrap_or_else(|p| p.into_inner());
                    for (a, l) in all.iter_mut().zip(&local) {
                        for (x, y) in a.iter_mut().zip(l) {
                            *x += y;
                        }
                    }
                    Ok::<(), Error>(())
                })?;
                Ok::<_, Error>(partial.into_inner().unwrap_or_else(|p| p.into_inner()))
            };
            let mut counts = count(&mut bands, None)?;
            if let Some(costs) = second_pass_costs(&counts, choices) {
                counts = count(&mut bands, Some(&costs))?;
            }
            let (enc, bytes) = final_tables(&counts, choices);
            tables_bytes = bytes;
            stdx::parallel::for_each(bands.iter_mut(), threads, |band| {
                let fronts = std::mem::take(&mut band.fronts);
                ans_band(&fronts, c, &enc, 1, &mut band.bytes, &mut band.lens);
                Ok::<(), Error>(())
            })?;
        }
    }

    // Assemble: header, [tables], offsets from the file start, [entry CRCs, prefix CRC], data, CRC.
    let planes = if profile == Profile::Bp { c } else { 1 };
    let entries = planes * px_n * bands.len();
    let data_len: usize = bands.iter().map(|b| b.bytes.len()).sum();
    let start = data_start(tables_bytes.len(), entries, entry_crcs);
    check_size(start, data_len)?;
    // Per band, the start of each entry within its bytes.
    let starts: Vec<Vec<usize>> = bands
        .iter()
        .map(|b| {
            let mut s = Vec::with_capacity(b.lens.len() + 1);
            let mut acc = 0;
            s.push(0);
            for l in &b.lens {
                acc += l;
                s.push(acc);
            }
            s
        })
        .collect();
    let mut lens = Vec::with_capacity(entries);
    let mut crcs = Vec::with_capacity(if entry_crcs { entries } else { 0 });
    for p in 0..planes {
        for (b, s) in bands.iter().zip(&starts) {
            for px in 0..px_n {
                let i = p * px_n + px;
                lens.push(b.lens[i]);
                if entry_crcs {
                    crcs.push(crc32c(&b.bytes[s[i]..s[i + 1]]));
                }
            }
        }
    }
    let head = header(width, height, channels, n, profile, entry_crcs);
    let mut out = prefix(&head, &tables_bytes, &lens, entry_crcs.then_some(&crcs[..]));
    out.reserve_exact(data_len + CRC_LEN);
    for p in 0..planes {
        for (b, s) in bands.iter().zip(&starts) {
            out.extend_from_slice(&b.bytes[s[p * px_n]..s[(p + 1) * px_n]]);
        }
    }
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}
