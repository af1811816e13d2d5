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
use std::sync::atomic::{AtomicU64, Ordering};
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

impl Remote {
    /// Connects to `s3://bucket/prefix` and lists the prefix once, so a missing bucket or wrong
    /// credentials fail here, naming the URL.
    pub fn open(url: &str) -> Result<Remote> {
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
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: 6,
                retry_timeout: Duration::from_secs(60),
            });
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
        let probe = remote.path("");
        remote
            .runtime
            .block_on(remote.store.list_with_delimiter(Some(&probe)))
            .map_err(|e| Error::io(remote.url(""), io_error(e)))?;
        Ok(remote)
    }

    fn path(&self, key: &str) -> ObjPath {
        match (self.prefix.is_empty(), key.is_empty()) {
            (true, _) => ObjPath::from(key),
            (false, true) => ObjPath::from(self.prefix.as_str()),
            (false, false) => ObjPath::from(format!("{}/{key}", self.prefix)),
        }
    }

    pub fn url(&self, key: &str) -> String {
        let p = self.path(key);
        format!("s3://{}/{}", self.bucket, p.as_ref())
    }

    fn err(&self, key: &str) -> impl Fn(object_store::Error) -> Error + '_ {
        let name = PathBuf::from(self.url(key));
        move |e| Error::io(name.clone(), io_error(e))
    }

    /// Every object under the prefix: (key relative to it, size), sorted; hidden names left out.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let root = self.path("");
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
        match self.runtime.block_on(self.store.head(&self.path(key))) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err(key)(e)),
        }
    }

    pub fn size(&self, key: &str) -> Result<u64> {
        let meta = self
            .runtime
            .block_on(self.store.head(&self.path(key)))
            .map_err(self.err(key))?;
        Ok(meta.size)
    }

    pub fn read(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        let name = self.url(key);
        self.runtime.block_on(async {
            let got = self
                .store
                .get(&self.path(key))
                .await
                .map_err(self.err(key))?;
            if got.meta.size > limit {
                return Err(Error::io(
                    &name,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{} bytes, over the limit of {limit} bytes", got.meta.size),
                    ),
                ));
            }
            let bytes = got.bytes().await.map_err(self.err(key))?;
            Ok(bytes.to_vec())
        })
    }

    /// The bytes of each range, the number of GET requests it took (neighbours coalesced) and the bytes
    /// those requests fetched (the gaps between coalesced ranges included).
    pub fn read_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
    ) -> Result<(Vec<Vec<u8>>, u64, u64)> {
        let path = self.path(key);
        let requests = AtomicU64::new(0);
        let fetched = AtomicU64::new(0);
        let got = self
            .runtime
            .block_on(object_store::coalesce_ranges(
                ranges,
                |r| {
                    requests.fetch_add(1, Ordering::Relaxed);
                    fetched.fetch_add(r.end - r.start, Ordering::Relaxed);
                    let (store, path) = (self.store.clone(), path.clone());
                    async move { store.get_range(&path, r).await }
                },
                REMOTE_GAP,
            ))
            .map_err(self.err(key))?;
        Ok((
            got.into_iter().map(|b| b.to_vec()).collect(),
            requests.into_inner(),
            fetched.into_inner(),
        ))
    }
}
