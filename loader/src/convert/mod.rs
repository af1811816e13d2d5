//! Writing datasets: a folder of images converted to another per-file format (L3, raw, PNG, JPEG), PCR
//! records ([`to_pcr`]), a Liquid multi-format dataset at its profiled ratio ([`to_liquid`]) and
//! WebDataset tar shards with an index of member offsets ([`to_shards`]).
//!
//! Every writer locks its output folder (a second writer is refused at once), writes each file under a
//! temporary name then renames it (a crash leaves no partial file under a final name), clears the
//! temporaries a killed run left, and re-running resumes: an output that is already there and valid is
//! kept, anything else is written again.

mod jpeg_rows;
mod liquid;
mod masks;
mod pcr;
mod shards;

pub use jpeg_rows::JpegRows;
pub use liquid::{LiquidBuild, LiquidEvent, LiquidReport, decoders as liquid_decoders, to_liquid};
pub use masks::convert_masks;
pub use pcr::{PcrBuild, PcrSummary, to_pcr};
pub use shards::{ShardBuild, ShardSummary, to_shards};

use crate::dataset::image_files;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::image::{Image, ImportOptions, import};
use crate::raw;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a conversion produces, as `l3 convert --to` and Python's `convert(to=...)` ask for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// One output file per input file.
    Files(Target),
    /// PCR records; non-JPEG inputs are encoded as JPEG at this quality first (lossy), or refused.
    Pcr { lossy_quality: Option<u8> },
    /// A Liquid multi-format dataset at its profiled ratio.
    Liquid,
}

impl Conversion {
    /// The one place the surfaces' conversion words are checked: `to` (`l3`, `raw`, `png`, `jpeg`,
    /// `pcr`, `liquid`), `quality` (1 to 100, for `jpeg` and `pcr` only: anything else is lossless or
    /// has no quality) and an L3 format choice (`l3_format`; `chose_l3_format` says whether the caller
    /// named one, which only `to l3` takes). Errors name the option as both surfaces spell it.
    pub fn resolve(
        to: &str,
        quality: Option<u32>,
        l3_format: l3_format::Format,
        chose_l3_format: bool,
    ) -> std::result::Result<Conversion, vocab::Invalid> {
        use vocab::Invalid;
        let quality = match quality {
            None => None,
            Some(q @ 1..=100) => Some(q as u8),
            Some(q) => return Err(Invalid::new("quality", q, "1 to 100")),
        };
        let conversion = match to {
            "l3" => Conversion::Files(Target::L3(l3_format)),
            "raw" => Conversion::Files(Target::Raw),
            "png" => Conversion::Files(Target::Png),
            "jpeg" | "jpg" => Conversion::Files(Target::Jpeg(quality.unwrap_or(90))),
            "pcr" => Conversion::Pcr {
                lossy_quality: quality,
            },
            "liquid" => Conversion::Liquid,
            _ => {
                return Err(Invalid::new("to", to, "l3, raw, png, jpeg, pcr or liquid"));
            }
        };
        let lossy = matches!(
            conversion,
            Conversion::Files(Target::Jpeg(_)) | Conversion::Pcr { .. }
        );
        if let (Some(q), false) = (quality, lossy) {
            return Err(Invalid::new(
                "quality",
                q,
                format!("no quality with to {to} (it applies to jpeg and pcr)"),
            ));
        }
        if chose_l3_format && to != "l3" {
            return Err(Invalid::new(
                "to",
                to,
                "l3 when format or profile is given (they choose the L3 format of --to l3)",
            ));
        }
        Ok(conversion)
    }
}

/// A per-file output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// L3 in this format ([`Target::L3_DEFAULT`]: `l3_format::DEFAULT_FORMAT`).
    L3(l3_format::Format),
    /// Binary PPM (RGB), PGM (gray) or PAM (with alpha).
    Raw,
    Png,
    /// Baseline JPEG at this quality (1 to 100); alpha is dropped. Lossy.
    Jpeg(u8),
}

impl Target {
    /// L3 in the format `l3-format` recommends (version 2, profile ANS: checksummed, so corruption is an
    /// error wherever the file is read).
    pub const L3_DEFAULT: Target = Target::L3(l3_format::DEFAULT_FORMAT);

