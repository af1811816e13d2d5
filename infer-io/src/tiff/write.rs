//! A tiled BigTIFF written tile by tile, as the network's tiles finish, in memory bounded by the tiles in
//! flight (a band of rows), never by the image.
//!
//! The file (TIFF 6.0 with the BigTIFF extension; little-endian; one image):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 2 | `II` (little-endian) |
//! | 2 | 2 | 43 (BigTIFF) |
//! | 4 | 2 | 8 (bytes per offset) |
//! | 6 | 2 | 0 |
//! | 8 | 8 | offset of the image file directory (IFD), written last |
//! | 16 | … | the tiles, uncompressed, [`TILE`]×[`TILE`] pixels of C interleaved samples each (edge tiles padded with zeros, as TIFF requires), in the order they completed |
//! | … | … | TileOffsets and TileByteCounts (LONG8 arrays), the SHORT arrays longer than 8 bytes, then the IFD |
//!
//! The IFD: a `u64` entry count, then 20-byte entries sorted by tag (`u16` tag, `u16` type — 3 SHORT, 4
//! LONG, 16 LONG8 —, `u64` count, 8 bytes holding the value when it fits, else its offset), then a `u64` 0
//! (no next IFD). Tags: ImageWidth (256), ImageLength (257), BitsPerSample (258: 8 or 32 per sample),
//! Compression (259: 1, none), PhotometricInterpretation (262: 2 RGB for 3 or 4 samples, else 1
//! BlackIsZero), SamplesPerPixel (277), PlanarConfiguration (284: 1, chunky), TileWidth (322), TileLength
//! (323), TileOffsets (324), TileByteCounts (325), ExtraSamples (338: with 4 samples 2, unassociated
//! alpha, after RGB; otherwise 0, unspecified, for each sample after the first, gray) and SampleFormat
//! (339: 1 unsigned integer, 3 IEEE float).

use crate::error::{Error, Result};
use bsp_tiling::Tensor;
use bsp_tiling::field::Sink;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The side of the file's tiles (a multiple of 16, as TIFF requires; 256 is libtiff's usual choice).
pub const TILE: usize = 256;

/// The samples a TIFF output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDType {
    /// Clamped to 0..255 and rounded, as 8-bit image outputs are.
    U8,
    /// The network's raw output.
    F32,
}

impl OutDType {
    pub fn parse(s: &str) -> Option<OutDType> {
        match s {
            "uint8" | "u8" => Some(OutDType::U8),
            "float32" | "f32" => Some(OutDType::F32),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            OutDType::U8 => "uint8",
            OutDType::F32 => "float32",
        }
    }
    pub(crate) fn bytes(self) -> usize {
        match self {
            OutDType::U8 => 1,
            OutDType::F32 => 4,
        }
    }
}

impl std::fmt::Display for OutDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OutDType {
    type Err = vocab::Invalid;
    fn from_str(s: &str) -> std::result::Result<OutDType, vocab::Invalid> {
        OutDType::parse(s).ok_or_else(|| vocab::Invalid::new("out_dtype", s, "uint8 or float32"))
    }
}

/// A tiled BigTIFF being written (see the module documentation). [`Sink::put_tile`] takes regions of the
/// output in any order and from any thread; a TIFF tile goes to the file once all its pixels arrived.
pub struct TiffWriter {
    path: PathBuf,
    file: File,
    c: usize,
    h: usize,
    w: usize,
    dtype: OutDType,
    across: usize,
    state: Mutex<State>,
}

struct State {
    /// Tiles partly filled: their bytes and how many pixels arrived.
    pending: HashMap<usize, (Vec<u8>, usize)>,
    offsets: Vec<u64>,
    /// The end of the file: where the next tile goes.
    end: u64,
    written: usize,
}

const HEADER: u64 = 16;

