//! `l3 infer` end to end on bsp-tiling's ONNX test models (onnxruntime's outputs beside them): `.npy` in
//! and out (written tile by tile), an L3 input read by region, a PNG with rows streamed, a page of a
//! multi-page TIFF, the refusals.
use bsp_tiling::Tensor;
use infer_io::npy;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn l3(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_l3"))
        .arg("infer")
        .args(args)
        .output()
        .unwrap()
}

fn data(f: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bsp-tiling/tests/data/onnx")
        .join(f)
}

fn rel(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!((a.c, a.h, a.w), (b.c, b.h, b.w));
    let m = b.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.data
        .iter()
        .zip(&b.data)
        .fold(0f32, |d, (x, y)| d.max((x - y).abs()))
        / m
}

#[test]
fn npy_in_npy_out_equals_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    for (model, size, tile) in [
        ("esrgan_x4", "23x37", "8"),
        ("unet_gn", "44x60", "16"),
        ("resnet_fcn", "45x39", "8"),
    ] {
        let out = dir.path().join(format!("{model}.npy"));
        let o = l3(&[
            &"--model",
            &data(&format!("{model}.onnx")),
            &"--tile",
            &tile,
            &"--threads",
            &"2",
            &data(&format!("{model}.in.{size}.npy")),
            &out,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = npy::read(&out).unwrap();
        let want = npy::read(&data(&format!("{model}.ort.{size}.npy"))).unwrap();
        let e = rel(&got, &want);
        assert!(e <= 1e-4, "{model}: {e}");
    }
}

#[test]
fn l3_input_by_region_png_output_streamed() {
    let dir = tempfile::tempdir().unwrap();
    // An RGB image as L3, through the toolkit's own encoder.
    let (w, h) = (41u32, 30u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| ((i * 37) % 251) as u8).collect();
    let l3_bytes = l3_format::encode(&px, w, h, 3, 16).unwrap();
    let input = dir.path().join("in.l3");
    std::fs::write(&input, l3_bytes).unwrap();
    let png = dir.path().join("up.png");
    let npy_out = dir.path().join("up.npy");
    for out in [&png, &npy_out] {
        let o = l3(&[
            &"--model",
            &data("esrgan_x4.onnx"),
            &"--tile",
            &"8",
            &"--in-scale",
            &"0.00392156862745098",
            &"--out-scale",
            &"255",
            &input,
            out,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // The PNG is the float output × 255, clamped and rounded.
    let f = npy::read(&npy_out).unwrap();
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!((img.width(), img.height()), (4 * w, 4 * h));
    for (i, p) in img.pixels().enumerate().step_by(97) {
        let (y, x) = (i / (4 * w as usize), i % (4 * w as usize));
        for c in 0..3 {
            let want = (f.at(c, y, x) * 255.0).clamp(0.0, 255.0).round() as u8;
            assert!(
                p.0[c].abs_diff(want) <= 1,
                "({x},{y}) c{c}: {} vs {want}",
                p.0[c]
            );
        }
    }
    // Same result as the whole decoded image through .npy.
    let whole_in = dir.path().join("in.npy");
    let t = Tensor::from_vec(3, h as usize, w as usize, {
        let mut v = vec![0f32; px.len()];
        for (i, &b) in px.iter().enumerate() {
            let (p, c) = (i / 3, i % 3);
            v[c * (w * h) as usize + p] = b as f32 / 255.0;
        }
        v
    })
    .unwrap();
    npy::write(&whole_in, &t).unwrap();
    let ref_out = dir.path().join("ref.npy");
    let o = l3(&[
        &"--model",
        &data("esrgan_x4.onnx"),
        &"--mode",
        &"whole",
        &whole_in,
        &ref_out,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(rel(&f, &npy::read(&ref_out).unwrap()) <= 1e-5);
}

#[test]
fn refusals_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("y.npy");
    let x = data("unet_gn.in.44x60.npy");
    let o = l3(&[
        &"--model",
        &data("unet_gn.onnx"),
        &"--device",
        &"cuda",
        &"--precision",
        &"f16",
        &x,
        &out,
    ]);
    // Without a GPU the probe's reason and no output; with one, every node runs in f16.
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        assert!(out.exists(), "{err}");
        std::fs::remove_file(&out).unwrap();
    } else {
        assert!(err.contains("device cuda"), "{err}");
        assert!(!out.exists(), "a refused run leaves no output");
    }
    let o = l3(&[&"--model", &data("bad_gap.onnx"), &x, &out]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("GlobalAveragePool") && err.contains("node"),
        "{err}"
    );
    let o = l3(&[&"--model", &data("unet_gn.onnx"), &"--tile", &"6", &x, &out]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("multiple of 4"));
    assert!(!out.exists(), "a failed run leaves no output");
    let png = dir.path().join("y.png");
    let o = l3(&[&"--model", &data("unet_gn.onnx"), &"--tile", &"6", &x, &png]);
    assert!(!o.status.success());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "failed runs leave no temporaries: {left:?}"
    );
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!((a.c, a.h, a.w), (b.c, b.h, b.w), "{what}");
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
    }
}

fn read_tiff(p: &Path) -> Tensor {
    use bsp_tiling::{Field, Input};
    let r = infer_io::tiff::TiffRegions::open(p, 1 << 20).unwrap();
    let ys: Vec<Option<usize>> = (0..r.height()).map(Some).collect();
    let xs: Vec<Option<usize>> = (0..r.width()).map(Some).collect();
    let mut t = Tensor::zeros(r.channels(), ys.len(), xs.len()).unwrap();
    r.gather(&ys, &xs, &mut t.data).unwrap();
    t
}

/// A tensor written as a tiled BigTIFF by the toolkit's writer.
fn write_tiff(p: &Path, t: &Tensor, dtype: infer_io::tiff::OutDType) {
    use bsp_tiling::Sink;
    let f = std::fs::File::create(p).unwrap();
    let w = infer_io::tiff::TiffWriter::new(f, p, t.c, t.h, t.w, dtype).unwrap();
    w.put_tile(0, 0, t).unwrap();
    w.finish().unwrap();
}

#[test]
fn tiff_in_and_out_equal_npy_and_png_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let model = data("norm_first.onnx");
    for &(w, h, tile) in &[(37u32, 29u32, 16usize), (7, 3, 4), (1, 1, 8)] {
        // 8-bit pixels as PNG, as a striped classic TIFF (the `image` crate's encoder) and as a tiled
        // BigTIFF (ours): the same output, bit for bit, with and without tiling.
        let px: Vec<u8> = (0..w * h * 3)
            .map(|i| ((i * 7919 + w * 13) % 256) as u8)
            .collect();
        image::save_buffer(d("in.png"), &px, w, h, image::ExtendedColorType::Rgb8).unwrap();
        image::save_buffer(
            d("in_strips.tif"),
            &px,
            w,
            h,
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
        let t8 = Tensor::from_vec(3, h as usize, w as usize, {
            let mut v = vec![0f32; px.len()];
            for (i, &b) in px.iter().enumerate() {
                v[(i % 3) * (w * h) as usize + i / 3] = f32::from(b);
            }
            v
        })
        .unwrap();
        write_tiff(&d("in_tiles.tif"), &t8, infer_io::tiff::OutDType::U8);
        let tile = tile.to_string();
        let run = |input: &Path, out: &Path, extra: &[&str]| {
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
                vec![&"--model", &model, &"--tile", &tile, &"--in-scale", &"0.01"];
            for a in extra {
                args.push(a);
            }
            args.push(&input);
            args.push(&out);
            ok(l3(&args))
        };
        let o = run(&d("in.png"), &d("png.npy"), &[]);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("decoded whole"),
            "a whole decode is said: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let reference = npy::read(&d("png.npy")).unwrap();
        for input in ["in_strips.tif", "in_tiles.tif"] {
            let o = run(&d(input), &d("tif.npy"), &[]);
            assert!(!String::from_utf8_lossy(&o.stderr).contains("decoded whole"));
            same_bits(&npy::read(&d("tif.npy")).unwrap(), &reference, input);
        }
        // Outputs: a float32 BigTIFF equals the .npy; a uint8 one equals the PNG.
        run(&d("in.png"), &d("out_f.tif"), &["--out-dtype", "float32"]);
        same_bits(
            &read_tiff(&d("out_f.tif")),
            &reference,
            "float32 TIFF output",
        );
        run(&d("in_tiles.tif"), &d("out.png"), &["--out-scale", "60"]);
        run(&d("in_tiles.tif"), &d("out8.tif"), &["--out-scale", "60"]);
        let png = image::open(d("out.png")).unwrap().to_rgb8();
        // Read back by the `image` crate (the `tiff` crate's whole-image decoder).
        let tif = image::open(d("out8.tif")).unwrap().to_rgb8();
        assert_eq!(png.dimensions(), (w, h));
        assert_eq!(png.as_raw(), tif.as_raw(), "uint8 TIFF output vs PNG");
        for f in ["out_f.tif", "out8.tif", "out.png", "tif.npy"] {
            std::fs::remove_file(d(f)).unwrap();
        }
    }
    // float32 samples are taken as they are, like a .npy input.
    let x = npy::read(&data("norm_first.in.41x29.npy")).unwrap();
    write_tiff(&d("in_f.tif"), &x, infer_io::tiff::OutDType::F32);
    for (input, out) in [
        (data("norm_first.in.41x29.npy"), d("a.npy")),
        (d("in_f.tif"), d("b.npy")),
    ] {
        ok(l3(&[&"--model", &model, &"--tile", &"12", &input, &out]));
    }
    same_bits(
        &npy::read(&d("b.npy")).unwrap(),
        &npy::read(&d("a.npy")).unwrap(),
        "float32 TIFF input vs .npy",
    );
}

#[test]
fn tiff_refusals_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = data("norm_first.onnx");
    let x = data("norm_first.in.41x29.npy");
    // A truncated TIFF input.
    let t = npy::read(&x).unwrap();
    let good = dir.path().join("good.tif");
    write_tiff(&good, &t, infer_io::tiff::OutDType::F32);
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.tif");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = dir.path().join("y.npy");
    let o = l3(&[&"--model", &model, &cut, &out]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cut.tif"), "{err}");
    // A dtype the output format cannot hold.
    let png = dir.path().join("y.png");
    let o = l3(&[&"--model", &model, &"--out-dtype", &"float32", &x, &png]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("y.png") && err.contains("float32"), "{err}");
    let o = l3(&[&"--model", &model, &"--out-dtype", &"int7", &x, &out]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("out_dtype \"int7\": expected uint8 or float32")
    );
    std::fs::remove_file(&good).unwrap();
    std::fs::remove_file(&cut).unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "failed runs leave nothing: {left:?}");
}

/// A three-page TIFF: page 0 a 40×30 RGB image, page 1 the 23×17 RGB page `reduced` (NewSubfileType = 1,
/// LZW strips of 5 rows), page 2 a 1-channel 9×8 page.
fn three_pages(p: &Path, reduced: &[u8]) {
    use tiff::encoder::{Compression, TiffEncoder, colortype};
    let mut enc = TiffEncoder::new(std::fs::File::create(p).unwrap()).unwrap();
    let px: Vec<u8> = (0..40 * 30 * 3).map(|i| (i * 31 % 251) as u8).collect();
    enc.write_image::<colortype::RGB8>(40, 30, &px).unwrap();
    let mut enc = enc.with_compression(Compression::Lzw);
    let mut img = enc.new_image::<colortype::RGB8>(23, 17).unwrap();
    img.encoder()
        .write_tag(tiff::tags::Tag::NewSubfileType, 1u32)
        .unwrap();
    img.rows_per_strip(5).unwrap();
    img.write_data(reduced).unwrap();
    enc.write_image::<colortype::Gray8>(9, 8, &[7u8; 72])
        .unwrap();
}

#[test]
fn a_tiff_page_runs_as_that_page_written_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let model = data("norm_first.onnx");
    let reduced: Vec<u8> = (0..23 * 17 * 3).map(|i| (i * 7919 % 256) as u8).collect();
    three_pages(&d("slide.tif"), &reduced);
    tiff::encoder::TiffEncoder::new(std::fs::File::create(d("alone.tif")).unwrap())
        .unwrap()
        .write_image::<tiff::encoder::colortype::RGB8>(23, 17, &reduced)
        .unwrap();
    let run = |input: &Path, out: &Path, extra: &[&str]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"--model", &model, &"--tile", &"8", &"--in-scale", &"0.01"];
        for a in extra {
            args.push(a);
        }
        args.push(&input);
        args.push(&out);
        l3(&args)
    };
    for (out, alone) in [("page1.npy", "alone.npy"), ("page1.png", "alone.png")] {
        ok(run(&d("slide.tif"), &d(out), &["--page", "1"]));
        ok(run(&d("alone.tif"), &d(alone), &[]));
        let (a, b) = (
            std::fs::read(d(out)).unwrap(),
            std::fs::read(d(alone)).unwrap(),
        );
        assert!(a == b, "{out} and {alone} differ");
    }
    // Page 0 is the default and differs from page 1 (the pages are really told apart).
    ok(run(&d("slide.tif"), &d("page0.npy"), &["--page", "0"]));
    ok(run(&d("slide.tif"), &d("default.npy"), &[]));
    assert_eq!(
        std::fs::read(d("page0.npy")).unwrap(),
        std::fs::read(d("default.npy")).unwrap()
    );
    assert_eq!(npy::read(&d("page0.npy")).unwrap().w, 40);
    // The page list.
    let o = ok(l3(&[&"--list-pages", &d("slide.tif")]));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "page 0: 40x30, 3 channels, u8, striped 40x30, no NewSubfileType\n\
         page 1: 23x17, 3 channels, u8, striped 23x5, reduced\n\
         page 2: 9x8, 1 channel, u8, striped 9x8, no NewSubfileType\n"
    );
}

