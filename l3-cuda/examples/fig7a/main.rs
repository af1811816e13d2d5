//! The L3 side of the GPU measurements (run on the GPU machine; `scripts/fig7a_peers.py` measures the PNG
//! and JPEG peers on the same data and prints the combined table):
//!
//! - `kernel`: decode speed with input and output in device memory (`upload_samples` + `decode_resident`,
//!   timed with events), NHWC u8 and normalised NCHW f16, against a device-to-device copy measured in the
//!   same run: compressed bytes read + decoded bytes written per second over the copy's bytes read +
//!   written per second (target ≥ 40 %).
//! - `gpu`: Figure 7(a) end to end — images/s from L3 files in the page cache to normalised NCHW f16
//!   batches on the device (reader threads, host planning, pinned staging, H2D overlapping the previous
//!   decode, one launch per batch, at most two batches in flight).
//! - `cpu`: the same batches decoded by `l3-format` on every CPU core (normalisation through a per-channel
//!   lookup table of f16 bits), then copied to the device from pinned memory; without a GPU, the host
//!   batches only.
//! - `host`: the host stage of `gpu` alone, on any machine — every batch read from the page cache, parsed,
//!   planned and staged (`SamplePlan::new_parallel` + `stage_into`) into ordinary memory instead of pinned
//!   staging — on 1, 2, 4, … threads up to every core (`--threads` to choose): images/s, staged GB/s and
//!   images/s per thread, against the per-core share of the end-to-end target (README.md).
//!
//! ```text
//! fig7a DATA [--what kernel,gpu,cpu,host] [--res hd,fhd,uhd] [--formats v1,v2-bp,v2-ans] [--batch 16]
//!       [--min-secs 3] [--threads 1,2,4] [--json FILE]
//! ```
//! DATA holds `hd/`, `fhd/`, `uhd/` with `*.png` of exactly that size (from `scripts/prepare_data.py`);
//! each is encoded to `*.l3` (v1, the paper's format; the default) or `*.v2-bp.l3` / `*.v2-ans.l3` beside
//! it on first use (each format's default patch size); rows of a version-2 format end in its name. One JSON object per measurement
//! is appended to FILE (default `DATA/l3.jsonl`), and a table is printed.

mod host;

use l3_cuda::cudarc::driver::{CudaSlice, PinnedHostSlice};
use l3_cuda::{BatchDecoder, SampleOptions, SamplePlan, SampleSource};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use vocab::{DType, Layout, Normalize, Window};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const RESOLUTIONS: [(&str, u32, u32); 3] =
    [("hd", 1080, 720), ("fhd", 1920, 1080), ("uhd", 3840, 2160)];

struct Args {
    data: PathBuf,
    what: Vec<String>,
    res: Vec<String>,
    formats: Vec<String>,
    batch: usize,
    min: Duration,
    json: PathBuf,
    /// Thread counts of the `host` rows.
    threads: Vec<usize>,
}

fn args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let data = PathBuf::from(it.next().ok_or(
        "usage: fig7a DATA [--what kernel,gpu,cpu,host] [--res hd,fhd,uhd] [--formats v1,v2-bp,v2-ans] [--batch N] [--min-secs S] [--threads 1,2,4] [--json FILE]",
    )?);
    let mut a = Args {
        json: data.join("l3.jsonl"),
        data,
        what: vec!["kernel".into(), "gpu".into(), "cpu".into()],
        res: vec!["hd".into(), "fhd".into(), "uhd".into()],
        formats: vec!["v1".into()],
        batch: 16,
        min: Duration::from_secs(3),
        threads: host::default_threads(),
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let list = |v: &str| v.split(',').map(str::to_string).collect();
        match flag.as_str() {
            "--what" => a.what = list(&v),
            "--res" => a.res = list(&v),
            "--formats" => a.formats = list(&v),
            "--batch" => a.batch = v.parse()?,
            "--min-secs" => a.min = Duration::from_secs_f64(v.parse()?),
            "--json" => a.json = v.into(),
            "--threads" => a.threads = v.split(',').map(str::parse).collect::<Result<_, _>>()?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    for f in &a.formats {
        format_named(f)?;
    }
    if a.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    Ok(a)
}

/// The format a `--formats` name means.
fn format_named(name: &str) -> Res<l3_format::Format> {
    use l3_format::{Format, Profile};
    match name {
        "v1" => Ok(Format::V1),
        "v2-bp" => Ok(Format::V2(Profile::Bp)),
        "v2-ans" => Ok(Format::V2(Profile::Ans)),
        _ => Err(format!("unknown format {name:?} (v1, v2-bp or v2-ans)").into()),
    }
}

/// The L3 files of one resolution in format `fmt` (encoded from the PNGs on first use), sorted.
fn l3_files(dir: &Path, fmt: &str) -> Res<Vec<PathBuf>> {
    let mut pngs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    pngs.sort();
    let mut out = Vec::new();
    for png_path in pngs {
        let l3 = match fmt {
            "v1" => png_path.with_extension("l3"),
            _ => png_path.with_extension(format!("{fmt}.l3")),
        };
        if !l3.exists() {
            let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png_path)?));
            let mut reader = dec.read_info()?;
            let mut buf = vec![0u8; reader.output_buffer_size().ok_or("PNG too large")?];
            let info = reader.next_frame(&mut buf)?;
            if info.bit_depth != png::BitDepth::Eight {
                return Err(format!("{}: not 8-bit", png_path.display()).into());
            }
            buf.truncate(info.buffer_size());
            let c = info.color_type.samples() as u8;
            let opts = l3_format::EncodeOptions {
                format: format_named(fmt)?,
                threads: 0,
                ..l3_format::EncodeOptions::default()
            };
            let file = l3_format::encode_with(&buf, info.width, info.height, c, &opts)?;
            std::fs::write(&l3, file)?;
        }
        out.push(l3);
    }
    if out.is_empty() {
        return Err(format!("no PNG in {}", dir.display()).into());
    }
    Ok(out)
}

