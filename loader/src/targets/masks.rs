//! Label maps decoded and resampled: decoding one ([`decode_mask`]: 8- or 16-bit single-channel PNG,
//! 8-bit PGM/PPM, one-channel L3; [`decode_stored_mask`]: what the read stage fetched of it), and writing
//! it into its sample with exactly the image's geometry and nearest interpolation ([`write_mask`]).
//! Which mask belongs to which image, and reading it, is the read stage's ([`MaskIndex`]).

pub use crate::dataset::masks::{MASK_EXTENSIONS, MaskIndex, MaskNaming, picked, strip_extension};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::Stored;
use std::path::Path;
use vocab::Geometry;

/// Whether `index`'s masks are 16-bit: the first paired mask decides (its header alone is decoded); every
/// other 16-bit mask of an 8-bit set is then an error naming it.
pub fn probe_wide(index: &MaskIndex) -> Result<bool> {
    let Some(key) = index.first_key() else {
        return Ok(false);
    };
    let bytes = index.read(key)?;
    let mut mask = MaskImage::default();
    decode_mask(&bytes, &index.name(key), &mut mask)?;
    Ok(mask.wide)
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

/// Decodes a label map: an 8- or 16-bit gray PNG, an 8-bit PGM (or a PPM whose three channels agree),
/// or a one-channel L3 file. Anything else — colour, alpha, a palette — is an error naming `path`: a
/// label is a class index, and no conversion of colours into indices would be the user's.
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
    let format = Format::sniff(bytes);
    let name = format.map_or("mask", Format::name);
    let bad = |why: String| Error::decode(path, name, why);
    let check_size = |w: u32, h: u32, per: u64| {
        let bytes = u64::from(w) * u64::from(h) * per;
        if w == 0 || h == 0 || bytes > crate::image::max_image_bytes() {
            return Err(bad(format!(
                "a {w}x{h} mask: empty or over the image size limit"
            )));
        }
        Ok(())
    };
    match format {
        Some(Format::Png) => {
            use image::{ColorType, ImageDecoder};
            let err = |e: image::ImageError| Error::decode(path, "png", e);
            let mut dec =
                image::codecs::png::PngDecoder::new(std::io::Cursor::new(bytes)).map_err(err)?;
            let mut limits = image::Limits::default();
            limits.max_alloc = Some(crate::image::max_image_bytes().saturating_mul(2));
            dec.set_limits(limits).map_err(err)?;
            let (w, h) = dec.dimensions();
            let wide = match dec.color_type() {
                ColorType::L8 => false,
                ColorType::L16 => true,
                other => {
                    return Err(bad(format!(
                        "a mask is one 8- or 16-bit gray channel of class indices, not {other:?}"
                    )));
                }
            };
            check_size(w, h, if wide { 2 } else { 1 })?;
            if bytes.len() as u64 * 1032 < dec.total_bytes() {
                return Err(bad(format!(
                    "the header promises {w}x{h} values, more than its data can hold"
                )));
            }
            let mut buf = vec![0u8; dec.total_bytes() as usize];
            dec.read_image(&mut buf).map_err(err)?;
            out.values.clear();
            if wide {
                out.values.extend(
                    buf.chunks_exact(2)
                        .map(|b| u16::from_ne_bytes([b[0], b[1]])),
                );
            } else {
                out.values.extend(buf.iter().map(|&v| u16::from(v)));
            }
            (out.width, out.height, out.wide) = (w, h, wide);
        }
        Some(Format::Raw) => {
            let view = crate::raw::parse(bytes).map_err(bad)?;
            check_size(view.width, view.height, 1)?;
            let c = view.channels as usize;
            if c == 2 || c == 4 {
                return Err(bad("a mask has no alpha channel".into()));
            }
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
            return decode_l3_mask(dims, path, want, out, |r, buf, layout| {
                file.decode_region(r, buf, layout)
            });
        }
        _ => {
            return Err(bad(
                "not a mask file (8- or 16-bit gray PNG, 8-bit PGM/PPM or one-channel L3)".into(),
            ));
        }
    }
    out.rect = vocab::Rect::new(0, 0, out.width, out.height);
    Ok(())
}

/// [`decode_mask_region`] of what the read stage stored for a mask: its whole bytes, or the header,
/// offset table and patches of an L3 mask that a region read fetched (then `want` must lie inside what
/// was read, or the decode is an error naming `path`).
pub fn decode_stored_mask(
    stored: &Stored,
    path: &Path,
    want: Option<vocab::Rect>,
    out: &mut MaskImage,
) -> Result<()> {
    match stored {
        Stored::Whole(bytes) => decode_mask_region(bytes, path, want, out),
        Stored::L3Region { index, fragments } => {
            let dims = (index.width(), index.height(), index.channels());
            decode_l3_mask(dims, path, want, out, |r, buf, layout| {
                index.decode_region(fragments, r, buf, layout)
            })
        }
    }
}

/// An L3 mask of `(width, height, channels)`: the part `want` (the whole mask when `want` is `None` or
/// does not fit) decoded by `decode` into `out`.
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
    let bad = |why: String| Error::decode(path, "l3", why);
    if channels != 1 {
        return Err(bad(format!(
            "a mask is one channel of class indices; this L3 file has {channels}"
        )));
    }
    if w == 0 || h == 0 || u64::from(w) * u64::from(h) > crate::image::max_image_bytes() {
        return Err(bad(format!(
            "a {w}x{h} mask: empty or over the image size limit"
        )));
    }
    let r = want
        .filter(|r| r.fits(w, h))
        .unwrap_or(vocab::Rect::new(0, 0, w, h));
    let mut buf = vec![0u8; r.w as usize * r.h as usize];
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
