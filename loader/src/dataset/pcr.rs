//! A Progressive Compressed Records dataset read at a chosen scan group, a record at a time.
//!
//! PCR's point is that a *prefix* of each record holds every one of its images at reduced fidelity, so a
//! reader moves fewer bytes by reading one contiguous range per record. Reading image by image would undo
//! that (a request per image, and on object storage a round trip each), so this dataset reads whole record
//! prefixes — one request each, verified by the same [`pcr::Dataset::verify_prefix`] that `l3 pcr read` uses
//! (magic, header CRC, identity, names, exact length, every piece's CRC) — and keeps the last few in memory.
//! The loader's seeded order visits it record-aware ([`Dataset::blocks`]): records in a shuffled order,
//! items shuffled within a window of [`PcrRecords::window`] records, as the paper's shuffle buffer does, so
//! each record is read once per epoch.

use super::{Blocks, Dataset};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, write_pixels};
use crate::storage::Storage;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Index files larger than this are refused before being read (as `pcr` does).
const MAX_INDEX_BYTES: u64 = 1 << 32;

/// Records shuffled together by default: the paper's shuffle buffer spans a few records.
pub const DEFAULT_WINDOW: usize = 4;

/// A record prefix being read or read: threads that need the same record wait for one read.
type Cell = Arc<OnceLock<std::result::Result<Arc<pcr::RecordPrefix>, String>>>;

/// Every image of a PCR dataset at scan group `k`, decoded with libjpeg-turbo (which smooths the missing AC
/// data of low groups, as the paper's pipeline does) and turned upright by its EXIF orientation.
pub struct PcrRecords {
    storage: Storage,
    inner: pcr::Dataset,
    group: usize,
    /// (record, image within record) per item.
    items: Vec<(usize, usize)>,
    /// First item of each record.
    starts: Vec<usize>,
    labels: Vec<u32>,
    /// EXIF orientation per item, known once its record's header is read (the index does not hold it).
    orientation: Vec<AtomicU8>,
    classes: Vec<String>,
    /// Size of each record's file as the storage lists it (`None`: not there).
    file_len: Vec<Option<u64>>,
    window: usize,
    /// The record prefixes held in memory, oldest first: at most `2 × window + 2`, so a window being
    /// consumed and the next one being read both fit.
    cache: Mutex<VecDeque<(usize, Cell)>>,
    bytes: u64,
}

impl PcrRecords {
    /// Opens the local folder `dir` at scan group `group` (1-based; `None` = every group, full fidelity).
    pub fn open(dir: impl AsRef<Path>, group: Option<usize>) -> Result<Self> {
        Self::open_in(Storage::local(dir.as_ref()), group, DEFAULT_WINDOW)
    }

