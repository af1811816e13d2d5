//! Shards on an S3 server (s3-loopback on loopback, counting object GETs and bytes on its side): the
//! same samples as the local folder, one GET per member read, region reads moving less than the members,
//! far fewer objects than a folder, and shards without an index indexed once into the disk cache folder.
//!
//! One test function: the S3 client is configured from the process environment.

mod common;

use common::{copy_tree, fixture, touch_later};
use loader::convert::{ShardBuild, to_shards};
use loader::{
    Batch, CacheOptions, Dataset, DecodeScope, Loader, LoaderOptions, OpenOptions, SampleSpec,
    ShardSet, StorageOptions, open_dataset,
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
    // Small L3 images (128x128 tiles of the corpus, each under the 64 KiB within which the client
    // coalesces ranges into one GET), so that a member's patches are always one GET: what the head
    // costs shows exactly.
    let tiles = tmp.path().join("tiles");
    for (i, (rel, _)) in loader::image_files(&f.mixed)
        .unwrap()
        .files
        .iter()
        .take(4)
        .enumerate()
    {
        let img = common::reference_rgb(&f.mixed.join(rel));
        std::fs::create_dir_all(tiles.join(format!("c{}", i % 2))).unwrap();
        for t in 0..3 {
            let tile = image::imageops::crop_imm(&img, t * 128, 0, 128, 128).to_image();
            tile.save(tiles.join(format!("c{}/t{i}-{t}.png", i % 2)))
                .unwrap();
        }
    }
    let small = tmp.path().join("small");
    let two = loader::convert::ConvertOptions {
        threads: 2,
        to_8bit: false,
    };
    let target = loader::convert::Target::L3_DEFAULT;
    loader::convert::convert_folder(&tiles, &small, target, &two, &|_, _| {}).unwrap();
    for (rel, _) in loader::image_files(&small).unwrap().files {
        let size = std::fs::metadata(small.join(&rel)).unwrap().len();
        assert!(size < 64 << 10, "{} is {size} bytes", rel.display());
    }
    let s_small = to_shards(
        &small,
        &bucket.join("small"),
        &ShardBuild {
            shard_size: 64 << 10,
            ..build.clone()
        },
    )
    .unwrap();
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
            // Region reads, first epoch: the member's L3 head comes from the index (written for this
            // very shard), so one GET per member for the patches under the crop.
            DecodeScope::Region => {
                // A member whose head is in the index costs one GET; the others (heads past the
                // cap) two or three, as before.
                // The heads come from the index: the first epoch reads what a later one does (see
                // below), one GET per member but for windows whose patches lie further apart.
                assert!(gets < 2 * n, "{gets} GETs, {n} members");
                assert!(
                    bytes * 2 < shards.stored_bytes(),
                    "{bytes} of {}",
                    shards.stored_bytes()
                );
            }
        }
    }
    // The first epoch of region reads costs what a later one does, whose offset tables are cached:
    // the heads cost no request. (Two loaders over one fresh set, the same seed and so the same
    // windows; one loader's epochs would blur where its prefetch crosses into the next epoch.)
    let fresh = open(&pattern);
    server.reset();
    run(&fresh, options(DecodeScope::Region));
    let (first, _) = server.served();
    server.reset();
    run(&fresh, options(DecodeScope::Region));
    let (later, _) = server.served();
    assert_eq!(
        first, later,
        "GETs of a first and a later epoch, {n} members"
    );
    assert!(later < 2 * n, "{later} GETs for {n} members");
    eprintln!("region reads: {first} GETs in the first epoch, {later} in a later one, {n} members");

    // Where the index holds every member's head, one GET per member in the first epoch too.
    let small_pattern = format!(
        "s3://data/small/train-{{000000..{:06}}}.tar",
        s_small.shards - 1
    );
    let small_local = open(small.to_str().unwrap());
    let n_small = small_local.len() as u64;
    assert!(s_small.shards >= 2, "{s_small:?}");
    let small_set = ShardSet::open(&small_pattern, &StorageOptions::default()).unwrap();
    assert_eq!(small_set.stale_indexes(), 0);
    let small_set: Arc<dyn Dataset> = Arc::new(small_set);
    server.reset();
    assert_eq!(
        run(&small_set, options(DecodeScope::Region)),
        run(&small_local, options(DecodeScope::Region))
    );
    assert_eq!(
        server.served().0,
        n_small,
        "one GET per member in the first epoch of region reads"
    );

    // A shard that changed since its index was written (here touched: the listing's last-modified
    // time is another): its members' heads are read from it again, with their tar headers — one GET
    // more for each of its members — and the samples are the same.
    touch_later(&bucket.join("small/train-000000.tar"));
    let touched = ShardSet::open(&small_pattern, &StorageOptions::default()).unwrap();
    assert_eq!(touched.stale_indexes(), 1);
    let in_shard0 = (0..touched.len())
        .filter(|&i| {
            touched
                .source(i)
                .to_string_lossy()
                .contains("train-000000.tar#")
        })
        .count() as u64;
    let touched: Arc<dyn Dataset> = Arc::new(touched);
    server.reset();
    let got = run(&touched, options(DecodeScope::Region));
    let (gets, _) = server.served();
    assert_eq!(got, run(&small_local, options(DecodeScope::Region)));
    assert!(in_shard0 > 0);
    assert_eq!(
        gets,
        n_small + in_shard0,
        "GETs for {n_small} members, {in_shard0} of them in the touched shard"
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
