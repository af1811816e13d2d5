//! A TIFF or BigTIFF read by region: one page of the file (page 0 by default: a pyramidal slide's full
//! resolution, a GeoTIFF's full image; later pages are reduced levels, overviews, thumbnails), or one of
//! its SubIFD levels (see `open`), of which a
//! window decodes only the tiles or strips (the page's *chunks*) it covers, through the `tiff` crate (uncompressed, LZW, Deflate, PackBits, JPEG — what the crate
//! decodes). Classic and BigTIFF, tiled or striped, chunky or planar; 8- and 16-bit unsigned and 32-bit
//! float samples; any number of samples per pixel except palette and colour-space images (CMYK, YCbCr,
//! Lab), which are refused by name.
//!
//! Memory: decoded chunks are kept in a [`ChunkCache`] bounded in bytes, raised to one row of chunks
//! across the image when a row is larger (a file stored as one strip is then decoded once, whole, and
//! [`TiffRegions::note`] says so); every chunk size is checked against the memory limit (`stdx::mem`)
//! before anything is decoded, so a file whose chunks do not fit is a typed error, not an abort.

use super::cache::{Chunk, ChunkCache, Samples};
use super::open::{Dec, open_decoder_at, tiff_error};
use crate::error::{Error, Result};
use bsp_tiling::field::{Field, Input, span};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tiff::ColorType;
use tiff::decoder::{ChunkType, DecodingResult, Limits};
use tiff::tags::Tag;

/// The type of a file's samples. Integers are read as their values (0..255, 0..65535), floats as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleType {
    U8,
    U16,
    F32,
}

/// A TIFF input read by region (see the module documentation).
pub struct TiffRegions {
    path: PathBuf,
    /// The page read (image file directory, from 0) and its level (0: the page, n: its n-th SubIFD);
    /// every pooled decoder is positioned on it.
    page: usize,
    level: usize,
    width: usize,
    height: usize,
    channels: usize,
    sample: SampleType,
    planar: bool,
    tiled: bool,
    /// Chunk size in pixels (a strip's width is the image's).
    chunk_w: usize,
    chunk_h: usize,
    across: usize,
    down: usize,
    decoders: Mutex<Vec<Dec>>,
    /// The `tiff` crate's decoding buffer limit: one row of chunks (checked against the memory limit).
    decode_limit: usize,
    cache: ChunkCache,
    note: Option<String>,
}

impl TiffRegions {
    /// Opens page 0 of `path` ([`TiffRegions::open_page`]).
    pub fn open(path: &Path, cache_bytes: usize) -> Result<TiffRegions> {
        TiffRegions::open_page(path, 0, cache_bytes)
    }

    /// Opens page `page` of `path` ([`TiffRegions::open_level`] at level 0).
    pub fn open_page(path: &Path, page: usize, cache_bytes: usize) -> Result<TiffRegions> {
        TiffRegions::open_level(path, page, 0, cache_bytes)
    }

