//! Decoded pixels, the whole-image decoders the pipeline runs, and the one path that turns an image file
//! into pixels for encoding and conversion ([`import`]).
//!
//! One set of rules everywhere: pixels are upright (EXIF orientation is applied wherever a file becomes
//! pixels), 8 bits per sample, gray+alpha becomes RGBA losslessly, anything lossy (16-bit or float samples
//! reduced to 8 bits) needs an explicit opt-in at import, and no image may decode to more than
//! [`max_image_bytes`].

use crate::error::{Error, Result};
use crate::format::Format;
use crate::raw;
use image::{ImageDecoder, ImageReader};
use std::io::Cursor;
use std::path::Path;
pub use vocab::Image;

/// The environment variable that sets [`max_image_bytes`].
pub const MAX_IMAGE_BYTES_VAR: &str = "L3_MAX_IMAGE_BYTES";

/// The largest decoded size (width × height × channels bytes, at 8 bits) any decoder of the toolkit
/// accepts: `L3_MAX_IMAGE_BYTES` when set (bytes, or with a K/M/G/T suffix), else 4 GiB — the L3
/// reader's own limit — and never more than the machine's memory limit.
pub fn max_image_bytes() -> u64 {
    let configured = std::env::var(MAX_IMAGE_BYTES_VAR)
        .ok()
        .and_then(|s| stdx::mem::parse_size(&s))
        .unwrap_or(l3_format::Limits::default().max_pixels);
    configured.min(stdx::mem::limit().0)
}

fn too_large(path: &Path, name: &'static str, w: u32, h: u32, c: u64) -> Error {
    let bytes = u64::from(w) * u64::from(h) * c;
    Error::decode(
        path,
        name,
        format!(
            "{w}x{h} decodes to {}, over the image size limit of {} (set {MAX_IMAGE_BYTES_VAR} to raise it)",
            stdx::mem::human(bytes),
            stdx::mem::human(max_image_bytes())
        ),
    )
}

/// Pixels per byte of data that no image a codec without a hard bound (WebP, compressed TIFF, run-length
/// BMP) stores in practice: their codings can describe a flat image in a few bytes whatever its size,
/// which is what a decompression bomb does, while photographs and even synthetic test images stay orders
/// of magnitude below this.
pub const MAX_PIXELS_PER_BYTE: u64 = 1 << 16;

/// The fewest bytes of data a `w`×`h` image in the format `name` can have, from what its coding can do
/// at best. Deflate expands at most 1032:1, so a PNG's compressed data is at least 1/1032 of its pixel
/// bytes; every 8×8 block of a JPEG's first component costs at least one bit of its first (DC) scan,
/// progressive or not; a GIF's 12-bit LZW code stands for at most 4096 pixels; binary PNM holds a byte
/// per pixel at least (a bit in a P4 bitmap), and so does uncompressed BMP (at its bit depth). Other
/// codings get [`MAX_PIXELS_PER_BYTE`].
fn least_bytes(name: &str, bytes: &[u8], (w, h): (u32, u32), total: u64) -> u64 {
    let (w, h) = (u64::from(w), u64::from(h));
    let pixels = w * h;
    let le16 = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let le32 = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    match name {
        "png" => total.div_ceil(1032),
        "jpeg" => (w.div_ceil(8) * h.div_ceil(8)).div_ceil(8),
        "gif" => pixels.div_ceil(4096),
        "pnm" if bytes.get(1) == Some(&b'4') => w.div_ceil(8) * h,
        "pnm" => pixels,
        // BITMAPINFOHEADER: bits per pixel at 28, compression at 30 (0: none, 3 and 6: bit fields).
        "bmp" => match (le16(28), le32(30)) {
            (Some(bpp), Some(0 | 3 | 6)) => (w * u64::from(bpp)).div_ceil(8) * h,
            _ => pixels.div_ceil(MAX_PIXELS_PER_BYTE),
        },
        _ => pixels.div_ceil(MAX_PIXELS_PER_BYTE),
    }
}

/// Refuses a header that promises more pixels than its data can hold — a decompression bomb, or a file
/// cut short — before anything is allocated ([`least_bytes`] says how few bytes each format can take).
fn plausible(
    path: &Path,
    name: &'static str,
    (w, h): (u32, u32),
    total: u64,
    bytes: &[u8],
) -> Result<()> {
    let least = least_bytes(name, bytes, (w, h), total);
    let data_len = bytes.len() as u64;
    if data_len < least {
        return Err(Error::decode(
            path,
            name,
            format!(
                "the header promises {w}x{h} pixels, which take at least {least} bytes of {name} data; \
                 the file has {data_len} (a decompression bomb, or a file cut short)"
            ),
        ));
    }
    Ok(())
}

