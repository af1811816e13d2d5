//! Object storage (S3 and compatible) through the `object_store` crate: configured from the usual
//! environment, ranged GETs (neighbouring ranges coalesced), retries with backoff on transient errors, and
//! every failure naming the object's URL. The crate is async; a small runtime owned here runs its futures
//! for the loader's blocking reader threads. TLS is rustls with ring's cryptography (`install_tls_provider`).
//!
//! Retries happen at two levels within one time budget: object_store retries a request that failed to
//! send or got a 5xx/429 (and a GET body cut mid-transfer), and [`Remote::retrying`] retries what it does
//! not — a listing whose body broke off or came back truncated, a body shorter than its range. Every
//! response is checked against the version of the object the listing saw (size and ETag): an object
//! replaced since is an error that says so, never bytes from two versions.

use crate::error::{Error, Result};
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig,
};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Ranges of one object closer than this are fetched in one GET: a request costs a round trip, a gap this
/// size a fraction of one.
const REMOTE_GAP: u64 = 64 << 10;

/// Which version of an object a listing (or a HEAD, or a GET) saw: its size, its ETag when the store
/// gives one, and its last-modified time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Version {
    pub size: u64,
    pub etag: Option<String>,
    pub modified_ms: i64,
}

impl Version {
    fn of(meta: &object_store::ObjectMeta) -> Version {
        Version {
            size: meta.size,
            etag: meta.e_tag.clone(),
            modified_ms: meta.last_modified.timestamp_millis(),
        }
    }

    /// What identifies this version in a cache entry: the ETag, else the last-modified time.
    pub fn tag(&self) -> String {
        match &self.etag {
            Some(e) => e.clone(),
            None => format!("modified {}", self.modified_ms),
        }
    }

    /// Whether `now` is another version of the object than `self`: another ETag when both have one,
    /// else another last-modified second (listings give milliseconds, GET headers whole seconds); and,
    /// where `now` came with a Content-Range (whose total is the object's size), another size.
    fn replaced_by(&self, now: &Version, sized: bool) -> bool {
        let other = match (&self.etag, &now.etag) {
            (Some(a), Some(b)) => a != b,
            _ => self.modified_ms.div_euclid(1000) != now.modified_ms.div_euclid(1000),
        };
        other || (sized && self.size != now.size)
    }
}

/// Counts of what went over the wire, shared with the HTTP client.
#[derive(Debug, Default)]
pub(super) struct WireCounts {
    /// Requests that failed in transit or with a 5xx/429 status, and bodies found broken or short:
    /// each one retried while the retry time lasts.
    pub retries: AtomicU64,
}

/// The HTTP client object_store uses, with a count of the attempts that failed transiently (object_store
/// retries those inside a call, out of sight of its caller).
#[derive(Debug)]
struct Counting(Arc<WireCounts>);

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counts: Arc<WireCounts>,
}

impl HttpConnector for Counting {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            counts: self.0.clone(),
        }))
    }
}

#[async_trait::async_trait]
impl object_store::client::HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        let r = self.inner.execute(req).await;
        let transient = match &r {
            Ok(resp) => resp.status().is_server_error() || resp.status().as_u16() == 429,
            Err(_) => true,
        };
        if transient {
            self.counts.retries.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

pub(super) struct Remote {
    store: Arc<AmazonS3>,
    bucket: String,
    prefix: String,
    retry: Duration,
    counts: Arc<WireCounts>,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url(""))
    }
}

/// An S3 error document's code and message (`<Error><Code>NoSuchBucket</Code><Message>…</Message>`),
/// wherever it sits in `text`; `None` when there is none. Entities are unescaped.
pub fn s3_error(text: &str) -> Option<(String, String)> {
    fn element<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{name}>"))? + start;
        Some(&text[start..end])
    }
    let doc = &text[text.find("<Error>")?..];
    let code = unescape(element(doc, "Code")?.trim());
    let message = element(doc, "Message").map_or_else(String::new, |m| unescape(m.trim()));
    (!code.is_empty()).then_some((code, message))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Whether the client found no credentials at all: the builder then asks the instance-metadata service
/// (169.254.169.254), and its failure reads as a request to that address.
fn no_credentials(text: &str) -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let configured = set("AWS_ACCESS_KEY_ID")
        || set("AWS_WEB_IDENTITY_TOKEN_FILE")
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || set("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    !configured && (text.contains("169.254.169.254") || text.contains("credentials"))
}

/// The HTTP status an object_store error reports, if any (its text is the only public trace of it).
fn status_of(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// Whether trying again may help: a failure in transit, a broken or truncated response, a 5xx, 429 or
/// 408 — not a missing object, refused credentials or any other answer the server meant.
fn transient(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { .. } => {
            let text = e.to_string();
            if no_credentials(&text) {
                return false;
            }
            match status_of(&text) {
                Some(s) => s >= 500 || s == 429 || s == 408,
                None => true,
            }
        }
        _ => false,
    }
}