/// One measurement, printed and appended as a JSON object.
struct Row {
    res: &'static str,
    method: String,
    images_per_s: f64,
    extra: Vec<(&'static str, f64)>,
}

fn emit(json: &Path, width: u32, height: u32, row: &Row) -> Res<()> {
    let mut s = format!(
        "{{\"res\":\"{}\",\"width\":{width},\"height\":{height},\"method\":\"{}\",\"images_per_s\":{:.3}",
        row.res, row.method, row.images_per_s
    );
    for (k, v) in &row.extra {
        s += &format!(",\"{k}\":{v:.6}");
    }
    s += "}\n";
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(json)?
        .write_all(s.as_bytes())?;
    let extra: Vec<String> = row
        .extra
        .iter()
        .map(|(k, v)| format!("{k} {v:.3}"))
        .collect();
    println!(
        "| {} | {} | {:.1} | {} |",
        row.res,
        row.method,
        row.images_per_s,
        extra.join(", ")
    );
    Ok(())
}

fn whole_windows(files: &[Vec<u8>]) -> Res<Vec<Window>> {
    files
        .iter()
        .map(|f| {
            let p = l3_format::L3File::parse(f)?;
            Ok(Window::whole(p.width(), p.height()))
        })
        .collect()
}

fn main() -> Res<()> {
    let a = args()?;
    let mut decoder = match BatchDecoder::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("GPU unavailable: {e} (only the CPU rows run)");
            None
        }
    };
    println!("| res | method | images/s | details |\n|---|---|---|---|");
    for &(res, w, h) in RESOLUTIONS
        .iter()
        .filter(|r| a.res.iter().any(|x| x == r.0))
    {
        for fmt in &a.formats {
            let paths = l3_files(&a.data.join(res), fmt)?;
            let batch: Vec<PathBuf> = paths.iter().cycle().take(a.batch).cloned().collect();
            let files: Vec<Vec<u8>> = batch.iter().map(std::fs::read).collect::<Result<_, _>>()?;
            for f in &files {
                let p = l3_format::L3File::parse(f)?;
                if (p.width(), p.height()) != (w, h) {
                    return Err(format!(
                        "{res}: an image is {}x{}, not {w}x{h}",
                        p.width(),
                        p.height()
                    )
                    .into());
                }
            }
            let named = |mut row: Row| {
                if fmt != "v1" {
                    row.method = format!("{} {fmt}", row.method);
                }
                row
            };
            let want = |x: &str| a.what.iter().any(|v| v == x);
            if let Some(dec) = decoder.as_mut() {
                if want("kernel") {
                    for (layout, dtype, normalize) in [
                        (Layout::Nhwc, DType::U8, None),
                        (Layout::Nchw, DType::F16, Some(Normalize::IMAGENET)),
                    ] {
                        let row =
                            kernel_speed(dec, res, &files, w, h, layout, dtype, normalize, a.min)?;
                        emit(&a.json, w, h, &named(row))?;
                    }
                }
                if want("gpu") {
                    let row = gpu_end_to_end(dec, res, &batch, w, h, a.min)?;
                    emit(&a.json, w, h, &named(row))?;
                }
            }
            if want("cpu") {
                let row = cpu_end_to_end(decoder.as_ref(), res, &batch, w, h, a.min)?;
                emit(&a.json, w, h, &named(row))?;
            }
            if want("host") {
                let rows = host::host_stage(res, &batch, w, h, &a.threads, a.min)?;
                for row in rows {
                    emit(&a.json, w, h, &named(row))?;
                }
            }
        }
    }
    Ok(())
}

