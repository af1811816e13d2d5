//! `l3 demo`: the main job. Builds (or takes) a dataset, converts it to every format, streams each for one
//! epoch through the same loader and prints one table.
use anyhow::Context;
use l3_cli::compare::{
    BuildPlan, FormatEntry, Timer, build_formats, build_liquid, generate_default, stream_epoch,
};
use loader::{Crop, LoaderOptions, SampleSpec};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Run on these images instead of the built-in generated dataset: a folder, or `s3://bucket/prefix`
    /// (fetched once into the work folder, and also streamed straight from the bucket).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Images in the built-in dataset (half 1280x720, half 1920x1080).
    #[arg(long, default_value_t = 96)]
    pub images: usize,
    /// Keep the converted datasets in this folder (default: a temporary folder, removed afterwards).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Decode threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The second column's read bandwidth in MB/s (10^6 bytes): a typical per-GPU share of network
    /// storage. 0 leaves that column out.
    #[arg(long, default_value_t = 200.0)]
    pub storage_mbps: f64,
}

pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let t_all = Timer::start();
    let threads = stdx::parallel::threads(a.threads.unwrap_or(0));
    let tmp;
    let work = match &a.work {
        Some(w) => {
            std::fs::create_dir_all(w).with_context(|| format!("creating {}", w.display()))?;
            w.clone()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("l3-demo-")
                .tempdir()
                .context("creating a temporary folder")?;
            tmp.path().to_path_buf()
        }
    };
    println!("l3 demo: every format of the same images, one epoch each through the same loader");
    println!("work folder: {}", work.display());
    let png_dir = work.join("png");
    write_source_png(&a, &work, &png_dir, threads)?;
    let capped = capped_storage(a.storage_mbps)?;
    let formats = convert_all(&a, &work, &png_dir, threads, capped.as_ref());
    let rows = stream_all(&a, formats, threads, capped.as_ref());
    print_table(&a, &rows, threads);
    println!("whole demo: {t_all}");
    Ok(())
}

/// The demo's source images as PNG in `png_dir`: the built-in generated dataset, or `--data`'s images
/// (fetched first when they are on S3) re-encoded.
fn write_source_png(
    a: &DemoArgs,
    work: &Path,
    png_dir: &Path,
    threads: usize,
) -> anyhow::Result<()> {
    let t0 = Timer::start();
    let Some(data) = &a.data else {
        let bar = crate::convert::progress_bar(a.images as u64, "generating");
        generate_default(png_dir, a.images, a.seed, threads, &|d, _| {
            bar.set_position(d as u64)
        })
        .context("generating the default dataset")?;
        bar.finish_and_clear();
        println!(
            "generated {} images (noise fields, landscapes, shapes, textures; half 1280x720, half 1920x1080) as PNG ({t0})",
            a.images,
        );
        return Ok(());
    };
    let remote = data.to_str().filter(|s| s.starts_with("s3://"));
    let fetched;
    let dir = match remote {
        Some(url) => {
            fetched = fetch_images(url, &work.join("source"))?;
            &fetched
        }
        None => data,
    };
    let n = loader::image_files(dir)?.files.len();
    let bar = crate::convert::progress_bar(n as u64, "-> png");
    let opts = loader::convert::ConvertOptions {
        threads,
        to_8bit: false,
    };
    let s = loader::convert::convert_folder(
        dir,
        png_dir,
        loader::convert::Target::Png,
        &opts,
        &|d, _| bar.set_position(d as u64),
    )
    .with_context(|| format!("converting {} to PNG", dir.display()))?;
    bar.finish_and_clear();
    println!(
        "{}: {} images re-encoded as PNG ({} already there) ({t0})",
        data.display(),
        s.converted + s.skipped,
        s.skipped,
    );
    Ok(())
}

