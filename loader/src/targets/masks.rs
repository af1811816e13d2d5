//! Label maps decoded and resampled: decoding one ([`decode_mask`]: 1-, 2-, 4-, 8- or 16-bit gray PNG,
//! 8-bit PGM/PPM, one-channel L3; [`decode_stored_mask`]: what the read stage fetched of it), and writing
//! it into its sample with exactly the image's geometry and nearest interpolation ([`write_mask`]).
//! Which mask belongs to which image, and reading it, is the read stage's ([`MaskIndex`]).
//!
//! Every decode reads the mask's header first ([`MaskHeader`]): the caller's check (its image's size)
//! and the checks and shared budget every image decode goes through (`max_image_bytes`, the header
//! against the data's length) come before a single value is allocated, so a small file that claims a
//! huge mask costs nothing.

use super::mask_png::PngMask;
pub use crate::dataset::masks::{MASK_EXTENSIONS, MaskIndex, MaskNaming, picked, strip_extension};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::DecodeBudget;
use crate::item::Stored;
use std::path::Path;
use vocab::Geometry;

/// What a mask file's header says, read before anything is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskHeader {
    pub width: u32,
    pub height: u32,
    /// Stored with 16 bits per value.
    pub wide: bool,
}

/// Whether `index`'s masks are 16-bit: the first paired mask decides, from its header alone; every
/// other 16-bit mask of an 8-bit set is then an error naming it. With `skip_errors` a mask that cannot
/// be read or whose header is damaged is passed over (its item fails, and is skipped, when the run
/// reaches it): the first readable one decides, and 8-bit when there is none.
pub fn probe_wide(index: &MaskIndex, skip_errors: bool) -> Result<bool> {
    for key in index.keys() {
        let header = index
            .read(key)
            .and_then(|bytes| mask_header(&bytes, &index.name(key)));
        match header {
            Ok(h) => return Ok(h.wide),
            Err(_) if skip_errors => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// A decoded label map: one value per pixel, rows top to bottom.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaskImage {
    pub width: u32,
    pub height: u32,
    /// Stored with 16 bits per value.
    pub wide: bool,
    /// The values of `rect`, row by row: the whole mask, or — for an L3 mask decoded for one sample —
    /// only the part the sample picks from.
    pub values: Vec<u16>,
    pub rect: vocab::Rect,
}

/// Decodes a label map: a gray PNG (1, 2, 4, 8 or 16 bits per value, kept as stored: a 1-bit mask's
/// classes are 0 and 1, never rescaled), an 8-bit PGM (or a PPM whose three channels agree), or a
/// one-channel L3 file. Anything else — colour, alpha, a palette — is an error naming `path` and what
/// the file is: a label is a class index, and no conversion of colours into indices would be the user's.
pub fn decode_mask(bytes: &[u8], path: &Path, out: &mut MaskImage) -> Result<()> {
    decode_mask_region(bytes, path, None, out)
}

/// [`decode_mask`], decoding of an L3 mask only the patches under `want` (when it lies inside the mask):
/// what one sample picks from. Other formats decode whole; `out.rect` says what was decoded.
pub fn decode_mask_region(
    bytes: &[u8],
    path: &Path,
    want: Option<vocab::Rect>,
    out: &mut MaskImage,
) -> Result<()> {
    decode_checked(bytes, path, want, |_| Ok(()), out)
}

/// The header of the mask file `bytes` (`path` names it in errors), without decoding its values.
pub fn mask_header(bytes: &[u8], path: &Path) -> Result<MaskHeader> {
    match Format::sniff(bytes) {
        Some(Format::Png) => {
            let (width, height, wide) = PngMask::open(bytes, path)?.header();
            Ok(MaskHeader {
                width,
                height,
                wide,
            })
        }
        Some(Format::Raw) => {
            let view = crate::raw::parse(bytes).map_err(|e| Error::decode(path, "raw", e))?;
            Ok(MaskHeader {
                width: view.width,
                height: view.height,
                wide: false,
            })
        }
        Some(Format::L3) => {
            let n =
                l3_format::L3Index::prefix_len(bytes).map_err(|e| Error::decode(path, "l3", e))?;
            let index = l3_format::L3Index::parse(&bytes[..n.min(bytes.len())], bytes.len() as u64)
                .map_err(|e| Error::decode(path, "l3", e))?;
            l3_header((index.width(), index.height(), index.channels()), path)
        }
        other => Err(not_a_mask(path, other)),
    }
}

fn not_a_mask(path: &Path, format: Option<Format>) -> Error {
    Error::decode(
        path,
        format.map_or("mask", Format::name),
        "not a mask file (gray PNG, 8-bit PGM/PPM or one-channel L3)",
    )
}

/// Admits the decode of a mask of `h` into the shared decode budget once the checks every image decode
/// makes from its header have passed (`name`'s `packed` bytes of decoded data against the file's
/// length): the values (two bytes each) and `working` bytes beside them are reserved until the guard
/// drops.
fn admit(
    path: &Path,
    name: &'static str,
    h: &MaskHeader,
    (packed, working): (u64, u64),
    bytes: &[u8],
) -> Result<DecodeBudget> {
    let samples = if h.wide { 2 } else { 1 };
    if h.width == 0 || h.height == 0 {
        return Err(Error::decode(
            path,
            name,
            format!("a {}x{} mask is empty", h.width, h.height),
        ));
    }
    crate::image::check_header(path, name, (h.width, h.height), samples, packed, bytes)?;
    let values = u64::from(h.width) * u64::from(h.height) * 2;
    Ok(DecodeBudget::reserve(values.saturating_add(working)))
}

/// [`decode_mask_region`] with `check` run on the header before anything is allocated (the decode
/// stage's: the mask has its image's size).
fn decode_checked(
    bytes: &[u8],
    path: &Path,
    want: Option<vocab::Rect>,
    check: impl FnOnce(&MaskHeader) -> Result<()>,
    out: &mut MaskImage,
) -> Result<()> {
    match Format::sniff(bytes) {
        Some(Format::Png) => {
            let png = PngMask::open(bytes, path)?;
            let (width, height, wide) = png.header();
            let header = MaskHeader {
                width,
                height,
                wide,
            };
            check(&header)?;
            let sizes = (png.packed_len(), png.working_bytes());
            let _decoding = admit(path, "png", &header, sizes, bytes)?;
            png.decode(path, &mut out.values)?;
            (out.width, out.height, out.wide) = (width, height, wide);
        }
        Some(Format::Raw) => {
            let bad = |why: String| Error::decode(path, "raw", why);
            let view = crate::raw::parse(bytes).map_err(bad)?;
            let header = MaskHeader {
                width: view.width,
                height: view.height,
                wide: false,
            };
            check(&header)?;
            let c = view.channels as usize;
            if c == 2 || c == 4 {
                return Err(bad("a mask has no alpha channel".into()));
            }
            let packed = view.pixels.len() as u64;
            let _decoding = admit(path, "raw", &header, (packed, 0), bytes)?;
            out.values.clear();
            for px in view.pixels.chunks_exact(c) {
                if px.iter().any(|&v| v != px[0]) {
                    return Err(bad(
                        "a colour PPM: a mask is one channel of class indices (its three channels \
                         must agree)"
                            .into(),
                    ));
                }
                out.values.push(u16::from(px[0]));
            }
            (out.width, out.height, out.wide) = (view.width, view.height, false);
        }
        Some(Format::L3) => {
            let file = l3_format::L3File::parse(bytes).map_err(|e| Error::decode(path, "l3", e))?;
            let dims = (file.width(), file.height(), file.channels());
            check(&l3_header(dims, path)?)?;
            return decode_l3_mask(dims, path, want, out, |r, buf, layout| {
                file.decode_region(r, buf, layout)
            });
        }
        other => return Err(not_a_mask(path, other)),
    }
    out.rect = vocab::Rect::new(0, 0, out.width, out.height);
    Ok(())
}

/// [`decode_mask_region`] of what the read stage stored for a mask: its whole bytes, or the header,
/// offset table and patches of an L3 mask that a region read fetched (then `want` must lie inside what
/// was read, or the decode is an error naming `path`). `check` is run on the mask's header before
/// anything is allocated or decoded.
pub fn decode_stored_mask(
    stored: &Stored,
    path: &Path,
    want: Option<vocab::Rect>,
    check: impl FnOnce(&MaskHeader) -> Result<()>,
    out: &mut MaskImage,
) -> Result<()> {
    match stored {
        Stored::Whole(bytes) => decode_checked(bytes, path, want, check, out),
        Stored::L3Region { index, fragments } => {
            let dims = (index.width(), index.height(), index.channels());
            check(&l3_header(dims, path)?)?;
            decode_l3_mask(dims, path, want, out, |r, buf, layout| {
                index.decode_region(fragments, r, buf, layout)
            })
        }
    }
}

/// The header of an L3 mask of `(width, height, channels)`: one channel, or an error naming `path`.
fn l3_header((width, height, channels): (u32, u32, u8), path: &Path) -> Result<MaskHeader> {
    if channels != 1 {
        return Err(Error::decode(
            path,
            "l3",
            format!("a mask is one channel of class indices; this L3 file has {channels}"),
        ));
    }
    Ok(MaskHeader {
        width,
        height,
        wide: false,
    })
}

/// An L3 mask of `(width, height, channels)`: the part `want` (the whole mask when `want` is `None` or
/// does not fit) decoded by `decode` into `out`, admitted into the decode budget first.
fn decode_l3_mask(
    (w, h, channels): (u32, u32, u8),
    path: &Path,
    want: Option<vocab::Rect>,
    out: &mut MaskImage,
    decode: impl FnOnce(
        l3_format::Rect,
        &mut [u8],
        l3_format::PixelLayout,
    ) -> std::result::Result<(), l3_format::Error>,
) -> Result<()> {
    l3_header((w, h, channels), path)?;
    if w == 0 || h == 0 || u64::from(w) * u64::from(h) > crate::image::max_image_bytes() {
        return Err(Error::decode(
            path,
            "l3",
            format!("a {w}x{h} mask: empty or over the image size limit"),
        ));
    }
    let r = want
        .filter(|r| r.fits(w, h))
        .unwrap_or(vocab::Rect::new(0, 0, w, h));
    let part = u64::from(r.w) * u64::from(r.h);
    // The decoded bytes and their values, two bytes each.
    let _decoding = DecodeBudget::reserve(part * 3);
    let mut buf = vec![0u8; part as usize];
    let layout = l3_format::PixelLayout::packed(r.w, r.h, 1, false);
    decode(l3_format::Rect::new(r.x, r.y, r.w, r.h), &mut buf, layout)
        .map_err(|e| Error::decode(path, "l3", e))?;
    out.values.clear();
    out.values.extend(buf.iter().map(|&v| u16::from(v)));
    (out.width, out.height, out.wide) = (w, h, false);
    out.rect = r;
    Ok(())
}

/// Writes `mask`'s sample into `slot` (`out` = width × height values, one byte each, or two
/// little-endian bytes when `wide`): the pixels `g` maps from the mask, by [`Axis::nearest`](vocab::Axis::nearest) (PyTorch's
/// `nearest` index rule, what torchvision applies to masks), mirrored with the image; `ignore` wherever
/// the sample shows no image.
pub fn write_mask(
    mask: &MaskImage,
    g: &Geometry,
    out: (u32, u32),
    ignore: u16,
    wide: bool,
    slot: &mut [u8],
) {
    let (ow, oh) = (out.0 as usize, out.1 as usize);
    let size = if wide { 2 } else { 1 };
    if ow == 0 || oh == 0 {
        return;
    }
    let (kw, kh) = g.size();
    let (kw, kh) = (kw as usize, kh as usize);
    let (x0, y0) = (g.dx as usize, g.dy as usize);
    // Positions within the decoded part (`mask.rect`); a sample never picks outside it, and if it did
    // the value would be `ignore`, never a panic.
    let (rx, ry, mw) = (
        mask.rect.x as usize,
        mask.rect.y as usize,
        mask.rect.w as usize,
    );
    // Per output column, once per mask: its source column within the decoded part (mirrored within
    // the kept columns with the image), or `usize::MAX` (no value: `ignore`) where it shows no image.
    let cols: Vec<usize> = (0..ow)
        .map(|x| {
            x.checked_sub(x0)
                .filter(|&j| j < kw)
                .and_then(|j| {
                    let j = if g.flip { kw - 1 - j } else { j };
                    (g.x.nearest(j as u32) as usize).checked_sub(rx)
                })
                .unwrap_or(usize::MAX)
        })
        .collect();
    let pick = |src: &[u16], c: usize| src.get(c).copied().unwrap_or(ignore);
    for (y, row) in slot.chunks_exact_mut(ow * size).take(oh).enumerate() {
        let src = y
            .checked_sub(y0)
            .filter(|&r| r < kh)
            .and_then(|r| (g.y.nearest(r as u32) as usize).checked_sub(ry))
            .and_then(|sy| mask.values.get(sy * mw..(sy + 1) * mw));
        match (src, wide) {
            (None, false) => row.fill(ignore as u8),
            (None, true) => row
                .chunks_exact_mut(2)
                .for_each(|o| o.copy_from_slice(&ignore.to_le_bytes())),
            (Some(src), false) => row
                .iter_mut()
                .zip(&cols)
                .for_each(|(o, &c)| *o = pick(src, c) as u8),
            (Some(src), true) => row
                .chunks_exact_mut(2)
                .zip(&cols)
                .for_each(|(o, &c)| o.copy_from_slice(&pick(src, c).to_le_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vocab::Rect;

    #[test]
    fn an_l3_mask_decoded_for_its_sample_gives_what_the_whole_mask_gives() {
        let (w, h) = (77u32, 45u32);
        let img = crate::image::Image {
            width: w,
            height: h,
            channels: 1,
            pixels: (0..w * h).map(|i| (i * 7 % 251) as u8).collect(),
        };
        let l3 = crate::convert::encode(&img, crate::convert::Target::L3_DEFAULT).unwrap();
        let path = Path::new("m.l3");
        let mut whole = MaskImage::default();
        decode_mask(&l3, path, &mut whole).unwrap();
        assert_eq!(whole.rect, Rect::new(0, 0, w, h));
        let mut rng = stdx::SplitMix64::new(4);
        let recipes = [
            vocab::Recipe::Crop,
            vocab::Recipe::Jitter { range: [0.5, 2.0] },
            vocab::Recipe::ResizedCrop {
                scale: [0.05, 0.5],
                ratio: vocab::DEFAULT_RATIO,
            },
        ];
        for recipe in recipes {
            for _ in 0..20 {
                let g = recipe.geometry((w, h), (31, 20), true, true, &mut rng);
                let mut part = MaskImage::default();
                decode_mask_region(&l3, path, Some(picked(&g)), &mut part).unwrap();
                assert!(
                    part.values.len() < whole.values.len() || part.rect == whole.rect,
                    "{recipe:?}: only what the sample picks from is decoded"
                );
                let (mut a, mut b) = (vec![0u8; 31 * 20], vec![0u8; 31 * 20]);
                write_mask(&whole, &g, (31, 20), 255, false, &mut a);
                write_mask(&part, &g, (31, 20), 255, false, &mut b);
                assert_eq!(a, b, "{recipe:?} {g:?}");
            }
        }
    }

    fn png(w: u32, h: u32, wide: bool, f: impl Fn(u32, u32) -> u16) -> Vec<u8> {
        let f = &f;
        let mut out = Vec::new();
        let enc = image::codecs::png::PngEncoder::new(&mut out);
        use image::ImageEncoder;
        if wide {
            let px: Vec<u8> = (0..h)
                .flat_map(|y| (0..w).map(move |x| (x, y)))
                .flat_map(|(x, y)| f(x, y).to_ne_bytes())
                .collect();
            enc.write_image(&px, w, h, image::ExtendedColorType::L16)
                .unwrap();
        } else {
            let px: Vec<u8> = (0..h)
                .flat_map(|y| (0..w).map(move |x| f(x, y) as u8))
                .collect();
            enc.write_image(&px, w, h, image::ExtendedColorType::L8)
                .unwrap();
        }
        out
    }

    #[test]
    fn every_mask_format_decodes_and_colour_is_refused() {
        let f = |x: u32, y: u32| (x * 3 + y * 7) as u16;
        let mut m = MaskImage::default();
        let p = Path::new("m");
        decode_mask(&png(5, 3, false, f), p, &mut m).unwrap();
        assert_eq!((m.width, m.height, m.wide), (5, 3, false));
        assert_eq!(m.values[2 * 5 + 4], f(4, 2));
        decode_mask(
            &png(5, 3, true, |x, y| 1000 * x as u16 + y as u16),
            p,
            &mut m,
        )
        .unwrap();
        assert!(m.wide);
        assert_eq!(m.values[2 * 5 + 4], 4002);
        let mut pgm = b"P5 5 3 255\n".to_vec();
        pgm.extend((0..15).map(|i| i as u8));
        decode_mask(&pgm, p, &mut m).unwrap();
        assert_eq!(m.values[14], 14);
        let mut ppm = b"P6 1 1 255\n".to_vec();
        ppm.extend([1, 2, 3]);
        let e = decode_mask(&ppm, Path::new("c.ppm"), &mut m).unwrap_err();
        assert!(e.to_string().contains("c.ppm"), "{e}");
        let px: Vec<u8> = (0..15).map(|i| (i * 17) as u8).collect();
        let l3 = l3_format::encode(&px, 5, 3, 1, 32).unwrap();
        decode_mask(&l3, p, &mut m).unwrap();
        assert_eq!(m.values[7], 7 * 17);
        let rgb = l3_format::encode(&[0; 45], 5, 3, 3, 32).unwrap();
        assert!(decode_mask(&rgb, p, &mut m).is_err());
        assert!(decode_mask(b"junk", p, &mut m).is_err());
    }

    /// A PNG written by the `png` crate itself, at any colour type and bit depth (`rows` packed as
    /// stored), with a palette for indexed colour.
    fn png_raw(
        w: u32,
        h: u32,
        color: png::ColorType,
        depth: png::BitDepth,
        rows: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == png::ColorType::Indexed {
            enc.set_palette(vec![0u8; 3 * 16]);
        }
        let mut writer = enc.write_header().unwrap();
        writer.write_image_data(rows).unwrap();
        writer.finish().unwrap();
        out
    }

    /// 1-, 2- and 4-bit gray masks keep their values (class 1 of a 1-bit mask is 1, not 255), row
    /// padding bits are no values, and interlaced files give the same values.
    #[test]
    fn low_bit_masks_keep_their_class_values() {
        use png::{BitDepth, ColorType};
        let mut m = MaskImage::default();
        // 5x2 at 1 bit: each row one byte, the last 3 bits padding (set, to catch their misuse).
        let one = png_raw(
            5,
            2,
            ColorType::Grayscale,
            BitDepth::One,
            &[0b1011_0111, 0b0100_1111],
        );
        decode_mask(&one, Path::new("one.png"), &mut m).unwrap();
        assert_eq!(m.values, [1, 0, 1, 1, 0, 0, 1, 0, 0, 1]);
        assert!(!m.wide);
        let two = png_raw(3, 1, ColorType::Grayscale, BitDepth::Two, &[0b1110_0100]);
        decode_mask(&two, Path::new("two.png"), &mut m).unwrap();
        assert_eq!(m.values, [3, 2, 1]);
        let four = png_raw(3, 1, ColorType::Grayscale, BitDepth::Four, &[0x1F, 0x70]);
        decode_mask(&four, Path::new("four.png"), &mut m).unwrap();
        assert_eq!(m.values, [1, 15, 7]);
        // Interlaced (Adam7), 8-bit, 9x7: the passes are put back together.
        let (w, h) = (9u32, 7u32);
        let px: Vec<u8> = (0..w * h).map(|i| (i % 19) as u8).collect();
        decode_mask(&adam7_gray8(w, h, &px), Path::new("adam7.png"), &mut m).unwrap();
        assert_eq!(
            m.values,
            px.iter().map(|&v| u16::from(v)).collect::<Vec<_>>()
        );
    }

    /// An interlaced 8-bit gray PNG (the `png` crate writes none): the seven Adam7 passes, each row
    /// unfiltered, in one stored (uncompressed) zlib block.
    fn adam7_gray8(w: u32, h: u32, px: &[u8]) -> Vec<u8> {
        let passes = [
            (0, 0, 8, 8),
            (4, 0, 8, 8),
            (0, 4, 4, 8),
            (2, 0, 4, 4),
            (0, 2, 2, 4),
            (1, 0, 2, 2),
            (0, 1, 1, 2),
        ];
        let mut raw = Vec::new();
        for (x0, y0, dx, dy) in passes {
            if x0 >= w || y0 >= h {
                continue;
            }
            for y in (y0..h).step_by(dy) {
                raw.push(0);
                raw.extend((x0..w).step_by(dx).map(|x| px[(y * w + x) as usize]));
            }
        }
        let mut z = vec![0x78, 0x01, 0x01];
        z.extend((raw.len() as u16).to_le_bytes());
        z.extend((!(raw.len() as u16)).to_le_bytes());
        z.extend(&raw);
        let (mut a, mut b) = (1u32, 0u32);
        for &v in &raw {
            a = (a + u32::from(v)) % 65521;
            b = (b + a) % 65521;
        }
        z.extend(((b << 16) | a).to_be_bytes());
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], data: &[u8]| {
            out.extend((data.len() as u32).to_be_bytes());
            let body = [kind, data].concat();
            out.extend(&body);
            out.extend(crc32fast::hash(&body).to_be_bytes());
        };
        let mut ihdr = [w.to_be_bytes(), h.to_be_bytes()].concat();
        ihdr.extend([8, 0, 0, 0, 1]);
        chunk(b"IHDR", &ihdr);
        chunk(b"IDAT", &z);
        chunk(b"IEND", &[]);
        out
    }

    /// A palette PNG is named as one (the image crate would call it RGB), and so are colour and alpha.
    #[test]
    fn a_palette_or_colour_png_mask_is_named_for_what_it_is() {
        use png::{BitDepth, ColorType};
        let mut m = MaskImage::default();
        let e = |bytes: &[u8]| {
            let mut m = MaskImage::default();
            decode_mask(bytes, Path::new("m.png"), &mut m)
                .unwrap_err()
                .to_string()
        };
        let palette = png_raw(2, 1, ColorType::Indexed, BitDepth::Eight, &[1, 2]);
        let msg = e(&palette);
        assert!(msg.contains("m.png") && msg.contains("palette"), "{msg}");
        assert!(!msg.contains("Rgb"), "{msg}");
        let rgb = png_raw(1, 1, ColorType::Rgb, BitDepth::Eight, &[1, 2, 3]);
        assert!(e(&rgb).contains("colour PNG"), "{}", e(&rgb));
        let la = png_raw(1, 1, ColorType::GrayscaleAlpha, BitDepth::Eight, &[1, 255]);
        assert!(e(&la).contains("alpha"), "{}", e(&la));
        assert!(mask_header(&palette, Path::new("m.png")).is_err());
        let gray = png_raw(2, 1, ColorType::Grayscale, BitDepth::Eight, &[1, 2]);
        decode_mask(&gray, Path::new("m.png"), &mut m).unwrap();
    }

    /// A small PNG whose header claims 20000x20000 values, with as much (junk) data as deflate needs to
    /// reach that size (so the data's length does not give it away): what a deflate bomb looks like
    /// from its header.
    pub(crate) fn bomb_png() -> Vec<u8> {
        let mut png = png_raw(1, 1, png::ColorType::Grayscale, png::BitDepth::Eight, &[0]);
        let side = 20000u32;
        png[16..20].copy_from_slice(&side.to_be_bytes());
        png[20..24].copy_from_slice(&side.to_be_bytes());
        let crc = crc32fast::hash(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        // Replace everything after IHDR by one IDAT of (side*(side+1))/1032 bytes and IEND.
        png.truncate(33);
        let len = (u64::from(side) * u64::from(side + 1)).div_ceil(1032) as usize + 16;
        let mut chunk = b"IDAT".to_vec();
        chunk.resize(4 + len, 0);
        png.extend((len as u32).to_be_bytes());
        png.extend(&chunk);
        png.extend(crc32fast::hash(&chunk).to_be_bytes());
        png.extend(0u32.to_be_bytes());
        png.extend(b"IEND");
        png.extend(crc32fast::hash(b"IEND").to_be_bytes());
        png
    }

    /// The decode stage's check (the mask has its image's size) runs on the header: a deflate bomb
    /// beside a small image is refused before anything is allocated for its values.
    #[test]
    fn a_mask_is_checked_from_its_header_before_its_values_are_allocated() {
        let bomb = bomb_png();
        assert!(bomb.len() < 400_000);
        let h = mask_header(&bomb, Path::new("bomb.png")).unwrap();
        assert_eq!((h.width, h.height, h.wide), (20000, 20000, false));
        let mut m = MaskImage::default();
        let stored = Stored::Whole(bomb);
        let e = decode_stored_mask(
            &stored,
            Path::new("bomb.png"),
            None,
            |h| {
                assert_eq!((h.width, h.height), (20000, 20000));
                Err(Error::dataset("bomb.png", "not its image's 64x48"))
            },
            &mut m,
        )
        .unwrap_err();
        assert!(e.to_string().contains("64x48"), "{e}");
        assert_eq!(m.values.capacity(), 0, "nothing allocated before the check");
    }

    /// Mask decodes wait for room in the decode budget images share: with the whole budget held by
    /// another decode, a mask decode waits until it is released.
    #[test]
    fn mask_decodes_share_the_image_decode_budget() {
        let budget = crate::image::max_image_bytes();
        let held = DecodeBudget::reserve(budget);
        let (tx, rx) = std::sync::mpsc::channel();
        let gray = png(64, 64, false, |x, y| (x ^ y) as u16);
        let waiter = std::thread::spawn(move || {
            let mut m = MaskImage::default();
            decode_mask(&gray, Path::new("m.png"), &mut m).unwrap();
            tx.send(m.values.len()).unwrap();
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the mask decode did not wait for the budget"
        );
        drop(held);
        let n = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("released");
        assert_eq!(n, 64 * 64);
        waiter.join().unwrap();
    }

    #[test]
    fn a_mask_follows_the_window_pads_with_ignore_and_mirrors_within_the_image() {
        let mask = MaskImage {
            width: 4,
            height: 2,
            wide: false,
            values: (0..8).collect(),
            rect: Rect::new(0, 0, 4, 2),
        };
        // The 4x2 mask centred in a 6x3 sample, mirrored.
        let g = Geometry::from_window(&vocab::Window::new(Rect::new(0, 0, 4, 2), 1, 0, true));
        let mut slot = vec![0u8; 18];
        write_mask(&mask, &g, (6, 3), 255, false, &mut slot);
        #[rustfmt::skip]
        let want = [
            255, 3, 2, 1, 0, 255,
            255, 7, 6, 5, 4, 255,
            255, 255, 255, 255, 255, 255,
        ];
        assert_eq!(slot, want);
        // Columns 2..4 upscaled 2x, 16-bit; then 4 columns resized to 6 (PyTorch: floor(j * 4 / 6)).
        let axis = |src, src_len, dst_len| vocab::Axis {
            src,
            src_len,
            dst_len,
            offset: 0,
            len: dst_len,
        };
        let mut g = Geometry {
            x: axis(2, 2, 4),
            y: axis(0, 2, 4),
            dx: 0,
            dy: 0,
            flip: false,
        };
        let mut slot = vec![0u8; 32];
        write_mask(&mask, &g, (4, 4), 300, true, &mut slot);
        let v: Vec<u16> = slot
            .chunks(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(&v[..8], [2, 2, 3, 3, 2, 2, 3, 3]);
        assert_eq!(&v[8..12], [6, 6, 7, 7]);
        g.x = axis(0, 4, 6);
        let mut slot = vec![0u8; 6 * 4];
        write_mask(&mask, &g, (6, 4), 9, false, &mut slot);
        assert_eq!(&slot[..6], [0, 0, 1, 2, 2, 3]);
    }
}
