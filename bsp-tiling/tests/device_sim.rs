//! The graph engine on a simulated device (the CPU arithmetic behind the CUDA backend's memory
//! accounting): every mode gives the CPU's output within the device budget, a device too small is a typed
//! error, and with f16 GEMM operands the error is measured.

mod common;

use bsp_tiling::testing::DeviceSim;
use bsp_tiling::{
    Budget, CpuBackend, Error, Mode, Net, Options, PaddingMode, Precision, Tensor, Widths, stylize,
};
use common::*;

/// f16 GEMM operands (the window and weights rounded to binary16, f32 accumulation) on the simulated
/// device: the error against the f32 output is measured, and tiling adds none to it (tiled exact equals
/// whole in f16, bit for bit).
#[test]
fn f16_operands_error_measured() {
    let net = model("mosaic_nc16.safetensors");
    let img = corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47);
    let x = bsp_tiling::image_to_tensor(&img).unwrap();
    let run = |backend: &DeviceSim, mode: Mode| {
        let opts = Options {
            mode,
            tile: 24,
            threads: 2,
            ..Options::default()
        };
        stylize(&net, backend, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap()
    };
    let want = stylize(
        &net,
        &CpuBackend,
        &x,
        &Options {
            mode: Mode::Whole,
            ..Options::default()
        },
        false,
    )
    .unwrap()
    .0
    .into_tensor()
    .unwrap();
    let sim16 = DeviceSim::new(u64::MAX, Precision::F16);
    let tiled16 = run(&sim16, Mode::Exact);
    let whole16 = run(&sim16, Mode::Whole);
    let e = bsp_tiling::metrics::compare(&tiled16, &want);
    let ew = bsp_tiling::metrics::compare(&whole16, &want);
    eprintln!(
        "f16 GEMM operands (simulated), mosaic_nc16 61x47: tiled vs f32 whole max abs {:.3} mean abs {:.4} PSNR {:.1} dB; whole f16 vs f32 max abs {:.3}",
        e.max_abs, e.mean_abs, e.psnr_db, ew.max_abs,
    );
    // Rounding happened (not f32), and stayed an approximation of it on the 0..255 scale.
    assert!(
        e.max_abs > 1e-3 && e.mean_abs < 1.0 && e.psnr_db > 40.0,
        "{e:?}"
    );
    assert_eq!(max_abs(&tiled16, &whole16), 0.0);
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
            .into_tensor()
            .unwrap();
        let sim = DeviceSim::new(64 << 20, Precision::F32);
        let (got, info) =
            stylize(&net, &sim, &x, &opts, false).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(max_abs(&got.into_tensor().unwrap(), &want), 0.0, "{mode:?}");
        assert!(
            info.device_peak_bytes > 0 && info.device_peak_bytes <= 64 << 20,
            "{mode:?}"
        );
        // A device smaller than the run's peak: the convolutions' im2col bands narrow to fit, the same
        // output; smaller still, a typed error naming what did not fit.
        let mut budget = info.device_peak_bytes - 1;
        let refused = loop {
            let small = DeviceSim::new(budget, Precision::F32);
            match stylize(&net, &small, &x, &opts, false) {
                Ok((out, i)) => {
                    assert_eq!(
                        max_abs(&out.into_tensor().unwrap(), &want),
                        0.0,
                        "{mode:?} {budget}"
                    );
                    assert!(i.device_peak_bytes <= budget, "{mode:?} {budget}");
                }
                Err(Error::DeviceBudget { what, .. }) => break what,
                Err(e) => panic!("{mode:?} {budget}: {e}"),
            }
            assert!(budget < info.device_peak_bytes, "{mode:?}: never refused");
            budget = budget * 3 / 4;
        };
        assert!(refused.contains('`'), "{mode:?}: {refused}");
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
            let m = sim.meter();
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

/// A device budget smaller than a node's working set is a typed error naming the node.
#[test]
fn onnx_graph_refusals_on_the_simulated_device() {
    let (g, x) = onnx_case("unet_gn");
    // Enough for the weights and an 8-pixel tile's working set (about 160 kB), not for the whole image's
    // (about 800 kB with every row's im2col columns at once; even one row's at a time does not fit).
    let sim = DeviceSim::new(180_000, Precision::F32);
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
}

/// Every ONNX test model runs in f16 and in TF32 on the simulated device, transposed convolutions
/// included (their GEMM's input and weights rounded as a convolution's): rounding happened (not f32), the
/// error stays one of a 10-bit mantissa (within 1e-2 of the output's largest magnitude), tiles add none to
/// it, and the metered peak (in f16 the binary16 weight copies and inputs included) stays within the
/// budget; TF32 keeps its operands in f32, so its peak is f32's to the byte.
#[test]
fn onnx_graphs_run_in_f16_and_tf32_on_the_simulated_device() {
    for (name, tile) in [
        ("unet_gn", 8),
        ("esrgan_x4", 8),
        ("resnet_fcn", 16),
        ("ops_mix", 8),
        ("norm_first", 8),
    ] {
        let (g, x) = onnx_case(name);
        let b = Budget::default();
        let (want, _) = bsp_tiling::infer(&g, &x, Mode::Whole, tile, 2, &b).unwrap();
        let sim32 = DeviceSim::new(64 << 20, Precision::F32);
        let (_, info32) = bsp_tiling::infer_on(&sim32, &g, &x, Mode::Exact, tile, 2, &b).unwrap();
        let scale = want.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        for p in [Precision::F16, Precision::Tf32] {
            let sim = DeviceSim::new(64 << 20, p);
            let (tiled, info) = bsp_tiling::infer_on(&sim, &g, &x, Mode::Exact, tile, 2, &b)
                .unwrap_or_else(|e| panic!("{name} {p}: {e}"));
            let (whole, _) = bsp_tiling::infer_on(&sim, &g, &x, Mode::Whole, tile, 2, &b)
                .unwrap_or_else(|e| panic!("{name} {p} whole: {e}"));
            let e = bsp_tiling::metrics::compare(&tiled, &want);
            eprintln!(
                "{name} {p} (simulated): vs f32 max abs {:.3e} ({:.2e} of the largest magnitude), device peak {} bytes (f32: {})",
                e.max_abs,
                e.max_abs / scale,
                info.device_peak_bytes,
                info32.device_peak_bytes
            );
            assert!(
                e.max_abs > 0.0 && e.max_abs <= 1e-2 * scale,
                "{name} {p}: {e:?}"
            );
            assert_eq!(
                max_abs(&tiled, &whole),
                0.0,
                "{name}: tiled vs whole in {p}"
            );
            assert!(info.device_peak_bytes <= 64 << 20, "{name} {p}");
            if p == Precision::Tf32 {
                assert_eq!(info.device_peak_bytes, info32.device_peak_bytes, "{name}");
            }
        }
    }
}

/// TF32 and binary16 share a 10-bit mantissa, so on values within binary16's range they round alike (the
/// test above prints the same errors for both); TF32 keeps f32's exponent. The 4× upscaler (convolutions
/// and LeakyReLUs, no normalisation, so the output scales with the input) on its input times 10⁶: in f16
/// the windows overflow binary16 and the output is not finite, in TF32 it stays within 1e-2 of f32's
/// largest magnitude.
#[test]
fn tf32_keeps_the_range_of_f32() {
    let (g, mut x) = onnx_case("esrgan_x4");
    for v in &mut x.data {
        *v *= 1e6;
    }
    let b = Budget::default();
    let (want, _) = bsp_tiling::infer(&g, &x, Mode::Whole, 8, 2, &b).unwrap();
    let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale.is_finite() && scale > 65504.0, "{scale}");
    let run = |p| {
        let sim = DeviceSim::new(u64::MAX, p);
        bsp_tiling::infer_on(&sim, &g, &x, Mode::Exact, 8, 2, &b)
            .unwrap()
            .0
    };
    let tf32 = run(Precision::Tf32);
    let e = bsp_tiling::metrics::compare(&tf32, &want);
    assert!(
        e.max_abs > 0.0 && e.max_abs <= 1e-2 * scale,
        "TF32: {e:?} of {scale}"
    );
    let f16 = run(Precision::F16);
    assert!(
        f16.data.iter().any(|v| !v.is_finite()),
        "f16 kept the range"
    );
}