/// The read policy of the second column: `--storage-mbps` as a bandwidth cap (none for 0).
fn capped_storage(mbps: f64) -> anyhow::Result<Option<loader::StorageOptions>> {
    match mbps {
        0.0 => Ok(None),
        m => match loader::StorageOptions::bytes_per_sec(m) {
            Some(b) => Ok(Some(loader::StorageOptions {
                bandwidth: Some(b),
                cache: None,
                ..Default::default()
            })),
            None => anyhow::bail!("--storage-mbps {m}: expected MB/s, 0 or more"),
        },
    }
}

/// Every format converted from `png_dir` under `work` (with a Liquid mix profiled through the cap, and
/// the S3 source itself when `--data` is on S3).
fn convert_all(
    a: &DemoArgs,
    work: &Path,
    png_dir: &Path,
    threads: usize,
    capped: Option<&loader::StorageOptions>,
) -> Vec<FormatEntry> {
    let t0 = Timer::start();
    println!("converting ...");
    let plan = BuildPlan {
        threads,
        seed: a.seed,
        pcr_groups: vec![Some(1), Some(5), None],
        ..BuildPlan::default()
    };
    let log = |line: &str| println!("{line}");
    let mut formats = build_formats(png_dir, work, &plan, &log);
    if let Some(storage) = capped {
        // Liquid's profiler probes through the same cap, so the ratio follows the bandwidth.
        let dir = work.join(format!("liquid-{}MBps", a.storage_mbps));
        let mut entry = build_liquid(&work.join("l3"), &dir, &plan, storage.bandwidth, &log);
        entry.name = format!("{} @{}MB/s", entry.name, a.storage_mbps);
        formats.push(entry);
    }
    if let Some(url) = a
        .data
        .as_deref()
        .and_then(|d| d.to_str())
        .filter(|s| s.starts_with("s3://"))
    {
        formats.insert(
            1,
            FormatEntry {
                name: "source, from S3".into(),
                dataset: loader::open_dataset(Path::new(url), &Default::default())
                    .map_err(|e| e.to_string()),
                decode: loader::DecodeScope::Whole,
                path: url.into(),
                group: None,
            },
        );
    }
    println!("conversions done ({t0}); streaming one epoch of each:");
    formats
}

/// One format's epoch: its dataset bytes and figures, and the same epoch through the bandwidth cap.
struct Row {
    name: String,
    result: Result<(u64, l3_cli::compare::Measured), String>,
    capped: Option<Result<l3_cli::compare::Measured, String>>,
}

/// Streams one epoch of each format (and again through the cap), printing a line as each ends.
fn stream_all(
    a: &DemoArgs,
    formats: Vec<FormatEntry>,
    threads: usize,
    capped: Option<&loader::StorageOptions>,
) -> Vec<Row> {
    let opts = LoaderOptions {
        batch_size: a.batch,
        decode_threads: threads,
        seed: a.seed,
        sample: SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Center,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    };
    let mut rows = Vec::new();
    for f in formats {
        let opts = LoaderOptions {
            decode: f.decode,
            ..opts.clone()
        };
        let result = match &f.dataset {
            Ok(ds) => {
                let bytes = ds.stored_bytes();
                stream_epoch(ds.clone(), opts.clone())
                    .map(|m| (bytes, m))
                    .map_err(|e| e.to_string())
            }
            Err(why) => Err(why.clone()),
        };
        let capped = match (&result, capped) {
            (Ok(_), Some(storage)) => Some(
                f.reopen(storage)
                    .and_then(|ds| stream_epoch(ds, opts))
                    .map_err(|e| e.to_string()),
            ),
            _ => None,
        };
        match (&result, &capped) {
            (Ok((_, m)), Some(Ok(c))) => println!(
                "  {:<28} {:>8.1} images/s, {:>8.1} at {} MB/s",
                f.name,
                m.images_per_sec(),
                c.images_per_sec(),
                a.storage_mbps
            ),
            (Ok((_, m)), _) => println!("  {:<28} {:>8.1} images/s", f.name, m.images_per_sec()),
            (Err(e), _) => println!("  {:<28} not measured: {e}", f.name),
        }
        rows.push(Row {
            name: f.name,
            result,
            capped,
        });
    }
    rows
}