/// Device-resident decode of one batch (whole images as samples), timed with events, against a D2D copy.
#[allow(clippy::too_many_arguments)]
fn kernel_speed(
    dec: &mut BatchDecoder,
    res: &'static str,
    files: &[Vec<u8>],
    w: u32,
    h: u32,
    layout: Layout,
    dtype: DType,
    normalize: Option<Normalize>,
    min: Duration,
) -> Res<Row> {
    let sources: Vec<SampleSource<'_>> = files.iter().map(|f| SampleSource::File(f)).collect();
    let windows = whole_windows(files)?;
    let opts = SampleOptions {
        layout,
        dtype,
        normalize,
        ..SampleOptions::new(w, h)
    };
    let plan = SamplePlan::new(&sources, &windows, &opts)?;
    let (read, written) = (plan.input_len() as f64, plan.tensor().byte_len() as f64);
    let resident = dec.upload_samples(&sources, &windows, &opts)?;
    dec.decode_resident(&resident)?.wait()?;
    let stream = dec.decode_stream().clone();
    let mut iters = 1usize;
    let secs = loop {
        let t = dec.time_on(&stream, || {
            for _ in 0..iters {
                drop(dec.decode_resident(&resident)?);
            }
            Ok(())
        })?;
        if t >= min.as_secs_f64() || iters >= 1 << 16 {
            break t / iters as f64;
        }
        iters *= 2;
    };
    let copy_bytes = (written as usize).max(256 << 20);
    let d2d = dec.measure_d2d_bandwidth(copy_bytes, 20)?;
    let traffic = (read + written) / secs;
    Ok(Row {
        res,
        method: format!("kernel {} {}", layout.name(), dtype.name()),
        images_per_s: files.len() as f64 / secs,
        extra: vec![
            ("written_gb_s", written / secs / 1e9),
            ("read_gb_s", read / secs / 1e9),
            ("traffic_gb_s", traffic / 1e9),
            ("d2d_gb_s", d2d / 1e9),
            ("roofline_share", traffic / d2d),
        ],
    })
}

/// Reader threads fill batches of whole files from the page cache; the main thread submits each as one
/// sample batch (NCHW f16, ImageNet normalisation) and keeps two in flight.
fn gpu_end_to_end(
    dec: &mut BatchDecoder,
    res: &'static str,
    batch: &[PathBuf],
    w: u32,
    h: u32,
    min: Duration,
) -> Res<Row> {
    let opts = SampleOptions {
        layout: Layout::Nchw,
        dtype: DType::F16,
        normalize: Some(Normalize::IMAGENET),
        ..SampleOptions::new(w, h)
    };
    let windows = vec![Window::whole(w, h); batch.len()];
    let readers = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(2, 8);
    let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<Vec<u8>>>>(2);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut pending = std::collections::VecDeque::new();
    let (mut images, mut started) = (0usize, None::<Instant>);
    std::thread::scope(|s| -> Res<()> {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // Files of one batch read in parallel.
                let files: std::io::Result<Vec<Vec<u8>>> = std::thread::scope(|r| {
                    let chunks: Vec<_> = batch
                        .chunks(batch.len().div_ceil(readers))
                        .map(|c| r.spawn(move || c.iter().map(std::fs::read).collect::<Vec<_>>()))
                        .collect();
                    chunks
                        .into_iter()
                        .flat_map(|j| j.join().unwrap_or_default())
                        .collect()
                });
                if tx.send(files).is_err() {
                    break;
                }
            }
        });
        let mut run = || -> Res<()> {
            for round in 0.. {
                let files = rx.recv()??;
                let sources: Vec<SampleSource<'_>> =
                    files.iter().map(|f| SampleSource::File(f)).collect();
                pending.push_back(dec.submit_samples(&sources, &windows, &opts)?);
                if pending.len() > 2 {
                    pending.pop_front().ok_or("empty queue")?.wait()?;
                    if started.is_some() {
                        images += batch.len();
                    }
                }
                // Two warm-up rounds, then timing starts with the batches completing from here on.
                if round == 2 {
                    started = Some(Instant::now());
                }
                if started.is_some_and(|t| t.elapsed() >= min) && images > 0 {
                    break;
                }
            }
            Ok(())
        };
        let r = run();
        stop.store(true, Ordering::Relaxed);
        drop(rx);
        r
    })?;
    let secs = started.map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
    for b in pending {
        b.wait()?;
    }
    Ok(Row {
        res,
        method: "l3 gpu e2e NCHW f16".into(),
        images_per_s: images as f64 / secs,
        extra: vec![("batch", batch.len() as f64)],
    })
}

