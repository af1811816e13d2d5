//! Measures what choosing the default format rests on: for version 1 and both version-2 profiles (each
//! with and without entry CRCs, SPEC.md §2.11), the
//! corpus ratio (compressed / raw, geometric mean), the single-threaded whole-image decode speed (parse
//! included, so version 2's CRC-32C check is counted) and the single-threaded speed of 224×224 region reads
//! from an [`L3Index`] and the crop's [`Fragments`] (the loader's path for a random crop); and, one seeded
//! bit flipped in the bytes each crop read, how many of those region reads return an error and how many
//! return other pixels without one. Then, for the version-2 files with entry CRCs, every single bit of
//! the first EVERY_BIT_BYTES bytes (default 2048) the first crop of the first image reads, flipped one at
//! a time (every bit of a whole crop is tens of minutes on a busy machine; `tests/integrity.rs` flips
//! every bit of a smaller crop).
//!
//! ```text
//! cargo run --release -p l3-format --example profiles [CORPUS_DIR] [CROPS_PER_IMAGE] [EVERY_BIT_BYTES]
//! ```
//!
//! Times are the decoding thread's CPU time (`/proc/thread-self/schedstat`), best of three runs per image,
//! so that other work on a shared machine does not count; MB = 10⁶ raw (decoded) bytes.

use l3_format::{EncodeOptions, Format, Fragments, L3File, L3Index, PixelLayout, Profile, Rect};
use std::convert::Infallible;
use std::path::{Path, PathBuf};

/// Each format, and whether its files carry entry CRCs.
const FORMATS: [(Format, bool); 5] = [
    (Format::V1, false),
    (Format::V2(Profile::Bp), false),
    (Format::V2(Profile::Bp), true),
    (Format::V2(Profile::Ans), false),
    (Format::V2(Profile::Ans), true),
];

fn label((format, crcs): (Format, bool)) -> String {
    match (format, crcs) {
        (Format::V1, _) => "v1".into(),
        (f, true) => format!("{f}, entry CRCs"),
        (f, false) => format!("{f}, none"),
    }
}
const CROP: u32 = 224;

/// This thread's CPU time in seconds, from the scheduler's own accounting (nanoseconds).
fn thread_cpu() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(f64::NAN, |ns| ns as f64 * 1e-9)
}

/// The best of three CPU times of `f`.
fn best(mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let t = thread_cpu();
            f();
            thread_cpu() - t
        })
        .fold(f64::INFINITY, f64::min)
}

fn load(path: &Path) -> Option<(Vec<u8>, u32, u32, u8)> {
    use image::DynamicImage as D;
    let img = image::open(path).ok()?;
    let (w, h) = (img.width(), img.height());
    Some(match img {
        D::ImageLuma8(b) => (b.into_raw(), w, h, 1),
        D::ImageRgba8(b) => (b.into_raw(), w, h, 4),
        other => (other.to_rgb8().into_raw(), w, h, 3),
    })
}