impl TiffWriter {
    /// Starts the file `file` (empty, opened for writing; `path` names it in errors) for a `c`×`h`×`w`
    /// output.
    pub fn new(
        file: File,
        path: &Path,
        c: usize,
        h: usize,
        w: usize,
        dtype: OutDType,
    ) -> Result<TiffWriter> {
        let bad = |reason: String| Error::Tiff {
            path: path.to_path_buf(),
            reason,
        };
        if c == 0 || h == 0 || w == 0 {
            return Err(bad(format!("cannot write an empty image ({c}×{h}×{w})")));
        }
        if c > u16::MAX as usize || h > u32::MAX as usize || w > u32::MAX as usize {
            return Err(bad(format!(
                "{c}×{h}×{w} is past TIFF's limits (2^16 samples per pixel, 2^32 rows or columns)"
            )));
        }
        let mut head = Vec::with_capacity(HEADER as usize);
        head.extend_from_slice(b"II");
        head.extend_from_slice(&43u16.to_le_bytes());
        head.extend_from_slice(&8u16.to_le_bytes());
        head.extend_from_slice(&0u16.to_le_bytes());
        head.extend_from_slice(&0u64.to_le_bytes());
        file.write_all_at(&head, 0).map_err(|e| Error::Tiff {
            path: path.to_path_buf(),
            reason: format!("writing: {e}"),
        })?;
        let (across, down) = (w.div_ceil(TILE), h.div_ceil(TILE));
        Ok(TiffWriter {
            path: path.to_path_buf(),
            file,
            c,
            h,
            w,
            dtype,
            across,
            state: Mutex::new(State {
                pending: HashMap::new(),
                offsets: vec![0; across * down],
                end: HEADER,
                written: 0,
            }),
        })
    }

    fn tile_bytes(&self) -> usize {
        TILE * TILE * self.c * self.dtype.bytes()
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::Tiff {
            path: self.path.clone(),
            reason: format!("writing: {e}"),
        }
    }

    /// Writes the tile tables and the directory. Fails if a part of the image was never put.
    pub fn finish(self) -> Result<()> {
        let tile_bytes = self.tile_bytes() as u64;
        let TiffWriter {
            path,
            file,
            c,
            h,
            w,
            dtype,
            state,
            ..
        } = self;
        let st = state.into_inner().unwrap_or_else(|p| p.into_inner());
        if st.written != st.offsets.len() {
            return Err(Error::Tiff {
                path,
                reason: format!(
                    "internal: {} of {} tiles were complete",
                    st.written,
                    st.offsets.len()
                ),
            });
        }
        let n = st.offsets.len() as u64;
        let (c_n, c) = (c, c as u64);
        let mut tail: Vec<u8> = Vec::new();
        let mut at = st.end.next_multiple_of(8);
        let pad = (at - st.end) as usize;
        tail.resize(pad, 0);
        // Arrays too long for an entry's 8 bytes go before the IFD; the entry holds their offset.
        let mut put_array = |tail: &mut Vec<u8>, bytes: Vec<u8>| -> u64 {
            let off = at;
            at += bytes.len() as u64;
            tail.extend_from_slice(&bytes);
            let aligned = at.next_multiple_of(8);
            tail.resize(tail.len() + (aligned - at) as usize, 0);
            at = aligned;
            off
        };
        let le8 = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let le2 = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (bits, format) = match dtype {
            OutDType::U8 => (8u16, 1u16),
            OutDType::F32 => (32, 3),
        };
        // RGB for 3 samples, RGB + alpha for 4; otherwise gray with the rest as unspecified extra samples
        // (the `tiff` crate reads those as multi-band, while it would drop an unspecified 4th sample of RGB).
        let color = if matches!(c_n, 3 | 4) { 3 } else { 1 };
        let extra = c_n - color;
        let extra_kind = if c_n == 4 { 2 } else { 0 };
        // (tag, type, count, value bytes).
        let mut entries: Vec<(u16, u16, u64, Vec<u8>)> = vec![
            (256, 4, 1, (w as u32).to_le_bytes().to_vec()),
            (257, 4, 1, (h as u32).to_le_bytes().to_vec()),
            (258, 3, c, le2(&vec![bits; c_n])),
            (259, 3, 1, le2(&[1])),
            (262, 3, 1, le2(&[if color == 3 { 2 } else { 1 }])),
            (277, 3, 1, le2(&[c_n as u16])),
            (284, 3, 1, le2(&[1])),
            (322, 4, 1, (TILE as u32).to_le_bytes().to_vec()),
            (323, 4, 1, (TILE as u32).to_le_bytes().to_vec()),
            (324, 16, n, le8(&st.offsets)),
            (325, 16, n, le8(&vec![tile_bytes; st.offsets.len()])),
        ];
        if extra > 0 {
            entries.push((338, 3, extra as u64, le2(&vec![extra_kind; extra])));
        }
        entries.push((339, 3, c, le2(&vec![format; c_n])));
        let mut ifd_entries = Vec::with_capacity(entries.len());
        for (tag, ty, count, bytes) in entries {
            let field = if bytes.len() <= 8 {
                let mut v = bytes;
                v.resize(8, 0);
                v
            } else {
                put_array(&mut tail, bytes).to_le_bytes().to_vec()
            };
            ifd_entries.push((tag, ty, count, field));
        }
        let ifd_at = at;
        tail.extend_from_slice(&(ifd_entries.len() as u64).to_le_bytes());
        for (tag, ty, count, field) in ifd_entries {
            tail.extend_from_slice(&tag.to_le_bytes());
            tail.extend_from_slice(&ty.to_le_bytes());
            tail.extend_from_slice(&count.to_le_bytes());
            tail.extend_from_slice(&field);
        }
        tail.extend_from_slice(&0u64.to_le_bytes());
        file.write_all_at(&tail, st.end)
            .and_then(|()| file.write_all_at(&ifd_at.to_le_bytes(), 8))
            .map_err(|e| Error::Tiff {
                path,
                reason: format!("writing: {e}"),
            })
    }
}