/// The same batches decoded by every CPU core into pinned f16 NCHW buffers (two, alternating), each
/// copied to the device while the next is decoded.
fn cpu_end_to_end(
    dec: Option<&BatchDecoder>,
    res: &'static str,
    batch: &[PathBuf],
    w: u32,
    h: u32,
    min: Duration,
) -> Res<Row> {
    let norm = Normalize::IMAGENET;
    let lut: Vec<[u16; 256]> = (0..3)
        .map(|c| std::array::from_fn(|v| half::f16::from_f32(norm.apply(v as u8, c)).to_bits()))
        .collect();
    let sample = w as usize * h as usize * 3;
    let len = sample * batch.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Host batches: pinned when there is a device to copy to.
    let mut pinned: Vec<PinnedHostSlice<u16>> = Vec::new();
    let mut plain: Vec<Vec<u16>> = Vec::new();
    let mut device: Option<(
        CudaSlice<u16>,
        std::sync::Arc<l3_cuda::cudarc::driver::CudaStream>,
    )> = None;
    if let Some(d) = dec {
        let stream = d.context().new_stream()?;
        for _ in 0..2 {
            // SAFETY: every element is written by the decode below before it is copied.
            pinned.push(unsafe { d.context().alloc_pinned::<u16>(len) }?);
        }
        device = Some((stream.alloc_zeros::<u16>(len)?, stream));
    } else {
        plain = vec![vec![0u16; len]; 2];
    }
    let mut copied: [Option<l3_cuda::cudarc::driver::CudaEvent>; 2] = [None, None];
    let start = Instant::now();
    let mut rounds = 0usize;
    while rounds < 2 || start.elapsed() < min {
        let k = rounds % 2;
        if let Some(ev) = copied[k].take() {
            ev.synchronize()?;
        }
        let out: &mut [u16] = if dec.is_some() {
            pinned[k].as_mut_slice()?
        } else {
            &mut plain[k]
        };
        let next = AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<&mut [u16]>> =
            out.chunks_mut(sample).map(std::sync::Mutex::new).collect();
        std::thread::scope(|s| -> Res<()> {
            let jobs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> Result<(), String> {
                        let mut px = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(path) = batch.get(i) else {
                                return Ok(());
                            };
                            let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
                            let f = l3_format::L3File::parse(&bytes).map_err(|e| e.to_string())?;
                            px.resize(f.decoded_len(), 0);
                            f.decode_chw(&mut px).map_err(|e| e.to_string())?;
                            let plane = w as usize * h as usize;
                            let mut slot = slots[i].lock().map_err(|e| e.to_string())?;
                            let c = f.channels() as usize;
                            for ch in 0..3 {
                                let src = &px[ch.min(c - 1) * plane..][..plane];
                                let dst = &mut slot[ch * plane..][..plane];
                                for (d, &v) in dst.iter_mut().zip(src) {
                                    *d = lut[ch][v as usize];
                                }
                            }
                        }
                    })
                })
                .collect();
            for j in jobs {
                j.join().map_err(|_| "decode thread panicked")??;
            }
            Ok(())
        })?;
        drop(slots);
        if let Some((dst, stream)) = device.as_mut() {
            stream.memcpy_htod(&pinned[k], dst)?;
            copied[k] = Some(stream.record_event(None)?);
        }
        rounds += 1;
    }
    if let Some((_, stream)) = &device {
        stream.synchronize()?;
    }
    let secs = start.elapsed().as_secs_f64();
    let method = if dec.is_some() {
        "l3 cpu e2e NCHW f16 (+H2D)"
    } else {
        "l3 cpu NCHW f16 (host)"
    };
    Ok(Row {
        res,
        method: method.into(),
        images_per_s: (rounds * batch.len()) as f64 / secs,
        extra: vec![("threads", threads as f64)],
    })
}
