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

fn too_large(path: &Path, w: u32, h: u32, c: u64) -> Error {
    let bytes = u64::from(w) * u64::from(h) * c;
    Error::decode(
        path,
        "image",
        format!(
            "{w}x{h} decodes to {}, over the image size limit of {} (set {MAX_IMAGE_BYTES_VAR} to raise it)",
            stdx::mem::human(bytes),
            stdx::mem::human(max_image_bytes())
        ),
    )
}

/// Refuses a header that promises more pixels than its data can hold — a decompression bomb, or a file
/// cut short — before anything is allocated. Deflate expands at most 1032:1, so a PNG's compressed data is
/// at least 1/1032 of its pixel bytes; every 8×8 block of a JPEG's first component costs at least one bit
/// of its first (DC) scan, progressive or not. Other formats are bounded by [`max_image_bytes`] and the
/// process's [`DecodeBudget`] only.
fn plausible(
    path: &Path,
    name: &'static str,
    (w, h): (u32, u32),
    total: u64,
    data_len: u64,
) -> Result<()> {
    let least = match name {
        "png" => total.div_ceil(1032),
        "jpeg" => (u64::from(w).div_ceil(8) * u64::from(h).div_ceil(8)).div_ceil(8),
        _ => return Ok(()),
    };
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

/// Decoded bytes being produced at once by every decoder of the process together, at most
/// [`max_image_bytes`]: a decode thread waits for room before it allocates, so that N threads meeting N
/// huge images need the memory of one, not of N. One image alone may always take the whole budget.
pub(crate) struct DecodeBudget(u64);

static IN_FLIGHT: (std::sync::Mutex<u64>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

impl DecodeBudget {
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
    // decoders' own bookkeeping gets the same bound plus room for their working buffers.
    l.max_alloc = Some(max_image_bytes().saturating_mul(2));
    l
}

/// Decodes `bytes` of `format` into `out` (upright, 8-bit); `path` names the item in errors. The
/// pipeline's whole-image decoder: 16-bit samples of a dataset image are reduced to 8 bits, as the batch
/// holds 8-bit pixels anyway.
pub fn decode(format: Format, bytes: &[u8], path: &Path, out: &mut Image) -> Result<()> {
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
        Format::Png => decode_with(
            image::codecs::png::PngDecoder::new(Cursor::new(bytes)),
            path,
            "png",
            out,
            bytes.len() as u64,
        ),
        Format::Jpeg | Format::Pcr => {
            check_jpeg_end(bytes).map_err(|e| Error::decode(path, "jpeg", e))?;
            decode_with(
                image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes)),
                path,
                "jpeg",
                out,
                bytes.len() as u64,
            )
        }
        Format::Webp => decode_with(
            image::codecs::webp::WebPDecoder::new(Cursor::new(bytes)),
            path,
            "webp",
            out,
            bytes.len() as u64,
        ),
        Format::Tiff => decode_with(
            image::codecs::tiff::TiffDecoder::new(Cursor::new(bytes)),
            path,
            "tiff",
            out,
            bytes.len() as u64,
        ),
        Format::Bmp => decode_with(
            image::codecs::bmp::BmpDecoder::new(Cursor::new(bytes)),
            path,
            "bmp",
            out,
            bytes.len() as u64,
        ),
        Format::Gif => decode_with(
            image::codecs::gif::GifDecoder::new(Cursor::new(bytes)),
            path,
            "gif",
            out,
            bytes.len() as u64,
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
            if file.decoded_len() as u64 > max_image_bytes() {
                return Err(too_large(
                    path,
                    file.width(),
                    file.height(),
                    file.channels().into(),
                ));
            }
            let _decoding = DecodeBudget::reserve(file.decoded_len() as u64);
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
pub(crate) fn check_jpeg_end(bytes: &[u8]) -> std::result::Result<(), &'static str> {
    let tail = &bytes[bytes.len().saturating_sub(4096)..];
    if tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        Ok(())
    } else {
        Err("truncated: no end-of-image marker")
    }
}

fn decode_with<D: ImageDecoder>(
    decoder: image::ImageResult<D>,
    path: &Path,
    name: &'static str,
    out: &mut Image,
    data_len: u64,
) -> Result<()> {
    use image::ColorType;
    let err = |e: image::ImageError| Error::decode(path, name, e);
    let mut decoder = decoder.map_err(err)?;
    let (w, h) = decoder.dimensions();
    let samples = u64::from(decoder.color_type().channel_count());
    if u64::from(w) * u64::from(h) * samples > max_image_bytes() {
        return Err(too_large(path, w, h, samples));
    }
    plausible(path, name, (w, h), decoder.total_bytes(), data_len)?;
    let _decoding = DecodeBudget::reserve(decoder.total_bytes());
    decoder.set_limits(limits()).map_err(err)?;
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
    let name = match reader.format() {
        Some(image::ImageFormat::Png) => "png",
        Some(image::ImageFormat::Jpeg) => "jpeg",
        _ => "image",
    };
    let mut decoder = reader.into_decoder().map_err(err)?;
    let (w, h) = decoder.dimensions();
    let samples = u64::from(decoder.color_type().channel_count());
    if u64::from(w) * u64::from(h) * samples > max_image_bytes() {
        return Err(too_large(path, w, h, samples));
    }
    plausible(
        path,
        name,
        (w, h),
        decoder.total_bytes(),
        bytes.len() as u64,
    )?;
    let _decoding = DecodeBudget::reserve(decoder.total_bytes());
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
        let img = import(&p, &ImportOptions { to_8bit: true }).unwrap();
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
