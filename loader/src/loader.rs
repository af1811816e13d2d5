//! The [`Loader`]: the composition of the pipeline's stages
//! (see [`crate::pipeline`]): order → read → decode (CPU threads or the GPU) → assemble → prefetch.
//!
//! Batches are numbered (epoch, batch) and their contents are a pure function of the options and the
//! dataset, however the threads interleave: the order comes from the seeded schedule, per-item randomness
//! (crop, flip) from a generator keyed by (seed, epoch, item), and the assembler delivers batches strictly
//! in sequence. That is what makes [`Loader::state`] / [`Loader::resume`] exact.

use crate::batch::Batch;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::memory::{HostMemory, Pool};
use crate::options::{LoaderOptions, Order};
use crate::pipeline::schedule::{LiquidTail, Part, Schedule, ShardedOrder};
use crate::pipeline::{Ctx, GpuDecoder, Job, ToAssembler, assemble, decode, open_gpu, order, read};
use crate::resume::{self, LoaderState, Start};
use crate::stats::{Counters, Stats};
use crate::targets::Targets;
use crossbeam_channel::{Receiver, RecvTimeoutError, bounded, unbounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vocab::Device;

/// Counts the pipeline threads still running, so callers (and tests) can see that dropping stops them.
#[derive(Clone, Debug, Default)]
pub struct ThreadMonitor(Arc<AtomicUsize>);

impl ThreadMonitor {
    pub fn alive(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The outcome of [`Loader::next_timeout`].
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // returned by value once per batch: boxing would cost more than it saves
pub enum Next {
    Batch(Result<Batch>),
    /// The run is over.
    End,
    /// No batch to deliver within the timeout (ask again): none arrived, or only one whose every item
    /// was skipped, which is never delivered.
    Pending,
}

/// An iterator of batches over a [`Dataset`], produced by background threads.
///
/// Dropping it stops and joins every thread (each finishes at most the item in hand).
pub struct Loader {
    rx: Option<Receiver<Result<Batch>>>,
    threads: Threads,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    started: Instant,
    next: LoaderState,
    batches_per_epoch: usize,
    /// The part of an epoch resumed at another shape, and its batches.
    part: Option<(usize, usize)>,
    liquid_buffers: Option<liquid_sampler::BufferPlan>,
    epochs: Option<usize>,
    io_threads: usize,
    decode_threads: usize,
    failed: bool,
    waited: Duration,
    /// The skipped items of batches not delivered because every item was skipped, for the next batch.
    carried_skips: Vec<(usize, String)>,
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
            remaining: None,
            contents: Some(LoaderState::contents_of(&options)),
            // Taken from the dataset when the run is planned.
            fingerprint: None,
        };
        Self::resume(dataset, options, state)
    }

    /// Starts a loader at a saved [`state`](Loader::state): it delivers exactly the batches an uninterrupted
    /// loader with the same options would have delivered from that point on.
    ///
    /// The world size and the batch size may differ from the state's (a job rescaled after a failure):
    /// the items of the interrupted epoch that no rank delivered yet are split among the new ranks, each
    /// delivered once, and the epochs after it run as if the job had started at the new shape. Ranks
    /// move in lockstep, so the state of any rank serves every rank. The seed and the dataset may not
    /// differ.
    pub fn resume(dataset: Arc<dyn Dataset>, o: LoaderOptions, state: LoaderState) -> Result<Self> {
        let targets = Targets::open(&*dataset, &o.targets, o.skip_errors)?.map(Arc::new);
        Self::resume_with(dataset, o, state, targets)
    }

    /// [`resume`](Self::resume) with targets already opened by [`Targets::open`] for this dataset and
    /// these options: what a caller that restarts a loader every epoch uses, so that the masks are listed
    /// and paired, and the boxes file read, once.
    pub fn resume_with(
        dataset: Arc<dyn Dataset>,
        o: LoaderOptions,
        state: LoaderState,
        targets: Option<Arc<Targets>>,
    ) -> Result<Self> {
        if targets.is_some() == o.targets.is_empty() {
            return Err(Error::Options(
                "the opened targets do not match the options' targets".into(),
            ));
        }
        // Masks the GPU cannot decode are refused by name before the device is even opened.
        #[cfg(feature = "gpu")]
        if let (true, Some(t)) = (o.device.is_cuda(), &targets) {
            crate::pipeline::gpu::check_masks(t, dataset.len())?;
        }
        let run = Run::plan(&*dataset, &o, state)?;
        let whole = o.sample.recipe.is_whole();
        let mask_pool = match &targets {
            Some(t) if t.has_masks() => {
                // Whole images have no size until decoded; bounded by max_size, their largest is checked.
                let bytes = t.mask_bytes((o.sample.width, o.sample.height)) as u64
                    * o.batch_size as u64
                    * u64::from(!whole || o.sample.whole_bound().is_some());
                let buffers = run.credits + o.prefetch + 1;
                stdx::mem::check(
                    bytes.saturating_mul(buffers as u64),
                    format!(
                        "mask buffers ({buffers} batches of {} x {}x{})",
                        o.batch_size, o.sample.height, o.sample.width
                    ),
                )?;
                Some(Pool::new(bytes as usize, buffers, HostMemory::Pageable))
            }
            _ => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let ctx = Ctx {
            ds: dataset.clone(),
            spec: o.sample,
            scope: o.decode,
            partial_images: o.partial_images,
            seed: o.seed,
            host_slots: run.gpu.is_none() || o.gpu_fallback,
            counters: counters.clone(),
            stop: stop.clone(),
            targets: targets.clone(),
        };
        let workers = o.decode_threads + o.io_threads;
        let (read_tx, read_rx) = bounded::<Job>(2 * workers + o.batch_size);
        let (decode_tx, decode_rx) = bounded::<Job>(2 * workers);
        let (asm_tx, asm_rx) = unbounded::<ToAssembler>();
        let (credit_tx, credit_rx) = bounded::<()>(run.credits);
        let (out_tx, out_rx) = bounded::<Result<Batch>>(o.prefetch);

        let mut threads = Threads::default();
        // Whole images are decoded at their own size and padded into their batch by the assembler: the
        // order stage hands out empty slots, and the batch memory goes to the assembler.
        let (pool, mask_pool, whole_pools) = if whole {
            let empty = Pool::new(0, 0, HostMemory::Pageable);
            let pools = assemble::WholePools {
                pixels: run.pool,
                masks: mask_pool,
            };
            (empty, None, Some(pools))
        } else {
            (run.pool, mask_pool, None)
        };
        let order = order::Dispatch {
            schedule: run.schedule,
            pool,
            mask_pool,
            ctx: ctx.clone(),
            credits: credit_tx,
            to_asm: asm_tx.clone(),
            to_read: read_tx,
            to_decode: decode_tx.clone(),
        };
        threads.spawn("l3-order", move || order.run())?;
        // Under the Liquid order the sampler's own readers fetch every item: no read stage.
        let readers = match o.order {
            Order::Seeded => o.io_threads,
            Order::Liquid { .. } => 0,
        };
        for t in 0..readers {
            let (ctx, rx, tx) = (ctx.clone(), read_rx.clone(), decode_tx.clone());
            threads.spawn(&format!("l3-read-{t}"), move || read::run(ctx, rx, tx))?;
        }
        drop((read_rx, decode_tx));
        match run.gpu {
            #[cfg(feature = "gpu")]
            Some(decoder) => {
                let stage = crate::pipeline::gpu::GpuStage {
                    ctx: ctx.clone(),
                    decoder,
                    fallback: o.gpu_fallback,
                };
                let (rx, tx) = (decode_rx.clone(), asm_tx.clone());
                threads.spawn("l3-gpu", move || stage.run(rx, tx))?;
            }
            #[cfg(not(feature = "gpu"))]
            Some(decoder) => match decoder {},
            None => {
                for t in 0..o.decode_threads {
                    let (ctx, rx, tx) = (ctx.clone(), decode_rx.clone(), asm_tx.clone());
                    threads.spawn(&format!("l3-decode-{t}"), move || decode::run(ctx, rx, tx))?;
                }
            }
        }
        drop((decode_rx, asm_tx));
        let asm = assemble::Assembler::new(
            ctx.spec,
            o.skip_errors,
            dataset,
            counters.clone(),
            targets,
            whole_pools,
        );
        let stop2 = stop.clone();
        threads.spawn("l3-assemble", move || {
            assemble::run(asm, asm_rx, out_tx, credit_rx, stop2)
        })?;
        Ok(Loader {
            rx: Some(out_rx),
            threads,
            stop,
            counters,
            started: Instant::now(),
            next: run.next,
            batches_per_epoch: run.batches_per_epoch,
            part: run.part.map(|p| (p.epoch, p.batches)),
            liquid_buffers: run.liquid_buffers,
            epochs: o.epochs,
            io_threads: o.io_threads,
            decode_threads: o.decode_threads,
            failed: false,
            waited: Duration::ZERO,
            carried_skips: Vec::new(),
        })
    }

    /// The position of the next batch this loader will deliver.
    pub fn state(&self) -> LoaderState {
        self.next.clone()
    }

    /// Batches per epoch for this rank.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches_per_epoch
    }

    /// The batches left of the epoch the next batch belongs to, then `None`: one epoch per loop, as
    /// Python's `for batch in loader` runs it. After a resume at another world size or batch size that
    /// is the rest of the saved epoch, whose batches are not [`batches_per_epoch`](Self::batches_per_epoch)'s.
    pub fn rest_of_epoch(&mut self) -> RestOfEpoch<'_> {
        RestOfEpoch {
            epoch: self.next.epoch,
            loader: self,
        }
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
        self.threads.monitor.clone()
    }

    /// The next batch if one arrives within `timeout` — for callers that must stay responsive while they
    /// wait (a Python binding checking for Ctrl-C).
    pub fn next_timeout(&mut self, timeout: Duration) -> Next {
        if self.failed || self.epochs.is_some_and(|e| self.next.epoch >= e) {
            return Next::End;
        }
        let Some(rx) = self.rx.as_ref() else {
            return Next::End;
        };
        let t0 = Instant::now();
        let got = rx.recv_timeout(timeout);
        self.waited += t0.elapsed();
        let got = match got {
            Err(RecvTimeoutError::Timeout) => match self.threads.first_panic() {
                // A thread that died may leave the others waiting on it for ever: stop here, naming it.
                Some(why) => return self.stopped_by(why),
                None => return Next::Pending,
            },
            Ok(b) => b,
            Err(RecvTimeoutError::Disconnected) => {
                let why = self.threads.first_panic();
                return self.stopped_by(why.unwrap_or_else(|| "a pipeline thread stopped".into()));
            }
        };
        match got {
            Ok(mut b) => {
                self.next.batch = b.index + 1;
                self.next.epoch = b.epoch;
                let batches = match self.part {
                    Some((epoch, batches)) if epoch == b.epoch => batches,
                    _ => self.batches_per_epoch,
                };
                if self.next.batch == batches {
                    self.next.epoch += 1;
                    self.next.batch = 0;
                    self.next.remaining = None;
                }
                // A batch whose every item was skipped is never delivered (a training step on it
                // would average over nothing): the position moves past it, and its skipped items are
                // listed with the next batch delivered.
                if b.is_empty() {
                    self.carried_skips.append(&mut b.skipped);
                    return Next::Pending;
                }
                let carried = std::mem::take(&mut self.carried_skips);
                b.skipped.splice(0..0, carried);
                b.wait = std::mem::take(&mut self.waited);
                Counters::add(&self.counters.wait_ns, b.wait.as_nanos() as u64);
                Counters::add(&self.counters.batches_delivered, 1);
                Counters::add(&self.counters.items_delivered, b.len() as u64);
                Next::Batch(Ok(b))
            }
            Err(e) => {
                self.failed = true;
                self.shutdown();
                Next::Batch(Err(e))
            }
        }
    }

    /// Ends a run whose pipeline lost a thread: the error says which and why. Threads that still wait
    /// on the lost one are told to stop and left to end on their own, never joined (which could block).
    fn stopped_by(&mut self, why: String) -> Next {
        self.failed = true;
        self.stop.store(true, Ordering::SeqCst);
        self.rx = None;
        self.threads.detach();
        Next::Batch(Err(Error::Pipeline(why)))
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.rx = None;
        self.threads.join();
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            // Short waits, so that a pipeline thread lost meanwhile is noticed within a second.
            match self.next_timeout(Duration::from_secs(1)) {
                Next::Batch(b) => return Some(b),
                Next::End => return None,
                Next::Pending => continue,
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The batches of one epoch: see [`Loader::rest_of_epoch`].
pub struct RestOfEpoch<'a> {
    loader: &'a mut Loader,
    epoch: usize,
}

impl Iterator for RestOfEpoch<'_> {
    type Item = Result<Batch>;

    /// Ends once the loader's position has moved past the epoch (its last batch delivered), or with the run.
    fn next(&mut self) -> Option<Result<Batch>> {
        if self.loader.next.epoch != self.epoch {
            return None;
        }
        self.loader.next()
    }
}

/// The pipeline's threads, counted by a [`ThreadMonitor`].
#[derive(Default)]
struct Threads {
    handles: Vec<JoinHandle<()>>,
    monitor: ThreadMonitor,
    /// The first thread that panicked, and its message: what a run that stopped says.
    panicked: Arc<std::sync::Mutex<Option<String>>>,
}

impl Threads {
    fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
        struct Alive(Arc<AtomicUsize>);
        impl Drop for Alive {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.monitor.0.fetch_add(1, Ordering::SeqCst);
        let alive = Alive(self.monitor.0.clone());
        let panicked = self.panicked.clone();
        let thread = name.to_string();
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _alive = alive;
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                    let mut first = panicked.lock().unwrap_or_else(|p| p.into_inner());
                    first.get_or_insert_with(|| {
                        format!(
                            "thread {thread} panicked: {}",
                            crate::pipeline::panic_text(&*p)
                        )
                    });
                }
            })
            .map_err(|e| Error::Pipeline(format!("cannot start thread {name}: {e}")))?;
        self.handles.push(h);
        Ok(())
    }

    fn first_panic(&self) -> Option<String> {
        self.panicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn detach(&mut self) {
        self.handles.clear();
    }

    fn join(&mut self) {
        for t in self.handles.drain(..) {
            let _ = t.join();
        }
    }
}

