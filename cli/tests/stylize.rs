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
            &["--ram-budget-mib", "1", "--spill-dir", spill_s],
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
    check(
        stylize(&input, &out, &["--mode", "fast"]),
        "mode \"fast\": expected",
    );
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

/// What `l3 stylize` produced before it streamed: the engine's whole 8-bit output in memory
/// (`stylize_on` with `sink_rgb8`), cropped to the input's size unless `full`.
fn whole_path(img: &bsp_tiling::Image, mode: &str, tile: usize, full: bool) -> bsp_tiling::Image {
    let net =
        bsp_tiling::Net::load_transformer(&model(), bsp_tiling::PaddingMode::Reflect).unwrap();
    let opts = bsp_tiling::Options {
        mode: bsp_tiling::Mode::parse(mode).unwrap(),
        tile,
        threads: 2,
        ..bsp_tiling::Options::default()
    };
    let (out, _) = bsp_tiling::stylize_on(&Default::default(), &net, img, &opts, true).unwrap();
    let bsp_tiling::Output::Rgb8(o) = out else {
        panic!("not 8-bit")
    };
    let (w, h) = (img.width as usize, img.height as usize);
    if full {
        return o;
    }
    let ow = o.width as usize;
    let pixels = (0..h)
        .flat_map(|y| o.pixels[y * ow * 3..(y * ow + w) * 3].iter().copied())
        .collect();
    bsp_tiling::Image::rgb8(w as u32, h as u32, pixels)
}

/// An output's decoded pixels (RGB, interleaved) and size, by extension.
fn decoded(p: &Path) -> (u32, u32, Vec<u8>) {
    if p.extension().is_some_and(|e| e == "l3") {
        let file = std::fs::read(p).unwrap();
        let l3 = l3_format::L3File::parse(&file).unwrap();
        let mut px = vec![0u8; l3.decoded_len()];
        l3.decode_hwc(&mut px).unwrap();
        return (l3.width(), l3.height(), px);
    }
    let img = image::open(p).unwrap().to_rgb8();
    (img.width(), img.height(), img.into_raw())
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// PNG and L3 inputs (the L3 read by region), every mode, several tiles, odd sizes, `--full`, and
/// PNG, L3 and PPM outputs streamed: the decoded pixels are the whole path's, byte for byte.
#[test]
fn streamed_output_equals_the_whole_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    // (w, h, tile): 129×77, 61×37 and 13×10 are no multiple of 4 (13×10 is one tile, near the smallest
    // image the network takes: 1×1 and 7×3 are refused, see below); 130×45 is one row of tiles.
    for &(w, h, tile) in &[
        (129u32, 77u32, 32usize),
        (61, 37, 16),
        (130, 45, 24),
        (13, 10, 16),
    ] {
        let png_in = small_image(dir.path(), "in.png", w, h);
        let img = loader::import(&png_in, &loader::ImportOptions::default())
            .unwrap()
            .to_rgb();
        let l3_in = d("in.l3");
        std::fs::write(&l3_in, l3_format::encode(&img.pixels, w, h, 3, 16).unwrap()).unwrap();
        for mode in ["exact", "sampled", "naive", "whole", "recompute"] {
            for full in [false, true] {
                let want = whole_path(&img, mode, tile, full);
                for (input, out) in [
                    (&png_in, "out.png"),
                    (&l3_in, "out.l3"),
                    (&l3_in, "out.ppm"),
                ] {
                    let out = d(out);
                    let tile_s = tile.to_string();
                    let mut args = vec!["--mode", mode, "--tile", &tile_s, "--threads", "2"];
                    if full {
                        args.push("--full");
                    }
                    let o = stylize(input, &out, &args);
                    let err = String::from_utf8_lossy(&o.stderr);
                    let what =
                        format!("{w}x{h} tile {tile} {mode} full {full} {input:?} -> {out:?}");
                    assert!(o.status.success(), "{what}: {err}");
                    let (ow, oh, px) = decoded(&out);
                    assert_eq!((ow, oh), (want.width, want.height), "{what}");
                    assert!(
                        px == want.pixels,
                        "{what}: pixels differ from the whole path"
                    );
                    // A PNG is decoded whole and says so; an L3 input is read by region.
                    assert_eq!(
                        err.contains("decoded whole"),
                        input == &png_in,
                        "{what}: {err}"
                    );
                    assert!(
                        err.contains(&format!(
                            "stylize: {w}x{h} -> {ow}x{oh} mode {mode} on cpu ("
                        )),
                        "{what}: {err}"
                    );
                    std::fs::remove_file(&out).unwrap();
                }
            }
        }
        assert_eq!(names(dir.path()), ["in.l3", "in.png"]);
    }
}

/// Inputs too small for the network are refused by the streamed path as by the whole path, and leave
/// no output.
#[test]
fn tiny_inputs_are_refused_as_before() {
    let dir = tempfile::tempdir().unwrap();
    for &(w, h) in &[(1u32, 1u32), (7, 3)] {
        let input = small_image(dir.path(), "in.png", w, h);
        let img = loader::import(&input, &loader::ImportOptions::default())
            .unwrap()
            .to_rgb();
        let net =
            bsp_tiling::Net::load_transformer(&model(), bsp_tiling::PaddingMode::Reflect).unwrap();
        let whole = bsp_tiling::stylize_on(
            &Default::default(),
            &net,
            &img,
            &bsp_tiling::Options::default(),
            true,
        );
        let out = dir.path().join("out.png");
        let o = stylize(&input, &out, &[]);
        match whole {
            Ok(_) => assert!(o.status.success()),
            Err(e) => {
                assert!(!o.status.success());
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(err.contains(&e.to_string()), "{e} not in {err}");
                assert!(!out.exists());
            }
        }
    }
}

