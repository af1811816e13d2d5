//! Masks and boxes end to end on a Cityscapes-like tree made from the corpus: images under
//! `leftImg8bit/<split>/<city>/<name>_leftImg8bit.png`, label maps derived from them by colour
//! quantisation under `gtFine/.../<name>_gtFine_labelIds.png`, and a COCO file of one box per class present.
//! Because each label is a function of its image pixel, a mask sample that equals the quantised image
//! sample pixel for pixel has exactly the image's geometry.

mod common;

use loader::convert::{ConvertOptions, Target, convert_folder};
use loader::targets::TargetOptions;
use loader::targets::masks::MaskNaming;
use loader::{
    Crop, DType, Dataset, ImageFolder, ItemKey, Layout, Loader, LoaderOptions, SampleSpec,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// 19 classes from a pixel, as Cityscapes has: the colour quantised (2 levels of red, 3 of green, 3 of
/// blue, folded onto 19).
fn class_of(p: &[u8]) -> u8 {
    let (r, g, b) = (p[0] as u32 / 128, p[1] as u32 / 86, p[2] as u32 / 86);
    ((r * 9 + g * 3 + b) % 19) as u8
}

type SizedBoxes = ((u32, u32), Vec<[f64; 5]>);

struct Tree {
    _tmp: tempfile::TempDir,
    images: PathBuf,
    masks: PathBuf,
    coco: PathBuf,
    /// Per image name (relative, with extension): its size and its boxes (x1, y1, x2, y2, class).
    boxes: HashMap<String, SizedBoxes>,
}

fn naming() -> MaskNaming {
    MaskNaming {
        image_suffix: "_leftImg8bit".into(),
        mask_suffix: "_gtFine_labelIds".into(),
    }
}

fn tree() -> &'static Tree {
    static T: OnceLock<Tree> = OnceLock::new();
    T.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let images = tmp.path().join("leftImg8bit");
        let masks = tmp.path().join("gtFine");
        let files = loader::image_files(&common::corpus()).unwrap().files;
        let mut coco_images = Vec::new();
        let mut coco_annotations = Vec::new();
        let mut boxes = HashMap::new();
        for (i, (rel, _)) in files.iter().enumerate() {
            let img = image::open(common::corpus().join(rel)).unwrap();
            // An eighth of the size, and one odd-sized image smaller than the sample.
            let (w, h) = if i == 0 {
                (61, 37)
            } else {
                (img.width() / 8, img.height() / 8)
            };
            let rgb = img.thumbnail_exact(w, h).to_rgb8();
            let city = ["aachen", "bochum"][i % 2];
            let stem = rel.file_stem().unwrap().to_string_lossy().replace('-', "_");
            let name = format!("train/{city}/{stem}_{i:06}_leftImg8bit.png");
            let mask_name = name.replace("_leftImg8bit", "_gtFine_labelIds");
            for (root, n) in [(&images, &name), (&masks, &mask_name)] {
                std::fs::create_dir_all(root.join(n).parent().unwrap()).unwrap();
            }
            rgb.save(images.join(&name)).unwrap();
            let labels = image::GrayImage::from_fn(w, h, |x, y| {
                image::Luma([class_of(&rgb.get_pixel(x, y).0)])
            });
            labels.save(masks.join(&mask_name)).unwrap();
            // One box per class present: the extent of its pixels.
            let mut ext: HashMap<u8, [u32; 4]> = HashMap::new();
            for (x, y, p) in labels.enumerate_pixels() {
                let e = ext.entry(p.0[0]).or_insert([x, y, x, y]);
                *e = [e[0].min(x), e[1].min(y), e[2].max(x), e[3].max(y)];
            }
            let mut mine = Vec::new();
            for (c, e) in ext {
                let b = [e[0] as f64, e[1] as f64, e[2] as f64 + 1.0, e[3] as f64 + 1.0];
                mine.push([b[0], b[1], b[2], b[3], c as f64]);
                coco_annotations.push(serde_json::json!({
                    "id": coco_annotations.len() + 1, "image_id": i, "category_id": c, "iscrowd": 0,
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "area": 1.0,
                }));
            }
            // A crowd region that must not appear.
            coco_annotations.push(serde_json::json!({
                "id": coco_annotations.len() + 1, "image_id": i, "category_id": 99, "iscrowd": 1,
                "bbox": [0, 0, w, h],
            }));
            coco_images.push(serde_json::json!({"id": i, "file_name": name, "width": w, "height": h}));
            boxes.insert(name, ((w, h), mine));
        }
        let coco = tmp.path().join("instances.json");
        let doc = serde_json::json!({"images": coco_images, "annotations": coco_annotations,
            "categories": (0..19).map(|c| serde_json::json!({"id": c, "name": format!("c{c}")})).collect::<Vec<_>>()});
        std::fs::write(&coco, serde_json::to_vec(&doc).unwrap()).unwrap();
        Tree {
            _tmp: tmp,
            images,
            masks,
            coco,
            boxes,
        }
    })
}

