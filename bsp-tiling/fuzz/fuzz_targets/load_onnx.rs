//! Arbitrary bytes as an ONNX model: importing must return a model or a typed error, never panic; what
//! imports runs (exact tiles and the whole image) on a small image without panicking.
//! `cargo +nightly fuzz run load_onnx` from bsp-tiling/ (seed it with `tests/data/onnx/*.onnx`).
#![no_main]

use bsp_tiling::{Budget, Mode, Tensor, graph_from_onnx, infer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = graph_from_onnx(data, "fuzz.onnx") else {
        return;
    };
    // Keep each run small: skip graphs whose parameters alone are large.
    if g.channels > 64 || g.parameters() > 1 << 20 || g.nodes.len() > 256 {
        return;
    }
    // And whose activations on the 12×10 image would be large (a chain of upsamplings).
    match g.plan(12, 10) {
        Ok(p) if p.shape.iter().all(|&(c, h, w)| c * h * w <= 1 << 22) => {}
        _ => return,
    }
    let x = Tensor::zeros(g.channels, 12, 10).unwrap();
    let budget = Budget { ram: 64 << 20, disk: Some(0), ..Budget::default() };
    for mode in [Mode::Whole, Mode::Exact] {
        let _ = infer(&g, &x, mode, 4, 1, &budget);
    }
});
