//! Tar shards (WebDataset layout, an index beside each) against the folder they were written from: the
//! same items in the same order, the same samples, resume and elastic resume, shards other tools wrote
//! (index built on first open, then kept), and damaged shards and indexes failing by shard and member.

mod common;

use common::{copy_tree, delivered, fixture, touch_later};
use loader::convert::{ShardBuild, to_shards};
use loader::{
    Batch, Dataset, Error, ImageFolder, Loader, LoaderOptions, OpenOptions, SampleSpec, ShardSet,
    StorageOptions, open_dataset,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opts(batch: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: batch,
        decode_threads: 2,
        io_threads: 2,
        epochs: Some(1),
        seed: 11,
        sample: SampleSpec {
            height: 48,
            width: 40,
            hflip: true,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

fn open(location: &str) -> loader::Result<Arc<dyn Dataset>> {
    open_dataset(Path::new(location), &OpenOptions::default())
}

fn run(ds: &Arc<dyn Dataset>, o: LoaderOptions) -> Vec<Batch> {
    Loader::new(ds.clone(), o)
        .unwrap()
        .map(|b| b.expect("batch"))
        .collect()
}

/// Shards of `folder` in `out`, about `per_shard` images each (sized from the folder's mean image: the
/// corpus's images differ in size by more than the shard count the tests need).
fn write_shards(folder: &Path, out: &Path, per_shard: u64) -> loader::convert::ShardSummary {
    let sizes: Vec<u64> = loader::image_files(folder)
        .unwrap()
        .files
        .iter()
        .map(|(rel, _)| std::fs::metadata(folder.join(rel)).unwrap().len())
        .collect();
    let mean = sizes.iter().sum::<u64>() / sizes.len() as u64;
    let build = ShardBuild {
        shard_size: per_shard * (mean + 2048),
        prefix: "train".into(),
        ..ShardBuild::default()
    };
    to_shards(folder, out, &build).unwrap()
}

fn pattern(out: &Path, shards: usize) -> String {
    format!("{}/train-{{000000..{:06}}}.tar", out.display(), shards - 1)
}

#[test]
fn shards_deliver_the_folder_in_its_order_and_resume_across_the_two() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    for (folder, sub) in [(&f.l3, "l3"), (&f.mixed, "mixed")] {
        let out = tmp.path().join(sub);
        let s = write_shards(folder, &out, 4);
        let folder_ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(folder).unwrap());
        assert_eq!(s.samples, folder_ds.len());
        assert!(s.shards >= 3, "{sub}: {} shards", s.shards);
        let by_pattern = open(&pattern(&out, s.shards)).unwrap();
        assert_eq!(
            by_pattern.describe().split(" (").nth(1).unwrap(),
            format!("{} images in {} shards)", s.samples, s.shards)
        );
        // The same items: names, sizes and labels, in the folder's order.
        for i in 0..folder_ds.len() {
            assert_eq!(by_pattern.name(i), folder_ds.name(i), "{sub} item {i}");
            assert_eq!(
                by_pattern.stored_len(i),
                folder_ds.stored_len(i),
                "{sub} item {i}"
            );
            assert_eq!(by_pattern.label(i), folder_ds.label(i), "{sub} item {i}");
        }
        // The same samples in the same batches for the same seed (L3 by region inside the members).
        let want = delivered(&run(&folder_ds, opts(3)));
        assert_eq!(
            delivered(&run(&by_pattern, opts(3))),
            want,
            "{sub}: pattern"
        );
        // The folder of shards opens as the same set.
        let by_folder = open(out.to_str().unwrap()).unwrap();
        assert_eq!(
            delivered(&run(&by_folder, opts(3))),
            want,
            "{sub}: folder of shards"
        );
    }
    let out = tmp.path().join("l3");
    let shards = open(out.to_str().unwrap()).unwrap();
    let folder_ds: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&f.l3).unwrap());
    // Region reads inside members move less than the members hold.
    let mut l = Loader::new(shards.clone(), opts(3)).unwrap();
    l.by_ref().for_each(|b| drop(b.unwrap()));
    assert!(
        l.stats().bytes_read * 2 < shards.stored_bytes(),
        "{} bytes read of {}",
        l.stats().bytes_read,
        shards.stored_bytes()
    );
    // A state saved on the folder resumes on its shards (the same fingerprint) and the other way round;
    // the two runs deliver the epoch exactly once.
    let o = LoaderOptions {
        epochs: None,
        ..opts(2)
    };
    for (from, to) in [(&folder_ds, &shards), (&shards, &folder_ds)] {
        let mut first = Loader::new(from.clone(), o.clone()).unwrap();
        let mut got: Vec<usize> = Vec::new();
        for _ in 0..2 {
            got.extend(first.next().unwrap().unwrap().ids);
        }
        let state = first.state().to_string().parse().unwrap();
        let mut rest = Loader::resume(to.clone(), o.clone(), state).unwrap();
        got.extend(rest.rest_of_epoch().flat_map(|b| b.unwrap().ids));
        got.sort();
        assert_eq!(got, (0..shards.len()).collect::<Vec<_>>());
    }
    // Elastic: saved at world size 2, resumed at 3: the ranks together finish the epoch once (the
    // tail dropped rather than padded with repeats, so that a repeat is an error here).
    let shaped = |rank, world_size| LoaderOptions {
        rank,
        world_size,
        shard_tail: loader::ShardPolicy::DropTail,
        ..o.clone()
    };
    let mut got: Vec<usize> = Vec::new();
    let mut states = Vec::new();
    for rank in 0..2 {
        let mut l = Loader::new(shards.clone(), shaped(rank, 2)).unwrap();
        got.extend(l.next().unwrap().unwrap().ids);
        states.push(l.state());
    }
    for rank in 0..3 {
        let mut l = Loader::resume(shards.clone(), shaped(rank, 3), states[0].clone()).unwrap();
        got.extend(l.rest_of_epoch().flat_map(|b| b.unwrap().ids));
    }
    got.sort();
    let delivered_n = got.len();
    got.dedup();
    assert_eq!(got.len(), delivered_n, "an item twice");
    assert!(
        shards.len() - delivered_n < 3 * 2,
        "{delivered_n} of {}",
        shards.len()
    );
    // `tar` itself reads the shards: every member of the index is there, in order.
    let listed = std::process::Command::new("tar")
        .arg("-tf")
        .arg(out.join("train-000000.tar"))
        .output();
    match listed {
        Ok(o) if o.status.success() => {
            let names = String::from_utf8(o.stdout).unwrap();
            let first = folder_ds.name(0).unwrap();
            let key = first.rsplit_once('.').unwrap().0;
            assert!(names.lines().any(|n| n == first), "{names}");
            assert!(names.lines().any(|n| n == format!("{key}.cls")), "{names}");
        }
        other => stdx::testing::skip(format!("no usable tar command: {other:?}")),
    }
}

