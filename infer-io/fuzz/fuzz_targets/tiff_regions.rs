//! Arbitrary bytes as a TIFF input read by region: listing the pages and opening a page (0 to 3, from
//! the last byte) at a level (0 to 2, its SubIFDs, from the byte before) must return a result or a typed error, never panic; what opens is read window by
//! window (overlapping windows with padding, as tiles read them).
//! `cargo +nightly fuzz run tiff_regions` from infer-io/ (seed it with TIFFs, e.g. the test outputs).
#![no_main]

use infer_io::tiff::TiffRegions;
use bsp_tiling::{Field, Input};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The reader takes a path (it reopens the file per worker): a file per fuzzing process.
    let path = std::env::temp_dir().join(format!("tiff_regions_fuzz.{}.tif", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = infer_io::tiff::pages(&path);
    let page = data.last().map_or(0, |b| usize::from(b % 4));
    let level = data.len().checked_sub(2).map_or(0, |i| usize::from(data[i] % 3));
    let Ok(r) = TiffRegions::open_level(&path, page, level, 1 << 20) else {
        return;
    };
    let (h, w, c) = (r.height(), r.width(), r.channels());
    if h * w * c > 1 << 22 {
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