#[test]
fn page_refusals_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let model = data("norm_first.onnx");
    three_pages(&d("slide.tif"), &[1u8; 23 * 17 * 3]);
    let out = d("y.npy");
    // A page the file lacks: the file, the page and the count.
    let o = l3(&[&"--model", &model, &"--page", &"3", &d("slide.tif"), &out]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("slide.tif") && err.contains("no page 3") && err.contains("3 pages"),
        "{err}"
    );
    // A page asked of an input without pages.
    let x = data("norm_first.in.41x29.npy");
    let o = l3(&[&"--model", &model, &"--page", &"0", &x, &out]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("norm_first.in.41x29.npy") && err.contains("only TIFF inputs"),
        "{err}"
    );
    // A level the page lacks (these pages have no SubIFDs), and a level asked of an input without any.
    let o = l3(&[&"--model", &model, &"--level", &"1", &d("slide.tif"), &out]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("slide.tif") && err.contains("page 0 has no level 1"),
        "{err}"
    );
    let o = l3(&[&"--model", &model, &"--level", &"0", &x, &out]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("only TIFF inputs"));
    // The page list of a file that is not a TIFF.
    let o = l3(&[&"--list-pages", &x]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("norm_first.in.41x29.npy"));
    // --list-pages runs nothing: it takes no model or output.
    let o = l3(&[&"--list-pages", &d("slide.tif"), &"--model", &model]);
    assert!(!o.status.success());
    assert!(!out.exists());
}

