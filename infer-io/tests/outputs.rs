//! Outputs appear complete or not at all, and kills do not pile temporaries up beside them: a run
//! removes what dead writers of the same output left, and nothing of other files.

use bsp_tiling::{Budget, DeviceOptions, Mode};
use infer_io::{InferRequest, infer_paths, load_model};
use std::path::{Path, PathBuf};

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bsp-tiling/tests/data/onnx/norm_first.onnx")
}

fn request(input: &Path, output: &Path) -> InferRequest {
    InferRequest {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        mode: Mode::Exact,
        tile: 32,
        threads: 2,
        budget: Budget::default(),
        full: true,
        in_scale: 1.0,
        out_scale: 1.0,
        out_dtype: None,
        device: DeviceOptions::default(),
        page: None,
        level: None,
        ranks: None,
    }
}

#[test]
fn a_run_removes_dead_writers_temporaries_of_its_output_only() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.npy");
    let t = bsp_tiling::Tensor::from_vec(3, 40, 50, (0..6000).map(|v| v as f32 / 97.0).collect())
        .unwrap();
    infer_io::npy::write(&input, &t).unwrap();
    let out = dir.path().join("out.npy");
    let mark = stdx::fs::TEMP_MARK;
    // A pid far above pid_max: writers that no longer run (killed mid-write).
    let dead = dir.path().join(format!(".out.npy{mark}4000000000.0"));
    let other = dir.path().join(format!(".other.npy{mark}4000000000.0"));
    std::fs::write(&dead, b"half").unwrap();
    std::fs::write(&other, b"half").unwrap();
    let g = load_model(&model(), None).unwrap();
    infer_paths(&g, &request(&input, &out)).unwrap();
    assert!(
        !dead.exists(),
        "the dead writer's temporary of out.npy is gone"
    );
    assert!(
        other.exists(),
        "another output's temporary is not this run's to remove"
    );
    assert_eq!(infer_io::npy::read(&out).unwrap().c, 3);
    // A failed run leaves nothing: an output type the network cannot be written as.
    let bad = dir.path().join("bad.png");
    let g6 = load_model(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../bsp-tiling/tests/data/onnx/resnet_fcn.onnx"),
        None,
    )
    .unwrap();
    assert!(infer_paths(&g6, &request(&input, &bad)).is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("bad.png"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The output's writer holds bands of rows as wide as the image: what it holds is taken from the RAM
/// budget before the run starts, and a writer that alone would exceed it is refused up front, naming the
/// figures, with nothing written.
#[test]
fn a_writer_over_the_budget_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("wide.npy");
    let (h, w) = (40, 20_000);
    let t =
        bsp_tiling::Tensor::from_vec(3, h, w, (0..3 * h * w).map(|v| (v % 251) as f32).collect())
            .unwrap();
    infer_io::npy::write(&input, &t).unwrap();
    let g = load_model(&model(), None).unwrap();
    let out = dir.path().join("wide.png");
    let mut req = request(&input, &out);
    req.budget.ram = 1 << 20;
    let e = infer_paths(&g, &req).unwrap_err().to_string();
    assert!(
        e.contains("wide.png") && e.contains("writer would hold") && e.contains("--tile"),
        "{e}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("wide.png"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // With room for the writer's bands the same run writes the image.
    req.budget.ram = 256 << 20;
    infer_paths(&g, &req).unwrap();
    let file = std::io::BufReader::new(std::fs::File::open(&out).unwrap());
    let png = png::Decoder::new(file).read_info().unwrap();
    assert_eq!((png.info().width, png.info().height), (w as u32, h as u32));
    // `l3 stylize` takes its writer off the same budget, and refuses it the same way.
    let image = dir.path().join("wide_in.png");
    let mut enc = png::Encoder::new(std::fs::File::create(&image).unwrap(), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    let mut writer = enc.write_header().unwrap();
    writer.write_image_data(&vec![7u8; 3 * h * w]).unwrap();
    writer.finish().unwrap();
    let net = bsp_tiling::Net::random_transformer(
        bsp_tiling::Widths(4, 4, 4),
        1,
        bsp_tiling::PaddingMode::Reflect,
    );
    let out = dir.path().join("wide_styled.png");
    let mut req = request(&image, &out);
    req.budget.ram = 1 << 20;
    let e = infer_io::stylize_paths(&net, &req).unwrap_err().to_string();
    assert!(
        e.contains("wide_styled.png") && e.contains("writer would hold"),
        "{e}"
    );
    assert!(!out.exists());
}