fn options(t: &Tree, masks: &Path) -> LoaderOptions {
    LoaderOptions {
        batch_size: 4,
        sample: SampleSpec {
            height: 48,
            width: 64,
            crop: Crop::Random,
            hflip: true,
            layout: Layout::Nhwc,
            dtype: DType::U8,
            ..SampleSpec::default()
        },
        decode_threads: 2,
        seed: 7,
        epochs: Some(2),
        targets: TargetOptions {
            masks: Some(masks.to_path_buf()),
            naming: naming(),
            boxes: Some(t.coco.clone()),
            ..TargetOptions::default()
        },
        ..LoaderOptions::default()
    }
}

/// The boxes of `name` through `spec`'s geometry for `key`, computed here from its numbers alone:
/// scale each axis by `dst_len / src_len` from the span's start, drop the kept outputs' offset, mirror
/// within the kept width, land at (dx, dy), clip to the kept part, drop what is under a pixel.
fn expected_boxes(name: &str, spec: &SampleSpec, key: &ItemKey) -> Vec<[f64; 5]> {
    let ((w, h), boxes) = &tree().boxes[name];
    let g = spec.geometry(*w, *h, key);
    let map = |v: f64, a: &loader::Axis| {
        (v - a.src as f64) * a.dst_len as f64 / a.src_len as f64 - a.offset as f64
    };
    let (kw, kh) = (g.x.len as f64, g.y.len as f64);
    let (x0, y0) = (g.dx as f64, g.dy as f64);
    let mut out = Vec::new();
    for b in boxes {
        let (mut a, mut c) = (map(b[0], &g.x), map(b[2], &g.x));
        if g.flip {
            (a, c) = (kw - c, kw - a);
        }
        let (a, c) = ((a + x0).clamp(x0, x0 + kw), (c + x0).clamp(x0, x0 + kw));
        let t = (map(b[1], &g.y) + y0).clamp(y0, y0 + kh);
        let d = (map(b[3], &g.y) + y0).clamp(y0, y0 + kh);
        if c - a >= 1.0 && d - t >= 1.0 {
            out.push([a, t, c, d, b[4]]);
        }
    }
    out.sort_by(|p, q| p.partial_cmp(q).unwrap());
    out
}

/// Runs `opts` over `images` and checks every sample's mask and boxes; returns the masks by item name
/// and epoch.
fn check_run(images: &Path, opts: LoaderOptions) -> HashMap<(usize, String), Vec<u16>> {
    let ds = Arc::new(ImageFolder::open(images).unwrap());
    let spec = opts.sample;
    let ignore = opts.targets.ignore_index;
    let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
    let mut masks = HashMap::new();
    let mut padded = 0;
    for b in Loader::new(ds.clone(), opts.clone()).unwrap() {
        let b = b.unwrap();
        let m = b.masks.as_ref().expect("masks");
        assert_eq!(m.shape(), [b.len(), 48, 64]);
        let (boxes, labels) = (b.boxes.as_ref().unwrap(), b.box_labels.as_ref().unwrap());
        assert_eq!((boxes.len(), labels.len()), (b.len(), b.len()));
        for (i, &id) in b.ids.iter().enumerate() {
            *seen.entry((b.epoch, id)).or_default() += 1;
            let name = ds.name(id).unwrap().replace(".l3", ".png");
            let px = b.sample_bytes(i).unwrap();
            let mask = m.mask(i).unwrap();
            for (k, &v) in mask.iter().enumerate() {
                if v == ignore {
                    padded += 1;
                    assert_eq!(
                        &px[3 * k..3 * k + 3],
                        [0, 0, 0],
                        "padding where the mask is"
                    );
                } else {
                    assert_eq!(
                        v,
                        class_of(&px[3 * k..3 * k + 3]) as u16,
                        "{name} pixel {k}"
                    );
                }
            }
            let key = ItemKey {
                seed: opts.seed,
                epoch: b.epoch,
                index: id,
            };
            let want = expected_boxes(&name, &spec, &key);
            let mut got: Vec<[f64; 5]> = boxes[i]
                .iter()
                .zip(&labels[i])
                .map(|(b, &l)| [b[0] as f64, b[1] as f64, b[2] as f64, b[3] as f64, l as f64])
                .collect();
            got.sort_by(|p, q| p.partial_cmp(q).unwrap());
            assert_eq!(got.len(), want.len(), "{name}: {got:?} vs {want:?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.iter().zip(w).all(|(a, b)| (a - b).abs() < 1e-3),
                    "{name}: {g:?} vs {w:?}"
                );
            }
            masks.insert((b.epoch, name), mask);
        }
    }
    let resized_crop = matches!(opts.sample.recipe, loader::Recipe::ResizedCrop { .. });
    assert_eq!(
        padded > 0,
        !resized_crop,
        "the small image is padded with ignore_index (a resized crop pads nothing)"
    );
    assert_eq!(seen.len(), 2 * ds.len(), "every item in every epoch");
    assert!(seen.values().all(|&n| n == 1), "each exactly once");
    masks
}

