//! Converting a folder of label maps: each mask decoded by the loader's mask decoder and written in the
//! target format with one channel, losslessly — except 16-bit masks, which no 8-bit target holds: they
//! are kept as the PNG files they are, and counted.

use super::{
    ConvertOptions, ConvertSummary, Target, encode, is_complete, is_complete_target,
    prepare_output, same_folder, unique_stems,
};
use crate::dataset::image_files;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::Image;
use crate::targets::masks::{MaskImage, decode_mask};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Converts every label map under `input` (gray PNG at 1 to 16 bits, 8-bit PGM/PPM, one-channel L3; kept
/// sub-folders) into `output` as one-channel `target` files (L3, PNG or raw: lossless targets only).
/// 16-bit masks are copied unchanged as PNG and counted in [`ConvertSummary::kept_png`]. A file that is
/// no mask (colour, alpha, a lossy format) is an error naming it.
pub fn convert_masks(
    input: &Path,
    output: &Path,
    target: Target,
    options: &ConvertOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<ConvertSummary> {
    if let Target::Jpeg(_) = target {
        return Err(Error::dataset(
            output,
            "masks are converted losslessly: to l3, png or raw, not jpeg",
        ));
    }
    let listed = image_files(input)?;
    let files = listed.files;
    if files.is_empty() {
        return Err(Error::dataset(input, "no masks (PNG, PGM/PPM or L3) found"));
    }
    if let Some((rel, f)) = files
        .iter()
        .find(|(_, f)| !matches!(f, Format::Png | Format::Raw | Format::L3))
    {
        return Err(Error::dataset(
            input.join(rel),
            format!("a mask is a PNG, PGM/PPM or L3 file of class indices, not {f}"),
        ));
    }
    unique_stems(input, &files)?;
    if same_folder(input, output) {
        return Err(Error::dataset(
            output,
            "the output folder is the input folder: convert into another folder",
        ));
    }
    let (_lock, stale_removed) = prepare_output(output, target.format(), Some(Format::Png))?;
    let summary = Mutex::new(ConvertSummary {
        stale_removed,
        warnings: listed.skipped,
        ..Default::default()
    });
    let done = AtomicUsize::new(0);
    let total = files.len();
    stdx::parallel::for_each(&files, options.threads, |(rel, _)| {
        let src = input.join(rel);
        let bytes = stdx::fs::read_regular(&src, crate::image::max_image_bytes())
            .map_err(|e| Error::io(&src, e))?;
        let mut mask = MaskImage::default();
        decode_mask(&bytes, &src, &mut mask)?;
        let (dst, out) = if mask.wide {
            (output.join(rel).with_extension("png"), None)
        } else {
            let dst = output.join(rel).with_extension(target.extension(1));
            (dst, Some(target))
        };
        let kept = match out {
            Some(t) => is_complete_target(&dst, t),
            None => is_complete(&dst, Format::Png),
        };
        let written = if kept {
            None
        } else {
            let data = match out {
                // 16-bit: the input file itself (only PNG holds 16 bits).
                None => bytes,
                Some(t) => {
                    let img = Image {
                        width: mask.width,
                        height: mask.height,
                        channels: 1,
                        pixels: mask.values.iter().map(|&v| v as u8).collect(),
                    };
                    encode(&img, t)
                        .map_err(|e| Error::decode(&src, "mask", format!("cannot encode: {e}")))?
                }
            };
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            stdx::fs::write_atomic(&dst, &data).map_err(|e| Error::io(&dst, e))?;
            Some(data.len() as u64)
        };
        {
            let mut s = summary.lock().unwrap_or_else(|p| p.into_inner());
            match written {
                Some(b) => {
                    s.converted += 1;
                    s.bytes_written += b;
                }
                None => s.skipped += 1,
            }
            if mask.wide && target.format() != Format::Png {
                s.kept_png += 1;
            }
        }
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
        Ok::<(), Error>(())
    })?;
    Ok(summary.into_inner().unwrap_or_else(|p| p.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_become_one_channel_l3_and_16_bit_ones_stay_png() {
        let dir = tempfile::tempdir().unwrap();
        let (input, output) = (dir.path().join("in"), dir.path().join("out"));
        std::fs::create_dir_all(input.join("a")).unwrap();
        let m8 = image::GrayImage::from_fn(9, 5, |x, y| image::Luma([(x * 5 + y) as u8]));
        m8.save(input.join("a/m8.png")).unwrap();
        let m16 = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::from_fn(4, 3, |x, y| {
            image::Luma([x as u16 * 1000 + y as u16])
        });
        m16.save(input.join("m16.png")).unwrap();
        let opts = ConvertOptions {
            threads: 1,
            to_8bit: false,
        };
        let s = convert_masks(&input, &output, Target::L3_DEFAULT, &opts, &|_, _| {}).unwrap();
        assert_eq!((s.converted, s.kept_png), (2, 1));
        let l3 = std::fs::read(output.join("a/m8.l3")).unwrap();
        let mut back = MaskImage::default();
        decode_mask(&l3, Path::new("m8.l3"), &mut back).unwrap();
        assert_eq!(
            back.values,
            m8.pixels().map(|p| u16::from(p.0[0])).collect::<Vec<_>>()
        );
        assert_eq!(
            std::fs::read(output.join("m16.png")).unwrap(),
            std::fs::read(input.join("m16.png")).unwrap()
        );
        // A re-run keeps both; a colour file is refused, named.
        let s = convert_masks(&input, &output, Target::L3_DEFAULT, &opts, &|_, _| {}).unwrap();
        assert_eq!((s.converted, s.skipped), (0, 2));
        image::RgbImage::new(2, 2)
            .save(input.join("rgb.png"))
            .unwrap();
        let e = convert_masks(
            &input,
            &dir.path().join("o2"),
            Target::L3_DEFAULT,
            &opts,
            &|_, _| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rgb.png"), "{e}");
    }
}
