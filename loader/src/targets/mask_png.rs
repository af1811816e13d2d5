//! PNG label maps read through the `png` crate itself, without its expansions: the image crate's PNG
//! decoder expands a palette to RGB and scales 1-, 2- and 4-bit gray to 0..=255, which would turn class
//! 1 of a 1-bit mask into 255 (the usual ignore index) and make a palette mask look like a colour
//! image. Here the header is read alone first ([`PngMask::open`]), so that its size can be checked and
//! admitted before a value is allocated, and the values are then read row by row as stored.

use crate::error::{Error, Result};
use png::{BitDepth, ColorType};
use std::io::Cursor;
use std::path::Path;

/// A PNG mask whose header has been read; its image data not yet.
pub(super) struct PngMask<'a> {
    reader: png::Reader<Cursor<&'a [u8]>>,
    width: u32,
    height: u32,
    depth: u8,
}

impl<'a> PngMask<'a> {
    /// Reads the chunks before the image data and refuses anything but gray at 1, 2, 4, 8 or 16 bits per
    /// value, naming `path` and what the file is instead.
    pub(super) fn open(bytes: &'a [u8], path: &Path) -> Result<Self> {
        let err = |e: png::DecodingError| Error::decode(path, "png", e);
        let limit = crate::image::max_image_bytes().saturating_mul(2);
        let limits = png::Limits {
            bytes: usize::try_from(limit).unwrap_or(usize::MAX),
        };
        let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
        decoder.set_transformations(png::Transformations::IDENTITY);
        let reader = decoder.read_info().map_err(err)?;
        let info = reader.info();
        let what = match info.color_type {
            ColorType::Grayscale => None,
            ColorType::Indexed => Some(
                "a palette (indexed-colour) PNG: a mask is one gray channel whose values are the \
                 class indices (save the palette indices as 8-bit gray)",
            ),
            ColorType::GrayscaleAlpha => Some("a gray PNG with alpha: a mask has no alpha channel"),
            ColorType::Rgb | ColorType::Rgba => Some(
                "a colour PNG: a mask is one gray channel of class indices (no conversion of colours \
                 into indices would be the user's)",
            ),
        };
        if let Some(what) = what {
            return Err(Error::decode(path, "png", what));
        }
        let depth = match info.bit_depth {
            BitDepth::One => 1,
            BitDepth::Two => 2,
            BitDepth::Four => 4,
            BitDepth::Eight => 8,
            BitDepth::Sixteen => 16,
        };
        let (width, height) = info.size();
        Ok(PngMask {
            reader,
            width,
            height,
            depth,
        })
    }

    /// Width, height and whether the values are 16-bit.
    pub(super) fn header(&self) -> (u32, u32, bool) {
        (self.width, self.height, self.depth == 16)
    }

    /// The bytes of the image data once inflated (rows of packed values): what the data's length is
    /// checked against (deflate expands at most 1032:1).
    pub(super) fn packed_len(&self) -> u64 {
        self.reader
            .output_buffer_size()
            .map_or(u64::MAX, |n| n as u64)
    }

    /// Bytes this decode holds beside the values: the whole packed frame for an interlaced file (its
    /// passes are put together in it), else one row.
    pub(super) fn working_bytes(&self) -> u64 {
        if self.reader.info().interlaced {
            self.packed_len()
        } else {
            self.reader
                .output_line_size(self.width)
                .map_or(u64::MAX, |n| n as u64)
        }
    }

    /// Reads the values, as stored (a 1-bit mask's values are 0 and 1), into `values`, row by row.
    pub(super) fn decode(mut self, path: &Path, values: &mut Vec<u16>) -> Result<()> {
        let err = |e: png::DecodingError| Error::decode(path, "png", e);
        let (w, h, depth) = (self.width as usize, self.height as usize, self.depth);
        values.clear();
        values.reserve_exact(w * h);
        if self.reader.info().interlaced {
            let mut frame = vec![0u8; self.packed_len() as usize];
            self.reader.next_frame(&mut frame).map_err(err)?;
            let line = frame.len() / h.max(1);
            for row in frame.chunks_exact(line.max(1)).take(h) {
                unpack(row, w, depth, values);
            }
        } else {
            while let Some(row) = self.reader.next_row().map_err(err)? {
                unpack(row.data(), w, depth, values);
            }
        }
        if values.len() != w * h {
            return Err(Error::decode(
                path,
                "png",
                format!("{} of {w}x{h} values decoded", values.len()),
            ));
        }
        Ok(())
    }
}

/// Appends the `w` values of one row of packed `depth`-bit samples (16-bit ones big-endian, as PNG
/// stores them) to `out`.
fn unpack(row: &[u8], w: usize, depth: u8, out: &mut Vec<u16>) {
    match depth {
        16 => out.extend(
            row.chunks_exact(2)
                .take(w)
                .map(|b| u16::from_be_bytes([b[0], b[1]])),
        ),
        8 => out.extend(row.iter().take(w).map(|&v| u16::from(v))),
        d => {
            let d = usize::from(d);
            let mask = (1u8 << d) - 1;
            out.extend((0..w).map_while(|x| {
                let bit = x * d;
                let byte = *row.get(bit / 8)?;
                Some(u16::from((byte >> (8 - d - bit % 8)) & mask))
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rows_unpack_most_significant_bits_first() {
        let mut out = Vec::new();
        unpack(&[0b1011_0001], 5, 1, &mut out);
        assert_eq!(out, [1, 0, 1, 1, 0]);
        out.clear();
        unpack(&[0b1110_0100, 0b1100_0000], 5, 2, &mut out);
        assert_eq!(out, [3, 2, 1, 0, 3]);
        out.clear();
        unpack(&[0xA5, 0xF0], 3, 4, &mut out);
        assert_eq!(out, [10, 5, 15]);
        out.clear();
        unpack(&[1, 2, 0xFF, 0xFE], 2, 16, &mut out);
        assert_eq!(out, [258, 65534]);
    }
}
