//! Converting JPEG files into a PCR dataset: transcode each to progressive on the worker pool, regroup the
//! scans of every `images_per_record` images into one record, write the index last.
//!
//! One build per folder: the output folder is locked ([`stdx::fs::DirLock`]) for the whole build, so a
//! second build into it fails at once instead of deleting the first one's records.
//!
//! Crash safety: the old index is removed first (and the removal synced), every record and the index are
//! written durably ([`stdx::fs::AtomicFile`]: temporary name, fsync, rename), the index last. Readers only
//! accept a folder with `index.cbor`, and only record files whose header matches it, so an interrupted build
//! leaves nothing a reader takes for a dataset; the next build removes the temporaries a killed one left.
//! A build that fails removes the records it wrote, and the output folder if it created it.
//!
//! Builds are reproducible: the dataset id is a hash of what goes in (names, metadata, file lengths,
//! options), so the same inputs give byte-identical records and index, and re-running an interrupted build
//! gives exactly what an uninterrupted one would have.

use crate::error::{Error, Result};
use crate::format::{self, ImageEntry, ImageHeader, Index, Piece, RecordEntry, RecordHeader};
use crate::item::{BoundingBox, Item};
use crate::libjpeg;
use crate::markers::{self, ProbeError, ScanSplit};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use stdx::fs::{AtomicFile, DirLock};

/// Input files larger than this are refused before being read.
const MAX_INPUT_BYTES: u64 = 1 << 30;

/// One JPEG file to convert, with what to store beside it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Input {
    pub path: PathBuf,
    /// The image's name in the dataset, unique within it: a relative path of plain `/`-separated
    /// components. [`Input::new`] uses the file name; [`find_inputs`] the path relative to the folder the
    /// file was found under (`a/x.jpg`), so that `a/x.jpg` and `b/x.jpg` stay apart.
    pub name: String,
    pub label: Option<String>,
    pub boxes: Vec<BoundingBox>,
    pub attrs: BTreeMap<String, String>,
}

impl Input {
    /// A file given directly, named by its file name (`photos/Dune.jpg` → `Dune.jpg`).
    pub fn new(path: impl Into<PathBuf>) -> Input {
        let path = path.into();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_string_lossy().into_owned());
        Input {
            path,
            name,
            ..Input::default()
        }
    }
}

fn is_jpeg_name(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
}

/// Inputs for `paths`: a file is taken as given ([`Input::new`]); a folder is searched recursively
/// ([`stdx::fs::walk`]: symlink loops and special files cannot trap it) for `.jpg`/`.jpeg` files, each named
/// by its path relative to that folder (`a/x.jpg`), sorted. A folder without JPEG files, or a JPEG name that
/// is not a regular file (a FIFO, a dangling link), is an error naming it.
pub fn find_inputs<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<Input>> {
    let mut out = Vec::new();
    for p in paths {
        let p = p.as_ref();
        if !std::fs::metadata(p).is_ok_and(|m| m.is_dir()) {
            out.push(Input::new(p));
            continue;
        }
        let listing = stdx::fs::walk(p).map_err(|e| Error::ListInputs(e.to_string()))?;
        if let Some((rel, why)) = listing
            .skipped
            .iter()
            .find(|(rel, why)| is_jpeg_name(rel) && !matches!(why, stdx::fs::Skipped::Revisit))
        {
            return Err(Error::io(
                p.join(rel),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
            ));
        }
        let before = out.len();
        for rel in listing.files.iter().filter(|r| is_jpeg_name(r)) {
            let name: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(Input {
                path: p.join(rel),
                name: name.join("/"),
                ..Input::default()
            });
        }
        if out.len() == before {
            return Err(Error::ListInputs(format!(
                "{}: no .jpg/.jpeg files in this folder",
                p.display()
            )));
        }
    }
    Ok(out)
}

/// Build settings.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Images per record (the paper uses 1024).
    pub images_per_record: usize,
    /// Conversion threads ([`stdx::parallel`]); 0 = every core.
    pub threads: usize,
    /// Convert inputs whose compressed data is damaged (cut short, bad Huffman codes) anyway, with the
    /// zeros libjpeg substitutes, listing libjpeg's warnings in [`BuildSummary::warnings`]. Off by default:
    /// such an input is an [`Error::CorruptJpeg`] naming the file.
    pub allow_corrupt: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            images_per_record: 1024,
            threads: 0,
            allow_corrupt: false,
        }
    }
}

