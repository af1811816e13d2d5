//! `l3 bench decode [--gpu] DIR`: decode throughput of the corpus scaled to HD, FHD and UHD (the paper's
//! Fig. 7a): CPU L3 and PNG decode on all cores, and with `--gpu` the GPU decoder from device-resident input
//! and end to end from pinned host memory, beside the device's own D2D and H2D bandwidth measured in the
//! same run. Prints one Markdown table. The measuring is here; the decoders are the library crates'.
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Decode throughput: CPU L3 and PNG on all cores, and the GPU with --gpu.
    Decode {
        dir: PathBuf,
        #[arg(long)]
        gpu: bool,
        /// Use at most this many images of DIR (all by default).
        #[arg(long)]
        limit: Option<usize>,
        /// Resolutions to run, comma-separated among hd, fhd, uhd.
        #[arg(long, default_value = "hd,fhd,uhd")]
        res: String,
        /// Minimum seconds each timed measurement runs.
        #[arg(long, default_value_t = 1.0)]
        min_secs: f64,
    },
}

/// The paper's three resolutions (section 5, Fig. 7a/8): HD is 1080×720 there.
const RESOLUTIONS: [(&str, u32, u32); 3] =
    [("HD", 1080, 720), ("FHD", 1920, 1080), ("UHD", 3840, 2160)];

