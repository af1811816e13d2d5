//! ONNX models (made by `tests/onnx/make_models.py` with the `onnx` helper API, onnxruntime's outputs
//! beside them in `tests/data/onnx/`): whole-image == onnxruntime within 1e-4 of the output's largest
//! magnitude; tiled exact == whole within 1e-5 relative, on odd sizes and several tile sizes; sampled,
//! recompute and naive run; bad models fail naming the node.

mod common;

use bsp_tiling::graph::ops::Op;
use bsp_tiling::{Budget, Error, Graph, Mode, Tensor, infer, load_onnx};
use infer_io::npy;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/onnx")
}

fn load(name: &str) -> Graph {
    load_onnx(&data().join(format!("{name}.onnx"))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// (input, onnxruntime output) pairs of a model.
fn cases(name: &str) -> Vec<(String, Tensor, Tensor)> {
    let mut v = vec![];
    for e in std::fs::read_dir(data()).unwrap() {
        let f = e.unwrap().file_name().into_string().unwrap();
        if let Some(size) = f
            .strip_prefix(&format!("{name}.in."))
            .and_then(|s| s.strip_suffix(".npy"))
        {
            let x = npy::read(&data().join(&f)).unwrap();
            let y = npy::read(&data().join(format!("{name}.ort.{size}.npy"))).unwrap();
            v.push((size.to_string(), x, y));
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!v.is_empty(), "no test inputs for {name}");
    v
}

fn max_abs(t: &Tensor) -> f32 {
    t.data.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// max |a − b| / max |b|.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!((a.c, a.h, a.w), (b.c, b.h, b.w), "shapes differ");
    let d = a
        .data
        .iter()
        .zip(&b.data)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    d / max_abs(b).max(1e-30)
}

fn run(g: &Graph, x: &Tensor, mode: Mode, tile: usize) -> Tensor {
    infer(g, x, mode, tile, 3, &Budget::default())
        .unwrap_or_else(|e| panic!("{} {mode:?} tile {tile}: {e}", g.name))
        .0
}

fn check_model(name: &str, tiles: &[usize]) {
    let g = load(name);
    for (size, x, ort) in cases(name) {
        let whole = run(&g, &x, Mode::Whole, 0);
        let e = rel_err(&whole, &ort);
        eprintln!(
            "{name} {size}: whole vs onnxruntime {e:.2e} (of max {:.3})",
            max_abs(&ort)
        );
        assert!(e <= 1e-4, "{name} {size}: whole vs onnxruntime {e}");
        for &t in tiles {
            let tiled = run(&g, &x, Mode::Exact, t);
            let e = rel_err(&tiled, &whole);
            eprintln!("{name} {size}: exact tile {t} vs whole {e:.2e}");
            assert!(e <= 1e-5, "{name} {size} tile {t}: exact vs whole {e}");
        }
        let t = tiles[0];
        let rec = run(&g, &x, Mode::Recompute, t);
        let e = rel_err(&rec, &whole);
        eprintln!("{name} {size}: recompute tile {t} vs whole {e:.2e}");
        assert!(e <= 1e-5, "{name} {size}: recompute vs whole {e}");
        // Approximate modes: the right shape, finite.
        for mode in [Mode::Naive, Mode::Sampled(2)] {
            match infer(&g, &x, mode, t, 2, &Budget::default()) {
                Ok((y, _)) => {
                    assert_eq!((y.c, y.h, y.w), (whole.c, whole.h, whole.w));
                    assert!(y.data.iter().all(|v| v.is_finite()), "{name} {mode:?}");
                }
                // A tile or a sample too small for the network is a typed error, not a panic.
                Err(e) => eprintln!("{name} {size} {mode:?}: {e}"),
            }
        }
    }
}

#[test]
fn unet_groupnorm_skips() {
    check_model("unet_gn", &[4, 8, 12, 16, 24]);
}

/// A normalisation of the graph input itself: its statistics come from the input's own tiles.
#[test]
fn normalisations_of_the_input_itself() {
    check_model("norm_first", &[4, 8, 16]);
}

/// An exact run whose stored node outputs would exceed the RAM budget plus the spill space runs the
/// recompute schedule instead: the same output bit for bit, and a note saying so and why. With room,
/// nothing is noted.
#[test]
fn exact_over_its_budget_recomputes_the_same_output() {
    let g = load("unet_gn");
    // Images large enough that their stored values outweigh the recompute schedule's working sets
    // (its tiles' receptive fields).
    let images =
        [(96, 128), (100, 76)].map(|(h, w)| (format!("{h}x{w}"), common::noise_image(3, h, w, 5)));
    for (size, x) in images {
        let (stored, info) = infer(&g, &x, Mode::Exact, 8, 2, &Budget::default()).unwrap();
        assert!(info.notes.is_empty(), "{size}: {:?}", info.notes);
        assert!(info.peak_store_bytes > 0, "{size}");
        // The exact run's working sets (what the planner reserves first) and half its stored values.
        let ws = bsp_tiling::working_set(&g, &x, Mode::Exact, 8, 2).unwrap();
        let tight = Budget {
            ram: ws + info.peak_store_bytes / 2,
            disk: Some(0),
            ..Budget::default()
        };
        let (recomputed, info) = infer(&g, &x, Mode::Exact, 8, 2, &tight).unwrap();
        assert_eq!(stored.data, recomputed.data, "{size}: not the same output");
        // (and a second note where the recompute schedule's tiles were shrunk to fit)
        assert!(
            info.notes
                .iter()
                .any(|n| n.contains("recomputed tile by tile") && n.contains("spill")),
            "{size}: {:?}",
            info.notes
        );
        assert_eq!(info.peak_store_bytes, 0, "{size}: nothing stored");
    }
}

/// The test models where small-halo units are inlined, with two tiles each.
const INLINING_CASES: [(&str, [usize; 2]); 4] = [
    ("resnet_fcn", [8, 16]),
    ("esrgan_x4", [4, 8]),
    ("ops_mix", [4, 12]),
    ("unet_gn", [8, 16]),
];

/// The whole image, then exact runs on each of `tiles`.
fn whole_and_tiled(tiles: &[usize]) -> Vec<(Mode, usize)> {
    let mut runs = vec![(Mode::Whole, 0)];
    runs.extend(tiles.iter().map(|&t| (Mode::Exact, t)));
    runs
}

/// Exact runs compute a value whose one reader's windows add a small halo inside that reader's
/// superstep instead of storing it (inlining: the stem convolution under its max pool, a convolution
/// under the next). Whole and tiled, the output is the bits of the recompute schedule, which inlines
/// nothing and stores nothing (each output tile evaluated through its receptive field), and less is
/// stored than without inlining.
#[test]
fn inlined_values_give_the_bits_of_the_recompute_schedule() {
    for (name, tiles) in INLINING_CASES {
        let g = load(name);
        let mut inlined = 0;
        for (size, x, _) in cases(name) {
            for (mode, t) in whole_and_tiled(&tiles) {
                let (exact, info) = infer(&g, &x, mode, t, 2, &Budget::default()).unwrap();
                let (rec, _) =
                    infer(&g, &x, Mode::Recompute, tiles[0], 2, &Budget::default()).unwrap();
                eprintln!(
                    "{name} {size} {mode:?} tile {t}: {} values inlined, {} bytes stored at the peak",
                    info.inlined_values, info.peak_store_bytes
                );
                assert!(
                    exact
                        .data
                        .iter()
                        .zip(&rec.data)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} {size} {mode:?} tile {t}: inlined values give other bits"
                );
                inlined += info.inlined_values;
            }
        }
        assert!(inlined > 0, "{name}: nothing inlined");
    }
}

/// Small-halo units inlined on a (simulated) device: computed inside their reader's superstep on the
/// device, over the reader's window, instead of stored. Every model, whole and tiled, gives the bits of
/// the same device run without inlining (and of the CPU's), some values are inlined, and the device
/// peak is never higher. Under device budgets from the peak of a run without inlining down to the
/// smallest either runs in, inlining never refuses a budget the other takes (where its working sets
/// would not fit, the run stores the units instead) and gives the same bits; the bytes each copies over
/// the bus are printed.
#[test]
fn inlined_units_on_the_device_give_the_same_bits() {
    use bsp_tiling::testing::DeviceSim;
    use bsp_tiling::{OutputSink, Precision, RunInfo};
    let on = |g: &Graph, x: &Tensor, mode: Mode, tile: usize, inlines: bool, budget: u64| {
        let mut sim = DeviceSim::new(budget, Precision::F32);
        sim.inlines = inlines;
        let (c, h, w) = g.plan(x.h, x.w).unwrap().shape[g.output];
        let sink = OutputSink::try_f32(c, h, w).unwrap();
        let opts = bsp_tiling::Options {
            mode,
            tile,
            threads: 2,
            ..bsp_tiling::Options::default()
        };
        let run = bsp_tiling::run(&sim, g, x, &opts, &sink);
        assert_eq!(sim.meter().used(), 0, "{}: leases left behind", g.name);
        match run {
            Ok(info) => Some((sink.finish().into_tensor().unwrap(), info)),
            Err(Error::DeviceBudget { .. }) => None,
            Err(e) => panic!("{}: {e}", g.name),
        }
    };
    let same = |a: &Tensor, b: &Tensor| {
        a.data
            .iter()
            .zip(&b.data)
            .all(|(p, q)| p.to_bits() == q.to_bits())
    };
    for (name, tiles) in INLINING_CASES {
        let g = load(name);
        let (mut inlined, mut copied) = (0, [0u64; 2]);
        for (size, x, _) in cases(name) {
            for (mode, t) in whole_and_tiled(&tiles) {
                let case = format!("{name} {size} {mode:?} tile {t}");
                let (cpu, _) = infer(&g, &x, mode, t, 2, &Budget::default()).unwrap();
                let (with, wi) = on(&g, &x, mode, t, true, u64::MAX).unwrap();
                let (without, wo) = on(&g, &x, mode, t, false, u64::MAX).unwrap();
                assert!(same(&with, &without), "{case}: other bits");
                assert!(same(&with, &cpu), "{case}: not the CPU's bits");
                assert_eq!(wo.inlined_values, 0);
                assert!(
                    wi.device_peak_bytes <= wo.device_peak_bytes,
                    "{case}: a higher peak"
                );
                inlined += wi.inlined_values;
                let line = |i: &RunInfo| {
                    format!(
                        "{} bytes copied, peak {}",
                        i.device_copied_bytes, i.device_peak_bytes
                    )
                };
                eprintln!(
                    "{case}: {} values inlined; {} ({} without)",
                    wi.inlined_values,
                    line(&wi),
                    line(&wo)
                );
                let mut budget = wo.device_peak_bytes;
                loop {
                    budget = budget * 4 / 5;
                    let (a, b) = (
                        on(&g, &x, mode, t, true, budget),
                        on(&g, &x, mode, t, false, budget),
                    );
                    assert!(
                        a.is_some() || b.is_none(),
                        "{case}: inlining refuses budget {budget}"
                    );
                    let (Some((a, ai)), Some((b, bi))) = (a, b) else {
                        break;
                    };
                    assert!(
                        same(&a, &cpu) && same(&b, &cpu),
                        "{case}, budget {budget}: other bits"
                    );
                    eprintln!("  budget {budget}: {} ({} without)", line(&ai), line(&bi));
                    copied[0] += ai.device_copied_bytes;
                    copied[1] += bi.device_copied_bytes;
                }
            }
        }
        eprintln!(
            "{name}: {} bytes copied under the budgets, {} without inlining",
            copied[0], copied[1]
        );
        assert!(inlined > 0, "{name}: nothing inlined on the device");
    }
}

/// Every stored value spilled (no RAM budget past the tiles' working sets) gives the bits of every
/// value in RAM: windows read their
/// rows from the spill files, and of a narrow strip beside a tile (a halo) only its columns.
#[test]
fn spilled_values_give_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    for (name, tile) in [
        ("unet_gn", 16),
        ("ops_mix", 12),
        ("esrgan_x4", 8),
        ("resnet_fcn", 16),
    ] {
        let g = load(name);
        let (size, x, _) = cases(name).remove(0);
        let (in_ram, info) = infer(&g, &x, Mode::Exact, tile, 2, &Budget::default()).unwrap();
        assert_eq!(info.spilled_layers, 0, "{name}");
        let spill = Budget {
            ram: bsp_tiling::working_set(&g, &x, Mode::Exact, tile, 2).unwrap(),
            disk: None,
            spill_dir: dir.path().to_path_buf(),
        };
        let (spilled, info) = infer(&g, &x, Mode::Exact, tile, 2, &spill).unwrap();
        assert!(info.spilled_layers > 0, "{name}: nothing spilled");
        assert!(
            in_ram
                .data
                .iter()
                .zip(&spilled.data)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name} {size}: spilled values give other bits"
        );
    }
}

