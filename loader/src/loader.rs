//! The [`Loader`]: the resume state and the composition of the pipeline's stages
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
use crate::stats::{Counters, Stats};
use crate::targets::Targets;
use crossbeam_channel::{Receiver, RecvTimeoutError, bounded, unbounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vocab::Device;

/// Where a loader stands: the next batch it will deliver. Save it with a checkpoint and hand it to
/// [`Loader::resume`] to continue exactly there. Its `Display` form parses back with `FromStr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoaderState {
    pub epoch: usize,
    pub batch: usize,
    /// The configuration the position is valid for (checked on resume).
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    pub batch_size: usize,
    pub dataset_len: usize,
    /// The positions in `epoch`'s global order (see `ShardedOrder::permutation`) that the batches
    /// counted by `batch` are drawn from: `None` for the whole epoch; fewer once an epoch was resumed at
    /// another world size or batch size, which splits what was left among the new ranks.
    pub remaining: Option<Vec<std::ops::Range<usize>>>,
    /// What decides each batch's contents besides the seed (crop, flip, shuffle, layout, ...), as
    /// [`LoaderState::contents_of`] writes it: a resume with other such options is refused, naming the
    /// option. `None` (a version-1 state, or a caller that checks options itself): not checked.
    pub contents: Option<String>,
}

impl LoaderState {
    /// The options that decide what each batch holds besides the seed, as `name:value` pairs joined by
    /// `;` (one word, so a state stays one line of `name=value` words).
    pub fn contents_of(o: &LoaderOptions) -> String {
        let s = &o.sample;
        let normalize = s.normalize.map_or_else(
            || "none".to_string(),
            |n| {
                let join = |v: [f32; 3]| v.map(|x| x.to_string()).join(",");
                format!("{}/{}", join(n.mean), join(n.std))
            },
        );
        let order = match o.order {
            Order::Seeded => "seeded".to_string(),
            Order::Liquid { budget_bytes } => format!("liquid/{budget_bytes}"),
        };
        let active = s.recipe.option();
        let recipe = ["scale", "resize", "jitter"]
            .map(|k| match &active {
                Some((a, v)) if *a == k => format!("{k}:{v}"),
                _ => format!("{k}:none"),
            })
            .join(";");
        // Whole images: `crop:none` with their sizing (`none/resize 800/max_size 1333`).
        let size = match &active {
            Some(("crop", v)) => v.clone(),
            _ => format!("{}x{}", s.height, s.width),
        };
        format!(
            "crop:{size},{};flip:{};shuffle:{};drop_last:{};shard_tail:{};layout:{};dtype:{};normalize:{};\
             {recipe};interpolation:{};fill:{};channels:{};order:{}{}",
            s.crop,
            u8::from(s.hflip),
            u8::from(o.shuffle),
            u8::from(o.drop_last),
            o.shard_tail,
            s.layout,
            s.dtype,
            normalize,
            s.interpolation,
            s.fill,
            s.channels,
            order,
            o.targets.contents()
        )
    }

    /// The state format [`Display`](std::fmt::Display) writes: 2 added `remaining`; 1 (seven fields)
    /// still reads.
    pub const VERSION: u32 = 2;

    /// `remaining` as text: `all`, or half-open ranges `a:b` joined by commas (`none` when empty).
    pub fn remaining_text(&self) -> String {
        match &self.remaining {
            None => "all".into(),
            Some(r) if r.is_empty() => "none".into(),
            Some(r) => r
                .iter()
                .map(|r| format!("{}:{}", r.start, r.end))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Reads what [`remaining_text`](Self::remaining_text) writes.
    pub fn parse_remaining(text: &str) -> Result<Option<Vec<std::ops::Range<usize>>>> {
        let bad = || Error::Resume(format!("remaining={text:?}: expected all, none or a:b,c:d"));
        match text {
            "all" => return Ok(None),
            "none" => return Ok(Some(Vec::new())),
            _ => {}
        }
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for part in text.split(',') {
            let (a, b) = part.split_once(':').ok_or_else(bad)?;
            let (a, b): (usize, usize) =
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a >= b || out.last().is_some_and(|l| l.end > a) {
                return Err(bad());
            }
            out.push(a..b);
        }
        Ok(Some(out))
    }
}

impl std::fmt::Display for LoaderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "epoch={} batch={} seed={} rank={} world_size={} batch_size={} dataset_len={} remaining={}",
            self.epoch,
            self.batch,
            self.seed,
            self.rank,
            self.world_size,
            self.batch_size,
            self.dataset_len,
            self.remaining_text(),
        )?;
        if let Some(c) = &self.contents {
            write!(f, " contents={c}")?;
        }
        write!(f, " version={}", Self::VERSION)
    }
}