#[test]
fn l3_and_ppm_outputs_stream_the_png_outputs_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let model = data("norm_first.onnx");
    // Bands of 48 rows against the default format's rows of patches of 128; 7×3 and 1×1 are one partial
    // patch.
    for &(w, h, tile) in &[(300u32, 270u32, 48usize), (7, 3, 4), (1, 1, 8)] {
        let px: Vec<u8> = (0..w * h * 3)
            .map(|i| ((i / 3 % w) * 3 + (i / 3 / w) * 2 + (i * 7919) % 23) as u8)
            .collect();
        image::save_buffer(d("in.png"), &px, w, h, image::ExtendedColorType::Rgb8).unwrap();
        let tile = tile.to_string();
        for out in ["out.png", "out.l3", "out.ppm", "out.jpg"] {
            ok(l3(&[
                &"--model",
                &model,
                &"--tile",
                &tile,
                &"--threads",
                &"2",
                &"--in-scale",
                &"0.01",
                &"--out-scale",
                &"60",
                &d("in.png"),
                &d(out),
            ]));
        }
        // The PNG path streamed rows before this change: the reference pixels.
        let png = image::open(d("out.png")).unwrap().to_rgb8();
        assert_eq!(png.dimensions(), (w, h));
        let ppm = image::open(d("out.ppm")).unwrap().to_rgb8();
        assert_eq!(ppm.as_raw(), png.as_raw(), "{w}x{h}: .ppm vs .png");
        // The .jpg, its rows streamed to the encoder, decodes to what the whole-image encoder's file of
        // the PNG's pixels decodes to, within rounding.
        let jpg = image::open(d("out.jpg")).unwrap().to_rgb8();
        let whole = loader::convert::encode(
            &bsp_tiling::Image {
                width: w,
                height: h,
                channels: 3,
                pixels: png.as_raw().clone(),
            },
            loader::convert::Target::Jpeg(95),
        )
        .unwrap();
        let whole = image::load_from_memory(&whole).unwrap().to_rgb8();
        let worst = jpg
            .as_raw()
            .iter()
            .zip(whole.as_raw())
            .map(|(a, b)| a.abs_diff(*b))
            .max();
        assert!(
            worst <= Some(2),
            "{w}x{h}: .jpg vs the whole encode: {worst:?}"
        );
        // The .l3 decodes to the same pixels, and is byte for byte the file the whole-image encoder
        // (what `l3 infer` wrote before: `loader::convert::encode`, the default format) makes of them.
        let file = std::fs::read(d("out.l3")).unwrap();
        let l3 = l3_format::L3File::parse(&file).unwrap();
        let mut back = vec![0u8; l3.decoded_len()];
        l3.decode_hwc(&mut back).unwrap();
        assert_eq!(&back, png.as_raw(), "{w}x{h}: .l3 vs .png");
        let whole = loader::convert::encode(
            &bsp_tiling::Image {
                width: w,
                height: h,
                channels: 3,
                pixels: png.into_raw(),
            },
            loader::convert::Target::L3_DEFAULT,
        )
        .unwrap();
        assert!(
            file == whole,
            "{w}x{h}: the streamed .l3 differs from the whole encode"
        );
        // Only what was written is left: no spill file, no temporary.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["in.png", "out.jpg", "out.l3", "out.png", "out.ppm"]);
        for f in names {
            std::fs::remove_file(d(&f)).unwrap();
        }
    }
}

