//! The sampling schedule, computed without touching the disk: which items each mini-batch holds, which of
//! them stay in memory for the next epoch, and which items are loaded from disk to refill the buffers.
//! Because it is a pure function of (shard, buffer sizes, batch size, seed), the order is the same whatever
//! the I/O threads' timing, and the tests can check the invariants on millions of draws in a second.
//!
//! Per format `f` with `n_f` of the shard's `N` items the buffer has `C_f` slots and keeps `R_f = C_f` items
//! (or `n_f` when all fit) across the epoch boundary. Each batch:
//! - draws `m_f` items of each format. The formats of an epoch's draws follow a house-monotone
//!   apportionment with quota: after any `s` draws, format `f` has had `floor(s * n_f / N)` or
//!   `ceil(s * n_f / N)` of them, and the count never goes down as `s` grows. Each draw goes to the format
//!   whose next item is most urgent (earliest deadline `ceil(j * N / n_f)` for its `j`-th item) among those
//!   not already at their upper quota. Such a sequence always exists (Tijdeman's chairman assignment
//!   theorem bounds the best sequence's deviation below one item) and earliest-deadline-first, optimal for
//!   unit jobs with release times and deadlines, finds one. So a batch holds each format's share within two
//!   items (within one with two formats), and the epoch totals are exact; `tests/planner_mix.rs` checks all
//!   of it exhaustively on small shapes and by property up to 70 items per format. (Cutting the epoch at
//!   `floor(s * (n_0 + .. + n_f) / N)` instead is exact for two formats but not monotone for three: a
//!   format's count can drop by one between batches, which wrapped the subtraction.)
//! - samples uniformly from the format's current-epoch region;
//! - moves as many of them as the keep plan says, at random positions of the batch, to the next-epoch
//!   region and evicts the rest, freeing their slots;
//! - refills free slots at once with the next items of the format, in storage order, that are neither in
//!   memory nor already drawn this epoch.
//!
//! A batch reads from disk what it evicts, so level disk traffic is level eviction: the keep plan
//! (`plan/keeps.rs`) spreads the epoch's `R = sum of R_f` keeps so that full batches keep, and so read, the same
//! number of items within one. Each format still ends the epoch with exactly its `R_f`. One constraint
//! is fixed: when a format's buffer is all retention (`R_f = C_f < n_f`), the next-epoch region may take
//! its last slot only with the format's last draw (otherwise no slot is left to stage disk items), so a
//! batch holding formats' last draws may read fewer items than the others, never more than one over the
//! fewest. At the end of an epoch the next region becomes the current one.

mod keeps;

use crate::error::{Error, Result};
use crate::stream;
use bitvec::prelude::*;
use keeps::KeepPlan;
use stdx::SplitMix64;

/// How the memory budget is split into per-format buffers.
///
/// A format's buffer may hold any `C_f` of its items at once, so it reserves the bytes of its `C_f` largest
/// items (each rounded up to the I/O alignment): the budget is never exceeded whichever items are resident.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferPlan {
    pub budget: u64,
    /// Items of each format in this rank's shard.
    pub items: Vec<usize>,
    /// Items each format's buffer holds at most (current + next region).
    pub capacity: Vec<usize>,
    /// Items of each format kept in memory from one epoch to the next.
    pub retained: Vec<usize>,
    /// Bytes reserved for each format's buffer: its `capacity` largest items.
    pub reserved: Vec<u64>,
    /// The shard's size in memory: every item rounded up to the I/O alignment.
    pub dataset_bytes: u64,
}