    /// Opens page `page` of `path` (0 is the first image file directory), at level `level` (0: the page
    /// itself; n: the n-th directory of its SubIFDs tag, where pyramidal slides keep their reduced
    /// resolutions), and checks what can be read:
    /// the page's layout and sample type, and its first chunk (so an unsupported compression fails here,
    /// not halfway through a run). A page the file does not have is [`Error::NoSuchPage`], with the
    /// file's page count; a level the page does not have [`Error::NoSuchLevel`], with its count.
    /// `cache_bytes` bounds the decoded chunks kept between windows.
    pub fn open_level(
        path: &Path,
        page: usize,
        level: usize,
        cache_bytes: usize,
    ) -> Result<TiffRegions> {
        let on_page = |reason: String| match (page, level) {
            (0, 0) => reason,
            (_, 0) => format!("page {page}: {reason}"),
            _ => format!("page {page} level {level}: {reason}"),
        };
        let bad = |reason: String| Error::Tiff {
            path: path.to_path_buf(),
            reason: on_page(reason),
        };
        let mut dec = open_decoder_at(path, page, level)?;
        let (w, h) = dec
            .dimensions()
            .map_err(|e| tiff_error(path, "reading the image size", e))?;
        let (width, height) = (w as usize, h as usize);
        if width == 0 || height == 0 {
            return Err(bad(format!("the image is empty ({width}x{height})")));
        }
        let color = dec
            .colortype()
            .map_err(|e| tiff_error(path, "reading the colour type", e))?;
        let (channels, bits) = match color {
            ColorType::Gray(b) => (1, b),
            ColorType::GrayA(b) => (2, b),
            ColorType::RGB(b) => (3, b),
            ColorType::RGBA(b) => (4, b),
            ColorType::Multiband {
                bit_depth,
                num_samples,
            } => (num_samples as usize, bit_depth),
            other => {
                return Err(bad(format!(
                    "colour type {other:?} is not supported: gray, RGB, with alpha or multi-band samples are"
                )));
            }
        };
        if !matches!(bits, 8 | 16 | 32) {
            return Err(bad(format!(
                "{bits}-bit samples are not supported: 8- and 16-bit unsigned and 32-bit float are"
            )));
        }
        let photometric = dec
            .find_tag_unsigned::<u16>(Tag::PhotometricInterpretation)
            .map_err(|e| tiff_error(path, "reading PhotometricInterpretation", e))?;
        if photometric == Some(0) {
            return Err(bad(
                "photometric WhiteIsZero is not supported (values would read inverted)".into(),
            ));
        }
        let planar = dec
            .find_tag_unsigned::<u16>(Tag::PlanarConfiguration)
            .map_err(|e| tiff_error(path, "reading PlanarConfiguration", e))?
            == Some(2);
        let tiled = dec.get_chunk_type() == ChunkType::Tile;
        let (cw, ch) = dec.chunk_dimensions();
        let chunk_w = (cw as usize).min(width).max(1);
        let chunk_h = (ch as usize).min(height).max(1);
        let (across, down) = (width.div_ceil(chunk_w), height.div_ceil(chunk_h));
        let per_chunk = if planar { 1 } else { channels };
        let chunk_bytes = (chunk_w as u64)
            .saturating_mul(chunk_h as u64)
            .saturating_mul(per_chunk as u64 * u64::from(bits / 8));
        let row_bytes = chunk_bytes
            .saturating_mul(across as u64)
            .saturating_mul(if planar { channels as u64 } else { 1 });
        let human = stdx::mem::human;
        stdx::mem::check(
            row_bytes,
            format!(
                "{}: a row of its {}×{} {} (decoded)",
                path.display(),
                chunk_w,
                chunk_h,
                if tiled { "tiles" } else { "strips" }
            ),
        )
        .map_err(|e| {
            bad(format!(
                "cannot be read by region: {e}; rewrite it tiled (`tiffcp -t -w 256 -l 256`)"
            ))
        })?;
        let note = (row_bytes > cache_bytes as u64).then(|| {
            format!(
                "{}: its {} are {}×{} pixels: a row of them is {} decoded, more than the {} chunk cache; each row is decoded once and kept{}",
                path.display(),
                if tiled { "tiles" } else { "strips" },
                chunk_w,
                chunk_h,
                human(row_bytes),
                human(cache_bytes as u64),
                if down == 1 {
                    " (the whole image: a whole decode)"
                } else {
                    ""
                }
            )
        });
        let decode_limit = usize::try_from(row_bytes)
            .unwrap_or(usize::MAX)
            .max(1 << 20);
        let dec = dec.with_limits(limits(decode_limit));
        let r = TiffRegions {
            path: path.to_path_buf(),
            page,
            level,
            width,
            height,
            channels,
            // Set from the first chunk below.
            sample: SampleType::U8,
            planar,
            tiled,
            chunk_w,
            chunk_h,
            across,
            down,
            decoders: Mutex::new(vec![dec]),
            decode_limit,
            cache: ChunkCache::new(cache_bytes.max(row_bytes as usize)),
            note,
        };
        let first = r.chunk(0)?;
        let sample = match first.samples {
            Samples::U8(_) => SampleType::U8,
            Samples::U16(_) => SampleType::U16,
            Samples::F32(_) => SampleType::F32,
        };
        Ok(TiffRegions { sample, ..r })
    }

    /// The page read (0 is the file's first image file directory).
    pub fn page(&self) -> usize {
        self.page
    }

    /// The page's level read (0: the page itself; n: its n-th SubIFD).
    pub fn level(&self) -> usize {
        self.level
    }

