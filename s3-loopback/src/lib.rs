//! A real S3-compatible server on a local address, for tests and benches: [s3s-fs] serves a folder (each
//! top-level sub-folder a bucket) with signature checking, and the server counts the object GETs it
//! answered and their body bytes — what "one request per record prefix" is checked against.
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

/// A running server; stopped when dropped.
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    served: Arc<Served>,
    /// Set by [`Server::kill`] before the runtime goes down.
    dying: Arc<std::sync::atomic::AtomicBool>,
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
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let (service, counts, dying) =
                    (service.clone(), counts.clone(), dying_seen.clone());
                let counted =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (service, counts, dying) =
                            (service.clone(), counts.clone(), dying.clone());
                        let object_get = req.method() == http::Method::GET
                            && !req.uri().query().unwrap_or("").contains("list-type");
                        async move {
                            let resp = hyper::service::Service::call(&service, req).await?;
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