/// The tree's images and masks converted to L3 (masks one-channel, lossless), once.
fn l3_tree() -> &'static (PathBuf, PathBuf) {
    static T: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    T.get_or_init(|| {
        let t = tree();
        let dir = t._tmp.path();
        let conv = ConvertOptions {
            threads: 2,
            to_8bit: false,
        };
        let (l3_images, l3_masks) = (dir.join("l3-images"), dir.join("l3-masks"));
        convert_folder(&t.images, &l3_images, Target::L3_DEFAULT, &conv, &|_, _| {}).unwrap();
        convert_folder(&t.masks, &l3_masks, Target::L3_DEFAULT, &conv, &|_, _| {}).unwrap();
        (l3_images, l3_masks)
    })
}

#[test]
fn every_item_once_with_its_mask_and_boxes_in_every_format() {
    let t = tree();
    let png = check_run(&t.images, options(t, &t.masks));
    // Images and masks as L3 (masks one-channel, lossless, read by region): the same masks.
    let (l3_images, l3_masks) = l3_tree();
    let one = loader::image_files(l3_masks).unwrap().files[0].0.clone();
    let bytes = std::fs::read(l3_masks.join(one)).unwrap();
    assert_eq!(l3_format::L3File::parse(&bytes).unwrap().channels(), 1);
    let l3 = check_run(l3_images, options(t, l3_masks));
    assert_eq!(png, l3);
}

/// Each batch's masks and images, as bytes.
type BatchBytes = Vec<(Vec<u8>, Vec<u8>)>;

/// One run over the L3 tree: its batches' masks and images, and the bytes it read.
fn l3_run(opts: LoaderOptions) -> (BatchBytes, u64) {
    let ds = Arc::new(ImageFolder::open(&l3_tree().0).unwrap());
    let mut l = Loader::new(ds, opts).unwrap();
    let mut got = Vec::new();
    for b in l.by_ref() {
        let b = b.unwrap();
        got.push((
            b.masks.as_ref().unwrap().bytes().unwrap().to_vec(),
            b.pixels.bytes().unwrap().to_vec(),
        ));
    }
    (got, l.stats().bytes_read)
}

