//! `l3 encode`, `l3 decode`, `l3 info` run as the real binary on real files.

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

/// Fails with exactly one line on stderr that names `file`.
fn fails_naming(out: &Output, file: &Path) -> String {
    assert!(!out.status.success(), "expected failure");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err:?}"
    );
    let name = file.file_name().unwrap().to_string_lossy();
    assert!(err.contains(&*name), "{err:?} does not name {name}");
    err
}

fn field<'a>(info: &'a str, key: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key:?} in {info}"))
        .trim()
}

fn gradient(w: u32, h: u32, c: usize) -> Vec<u8> {
    (0..w * h)
        .flat_map(|i| {
            let (x, y) = (i % w, i / w);
            [(x * 3 + y) as u8, (y * 5) as u8, (x ^ y) as u8, 200u8][..c].to_vec()
        })
        .collect()
}

#[test]
fn rgb_png_round_trip_and_info() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (150u32, 97u32);
    let px = gradient(w, h, 3);
    let input = dir.path().join("in.png");
    image::RgbImage::from_raw(w, h, px.clone())
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("img.l3");
    ok(&l3(&[&"encode", &input, &l3f, &"--patch", &"32"]));

    let info = ok(&l3(&[&"info", &l3f]));
    assert_eq!(field(&info, "dimensions:"), "150x97");
    assert!(field(&info, "channels:").starts_with('3'));
    assert_eq!(field(&info, "patch size:"), "32");
    assert!(field(&info, "patches:").starts_with("5x4 = 20 per channel, 60 in total"));
    let data: usize = field(&info, "patch data bytes:").parse().unwrap();
    let size = std::fs::metadata(&l3f).unwrap().len() as usize;
    assert_eq!(
        data,
        size - 20 - 4 * 60,
        "patch data = file − header − offset table"
    );
    let ratio: f64 = field(&info, "compressed ratio:")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((ratio - size as f64 / (w * h * 3) as f64).abs() < 1e-3);

    let out_png = dir.path().join("out.png");
    ok(&l3(&[&"decode", &l3f, &out_png]));
    assert_eq!(image::open(&out_png).unwrap().to_rgb8().into_raw(), px);

    let out_ppm = dir.path().join("out.ppm");
    ok(&l3(&[&"decode", &l3f, &out_ppm]));
    let ppm = std::fs::read(&out_ppm).unwrap();
    let header = b"P6\n150 97\n255\n";
    assert_eq!(&ppm[..header.len()], header);
    assert_eq!(&ppm[header.len()..], &px[..]);

    // A PPM input encodes to the same L3 bytes as the PNG it came from.
    let again = dir.path().join("again.l3");
    ok(&l3(&[&"encode", &out_ppm, &again, &"--patch", &"32"]));
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&l3f).unwrap());
}

#[test]
fn gray_goes_to_p5_and_default_patch_size_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (64u32, 40u32);
    let px = gradient(w, h, 1);
    let input = dir.path().join("gray.png");
    image::GrayImage::from_raw(w, h, px.clone())
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("gray.l3");
    ok(&l3(&[&"encode", &input, &l3f]));
    let info = ok(&l3(&[&"info", &l3f, &"--verify"]));
    assert!(field(&info, "channels:").starts_with('1'));
    assert_eq!(
        field(&info, "patch size:"),
        l3_format::default_patch_size(w, h).to_string()
    );
    let pgm = dir.path().join("out.pgm");
    ok(&l3(&[&"decode", &l3f, &pgm]));
    let bytes = std::fs::read(&pgm).unwrap();
    assert!(bytes.starts_with(b"P5\n64 40\n255\n"));
    assert!(bytes.ends_with(&px));
}

#[test]
fn rgba_keeps_alpha_refuses_ppm_and_writes_pam() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (33u32, 21u32);
    let px = gradient(w, h, 4);
    let input = dir.path().join("rgba.png");
    image::RgbaImage::from_raw(w, h, px.clone())
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("rgba.l3");
    ok(&l3(&[&"encode", &input, &l3f]));
    let ppm = dir.path().join("rgba.ppm");
    let err = fails_naming(&l3(&[&"decode", &l3f, &ppm]), &ppm);
    assert!(err.contains("RGBA"), "{err}");
    assert!(!ppm.exists());
    let pam = dir.path().join("rgba.pam");
    ok(&l3(&[&"decode", &l3f, &pam]));
    let bytes = std::fs::read(&pam).unwrap();
    assert!(bytes.starts_with(
        b"P7\nWIDTH 33\nHEIGHT 21\nDEPTH 4\nMAXVAL 255\nTUPLTYPE RGB_ALPHA\nENDHDR\n"
    ));
    assert!(bytes.ends_with(&px));
    let png = dir.path().join("rgba.png.out.png");
    ok(&l3(&[&"decode", &l3f, &png]));
    assert_eq!(image::open(&png).unwrap().to_rgba8().into_raw(), px);

    // Gray + alpha becomes RGBA (alpha kept).
    let la: Vec<u8> = px.chunks(4).flat_map(|p| [p[0], p[3]]).collect();
    let input = dir.path().join("la.png");
    image::GrayAlphaImage::from_raw(w, h, la)
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("la.l3");
    ok(&l3(&[&"encode", &input, &l3f]));
    assert!(field(&ok(&l3(&[&"info", &l3f])), "channels:").starts_with("4 (RGBA)"));
}

#[test]
fn sixteen_bit_needs_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("deep.png");
    let px: Vec<u16> = (0..20 * 10 * 3).map(|i| (i * 300) as u16).collect();
    image::ImageBuffer::<image::Rgb<u16>, _>::from_raw(20, 10, px)
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("deep.l3");
    let err = fails_naming(&l3(&[&"encode", &input, &l3f]), &input);
    assert!(err.contains("--to-8bit"), "{err}");
    assert!(!l3f.exists());
    ok(&l3(&[&"encode", &input, &l3f, &"--to-8bit"]));
    assert!(l3f.exists());
}

#[test]
fn bad_inputs_fail_with_one_line_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.png");
    fails_naming(
        &l3(&[&"encode", &missing, &dir.path().join("x.l3")]),
        &missing,
    );

    let (w, h) = (40u32, 40u32);
    let input = dir.path().join("in.png");
    image::RgbImage::from_raw(w, h, gradient(w, h, 3))
        .unwrap()
        .save(&input)
        .unwrap();
    let l3f = dir.path().join("good.l3");
    ok(&l3(&[&"encode", &input, &l3f]));
    let mut bytes = std::fs::read(&l3f).unwrap();

    let not_l3 = dir.path().join("notl3.l3");
    std::fs::write(&not_l3, b"hello").unwrap();
    fails_naming(&l3(&[&"info", &not_l3]), &not_l3);

    // Corrupt the first row header of the first patch: nbit 9. Parse passes, decode fails.
    let start = 20 + 4 * 3 * 4; // 40×40 at N=32: 4 patches × 3 channels
    bytes[start] = (bytes[start] & 0xf0) | 9;
    let bad = dir.path().join("bad.l3");
    std::fs::write(&bad, &bytes).unwrap();
    let out = dir.path().join("bad.png");
    fails_naming(&l3(&[&"decode", &bad, &out]), &bad);
    assert!(!out.exists());
    fails_naming(&l3(&[&"info", &bad, &"--verify"]), &bad);

    let bad_ext = dir.path().join("out.xyz");
    fails_naming(&l3(&[&"decode", &l3f, &bad_ext]), &bad_ext);
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}