#[test]
fn shards_without_an_index_get_one_on_first_open_and_keep_it() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("png");
    let s = write_shards(&f.mixed, &out, 3);
    let idx = |k: usize| out.join(format!("train-{k:06}.tar.idx"));
    let written: Vec<Vec<u8>> = (0..s.shards)
        .map(|k| std::fs::read(idx(k)).unwrap())
        .collect();
    for k in 0..s.shards {
        std::fs::remove_file(idx(k)).unwrap();
    }
    let location = pattern(&out, s.shards);
    let first = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!(first.indexes_built(), s.shards);
    // The index built from the tar's headers lists what the writer's did (less what only the writer
    // knows: nothing, for names without inner dots).
    // The built index records the shard's modification time, where the writer's has its MD5 too.
    for (k, w) in written.iter().enumerate() {
        let mut built = json(&std::fs::read(idx(k)).expect("kept beside the shard"));
        let mut w = json(w);
        let (b, w_version) = (built["shard_version"].take(), w["shard_version"].take());
        assert_eq!(b["modified_ns"], w_version["modified_ns"], "shard {k}");
        assert!(w_version["md5"].is_string());
        assert_eq!(built, w, "shard {k}");
    }
    let again = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!(again.indexes_built(), 0);
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&f.mixed).unwrap());
    let shards: Arc<dyn Dataset> = Arc::new(again);
    assert_eq!(
        delivered(&run(&shards, opts(4))),
        delivered(&run(&folder, opts(4)))
    );

    // A shard GNU tar wrote (long names as `L` members, PNG and JPEG members, labels as `.cls`).
    let gnu = tmp.path().join("gnu");
    let src = tmp.path().join("gnu-src");
    let deep = "a-folder-name-long-enough/".repeat(5);
    let files = loader::image_files(&f.mixed).unwrap().files;
    let mut names = Vec::new();
    for (i, (rel, _)) in files.iter().take(4).enumerate() {
        let ext = rel.extension().unwrap().to_str().unwrap();
        let key = format!("{deep}img{i:03}");
        std::fs::create_dir_all(src.join(&deep)).unwrap();
        std::fs::copy(f.mixed.join(rel), src.join(format!("{key}.{ext}"))).unwrap();
        std::fs::write(src.join(format!("{key}.cls")), format!("{}\n", i % 2)).unwrap();
        names.push(format!("{key}.{ext}"));
        names.push(format!("{key}.cls"));
    }
    std::fs::create_dir_all(&gnu).unwrap();
    let made = std::process::Command::new("tar")
        .args(["--format=gnu", "-cf"])
        .arg(gnu.join("gnu.tar"))
        .arg("-C")
        .arg(&src)
        .args(&names)
        .status();
    if !made.is_ok_and(|s| s.success()) {
        stdx::testing::skip("no usable tar command to write a GNU tar");
        return;
    }
    let ds = open(gnu.join("gnu.tar").to_str().unwrap()).unwrap();
    assert_eq!(ds.len(), 4);
    for i in 0..4 {
        assert_eq!(ds.label(i), (i % 2) as u32);
        assert_eq!(ds.name(i).unwrap(), names[2 * i]);
        let direct = std::fs::read(src.join(&names[2 * i])).unwrap();
        assert_eq!(ds.stored_len(i), Some(direct.len() as u64));
    }
    assert_eq!(run(&ds, opts(2)).iter().map(Batch::len).sum::<usize>(), 4);
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

