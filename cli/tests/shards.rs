//! `l3 convert --to shards` and `l3 stream` over the shards it wrote, as the real binary.

use std::path::Path;
use std::process::{Command, Output};

fn l3(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("run l3")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "l3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

#[test]
fn convert_to_shards_writes_a_set_that_streams() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..6u32 {
        let class = src.join(if i % 2 == 0 { "even" } else { "odd" });
        std::fs::create_dir_all(&class).unwrap();
        image::RgbImage::from_fn(40 + i, 30, |x, y| {
            image::Rgb([x as u8, y as u8, i as u8 * 40])
        })
        .save(class.join(format!("im{i}.png")))
        .unwrap();
    }
    let out = dir.path().join("shards");
    let text = ok(&l3(&[
        &"convert",
        &"--to",
        &"shards",
        &src,
        &out,
        &"--shard-size",
        &"6K",
        &"--shard-prefix",
        &"train",
    ]));
    let pattern = text
        .trim()
        .rsplit("open them as ")
        .next()
        .unwrap()
        .to_string();
    assert!(text.starts_with("wrote 6 samples in "), "{text}");
    assert!(
        pattern.ends_with(".tar") && pattern.contains("train-{000000.."),
        "{text}"
    );
    assert!(Path::new(&out.join("train-000001.tar.idx")).is_file());
    let streamed = ok(&l3(&[
        &"stream",
        &pattern,
        &"--batch",
        &"2",
        &"--epochs",
        &"1",
        &"--size",
        &"16",
    ]));
    assert!(streamed.contains("6 images"), "{streamed}");
    // Masks and boxes packed as members of each sample, streamed from there with `@shards`.
    let masks = dir.path().join("masks");
    let mut images = Vec::new();
    for i in 0..6u32 {
        let rel = format!("{}/im{i}.png", if i % 2 == 0 { "even" } else { "odd" });
        std::fs::create_dir_all(masks.join(&rel).parent().unwrap()).unwrap();
        image::GrayImage::from_fn(40 + i, 30, |x, _| image::Luma([(x % 3) as u8]))
            .save(masks.join(&rel))
            .unwrap();
        images.push(format!(r#"{{"id": {i}, "file_name": "{rel}"}}"#));
    }
    let coco = dir.path().join("boxes.json");
    let boxes = r#"[{"image_id": 1, "bbox": [0, 0, 41, 30], "category_id": 3}]"#;
    std::fs::write(
        &coco,
        format!(
            r#"{{"images": [{}], "annotations": {boxes}}}"#,
            images.join(", ")
        ),
    )
    .unwrap();
    let with_targets = dir.path().join("with-targets");
    ok(&l3(&[
        &"convert",
        &"--to",
        &"shards",
        &src,
        &with_targets,
        &"--shard-masks",
        &masks,
        &"--boxes",
        &coco,
    ]));
    let streamed = ok(&l3(&[
        &"stream",
        &with_targets,
        &"--batch",
        &"2",
        &"--epochs",
        &"1",
        &"--size",
        &"16",
        &"--masks",
        &"@shards",
        &"--boxes",
        &"@shards",
    ]));
    assert!(
        streamed.contains("targets: 6 masks") && streamed.contains(", 1 boxes"),
        "{streamed}"
    );
    // A size that is not one fails in one line naming the flag.
    let bad = l3(&[
        &"convert",
        &"--to",
        &"shards",
        &src,
        &out,
        &"--shard-size",
        &"lots",
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--shard-size") && err.trim_end().lines().count() == 1,
        "{err}"
    );
}