/// The pixels of a 3-channel 8-bit image as the float32 `C×H×W` tensor `l3 infer` reads them as.
fn planes(px: &[u8], w: usize, h: usize) -> Tensor {
    let mut v = vec![0f32; px.len()];
    for (i, &b) in px.iter().enumerate() {
        v[(i % 3) * w * h + i / 3] = f32::from(b);
    }
    Tensor::from_vec(3, h, w, v).unwrap()
}

#[test]
fn every_l3_version_and_profile_reads_by_region_as_the_pixels() {
    let dir = tempfile::tempdir().unwrap();
    // Larger than one v2 patch (128), with a ragged last patch on both axes.
    let (w, h) = (152usize, 136usize);
    let px: Vec<u8> = (0..w * h * 3)
        .map(|i| ((i * 7919 / 13) % 256) as u8)
        .collect();
    let reference = dir.path().join("in.npy");
    npy::write(&reference, &planes(&px, w, h)).unwrap();
    let want = dir.path().join("want.npy");
    ok(l3(&[
        &"--model",
        &data("unet_gn.onnx"),
        &"--tile",
        &"64",
        &reference,
        &want,
    ]));
    let want = npy::read(&want).unwrap();
    use l3_format::{EncodeOptions, Format, Profile};
    for (name, format, entry_crcs) in [
        ("v1", Format::V1, false),
        ("bp", Format::V2(Profile::Bp), true),
        ("ans", Format::V2(Profile::Ans), true),
        ("ans-nocrc", Format::V2(Profile::Ans), false),
    ] {
        let opts = EncodeOptions {
            format,
            entry_crcs,
            ..Default::default()
        };
        let input = dir.path().join(format!("{name}.l3"));
        std::fs::write(
            &input,
            l3_format::encode_with(&px, w as u32, h as u32, 3, &opts).unwrap(),
        )
        .unwrap();
        let out = dir.path().join(format!("{name}.npy"));
        ok(l3(&[
            &"--model",
            &data("unet_gn.onnx"),
            &"--tile",
            &"64",
            &input,
            &out,
        ]));
        same_bits(&npy::read(&out).unwrap(), &want, name);
    }
}

