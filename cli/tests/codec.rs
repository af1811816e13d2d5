//! `l3 encode`, `l3 decode`, `l3 info` (and `l3 convert --to l3`'s format options) run as the real binary on
//! real files, for version 1 and both version-2 profiles.

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
    ok(&l3(&[
        &"encode",
        &input,
        &l3f,
        &"--patch",
        &"32",
        &"--format",
        &"v1",
    ]));

    let info = ok(&l3(&[&"info", &l3f]));
    assert_eq!(field(&info, "format version:"), "1");
    assert!(field(&info, "profile:").starts_with("none"));
    assert!(field(&info, "crc32c:").starts_with("none"));
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
    ok(&l3(&[
        &"encode",
        &out_ppm,
        &again,
        &"--patch",
        &"32",
        &"--format",
        &"v1",
    ]));
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
        l3_format::DEFAULT_FORMAT
            .default_patch_size(w, h)
            .to_string()
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
    ok(&l3(&[&"encode", &input, &l3f, &"--format", &"v1"]));
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

/// `patch data bytes` of a file, from its layout in SPEC.md: v1 and v2-BP have a fixed-size offset table
/// (C·P entries); v2-ANS has P entries after its frequency tables, whose length the test does not
/// recompute (it bounds it instead).
fn expected_patch_data(
    size: usize,
    version: u16,
    profile: &str,
    c: usize,
    p: usize,
) -> Option<usize> {
    match (version, profile) {
        (1, _) => Some(size - 20 - 4 * c * p),
        // Offsets, then (entry CRCs, the encoder's default) a CRC per entry and the prefix CRC.
        (2, "BP") => Some(size - 20 - 4 * c * p - 4 * c * p - 4 - 4),
        _ => None,
    }
}

#[test]
fn every_format_round_trips_and_info_names_it() {
    let dir = tempfile::tempdir().unwrap();
    // Two patch columns at N = 128 (v2's default), partial edge patches, and RGBA and gray too.
    for (c, kind) in [(3usize, "RGB"), (4, "RGBA"), (1, "gray")] {
        let (w, h) = (200u32, 131u32);
        let px = gradient(w, h, c);
        let input = dir.path().join(format!("in{c}.png"));
        match c {
            1 => image::GrayImage::from_raw(w, h, px.clone())
                .unwrap()
                .save(&input),
            3 => image::RgbImage::from_raw(w, h, px.clone())
                .unwrap()
                .save(&input),
            _ => image::RgbaImage::from_raw(w, h, px.clone())
                .unwrap()
                .save(&input),
        }
        .unwrap();
        let default_profile = match l3_format::DEFAULT_FORMAT.profile() {
            Some(l3_format::Profile::Ans) => "ANS",
            Some(l3_format::Profile::Bp) => "BP",
            None => "none",
        };
        let cases: [(&[&str], u16, &str); 5] = [
            (&[], l3_format::DEFAULT_FORMAT.version(), default_profile),
            (&["--format", "v2"], 2, "ANS"),
            (&["--profile", "bp"], 2, "BP"),
            (
                &["--format", "v2", "--profile", "ans", "--patch", "64"],
                2,
                "ANS",
            ),
            (&["--format", "v1"], 1, "none"),
        ];
        for (k, (args, version, profile)) in cases.iter().enumerate() {
            let l3f = dir.path().join(format!("f{c}-{k}.l3"));
            let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"encode", &input, &l3f];
            for x in args.iter() {
                a.push(x);
            }
            ok(&l3(&a));
            let bytes = std::fs::read(&l3f).unwrap();
            assert_eq!(
                u16::from_le_bytes([bytes[4], bytes[5]]),
                *version,
                "{args:?}"
            );
            let info = ok(&l3(&[&"info", &l3f, &"--verify"]));
            assert_eq!(field(&info, "format version:"), version.to_string());
            assert!(
                field(&info, "profile:").starts_with(profile),
                "{args:?}: {info}"
            );
            assert!(field(&info, "channels:").contains(kind));
            let crc = field(&info, "crc32c:");
            let n: usize = field(&info, "patch size:").parse().unwrap();
            let p = (w as usize).div_ceil(n) * (h as usize).div_ceil(n);
            if *version == 2 {
                // The last four bytes, as the line prints them.
                let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
                assert_eq!(crc, format!("{stored:08x} (verified)"));
                let entries = if *profile == "ANS" { p } else { c * p };
                assert_eq!(
                    field(&info, "entry crc32c:"),
                    format!("{entries} entries and the prefix (verified)")
                );
            } else {
                assert!(crc.starts_with("none"));
            }
            let data: usize = field(&info, "patch data bytes:").parse().unwrap();
            match expected_patch_data(bytes.len(), *version, profile, c, p) {
                Some(want) => assert_eq!(data, want, "{args:?}"),
                // ANS: header, tables (at least one bit per context), P offsets, P entry CRCs, the prefix
                // CRC and the CRC come off.
                None => assert!(data < bytes.len() - 20 - 8 * p - 8 - 12, "{args:?}"),
            }
            let out = dir.path().join(format!("out{c}-{k}.png"));
            ok(&l3(&[&"decode", &l3f, &out]));
            let back = image::open(&out).unwrap();
            let back = match c {
                1 => back.to_luma8().into_raw(),
                3 => back.to_rgb8().into_raw(),
                _ => back.to_rgba8().into_raw(),
            };
            assert!(back == px, "{args:?} {kind}: decoded pixels differ");
        }
    }
    // What nothing asked for is the library's default format.
    let def = std::fs::read(dir.path().join("f3-0.l3")).unwrap();
    let f = l3_format::L3File::parse(&def).unwrap();
    assert_eq!(f.format(), l3_format::DEFAULT_FORMAT);
}

