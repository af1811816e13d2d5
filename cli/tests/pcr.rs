//! `l3 pcr build|read|info` end to end, through the real binary, on real corpus JPEGs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn l3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .args(args)
        .output()
        .expect("running l3")
}

fn corpus() -> PathBuf {
    std::env::var_os("L3_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn build_info_read_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for name in ["Dune.jpg", "Wood.jpg"] {
        std::fs::copy(corpus().join(name), src.join(name)).unwrap();
    }
    let labels = tmp.path().join("labels.csv");
    std::fs::write(
        &labels,
        "file,label,boxes,photographer\nDune.jpg,desert,10 20 300 400 dune,a\nWood.jpg,wood,,b\n",
    )
    .unwrap();
    let ds = tmp.path().join("ds");
    let out = l3(&[
        "pcr",
        "build",
        s(&ds),
        s(&src),
        "--labels",
        s(&labels),
        "--per-record",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("records: 2\n") && stdout.contains("images: 2\n"),
        "{stdout}"
    );

    let out = l3(&["pcr", "info", s(&ds)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info = text(&out.stdout);
    assert!(
        info.contains("records: 2\n")
            && info.contains("images: 2\n")
            && info.contains("groups: 10\n"),
        "{info}"
    );
    let rows: Vec<Vec<&str>> = info
        .lines()
        .skip_while(|l| !l.starts_with("group\t"))
        .skip(1)
        .map(|l| l.split('\t').collect())
        .collect();
    assert_eq!(rows.len(), 10, "{info}");
    let prefix: Vec<u64> = rows.iter().map(|r| r[2].parse().unwrap()).collect();
    assert!(prefix.windows(2).all(|w| w[0] < w[1]), "{info}");
    let on_disk: u64 = ["record-00000.pcr", "record-00001.pcr"]
        .iter()
        .map(|f| std::fs::metadata(ds.join(f)).unwrap().len())
        .sum();
    assert_eq!(prefix[9], on_disk);
    assert_eq!(rows[9][3], "1.0000");

    // Full fidelity: the PNG holds exactly the pixels libjpeg-turbo decodes from the original file.
    let full = tmp.path().join("full");
    let out = l3(&["pcr", "read", s(&ds), "--group", "10", "--out", s(&full)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in ["Dune", "Wood"] {
        let png = image::open(full.join(format!("{name}.png")))
            .unwrap()
            .to_rgb8();
        let original = std::fs::read(src.join(format!("{name}.jpg"))).unwrap();
        let want = pcr::Decoder::Libjpeg.decode(&original).unwrap();
        assert_eq!((png.width(), png.height()), (want.width, want.height));
        assert!(png.as_raw() == &want.pixels, "{name}: pixels differ");
    }
    // Group 1: same size, different (blurrier) pixels, and no temporary files left.
    let low = tmp.path().join("low");
    let out = l3(&[
        "pcr",
        "read",
        s(&ds),
        "--group",
        "1",
        "--out",
        s(&low),
        "--decoder",
        "zune",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&low)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["Dune.png", "Wood.png"]);
    let a = image::open(low.join("Dune.png")).unwrap().to_rgb8();
    let b = image::open(full.join("Dune.png")).unwrap().to_rgb8();
    assert_eq!(a.dimensions(), b.dimensions());
    assert!(a.as_raw() != b.as_raw());
}

#[test]
fn errors_are_one_line_and_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let png = corpus().join("Altai.png");
    let out = l3(&[
        "pcr",
        "build",
        s(&ds),
        s(&corpus().join("Dune.jpg")),
        s(&png),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("Altai.png") && err.contains("not a JPEG"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!ds.join("index.cbor").exists());

    let labels = tmp.path().join("l.csv");
    std::fs::write(&labels, "file,label\nOther.jpg,x\n").unwrap();
    let out = l3(&[
        "pcr",
        "build",
        s(&ds),
        s(&corpus().join("Dune.jpg")),
        "--labels",
        s(&labels),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no label for"),
        "{}",
        text(&out.stderr)
    );

    let out = l3(&["pcr", "info", s(tmp.path())]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("index.cbor"),
        "{}",
        text(&out.stderr)
    );

    let out = l3(&["pcr", "build", s(&ds), s(&corpus().join("Dune.jpg"))]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for k in ["0", "11"] {
        let out = l3(&[
            "pcr",
            "read",
            s(&ds),
            "--group",
            k,
            "--out",
            s(&tmp.path().join("o")),
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("out of range"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// One bad byte in one image's scan costs that image only: `l3 stream --skip-errors` delivers the
/// record's other images and names the bad one (record file, image, scan); `--pcr-partial` delivers it
/// at the group below the bad scan and says so.
#[test]
fn stream_skips_only_the_image_whose_scan_is_bad() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let inputs: Vec<PathBuf> = ["ColdRipple.jpg", "Wood.jpg", "FallenLeaf.jpg"]
        .iter()
        .map(|n| corpus().join(n))
        .collect();
    let mut args = vec!["pcr", "build", s(&ds)];
    args.extend(inputs.iter().map(|p| s(p)));
    let out = l3(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let index = pcr::Dataset::open(&ds).unwrap();
    let rec = &index.index().records[0];
    let j = rec
        .images
        .iter()
        .position(|i| i.name == "Wood.jpg")
        .unwrap();
    let piece = &rec.images[j].scans[2];
    let record = ds.join(pcr::record_file_name(0));
    let mut bytes = std::fs::read(&record).unwrap();
    bytes[(piece.offset + u64::from(piece.len) / 2) as usize] ^= 0x10;
    std::fs::write(&record, bytes).unwrap();

    let stream = |extra: &[&str]| {
        let mut args = vec!["stream", s(&ds), "--batch-size", "3", "--size", "64"];
        args.extend_from_slice(extra);
        l3(&args)
    };
    let out = stream(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("Wood.jpg") && err.contains("scan 3"), "{err}");

    let out = stream(&["--skip-errors"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(stdout.contains("2 images (1 skipped)"), "{stdout}");
    assert_eq!(stderr.matches("skipped item").count(), 1, "{stderr}");
    assert!(
        stderr.contains("record-00000.pcr")
            && stderr.contains("Wood.jpg")
            && stderr.contains("scan 3"),
        "{stderr}"
    );

    let out = stream(&["--pcr-partial"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("3 images (0 skipped)"), "{stdout}");
    assert!(stdout.contains("partial: 1 images"), "{stdout}");
}