/// The size checks every decoder makes from a header before it allocates: the decoded size
/// (`w`×`h`×`samples`) against [`max_image_bytes`], the header against the data's length ([`plausible`]),
/// then room for the decoder's `total` output bytes in the shared budget, held until the guard drops.
fn admit_header(
    path: &Path,
    name: &'static str,
    (w, h): (u32, u32),
    samples: u64,
    total: u64,
    bytes: &[u8],
) -> Result<DecodeBudget> {
    check_header(path, name, (w, h), samples, total, bytes)?;
    Ok(DecodeBudget::reserve(total))
}

/// [`admit_header`]'s checks without the reservation, for decoders (masks) whose memory is not their
/// `total` output bytes: they reserve what they hold themselves.
pub(crate) fn check_header(
    path: &Path,
    name: &'static str,
    (w, h): (u32, u32),
    samples: u64,
    total: u64,
    bytes: &[u8],
) -> Result<()> {
    if u64::from(w) * u64::from(h) * samples > max_image_bytes() {
        return Err(too_large(path, name, w, h, samples));
    }
    plausible(path, name, (w, h), total, bytes)
}

/// Decoded bytes being produced at once by every decoder of the process together, at most
/// [`max_image_bytes`]: a decode thread waits for room before it allocates, so that N threads meeting N
/// huge images need the memory of one, not of N. One image alone may always take the whole budget.
pub(crate) struct DecodeBudget(u64);

static IN_FLIGHT: (std::sync::Mutex<u64>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

impl DecodeBudget {
    /// Admits the decode of a `w`×`h` image of `channels` bytes per pixel into the budget: refused, naming
    /// the file, when it alone is over [`max_image_bytes`]; else waits for room.
    pub(crate) fn admit(
        path: &Path,
        name: &'static str,
        (w, h): (u32, u32),
        channels: u64,
    ) -> Result<DecodeBudget> {
        let bytes = u64::from(w) * u64::from(h) * channels;
        if bytes > max_image_bytes() {
            return Err(too_large(path, name, w, h, channels));
        }
        Ok(DecodeBudget::reserve(bytes))
    }

    pub(crate) fn reserve(bytes: u64) -> DecodeBudget {
        let budget = max_image_bytes();
        let (lock, room) = &IN_FLIGHT;
        let mut used = lock.lock().unwrap_or_else(|p| p.into_inner());
        while *used > 0 && used.saturating_add(bytes) > budget {
            used = room.wait(used).unwrap_or_else(|p| p.into_inner());
        }
        *used += bytes;
        DecodeBudget(bytes)
    }
}

impl Drop for DecodeBudget {
    fn drop(&mut self) {
        let (lock, room) = &IN_FLIGHT;
        let mut used = lock.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(self.0);
        room.notify_all();
    }
}

fn limits() -> image::Limits {
    let mut l = image::Limits::default();
    // The size check happens before decoding, with a message that names the file and the limit; the
    // decoders' own bookkeeping gets the same bound plus room for their working buffers, so a decoder
    // that would allocate more on its own (a TIFF strip, a GIF frame) refuses instead.
    l.max_alloc = Some(max_image_bytes().saturating_mul(2));
    l
}

/// How the decoders treat an image whose data ends before its frame is covered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Decode a JPEG whose data ends early (no end-of-image marker: a download or copy cut short) with
    /// the rows it lacks filled in grey, reported as partial, instead of refusing it. The decoders would
    /// do that silently, so it is an error unless asked for.
    pub partial_images: bool,
}

/// Decodes `bytes` of `format` into `out` (upright, 8-bit); `path` names the item in errors. The
/// pipeline's whole-image decoder: 16-bit samples of a dataset image are reduced to 8 bits, as the batch
/// holds 8-bit pixels anyway.
pub fn decode(format: Format, bytes: &[u8], path: &Path, out: &mut Image) -> Result<()> {
    decode_with_options(format, bytes, path, &DecodeOptions::default(), out).map(|_| ())
}

