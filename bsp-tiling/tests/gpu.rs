//! The CUDA backend against the CPU backend on a real GPU: whole image, BSP tiled vs whole (f32: max abs
//! ≤ 1e-3, the figure printed), f16 GEMM operands (error printed), every mode, and device memory within
//! the budget. They need a CUDA GPU and are `#[ignore = "needs a CUDA GPU"]`, so that a
//! machine without one lists them as ignored, not passed; on a GPU machine run them with
//! `--include-ignored` (gpu-bin/run.sh, built by `cargo xtask gpu-bundle`, does), where a GPU that cannot be used fails them with the reason.
//! The ONNX test models (embedded, so that the GPU bundle's binary needs no source tree) run on the CUDA
//! backend's graph kernels against the CPU graph engine. The error-path tests at the end need no GPU and
//! run everywhere.

mod common;

use bsp_tiling::metrics::compare;
use bsp_tiling::{
    Budget, CpuBackend, CudaBackend, Device, DeviceOptions, Error, Mode, Net, Options, OutputSink,
    PaddingMode, Precision, Tensor, Widths, stylize, stylize_on,
};
use common::*;

/// The CUDA backend on device 0; a test that asked for the GPU fails with the reason when there is none.
fn cuda(budget: Option<u64>, precision: Precision) -> CudaBackend {
    CudaBackend::new(0, budget, precision)
        .unwrap_or_else(|e| panic!("needs a CUDA GPU: CudaBackend::new(0): {e}"))
}

/// `stylize` of `x` on `backend` in `mode` with `tile`, as a tensor, and its report.
fn styled<B: bsp_tiling::GraphOps>(
    net: &Net,
    backend: &B,
    x: &dyn bsp_tiling::Input,
    mode: Mode,
    tile: usize,
) -> bsp_tiling::Result<(Tensor, bsp_tiling::RunInfo)> {
    let opts = Options {
        mode,
        tile,
        threads: 2,
        ..Options::default()
    };
    stylize(net, backend, x, &opts, false).map(|(o, i)| (o.into_tensor().unwrap(), i))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_tiled_equals_whole_f32() {
    let gpu = cuda(None, Precision::F32);
    let mut nets = vec![(
        "random 8/16/32".to_string(),
        Net::random_transformer(Widths(8, 16, 32), 3, PaddingMode::Reflect),
    )];
    for m in ["candy_nc8.safetensors", "mosaic_nc16.safetensors"] {
        if shared().join("models").join(m).exists() {
            nets.push((m.to_string(), model(m)));
        } else {
            eprintln!("skipping {m}: not found (set BSP_SHARED_DIR)");
        }
    }
    let x = noise_image(3, 301, 402, 5);
    for (name, net) in &nets {
        let cpu_whole = styled(net, &CpuBackend, &x, Mode::Whole, 0).unwrap().0;
        let gpu_whole = styled(net, &gpu, &x, Mode::Whole, 0).unwrap().0;
        let wg = compare(&gpu_whole, &cpu_whole);
        for tile in [64, 160] {
            let (tiled, info) = styled(net, &gpu, &x, Mode::Exact, tile).unwrap();
            let t = compare(&tiled, &gpu_whole);
            let c = compare(&tiled, &cpu_whole);
            eprintln!(
                "{name} 402x301, tile {tile} ({} tiles, device peak {} bytes): GPU tiled vs GPU whole max abs {:.3e} (mean {:.3e}); vs CPU whole max abs {:.3e}; GPU whole vs CPU whole max abs {:.3e}",
                info.tiles, info.device_peak_bytes, t.max_abs, t.mean_abs, c.max_abs, wg.max_abs
            );
            // Relative to the output's largest magnitude (a style network's reaches the hundreds): the
            // same device's tiled and whole runs differ only in f32 summation order, the CPU's more.
            let scale = gpu_whole.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            eprintln!(
                "{name}: largest |output| {scale:.3e}; tiled vs whole relative {:.3e}",
                t.max_abs / scale
            );
            assert!(t.max_abs <= 1e-5 * scale, "{name}: tiled vs whole {t:?}");
            assert!(c.max_abs <= 1e-4 * scale, "{name}: tiled vs CPU {c:?}");
        }
    }
}

/// Device budgets from the whole GPU down to a few MiB: every run stays within its budget (metered) and
/// equals the CPU — under 64 and 48 MiB, less than the widest convolution's im2col columns need at once
/// (77 MB with the workspace), by building them in bands of output rows; a budget below the cuBLAS
/// workspace (a fixed 32 MiB) is refused when the backend opens, naming the workspace.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_budgets_hold() {
    let net = Net::random_transformer(Widths(8, 16, 32), 4, PaddingMode::Reflect);
    let x = noise_image(3, 512, 640, 9);
    let cpu_whole = styled(&net, &CpuBackend, &x, Mode::Whole, 0).unwrap().0;
    for budget in [None, Some(96u64 << 20), Some(64 << 20), Some(48 << 20)] {
        let gpu = cuda(budget, Precision::F32);
        let (out, info) = styled(&net, &gpu, &x, Mode::Exact, 128)
            .unwrap_or_else(|e| panic!("budget {budget:?}: {e}"));
        let e = compare(&out, &cpu_whole);
        assert!(e.max_abs <= 1e-3, "budget {budget:?}: {e:?}");
        let b = gpu.memory().budget();
        eprintln!(
            "budget {b}: device peak {}, driver-reported use {} (baseline {})",
            info.device_peak_bytes,
            gpu.driver_used().unwrap(),
            gpu.baseline_used,
        );
        assert!(info.device_peak_bytes > 0 && info.device_peak_bytes <= b);
    }
    // The workspace is fixed: a budget below it is refused by name, before anything runs.
    match CudaBackend::new(0, Some(8 << 20), Precision::F32) {
        Err(Error::DeviceBudget {
            what,
            needed,
            budget,
        }) => {
            eprintln!("budget {budget}: {what} needs {needed} bytes (refused)");
            assert!(what.contains("cuBLAS workspace"), "{what}");
            assert!(needed > budget && budget == 8 << 20, "{needed} {budget}");
        }
        Err(e) => panic!("budget 8 MiB: expected the cuBLAS workspace refused, got: {e}"),
        Ok(_) => panic!("budget 8 MiB: the backend opened below its cuBLAS workspace"),
    }
}

