//! The BSP engine on a simulated device (the CPU arithmetic behind the CUDA backend's memory accounting):
//! whatever the budget — every layer resident, some, none — the output equals the whole image's, and the
//! metered device memory stays within what the placement planned, which stays within the budget. With f16
//! GEMM operands the error is measured.

mod common;

use bsp_tiling::testing::DeviceSim;
use bsp_tiling::testing::plan_exact;
use bsp_tiling::testing::run_exact;
use bsp_tiling::{
    Backend, Budget, CpuBackend, Error, Grid, Mode, Net, Options, OutputSink, PaddingMode,
    Precision, Tensor, Widths, stylize,
};
use common::*;

fn exact_on(sim: &DeviceSim, net: &Net, x: &Tensor, g: &Grid) -> (Tensor, bsp_tiling::RunInfo) {
    let plan = net.plan(x.h, x.w).unwrap();
    let (c, h, w) = *plan.out.last().unwrap();
    let sink = OutputSink::f32(c, h, w);
    let info =
        run_exact(net, sim, x, g, 2, &Budget::default(), &sink).unwrap_or_else(|e| panic!("{e}"));
    (sink.finish().into_tensor(), info)
}

/// A simulated device with small im2col bands, so that layers, not the columns, dominate its memory.
fn small_band(budget: u64) -> DeviceSim {
    let mut sim = DeviceSim::new(budget, Precision::F32);
    sim.band_bytes = 8 << 10;
    sim
}

