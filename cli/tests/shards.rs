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