/// Stored values stay in device memory (`GraphOps::keeps_values`): a whole-image run copies the input
/// (as the first 9×9 convolution's window, a reflected border of 4) up and the output down once; exact
/// tiles copy their input windows and the output; both equal the same runs with every value stored on
/// the host (within f32 summation order: the device's statistics are reduced in blocks) and the CPU.
/// Budgets too small to keep every value keep some, within the budget, the same output.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_kept_values_cross_the_bus_once() {
    let net = Net::random_transformer(Widths(8, 16, 32), 11, PaddingMode::Reflect);
    let (h, w) = (301, 402);
    let x = noise_image(3, h, w, 4);
    let cpu = styled(&net, &CpuBackend, &x, Mode::Whole, 0).unwrap().0;
    let scale = cpu.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (mode, tile) in [(Mode::Whole, 0), (Mode::Exact, 128)] {
        let mut runs = vec![];
        for keep in [true, false] {
            let mut gpu = cuda(None, Precision::F32);
            gpu.set_keep_values(keep);
            let held = gpu.memory().used();
            let (out, info) = styled(&net, &gpu, &x, mode, tile).unwrap();
            let e = compare(&out, &cpu);
            eprintln!(
                "{mode:?} tile {tile}, values kept {keep}: {} kept, {} bytes copied, device peak {}, vs CPU max abs {:.3e}",
                info.kept_values, info.device_copied_bytes, info.device_peak_bytes, e.max_abs
            );
            assert!(e.max_abs <= 1e-4 * scale, "{mode:?} keep {keep}: {e:?}");
            assert_eq!(gpu.memory().used(), held, "leases left behind");
            runs.push((out, info));
        }
        let ((kept, ki), (host, hi)) = (&runs[0], &runs[1]);
        assert!(ki.kept_values > 0 && hi.kept_values == 0);
        assert!(ki.device_copied_bytes * 4 < hi.device_copied_bytes);
        let e = compare(kept, host);
        assert!(e.max_abs <= 1e-5 * scale, "{mode:?}: kept vs host {e:?}");
        if mode == Mode::Whole {
            assert_eq!(
                ki.device_copied_bytes,
                Tensor::bytes(3, h + 8, w + 8) + Tensor::bytes(3, h, w)
            );
        }
    }
    for budget in [48u64 << 20, 40 << 20] {
        let gpu = cuda(Some(budget), Precision::F32);
        let (out, info) = styled(&net, &gpu, &x, Mode::Exact, 128)
            .unwrap_or_else(|e| panic!("budget {budget}: {e}"));
        let e = compare(&out, &cpu);
        eprintln!(
            "budget {budget}: {} values kept, {} moved to the host, {} bytes copied, peak {}, vs CPU max abs {:.3e}",
            info.kept_values,
            info.values_moved_to_host,
            info.device_copied_bytes,
            info.device_peak_bytes,
            e.max_abs
        );
        assert!(e.max_abs <= 1e-4 * scale, "budget {budget}: {e:?}");
        assert!(info.device_peak_bytes <= budget);
    }
}

