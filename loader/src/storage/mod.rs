//! The read layer: where a dataset's bytes live (a local folder, or an object-store prefix such as
//! `s3://bucket/prefix`) and how they are read — one place for the bandwidth cap that models network
//! storage, the optional local cache of remote objects, and the request and byte counts.
//!
//! Keys are `/`-separated paths relative to the dataset's root. Every error names the file or the
//! object's URL.

mod cache;
mod object;

use crate::error::{Error, Result};
pub use cache::{BadEntry, CacheEntry, CacheOptions};
use object::Version;
pub use object::s3_error;
use std::collections::HashMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use stdx::Bandwidth;

/// How a dataset location is opened.
#[derive(Clone, Debug, Default)]
pub struct StorageOptions {
    /// Cap on read bandwidth, in bytes per second, shared by every reader of the dataset: a model of
    /// network storage (see [`stdx::Bandwidth`]).
    pub bandwidth: Option<u64>,
    /// A local cache of remote objects (ignored for local datasets).
    pub cache: Option<CacheOptions>,
    /// How long a failing object-store request is retried (backoff with jitter) before the read fails;
    /// `None`: [`DEFAULT_RETRY`].
    pub retry: Option<std::time::Duration>,
}

/// How long object-store requests are retried by default: a minute, like the cloud SDKs, so that a
/// server restart or a burst of SlowDown is ridden out rather than ending a training run.
pub const DEFAULT_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

impl StorageOptions {
    /// The bandwidth cap in bytes per second for `mbps` MB/s (10⁶ bytes, as `--storage-mbps` and
    /// Python's `storage_mbps=` take it); `None` unless it is positive, finite and fits.
    pub fn bytes_per_sec(mbps: f64) -> Option<u64> {
        let b = mbps * 1e6;
        (b.is_finite() && b >= 1.0 && b < u64::MAX as f64).then_some(b as u64)
    }
}

/// A dataset's root: local or remote, with its read policy. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct Storage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    cap: Option<Arc<Bandwidth>>,
    cache: Option<cache::DiskCache>,
    /// The version of each object as the last listing (or a HEAD) saw it: what reads and cache entries
    /// are checked against.
    versions: RwLock<HashMap<String, Version>>,
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// What a dataset's storage did since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Read requests (ranged reads one each, coalesced ones once; cache hits none).
    pub requests: u64,
    /// Bytes moved from the storage (the gaps coalescing fetched included; cache hits excluded).
    pub bytes_read: u64,
    /// Requests that failed transiently (in transit, 5xx, 429) or came back broken, and were tried again.
    pub retries: u64,
    /// Cache blocks found intact and served.
    pub cache_hits: u64,
    /// Cache blocks looked for and fetched from the storage.
    pub cache_misses: u64,
    /// Bytes served from the cache.
    pub cache_hit_bytes: u64,
    /// Cache entries found corrupt or stale (the object changed), deleted and fetched again.
    pub cache_dropped: u64,
}

impl StorageStats {
    /// Share of cache lookups that hit, 0 to 1 (0 with no lookups).
    pub fn cache_hit_rate(&self) -> f64 {
        self.cache_hits as f64 / (self.cache_hits + self.cache_misses).max(1) as f64
    }
}

#[derive(Debug)]
enum Backend {
    Local(PathBuf),
    Object(object::Remote),
}

/// What [`Storage::list`] found.
#[derive(Debug, Default, Clone)]
pub struct Listing {
    /// (key, size in bytes), sorted by key.
    pub files: Vec<(String, u64)>,
    /// What was left out, one line each (special files, folders reached twice).
    pub skipped: Vec<String>,
}

impl Storage {
    /// Opens `location`: a local folder, or `s3://bucket/prefix` (configured from the usual `AWS_*`
    /// environment: `AWS_ENDPOINT_URL`, credentials, region).
    pub fn open(location: &str, options: &StorageOptions) -> Result<Storage> {
        let cap = options.bandwidth.map(|b| Arc::new(Bandwidth::new(b)));
        Self::open_capped(location, options, cap)
    }

