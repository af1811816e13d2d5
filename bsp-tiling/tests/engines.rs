//! `stylize` runs the TransformerNet as a graph (`Graph::from_net`) through the graph engine; the stage
//! engine it replaced gave the same bits, mode by mode, on the real models: checked here against the stage
//! engine's own runs on `stylize`'s grid, and the figures a user sees (tiles, spilled layers) beside them.

mod common;

use bsp_tiling::testing::{run_exact, run_naive, run_recompute, run_sampled};
use bsp_tiling::{
    Budget, CpuBackend, Input, Mode, Net, Options, OutputSink, Precision, RunInfo, Sink, Tensor,
    grid_for, stylize, stylize_shape,
};
use common::*;

/// The stage engine's run of `mode`, as `stylize` ran it before: on `grid_for`'s grid.
fn stage<B: bsp_tiling::Backend>(
    net: &Net,
    backend: &B,
    x: &Tensor,
    opts: &Options,
) -> (Tensor, RunInfo) {
    let (c, oh, ow) = stylize_shape(net, x.height(), x.width()).unwrap();
    let sink = OutputSink::f32(c, oh, ow);
    let grid = grid_for(net, x.height(), x.width(), opts.tile).unwrap();
    let (th, b) = (opts.threads, &opts.budget);
    let info = match opts.mode {
        Mode::Whole => {
            let y = net.forward_whole(backend, x, th, None).unwrap().0;
            sink.put_tile(0, 0, &y).unwrap();
            RunInfo {
                tiles: 1,
                ..RunInfo::default()
            }
        }
        Mode::Exact => run_exact(net, backend, x, &grid, th, b, &sink).unwrap(),
        Mode::Sampled(f) => run_sampled(net, backend, x, &grid, f, th, b, &sink).unwrap(),
        Mode::Recompute => run_recompute(net, backend, x, &grid, th, &sink).unwrap(),
        Mode::Naive => {
            run_naive(net, backend, x, &grid, th, &sink).unwrap();
            RunInfo {
                tiles: grid.len(),
                ..RunInfo::default()
            }
        }
    };
    (sink.finish().into_tensor(), info)
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    (a.c, a.h, a.w) == (b.c, b.h, b.w)
        && a.data
            .iter()
            .zip(&b.data)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

const MODES: [Mode; 6] = [
    Mode::Whole,
    Mode::Exact,
    Mode::Sampled(2),
    Mode::Sampled(1),
    Mode::Recompute,
    Mode::Naive,
];

#[test]
fn stylize_gives_the_stage_engines_bits_in_every_mode() {
    for name in ["candy_nc8.safetensors", "mosaic_nc16.safetensors"] {
        let net = model(name);
        for (file, w, h, tiles) in [
            ("Autumn.jpg", 61, 47, [16, 24]),
            ("Wood.jpg", 96, 64, [24, 32]),
        ] {
            let x = bsp_tiling::image_to_tensor(&corpus_crop(file, 6, 10, 10, w, h));
            for tile in tiles {
                for mode in MODES {
                    let opts = Options {
                        mode,
                        tile,
                        threads: 2,
                        ..Options::default()
                    };
                    let (want, wi) = stage(&net, &CpuBackend, &x, &opts);
                    let (got, gi) = stylize(&net, &CpuBackend, &x, &opts, false).unwrap();
                    let tag = format!("{name} {w}x{h} tile {tile} {mode:?}");
                    assert!(
                        same_bits(&got.into_tensor(), &want),
                        "{tag}: outputs differ"
                    );
                    assert_eq!(gi.tiles, wi.tiles, "{tag}: tiles");
                    assert_eq!((gi.spilled_layers, wi.spilled_layers), (0, 0), "{tag}");
                }
            }
        }
    }
}

/// Under a RAM budget too small for every stored value, both engines spill (the graph engine counts its
/// stored node values, the stage engine its stage outputs) and still give the same bits.
#[test]
fn spilled_runs_give_the_same_bits() {
    let net = model("candy_nc8.safetensors");
    let x = bsp_tiling::image_to_tensor(&corpus_crop("Autumn.jpg", 4, 10, 10, 96, 80));
    let spill = tempfile::tempdir().unwrap();
    let opts = Options {
        mode: Mode::Exact,
        tile: 32,
        threads: 2,
        budget: Budget {
            ram: 200_000,
            disk: None,
            spill_dir: spill.path().to_path_buf(),
        },
    };
    let (want, wi) = stage(&net, &CpuBackend, &x, &opts);
    let (got, gi) = stylize(&net, &CpuBackend, &x, &opts, false).unwrap();
    assert!(same_bits(&got.into_tensor(), &want));
    // The graph engine fits each tile's working set into the RAM budget first (a tile too large is
    // halved): under this budget it runs smaller tiles than the stage engine, with the same bits.
    assert!(gi.tiles >= wi.tiles, "{} tiles < {}", gi.tiles, wi.tiles);
    eprintln!(
        "spilled: graph engine {} node values, stage engine {} stage outputs",
        gi.spilled_layers, wi.spilled_layers
    );
    assert!(gi.spilled_layers > 0 && wi.spilled_layers > 0);
}

/// On the simulated device, f32 and f16: the graph engine gives the stage engine's bits in every mode.
#[test]
fn simulated_device_f32_and_f16_give_the_stage_engines_bits() {
    let net = model("mosaic_nc16.safetensors");
    let x = bsp_tiling::image_to_tensor(&corpus_crop("Autumn.jpg", 8, 20, 20, 61, 47));
    for precision in [Precision::F32, Precision::F16] {
        let sim = bsp_tiling::testing::DeviceSim::new(u64::MAX, precision);
        for mode in MODES {
            let opts = Options {
                mode,
                tile: 24,
                threads: 2,
                ..Options::default()
            };
            let (want, _) = stage(&net, &sim, &x, &opts);
            let (got, info) = stylize(&net, &sim, &x, &opts, false).unwrap();
            assert!(
                same_bits(&got.into_tensor(), &want),
                "{precision:?} {mode:?}: outputs differ"
            );
            assert!(info.device_peak_bytes > 0, "{precision:?} {mode:?}");
        }
    }
}