/// `e` as an I/O error whose one-line message says what the server said: the S3 error code and message
/// rather than the raw XML, and what to do when no credentials were found.
fn io_error(e: object_store::Error) -> std::io::Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => std::io::ErrorKind::PermissionDenied,
        _ => std::io::ErrorKind::Other,
    };
    let text = e.to_string();
    // The crate's messages repeat the source chain inline; the part before any XML says what failed.
    let head = text
        .split("<?xml")
        .next()
        .unwrap_or_default()
        .split("<Error>")
        .next()
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("object store error")
        .trim_end_matches([' ', ':'])
        .to_string();
    let message = if no_credentials(&text) {
        format!(
            "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
             AWS_SKIP_SIGNATURE=true for a public bucket): {head}"
        )
    } else {
        match s3_error(&text) {
            Some((code, msg)) if msg.is_empty() => format!("{head}: {code}"),
            Some((code, msg)) => format!("{head}: {code}: {msg}"),
            None => head,
        }
    };
    std::io::Error::new(kind, message)
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

/// object_store's retries, bounded by time, not by count: it stops at whichever of `max_retries` and
/// `retry_timeout` comes first, and six retries of a 100 ms backoff gave up on a 3 s outage after about a
/// second. Its backoff is exponential with full jitter (each wait drawn between the base and the cap).
fn retry_config(total: Duration) -> RetryConfig {
    RetryConfig {
        backoff: backoff(),
        max_retries: if total.is_zero() { 0 } else { usize::MAX },
        retry_timeout: total,
    }
}

fn backoff() -> BackoffConfig {
    BackoffConfig {
        init_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(5),
        base: 2.0,
    }
}

/// How long one request may take before it counts as failed (and is retried): object_store's 30 s, or
/// the whole retry time when that is shorter (but at least 5 s, for a large body on a slow link) — so a
/// server that stalls is given up on within the time the user allowed for retries, not after it.
fn request_timeout(retry: Duration) -> Duration {
    retry.clamp(Duration::from_secs(5), Duration::from_secs(30))
}

/// One attempt's failure, and whether trying again may help.
type Failed = (Error, bool);