/// The fields of a state string, in the order `Display` writes them.
const STATE_FIELDS: [&str; 7] = [
    "epoch",
    "batch",
    "seed",
    "rank",
    "world_size",
    "batch_size",
    "dataset_len",
];

impl std::str::FromStr for LoaderState {
    type Err = Error;
    /// Every field exactly once: a partial state would resume somewhere else (a missing field read as 0
    /// restarts the epoch, or skips the checks against the dataset), so it is refused, naming what lacks.
    fn from_str(s: &str) -> Result<Self> {
        let mut values: [Option<u64>; 7] = [None; 7];
        let bad = |why: String| Error::Resume(format!("unreadable state {s:?}: {why}"));
        let (mut remaining, mut version, mut contents) = (None, None, None);
        for kv in s.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("{kv:?} is not name=value")))?;
            if k == "remaining" || k == "version" || k == "contents" {
                let slot = match k {
                    "remaining" => &mut remaining,
                    "version" => &mut version,
                    _ => &mut contents,
                };
                if slot.replace(v).is_some() {
                    return Err(bad(format!("{k} given twice")));
                }
                continue;
            }
            let i = STATE_FIELDS
                .iter()
                .position(|f| *f == k)
                .ok_or_else(|| bad(format!("no field named {k:?}")))?;
            let n: u64 = v
                .parse()
                .map_err(|_| bad(format!("{k}={v:?} is not a whole number")))?;
            if values[i].replace(n).is_some() {
                return Err(bad(format!("{k} given twice")));
            }
        }
        let missing: Vec<&str> = STATE_FIELDS
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(f, _)| *f)
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!(
                "{} missing (a state names {})",
                missing.join(", "),
                STATE_FIELDS.join(", ")
            )));
        }
        match version {
            None | Some("1") | Some("2") => {}
            Some(v) => {
                return Err(bad(format!(
                    "version {v}: this build reads versions 1 and {}",
                    Self::VERSION
                )));
            }
        }
        let remaining = remaining.map_or(Ok(None), Self::parse_remaining)?;
        let v = values.map(|v| v.unwrap_or(0));
        let size = |n: u64| usize::try_from(n).map_err(|_| bad(format!("{n} is too large")));
        Ok(LoaderState {
            remaining,
            contents: contents.map(str::to_string),
            epoch: size(v[0])?,
            batch: size(v[1])?,
            seed: v[2],
            rank: size(v[3])?,
            world_size: size(v[4])?,
            batch_size: size(v[5])?,
            dataset_len: size(v[6])?,
        })
    }
}