    fn extension(self, channels: u8) -> &'static str {
        match self {
            Target::L3(_) => "l3",
            Target::Raw => match channels {
                1 => "pgm",
                3 => "ppm",
                _ => "pam",
            },
            Target::Png => "png",
            Target::Jpeg(_) => "jpg",
        }
    }

    /// The loader format of this target's files.
    pub fn format(self) -> Format {
        match self {
            Target::L3(_) => Format::L3,
            Target::Raw => Format::Raw,
            Target::Png => Format::Png,
            Target::Jpeg(_) => Format::Jpeg,
        }
    }
}

/// What a folder conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertSummary {
    /// Files converted by this run.
    pub converted: usize,
    /// Files whose valid output already existed (finished by an earlier run).
    pub skipped: usize,
    /// Stored bytes of the outputs written by this run.
    pub bytes_written: u64,
    /// Temporaries of killed earlier runs removed.
    pub stale_removed: usize,
    /// Inputs left out (special files, symlink loops), one line each.
    pub warnings: Vec<String>,
    /// 16-bit masks kept as PNG by a mask conversion to another format (which holds 8 bits).
    pub kept_png: usize,
}

/// How a folder is converted.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// Threads (0 = every core).
    pub threads: usize,
    /// Accept 16-bit or float inputs by reducing them to 8 bits (lossy).
    pub to_8bit: bool,
}

/// The header of a [`Target::Raw`] file (P5, P6 or P7 by channel count), for writers that stream its
/// pixels after it row by row.
pub fn raw_header(width: u32, height: u32, channels: u8) -> Vec<u8> {
    crate::raw::header(width, height, channels)
}

/// Encodes `img` into the bytes of a `target` file.
pub fn encode(img: &Image, target: Target) -> std::result::Result<Vec<u8>, String> {
    let (w, h, c) = (img.width, img.height, img.channels);
    match target {
        Target::L3(format) => {
            // One thread per file: folder conversions already run one file per worker.
            let opts = l3_format::EncodeOptions {
                format,
                ..l3_format::EncodeOptions::default()
            };
            l3_format::encode_with(&img.pixels, w, h, c, &opts).map_err(|e| e.to_string())
        }
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

/// Whether `path` holds a complete, valid file of `format` (what a re-run may keep): an L3 file that
/// parses, a raw file with all its pixels, a PNG with its end chunk, a JPEG with its end marker.
pub(crate) fn is_complete(path: &Path, format: Format) -> bool {
    let Ok(bytes) = stdx::fs::read_regular(path, crate::image::max_image_bytes()) else {
        return false;
    };
    match format {
        Format::L3 => l3_format::L3File::parse(&bytes).is_ok(),
        Format::Raw => raw::parse(&bytes).is_ok(),
        Format::Png => {
            bytes.len() >= 12
                && &bytes[bytes.len() - 8..bytes.len() - 4] == b"IEND"
                && image::codecs::png::PngDecoder::new(std::io::Cursor::new(&bytes)).is_ok()
        }
        Format::Jpeg | Format::Pcr => crate::image::check_jpeg_end(&bytes).is_ok(),
        // Not conversion targets: whether one decodes is what completeness means.
        Format::Webp | Format::Tiff | Format::Bmp | Format::Gif => {
            let mut img = crate::Image::default();
            crate::image::decode(format, &bytes, path, &mut img).is_ok()
        }
    }
}

/// [`is_complete`] for a conversion's target: an L3 output is kept only in the format asked for, so
/// re-running a conversion with another `--format` rewrites the files instead of mixing versions.
fn is_complete_target(path: &Path, target: Target) -> bool {
    match target {
        Target::L3(format) => stdx::fs::read_regular(path, crate::image::max_image_bytes())
            .is_ok_and(|b| l3_format::L3File::parse(&b).is_ok_and(|f| f.format() == format)),
        _ => is_complete(path, target.format()),
    }
}

/// Locks `output` for this process, refuses it if it holds images of another format than `target`'s
/// (two conversions into one folder would double the dataset), and clears the temporaries of killed
/// earlier runs in it and its sub-folders.
fn prepare_output(
    output: &Path,
    target: Format,
    also: Option<Format>,
) -> Result<(stdx::fs::DirLock, usize)> {
    let lock = stdx::fs::DirLock::acquire(output).map_err(|e| Error::io(output, e))?;
    let existing = image_files(output)?;
    let others: BTreeSet<Format> = existing
        .files
        .iter()
        .map(|(_, f)| *f)
        .filter(|f| *f != target && Some(*f) != also)
        .collect();
    if let Some(f) = others.first() {
        return Err(Error::dataset(
            output,
            format!(
                "already holds {f} files from another conversion; convert to {target} into an empty \
                 folder (a folder holds one format per image)"
            ),
        ));
    }
    // Every folder the conversion writes into, including those holding nothing but a killed run's
    // temporary (hidden, so no listing of images shows them). Symlinks are not followed: outputs are
    // written into real folders.
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut pending = vec![output.to_path_buf()];
    while let Some(d) = pending.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(e.path());
                }
            }
        }
        dirs.insert(d);
    }
    let mut removed = 0;
    for d in dirs {
        removed += stdx::fs::remove_stale_temps(&d).map_err(|e| Error::io(&d, e))?;
    }
    Ok((lock, removed))
}

