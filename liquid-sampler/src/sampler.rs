//! The runtime: the [`Planner`]'s schedule executed against the disk. I/O threads read the items the
//! schedule loads, in its order, page cache bypassed, as soon as a slot frees — so loading runs ahead of
//! sampling by as much as the buffers hold — while [`LiquidSampler::next_batch`] hands out batches.
//!
//! Resuming needs no saved buffers: the schedule is a pure function of the configuration, so
//! [`LiquidSampler::resume`] replays it (no I/O) to the saved batch and reads back what the buffers held
//! there; every later batch, its draws, keeps and disk reads, is the uninterrupted run's. [`delivered`]
//! replays a rank's schedule to say which items it had delivered, which is what a run resumed at another
//! world size needs to share out the rest of the epoch ([`SamplerConfig::items`]).

use crate::direct::{AlignedBuf, DirectFile};
use crate::error::{Error, Result};
use crate::manifest::{Dataset, Dims, Item};
use crate::plan::{BatchPlan, BufferPlan, Event, Planner};
use crate::shard::{ShardPolicy, shard};
use crate::stream;
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stdx::SplitMix64;

/// How to sample a dataset.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Bytes the shuffle buffers of all formats may hold together.
    pub budget: u64,
    pub batch: usize,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    pub shard_policy: ShardPolicy,
    /// Threads reading from disk (they overlap reads; the order stays the schedule's).
    pub io_threads: usize,
    /// The manifest items the ranks share out, ascending and without repeats; `None`: the whole dataset.
    /// A subset is what is left of an epoch interrupted at another world size: it is sharded, buffered and
    /// sampled like a dataset of its own (with its own seed stream, so its order is not the whole
    /// dataset's).
    pub items: Option<Arc<[u32]>>,
}

impl SamplerConfig {
    pub fn new(budget: u64, batch: usize) -> Self {
        SamplerConfig {
            budget,
            batch,
            seed: 0,
            rank: 0,
            world_size: 1,
            shard_policy: ShardPolicy::Pad,
            io_threads: 2,
            items: None,
        }
    }
}

/// A rank's schedule, before any I/O: its shard (manifest indices, ascending), the buffers, the planner.
fn schedule(dataset: &Dataset, cfg: &SamplerConfig) -> Result<(Vec<u32>, BufferPlan, Planner)> {
    let m = &dataset.manifest;
    let (universe, planner_seed) = match &cfg.items {
        None => (m.items.len(), cfg.seed ^ cfg.rank as u64),
        Some(items) => {
            if let Some(&bad) = items.iter().find(|&&i| i as usize >= m.items.len()) {
                return Err(Error::BadSetting(format!(
                    "item {bad} is not in the manifest's {} items",
                    m.items.len()
                )));
            }
            if items.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::BadSetting(
                    "the items to share out must be ascending without repeats".into(),
                ));
            }
            let seed = SplitMix64::keyed(cfg.seed, stream::PART, cfg.rank as u64).next_u64();
            (items.len(), seed)
        }
    };
    let mut shard = shard(
        universe,
        cfg.rank,
        cfg.world_size,
        cfg.seed,
        cfg.shard_policy,
    )?;
    if let Some(items) = &cfg.items {
        for x in &mut shard {
            *x = items[*x as usize];
        }
    }
    let mut sizes = vec![Vec::new(); m.formats.len()];
    for &i in &shard {
        let it = &m.items[i as usize];
        sizes[it.format as usize].push(crate::direct::round_up(it.location.length));
    }
    let buffers = BufferPlan::new(cfg.budget, &sizes)?;
    let format_of: Vec<u16> = shard.iter().map(|&i| m.items[i as usize].format).collect();
    let keys: Vec<(u32, u64)> = shard
        .iter()
        .map(|&i| {
            let l = m.items[i as usize].location;
            (l.file, l.offset)
        })
        .collect();
    let planner = Planner::new(&format_of, &keys, &buffers, cfg.batch, planner_seed)?;
    Ok((shard, buffers, planner))
}

