//! Region reads of L3 items: the header and offset table first (kept per item within a byte budget, so
//! later epochs skip them), then only the byte ranges of the patches under the sample's window, neighbours
//! coalesced. From a disk, a network file system or object storage this moves 2 to 4 % of a 4K image for
//! a 224×224 crop instead of all of it.

use crate::error::{Error, Result};
use crate::item::{SampleRequest, Stored};
use crate::storage::Opened;
use l3_format::{Fragments, L3Index};
use std::sync::Arc;

/// Ranges closer than this are read as one here. It stays 0: exactly the covered patches are read (a grid
/// row of patches is contiguous anyway); an object store coalesces its range requests itself.
pub(crate) const LOCAL_GAP: u64 = 0;

/// The offset tables of the items read so far, within a byte budget: a `quick_cache` weighted by each
/// table's heap bytes (the budget is split among its shards, so a table over a shard's part is read
/// every time rather than cached). An item's bytes do not change during a run, so a cached table is
/// never stale. Readers of one item that miss together read its prefix once: the others wait for that
/// read (a failed read leaves the next waiter to try).
#[derive(Debug)]
pub(crate) struct IndexCache {
    tables: quick_cache::sync::Cache<usize, Arc<L3Index>, TableBytes>,
}

/// An offset table's weight: its heap bytes and the entry's own.
#[derive(Clone, Debug)]
struct TableBytes;

impl quick_cache::Weighter<usize, Arc<L3Index>> for TableBytes {
    fn weight(&self, _item: &usize, index: &Arc<L3Index>) -> u64 {
        index.heap_bytes() as u64 + 64
    }
}

impl IndexCache {
    pub fn new(budget: usize) -> Self {
        // The entry estimate only sizes quick_cache's tables: most offset tables are a few KiB.
        let estimated_entries = (budget / 4096).max(64);
        IndexCache {
            tables: quick_cache::sync::Cache::with_weighter(
                estimated_entries,
                budget as u64,
                TableBytes,
            ),
        }
    }

    /// The cached index of `item`, else `read()`'s (with the bytes it read), cached. Concurrent misses of
    /// one item run `read` once.
    fn get_or_read(
        &self,
        item: usize,
        read: impl FnOnce() -> Result<(Arc<L3Index>, u64)>,
    ) -> Result<(Arc<L3Index>, u64)> {
        let mut bytes = 0;
        let index = self.tables.get_or_insert_with(&item, || {
            read().map(|(index, n)| {
                bytes = n;
                index
            })
        })?;
        Ok((index, bytes))
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
    read_framed(cache, item, file, (base, len), rect, None)
}

/// [`read_rect`] with `frame`'s bytes before the item read and checked (an L3 mask carried in a shard).
pub(crate) fn read_rect_framed(
    cache: &IndexCache,
    item: usize,
    file: &Opened,
    (base, len): (u64, u64),
    rect: impl FnOnce(u32, u32) -> l3_format::Rect,
    frame: &Frame,
) -> Result<(Stored, u64)> {
    read_framed(cache, item, file, (base, len), rect, Some(frame))
}

/// The bytes just before an item that are read with its first range and checked — a tar member's
/// header, in front of its data — so that checking where the item lies costs no request of its own.
pub(crate) struct Frame<'a> {
    pub len: u64,
    pub check: &'a dyn Fn(&[u8]) -> Result<()>,
    /// The first read takes at least this many bytes of the item, so that its header and offset table
    /// usually come in one request rather than two.
    pub read_ahead: u64,
    /// The item's header and offset table, known without reading them (a shard's index carries them
    /// for the version of the shard it describes): parsed with l3-format's checks (the prefix CRC where
    /// the file has one) instead of read, and the frame — whose agreement the index's version vouches
    /// for — not read.
    pub head: Option<&'a [u8]>,
}

/// [`read_region`] with `frame`'s bytes before the item read and checked when its offset table is
/// (once per cached table).
pub(crate) fn read_region_framed(
    cache: &IndexCache,
    item: usize,
    file: &Opened,
    (base, len): (u64, u64),
    req: &SampleRequest,
    frame: &Frame,
) -> Result<(Stored, u64)> {
    let rect = |w, h| req.source_rect(w, h);
    read_framed(cache, item, file, (base, len), rect, Some(frame))
}