/// Everything decided before a thread starts: checked options, the schedule, buffer memory, the GPU.
struct Run {
    schedule: Schedule,
    next: LoaderState,
    batches_per_epoch: usize,
    part: Option<Part>,
    /// Batches being assembled at once.
    credits: usize,
    pool: Arc<Pool>,
    gpu: Option<GpuDecoder>,
    liquid_buffers: Option<liquid_sampler::BufferPlan>,
}

impl Run {
    fn plan(ds: &dyn Dataset, o: &LoaderOptions, state: LoaderState) -> Result<Run> {
        check_options(ds, o)?;
        let fingerprint = resume::check_state(ds, o, &state)?;
        let order = sharded_order(ds, o);
        let liquid = match o.order {
            Order::Seeded => None,
            Order::Liquid { budget_bytes } => Some((liquid_dataset(ds)?, budget_bytes)),
        };
        // Liquid's shards have the sharded order's sizes, and it never drops the last batch.
        let per_rank = order.per_rank();
        let batches_per_epoch = resume::batches_for(o, per_rank, o.batch_size);
        if batches_per_epoch == 0 {
            return Err(Error::Options(format!(
                "no batch per epoch: {per_rank} items for this rank, batch size {} with drop_last",
                o.batch_size
            )));
        }
        let Start { mut next, part } = resume::start(&order, o, state, liquid, batches_per_epoch)?;
        next.fingerprint = Some(fingerprint);
        // Items in flight: enough to keep every thread busy, capped in whole batches (credits) so a slow
        // item cannot let the reorder buffer — and memory — grow.
        let workers = o.decode_threads + o.io_threads;
        let credits = (2 * workers).div_ceil(o.batch_size) + 1;
        // Buffers alive at once: those being assembled, the prefetched ones, the consumer's.
        let buffers = credits + o.prefetch + 1;
        let batch_bytes = host_batch_bytes(o, buffers)?;
        let memory = host_memory(o)?;
        let gpu = match o.device {
            Device::Cpu => None,
            Device::Cuda(ordinal) => Some(open_gpu(ds, ordinal)?),
        };
        let (schedule, liquid_buffers) = match liquid {
            Some((l, budget)) => {
                let (s, buffers) =
                    liquid_schedule(l, o, budget, &next, part.as_ref(), batches_per_epoch)?;
                (s, Some(buffers))
            }
            None => (
                Schedule::seeded(
                    order,
                    o.batch_size,
                    batches_per_epoch,
                    o.epochs,
                    (next.epoch, next.batch),
                    part.clone(),
                ),
                None,
            ),
        };
        Ok(Run {
            schedule,
            next,
            batches_per_epoch,
            part,
            credits,
            pool: Pool::new(batch_bytes as usize, buffers, memory),
            gpu,
            liquid_buffers,
        })
    }
}

