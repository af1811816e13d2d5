//! Shared fixtures for the loader's end-to-end tests: the real corpus, downscaled once per test binary.
#![allow(dead_code)]

use loader::convert::{ConvertOptions, Target, convert_folder};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn two_threads() -> ConvertOptions {
    ConvertOptions {
        threads: 2,
        to_8bit: false,
    }
}

/// `$L3_CORPUS` or `../shared/corpus` beside the workspace.
pub fn corpus() -> PathBuf {
    let p = std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"));
    assert!(
        p.is_dir(),
        "the test corpus is missing: {} (set L3_CORPUS)",
        p.display()
    );
    p
}

pub struct Fixture {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    /// The corpus at 1/4 scale, JPEGs as JPEG (quality 90) and PNGs as PNG, in class folders
    /// `photo/` (from JPEG) and `render/` (from PNG, the RGBA one included).
    pub mixed: PathBuf,
    pub l3: PathBuf,
    pub raw: PathBuf,
}

/// The corpus at quarter resolution (every test decodes it many times; full size would take minutes
/// in CI), converted to L3 and raw beside it.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("temp dir");
        let root = tmp.path().to_path_buf();
        let mixed = root.join("mixed");
        for (rel, fmt) in loader::image_files(&corpus()).expect("corpus").files {
            let img = image::open(corpus().join(&rel)).expect("corpus image");
            let small = img.thumbnail(img.width() / 4, img.height() / 4);
            let (class, ext) = match fmt {
                loader::Format::Jpeg => ("photo", "jpg"),
                _ => ("render", "png"),
            };
            let dst = mixed
                .join(class)
                .join(rel.with_extension(ext).file_name().unwrap());
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            if ext == "jpg" {
                let rgb = small.to_rgb8();
                let f = std::fs::File::create(&dst).unwrap();
                image::codecs::jpeg::JpegEncoder::new_with_quality(f, 90)
                    .encode_image(&rgb)
                    .unwrap();
            } else {
                small.save(&dst).unwrap();
            }
        }
        let l3 = root.join("l3");
        let raw = root.join("raw");
        convert_folder(&mixed, &l3, Target::L3_DEFAULT, &two_threads(), &|_, _| {}).expect("to l3");
        convert_folder(&mixed, &raw, Target::Raw, &two_threads(), &|_, _| {}).expect("to raw");
        Fixture {
            _tmp: tmp,
            root,
            mixed,
            l3,
            raw,
        }
    })
}

/// Reference RGB decode of a file (L3 and raw through the corresponding source file in `mixed`): JPEG with
/// libjpeg-turbo's defaults (the toolkit's JPEG decoder, `pcr::Decoder::Libjpeg`), everything else with the
/// `image` crate's standard path.
pub fn reference_rgb(path: &Path) -> image::RgbImage {
    let bytes = std::fs::read(path).expect("reference file");
    if bytes.starts_with(&[0xFF, 0xD8]) {
        let img = pcr::Decoder::Libjpeg
            .decode(&bytes)
            .expect("reference decode");
        return image::RgbImage::from_raw(img.width, img.height, img.pixels).expect("RGB");
    }
    image::load_from_memory(&bytes)
        .expect("reference decode")
        .to_rgb8()
}

/// The centre crop (zero-padded) of `img` at `h`x`w`, NHWC, computed independently of the loader.
pub fn center_crop(img: &image::RgbImage, h: u32, w: u32) -> Vec<u8> {
    let mut out = vec![0u8; (h * w * 3) as usize];
    let (iw, ih) = img.dimensions();
    for y in 0..h {
        for x in 0..w {
            // Destination (x, y) maps to source (x + ox, y + oy) with ox = (iw - w) / 2 when cropping,
            // and -((w - iw) / 2) when padding.
            let sx = x as i64
                + if iw >= w {
                    ((iw - w) / 2) as i64
                } else {
                    -(((w - iw) / 2) as i64)
                };
            let sy = y as i64
                + if ih >= h {
                    ((ih - h) / 2) as i64
                } else {
                    -(((h - ih) / 2) as i64)
                };
            if sx >= 0 && sy >= 0 && (sx as u32) < iw && (sy as u32) < ih {
                let p = img.get_pixel(sx as u32, sy as u32).0;
                let i = ((y * w + x) * 3) as usize;
                out[i..i + 3].copy_from_slice(&p);
            }
        }
    }
    out
}

/// Writes the fixture's L3 images as a Liquid multi-format dataset (L3 + raw at `ratio`, seed 3) into `dir`,
/// item ids 100 + position.
pub fn write_liquid_l3(ratio: liquid_sampler::Ratio, dir: &Path) {
    use liquid_sampler::profile::{SourceItem, write_dataset};
    use loader::Dataset as _;
    let l3 = loader::ImageFolder::open(&fixture().l3).unwrap();
    let sources: Vec<SourceItem> = (0..l3.len())
        .map(|i| SourceItem {
            id: 100 + i as u64,
            label: l3.label(i),
            path: l3.path(i).to_path_buf(),
            tag: "l3".into(),
        })
        .collect();
    let dec = |bytes: &[u8], out: &mut Vec<u8>| -> Result<liquid_sampler::Dims, String> {
        let f = l3_format::L3File::parse(bytes).map_err(|e| e.to_string())?;
        out.resize(f.decoded_len(), 0);
        f.decode_hwc(out).map_err(|e| e.to_string())?;
        Ok(liquid_sampler::Dims {
            width: f.width(),
            height: f.height(),
            channels: f.channels(),
        })
    };
    let decoders: [(&str, &dyn liquid_sampler::Decoder); 1] = [("l3", &dec)];
    write_dataset(&sources, &decoders, ratio, 3, dir).unwrap();
}