#[test]
fn l3_masks_read_by_region_equal_whole_reads_and_read_fewer_bytes() {
    let t = tree();
    let (_, l3_masks) = l3_tree();
    let mask_files: u64 = loader::image_files(l3_masks)
        .unwrap()
        .files
        .iter()
        .map(|(rel, _)| std::fs::metadata(l3_masks.join(rel)).unwrap().len())
        .sum();
    for recipe in [
        loader::Recipe::Crop,
        loader::Recipe::Jitter { range: [0.5, 2.0] },
        loader::Recipe::ResizedCrop {
            scale: [0.08, 1.0],
            ratio: loader::DEFAULT_RATIO,
        },
        loader::Recipe::Resize { shorter: 40 },
    ] {
        let mut opts = options(t, l3_masks);
        opts.targets.boxes = None;
        opts.sample.recipe = recipe;
        let with = |decode, masks: bool| {
            let mut o = opts.clone();
            o.decode = decode;
            if !masks {
                o.targets = TargetOptions::default();
                o.targets.boxes = Some(t.coco.clone());
            }
            o
        };
        let (region, region_bytes) = l3_run(with(loader::DecodeScope::Region, true));
        let (whole, whole_bytes) = l3_run(with(loader::DecodeScope::Whole, true));
        assert_eq!(region.len(), whole.len());
        for (i, (r, w)) in region.iter().zip(&whole).enumerate() {
            assert!(r.0 == w.0, "{recipe:?}: batch {i}'s masks differ");
            assert!(r.1 == w.1, "{recipe:?}: batch {i}'s images differ");
        }
        // The masks' share of the bytes: what the same run reads without them, taken away.
        let images_only = |decode| {
            let ds = Arc::new(ImageFolder::open(&l3_tree().0).unwrap());
            let mut l = Loader::new(ds, with(decode, false)).unwrap();
            l.by_ref().for_each(|b| drop(b.unwrap()));
            l.stats().bytes_read
        };
        let region_masks = region_bytes - images_only(loader::DecodeScope::Region);
        let whole_masks = whole_bytes - images_only(loader::DecodeScope::Whole);
        assert_eq!(whole_masks, 2 * mask_files, "two epochs of whole masks");
        let about =
            format!("{recipe:?}: masks read by region {region_masks} bytes, whole {whole_masks}");
        assert!(region_masks > 0, "{about}");
        // A crop of a large image (DeepLab's jitter, a plain crop) reads a part of its mask; a
        // random-resized crop of these small images, or a resize, most or all of it (and then the
        // prefix's read-ahead makes a region read of these few-kilobyte masks a little larger than
        // the file).
        if matches!(recipe, loader::Recipe::Crop | loader::Recipe::Jitter { .. }) {
            assert!(region_masks * 10 < whole_masks * 7, "{about}");
        }
    }
}

#[test]
fn a_truncated_or_corrupt_l3_mask_read_by_region_is_named() {
    let t = tree();
    let (l3_images, l3_masks) = l3_tree();
    let ds = Arc::new(ImageFolder::open(l3_images).unwrap());
    let files = loader::image_files(l3_masks).unwrap().files;
    for damage in ["truncated", "corrupt"] {
        let tmp = tempfile::tempdir().unwrap();
        let masks = tmp.path().join("gtFine");
        copy_tree(l3_masks, &masks);
        // Every mask damaged but item 0's (the first paired mask, which the loader reads whole when it
        // starts to learn the masks' bit depth), so that the first batch meets damaged ones.
        let first = ds
            .name(0)
            .unwrap()
            .replace("_leftImg8bit", "_gtFine_labelIds");
        for (rel, _) in &files {
            if rel.to_string_lossy() == first {
                continue;
            }
            let p = masks.join(rel);
            let mut bytes = std::fs::read(&p).unwrap();
            let prefix = l3_format::L3Index::prefix_len(&bytes).unwrap();
            if damage == "truncated" {
                bytes.truncate(prefix / 2);
            } else {
                bytes[prefix..].iter_mut().for_each(|b| *b ^= 0xa5);
            }
            std::fs::write(&p, bytes).unwrap();
        }
        let mut opts = options(t, &masks);
        opts.targets.boxes = None;
        opts.sample.recipe = loader::Recipe::Jitter { range: [0.5, 2.0] };
        let mut l = Loader::new(ds.clone(), opts).unwrap();
        let Err(e) = l.next().unwrap() else {
            panic!("{damage}: the first batch decoded");
        };
        let e = e.to_string();
        assert!(
            e.contains("gtFine") && e.contains("_gtFine_labelIds.l3"),
            "{damage}: {e}"
        );
    }
}

#[test]
fn masks_and_boxes_follow_resampling_recipes() {
    // With nearest interpolation the image samples are nearest-resampled too, so a mask that follows
    // the image's geometry still equals the quantised image wherever the image is.
    let t = tree();
    for recipe in [
        loader::Recipe::Jitter { range: [0.5, 2.0] },
        loader::Recipe::ResizedCrop {
            scale: [0.08, 1.0],
            ratio: loader::DEFAULT_RATIO,
        },
        loader::Recipe::Resize { shorter: 40 },
    ] {
        let mut opts = options(t, &t.masks);
        opts.sample.recipe = recipe;
        opts.sample.interpolation = loader::Interpolation::Nearest;
        check_run(&t.images, opts);
    }
}