#[derive(Default, Clone, Copy)]
struct Totals {
    log_ratio: f64,
    images: usize,
    raw: f64,
    full_s: f64,
    crop_raw: f64,
    crop_s: f64,
    crop_read: f64,
    crops: usize,
    flips: usize,
    caught: usize,
    wrong: usize,
    bytes: f64,
    every_bit: usize,
    every_bit_caught: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"),
        PathBuf::from,
    );
    let crops: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let every_bit_bytes: usize = args.next().map_or(Ok(2048), |s| s.parse())?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
        })
        .collect();
    paths.sort();
    let mut totals = [Totals::default(); FORMATS.len()];
    let mut rng = stdx::SplitMix64::new(24);
    for (n_image, path) in paths.iter().enumerate() {
        let Some((px, w, h, c)) = load(path) else {
            eprintln!("skipped {} (not decodable)", path.display());
            continue;
        };
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let windows: Vec<Rect> = (0..crops)
            .map(|_| {
                let (cw, ch) = (CROP.min(w), CROP.min(h));
                let x = rng.below((w - cw + 1) as u64) as u32;
                let y = rng.below((h - ch + 1) as u64) as u32;
                Rect::new(x, y, cw, ch)
            })
            .collect();
        let mut line = format!("{name:<20} {w}x{h}x{c}");
        for (k, (format, entry_crcs)) in FORMATS.into_iter().enumerate() {
            let opts = EncodeOptions {
                format,
                threads: 0,
                entry_crcs,
                ..EncodeOptions::default()
            };
            let file = l3_format::encode_with(&px, w, h, c, &opts)?;
            let t = &mut totals[k];
            t.bytes += file.len() as f64;
            t.log_ratio += (file.len() as f64 / px.len() as f64).ln();
            t.images += 1;
            t.raw += px.len() as f64;
            let mut out = vec![0u8; px.len()];
            t.full_s += best(|| {
                let f = L3File::parse(&file).expect("parse");
                f.decode_hwc(&mut out).expect("decode");
            });
            assert!(out == px, "{name}: {format} is not lossless");

            let index = L3Index::read_from(file.len() as u64, |r| {
                Ok::<_, Infallible>(file[r.start as usize..r.end as usize].to_vec())
            })?;
            let mut reads: Vec<Fragments> = Vec::with_capacity(windows.len());
            for win in &windows {
                let mut read = Fragments::new();
                read.reset(&index.region_ranges(*win, 0)?);
                for (r, buf) in read.slices_mut() {
                    buf.copy_from_slice(&file[r.start as usize..r.end as usize]);
                }
                t.crop_read += read.len() as f64;
                reads.push(read);
            }
            let layout = PixelLayout::packed(CROP, CROP, c, false);
            let mut region = vec![0u8; CROP as usize * CROP as usize * c as usize];
            t.crop_s += best(|| {
                for (win, read) in windows.iter().zip(&reads) {
                    index
                        .decode_region(read, *win, &mut region, layout)
                        .expect("region");
                }
            });
            t.crop_raw += windows
                .iter()
                .map(|r| r.w as f64 * r.h as f64 * c as f64)
                .sum::<f64>();
            t.crops += windows.len();
            // One seeded bit flipped in the bytes each crop read: does its region read notice, and if not,
            // are its pixels still the clean ones (a BP row below the crop, say, is never decoded)?
            let mut clean = vec![0u8; region.len()];
            for (win, read) in windows.iter().zip(reads.iter_mut()) {
                index.decode_region(read, *win, &mut clean, layout)?;
                let k = rng.below(read.len() as u64) as usize;
                let bit = rng.below(8) as u32;
                flip(read, k, bit);
                t.flips += 1;
                match index.decode_region(read, *win, &mut region, layout) {
                    Err(_) => t.caught += 1,
                    Ok(()) if region != clean => t.wrong += 1,
                    Ok(()) => {}
                }
                flip(read, k, bit);
            }
            if n_image == 0 && entry_crcs {
                // Every bit of the first crop's first bytes, one at a time.
                let (win, read) = (&windows[0], &mut reads[0]);
                for k in 0..read.len().min(every_bit_bytes) {
                    for bit in 0..8 {
                        flip(read, k, bit);
                        if index
                            .decode_region(read, *win, &mut region, layout)
                            .is_err()
                        {
                            t.every_bit_caught += 1;
                        }
                        flip(read, k, bit);
                        t.every_bit += 1;
                    }
                }
            }
            line += &format!(
                "  {}: {:.4}",
                label((format, entry_crcs)),
                file.len() as f64 / px.len() as f64
            );
        }
        eprintln!("{line}");
    }
    println!(
        "| format | ratio (geo. mean) | corpus bytes | decode MB/s, 1 thread | 224×224 region reads: MB/s, 1 thread | µs per crop | bytes read per crop | flipped bit: error | flipped bit: other pixels, no error | every bit of a crop's first bytes: error |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (k, case) in FORMATS.into_iter().enumerate() {
        let t = &totals[k];
        let n = t.crops.max(1) as f64;
        let every = if t.every_bit > 0 {
            format!("{} of {}", t.every_bit_caught, t.every_bit)
        } else {
            "—".into()
        };
        println!(
            "| {} | {:.4} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} of {} | {} | {every} |",
            label(case),
            (t.log_ratio / t.images.max(1) as f64).exp(),
            t.bytes,
            t.raw / t.full_s / 1e6,
            t.crop_raw / t.crop_s / 1e6,
            t.crop_s / n * 1e6,
            t.crop_read / n,
            t.caught,
            t.flips,
            t.wrong,
        );
    }
    Ok(())
}

/// Flips bit `bit` of byte `k` of the bytes `read` holds (counted across its fragments).
fn flip(read: &mut Fragments, k: usize, bit: u32) {
    let mut at = 0;
    for (_, buf) in read.slices_mut() {
        if k < at + buf.len() {
            buf[k - at] ^= 1 << bit;
            return;
        }
        at += buf.len();
    }
}
