//! [`L3Writer`]: an L3 file encoded from bands of rows given in order, in memory bounded by a row of
//! patches rather than by the image, and byte for byte the file [`crate::encode_with`] writes for the
//! same pixels and options.
//!
//! Every format encodes a row of patches from that row's pixels alone, so a row of patches is encoded as
//! soon as its last pixel row arrives. What cannot be written yet goes to a [`Spill`] file:
//! - version 1 and version 2 BP order their entries plane-major (all of plane 0, then plane 1, …) behind
//!   an offset table of every entry's position, so each row's encoded entries are spilled and copied out
//!   in file order at the end;
//! - version 2 ANS puts frequency tables counted over the whole image before any entry, so the pixels
//!   are spilled as they come (the first front-end pass counts them), read back a row of patches at a
//!   time for the encoder's second pass (its selectors chosen under the first pass's tables, unless the
//!   choices are the reference ones) and again to code the chunks, which are spilled, then copied out.

mod spill;

use crate::encode::{EncodeOptions, check_shape};
use crate::error::Error;
use crate::format::{Format, Profile, valid_v2_patch_size};
use crate::v2::encode::{self as v2e, BitCosts, Choices};
use crate::v2::front::Cost;
use crate::{Crc32c, crc32c, v1, v2};
use spill::Spill;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bytes copied from the spill to the output at a time.
const COPY_CHUNK: usize = 1 << 20;

/// Encodes an L3 file from its rows, given in order in bands of any height ([`L3Writer::push_rows`]), and
/// writes it at [`L3Writer::finish`]. Memory holds one row of patches (patch size × width × channels
/// bytes), its encoder state and a few bytes per patch (the offset table); the rest waits in a spill file
/// in the output's folder (or [`L3Writer::spill_dir`]), removed however the writer ends. The output is
/// written only by `finish`, all at once, so an error leaves the caller's output as it was before
/// `finish`: write it under a temporary name ([`stdx::fs::AtomicFile`]) and commit after `finish`.
///
/// The file is [`crate::encode_with`]'s for the same pixels and options, byte for byte, whatever the bands'
/// heights and `threads` (which spreads a row's patches over threads). Every error names the output.
pub struct L3Writer {
    output: PathBuf,
    spill_dir: Option<PathBuf>,
    width: u32,
    height: u32,
    channels: u8,
    n: u8,
    format: Format,
    choices: Choices,
    entry_crcs: bool,
    threads: usize,
    /// The rows of the current row of patches.
    band: Vec<u8>,
    /// Rows given so far.
    rows: u32,
    /// Encoded entries, row of patches after row of patches.
    encoded: Option<Spill>,
    /// ANS: the pixels, for the passes after the tables.
    raw: Option<Spill>,
    /// Each entry's length, in the order encoded: row of patches, plane, patch column.
    lens: Vec<u32>,
    /// Version 2 with entry CRCs: each entry's CRC-32C, in the same order.
    crcs: Vec<u32>,
    /// ANS: the first front-end pass's context counts.
    counts: Vec<[u32; 256]>,
    /// Encoded bytes so far.
    data_len: usize,
    /// Reused encoder output of one row of patches.
    buf: Vec<u8>,
    /// The first error: the writer refuses everything after it.
    failed: Option<Error>,
}

