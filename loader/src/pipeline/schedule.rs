//! The schedule the order stage follows: which items make up each batch, epoch after epoch — a seeded
//! permutation sharded like PyTorch's `DistributedSampler` ([`ShardedOrder`]), or Liquid's two-region
//! shuffle buffers, whose batches come with their bytes already in memory.

use crate::error::{Error, Result};
use stdx::SplitMix64;
use vocab::ShardPolicy;

/// The order in which one rank visits a dataset, epoch by epoch.
#[derive(Clone, Debug)]
pub struct ShardedOrder {
    pub len: usize,
    pub seed: u64,
    pub shuffle: bool,
    pub rank: usize,
    pub world_size: usize,
    pub tail: ShardPolicy,
    /// Read units (PCR records): the first item of each, and how many are shuffled together. Empty:
    /// items are independent.
    pub blocks: std::sync::Arc<[usize]>,
    pub window: usize,
}

impl ShardedOrder {
    /// Items this rank sees per epoch.
    pub fn per_rank(&self) -> usize {
        self.per_rank_of(self.len)
    }

    /// Items each rank sees of an epoch (or a part of one) holding `m` items.
    pub fn per_rank_of(&self, m: usize) -> usize {
        match self.tail {
            ShardPolicy::Pad => m.div_ceil(self.world_size),
            ShardPolicy::DropTail => m / self.world_size,
        }
    }

    /// The epoch's global order: the permutation every rank computes from (seed, epoch) alone, whatever
    /// the world size — positions in it are what a state saved at one world size and resumed at another
    /// agree on.
    pub fn permutation(&self, epoch: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle && !self.blocks.is_empty() {
            all = self.block_permutation(epoch);
        } else if self.shuffle {
            SplitMix64::keyed(self.seed, epoch as u64, 0x5EED).shuffle(&mut all);
        }
        all
    }

    /// This rank's dataset indices for `epoch`, in visiting order. Every rank computes the same global
    /// permutation from (seed, epoch) and takes every world_size-th item from its rank on; with
    /// [`ShardPolicy::Pad`] the permutation is padded with its first items so every rank gets
    /// ceil(n / world) items.
    ///
    /// Over read units ([`blocks`](Self::blocks)) the permutation keeps units together: units in a seeded
    /// order, items shuffled within each window of `window` units; and each rank takes a contiguous run of
    /// it, so it reads about 1/world_size of the units rather than a piece of every one.
    pub fn epoch(&self, epoch: usize) -> Vec<usize> {
        self.share(self.permutation(epoch))
    }

    /// This rank's indices of the part of `epoch` whose global positions are `remaining` (an epoch
    /// resumed at another world size), shared among the ranks as a whole epoch is.
    pub fn epoch_part(&self, epoch: usize, remaining: &[std::ops::Range<usize>]) -> Vec<usize> {
        let p = self.permutation(epoch);
        self.share(
            remaining
                .iter()
                .flat_map(|r| r.clone())
                .filter_map(|i| p.get(i).copied())
                .collect(),
        )
    }