    /// Why this file is not read chunk by chunk in bounded memory, when it is not.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    pub fn sample_type(&self) -> SampleType {
        self.sample
    }

    pub fn is_tiled(&self) -> bool {
        self.tiled
    }

    pub fn is_planar(&self) -> bool {
        self.planar
    }

    fn decoder(&self) -> Result<Dec> {
        let pooled = self
            .decoders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        match pooled {
            Some(d) => Ok(d),
            None => Ok(open_decoder_at(&self.path, self.page, self.level)?
                .with_limits(limits(self.decode_limit))),
        }
    }

    /// The decoded chunk `index` (planar files: plane p's chunks follow plane p − 1's).
    fn chunk(&self, index: u32) -> Result<Arc<Chunk>> {
        if let Some(c) = self.cache.get(index) {
            return Ok(c);
        }
        let mut dec = self.decoder()?;
        let what = || {
            let page = if self.page == 0 {
                String::new()
            } else {
                format!(" of page {}", self.page)
            };
            format!(
                "decoding {} {index}{page}",
                if self.tiled { "tile" } else { "strip" }
            )
        };
        let decoded = dec
            .read_chunk(index)
            .map_err(|e| tiff_error(&self.path, &what(), e));
        let (dw, dh) = dec.chunk_data_dimensions(index);
        self.decoders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(dec);
        let samples = match decoded? {
            DecodingResult::U8(v) => Samples::U8(v),
            DecodingResult::U16(v) => Samples::U16(v),
            DecodingResult::F32(v) => Samples::F32(v),
            _ => {
                return Err(Error::Tiff {
                    path: self.path.clone(),
                    reason: "sample format not supported: 8- and 16-bit unsigned integers and 32-bit floats are".into(),
                });
            }
        };
        let per_chunk = if self.planar { 1 } else { self.channels };
        let (dw, dh) = (dw as usize, dh as usize);
        // The pixels of the image this chunk holds: every index `gather` computes must be inside it.
        let i = index as usize % (self.across * self.down);
        let (cy, cx) = (i / self.across, i % self.across);
        let ew = self.chunk_w.min(self.width - cx * self.chunk_w);
        let eh = self.chunk_h.min(self.height - cy * self.chunk_h);
        if dw < ew || dh < eh || samples.len() < dw * dh * per_chunk {
            return Err(Error::Tiff {
                path: self.path.clone(),
                reason: format!(
                    "{}: {} samples for a {dw}×{dh} chunk",
                    what(),
                    samples.len()
                ),
            });
        }
        let chunk = Arc::new(Chunk { samples, width: dw });
        self.cache.put(index, chunk.clone());
        Ok(chunk)
    }
}

fn limits(decoding_buffer_size: usize) -> Limits {
    let mut l = Limits::default();
    l.decoding_buffer_size = decoding_buffer_size;
    l
}

impl Field for TiffRegions {
    fn channels(&self) -> usize {
        self.channels
    }

    fn gather(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> bsp_tiling::Result<()> {
        Ok(self.gather_window(ys, xs, out)?)
    }
}

impl TiffRegions {
    fn gather_window(
        &self,
        ys: &[Option<usize>],
        xs: &[Option<usize>],
        out: &mut [f32],
    ) -> Result<()> {
        out.fill(0.0);
        let (Some((y0, y_end)), Some((x0, x_end))) = (span(ys), span(xs)) else {
            return Ok(());
        };
        // The chunks holding the first and the last row and column read.
        let (cy0, cy1) = (y0 / self.chunk_h, (y_end - 1) / self.chunk_h);
        let (cx0, cx1) = (x0 / self.chunk_w, (x_end - 1) / self.chunk_w);
        let (rows, cols) = (cy1 - cy0 + 1, cx1 - cx0 + 1);
        let planes = if self.planar { self.channels } else { 1 };
        let per_plane = self.across * self.down;
        let mut grid = Vec::with_capacity(planes * rows * cols);
        for p in 0..planes {
            for cy in cy0..=cy1 {
                for cx in cx0..=cx1 {
                    let i = p * per_plane + cy * self.across + cx;
                    let i = u32::try_from(i).map_err(|_| Error::Tiff {
                        path: self.path.clone(),
                        reason: format!("chunk {i} is past the format's chunk count"),
                    })?;
                    grid.push(self.chunk(i)?);
                }
            }
        }
        let n = ys.len() * xs.len();
        let c_n = self.channels;
        for (iy, y) in ys.iter().enumerate() {
            let Some(y) = *y else { continue };
            let (cy, ly) = (y / self.chunk_h - cy0, y % self.chunk_h);
            for (ix, x) in xs.iter().enumerate() {
                let Some(x) = *x else { continue };
                let (cx, lx) = (x / self.chunk_w - cx0, x % self.chunk_w);
                let i = iy * xs.len() + ix;
                if self.planar {
                    for c in 0..c_n {
                        let k = &grid[(c * rows + cy) * cols + cx];
                        out[c * n + i] = k.samples.get(ly * k.width + lx);
                    }
                } else {
                    let k = &grid[cy * cols + cx];
                    let base = (ly * k.width + lx) * c_n;
                    for c in 0..c_n {
                        out[c * n + i] = k.samples.get(base + c);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Input for TiffRegions {
    fn height(&self) -> usize {
        self.height
    }
    fn width(&self) -> usize {
        self.width
    }
}