/// Drops `loader` and asserts that every thread it started (as `monitor` counts them) ended within 2 s.
pub fn assert_drop_stops_threads(loader: loader::Loader, monitor: &loader::ThreadMonitor) {
    let t0 = std::time::Instant::now();
    drop(loader);
    assert_eq!(monitor.alive(), 0);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "drop took {:?}",
        t0.elapsed()
    );
}

/// Copies every file under `from` (any kind, folders recreated) to `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Moves `path`'s modification time 5 s later without changing its bytes: another version of the file,
/// as a copy or a rewrite would make.
pub fn touch_later(path: &Path) {
    let later =
        std::fs::metadata(path).unwrap().modified().unwrap() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(later)
        .unwrap();
}

/// A segmentation mask folder (one-channel L3, so that region reads inside masks are exercised) and a
/// COCO box file for the fixture's mixed folder, item for item.
pub struct Targets {
    pub masks: PathBuf,
    pub coco: PathBuf,
}

/// [`targets`] under `dir`, and the fixture's L3 folder written to shards of about 64 KiB in `out` that
/// carry them as members of their samples: the targets and the number of shards (at least two).
pub fn targets_in_shards(f: &Fixture, dir: &Path, out: &Path) -> (Targets, usize) {
    let t = targets(f, dir);
    let build = loader::convert::ShardBuild {
        shard_size: 64 << 10,
        masks: Some(t.masks.clone()),
        boxes: Some(t.coco.clone()),
        ..loader::convert::ShardBuild::default()
    };
    let s = loader::convert::to_shards(&f.l3, out, &build).unwrap();
    assert!(s.shards >= 2, "{} shards", s.shards);
    (t, s.shards)
}

/// [`Targets`] under `dir`: each image's label map (a class per band of 40 grey levels), and one box
/// per image, its label the image's index modulo 3.
pub fn targets(f: &Fixture, dir: &Path) -> Targets {
    let (png_masks, masks) = (dir.join("masks-png"), dir.join("masks"));
    let mut coco_images = Vec::new();
    let mut annotations = Vec::new();
    for (i, (rel, _)) in loader::image_files(&f.mixed)
        .unwrap()
        .files
        .iter()
        .enumerate()
    {
        let img = image::open(f.mixed.join(rel)).unwrap().to_luma8();
        let (w, h) = img.dimensions();
        let mask =
            image::GrayImage::from_fn(w, h, |x, y| image::Luma([img.get_pixel(x, y).0[0] / 40]));
        let dst = png_masks.join(rel.with_extension("png"));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        mask.save(&dst).unwrap();
        let name = rel.with_extension("l3").to_str().unwrap().to_string();
        coco_images.push(serde_json::json!({"id": i, "file_name": name}));
        let bbox = [
            w as f64 / 4.0,
            h as f64 / 5.0,
            w as f64 / 2.0,
            h as f64 / 3.0,
        ];
        annotations.push(serde_json::json!({"image_id": i, "bbox": bbox, "category_id": i % 3}));
    }
    convert_folder(
        &png_masks,
        &masks,
        Target::L3_DEFAULT,
        &two_threads(),
        &|_, _| {},
    )
    .unwrap();
    let coco = dir.join("boxes.json");
    let doc = serde_json::json!({"images": coco_images, "annotations": annotations});
    std::fs::write(&coco, doc.to_string()).unwrap();
    Targets { masks, coco }
}

/// (ids, labels, sample bytes) of every batch, in order.
pub fn delivered(batches: &[loader::Batch]) -> Vec<(Vec<usize>, Vec<u32>, Vec<u8>)> {
    batches
        .iter()
        .map(|b| {
            let bytes = (0..b.len())
                .flat_map(|i| b.sample_bytes(i).unwrap().to_vec())
                .collect();
            (b.ids.clone(), b.labels.clone(), bytes)
        })
        .collect()
}

/// (ids, masks, boxes, box labels) of every batch, in order.
pub fn targets_of(batches: &[loader::Batch]) -> Vec<TargetsOf> {
    batches
        .iter()
        .map(|b| {
            let m = b.masks.as_ref().expect("masks");
            let masks = (0..b.len()).map(|i| m.mask(i).expect("a mask")).collect();
            (
                b.ids.clone(),
                masks,
                b.boxes.clone().expect("boxes"),
                b.box_labels.clone().expect("box labels"),
            )
        })
        .collect()
}

/// Asserts that `got` delivers the samples, masks and boxes of `want`, and that there are boxes at all.
pub fn assert_same_targets(got: &[loader::Batch], want: &[loader::Batch], tag: &str) {
    assert_eq!(delivered(got), delivered(want), "{tag}: images");
    let want = targets_of(want);
    assert_eq!(targets_of(got), want, "{tag}: masks and boxes");
    assert!(
        want.iter().any(|t| t.2.iter().any(|b| !b.is_empty())),
        "no boxes at all"
    );
}

pub type TargetsOf = (Vec<usize>, Vec<Vec<u16>>, Vec<Vec<[f32; 4]>>, Vec<Vec<i64>>);