    /// This rank's share of `all` (a global order, or what is left of one).
    fn share(&self, mut all: Vec<usize>) -> Vec<usize> {
        let m = all.len();
        let per = self.per_rank_of(m);
        let total = per * self.world_size;
        if total > all.len() && !all.is_empty() {
            let mut i = 0;
            while all.len() < total {
                all.push(all[i]);
                i += 1;
            }
        }
        all.truncate(total);
        if !self.blocks.is_empty() {
            return all[self.rank * per..(self.rank + 1) * per].to_vec();
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .collect()
    }

    /// The global positions of `remaining` (`None`: the whole epoch) not yet delivered once every rank
    /// delivered `batches` batches of `batch_size` of its share: what a state carries to another world
    /// size or batch size. Padding repeats are not positions of their own, so nothing delivered is
    /// delivered again.
    pub fn left_after(
        &self,
        remaining: Option<&[std::ops::Range<usize>]>,
        batches: usize,
        batch_size: usize,
    ) -> Vec<std::ops::Range<usize>> {
        let positions: Vec<usize> = match remaining {
            None => (0..self.len).collect(),
            Some(r) => r.iter().flat_map(|r| r.clone()).collect(),
        };
        let m = positions.len();
        let per = self.per_rank_of(m);
        let done = batches.saturating_mul(batch_size).min(per);
        let mut delivered = vec![false; m];
        for rank in 0..self.world_size {
            for j in 0..done {
                let at = if self.blocks.is_empty() {
                    rank + j * self.world_size
                } else {
                    rank * per + j
                };
                if let Some(d) = delivered.get_mut(at) {
                    *d = true;
                }
            }
        }
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for (&p, _) in positions.iter().zip(&delivered).filter(|(_, d)| !**d) {
            match out.last_mut() {
                Some(r) if r.end == p => r.end += 1,
                _ => out.push(p..p + 1),
            }
        }
        out
    }

    fn block_permutation(&self, epoch: usize) -> Vec<usize> {
        let n = self.blocks.len();
        let end = |b: usize| self.blocks.get(b + 1).copied().unwrap_or(self.len);
        let mut order: Vec<usize> = (0..n).collect();
        SplitMix64::keyed(self.seed, epoch as u64, 0xB10C).shuffle(&mut order);
        let mut all = Vec::with_capacity(self.len);
        for (w, window) in order.chunks(self.window.max(1)).enumerate() {
            let at = all.len();
            for &b in window {
                all.extend(self.blocks[b]..end(b));
            }
            SplitMix64::keyed(self.seed, epoch as u64, 0x5EED ^ ((w as u64) << 16))
                .shuffle(&mut all[at..]);
        }
        all
    }
}

/// One batch as the order stage plans it.
pub(crate) struct Planned {
    pub epoch: usize,
    pub batch: usize,
    pub items: Vec<usize>,
    /// Under the Liquid order: what the sampler says about the batch, and its items' bytes.
    pub liquid: Option<LiquidPart>,
}

pub(crate) struct LiquidPart {
    pub cached: Vec<bool>,
    pub disk_items: usize,
    pub disk_bytes: u64,
    pub bytes: Vec<Vec<u8>>,
}

/// The part of an epoch a resumed run delivers: the global positions left, and the batches they make.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    pub epoch: usize,
    pub remaining: Vec<std::ops::Range<usize>>,
    pub batches: usize,
}

/// Where batches come from.
pub(crate) enum Schedule {
    Seeded {
        order: ShardedOrder,
        batch_size: usize,
        batches_per_epoch: usize,
        epochs: Option<usize>,
        epoch: usize,
        batch: usize,
        current: Option<(usize, Vec<usize>)>,
        /// The first epoch's part still to deliver when it was resumed at another world size or batch
        /// size, and its batches.
        part: Option<Part>,
    },
    Liquid {
        sampler: Box<liquid_sampler::LiquidSampler>,
        dataset: liquid_sampler::Dataset,
        index_of: std::collections::HashMap<(u32, u64), usize>,
        epochs: Option<usize>,
        batches_per_epoch: usize,
        /// The epoch of the next batch.
        epoch: usize,
        /// While the sampler delivers the rest of an epoch resumed at another world size or batch size.
        tail: Option<LiquidTail>,
    },
}

/// The rest of an interrupted epoch under the Liquid order: a sampler over just those items runs
/// `batches` batches, then the whole-dataset sampler takes over at the next epoch with `then`.
pub(crate) struct LiquidTail {
    pub epoch: usize,
    pub batches: usize,
    pub then: liquid_sampler::SamplerConfig,
    pub finished: bool,
}

impl Schedule {
    /// The seeded order from (`epoch`, `batch`) on.
    pub fn seeded(
        order: ShardedOrder,
        batch_size: usize,
        batches_per_epoch: usize,
        epochs: Option<usize>,
        (epoch, batch): (usize, usize),
        part: Option<Part>,
    ) -> Self {
        Schedule::Seeded {
            order,
            batch_size,
            batches_per_epoch,
            epochs,
            epoch,
            batch,
            current: None,
            part,
        }
    }