#[test]
fn esrgan_pixel_shuffle() {
    check_model("esrgan_x4", &[1, 5, 8, 16]);
}

#[test]
fn resnet_fcn_batchnorm_strided() {
    check_model("resnet_fcn", &[8, 16, 24, 32]);
}

#[test]
fn ops_mix() {
    check_model("ops_mix", &[4, 8, 12, 20]);
}

#[test]
fn batchnorm_folds_into_conv() {
    let g = load("resnet_fcn");
    // 8 BatchNormalizations: 7 after a conv (folded), one after PRelu (a per-channel affine map).
    let affine = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Affine { .. }))
        .count();
    assert_eq!(affine, 1);
    assert!(
        g.nodes
            .iter()
            .all(|n| n.op_type != "BatchNormalization" || matches!(n.op, Op::Affine { .. }))
    );
}

#[test]
fn halos_from_the_graph() {
    let g = load("unet_gn");
    let h = g.halos().unwrap();
    // conv 3×3 pad 1: one pixel each side; the dilated 3×3: two.
    let convs: Vec<_> = h.iter().filter(|n| n.op_type == "Conv").collect();
    assert_eq!(convs[0].rows, (1, 1));
    assert!(convs.iter().any(|n| n.rows == (2, 2)));
    // The strided conv (3×3, stride 2, pad 1) reads one row before its own and none after.
    let strided = convs.iter().find(|n| n.scale == (1, 2)).unwrap();
    assert_eq!(strided.rows, (1, 0));
    assert_eq!(h.iter().filter(|n| n.global_stats).count(), 6);
    // Pointwise ops need no halo.
    assert!(
        h.iter()
            .filter(|n| n.op_type == "Sigmoid" || n.op_type == "Concat")
            .all(|n| n.rows == (0, 0) && n.cols == (0, 0))
    );
}

