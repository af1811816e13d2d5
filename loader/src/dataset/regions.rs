//! Region reads of L3 items: the header and offset table first (kept per item within a byte budget, so
//! later epochs skip them), then only the byte ranges of the patches under the sample's window, neighbours
//! coalesced. From a disk, a network file system or object storage this moves 2 to 4 % of a 4K image for
//! a 224×224 crop instead of all of it.

use crate::error::{Error, Result};
use crate::item::{SampleRequest, Stored};
use crate::storage::Opened;
use l3_format::{Fragments, L3Index};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Ranges closer than this are read as one here. It stays 0: exactly the covered patches are read (a grid
/// row of patches is contiguous anyway); an object store coalesces its range requests itself.
pub(crate) const LOCAL_GAP: u64 = 0;

/// The offset tables of the items read so far, within a byte budget (oldest dropped first). Readers of
/// one item that miss together read its prefix once: the others wait on that item's read lock.
#[derive(Debug)]
pub(crate) struct IndexCache {
    inner: Mutex<CacheInner>,
    reading: Mutex<HashMap<usize, Arc<Mutex<()>>>>,
    budget: usize,
}

#[derive(Debug, Default)]
struct CacheInner {
    map: HashMap<usize, Arc<L3Index>>,
    order: VecDeque<usize>,
    bytes: usize,
}

impl IndexCache {
    pub fn new(budget: usize) -> Self {
        IndexCache {
            inner: Mutex::new(CacheInner::default()),
            reading: Mutex::new(HashMap::new()),
            budget,
        }
    }

    /// The cached index of `item`, else `read()`'s (with the bytes it read), cached. Concurrent misses of
    /// one item run `read` once unless the index is too large to cache.
    fn get_or_read(
        &self,
        item: usize,
        read: impl FnOnce() -> Result<(Arc<L3Index>, u64)>,
    ) -> Result<(Arc<L3Index>, u64)> {
        if let Some(i) = self.get(item) {
            return Ok((i, 0));
        }
        let lock = {
            let mut r = self.reading.lock().unwrap_or_else(|p| p.into_inner());
            r.entry(item).or_default().clone()
        };
        let _reading = lock.lock().unwrap_or_else(|p| p.into_inner());
        let got = match self.get(item) {
            Some(i) => Ok((i, 0)),
            None => read().inspect(|(index, _)| self.insert(item, index.clone())),
        };
        self.reading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&item);
        got
    }

    fn get(&self, item: usize) -> Option<Arc<L3Index>> {
        self.lock().map.get(&item).cloned()
    }

    fn insert(&self, item: usize, index: Arc<L3Index>) {
        let mut c = self.lock();
        let size = index.heap_bytes() + 64;
        if size > self.budget || c.map.contains_key(&item) {
            return;
        }
        while c.bytes + size > self.budget {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(i) = c.map.remove(&old) {
                c.bytes -= i.heap_bytes() + 64;
            }
        }
        c.map.insert(item, index);
        c.order.push_back(item);
        c.bytes += size;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reads item `item`, an L3 image stored at bytes `base .. base + len` of `file`, for `req`: only what its
/// window needs. Returns the stored parts and the bytes read.
pub(crate) fn read_region(
    cache: &IndexCache,
    item: usize,
    file: &Opened,
    (base, len): (u64, u64),
    req: &SampleRequest,
) -> Result<(Stored, u64)> {
    read_rect(cache, item, file, (base, len), |w, h| req.source_rect(w, h))
}

/// [`read_region`] for the source rectangle `rect(width, height)` of the image (for an item's mask:
/// what its nearest pick reads).
pub(crate) fn read_rect(
    cache: &IndexCache,
    item: usize,
    file: &Opened,
    (base, len): (u64, u64),
    rect: impl FnOnce(u32, u32) -> l3_format::Rect,
) -> Result<(Stored, u64)> {
    let l3 = |e: l3_format::Error| Error::decode(file.name(), "l3", e);
    let (index, mut read) = cache.get_or_read(item, || {
        // The header says how long the offset table is (and a v2-ANS file's tables how long they are):
        // read the header, then exactly the rest of the prefix — v1 and v2-BP in two reads, v2-ANS with a
        // read-ahead until its tables are in.
        let mut read = 0u64;
        let index = L3Index::read_from(len, |r| {
            let part = file.read_range(base + r.start..base + r.end)?;
            read += part.len() as u64;
            Ok(part)
        })
        .map_err(|e| match e {
            l3_format::ReadError::Read { source, .. } => source,
            l3_format::ReadError::Format(e) => l3(e),
        })?;
        Ok((Arc::new(index), read))
    })?;
    let rect = rect(index.width(), index.height());
    let ranges = index.region_ranges(rect, LOCAL_GAP).map_err(l3)?;
    let mut fragments = Fragments::new();
    fragments.reset(&ranges);
    let mut parts: Vec<(std::ops::Range<u64>, &mut [u8])> = fragments
        .slices_mut()
        .map(|(r, buf)| (base + r.start..base + r.end, buf))
        .collect();
    read += file.read_ranges_into(&mut parts)?;
    drop(parts);
    Ok((Stored::L3Region { index, fragments }, read))
}