pub fn run(c: BenchCommand) -> anyhow::Result<()> {
    let BenchCommand::Decode {
        dir,
        gpu,
        limit,
        res,
        min_secs,
    } = c;
    let sources = load_dir(&dir, limit)?;
    let threads = stdx::parallel::threads(0);
    println!(
        "# l3 bench decode: {} ({} images)",
        dir.display(),
        sources.len()
    );
    println!();
    println!("machine: {} ({threads} threads)", cpu_name());
    let mut gpu_dec = if gpu {
        // Asked for: no GPU is an error, not a table without GPU columns.
        Some(l3_cuda::BatchDecoder::new(0).context("--gpu: no usable GPU")?)
    } else {
        println!("GPU: unavailable (not requested; pass --gpu)");
        None
    };
    let mut d2d = None;
    if let Some(dec) = gpu_dec.as_ref() {
        let name = dec
            .context()
            .name()
            .unwrap_or_else(|_| "unknown GPU".into());
        let bw_d2d = dec.measure_d2d_bandwidth(256 << 20, 20)?;
        let bw_h2d = dec.measure_h2d_bandwidth(256 << 20, 10)?;
        println!(
            "GPU: {name}; device memcpy (D2D, bytes read + written) {:.1} GB/s; host-to-device from pinned memory {:.1} GB/s",
            bw_d2d / 1e9,
            bw_h2d / 1e9
        );
        d2d = Some(bw_d2d);
    }
    println!();
    println!(
        "| resolution | images | L3 / raw | PNG / raw | CPU L3 decode GB/s (Gpx/s) | CPU PNG decode GB/s (Gpx/s) | L3 / PNG (CPU) | GPU resident GB/s (Gpx/s) | % of memory roofline | GPU end-to-end GB/s (Gpx/s) | end-to-end / PNG |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let want: Vec<String> = res
        .split(',')
        .map(|s| s.trim().to_ascii_uppercase())
        .collect();
    for &(label, w, h) in RESOLUTIONS.iter().filter(|r| want.iter().any(|x| x == r.0)) {
        let set = prepare(&sources, w, h, threads)?;
        let raw: usize = set.iter().map(|i| i.raw_len).sum();
        let pixels: usize = set.iter().map(|i| i.raw_len / i.channels as usize).sum();
        let l3_bytes: usize = set.iter().map(|i| i.l3.len()).sum();
        let png_bytes: usize = set.iter().map(|i| i.png.len()).sum();
        let min = Duration::from_secs_f64(min_secs);
        let cpu_l3 = time_parallel(&set, threads, min, |img, out| {
            let f = l3_format::L3File::parse(&img.l3).map_err(anyhow::Error::from)?;
            f.decode_hwc(&mut out[..img.raw_len])
                .map_err(anyhow::Error::from)
        })?;
        let cpu_png = time_parallel(&set, threads, min, |img, _out| {
            let d = image::load_from_memory_with_format(&img.png, image::ImageFormat::Png)?;
            anyhow::ensure!(
                d.as_bytes().len() == img.raw_len,
                "PNG decoded to an unexpected size"
            );
            Ok(())
        })?;
        let (rate_l3, rate_png) = (raw as f64 / cpu_l3, raw as f64 / cpu_png);
        let fmt = |bytes_per_s: f64| {
            let px = bytes_per_s * pixels as f64 / raw as f64;
            format!("{:.2} ({:.3})", bytes_per_s / 1e9, px / 1e9)
        };
        let mut gpu_cols = ["–".to_string(), "–".into(), "–".into(), "–".into()];
        if let Some(dec) = gpu_dec.as_mut() {
            let (resident, e2e) = gpu_rates(dec, &set, min)?;
            let read_written = (l3_bytes + raw) as f64 / raw as f64 * resident;
            gpu_cols = [
                fmt(resident),
                format!("{:.0}%", 100.0 * read_written / d2d.unwrap_or(f64::NAN)),
                fmt(e2e),
                format!("{:.1}×", e2e / rate_png),
            ];
        }
        println!(
            "| {label} {w}×{h} | {} | {:.3} | {:.3} | {} | {} | {:.1}× | {} | {} | {} | {} |",
            set.len(),
            l3_bytes as f64 / raw as f64,
            png_bytes as f64 / raw as f64,
            fmt(rate_l3),
            fmt(rate_png),
            rate_l3 / rate_png,
            gpu_cols[0],
            gpu_cols[1],
            gpu_cols[2],
            gpu_cols[3],
        );
    }
    println!();
    println!(
        "GB/s are decoded (output) bytes per second; Gpx/s pixels per second. CPU columns use all {threads} threads, one image per thread at a time. \
         Roofline: (compressed bytes read + decoded bytes written) per second over the D2D memcpy rate (read + written); target ≥ 40%. \
         End-to-end: L3 files in pinned host memory → host plan (parse, validate, patch table) → H2D → decode, double-buffered, against the all-core PNG decode; target ≥ 20×."
    );
    Ok(())
}

struct Prepared {
    l3: Vec<u8>,
    png: Vec<u8>,
    raw_len: usize,
    channels: u8,
}

/// Every PNG/JPEG in `dir` as 8-bit RGB (or RGBA when it has alpha), in name order.
fn load_dir(dir: &Path, limit: Option<usize>) -> anyhow::Result<Vec<image::DynamicImage>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let ext = p
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("")
                .to_ascii_lowercase();
            matches!(ext.as_str(), "png" | "jpg" | "jpeg")
        })
        .collect();
    paths.sort();
    paths.truncate(limit.unwrap_or(usize::MAX));
    anyhow::ensure!(
        !paths.is_empty(),
        "{}: no PNG or JPEG images",
        dir.display()
    );
    paths
        .iter()
        .map(|p| {
            let img = loader::import(p, &loader::ImportOptions::default())?;
            let (w, h) = (img.width, img.height);
            Ok(match img.channels {
                4 => image::DynamicImage::ImageRgba8(
                    image::RgbaImage::from_raw(w, h, img.pixels).context("image size")?,
                ),
                _ => image::DynamicImage::ImageRgb8(
                    image::RgbImage::from_raw(w, h, img.to_rgb().pixels).context("image size")?,
                ),
            })
        })
        .collect()
}

/// Scales every source to w×h (Lanczos3, as the paper did with Pillow) and encodes it as L3 (default patch
/// size for the resolution) and PNG, on all threads.
fn prepare(
    sources: &[image::DynamicImage],
    w: u32,
    h: u32,
    threads: usize,
) -> anyhow::Result<Vec<Prepared>> {
    stdx::parallel::map(sources, threads, |_, src| prepare_one(src, w, h))
}