    /// Opens another location (files kept beside a dataset, such as its masks) with `options`, sharing
    /// this storage's bandwidth cap, so that both together stay under it.
    pub fn open_beside(&self, location: &str, options: &StorageOptions) -> Result<Storage> {
        Self::open_capped(location, options, self.inner.cap.clone())
    }

    fn open_capped(
        location: &str,
        options: &StorageOptions,
        cap: Option<Arc<Bandwidth>>,
    ) -> Result<Storage> {
        let backend = if location.starts_with("s3://") {
            Backend::Object(object::Remote::open(
                location,
                options.retry.unwrap_or(DEFAULT_RETRY),
            )?)
        } else {
            let p = PathBuf::from(location);
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(Error::dataset(&p, "not a folder")),
                Err(e) => return Err(Error::io(&p, e)),
            }
            Backend::Local(p)
        };
        let cache = match (&backend, &options.cache) {
            (Backend::Object(_), Some(c)) => Some(cache::DiskCache::open(c)?),
            _ => None,
        };
        Ok(Storage {
            inner: Arc::new(Inner {
                backend,
                cap,
                cache,
                versions: RwLock::default(),
                requests: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        })
    }

    /// A local folder, read without a cap.
    pub fn local(root: impl Into<PathBuf>) -> Storage {
        Storage {
            inner: Arc::new(Inner {
                backend: Backend::Local(root.into()),
                cap: None,
                cache: None,
                versions: RwLock::default(),
                requests: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Whether the dataset lives in an object store.
    pub fn is_remote(&self) -> bool {
        matches!(self.inner.backend, Backend::Object(_))
    }

    /// The root, as given (a path or a URL).
    pub fn root(&self) -> String {
        match &self.inner.backend {
            Backend::Local(p) => p.display().to_string(),
            Backend::Object(r) => r.url(""),
        }
    }

    /// The local folder, for datasets that are local.
    pub fn local_root(&self) -> Option<&Path> {
        match &self.inner.backend {
            Backend::Local(p) => Some(p),
            Backend::Object(_) => None,
        }
    }

    /// Where `key` lives: a path or a URL, for messages.
    pub fn name(&self, key: &str) -> PathBuf {
        match &self.inner.backend {
            Backend::Local(p) => p.join(key),
            Backend::Object(r) => PathBuf::from(r.url(key)),
        }
    }

    /// The folder of the local cache of remote objects, if one is on.
    pub(crate) fn cache_dir(&self) -> Option<&Path> {
        self.inner.cache.as_ref().map(|c| c.dir())
    }

    /// What identifies the version of remote `key` the last listing saw (its ETag, else its
    /// last-modified time); `None` for local storage or a key not listed.
    pub(crate) fn version_tag(&self, key: &str) -> Option<String> {
        let known = self
            .inner
            .versions
            .read()
            .unwrap_or_else(|p| p.into_inner());
        known.get(key).map(Version::tag)
    }

    /// Remote `key`'s ETag (as listed, quotes kept) and last-modified time in milliseconds, as the last
    /// listing saw them; `None` for local storage or a key not listed.
    pub(crate) fn listed_version(&self, key: &str) -> Option<(Option<String>, i64)> {
        let known = self
            .inner
            .versions
            .read()
            .unwrap_or_else(|p| p.into_inner());
        known.get(key).map(|v| (v.etag.clone(), v.modified_ms))
    }

    /// The bandwidth cap, if any.
    pub fn bandwidth(&self) -> Option<u64> {
        self.inner.cap.as_ref().map(|c| c.rate())
    }

    /// Read requests made so far (ranged reads count one each; cache hits none).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Bytes read from the storage so far (cache hits excluded).
    pub fn bytes_read(&self) -> u64 {
        self.inner.bytes.load(Ordering::Relaxed)
    }

    /// Everything counted so far.
    pub fn stats(&self) -> StorageStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut s = StorageStats {
            requests: self.requests(),
            bytes_read: self.bytes_read(),
            ..StorageStats::default()
        };
        if let Backend::Object(r) = &self.inner.backend {
            s.retries = load(&r.counts().retries);
        }
        if let Some(c) = &self.inner.cache {
            s.cache_hits = load(&c.counts.hits);
            s.cache_misses = load(&c.counts.misses);
            s.cache_hit_bytes = load(&c.counts.hit_bytes);
            s.cache_dropped = load(&c.counts.dropped);
        }
        s
    }

    /// The version of remote `key` that reads are checked against: as listed, else (when the cache needs
    /// one to validate its entries) as a HEAD finds it now, remembered.
    fn version(&self, r: &object::Remote, key: &str) -> Result<Option<Version>> {
        let known = self
            .inner
            .versions
            .read()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(v) = known.get(key) {
            return Ok(Some(v.clone()));
        }
        drop(known);
        if self.inner.cache.is_none() {
            return Ok(None);
        }
        let v = r.head(key)?;
        if let Some(v) = &v {
            self.inner
                .versions
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_string(), v.clone());
        }
        Ok(v)
    }

    fn account(&self, requests: u64, bytes: u64) {
        self.inner.requests.fetch_add(requests, Ordering::Relaxed);
        self.inner.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(cap) = &self.inner.cap {
            cap.take(bytes);
        }
    }

    /// Every file under the root, recursively (local: symlinks followed, loops and special files left out
    /// with a note; remote: every object under the prefix). Hidden names are ignored.
    pub fn list(&self) -> Result<Listing> {
        match &self.inner.backend {
            Backend::Local(root) => {
                let walk = stdx::fs::walk(root).map_err(|e| Error::io(root, e))?;
                let mut files = Vec::with_capacity(walk.files.len());
                for rel in walk.files {
                    let len = std::fs::metadata(root.join(&rel)).map_or(0, |m| m.len());
                    files.push((key_of(&rel), len));
                }
                let skipped = walk
                    .skipped
                    .into_iter()
                    .map(|(rel, why)| format!("{}: skipped, {why}", root.join(rel).display()))
                    .collect();
                Ok(Listing { files, skipped })
            }
            Backend::Object(r) => {
                let listed = r.list()?;
                let files = listed.iter().map(|(k, v)| (k.clone(), v.size)).collect();
                *self
                    .inner
                    .versions
                    .write()
                    .unwrap_or_else(|p| p.into_inner()) = listed.into_iter().collect();
                Ok(Listing {
                    files,
                    skipped: Vec::new(),
                })
            }
        }
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> Result<bool> {
        match &self.inner.backend {
            Backend::Local(root) => Ok(local_path(root, key).is_file()),
            Backend::Object(r) => Ok(r.head(key)?.is_some()),
        }
    }

    /// Opens `key` for the reads of one item: a local file is opened once here and every read below
    /// shares that descriptor, which closes when the handle drops — so no descriptor outlives its item,
    /// and a file replaced or removed on disk is seen by the next item that opens it.
    pub fn open_key<'a>(&'a self, key: &'a str) -> Result<Opened<'a>> {
        let file = match &self.inner.backend {
            Backend::Local(root) => {
                let f = stdx::fs::open_regular(local_path(root, key))
                    .map_err(|e| Error::io(root.join(key), e))?;
                Some((root.join(key), f))
            }
            Backend::Object(_) => None,
        };
        Ok(Opened {
            storage: self,
            key,
            file,
        })
    }

    /// The size of `key` in bytes.
    pub fn size(&self, key: &str) -> Result<u64> {
        self.open_key(key)?.size()
    }

    /// The whole of `key`, refused when larger than `limit` bytes.
    pub fn read(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        self.open_key(key)?.read(limit)
    }

    /// Bytes `range` of `key`, in one request.
    pub fn read_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>> {
        self.open_key(key)?.read_range(range)
    }

    /// Fills each buffer with its range of `key`; see [`Opened::read_ranges_into`].
    pub fn read_ranges_into(
        &self,
        key: &str,
        parts: &mut [(Range<u64>, &mut [u8])],
    ) -> Result<u64> {
        self.open_key(key)?.read_ranges_into(parts)
    }
}

/// One key opened for the reads of one item (see [`Storage::open_key`]).
#[derive(Debug)]
pub struct Opened<'a> {
    storage: &'a Storage,
    key: &'a str,
    /// The open file and its path, for local storage.
    file: Option<(PathBuf, std::fs::File)>,
}

impl Opened<'_> {
    /// Where it lives: a path or a URL, for messages.
    pub fn name(&self) -> PathBuf {
        self.storage.name(self.key)
    }

    /// The size in bytes.
    pub fn size(&self) -> Result<u64> {
        match (&self.file, &self.storage.inner.backend) {
            (Some((p, f)), _) => Ok(f.metadata().map_err(|e| Error::io(p, e))?.len()),
            (None, Backend::Object(r)) => match self.storage.version(r, self.key)? {
                Some(v) => Ok(v.size),
                None => r.head(self.key)?.map(|v| v.size).ok_or_else(|| {
                    Error::io(
                        self.name(),
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
                    )
                }),
            },
            (None, Backend::Local(_)) => unreachable!("local keys are opened"),
        }
    }

    /// The whole object, refused when larger than `limit` bytes.
    pub fn read(&self, limit: u64) -> Result<Vec<u8>> {
        let s = self.storage;
        let bytes = match (&self.file, &s.inner.backend) {
            (Some((p, f)), _) => {
                let len = f.metadata().map_err(|e| Error::io(p, e))?.len();
                if len > limit {
                    return Err(Error::io(
                        p,
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("{len} bytes, over the limit of {limit} bytes"),
                        ),
                    ));
                }
                let mut bytes = vec![0u8; len as usize];
                f.read_exact_at(&mut bytes, 0)
                    .map_err(|e| Error::io(p, e))?;
                bytes
            }
            (None, Backend::Object(r)) => {
                let version = s.version(r, self.key)?;
                if let (Some(_), Some(v)) = (&s.inner.cache, &version)
                    && v.size <= limit
                {
                    let mut bytes = vec![0u8; v.size as usize];
                    self.read_ranges_into(&mut [(0..v.size, &mut bytes[..])])?;
                    return Ok(bytes);
                }
                let (b, _) = r.read(self.key, limit, version.as_ref())?;
                b
            }
            (None, Backend::Local(_)) => unreachable!("local keys are opened"),
        };
        s.account(1, bytes.len() as u64);
        Ok(bytes)
    }

    /// Bytes `range`, in one request.
    pub fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        self.read_ranges_into(&mut [(range, &mut buf[..])])?;
        Ok(buf)
    }