impl Sink for TiffWriter {
    fn put_tile(&self, y0: usize, x0: usize, t: &Tensor) -> bsp_tiling::Result<()> {
        Ok(self.put(y0, x0, t)?)
    }
}

impl TiffWriter {
    /// Places `t` with its top-left corner at `(y0, x0)`, clipped to the image; every tile it completes
    /// goes to the file.
    pub fn put(&self, y0: usize, x0: usize, t: &Tensor) -> Result<()> {
        let rows = t.h.min(self.h.saturating_sub(y0));
        let cols = t.w.min(self.w.saturating_sub(x0));
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (c, bps) = (self.c, self.dtype.bytes());
        let mut complete = Vec::new();
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            for ty in y0 / TILE..=(y0 + rows - 1) / TILE {
                for tx in x0 / TILE..=(x0 + cols - 1) / TILE {
                    let idx = ty * self.across + tx;
                    // This region's part of tile (ty, tx), in output coordinates.
                    let (ya, yb) = (y0.max(ty * TILE), (y0 + rows).min((ty + 1) * TILE));
                    let (xa, xb) = (x0.max(tx * TILE), (x0 + cols).min((tx + 1) * TILE));
                    let tile_bytes = self.tile_bytes();
                    let entry = st
                        .pending
                        .entry(idx)
                        .or_insert_with(|| (vec![0; tile_bytes], 0));
                    for y in ya..yb {
                        let row = &mut entry.0[((y - ty * TILE) * TILE) * c * bps..];
                        for x in xa..xb {
                            let px = &mut row[(x - tx * TILE) * c * bps..][..c * bps];
                            for ch in 0..c {
                                let v = t.at(ch.min(t.c - 1), y - y0, x - x0);
                                match self.dtype {
                                    OutDType::U8 => px[ch] = v.clamp(0.0, 255.0).round() as u8,
                                    OutDType::F32 => {
                                        px[ch * 4..ch * 4 + 4].copy_from_slice(&v.to_le_bytes())
                                    }
                                }
                            }
                        }
                    }
                    entry.1 += (yb - ya) * (xb - xa);
                    let area = (self.h.min((ty + 1) * TILE) - ty * TILE)
                        * (self.w.min((tx + 1) * TILE) - tx * TILE);
                    if entry.1 > area {
                        return Err(Error::Tiff {
                            path: self.path.clone(),
                            reason: format!("internal: tile ({ty}, {tx}) was written twice"),
                        });
                    }
                    if entry.1 == area {
                        let (bytes, _) = st.pending.remove(&idx).expect("present");
                        let at = st.end;
                        st.end += bytes.len() as u64;
                        st.offsets[idx] = at;
                        st.written += 1;
                        complete.push((at, bytes));
                    }
                }
            }
        }
        // The file offsets are reserved: the writes themselves need no lock.
        for (at, bytes) in complete {
            self.file.write_all_at(&bytes, at).map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}
