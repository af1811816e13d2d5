//! Label maps: which mask file belongs to which image ([`MaskIndex`]), decoding one ([`decode_mask`]: 8- or
//! 16-bit single-channel PNG, 8-bit PGM/PPM, one-channel L3), and writing it into its sample with exactly
//! the image's geometry and nearest interpolation ([`write_mask`]).

use crate::dataset::regions::{IndexCache, read_rect};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{SampleRequest, Stored};
use crate::sample::DecodeScope;
use crate::storage::Storage;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use vocab::Geometry;

/// The extensions a mask file may have, in the order a missing mask's message lists them.
pub const MASK_EXTENSIONS: [&str; 4] = ["png", "pgm", "ppm", "l3"];

/// How image names become mask names: `image_suffix` at the end of an image's stem is replaced by
/// `mask_suffix` (Cityscapes: `_leftImg8bit` → `_gtFine_labelIds`); with no `image_suffix`, `mask_suffix`
/// is appended to the stem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaskNaming {
    pub image_suffix: String,
    pub mask_suffix: String,
}

impl MaskNaming {
    /// The mask's key without its extension for an image named `image` (a relative path, extension
    /// included), or why there is none.
    pub fn stem_for(&self, image: &str) -> std::result::Result<String, String> {
        let stem = strip_extension(image);
        let base = match stem.strip_suffix(self.image_suffix.as_str()) {
            Some(b) if !self.image_suffix.is_empty() => b,
            _ if self.image_suffix.is_empty() => stem,
            _ => {
                return Err(format!(
                    "its name does not end with image_suffix {:?} (before the extension)",
                    self.image_suffix
                ));
            }
        };
        Ok(format!("{base}{}", self.mask_suffix))
    }
}

/// A relative name without its file extension: what pairs an image with its targets whatever format a
/// conversion gave either of them.
pub fn strip_extension(name: &str) -> &str {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    match name[file_start..].rfind('.') {
        Some(dot) if dot > 0 => &name[..file_start + dot],
        _ => name,
    }
}

/// Where each item's mask is, found once when the loader starts.
#[derive(Debug)]
pub struct MaskIndex {
    storage: Storage,
    /// Per dataset item: the mask's key, or why it has none (an error naming both files).
    keys: Vec<std::result::Result<String, String>>,
}

impl MaskIndex {
    /// Lists `storage` and pairs each item name (`names[i]`: relative path of item `i`, `None` when the
    /// dataset records none; `sources[i]` names it in messages) with its mask.
    pub fn pair(
        storage: Storage,
        names: &[Option<String>],
        sources: &[PathBuf],
        naming: &MaskNaming,
    ) -> Result<MaskIndex> {
        let listing = storage.list()?;
        let mut by_stem: HashMap<&str, &str> = HashMap::new();
        for (key, _) in &listing.files {
            let ext = key.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
            if !ext.is_some_and(|e| MASK_EXTENSIONS.contains(&e.as_str())) {
                continue;
            }
            if let Some(other) = by_stem.insert(strip_extension(key), key) {
                return Err(Error::dataset(
                    storage.name(key),
                    format!(
                        "{} is the same mask in another format; a mask folder holds each mask once",
                        storage.name(other).display()
                    ),
                ));
            }
        }
        let keys = names
            .iter()
            .zip(sources)
            .map(|(name, source)| {
                let Some(name) = name else {
                    return Err(format!(
                        "{}: the dataset records no name for this item, so it has no mask",
                        source.display()
                    ));
                };
                let stem = naming
                    .stem_for(name)
                    .map_err(|why| format!("{}: no mask: {why}", source.display()))?;
                by_stem
                    .get(stem.as_str())
                    .map(|k| k.to_string())
                    .ok_or_else(|| {
                        format!(
                            "{}: its mask {}.{{{}}} is missing",
                            source.display(),
                            storage.name(&stem).display(),
                            MASK_EXTENSIONS.join(",")
                        )
                    })
            })
            .collect();
        Ok(MaskIndex { storage, keys })
    }

    /// The read layer the masks come through.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Item `index`'s mask key, or the error naming the image and the mask it lacks.
    pub fn key(&self, index: usize) -> Result<&str> {
        match &self.keys[index] {
            Ok(k) => Ok(k),
            Err(why) => Err(Error::dataset(self.storage.root(), why)),
        }
    }

    /// The items without a mask, with why.
    pub fn missing(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter_map(|k| k.as_ref().err().map(String::as_str))
    }