fn region(batch: usize) -> LoaderOptions {
    LoaderOptions {
        decode: loader::DecodeScope::Region,
        ..opts(batch)
    }
}

/// The heads of the L3 members an index holds, by member name (base64, as in the file).
fn heads(index: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sample in index["samples"].as_array().unwrap() {
        for m in sample["members"].as_array().unwrap() {
            if let Some(h) = m["head"].as_str() {
                out.push((m["name"].as_str().unwrap().to_string(), h.to_string()));
            }
        }
    }
    out
}

/// An index of version 2 carries each L3 member's head and its shard's version; a set opened with them
/// reads what the folder gives, and so does one whose shard changed since (the heads then read from the
/// shard, the change counted), one with a version-1 index, and one whose index was built by scanning.
#[test]
fn l3_heads_in_the_index_are_used_only_for_the_shard_they_were_written_with() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l3");
    let s = write_shards(&f.l3, &out, 4);
    let idx = |k: usize| out.join(format!("train-{k:06}.tar.idx"));
    let location = pattern(&out, s.shards);
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&f.l3).unwrap());
    let want = delivered(&run(&folder, region(3)));
    let written: Vec<serde_json::Value> = (0..s.shards)
        .map(|k| json(&std::fs::read(idx(k)).unwrap()))
        .collect();
    for (k, index) in written.iter().enumerate() {
        assert_eq!(index["version"], 2);
        let v = &index["shard_version"];
        assert!(v["modified_ns"].is_u64() && v["md5"].as_str().unwrap().len() == 32);
        let members = index["samples"].as_array().unwrap().len();
        assert_eq!(
            heads(index).len(),
            members,
            "shard {k}: a head per L3 member"
        );
    }
    let set = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!(set.stale_indexes(), 0);
    let set: Arc<dyn Dataset> = Arc::new(set);
    assert_eq!(delivered(&run(&set, region(3))), want);

    // A shard touched since its index was written: its heads are read from it, and the change counted.
    touch_later(&out.join("train-000001.tar"));
    let set = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!(set.stale_indexes(), 1);
    let set: Arc<dyn Dataset> = Arc::new(set);
    assert_eq!(delivered(&run(&set, region(3))), want);

    // Version-1 indexes (no shard version, no heads) open and read as before.
    for (k, index) in written.iter().enumerate() {
        let mut v1 = index.clone();
        v1["version"] = 1.into();
        v1.as_object_mut().unwrap().remove("shard_version");
        for sample in v1["samples"].as_array_mut().unwrap() {
            for m in sample["members"].as_array_mut().unwrap() {
                m.as_object_mut().unwrap().remove("head");
            }
        }
        std::fs::write(idx(k), serde_json::to_vec(&v1).unwrap()).unwrap();
    }
    let set = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!((set.stale_indexes(), set.indexes_built()), (0, 0));
    let set: Arc<dyn Dataset> = Arc::new(set);
    assert_eq!(delivered(&run(&set, region(3))), want);

    // Indexes built by scanning the tars record the heads the writer did (those in the chunks read).
    for k in 0..s.shards {
        std::fs::remove_file(idx(k)).unwrap();
    }
    let set = ShardSet::open(&location, &StorageOptions::default()).unwrap();
    assert_eq!((set.stale_indexes(), set.indexes_built()), (0, s.shards));
    let mut scanned = 0;
    for (k, index) in written.iter().enumerate() {
        let built = heads(&json(&std::fs::read(idx(k)).unwrap()));
        let all = heads(index);
        assert!(built.iter().all(|h| all.contains(h)), "shard {k}");
        scanned += built.len();
    }
    assert!(scanned > 0, "no head recorded by the scans");
    let set: Arc<dyn Dataset> = Arc::new(set);
    assert_eq!(delivered(&run(&set, region(3))), want);
}

