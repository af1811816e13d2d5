//! The seam metric: naive tiling shows its borders, BSP does not.

mod common;

use bsp_tiling::metrics::seams;
use bsp_tiling::{CpuBackend, Mode, Options, stylize};
use common::*;

#[test]
fn naive_tiles_show_seams_bsp_does_not() {
    let net = model("mosaic_nc16.safetensors");
    let img = corpus_crop("RainDrops.jpg", 6, 10, 10, 128, 96);
    let run = |mode| {
        let opts = Options {
            mode,
            tile: 32,
            threads: 2,
            ..Options::default()
        };
        stylize(&net, &CpuBackend, &img, &opts, false)
            .unwrap()
            .0
            .into_tensor()
            .unwrap()
    };
    let borders_r = [32, 64];
    let borders_c = [32, 64, 96];
    let s_whole = seams(&run(Mode::Whole), &borders_r, &borders_c);
    let s_bsp = seams(&run(Mode::Exact), &borders_r, &borders_c);
    let s_naive = seams(&run(Mode::Naive), &borders_r, &borders_c);
    assert!(
        (s_bsp.ratio() - s_whole.ratio()).abs() < 1e-3,
        "{s_bsp:?} vs {s_whole:?}"
    );
    assert!(
        s_naive.ratio() > 1.5 * s_whole.ratio(),
        "naive {:.3} vs whole {:.3}",
        s_naive.ratio(),
        s_whole.ratio()
    );
}
