//! The pipeline: dispatcher → I/O threads → decode pool → assembler → bounded prefetch queue → consumer.
//!
//! Batches are numbered (epoch, batch) and their contents are a pure function of the options and the dataset,
//! however the threads interleave: the order comes from [`ShardedOrder`], per-item randomness (crop, flip)
//! from a generator keyed by (seed, epoch, item), and the assembler delivers batches strictly in sequence.
//! That is what makes [`Loader::state`] / [`Loader::resume`] exact.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::{Format, Image};
use crate::order::{ShardTail, ShardedOrder, SplitMix64};
use crate::stats::{Counters, Stats};
use crate::transform::{Crop, Layout, Normalize, Pixels, SampleSpec};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Everything a [`Loader`] can be asked to do. `LoaderOptions { batch_size: 64, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Items per batch (the last batch of an epoch may be smaller unless `drop_last`).
    pub batch_size: usize,
    /// Sample height and width: every item is cropped (or padded) to this size.
    pub height: u32,
    pub width: u32,
    pub crop: Crop,
    /// Mirror each sample left-right with probability 1/2.
    pub hflip: bool,
    pub layout: Layout,
    /// f32 output normalised per channel; `None` keeps u8 pixels.
    pub normalize: Option<Normalize>,
    /// Threads that decode and shape samples (default: every core).
    pub decode_threads: usize,
    /// Threads that read stored bytes.
    pub io_threads: usize,
    /// Finished batches kept ready ahead of the consumer.
    pub prefetch: usize,
    pub seed: u64,
    /// Seeded shuffling per epoch; `false` visits items in dataset order.
    pub shuffle: bool,
    /// Epochs to run; `None` runs until dropped.
    pub epochs: Option<usize>,
    pub rank: usize,
    pub world_size: usize,
    pub shard_tail: ShardTail,
    /// Drop each epoch's last, incomplete batch.
    pub drop_last: bool,
    /// Skip (and count) corrupt or missing items instead of failing the run.
    pub skip_errors: bool,
    /// Decode L3 items on the GPU through `l3-cuda`, a batch at a time.
    pub gpu: bool,
    /// Decode only the L3 patches under each sample's crop window (CPU path). L3 patches are independent,
    /// so a crop never pays for the pixels it throws away; the samples are identical either way.
    pub l3_window_decode: bool,
    /// Where the visiting order (and, for [`Order::Liquid`], the stored bytes) comes from.
    pub order: Order,
}

/// The sampling order of a [`Loader`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// [`ShardedOrder`]: a seeded permutation per epoch (or dataset order without `shuffle`), read item by
    /// item by the loader's I/O threads.
    #[default]
    Seeded,
    /// Liquid's two-region shuffle buffers (`liquid-sampler`'s runtime sampler), for a Liquid multi-format
    /// dataset ([`LiquidShards`](crate::LiquidShards)) only. Each batch is exactly the sampler's
    /// mini-batch — its items, their formats and whether they stayed resident from the previous epoch
    /// ([`Batch::cached`]) — and the item bytes come from the sampler's buffers, read with the page cache
    /// bypassed by its own I/O threads (`io_threads` of them); the decode pool and the assembler are the
    /// loader's. The disk traffic of a batch ([`Batch::disk_items`], [`Batch::disk_bytes`]) is the
    /// sampler's refill reads.
    ///
    /// Differences from [`Order::Seeded`]: the order is always shuffled (`shuffle: false` and `drop_last`
    /// are rejected), each rank's shard is fixed for the whole run (liquid-sampler's `shard`, so the
    /// buffers can keep it), and [`Loader::resume`] accepts only the start of the run: the shuffle
    /// buffers' contents are not part of [`LoaderState`], so a mid-run state is refused with
    /// [`Error::LiquidResume`].
    Liquid {
        /// Bytes the shuffle buffers of all formats may hold together: at least one slot (the largest
        /// item) per format, or the loader refuses to start; the more, the more items stay resident.
        budget_bytes: u64,
    },
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 32,
            height: 224,
            width: 224,
            crop: Crop::Center,
            hflip: false,
            layout: Layout::Nhwc,
            normalize: None,
            decode_threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            io_threads: 2,
            prefetch: 4,
            seed: 0,
            shuffle: true,
            epochs: Some(1),
            rank: 0,
            world_size: 1,
            shard_tail: ShardTail::Pad,
            drop_last: false,
            skip_errors: false,
            gpu: false,
            l3_window_decode: true,
            order: Order::Seeded,
        }
    }
}

/// Where a loader stands: the next batch it will deliver. Save it with a checkpoint and hand it to
/// [`Loader::resume`] to continue exactly there. Its `Display` form parses back with `FromStr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderState {
    pub epoch: usize,
    pub batch: usize,
    /// The configuration the position is valid for (checked on resume).
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    pub batch_size: usize,
    pub dataset_len: usize,
}