impl L3Writer {
    /// A writer of a `width`×`height` image of `channels` (1, 3 or 4) interleaved channels as `opts` says,
    /// for `output` (the path its errors name; its folder holds the spill file). Refuses what
    /// [`crate::encode_with`] refuses for the image's shape and options.
    pub fn new(
        output: &Path,
        width: u32,
        height: u32,
        channels: u8,
        opts: &EncodeOptions,
    ) -> Result<L3Writer, Error> {
        let n = opts
            .patch_size
            .unwrap_or_else(|| opts.format.default_patch_size(width, height));
        let named = |e| Error::File {
            path: output.to_path_buf(),
            source: Box::new(e),
        };
        check_shape(width, height, channels, n).map_err(named)?;
        if let Format::V2(_) = opts.format
            && !valid_v2_patch_size(n)
        {
            return Err(named(Error::BadPatchSize { found: n }));
        }
        let counts = match opts.format {
            Format::V2(Profile::Ans) => vec![[0u32; 256]; v2::contexts(channels)],
            _ => Vec::new(),
        };
        Ok(L3Writer {
            output: output.to_path_buf(),
            spill_dir: None,
            width,
            height,
            channels,
            n,
            format: opts.format,
            choices: opts.choices,
            entry_crcs: opts.entry_crcs && opts.format != Format::V1,
            threads: opts.threads,
            band: Vec::new(),
            rows: 0,
            encoded: None,
            raw: None,
            lens: Vec::new(),
            crcs: Vec::new(),
            counts,
            data_len: 0,
            buf: Vec::new(),
            failed: None,
        })
    }

    /// Puts the spill file in `dir` instead of the output's folder.
    pub fn spill_dir(mut self, dir: &Path) -> L3Writer {
        self.spill_dir = Some(dir.to_path_buf());
        self
    }

    /// Rows given so far.
    pub fn rows_written(&self) -> u32 {
        self.rows
    }

    /// Takes the next rows of the image: whole rows of `width × channels` interleaved bytes, any number of
    /// them. Refuses rows past the image's last (taking none of them) and a partial row.
    pub fn push_rows(&mut self, rows: &[u8]) -> Result<(), Error> {
        self.check_ok()?;
        let row_bytes = self.width as usize * self.channels as usize;
        if !rows.len().is_multiple_of(row_bytes) {
            return Err(self.named(Error::PartialRow {
                row_bytes,
                got: rows.len(),
            }));
        }
        let given = u64::from(self.rows) + (rows.len() / row_bytes) as u64;
        if given > u64::from(self.height) {
            return Err(self.named(Error::RowsPastEnd {
                height: self.height,
                given,
            }));
        }
        let mut rest = rows;
        while !rest.is_empty() {
            let band_start = self.rows - (self.band.len() / row_bytes) as u32;
            let band_rows = u32::from(self.n).min(self.height - band_start) as usize;
            let take = (band_rows * row_bytes - self.band.len()).min(rest.len());
            self.band.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            self.rows += (take / row_bytes) as u32;
            if self.band.len() == band_rows * row_bytes {
                if let Err(e) = self.band_complete() {
                    self.failed = Some(e.clone());
                    return Err(self.named(e));
                }
                self.band.clear();
            }
        }
        Ok(())
    }

    /// Encodes whatever is left and writes the whole file to `out`; returns `out`. Refuses to finish
    /// before the last row was given.
    pub fn finish<W: Write>(mut self, mut out: W) -> Result<W, Error> {
        self.check_ok()?;
        if self.rows < self.height {
            return Err(self.named(Error::RowsMissing {
                height: self.height,
                given: self.rows,
            }));
        }
        match self.write_file(&mut out) {
            Ok(()) => Ok(out),
            Err(e) => Err(self.named(e)),
        }
    }

    fn check_ok(&self) -> Result<(), Error> {
        match &self.failed {
            Some(e) => Err(self.named(e.clone())),
            None => Ok(()),
        }
    }

    fn named(&self, e: Error) -> Error {
        Error::File {
            path: self.output.clone(),
            source: Box::new(e),
        }
    }

    fn dims(&self) -> (usize, usize, usize) {
        (self.width as usize, self.channels as usize, self.n as usize)
    }

    /// Offset-table entries per row of patches.
    fn entries_per_band(&self) -> usize {
        let (w, c, n) = self.dims();
        match self.format {
            Format::V2(Profile::Ans) => w.div_ceil(n),
            _ => c * w.div_ceil(n),
        }
    }