/// The demo's table (speed-ups against PNG), its notes and what it measured.
fn print_table(a: &DemoArgs, rows: &[Row], threads: usize) {
    let png_ips = rows
        .iter()
        .find(|r| r.name == "PNG")
        .and_then(|r| r.result.as_ref().ok())
        .map(|(_, m)| m.images_per_sec());
    println!();
    let capped_header = format!("images/s @{}MB/s", a.storage_mbps);
    println!(
        "{:<28} {:>14} {:>16} {:>10} {:>16} {:>16} {:>18}",
        "format",
        "dataset bytes",
        "read / epoch",
        "images/s",
        "CPU s / image",
        "speed-up vs PNG",
        capped_header
    );
    let capped_cell = |r: &Row| match &r.capped {
        Some(Ok(c)) => format!("{:.1}", c.images_per_sec()),
        Some(Err(_)) => "failed".to_string(),
        None => "-".to_string(),
    };
    let mut notes = Vec::new();
    for r in rows {
        match &r.result {
            Ok((bytes, m)) => {
                let speedup = png_ips.map_or("n/a".to_string(), |p| {
                    format!("{:.2}x", m.images_per_sec() / p)
                });
                println!(
                    "{:<28} {:>14} {:>16} {:>10.1} {:>16.4} {:>16} {:>18}",
                    r.name,
                    bytes,
                    m.stats.bytes_read,
                    m.images_per_sec(),
                    m.cpu_per_image().as_secs_f64(),
                    speedup,
                    capped_cell(r)
                );
                if let Some(Err(e)) = &r.capped {
                    notes.push(format!("{} at {} MB/s: {e}", r.name, a.storage_mbps));
                }
            }
            Err(e) => {
                println!(
                    "{:<28} {:>14} {:>16} {:>10} {:>16} {:>16} {:>18}",
                    r.name, "-", "-", "-", "-", "-", "-"
                );
                notes.push(format!("{}: not measured ({e})", r.name));
            }
        }
    }
    println!();
    for n in notes {
        println!("note: {n}");
    }
    println!(
        "{} images, batch {} of 224x224 centre crops, {threads} decode threads + 2 I/O threads, one epoch each; \
         the datasets were just written, so \"images/s\" reads them from the page cache and measures decoding and \
         the pipeline; the last column reads the same bytes through a bandwidth cap that models network storage \
         (a token bucket shared by the reader threads). PCR bytes are those read at that scan group; the last Liquid \
         row was profiled through that cap.",
        rows.first()
            .and_then(|r| r.result.as_ref().ok())
            .map_or(0, |(_, m)| m.images),
        a.batch
    );
}

/// Copies the images under `url` (an `s3://` prefix) into `dir`, keeping their relative paths; files
/// already there with the object's size are kept. Returns `dir`.
fn fetch_images(url: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let storage = loader::Storage::open(url, &Default::default())?;
    let listing = storage.list()?;
    let images: Vec<_> = listing
        .files
        .iter()
        .filter(|(key, _)| loader::Format::from_path(Path::new(key)).is_some())
        .collect();
    anyhow::ensure!(
        !images.is_empty(),
        "{url}: no images (PNG, JPEG, PPM, L3, WebP, TIFF, BMP, GIF) under it"
    );
    let t0 = Timer::start();
    let mut fetched = 0u64;
    for (key, size) in &images {
        let rel = Path::new(key);
        anyhow::ensure!(
            rel.components()
                .all(|c| matches!(c, std::path::Component::Normal(_))),
            "{url}/{key}: a key that leaves the prefix; not fetched"
        );
        let dst = dir.join(rel);
        if std::fs::metadata(&dst).is_ok_and(|m| m.len() == *size) {
            continue;
        }
        let bytes = storage.read(key, loader::max_image_bytes())?;
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        stdx::fs::write_atomic(&dst, &bytes)
            .with_context(|| format!("writing {}", dst.display()))?;
        fetched += bytes.len() as u64;
    }
    println!(
        "{url}: {} images, {fetched} bytes fetched into {} ({t0})",
        images.len(),
        dir.display()
    );
    Ok(dir.to_path_buf())
}
