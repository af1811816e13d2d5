//! `l3 infer` end to end on bsp-tiling's ONNX test models (onnxruntime's outputs beside them): `.npy` in
//! and out (written tile by tile), an L3 input read by region, a PNG with rows streamed, the refusals.
use bsp_tiling::{Tensor, npy};
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
        &x,
        &out,
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("CPU backend only"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
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
