//! Shared helpers for the integration tests: real models and corpus crops, seeded images.
#![allow(dead_code)]

use bsp_tiling::{Image, Net, PaddingMode, Tensor};
use std::path::PathBuf;

/// The shared models and corpus: `$BSP_SHARED_DIR` where the test binary was carried elsewhere, else
/// beside the workspace.
pub fn shared() -> PathBuf {
    std::env::var_os("BSP_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

pub fn model(name: &str) -> Net {
    let p = shared().join("models").join(name);
    Net::load_transformer(&p, PaddingMode::Reflect).unwrap_or_else(|e| panic!("{e}"))
}

/// A `w×h` crop of a corpus image, downscaled by `step` first (nearest) to keep detail in a small crop.
pub fn corpus_crop(file: &str, step: usize, x0: usize, y0: usize, w: usize, h: usize) -> Image {
    let img = image::open(shared().join("corpus").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .to_rgb8();
    let mut pixels = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let p = img.get_pixel(((x0 + x) * step) as u32, ((y0 + y) * step) as u32);
            pixels.extend_from_slice(&p.0);
        }
    }
    Image::rgb8(w as u32, h as u32, pixels)
}

/// Seeded noise over a smooth gradient, 0..255.
pub fn noise_image(c: usize, h: usize, w: usize, seed: u32) -> Tensor {
    let mut s = seed | 1;
    let mut data = Vec::with_capacity(c * h * w);
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let n = (s % 1000) as f32 / 1000.0;
                data.push(((x * 3 + y * 5 + ch * 40) % 200) as f32 * 0.5 + n * 155.0);
            }
        }
    }
    Tensor::from_vec(c, h, w, data).unwrap()
}

pub fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!((a.c, a.h, a.w), (b.c, b.h, b.w));
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