impl std::fmt::Display for LoaderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch={} batch={} seed={} rank={} world_size={} batch_size={} dataset_len={}",
            self.epoch,
            self.batch,
            self.seed,
            self.rank,
            self.world_size,
            self.batch_size,
            self.dataset_len
        )
    }
}

impl std::str::FromStr for LoaderState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut st = LoaderState {
            epoch: 0,
            batch: 0,
            seed: 0,
            rank: 0,
            world_size: 1,
            batch_size: 0,
            dataset_len: 0,
        };
        let bad = || Error::Resume(format!("unreadable state {s:?}"));
        for kv in s.split_whitespace() {
            let (k, v) = kv.split_once('=').ok_or_else(bad)?;
            let n: u64 = v.parse().map_err(|_| bad())?;
            match k {
                "epoch" => st.epoch = n as usize,
                "batch" => st.batch = n as usize,
                "seed" => st.seed = n,
                "rank" => st.rank = n as usize,
                "world_size" => st.world_size = n as usize,
                "batch_size" => st.batch_size = n as usize,
                "dataset_len" => st.dataset_len = n as usize,
                _ => return Err(bad()),
            }
        }
        Ok(st)
    }
}

/// One delivered batch: the pixel buffer plus, per sample, its label, dataset index and format.
#[derive(Clone, Debug)]
pub struct Batch {
    pub epoch: usize,
    /// Position of this batch within its epoch.
    pub index: usize,
    /// `[n, h, w, 3]` for NHWC or `[n, 3, h, w]` for NCHW.
    pub shape: [usize; 4],
    pub layout: Layout,
    pub pixels: Pixels,
    pub labels: Vec<u32>,
    /// Dataset indices of the samples, in buffer order.
    pub ids: Vec<usize>,
    pub formats: Vec<Format>,
    /// Per sample: whether its bytes stayed in memory from the previous epoch ([`Order::Liquid`]'s
    /// shuffle buffers); always `false` under [`Order::Seeded`].
    pub cached: Vec<bool>,
    /// Items and stored bytes read from disk for this batch.
    pub disk_items: usize,
    pub disk_bytes: u64,
    /// Items skipped from this batch (dataset index and reason), when skipping is on.
    pub skipped: Vec<(usize, String)>,
    /// How long the consumer waited for this batch.
    pub wait: Duration,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// Values (u8 or f32) per sample.
    pub fn sample_len(&self) -> usize {
        self.shape[1] * self.shape[2] * self.shape[3]
    }
}

/// Counts the pipeline threads still running, so callers (and tests) can see that dropping stops them.
#[derive(Clone, Debug, Default)]
pub struct ThreadMonitor(Arc<AtomicUsize>);

