//! `l3 stylize` end to end: real model, real PNG/JPEG files, the binary as users run it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared")
}

fn model() -> PathBuf {
    shared().join("models/candy_nc8.safetensors")
}

/// A `w×h` downscaled crop of a corpus photo, saved as `name` (format by extension).
fn small_image(dir: &Path, name: &str, w: u32, h: u32) -> PathBuf {
    let img = image::open(shared().join("corpus/Dune.jpg"))
        .unwrap()
        .to_rgb8();
    let small = image::imageops::resize(&img, w * 4, h * 4, image::imageops::FilterType::Triangle);
    let crop = image::imageops::crop_imm(&small, w, h, w, h).to_image();
    let p = dir.join(name);
    crop.save(&p).unwrap();
    p
}

fn l3(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .arg("stylize")
        .args(args)
        .output()
        .unwrap()
}

fn stylize(input: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let m = model();
    let mut a: Vec<&std::ffi::OsStr> = vec![std::ffi::OsStr::new("--model"), m.as_os_str()];
    a.extend(extra.iter().map(std::ffi::OsStr::new));
    a.push(input.as_os_str());
    a.push(out.as_os_str());
    l3(&a)
}

#[test]
fn exact_equals_whole_and_keeps_the_size() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_image(dir.path(), "in.png", 70, 45);
    let mut outs = vec![];
    for mode in ["whole", "exact", "sampled", "naive", "recompute"] {
        let out = dir.path().join(format!("{mode}.png"));
        let o = stylize(
            &input,
            &out,
            &["--mode", mode, "--tile", "16", "--threads", "2"],
        );
        assert!(
            o.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let img = image::open(&out).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (70, 45), "{mode}");
        outs.push(img.into_raw());
    }
    assert_eq!(outs[0], outs[1], "exact differs from whole");
    assert_eq!(outs[0], outs[4], "recompute differs from whole");
    assert_ne!(outs[0], outs[2], "sampled statistics should differ");
    assert_ne!(outs[0], outs[3], "naive tiles should differ");
    // --full keeps PyTorch's size: each side rounded up to a multiple of 4.
    let out = dir.path().join("full.png");
    let o = stylize(&input, &out, &["--mode", "exact", "--tile", "32", "--full"]);
    assert!(o.status.success());
    assert_eq!(image::image_dimensions(&out).unwrap(), (72, 48));
}

#[test]
fn jpeg_in_png_out_with_circular_padding_and_spilling() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_image(dir.path(), "in.jpg", 64, 40);
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let a = dir.path().join("a.png");
    let b = dir.path().join("b.png");
    let args = ["--padding", "circular", "--tile", "16"];
    let o = stylize(&input, &a, &[&args[..], &["--mode", "whole"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let spill_s = spill.to_str().unwrap();
    let o = stylize(
        &input,
        &b,
        &[
            &args[..],
            &["--ram-budget-mib", "0", "--spill-dir", spill_s],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("spilled layers"));
    assert_eq!(
        image::open(&a).unwrap().to_rgb8(),
        image::open(&b).unwrap().to_rgb8()
    );
    // spill files are unlinked at creation: nothing is left behind
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0);
}

#[test]
fn errors_are_one_line_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_image(dir.path(), "in.png", 40, 32);
    let out = dir.path().join("out.png");
    let check = |o: std::process::Output, needle: &str| {
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{needle:?} not in {err}");
        assert!(!out.exists());
    };
    check(stylize(&input, &out, &["--tile", "2"]), "halo");
    check(stylize(&input, &out, &["--tile", "10"]), "multiple of");
    check(stylize(&input, &out, &["--mode", "fast"]), "--mode");
    check(
        stylize(&dir.path().join("missing.png"), &out, &[]),
        "missing.png",
    );
    let bad_model = dir.path().join("bad.safetensors");
    std::fs::write(&bad_model, b"not a model").unwrap();
    let o = l3(&[
        "--model".as_ref(),
        bad_model.as_os_str(),
        input.as_os_str(),
        out.as_os_str(),
    ]);
    check(o, "bad.safetensors");
    let tiny = small_image(dir.path(), "tiny.png", 3, 3);
    check(stylize(&tiny, &out, &[]), "too small");
}
