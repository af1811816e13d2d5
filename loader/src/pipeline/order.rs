//! Sampling order: seeded shuffling, rank/world sharding like PyTorch's `DistributedSampler`.

/// SplitMix64: tiny, fast, and good enough for shuffles and crops; deterministic across platforms.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    /// A generator for one (seed, a, b) triple: independent streams without shared state between threads.
    pub fn keyed(seed: u64, a: u64, b: u64) -> Self {
        let mut g = SplitMix64(seed ^ 0x6A09_E667_F3BC_C908);
        let k1 = g.next_u64() ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut g = SplitMix64(k1);
        let k2 = g.next_u64() ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        SplitMix64(k2)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let v = self.next_u64();
            if v < zone {
                return v % n;
            }
        }
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// What to do when the dataset does not split evenly across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardTail {
    /// Repeat the first items of the epoch's order so that every rank gets ceil(n / world) items
    /// (PyTorch `DistributedSampler` default): equal step counts, a few items seen twice.
    Pad,
    /// Drop the last n mod world items of the epoch's order: equal step counts, a few items unseen this epoch.
    Drop,
}

/// The order in which one rank visits a dataset, epoch by epoch.
#[derive(Clone, Debug)]
pub struct ShardedOrder {
    pub len: usize,
    pub seed: u64,
    pub shuffle: bool,
    pub rank: usize,
    pub world_size: usize,
    pub tail: ShardTail,
}

impl ShardedOrder {
    /// Items this rank sees per epoch.
    pub fn per_rank(&self) -> usize {
        match self.tail {
            ShardTail::Pad => self.len.div_ceil(self.world_size),
            ShardTail::Drop => self.len / self.world_size,
        }
    }

    /// This rank's dataset indices for `epoch`, in visiting order. Every rank computes the same global
    /// permutation from (seed, epoch) and takes every world_size-th item from its rank on.
    pub fn epoch(&self, epoch: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
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
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_partition_and_pad() {
        for (len, world) in [(10, 3), (9, 3), (1, 4), (7, 1)] {
            for tail in [ShardTail::Pad, ShardTail::Drop] {
                let mut seen = vec![0usize; len];
                for rank in 0..world {
                    let o = ShardedOrder {
                        len,
                        seed: 3,
                        shuffle: true,
                        rank,
                        world_size: world,
                        tail,
                    };
                    let e = o.epoch(2);
                    assert_eq!(e.len(), o.per_rank());
                    for i in e {
                        seen[i] += 1;
                    }
                }
                let total: usize = seen.iter().sum();
                match tail {
                    ShardTail::Pad => {
                        assert!(seen.iter().all(|&c| c >= 1));
                        assert_eq!(total, len.div_ceil(world) * world);
                    }
                    ShardTail::Drop => {
                        assert!(seen.iter().all(|&c| c <= 1));
                        assert_eq!(total, len / world * world);
                    }
                }
            }
        }
    }

    #[test]
    fn epochs_differ_and_repeat() {
        let o = ShardedOrder {
            len: 100,
            seed: 9,
            shuffle: true,
            rank: 0,
            world_size: 1,
            tail: ShardTail::Pad,
        };
        assert_eq!(o.epoch(1), o.epoch(1));
        assert_ne!(o.epoch(1), o.epoch(2));
        let mut e = o.epoch(0);
        e.sort();
        assert_eq!(e, (0..100).collect::<Vec<_>>());
    }
}