/// Converts every image under `input` (recursively, keeping sub-folders so folder labels survive) into
/// `output`, one file each. `progress(done, total)` is called after every file. Valid outputs already
/// there are kept. The first failure stops the run and names its input file.
pub fn convert_folder(
    input: &Path,
    output: &Path,
    target: Target,
    options: &ConvertOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<ConvertSummary> {
    let listed = image_files(input)?;
    let files = listed.files;
    if files.is_empty() {
        return Err(Error::dataset(
            input,
            "no images (PNG, JPEG, PPM/PGM/PAM, L3, WebP, TIFF, BMP or GIF) found",
        ));
    }
    unique_stems(input, &files)?;
    if same_folder(input, output) {
        return Err(Error::dataset(
            output,
            "the output folder is the input folder: convert into another folder",
        ));
    }
    let (_lock, stale_removed) = prepare_output(output, target.format(), None)?;
    let done = AtomicUsize::new(0);
    let summary = Mutex::new(ConvertSummary {
        stale_removed,
        warnings: listed.skipped,
        ..Default::default()
    });
    let import_opts = ImportOptions {
        to_8bit: options.to_8bit,
        ..Default::default()
    };
    let total = files.len();
    stdx::parallel::for_each(&files, options.threads, |(rel, _)| {
        let dst = output.join(rel);
        let kept = target_paths(&dst, target)
            .into_iter()
            .any(|p| is_complete_target(&p, target));
        let written = if kept {
            None
        } else {
            Some(convert_one(&input.join(rel), &dst, target, &import_opts)?)
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
        }
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
        Ok::<(), Error>(())
    })?;
    Ok(summary.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// Output stems must be unique: `a.png` and `a.jpg` in one folder would both become `a.l3`.
fn unique_stems(input: &Path, files: &[(PathBuf, Format)]) -> Result<()> {
    let mut seen: HashMap<PathBuf, &Path> = HashMap::new();
    for (rel, _) in files {
        if let Some(other) = seen.insert(rel.with_extension(""), rel) {
            return Err(Error::dataset(
                input.join(rel),
                format!(
                    "same output name as {} (two files with one stem in a folder)",
                    other.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Every name an output of `target` for `dst` may have (raw's extension depends on the channels).
fn target_paths(dst: &Path, target: Target) -> Vec<PathBuf> {
    match target {
        Target::Raw => ["ppm", "pgm", "pam"]
            .iter()
            .map(|e| dst.with_extension(e))
            .collect(),
        t => vec![dst.with_extension(t.extension(3))],
    }
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Converts one file; `dst`'s extension is replaced by the target's. Returns the bytes written.
pub fn convert_one(src: &Path, dst: &Path, target: Target, options: &ImportOptions) -> Result<u64> {
    let img = import(src, options)?;
    let bytes = encode(&img, target)
        .map_err(|e| Error::decode(src, "image", format!("cannot encode: {e}")))?;
    let dst = dst.with_extension(target.extension(img.channels));
    stdx::fs::write_atomic(&dst, &bytes).map_err(|e| Error::io(&dst, e))?;
    Ok(bytes.len() as u64)
}
