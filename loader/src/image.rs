//! Decoded pixels and the per-format decoders the pipeline's CPU stage runs.

use crate::error::{Error, Result};
use crate::raw;
use image::ImageDecoder;
use std::io::Cursor;
use std::path::Path;

/// The on-disk encoding of one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    Png,
    Jpeg,
    /// Uncompressed pixels: binary PPM/PGM/PAM (P5, P6, P7), the "raw" format of this toolkit.
    Raw,
    L3,
    /// A JPEG stream rebuilt from a Progressive Compressed Record at some scan group.
    Pcr,
}

impl Format {
    /// The short tag written in traces and tables (`png`, `jpeg`, `raw`, `l3`, `pcr`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Jpeg => "jpeg",
            Format::Raw => "raw",
            Format::L3 => "l3",
            Format::Pcr => "pcr",
        }
    }

    /// The format a file name's extension stands for, if it is one the loader reads.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "png" => Format::Png,
            "jpg" | "jpeg" => Format::Jpeg,
            "ppm" | "pgm" | "pnm" | "pam" => Format::Raw,
            "l3" => Format::L3,
            _ => return None,
        })
    }

    /// The format the first bytes of a file announce, if any.
    pub fn sniff(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(&l3_format::MAGIC) {
            Some(Format::L3)
        } else if bytes.len() >= 2 && bytes[0] == b'P' && matches!(bytes[1], b'5' | b'6' | b'7') {
            Some(Format::Raw)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An 8-bit image with interleaved channels (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA), rows top to bottom.
///
/// Decoders write into an existing `Image` so that a worker thread reuses one allocation for every item.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub pixels: Vec<u8>,
}

impl Image {
    /// The pixel at (x, y) as RGB (gray replicated, alpha dropped).
    pub fn rgb(&self, x: u32, y: u32) -> [u8; 3] {
        let c = self.channels as usize;
        let i = (y as usize * self.width as usize + x as usize) * c;
        let p = &self.pixels[i..i + c];
        match c {
            1 | 2 => [p[0]; 3],
            _ => [p[0], p[1], p[2]],
        }
    }

    /// This image as interleaved RGB (what every batch holds).
    pub fn to_rgb(&self) -> Image {
        if self.channels == 3 {
            return self.clone();
        }
        let mut pixels = Vec::with_capacity(self.width as usize * self.height as usize * 3);
        for y in 0..self.height {
            for x in 0..self.width {
                pixels.extend_from_slice(&self.rgb(x, y));
            }
        }
        Image {
            width: self.width,
            height: self.height,
            channels: 3,
            pixels,
        }
    }
}

/// Decodes `bytes` of `format` into `out`; `path` only names the item in errors.
///
/// PCR items are JPEG streams, so they decode like JPEG.
pub fn decode(format: Format, bytes: &[u8], path: &Path, out: &mut Image) -> Result<()> {
    match format {
        Format::Png => decode_with(
            image::codecs::png::PngDecoder::new(Cursor::new(bytes)),
            path,
            "png",
            out,
        ),
        Format::Jpeg | Format::Pcr => {
            check_jpeg_end(bytes).map_err(|e| Error::decode(path, "jpeg", e))?;
            decode_with(
                image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes)),
                path,
                "jpeg",
                out,
            )
        }
        Format::Raw => {
            let view = raw::parse(bytes).map_err(|e| Error::decode(path, "raw", e))?;
            out.width = view.width;
            out.height = view.height;
            out.channels = view.channels;
            out.pixels.clear();
            out.pixels.extend_from_slice(view.pixels);
            Ok(())
        }
        Format::L3 => {
            let file = l3_format::L3File::parse(bytes).map_err(|e| Error::decode(path, "l3", e))?;
            out.width = file.width();
            out.height = file.height();
            out.channels = file.channels();
            out.pixels.resize(file.decoded_len(), 0);
            file.decode_hwc(&mut out.pixels)
                .map_err(|e| Error::decode(path, "l3", e))
        }
    }
}

/// JPEG decoders happily "decode" a truncated stream (the missing rows come out gray), so the loader
/// checks for the end-of-image marker itself. Entropy-coded data never holds `FF D9` (0xFF is stuffed),
/// so its presence near the end means the stream is whole; a little trailing padding is tolerated.
fn check_jpeg_end(bytes: &[u8]) -> std::result::Result<(), &'static str> {
    let tail = &bytes[bytes.len().saturating_sub(4096)..];
    if tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        Ok(())
    } else {
        Err("truncated: no end-of-image marker")
    }
}

/// Decodes a whole file whose format is given by its extension or, failing that, its first bytes.
pub fn decode_file(path: &Path) -> Result<Image> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let format = Format::from_path(path)
        .or_else(|| Format::sniff(&bytes))
        .ok_or_else(|| Error::decode(path, "image", "unknown image format"))?;
    let mut img = Image::default();
    decode(format, &bytes, path, &mut img)?;
    Ok(img)
}