#[test]
fn every_budget_is_exact_and_within_its_plan() {
    let net = Net::random_transformer(Widths(4, 8, 8), 4, PaddingMode::Reflect);
    let x = noise_image(3, 61, 70, 2);
    let want = net.forward_whole(&CpuBackend, &x, 2, None).unwrap().0;
    let g = Grid::with_tile(61, 70, 16, 4, 4).unwrap();
    // The CPU backend's exact run, for a bit-for-bit comparison.
    let sink = OutputSink::f32(want.c, want.h, want.w);
    run_exact(&net, &CpuBackend, &x, &g, 2, &Budget::default(), &sink).unwrap();
    let cpu_tiled = sink.finish().into_tensor();
    // The budgets: unlimited, then between the smallest workable one and the everything-resident peak.
    let probe = small_band(u64::MAX);
    let plan = net.plan(61, 70).unwrap();
    let grids = bsp_tiling::testing::stage_grids(&net, &plan, &g).unwrap();
    let all = plan_exact(&probe, &net, &plan, &grids, 1).unwrap();
    let floor = (0..net.stages.len())
        .map(|i| all.weights + all.working[i])
        .max()
        .unwrap();
    // Budgets from the floor to the peak; each distinct placement runs once.
    let mut seen = std::collections::BTreeSet::new();
    let mut budgets = vec![u64::MAX];
    for k in 0..=40u64 {
        let budget = floor + (all.peak - floor) * k / 40;
        let p = plan_exact(&small_band(budget), &net, &plan, &grids, 1).unwrap();
        if seen.insert(p.resident.clone()) {
            budgets.push(budget);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for budget in budgets {
        let sim = small_band(budget);
        let (got, info) = exact_on(&sim, &net, &x, &g);
        assert_eq!(
            max_abs(&got, &cpu_tiled),
            0.0,
            "budget {budget}: not the CPU backend's numbers"
        );
        assert!(max_abs(&got, &want) < 1e-4, "budget {budget}");
        assert!(
            info.device_peak_bytes <= info.device_planned_bytes
                && info.device_planned_bytes <= budget,
            "budget {budget}: metered {} planned {}",
            info.device_peak_bytes,
            info.device_planned_bytes
        );
        // The plan is an upper bound, not a loose one.
        assert!(
            info.device_peak_bytes as f64 >= 0.8 * info.device_planned_bytes as f64,
            "budget {budget}: metered {} planned {}",
            info.device_peak_bytes,
            info.device_planned_bytes
        );
        assert_eq!(sim.meter().unwrap().used(), 0, "everything given back");
        seen.insert(info.resident_layers);
    }
    assert!(seen.len() >= 3, "resident layer counts seen: {seen:?}");
    assert!(seen.contains(&(net.stages.len() - 1)));
    // Below the floor: refused before anything runs, naming the layer.
    let sim = small_band(floor - 1);
    let sink = OutputSink::f32(want.c, want.h, want.w);
    let e = run_exact(&net, &sim, &x, &g, 2, &Budget::default(), &sink).unwrap_err();
    assert!(matches!(e, Error::DeviceBudget { .. }), "{e}");
    assert!(e.to_string().contains("layer "), "{e}");
}

#[test]
fn memory_the_backend_already_holds_is_planned_around() {
    let net = Net::random_transformer(Widths(4, 8, 8), 4, PaddingMode::Reflect);
    let x = noise_image(3, 61, 70, 2);
    let want = net.forward_whole(&CpuBackend, &x, 2, None).unwrap().0;
    let g = Grid::with_tile(61, 70, 16, 4, 4).unwrap();
    let plan = net.plan(61, 70).unwrap();
    let grids = bsp_tiling::testing::stage_grids(&net, &plan, &g).unwrap();
    let all = plan_exact(&small_band(u64::MAX), &net, &plan, &grids, 1).unwrap();
    // A budget that holds everything, of which a third is taken before the run.
    let sim = small_band(all.peak);
    let held = sim.reserve(all.peak / 3).unwrap();
    let p = plan_exact(&sim, &net, &plan, &grids, 1).unwrap();
    assert!(p.peak <= all.peak && p.resident != all.resident, "{p:?}");
    let (got, info) = exact_on(&sim, &net, &x, &g);
    assert!(max_abs(&got, &want) < 1e-4);
    assert!(info.device_peak_bytes <= all.peak);
    // The whole-image pass counts it too.
    let need = bsp_tiling::testing::whole_peak(&sim, &net, &plan, 61, 70);
    let whole = small_band(need);
    let _held = whole.reserve(1).unwrap();
    let e = net.forward_whole(&whole, &x, 1, None).unwrap_err();
    assert!(matches!(e, Error::DeviceBudget { .. }), "{e}");
    drop(held);
}

#[test]
fn residual_and_output_paths_with_mixed_residency() {
    // A budget that keeps the early layers resident but not the residual blocks (or the reverse) takes
    // the per-tile phase-2 path with residuals read from the other kind of store.
    let net = model("candy_nc8.safetensors");
    let img = bsp_tiling::image_to_tensor(&corpus_crop("Storm.jpg", 6, 10, 10, 64, 48));
    let want = net.forward_whole(&CpuBackend, &img, 2, None).unwrap().0;
    let g = Grid::with_count(48, 64, 2, 3, 4).unwrap();
    let plan = net.plan(48, 64).unwrap();
    let grids = bsp_tiling::testing::stage_grids(&net, &plan, &g).unwrap();
    let all = plan_exact(
        &DeviceSim::new(u64::MAX, Precision::F32),
        &net,
        &plan,
        &grids,
        1,
    )
    .unwrap();
    // Placements where a residual block's output and its residual source live in different stores.
    let mut mixed = 0;
    let mut tried = std::collections::BTreeSet::new();
    for step in 0..=60u64 {
        let budget = all.weights + (all.peak - all.weights) * step / 60;
        let sim = DeviceSim::new(budget, Precision::F32);
        let Ok(p) = plan_exact(&sim, &net, &plan, &grids, 1) else {
            continue;
        };
        let split = net.stages.iter().enumerate().any(|(i, s)| {
            s.residual.is_some_and(|r| p.resident[i] != p.resident[r])
                || (i > 0 && p.resident[i] != p.resident[i - 1])
        });
        if !split || !tried.insert(p.resident.clone()) {
            continue;
        }
        mixed += 1;
        let (got, info) = exact_on(&sim, &net, &img, &g);
        assert_eq!(
            info.resident_layers,
            p.resident.iter().filter(|&&r| r).count()
        );
        assert!(
            max_abs(&got, &want) < 1e-4,
            "budget {budget}: {}",
            max_abs(&got, &want)
        );
        assert!(info.device_peak_bytes <= budget);
    }
    assert!(mixed >= 2, "only {mixed} mixed placements");
}

#[test]
fn f16_operands_error_measured() {
    let net = model("mosaic_nc16.safetensors");
    let img = corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47);
    let x = bsp_tiling::image_to_tensor(&img);
    let want = net.forward_whole(&CpuBackend, &x, 2, None).unwrap().0;
    let g = Grid::with_count(47, 61, 2, 2, 4).unwrap();
    let sim16 = DeviceSim::new(u64::MAX, Precision::F16);
    let (tiled16, _) = exact_on(&sim16, &net, &x, &g);
    let whole16 = net.forward_whole(&sim16, &x, 2, None).unwrap().0;
    let e = bsp_tiling::metrics::compare(&tiled16, &want);
    let ew = bsp_tiling::metrics::compare(&whole16, &want);
    eprintln!(
        "f16 GEMM operands (simulated), mosaic_nc16 61x47: tiled vs f32 whole max abs {:.3} mean abs {:.4} PSNR {:.1} dB; whole f16 vs f32 max abs {:.3}; tiled f16 vs whole f16 max abs {:.2e}",
        e.max_abs,
        e.mean_abs,
        e.psnr_db,
        ew.max_abs,
        bsp_tiling::metrics::compare(&tiled16, &whole16).max_abs
    );
    // Rounding happened (not f32), and stayed an approximation of it on the 0..255 scale.
    assert!(
        e.max_abs > 1e-3 && e.mean_abs < 1.0 && e.psnr_db > 40.0,
        "{e:?}"
    );
    // Tiled and whole agree in f16 as in f32: tiling adds nothing to the rounding error.
    assert!(max_abs(&tiled16, &whole16) < 1e-3);
}

/// The graph engine's f16 convolutions (window and weights rounded to binary16, f32 accumulation) give the
/// stage engine's f16 bits, in every mode: the same rounding at the same place.
#[test]
fn f16_graph_convolutions_equal_the_stage_engine() {
    let net = model("mosaic_nc16.safetensors");
    let img = corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47);
    let x = bsp_tiling::image_to_tensor(&img);
    let g = bsp_tiling::Graph::from_net(&net);
    let sim16 = DeviceSim::new(u64::MAX, Precision::F16);
    let (stage, _) = exact_on(
        &sim16,
        &net,
        &x,
        &Grid::with_count(47, 61, 2, 2, 4).unwrap(),
    );
    let f32_whole = net.forward_whole(&CpuBackend, &x, 2, None).unwrap().0;
    for (mode, tile) in [(Mode::Exact, 16), (Mode::Whole, 0), (Mode::Recompute, 24)] {
        let (got, info) = bsp_tiling::infer_on(&sim16, &g, &x, mode, tile, 2, &Budget::default())
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(max_abs(&got, &stage), 0.0, "{mode:?}");
        assert!(info.device_peak_bytes > 0);
        // Rounding happened: not the f32 output.
        assert!(max_abs(&got, &f32_whole) > 1e-3, "{mode:?}");
    }
}