#[test]
fn resume_with_targets_repeats_the_run() {
    let t = tree();
    let ds = Arc::new(ImageFolder::open(&t.images).unwrap());
    let opts = options(t, &t.masks);
    let all: Vec<_> = Loader::new(ds.clone(), opts.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let mut first = Loader::new(ds.clone(), opts.clone()).unwrap();
    let _ = first.next().unwrap().unwrap();
    let _ = first.next().unwrap().unwrap();
    let state = first.state();
    drop(first);
    let rest: Vec<_> = Loader::resume(ds.clone(), opts.clone(), state.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(rest.len(), all.len() - 2);
    for (a, b) in all[2..].iter().zip(&rest) {
        assert_eq!(a.ids, b.ids);
        assert_eq!(
            a.masks.as_ref().unwrap().bytes().unwrap(),
            b.masks.as_ref().unwrap().bytes().unwrap()
        );
        assert_eq!(a.boxes, b.boxes);
        assert_eq!(a.box_labels, b.box_labels);
    }
    // The state records the targets: resuming without them is refused, naming them.
    let plain = LoaderOptions {
        targets: TargetOptions::default(),
        ..opts
    };
    let e = Loader::resume(ds, plain, state).err().unwrap().to_string();
    assert!(e.contains("masks"), "{e}");
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, _) in loader::image_files(from).unwrap().files {
        std::fs::create_dir_all(to.join(&rel).parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), to.join(&rel)).unwrap();
    }
}

#[test]
fn a_missing_or_mis_sized_mask_is_named_with_its_image_and_skipped_on_request() {
    let t = tree();
    let tmp = tempfile::tempdir().unwrap();
    let masks = tmp.path().join("gtFine");
    copy_tree(&t.masks, &masks);
    let files = loader::image_files(&masks).unwrap().files;
    let (gone, small) = (&files[1].0, &files[2].0);
    std::fs::remove_file(masks.join(gone)).unwrap();
    image::GrayImage::new(5, 5).save(masks.join(small)).unwrap();
    let ds = Arc::new(ImageFolder::open(&t.images).unwrap());
    let opts = LoaderOptions {
        targets: TargetOptions {
            boxes: None,
            ..options(t, &masks).targets
        },
        epochs: Some(1),
        ..options(t, &masks)
    };
    let gone_stem = gone.to_string_lossy().replace(".png", "");
    let e = Loader::new(ds.clone(), opts.clone())
        .err()
        .unwrap()
        .to_string();
    let image_of = |m: &Path| {
        m.to_string_lossy()
            .replace("_gtFine_labelIds", "_leftImg8bit")
    };
    assert!(e.contains(&gone_stem) && e.contains(&image_of(gone)), "{e}");
    let skipping = LoaderOptions {
        skip_errors: true,
        ..opts.clone()
    };
    let mut skipped = Vec::new();
    let mut delivered = 0;
    for b in Loader::new(ds.clone(), skipping).unwrap() {
        let b = b.unwrap();
        delivered += b.len();
        assert_eq!(b.masks.as_ref().unwrap().shape()[0], b.len());
        skipped.extend(b.skipped);
    }
    assert_eq!(delivered, ds.len() - 2);
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    let text = format!("{skipped:?}");
    assert!(
        text.contains(&image_of(small)) && text.contains("5x5"),
        "{text}"
    );
    assert!(text.contains(&gone_stem), "{text}");
}

