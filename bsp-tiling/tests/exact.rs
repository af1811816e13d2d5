//! BSP-exact (and the recomputing one-pass mode) equal the whole-image forward pass.

mod common;

use bsp_tiling::testing::run_exact;
use bsp_tiling::testing::{run_recompute, run_sampled};
use bsp_tiling::{Budget, CpuBackend, Grid, Input, Net, OutputSink, PaddingMode, Tensor, Widths};
use common::*;

const TOL: f32 = 1e-4;

fn whole(net: &Net, x: &Tensor) -> Tensor {
    net.forward_whole(&CpuBackend, x, 2, None).unwrap().0
}

fn exact(net: &Net, x: &dyn Input, grid: &Grid, budget: &Budget) -> (Tensor, bsp_tiling::RunInfo) {
    let plan = net.plan(x.height(), x.width()).unwrap();
    let (c, h, w) = *plan.out.last().unwrap();
    let sink = OutputSink::f32(c, h, w);
    let info = run_exact(net, &CpuBackend, x, grid, 2, budget, &sink).unwrap();
    (sink.finish().into_tensor(), info)
}

fn grids(h: usize, w: usize) -> Vec<Grid> {
    vec![
        Grid::with_count(h, w, 1, 1, 4).unwrap(),
        Grid::with_count(h, w, 2, 3, 4).unwrap(),
        Grid::with_count(h, w, 7, 5, 4).unwrap(),
        // Tiles of 12 that do not divide the image (last ones of 9 or 5 pixels; 2 joins its neighbour).
        Grid::with_tile(h, w, 12, 4, 4).unwrap(),
    ]
}

#[test]
fn random_weights_every_grid_and_odd_sizes() {
    let net = Net::random_transformer(Widths(4, 8, 8), 1, PaddingMode::Reflect);
    // 45×38 and 41×33: sides not multiples of the stride 4; the output is 48×40 and 44×36 as in PyTorch.
    for (h, w) in [(45, 38), (41, 33)] {
        let x = noise_image(3, h, w, 9);
        let want = whole(&net, &x);
        assert_eq!((want.h, want.w), (h.div_ceil(4) * 4, w.div_ceil(4) * 4));
        for g in grids(h, w) {
            let (got, info) = exact(&net, &x, &g, &Budget::default());
            let err = max_abs(&got, &want);
            assert!(
                err < TOL,
                "{h}x{w} grid {:?}: max abs {err}",
                (g.n_rows(), g.n_cols())
            );
            assert_eq!(info.tiles, g.len());
        }
    }
}

#[test]
fn every_padding_mode_is_exact() {
    for mode in [
        PaddingMode::Zero,
        PaddingMode::Replicate,
        PaddingMode::Circular,
    ] {
        let net = Net::random_transformer(Widths(4, 6, 8), 3, mode);
        let x = noise_image(3, 43, 30, 5);
        let want = whole(&net, &x);
        let g = Grid::with_count(43, 30, 3, 2, 4).unwrap();
        let (got, _) = exact(&net, &x, &g, &Budget::default());
        assert!(max_abs(&got, &want) < TOL, "{mode:?}");
    }
}

#[test]
fn real_models_on_a_corpus_crop() {
    let img = corpus_crop("Dune.jpg", 8, 40, 30, 70, 53);
    let x = bsp_tiling::image_to_tensor(&img);
    for m in ["mosaic_nc16.safetensors", "candy_nc8.safetensors"] {
        let net = model(m);
        let want = whole(&net, &x);
        // Real outputs span the 0..255 range: check the tolerance is tight relative to it.
        let span = want.data.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        assert!(span > 50.0, "{m}: output span {span}");
        for g in grids(53, 70) {
            let (got, _) = exact(&net, &img, &g, &Budget::default());
            let err = max_abs(&got, &want);
            assert!(err < TOL, "{m} grid {}x{}: {err}", g.n_rows(), g.n_cols());
        }
    }
}

