//! Object-store reads under faults, against a real S3-compatible server on loopback whose fault rules
//! stand in for a bad network or server: 503 SlowDown, bodies cut off mid-transfer, bodies shortened with
//! a matching Content-Length, reset connections, stalls, error documents. Every fault ends either in the
//! same samples as a local read (after retries, which the storage counts) or in an error that names the
//! object, within a bounded time. Then the object cache: blocks any later range hits, entries checked
//! (a flipped bit or an overwritten object is refetched, never served), hits counted.
//!
//! One test function: the S3 client is configured from the process environment, which tests running in
//! parallel threads must not change under each other.

mod common;

use common::{copy_tree, fixture};
use loader::{
    Batch, CacheOptions, Dataset, Loader, LoaderOptions, OpenOptions, SampleSpec, StorageOptions,
    open_dataset,
};
use s3_loopback::{Fault, FaultRule, Requests, Server};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn options(seed: u64) -> LoaderOptions {
    LoaderOptions {
        batch_size: 4,
        decode_threads: 2,
        io_threads: 2,
        epochs: Some(1),
        seed,
        sample: SampleSpec {
            height: 64,
            width: 64,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn open(location: &str, storage: StorageOptions) -> loader::Result<Arc<dyn Dataset>> {
    open_dataset(
        Path::new(location),
        &OpenOptions {
            storage,
            ..OpenOptions::default()
        },
    )
}

/// Items → sample bytes of one epoch, or the first error.
fn epoch(ds: Arc<dyn Dataset>, seed: u64) -> loader::Result<HashMap<usize, Vec<u8>>> {
    let mut out = HashMap::new();
    for b in Loader::new(ds, options(seed))? {
        let b: Batch = b?;
        for (i, &id) in b.ids.iter().enumerate() {
            let old = out.insert(id, b.sample_bytes(i).unwrap().to_vec());
            assert!(old.is_none(), "item {id} delivered twice");
        }
    }
    Ok(out)
}

fn quick(secs: u64) -> StorageOptions {
    StorageOptions {
        retry: Some(Duration::from_secs(secs)),
        ..StorageOptions::default()
    }
}

#[test]
fn faults_end_in_the_right_samples_or_a_named_error_in_bounded_time() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let bucket = root.join("data");
    copy_tree(&f.mixed, &bucket.join("mixed"));
    copy_tree(&f.l3, &bucket.join("l3"));
    let server = Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();
    // SAFETY: this binary's only test sets the environment before starting any thread that reads it.
    unsafe {
        for (k, v) in server.client_env() {
            std::env::set_var(k, v);
        }
        std::env::remove_var("AWS_SESSION_TOKEN");
        std::env::remove_var("AWS_PROFILE");
    }
    let want: HashMap<&str, HashMap<usize, Vec<u8>>> = [("mixed", &f.mixed), ("l3", &f.l3)]
        .into_iter()
        .map(|(sub, local)| {
            let ds = open(local.to_str().unwrap(), StorageOptions::default()).unwrap();
            (sub, epoch(ds, 5).unwrap())
        })
        .collect();

    // Faults a retry gets through: each epoch delivers exactly the local samples, and the storage counts
    // the retries it made.
    let survivable = [
        (
            "503 SlowDown on every third GET",
            Fault::Status(503, "SlowDown"),
            Requests::ObjectGets,
            3,
            u64::MAX,
            true,
        ),
        (
            "500 on the first listings",
            Fault::Status(500, "InternalError"),
            Requests::Lists,
            1,
            3,
            true,
        ),
        (
            "a reset connection on every fourth request",
            Fault::Reset,
            Requests::All,
            4,
            u64::MAX,
            true,
        ),
        (
            "bodies cut off mid-transfer",
            Fault::CutBody,
            Requests::ObjectGets,
            3,
            u64::MAX,
            true,
        ),
        (
            "short bodies with a matching Content-Length",
            Fault::ShortBody,
            Requests::ObjectGets,
            3,
            u64::MAX,
            true,
        ),
        (
            "a listing cut off mid-transfer",
            Fault::CutBody,
            Requests::Lists,
            1,
            2,
            true,
        ),
        (
            "a listing shortened",
            Fault::ShortBody,
            Requests::Lists,
            1,
            2,
            true,
        ),
        // Slower than usual, not failed: waited for, not retried.
        (
            "stalls of a second",
            Fault::Stall(Duration::from_secs(1)),
            Requests::All,
            5,
            4,
            false,
        ),
    ];
    for (what, fault, requests, every, times, retried) in survivable {
        for sub in ["mixed", "l3"] {
            server.inject(Some(FaultRule {
                fault: fault.clone(),
                requests,
                every,
                times,
            }));
            let t0 = Instant::now();
            let ds = open(&format!("s3://data/{sub}"), StorageOptions::default())
                .unwrap_or_else(|e| panic!("{what}, {sub}: open failed: {e}"));
            let got = epoch(ds.clone(), 5).unwrap_or_else(|e| panic!("{what}, {sub}: {e}"));
            assert!(
                got == want[sub],
                "{what}, {sub}: samples differ from the local read"
            );
            assert!(
                server.faults_struck() > 0,
                "{what}, {sub}: the fault never struck"
            );
            let retries = ds.storage().unwrap().stats().retries;
            assert_eq!(
                retries > 0,
                retried,
                "{what}, {sub}: {retries} retries counted"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{what}, {sub}: took {:?}",
                t0.elapsed()
            );
        }
    }

    // Faults that last: a named error (the URL, what the server said) once the retry time is spent.
    let lasting = [
        (
            "503 on every GET",
            Fault::Status(503, "SlowDown"),
            Requests::ObjectGets,
            "SlowDown",
        ),
        (
            "every body cut short",
            Fault::ShortBody,
            Requests::ObjectGets,
            "came back as",
        ),
        (
            "a server that stalls",
            Fault::Stall(Duration::from_secs(120)),
            Requests::ObjectGets,
            "s3://data/l3/",
        ),
        (
            "403 AccessDenied",
            Fault::Status(403, "AccessDenied"),
            Requests::ObjectGets,
            "AccessDenied: injected by the test: AccessDenied & friends",
        ),
    ];
    for (what, fault, requests, says) in lasting {
        server.inject(None);
        let ds = open("s3://data/l3", quick(2)).unwrap();
        server.inject(Some(FaultRule::always(fault, requests)));
        let t0 = Instant::now();
        let err = epoch(ds, 5).expect_err(what).to_string();
        assert!(
            err.contains("s3://data/l3/") && err.contains(says),
            "{what}: {err}"
        );
        assert!(!err.contains("<?xml"), "{what}: the raw XML in {err}");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: took {:?}",
            t0.elapsed()
        );
    }
    server.inject(Some(FaultRule::always(
        Fault::Status(503, "SlowDown"),
        Requests::Lists,
    )));
    let t0 = Instant::now();
    let err = open("s3://data/l3", quick(2))
        .err()
        .expect("listing never answers")
        .to_string();
    assert!(
        err.contains("s3://data/l3") && err.contains("SlowDown"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    server.inject(None);

    // An object replaced between epochs (the dataset keeps its listing): the read says so.
    let ds = open("s3://data/l3", StorageOptions::default()).unwrap();
    epoch(ds.clone(), 5).unwrap();
    let victim = bucket
        .join("l3")
        .join(&ds.source(0).to_string_lossy()["s3://data/l3/".len()..]);
    let original = std::fs::read(&victim).unwrap();
    let mut other = original.clone();
    other.extend_from_slice(b"appended");
    std::fs::write(&victim, &other).unwrap();
    let err = epoch(ds, 5).expect_err("a replaced object").to_string();
    assert!(err.contains("changed since it was listed"), "{err}");
    std::fs::write(&victim, &original).unwrap();

    // The cache: a first epoch fills it, a second with other crops (another seed) reads every block
    // from it — no request reaches the server.
    let cache_dir = tmp.path().join("cache");
    let cached = || StorageOptions {
        cache: Some(CacheOptions {
            dir: cache_dir.clone(),
            limit: 1 << 30,
        }),
        ..StorageOptions::default()
    };
    let ds = open("s3://data/l3", cached()).unwrap();
    assert!(epoch(ds.clone(), 5).unwrap() == want["l3"]);
    drop(ds); // writes what is queued
    let ds = open("s3://data/l3", cached()).unwrap();
    server.reset();
    let other_crops = epoch(ds.clone(), 6).unwrap();
    let s = ds.storage().unwrap().stats();
    assert_eq!(
        server.served().0,
        0,
        "every block came from the cache: {s:?}"
    );
    assert!(
        s.cache_hits > 0 && s.cache_misses == 0 && s.bytes_read == 0,
        "{s:?}"
    );
    let here = open(f.l3.to_str().unwrap(), StorageOptions::default()).unwrap();
    assert!(
        other_crops == epoch(here, 6).unwrap(),
        "cached samples differ from local ones"
    );
    drop(ds);

    // A flipped bit in every entry: each is dropped and fetched again, never served as pixels.
    let entries: Vec<_> = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "entry"))
        .collect();
    assert!(!entries.is_empty());
    for p in &entries {
        let mut b = std::fs::read(p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x10;
        std::fs::write(p, b).unwrap();
    }
    let ds = open("s3://data/l3", cached()).unwrap();
    assert!(
        epoch(ds.clone(), 5).unwrap() == want["l3"],
        "corrupt entries were served"
    );
    let s = ds.storage().unwrap().stats();
    // (Blocks refetched early in the epoch may hit later in it, once rewritten.)
    assert!(s.cache_dropped > 0 && s.bytes_read > 0, "{s:?}");
    drop(ds);

    // An object overwritten in the bucket (same size, other bytes): the listing's ETag makes its entries
    // stale; they are dropped and the new bytes are read.
    let l3_files = loader::image_files(&f.l3).unwrap().files;
    let (a, b) = (&l3_files[0].0, &l3_files[1].0);
    std::fs::copy(f.l3.join(b), bucket.join("l3").join(a)).unwrap();
    let ds = open("s3://data/l3", cached()).unwrap();
    let got = epoch(ds.clone(), 5).unwrap();
    let swapped_local = tmp.path().join("swapped");
    copy_tree(&f.l3, &swapped_local);
    std::fs::copy(f.l3.join(b), swapped_local.join(a)).unwrap();
    let here = open(swapped_local.to_str().unwrap(), StorageOptions::default()).unwrap();
    assert!(got == epoch(here, 5).unwrap(), "a stale entry was served");
    assert!(ds.storage().unwrap().stats().cache_dropped > 0);

    // What the server said, parsed from its error document; and no credentials at all.
    let err = open("s3://no-such-bucket/x", StorageOptions::default())
        .err()
        .expect("a missing bucket")
        .to_string();
    assert!(
        err.contains("s3://no-such-bucket/x") && err.contains("NoSuchBucket"),
        "{err}"
    );
    assert!(!err.contains("<?xml"), "{err}");
    // SAFETY: as above; no loader runs now.
    unsafe {
        std::env::remove_var("AWS_ACCESS_KEY_ID");
        std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    }
    let t0 = Instant::now();
    let err = open("s3://data/l3", quick(2))
        .err()
        .expect("no credentials")
        .to_string();
    assert!(
        err.contains("s3://data/l3") && err.contains("no credentials found"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}