fn decode_with<D: ImageDecoder>(
    decoder: image::ImageResult<D>,
    path: &Path,
    name: &'static str,
    out: &mut Image,
) -> Result<()> {
    use image::ColorType;
    let err = |e: image::ImageError| Error::decode(path, name, e);
    let decoder = decoder.map_err(err)?;
    let (w, h) = decoder.dimensions();
    let channels = match decoder.color_type() {
        ColorType::L8 => 1,
        ColorType::La8 => 2,
        ColorType::Rgb8 => 3,
        ColorType::Rgba8 => 4,
        _ => {
            // 16-bit and float images: let `image` convert to 8-bit RGB(A) (rare in datasets).
            let img = image::DynamicImage::from_decoder(decoder).map_err(err)?;
            let (channels, pixels) = if img.color().has_alpha() {
                (4, img.to_rgba8().into_raw())
            } else {
                (3, img.to_rgb8().into_raw())
            };
            *out = Image {
                width: w,
                height: h,
                channels,
                pixels,
            };
            return Ok(());
        }
    };
    let len = usize::try_from(decoder.total_bytes())
        .map_err(|_| Error::decode(path, name, "image too large"))?;
    out.pixels.resize(len, 0);
    decoder.read_image(&mut out.pixels).map_err(err)?;
    out.width = w;
    out.height = h;
    out.channels = channels;
    Ok(())
}

/// Decodes only the part of an L3 image inside the window `place(width, height)` picks, using the format's
/// independent patches: a 224×224 crop of a 1920×1080 image touches about 25 of its 510 64-pixel patches.
/// `out` receives the window alone (interleaved); the returned rectangle is where it lies in the image.
pub(crate) fn decode_l3_window(
    bytes: &[u8],
    path: &Path,
    place: impl FnOnce(u32, u32) -> (u32, u32, u32, u32),
    out: &mut Image,
    scratch: &mut Vec<u8>,
) -> Result<(u32, u32, u32, u32)> {
    let err = |e: l3_format::Error| Error::decode(path, "l3", e);
    let file = l3_format::L3File::parse(bytes).map_err(err)?;
    let (x0, y0, w, h) = place(file.width(), file.height());
    let c = file.channels() as usize;
    let n = file.patch_size() as u32;
    out.width = w;
    out.height = h;
    out.channels = file.channels();
    out.pixels.resize(w as usize * h as usize * c, 0);
    if w == 0 || h == 0 {
        return Ok((x0, y0, w, h));
    }
    scratch.resize(n as usize * n as usize, 0);
    let (gx0, gx1) = (x0 / n, (x0 + w - 1) / n);
    let (gy0, gy1) = (y0 / n, (y0 + h - 1) / n);
    for gy in gy0..=gy1 {
        for gx in gx0..=gx1 {
            let patch = (gy * file.patches_x() + gx) as usize;
            let r = file.patch_rect(patch);
            // The overlap of this patch with the window, in image coordinates.
            let (ox0, ox1) = (r.x.max(x0), (r.x + r.w).min(x0 + w));
            let (oy0, oy1) = (r.y.max(y0), (r.y + r.h).min(y0 + h));
            for ch in 0..c {
                l3_format::decode_patch(
                    file.patch_bytes(ch, patch),
                    r.w as usize,
                    r.h as usize,
                    scratch,
                    r.w as usize,
                )
                .map_err(err)?;
                for y in oy0..oy1 {
                    let src = &scratch[((y - r.y) * r.w) as usize..][..r.w as usize];
                    let dst_row = ((y - y0) * w) as usize;
                    for x in ox0..ox1 {
                        out.pixels[(dst_row + (x - x0) as usize) * c + ch] =
                            src[(x - r.x) as usize];
                    }
                }
            }
        }
    }
    Ok((x0, y0, w, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::SplitMix64;

    /// Arbitrary-bytes check of every decoder (the `cargo fuzz` target `decode_any` runs the same calls):
    /// every truncation and a few thousand random byte flips of valid files must give errors, not panics.
    #[test]
    fn damaged_files_give_errors_not_panics() {
        let mut rng = SplitMix64::new(5);
        let (w, h) = (37u32, 21u32);
        let px: Vec<u8> = (0..w * h * 3).map(|_| rng.next_u64() as u8).collect();
        let img = Image {
            width: w,
            height: h,
            channels: 3,
            pixels: px,
        };
        let files = [
            (
                Format::L3,
                crate::convert::encode(&img, crate::convert::Target::L3).unwrap(),
            ),
            (
                Format::Raw,
                crate::convert::encode(&img, crate::convert::Target::Raw).unwrap(),
            ),
            (
                Format::Png,
                crate::convert::encode(&img, crate::convert::Target::Png).unwrap(),
            ),
            (
                Format::Jpeg,
                crate::convert::encode(&img, crate::convert::Target::Jpeg(80)).unwrap(),
            ),
        ];
        let mut out = Image::default();
        for (f, bytes) in &files {
            decode(*f, bytes, Path::new("x"), &mut out).unwrap();
            for cut in 0..bytes.len() {
                let r = decode(*f, &bytes[..cut], Path::new("x"), &mut out);
                // A PNG cut inside its 12-byte IEND chunk still holds every pixel: fine to accept.
                if *f != Format::Png || cut < bytes.len() - 12 {
                    assert!(r.is_err(), "{f} cut at {cut} of {} decoded", bytes.len());
                }
                crate::fuzz_l3_window(&bytes[..cut]);
            }
            for _ in 0..2000 {
                let mut b = bytes.clone();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next_u64() as u8;
                }
                let _ = decode(*f, &b, Path::new("x"), &mut out);
                crate::fuzz_l3_window(&b);
            }
        }
    }
}
