//! A local cache of remote objects for repeated epochs: a folder with a byte limit, least recently used
//! entries evicted first, safe under concurrent processes (entries appear by rename, eviction holds the
//! folder's lock, a reader that loses a race simply misses).
//!
//! An entry holds one aligned [`BLOCK`] of one version of one object, so any later range of the object
//! hits whatever crop asked for it first. Entries are never trusted: each records the URL, the object's
//! size and ETag, the block index and a CRC-32C over all of it, and a read checks every one of them
//! against the object as the dataset's listing saw it. An entry that fails (bit rot, a torn write, an
//! object overwritten in the bucket since) is deleted and its block fetched again — never served. Writes
//! happen on the cache's own thread, off the reader's path, with one fsync each.
//!
//! Entry layout (little-endian): `L3CACHE\x01`, url length u32, tag length u32, object size u64, block
//! u64, data length u64, the URL, the tag, the data, then CRC-32C of everything before it (u32).

use super::object::Version;
use crate::error::{Error, Result};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

/// Bytes per entry: a whole number of these, aligned, cover any range. Large enough that an entry costs
/// one request where a random crop's patches would cost several; small enough that a crop of a large
/// image fetches little it does not use.
pub(crate) const BLOCK: u64 = 1 << 20;

const MAGIC: &[u8; 8] = b"L3CACHE\x01";
const FIXED: usize = 8 + 4 + 4 + 8 + 8 + 8;

/// Where and how much to cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// Bytes the cache may hold; beyond it the least recently used entries go.
    pub limit: u64,
}

impl CacheOptions {
    /// The cache size when none is given: 10 GiB.
    pub const DEFAULT_LIMIT: u64 = 10 << 30;
}

/// A cache entry's fields, borrowed from its bytes once they were checked whole.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    pub url: &'a str,
    /// The object's ETag (or last-modified time) when the block was fetched.
    pub tag: &'a str,
    pub object_size: u64,
    pub block: u64,
    pub data: &'a [u8],
}

/// Why bytes are not a cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    #[error("not a cache entry (no magic)")]
    Magic,
    #[error("the entry is cut short or has bytes after its end")]
    Length,
    #[error("the entry's checksum does not match its bytes")]
    Checksum,
    #[error("the entry's URL or tag is not UTF-8")]
    Text,
}

impl<'a> CacheEntry<'a> {
    /// Checks and splits `bytes`: the magic, every length against the bytes there are, the CRC-32C.
    pub fn parse(bytes: &'a [u8]) -> std::result::Result<CacheEntry<'a>, BadEntry> {
        if bytes.len() < FIXED + 4 || &bytes[..8] != MAGIC {
            return Err(if bytes.starts_with(MAGIC) {
                BadEntry::Length
            } else {
                BadEntry::Magic
            });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as u64;
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let (url_len, tag_len) = (u32_at(8), u32_at(12));
        let (object_size, block, data_len) = (u64_at(16), u64_at(24), u64_at(32));
        let body = url_len
            .checked_add(tag_len)
            .and_then(|n| n.checked_add(data_len))
            .ok_or(BadEntry::Length)?;
        if (bytes.len() - FIXED - 4) as u64 != body {
            return Err(BadEntry::Length);
        }
        let (head, crc) = bytes.split_at(bytes.len() - 4);
        if l3_format::crc32c(head) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err(BadEntry::Checksum);
        }
        let (url, rest) = head[FIXED..].split_at(url_len as usize);
        let (tag, data) = rest.split_at(tag_len as usize);
        Ok(CacheEntry {
            url: std::str::from_utf8(url).map_err(|_| BadEntry::Text)?,
            tag: std::str::from_utf8(tag).map_err(|_| BadEntry::Text)?,
            object_size,
            block,
            data,
        })
    }

    /// The entry's bytes, as [`CacheEntry::parse`] reads them.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(FIXED + self.url.len() + self.tag.len() + self.data.len() + 4);
        self.write_to(&mut out).expect("writing to a Vec");
        out
    }

    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(FIXED + self.url.len() + self.tag.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(self.url.len() as u32).to_le_bytes());
        head.extend_from_slice(&(self.tag.len() as u32).to_le_bytes());
        head.extend_from_slice(&self.object_size.to_le_bytes());
        head.extend_from_slice(&self.block.to_le_bytes());
        head.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        head.extend_from_slice(self.url.as_bytes());
        head.extend_from_slice(self.tag.as_bytes());
        let mut crc = l3_format::Crc32c::new();
        crc.update(&head);
        crc.update(self.data);
        w.write_all(&head)?;
        w.write_all(self.data)?;
        w.write_all(&crc.finish().to_le_bytes())
    }
}