/// A device budget shapes a convolution instead of refusing it: the GPU test's run (8/16/32 widths, 640×512,
/// exact tiles of 128) under budgets that leave less than its widest im2col band — 32 and 16 MiB, the GPU's
/// 64 and 48 MiB less cuBLAS's 32 MiB workspace, which the simulation does not hold — builds its columns in
/// several bands of output rows: the output is the unbanded run's bit for bit, the peak within the budget.
#[test]
fn budgets_band_the_im2col_columns() {
    let net = Net::random_transformer(Widths(8, 16, 32), 4, PaddingMode::Reflect);
    let x = noise_image(3, 512, 640, 9);
    let opts = Options {
        mode: Mode::Exact,
        tile: 128,
        threads: 2,
        ..Options::default()
    };
    let run = |budget: u64| {
        let sim = DeviceSim::new(budget, Precision::F32);
        let (out, info) = stylize(&net, &sim, &x, &opts, false)
            .unwrap_or_else(|e| panic!("budget {budget}: {e}"));
        (out.into_tensor().unwrap(), info.device_peak_bytes)
    };
    let (whole_band, peak) = run(u64::MAX);
    eprintln!("unbanded: device peak {peak} bytes (simulated, without cuBLAS's workspace)");
    assert!(
        peak > 32 << 20,
        "the unbanded peak {peak} fits the smaller budgets"
    );
    for budget in [32u64 << 20, 16 << 20] {
        let (out, p) = run(budget);
        eprintln!("budget {budget}: device peak {p} bytes");
        assert!(p <= budget, "budget {budget}: peak {p}");
        assert!(
            out.data
                .iter()
                .zip(&whole_band.data)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "budget {budget}: not bit for bit"
        );
    }
}