    /// Fills each buffer with its range. Local files: one `pread` each; object stores: ranged GETs, the
    /// ranges coalesced where they are close. Returns the bytes moved from the storage: the gaps
    /// coalescing fetched included, cache hits excluded.
    pub fn read_ranges_into(&self, parts: &mut [(Range<u64>, &mut [u8])]) -> Result<u64> {
        let s = self.storage;
        let key = self.key;
        match (&self.file, &s.inner.backend) {
            (Some((p, f)), _) => {
                let mut n = 0;
                for (r, buf) in parts.iter_mut() {
                    f.read_exact_at(buf, r.start).map_err(|e| Error::io(p, e))?;
                    n += buf.len() as u64;
                }
                s.account(parts.len() as u64, n);
                Ok(n)
            }
            (None, Backend::Object(r)) => {
                let version = s.version(r, key)?;
                if let (Some(c), Some(v)) = (&s.inner.cache, &version) {
                    return self.read_blocks(r, c, v, parts);
                }
                let ranges: Vec<Range<u64>> = parts.iter().map(|p| p.0.clone()).collect();
                let (got, requests, fetched) = r.read_ranges(key, &ranges, version.as_ref())?;
                for ((_, buf), bytes) in parts.iter_mut().zip(got) {
                    buf.copy_from_slice(&bytes);
                }
                s.account(requests, fetched);
                Ok(fetched)
            }
            (None, Backend::Local(_)) => unreachable!("local keys are opened"),
        }
    }
}