#[test]
fn format_options_that_cannot_be_honoured_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    image::RgbImage::from_raw(40, 30, gradient(40, 30, 3))
        .unwrap()
        .save(&input)
        .unwrap();
    let out = dir.path().join("x.l3");
    let o = l3(&[
        &"encode",
        &input,
        &out,
        &"--format",
        &"v1",
        &"--profile",
        &"ans",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--profile"));
    // Version 2 patch sizes are multiples of 32.
    let err = fails_naming(
        &l3(&[
            &"encode",
            &input,
            &out,
            &"--format",
            &"v2",
            &"--patch",
            &"48",
        ]),
        &input,
    );
    assert!(err.contains("multiple of 32"), "{err}");
    let o = l3(&[&"encode", &input, &out, &"--format", &"v3"]);
    assert!(!o.status.success());
    assert!(!out.exists());
}

#[test]
fn a_damaged_v2_file_is_refused_by_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (90u32, 70u32);
    let input = dir.path().join("in.png");
    image::RgbImage::from_raw(w, h, gradient(w, h, 3))
        .unwrap()
        .save(&input)
        .unwrap();
    for profile in ["ans", "bp"] {
        let good = dir.path().join(format!("good-{profile}.l3"));
        ok(&l3(&[&"encode", &input, &good, &"--profile", &profile]));
        let mut bytes = std::fs::read(&good).unwrap();
        // One bit in the middle of the patch data: v1 would decode it into other pixels.
        let at = bytes.len() / 2 + 3;
        bytes[at] ^= 0x10;
        let bad = dir.path().join(format!("bad-{profile}.l3"));
        std::fs::write(&bad, &bytes).unwrap();
        let out = dir.path().join(format!("bad-{profile}.png"));
        let err = fails_naming(&l3(&[&"decode", &bad, &out]), &bad);
        assert!(err.contains("CRC-32C mismatch"), "{err}");
        assert!(!out.exists());
        let err = fails_naming(&l3(&[&"info", &bad]), &bad);
        assert!(err.contains("CRC-32C mismatch"), "{err}");
        // A file cut short loses its checksum too.
        let cut = dir.path().join(format!("cut-{profile}.l3"));
        std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
        fails_naming(&l3(&[&"decode", &cut, &out]), &cut);
    }
}

#[test]
fn convert_writes_the_format_asked_for_and_rewrites_on_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..3u32 {
        let (w, h) = (50 + 17 * i, 40 + 9 * i);
        image::RgbImage::from_raw(w, h, gradient(w, h, 3))
            .unwrap()
            .save(src.join(format!("im{i}.png")))
            .unwrap();
    }
    let formats_in = |d: &Path| -> Vec<l3_format::Format> {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "l3"))
            .map(|e| {
                let b = std::fs::read(e.path()).unwrap();
                l3_format::L3File::parse(&b).unwrap().format()
            })
            .collect();
        v.dedup();
        v
    };
    let out = dir.path().join("out");
    ok(&l3(&[
        &"convert",
        &"--to",
        &"l3",
        &src,
        &out,
        &"--threads",
        &"2",
    ]));
    assert_eq!(formats_in(&out), vec![l3_format::DEFAULT_FORMAT]);
    ok(&l3(&[
        &"convert",
        &"--to",
        &"l3",
        &src,
        &out,
        &"--format",
        &"v2",
    ]));
    assert_eq!(
        formats_in(&out),
        vec![l3_format::Format::V2(l3_format::Profile::Ans)]
    );
    // Re-running with another format rewrites every file rather than keeping the old ones.
    let text = ok(&l3(&[
        &"convert",
        &"--to",
        &"l3",
        &src,
        &out,
        &"--format",
        &"v1",
    ]));
    assert!(
        text.contains("converted 3 files (0 already done)"),
        "{text}"
    );
    assert_eq!(formats_in(&out), vec![l3_format::Format::V1]);
    let text = ok(&l3(&[
        &"convert",
        &"--to",
        &"l3",
        &src,
        &out,
        &"--format",
        &"v1",
    ]));
    assert!(
        text.contains("converted 0 files (3 already done)"),
        "{text}"
    );
    ok(&l3(&[
        &"convert",
        &"--to",
        &"l3",
        &src,
        &out,
        &"--profile",
        &"bp",
    ]));
    assert_eq!(
        formats_in(&out),
        vec![l3_format::Format::V2(l3_format::Profile::Bp)]
    );
    // The format options belong to `--to l3`.
    let raw = dir.path().join("raw");
    let o = l3(&[&"convert", &"--to", &"raw", &src, &raw, &"--format", &"v1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--to l3"));
}