/// [`decode`] with its [`DecodeOptions`]; returns whether the image decoded is partial (a JPEG cut short,
/// accepted with [`DecodeOptions::partial_images`]).
pub fn decode_with_options(
    format: Format,
    bytes: &[u8],
    path: &Path,
    options: &DecodeOptions,
    out: &mut Image,
) -> Result<bool> {
    // The bytes' own magic decides over the name's extension (a PNG named `.jpg` is a PNG), the rule
    // `import` and `convert` follow. Raw frames are left alone: Liquid's carry no header.
    let format = match Format::sniff(bytes) {
        Some(sniffed) if format != Format::Raw && sniffed != Format::Raw => match (format, sniffed)
        {
            (Format::Pcr, Format::Jpeg) => Format::Pcr,
            _ => sniffed,
        },
        _ => format,
    };
    match format {
        Format::Png => decode_image(
            image::codecs::png::PngDecoder::new(Cursor::new(bytes)),
            path,
            "png",
            out,
            bytes,
        ),
        Format::Jpeg | Format::Pcr => return decode_jpeg(bytes, path, options, out),
        Format::Webp => decode_image(
            image::codecs::webp::WebPDecoder::new(Cursor::new(bytes)),
            path,
            "webp",
            out,
            bytes,
        ),
        Format::Tiff => decode_image(
            image::codecs::tiff::TiffDecoder::new(Cursor::new(bytes)),
            path,
            "tiff",
            out,
            bytes,
        ),
        Format::Bmp => decode_image(
            image::codecs::bmp::BmpDecoder::new(Cursor::new(bytes)),
            path,
            "bmp",
            out,
            bytes,
        ),
        Format::Gif => decode_image(
            image::codecs::gif::GifDecoder::new(Cursor::new(bytes)),
            path,
            "gif",
            out,
            bytes,
        ),
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
            let _decoding = DecodeBudget::admit(
                path,
                "l3",
                (file.width(), file.height()),
                file.channels().into(),
            )?;
            out.width = file.width();
            out.height = file.height();
            out.channels = file.channels();
            out.pixels.resize(file.decoded_len(), 0);
            file.decode_hwc(&mut out.pixels)
                .map_err(|e| Error::decode(path, "l3", e))
        }
    }
    .map(|()| false)
}

/// Decodes a JPEG (or a PCR record's stream) with libjpeg-turbo (`pcr::libjpeg`, the toolkit's one JPEG
/// decoder), 8-bit gray or RGB, upright. The header is read first, so that the size is checked against
/// [`max_image_bytes`] and the data's length, and admitted into the decode budget, before the pixels are
/// allocated. Where data is missing or damaged libjpeg fills in grey and carries on, saying so only in a
/// warning: such a warning is an error naming the file, except that data which merely ends early is
/// accepted, reported as partial, with [`DecodeOptions::partial_images`]. Returns whether it was partial.
fn decode_jpeg(
    bytes: &[u8],
    path: &Path,
    options: &DecodeOptions,
    out: &mut Image,
) -> Result<bool> {
    use image::metadata::Orientation;
    let err = |e: pcr::JpegError| Error::decode(path, "jpeg", e);
    let reader = pcr::libjpeg::Reader::new(bytes, pcr::libjpeg::Color::GrayOrRgb).map_err(err)?;
    let header = reader.header();
    let (w, h, channels) = (header.width, header.height, header.channels);
    let total = header.decoded_len();
    let _decoding = admit_header(path, "jpeg", (w, h), channels.into(), total, bytes)?;
    let orientation = header
        .exif
        .as_deref()
        .and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms);
    let warnings = reader.decode_into(&mut out.pixels).map_err(err)?;
    let partial = jpeg_verdict(&warnings, options.partial_images)
        .map_err(|e| Error::decode(path, "jpeg", e))?;
    out.width = w;
    out.height = h;
    out.channels = channels;
    if orientation != Orientation::NoTransforms {
        orient(out, orientation);
    }
    Ok(partial)
}

/// libjpeg's warnings about a stream as a verdict: `Ok(false)` for whole, intact data; `Ok(true)` for data
/// that only ends early when `partial_images` allows it; an error otherwise. Remarks about the file that
/// leave the coefficients intact (an unknown JFIF revision, say) are not damage.
fn jpeg_verdict(
    warnings: &[pcr::libjpeg::Warning],
    partial_images: bool,
) -> std::result::Result<bool, String> {
    let mut partial = false;
    for w in warnings.iter().filter(|w| w.is_corrupt_data()) {
        match (w.is_early_end(), partial_images) {
            (true, true) => partial = true,
            (true, false) => {
                return Err(format!(
                    "truncated: {} (the data ends before the image does; partial_images decodes \
                     what is there)",
                    w.text
                ));
            }
            (false, _) => return Err(format!("corrupt data: {}", w.text)),
        }
    }
    Ok(partial)
}

