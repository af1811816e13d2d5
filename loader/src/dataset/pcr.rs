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
//!
//! A record's bytes are verified per image: a piece that fails its checksum fails only the image whose
//! scan it is (the other images of the record are delivered), and with [`PcrRecords::with_partial`] that
//! image is delivered at the largest group whose scans verified, counted as partial. A record that cannot
//! be read at all (missing, wrong length, another build's) fails each of its items with the same error,
//! from one read: the failure is kept like a prefix, until the next epoch asks again.

use super::{Blocks, Dataset};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::item::{Decoded, SampleRequest, Scratch, Stored, write_pixels};
use crate::storage::Storage;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Index files larger than this are refused before being read (as `pcr` does).
const MAX_INDEX_BYTES: u64 = 1 << 32;

/// Records shuffled together by default: the paper's shuffle buffer spans a few records.
pub const DEFAULT_WINDOW: usize = 4;

/// A record prefix being read or read: threads that need the same record wait for one read. A failure is
/// kept with the epoch that read it.
type Cell = Arc<OnceLock<std::result::Result<Arc<pcr::RecordPrefix>, (String, usize)>>>;

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
    /// Per item: whether the last read delivered it below the group (a damaged scan, with `partial`).
    degraded: Vec<AtomicBool>,
    /// Deliver an image whose scan `k` failed verification at the largest group below `k` that verified.
    partial: bool,
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
        let mut degraded = Vec::new();
        let mut file_len = Vec::new();
        for (r, rec) in inner.index().records.iter().enumerate() {
            starts.push(items.len());
            file_len.push(listed.get(&rec.file).copied());
            for (j, img) in rec.images.iter().enumerate() {
                items.push((r, j));
                raw_labels.push(img.label.clone().unwrap_or_default());
                orientation.push(AtomicU8::new(1));
                degraded.push(AtomicBool::new(false));
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
            degraded,
            partial: false,
            classes: if numeric { Vec::new() } else { classes },
            file_len,
            window: window.max(1),
            cache: Mutex::new(VecDeque::new()),
            bytes,
        })
    }

    /// With `partial`, an image one of whose scans fails verification is delivered at the largest scan
    /// group below the bad scan (the scans before it verified), counted in
    /// [`Stats::items_partial`](crate::Stats::items_partial), instead of failing.
    pub fn with_partial(mut self, partial: bool) -> Self {
        self.partial = partial;
        self
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

    /// Record `r`'s verified prefix, and the bytes this call read (0 when another call read it). A failed
    /// read is kept for the rest of `epoch`, so the record's other items fail without reading it again;
    /// a later epoch reads it afresh.
    fn record(&self, r: usize, epoch: usize) -> Result<(Arc<pcr::RecordPrefix>, u64)> {
        let cell = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            // A failure from an earlier epoch is retried; I/O threads may still be finishing the epoch
            // before, which keeps using a later epoch's failure rather than reading again.
            let stale = |c: &Cell| matches!(c.get(), Some(Err((_, e))) if *e < epoch);
            cache.retain(|(k, c)| *k != r || !stale(c));
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
            let prefix = self.read_record(r).map_err(|e| (e.to_string(), epoch))?;
            read = prefix.bytes_read();
            Ok(Arc::new(prefix))
        });
        match got {
            Ok(p) => Ok((p.clone(), read)),
            Err((message, _)) => {
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
                .verify_prefix_per_image(r, self.group, file_len, Vec::new())?);
        }
        let bytes = self.storage.read_range(&entry.file, range)?;
        Ok(self
            .inner
            .verify_prefix_per_image(r, self.group, file_len, bytes)?)
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
    fn name(&self, index: usize) -> Option<String> {
        let (r, j) = self.items[index];
        Some(self.inner.index().records[r].images[j].name.clone())
    }
    fn source(&self, index: usize) -> PathBuf {
        let (r, j) = self.items[index];
        let rec = &self.inner.index().records[r];
        let mut name = self.record_name(r).into_os_string();
        name.push(format!("#{j} ({})", rec.images[j].name));
        name.into()
    }
    /// The image's header and every scan of it (whatever the group read).
    fn stored_len(&self, index: usize) -> Option<u64> {
        let (r, j) = self.items[index];
        let image = &self.inner.index().records[r].images[j];
        let scans: u64 = image.scans.iter().map(|p| u64::from(p.len)).sum();
        Some(u64::from(image.header.len) + scans)
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
    fn read(&self, index: usize, req: &SampleRequest) -> Result<(Stored, u64)> {
        let (r, j) = self.items[index];
        let (prefix, read) = self.record(r, req.key.epoch)?;
        let damaged = prefix.damage(j).is_some();
        let jpeg = if damaged && self.partial {
            prefix.jpeg_verified(j)?.0
        } else {
            prefix.jpeg(j)?
        };
        self.orientation[index].store(prefix.items()[j].orientation, Ordering::Relaxed);
        self.degraded[index].store(damaged, Ordering::Relaxed);
        Ok((Stored::Whole(jpeg), read))
    }
    fn decode(
        &self,
        index: usize,
        stored: &Stored,
        req: &SampleRequest,
        scratch: &mut Scratch,
        slot: &mut [u8],
    ) -> Result<Decoded> {
        let Stored::Whole(bytes) = stored else {
            return Err(Error::decode(
                self.source(index),
                "pcr",
                "not a JPEG stream",
            ));
        };
        let source = self.source(index);
        let (w, h) = crate::image::jpeg_size(bytes)
            .ok_or_else(|| Error::decode(&source, "pcr", "no JPEG frame header"))?;
        let _decoding = crate::image::DecodeBudget::admit(&source, "pcr", (w, h), 3)?;
        let img = pcr::Decoder::Libjpeg
            .decode(bytes)
            .map_err(|e| Error::decode(&source, "pcr", e))?
            .oriented(self.orientation[index].load(Ordering::Relaxed));
        let mut done = write_pixels(
            &img.pixels,
            (img.width, img.height, 3),
            &source,
            Format::Pcr,
            req,
            scratch,
            slot,
        )?;
        done.partial = self.degraded[index].load(Ordering::Relaxed);
        Ok(done)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Loader, LoaderOptions};
    use vocab::SampleSpec;

    /// Four small JPEGs (40x16 and wider) in one record, labelled 0..4, built by the PCR writer.
    fn dataset(dir: &Path) -> PathBuf {
        let inputs: Vec<pcr::Input> = (0..4u32)
            .map(|i| {
                let img = image::RgbImage::from_fn(40 + 8 * i, 16, |x, y| {
                    image::Rgb([(x * 9) as u8, (y * 13) as u8, (i * 60) as u8])
                });
                let p = dir.join(format!("{i}.jpg"));
                img.save(&p).unwrap();
                let mut input = pcr::Input::new(p);
                input.label = Some(i.to_string());
                input
            })
            .collect();
        let out = dir.join("pcr");
        pcr::build(&out, &inputs, &pcr::BuildOptions::default(), &|_| {}).unwrap();
        out
    }

    /// Flips a byte in the middle of image `j`'s scan `scan` (1-based) of record 0.
    fn damage_scan(out: &Path, j: usize, scan: usize) {
        let ds = pcr::Dataset::open(out).unwrap();
        let piece = &ds.index().records[0].images[j].scans[scan - 1];
        let at = (piece.offset + u64::from(piece.len) / 2) as usize;
        let path = out.join(pcr::record_file_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
    }

    fn options(epochs: usize) -> LoaderOptions {
        LoaderOptions {
            batch_size: 4,
            sample: SampleSpec {
                height: 16,
                width: 16,
                ..SampleSpec::default()
            },
            decode_threads: 2,
            shuffle: false,
            epochs: Some(epochs),
            skip_errors: true,
            ..LoaderOptions::default()
        }
    }

    fn run(ds: Arc<PcrRecords>, epochs: usize) -> (Vec<Batch>, crate::Stats) {
        let mut l = Loader::new(ds, options(epochs)).unwrap();
        let batches: Vec<Batch> = l.by_ref().map(|b| b.unwrap()).collect();
        (batches, l.stats())
    }

    fn sample_of(batches: &[Batch], id: usize) -> Vec<u8> {
        let b = batches.iter().find(|b| b.ids.contains(&id)).unwrap();
        let i = b.ids.iter().position(|&x| x == id).unwrap();
        let n = 16 * 16 * 3;
        b.pixels.bytes().unwrap()[i * n..(i + 1) * n].to_vec()
    }

    /// One bad byte in one image's scan costs that image only: the record's other images are delivered,
    /// the skipped one is named (record file, image, scan), and the record is read once.
    #[test]
    fn a_bad_scan_fails_only_its_image() {
        let dir = tempfile::tempdir().unwrap();
        let out = dataset(dir.path());
        damage_scan(&out, 2, 3);
        let ds = Arc::new(PcrRecords::open(&out, None).unwrap());
        let requests = ds.storage.requests();
        let (batches, stats) = run(ds.clone(), 1);
        let mut ids: Vec<usize> = batches.iter().flat_map(|b| b.ids.clone()).collect();
        ids.sort();
        assert_eq!(ids, [0, 1, 3]);
        let skipped: Vec<&(usize, String)> = batches.iter().flat_map(|b| &b.skipped).collect();
        assert_eq!(skipped.len(), 1);
        let (id, why) = skipped[0];
        assert_eq!(*id, 2);
        assert!(
            why.contains("record-00000.pcr") && why.contains("2.jpg") && why.contains("scan 3"),
            "{why}"
        );
        assert_eq!(stats.items_partial, 0);
        assert_eq!(
            ds.storage.requests() - requests,
            1,
            "the record was read more than once"
        );
    }

    /// With `pcr_partial`, the image whose scan 3 is bad arrives at group 2 — the same sample as reading
    /// the dataset at group 2 — and is counted.
    #[test]
    fn with_partial_a_bad_scan_gives_its_image_at_the_group_below() {
        let dir = tempfile::tempdir().unwrap();
        let out = dataset(dir.path());
        damage_scan(&out, 2, 3);
        let ds = Arc::new(PcrRecords::open(&out, None).unwrap().with_partial(true));
        let (batches, stats) = run(ds, 1);
        let mut ids: Vec<usize> = batches.iter().flat_map(|b| b.ids.clone()).collect();
        ids.sort();
        assert_eq!(ids, [0, 1, 2, 3]);
        assert_eq!(stats.items_partial, 1);
        assert_eq!(stats.items_skipped, 0);
        let (low, _) = run(Arc::new(PcrRecords::open(&out, Some(2)).unwrap()), 1);
        let (full, _) = run(Arc::new(PcrRecords::open(&out, None).unwrap()), 1);
        assert_eq!(sample_of(&batches, 2), sample_of(&low, 2));
        for id in [0, 1, 3] {
            assert_eq!(sample_of(&batches, id), sample_of(&full, id));
        }
    }

    /// A record that fails as a whole (its metadata header damaged) fails each of its items from one read
    /// per epoch, not one per item.
    #[test]
    fn a_record_that_fails_is_read_once_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let out = dataset(dir.path());
        let path = out.join(pcr::record_file_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let ds = Arc::new(PcrRecords::open(&out, None).unwrap());
        let requests = ds.storage.requests();
        let (batches, stats) = run(ds.clone(), 2);
        assert!(batches.iter().all(|b| b.ids.is_empty()));
        assert_eq!(stats.items_skipped, 8);
        for b in &batches {
            for (_, why) in &b.skipped {
                assert!(why.contains("record-00000.pcr"), "{why}");
            }
        }
        assert_eq!(ds.storage.requests() - requests, 2, "one read per epoch");
    }
}
