//! `l3 liquid profile`: a thin shell over `loader::convert::to_liquid` (the profiler and writer of
//! `liquid-sampler` with the loader's decoders); this file only prints. `l3 stream DIR --sampler liquid`
//! runs through the loader (`stream.rs`, `loader::Order::Liquid`).

use anyhow::Context;
use loader::convert::{LiquidBuild, LiquidEvent, to_liquid};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum LiquidCommand {
    /// Profile IN_DIR's images (PNG, JPEG or L3), print each probe and the chosen ratio, and write the
    /// multi-format dataset (compressed + raw RGB) to OUT_DIR.
    Profile(ProfileArgs),
}

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Folder of images; images in sub-folders get one label per sub-folder (sorted by name).
    pub input: PathBuf,
    /// New dataset folder (must not already hold a Liquid dataset).
    pub output: PathBuf,
    /// Bytes the probe sample may hold in memory (both formats); default 256 MiB.
    #[arg(long)]
    pub budget: Option<u64>,
    /// Decode threads the training job grants the pipeline (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed for the probe sample and for which items are converted to raw.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Items in the probe sample (fewer if --budget says so).
    #[arg(long, default_value_t = 32)]
    pub probe_items: usize,
    /// Write the dataset at the fitted crossing (hundredths) rather than the paper's tenths.
    #[arg(long)]
    pub fitted: bool,
    /// Each probe measurement runs at least this many milliseconds.
    #[arg(long, default_value_t = 300)]
    pub probe_ms: u64,
    /// Profile for a job reading at this bandwidth in MB/s (10^6 bytes): the probes' loads go through the
    /// same cap as `l3 stream --storage-mbps`, so the ratio fits network storage of that speed.
    #[arg(long)]
    pub storage_mbps: Option<f64>,
}

pub fn run(c: LiquidCommand) -> anyhow::Result<()> {
    match c {
        LiquidCommand::Profile(a) => run_profile(a),
    }
}

pub fn run_profile(a: ProfileArgs) -> anyhow::Result<()> {
    let build = LiquidBuild {
        threads: a.threads.unwrap_or(0),
        io_threads: 2,
        seed: a.seed,
        probe_items: a.probe_items,
        probe_budget: a.budget.unwrap_or(256 << 20),
        probe_time: Duration::from_millis(a.probe_ms),
        fitted: a.fitted,
        reuse: false,
        bandwidth: crate::stream::bandwidth(a.storage_mbps)?,
    };
    let reads = match a.storage_mbps {
        Some(m) => format!("page cache bypassed, reads capped at {m} MB/s"),
        None => "page cache bypassed".into(),
    };
    let mut name = String::new();
    let mut n = 0;
    let report = to_liquid(&a.input, &a.output, &build, |event| match event {
        LiquidEvent::Start {
            images,
            probe_items,
            threads,
            formats,
        } => {
            name = format!("{formats}:raw");
            println!(
                "profiling {images} images from {} on {threads} decode threads ({probe_items} probe items, {reads})",
                a.input.display(),
            );
        }
        LiquidEvent::Probe(p) => {
            n += 1;
            println!(
                "probe {n}: ratio {} ({name})  load {:.1} images/s ({:.1} MB/s)  decode {:.1} images/s  -> {}",
                p.ratio,
                p.load_ips,
                p.load_mbps,
                p.decode_ips,
                if p.load_bound() {
                    "loading is slower"
                } else {
                    "decoding is slower"
                }
            );
        }
    })?;
    if let Some(prof) = &report.profile {
        let chosen_ips = prof
            .probes
            .iter()
            .find(|p| p.ratio == prof.chosen)
            .map_or(0.0, |p| p.pipeline_ips());
        println!(
            "chosen ratio {} ({name}), {chosen_ips:.1} images/s at its probe",
            prof.chosen
        );
        if let Some(f) = prof.fitted {
            println!(
                "fitted crossing {f} ({name}) from {} probes",
                prof.probes.len()
            );
        }
    }
    let ds = liquid_sampler::Dataset::open(&a.output)
        .with_context(|| format!("opening {}", a.output.display()))?;
    let counts = ds.counts();
    let parts: Vec<String> = ds
        .manifest
        .formats
        .iter()
        .zip(&counts)
        .map(|(f, c)| format!("{c} {}", f.tag))
        .collect();
    println!(
        "wrote {}: {} items ({}) at ratio {}, {:.1} MB, seed {}",
        a.output.display(),
        ds.manifest.items.len(),
        parts.join(", "),
        report.ratio,
        ds.item_bytes() as f64 / 1e6,
        a.seed
    );
    Ok(())
}
