//! `l3 stream DATASET ...`: the loader run like a training loop, with its figures. `--sampler liquid`
//! runs the same loader with [`Order::Liquid`]: liquid-sampler's two-region shuffle buffers pick each batch
//! and supply its bytes.
use anyhow::{Context, bail};
use loader::clap_values::Choice;
use loader::{
    Batch, Crop, DType, Dataset, Device, Loader, LoaderOptions, LoaderState, Normalize, PerChannel,
    Settings, open_dataset,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct StreamArgs {
    /// Dataset: a folder of images, a Liquid multi-format dataset or a PCR dataset (local or s3://).
    pub dataset: PathBuf,
    /// The loader's options: the same names, values and defaults as Python's `l3toolkit.Loader`.
    #[command(flatten)]
    pub settings: Settings,
    /// Older spelling of --random-crop: `center` or `random`.
    #[arg(long = "crop", value_parser = Choice::<Crop>::default())]
    pub crop_mode: Option<Crop>,
    /// Shorthand for --mean/--std with the ImageNet statistics (and float32 unless --dtype says float16).
    #[arg(long)]
    pub normalize: bool,
    /// Shorthand for --device cuda:0.
    #[arg(long)]
    pub gpu: bool,
    /// CSV, one line per delivered item: epoch,batch,item,format,cached
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// CSV, one line per batch: epoch,batch,disk_items,disk_bytes,wait_ms
    #[arg(long)]
    pub batch_log: Option<PathBuf>,
    /// Simulated training step: sleep this long per batch.
    #[arg(long, default_value_t = 0)]
    pub step_ms: u64,
    /// Stop after this many batches and print the state to resume from.
    #[arg(long)]
    pub max_batches: Option<usize>,
    /// Resume from a state printed by an earlier run (one line of JSON, `{"epoch":..,"batch":..,...}`;
    /// the `epoch=.. batch=..` words of earlier versions too), or from the file `--state-file` wrote.
    #[arg(long)]
    pub resume: Option<String>,
    /// Keep the state to resume from in this file: written atomically every --state-every batches and at
    /// exit (an error exit too). After a crash, `--resume FILE` redelivers the batches since the last
    /// write: exactly once at checkpoints, at least once between them.
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// Batches between two writes of --state-file (each write is a small file, fsynced).
    #[arg(long, default_value_t = 10, requires = "state_file", value_parser = clap::value_parser!(u64).range(1..))]
    pub state_every: u64,
}

/// The state `--resume` names: the text of a state, or a file holding one (as `--state-file` writes).
fn resume_state(arg: &str) -> anyhow::Result<LoaderState> {
    let path = std::path::Path::new(arg);
    let text_given = arg.trim_start().starts_with('{') || arg.contains('=');
    if !text_given || path.is_file() {
        let text = stdx::fs::read_regular(path, 1 << 20).with_context(|| {
            format!(
                "--resume {}: neither a state ({{\"epoch\":..}}) nor a state file",
                stdx::Quoted(arg)
            )
        })?;
        let text = String::from_utf8_lossy(&text);
        return text
            .trim()
            .parse()
            .with_context(|| format!("--resume: the state in {}", path.display()));
    }
    arg.parse().context("--resume")
}

/// Writes `state` to `path` whole or not at all, as text `--resume` reads back.
/// Before any work: removes what killed runs left of the state file (temporaries of writers no longer
/// running), and checks that it can be written, so that a state file in a missing or read-only folder
/// is an error now rather than at the first checkpoint, after the work.
fn prepare_state_file(path: &std::path::Path) -> anyhow::Result<()> {
    let cannot = || format!("--state-file {}: cannot be written", path.display());
    stdx::fs::remove_stale_temps_of(path).with_context(cannot)?;
    // A temporary beside it, created and dropped (so removed): the folder exists and takes files.
    drop(stdx::fs::AtomicFile::create(path).with_context(cannot)?);
    Ok(())
}

fn save_state(path: &std::path::Path, state: &LoaderState) -> anyhow::Result<()> {
    stdx::fs::write_atomic(path, format!("{state}\n").as_bytes())
        .with_context(|| format!("writing the state to {}", path.display()))
}

impl StreamArgs {
    /// The settings with the older spellings applied; a contradiction between an old and a new spelling
    /// is refused rather than one silently winning.
    fn settings(&self) -> anyhow::Result<Settings> {
        let mut s = self.settings.clone();
        if let Some(crop) = self.crop_mode {
            let random = crop == Crop::Random;
            if s.random_crop && !random {
                bail!("--crop center contradicts --random-crop");
            }
            s.random_crop = random;
        }
        if self.normalize {
            if s.mean.is_some() || s.std.is_some() {
                bail!("--normalize (the ImageNet statistics) contradicts --mean/--std: give one");
            }
            s.mean = Some(PerChannel(Normalize::IMAGENET.mean));
            s.std = Some(PerChannel(Normalize::IMAGENET.std));
            if s.dtype == DType::U8 {
                s.dtype = DType::F32;
            }
        }
        if self.gpu {
            match s.device {
                Device::Cpu => s.device = Device::Cuda(0),
                Device::Cuda(_) => {}
            }
        }
        Ok(s)
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
    let settings = a.settings()?;
    let (mut opts, open) = settings.resolve()?;
    // One run of `l3 stream` is one iteration: one epoch unless --epochs says more.
    opts.epochs.get_or_insert(1);
    // Outputs are checked before any work: a run must not fail only after a whole epoch.
    let mut logs = Logs::create(&a)?;
    if let Some(path) = &a.state_file {
        prepare_state_file(path)?;
    }
    let ds = open_dataset(&a.dataset, &open)
        .with_context(|| format!("opening {}", a.dataset.display()))?;
    for w in ds.warnings() {
        eprintln!("l3: warning: {w}");
    }
    let size = print_plan(&*ds, &opts);
    let device = opts.device;
    let mut loader = start_loader(&a, &ds, opts)?;
    print_liquid_buffers(&loader, &*ds);
    let mut tally = Tally::new(loader.state().epoch);
    let t0 = Instant::now();
    // The state file is written at exit whatever ends the run: the last delivered batch is the position.
    let mut last_saved = None;
    let result = deliver(
        &a,
        &mut loader,
        &*ds,
        &mut logs,
        &mut tally,
        &mut last_saved,
    );
    let saved = match &a.state_file {
        Some(path) if last_saved != Some(loader.state()) => save_state(path, &loader.state()),
        _ => Ok(()),
    };
    result?;
    saved?;
    report_epoch(tally.epoch);
    logs.finish()?;
    print_summary(&loader, &*ds, device, &tally, &size, t0.elapsed());
    Ok(())
}

/// Prints what the run reads and how; returns the sample size in words.
fn print_plan(ds: &dyn Dataset, opts: &LoaderOptions) -> String {
    let size = match opts.sample.recipe.option() {
        Some(("crop", whole)) => {
            format!("whole images ({})", whole.replacen("none", "crop none", 1))
        }
        _ => format!("{}x{}", opts.sample.height, opts.sample.width),
    };
    println!("stream: {}", ds.describe());
    println!(
        "  {} stored bytes; batch {} of {}; {} decode + {} I/O threads; rank {} of {}; seed {}",
        ds.stored_bytes(),
        opts.batch_size,
        size,
        opts.decode_threads,
        opts.io_threads,
        opts.rank,
        opts.world_size,
        opts.seed
    );
    size
}

/// The loader at the start of epoch 0, or where `--resume` says.
fn start_loader(
    a: &StreamArgs,
    ds: &Arc<dyn Dataset>,
    opts: LoaderOptions,
) -> anyhow::Result<Loader> {
    match &a.resume {
        Some(s) => {
            let state = resume_state(s)?;
            if state.fingerprint.is_none() {
                eprintln!(
                    "l3: warning: --resume: the state names no dataset (it comes from a build before \
                     state version 3): only the dataset's length is checked"
                );
            }
            Loader::resume(ds.clone(), opts, state)
        }
        None => Loader::new(ds.clone(), opts),
    }
    .with_context(|| format!("starting the loader on {}", a.dataset.display()))
}

/// Under the Liquid order: the sampler's buffers for this rank's shard.
fn print_liquid_buffers(loader: &Loader, ds: &dyn Dataset) {
    let (Some(bp), Some(l)) = (loader.liquid_buffers(), ds.liquid()) else {
        return;
    };
    let state = loader.state();
    println!(
        "liquid: {} items in this shard ({} items, rank {} of {}), ratio {}, budget {} bytes: \
         {} items kept across epochs, hit ratio {:.4} (min(1, budget/dataset) = {:.4})",
        bp.items.iter().sum::<usize>(),
        l.manifest.items.len(),
        state.rank,
        state.world_size,
        l.manifest.ratio,
        bp.budget,
        bp.retained.iter().sum::<usize>(),
        bp.hit_ratio(),
        bp.target_hit_ratio()
    );
}

/// The `--trace` and `--batch-log` files, and the format names the trace gives items.
struct Logs {
    trace: Option<Csv>,
    batch_log: Option<Csv>,
}

impl Logs {
    fn create(a: &StreamArgs) -> anyhow::Result<Logs> {
        let trace = a
            .trace
            .as_deref()
            .map(|p| Csv::create(p, "epoch,batch,item,format,cached"))
            .transpose()?;
        let batch_log = a
            .batch_log
            .as_deref()
            .map(|p| Csv::create(p, "epoch,batch,disk_items,disk_bytes,wait_ms"))
            .transpose()?;
        Ok(Logs { trace, batch_log })
    }

    /// One delivered batch's lines, handed to the OS before the next batch is taken. Trace format
    /// names: a Liquid dataset's own manifest tags, the loader's format names otherwise.
    fn record(&mut self, ds: &dyn Dataset, b: &Batch) -> anyhow::Result<()> {
        if let Some(t) = self.trace.as_mut() {
            let liquid = ds.liquid();
            for ((&i, f), &cached) in b.ids.iter().zip(&b.formats).zip(&b.cached) {
                let name = match liquid {
                    Some(l) => l.manifest.formats[l.manifest.items[i].format as usize]
                        .tag
                        .as_str(),
                    None => f.name(),
                };
                t.record([
                    b.epoch.to_string(),
                    b.index.to_string(),
                    ds.id(i).to_string(),
                    name.to_string(),
                    u8::from(cached).to_string(),
                ])?;
            }
        }
        if let Some(l) = self.batch_log.as_mut() {
            l.record([
                b.epoch.to_string(),
                b.index.to_string(),
                b.disk_items.to_string(),
                b.disk_bytes.to_string(),
                format!("{:.3}", b.wait.as_secs_f64() * 1e3),
            ])?;
        }
        for f in [self.trace.as_mut(), self.batch_log.as_mut()]
            .into_iter()
            .flatten()
        {
            f.flush()?;
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        for f in [self.trace, self.batch_log].into_iter().flatten() {
            f.finish()?;
        }
        Ok(())
    }
}

/// What the run delivered besides the loader's own counters.
struct Tally {
    /// The current epoch: its number, start, images and bytes read.
    epoch: (usize, Instant, u64, u64),
    /// Items delivered after the first epoch, and how many of them were still resident (Liquid order).
    later_items: u64,
    later_cached: u64,
    /// Masks and boxes delivered (with --masks / --boxes), and whether the masks are 16-bit.
    masks: usize,
    boxes: usize,
    wide: bool,
}

impl Tally {
    fn new(epoch: usize) -> Tally {
        Tally {
            epoch: (epoch, Instant::now(), 0, 0),
            later_items: 0,
            later_cached: 0,
            masks: 0,
            boxes: 0,
            wide: false,
        }
    }

    /// Counts batch `b`, reporting the epoch it ends first.
    fn count(&mut self, b: &Batch) {
        if b.epoch != self.epoch.0 {
            report_epoch(self.epoch);
            self.epoch = (b.epoch, Instant::now(), 0, 0);
        }
        self.epoch.2 += b.len() as u64;
        self.epoch.3 += b.disk_bytes;
        if let Some(m) = &b.masks {
            self.masks += m.shape()[0];
            self.wide = m.is_wide();
        }
        self.boxes += b.boxes.iter().flatten().map(Vec::len).sum::<usize>();
        if b.epoch > 0 {
            self.later_items += b.len() as u64;
            self.later_cached += b.cached.iter().filter(|&&c| c).count() as u64;
        }
    }
}

/// Takes the loader's batches as a training loop would (`--step-ms` apart, up to `--max-batches`),
/// logging each and writing the state file every `--state-every` batches (`last_saved`: the last
/// state written).
fn deliver(
    a: &StreamArgs,
    loader: &mut Loader,
    ds: &dyn Dataset,
    logs: &mut Logs,
    tally: &mut Tally,
    last_saved: &mut Option<LoaderState>,
) -> anyhow::Result<()> {
    let step = Duration::from_millis(a.step_ms);
    let mut n = 0usize;
    #[allow(clippy::while_let_on_iterator)] // the loop reads the loader's state between batches
    while let Some(b) = loader.next() {
        let b = b?;
        n += 1;
        tally.count(&b);
        logs.record(ds, &b)?;
        for (i, why) in &b.skipped {
            eprintln!("skipped item {i}: {why}");
        }
        if let Some(path) = &a.state_file
            && (n as u64).is_multiple_of(a.state_every)
        {
            let state = loader.state();
            save_state(path, &state)?;
            *last_saved = Some(state);
        }
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        if a.max_batches.is_some_and(|m| n >= m) {
            break;
        }
    }
    Ok(())
}

/// The run's figures: throughput, reads, storage and cache, GPU, stage utilisation, consumer wait, and
/// the state to resume from.
fn print_summary(
    loader: &Loader,
    ds: &dyn Dataset,
    device: Device,
    tally: &Tally,
    size: &str,
    wall: Duration,
) {
    let s = loader.stats();
    println!(
        "done: {} batches, {} images ({} skipped) in {:.2} s",
        s.batches_delivered,
        s.items_delivered,
        s.items_skipped,
        wall.as_secs_f64()
    );
    if tally.masks > 0 || tally.boxes > 0 {
        println!(
            "  targets: {} masks of {size} {}, {} boxes",
            tally.masks,
            if tally.wide { "uint16" } else { "uint8" },
            tally.boxes
        );
    }
    if s.items_partial > 0 {
        println!(
            "  partial: {} images delivered with less than they store (a JPEG cut short, a PCR image below \
             its group)",
            s.items_partial
        );
    }
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
        print_storage(st);
    }
    if device.is_cuda() {
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
            "  liquid: hit ratio {:.4} (epochs after the first: {} of {} items stayed in memory)",
            tally.later_cached as f64 / tally.later_items.max(1) as f64,
            tally.later_cached,
            tally.later_items
        );
    }
    println!("  state: {}", loader.state());
}

/// The read layer's requests, bytes, retries and (remote) cache figures.
fn print_storage(st: &loader::Storage) {
    let c = st.stats();
    println!(
        "  storage: {} read requests, {} bytes from {}{}, {} retries",
        c.requests,
        c.bytes_read,
        st.root(),
        st.bandwidth()
            .map(|b| format!(" (capped at {:.0} MB/s)", b as f64 / 1e6))
            .unwrap_or_default(),
        c.retries
    );
    if st.is_remote() && c.cache_hits + c.cache_misses > 0 {
        println!(
            "  cache: {} hits, {} misses ({:.0}% hit rate), {} bytes from the cache, {} bad or stale \
             entries dropped and fetched again",
            c.cache_hits,
            c.cache_misses,
            c.cache_hit_rate() * 100.0,
            c.cache_hit_bytes,
            c.cache_dropped
        );
    }
}

fn report_epoch((epoch, started, images, bytes): (usize, Instant, u64, u64)) {
    let t = started.elapsed();
    println!(
        "epoch {epoch}: {images} images in {:.2} s ({:.1} images/s), {bytes} bytes read",
        t.as_secs_f64(),
        images as f64 / t.as_secs_f64().max(1e-9)
    );
}

/// A CSV log (the `csv` crate: names with commas or quotes are quoted), created (and so checked) before
/// the run starts and written as the run goes: each delivered batch's lines reach the file before the next
/// batch is taken, so a run that fails, is interrupted or is killed keeps the lines of every batch it
/// handed out. Temporaries that killed runs of older versions left beside it are removed.
struct Csv {
    path: PathBuf,
    out: csv::Writer<std::fs::File>,
}

impl Csv {
    fn create(path: &Path, header: &str) -> anyhow::Result<Csv> {
        if path.is_dir() {
            bail!("{}: is a folder; give a file name", path.display());
        }
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        stdx::fs::remove_stale_temps(dir.unwrap_or(Path::new(".")))
            .with_context(|| format!("cleaning up beside {}", path.display()))?;
        let f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut c = Csv {
            path: path.to_path_buf(),
            out: csv::WriterBuilder::new()
                .buffer_capacity(64 << 10)
                .from_writer(f),
        };
        c.record(header.split(','))?;
        c.flush()?;
        Ok(c)
    }

    fn record<I>(&mut self, fields: I) -> anyhow::Result<()>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.out
            .write_record(fields)
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Hands what is written so far to the OS (it survives this process, killed or not).
    fn flush(&mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Flushes and makes the file durable.
    fn finish(mut self) -> anyhow::Result<()> {
        self.flush()?;
        self.out
            .get_ref()
            .sync_all()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

#[derive(clap::Args)]
pub struct ShuffleReportArgs {
    /// Dataset: a folder of images or a PCR dataset (local or s3://).
    pub dataset: PathBuf,
    /// Epochs to measure over.
    #[arg(long = "report-epochs", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub report_epochs: u64,
    /// The loader's options (batch size, seed, world size, sampler, PCR window, ...), as `l3 stream`.
    #[command(flatten)]
    pub settings: Settings,
}

/// `l3 shuffle-report DATASET`: the order's statistics beside a uniform shuffle's, one line each.
pub fn shuffle_report(a: ShuffleReportArgs) -> anyhow::Result<()> {
    let (opts, open) = a.settings.resolve()?;
    let ds = open_dataset(&a.dataset, &open)
        .with_context(|| format!("opening {}", a.dataset.display()))?;
    let r = loader::shuffle_report(&*ds, &opts, a.report_epochs as usize)?;
    println!("shuffle report: {}", ds.describe());
    println!(
        "  {} items, batch {}, {} ranks, {} epochs{}",
        r.items,
        r.batch_size,
        r.world_size,
        r.epochs,
        r.window
            .map(|w| format!(", PCR window {w} records"))
            .unwrap_or_default()
    );
    println!(
        "{:<24} {:>10} {:>10}  meaning",
        "statistic", "order", "uniform"
    );
    for s in &r.stats {
        println!(
            "{:<24} {:>10.4} {:>10.4}  {}",
            s.name, s.order, s.uniform, s.meaning
        );
    }
    Ok(())
}
