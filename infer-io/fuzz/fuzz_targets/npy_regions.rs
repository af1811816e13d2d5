//! Arbitrary bytes as a `.npy` input read by region: opening must return a reader or a typed error (a
//! bad magic, header, dtype or shape, or a length that does not match the shape), never panic or
//! allocate for an absurd shape; what opens is read window by window (overlapping windows with padding,
//! as tiles read them), and as a whole.
//! `cargo +nightly fuzz run npy_regions` from infer-io/ (seed it with `.npy` files, e.g. bsp-tiling/tests/data/onnx).
#![no_main]

use bsp_tiling::Field;
use infer_io::npy::NpyRegions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The reader takes a path: a file per fuzzing process.
    let path = std::env::temp_dir().join(format!("npy_regions_fuzz.{}.npy", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = infer_io::npy::read(&path);
    let Ok(r) = NpyRegions::open(&path) else {
        return;
    };
    let (c, h, w) = r.shape();
    if c * h * w > 1 << 22 {
        return;
    }
    let mut out = Vec::new();
    for y0 in (0..h).step_by(13) {
        for x0 in (0..w).step_by(13) {
            let ys: Vec<Option<usize>> = (y0..y0 + 16).map(|y| (y < h).then_some(y)).collect();
            let xs: Vec<Option<usize>> = (x0..x0 + 16).map(|x| (x < w).then_some(x)).collect();
            out.resize(c * 256, 0.0);
            let _ = r.gather(&ys, &xs, &mut out);
        }
    }
});