fn read_framed(
    cache: &IndexCache,
    item: usize,
    file: &Opened,
    (base, len): (u64, u64),
    rect: impl FnOnce(u32, u32) -> l3_format::Rect,
    frame: Option<&Frame>,
) -> Result<(Stored, u64)> {
    let l3 = |e: l3_format::Error| Error::decode(file.name(), "l3", e);
    let (index, mut read) = cache.get_or_read(item, || {
        if let Some(head) = frame.and_then(|f| f.head) {
            return Ok((Arc::new(L3Index::parse(head, len).map_err(l3)?), 0));
        }
        // The header says how long the offset table is (and a v2-ANS file's tables how long they are):
        // read the header, then exactly the rest of the prefix — v1 and v2-BP in two reads, v2-ANS with a
        // read-ahead until its tables are in.
        let mut read = 0u64;
        let mut framed = frame;
        // With a frame, the bytes read ahead (item offset, bytes): later parts of the prefix come from it.
        let mut held: Option<(u64, Vec<u8>)> = None;
        let index = L3Index::read_from(len, |r| {
            if let Some((at, bytes)) = &held
                && r.start >= *at
                && r.end <= at + bytes.len() as u64
            {
                return Ok(bytes[(r.start - at) as usize..(r.end - at) as usize].to_vec());
            }
            let before = match framed.take() {
                Some(f) if r.start == 0 && base >= f.len => Some(f),
                _ => None,
            };
            let from = base + r.start - before.map_or(0, |f| f.len);
            let end = match frame {
                Some(f) => r.end.max(r.start + f.read_ahead).min(len),
                None => r.end,
            };
            let mut part = file.read_range(from..base + end)?;
            read += part.len() as u64;
            if let Some(f) = before {
                (f.check)(&part[..f.len as usize])?;
                part.drain(..f.len as usize);
            }
            if frame.is_some() {
                held = Some((r.start, part.clone()));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn index(w: u32, h: u32) -> Arc<L3Index> {
        let img = crate::image::Image {
            width: w,
            height: h,
            channels: 3,
            pixels: (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect(),
        };
        let l3 = crate::convert::encode(&img, crate::convert::Target::L3_DEFAULT).unwrap();
        Arc::new(L3Index::parse(&l3, l3.len() as u64).unwrap())
    }

    /// Misses of one item from many threads read it once; a failed read caches nothing and the next
    /// reader tries again; a hit reads nothing.
    #[test]
    fn concurrent_misses_read_once_and_a_failure_is_not_cached() {
        let cache = IndexCache::new(1 << 20);
        let table = index(64, 48);
        let reads = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let (got, _) = cache
                        .get_or_read(3, || {
                            reads.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok((table.clone(), 100))
                        })
                        .unwrap();
                    assert!(Arc::ptr_eq(&got, &table));
                });
            }
        });
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        assert_eq!(cache.get_or_read(3, || unreachable!()).unwrap().1, 0);
        let failed = cache.get_or_read(4, || Err(Error::Pipeline("short read".into())));
        assert!(failed.is_err());
        let (_, n) = cache.get_or_read(4, || Ok((table.clone(), 7))).unwrap();
        assert_eq!(n, 7, "a failed read was cached");
    }

    /// The tables kept never weigh more than the budget: reading many items keeps re-reading the old
    /// ones once the budget is full.
    #[test]
    fn the_cache_stays_within_its_byte_budget() {
        let table = index(256, 256);
        let weight = table.heap_bytes() + 64;
        let cache = IndexCache::new(8 * weight);
        for item in 0..64 {
            cache.get_or_read(item, || Ok((table.clone(), 1))).unwrap();
        }
        let kept = cache.tables.weight() as usize;
        assert!(
            kept <= 8 * weight,
            "{kept} bytes kept, budget {}",
            8 * weight
        );
        let rereads = (0..64)
            .filter(|&item| {
                cache
                    .get_or_read(item, || Ok((table.clone(), 1)))
                    .unwrap()
                    .1
                    == 1
            })
            .count();
        assert!(rereads >= 64 - 8, "only {rereads} of 64 items read again");
    }
}
