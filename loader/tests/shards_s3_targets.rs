//! Masks and boxes carried inside shards on an S3 server (s3-loopback on loopback, counting object GETs
//! on its side), read with `masks=@shards` and `boxes=@shards`: the same images, masks and boxes as the
//! local folder they were written from, by whole and by region reads, with the requests of an epoch
//! bounded by the members it reads.
//!
//! One test function: the S3 client is configured from the process environment.

mod common;

use common::fixture;
use loader::targets::{IN_SHARDS, TargetOptions, Targets};
use loader::{
    Batch, Dataset, DecodeScope, ImageFolder, Loader, LoaderOptions, OpenOptions, SampleSpec,
    open_dataset,
};
use s3_loopback::Server;
use std::path::Path;
use std::sync::Arc;

fn options(scope: DecodeScope, masks: &Path, boxes: &Path) -> LoaderOptions {
    LoaderOptions {
        batch_size: 3,
        decode_threads: 2,
        io_threads: 2,
        epochs: Some(1),
        seed: 11,
        decode: scope,
        sample: SampleSpec {
            height: 48,
            width: 40,
            hflip: true,
            ..SampleSpec::default()
        },
        targets: TargetOptions {
            masks: Some(masks.to_path_buf()),
            boxes: Some(boxes.to_path_buf()),
            ..TargetOptions::default()
        },
        ..LoaderOptions::default()
    }
}

fn run(ds: &Arc<dyn Dataset>, o: LoaderOptions) -> Vec<Batch> {
    Loader::new(ds.clone(), o)
        .unwrap()
        .map(|b| b.expect("batch"))
        .collect()
}

#[test]
fn masks_and_boxes_in_shards_on_s3_equal_the_folders() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s3");
    let (common::Targets { masks, coco }, shards) =
        common::targets_in_shards(f, tmp.path(), &root.join("data/shards"));
    let server = Server::start(&root, "127.0.0.1:0".parse().unwrap()).unwrap();
    // SAFETY: this binary's only test sets the environment before any loader thread starts.
    unsafe {
        for (k, v) in server.client_env() {
            std::env::set_var(k, v);
        }
        std::env::set_var("AWS_SECRET_ACCESS_KEY", s3_loopback::SECRET);
    }
    let pattern = format!("s3://data/shards/shard-{{000000..{:06}}}.tar", shards - 1);
    let shards = open_dataset(Path::new(&pattern), &OpenOptions::default()).unwrap();
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&f.l3).unwrap());
    let n = folder.len() as u64;
    assert_eq!(shards.len() as u64, n);
    let carried = Path::new(IN_SHARDS);
    // Opening the targets reads no boxes member (each is read with its item): at most the mask the
    // 8/16-bit probe opens.
    server.reset();
    let o = options(DecodeScope::Region, carried, carried);
    assert!(
        Targets::open(&*shards, &o.targets, false)
            .unwrap()
            .is_some()
    );
    let (gets, _) = server.served();
    assert!(
        gets <= 1,
        "opening the targets took {gets} GETs for {n} samples"
    );
    for scope in [DecodeScope::Region, DecodeScope::Whole] {
        let want = run(&folder, options(scope, &masks, &coco));
        server.reset();
        let got = run(&shards, options(scope, carried, carried));
        let (gets, bytes) = server.served();
        common::assert_same_targets(&got, &want, &format!("{scope:?}"));
        // Against the same epoch without targets: each sample's mask member and boxes member add a GET
        // each (a mask whose patches lie apart now and then a second one).
        let mut plain = options(scope, carried, carried);
        plain.targets = TargetOptions::default();
        server.reset();
        run(&shards, plain);
        let (base, _) = server.served();
        eprintln!(
            "{scope:?}: {gets} GETs and {bytes} bytes for {n} samples with masks and boxes, {base} GETs without"
        );
        assert!(
            gets - base <= 2 * n + n.div_ceil(6),
            "{scope:?}: masks and boxes took {} GETs for {n} samples",
            gets - base
        );
    }
}