/// Runs `op` until it succeeds, fails for good, or `total` has passed, waiting between attempts with
/// exponential backoff and full jitter (as object_store and the cloud SDKs do); each retry is counted.
async fn retrying<T, F, Fut>(total: Duration, counts: &WireCounts, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, Failed>>,
{
    let start = Instant::now();
    let cfg = backoff();
    let mut cap = cfg.init_backoff;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = stdx::SplitMix64::new(seed);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err((e, true)) => {
                let wait = cap.mul_f64(rng.unit_f64());
                if start.elapsed() + wait >= total {
                    return Err(e);
                }
                counts.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(wait).await;
                cap = cap.mul_f64(cfg.base).min(cfg.max_backoff);
            }
            Err((e, false)) => return Err(e),
        }
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
        let counts = Arc::new(WireCounts::default());
        let timeout = format!("{}s", request_timeout(retry).as_secs());
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry_config(retry))
            .with_http_connector(Counting(counts.clone()))
            .with_config(
                object_store::aws::AmazonS3ConfigKey::Client(
                    object_store::ClientConfigKey::Timeout,
                ),
                &timeout,
            );
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
            retry,
            counts,
            runtime,
        };
        let probe = remote.path("")?;
        let (this, probe) = (&remote, &probe);
        remote.run(move || async move {
            this.store
                .list_with_delimiter(Some(probe))
                .await
                .map_err(this.failed(""))
        })?;
        Ok(remote)
    }

    /// Runs `op` with retries (see [`retrying`]) on this remote's runtime.
    fn run<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failed>>,
    {
        self.runtime
            .block_on(retrying(self.retry, &self.counts, op))
    }

    /// The counts of what went over the wire.
    pub fn counts(&self) -> &WireCounts {
        &self.counts
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

    /// The error naming `key`'s URL, with whether it is worth a retry.
    fn failed(&self, key: &str) -> impl Fn(object_store::Error) -> Failed + '_ {
        let name = PathBuf::from(self.url(key));
        move |e| {
            let t = transient(&e);
            (Error::io(name.clone(), io_error(e)), t)
        }
    }

    /// Every object under the prefix: (key relative to it, the version listed), sorted; hidden names
    /// left out. A listing cut off or garbled in transit is retried.
    pub fn list(&self) -> Result<Vec<(String, Version)>> {
        let root = self.path("")?;
        let (this, root_ref) = (self, &root);
        let metas: Vec<object_store::ObjectMeta> = self.run(move || async move {
            this.store
                .list(Some(root_ref))
                .try_collect()
                .await
                .map_err(this.failed(""))
        })?;
        let skip = root.as_ref().len() + usize::from(!self.prefix.is_empty());
        let mut out: Vec<(String, Version)> = metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.as_ref().get(skip..)?.to_string();
                let hidden = key.split('/').any(|c| c.starts_with('.'));
                (!hidden && !key.is_empty()).then(|| (key, Version::of(&m)))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The version of `key` now; `None` when there is no such object.
    pub fn head(&self, key: &str) -> Result<Option<Version>> {
        let path = self.path(key)?;
        let (this, path) = (self, &path);
        self.run(move || async move {
            match this.store.head(path).await {
                Ok(meta) => Ok(Some(Version::of(&meta))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(this.failed(key)(e)),
            }
        })
    }

    /// The error for a response from another version of the object than the listing saw.
    fn changed(&self, key: &str, listed: &Version, now: &Version) -> Error {
        Error::io(
            self.url(key),
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the object changed since it was listed ({} bytes, {} then; {} bytes, {} now): open \
                     the dataset again to read the new version",
                    listed.size,
                    listed.tag(),
                    now.size,
                    now.tag()
                ),
            ),
        )
    }

    /// One GET of `range` (or the whole object), checked: from the version `expect` (when known), and
    /// exactly as long as asked. A short body of an unchanged object is worth a retry.
    async fn get(
        &self,
        key: &str,
        path: &ObjPath,
        range: Option<Range<u64>>,
        expect: Option<&Version>,
        limit: u64,
    ) -> std::result::Result<(bytes::Bytes, Version), Failed> {
        let name = self.url(key);
        let options = GetOptions {
            range: range.clone().map(GetRange::Bounded),
            ..GetOptions::default()
        };
        let got = self
            .store
            .get_opts(path, options)
            .await
            .map_err(self.failed(key))?;
        let now = Version::of(&got.meta);
        // Another version is an error; a whole body whose Content-Length disagrees with the listing
        // (a cut body the headers agree with) is a response that lies, worth a retry.
        if let Some(listed) = expect
            && listed.replaced_by(&now, range.is_some())
        {
            return Err((self.changed(key, listed, &now), false));
        }
        let size = expect.map_or(now.size, |v| v.size);
        if range.is_none() && size > limit {
            return Err((
                Error::io(
                    &name,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{size} bytes, over the limit of {limit} bytes"),
                    ),
                ),
                false,
            ));
        }
        let asked = range.unwrap_or(0..size);
        let bytes = got.bytes().await.map_err(self.failed(key))?;
        if bytes.len() as u64 != asked.end - asked.start {
            return Err((short(&name, asked, bytes.len()), true));
        }
        Ok((bytes, now))
    }

    /// The whole of `key` (refused when larger than `limit` bytes) and the version it came from.
    pub fn read(
        &self,
        key: &str,
        limit: u64,
        expect: Option<&Version>,
    ) -> Result<(Vec<u8>, Version)> {
        if let Some(v) = expect
            && v.size > limit
        {
            return Err(Error::io(
                self.url(key),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} bytes, over the limit of {limit} bytes", v.size),
                ),
            ));
        }
        let path = self.path(key)?;
        let (this, path) = (self, &path);
        let (bytes, v) =
            self.run(move || async move { this.get(key, path, None, expect, limit).await })?;
        Ok((bytes.to_vec(), v))
    }

    /// Refuses a range that ends before it starts, or (when the listed version is known) one that lies
    /// beyond the end of the object: checked before any request, so no reader can panic on it.
    pub fn check_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        expect: Option<&Version>,
    ) -> Result<()> {
        let bad = |why: String| {
            Error::io(
                self.url(key),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
            )
        };
        if let Some(r) = ranges.iter().find(|r| r.start > r.end) {
            return Err(bad(format!(
                "bytes {}..{}: a range that ends before it starts",
                r.start, r.end
            )));
        }
        if let Some(v) = expect
            && let Some(r) = ranges.iter().find(|r| r.end > v.size)
        {
            return Err(bad(format!(
                "bytes {}..{} lie beyond the end of the object as listed ({} bytes): the item's offsets \
                 are corrupt, or the object changed since it was listed",
                r.start, r.end, v.size
            )));
        }
        Ok(())
    }

    /// The bytes of each range, the number of GET requests it took (neighbours coalesced) and the bytes
    /// those requests fetched (the gaps between coalesced ranges included). Every range is checked before
    /// it is requested (against the listed size when `expect` is known) and every body against the length
    /// asked for: an object that got shorter since it was listed, or a server that cut a body, is an error
    /// naming the URL and the bytes (after retries, for a cut body), never a panic or bytes of the wrong
    /// length.
    pub fn read_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
        expect: Option<&Version>,
    ) -> Result<(Vec<Vec<u8>>, u64, u64)> {
        self.check_ranges(key, ranges, expect)?;
        let merged = coalesce(ranges, REMOTE_GAP);
        let path = self.path(key)?;
        let fetched: u64 = merged.iter().map(|r| r.end - r.start).sum();
        let got: Vec<bytes::Bytes> =
            self.runtime
                .block_on(futures::future::try_join_all(merged.iter().map(|r| {
                    let (this, path, r) = (self, &path, r.clone());
                    async move {
                        if r.is_empty() {
                            return Ok(bytes::Bytes::new());
                        }
                        retrying(this.retry, &this.counts, move || {
                            let r = r.clone();
                            async move {
                                let (b, _) = this.get(key, path, Some(r), expect, u64::MAX).await?;
                                Ok(b)
                            }
                        })
                        .await
                    }
                })))?;
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