impl ThreadMonitor {
    pub fn alive(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct AliveGuard(Arc<AtomicUsize>);
impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An iterator of batches over a [`Dataset`], produced by background threads.
///
/// Dropping it stops and joins every thread (each finishes at most the item in hand).
pub struct Loader {
    rx: Option<Receiver<Result<Batch>>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    monitor: ThreadMonitor,
    started: Instant,
    next: LoaderState,
    batches_per_epoch: usize,
    /// How the Liquid order split its budget (`None` under the seeded order).
    liquid_buffers: Option<liquid_sampler::BufferPlan>,
    epochs: Option<usize>,
    io_threads: usize,
    decode_threads: usize,
    failed: bool,
}

struct Job {
    seq: u64,
    slot: usize,
    /// Items in this job's batch (the GPU stage gathers them all before decoding).
    batch_len: usize,
    index: usize,
    epoch: usize,
}

/// What the Liquid sampler says about a batch, beyond its items.
struct LiquidBatch {
    cached: Vec<bool>,
    disk_items: usize,
    disk_bytes: u64,
    /// The sampler failed to produce the batch: delivered in the batch's turn.
    failure: Option<Error>,
}

struct Read {
    job: Job,
    bytes: Result<Vec<u8>>,
}

enum AsmMsg {
    Start {
        seq: u64,
        epoch: usize,
        batch: usize,
        ids: Vec<usize>,
        liquid: Option<LiquidBatch>,
    },
    Done {
        seq: u64,
        slot: usize,
        read_ok: bool,
        disk_bytes: u64,
        sample: Result<Pixels>,
    },
}

impl Loader {
    /// Starts a loader at the beginning of epoch 0.
    pub fn new(dataset: Arc<dyn Dataset>, options: LoaderOptions) -> Result<Self> {
        let state = LoaderState {
            epoch: 0,
            batch: 0,
            seed: options.seed,
            rank: options.rank,
            world_size: options.world_size,
            batch_size: options.batch_size,
            dataset_len: dataset.len(),
        };
        Self::resume(dataset, options, state)
    }

    /// Starts a loader at a saved [`state`](Loader::state): it delivers exactly the batches an uninterrupted
    /// loader with the same options would have delivered from that point on.
    pub fn resume(dataset: Arc<dyn Dataset>, o: LoaderOptions, state: LoaderState) -> Result<Self> {
        if o.batch_size == 0 || o.height == 0 || o.width == 0 {
            return Err(Error::Options(
                "batch size, height and width must be at least 1".into(),
            ));
        }
        if o.world_size == 0 || o.rank >= o.world_size {
            return Err(Error::Options(format!(
                "rank {} of world size {}",
                o.rank, o.world_size
            )));
        }
        if o.decode_threads == 0 || o.io_threads == 0 || o.prefetch == 0 {
            return Err(Error::Options(
                "decode threads, I/O threads and prefetch must be at least 1".into(),
            ));
        }
        if dataset.is_empty() {
            return Err(Error::Options(format!(
                "empty dataset: {}",
                dataset.describe()
            )));
        }
        let check = |what: &str, a: u64, b: u64| {
            if a != b {
                Err(Error::Resume(format!(
                    "state has {what} {a}, options have {b}"
                )))
            } else {
                Ok(())
            }
        };
        check("seed", state.seed, o.seed)?;
        check("rank", state.rank as u64, o.rank as u64)?;
        check("world size", state.world_size as u64, o.world_size as u64)?;
        check("batch size", state.batch_size as u64, o.batch_size as u64)?;
        check(
            "dataset length",
            state.dataset_len as u64,
            dataset.len() as u64,
        )?;
        if o.gpu {
            crate::gpu::check_available(&*dataset)?;
        }
        let liquid = match o.order {
            Order::Seeded => None,
            Order::Liquid { budget_bytes } => {
                Some(liquid_sampler(&*dataset, &o, budget_bytes, &state)?)
            }
        };

        let order = ShardedOrder {
            len: dataset.len(),
            seed: o.seed,
            shuffle: o.shuffle,
            rank: o.rank,
            world_size: o.world_size,
            tail: o.shard_tail,
        };
        let per_rank = order.per_rank();
        let batches_per_epoch = if let Some((sampler, _)) = &liquid {
            sampler.batches_per_epoch()
        } else if o.drop_last {
            per_rank / o.batch_size
        } else {
            per_rank.div_ceil(o.batch_size)
        };
        if batches_per_epoch == 0 {
            return Err(Error::Options(format!(
                "no batch per epoch: {per_rank} items for this rank, batch size {} with drop_last",
                o.batch_size
            )));
        }
        if state.batch > batches_per_epoch {
            return Err(Error::Resume(format!(
                "batch {} is past the {batches_per_epoch} batches of an epoch",
                state.batch
            )));
        }
        let mut next = state;
        if next.batch == batches_per_epoch {
            next.epoch += 1;
            next.batch = 0;
        }

        let spec = SampleSpec {
            height: o.height,
            width: o.width,
            crop: o.crop,
            hflip: o.hflip,
            layout: o.layout,
            normalize: o.normalize,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let monitor = ThreadMonitor::default();
        // Items in flight between dispatcher and assembler: enough to keep every thread busy, and a hard cap
        // on the batches being assembled (credits) so a slow item cannot let the reorder buffer grow.
        let workers = o.decode_threads + o.io_threads;
        let (read_tx, read_rx) = bounded::<Job>(2 * workers + o.batch_size);
        let (decode_tx, decode_rx) = bounded::<Read>(2 * workers);
        let (asm_tx, asm_rx) = unbounded::<AsmMsg>();
        let (credit_tx, credit_rx) = bounded::<()>((2 * workers).div_ceil(o.batch_size) + 1);
        let (out_tx, out_rx) = bounded::<Result<Batch>>(o.prefetch);

        let mut threads = Vec::new();
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<()> {
            monitor.0.fetch_add(1, Ordering::SeqCst);
            let guard = AliveGuard(monitor.0.clone());
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let _guard = guard;
                    f()
                })
                .map_err(|e| Error::Pipeline(format!("cannot start a thread: {e}")))?;
            threads.push(h);
            Ok(())
        };

        let liquid_buffers = liquid.as_ref().map(|(s, _)| s.buffers().clone());
        if let Some((sampler, index_of)) = liquid {
            // The Liquid sampler's thread: its batches, bytes already in memory, go straight to the decode pool.
            let (stop, asm_tx, decode_tx, c) = (
                stop.clone(),
                asm_tx.clone(),
                decode_tx.clone(),
                counters.clone(),
            );
            let total = o.epochs.map(|e| e * batches_per_epoch);
            drop(read_tx);
            spawn(
                "l3-liquid".into(),
                Box::new(move || {
                    liquid_dispatch(
                        sampler, index_of, total, credit_tx, stop, asm_tx, decode_tx, c,
                    )
                }),
            )?;
        } else {
            // Dispatcher: walks the order, announces each batch to the assembler, hands its items to the
            // readers.
            let (stop, asm_tx, epochs, bs) = (stop.clone(), asm_tx.clone(), o.epochs, o.batch_size);
            let start = next;
            spawn(
                "l3-dispatch".into(),
                Box::new(move || {
                    let mut seq = 0u64;
                    let mut epoch = start.epoch;
                    let mut first = start.batch;
                    while epochs.is_none_or(|e| epoch < e) {
                        let items = order.epoch(epoch);
                        for batch in first..batches_per_epoch {
                            let ids: Vec<usize> =
                                items.iter().skip(batch * bs).take(bs).copied().collect();
                            if credit_tx.send(()).is_err() || stop.load(Ordering::Relaxed) {
                                return;
                            }
                            let n = ids.len();
                            let start_msg = AsmMsg::Start {
                                seq,
                                epoch,
                                batch,
                                ids: ids.clone(),
                                liquid: None,
                            };
                            if asm_tx.send(start_msg).is_err() {
                                return;
                            }
                            for (slot, index) in ids.into_iter().enumerate().take(n) {
                                if read_tx
                                    .send(Job {
                                        seq,
                                        slot,
                                        batch_len: n,
                                        index,
                                        epoch,
                                    })
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            seq += 1;
                        }
                        first = 0;
                        epoch += 1;
                    }
                }),
            )?;
        }
        // I/O threads (the Liquid sampler has its own).
        for t in 0..if o.order == Order::Seeded {
            o.io_threads
        } else {
            0
        } {
            let (ds, stop, rx, tx, c) = (
                dataset.clone(),
                stop.clone(),
                read_rx.clone(),
                decode_tx.clone(),
                counters.clone(),
            );
            spawn(
                format!("l3-io-{t}"),
                Box::new(move || {
                    while let Ok(job) = rx.recv() {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let t0 = Instant::now();
                        let bytes = ds.read(job.index);
                        Counters::add_time(&c.read_ns, t0);
                        if let Ok(b) = &bytes {
                            Counters::add(&c.items_read, 1);
                            Counters::add(&c.bytes_read, b.len() as u64);
                        }
                        if tx.send(Read { job, bytes }).is_err() {
                            return;
                        }
                    }
                }),
            )?;
        }
        drop((read_rx, decode_tx));
        // GPU stage (one thread, a batch per launch) or the CPU decode pool.
        if o.gpu {
            let (ds, stop, rx, tx, c) = (
                dataset.clone(),
                stop.clone(),
                decode_rx.clone(),
                asm_tx.clone(),
                counters.clone(),
            );
            let seed = o.seed;
            spawn(
                "l3-gpu".into(),
                Box::new(move || gpu_stage(ds, stop, rx, tx, c, spec, seed)),
            )?;
        }
        let window = o.l3_window_decode;
        for t in 0..if o.gpu { 0 } else { o.decode_threads } {
            let (ds, stop, rx, tx, c) = (
                dataset.clone(),
                stop.clone(),
                decode_rx.clone(),
                asm_tx.clone(),
                counters.clone(),
            );
            let seed = o.seed;
            spawn(
                format!("l3-decode-{t}"),
                Box::new(move || {
                    let mut img = Image::default();
                    let mut scratch = Vec::new();
                    while let Ok(Read { job, bytes }) = rx.recv() {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let t0 = Instant::now();
                        let read_ok = bytes.is_ok();
                        let disk_bytes = bytes.as_ref().map(|b| b.len() as u64).unwrap_or(0);
                        let sample = bytes
                            .and_then(|b| {
                                if window && ds.format(job.index) == Format::L3 {
                                    window_sample(
                                        &spec,
                                        &b,
                                        seed,
                                        &job,
                                        &ds,
                                        &mut img,
                                        &mut scratch,
                                    )
                                } else {
                                    ds.decode(job.index, &b, &mut img)?;
                                    shape_sample(&spec, &img, seed, job.epoch, job.index, &ds)
                                }
                            })
                            .inspect(|_| {
                                Counters::add(&c.items_decoded, 1);
                                Counters::add(
                                    &c.pixels_decoded,
                                    u64::from(img.width) * u64::from(img.height),
                                );
                            })
                            .map_err(|e| Error::Item {
                                index: job.index,
                                source: Box::new(e),
                            });
                        Counters::add_time(&c.decode_ns, t0);
                        let msg = AsmMsg::Done {
                            seq: job.seq,
                            slot: job.slot,
                            read_ok,
                            disk_bytes,
                            sample,
                        };
                        if tx.send(msg).is_err() {
                            return;
                        }
                    }
                }),
            )?;
        }
        drop((decode_rx, asm_tx));
        // Assembler: copies samples into batch buffers and delivers batches in sequence.
        {
            let (stop, c, ds) = (stop.clone(), counters.clone(), dataset.clone());
            let skip = o.skip_errors;
            spawn(
                "l3-assemble".into(),
                Box::new(move || assemble(asm_rx, out_tx, credit_rx, stop, c, ds, spec, skip)),
            )?;
        }

        Ok(Loader {
            rx: Some(out_rx),
            threads,
            stop,
            counters,
            monitor,
            started: Instant::now(),
            next,
            batches_per_epoch,
            liquid_buffers,
            epochs: o.epochs,
            io_threads: o.io_threads,
            decode_threads: o.decode_threads,
            failed: false,
        })
    }

    /// The position of the next batch this loader will deliver.
    pub fn state(&self) -> LoaderState {
        self.next
    }

    /// Batches per epoch for this rank.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches_per_epoch
    }

    /// Under [`Order::Liquid`]: the sampler's per-format buffers (slots, items kept across epochs, the hit
    /// ratio they give) for this rank's shard.
    pub fn liquid_buffers(&self) -> Option<&liquid_sampler::BufferPlan> {
        self.liquid_buffers.as_ref()
    }

    /// The counters so far (cheap; call it while iterating).
    pub fn stats(&self) -> Stats {
        self.counters
            .snapshot(self.started, self.io_threads, self.decode_threads)
    }

    /// Watches the pipeline threads (see [`ThreadMonitor::alive`]); stays valid after the loader is dropped.
    pub fn thread_monitor(&self) -> ThreadMonitor {
        self.monitor.clone()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.rx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.failed || self.epochs.is_some_and(|e| self.next.epoch >= e) {
            return None;
        }
        let rx = self.rx.as_ref()?;
        let t0 = Instant::now();
        let got = rx.recv();
        let wait = t0.elapsed();
        Counters::add(&self.counters.wait_ns, wait.as_nanos() as u64);
        match got {
            Ok(Ok(mut b)) => {
                b.wait = wait;
                Counters::add(&self.counters.batches_delivered, 1);
                Counters::add(&self.counters.items_delivered, b.len() as u64);
                self.next.batch = b.index + 1;
                self.next.epoch = b.epoch;
                if self.next.batch == self.batches_per_epoch {
                    self.next.epoch += 1;
                    self.next.batch = 0;
                }
                Some(Ok(b))
            }
            Ok(Err(e)) => {
                self.failed = true;
                self.shutdown();
                Some(Err(e))
            }
            Err(_) => {
                self.failed = true;
                self.shutdown();
                Some(Err(Error::Pipeline("a pipeline thread stopped".into())))
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Gathers each batch's reads, decodes them in one GPU launch, shapes the samples on the host.
fn gpu_stage(
    ds: Arc<dyn Dataset>,
    stop: Arc<AtomicBool>,
    rx: Receiver<Read>,
    tx: Sender<AsmMsg>,
    c: Arc<Counters>,
    spec: SampleSpec,
    seed: u64,
) {
    let mut gpu = crate::gpu::GpuDecoder::new();
    let mut gathering: BTreeMap<u64, Vec<Read>> = BTreeMap::new();
    let mut cpu_img = Image::default();
    while let Ok(read) = rx.recv() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (seq, want) = (read.job.seq, read.job.batch_len);
        let reads = gathering.entry(seq).or_default();
        reads.push(read);
        if reads.len() < want {
            continue;
        }
        let reads = gathering.remove(&seq).expect("present");
        let t0 = Instant::now();
        let files: Option<Vec<&[u8]>> = reads
            .iter()
            .map(|r| r.bytes.as_ref().ok().map(Vec::as_slice))
            .collect();
        let decoded = files.and_then(|f| gpu.decode(&f).ok());
        let mut msgs = Vec::with_capacity(reads.len());
        for (k, r) in reads.into_iter().enumerate() {
            let read_ok = r.bytes.is_ok();
            let disk_bytes = r.bytes.as_ref().map(|b| b.len() as u64).unwrap_or(0);
            let job = &r.job;
            let sample = match (&decoded, r.bytes) {
                (Some(imgs), _) => shape_sample(&spec, &imgs[k], seed, job.epoch, job.index, &ds),
                // The GPU refused the batch: decode on the CPU to find (and name) the culprit.
                (None, Ok(b)) => ds
                    .decode(job.index, &b, &mut cpu_img)
                    .and_then(|()| shape_sample(&spec, &cpu_img, seed, job.epoch, job.index, &ds)),
                (None, Err(e)) => Err(e),
            };
            if let (Some(imgs), true) = (&decoded, sample.is_ok()) {
                Counters::add(&c.items_decoded, 1);
                Counters::add(
                    &c.pixels_decoded,
                    u64::from(imgs[k].width) * u64::from(imgs[k].height),
                );
            }
            msgs.push(AsmMsg::Done {
                seq: job.seq,
                slot: job.slot,
                read_ok,
                disk_bytes,
                sample: sample.map_err(|e| Error::Item {
                    index: job.index,
                    source: Box::new(e),
                }),
            });
        }
        Counters::add_time(&c.decode_ns, t0);
        for m in msgs {
            if tx.send(m).is_err() {
                return;
            }
        }
    }
}

/// L3 items: decodes only the patches under the sample's window, then shapes the sample from it.
fn window_sample(
    spec: &SampleSpec,
    bytes: &[u8],
    seed: u64,
    job: &Job,
    ds: &Arc<dyn Dataset>,
    img: &mut Image,
    scratch: &mut Vec<u8>,
) -> Result<Pixels> {
    let mut rng = SplitMix64::keyed(seed, job.epoch as u64, job.index as u64);
    let mut placed = None;
    crate::image::decode_l3_window(
        bytes,
        &ds.source(job.index),
        |w, h| {
            let p = spec.placement(w, h, &mut rng);
            placed = Some(p);
            (p.sx, p.sy, p.w, p.h)
        },
        img,
        scratch,
    )?;
    let p = placed.expect("the window was placed");
    // The decoded window starts at the crop's corner.
    let p = crate::transform::Placement { sx: 0, sy: 0, ..p };
    Ok(write_sample(spec, img, &p))
}

fn write_sample(spec: &SampleSpec, img: &Image, p: &crate::transform::Placement) -> Pixels {
    match &spec.normalize {
        None => {
            let mut v = vec![0u8; spec.sample_len()];
            spec.write_u8(img, p, &mut v);
            Pixels::U8(v)
        }
        Some(n) => {
            let mut v = vec![0f32; spec.sample_len()];
            spec.write_f32(img, p, &mut v, n);
            Pixels::F32(v)
        }
    }
}

fn shape_sample(
    spec: &SampleSpec,
    img: &Image,
    seed: u64,
    epoch: usize,
    index: usize,
    ds: &Arc<dyn Dataset>,
) -> Result<Pixels> {
    if img.width == 0 || img.height == 0 || !(1..=4).contains(&img.channels) {
        return Err(Error::decode(
            ds.source(index),
            ds.format(index).name(),
            format!(
                "unusable image {}x{}x{}",
                img.width, img.height, img.channels
            ),
        ));
    }
    let mut rng = SplitMix64::keyed(seed, epoch as u64, index as u64);
    let p = spec.placement(img.width, img.height, &mut rng);
    Ok(write_sample(spec, img, &p))
}

struct Partial {
    epoch: usize,
    batch: usize,
    ids: Vec<usize>,
    cached: Vec<bool>,
    pixels: Pixels,
    filled: Vec<bool>,
    remaining: usize,
    disk_items: usize,
    disk_bytes: u64,
    /// The disk traffic came with the batch (Liquid sampler) rather than from counting its reads.
    disk_known: bool,
    skipped: Vec<(usize, String)>,
    /// The first failure of a batch, reported when the batch's turn comes (not before earlier batches).
    error: Option<Error>,
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    rx: Receiver<AsmMsg>,
    out: Sender<Result<Batch>>,
    credits: Receiver<()>,
    stop: Arc<AtomicBool>,
    c: Arc<Counters>,
    ds: Arc<dyn Dataset>,
    spec: SampleSpec,
    skip: bool,
) {
    let sample_len = spec.sample_len();
    let mut pending: BTreeMap<u64, Partial> = BTreeMap::new();
    let mut next_seq = 0u64;
    loop {
        let msg = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        match msg {
            AsmMsg::Start {
                seq,
                epoch,
                batch,
                ids,
                liquid,
            } => {
                let n = ids.len();
                let pixels = match spec.normalize {
                    None => Pixels::U8(vec![0; n * sample_len]),
                    Some(_) => Pixels::F32(vec![0.0; n * sample_len]),
                };
                let (cached, disk, error) = match liquid {
                    Some(l) => (l.cached, Some((l.disk_items, l.disk_bytes)), l.failure),
                    None => (vec![false; n], None, None),
                };
                pending.insert(
                    seq,
                    Partial {
                        epoch,
                        batch,
                        ids,
                        cached,
                        pixels,
                        filled: vec![false; n],
                        remaining: n,
                        disk_items: disk.map_or(0, |d| d.0),
                        disk_bytes: disk.map_or(0, |d| d.1),
                        disk_known: disk.is_some(),
                        skipped: Vec::new(),
                        error,
                    },
                );
            }
            AsmMsg::Done {
                seq,
                slot,
                read_ok,
                disk_bytes,
                sample,
            } => {
                let t0 = Instant::now();
                let Some(p) = pending.get_mut(&seq) else {
                    continue;
                };
                if !p.disk_known {
                    p.disk_items += usize::from(read_ok);
                    p.disk_bytes += disk_bytes;
                }
                p.remaining -= 1;
                match sample {
                    Ok(s) => {
                        p.filled[slot] = true;
                        let dst = slot * sample_len..(slot + 1) * sample_len;
                        match (&mut p.pixels, s) {
                            (Pixels::U8(d), Pixels::U8(s)) => d[dst].copy_from_slice(&s),
                            (Pixels::F32(d), Pixels::F32(s)) => d[dst].copy_from_slice(&s),
                            _ => unreachable!("every sample has the batch's dtype"),
                        }
                    }
                    Err(e) if skip => {
                        Counters::add(&c.items_skipped, 1);
                        p.skipped.push((p.ids[slot], e.to_string()));
                    }
                    Err(e) => {
                        p.error.get_or_insert(e);
                    }
                }
                Counters::add_time(&c.assemble_ns, t0);
            }
        }
        // Deliver every finished batch that is next in sequence.
        while pending.get(&next_seq).is_some_and(|p| p.remaining == 0) {
            let p = pending.remove(&next_seq).expect("checked above");
            next_seq += 1;
            if let Some(e) = p.error {
                stop.store(true, Ordering::SeqCst);
                let _ = out.send(Err(e));
                return;
            }
            let batch = finish(p, &spec, &*ds);
            if out.send(Ok(batch)).is_err() {
                return;
            }
            // Free one credit so the dispatcher may start another batch.
            if credits.recv().is_err() {
                return;
            }
        }
    }
}

fn finish(mut p: Partial, spec: &SampleSpec, ds: &dyn Dataset) -> Batch {
    let sample_len = spec.sample_len();
    if p.filled.iter().any(|f| !f) {
        // Compact: keep the samples that decoded, in order.
        let keep: Vec<usize> = (0..p.ids.len()).filter(|&i| p.filled[i]).collect();
        fn compact<T: Copy>(v: &mut Vec<T>, keep: &[usize], len: usize) {
            for (to, &from) in keep.iter().enumerate() {
                v.copy_within(from * len..(from + 1) * len, to * len);
            }
            v.truncate(keep.len() * len);
        }
        match &mut p.pixels {
            Pixels::U8(v) => compact(v, &keep, sample_len),
            Pixels::F32(v) => compact(v, &keep, sample_len),
        }
        p.ids = keep.iter().map(|&i| p.ids[i]).collect();
        p.cached = keep.iter().map(|&i| p.cached[i]).collect();
    }
    let n = p.ids.len();
    let (h, w) = (spec.height as usize, spec.width as usize);
    Batch {
        epoch: p.epoch,
        index: p.batch,
        shape: match spec.layout {
            Layout::Nhwc => [n, h, w, 3],
            Layout::Nchw => [n, 3, h, w],
        },
        layout: spec.layout,
        pixels: p.pixels,
        labels: p.ids.iter().map(|&i| ds.label(i)).collect(),
        formats: p.ids.iter().map(|&i| ds.format(i)).collect(),
        ids: p.ids,
        cached: p.cached,
        disk_items: p.disk_items,
        disk_bytes: p.disk_bytes,
        skipped: p.skipped,
        wait: Duration::ZERO,
    }
}

/// Liquid items are found by where they are stored (unique per item, unlike caller-chosen ids).
type LiquidIndex = std::collections::HashMap<(u32, u64), usize>;

/// Opens liquid-sampler's runtime sampler for a [`Order::Liquid`] loader, after checking the options it
/// cannot honour.
fn liquid_sampler(
    dataset: &dyn Dataset,
    o: &LoaderOptions,
    budget_bytes: u64,
    state: &LoaderState,
) -> Result<(liquid_sampler::LiquidSampler, LiquidIndex)> {
    let Some(ds) = dataset.liquid() else {
        return Err(Error::Options(format!(
            "the Liquid order needs a Liquid multi-format dataset, not {}",
            dataset.describe()
        )));
    };
    if !o.shuffle || o.drop_last {
        return Err(Error::Options(
            "the Liquid order always shuffles and keeps every epoch's last batch \
             (shuffle: false and drop_last are not supported)"
                .into(),
        ));
    }
    if (state.epoch, state.batch) != (0, 0) {
        return Err(Error::LiquidResume {
            epoch: state.epoch,
            batch: state.batch,
        });
    }
    let cfg = liquid_sampler::SamplerConfig {
        budget: budget_bytes,
        batch: o.batch_size,
        seed: o.seed,
        rank: o.rank,
        world_size: o.world_size,
        shard_policy: match o.shard_tail {
            ShardTail::Pad => liquid_sampler::ShardPolicy::Pad,
            ShardTail::Drop => liquid_sampler::ShardPolicy::DropTail,
        },
        io_threads: o.io_threads,
    };
    let index_of = ds
        .manifest
        .items
        .iter()
        .enumerate()
        .map(|(i, it)| ((it.location.file, it.location.offset), i))
        .collect();
    let sampler = liquid_sampler::LiquidSampler::new(ds.clone(), &cfg).map_err(|e| match e {
        liquid_sampler::Error::BudgetTooSmall { .. } | liquid_sampler::Error::BadSetting(_) => {
            Error::Options(format!("Liquid order on {}: {e}", ds.dir.display()))
        }
        e => Error::dataset(&ds.dir, e),
    })?;
    Ok((sampler, index_of))
}

/// The Liquid order's dispatcher: takes the sampler's batches in sequence (its I/O threads read ahead,
/// page cache bypassed), announces each to the assembler with its cached flags and disk traffic, and
/// hands the in-memory bytes of its items to the decode pool.
#[allow(clippy::too_many_arguments)]
fn liquid_dispatch(
    mut sampler: liquid_sampler::LiquidSampler,
    index_of: LiquidIndex,
    total: Option<usize>,
    credits: Sender<()>,
    stop: Arc<AtomicBool>,
    asm_tx: Sender<AsmMsg>,
    decode_tx: Sender<Read>,
    c: Arc<Counters>,
) {
    let dir = sampler.dataset().dir.clone();
    let mut seq = 0u64;
    while total.is_none_or(|t| (seq as usize) < t) {
        if credits.send(()).is_err() || stop.load(Ordering::Relaxed) {
            return;
        }
        let t0 = Instant::now();
        let got = sampler.next_batch();
        Counters::add_time(&c.read_ns, t0);
        let b = match got {
            Ok(b) => b,
            Err(e) => {
                let failure = Some(Error::dataset(&dir, e));
                let liquid = LiquidBatch {
                    cached: Vec::new(),
                    disk_items: 0,
                    disk_bytes: 0,
                    failure,
                };
                let _ = asm_tx.send(AsmMsg::Start {
                    seq,
                    epoch: 0,
                    batch: 0,
                    ids: Vec::new(),
                    liquid: Some(liquid),
                });
                return;
            }
        };
        Counters::add(&c.items_read, b.disk_items as u64);
        Counters::add(&c.bytes_read, b.disk_bytes);
        let ids: Option<Vec<usize>> = b
            .items
            .iter()
            .map(|d| {
                index_of
                    .get(&(d.item.location.file, d.item.location.offset))
                    .copied()
            })
            .collect();
        let Some(ids) = ids else {
            let failure = Some(Error::dataset(
                &dir,
                "the sampler delivered an item that is not in the manifest",
            ));
            let _ = asm_tx.send(AsmMsg::Start {
                seq,
                epoch: b.epoch,
                batch: b.index,
                ids: Vec::new(),
                liquid: Some(LiquidBatch {
                    cached: Vec::new(),
                    disk_items: 0,
                    disk_bytes: 0,
                    failure,
                }),
            });
            return;
        };
        let start = AsmMsg::Start {
            seq,
            epoch: b.epoch,
            batch: b.index,
            ids: ids.clone(),
            liquid: Some(LiquidBatch {
                cached: b.items.iter().map(|d| d.cached).collect(),
                disk_items: b.disk_items,
                disk_bytes: b.disk_bytes,
                failure: None,
            }),
        };
        if asm_tx.send(start).is_err() {
            return;
        }
        let n = ids.len();
        for (slot, (d, index)) in b.items.iter().zip(ids).enumerate() {
            let job = Job {
                seq,
                slot,
                batch_len: n,
                index,
                epoch: b.epoch,
            };
            let bytes = Ok(d.bytes.to_vec());
            if decode_tx.send(Read { job, bytes }).is_err() {
                return;
            }
        }
        seq += 1;
    }
}