#[cfg(test)]
mod state_tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_a_partial_one_is_refused() {
        let st = LoaderState {
            epoch: 3,
            batch: 17,
            seed: u64::MAX,
            rank: 1,
            world_size: 4,
            batch_size: 64,
            dataset_len: 5000,
            remaining: Some(vec![3..9, 12..4000]),
            contents: Some(LoaderState::contents_of(&LoaderOptions::default())),
        };
        let text = st.to_string();
        assert!(
            text.contains(" remaining=3:9,12:4000 contents=crop:"),
            "{text}"
        );
        assert!(text.ends_with(" version=2"), "{text}");
        assert_eq!(text.parse::<LoaderState>().unwrap(), st);
        // A version-1 state (seven fields) still reads: the whole epoch.
        let old: LoaderState =
            "epoch=3 batch=17 seed=1 rank=0 world_size=4 batch_size=64 dataset_len=5000"
                .parse()
                .unwrap();
        assert_eq!(old.remaining, None);
        for bad in [
            "remaining=5:3",
            "remaining=1:4,2:6",
            "remaining=x",
            "version=3",
        ] {
            let e = format!("{text} {bad}")
                .replace(" remaining=3:9,12:4000", "")
                .replace(" version=2", "");
            assert!(e.parse::<LoaderState>().is_err(), "{bad} accepted");
        }
        let back: LoaderState = text.parse().unwrap();
        assert_eq!(back.to_string(), text);
        for (input, says) in [
            (
                "epoch=3 batch=17",
                "seed, rank, world_size, batch_size, dataset_len missing",
            ),
            ("", "epoch, batch, seed"),
            (&format!("{text} batch=2"), "batch given twice"),
            ("epoch=x", "not a whole number"),
            ("epoch", "not name=value"),
            (&format!("{text} step=1"), "no field named \"step\""),
        ] {
            let e = input.parse::<LoaderState>().unwrap_err().to_string();
            assert!(e.contains(says), "{input:?}: {e}");
        }
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

/// The outcome of [`Loader::next_timeout`].
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // returned by value once per batch: boxing would cost more than it saves
pub enum Next {
    Batch(Result<Batch>),
    /// The run is over.
    End,
    /// No batch within the timeout (ask again).
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
        let wait = std::mem::take(&mut self.waited);
        Counters::add(&self.counters.wait_ns, wait.as_nanos() as u64);
        match got {
            Ok(mut b) => {
                b.wait = wait;
                Counters::add(&self.counters.batches_delivered, 1);
                Counters::add(&self.counters.items_delivered, b.len() as u64);
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
        check_state(ds, o, &state)?;
        let order = ShardedOrder {
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
        };
        let liquid = match o.order {
            Order::Seeded => None,
            Order::Liquid { budget_bytes } => Some((liquid_dataset(ds)?, budget_bytes)),
        };
        let batches_for = |per: usize, batch_size: usize| {
            if o.drop_last {
                per / batch_size.max(1)
            } else {
                per.div_ceil(batch_size.max(1))
            }
        };
        // Liquid's shards have the sharded order's sizes, and it never drops the last batch.
        let per_rank = order.per_rank();
        let batches_per_epoch = batches_for(per_rank, o.batch_size);
        if batches_per_epoch == 0 {
            return Err(Error::Options(format!(
                "no batch per epoch: {per_rank} items for this rank, batch size {} with drop_last",
                o.batch_size
            )));
        }
        // Where this run starts: the state's position at the state's shape, or — at another world size or
        // batch size — the part of its epoch no rank delivered, shared anew.
        let count = |r: &[std::ops::Range<usize>]| r.iter().map(|r| r.len()).sum::<usize>();
        let saved = ShardedOrder {
            world_size: state.world_size.max(1),
            rank: 0,
            ..order.clone()
        };
        let saved_batches = match &state.remaining {
            None => batches_for(saved.per_rank(), state.batch_size),
            Some(r) => batches_for(saved.per_rank_of(count(r)), state.batch_size),
        };
        if state.batch > saved_batches {
            return Err(Error::Resume(format!(
                "batch {} is past the {saved_batches} batches of an epoch",
                state.batch
            )));
        }
        let reshaped = state.world_size != o.world_size || state.batch_size != o.batch_size;
        let (mut next, mut part) = if reshaped && state.batch < saved_batches {
            let left = match liquid {
                None => saved.left_after(state.remaining.as_deref(), state.batch, state.batch_size),
                Some((l, budget)) => liquid_left(l, o, budget, &state)?,
            };
            let batches = batches_for(order.per_rank_of(count(&left)), o.batch_size);
            let next = LoaderState {
                batch: 0,
                rank: o.rank,
                world_size: o.world_size,
                batch_size: o.batch_size,
                remaining: Some(left.clone()),
                ..state
            };
            (
                next,
                Some(Part {
                    epoch: state.epoch,
                    remaining: left,
                    batches,
                }),
            )
        } else if reshaped {
            let next = LoaderState {
                epoch: state.epoch + 1,
                batch: 0,
                rank: o.rank,
                world_size: o.world_size,
                batch_size: o.batch_size,
                remaining: None,
                ..state
            };
            (next, None)
        } else {
            let part = state.remaining.clone().map(|r| Part {
                epoch: state.epoch,
                batches: saved_batches,
                remaining: r,
            });
            (
                LoaderState {
                    rank: o.rank,
                    ..state
                },
                part,
            )
        };
        next.contents = Some(LoaderState::contents_of(o));
        let this_epoch = part.as_ref().map_or(batches_per_epoch, |p| p.batches);
        if next.batch >= this_epoch {
            next.epoch += 1;
            next.batch = 0;
            next.remaining = None;
            part = None;
        }
        // Items in flight: enough to keep every thread busy, capped in whole batches (credits) so a slow
        // item cannot let the reorder buffer — and memory — grow.
        let workers = o.decode_threads + o.io_threads;
        let credits = (2 * workers).div_ceil(o.batch_size) + 1;
        // Buffers alive at once: those being assembled, the prefetched ones, the consumer's. Sizes are
        // checked against the memory limit before anything is allocated (saturating: an absurd size is
        // simply too large). Batches the GPU writes into device memory need no host buffer (unless a
        // CPU fallback may have to fill one).
        let buffers = credits + o.prefetch + 1;
        let host_batches = o.device == Device::Cpu || o.gpu_fallback;
        // Whole images (no crop) are sized when decoded: only a max_size bounds their batch in advance.
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
        // Page-locked memory is checked for now, before any thread starts: asked for and impossible is
        // an error, never pageable memory in its place.
        let memory = if o.pin_memory {
            let ordinal = match o.device {
                Device::Cpu => 0,
                Device::Cuda(n) => n,
            };
            HostMemory::pinned(ordinal).map_err(Error::PinMemory)?
        } else {
            HostMemory::Pageable
        };
        let gpu = match o.device {
            Device::Cpu => None,
            Device::Cuda(ordinal) => Some(open_gpu(ds, ordinal)?),
        };
        let (schedule, liquid_buffers) = match liquid {
            Some((l, budget)) => {
                let whole = liquid_config(o, budget, o.rank, o.world_size, o.batch_size, None);
                let (sampler, part) = match &part {
                    None => (open_liquid(l, &whole, next.epoch, next.batch)?, None),
                    Some(p) => {
                        let items = Some(liquid_items(&p.remaining));
                        let cfg =
                            liquid_config(o, budget, o.rank, o.world_size, o.batch_size, items);
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
                let s = Schedule::liquid(sampler, l, o.epochs, start, batches_per_epoch, part);
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

fn check_options(ds: &dyn Dataset, o: &LoaderOptions) -> Result<()> {
    o.validate()?;
    if ds.is_empty() {
        return Err(Error::Options(format!("empty dataset: {}", ds.describe())));
    }
    Ok(())
}

/// Options recorded in a state's `contents` after its first release, with the value every state written
/// before then implies.
const ADDED_SINCE_V2: [(&str, &str); 7] = [
    ("order", "seeded"),
    ("scale", "none"),
    ("resize", "none"),
    ("jitter", "none"),
    ("interpolation", "bilinear"),
    ("fill", "0"),
    ("channels", "3"),
];

fn check_state(ds: &dyn Dataset, o: &LoaderOptions, state: &LoaderState) -> Result<()> {
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
    check("dataset length", state.dataset_len as u64, ds.len() as u64)?;
    if let Some(saved) = &state.contents {
        let ours = LoaderState::contents_of(o);
        let pairs = |s: &str| -> Vec<(String, String)> {
            s.split(';')
                .map(|p| {
                    let (k, v) = p.split_once(':').unwrap_or((p, ""));
                    (k.to_string(), v.to_string())
                })
                .collect()
        };
        let (saved, ours) = (pairs(saved), pairs(&ours));
        for (k, v) in &ours {
            match saved.iter().find(|(sk, _)| sk == k) {
                Some((_, sv)) if sv == v => {}
                // A state from a build that did not record this option yet had its default then.
                None if ADDED_SINCE_V2.contains(&(k.as_str(), v.as_str())) => {}
                Some((_, sv)) => {
                    return Err(Error::Resume(format!(
                        "state has {k} {sv}, options have {k} {v}"
                    )));
                }
                None => {
                    return Err(Error::Resume(format!(
                        "state records no {k} (options have {v}): it comes from another build"
                    )));
                }
            }
        }
        // Targets are recorded only when asked for: a state with them resumes only with them.
        if let Some((k, v)) = saved
            .iter()
            .find(|(k, _)| !ours.iter().any(|(o, _)| o == k))
        {
            return Err(Error::Resume(format!(
                "state has {k} {v}, options have no {k}"
            )));
        }
    }
    if state.world_size == 0 || state.batch_size == 0 {
        return Err(Error::Resume(
            "state has a world size or batch size of 0".into(),
        ));
    }
    if let Some(r) = &state.remaining
        && r.last().is_some_and(|r| r.end > ds.len())
    {
        return Err(Error::Resume(format!(
            "state's remaining positions reach past the {} items of the dataset",
            ds.len()
        )));
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

/// The sampler configuration of rank `rank` of `world_size` at `batch_size`; `items`: the part of an
/// epoch they share out (`None`: the whole dataset).
fn liquid_config(
    o: &LoaderOptions,
    budget: u64,
    rank: usize,
    world_size: usize,
    batch_size: usize,
    items: Option<Arc<[u32]>>,
) -> liquid_sampler::SamplerConfig {
    liquid_sampler::SamplerConfig {
        budget,
        batch: batch_size,
        seed: o.seed,
        rank,
        world_size,
        shard_policy: o.shard_tail,
        io_threads: o.io_threads,
        items,
    }
}

/// Item indices (the manifest's) of a state's `remaining` ranges: under the Liquid order they name
/// items, not positions in a global permutation (it has none).
fn liquid_items(remaining: &[std::ops::Range<usize>]) -> Arc<[u32]> {
    remaining
        .iter()
        .flat_map(|r| r.clone())
        .map(|i| i as u32)
        .collect()
}

fn liquid_error(ds: &liquid_sampler::Dataset, e: liquid_sampler::Error) -> Error {
    match e {
        liquid_sampler::Error::BudgetTooSmall { .. } | liquid_sampler::Error::BadSetting(_) => {
            Error::Options(format!("Liquid order on {}: {e}", ds.dir.display()))
        }
        e => Error::dataset(&ds.dir, e),
    }
}

/// Liquid's sampler for this rank, standing where an uninterrupted run stands before (`epoch`, `batch`).
fn open_liquid(
    ds: &liquid_sampler::Dataset,
    cfg: &liquid_sampler::SamplerConfig,
    epoch: usize,
    batch: usize,
) -> Result<liquid_sampler::LiquidSampler> {
    liquid_sampler::LiquidSampler::resume(ds.clone(), cfg, epoch, batch)
        .map_err(|e| liquid_error(ds, e))
}

/// The items of a Liquid state's epoch (or part of one) that no rank of the saved shape delivered:
/// each saved rank's schedule is replayed, without I/O, to the saved batch.
fn liquid_left(
    ds: &liquid_sampler::Dataset,
    o: &LoaderOptions,
    budget: u64,
    state: &LoaderState,
) -> Result<Vec<std::ops::Range<usize>>> {
    let items = state.remaining.as_deref().map(liquid_items);
    // A part is sampled as an epoch of its own, its epoch 0.
    let epoch = if items.is_some() { 0 } else { state.epoch };
    let n = ds.manifest.items.len();
    let mut delivered = vec![false; n];
    for rank in 0..state.world_size {
        let cfg = liquid_config(
            o,
            budget,
            rank,
            state.world_size,
            state.batch_size,
            items.clone(),
        );
        for i in liquid_sampler::delivered(ds, &cfg, epoch, state.batch)
            .map_err(|e| liquid_error(ds, e))?
        {
            delivered[i as usize] = true;
        }
    }
    let universe: Vec<usize> = match &items {
        None => (0..n).collect(),
        Some(i) => i.iter().map(|&i| i as usize).collect(),
    };
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for i in universe.into_iter().filter(|&i| !delivered[i]) {
        match out.last_mut() {
            Some(r) if r.end == i => r.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    Ok(out)
}
