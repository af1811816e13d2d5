//! Untrusted model files: any bytes must give a `Net` or a typed error, never a panic; a loaded model must
//! run on a small image without panicking either.
#![no_main]

use bsp_tiling::{CpuBackend, Mode, Net, Options, PaddingMode, Tensor, stylize};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(net) = Net::transformer_from_bytes(data, Path::new("fuzz.safetensors"), PaddingMode::Reflect) {
        let img = Tensor::zeros(3, 12, 12).unwrap();
        let opts = Options { mode: Mode::Exact, tile: 4, threads: 1, ..Options::default() };
        let _ = stylize(&net, &CpuBackend, &img, &opts, false);
    }
});