fn err_of(name: &str) -> Error {
    match load_onnx(&data().join(format!("{name}.onnx"))) {
        Ok(_) => panic!("{name} loaded"),
        Err(e) => e,
    }
}

#[test]
fn bad_models_name_the_node() {
    let e = err_of("bad_gap");
    assert!(
        matches!(&e, Error::Node { op, .. } if op == "GlobalAveragePool"),
        "{e}"
    );
    assert!(e.to_string().contains("whole image"), "{e}");
    let e = err_of("bad_dynamic_c");
    assert!(
        matches!(&e, Error::Node { node, .. } if node == "image"),
        "{e}"
    );
    assert!(e.to_string().contains("dynamic channel"), "{e}");
    let e = err_of("bad_channels");
    assert!(matches!(&e, Error::Node { op, .. } if op == "Conv"), "{e}");
    assert!(e.to_string().contains("expects 4 input channels"), "{e}");
    let e = err_of("bad_sizes");
    assert!(
        matches!(&e, Error::Node { op, .. } if op == "Resize"),
        "{e}"
    );
    let e = err_of("bad_op");
    assert!(
        matches!(&e, Error::Node { op, node, .. } if op == "Cos" && node.starts_with("cos")),
        "{e}"
    );
}

#[test]
fn truncated_and_mutated_files_are_errors() {
    let bytes = std::fs::read(data().join("unet_gn.onnx")).unwrap();
    for cut in [0, 1, 7, 100, bytes.len() / 2, bytes.len() - 1] {
        match bsp_tiling::graph_from_onnx(&bytes[..cut], "cut.onnx") {
            Ok(_) if cut == 0 => {}
            Ok(_) => panic!("a model cut at {cut} bytes loaded"),
            Err(e) => assert!(
                e.to_string().starts_with("cut.onnx") || matches!(e, Error::Node { .. }),
                "{e}"
            ),
        }
    }
    // Flipped bytes: an error or a model, never a panic.
    let mut s = 12345u64;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let i = (s as usize) % b.len();
            b[i] ^= (s >> 32) as u8;
        }
        if let Ok(g) = bsp_tiling::graph_from_onnx(&b, "mutated.onnx") {
            let x = Tensor::zeros(g.channels, 20, 20).unwrap();
            let _ = infer(&g, &x, Mode::Exact, 8, 1, &Budget::default());
        }
    }
}