    /// Opens the dataset at the root of `storage` (a local folder or an object-store prefix), shuffling
    /// items within windows of `window` records.
    pub fn open_in(storage: Storage, group: Option<usize>, window: usize) -> Result<Self> {
        let root = PathBuf::from(storage.root());
        let index = storage.read(pcr::INDEX_FILE, MAX_INDEX_BYTES)?;
        let inner = pcr::Dataset::from_index_bytes(&root, &index)?;
        let groups = inner.groups();
        let group = group.unwrap_or(groups);
        if group == 0 || group > groups {
            return Err(Error::dataset(
                &root,
                format!("scan group {group} out of range 1..={groups}"),
            ));
        }
        let listed: std::collections::HashMap<String, u64> =
            storage.list()?.files.into_iter().collect();
        let mut items = Vec::new();
        let mut starts = Vec::new();
        let mut raw_labels = Vec::new();
        let mut orientation = Vec::new();
        let mut file_len = Vec::new();
        for (r, rec) in inner.index().records.iter().enumerate() {
            starts.push(items.len());
            file_len.push(listed.get(&rec.file).copied());
            for (j, img) in rec.images.iter().enumerate() {
                items.push((r, j));
                raw_labels.push(img.label.clone().unwrap_or_default());
                orientation.push(AtomicU8::new(1));
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
        let bytes = inner.prefix_bytes(group)?;
        Ok(PcrRecords {
            storage,
            inner,
            group,
            items,
            starts,
            labels,
            orientation,
            classes: if numeric { Vec::new() } else { classes },
            file_len,
            window: window.max(1),
            cache: Mutex::new(VecDeque::new()),
            bytes,
        })
    }

    /// Whether the local folder `dir` holds a PCR dataset.
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

    /// Records shuffled together.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Class names by label (empty when the labels are integers).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Record `r`'s verified prefix, and the bytes this call read (0 when another call read it).
    fn record(&self, r: usize) -> Result<(Arc<pcr::RecordPrefix>, u64)> {
        let cell = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.iter().find(|(k, _)| *k == r) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = Cell::default();
                    if cache.len() >= 2 * self.window + 2 {
                        cache.pop_front();
                    }
                    cache.push_back((r, c.clone()));
                    c
                }
            }
        };
        let mut read = 0;
        let got = cell.get_or_init(|| {
            let prefix = self.read_record(r).map_err(|e| e.to_string())?;
            read = prefix.bytes_read();
            Ok(Arc::new(prefix))
        });
        match got {
            Ok(p) => Ok((p.clone(), read)),
            Err(message) => {
                // A failed read is not cached: the next attempt (after a resume) reads again.
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.retain(|(_, c)| !Arc::ptr_eq(c, &cell));
                // The reader's messages name the record already.
                let name = self.record_name(r);
                let prefix = format!("{}: ", name.display());
                let reason = message.strip_prefix(&prefix).unwrap_or(message);
                Err(Error::dataset(name, reason))
            }
        }
    }

    /// One request for the record's prefix up to the group, verified against the index.
    fn read_record(&self, r: usize) -> Result<pcr::RecordPrefix> {
        let entry = &self.inner.index().records[r];
        let Some(file_len) = self.file_len[r] else {
            return Err(Error::dataset(
                self.record_name(r),
                "record missing from the dataset",
            ));
        };
        let range = self.inner.record_range(r, self.group)?;
        // A record of the wrong length is refused before anything is read.
        if file_len != entry.file_len {
            return Ok(self
                .inner
                .verify_prefix(r, self.group, file_len, Vec::new())?);
        }
        let bytes = self.storage.read_range(&entry.file, range)?;
        Ok(self.inner.verify_prefix(r, self.group, file_len, bytes)?)
    }

    fn record_name(&self, r: usize) -> PathBuf {
        self.storage.name(&self.inner.index().records[r].file)
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
        let mut name = self.record_name(r).into_os_string();
        name.push(format!("#{j} ({})", rec.images[j].name));
        name.into()
    }
    /// Bytes read per epoch at this group: every record's prefix up to the group, once.
    fn stored_bytes(&self) -> u64 {
        self.bytes
    }
    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }
    fn blocks(&self) -> Option<Blocks<'_>> {
        Some(Blocks {
            starts: &self.starts,
            window: self.window,
        })
    }
    fn read(&self, index: usize, _req: &SampleRequest) -> Result<(Stored, u64)> {
        let (r, j) = self.items[index];
        let (prefix, read) = self.record(r)?;
        let jpeg = prefix.jpeg(j)?;
        self.orientation[index].store(prefix.items()[j].orientation, Ordering::Relaxed);
        Ok((Stored::Whole(jpeg), read))
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
            .map_err(|e| Error::decode(self.source(index), "pcr", e))?
            .oriented(self.orientation[index].load(Ordering::Relaxed));
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
            "PCR dataset {} ({} images in {} records, scan group {} of {})",
            self.storage.root(),
            self.items.len(),
            self.starts.len(),
            self.group,
            self.inner.groups()
        )
    }
}
