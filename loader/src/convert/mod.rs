//! Converting a folder of images to another per-file format (L3, raw, PNG, JPEG) on every core.
//!
//! Each output is written under a temporary name and renamed into place, so an interrupted run leaves no
//! half-written file under a final name, and re-running converts only what is missing.

use crate::error::{Error, Result};
use crate::folder::image_files;
use crate::image::{Image, decode_file};
use crate::raw;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A per-file output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    L3,
    /// Binary PPM (RGB), PGM (gray) or PAM (with alpha).
    Raw,
    Png,
    /// Baseline JPEG at this quality (1 to 100); alpha is dropped.
    Jpeg(u8),
}

impl Target {
    fn extension(self, channels: u8) -> &'static str {
        match self {
            Target::L3 => "l3",
            Target::Raw => match channels {
                1 => "pgm",
                3 => "ppm",
                _ => "pam",
            },
            Target::Png => "png",
            Target::Jpeg(_) => "jpg",
        }
    }
    /// Every extension an output of this target may carry (raw's depends on the channel count).
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Target::Raw => &["ppm", "pgm", "pam"],
            Target::L3 => &["l3"],
            Target::Png => &["png"],
            Target::Jpeg(_) => &["jpg"],
        }
    }
}

/// What a folder conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Files converted by this run.
    pub converted: usize,
    /// Files whose output already existed (finished by an earlier run).
    pub skipped: usize,
    /// Stored bytes of the outputs written by this run.
    pub bytes_written: u64,
}

/// Encodes `img` into the bytes of a `target` file.
pub fn encode(img: &Image, target: Target) -> std::result::Result<Vec<u8>, String> {
    let (w, h, c) = (img.width, img.height, img.channels);
    match target {
        Target::L3 => l3_format::encode(&img.pixels, w, h, c, l3_format::default_patch_size(w, h))
            .map_err(|e| e.to_string()),
        Target::Raw => raw::encode(&img.pixels, w, h, c).map_err(|e| e.to_string()),
        Target::Png => {
            use image::ImageEncoder;
            let ct = colour_type(c)?;
            let mut out = Vec::new();
            image::codecs::png::PngEncoder::new(&mut out)
                .write_image(&img.pixels, w, h, ct)
                .map_err(|e| e.to_string())?;
            Ok(out)
        }
        Target::Jpeg(q) => {
            let owned;
            let img = if c == 1 || c == 3 {
                img
            } else {
                owned = img.to_rgb();
                &owned
            };
            let mut out = Vec::new();
            // jpeg-encoder (SIMD) is several times faster than `image`'s encoder; it addresses u16 sides.
            match (u16::try_from(w), u16::try_from(h)) {
                (Ok(w16), Ok(h16)) => {
                    let ct = if img.channels == 1 {
                        jpeg_encoder::ColorType::Luma
                    } else {
                        jpeg_encoder::ColorType::Rgb
                    };
                    jpeg_encoder::Encoder::new(&mut out, q.clamp(1, 100))
                        .encode(&img.pixels, w16, h16, ct)
                        .map_err(|e| e.to_string())?;
                }
                _ => image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, q.clamp(1, 100))
                    .encode(&img.pixels, w, h, colour_type(img.channels)?)
                    .map_err(|e| e.to_string())?,
            }
            Ok(out)
        }
    }
}

fn colour_type(c: u8) -> std::result::Result<image::ExtendedColorType, String> {
    use image::ExtendedColorType::*;
    Ok(match c {
        1 => L8,
        2 => La8,
        3 => Rgb8,
        4 => Rgba8,
        _ => return Err(format!("{c} channels")),
    })
}

/// Writes `bytes` to `dst` through a temporary name in the same folder, then renames it into place.
pub fn write_atomic(dst: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dst.with_file_name(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    std::fs::write(&tmp, bytes).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(&tmp, e)
    })?;
    std::fs::rename(&tmp, dst).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(dst, e)
    })
}

/// Converts every image under `input` (recursively, keeping sub-folders so folder labels survive) into
/// `output`, one file each, on `threads` threads. `progress(done, total)` is called after every file.
/// Outputs that already exist are skipped. The first failure stops the run and names its input file.
pub fn convert_folder(
    input: &Path,
    output: &Path,
    target: Target,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<ConvertSummary> {
    let files = image_files(input)?;
    if files.is_empty() {
        return Err(Error::dataset(
            input,
            "no images (PNG, JPEG, PPM/PGM/PAM or L3) found",
        ));
    }
    // Output stems must be unique: `a.png` and `a.jpg` in one folder would both become `a.l3`.
    let mut seen: HashMap<PathBuf, &Path> = HashMap::new();
    for (rel, _) in &files {
        let stem = rel.with_extension("");
        if let Some(other) = seen.insert(stem.clone(), rel) {
            return Err(Error::dataset(
                input.join(rel),
                format!(
                    "same output name as {} (two files with one stem in a folder)",
                    other.display()
                ),
            ));
        }
    }
    let existing = |rel: &Path| {
        target
            .extensions()
            .iter()
            .any(|e| output.join(rel).with_extension(e).exists())
    };
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let summary = Mutex::new(ConvertSummary::default());
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let total = files.len();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let rel = &files[i].0;
                    let result = if existing(rel) {
                        Ok(None)
                    } else {
                        convert_one(&input.join(rel), &output.join(rel), target).map(Some)
                    };
                    match result {
                        Ok(written) => {
                            let mut s = summary.lock().expect("summary lock");
                            match written {
                                Some(b) => {
                                    s.converted += 1;
                                    s.bytes_written += b;
                                }
                                None => s.skipped += 1,
                            }
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().expect("error lock").get_or_insert(e);
                            return;
                        }
                    }
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().expect("error lock") {
        return Err(e);
    }
    Ok(summary.into_inner().expect("summary lock"))
}

/// Converts one file; `dst`'s extension is replaced by the target's. Returns the bytes written.
pub fn convert_one(src: &Path, dst: &Path, target: Target) -> Result<u64> {
    let img = decode_file(src)?;
    let bytes = encode(&img, target)
        .map_err(|e| Error::decode(src, "image", format!("cannot encode: {e}")))?;
    let dst = dst.with_extension(target.extension(img.channels));
    write_atomic(&dst, &bytes)?;
    Ok(bytes.len() as u64)
}