impl BufferPlan {
    /// Splits `budget` bytes so that every format keeps (nearly) the same share `h` of its items, the
    /// largest that fits. `sizes[f]` lists the in-memory size of each item of format `f`.
    pub fn new(budget: u64, sizes: &[Vec<u64>]) -> Result<BufferPlan> {
        let items: Vec<usize> = sizes.iter().map(Vec::len).collect();
        let n: usize = items.iter().sum();
        if n == 0 {
            return Err(Error::EmptyDataset);
        }
        // prefix[f][r]: bytes of the r largest items of format f.
        let prefix: Vec<Vec<u64>> = sizes
            .iter()
            .map(|v| {
                let mut v = v.clone();
                v.sort_unstable_by(|a, b| b.cmp(a));
                std::iter::once(0)
                    .chain(v.iter().scan(0u64, |acc, &x| {
                        *acc = acc.saturating_add(x);
                        Some(*acc)
                    }))
                    .collect()
            })
            .collect();
        let nf = items.len();
        let used = |f: usize| items[f] > 0;
        let cost = |r: &[usize]| -> u64 {
            (0..nf)
                .filter(|&f| used(f))
                .map(|f| prefix[f][r[f].max(1)])
                .fold(0u64, u64::saturating_add)
        };
        let needed = cost(&vec![1; nf]);
        if budget < needed {
            return Err(Error::BudgetTooSmall { budget, needed });
        }
        let dataset_bytes: u64 = sizes
            .iter()
            .flatten()
            .fold(0u64, |a, &b| a.saturating_add(b));
        let at = |h: f64| -> Vec<usize> {
            (0..nf)
                .map(|f| {
                    if !used(f) {
                        0
                    } else {
                        ((h * items[f] as f64).floor() as usize).clamp(1, items[f])
                    }
                })
                .collect()
        };
        // The largest common share that fits (cost grows with h), by bisection.
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        if cost(&at(1.0)) <= budget {
            lo = 1.0;
        } else {
            for _ in 0..60 {
                let mid = (lo + hi) / 2.0;
                if cost(&at(mid)) <= budget {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
        }
        let mut retained = at(lo);
        // Spend what the rounding left, formats with the largest shortfall first.
        let h = lo.max(budget as f64 / dataset_bytes as f64).min(1.0);
        let mut order: Vec<usize> = (0..nf).filter(|&f| used(f)).collect();
        order.sort_by(|&a, &b| {
            let fa = h * items[a] as f64 - retained[a] as f64;
            let fb = h * items[b] as f64 - retained[b] as f64;
            fb.total_cmp(&fa)
        });
        for f in order {
            if retained[f] < items[f] {
                retained[f] += 1;
                if cost(&retained) > budget {
                    retained[f] -= 1;
                }
            }
        }
        let reserved = (0..nf)
            .map(|f| {
                if used(f) {
                    prefix[f][retained[f].max(1)]
                } else {
                    0
                }
            })
            .collect();
        Ok(BufferPlan {
            budget,
            items,
            capacity: retained.clone(),
            retained,
            reserved,
            dataset_bytes,
        })
    }

    /// Share of items each epoch after the first serves from memory.
    pub fn hit_ratio(&self) -> f64 {
        self.retained.iter().sum::<usize>() as f64 / self.items.iter().sum::<usize>() as f64
    }

    /// `min(1, budget / dataset)`: what the hit ratio aims at. It is reached within one batch when a
    /// format's items have one size; with varied sizes the reservation for the largest items costs some.
    pub fn target_hit_ratio(&self) -> f64 {
        (self.budget as f64 / self.dataset_bytes as f64).min(1.0)
    }

    /// Bytes the buffers may hold at once.
    pub fn buffer_bytes(&self) -> u64 {
        self.reserved.iter().sum()
    }
}

/// One item of a planned batch; `local` indexes the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    pub local: u32,
    pub format: u16,
    /// The item was kept in memory from the previous epoch.
    pub cached: bool,
    /// The item moves to the next-epoch region (else it is evicted after delivery).
    pub kept: bool,
}

/// What happens, in order, while a batch is assembled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Start loading shard item `local` from disk into a freed slot.
    Load(u32),
    /// Deliver `draws[i]`.
    Draw(usize),
}

/// The schedule of one mini-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    pub epoch: usize,
    pub batch: usize,
    pub draws: Vec<Draw>,
    pub events: Vec<Event>,
}

impl BatchPlan {
    /// Shard items read from disk while assembling this batch.
    pub fn loads(&self) -> impl Iterator<Item = u32> + '_ {
        self.events.iter().filter_map(|e| match e {
            Event::Load(x) => Some(*x),
            Event::Draw(_) => None,
        })
    }
}

struct FormatState {
    /// Shard-local indices of this format, in storage order.
    order: Vec<u32>,
    cursor: usize,
    current: Vec<u32>,
    next: Vec<u32>,
    capacity: usize,
    retain: usize,
    sampled: usize,
    retained: usize,
    free: usize,
}

impl FormatState {
    /// The buffer is all retention but not the whole format, so its last slot goes to the next epoch
    /// only with the format's last draw: taken earlier, no slot would be left to stage the items still
    /// to draw.
    fn pinned(&self) -> bool {
        self.retain > 0 && self.retain == self.capacity && self.retain < self.order.len()
    }
}

/// The deterministic two-region shuffle-buffer schedule over one shard.
pub struct Planner {
    formats: Vec<FormatState>,
    /// Each batch's draws and keeps per format, the same every epoch.
    keep_plan: KeepPlan,
    n: usize,
    batch: usize,
    rng: SplitMix64,
    epoch: usize,
    batch_in_epoch: usize,
    sampled: usize,
    started: bool,
    /// In memory (current or next region).
    resident: BitVec,
    /// In memory at the epoch start, or loaded since: not to be loaded again this epoch.
    seen: BitVec,
    /// In memory since the previous epoch.
    carried: BitVec,
}

