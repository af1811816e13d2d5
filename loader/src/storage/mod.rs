//! The read layer: where a dataset's bytes live (a local folder, or an object-store prefix such as
//! `s3://bucket/prefix`) and how they are read — one place for the bandwidth cap that models network
//! storage, the optional local cache of remote objects, and the request and byte counts.
//!
//! Keys are `/`-separated paths relative to the dataset's root. Every error names the file or the
//! object's URL.

mod cache;
mod object;

use crate::error::{Error, Result};
pub use cache::CacheOptions;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    requests: AtomicU64,
    bytes: AtomicU64,
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
                cap: options.bandwidth.map(|b| Arc::new(Bandwidth::new(b))),
                cache,
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
            Backend::Object(r) => Ok(Listing {
                files: r.list()?,
                skipped: Vec::new(),
            }),
        }
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> Result<bool> {
        match &self.inner.backend {
            Backend::Local(root) => Ok(root.join(key).is_file()),
            Backend::Object(r) => r.exists(key),
        }
    }

    /// Opens `key` for the reads of one item: a local file is opened once here and every read below
    /// shares that descriptor, which closes when the handle drops — so no descriptor outlives its item,
    /// and a file replaced or removed on disk is seen by the next item that opens it.
    pub fn open_key<'a>(&'a self, key: &'a str) -> Result<Opened<'a>> {
        let file = match &self.inner.backend {
            Backend::Local(root) => {
                let p = root.join(key);
                let f = stdx::fs::open_regular(&p).map_err(|e| Error::io(&p, e))?;
                Some((p, f))
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

    fn cached(&self, key: &str, range: Option<Range<u64>>) -> Option<Vec<u8>> {
        let c = self.inner.cache.as_ref()?;
        let Backend::Object(r) = &self.inner.backend else {
            return None;
        };
        c.get(&r.url(key), range)
    }

    fn store(&self, key: &str, range: Option<Range<u64>>, bytes: &[u8]) {
        if let (Some(c), Backend::Object(r)) = (&self.inner.cache, &self.inner.backend) {
            c.put(&r.url(key), range, bytes);
        }
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
            (None, Backend::Object(r)) => r.size(self.key),
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
                if let Some(hit) = s.cached(self.key, None) {
                    return Ok(hit);
                }
                let b = r.read(self.key, limit)?;
                s.store(self.key, None, &b);
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
                let mut missing: Vec<usize> = Vec::new();
                for (i, (range, buf)) in parts.iter_mut().enumerate() {
                    match s.cached(key, Some(range.clone())) {
                        Some(hit) if hit.len() == buf.len() => buf.copy_from_slice(&hit),
                        _ => missing.push(i),
                    }
                }
                if missing.is_empty() {
                    return Ok(0);
                }
                let ranges: Vec<Range<u64>> = missing.iter().map(|&i| parts[i].0.clone()).collect();
                let (got, requests, fetched) = r.read_ranges(key, &ranges)?;
                for (&i, bytes) in missing.iter().zip(got) {
                    let (range, buf) = &mut parts[i];
                    if bytes.len() != buf.len() {
                        return Err(Error::decode(
                            s.name(key),
                            "object",
                            format!(
                                "bytes {}..{} came back as {} bytes (is the object shorter?)",
                                range.start,
                                range.end,
                                bytes.len()
                            ),
                        ));
                    }
                    buf.copy_from_slice(&bytes);
                    s.store(key, Some(range.clone()), &bytes);
                }
                s.account(requests, fetched);
                Ok(fetched)
            }
            (None, Backend::Local(_)) => unreachable!("local keys are opened"),
        }
    }
}

/// A relative path as a `/`-separated key.
pub fn key_of(rel: &Path) -> String {
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

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