/// A run that fails once its output is open (the spill directory is missing and its stored values do
/// not fit in 1 MiB of RAM) leaves no output and no temporary.
#[test]
fn a_failed_run_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_image(dir.path(), "in.png", 64, 40);
    let missing = dir.path().join("no-such-dir");
    let missing = missing.to_str().unwrap();
    for out in [
        "out.png", "out.l3", "out.ppm", "out.tif", "out.npy", "out.jpg",
    ] {
        let o = stylize(
            &input,
            &dir.path().join(out),
            &[
                "--tile",
                "16",
                "--ram-budget-mib",
                "1",
                "--spill-dir",
                missing,
            ],
        );
        assert!(!o.status.success(), "{out}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("no-such-dir"), "{out}: {err}");
        assert_eq!(names(dir.path()), ["in.png"], "{out}");
    }
}

/// The other outputs `l3 infer` offers: a tiled BigTIFF holds the PNG's bytes, a `.npy` the engine's raw
/// float32 output (cropped as the image outputs are), bit for bit.
#[test]
fn tif_and_npy_outputs() {
    use bsp_tiling::{Field, Input};
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let (w, h) = (75u32, 50u32);
    let input = small_image(dir.path(), "in.png", w, h);
    let img = loader::import(&input, &loader::ImportOptions::default())
        .unwrap()
        .to_rgb();
    let net =
        bsp_tiling::Net::load_transformer(&model(), bsp_tiling::PaddingMode::Reflect).unwrap();
    let opts = bsp_tiling::Options {
        tile: 24,
        threads: 2,
        ..bsp_tiling::Options::default()
    };
    let (raw, _) = bsp_tiling::stylize_on(&Default::default(), &net, &img, &opts, false).unwrap();
    let raw = raw.into_tensor().unwrap();
    for out in ["out.tif", "out.npy"] {
        let o = stylize(&input, &d(out), &["--tile", "24", "--threads", "2"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let want = whole_path(&img, "exact", 24, false);
    let tif = infer_io::tiff::TiffRegions::open(&d("out.tif"), 1 << 20).unwrap();
    assert_eq!((tif.width(), tif.height(), tif.channels()), (75, 50, 3));
    let (ys, xs): (Vec<_>, Vec<_>) = ((0..50).map(Some).collect(), (0..75).map(Some).collect());
    let mut planes = vec![0f32; 3 * 50 * 75];
    tif.gather(&ys, &xs, &mut planes).unwrap();
    let n = 50 * 75;
    let interleaved: Vec<u8> = (0..n * 3)
        .map(|i| planes[(i % 3) * n + i / 3] as u8)
        .collect();
    assert!(
        interleaved == want.pixels,
        ".tif differs from the whole path"
    );
    let npy = infer_io::npy::read(&d("out.npy")).unwrap();
    assert_eq!((npy.c, npy.h, npy.w), (3, 50, 75));
    for c in 0..3 {
        for y in 0..50 {
            for x in 0..75 {
                assert_eq!(
                    npy.at(c, y, x).to_bits(),
                    raw.at(c, y, x).to_bits(),
                    "({c},{y},{x})"
                );
            }
        }
    }
}

/// An 8-bit TIFF is read by region (no "decoded whole" note) into the PNG input's pixels; a 16-bit one is
/// refused naming the file, before any output exists.
#[test]
fn tiff_inputs() {
    use tiff::encoder::{TiffEncoder, colortype};
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let (w, h) = (70u32, 45u32);
    let png_in = small_image(dir.path(), "in.png", w, h);
    let img = loader::import(&png_in, &loader::ImportOptions::default())
        .unwrap()
        .to_rgb();
    TiffEncoder::new(std::fs::File::create(d("in.tif")).unwrap())
        .unwrap()
        .write_image::<colortype::RGB8>(w, h, &img.pixels)
        .unwrap();
    let o = stylize(&d("in.tif"), &d("out.png"), &["--tile", "16"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("decoded whole"), "{err}");
    assert!(decoded(&d("out.png")).2 == whole_path(&img, "exact", 16, false).pixels);
    let wide: Vec<u16> = img.pixels.iter().map(|&v| u16::from(v) * 257).collect();
    TiffEncoder::new(std::fs::File::create(d("in16.tif")).unwrap())
        .unwrap()
        .write_image::<colortype::RGB16>(w, h, &wide)
        .unwrap();
    let o = stylize(&d("in16.tif"), &d("out16.png"), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("in16.tif") && err.contains("8-bit"), "{err}");
    assert!(!d("out16.png").exists());
    // A later page of a multi-page file: page 1 (the 8-bit image after a 16-bit page 0) runs as that
    // image alone; a page or level asked of a PNG is refused.
    let mut enc = TiffEncoder::new(std::fs::File::create(d("two.tif")).unwrap()).unwrap();
    enc.write_image::<colortype::RGB16>(w, h, &wide).unwrap();
    enc.write_image::<colortype::RGB8>(w, h, &img.pixels)
        .unwrap();
    let o = stylize(
        &d("two.tif"),
        &d("page1.png"),
        &["--tile", "16", "--page", "1"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(decoded(&d("page1.png")).2 == whole_path(&img, "exact", 16, false).pixels);
    let o = stylize(&png_in, &d("lv.png"), &["--level", "1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("only TIFF inputs"));
    assert!(!d("lv.png").exists());
}