    fn spill(&self) -> Result<Spill, Error> {
        let dir = match &self.spill_dir {
            Some(d) => d.clone(),
            None => match self.output.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
        };
        let stem = self
            .output
            .file_name()
            .map_or_else(|| "l3".into(), |s| s.to_string_lossy().into_owned());
        Spill::create(&dir, &stem)
    }

    /// The current row of patches is complete: encode it (ANS: spill and count it).
    fn band_complete(&mut self) -> Result<(), Error> {
        let (w, c, n) = self.dims();
        match self.format {
            Format::V2(Profile::Ans) => {
                if self.raw.is_none() {
                    self.raw = Some(self.spill()?);
                }
                self.raw.as_mut().expect("created").append(&self.band)?;
                let fronts = v2e::band_fronts(&self.band, w, c, n, Cost::Ans, None, self.threads);
                v2e::count_fronts(&fronts, c, &mut self.counts);
                Ok(())
            }
            Format::V1 | Format::V2(Profile::Bp) => {
                let mut buf = std::mem::take(&mut self.buf);
                buf.clear();
                let mut lens = Vec::with_capacity(self.entries_per_band());
                if self.format == Format::V1 {
                    v1::encode::encode_band(&self.band, w, c, n, self.threads, &mut buf, &mut lens);
                } else {
                    v2e::bp_band(&self.band, w, c, n, self.threads, &mut buf, &mut lens);
                }
                let r = self.spill_entries(&buf, &lens, 0);
                self.buf = buf;
                r
            }
        }
    }

    /// Appends one row of patches' encoded entries (`lens` each) to the spill, after checking that the file
    /// stays addressable (`tables_len`: the ANS tables' bytes, 0 otherwise).
    fn spill_entries(
        &mut self,
        bytes: &[u8],
        lens: &[usize],
        tables_len: usize,
    ) -> Result<(), Error> {
        self.data_len += bytes.len();
        if self.format == Format::V1 {
            if u32::try_from(self.data_len).is_err() {
                return Err(Error::EncodedTooLarge {
                    bytes: self.data_len,
                });
            }
        } else {
            let entries =
                self.entries_per_band() * self.height.div_ceil(u32::from(self.n)) as usize;
            v2e::check_size(
                v2e::data_start(tables_len, entries, self.entry_crcs),
                self.data_len,
            )?;
        }
        if self.encoded.is_none() {
            self.encoded = Some(self.spill()?);
        }
        self.encoded.as_mut().expect("created").append(bytes)?;
        let mut at = 0;
        for &l in lens {
            self.lens.push(l as u32);
            if self.entry_crcs {
                self.crcs.push(crc32c(&bytes[at..at + l]));
            }
            at += l;
        }
        Ok(())
    }

    /// ANS: the tables, then every chunk into the spill; returns the tables' bytes. The pixels' spill goes
    /// when this returns.
    fn encode_ans(&mut self) -> Result<Vec<u8>, Error> {
        let (w, c, n) = self.dims();
        let (height, threads) = (self.height as usize, self.threads);
        let raw = self.raw.take().expect("ANS spills its pixels");
        let costs: Option<BitCosts> = v2e::second_pass_costs(&self.counts, self.choices);
        if let Some(costs) = &costs {
            let mut counts = vec![[0u32; 256]; self.counts.len()];
            read_bands(&raw, w * c, n, height, |band| {
                let fronts = v2e::band_fronts(band, w, c, n, Cost::Ans, Some(costs), threads);
                v2e::count_fronts(&fronts, c, &mut counts);
                Ok(())
            })?;
            self.counts = counts;
        }
        let (enc, tables) = v2e::final_tables(&self.counts, self.choices);
        let (mut buf, mut lens) = (Vec::new(), Vec::new());
        read_bands(&raw, w * c, n, height, |band| {
            let fronts = v2e::band_fronts(band, w, c, n, Cost::Ans, costs.as_ref(), threads);
            buf.clear();
            lens.clear();
            v2e::ans_band(&fronts, c, &enc, threads, &mut buf, &mut lens);
            self.spill_entries(&buf, &lens, tables.len())
        })?;
        Ok(tables)
    }

