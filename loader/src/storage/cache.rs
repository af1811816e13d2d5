//! A local cache of remote reads for repeated epochs: a folder with a byte limit, least recently used
//! entries evicted first, safe under concurrent processes (entries appear by rename, eviction holds the
//! folder's lock, a reader that loses a race simply misses). Each entry records the URL and range it holds,
//! so a hash collision is a miss, never wrong bytes.

use crate::error::{Error, Result};
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

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

#[derive(Debug)]
pub(super) struct DiskCache {
    dir: PathBuf,
    limit: u64,
    /// Bytes written since the last eviction pass: passes run once a tenth of the limit was added.
    added: AtomicU64,
}

fn key(url: &str, range: &Option<Range<u64>>) -> String {
    match range {
        Some(r) => format!("{url}#{}-{}", r.start, r.end),
        None => url.to_string(),
    }
}

/// FNV-1a: a stable file name for a key (collisions are caught by the key stored inside).
fn file_name(key: &str) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.entry")
}

impl DiskCache {
    pub fn open(o: &CacheOptions) -> Result<DiskCache> {
        std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
        stdx::fs::remove_stale_temps(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
        Ok(DiskCache {
            dir: o.dir.clone(),
            limit: o.limit,
            added: AtomicU64::new(0),
        })
    }

    pub fn get(&self, url: &str, range: Option<Range<u64>>) -> Option<Vec<u8>> {
        let k = key(url, &range);
        let path = self.dir.join(file_name(&k));
        let bytes = std::fs::read(&path).ok()?;
        let n = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        if bytes.get(4..4 + n)? != k.as_bytes() {
            return None;
        }
        // Recently used: eviction goes by modification time.
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Some(bytes[4 + n..].to_vec())
    }

    /// Stores an entry (best effort: a full disk or a race loses a cache entry, nothing else).
    pub fn put(&self, url: &str, range: Option<Range<u64>>, data: &[u8]) {
        if data.len() as u64 > self.limit / 4 {
            return;
        }
        let k = key(url, &range);
        let path = self.dir.join(file_name(&k));
        let write = || -> std::io::Result<()> {
            let mut f = stdx::fs::AtomicFile::create(&path)?;
            f.write_all(&(k.len() as u32).to_le_bytes())?;
            f.write_all(k.as_bytes())?;
            f.write_all(data)?;
            f.commit()
        };
        if write().is_ok() {
            let added =
                self.added.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
            if added > self.limit / 10 {
                self.added.store(0, Ordering::Relaxed);
                self.evict();
            }
        }
    }

    /// Removes least recently used entries until the cache holds at most 90 % of its limit. Skipped
    /// when another process is evicting.
    fn evict(&self) {
        let Ok(_lock) = stdx::fs::DirLock::acquire(&self.dir) else {
            return;
        };
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
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
            if total <= self.limit / 10 * 9 {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_the_limit_holds() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(&CacheOptions {
            dir: dir.path().to_path_buf(),
            limit: 100_000,
        })
        .unwrap();
        assert_eq!(c.get("s3://b/x", None), None);
        c.put("s3://b/x", Some(0..3), b"abc");
        assert_eq!(c.get("s3://b/x", Some(0..3)).as_deref(), Some(&b"abc"[..]));
        assert_eq!(
            c.get("s3://b/x", Some(0..4)),
            None,
            "another range is another entry"
        );
        for i in 0..100 {
            c.put(&format!("s3://b/{i}"), None, &[7u8; 5000]);
        }
        assert!(c.bytes_held() <= 100_000 + 5100, "{}", c.bytes_held());
        assert!(
            c.get("s3://b/99", None).is_some(),
            "the newest entries stay"
        );
        assert_eq!(c.get("s3://b/0", None), None, "the oldest went");
    }
}
