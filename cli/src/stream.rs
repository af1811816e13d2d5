//! `l3 stream DATASET ...` (issue: loader). `--sampler liquid` runs the same loader with
//! [`Order::Liquid`]: liquid-sampler's two-region shuffle buffers pick each batch and supply its bytes.
use anyhow::{Context, bail};
use loader::{
    Crop, Layout, Loader, LoaderOptions, LoaderState, Normalize, OpenOptions, Order, open_dataset,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct StreamArgs {
    /// Dataset: a folder of images, a Liquid multi-format dataset or a PCR dataset.
    pub dataset: PathBuf,
    /// Sampling order: `shuffle` (seeded) or `liquid` (two-region shuffle buffers).
    #[arg(long, default_value = "shuffle")]
    pub sampler: String,
    /// Memory budget in bytes for the Liquid shuffle buffers.
    #[arg(long)]
    pub budget: Option<u64>,
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Decode threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// Decode L3 on the GPU.
    #[arg(long)]
    pub gpu: bool,
    /// CSV, one line per delivered item: epoch,batch,item,format,cached
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// CSV, one line per batch: epoch,batch,disk_items,disk_bytes,wait_ms
    #[arg(long)]
    pub batch_log: Option<PathBuf>,
    /// PCR datasets: the scan group to read (1-based; default: all groups, full fidelity).
    #[arg(long)]
    pub group: Option<usize>,
    /// Image folders: labels from a `path,label` CSV instead of sub-folder names.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Sample size, `N` (square) or `HxW`.
    #[arg(long, default_value = "224")]
    pub size: String,
    /// `center` or `random` crop (images smaller than the size are padded).
    #[arg(long, default_value = "center")]
    pub crop: String,
    /// Random horizontal flips.
    #[arg(long)]
    pub flip: bool,
    /// Batch memory layout: `nhwc` or `nchw`.
    #[arg(long, default_value = "nhwc")]
    pub layout: String,
    /// Deliver f32 normalised with the ImageNet mean and std instead of u8.
    #[arg(long)]
    pub normalize: bool,
    /// I/O threads.
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
    /// Batches prepared ahead of the consumer.
    #[arg(long, default_value_t = 4)]
    pub prefetch: usize,
    /// Visit items in dataset order instead of shuffling.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Drop each epoch's last incomplete batch.
    #[arg(long)]
    pub drop_last: bool,
    /// Skip (and count) corrupt or missing items instead of stopping.
    #[arg(long)]
    pub skip_errors: bool,
    /// Simulated training step: sleep this long per batch.
    #[arg(long, default_value_t = 0)]
    pub step_ms: u64,
    /// Stop after this many batches and print the state to resume from.
    #[arg(long)]
    pub max_batches: Option<usize>,
    /// Resume from a state printed by an earlier run (`epoch=.. batch=.. ...`).
    #[arg(long)]
    pub resume: Option<String>,
}

pub fn run(a: StreamArgs) -> anyhow::Result<()> {
    let order = match a.sampler.as_str() {
        "shuffle" => Order::Seeded,
        "liquid" => Order::Liquid {
            budget_bytes: a
                .budget
                .context("--sampler liquid needs --budget BYTES (the shuffle buffers' memory)")?,
        },
        s => bail!("--sampler {s:?}: expected shuffle or liquid"),
    };
    let ds = open_dataset(
        &a.dataset,
        &OpenOptions {
            group: a.group,
            labels: a.labels.clone(),
        },
    )
    .with_context(|| format!("opening {}", a.dataset.display()))?;
    let (height, width) = parse_size(&a.size)?;
    let threads = a.threads.unwrap_or_else(all_cores);
    let opts = LoaderOptions {
        batch_size: a.batch,
        height,
        width,
        crop: match a.crop.as_str() {
            "center" => Crop::Center,
            "random" => Crop::Random,
            c => bail!("--crop {c:?}: expected center or random"),
        },
        hflip: a.flip,
        layout: match a.layout.as_str() {
            "nhwc" => Layout::Nhwc,
            "nchw" => Layout::Nchw,
            l => bail!("--layout {l:?}: expected nhwc or nchw"),
        },
        normalize: a.normalize.then_some(Normalize::IMAGENET),
        decode_threads: threads,
        io_threads: a.io_threads,
        prefetch: a.prefetch,
        seed: a.seed,
        shuffle: !a.no_shuffle,
        epochs: Some(a.epochs),
        rank: a.rank,
        world_size: a.world_size,
        drop_last: a.drop_last,
        skip_errors: a.skip_errors,
        gpu: a.gpu,
        order,
        ..LoaderOptions::default()
    };
    println!("stream: {}", ds.describe());
    println!(
        "  {} stored bytes; batch {} of {}x{}; {} decode + {} I/O threads; rank {} of {}; seed {}",
        ds.stored_bytes(),
        a.batch,
        height,
        width,
        threads,
        a.io_threads,
        a.rank,
        a.world_size,
        a.seed
    );
    let mut loader = match &a.resume {
        Some(s) => {
            let state: LoaderState = s.parse().context("--resume")?;
            Loader::resume(ds.clone(), opts, state)
        }
        None => Loader::new(ds.clone(), opts),
    }
    .with_context(|| format!("starting the loader on {}", a.dataset.display()))?;
    // Trace format names: a Liquid dataset's own manifest tags, the loader's format names otherwise.
    let liquid_tags: Option<Vec<&str>> = ds.liquid().map(|l| {
        l.manifest
            .items
            .iter()
            .map(|it| l.manifest.formats[it.format as usize].tag.as_str())
            .collect()
    });
    if let (Some(bp), Some(l)) = (loader.liquid_buffers(), ds.liquid()) {
        println!(
            "liquid: {} items in this shard ({} items, rank {} of {}), ratio {}, budget {} bytes: \
             {} items kept across epochs, hit ratio {:.4} (min(1, budget/dataset) = {:.4})",
            bp.items.iter().sum::<usize>(),
            l.manifest.items.len(),
            a.rank,
            a.world_size,
            l.manifest.ratio,
            bp.budget,
            bp.retained.iter().sum::<usize>(),
            bp.hit_ratio(),
            bp.target_hit_ratio()
        );
    }
    // Items delivered after the first epoch, and how many of them were still resident (Liquid order).
    let (mut later_items, mut later_cached) = (0u64, 0u64);
    let mut trace = a
        .trace
        .as_deref()
        .map(|p| Csv::create(p, "epoch,batch,item,format,cached"))
        .transpose()?;
    let mut batch_log = a
        .batch_log
        .as_deref()
        .map(|p| Csv::create(p, "epoch,batch,disk_items,disk_bytes,wait_ms"))
        .transpose()?;

    let t0 = Instant::now();
    let mut epoch_start = (loader.state().epoch, Instant::now(), 0u64);
    let step = Duration::from_millis(a.step_ms);
    for (n, b) in loader.by_ref().enumerate() {
        let b = b?;
        if b.epoch != epoch_start.0 {
            report_epoch(epoch_start.0, epoch_start.2, epoch_start.1.elapsed());
            epoch_start = (b.epoch, Instant::now(), 0);
        }
        epoch_start.2 += b.len() as u64;
        if let Some(t) = trace.as_mut() {
            for ((&i, f), &cached) in b.ids.iter().zip(&b.formats).zip(&b.cached) {
                let name = match &liquid_tags {
                    Some(tags) => tags[i],
                    None => f.name(),
                };
                t.line(format_args!(
                    "{},{},{},{name},{}",
                    b.epoch,
                    b.index,
                    ds.id(i),
                    u8::from(cached)
                ))?;
            }
        }
        if b.epoch > 0 {
            later_items += b.len() as u64;
            later_cached += b.cached.iter().filter(|&&c| c).count() as u64;
        }
        if let Some(l) = batch_log.as_mut() {
            l.line(format_args!(
                "{},{},{},{},{:.3}",
                b.epoch,
                b.index,
                b.disk_items,
                b.disk_bytes,
                b.wait.as_secs_f64() * 1e3
            ))?;
        }
        for (i, why) in &b.skipped {
            eprintln!("skipped item {i}: {why}");
        }
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        if a.max_batches.is_some_and(|m| n + 1 >= m) {
            break;
        }
    }
    report_epoch(epoch_start.0, epoch_start.2, epoch_start.1.elapsed());
    for f in [trace, batch_log].into_iter().flatten() {
        f.finish()?;
    }
    let s = loader.stats();
    let wall = t0.elapsed();
    println!(
        "done: {} batches, {} images ({} skipped) in {:.2} s",
        s.batches_delivered,
        s.items_delivered,
        s.items_skipped,
        wall.as_secs_f64()
    );
    println!(
        "  throughput: {:.1} images/s, {:.1} MB/s read ({:.1} Mpixel/s decoded)",
        s.images_per_sec(),
        s.mb_per_sec(),
        s.pixels_decoded as f64 / 1e6 / s.elapsed.as_secs_f64().max(1e-9)
    );
    println!(
        "  stage utilisation: I/O {:.0}% of {} threads, decode {:.0}% of {} threads, assembly {:.0}% of 1 thread",
        s.io_utilisation() * 100.0,
        s.io_threads,
        s.decode_utilisation() * 100.0,
        s.decode_threads,
        s.assemble_utilisation() * 100.0
    );
    println!(
        "  consumer wait: {:.3} s total ({:.0}% of wall time), {:.2} ms per batch",
        s.consumer_wait.as_secs_f64(),
        s.wait_fraction() * 100.0,
        s.consumer_wait.as_secs_f64() * 1e3 / s.batches_delivered.max(1) as f64
    );
    if loader.liquid_buffers().is_some() {
        println!(
            "  liquid: hit ratio {:.4} (epochs after the first: {later_cached} of {later_items} items \
             stayed in memory)",
            later_cached as f64 / later_items.max(1) as f64
        );
    }
    println!("  state: {}", loader.state());
    Ok(())
}

fn report_epoch(epoch: usize, images: u64, t: Duration) {
    println!(
        "epoch {epoch}: {images} images in {:.2} s ({:.1} images/s)",
        t.as_secs_f64(),
        images as f64 / t.as_secs_f64().max(1e-9)
    );
}

fn all_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn parse_size(s: &str) -> anyhow::Result<(u32, u32)> {
    let bad = || anyhow::anyhow!("--size {s:?}: expected N or HxW");
    let (h, w) = match s.split_once(['x', 'X']) {
        Some((h, w)) => (h.parse().map_err(|_| bad())?, w.parse().map_err(|_| bad())?),
        None => {
            let n = s.parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    if h == 0 || w == 0 {
        return Err(bad());
    }
    Ok((h, w))
}

/// A CSV file written under a temporary name and renamed when complete.
struct Csv {
    path: PathBuf,
    tmp: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl Csv {
    fn create(path: &Path, header: &str) -> anyhow::Result<Csv> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        let f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut c = Csv {
            path: path.to_path_buf(),
            tmp,
            out: std::io::BufWriter::new(f),
        };
        c.line(format_args!("{header}"))?;
        Ok(c)
    }
    fn line(&mut self, args: std::fmt::Arguments) -> anyhow::Result<()> {
        writeln!(self.out, "{args}").with_context(|| format!("writing {}", self.tmp.display()))
    }
    fn finish(mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("writing {}", self.path.display()))
    }
}