/// A head in the index that is not the member's (damaged in the index, the index's version still the
/// shard's) is an error naming the shard and the member — l3-format's prefix CRC — never another image.
#[test]
fn a_damaged_head_in_the_index_fails_naming_shard_and_member() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l3");
    let s = write_shards(&f.l3, &out, 4);
    let idx = out.join("train-000000.tar.idx");
    let mut index = json(&std::fs::read(&idx).unwrap());
    let member = &mut index["samples"][0]["members"][0];
    let name = member["name"].as_str().unwrap().to_string();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut head = b64.decode(member["head"].as_str().unwrap()).unwrap();
    let at = head.len() - 6;
    head[at] ^= 0x10;
    member["head"] = b64.encode(&head).into();
    std::fs::write(&idx, serde_json::to_vec(&index).unwrap()).unwrap();
    let set = ShardSet::open(&pattern(&out, s.shards), &StorageOptions::default()).unwrap();
    assert_eq!(set.stale_indexes(), 0);
    let e = Loader::new(Arc::new(set), region(2))
        .unwrap()
        .find_map(|b| b.err())
        .expect("an error")
        .to_string();
    assert!(
        e.contains(&format!("train-000000.tar: member {name}")) && e.contains("CRC"),
        "{e}"
    );
}

fn error_of(result: loader::Result<Arc<dyn Dataset>>) -> Error {
    match result {
        Err(e) => e,
        Ok(ds) => Loader::new(ds, opts(2))
            .unwrap()
            .find_map(|b| b.err())
            .expect("an error"),
    }
}