/// The manifest items rank `cfg.rank` delivers in each of the first `epochs` epochs, in delivery order:
/// its schedule, replayed without touching the data files (what a shuffle-quality report measures).
pub fn delivered_epochs(
    dataset: &Dataset,
    cfg: &SamplerConfig,
    epochs: usize,
) -> Result<Vec<Vec<u32>>> {
    let (shard, _, mut planner) = schedule(dataset, cfg)?;
    let per_epoch = planner.batches_per_epoch();
    Ok((0..epochs)
        .map(|_| {
            (0..per_epoch)
                .flat_map(|_| planner.next_batch().draws)
                .map(|d| shard[d.local as usize])
                .collect()
        })
        .collect())
}

/// The manifest items rank `cfg.rank` delivers in the first `batch` batches of `epoch`, in delivery
/// order, found by replaying its schedule without touching the data files.
pub fn delivered(
    dataset: &Dataset,
    cfg: &SamplerConfig,
    epoch: usize,
    batch: usize,
) -> Result<Vec<u32>> {
    let (shard, _, mut planner) = schedule(dataset, cfg)?;
    let per_epoch = planner.batches_per_epoch();
    if batch > per_epoch {
        return Err(Error::BadSetting(format!(
            "batch {batch} is past the {per_epoch} batches of an epoch"
        )));
    }
    planner.skip(epoch.saturating_mul(per_epoch));
    Ok((0..batch)
        .flat_map(|_| planner.next_batch().draws)
        .map(|d| shard[d.local as usize])
        .collect())
}

/// One delivered item: its manifest record, whether it stayed in memory from the previous epoch, and the
/// stored bytes (compressed or raw) for the caller's decoder.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub item: Item,
    pub cached: bool,
    pub bytes: Arc<AlignedBuf>,
}

impl Delivered {
    pub fn dims(&self) -> Dims {
        self.item.dims
    }
}

/// One mini-batch with its disk traffic and how long `next_batch` waited for the I/O threads.
#[derive(Clone, Debug)]
pub struct Batch {
    pub epoch: usize,
    pub index: usize,
    pub items: Vec<Delivered>,
    /// Items (and their bytes) read from disk to refill the buffers while this batch was drawn.
    pub disk_items: usize,
    pub disk_bytes: u64,
    /// The first batch after [`LiquidSampler::resume`]: items (and bytes) read back into the buffers,
    /// beside the schedule's own reads above. Zero otherwise.
    pub rebuilt_items: usize,
    pub rebuilt_bytes: u64,
    pub wait: Duration,
}

struct Job {
    local: u32,
    file: u32,
    offset: u64,
    length: u64,
}

type Loaded = (u32, Result<AlignedBuf>);