#[test]
fn a_damaged_l3_input_is_refused_before_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let (w, h) = (152usize, 136usize);
    let px: Vec<u8> = (0..w * h * 3).map(|i| ((i * 31) % 256) as u8).collect();
    for entry_crcs in [true, false] {
        let opts = l3_format::EncodeOptions {
            entry_crcs,
            ..Default::default()
        };
        let mut bytes = l3_format::encode_with(&px, w as u32, h as u32, 3, &opts).unwrap();
        // One bit flipped in the patch data, far from the header and tables.
        let at = bytes.len() - bytes.len() / 3;
        bytes[at] ^= 0x10;
        let input = dir.path().join(format!("damaged-{entry_crcs}.l3"));
        std::fs::write(&input, &bytes).unwrap();
        let out = dir.path().join("out.png");
        let o = l3(&[&"--model", &data("unet_gn.onnx"), &input, &out]);
        assert!(!o.status.success(), "a damaged input must be refused");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&*input.to_string_lossy()) && err.contains("CRC"),
            "{err}"
        );
        assert!(!out.exists(), "a refused run leaves no output");
    }
}

/// A whole-image run whose activations exceed the machine's memory (here a 600 KiB
/// `L3_MEMORY_LIMIT`) is refused before it runs — a typed error naming the limit, not the kernel's OOM
/// killer halfway — and leaves no output; the exact mode, and the sampled mode, whose sample's
/// statistics are computed tile by tile under the run's budget, run under the same limit.
#[test]
fn whole_past_the_memory_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = |model: &str, input: &str, mode: &str, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_l3"))
            .env("L3_MEMORY_LIMIT", "600K")
            .args(["infer", "--model"])
            .arg(data(model))
            .args(["--mode", mode, "--tile", "8"])
            .arg(data(input))
            .arg(out)
            .output()
            .unwrap()
    };
    let out = dir.path().join("whole.npy");
    let o = run("unet_gn.onnx", "unet_gn.in.44x60.npy", "whole", &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("whole-image run") && err.contains("L3_MEMORY_LIMIT"),
        "{err}"
    );
    assert!(!out.exists());
    for (model, input, mode, w) in [
        ("unet_gn.onnx", "unet_gn.in.44x60.npy", "exact", 60),
        ("norm_first.onnx", "norm_first.in.41x29.npy", "sampled", 29),
    ] {
        let out = dir.path().join(format!("{mode}.npy"));
        let o = run(model, input, mode, &out);
        assert!(
            o.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(npy::read(&out).unwrap().w, w, "{mode}");
    }
}

