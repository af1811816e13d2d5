//! A Progressive Compressed Records dataset read at a chosen scan group.

use super::Dataset;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, write_pixels};
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Record files kept open at once: a dataset of thousands of records must not exhaust file descriptors.
const OPEN_RECORDS: usize = 32;

/// Every image of a PCR dataset at scan group `k`: the image's header and scans 1..k are read (each piece
/// checked against the index's CRC), its JPEG stream rebuilt and decoded with libjpeg-turbo (which smooths
/// the missing AC data of low groups, as the paper's pipeline does).
pub struct PcrRecords {
    inner: pcr::Dataset,
    group: usize,
    /// (record, image within record) per item.
    items: Vec<(usize, usize)>,
    labels: Vec<u32>,
    classes: Vec<String>,
    open: Mutex<VecDeque<(usize, Arc<std::fs::File>)>>,
    bytes: u64,
}

impl PcrRecords {
    /// Opens `dir` at scan group `group` (1-based; `None` = every group, full fidelity).
    pub fn open(dir: impl AsRef<Path>, group: Option<usize>) -> Result<Self> {
        let dir = dir.as_ref();
        let inner = pcr::Dataset::open(dir).map_err(|e| Error::dataset(dir, e))?;
        let groups = inner.groups();
        let group = group.unwrap_or(groups);
        if group == 0 || group > groups {
            return Err(Error::dataset(
                dir,
                format!("scan group {group} out of range 1..={groups}"),
            ));
        }
        let index = inner.index();
        let mut items = Vec::new();
        let mut raw_labels = Vec::new();
        for (r, rec) in index.records.iter().enumerate() {
            for (j, img) in rec.images.iter().enumerate() {
                items.push((r, j));
                raw_labels.push(img.label.clone().unwrap_or_default());
            }
        }
        // Integer labels stay as they are; names map to their rank among the sorted names.
        let numeric = raw_labels.iter().all(|l| l.parse::<u32>().is_ok());
        let mut classes: Vec<String> = raw_labels.clone();
        classes.sort();
        classes.dedup();
        let labels = raw_labels
            .iter()
            .map(|l| {
                if numeric {
                    l.parse().unwrap_or(0)
                } else {
                    classes.binary_search(l).unwrap_or(0) as u32
                }
            })
            .collect();
        let bytes = inner
            .prefix_bytes(group)
            .map_err(|e| Error::dataset(dir, e))?;
        Ok(PcrRecords {
            inner,
            group,
            items,
            labels,
            classes: if numeric { Vec::new() } else { classes },
            open: Mutex::new(VecDeque::new()),
            bytes,
        })
    }

    /// Whether `dir` holds a PCR dataset.
    pub fn is_dataset(dir: &Path) -> bool {
        dir.join(pcr::INDEX_FILE).is_file()
    }

    pub fn group(&self) -> usize {
        self.group
    }

    /// Scan groups the dataset has.
    pub fn groups(&self) -> usize {
        self.inner.groups()
    }

    /// Class names by label (empty when the labels are integers).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Record `r`'s file, from the few kept open (least recently used closed first).
    fn record_file(&self, r: usize, index: usize) -> Result<Arc<std::fs::File>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = open.iter().position(|(k, _)| *k == r) {
            let entry = open.remove(at).expect("found");
            let f = entry.1.clone();
            open.push_back(entry);
            return Ok(f);
        }
        let p = self.inner.dir().join(&self.inner.index().records[r].file);
        let f = Arc::new(stdx::fs::open_regular(&p).map_err(|e| Error::io(self.source(index), e))?);
        if open.len() >= OPEN_RECORDS {
            open.pop_front();
        }
        open.push_back((r, f.clone()));
        Ok(f)
    }
}

impl Dataset for PcrRecords {
    fn len(&self) -> usize {
        self.items.len()
    }
    fn label(&self, index: usize) -> u32 {
        self.labels[index]
    }
    fn format(&self, _index: usize) -> Format {
        Format::Pcr
    }
    fn source(&self, index: usize) -> PathBuf {
        let (r, j) = self.items[index];
        let rec = &self.inner.index().records[r];
        self.inner
            .dir()
            .join(format!("{}#{} ({})", rec.file, j, rec.images[j].name))
    }
    /// Bytes read per epoch at this group: every record's prefix up to the group.
    fn stored_bytes(&self) -> u64 {
        self.bytes
    }
    fn read(&self, index: usize, _req: &SampleRequest) -> Result<(Stored, u64)> {
        let (r, j) = self.items[index];
        let img = &self.inner.index().records[r].images[j];
        let k = self.group.min(img.scans.len());
        let pieces = std::iter::once(&img.header).chain(&img.scans[..k]);
        let len: usize = pieces.clone().map(|p| p.len as usize).sum::<usize>() + 2;
        let mut out = vec![0u8; len];
        let file = self.record_file(r, index)?;
        let mut at = 0;
        for p in pieces {
            let dst = &mut out[at..at + p.len as usize];
            file.read_exact_at(dst, p.offset)
                .map_err(|e| Error::io(self.source(index), e))?;
            if crc32fast::hash(dst) != p.crc {
                return Err(Error::decode(
                    self.source(index),
                    "pcr",
                    format!("checksum mismatch in the piece at byte {}", p.offset),
                ));
            }
            at += p.len as usize;
        }
        out[at..].copy_from_slice(&[0xFF, 0xD9]);
        Ok((Stored::Whole(out), (len - 2) as u64))
    }
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        _scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        let Stored::Whole(bytes) = stored else {
            return Err(Error::decode(
                self.source(index),
                "pcr",
                "not a JPEG stream",
            ));
        };
        let img = pcr::Decoder::Libjpeg
            .decode(bytes)
            .map_err(|e| Error::decode(self.source(index), "pcr", e))?;
        write_pixels(
            &img.pixels,
            (img.width, img.height, 3),
            &self.source(index),
            Format::Pcr,
            req,
            slot,
        )
    }
    fn describe(&self) -> String {
        format!(
            "PCR dataset {} ({} images, scan group {} of {})",
            self.inner.dir().display(),
            self.items.len(),
            self.group,
            self.inner.groups()
        )
    }
}
