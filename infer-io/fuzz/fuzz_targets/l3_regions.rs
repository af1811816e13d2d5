//! Arbitrary bytes as an L3 input read by region: opening (the index, and a version-2 file's whole-file
//! CRC) must return a reader or a typed error, never panic or allocate for an absurd size; what opens is
//! read window by window (overlapping windows with padding, as tiles read them), each window a result or
//! a typed error.
//! `cargo +nightly fuzz run l3_regions` from infer-io/ (seed it with `.l3` files, e.g. `l3 demo`'s).
#![no_main]

use bsp_tiling::field::{Field, Input};
use infer_io::L3Regions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The reader takes a path: a file per fuzzing process.
    let path = std::env::temp_dir().join(format!("l3_regions_fuzz.{}.l3", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let Ok(r) = L3Regions::open(&path) else {
        return;
    };
    let (h, w, c) = (r.height(), r.width(), r.channels());
    if h * w * c > 1 << 22 {
        return;
    }
    let mut out = Vec::new();
    for y0 in (0..h).step_by(29) {
        for x0 in (0..w).step_by(29) {
            let ys: Vec<Option<usize>> = (y0..y0 + 32).map(|y| (y < h).then_some(y)).collect();
            let xs: Vec<Option<usize>> = (x0..x0 + 32).map(|x| (x < w).then_some(x)).collect();
            out.resize(c * 1024, 0.0);
            let _ = r.gather(&ys, &xs, &mut out);
        }
    }
});