fn prepare_one(src: &image::DynamicImage, w: u32, h: u32) -> anyhow::Result<Prepared> {
    let scaled = src.resize_exact(w, h, image::imageops::FilterType::Lanczos3);
    let channels = scaled.color().channel_count();
    let px = scaled.as_bytes();
    let l3 = l3_format::encode(px, w, h, channels, l3_format::default_patch_size(w, h))?;
    let mut png = Vec::new();
    scaled.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)?;
    Ok(Prepared {
        l3,
        png,
        raw_len: px.len(),
        channels,
    })
}

/// Seconds per pass over `set` when `threads` workers decode one image each at a time, repeating the whole
/// set until at least `min` has passed.
fn time_parallel(
    set: &[Prepared],
    threads: usize,
    min: Duration,
    f: impl Fn(&Prepared, &mut [u8]) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<f64> {
    let max_raw = set.iter().map(|i| i.raw_len).max().unwrap_or(0);
    let start = Instant::now();
    let mut passes = 0u32;
    thread_local! {
        static OUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    while passes == 0 || start.elapsed() < min {
        stdx::parallel::for_each(set, threads, |img| {
            OUT.with_borrow_mut(|out| {
                out.resize(max_raw, 0);
                f(img, out)
            })
        })?;
        passes += 1;
    }
    Ok(start.elapsed().as_secs_f64() / passes as f64)
}

/// GPU decode rates in output bytes/s: (device-resident input, end to end from host bytes).
fn gpu_rates(
    dec: &mut l3_cuda::BatchDecoder,
    set: &[Prepared],
    min: Duration,
) -> anyhow::Result<(f64, f64)> {
    let files: Vec<&[u8]> = set.iter().map(|i| i.l3.as_slice()).collect();
    let raw: usize = set.iter().map(|i| i.raw_len).sum();
    let opts = l3_cuda::DecodeOptions {
        layout: vocab::Layout::Nhwc,
        ..Default::default()
    };
    // Check once that the GPU agrees with the CPU before timing anything.
    let check = dec.submit(&files, &opts)?;
    let got = check.to_host_bytes()?;
    for (slot, img) in check.images().iter().zip(set) {
        let f = l3_format::L3File::parse(&img.l3)?;
        let mut want = vec![0u8; f.decoded_len()];
        f.decode_hwc(&mut want)?;
        anyhow::ensure!(
            got[slot.offset..slot.offset + slot.len()] == want[..],
            "GPU output differs from the CPU decoder"
        );
    }
    // Device-resident: launches only, timed with events on the decode stream.
    let resident = dec.upload(&files, &opts)?;
    dec.decode_resident(&resident)?.wait()?;
    let stream = dec.decode_stream().clone();
    let mut iters = 1usize;
    let resident_secs = loop {
        // Each batch's output is freed stream-ordered as soon as it is dropped, so memory stays flat.
        let secs = dec.time_on(&stream, || {
            for _ in 0..iters {
                drop(dec.decode_resident(&resident)?);
            }
            Ok(())
        })?;
        if secs >= min.as_secs_f64() || iters >= 1 << 16 {
            break secs / iters as f64;
        }
        iters *= 2;
    };
    // End to end from pinned host memory: the files sit in a PinnedBatch (where a loader reads them);
    // each batch is planned on the host (headers parsed and validated), DMA'd and decoded, with the next
    // batch's copy overlapping this one's decode.
    let mut pinned = dec.pinned_batch(files.iter().map(|f| f.len()).sum())?;
    for f in &files {
        pinned.push(f)?;
    }
    let start = Instant::now();
    let mut n = 0usize;
    let mut in_flight = std::collections::VecDeque::new();
    while n < 2 || start.elapsed() < min {
        in_flight.push_back(dec.submit_pinned(&mut pinned, &opts)?);
        if in_flight.len() > 2 {
            in_flight.pop_front().unwrap().wait()?;
        }
        n += 1;
    }
    for b in in_flight {
        b.wait()?;
    }
    let e2e_secs = start.elapsed().as_secs_f64() / n as f64;
    Ok((raw as f64 / resident_secs, raw as f64 / e2e_secs))
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
