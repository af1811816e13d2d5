//! A real S3-compatible server on a local address, for tests and benches: [s3s-fs] serves a folder (each
//! top-level sub-folder a bucket) with signature checking, and the server counts the object GETs it
//! answered and their body bytes — what "one request per record prefix" is checked against.
//!
//! [`Faults`] stand between the client and the S3 service, as a misbehaving network or server would: a
//! status such as 503 SlowDown with its XML error body, a body cut off mid-transfer, a body shortened
//! with a Content-Length that matches it, a reset connection, a stall. A test sets a rule, and every
//! matching request it applies to gets the fault; the rest are served.
//!
//! [s3s-fs]: https://docs.rs/s3s-fs
#![deny(unsafe_code)]

/// The README's example runs as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The access key the server accepts.
pub const KEY: &str = "l3test";
/// The secret key the server accepts.
pub const SECRET: &str = "l3test-secret";

/// What the server served: object GETs (not listings or HEADs) and their body bytes.
#[derive(Default)]
struct Served {
    gets: AtomicU64,
    bytes: AtomicU64,
}

/// What a fault does to a request it applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Answers with this HTTP status and an S3 XML error body carrying this code, without serving.
    Status(u16, &'static str),
    /// Serves the request but sends the first half of the body only, with a Content-Length that matches
    /// it: a short body the client cannot tell from the headers.
    ShortBody,
    /// Sends the headers (the full Content-Length) and half the body, then drops the connection.
    CutBody,
    /// Drops the connection without answering.
    Reset,
    /// Waits this long, then serves.
    Stall(std::time::Duration),
}

/// Which requests a rule looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requests {
    /// GETs of objects (ranged or whole).
    ObjectGets,
    /// Listings (GETs with `list-type`).
    Lists,
    /// Everything, HEADs included.
    All,
}

/// A fault, the requests it looks at, and how often it strikes.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    pub fault: Fault,
    pub requests: Requests,
    /// Strikes every `every`-th matching request (1: each one).
    pub every: u64,
    /// Strikes at most this many times (`u64::MAX`: for as long as the rule is set).
    pub times: u64,
}

impl FaultRule {
    /// `fault` on every request of `requests`, for as long as it is set.
    pub fn always(fault: Fault, requests: Requests) -> FaultRule {
        FaultRule {
            fault,
            requests,
            every: 1,
            times: u64::MAX,
        }
    }
}

/// The rule in force and what it did.
#[derive(Default)]
struct Faults {
    rule: std::sync::Mutex<Option<FaultRule>>,
    matched: AtomicU64,
    struck: AtomicU64,
}

impl Faults {
    /// The fault for a request of this kind, if the rule strikes it.
    fn strike(&self, object_get: bool, list: bool) -> Option<Fault> {
        let rule = self.rule.lock().unwrap_or_else(|p| p.into_inner());
        let rule = rule.as_ref()?;
        let applies = match rule.requests {
            Requests::ObjectGets => object_get,
            Requests::Lists => list,
            Requests::All => true,
        };
        if !applies {
            return None;
        }
        let n = self.matched.fetch_add(1, Ordering::SeqCst) + 1;
        if !n.is_multiple_of(rule.every.max(1)) {
            return None;
        }
        let struck = self.struck.fetch_add(1, Ordering::SeqCst);
        if struck >= rule.times {
            self.struck.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(rule.fault.clone())
    }
}

/// An S3 error document, as S3 sends it.
fn error_body(code: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>\n  <Code>{code}</Code>\n  \
         <Message>injected by the test: {code} &amp; friends</Message>\n  <RequestId>0</RequestId>\n</Error>\n"
    )
}

/// A body that yields its bytes and then fails: hyper drops the connection short of the Content-Length.
struct CutOff(Option<bytes::Bytes>);