#[test]
fn wrong_input_channels_at_run_time() {
    let g = load("unet_gn");
    let x = Tensor::zeros(4, 16, 16).unwrap();
    let e = infer(&g, &x, Mode::Exact, 8, 1, &Budget::default()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Channels {
                expected: 3,
                found: 4
            }
        ),
        "{e}"
    );
}

#[test]
fn tiles_must_align_with_the_strides() {
    let g = load("unet_gn");
    let x = Tensor::zeros(3, 44, 60).unwrap();
    let e = infer(&g, &x, Mode::Exact, 6, 1, &Budget::default()).unwrap_err();
    assert!(e.to_string().contains("multiple of 4"), "{e}");
}

/// `g` with an Identity after every Pad: each Pad is then computed and stored (its Identity runs in place
/// on it), never read through by the Conv after it.
fn pads_stored(g: &Graph) -> Graph {
    let mut out = Graph {
        nodes: vec![],
        ..g.clone()
    };
    // Old value id → new value id.
    let mut id = vec![0usize];
    for n in &g.nodes {
        let mut m = n.clone();
        m.inputs = n.inputs.iter().map(|&u| id[u]).collect();
        out.nodes.push(m);
        let mut v = out.nodes.len();
        if matches!(n.op, Op::Pad(_)) {
            out.nodes.push(bsp_tiling::graph::Node {
                name: format!("{}_stored", n.name),
                op_type: "Identity".into(),
                op: Op::Identity,
                inputs: vec![v],
                channels: n.channels,
            });
            v += 1;
        }
        id.push(v);
    }
    out.output = id[g.output];
    out
}