#[test]
fn damaged_shards_and_indexes_fail_naming_shard_and_member() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    let s = write_shards(&f.l3, &good, 4);
    let fresh = |name: &str| -> PathBuf {
        let d = tmp.path().join(name);
        copy_tree(&good, &d);
        d
    };
    let shard0 = |d: &Path| d.join("train-000000.tar");
    let index0 = |d: &Path| d.join("train-000000.tar.idx");
    let first_member = loader::image_files(&f.l3).unwrap().files[0].0.clone();
    let member = first_member.to_str().unwrap().to_string();

    // A truncated shard: its index says another size.
    let d = fresh("truncated");
    let bytes = std::fs::read(shard0(&d)).unwrap();
    std::fs::write(shard0(&d), &bytes[..bytes.len() / 2]).unwrap();
    let e = error_of(open(&pattern(&d, s.shards))).to_string();
    assert!(
        e.contains("train-000000.tar") && e.contains("another version"),
        "{e}"
    );
    // ... and without its index: the scan says where it ends.
    std::fs::remove_file(index0(&d)).unwrap();
    let e = error_of(open(&pattern(&d, s.shards))).to_string();
    assert!(
        e.contains("train-000000.tar") && e.contains("truncated"),
        "{e}"
    );

    // An index whose offset is off by a block (the sample's `.cls` member left out, so that the index is
    // in order): the header check at read names shard and member.
    let d = fresh("shifted");
    let text = std::fs::read_to_string(index0(&d)).unwrap();
    let mut index: serde_json::Value = serde_json::from_str(&text).unwrap();
    let members = index["samples"][0]["members"].as_array_mut().unwrap();
    assert!(members[1]["name"].as_str().unwrap().ends_with(".cls"));
    members.remove(1);
    let m = &mut index["samples"][0]["members"][0];
    m["offset"] = (m["offset"].as_u64().unwrap() + 512).into();
    std::fs::write(index0(&d), index.to_string()).unwrap();
    for scope in [loader::DecodeScope::Region, loader::DecodeScope::Whole] {
        let ds = open(&pattern(&d, s.shards)).unwrap();
        let o = LoaderOptions {
            decode: scope,
            ..opts(2)
        };
        let e = Loader::new(ds, o)
            .unwrap()
            .find_map(|b| b.err())
            .expect("an error")
            .to_string();
        assert!(
            e.contains("train-000000.tar: member ") && e.contains("disagrees"),
            "{scope:?}: {e}"
        );
    }
    // A member renamed in the tar (its header checksum fixed): not the member the index names.
    let d = fresh("renamed");
    let mut bytes = std::fs::read(shard0(&d)).unwrap();
    bytes[0] ^= 0x20;
    let sum: u64 = bytes[..512]
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(c)
            }
        })
        .sum();
    bytes[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    std::fs::write(shard0(&d), &bytes).unwrap();
    let e = error_of(open(&pattern(&d, s.shards))).to_string();
    assert!(
        e.contains(&format!("member {member}")) && e.contains("names"),
        "{e}"
    );
    // A shard of the pattern missing.
    let d = fresh("missing");
    std::fs::remove_file(shard0(&d)).unwrap();
    let e = error_of(open(&pattern(&d, s.shards))).to_string();
    assert!(
        e.contains("train-000000.tar") && e.contains("no such shard"),
        "{e}"
    );
    // The same key in two shards.
    let d = fresh("duplicate");
    let extra = format!("train-{:06}.tar", s.shards);
    std::fs::copy(shard0(&d), d.join(&extra)).unwrap();
    let mut idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(index0(&d)).unwrap()).unwrap();
    idx["shard"] = extra.clone().into();
    std::fs::write(d.join(format!("{extra}.idx")), idx.to_string()).unwrap();
    let e = error_of(open(d.to_str().unwrap())).to_string();
    assert!(
        e.contains(&extra) && e.contains("train-000000.tar") && e.contains("is in"),
        "{e}"
    );
    // A damaged index file.
    let d = fresh("garbled");
    std::fs::write(
        index0(&d),
        b"{\"format\": \"l3-shard-index\", \"version\": 1",
    )
    .unwrap();
    let e = error_of(open(&pattern(&d, s.shards))).to_string();
    assert!(
        e.contains("train-000000.tar.idx") && e.contains("not a shard index"),
        "{e}"
    );
}

#[test]
fn masks_and_boxes_travel_as_members_of_their_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let (images, masks) = (tmp.path().join("images"), tmp.path().join("masks"));
    let mut images_json = Vec::new();
    for i in 0..5u8 {
        for (root, img) in [
            (
                &images,
                image::DynamicImage::new_rgb8(10 + u32::from(i), 12),
            ),
            (
                &masks,
                image::DynamicImage::new_luma8(10 + u32::from(i), 12),
            ),
        ] {
            std::fs::create_dir_all(root.join("c")).unwrap();
            img.save(root.join(format!("c/img.{i}.png"))).unwrap();
        }
        images_json.push(serde_json::json!({"id": i, "file_name": format!("c/img.{i}.png")}));
    }
    let coco = tmp.path().join("boxes.json");
    let annotations =
        serde_json::json!([{"image_id": 2, "bbox": [1.0, 2.0, 3.0, 4.0], "category_id": 7}]);
    std::fs::write(
        &coco,
        serde_json::json!({"images": images_json, "annotations": annotations}).to_string(),
    )
    .unwrap();
    let out = tmp.path().join("shards");
    let build = ShardBuild {
        shard_size: 6000,
        masks: Some(masks),
        boxes: Some(coco),
        ..ShardBuild::default()
    };
    let s = to_shards(&images, &out, &build).unwrap();
    assert!(s.shards >= 2);
    let ds = open(out.to_str().unwrap()).unwrap();
    // Names with inner dots keep their names; their keys lose the dots.
    assert_eq!(ds.name(2).unwrap(), "c/img.2.png");
    let text = std::fs::read_to_string(out.join("shard-000000.tar.idx")).unwrap();
    for member in [
        "c/img_0.png",
        "c/img_0.cls",
        "c/img_0.seg.png",
        "c/img_0.json",
    ] {
        assert!(text.contains(&format!("\"{member}\"")), "{member}: {text}");
    }
    // Re-running with a larger shard size writes fewer shards and removes the rest.
    let fewer = to_shards(
        &images,
        &out,
        &ShardBuild {
            shard_size: 1 << 20,
            ..build
        },
    )
    .unwrap();
    assert_eq!(fewer.shards, 1);
    assert_eq!(fewer.removed, 2 * (s.shards - 1));
    let ds = open(out.to_str().unwrap()).unwrap();
    assert_eq!(ds.len(), 5);
}

