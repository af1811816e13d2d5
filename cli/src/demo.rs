//! `l3 demo`: the main job. Builds (or takes) a dataset, converts it to every format, streams each for one
//! epoch through the same loader and prints one table.
use anyhow::Context;
use l3_cli::compare::{BuildPlan, Timer, build_formats, generate_default, stream_epoch};
use loader::{Crop, LoaderOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Run on these images instead of the built-in generated dataset.
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
    let t0 = Timer::start();
    match &a.data {
        None => {
            let bar = crate::convert::progress_bar(a.images as u64, "generating");
            generate_default(&png_dir, a.images, a.seed, threads, &|d, _| {
                bar.set_position(d as u64)
            })
            .context("generating the default dataset")?;
            bar.finish_and_clear();
            println!(
                "generated {} images (noise fields, landscapes, shapes, textures; half 1280x720, half 1920x1080) as PNG ({t0})",
                a.images,
            );
        }
        Some(dir) => {
            let n = loader::image_files(dir)?.files.len();
            let bar = crate::convert::progress_bar(n as u64, "-> png");
            let opts = loader::convert::ConvertOptions {
                threads,
                to_8bit: false,
            };
            let s = loader::convert::convert_folder(
                dir,
                &png_dir,
                loader::convert::Target::Png,
                &opts,
                &|d, _| bar.set_position(d as u64),
            )
            .with_context(|| format!("converting {} to PNG", dir.display()))?;
            bar.finish_and_clear();
            println!(
                "{}: {} images re-encoded as PNG ({} already there) ({t0})",
                dir.display(),
                s.converted + s.skipped,
                s.skipped,
            );
        }
    }
    let t0 = Timer::start();
    println!("converting ...");
    let plan = BuildPlan {
        threads,
        seed: a.seed,
        ..BuildPlan::default()
    };
    let formats = build_formats(&png_dir, &work, &plan, &|line| println!("{line}"));
    println!("conversions done ({t0}); streaming one epoch of each:");

    let opts = LoaderOptions {
        batch_size: a.batch,
        height: 224,
        width: 224,
        crop: Crop::Center,
        decode_threads: threads,
        seed: a.seed,
        ..LoaderOptions::default()
    };
    struct Row {
        name: String,
        result: Result<(u64, l3_cli::compare::Measured), String>,
    }
    let mut rows = Vec::new();
    for f in formats {
        let result = match f.dataset {
            Ok(ds) => {
                let bytes = ds.stored_bytes();
                let opts = LoaderOptions {
                    decode: f.decode,
                    ..opts.clone()
                };
                stream_epoch(ds, opts)
                    .map(|m| (bytes, m))
                    .map_err(|e| e.to_string())
            }
            Err(why) => Err(why),
        };
        match &result {
            Ok((_, m)) => println!("  {:<22} {:>8.1} images/s", f.name, m.images_per_sec()),
            Err(e) => println!("  {:<22} not measured: {e}", f.name),
        }
        rows.push(Row {
            name: f.name,
            result,
        });
    }

    let png_ips = rows
        .iter()
        .find(|r| r.name == "PNG")
        .and_then(|r| r.result.as_ref().ok())
        .map(|(_, m)| m.images_per_sec());
    println!();
    println!(
        "{:<22} {:>14} {:>10} {:>16} {:>16}",
        "format", "dataset bytes", "images/s", "CPU s / image", "speed-up vs PNG"
    );
    let mut notes = Vec::new();
    for r in &rows {
        match &r.result {
            Ok((bytes, m)) => {
                let speedup = png_ips.map_or("n/a".to_string(), |p| {
                    format!("{:.2}x", m.images_per_sec() / p)
                });
                println!(
                    "{:<22} {:>14} {:>10.1} {:>16.4} {:>16}",
                    r.name,
                    bytes,
                    m.images_per_sec(),
                    m.cpu_per_image().as_secs_f64(),
                    speedup
                );
            }
            Err(e) => {
                println!(
                    "{:<22} {:>14} {:>10} {:>16} {:>16}",
                    r.name, "-", "-", "-", "-"
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
         the datasets were just written, so they are read from the page cache: images/s measures decoding and the \
         pipeline, not the disk. PCR bytes are those read at that scan group.",
        rows.first()
            .and_then(|r| r.result.as_ref().ok())
            .map_or(0, |(_, m)| m.images),
        a.batch
    );
    println!("whole demo: {t_all}");
    Ok(())
}