    /// Whether the masks are 16-bit: the first paired mask decides (its header alone is decoded); every
    /// other 16-bit mask of an 8-bit set is then an error naming it.
    pub fn probe_wide(&self) -> Result<bool> {
        let Some(key) = self.keys.iter().find_map(|k| k.as_ref().ok()) else {
            return Ok(false);
        };
        let bytes = self.read(key)?;
        let mut mask = MaskImage::default();
        decode_mask(&bytes, &self.storage.name(key), &mut mask)?;
        Ok(mask.wide)
    }

    /// The whole of mask `key`.
    pub fn read(&self, key: &str) -> Result<Vec<u8>> {
        let limit = crate::image::max_image_bytes().saturating_add(1 << 20);
        self.storage.read(key, limit)
    }

    /// What item `item`'s mask `key` contributes to the sample `req` asks for, with the bytes read: an
    /// L3 mask under a region-scoped request as L3 images are read (header, offset table — kept in
    /// `indexes` — and only the patches under the source rectangle the sample's nearest pick reads),
    /// any other mask whole.
    pub(crate) fn read_for(
        &self,
        item: usize,
        key: &str,
        req: &SampleRequest,
        indexes: &IndexCache,
    ) -> Result<(Stored, u64)> {
        let l3 = key
            .rsplit_once('.')
            .is_some_and(|(_, e)| e.eq_ignore_ascii_case("l3"));
        if l3 && req.scope == DecodeScope::Region {
            let file = self.storage.open_key(key)?;
            let len = file.size()?;
            return read_rect(indexes, item, &file, (0, len), |w, h| {
                picked(&req.geometry(w, h))
            });
        }
        let bytes = self.read(key)?;
        let n = bytes.len() as u64;
        Ok((Stored::Whole(bytes), n))
    }

    /// Where mask `key` lives, for messages.
    pub fn name(&self, key: &str) -> PathBuf {
        self.storage.name(key)
    }
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

/// The source rectangle a mask sample of geometry `g` picks from ([`Axis::nearest`](vocab::Axis::nearest)
/// is monotonic: its first and last kept outputs bound it).
pub fn picked(g: &Geometry) -> vocab::Rect {
    let span = |a: &vocab::Axis| {
        let lo = a.nearest(0);
        let hi = a.nearest(a.len.saturating_sub(1));
        (lo, hi - lo + 1)
    };
    let ((x, w), (y, h)) = (span(&g.x), span(&g.y));
    vocab::Rect::new(x, y, w, h)
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

    #[test]
    fn names_pair_by_path_and_stem_with_suffixes() {
        let cityscapes = MaskNaming {
            image_suffix: "_leftImg8bit".into(),
            mask_suffix: "_gtFine_labelIds".into(),
        };
        assert_eq!(
            cityscapes.stem_for("train/aachen/aachen_000000_000019_leftImg8bit.png"),
            Ok("train/aachen/aachen_000000_000019_gtFine_labelIds".into())
        );
        assert!(cityscapes.stem_for("train/a/b.png").is_err());
        let plain = MaskNaming::default();
        assert_eq!(plain.stem_for("a.b/c.d.l3"), Ok("a.b/c.d".into()));
        assert_eq!(strip_extension("dir.x/noext"), "dir.x/noext");
        assert_eq!(strip_extension(".hidden"), ".hidden");
    }

    #[test]
    fn pairing_finds_masks_in_any_format_and_names_both_files_when_one_lacks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/x_m.png"), b"").unwrap();
        std::fs::write(dir.path().join("a/y_m.l3"), b"").unwrap();
        let names = [
            Some("a/x.jpg".into()),
            Some("a/y.png".into()),
            Some("z.png".into()),
        ];
        let sources: Vec<PathBuf> = ["img/a/x.jpg", "img/a/y.png", "img/z.png"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let naming = MaskNaming {
            image_suffix: String::new(),
            mask_suffix: "_m".into(),
        };
        let idx = MaskIndex::pair(Storage::local(dir.path()), &names, &sources, &naming).unwrap();
        assert_eq!(idx.key(0).unwrap(), "a/x_m.png");
        assert_eq!(idx.key(1).unwrap(), "a/y_m.l3");
        let e = idx.key(2).unwrap_err().to_string();
        assert!(
            e.contains("img/z.png") && e.contains("z_m.{png,pgm,ppm,l3}"),
            "{e}"
        );
        std::fs::write(dir.path().join("a/x_m.pgm"), b"").unwrap();
        let e = MaskIndex::pair(Storage::local(dir.path()), &names, &sources, &naming)
            .unwrap_err()
            .to_string();
        assert!(e.contains("x_m.p") && e.contains("same mask"), "{e}");
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