/// What the cache did, since the dataset opened.
#[derive(Debug, Default)]
pub(super) struct CacheCounts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_bytes: AtomicU64,
    /// Entries found bad (checksum, length) or stale (another version of the object), deleted.
    pub dropped: AtomicU64,
}

/// A block to write, on the writer thread.
struct Put {
    url: String,
    version: Version,
    block: u64,
    data: Vec<u8>,
}

#[derive(Debug)]
pub(super) struct DiskCache {
    dir: PathBuf,
    limit: u64,
    pub counts: CacheCounts,
    /// Blocks waiting to be written; `None` once the cache is dropped.
    writer: Option<mpsc::SyncSender<Put>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Blocks waiting for the writer at most: beyond that a block is not cached (the read never waits).
const QUEUE: usize = 64;

/// FNV-1a: a stable file name for an object's block (collisions are caught by the URL stored inside).
fn file_name(url: &str, block: u64) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in url.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}-{block}.entry")
}

/// A cache hit: the entry's bytes as read, and where its data lies in them (no copy made yet).
pub(super) struct Hit {
    pub bytes: Vec<u8>,
    pub data: std::ops::Range<usize>,
}

impl DiskCache {
    pub fn open(o: &CacheOptions) -> Result<DiskCache> {
        match std::fs::metadata(&o.dir) {
            Ok(m) if !m.is_dir() => {
                return Err(Error::dataset(
                    &o.dir,
                    "the cache folder names a file: give a folder (it is created when missing)",
                ));
            }
            _ => {}
        }
        std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
        stdx::fs::remove_stale_temps(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
        let (tx, rx) = mpsc::sync_channel::<Put>(QUEUE);
        let (dir, limit) = (o.dir.clone(), o.limit);
        let thread = std::thread::Builder::new()
            .name("l3-cache-writer".into())
            .spawn(move || write_entries(&dir, limit, rx))
            .map_err(|e| Error::io(&o.dir, e))?;
        Ok(DiskCache {
            dir: o.dir.clone(),
            limit: o.limit,
            counts: CacheCounts::default(),
            writer: Some(tx),
            thread: Some(thread),
        })
    }

    /// Block `block` of the object at `url` as `version`, if the cache holds it intact. A bad or stale
    /// entry is deleted (and counted) so that the block is fetched and stored again.
    pub fn get(&self, url: &str, version: &Version, block: u64) -> Option<Hit> {
        let path = self.dir.join(file_name(url, block));
        let miss = || {
            self.counts.misses.fetch_add(1, Ordering::Relaxed);
            None
        };
        let Ok(bytes) = std::fs::read(&path) else {
            return miss();
        };
        let data = match CacheEntry::parse(&bytes) {
            // Another object's block under the same hash: a miss; the put that follows replaces it.
            Ok(e) if e.url != url || e.block != block => return miss(),
            Ok(e)
                if e.tag == version.tag()
                    && e.object_size == version.size
                    && e.data.len() as u64 == block_len(version.size, block) =>
            {
                let start = e.data.as_ptr() as usize - bytes.as_ptr() as usize;
                start..start + e.data.len()
            }
            // Corrupt, or from another version of the object: never served.
            _ => {
                if std::fs::remove_file(&path).is_ok() {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                }
                return miss();
            }
        };
        self.counts.hits.fetch_add(1, Ordering::Relaxed);
        self.counts
            .hit_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        // Recently used: eviction goes by modification time.
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Some(Hit { bytes, data })
    }

    /// Queues a block for writing (best effort: a full queue, a full disk or a race loses a cache entry,
    /// nothing else; the reader never waits for the disk).
    pub fn put(&self, url: &str, version: &Version, block: u64, data: Vec<u8>) {
        if data.len() as u64 > self.limit / 4 {
            return;
        }
        if let Some(w) = &self.writer {
            let _ = w.try_send(Put {
                url: url.to_string(),
                version: version.clone(),
                block,
                data,
            });
        }
    }

    #[cfg(test)]
    pub fn flush(&mut self) {
        self.writer = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let (tx, rx) = mpsc::sync_channel::<Put>(QUEUE);
        let (dir, limit) = (self.dir.clone(), self.limit);
        self.thread = Some(std::thread::spawn(move || write_entries(&dir, limit, rx)));
        self.writer = Some(tx);
    }

    /// The cache's folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    #[cfg(test)]
    pub fn bytes_held(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for DiskCache {
    /// Writes what is queued before the cache goes: a run's last blocks are there for the next one.
    fn drop(&mut self) {
        self.writer = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The length of block `block` of an object of `size` bytes.
pub(crate) fn block_len(size: u64, block: u64) -> u64 {
    size.saturating_sub(block.saturating_mul(BLOCK)).min(BLOCK)
}

/// The writer thread: each queued block as an entry (temporary name, one fsync, rename), and an eviction
/// pass each time a tenth of the limit was added.
fn write_entries(dir: &std::path::Path, limit: u64, rx: mpsc::Receiver<Put>) {
    let mut added = 0u64;
    for put in rx {
        let tag = put.version.tag();
        let entry = CacheEntry {
            url: &put.url,
            tag: &tag,
            object_size: put.version.size,
            block: put.block,
            data: &put.data,
        };
        let path = dir.join(file_name(&put.url, put.block));
        let write = || -> std::io::Result<()> {
            let mut f = stdx::fs::AtomicFile::create(&path)?;
            let mut w = std::io::BufWriter::new(f.file());
            entry.write_to(&mut w)?;
            w.flush()?;
            drop(w);
            f.commit_replaceable()
        };
        if write().is_ok() {
            added += put.data.len() as u64;
            if added > limit / 10 {
                added = 0;
                evict(dir, limit);
            }
        }
    }
}

/// Removes least recently used entries until the cache holds at most 90 % of its limit. Skipped when
/// another process is evicting.
fn evict(dir: &std::path::Path, limit: u64) {
    let Ok(_lock) = stdx::fs::DirLock::acquire(dir) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".entry"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, len, path) in entries {
        if total <= limit / 10 * 9 {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(size: u64, tag: &str) -> Version {
        Version {
            size,
            etag: Some(tag.into()),
            modified_ms: 0,
        }
    }

    #[test]
    fn entries_round_trip_and_anything_else_is_refused() {
        let e = CacheEntry {
            url: "s3://b/Köln/x.l3",
            tag: "\"abc\"",
            object_size: 5_000_000,
            block: 3,
            data: b"some bytes",
        };
        let bytes = e.to_bytes();
        assert_eq!(CacheEntry::parse(&bytes), Ok(e));
        for i in 0..bytes.len() {
            for bit in [0, 7] {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    CacheEntry::parse(&bad).is_err(),
                    "byte {i} bit {bit} flipped"
                );
            }
        }
        for n in 0..bytes.len() {
            assert!(CacheEntry::parse(&bytes[..n]).is_err(), "cut to {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(CacheEntry::parse(&longer), Err(BadEntry::Length));
    }

    #[test]
    fn blocks_hit_whatever_range_asked_first_and_bad_or_stale_entries_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = DiskCache::open(&CacheOptions {
            dir: dir.path().to_path_buf(),
            limit: 100 << 20,
        })
        .unwrap();
        let url = "s3://b/x";
        let ver = v(BLOCK + 10, "t1");
        assert!(c.get(url, &ver, 0).is_none());
        c.put(url, &ver, 0, vec![1; BLOCK as usize]);
        c.put(url, &ver, 1, vec![2; 10]);
        c.flush();
        let hit = c.get(url, &ver, 1).unwrap();
        assert_eq!(&hit.bytes[hit.data.clone()], &[2; 10]);
        assert_eq!(c.get(url, &ver, 0).unwrap().data.len(), BLOCK as usize);
        assert_eq!(c.counts.hits.load(Ordering::Relaxed), 2);

        // The object was overwritten in the bucket: its listing says so, the entry is stale.
        assert!(c.get(url, &v(BLOCK + 10, "t2"), 1).is_none());
        assert_eq!(c.counts.dropped.load(Ordering::Relaxed), 1);
        assert!(c.get(url, &ver, 1).is_none(), "a stale entry is deleted");

        // A flipped bit on disk: dropped, not served.
        let path = dir.path().join(file_name(url, 0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[FIXED + 100] ^= 4;
        std::fs::write(&path, bytes).unwrap();
        assert!(c.get(url, &ver, 0).is_none());
        assert_eq!(c.counts.dropped.load(Ordering::Relaxed), 2);
        assert!(!path.exists());
    }

    #[test]
    fn the_limit_holds_and_the_newest_entries_stay() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = DiskCache::open(&CacheOptions {
            dir: dir.path().to_path_buf(),
            limit: 100_000,
        })
        .unwrap();
        for i in 0..100 {
            c.put(&format!("s3://b/{i}"), &v(5000, "t"), 0, vec![7u8; 5000]);
            if i % 10 == 9 {
                c.flush();
            }
        }
        c.flush();
        assert!(c.bytes_held() <= 100_000 + 5200, "{}", c.bytes_held());
        assert!(
            c.get("s3://b/99", &v(5000, "t"), 0).is_some(),
            "the newest entries stay"
        );
        assert!(
            c.get("s3://b/0", &v(5000, "t"), 0).is_none(),
            "the oldest went"
        );
    }

    #[test]
    fn a_file_for_a_cache_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = DiskCache::open(&CacheOptions {
            dir: file,
            limit: 1,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("names a file"), "{e}");
    }
}