/// What a build did.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSummary {
    pub records: usize,
    pub images: usize,
    /// Bytes of the input JPEG files.
    pub input_bytes: u64,
    /// Bytes of all record files (the index not included).
    pub record_bytes: u64,
    /// libjpeg warnings about inputs that were converted: harmless remarks (an unknown JFIF revision),
    /// and, with [`BuildOptions::allow_corrupt`], corrupt data.
    pub warnings: Vec<(PathBuf, String)>,
}

/// The name of record `i` inside a dataset directory.
pub fn record_file_name(i: usize) -> String {
    format!("record-{i:05}.pcr")
}

/// A transcoded image ready to be placed in a record.
struct Converted {
    item: Item,
    jpeg: Vec<u8>,
    split: ScanSplit,
    input_len: u64,
    warnings: Vec<String>,
}

/// Checks names and refuses duplicates before anything is written; returns each input's length.
fn check_inputs(inputs: &[Input]) -> Result<Vec<u64>> {
    let mut by_name: HashMap<&str, &Path> = HashMap::new();
    let mut by_file: HashMap<(u64, u64), &Path> = HashMap::new();
    let mut lens = Vec::with_capacity(inputs.len());
    for input in inputs {
        format::check_name(&input.name)
            .map_err(|e| Error::Options(format!("{}: {e}", input.path.display())))?;
        let meta = std::fs::metadata(&input.path).map_err(|e| Error::io(&input.path, e))?;
        if let Some(first) = by_file.insert((meta.dev(), meta.ino()), &input.path) {
            return Err(Error::DuplicateInput {
                first: first.to_path_buf(),
                second: input.path.clone(),
                reason: "the same file given twice".into(),
            });
        }
        if let Some(first) = by_name.insert(&input.name, &input.path) {
            return Err(Error::DuplicateInput {
                first: first.to_path_buf(),
                second: input.path.clone(),
                reason: format!(
                    "both would be named {:?} in the dataset (give their common folder as the input to \
                     name them by their paths in it)",
                    input.name
                ),
            });
        }
        lens.push(meta.len());
    }
    Ok(lens)
}

/// The dataset id: FNV-1a over everything that goes in but the pixels, so the same inputs give the same
/// bytes. Records of builds with other inputs still cannot be mixed unnoticed: every piece a reader uses is
/// checked against the index's CRC-32.
fn dataset_id(inputs: &[Input], lens: &[u64], options: &BuildOptions) -> u64 {
    let described: Vec<_> = inputs
        .iter()
        .zip(lens)
        .map(|(i, len)| (&i.name, &i.label, &i.boxes, &i.attrs, len))
        .collect();
    let bytes = format::to_cbor(&(format::VERSION, options.images_per_record, described));
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    stdx::SplitMix64::new(h).next_u64()
}

