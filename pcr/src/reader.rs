//! Reading a PCR dataset at a chosen scan group: one contiguous read of a record's prefix, every byte
//! of it checked against the index, then each image's JPEG stream rebuilt and decoded.
//!
//! A reader that fetches the bytes itself (another I/O scheduler, an object store with byte ranges) asks
//! [`Dataset::record_range`] what to fetch and hands the bytes to [`Dataset::verify_prefix`], which runs
//! every check [`Dataset::read_record`] does; the images then come from [`RecordPrefix::jpeg`] and their
//! labels and EXIF orientation from [`RecordPrefix::items`].

use crate::decode::{Decoder, Image};
use crate::error::{Error, Result};
use crate::format::{self, Index, RecordEntry};
use crate::item::Item;
use crate::markers;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Index files larger than this are refused before being read.
const MAX_INDEX_BYTES: u64 = 1 << 32;

/// An opened dataset: its directory and its checked index.
#[derive(Debug, Clone)]
pub struct Dataset {
    dir: PathBuf,
    index: Index,
}

impl Dataset {
    /// Opens `dir/index.cbor`, checking its magic, checksum and version, that every record entry is
    /// self-consistent, and that image names are safe relative paths, unique in the dataset.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dataset> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(format::INDEX_FILE);
        let bytes = stdx::fs::read_regular(&path, MAX_INDEX_BYTES).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::NotADataset { path: dir.clone() }
            } else {
                Error::io(&path, e)
            }
        })?;
        Self::from_index_bytes(dir, &bytes)
    }

    /// A dataset whose index bytes were fetched elsewhere (an object store); `dir` is where its record
    /// files are, or just the name errors give them. The checks are [`open`](Self::open)'s.
    pub fn from_index_bytes(dir: impl Into<PathBuf>, bytes: &[u8]) -> Result<Dataset> {
        let dir = dir.into();
        let index = format::parse_index(bytes).map_err(|reason| Error::CorruptIndex {
            path: dir.join(format::INDEX_FILE),
            reason,
        })?;
        Ok(Dataset { dir, index })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn records(&self) -> usize {
        self.index.records.len()
    }

    pub fn images(&self) -> usize {
        self.index.records.iter().map(|r| r.images.len()).sum()
    }

    /// Scan groups of the dataset (10 for colour JPEGs with the standard script).
    pub fn groups(&self) -> usize {
        self.index.groups as usize
    }

    /// Bytes of all record files.
    pub fn total_bytes(&self) -> u64 {
        self.index.records.iter().map(|r| r.file_len).sum()
    }

    /// Bytes a reader reads to see every record at group `k`.
    pub fn prefix_bytes(&self, k: usize) -> Result<u64> {
        self.check_group(k)?;
        Ok(self.index.records.iter().map(|r| r.prefix_len(k)).sum())
    }

    fn check_group(&self, k: usize) -> Result<()> {
        if k == 0 || k > self.groups() {
            return Err(Error::GroupOutOfRange {
                group: k,
                groups: self.groups(),
            });
        }
        Ok(())
    }

    /// The path of record `i`'s file.
    pub fn record_path(&self, i: usize) -> Result<PathBuf> {
        Ok(self.dir.join(&self.entry(i)?.file))
    }

    /// The bytes of record `i`'s file to read for scan group `k`: always `0..end of group k`.
    pub fn record_range(&self, i: usize, k: usize) -> Result<Range<u64>> {
        self.check_group(k)?;
        Ok(0..self.entry(i)?.prefix_len(k))
    }

    /// Reads only the metadata of record `i` (labels, boxes, sizes, orientation): one read of its CBOR
    /// header, checked (magic, header checksum, identity) like a full read.
    pub fn read_items(&self, i: usize) -> Result<Vec<Item>> {
        let entry = self.entry(i)?;
        let path = self.dir.join(&entry.file);
        let file = stdx::fs::open_regular(&path).map_err(|e| Error::io(&path, e))?;
        let mut bytes = vec![0u8; (format::PREAMBLE_LEN + u64::from(entry.header_len)) as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::TruncatedRecord {
                    path: path.clone(),
                    needed: bytes.len() as u64,
                    actual: file.metadata().map_or(0, |m| m.len()),
                },
                _ => Error::io(&path, e),
            })?;
        let corrupt = |reason: String| Error::CorruptRecord {
            path: path.clone(),
            reason,
        };
        let (header, len, crc) = format::parse_record_header(&bytes).map_err(corrupt)?;
        if len != entry.header_len
            || crc != entry.header_crc
            || header.dataset_id != self.index.dataset_id
            || header.record as usize != i
        {
            return Err(Error::IndexMismatch {
                path,
                reason: "the metadata header differs".into(),
            });
        }
        Ok(header.images.into_iter().map(|img| img.item).collect())
    }

    fn entry(&self, i: usize) -> Result<&RecordEntry> {
        self.index.records.get(i).ok_or(Error::RecordOutOfRange {
            record: i,
            records: self.records(),
        })
    }

    /// Reads record `i` at scan group `k` (1-based) with one `pread` of `[0, end of group k)`, and checks it
    /// as [`verify_prefix`](Self::verify_prefix) does.
    pub fn read_record(&self, i: usize, k: usize) -> Result<RecordPrefix> {
        let range = self.record_range(i, k)?;
        let path = self.record_path(i)?;
        let file = stdx::fs::open_regular(&path).map_err(|e| Error::io(&path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        // A file of the wrong length is refused before anything is allocated or read.
        if file_len != self.entry(i)?.file_len {
            return self.verify_prefix(i, k, file_len, Vec::new());
        }
        let mut bytes = vec![0u8; range.end as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|e| Error::io(&path, e))?;
        self.verify_prefix(i, k, file_len, bytes)
    }

    /// Checks bytes of record `i` fetched by the caller for scan group `k` — `bytes` must be exactly
    /// [`record_range(i, k)`](Self::record_range) of a file that is `file_len` bytes long — and returns
    /// them as a verified [`RecordPrefix`]. The checks are those of every read:
    ///
    /// 1. `file_len` equals the index's record length (shorter: [`Error::TruncatedRecord`]; longer:
    ///    [`Error::IndexMismatch`]), and `bytes` is the whole range;
    /// 2. the record magic, the header length and CRC-32, equal to the index's ([`Error::CorruptRecord`],
    ///    [`Error::IndexMismatch`]);
    /// 3. the dataset id, record number, image count, names and labels, and the piece layout the header
    ///    implies, against the index ([`Error::IndexMismatch`]);
    /// 4. every piece's CRC-32 and JPEG marker structure ([`Error::CorruptRecord`] naming the image and
    ///    the piece; [`verify_prefix_per_image`](Self::verify_prefix_per_image) fails only that image).
    pub fn verify_prefix(
        &self,
        i: usize,
        k: usize,
        file_len: u64,
        bytes: Vec<u8>,
    ) -> Result<RecordPrefix> {
        self.check_prefix(i, k, file_len, &bytes)?;
        let entry = self.entry(i)?;
        let path = self.dir.join(&entry.file);
        RecordPrefix::verify(path, bytes, entry, self.index.dataset_id, i, k)?.whole()
    }

    /// Check 1 of [`verify_prefix`](Self::verify_prefix): the file's length and the bytes' count.
    fn check_prefix(&self, i: usize, k: usize, file_len: u64, bytes: &[u8]) -> Result<()> {
        let range = self.record_range(i, k)?;
        let entry = self.entry(i)?;
        let path = self.dir.join(&entry.file);
        if file_len < entry.file_len {
            return Err(Error::TruncatedRecord {
                path,
                needed: entry.file_len,
                actual: file_len,
            });
        }
        if file_len != entry.file_len {
            return Err(Error::IndexMismatch {
                path,
                reason: format!(
                    "the file has {file_len} bytes, the index says {}",
                    entry.file_len
                ),
            });
        }
        if bytes.len() as u64 != range.end {
            return Err(Error::TruncatedRecord {
                path,
                needed: range.end,
                actual: bytes.len() as u64,
            });
        }
        Ok(())
    }

    /// [`verify_prefix`](Self::verify_prefix) for a reader that serves images one by one: the checks of
    /// the whole record (length, header, identity, layout) fail the call as there, but a piece that fails
    /// its checksum or JPEG structure fails only its image ([`RecordPrefix::damage`]), so one bad byte
    /// costs one image, not the record's every image.
    pub fn verify_prefix_per_image(
        &self,
        i: usize,
        k: usize,
        file_len: u64,
        bytes: Vec<u8>,
    ) -> Result<RecordPrefix> {
        self.check_prefix(i, k, file_len, &bytes)?;
        let entry = self.entry(i)?;
        let path = self.dir.join(&entry.file);
        RecordPrefix::verify(path, bytes, entry, self.index.dataset_id, i, k)
    }
}

/// One record read up to a scan group, verified: metadata plus, per image, the pieces read.
#[derive(Debug, Clone)]
pub struct RecordPrefix {
    path: PathBuf,
    bytes: Vec<u8>,
    items: Vec<Item>,
    /// Per image: header range and the scan ranges present in `bytes`.
    pieces: Vec<(Range<usize>, Vec<Range<usize>>)>,
    scans_total: Vec<usize>,
    /// Per image: why its first bad piece failed verification (`None`: every piece read verified).
    damage: Vec<Option<String>>,
    group: usize,
}

impl RecordPrefix {
    /// Checks prefix bytes against their index entry: magic, header checksum and identity, the layout the
    /// header implies, every piece's CRC-32 and JPEG marker structure.
    pub(crate) fn verify(
        path: PathBuf,
        bytes: Vec<u8>,
        entry: &RecordEntry,
        dataset_id: u64,
        record: usize,
        k: usize,
    ) -> Result<RecordPrefix> {
        let corrupt = |reason: String| Error::CorruptRecord {
            path: path.clone(),
            reason,
        };
        let mismatch = |reason: String| Error::IndexMismatch {
            path: path.clone(),
            reason,
        };
        if (bytes.len() as u64) != entry.prefix_len(k) {
            return Err(corrupt(format!(
                "read {} bytes, group {k} ends at {}",
                bytes.len(),
                entry.prefix_len(k)
            )));
        }
        let (header, header_len, header_crc) =
            format::parse_record_header(&bytes).map_err(corrupt)?;
        if header_len != entry.header_len || header_crc != entry.header_crc {
            return Err(mismatch("the metadata header differs".into()));
        }
        if header.dataset_id != dataset_id || header.record as usize != record {
            return Err(mismatch(format!(
                "record {} of dataset {:016x}, the index expects record {record} of {dataset_id:016x}",
                header.record, header.dataset_id
            )));
        }
        if header.images.len() != entry.images.len() {
            return Err(mismatch(format!(
                "{} images, the index says {}",
                header.images.len(),
                entry.images.len()
            )));
        }
        let layout = header.layout(header_len);
        if layout != entry.implied_layout() {
            return Err(mismatch("piece lengths differ".into()));
        }
        let mut pieces = Vec::with_capacity(header.images.len());
        let mut scans_total = Vec::with_capacity(header.images.len());
        let mut damage = Vec::with_capacity(header.images.len());
        for (j, (img, e)) in header.images.iter().zip(&entry.images).enumerate() {
            if img.item.name != e.name || img.item.label != e.label {
                return Err(mismatch(format!(
                    "image {j} is {:?}, the index says {:?}",
                    img.item.name, e.name
                )));
            }
            // A bad piece fails its image only: the pieces of the other images, and this image's scans
            // before the bad one, are still what the writer wrote.
            let check =
                |p: &format::Piece, what: &str, scan: bool| -> Result<Range<usize>, String> {
                    let r = p.offset as usize..(p.offset + u64::from(p.len)) as usize;
                    let b = bytes
                        .get(r.clone())
                        .ok_or_else(|| format!("{what} lies past the read"))?;
                    if crc32fast::hash(b) != p.crc {
                        return Err(format!("{what}: checksum mismatch"));
                    }
                    let structure = if scan {
                        markers::check_scan_piece(b)
                    } else {
                        markers::check_header_piece(b)
                    };
                    structure.map_err(|m| format!("{what}: {m}"))?;
                    Ok(r)
                };
            let n = k.min(e.scans.len());
            let mut scans = Vec::with_capacity(n);
            let (h, bad) = match check(&e.header, "header", false) {
                Ok(h) => {
                    let mut bad = None;
                    for (s, p) in e.scans[..n].iter().enumerate() {
                        match check(p, &format!("scan {}", s + 1), true) {
                            Ok(r) => scans.push(r),
                            Err(reason) => {
                                bad = Some(reason);
                                break;
                            }
                        }
                    }
                    (h, bad)
                }
                Err(reason) => (0..0, Some(reason)),
            };
            pieces.push((h, scans));
            scans_total.push(e.scans.len());
            damage.push(bad);
        }
        Ok(RecordPrefix {
            path,
            bytes,
            items: header.images.into_iter().map(|i| i.item).collect(),
            pieces,
            scans_total,
            damage,
            group: k,
        })
    }

    /// The prefix if every image in it verified, else the first bad piece as the whole record's error:
    /// what a reader that wants all of a record or nothing ([`Dataset::read_record`]) returns.
    pub(crate) fn whole(self) -> Result<RecordPrefix> {
        match self.damage.iter().position(Option::is_some) {
            None => Ok(self),
            Some(j) => Err(Error::CorruptRecord {
                reason: format!(
                    "image {j} ({}) {}",
                    self.items[j].name,
                    self.damage[j].as_deref().unwrap_or_default()
                ),
                path: self.path,
            }),
        }
    }

    /// The record file this prefix came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The scan group this prefix was read at.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Bytes read from the record file.
    pub fn bytes_read(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Metadata of every image, in record order: name, label, boxes, attributes, EXIF orientation, size.
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// Whether image `j` is at full fidelity at this group (all its scans were read).
    pub fn is_complete(&self, j: usize) -> bool {
        self.pieces.get(j).map(|p| p.1.len()) == self.scans_total.get(j).copied()
    }

    /// Why image `j` failed verification (a piece of it read with a checksum mismatch or a broken JPEG
    /// structure), as the error [`jpeg`](Self::jpeg) returns for it; `None` when it verified.
    pub fn damage(&self, j: usize) -> Option<Error> {
        let reason = self.damage.get(j)?.as_ref()?;
        Some(Error::CorruptImage {
            path: self.path.clone(),
            image: j,
            name: self.items[j].name.clone(),
            reason: reason.clone(),
        })
    }

    /// Images of the prefix that failed verification.
    pub fn damaged(&self) -> usize {
        self.damage.iter().filter(|d| d.is_some()).count()
    }

    /// Scans of image `j` that verified: all it has up to the group when it is undamaged, else those
    /// before its bad piece (0 when its header is bad).
    pub fn verified_scans(&self, j: usize) -> usize {
        self.pieces.get(j).map_or(0, |p| p.1.len())
    }

    /// Rebuilds image `j`'s JPEG stream: its header, the scans read, EOI. An image that failed
    /// verification is [`Error::CorruptImage`] (see [`jpeg_verified`](Self::jpeg_verified)).
    pub fn jpeg(&self, j: usize) -> Result<Vec<u8>> {
        if let Some(e) = self.damage(j) {
            return Err(e);
        }
        self.jpeg_verified(j).map(|(jpeg, _)| jpeg)
    }

    /// Rebuilds image `j`'s JPEG stream from the pieces that verified — for a damaged image, its scans
    /// before the bad one, i.e. the image at a lower scan group — and says how many scans it holds.
    /// Progressive JPEG makes such a stream a complete image; one with no verified scan is its
    /// [`Error::CorruptImage`].
    pub fn jpeg_verified(&self, j: usize) -> Result<(Vec<u8>, usize)> {
        let (h, scans) = self.pieces.get(j).ok_or(Error::ImageOutOfRange {
            image: j,
            images: self.len(),
        })?;
        if scans.is_empty() {
            return Err(self.damage(j).unwrap_or_else(|| Error::CorruptImage {
                path: self.path.clone(),
                image: j,
                name: self.items[j].name.clone(),
                reason: "no scan read".into(),
            }));
        }
        let len = h.len() + scans.iter().map(|s| s.len()).sum::<usize>() + 2;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&self.bytes[h.clone()]);
        for s in scans {
            out.extend_from_slice(&self.bytes[s.clone()]);
        }
        out.extend_from_slice(&[0xFF, 0xD9]);
        Ok((out, scans.len()))
    }

    /// Decodes image `j` to RGB as stored (see [`Image::oriented`] for EXIF orientation).
    pub fn decode(&self, j: usize, decoder: Decoder) -> Result<Image> {
        let jpeg = self.jpeg(j)?;
        decoder.decode(&jpeg).map_err(|e| Error::Decode {
            name: format!("{}: {}", self.path.display(), self.items[j].name),
            decoder: decoder.name(),
            message: e.to_string(),
        })
    }

    /// Decodes every image on every core ([`stdx::parallel`]).
    pub fn decode_all(&self, decoder: Decoder) -> Result<Vec<Image>> {
        let images: Vec<usize> = (0..self.len()).collect();
        stdx::parallel::map(&images, 0, |_, &j| self.decode(j, decoder))
    }
}