/// One image on 2 and 3 ranks (threads joined by `LocalRanks`), each with a CUDA backend of its own on
/// device 0 that keeps the stored values: a rank's own tiles and the rectangles of the others' that it
/// reads stay in device memory, and the exchange reads and fills them there. Rank 0's output equals one
/// process's on the GPU (within f32 summation order: cuDNN may pick another algorithm under another
/// budget) and the CPU's; each rank keeps values and copies fewer bytes than with every value on the
/// host; no lease is left behind.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_kept_values_on_ranks_match_one_process() {
    let net = Net::random_transformer(Widths(8, 16, 32), 11, PaddingMode::Reflect);
    let x = noise_image(3, 301, 402, 4);
    let cpu = styled(&net, &CpuBackend, &x, Mode::Whole, 0).unwrap().0;
    let scale = cpu.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let alone = styled(&net, &cuda(None, Precision::F32), &x, Mode::Exact, 128)
        .unwrap()
        .0;
    for size in [2usize, 3] {
        let ranked = |keep: bool| -> Vec<(Option<Tensor>, bsp_tiling::RunInfo)> {
            let group = bsp_tiling::LocalRanks::group(size);
            std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .into_iter()
                    .enumerate()
                    .map(|(r, c)| {
                        let (net, x) = (&net, &x);
                        s.spawn(move || {
                            let mut gpu = cuda(None, Precision::F32);
                            gpu.set_keep_values(keep);
                            let held = gpu.memory().used();
                            let opts = Options {
                                mode: Mode::Exact,
                                tile: 128,
                                threads: 2,
                                ranks: Some(bsp_tiling::Ranks::new(c).unwrap()),
                                ..Options::default()
                            };
                            let (out, info) = stylize(net, &gpu, x, &opts, false)
                                .unwrap_or_else(|e| panic!("rank {r} of {size}: {e}"));
                            assert_eq!(gpu.memory().used(), held, "rank {r}: leases left behind");
                            ((r == 0).then(|| out.into_tensor().unwrap()), info)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let (kept, host) = (ranked(true), ranked(false));
        let out = kept[0].0.as_ref().unwrap();
        let (e1, ec) = (compare(out, &alone), compare(out, &cpu));
        eprintln!(
            "{size} ranks: vs one process max abs {:.3e}, vs CPU {:.3e}",
            e1.max_abs, ec.max_abs
        );
        assert!(
            e1.max_abs <= 1e-5 * scale,
            "{size} ranks vs one process: {e1:?}"
        );
        assert!(ec.max_abs <= 1e-4 * scale, "{size} ranks vs CPU: {ec:?}");
        for (r, ((_, k), (_, h))) in kept.iter().zip(&host).enumerate() {
            eprintln!(
                "rank {r} of {size}: {} values kept, {} bytes copied ({} with values on the host), peak {}",
                k.kept_values, k.device_copied_bytes, h.device_copied_bytes, k.device_peak_bytes
            );
            assert!(
                k.kept_values > 0 && h.kept_values == 0,
                "rank {r} of {size}"
            );
            assert!(
                k.device_copied_bytes * 2 < h.device_copied_bytes,
                "rank {r} of {size}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_f16_error_measured() {
    let (g32, g16) = (cuda(None, Precision::F32), cuda(None, Precision::F16));
    let net = if shared().join("models/mosaic_nc16.safetensors").exists() {
        model("mosaic_nc16.safetensors")
    } else {
        Net::random_transformer(Widths(16, 32, 64), 5, PaddingMode::Reflect)
    };
    let x = noise_image(3, 400, 400, 3);
    let whole32 = styled(&net, &g32, &x, Mode::Whole, 0).unwrap().0;
    let whole16 = styled(&net, &g16, &x, Mode::Whole, 0).unwrap().0;
    let tiled16 = styled(&net, &g16, &x, Mode::Exact, 128).unwrap().0;
    let e = compare(&tiled16, &whole32);
    let t = compare(&tiled16, &whole16);
    eprintln!(
        "f16 GEMM operands, 400x400: tiled f16 vs whole f32 max abs {:.3} mean abs {:.4} PSNR {:.1} dB; tiled f16 vs whole f16 max abs {:.3e}",
        e.max_abs, e.mean_abs, e.psnr_db, t.max_abs
    );
    assert!(e.mean_abs < 1.0, "{e:?}");
}

/// TF32 on the GPU (cuDNN's and cuBLAS's tensor-op math) against f32 on the GPU, beside the TF32 error the
/// CPU simulation predicts (operands rounded to nearest TF32) against f32 on the CPU: the same order of
/// size (within 10× either way: the libraries' conversion may truncate where the simulation rounds),
/// and not f32's (TF32 is on).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_tf32_error_as_simulated() {
    let (g32, gtf) = (cuda(None, Precision::F32), cuda(None, Precision::Tf32));
    let sim = bsp_tiling::testing::DeviceSim::new(u64::MAX, Precision::Tf32);
    let net = Net::random_transformer(Widths(8, 16, 32), 5, PaddingMode::Reflect);
    let x = noise_image(3, 200, 240, 6);
    let gpu = compare(
        &styled(&net, &gtf, &x, Mode::Exact, 128).unwrap().0,
        &styled(&net, &g32, &x, Mode::Whole, 0).unwrap().0,
    );
    let predicted = compare(
        &styled(&net, &sim, &x, Mode::Exact, 128).unwrap().0,
        &styled(&net, &CpuBackend, &x, Mode::Whole, 0).unwrap().0,
    );
    eprintln!(
        "TF32, 240x200: GPU vs GPU f32 max abs {:.3e} mean abs {:.3e}; simulated vs CPU f32 max abs {:.3e} mean abs {:.3e}",
        gpu.max_abs, gpu.mean_abs, predicted.max_abs, predicted.mean_abs
    );
    let ratio = gpu.mean_abs / predicted.mean_abs.max(1e-30);
    assert!((0.1..=10.0).contains(&ratio), "{gpu:?} {predicted:?}");
}

/// `stylize` in f16 on the GPU (the graph engine's f16 convolutions: `bsp_im2col_g_f16`, cuBLAS
/// `gemmEx` with binary16 operands) against the same rounding simulated on the CPU: equal up to the
/// GEMM's order of summation.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_f16_stylize_matches_its_simulation() {
    // The simulation computes im2col's arithmetic (f32 sums); cuDNN's f16 rounds them to binary16 too.
    let mut g16 = cuda(None, Precision::F16);
    g16.set_cudnn(false).unwrap();
    let sim16 = bsp_tiling::testing::DeviceSim::new(u64::MAX, Precision::F16);
    let net = Net::random_transformer(Widths(8, 16, 32), 5, PaddingMode::Reflect);
    let x = noise_image(3, 150, 130, 4);
    for mode in [Mode::Exact, Mode::Whole] {
        let opts = Options {
            mode,
            tile: 64,
            threads: 2,
            ..Options::default()
        };
        let want = stylize(&net, &sim16, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap();
        let f32 = stylize(&net, &CpuBackend, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap();
        let got = stylize(&net, &g16, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap();
        let e = compare(&got, &want);
        let r = compare(&want, &f32);
        eprintln!(
            "{mode:?} f16: GPU vs simulation max abs {:.3e}; simulation vs f32 max abs {:.3e}",
            e.max_abs, r.max_abs
        );
        assert!(
            e.max_abs <= 5e-2 && r.max_abs > 1e-3,
            "{mode:?}: {e:?} {r:?}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_mode_matches_cpu() {
    let gpu = cuda(None, Precision::F32);
    let net = Net::random_transformer(Widths(8, 16, 32), 6, PaddingMode::Reflect);
    let x = noise_image(3, 130, 150, 1);
    for mode in [
        Mode::Whole,
        Mode::Exact,
        Mode::Sampled(2),
        Mode::Recompute,
        Mode::Naive,
    ] {
        let opts = Options {
            mode,
            tile: 64,
            threads: 2,
            ..Options::default()
        };
        let want = stylize(&net, &CpuBackend, &x, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap();
        let (got, info) = stylize(&net, &gpu, &x, &opts, false).unwrap();
        let e = compare(&got.into_tensor().unwrap(), &want);
        eprintln!(
            "{mode:?}: GPU vs CPU max abs {:.3e}, device peak {} bytes",
            e.max_abs, info.device_peak_bytes
        );
        assert!(e.max_abs <= 1e-3, "{mode:?}: {e:?}");
    }
}

/// `--device cuda` without a usable GPU fails with the reason; it never runs on the CPU instead.
#[test]
fn device_cuda_without_gpu_says_why() {
    let net = Net::random_transformer(Widths(4, 4, 4), 1, PaddingMode::Reflect);
    let x = noise_image(3, 20, 20, 1);
    let dev = DeviceOptions {
        device: Device::Cuda(0),
        ..DeviceOptions::default()
    };
    match stylize_on(&dev, &net, &x, &Options::default(), false) {
        Ok(_) => eprintln!("skipping: a GPU is present"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    Error::NoDriver | Error::NoDevice { .. } | Error::NoCudaLibrary { .. }
                ),
                "{msg}"
            );
            assert!(
                msg.starts_with("device cuda") && !msg.contains('\n'),
                "{msg}"
            );
        }
    }
    // A device number past the last one is refused by name wherever a driver loads.
    let dev = DeviceOptions {
        device: Device::Cuda(999),
        ..DeviceOptions::default()
    };
    let e = stylize_on(&dev, &net, &x, &Options::default(), false).unwrap_err();
    assert!(
        matches!(e, Error::NoDriver | Error::NoDevice { ordinal: 999, .. }),
        "{e}"
    );
    // The CPU with a GPU-only setting is refused too.
    let dev = DeviceOptions {
        precision: Precision::F16,
        ..DeviceOptions::default()
    };
    assert!(matches!(
        stylize_on(&dev, &net, &x, &Options::default(), false),
        Err(Error::Device(_))
    ));
}

/// The ONNX test models and one input each, embedded (the bundle's binary runs without the tree).
const ONNX_MODELS: [(&str, &[u8], &[u8], usize); 5] = [
    (
        "unet_gn",
        include_bytes!("data/onnx/unet_gn.onnx"),
        include_bytes!("data/onnx/unet_gn.in.44x60.npy"),
        8,
    ),
    (
        "esrgan_x4",
        include_bytes!("data/onnx/esrgan_x4.onnx"),
        include_bytes!("data/onnx/esrgan_x4.in.23x37.npy"),
        8,
    ),
    (
        "resnet_fcn",
        include_bytes!("data/onnx/resnet_fcn.onnx"),
        include_bytes!("data/onnx/resnet_fcn.in.64x48.npy"),
        16,
    ),
    (
        "ops_mix",
        include_bytes!("data/onnx/ops_mix.onnx"),
        include_bytes!("data/onnx/ops_mix.in.40x50.npy"),
        8,
    ),
    (
        "norm_first",
        include_bytes!("data/onnx/norm_first.onnx"),
        include_bytes!("data/onnx/norm_first.in.41x29.npy"),
        8,
    ),
];

fn onnx_model(name: &str, model: &[u8], input: &[u8]) -> (bsp_tiling::Graph, Tensor) {
    let g = bsp_tiling::graph_from_onnx(model, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.npy");
    std::fs::write(&p, input).unwrap();
    (g, infer_io::npy::read(&p).unwrap())
}

/// Convolutions through cuDNN against im2col + cuBLAS on the same GPU, in each precision: the ONNX test
/// models (groups, strides, dilations, transposed convolutions beside them) and a TransformerNet, whole
/// and exact. f32 (FMA math, no TF32): within 1e-5 of the output's largest magnitude. TF32 and f16: within
/// 1e-2 (a 10-bit mantissa's error, rounded in each library's own way; f16 through cuDNN also rounds each
/// convolution's sum to binary16). cuDNN must load here (PyTorch's wheel brings it; `run.sh` puts its
/// folder on `LD_LIBRARY_PATH`) and must have run convolutions in every precision; TF32 must be on
/// (cuDNN's TF32 TransformerNet differs from its f32 one by more than f32's summation order explains).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_cudnn_convolutions_match_im2col() {
    let rel = |a: &Tensor, b: &Tensor| {
        let scale = b.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        compare(a, b).max_abs / scale
    };
    let net = Net::random_transformer(Widths(8, 16, 32), 6, PaddingMode::Reflect);
    let image = noise_image(3, 301, 402, 2);
    let mut f32_whole = None;
    for precision in [Precision::F32, Precision::Tf32, Precision::F16] {
        let tol = if precision == Precision::F32 {
            1e-5
        } else {
            1e-2
        };
        let mut dnn = cuda(None, precision);
        dnn.set_cudnn(true)
            .unwrap_or_else(|e| panic!("needs cuDNN on the GPU machine: {e}"));
        let mut im2col = cuda(None, precision);
        im2col.set_cudnn(false).unwrap();
        eprintln!("{}\n{}", dnn.name(), im2col.name());
        for (name, model, input, tile) in ONNX_MODELS {
            let (g, x) = onnx_model(name, model, input);
            for mode in [Mode::Whole, Mode::Exact] {
                let b = Budget::default();
                let (a, _) = bsp_tiling::infer_on(&dnn, &g, &x, mode, tile, 4, &b)
                    .unwrap_or_else(|e| panic!("{name} {mode:?} {precision} cuDNN: {e}"));
                let (c, _) = bsp_tiling::infer_on(&im2col, &g, &x, mode, tile, 4, &b)
                    .unwrap_or_else(|e| panic!("{name} {mode:?} {precision} im2col: {e}"));
                let e = rel(&a, &c);
                eprintln!(
                    "{name} {mode:?} {precision}: cuDNN vs im2col {e:.3e} of the largest magnitude"
                );
                assert!(e <= tol, "{name} {mode:?} {precision}: {e:.3e}");
            }
        }
        for (mode, tile) in [(Mode::Whole, 0), (Mode::Exact, 128)] {
            let a = styled(&net, &dnn, &image, mode, tile).unwrap().0;
            let c = styled(&net, &im2col, &image, mode, tile).unwrap().0;
            let e = rel(&a, &c);
            eprintln!(
                "TransformerNet {mode:?} {precision}: cuDNN vs im2col {e:.3e} of the largest magnitude"
            );
            assert!(e <= tol, "TransformerNet {mode:?} {precision}: {e:.3e}");
            if mode == Mode::Whole {
                match (precision, &f32_whole) {
                    (Precision::F32, _) => f32_whole = Some((a, c)),
                    (p, Some((a32, c32))) => {
                        let (d, i) = (rel(&a, a32), rel(&c, c32));
                        eprintln!(
                            "TransformerNet whole, {p} vs f32: cuDNN {d:.3e}, im2col {i:.3e} of the largest magnitude"
                        );
                        assert!(d > 2e-5, "{p}: cuDNN's result is f32's ({d:.3e})");
                    }
                    _ => unreachable!("f32 runs first"),
                }
            }
        }
        let ((d, i), (d2, i2)) = (dnn.conv_counts(), im2col.conv_counts());
        eprintln!(
            "{precision} convolutions: cuDNN backend {d} by cuDNN, {i} by im2col; im2col backend {d2}, {i2}"
        );
        assert!(
            d > 0 && d2 == 0 && i2 > 0,
            "{precision}: cuDNN ran no convolution"
        );
    }
}

/// Every ONNX test model with every node on the CUDA backend (whole image, exact tiles, recompute)
/// against the CPU graph engine: within 1e-4 of the output's largest magnitude (the figure printed), and
/// the metered device memory within the budget.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_onnx_graphs_match_cpu() {
    let budget = 2u64 << 30;
    let gpu = cuda(Some(budget), Precision::F32);
    eprintln!("{}", gpu.name());
    for (name, model, input, tile) in ONNX_MODELS {
        let (g, x) = onnx_model(name, model, input);
        for mode in [Mode::Whole, Mode::Exact, Mode::Recompute] {
            let b = Budget::default();
            let (want, _) = bsp_tiling::infer(&g, &x, mode, tile, 4, &b).unwrap();
            let (got, info) = bsp_tiling::infer_on(&gpu, &g, &x, mode, tile, 4, &b)
                .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            assert_eq!((got.c, got.h, got.w), (want.c, want.h, want.w), "{name}");
            let scale = want
                .data
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                .max(1e-30);
            let err = got
                .data
                .iter()
                .zip(&want.data)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            eprintln!(
                "{name} {}x{} {mode:?}: GPU vs CPU {err:.2e} of the largest magnitude, device peak {} bytes",
                x.w, x.h, info.device_peak_bytes
            );
            assert!(err <= 1e-4, "{name} {mode:?}: GPU vs CPU {err}");
            assert!(info.device_peak_bytes <= budget, "{name} {mode:?}");
        }
    }
    // f16: every node of every model runs (transposed convolutions too), against the same rounding
    // simulated on the CPU (equal up to the GEMMs' order of summation) and within an f16 error of f32.
    // im2col's arithmetic, which the simulation computes (cuDNN's f16 is checked against it in
    // `gpu_cudnn_convolutions_match_im2col`).
    let mut half = cuda(None, Precision::F16);
    half.set_cudnn(false).unwrap();
    for (name, model, input, tile) in ONNX_MODELS {
        let (g, x) = onnx_model(name, model, input);
        let sim16 = bsp_tiling::testing::DeviceSim::new(u64::MAX, Precision::F16);
        let b = Budget::default();
        let (want32, _) = bsp_tiling::infer(&g, &x, Mode::Exact, tile, 4, &b).unwrap();
        let (want, _) = bsp_tiling::infer_on(&sim16, &g, &x, Mode::Exact, tile, 4, &b).unwrap();
        let (got, info) = bsp_tiling::infer_on(&half, &g, &x, Mode::Exact, tile, 4, &b)
            .unwrap_or_else(|e| panic!("{name} f16: {e}"));
        let scale = want32.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        let (e, r) = (compare(&got, &want), compare(&got, &want32));
        eprintln!(
            "{name} f16 Exact: GPU vs simulation {:.2e}, GPU vs f32 CPU {:.2e} of the largest magnitude, device peak {} bytes",
            e.max_abs / scale,
            r.max_abs / scale,
            info.device_peak_bytes
        );
        assert!(
            e.max_abs <= 1e-2 * scale,
            "{name} f16: GPU vs simulation {e:?}"
        );
        assert!(r.max_abs <= 2e-2 * scale, "{name} f16: GPU vs f32 {r:?}");
    }
}

/// Every graph kernel at least once, on the smallest inputs, for compute-sanitizer's racecheck (which
/// runs kernels, cuBLAS's among them, about a thousand times slower; gpu-bin/run.sh's `BSP_RACE`): every
/// ONNX test model once on the whole image (their ops together launch every kernel of `kernels.cu`), and
/// a tiny TransformerNet in exact tiles in f32, TF32 and f16 (`bsp_to_f16`, `bsp_im2col_g_f16`,
/// `bsp_add_f16`), with and without cuDNN, each against the CPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_kernel_small() {
    let gpu = cuda(None, Precision::F32);
    for (name, model, input, tile) in ONNX_MODELS {
        let (g, x) = onnx_model(name, model, input);
        let b = Budget::default();
        let (want, _) = bsp_tiling::infer(&g, &x, Mode::Whole, tile, 1, &b).unwrap();
        let (got, _) = bsp_tiling::infer_on(&gpu, &g, &x, Mode::Whole, tile, 1, &b)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let scale = want.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        let e = compare(&got, &want);
        eprintln!("{name}: GPU vs CPU max abs {:.3e}", e.max_abs);
        assert!(e.max_abs <= 1e-4 * scale, "{name}: {e:?}");
    }
    let net = Net::random_transformer(Widths(4, 8, 8), 1, PaddingMode::Reflect);
    let x = noise_image(3, 20, 24, 2);
    let want = styled(&net, &CpuBackend, &x, Mode::Exact, 16).unwrap().0;
    for precision in [Precision::F32, Precision::Tf32, Precision::F16] {
        // im2col's kernels, then cuDNN's path (`bsp_add_f16` under f16) where cuDNN loads (its own
        // test requires it).
        for use_dnn in [false, true] {
            let mut dev = cuda(None, precision);
            if dev.set_cudnn(use_dnn).is_err() {
                continue;
            }
            let got = styled(&net, &dev, &x, Mode::Exact, 16)
                .unwrap_or_else(|e| panic!("{precision}: {e}"))
                .0;
            let e = compare(&got, &want);
            let scale = want.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
            eprintln!(
                "TransformerNet 24x20 {precision} (cuDNN {use_dnn}): GPU vs CPU max abs {:.3e} ({:.2e} of the largest magnitude)",
                e.max_abs,
                e.max_abs / scale
            );
            let tol = if precision == Precision::F32 {
                1e-3
            } else {
                1e-2 * scale
            };
            assert!(e.max_abs <= tol, "{precision}: {e:?}");
        }
    }
}

/// `run_device` with `Device::Cuda` and no usable GPU fails with the probe's reason; it never runs
/// the graph on the CPU instead.
#[test]
fn graph_device_cuda_without_gpu_says_why() {
    let (g, x) = onnx_model("unet_gn", ONNX_MODELS[0].1, ONNX_MODELS[0].2);
    let plan = g.plan(x.h, x.w).unwrap();
    let (c, h, w) = plan.shape[g.output];
    let dev = DeviceOptions {
        device: Device::Cuda(0),
        ..DeviceOptions::default()
    };
    let sink = OutputSink::f32(c, h, w).unwrap();
    let opts = bsp_tiling::Options {
        mode: Mode::Exact,
        tile: 8,
        threads: 1,
        ..bsp_tiling::Options::default()
    };
    let r = bsp_tiling::run_device(&dev, &g, &x, &opts, &sink);
    match r {
        Ok(_) => eprintln!("skipping: a GPU is present"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    Error::NoDriver | Error::NoDevice { .. } | Error::NoCudaLibrary { .. }
                ),
                "{msg}"
            );
            assert!(msg.starts_with("device cuda"), "{msg}");
        }
    }
}