/// The bytes a device run copies between host and device are counted (`RunInfo::device_copied_bytes`):
/// at least the input going up and the output coming down, in every mode, and more in tiled modes,
/// where each tile's input window carries its halo. The figure is printed per input pixel: what the
/// bus costs a device run, which the GPU bundle's timings need beside them.
#[test]
fn device_runs_count_the_bytes_they_copy() {
    let net = Net::random_transformer(Widths(8, 16, 32), 11, PaddingMode::Reflect);
    let x = noise_image(3, 80, 96, 4);
    let sim = DeviceSim::new(u64::MAX, Precision::F32);
    let floor = Tensor::bytes(3, 80, 96) * 2; // input up, output (3 channels, same size) down
    let mut copied = Vec::new();
    for (mode, tile) in [(Mode::Whole, 0), (Mode::Exact, 32), (Mode::Recompute, 32)] {
        let opts = Options {
            mode,
            tile,
            threads: 2,
            ..Options::default()
        };
        let info = stylize(&net, &sim, &x, &opts, false).unwrap().1;
        eprintln!(
            "{mode:?} tile {tile}: {} bytes copied, {:.1} per input pixel",
            info.device_copied_bytes,
            info.device_copied_bytes as f64 / (80.0 * 96.0)
        );
        assert!(info.device_copied_bytes >= floor, "{mode:?}: {info:?}");
        copied.push(info.device_copied_bytes);
    }
    // The CPU backend copies nothing.
    let cpu = stylize(&net, &CpuBackend, &x, &Options::default(), false)
        .unwrap()
        .1;
    assert_eq!(cpu.device_copied_bytes, 0);
    assert!(
        copied[1] > copied[0],
        "exact tiles copy more than one whole tile: {copied:?}"
    );
}

