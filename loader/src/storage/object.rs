//! Object storage (S3 and compatible) through the `object_store` crate: configured from the usual
//! environment, ranged GETs (neighbouring ranges coalesced), retries with backoff on transient errors, and
//! every failure naming the object's URL. The crate is async; a small runtime owned here runs its futures
//! for the loader's blocking reader threads. TLS is rustls with ring's cryptography (`install_tls_provider`).

use crate::error::{Error, Result};
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ObjectStore, ObjectStoreExt, RetryConfig};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Ranges of one object closer than this are fetched in one GET: a request costs a round trip, a gap this
/// size a fraction of one.
const REMOTE_GAP: u64 = 64 << 10;

pub(super) struct Remote {
    store: Arc<AmazonS3>,
    bucket: String,
    prefix: String,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url(""))
    }
}

fn io_error(e: object_store::Error) -> std::io::Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => std::io::ErrorKind::PermissionDenied,
        _ => std::io::ErrorKind::Other,
    };
    // The crate's messages repeat the source chain inline; its first line says it all.
    let text = e.to_string();
    std::io::Error::new(
        kind,
        text.lines()
            .next()
            .unwrap_or("object store error")
            .to_string(),
    )
}

/// Makes ring rustls' process-wide crypto provider unless one is installed already (by the application,
/// or by an earlier call): reqwest is built without a provider of its own (see Cargo.toml) and takes the
/// process default when it builds a client, which `AmazonS3Builder::build` does.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // An error means another thread installed one between the check and here: that one serves.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// Retries bounded by time, not by count: object_store stops at whichever of `max_retries` and
/// `retry_timeout` comes first, and six retries of a 100 ms backoff gave up on a 3 s outage after about a
/// second. Its backoff is exponential with full jitter (each wait drawn between the base and the cap).
fn retry_config(total: Duration) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: if total.is_zero() { 0 } else { usize::MAX },
        retry_timeout: total,
    }
}