/// A `c×h×w` tensor of small distinct values.
fn ramp(c: usize, h: usize, w: usize) -> Tensor {
    Tensor {
        c,
        h,
        w,
        data: (0..c * h * w).map(|i| (i % 251) as f32 / 251.0).collect(),
    }
}

/// The peak RSS `l3 infer` reports on its last stderr line, in MiB.
fn peak_rss_mib(o: &Output) -> f64 {
    let err = String::from_utf8_lossy(&o.stderr);
    let at = err.rfind("peak RSS ").expect("a peak RSS line") + "peak RSS ".len();
    err[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A model whose output is 16× its input's side (four Resize ×2): at the default tile one tile's output
/// alone is 12 MiB, past `--ram-budget-mib 4` (or an `L3_MEMORY_LIMIT` of 4 MiB). The tile is shrunk to
/// fit, said on stderr; the output is the bits of a run without a budget; the peak RSS stays within the
/// budget of what the process holds on a tiny image, where the unbudgeted run's does not.
#[test]
fn a_growing_model_runs_within_its_ram_budget() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    npy::write(&x, &ramp(3, 64, 64)).unwrap();
    let tiny = dir.path().join("tiny.npy");
    npy::write(&tiny, &ramp(3, 1, 1)).unwrap();
    let run = |input: &Path, out: &str, args: &[&str], limit: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_l3"));
        if let Some(l) = limit {
            c.env("L3_MEMORY_LIMIT", l);
        }
        c.args(["infer", "--model"])
            .arg(data("grow_x16.onnx"))
            .args(["--threads", "2"])
            .args(args)
            .arg(input)
            .arg(dir.path().join(out))
            .output()
            .unwrap()
    };
    let base = peak_rss_mib(&ok(run(&tiny, "tiny.out.npy", &[], None)));
    let free = ok(run(&x, "free.npy", &[], None));
    let budgeted = ok(run(&x, "budget.npy", &["--ram-budget-mib", "4"], None));
    let limited = ok(run(&x, "limit.npy", &[], Some("4M")));
    let want = npy::read(&dir.path().join("free.npy")).unwrap();
    assert_eq!((want.c, want.h, want.w), (3, 1024, 1024));
    for (o, out, from) in [
        // (the RAM budget less the output writer's share)
        (&budgeted, "budget.npy", "more than the RAM budget ("),
        (&limited, "limit.npy", "more than the RAM budget ("),
    ] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("tiles of 512 input pixels would hold") && err.contains(from),
            "{err}"
        );
        same_bits(&npy::read(&dir.path().join(out)).unwrap(), &want, out);
        let rss = peak_rss_mib(o);
        eprintln!("{out}: peak RSS {rss} MiB, {base} MiB on a 1x1 image");
        assert!(
            rss <= base + 4.0,
            "{out}: peak RSS {rss} MiB, {base} MiB on a 1x1 image"
        );
    }
    let rss = peak_rss_mib(&free);
    assert!(
        rss > base + 12.0,
        "without a budget: {rss} MiB ({base} MiB on a 1x1 image)"
    );
}

