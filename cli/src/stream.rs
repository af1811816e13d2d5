//! `l3 stream DATASET ...`: the loader run like a training loop, with its figures. `--sampler liquid`
//! runs the same loader with [`Order::Liquid`]: liquid-sampler's two-region shuffle buffers pick each batch
//! and supply its bytes.
use anyhow::{Context, bail};
use loader::{
    Crop, DType, DecodeScope, Device, Layout, Loader, LoaderOptions, LoaderState, Normalize,
    OpenOptions, Order, open_dataset,
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
    /// Decode L3 on the GPU (CUDA device 0) into device-resident batches (only the patches under each
    /// crop; crop, flip, layout, type and normalisation in the kernel); fails with the reason when no GPU
    /// can do it.
    #[arg(long)]
    pub gpu: bool,
    /// With --gpu: decode a batch the GPU fails on with the CPU instead of stopping (counted, logged once).
    #[arg(long)]
    pub gpu_fallback: bool,
    /// `region`: read and decode only what each crop covers where the format allows it (L3's patches under
    /// the crop); `whole`: whole images.
    #[arg(long, default_value = "region")]
    pub decode: String,
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
    /// Deliver floats normalised with the ImageNet mean and std (float32 unless --dtype says float16).
    #[arg(long)]
    pub normalize: bool,
    /// Element type: uint8, float16 or float32 (floats hold pixel/255 unless --normalize).
    #[arg(long)]
    pub dtype: Option<String>,
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
    #[command(flatten)]
    pub storage: StorageArgs,
    /// PCR datasets: records whose items are shuffled together (default 4).
    #[arg(long, default_value_t = 0)]
    pub pcr_window: usize,
}

/// How a dataset's bytes are read: shared by every command that opens one.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StorageArgs {
    /// Cap on read bandwidth in MB/s (10^6 bytes), shared by every reader: a model of network storage.
    #[arg(long)]
    pub storage_mbps: Option<f64>,
    /// A local cache of objects read from object storage (`s3://` datasets), for repeated epochs.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Bytes the cache may hold (e.g. 20G); least recently used entries go first.
    #[arg(long, default_value = "10G")]
    pub cache_limit: String,
}

impl StorageArgs {
    pub fn options(&self) -> anyhow::Result<loader::StorageOptions> {
        let bandwidth = bandwidth(self.storage_mbps)?;
        let cache = match &self.cache_dir {
            None => None,
            Some(dir) => Some(loader::CacheOptions {
                dir: dir.clone(),
                limit: stdx::mem::parse_size(&self.cache_limit).with_context(|| {
                    format!(
                        "--cache-limit {:?}: expected bytes such as 20G",
                        self.cache_limit
                    )
                })?,
            }),
        };
        Ok(loader::StorageOptions { bandwidth, cache })
    }
}

/// `--storage-mbps` in bytes per second.
pub fn bandwidth(mbps: Option<f64>) -> anyhow::Result<Option<u64>> {
    match mbps {
        None => Ok(None),
        Some(m) => match loader::StorageOptions::bytes_per_sec(m) {
            Some(b) => Ok(Some(b)),
            None => bail!("--storage-mbps {m}: expected a positive number of MB/s"),
        },
    }
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
    let decode = match a.decode.as_str() {
        "region" => DecodeScope::Region,
        "whole" => DecodeScope::Whole,
        d => bail!("--decode {d:?}: expected region or whole"),
    };
    let dtype = match (a.dtype.as_deref(), a.normalize) {
        (None, false) => DType::U8,
        (None, true) => DType::F32,
        (Some(d), _) => DType::parse(d)
            .with_context(|| format!("--dtype {d:?}: expected uint8, float16 or float32"))?,
    };
    // Outputs are checked before any work: a run must not fail only after a whole epoch.
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
    let ds = open_dataset(
        &a.dataset,
        &OpenOptions {
            group: a.group,
            labels: a.labels.clone(),
            storage: a.storage.options()?,
            pcr_window: a.pcr_window,
        },
    )
    .with_context(|| format!("opening {}", a.dataset.display()))?;
    for w in ds.warnings() {
        eprintln!("l3: warning: {w}");
    }
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
        layout: Layout::parse(&a.layout)
            .with_context(|| format!("--layout {:?}: expected nhwc or nchw", a.layout))?,
        dtype,
        normalize: a.normalize.then_some(Normalize::IMAGENET),
        decode,
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
        device: if a.gpu { Device::Cuda(0) } else { Device::Cpu },
        gpu_fallback: a.gpu_fallback,
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

    let t0 = Instant::now();
    let mut epoch_start = (loader.state().epoch, Instant::now(), 0u64, 0u64);
    let step = Duration::from_millis(a.step_ms);
    for (n, b) in loader.by_ref().enumerate() {
        let b = b?;
        if b.epoch != epoch_start.0 {
            report_epoch(epoch_start);
            epoch_start = (b.epoch, Instant::now(), 0, 0);
        }
        epoch_start.2 += b.len() as u64;
        epoch_start.3 += b.disk_bytes;
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
    report_epoch(epoch_start);
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
        "  read: {} bytes for {} items ({:.0} bytes per item)",
        s.bytes_read,
        s.items_read,
        s.bytes_read as f64 / s.items_read.max(1) as f64
    );
    if let Some(st) = ds.storage() {
        println!(
            "  storage: {} read requests, {} bytes from {}{}",
            st.requests(),
            st.bytes_read(),
            st.root(),
            st.bandwidth()
                .map(|b| format!(" (capped at {:.0} MB/s)", b as f64 / 1e6))
                .unwrap_or_default()
        );
    }
    if a.gpu {
        println!(
            "  gpu: {} batches decoded on the GPU into device memory, {} on the CPU after a GPU failure",
            s.gpu_batches, s.gpu_fallback_batches
        );
    }
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

fn report_epoch((epoch, started, images, bytes): (usize, Instant, u64, u64)) {
    let t = started.elapsed();
    println!(
        "epoch {epoch}: {images} images in {:.2} s ({:.1} images/s), {bytes} bytes read",
        t.as_secs_f64(),
        images as f64 / t.as_secs_f64().max(1e-9)
    );
}

fn all_cores() -> usize {
    stdx::parallel::threads(0)
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

/// A CSV file written under a temporary name and renamed when complete; created (and so checked) before
/// the run starts.
struct Csv {
    path: PathBuf,
    out: std::io::BufWriter<stdx::fs::AtomicFile>,
}

impl Csv {
    fn create(path: &Path, header: &str) -> anyhow::Result<Csv> {
        if path.is_dir() {
            bail!("{}: is a folder; give a file name", path.display());
        }
        let f = stdx::fs::AtomicFile::create(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut c = Csv {
            path: path.to_path_buf(),
            out: std::io::BufWriter::new(f),
        };
        c.line(format_args!("{header}"))?;
        Ok(c)
    }
    fn line(&mut self, args: std::fmt::Arguments) -> anyhow::Result<()> {
        writeln!(self.out, "{args}").with_context(|| format!("writing {}", self.path.display()))
    }
    fn finish(self) -> anyhow::Result<()> {
        let path = self.path;
        let f = self
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", path.display()))?;
        f.commit()
            .with_context(|| format!("writing {}", path.display()))
    }
}
