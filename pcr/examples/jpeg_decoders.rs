//! The JPEG decoders the loader could use, on the corpus, timed in the same run: zune-jpeg (what the
//! `image` crate decodes JPEG with: the loader's decoder before), libjpeg-turbo (`pcr::libjpeg`, which
//! reports corrupt and missing data), and libjpeg-turbo's entropy decoding alone (what a check of the data
//! after another decoder would cost).
//!
//! ```text
//! cargo run --release -p pcr --example jpeg_decoders [CORPUS_DIR]
//! ```
//!
//! Times are the decoding thread's CPU time (`/proc/thread-self/schedstat`), best of five per image, so
//! that other work on a shared machine does not count; MB = 10⁶ decoded bytes.

use pcr::libjpeg::{Color, Reader};
use std::path::PathBuf;
use zune_jpeg::JpegDecoder;
use zune_jpeg::zune_core::bytestream::ZCursor;

fn thread_cpu() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(f64::NAN, |ns| ns as f64 * 1e-9)
}

fn best(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = thread_cpu();
            f();
            thread_cpu() - t
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"),
        PathBuf::from,
    );
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg" || e == "jpeg"))
        .collect();
    paths.sort();
    let (mut bytes, mut zune, mut turbo, mut entropy) = (0f64, 0f64, 0f64, 0f64);
    let mut max_diff = 0u8;
    for path in &paths {
        let jpeg = std::fs::read(path)?;
        let mut a = Vec::new();
        let tz = best(|| {
            let mut d = JpegDecoder::new(ZCursor::new(&jpeg[..]));
            a = d.decode().expect("zune decode");
        });
        let mut b = Vec::new();
        let tt = best(|| {
            let r = Reader::new(&jpeg, Color::GrayOrRgb).expect("libjpeg header");
            let w = r.decode_into(&mut b).expect("libjpeg decode");
            assert!(w.is_empty(), "{}: {w:?}", path.display());
        });
        let te = best(|| {
            let r = Reader::new(&jpeg, Color::GrayOrRgb).expect("libjpeg header");
            let w = r.check_coefficients().expect("libjpeg coefficients");
            assert!(w.is_empty());
        });
        assert_eq!(a.len(), b.len(), "{}", path.display());
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| x.abs_diff(*y))
            .max()
            .unwrap_or(0);
        max_diff = max_diff.max(diff);
        eprintln!(
            "{:<18} {:>7.1} {:>7.1} {:>7.1} MB/s  max |zune - turbo| = {diff}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            a.len() as f64 / tz / 1e6,
            b.len() as f64 / tt / 1e6,
            b.len() as f64 / te / 1e6,
        );
        bytes += a.len() as f64;
        (zune, turbo, entropy) = (zune + tz, turbo + tt, entropy + te);
    }
    println!("| decoder | MB/s, 1 thread | time / zune-jpeg |");
    println!("| --- | ---: | ---: |");
    println!("| zune-jpeg 0.5 | {:.0} | 1.00 |", bytes / zune / 1e6);
    println!(
        "| libjpeg-turbo (mozjpeg-sys) | {:.0} | {:.2} |",
        bytes / turbo / 1e6,
        turbo / zune
    );
    println!(
        "| libjpeg-turbo entropy decoding only | {:.0} | {:.2} |",
        bytes / entropy / 1e6,
        entropy / zune
    );
    println!(
        "{} images; largest pixel difference zune vs turbo: {max_diff}",
        paths.len()
    );
    Ok(())
}
