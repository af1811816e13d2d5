//! A Progressive Compressed Records dataset read at a chosen scan group.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::{Format, Image};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Every image of a PCR dataset at scan group `k`: the image's header and scans 1..k are read (each piece
/// checked against the index's CRC), its JPEG stream rebuilt and decoded with libjpeg-turbo (which smooths
/// the missing AC data of low groups, as the paper's pipeline does).
///
/// Items are visited one by one so the loader can shuffle across records; reading a whole record prefix
/// in one go (the paper's sequential access) is `pcr::Dataset::read_record`.
pub struct PcrRecords {
    inner: pcr::Dataset,
    group: usize,
    /// (record, image within record) per item.
    items: Vec<(usize, usize)>,
    labels: Vec<u32>,
    classes: Vec<String>,
    files: Vec<std::fs::File>,
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
        let files = index
            .records
            .iter()
            .map(|rec| {
                let p = dir.join(&rec.file);
                std::fs::File::open(&p).map_err(|e| Error::io(p, e))
            })
            .collect::<Result<Vec<_>>>()?;
        let bytes = inner
            .prefix_bytes(group)
            .map_err(|e| Error::dataset(dir, e))?;
        Ok(PcrRecords {
            inner,
            group,
            items,
            labels,
            classes: if numeric { Vec::new() } else { classes },
            files,
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
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        let (r, j) = self.items[index];
        let img = &self.inner.index().records[r].images[j];
        let k = self.group.min(img.scans.len());
        let pieces = std::iter::once(&img.header).chain(&img.scans[..k]);
        let len: usize = pieces.clone().map(|p| p.len as usize).sum::<usize>() + 2;
        let mut out = vec![0u8; len];
        let mut at = 0;
        for p in pieces {
            let dst = &mut out[at..at + p.len as usize];
            self.files[r]
                .read_exact_at(dst, p.offset)
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
        Ok(out)
    }
    fn decode(&self, index: usize, bytes: &[u8], out: &mut Image) -> Result<()> {
        let img = pcr::Decoder::Libjpeg
            .decode(bytes)
            .map_err(|e| Error::decode(self.source(index), "pcr", e))?;
        out.width = img.width;
        out.height = img.height;
        out.channels = 3;
        out.pixels = img.pixels;
        Ok(())
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