#[test]
fn every_mode_runs_on_the_device_within_budget() {
    let net = Net::random_transformer(Widths(4, 8, 8), 9, PaddingMode::Reflect);
    let x = noise_image(3, 40, 48, 7);
    for mode in [
        Mode::Whole,
        Mode::Exact,
        Mode::Sampled(2),
        Mode::Recompute,
        Mode::Naive,
    ] {
        let opts = Options {
            mode,
            tile: 16,
            threads: 2,
            ..Options::default()
        };
        let want = stylize(&net, &CpuBackend, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor();
        let sim = DeviceSim::new(64 << 20, Precision::F32);
        let (got, info) =
            stylize(&net, &sim, &x, &opts, false).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(max_abs(&got.into_tensor(), &want), 0.0, "{mode:?}");
        assert!(
            info.device_peak_bytes > 0 && info.device_peak_bytes <= 64 << 20,
            "{mode:?}"
        );
        // A device smaller than the run's peak: a typed error naming what did not fit.
        let small = DeviceSim::new(info.device_peak_bytes - 1, Precision::F32);
        match stylize(&net, &small, &x, &opts, false) {
            Err(Error::DeviceBudget { what, .. }) => {
                assert!(what.contains('`'), "{mode:?}: {what}")
            }
            other => panic!(
                "{mode:?}: expected a device budget error, got {:?}",
                other.map(|r| r.1)
            ),
        }
    }
}

/// An ONNX test model (tests/data/onnx) and its first test input.
fn onnx_case(name: &str) -> (bsp_tiling::Graph, Tensor) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/onnx");
    let g = bsp_tiling::load_onnx(&dir.join(format!("{name}.onnx"))).unwrap();
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.starts_with(&format!("{name}.in.")))
        .collect();
    inputs.sort();
    let x = infer_io::npy::read(&dir.join(&inputs[0])).unwrap();
    (g, x)
}