/// Pad fusion: a Pad that one Conv alone reads is read through (the Conv gathers its window from the
/// Pad's input), never stored. The outputs equal those of the same graph with every Pad computed and
/// stored, bit for bit, whole, tiled and recomputed: reflect padding at the image border (the
/// TransformerNet), and ops_mix's reflect, constant (a value other than zero: not read through) and
/// edge pads.
#[test]
fn pads_read_through_equal_pads_stored() {
    let net = common::model("candy_nc8.safetensors");
    let transformer = Graph::from_net(&net);
    let mix = load("ops_mix");
    for (g, x, tiles) in [
        (&transformer, common::noise_image(3, 37, 53, 5), [8, 20]),
        (&mix, cases("ops_mix").remove(0).1, [4, 12]),
    ] {
        let stored = pads_stored(g);
        assert!(stored.nodes.len() > g.nodes.len(), "{}: no Pad", g.name);
        let mut runs = vec![(Mode::Whole, 0)];
        runs.extend(tiles.iter().map(|&t| (Mode::Exact, t)));
        runs.push((Mode::Recompute, tiles[0]));
        for (mode, t) in runs {
            let a = run(g, &x, mode, t);
            let b = run(&stored, &x, mode, t);
            assert!(
                a.data
                    .iter()
                    .zip(&b.data)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{} {mode:?} tile {t}: pads read through differ from pads stored",
                g.name
            );
        }
    }
}