#[test]
fn a_loader_over_shards_takes_masks_and_boxes_from_their_members_as_from_the_folder() {
    use loader::targets::{IN_SHARDS, TargetOptions};
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("shards");
    let (common::Targets { masks, coco }, _) = common::targets_in_shards(f, tmp.path(), &out);
    let with = |m: &Path, b: &Path, scope| LoaderOptions {
        decode: scope,
        targets: TargetOptions {
            masks: Some(m.to_path_buf()),
            boxes: Some(b.to_path_buf()),
            ..TargetOptions::default()
        },
        ..opts(3)
    };
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&f.l3).unwrap());
    let shards = open(out.to_str().unwrap()).unwrap();
    let carried = Path::new(IN_SHARDS);
    for scope in [loader::DecodeScope::Region, loader::DecodeScope::Whole] {
        let want = run(&folder, with(&masks, &coco, scope));
        let got = run(&shards, with(carried, carried, scope));
        common::assert_same_targets(&got, &want, &format!("{scope:?}"));
    }
    // Over a folder, @shards names nothing: an error saying so.
    let e = Loader::new(
        folder.clone(),
        with(carried, &coco, loader::DecodeScope::Region),
    )
    .err()
    .expect("an error")
    .to_string();
    assert!(e.contains("@shards") && e.contains("no shard set"), "{e}");
    // A mask member whose tar header the index misplaces: the error names shard and member.
    let index0 = out.join("shard-000000.tar.idx");
    let pristine = std::fs::read(&index0).unwrap();
    let mut index: serde_json::Value = serde_json::from_slice(&pristine).unwrap();
    let members = index["samples"][0]["members"].as_array_mut().unwrap();
    let seg = members
        .iter_mut()
        .find(|m| m["name"].as_str().unwrap().contains(".seg."))
        .unwrap();
    let seg_name = seg["name"].as_str().unwrap().to_string();
    seg["size"] = (seg["size"].as_u64().unwrap() - 1).into();
    std::fs::write(&index0, index.to_string()).unwrap();
    let shards = open(out.to_str().unwrap()).unwrap();
    for scope in [loader::DecodeScope::Region, loader::DecodeScope::Whole] {
        // (The first mask is read when the loader starts, to learn the masks' depth.)
        let e = match Loader::new(shards.clone(), with(carried, carried, scope)) {
            Err(e) => e,
            Ok(mut l) => l.find_map(|b| b.err()).expect("an error"),
        }
        .to_string();
        assert!(
            e.contains("shard-000000.tar") && e.contains(&seg_name) && e.contains("disagrees"),
            "{scope:?}: {e}"
        );
    }
    // A boxes member that is no JSON: its item fails when it is read (not the loader when it opens),
    // naming shard and member; with skip_errors the others are delivered.
    std::fs::write(&index0, &pristine).unwrap();
    let index: serde_json::Value = serde_json::from_slice(&pristine).unwrap();
    let json = index["samples"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str().unwrap().ends_with(".json"))
        .unwrap();
    let (json_name, at) = (
        json["name"].as_str().unwrap().to_string(),
        json["offset"].as_u64().unwrap(),
    );
    let tar = out.join("shard-000000.tar");
    let mut bytes = std::fs::read(&tar).unwrap();
    bytes[at as usize] = b'#';
    std::fs::write(&tar, bytes).unwrap();
    let shards = open(out.to_str().unwrap()).unwrap();
    let first = shards.source(0).display().to_string();
    let mut l = Loader::new(
        shards.clone(),
        with(carried, carried, loader::DecodeScope::Region),
    )
    .expect("opening reads no boxes member");
    let e = l.find_map(|b| b.err()).expect("an error").to_string();
    assert!(
        e.contains("shard-000000.tar") && e.contains(&json_name),
        "{e}"
    );
    let skipping = LoaderOptions {
        skip_errors: true,
        ..with(carried, carried, loader::DecodeScope::Region)
    };
    let got = run(&shards, skipping);
    let ids: Vec<usize> = got.iter().flat_map(|b| b.ids.clone()).collect();
    assert_eq!(ids.len(), shards.len() - 1, "all but {first}");
    assert!(!ids.contains(&0));
}
