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
        match self.tail {
            ShardPolicy::Pad => self.len.div_ceil(self.world_size),
            ShardPolicy::DropTail => self.len / self.world_size,
        }
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
        let mut all: Vec<usize> = (0..self.len).collect();
        let blocked = !self.blocks.is_empty();
        if self.shuffle && blocked {
            all = self.block_permutation(epoch);
        } else if self.shuffle {
            SplitMix64::keyed(self.seed, epoch as u64, 0x5EED).shuffle(&mut all);
        }
        let total = self.per_rank() * self.world_size;
        if total > all.len() && !all.is_empty() {
            let mut i = 0;
            while all.len() < total {
                all.push(all[i]);
                i += 1;
            }
        }
        all.truncate(total);
        if blocked {
            let per = self.per_rank();
            return all[self.rank * per..(self.rank + 1) * per].to_vec();
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .collect()
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
    },
    Liquid {
        sampler: Box<liquid_sampler::LiquidSampler>,
        index_of: std::collections::HashMap<(u32, u64), usize>,
        left: Option<usize>,
    },
}

impl Schedule {
    /// The seeded order from (`epoch`, `batch`) on.
    pub fn seeded(
        order: ShardedOrder,
        batch_size: usize,
        batches_per_epoch: usize,
        epochs: Option<usize>,
        (epoch, batch): (usize, usize),
    ) -> Self {
        Schedule::Seeded {
            order,
            batch_size,
            batches_per_epoch,
            epochs,
            epoch,
            batch,
            current: None,
        }
    }

    /// Liquid's sampler over `dataset`; `total` batches (all epochs), or without end.
    pub fn liquid(
        sampler: liquid_sampler::LiquidSampler,
        dataset: &liquid_sampler::Dataset,
        total: Option<usize>,
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
            index_of,
            left: total,
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
            } => {
                if epochs.is_some_and(|e| *epoch >= e) {
                    return None;
                }
                if current.as_ref().is_none_or(|c| c.0 != *epoch) {
                    *current = Some((*epoch, order.epoch(*epoch)));
                }
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
                if *batch == *batches_per_epoch {
                    *batch = 0;
                    *epoch += 1;
                }
                Some(Ok(planned))
            }
            Schedule::Liquid {
                sampler,
                index_of,
                left,
            } => {
                if *left == Some(0) {
                    return None;
                }
                let dir = sampler.dataset().dir.clone();
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
                            epoch: b.epoch,
                            batch: b.index,
                            liquid: Some(LiquidPart {
                                cached: b.items.iter().map(|d| d.cached).collect(),
                                disk_items: b.disk_items,
                                disk_bytes: b.disk_bytes,
                                bytes: b.items.iter().map(|d| d.bytes.to_vec()).collect(),
                            }),
                            items: ids,
                        })
                    });
                *left = match (&planned, *left) {
                    (Err(_), _) => Some(0),
                    (Ok(_), l) => l.map(|l| l - 1),
                };
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
            let mut s = Schedule::seeded(order.clone(), 4, 3, Some(2), (0, 0));
            std::iter::from_fn(|| s.next_batch())
                .map(|p| p.unwrap().items)
                .collect()
        };
        assert_eq!(all.len(), 6);
        assert_eq!(all[2].len(), 2, "the last batch of an epoch holds the rest");
        let mut resumed = Schedule::seeded(order.clone(), 4, 3, Some(2), (1, 1));
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
}