/// The seeded order of `ds` for this rank (PCR records: records shuffled, items within a window).
fn sharded_order(ds: &dyn Dataset, o: &LoaderOptions) -> ShardedOrder {
    ShardedOrder {
        len: ds.len(),
        seed: o.seed,
        shuffle: o.shuffle,
        rank: o.rank,
        world_size: o.world_size,
        tail: o.shard_tail,
        blocks: ds
            .blocks()
            .map_or_else(Vec::new, |b| b.starts.to_vec())
            .into(),
        window: ds.blocks().map_or(1, |b| b.window),
    }
}

/// Bytes of one host batch buffer, with `buffers` of them checked against the memory limit before
/// anything is allocated (saturating: an absurd size is simply too large). Batches the GPU writes into
/// device memory need no host buffer (unless a CPU fallback may have to fill one); whole images (no
/// crop) are sized when decoded, so only a max_size bounds their batch in advance.
fn host_batch_bytes(o: &LoaderOptions, buffers: usize) -> Result<u64> {
    let host_batches = o.device == Device::Cpu || o.gpu_fallback;
    let known = !o.sample.recipe.is_whole() || o.sample.whole_bound().is_some();
    let batch_bytes = (o.sample.sample_bytes() as u64).saturating_mul(o.batch_size as u64)
        * u64::from(host_batches && known);
    stdx::mem::check(
        batch_bytes.saturating_mul(buffers as u64),
        format!(
            "batch buffers ({buffers} batches of {} x {}x{}x3 {})",
            o.batch_size,
            o.sample.height,
            o.sample.width,
            o.sample.dtype.name()
        ),
    )?;
    Ok(batch_bytes)
}

