//! Masks and boxes that are damaged, misplaced or hostile, end to end on small synthetic trees: each
//! item's image is one flat grey level and its mask holds that level's class, so a delivered mask shows
//! whether it was paired with the right image.

use loader::convert::{LiquidBuild, to_liquid};
use loader::targets::TargetOptions;
use loader::{
    Crop, DType, Dataset, ImageFolder, Layout, LiquidShards, Loader, LoaderOptions, SampleSpec,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const W: u32 = 32;
const H: u32 = 24;

/// `names` as flat images (grey level `10 * (i + 1)`) under `root/images` and their masks (class
/// `i + 1`) under `root/masks`.
fn tree(root: &Path, names: &[&str]) -> (PathBuf, PathBuf) {
    let (images, masks) = (root.join("images"), root.join("masks"));
    for (i, name) in names.iter().enumerate() {
        let level = 10 * (i as u8 + 1);
        for dir in [&images, &masks] {
            std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
        }
        image::RgbImage::from_pixel(W, H, image::Rgb([level; 3]))
            .save(images.join(name))
            .unwrap();
        image::GrayImage::from_pixel(W, H, image::Luma([i as u8 + 1]))
            .save(masks.join(name))
            .unwrap();
    }
    (images, masks)
}

fn options(masks: &Path, batch_size: usize, skip_errors: bool) -> LoaderOptions {
    LoaderOptions {
        batch_size,
        sample: SampleSpec {
            height: H,
            width: W,
            crop: Crop::Center,
            layout: Layout::Nhwc,
            dtype: DType::U8,
            ..SampleSpec::default()
        },
        shuffle: false,
        decode_threads: 2,
        io_threads: 1,
        epochs: Some(1),
        skip_errors,
        targets: TargetOptions {
            masks: Some(masks.to_path_buf()),
            ..TargetOptions::default()
        },
        ..LoaderOptions::default()
    }
}

/// Every batch of a run: (ids, each sample's first pixel, each mask's first value, skipped ids).
type Seen = Vec<(Vec<usize>, Vec<u8>, Vec<u8>, Vec<usize>)>;

fn run(ds: Arc<dyn Dataset>, o: LoaderOptions) -> loader::Result<Seen> {
    let sample = (W * H * 3) as usize;
    let mut seen = Vec::new();
    for b in Loader::new(ds, o)? {
        let b = b?;
        let px = b.pixels.bytes().unwrap();
        let m = b.masks.as_ref().unwrap().as_u8().unwrap();
        seen.push((
            b.ids.clone(),
            (0..b.len()).map(|i| px[i * sample]).collect(),
            (0..b.len()).map(|i| m[i * (W * H) as usize]).collect(),
            b.skipped.iter().map(|s| s.0).collect(),
        ));
    }
    Ok(seen)
}

#[test]
fn the_first_mask_damaged_is_skipped_like_any_other_under_skip_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = tree(tmp.path(), &["a.png", "b.png", "c.png"]);
    std::fs::write(masks.join("a.png"), b"\x89PNG\r\n\x1a\nthis is no mask").unwrap();
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&images).unwrap());
    let e = run(ds.clone(), options(&masks, 2, false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.png"), "{e}");
    let seen = run(ds, options(&masks, 2, true)).unwrap();
    let ids: Vec<usize> = seen.iter().flat_map(|s| s.0.clone()).collect();
    let skipped: Vec<usize> = seen.iter().flat_map(|s| s.3.clone()).collect();
    assert_eq!((ids, skipped), (vec![1, 2], vec![0]));
    for (_, px, m, _) in &seen {
        for (p, m) in px.iter().zip(m) {
            assert_eq!(*p, 10 * m, "each mask is its own image's");
        }
    }
}

/// A batch whose every item is skipped is never delivered: the run goes on with the next batch, which
/// lists the skipped items, and the position moves past it.
#[test]
fn a_batch_of_only_skipped_items_is_never_delivered() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = tree(
        tmp.path(),
        &["a.png", "b.png", "c.png", "d.png", "e.png", "f.png"],
    );
    // Items 2 and 3 (the second batch) and 4 and 5 (the last) lose their masks' data.
    for name in ["c.png", "d.png", "e.png", "f.png"] {
        image::GrayImage::new(5, 5).save(masks.join(name)).unwrap();
    }
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&images).unwrap());
    let o = LoaderOptions {
        epochs: Some(2),
        ..options(&masks, 2, true)
    };
    let mut loader = Loader::new(ds, o).unwrap();
    let mut seen = Vec::new();
    for b in loader.by_ref() {
        let b = b.unwrap();
        assert!(!b.is_empty(), "an empty batch was delivered: {b:?}");
        seen.push((b.epoch, b.index, b.ids.clone(), b.skipped.len()));
    }
    // Epoch 0: batch 0 (0, 1); batches 1 and 2 skipped whole. Epoch 1 starts with their four skips.
    assert_eq!(seen, [(0, 0, vec![0, 1], 0), (1, 0, vec![0, 1], 4)]);
    assert_eq!(
        loader.state().epoch,
        2,
        "the run ended after its last batch"
    );
    assert_eq!(loader.stats().items_skipped, 8);
}