/// A model that grows 4096× (two Resize ×64) cannot fit a 64 MiB budget even at one input pixel per
/// tile: refused before it runs, with an `l3: error` line naming the budget and the figure, exit status
/// 1 (not a signal: no abort), and nothing left beside the input — no output, no temporary.
#[test]
fn a_model_past_its_budget_at_any_tile_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    npy::write(&x, &ramp(3, 1, 1)).unwrap();
    for (args, limit, names) in [
        (
            &["--ram-budget-mib", "64"][..],
            None,
            "more than the RAM budget (",
        ),
        (&[][..], Some("64M"), "L3_MEMORY_LIMIT"),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_l3"));
        if let Some(l) = limit {
            c.env("L3_MEMORY_LIMIT", l);
        }
        let o = c
            .args(["infer", "--model"])
            .arg(data("grow_x4096.onnx"))
            .args(args)
            .arg(&x)
            .arg(dir.path().join("y.npy"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("l3: error: "))
            .expect(&err);
        assert!(
            line.contains("a tile's working set")
                && line.contains("needs 384.0 MiB")
                && line.contains(names),
            "{line}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["x.npy"], "nothing but the input is left");
    }
}

/// `l3 infer` under real process limits (`ulimit -v`) that the plan's own figure does not cover: from the
/// smallest under which the binary runs at all (a 1×1 image succeeds) upwards in 1 MiB steps, the run on
/// a 44×60 input either succeeds with the output of an unlimited run or ends with an `l3: error` line,
/// exit status 1 and no output — never an abort, a panic or a signal, whichever allocation the limit
/// refuses; and some limit in the ladder refuses an activation (`Error::OutOfMemory`), which a `vec!`
/// would have turned into an abort.
#[test]
fn every_address_space_limit_runs_or_errors_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.npy");
    npy::write(&tiny, &ramp(3, 1, 1)).unwrap();
    let x = dir.path().join("x.npy");
    npy::write(&x, &ramp(3, 44, 60)).unwrap();
    let run = |input: &Path, out: &Path, limit_kib: Option<u64>| {
        let ulimit = limit_kib.map_or("true".to_string(), |k| format!("ulimit -v {k}"));
        Command::new("bash")
            .arg("-c")
            .arg(format!("{ulimit} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_l3"))
            .args(["infer", "--threads", "2", "--model"])
            .arg(data("grow_x16.onnx"))
            .arg(input)
            .arg(out)
            .output()
            .unwrap()
    };
    let free = dir.path().join("free.npy");
    ok(run(&x, &free, None));
    let want = npy::read(&free).unwrap();
    let tiny_out = dir.path().join("tiny.out.npy");
    let start = (8..=1024u64)
        .map(|mib| mib << 10)
        .find(|&kib| run(&tiny, &tiny_out, Some(kib)).status.success())
        .expect("a 1x1 run succeeds under some limit up to 1 GiB");
    let (mut ran, mut refused) = (0, 0);
    for kib in (start..start + (64 << 10)).step_by(1 << 10) {
        let out = dir.path().join("y.npy");
        let o = run(&x, &out, Some(kib));
        let err = String::from_utf8_lossy(&o.stderr);
        match o.status.code() {
            Some(0) => {
                same_bits(&npy::read(&out).unwrap(), &want, &format!("{kib} KiB"));
                std::fs::remove_file(&out).unwrap();
                ran += 1;
            }
            Some(1) => {
                let line = err
                    .lines()
                    .find(|l| l.starts_with("l3: error: "))
                    .unwrap_or_else(|| panic!("{kib} KiB: {err}"));
                assert!(!out.exists(), "{kib} KiB: an output is left");
                refused += usize::from(line.contains("out of memory"));
            }
            other => panic!("{kib} KiB: exit {other:?} (an abort or a signal): {err}"),
        }
    }
    assert!(ran > 0 && refused > 0, "ran {ran}, out of memory {refused}");
}