#[test]
fn spilled_to_memory_mapped_files_is_still_exact() {
    let net = model("candy_nc8.safetensors");
    let img = corpus_crop("Storm.jpg", 6, 10, 10, 64, 48);
    let want = whole(&net, &bsp_tiling::image_to_tensor(&img));
    let dir = tempfile::tempdir().unwrap();
    let budget = Budget {
        ram: 0,
        disk: None,
        spill_dir: dir.path().to_path_buf(),
    };
    let g = Grid::with_count(48, 64, 3, 4, 4).unwrap();
    let (got, info) = exact(&net, &img, &g, &budget);
    assert_eq!(
        info.spilled_layers,
        net.stages.len() - 1,
        "every stored layer spills with no RAM budget"
    );
    assert!(max_abs(&got, &want) < TOL);
    // A budget that holds some layers in RAM and spills the rest.
    let budget = Budget {
        ram: 60_000,
        ..budget
    };
    let (got, info) = exact(&net, &img, &g, &budget);
    assert!(
        info.spilled_layers > 0 && info.spilled_layers < net.stages.len() - 1,
        "{}",
        info.spilled_layers
    );
    assert!(max_abs(&got, &want) < TOL);
}

#[test]
fn statistics_merge_to_the_whole_image_ones() {
    let net = model("mosaic_nc16.safetensors");
    let x = bsp_tiling::image_to_tensor(&corpus_crop("Wood.jpg", 10, 0, 0, 60, 44));
    let (_, whole_stats) = net.forward_whole(&CpuBackend, &x, 1, None).unwrap();
    let g = Grid::with_count(44, 60, 3, 3, 4).unwrap();
    let (_, info) = exact(&net, &x, &g, &Budget::default());
    for (a, b) in whole_stats.iter().zip(&info.stats) {
        match (a, b) {
            (Some(a), Some(b)) => {
                for (p, q) in a.iter().zip(b) {
                    assert_eq!(p.count, q.count);
                    assert!((p.mean - q.mean).abs() <= 1e-9 * (1.0 + p.mean.abs()));
                    assert!((p.variance() - q.variance()).abs() <= 1e-9 * (1.0 + p.variance()));
                }
            }
            (None, None) => {}
            _ => panic!("normalising stages differ"),
        }
    }
}

#[test]
fn recompute_and_full_resolution_sampling_are_exact() {
    let net = model("candy_nc8.safetensors");
    let img = corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47);
    let want = whole(&net, &bsp_tiling::image_to_tensor(&img));
    let g = Grid::with_count(47, 61, 3, 4, 4).unwrap();
    let (c, h, w) = (want.c, want.h, want.w);
    let sink = OutputSink::f32(c, h, w);
    run_recompute(&net, &CpuBackend, &img, &g, 2, &sink).unwrap();
    let err = max_abs(&sink.finish().into_tensor(), &want);
    assert!(err < TOL, "recompute: {err}");
    // Sampling factor 1 = the image's own statistics: the one-pass receptive-field halo is exact.
    let sink = OutputSink::f32(c, h, w);
    run_sampled(&net, &CpuBackend, &img, &g, 1, 2, &Budget::default(), &sink).unwrap();
    let err = max_abs(&sink.finish().into_tensor(), &want);
    assert!(err < TOL, "sampled:1: {err}");
}

#[test]
fn sampling_at_half_resolution_is_approximate() {
    let net = model("mosaic_nc16.safetensors");
    let img = corpus_crop("EveningGlow.jpg", 4, 100, 100, 160, 120);
    let want = whole(&net, &bsp_tiling::image_to_tensor(&img));
    let g = Grid::with_tile(120, 160, 64, 4, 4).unwrap();
    let sink = OutputSink::f32(want.c, want.h, want.w);
    run_sampled(&net, &CpuBackend, &img, &g, 2, 2, &Budget::default(), &sink).unwrap();
    let e = bsp_tiling::metrics::compare(&sink.finish().into_tensor(), &want);
    // Not exact: statistics of a half-size image differ (a NumPy reimplementation gave ~18/255 mean error).
    assert!(e.mean_abs > 1.0, "{e:?}");
    assert!(e.psnr_db > 8.0 && e.psnr_db < 40.0, "{e:?}");
}