/// The TransformerNet from safetensors run as a graph: exact tiles of every size equal its whole pass
/// (the retired stage engine's bits are pinned in tests/engines.rs).
#[test]
fn transformer_net_as_a_graph() {
    let net = common::model("candy_nc8.safetensors");
    let g = Graph::from_net(&net);
    let x = common::noise_image(3, 37, 53, 9);
    let whole = run(&g, &x, Mode::Whole, 0);
    for t in [8, 16, 20] {
        let tiled = run(&g, &x, Mode::Exact, t);
        assert!(rel_err(&tiled, &whole) <= 1e-5);
    }
}

/// Python with `onnx` and `onnxruntime`: `$BSP_PYTHON`, the test environment of `cargo xtask test`, or
/// `python3`; `None` (the test skips, saying so) where none has them.
fn python_with_onnx() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("BSP_PYTHON").map(PathBuf::from),
        Some(root.join("target/python/venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import onnx, onnxruntime"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The two trained TransformerNets exported to ONNX with the onnx helper API (from their safetensors):
/// the imported graph equals onnxruntime and the safetensors path.
#[test]
fn transformer_nets_exported_to_onnx() {
    let Some(py) = python_with_onnx() else {
        stdx::testing::skip("no Python with onnx and onnxruntime (set BSP_PYTHON)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let models = common::shared().join("models");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/make_models.py");
    let mut cmd = std::process::Command::new(&py);
    cmd.arg(&script).arg(dir.path());
    for m in ["candy_nc8", "mosaic_nc16"] {
        cmd.arg("--transformer")
            .arg(models.join(format!("{m}.safetensors")))
            .arg(m);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for m in ["candy_nc8", "mosaic_nc16"] {
        let g = load_onnx(&dir.path().join(format!("{m}.onnx"))).unwrap();
        let net = common::model(&format!("{m}.safetensors"));
        for size in ["37x53", "64x48"] {
            let x = npy::read(&dir.path().join(format!("{m}.in.{size}.npy"))).unwrap();
            let ort = npy::read(&dir.path().join(format!("{m}.ort.{size}.npy"))).unwrap();
            let whole = run(&g, &x, Mode::Whole, 0);
            let e = rel_err(&whole, &ort);
            eprintln!("{m} {size}: ONNX whole vs onnxruntime {e:.2e}");
            assert!(e <= 1e-4, "{m}: {e}");
            let whole_opts = bsp_tiling::Options {
                mode: Mode::Whole,
                ..bsp_tiling::Options::default()
            };
            let st = bsp_tiling::stylize(&net, &bsp_tiling::CpuBackend, &x, &whole_opts, false)
                .unwrap()
                .0
                .into_tensor()
                .unwrap();
            let e = rel_err(&whole, &st);
            eprintln!("{m} {size}: ONNX whole vs safetensors path {e:.2e}");
            assert!(e <= 1e-5, "{m}: {e}");
            let tiled = run(&g, &x, Mode::Exact, 16);
            assert!(rel_err(&tiled, &whole) <= 1e-5);
        }
    }
}

/// The invalid models of `make_models.py` (`invalid_*.onnx`): what the ONNX checker and onnxruntime
/// refuse, refused on import with the node, attribute or opset named.
const INVALID: [(&str, &str); 5] = [
    ("invalid_dup_output", "is already defined"),
    ("invalid_group0", "attribute group 0"),
    ("invalid_group_neg", "attribute group -1"),
    ("invalid_opset9999", "opset 9999"),
    ("invalid_no_opset", "imports no opset"),
];

#[test]
fn invalid_models_are_refused_naming_what_is_invalid() {
    for (name, says) in INVALID {
        let e = err_of(name);
        assert!(e.to_string().contains(says), "{name}: {e}");
        match name {
            "invalid_dup_output" => assert!(
                matches!(&e, Error::Node { node, op, .. } if node == "redefines" && op == "Relu"),
                "{e}"
            ),
            "invalid_group0" | "invalid_group_neg" => {
                assert!(matches!(&e, Error::Node { op, .. } if op == "Conv"), "{e}")
            }
            _ => assert!(matches!(&e, Error::OnnxFormat { .. }), "{e}"),
        }
    }
    // Valid ONNX past the importer's caps: too large, not "expected positive values".
    for (name, says) in [
        (
            "bad_scale_cap",
            "scale 1024 is past this importer's cap of 64",
        ),
        (
            "bad_stride_cap",
            "strides 100000 is larger than this importer's cap",
        ),
    ] {
        let e = err_of(name);
        assert!(e.to_string().contains(says), "{name}: {e}");
    }
}

/// onnxruntime refuses every model the importer refuses as invalid (loading it or running it).
#[test]
fn onnxruntime_refuses_the_invalid_models_too() {
    let Some(py) = python_with_onnx() else {
        stdx::testing::skip("no Python with onnx and onnxruntime (set BSP_PYTHON)");
        return;
    };
    let script = r#"
import sys, numpy as np, onnxruntime as ort
for path in sys.argv[1:]:
    try:
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        s.run(None, {s.get_inputs()[0].name: np.ones((1, 3, 8, 8), np.float32)})
        print("ran", path)
    except Exception as e:
        print("refused", path)
"#;
    let out = std::process::Command::new(&py)
        .arg("-c")
        .arg(script)
        .args(INVALID.map(|(name, _)| data().join(format!("{name}.onnx"))))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("refused ")).count(),
        INVALID.len(),
        "{text}"
    );
}

/// A model whose output is 16× its input's side, under a RAM budget its default tile's working set
/// exceeds: the tile is shrunk until it fits (a note says so) and the output is the same bits; a model
/// that grows 4096× is refused at its smallest tile with the figure, in every tiled mode.
#[test]
fn working_sets_are_fitted_to_the_budget_or_refused() {
    let g = load("grow_x16");
    let x = common::noise_image(3, 32, 32, 7);
    let (free, info) = infer(&g, &x, Mode::Exact, 512, 2, &Budget::default()).unwrap();
    assert!(info.notes.is_empty(), "{:?}", info.notes);
    let small = Budget {
        ram: 4 << 20,
        ..Budget::default()
    };
    for mode in [Mode::Exact, Mode::Recompute] {
        let (y, info) = infer(&g, &x, mode, 512, 2, &small).unwrap();
        assert_eq!(y.data, free.data, "{mode:?}");
        assert!(info.tiles > 1, "{mode:?}: {} tiles", info.tiles);
        assert!(
            info.notes
                .iter()
                .any(|n| n.contains("tiles of 512 input pixels")
                    && n.contains("more than the RAM budget (4.0 MiB)")),
            "{mode:?}: {:?}",
            info.notes
        );
    }
    let g = load("grow_x4096");
    let x = common::noise_image(3, 2, 2, 7);
    for mode in [Mode::Exact, Mode::Recompute, Mode::Sampled(2)] {
        let e = infer(&g, &x, mode, 512, 1, &small).unwrap_err();
        assert!(
            matches!(&e, Error::TileOverBudget { needed, budget, tile: 1, .. }
                if *needed > 192 << 20 && *budget == 4 << 20),
            "{mode:?}: {e}"
        );
        assert!(e.to_string().contains("RAM budget (4.0 MiB)"), "{e}");
    }
}