impl Opened<'_> {
    /// `parts` through the cache: the aligned blocks that cover them, each from an intact entry of this
    /// version of the object or fetched (the missing ones together, coalesced) and then queued for
    /// the cache. A hit is copied once, from the entry into the caller's buffer.
    fn read_blocks(
        &self,
        r: &object::Remote,
        c: &cache::DiskCache,
        v: &Version,
        parts: &mut [(Range<u64>, &mut [u8])],
    ) -> Result<u64> {
        let (s, key) = (self.storage, self.key);
        let ranges: Vec<Range<u64>> = parts.iter().map(|p| p.0.clone()).collect();
        // Out-of-bounds ranges are refused, naming the object, before any block is looked up.
        r.check_ranges(key, &ranges, Some(v))?;
        let mut blocks: Vec<u64> = ranges
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / cache::BLOCK..=(r.end - 1) / cache::BLOCK)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let url = r.url(key);
        let mut held: HashMap<u64, (Vec<u8>, Range<usize>)> = HashMap::with_capacity(blocks.len());
        let mut missing = Vec::new();
        for &b in &blocks {
            match c.get(&url, v, b) {
                Some(hit) => {
                    held.insert(b, (hit.bytes, hit.data));
                }
                None => missing.push(b),
            }
        }
        let mut fetched_bytes = 0;
        if !missing.is_empty() {
            let wanted: Vec<Range<u64>> = missing
                .iter()
                .map(|&b| b * cache::BLOCK..b * cache::BLOCK + cache::block_len(v.size, b))
                .collect();
            let (got, requests, fetched) = r.read_ranges(key, &wanted, Some(v))?;
            s.account(requests, fetched);
            fetched_bytes = fetched;
            for (&b, bytes) in missing.iter().zip(got) {
                let n = bytes.len();
                held.insert(b, (bytes, 0..n));
            }
        }
        for (range, buf) in parts.iter_mut() {
            let mut at = range.start;
            while at < range.end {
                let b = at / cache::BLOCK;
                let (bytes, data) = &held[&b];
                let from = data.start + (at - b * cache::BLOCK) as usize;
                let n = (range.end.min((b + 1) * cache::BLOCK) - at) as usize;
                let to = (at - range.start) as usize;
                buf[to..to + n].copy_from_slice(&bytes[from..from + n]);
                at += n as u64;
            }
        }
        for b in missing {
            if let Some((bytes, _)) = held.remove(&b) {
                c.put(&url, v, b, bytes);
            }
        }
        Ok(fetched_bytes)
    }
}