/// Liquid's two-region shuffle buffers over an opened multi-format dataset.
pub struct LiquidSampler {
    dataset: Arc<Dataset>,
    shard: Vec<u32>,
    buffers: BufferPlan,
    planner: Planner,
    /// Items a resumed sampler reads back before its first batch: what the buffers held there.
    rebuild: Vec<u32>,
    /// Bytes of shard items in memory (current and next regions) or on their way.
    in_memory: HashMap<u32, Arc<AlignedBuf>>,
    arrived: HashMap<u32, Result<AlignedBuf>>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Loaded>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LiquidSampler {
    pub fn new(dataset: Dataset, cfg: &SamplerConfig) -> Result<Self> {
        Self::resume(dataset, cfg, 0, 0)
    }

    /// The sampler as it stands before batch `batch` of epoch `epoch` of an uninterrupted run with the
    /// same configuration: the schedule is replayed to there, and what the buffers held there (staged
    /// items and those kept for the next epoch) is read back with the first batch, counted apart in
    /// [`Batch::rebuilt_items`]; from then on draws, keeps and disk reads are the uninterrupted run's.
    pub fn resume(
        dataset: Dataset,
        cfg: &SamplerConfig,
        epoch: usize,
        batch: usize,
    ) -> Result<Self> {
        let (shard, buffers, mut planner) = schedule(&dataset, cfg)?;
        let per_epoch = planner.batches_per_epoch();
        if batch > per_epoch {
            return Err(Error::BadSetting(format!(
                "cannot resume at batch {batch}: an epoch has {per_epoch} batches"
            )));
        }
        let replayed = epoch.saturating_mul(per_epoch).saturating_add(batch);
        planner.skip(replayed);
        let rebuild: Vec<u32> = if replayed > 0 {
            planner.resident().iter_ones().map(|l| l as u32).collect()
        } else {
            Vec::new()
        };
        let m = &dataset.manifest;
        let files: Vec<DirectFile> = (0..m.files.len() as u32)
            .map(|f| DirectFile::open(&dataset.path_of(f)))
            .collect::<Result<_>>()?;
        let files = Arc::new(files);
        // Dedicated threads rather than `stdx::parallel`: they live as long as the sampler and are fed
        // one schedule event at a time across `next_batch` calls, running ahead of the consumer; a
        // scoped pool over a known list of items cannot do that.
        let (jobs, job_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done) = crossbeam_channel::unbounded::<Loaded>();
        let threads = (0..cfg.io_threads.max(1))
            .map(|_| {
                let (rx, tx, files) = (job_rx.clone(), done_tx.clone(), Arc::clone(&files));
                std::thread::spawn(move || {
                    for j in rx {
                        let mut buf = AlignedBuf::with_capacity(j.length as usize);
                        let r = files[j.file as usize].read_into(j.offset, j.length, &mut buf);
                        if tx.send((j.local, r.map(|()| buf))).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        Ok(LiquidSampler {
            dataset: Arc::new(dataset),
            shard,
            buffers,
            planner,
            rebuild,
            in_memory: HashMap::new(),
            arrived: HashMap::new(),
            jobs: Some(jobs),
            done,
            threads,
        })
    }

    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// How the budget was split: slots, retained items, the hit ratio it gives.
    pub fn buffers(&self) -> &BufferPlan {
        &self.buffers
    }

    /// Manifest indices of this rank's items, ascending.
    pub fn shard(&self) -> &[u32] {
        &self.shard
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.planner.batches_per_epoch()
    }

    fn item(&self, local: u32) -> &Item {
        &self.dataset.manifest.items[self.shard[local as usize] as usize]
    }

    /// Assembles the next mini-batch; epochs follow one another (see [`Batch::epoch`]).
    pub fn next_batch(&mut self) -> Result<Batch> {
        let (mut rebuilt_items, mut rebuilt_bytes) = (0, 0);
        for local in std::mem::take(&mut self.rebuild) {
            rebuilt_items += 1;
            rebuilt_bytes += self.load(local)?;
        }
        let plan: BatchPlan = self.planner.next_batch();
        let mut wait = Duration::ZERO;
        let mut items = Vec::with_capacity(plan.draws.len());
        let (mut disk_items, mut disk_bytes) = (0, 0);
        for ev in &plan.events {
            match *ev {
                Event::Load(local) => {
                    disk_items += 1;
                    disk_bytes += self.load(local)?;
                }
                Event::Draw(d) => {
                    let draw = plan.draws[d];
                    let bytes = match self.in_memory.get(&draw.local) {
                        Some(b) => Arc::clone(b),
                        None => {
                            let t = Instant::now();
                            let buf = self.wait_for(draw.local)?;
                            wait += t.elapsed();
                            Arc::new(buf)
                        }
                    };
                    if draw.kept {
                        self.in_memory.insert(draw.local, Arc::clone(&bytes));
                    } else {
                        self.in_memory.remove(&draw.local);
                    }
                    items.push(Delivered {
                        item: self.item(draw.local).clone(),
                        cached: draw.cached,
                        bytes,
                    });
                }
            }
        }
        Ok(Batch {
            epoch: plan.epoch,
            index: plan.batch,
            items,
            disk_items,
            disk_bytes,
            rebuilt_items,
            rebuilt_bytes,
            wait,
        })
    }

    /// Hands shard item `local` to the I/O threads; returns its length.
    fn load(&self, local: u32) -> Result<u64> {
        let it = self.item(local);
        let job = Job {
            local,
            file: it.location.file,
            offset: it.location.offset,
            length: it.location.length,
        };
        self.jobs
            .as_ref()
            .ok_or(Error::IoThreadsGone)?
            .send(job)
            .map_err(|_| Error::IoThreadsGone)?;
        Ok(it.location.length)
    }

    fn wait_for(&mut self, local: u32) -> Result<AlignedBuf> {
        loop {
            if let Some(r) = self.arrived.remove(&local) {
                return r;
            }
            let (l, r) = self.done.recv().map_err(|_| Error::IoThreadsGone)?;
            self.arrived.insert(l, r);
        }
    }
}

impl Drop for LiquidSampler {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