/// Converts `inputs` into a dataset in `out_dir` (created if needed; a dataset already there is
/// replaced). `progress` is called once per converted image, from worker threads.
///
/// Fails at once if another build holds `out_dir`; fails before touching it if an input is missing, two
/// inputs are the same file, or two would get the same name.
pub fn build(
    out_dir: &Path,
    inputs: &[Input],
    options: &BuildOptions,
    progress: &(dyn Fn(&Path) + Sync),
) -> Result<BuildSummary> {
    if inputs.is_empty() {
        return Err(Error::Options("no input images".into()));
    }
    if options.images_per_record == 0 || options.images_per_record > u32::MAX as usize {
        return Err(Error::Options(format!(
            "images per record must be in 1..={}, not {}",
            u32::MAX,
            options.images_per_record
        )));
    }
    let lens = check_inputs(inputs)?;
    let dataset_id = dataset_id(inputs, &lens, options);
    let created = !out_dir.try_exists().map_err(|e| Error::io(out_dir, e))?;
    let lock = DirLock::acquire(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let mut written = Vec::new();
    let result = write_dataset(out_dir, inputs, options, progress, dataset_id, &mut written);
    if result.is_err() {
        for path in &written {
            let _ = std::fs::remove_file(path);
        }
        if created {
            let _ = std::fs::remove_file(lock.path());
            let _ = std::fs::remove_dir(out_dir);
        }
    }
    drop(lock);
    result
}

/// The build itself, in the locked folder; `written` collects the records it put in place.
fn write_dataset(
    out_dir: &Path,
    inputs: &[Input],
    options: &BuildOptions,
    progress: &(dyn Fn(&Path) + Sync),
    dataset_id: u64,
    written: &mut Vec<PathBuf>,
) -> Result<BuildSummary> {
    stdx::fs::remove_stale_temps(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let index_path = out_dir.join(format::INDEX_FILE);
    match std::fs::remove_file(&index_path) {
        Ok(()) => std::fs::File::open(out_dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(out_dir, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&index_path, e)),
    }
    let mut summary = BuildSummary {
        records: 0,
        images: 0,
        input_bytes: 0,
        record_bytes: 0,
        warnings: Vec::new(),
    };
    let mut records = Vec::new();
    for (r, chunk) in inputs.chunks(options.images_per_record).enumerate() {
        let converted = stdx::parallel::map(chunk, options.threads, |_, input| {
            let c = convert(input, options.allow_corrupt);
            progress(&input.path);
            c
        })?;
        for (c, input) in converted.iter().zip(chunk) {
            summary.input_bytes += c.input_len;
            summary
                .warnings
                .extend(c.warnings.iter().map(|w| (input.path.clone(), w.clone())));
        }
        let entry = write_record(out_dir, r, dataset_id, &converted, written)?;
        summary.record_bytes += entry.file_len;
        summary.images += converted.len();
        records.push(entry);
    }
    summary.records = records.len();
    let groups = records
        .iter()
        .map(|r| r.group_ends.len())
        .max()
        .unwrap_or(0) as u32;
    let index = Index {
        version: format::VERSION,
        dataset_id,
        groups,
        images_per_record: options.images_per_record as u32,
        records,
    };
    write_file(&index_path, &[&format::index_bytes(&index)])?;
    remove_stale(out_dir, index.records.len());
    Ok(summary)
}

/// Reads, checks and transcodes one input.
fn convert(input: &Input, allow_corrupt: bool) -> Result<Converted> {
    let path = &input.path;
    let bytes = stdx::fs::read_regular(path, MAX_INPUT_BYTES).map_err(|e| Error::io(path, e))?;
    let frame = markers::probe(&bytes).map_err(|e| match e {
        ProbeError::NotJpeg(reason) => Error::NotJpeg {
            path: path.clone(),
            reason,
        },
        ProbeError::Unsupported(reason) => Error::UnsupportedJpeg {
            path: path.clone(),
            reason,
        },
    })?;
    let fail = |message: String| Error::Transcode {
        path: path.clone(),
        message,
    };
    let t = libjpeg::transcode_progressive(&bytes).map_err(|e| fail(e.to_string()))?;
    if !allow_corrupt {
        let corrupt: Vec<&str> = t
            .warnings
            .iter()
            .filter(|w| w.is_corrupt_data())
            .map(|w| w.text.trim_start_matches("Corrupt JPEG data: "))
            .collect();
        if !corrupt.is_empty() {
            return Err(Error::CorruptJpeg {
                path: path.clone(),
                reason: corrupt.join("; "),
            });
        }
    }
    let split =
        markers::split_scans(&t.jpeg).map_err(|e| fail(format!("output does not parse: {e}")))?;
    if split.scans.len() != t.script_scans {
        return Err(fail(format!(
            "the script has {} scans, the output {}",
            t.script_scans,
            split.scans.len()
        )));
    }
    markers::check_header_piece(&t.jpeg[split.header.clone()])
        .map_err(|e| fail(format!("output header: {e}")))?;
    for (i, s) in split.scans.iter().enumerate() {
        markers::check_scan_piece(&t.jpeg[s.clone()])
            .map_err(|e| fail(format!("output scan {}: {e}", i + 1)))?;
    }
    Ok(Converted {
        item: Item {
            name: input.name.clone(),
            label: input.label.clone(),
            boxes: input.boxes.clone(),
            attrs: input.attrs.clone(),
            orientation: frame.orientation,
            width: frame.width,
            height: frame.height,
            components: frame.components,
        },
        jpeg: t.jpeg,
        split,
        input_len: bytes.len() as u64,
        warnings: t.warnings.into_iter().map(|w| w.text).collect(),
    })
}

/// Writes one record (temporary name, sync, rename) and returns its index entry.
fn write_record(
    out_dir: &Path,
    r: usize,
    dataset_id: u64,
    images: &[Converted],
    written: &mut Vec<PathBuf>,
) -> Result<RecordEntry> {
    let too_big = |what: &str| Error::Options(format!("record {r}: {what} exceeds 4 GiB"));
    let mut headers = Vec::with_capacity(images.len());
    for c in images {
        let header_len =
            u32::try_from(c.split.header.len()).map_err(|_| too_big("a JPEG header"))?;
        let scan_lens = c
            .split
            .scans
            .iter()
            .map(|s| u32::try_from(s.len()).map_err(|_| too_big("a scan")))
            .collect::<Result<Vec<u32>>>()?;
        headers.push(ImageHeader {
            item: c.item.clone(),
            header_len,
            scan_lens,
        });
    }
    let header = RecordHeader {
        version: format::VERSION,
        dataset_id,
        record: r as u32,
        images: headers,
    };
    let header_bytes = format::to_cbor(&header);
    let header_len = u32::try_from(header_bytes.len())
        .ok()
        .filter(|&l| l <= format::MAX_HEADER_LEN)
        .ok_or_else(|| too_big("the metadata header"))?;
    let layout = header.layout(header_len);

    let file = record_file_name(r);
    let path = out_dir.join(&file);
    // Every slice of the file in write order; offsets follow from their lengths.
    let preamble = format::preamble(&header_bytes);
    let mut parts: Vec<&[u8]> = vec![&preamble, &header_bytes];
    let mut at = format::PREAMBLE_LEN + u64::from(header_len);
    let mut piece = |bytes: &'_ [u8]| {
        let p = Piece {
            offset: at,
            len: bytes.len() as u32,
            crc: crc32fast::hash(bytes),
        };
        at += bytes.len() as u64;
        p
    };
    let mut entries = Vec::with_capacity(images.len());
    for c in images {
        let bytes = &c.jpeg[c.split.header.clone()];
        entries.push(ImageEntry {
            name: c.item.name.clone(),
            label: c.item.label.clone(),
            header: piece(bytes),
            scans: Vec::with_capacity(c.split.scans.len()),
        });
        parts.push(bytes);
    }
    for g in 0..layout.group_ends.len() {
        for (i, c) in images.iter().enumerate() {
            if let Some(s) = c.split.scans.get(g) {
                let bytes = &c.jpeg[s.clone()];
                entries[i].scans.push(piece(bytes));
                parts.push(bytes);
            }
        }
    }
    let entry = RecordEntry {
        file,
        file_len: at,
        header_len,
        header_crc: crc32fast::hash(&header_bytes),
        group_ends: layout.group_ends.clone(),
        images: entries,
    };
    // The pieces we laid out must sit where the shared layout function says.
    if let Err(e) = entry.check_self(entry.group_ends.len() as u32) {
        return Err(Error::Options(format!("internal layout error: {e}")));
    }
    write_file(&path, &parts)?;
    written.push(path);
    Ok(entry)
}

/// Writes `parts` to `path` durably ([`AtomicFile`]): the file appears whole or not at all.
fn write_file(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut w = BufWriter::new(AtomicFile::create(path)?);
        for p in parts {
            w.write_all(p)?;
        }
        w.into_inner().map_err(|e| e.into_error())?.commit()
    };
    write().map_err(|e| Error::io(path, e))
}

/// Removes record files of an earlier, larger build, and the temporaries (`.record-NNNNN.pcr.tmp`) of
/// builds by earlier versions of this crate.
fn remove_stale(out_dir: &Path, records: usize) {
    let Ok(dir) = std::fs::read_dir(out_dir) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let stale_record = name
            .strip_prefix("record-")
            .and_then(|s| s.strip_suffix(".pcr"))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n >= records);
        let stale_tmp = name.starts_with(".record-") && name.ends_with(".pcr.tmp");
        if stale_record || stale_tmp {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