#[test]
fn a_boxes_file_naming_images_outside_the_source_or_malformed_is_named() {
    let t = tree();
    let tmp = tempfile::tempdir().unwrap();
    let ds = Arc::new(ImageFolder::open(&t.images).unwrap());
    let run = |json: &[u8]| {
        let p = tmp.path().join("b.json");
        std::fs::write(&p, json).unwrap();
        let opts = LoaderOptions {
            targets: TargetOptions {
                boxes: Some(p),
                ..TargetOptions::default()
            },
            ..LoaderOptions::default()
        };
        Loader::new(ds.clone(), opts).err().unwrap().to_string()
    };
    let e =
        run(br#"{"images": [{"id": 1, "file_name": "train/nowhere/x.png"}], "annotations": []}"#);
    assert!(e.contains("b.json") && e.contains("train/nowhere/x"), "{e}");
    let e = run(b"{\"images\": [");
    assert!(e.contains("b.json") && e.contains("COCO"), "{e}");
}

/// The GPU decodes L3 only: masks in any other format (here PNG, with L3 images) are refused on a
/// device when the loader opens — before any device is opened, so also here without one — naming the
/// mask and the conversion that fixes it; never a silent CPU decode.
#[cfg(feature = "gpu")]
#[test]
fn device_masks_must_be_l3_and_are_refused_by_name() {
    let t = tree();
    let (images, _) = l3_tree();
    let ds = Arc::new(ImageFolder::open(images).unwrap());
    let o = LoaderOptions {
        device: loader::Device::Cuda(0),
        ..options(t, &t.masks)
    };
    let e = match Loader::new(ds, o) {
        Ok(_) => panic!("PNG masks on a device were accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("gtFine") && e.contains("_gtFine_labelIds.png"),
        "{e}"
    );
    assert!(e.contains("l3 convert --to l3"), "{e}");
}

/// Masks on the device: one-channel L3 masks decoded and nearest-resampled in the kernels with their
/// images' geometries, `ignore_index` where a crop reaches past the image — every recipe, region and
/// whole reads, with luma images too — equal the CPU loader's masks (and images) byte for byte.
#[cfg(feature = "gpu")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_masks_equal_cpu_masks() {
    use loader::{DecodeScope, Device, Interpolation, Recipe};
    let t = tree();
    let (images, masks) = l3_tree();
    let ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(images).unwrap());
    let cases = [
        (
            Recipe::Crop,
            Interpolation::Bilinear,
            3u8,
            DecodeScope::Region,
        ),
        (
            Recipe::Jitter { range: [0.5, 2.0] },
            Interpolation::Bilinear,
            3,
            DecodeScope::Region,
        ),
        (
            Recipe::Jitter { range: [0.3, 1.5] },
            Interpolation::Nearest,
            1,
            DecodeScope::Whole,
        ),
        (
            Recipe::ResizedCrop {
                scale: [0.08, 1.0],
                ratio: loader::DEFAULT_RATIO,
            },
            Interpolation::Bilinear,
            4,
            DecodeScope::Region,
        ),
        // Whole images (crop=None), each batch padded to its largest: images with fill, masks with
        // the ignore index.
        (
            Recipe::Whole(loader::Whole {
                max_size: Some(40),
                ..loader::Whole::default()
            }),
            Interpolation::Bilinear,
            3,
            DecodeScope::Region,
        ),
        (
            Recipe::Whole(loader::Whole {
                jitter: Some([0.5, 1.5]),
                max_size: Some(64),
                ..loader::Whole::default()
            }),
            Interpolation::Nearest,
            1,
            DecodeScope::Whole,
        ),
    ];
    for (recipe, interpolation, channels, scope) in cases {
        let with = |device| {
            let mut o = options(t, masks);
            o.device = device;
            o.decode = scope;
            o.sample.recipe = recipe;
            if recipe.is_whole() {
                // What `Settings` makes of crop=None: not cropped, the spec holding the bound.
                let side = o.sample.whole_bound().unwrap_or(64);
                (o.sample.crop, o.sample.width, o.sample.height) = (Crop::Center, side, side);
            }
            o.sample.interpolation = interpolation;
            o.sample.channels = channels;
            o.targets.ignore_index = 250;
            o
        };
        let tag = format!("{recipe:?} {interpolation:?} channels {channels} {scope:?}");
        let gpu: Vec<_> = match Loader::new(ds.clone(), with(Device::Cuda(0))) {
            Ok(l) => l.map(|b| b.unwrap()).collect(),
            Err(e) => panic!("needs a CUDA GPU: {e}"),
        };
        let cpu: Vec<_> = Loader::new(ds.clone(), with(Device::Cpu))
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        assert_eq!(gpu.len(), cpu.len(), "{tag}");
        for (g, c) in gpu.iter().zip(&cpu) {
            assert_eq!((&g.ids, &g.geometry), (&c.ids, &c.geometry), "{tag}");
            let (gm, cm) = (g.masks.as_ref().unwrap(), c.masks.as_ref().unwrap());
            assert_eq!(gm.device(), Device::Cuda(0), "{tag}");
            assert_eq!(gm.shape(), cm.shape(), "{tag}");
            assert!(
                cm.bytes() == Some(&gm.to_host().unwrap()[..]),
                "{tag}: masks of epoch {} batch {}",
                g.epoch,
                g.index
            );
            assert!(
                c.pixels.bytes() == Some(&g.pixels.to_host().unwrap()[..]),
                "{tag}: images of epoch {} batch {}",
                g.epoch,
                g.index
            );
            assert_eq!(g.boxes, c.boxes, "{tag}");
        }
    }
}
