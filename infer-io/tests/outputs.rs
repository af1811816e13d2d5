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