/// The graph engine on the simulated device: every node's compute goes through `GraphOps` with the
/// device's leases (windows uploaded, outputs downloaded, weights prepared once), and the output equals
/// the CPU's bit for bit in every mode — the orchestration the CUDA backend runs, checked here. The
/// metered peak stays within the budget and every lease is given back.
#[test]
fn onnx_graphs_on_the_simulated_device_equal_the_cpu() {
    for (name, tile) in [
        ("unet_gn", 8),
        ("esrgan_x4", 8),
        ("resnet_fcn", 16),
        ("ops_mix", 8),
    ] {
        let (g, x) = onnx_case(name);
        // ops_mix's SpaceToDepth needs even sides, which naive tiles of 8 do not all have.
        let naive = if name == "ops_mix" {
            None
        } else {
            Some(Mode::Naive)
        };
        for mode in [
            Some(Mode::Whole),
            Some(Mode::Exact),
            Some(Mode::Recompute),
            naive,
        ]
        .into_iter()
        .flatten()
        {
            let budget = 64 << 20;
            let sim = DeviceSim::new(budget, Precision::F32);
            let (want, _) = bsp_tiling::infer(&g, &x, mode, tile, 2, &Budget::default()).unwrap();
            let (got, info) = bsp_tiling::infer_on(&sim, &g, &x, mode, tile, 2, &Budget::default())
                .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            assert_eq!((got.c, got.h, got.w), (want.c, want.h, want.w));
            let same = got
                .data
                .iter()
                .zip(&want.data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{name} {mode:?}: device simulation differs from the cpu"
            );
            let m = Backend::meter(&sim).unwrap();
            assert!(
                info.device_peak_bytes > 0 && info.device_peak_bytes <= budget,
                "{name} {mode:?}: peak {}",
                info.device_peak_bytes
            );
            assert_eq!(m.used(), 0, "{name} {mode:?}: leases left behind");
            eprintln!(
                "{name} {}x{} {mode:?} tile {tile}: device peak {} bytes",
                x.w, x.h, info.device_peak_bytes
            );
        }
    }
}

/// A device budget smaller than a node's working set is a typed error naming the node; f16 transposed
/// convolutions have no kernels and are refused by name before anything runs.
#[test]
fn onnx_graph_refusals_on_the_simulated_device() {
    let (g, x) = onnx_case("unet_gn");
    // Enough for the weights and an 8-pixel tile's working set (about 160 kB), not for the whole image's
    // (about 800 kB).
    let sim = DeviceSim::new(300_000, Precision::F32);
    bsp_tiling::infer_on(&sim, &g, &x, Mode::Exact, 8, 1, &Budget::default()).unwrap();
    let e = bsp_tiling::infer_on(&sim, &g, &x, Mode::Whole, 0, 1, &Budget::default())
        .map(|_| ())
        .unwrap_err();
    match &e {
        Error::DeviceBudget { what, .. } => assert!(what.contains('`'), "{e}"),
        _ => panic!("expected a device budget error, got {e}"),
    }
    let tiny = DeviceSim::new(1 << 10, Precision::F32);
    let e = bsp_tiling::infer_on(&tiny, &g, &x, Mode::Exact, 8, 1, &Budget::default())
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&e, Error::DeviceBudget { what, .. } if what.contains("the weights of `")),
        "{e}"
    );
    let f16 = DeviceSim::new(64 << 20, Precision::F16);
    let e = bsp_tiling::infer_on(&f16, &g, &x, Mode::Exact, 8, 1, &Budget::default())
        .map(|_| ())
        .unwrap_err();
    match &e {
        Error::Node { node, op, reason } => {
            assert_eq!(op, "ConvTranspose", "{e}");
            assert_eq!(
                node,
                &g.nodes
                    .iter()
                    .find(|n| n.op_type == "ConvTranspose")
                    .unwrap()
                    .name
            );
            assert!(
                reason.contains("does not run on the device simulation"),
                "{e}"
            );
        }
        _ => panic!("expected a node refusal, got {e}"),
    }
}
