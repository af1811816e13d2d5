//! Progressive Compressed Records (Kuchnik et al., "Progressive Compressed Records: Taking a Byte out of
//! Deep Learning Data", 2020): convert a JPEG dataset once into records from which training reads any
//! fidelity by reading a prefix, with no extra space.
//!
//! - [`build`] transcodes JPEGs losslessly to progressive JPEG (libjpeg-turbo, coefficient domain) and
//!   regroups their scans: record = metadata, then scan 1 of every image, scan 2 of every image, ...
//!   [`find_inputs`] turns files and folders into named [`Input`]s.
//! - [`Dataset::open`] / [`Dataset::read_record`] read record `i` at scan group `k` with one contiguous
//!   read, verify it, and rebuild and decode each image ([`RecordPrefix`]); [`Dataset::verify_prefix`]
//!   runs the same checks on bytes the caller fetched itself.
//! - [`mssim_luma`] measures the fidelity of a group against the full decode.
//!
//! - [`libjpeg`]: the toolkit's one libjpeg-turbo binding (the loader decodes JPEG through it too).
//!
//! The on-disk format is specified in `SPEC.md`; the only `unsafe` code is in the `libjpeg` module.
#![deny(unsafe_code)]

mod decode;
mod error;
mod format;
mod item;
mod labels;
#[allow(unsafe_code)]
pub mod libjpeg;
mod markers;
mod reader;
mod ssim;
mod writer;

pub use decode::{Decoder, Image};
pub use error::{Error, JpegError, Result};
pub use format::{INDEX_FILE, ImageEntry, Index, Piece, RecordEntry};
pub use item::{BoundingBox, Item};
pub use labels::{LabelRow, Labels};
pub use reader::{Dataset, RecordPrefix};
pub use ssim::mssim_luma;
pub use writer::{BuildOptions, BuildSummary, Input, build, find_inputs, record_file_name};

/// The README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Fuzzing entry point (not API): treats `data` as a record file, derives the index entry its own header
/// implies, and runs the full reader path on it, decoding every image with both decoders. Must never panic.
#[doc(hidden)]
pub fn fuzz_record(data: &[u8]) {
    let _ = Dataset::from_index_bytes("fuzz", data);
    let Ok((header, header_len, header_crc)) = format::parse_record_header(data) else {
        return;
    };
    let layout = header.layout(header_len);
    let crc_of = |r: &std::ops::Range<u64>| {
        data.get(r.start as usize..r.end as usize)
            .map_or(0, crc32fast::hash)
    };
    let piece = |r: &std::ops::Range<u64>| Piece {
        offset: r.start,
        len: (r.end - r.start) as u32,
        crc: crc_of(r),
    };
    let entry = RecordEntry {
        file: "fuzz.pcr".into(),
        file_len: layout.group_ends.last().copied().unwrap_or(0),
        header_len,
        header_crc,
        group_ends: layout.group_ends.clone(),
        images: header
            .images
            .iter()
            .enumerate()
            .map(|(j, img)| ImageEntry {
                name: img.item.name.clone(),
                label: img.item.label.clone(),
                header: piece(&layout.headers[j]),
                scans: layout.scans[j].iter().map(piece).collect(),
            })
            .collect(),
    };
    for k in 1..=entry.group_ends.len().min(16) {
        let end = entry.prefix_len(k) as usize;
        let Some(prefix) = data.get(..end) else {
            return;
        };
        let path = std::path::PathBuf::from("fuzz.pcr");
        let Ok(rec) = RecordPrefix::verify(
            path,
            prefix.to_vec(),
            &entry,
            header.dataset_id,
            header.record as usize,
            k,
        ) else {
            continue;
        };
        for j in 0..rec.len().min(4) {
            for d in Decoder::ALL {
                let _ = rec.decode(j, d);
            }
        }
    }
}