/// A relative path as a `/`-separated key. Names are bytes on Unix and need not be UTF-8: a component
/// that is not keeps its valid parts and writes each other byte as `\xNN`, so that every name the OS
/// allows has a key (shown so in messages and traces) that [`path_of`] turns back into it.
pub fn key_of(rel: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    rel.components()
        .map(|c| {
            let bytes = c.as_os_str().as_bytes();
            let Ok(name) = std::str::from_utf8(bytes) else {
                return escaped(bytes);
            };
            name.to_string()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A name that is not UTF-8, as text: its valid parts as they are (a backslash as `\x5C`, so that every
/// backslash in it starts an escape), each other byte as `\xNN`.
fn escaped(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\x5C"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

/// The relative path a key of [`key_of`] names: `\xNN` escapes are turned back into bytes in a
/// component only where that gives a name that is not UTF-8 (which `key_of` alone writes that way), so a
/// UTF-8 name that happens to hold the text `\x41` stays as it is.
pub fn path_of(key: &str) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let mut out = PathBuf::new();
    for comp in key.split('/') {
        let raw = unescape_bytes(comp);
        if std::str::from_utf8(&raw).is_err() {
            out.push(std::ffi::OsStr::from_bytes(&raw));
        } else {
            out.push(comp);
        }
    }
    out
}

/// Where `key` lives under `root`. A UTF-8 name whose text reads like escapes of bytes that are not
/// (`a\xFE.png`, typed as such) is the one name two files could share a key with: the file that exists
/// wins, the decoded name first.
fn local_path(root: &Path, key: &str) -> PathBuf {
    let decoded = root.join(path_of(key));
    if key.contains('\\') && !decoded.exists() {
        let literal = root.join(key);
        if literal.exists() {
            return literal;
        }
    }
    decoded
}

fn unescape_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'\\'
            && b.get(i + 1) == Some(&b'x')
            && let (Some(hi), Some(lo)) = (
                b.get(i + 2).and_then(|&c| hex(c)),
                b.get(i + 3).and_then(|&c| hex(c)),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_key_that_names_it_again() {
        use std::os::unix::ffi::OsStrExt;
        let mut rng = stdx::SplitMix64::new(7);
        for n in 0..2000 {
            let len = 1 + rng.index(12);
            let comp: Vec<u8> = (0..len)
                .map(|_| match rng.index(4) {
                    0 => b"\\x4F"[rng.index(4)],
                    1 => 0x80 + rng.index(128) as u8,
                    _ => b'a' + rng.index(26) as u8,
                })
                .filter(|&b| b != b'/')
                .collect();
            let rel = Path::new("class").join(std::ffi::OsStr::from_bytes(&comp));
            let key = key_of(&rel);
            let text = std::str::from_utf8(&comp);
            if text.is_ok_and(|t| std::str::from_utf8(&unescape_bytes(t)).is_err()) {
                // A UTF-8 name typed like escapes: resolved by which file exists (below).
                continue;
            }
            assert_eq!(path_of(&key), rel, "{n}: {key}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("typed\\xFE.png"), b"literal").unwrap();
        let s = Storage::local(dir.path());
        assert_eq!(s.read("typed\\xFE.png", 100).unwrap(), b"literal");
        std::fs::write(
            dir.path()
                .join(std::ffi::OsStr::from_bytes(b"typed\xFE.png")),
            b"bytes",
        )
        .unwrap();
        assert_eq!(
            s.read("typed\\xFE.png", 100).unwrap(),
            b"bytes",
            "the decoded name first"
        );
        assert_eq!(
            key_of(Path::new(std::ffi::OsStr::from_bytes(b"bad\xfe.png"))),
            "bad\\xFE.png"
        );
        assert_eq!(
            path_of("K\u{f6}ln/a\\x41.png"),
            Path::new("K\u{f6}ln/a\\x41.png")
        );
    }

    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
    }

    #[test]
    fn one_item_reads_through_one_descriptor_that_closes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..200 {
            std::fs::write(dir.path().join(format!("{i}.bin")), [i as u8; 100]).unwrap();
        }
        let s = Storage::local(dir.path());
        let before = open_descriptors();
        for i in 0..200 {
            let key = format!("{i}.bin");
            let item = s.open_key(&key).unwrap();
            assert_eq!(item.size().unwrap(), 100);
            let mut buf = [0u8; 10];
            item.read_ranges_into(&mut [(20..30, &mut buf[..])])
                .unwrap();
            assert_eq!(buf, [i as u8; 10]);
            assert_eq!(item.read(100).unwrap(), vec![i as u8; 100]);
        }
        // While an item is open it holds one descriptor; none outlives it (other tests of this process
        // may hold a few descriptors of their own meanwhile).
        assert!(open_descriptors() <= before + 8);
        // A removed file is seen at once: nothing keeps it open.
        std::fs::remove_file(dir.path().join("5.bin")).unwrap();
        let e = s.read("5.bin", 100).unwrap_err().to_string();
        assert!(e.contains("5.bin"), "{e}");
        // A file over the limit is refused before it is read, naming it.
        let e = s.read("0.bin", 99).unwrap_err().to_string();
        assert!(
            e.contains("0.bin") && e.contains("over the limit of 99 bytes"),
            "{e}"
        );
    }
}
