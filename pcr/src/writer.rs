//! Converting JPEG files into a PCR dataset: transcode each to progressive on all cores, regroup the
//! scans of every `images_per_record` images into one record, write the index last.
//!
//! Crash safety: an existing index is removed first, every record and the index are written under a
//! temporary dot-name, synced, then renamed; readers only accept a directory with `index.cbor`, and only
//! record files whose header matches the index's dataset id. So an interrupted build leaves nothing a
//! reader would take for a dataset.

use crate::error::{Error, Result};
use crate::format::{self, ImageEntry, ImageHeader, Index, Piece, RecordEntry, RecordHeader};
use crate::item::{BoundingBox, Item};
use crate::libjpeg;
use crate::markers::{self, ProbeError, ScanSplit};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One JPEG file to convert, with what to store beside it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Input {
    pub path: PathBuf,
    pub label: Option<String>,
    pub boxes: Vec<BoundingBox>,
    pub attrs: BTreeMap<String, String>,
}

impl Input {
    pub fn new(path: impl Into<PathBuf>) -> Input {
        Input {
            path: path.into(),
            ..Input::default()
        }
    }
}

/// Build settings.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Images per record (the paper uses 1024).
    pub images_per_record: usize,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            images_per_record: 1024,
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
    /// libjpeg warnings about inputs (e.g. extraneous bytes); the images were still converted losslessly.
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

/// Converts `inputs` into a dataset in `out_dir` (created if needed; a dataset already there is
/// replaced). `progress` is called once per converted image, from worker threads.
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
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let index_path = out_dir.join(format::INDEX_FILE);
    match std::fs::remove_file(&index_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&index_path, e)),
    }
    let dataset_id = fresh_id();
    let mut summary = BuildSummary {
        records: 0,
        images: 0,
        input_bytes: 0,
        record_bytes: 0,
        warnings: Vec::new(),
    };
    let mut records = Vec::new();
    for (r, chunk) in inputs.chunks(options.images_per_record).enumerate() {
        let converted: Vec<Converted> = chunk
            .par_iter()
            .map(|input| {
                let c = convert(input);
                progress(&input.path);
                c
            })
            .collect::<Result<_>>()?;
        for (c, input) in converted.iter().zip(chunk) {
            summary.input_bytes += c.input_len;
            summary
                .warnings
                .extend(c.warnings.iter().map(|w| (input.path.clone(), w.clone())));
        }
        let entry = write_record(out_dir, r, dataset_id, &converted)?;
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
    write_atomically(&index_path, &[&format::index_bytes(&index)])?;
    remove_stale(out_dir, index.records.len());
    Ok(summary)
}

/// Reads, checks and transcodes one input.
fn convert(input: &Input) -> Result<Converted> {
    let path = &input.path;
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
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
    let t = libjpeg::transcode_progressive(&bytes).map_err(fail)?;
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
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    Ok(Converted {
        item: Item {
            name,
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
        warnings: t.warnings,
    })
}

/// Writes one record (temporary name, sync, rename) and returns its index entry.
fn write_record(
    out_dir: &Path,
    r: usize,
    dataset_id: u64,
    images: &[Converted],
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
    write_atomically(&path, &parts)?;
    Ok(entry)
}

/// Writes `parts` to `.NAME.tmp` beside `path`, syncs, renames onto `path`.
fn write_atomically(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let result = (|| {
        let mut w = BufWriter::new(File::create(&tmp)?);
        for p in parts {
            w.write_all(p)?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Removes record files of an earlier, larger build and temporary files of interrupted ones.
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

/// A dataset id that differs between builds, so records of two builds cannot be mixed silently.
fn fresh_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