impl Remote {
    /// Connects to `s3://bucket/prefix` and lists the prefix once, so a missing bucket or wrong
    /// credentials fail here, naming the URL.
    pub fn open(url: &str, retry: Duration) -> Result<Remote> {
        install_tls_provider();
        let rest = url.trim_start_matches("s3://");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::dataset(
                url,
                "no bucket in the URL (s3://bucket/prefix)",
            ));
        }
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry_config(retry));
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .unwrap_or_default();
        if endpoint.starts_with("http://") {
            b = b.with_allow_http(true);
        }
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            b = b.with_region("us-east-1");
        }
        let store = b.build().map_err(|e| Error::io(url, io_error(e)))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("l3-object-store")
            .enable_all()
            .build()
            .map_err(|e| Error::io(url, e))?;
        let remote = Remote {
            store: Arc::new(store),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            runtime,
        };
        let probe = remote.path("")?;
        remote
            .runtime
            .block_on(remote.store.list_with_delimiter(Some(&probe)))
            .map_err(|e| Error::io(remote.url(""), io_error(e)))?;
        Ok(remote)
    }

    /// The object key of `key` (relative to the prefix), exactly as written: object_store's `Path::from`
    /// percent-encodes non-ASCII bytes and `%`, which the request encodes a second time, so that
    /// `Köln/a.jpg` or `per%cent.jpg` would name another object. `Path::parse` keeps the key as it is.
    fn path(&self, key: &str) -> Result<ObjPath> {
        let full = self.key(key);
        ObjPath::parse(&full).map_err(|e| {
            Error::dataset(
                self.url(key),
                format!("not a key this client can request: {e}"),
            )
        })
    }

    /// The full object key of `key`.
    fn key(&self, key: &str) -> String {
        match (self.prefix.is_empty(), key.is_empty()) {
            (true, _) => key.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{key}", self.prefix),
        }
    }

    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(key))
    }

    fn err(&self, key: &str) -> impl Fn(object_store::Error) -> Error + '_ {
        let name = PathBuf::from(self.url(key));
        move |e| Error::io(name.clone(), io_error(e))
    }

    /// Every object under the prefix: (key relative to it, size), sorted; hidden names left out.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let root = self.path("")?;
        let metas: Vec<object_store::ObjectMeta> = self
            .runtime
            .block_on(self.store.list(Some(&root)).try_collect())
            .map_err(self.err(""))?;
        let skip = root.as_ref().len() + usize::from(!self.prefix.is_empty());
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.as_ref().get(skip..)?.to_string();
                let hidden = key.split('/').any(|c| c.starts_with('.'));
                (!hidden && !key.is_empty()).then_some((key, m.size))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    pub fn exists(&self, key: &str) -> Result<bool> {
        match self.runtime.block_on(self.store.head(&self.path(key)?)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err(key)(e)),
        }
    }

    pub fn size(&self, key: &str) -> Result<u64> {
        let meta = self
            .runtime
            .block_on(self.store.head(&self.path(key)?))
            .map_err(self.err(key))?;
        Ok(meta.size)
    }

    pub fn read(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        let name = self.url(key);
        let path = self.path(key)?;
        self.runtime.block_on(async {
            let got = self.store.get(&path).await.map_err(self.err(key))?;
            if got.meta.size > limit {
                return Err(Error::io(
                    &name,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{} bytes, over the limit of {limit} bytes", got.meta.size),
                    ),
                ));
            }
            let size = got.meta.size;
            let bytes = got.bytes().await.map_err(self.err(key))?;
            if bytes.len() as u64 != size {
                return Err(short(&name, 0..size, bytes.len()));
            }
            Ok(bytes.to_vec())
        })
    }

    /// The bytes of each range, the number of GET requests it took (neighbours coalesced) and the bytes
    /// those requests fetched (the gaps between coalesced ranges included). Every range is checked before
    /// it is requested and every body against the length asked for: an object that got shorter since it
    /// was listed, or a server that cut a body, is an error naming the URL and the bytes, never a panic
    /// or bytes of the wrong length.
    pub fn read_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
    ) -> Result<(Vec<Vec<u8>>, u64, u64)> {
        let name = self.url(key);
        if let Some(r) = ranges.iter().find(|r| r.start > r.end) {
            return Err(Error::io(
                &name,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "bytes {}..{}: a range that ends before it starts",
                        r.start, r.end
                    ),
                ),
            ));
        }
        let merged = coalesce(ranges, REMOTE_GAP);
        let path = self.path(key)?;
        let fetched: u64 = merged.iter().map(|r| r.end - r.start).sum();
        let got = self
            .runtime
            .block_on(futures::future::try_join_all(merged.iter().map(|r| {
                let (store, path, r) = (self.store.clone(), path.clone(), r.clone());
                async move {
                    if r.is_empty() {
                        return Ok(Default::default());
                    }
                    store.get_range(&path, r).await
                }
            })))
            .map_err(self.err(key))?;
        for (r, bytes) in merged.iter().zip(&got) {
            if bytes.len() as u64 != r.end - r.start {
                return Err(short(&name, r.clone(), bytes.len()));
            }
        }
        let out = ranges
            .iter()
            .map(|r| {
                // The merged range that holds `r`: the last one starting at or before it.
                let i = merged.partition_point(|m| m.start <= r.start) - 1;
                let at = (r.start - merged[i].start) as usize;
                got[i][at..at + (r.end - r.start) as usize].to_vec()
            })
            .collect();
        let requests = merged.iter().filter(|r| !r.is_empty()).count() as u64;
        Ok((out, requests, fetched))
    }
}

/// `ranges` sorted and merged where they overlap or lie within `gap` bytes of each other: what one GET
/// each fetches. Every input range lies inside exactly one output range.
fn coalesce(ranges: &[Range<u64>], gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.to_vec();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(m) if r.start <= m.end.saturating_add(gap) => m.end = m.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// A body shorter (or longer) than asked for.
fn short(name: &str, asked: Range<u64>, got: usize) -> Error {
    Error::io(
        name,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "bytes {}..{} came back as {got} bytes: the object changed since it was listed, or the \
                 server cut the body short",
                asked.start, asked.end
            ),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::coalesce;

    #[test]
    fn coalesced_ranges_hold_every_range_once() {
        let ranges = [50..60, 0..10, 5..8, 100..100, 12..20, 1000..2000, 61..61];
        let merged = coalesce(&ranges, 4);
        assert_eq!(merged, vec![0..20, 50..61, 100..100, 1000..2000]);
        for r in &ranges {
            let holding = merged
                .iter()
                .filter(|m| m.start <= r.start && r.end <= m.end)
                .count();
            assert!(holding >= 1, "{r:?}");
        }
        assert_eq!(coalesce(&[], 4), vec![]);
        assert_eq!(coalesce(&[0..u64::MAX, 5..6], u64::MAX), vec![0..u64::MAX]);
    }
}