impl http_body::Body for CutOff {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(Some(match self.0.take() {
            Some(b) => Ok(http_body::Frame::data(b)),
            None => Err(std::io::Error::other("cut off by the test")),
        }))
    }
}

/// A running server; stopped when dropped.
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    served: Arc<Served>,
    /// Set by [`Server::kill`] before the runtime goes down.
    dying: Arc<std::sync::atomic::AtomicBool>,
    faults: Arc<Faults>,
}

impl Server {
    /// Serves `root` on `addr` (port 0: any free port).
    pub fn start(root: &Path, addr: SocketAddr) -> std::io::Result<Server> {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder as ConnBuilder;
        use s3s::service::S3ServiceBuilder;

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let served = Arc::new(Served::default());
        let fs = s3s_fs::FileSystem::new(root)
            .map_err(|e| std::io::Error::other(format!("serving {}: {e:?}", root.display())))?;
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(s3s::auth::SimpleAuth::from_single(KEY, SECRET));
        let service = b.build();
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let counts = served.clone();
        let dying = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dying_seen = dying.clone();
        let faults = Arc::new(Faults::default());
        let faults_seen = faults.clone();
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let (service, counts, dying, faults) = (
                    service.clone(),
                    counts.clone(),
                    dying_seen.clone(),
                    faults_seen.clone(),
                );
                let counted =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (service, counts, dying) =
                            (service.clone(), counts.clone(), dying.clone());
                        let list = req.method() == http::Method::GET
                            && req.uri().query().unwrap_or("").contains("list-type");
                        let object_get = req.method() == http::Method::GET
                            && !list
                            && req.uri().path().trim_matches('/').contains('/');
                        let fault = faults.strike(object_get, list);
                        async move {
                            match &fault {
                                Some(Fault::Status(status, code)) => {
                                    let mut resp =
                                        http::Response::new(s3s::Body::from(error_body(code)));
                                    *resp.status_mut() = http::StatusCode::from_u16(*status)
                                        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                                    resp.headers_mut().insert(
                                        http::header::CONTENT_TYPE,
                                        http::HeaderValue::from_static("application/xml"),
                                    );
                                    return Ok(resp);
                                }
                                Some(Fault::Reset) => {
                                    return Err(s3s::HttpError::new("reset by the test".into()));
                                }
                                Some(Fault::Stall(d)) => tokio::time::sleep(*d).await,
                                _ => {}
                            }
                            let resp = hyper::service::Service::call(&service, req).await?;
                            let resp = match fault {
                                Some(Fault::ShortBody | Fault::CutBody)
                                    if resp.status().is_success() =>
                                {
                                    let (mut parts, body) = resp.into_parts();
                                    let whole = http_body_util::BodyExt::collect(body)
                                        .await
                                        .map_err(|e| s3s::HttpError::new(e.to_string().into()))?
                                        .to_bytes();
                                    let half = whole.slice(..whole.len() / 2);
                                    let body = if fault == Some(Fault::ShortBody) {
                                        parts.headers.insert(
                                            http::header::CONTENT_LENGTH,
                                            http::HeaderValue::from(half.len()),
                                        );
                                        s3s::Body::from(half)
                                    } else {
                                        s3s::Body::http_body(CutOff(Some(half)))
                                    };
                                    http::Response::from_parts(parts, body)
                                }
                                _ => resp,
                            };
                            // A request the kill overtook may have failed for that reason alone (its
                            // file access refused by the runtime going down): drop the connection,
                            // as a dead server does, rather than answer for an object it still holds.
                            if dying.load(Ordering::SeqCst) {
                                return Err(s3s::HttpError::new("server killed".into()));
                            }
                            if object_get && resp.status().is_success() {
                                let len = resp
                                    .headers()
                                    .get(http::header::CONTENT_LENGTH)
                                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                                    .unwrap_or(0);
                                counts.gets.fetch_add(1, Ordering::Relaxed);
                                counts.bytes.fetch_add(len, Ordering::Relaxed);
                            }
                            Ok::<_, s3s::HttpError>(resp)
                        }
                    });
                let conn = http.serve_connection(TokioIo::new(socket), counted);
                let conn = conn.into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(Server {
            runtime: Some(runtime),
            addr,
            served,
            dying,
            faults,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ip:port`, for `AWS_ENDPOINT_URL`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The environment an S3 client needs to reach this server (`AWS_ENDPOINT_URL`, the keys, a region).
    pub fn client_env(&self) -> Vec<(&'static str, String)> {
        client_env(&self.endpoint())
    }

    /// Stops the server at once: open connections are dropped mid-response.
    pub fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            self.dying.store(true, Ordering::SeqCst);
            rt.shutdown_background();
        }
    }

    /// (object GETs, body bytes) served since the start or the last [`reset`](Server::reset).
    pub fn served(&self) -> (u64, u64) {
        (
            self.served.gets.load(Ordering::Relaxed),
            self.served.bytes.load(Ordering::Relaxed),
        )
    }

    /// Sets the fault rule in force (`None`: serve everything), starting its counts afresh.
    pub fn inject(&self, rule: Option<FaultRule>) {
        let mut r = self.faults.rule.lock().unwrap_or_else(|p| p.into_inner());
        self.faults.matched.store(0, Ordering::SeqCst);
        self.faults.struck.store(0, Ordering::SeqCst);
        *r = rule;
    }

    /// How many requests the rule in force has struck so far.
    pub fn faults_struck(&self) -> u64 {
        self.faults.struck.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.served.gets.store(0, Ordering::Relaxed);
        self.served.bytes.store(0, Ordering::Relaxed);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Records the ETag of every object under `root` (each top-level folder a bucket) as s3s-fs records it
/// for an object PUT through the API. s3s-fs otherwise hashes an object whole (MD5) on every GET of a
/// file placed in the folder by hand — a ranged GET of a 4 byte slice of a 500 MB object included —,
/// a cost no real store has, which would swamp what a benchmark of ranged reads measures. The recorded
/// ETag is the object's MD5 as it is now: an object changed afterwards keeps its old ETag, so tests that
/// change objects under a running server must not call this. Returns the objects recorded.
pub fn record_etags(root: &Path) -> std::io::Result<u64> {
    use md5::{Digest, Md5};
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(&entry.path(), out)?;
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
        Ok(())
    }
    let mut n = 0;
    for bucket in std::fs::read_dir(root)? {
        let bucket = bucket?;
        if !bucket.file_type()?.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        walk(&bucket.path(), &mut files)?;
        for file in files {
            let rel = file
                .strip_prefix(bucket.path())
                .map_err(std::io::Error::other)?;
            let key: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            let hash = Md5::digest(std::fs::read(&file)?);
            let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            let name = format!(
                ".bucket-{}.object-{}.internal.json",
                base64_url(bucket.file_name().to_string_lossy().as_bytes()),
                base64_url(key.join("/").as_bytes())
            );
            std::fs::write(root.join(name), format!("{{\"e_tag\":\"{hex}\"}}"))?;
            n += 1;
        }
    }
    Ok(n)
}

/// URL-safe base64 without padding: how s3s-fs names an object's side files.
fn base64_url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let v = chunk
            .iter()
            .enumerate()
            .fold(0u32, |v, (i, &b)| v | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ABC[(v >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The environment an S3 client needs to reach a server of this crate at `endpoint`.
pub fn client_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", KEY.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ALLOW_HTTP", "true".into()),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn side_file_names_are_url_safe_base64_without_padding() {
        assert_eq!(super::base64_url(b"data"), "ZGF0YQ");
        assert_eq!(super::base64_url(b"a/b.tar"), "YS9iLnRhcg");
        assert_eq!(super::base64_url(b"\xfb\xff"), "-_8");
        assert_eq!(super::base64_url(b""), "");
    }
}