    /// Writes the whole file to `out`: the header and tables, the offset table (and CRC tables) from the
    /// lengths, then the spilled entries in file order (and the file's CRC).
    fn write_file(&mut self, out: &mut impl Write) -> Result<(), Error> {
        let tables = match self.format {
            Format::V2(Profile::Ans) => self.encode_ans()?,
            _ => Vec::new(),
        };
        let (w, _, n) = self.dims();
        let px_n = w.div_ceil(n);
        let bands = self.height.div_ceil(u32::from(self.n)) as usize;
        let per_band = self.entries_per_band();
        let planes = per_band / px_n;
        // Where each entry starts in the spill (encoded order), and the file order of the entries.
        let mut starts = Vec::with_capacity(self.lens.len() + 1);
        let mut acc = 0u64;
        starts.push(0);
        for &l in &self.lens {
            acc += u64::from(l);
            starts.push(acc);
        }
        let file_order = || {
            (0..planes).flat_map(move |p| {
                (0..bands).flat_map(move |b| (0..px_n).map(move |px| b * per_band + p * px_n + px))
            })
        };
        let head = match self.format {
            Format::V1 => {
                let mut head = v1::encode::header(self.width, self.height, self.channels, self.n);
                let mut offset = 0u32;
                for i in file_order() {
                    head.extend_from_slice(&offset.to_le_bytes());
                    offset += self.lens[i];
                }
                head
            }
            Format::V2(profile) => {
                let header = v2e::header(
                    self.width,
                    self.height,
                    self.channels,
                    self.n,
                    profile,
                    self.entry_crcs,
                );
                let lens: Vec<usize> = file_order().map(|i| self.lens[i] as usize).collect();
                let crcs: Vec<u32> = if self.entry_crcs {
                    file_order().map(|i| self.crcs[i]).collect()
                } else {
                    Vec::new()
                };
                v2e::prefix(
                    &header,
                    &tables,
                    &lens,
                    self.entry_crcs.then_some(&crcs[..]),
                )
            }
        };
        let io = |e: std::io::Error| Error::io(&self.output, "writing", &e);
        let mut crc = Crc32c::new();
        crc.update(&head);
        out.write_all(&head).map_err(io)?;
        if let Some(spill) = &self.encoded {
            let mut chunk = vec![0u8; COPY_CHUNK];
            // Each (plane, row of patches) is one contiguous run of the spill.
            for p in 0..planes {
                for b in 0..bands {
                    let first = b * per_band + p * px_n;
                    let (mut at, end) = (starts[first], starts[first + px_n]);
                    while at < end {
                        let len = (end - at).min(COPY_CHUNK as u64) as usize;
                        spill.read_at(at, &mut chunk[..len])?;
                        crc.update(&chunk[..len]);
                        out.write_all(&chunk[..len]).map_err(io)?;
                        at += len as u64;
                    }
                }
            }
        }
        if self.format != Format::V1 {
            out.write_all(&crc.finish().to_le_bytes()).map_err(io)?;
        }
        out.flush().map_err(io)
    }
}

/// Calls `each` with every row of patches (`n` rows of `row_bytes`, the last one shorter) of an image of
/// `height` rows spilled in `raw`, read back in order into one reused buffer.
fn read_bands(
    raw: &Spill,
    row_bytes: usize,
    n: usize,
    height: usize,
    mut each: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut band = vec![0u8; n * row_bytes];
    let (mut y, mut at) = (0usize, 0u64);
    while y < height {
        let rows = n.min(height - y);
        let b = &mut band[..rows * row_bytes];
        raw.read_at(at, b)?;
        each(b)?;
        y += rows;
        at += b.len() as u64;
    }
    Ok(())
}