/// Whether a JPEG file is complete, from its bytes alone (a conversion's output is kept only when it is):
/// entropy-coded data never holds `FF D9` (0xFF is stuffed), so its presence near the end means the stream
/// is whole; a little trailing padding is tolerated.
pub(crate) fn check_jpeg_end(bytes: &[u8]) -> std::result::Result<(), &'static str> {
    let tail = &bytes[bytes.len().saturating_sub(4096)..];
    if tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        Ok(())
    } else {
        Err(
            "truncated: no end-of-image marker (the data ends before the image does; \
             partial_images decodes what is there)",
        )
    }
}

/// The width and height a JPEG's frame header (SOFn) states, read without decoding anything; `None`
/// when there is no frame header before the first scan.
pub(crate) fn jpeg_size(b: &[u8]) -> Option<(u32, u32)> {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut i = 2;
    loop {
        if *b.get(i)? != 0xFF {
            return None;
        }
        let m = *b.get(i + 1)?;
        if m == 0xFF {
            i += 1; // fill byte
            continue;
        }
        i += 2;
        if matches!(m, 0x01 | 0xD0..=0xD7) {
            continue; // markers without a length
        }
        let len = usize::from(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]));
        if matches!(m, 0xC0..=0xCF) && !matches!(m, 0xC4 | 0xC8 | 0xCC) {
            let h = u16::from_be_bytes([*b.get(i + 3)?, *b.get(i + 4)?]);
            let w = u16::from_be_bytes([*b.get(i + 5)?, *b.get(i + 6)?]);
            return Some((w.into(), h.into()));
        }
        if m == 0xDA || len < 2 {
            return None;
        }
        i += len;
    }
}

fn decode_image<D: ImageDecoder>(
    decoder: image::ImageResult<D>,
    path: &Path,
    name: &'static str,
    out: &mut Image,
    bytes: &[u8],
) -> Result<()> {
    use image::ColorType;
    let err = |e: image::ImageError| Error::decode(path, name, e);
    let mut decoder = decoder.map_err(err)?;
    // The crate's own limits first: a decoder that checks dimensions refuses at once, and nothing it
    // allocates later can exceed them.
    decoder.set_limits(limits()).map_err(err)?;
    let (w, h) = decoder.dimensions();
    let samples = u64::from(decoder.color_type().channel_count());
    let _decoding = admit_header(path, name, (w, h), samples, decoder.total_bytes(), bytes)?;
    let orientation = decoder.orientation().map_err(err)?;
    let channels = match decoder.color_type() {
        ColorType::L8 => 1,
        ColorType::La8 => 2,
        ColorType::Rgb8 => 3,
        ColorType::Rgba8 => 4,
        _ => {
            // 16-bit and float images: 8-bit RGB(A), what a batch holds.
            let mut img = image::DynamicImage::from_decoder(decoder).map_err(err)?;
            img.apply_orientation(orientation);
            let (channels, pixels) = if img.color().has_alpha() {
                (4, img.to_rgba8().into_raw())
            } else {
                (3, img.to_rgb8().into_raw())
            };
            *out = Image {
                width: img.width(),
                height: img.height(),
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
    if orientation != image::metadata::Orientation::NoTransforms {
        orient(out, orientation);
    }
    Ok(())
}

/// Applies an EXIF orientation to `img` in place (rare: only files that carry one pay for it).
pub(crate) fn orient(img: &mut Image, o: image::metadata::Orientation) {
    let buf = std::mem::take(&mut img.pixels);
    let (w, h) = (img.width, img.height);
    let mut dynamic = match img.channels {
        1 => image::DynamicImage::ImageLuma8(image::GrayImage::from_raw(w, h, buf).expect("sized")),
        2 => image::DynamicImage::ImageLumaA8(
            image::GrayAlphaImage::from_raw(w, h, buf).expect("sized"),
        ),
        3 => image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, buf).expect("sized")),
        _ => image::DynamicImage::ImageRgba8(image::RgbaImage::from_raw(w, h, buf).expect("sized")),
    };
    dynamic.apply_orientation(o);
    img.width = dynamic.width();
    img.height = dynamic.height();
    img.pixels = dynamic.into_bytes();
}

/// How [`import`] turns a file into pixels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Accept 16-bit and float samples by reducing them to 8 bits (lossy); refused otherwise.
    pub to_8bit: bool,
    /// Accept a JPEG cut short, its missing rows grey (see [`DecodeOptions::partial_images`]); refused
    /// otherwise.
    pub partial_images: bool,
}