impl Planner {
    /// `format_of[local]` and `storage_key[local]` describe the shard's items (the key orders them on disk).
    pub fn new(
        format_of: &[u16],
        storage_key: &[(u32, u64)],
        buffers: &BufferPlan,
        batch: usize,
        seed: u64,
    ) -> Result<Planner> {
        let n = format_of.len();
        if n == 0 {
            return Err(Error::EmptyDataset);
        }
        if batch == 0 {
            return Err(Error::BadSetting("batch size must be at least 1".into()));
        }
        if storage_key.len() != n {
            return Err(Error::BadSetting(format!(
                "{} storage keys for {n} items",
                storage_key.len()
            )));
        }
        let nf = buffers.items.len();
        if buffers.capacity.len() != nf || buffers.retained.len() != nf {
            return Err(Error::BadSetting(format!(
                "buffer plan lists {nf} formats but {} capacities and {} retention counts",
                buffers.capacity.len(),
                buffers.retained.len()
            )));
        }
        if nf > usize::from(u16::MAX) + 1 {
            return Err(Error::BadSetting(format!("{nf} formats (at most 65536)")));
        }
        let mut orders: Vec<Vec<u32>> = vec![Vec::new(); nf];
        for (local, &f) in format_of.iter().enumerate() {
            orders
                .get_mut(f as usize)
                .ok_or_else(|| Error::BadSetting(format!("format {f} has no buffer")))?
                .push(local as u32);
        }
        let mut formats = Vec::with_capacity(nf);
        for (f, mut order) in orders.into_iter().enumerate() {
            if order.len() != buffers.items[f] {
                return Err(Error::BadSetting(format!(
                    "buffer plan counts {} items of format {f}, the shard {}",
                    buffers.items[f],
                    order.len()
                )));
            }
            let (capacity, retain) = (buffers.capacity[f], buffers.retained[f]);
            if !order.is_empty() && (capacity == 0 || retain > capacity || capacity > order.len()) {
                return Err(Error::BadSetting(format!(
                    "format {f}: {capacity} slots retaining {retain} of {} items",
                    order.len()
                )));
            }
            order.sort_by_key(|&l| storage_key[l as usize]);
            formats.push(FormatState {
                cursor: 0,
                current: Vec::new(),
                next: Vec::new(),
                capacity,
                retain,
                sampled: 0,
                retained: 0,
                free: capacity,
                order,
            });
        }
        let counts: Vec<usize> = formats.iter().map(|st| st.order.len()).collect();
        let retain: Vec<usize> = formats.iter().map(|st| st.retain).collect();
        let pinned: Vec<bool> = formats.iter().map(FormatState::pinned).collect();
        let keep_plan = KeepPlan::new(&counts, &retain, &pinned, batch);
        Ok(Planner {
            formats,
            keep_plan,
            n,
            batch,
            rng: SplitMix64::keyed(seed, stream::SAMPLE, 0),
            epoch: 0,
            batch_in_epoch: 0,
            sampled: 0,
            started: false,
            resident: bitvec![0; n],
            seen: bitvec![0; n],
            carried: bitvec![0; n],
        })
    }

    /// Mini-batches per epoch (the last one short when the batch size does not divide the shard).
    pub fn batches_per_epoch(&self) -> usize {
        self.n.div_ceil(self.batch)
    }

    pub fn shard_len(&self) -> usize {
        self.n
    }

    /// The memory-resident set (current and next regions) right now.
    pub fn resident(&self) -> &BitSlice {
        &self.resident
    }

    fn refill(&mut self, f: usize, events: &mut Vec<Event>) {
        let st = &mut self.formats[f];
        while st.free > 0 {
            while st.cursor < st.order.len() && self.seen[st.order[st.cursor] as usize] {
                st.cursor += 1;
            }
            let Some(&y) = st.order.get(st.cursor) else {
                break;
            };
            st.cursor += 1;
            self.resident.set(y as usize, true);
            self.seen.set(y as usize, true);
            self.carried.set(y as usize, false);
            st.current.push(y);
            st.free -= 1;
            events.push(Event::Load(y));
        }
    }

    /// This batch's draws of each format, `want`, that move to the next-epoch region: the keep plan's,
    /// held to what each format must and may keep (never needed while the plan is followed).
    fn keeps(&self, want: &[usize]) -> Vec<usize> {
        self.formats
            .iter()
            .zip(want)
            .enumerate()
            .map(|(f, (st, &m))| {
                let after = st.sampled + m;
                let left = st.retain - st.retained;
                let must = left.saturating_sub(st.order.len() - after);
                let last_slot = usize::from(st.pinned() && after < st.order.len());
                let may = m.min(left.saturating_sub(last_slot));
                self.keep_plan
                    .get(self.batch_in_epoch, f)
                    .clamp(must, may.max(must))
            })
            .collect()
    }

