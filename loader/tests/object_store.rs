//! Datasets on object storage, against a real S3-compatible server on loopback (s3s-fs serving a folder)
//! that the test starts, stops and restarts itself, counting requests and bytes on the server side.
//!
//! One test function: the S3 client is configured from the process environment (`AWS_ENDPOINT_URL`,
//! credentials), which tests running in parallel threads must not change under each other.

mod common;

use common::{copy_tree, fixture};
use loader::{
    Batch, Dataset, Loader, LoaderOptions, LoaderState, OpenOptions, PcrRecords, SampleSpec,
    StorageOptions, open_dataset,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use s3_loopback::Server;

fn options(batch: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        decode_threads: 2,
        io_threads: 2,
        epochs: Some(1),
        seed: 5,
        sample: SampleSpec {
            height: 64,
            width: 64,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn open(location: &str, group: Option<usize>) -> loader::Result<Arc<dyn Dataset>> {
    open_dataset(
        Path::new(location),
        &OpenOptions {
            group,
            ..OpenOptions::default()
        },
    )
}

fn batches(ds: Arc<dyn Dataset>, o: LoaderOptions) -> Vec<Batch> {
    Loader::new(ds, o)
        .unwrap()
        .map(|b| b.expect("batch"))
        .collect()
}

/// Items → sample bytes, for comparing runs whose batches may be cut differently.
fn samples(batches: &[Batch]) -> HashMap<usize, Vec<u8>> {
    let mut out = HashMap::new();
    for b in batches {
        for (i, &id) in b.ids.iter().enumerate() {
            let old = out.insert(id, b.sample_bytes(i).unwrap().to_vec());
            assert!(old.is_none(), "item {id} delivered twice");
        }
    }
    out
}

fn set_env(server: &Server, secret: &str) {
    // SAFETY: this binary's only test sets the environment before starting any thread that reads it
    // (loaders are created after, and joined before, each change).
    unsafe {
        for (k, v) in server.client_env() {
            std::env::set_var(k, v);
        }
        std::env::set_var("AWS_SECRET_ACCESS_KEY", secret);
        std::env::remove_var("AWS_SESSION_TOKEN");
        std::env::remove_var("AWS_PROFILE");
    }
}

fn any_port() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn datasets_on_an_s3_server_read_what_they_read_locally() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let bucket = root.join("data");
    copy_tree(&f.mixed, &bucket.join("mixed"));
    copy_tree(&f.l3, &bucket.join("l3"));
    let pcr_local = tmp.path().join("pcr");
    let build = loader::convert::PcrBuild {
        threads: 2,
        images_per_record: 3,
        ..Default::default()
    };
    loader::convert::to_pcr(&f.mixed.join("photo"), &pcr_local, &build).unwrap();
    copy_tree(&pcr_local, &bucket.join("pcr"));
    let mut server = Server::start(&root, any_port()).unwrap();
    set_env(&server, s3_loopback::SECRET);

    // An image folder (PNG and JPEG) and an L3 folder: the same samples as from the local folders.
    for (sub, local) in [("mixed", &f.mixed), ("l3", &f.l3)] {
        let remote = open(&format!("s3://data/{sub}"), None).unwrap();
        let here = open(local.to_str().unwrap(), None).unwrap();
        assert_eq!(remote.len(), here.len());
        assert!(
            remote
                .source(0)
                .display()
                .to_string()
                .starts_with("s3://data/")
        );
        let got = samples(&batches(remote, options(4)));
        let want = samples(&batches(here, options(4)));
        assert_eq!(got.len(), want.len());
        assert!(got == want, "{sub}: remote samples differ from local ones");
    }

    // L3 crops read only their patches: far fewer bytes served than the files hold.
    server.reset();
    let l3 = open("s3://data/l3", None).unwrap();
    let files = l3.stored_bytes();
    let mut l = Loader::new(l3, options(4)).unwrap();
    l.by_ref().for_each(|b| drop(b.unwrap()));
    let (_, served) = server.served();
    assert_eq!(
        served,
        l.stats().bytes_read,
        "the loader counts what was served"
    );
    assert!(
        served * 4 < files,
        "{served} bytes served for 64x64 crops of {files} bytes of files"
    );

    // PCR at scan group k: one GET per record, exactly the prefix bytes (plus the index once).
    let local = PcrRecords::open(&pcr_local, None).unwrap();
    let records = local.len().div_ceil(3) as u64;
    let index_len = std::fs::metadata(pcr_local.join(pcr::INDEX_FILE))
        .unwrap()
        .len();
    for k in [1, 3, local.groups()] {
        server.reset();
        let ds = open("s3://data/pcr", Some(k)).unwrap();
        let prefix = ds.stored_bytes();
        let got = samples(&batches(ds.clone(), options(2)));
        assert_eq!(got.len(), local.len());
        let want = samples(&batches(
            Arc::new(PcrRecords::open(&pcr_local, Some(k)).unwrap()),
            options(2),
        ));
        assert!(got == want, "group {k}: remote samples differ");
        assert_eq!(
            server.served(),
            (records + 1, prefix + index_len),
            "group {k}: one GET per record prefix, the index once"
        );
    }

    // Bad cases fail with the object's URL in the message.
    let err = open("s3://no-such-bucket/x", None)
        .err()
        .expect("a missing bucket")
        .to_string();
    assert!(err.contains("s3://no-such-bucket"), "{err}");
    set_env(&server, "wrong-secret");
    let err = open("s3://data/mixed", None)
        .err()
        .expect("wrong credentials")
        .to_string();
    assert!(err.contains("s3://data/mixed"), "{err}");
    set_env(&server, s3_loopback::SECRET);
    let record = bucket.join("pcr/record-00001.pcr");
    let good = std::fs::read(&record).unwrap();
    std::fs::write(&record, &good[..good.len() - 7]).unwrap();
    let ds = open("s3://data/pcr", None).unwrap();
    let err = Loader::new(ds, options(2))
        .unwrap()
        .find_map(|b| b.err())
        .expect("a truncated record fails the epoch")
        .to_string();
    assert!(err.contains("s3://data/pcr/record-00001.pcr"), "{err}");
    std::fs::remove_file(&record).unwrap();
    let ds = open("s3://data/pcr", None).unwrap();
    let err = Loader::new(ds, options(2))
        .unwrap()
        .find_map(|b| b.err())
        .expect("a missing record fails the epoch")
        .to_string();
    assert!(err.contains("s3://data/pcr/record-00001.pcr"), "{err}");
    std::fs::write(&record, &good).unwrap();

    // Keys exactly as written: non-ASCII, `%`, spaces and `+` in folder and file names, under a
    // non-ASCII prefix, list and read as they do from a local folder.
    let odd_local = tmp.path().join("odd");
    let l3_files = loader::image_files(&f.l3).unwrap().files;
    for ((class, name), (rel, _)) in [("Köln", "per%cent.l3"), ("a b+c", "x y+z.l3")]
        .into_iter()
        .zip(&l3_files)
    {
        for dir in [&odd_local, &bucket.join("dätä")] {
            std::fs::create_dir_all(dir.join(class)).unwrap();
            std::fs::copy(f.l3.join(rel), dir.join(class).join(name)).unwrap();
        }
    }
    let odd = open("s3://data/dätä", None).unwrap();
    assert_eq!(odd.len(), 2, "{}", odd.describe());
    let got = samples(&batches(odd.clone(), options(1)));
    let want = samples(&batches(
        open(odd_local.to_str().unwrap(), None).unwrap(),
        options(1),
    ));
    assert_eq!(got.len(), 2);
    assert!(
        got == want,
        "odd keys: remote samples differ from local ones"
    );

    // An object that got shorter since its offset table was read (kept from the first epoch), cut where
    // its patch data starts so that every crop's ranges run past its end: the next epoch fails naming the
    // item and the URL, within a bounded time — no panicking reader, no hang.
    let victim = bucket.join("dätä/Köln/per%cent.l3");
    let whole = std::fs::read(&victim).unwrap();
    let data_offset = l3_format::L3Index::parse(&whole, whole.len() as u64)
        .unwrap()
        .data_offset();
    std::fs::write(&victim, &whole[..data_offset as usize]).unwrap();
    let t0 = std::time::Instant::now();
    let err = Loader::new(odd, options(1))
        .unwrap()
        .find_map(|b| b.err())
        .expect("a shortened object is an error")
        .to_string();
    assert!(
        err.contains("s3://data/dätä/Köln/per%cent.l3") && err.contains("item "),
        "{err}"
    );
    assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());

    // A server down for three seconds mid-epoch: requests are retried (for up to a minute by default)
    // and the epoch completes, every item once; the restarted server served the reads that waited.
    let ds = open("s3://data/mixed", None).unwrap();
    let n = ds.len();
    let mut l = Loader::new(ds.clone(), options(1)).unwrap();
    let mut delivered = vec![l.next().unwrap().unwrap()];
    server.kill();
    let (again, addr) = (root.clone(), server.addr());
    let restart = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(3));
        Server::start(&again, addr).unwrap()
    });
    delivered.extend(l.map(|b| b.expect("retried through a 3 s outage")));
    let mut server = restart.join().unwrap();
    assert_eq!(
        samples(&delivered).len(),
        n,
        "every item once through the outage"
    );
    assert!(server.served().0 > 0, "no read waited for the restart");

    // A server that stays down past retry_secs: the loader reports it, naming the object; after a
    // restart a loader resumed from the state of the last batch delivered finishes the epoch, and together
    // the runs deliver every item exactly once.
    let quick = OpenOptions {
        storage: StorageOptions {
            retry: Some(std::time::Duration::from_secs(2)),
            ..StorageOptions::default()
        },
        ..OpenOptions::default()
    };
    let ds = open_dataset(Path::new("s3://data/mixed"), &quick).unwrap();
    let o = options(2);
    let mut first = Loader::new(ds.clone(), o.clone()).unwrap();
    let mut delivered = vec![
        first.next().unwrap().unwrap(),
        first.next().unwrap().unwrap(),
    ];
    let state: LoaderState = first.state();
    drop(first);
    server.kill();
    let t0 = std::time::Instant::now();
    let err = Loader::resume(ds.clone(), o.clone(), state.clone())
        .unwrap()
        .find_map(|b| b.err())
        .expect("a dead server is an error, not an early end")
        .to_string();
    assert!(err.contains("s3://data/mixed/"), "{err}");
    assert!(
        t0.elapsed().as_secs() < 30,
        "gave up after {:?}",
        t0.elapsed()
    );
    let _server = Server::start(&root, server.addr()).unwrap();
    let resumed = Loader::resume(ds, o, state).unwrap();
    delivered.extend(resumed.map(|b| b.unwrap()));
    let got = samples(&delivered);
    assert_eq!(got.len(), n, "every item once across the failure");
}