/// Reads any common image file (PNG, JPEG, PPM/PGM/PAM, L3, BMP, GIF, TIFF, WebP) into 8-bit pixels with
/// 1 (gray), 3 (RGB) or 4 (RGBA) channels, upright: the one import path of `l3 encode`, `l3 convert` and
/// the Python package. Gray+alpha becomes RGBA (gray repeated, so alpha survives). Special files (FIFOs,
/// devices) and files over [`max_image_bytes`] are refused before decoding.
pub fn import(path: &Path, options: &ImportOptions) -> Result<Image> {
    let bytes = stdx::fs::read_regular(path, max_image_bytes().saturating_add(1 << 20))
        .map_err(|e| Error::io(path, e))?;
    if Format::sniff(&bytes) == Some(Format::L3) || Format::from_path(path) == Some(Format::L3) {
        let mut img = Image::default();
        decode(Format::L3, &bytes, path, &mut img)?;
        return Ok(img);
    }
    let err = |e: image::ImageError| Error::decode(path, "image", e);
    let mut reader = ImageReader::new(Cursor::new(&bytes[..]))
        .with_guessed_format()
        .map_err(|e| Error::io(path, e))?;
    reader.limits(limits());
    if reader.format().is_none() {
        return Err(Error::decode(path, "image", "unknown image format"));
    }
    use image::ImageFormat as F;
    let name = match reader.format() {
        Some(F::Png) => "png",
        Some(F::Jpeg) => "jpeg",
        Some(F::Gif) => "gif",
        Some(F::Bmp) => "bmp",
        Some(F::Pnm) => "pnm",
        Some(F::Tiff) => "tiff",
        Some(F::WebP) => "webp",
        _ => "image",
    };
    if name == "jpeg" {
        let mut img = Image::default();
        let decode = DecodeOptions {
            partial_images: options.partial_images,
        };
        decode_with_options(Format::Jpeg, &bytes, path, &decode, &mut img)?;
        return Ok(img);
    }
    let mut decoder = reader.into_decoder().map_err(err)?;
    let (w, h) = decoder.dimensions();
    let samples = u64::from(decoder.color_type().channel_count());
    let _decoding = admit_header(path, name, (w, h), samples, decoder.total_bytes(), &bytes)?;
    decoder.set_limits(limits()).map_err(err)?;
    let orientation = decoder.orientation().map_err(err)?;
    let mut img = image::DynamicImage::from_decoder(decoder).map_err(err)?;
    img.apply_orientation(orientation);
    use image::DynamicImage as D;
    let (w, h) = (img.width(), img.height());
    let (channels, pixels) = match img {
        D::ImageLuma8(b) => (1, b.into_raw()),
        D::ImageRgb8(b) => (3, b.into_raw()),
        D::ImageRgba8(b) => (4, b.into_raw()),
        D::ImageLumaA8(_) => (4, img.to_rgba8().into_raw()),
        other if options.to_8bit => match other.color().channel_count() {
            1 => (1, other.to_luma8().into_raw()),
            2 | 4 => (4, other.to_rgba8().into_raw()),
            _ => (3, other.to_rgb8().into_raw()),
        },
        other => {
            return Err(Error::decode(
                path,
                "image",
                format!(
                    "{:?} samples are not 8-bit; the toolkit stores 8-bit samples losslessly only \
                     (convert them explicitly, lossily, with --to-8bit)",
                    other.color()
                ),
            ));
        }
    };
    Ok(Image {
        width: w,
        height: h,
        channels,
        pixels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stdx::SplitMix64;

    /// CRC-32 (IEEE) of a PNG chunk's type and data, to forge headers the PNG decoder accepts.
    fn png_crc(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    fn encoded(format: image::ImageFormat) -> Vec<u8> {
        let img =
            image::RgbImage::from_fn(16, 16, |x, y| image::Rgb([x as u8 * 9, y as u8 * 9, 7]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// Headers that promise far more pixels than their data holds are refused before decoding, naming
    /// the file: a 30000x30000 PNG of a few dozen bytes, a JPEG whose frame says 30000x30000.
    #[test]
    fn decompression_bombs_are_refused_from_their_headers() {
        let mut png = encoded(image::ImageFormat::Png);
        // IHDR: length at 8, type at 12, width at 16, height at 20, CRC after its 13 data bytes.
        png[16..20].copy_from_slice(&30000u32.to_be_bytes());
        png[20..24].copy_from_slice(&30000u32.to_be_bytes());
        let crc = png_crc(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let mut jpeg = encoded(image::ImageFormat::Jpeg);
        let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        jpeg[sof + 5..sof + 7].copy_from_slice(&30000u16.to_be_bytes());
        jpeg[sof + 7..sof + 9].copy_from_slice(&30000u16.to_be_bytes());
        let dir = tempfile::tempdir().unwrap();
        for (name, format, bytes) in [
            ("bomb.png", Format::Png, &png),
            ("bomb.jpg", Format::Jpeg, &jpeg),
        ] {
            let path = dir.path().join(name);
            let mut out = Image::default();
            let e = decode(format, bytes, &path, &mut out)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(name) && e.contains("promises 30000x30000"),
                "{e}"
            );
            assert!(
                out.pixels.capacity() < 1 << 20,
                "{name}: allocated before refusing"
            );
            std::fs::write(&path, bytes).unwrap();
            let e = import(&path, &ImportOptions::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("promises 30000x30000"), "{e}");
        }
        // The honest files decode.
        for (format, bytes) in [
            (Format::Png, encoded(image::ImageFormat::Png)),
            (Format::Jpeg, encoded(image::ImageFormat::Jpeg)),
        ] {
            let mut out = Image::default();
            decode(format, &bytes, Path::new("ok"), &mut out).unwrap();
            assert_eq!((out.width, out.height), (16, 16));
        }
    }

    /// Every other decoder refuses a tiny file whose header claims a huge image before allocating for it,
    /// in the pipeline's decoder and in `import` (what `convert` runs) alike: GIF, BMP, WebP and TIFF
    /// headers patched to 16000x16000 (about 1 GB decoded, under the size limit: only the data's length
    /// gives them away), a binary PPM, and an L3 file.
    #[test]
    fn every_decoder_refuses_a_header_that_promises_more_than_its_data() {
        let huge = 16000u32;
        let mut gif = encoded(image::ImageFormat::Gif);
        // Logical screen width and height, little-endian, after the 6-byte signature.
        gif[6..8].copy_from_slice(&(huge as u16).to_le_bytes());
        gif[8..10].copy_from_slice(&(huge as u16).to_le_bytes());
        let mut bmp = encoded(image::ImageFormat::Bmp);
        bmp[18..22].copy_from_slice(&huge.to_le_bytes());
        bmp[22..26].copy_from_slice(&huge.to_le_bytes());
        let mut webp = Vec::new();
        image::RgbImage::from_fn(16, 16, |x, y| image::Rgb([x as u8 * 9, y as u8 * 9, 7]))
            .write_with_encoder(image::codecs::webp::WebPEncoder::new_lossless(&mut webp))
            .unwrap();
        assert_eq!(&webp[12..16], b"VP8L");
        // After the chunk size and the 0x2f signature: 14 bits width - 1, 14 bits height - 1.
        let bits = u32::from_le_bytes(webp[21..25].try_into().unwrap());
        let bits = (bits & !0x0FFF_FFFF) | (huge - 1) | ((huge - 1) << 14);
        webp[21..25].copy_from_slice(&bits.to_le_bytes());
        let mut tiff = encoded(image::ImageFormat::Tiff);
        assert_eq!(&tiff[..4], b"II*\0");
        let ifd = u32::from_le_bytes(tiff[4..8].try_into().unwrap()) as usize;
        let entries = u16::from_le_bytes([tiff[ifd], tiff[ifd + 1]]) as usize;
        for e in 0..entries {
            let at = ifd + 2 + 12 * e;
            let tag = u16::from_le_bytes([tiff[at], tiff[at + 1]]);
            let kind = u16::from_le_bytes([tiff[at + 2], tiff[at + 3]]);
            if tag == 256 || tag == 257 {
                match kind {
                    3 => tiff[at + 8..at + 10].copy_from_slice(&(huge as u16).to_le_bytes()),
                    _ => tiff[at + 8..at + 12].copy_from_slice(&huge.to_le_bytes()),
                }
            }
        }
        let mut ppm = format!("P6\n{huge} {huge}\n255\n").into_bytes();
        ppm.extend_from_slice(&[7; 300]);
        let dir = tempfile::tempdir().unwrap();
        for (name, format, bytes) in [
            ("bomb.gif", Format::Gif, &gif),
            ("bomb.bmp", Format::Bmp, &bmp),
            ("bomb.webp", Format::Webp, &webp),
            ("bomb.tiff", Format::Tiff, &tiff),
            ("bomb.ppm", Format::Raw, &ppm),
        ] {
            let path = dir.path().join(name);
            let mut out = Image::default();
            let e = decode(format, bytes, &path, &mut out)
                .unwrap_err()
                .to_string();
            assert!(e.contains(name), "{e}");
            if format != Format::Raw {
                // (A raw frame is a view of the file's bytes: it is refused for being short.)
                assert!(e.contains(&format!("promises {huge}x{huge}")), "{e}");
            }
            assert!(
                out.pixels.capacity() < 1 << 20,
                "{name}: allocated before refusing"
            );
            std::fs::write(&path, bytes).unwrap();
            let e = import(&path, &ImportOptions::default())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(name) && e.contains(&format!("promises {huge}x{huge}")),
                "{e}"
            );
        }
        // An L3 header patched the same way: its offset table (and, in version 2, its checksum) no longer
        // fits the data.
        let img = Image {
            width: 16,
            height: 16,
            channels: 3,
            pixels: vec![9; 16 * 16 * 3],
        };
        let mut l3 = crate::convert::encode(&img, crate::convert::Target::L3_DEFAULT).unwrap();
        l3[6..10].copy_from_slice(&huge.to_le_bytes());
        l3[10..14].copy_from_slice(&huge.to_le_bytes());
        let path = dir.path().join("bomb.l3");
        let mut out = Image::default();
        let e = decode(Format::L3, &l3, &path, &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bomb.l3"), "{e}");
        assert!(
            out.pixels.capacity() < 1 << 20,
            "l3: allocated before refusing"
        );
        // The same files at their real size decode.
        for (format, f) in [
            (Format::Gif, image::ImageFormat::Gif),
            (Format::Bmp, image::ImageFormat::Bmp),
            (Format::Tiff, image::ImageFormat::Tiff),
        ] {
            let mut out = Image::default();
            decode(format, &encoded(f), Path::new("ok"), &mut out).unwrap();
            assert_eq!((out.width, out.height), (16, 16));
        }
    }

    /// A real JPEG cut in half is an error naming the file, in the pipeline and in `import`; with
    /// `partial_images` it decodes at its full size, reported as partial.
    #[test]
    fn a_jpeg_cut_short_is_an_error_unless_partial_images_are_allowed() {
        // Busy enough that the entropy-coded data, not the tables, is most of the file: the cut lands in
        // the scan.
        let mut rng = SplitMix64::new(3);
        let img = image::RgbImage::from_fn(256, 192, |x, y| {
            image::Rgb([x as u8 ^ (rng.next_u64() as u8 & 0x3F), y as u8, 90])
        });
        let mut jpeg = Cursor::new(Vec::new());
        img.write_to(&mut jpeg, image::ImageFormat::Jpeg).unwrap();
        let jpeg = jpeg.into_inner();
        let cut = &jpeg[..jpeg.len() / 2];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.jpg");
        std::fs::write(&path, cut).unwrap();
        let mut out = Image::default();
        let e = decode(Format::Jpeg, cut, &path, &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.jpg") && e.contains("truncated"), "{e}");
        let e = import(&path, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.jpg") && e.contains("truncated"), "{e}");
        let allow = DecodeOptions {
            partial_images: true,
        };
        assert!(decode_with_options(Format::Jpeg, cut, &path, &allow, &mut out).unwrap());
        assert_eq!((out.width, out.height), (256, 192));
        let got = import(
            &path,
            &ImportOptions {
                partial_images: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!((got.width, got.height), (256, 192));
        // The whole file is not partial.
        assert!(!decode_with_options(Format::Jpeg, &jpeg, &path, &allow, &mut out).unwrap());
    }

    /// A real photo written by the toolkit's JPEG encoder (`convert::encode`, what `l3 convert --to jpeg`
    /// writes), cut in the middle of its scan and re-terminated with an end-of-image marker, as a tool that
    /// "repairs" a cut file writes it: every byte before the marker is valid and the file ends properly, so
    /// only the decoder can tell that the scan stopped short. It is a typed error naming the file, from the
    /// pipeline's decoder and from `import`, with or without `partial_images`... except that with it the
    /// image is delivered as partial. The intact file decodes to libjpeg-turbo's pixels of it.
    #[test]
    fn a_jpeg_cut_mid_scan_and_re_terminated_is_an_error() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
        let photo = import(&corpus.join("Storm.jpg"), &ImportOptions::default()).unwrap();
        // A 480×320 piece of it keeps the debug-build test quick.
        let (w, h) = (480u32, 320u32);
        let row = photo.width as usize * 3;
        let piece = Image {
            width: w,
            height: h,
            channels: 3,
            pixels: (0..h as usize)
                .flat_map(|y| photo.pixels[y * row..y * row + w as usize * 3].to_vec())
                .collect(),
        };
        let jpeg = crate::convert::encode(&piece, crate::convert::Target::Jpeg(90)).unwrap();
        let dir = tempfile::tempdir().unwrap();

        let intact = dir.path().join("intact.jpg");
        std::fs::write(&intact, &jpeg).unwrap();
        let mut out = Image::default();
        assert!(
            !decode_with_options(
                Format::Jpeg,
                &jpeg,
                &intact,
                &DecodeOptions::default(),
                &mut out
            )
            .unwrap()
        );
        let reference = pcr::libjpeg::decode_rgb(&jpeg).unwrap();
        assert_eq!((out.width, out.height, out.channels), (w, h, 3));
        assert!(out.pixels == reference.pixels, "the intact file's pixels");
        assert!(import(&intact, &ImportOptions::default()).unwrap().pixels == reference.pixels);

        let sos = jpeg.windows(2).position(|m| m == [0xFF, 0xDA]).unwrap();
        let mut cut = jpeg[..sos + (jpeg.len() - sos) / 2].to_vec();
        if cut.last() == Some(&0xFF) {
            cut.pop(); // not half a stuffed byte
        }
        cut.extend_from_slice(&[0xFF, 0xD9]);
        assert!(check_jpeg_end(&cut).is_ok(), "it ends like a whole file");
        let path = dir.path().join("re-terminated.jpg");
        std::fs::write(&path, &cut).unwrap();
        let e = decode(Format::Jpeg, &cut, &path, &mut out).unwrap_err();
        assert!(
            matches!(&e, Error::Decode { path: p, format: "jpeg", reason } if *p == path && reason.contains("truncated")),
            "{e}"
        );
        let e = import(&path, &ImportOptions::default()).unwrap_err();
        assert!(matches!(&e, Error::Decode { .. }), "{e}");
        assert!(e.to_string().contains("re-terminated.jpg"), "{e}");
        let allow = DecodeOptions {
            partial_images: true,
        };
        assert!(decode_with_options(Format::Jpeg, &cut, &path, &allow, &mut out).unwrap());
        assert_eq!((out.width, out.height), (w, h));
    }

    /// The decode budget is shared: reservations beyond it wait until others are released, and one
    /// larger than the whole budget still proceeds alone.
    #[test]
    fn the_decode_budget_makes_big_decodes_take_turns() {
        let budget = max_image_bytes();
        let first = DecodeBudget::reserve(budget / 2 + 1);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let r = DecodeBudget::reserve(budget / 2 + 1);
            tx.send(()).unwrap();
            drop(r);
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "no wait"
        );
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("released");
        waiter.join().unwrap();
    }

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
        use crate::convert::{Target, encode};
        let files = [
            (Format::L3, encode(&img, Target::L3_DEFAULT).unwrap()),
            (Format::Raw, encode(&img, Target::Raw).unwrap()),
            (Format::Png, encode(&img, Target::Png).unwrap()),
            (Format::Jpeg, encode(&img, Target::Jpeg(80)).unwrap()),
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
                crate::fuzz_decode_sample(&bytes[..cut]);
            }
            for _ in 0..2000 {
                let mut b = bytes.clone();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.index(b.len());
                    b[i] = rng.next_u64() as u8;
                }
                let _ = decode(*f, &b, Path::new("x"), &mut out);
                crate::fuzz_decode_sample(&b);
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn import_rules() {
        let dir = tempfile::tempdir().unwrap();
        // Gray+alpha becomes RGBA, losslessly.
        let la = image::GrayAlphaImage::from_fn(5, 3, |x, y| {
            image::LumaA([(x * 40) as u8, (y * 90) as u8])
        });
        let p = dir.path().join("la.png");
        la.save(&p).unwrap();
        let img = import(&p, &ImportOptions::default()).unwrap();
        assert_eq!((img.width, img.height, img.channels), (5, 3, 4));
        assert_eq!(&img.pixels[4 * 6..4 * 7], &[40, 40, 40, 90]);
        // 16-bit needs the explicit lossy opt-in.
        let g16 = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::from_fn(4, 4, |x, _| {
            image::Luma([x as u16 * 20000])
        });
        let p = dir.path().join("g16.png");
        g16.save(&p).unwrap();
        let e = import(&p, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("g16.png") && e.contains("--to-8bit"), "{e}");
        let img = import(
            &p,
            &ImportOptions {
                to_8bit: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            (img.channels, img.pixels[1]),
            (1, (20000u32 * 255 / 65535) as u8 + 1)
        );
        // A FIFO named like an image fails at once instead of blocking.
        let fifo = dir.path().join("x.png");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = import(&fifo, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("FIFO"), "{e}");
    }
}