#[test]
fn a_mask_that_is_a_fifo_a_device_or_a_folder_is_named_for_what_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = tree(tmp.path(), &["a.png", "b.png", "c.png", "d.png"]);
    std::fs::remove_file(masks.join("a.png")).unwrap();
    let fifo = std::ffi::CString::new(masks.join("a.png").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::remove_file(masks.join("b.png")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", masks.join("b.png")).unwrap();
    std::fs::remove_file(masks.join("c.png")).unwrap();
    std::fs::create_dir(masks.join("c.png")).unwrap();
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&images).unwrap());
    let e = run(ds.clone(), options(&masks, 4, false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.png") && e.contains("FIFO"), "{e}");
    assert!(!e.contains("missing"), "{e}");
    let mut o = options(&masks, 4, true);
    o.batch_size = 1;
    let mut skipped = Vec::new();
    for b in Loader::new(ds, o).unwrap() {
        skipped.extend(b.unwrap().skipped);
    }
    let text = |i: usize| skipped.iter().find(|s| s.0 == i).unwrap().1.clone();
    assert!(text(0).contains("a FIFO"), "{}", text(0));
    assert!(text(1).contains("character device"), "{}", text(1));
    assert!(text(2).contains("a folder"), "{}", text(2));
    assert_eq!(skipped.len(), 3, "{skipped:?}");
}

#[test]
fn boxes_from_a_store_are_refused_saying_they_are_read_locally() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, _) = tree(tmp.path(), &["a.png"]);
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&images).unwrap());
    let o = LoaderOptions {
        targets: TargetOptions {
            boxes: Some("s3://bucket/instances.json".into()),
            ..TargetOptions::default()
        },
        ..LoaderOptions::default()
    };
    let e = Loader::new(ds, o).err().unwrap().to_string();
    assert!(
        e.contains("s3://bucket/instances.json") && e.contains("local"),
        "{e}"
    );
    assert!(!e.contains("No such file"), "{e}");
}

#[test]
fn a_huge_coco_file_name_is_quoted_in_a_bounded_message() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, _) = tree(tmp.path(), &["a.png"]);
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&images).unwrap());
    let long = "x".repeat(5 << 20);
    for name in [format!("/{long}"), format!("{long}.png")] {
        let json = format!(r#"{{"images": [{{"id": 1, "file_name": "{name}"}}]}}"#);
        let path = tmp.path().join("boxes.json");
        std::fs::write(&path, json).unwrap();
        let o = LoaderOptions {
            targets: TargetOptions {
                boxes: Some(path),
                ..TargetOptions::default()
            },
            ..LoaderOptions::default()
        };
        let e = Loader::new(ds.clone(), o).err().unwrap().to_string();
        assert!(e.len() < 2000, "{} bytes: {}", e.len(), &e[..300]);
        assert!(
            e.contains("boxes.json") && e.contains("more characters"),
            "{e}"
        );
    }
}

fn liquid(root: &Path, images: &Path) -> PathBuf {
    let out = root.join("liquid");
    let build = LiquidBuild {
        threads: 2,
        probe_items: 4,
        probe_time: std::time::Duration::from_millis(5),
        ..LiquidBuild::default()
    };
    to_liquid(images, &out, &build, |_| {}).unwrap();
    out
}

/// A Liquid dataset pairs its items with masks (and boxes) by the names `to_liquid` records in
/// `item-names.json`: each mask is its own image's whatever order the items are stored in.
#[test]
fn liquid_items_pair_with_their_own_masks_by_their_recorded_names() {
    let tmp = tempfile::tempdir().unwrap();
    let names = ["x/a.png", "x/b.png", "y/c.png", "y/d.png", "y/e.png"];
    let (images, masks) = tree(tmp.path(), &names);
    let dir = liquid(tmp.path(), &images);
    let ds: Arc<dyn Dataset> = Arc::new(LiquidShards::open(&dir).unwrap());
    let seen = run(ds.clone(), options(&masks, 2, false)).unwrap();
    let mut classes: Vec<u8> = Vec::new();
    for (_, px, m, _) in &seen {
        for (p, m) in px.iter().zip(m) {
            assert_eq!(*p, 10 * m, "each mask is its own image's");
            classes.push(*m);
        }
    }
    classes.sort();
    assert_eq!(classes, [1, 2, 3, 4, 5]);
}

#[test]
fn a_liquid_dataset_naming_two_items_alike_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, _) = tree(tmp.path(), &["x/a.png", "x/b.png", "x/c.png"]);
    let dir = liquid(tmp.path(), &images);
    let file = dir.join("item-names.json");
    let mut names: Vec<String> = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    names[2] = names[0].clone();
    std::fs::write(&file, serde_json::to_vec(&names).unwrap()).unwrap();
    let e = LiquidShards::open(&dir).err().unwrap().to_string();
    assert!(
        e.contains("item-names.json") && e.contains(&names[0]) && e.contains("both named"),
        "{e}"
    );
}