/// Stored values stay in device memory between supersteps while the budget holds them beside the tiles'
/// working sets (`GraphOps::keeps_values`): the output is the CPU's bit for bit either way, and what
/// crosses the bus drops to the input's windows going up and the output coming down: a whole-image run
/// copies the input once and the output once.
#[test]
fn kept_values_cross_the_bus_once() {
    let net = Net::random_transformer(Widths(8, 16, 32), 11, PaddingMode::Reflect);
    let (h, w) = (80, 96);
    let x = noise_image(3, h, w, 4);
    let io = Tensor::bytes(3, h, w) * 2;
    for (mode, tile) in [(Mode::Whole, 0), (Mode::Exact, 32)] {
        let opts = Options {
            mode,
            tile,
            threads: 2,
            ..Options::default()
        };
        let want = stylize(&net, &CpuBackend, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap();
        let mut runs = vec![];
        for keeps in [true, false] {
            let mut sim = DeviceSim::new(u64::MAX, Precision::F32);
            sim.keeps = keeps;
            let (got, info) = stylize(&net, &sim, &x, &opts, false).unwrap();
            assert_eq!(
                max_abs(&got.into_tensor().unwrap(), &want),
                0.0,
                "{mode:?} keeps {keeps}"
            );
            assert_eq!(sim.meter().used(), 0, "{mode:?}: leases left behind");
            eprintln!(
                "{mode:?} tile {tile} keeps {keeps}: {} values kept, {} bytes copied ({:.2}× the input \
                 and output), device peak {}",
                info.kept_values,
                info.device_copied_bytes,
                info.device_copied_bytes as f64 / io as f64,
                info.device_peak_bytes
            );
            runs.push(info);
        }
        let (kept, host) = (&runs[0], &runs[1]);
        assert!(kept.kept_values > 0 && host.kept_values == 0, "{mode:?}");
        assert_eq!(kept.values_moved_to_host, 0, "{mode:?}");
        assert!(
            kept.device_copied_bytes * 4 < host.device_copied_bytes,
            "{mode:?}: {} vs {}",
            kept.device_copied_bytes,
            host.device_copied_bytes
        );
        if mode == Mode::Whole {
            // The input goes up once, as the first 9×9 convolution's window (a reflected border of 4),
            // and the output comes down once.
            let input_window = Tensor::bytes(3, h + 8, w + 8);
            assert_eq!(
                kept.device_copied_bytes,
                input_window + Tensor::bytes(3, h, w),
                "{mode:?}"
            );
        }
    }
}

/// A device budget that holds the tiles' working sets but not every stored value beside them: values
/// that do not fit are stored on the host, and kept ones move there when a later superstep needs the
/// room; the output stays the CPU's bit for bit and the peak within every budget.
#[test]
fn kept_values_give_way_to_the_working_sets() {
    let net = Net::random_transformer(Widths(8, 16, 32), 11, PaddingMode::Reflect);
    let x = noise_image(3, 80, 96, 4);
    let opts = Options {
        mode: Mode::Exact,
        tile: 32,
        threads: 2,
        ..Options::default()
    };
    let want = stylize(&net, &CpuBackend, &x, &opts, false)
        .unwrap()
        .0
        .into_tensor()
        .unwrap();
    let run = |keeps: bool, budget: u64| {
        let mut sim = DeviceSim::new(budget, Precision::F32);
        sim.keeps = keeps;
        let r = stylize(&net, &sim, &x, &opts, false);
        assert_eq!(sim.meter().used(), 0, "budget {budget}: leases left behind");
        let (got, info) = match r {
            Ok(r) => r,
            Err(Error::DeviceBudget { .. }) => return None,
            Err(e) => panic!("keeps {keeps}, budget {budget}: {e}"),
        };
        assert_eq!(
            max_abs(&got.into_tensor().unwrap(), &want),
            0.0,
            "keeps {keeps}, budget {budget}"
        );
        assert!(
            info.device_peak_bytes <= budget,
            "budget {budget}: {info:?}"
        );
        Some(info)
    };
    let all = run(true, u64::MAX).unwrap();
    let none = run(false, u64::MAX).unwrap();
    let (mut partly, mut moved) = (false, false);
    // Down from the peak of a run that keeps nothing (its im2col bands take what the budget leaves) to
    // the smallest budget either runs in: keeping never makes a run refuse that would otherwise run.
    let mut budget = none.device_peak_bytes;
    loop {
        let kept = run(true, budget);
        let host = run(false, budget);
        assert_eq!(kept.is_some(), host.is_some(), "budget {budget}");
        let Some(info) = kept else { break };
        eprintln!(
            "budget {budget}: {} of {} values kept, {} moved to the host, {} bytes copied",
            info.kept_values, all.kept_values, info.values_moved_to_host, info.device_copied_bytes
        );
        partly |= info.kept_values > 0 && info.kept_values < all.kept_values;
        moved |= info.values_moved_to_host > 0;
        assert!(info.device_copied_bytes <= none.device_copied_bytes);
        assert!(info.device_copied_bytes >= all.device_copied_bytes);
        budget = budget * 7 / 8;
    }
    assert!(partly, "no budget kept only some values");
    assert!(moved, "no budget moved a kept value to the host");
}
