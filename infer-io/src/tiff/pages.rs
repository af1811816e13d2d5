//! The pages of a TIFF file, listed from their tags alone (nothing is decoded): what `l3 infer
//! --list-pages` prints, so a user can pick a pyramid level, an overview or a label image by index before
//! opening it with [`TiffRegions::open_page`](super::TiffRegions::open_page).

use super::SampleType;
use super::open::{self, Dec, open_decoder, open_page_decoder, tiff_error};
use crate::error::Result;
use std::fmt;
use std::path::Path;
use tiff::decoder::ChunkType;
use tiff::tags::Tag;

/// One page (image file directory) of a TIFF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// Its position in the file's chain of image file directories, from 0.
    pub index: usize,
    /// 0: the page itself; n: the n-th directory of its SubIFDs tag (a pyramid's reduced resolution).
    pub level: usize,
    pub width: u32,
    pub height: u32,
    pub samples_per_pixel: u16,
    /// The first sample's bits.
    pub bits_per_sample: u16,
    /// TIFF SampleFormat: 1 unsigned integer (also when the tag is absent), 2 signed, 3 float.
    pub sample_format: u16,
    /// How [`TiffRegions`](super::TiffRegions) reads the samples; `None` when it cannot.
    pub sample_type: Option<SampleType>,
    pub tiled: bool,
    /// A tile's size, or a strip's (the page's width × its rows per strip).
    pub chunk_width: u32,
    pub chunk_height: u32,
    /// NewSubfileType bit 0 (a reduced-resolution version of another page), when the tag is present.
    pub reduced: Option<bool>,
}

impl fmt::Display for PageInfo {
    /// One line: `page 1: 150x100, 3 channels, u8, striped 150x100, reduced`; a SubIFD's begins
    /// `page 0 level 2:`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match self.sample_type {
            Some(SampleType::U8) => "u8".to_string(),
            Some(SampleType::U16) => "u16".to_string(),
            Some(SampleType::F32) => "f32".to_string(),
            None => {
                let kind = match self.sample_format {
                    2 => "int",
                    3 => "float",
                    1 => "uint",
                    _ => "format",
                };
                format!(
                    "{kind}{} (not readable: u8, u16 or f32 are)",
                    self.bits_per_sample
                )
            }
        };
        write!(f, "page {}", self.index)?;
        if self.level > 0 {
            write!(f, " level {}", self.level)?;
        }
        write!(
            f,
            ": {}x{}, {} channel{}, {ty}, {} {}x{}, {}",
            self.width,
            self.height,
            self.samples_per_pixel,
            if self.samples_per_pixel == 1 { "" } else { "s" },
            if self.tiled { "tiled" } else { "striped" },
            self.chunk_width,
            self.chunk_height,
            match self.reduced {
                Some(true) => "reduced",
                Some(false) => "full resolution",
                None => "no NewSubfileType",
            }
        )
    }
}

/// Every page of `path`, in file order, each followed by its SubIFD levels. A damaged directory is a
/// typed error naming the file and the page.
pub fn pages(path: &Path) -> Result<Vec<PageInfo>> {
    let mut dec = open_decoder(path)?;
    let mut out = Vec::new();
    let mut index = 0;
    loop {
        out.push(describe(&mut dec, path, index, 0)?);
        let subs = open::sub_ifds(&mut dec, path, index)?.len();
        for level in 1..=subs {
            let on_page = open_page_decoder(path, index)?;
            let mut sub = open::open_level(on_page, path, index, level)?;
            out.push(describe(&mut sub, path, index, level)?);
        }
        if !dec.more_images() {
            return Ok(out);
        }
        index += 1;
        dec.next_image()
            .map_err(|e| tiff_error(path, &format!("reading page {index}"), e))?;
    }
}

/// The page (or level) `dec` is on, from its tags.
fn describe(dec: &mut Dec, path: &Path, index: usize, level: usize) -> Result<PageInfo> {
    let err = |e| {
        let at = match level {
            0 => format!("reading page {index}"),
            _ => format!("reading page {index} level {level}"),
        };
        tiff_error(path, &at, e)
    };
    let (width, height) = dec.dimensions().map_err(err)?;
    let samples_per_pixel = dec
        .find_tag_unsigned::<u16>(Tag::SamplesPerPixel)
        .map_err(err)?
        .unwrap_or(1);
    let first =
        |v: Option<Vec<u16>>, default: u16| v.and_then(|v| v.first().copied()).unwrap_or(default);
    let bits_per_sample = first(
        dec.find_tag_unsigned_vec::<u16>(Tag::BitsPerSample)
            .map_err(err)?,
        1,
    );
    let sample_format = first(
        dec.find_tag_unsigned_vec::<u16>(Tag::SampleFormat)
            .map_err(err)?,
        1,
    );
    let sample_type = match (bits_per_sample, sample_format) {
        (8, 1) => Some(SampleType::U8),
        (16, 1) => Some(SampleType::U16),
        (32, 3) => Some(SampleType::F32),
        _ => None,
    };
    let reduced = dec
        .find_tag_unsigned::<u32>(Tag::NewSubfileType)
        .map_err(err)?
        .map(|v| v & 1 == 1);
    let tiled = dec.get_chunk_type() == ChunkType::Tile;
    let (chunk_width, chunk_height) = match dec.chunk_dimensions() {
        (w, h) if tiled => (w, h),
        (w, h) => (w.min(width), h.min(height)),
    };
    Ok(PageInfo {
        index,
        level,
        width,
        height,
        samples_per_pixel,
        bits_per_sample,
        sample_format,
        sample_type,
        tiled,
        chunk_width,
        chunk_height,
        reduced,
    })
}