/// The host memory batches live in. Page-locked memory is checked for now, before any thread starts:
/// asked for and impossible is an error, never pageable memory in its place.
fn host_memory(o: &LoaderOptions) -> Result<HostMemory> {
    if !o.pin_memory {
        return Ok(HostMemory::Pageable);
    }
    let ordinal = match o.device {
        Device::Cpu => 0,
        Device::Cuda(n) => n,
    };
    HostMemory::pinned(ordinal).map_err(Error::PinMemory)
}

/// The Liquid order's schedule from `next`, finishing `part` first (a part is sampled as an epoch of its
/// own), and the sampler's buffers.
fn liquid_schedule(
    l: &liquid_sampler::Dataset,
    o: &LoaderOptions,
    budget: u64,
    next: &LoaderState,
    part: Option<&Part>,
    batches_per_epoch: usize,
) -> Result<(Schedule, liquid_sampler::BufferPlan)> {
    let whole = resume::liquid_config(o, budget, o.rank, o.world_size, o.batch_size, None);
    let (sampler, tail) = match part {
        None => (open_liquid(l, &whole, next.epoch, next.batch)?, None),
        Some(p) => {
            let items = Some(resume::liquid_items(&p.remaining));
            let cfg = resume::liquid_config(o, budget, o.rank, o.world_size, o.batch_size, items);
            let tail = LiquidTail {
                epoch: p.epoch,
                batches: p.batches,
                then: whole,
                finished: false,
            };
            (open_liquid(l, &cfg, 0, next.batch)?, Some(tail))
        }
    };
    let buffers = sampler.buffers().clone();
    let start = (next.epoch, next.batch);
    let s = Schedule::liquid(sampler, l, o.epochs, start, batches_per_epoch, tail);
    Ok((s, buffers))
}

fn check_options(ds: &dyn Dataset, o: &LoaderOptions) -> Result<()> {
    o.validate()?;
    if ds.is_empty() {
        return Err(Error::Options(format!("empty dataset: {}", ds.describe())));
    }
    Ok(())
}

/// The dataset under a [`Order::Liquid`] loader, which only a local Liquid dataset can have.
fn liquid_dataset(dataset: &dyn Dataset) -> Result<&liquid_sampler::Dataset> {
    dataset.liquid().ok_or_else(|| {
        Error::Options(format!(
            "the Liquid order needs a local Liquid multi-format dataset (its sampler reads the packs \
             with direct I/O), not {}",
            dataset.describe()
        ))
    })
}

/// Liquid's sampler for this rank, standing where an uninterrupted run stands before (`epoch`, `batch`).
fn open_liquid(
    ds: &liquid_sampler::Dataset,
    cfg: &liquid_sampler::SamplerConfig,
    epoch: usize,
    batch: usize,
) -> Result<liquid_sampler::LiquidSampler> {
    liquid_sampler::LiquidSampler::resume(ds.clone(), cfg, epoch, batch)
        .map_err(|e| resume::liquid_error(ds, e))
}