    /// Plans and discards `batches` mini-batches: the planner then stands where a run that delivered
    /// them stands (a resumed sampler's starting point; the schedule needs no I/O to get there).
    pub fn skip(&mut self, batches: usize) {
        for _ in 0..batches {
            self.next_batch();
        }
    }

    /// Plans the next mini-batch (epochs follow one another without end).
    pub fn next_batch(&mut self) -> BatchPlan {
        let mut events = Vec::new();
        if !self.started {
            self.started = true;
            for f in 0..self.formats.len() {
                self.refill(f, &mut events);
            }
        }
        let n = self.n;
        let s0 = self.sampled;
        let s1 = (s0 + self.batch).min(n);
        let mut want = self.keep_plan.draws(self.batch_in_epoch);
        let mut quota = self.keeps(&want);
        let mut seq: Vec<u16> = want
            .iter()
            .enumerate()
            .flat_map(|(f, &m)| std::iter::repeat_n(f as u16, m))
            .collect();
        self.rng.shuffle(&mut seq);
        let mut draws = Vec::with_capacity(seq.len());
        for f16 in seq {
            let f = f16 as usize;
            let st = &mut self.formats[f];
            // The schedule guarantees a staged item: free slots exist only once the disk side is exhausted,
            // and then every item still to draw is in the current region.
            let i = self.rng.index(st.current.len());
            let x = st.current.swap_remove(i);
            let cached = self.carried[x as usize];
            let left = want[f];
            let mut keep = quota[f] > 0 && (quota[f] >= left || self.rng.index(left) < quota[f]);
            let last_draw = st.sampled + 1 == st.order.len();
            if keep && st.next.len() + 1 >= st.capacity && !last_draw {
                keep = false;
            }
            want[f] -= 1;
            st.sampled += 1;
            if keep {
                quota[f] -= 1;
                st.retained += 1;
                st.next.push(x);
            } else {
                self.resident.set(x as usize, false);
                st.free += 1;
            }
            draws.push(Draw {
                local: x,
                format: f16,
                cached,
                kept: keep,
            });
            events.push(Event::Draw(draws.len() - 1));
            self.refill(f, &mut events);
        }
        let plan_epoch = self.epoch;
        let plan_batch = self.batch_in_epoch;
        self.sampled = s1;
        self.batch_in_epoch += 1;
        if s1 == n {
            self.start_epoch(&mut events);
        }
        BatchPlan {
            epoch: plan_epoch,
            batch: plan_batch,
            draws,
            events,
        }
    }

    /// Epoch boundary: next-epoch regions become the current ones; free slots are refilled at once (the
    /// loads belong to the batch that freed them, so per-batch disk traffic stays level across epochs).
    fn start_epoch(&mut self, events: &mut Vec<Event>) {
        for st in &mut self.formats {
            debug_assert!(st.current.is_empty());
            st.current = std::mem::take(&mut st.next);
            st.cursor = 0;
            st.sampled = 0;
            st.retained = 0;
            st.free = st.capacity - st.current.len();
        }
        self.seen.clone_from(&self.resident);
        self.carried.clone_from(&self.resident);
        for f in 0..self.formats.len() {
            self.refill(f, events);
        }
        self.epoch += 1;
        self.batch_in_epoch = 0;
        self.sampled = 0;
    }
}

/// How many of the epoch's draws `s0 + 1 ..= s1` each format gets: earliest deadline first within
/// quota (see the module documentation), continuing from the `drawn` each format has had so far.
fn mix(counts: &[usize], drawn: &[usize], s0: usize, s1: usize) -> Vec<usize> {
    let n = counts.iter().sum::<usize>() as u128;
    let mut drawn = drawn.to_vec();
    let mut want = vec![0; counts.len()];
    for s in s0 + 1..=s1 {
        // (deadline, format) of the most urgent format within its upper quota, and of any format
        // with items left (the second is never needed: a quota sequence always exists).
        let mut within: Option<(u128, usize)> = None;
        let mut any: Option<(u128, usize)> = None;
        for (f, &n_f) in counts.iter().enumerate() {
            let n_f = n_f as u128;
            let j = drawn[f] as u128 + 1;
            if j > n_f {
                continue;
            }
            let key = ((j * n).div_ceil(n_f), f);
            if any.is_none_or(|a| key < a) {
                any = Some(key);
            }
            // The j-th item may come at draw s once ceil(s * n_f / N) >= j.
            if (j - 1) * n / n_f < s as u128 && within.is_none_or(|w| key < w) {
                within = Some(key);
            }
        }
        let Some((_, f)) = within.or(any) else {
            break;
        };
        drawn[f] += 1;
        want[f] += 1;
    }
    want
}