    /// Liquid's sampler over `dataset`, standing at `start` (epoch, batch); until the end of `epochs`,
    /// or without end. With a `tail`, `sampler` delivers that part of an epoch first.
    pub fn liquid(
        sampler: liquid_sampler::LiquidSampler,
        dataset: &liquid_sampler::Dataset,
        epochs: Option<usize>,
        start: (usize, usize),
        batches_per_epoch: usize,
        tail: Option<LiquidTail>,
    ) -> Self {
        // Liquid items are found by where they are stored (unique per item, unlike caller-chosen ids).
        let index_of = dataset
            .manifest
            .items
            .iter()
            .enumerate()
            .map(|(i, it)| ((it.location.file, it.location.offset), i))
            .collect();
        Schedule::Liquid {
            sampler: Box::new(sampler),
            dataset: dataset.clone(),
            index_of,
            epochs,
            batches_per_epoch,
            epoch: start.0,
            tail,
        }
    }

    /// The next batch, `None` after the last. A failure ends the schedule.
    pub fn next_batch(&mut self) -> Option<Result<Planned>> {
        match self {
            Schedule::Seeded {
                order,
                batch_size,
                batches_per_epoch,
                epochs,
                epoch,
                batch,
                current,
                part,
            } => {
                if epochs.is_some_and(|e| *epoch >= e) {
                    return None;
                }
                let part = part.as_ref().filter(|p| p.epoch == *epoch);
                if current.as_ref().is_none_or(|c| c.0 != *epoch) {
                    let items = match part {
                        Some(p) => order.epoch_part(*epoch, &p.remaining),
                        None => order.epoch(*epoch),
                    };
                    *current = Some((*epoch, items));
                }
                let batches = part.map_or(*batches_per_epoch, |p| p.batches);
                let items = &current.as_ref().expect("set above").1;
                let ids = items
                    .iter()
                    .skip(*batch * *batch_size)
                    .take(*batch_size)
                    .copied()
                    .collect();
                let planned = Planned {
                    epoch: *epoch,
                    batch: *batch,
                    items: ids,
                    liquid: None,
                };
                *batch += 1;
                if *batch == batches {
                    *batch = 0;
                    *epoch += 1;
                }
                Some(Ok(planned))
            }
            Schedule::Liquid {
                sampler,
                dataset,
                index_of,
                epochs,
                batches_per_epoch,
                epoch,
                tail,
            } => {
                if epochs.is_some_and(|e| *epoch >= e) {
                    return None;
                }
                let dir = dataset.dir.clone();
                // The part is delivered: the whole-dataset sampler takes over where an uninterrupted
                // run stands at the next epoch.
                if let Some(t) = tail.take_if(|t| t.finished) {
                    match liquid_sampler::LiquidSampler::resume(dataset.clone(), &t.then, *epoch, 0)
                    {
                        Ok(s) => **sampler = s,
                        Err(e) => {
                            *epochs = Some(0);
                            return Some(Err(Error::dataset(&dir, e)));
                        }
                    }
                }
                let planned = sampler
                    .next_batch()
                    .map_err(|e| Error::dataset(&dir, e))
                    .and_then(|b| {
                        let ids = b
                            .items
                            .iter()
                            .map(|d| {
                                index_of
                                    .get(&(d.item.location.file, d.item.location.offset))
                                    .copied()
                            })
                            .collect::<Option<Vec<usize>>>()
                            .ok_or_else(|| {
                                Error::dataset(
                                    &dir,
                                    "the sampler delivered an item that is not in the manifest",
                                )
                            })?;
                        Ok(Planned {
                            epoch: tail.as_ref().map_or(b.epoch, |t| t.epoch),
                            batch: b.index,
                            liquid: Some(LiquidPart {
                                cached: b.items.iter().map(|d| d.cached).collect(),
                                disk_items: b.disk_items + b.rebuilt_items,
                                disk_bytes: b.disk_bytes + b.rebuilt_bytes,
                                bytes: b.items.iter().map(|d| d.bytes.to_vec()).collect(),
                            }),
                            items: ids,
                        })
                    });
                let Ok(p) = &planned else {
                    *epochs = Some(0);
                    return Some(planned);
                };
                let batches = tail.as_ref().map_or(*batches_per_epoch, |t| t.batches);
                if p.batch + 1 == batches {
                    *epoch = p.epoch + 1;
                    if let Some(t) = tail {
                        t.finished = true;
                    }
                }
                Some(planned)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_partition_and_pad() {
        for (len, world, blocks) in [
            (10, 3, vec![]),
            (9, 3, vec![]),
            (1, 4, vec![]),
            (7, 1, vec![]),
            (10, 3, vec![0, 4, 8]),
            (9, 3, vec![0, 1, 2, 3, 4, 5, 6, 7, 8]),
            (1, 4, vec![0]),
        ] {
            for tail in [ShardPolicy::Pad, ShardPolicy::DropTail] {
                let mut seen = vec![0usize; len];
                for rank in 0..world {
                    let o = ShardedOrder {
                        len,
                        seed: 3,
                        shuffle: true,
                        rank,
                        world_size: world,
                        tail,
                        blocks: blocks.clone().into(),
                        window: 2,
                    };
                    let e = o.epoch(2);
                    assert_eq!(e.len(), o.per_rank());
                    for i in e {
                        seen[i] += 1;
                    }
                }
                let total: usize = seen.iter().sum();
                match tail {
                    ShardPolicy::Pad => {
                        assert!(seen.iter().all(|&c| c >= 1));
                        assert_eq!(total, len.div_ceil(world) * world);
                    }
                    ShardPolicy::DropTail => {
                        assert!(seen.iter().all(|&c| c <= 1));
                        assert_eq!(total, len / world * world);
                    }
                }
            }
        }
    }

    #[test]
    fn seeded_schedule_resumes_mid_epoch_and_stops_after_the_last() {
        let order = ShardedOrder {
            len: 10,
            seed: 9,
            shuffle: true,
            rank: 0,
            world_size: 1,
            tail: ShardPolicy::Pad,
            blocks: Vec::new().into(),
            window: 1,
        };
        let all: Vec<Vec<usize>> = {
            let mut s = Schedule::seeded(order.clone(), 4, 3, Some(2), (0, 0), None);
            std::iter::from_fn(|| s.next_batch())
                .map(|p| p.unwrap().items)
                .collect()
        };
        assert_eq!(all.len(), 6);
        assert_eq!(all[2].len(), 2, "the last batch of an epoch holds the rest");
        let mut resumed = Schedule::seeded(order.clone(), 4, 3, Some(2), (1, 1), None);
        let rest: Vec<Vec<usize>> = std::iter::from_fn(|| resumed.next_batch())
            .map(|p| p.unwrap().items)
            .collect();
        assert_eq!(rest, all[4..]);
        let mut e = order.epoch(0);
        e.sort();
        assert_eq!(e, (0..10).collect::<Vec<_>>());
        assert_ne!(order.epoch(0), order.epoch(1));
    }

    /// Over records, a rank's epoch visits items of at most `window` records between two records it has
    /// finished, and each rank reads about its share of the records, not a piece of each.
    #[test]
    fn blocked_order_keeps_records_together() {
        let starts: Vec<usize> = (0..40).map(|r| r * 25).collect();
        let record = |i: usize| i / 25;
        for world in [1, 4] {
            let mut seen = vec![0usize; 1000];
            for rank in 0..world {
                let o = ShardedOrder {
                    len: 1000,
                    seed: 11,
                    shuffle: true,
                    rank,
                    world_size: world,
                    tail: ShardPolicy::Pad,
                    blocks: starts.clone().into(),
                    window: 3,
                };
                let e = o.epoch(1);
                assert_ne!(e, o.epoch(2), "epochs differ");
                for &i in &e {
                    seen[i] += 1;
                }
                let mut records: Vec<usize> = e.iter().map(|&i| record(i)).collect();
                // Any 75 consecutive items (3 records' worth) span few records.
                for w in records.windows(75) {
                    let mut r: Vec<usize> = w.to_vec();
                    r.sort();
                    r.dedup();
                    assert!(r.len() <= 6, "a window of items spans {} records", r.len());
                }
                records.sort();
                records.dedup();
                assert!(
                    records.len() <= 40 / world + 3,
                    "rank {rank} of {world} touches {} of 40 records",
                    records.len()
                );
            }
            assert!(seen.iter().all(|&c| c == 1), "each item exactly once");
        }
    }

    /// A state saved after some batches at one world size and batch size, resumed at another: the ranks
    /// of the new shape deliver exactly what no rank delivered yet (padding repeats aside, at most one per
    /// new rank), and the global order of an epoch does not depend on the world size.
    #[test]
    fn an_epoch_resumed_at_another_world_size_delivers_what_is_left_once() {
        let starts: Vec<usize> = (0..30).map(|r| r * 7).collect();
        for blocked in [false, true] {
            for (w, b, batch, w2, b2) in [
                (4, 2, 5, 3, 5),
                (2, 3, 4, 5, 2),
                (4, 5, 3, 4, 2),
                (3, 1, 4, 3, 4),
            ] {
                for tail in [ShardPolicy::Pad, ShardPolicy::DropTail] {
                    let order = |rank: usize, world: usize| ShardedOrder {
                        len: 210,
                        seed: 3,
                        shuffle: true,
                        rank,
                        world_size: world,
                        tail,
                        blocks: if blocked {
                            starts.clone().into()
                        } else {
                            Vec::new().into()
                        },
                        window: 2,
                    };
                    assert_eq!(order(0, w).permutation(1), order(0, w2).permutation(1));
                    let mut seen = vec![0usize; 210];
                    for rank in 0..w {
                        for &i in order(rank, w).epoch(1).iter().take(b * batch) {
                            seen[i] += 1;
                        }
                    }
                    let left = order(0, w).left_after(None, b, batch);
                    // Resumed once more, at a third shape, half-way through the second part.
                    let per2 = order(0, w2).per_rank_of(left.iter().map(|r| r.len()).sum());
                    let b2_done = per2.div_ceil(b2) / 2;
                    for rank in 0..w2 {
                        for &i in order(rank, w2)
                            .epoch_part(1, &left)
                            .iter()
                            .take(b2_done * b2)
                        {
                            seen[i] += 1;
                        }
                    }
                    let left2 = order(0, w2).left_after(Some(&left), b2_done, b2);
                    for rank in 0..2 {
                        for &i in &order(rank, 2).epoch_part(1, &left2) {
                            seen[i] += 1;
                        }
                    }
                    let twice = seen.iter().filter(|&&n| n > 1).count();
                    let never = seen.iter().filter(|&&n| n == 0).count();
                    let case = format!("blocked {blocked}, {tail:?}, {w}x{b}x{batch} -> {w2}x{b2}");
                    assert!(seen.iter().all(|&n| n <= 2), "{case}: {seen:?}");
                    match tail {
                        // Padding repeats at most world-1 items per part shared out (three parts here).
                        ShardPolicy::Pad => {
                            assert_eq!(never, 0, "{case}");
                            assert!(twice <= (w - 1) + (w2 - 1) + 1, "{case}: {twice} twice");
                        }
                        // Dropping the tail drops at most world-1 items per part, and repeats none.
                        ShardPolicy::DropTail => {
                            assert_eq!(twice, 0, "{case}");
                            assert!(never <= (w - 1) + (w2 - 1) + 1, "{case}: {never} never");
                        }
                    }
                }
            }
        }
    }
}
