//! `l3 stream` on `s3://` datasets, against a real S3-compatible server on loopback that the test starts:
//! four ranks as four processes share one bucket, and together see every item exactly once per epoch while
//! each reads only its own shard (counted on the server's side).

#[path = "../../loader/tests/common/mod.rs"]
mod common;

use common::fixture;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

const WORLD: usize = 4;
const EPOCHS: usize = 2;

/// Copies the first `n` image files of `from` (sorted, keeping their class folders) into `to`.
fn copy_first(from: &Path, to: &Path, n: usize) -> usize {
    let files = loader::image_files(from).unwrap().files;
    assert!(files.len() >= n, "the fixture holds {} images", files.len());
    for (rel, _) in &files[..n] {
        let dst = to.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(from.join(rel), dst).unwrap();
    }
    n
}

#[test]
fn four_ranks_in_four_processes_share_one_bucket() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let n = copy_first(&f.mixed, &root.join("data/train"), 16);
    let server = s3_loopback::Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();

    // All four at once, as a job launcher starts them.
    let running: Vec<_> = (0..WORLD)
        .map(|rank| {
            let trace = tmp.path().join(format!("trace-{rank}.csv"));
            let child = Command::new(env!("CARGO_BIN_EXE_l3"))
                .args(["stream", "s3://data/train", "--batch", "2", "--size", "32"])
                .args(["--threads", "1", "--io-threads", "1", "--seed", "9"])
                .args(["--epochs", &EPOCHS.to_string()])
                .args([
                    "--rank",
                    &rank.to_string(),
                    "--world-size",
                    &WORLD.to_string(),
                ])
                .arg("--trace")
                .arg(&trace)
                .envs(server.client_env())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start l3");
            (rank, trace, child)
        })
        .collect();
    let children: Vec<_> = running
        .into_iter()
        .map(|(rank, trace, child)| (rank, trace, child.wait_with_output().unwrap()))
        .collect();
    let mut seen: BTreeMap<(usize, String), Vec<usize>> = BTreeMap::new();
    for (rank, trace, out) in &children {
        assert!(
            out.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(trace).unwrap();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split(',').collect();
            let epoch: usize = cols[0].parse().unwrap();
            seen.entry((epoch, cols[2].to_string()))
                .or_default()
                .push(*rank);
        }
    }
    for epoch in 0..EPOCHS {
        let items: Vec<_> = seen.iter().filter(|((e, _), _)| *e == epoch).collect();
        assert_eq!(items.len(), n, "epoch {epoch}: every item seen");
        for ((_, id), ranks) in items {
            assert_eq!(
                ranks.len(),
                1,
                "epoch {epoch}: {id} seen by ranks {ranks:?}"
            );
        }
    }
    // Each rank read only its shard: together they fetched each image once per epoch, and nothing else.
    assert_eq!(server.served().0, (n * EPOCHS) as u64);
}

#[test]
fn the_demo_runs_on_images_in_a_bucket() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let n = copy_first(&f.mixed, &root.join("data/train"), 8);
    let server = s3_loopback::Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l3"))
        .args([
            "demo",
            "--data",
            "s3://data/train",
            "--threads",
            "2",
            "--batch",
            "4",
        ])
        .args(["--storage-mbps", "100", "--work"])
        .arg(tmp.path().join("work"))
        .envs(server.client_env())
        .output()
        .expect("run l3 demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        text.contains(&format!("s3://data/train: {n} images")),
        "{text}"
    );
    // The originals streamed straight from the bucket, at both bandwidths.
    let row = text
        .lines()
        .find(|l| l.starts_with("source, from S3"))
        .unwrap_or_else(|| panic!("no row for the bucket:\n{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    let ips: f64 = cells[cells.len() - 1]
        .parse()
        .unwrap_or_else(|_| panic!("{row}"));
    assert!(ips > 0.0, "{row}");
    // Liquid profiled a second time, through the cap, and says what it chose there.
    assert!(text.contains("profiler at 100 MB/s probed"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Liquid L3+raw") && l.contains("@100MB/s")),
        "{text}"
    );
}

#[test]
fn the_object_cache_serves_a_second_run_and_says_so() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    copy_first(&f.mixed, &root.join("data/train"), 8);
    let server = s3_loopback::Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();
    let stream = |cache: &Path| {
        Command::new(env!("CARGO_BIN_EXE_l3"))
            .args(["stream", "s3://data/train", "--batch", "4", "--size", "32"])
            .args(["--threads", "2", "--seed", "3"])
            .arg("--cache-dir")
            .arg(cache)
            .envs(server.client_env())
            .output()
            .expect("run l3 stream")
    };
    let cache = tmp.path().join("cache");
    let first = stream(&cache);
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        text.contains("cache: 0 hits, 8 misses (0% hit rate)"),
        "{text}"
    );
    server.reset();
    let second = stream(&cache);
    let text = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{text}");
    assert!(
        text.contains("cache: 8 hits, 0 misses (100% hit rate)"),
        "{text}"
    );
    assert!(text.contains("storage: 0 read requests, 0 bytes"), "{text}");
    assert_eq!(
        server.served().0,
        0,
        "the second run read nothing from the server"
    );

    // A file where the cache folder should be: named, with what to do.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = stream(&file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("a-file") && err.contains("names a file"),
        "{err}"
    );
}
