//! `cargo xtask bench loader`: the same corpus images in every format, streamed one epoch at a time through
//! the same `loader::Loader` (I/O threads → decode pool → batches of 224×224 centre crops) at 1, 2 and all
//! cores, in one run.
//!
//! The corpus (../shared/corpus, 18 images, 1680×1050 to 5120×2880) is first re-encoded as PNG, then the
//! PNGs are converted to L3, raw (PPM/PAM), JPEG q90 (the source of the PCR dataset), a Liquid L3+raw mix at
//! the ratio `liquid-sampler`'s profiler picks, and PCRs read at scan groups 5 and 10. Every dataset was just
//! written, so it is read from the page cache: the figures compare decode and pipeline cost, not disks.
//! Each cell is the best of three runs, each of as many epochs as fill about a second (the machine is shared). `L3_BENCH_QUICK=1`: six images, one run per cell.

use crate::report::{Report, Table, bar_plot, corpus_dir};
use anyhow::Context;
use l3_cli::compare::{
    BuildPlan, FormatEntry, Measured, build_formats, stream_epoch, stream_epochs,
};
use loader::convert::{ConvertOptions, Target, convert_folder};
use loader::{Crop, Dataset, DecodeScope, LoaderOptions, Order, SampleSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn run(r: &mut Report) -> anyhow::Result<()> {
    let quick = std::env::var_os("L3_BENCH_QUICK").is_some();
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut threads = vec![1, 2, all];
    threads.dedup();
    let work = tempfile::Builder::new()
        .prefix("l3-bench-loader-")
        .tempdir()?;
    let png = work.path().join("png");
    let source = source_images(work.path(), quick)?;
    let formats = build_datasets(&source, &png, work.path(), all)?;
    let read_less: Vec<_> = formats
        .iter()
        .filter(|f| ["PNG", "JPEG q90", "L3", "L3, crop patches only"].contains(&f.name.as_str()))
        .cloned()
        .collect();

    let headers = headers(&threads, all);
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(
        "Each format through the same loader (224×224 centre crops, batch 8)",
        &hdr,
    );
    let mut bars = Vec::new();
    let mut png_ips = None;
    let mut notes = Vec::new();
    for run in runs(formats, &mut notes) {
        let (mut cells, m) = measure_run(&run, &threads, quick)?;
        let ips = m.images_per_sec();
        if run.name == "PNG" {
            png_ips = Some(ips);
        }
        cells.push(format!("{:.1}", m.cpu_per_image().as_secs_f64() * 1e3));
        cells.push(format!("{:.0}", m.stats.mb_per_sec()));
        cells.push(png_ips.map_or("n/a".into(), |p| format!("{:.2}×", ips / p)));
        table.row(cells);
        bars.push((run.name, ips));
    }
    r.para(&format!(
        "Source: {} ({} images{}), re-encoded as PNG, then converted to each format; PCR from the JPEG q90 copy; \
         Liquid = L3 + raw at the profiler's ratio. Every row decodes whole images except \"L3, crop patches only\", \
         which decodes just the L3 patches under the crop (the loader's default for L3). Each dataset was just written and is read from the page cache, \
         so this compares decode and pipeline cost. Each cell: best of {} runs of as many epochs as fill about a second; CPU ms / image is process CPU \
         time (all threads) per image at all cores; 2 I/O threads besides the decode threads.",
        source.display(),
        loader::image_files(&png)?.files.len(),
        if quick { ", L3_BENCH_QUICK subset" } else { "" },
        if quick { 1 } else { 3 }
    ));
    r.table(&table);
    for n in notes {
        r.para(&format!("Note: {n}"));
    }
    r.svg(
        "images-per-sec",
        bar_plot("Loader images/s at all cores", "img/s", &bars),
    );
    bytes_read(r, &read_less, all, quick)
}

/// The corpus folder, or in quick mode a folder under `work` with six of its smaller files.
fn source_images(work: &Path, quick: bool) -> anyhow::Result<PathBuf> {
    let corpus = corpus_dir();
    if !quick {
        return Ok(corpus);
    }
    let dir = work.join("subset");
    let mut files = loader::image_files(&corpus)?.files;
    files.sort_by_key(|(p, _)| {
        std::fs::metadata(corpus.join(p))
            .map(|m| m.len())
            .unwrap_or(0)
    });
    std::fs::create_dir_all(&dir)?;
    for (p, _) in files.iter().take(6) {
        std::fs::copy(corpus.join(p), dir.join(p))?;
    }
    Ok(dir)
}

/// `source` re-encoded as PNG into `png`, then converted under `work` into every format.
fn build_datasets(
    source: &Path,
    png: &Path,
    work: &Path,
    threads: usize,
) -> anyhow::Result<Vec<FormatEntry>> {
    eprintln!("loader bench: re-encoding {} as PNG ...", source.display());
    let opts = ConvertOptions {
        threads,
        to_8bit: false,
    };
    convert_folder(source, png, Target::Png, &opts, &|_, _| {})
        .context("re-encoding the corpus as PNG")?;
    let plan = BuildPlan {
        threads,
        pcr_groups: vec![Some(5), Some(10)],
        ..BuildPlan::default()
    };
    Ok(build_formats(png, work, &plan, &|l| eprintln!("{l}")))
}

/// The table's columns: format, bytes, images/s at each thread count, then CPU time, read rate and PNG's
/// share.
fn headers(threads: &[usize], all: usize) -> Vec<String> {
    let mut headers = vec!["format".to_string(), "dataset bytes".to_string()];
    for &t in threads {
        headers.push(if t == all && t > 2 {
            format!("images/s, all {t} cores")
        } else if t == 1 {
            "images/s, 1 core".into()
        } else {
            format!("images/s, {t} cores")
        });
    }
    headers.extend([
        "CPU ms / image".into(),
        "MB/s read (all cores)".into(),
        "vs PNG (all cores)".into(),
    ]);
    headers
}

/// The 224×224 centre crops in batches of 8 that every measurement streams, on `threads` decode threads and
/// 2 I/O threads.
fn crop_options(threads: usize, decode: DecodeScope) -> LoaderOptions {
    LoaderOptions {
        batch_size: 8,
        decode_threads: threads,
        io_threads: 2,
        decode,
        sample: SampleSpec {
            height: 224,
            width: 224,
            crop: Crop::Center,
            ..SampleSpec::default()
        },
        ..LoaderOptions::default()
    }
}

/// One row of the table: a dataset, how much of each item it decodes, and the order it is read in.
struct Run {
    name: String,
    ds: Arc<dyn Dataset>,
    decode: DecodeScope,
    order: Order,
}

/// Every format with the seeded order; the Liquid mix a second time through its own two-region sampler
/// (buffers of 30% of the dataset, page cache bypassed), so the mix and the sampler show apart. A format
/// that could not be built goes to `notes`.
fn runs(formats: Vec<FormatEntry>, notes: &mut Vec<String>) -> Vec<Run> {
    let mut runs = Vec::new();
    for f in formats {
        let ds = match f.dataset {
            Ok(ds) => ds,
            Err(why) => {
                notes.push(format!("{}: not measured ({why})", f.name));
                continue;
            }
        };
        if !f.name.starts_with("Liquid") {
            runs.push(Run {
                name: f.name,
                ds,
                decode: f.decode,
                order: Order::Seeded,
            });
            continue;
        }
        let budget_bytes = liquid_budget(ds.as_ref());
        runs.push(Run {
            name: f.name.clone(),
            ds: ds.clone(),
            decode: f.decode,
            order: Order::Seeded,
        });
        runs.push(Run {
            name: format!(
                "{}, Liquid sampler ({}% buffers, O_DIRECT)",
                f.name,
                100 * budget_bytes / ds.stored_bytes().max(1)
            ),
            ds,
            decode: f.decode,
            order: Order::Liquid { budget_bytes },
        });
    }
    runs
}

/// The Liquid sampler's buffers: 30 % of the dataset, but room for at least two of the largest item of
/// each format (the sampler refuses less): the corpus's largest images are a large share of 18.
fn liquid_budget(ds: &dyn Dataset) -> u64 {
    let largest: u64 = ds.liquid().map_or(0, |l| {
        let mut per_format = std::collections::HashMap::new();
        for it in &l.manifest.items {
            let m = per_format.entry(it.format).or_insert(0u64);
            *m = (*m).max(it.location.length);
        }
        per_format.values().sum()
    });
    (ds.stored_bytes() * 3 / 10).max(2 * largest)
}

/// `run` at each thread count: its first cells (name, bytes, images/s per thread count) and the
/// measurement at the last thread count (all cores).
fn measure_run(
    run: &Run,
    threads: &[usize],
    quick: bool,
) -> anyhow::Result<(Vec<String>, Measured)> {
    let name = &run.name;
    let mut cells = vec![name.clone(), run.ds.stored_bytes().to_string()];
    let mut last: Option<Measured> = None;
    for &t in threads {
        let opts = LoaderOptions {
            order: run.order,
            ..crop_options(t, run.decode)
        };
        // Enough epochs per measurement to run for about a second: an 18-image epoch of a fast
        // format lasts a few milliseconds, which would time thread start-up more than decoding.
        let probe = stream_epoch(run.ds.clone(), opts.clone())
            .with_context(|| format!("streaming {name}"))?;
        let epochs = ((1.0 / probe.wall.as_secs_f64().max(1e-3)).ceil() as usize).clamp(1, 50);
        let mut best: Option<Measured> = None;
        for _ in 0..if quick { 1 } else { 3 } {
            let m = stream_epochs(run.ds.clone(), opts.clone(), epochs)
                .with_context(|| format!("streaming {name}"))?;
            if best.as_ref().is_none_or(|b| m.wall < b.wall) {
                best = Some(m);
            }
        }
        let m = best.expect("at least one epoch");
        eprintln!(
            "  {:<22} {t} threads: {:.1} images/s",
            name,
            m.images_per_sec()
        );
        cells.push(format!("{:.1}", m.images_per_sec()));
        last = Some(m);
    }
    Ok((cells, last.expect("at least one thread count")))
}

/// Network storage at a typical per-GPU share.
const CAPPED_BYTES_PER_SEC: u64 = 200_000_000;

/// L3 region reads against whole files: bytes read per epoch and images/s from the page cache and through
/// the read layer's bandwidth cap (a model of network storage), beside PNG and JPEG on the same images.
fn bytes_read(
    r: &mut Report,
    formats: &[FormatEntry],
    threads: usize,
    quick: bool,
) -> anyhow::Result<()> {
    let mbps = CAPPED_BYTES_PER_SEC as f64 / 1e6;
    let capped_header = format!("images/s at {mbps:.0} MB/s");
    let mut table = Table::new(
        "Bytes read per epoch: L3 crops read only their patches",
        &[
            "format",
            "bytes read / epoch",
            "of the dataset",
            "images/s, page cache",
            &capped_header,
        ],
    );
    for f in formats {
        let Ok(ds) = &f.dataset else { continue };
        let opts = crop_options(threads, f.decode);
        let epochs = if quick { 1 } else { 3 };
        let cached = stream_epochs(ds.clone(), opts.clone(), epochs)
            .with_context(|| format!("streaming {}", f.name))?;
        let storage = loader::StorageOptions {
            bandwidth: Some(CAPPED_BYTES_PER_SEC),
            cache: None,
            ..Default::default()
        };
        let capped_ds = f
            .reopen(&storage)
            .with_context(|| format!("opening {} with a bandwidth cap", f.name))?;
        let capped = stream_epochs(capped_ds, opts, 1)
            .with_context(|| format!("streaming {} at {mbps} MB/s", f.name))?;
        let per_epoch = capped.stats.bytes_read;
        eprintln!(
            "  {:<22} {per_epoch} bytes/epoch, {:.1} images/s cached, {:.1} at {mbps} MB/s",
            f.name,
            cached.images_per_sec(),
            capped.images_per_sec()
        );
        table.row(vec![
            f.name.clone(),
            per_epoch.to_string(),
            format!(
                "{:.1}%",
                100.0 * per_epoch as f64 / ds.stored_bytes().max(1) as f64
            ),
            format!("{:.1}", cached.images_per_sec()),
            format!("{:.1}", capped.images_per_sec()),
        ]);
    }
    r.para(&format!(
        "The same datasets opened through the read layer with a {mbps:.0} MB/s cap (a token bucket shared by the \
         I/O threads: a model of network storage) and without (page cache), at {threads} decode threads. \
         \"L3, crop patches only\" reads each file's header and offset table, then only the byte ranges of \
         the patches under the 224×224 crop; the other rows read whole files."
    ));
    r.table(&table);
    Ok(())
}
