//! Shards on an S3 server (s3-loopback on loopback, counting object GETs and bytes on its side): the
//! same samples as the local folder, one GET per member read, region reads moving less than the members,
//! far fewer objects than a folder, and shards without an index indexed once into the disk cache folder.
//!
//! One test function: the S3 client is configured from the process environment.

mod common;

use common::{copy_tree, fixture};
use loader::convert::{ShardBuild, to_shards};
use loader::{
    Batch, CacheOptions, Crop, Dataset, DecodeScope, Loader, LoaderOptions, OpenOptions,
    SampleSpec, ShardSet, StorageOptions, open_dataset,
};
use s3_loopback::Server;
use std::path::Path;
use std::sync::Arc;

fn options(scope: DecodeScope) -> LoaderOptions {
    LoaderOptions {
        batch_size: 4,
        decode_threads: 2,
        io_threads: 2,
        epochs: Some(1),
        seed: 5,
        decode: scope,
        sample: SampleSpec {
            height: 64,
            width: 64,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn run(ds: &Arc<dyn Dataset>, o: LoaderOptions) -> Vec<(Vec<usize>, Vec<u8>)> {
    Loader::new(ds.clone(), o)
        .unwrap()
        .map(|b: loader::Result<Batch>| {
            let b = b.expect("batch");
            let bytes = (0..b.len())
                .flat_map(|i| b.sample_bytes(i).unwrap().to_vec())
                .collect();
            (b.ids.clone(), bytes)
        })
        .collect()
}

#[test]
fn shards_on_s3_read_one_range_per_member() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let bucket = root.join("data");
    copy_tree(&f.l3, &bucket.join("folder"));
    // About 6 images a shard (by the mean size: the corpus's sizes vary widely).
    let sizes: Vec<u64> = loader::image_files(&f.l3)
        .unwrap()
        .files
        .iter()
        .map(|(rel, _)| std::fs::metadata(f.l3.join(rel)).unwrap().len())
        .collect();
    let mean = sizes.iter().sum::<u64>() / sizes.len() as u64;
    let build = ShardBuild {
        shard_size: 6 * (mean + 2048),
        prefix: "train".into(),
        ..ShardBuild::default()
    };
    let s = to_shards(&f.l3, &bucket.join("shards"), &build).unwrap();
    // The PNG/JPEG folder as shards without indexes: as another tool would have written them.
    let s_png = to_shards(&f.mixed, &bucket.join("foreign"), &build).unwrap();
    for k in 0..s_png.shards {
        std::fs::remove_file(bucket.join(format!("foreign/train-{k:06}.tar.idx"))).unwrap();
    }
    let server = Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();
    // SAFETY: this binary's only test sets the environment before any loader thread starts.
    unsafe {
        for (k, v) in server.client_env() {
            std::env::set_var(k, v);
        }
        std::env::set_var("AWS_SECRET_ACCESS_KEY", s3_loopback::SECRET);
    }
    let open = |location: &str| open_dataset(Path::new(location), &OpenOptions::default()).unwrap();
    let pattern = format!("s3://data/shards/train-{{000000..{:06}}}.tar", s.shards - 1);
    let local = open(f.l3.to_str().unwrap());
    let n = local.len() as u64;
    assert!(
        s.shards >= 2 && (s.shards as u64) * 2 < n,
        "{} shards of {n}",
        s.shards
    );

    server.reset();
    let shards = open(&pattern);
    assert_eq!(
        server.served().0,
        s.shards as u64,
        "opening reads each index once"
    );
    for scope in [DecodeScope::Whole, DecodeScope::Region] {
        server.reset();
        let got = run(&shards, options(scope));
        let (gets, bytes) = server.served();
        assert_eq!(
            got,
            run(&local, options(scope)),
            "{scope:?}: samples differ"
        );
        match scope {
            // Whole images: exactly one ranged GET per member, its header and data.
            DecodeScope::Whole => {
                assert_eq!(gets, n, "one GET per member read");
                assert_eq!(bytes, shards.stored_bytes() + 512 * n);
            }
            // Region reads: the header and offset table, then the patches under the crop.
            DecodeScope::Region => {
                assert!(
                    bytes * 2 < shards.stored_bytes(),
                    "{bytes} of {}",
                    shards.stored_bytes()
                );
            }
        }
    }
    // A second epoch of region reads: the offset tables are kept, one GET per member for its patches.
    // Centre crops, so that both epochs read the same windows and differ only by the tables.
    server.reset();
    let centre = options(DecodeScope::Region);
    let mut l = Loader::new(
        shards.clone(),
        LoaderOptions {
            epochs: Some(2),
            sample: SampleSpec {
                crop: Crop::Center,
                ..centre.sample
            },
            ..centre
        },
    )
    .unwrap();
    let first: usize = l.rest_of_epoch().map(|b| b.unwrap().len()).sum();
    assert_eq!(first as u64, n);
    let (after_first, _) = server.served();
    server.reset();
    let second: usize = l.rest_of_epoch().map(|b| b.unwrap().len()).sum();
    assert_eq!(second as u64, n);
    let (gets, _) = server.served();
    // One GET per member for its patches, two where the window's patch rows lie further apart than
    // the client coalesces across.
    assert!(
        gets <= 2 * n,
        "{gets} GETs for {n} members in the second epoch"
    );
    assert!(
        after_first > gets,
        "the first epoch reads the offset tables too"
    );
    eprintln!(
        "region reads: {after_first} GETs in the first epoch, {gets} in the second, {n} members"
    );

    // Shards without an index: built by reading the tars once, kept in the disk cache folder, found
    // there by the next open (which reads no tar).
    let cache = tmp.path().join("cache");
    let storage = StorageOptions {
        cache: Some(CacheOptions {
            dir: cache.clone(),
            limit: 1 << 30,
        }),
        ..StorageOptions::default()
    };
    let foreign = format!(
        "s3://data/foreign/train-{{000000..{:06}}}.tar",
        s_png.shards - 1
    );
    let set = ShardSet::open(&foreign, &storage).unwrap();
    assert_eq!(set.indexes_built(), s_png.shards);
    let kept = std::fs::read_dir(cache.join("shard-index"))
        .unwrap()
        .count();
    assert_eq!(kept, s_png.shards);
    server.reset();
    let again = ShardSet::open(&foreign, &StorageOptions { ..storage.clone() }).unwrap();
    assert_eq!(again.indexes_built(), 0);
    assert_eq!(
        server.served().0,
        0,
        "no object read to open with kept indexes"
    );
    let mixed = open(f.mixed.to_str().unwrap());
    let again: Arc<dyn Dataset> = Arc::new(again);
    assert_eq!(
        run(&again, options(DecodeScope::Region)),
        run(&mixed, options(DecodeScope::Region))
    );
    // A shard replaced by a truncated copy: its kept index no longer names it; the new scan says why.
    let victim = bucket.join("foreign/train-000000.tar");
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() - 1500]).unwrap();
    let e = ShardSet::open(&foreign, &storage).unwrap_err().to_string();
    assert!(
        e.contains("s3://data/foreign/train-000000.tar") && e.contains("truncated"),
        "{e}"
    );
}
