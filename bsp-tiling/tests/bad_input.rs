//! Bad models, grids, images and budgets give typed errors, never panics.

mod common;

use bsp_tiling::{
    Budget, CpuBackend, Error, Grid, Image, Mode, Net, Options, PaddingMode, Tensor, Widths,
    grid_for, stylize,
};
use common::*;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// The real candy model's tensors, edited by `edit`, serialised back.
fn edited(edit: impl FnOnce(&mut HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>)) -> Vec<u8> {
    let bytes = std::fs::read(shared().join("models/candy_nc8.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut m: HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut m);
    let views: Vec<(String, TensorView)> = m
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

fn load(bytes: &[u8]) -> Result<Net, Error> {
    Net::transformer_from_bytes(bytes, Path::new("model.safetensors"), PaddingMode::Reflect)
}

#[test]
fn model_files() {
    assert!(load(&edited(|_| {})).is_ok());
    let e = load(&edited(|m| {
        m.remove("res3.in2.weight");
    }))
    .unwrap_err();
    assert!(
        matches!(&e, Error::MissingTensor { key, .. } if key == "res3.in2.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("model.safetensors"));
    let e = load(&edited(|m| {
        let t = m.get_mut("deconv1.conv2d.weight").unwrap();
        t.1 = vec![16, 32, 1, 9];
    }))
    .unwrap_err();
    assert!(
        matches!(&e, Error::BadShape { key, .. } if key == "deconv1.conv2d.weight"),
        "{e}"
    );
    let e = load(&edited(|m| {
        let t = m.get_mut("in1.bias").unwrap();
        t.0 = Dtype::I32;
    }))
    .unwrap_err();
    assert!(matches!(&e, Error::BadDtype { .. }), "{e}");
    let e = load(&edited(|m| {
        m.insert("extra.weight".into(), (Dtype::F32, vec![1], vec![0; 4]));
    }))
    .unwrap_err();
    assert!(matches!(&e, Error::UnexpectedTensor { .. }), "{e}");
    // running statistics of a BatchNorm-style state dict are skipped
    assert!(
        load(&edited(|m| {
            m.insert(
                "in1.running_mean".into(),
                (Dtype::F32, vec![8], vec![0; 32]),
            );
        }))
        .is_ok()
    );
    for junk in [
        &b""[..],
        b"\x05\0\0\0\0\0\0\0{}",
        b"\xff\xff\xff\xff\xff\xff\xff\xffxx",
        b"\x02\0\0\0\0\0\0\0[]",
    ] {
        assert!(matches!(load(junk), Err(Error::Format { .. })));
    }
    let missing = Net::load_transformer(
        Path::new("/nonexistent/m.safetensors"),
        PaddingMode::Reflect,
    );
    assert!(matches!(missing, Err(Error::Io { .. })));
}

/// One clean line: no newline, no Debug rendering of options, structs or quoted strings.
fn clean(e: &Error) -> String {
    let m = e.to_string();
    assert!(!m.contains('\n'), "{m}");
    for debug in ["Some(", "None", " { ", "\\\"", "Os {", "kind:"] {
        assert!(!m.contains(debug), "Debug text `{debug}` in: {m}");
    }
    m
}

#[test]
fn shape_errors_state_the_shape_the_tensor_should_have() {
    // A flattened conv1 weight: the widths come from the biases, so the expected shape is conv1's own.
    // (A scalar, shape [], once indexed its first dimension.)
    for bad in [vec![1944], vec![8, 243], vec![1944, 1, 1, 1], vec![]] {
        let e = load(&edited(|m| {
            let t = m.get_mut("conv1.conv2d.weight").unwrap();
            t.2.truncate(4 * bad.iter().product::<usize>());
            t.1 = bad.clone();
        }))
        .unwrap_err();
        let msg = clean(&e);
        assert!(
            matches!(&e, Error::BadShape { key, expected, .. } if key == "conv1.conv2d.weight" && expected == &[8, 3, 9, 9]),
            "{bad:?}: {msg}"
        );
        assert!(
            msg.contains("model.safetensors")
                && msg.contains("expected [8, 3, 9, 9]")
                && msg.contains("`conv1.conv2d.weight`"),
            "{msg}"
        );
    }
    // A mis-shaped bias with a good weight: the weight says the width.
    let e = load(&edited(|m| {
        m.get_mut("conv2.conv2d.bias").unwrap().1 = vec![4, 4];
    }))
    .unwrap_err();
    let msg = clean(&e);
    assert!(
        msg.contains("`conv2.conv2d.bias` has shape [4, 4], expected [16]"),
        "{msg}"
    );
    // Nothing states conv3's width: a format error naming the three tensors.
    let e = load(&edited(|m| {
        for k in ["conv3.conv2d.bias", "in3.weight", "conv3.conv2d.weight"] {
            let t = m.get_mut(k).unwrap();
            t.2.truncate(16);
            t.1 = vec![2, 2];
        }
    }))
    .unwrap_err();
    let msg = clean(&e);
    assert!(
        matches!(e, Error::Format { .. }) && msg.contains("width of conv3"),
        "{msg}"
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    let good = edited(|_| {});
    let mut s = 12345u32;
    for i in 0..300 {
        let mut b = good.clone();
        for _ in 0..1 + i % 8 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let at = s as usize % b.len().min(if i % 2 == 0 { 2000 } else { usize::MAX });
            b[at] = (s >> 8) as u8;
        }
        if i % 5 == 0 {
            b.truncate(s as usize % b.len());
        }
        let _ = load(&b);
    }
}

/// Enough RAM for the recompute schedule's working set of the small network below on a 256×256 image,
/// not for its stored activations.
const RAM_FOR_A_TILE: u64 = 600_000;

#[test]
fn tiles_images_and_budgets() {
    let net = Net::random_transformer(Widths(4, 4, 4), 2, PaddingMode::Reflect);
    let x = noise_image(3, 30, 30, 1);
    // tile smaller than the halo: the message names the layer whose halo it is
    let e = grid_for(&net, 30, 30, 2).unwrap_err();
    let msg = clean(&e);
    assert!(
        matches!(&e, Error::TileSmallerThanHalo { layer, halo: 4, min: 4, .. } if layer == "conv1"),
        "{msg}"
    );
    assert_eq!(
        msg,
        "tile size 2 is smaller than the halo of layer conv1 (4 input pixels); use tiles of at least 4"
    );
    // tile borders off the stride
    let e = Grid::from_borders(vec![0, 6, 30], vec![0, 30], 4).unwrap_err();
    assert!(matches!(e, Error::Grid(_)));
    assert!(clean(&e).contains("borders 0, 6, 30 must rise"), "{e}");
    assert!(matches!(grid_for(&net, 30, 30, 10), Err(Error::Grid(_))));
    // zero-sized and too small images
    let empty = Image::rgb8(0_u32, 7_u32, vec![]);
    for mode in [
        Mode::Whole,
        Mode::Exact,
        Mode::Sampled(2),
        Mode::Naive,
        Mode::Recompute,
    ] {
        let opts = Options {
            mode,
            tile: 16,
            ..Options::default()
        };
        let e = stylize(&net, &CpuBackend, &empty, &opts, true).unwrap_err();
        assert!(matches!(e, Error::EmptyImage { .. }), "{mode:?}: {e}");
        let tiny = noise_image(3, 4, 9, 1);
        let e = stylize(&net, &CpuBackend, &tiny, &opts, true).unwrap_err();
        assert!(matches!(e, Error::ImageTooSmall { .. }), "{mode:?}: {e}");
    }
    // wrong channel count
    let gray = Tensor::zeros(1, 16, 16).unwrap();
    for mode in [Mode::Whole, Mode::Exact] {
        let opts = Options {
            mode,
            tile: 16,
            ..Options::default()
        };
        let e = stylize(&net, &CpuBackend, &gray, &opts, false).unwrap_err();
        assert!(matches!(e, Error::Channels { .. }), "{mode:?}: {e}");
    }
    // a RAM budget below one tile's working set, even at the smallest tile: refused, naming the budget
    let tiny = Budget {
        ram: 1000,
        disk: Some(5000),
        spill_dir: std::env::temp_dir(),
    };
    let opts = Options {
        mode: Mode::Exact,
        tile: 16,
        threads: 1,
        budget: tiny,
        ranks: None,
    };
    let e = stylize(&net, &CpuBackend, &x, &opts, false).unwrap_err();
    assert!(
        matches!(e, Error::TileOverBudget { budget: 1000, .. }),
        "{e}"
    );
    // room for a tile's working set but not for the stored activations in RAM and on disk: `stylize`
    // runs the recompute schedule instead (nothing stored), the same output, and says so
    let budget = Budget {
        ram: RAM_FOR_A_TILE,
        disk: Some(5000),
        spill_dir: std::env::temp_dir(),
    };
    let opts = Options {
        mode: Mode::Exact,
        tile: 16,
        threads: 1,
        budget,
        ranks: None,
    };
    let big = noise_image(3, 256, 256, 2);
    let (got, info) = stylize(&net, &CpuBackend, &big, &opts, false).unwrap();
    // the reference under the default budget (a whole-image pass holds its working set in RAM)
    let whole = Options {
        mode: Mode::Whole,
        budget: Budget::default(),
        ..opts.clone()
    };
    let want = stylize(&net, &CpuBackend, &big, &whole, false).unwrap().0;
    assert_eq!(
        max_abs(&got.into_tensor().unwrap(), &want.into_tensor().unwrap()),
        0.0
    );
    assert!(
        info.notes
            .iter()
            .any(|n| n.contains("recomputed tile by tile")),
        "{:?}",
        info.notes
    );
    // a spill directory that does not exist, under a RAM budget that holds a tile's working set but
    // must spill stored values
    let budget = Budget {
        ram: 40_000,
        disk: Some(1 << 30),
        spill_dir: "/nonexistent/spill".into(),
    };
    let opts = Options {
        mode: Mode::Exact,
        tile: 16,
        threads: 1,
        budget,
        ranks: None,
    };
    let e = stylize(&net, &CpuBackend, &x, &opts, true).unwrap_err();
    assert!(matches!(e, Error::Spill { .. }), "{e}");
}

/// A model path that is a FIFO, a device (a symlink to `/dev/zero`) or a folder is refused at once, for
/// ONNX and safetensors alike: never a read until memory runs out, never a wait for a writer. Each load
/// runs on its own thread, so a hang fails the test instead of stalling it.
#[test]
fn model_paths_that_are_not_regular_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo_onnx = dir.path().join("fifo.onnx");
    let fifo_st = dir.path().join("fifo.safetensors");
    for p in [&fifo_onnx, &fifo_st] {
        let ok = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(ok.success(), "mkfifo {}", p.display());
    }
    let zero_onnx = dir.path().join("zero.onnx");
    let zero_st = dir.path().join("zero.safetensors");
    std::os::unix::fs::symlink("/dev/zero", &zero_onnx).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &zero_st).unwrap();
    let folder = dir.path().join("folder.onnx");
    std::fs::create_dir(&folder).unwrap();
    for p in [fifo_onnx, fifo_st, zero_onnx, zero_st, folder] {
        let (tx, rx) = std::sync::mpsc::channel();
        let q = p.clone();
        std::thread::spawn(move || {
            let e = if q.extension().is_some_and(|e| e == "onnx") {
                bsp_tiling::load_onnx(&q).err()
            } else {
                Net::load_transformer(&q, PaddingMode::Reflect).err()
            };
            let _ = tx.send(e.map(|e| e.to_string()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{}: still loading after 20 s", p.display()));
        let e = got.unwrap_or_else(|| panic!("{}: loaded", p.display()));
        assert!(e.contains(&p.display().to_string()), "{e}");
        assert!(e.contains("not a regular file"), "{e}");
    }
}
